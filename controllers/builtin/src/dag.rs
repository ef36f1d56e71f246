//! The DAG controller: runs a `Dag`'s steps as Allocations owned by it, driven by the
//! event-driven dispatch engine of `lattice_dag` (fan-in counters; a step's terminal
//! state evaluates only its outgoing edges).
//!
//! * On first sight every plain step's Allocation `<dag>-<step>` is created (labelled
//!   `lattice.dev/dag`, `lattice.dev/dag-step`); steps whose dependencies do not hold
//!   yet carry the annotation `lattice.dev/hold: dependencies` (reason
//!   `waiting_for_dependencies`), which keeps them out of every queue. Task-group steps
//!   get their elements `<dag>-<step>-<i>` created lazily, within their concurrency.
//! * `mutex` (`{gpu-lock: mutex}`, Slurm `singleton`): the engine releases the holders of
//!   a lock one at a time within the Dag, and each holder's Allocation (or each element
//!   of a task-group holder) carries `{ref: gpu-lock, condition: mutex}`, so the
//!   allocation controller also serialises it against every other holder of the lock of
//!   the same tenant and user: other Dags' steps, standalone `mutex` allocations and
//!   Slurm `singleton` jobs named `gpu-lock`. Holders are created only when the engine
//!   releases them (never held in advance), so the store's creation order, which orders
//!   holders there, is the order in which their dependencies came to hold.
//! * Each child's transitions (started, requeued, terminal) are fed to the engine once;
//!   its `Release` actions lift the hold (or create the element), its `Cancel` actions
//!   cancel the child (with the cascade's reason).
//! * `spec.failurePolicy: fail_fast`: the first step that fails with nothing to catch it
//!   (the DAG would end Failed) makes the engine cancel every unfinished step; the
//!   children are cancelled the way `lattice dag cancel` cancels them (the cancel
//!   annotation with a reason naming the failed step), and the Dag ends Failed with a
//!   message naming that step. `propagate` (default) lets unrelated branches run on.
//! * `spec.maxParallel: N`: the engine releases at most N steps at once (a task group
//!   counts once while it has elements in flight); further ready steps stay held with
//!   reason `waiting_for_max_parallel` (`waiting: maxParallel 4 reached (4 steps running
//!   or pending)`) and are released in definition order as others finish.
//! * The engine lives in memory, keyed by the Dag's uid; after a restart or leader change
//!   it is rebuilt from the Dag and its children (replaying their states), so the
//!   controller is restartable from the store alone. The replay runs under `propagate`
//!   and `fail_fast` is switched on after it, so the replay order cannot cancel steps
//!   that had finished.
//! * A running Dag is looked at in full at least every `FULL_EVERY`, even when nothing
//!   changes; the state of a deleted Dag is dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lattice_apis::kinds::dag::{
    DagCounts, DagFailurePolicy, DagPhase, DagStatus, DagTaskElements, DagTaskPhase, DagTaskStatus,
};
use lattice_apis::lifecycle::{self, CANCEL_ANNOTATION};
use lattice_apis::meta::now;
use lattice_apis::{Allocation, AllocationPhase, Dag, ObjectMeta};
use lattice_dag::dispatch::Policy;
use lattice_dag::graph::{validate_dag, Limits};
use lattice_dag::{Action as DagAction, CancelReason, Engine, Outcome, StepState};
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, Api, HostContext, Patch, PatchParams, PostParams, ResourceExt};
use serde_json::json;

use crate::allocations::CANCEL_REASON_ANNOTATION;
use crate::metrics::ControllerMetrics;
use crate::scheduler::adapter::{HOLD_ANNOTATION, TASK_INDEX_LABEL};

/// Label: the Dag an allocation belongs to.
pub use lattice_apis::wellknown::DAG_LABEL;
/// Label: the step of the Dag.
pub use lattice_apis::wellknown::DAG_STEP_LABEL;
/// Label: the task group (parent) an element belongs to.
pub use lattice_apis::wellknown::TASK_GROUP_LABEL;
/// Status reason of a step held because `spec.maxParallel` steps are released.
pub const WAITING_FOR_MAX_PARALLEL: &str = "waiting_for_max_parallel";

/// What the controller knows of one child, as last fed to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Created,
    Started,
    Done,
}

struct DagRun {
    engine: Engine,
    /// Child allocation name → what the engine has been told.
    seen: HashMap<String, Seen>,
    /// Requeue counts fed, per child.
    requeues: HashMap<String, u32>,
    cancelled: bool,
    started_at: Option<lattice_apis::meta::Time>,
    /// When the Dag's status was last handed to the writer (status writes are coalesced:
    /// the object carries every step's spec, so writing it per step would be quadratic).
    last_status_write: Option<Instant>,
    /// The phase last handed to the writer: the cached Dag shows it only once that
    /// (large, background) write has landed, and a phase change must not be written
    /// again on every pass until then.
    sent_phase: Option<DagPhase>,
    /// Writes non-terminal statuses in the background, so a large Dag's status write
    /// never sits between a predecessor's end and its successor's release.
    writer: Option<StatusWriter>,
    /// `<dag>-<step>` of every step, by position in `spec.allocations`.
    child_names: Vec<String>,
    /// Step position by step name.
    step_index: HashMap<String, usize>,
    /// Built from scratch (restart, leader change, error): replay what the record says.
    rebuilt: bool,
    /// When every child was last looked at (between full passes only the steps that
    /// changed, and those the engine acted on, are).
    last_full: Option<Instant>,
    /// `fail_fast` is switched on after the first pass's replay (see the module docs).
    arm_fail_fast: bool,
}

/// A full pass over every child at least this often (a safety net: the event filter
/// marks each changed step, and deletions force a full pass).
const FULL_EVERY: Duration = Duration::from_secs(30);

/// How long until a running Dag's next full pass is due (at least a second).
fn until_full(last_full: Option<Instant>) -> Duration {
    FULL_EVERY
        .saturating_sub(last_full.map_or(FULL_EVERY, |t| t.elapsed()))
        .max(Duration::from_secs(1))
}

/// Steps noted by the event filter since their Dag's last reconcile, by Dag uid.
#[derive(Default)]
struct Dirty {
    names: HashMap<String, HashSet<String>>,
    full: HashSet<String>,
}

impl Dirty {
    /// Take what changed for `uid`: (whether a full pass is needed, changed child names).
    fn take(m: &Mutex<Dirty>, uid: &str) -> (bool, HashSet<String>) {
        let Ok(mut g) = m.lock() else {
            return (true, HashSet::new());
        };
        let full = g.full.remove(uid);
        (full, g.names.remove(uid).unwrap_or_default())
    }

    /// Drop what was noted for a Dag that is gone.
    fn forget(m: &Mutex<Dirty>, uid: &str) {
        if let Ok(mut g) = m.lock() {
            g.full.remove(uid);
            g.names.remove(uid);
        }
    }
}

/// Least time between two status writes of one Dag while its phase does not change:
/// a second, and 5 ms more per step, because a write costs O(size of the Dag) (the
/// object carries every step's spec and state) and must not crowd out the releases.
/// Steps show their own state live on their Allocations.
fn status_every(steps: usize) -> Duration {
    Duration::from_secs(1).max(Duration::from_millis(5) * steps as u32)
}

struct Ctx {
    api: Api<Allocation>,
    dags: Api<Dag>,
    allocations: Store<Allocation>,
    runs: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<DagRun>>>>>,
    dirty: Arc<Mutex<Dirty>>,
    limits: Limits,
    metrics: ControllerMetrics,
}

/// Register the DAG controller.
pub fn register(
    host: &mut lattice_runtime::ControllerHost,
    limits: Limits,
    metrics: ControllerMetrics,
) {
    host.register("dag", move |hc: HostContext| {
        let metrics = metrics.clone();
        async move {
            // A step's change matters only when something the engine or the children's
            // reconciliation reads changed (phase, hold, cancel, requeues); a pending
            // reason or a node report of a step does not wake its Dag. Neither does a
            // status write of the Dag itself.
            let digests: Mutex<HashMap<(String, String), u64>> = Mutex::new(HashMap::new());
            let dirty = Arc::new(Mutex::new(Dirty::default()));
            let runs: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<DagRun>>>>> = Arc::default();
            let noted = dirty.clone();
            let dag_cache = hc.factory.all::<Dag>().store();
            let (gone_dirty, gone_runs) = (dirty.clone(), runs.clone());
            let controller = hc
                .controller::<Dag>()
                .predicate(dag_predicate)
                .watches_events::<Allocation, _>(&Default::default(), move |ev| {
                    step_event(&digests, &noted, &dag_cache, ev)
                })
                // A Dag deleted outright (no finalizer) is never reconciled again: drop
                // its engine and what the event filter noted for it.
                .on_deleted(move |r| {
                    if let Some(uid) = r.uid.as_deref() {
                        Dirty::forget(&gone_dirty, uid);
                        if let Ok(mut g) = gone_runs.lock() {
                            g.remove(uid);
                        }
                    }
                    std::future::ready(())
                });
            let ctx = Arc::new(Ctx {
                api: Api::all(hc.client.clone()),
                dags: Api::all(hc.client.clone()),
                allocations: hc.factory.all::<Allocation>().store(),
                runs,
                dirty,
                limits,
                metrics,
            });
            controller.run(reconcile, ctx).await;
        }
    });
}

/// What of a Dag wakes its reconcile: spec, deletion, finalizers and a cancel request
/// (not its status, which this controller writes).
fn dag_predicate(d: &Dag) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        d.metadata.generation,
        d.is_deleting(),
        &d.metadata.finalizers,
        d.metadata.annotations.get(CANCEL_ANNOTATION),
    )
        .hash(&mut h);
    Some(h.finish())
}

/// The part of a step Allocation the DAG controller acts on.
fn step_digest(a: &Allocation) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let st = a.status.as_ref();
    (
        a.phase(),
        st.and_then(|s| s.exit_code),
        st.map(|s| s.requeue_count + s.preemption_count),
        a.metadata.annotations.contains_key(HOLD_ANNOTATION),
        lifecycle::cancel_requested(a),
        a.is_deleting(),
        a.metadata.uid.as_deref(),
    )
        .hash(&mut h);
    h.finish()
}

/// The Dag to reconcile for a step event, if the step changed in a way that matters.
fn step_event(
    digests: &Mutex<HashMap<(String, String), u64>>,
    dirty: &Mutex<Dirty>,
    dags: &Store<Dag>,
    ev: &lattice_runtime::informer::InformerEvent<Allocation>,
) -> Vec<lattice_runtime::ObjectRef> {
    use lattice_runtime::informer::InformerEvent;
    let a = ev.object();
    let Some(owner) = a
        .controller_owner()
        .filter(|o| o.kind == <Dag as lattice_apis::Resource>::KIND)
    else {
        return Vec::new();
    };
    let key = (
        a.namespace().unwrap_or_default().to_string(),
        a.name_any().to_string(),
    );
    let Ok(mut seen) = digests.lock() else {
        return vec![lattice_runtime::ObjectRef::from_owner(owner, a.namespace())];
    };
    // Steps of a Dag that is gone (e.g. collected after it) note nothing: no reconcile
    // would ever take it. (A Dag not cached yet is looked at in full when it is.)
    let owner_ref = lattice_runtime::ObjectRef::from_owner(owner, a.namespace());
    let live = dags
        .get(&owner_ref)
        .is_some_and(|d| d.uid() == Some(owner.uid.as_str()));
    if !live {
        seen.remove(&key);
        return Vec::new();
    }
    // Noted before the Dag is queued, so the reconcile this event causes sees it.
    match ev {
        InformerEvent::Deleted(_) => {
            seen.remove(&key);
            if let Ok(mut d) = dirty.lock() {
                d.full.insert(owner.uid.clone());
            }
        }
        InformerEvent::Applied(_) => {
            let d = step_digest(a);
            if seen.insert(key.clone(), d) == Some(d) {
                return Vec::new();
            }
            if let Ok(mut d) = dirty.lock() {
                d.names.entry(owner.uid.clone()).or_default().insert(key.1);
            }
        }
    }
    vec![lattice_runtime::ObjectRef::from_owner(owner, a.namespace())]
}

/// The cached child `name` of the Dag `uid`, if it is one.
fn owned_child(ctx: &Ctx, ns: Option<&str>, name: &str, uid: &str) -> Option<Arc<Allocation>> {
    ctx.allocations
        .get_named(ns, name)
        .filter(|c| c.owner_references().iter().any(|o| o.uid == uid))
}

fn step_of(a: &Allocation) -> Option<(String, Option<u64>)> {
    let step = a.labels().get(DAG_STEP_LABEL)?.clone();
    let index = a
        .labels()
        .get(TASK_INDEX_LABEL)
        .and_then(|i| i.parse().ok());
    Some((step, index))
}

fn outcome(a: &Allocation) -> Option<Outcome> {
    match a.phase() {
        AllocationPhase::Completed => Some(Outcome::Succeeded),
        AllocationPhase::Failed => Some(Outcome::Failed {
            exit: a.status.as_ref().and_then(|s| s.exit_code).unwrap_or(1),
        }),
        AllocationPhase::Cancelled => Some(Outcome::Cancelled),
        _ => None,
    }
}

async fn reconcile(dag: Arc<Dag>, ctx: Arc<Ctx>) -> Result<Action, anyhow::Error> {
    let uid = dag.uid().unwrap_or_default().to_string();
    if dag.is_deleting() {
        if let Ok(mut g) = ctx.runs.lock() {
            g.remove(&uid);
        }
        let _ = Dirty::take(&ctx.dirty, &uid);
        return Ok(Action::await_change());
    }
    let existing = ctx.runs.lock().ok().and_then(|g| g.get(&uid).cloned());
    let run = match existing {
        Some(r) => r,
        None => {
            let phase = dag.status.as_ref().map(|s| s.phase).unwrap_or_default();
            if matches!(
                phase,
                DagPhase::Completed | DagPhase::Failed | DagPhase::Cancelled
            ) {
                // Finished: what its steps' late events noted is of no use.
                Dirty::forget(&ctx.dirty, &uid);
                return Ok(Action::await_change());
            }
            // The size limit is admission's (the API server's `--max-dag-size`, or the
            // cluster setting `scheduling.max_dag_size` an administrator changes while
            // Dags run): a Dag in the store was admitted, whatever the limit is now.
            let limits = Limits {
                max_dag_size: usize::MAX,
                ..ctx.limits
            };
            let validated = match validate_dag(&dag, &limits) {
                Ok(v) => v,
                Err(errs) => {
                    let msg = errs.to_string();
                    write_status(
                        &ctx,
                        &dag,
                        DagStatus {
                            phase: DagPhase::Failed,
                            reason: Some("Invalid".into()),
                            message: Some(msg),
                            completion_time: Some(now()),
                            ..Default::default()
                        },
                    )
                    .await?;
                    return Ok(Action::await_change());
                }
            };
            // Replayed under `propagate`; `fail_fast` is armed after the first pass.
            let policy = Policy {
                failure_policy: DagFailurePolicy::Propagate,
                max_parallel: dag.spec.max_parallel,
            };
            let r = Arc::new(tokio::sync::Mutex::new(DagRun {
                engine: Engine::with_policy(validated, policy),
                seen: HashMap::new(),
                requeues: HashMap::new(),
                cancelled: false,
                started_at: dag.status.as_ref().and_then(|s| s.start_time),
                last_status_write: None,
                sent_phase: None,
                writer: None,
                child_names: dag
                    .spec
                    .allocations
                    .iter()
                    .map(|t| child_name(&dag, &t.name, None))
                    .collect(),
                step_index: dag
                    .spec
                    .allocations
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.name.clone(), i))
                    .collect(),
                rebuilt: true,
                last_full: None,
                arm_fail_fast: dag.spec.failure_policy == DagFailurePolicy::FailFast,
            }));
            if let Ok(mut g) = ctx.runs.lock() {
                g.entry(uid.clone()).or_insert(r).clone()
            } else {
                return Err(anyhow::anyhow!("DAG state lock poisoned"));
            }
        }
    };
    let mut guard = run.lock().await;
    let outcome = drive(&dag, &ctx, &uid, &mut guard).await;
    let forget = match &outcome {
        // The engine may have moved on before its side effects landed: rebuild it from
        // the Dag and its children next time (replay is idempotent).
        Err(_) => true,
        Ok((terminal, _)) => *terminal,
    };
    drop(guard);
    if forget {
        if let Ok(mut g) = ctx.runs.lock() {
            g.remove(&uid);
        }
        if matches!(outcome, Ok((true, _))) {
            Dirty::forget(&ctx.dirty, &uid);
        }
    }
    outcome.map(|(_, again)| match again {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    })
}

/// One pass: feed the children's states to the engine, make the children match the
/// engine (level-triggered), write the status. Returns whether the DAG is terminal, and
/// when to come back: for a status write that was held back, and for the next full
/// pass of a running DAG (every `FULL_EVERY`, even when nothing changes).
async fn drive(
    dag: &Dag,
    ctx: &Ctx,
    uid: &str,
    run: &mut DagRun,
) -> Result<(bool, Option<Duration>), anyhow::Error> {
    let begun = Instant::now();
    // Roots (idempotent: only the first call releases anything).
    let mut actions = run.engine.start();
    run.started_at.get_or_insert_with(now);
    let dag_cancelled = dag
        .metadata
        .annotations
        .get(CANCEL_ANNOTATION)
        .is_some_and(|v| v == "true");

    // Which children to look at: all of them in a full pass (after a rebuild, a deleted
    // step, a cancel, or every FULL_EVERY), otherwise only those the event filter noted
    // as changed, so one step's transition costs O(its edges), not O(steps).
    let (forced, changed) = Dirty::take(&ctx.dirty, uid);
    let full = forced
        || run.rebuilt
        || dag_cancelled
        || run.last_full.is_none_or(|t| t.elapsed() >= FULL_EVERY);
    let ns = dag.namespace();
    let children: Vec<Arc<Allocation>> = if full {
        run.last_full = Some(Instant::now());
        ctx.allocations.by_owner_uid(uid)
    } else {
        changed
            .iter()
            .filter_map(|n| owned_child(ctx, ns, n, uid))
            .collect()
    };
    let by_name: HashMap<&str, &Arc<Allocation>> =
        children.iter().map(|c| (c.name_any(), c)).collect();
    // A child by name: in a full pass `by_name` has them all; otherwise from the cache.
    let lookup = |name: &str| -> Option<Arc<Allocation>> {
        match by_name.get(name) {
            Some(c) => Some((*c).clone()),
            None if full => None,
            None => owned_child(ctx, ns, name, uid),
        }
    };

    // Feed each child's transitions to the engine, once each. After a restart the engine
    // starts from scratch: children are replayed in passes until nothing more applies (a
    // step's events only apply once its predecessors' have). A step whose child is gone
    // but whose end the Dag's status recorded is replayed from that record.
    let recorded = dag.status.as_ref().map(|s| &s.tasks);
    // Replaying from the record is only needed after a rebuild, or when a child we saw
    // has disappeared; otherwise every step's child is there to be fed.
    let mut check_missing = full && (run.rebuilt || run.seen.len() > children.len());
    run.rebuilt = false;
    loop {
        let mut progress = false;
        for child in &children {
            if let Some(more) = feed(run, child) {
                progress |= more.0;
                actions.extend(more.1);
            }
        }
        if check_missing {
            for (i, task) in dag.spec.allocations.iter().enumerate() {
                if task.spec.task_group.is_some() {
                    continue;
                }
                let name = run.child_names[i].as_str();
                if by_name.contains_key(name) || run.seen.get(name) == Some(&Seen::Done) {
                    continue;
                }
                let released = matches!(
                    run.engine.state(&task.name),
                    Some(StepState::Pending | StepState::Running)
                );
                let outcome =
                    recorded
                        .and_then(|r| r.get(&task.name))
                        .and_then(|t| match t.phase {
                            DagTaskPhase::Completed => Some(Outcome::Succeeded),
                            DagTaskPhase::Failed => Some(Outcome::Failed { exit: 1 }),
                            DagTaskPhase::Cancelled | DagTaskPhase::Skipped => {
                                Some(Outcome::Cancelled)
                            }
                            _ => None,
                        });
                // A released step whose child we saw and that is gone now was deleted: it
                // ended (cancelled), it must not run again.
                let vanished = released && run.seen.contains_key(name);
                let outcome = outcome.or(vanished.then_some(Outcome::Cancelled));
                if let (true, Some(o)) = (released, outcome) {
                    if let Ok(a) = run.engine.on_terminal(&task.name, o, None) {
                        actions.extend(a);
                        let name = name.to_string();
                        run.seen.insert(name, Seen::Done);
                        progress = true;
                    }
                }
            }
        }
        if !progress {
            break;
        }
        check_missing = full;
    }
    for c in &children {
        if !run.seen.contains_key(c.name_any()) {
            run.seen.insert(c.name_any().to_string(), Seen::Created);
        }
    }
    if std::mem::take(&mut run.arm_fail_fast) {
        actions.extend(run.engine.set_failure_policy(DagFailurePolicy::FailFast));
    }
    if dag_cancelled && !run.cancelled {
        actions.extend(run.engine.cancel_dag());
        run.cancelled = true;
    }
    // Task-group elements the engine released are created (creation is idempotent);
    // everything else is made to match the engine's state below.
    let mut released = 0;
    for a in &actions {
        if let DagAction::Release {
            step,
            index: Some(i),
        } = a
        {
            // Released just before the group was stopped (same pass): born cancelled.
            let hold = match run.engine.cancelling(step) {
                Some(r) => Hold::Cancelled(cancel_message(r)),
                None => {
                    released += 1;
                    Hold::Released
                }
            };
            create_step(ctx, dag, step, Some(*i), hold, step_locks(run, step)).await?;
        }
    }
    // Steps that started waiting for a maxParallel slot: their held children say so.
    let parked = run.engine.take_parked();
    // The steps to reconcile: all of them in a full pass, otherwise the changed
    // children's steps, those the engine acted on and those it parked.
    let steps: Option<HashSet<usize>> = (!full).then(|| {
        let named = children
            .iter()
            .filter_map(|c| c.labels().get(DAG_STEP_LABEL))
            .chain(actions.iter().map(|a| match a {
                DagAction::Release { step, .. } | DagAction::Cancel { step, .. } => step,
            }))
            .chain(parked.iter());
        named
            .filter_map(|step| run.step_index.get(step.as_str()).copied())
            .collect()
    });
    released += ensure_children(ctx, dag, run, uid, steps.as_ref(), &lookup).await?;
    // Steps that were running when the engine cancelled them (a fail-fast stop, a DAG
    // cancel): stop them the way a cancelled DAG stops its children; their terminal
    // events then complete the cancellation. A cancelled task group stops its elements.
    let api = ctx.api.within(dag.namespace());
    let mut stop: Vec<(Arc<Allocation>, String)> = Vec::new();
    for a in &actions {
        if let DagAction::Cancel {
            step,
            index,
            reason,
        } = a
        {
            let group = run
                .step_index
                .get(step.as_str())
                .is_some_and(|i| dag.spec.allocations[*i].spec.task_group.is_some());
            if group && index.is_none() {
                for c in ctx.allocations.by_label(DAG_STEP_LABEL, step) {
                    if c.owner_references().iter().any(|o| o.uid == uid) {
                        stop.push((c, cancel_message(reason)));
                    }
                }
            } else if let Some(c) = lookup(child_name(dag, step, *index).as_str()) {
                stop.push((c, cancel_message(reason)));
            }
        }
    }
    // Children that showed up (or changed) while their step is being cancelled, e.g. an
    // element released just before a fail-fast stop, or after a rebuild: stop them too.
    for c in &children {
        if let Some(r) = step_of(c).and_then(|(step, _)| run.engine.cancelling(&step)) {
            stop.push((c.clone(), cancel_message(r)));
        }
    }
    if run.cancelled {
        for c in by_name.values() {
            stop.push(((*c).clone(), cancel_message(&CancelReason::DagCancelled)));
        }
    }
    cancel_children(&api, stop).await?;
    if released > 0 {
        ctx.metrics.dag_releases.inc_by(released);
        ctx.metrics
            .dag_release_latency
            .observe(begun.elapsed().as_secs_f64());
    }
    // The status: at once when the phase changes, otherwise at most every status_every.
    let every = status_every(dag.spec.allocations.len());
    let phase_now = status_phase(run);
    let phase_before = run
        .sent_phase
        .or_else(|| dag.status.as_ref().map(|s| s.phase));
    // The next full pass of a running DAG: its safety net needs a wake-up of its own.
    let until_full = until_full(run.last_full);
    if phase_before == Some(phase_now) {
        if let Some(at) = run.last_status_write {
            let since = at.elapsed();
            if since < every {
                return Ok((false, Some((every - since).min(until_full))));
            }
        }
    }
    let status = status_of(run, dag, &lookup);
    let terminal = matches!(
        status.phase,
        DagPhase::Completed | DagPhase::Failed | DagPhase::Cancelled
    );
    if terminal {
        // The last word: let a background write in flight land first, then write this
        // one here, so a stale Running status can never follow it.
        if let Some(w) = run.writer.take() {
            w.finish().await;
        }
        write_status(ctx, dag, status).await?;
    } else {
        let writer = run
            .writer
            .get_or_insert_with(|| StatusWriter::start(ctx.dags.within(dag.namespace()), dag));
        writer.send(status);
    }
    run.last_status_write = Some(Instant::now());
    run.sent_phase = Some(phase_now);
    Ok((terminal, (!terminal).then_some(until_full)))
}

/// A background task writing a Dag's latest status; values sent while a write is in
/// flight are coalesced into the next one.
struct StatusWriter {
    tx: tokio::sync::watch::Sender<Option<DagStatus>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A run dropped without `finish` (error, leadership lost, Dag deleted) stops its writer
/// at once, so a write of the old run can never land after the rebuilt run's.
impl Drop for StatusWriter {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl StatusWriter {
    fn start(api: Api<Dag>, dag: &Dag) -> Self {
        let (tx, mut rx) = tokio::sync::watch::channel::<Option<DagStatus>>(None);
        let name = dag.name_any().to_string();
        let mut written = dag.status.clone();
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(status) = rx.borrow_and_update().clone() else {
                    continue;
                };
                if written.as_ref() == Some(&status) {
                    continue;
                }
                let patch = match serde_json::to_value(&status) {
                    Ok(v) => Patch::Merge(json!({ "status": v })),
                    Err(e) => {
                        tracing::warn!(dag = %name, error = %e, "DAG status not serializable");
                        continue;
                    }
                };
                match api
                    .patch_status(&name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(_) => written = Some(status),
                    Err(e) if e.is_not_found() => return,
                    // The next status sent (every reconcile of a running DAG sends one)
                    // carries the same or newer content.
                    Err(e) => tracing::debug!(dag = %name, error = %e, "DAG status write failed"),
                }
            }
        });
        StatusWriter {
            tx,
            task: Some(task),
        }
    }

    fn send(&self, status: DagStatus) {
        self.tx.send_replace(Some(status));
    }

    /// Stop after the write in flight (if any); pending values are dropped.
    async fn finish(mut self) {
        self.tx.send_replace(None);
        if let Some(t) = self.task.take() {
            // Ends after the write in flight: the loop sees `None`, then the closed channel.
            let closed = std::mem::replace(&mut self.tx, tokio::sync::watch::channel(None).0);
            drop(closed);
            let _ = t.await;
        }
    }
}

/// Make every child match the engine: a released plain step exists without hold, a
/// waiting one exists held, a cancelled one (or each element of a cancelled task group)
/// is cancelled. Returns how many holds were lifted.
async fn ensure_children(
    ctx: &Ctx,
    dag: &Dag,
    run: &DagRun,
    uid: &str,
    steps: Option<&HashSet<usize>>,
    lookup: &(dyn Fn(&str) -> Option<Arc<Allocation>> + Sync),
) -> Result<u64, anyhow::Error> {
    use futures::future::BoxFuture;
    use futures::{FutureExt, StreamExt};
    let api = ctx.api.within(dag.namespace());
    let mut work: Vec<BoxFuture<'_, Result<u64, anyhow::Error>>> = Vec::new();
    for (i, task) in dag.spec.allocations.iter().enumerate() {
        if steps.is_some_and(|s| !s.contains(&i)) {
            continue;
        }
        let state = run.engine.state(&task.name);
        if task.spec.task_group.is_some() {
            if let Some(StepState::Cancelled { reason }) = state {
                let elements = ctx.allocations.by_label(DAG_STEP_LABEL, &task.name);
                for c in elements
                    .into_iter()
                    .filter(|c| c.owner_references().iter().any(|o| o.uid == uid))
                {
                    let (api, why) = (api.clone(), cancel_message(reason));
                    work.push(async move { cancel_child(&api, &c, &why).await.map(|_| 0) }.boxed());
                }
            }
            continue;
        }
        let name = run.child_names[i].as_str();
        let child = lookup(name);
        let child = child.as_ref();
        // Released but being cancelled (e.g. a fail-fast stop in the same pass): never
        // made schedulable; the cancel completes it.
        let cancelling = run.engine.cancelling(&task.name);
        match state {
            Some(StepState::Pending | StepState::Running) => match child {
                None if !run.seen.contains_key(name) => {
                    let step = task.name.clone();
                    let locks = step_locks(run, &step);
                    let (hold, n) = match cancelling {
                        Some(r) => (Hold::Cancelled(cancel_message(r)), 0),
                        None => (Hold::Released, 1),
                    };
                    work.push(
                        async move {
                            create_step(ctx, dag, &step, None, hold, locks)
                                .await
                                .map(|_| n)
                        }
                        .boxed(),
                    );
                }
                Some(c)
                    if c.metadata.annotations.contains_key(HOLD_ANNOTATION)
                        && cancelling.is_none() =>
                {
                    // One write: lifting the hold is what makes it schedulable. Its stale
                    // pending reason is replaced by the scheduler's (or cleared on binding).
                    let api = api.clone();
                    work.push(
                        async move {
                            let patch = Patch::Merge(
                                json!({"metadata": {"annotations": {HOLD_ANNOTATION: null}}}),
                            );
                            api.patch(name, &PatchParams::default(), &patch).await?;
                            Ok(1)
                        }
                        .boxed(),
                    );
                }
                _ => {}
            },
            // Lock holders are created on release only (see the module docs).
            Some(StepState::Waiting | StepState::Queued)
                if child.is_none()
                    && !run.seen.contains_key(name)
                    && step_locks(run, &task.name).is_empty() =>
            {
                let step = task.name.clone();
                let hold = if run.engine.waiting_for_slot(&step) {
                    Hold::MaxParallel(slot_message(run))
                } else {
                    Hold::Dependencies
                };
                work.push(
                    async move {
                        create_step(ctx, dag, &step, None, hold, Vec::new())
                            .await
                            .map(|_| 0)
                    }
                    .boxed(),
                );
            }
            // Its dependencies came to hold while maxParallel steps were released: its
            // held child says what it waits for now.
            Some(StepState::Queued) if run.engine.waiting_for_slot(&task.name) => {
                let message = slot_message(run);
                let stale = child.is_some_and(|c| {
                    let st = c.status.as_ref();
                    c.metadata.annotations.contains_key(HOLD_ANNOTATION)
                        && !c.phase().is_terminal()
                        && !lifecycle::cancel_requested(c)
                        && (st.and_then(|s| s.reason.as_deref()) != Some(WAITING_FOR_MAX_PARALLEL)
                            || st.and_then(|s| s.message.as_deref()) != Some(message.as_str()))
                });
                if stale {
                    let api = api.clone();
                    work.push(
                        async move {
                            let patch = Patch::Merge(json!({"status": {
                                "reason": WAITING_FOR_MAX_PARALLEL,
                                "message": message,
                            }}));
                            match api
                                .patch_status(name, &PatchParams::default(), &patch)
                                .await
                            {
                                Ok(_) => Ok(0),
                                Err(e) if e.is_not_found() => Ok(0),
                                Err(e) => Err(e.into()),
                            }
                        }
                        .boxed(),
                    );
                }
            }
            Some(StepState::Cancelled { reason }) => {
                if let Some(c) = child {
                    let (api, c, why) = (api.clone(), (*c).clone(), cancel_message(reason));
                    work.push(async move { cancel_child(&api, &c, &why).await.map(|_| 0) }.boxed());
                }
            }
            _ => {}
        }
    }
    // Independent writes: concurrently, so a wide DAG's steps share the store's group
    // commits instead of paying one fsync each.
    let results: Vec<Result<u64, anyhow::Error>> = futures::stream::iter(work)
        .buffer_unordered(16)
        .collect()
        .await;
    let mut released = 0;
    for r in results {
        released += r?;
    }
    Ok(released)
}

async fn cancel_child(
    api: &Api<Allocation>,
    c: &Allocation,
    why: &str,
) -> Result<(), anyhow::Error> {
    if c.phase().is_terminal() || lifecycle::cancel_requested(c) {
        return Ok(());
    }
    let patch = Patch::Merge(json!({"metadata": {"annotations": {
        CANCEL_ANNOTATION: "true",
        CANCEL_REASON_ANNOTATION: why,
    }}}));
    match api
        .patch(c.name_any(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Cancel children (concurrently, each once, with the first reason given for it).
async fn cancel_children(
    api: &Api<Allocation>,
    stop: Vec<(Arc<Allocation>, String)>,
) -> Result<(), anyhow::Error> {
    use futures::StreamExt;
    let mut once = HashSet::new();
    let work: Vec<_> = stop
        .into_iter()
        .filter(|(c, _)| once.insert(c.name_any().to_string()))
        .map(|(c, why)| async move { cancel_child(api, &c, &why).await })
        .collect();
    let results: Vec<Result<(), anyhow::Error>> = futures::stream::iter(work)
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Feed one child's state to the engine. Returns (whether the engine took something,
/// its actions), or `None` for children that are not DAG steps.
fn feed(run: &mut DagRun, child: &Allocation) -> Option<(bool, Vec<DagAction>)> {
    let seen = run
        .seen
        .get(child.name_any())
        .copied()
        .unwrap_or(Seen::Created);
    if seen == Seen::Done {
        return Some((false, Vec::new()));
    }
    // Cheap exits first: most children of a big DAG are held or just queued.
    let phase = child.phase();
    let held = child.metadata.annotations.contains_key(HOLD_ANNOTATION);
    if held && !phase.is_terminal() {
        return Some((false, Vec::new()));
    }
    if seen == Seen::Created && phase == AllocationPhase::Pending {
        return Some((false, Vec::new()));
    }
    let (step, index) = step_of(child)?;
    let name = child.name_any().to_string();
    let requeues = child
        .status
        .as_ref()
        .map(|s| s.requeue_count + s.preemption_count)
        .unwrap_or(0);
    let mut took = false;
    if seen == Seen::Started
        && phase == AllocationPhase::Pending
        && requeues > run.requeues.get(&name).copied().unwrap_or(0)
    {
        if run.engine.on_requeued(&step, index).is_ok() {
            run.requeues.insert(name.clone(), requeues);
            run.seen.insert(name, Seen::Created);
            return Some((true, Vec::new()));
        }
        return Some((false, Vec::new()));
    }
    let running = matches!(
        phase,
        AllocationPhase::Staging | AllocationPhase::Running | AllocationPhase::Checkpointing
    );
    let ended = outcome(child);
    if seen == Seen::Created && !held && (running || ended.is_some()) {
        if run.engine.on_started(&step, index).is_err() {
            // Not released in the engine yet (replay order): a later pass.
            if ended.is_none() || engine_waiting(&run.engine, &step, index) {
                return Some((false, Vec::new()));
            }
        } else {
            run.seen.insert(name.clone(), Seen::Started);
            took = true;
        }
    }
    let mut actions = Vec::new();
    if let Some(o) = ended {
        match run.engine.on_terminal(&step, o, index) {
            Ok(a) => {
                actions = a;
                run.seen.insert(name, Seen::Done);
                took = true;
            }
            Err(e) => {
                tracing::debug!(step, error = %e, "terminal event not applicable yet");
            }
        }
    }
    Some((took, actions))
}

fn engine_waiting(engine: &Engine, step: &str, index: Option<u64>) -> bool {
    index.is_none()
        && matches!(
            engine.state(step),
            Some(StepState::Waiting | StepState::Queued)
        )
}

fn step_spec(dag: &Dag, step: &str) -> Option<lattice_apis::AllocationSpec> {
    let task = dag.spec.allocations.iter().find(|t| t.name == step)?;
    let mut spec = task.spec.clone();
    if let Some(d) = &dag.spec.defaults {
        if spec.vcluster.is_none() {
            spec.vcluster = d.vcluster.clone();
        }
        if spec.project.is_none() {
            spec.project = d.project.clone();
        }
        if let Some(nd) = &d.network_domain {
            let c = spec.connectivity.get_or_insert_with(Default::default);
            if c.network_domain.is_none() {
                c.network_domain = Some(nd.clone());
            }
        }
    }
    spec.depends_on.clear();
    Some(spec)
}

fn child_name(dag: &Dag, step: &str, index: Option<u64>) -> String {
    match index {
        Some(i) => format!("{}-{step}-{i}", dag.name_any()),
        None => format!("{}-{step}", dag.name_any()),
    }
}

/// The locks (`mutex`) a step holds while it runs, as the engine sees them: those it
/// declares, and its own name when another step uses it as a lock.
fn step_locks(run: &DagRun, step: &str) -> Vec<String> {
    let dag = run.engine.dag();
    dag.step_index(step)
        .map(|s| {
            dag.step_mutexes[s]
                .iter()
                .map(|m| dag.mutexes[*m as usize].clone())
                .collect()
        })
        .unwrap_or_default()
}

/// How a step's child is created.
enum Hold {
    /// Released: schedulable at once.
    Released,
    /// Held until its dependencies hold (its status names them).
    Dependencies,
    /// Held: its dependencies hold, but `maxParallel` steps are released (the message).
    MaxParallel(String),
    /// Its step was cancelled (the reason) before the child existed: created held and
    /// cancelled, so that its end reaches the engine.
    Cancelled(String),
}

/// Why a step whose dependencies hold is not released yet.
fn slot_message(run: &DagRun) -> String {
    format!(
        "waiting: maxParallel {} reached ({} steps running or pending)",
        run.engine.policy().max_parallel.unwrap_or_default(),
        run.engine.slots_used()
    )
}

async fn create_step(
    ctx: &Ctx,
    dag: &Dag,
    step: &str,
    index: Option<u64>,
    hold: Hold,
    locks: Vec<String>,
) -> Result<(), anyhow::Error> {
    let Some(mut spec) = step_spec(dag, step) else {
        return Ok(());
    };
    spec.depends_on.extend(
        locks
            .into_iter()
            .map(|l| lattice_apis::Dependency::on(l, lattice_apis::DependencyCondition::Mutex)),
    );
    let name = child_name(dag, step, index);
    let mut meta = ObjectMeta::named(&name, dag.namespace());
    meta.labels
        .insert(DAG_LABEL.into(), dag.name_any().to_string());
    meta.labels.insert(DAG_STEP_LABEL.into(), step.to_string());
    if let Some(i) = index {
        spec = spec.task_element(i);
        meta.labels.insert(
            TASK_GROUP_LABEL.into(),
            format!("{}-{step}", dag.name_any()),
        );
        meta.labels.insert(TASK_INDEX_LABEL.into(), i.to_string());
    }
    for k in [
        lattice_apis::wellknown::USER_ANNOTATION,
        lattice_apis::wellknown::SUBMIT_DIR_ANNOTATION,
    ] {
        if let Some(v) = dag.metadata.annotations.get(k) {
            meta.annotations.insert(k.into(), v.clone());
        }
    }
    if !matches!(hold, Hold::Released) {
        meta.annotations
            .insert(HOLD_ANNOTATION.into(), "dependencies".into());
    }
    if let Hold::Cancelled(why) = &hold {
        meta.annotations
            .insert(CANCEL_ANNOTATION.into(), "true".into());
        meta.annotations
            .insert(CANCEL_REASON_ANNOTATION.into(), why.clone());
    }
    if let Some(owner) = dag.owner_ref(true) {
        meta.owner_references.push(owner);
    }
    let a = Allocation {
        metadata: meta,
        spec,
        ..Default::default()
    };
    let api = ctx.api.within(dag.namespace());
    match api.create(&PostParams::default(), &a).await {
        Ok(_) => {}
        Err(e) if e.is_already_exists() => {
            // Ours (created a moment ago, not cached yet) or a leftover of an earlier Dag
            // with the same name that the garbage collector has not removed yet: then wait.
            let existing = api.get(&name).await?;
            let ours = existing
                .owner_references()
                .iter()
                .any(|o| Some(o.uid.as_str()) == dag.uid());
            if !ours {
                anyhow::bail!("{name} still belongs to an earlier Dag of the same name; waiting for it to be collected");
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    if let Hold::MaxParallel(message) = hold {
        let patch = Patch::Merge(json!({"status": {
            "reason": WAITING_FOR_MAX_PARALLEL,
            "message": message,
        }}));
        api.patch_status(&name, &PatchParams::default(), &patch)
            .await?;
    } else if matches!(hold, Hold::Dependencies) {
        let deps: Vec<String> = dag
            .spec
            .allocations
            .iter()
            .find(|t| t.name == step)
            .map(|t| {
                t.depends_on
                    .iter()
                    .map(|d| format!("{} ({})", d.ref_, d.condition))
                    .collect()
            })
            .unwrap_or_default();
        let patch = Patch::Merge(json!({"status": {
            "reason": lifecycle::reason::WAITING_FOR_DEPENDENCIES,
            "message": format!("waiting for dependencies: {}", deps.join(", ")),
        }}));
        api.patch_status(&name, &PatchParams::default(), &patch)
            .await?;
    }
    Ok(())
}

fn cancel_message(r: &CancelReason) -> String {
    match r {
        CancelReason::DependencyFailed { dependency } => format!("dependency {dependency} failed"),
        CancelReason::DependencyCancelled { dependency } => {
            format!("dependency {dependency} was cancelled")
        }
        CancelReason::ConditionNotMet { dependency } => {
            format!("skipped: its condition on {dependency} can no longer hold")
        }
        CancelReason::CorrespondingElement { dependency, index } => {
            format!("element {index} of {dependency} did not succeed")
        }
        CancelReason::UserRequested => "cancelled by user".into(),
        CancelReason::DagCancelled => "the DAG was cancelled".into(),
        CancelReason::FailFast { failed } => {
            format!("cancelled: step {failed} failed and the DAG's failurePolicy is fail_fast")
        }
    }
}

fn status_of(
    run: &DagRun,
    dag: &Dag,
    lookup: &dyn Fn(&str) -> Option<Arc<Allocation>>,
) -> DagStatus {
    let engine = run.engine.status();
    let mut tasks = BTreeMap::new();
    let mut counts = DagCounts {
        total: engine.counts.total,
        ..Default::default()
    };
    for s in &engine.steps {
        let alloc_name = child_name(dag, &s.name, None);
        // Only running steps show their child's phase and message.
        let child = match s.state {
            StepState::Pending | StepState::Running if s.elements.is_none() => {
                lookup(alloc_name.as_str())
            }
            _ => None,
        };
        let child = child.as_ref();
        let waiting_for_slot = run.engine.waiting_for_slot(&s.name);
        let (phase, reason, message) = match &s.state {
            StepState::Waiting | StepState::Queued if waiting_for_slot => (
                DagTaskPhase::Waiting,
                Some("MaxParallel".to_string()),
                Some(slot_message(run)),
            ),
            StepState::Waiting | StepState::Queued => (DagTaskPhase::Waiting, None, None),
            StepState::Pending | StepState::Running => {
                let p = child.map(|c| c.phase()).unwrap_or(AllocationPhase::Pending);
                let phase = match p {
                    AllocationPhase::Staging => DagTaskPhase::Staging,
                    AllocationPhase::Running => DagTaskPhase::Running,
                    AllocationPhase::Checkpointing => DagTaskPhase::Checkpointing,
                    AllocationPhase::Suspended => DagTaskPhase::Suspended,
                    _ if s.state == StepState::Running => DagTaskPhase::Running,
                    _ => DagTaskPhase::Pending,
                };
                (
                    phase,
                    None,
                    child.and_then(|c| c.status.as_ref()?.message.clone()),
                )
            }
            StepState::Succeeded => (DagTaskPhase::Completed, None, None),
            StepState::Failed { exit } => (
                DagTaskPhase::Failed,
                Some("Failed".to_string()),
                Some(format!("exited with code {exit}")),
            ),
            StepState::Cancelled { reason } => (
                if matches!(reason, CancelReason::ConditionNotMet { .. }) {
                    DagTaskPhase::Skipped
                } else {
                    DagTaskPhase::Cancelled
                },
                Some(reason.code().to_string()),
                Some(cancel_message(reason)),
            ),
        };
        match phase {
            DagTaskPhase::Waiting => counts.waiting += 1,
            DagTaskPhase::Pending | DagTaskPhase::Staging => counts.pending += 1,
            DagTaskPhase::Running | DagTaskPhase::Checkpointing | DagTaskPhase::Suspended => {
                counts.running += 1
            }
            DagTaskPhase::Completed => counts.completed += 1,
            DagTaskPhase::Failed => counts.failed += 1,
            DagTaskPhase::Cancelled => counts.cancelled += 1,
            DagTaskPhase::Skipped => counts.skipped += 1,
        }
        let message = match &s.elements {
            // A task group with nothing in flight, waiting for a maxParallel slot.
            Some(_) if waiting_for_slot => Some(slot_message(run)),
            Some(e) => Some(format!(
                "{} elements: {} completed, {} failed, {} cancelled, {} running, {} pending",
                e.total,
                e.succeeded,
                e.failed,
                e.cancelled,
                e.running,
                e.blocked + e.eligible + e.pending
            )),
            None => message,
        };
        tasks.insert(
            s.name.clone(),
            DagTaskStatus {
                phase,
                allocation: s.elements.is_none().then_some(alloc_name),
                reason,
                message,
                elements: s.elements.as_ref().map(|e| DagTaskElements {
                    total: e.total,
                    waiting: e.blocked + e.eligible,
                    pending: e.pending,
                    running: e.running,
                    completed: e.succeeded,
                    failed: e.failed,
                    cancelled: e.cancelled,
                }),
            },
        );
    }
    let phase = status_phase(run);
    // A cancelled DAG is Cancelled only once its running steps have stopped.
    let settled = counts.pending == 0 && counts.running == 0;
    let phase = if phase == DagPhase::Cancelled && !settled {
        DagPhase::Running
    } else {
        phase
    };
    let terminal = matches!(
        phase,
        DagPhase::Completed | DagPhase::Failed | DagPhase::Cancelled
    );
    let prev = dag.status.clone().unwrap_or_default();
    DagStatus {
        phase,
        tasks,
        counts,
        start_time: run.started_at.or(prev.start_time),
        completion_time: if terminal {
            prev.completion_time.or_else(|| Some(now()))
        } else {
            None
        },
        reason: match phase {
            DagPhase::Failed => Some("StepFailed".into()),
            DagPhase::Cancelled => Some("Cancelled".into()),
            _ => None,
        },
        message: dag_message(run, phase),
        observed_generation: dag.metadata.generation,
        conditions: prev.conditions,
    }
}

/// The Dag's message: the step that made it fail (and a fail-fast stop in progress).
fn dag_message(run: &DagRun, phase: DagPhase) -> Option<String> {
    let failed = |s: &str| match run.engine.state(s) {
        Some(StepState::Failed { exit }) => format!("step {s} failed (exit code {exit})"),
        _ => format!("step {s} failed"),
    };
    match (phase, run.engine.aborted_by()) {
        (DagPhase::Failed, Some(s)) => Some(format!(
            "{}; failurePolicy fail_fast cancelled the steps that had not finished",
            failed(s)
        )),
        (DagPhase::Running, Some(s)) => Some(format!(
            "{}; failurePolicy fail_fast: stopping the steps that have not finished",
            failed(s)
        )),
        (DagPhase::Failed, None) => run.engine.first_failure().map(failed),
        _ => None,
    }
}

async fn write_status(ctx: &Ctx, dag: &Dag, status: DagStatus) -> Result<bool, anyhow::Error> {
    if dag.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    let patch = Patch::Merge(json!({"status": serde_json::to_value(&status)?}));
    ctx.dags
        .within(dag.namespace())
        .patch_status(dag.name_any(), &PatchParams::default(), &patch)
        .await?;
    Ok(true)
}

/// The DAG phase the status would show now (O(1), from the engine; `Cancelled` is
/// shown as Running until the running steps stopped, see `status_of`).
fn status_phase(run: &DagRun) -> DagPhase {
    run.engine.phase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_runtime::informer::InformerEvent;
    use lattice_runtime::reflector;

    fn dag(name: &str, uid: &str) -> Dag {
        let mut d = Dag {
            metadata: ObjectMeta::named(name, Some("t1")),
            ..Default::default()
        };
        d.metadata.uid = Some(uid.into());
        d
    }

    fn step_of_dag(d: &Dag, step: &str) -> Arc<Allocation> {
        let mut a = Allocation {
            metadata: ObjectMeta::named(format!("{}-{step}", d.name_any()), Some("t1")),
            ..Default::default()
        };
        a.metadata.owner_references.extend(d.owner_ref(true));
        Arc::new(a)
    }

    fn noted(dirty: &Mutex<Dirty>) -> (usize, usize) {
        let g = dirty.lock().unwrap();
        (g.names.len(), g.full.len())
    }

    #[test]
    fn step_events_of_gone_dags_note_nothing_and_deleted_dags_are_forgotten() {
        let (cache, mut writer) = reflector::store::<Dag>();
        let live = dag("live", "u-live");
        writer.apply_for_test(live.clone());
        let digests = Mutex::new(HashMap::new());
        let dirty = Mutex::new(Dirty::default());

        // A step of a cached Dag wakes it and is noted.
        let a = step_of_dag(&live, "a");
        let refs = step_event(&digests, &dirty, &cache, &InformerEvent::Applied(a.clone()));
        assert_eq!(refs.len(), 1);
        assert_eq!(noted(&dirty), (1, 0));
        // The same state again is filtered out.
        assert!(
            step_event(&digests, &dirty, &cache, &InformerEvent::Applied(a.clone())).is_empty()
        );
        let refs = step_event(&digests, &dirty, &cache, &InformerEvent::Deleted(a));
        assert_eq!(refs.len(), 1);
        assert_eq!(noted(&dirty), (1, 1));

        // Steps of a Dag that is gone (or a former Dag of the same name) note nothing.
        let gone = dag("gone", "u-gone");
        for ev in [
            InformerEvent::Applied(step_of_dag(&gone, "a")),
            InformerEvent::Deleted(step_of_dag(&gone, "b")),
            InformerEvent::Applied(step_of_dag(&dag("live", "u-old"), "c")),
        ] {
            assert!(step_event(&digests, &dirty, &cache, &ev).is_empty());
        }
        assert_eq!(noted(&dirty), (1, 1));
        assert_eq!(digests.lock().unwrap().len(), 0, "no digest kept for them");

        // Deleting the Dag (the controller's on_deleted hook) drops what was noted.
        Dirty::forget(&dirty, "u-live");
        assert_eq!(noted(&dirty), (0, 0));
        assert_eq!(Dirty::take(&dirty, "u-live"), (false, HashSet::new()));
    }

    #[test]
    fn a_running_dag_comes_back_for_its_next_full_pass() {
        assert_eq!(until_full(None), Duration::from_secs(1));
        let d = until_full(Some(Instant::now()));
        assert!(
            d <= FULL_EVERY && d > FULL_EVERY - Duration::from_secs(5),
            "{d:?}"
        );
        let long_ago = Instant::now().checked_sub(FULL_EVERY * 2);
        if let Some(t) = long_ago {
            assert_eq!(until_full(Some(t)), Duration::from_secs(1));
        }
    }

    #[test]
    fn the_fail_fast_reason_names_the_failed_step() {
        assert_eq!(
            cancel_message(&CancelReason::FailFast {
                failed: "train".into()
            }),
            "cancelled: step train failed and the DAG's failurePolicy is fail_fast"
        );
        assert_eq!(
            CancelReason::FailFast { failed: "x".into() }.code(),
            "FailFast"
        );
    }
}
