//! The allocation execution contract shared by node agents and controllers
//! (`docs/adr/002-allocation-execution.md`).
//!
//! Who writes what:
//!
//! * the **scheduler** binds: `phase: Staging`, `assignedNodes`, `attempt += 1`,
//!   `walltimeSeconds`, and node ownership, in one store transaction;
//! * each **agent** reports its node's part in `status.nodeStates[node]` with
//!   [`record_node_state`], a read-modify-write guarded by `resourceVersion`, which also
//!   recomputes the allocation's phase ([`aggregate`]) — so the phase is always derived
//!   from the latest reports of every node, never from one agent's partial view;
//! * an agent keeps a process only while [`should_run`] says so (level-triggered: it
//!   stops work whose allocation was cancelled, finished, failed elsewhere, preempted or
//!   re-bound);
//! * the **release** controller frees a node once [`node_released`] holds (and no job
//!   step of the allocation still runs there);
//! * for a **reactive** allocation, the autoscaler writes `status.scale` and, scaling
//!   down, moves the last node of `assignedNodes` to `releasingNodes` (its agent stops
//!   the process and reports; the release controller frees the node once that report is
//!   terminal or the node is Down, and drops it from `releasingNodes` in the same
//!   transaction); scaling up, the scheduler appends a node to `assignedNodes` with its
//!   ownership in one transaction. Reports of releasing nodes are recorded but never
//!   decide the allocation's outcome, though it ends only after they are terminal;
//! * a **job step** (`spec.stepOf`) is bound by the step controller to nodes its
//!   allocation owns, without ownership of its own.
//!
//! Terminal phases (Completed, Failed, Cancelled) are never left: a late report can add
//! its node entry but cannot change the outcome.

use crate::kinds::allocation::{
    Allocation, AllocationPhase, AllocationStatus, NodeTaskPhase, NodeTaskState, RequeuePolicy,
    DEFAULT_MAX_REQUEUE,
};
use crate::meta::{set_condition, Condition, ConditionStatus, Time};

/// Annotation that asks for an allocation (or Dag) to be cancelled; the object is kept.
pub use crate::meta::CANCEL_REQUESTED_ANNOTATION as CANCEL_ANNOTATION;
/// The subresource through which a node's agent reports on an allocation bound to it:
/// `POST .../namespaces/{ns}/allocations/{name}/report` with a [`NodeReport`]. The API
/// server applies [`record_node_state`] to the stored allocation itself, so an agent
/// writes its own report and nothing else of the status.
pub const REPORT_SUBRESOURCE: &str = "report";

/// The body of a report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeReport {
    /// The reporting node (a node's agent may name only itself).
    pub node: String,
    /// The allocation's uid the report is about (a re-created allocation of the same name
    /// is another one: 409).
    pub uid: String,
    /// The report.
    pub report: NodeTaskState,
}

/// Finalizer the scheduler puts on every allocation it binds: a deleted allocation stays
/// (with `deletionTimestamp`, treated as a cancel) until every node it ran on has
/// confirmed that its processes are gone ([`processes_gone`]), so its nodes cannot be
/// handed to someone else while it is still in its SIGTERM grace period.
pub use crate::wellknown::NODES_FINALIZER;
/// Annotation the scheduler sets on a preemption victim (value: the preemptor's name).
pub use crate::wellknown::PREEMPT_ANNOTATION;

/// Allocation `status.reason` codes (the seed's wording, snake_case).
pub mod reason {
    /// All nodes exited 0.
    pub const COMPLETED: &str = "completed";
    /// A node's process exited non-zero.
    pub const NON_ZERO_EXIT: &str = "non_zero_exit";
    /// A node's process was killed by a signal it did not get from us.
    pub const SIGNALED: &str = "signaled";
    /// Walltime ran out: SIGTERM, grace, SIGKILL.
    pub const WALLTIME_EXCEEDED: &str = "walltime_exceeded";
    /// A user cancelled it.
    pub const CANCELLED: &str = "cancelled";
    /// The process could not be started.
    pub const START_FAILED: &str = "start_failed";
    /// Node Down or the agent lost the process.
    pub const NODE_FAILURE: &str = "node_failure";
    /// Put back in the queue after a failure (requeue policy).
    pub const REQUEUED: &str = "requeued";
    /// Stopped to make room for higher-priority work; back in the queue.
    pub const PREEMPTED: &str = "preempted";
    /// Held until its dependencies are satisfied.
    pub const WAITING_FOR_DEPENDENCIES: &str = "waiting_for_dependencies";
    /// A dependency can never be satisfied.
    pub const DEPENDENCY_NEVER_SATISFIED: &str = "dependency_never_satisfied";
    /// A claim of named nodes lost to an earlier claim (`OwnershipConflict`).
    pub const OWNERSHIP_CONFLICT: &str = "ownership_conflict";
    /// A claim of named nodes that can never be granted (unknown node, wrong pool, ...).
    pub const INVALID_CLAIM: &str = "invalid_claim";
    /// The kernel killed a process at the allocation's memory limit.
    pub const OUT_OF_MEMORY: &str = "out_of_memory";
    /// A node refused it: the node's ownership does not name this allocation (the
    /// scheduler did not bind it there).
    pub const NOT_BOUND: &str = "not_bound";
    /// A node refused to run it as the local account it names (no user, an unknown
    /// one, or root / a system account the tenant's `spec.runAs` does not allow).
    pub const NOT_PERMITTED: &str = "not_permitted";
    /// A node could not provide the software environment it asks for (an unknown uenv or
    /// view, an image that fails its checksum, no uenv repository).
    pub const ENVIRONMENT_UNAVAILABLE: &str = "environment_unavailable";
    /// An MPI step's rank aborted or died; the step was torn down on every node.
    pub const MPI_ABORTED: &str = "mpi_aborted";
}

/// Node-entry reason codes (`status.nodeStates[*].reason`).
pub mod node_reason {
    /// Exited 0.
    pub const EXITED: &str = "Exited";
    /// Exited non-zero.
    pub const NON_ZERO_EXIT: &str = "NonZeroExit";
    /// Killed by a signal not sent by the agent.
    pub const SIGNALED: &str = "Signaled";
    /// Killed by the agent when walltime ran out.
    pub const WALLTIME_EXCEEDED: &str = "WalltimeExceeded";
    /// Killed by the agent after a cancel request.
    pub const CANCELLED: &str = "Cancelled";
    /// Killed by the agent for preemption.
    pub const PREEMPTED: &str = "Preempted";
    /// Killed by the agent because the allocation stopped elsewhere (another node failed,
    /// or it finished).
    pub const STOPPED: &str = "Stopped";
    /// The process could not be started.
    pub const START_FAILED: &str = "StartFailed";
    /// The allocation ended before this node started it.
    pub const NOT_STARTED: &str = "NotStarted";
    /// The process died while the agent was down (exit status unknown) or the node was
    /// declared Down.
    pub const LOST: &str = "Lost";
    /// A Slurm-style batch job's script ended on its first node; this (other) node's
    /// holder was stopped. Counts as success.
    pub const BATCH_DONE: &str = "BatchScriptDone";
    /// The kernel's OOM killer ended a process at the allocation's memory limit (the
    /// message gives the limit).
    pub const OUT_OF_MEMORY: &str = "OutOfMemory";
    /// The agent refused to start it: this node's `status.owner` does not name the
    /// allocation (or, for a job step, its allocation, tenant and user). Nothing ran.
    pub const NOT_BOUND: &str = "NotBound";
    /// The agent refused to start it as the local account it names (no user, an unknown
    /// one, or uid 0 / below `--min-uid` without the tenant's `spec.runAs.allowUsers`).
    /// Nothing ran.
    pub const NOT_PERMITTED: &str = "NotPermitted";
    /// An MPI step was torn down because one of its ranks called abort or died inside
    /// MPI, on this node or another (the message says which rank, where and why).
    pub const MPI_ABORTED: &str = "MpiAborted";
    /// The software environment (uenv) could not be provided: nothing ran. Never
    /// requeued: the next node would refuse it for the same reason.
    pub const ENVIRONMENT_UNAVAILABLE: &str = "EnvironmentUnavailable";
}

/// Annotation `"first"`: the script runs on the first assigned node only, as a Slurm
/// batch script does (`sbatch`, or a script with `#SBATCH` directives); the other nodes
/// hold the allocation (for `srun`/`lattice launch` steps) until the script ends.
pub use crate::wellknown::BATCH_HOST_ANNOTATION;

/// Whether `node` is a node of `a` that holds rather than runs the script (see
/// [`BATCH_HOST_ANNOTATION`]).
pub fn batch_secondary(a: &Allocation, node: &str) -> bool {
    a.metadata
        .annotations
        .get(BATCH_HOST_ANNOTATION)
        .is_some_and(|v| v == "first")
        && a.status
            .as_ref()
            .and_then(|s| s.assigned_nodes.first())
            .is_some_and(|first| first != node)
}

/// True when a user asked to cancel the allocation, or deleted it.
pub fn cancel_requested(a: &Allocation) -> bool {
    a.metadata.deletion_timestamp.is_some()
        || a.metadata
            .annotations
            .get(CANCEL_ANNOTATION)
            .is_some_and(|v| v == "true")
}

/// True when no node runs anything of the allocation's current attempt any more: it was
/// never bound, or every assigned node reported a terminal state for this attempt (a
/// node declared Down counts, `node_failed` records it as `Lost`).
pub fn processes_gone(a: &Allocation) -> bool {
    let Some(st) = a.status.as_ref() else {
        return true;
    };
    st.assigned_nodes
        .iter()
        .chain(&st.releasing_nodes)
        .all(|n| {
            st.node_states
                .get(n)
                .is_some_and(|s| s.attempt == st.attempt && s.phase.is_terminal())
        })
}

/// True when the scheduler asked to preempt the allocation.
pub fn preempt_requested(a: &Allocation) -> bool {
    a.metadata.annotations.contains_key(PREEMPT_ANNOTATION)
}

/// What an agent must do with its process for `(allocation, attempt)` on `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunDecision {
    /// Start it (if not started) or keep it running.
    Run,
    /// Stop it (SIGTERM, grace, SIGKILL) and report the given node reason.
    Stop(&'static str),
}

/// Whether `node` should run (or keep running) attempt `attempt` of `a`.
pub fn should_run(a: &Allocation, node: &str, attempt: u32) -> RunDecision {
    let Some(st) = a.status.as_ref() else {
        return RunDecision::Stop(node_reason::STOPPED);
    };
    if st.attempt != attempt || !st.assigned_nodes.iter().any(|n| n == node) {
        return RunDecision::Stop(node_reason::STOPPED);
    }
    if cancel_requested(a) {
        return RunDecision::Stop(node_reason::CANCELLED);
    }
    if st.phase.is_terminal() {
        return RunDecision::Stop(node_reason::STOPPED);
    }
    if preempt_requested(a) {
        return RunDecision::Stop(node_reason::PREEMPTED);
    }
    if !matches!(
        st.phase,
        AllocationPhase::Staging | AllocationPhase::Running | AllocationPhase::Checkpointing
    ) {
        return RunDecision::Stop(node_reason::STOPPED);
    }
    // Only assigned nodes count: a node given back by a scale-down reports its stop too.
    let peer_failed = st.node_states.iter().any(|(n, s)| {
        n != node
            && s.attempt == attempt
            && s.phase == NodeTaskPhase::Failed
            && st.assigned_nodes.contains(n)
    });
    if peer_failed {
        return RunDecision::Stop(node_reason::STOPPED);
    }
    // A batch job's other nodes hold until the script on the first node has ended.
    if batch_secondary(a, node) {
        let host_done = st
            .assigned_nodes
            .first()
            .and_then(|h| st.node_states.get(h))
            .is_some_and(|r| r.attempt == attempt && r.phase.is_terminal());
        if host_done {
            return RunDecision::Stop(node_reason::BATCH_DONE);
        }
    }
    RunDecision::Run
}

/// Record `report` for `node` and recompute the phase. Returns whether anything changed.
///
/// Reports for another attempt are ignored, and a node's terminal report is never
/// replaced (a duplicate completion report changes nothing).
pub fn record_node_state(a: &mut Allocation, node: &str, report: NodeTaskState, now: Time) -> bool {
    let Some(st) = a.status.as_mut() else {
        return false;
    };
    let known = st
        .assigned_nodes
        .iter()
        .chain(&st.releasing_nodes)
        .any(|n| n == node);
    if report.attempt != st.attempt || !known {
        return false;
    }
    if let Some(old) = st.node_states.get(node) {
        if old.attempt == report.attempt && (old.phase.is_terminal() || *old == report) {
            return false;
        }
    }
    st.node_states.insert(node.to_string(), report);
    aggregate(a, now);
    true
}

/// Recompute `status.phase` from the node reports (see the module docs). Never changes a
/// terminal phase.
pub fn aggregate(a: &mut Allocation, now: Time) {
    let cancel = cancel_requested(a);
    let (policy, max_requeue) = requeue_policy(a);
    let Some(st) = a.status.as_mut() else {
        return;
    };
    if st.phase.is_terminal() || st.assigned_nodes.is_empty() {
        return;
    }
    let attempt = st.attempt;
    let reports: Vec<&NodeTaskState> = st
        .assigned_nodes
        .iter()
        .filter_map(|n| st.node_states.get(n))
        .filter(|s| s.attempt == attempt)
        .collect();
    let all_reported = reports.len() == st.assigned_nodes.len();
    // Nodes given back by a scale-down must have confirmed too before the allocation ends
    // (a requeue or a release must not overtake a process still stopping there).
    let released_done = st.releasing_nodes.iter().all(|n| {
        st.node_states
            .get(n)
            .is_some_and(|s| s.attempt == attempt && s.phase.is_terminal())
    });
    let all_terminal =
        all_reported && released_done && reports.iter().all(|s| s.phase.is_terminal());
    let all_started = all_reported && reports.iter().all(|s| s.phase != NodeTaskPhase::Starting);

    if st.phase == AllocationPhase::Staging && all_started {
        st.phase = AllocationPhase::Running;
        st.start_time = reports
            .iter()
            .filter_map(|s| s.start_time)
            .min()
            .or(Some(now));
        st.reason = None;
        st.message = None;
    }

    // The first failure decides the outcome (by end time, then node name for determinism).
    let first_failure = st
        .assigned_nodes
        .iter()
        .filter_map(|n| st.node_states.get(n).map(|s| (n, s)))
        .filter(|(_, s)| s.attempt == attempt && s.phase == NodeTaskPhase::Failed)
        .min_by(|a, b| a.1.end_time.cmp(&b.1.end_time).then(a.0.cmp(b.0)))
        .map(|(n, s)| (n.clone(), s.clone()));

    if cancel {
        if all_terminal {
            finish(
                st,
                AllocationPhase::Cancelled,
                reason::CANCELLED,
                "cancelled by user".into(),
                now,
            );
        }
        return;
    }
    if let Some((node, f)) = first_failure {
        let why = f.reason.as_deref().unwrap_or(node_reason::NON_ZERO_EXIT);
        if why == node_reason::PREEMPTED {
            if all_terminal {
                st.preemption_count += 1;
                requeue(st, reason::PREEMPTED, "preempted; back in the queue".into());
            }
            return;
        }
        let node_side = matches!(why, node_reason::LOST | node_reason::START_FAILED);
        // A refusal would only be refused again: never requeued.
        let refused = matches!(
            why,
            node_reason::NOT_BOUND
                | node_reason::NOT_PERMITTED
                | node_reason::ENVIRONMENT_UNAVAILABLE
        );
        let may_requeue = !refused
            && st.requeue_count < max_requeue
            && match policy {
                RequeuePolicy::Always => true,
                RequeuePolicy::OnNodeFailure => node_side,
                RequeuePolicy::Never => false,
            };
        let (code, msg) = failure_reason(&node, &f);
        st.exit_code = f.exit_code;
        st.signal = f.signal;
        if may_requeue {
            if all_terminal {
                st.requeue_count += 1;
                let msg = format!("{msg}; requeued ({}/{max_requeue})", st.requeue_count);
                requeue(st, reason::REQUEUED, msg);
            }
            return;
        }
        finish(st, AllocationPhase::Failed, code, msg, now);
        return;
    }
    if all_terminal {
        st.exit_code = Some(0);
        st.signal = None;
        finish(
            st,
            AllocationPhase::Completed,
            reason::COMPLETED,
            String::new(),
            now,
        );
    }
}

fn failure_reason(node: &str, f: &NodeTaskState) -> (&'static str, String) {
    let detail = f.message.clone().unwrap_or_default();
    let suffix = if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    };
    match f.reason.as_deref() {
        Some(node_reason::WALLTIME_EXCEEDED) => (
            reason::WALLTIME_EXCEEDED,
            format!("walltime exceeded on {node}{suffix}"),
        ),
        Some(node_reason::START_FAILED) => (
            reason::START_FAILED,
            format!("could not start on {node}{suffix}"),
        ),
        Some(node_reason::LOST) => (reason::NODE_FAILURE, format!("lost on {node}{suffix}")),
        Some(node_reason::OUT_OF_MEMORY) => (
            reason::OUT_OF_MEMORY,
            format!("out of memory on {node}{suffix}"),
        ),
        Some(node_reason::NOT_BOUND) => (reason::NOT_BOUND, format!("refused by {node}{suffix}")),
        Some(node_reason::NOT_PERMITTED) => {
            (reason::NOT_PERMITTED, format!("refused by {node}{suffix}"))
        }
        Some(node_reason::ENVIRONMENT_UNAVAILABLE) => (
            reason::ENVIRONMENT_UNAVAILABLE,
            format!("software environment unavailable on {node}{suffix}"),
        ),
        Some(node_reason::MPI_ABORTED) => (
            reason::MPI_ABORTED,
            format!("MPI step aborted (seen on {node}){suffix}"),
        ),
        Some(node_reason::SIGNALED) => (
            reason::SIGNALED,
            format!(
                "killed by signal {} on {node}{suffix}",
                f.signal.unwrap_or_default()
            ),
        ),
        _ => (
            reason::NON_ZERO_EXIT,
            format!(
                "exited with code {} on {node}{suffix}",
                f.exit_code.unwrap_or_default()
            ),
        ),
    }
}

fn finish(st: &mut AllocationStatus, phase: AllocationPhase, code: &str, msg: String, now: Time) {
    st.phase = phase;
    st.reason = Some(code.to_string());
    st.message = (!msg.is_empty()).then_some(msg);
    st.end_time = Some(now);
}

/// Back to Pending for a new binding; node reports of the old attempt are dropped (the
/// release controller frees nodes whose owner attempt is older than `status.attempt`...
/// or equal with a terminal report — both hold here).
fn requeue(st: &mut AllocationStatus, code: &str, msg: String) {
    st.phase = AllocationPhase::Pending;
    st.reason = Some(code.to_string());
    st.message = Some(msg);
    st.assigned_nodes.clear();
    st.releasing_nodes.clear();
    // Scaling restarts from minNodes when it runs again.
    st.scale = None;
    st.topology_groups.clear();
    st.node_states.clear();
    st.start_time = None;
    st.scheduled_time = None;
    set_condition(
        &mut st.conditions,
        Condition::new("Scheduled", ConditionStatus::False, "Requeued", ""),
    );
}

/// Put a bound allocation back in the queue because `node` failed (node Down). Used by
/// the node lifecycle controller; returns false (and fails the allocation) when the
/// policy or the requeue limit forbids it. Never touches a terminal allocation.
pub fn node_failed(a: &mut Allocation, node: &str, now: Time) -> bool {
    if a.phase().is_terminal() {
        return false;
    }
    let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or(0);
    let report = NodeTaskState {
        phase: NodeTaskPhase::Failed,
        attempt,
        end_time: Some(now),
        reason: Some(node_reason::LOST.into()),
        message: Some(format!("node {node} is Down")),
        ..Default::default()
    };
    let Some(st) = a.status.as_mut() else {
        return false;
    };
    if !st.assigned_nodes.iter().any(|n| n == node) {
        return false;
    }
    // Overwrites a non-terminal report: the node is gone, whatever it said last.
    let prev = st.node_states.insert(node.to_string(), report);
    if let Some(p) = prev.filter(|p| p.attempt == attempt && p.phase.is_terminal()) {
        st.node_states.insert(node.to_string(), p);
        return false;
    }
    // The other nodes' processes are stopped by their agents (peer failed); the
    // requeue waits for their reports, or for them to be declared Down as well.
    aggregate(a, now);
    true
}

/// `(policy, max_requeue)` with defaults applied.
pub fn requeue_policy(a: &Allocation) -> (RequeuePolicy, u32) {
    let r = a.spec.requeue.as_ref();
    (
        r.and_then(|r| r.policy)
            .unwrap_or(RequeuePolicy::OnNodeFailure),
        r.and_then(|r| r.max_requeue).unwrap_or(DEFAULT_MAX_REQUEUE),
    )
}

/// Whether a node owned by attempt `owner_attempt` of `a` (or of a vanished allocation,
/// `None`) may be released. `node_down`: the node is Down (its agent is not coming back
/// soon, so no confirmation will arrive).
pub fn node_released(
    a: Option<&Allocation>,
    node: &str,
    owner_attempt: u32,
    node_down: bool,
) -> bool {
    let Some(a) = a else {
        return true;
    };
    let Some(st) = a.status.as_ref() else {
        return true;
    };
    if st.attempt == owner_attempt && st.releasing_nodes.iter().any(|n| n == node) {
        // Given back by a scale-down: once its agent confirmed the processes are gone.
        return st
            .node_states
            .get(node)
            .is_some_and(|s| s.attempt == owner_attempt && s.phase.is_terminal())
            || node_down;
    }
    if st.attempt != owner_attempt || !st.assigned_nodes.iter().any(|n| n == node) {
        // Re-bound elsewhere or requeued: requeue happens only after every node confirmed.
        return true;
    }
    match st
        .node_states
        .get(node)
        .filter(|s| s.attempt == owner_attempt)
    {
        Some(s) if s.phase.is_terminal() => true,
        // Finished elsewhere: wait for this node's agent to confirm its process is gone,
        // unless the node is Down.
        _ => node_down && st.phase.is_terminal(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::now;

    fn bound(nodes: &[&str]) -> Allocation {
        let mut a = Allocation::default();
        a.metadata.name = Some("a".into());
        a.status = Some(AllocationStatus {
            phase: AllocationPhase::Staging,
            assigned_nodes: nodes.iter().map(|s| s.to_string()).collect(),
            attempt: 1,
            ..Default::default()
        });
        a
    }

    fn report(phase: NodeTaskPhase, exit: Option<i32>, reason: &str) -> NodeTaskState {
        NodeTaskState {
            phase,
            attempt: 1,
            exit_code: exit,
            start_time: Some(now()),
            end_time: phase.is_terminal().then(now),
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn running_when_every_node_started_then_completed() {
        let mut a = bound(&["n1", "n2"]);
        assert!(record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Running, None, ""),
            now()
        ));
        assert_eq!(a.phase(), AllocationPhase::Staging);
        record_node_state(
            &mut a,
            "n2",
            report(NodeTaskPhase::Running, None, ""),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Running);
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Succeeded, Some(0), "Exited"),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Running);
        record_node_state(
            &mut a,
            "n2",
            report(NodeTaskPhase::Succeeded, Some(0), "Exited"),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Completed);
        assert_eq!(a.status.as_ref().unwrap().exit_code, Some(0));
    }

    #[test]
    fn one_failure_fails_at_once_and_stops_peers() {
        let mut a = bound(&["n1", "n2"]);
        a.spec.requeue = Some(crate::Requeue {
            policy: Some(RequeuePolicy::Never),
            max_requeue: None,
        });
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Running, None, ""),
            now(),
        );
        record_node_state(
            &mut a,
            "n2",
            report(NodeTaskPhase::Running, None, ""),
            now(),
        );
        assert_eq!(should_run(&a, "n2", 1), RunDecision::Run);
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Failed, Some(3), "NonZeroExit"),
            now(),
        );
        let st = a.status.as_ref().unwrap();
        assert_eq!(st.phase, AllocationPhase::Failed);
        assert_eq!(st.exit_code, Some(3));
        assert_eq!(st.reason.as_deref(), Some(reason::NON_ZERO_EXIT));
        assert_eq!(
            should_run(&a, "n2", 1),
            RunDecision::Stop(node_reason::STOPPED)
        );
        // n2 still owned until it confirms.
        assert!(!node_released(Some(&a), "n2", 1, false));
        assert!(node_released(Some(&a), "n1", 1, false));
        // A late report is recorded but the outcome stays.
        record_node_state(
            &mut a,
            "n2",
            report(NodeTaskPhase::Succeeded, Some(0), "Exited"),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Failed);
        assert!(node_released(Some(&a), "n2", 1, false));
    }

    #[test]
    fn always_policy_requeues_after_all_nodes_confirm() {
        let mut a = bound(&["n1", "n2"]);
        a.spec.requeue = Some(crate::Requeue {
            policy: Some(RequeuePolicy::Always),
            max_requeue: Some(1),
        });
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Failed, Some(1), "NonZeroExit"),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Staging, "waits for n2");
        record_node_state(
            &mut a,
            "n2",
            report(NodeTaskPhase::Failed, None, "Stopped"),
            now(),
        );
        let st = a.status.as_ref().unwrap();
        assert_eq!(st.phase, AllocationPhase::Pending);
        assert_eq!(st.requeue_count, 1);
        assert!(st.assigned_nodes.is_empty());
        // Second failure exhausts the limit.
        let mut b = a.clone();
        let st = b.status.as_mut().unwrap();
        st.phase = AllocationPhase::Staging;
        st.attempt = 2;
        st.assigned_nodes = vec!["n3".into()];
        let mut r = report(NodeTaskPhase::Failed, Some(1), "NonZeroExit");
        r.attempt = 2;
        record_node_state(&mut b, "n3", r, now());
        assert_eq!(b.phase(), AllocationPhase::Failed);
    }

    #[test]
    fn cancel_and_walltime_reasons() {
        let mut a = bound(&["n1"]);
        a.metadata
            .annotations
            .insert(CANCEL_ANNOTATION.into(), "true".into());
        assert_eq!(
            should_run(&a, "n1", 1),
            RunDecision::Stop(node_reason::CANCELLED)
        );
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Failed, None, "Cancelled"),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Cancelled);
        assert_eq!(
            a.status.as_ref().unwrap().reason.as_deref(),
            Some("cancelled")
        );

        let mut w = bound(&["n1"]);
        w.spec.requeue = Some(crate::Requeue {
            policy: Some(RequeuePolicy::OnNodeFailure),
            max_requeue: None,
        });
        record_node_state(
            &mut w,
            "n1",
            report(NodeTaskPhase::Failed, None, "WalltimeExceeded"),
            now(),
        );
        assert_eq!(w.phase(), AllocationPhase::Failed);
        assert_eq!(
            w.status.as_ref().unwrap().reason.as_deref(),
            Some("walltime_exceeded")
        );
    }

    #[test]
    fn stale_attempts_and_duplicates_are_ignored() {
        let mut a = bound(&["n1"]);
        let mut old = report(NodeTaskPhase::Failed, Some(1), "NonZeroExit");
        old.attempt = 0;
        assert!(!record_node_state(&mut a, "n1", old, now()));
        assert!(record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Succeeded, Some(0), "Exited"),
            now()
        ));
        assert!(!record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Failed, Some(9), "NonZeroExit"),
            now()
        ));
        assert_eq!(a.phase(), AllocationPhase::Completed);
        assert_eq!(
            should_run(&a, "n1", 0),
            RunDecision::Stop(node_reason::STOPPED)
        );
    }

    #[test]
    fn node_down_requeues_under_on_node_failure() {
        let mut a = bound(&["n1"]);
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Running, None, ""),
            now(),
        );
        assert!(node_failed(&mut a, "n1", now()));
        let st = a.status.as_ref().unwrap();
        assert_eq!(st.phase, AllocationPhase::Pending);
        assert_eq!(st.requeue_count, 1);
        let mut n = bound(&["n1"]);
        n.spec.requeue = Some(crate::Requeue {
            policy: Some(RequeuePolicy::Never),
            max_requeue: None,
        });
        node_failed(&mut n, "n1", now());
        assert_eq!(n.phase(), AllocationPhase::Failed);
        assert_eq!(
            n.status.as_ref().unwrap().reason.as_deref(),
            Some("node_failure")
        );
    }

    #[test]
    fn a_node_given_back_by_a_scale_down_stops_alone_and_is_released_after_confirming() {
        let mut a = bound(&["n1", "n2", "n3"]);
        for n in ["n1", "n2", "n3"] {
            assert!(record_node_state(
                &mut a,
                n,
                report(NodeTaskPhase::Running, None, ""),
                now()
            ));
        }
        assert_eq!(a.phase(), AllocationPhase::Running);
        // The autoscaler gives n3 back.
        if let Some(st) = a.status.as_mut() {
            st.assigned_nodes.retain(|n| n != "n3");
            st.releasing_nodes.push("n3".into());
        }
        assert_eq!(
            should_run(&a, "n3", 1),
            RunDecision::Stop(node_reason::STOPPED)
        );
        assert_eq!(should_run(&a, "n1", 1), RunDecision::Run);
        assert!(
            !node_released(Some(&a), "n3", 1, false),
            "not before its agent confirmed"
        );
        assert!(
            node_released(Some(&a), "n3", 1, true),
            "unless the node is Down"
        );
        // Its stop report is recorded but neither fails nor stops the others.
        let stopped = report(NodeTaskPhase::Failed, None, node_reason::STOPPED);
        assert!(record_node_state(&mut a, "n3", stopped, now()));
        assert_eq!(a.phase(), AllocationPhase::Running);
        assert_eq!(should_run(&a, "n1", 1), RunDecision::Run);
        assert!(node_released(Some(&a), "n3", 1, false));
        assert!(!node_released(Some(&a), "n1", 1, false));
        // A scale-up node joins a running allocation without changing its phase.
        if let Some(st) = a.status.as_mut() {
            st.assigned_nodes.push("n4".into());
        }
        assert_eq!(should_run(&a, "n4", 1), RunDecision::Run);
        assert_eq!(a.phase(), AllocationPhase::Running);
        assert!(!processes_gone(&a));
    }

    #[test]
    fn the_allocation_ends_only_after_released_nodes_confirmed() {
        let mut a = bound(&["n1", "n2"]);
        for n in ["n1", "n2"] {
            record_node_state(&mut a, n, report(NodeTaskPhase::Running, None, ""), now());
        }
        if let Some(st) = a.status.as_mut() {
            st.assigned_nodes.retain(|n| n != "n2");
            st.releasing_nodes.push("n2".into());
        }
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Succeeded, Some(0), ""),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Running, "n2 is still stopping");
        let stopped = report(NodeTaskPhase::Failed, None, node_reason::STOPPED);
        record_node_state(&mut a, "n2", stopped, now());
        assert_eq!(
            a.phase(),
            AllocationPhase::Completed,
            "n2's stop is not a failure"
        );
        assert!(processes_gone(&a));
    }

    #[test]
    fn a_batch_jobs_other_nodes_hold_until_the_script_ends_on_the_first() {
        let mut a = bound(&["n1", "n2"]);
        a.metadata
            .annotations
            .insert(BATCH_HOST_ANNOTATION.into(), "first".into());
        assert!(!batch_secondary(&a, "n1"));
        assert!(batch_secondary(&a, "n2"));
        for n in ["n1", "n2"] {
            record_node_state(&mut a, n, report(NodeTaskPhase::Running, None, ""), now());
        }
        assert_eq!(should_run(&a, "n2", 1), RunDecision::Run);
        record_node_state(
            &mut a,
            "n1",
            report(NodeTaskPhase::Succeeded, Some(0), ""),
            now(),
        );
        assert_eq!(
            should_run(&a, "n2", 1),
            RunDecision::Stop(node_reason::BATCH_DONE)
        );
        assert_eq!(a.phase(), AllocationPhase::Running, "n2 still holds");
        record_node_state(
            &mut a,
            "n2",
            report(NodeTaskPhase::Succeeded, Some(0), node_reason::BATCH_DONE),
            now(),
        );
        assert_eq!(a.phase(), AllocationPhase::Completed);
    }

    #[test]
    fn out_of_memory_and_refusals_show_in_the_allocation() {
        let mut a = bound(&["n1"]);
        let mut r = report(NodeTaskPhase::Failed, None, node_reason::OUT_OF_MEMORY);
        r.signal = Some(9);
        r.message = Some("killed at the memory limit of 256 MiB".into());
        record_node_state(&mut a, "n1", r, now());
        let st = a.status.as_ref().unwrap();
        assert_eq!(a.phase(), AllocationPhase::Failed);
        assert_eq!(st.reason.as_deref(), Some(reason::OUT_OF_MEMORY));
        assert_eq!(
            st.message.as_deref(),
            Some("out of memory on n1: killed at the memory limit of 256 MiB")
        );

        // A refusal is never requeued, whatever the policy.
        for (why, code) in [
            (node_reason::NOT_BOUND, reason::NOT_BOUND),
            (node_reason::NOT_PERMITTED, reason::NOT_PERMITTED),
        ] {
            let mut a = bound(&["n1"]);
            a.spec.requeue = Some(crate::Requeue {
                policy: Some(RequeuePolicy::Always),
                max_requeue: Some(5),
            });
            let mut r = report(NodeTaskPhase::Failed, None, why);
            r.message = Some("nothing ran".into());
            record_node_state(&mut a, "n1", r, now());
            let st = a.status.as_ref().unwrap();
            assert_eq!(a.phase(), AllocationPhase::Failed, "{why}");
            assert_eq!(st.reason.as_deref(), Some(code));
            assert_eq!(st.message.as_deref(), Some("refused by n1: nothing ran"));
            assert_eq!(st.requeue_count, 0);
        }
    }
}
