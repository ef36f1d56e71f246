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
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The program (absolute or found on `PATH`).
    pub program: String,
    /// Its arguments, passed exactly.
    pub args: Vec<String>,
    /// The complete environment.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Run as another user (the agent runs as root).
    pub run_as: Option<RunAs>,
    /// The run directory (pid and exit files, log spools).
    pub run_dir: PathBuf,
    /// cgroup to put the workload in.
    pub cgroup: Option<PathBuf>,
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
        std::fs::create_dir_all(&spec.run_dir)
            .map_err(|e| format!("cannot create {}: {e}", spec.run_dir.display()))?;
        let log_path = spec.run_dir.join(shim::SHIM_LOG);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let mut cmd = tokio::process::Command::new(&self.shim_exe);
        cmd.arg("shim")
            .arg("--run-dir")
            .arg(&spec.run_dir)
            .arg("--cwd")
            .arg(&spec.cwd);
        if let Some(cg) = &spec.cgroup {
            cmd.arg("--cgroup").arg(cg);
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
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .kill_on_drop(false);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.shim_exe.display()))?;
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
    fn liveness() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0));
        assert!(!group_exists(1));
    }
}
