//! `lattice-agent shim`: the tiny supervisor between the agent and one workload.
//!
//! The agent execs itself as `lattice-agent shim --run-dir D --cwd C -- CMD ARGS`. The
//! shim
//!
//! 1. leaves the agent's session (`setsid`) and becomes a child subreaper, so every
//!    orphaned descendant of the workload is reparented to it and reaped by it;
//! 2. starts the workload in a new process group (pgid = its pid) with its stdout and
//!    stderr on pipes — between fork and exec the child joins the run's cgroups, drops
//!    to the user (groups, gid, uid) and enters the working directory as the user; the
//!    workload's environment, read from the descriptor the agent passed
//!    (`--env-fd`), is applied to that exec only: the shim's own environment is the
//!    agent's fixed one, so nothing of the user's (`LD_PRELOAD`, ...) reaches a root
//!    process — and records `{shimPid, pid, startTime}` in `D/pid.json`;
//! 3. copies the pipes into the spools `D/stdout.spool` and `D/stderr.spool` as
//!    timestamped line frames ([`crate::logs::spool`]);
//! 4. waits for the workload; once it exits, SIGKILLs what is left of its process
//!    group (and cgroup) and reaps it all, so no process of the workload survives;
//! 5. writes the real exit status to `D/exit.json` (atomically) and exits.
//!
//! It runs in its own process group, so the agent's SIGTERM/SIGKILL to the workload's
//! group never hits it, and it does not depend on the agent: a workload that ends
//! while the agent is down still gets its exit status recorded, which the restarted
//! agent then reports.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::config::ShimArgs;
use crate::files::Dir;
use crate::logs::spool::{LineAssembler, SpoolWriter, PARTIAL_FLUSH};

/// `pid.json` in the run directory.
pub const PID_FILE: &str = "pid.json";
/// `exit.json` in the run directory.
pub const EXIT_FILE: &str = "exit.json";
/// Spool of standard output.
pub const STDOUT_SPOOL: &str = "stdout.spool";
/// Spool of standard error.
pub const STDERR_SPOOL: &str = "stderr.spool";
/// The shim's own diagnostics.
pub const SHIM_LOG: &str = "shim.log";

/// How long the shim waits for the pipes to close after the process group is gone (a
/// process that escaped the group may hold them open).
const DRAIN: Duration = Duration::from_secs(5);
/// How long the shim keeps killing a process group that will not go.
const REAP_LIMIT: Duration = Duration::from_secs(60);

/// Written once the workload started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PidRecord {
    /// The shim.
    pub shim_pid: u32,
    /// The workload (and its process group id).
    pub pid: u32,
    /// When it started.
    pub start_time: DateTime<Utc>,
}

/// Written once everything is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitRecord {
    /// Exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Terminating signal, when killed by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The workload could not be started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// When the whole process group was gone.
    pub end_time: DateTime<Utc>,
}

/// `D/pid.json`, if written.
pub fn read_pid(run_dir: &Path) -> Option<PidRecord> {
    serde_json::from_slice(&std::fs::read(run_dir.join(PID_FILE)).ok()?).ok()
}

/// `D/exit.json`, if written.
pub fn read_exit(run_dir: &Path) -> Option<ExitRecord> {
    serde_json::from_slice(&std::fs::read(run_dir.join(EXIT_FILE)).ok()?).ok()
}

/// Write `v` as `name` in the run directory, atomically (through its descriptor).
fn write_json<T: Serialize>(dir: Option<&Dir>, name: &str, v: &T) {
    let Some(dir) = dir else {
        eprintln!("lattice shim: no run directory for {name}");
        return;
    };
    match serde_json::to_vec(v) {
        Ok(b) => {
            if let Err(e) = dir.write_atomic(name, &b, 0o600) {
                eprintln!(
                    "lattice shim: cannot write {}: {e}",
                    dir.join(name).display()
                );
            }
        }
        Err(e) => eprintln!("lattice shim: cannot encode {name}: {e}"),
    }
}

/// What the agent wrote on descriptor `fd` (a memory file), which is closed after.
fn read_passed(fd: i32, flag: &str) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    use std::os::fd::FromRawFd;
    if fd <= 2 {
        return Err(std::io::Error::other(format!(
            "{flag} {fd} is a standard stream"
        )));
    }
    // SAFETY: the agent passed this descriptor for us alone; the File closes it.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.seek(SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The workload's environment from the descriptor the agent passed.
fn read_env(fd: i32) -> std::io::Result<Vec<(String, String)>> {
    read_passed(fd, "--env-fd").map(|b| crate::runtime::decode_env(&b))
}

/// Run the shim; returns the process exit code.
pub fn run(args: ShimArgs) -> i32 {
    // Out of the agent's session and process group: signals to either never reach us.
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("lattice shim: setsid: {e}");
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("lattice shim: cannot become a child subreaper: {e}");
    }
    let dir = match Dir::open(&args.run_dir) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("lattice shim: cannot open {}: {e}", args.run_dir.display());
            None
        }
    };
    let dir = dir.as_ref();
    let fail = |why: String| {
        write_json(
            dir,
            EXIT_FILE,
            &ExitRecord {
                exit_code: None,
                signal: None,
                start_error: Some(why),
                end_time: Utc::now(),
            },
        );
    };
    let env = match args.env_fd.map(read_env).transpose() {
        Ok(env) => env,
        Err(e) => {
            fail(format!("cannot read the workload's environment: {e}"));
            return 2;
        }
    };
    let cgroups = match crate::cgroup::procs_files(&args.cgroup) {
        Ok(c) => c,
        Err(e) => {
            fail(format!("cannot use the run's cgroups: {e}"));
            return 2;
        }
    };
    let Some((program, rest)) = args.command.split_first() else {
        fail("no command given".into());
        return 2;
    };
    let ShimPlan {
        mut tasks,
        container,
    } = match args.tasks_fd.map(read_plan).transpose() {
        Ok(t) => t.unwrap_or_default(),
        Err(e) => {
            fail(format!("cannot read the task plan: {e}"));
            return 2;
        }
    };
    if tasks.is_empty() {
        tasks.push(TaskPlan::default());
    }
    if !args.squashfs.is_empty() || container.is_some() {
        let mounts: Vec<(String, String)> = args
            .squashfs
            .iter()
            .filter_map(|m| m.split_once('='))
            .map(|(i, t)| (i.to_string(), t.to_string()))
            .collect();
        if let Err(e) = crate::uenv::mount::enter(&mounts) {
            fail(e);
            return 2;
        }
    }
    let container = match container {
        None => None,
        Some(plan) => match crate::oci::bundle::prepare(&plan, &args.run_dir) {
            Ok(p) => Some((plan, p)),
            Err(e) => {
                fail(format!("cannot prepare the image's root file system: {e}"));
                return 2;
            }
        },
    };
    let cwd = match std::ffi::CString::new(args.cwd.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(_) => {
            eprintln!("lattice shim: the working directory contains a NUL byte");
            return 2;
        }
    };
    let ids = args.uid.zip(args.gid);
    let groups: Vec<nix::libc::gid_t> = if args.groups.is_empty() {
        args.gid.into_iter().collect()
    } else {
        args.groups.clone()
    };
    // One stdout and one stderr pipe for all the tasks.
    let pipes = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .and_then(|o| Ok((o, nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)));
    let ((out_r, out_w), (err_r, err_w)) = match pipes {
        Ok(p) => p,
        Err(e) => {
            fail(format!("cannot make the output pipes: {e}"));
            return 2;
        }
    };
    let mut pids: Vec<u32> = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        let started = match &container {
            None => spawn_task(
                program,
                rest,
                env.as_deref(),
                task,
                pids.first().copied(),
                (&out_w, &err_w),
                (&cgroups, ids, &groups, &cwd),
            ),
            Some((plan, prepared)) => {
                let mut task_env: Vec<(String, String)> = env.clone().unwrap_or_default();
                task_env.extend(task.env.iter().cloned());
                if task.keep_fd.is_some() {
                    let fd = crate::oci::bundle::PMI_FD_IN_CONTAINER.to_string();
                    task_env.retain(|(k, _)| k != "PMI_FD");
                    task_env.push(("PMI_FD".into(), fd));
                }
                crate::oci::bundle::enter_cwd(plan, prepared, &args.cwd, &args.command)
                    .and_then(|(cwd, command)| {
                        let process = crate::oci::bundle::Process {
                            args: command,
                            env: task_env,
                            cwd: &cwd,
                            user: ids.map(|(u, g)| (u, g, groups.clone())),
                        };
                        crate::oci::bundle::write_bundle(plan, prepared, i, &process)
                    })
                    .map_err(std::io::Error::other)
                    .and_then(|()| {
                        spawn_container(
                            plan,
                            prepared,
                            i,
                            task,
                            pids.first().copied(),
                            (&out_w, &err_w),
                            &cgroups,
                        )
                    })
            }
        };
        match started {
            Ok(pid) => pids.push(pid),
            Err(e) => {
                let why = if e.kind() == std::io::ErrorKind::NotFound && !args.cwd.exists() {
                    format!("working directory {} does not exist", args.cwd.display())
                } else if tasks.len() > 1 {
                    format!("cannot start task {i} of {}: {program:?}: {e}", tasks.len())
                } else {
                    format!("cannot start {program:?}: {e}")
                };
                if let Some(first) = pids.first() {
                    kill_the_rest(*first, &args.cgroup);
                }
                fail(why);
                return 127;
            }
        }
    }
    // Only the tasks hold their ends now: a closed socket means its task is gone.
    drop((out_w, err_w));
    for fd in tasks.iter().filter_map(|t| t.keep_fd) {
        let _ = nix::unistd::close(fd);
    }
    let pid = pids[0];
    write_json(
        dir,
        PID_FILE,
        &PidRecord {
            shim_pid: std::process::id(),
            pid,
            start_time: Utc::now(),
        },
    );

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = 0;
    let spool = |name: &str| {
        let opened = dir
            .ok_or_else(|| std::io::Error::other("no run directory"))
            .and_then(|d| d.append(name, 0o600));
        match opened {
            Ok(f) => Some(SpoolWriter::from_file(f)),
            Err(e) => {
                eprintln!("lattice shim: cannot open {name}: {e}");
                None
            }
        }
    };
    pumps += 2;
    spawn_pump(
        std::fs::File::from(out_r),
        spool(STDOUT_SPOOL),
        done_tx.clone(),
    );
    spawn_pump(
        std::fs::File::from(err_r),
        spool(STDERR_SPOOL),
        done_tx.clone(),
    );
    drop(done_tx);

    let (exit_code, signal) = wait_for(&pids);
    kill_the_rest(pid, &args.cgroup);

    // The group is gone: the pipes close unless a process that left the group holds them.
    let deadline = Instant::now() + DRAIN;
    for _ in 0..pumps {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            eprintln!("lattice shim: output pipes still open after the process group ended");
            break;
        }
    }
    write_json(
        dir,
        EXIT_FILE,
        &ExitRecord {
            exit_code,
            signal,
            start_error: None,
            end_time: Utc::now(),
        },
    );
    0
}

/// Reap children until every task has exited; the run's exit code or signal: the
/// highest exit code when a task failed, else the first signal a task was killed by,
/// else 0 (Slurm's step status).
fn wait_for(pids: &[u32]) -> (Option<i32>, Option<i32>) {
    let mut left: Vec<Pid> = pids.iter().map(|p| Pid::from_raw(*p as i32)).collect();
    let (mut code, mut signal) = (0, None);
    while !left.is_empty() {
        let (p, c, s) = match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(p, c)) => (p, Some(c), None),
            Ok(WaitStatus::Signaled(p, sig, _)) => (p, None, Some(sig as i32)),
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("lattice shim: waitpid: {e}");
                return (None, None);
            }
        };
        let Some(at) = left.iter().position(|t| *t == p) else {
            continue;
        };
        left.swap_remove(at);
        code = code.max(c.unwrap_or(0));
        signal = signal.or(s);
    }
    match (code, signal) {
        (0, Some(s)) => (None, Some(s)),
        (c, _) => (Some(c), None),
    }
}

/// What one task of a run gets besides the run's command and environment (the agent
/// passes a list of them on `--tasks-fd` for a job step with several tasks here, an MPI
/// rank's socket or a CPU or GPU binding).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskPlan {
    /// Variables over the run's environment (`LATTICE_PROCID`, `PMI_FD`, ...).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// A descriptor (as numbered in the shim) this task alone inherits: its PMI socket.
    #[serde(default)]
    pub keep_fd: Option<i32>,
    /// CPUs the task is bound to (none: not bound).
    #[serde(default)]
    pub cpus: Vec<usize>,
}

/// What the agent passes on `--tasks-fd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShimPlan {
    /// One entry per task (empty: one task with nothing of its own).
    #[serde(default)]
    pub tasks: Vec<TaskPlan>,
    /// Run every task in this OCI image.
    #[serde(default)]
    pub container: Option<crate::oci::bundle::ContainerPlan>,
}

/// The plan from the descriptor the agent passed.
fn read_plan(fd: i32) -> std::io::Result<ShimPlan> {
    serde_json::from_slice(&read_passed(fd, "--tasks-fd")?).map_err(std::io::Error::other)
}

/// Start one task in the run's process group (`group`: the first task's pid; a new group
/// for the first task itself).
#[allow(clippy::type_complexity)]
fn spawn_task(
    program: &str,
    args: &[String],
    env: Option<&[(String, String)]>,
    task: &TaskPlan,
    group: Option<u32>,
    (out, err): (&std::os::fd::OwnedFd, &std::os::fd::OwnedFd),
    (cgroups, ids, groups, cwd): (
        &[std::ffi::CString],
        Option<(u32, u32)>,
        &[nix::libc::gid_t],
        &std::ffi::CStr,
    ),
) -> std::io::Result<u32> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(err.try_clone()?))
        .process_group(group.map_or(0, |g| g as i32));
    if let Some(env) = env {
        // Applied by exec, after the drop below: the program is looked up on the
        // workload's PATH as the user.
        cmd.env_clear().envs(env.iter().cloned());
    }
    cmd.envs(task.env.iter().cloned());
    let keep = task.keep_fd;
    let cpus = cpu_set(&task.cpus);
    let groups = groups.to_vec();
    let cwd = cwd.to_owned();
    let cgroups = cgroups.to_vec();
    // SAFETY: only async-signal-safe system calls between fork and exec. The run's
    // cgroups are joined first, as root (a workload outside its limits is refused); the
    // user's groups and ids are set next (std's `uid`/`gid` would drop the supplementary
    // groups), and the working directory is entered as the user, after them.
    unsafe {
        cmd.pre_exec(move || {
            crate::runtime::cloexec_inherited();
            if let Some(fd) = keep {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(set) = &cpus {
                bind_to(set)?;
            }
            crate::cgroup::join(&cgroups)?;
            if let Some((uid, gid)) = ids {
                if nix::libc::setgroups(groups.len(), groups.as_ptr()) < 0
                    || nix::libc::setgid(gid) < 0
                    || nix::libc::setuid(uid) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if nix::libc::chdir(cwd.as_ptr()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    Ok(child.id())
}

/// Start task `i` in its container: the OCI runtime, as root, in the run's process group
/// and cgroups with the task's CPU binding, its PMI socket (if any) on descriptor 3.
#[allow(clippy::type_complexity)]
fn spawn_container(
    plan: &crate::oci::bundle::ContainerPlan,
    prepared: &crate::oci::bundle::Prepared,
    i: usize,
    task: &TaskPlan,
    group: Option<u32>,
    (out, err): (&std::os::fd::OwnedFd, &std::os::fd::OwnedFd),
    cgroups: &[std::ffi::CString],
) -> std::io::Result<u32> {
    let mut cmd = Command::new(&plan.runtime);
    cmd.args(crate::oci::bundle::runtime_args(
        prepared,
        i,
        task.keep_fd.is_some(),
    ))
    .env_clear()
    .env("PATH", crate::runtime::SHIM_PATH)
    .current_dir("/")
    .stdin(Stdio::null())
    .stdout(Stdio::from(out.try_clone()?))
    .stderr(Stdio::from(err.try_clone()?))
    .process_group(group.map_or(0, |g| g as i32));
    let keep = task.keep_fd;
    let cpus = cpu_set(&task.cpus);
    let cgroups = cgroups.to_vec();
    let hide = prepared.hide_unified;
    let unified = c"/sys/fs/cgroup/unified";
    let target = crate::oci::bundle::PMI_FD_IN_CONTAINER;
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            crate::runtime::cloexec_inherited();
            if let Some(fd) = keep {
                // dup2 leaves the copy inheritable; a descriptor already there is
                // made inheritable by hand.
                let rc = if fd == target {
                    nix::libc::fcntl(fd, nix::libc::F_SETFD, 0)
                } else {
                    nix::libc::dup2(fd, target)
                };
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(set) = &cpus {
                bind_to(set)?;
            }
            crate::cgroup::join(&cgroups)?;
            if hide
                && (nix::libc::unshare(nix::libc::CLONE_NEWNS) < 0
                    || nix::libc::umount2(unified.as_ptr(), nix::libc::MNT_DETACH) < 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    Ok(child.id())
}

/// The CPU set of a task's binding (`None`: not bound), built before the fork.
fn cpu_set(cpus: &[usize]) -> Option<nix::libc::cpu_set_t> {
    if cpus.is_empty() {
        return None;
    }
    // SAFETY: a plain C struct.
    let mut set: nix::libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus {
        if *c < nix::libc::CPU_SETSIZE as usize {
            // SAFETY: the index is within the set.
            unsafe { nix::libc::CPU_SET(*c, &mut set) };
        }
    }
    Some(set)
}

/// Bind the calling process to `set` (async-signal-safe: between fork and exec).
fn bind_to(set: &nix::libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: sched_setaffinity on ourselves with a valid set.
    if unsafe { nix::libc::sched_setaffinity(0, std::mem::size_of::<nix::libc::cpu_set_t>(), set) }
        < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// SIGKILL whatever is left of the process group (and cgroup) and reap it, until
/// nothing of it remains.
fn kill_the_rest(pgid: u32, cgroups: &[PathBuf]) {
    let group = Pid::from_raw(-(pgid as i32));
    let start = Instant::now();
    loop {
        let _ = kill(group, Signal::SIGKILL);
        if let Some(cg) = cgroups.first() {
            // Every group of the run has the same members.
            kill_cgroup_members(cg);
        }
        // Reap every child that has exited (orphans come to us: we are a subreaper).
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        // Signal 0 reaches zombies too: ESRCH means every member is gone and reaped.
        if kill(group, None) == Err(Errno::ESRCH) {
            return;
        }
        if start.elapsed() > REAP_LIMIT {
            eprintln!("lattice shim: process group {pgid} still exists after {REAP_LIMIT:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill_cgroup_members(cg: &Path) {
    let me = std::process::id();
    if let Ok(procs) = std::fs::read_to_string(cg.join("cgroup.procs")) {
        for p in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if p as u32 != me {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
    }
}

fn spawn_pump<R: Read + AsFd + Send + 'static>(
    src: R,
    spool: Option<SpoolWriter>,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        pump(src, spool);
        let _ = done.send(());
    });
}

/// Copy one pipe into its spool as line frames until EOF (without a spool, drain it).
fn pump<R: Read + AsFd>(mut src: R, mut out: Option<SpoolWriter>) {
    let mut asm = LineAssembler::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut frames = Vec::new();
    let flush_ms = PARTIAL_FLUSH.as_millis() as u16;
    loop {
        let timeout = if asm.has_pending() {
            PollTimeout::from(flush_ms)
        } else {
            PollTimeout::NONE
        };
        let ready = {
            let mut fds = [PollFd::new(src.as_fd(), PollFlags::POLLIN)];
            nix::poll::poll(&mut fds, timeout)
        };
        match ready {
            Ok(0) => asm.flush(&mut frames),
            Ok(_) => match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => asm.feed(&buf[..n], Utc::now(), &mut frames),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("lattice shim: reading output: {e}");
                    break;
                }
            },
            Err(Errno::EINTR) => {}
            Err(e) => {
                eprintln!("lattice shim: poll: {e}");
                break;
            }
        }
        if let Some(w) = out.as_mut() {
            if let Err(e) = w.write(&frames) {
                eprintln!("lattice shim: writing a spool: {e}");
            }
        }
        frames.clear();
    }
    asm.flush(&mut frames);
    if let Some(w) = out.as_mut() {
        let _ = w.write(&frames);
        let _ = w.sync();
    }
}
