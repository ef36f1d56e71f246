//! Job steps and interactive sessions.
//!
//! * `lattice launch --alloc=ID [-n N] [-N NODES] [--tasks-per-node K] CMD ARGS...` runs a
//!   command inside a running allocation (Slurm's `srun` inside an allocation): it
//!   creates a *step*, an Allocation `ID.<n>` with `spec.stepOf: ID`, owned by the
//!   allocation; the step controller binds it to the allocation's first nodes and the
//!   agents run N tasks there (`LATTICE_PROCID`/`SLURM_PROCID` 0..N-1). The output is
//!   streamed as it comes; the exit status is the highest of the tasks'. Ctrl-C cancels
//!   the step. Inside an allocation (`LATTICE_ALLOC_ID` or `SLURM_JOB_ID` set) `--alloc`
//!   may be left out.
//! * `lattice session [SUBMIT FLAGS] [-- CMD ARGS...]` holds nodes for interactive work
//!   (Slurm's `salloc`): it submits an allocation that sleeps on its nodes, waits until it
//!   runs (named `session-…`, job name `interactive`), then runs `$SHELL` (or CMD) *here* with `LATTICE_ALLOC_ID`, `SLURM_JOB_ID`,
//!   `SLURM_NNODES` and `SLURM_JOB_NODELIST` set, so `lattice launch` / `srun` in it run
//!   on the session's nodes. When the shell exits the allocation is cancelled.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::{LaunchArgs, LogsArgs, SessionArgs};
use crate::client::{ListParams, WriteOptions};
use crate::cmd::status::cancel_one;
use crate::cmd::submit;
use crate::cmd::workload::{self, is_terminal, name, phase, s};
use crate::errors::{exit, CliError};
use crate::{Ctx, Shutdown};
use lattice_apis::steps::{self, TaskLaunch, STEP_OF_LABEL};
use lattice_apis::Allocation;

/// How often a step or session is looked at while it starts.
const POLL: Duration = Duration::from_millis(250);

/// A step to run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepRequest {
    /// The allocation to run in.
    pub alloc: String,
    /// Tasks in all.
    pub ntasks: Option<u32>,
    /// Nodes to use (the allocation's first ones).
    pub nodes: Option<u32>,
    /// Tasks per node.
    pub tasks_per_node: Option<u32>,
    /// Program and arguments.
    pub command: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Working directory on the nodes (default: the current directory).
    pub chdir: Option<String>,
    /// Prefix output lines with the node name.
    pub label: bool,
}

/// The allocation a step runs in when `--alloc` is not given: the one this shell is
/// inside (`LATTICE_ALLOC_ID`, else `SLURM_JOB_ID`).
pub fn alloc_from_env(ctx: &Ctx) -> Option<String> {
    ctx.env
        .get("LATTICE_ALLOC_ID")
        .or_else(|| ctx.env.get("SLURM_JOB_ID"))
        .filter(|v| !v.is_empty())
}

/// The next free step number of `parent` (`parent.<n>`).
async fn next_step(ctx: &Ctx, tenant: &str, parent: &str) -> Result<u32, CliError> {
    let list = ctx
        .client
        .list(
            &workload::collection("allocations", Some(tenant)),
            &ListParams {
                label_selector: Some(format!("{STEP_OF_LABEL}={parent}")),
                field_selector: None,
            },
        )
        .await
        .map_err(|e| CliError::from_client(format!("list the steps of {parent:?}"), e))?;
    let items = list.get("items").and_then(Value::as_array);
    Ok(steps::next_number(
        parent,
        items.into_iter().flatten().map(name),
    ))
}

/// Runs a step and streams its output; returns its exit status (130 when interrupted).
pub async fn run_step(
    ctx: &Ctx,
    tool: &str,
    req: &StepRequest,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    if req.command.is_empty() {
        return Err(CliError::new(tool, "no command given")
            .hint(format!(
                "{tool} [OPTIONS] CMD [ARGS...], e.g. {tool} -n 4 hostname"
            ))
            .exit_code(exit::USAGE));
    }
    let parent = workload::get_allocation(ctx, &ctx.tenant, &req.alloc).await?;
    let tenant = s(&parent, "/metadata/namespace")
        .unwrap_or(&ctx.tenant)
        .to_string();
    let what = format!("{tool}: run in allocation {}", req.alloc);
    let typed: Allocation = serde_json::from_value(parent.clone())
        .map_err(|e| CliError::new(&what, format!("cannot read the allocation: {e}")))?;
    let launch = TaskLaunch {
        command: req.command.clone(),
        ntasks: req.ntasks,
        nodes: req.nodes,
        tasks_per_node: req.tasks_per_node,
        env: req.env.iter().cloned().collect(),
        working_dir: Some(
            req.chdir
                .clone()
                .unwrap_or_else(|| ctx.cwd.display().to_string()),
        ),
    };
    let user = ctx.user();
    let collection = workload::collection("allocations", Some(&tenant));
    let mut n = next_step(ctx, &tenant, &req.alloc).await?;
    let created = loop {
        let step_name = format!("{}.{n}", req.alloc);
        let step =
            steps::step_allocation(&typed, &step_name, &launch, user.as_deref()).map_err(|e| {
                match steps::refuse(&typed) {
                    Some(_) => CliError::new(&what, e)
                        .hint("submit a new allocation (lattice submit, lattice session)"),
                    None => CliError::new(&what, e).exit_code(exit::USAGE),
                }
            })?;
        let body = serde_json::to_value(&step).map_err(|e| CliError::new(&what, e.to_string()))?;
        match ctx
            .client
            .create(&collection, &body, &WriteOptions::default())
            .await
        {
            Ok(v) => break v,
            // Another launch took the number: take the next one.
            Err(e) if e.code() == Some(409) && n < u32::MAX => n += 1,
            Err(e) => return Err(CliError::from_client(format!("{tool}: create step"), e)),
        }
    };
    let nodes = created
        .pointer("/spec/resources/nodes")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let ntasks = s(&created, "/metadata/annotations/lattice.dev~1ntasks")
        .unwrap_or("1")
        .to_string();
    let id = name(&created).to_string();
    if !ctx.quiet {
        writeln!(
            err,
            "{tool}: step {id}: {ntasks} task(s) on {nodes} node(s) of allocation {}",
            req.alloc
        )?;
    }
    follow_step(ctx, tool, &tenant, &id, req.label, out, err, shutdown).await
}

/// Waits for a step (or any allocation) to start, streams its output until it ends and
/// returns its exit status; Ctrl-C cancels it (130).
#[allow(clippy::too_many_arguments)]
pub async fn follow_step(
    ctx: &Ctx,
    tool: &str,
    tenant: &str,
    id: &str,
    label: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let path = workload::object("allocations", Some(tenant), id);
    let mut said = String::new();
    loop {
        let a = ctx
            .client
            .get(&path)
            .await
            .map_err(|e| CliError::from_client(format!("{tool}: get {id:?}"), e))?;
        // Running: every node has started it, so every node has its output (a node still
        // staging would be left out of the stream).
        if phase(&a) == "Running" || is_terminal(phase(&a)) {
            break;
        }
        let msg = s(&a, "/status/message").unwrap_or_default().to_string();
        if !ctx.quiet && phase(&a) == "Pending" && !msg.is_empty() && msg != said {
            writeln!(err, "{tool}: {id}: {msg}")?;
            said = msg;
        }
        tokio::select! {
            _ = &mut *shutdown => return interrupted(ctx, tool, tenant, id, err).await,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
    let la = LogsArgs {
        id: id.to_string(),
        follow: true,
        no_prefix: !label,
        label,
        ..Default::default()
    };
    match crate::cmd::logs::stream(ctx, tenant, &la, out, err, shutdown).await {
        Ok(true) => {}
        Ok(false) => return interrupted(ctx, tool, tenant, id, err).await,
        Err(e) => {
            if !ctx.quiet {
                writeln!(err, "{tool}: warning: no output: {e}")?;
            }
        }
    }
    let mut ignore = |_: &Value| Ok(());
    let Some(a) = submit::wait_terminal(ctx, tenant, id, shutdown, &mut ignore).await? else {
        return interrupted(ctx, tool, tenant, id, err).await;
    };
    if phase(&a) == "Completed" {
        return Ok(0);
    }
    let code = a
        .pointer("/status/exitCode")
        .and_then(Value::as_i64)
        .filter(|c| *c > 0 && *c < 256)
        .unwrap_or(1) as i32;
    if !ctx.quiet {
        let why = s(&a, "/status/message").unwrap_or_default();
        writeln!(
            err,
            "{tool}: error: {id} {}{}",
            phase(&a).to_lowercase(),
            if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            }
        )?;
    }
    Ok(code)
}

async fn interrupted(
    ctx: &Ctx,
    tool: &str,
    tenant: &str,
    id: &str,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let a = workload::get_allocation(ctx, tenant, id).await?;
    let line = cancel_one(ctx, tenant, &a).await?;
    if !ctx.quiet {
        writeln!(err, "{tool}: interrupted: {line}")?;
    }
    Ok(130)
}

/// Runs `lattice launch`.
pub async fn launch(
    ctx: &Ctx,
    a: &LaunchArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    if a.pty {
        return Err(CliError::new(
            "launch",
            "--pty (an interactive terminal on a node) is not supported",
        )
        .hint("run commands with lattice launch CMD, or use lattice session for a local shell holding the nodes")
        .exit_code(exit::USAGE));
    }
    let Some(alloc) = a.alloc.clone().or_else(|| alloc_from_env(ctx)) else {
        return Err(CliError::new("launch", "no allocation given")
            .hint("name it with --alloc=ID, or run inside an allocation (lattice session)")
            .exit_code(exit::USAGE));
    };
    let mut env = Vec::new();
    for kv in &a.env {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(
                CliError::new("launch", format!("--env {kv:?} is not KEY=VALUE"))
                    .exit_code(exit::USAGE),
            );
        };
        env.push((k.to_string(), v.to_string()));
    }
    let req = StepRequest {
        alloc,
        ntasks: a.ntasks,
        nodes: a.nodes,
        tasks_per_node: a.tasks_per_node,
        command: a.command.clone(),
        env,
        chdir: a.chdir.clone(),
        label: a.label,
    };
    run_step(ctx, "launch", &req, out, err, &mut shutdown).await
}

/// Runs `lattice session` (and `salloc`): `tool` names the messages.
pub async fn session(
    ctx: &mut Ctx,
    tool: &str,
    a: &SessionArgs,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    let mut flags = a.flags.clone();
    flags.command = vec!["sleep".into(), "infinity".into()];
    let mut t = submit::build(ctx, flags, "", None, true).await?;
    if t.allocation.pointer("/metadata/name").is_none() {
        t.allocation["metadata"]["generateName"] = json!("session-");
    }
    if t.allocation.pointer("/spec/tags/name").is_none() {
        t.allocation["spec"]["tags"]["name"] = json!("interactive");
    }
    submit::print_warnings(ctx, &t, err)?;
    let created = submit::post(ctx, &t.allocation, false).await?;
    let id = name(&created).to_string();
    let tenant = s(&created, "/metadata/namespace")
        .unwrap_or(&ctx.tenant)
        .to_string();
    if !ctx.quiet {
        writeln!(err, "{tool}: pending allocation {id}")?;
    }
    let path = workload::object("allocations", Some(&tenant), &id);
    let mut said = String::new();
    let running = loop {
        let cur = ctx
            .client
            .get(&path)
            .await
            .map_err(|e| CliError::from_client(format!("{tool}: get {id:?}"), e))?;
        let p = phase(&cur);
        if p == "Running" {
            break cur;
        }
        if is_terminal(p) {
            return Err(CliError::new(
                format!("{tool}: allocation {id}"),
                format!(
                    "ended before it ran ({p}): {}",
                    s(&cur, "/status/message").unwrap_or_default()
                ),
            ));
        }
        let msg = s(&cur, "/status/message").unwrap_or_default().to_string();
        if !ctx.quiet && !msg.is_empty() && msg != said {
            writeln!(err, "{tool}: {id}: {msg}")?;
            said = msg;
        }
        tokio::select! {
            _ = &mut shutdown => {
                let line = cancel_one(ctx, &tenant, &cur).await?;
                if !ctx.quiet {
                    writeln!(err, "{tool}: interrupted: {line}")?;
                }
                return Ok(130);
            }
            _ = tokio::time::sleep(POLL) => {}
        }
    };
    let nodes: Vec<String> = running
        .pointer("/status/assignedNodes")
        .and_then(Value::as_array)
        .map(|v| {
            v.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let nodelist = lattice_compat::hostlist::compress(&nodes);
    if !ctx.quiet {
        writeln!(err, "{tool}: granted allocation {id} on {nodelist}")?;
    }
    let mut command = a.command.clone();
    if command.is_empty() {
        command.push(ctx.env.get("SHELL").unwrap_or_else(|| "/bin/sh".into()));
    }
    let status = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("LATTICE_ALLOC_ID", &id)
        .env("LATTICE_TENANT", &tenant)
        .env("LATTICE_NODELIST", nodes.join(","))
        .env("LATTICE_NNODES", nodes.len().to_string())
        .env("SLURM_JOB_ID", &id)
        .env("SLURM_JOBID", &id)
        .env("SLURM_NNODES", nodes.len().to_string())
        .env("SLURM_JOB_NUM_NODES", nodes.len().to_string())
        .env("SLURM_JOB_NODELIST", &nodelist)
        .env("SLURM_NODELIST", &nodelist)
        .status()
        .await;
    // The shell is over (or could not start): give the nodes back either way.
    let cur = workload::get_allocation(ctx, &tenant, &id).await?;
    let line = cancel_one(ctx, &tenant, &cur).await?;
    if !ctx.quiet {
        writeln!(err, "{tool}: relinquishing allocation {id} ({line})")?;
    }
    let status = status
        .map_err(|e| CliError::new(format!("{tool}: run {:?}", command[0]), e.to_string()))?;
    Ok(status.code().unwrap_or(1))
}

/// `srun` inside an allocation, translated: the step, the `--jobid` if given, and one
/// warning per option that has no meaning for a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SrunStep {
    /// The step (its `alloc` is empty unless `--jobid` was given).
    pub req: StepRequest,
    /// Warnings.
    pub warnings: Vec<String>,
}

/// Short srun options that take a value (Slurm's getopt string).
const SRUN_SHORT_WITH_VALUE: &str = "AbcdDeiJLmMnNopqrStTwWxCG";

/// Parses srun's command line for a step (`srun [OPTIONS] CMD [ARGS...]`).
pub fn parse_srun_step(args: &[String]) -> Result<SrunStep, String> {
    let mut st = SrunStep::default();
    let num = |opt: &str, v: &str| -> Result<u32, String> {
        // `-N 2-4` (min-max): a step uses the minimum.
        let v = v.split('-').next().unwrap_or(v);
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("{opt} needs a number, got {v:?}"))
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        // (name, inline value) for `--long[=v]` and `-x[v]`.
        let (name, inline): (String, Option<String>) = match a.strip_prefix("--") {
            Some(body) => match body.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (body.to_string(), None),
            },
            None => {
                let c = a[1..].chars().next().unwrap_or('?');
                let rest = &a[1 + c.len_utf8()..];
                (
                    c.to_string(),
                    (!rest.is_empty()).then(|| rest.trim_start_matches('=').to_string()),
                )
            }
        };
        let takes_value = match name.as_str() {
            "ntasks" | "nodes" | "ntasks-per-node" | "jobid" | "chdir" | "export" | "job-name"
            | "mpi" => true,
            n if n.chars().count() == 1 => n.chars().all(|c| SRUN_SHORT_WITH_VALUE.contains(c)),
            _ => false,
        };
        let mut value = || -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("option {a} needs a value"))
        };
        match name.as_str() {
            "n" | "ntasks" => st.req.ntasks = Some(num(a, &value()?)?),
            "N" | "nodes" => st.req.nodes = Some(num(a, &value()?)?),
            "ntasks-per-node" => st.req.tasks_per_node = Some(num(a, &value()?)?),
            "jobid" => st.req.alloc = value()?,
            "D" | "chdir" => st.req.chdir = Some(value()?),
            "l" | "label" => st.req.label = true,
            "pty" => {
                return Err(
                    "--pty (an interactive terminal on a node) is not supported; run commands with srun CMD, or use salloc for a local shell holding the nodes".into(),
                )
            }
            "export" => {
                let v = value()?;
                if !v.eq_ignore_ascii_case("ALL") {
                    st.warnings.push(format!(
                        "--export={v}: the step gets the allocation's environment (as with ALL)"
                    ));
                }
            }
            _ if takes_value => {
                let v = value()?;
                st.warnings
                    .push(format!("{a}{}: ignored for a step inside an allocation", if inline.is_some() { String::new() } else { format!(" {v}") }));
            }
            _ => st
                .warnings
                .push(format!("{a}: ignored for a step inside an allocation")),
        }
        i += 1;
    }
    st.req.command = args[i.min(args.len())..].to_vec();
    if st.req.command.is_empty() {
        return Err("no command given: srun [OPTIONS] CMD [ARGS...]".into());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn srun_inside_an_allocation() {
        let st = parse_srun_step(&v(&["-n4", "-N", "2", "--label", "hostname", "-s"])).unwrap();
        assert_eq!(st.req.ntasks, Some(4));
        assert_eq!(st.req.nodes, Some(2));
        assert!(st.req.label);
        assert_eq!(st.req.command, v(&["hostname", "-s"]));
        assert!(st.warnings.is_empty());
        let st = parse_srun_step(&v(&[
            "--ntasks=8",
            "--ntasks-per-node",
            "4",
            "--jobid=42",
            "--mpi=pmi2",
            "-c",
            "4",
            "--exclusive",
            "--",
            "./app",
            "-n",
            "3",
        ]))
        .unwrap();
        assert_eq!(st.req.ntasks, Some(8));
        assert_eq!(st.req.tasks_per_node, Some(4));
        assert_eq!(st.req.alloc, "42");
        assert_eq!(st.req.command, v(&["./app", "-n", "3"]));
        assert_eq!(st.warnings.len(), 3, "{:?}", st.warnings);
        assert!(st.warnings[1].starts_with("-c 4:"), "{:?}", st.warnings);
        assert!(parse_srun_step(&v(&["--pty", "bash"]))
            .unwrap_err()
            .contains("--pty"));
        assert!(parse_srun_step(&v(&["-n"]))
            .unwrap_err()
            .contains("needs a value"));
        assert!(parse_srun_step(&v(&["-n", "x", "true"]))
            .unwrap_err()
            .contains("number"));
        assert!(parse_srun_step(&v(&["-N2"]))
            .unwrap_err()
            .contains("no command"));
        assert_eq!(
            parse_srun_step(&v(&["-N", "2-4", "true"]))
                .unwrap()
                .req
                .nodes,
            Some(2)
        );
    }
}
