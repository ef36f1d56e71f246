//! # lattice-scheduler
//!
//! The pure, deterministic scheduling core of Lattice and the `rm-replay` simulator built on
//! it. No clock and no I/O: time is an input, the output is a [`Plan`] of proposals that the
//! live controller turns into store transactions.
//!
//! The cycle is a pipeline in the spirit of the Kubernetes scheduling framework and Nomad's
//! iterator stack:
//!
//! 1. **order** — FIFO or `Score(j) = Σ wᵢ·fᵢ(j)` (the score terms of [`terms`], weights
//!    from a [`profile`]);
//! 2. **filter** — per node *class* ([`catalog`], the filters of [`filter`]): state, sensitive isolation, GPU type and
//!    count, features, memory (CXL on opt-in), unified memory, ownership/borrowing; hard
//!    quotas (`max_nodes`, `max_concurrent_allocations`);
//! 3. **select** — fewest dragonfly groups, then the largest conformance group ([`select`]);
//! 4. **reserve / backfill** — reservations for the first `depth` blocked jobs (1 = EASY,
//!    all = conservative), later jobs start only if they delay none;
//! 5. **preempt** — downward only, never sensitive or near-completion victims ([`preempt`]);
//! 6. **explain** — a [`PendingReason`] for every job left in the queue.
//!
//! ```
//! use lattice_scheduler::*;
//!
//! let catalog = NodeCatalog::new((0..4).map(NodeView::slot).collect());
//! let job = PendingJob {
//!     id: JobId(1), tenant: TenantId(0), vcluster: VClusterId(0),
//!     nodes: NodeRequest::exact(2), constraints: Constraints::default(),
//!     preemption_class: 5, sensitive: false, submit_time: 0, walltime_s: 3600,
//!     runtime_key: RuntimeKey::default(), checkpoint: CheckpointInfo::default(),
//!     data_readiness: None, scale_up: None,
//! };
//! let snap = ClusterSnapshot { now: 10, running: &[], pending: &[job], tenants: &[],
//!                              energy_price: 0.0, history: None };
//! let plan = Scheduler::new(SchedulerConfig::default()).cycle(&catalog, &snap);
//! assert_eq!(plan.proposals.len(), 1);
//! assert_eq!(plan.proposals[0].nodes.len(), 2);
//! ```

pub mod catalog;
pub mod claim;
pub mod cycle;
pub mod filter;
mod free_index;
pub mod model;
pub mod plan;
pub mod predict;
pub mod preempt;
pub mod profile;
pub mod score;
pub mod select;
pub mod sim;
pub mod terms;

pub use catalog::{FilterOutcome, NodeCatalog};
pub use claim::ClaimVerdict;
pub use cycle::{ExternalScores, ExternalTerm, Scheduler};
pub use model::*;
pub use plan::{PendingExplanation, PendingReason, Plan, Proposal, ProposalKind, Reservation};
pub use predict::{
    Correction, PredictionConfig, RunningEnds, RuntimeEstimator, RuntimeHistory, RuntimeKey,
};
pub use profile::{
    BackfillOrder, CostWeights, Discipline, PreemptionConfig, QueueOrder, SchedulerConfig,
    SchedulerKind, WeightProfile,
};
