//! What the user asks for: `AllocationSpec` and its parts (environment, resources,
//! lifecycle, scaling, requeue, data, networking, task group, checkpoint, telemetry,
//! liveness).

#[allow(unused_imports)]
use super::*;

/// What the user asks for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocationSpec {
    /// Tenant; when set it must equal `metadata.namespace` (the namespace is the tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Project for accounting (e.g. `gpt-training`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// vCluster to schedule in (a VCluster in the same namespace); optional, the scheduler can infer it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcluster: Option<String>,
    /// Free-form tags, e.g. `{experiment: run-42}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Optional hint for the scheduler (e.g. `train`, `serve`, `interactive`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// Software environment: a uenv (with view) or an OCI image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    /// What to run. When `args` is empty this is a command line run by
    /// `/bin/sh -c`; otherwise it is the program and `args` are its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
    /// Arguments passed to `entrypoint` (no shell interpretation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// An inline batch script (e.g. with `#SBATCH`/`#LATTICE` directives), used instead of `entrypoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Working directory on the node (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Environment variables set for every task.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Node count and hardware constraints.
    #[serde(default)]
    pub resources: Resources,
    /// bounded (batch), unbounded (service) or reactive (autoscaled service).
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// 0 = best effort (preempted first) … 10 = critical/sensitive (never preempted). Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_class: Option<i32>,
    /// What happens after a failure. Default `on_node_failure` with `maxRequeue: 3`
    /// (`never` for sensitive allocations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<Requeue>,
    /// Data to mount (and pre-stage to the hot tier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["target"]))]
    pub data_mounts: Vec<DataMount>,
    /// Auto-mount home, scratch and output directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_defaults: Option<bool>,
    /// Network domain and exposed service ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connectivity: Option<Connectivity>,
    /// Allocations (same tenant) this one waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<Dependency>,
    /// Job array: run the allocation once per index in `range`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_group: Option<TaskGroup>,
    /// How the application is checkpointed before preemption. Default `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    /// Telemetry mode. Default `prod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Telemetry>,
    /// Health probe for unbounded/reactive allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<LivenessProbe>,
    /// Regulated workload: dedicated nodes, class 10, never requeued automatically, audited.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub sensitive: bool,
    /// Job step: the name of a running allocation (same tenant) whose nodes this one runs
    /// on (`lattice launch`, Slurm's `srun` inside an allocation). A step is not
    /// scheduled and takes no quota: the step controller binds it to the first
    /// `resources.nodes` nodes of that allocation once it runs, as the same user, and
    /// cancels it when that allocation ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_of: Option<String>,
    /// How a step's tasks are started: MPI wire-up, task distribution, GPUs per task
    /// (steps only: `lattice launch`, `srun`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<StepLaunch>,
}

/// How a job step's tasks are started (`spec.launch`, steps only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepLaunch {
    /// Process-management interface the tasks find each other through: `none` (the
    /// default), `pmi2` (the agent's PMI server, which speaks the PMI-2 wire and
    /// MPICH's PMI-1 "simple" wire on the same socket), or `pmix` (a PMIx server per
    /// step and node for OpenMPI, in agents built with the `pmix` feature; others fail
    /// the step with `environment_unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi: Option<MpiKind>,
    /// How ranks are laid out over the step's nodes: `block` (the default: consecutive
    /// ranks share a node) or `cyclic` (rank r on node r mod N while nodes have room).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
    /// GPUs bound to each task (`CUDA_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`), from
    /// the GPUs the node reports, in order; a node without enough GPUs fails the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// CPU binding of each task: `none` (the default) or `cores` (the node's CPUs split
    /// into equal, contiguous blocks, one per local task; `LATTICE_TASK_CPUS` lists it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_bind: Option<CpuBind>,
}

/// CPU binding of a step's tasks (`spec.launch.cpuBind`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CpuBind {
    /// Not bound: every task may run on every CPU of the allocation.
    #[default]
    None,
    /// Each task bound to its own equal share of the node's CPUs.
    Cores,
}

impl std::str::FromStr for CpuBind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        // Slurm's `--cpu-bind=[verbose,]TYPE`.
        let kind = s
            .split(',')
            .map(str::trim)
            .find(|w| !w.eq_ignore_ascii_case("verbose") && !w.eq_ignore_ascii_case("quiet"))
            .unwrap_or("");
        match kind.to_ascii_lowercase().as_str() {
            "none" | "no" => Ok(CpuBind::None),
            "cores" | "core" | "threads" | "thread" => Ok(CpuBind::Cores),
            other => Err(format!(
                "unsupported CPU binding {other:?}: use cores (each task its own share of the node's CPUs) or none"
            )),
        }
    }
}

/// The process-management interface of a step (`spec.launch.mpi`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MpiKind {
    /// No wire-up: the tasks only get their rank variables.
    #[default]
    None,
    /// PMI-2 and PMI-1 through the agent's PMI server (`PMI_FD`).
    Pmi2,
    /// PMIx (OpenMPI).
    Pmix,
}

impl MpiKind {
    /// The name as written in a spec and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            MpiKind::None => "none",
            MpiKind::Pmi2 => "pmi2",
            MpiKind::Pmix => "pmix",
        }
    }
}

impl std::str::FromStr for MpiKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(MpiKind::None),
            // Slurm's names for the same server: `pmi2` also serves PMI-1 clients.
            "pmi2" | "pmi" | "pmi1" => Ok(MpiKind::Pmi2),
            "pmix" | "pmix_v4" | "pmix_v3" => Ok(MpiKind::Pmix),
            other => Err(format!(
                "unknown MPI type {other:?}: use none, pmi2 (MPICH, Intel MPI, libpmi2) or pmix"
            )),
        }
    }
}

/// Task distribution over a step's nodes (`spec.launch.distribution`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    /// Consecutive ranks on the same node (Slurm's default).
    #[default]
    Block,
    /// Ranks dealt to the nodes in turn.
    Cyclic,
}

impl std::str::FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        // Slurm writes `block:cyclic` etc. (nodes:sockets); the node level decides here.
        let node_level = s.trim().split([':', ',']).next().unwrap_or("");
        match node_level.to_ascii_lowercase().as_str() {
            "block" | "" => Ok(Distribution::Block),
            "cyclic" => Ok(Distribution::Cyclic),
            other => Err(format!(
                "unknown distribution {other:?}: use block or cyclic"
            )),
        }
    }
}

/// Software environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Environment {
    /// uenv name/version, e.g. `prgenv-gnu/24.11:v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uenv: Option<String>,
    /// uenv view to activate, e.g. `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<String>,
    /// OCI image to run the workload in (`[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`),
    /// pulled by the agent and run by its OCI runtime as the user, instead of a uenv
    /// (`toolsUenv` is still mounted into it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra tools uenv mounted alongside (debuggers, profilers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_uenv: Option<String>,
}

/// Resources: node count and constraints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// Exact node count (`64`) or a range (`{min: 32, max: 128}`). Default 1.
    #[serde(default)]
    pub nodes: NodeCount,
    /// Hardware and placement constraints.
    #[serde(default, skip_serializing_if = "Constraints::is_empty")]
    pub constraints: Constraints,
    /// Claim exactly these nodes by name (`lattice submit --nodelist`). In a
    /// `sensitive-reservation` vCluster (or for a sensitive allocation) the claim is
    /// immediate or rejected: the first claim committed wins and a later one over the same
    /// nodes fails with `OwnershipConflict` naming the holder. Elsewhere the allocation
    /// waits until the named nodes are free. `nodes` must equal the number of names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<String>,
}

/// Node count: exact or a range. Serialized as an integer or `{min, max}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum NodeCount {
    /// Exactly this many nodes.
    Exact(u32),
    /// Between `min` and `max` nodes (elastic).
    Range {
        /// At least this many.
        min: u32,
        /// At most this many.
        max: u32,
    },
}

impl Default for NodeCount {
    fn default() -> Self {
        NodeCount::Exact(1)
    }
}

impl NodeCount {
    /// Smallest node count that satisfies the request.
    pub fn min(&self) -> u32 {
        match *self {
            NodeCount::Exact(n) => n,
            NodeCount::Range { min, .. } => min,
        }
    }
    /// Largest node count the request can use.
    pub fn max(&self) -> u32 {
        match *self {
            NodeCount::Exact(n) => n,
            NodeCount::Range { max, .. } => max,
        }
    }
}

impl fmt::Display for NodeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeCount::Exact(n) => write!(f, "{n}"),
            NodeCount::Range { min, max } => write!(f, "{min}-{max}"),
        }
    }
}

impl<'de> Deserialize<'de> for NodeCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeCount;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a node count (e.g. 64) or a range {min: 32, max: 128}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<NodeCount, E> {
                u32::try_from(v)
                    .map(NodeCount::Exact)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<NodeCount, E> {
                u32::try_from(v)
                    .map(NodeCount::Exact)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NodeCount, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct R {
                    min: u32,
                    max: u32,
                }
                let r = R::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(NodeCount::Range {
                    min: r.min,
                    max: r.max,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for NodeCount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NodeCount".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Exact node count, or a range {min, max}.",
            "anyOf": [
                { "type": "integer", "format": "uint32", "minimum": 1 },
                {
                    "type": "object",
                    "properties": {
                        "min": { "type": "integer", "format": "uint32", "minimum": 1 },
                        "max": { "type": "integer", "format": "uint32", "minimum": 1 }
                    },
                    "required": ["min", "max"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// Placement topology hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// Pack into the fewest dragonfly groups.
    Tight,
    /// No placement preference.
    Any,
}

/// Hardware and placement constraints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Constraints {
    /// GPU model, e.g. `GH200`, `MI300A`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Minimum GPUs per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<u32>,
    /// Required node features, e.g. `nvme_scratch`: every node has all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Groups of alternative node features: every node has at least one feature of each
    /// group (`[[a100, h100], [ib, slingshot]]` is `(a100 OR h100) AND (ib OR slingshot)`,
    /// on top of `features`). Slurm's `--constraint="a100|h100"` becomes one group. Each
    /// node picks for itself, so one allocation may mix `a100` and `h100` nodes. At most
    /// 16 groups of at most 16 features.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub any_of: Vec<Vec<String>>,
    /// Minimum memory per node in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<u64>,
    /// `tight` (fewest groups) or `any`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// Require unified CPU/GPU memory (GH200/MI300A superchips).
    #[serde(default, skip_serializing_if = "skip_false")]
    pub require_unified_memory: bool,
    /// Prefer placing tasks in the same NUMA domain as their GPU.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub prefer_same_numa: bool,
    /// All nodes must share one conformance fingerprint (hard constraint).
    #[serde(default, skip_serializing_if = "skip_false")]
    pub require_conformance: bool,
    /// Allow CXL-attached memory to count towards `memoryGb`.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub allow_cxl_memory: bool,
}

impl Constraints {
    /// True when no constraint is set.
    pub fn is_empty(&self) -> bool {
        *self == Constraints::default()
    }
}

/// Lifecycle type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleType {
    /// Batch: runs to completion or walltime. The default.
    #[default]
    Bounded,
    /// Service: runs until cancelled.
    Unbounded,
    /// Autoscaled service between `scalePolicy.minNodes` and `maxNodes`.
    Reactive,
}

/// How long the allocation lives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lifecycle {
    /// bounded | unbounded | reactive. Default bounded.
    #[serde(rename = "type", default)]
    pub type_: LifecycleType,
    /// Time limit for bounded allocations: `24h`, `1h30m`, `72:00:00`, `1-12:00:00`.
    /// When absent the vCluster's `defaultWalltime` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime: Option<String>,
    /// Autoscaling policy (reactive only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_policy: Option<ScalePolicy>,
}

impl Lifecycle {
    /// The walltime in seconds, if set and valid.
    pub fn walltime_seconds(&self) -> Option<u64> {
        self.walltime
            .as_deref()
            .and_then(|w| parse_duration(w).ok())
    }
}

/// Autoscaling policy for reactive allocations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalePolicy {
    /// Nodes at start and the floor when scaling down.
    #[serde(alias = "min")]
    pub min_nodes: u32,
    /// Ceiling when scaling up.
    #[serde(alias = "max")]
    pub max_nodes: u32,
    /// Metric to track, e.g. `gpu_utilization`, `request_latency_p99`.
    pub metric: String,
    /// Target value, e.g. `0.8` or `"100ms"`.
    pub target: ScaleTarget,
    /// Minimum time between scaling actions, e.g. `5m`. Default 3m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<String>,
    /// How often the metric is evaluated, e.g. `60s`. Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_interval: Option<String>,
    /// How long the metric must stay above the target before one node is added. Default 2m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up_window: Option<String>,
    /// How long the metric must stay below `target × scaleDownThreshold` before one node
    /// is removed. Default 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_window: Option<String>,
    /// Fraction of the target under which the allocation scales down (0–1). Default 0.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_threshold: Option<f64>,
}

/// Autoscaling state of a reactive allocation, written by the autoscaler (decisions) and
/// the scheduler (placing the nodes it asked for).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleStatus {
    /// Nodes the autoscaler wants (within `minNodes..=maxNodes`). The scheduler adds
    /// nodes one proposal at a time while `assignedNodes` has fewer.
    pub desired_nodes: u32,
    /// The metric's last value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_value: Option<f64>,
    /// When the metric was last evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluation_time: Option<Time>,
    /// When the last scale event was decided (the cooldown counts from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// Consecutive failed metric queries (no scaling while it is above 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub metric_failures: u32,
    /// What the autoscaler or scheduler last decided, in words (e.g. why a scale-up waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A scaling target: a number or a string with a unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ScaleTarget {
    /// A plain number, e.g. 0.8.
    Number(f64),
    /// A value with a unit, e.g. "100ms".
    Text(String),
}

impl Default for ScaleTarget {
    fn default() -> Self {
        ScaleTarget::Number(0.0)
    }
}

/// When a failed allocation is requeued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RequeuePolicy {
    /// Fail permanently on any failure (default for interactive sessions and sensitive work).
    Never,
    /// Requeue only on node-side failures (hardware, agent crash, partition). Default for batch.
    OnNodeFailure,
    /// Requeue on any failure, including application crashes.
    Always,
}

/// Requeue policy and limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requeue {
    /// never | on_node_failure | always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<RequeuePolicy>,
    /// After this many requeues the allocation fails regardless of policy (0–100, default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requeue: Option<u32>,
}

/// Data mount access mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MountAccess {
    /// Read-only (default).
    #[default]
    #[serde(rename = "read-only")]
    ReadOnly,
    /// Read-write.
    #[serde(rename = "read-write")]
    ReadWrite,
}

/// Storage tier hint for pre-staging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TierHint {
    /// Pre-stage to the hot (flash) tier before start.
    Hot,
    /// Warm tier.
    Warm,
    /// Leave where it is.
    Cold,
}

/// One data mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataMount {
    /// Where the data lives, e.g. `s3://datasets/imagenet` or `/store/project/data`.
    pub source: String,
    /// Absolute mount path on the node, e.g. `/data/input`.
    pub target: String,
    /// read-only (default) or read-write.
    #[serde(default)]
    pub access: MountAccess,
    /// hot | warm | cold: the scheduler pre-stages `hot` data while the allocation waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_hint: Option<TierHint>,
}

/// Networking.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Connectivity {
    /// Shared network domain (VNI) name within the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_domain: Option<String>,
    /// Ports exposed by a service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub expose: Vec<ExposedPort>,
}

/// Exposed port protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PortProtocol {
    /// TCP (default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

/// A named exposed port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExposedPort {
    /// Port name (DNS label), e.g. `metrics`.
    pub name: String,
    /// 1–65535.
    pub port: u32,
    /// tcp (default) or udp.
    #[serde(default)]
    pub protocol: PortProtocol,
}

/// Job array.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskGroup {
    /// Task indices: `0-99`, `0-15:4` (step), `1,3,5-7`. The index is `$LATTICE_TASK_INDEX`.
    pub range: String,
    /// Maximum tasks running at once (`%20` in `--task-group=0-99%20`). Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// Checkpoint strategy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointStrategy {
    /// The scheduler decides from its cost model (default).
    #[default]
    Auto,
    /// The application manages its own checkpointing.
    Manual,
    /// The application receives a signal (SIGUSR1 by default) before preemption.
    Signal,
    /// The agent calls the application's gRPC checkpoint endpoint on `port`.
    Grpc,
    /// The agent sets a shared-memory flag the application polls.
    Shmem,
    /// Not checkpointable: treated as non-preemptible at class >= 7.
    None,
}

/// Checkpoint configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Checkpoint {
    /// auto (default) | manual | signal | grpc | shmem | none.
    #[serde(default)]
    pub strategy: CheckpointStrategy,
    /// gRPC callback port (strategy grpc), 1–65535.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Signal to send (strategy signal), default `SIGUSR1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// How long the application may take to checkpoint, e.g. `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// Telemetry mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TelemetryMode {
    /// Low-overhead production metrics (default).
    #[default]
    Prod,
    /// High-resolution debugging metrics.
    Debug,
    /// Audit-grade collection (sensitive workloads).
    Audit,
}

/// Telemetry settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Telemetry {
    /// prod (default) | debug | audit.
    #[serde(default)]
    pub mode: TelemetryMode,
    /// How long a non-default mode lasts before reverting, e.g. `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
}

/// Probe kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeType {
    /// TCP connect.
    Tcp,
    /// HTTP GET, 2xx/3xx = healthy.
    Http,
}

fn d30() -> u32 {
    30
}
fn d10() -> u32 {
    10
}
fn d3() -> u32 {
    3
}
fn d5() -> u32 {
    5
}

/// Liveness probe (the seed's `LivenessProbeSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LivenessProbe {
    /// tcp or http.
    pub probe_type: ProbeType,
    /// 1–65535.
    pub port: u32,
    /// HTTP path, e.g. `/healthz` (http only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Seconds between probes (default 30).
    #[serde(default = "d30")]
    pub period_secs: u32,
    /// Seconds before the first probe (default 10).
    #[serde(default = "d10")]
    pub initial_delay_secs: u32,
    /// Consecutive failures before the allocation is marked Failed (default 3).
    #[serde(default = "d3")]
    pub failure_threshold: u32,
    /// Probe timeout in seconds (default 5).
    #[serde(default = "d5")]
    pub timeout_secs: u32,
}
