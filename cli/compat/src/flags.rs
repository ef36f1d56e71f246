//! `lattice submit` flags as a plain struct (derives `clap::Args` so the CLI
//! can `#[command(flatten)]` it).

use serde::{Deserialize, Serialize};

/// Every `lattice submit` flag. `None`/empty means "not given on the command
/// line" (directives in the script then apply). Flags always override
/// directives.
///
/// Values are kept as strings and parsed by [`crate::translate`], so errors
/// are reported the same way for flags and directives. Fields marked
/// `#[arg(skip)]` are filled by the CLI (`tenant` and `vcluster` from the global
/// `-t/--tenant` and `--vcluster`, `script_name`, `submit_dir`, `command`, `sbatch_args`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct SubmitFlags {
    /// Node count `N` or range `MIN-MAX`.
    #[arg(long, short = 'N')]
    pub nodes: Option<String>,
    /// Claim exactly these nodes (Slurm hostlist: `sn-[01-04],gpu7`); sets
    /// `resources.nodeNames`, and `--nodes` to their count (an explicit `--nodes` must agree).
    #[arg(long, value_name = "NODES")]
    pub nodelist: Option<String>,
    /// Time limit: 24h, 30m, 1h30m, HH:MM:SS, D-HH:MM:SS, minutes.
    #[arg(long)]
    pub walltime: Option<String>,
    /// Constraints: gpu_type=GH200,gpu_count=4, memory_gb>=512, bare features; Slurm `&` (all) and `|` (any of: each node has one of the alternatives).
    #[arg(long)]
    pub constraint: Option<String>,
    /// uenv image, e.g. prgenv-gnu/24.11:v1.
    #[arg(long)]
    pub uenv: Option<String>,
    /// uenv view to activate.
    #[arg(long)]
    pub view: Option<String>,
    /// Extra tools uenv (debuggers, profilers).
    #[arg(long)]
    pub tools_uenv: Option<String>,
    /// OCI image to run in, e.g. ubuntu:24.04 or ghcr.io/acme/train:v3 (instead of --uenv).
    #[arg(long)]
    pub image: Option<String>,
    /// vCluster to schedule in. Not a clap flag here: the CLI's global
    /// `--vcluster` fills it (a second `--vcluster` would collide).
    #[arg(skip)]
    pub vcluster: Option<String>,
    /// Tenant (namespace) to submit to. Not a clap flag here: the CLI's global
    /// `-t/--tenant` fills it (a second `--tenant` would collide).
    #[arg(skip)]
    pub tenant: Option<String>,
    /// Project for accounting.
    #[arg(long)]
    pub project: Option<String>,
    /// Allocation name.
    #[arg(long)]
    pub name: Option<String>,
    /// Task group (job array): 0-99%20, 1,3,5-7, 0-15:4.
    #[arg(long)]
    pub task_group: Option<String>,
    /// Dependencies: ID[:success|failure|any|corresponding],...
    #[arg(long)]
    pub depends_on: Option<String>,
    /// Slurm / Flux RFC 26 dependencies (repeatable): afterok:ID[:ID...], afternotok:ID,
    /// afterany:ID, after:ID (started), aftercorr:ID, singleton, begin-time:EPOCH,
    /// string:NAME?type=in|out|inout[&scope=user|global]; ',' joins several.
    #[arg(long)]
    pub dependency: Vec<String>,
    /// Data mounts SOURCE:/TARGET[:ro|:rw] (repeatable).
    #[arg(long)]
    pub data_mount: Vec<String>,
    /// Run as an unbounded service.
    #[arg(long)]
    pub service: bool,
    /// Exposed ports [NAME:]PORT[/udp] (repeatable).
    #[arg(long)]
    pub expose: Vec<String>,
    /// Run as a reactive (autoscaled) service.
    #[arg(long)]
    pub reactive: bool,
    /// Reactive: minimum nodes.
    #[arg(long)]
    pub min_nodes: Option<String>,
    /// Reactive: maximum nodes.
    #[arg(long)]
    pub max_nodes: Option<String>,
    /// Reactive: metric to scale on.
    #[arg(long)]
    pub scale_metric: Option<String>,
    /// Reactive: target value (0.8, "100ms").
    #[arg(long)]
    pub scale_target: Option<String>,
    /// Preemption class 0-10 (default 5).
    #[arg(long)]
    pub preemption_class: Option<String>,
    /// Checkpoint strategy: signal, grpc, shmem, none (also auto, manual).
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// gRPC checkpoint port (with --checkpoint=grpc).
    #[arg(long)]
    pub checkpoint_port: Option<String>,
    /// Never preempt (no checkpoint).
    #[arg(long)]
    pub no_preempt: bool,
    /// Network domain shared with other allocations.
    #[arg(long)]
    pub network_domain: Option<String>,
    /// Sensitive (regulated) workload.
    #[arg(long)]
    pub sensitive: bool,
    /// Environment variables KEY=VALUE (repeatable).
    #[arg(long)]
    pub env: Vec<String>,
    /// Download path hint for stdout (Slurm's `--output`; `#LATTICE --output`).
    /// Not a clap flag: `-o/--output` is the output format.
    #[arg(skip)]
    pub output: Option<String>,
    /// Download path hint for stderr (Slurm's `--error`). Not a clap flag.
    #[arg(skip)]
    pub error: Option<String>,
    /// Script file name (default job name, as sbatch uses). Set by the CLI.
    #[arg(skip)]
    pub script_name: Option<String>,
    /// Directory `lattice submit` ran in (SLURM_SUBMIT_DIR, default working dir). Set by the CLI.
    #[arg(skip)]
    pub submit_dir: Option<String>,
    /// Command after `--` when no script is given. Set by the CLI.
    #[arg(skip)]
    pub command: Vec<String>,
    /// The submission time in seconds since the UNIX epoch, for relative times such as
    /// `--begin=now+1hour` (the current time when unset). Set by tests.
    #[arg(skip)]
    pub now: Option<i64>,
    /// sbatch options given on the `sbatch` command line (the Slurm front-end
    /// passes them here; they override the script's directives, and these flags override them).
    #[arg(skip)]
    pub sbatch_args: Vec<String>,
}

impl SubmitFlags {
    /// The flags as `(long name, value)` pairs in `#LATTICE` vocabulary, in a fixed order.
    pub fn to_pairs(&self) -> Vec<(&'static str, Option<String>)> {
        let mut v: Vec<(&'static str, Option<String>)> = Vec::new();
        let mut one = |n: &'static str, x: &Option<String>| {
            if let Some(x) = x {
                v.push((n, Some(x.clone())));
            }
        };
        one("nodes", &self.nodes);
        one("nodelist", &self.nodelist);
        one("walltime", &self.walltime);
        one("constraint", &self.constraint);
        one("uenv", &self.uenv);
        one("view", &self.view);
        one("tools-uenv", &self.tools_uenv);
        one("image", &self.image);
        one("vcluster", &self.vcluster);
        one("tenant", &self.tenant);
        one("project", &self.project);
        one("name", &self.name);
        one("task-group", &self.task_group);
        one("depends-on", &self.depends_on);
        one("min-nodes", &self.min_nodes);
        one("max-nodes", &self.max_nodes);
        one("scale-metric", &self.scale_metric);
        one("scale-target", &self.scale_target);
        one("preemption-class", &self.preemption_class);
        one("checkpoint", &self.checkpoint);
        one("checkpoint-port", &self.checkpoint_port);
        one("network-domain", &self.network_domain);
        one("output", &self.output);
        one("error", &self.error);
        if !self.dependency.is_empty() {
            v.push(("dependency", Some(self.dependency.join(","))));
        }
        for m in &self.data_mount {
            v.push(("data-mount", Some(m.clone())));
        }
        for e in &self.expose {
            v.push(("expose", Some(e.clone())));
        }
        for e in &self.env {
            v.push(("env", Some(e.clone())));
        }
        for (n, b) in [
            ("service", self.service),
            ("reactive", self.reactive),
            ("no-preempt", self.no_preempt),
            ("sensitive", self.sensitive),
        ] {
            if b {
                v.push((n, None));
            }
        }
        v
    }
}
