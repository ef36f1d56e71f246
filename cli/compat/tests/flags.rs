//! `SubmitFlags` flattens into a clap command next to the CLI's global flags
//! (`-t/--tenant`, `-o/--output`, `--vcluster`) without collisions.

use clap::{Args, CommandFactory, Parser, Subcommand};
use lattice_compat::SubmitFlags;

#[derive(Parser, Debug)]
struct Cli {
    #[arg(long, short = 'n', short_alias = 't', global = true)]
    tenant: Option<String>,
    #[arg(long, global = true)]
    config: Option<String>,
    #[arg(long, global = true)]
    vcluster: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Submit(Submit),
}

#[derive(Args, Debug)]
struct Submit {
    #[command(flatten)]
    flags: SubmitFlags,
    #[arg(short = 'o', long)]
    output: Option<String>,
    #[arg(long)]
    dry_run: bool,
    script: Option<String>,
    #[arg(last = true)]
    command: Vec<String>,
}

#[test]
fn flattens_without_collisions() {
    Cli::command().debug_assert();
}

#[test]
fn parses_every_flag() {
    let cli = Cli::try_parse_from([
        "lattice",
        "submit",
        "-t",
        "physics",
        "--nodes=4",
        "--walltime=24h",
        "--constraint=gpu_type=GH200",
        "--uenv=u/1:v1",
        "--view=default",
        "--tools-uenv=t/1",
        "--vcluster=ml",
        "--project=p",
        "--name=n",
        "--task-group=0-99%20",
        "--depends-on=a:success",
        "--data-mount=s3://b/d:/data",
        "--data-mount=/x:/y",
        "--service",
        "--expose=8080",
        "--reactive",
        "--min-nodes=1",
        "--max-nodes=8",
        "--scale-metric=gpu_utilization",
        "--scale-target=0.8",
        "--preemption-class=8",
        "--checkpoint=signal",
        "--checkpoint-port=9",
        "--no-preempt",
        "--network-domain=d",
        "--sensitive",
        "--env=A=1",
        "--env",
        "B=2",
        "-o",
        "yaml",
        "--dry-run",
        "train.sh",
    ])
    .expect("parses");
    let Cmd::Submit(s) = cli.cmd;
    let f = s.flags;
    assert_eq!(cli.tenant.as_deref(), Some("physics"));
    assert_eq!(cli.vcluster.as_deref(), Some("ml"));
    assert_eq!(f.nodes.as_deref(), Some("4"));
    assert_eq!(f.task_group.as_deref(), Some("0-99%20"));
    assert_eq!(f.data_mount.len(), 2);
    assert_eq!(f.env, vec!["A=1", "B=2"]);
    assert!(f.service && f.reactive && f.no_preempt && f.sensitive);
    assert_eq!(f.scale_target.as_deref(), Some("0.8"));
    assert_eq!(s.output.as_deref(), Some("yaml"));
    assert_eq!(s.script.as_deref(), Some("train.sh"));
}
