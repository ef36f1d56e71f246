//! How workloads are started and stopped: the [`ProcessRuntime`] trait and its
//! bare-process implementation, [`BareProcess`], which runs each workload under a
//! [`shim`](crate::shim) in its own process group. (A container or uenv runtime would
//! implement the same trait.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::shim::{self, ExitRecord, PidRecord};

/// How long a shim may take to start the workload.
const START_LIMIT: Duration = Duration::from_secs(30);
/// The shim's whole environment. It runs as root until it starts the workload, so it
/// gets nothing of the user's (no `LD_PRELOAD`, `LD_LIBRARY_PATH`, `GCONV_PATH`, ...)
/// and nothing of the agent's: the workload's environment reaches it on a descriptor
/// ([`ENV_FD`]) and is applied to the workload's exec only, after the drop to the user.
pub const SHIM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The descriptor number the shim finds the workload's environment on.
pub const ENV_FD: i32 = 3;
/// The descriptor number the shim finds the task plans on.
pub const TASKS_FD: i32 = 4;
/// The number of the first of [`LaunchSpec::fds`] in the shim (the others follow).
pub const FIRST_PASSED_FD: i32 = 5;

/// A local user to run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// Name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Supplementary groups (the primary one included), as `initgroups` would set them.
    pub groups: Vec<u32>,
    /// Home directory.
    pub home: PathBuf,
}

/// What to start.
#[derive(Debug)]
pub struct LaunchSpec {
    /// The program (absolute or found on `PATH`).
    pub program: String,
    /// Its arguments, passed exactly.
    pub args: Vec<String>,
    /// The workload's complete environment (never the shim's).
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Run as another user (the agent runs as root).
    pub run_as: Option<RunAs>,
    /// The run directory (pid and exit files, log spools).
    pub run_dir: PathBuf,
    /// cgroups to put the workload in (one per hierarchy; none with `--no-cgroups`).
    pub cgroups: Vec<PathBuf>,
    /// One entry per task started here (empty: one task with nothing of its own).
    pub tasks: Vec<crate::shim::TaskPlan>,
    /// Descriptors the shim gets at [`FIRST_PASSED_FD`], [`FIRST_PASSED_FD`] + 1, ...
    /// (each task's `keep_fd` names its own); closed in the agent once the shim runs.
    pub fds: Vec<std::os::fd::OwnedFd>,
    /// uenv images to mount (verified, in the agent's cache) and where.
    pub squashfs: Vec<crate::uenv::Mount>,
    /// Run the tasks in this OCI image (`environment.image`).
    pub container: Option<crate::oci::bundle::ContainerPlan>,
}

/// The workload environment as the shim reads it: `KEY=VALUE` entries, each ended by a
/// NUL byte (as `/proc/<pid>/environ`). A name must be non-empty without `=` or NUL; a
/// value without NUL.
pub fn encode_env(env: &BTreeMap<String, String>) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(format!(
                "environment variable {:?} cannot be passed to a program (an empty name, or '=' or a NUL byte where none may be)",
                k.replace('\0', "\\0")
            ));
        }
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    Ok(out)
}

/// The inverse of [`encode_env`] (malformed entries are skipped).
pub fn decode_env(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|e| {
            let e = std::str::from_utf8(e).ok()?;
            let (k, v) = e.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// `bytes` on an anonymous memory file (close-on-exec, at a descriptor above 2), for a
/// child to inherit at a fixed number. Nothing else can reach it.
fn memfd_with(bytes: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::libc;
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: memfd_create with a valid name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c"lattice-env".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(bytes)?;
    // Never 0-2 (a child's stdio would replace it before it is moved to ENV_FD).
    // SAFETY: F_DUPFD_CLOEXEC on our descriptor; the new one is owned below.
    let high = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if high < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// A started workload.
#[derive(Debug)]
pub struct Launched {
    /// The shim's pid.
    pub shim_pid: u32,
    /// The workload's pid and process group.
    pub pid: u32,
    /// When it started.
    pub start_time: DateTime<Utc>,
    /// The shim as our child (to reap it).
    pub child: Option<tokio::process::Child>,
}

/// Starts, signals and observes workloads.
#[async_trait]
pub trait ProcessRuntime: Send + Sync + std::fmt::Debug {
    /// Start a workload; `Err` says why it could not start.
    async fn launch(&self, spec: &LaunchSpec) -> Result<Launched, String>;
    /// Send `signal` to the process group `pgid` (a vanished group is not an error).
    fn signal_group(&self, pgid: u32, signal: Signal) -> std::io::Result<()>;
    /// The exit record of a finished run.
    fn exit_record(&self, run_dir: &Path) -> Option<ExitRecord>;
    /// The pid record of a started run.
    fn pid_record(&self, run_dir: &Path) -> Option<PidRecord>;
    /// Whether the run's shim is still alive (and really is that run's shim).
    fn shim_alive(&self, shim_pid: u32, run_dir: &Path) -> bool;
}

/// Workloads as plain processes under `lattice-agent shim`.
#[derive(Debug, Clone)]
pub struct BareProcess {
    shim_exe: PathBuf,
}

impl BareProcess {
    /// Exec `shim_exe shim ...` (the agent's own binary) for each workload.
    pub fn new(shim_exe: PathBuf) -> Self {
        Self { shim_exe }
    }
}

#[async_trait]
impl ProcessRuntime for BareProcess {
    async fn launch(&self, spec: &LaunchSpec) -> Result<Launched, String> {
        let log_path = spec.run_dir.join(shim::SHIM_LOG);
        let log = crate::files::Dir::open(&spec.run_dir)
            .and_then(|d| d.append(shim::SHIM_LOG, 0o600))
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let env = memfd_with(&encode_env(&spec.env)?)
            .map_err(|e| format!("cannot pass the environment to the shim: {e}"))?;
        let tasks = if spec.tasks.is_empty() && spec.container.is_none() {
            None
        } else {
            let plan = shim::ShimPlan {
                tasks: spec.tasks.clone(),
                container: spec.container.clone(),
            };
            let json = serde_json::to_vec(&plan)
                .map_err(|e| format!("cannot encode the task plans: {e}"))?;
            Some(
                memfd_with(&json)
                    .map_err(|e| format!("cannot pass the task plans to the shim: {e}"))?,
            )
        };
        let mut cmd = tokio::process::Command::new(&self.shim_exe);
        if tasks.is_some() {
            cmd.arg("shim").arg("--tasks-fd").arg(TASKS_FD.to_string());
        } else {
            cmd.arg("shim");
        }
        cmd.arg("--run-dir")
            .arg(&spec.run_dir)
            .arg("--cwd")
            .arg(&spec.cwd)
            .arg("--env-fd")
            .arg(ENV_FD.to_string());
        for cg in &spec.cgroups {
            cmd.arg("--cgroup").arg(cg);
        }
        for m in &spec.squashfs {
            let (image, target) = (m.image.to_string_lossy(), m.target.to_string_lossy());
            if image.contains('=') {
                return Err(format!("uenv image path {image} contains '='"));
            }
            cmd.arg("--squashfs").arg(format!("{image}={target}"));
        }
        if let Some(u) = &spec.run_as {
            cmd.arg("--uid")
                .arg(u.uid.to_string())
                .arg("--gid")
                .arg(u.gid.to_string());
            if !u.groups.is_empty() {
                let g: Vec<String> = u.groups.iter().map(u32::to_string).collect();
                cmd.arg("--groups").arg(g.join(","));
            }
        }
        cmd.arg("--")
            .arg(&spec.program)
            .args(&spec.args)
            .env_clear()
            .env("PATH", SHIM_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .kill_on_drop(false);
        let env_raw = std::os::fd::AsRawFd::as_raw_fd(&env);
        let tasks_raw = tasks.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        let passed: Vec<i32> = spec
            .fds
            .iter()
            .map(std::os::fd::AsRawFd::as_raw_fd)
            .collect();
        if passed
            .iter()
            .any(|fd| *fd < FIRST_PASSED_FD + passed.len() as i32)
        {
            // A source below the targets could be overwritten before it is copied.
            return Err("descriptors to pass must lie above the numbers they get".into());
        }
        // SAFETY: dup2(2) only, between fork and exec. dup2 gives the copies no
        // close-on-exec flag, so the shim inherits exactly those descriptors. The
        // memory files are copied first: the passed descriptors' targets may be where
        // they were.
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::dup2(env_raw, ENV_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(t) = tasks_raw {
                    if nix::libc::dup2(t, TASKS_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (i, fd) in passed.iter().enumerate() {
                    if nix::libc::dup2(*fd, FIRST_PASSED_FD + i as i32) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        drop(env);
        drop(tasks);
        let mut child =
            spawned.map_err(|e| format!("cannot run {}: {e}", self.shim_exe.display()))?;
        let shim_pid = child.id().unwrap_or_default();
        let start = Instant::now();
        loop {
            if let Some(p) = shim::read_pid(&spec.run_dir) {
                return Ok(Launched {
                    shim_pid,
                    pid: p.pid,
                    start_time: p.start_time,
                    child: Some(child),
                });
            }
            if let Some(x) = shim::read_exit(&spec.run_dir) {
                let _ = child.wait().await;
                return Err(x
                    .start_error
                    .unwrap_or_else(|| "the workload exited before it was recorded".into()));
            }
            if let Ok(Some(status)) = child.try_wait() {
                if let Some(p) = shim::read_pid(&spec.run_dir) {
                    return Ok(Launched {
                        shim_pid,
                        pid: p.pid,
                        start_time: p.start_time,
                        child: None,
                    });
                }
                if let Some(x) = shim::read_exit(&spec.run_dir).and_then(|x| x.start_error) {
                    return Err(x);
                }
                let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!(
                    "the workload shim exited ({status}) before starting it: {}",
                    tail.trim()
                ));
            }
            if start.elapsed() > START_LIMIT {
                let _ = child.start_kill();
                return Err(format!(
                    "the workload shim did not start it within {START_LIMIT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn signal_group(&self, pgid: u32, signal: Signal) -> std::io::Result<()> {
        if pgid <= 1 {
            return Err(std::io::Error::other(format!(
                "refusing to signal process group {pgid}"
            )));
        }
        match kill(Pid::from_raw(-(pgid as i32)), signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(e) => Err(std::io::Error::from(e)),
        }
    }

    fn exit_record(&self, run_dir: &Path) -> Option<ExitRecord> {
        shim::read_exit(run_dir)
    }

    fn pid_record(&self, run_dir: &Path) -> Option<PidRecord> {
        shim::read_pid(run_dir)
    }

    fn shim_alive(&self, shim_pid: u32, run_dir: &Path) -> bool {
        process_alive(shim_pid)
            && std::fs::read(format!("/proc/{shim_pid}/cmdline")).is_ok_and(|c| {
                let dir = run_dir.as_os_str().as_encoded_bytes();
                c.windows(dir.len()).any(|w| w == dir)
            })
    }
}

/// Whether `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 || kill(Pid::from_raw(pid as i32), None::<Signal>).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may contain spaces.
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_none_or(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Whether any process of group `pgid` exists (zombies included).
pub fn group_exists(pgid: u32) -> bool {
    pgid > 1 && kill(Pid::from_raw(-(pgid as i32)), None::<Signal>) != Err(Errno::ESRCH)
}

/// A signal by name (`SIGUSR1`, `USR1`) or number.
pub fn parse_signal(s: &str) -> Option<Signal> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse().ok()
}

/// For `pre_exec`: marks every descriptor above 2 close-on-exec, so a started workload or
/// attach session inherits none of the agent's (nor any the agent itself inherited, such
/// as a build tool's jobserver pipes). Async-signal-safe: one system call, or an `fcntl`
/// loop up to the descriptor limit where `close_range` is missing (Linux before 5.11).
pub fn cloexec_inherited() {
    // SAFETY: close_range(2) and fcntl(2) on descriptor numbers only.
    unsafe {
        if nix::libc::syscall(
            nix::libc::SYS_close_range,
            3u32,
            u32::MAX,
            nix::libc::CLOSE_RANGE_CLOEXEC,
        ) == 0
        {
            return;
        }
        let mut lim = nix::libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let top = if nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as i32
        } else {
            4096
        };
        for fd in 3..top {
            nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(parse_signal("SIGUSR1"), Some(Signal::SIGUSR1));
        assert_eq!(parse_signal("usr2"), Some(Signal::SIGUSR2));
        assert_eq!(parse_signal("15"), Some(Signal::SIGTERM));
        assert_eq!(parse_signal("SIGNOPE"), None);
    }

    #[test]
    fn environments_round_trip_and_refuse_what_exec_cannot_carry() {
        let env = BTreeMap::from([
            ("A".to_string(), "1=2".to_string()),
            ("EMPTY".to_string(), String::new()),
            ("LD_PRELOAD".to_string(), "/x.so".to_string()),
        ]);
        let bytes = encode_env(&env).unwrap();
        assert_eq!(bytes, b"A=1=2\0EMPTY=\0LD_PRELOAD=/x.so\0");
        let back: BTreeMap<String, String> = decode_env(&bytes).into_iter().collect();
        assert_eq!(back, env);
        for (k, v) in [("", "x"), ("A=B", "x"), ("A\0", "x"), ("A", "x\0y")] {
            let bad = BTreeMap::from([(k.to_string(), v.to_string())]);
            assert!(encode_env(&bad).is_err(), "{k:?}={v:?}");
        }
    }

    #[test]
    fn liveness() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0));
        assert!(!group_exists(1));
    }
}
