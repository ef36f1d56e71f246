//! The scheduler's own view of the cluster. A later adapter maps `lattice-apis` objects onto
//! these types; the core never sees the API types, a clock or any I/O.

use serde::{Deserialize, Serialize};

use crate::predict::{RuntimeHistory, RuntimeKey};

/// Dense node identifier (the adapter interns node names).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct NodeId(pub u32);

/// Allocation (job) identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

/// Tenant identifier (interned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TenantId(pub u32);

/// vCluster identifier (interned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VClusterId(pub u32);

/// Simulated or wall time in seconds; always an input, never read from a clock.
pub type Time = i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    #[default]
    Ready,
    Draining,
    Drained,
    Down,
}

/// Node ownership at the two levels the quorum tracks (home and current vCluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct NodeOwner {
    /// Permanent assignment; `None` = shared pool usable by every vCluster.
    pub home: Option<VClusterId>,
    /// The home vCluster does not lend its idle nodes (`borrowing.allowLend: false`).
    #[serde(default)]
    pub private: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    #[serde(default)]
    pub id: NodeId,
    #[serde(default)]
    pub state: NodeState,
    #[serde(default)]
    pub gpus: u32,
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// Sorted, de-duplicated feature labels.
    #[serde(default)]
    pub features: Vec<String>,
    /// Local DRAM capacity.
    #[serde(default)]
    pub memory_gb: u32,
    /// CXL-attached capacity, usable only by allocations that opt in.
    #[serde(default)]
    pub cxl_memory_gb: u32,
    #[serde(default)]
    pub unified_memory: bool,
    /// Dragonfly group.
    #[serde(default)]
    pub topology_group: u32,
    #[serde(default)]
    pub conformance_fingerprint: u64,
    #[serde(default)]
    pub owner: NodeOwner,
    /// Node belongs to the sensitive pool (only sensitive claims land here).
    #[serde(default)]
    pub sensitive_pool: bool,
    /// min link bandwidth / max link bandwidth of the node's GPU set (intra-node f4 term).
    #[serde(default = "one")]
    pub gpu_link_fitness: f64,
    /// Fraction of CPUs/GPUs sharing a memory domain (memory-locality f4 term).
    #[serde(default = "one")]
    pub memory_locality: f64,
    /// Fraction of the node's GPUs with a network interface nearby (GPU-to-NIC affinity);
    /// multi-node GPU jobs take the nodes with the best affinity first.
    #[serde(default = "one")]
    pub nic_affinity: f64,
}

fn one() -> f64 {
    1.0
}

impl NodeView {
    /// A plain CPU node in group 0 — the full-node "processor slot" of the SWF experiments.
    pub fn slot(id: u32) -> Self {
        NodeView {
            id: NodeId(id),
            state: NodeState::Ready,
            gpus: 0,
            gpu_type: None,
            features: Vec::new(),
            memory_gb: 0,
            cxl_memory_gb: 0,
            unified_memory: false,
            topology_group: 0,
            conformance_fingerprint: 0,
            owner: NodeOwner::default(),
            sensitive_pool: false,
            gpu_link_fitness: 1.0,
            memory_locality: 1.0,
            nic_affinity: 1.0,
        }
    }
}

/// Hard placement constraints of an allocation (all per node).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Constraints {
    pub gpu_type: Option<String>,
    pub min_gpus_per_node: u32,
    /// Every node has each of these features.
    pub features: Vec<String>,
    /// Every node has at least one feature of each group (a conjunction of
    /// disjunctions, `resources.constraints.anyOf`).
    pub any_of: Vec<Vec<String>>,
    pub memory_gb_per_node: u32,
    pub require_unified_memory: bool,
    pub allow_cxl_memory: bool,
    /// All nodes must share one conformance fingerprint (always true for sensitive claims).
    pub require_conformance: bool,
    /// May run on idle nodes whose home is another vCluster.
    pub allow_borrowed: bool,
    /// GPU-heavy workload (β = 0.7 in the memory-topology f4 term) / CPU-heavy (β = 0.3).
    pub gpu_heavy: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMode {
    Auto,
    Manual,
    #[default]
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct CheckpointInfo {
    pub mode: CheckpointMode,
    pub estimated_minutes: f64,
}

/// Requested node count: exact (`min == max`) or elastic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRequest {
    pub min: u32,
    pub max: u32,
}

impl NodeRequest {
    pub fn exact(n: u32) -> Self {
        NodeRequest { min: n, max: n }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingJob {
    pub id: JobId,
    pub tenant: TenantId,
    pub vcluster: VClusterId,
    pub nodes: NodeRequest,
    #[serde(default)]
    pub constraints: Constraints,
    /// 0..=10; validated at admission, clamped here.
    pub preemption_class: u8,
    #[serde(default)]
    pub sensitive: bool,
    pub submit_time: Time,
    /// Walltime in seconds: the user's request and the kill time. With runtime prediction
    /// on, reservations and backfill checks plan on a prediction no longer than this.
    pub walltime_s: i64,
    /// Whose runtime history predicts this job's runtime.
    #[serde(default)]
    pub runtime_key: RuntimeKey,
    #[serde(default)]
    pub checkpoint: CheckpointInfo,
    /// Fraction of input data on the hot tier, if known.
    #[serde(default)]
    pub data_readiness: Option<f64>,
    /// This job is one more node for a running reactive allocation (the autoscaler asked
    /// for it): scored and placed like any job, on a node it may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScaleUp>,
}

/// Where one more node of a running reactive allocation may go.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ScaleUp {
    /// The dragonfly groups the allocation spans: a node there first (topology).
    pub near_groups: Vec<u32>,
    /// Nodes it must not take: the nodes this attempt already ran on (a node given back by
    /// a scale-down is not taken again by the same attempt).
    pub exclude: Vec<NodeId>,
    /// Only nodes with this conformance fingerprint (conformance-required or sensitive
    /// work stays in its group).
    pub fingerprint: Option<u64>,
    /// Never a borrowed node: a lender's reclaim could not take back part of an allocation.
    pub home_only: bool,
}

impl PendingJob {
    /// Non-preemptible allocations are kept off borrowed nodes.
    pub fn non_preemptible(&self) -> bool {
        self.sensitive
            || (self.checkpoint.mode == CheckpointMode::None && self.preemption_class >= 7)
    }
    pub fn gpus_per_node(&self) -> u32 {
        self.constraints.min_gpus_per_node.max(1)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningJob {
    pub id: JobId,
    pub tenant: TenantId,
    pub vcluster: VClusterId,
    pub nodes: Vec<NodeId>,
    pub preemption_class: u8,
    #[serde(default)]
    pub sensitive: bool,
    pub start_time: Time,
    /// The kill time: the job runs until `start_time + walltime_s` at most, whatever was
    /// predicted.
    pub walltime_s: i64,
    /// Whose runtime history predicts when this job ends.
    #[serde(default)]
    pub runtime_key: RuntimeKey,
    #[serde(default)]
    pub checkpoint: CheckpointInfo,
    #[serde(default)]
    pub last_checkpoint: Option<Time>,
    #[serde(default)]
    pub gpus_per_node: u32,
    /// Already being preempted.
    #[serde(default)]
    pub checkpointing: bool,
    /// The pending job it is being preempted for (a victim still stopping). That job waits
    /// for these nodes instead of choosing more victims.
    #[serde(default)]
    pub preempted_for: Option<JobId>,
    /// Runs on no other vCluster's home node, in a vCluster whose policy is
    /// `borrowed_nodes_only` (services): "services on home nodes are not preempted". Never a
    /// priority victim; on borrowed nodes the lender may still reclaim.
    #[serde(default)]
    pub home_protected: bool,
}

impl RunningJob {
    /// A running job on `nodes` with neutral attributes (class 5, no checkpoint, started at
    /// 0, an hour of walltime, nothing special going on), to adjust field by field.
    pub fn new(id: JobId, tenant: TenantId, vcluster: VClusterId, nodes: Vec<NodeId>) -> Self {
        RunningJob {
            id,
            tenant,
            vcluster,
            nodes,
            preemption_class: 5,
            sensitive: false,
            start_time: 0,
            walltime_s: 3600,
            runtime_key: RuntimeKey::default(),
            checkpoint: CheckpointInfo::default(),
            last_checkpoint: None,
            gpus_per_node: 0,
            checkpointing: false,
            preempted_for: None,
            home_protected: false,
        }
    }

    pub fn expected_end(&self) -> Time {
        self.start_time + self.walltime_s.max(0)
    }
}

/// Hard quotas (filters) and soft targets of one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct TenantQuota {
    pub max_nodes: Option<u32>,
    pub max_concurrent_allocations: Option<u32>,
    /// Contracted share of system capacity (0..1]; 0 = no fair-share target.
    pub target_share: f64,
    /// How far above its target share a tenant may go on idle capacity (1.5 = 150 %);
    /// beyond it, its jobs wait until every other job was considered. `None`: no cap.
    pub burst_allowance: Option<f64>,
}

impl Tenant {
    /// Above its target share: running on capacity other tenants may need back (burst
    /// work is the first preemption candidate for a tenant below its share).
    pub fn bursting(&self) -> bool {
        self.quota.target_share > 0.0 && self.usage.actual_share > self.quota.target_share
    }

    /// At or above `burst_allowance` × its target share.
    pub fn over_burst(&self) -> bool {
        match self.quota.burst_allowance {
            Some(b) if self.quota.target_share > 0.0 => {
                self.usage.actual_share >= b * self.quota.target_share
            }
            _ => false,
        }
    }

    /// Below its target share: it "needs its share".
    pub fn below_share(&self) -> bool {
        self.quota.target_share > 0.0 && self.usage.actual_share < self.quota.target_share
    }
}

/// Eventually consistent usage figures fed to scoring.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct TenantUsage {
    /// Actual share of capacity used (same units as `target_share`).
    pub actual_share: f64,
    /// Fraction of the GPU/node-hours budget used, if a budget is set.
    pub budget_used: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: TenantId,
    #[serde(default)]
    pub quota: TenantQuota,
    #[serde(default)]
    pub usage: TenantUsage,
}

/// Everything one scheduling cycle looks at. Borrowed, so a simulator or controller can keep
/// its state in place between cycles.
#[derive(Debug, Clone, Copy)]
pub struct ClusterSnapshot<'a> {
    pub now: Time,
    pub running: &'a [RunningJob],
    pub pending: &'a [PendingJob],
    /// Sorted by id; tenants missing here have no quota and no fair-share target.
    pub tenants: &'a [Tenant],
    /// Normalised electricity price at `now`, 0 (cheap) ..= 1 (expensive).
    pub energy_price: f64,
    /// Finished jobs' runtimes, read by the profile's runtime estimator (`None`: plan on
    /// walltimes).
    pub history: Option<&'a RuntimeHistory>,
}

impl<'a> ClusterSnapshot<'a> {
    pub fn tenant(&self, id: TenantId) -> Option<&'a Tenant> {
        self.tenants
            .binary_search_by_key(&id, |t| t.id)
            .ok()
            .map(|i| &self.tenants[i])
    }
}
