//! The agent's state file, `<state-dir>/agent-state.json`: what it must remember across
//! its own restarts — the workloads it started (to re-attach to them), the reports the
//! API has not acknowledged yet (replayed in order), and the heartbeat sequence (which
//! must never go back).
//!
//! Every change is written through [`StateFile::update`]: the new document goes to a
//! temporary file, is fsynced, and renamed over the old one, so a crash leaves either
//! the old or the new state, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use lattice_apis::{NodeTaskState, Time};
use serde::{Deserialize, Serialize};

/// Version of the file's layout.
pub const STATE_VERSION: u32 = 1;

/// `(allocation uid, attempt)`: one local run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskKey {
    /// Allocation uid.
    pub uid: String,
    /// Binding attempt.
    pub attempt: u32,
}

impl TaskKey {
    /// A key.
    pub fn new(uid: &str, attempt: u32) -> Self {
        Self {
            uid: uid.to_string(),
            attempt,
        }
    }
}

impl std::fmt::Display for TaskKey {
    /// `<uid>-<attempt>`: the name of the run's scratch, run and cgroup directories.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.uid, self.attempt)
    }
}

/// One workload this agent started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRecord {
    /// Allocation uid.
    pub uid: String,
    /// Allocation name.
    pub name: String,
    /// Tenant.
    pub namespace: String,
    /// Binding attempt.
    pub attempt: u32,
    /// The shim's pid (the workload's supervisor, our child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim_pid: Option<u32>,
    /// The workload's pid, which is also its process group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When the workload started (reported as `startTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When its walltime runs out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime_deadline: Option<Time>,
    /// `<state-dir>/scratch/<uid>-<attempt>`.
    pub scratch_dir: PathBuf,
    /// `<state-dir>/run/<uid>-<attempt>`: pid file, exit file, log spools.
    pub run_dir: PathBuf,
    /// The run's cgroups, one per hierarchy (none with `--no-cgroups`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<PathBuf>,
    /// The one cgroup v2 group of a run recorded by an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// `<state-dir>/logs/<namespace>/<name>/<attempt>`.
    pub log_dir: PathBuf,
    /// Why the agent is stopping it (a node reason), once it decided to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// What the stop's reason leaves out (an MPI abort: which rank, where, why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_message: Option<String>,
    /// The run has uenv images mounted in its own mount namespace (which attach sessions
    /// enter).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uenv_mounted: bool,
    /// The uenv view's variables: `(name, prepend?, value)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uenv_env: Vec<(String, bool, String)>,
    /// The run's tasks run in this OCI image (its manifest digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
}

impl TaskRecord {
    /// Every cgroup of the run (older records name one).
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let mut v = self.cgroups.clone();
        v.extend(self.cgroup.clone());
        v
    }
}

/// A report the API has not acknowledged yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingReport {
    /// Order of enqueueing.
    pub seq: u64,
    /// Tenant.
    pub namespace: String,
    /// Allocation name.
    pub name: String,
    /// Allocation uid (a re-created allocation with the same name is left alone).
    pub uid: String,
    /// The node entry to record.
    pub report: NodeTaskState,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    /// [`STATE_VERSION`].
    #[serde(default)]
    pub version: u32,
    /// The node this state belongs to (a state dir is never shared by two nodes).
    #[serde(default)]
    pub node: String,
    /// Heartbeat sequence numbers up to this one may have been used; the next run
    /// starts above it.
    #[serde(default)]
    pub heartbeat_sequence: u64,
    /// Running (or not yet reported) workloads by `<uid>-<attempt>`.
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskRecord>,
    /// Reports not yet acknowledged, oldest first.
    #[serde(default)]
    pub pending_reports: Vec<PendingReport>,
    /// Sequence of the last report enqueued.
    #[serde(default)]
    pub report_seq: u64,
}

impl AgentState {
    /// Add a report at the end of the queue.
    pub fn push_report(&mut self, namespace: &str, name: &str, uid: &str, report: NodeTaskState) {
        self.report_seq += 1;
        self.pending_reports.push(PendingReport {
            seq: self.report_seq,
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            report,
        });
    }
}

/// The state file and its in-memory copy.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    state: Mutex<AgentState>,
}

impl StateFile {
    /// Load `path` (a missing file is an empty state) for `node`.
    pub fn load(path: &Path, node: &str) -> anyhow::Result<Self> {
        let state = match std::fs::read(path) {
            Ok(bytes) => {
                let s: AgentState = serde_json::from_slice(&bytes).with_context(|| {
                    format!(
                        "{} is not a valid agent state file; move it away to start afresh (running workloads are then not re-attached)",
                        path.display()
                    )
                })?;
                if !s.node.is_empty() && s.node != node {
                    anyhow::bail!(
                        "{} belongs to node {:?}, not {node:?}: use a state directory per node",
                        path.display(),
                        s.node
                    );
                }
                s
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => AgentState::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let f = Self {
            path: path.to_path_buf(),
            state: Mutex::new(AgentState {
                version: STATE_VERSION,
                node: node.to_string(),
                ..state
            }),
        };
        f.update(|_| ())?;
        Ok(f)
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> AgentState {
        self.lock().clone()
    }

    /// Read without writing.
    pub fn read<R>(&self, f: impl FnOnce(&AgentState) -> R) -> R {
        f(&self.lock())
    }

    /// Change the state and write it durably before returning. On a write failure the
    /// in-memory change is kept (the next successful write persists it) and the error
    /// is returned.
    pub fn update<R>(&self, f: impl FnOnce(&mut AgentState) -> R) -> anyhow::Result<R> {
        let mut g = self.lock();
        let r = f(&mut g);
        let bytes = serde_json::to_vec_pretty(&*g)?;
        write_atomic(&self.path, &bytes)
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AgentState> {
        // A panic while holding the lock leaves a consistent value (every change is a
        // plain assignment), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Write `bytes` to `path` atomically: temp file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "state".into());
    let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A fresh file, the agent's alone, never through a link.
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::NodeTaskPhase;

    #[test]
    fn round_trip_and_atomic_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent-state.json");
        let f = StateFile::load(&path, "n1").unwrap();
        assert!(path.exists(), "an empty state is written at once");
        f.update(|s| {
            s.heartbeat_sequence = 42;
            s.tasks.insert(
                "u-1".into(),
                TaskRecord {
                    uid: "u".into(),
                    name: "a".into(),
                    namespace: "t".into(),
                    attempt: 1,
                    pid: Some(123),
                    ..Default::default()
                },
            );
            s.push_report(
                "t",
                "a",
                "u",
                NodeTaskState {
                    phase: NodeTaskPhase::Running,
                    attempt: 1,
                    ..Default::default()
                },
            );
            s.push_report("t", "a", "u", NodeTaskState::default());
        })
        .unwrap();
        let again = StateFile::load(&path, "n1").unwrap().snapshot();
        assert_eq!(again, f.snapshot());
        assert_eq!(again.heartbeat_sequence, 42);
        assert_eq!(again.tasks["u-1"].pid, Some(123));
        let seqs: Vec<u64> = again.pending_reports.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![1, 2]);
        // No temp files are left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["agent-state.json"]);
    }

    #[test]
    fn refuses_another_nodes_state_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent-state.json");
        StateFile::load(&path, "n1").unwrap();
        let e = StateFile::load(&path, "n2").unwrap_err().to_string();
        assert!(e.contains("belongs to node"), "{e}");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(StateFile::load(&path, "n1").is_err());
    }

    #[test]
    fn task_key_names_directories() {
        assert_eq!(TaskKey::new("abc", 3).to_string(), "abc-3");
    }
}
