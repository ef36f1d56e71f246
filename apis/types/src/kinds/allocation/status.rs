//! What the controllers and agents observe: `AllocationPhase`, per-node reports and
//! `AllocationStatus`.

#[allow(unused_imports)]
use super::*;

/// Allocation phase.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum AllocationPhase {
    /// Waiting in the queue (or for dependencies / quota headroom).
    #[default]
    Pending,
    /// Nodes assigned; data and images being staged.
    Staging,
    /// Running on its nodes.
    Running,
    /// Writing a checkpoint before preemption.
    Checkpointing,
    /// Preempted with a usable checkpoint; will resume.
    Suspended,
    /// Finished successfully.
    Completed,
    /// Finished unsuccessfully (after any requeues).
    Failed,
    /// Cancelled by a user or by DAG failure propagation.
    Cancelled,
}

impl AllocationPhase {
    /// All phases, in lifecycle order.
    pub const ALL: [AllocationPhase; 8] = [
        Self::Pending,
        Self::Staging,
        Self::Running,
        Self::Checkpointing,
        Self::Suspended,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// Completed, Failed or Cancelled: nothing more will happen.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The phase name as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Staging => "Staging",
            Self::Running => "Running",
            Self::Checkpointing => "Checkpointing",
            Self::Suspended => "Suspended",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
            Self::Cancelled => "Cancelled",
        }
    }
}

impl fmt::Display for AllocationPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Progress of a task group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskGroupStatus {
    /// Number of tasks in the range.
    #[serde(default)]
    pub total: u64,
    /// Not started yet.
    #[serde(default)]
    pub pending: u64,
    /// Running now.
    #[serde(default)]
    pub running: u64,
    /// Finished successfully.
    #[serde(default)]
    pub completed: u64,
    /// Finished unsuccessfully.
    #[serde(default)]
    pub failed: u64,
    /// Cancelled (by a user, or because a dependency of theirs can never hold).
    #[serde(default)]
    pub cancelled: u64,
}

/// What one node's agent reports about its part of an allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NodeTaskPhase {
    /// The agent is starting the process (staging, prologue).
    #[default]
    Starting,
    /// The process group is running.
    Running,
    /// Exited with status 0.
    Succeeded,
    /// Exited non-zero, killed, never started, or lost.
    Failed,
}

impl NodeTaskPhase {
    /// Succeeded or Failed: the node's process group is gone.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// One node's report for one attempt of an allocation (`status.nodeStates[node]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeTaskState {
    /// Starting | Running | Succeeded | Failed.
    #[serde(default)]
    pub phase: NodeTaskPhase,
    /// The allocation attempt this report belongs to.
    #[serde(default)]
    pub attempt: u32,
    /// Process (group leader) id on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When the process started on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the process group was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    /// Exit status, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Terminating signal, when it was killed by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// CamelCase reason: `Exited`, `NonZeroExit`, `Signaled`, `WalltimeExceeded`,
    /// `Cancelled`, `StartFailed`, `NotStarted`, `Lost`, `Stopped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Observed state of an allocation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocationStatus {
    /// Pending | Staging | Running | Checkpointing | Suspended | Completed | Failed | Cancelled.
    #[serde(default)]
    pub phase: AllocationPhase,
    /// snake_case reason for the phase (`lattice_apis::lifecycle::reason`), e.g.
    /// `quota_headroom`, `waiting_for_dependencies`, `walltime_exceeded`, `node_failure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail, e.g. "waiting for quota headroom".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Nodes bound to this allocation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assigned_nodes: Vec<String>,
    /// For a job step: the agent address (`host:port`) of each assigned node, in the same
    /// order, as the nodes reported it when the step was bound (empty where a node
    /// reported none). The step's agents reach each other there (the PMI fence), and
    /// `MASTER_ADDR` is the first one's host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_addresses: Vec<String>,
    /// Dragonfly groups the assigned nodes span.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_groups: Vec<u32>,
    /// Original submission time (kept across requeues for fair share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_time: Option<Time>,
    /// When it started running (latest start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    /// Process exit code (first failing task, or 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal number that terminated the process, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Times it was requeued.
    #[serde(default)]
    pub requeue_count: u32,
    /// Times it was preempted.
    #[serde(default)]
    pub preemption_count: u32,
    /// Last successful checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_time: Option<Time>,
    /// Task-group progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TaskGroupStatus>,
    /// VNI of the allocation's network domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Binding attempt: 1 at the first binding, +1 at every re-binding (requeue,
    /// preemption). Agents and node ownership records carry it so a late report from an
    /// earlier attempt never touches the current one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// Effective walltime in seconds stamped at binding (the spec's, or the vCluster's
    /// default); absent for unbounded lifecycles. Agents enforce it from their start time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime_seconds: Option<u64>,
    /// When the scheduler bound the allocation to its nodes (latest attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_time: Option<Time>,
    /// Per assigned node, the agent's report for the current attempt (keyed by node name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_states: BTreeMap<String, NodeTaskState>,
    /// Nodes a running reactive allocation is giving back (scaled down): no longer in
    /// `assignedNodes`, their agents stop the processes, and each node is released (and
    /// leaves this list) once its agent confirmed or it is Down.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releasing_nodes: Vec<String>,
    /// Autoscaling state (reactive allocations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleStatus>,
    /// Conditions such as `Scheduled`, `DependenciesMet`, `DataStaged`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The state of each `spec.dependsOn` entry (Flux RFC 26 `dependency-add` /
    /// `dependency-remove` bookkeeping), written by the allocation controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["description"]))]
    pub dependencies: Vec<DependencyStatus>,
}
