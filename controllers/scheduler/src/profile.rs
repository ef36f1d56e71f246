//! Weight profiles and scheduler configuration are data, not code (ADR-002): a vCluster picks
//! a profile and a scheduler type; `rm-replay` loads the same structures from YAML.

use serde::{Deserialize, Serialize};

use crate::predict::PredictionConfig;
pub use crate::terms::CostWeights;

/// The seed's five named weight profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightProfile {
    HpcBatch,
    MlTraining,
    Service,
    Sensitive,
    Interactive,
}

impl WeightProfile {
    pub const ALL: [WeightProfile; 5] = [
        WeightProfile::HpcBatch,
        WeightProfile::MlTraining,
        WeightProfile::Service,
        WeightProfile::Sensitive,
        WeightProfile::Interactive,
    ];
    pub fn weights(self) -> CostWeights {
        match self {
            WeightProfile::HpcBatch => {
                CostWeights::seed([0.15, 0.20, 0.20, 0.15, 0.10, 0.05, 0.00, 0.05, 0.10])
            }
            WeightProfile::MlTraining => {
                CostWeights::seed([0.10, 0.10, 0.10, 0.25, 0.15, 0.05, 0.05, 0.10, 0.10])
            }
            WeightProfile::Service => {
                CostWeights::seed([0.15, 0.05, 0.10, 0.05, 0.10, 0.05, 0.10, 0.10, 0.30])
            }
            WeightProfile::Sensitive => {
                CostWeights::seed([0.90, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.10])
            }
            WeightProfile::Interactive => {
                CostWeights::seed([0.10, 0.30, 0.10, 0.00, 0.05, 0.15, 0.00, 0.00, 0.30])
            }
        }
    }
}

/// The four vCluster scheduler types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerKind {
    HpcBackfill,
    ServiceBinpack,
    SensitiveReservation,
    InteractiveFifo,
}

/// In which order the queue is walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueOrder {
    /// Submission time, then id.
    Fifo,
    /// `Score(j)` descending, then submission time, then id.
    Score,
}

/// What happens to jobs behind one that cannot start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum Discipline {
    /// The first blocked job blocks everything behind it (plain FCFS).
    Strict,
    /// Every job that fits starts; no reservations (bin-packing, interactive).
    Greedy,
    /// The first `depth` blocked jobs get reservations; later jobs start only when they do
    /// not delay any reservation. depth 1 = EASY, `usize::MAX` = conservative.
    Backfill { depth: usize },
}

/// In which order jobs behind the reserved ones are tried for backfilling (the jobs
/// after the first `depth` blocked ones of [`Discipline::Backfill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BackfillOrder {
    /// The queue's own order ([`QueueOrder`]).
    #[default]
    Queue,
    /// Submission time, then id.
    Fcfs,
    /// The cost function's `Score(j)`, highest first (whatever the queue order).
    Score,
    /// Shortest planned runtime first (the prediction when prediction is on, else the
    /// walltime): EASY++'s shortest-job-backfilled-first.
    Shortest,
    /// Smallest planned area first (nodes × planned runtime).
    SmallestArea,
    /// Largest job first, then shortest: fills the free nodes with the jobs that leave the
    /// fewest idle (first-fit decreasing).
    BestFit,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PreemptionConfig {
    pub enabled: bool,
    /// Maximum victims per decision (seed default 3).
    pub max_victims: usize,
    /// Allocations within this many seconds of their walltime are never preempted.
    pub near_completion_s: i64,
    /// Allocations past this fraction of their walltime are never preempted.
    pub near_completion_fraction: f64,
    /// Checkpoint time assumed for `checkpoint: manual` (the broker's timeout).
    pub manual_checkpoint_minutes: f64,
    /// Preemption is evaluated for at most this many blocked jobs per cycle.
    pub max_attempts_per_cycle: usize,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            enabled: true,
            max_victims: 3,
            near_completion_s: 300,
            near_completion_fraction: 0.9,
            manual_checkpoint_minutes: 10.0,
            max_attempts_per_cycle: 8,
        }
    }
}

/// One vCluster scheduler instance's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    pub kind: SchedulerKind,
    pub weights: CostWeights,
    pub order: QueueOrder,
    pub discipline: Discipline,
    /// Order of the backfill candidates (behind the reservations).
    pub backfill_order: BackfillOrder,
    /// Runtime prediction: plan reservations and backfill on predicted runtimes.
    pub prediction: PredictionConfig,
    pub preemption: PreemptionConfig,
    /// f₂'s reference_wait in seconds (seed default: one hour).
    pub reference_wait_s: f64,
    /// Schedule only this vCluster's pending jobs (`None` = all of them).
    pub vcluster: Option<crate::model::VClusterId>,
    /// Build human-readable pending reasons (off in large replays to save time).
    pub explain: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig::for_kind(SchedulerKind::HpcBackfill)
    }
}

impl SchedulerConfig {
    pub fn for_kind(kind: SchedulerKind) -> Self {
        // Only backfill plans on runtimes: the other kinds reserve nothing.
        let (backfill_order, prediction) = match kind {
            SchedulerKind::HpcBackfill => {
                (BackfillOrder::Shortest, PredictionConfig::hpc_backfill())
            }
            _ => (BackfillOrder::Queue, PredictionConfig::default()),
        };
        let (weights, order, discipline, preempt) = match kind {
            SchedulerKind::HpcBackfill => (
                WeightProfile::HpcBatch.weights(),
                QueueOrder::Score,
                Discipline::Backfill { depth: 1 },
                true,
            ),
            SchedulerKind::ServiceBinpack => (
                WeightProfile::Service.weights(),
                QueueOrder::Score,
                Discipline::Greedy,
                true,
            ),
            SchedulerKind::SensitiveReservation => (
                WeightProfile::Sensitive.weights(),
                QueueOrder::Fifo,
                Discipline::Strict,
                false,
            ),
            SchedulerKind::InteractiveFifo => (
                WeightProfile::Interactive.weights(),
                QueueOrder::Fifo,
                Discipline::Greedy,
                false,
            ),
        };
        SchedulerConfig {
            kind,
            weights,
            order,
            discipline,
            backfill_order,
            prediction,
            preemption: PreemptionConfig {
                enabled: preempt,
                ..PreemptionConfig::default()
            },
            reference_wait_s: 3600.0,
            vcluster: None,
            explain: true,
        }
    }

    /// Plain FCFS (no backfill, no preemption) for trace baselines.
    pub fn fcfs() -> Self {
        SchedulerConfig {
            order: QueueOrder::Fifo,
            discipline: Discipline::Strict,
            backfill_order: BackfillOrder::Queue,
            prediction: PredictionConfig::default(),
            preemption: PreemptionConfig {
                enabled: false,
                ..PreemptionConfig::default()
            },
            ..SchedulerConfig::for_kind(SchedulerKind::HpcBackfill)
        }
    }

    /// FCFS order with backfilling behind `depth` reservations (1 = EASY), on walltimes.
    pub fn backfill(depth: usize) -> Self {
        SchedulerConfig {
            discipline: Discipline::Backfill { depth },
            ..SchedulerConfig::fcfs()
        }
    }

    /// EASY++ (Tsafrir, Etsion and Feitelson, IEEE TPDS 2007): EASY on predicted runtimes,
    /// shortest predicted job backfilled first.
    pub fn easy_plus_plus() -> Self {
        SchedulerConfig {
            backfill_order: BackfillOrder::Shortest,
            prediction: PredictionConfig::easy_plus_plus(),
            ..SchedulerConfig::backfill(1)
        }
    }
}
