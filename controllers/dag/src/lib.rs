//! `lattice-dag`: the pure core of Lattice DAG workflows.
//!
//! * [`deps`] — the API's dependency-string grammar (`lattice_apis::syntax::deps`):
//!   `--depends-on`, Slurm `--dependency` and Flux RFC 26 strings parsed into one
//!   normalized [`deps::Dependency`].
//! * [`graph`] — parse DAG YAML (short form and `kind: Dag` manifests) and
//!   validate it, or a typed `lattice_apis::Dag`, in O(V+E).
//! * [`dispatch`] — the event-driven engine: fan-in counters, condition
//!   wiring, cascading cancellation, corresponding (per-index) edges, mutexes,
//!   DAG status aggregation.
//! * [`taskgroup`] — task-group ranges (the API's grammar, `lattice_apis::syntax::tasks`)
//!   and lazy element release.
//! * [`flux`] — Flux RFC 26 dependency-event semantics and the `string`
//!   scheme symbolic registry.
//!
//! No I/O, no clocks, no threads: the live DAG controller feeds events in and
//! applies the returned actions.
//!
//! The crate README (below) is compiled as a doctest.
#![doc = include_str!("../README.md")]

pub mod deps;
pub mod dispatch;
pub mod flux;
pub mod graph;
pub mod taskgroup;

pub use deps::{Condition, Dependency, ParseError};
pub use dispatch::{Action, CancelReason, DagPhase, Engine, StepState};
pub use graph::{DagDef, Limits, ValidatedDag};

use serde::{Deserialize, Serialize};

/// Terminal outcome of a step (or one task-group element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Outcome {
    /// Exit code 0.
    Succeeded,
    /// Non-zero exit (or node failure / timeout with no requeue left).
    Failed {
        /// Exit code reported.
        exit: i32,
    },
    /// Cancelled (by a user, or because its dependencies can never hold).
    Cancelled,
}
