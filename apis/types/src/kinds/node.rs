//! `Node` (cluster-scoped): a compute node registered by its agent, with the
//! seed's Node Lifecycle state machine in `status.state`.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::meta::{skip_false, Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{
    check_len, is_feature_name, truncate, validate_dns1123_label, validate_dns1123_name, Errors,
    FEATURE_NAME_RULE,
};

/// A node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Node {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Node`.
    #[serde(default)]
    pub kind: String,
    /// Name: the node's hostname / xname, e.g. `x1000c0s0b0n0`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Operator intent: drain, disable, placement attributes.
    #[serde(default)]
    pub spec: NodeSpec,
    /// Observed state, written by the agent and the node lifecycle controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatus>,
}

/// A drain request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeDrain {
    /// Urgent drains may checkpoint running allocations instead of waiting.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub urgent: bool,
    /// Why (shown in `lattice nodes -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Operator intent for a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// No new allocations are placed here (running ones continue).
    #[serde(default, skip_serializing_if = "skip_false")]
    pub unschedulable: bool,
    /// Drain requested (`lattice node drain`): Ready → Draining → Drained. Remove to undrain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<NodeDrain>,
    /// Disabled (`lattice node disable`): the node goes Down immediately.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub disabled: bool,
    /// Dragonfly group the node sits in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_group: Option<u32>,
    /// Features offered, e.g. `nvme_scratch`, `gpu`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Part of the sensitive pool (longer grace periods, wipe on release).
    #[serde(default, skip_serializing_if = "skip_false")]
    pub sensitive: bool,
    /// vCluster that owns the node permanently (its home vCluster): `tenant/vcluster`, or
    /// a bare name for a vCluster of tenant `default`. Set by administrators; a tenant's
    /// admins may then list the node in the vCluster's `homeNodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_vcluster: Option<String>,
}

/// Node lifecycle states (the seed's state machine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NodeState {
    /// In inventory, never reported.
    #[default]
    Unknown,
    /// Being booted or reimaged.
    Booting,
    /// Healthy and schedulable.
    Ready,
    /// Heartbeat missed or minor issue: no new work, existing work continues.
    Degraded,
    /// Confirmed failure; allocations requeued per policy.
    Down,
    /// Drain requested; waiting for allocations to finish.
    Draining,
    /// Drained; safe for maintenance.
    Drained,
    /// Boot failure or unrecoverable hardware error.
    Failed,
}

impl NodeState {
    /// All states.
    pub const ALL: [NodeState; 8] = [
        Self::Unknown,
        Self::Booting,
        Self::Ready,
        Self::Degraded,
        Self::Down,
        Self::Draining,
        Self::Drained,
        Self::Failed,
    ];

    /// Only Ready nodes accept new allocations.
    pub fn is_schedulable(self) -> bool {
        self == Self::Ready
    }

    /// Whether existing allocations keep running in this state.
    pub fn runs_allocations(self) -> bool {
        matches!(self, Self::Ready | Self::Degraded | Self::Draining)
    }

    /// Whether the seed's state machine allows `self → to` (`Any → Down` included).
    pub fn can_transition_to(self, to: NodeState) -> bool {
        use NodeState::*;
        if self == to || to == Down {
            return true;
        }
        matches!(
            (self, to),
            (Unknown, Booting)
                | (Unknown, Ready)
                | (Booting, Ready)
                | (Booting, Failed)
                | (Ready, Degraded)
                | (Ready, Draining)
                | (Degraded, Ready)
                | (Degraded, Draining)
                | (Draining, Drained)
                | (Draining, Ready)
                | (Drained, Ready)
                | (Drained, Booting)
                | (Down, Booting)
                | (Down, Ready)
                | (Failed, Booting)
                | (Failed, Unknown)
        )
    }
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// Device index on the node.
    pub index: u32,
    /// Model, e.g. `GH200`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Device memory in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    /// Vendor UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// NUMA node the GPU is attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
}

/// Hardware capacity reported by the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeCapacity {
    /// CPU cores.
    #[serde(default)]
    pub cpu_cores: u32,
    /// Memory in GB.
    #[serde(default)]
    pub memory_gb: u64,
    /// GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    /// Number of GPUs (equals `gpus.len()` when `gpus` is listed).
    #[serde(default)]
    pub gpu_count: u32,
    /// GPU model when all GPUs are the same, e.g. `GH200`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Unified CPU/GPU memory (superchips).
    #[serde(default, skip_serializing_if = "skip_false")]
    pub unified_memory: bool,
    /// NUMA domains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_nodes: Option<u32>,
    /// CXL-attached memory in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cxl_memory_gb: Option<u64>,
    /// GPU interconnect links and GPU-to-NIC affinity (the seed's GpuTopology).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_topology: Option<super::topology::GpuTopology>,
    /// Memory domains (the seed's MemoryTopology).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_topology: Option<super::topology::MemoryTopology>,
}

/// Who uses the node now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeOwner {
    /// Tenant of the running allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// vCluster currently using the node (differs from the home vCluster when borrowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcluster: Option<String>,
    /// Allocation bound to the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<String>,
    /// True when the node is borrowed from its home vCluster.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub borrowed: bool,
    /// The allocation's binding attempt that owns the node (`status.attempt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// uid of the owning allocation (a re-created allocation with the same name is a
    /// different owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_uid: Option<String>,
    /// The user who submitted the owning allocation (its `lattice.dev/user`), recorded in
    /// the same transaction as the ownership: the claiming user of a sensitive node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Agent build and endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeAgentInfo {
    /// Agent version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Address the agent serves attach/logs on, `host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Kernel release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_version: Option<String>,
    /// CPU architecture, e.g. `aarch64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// When the agent process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// What the agent can run besides plain processes ([`capability`]): `oci` (OCI
    /// images, `environment.image`), `uenv` (uenv images), `pmix` (`spec.launch.mpi:
    /// pmix`). The scheduler places work only where it can run, and admission refuses
    /// work no node can run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// The capabilities an agent reports in `status.agent.capabilities`.
pub mod capability {
    /// OCI images (a root agent with an OCI runtime and cgroups).
    pub const OCI: &str = "oci";
    /// uenv images (a uenv repository).
    pub const UENV: &str = "uenv";
    /// PMIx for OpenMPI (an agent built with the `pmix` feature).
    pub const PMIX: &str = "pmix";
    /// Every capability there is (others an agent reports are ignored).
    pub const ALL: [&str; 3] = [OCI, PMIX, UENV];

    /// The capabilities allocation spec `spec` needs of every node it runs on, with the
    /// field that asks for each.
    pub fn needed(spec: &crate::AllocationSpec) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if let Some(env) = &spec.environment {
            if env.image.is_some() {
                out.push((OCI, "environment.image"));
            }
            if env.uenv.is_some() {
                out.push((UENV, "environment.uenv"));
            } else if env.tools_uenv.is_some() {
                out.push((UENV, "environment.toolsUenv"));
            }
        }
        if spec
            .launch
            .as_ref()
            .and_then(|l| l.mpi)
            .is_some_and(|m| m == crate::MpiKind::Pmix)
        {
            out.push((PMIX, "launch.mpi"));
        }
        out
    }

    /// The scheduler's name for capability `c` as a node feature.
    pub fn feature(c: &str) -> String {
        format!("lattice.dev/{c}")
    }
}

/// Observed node state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeStatus {
    /// Unknown | Booting | Ready | Degraded | Down | Draining | Drained | Failed.
    #[serde(default)]
    pub state: NodeState,
    /// CamelCase reason for the state, e.g. `HeartbeatMissed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When `state` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Hardware.
    #[serde(default)]
    pub capacity: NodeCapacity,
    /// Hash of GPU driver, NIC firmware, BIOS/BMC firmware and kernel parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conformance_fingerprint: Option<String>,
    /// Current owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<NodeOwner>,
    /// Allocations running on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<String>,
    /// Last heartbeat received (the heartbeat Lease holds the high-rate renewals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// Heartbeat sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_sequence: Option<u64>,
    /// Agent information.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<NodeAgentInfo>,
    /// `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions such as `Healthy`, `ConformanceDrift`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Whether a node's agent may bring its Node to Ready: a Node not yet known, booting or
/// Down, and not disabled (the other states are the controllers': Draining, Drained,
/// Degraded, Failed, or already Ready). The API server holds agents to this rule.
pub fn agent_may_ready(node: &Node) -> bool {
    !node.spec.disabled
        && match &node.status {
            None => true,
            Some(s) => matches!(
                s.state,
                NodeState::Unknown | NodeState::Booting | NodeState::Down
            ),
        }
}

impl Node {
    /// The current state (Unknown when there is no status yet).
    pub fn state(&self) -> NodeState {
        self.status.as_ref().map(|s| s.state).unwrap_or_default()
    }
}

impl Resource for Node {
    const KIND: &'static str = "Node";
    const PLURAL: &'static str = "nodes";
    const NAMESPACED: bool = false;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        if let Some(st) = &mut self.status {
            let c = &mut st.capacity;
            if c.gpu_count == 0 && !c.gpus.is_empty() {
                c.gpu_count = u32::try_from(c.gpus.len()).unwrap_or(u32::MAX);
            }
            if c.gpu_type.is_none() {
                if let Some(first) = c.gpus.first() {
                    if c.gpus.iter().all(|g| g.type_ == first.type_) {
                        c.gpu_type = Some(first.type_.clone());
                    }
                }
            }
        }
    }

    fn validate_fields(&self, errs: &mut Errors) {
        let s = &self.spec;
        let mut feats = BTreeSet::new();
        for (i, f) in s.features.iter().enumerate() {
            if !is_feature_name(f) {
                errs.push(
                    format!("spec.features[{i}]"),
                    format!(
                        "{:?} is not a feature name: {FEATURE_NAME_RULE}",
                        truncate(f, 40)
                    ),
                );
            } else if !feats.insert(f.as_str()) {
                errs.push(
                    format!("spec.features[{i}]"),
                    format!("{f:?} is listed twice"),
                );
            }
        }
        if let Some(v) = &s.home_vcluster {
            // `vcluster` (of tenant `default`) or `tenant/vcluster`.
            match v.split_once('/') {
                Some((t, name)) => {
                    errs.extend(validate_dns1123_label("spec.homeVcluster (tenant)", t));
                    errs.extend(validate_dns1123_label("spec.homeVcluster", name));
                }
                None => errs.extend(validate_dns1123_label("spec.homeVcluster", v)),
            }
        }
        if let Some(d) = &s.drain {
            if let Some(r) = &d.reason {
                check_len(errs, "spec.drain.reason", r, 1024);
            }
        }
        let Some(st) = &self.status else { return };
        let c = &st.capacity;
        if !c.gpus.is_empty() && c.gpu_count as usize != c.gpus.len() {
            errs.push(
                "status.capacity.gpuCount",
                format!(
                    "is {} but status.capacity.gpus lists {}; make them agree",
                    c.gpu_count,
                    c.gpus.len()
                ),
            );
        }
        let mut idx = BTreeSet::new();
        for (i, g) in c.gpus.iter().enumerate() {
            if !idx.insert(g.index) {
                errs.push(
                    format!("status.capacity.gpus[{i}].index"),
                    format!("index {} is used twice", g.index),
                );
            }
            if g.type_.trim().is_empty() {
                errs.push(
                    format!("status.capacity.gpus[{i}].type"),
                    "is required, e.g. \"GH200\"",
                );
            }
            if let Some(m) = g.memory_gb {
                if !m.is_finite() || m < 0.0 {
                    errs.push(
                        format!("status.capacity.gpus[{i}].memoryGb"),
                        format!("must be a non-negative number, got {m}"),
                    );
                }
            }
        }
        for (i, a) in st.allocations.iter().enumerate() {
            errs.extend(validate_dns1123_name(
                format_args!("status.allocations[{i}]"),
                a,
            ));
        }
        if let Some(o) = &st.owner {
            if let Some(t) = &o.tenant {
                errs.extend(validate_dns1123_label("status.owner.tenant", t));
            }
            if let Some(v) = &o.vcluster {
                errs.extend(validate_dns1123_label("status.owner.vcluster", v));
            }
            if let Some(a) = &o.allocation {
                errs.extend(validate_dns1123_name("status.owner.allocation", a));
            }
        }
        if let Some(f) = &st.conformance_fingerprint {
            check_len(errs, "status.conformanceFingerprint", f, 256);
        }
    }
}
