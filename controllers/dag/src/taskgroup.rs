//! Task groups (job arrays): their ranges (the API's grammar, with `%LIMIT`) and lazy
//! element release so that at most `concurrency` elements are pending-or-running.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use lattice_apis::syntax::tasks::{
    parse_range_with_limit, RangeError, RangeErrorKind, MAX_TASK_INDEX,
};

use crate::deps::ParseError;
use crate::Outcome;

/// Default upper bound on elements in one task group (the API's [`lattice_apis::wellknown::MAX_TASKS`]).
pub const DEFAULT_MAX_ELEMENTS: usize = lattice_apis::wellknown::MAX_TASKS as usize;

/// A parsed task group: sorted, de-duplicated indices and an optional limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskGroupSpec {
    /// Element indices (the values of `$LATTICE_TASK_INDEX`), ascending.
    pub indices: Vec<u64>,
    /// Most elements pending-or-running at once (`%N`); `None` = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

impl TaskGroupSpec {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    /// True when the group has no elements (never produced by the parser).
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// Position of array index `index`, if it is an element.
    pub fn position(&self, index: u64) -> Option<usize> {
        self.indices.binary_search(&index).ok()
    }
}

/// Parse `0-99`, `0-99%20`, `1,3,5-9:2`, `0-15:4%2` with the default size limit.
pub fn parse_task_group(input: &str) -> Result<TaskGroupSpec, ParseError> {
    parse_task_group_with_limit(input, DEFAULT_MAX_ELEMENTS)
}

/// Parse a task-group range (the grammar of [`lattice_apis::syntax::tasks`], with its
/// `%LIMIT`), rejecting groups with more than `max_elements`. Errors point at the column.
pub fn parse_task_group_with_limit(
    input: &str,
    max_elements: usize,
) -> Result<TaskGroupSpec, ParseError> {
    let limit = u64::try_from(max_elements).unwrap_or(u64::MAX);
    let (range, concurrency) =
        parse_range_with_limit(input, limit).map_err(|e| range_error(input, e, max_elements))?;
    Ok(TaskGroupSpec {
        indices: range.indices(),
        concurrency,
    })
}

/// A range error in the DAG core's words, at its column.
fn range_error(input: &str, e: RangeError, max_elements: usize) -> ParseError {
    const WHAT: &str = "task group range";
    const SYNTAX: &str = "use START-END (0-99), START-END:STEP (0-15:4), a comma list (1,3,5-9) \
                          and optionally %LIMIT (0-99%20)";
    let (message, hint): (String, String) = match &e.kind {
        RangeErrorKind::Empty => ("is empty".into(), SYNTAX.into()),
        RangeErrorKind::EmptyEntry => ("empty range entry".into(), "remove the extra ','".into()),
        RangeErrorKind::LimitNotAllowed | RangeErrorKind::BadLimit => (
            format!("invalid concurrency limit {:?}", e.entry),
            "write %N with N a positive integer, e.g. 0-99%20".into(),
        ),
        RangeErrorKind::ZeroLimit => (
            "concurrency limit must be at least 1".into(),
            "write %1 or more, or drop %".into(),
        ),
        RangeErrorKind::NotANumber { what } => (
            format!("expected a non-negative integer {what}, got {:?}", e.text),
            SYNTAX.into(),
        ),
        RangeErrorKind::TooLarge { what } => (
            format!("{what} {:?} is too large", e.text),
            format!("use indices up to {MAX_TASK_INDEX}"),
        ),
        RangeErrorKind::ZeroStep => ("step must be at least 1".into(), "write e.g. 0-15:4".into()),
        RangeErrorKind::Reversed { .. } => {
            let range = e.entry.split(':').next().unwrap_or_default();
            (
                format!("range {range:?} ends before it starts"),
                "write START-END with START <= END".into(),
            )
        }
        RangeErrorKind::TooMany { .. } => (
            format!("task group has more than {max_elements} elements"),
            "split the work into several task groups or ask an admin to raise the limit".into(),
        ),
    };
    ParseError::new(WHAT, input, e.position, message, hint)
}

/// State of one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ElementState {
    /// Waiting for dependencies (not created).
    Blocked,
    /// Dependencies hold; waiting for a concurrency slot (not created).
    Eligible,
    /// Released (created and queued).
    Pending,
    /// Running.
    Running,
    /// Exit 0.
    Succeeded,
    /// Non-zero exit.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl ElementState {
    /// Succeeded, Failed or Cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
    fn slot(self) -> usize {
        self as usize
    }
}

/// Element counts of a task group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskGroupStatus {
    /// All elements.
    pub total: u32,
    /// Blocked on dependencies.
    pub blocked: u32,
    /// Ready, waiting for a concurrency slot.
    pub eligible: u32,
    /// Released, not yet running.
    pub pending: u32,
    /// Running.
    pub running: u32,
    /// Succeeded.
    pub succeeded: u32,
    /// Failed.
    pub failed: u32,
    /// Cancelled.
    pub cancelled: u32,
}

/// Errors from feeding events to a [`TaskGroupRun`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskGroupError {
    /// The index is not an element of the group.
    #[error("index {0} is not an element of this task group")]
    UnknownIndex(u64),
    /// The element was never released.
    #[error("element {0} was never released; only released elements can start or finish")]
    NotReleased(u64),
}

/// Runtime state of one task group: which elements exist, which may be created.
#[derive(Debug, Clone)]
pub struct TaskGroupRun {
    indices: Vec<u64>,
    limit: usize,
    states: Vec<ElementState>,
    eligible: BinaryHeap<Reverse<usize>>,
    in_flight: usize,
    counts: [u32; 7],
    first_exit: Option<i32>,
}

impl TaskGroupRun {
    /// All elements start `Blocked`; call [`open_all`](Self::open_all) or
    /// [`make_eligible`](Self::make_eligible), then [`pump`](Self::pump).
    pub fn new(spec: &TaskGroupSpec) -> Self {
        let n = spec.indices.len();
        let mut counts = [0u32; 7];
        counts[ElementState::Blocked.slot()] = u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            indices: spec.indices.clone(),
            limit: spec.concurrency.map_or(usize::MAX, |c| c as usize),
            states: vec![ElementState::Blocked; n],
            eligible: BinaryHeap::new(),
            in_flight: 0,
            counts,
            first_exit: None,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    /// True for an empty group.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// Array index of element at `pos`.
    pub fn index_at(&self, pos: usize) -> Option<u64> {
        self.indices.get(pos).copied()
    }
    /// Position of array index `index`.
    pub fn position(&self, index: u64) -> Option<usize> {
        self.indices.binary_search(&index).ok()
    }
    /// State of element at `pos`.
    pub fn state(&self, pos: usize) -> Option<ElementState> {
        self.states.get(pos).copied()
    }
    /// Elements pending or running.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
    /// Elements ready to release but not released yet.
    pub fn has_eligible(&self) -> bool {
        self.counts[ElementState::Eligible.slot()] > 0
    }

    fn set(&mut self, pos: usize, s: ElementState) {
        let old = self.states[pos];
        self.counts[old.slot()] -= 1;
        self.counts[s.slot()] += 1;
        self.states[pos] = s;
    }

    /// Mark every blocked element eligible.
    pub fn open_all(&mut self) {
        for pos in 0..self.states.len() {
            self.make_eligible(pos);
        }
    }

    /// Mark a blocked element eligible (no-op otherwise).
    pub fn make_eligible(&mut self, pos: usize) {
        if self.states.get(pos) == Some(&ElementState::Blocked) {
            self.set(pos, ElementState::Eligible);
            self.eligible.push(Reverse(pos));
        }
    }

    /// Release eligible elements (lowest index first) while fewer than
    /// `concurrency` are pending-or-running. Returns their array indices.
    pub fn pump(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        while self.in_flight < self.limit {
            let Some(Reverse(pos)) = self.eligible.pop() else {
                break;
            };
            if self.states[pos] != ElementState::Eligible {
                continue;
            }
            self.set(pos, ElementState::Pending);
            self.in_flight += 1;
            out.push(self.indices[pos]);
        }
        out
    }

    fn pos_of(&self, index: u64) -> Result<usize, TaskGroupError> {
        self.position(index)
            .ok_or(TaskGroupError::UnknownIndex(index))
    }

    /// A released element started running.
    pub fn started(&mut self, index: u64) -> Result<(), TaskGroupError> {
        let pos = self.pos_of(index)?;
        match self.states[pos] {
            ElementState::Pending => {
                self.set(pos, ElementState::Running);
                Ok(())
            }
            ElementState::Running => Ok(()),
            s if s.is_terminal() => Ok(()),
            _ => Err(TaskGroupError::NotReleased(index)),
        }
    }

    /// A running element was requeued: it stays in flight, back to pending.
    pub fn requeued(&mut self, index: u64) -> Result<(), TaskGroupError> {
        let pos = self.pos_of(index)?;
        match self.states[pos] {
            ElementState::Running | ElementState::Pending => {
                self.set(pos, ElementState::Pending);
                Ok(())
            }
            s if s.is_terminal() => Ok(()),
            _ => Err(TaskGroupError::NotReleased(index)),
        }
    }

    /// A released element finished. Returns `false` for a duplicate report.
    /// Call [`pump`](Self::pump) afterwards to fill the freed slot.
    pub fn finished(&mut self, index: u64, outcome: Outcome) -> Result<bool, TaskGroupError> {
        let pos = self.pos_of(index)?;
        match self.states[pos] {
            ElementState::Pending | ElementState::Running => {
                self.in_flight -= 1;
                let s = match outcome {
                    Outcome::Succeeded => ElementState::Succeeded,
                    Outcome::Failed { exit } => {
                        self.first_exit.get_or_insert(exit);
                        ElementState::Failed
                    }
                    Outcome::Cancelled => ElementState::Cancelled,
                };
                self.set(pos, s);
                Ok(true)
            }
            s if s.is_terminal() => Ok(false),
            _ => Err(TaskGroupError::NotReleased(index)),
        }
    }

    /// Cancel an element that was not released yet. Returns whether it changed.
    pub fn cancel_unreleased(&mut self, pos: usize) -> bool {
        match self.states.get(pos) {
            Some(ElementState::Blocked | ElementState::Eligible) => {
                self.set(pos, ElementState::Cancelled);
                true
            }
            _ => false,
        }
    }

    /// All elements terminal.
    pub fn is_done(&self) -> bool {
        let t = self.counts[ElementState::Succeeded.slot()]
            + self.counts[ElementState::Failed.slot()]
            + self.counts[ElementState::Cancelled.slot()];
        t as usize == self.states.len()
    }

    /// Aggregate outcome once done: any failure → Failed (first exit code),
    /// else any cancellation → Cancelled, else Succeeded.
    pub fn outcome(&self) -> Option<Outcome> {
        if !self.is_done() {
            return None;
        }
        Some(if let Some(exit) = self.first_exit {
            Outcome::Failed { exit }
        } else if self.counts[ElementState::Cancelled.slot()] > 0 {
            Outcome::Cancelled
        } else {
            Outcome::Succeeded
        })
    }

    /// Element counts.
    pub fn status(&self) -> TaskGroupStatus {
        let c = &self.counts;
        TaskGroupStatus {
            total: u32::try_from(self.states.len()).unwrap_or(u32::MAX),
            blocked: c[0],
            eligible: c[1],
            pending: c[2],
            running: c[3],
            succeeded: c[4],
            failed: c[5],
            cancelled: c[6],
        }
    }
}
