//! Job steps and interactive sessions.
//!
//! * `lattice launch --alloc=ID [-n N] [-N NODES] [--tasks-per-node K] CMD ARGS...` runs a
//!   command inside a running allocation (Slurm's `srun` inside an allocation): it
//!   creates a *step*, an Allocation `ID.<n>` with `spec.stepOf: ID`, owned by the
//!   allocation; the step controller binds it to the allocation's first nodes and the
//!   agents run N tasks there (`LATTICE_PROCID`/`SLURM_PROCID` 0..N-1). Without `-n`, `-N`
//!   and `--tasks-per-node` the step takes the allocation's task layout (`#SBATCH -n`,
//!   `--ntasks-per-node`). The tasks get the allocation's `spec.env`, then this process's
//!   environment (see [`export_env`]; `--export`), then `--env`. The output is streamed
//!   as it comes; the exit status is the highest of the tasks'. Ctrl-C, SIGTERM and SIGHUP
//!   cancel the step, and so does any error after it was created. Inside an allocation
//!   (`LATTICE_ALLOC_ID` or `SLURM_JOB_ID` set) `--alloc` may be left out.
//! * `lattice session [SUBMIT FLAGS] [-- CMD ARGS...]` holds nodes for interactive work
//!   (Slurm's `salloc`): it submits an allocation that sleeps on its nodes, waits until it
//!   runs (named `session-…`, job name `interactive`), then runs `$SHELL` (or CMD) *here* with `LATTICE_ALLOC_ID`, `SLURM_JOB_ID`,
//!   `SLURM_NNODES` and `SLURM_JOB_NODELIST` set, so `lattice launch` / `srun` in it run
//!   on the session's nodes. When the shell exits the allocation is cancelled, and so it is
//!   on every other way out once it was created: Ctrl-C, SIGTERM or SIGHUP while waiting,
//!   SIGTERM or SIGHUP (the terminal closed) while the shell runs (the shell gets a
//!   SIGHUP), an error.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

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

/// Tries to create a step under the next free number before giving up (as the API
/// server's `POST .../tasks` does).
pub const STEP_CREATE_TRIES: u32 = 8;

/// How long a session waiting for its allocation keeps trying through passing errors
/// (connection trouble, 5xx) before it gives up and cancels the allocation.
const SESSION_RETRY_FOR: Duration = Duration::from_secs(30);

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
    /// Extra environment (`--env`), over the exported one.
    pub env: Vec<(String, String)>,
    /// Which of this process's variables the tasks get (`--export`, see [`export_env`]);
    /// `None` is `ALL`.
    pub export: Option<String>,
    /// Working directory on the nodes (default: the current directory).
    pub chdir: Option<String>,
    /// Prefix output lines with the node name.
    pub label: bool,
    /// MPI wire-up, distribution, GPUs per task (`--mpi`, `--distribution`,
    /// `--gpus-per-task`); `None` when none was asked for.
    pub launch: Option<lattice_apis::StepLaunch>,
}

/// `--mpi`, `--distribution` and `--gpus-per-task` as a step's `spec.launch`.
pub fn step_launch(
    mpi: Option<&str>,
    distribution: Option<&str>,
    gpus_per_task: Option<u32>,
    cpu_bind: Option<&str>,
) -> Result<Option<lattice_apis::StepLaunch>, String> {
    let l = lattice_apis::StepLaunch {
        mpi: mpi
            .map(|m| m.parse().map_err(|e| format!("--mpi: {e}")))
            .transpose()?,
        distribution: distribution
            .map(|d| d.parse().map_err(|e| format!("--distribution: {e}")))
            .transpose()?,
        gpus_per_task,
        cpu_bind: cpu_bind
            .map(|c| c.parse().map_err(|e| format!("--cpu-bind: {e}")))
            .transpose()?,
    };
    Ok((l != lattice_apis::StepLaunch::default()).then_some(l))
}

/// The allocation a step runs in when `--alloc` is not given: the one this shell is
/// inside (`LATTICE_ALLOC_ID`, else `SLURM_JOB_ID`).
pub fn alloc_from_env(ctx: &Ctx) -> Option<String> {
    ctx.env
        .get("LATTICE_ALLOC_ID")
        .or_else(|| ctx.env.get("SLURM_JOB_ID"))
        .filter(|v| !v.is_empty())
}

/// Caller variables a step does not get with `--export=ALL` (they may still be named
/// with `--export=VAR`): the ones the node's agent sets (`LATTICE_*`, `SLURM_*`, and
/// `HOME`, `USER`, `LOGNAME` for the user the tasks run as) and the ones that describe
/// this shell rather than the task (`PWD`, `OLDPWD`, `SHLVL`, `_`, `HOSTNAME`). `TERM` is
/// passed on, as Slurm does (scripts calling `tput` need it).
pub fn exported_by_default(name: &str) -> bool {
    !(name.starts_with("LATTICE_")
        || name.starts_with("SLURM_")
        || matches!(
            name,
            "PWD" | "OLDPWD" | "SHLVL" | "_" | "HOSTNAME" | "HOME" | "USER" | "LOGNAME"
        ))
}

/// Whether `name` can be an Allocation's `spec.env` key (letters, digits and `_`, not
/// starting with a digit); others (bash's exported functions, `BASH_FUNC_f%%`) are left
/// out.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The longest value a variable can have in `spec.env`.
const MAX_ENV_VALUE: usize = 128 * 1024;

/// This process's environment (variables that are not UTF-8 are left out).
pub fn caller_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The variables a step gets from `caller` (the process environment) for srun's
/// `--export` value `spec` (`None`: `ALL`), Slurm's rules:
///
/// * `ALL`: every variable but those [`exported_by_default`] leaves out;
/// * `NONE` (or `NIL`): none (the tasks still get the allocation's `spec.env`);
/// * `A,B`: only `A` and `B`; `VAR=value` items set `VAR`; with `ALL` in the list
///   (`ALL,VAR=value`) they add to all.
///
/// Names that cannot be environment variables, and values over 128 KiB, are left out.
pub fn export_env(
    spec: Option<&str>,
    caller: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<String, String>, String> {
    let spec = spec.unwrap_or("ALL");
    let (mut all, mut none) = (false, false);
    let mut names = Vec::new();
    let mut set = BTreeMap::new();
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item.eq_ignore_ascii_case("ALL") {
            all = true;
        } else if item.eq_ignore_ascii_case("NONE") || item.eq_ignore_ascii_case("NIL") {
            none = true;
        } else {
            let (k, v) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            if !valid_env_name(k) {
                return Err(format!(
                    "--export={spec}: {k:?} is not a variable name (letters, digits and '_')"
                ));
            }
            match v {
                Some(v) => {
                    set.insert(k.to_string(), v.to_string());
                }
                None => names.push(k.to_string()),
            }
        }
    }
    if all && none {
        return Err(format!("--export={spec}: ALL and NONE cannot be combined"));
    }
    if spec.trim().is_empty() {
        return Err("--export needs a value: ALL, NONE or a list of variables".into());
    }
    let mut env: BTreeMap<String, String> = caller
        .into_iter()
        .filter(|(k, v)| valid_env_name(k) && v.len() <= MAX_ENV_VALUE)
        .filter(|(k, _)| {
            if all {
                exported_by_default(k) || names.contains(k)
            } else {
                !none && names.contains(k)
            }
        })
        .collect();
    env.extend(set);
    Ok(env)
}

/// Polls `shutdown` once, without waiting: its signal handlers are in place from then on
/// (so Ctrl-C, SIGTERM and SIGHUP no longer end the process before it has cleaned up;
/// they are seen the next time `shutdown` is awaited). True when it has fired already
/// (it must not be polled again then).
async fn fired(shutdown: &mut Shutdown) -> bool {
    tokio::select! {
        biased;
        _ = &mut *shutdown => true,
        _ = std::future::ready(()) => false,
    }
}

/// Cancels allocation (or step) `id`, best effort: a cancel is asked for even when the
/// allocation cannot be read first; one that is gone or has ended needs none.
async fn cancel_by_name(ctx: &Ctx, tenant: &str, id: &str) -> Result<String, CliError> {
    let a = match ctx
        .client
        .get(&workload::object("allocations", Some(tenant), id))
        .await
    {
        Ok(a) => a,
        Err(e) if e.is_not_found() => {
            return Ok(format!("Allocation {id} is gone; nothing to cancel"))
        }
        Err(_) => json!({"metadata": {"name": id}}),
    };
    cancel_one(ctx, tenant, &a).await
}

/// The line saying a cancel failed (printed even with `-q`: something is left running).
fn cancel_failed(tool: &str, id: &str, e: &CliError) -> String {
    format!(
        "{tool}: warning: could not cancel {id}: {} — {}; cancel it with `lattice cancel {id}`",
        e.what, e.why
    )
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
/// Once the step exists, every way out but its end cancels it.
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
    let mut env = export_env(req.export.as_deref(), caller_env())
        .map_err(|e| CliError::new(tool, e).exit_code(exit::USAGE))?;
    env.extend(req.env.iter().cloned());
    // Signals from here on are seen, so a step created below is cancelled on them.
    if fired(shutdown).await {
        return Ok(130);
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
        env,
        working_dir: Some(
            req.chdir
                .clone()
                .unwrap_or_else(|| ctx.cwd.display().to_string()),
        ),
        launch: req.launch.clone(),
    };
    let user = ctx.user();
    let collection = workload::collection("allocations", Some(&tenant));
    let first = next_step(ctx, &tenant, &req.alloc).await?;
    let mut created = None;
    for n in (first..).take(STEP_CREATE_TRIES as usize) {
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
            Ok(v) => {
                created = Some(v);
                break;
            }
            // Another launch took the number: take the next one.
            Err(e) if e.code() == Some(409) => {}
            Err(e) => return Err(CliError::from_client(format!("{tool}: create step"), e)),
        }
    }
    let Some(created) = created else {
        return Err(CliError::new(
            format!("{tool}: create step"),
            format!(
                "steps {}.{first} to {}.{} all exist already (other launches took them); no free step number found in {STEP_CREATE_TRIES} tries",
                req.alloc,
                req.alloc,
                first.saturating_add(STEP_CREATE_TRIES - 1)
            ),
        )
        .hint("try again"));
    };
    let id = name(&created).to_string();
    let followed = start_and_follow(ctx, tool, req, &tenant, &created, out, err, shutdown).await;
    if followed.is_err() {
        // The step would run on without anyone to see it: stop it.
        match cancel_by_name(ctx, &tenant, &id).await {
            Ok(line) if !ctx.quiet => {
                let _ = writeln!(err, "{tool}: {line}");
            }
            Ok(_) => {}
            Err(e) => {
                let _ = writeln!(err, "{}", cancel_failed(tool, &id, &e));
            }
        }
    }
    followed
}

/// Says which step `created` is and follows it (see [`follow_step`]).
#[allow(clippy::too_many_arguments)]
async fn start_and_follow(
    ctx: &Ctx,
    tool: &str,
    req: &StepRequest,
    tenant: &str,
    created: &Value,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let nodes = created
        .pointer("/spec/resources/nodes")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let ntasks = s(created, "/metadata/annotations/lattice.dev~1ntasks").unwrap_or("1");
    let id = name(created);
    if !ctx.quiet {
        writeln!(
            err,
            "{tool}: step {id}: {ntasks} task(s) on {nodes} node(s) of allocation {}",
            req.alloc
        )?;
    }
    follow_step(ctx, tool, tenant, id, req.label, out, err, shutdown).await
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

/// Cancels step `id` after Ctrl-C (or SIGTERM, SIGHUP): 130.
async fn interrupted(
    ctx: &Ctx,
    tool: &str,
    tenant: &str,
    id: &str,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    match cancel_by_name(ctx, tenant, id).await {
        Ok(line) if !ctx.quiet => writeln!(err, "{tool}: interrupted: {line}")?,
        Ok(_) => {}
        Err(e) => writeln!(err, "{}", cancel_failed(tool, id, &e))?,
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
    let launch = step_launch(
        a.mpi.as_deref(),
        a.distribution.as_deref(),
        a.gpus_per_task,
        a.cpu_bind.as_deref(),
    )
    .map_err(|e| CliError::new("launch", e).exit_code(exit::USAGE))?;
    let req = StepRequest {
        launch,
        alloc,
        ntasks: a.ntasks,
        nodes: a.nodes,
        tasks_per_node: a.tasks_per_node,
        command: a.command.clone(),
        env,
        export: a.export.clone(),
        chdir: a.chdir.clone(),
        label: a.label,
    };
    if a.pty {
        return pty_step(ctx, "launch", &req, out, err, &mut shutdown).await;
    }
    run_step(ctx, "launch", &req, out, err, &mut shutdown).await
}

/// `--pty` (`lattice launch`, srun in an allocation): the command on a terminal on the
/// allocation's first node, i.e. `lattice attach`; the step's other options have no
/// meaning there and are warned about.
pub async fn pty_step(
    ctx: &Ctx,
    tool: &str,
    req: &StepRequest,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let ignored: Vec<&str> = [
        ("--ntasks", req.ntasks.is_some()),
        ("--nodes", req.nodes.is_some()),
        ("--ntasks-per-node", req.tasks_per_node.is_some()),
        ("--label", req.label),
        ("--chdir", req.chdir.is_some()),
        ("--export", req.export.is_some()),
        ("--env", !req.env.is_empty()),
    ]
    .into_iter()
    .filter_map(|(o, given)| given.then_some(o))
    .collect();
    if !ctx.quiet && !ignored.is_empty() {
        writeln!(
            err,
            "{tool}: warning: {} ignored with --pty (one terminal on the first node, as the allocation's environment)",
            ignored.join(", ")
        )?;
    }
    let at = crate::cli::AttachArgs {
        id: req.alloc.clone(),
        args: req.command.clone(),
        tty: true,
        ..Default::default()
    };
    let tenant = ctx.tenant.clone();
    crate::cmd::attach::attach(ctx, &tenant, &at, out, err, shutdown).await
}

/// How a session ended, before its allocation is given back.
enum Held {
    /// Ctrl-C (SIGTERM, SIGHUP) while waiting for the nodes.
    Interrupted,
    /// The shell (or CMD) ended with this status.
    Exited(i32),
}

/// Where a session's shell (or command) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    /// Here, with the allocation's variables (salloc; `lattice session -- CMD` or `--local`).
    Here,
    /// On the allocation's first node, through `lattice attach` (`lattice session`,
    /// `srun --pty`).
    FirstNode,
}

impl Shell {
    /// `lattice session`'s choice: a terminal on the first node unless a command or
    /// `--local` is given.
    pub fn for_session(a: &SessionArgs) -> Shell {
        if a.local || !a.command.is_empty() {
            Shell::Here
        } else {
            Shell::FirstNode
        }
    }
}

/// Runs `lattice session` (and `salloc`): `tool` names the messages. Once the allocation
/// exists, every way out cancels it (best effort; a failed cancel is reported).
pub async fn session(
    ctx: &mut Ctx,
    tool: &str,
    a: &SessionArgs,
    shell: Shell,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    // Signals from here on are seen, so the allocation created below is given back on them
    // (and SIGTERM, SIGHUP while the shell runs end it).
    if fired(&mut shutdown).await {
        return Ok(130);
    }
    let mut hangup = HangUp::new();
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
    let held = hold(
        ctx,
        tool,
        a,
        shell,
        &id,
        &tenant,
        out,
        err,
        &mut shutdown,
        &mut hangup,
    )
    .await;
    // Every way out gives the nodes back.
    match cancel_by_name(ctx, &tenant, &id).await {
        Ok(line) if !ctx.quiet => {
            let _ = match &held {
                Ok(Held::Interrupted) => writeln!(err, "{tool}: interrupted: {line}"),
                _ => writeln!(err, "{tool}: relinquishing allocation {id} ({line})"),
            };
        }
        Ok(_) => {}
        Err(e) => {
            let _ = writeln!(err, "{}", cancel_failed(tool, &id, &e));
        }
    }
    match held? {
        Held::Interrupted => Ok(130),
        Held::Exited(code) => Ok(code),
    }
}

/// The part of a session between creating its allocation and giving it back: waits
/// until it runs, then runs the shell.
#[allow(clippy::too_many_arguments)]
async fn hold(
    ctx: &Ctx,
    tool: &str,
    a: &SessionArgs,
    shell: Shell,
    id: &str,
    tenant: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
    hangup: &mut HangUp,
) -> Result<Held, CliError> {
    if !ctx.quiet {
        writeln!(err, "{tool}: pending allocation {id}")?;
    }
    let path = workload::object("allocations", Some(tenant), id);
    let mut said = String::new();
    let mut failing_since: Option<Instant> = None;
    let running = loop {
        match ctx.client.get(&path).await {
            Ok(cur) => {
                failing_since = None;
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
            }
            // A passing error (the server restarting): keep trying for a while.
            Err(e)
                if e.is_transient()
                    && failing_since.get_or_insert_with(Instant::now).elapsed()
                        < SESSION_RETRY_FOR => {}
            Err(e) => return Err(CliError::from_client(format!("{tool}: get {id:?}"), e)),
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(Held::Interrupted),
            _ = tokio::time::sleep(POLL) => {}
        }
    };
    // Asked to stop while it was starting: no shell.
    if fired(shutdown).await {
        return Ok(Held::Interrupted);
    }
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
    if shell == Shell::FirstNode {
        let at = crate::cli::AttachArgs {
            id: id.to_string(),
            node: nodes.first().cloned(),
            args: a.command.clone(),
            ..Default::default()
        };
        return crate::cmd::attach::attach(ctx, tenant, &at, out, err, shutdown)
            .await
            .map(Held::Exited);
    }
    let mut command = a.command.clone();
    if command.is_empty() {
        command.push(ctx.env.get("SHELL").unwrap_or_else(|| "/bin/sh".into()));
    }
    let nnodes = nodes.len().to_string();
    let joined = nodes.join(",");
    let vars: [(&str, &str); 10] = [
        ("LATTICE_ALLOC_ID", id),
        ("LATTICE_TENANT", tenant),
        ("LATTICE_NODELIST", &joined),
        ("LATTICE_NNODES", &nnodes),
        ("SLURM_JOB_ID", id),
        ("SLURM_JOBID", id),
        ("SLURM_NNODES", &nnodes),
        ("SLURM_JOB_NUM_NODES", &nnodes),
        ("SLURM_JOB_NODELIST", &nodelist),
        ("SLURM_NODELIST", &nodelist),
    ];
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    run_shell(tool, &command, &vars, hangup)
        .await
        .map(Held::Exited)
}

/// SIGTERM and SIGHUP for this process, listened to from the start of a session (so
/// one that comes just before the shell starts is not missed).
struct HangUp {
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl HangUp {
    fn new() -> HangUp {
        use tokio::signal::unix::{signal, SignalKind};
        HangUp {
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }

    /// The next of them to come (never, for one that could not be set up).
    async fn next(&mut self) -> i32 {
        async fn one(sig: &mut Option<tokio::signal::unix::Signal>) {
            if let Some(s) = sig {
                if s.recv().await.is_some() {
                    return;
                }
            }
            std::future::pending().await
        }
        tokio::select! {
            _ = one(&mut self.term) => libc::SIGTERM,
            _ = one(&mut self.hup) => libc::SIGHUP,
        }
    }
}

/// Runs the session's shell (or command) here and returns its exit status (128 + N when
/// a signal N ended it). Ctrl-C belongs to the shell (as with salloc); SIGTERM or SIGHUP
/// (the terminal closed) for this process ends the shell with a SIGHUP (an interactive
/// shell ignores SIGTERM), then a SIGKILL 2 s later.
async fn run_shell(
    tool: &str,
    command: &[String],
    vars: &[(String, String)],
    hangup: &mut HangUp,
) -> Result<i32, CliError> {
    use std::os::unix::process::ExitStatusExt;
    let what = || format!("{tool}: run {:?}", command[0]);
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .envs(vars.iter().cloned())
        .spawn()
        .map_err(|e| CliError::new(what(), e.to_string()))?;
    let status = tokio::select! {
        st = child.wait() => st.map_err(|e| CliError::new(what(), e.to_string()))?,
        sig = hangup.next() => {
            if let Some(pid) = child.id() {
                // SAFETY: kill(2) on our own child's pid.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGHUP);
                }
            }
            if tokio::time::timeout(Duration::from_secs(2), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
            return Ok(128 + sig);
        }
    };
    Ok(status
        .code()
        .or_else(|| status.signal().map(|n| 128 + n))
        .unwrap_or(1))
}

/// `srun` inside an allocation, translated: the step, the `--jobid` if given, and one
/// warning per option that has no meaning for a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SrunStep {
    /// The step (its `alloc` is empty unless `--jobid` was given).
    pub req: StepRequest,
    /// `--pty`: the command runs on a terminal on the first node (`lattice attach`).
    pub pty: bool,
    /// Warnings.
    pub warnings: Vec<String>,
}

/// srun's long options that take a value, as `--name value` or `--name=value` (srun(1)).
/// Options whose value is optional (`--bcast[=path]`, `--exclusive[=user]`,
/// `--immediate[=s]`, `--kill-on-bad-exit[=0|1]`, `--no-kill[=off]`, `--nice[=n]`,
/// `--propagate[=rlimits]`, `--resv-ports[=n]`, `--compress[=type]`,
/// `--send-libs[=yes|no]`, `--x11[=...]`, `--pty[=fd]`) only take one after `=`.
pub const SRUN_LONG_WITH_VALUE: &[&str] = &[
    "accel-bind",
    "account",
    "acctg-freq",
    "bb",
    "bbf",
    "bcast-exclude",
    "begin",
    "chdir",
    "cluster-constraint",
    "clusters",
    "comment",
    "constraint",
    "container",
    "container-id",
    "core-spec",
    "cores-per-socket",
    "cpu-bind",
    "cpu-freq",
    "cpus-per-gpu",
    "cpus-per-task",
    "deadline",
    "delay-boot",
    "dependency",
    "distribution",
    "epilog",
    "error",
    "exclude",
    "export",
    "extra",
    "extra-node-info",
    "gid",
    "gpu-bind",
    "gpu-freq",
    "gpus",
    "gpus-per-node",
    "gpus-per-socket",
    "gpus-per-task",
    "gres",
    "gres-flags",
    "het-group",
    "hint",
    "input",
    "job-name",
    "jobid",
    "licenses",
    "mail-type",
    "mail-user",
    "mcs-label",
    "mem",
    "mem-bind",
    "mem-per-cpu",
    "mem-per-gpu",
    "mincpus",
    "mpi",
    "network",
    "nodefile",
    "nodelist",
    "nodes",
    "ntasks",
    "ntasks-per-core",
    "ntasks-per-gpu",
    "ntasks-per-node",
    "ntasks-per-socket",
    "open-mode",
    "output",
    "partition",
    "power",
    "prefer",
    "priority",
    "profile",
    "prolog",
    "qos",
    "relative",
    "reservation",
    "segment",
    "signal",
    "slurmd-debug",
    "sockets-per-node",
    "switches",
    "task-epilog",
    "task-prolog",
    "thread-spec",
    "threads",
    "threads-per-core",
    "time",
    "time-min",
    "tmp",
    "tres-bind",
    "tres-per-task",
    "uid",
    "wait",
    "wckey",
];

/// srun's short options that take a value (`-c 4`, `-c4`): -A account, -b begin,
/// -B extra-node-info, -c cpus-per-task, -C constraint, -d dependency, -D chdir,
/// -e error, -F nodefile, -G gpus, -i input, -J job-name, -L licenses, -m distribution,
/// -M clusters, -n ntasks, -N nodes, -o output, -p partition, -q qos, -r relative,
/// -S core-spec, -t time, -T threads, -w nodelist, -W wait, -x exclude.
pub const SRUN_SHORT_WITH_VALUE: &str = "AbBcCdDeFGiJLmMnNopqrStTwWx";
/// srun's short options with an optional value, which only comes attached (`-I30`):
/// -I immediate, -K kill-on-bad-exit, -k no-kill.
const SRUN_SHORT_OPTIONAL: &str = "IKk";

/// One option on srun's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrunOpt {
    /// The long name, or the short letter.
    pub name: String,
    /// Its value, when it has one.
    pub value: Option<String>,
    /// The option alone (`-c`, `--mpi`), for messages.
    pub flag: String,
    /// The option as written, value included (`-c 4`, `--mpi=pmi2`), for messages.
    pub shown: String,
}

/// Splits srun's command line (`srun [OPTIONS] CMD [ARGS...]`) into its options and the
/// index of the command's first word: options that take a value take the next word
/// unless given as `--name=value` or `-xVALUE`; short flags may be clustered (`-lN2`);
/// `--` or the first word that is not an option ends the options.
pub fn srun_options(args: &[String]) -> Result<(Vec<SrunOpt>, usize), String> {
    let mut opts = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" {
            return Ok((opts, i + 1));
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        if let Some(body) = a.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (body, None),
            };
            let (value, shown) = match inline {
                Some(v) => (Some(v.to_string()), a.to_string()),
                None if SRUN_LONG_WITH_VALUE.contains(&name) => {
                    i += 1;
                    let v = args
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("option {a} needs a value"))?;
                    let shown = format!("{a} {v}");
                    (Some(v), shown)
                }
                None => (None, a.to_string()),
            };
            opts.push(SrunOpt {
                name: name.to_string(),
                value,
                flag: format!("--{name}"),
                shown,
            });
        } else {
            let body = &a[1..];
            for (pos, c) in body.char_indices() {
                let rest = &body[pos + c.len_utf8()..];
                let flag = format!("-{c}");
                if SRUN_SHORT_WITH_VALUE.contains(c) {
                    let (value, shown) = if rest.is_empty() {
                        i += 1;
                        let v = args
                            .get(i)
                            .cloned()
                            .ok_or_else(|| format!("option {flag} needs a value"))?;
                        let shown = format!("{flag} {v}");
                        (v, shown)
                    } else {
                        (
                            rest.trim_start_matches('=').to_string(),
                            format!("{flag}{rest}"),
                        )
                    };
                    opts.push(SrunOpt {
                        name: c.to_string(),
                        value: Some(value),
                        flag,
                        shown,
                    });
                    break;
                }
                let optional = SRUN_SHORT_OPTIONAL.contains(c) && !rest.is_empty();
                opts.push(SrunOpt {
                    name: c.to_string(),
                    value: optional.then(|| rest.trim_start_matches('=').to_string()),
                    shown: if optional {
                        format!("{flag}{rest}")
                    } else {
                        flag.clone()
                    },
                    flag,
                });
                if optional {
                    break;
                }
            }
        }
        i += 1;
    }
    Ok((opts, i))
}

/// The `--jobid` on srun's command line, if any (not in the command's own arguments).
pub fn srun_jobid(args: &[String]) -> Option<String> {
    let (opts, _) = srun_options(args).ok()?;
    opts.into_iter()
        .filter(|o| o.name == "jobid")
        .filter_map(|o| o.value)
        .next_back()
}

/// srun's command line without its `--pty` option, when it has one (among srun's own
/// options, not the command's arguments).
pub fn srun_without_pty(args: &[String]) -> Option<Vec<String>> {
    let (_, start) = srun_options(args).ok()?;
    let start = start.min(args.len());
    let (own, command) = args.split_at(start);
    if !own.iter().any(|a| a == "--pty") {
        return None;
    }
    Some(
        own.iter()
            .filter(|a| *a != "--pty")
            .chain(command)
            .cloned()
            .collect(),
    )
}

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
    let (opts, start) = srun_options(args)?;
    let (mut mpi, mut distribution, mut gpus_per_task, mut cpu_bind) = (None, None, None, None);
    for o in opts {
        let v = o.value.clone().unwrap_or_default();
        match o.name.as_str() {
            "n" | "ntasks" => st.req.ntasks = Some(num(&o.flag, &v)?),
            "N" | "nodes" => st.req.nodes = Some(num(&o.flag, &v)?),
            "ntasks-per-node" => st.req.tasks_per_node = Some(num(&o.flag, &v)?),
            "jobid" => st.req.alloc = v,
            "mpi" => mpi = Some(v),
            "m" | "distribution" => distribution = Some(v),
            "gpus-per-task" => gpus_per_task = Some(num(&o.flag, &v)?),
            // Slurm's other forms (map_cpu:, mask_cpu:, sockets, ...) are not honoured:
            // said, not an error, so scripts that use them still run.
            "cpu-bind" => match v.parse::<lattice_apis::CpuBind>() {
                Ok(_) => cpu_bind = Some(v),
                Err(e) => st
                    .warnings
                    .push(format!("{}: {e}; the tasks are not bound", o.shown)),
            },
            "D" | "chdir" => st.req.chdir = Some(v),
            "l" | "label" => st.req.label = true,
            // A terminal on the first node (`lattice attach`); srun's `--pty=FD` form
            // (a terminal already open) is not ours to use.
            "pty" if o.value.is_none() => st.pty = true,
            "pty" => {
                return Err(format!(
                    "{}: a pseudo-terminal on an open descriptor is not supported; use --pty",
                    o.shown
                ))
            }
            "export" => {
                // Checked now, applied to this process's environment when the step is made.
                export_env(Some(&v), std::iter::empty())?;
                st.req.export = Some(v);
            }
            _ => st.warnings.push(format!(
                "{}: ignored for a step inside an allocation",
                o.shown
            )),
        }
    }
    st.req.launch = step_launch(
        mpi.as_deref(),
        distribution.as_deref(),
        gpus_per_task,
        cpu_bind.as_deref(),
    )?;
    st.req.command = args[start.min(args.len())..].to_vec();
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
        assert_eq!(st.warnings.len(), 2, "{:?}", st.warnings);
        assert!(st.warnings[0].starts_with("-c 4:"), "{:?}", st.warnings);
        let l = st.req.launch.expect("--mpi=pmi2 is the step's");
        assert_eq!(l.mpi, Some(lattice_apis::MpiKind::Pmi2));
        let st = parse_srun_step(&v(&["-m", "cyclic:block", "--gpus-per-task=2", "a"])).unwrap();
        let l = st.req.launch.unwrap();
        assert_eq!(l.distribution, Some(lattice_apis::Distribution::Cyclic));
        assert_eq!(l.gpus_per_task, Some(2));
        let st = parse_srun_step(&v(&["--cpu-bind=verbose,cores", "a"])).unwrap();
        assert_eq!(
            st.req.launch.unwrap().cpu_bind,
            Some(lattice_apis::CpuBind::Cores)
        );
        let st = parse_srun_step(&v(&["--cpu-bind=map_cpu:0,1", "a"])).unwrap();
        assert!(st.req.launch.is_none());
        assert!(
            st.warnings[0].contains("unsupported CPU binding"),
            "{:?}",
            st.warnings
        );
        assert!(parse_srun_step(&v(&["--mpi=openmpi", "a"]))
            .unwrap_err()
            .contains("--mpi: unknown MPI type"));
        let st = parse_srun_step(&v(&["--pty", "-l", "bash", "--pty"])).unwrap();
        assert!(st.pty);
        assert_eq!(st.req.command, v(&["bash", "--pty"]));
        assert!(parse_srun_step(&v(&["--pty=3", "bash"]))
            .unwrap_err()
            .contains("--pty=3"));
        assert_eq!(
            srun_without_pty(&v(&["-N1", "--pty", "bash", "--pty"])),
            Some(v(&["-N1", "bash", "--pty"]))
        );
        assert_eq!(srun_without_pty(&v(&["-N1", "bash", "--pty"])), None);
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

    #[test]
    fn srun_options_with_a_separate_value_are_not_the_command() {
        let value = |name: &str| match name {
            "export" => "NONE",
            "chdir" | "D" => "/tmp",
            "mpi" => "pmi2",
            "distribution" | "m" => "block",
            "cpu-bind" => "cores",
            _ => "2",
        };
        for name in SRUN_LONG_WITH_VALUE {
            let flag = format!("--{name}");
            let st = parse_srun_step(&v(&[&flag, value(name), "./app", "-x"]))
                .unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert_eq!(st.req.command, v(&["./app", "-x"]), "{flag}");
        }
        for c in SRUN_SHORT_WITH_VALUE.chars() {
            let flag = format!("-{c}");
            let st = parse_srun_step(&v(&[&flag, value(&c.to_string()), "./app"]))
                .unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert_eq!(st.req.command, v(&["./app"]), "{flag}");
            // Attached: `-c4`.
            let st = parse_srun_step(&v(&[&format!("{flag}{}", value(&c.to_string())), "./app"]))
                .unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert_eq!(st.req.command, v(&["./app"]), "{flag}");
        }
        let st = parse_srun_step(&v(&["--cpus-per-task", "4", "./app"])).unwrap();
        assert_eq!(st.req.command, v(&["./app"]));
        assert_eq!(
            st.warnings,
            v(&["--cpus-per-task 4: ignored for a step inside an allocation"])
        );
        // Optional values come only after `=` (or attached to the short option).
        for opt in [
            "--exclusive",
            "--bcast",
            "--overlap",
            "--exact",
            "--kill-on-bad-exit",
            "--immediate=30",
            "-K",
            "-I30",
            "-k",
            "-E",
            "-u",
        ] {
            let st = parse_srun_step(&v(&[opt, "./app"])).unwrap();
            assert_eq!(st.req.command, v(&["./app"]), "{opt}");
        }
        // Clusters of short options: `-lN2`, `-ln 4`.
        let st = parse_srun_step(&v(&["-lN2", "-ln", "4", "hostname"])).unwrap();
        assert_eq!(
            (st.req.label, st.req.nodes, st.req.ntasks),
            (true, Some(2), Some(4))
        );
        assert_eq!(st.req.command, v(&["hostname"]));
        assert!(st.warnings.is_empty(), "{:?}", st.warnings);
    }

    #[test]
    fn srun_jobid_is_found_among_the_options_only() {
        let jobid = |a: &[&str]| srun_jobid(&v(a));
        assert_eq!(
            jobid(&["-N", "1", "--jobid=42", "cmd"]).as_deref(),
            Some("42")
        );
        assert_eq!(
            jobid(&["--cpus-per-task", "4", "--jobid", "42", "cmd"]).as_deref(),
            Some("42")
        );
        assert_eq!(
            jobid(&["-c4", "--jobid", "42", "cmd"]).as_deref(),
            Some("42")
        );
        assert_eq!(jobid(&["cmd", "--jobid=42"]), None);
        assert_eq!(jobid(&["-N", "1", "--", "cmd", "--jobid=42"]), None);
        assert_eq!(jobid(&["--jobid"]), None);
    }

    #[test]
    fn srun_export_is_kept_for_the_step() {
        let st = parse_srun_step(&v(&["--export=NONE", "true"])).unwrap();
        assert_eq!(st.req.export.as_deref(), Some("NONE"));
        assert!(st.warnings.is_empty(), "{:?}", st.warnings);
        let st = parse_srun_step(&v(&["--export", "ALL,OMP_NUM_THREADS=4", "true"])).unwrap();
        assert_eq!(st.req.export.as_deref(), Some("ALL,OMP_NUM_THREADS=4"));
        assert!(parse_srun_step(&v(&["--export=1X", "true"]))
            .unwrap_err()
            .contains("not a variable name"));
    }

    #[test]
    fn export_follows_slurm() {
        let caller = || {
            [
                ("PATH", "/usr/bin"),
                ("OMP_NUM_THREADS", "2"),
                ("LATTICE_TOKEN", "secret"),
                ("LATTICE_ALLOC_ID", "job"),
                ("SLURM_JOB_ID", "job"),
                ("SLURM_PROCID", "0"),
                ("PWD", "/home/a"),
                ("OLDPWD", "/"),
                ("SHLVL", "2"),
                ("_", "/usr/bin/srun"),
                ("HOSTNAME", "login1"),
                ("HOME", "/home/a"),
                ("USER", "a"),
                ("LOGNAME", "a"),
                ("TERM", "xterm"),
                ("BASH_FUNC_f%%", "() { :; }"),
            ]
            .map(|(k, val)| (k.to_string(), val.to_string()))
        };
        let keys = |spec: Option<&str>| -> Vec<String> {
            export_env(spec, caller()).unwrap().into_keys().collect()
        };
        assert_eq!(keys(None), v(&["OMP_NUM_THREADS", "PATH", "TERM"]));
        assert_eq!(keys(Some("all")), keys(None));
        assert_eq!(keys(Some("NONE")), Vec::<String>::new());
        assert_eq!(keys(Some("NIL")), Vec::<String>::new());
        assert_eq!(keys(Some("PATH,UNSET")), v(&["PATH"]));
        // Named explicitly, a variable left out by default goes.
        assert_eq!(keys(Some("HOME")), v(&["HOME"]));
        let env = export_env(Some("ALL,OMP_NUM_THREADS=8,X=a=b"), caller()).unwrap();
        assert_eq!(env["OMP_NUM_THREADS"], "8");
        assert_eq!(env["X"], "a=b");
        assert_eq!(env.len(), 4);
        let env = export_env(Some("NONE,X=1"), caller()).unwrap();
        assert_eq!(
            env.into_iter().collect::<Vec<_>>(),
            [("X".to_string(), "1".to_string())]
        );
        assert!(export_env(Some("ALL,NONE"), caller()).is_err());
        assert!(export_env(Some(""), caller()).is_err());
        assert!(export_env(Some("A-B"), caller()).is_err());
    }
}
