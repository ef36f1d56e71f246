//! The Slurm front-end: `lattice compat-aliases` and the hidden
//! `lattice compat sbatch|squeue|scancel|sinfo|sacct|srun|salloc ARGS...` it points at.
//! Argument translation and `squeue -o` formatting live in `lattice_compat::slurm`.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use lattice_compat::hostlist;
use lattice_compat::slurm::{
    phase_to_slurm, sacct_to_lattice, sbatch_output, sbatch_to_lattice, scancel_to_lattice,
    sinfo_to_lattice, slurm_duration, squeue_to_lattice, Invocation, SbatchInvocation,
};
use lattice_compat::SubmitFlags;
use serde_json::Value;

use crate::cli::{CancelArgs, Command, CompatArgs, HistoryArgs, LogsArgs, NodesArgs, StatusArgs};
use crate::cmd::launch::Shell;
use crate::cmd::nodes;
use crate::cmd::status::{self, Query};
use crate::cmd::submit;
use crate::cmd::workload::{self, name, phase, s, Owner, StateFilter};
use crate::errors::{exit, CliError};
use crate::{Ctx, Shutdown};

/// The tools the front-end provides.
pub const TOOLS: [&str; 7] = [
    "sbatch", "squeue", "scancel", "salloc", "srun", "sinfo", "sacct",
];

/// Runs `compat-aliases`: shell functions for bash and zsh.
pub fn aliases(out: &mut dyn Write) -> Result<i32, CliError> {
    let mut s = String::from(
        "# Slurm commands on Lattice. Load with:  eval \"$(lattice compat-aliases)\"\n\
         # (bash or zsh; set LATTICE_BIN to use another lattice binary).\n",
    );
    for t in TOOLS {
        s.push_str(&format!(
            "{t}() {{ command \"${{LATTICE_BIN:-lattice}}\" compat {t} \"$@\"; }}\n"
        ));
    }
    out.write_all(s.as_bytes())?;
    Ok(0)
}

fn slurm_err(tool: &str, e: &lattice_compat::SubmitError) -> CliError {
    submit::compat_error(tool, e).exit_code(exit::USAGE)
}

fn warn(ctx: &Ctx, tool: &str, inv: &Invocation, err: &mut dyn Write) -> std::io::Result<()> {
    if ctx.quiet {
        return Ok(());
    }
    for w in &inv.warnings {
        writeln!(err, "{tool}: warning: {w}")?;
    }
    Ok(())
}

/// Parses a translated `lattice` argv into a command (and applies its `--tenant`).
fn reparse(ctx: &mut Ctx, tool: &str, argv: &[String]) -> Result<Command, CliError> {
    let mut full = vec!["lattice".to_string()];
    full.extend(argv.iter().cloned());
    let cli = crate::parse_args(full).map_err(|e| {
        CliError::new(
            format!("{tool}: translate the options"),
            e.to_string().lines().next().unwrap_or_default().to_string(),
        )
        .exit_code(exit::USAGE)
    })?;
    if let Some(t) = cli.global.tenant {
        ctx.tenant = t;
    }
    if let Some(v) = cli.global.vcluster {
        ctx.vcluster = Some(v);
    }
    Ok(cli.command)
}

/// Runs `compat TOOL ARGS...`.
pub async fn run(
    ctx: &mut Ctx,
    a: &CompatArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    match a.tool.as_str() {
        "sbatch" => sbatch(ctx, &a.args, stdin, out, err, &mut shutdown).await,
        "squeue" => squeue(ctx, &a.args, out, err).await,
        "scancel" => scancel(ctx, &a.args, out, err).await,
        "sinfo" => sinfo(ctx, &a.args, out, err).await,
        "sacct" => sacct(ctx, &a.args, out, err).await,
        "srun" => srun(ctx, &a.args, out, err, &mut shutdown).await,
        "salloc" => salloc(ctx, &a.args, out, err, shutdown).await,
        other => Err(
            CliError::new(format!("compat {other}"), "unknown Slurm command")
                .detail(format!("Known: {}", TOOLS.join(", ")))
                .exit_code(exit::USAGE),
        ),
    }
}

async fn sbatch(
    ctx: &mut Ctx,
    args: &[String],
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let inv = sbatch_to_lattice(args).map_err(|e| slurm_err("sbatch", &e))?;
    if !ctx.quiet {
        for w in inv
            .invocation
            .warnings
            .iter()
            .filter(|w| w.contains("are not passed") || w.contains("after --wrap"))
        {
            writeln!(err, "sbatch: warning: {w}")?;
        }
    }
    let mut flags = SubmitFlags {
        sbatch_args: without_wrap(&inv.sbatch_args),
        ..Default::default()
    };
    let script = if let Some(w) = &inv.wrap {
        flags.command = vec!["/bin/sh".into(), "-c".into(), w.clone()];
        flags.script_name = Some("wrap".into());
        String::new()
    } else {
        match &inv.script {
            Some(p) => {
                flags.script_name = Some(p.clone());
                std::fs::read_to_string(ctx.cwd.join(p)).map_err(|e| {
                    CliError::new(format!("sbatch: read script {p}"), e.to_string())
                        .hint("pass the path of a batch script, or --wrap=CMD")
                })?
            }
            None => {
                let mut t = String::new();
                stdin.read_to_string(&mut t).map_err(|e| {
                    CliError::new("sbatch: read the script from stdin", e.to_string())
                })?;
                if t.trim().is_empty() {
                    return Err(CliError::new("sbatch", "no batch script given")
                        .hint("sbatch [OPTIONS] script.sh, or sbatch --wrap=CMD")
                        .exit_code(exit::USAGE));
                }
                t
            }
        }
    };
    let t = submit::build(ctx, flags, &script, None, true).await?;
    submit::print_warnings(ctx, &t, err)?;
    if t.client.test_only {
        writeln!(
            err,
            "sbatch: --test-only: the job would be submitted (nothing was)"
        )?;
        return Ok(0);
    }
    let created = submit::post(ctx, &t.allocation, false).await?;
    let id = name(&created).to_string();
    let parsable = inv.invocation.parsable || t.client.parsable;
    // sbatch `--quiet` prints no job id, parsable or not (as sbatch does).
    if !t.client.quiet {
        writeln!(out, "{}", sbatch_output(&id, parsable))?;
    }
    out.flush()?;
    if inv.invocation.wait || t.client.wait {
        let ns = s(&created, "/metadata/namespace")
            .unwrap_or(&ctx.tenant)
            .to_string();
        return submit::wait_and_report(ctx, &ns, &id, shutdown, err, submit::Download::Always)
            .await;
    }
    Ok(0)
}

/// sbatch options without `--wrap` (it became the command).
fn without_wrap(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if a == "--wrap" {
            skip = true;
            continue;
        }
        if a.starts_with("--wrap=") {
            continue;
        }
        out.push(a.clone());
    }
    out
}

async fn squeue(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let inv = squeue_to_lattice(args).map_err(|e| slurm_err("squeue", &e))?;
    warn(ctx, "squeue", &inv, err)?;
    let Command::Status(sa) = reparse(ctx, "squeue", &inv.argv)? else {
        return Ok(exit::ERROR);
    };
    let mut q = Query::from_status(ctx, &sa)?;
    if sa.ids.is_empty() && sa.state.is_empty() {
        // squeue lists the queue: unfinished jobs only.
        q.states = StateFilter::phases(&["active".into()])?;
    }
    let (items, missing) = status::fetch(ctx, &q, err).await?;
    out.write_all(
        lattice_compat::slurm::format_squeue(
            &items,
            inv.format.as_deref(),
            inv.noheader,
            ctx.now(),
        )
        .as_bytes(),
    )?;
    Ok(if missing { exit::ERROR } else { 0 })
}

async fn scancel(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let inv = scancel_to_lattice(args).map_err(|e| slurm_err("scancel", &e))?;
    warn(ctx, "scancel", &inv, err)?;
    if inv.me && inv.user.is_none() && ctx.user().is_none() {
        // Without knowing who you are, no job can be shown to be yours.
        return Err(
            CliError::new("scancel --me", "cannot tell who you are: $USER is not set")
                .detail("Nothing was cancelled.")
                .hint("set USER, or name the jobs without --me: scancel JOBID...")
                .exit_code(exit::USAGE),
        );
    }
    if let Some(u) = &inv.user {
        // Lattice cancels by user only for yourself; never fall back to "all mine".
        match ctx.user() {
            Some(me) if &me == u => {}
            Some(me) => {
                return Err(CliError::new(
                    format!("scancel -u {u}"),
                    format!("you are {me:?}; jobs can be cancelled by user only for yourself"),
                )
                .detail("Nothing was cancelled.")
                .hint(format!(
                    "name {u}'s jobs instead (scancel $(squeue -h -u {u} -o %i)); the server \
                     decides whether you may cancel them"
                ))
                .exit_code(exit::USAGE))
            }
            None => {
                return Err(CliError::new(
                    format!("scancel -u {u}"),
                    "cannot tell who you are: $USER is not set",
                )
                .hint("set USER, or name the jobs: scancel JOBID...")
                .exit_code(exit::USAGE))
            }
        }
    }
    let Command::Cancel(ca) = reparse(ctx, "scancel", &inv.argv)? else {
        return Ok(exit::ERROR);
    };
    // scancel is silent on success.
    let mut sink = std::io::sink();
    let out: &mut dyn Write = if ctx.verbose { out } else { &mut sink };
    // `-u USER` (checked above to be you) and `--me` both mean "only my jobs"; with job ids
    // they narrow the named jobs, as Slurm ANDs its filters.
    let mine_only = inv.user.is_some() || inv.me;
    let filtered =
        inv.name.is_some() || (!ca.ids.is_empty() && (mine_only || !ca.state.is_empty()));
    if !filtered {
        return status::cancel(ctx, &ca, out, err).await;
    }
    cancel_matching(ctx, &ca, mine_only, inv.name.as_deref(), out, err).await
}

/// `scancel` with filters `lattice cancel` lacks: the named jobs (or, without ids, your
/// unfinished ones) that match the job name (`-n`), the user (`-u`, only yourself, or
/// `--me`) and the states (`-t`).
async fn cancel_matching(
    ctx: &mut Ctx,
    ca: &CancelArgs,
    mine_only: bool,
    job_name: Option<&str>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let tenant = ctx.tenant.clone();
    let states = StateFilter::phases(&ca.state)?;
    let mut code = 0;
    let mut items = Vec::new();
    let me = ctx.user();
    if ca.ids.is_empty() {
        let Some(me) = me.clone() else {
            return Err(
                CliError::new("scancel", "cannot tell who you are: $USER is not set")
                    .hint("set USER, or name the jobs: scancel JOBID...")
                    .exit_code(exit::USAGE),
            );
        };
        items = workload::list_items(ctx, "allocations", Some(&tenant)).await?;
        let owner = Owner::User(me);
        items.retain(|a| {
            owner.keeps(a) && !workload::is_terminal(phase(a)) && !workload::cancel_requested(a)
        });
        workload::sort_by_creation(&mut items);
    } else {
        for id in &ca.ids {
            match workload::get_allocation(ctx, &tenant, id).await {
                Ok(a) => items.push(a),
                Err(e) if e.exit_code == exit::UNREACHABLE => return Err(e),
                Err(e) => {
                    writeln!(err, "{e}")?;
                    code = code.max(e.exit_code);
                }
            }
        }
        if mine_only {
            let owner = Owner::User(me.unwrap_or_default());
            let (mine, others): (Vec<Value>, Vec<Value>) =
                items.into_iter().partition(|a| owner.keeps(a));
            if ctx.verbose {
                for a in &others {
                    writeln!(err, "scancel: job {} is not yours; not cancelled", name(a))?;
                }
            }
            items = mine;
        }
    }
    items.retain(|a| {
        states.keeps(phase(a)) && job_name.is_none_or(|n| workload::display_name(a) == n)
    });
    if items.is_empty() && ctx.verbose {
        writeln!(err, "No matching jobs to cancel in tenant {tenant:?}.")?;
    }
    for a in &items {
        match status::cancel_one(ctx, &tenant, a).await {
            Ok(line) => writeln!(out, "{line}")?,
            Err(e) => {
                writeln!(err, "{e}")?;
                code = code.max(e.exit_code);
            }
        }
    }
    Ok(code)
}

/// `sacct -j IDS -S/-E`: whether a job was pending or running inside the window (Slurm:
/// "jobs in any state after START / before END").
fn active_between(
    a: &Value,
    since: Option<chrono::DateTime<chrono::Utc>>,
    until: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    let begin = workload::time(a, "/metadata/creationTimestamp")
        .or_else(|| workload::time(a, "/status/startTime"));
    let end = if workload::is_terminal(phase(a)) {
        workload::time(a, "/status/endTime")
            .or_else(|| workload::time(a, "/status/startTime"))
            .or(begin)
    } else {
        Some(now)
    };
    since.is_none_or(|s| end.is_none_or(|e| e >= s))
        && until.is_none_or(|u| begin.is_none_or(|b| b < u))
}

/// Slurm's node state name for a Lattice node.
pub fn sinfo_state(n: &Value) -> &'static str {
    let alloc = nodes::allocated(n);
    match nodes::state(n) {
        "Ready" if alloc => "alloc",
        "Ready" => "idle",
        "Degraded" if alloc => "alloc*",
        "Degraded" => "idle*",
        "Draining" => "drng",
        "Drained" => "drain",
        "Down" => "down",
        "Failed" => "fail",
        "Booting" => "boot",
        _ => "unk",
    }
}

async fn sinfo(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let inv = sinfo_to_lattice(args).map_err(|e| slurm_err("sinfo", &e))?;
    warn(ctx, "sinfo", &inv, err)?;
    let Command::Nodes(na) = reparse(ctx, "sinfo", &inv.argv)? else {
        return Ok(exit::ERROR);
    };
    let NodesArgs { ids, state, .. } = na;
    let states = nodes::node_states(&state)?;
    let mut all = workload::list_items(ctx, "nodes", None).await?;
    all.retain(|n| {
        (ids.is_empty() || ids.iter().any(|i| i == name(n))) && nodes::keep(ctx, &states, n)
    });
    all.sort_by(|a, b| name(a).cmp(name(b)));
    let per_node = args.iter().any(|a| a == "-N" || a == "--Node");
    let part = |n: &Value| nodes::vcluster_of(n).unwrap_or("-").to_string();
    let mut lines: Vec<Vec<String>> = Vec::new();
    if per_node {
        if !inv.noheader {
            lines.push(vec![
                "NODELIST".into(),
                "NODES".into(),
                "PARTITION".into(),
                "STATE".into(),
            ]);
        }
        for n in &all {
            lines.push(vec![
                name(n).into(),
                "1".into(),
                part(n),
                sinfo_state(n).into(),
            ]);
        }
    } else {
        if !inv.noheader {
            lines.push(
                [
                    "PARTITION",
                    "AVAIL",
                    "TIMELIMIT",
                    "NODES",
                    "STATE",
                    "NODELIST",
                ]
                .iter()
                .map(|x| x.to_string())
                .collect(),
            );
        }
        let mut groups: BTreeMap<(String, &str), Vec<String>> = BTreeMap::new();
        for n in &all {
            groups
                .entry((part(n), sinfo_state(n)))
                .or_default()
                .push(name(n).to_string());
        }
        for ((p, st), names) in groups {
            lines.push(vec![
                p,
                "up".into(),
                "infinite".into(),
                names.len().to_string(),
                st.into(),
                hostlist::compress(&names),
            ]);
        }
    }
    let mut a = crate::output::Aligner::default();
    for l in &lines {
        a.observe(l);
    }
    for l in &lines {
        out.write_all(a.line(l).as_bytes())?;
    }
    Ok(0)
}

/// One `sacct` field of an allocation.
fn sacct_field(a: &Value, f: &str, now: chrono::DateTime<chrono::Utc>) -> String {
    let ts = |p: &str| {
        s(a, p)
            .map(|t| t.trim_end_matches('Z').chars().take(19).collect())
            .unwrap_or_else(|| "Unknown".to_string())
    };
    match f.to_ascii_lowercase().as_str() {
        "jobid" | "jobidraw" => name(a).into(),
        "jobname" => workload::display_name(a),
        "partition" => s(a, "/spec/vcluster").unwrap_or("").into(),
        "account" => s(a, "/metadata/namespace").unwrap_or("").into(),
        "user" => workload::user_of(a).unwrap_or_default(),
        "state" => {
            let st = phase_to_slurm(phase(a)).0.to_string();
            if phase(a) == "Failed" && s(a, "/status/reason") == Some("walltime_exceeded") {
                "TIMEOUT".into()
            } else {
                st
            }
        }
        "exitcode" => format!(
            "{}:{}",
            a.pointer("/status/exitCode")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            a.pointer("/status/signal")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        ),
        "elapsed" => slurm_duration(workload::elapsed_secs(a, now).unwrap_or(0)),
        "timelimit" => workload::walltime_secs(a)
            .map(slurm_duration)
            .unwrap_or_else(|| "UNLIMITED".into()),
        "start" => ts("/status/startTime"),
        "end" => ts("/status/endTime"),
        "submit" => ts("/metadata/creationTimestamp"),
        "nnodes" | "allocnodes" | "reqnodes" => a
            .pointer("/status/assignedNodes")
            .and_then(Value::as_array)
            .filter(|n| !n.is_empty())
            .map(|n| n.len().to_string())
            .unwrap_or_else(|| workload::node_count(a)),
        "nodelist" => hostlist::compress(
            &a.pointer("/status/assignedNodes")
                .and_then(Value::as_array)
                .map(|n| {
                    n.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
        ),
        "alloccpus" | "ncpus" => "0".into(),
        "workdir" => s(a, "/spec/workingDir").unwrap_or("").into(),
        "reason" => s(a, "/status/reason").unwrap_or("None").into(),
        _ => String::new(),
    }
}

fn sacct_header(f: &str) -> &str {
    const KNOWN: [&str; 18] = [
        "JobID",
        "JobIDRaw",
        "JobName",
        "Partition",
        "Account",
        "User",
        "State",
        "ExitCode",
        "Elapsed",
        "Timelimit",
        "Start",
        "End",
        "Submit",
        "NNodes",
        "AllocNodes",
        "NodeList",
        "AllocCPUS",
        "WorkDir",
    ];
    KNOWN
        .iter()
        .find(|k| k.eq_ignore_ascii_case(f))
        .copied()
        .unwrap_or(f)
}

async fn sacct(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let inv = sacct_to_lattice(args).map_err(|e| slurm_err("sacct", &e))?;
    warn(ctx, "sacct", &inv, err)?;
    let items = match reparse(ctx, "sacct", &inv.argv)? {
        Command::Status(sa) => {
            let sa = StatusArgs { all: true, ..sa };
            let q = Query::from_status(ctx, &sa)?;
            let mut items = status::fetch(ctx, &q, err).await?.0;
            let now = ctx.now();
            let (since, until) = workload::parse_window(
                ("--starttime", inv.since.as_deref()),
                ("--endtime", inv.until.as_deref()),
                now,
            )?;
            items.retain(|a| active_between(a, since, until, now));
            items
        }
        Command::History(h) => {
            let HistoryArgs {
                since,
                until,
                state,
                user,
                ..
            } = h;
            let now = ctx.now();
            let since = since
                .as_deref()
                .map(|v| workload::parse_when("--starttime", v, now))
                .transpose()?;
            let until = until
                .as_deref()
                .map(|v| workload::parse_when("--endtime", v, now))
                .transpose()?;
            let states = StateFilter::parse(&state, &["completed", "failed", "cancelled"], &[])
                .unwrap_or_default();
            let owner = Owner::from_flags(false, user.as_deref(), ctx.user());
            status::history_items(ctx, &owner, &states, since, until).await?
        }
        _ => return Ok(exit::ERROR),
    };
    // Fields and widths: `--format=jobid,jobname%30,state`.
    let fmt = inv
        .format
        .clone()
        .unwrap_or_else(|| "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode".into());
    let fields: Vec<(String, usize)> = fmt
        .split(',')
        .filter(|f| !f.trim().is_empty())
        .map(|f| match f.trim().split_once('%') {
            Some((n, w)) => (n.to_string(), w.parse().unwrap_or(10)),
            None => (f.trim().to_string(), 10),
        })
        .collect();
    let now = ctx.now();
    let mut text = String::new();
    let row = |cells: Vec<String>| -> String {
        if inv.parsable {
            format!("{}|\n", cells.join("|"))
        } else {
            let mut l = String::new();
            for (i, (c, (_, w))) in cells.iter().zip(&fields).enumerate() {
                if i > 0 {
                    l.push(' ');
                }
                let mut c: String = c.chars().take(*w).collect();
                if c.chars().count() == *w && cells[i].chars().count() > *w {
                    c.pop();
                    c.push('+');
                }
                l.push_str(&format!("{c:>w$}"));
            }
            format!("{}\n", l.trim_end())
        }
    };
    if !inv.noheader {
        text.push_str(&row(fields
            .iter()
            .map(|(f, _)| sacct_header(f).to_string())
            .collect()));
        if !inv.parsable {
            text.push_str(&row(fields.iter().map(|(_, w)| "-".repeat(*w)).collect()));
        }
    }
    for a in &items {
        text.push_str(&row(fields
            .iter()
            .map(|(f, _)| sacct_field(a, f, now))
            .collect()));
    }
    out.write_all(text.as_bytes())?;
    Ok(0)
}

/// `lattice session` for an salloc or `srun --pty` line (`tool`): sbatch's options, the
/// command, and whether it runs here (`local`).
fn session_args(
    tool: &str,
    args: &[String],
    local: bool,
) -> Result<crate::cli::SessionArgs, CliError> {
    let inv = sbatch_to_lattice(args).map_err(|e| slurm_err(tool, &e))?;
    Ok(crate::cli::SessionArgs {
        flags: SubmitFlags {
            sbatch_args: without_wrap(&inv.sbatch_args),
            ..Default::default()
        },
        command: session_command(&inv),
        local,
    })
}

/// The command of an salloc or `srun --pty` line: CMD ARGS, or `--wrap`'s through sh.
fn session_command(inv: &SbatchInvocation) -> Vec<String> {
    if let Some(w) = &inv.wrap {
        return vec!["/bin/sh".into(), "-c".into(), w.clone()];
    }
    inv.script
        .iter()
        .chain(inv.script_args.iter())
        .cloned()
        .collect()
}

/// `salloc [OPTIONS] [CMD ARGS...]`: `lattice session` with sbatch's options.
async fn salloc(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: Shutdown,
) -> Result<i32, CliError> {
    let sa = session_args("salloc", args, true)?;
    crate::cmd::launch::session(ctx, "salloc", &sa, Shell::Here, out, err, shutdown).await
}

/// `srun` inside an allocation (`--jobid`, or `LATTICE_ALLOC_ID`/`SLURM_JOB_ID` set): a
/// job step of it.
async fn srun_step(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let mut st = crate::cmd::launch::parse_srun_step(args)
        .map_err(|e| CliError::new("srun", e).exit_code(exit::USAGE))?;
    if st.req.alloc.is_empty() {
        st.req.alloc = crate::cmd::launch::alloc_from_env(ctx).unwrap_or_default();
    }
    if !ctx.quiet {
        for w in &st.warnings {
            writeln!(err, "srun: warning: {w}")?;
        }
    }
    if st.pty {
        return crate::cmd::launch::pty_step(ctx, "srun", &st.req, out, err, shutdown).await;
    }
    crate::cmd::launch::run_step(ctx, "srun", &st.req, out, err, shutdown).await
}

async fn srun(
    ctx: &mut Ctx,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    // srun's own options only (their values skipped), not the command's arguments.
    let in_allocation = crate::cmd::launch::alloc_from_env(ctx).is_some()
        || crate::cmd::launch::srun_jobid(args).is_some();
    if in_allocation {
        return srun_step(ctx, args, out, err, shutdown).await;
    }
    // Outside an allocation srun submits one and runs the command in it, like Slurm.
    // srun's options are sbatch's; the first non-option word starts the command.
    // `srun [OPTIONS] --pty CMD` (Slurm's interactive job): a session with a terminal
    // on its first node.
    if let Some(rest) = crate::cmd::launch::srun_without_pty(args) {
        let sa = session_args("srun", &rest, false)?;
        let sd = std::mem::replace(shutdown, Box::pin(std::future::pending::<()>()));
        return crate::cmd::launch::session(ctx, "srun", &sa, Shell::FirstNode, out, err, sd).await;
    }
    let inv = sbatch_to_lattice(args).map_err(|e| slurm_err("srun", &e))?;
    let Some(prog) = inv.script.clone().or_else(|| inv.wrap.clone()) else {
        return Err(CliError::new("srun", "no command given")
            .hint("srun [OPTIONS] CMD [ARGS...], e.g. srun -N2 hostname")
            .exit_code(exit::USAGE));
    };
    let mut command = if inv.wrap.is_some() {
        vec!["/bin/sh".to_string(), "-c".to_string(), prog.clone()]
    } else {
        vec![prog.clone()]
    };
    command.extend(inv.script_args.iter().cloned());
    let flags = SubmitFlags {
        sbatch_args: without_wrap(&inv.sbatch_args),
        command,
        ..Default::default()
    };
    let t = submit::build(ctx, flags, "", None, true).await?;
    submit::print_warnings(ctx, &t, err)?;
    let created = submit::post(ctx, &t.allocation, false).await?;
    let id = name(&created).to_string();
    let ns = s(&created, "/metadata/namespace")
        .unwrap_or(&ctx.tenant)
        .to_string();
    if !ctx.quiet {
        writeln!(err, "srun: job {id} queued and waiting for resources")?;
    }
    // Wait until it runs (or ends), then stream its output until it ends.
    let quiet = ctx.quiet;
    let mut note = |a: &Value| -> std::io::Result<()> {
        if !quiet && matches!(phase(a), "Staging" | "Running") {
            writeln!(err, "srun: job {} has been allocated resources", name(a))?;
        }
        Ok(())
    };
    let mut started = None;
    {
        let path = workload::object("allocations", Some(&ns), &id);
        loop {
            let a = ctx
                .client
                .get(&path)
                .await
                .map_err(|e| CliError::from_client(format!("get allocation {id:?}"), e))?;
            if phase(&a) != "Pending" {
                note(&a)?;
                started = Some(a);
                break;
            }
            tokio::select! {
                _ = &mut *shutdown => break,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }
    if started.is_none() {
        return Ok(130);
    }
    let la = LogsArgs {
        id: id.clone(),
        follow: true,
        ..Default::default()
    };
    if let Err(e) = crate::cmd::logs::stream(ctx, &ns, &la, out, err, shutdown).await {
        if !quiet {
            writeln!(err, "srun: warning: no output: {e}")?;
        }
    }
    let mut ignore = |_: &Value| Ok(());
    match submit::wait_terminal(ctx, &ns, &id, shutdown, &mut ignore).await? {
        Some(a) if phase(&a) == "Completed" => Ok(0),
        Some(a) => {
            let code = a
                .pointer("/status/exitCode")
                .and_then(Value::as_i64)
                .filter(|c| *c > 0 && *c < 256)
                .unwrap_or(1) as i32;
            if !quiet {
                writeln!(
                    err,
                    "srun: error: job {id} {}{}",
                    phase(&a).to_lowercase(),
                    s(&a, "/status/message")
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                )?;
            }
            Ok(code)
        }
        None => Ok(130),
    }
}
