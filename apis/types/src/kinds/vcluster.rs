//! `VCluster`: a soft isolation boundary with its own scheduler instance,
//! scheduling algorithm and cost-function weights (ADR-002 in the seed).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;
use crate::meta::{Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, truncate, validate_dns1123_name, Errors};

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
    /// The profile's weights w₁..w₉.
    pub fn weights(self) -> [f64; 9] {
        match self {
            Self::HpcBatch => [0.15, 0.20, 0.20, 0.15, 0.10, 0.05, 0.00, 0.05, 0.10],
            Self::MlTraining => [0.10, 0.10, 0.10, 0.25, 0.15, 0.05, 0.05, 0.10, 0.10],
            Self::Service => [0.15, 0.05, 0.10, 0.05, 0.10, 0.05, 0.10, 0.10, 0.30],
            Self::Sensitive => [0.90, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.10],
            Self::Interactive => [0.10, 0.30, 0.10, 0.00, 0.05, 0.15, 0.00, 0.00, 0.30],
        }
    }
}

/// Cost-function weights w₁..w₉ (`Score(j) = Σ wᵢ·fᵢ(j)`), each 0–1. Unset
/// weights are filled from the profile. Aliases `w1`..`w9` are accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Weights {
    /// w₁: priority class.
    #[serde(default, alias = "w1", skip_serializing_if = "Option::is_none")]
    pub priority: Option<f64>,
    /// w₂: wait time (anti-starvation).
    #[serde(default, alias = "w2", skip_serializing_if = "Option::is_none")]
    pub wait_time: Option<f64>,
    /// w₃: fair-share deficit.
    #[serde(default, alias = "w3", skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<f64>,
    /// w₄: topology fitness.
    #[serde(default, alias = "w4", skip_serializing_if = "Option::is_none")]
    pub topology: Option<f64>,
    /// w₅: data readiness.
    #[serde(
        default,
        alias = "w5",
        alias = "dataReady",
        skip_serializing_if = "Option::is_none"
    )]
    pub data_readiness: Option<f64>,
    /// w₆: backlog pressure.
    #[serde(default, alias = "w6", skip_serializing_if = "Option::is_none")]
    pub backlog: Option<f64>,
    /// w₇: energy cost.
    #[serde(default, alias = "w7", skip_serializing_if = "Option::is_none")]
    pub energy: Option<f64>,
    /// w₈: checkpoint efficiency.
    #[serde(
        default,
        alias = "w8",
        alias = "checkpoint",
        skip_serializing_if = "Option::is_none"
    )]
    pub checkpoint_efficiency: Option<f64>,
    /// w₉: conformance fitness.
    #[serde(default, alias = "w9", skip_serializing_if = "Option::is_none")]
    pub conformance: Option<f64>,
}

/// Field names of [`Weights`] in w₁..w₉ order.
pub const WEIGHT_NAMES: [&str; 9] = [
    "priority",
    "waitTime",
    "fairShare",
    "topology",
    "dataReadiness",
    "backlog",
    "energy",
    "checkpointEfficiency",
    "conformance",
];

impl Weights {
    fn slots(&mut self) -> [&mut Option<f64>; 9] {
        [
            &mut self.priority,
            &mut self.wait_time,
            &mut self.fair_share,
            &mut self.topology,
            &mut self.data_readiness,
            &mut self.backlog,
            &mut self.energy,
            &mut self.checkpoint_efficiency,
            &mut self.conformance,
        ]
    }

    /// The weights as an array in w₁..w₉ order (unset = 0).
    pub fn to_array(&self) -> [f64; 9] {
        [
            self.priority,
            self.wait_time,
            self.fair_share,
            self.topology,
            self.data_readiness,
            self.backlog,
            self.energy,
            self.checkpoint_efficiency,
            self.conformance,
        ]
        .map(|w| w.unwrap_or(0.0))
    }

    /// Fill unset weights from `profile`.
    pub fn fill_from(&mut self, profile: WeightProfile) {
        let defaults = profile.weights();
        for (slot, d) in self.slots().into_iter().zip(defaults) {
            if slot.is_none() {
                *slot = Some(d);
            }
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
    /// Cost-function weights; unset ones come from the profile.
    #[serde(default)]
    pub weights: Weights,
    /// Scheduling cycle interval, e.g. `15s` (default from the scheduler type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle_interval: Option<String>,
    /// Future reservations the backfill solver considers (0 = first-fit only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill_depth: Option<u32>,
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
        let w = s.weights.to_array();
        for (name, v) in WEIGHT_NAMES.iter().zip(w) {
            if !v.is_finite() || !(0.0..=1.0).contains(&v) {
                errs.push(
                    format!("spec.weights.{name}"),
                    format!("must be between 0 and 1, got {v}"),
                );
            }
        }
        if s.scheduler_type.is_some() && w.iter().all(|v| *v == 0.0) {
            errs.push(
                "spec.weights",
                "all weights are 0, so every allocation would score the same; set at least one weight or remove weights to use the profile",
            );
        }
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
