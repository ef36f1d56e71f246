//! `Allocation`: the universal work unit (batch job, task group, service,
//! autoscaled service, interactive session), mirroring the seed's full Intent
//! API allocation request.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::duration::{parse_duration, DURATION_FORMATS};
use crate::meta::{skip_false, Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{
    check_len, truncate, validate_dns1123_label, validate_dns1123_name, Errors, MAX_SCRIPT_LEN,
    MAX_TEXT_LEN,
};

/// Default `spec.preemptionClass` (the seed: "Normal priority (default: 5)").
pub const DEFAULT_PREEMPTION_CLASS: i32 = 5;
/// Preemption class of sensitive allocations (never preempted).
pub const SENSITIVE_PREEMPTION_CLASS: i32 = 10;
/// Default `spec.requeue.maxRequeue` (the seed: "Max requeue count: Default 3").
pub const DEFAULT_MAX_REQUEUE: u32 = 3;
/// Upper bound of `spec.requeue.maxRequeue` ("max 100, validated at submission").
pub const MAX_MAX_REQUEUE: u32 = 100;
/// Most tasks one task group may expand to.
pub use crate::wellknown::MAX_TASKS;
/// Most nodes one allocation may ask for.
pub const MAX_NODES: u32 = 100_000;
/// A parsed task index range (the grammar is [`crate::syntax::tasks`]).
pub use crate::syntax::tasks::TaskRange;
/// Label of a job-array element: its index (`$LATTICE_TASK_INDEX`). An element may
/// carry its array's `corresponding` dependencies (evaluated for its own index).
pub use crate::wellknown::TASK_INDEX_LABEL;

/// An allocation: what to run, on how many nodes, for how long, and how it
/// may be preempted, requeued and checkpointed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allocation {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Allocation`.
    #[serde(default)]
    pub kind: String,
    /// Name, namespace (= tenant), labels, ...
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state, written by users.
    #[serde(default)]
    pub spec: AllocationSpec,
    /// Observed state, written by the scheduler and node agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AllocationStatus>,
}

impl Allocation {
    /// A new allocation object with type meta filled in.
    pub fn new(name: &str, tenant: &str, spec: AllocationSpec) -> Self {
        Self {
            api_version: crate::registry::API_VERSION.to_string(),
            kind: "Allocation".to_string(),
            metadata: ObjectMeta::named(name, Some(tenant)),
            spec,
            status: None,
        }
    }

    /// The current phase (Pending when there is no status yet).
    pub fn phase(&self) -> AllocationPhase {
        self.status.as_ref().map(|s| s.phase).unwrap_or_default()
    }
}

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
    /// OCI image (run via Sarus), instead of a uenv.
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
    /// Required node features, e.g. `nvme_scratch`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
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

/// Dependency condition (the seed's table, plus Slurm/Flux `after`).
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
#[serde(rename_all = "snake_case")]
pub enum DependencyCondition {
    /// Run after the dependency completes successfully (default; Slurm/Flux `afterok`).
    #[default]
    Success,
    /// Run after the dependency fails (`afternotok`).
    Failure,
    /// Run after the dependency finishes either way, cancellation included (`afterany`).
    Any,
    /// Task groups: task N waits for task N of the dependency (`aftercorr`).
    Corresponding,
    /// Run once the dependency has started running, or ended after starting (Slurm/Flux
    /// `after`). A dependency that ends without ever starting can never satisfy it.
    /// Standalone allocations only (not DAG edges).
    Started,
    /// `ref` names a lock, not an allocation (Slurm `singleton` on that name): at most
    /// one allocation of the same user and tenant holding the lock runs at a time. An
    /// allocation holds the locks it declares with `mutex` and its job name
    /// (`spec.tags.name`, else its name), so a mutex also excludes Slurm `singleton`
    /// jobs of that name. Holders run in submission order.
    Mutex,
}

impl DependencyCondition {
    /// The allowed values, for messages.
    pub const ALLOWED: &'static str = "success, failure, any, corresponding, started, mutex";
    /// The conditions of DAG edges and `--depends-on`, for messages (`started`, Slurm's
    /// `after`, is for standalone allocations' `--dependency`).
    pub const EDGE_ALLOWED: &'static str = "success, failure, any, corresponding, mutex";

    /// Parse a condition name (`success`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "success" => Some(Self::Success),
            "failure" => Some(Self::Failure),
            "any" => Some(Self::Any),
            "corresponding" => Some(Self::Corresponding),
            "started" => Some(Self::Started),
            "mutex" => Some(Self::Mutex),
            _ => None,
        }
    }

    /// The manifest name (`success`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::Any => "any",
            Self::Corresponding => "corresponding",
            Self::Started => "started",
            Self::Mutex => "mutex",
        }
    }

    /// The Slurm/Flux spelling (`afterok`, `afternotok`, `afterany`, `aftercorr`, `after`,
    /// `singleton`).
    pub fn slurm_name(self) -> &'static str {
        match self {
            Self::Success => "afterok",
            Self::Failure => "afternotok",
            Self::Any => "afterany",
            Self::Corresponding => "aftercorr",
            Self::Started => "after",
            Self::Mutex => "singleton",
        }
    }

    /// Parse a Slurm/Flux spelling ([`slurm_name`](Self::slurm_name)).
    pub fn from_slurm_name(s: &str) -> Option<Self> {
        [
            Self::Success,
            Self::Failure,
            Self::Any,
            Self::Corresponding,
            Self::Started,
            Self::Mutex,
        ]
        .into_iter()
        .find(|c| c.slurm_name() == s)
    }
}

impl fmt::Display for DependencyCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Flux RFC 26 `string` scheme access type of a symbolic dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SymbolType {
    /// Wait for every current writer of the symbol (earlier `out`/`inout` allocations).
    In,
    /// Declare this allocation a writer: later `in`/`inout` allocations wait for it.
    Out,
    /// Both: wait for the current writers, then become the writer (chains allocations).
    Inout,
}

impl SymbolType {
    /// Parse `in` | `out` | `inout`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::In, Self::Out, Self::Inout]
            .into_iter()
            .find(|t| t.as_str() == s)
    }

    /// `in` | `out` | `inout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "in",
            Self::Out => "out",
            Self::Inout => "inout",
        }
    }

    /// Whether this declares a writer (`out`, `inout`).
    pub fn writes(self) -> bool {
        matches!(self, Self::Out | Self::Inout)
    }

    /// Whether this waits for writers (`in`, `inout`).
    pub fn reads(self) -> bool {
        matches!(self, Self::In | Self::Inout)
    }
}

/// Flux RFC 26 `string` scheme scope of a symbolic dependency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SymbolScope {
    /// Allocations of the same user (annotation `lattice.dev/user`) in the same tenant (default).
    #[default]
    User,
    /// Every allocation of the tenant.
    Global,
}

impl SymbolScope {
    /// Parse `user` | `global`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::User, Self::Global]
            .into_iter()
            .find(|t| t.as_str() == s)
    }

    /// `user` | `global`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Global => "global",
        }
    }
}

/// One entry of `spec.dependsOn`. Exactly one of these is set:
///
/// * `ref` (+ `condition`): another allocation of the tenant, by name or uid —
///   `{ref: preprocess, condition: success}`; the seed's short form
///   `{preprocess: success}` and the CLI's `"preprocess:success"` are accepted on input
///   and normalized to the long form; with `condition: mutex`, `ref` is a lock name
///   (`{gpu-lock: mutex}`), see [`DependencyCondition::Mutex`];
/// * `beginTime`: not before this wall-clock time, in seconds since the UNIX epoch
///   (Flux `begin-time`, Slurm `--begin`) — `{beginTime: 1767225600}`;
/// * `symbol` (+ `type`, `scope`): a Flux RFC 26 `string` dependency —
///   `{symbol: checkpoint, type: inout, scope: user}`;
/// * `singleton: true`: Slurm `singleton`, at most one allocation with the same job name
///   (`spec.tags.name`, else the allocation name) and user runs at a time.
///
/// Options of standalone allocations' entries (all optional; DAG edges take none):
///
/// * `taskIndex` (with `ref` on a job array, condition success | failure | any |
///   started): wait for that one element of the array, not the whole array (Slurm
///   `afterok:ID_TASK`) — `{ref: sweep, taskIndex: 3}`;
/// * `delay` (with `ref`, condition success | failure | any | started): hold only this
///   long after the event — the dependency's recorded start for `started`, its recorded
///   end otherwise (Slurm `after:ID+MINUTES`) — a duration (`"90s"`, `"5m"`, `"1h"`; a
///   bare string number is minutes as in Slurm) or a number of seconds;
/// * `anyOf: true` (with `ref` — not `corresponding` or `mutex` —, `beginTime` or
///   `singleton`): the entry is one of the alternatives of the allocation's any-of group
///   (Slurm's `?` separator): the group holds once any of its entries holds, and can
///   never hold only when none of them can. Entries without `anyOf` must all hold, as
///   well as the group.
///
/// (An allocation named like one of these keys — `type`, `scope`, `symbol`,
/// `singleton`, `beginTime`, `taskIndex`, `delay`, `anyOf` — needs the long form
/// `{ref: NAME}`.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dependency {
    /// Name or uid of the allocation (or DAG task) depended on; empty for the other
    /// kinds of dependency. Alias: `allocation`.
    pub ref_: String,
    /// With `ref`: success (default) | failure | any | corresponding | started | mutex.
    pub condition: DependencyCondition,
    /// Not before this time (seconds since the UNIX epoch).
    pub begin_time: Option<f64>,
    /// Flux `string` scheme symbol.
    pub symbol: Option<String>,
    /// With `symbol`: in | out | inout.
    pub type_: Option<SymbolType>,
    /// With `symbol`: user (default) | global.
    pub scope: SymbolScope,
    /// Slurm `singleton`.
    pub singleton: bool,
    /// With `ref` on a job array: the one element waited for (Slurm `ID_TASK`).
    pub task_index: Option<u64>,
    /// With `ref`: how long after the dependency's start (`started`) or end (the other
    /// conditions) the entry holds, as written (a duration, see [`parse_duration`]; a
    /// number of seconds is stored as `"Ns"`).
    pub delay: Option<String>,
    /// The entry belongs to the allocation's any-of group (Slurm `?`).
    pub any_of: bool,
}

/// Largest `taskIndex` (task ranges take at most 9 digits).
pub use crate::syntax::tasks::MAX_TASK_INDEX;

/// What a [`Dependency`] waits for (a borrowed view).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DependencyKind<'a> {
    /// Another allocation, by name or uid.
    Allocation {
        /// Name or uid.
        target: &'a str,
        /// When it holds.
        condition: DependencyCondition,
    },
    /// A wall-clock time (epoch seconds).
    BeginTime(f64),
    /// A Flux `string` symbol.
    Symbol {
        /// The symbol.
        name: &'a str,
        /// in | out | inout.
        type_: SymbolType,
        /// user | global.
        scope: SymbolScope,
    },
    /// Slurm `singleton`.
    Singleton,
    /// A lock by name (`{ref: NAME, condition: mutex}`).
    Mutex(&'a str),
}

impl Dependency {
    /// `{ref: target, condition}`.
    pub fn on(target: impl Into<String>, condition: DependencyCondition) -> Self {
        Self {
            ref_: target.into(),
            condition,
            ..Default::default()
        }
    }

    /// `{beginTime: epoch_seconds}`.
    pub fn begin_at(epoch_seconds: f64) -> Self {
        Self {
            begin_time: Some(epoch_seconds),
            ..Default::default()
        }
    }

    /// `{symbol, type, scope}`.
    pub fn symbolic(name: impl Into<String>, type_: SymbolType, scope: SymbolScope) -> Self {
        Self {
            symbol: Some(name.into()),
            type_: Some(type_),
            scope,
            ..Default::default()
        }
    }

    /// `{singleton: true}`.
    pub fn singleton() -> Self {
        Self {
            singleton: true,
            ..Default::default()
        }
    }

    /// This entry on element `index` of the job array it names (`taskIndex`).
    pub fn task(mut self, index: u64) -> Self {
        self.task_index = Some(index);
        self
    }

    /// This entry, holding only `delay` (a duration, e.g. `"5m"`) after the event.
    pub fn delayed(mut self, delay: impl Into<String>) -> Self {
        self.delay = Some(delay.into());
        self
    }

    /// This entry as one alternative of the any-of group (`anyOf: true`).
    pub fn alternative(mut self) -> Self {
        self.any_of = true;
        self
    }

    /// `delay` in seconds; `None` when unset or not a duration (admission rejects that).
    pub fn delay_seconds(&self) -> Option<u64> {
        self.delay.as_deref().and_then(|d| parse_duration(d).ok())
    }

    /// The first option set on this entry that only standalone allocations understand
    /// (`taskIndex`, `delay`, `anyOf`), for validators of DAG edges.
    pub fn standalone_option(&self) -> Option<&'static str> {
        [
            ("taskIndex", self.task_index.is_some()),
            ("delay", self.delay.is_some()),
            ("anyOf", self.any_of),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(f, _)| f)
    }

    /// The kinds set on this entry (a valid entry has exactly one).
    fn kinds_set(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if !self.ref_.is_empty() {
            v.push("ref");
        }
        if self.begin_time.is_some() {
            v.push("beginTime");
        }
        if self.symbol.is_some() {
            v.push("symbol");
        }
        if self.singleton {
            v.push("singleton");
        }
        v
    }

    /// What this entry waits for; `None` for an entry that admission rejects (no kind,
    /// or several).
    pub fn kind(&self) -> Option<DependencyKind<'_>> {
        if self.kinds_set().len() != 1 {
            return None;
        }
        if !self.ref_.is_empty() {
            if self.condition == DependencyCondition::Mutex {
                return Some(DependencyKind::Mutex(&self.ref_));
            }
            return Some(DependencyKind::Allocation {
                target: &self.ref_,
                condition: self.condition,
            });
        }
        if let Some(t) = self.begin_time {
            return Some(DependencyKind::BeginTime(t));
        }
        if let Some(s) = &self.symbol {
            return Some(DependencyKind::Symbol {
                name: s,
                type_: self.type_?,
                scope: self.scope,
            });
        }
        Some(DependencyKind::Singleton)
    }

    /// The RFC 26 description of this dependency (how its `dependency-add` and
    /// `dependency-remove` events are matched): `afterok:prep`, `after:prep`,
    /// `afterok:sweep_3` (`taskIndex`), `after:prep+300s` (`delay`),
    /// `begin-time:1767225600`, `string:ckpt?scope=user&type=inout`, `singleton`,
    /// `mutex:gpu-lock`. (`anyOf` does not change it.)
    pub fn description(&self) -> String {
        match self.kind() {
            Some(DependencyKind::Allocation { target, condition }) => {
                let mut s = format!("{}:{target}", condition.slurm_name());
                if let Some(i) = self.task_index {
                    s.push_str(&format!("_{i}"));
                }
                match (self.delay_seconds(), &self.delay) {
                    (Some(secs), _) => s.push_str(&format!("+{secs}s")),
                    (None, Some(d)) => s.push_str(&format!("+{d}")),
                    (None, None) => {}
                }
                s
            }
            Some(DependencyKind::BeginTime(t)) => format!("begin-time:{t}"),
            Some(DependencyKind::Symbol { name, type_, scope }) => format!(
                "string:{name}?scope={}&type={}",
                scope.as_str(),
                type_.as_str()
            ),
            Some(DependencyKind::Singleton) => "singleton".to_string(),
            Some(DependencyKind::Mutex(name)) => format!("mutex:{name}"),
            None => format!("invalid:{}", self.kinds_set().join("+")),
        }
    }

    pub(crate) fn validate(
        &self,
        dp: &str,
        self_name: Option<&str>,
        task_group: bool,
        errs: &mut Errors,
    ) {
        let set = self.kinds_set();
        match set.as_slice() {
            [] => {
                errs.push(
                    dp.to_string(),
                    "names nothing to wait for: set ref (an allocation name or uid, with condition), beginTime (epoch seconds), symbol (with type in|out|inout) or singleton: true",
                );
                return;
            }
            [_] => {}
            [first, rest @ ..] => {
                errs.push(
                    format!("{dp}.{}", rest[0]),
                    format!(
                        "set only one of ref, beginTime, symbol, singleton per entry (this one also has {first}); split it into separate dependsOn entries"
                    ),
                );
                return;
            }
        }
        if !self.ref_.is_empty() && self.condition == DependencyCondition::Mutex {
            if let Some(msg) = lock_name_error(&self.ref_) {
                errs.push(format!("{dp}.ref"), msg);
            }
        } else if !self.ref_.is_empty() {
            if let Some(e) = validate_dns1123_name(format_args!("{dp}.ref"), &self.ref_) {
                errs.0.push(e);
            } else if Some(self.ref_.as_str()) == self_name {
                errs.push(
                    format!("{dp}.ref"),
                    "an allocation cannot depend on itself; remove this entry",
                );
            }
            if self.condition == DependencyCondition::Corresponding && !task_group {
                errs.push(
                    format!("{dp}.condition"),
                    "`corresponding` links task N to task N of the dependency and needs spec.taskGroup; add a taskGroup or use success|failure|any|started",
                );
            }
        }
        self.validate_options(dp, errs);
        if let Some(t) = self.begin_time {
            if !t.is_finite() || !(0.0..=MAX_BEGIN_TIME).contains(&t) {
                errs.push(
                    format!("{dp}.beginTime"),
                    format!("{t} is not a time: use seconds since the UNIX epoch, e.g. 1767225600 (2026-01-01T00:00:00Z)"),
                );
            }
        }
        if let Some(s) = &self.symbol {
            if s.is_empty()
                || s.len() > 253
                || s.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                errs.push(
                    format!("{dp}.symbol"),
                    format!(
                        "{:?} must be 1-253 characters without spaces, e.g. \"checkpoint\"",
                        truncate(s, 60)
                    ),
                );
            }
            if self.type_.is_none() {
                errs.push(
                    format!("{dp}.type"),
                    "is required with symbol: in (wait for the writers), out (become a writer) or inout (both; chains allocations)",
                );
            }
        }
    }
}

impl Dependency {
    /// `taskIndex`, `delay` and `anyOf`: each names the entries it applies to, and the fix.
    fn validate_options(&self, dp: &str, errs: &mut Errors) {
        use DependencyCondition as C;
        let on_ref = !self.ref_.is_empty();
        if let Some(i) = self.task_index {
            let p = format!("{dp}.taskIndex");
            if !on_ref {
                errs.push(
                    p,
                    "needs ref (the job array): write {ref: ARRAY, taskIndex: N}, e.g. {ref: sweep, taskIndex: 3}",
                );
            } else if self.condition == C::Mutex {
                errs.push(
                    p,
                    "condition mutex names a lock, not a job array; remove taskIndex",
                );
            } else if self.condition == C::Corresponding {
                errs.push(
                    p,
                    "`corresponding` already pairs every element with the element of the same index; remove taskIndex, or use success|failure|any|started to wait for this one element",
                );
            } else if i > MAX_TASK_INDEX {
                errs.push(
                    p,
                    format!("{i} is not a task index: indices go up to {MAX_TASK_INDEX}"),
                );
            }
        }
        if let Some(d) = &self.delay {
            let p = format!("{dp}.delay");
            if !on_ref {
                errs.push(
                    p,
                    "needs ref: a delay counts from another allocation's start (condition started) or end; for a fixed time use beginTime",
                );
            } else if matches!(self.condition, C::Mutex | C::Corresponding) {
                errs.push(
                    p,
                    format!(
                        "applies to conditions success, failure, any and started, not {}; remove delay",
                        self.condition
                    ),
                );
            } else if let Err(e) = parse_duration(d) {
                errs.push(p, e);
            }
        }
        if self.any_of {
            let p = format!("{dp}.anyOf");
            if self.symbol.is_some() {
                errs.push(
                    p,
                    "a symbol (Flux string dependency) cannot be an alternative: it declares a reader or writer; remove anyOf",
                );
            } else if on_ref && self.condition == C::Mutex {
                errs.push(
                    p,
                    "a mutex is a lock this allocation holds, not an alternative; remove anyOf",
                );
            } else if on_ref && self.condition == C::Corresponding {
                errs.push(
                    p,
                    "`corresponding` is evaluated per array element and cannot be an alternative; remove anyOf (or wait for one element with success and taskIndex)",
                );
            }
        }
    }
}

/// Largest accepted `beginTime` (year 9999).
const MAX_BEGIN_TIME: f64 = 253_402_300_799.0;

/// Why `name` is not a valid lock name (`mutex`), if it is not: 1-253 letters, digits,
/// `-`, `_` or `.` (what a job name used with Slurm `singleton` usually is).
pub(crate) fn lock_name_error(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!ok).then(|| {
        format!(
            "{:?} is not a lock name: use 1-253 letters, digits, '-', '_' or '.', e.g. \"gpu-lock\"",
            truncate(name, 60)
        )
    })
}

impl Serialize for Dependency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        if !self.ref_.is_empty() {
            m.serialize_entry("ref", &self.ref_)?;
            m.serialize_entry("condition", &self.condition)?;
        }
        if let Some(t) = self.begin_time {
            m.serialize_entry("beginTime", &t)?;
        }
        if let Some(sym) = &self.symbol {
            m.serialize_entry("symbol", sym)?;
            if let Some(t) = self.type_ {
                m.serialize_entry("type", &t)?;
            }
            m.serialize_entry("scope", &self.scope)?;
        }
        if self.singleton {
            m.serialize_entry("singleton", &true)?;
        }
        if let Some(i) = self.task_index {
            m.serialize_entry("taskIndex", &i)?;
        }
        if let Some(d) = &self.delay {
            m.serialize_entry("delay", d)?;
        }
        if self.any_of {
            m.serialize_entry("anyOf", &true)?;
        }
        m.end()
    }
}

impl JsonSchema for Dependency {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Dependency".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let cond = g.subschema_for::<DependencyCondition>();
        let ty = g.subschema_for::<SymbolType>();
        let scope = g.subschema_for::<SymbolScope>();
        schemars::json_schema!({
            "description": "A dependency. Exactly one of: ref (+condition) on another allocation by name or uid; beginTime (epoch seconds); symbol (+type, scope), a Flux RFC 26 string dependency; singleton: true (Slurm singleton). Standalone allocations' entries may add taskIndex and delay (with ref) and anyOf. Short forms {NAME: CONDITION} and \"NAME[:CONDITION]\" are accepted and normalized to {ref, condition}.",
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "ref": { "type": "string", "description": "Name or uid of the allocation (or DAG task) depended on; with condition mutex, the lock name." },
                        "allocation": { "type": "string", "description": "Alias of ref." },
                        "condition": cond.clone(),
                        "beginTime": { "type": "number", "minimum": 0, "description": "Not before this time, in seconds since the UNIX epoch (Flux begin-time, Slurm --begin)." },
                        "symbol": { "type": "string", "description": "Flux RFC 26 string dependency: the symbol." },
                        "type": ty,
                        "scope": scope,
                        "singleton": { "type": "boolean", "description": "Slurm singleton: at most one allocation with the same job name and user runs at a time." },
                        "taskIndex": { "type": "integer", "minimum": 0, "maximum": MAX_TASK_INDEX, "description": "With ref on a job array (condition success, failure, any or started): wait for this one element (Slurm afterok:ID_TASK)." },
                        "delay": {
                            "anyOf": [{ "type": "string" }, { "type": "integer", "minimum": 0 }],
                            "description": "With ref (condition success, failure, any or started): hold only this long after the dependency's recorded start (started) or end (the others), e.g. \"90s\", \"5m\" (Slurm after:ID+MINUTES); a number is seconds."
                        },
                        "anyOf": { "type": "boolean", "description": "This entry is one alternative of the allocation's any-of group (Slurm '?'): the group holds once any of its entries holds; entries without anyOf must all hold. With ref (not corresponding or mutex), beginTime or singleton." }
                    },
                    "additionalProperties": false
                },
                {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": cond
                },
                { "type": "string" }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for Dependency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Dependency;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dependency {ref: NAME, condition: success|failure|any|corresponding|started|mutex[, taskIndex: N][, delay: DURATION][, anyOf: true]}, {NAME: CONDITION}, {beginTime: EPOCH_SECONDS}, {symbol: NAME, type: in|out|inout, scope: user|global} or {singleton: true}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dependency, E> {
                // "name" or "name:condition" (the CLI's --depends-on form).
                let (r, c) = match v.rsplit_once(':') {
                    Some((r, c)) => (
                        r,
                        DependencyCondition::parse(c).ok_or_else(|| {
                            E::custom(format!(
                                "unknown dependency condition `{c}`, expected one of {}",
                                DependencyCondition::ALLOWED
                            ))
                        })?,
                    ),
                    None => (v, DependencyCondition::Success),
                };
                Ok(Dependency::on(r, c))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Dependency, A::Error> {
                const FIELDS: &str =
                    "`ref`, `condition`, `beginTime`, `symbol`, `type`, `scope`, `singleton`, `taskIndex`, `delay`, `anyOf` (or a single `NAME: CONDITION` pair)";
                let mut out = Dependency::default();
                let mut ref_seen = false;
                let mut condition: Option<DependencyCondition> = None;
                let mut scope: Option<SymbolScope> = None;
                let mut short: Option<(String, DependencyCondition)> = None;
                let mut keys = 0usize;
                while let Some(key) = map.next_key::<String>()? {
                    keys += 1;
                    match key.as_str() {
                        "ref" | "allocation" => {
                            if ref_seen {
                                return Err(de::Error::custom(
                                    "`ref` given twice (ref and allocation are aliases); keep one",
                                ));
                            }
                            ref_seen = true;
                            out.ref_ = map.next_value()?;
                        }
                        "condition" => condition = Some(map.next_value()?),
                        "beginTime" => out.begin_time = Some(map.next_value()?),
                        "symbol" => out.symbol = Some(map.next_value()?),
                        "type" => out.type_ = Some(map.next_value()?),
                        "scope" => scope = Some(map.next_value()?),
                        "singleton" => out.singleton = map.next_value()?,
                        "taskIndex" => out.task_index = Some(map.next_value()?),
                        "delay" => out.delay = Some(map.next_value::<DelayValue>()?.0),
                        "anyOf" => out.any_of = map.next_value()?,
                        _ => {
                            if short.is_some() || keys > 1 {
                                return Err(de::Error::custom(format!(
                                    "unknown field `{key}`, expected one of {FIELDS}"
                                )));
                            }
                            let c: DependencyCondition = map.next_value()?;
                            short = Some((key, c));
                        }
                    }
                }
                if let Some((k, c)) = short {
                    if keys > 1 {
                        return Err(de::Error::custom(format!(
                            "unknown field `{k}`, expected one of {FIELDS}"
                        )));
                    }
                    return Ok(Dependency::on(k, c));
                }
                if let Some(c) = condition {
                    if !ref_seen {
                        return Err(de::Error::custom(
                            "`condition` needs `ref` (the allocation it applies to): write {ref: NAME, condition: CONDITION}",
                        ));
                    }
                    out.condition = c;
                }
                if out.symbol.is_none() {
                    if out.type_.is_some() {
                        return Err(de::Error::custom(
                            "`type` needs `symbol`: write {symbol: NAME, type: in|out|inout}",
                        ));
                    }
                    if scope.is_some() {
                        return Err(de::Error::custom(
                            "`scope` needs `symbol`: write {symbol: NAME, type: in|out|inout, scope: user|global}",
                        ));
                    }
                }
                out.scope = scope.unwrap_or_default();
                if ref_seen && out.ref_.is_empty() {
                    return Err(de::Error::custom(
                        "`ref` is empty: name the allocation (or its uid) depended on",
                    ));
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// A `delay` as written: a duration string, or a whole number of seconds (kept as `"Ns"`).
struct DelayValue(String);

impl<'de> Deserialize<'de> for DelayValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DelayValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a delay: a duration such as \"90s\" or \"5m\", or a whole number of seconds",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DelayValue, E> {
                Ok(DelayValue(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DelayValue, E> {
                Ok(DelayValue(format!("{v}s")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DelayValue, E> {
                u64::try_from(v)
                    .map(|v| DelayValue(format!("{v}s")))
                    .map_err(|_| {
                        E::custom(format!(
                            "delay {v} is negative; write a duration such as \"90s\" or \"5m\""
                        ))
                    })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<DelayValue, E> {
                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64 {
                    Ok(DelayValue(format!("{}s", v as u64)))
                } else {
                    Err(E::custom(format!(
                        "delay {v} is not a whole number of seconds; write a duration such as \"90s\" or \"5m\""
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// RFC 26 bookkeeping of one dependency, written by the allocation controller: a
/// `dependency-add` was posted for `description`, and a `dependency-remove` when
/// `satisfied`. A satisfied dependency stays satisfied (its dependency may be requeued or
/// deleted later).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DependencyStatus {
    /// `afterok:prep`, `after:prep`, `begin-time:1767225600`,
    /// `string:ckpt?scope=user&type=inout`, `singleton`, `mutex:gpu-lock`.
    pub description: String,
    /// The dependency holds.
    #[serde(default)]
    pub satisfied: bool,
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

/// The placeholder of the seed's task-group template (`entrypoint: "python sweep.py
/// --config=${INDEX}"`): each element's entrypoint and arguments carry its index there.
pub const TASK_INDEX_PLACEHOLDER: &str = "${INDEX}";

impl AllocationSpec {
    /// The spec of element `index` of a task group (job array), from the group's spec:
    /// no `taskGroup`, and [`TASK_INDEX_PLACEHOLDER`] in `entrypoint` and `args` replaced
    /// by the index. (Scripts read `$LATTICE_TASK_INDEX` / `$SLURM_ARRAY_TASK_ID`, set by
    /// the agent; a script's own `${INDEX}` is the shell's and left alone.)
    pub fn task_element(&self, index: u64) -> AllocationSpec {
        let mut spec = self.clone();
        spec.task_group = None;
        let i = index.to_string();
        if let Some(e) = spec.entrypoint.as_mut() {
            if e.contains(TASK_INDEX_PLACEHOLDER) {
                *e = e.replace(TASK_INDEX_PLACEHOLDER, &i);
            }
        }
        for a in spec.args.iter_mut() {
            if a.contains(TASK_INDEX_PLACEHOLDER) {
                *a = a.replace(TASK_INDEX_PLACEHOLDER, &i);
            }
        }
        spec
    }

    /// Fill defaults: preemption class, requeue, checkpoint, telemetry.
    pub fn default_fields(&mut self) {
        if self.preemption_class.is_none() {
            self.preemption_class = Some(if self.sensitive {
                SENSITIVE_PREEMPTION_CLASS
            } else {
                DEFAULT_PREEMPTION_CLASS
            });
        }
        let requeue = self.requeue.get_or_insert(Requeue {
            policy: None,
            max_requeue: None,
        });
        if requeue.policy.is_none() {
            requeue.policy = Some(
                if self.sensitive
                    || self.intent.as_deref() == Some("interactive")
                    || self.step_of.is_some()
                {
                    RequeuePolicy::Never
                } else {
                    RequeuePolicy::OnNodeFailure
                },
            );
        }
        if requeue.max_requeue.is_none() {
            requeue.max_requeue = Some(DEFAULT_MAX_REQUEUE);
        }
        let cp = self.checkpoint.get_or_insert_with(Checkpoint::default);
        if cp.strategy == CheckpointStrategy::Signal && cp.signal.is_none() {
            cp.signal = Some("SIGUSR1".to_string());
        }
        if self.telemetry.is_none() {
            self.telemetry = Some(Telemetry {
                mode: if self.sensitive {
                    TelemetryMode::Audit
                } else {
                    TelemetryMode::Prod
                },
                duration: None,
            });
        }
    }

    /// Validate the spec; `p` is the path prefix (`spec`, or `spec.allocations[2].spec` in a Dag).
    pub(crate) fn validate(
        &self,
        p: &str,
        self_name: Option<&str>,
        namespace: Option<&str>,
        errs: &mut Errors,
    ) {
        self.validate_as(p, self_name, namespace, false, errs)
    }

    /// [`Self::validate`]; `element`: the allocation is an element of a job array
    /// (labelled [`TASK_INDEX_LABEL`]), which may carry its array's `corresponding`
    /// dependencies without a `taskGroup` of its own.
    pub(crate) fn validate_as(
        &self,
        p: &str,
        self_name: Option<&str>,
        namespace: Option<&str>,
        element: bool,
        errs: &mut Errors,
    ) {
        if let (Some(t), Some(ns)) = (&self.tenant, namespace) {
            if t != ns {
                errs.push(
                    format!("{p}.tenant"),
                    format!("is {:?} but metadata.namespace (the tenant) is {ns:?}; remove spec.tenant or make them equal", truncate(t, 63)),
                );
            }
        } else if let Some(t) = &self.tenant {
            errs.extend(validate_dns1123_label(format_args!("{p}.tenant"), t));
        }
        if let Some(v) = &self.vcluster {
            errs.extend(validate_dns1123_label(format_args!("{p}.vcluster"), v));
        }
        if let Some(pr) = &self.project {
            check_len(errs, format_args!("{p}.project"), pr, 253);
        }
        if let Some(i) = &self.intent {
            check_len(errs, format_args!("{p}.intent"), i, 253);
        }
        for (k, v) in &self.tags {
            if k.is_empty() || k.len() > 63 {
                errs.push(
                    format!("{p}.tags"),
                    format!("tag key {:?} must be 1–63 characters", truncate(k, 70)),
                );
            }
            check_len(
                errs,
                format_args!("{p}.tags[{:?}]", truncate(k, 63)),
                v,
                256,
            );
        }
        for (k, v) in &self.env {
            let valid = !k.is_empty()
                && k.len() <= 255
                && !k.as_bytes()[0].is_ascii_digit()
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                errs.push(
                    format!("{p}.env[{:?}]", truncate(k, 63)),
                    "environment variable names must be letters, digits and '_', not starting with a digit (e.g. \"OMP_NUM_THREADS\")",
                );
            }
            check_len(
                errs,
                format_args!("{p}.env[{:?}]", truncate(k, 63)),
                v,
                128 * 1024,
            );
        }
        if let Some(env) = &self.environment {
            let ep = format!("{p}.environment");
            if env.uenv.is_some() && env.image.is_some() {
                errs.push(
                    format!("{ep}.image"),
                    "set either environment.uenv or environment.image, not both (a uenv runs natively, an image runs in a container)",
                );
            }
            if env.view.is_some() && env.uenv.is_none() {
                errs.push(format!("{ep}.view"), "needs environment.uenv: a view is activated from a uenv; set uenv or remove view");
            }
            for (field, v) in [
                ("uenv", &env.uenv),
                ("view", &env.view),
                ("image", &env.image),
                ("toolsUenv", &env.tools_uenv),
            ] {
                if let Some(v) = v {
                    if v.trim().is_empty() || v.chars().any(char::is_whitespace) {
                        errs.push(format!("{ep}.{field}"), format!("{:?} must be non-empty and contain no spaces, e.g. \"prgenv-gnu/24.11:v1\"", truncate(v, 60)));
                    }
                    check_len(errs, format_args!("{ep}.{field}"), v, 512);
                }
            }
        }
        match (&self.entrypoint, &self.script) {
            (None, None) => errs.push(
                format!("{p}.entrypoint"),
                "is required: set spec.entrypoint (e.g. \"/bin/sh\" with args [\"-c\", \"echo hi\"]) or spec.script",
            ),
            (Some(_), Some(_)) => errs.push(
                format!("{p}.script"),
                "set either spec.entrypoint or spec.script, not both",
            ),
            (Some(e), None) => {
                if e.trim().is_empty() {
                    errs.push(format!("{p}.entrypoint"), "is empty; set the command to run, e.g. \"/bin/sh\"");
                }
                check_len(errs, format_args!("{p}.entrypoint"), e, MAX_TEXT_LEN);
            }
            (None, Some(s)) => {
                if s.trim().is_empty() {
                    errs.push(format!("{p}.script"), "is empty; put the batch script's text here");
                }
                check_len(errs, format_args!("{p}.script"), s, MAX_SCRIPT_LEN);
            }
        }
        if self.script.is_some() && !self.args.is_empty() {
            errs.push(
                format!("{p}.args"),
                "args are passed to spec.entrypoint; with spec.script put arguments in the script",
            );
        }
        if self.args.len() > 4096 {
            errs.push(
                format!("{p}.args"),
                format!("has {} entries, the limit is 4096", self.args.len()),
            );
        }
        for (i, a) in self.args.iter().enumerate().take(4096) {
            check_len(errs, format_args!("{p}.args[{i}]"), a, 128 * 1024);
        }
        if let Some(w) = &self.working_dir {
            if !w.starts_with('/') {
                errs.push(
                    format!("{p}.workingDir"),
                    format!(
                        "{:?} must be an absolute path, e.g. \"/scratch/me\"",
                        truncate(w, 60)
                    ),
                );
            }
            check_len(errs, format_args!("{p}.workingDir"), w, MAX_TEXT_LEN);
        }
        self.validate_resources(p, errs);
        self.validate_step_of(p, self_name, errs);
        self.validate_lifecycle(p, errs);
        if let Some(c) = self.preemption_class {
            if !(0..=10).contains(&c) {
                errs.push(
                    format!("{p}.preemptionClass"),
                    format!("must be between 0 and 10, got {c}; use 0 (best effort) … 5 (normal, the default) … 10 (highest, never preempted)"),
                );
            } else if self.sensitive && c != SENSITIVE_PREEMPTION_CLASS {
                errs.push(
                    format!("{p}.preemptionClass"),
                    format!("sensitive allocations are always class 10, got {c}; remove preemptionClass or set it to 10"),
                );
            }
        }
        if let Some(rq) = &self.requeue {
            if let Some(m) = rq.max_requeue {
                if m > MAX_MAX_REQUEUE {
                    errs.push(
                        format!("{p}.requeue.maxRequeue"),
                        format!("must be at most {MAX_MAX_REQUEUE}, got {m}; lower it (the default is {DEFAULT_MAX_REQUEUE})"),
                    );
                }
            }
            if self.sensitive
                && matches!(
                    rq.policy,
                    Some(RequeuePolicy::Always | RequeuePolicy::OnNodeFailure)
                )
            {
                errs.push(
                    format!("{p}.requeue.policy"),
                    "sensitive allocations are never requeued automatically; set policy: never or remove it",
                );
            }
        }
        let mut targets = BTreeSet::new();
        for (i, m) in self.data_mounts.iter().enumerate() {
            let mp = format!("{p}.dataMounts[{i}]");
            if m.source.trim().is_empty() {
                errs.push(
                    format!("{mp}.source"),
                    "is required, e.g. \"s3://datasets/imagenet\" or \"/store/data\"",
                );
            }
            check_len(errs, format_args!("{mp}.source"), &m.source, MAX_TEXT_LEN);
            if !m.target.starts_with('/') {
                errs.push(
                    format!("{mp}.target"),
                    format!(
                        "{:?} must be an absolute path, e.g. \"/data/input\"",
                        truncate(&m.target, 60)
                    ),
                );
            } else if m.target.split('/').any(|c| c == "..") {
                errs.push(
                    format!("{mp}.target"),
                    "must not contain '..'; use a normalized absolute path",
                );
            }
            check_len(errs, format_args!("{mp}.target"), &m.target, MAX_TEXT_LEN);
            if !targets.insert(m.target.as_str()) {
                errs.push(
                    format!("{mp}.target"),
                    format!(
                        "{:?} is mounted twice; give each mount its own target",
                        truncate(&m.target, 60)
                    ),
                );
            }
        }
        if let Some(c) = &self.connectivity {
            if let Some(d) = &c.network_domain {
                errs.extend(validate_dns1123_label(
                    format_args!("{p}.connectivity.networkDomain"),
                    d,
                ));
            }
            let mut names = BTreeSet::new();
            for (i, e) in c.expose.iter().enumerate() {
                let ep = format!("{p}.connectivity.expose[{i}]");
                errs.extend(validate_dns1123_label(format_args!("{ep}.name"), &e.name));
                if !names.insert(e.name.as_str()) {
                    errs.push(
                        format!("{ep}.name"),
                        format!(
                            "{:?} is used twice; port names must be unique",
                            truncate(&e.name, 63)
                        ),
                    );
                }
                if !(1..=65535).contains(&e.port) {
                    errs.push(
                        format!("{ep}.port"),
                        format!("must be between 1 and 65535, got {}", e.port),
                    );
                }
            }
        }
        let mut seen = BTreeSet::new();
        if self.depends_on.len() > 1000 {
            errs.push(
                format!("{p}.dependsOn"),
                format!("has {} entries, the limit is 1000", self.depends_on.len()),
            );
        }
        let mut seen_time = false;
        let mut seen_singleton = false;
        for (i, d) in self.depends_on.iter().enumerate().take(1000) {
            let dp = format!("{p}.dependsOn[{i}]");
            d.validate(&dp, self_name, self.task_group.is_some() || element, errs);
            let duplicate = match d.kind() {
                Some(DependencyKind::Allocation { target, .. }) => match d.task_index {
                    // One element of a job array is a dependency of its own.
                    Some(t) => (!seen.insert(format!("ref:{target}_{t}"))).then(|| {
                        (
                            "taskIndex",
                            format!(
                                "task {t} of {:?} is listed twice; keep one entry per dependency",
                                truncate(target, 63)
                            ),
                        )
                    }),
                    None => (!seen.insert(format!("ref:{target}"))).then(|| {
                        (
                            "ref",
                            format!(
                                "{:?} is listed twice; keep one entry per dependency",
                                truncate(target, 63)
                            ),
                        )
                    }),
                },
                Some(DependencyKind::Symbol { name, .. }) => (!seen
                    .insert(format!("symbol:{name}")))
                .then(|| {
                    (
                        "symbol",
                        format!(
                            "{:?} is listed twice; keep one entry per symbol (inout both reads and writes it)",
                            truncate(name, 63)
                        ),
                    )
                }),
                Some(DependencyKind::BeginTime(_)) => std::mem::replace(&mut seen_time, true)
                    .then(|| {
                        (
                            "beginTime",
                            "is given twice; keep one beginTime".to_string(),
                        )
                    }),
                Some(DependencyKind::Singleton) => std::mem::replace(&mut seen_singleton, true)
                    .then(|| ("singleton", "is given twice; keep one".to_string())),
                Some(DependencyKind::Mutex(name)) => (!seen.insert(format!("mutex:{name}")))
                    .then(|| {
                        (
                            "ref",
                            format!(
                                "mutex {:?} is listed twice; keep one entry per lock",
                                truncate(name, 63)
                            ),
                        )
                    }),
                None => None,
            };
            if let Some((field, msg)) = duplicate {
                errs.push(format!("{dp}.{field}"), msg);
            }
        }
        if let Some(tg) = &self.task_group {
            let tp = format!("{p}.taskGroup");
            if let Err(e) = TaskRange::parse(&tg.range) {
                errs.push(format!("{tp}.range"), e);
            }
            if tg.concurrency == Some(0) {
                errs.push(
                    format!("{tp}.concurrency"),
                    "must be at least 1; remove it for no limit",
                );
            }
            if self.lifecycle.type_ != LifecycleType::Bounded {
                errs.push(
                    tp.clone(),
                    "task groups are batch arrays and need lifecycle.type: bounded",
                );
            }
        }
        if let Some(cp) = &self.checkpoint {
            let cpp = format!("{p}.checkpoint");
            match (cp.strategy, cp.port) {
                (CheckpointStrategy::Grpc, None) => errs.push(format!("{cpp}.port"), "is required for strategy grpc: set the port your checkpoint endpoint listens on (e.g. 9999)"),
                (CheckpointStrategy::Grpc, Some(port)) if !(1..=65535).contains(&port) => {
                    errs.push(format!("{cpp}.port"), format!("must be between 1 and 65535, got {port}"))
                }
                (s, Some(_)) if s != CheckpointStrategy::Grpc => errs.push(format!("{cpp}.port"), "is only used with strategy grpc; remove it"),
                _ => {}
            }
            if let Some(sig) = &cp.signal {
                if cp.strategy != CheckpointStrategy::Signal {
                    errs.push(
                        format!("{cpp}.signal"),
                        "is only used with strategy signal; remove it",
                    );
                } else if !is_signal_name(sig) {
                    errs.push(format!("{cpp}.signal"), format!("{:?} is not a signal name; use e.g. \"SIGUSR1\", \"SIGUSR2\" or \"SIGTERM\"", truncate(sig, 20)));
                }
            }
            if let Some(t) = &cp.timeout {
                if let Err(e) = parse_duration(t) {
                    errs.push(format!("{cpp}.timeout"), e);
                }
            }
        }
        if let Some(t) = &self.telemetry {
            if let Some(d) = &t.duration {
                if let Err(e) = parse_duration(d) {
                    errs.push(format!("{p}.telemetry.duration"), e);
                }
            }
            if self.sensitive && t.mode != TelemetryMode::Audit {
                errs.push(
                    format!("{p}.telemetry.mode"),
                    "sensitive allocations use audit telemetry; set mode: audit or remove it",
                );
            }
        }
        if let Some(pr) = &self.liveness_probe {
            let pp = format!("{p}.livenessProbe");
            if !(1..=65535).contains(&pr.port) {
                errs.push(
                    format!("{pp}.port"),
                    format!("must be between 1 and 65535, got {}", pr.port),
                );
            }
            match (pr.probe_type, &pr.path) {
                (ProbeType::Http, None) => errs.push(
                    format!("{pp}.path"),
                    "is required for http probes, e.g. \"/healthz\"",
                ),
                (ProbeType::Http, Some(path)) if !path.starts_with('/') => errs.push(
                    format!("{pp}.path"),
                    format!(
                        "{:?} must start with '/', e.g. \"/healthz\"",
                        truncate(path, 60)
                    ),
                ),
                (ProbeType::Tcp, Some(_)) => errs.push(
                    format!("{pp}.path"),
                    "is only used by http probes; remove it or set probeType: http",
                ),
                _ => {}
            }
            for (field, v) in [
                ("periodSecs", pr.period_secs),
                ("failureThreshold", pr.failure_threshold),
                ("timeoutSecs", pr.timeout_secs),
            ] {
                if v == 0 {
                    errs.push(format!("{pp}.{field}"), "must be at least 1");
                }
            }
            if pr.timeout_secs > pr.period_secs && pr.period_secs > 0 {
                errs.push(
                    format!("{pp}.timeoutSecs"),
                    format!(
                        "({}) must not exceed periodSecs ({})",
                        pr.timeout_secs, pr.period_secs
                    ),
                );
            }
            if self.lifecycle.type_ == LifecycleType::Bounded {
                errs.push(pp.clone(), "liveness probes apply to services: set lifecycle.type to unbounded or reactive, or remove the probe");
            }
        }
    }

    fn validate_resources(&self, p: &str, errs: &mut Errors) {
        let np = || format!("{p}.resources.nodes");
        match self.resources.nodes {
            NodeCount::Exact(0) => errs.push(np(), "must be at least 1, got 0"),
            NodeCount::Exact(n) if n > MAX_NODES => {
                errs.push(np(), format!("must be at most {MAX_NODES}, got {n}"))
            }
            NodeCount::Range { min, max } => {
                if min == 0 {
                    errs.push(format!("{}.min", np()), "must be at least 1, got 0");
                }
                if min > max {
                    errs.push(
                        format!("{}.min", np()),
                        format!("({min}) must be <= max ({max}); swap them or raise max"),
                    );
                }
                if max > MAX_NODES {
                    errs.push(
                        format!("{}.max", np()),
                        format!("must be at most {MAX_NODES}, got {max}"),
                    );
                }
            }
            _ => {}
        }
        self.validate_node_names(p, errs);
        let c = &self.resources.constraints;
        let cp = || format!("{p}.resources.constraints");
        if let Some(g) = c.gpu_count {
            if g == 0 || g > 64 {
                errs.push(format!("{}.gpuCount", cp()), format!("must be between 1 and 64 GPUs per node, got {g}; remove it for CPU-only work"));
            }
        }
        if let Some(t) = &c.gpu_type {
            if t.trim().is_empty() || t.len() > 64 {
                errs.push(
                    format!("{}.gpuType", cp()),
                    "must be a GPU model name of 1–64 characters, e.g. \"GH200\"",
                );
            }
        }
        if c.memory_gb == Some(0) {
            errs.push(
                format!("{}.memoryGb", cp()),
                "must be at least 1; remove it for no memory constraint",
            );
        }
        let mut feats = BTreeSet::new();
        for (i, f) in c.features.iter().enumerate() {
            if f.is_empty()
                || f.len() > 63
                || !f
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
            {
                errs.push(format!("{}.features[{i}]", cp()), format!("{:?} is not a feature name: use letters, digits, '_', '-' or '.' (e.g. \"nvme_scratch\")", truncate(f, 40)));
            } else if !feats.insert(f.as_str()) {
                errs.push(
                    format!("{}.features[{i}]", cp()),
                    format!("{f:?} is listed twice"),
                );
            }
        }
    }

    fn validate_step_of(&self, p: &str, self_name: Option<&str>, errs: &mut Errors) {
        let Some(parent) = &self.step_of else {
            return;
        };
        let sp = format!("{p}.stepOf");
        if let Some(e) = validate_dns1123_name(&sp, parent) {
            errs.0.push(e);
            return;
        }
        if self_name == Some(parent.as_str()) {
            errs.push(
                sp.clone(),
                "names the allocation itself; name the allocation to run in",
            );
        }
        if self.lifecycle.type_ != LifecycleType::Bounded {
            errs.push(
                format!("{p}.lifecycle.type"),
                "must be bounded for a step (it ends with its command, within its allocation's walltime); remove it or set bounded",
            );
        }
        if self
            .requeue
            .as_ref()
            .and_then(|r| r.policy)
            .is_some_and(|pol| pol != RequeuePolicy::Never)
        {
            errs.push(
                format!("{p}.requeue.policy"),
                "must be never for a step (a step does not outlive its allocation's attempt); set never or remove it",
            );
        }
        let conflicts = [
            (
                self.task_group.is_some(),
                "taskGroup",
                "launch one step per index instead",
            ),
            (
                !self.depends_on.is_empty(),
                "dependsOn",
                "a step starts as soon as its allocation runs",
            ),
            (
                !self.resources.node_names.is_empty(),
                "resources.nodeNames",
                "a step runs on its allocation's nodes",
            ),
            (
                self.sensitive,
                "sensitive",
                "a step inherits its allocation's isolation",
            ),
        ];
        for (set, field, why) in conflicts {
            if set {
                errs.push(
                    format!("{p}.{field}"),
                    format!("cannot be combined with stepOf ({why}); remove {field}"),
                );
            }
        }
    }

    fn validate_node_names(&self, p: &str, errs: &mut Errors) {
        let names = &self.resources.node_names;
        if names.is_empty() {
            return;
        }
        let np = format!("{p}.resources.nodeNames");
        let mut seen = BTreeSet::new();
        for (i, n) in names.iter().enumerate() {
            let e = validate_dns1123_name(format_args!("{np}[{i}]"), n);
            if e.is_some() {
                errs.extend(e);
            } else if !seen.insert(n.as_str()) {
                errs.push(format!("{np}[{i}]"), format!("{n:?} is listed twice"));
            }
        }
        match self.resources.nodes {
            NodeCount::Exact(n) if n as usize == names.len() => {}
            NodeCount::Exact(n) => errs.push(
                format!("{p}.resources.nodes"),
                format!(
                    "is {n} but resources.nodeNames names {} node(s); set nodes: {} or change the list",
                    names.len(),
                    names.len()
                ),
            ),
            NodeCount::Range { .. } => errs.push(
                format!("{p}.resources.nodes"),
                format!(
                    "must be an exact count with resources.nodeNames: set nodes: {}",
                    names.len()
                ),
            ),
        }
        if self.task_group.is_some() {
            errs.push(
                np,
                "cannot be combined with taskGroup (every element would claim the same nodes); submit one allocation per claim",
            );
        }
    }

    fn validate_lifecycle(&self, p: &str, errs: &mut Errors) {
        let lp = || format!("{p}.lifecycle");
        if let Some(w) = &self.lifecycle.walltime {
            match parse_duration(w) {
                Ok(0) => errs.push(
                    format!("{}.walltime", lp()),
                    format!("must be longer than zero; {DURATION_FORMATS}"),
                ),
                Ok(_) => {}
                Err(e) => errs.push(format!("{}.walltime", lp()), e),
            }
        }
        match (self.lifecycle.type_, &self.lifecycle.scale_policy) {
            (LifecycleType::Reactive, None) => errs.push(
                format!("{}.scalePolicy", lp()),
                "is required for reactive allocations: set {minNodes, maxNodes, metric, target}, e.g. {minNodes: 1, maxNodes: 8, metric: gpu_utilization, target: 0.8}",
            ),
            (LifecycleType::Reactive, Some(sp)) => {
                let sp_p = || format!("{}.scalePolicy", lp());
                if sp.min_nodes == 0 {
                    errs.push(format!("{}.minNodes", sp_p()), "must be at least 1");
                }
                if sp.min_nodes > sp.max_nodes {
                    errs.push(format!("{}.minNodes", sp_p()), format!("({}) must be <= maxNodes ({}); swap them or raise maxNodes", sp.min_nodes, sp.max_nodes));
                }
                if sp.max_nodes > MAX_NODES {
                    errs.push(format!("{}.maxNodes", sp_p()), format!("must be at most {MAX_NODES}, got {}", sp.max_nodes));
                }
                if sp.metric.trim().is_empty() || sp.metric.len() > 256 {
                    errs.push(format!("{}.metric", sp_p()), "must name a metric (1–256 characters), e.g. \"gpu_utilization\"");
                } else if let Err(e) = crate::metric::MetricSelector::parse(&sp.metric) {
                    errs.push(format!("{}.metric", sp_p()), e);
                }
                match &sp.target {
                    ScaleTarget::Number(n) if !n.is_finite() || *n < 0.0 => {
                        errs.push(format!("{}.target", sp_p()), format!("must be a non-negative number, got {n}"))
                    }
                    ScaleTarget::Text(t) if t.trim().is_empty() || t.len() > 64 => {
                        errs.push(format!("{}.target", sp_p()), "must be a number (0.8) or a value with a unit (\"100ms\")")
                    }
                    _ => {}
                }
                for (field, v) in [
                    ("cooldown", &sp.cooldown),
                    ("evaluationInterval", &sp.evaluation_interval),
                    ("scaleUpWindow", &sp.scale_up_window),
                    ("scaleDownWindow", &sp.scale_down_window),
                ] {
                    if let Some(d) = v {
                        if let Err(e) = parse_duration(d) {
                            errs.push(format!("{}.{field}", sp_p()), e);
                        }
                    }
                }
                if let Some(t) = sp.scale_down_threshold {
                    if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
                        errs.push(
                            format!("{}.scaleDownThreshold", sp_p()),
                            format!("must be between 0 and 1 (a fraction of the target), got {t}"),
                        );
                    }
                }
            }
            (t, Some(_)) => errs.push(
                format!("{}.scalePolicy", lp()),
                format!("is only used by reactive allocations, but lifecycle.type is {}; set type: reactive or remove scalePolicy", match t { LifecycleType::Bounded => "bounded", LifecycleType::Unbounded => "unbounded", LifecycleType::Reactive => "reactive" }),
            ),
            _ => {}
        }
    }
}

fn is_signal_name(s: &str) -> bool {
    matches!(
        s.trim_start_matches("SIG"),
        "USR1"
            | "USR2"
            | "TERM"
            | "INT"
            | "HUP"
            | "QUIT"
            | "CONT"
            | "STOP"
            | "TSTP"
            | "WINCH"
            | "ALRM"
    )
}

impl AllocationStatus {
    fn validate(&self, errs: &mut Errors) {
        let mut seen = BTreeSet::new();
        for (i, n) in self.assigned_nodes.iter().enumerate() {
            if let Some(e) = validate_dns1123_name(format_args!("status.assignedNodes[{i}]"), n) {
                errs.0.push(e);
            } else if !seen.insert(n.as_str()) {
                errs.push(
                    format!("status.assignedNodes[{i}]"),
                    format!("node {n:?} is assigned twice"),
                );
            }
        }
        if let (Some(s), Some(e)) = (self.start_time, self.end_time) {
            if e < s {
                errs.push("status.endTime", "is before status.startTime");
            }
        }
        if let Some(v) = self.vni {
            if v == 0 || v > 0x00FF_FFFF {
                errs.push(
                    "status.vni",
                    format!("must be between 1 and 16777215, got {v}"),
                );
            }
        }
    }
}

impl Resource for Allocation {
    const KIND: &'static str = "Allocation";
    const PLURAL: &'static str = "allocations";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        self.spec.default_fields();
    }

    fn validate_fields(&self, errs: &mut Errors) {
        self.spec.validate_as(
            "spec",
            self.metadata.name.as_deref(),
            self.metadata.namespace.as_deref(),
            self.metadata.labels.contains_key(TASK_INDEX_LABEL),
            errs,
        );
        if let Some(parent) = &self.spec.step_of {
            // The step controller finds an allocation's steps through this reference
            // (and garbage collection deletes them with it).
            let owned =
                self.metadata.owner_references.iter().any(|o| {
                    o.kind == "Allocation" && &o.name == parent && o.controller == Some(true)
                });
            if !owned {
                errs.push(
                    "metadata.ownerReferences",
                    format!(
                        "a step (spec.stepOf: {parent}) must be owned by its allocation: add {{apiVersion: {}, kind: Allocation, name: {parent}, uid: <its uid>, controller: true}} (lattice launch does)",
                        crate::API_VERSION
                    ),
                );
            }
        }
        if let Some(st) = &self.status {
            st.validate(errs);
        }
    }
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

#[cfg(test)]
mod dependency_tests {
    use super::*;
    use crate::kinds::dag::Dag;
    use serde_json::json;

    fn errors<T: Resource + serde::de::DeserializeOwned>(v: serde_json::Value) -> Vec<String> {
        let mut o: T = serde_json::from_value(v).expect("parses");
        o.fill_type_meta();
        match o.validate() {
            Ok(()) => Vec::new(),
            Err(e) => e.to_string().lines().map(String::from).collect(),
        }
    }

    fn alloc(labels: serde_json::Value, spec: serde_json::Value) -> serde_json::Value {
        let mut spec = spec;
        spec["entrypoint"] = json!("/bin/true");
        json!({"metadata": {"name": "b", "namespace": "t1", "labels": labels}, "spec": spec})
    }

    #[test]
    fn mutex_names_a_lock() {
        let v = alloc(
            json!({}),
            json!({"dependsOn": [{"gpu_lock.v2": "mutex"}, "other-lock:mutex", {"ref": "prep"}]}),
        );
        assert!(errors::<Allocation>(v.clone()).is_empty());
        let a: Allocation = serde_json::from_value(v).unwrap();
        assert_eq!(
            a.spec.depends_on[0].kind(),
            Some(DependencyKind::Mutex("gpu_lock.v2"))
        );
        assert_eq!(a.spec.depends_on[1].description(), "mutex:other-lock");
        assert_eq!(
            serde_json::to_value(&a.spec.depends_on[0]).unwrap(),
            json!({"ref": "gpu_lock.v2", "condition": "mutex"})
        );
        // A lock and an allocation of the same name are different entries.
        let both = alloc(
            json!({}),
            json!({"dependsOn": [{"x": "mutex"}, {"x": "success"}]}),
        );
        assert!(errors::<Allocation>(both).is_empty());
        let bad = alloc(
            json!({}),
            json!({"dependsOn": [{"ref": "a lock", "condition": "mutex"}]}),
        );
        let e = errors::<Allocation>(bad);
        assert!(e.iter().any(|l| l.contains("is not a lock name")), "{e:?}");
        let twice = alloc(json!({}), json!({"dependsOn": ["l:mutex", {"l": "mutex"}]}));
        let e = errors::<Allocation>(twice);
        assert!(e.iter().any(|l| l.contains("listed twice")), "{e:?}");
    }

    #[test]
    fn corresponding_needs_a_task_group_or_an_element() {
        let dep = json!({"dependsOn": [{"a": "corresponding"}]});
        let e = errors::<Allocation>(alloc(json!({}), dep.clone()));
        assert!(
            e.iter().any(|l| l.contains("needs spec.taskGroup")),
            "{e:?}"
        );
        let mut group = dep.clone();
        group["taskGroup"] = json!({"range": "0-3"});
        assert!(errors::<Allocation>(alloc(json!({}), group)).is_empty());
        // An element of a job array carries its array's corresponding entries.
        let element = alloc(json!({TASK_INDEX_LABEL: "2"}), dep);
        assert!(errors::<Allocation>(element).is_empty());
    }

    #[test]
    fn task_index_delay_and_any_of_parse_round_trip_and_describe() {
        let v = alloc(
            json!({}),
            json!({"dependsOn": [
                {"ref": "prep", "condition": "success", "delay": "5m", "anyOf": true},
                {"ref": "sweep", "taskIndex": 3, "condition": "any", "anyOf": true},
                {"ref": "sweep", "condition": "success"},
                {"ref": "server", "condition": "started", "delay": 90},
                {"singleton": true, "anyOf": true},
            ]}),
        );
        assert_eq!(errors::<Allocation>(v.clone()), Vec::<String>::new());
        let a: Allocation = serde_json::from_value(v).unwrap();
        let d = &a.spec.depends_on;
        assert_eq!(
            d[0],
            Dependency::on("prep", DependencyCondition::Success)
                .delayed("5m")
                .alternative()
        );
        assert_eq!(d[0].delay_seconds(), Some(300));
        assert_eq!(
            d[1],
            Dependency::on("sweep", DependencyCondition::Any)
                .task(3)
                .alternative()
        );
        assert_eq!(d[3].delay.as_deref(), Some("90s"), "a number is seconds");
        assert!(d[4].any_of && d[4].singleton);
        let desc: Vec<String> = d.iter().map(Dependency::description).collect();
        assert_eq!(
            desc,
            [
                "afterok:prep+300s",
                "afterany:sweep_3",
                "afterok:sweep",
                "after:server+90s",
                "singleton"
            ]
        );
        // Round trip: the long form with the new keys, absent when unset.
        let back = serde_json::to_value(d).unwrap();
        assert_eq!(
            back,
            json!([
                {"ref": "prep", "condition": "success", "delay": "5m", "anyOf": true},
                {"ref": "sweep", "condition": "any", "taskIndex": 3, "anyOf": true},
                {"ref": "sweep", "condition": "success"},
                {"ref": "server", "condition": "started", "delay": "90s"},
                {"singleton": true, "anyOf": true},
            ])
        );
        let again: Vec<Dependency> = serde_json::from_value(back).unwrap();
        assert_eq!(&again, d);
        // YAML reads the same.
        let y: Vec<Dependency> = serde_yaml::from_str(
            "- {ref: prep, condition: success, delay: 5m, anyOf: true}\n- {ref: sweep, taskIndex: 3, condition: any, anyOf: true}\n",
        )
        .unwrap();
        assert_eq!(y[..], d[..2]);
        for bad in [
            json!({"ref": "a", "delay": -5}),
            json!({"ref": "a", "delay": 1.5}),
        ] {
            let e = serde_json::from_value::<Dependency>(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("delay"), "{e}");
        }
        // Defaults are today's behaviour.
        let plain: Dependency = serde_json::from_value(json!({"ref": "a"})).unwrap();
        assert_eq!(
            (plain.task_index, plain.delay.as_deref(), plain.any_of),
            (None, None, false)
        );
        assert_eq!(plain.standalone_option(), None);
        assert_eq!(d[1].standalone_option(), Some("taskIndex"));
    }

    #[test]
    fn task_index_delay_and_any_of_errors_name_the_field_and_the_fix() {
        let cases: Vec<(serde_json::Value, &str, &str)> = vec![
            (
                json!({"beginTime": 10, "taskIndex": 1}),
                "dependsOn[0].taskIndex",
                "needs ref",
            ),
            (
                json!({"ref": "a", "condition": "corresponding", "taskIndex": 1}),
                "dependsOn[0].taskIndex",
                "remove taskIndex",
            ),
            (
                json!({"ref": "l", "condition": "mutex", "taskIndex": 1}),
                "dependsOn[0].taskIndex",
                "lock",
            ),
            (
                json!({"ref": "a", "taskIndex": 1_000_000_000u64}),
                "dependsOn[0].taskIndex",
                "not a task index",
            ),
            (
                json!({"singleton": true, "delay": "5m"}),
                "dependsOn[0].delay",
                "beginTime",
            ),
            (
                json!({"ref": "a", "condition": "corresponding", "delay": "5m"}),
                "dependsOn[0].delay",
                "remove delay",
            ),
            (
                json!({"ref": "a", "delay": "soon"}),
                "dependsOn[0].delay",
                "not a duration",
            ),
            (
                json!({"symbol": "s", "type": "in", "anyOf": true}),
                "dependsOn[0].anyOf",
                "remove anyOf",
            ),
            (
                json!({"ref": "l", "condition": "mutex", "anyOf": true}),
                "dependsOn[0].anyOf",
                "remove anyOf",
            ),
            (
                json!({"ref": "a", "condition": "corresponding", "anyOf": true}),
                "dependsOn[0].anyOf",
                "taskIndex",
            ),
        ];
        for (dep, path, fix) in cases {
            let spec = json!({"dependsOn": [dep.clone()], "taskGroup": {"range": "0-3"}});
            let e = errors::<Allocation>(alloc(json!({}), spec));
            assert!(
                e.iter().any(|l| l.contains(path) && l.contains(fix)),
                "{dep}: {e:?}"
            );
        }
        // One element of an array is an entry of its own; the same element twice is not.
        let ok = alloc(
            json!({}),
            json!({"dependsOn": [{"ref": "s"}, {"ref": "s", "taskIndex": 1}, {"ref": "s", "taskIndex": 2}]}),
        );
        assert_eq!(errors::<Allocation>(ok), Vec::<String>::new());
        let twice = alloc(
            json!({}),
            json!({"dependsOn": [{"ref": "s", "taskIndex": 1}, {"ref": "s", "taskIndex": 1, "condition": "any"}]}),
        );
        let e = errors::<Allocation>(twice);
        assert!(
            e.iter()
                .any(|l| l.contains("dependsOn[1].taskIndex") && l.contains("listed twice")),
            "{e:?}"
        );
    }

    #[test]
    fn task_range_contains_without_expanding() {
        let r = TaskRange::parse("0-9,20-30:5,99999").unwrap();
        for i in [0, 9, 20, 25, 30, 99999] {
            assert!(r.contains(i), "{i}");
        }
        for i in [10, 19, 21, 31, 100000] {
            assert!(!r.contains(i), "{i}");
        }
    }

    fn dag(tasks: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "d", "namespace": "t1"}, "spec": {"allocations": tasks}})
    }

    #[test]
    fn dag_edges_refuse_the_standalone_dependency_options() {
        let spec = json!({"entrypoint": "/bin/true"});
        for (opt, v) in [
            ("taskIndex", json!(3)),
            ("delay", json!("5m")),
            ("anyOf", json!(true)),
        ] {
            let mut edge = json!({"ref": "a", "condition": "success"});
            edge[opt] = v;
            let d = dag(json!([
                {"name": "a", "spec": spec},
                {"name": "b", "dependsOn": [edge], "spec": spec},
            ]));
            let e = errors::<Dag>(d);
            assert!(
                e.iter().any(
                    |l| l.contains(&format!("spec.allocations[1].dependsOn[0].{opt}"))
                        && l.contains("standalone allocations")
                ),
                "{opt}: {e:?}"
            );
        }
    }

    #[test]
    fn dag_mutex_edges_are_locks_not_tasks() {
        let spec = json!({"entrypoint": "/bin/true"});
        let ok = dag(json!([
            {"name": "a", "dependsOn": [{"gpu": "mutex"}], "spec": spec},
            {"name": "b", "dependsOn": [{"gpu": "mutex"}, {"a": "success"}], "spec": spec},
            // A lock named like a task (even this one) is no edge: no cycle, no self edge.
            {"name": "c", "dependsOn": [{"c": "mutex"}, {"d": "mutex"}], "spec": spec},
            {"name": "d", "dependsOn": [{"c": "success"}], "spec": spec},
        ]));
        assert!(errors::<Dag>(ok).is_empty());
        let bad = dag(json!([
            {"name": "a", "dependsOn": [{"ref": "no such lock!", "condition": "mutex"}], "spec": spec},
            {"name": "b", "dependsOn": [{"l": "mutex"}, {"l": "mutex"}], "spec": spec},
            {"name": "c", "dependsOn": [{"a": "started"}], "spec": spec},
        ]));
        let e = errors::<Dag>(bad);
        assert!(
            e.iter()
                .any(|l| l.contains("spec.allocations[0].dependsOn[0].ref")
                    && l.contains("not a lock name")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.contains("spec.allocations[1].dependsOn[1].ref")
                    && l.contains("listed twice")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.contains("corresponding or mutex")),
            "{e:?}"
        );
        assert_eq!(e.len(), 3, "{e:?}");
    }

    #[test]
    fn task_elements_carry_their_index_in_the_template() {
        let spec = AllocationSpec {
            entrypoint: Some("python sweep.py --config=${INDEX} --seed ${INDEX}".into()),
            task_group: Some(TaskGroup {
                range: "0-99".into(),
                concurrency: Some(20),
            }),
            ..Default::default()
        };
        let e = spec.task_element(7);
        assert_eq!(
            e.entrypoint.as_deref(),
            Some("python sweep.py --config=7 --seed 7")
        );
        assert!(e.task_group.is_none());
        let spec = AllocationSpec {
            entrypoint: Some("/usr/bin/sweep".into()),
            args: vec!["--config=${INDEX}".into(), "$INDEX".into()],
            ..Default::default()
        };
        let e = spec.task_element(42);
        assert_eq!(e.args, ["--config=42", "$INDEX"]);
        assert_eq!(e.entrypoint.as_deref(), Some("/usr/bin/sweep"));
    }
}
