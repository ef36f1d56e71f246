//! `VCluster`: a soft isolation boundary with its own scheduler instance,
//! scheduling algorithm and cost-function weights (ADR-002 in the seed).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;
use crate::meta::{Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, truncate, validate_dns1123_name, Errors};

mod extender;
mod weights;

pub use extender::{Extender, ExtenderFailurePolicy};
pub use weights::{known_weight_names, weight_term, WeightTerm, Weights, WEIGHT_TERMS};

/// A vCluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VCluster {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `VCluster`.
    #[serde(default)]
    pub kind: String,
    /// Name and namespace (= owning tenant).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Scheduler configuration.
    #[serde(default)]
    pub spec: VClusterSpec,
    /// Queue and node counts, written by the scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VClusterStatus>,
}

/// The scheduling algorithm a vCluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerType {
    /// Topology-aware greedy knapsack with backfill (HPC batch, ML training).
    HpcBackfill,
    /// Bin-packing for long-running and autoscaled services.
    ServiceBinpack,
    /// Dedicated, user-claimed nodes for sensitive workloads.
    SensitiveReservation,
    /// First-in first-out for interactive sessions.
    InteractiveFifo,
}

impl SchedulerType {
    /// The weight profile used when `spec.profile` is unset.
    pub fn default_profile(self) -> WeightProfile {
        match self {
            Self::HpcBackfill => WeightProfile::HpcBatch,
            Self::ServiceBinpack => WeightProfile::Service,
            Self::SensitiveReservation => WeightProfile::Sensitive,
            Self::InteractiveFifo => WeightProfile::Interactive,
        }
    }
    /// Default scheduling cycle interval (the seed's tuning table).
    pub fn default_cycle_interval(self) -> &'static str {
        match self {
            Self::HpcBackfill | Self::SensitiveReservation => "15s",
            Self::ServiceBinpack => "30s",
            Self::InteractiveFifo => "5s",
        }
    }
    /// Default backfill depth (only backfill schedulers look ahead): 1, EASY. The seed's
    /// tuning table suggests 10-20, but replaying the first 10,000 jobs of SDSC-SP2,
    /// KTH-SP2, CTC-SP2 and HPC2N (`rm-replay`, README) depth 10 had 7-45 % worse average
    /// bounded slowdown than EASY and up to 1.3 % less utilization; a site that wants
    /// reservations for more of its queue (predictability over slowdown) raises it.
    pub fn default_backfill_depth(self) -> u32 {
        match self {
            Self::HpcBackfill => 1,
            _ => 0,
        }
    }
    /// Default preemption mode (the seed's per-vCluster preemption table).
    pub fn default_preemption(self) -> PreemptionMode {
        match self {
            Self::HpcBackfill | Self::InteractiveFifo => PreemptionMode::ClassBased,
            Self::ServiceBinpack => PreemptionMode::BorrowedNodesOnly,
            Self::SensitiveReservation => PreemptionMode::Never,
        }
    }
}

/// Named weight profiles from the seed's "Weight Profiles" table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WeightProfile {
    /// HPC Batch.
    HpcBatch,
    /// ML Training.
    MlTraining,
    /// Service.
    Service,
    /// Sensitive (priority dominates).
    Sensitive,
    /// Interactive.
    Interactive,
}

impl WeightProfile {
    /// The profile's weights (the seed's "Weight Profiles" table, [`WEIGHT_TERMS`]).
    pub fn weights(self) -> Weights {
        let column = self.column();
        WEIGHT_TERMS
            .iter()
            .map(|t| (t.name, t.profiles[column]))
            .collect()
    }

    /// The profile's column in [`WeightTerm::profiles`].
    pub(crate) fn column(self) -> usize {
        match self {
            Self::HpcBatch => 0,
            Self::MlTraining => 1,
            Self::Service => 2,
            Self::Sensitive => 3,
            Self::Interactive => 4,
        }
    }
}

/// Elastic borrowing between vClusters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Borrowing {
    /// Advertise idle home nodes to other vClusters (default true; false for sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_lend: Option<bool>,
    /// Borrow idle nodes from other vClusters (default true; false for sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_borrow: Option<bool>,
    /// Most nodes borrowed at once (unset = no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_borrowed_nodes: Option<u32>,
    /// Longest a borrowed node is kept, e.g. `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_borrow_duration: Option<String>,
    /// Time a borrower gets to checkpoint and return a reclaimed node, e.g. `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_grace_period: Option<String>,
}

/// How the vCluster's scheduler may preempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionMode {
    /// Lower classes may be preempted by higher ones (checkpoint-aware).
    ClassBased,
    /// Only allocations on borrowed nodes may be preempted (services).
    BorrowedNodesOnly,
    /// Never preempt (sensitive).
    Never,
}

/// In which order the jobs behind the reservations are tried for backfilling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BackfillOrder {
    /// The queue's own order (the cost function's).
    Queue,
    /// Submission order.
    Fcfs,
    /// The cost function's score, highest first.
    Score,
    /// Shortest predicted runtime first (EASY++).
    Shortest,
    /// Smallest predicted area (nodes × runtime) first.
    SmallestArea,
    /// Largest job first, then shortest (fills free nodes best).
    BestFit,
}

/// How runtimes are predicted from the user's finished allocations. The names are the
/// scheduler's registered estimators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeEstimator {
    /// No prediction: reservations and backfill on walltimes (EASY).
    None,
    /// Mean of the user's last two runtimes (EASY++).
    UserLast2,
    /// Mean of the last two runtimes of the user's jobs of the same name (`tags.name`).
    UserJobLast2,
    /// The walltime times the mean fraction of their walltimes the user's last two jobs
    /// ran.
    UserFraction2,
    /// As `user-fraction2`, from the user's jobs of the same name.
    UserJobFraction2,
}

impl RuntimeEstimator {
    /// The scheduler's name for it (`None` for no prediction).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::UserLast2 => Some("user-last2"),
            Self::UserJobLast2 => Some("user-job-last2"),
            Self::UserFraction2 => Some("user-fraction2"),
            Self::UserJobFraction2 => Some("user-job-fraction2"),
        }
    }
}

/// What a running allocation's prediction becomes once it has run longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PredictionCorrection {
    /// Its walltime.
    Walltime,
    /// +1 min, 5 min, 15 min, 30 min, 1 h, 2 h, 5 h, … each time it expires (EASY++).
    Gradual,
    /// Doubled each time it expires.
    Double,
}

/// When reservations expect running work to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunningEnds {
    /// At its walltime (the latest it can end).
    Walltime,
    /// When predicted (EASY++).
    Predicted,
}

/// Runtime prediction: backfill on predicted runtimes learned from the users' finished
/// allocations. The kill time always stays the allocation's walltime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimePrediction {
    /// none | user-last2 | user-job-last2 | user-fraction2 | user-job-fraction2
    /// (default for hpc-backfill: user-fraction2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimator: Option<RuntimeEstimator>,
    /// What an expired prediction becomes: walltime | gradual | double (default gradual).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction: Option<PredictionCorrection>,
    /// When reservations expect running work to end: walltime | predicted (default
    /// walltime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_ends: Option<RunningEnds>,
    /// A job holding the first reservation that has waited longer than this gets EASY's
    /// guarantee (backfill checks on walltimes), e.g. `66h` (the default), or `never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee_after: Option<String>,
}

impl RuntimePrediction {
    /// `guaranteeAfter` in seconds (`Ok(None)`: never).
    pub fn guarantee_after_seconds(&self) -> Result<Option<u64>, String> {
        match self.guarantee_after.as_deref() {
            None => Ok(Some(DEFAULT_GUARANTEE_AFTER_S)),
            Some("never") => Ok(None),
            Some(d) => parse_duration(d).map(Some),
        }
    }
}

/// hpc-backfill's `runtimePrediction.guaranteeAfter` (66 hours).
pub const DEFAULT_GUARANTEE_AFTER_S: u64 = 66 * 3600;

/// Preemption policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreemptionPolicy {
    /// class_based | borrowed_nodes_only | never (default from the scheduler type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PreemptionMode>,
    /// Most victims per preemption decision (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_victims: Option<u32>,
    /// Allocations this close to their walltime are not preempted (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_completion_threshold: Option<String>,
}

/// vCluster configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VClusterSpec {
    /// hpc-backfill | service-binpack | sensitive-reservation | interactive-fifo. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_type: Option<SchedulerType>,
    /// Weight profile: hpc-batch | ml-training | service | sensitive | interactive
    /// (default from the scheduler type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<WeightProfile>,
    /// Cost-function weights by name; unset ones come from the profile.
    #[serde(default)]
    pub weights: Weights,
    /// Scheduler extenders: HTTP services the scheduler asks, once per cycle, which nodes
    /// this vCluster's jobs may use and how to rank its queue (`docs/scheduling.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extenders: Vec<Extender>,
    /// Scheduling cycle interval, e.g. `15s` (default from the scheduler type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle_interval: Option<String>,
    /// Future reservations the backfill solver considers (0 = first-fit only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill_depth: Option<u32>,
    /// Order of the jobs tried for backfilling behind the reservations: queue | fcfs |
    /// score | shortest | smallest-area | best-fit (hpc-backfill; default shortest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill_order: Option<BackfillOrder>,
    /// Runtime prediction for backfill (hpc-backfill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_prediction: Option<RuntimePrediction>,
    /// Nodes permanently assigned to this vCluster (its home nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub home_nodes: Vec<String>,
    /// Elastic borrowing.
    #[serde(default)]
    pub borrowing: Borrowing,
    /// Preemption policy.
    #[serde(default)]
    pub preemption: PreemptionPolicy,
    /// Walltime applied to bounded allocations that set none, e.g. `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_walltime: Option<String>,
    /// Longest walltime accepted, e.g. `72h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_walltime: Option<String>,
    /// Free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Observed vCluster state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VClusterStatus {
    /// Home nodes.
    #[serde(default)]
    pub nodes: u32,
    /// Idle home nodes.
    #[serde(default)]
    pub idle_nodes: u32,
    /// Nodes borrowed from other vClusters.
    #[serde(default)]
    pub borrowed_nodes: u32,
    /// Home nodes lent to other vClusters.
    #[serde(default)]
    pub lent_nodes: u32,
    /// Allocations waiting in the queue.
    #[serde(default)]
    pub pending_allocations: u32,
    /// Allocations running.
    #[serde(default)]
    pub running_allocations: u32,
    /// When the last scheduling cycle ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_cycle_time: Option<Time>,
    /// How long the last cycle took, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_cycle_duration_ms: Option<u64>,
    /// `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl VClusterSpec {
    /// The effective profile.
    pub fn effective_profile(&self) -> Option<WeightProfile> {
        self.profile
            .or(self.scheduler_type.map(SchedulerType::default_profile))
    }
}

impl Resource for VCluster {
    const KIND: &'static str = "VCluster";
    const PLURAL: &'static str = "vclusters";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        let s = &mut self.spec;
        let Some(t) = s.scheduler_type else {
            return; // validation reports the missing type
        };
        let profile = *s.profile.get_or_insert(t.default_profile());
        s.weights.fill_from(profile);
        s.cycle_interval
            .get_or_insert_with(|| t.default_cycle_interval().to_string());
        s.backfill_depth.get_or_insert(t.default_backfill_depth());
        if t == SchedulerType::HpcBackfill {
            s.backfill_order.get_or_insert(BackfillOrder::Shortest);
            let p = s.runtime_prediction.get_or_insert_with(Default::default);
            p.estimator.get_or_insert(RuntimeEstimator::UserFraction2);
            p.correction.get_or_insert(PredictionCorrection::Gradual);
            p.running_ends.get_or_insert(RunningEnds::Walltime);
            p.guarantee_after
                .get_or_insert_with(|| format!("{}h", DEFAULT_GUARANTEE_AFTER_S / 3600));
        }
        let sensitive = t == SchedulerType::SensitiveReservation;
        s.borrowing.allow_lend.get_or_insert(!sensitive);
        s.borrowing.allow_borrow.get_or_insert(!sensitive);
        s.preemption.mode.get_or_insert(t.default_preemption());
        s.preemption.max_victims.get_or_insert(3);
        s.preemption
            .near_completion_threshold
            .get_or_insert_with(|| "5m".to_string());
    }

    fn validate_fields(&self, errs: &mut Errors) {
        let s = &self.spec;
        if s.scheduler_type.is_none() {
            errs.push(
                "spec.schedulerType",
                "is required; use one of: hpc-backfill, service-binpack, sensitive-reservation, interactive-fifo",
            );
        }
        let known = known_weight_names();
        for name in s.weights.unknown() {
            errs.push(
                format!("spec.weights.{name}"),
                format!("is not a weight; use one of: {known}"),
            );
        }
        for (name, v) in s.weights.iter() {
            if !v.is_finite() || !(0.0..=1.0).contains(&v) {
                errs.push(
                    format!("spec.weights.{name}"),
                    format!("must be between 0 and 1, got {v}"),
                );
            }
        }
        // Unset counts as 0 here (defaulting has filled them from the profile by now).
        let all_zero = WEIGHT_TERMS
            .iter()
            .all(|t| s.weights.get(t.name).unwrap_or(0.0) == 0.0);
        if s.scheduler_type.is_some() && all_zero {
            errs.push(
                "spec.weights",
                "all weights are 0, so every allocation would score the same; set at least one weight or remove weights to use the profile",
            );
        }
        extender::validate(&s.extenders, errs);
        for (field, v) in [
            ("spec.cycleInterval", &s.cycle_interval),
            (
                "spec.borrowing.maxBorrowDuration",
                &s.borrowing.max_borrow_duration,
            ),
            (
                "spec.borrowing.returnGracePeriod",
                &s.borrowing.return_grace_period,
            ),
            (
                "spec.preemption.nearCompletionThreshold",
                &s.preemption.near_completion_threshold,
            ),
            ("spec.defaultWalltime", &s.default_walltime),
            ("spec.maxWalltime", &s.max_walltime),
        ] {
            if let Some(v) = v {
                if let Err(e) = parse_duration(v) {
                    errs.push(field, e);
                }
            }
        }
        if let Some(ci) = &s.cycle_interval {
            if let Ok(secs) = parse_duration(ci) {
                if !(1..=3600).contains(&secs) {
                    errs.push(
                        "spec.cycleInterval",
                        format!(
                            "must be between 1s and 1h, got {ci:?}; the seed recommends 5s–30s"
                        ),
                    );
                }
            }
        }
        if let (Some(d), Some(m)) = (&s.default_walltime, &s.max_walltime) {
            if let (Ok(d), Ok(m)) = (parse_duration(d), parse_duration(m)) {
                if d > m {
                    errs.push(
                        "spec.defaultWalltime",
                        "is longer than spec.maxWalltime; lower it or raise maxWalltime",
                    );
                }
            }
        }
        if let Some(b) = s.backfill_depth {
            if b > 1000 {
                errs.push(
                    "spec.backfillDepth",
                    format!("must be at most 1000, got {b}; 10–20 suits most sites"),
                );
            }
        }
        let backfills = s
            .scheduler_type
            .is_none_or(|t| t == SchedulerType::HpcBackfill);
        if !backfills {
            if s.backfill_order.is_some() {
                errs.push(
                    "spec.backfillOrder",
                    "only hpc-backfill vClusters backfill behind reservations; remove it",
                );
            }
            if s.runtime_prediction.is_some() {
                errs.push(
                    "spec.runtimePrediction",
                    "only hpc-backfill vClusters plan reservations and backfill on runtimes; remove it",
                );
            }
        }
        if let Some(p) = &s.runtime_prediction {
            if let Err(e) = p.guarantee_after_seconds() {
                errs.push(
                    "spec.runtimePrediction.guaranteeAfter",
                    format!("{e}; use a duration such as 66h, or never"),
                );
            }
        }
        if s.preemption.max_victims == Some(0) {
            errs.push(
                "spec.preemption.maxVictims",
                "must be at least 1; use mode: never to disable preemption",
            );
        }
        let mut seen = BTreeSet::new();
        for (i, n) in s.home_nodes.iter().enumerate() {
            if let Some(e) = validate_dns1123_name(format_args!("spec.homeNodes[{i}]"), n) {
                errs.0.push(e);
            } else if !seen.insert(n.as_str()) {
                errs.push(
                    format!("spec.homeNodes[{i}]"),
                    format!("node {:?} is listed twice", truncate(n, 63)),
                );
            }
        }
        if let Some(d) = &s.description {
            check_len(errs, "spec.description", d, 1024);
        }
        if s.scheduler_type == Some(SchedulerType::SensitiveReservation) {
            if s.borrowing.allow_lend == Some(true) {
                errs.push(
                    "spec.borrowing.allowLend",
                    "sensitive nodes cannot be lent to other vClusters; set it to false",
                );
            }
            if s.borrowing.allow_borrow == Some(true) {
                errs.push(
                    "spec.borrowing.allowBorrow",
                    "sensitive vClusters cannot borrow nodes; set it to false",
                );
            }
            if matches!(s.preemption.mode, Some(m) if m != PreemptionMode::Never) {
                errs.push(
                    "spec.preemption.mode",
                    "sensitive allocations are never preempted; set mode: never",
                );
            }
        }
    }
}
