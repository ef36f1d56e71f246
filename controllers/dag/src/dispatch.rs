//! The event-driven DAG dispatch engine.
//!
//! Modelled on fan-in/fan-out dispatch: every step keeps counters of the
//! incoming edges still outstanding; when a step reaches a terminal state
//! only its *outgoing* edges are evaluated (no rescans of the DAG), each
//! either decrementing a successor's counter (possibly releasing it) or
//! poisoning it (cancelling it, which cascades through a worklist).
//!
//! Edge semantics, per predecessor outcome:
//!
//! | condition | Succeeded | Failed | Cancelled |
//! |---|---|---|---|
//! | `success` | satisfied | successor cancelled | successor cancelled |
//! | `any` | satisfied | satisfied | satisfied |
//! | `failure` | not met | satisfied | not met |
//! | `corresponding` | element N satisfied | element N cancelled | element N cancelled |
//!
//! `success` and `any` edges must all hold (AND). The `failure` edges of one
//! step are alternatives (a failure handler): the step runs as soon as any
//! one of its `failure` predecessors fails, and is skipped once none of them
//! can fail any more. This is what makes the seed's example work:
//! `notify_failure` (`train: failure`, `evaluate: failure`) runs if train or
//! evaluate fails. `mutex` is not an edge: holders of the same mutex name
//! are released one at a time, in the order they became ready.
//!
//! A [`Policy`] adds two DAG-wide rules (`spec.failurePolicy`, `spec.maxParallel`):
//!
//! * `fail_fast`: the first step that fails with no `failure`/`any` edge to catch
//!   it (a failure that makes the DAG end `Failed`) cancels every step that has
//!   not finished, with [`CancelReason::FailFast`] naming it; nothing is released
//!   afterwards and the DAG still ends `Failed`. A task group aborts on its first
//!   failed element. `propagate` (default) lets unrelated branches run on.
//! * `max_parallel: N`: at most N steps are released (pending or running) at
//!   once. Further steps whose dependencies hold wait in state `Queued`
//!   ([`Engine::waiting_for_slot`]) and are released in definition order as
//!   released steps finish. A task group takes one slot while it has elements
//!   in flight (its own concurrency limits the elements). A mutex holder takes
//!   its mutex before its slot and a slot holder never waits for a mutex, so
//!   the two limits cannot deadlock each other.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::deps::Condition;
use crate::graph::{DagDef, ValidatedDag};
use crate::taskgroup::{TaskGroupError, TaskGroupRun, TaskGroupStatus};
use crate::Outcome;

/// Why a step (or element) was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum CancelReason {
    /// A `success` dependency failed.
    DependencyFailed {
        /// The predecessor.
        dependency: String,
    },
    /// A `success`/`failure` dependency was cancelled (never ran or was killed).
    DependencyCancelled {
        /// The predecessor.
        dependency: String,
    },
    /// None of the `failure` dependencies failed (the step is skipped).
    ConditionNotMet {
        /// The last predecessor that resolved.
        dependency: String,
    },
    /// The corresponding element of a predecessor task group did not succeed.
    CorrespondingElement {
        /// The predecessor.
        dependency: String,
        /// The array index.
        index: u64,
    },
    /// A user cancelled this step.
    UserRequested,
    /// The whole DAG was cancelled.
    DagCancelled,
    /// `failurePolicy: fail_fast`: a step failed with nothing to catch it, and
    /// every step that had not finished was cancelled.
    FailFast {
        /// The step whose failure stopped the DAG.
        failed: String,
    },
}

impl CancelReason {
    /// CamelCase reason string (for status `reason` fields).
    pub fn code(&self) -> &'static str {
        match self {
            Self::DependencyFailed { .. } => "DependencyFailed",
            Self::DependencyCancelled { .. } => "DependencyCancelled",
            Self::ConditionNotMet { .. } => "ConditionNotMet",
            Self::CorrespondingElement { .. } => "CorrespondingElementNotSucceeded",
            Self::UserRequested => "UserRequested",
            Self::DagCancelled => "DagCancelled",
            Self::FailFast { .. } => "FailFast",
        }
    }
}

/// What the controller must do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Action {
    /// Create the allocation (or task-group element `index`) and queue it.
    Release {
        /// Step name.
        step: String,
        /// Task-group element, `None` for plain steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u64>,
    },
    /// Cancel the step (or element): kill it if it runs, else record it as
    /// cancelled without ever creating it.
    Cancel {
        /// Step name.
        step: String,
        /// Task-group element, `None` for the whole step.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u64>,
        /// Why.
        reason: CancelReason,
    },
}

/// State of one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum StepState {
    /// Dependencies not satisfied yet.
    Waiting,
    /// Dependencies hold; waiting for a mutex.
    Queued,
    /// Released (allocation created and queued, or requeued).
    Pending,
    /// Running (for task groups: at least one element released).
    Running,
    /// Exit 0 (all elements, for task groups).
    Succeeded,
    /// Non-zero exit (some element, for task groups).
    Failed {
        /// Exit code (first failing element for task groups).
        exit: i32,
    },
    /// Cancelled.
    Cancelled {
        /// Why.
        reason: CancelReason,
    },
}

impl StepState {
    /// Succeeded, Failed or Cancelled.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed { .. } | Self::Cancelled { .. }
        )
    }
    /// Phase name in the types crate's vocabulary (`Skipped` for steps whose
    /// `failure` condition was not met).
    pub fn phase_name(&self) -> &'static str {
        match self {
            Self::Waiting | Self::Queued => "Waiting",
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Completed",
            Self::Failed { .. } => "Failed",
            Self::Cancelled {
                reason: CancelReason::ConditionNotMet { .. },
            } => "Skipped",
            Self::Cancelled { .. } => "Cancelled",
        }
    }
}

/// Overall DAG phase: the API's ([`lattice_apis::DagPhase`]). The engine reports
/// `Running` while some step is waiting, pending or running; `Completed` when every step
/// is terminal and no failure went uncaught; `Failed` when a step failed with no
/// outgoing `failure`/`any` edge to catch it; `Cancelled` after `cancel_dag`. It never
/// reports `Pending` (that is the status of a Dag no engine has started).
pub use lattice_apis::DagPhase;

/// What happens to the rest of the DAG when a step fails with nothing to catch it: the
/// API's `spec.failurePolicy` ([`lattice_apis::DagFailurePolicy`]). `Propagate`
/// (default): the edge rules only, the failed step's `success` successors are
/// cancelled, unrelated branches run on. `FailFast`: cancel every step that has not
/// finished as soon as one fails uncaught.
pub use lattice_apis::DagFailurePolicy as FailurePolicy;

/// DAG-wide dispatch rules (`spec.failurePolicy`, `spec.maxParallel`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// `propagate` (default) or `fail_fast`.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Most steps released (pending or running) at once; `None`: no limit.
    /// `Some(0)` is treated as 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
}

impl Policy {
    /// The policy a parsed DAG asks for (`failurePolicy`, `maxParallel` of its
    /// spec; admission validates them, values that do not parse are ignored).
    pub fn from_def(def: &DagDef) -> Self {
        let failure_policy = match def.extra.get("failurePolicy").and_then(|v| v.as_str()) {
            Some("fail_fast" | "failFast" | "fail-fast") => FailurePolicy::FailFast,
            _ => FailurePolicy::Propagate,
        };
        let max_parallel = def
            .extra
            .get("maxParallel")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0);
        Self {
            failure_policy,
            max_parallel,
        }
    }
}

/// Errors for events that do not fit the DAG's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// No such step.
    #[error("no step named {0:?} in this DAG")]
    UnknownStep(String),
    /// The step was never released.
    #[error("step {0:?} was never released; only released steps can start, be requeued or finish")]
    NotReleased(String),
    /// A task-group event without an index.
    #[error("step {0:?} is a task group; events must name the element index")]
    IndexRequired(String),
    /// An index on a plain step.
    #[error("step {0:?} is not a task group; events must not carry an index")]
    UnexpectedIndex(String),
    /// Task-group element error.
    #[error("step {step:?}: {error}")]
    TaskGroup {
        /// Step name.
        step: String,
        /// The error.
        error: TaskGroupError,
    },
}

/// Per-step status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    /// Step name.
    pub name: String,
    /// State.
    pub state: StepState,
    /// Element counts for task groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<TaskGroupStatus>,
}

/// Step counts by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepCounts {
    /// All steps.
    pub total: u32,
    /// Waiting for dependencies or a mutex.
    pub waiting: u32,
    /// Released, not running.
    pub pending: u32,
    /// Running.
    pub running: u32,
    /// Succeeded.
    pub succeeded: u32,
    /// Failed.
    pub failed: u32,
    /// Cancelled (excluding skipped).
    pub cancelled: u32,
    /// Skipped (`failure` condition not met).
    pub skipped: u32,
}

/// Aggregated DAG status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DagStatus {
    /// Overall phase.
    pub phase: DagPhase,
    /// Per-step states, in declaration order.
    pub steps: Vec<StepStatus>,
    /// Counts.
    pub counts: StepCounts,
}

#[derive(Debug, Clone)]
struct StepRt {
    state: StepState,
    /// Outstanding `success`/`any` edges.
    and_remaining: u32,
    /// Number of `failure` edges, and how many resolved without failing.
    or_total: u32,
    or_negative: u32,
    or_satisfied: bool,
    group: Option<TaskGroupRun>,
    /// Per element: outstanding corresponding predecessors.
    corr_remaining: Vec<u32>,
    holds_mutexes: bool,
    /// Queued on its mutexes.
    waiting_mutex: bool,
    stop_pumping: bool,
    /// Outgoing edges already evaluated (guards duplicate work items).
    propagated: bool,
    /// Reason recorded for a cancellation that completes later.
    pending_reason: Option<CancelReason>,
    /// Holds one of the `max_parallel` slots.
    holds_slot: bool,
    /// Queued for a `max_parallel` slot.
    waiting_slot: bool,
}

/// The dispatch engine for one DAG.
#[derive(Debug, Clone)]
pub struct Engine {
    dag: Arc<ValidatedDag>,
    steps: Vec<StepRt>,
    /// True when a `failure`/`any` edge leaves the step.
    catches: Vec<bool>,
    mutex_holder: Vec<Option<u32>>,
    mutex_waiters: Vec<VecDeque<u32>>,
    dag_cancelled: bool,
    started: bool,
    terminal: usize,
    uncaught_failures: usize,
    policy: Policy,
    /// The first step that failed with nothing to catch it.
    first_failure: Option<u32>,
    /// The step whose failure stopped the DAG (`fail_fast`).
    aborted_by: Option<u32>,
    /// `max_parallel` slots in use.
    slots_used: u32,
    /// Steps waiting for a slot, served in definition order (lowest index first).
    slot_waiters: BTreeSet<u32>,
    /// Steps that started waiting for a slot since [`Engine::take_parked`].
    parked: Vec<u32>,
    // Scratch buffers reused between events.
    work: Vec<(u32, Outcome)>,
}

impl Engine {
    /// Build an engine with the default [`Policy`] (`propagate`, no parallelism
    /// limit); nothing is released until [`start`](Self::start).
    pub fn new(dag: impl Into<Arc<ValidatedDag>>) -> Self {
        Self::with_policy(dag, Policy::default())
    }

    /// Build an engine following `policy`; nothing is released until
    /// [`start`](Self::start).
    pub fn with_policy(dag: impl Into<Arc<ValidatedDag>>, policy: Policy) -> Self {
        let dag: Arc<ValidatedDag> = dag.into();
        let policy = Policy {
            max_parallel: policy.max_parallel.map(|n| n.max(1)),
            ..policy
        };
        let n = dag.len();
        let mut steps: Vec<StepRt> = (0..n)
            .map(|i| {
                let group = dag.groups[i].as_ref().map(TaskGroupRun::new);
                let corr = group.as_ref().map_or(0, TaskGroupRun::len);
                StepRt {
                    state: StepState::Waiting,
                    and_remaining: 0,
                    or_total: 0,
                    or_negative: 0,
                    or_satisfied: false,
                    group,
                    corr_remaining: vec![0; if dag.groups[i].is_some() { corr } else { 0 }],
                    holds_mutexes: false,
                    waiting_mutex: false,
                    stop_pumping: false,
                    propagated: false,
                    pending_reason: None,
                    holds_slot: false,
                    waiting_slot: false,
                }
            })
            .collect();
        let mut catches = vec![false; n];
        for e in &dag.edges {
            let to = e.to as usize;
            match e.condition {
                Condition::Success | Condition::Any => steps[to].and_remaining += 1,
                Condition::Failure => steps[to].or_total += 1,
                Condition::Corresponding => {
                    if let (Some(pg), Some(sg)) = (&dag.groups[e.from as usize], &dag.groups[to]) {
                        for (pos, idx) in sg.indices.iter().enumerate() {
                            if pg.position(*idx).is_some() {
                                steps[to].corr_remaining[pos] += 1;
                            }
                        }
                    }
                }
                Condition::Mutex | Condition::Started => {}
            }
            if matches!(e.condition, Condition::Failure | Condition::Any) {
                catches[e.from as usize] = true;
            }
        }
        let m = dag.mutexes.len();
        Self {
            dag,
            steps,
            catches,
            mutex_holder: vec![None; m],
            mutex_waiters: vec![VecDeque::new(); m],
            dag_cancelled: false,
            started: false,
            terminal: 0,
            uncaught_failures: 0,
            policy,
            first_failure: None,
            aborted_by: None,
            slots_used: 0,
            slot_waiters: BTreeSet::new(),
            parked: Vec::new(),
            work: Vec::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Change the failure policy. Switching to `fail_fast` after a step already
    /// failed uncaught stops the DAG now (returns the cancellations). A controller
    /// that rebuilds an engine by replaying recorded events replays under
    /// `propagate` and switches afterwards, so the replay order cannot cancel
    /// steps that had in fact finished.
    pub fn set_failure_policy(&mut self, failure_policy: FailurePolicy) -> Vec<Action> {
        self.policy.failure_policy = failure_policy;
        let mut actions = Vec::new();
        if failure_policy == FailurePolicy::FailFast {
            if let Some(f) = self.first_failure {
                self.abort(f as usize, &mut actions);
                self.drain(&mut actions);
            }
        }
        actions
    }

    /// The DAG this engine runs.
    pub fn dag(&self) -> &ValidatedDag {
        &self.dag
    }

    /// Release the roots (steps with no `success`/`any`/`failure` edges).
    /// Idempotent: a second call returns no actions.
    pub fn start(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.started {
            return actions;
        }
        self.started = true;
        for s in 0..self.steps.len() {
            let st = &self.steps[s];
            if st.state == StepState::Waiting && st.and_remaining == 0 && st.or_total == 0 {
                self.open_gate(s, &mut actions);
            }
        }
        self.drain(&mut actions);
        actions
    }

    fn idx(&self, step: &str) -> Result<usize, DispatchError> {
        self.dag
            .step_index(step)
            .ok_or_else(|| DispatchError::UnknownStep(step.to_string()))
    }

    fn name(&self, s: usize) -> String {
        self.dag.names[s].clone()
    }

    /// A released step (or element) started running. A plain step still waiting
    /// for a `max_parallel` slot (its dependencies hold) is taken as released: the
    /// record says it ran, e.g. when a controller replays events in another order
    /// than they happened. It takes a slot even if that exceeds the limit for a while.
    pub fn on_started(&mut self, step: &str, index: Option<u64>) -> Result<(), DispatchError> {
        let s = self.idx(step)?;
        self.check_index(s, index)?;
        if self.steps[s].group.is_none()
            && self.steps[s].waiting_slot
            && self.steps[s].state == StepState::Queued
        {
            let st = &mut self.steps[s];
            st.waiting_slot = false;
            st.holds_slot = true;
            st.state = StepState::Running;
            self.slots_used += 1;
            self.slot_waiters.remove(&(s as u32));
            return Ok(());
        }
        let st = &mut self.steps[s];
        match (&mut st.group, index) {
            (Some(g), Some(i)) => {
                g.started(i).map_err(|error| DispatchError::TaskGroup {
                    step: step.to_string(),
                    error,
                })?;
                if st.state == StepState::Pending {
                    st.state = StepState::Running;
                }
                Ok(())
            }
            _ => match st.state {
                StepState::Pending | StepState::Running => {
                    st.state = StepState::Running;
                    Ok(())
                }
                ref s if s.is_terminal() => Ok(()),
                _ => Err(DispatchError::NotReleased(step.to_string())),
            },
        }
    }

    /// A running step (or element) was requeued (e.g. node failure with a
    /// requeue policy): it goes back to pending and its successors stay blocked.
    pub fn on_requeued(&mut self, step: &str, index: Option<u64>) -> Result<(), DispatchError> {
        let s = self.idx(step)?;
        self.check_index(s, index)?;
        let st = &mut self.steps[s];
        match (&mut st.group, index) {
            (Some(g), Some(i)) => g.requeued(i).map_err(|error| DispatchError::TaskGroup {
                step: step.to_string(),
                error,
            }),
            _ => match st.state {
                StepState::Pending | StepState::Running => {
                    st.state = StepState::Pending;
                    Ok(())
                }
                ref s if s.is_terminal() => Ok(()),
                _ => Err(DispatchError::NotReleased(step.to_string())),
            },
        }
    }

    fn check_index(&self, s: usize, index: Option<u64>) -> Result<(), DispatchError> {
        match (self.steps[s].group.is_some(), index) {
            (true, None) => Err(DispatchError::IndexRequired(self.name(s))),
            (false, Some(_)) => Err(DispatchError::UnexpectedIndex(self.name(s))),
            _ => Ok(()),
        }
    }

    /// A released step (or task-group element) reached a terminal state.
    /// Returns the steps/elements to release and to cancel. Duplicate
    /// reports are ignored. Cost: proportional to the outgoing edges of the
    /// steps that finish (plus cascades), never to the size of the DAG.
    pub fn on_terminal(
        &mut self,
        step: &str,
        outcome: Outcome,
        index: Option<u64>,
    ) -> Result<Vec<Action>, DispatchError> {
        let s = self.idx(step)?;
        self.check_index(s, index)?;
        let mut actions = Vec::new();
        match index {
            None => match self.steps[s].state {
                StepState::Pending | StepState::Running => self.work.push((s as u32, outcome)),
                ref st if st.is_terminal() => return Ok(actions),
                _ => return Err(DispatchError::NotReleased(step.to_string())),
            },
            Some(i) => {
                let Some(g) = self.steps[s].group.as_mut() else {
                    return Err(DispatchError::UnexpectedIndex(step.to_string()));
                };
                let fresh = g
                    .finished(i, outcome)
                    .map_err(|error| DispatchError::TaskGroup {
                        step: step.to_string(),
                        error,
                    })?;
                if !fresh {
                    return Ok(actions);
                }
                self.element_done(s, i, outcome, &mut actions);
                if matches!(outcome, Outcome::Failed { .. }) && !self.catches[s] {
                    // The group will end Failed with nothing to catch it.
                    self.first_failure.get_or_insert(s as u32);
                    if self.policy.failure_policy == FailurePolicy::FailFast {
                        self.abort(s, &mut actions);
                    }
                }
                self.pump(s, &mut actions);
                self.settle_group(s, &mut actions);
                self.check_group_done(s);
            }
        }
        self.drain(&mut actions);
        Ok(actions)
    }

    /// Cancel one step at a user's request: a waiting step is cancelled now
    /// (cascading), a running one gets a `Cancel` action and finishes when
    /// its terminal event arrives.
    pub fn cancel_step(&mut self, step: &str) -> Result<Vec<Action>, DispatchError> {
        let s = self.idx(step)?;
        let mut actions = Vec::new();
        self.cancel_one(s, CancelReason::UserRequested, &mut actions);
        self.drain(&mut actions);
        Ok(actions)
    }

    /// Cancel the whole DAG: nothing is released afterwards.
    pub fn cancel_dag(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.dag_cancelled {
            return actions;
        }
        self.dag_cancelled = true;
        for s in 0..self.steps.len() {
            self.cancel_one(s, CancelReason::DagCancelled, &mut actions);
        }
        self.drain(&mut actions);
        actions
    }

    fn cancel_one(&mut self, s: usize, reason: CancelReason, actions: &mut Vec<Action>) {
        match self.steps[s].state {
            StepState::Waiting | StepState::Queued => self.cancel_waiting(s, reason, actions),
            StepState::Pending | StepState::Running => {
                let name = self.name(s);
                let st = &mut self.steps[s];
                st.stop_pumping = true;
                st.pending_reason.get_or_insert_with(|| reason.clone());
                if let Some(g) = st.group.as_mut() {
                    let mut cancelled = Vec::new();
                    for pos in 0..g.len() {
                        if g.cancel_unreleased(pos) {
                            if let Some(i) = g.index_at(pos) {
                                cancelled.push(i);
                            }
                        }
                    }
                    actions.push(Action::Cancel {
                        step: name.clone(),
                        index: None,
                        reason: reason.clone(),
                    });
                    for i in cancelled {
                        self.element_done(s, i, Outcome::Cancelled, actions);
                    }
                    self.check_group_done(s);
                } else {
                    actions.push(Action::Cancel {
                        step: name,
                        index: None,
                        reason,
                    });
                }
            }
            _ => {}
        }
    }

    /// Cancel a step that never ran; queue its edges for propagation.
    fn cancel_waiting(&mut self, s: usize, reason: CancelReason, actions: &mut Vec<Action>) {
        if self.steps[s].state.is_terminal() {
            return;
        }
        actions.push(Action::Cancel {
            step: self.name(s),
            index: None,
            reason: reason.clone(),
        });
        let mut cancelled = Vec::new();
        if let Some(g) = self.steps[s].group.as_mut() {
            for pos in 0..g.len() {
                if g.cancel_unreleased(pos) {
                    if let Some(i) = g.index_at(pos) {
                        cancelled.push(i);
                    }
                }
            }
        }
        for i in cancelled {
            self.corr_propagate(s, i, Outcome::Cancelled, actions);
        }
        self.finish(s, StepState::Cancelled { reason });
        self.work.push((s as u32, Outcome::Cancelled));
    }

    /// Mark a step terminal and update aggregate counters (no propagation).
    fn finish(&mut self, s: usize, state: StepState) {
        if self.steps[s].state.is_terminal() {
            return;
        }
        if matches!(state, StepState::Failed { .. }) && !self.catches[s] {
            self.uncaught_failures += 1;
            self.first_failure.get_or_insert(s as u32);
        }
        self.steps[s].state = state;
        self.terminal += 1;
    }

    /// A task-group element finished: propagate along corresponding edges.
    fn element_done(&mut self, s: usize, index: u64, outcome: Outcome, actions: &mut Vec<Action>) {
        self.corr_propagate(s, index, outcome, actions);
    }

    /// Propagate element `index` of `s` along corresponding edges (worklist).
    fn corr_propagate(
        &mut self,
        s: usize,
        index: u64,
        outcome: Outcome,
        actions: &mut Vec<Action>,
    ) {
        let dag = Arc::clone(&self.dag);
        let mut stack: Vec<(usize, Outcome)> = vec![(s, outcome)];
        while let Some((from, out)) = stack.pop() {
            for &eid in dag.outgoing(from) {
                let e = dag.edges[eid as usize];
                if e.condition != Condition::Corresponding {
                    continue;
                }
                let to = e.to as usize;
                let Some(pos) = self.steps[to]
                    .group
                    .as_ref()
                    .and_then(|g| g.position(index))
                else {
                    continue;
                };
                if out == Outcome::Succeeded {
                    let st = &mut self.steps[to];
                    st.corr_remaining[pos] = st.corr_remaining[pos].saturating_sub(1);
                    if st.corr_remaining[pos] == 0
                        && matches!(st.state, StepState::Pending | StepState::Running)
                        && !st.stop_pumping
                    {
                        if let Some(g) = st.group.as_mut() {
                            g.make_eligible(pos);
                        }
                        self.pump(to, actions);
                    }
                } else {
                    let changed = self.steps[to]
                        .group
                        .as_mut()
                        .is_some_and(|g| g.cancel_unreleased(pos));
                    if changed {
                        self.steps[to].pending_reason.get_or_insert_with(|| {
                            CancelReason::CorrespondingElement {
                                dependency: dag.names[from].clone(),
                                index,
                            }
                        });
                        actions.push(Action::Cancel {
                            step: dag.names[to].clone(),
                            index: Some(index),
                            reason: CancelReason::CorrespondingElement {
                                dependency: dag.names[from].clone(),
                                index,
                            },
                        });
                        stack.push((to, Outcome::Cancelled));
                        self.check_group_done(to);
                    }
                }
            }
        }
    }

    /// If every element of group step `s` is terminal, finish the step.
    fn check_group_done(&mut self, s: usize) {
        let st = &self.steps[s];
        if st.state.is_terminal() {
            return;
        }
        let Some(outcome) = st.group.as_ref().and_then(TaskGroupRun::outcome) else {
            return;
        };
        self.work.push((s as u32, outcome));
    }

    /// Release up to `concurrency` eligible elements of group step `s`.
    /// A task group holds its mutexes only while it has elements in flight,
    /// so a group waiting for corresponding elements never blocks others.
    fn pump(&mut self, s: usize, actions: &mut Vec<Action>) {
        if self.steps[s].stop_pumping || self.halted() {
            return;
        }
        let has_eligible = self.steps[s]
            .group
            .as_ref()
            .is_some_and(TaskGroupRun::has_eligible);
        let dag = Arc::clone(&self.dag);
        if has_eligible
            && !dag.step_mutexes[s].is_empty()
            && !self.steps[s].holds_mutexes
            && !self.try_acquire(s)
        {
            return;
        }
        // The slot after the mutexes: a slot holder never waits for a mutex.
        if has_eligible && !self.try_slot(s) {
            return;
        }
        let st = &mut self.steps[s];
        if let Some(g) = st.group.as_mut() {
            for i in g.pump() {
                actions.push(Action::Release {
                    step: self.dag.names[s].clone(),
                    index: Some(i),
                });
            }
        }
    }

    /// Take all of `s`'s mutexes if they are free, else queue on them.
    fn try_acquire(&mut self, s: usize) -> bool {
        let dag = Arc::clone(&self.dag);
        let ms = &dag.step_mutexes[s];
        if ms.iter().all(|m| self.mutex_holder[*m as usize].is_none()) {
            for m in ms {
                self.mutex_holder[*m as usize] = Some(s as u32);
            }
            self.steps[s].holds_mutexes = true;
            self.steps[s].waiting_mutex = false;
            true
        } else {
            if !std::mem::replace(&mut self.steps[s].waiting_mutex, true) {
                for m in ms {
                    self.mutex_waiters[*m as usize].push_back(s as u32);
                }
            }
            false
        }
    }

    /// All dependencies of `s` hold: release it (plain steps first acquire
    /// their mutexes or queue on them).
    fn open_gate(&mut self, s: usize, actions: &mut Vec<Action>) {
        if let Some(reason) = self.halt_reason() {
            self.cancel_waiting(s, reason, actions);
            return;
        }
        if self.steps[s].group.is_some() {
            self.release(s, actions);
        } else if self.dag.step_mutexes[s].is_empty() || self.try_acquire(s) {
            self.admit(s, actions);
        } else {
            self.steps[s].state = StepState::Queued;
        }
    }

    /// A plain step whose dependencies and mutexes hold: release it if a
    /// `max_parallel` slot is free, else queue it for one.
    fn admit(&mut self, s: usize, actions: &mut Vec<Action>) {
        if self.try_slot(s) {
            self.release(s, actions);
        } else {
            self.steps[s].state = StepState::Queued;
        }
    }

    /// Take a `max_parallel` slot for `s` (always succeeds without a limit), or
    /// queue `s` for one.
    fn try_slot(&mut self, s: usize) -> bool {
        let Some(max) = self.policy.max_parallel else {
            return true;
        };
        let st = &mut self.steps[s];
        if st.holds_slot {
            return true;
        }
        // Waiters exist only while every slot is taken (a freed slot goes to
        // them at once), so a free slot never jumps the queue.
        if self.slots_used < max {
            self.slots_used += 1;
            st.holds_slot = true;
            st.waiting_slot = false;
            return true;
        }
        if !std::mem::replace(&mut st.waiting_slot, true) {
            self.slot_waiters.insert(s as u32);
            self.parked.push(s as u32);
        }
        false
    }

    /// Give back `s`'s slot (if it holds one) and hand free slots to the waiters.
    fn release_slot(&mut self, s: usize, actions: &mut Vec<Action>) {
        if !std::mem::take(&mut self.steps[s].holds_slot) {
            return;
        }
        self.slots_used = self.slots_used.saturating_sub(1);
        self.grant_slots(actions);
    }

    /// Serve the slot waiters, lowest step index first, while slots are free.
    fn grant_slots(&mut self, actions: &mut Vec<Action>) {
        let Some(max) = self.policy.max_parallel else {
            return;
        };
        while self.slots_used < max {
            let Some(w) = self.slot_waiters.pop_first() else {
                break;
            };
            let w = w as usize;
            let st = &mut self.steps[w];
            if !std::mem::take(&mut st.waiting_slot) || st.state.is_terminal() {
                continue;
            }
            let plain = st.group.is_none();
            if plain {
                if let Some(reason) = self.halt_reason() {
                    self.cancel_waiting(w, reason, actions);
                    continue;
                }
                self.steps[w].holds_slot = true;
                self.slots_used += 1;
                self.release(w, actions);
            } else {
                st.holds_slot = true;
                self.slots_used += 1;
                self.pump(w, actions);
                // Nothing went out (its mutex is taken, or nothing is eligible any
                // more): the slot goes to the next waiter, without recursion.
                let idle = self.steps[w]
                    .group
                    .as_ref()
                    .is_some_and(|g| g.in_flight() == 0);
                if idle && std::mem::take(&mut self.steps[w].holds_slot) {
                    self.slots_used -= 1;
                }
            }
        }
    }

    fn release(&mut self, s: usize, actions: &mut Vec<Action>) {
        let st = &mut self.steps[s];
        st.state = StepState::Pending;
        match st.group.as_mut() {
            None => actions.push(Action::Release {
                step: self.dag.names[s].clone(),
                index: None,
            }),
            Some(g) => {
                for pos in 0..g.len() {
                    if st.corr_remaining[pos] == 0 {
                        g.make_eligible(pos);
                    }
                }
                self.pump(s, actions);
                self.check_group_done(s);
            }
        }
    }

    /// A task group with nothing in flight gives its mutexes and its slot back.
    fn settle_group(&mut self, s: usize, actions: &mut Vec<Action>) {
        let idle = self.steps[s]
            .group
            .as_ref()
            .is_some_and(|g| g.in_flight() == 0);
        if idle {
            if self.steps[s].holds_mutexes {
                self.release_mutexes(s, actions);
            }
            self.release_slot(s, actions);
        }
    }

    fn release_mutexes(&mut self, s: usize, actions: &mut Vec<Action>) {
        if !std::mem::take(&mut self.steps[s].holds_mutexes) {
            return;
        }
        let dag = Arc::clone(&self.dag);
        for &m in &dag.step_mutexes[s] {
            if self.mutex_holder[m as usize] == Some(s as u32) {
                self.mutex_holder[m as usize] = None;
            }
        }
        for &m in &dag.step_mutexes[s] {
            while let Some(&w) = self.mutex_waiters[m as usize].front() {
                let w = w as usize;
                if !self.steps[w].waiting_mutex || self.steps[w].state.is_terminal() {
                    self.mutex_waiters[m as usize].pop_front();
                    continue;
                }
                if dag.step_mutexes[w]
                    .iter()
                    .all(|x| self.mutex_holder[*x as usize].is_none())
                {
                    self.mutex_waiters[m as usize].pop_front();
                    for x in &dag.step_mutexes[w] {
                        self.mutex_holder[*x as usize] = Some(w as u32);
                    }
                    self.steps[w].holds_mutexes = true;
                    self.steps[w].waiting_mutex = false;
                    if let Some(reason) = self.halt_reason() {
                        self.cancel_waiting(w, reason, actions);
                    } else if self.steps[w].group.is_some() {
                        self.pump(w, actions);
                        self.settle_group(w, actions);
                    } else {
                        self.admit(w, actions);
                    }
                }
                break;
            }
        }
    }

    /// Propagate terminal steps along their outgoing edges until quiet.
    fn drain(&mut self, actions: &mut Vec<Action>) {
        let dag = Arc::clone(&self.dag);
        while let Some((s, outcome)) = self.work.pop() {
            let s = s as usize;
            if std::mem::replace(&mut self.steps[s].propagated, true) {
                continue;
            }
            let state = match outcome {
                Outcome::Succeeded => StepState::Succeeded,
                Outcome::Failed { exit } => StepState::Failed { exit },
                Outcome::Cancelled => match &self.steps[s].state {
                    StepState::Cancelled { reason } => StepState::Cancelled {
                        reason: reason.clone(),
                    },
                    _ => StepState::Cancelled {
                        reason: self.group_cancel_reason(s),
                    },
                },
            };
            self.finish(s, state);
            self.release_mutexes(s, actions);
            self.release_slot(s, actions);
            let from = &dag.names[s];
            for &eid in dag.outgoing(s) {
                let e = dag.edges[eid as usize];
                let to = e.to as usize;
                if self.steps[to].state != StepState::Waiting {
                    continue;
                }
                let dep = || from.clone();
                let verdict: Option<Result<(), CancelReason>> = match (e.condition, outcome) {
                    (Condition::Success, Outcome::Succeeded) | (Condition::Any, _) => {
                        self.steps[to].and_remaining -= 1;
                        Some(Ok(()))
                    }
                    (Condition::Success, Outcome::Failed { .. }) => {
                        Some(Err(CancelReason::DependencyFailed { dependency: dep() }))
                    }
                    (Condition::Success, Outcome::Cancelled) => {
                        Some(Err(CancelReason::DependencyCancelled { dependency: dep() }))
                    }
                    (Condition::Failure, Outcome::Failed { .. }) => {
                        self.steps[to].or_satisfied = true;
                        Some(Ok(()))
                    }
                    (Condition::Failure, _) => {
                        let st = &mut self.steps[to];
                        st.or_negative += 1;
                        if st.or_negative == st.or_total && !st.or_satisfied {
                            Some(Err(match outcome {
                                Outcome::Cancelled => {
                                    CancelReason::DependencyCancelled { dependency: dep() }
                                }
                                _ => CancelReason::ConditionNotMet { dependency: dep() },
                            }))
                        } else {
                            Some(Ok(()))
                        }
                    }
                    _ => None,
                };
                match verdict {
                    Some(Ok(())) => {
                        let st = &self.steps[to];
                        if st.and_remaining == 0 && (st.or_total == 0 || st.or_satisfied) {
                            self.open_gate(to, actions);
                        }
                    }
                    Some(Err(reason)) => self.cancel_waiting(to, reason, actions),
                    None => {}
                }
            }
            // After its own edges (its direct successors name it as the failed
            // dependency), a fail-fast failure stops everything else.
            if matches!(outcome, Outcome::Failed { .. })
                && !self.catches[s]
                && self.policy.failure_policy == FailurePolicy::FailFast
            {
                self.abort(s, actions);
            }
        }
    }

    /// `fail_fast`: cancel every step that has not finished because `s` failed
    /// (once; the caller drains). O(steps), at most once per DAG.
    fn abort(&mut self, s: usize, actions: &mut Vec<Action>) {
        if self.aborted_by.is_some() || self.dag_cancelled {
            return;
        }
        self.aborted_by = Some(s as u32);
        let reason = CancelReason::FailFast {
            failed: self.name(s),
        };
        for t in 0..self.steps.len() {
            self.cancel_one(t, reason.clone(), actions);
        }
    }

    /// Why nothing may be released any more, if so.
    fn halt_reason(&self) -> Option<CancelReason> {
        if self.dag_cancelled {
            Some(CancelReason::DagCancelled)
        } else {
            self.aborted_by.map(|s| CancelReason::FailFast {
                failed: self.name(s as usize),
            })
        }
    }

    fn halted(&self) -> bool {
        self.dag_cancelled || self.aborted_by.is_some()
    }

    fn group_cancel_reason(&self, s: usize) -> CancelReason {
        match &self.steps[s].pending_reason {
            Some(r) => r.clone(),
            None => self.halt_reason().unwrap_or(CancelReason::UserRequested),
        }
    }

    /// State of one step.
    pub fn state(&self, step: &str) -> Option<&StepState> {
        self.dag.step_index(step).map(|s| &self.steps[s].state)
    }

    /// True while `step` waits for a `max_parallel` slot (its dependencies and
    /// mutexes hold). For a plain step its state is then `Queued`.
    pub fn waiting_for_slot(&self, step: &str) -> bool {
        self.dag
            .step_index(step)
            .is_some_and(|s| self.steps[s].waiting_slot && !self.steps[s].state.is_terminal())
    }

    /// `max_parallel` slots in use: released plain steps not yet terminal, and task
    /// groups with elements in flight. Never more than the limit, except for
    /// steps [`on_started`](Self::on_started) took as released while they waited.
    pub fn slots_used(&self) -> u32 {
        self.slots_used
    }

    /// Steps that started waiting for a `max_parallel` slot since the last call, in
    /// the order they did (for a controller that shows why they wait).
    pub fn take_parked(&mut self) -> Vec<String> {
        std::mem::take(&mut self.parked)
            .into_iter()
            .map(|s| self.name(s as usize))
            .collect()
    }

    /// Why a step that has not finished yet is being cancelled (a `Cancel` action
    /// went out for it and its terminal event is awaited), if it is.
    pub fn cancelling(&self, step: &str) -> Option<&CancelReason> {
        let st = &self.steps[self.dag.step_index(step)?];
        if st.state.is_terminal() || !st.stop_pumping {
            return None;
        }
        st.pending_reason.as_ref()
    }

    /// The first step that failed with no `failure`/`any` edge to catch it (what
    /// makes the DAG end `Failed`).
    pub fn first_failure(&self) -> Option<&str> {
        self.first_failure
            .map(|s| self.dag.names[s as usize].as_str())
    }

    /// The step whose failure stopped the DAG under `fail_fast`, once it has.
    pub fn aborted_by(&self) -> Option<&str> {
        self.aborted_by.map(|s| self.dag.names[s as usize].as_str())
    }

    /// Element counts of a task-group step.
    pub fn group_status(&self, step: &str) -> Option<TaskGroupStatus> {
        let s = self.dag.step_index(step)?;
        self.steps[s].group.as_ref().map(TaskGroupRun::status)
    }

    /// Overall phase in O(1).
    pub fn phase(&self) -> DagPhase {
        if self.dag_cancelled {
            DagPhase::Cancelled
        } else if self.terminal < self.steps.len() {
            DagPhase::Running
        } else if self.uncaught_failures > 0 {
            DagPhase::Failed
        } else {
            DagPhase::Completed
        }
    }

    /// Full status: phase, per-step states and counts.
    pub fn status(&self) -> DagStatus {
        let mut counts = StepCounts {
            total: u32::try_from(self.steps.len()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        let steps = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, st)| {
                match &st.state {
                    StepState::Waiting | StepState::Queued => counts.waiting += 1,
                    StepState::Pending => counts.pending += 1,
                    StepState::Running => counts.running += 1,
                    StepState::Succeeded => counts.succeeded += 1,
                    StepState::Failed { .. } => counts.failed += 1,
                    StepState::Cancelled {
                        reason: CancelReason::ConditionNotMet { .. },
                    } => counts.skipped += 1,
                    StepState::Cancelled { .. } => counts.cancelled += 1,
                }
                StepStatus {
                    name: self.dag.names[i].clone(),
                    state: st.state.clone(),
                    elements: st.group.as_ref().map(TaskGroupRun::status),
                }
            })
            .collect();
        DagStatus {
            phase: self.phase(),
            steps,
            counts,
        }
    }

    /// Step names by state, for quick inspection in tests and tools.
    pub fn states(&self) -> HashMap<String, StepState> {
        self.dag
            .names
            .iter()
            .cloned()
            .zip(self.steps.iter().map(|s| s.state.clone()))
            .collect()
    }
}
