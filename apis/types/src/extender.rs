//! The scheduler extender protocol: what the built-in scheduler POSTs (JSON) to each
//! extender of a vCluster (`spec.extenders`) once per cycle, and what it reads back.
//!
//! One request per cycle per extender carries the cycle's candidate jobs and nodes, at
//! most [`MAX_JOBS`] and [`MAX_NODES`] (the jobs first in the queue's submission order;
//! nodes by name). It is for placement only and carries **no secrets**: per job its
//! `tenant/name`, user, tenant, requested nodes and hardware (GPUs, features, `anyOf`
//! feature groups), preemption class, walltime and labels; per node its name, labels,
//! state, GPUs, features and topology group. Never a job's command, environment,
//! annotations, mounts, tokens or credentials.
//!
//! The answer: `filteredNodes` (node → why) removes nodes for every job of the vCluster
//! this cycle; `scores` (job → value in [0, 1]) is the extender's term of `Score(j)`,
//! weighted by its `weight`. A node the filter was not sent (beyond [`MAX_NODES`]) is not
//! used: an extender cannot vouch for a node it did not see.
//!
//! ```
//! use lattice_apis::extender::{ExtenderRequest, ExtenderResponse};
//! let req: ExtenderRequest = serde_json::from_str(
//!     r#"{"vcluster":"physics/batch","filter":true,"score":false,"jobs":[],"nodes":[]}"#,
//! ).unwrap();
//! assert!(req.filter);
//! let resp: ExtenderResponse =
//!     serde_json::from_str(r#"{"filteredNodes":{"n3":"in maintenance"}}"#).unwrap();
//! assert_eq!(resp.filtered_nodes["n3"], "in maintenance");
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most jobs one request carries.
pub const MAX_JOBS: usize = 1_000;
/// Most nodes one request carries.
pub const MAX_NODES: usize = 20_000;
/// Largest response body read, in bytes.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// What the scheduler sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderRequest {
    /// `tenant/name` of the vCluster scheduling.
    pub vcluster: String,
    /// Answer `filteredNodes`.
    pub filter: bool,
    /// Answer `scores`.
    pub score: bool,
    /// Candidate jobs, at most [`MAX_JOBS`].
    pub jobs: Vec<ExtenderJob>,
    /// Candidate nodes, at most [`MAX_NODES`].
    pub nodes: Vec<ExtenderNode>,
}

/// A pending job (allocation) of the cycle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderJob {
    /// `tenant/name`: the key of `scores`.
    pub name: String,
    /// Owning tenant.
    pub tenant: String,
    /// Submitting user (the server-set `lattice.dev/user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Nodes requested (the minimum for elastic work).
    pub nodes: u32,
    /// GPU type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// GPUs per node.
    #[serde(default)]
    pub gpus_per_node: u32,
    /// Feature labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Groups of alternative feature labels (`resources.constraints.anyOf`): a node has
    /// at least one of each group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub any_of: Vec<Vec<String>>,
    /// Preemption class 0..=10.
    #[serde(default)]
    pub preemption_class: u8,
    /// Walltime (`None`: unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime_seconds: Option<u64>,
    /// `metadata.labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A node the cycle may place on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderNode {
    /// Node name: the key of `filteredNodes`.
    pub name: String,
    /// `metadata.labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// GPUs.
    #[serde(default)]
    pub gpus: u32,
    /// GPU type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Feature labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Dragonfly group.
    #[serde(default)]
    pub group: u32,
}

/// What the extender answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderResponse {
    /// Nodes this vCluster's jobs may not use this cycle, with why.
    #[serde(default)]
    pub filtered_nodes: BTreeMap<String, String>,
    /// Per job (`tenant/name`), a score in [0, 1] (clamped); jobs left out score 0.
    #[serde(default)]
    pub scores: BTreeMap<String, f64>,
}
