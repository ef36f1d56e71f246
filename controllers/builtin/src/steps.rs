//! The step controller: job steps (`lattice launch`, Slurm's `srun` inside an
//! allocation). A step is an Allocation with `spec.stepOf: <allocation>` in the same
//! tenant, owned by that allocation. It is never scheduled: once its allocation is
//! Running, this controller binds the step to the first `resources.nodes` of the
//! allocation's nodes in one guarded write (no node ownership, no quota: the nodes are
//! already the allocation's), and the node agents run it like any allocation (logs,
//! reports, cancellation). The step's walltime is what is left of its allocation's.
//!
//! | situation | what happens |
//! |---|---|
//! | allocation Pending or Staging | the step waits, reason `waiting_for_allocation` |
//! | allocation Running | the step is bound (phase Staging, then Running from the agents) |
//! | allocation ended, deleted, requeued (new attempt) or missing | an unbound step fails (`step_parent_gone`); a bound one is cancelled |
//! | step user ≠ allocation user (`lattice.dev/user`) | the step fails (`step_not_permitted`): a step runs as its allocation's user |
//! | more nodes asked than the allocation has | the step fails (`step_too_large`) |

use std::sync::Arc;
use std::time::Duration;

use lattice_apis::lifecycle::{self, CANCEL_ANNOTATION};
use lattice_apis::meta::{now, set_condition, Condition, ConditionStatus};
use lattice_apis::{Allocation, AllocationPhase, AllocationStatus, NodeCount};
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, HostContext, ResourceExt};
use lattice_store::KvBackend;

use crate::allocations::{CANCEL_REASON_ANNOTATION, USER_ANNOTATION};
use crate::objects::{decode, key_of, read_raw, GuardedWrite};

/// Annotation on a bound step: the attempt of its allocation it was bound to (a requeued
/// allocation's new attempt does not run the old steps).
pub use lattice_apis::wellknown::STEP_PARENT_ATTEMPT_ANNOTATION;

/// Reasons written by this controller.
pub mod reason {
    /// The step waits for its allocation to run.
    pub const WAITING_FOR_ALLOCATION: &str = "waiting_for_allocation";
    /// The allocation is gone, ended or was requeued.
    pub const PARENT_GONE: &str = "step_parent_gone";
    /// The step's user is not the allocation's.
    pub const NOT_PERMITTED: &str = "step_not_permitted";
    /// The step asks for more nodes than the allocation has.
    pub const TOO_LARGE: &str = "step_too_large";
}

struct Ctx {
    backend: Arc<dyn KvBackend>,
    store: Store<Allocation>,
}

/// Register the step controller.
pub fn register(host: &mut lattice_runtime::ControllerHost, backend: Arc<dyn KvBackend>) {
    host.register("steps", move |hc: HostContext| {
        let backend = backend.clone();
        async move {
            let controller = hc.controller::<Allocation>();
            let ctx = Arc::new(Ctx {
                backend,
                store: controller.store(),
            });
            // Steps are owned by their allocation: a step's change also wakes the
            // allocation, and the allocation's reconcile looks at all its steps. Only
            // steps and allocations with steps are reconciled (anything else is a no-op
            // there), so the rest of the allocations need not wake this controller.
            let store = ctx.store.clone();
            controller
                .filter(move |a: &Allocation| a.spec.step_of.is_some() || has_steps(&store, a))
                .owns::<Allocation>()
                .run(reconcile, ctx)
                .await;
        }
    });
}

/// Whether the cache holds a step of `a`.
fn has_steps(store: &Store<Allocation>, a: &Allocation) -> bool {
    a.uid().is_some_and(|uid| {
        store
            .by_owner_uid(uid)
            .iter()
            .any(|s| s.spec.step_of.as_deref() == a.metadata.name.as_deref())
    })
}

fn user_of(a: &Allocation) -> Option<&str> {
    a.metadata
        .annotations
        .get(USER_ANNOTATION)
        .map(String::as_str)
}

/// What a step needs, given its allocation (`None`: missing).
#[derive(Debug, Clone, PartialEq)]
pub enum StepAction {
    /// Nothing to do.
    None,
    /// Keep waiting, with this message.
    Wait(String),
    /// Bind to these nodes, for the allocation's attempt, with this walltime.
    Bind {
        /// The nodes.
        nodes: Vec<String>,
        /// The allocation's attempt.
        parent_attempt: u32,
        /// Seconds left of the allocation's walltime.
        walltime_s: Option<u64>,
    },
    /// Fail the unbound step.
    Fail(&'static str, String),
    /// Cancel the bound step.
    Cancel(String),
}

/// Decide what `step` needs (pure; `now_s` is the current Unix time).
pub fn decide(step: &Allocation, parent: Option<&Allocation>, now_s: i64) -> StepAction {
    let Some(parent_name) = step.spec.step_of.as_deref() else {
        return StepAction::None;
    };
    let st = step.status.as_ref();
    if st.is_some_and(|s| s.phase.is_terminal()) || step.is_deleting() {
        return StepAction::None;
    }
    let bound = st.is_some_and(|s| !s.assigned_nodes.is_empty());
    if bound && lifecycle::cancel_requested(step) {
        return StepAction::None; // already asked; the agents are stopping it
    }
    // An allocation with the same name but another uid is not this step's allocation.
    let parent = parent.filter(|p| {
        step.metadata.owner_references.iter().all(|o| {
            o.kind != "Allocation" || o.name != p.name_any() || Some(o.uid.as_str()) == p.uid()
        })
    });
    let gone = |why: String| {
        if bound {
            StepAction::Cancel(why)
        } else {
            StepAction::Fail(reason::PARENT_GONE, why)
        }
    };
    let Some(parent) = parent else {
        return gone(format!("allocation {parent_name} does not exist"));
    };
    if parent.is_deleting() || lifecycle::cancel_requested(parent) {
        return gone(format!("allocation {parent_name} was cancelled"));
    }
    let pst = parent.status.clone().unwrap_or_default();
    if pst.phase.is_terminal() {
        return gone(format!("allocation {parent_name} ended ({})", pst.phase));
    }
    let recorded_attempt = step
        .metadata
        .annotations
        .get(STEP_PARENT_ATTEMPT_ANNOTATION)
        .and_then(|v| v.parse::<u32>().ok());
    if bound {
        let moved = st.is_some_and(|s| {
            s.assigned_nodes
                .iter()
                .any(|n| !pst.assigned_nodes.contains(n))
        });
        if recorded_attempt.is_some_and(|a| a != pst.attempt) || pst.assigned_nodes.is_empty() {
            return StepAction::Cancel(format!(
                "allocation {parent_name} was requeued; its steps do not follow it"
            ));
        }
        if moved {
            return StepAction::Cancel(format!(
                "allocation {parent_name} gave back a node this step runs on"
            ));
        }
        return StepAction::None;
    }
    // Created for an earlier attempt of the allocation (its script's `srun` before a
    // requeue): the new attempt runs its own steps.
    if recorded_attempt.is_some_and(|a| a != pst.attempt) {
        return gone(format!(
            "allocation {parent_name} was requeued after this step was created; its steps do not follow it"
        ));
    }
    if parent.spec.step_of.is_some() {
        return StepAction::Fail(
            reason::PARENT_GONE,
            format!("{parent_name} is itself a step; run in its allocation"),
        );
    }
    if lifecycle::cancel_requested(step) {
        return StepAction::None; // the allocation controller cancels unbound allocations
    }
    if user_of(step) != user_of(parent) {
        return StepAction::Fail(
            reason::NOT_PERMITTED,
            format!(
                "a step runs as its allocation's user: {parent_name} belongs to {}, this step was submitted by {}",
                user_of(parent).unwrap_or("(no user)"),
                user_of(step).unwrap_or("(no user)")
            ),
        );
    }
    let want = match step.spec.resources.nodes {
        NodeCount::Exact(n) => n as usize,
        NodeCount::Range { min, .. } => min as usize,
    }
    .max(1);
    if want > pst.assigned_nodes.len() && pst.phase == AllocationPhase::Running {
        return StepAction::Fail(
            reason::TOO_LARGE,
            format!(
                "requests {want} node(s) but allocation {parent_name} has {}; ask for at most {}",
                pst.assigned_nodes.len(),
                pst.assigned_nodes.len()
            ),
        );
    }
    if pst.phase != AllocationPhase::Running {
        return StepAction::Wait(format!(
            "waiting for allocation {parent_name} to run (it is {})",
            pst.phase
        ));
    }
    let walltime_s = match (pst.walltime_seconds, pst.start_time) {
        (Some(w), Some(start)) => {
            let end = start
                .timestamp()
                .saturating_add(i64::try_from(w).unwrap_or(i64::MAX));
            Some(u64::try_from(end.saturating_sub(now_s)).unwrap_or(0).max(1))
        }
        (Some(w), None) => Some(w),
        _ => None,
    };
    StepAction::Bind {
        nodes: pst.assigned_nodes[..want].to_vec(),
        parent_attempt: pst.attempt,
        walltime_s,
    }
}

async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, lattice_runtime::Error> {
    let mut retry = false;
    let ns = a.namespace().unwrap_or_default();
    let mut steps: Vec<Arc<Allocation>> = Vec::new();
    if a.spec.step_of.is_some() {
        steps.push(a.clone());
    }
    if let Some(uid) = a.uid() {
        steps.extend(
            ctx.store
                .by_owner_uid(uid)
                .into_iter()
                .filter(|s| s.spec.step_of.as_deref() == a.metadata.name.as_deref()),
        );
    }
    for step in steps {
        let parent_name = step.spec.step_of.clone().unwrap_or_default();
        let parent = ctx
            .store
            .get(&lattice_runtime::ObjectRef::new::<Allocation>(
                Some(ns),
                &parent_name,
            ));
        let action = decide(&step, parent.as_deref(), now().timestamp());
        if action == StepAction::None {
            continue;
        }
        match apply(&ctx, ns, step.name_any(), &parent_name).await {
            Ok(true) => {}
            Ok(false) => retry = true,
            Err(e) => {
                tracing::warn!(step = %step.object_ref(), error = %e, "step update failed");
                retry = true;
            }
        }
    }
    Ok(if retry {
        Action::requeue(Duration::from_millis(200))
    } else {
        Action::await_change()
    })
}

/// The agent address each of `nodes` reported (`""` where none).
async fn agent_addresses(
    backend: &Arc<dyn KvBackend>,
    nodes: &[String],
) -> Result<Vec<String>, crate::objects::TxnError> {
    let keys: Vec<String> = nodes
        .iter()
        .map(|n| key_of::<lattice_apis::Node>(None, n))
        .collect();
    let raw = read_raw(backend, &keys).await?;
    let mut out = Vec::with_capacity(nodes.len());
    for (k, kv) in keys.iter().zip(raw) {
        let addr = decode::<lattice_apis::Node>(k, kv)?
            .and_then(|n| n.obj.status)
            .and_then(|s| s.agent)
            .and_then(|a| a.address)
            .unwrap_or_default();
        out.push(addr);
    }
    Ok(out)
}

/// Read the step and its allocation at one revision, decide again, and write the step.
/// `Ok(false)`: someone wrote first (retry).
async fn apply(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    parent_name: &str,
) -> Result<bool, crate::objects::TxnError> {
    let keys = [
        key_of::<Allocation>(Some(ns), name),
        key_of::<Allocation>(Some(ns), parent_name),
    ];
    let mut raw = read_raw(&ctx.backend, &keys).await?.into_iter();
    let Some(stored) = decode::<Allocation>(&keys[0], raw.next().flatten())? else {
        return Ok(true);
    };
    let parent = decode::<Allocation>(&keys[1], raw.next().flatten())?;
    let t = now();
    let action = decide(&stored.obj, parent.as_ref().map(|p| &p.obj), t.timestamp());
    let addresses = match &action {
        StepAction::Bind { nodes, .. } => agent_addresses(&ctx.backend, nodes).await?,
        _ => Vec::new(),
    };
    let mut step = stored.obj.clone();
    match action {
        StepAction::None => return Ok(true),
        StepAction::Wait(msg) => {
            // Remember which attempt of the allocation the step was made for: a requeue
            // before it binds fails it instead of running it in the next attempt.
            let parent_attempt = parent
                .as_ref()
                .and_then(|p| p.obj.status.as_ref())
                .map_or(0, |s| s.attempt);
            let recorded = step
                .metadata
                .annotations
                .contains_key(STEP_PARENT_ATTEMPT_ANNOTATION);
            if !recorded && parent_attempt > 0 {
                step.metadata.annotations.insert(
                    STEP_PARENT_ATTEMPT_ANNOTATION.into(),
                    parent_attempt.to_string(),
                );
            }
            let st = step.status.get_or_insert_with(AllocationStatus::default);
            if st.reason.as_deref() == Some(reason::WAITING_FOR_ALLOCATION)
                && st.message.as_deref() == Some(msg.as_str())
                && (recorded || parent_attempt == 0)
            {
                return Ok(true);
            }
            st.reason = Some(reason::WAITING_FOR_ALLOCATION.into());
            st.message = Some(msg);
            if st.submit_time.is_none() {
                st.submit_time = step.metadata.creation_timestamp.or(Some(t));
            }
        }
        StepAction::Fail(why, msg) => {
            let st = step.status.get_or_insert_with(AllocationStatus::default);
            st.phase = AllocationPhase::Failed;
            st.reason = Some(why.into());
            st.message = Some(msg);
            st.end_time = Some(t);
            if st.submit_time.is_none() {
                st.submit_time = step.metadata.creation_timestamp.or(Some(t));
            }
        }
        StepAction::Cancel(msg) => {
            let ann = &mut step.metadata.annotations;
            ann.insert(CANCEL_ANNOTATION.into(), "true".into());
            ann.insert(CANCEL_REASON_ANNOTATION.into(), msg);
        }
        StepAction::Bind {
            nodes,
            parent_attempt,
            walltime_s,
        } => {
            let parent_name = parent_name.to_string();
            let st = step.status.get_or_insert_with(AllocationStatus::default);
            st.phase = AllocationPhase::Staging;
            st.assigned_nodes = nodes.clone();
            st.node_addresses = addresses;
            st.attempt += 1;
            st.walltime_seconds = walltime_s;
            st.scheduled_time = Some(t);
            st.node_states.clear();
            st.start_time = None;
            st.end_time = None;
            st.exit_code = None;
            st.signal = None;
            if st.submit_time.is_none() {
                st.submit_time = step.metadata.creation_timestamp.or(Some(t));
            }
            st.reason = None;
            st.message = Some(format!("step of {parent_name} on {}", nodes.join(",")));
            st.observed_generation = step.metadata.generation;
            if let Some(p) = &parent {
                st.topology_groups = p
                    .obj
                    .status
                    .as_ref()
                    .map(|s| s.topology_groups.clone())
                    .unwrap_or_default();
            }
            set_condition(
                &mut st.conditions,
                Condition::new(
                    "Scheduled",
                    ConditionStatus::True,
                    "Step",
                    format!("runs in allocation {parent_name} on {}", nodes.join(",")),
                ),
            );
            step.metadata.annotations.insert(
                STEP_PARENT_ATTEMPT_ANNOTATION.into(),
                parent_attempt.to_string(),
            );
            if !step
                .metadata
                .finalizers
                .iter()
                .any(|f| f == lifecycle::NODES_FINALIZER)
            {
                step.metadata
                    .finalizers
                    .push(lifecycle::NODES_FINALIZER.to_string());
            }
        }
    }
    let mut w = GuardedWrite::new();
    w.put(&stored, &step)?;
    if let Some(p) = &parent {
        w.guard(p);
    }
    let ok = w.commit(&ctx.backend).await?;
    if ok {
        tracing::debug!(step = %format!("{ns}/{name}"), allocation = parent_name, "step updated");
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::meta::OwnerReference;
    use lattice_apis::AllocationSpec;

    fn parent(phase: AllocationPhase, nodes: &[&str]) -> Allocation {
        let mut p = Allocation::new("job", "t", AllocationSpec::default());
        p.metadata.uid = Some("p-uid".into());
        p.metadata
            .annotations
            .insert(USER_ANNOTATION.into(), "alice".into());
        p.status = Some(AllocationStatus {
            phase,
            assigned_nodes: nodes.iter().map(|s| s.to_string()).collect(),
            attempt: 1,
            walltime_seconds: Some(3600),
            start_time: chrono::DateTime::from_timestamp(1000, 0),
            ..Default::default()
        });
        p
    }

    fn step(nodes: u32) -> Allocation {
        let mut s = Allocation::new("job.1", "t", AllocationSpec::default());
        s.spec.step_of = Some("job".into());
        s.spec.resources.nodes = NodeCount::Exact(nodes);
        s.metadata
            .annotations
            .insert(USER_ANNOTATION.into(), "alice".into());
        s.metadata.owner_references.push(OwnerReference {
            api_version: "lattice.dev/v1alpha1".into(),
            kind: "Allocation".into(),
            name: "job".into(),
            uid: "p-uid".into(),
            ..Default::default()
        });
        s
    }

    #[test]
    fn a_step_waits_then_binds_to_the_first_nodes_with_the_walltime_left() {
        let s = step(2);
        let p = parent(AllocationPhase::Staging, &["a", "b", "c"]);
        assert!(matches!(decide(&s, Some(&p), 1100), StepAction::Wait(m) if m.contains("Staging")));
        let p = parent(AllocationPhase::Running, &["a", "b", "c"]);
        assert_eq!(
            decide(&s, Some(&p), 1100),
            StepAction::Bind {
                nodes: vec!["a".into(), "b".into()],
                parent_attempt: 1,
                walltime_s: Some(3500),
            }
        );
    }

    #[test]
    fn a_step_fails_without_its_allocation_or_as_another_user_or_too_large() {
        let s = step(1);
        assert!(matches!(
            decide(&s, None, 0),
            StepAction::Fail(reason::PARENT_GONE, _)
        ));
        let p = parent(AllocationPhase::Completed, &["a"]);
        assert!(
            matches!(decide(&s, Some(&p), 0), StepAction::Fail(reason::PARENT_GONE, m) if m.contains("Completed"))
        );
        let mut p = parent(AllocationPhase::Running, &["a"]);
        p.metadata.uid = Some("other".into());
        assert!(matches!(
            decide(&s, Some(&p), 0),
            StepAction::Fail(reason::PARENT_GONE, _)
        ));
        let mut p = parent(AllocationPhase::Running, &["a"]);
        p.metadata
            .annotations
            .insert(USER_ANNOTATION.into(), "bob".into());
        assert!(
            matches!(decide(&s, Some(&p), 0), StepAction::Fail(reason::NOT_PERMITTED, m) if m.contains("bob") && m.contains("alice"))
        );
        let p = parent(AllocationPhase::Running, &["a"]);
        assert!(
            matches!(decide(&step(3), Some(&p), 0), StepAction::Fail(reason::TOO_LARGE, m) if m.contains("at most 1"))
        );
    }

    #[test]
    fn a_bound_step_is_cancelled_when_its_allocation_ends_or_is_requeued() {
        let mut s = step(1);
        s.status = Some(AllocationStatus {
            phase: AllocationPhase::Running,
            assigned_nodes: vec!["a".into()],
            attempt: 1,
            ..Default::default()
        });
        s.metadata
            .annotations
            .insert(STEP_PARENT_ATTEMPT_ANNOTATION.into(), "1".into());
        let p = parent(AllocationPhase::Running, &["a"]);
        assert_eq!(decide(&s, Some(&p), 0), StepAction::None);
        let mut requeued = p.clone();
        if let Some(st) = requeued.status.as_mut() {
            st.attempt = 2;
        }
        assert!(
            matches!(decide(&s, Some(&requeued), 0), StepAction::Cancel(m) if m.contains("requeued"))
        );
        let done = parent(AllocationPhase::Failed, &["a"]);
        assert!(matches!(decide(&s, Some(&done), 0), StepAction::Cancel(_)));
        assert!(matches!(decide(&s, None, 0), StepAction::Cancel(_)));
        // Already asked to stop: no further writes.
        let mut asked = s.clone();
        asked
            .metadata
            .annotations
            .insert(CANCEL_ANNOTATION.into(), "true".into());
        assert_eq!(decide(&asked, Some(&done), 0), StepAction::None);
        // The allocation gave back the node the step runs on.
        let shrunk = parent(AllocationPhase::Running, &["b"]);
        assert!(
            matches!(decide(&s, Some(&shrunk), 0), StepAction::Cancel(m) if m.contains("gave back"))
        );
        let mut cancelled = p.clone();
        cancelled
            .metadata
            .annotations
            .insert(CANCEL_ANNOTATION.into(), "true".into());
        assert!(matches!(
            decide(&s, Some(&cancelled), 0),
            StepAction::Cancel(_)
        ));
    }
}
