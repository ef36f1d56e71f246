//! One allocation's run on this node, from start to the final report: start it (or
//! re-attach to it after an agent restart), copy its output into the logs, enforce its
//! walltime, stop it when `lifecycle::should_run` says so, and report how it ended.
//!
//! Every run is its own tokio task, so a slow start or a long grace period never
//! delays another allocation.
//!
//! Stopping is SIGTERM to the workload's process group, `--grace-period`, then SIGKILL
//! (for a preemption with `checkpoint.strategy: signal`, the checkpoint signal comes
//! first). The shim kills and reaps whatever is left of the group once the leader has
//! exited, and only then records the exit; the final report is written after that,
//! so a terminal report always means no process of the run is left.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_apis::lifecycle::{node_reason, preempt_requested, should_run, RunDecision};
use lattice_apis::{Allocation, CheckpointStrategy, NodeTaskPhase, NodeTaskState, Time};
use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::agent::{Ctx, SettleGuard};
use crate::binding::{self, Check};
use crate::cgroup::Cgroups;
use crate::env::{self, EnvInputs};
use crate::files::Dir;
use crate::logs::spool::{Frame, SpoolReader};
use crate::logs::{LogHub, LogKey, Stream};
use crate::pmi::exchange::{StepPeers, TreeExchange};
use crate::pmi::{Exchange, LocalExchange, PmiEvent, PmiServer, StepInfo};
use crate::policy::Refusal;
use crate::runtime::{LaunchSpec, RunAs};
use crate::shim::{ExitRecord, STDERR_SPOOL, STDOUT_SPOOL};
use crate::state::{TaskKey, TaskRecord};
use lattice_apis::MpiKind;

/// File name of an inline script in the run directory (the agent's, not the user's).
pub const SCRIPT_FILE: &str = "lattice-script";
/// How often a run is looked at (exit, output, walltime, escalation).
const TICK: Duration = Duration::from_millis(100);

/// What the supervisor knows of its allocation (from the dispatcher's watch).
#[derive(Debug, Clone)]
pub enum AllocView {
    /// Not seen yet (a re-attached run before the first list).
    Unknown,
    /// The latest version.
    Present(Arc<Allocation>),
    /// Deleted, or no longer bound to this node.
    Gone,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Exit {
    /// The shim recorded it.
    Recorded(ExitRecord),
    /// The shim died without recording it.
    ShimDied(String),
    /// Gone while the agent was down, without a record.
    Lost,
    /// Never started: the agent refused it (reason and message).
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopPhase {
    Running,
    /// Checkpoint signal sent; SIGTERM at the instant.
    Checkpoint(Instant),
    /// SIGTERM sent; SIGKILL at the instant.
    Term(Instant),
    Killed,
}

/// The final report for a run. `oom`: the kernel's OOM killer ended a process of it,
/// at this memory limit.
pub fn final_report(
    exit: &Exit,
    stop_reason: Option<&str>,
    oom: Option<&str>,
    attempt: u32,
    pid: Option<u32>,
    start_time: Option<Time>,
    now: Time,
) -> NodeTaskState {
    let mut r = NodeTaskState {
        phase: NodeTaskPhase::Failed,
        attempt,
        pid,
        start_time: start_time.map(api_time),
        end_time: Some(api_time(now)),
        ..Default::default()
    };
    match exit {
        Exit::Recorded(x) => {
            r.end_time = Some(api_time(x.end_time));
            if let Some(e) = &x.start_error {
                r.reason = Some(node_reason::START_FAILED.into());
                r.message = Some(e.clone());
                return r;
            }
            r.exit_code = x.exit_code;
            r.signal = x.signal;
            let how = match (x.exit_code, x.signal) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(s)) => format!("killed by signal {}", signal_name(s)),
                (None, None) => "ended with an unknown status".to_string(),
            };
            if stop_reason == Some(node_reason::BATCH_DONE) {
                // The holder of a batch job's other node, stopped because the script
                // ended on the first node: this node's part succeeded.
                r.phase = NodeTaskPhase::Succeeded;
                r.reason = Some(node_reason::BATCH_DONE.into());
                r.exit_code = Some(0);
                r.signal = None;
                return r;
            }
            if let Some(s) = stop_reason {
                r.reason = Some(s.to_string());
                r.message = Some(format!("stopped by the agent ({s}); {how}"));
                return r;
            }
            if let (Some(limit), false) = (oom, x.exit_code == Some(0)) {
                r.reason = Some(node_reason::OUT_OF_MEMORY.into());
                r.message = Some(format!(
                    "the kernel's OOM killer ended a process at the allocation's memory limit of \
                     {limit} (this node's capacity less --system-reserved); {how}"
                ));
                return r;
            }
            match (x.exit_code, x.signal) {
                (Some(0), _) => {
                    r.phase = NodeTaskPhase::Succeeded;
                    r.reason = Some(node_reason::EXITED.into());
                }
                // The allocation's message already says "exited with code N on <node>".
                (Some(_), _) => r.reason = Some(node_reason::NON_ZERO_EXIT.into()),
                (None, Some(_)) => r.reason = Some(node_reason::SIGNALED.into()),
                (None, None) => {
                    r.reason = Some(node_reason::LOST.into());
                    r.message = Some(how);
                }
            }
        }
        Exit::ShimDied(why) => {
            r.reason = Some(stop_reason.unwrap_or(node_reason::LOST).to_string());
            r.message = Some(format!(
                "the workload's supervisor died ({why}); exit status unknown"
            ));
        }
        Exit::Lost => {
            r.reason = Some(stop_reason.unwrap_or(node_reason::LOST).to_string());
            r.message = Some("process exited while the agent was down; exit status unknown".into());
        }
        Exit::Refused(refusal) => {
            r.reason = Some(refusal.reason.to_string());
            r.message = Some(refusal.message.clone());
            r.start_time = None;
            r.pid = None;
        }
    }
    r
}

/// Whole seconds, the precision the API stores (a sub-second start would otherwise
/// come after an end time the API truncated).
pub fn api_time(t: Time) -> Time {
    use chrono::SubsecRound;
    t.trunc_subsecs(0)
}

fn signal_name(n: i32) -> String {
    Signal::try_from(n)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| n.to_string())
}

/// What a batch job's other nodes run: nothing but waiting, ending 0 when stopped.
const BATCH_HOLDER: &str = "trap 'exit 0' TERM INT HUP; while :; do sleep 3600 & wait $!; done";

/// The program and arguments for `alloc` on `this_node`: the script (written to the
/// run directory, the agent's own, through its descriptor), the entrypoint with its args
/// (exactly, no shell), or a lone entrypoint as a `/bin/sh -c` command line; on a batch
/// job's other nodes, a holder.
pub fn command_line(
    alloc: &Allocation,
    run_dir: &Dir,
    run_as: Option<&RunAs>,
    this_node: Option<&str>,
) -> Result<(String, Vec<String>), String> {
    let spec = &alloc.spec;
    if let Some(node) = this_node {
        if lattice_apis::lifecycle::batch_secondary(alloc, node) {
            // Slurm batch semantics: the script runs on the first node; this one holds
            // the allocation (steps run here) until the agent stops it.
            return Ok(("/bin/sh".into(), vec!["-c".into(), BATCH_HOLDER.into()]));
        }
    }
    if let Some(script) = &spec.script {
        let path = run_dir.join(SCRIPT_FILE);
        // The user's to read and run (their own script), no one else's.
        run_dir
            .write_new(
                SCRIPT_FILE,
                script.as_bytes(),
                0o700,
                run_as.map(|u| (u.uid, u.gid)),
            )
            .map_err(|e| format!("cannot write the script to {}: {e}", path.display()))?;
        let p = path.display().to_string();
        return Ok(if script.starts_with("#!") {
            (p, Vec::new())
        } else {
            ("/bin/sh".into(), vec![p])
        });
    }
    match &spec.entrypoint {
        Some(e) if !spec.args.is_empty() => Ok((e.clone(), spec.args.clone())),
        Some(e) => Ok(("/bin/sh".into(), vec!["-c".into(), e.clone()])),
        None => Err("the allocation has neither spec.entrypoint nor spec.script".into()),
    }
}

/// The environment of `alloc`'s run `rec` (also that of `lattice attach` sessions in it).
pub fn workload_env(
    ctx: &Ctx,
    alloc: &Allocation,
    rec: &TaskRecord,
    user: Option<&RunAs>,
) -> std::collections::BTreeMap<String, String> {
    let mut base = env::base_from_agent();
    if let Some(u) = user {
        base.insert("HOME".into(), u.home.display().to_string());
        base.insert("USER".into(), u.name.clone());
    }
    let mut vars = env::build(&EnvInputs {
        alloc,
        node: &ctx.cfg.node,
        attempt: rec.attempt,
        scratch: &rec.scratch_dir,
        // --slurm-env; `env::build` also honours the allocation's
        // `lattice.dev/set-slurm-env: "true"` (compat.set_slurm_env at submit).
        slurm: ctx.cfg.slurm_env,
        base,
    });
    crate::uenv::apply(&rec.uenv_env, &mut vars);
    crate::credentials::add_env(&ctx.cfg, &rec.run_dir, &mut vars);
    crate::tasks::training_env(alloc, &ctx.cfg.node, &mut vars);
    vars
}

/// The working directory of `alloc`'s run `rec`: `spec.workingDir` or its scratch directory.
pub fn workload_cwd(alloc: &Allocation, rec: &TaskRecord) -> std::path::PathBuf {
    alloc
        .spec
        .working_dir
        .as_ref()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| rec.scratch_dir.clone())
}

/// `program` as given when it has a `/`, else the first executable of that name on the
/// agent's fixed `PATH`.
pub(crate) fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return runnable(program).then(|| program.to_path_buf());
    }
    crate::runtime::SHIM_PATH
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| runnable(p))
}

/// Whether this node may start `alloc`, and as whom.
enum Admission {
    /// Start it, as this user (`None`: the agent's own).
    Run(Option<RunAs>),
    /// The allocation no longer wants this node for this attempt.
    Stale,
    /// Report this instead of running anything.
    Refuse(Refusal),
}

/// The checks before anything of a run exists: the scheduler bound it here
/// ([`binding`]), and the account it runs as is allowed ([`crate::policy`]).
async fn admit(ctx: &Ctx, alloc: &Allocation) -> Admission {
    match binding::verify(ctx, alloc).await {
        Check::Bound => {}
        Check::Stale => return Admission::Stale,
        Check::NotBound(message) => {
            return Admission::Refuse(Refusal {
                reason: node_reason::NOT_BOUND,
                message,
            })
        }
        Check::Unknown(message) => {
            return Admission::Refuse(Refusal {
                reason: node_reason::START_FAILED,
                message,
            })
        }
    }
    match crate::policy::resolve(ctx, alloc).await {
        Ok(user) => Admission::Run(user),
        Err(r) => Admission::Refuse(r),
    }
}

/// Start a new run of `alloc` and supervise it to the end.
pub async fn run_new(ctx: Arc<Ctx>, alloc: Arc<Allocation>, rx: watch::Receiver<AllocView>) {
    let Some(st) = alloc.status.as_ref() else {
        return;
    };
    let uid = alloc.metadata.uid.clone().unwrap_or_default();
    let key = TaskKey::new(&uid, st.attempt);
    let (namespace, name) = (alloc.metadata.namespace_str(), alloc.metadata.name_str());
    let user = match admit(&ctx, &alloc).await {
        Admission::Run(user) => user,
        Admission::Stale => {
            tracing::info!(allocation = %format!("{namespace}/{name}"), attempt = st.attempt, "not starting: the allocation no longer wants this node");
            return;
        }
        Admission::Refuse(refusal) => {
            ctx.metrics.workloads_start_failed.inc();
            ctx.metrics
                .workloads_refused
                .get_or_create(&vec![("reason".into(), refusal.reason.into())])
                .inc();
            tracing::warn!(allocation = %format!("{namespace}/{name}"), attempt = st.attempt, reason = refusal.reason, message = %refusal.message, "refused");
            let report = final_report(
                &Exit::Refused(refusal),
                None,
                None,
                st.attempt,
                None,
                None,
                lattice_apis::meta::now(),
            );
            if let Err(e) = ctx
                .state
                .update(|s| s.push_report(namespace, name, &uid, report))
            {
                tracing::error!(error = %e, "cannot persist a refusal");
            }
            ctx.reporter.wake();
            return;
        }
    };
    let log_key = LogKey {
        namespace: namespace.to_string(),
        name: name.to_string(),
        attempt: st.attempt,
    };
    let rec = TaskRecord {
        uid,
        name: log_key.name.clone(),
        namespace: log_key.namespace.clone(),
        attempt: st.attempt,
        scratch_dir: ctx.cfg.scratch_root().join(key.to_string()),
        run_dir: ctx.cfg.run_root().join(key.to_string()),
        log_dir: ctx.logs.dir(&log_key),
        ..Default::default()
    };
    // Remember the run before anything exists on disk, so a crash at any point leaves
    // something a restarted agent can find and clean up.
    if let Err(e) = ctx
        .state
        .update(|s| s.tasks.insert(key.to_string(), rec.clone()))
    {
        tracing::error!(error = %e, "cannot persist a new run; starting it anyway");
    }
    let mut sup = Supervisor::new(ctx.clone(), key, rec, log_key, rx);
    sup.latest = Some(alloc.clone());
    match sup.launch(&alloc, user).await {
        Ok(()) => {
            ctx.metrics.workloads_started.inc();
            sup.supervise().await;
        }
        Err(why) => {
            ctx.metrics.workloads_start_failed.inc();
            tracing::warn!(allocation = %sup.rec.name, error = %why, "cannot start workload");
            let exit = Exit::Recorded(ExitRecord {
                exit_code: None,
                signal: None,
                start_error: Some(why),
                end_time: lattice_apis::meta::now(),
            });
            sup.finish(exit).await;
        }
    }
}

/// Re-attach to a run recorded in the state file and supervise it to the end.
pub async fn run_reattached(
    ctx: Arc<Ctx>,
    mut rec: TaskRecord,
    rx: watch::Receiver<AllocView>,
    settle: SettleGuard,
) {
    let key = TaskKey::new(&rec.uid, rec.attempt);
    if rec.pid.is_none() {
        // The agent died while starting it: the shim may have got further.
        if let Some(p) = ctx.runtime.pid_record(&rec.run_dir) {
            rec.shim_pid = Some(p.shim_pid);
            rec.pid = Some(p.pid);
            rec.start_time = Some(p.start_time);
            let r = rec.clone();
            if let Err(e) = ctx.state.update(|s| s.tasks.insert(key.to_string(), r)) {
                tracing::warn!(error = %e, "cannot persist a re-attached run");
            }
        }
    }
    let log_key = LogKey {
        namespace: rec.namespace.clone(),
        name: rec.name.clone(),
        attempt: rec.attempt,
    };
    let mut sup = Supervisor::new(ctx.clone(), key, rec, log_key, rx);
    sup.settle = Some(settle);
    sup.open_logs();
    if sup.rec.pid.is_none() && ctx.runtime.exit_record(&sup.rec.run_dir).is_none() {
        tracing::warn!(allocation = %sup.rec.name, "the agent stopped while starting this run; reporting it lost");
        sup.finish(Exit::Lost).await;
        return;
    }
    if let Some(reason) = sup.rec.stop_reason.clone() {
        // It was being stopped when the agent went down: carry on from SIGTERM.
        sup.signal(Signal::SIGTERM);
        sup.stop = StopPhase::Term(Instant::now() + ctx.cfg.grace_period);
        tracing::info!(allocation = %sup.rec.name, reason, "resuming the stop of a re-attached run");
    }
    tracing::info!(allocation = %format!("{}/{}", sup.rec.namespace, sup.rec.name), attempt = sup.rec.attempt, pid = sup.rec.pid, "re-attached");
    sup.supervise().await;
}

struct Supervisor {
    ctx: Arc<Ctx>,
    key: TaskKey,
    rec: TaskRecord,
    log_key: LogKey,
    rx: watch::Receiver<AllocView>,
    child: Option<tokio::process::Child>,
    hub: Option<Arc<LogHub>>,
    spools: Vec<(Stream, SpoolReader)>,
    stop: StopPhase,
    latest: Option<Arc<Allocation>>,
    /// A re-attached run keeps the node from registering Ready until it is confirmed
    /// as still this node's, or has stopped (dropped with the supervisor).
    settle: Option<SettleGuard>,
    /// An MPI step's PMI server on this node (stops when dropped).
    pmi: Option<PmiRun>,
    /// Why the run could not start, when it is not the generic `StartFailed`.
    start_reason: Option<&'static str>,
}

/// A running PMI server and what it reports.
struct PmiRun {
    _server: PmiKeeper,
    _exchange: Arc<dyn Exchange>,
    events: tokio::sync::mpsc::UnboundedReceiver<PmiEvent>,
}

/// What keeps a step's PMI service running: the agent's PMI-2 server or a PMIx sidecar.
#[allow(dead_code)]
enum PmiKeeper {
    Pmi2(PmiServer),
    Pmix(crate::pmix::host::Sidecar),
}

/// How long the ranks of an aborted MPI step get between SIGTERM and SIGKILL (at most
/// the agent's grace period): the job is already lost.
const MPI_ABORT_GRACE: Duration = Duration::from_secs(2);

impl Supervisor {
    fn new(
        ctx: Arc<Ctx>,
        key: TaskKey,
        rec: TaskRecord,
        log_key: LogKey,
        rx: watch::Receiver<AllocView>,
    ) -> Self {
        Self {
            ctx,
            key,
            rec,
            log_key,
            rx,
            child: None,
            hub: None,
            spools: Vec::new(),
            stop: StopPhase::Running,
            latest: None,
            settle: None,
            pmi: None,
            start_reason: None,
        }
    }

    fn name(&self) -> String {
        format!("{}/{}", self.rec.namespace, self.rec.name)
    }

    /// Open (or resume) the run's logs and spool readers.
    fn open_logs(&mut self) {
        match self.ctx.logs.open_hub(&self.log_key, &self.rec.uid) {
            Ok(hub) => {
                let (out, err) = hub.spool_offsets();
                self.spools = vec![
                    (
                        Stream::Stdout,
                        SpoolReader::new(self.rec.run_dir.join(STDOUT_SPOOL), out),
                    ),
                    (
                        Stream::Stderr,
                        SpoolReader::new(self.rec.run_dir.join(STDERR_SPOOL), err),
                    ),
                ];
                self.hub = Some(hub);
            }
            Err(e) => {
                tracing::warn!(allocation = %self.name(), error = %e, "cannot open the log store; output is not captured")
            }
        }
    }

    fn persist(&self) {
        let r = self.rec.clone();
        let k = self.key.to_string();
        if let Err(e) = self.ctx.state.update(|s| {
            s.tasks.insert(k, r);
        }) {
            tracing::warn!(allocation = %self.name(), error = %e, "cannot persist run state");
        }
    }

    /// Prepare the scratch and run directories, cgroups, logs and command, and start
    /// the workload as `user`.
    async fn launch(&mut self, alloc: &Allocation, user: Option<RunAs>) -> Result<(), String> {
        let ctx = self.ctx.clone();
        let name = self.key.to_string();
        let in_dir = |root: &Path, mode: u32| {
            Dir::open(root)
                .and_then(|d| d.fresh_dir(&name, mode))
                .map_err(|e| format!("cannot create {}: {e}", root.join(&name).display()))
        };
        // The user's scratch directory: made by the agent in its own parent, handed
        // over through the descriptor.
        let scratch = in_dir(&ctx.cfg.scratch_root(), 0o700)?;
        if let Some(u) = &user {
            scratch
                .give(u.uid, u.gid, 0o700)
                .map_err(|e| format!("cannot give the scratch directory to {}: {e}", u.name))?;
        }
        // The agent's own run directory: the user may enter it (the script, the job's
        // credentials) but write nothing there.
        let run_dir = in_dir(&ctx.cfg.run_root(), 0o711)?;
        self.rec.cgroups = ctx.cgroups.create(&self.key)?;
        self.open_logs();
        self.persist();
        let (program, args) = command_line(alloc, &run_dir, user.as_ref(), Some(&ctx.cfg.node))?;
        crate::credentials::prepare(&ctx, alloc, &run_dir, user.as_ref()).await;
        let squashfs = match self.resolve_uenv(alloc).await {
            Ok(m) => m,
            Err(e) => {
                // What would fail the same way anywhere is not requeued.
                if e.permanent {
                    self.start_reason = Some(node_reason::ENVIRONMENT_UNAVAILABLE);
                }
                return Err(e.message);
            }
        };
        let container = match self.resolve_image(alloc, &squashfs).await {
            Ok(c) => c,
            Err(e) => {
                if e.permanent {
                    self.start_reason = Some(node_reason::ENVIRONMENT_UNAVAILABLE);
                }
                return Err(e.message);
            }
        };
        let vars = workload_env(&ctx, alloc, &self.rec, user.as_ref());
        let (tasks, fds) = match crate::tasks::for_step(alloc, &ctx.cfg.node) {
            None => (Vec::new(), Vec::new()),
            Some(t) => {
                let (pmi, pmix) = match t.mpi {
                    None | Some(MpiKind::None) => (false, false),
                    Some(MpiKind::Pmi2) => (true, false),
                    Some(MpiKind::Pmix) => (false, true),
                };
                if pmix && !cfg!(feature = "pmix") {
                    // Every agent of this build would refuse it: not requeued.
                    self.start_reason = Some(node_reason::ENVIRONMENT_UNAVAILABLE);
                    return Err(format!(
                        "spec.launch.mpi is pmix, but the agent of node {} was built without PMIx (cargo feature pmix); use pmi2, or OpenMPI's own mpirun",
                        ctx.cfg.node
                    ));
                }
                let slurm = vars.contains_key("SLURM_JOB_ID");
                let cpus = crate::tasks::usable_cpus();
                let mut plans = crate::tasks::plans(&t, alloc, slurm, &ctx.gpus, &cpus, pmi)?;
                let fds = if pmi {
                    self.start_pmi(alloc, &t)?
                } else {
                    Vec::new()
                };
                if pmix {
                    let envs = self.start_pmix(alloc, &t, user.as_ref()).await?;
                    // OpenMPI 4 takes a direct launch for one only where it sees Slurm's
                    // step variables (its `schizo` detection); without them each rank
                    // starts as a singleton.
                    let (job, step) = t.jobid.rsplit_once('.').unwrap_or((&t.jobid, "0"));
                    let slurm_vars = [
                        ("SLURM_JOBID", job.to_string()),
                        ("SLURM_STEP_ID", step.to_string()),
                        ("SLURM_NODELIST", t.nodes.join(",")),
                    ];
                    for (plan, env) in plans.iter_mut().zip(envs) {
                        plan.env.extend(env);
                        for (k, v) in &slurm_vars {
                            if !vars.contains_key(*k) {
                                plan.env.push((k.to_string(), v.clone()));
                            }
                        }
                    }
                }
                (plans, fds)
            }
        };
        let cwd = workload_cwd(alloc, &self.rec);
        let spec = LaunchSpec {
            program,
            args,
            env: vars,
            cwd,
            run_as: user,
            run_dir: self.rec.run_dir.clone(),
            cgroups: self.rec.cgroups.clone(),
            tasks,
            fds,
            squashfs,
            container,
        };
        let launched = ctx.runtime.launch(&spec).await;
        // The tasks' ends of their PMI sockets are the shim's now.
        drop(spec);
        let launched = launched?;
        self.child = launched.child;
        self.rec.shim_pid = Some(launched.shim_pid);
        self.rec.pid = Some(launched.pid);
        self.rec.start_time = Some(launched.start_time);
        self.rec.walltime_deadline = walltime_deadline(alloc, launched.start_time);
        let running = NodeTaskState {
            phase: NodeTaskPhase::Running,
            attempt: self.rec.attempt,
            pid: Some(launched.pid),
            start_time: Some(api_time(launched.start_time)),
            ..Default::default()
        };
        let (k, r) = (self.key.to_string(), self.rec.clone());
        let persisted = ctx.state.update(|s| {
            s.tasks.insert(k, r.clone());
            s.push_report(&r.namespace, &r.name, &r.uid, running);
        });
        if let Err(e) = persisted {
            tracing::error!(allocation = %self.name(), error = %e, "cannot persist the started run");
        }
        ctx.reporter.wake();
        tracing::info!(allocation = %self.name(), attempt = self.rec.attempt, pid = launched.pid, "started");
        Ok(())
    }

    /// The uenv images `alloc` asks for (`environment.uenv`, `toolsUenv`), fetched and
    /// verified into the node's cache; records the view's variables in the run.
    async fn resolve_uenv(
        &mut self,
        alloc: &Allocation,
    ) -> Result<Vec<crate::uenv::Mount>, crate::uenv::EnvError> {
        use crate::uenv::EnvError;
        let Some(env) = &alloc.spec.environment else {
            return Ok(Vec::new());
        };
        let wanted: Vec<&str> = [env.uenv.as_deref(), env.tools_uenv.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let wanted = wanted.join(",");
        let Some(repo) = &self.ctx.cfg.uenv_repo else {
            return Err(EnvError {
                message: format!(
                    "the allocation asks for uenv {wanted}, but node {} has no uenv repository (lattice-agent --uenv-repo)",
                    self.ctx.cfg.node
                ),
                permanent: true,
            });
        };
        let repo = crate::uenv::Repo::from_flag(repo).map_err(|message| EnvError {
            message,
            permanent: true,
        })?;
        let cache = self.ctx.cfg.state_dir.join("uenv");
        crate::files::Dir::open(&self.ctx.cfg.state_dir)
            .and_then(|d| d.ensure_dir("uenv", 0o700))
            .map_err(|e| EnvError {
                message: format!("cannot create {}: {e}", cache.display()),
                permanent: false,
            })?;
        let r = crate::uenv::resolve(
            &repo,
            &cache,
            &self.ctx.cfg.uenv_mount_points,
            &wanted,
            env.view.as_deref(),
        )
        .await?;
        self.rec.uenv_mounted = !r.mounts.is_empty();
        self.rec.uenv_env = r.env;
        self.persist();
        Ok(r.mounts)
    }

    /// The container `alloc`'s tasks run in (`environment.image`): the image pulled into
    /// the node's cache, and what is bound into it.
    async fn resolve_image(
        &mut self,
        alloc: &Allocation,
        squashfs: &[crate::uenv::Mount],
    ) -> Result<Option<crate::oci::bundle::ContainerPlan>, crate::uenv::EnvError> {
        use crate::oci::bundle::{Bind, ContainerPlan};
        use crate::uenv::EnvError;
        let Some(image) = alloc
            .spec
            .environment
            .as_ref()
            .and_then(|e| e.image.as_deref())
        else {
            return Ok(None);
        };
        let node = &self.ctx.cfg.node;
        if !nix::unistd::geteuid().is_root() {
            return Err(EnvError::passing(format!(
                "the allocation runs in image {image}, but the agent of node {node} does not run as root and cannot start containers"
            )));
        }
        let runtime = find_program(&self.ctx.cfg.oci_runtime).ok_or_else(|| {
            EnvError::passing(format!(
                "the allocation runs in image {image}, but node {node} has no OCI runtime {} (install crun or set lattice-agent --oci-runtime)",
                self.ctx.cfg.oci_runtime.display()
            ))
        })?;
        let cache = self.ctx.cfg.state_dir.join("oci");
        let pulled = crate::oci::resolve(&cache, image).await?;
        self.rec.image_digest = Some(pulled.digest.clone());
        self.persist();
        let mut binds = vec![
            Bind {
                path: self.rec.run_dir.clone(),
                readonly: true,
            },
            Bind {
                path: self.rec.scratch_dir.clone(),
                readonly: false,
            },
        ];
        if self.rec.cgroups.is_empty() {
            // The runtime puts the workload in a session of its own: only the run's
            // cgroups reach every process of it at the end.
            return Err(EnvError::passing(format!(
                "the allocation runs in image {image}, but the agent of node {node} runs without cgroups (--no-cgroups), which containers need"
            )));
        }
        // The working directory is not bound in: it is a path in the container (under
        // the scratch directory, a site bind, or the image), entered as the user.
        let mut extra: Vec<PathBuf> = self.ctx.cfg.oci_binds.clone();
        extra.extend(squashfs.iter().map(|m| m.target.clone()));
        for p in extra {
            if !p.is_absolute() || !p.exists() {
                continue;
            }
            if binds.iter().all(|b| b.path != p) {
                binds.push(Bind {
                    path: p,
                    readonly: false,
                });
            }
        }
        for m in squashfs {
            if let Some(b) = binds.iter_mut().find(|b| b.path == m.target) {
                b.readonly = true;
            }
        }
        let gpus: Vec<PathBuf> = crate::cgroup::devices::discover(&self.ctx.cfg.device_dir)
            .into_iter()
            .filter(|g| self.ctx.cfg.gpu_devices.contains(g.index))
            .map(|g| g.path)
            .collect();
        Ok(Some(ContainerPlan {
            runtime,
            rootfs: pulled.rootfs,
            image_env: pulled.env,
            binds,
            devices: crate::oci::bundle::gpu_devices(&self.ctx.cfg.device_dir, &gpus),
            safe_cwd: Some(self.rec.scratch_dir.clone()),
        }))
    }

    /// Start the PMI server of MPI step `alloc` for this node's tasks `t`; returns the
    /// tasks' ends of their sockets.
    fn start_pmi(
        &mut self,
        alloc: &Allocation,
        t: &crate::tasks::NodeTasks,
    ) -> Result<Vec<std::os::fd::OwnedFd>, String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let exchange = self.exchange_for(alloc, t, &tx)?;
        let info = StepInfo {
            jobid: t.jobid.clone(),
            size: t.size,
            mapping: t.mapping.clone(),
            local_ranks: t.ranks.clone(),
            node: self.ctx.cfg.node.clone(),
        };
        let (server, fds) = PmiServer::start(info, exchange.clone(), tx)
            .map_err(|e| format!("cannot start the step's PMI server: {e}"))?;
        tracing::info!(allocation = %self.name(), ranks = ?t.ranks, size = t.size, nodes = t.nodes.len(), "PMI server started");
        self.pmi = Some(PmiRun {
            _server: PmiKeeper::Pmi2(server),
            _exchange: exchange,
            events: rx,
        });
        Ok(fds)
    }

    /// Start the PMIx sidecar of MPI step `alloc` for this node's tasks `t` (as `user`,
    /// in the run's cgroups); the environment of each local rank.
    async fn start_pmix(
        &mut self,
        alloc: &Allocation,
        t: &crate::tasks::NodeTasks,
        user: Option<&RunAs>,
    ) -> Result<Vec<Vec<(String, String)>>, String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let exchange = self.exchange_for(alloc, t, &tx)?;
        let (uid, gid) = user.map_or_else(
            || {
                (
                    nix::unistd::getuid().as_raw(),
                    nix::unistd::getgid().as_raw(),
                )
            },
            |u| (u.uid, u.gid),
        );
        // The server's rendezvous directory: the user's, in the run directory.
        let tmpdir = crate::files::Dir::open(&self.rec.run_dir)
            .and_then(|d| d.fresh_dir("pmix", 0o700))
            .and_then(|d| {
                d.give(uid, gid, 0o700)?;
                Ok(d)
            })
            .map_err(|e| format!("cannot make the PMIx server's directory: {e}"))?;
        let job = crate::pmix::Job {
            nspace: t.jobid.clone(),
            nodes: t.nodes.clone(),
            node_index: t.node_index as u32,
            ranks: t.layout.clone(),
            uid,
            gid,
            tmpdir: tmpdir.path().display().to_string(),
        };
        let placement = crate::pmix::host::Placement {
            user: user.map(|u| {
                let groups = if u.groups.is_empty() {
                    vec![u.gid]
                } else {
                    u.groups.clone()
                };
                (u.uid, u.gid, groups)
            }),
            cgroups: &self.rec.cgroups,
        };
        let (sidecar, envs) = crate::pmix::host::start(
            &job,
            placement,
            exchange.clone(),
            tx,
            self.ctx.cfg.node.clone(),
        )
        .await?;
        tracing::info!(allocation = %self.name(), ranks = ?t.ranks, size = t.size, nodes = t.nodes.len(), "PMIx sidecar started");
        self.pmi = Some(PmiRun {
            _server: PmiKeeper::Pmix(sidecar),
            _exchange: exchange,
            events: rx,
        });
        Ok(envs)
    }

    /// The fence exchange of MPI step `alloc` for this node's tasks `t`.
    fn exchange_for(
        &self,
        alloc: &Allocation,
        t: &crate::tasks::NodeTasks,
        tx: &tokio::sync::mpsc::UnboundedSender<PmiEvent>,
    ) -> Result<Arc<dyn Exchange>, String> {
        let ctx = &self.ctx;
        let exchange: Arc<dyn Exchange> = if t.nodes.len() <= 1 {
            Arc::new(LocalExchange)
        } else {
            let addresses = alloc
                .status
                .as_ref()
                .map(|s| s.node_addresses.clone())
                .unwrap_or_default();
            if addresses.len() != t.nodes.len() {
                return Err(format!(
                    "the step's {} nodes have {} agent address(es) recorded (status.nodeAddresses); the PMI fence cannot reach them",
                    t.nodes.len(),
                    addresses.len()
                ));
            }
            Arc::new(TreeExchange::register(
                ctx.pmi.clone(),
                ctx.peers.clone(),
                StepPeers {
                    uid: self.rec.uid.clone(),
                    attempt: self.rec.attempt,
                    nodes: t.nodes.clone(),
                    addresses,
                    index: t.node_index,
                    fan_in: ctx.cfg.pmi_fan_in as usize,
                },
                tx.clone(),
            ))
        };
        Ok(exchange)
    }

    /// An MPI step aborted (here or on another node): stop this node's part of it.
    fn poll_pmi(&mut self) {
        let Some(run) = self.pmi.as_mut() else { return };
        let mut abort = None;
        while let Ok(PmiEvent::Abort(message)) = run.events.try_recv() {
            abort.get_or_insert(message);
        }
        let Some(message) = abort else { return };
        if self.stop != StopPhase::Running {
            return;
        }
        self.ctx.metrics.mpi_aborts.inc();
        self.rec.stop_message = Some(message);
        self.begin_stop(node_reason::MPI_ABORTED);
        if let StopPhase::Term(t) = self.stop {
            let sooner = Instant::now() + MPI_ABORT_GRACE;
            self.stop = StopPhase::Term(t.min(sooner));
        }
    }

    /// Watch the run until it ends (or the agent stops).
    async fn supervise(mut self) {
        self.ctx.metrics.workloads_running.inc();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let exit = loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        self.detach();
                        self.ctx.metrics.workloads_running.dec();
                        return;
                    }
                }
                _ = self.ctx.shutdown.cancelled() => {
                    self.detach();
                    self.ctx.metrics.workloads_running.dec();
                    return;
                }
            }
            self.pump_logs();
            self.decide();
            self.poll_pmi();
            self.escalate();
            if let Some(exit) = self.check_exit() {
                break exit;
            }
        };
        self.ctx.metrics.workloads_running.dec();
        self.finish(exit).await;
    }

    /// The agent is stopping: leave the workload running, store what was read.
    fn detach(&mut self) {
        self.pump_logs();
        if let Some(h) = &self.hub {
            h.flush();
        }
    }

    /// Copy new spool frames into the logs; returns how many.
    fn pump_logs(&mut self) -> usize {
        let Some(hub) = &self.hub else { return 0 };
        let mut per_stream: Vec<Vec<(Stream, Frame, u64)>> = Vec::new();
        for (stream, reader) in &mut self.spools {
            match reader.read() {
                Ok(frames) => per_stream.push(
                    frames
                        .into_iter()
                        .map(|(f, off)| (*stream, f, off))
                        .collect(),
                ),
                Err(e) => {
                    tracing::warn!(allocation = %self.rec.name, error = %e, "cannot read a log spool")
                }
            }
        }
        let merged = merge_by_time(per_stream);
        let n = merged.len();
        hub.push(merged);
        hub.tick();
        n
    }

    /// Level-triggered: stop when the allocation says so or the walltime is over.
    fn decide(&mut self) {
        let view = self.rx.borrow_and_update().clone();
        match view {
            AllocView::Unknown => {}
            AllocView::Gone => self.begin_stop(node_reason::STOPPED),
            AllocView::Present(a) => {
                if let Some(start) = self.rec.start_time {
                    let d = walltime_deadline(&a, start);
                    if d != self.rec.walltime_deadline {
                        self.rec.walltime_deadline = d;
                        self.persist();
                    }
                }
                self.latest = Some(a.clone());
                match should_run(&a, &self.ctx.cfg.node, self.rec.attempt) {
                    RunDecision::Stop(reason) => self.begin_stop(reason),
                    _ if matches!(self.stop, StopPhase::Running) => self.settle = None,
                    _ => {}
                }
            }
        }
        if self
            .rec
            .walltime_deadline
            .is_some_and(|d| lattice_apis::meta::now() >= d)
        {
            self.begin_stop(node_reason::WALLTIME_EXCEEDED);
        }
    }

    fn signal(&self, sig: Signal) {
        let Some(pgid) = self.rec.pid else { return };
        if let Err(e) = self.ctx.runtime.signal_group(pgid, sig) {
            tracing::warn!(allocation = %self.name(), pgid, signal = %sig, error = %e, "cannot signal the process group");
        }
    }

    fn begin_stop(&mut self, reason: &'static str) {
        if self.stop != StopPhase::Running || self.rec.stop_reason.is_some() {
            return;
        }
        self.rec.stop_reason = Some(reason.to_string());
        self.persist();
        let grace = self.ctx.cfg.grace_period;
        let checkpoint = self
            .latest
            .as_ref()
            .filter(|a| reason == node_reason::PREEMPTED && preempt_requested(a))
            .and_then(|a| a.spec.checkpoint.as_ref())
            .filter(|c| c.strategy == CheckpointStrategy::Signal);
        if let Some(c) = checkpoint {
            let sig = c
                .signal
                .as_deref()
                .and_then(crate::runtime::parse_signal)
                .unwrap_or(Signal::SIGUSR1);
            let wait = c
                .timeout
                .as_deref()
                .and_then(|t| lattice_apis::duration::parse_duration(t).ok())
                .map(Duration::from_secs)
                .unwrap_or(grace);
            tracing::info!(allocation = %self.name(), reason, signal = %sig, "checkpoint signal before stopping");
            self.signal(sig);
            self.stop = StopPhase::Checkpoint(Instant::now() + wait);
        } else {
            tracing::info!(allocation = %self.name(), reason, grace_ms = grace.as_millis() as u64, "stopping: SIGTERM");
            self.signal(Signal::SIGTERM);
            self.stop = StopPhase::Term(Instant::now() + grace);
        }
    }

    fn escalate(&mut self) {
        let now = Instant::now();
        match self.stop {
            StopPhase::Checkpoint(t) if now >= t => {
                self.signal(Signal::SIGTERM);
                self.stop = StopPhase::Term(now + self.ctx.cfg.grace_period);
            }
            StopPhase::Term(t) if now >= t => {
                tracing::info!(allocation = %self.name(), "grace period over: SIGKILL");
                self.signal(Signal::SIGKILL);
                self.stop = StopPhase::Killed;
            }
            _ => {}
        }
    }

    fn check_exit(&mut self) -> Option<Exit> {
        let rt = &self.ctx.runtime;
        if let Some(x) = rt.exit_record(&self.rec.run_dir) {
            if let Some(c) = &mut self.child {
                // Reap the shim (it exits right after writing the record).
                let _ = c.try_wait();
            }
            return Some(Exit::Recorded(x));
        }
        if let Some(child) = &mut self.child {
            return match child.try_wait() {
                Ok(Some(status)) => Some(
                    rt.exit_record(&self.rec.run_dir)
                        .map(Exit::Recorded)
                        .unwrap_or_else(|| Exit::ShimDied(status.to_string())),
                ),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(allocation = %self.name(), error = %e, "cannot poll the shim");
                    None
                }
            };
        }
        match self.rec.shim_pid {
            Some(p) if rt.shim_alive(p, &self.rec.run_dir) => None,
            _ => Some(
                rt.exit_record(&self.rec.run_dir)
                    .map(Exit::Recorded)
                    .unwrap_or(Exit::Lost),
            ),
        }
    }

    /// The run is over: make sure nothing is left, store its output, report, clean up.
    async fn finish(mut self, exit: Exit) {
        if !matches!(exit, Exit::Recorded(_)) {
            // Without the shim nobody guaranteed the group is gone.
            self.signal(Signal::SIGKILL);
        }
        while self.pump_logs() > 0 {}
        if let Some(h) = &self.hub {
            h.finish();
        }
        self.ctx.logs.close_hub(&self.log_key);
        // Before the groups go: did the kernel kill anything at the memory limit?
        let oom = (Cgroups::oom_kills(&self.rec.cgroup_dirs()) > 0)
            .then(|| self.ctx.cgroups.memory_limit())
            .flatten();
        if oom.is_some() {
            self.ctx.metrics.workloads_oom_killed.inc();
        }
        // The PMI server goes with the run.
        self.pmi = None;
        let mut report = final_report(
            &exit,
            self.rec.stop_reason.as_deref(),
            oom.as_deref(),
            self.rec.attempt,
            self.rec.pid,
            self.rec.start_time,
            lattice_apis::meta::now(),
        );
        if let Some(r) = self.start_reason {
            report.reason = Some(r.to_string());
        }
        if let Some(why) = &self.rec.stop_message {
            report.message = Some(match &report.message {
                Some(m) => format!("{why}; {m}"),
                None => why.clone(),
            });
        }
        tracing::info!(
            allocation = %self.name(),
            attempt = self.rec.attempt,
            phase = ?report.phase,
            reason = report.reason.as_deref().unwrap_or(""),
            exit_code = report.exit_code,
            signal = report.signal,
            "run ended"
        );
        // The scratch dir and cgroup go before the report (so a finished allocation has
        // none left); the run dir, with the exit record, only once the report is queued
        // (a crash in between still reports the real exit status after a restart).
        let rec = self.rec.clone();
        let cleaned = tokio::task::spawn_blocking(move || cleanup_workspace(&rec)).await;
        if let Err(e) = cleaned {
            tracing::warn!(error = %e, "cleanup task failed");
        }
        let (k, r) = (self.key.to_string(), self.rec.clone());
        if let Err(e) = self.ctx.state.update(|s| {
            s.tasks.remove(&k);
            s.push_report(&r.namespace, &r.name, &r.uid, report);
        }) {
            tracing::error!(allocation = %self.name(), error = %e, "cannot persist the final report");
        }
        self.ctx.reporter.wake();
        let run_dir = self.rec.run_dir.clone();
        let removed =
            tokio::task::spawn_blocking(move || crate::files::remove_tree(&run_dir)).await;
        if let Err(e) = removed {
            tracing::warn!(error = %e, "cleanup task failed");
        }
    }
}

/// Remove a finished run's cgroups and scratch directory (the user's: never through a
/// link in it), and its credentials.
pub fn cleanup_workspace(rec: &TaskRecord) {
    Cgroups::remove(&rec.cgroup_dirs());
    crate::files::remove_tree(&rec.scratch_dir);
    // The job token goes with the run.
    crate::files::remove_tree(&crate::credentials::dir(&rec.run_dir));
}

/// `start + status.walltimeSeconds`, if the allocation has a walltime.
fn walltime_deadline(a: &Allocation, start: Time) -> Option<Time> {
    let secs = a.status.as_ref()?.walltime_seconds?;
    let secs = i64::try_from(secs).ok()?;
    Some(start + chrono::Duration::seconds(secs))
}

/// Merge per-stream frame lists (each in order) by time, keeping each stream's order.
fn merge_by_time(mut lists: Vec<Vec<(Stream, Frame, u64)>>) -> Vec<(Stream, Frame, u64)> {
    lists.retain(|l| !l.is_empty());
    match lists.len() {
        0 => Vec::new(),
        1 => lists.pop().unwrap_or_default(),
        _ => {
            let mut out = Vec::with_capacity(lists.iter().map(Vec::len).sum());
            let mut iters: Vec<std::iter::Peekable<std::vec::IntoIter<(Stream, Frame, u64)>>> =
                lists
                    .into_iter()
                    .map(|l| l.into_iter().peekable())
                    .collect();
            loop {
                let next = iters
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(i, it)| it.peek().map(|(_, f, _)| (i, f.time)))
                    .min_by_key(|&(i, t)| (t, i))
                    .map(|(i, _)| i);
                match next.and_then(|i| iters[i].next()) {
                    Some(item) => out.push(item),
                    None => return out,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    fn rec(code: Option<i32>, sig: Option<i32>) -> Exit {
        Exit::Recorded(ExitRecord {
            exit_code: code,
            signal: sig,
            start_error: None,
            end_time: DateTime::from_timestamp(100, 0).unwrap(),
        })
    }

    #[test]
    fn reports_for_each_ending() {
        let now = DateTime::from_timestamp(200, 0).unwrap();
        let r = final_report(&rec(Some(0), None), None, None, 1, Some(9), None, now);
        assert_eq!(r.phase, NodeTaskPhase::Succeeded);
        assert_eq!(r.reason.as_deref(), Some("Exited"));
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(r.end_time, DateTime::from_timestamp(100, 0));
        let precise = DateTime::from_timestamp_millis(100_700).unwrap();
        let r = final_report(&rec(Some(0), None), None, None, 1, None, Some(precise), now);
        assert_eq!(
            r.start_time,
            DateTime::from_timestamp(100, 0),
            "whole seconds"
        );
        let r = final_report(&rec(Some(3), None), None, None, 1, None, None, now);
        assert_eq!(r.phase, NodeTaskPhase::Failed);
        assert_eq!(r.reason.as_deref(), Some("NonZeroExit"));
        assert_eq!(r.exit_code, Some(3));
        let r = final_report(&rec(None, Some(11)), None, None, 1, None, None, now);
        assert_eq!(r.reason.as_deref(), Some("Signaled"));
        assert_eq!(r.signal, Some(11));
        let r = final_report(
            &rec(None, Some(11)),
            Some("Cancelled"),
            None,
            1,
            None,
            None,
            now,
        );
        assert!(r.message.unwrap().contains("SIGSEGV"));
        // The agent's own stop wins, whatever the process did.
        let r = final_report(
            &rec(None, Some(9)),
            Some(node_reason::WALLTIME_EXCEEDED),
            Some("1 GiB"),
            1,
            None,
            None,
            now,
        );
        assert_eq!(r.phase, NodeTaskPhase::Failed);
        assert_eq!(r.reason.as_deref(), Some("WalltimeExceeded"));
        assert_eq!(r.signal, Some(9));
        let r = final_report(
            &rec(Some(0), None),
            Some("Cancelled"),
            None,
            1,
            None,
            None,
            now,
        );
        assert_eq!(r.phase, NodeTaskPhase::Failed);
        assert_eq!(r.reason.as_deref(), Some("Cancelled"));
        let r = final_report(&Exit::Lost, None, None, 2, None, None, now);
        assert_eq!(r.reason.as_deref(), Some("Lost"));
        assert_eq!(r.attempt, 2);
        assert_eq!(r.end_time, Some(now));
        let start_failed = Exit::Recorded(ExitRecord {
            exit_code: None,
            signal: None,
            start_error: Some("no such file".into()),
            end_time: now,
        });
        let r = final_report(&start_failed, None, None, 1, None, None, now);
        assert_eq!(r.reason.as_deref(), Some("StartFailed"));
        assert_eq!(r.message.as_deref(), Some("no such file"));
        // Killed at the memory limit: OutOfMemory with the limit; a clean exit stays one.
        let r = final_report(
            &rec(None, Some(9)),
            None,
            Some("256 MiB"),
            1,
            None,
            None,
            now,
        );
        assert_eq!(r.reason.as_deref(), Some("OutOfMemory"));
        assert!(r.message.unwrap().contains("memory limit of 256 MiB"));
        assert_eq!(r.signal, Some(9));
        let r = final_report(
            &rec(Some(0), None),
            None,
            Some("256 MiB"),
            1,
            None,
            None,
            now,
        );
        assert_eq!(r.phase, NodeTaskPhase::Succeeded);
        let refused = Exit::Refused(Refusal {
            reason: node_reason::NOT_BOUND,
            message: "not ours".into(),
        });
        let r = final_report(&refused, None, None, 1, None, None, now);
        assert_eq!(
            (r.phase, r.reason.as_deref(), r.message.as_deref(), r.pid),
            (
                NodeTaskPhase::Failed,
                Some("NotBound"),
                Some("not ours"),
                None
            )
        );
    }

    #[test]
    fn command_lines() {
        let dir = tempfile::tempdir().unwrap();
        let run = Dir::open(dir.path()).unwrap();
        let mut a = Allocation::default();
        a.spec.entrypoint = Some("/bin/echo".into());
        a.spec.args = vec!["a b".into(), "\"q\"".into()];
        assert_eq!(
            command_line(&a, &run, None, None).unwrap(),
            (
                "/bin/echo".to_string(),
                vec!["a b".to_string(), "\"q\"".to_string()]
            )
        );
        a.spec.args.clear();
        a.spec.entrypoint = Some("echo hi | tr a-z A-Z".into());
        assert_eq!(
            command_line(&a, &run, None, None).unwrap().1,
            vec!["-c", "echo hi | tr a-z A-Z"]
        );
        a.spec.entrypoint = None;
        a.spec.script = Some("#!/bin/bash\necho hi\n".into());
        let (p, args) = command_line(&a, &run, None, None).unwrap();
        assert!(p.ends_with(SCRIPT_FILE));
        assert!(args.is_empty());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(p.starts_with(&dir.path().display().to_string()));
        a.spec.script = Some("echo no shebang\n".into());
        let (p, args) = command_line(&a, &run, None, None).unwrap();
        assert_eq!(p, "/bin/sh");
        assert!(args[0].ends_with(SCRIPT_FILE));
    }

    #[test]
    fn a_batch_jobs_other_nodes_run_a_holder_that_succeeds_when_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let run = Dir::open(dir.path()).unwrap();
        let mut a = Allocation::default();
        a.spec.script = Some("#!/bin/sh\nmpirun ./app\n".into());
        a.metadata.annotations.insert(
            lattice_apis::lifecycle::BATCH_HOST_ANNOTATION.into(),
            "first".into(),
        );
        a.status = Some(lattice_apis::AllocationStatus {
            assigned_nodes: vec!["n1".into(), "n2".into()],
            ..Default::default()
        });
        let (p, _) = command_line(&a, &run, None, Some("n1")).unwrap();
        assert!(p.ends_with(SCRIPT_FILE), "the first node runs the script");
        let (p, args) = command_line(&a, &run, None, Some("n2")).unwrap();
        assert_eq!((p.as_str(), args[1].as_str()), ("/bin/sh", BATCH_HOLDER));
        let now = chrono::DateTime::from_timestamp(200, 0).unwrap();
        let r = final_report(
            &rec(None, Some(15)),
            Some(node_reason::BATCH_DONE),
            None,
            1,
            None,
            None,
            now,
        );
        assert_eq!(r.phase, NodeTaskPhase::Succeeded);
        assert_eq!(r.exit_code, Some(0));
    }

    #[test]
    fn merge_keeps_stream_order() {
        let f = |ms: i64| Frame {
            time: DateTime::from_timestamp_millis(ms).unwrap(),
            newline: true,
            data: Vec::new(),
        };
        let out = merge_by_time(vec![
            vec![(Stream::Stdout, f(1), 1), (Stream::Stdout, f(5), 2)],
            vec![(Stream::Stderr, f(3), 1), (Stream::Stderr, f(2), 2)],
        ]);
        let order: Vec<(Stream, u64)> = out.iter().map(|(s, _, o)| (*s, *o)).collect();
        // stderr's own order is kept even though its clock went back.
        assert_eq!(
            order,
            vec![
                (Stream::Stdout, 1),
                (Stream::Stderr, 1),
                (Stream::Stderr, 2),
                (Stream::Stdout, 2)
            ]
        );
    }
}
