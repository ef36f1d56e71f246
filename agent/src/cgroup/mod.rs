//! Workload cgroups: every run is limited to the node's allocatable share (memory, CPU,
//! pids) and to its node's GPU device nodes, on cgroup v2, v1, or both ("hybrid").
//!
//! Layout, in each hierarchy used ([`hierarchy`]):
//!
//! ```text
//! <mount>/lattice/<node>/<instance>/             limits: the node's allocatable share
//! <mount>/lattice/<node>/<instance>/<uid>-<attempt>/   one run: the same limits
//! ```
//!
//! `<instance>` is derived from the agent's state directory, so several agents on one
//! machine with the same node name (tests) never take each other's groups for orphans,
//! while one agent keeps its name across restarts. A run and its job steps share the
//! node group's limits; each run's own limits make its OOM kills its own.
//!
//! The workload enters its groups between fork and exec, as root, before it drops to
//! the user (the shim stays outside, so a job's limits never count it and an OOM kill
//! never hits it); the user can move nothing out of them (every file is root's).
//!
//! Without usable cgroups the agent refuses to start, unless `--no-cgroups` (laptops):
//! then [`Cgroups::disabled`] runs workloads unlimited, as the start log warns.

pub mod bpf;
pub mod devices;
pub mod hierarchy;
pub mod limits;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use self::devices::Device;
use self::hierarchy::{Controller, Hierarchy, Layout};
use self::limits::{format_bytes, Resources};
use crate::state::TaskKey;

/// Where cgroup hierarchies are mounted unless `--cgroup-root` says otherwise.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// CFS bandwidth period (µs).
const CPU_PERIOD_US: u64 = 100_000;

/// What every run is limited to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The node's allocatable share.
    pub resources: Resources,
    /// Device nodes a job may not use (other nodes' GPUs).
    pub deny: Vec<Device>,
}

/// This node's workload cgroups (or none, with `--no-cgroups`).
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    active: Option<std::sync::Arc<Active>>,
}

#[derive(Debug)]
struct Active {
    layout: Layout,
    /// `lattice/<node>/<instance>` below each mount.
    base: PathBuf,
    limits: Limits,
}

/// The instance name of the agent with state directory `state_dir`.
pub fn instance_id(state_dir: &Path) -> String {
    use sha2::Digest;
    let canonical = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..4])
}

/// Whether this machine lets an agent use cgroups under `root` (the hierarchies exist
/// and a group can be made in each): for test harnesses, which pass `--no-cgroups` where
/// it cannot.
pub fn probe(root: &Path) -> Result<(), String> {
    let layout = Layout::detect(root)?;
    for h in &layout.hierarchies {
        let p = h
            .mount
            .join(format!("lattice-probe-{}", std::process::id()));
        std::fs::create_dir(&p)
            .map_err(|e| format!("cannot make a group in {}: {e}", h.mount.display()))?;
        let _ = std::fs::remove_dir(&p);
    }
    Ok(())
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    std::fs::write(dir.join(file), value).map_err(|e| {
        format!(
            "cannot write {value:?} to {}: {e}",
            dir.join(file).display()
        )
    })
}

impl Cgroups {
    /// No cgroups (`--no-cgroups`).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Use the hierarchies under `root`, with `lattice/<node>/<instance>` groups limited
    /// to `limits`. An error says what is missing; the agent refuses to start on it.
    pub fn open(root: &Path, node: &str, instance: &str, limits: Limits) -> Result<Self, String> {
        let layout = Layout::detect(root)?;
        Self::with_layout(layout, node, instance, limits)
    }

    /// [`open`](Self::open) with a given layout (tests use directory trees).
    pub fn with_layout(
        layout: Layout,
        node: &str,
        instance: &str,
        limits: Limits,
    ) -> Result<Self, String> {
        if !limits.deny.is_empty() && layout.of(Controller::Devices).is_none() {
            return Err(
                "GPU device nodes must be denied to jobs but no hierarchy offers device control (neither the v1 devices controller nor cgroup v2)".into(),
            );
        }
        let base = Path::new("lattice").join(node).join(instance);
        for h in &layout.hierarchies {
            let mut dir = h.mount.clone();
            if h.v2 {
                enable_controllers(&dir, h)?;
            }
            for part in base.components() {
                dir.push(part);
                match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("cannot make the cgroup {}: {e}", dir.display())),
                }
                if h.v2 {
                    enable_controllers(&dir, h)?;
                }
            }
            apply(&dir, h, &limits)?;
        }
        Ok(Self {
            active: Some(std::sync::Arc::new(Active {
                layout,
                base,
                limits,
            })),
        })
    }

    /// Whether cgroups are in use.
    pub fn enabled(&self) -> bool {
        self.active.is_some()
    }

    /// The limits every run gets.
    pub fn limits(&self) -> Option<&Limits> {
        self.active.as_ref().map(|a| &a.limits)
    }

    /// For the start log.
    pub fn describe(&self) -> String {
        match &self.active {
            None => "off (--no-cgroups): workloads run without memory, CPU, pids or device limits"
                .into(),
            Some(a) => format!(
                "{}; each allocation limited to {}{}",
                a.layout.describe(),
                a.limits.resources,
                if a.limits.deny.is_empty() {
                    String::new()
                } else {
                    format!(", {} GPU device node(s) denied", a.limits.deny.len())
                }
            ),
        }
    }

    /// Make the groups of one run (one per hierarchy), limited. No groups (`Ok(vec![])`)
    /// with `--no-cgroups`.
    pub fn create(&self, key: &TaskKey) -> Result<Vec<PathBuf>, String> {
        let Some(a) = &self.active else {
            return Ok(Vec::new());
        };
        let mut dirs = Vec::new();
        for h in &a.layout.hierarchies {
            let dir = h.mount.join(&a.base).join(key.to_string());
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                // A leftover of a crash during a start: its limits are set again.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    Self::remove(&dirs);
                    return Err(format!("cannot make the cgroup {}: {e}", dir.display()));
                }
            }
            dirs.push(dir.clone());
            if let Err(e) = apply(&dir, h, &a.limits) {
                Self::remove(&dirs);
                return Err(e);
            }
        }
        Ok(dirs)
    }

    /// Kill everything in a run's groups and remove them.
    pub fn remove(dirs: &[PathBuf]) {
        let start = Instant::now();
        loop {
            let procs = members(dirs);
            if procs.is_empty() {
                break;
            }
            let killed = dirs
                .iter()
                .any(|d| std::fs::write(d.join("cgroup.kill"), "1").is_ok());
            if !killed {
                for p in procs {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            if start.elapsed() > Duration::from_secs(10) {
                tracing::warn!(cgroup = %dirs[0].display(), "processes left in cgroup");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for d in dirs {
            if let Err(e) = std::fs::remove_dir(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(cgroup = %d.display(), error = %e, "cannot remove cgroup");
                }
            }
        }
    }

    /// Processes the kernel's OOM killer ended in a run's groups.
    pub fn oom_kills(dirs: &[PathBuf]) -> u64 {
        dirs.iter()
            .filter_map(|d| {
                // v2: memory.events; v1: memory.oom_control (kernels since 4.13).
                ["memory.events", "memory.oom_control"]
                    .iter()
                    .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            })
            .filter_map(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .max()
            .unwrap_or(0)
    }

    /// The memory limit of every run, for messages.
    pub fn memory_limit(&self) -> Option<String> {
        self.limits().map(|l| format_bytes(l.resources.memory))
    }

    /// Remove this node's run groups that belong to no known run.
    pub fn remove_orphans(&self, known: &HashSet<PathBuf>) {
        let Some(a) = &self.active else { return };
        for h in &a.layout.hierarchies {
            let Ok(rd) = std::fs::read_dir(h.mount.join(&a.base)) else {
                continue;
            };
            for e in rd.filter_map(Result::ok) {
                let p = e.path();
                if p.is_dir() && !known.contains(&p) {
                    tracing::info!(cgroup = %p.display(), "removing orphaned cgroup");
                    Self::remove(&[p]);
                }
            }
        }
    }

    /// The agent is stopping: remove its node groups if no run is left in them (they are
    /// made again at the next start).
    pub fn release(&self) {
        let Some(a) = &self.active else { return };
        for h in &a.layout.hierarchies {
            let inst = h.mount.join(&a.base);
            if std::fs::remove_dir(&inst).is_ok() {
                if let Some(node) = inst.parent() {
                    let _ = std::fs::remove_dir(node);
                }
            }
        }
    }
}

/// Enable the v2 controllers `h` is used for in `dir`'s children.
fn enable_controllers(dir: &Path, h: &Hierarchy) -> Result<(), String> {
    let wanted: Vec<&str> = h
        .controllers
        .iter()
        .filter(|c| **c != Controller::Devices)
        .map(|c| c.name())
        .collect();
    let on = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for c in wanted {
        if on.split_whitespace().any(|x| x == c) {
            continue;
        }
        write(dir, "cgroup.subtree_control", &format!("+{c}"))?;
    }
    Ok(())
}

/// Set `limits` in the group `dir` of hierarchy `h`.
fn apply(dir: &Path, h: &Hierarchy, limits: &Limits) -> Result<(), String> {
    let r = &limits.resources;
    let quota = r.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000;
    for c in &h.controllers {
        match (c, h.v2) {
            (Controller::Memory, true) => {
                write(dir, "memory.max", &r.memory.to_string())?;
                // The limit is on memory and swap together: no swapping past it.
                if dir.join("memory.swap.max").exists() {
                    write(dir, "memory.swap.max", "0")?;
                }
            }
            (Controller::Memory, false) => {
                write(dir, "memory.limit_in_bytes", &r.memory.to_string())?;
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    write(dir, "memory.memsw.limit_in_bytes", &r.memory.to_string())?;
                }
            }
            (Controller::Cpu, true) => write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?,
            (Controller::Cpu, false) => {
                write(dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                write(dir, "cpu.cfs_quota_us", &quota.to_string())?;
            }
            (Controller::Pids, _) => write(dir, "pids.max", &r.pids.to_string())?,
            (Controller::Devices, _) if limits.deny.is_empty() => {}
            // On the node group it covers every run below; on each run too, so a run keeps
            // it should the node group ever be made again.
            (Controller::Devices, true) => {
                bpf::deny_devices(dir, &limits.deny).map_err(|e| e.to_string())?
            }
            (Controller::Devices, false) => {
                for d in &limits.deny {
                    write(dir, "devices.deny", &d.rule())?;
                }
            }
        }
    }
    Ok(())
}

/// The processes of a run (every group of it has the same members: the workload joins
/// them all).
fn members(dirs: &[PathBuf]) -> Vec<i32> {
    dirs.iter()
        .find_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// For `pre_exec`: the `cgroup.procs` files of a run's groups, ready to be written by
/// [`join`] between fork and exec.
pub fn procs_files(dirs: &[PathBuf]) -> std::io::Result<Vec<std::ffi::CString>> {
    dirs.iter()
        .map(|d| {
            std::ffi::CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes())
                .map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("{} contains a NUL byte", d.display()),
                    )
                })
        })
        .collect()
}

/// Move the calling process into the groups whose `cgroup.procs` files are `files`.
/// Async-signal-safe (open, write, close): for `pre_exec`. A group that cannot be
/// joined is an error: a workload outside its limits is refused, not run.
pub fn join(files: &[std::ffi::CString]) -> std::io::Result<()> {
    use nix::libc;
    for f in files {
        // SAFETY: open/write/close on a valid C string.
        unsafe {
            let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if wrote != 1 {
                return Err(err);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hierarchy::Hierarchy;

    fn limits() -> Limits {
        Limits {
            resources: Resources {
                memory: 256 << 20,
                cpu_millis: 1500,
                pids: 64,
            },
            deny: Vec::new(),
        }
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// cgroup v2 against a directory tree: controllers enabled down the path, limits in
    /// the node group and in each run, swap off, orphans removed.
    #[test]
    fn v2_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().to_path_buf();
        std::fs::write(m.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let layout = Layout {
            hierarchies: vec![Hierarchy {
                mount: m.clone(),
                v2: true,
                controllers: vec![Controller::Memory, Controller::Cpu, Controller::Pids],
            }],
        };
        let cg = Cgroups::with_layout(layout, "n1", "abcd", limits()).unwrap();
        let node = m.join("lattice/n1/abcd");
        for d in [
            m.clone(),
            m.join("lattice"),
            m.join("lattice/n1"),
            node.clone(),
        ] {
            // Each write is one "+controller" (the tree keeps the last).
            assert!(
                read(&d.join("cgroup.subtree_control")).starts_with('+'),
                "{}",
                d.display()
            );
        }
        assert_eq!(read(&node.join("memory.max")), (256u64 << 20).to_string());
        assert_eq!(read(&node.join("cpu.max")), "150000 100000");
        assert_eq!(read(&node.join("pids.max")), "64");
        let run = cg.create(&TaskKey::new("u", 1)).unwrap();
        assert_eq!(run, vec![node.join("u-1")]);
        assert_eq!(read(&run[0].join("pids.max")), "64");
        // memory.swap.max is set where the kernel offers it.
        std::fs::create_dir(node.join("u-2")).unwrap();
        std::fs::write(node.join("u-2/memory.swap.max"), "max").unwrap();
        let run2 = cg.create(&TaskKey::new("u", 2)).unwrap();
        assert_eq!(read(&run2[0].join("memory.swap.max")), "0");
        // OOM kills from memory.events.
        std::fs::write(
            run[0].join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(Cgroups::oom_kills(&run), 1);
        assert_eq!(Cgroups::oom_kills(&run2), 0);
        // Orphans: plain directories stand in for groups (files in them block rmdir:
        // clear them the way the kernel would).
        for d in [&run[0], &run2[0]] {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
        cg.remove_orphans(&HashSet::from([run[0].clone()]));
        assert!(run[0].exists());
        assert!(!run2[0].exists());
        assert!(cg.describe().contains("memory 256 MiB, cpu 1.5, pids 64"));
    }

    /// cgroup v1 against directory trees: one group per hierarchy, the v1 files, memory
    /// and swap limited together where memsw exists, device rules.
    #[test]
    fn v1_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let mount = |n: &str| {
            let p = tmp.path().join(n);
            std::fs::create_dir(&p).unwrap();
            p
        };
        let (mem, cpu, pids, dev) = (
            mount("memory"),
            mount("cpu,cpuacct"),
            mount("pids"),
            mount("devices"),
        );
        let h = |m: &PathBuf, c: Controller| Hierarchy {
            mount: m.clone(),
            v2: false,
            controllers: vec![c],
        };
        let layout = Layout {
            hierarchies: vec![
                h(&cpu, Controller::Cpu),
                h(&dev, Controller::Devices),
                h(&mem, Controller::Memory),
                h(&pids, Controller::Pids),
            ],
        };
        let mut l = limits();
        l.deny = vec![Device {
            block: false,
            major: 195,
            minor: 1,
        }];
        // memsw exists in the run groups the kernel makes; here, in the node group.
        std::fs::create_dir_all(mem.join("lattice/n1/abcd")).unwrap();
        std::fs::write(mem.join("lattice/n1/abcd/memory.memsw.limit_in_bytes"), "").unwrap();
        let cg = Cgroups::with_layout(layout, "n1", "abcd", l).unwrap();
        let node = |m: &PathBuf| m.join("lattice/n1/abcd");
        assert_eq!(
            read(&node(&mem).join("memory.limit_in_bytes")),
            (256u64 << 20).to_string()
        );
        assert_eq!(
            read(&node(&mem).join("memory.memsw.limit_in_bytes")),
            (256u64 << 20).to_string()
        );
        assert_eq!(read(&node(&cpu).join("cpu.cfs_quota_us")), "150000");
        assert_eq!(read(&node(&cpu).join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&node(&pids).join("pids.max")), "64");
        assert_eq!(read(&node(&dev).join("devices.deny")), "c 195:1 rwm");
        let run = cg.create(&TaskKey::new("u", 1)).unwrap();
        assert_eq!(run.len(), 4);
        assert!(run.iter().all(|d| d.ends_with("lattice/n1/abcd/u-1")));
        std::fs::write(
            run[2].join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(Cgroups::oom_kills(&run), 2);
        assert_eq!(cg.memory_limit().as_deref(), Some("256 MiB"));
    }

    #[test]
    fn device_denial_needs_a_device_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout {
            hierarchies: vec![Hierarchy {
                mount: tmp.path().to_path_buf(),
                v2: false,
                controllers: vec![Controller::Memory, Controller::Cpu, Controller::Pids],
            }],
        };
        let mut l = limits();
        l.deny = vec![Device {
            block: false,
            major: 195,
            minor: 0,
        }];
        let e = Cgroups::with_layout(layout, "n1", "x", l).unwrap_err();
        assert!(e.contains("no hierarchy offers device control"), "{e}");
        assert!(!Cgroups::disabled().enabled());
        assert!(Cgroups::disabled()
            .create(&TaskKey::new("u", 1))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn instance_ids_differ_by_state_dir_and_stay_put() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        assert_eq!(instance_id(a.path()), instance_id(a.path()));
        assert_ne!(instance_id(a.path()), instance_id(b.path()));
        assert_eq!(instance_id(a.path()).len(), 8);
    }
}
