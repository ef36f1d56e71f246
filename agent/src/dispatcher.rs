//! The dispatcher: starts a [supervisor](crate::supervisor) per `(uid, attempt)` of the
//! allocations bound to this node when `lifecycle::should_run` says `Run` and nothing
//! runs yet, and hands every later version of the allocation to the running
//! supervisors, which stop their workload when it says `Stop` (level-triggered).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lattice_apis::lifecycle::{
    cancel_requested, node_reason, preempt_requested, should_run, RunDecision,
};
use lattice_apis::{Allocation, AllocationPhase, NodeTaskPhase, NodeTaskState};
use lattice_runtime::{watcher, Api};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::context::{Ctx, SettleGuard};
use crate::state::TaskKey;
use crate::supervisor::{self, AllocView};

struct TaskHandle {
    /// `namespace/name` of the allocation: a supervisor hears only of its own (an object
    /// elsewhere claiming the same uid is not it).
    name: String,
    tx: watch::Sender<AllocView>,
    join: JoinHandle<()>,
}

fn full_name(a: &Allocation) -> String {
    format!("{}/{}", a.metadata.namespace_str(), a.metadata.name_str())
}

/// Starts supervisors for the allocations bound to this node and feeds them updates.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
    tasks: HashMap<TaskKey, TaskHandle>,
    /// Runs that ended (or were reported without running) in this process.
    finished: HashSet<TaskKey>,
    done_tx: mpsc::UnboundedSender<TaskKey>,
    done_rx: mpsc::UnboundedReceiver<TaskKey>,
    /// uids seen during a (re)list.
    listing: Option<HashSet<String>>,
}

impl Dispatcher {
    /// A dispatcher with no runs.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            ctx,
            tasks: HashMap::new(),
            finished: HashSet::new(),
            done_tx,
            done_rx,
            listing: None,
        }
    }

    /// After a restart: clean up orphans and re-attach to the recorded runs.
    pub fn recover(&mut self) {
        let snap = self.ctx.state.snapshot();
        for r in &snap.pending_reports {
            if r.report.phase.is_terminal() {
                self.finished.insert(TaskKey::new(&r.uid, r.report.attempt));
            }
        }
        let known: HashSet<String> = snap.tasks.keys().cloned().collect();
        for root in [self.ctx.cfg.scratch_root(), self.ctx.cfg.run_root()] {
            remove_orphans(&root, &known);
        }
        let cgroups: HashSet<PathBuf> = snap.tasks.values().flat_map(|t| t.cgroup_dirs()).collect();
        self.ctx.cgroups.remove_orphans(&cgroups);
        for rec in snap.tasks.into_values() {
            let key = TaskKey::new(&rec.uid, rec.attempt);
            let name = format!("{}/{}", rec.namespace, rec.name);
            let (tx, rx) = watch::channel(AllocView::Unknown);
            let ctx = self.ctx.clone();
            let done = self.done_tx.clone();
            let k = key.clone();
            let settle = SettleGuard::new(&ctx);
            let join = tokio::spawn(async move {
                supervisor::run_reattached(ctx, rec, rx, settle).await;
                let _ = done.send(k);
            });
            self.tasks.insert(key, TaskHandle { name, tx, join });
        }
    }

    /// Watch and dispatch until shutdown.
    pub async fn run(&mut self) {
        let api: Api<Allocation> = Api::all(self.ctx.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("status.assignedNodes={}", self.ctx.cfg.node));
        let mut events = watcher::watcher(api, config);
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => return,
                },
                Some(key) = self.done_rx.recv() => {
                    self.tasks.remove(&key);
                    self.finished.insert(key);
                }
                _ = self.ctx.shutdown.cancelled() => return,
            }
        }
    }

    /// Let every supervisor store its logs and stop watching (workloads keep running).
    pub async fn detach_all(&mut self) {
        for (_, t) in self.tasks.drain() {
            drop(t.tx);
            if tokio::time::timeout(Duration::from_secs(5), t.join)
                .await
                .is_err()
            {
                tracing::warn!("a supervisor did not stop in time");
            }
        }
    }

    fn on_event(&mut self, ev: watcher::Event<Allocation>) {
        match ev {
            watcher::Event::Init => self.listing = Some(HashSet::new()),
            watcher::Event::InitApply(a) => {
                if let (Some(seen), Some(uid)) = (self.listing.as_mut(), a.metadata.uid.as_ref()) {
                    seen.insert(uid.clone());
                }
                self.apply(a);
            }
            watcher::Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    for (k, t) in &self.tasks {
                        if !seen.contains(&k.uid) {
                            t.tx.send_replace(AllocView::Gone);
                        }
                    }
                }
            }
            watcher::Event::Apply(a) => self.apply(a),
            watcher::Event::Delete(a) => {
                let Some(uid) = a.metadata.uid.as_deref() else {
                    return;
                };
                let name = full_name(&a);
                for (k, t) in &self.tasks {
                    if k.uid == uid && t.name == name {
                        t.tx.send_replace(AllocView::Gone);
                    }
                }
                self.finished.retain(|k| k.uid != uid);
            }
        }
    }

    fn apply(&mut self, a: Allocation) {
        let Some(uid) = a.metadata.uid.clone() else {
            return;
        };
        let a = Arc::new(a);
        let name = full_name(&a);
        for (k, t) in &self.tasks {
            if k.uid == uid && t.name == name {
                t.tx.send_replace(AllocView::Present(a.clone()));
            }
        }
        let node = self.ctx.cfg.node.clone();
        let Some(st) = a.status.as_ref() else {
            return;
        };
        let key = TaskKey::new(&uid, st.attempt);
        if st.attempt == 0
            || !st.assigned_nodes.contains(&node)
            || self.tasks.contains_key(&key)
            || self.finished.contains(&key)
        {
            return;
        }
        let entry = st
            .node_states
            .get(&node)
            .filter(|s| s.attempt == st.attempt);
        match (should_run(&a, &node, st.attempt), entry) {
            (RunDecision::Run, None) => self.start(key, a),
            (RunDecision::Run, Some(e)) if !e.phase.is_terminal() => {
                // This node reported the run but has no record of it: the state was lost.
                let report = NodeTaskState {
                    phase: NodeTaskPhase::Failed,
                    attempt: st.attempt,
                    pid: e.pid,
                    start_time: e.start_time,
                    end_time: Some(lattice_apis::meta::now()),
                    reason: Some(node_reason::LOST.into()),
                    message: Some(
                        "the agent has no record of this process (its state was lost)".into(),
                    ),
                    ..Default::default()
                };
                self.report(key, &a, report);
            }
            (RunDecision::Run, Some(_)) => {
                self.finished.insert(key);
            }
            (RunDecision::Stop(_), None) if ended_before_start(&a) => {
                // Tell the release controller this node will never run it.
                let report = NodeTaskState {
                    phase: NodeTaskPhase::Failed,
                    attempt: st.attempt,
                    end_time: Some(lattice_apis::meta::now()),
                    reason: Some(node_reason::NOT_STARTED.into()),
                    message: Some("the allocation stopped before this node started it".into()),
                    ..Default::default()
                };
                self.report(key, &a, report);
            }
            (RunDecision::Stop(_), _) => {}
        }
    }

    fn report(&mut self, key: TaskKey, a: &Allocation, report: NodeTaskState) {
        let m = &a.metadata;
        if let Err(e) = self
            .ctx
            .reporter
            .enqueue(m.namespace_str(), m.name_str(), &key.uid, report)
        {
            tracing::warn!(error = %e, "cannot queue a report");
        }
        self.finished.insert(key);
    }

    fn start(&mut self, key: TaskKey, a: Arc<Allocation>) {
        let (tx, rx) = watch::channel(AllocView::Present(a.clone()));
        let ctx = self.ctx.clone();
        let done = self.done_tx.clone();
        let k = key.clone();
        let name = full_name(&a);
        let join = tokio::spawn(async move {
            supervisor::run_new(ctx, a, rx).await;
            let _ = done.send(k);
        });
        self.tasks.insert(key, TaskHandle { name, tx, join });
    }
}

/// The allocation will not run this attempt any more (finished, cancelled, preempted,
/// or failed on a peer) — as opposed to merely not being runnable yet.
fn ended_before_start(a: &Allocation) -> bool {
    let phase = a.phase();
    phase.is_terminal()
        || cancel_requested(a)
        || preempt_requested(a)
        || matches!(
            phase,
            AllocationPhase::Staging | AllocationPhase::Running | AllocationPhase::Checkpointing
        )
}

/// Remove entries of `root` (scratch or run directories) that belong to no known run.
fn remove_orphans(root: &Path, known: &HashSet<String>) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().to_string();
        if !known.contains(&name) {
            tracing::info!(path = %e.path().display(), "removing orphaned directory");
            crate::files::remove_tree(&e.path());
        }
    }
}
