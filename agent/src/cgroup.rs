//! Best-effort cgroup v2 groups for workloads: `<root>/lattice/<node>/<uid>-<attempt>`.
//!
//! The node's name is part of the path so that several agents on one machine (tests,
//! `lattice up`) never treat each other's groups as orphans. Everything here is
//! optional: without a writable cgroup v2 hierarchy the agent runs workloads without
//! one (the process group alone bounds them).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::state::TaskKey;

/// Where this node's workload cgroups live, when usable.
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    base: Option<PathBuf>,
}

impl Cgroups {
    /// Use `<root>/lattice/<node>` if `root` is a writable cgroup v2 mount.
    pub fn new(root: Option<&Path>, node: &str) -> Self {
        let Some(root) = root else {
            return Self::default();
        };
        if !root.join("cgroup.controllers").exists() {
            tracing::debug!(root = %root.display(), "no cgroup v2 hierarchy; workloads run without cgroups");
            return Self::default();
        }
        let base = root.join("lattice").join(node);
        match std::fs::create_dir_all(&base) {
            Ok(()) => Self { base: Some(base) },
            Err(e) => {
                tracing::debug!(base = %base.display(), error = %e, "cgroups not writable; workloads run without cgroups");
                Self::default()
            }
        }
    }

    /// Whether cgroups are in use.
    pub fn enabled(&self) -> bool {
        self.base.is_some()
    }

    /// Make the group of one run.
    pub fn create(&self, key: &TaskKey) -> Option<PathBuf> {
        let dir = self.base.as_ref()?.join(key.to_string());
        match std::fs::create_dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some(dir),
            Err(e) => {
                tracing::debug!(cgroup = %dir.display(), error = %e, "cannot create cgroup");
                None
            }
        }
    }

    /// Kill everything in a run's group and remove it.
    pub fn remove(path: &Path) {
        let start = Instant::now();
        loop {
            let procs = members(path);
            if procs.is_empty() {
                break;
            }
            if std::fs::write(path.join("cgroup.kill"), "1").is_err() {
                for p in procs {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            if start.elapsed() > Duration::from_secs(10) {
                tracing::warn!(cgroup = %path.display(), "processes left in cgroup");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(e) = std::fs::remove_dir(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(cgroup = %path.display(), error = %e, "cannot remove cgroup");
            }
        }
    }

    /// Remove this node's groups that belong to no known run.
    pub fn remove_orphans(&self, known: &HashSet<PathBuf>) {
        let Some(base) = &self.base else { return };
        let Ok(rd) = std::fs::read_dir(base) else {
            return;
        };
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() && !known.contains(&p) {
                tracing::info!(cgroup = %p.display(), "removing orphaned cgroup");
                Self::remove(&p);
            }
        }
    }
}

fn members(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_without_a_cgroup2_mount() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cgroups::new(Some(dir.path()), "n1");
        assert!(!c.enabled());
        assert!(c.create(&TaskKey::new("u", 1)).is_none());
        assert!(!Cgroups::new(None, "n1").enabled());
    }

    #[test]
    fn fake_hierarchy_create_and_orphans() {
        // A directory that looks like a cgroup2 root: plain directories stand in for groups.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "").unwrap();
        let c = Cgroups::new(Some(dir.path()), "n1");
        assert!(c.enabled());
        let a = c.create(&TaskKey::new("u", 1)).unwrap();
        let b = c.create(&TaskKey::new("v", 2)).unwrap();
        assert!(a.ends_with("lattice/n1/u-1"));
        c.remove_orphans(&HashSet::from([a.clone()]));
        assert!(a.exists());
        assert!(!b.exists());
    }
}
