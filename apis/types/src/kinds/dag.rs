//! `Dag`: a workflow of allocations connected by dependency edges (the seed's
//! "DAG Workflows"). The DAG controller creates one `Allocation` per task,
//! named `<dag>-<task>` and owned by the Dag, releasing each one when its
//! dependency conditions hold.

use std::collections::{BTreeMap, HashMap, HashSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::allocation::{lock_name_error, AllocationSpec, Dependency, DependencyCondition};
use crate::meta::{Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{truncate, validate_dns1123_label, Errors};

/// Default limit on the allocations of a DAG, a task group's elements each counted (the
/// seed: "Maximum 1000 allocations per DAG (configurable by admin)"). The limit is enforced at admission by the API server
/// (`lattice-server --max-dag-size`, see [`dag_size_error`]), not by [`Resource::validate`],
/// which takes no configuration.
pub const DEFAULT_MAX_DAG_SIZE: usize = 1000;

/// The seed's hint for a DAG over the size limit.
pub const DAG_SIZE_HINT: &str =
    "Split the workflow into smaller DAGs or increase the limit via system configuration.";

/// `Some(message)` when `count` tasks exceed `limit`: the seed's
/// `DAG exceeds maximum size (1234 allocations, limit: 1000)` and its hint, for the
/// field `spec.allocations`.
pub fn dag_size_error(count: usize, limit: usize) -> Option<String> {
    (count > limit).then(|| {
        format!(
            "DAG exceeds maximum size ({count} allocations, limit: {limit}). Hint: {DAG_SIZE_HINT}"
        )
    })
}

/// How many allocations one task of a Dag (JSON, as stored) makes: the elements of its
/// task group, else one. A range that does not parse counts one (admission reports it).
/// The size limit counts these, as the seed counts "allocations per DAG".
pub fn task_allocation_count(task: &serde_json::Value) -> usize {
    task.pointer("/spec/taskGroup/range")
        .and_then(serde_json::Value::as_str)
        .and_then(|r| super::allocation::TaskRange::parse(r).ok())
        .map_or(1, |r| {
            usize::try_from(r.count()).unwrap_or(usize::MAX).max(1)
        })
}

/// A DAG workflow.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dag {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Dag`.
    #[serde(default)]
    pub kind: String,
    /// Name, namespace (= tenant), ...
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The tasks and their edges.
    #[serde(default)]
    pub spec: DagSpec,
    /// Per-task progress, written by the DAG controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DagStatus>,
}

/// What happens to the rest of the DAG when a task fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DagFailurePolicy {
    /// The seed's rules (default): a failed `success` dependency cancels its
    /// downstream tasks, a succeeded `failure` dependency skips them, `any`
    /// dependencies always run; unrelated branches continue.
    #[default]
    Propagate,
    /// Cancel every task that has not finished as soon as one task fails.
    FailFast,
}

/// The workflow definition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagSpec {
    /// The tasks, each becoming one Allocation (a task group: one per element); at most
    /// `scheduling.max_dag_size` allocations in all (default 1000).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub allocations: Vec<DagTask>,
    /// propagate (default) | fail_fast.
    #[serde(default)]
    pub failure_policy: DagFailurePolicy,
    /// Most tasks released at the same time (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    /// Fields applied to every task's spec where the task leaves them unset
    /// (e.g. `vcluster`, `project`, `connectivity.networkDomain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<DagDefaults>,
}

/// Per-DAG defaults copied into each task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagDefaults {
    /// vCluster for every task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcluster: Option<String>,
    /// Project for every task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Network domain shared by the tasks (kept alive between stages by its grace period).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_domain: Option<String>,
}

/// One task of a DAG.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagTask {
    /// Task name, unique in the DAG (DNS label). Alias: `id`.
    #[serde(alias = "id")]
    pub name: String,
    /// Edges to other tasks of this DAG: `[{ref: preprocess, condition: success}]`
    /// or the seed's short form `[{preprocess: success}]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<Dependency>,
    /// The allocation to create (its own `dependsOn` must be empty: edges live on the task).
    #[serde(default)]
    pub spec: AllocationSpec,
}

impl DagTask {
    /// The Allocation name the controller uses for this task.
    pub fn allocation_name(&self, dag_name: &str) -> String {
        format!("{dag_name}-{}", self.name)
    }
}

/// DAG phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DagPhase {
    /// No task released yet.
    #[default]
    Pending,
    /// At least one task released and not all finished.
    Running,
    /// Every task finished and no task failed (skipped tasks are fine).
    Completed,
    /// All tasks finished and at least one failed (or was cancelled by propagation).
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

/// Phase of one DAG task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DagTaskPhase {
    /// Dependencies not satisfied yet; no Allocation exists.
    #[default]
    Waiting,
    /// Allocation created and queued.
    Pending,
    /// Allocation staging.
    Staging,
    /// Allocation running.
    Running,
    /// Allocation checkpointing.
    Checkpointing,
    /// Allocation suspended.
    Suspended,
    /// Allocation completed.
    Completed,
    /// Allocation failed.
    Failed,
    /// Cancelled (by a user or because a `success` dependency failed).
    Cancelled,
    /// Not run because its condition can no longer hold (e.g. a `failure` dependency succeeded).
    Skipped,
}

impl DagTaskPhase {
    /// Completed, Failed, Cancelled or Skipped.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Cancelled | Self::Skipped
        )
    }
}

/// Status of one task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagTaskStatus {
    /// Waiting | Pending | ... | Completed | Failed | Cancelled | Skipped.
    #[serde(default)]
    pub phase: DagTaskPhase,
    /// Name of the Allocation created for the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<String>,
    /// CamelCase reason, e.g. `UpstreamFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A task group's elements by state (absent for a task that is no task group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<DagTaskElements>,
}

/// The elements of a task-group task by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagTaskElements {
    /// All elements.
    #[serde(default)]
    pub total: u32,
    /// Not released yet: waiting for their dependencies or a concurrency slot.
    #[serde(default)]
    pub waiting: u32,
    /// Released, not running yet.
    #[serde(default)]
    pub pending: u32,
    /// Running.
    #[serde(default)]
    pub running: u32,
    /// Completed.
    #[serde(default)]
    pub completed: u32,
    /// Failed.
    #[serde(default)]
    pub failed: u32,
    /// Cancelled (by a user, or because a dependency can never hold).
    #[serde(default)]
    pub cancelled: u32,
}

/// Task counts by phase.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagCounts {
    /// All tasks.
    #[serde(default)]
    pub total: u32,
    /// Waiting for dependencies.
    #[serde(default)]
    pub waiting: u32,
    /// Pending or staging.
    #[serde(default)]
    pub pending: u32,
    /// Running, checkpointing or suspended.
    #[serde(default)]
    pub running: u32,
    /// Completed.
    #[serde(default)]
    pub completed: u32,
    /// Failed.
    #[serde(default)]
    pub failed: u32,
    /// Cancelled.
    #[serde(default)]
    pub cancelled: u32,
    /// Skipped.
    #[serde(default)]
    pub skipped: u32,
}

/// Observed state of a DAG.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DagStatus {
    /// Pending | Running | Completed | Failed | Cancelled.
    #[serde(default)]
    pub phase: DagPhase,
    /// Per-task state, keyed by task name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tasks: BTreeMap<String, DagTaskStatus>,
    /// Counts by phase.
    #[serde(default)]
    pub counts: DagCounts,
    /// When the first task was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the DAG reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// CamelCase reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl DagSpec {
    /// Tasks in a dependency-respecting order, or the names on a cycle.
    pub fn topological_order(&self) -> Result<Vec<&DagTask>, Vec<String>> {
        let index: HashMap<&str, usize> = self
            .allocations
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        // 0 = unvisited, 1 = on stack, 2 = done. Iterative DFS so deep chains cannot overflow the stack.
        let n = self.allocations.len();
        let mut state = vec![0u8; n];
        let mut order = Vec::with_capacity(n);
        for start in 0..n {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                let deps = &self.allocations[node].depends_on;
                if *next < deps.len() {
                    let d = &deps[*next];
                    *next += 1;
                    // A mutex names a lock, not a task: no edge.
                    let edge = d.condition != DependencyCondition::Mutex;
                    if let Some(&j) = index.get(d.ref_.as_str()).filter(|_| edge) {
                        match state[j] {
                            0 => {
                                state[j] = 1;
                                stack.push((j, 0));
                            }
                            1 => {
                                let pos = stack.iter().position(|(k, _)| *k == j).unwrap_or(0);
                                let mut cycle: Vec<String> = stack[pos..]
                                    .iter()
                                    .map(|(k, _)| self.allocations[*k].name.clone())
                                    .collect();
                                cycle.push(self.allocations[j].name.clone());
                                return Err(cycle);
                            }
                            _ => {}
                        }
                    }
                } else {
                    state[node] = 2;
                    order.push(&self.allocations[node]);
                    stack.pop();
                }
            }
        }
        Ok(order)
    }

    /// Apply `defaults` and each task's allocation defaults.
    pub fn default_fields(&mut self) {
        let defaults = self.defaults.clone().unwrap_or_default();
        for t in &mut self.allocations {
            if t.spec.vcluster.is_none() {
                t.spec.vcluster = defaults.vcluster.clone();
            }
            if t.spec.project.is_none() {
                t.spec.project = defaults.project.clone();
            }
            if let Some(nd) = &defaults.network_domain {
                let c = t.spec.connectivity.get_or_insert_with(Default::default);
                if c.network_domain.is_none() {
                    c.network_domain = Some(nd.clone());
                }
            }
            t.spec.default_fields();
        }
    }

    fn validate(&self, dag_name: Option<&str>, namespace: Option<&str>, errs: &mut Errors) {
        if self.allocations.is_empty() {
            errs.push(
                "spec.allocations",
                "must list at least one task: [{name: step-1, spec: {entrypoint: /bin/sh, args: [-c, 'echo hi']}}]",
            );
        }
        if self.max_parallel == Some(0) {
            errs.push(
                "spec.maxParallel",
                "must be at least 1; remove it for no limit",
            );
        }
        if let Some(d) = &self.defaults {
            if let Some(v) = &d.vcluster {
                errs.extend(validate_dns1123_label("spec.defaults.vcluster", v));
            }
            if let Some(v) = &d.network_domain {
                errs.extend(validate_dns1123_label("spec.defaults.networkDomain", v));
            }
        }
        let mut names: HashMap<&str, usize> = HashMap::with_capacity(self.allocations.len());
        for (i, t) in self.allocations.iter().enumerate() {
            let tp = format!("spec.allocations[{i}]");
            if let Some(e) = validate_dns1123_label(format_args!("{tp}.name"), &t.name) {
                errs.0.push(e);
            } else if let Some(prev) = names.insert(t.name.as_str(), i) {
                errs.push(
                    format!("{tp}.name"),
                    format!("{:?} is already used by spec.allocations[{prev}]; task names must be unique", t.name),
                );
            } else if let Some(dag) = dag_name.filter(|d| d.len() + 1 + t.name.len() > 253) {
                let full = t.allocation_name(dag);
                errs.push(
                    format!("{tp}.name"),
                    format!("the allocation name {:?} would be {} characters, the limit is 253; shorten the DAG or task name", truncate(&full, 40), full.len()),
                );
            }
            if !t.spec.depends_on.is_empty() {
                errs.push(
                    format!("{tp}.spec.dependsOn"),
                    format!("edges between DAG tasks go in spec.allocations[{i}].dependsOn; move them there"),
                );
            }
            t.spec
                .validate(&format!("{tp}.spec"), None, namespace, errs);
        }
        // The names a dangling reference's message suggests, made once.
        let listed = std::cell::OnceCell::new();
        for (i, t) in self.allocations.iter().enumerate() {
            let mut seen = HashSet::new();
            for (k, d) in t.depends_on.iter().enumerate() {
                // The path is formatted only for an error.
                let dp = || format!("spec.allocations[{i}].dependsOn[{k}]");
                if let Some(field) = [
                    ("beginTime", d.begin_time.is_some()),
                    ("symbol", d.symbol.is_some()),
                    ("singleton", d.singleton),
                ]
                .iter()
                .find(|(_, set)| *set)
                .map(|(f, _)| *f)
                {
                    errs.push(
                        format!("{}.{field}", dp()),
                        "DAG edges name another task of the DAG with ref; beginTime, symbol and singleton are for standalone allocations (submit those with lattice submit --dependency)",
                    );
                    continue;
                }
                if let Some(field) = d.standalone_option() {
                    errs.push(
                        format!("{}.{field}", dp()),
                        "taskIndex, delay and anyOf are for standalone allocations (lattice submit --dependency); a DAG edge names another task with ref and a condition — remove it",
                    );
                    continue;
                }
                if d.condition == DependencyCondition::Started {
                    errs.push(
                        format!("{}.condition", dp()),
                        "`started` (Slurm/Flux `after`) is for standalone allocations; DAG edges use success, failure, any, corresponding or mutex",
                    );
                    continue;
                }
                if d.condition == DependencyCondition::Mutex {
                    // `ref` names a lock (Slurm singleton), not a task: at most one
                    // holder of it runs at a time, in this DAG and across the tenant.
                    if let Some(msg) = lock_name_error(&d.ref_) {
                        errs.push(format!("{}.ref", dp()), msg);
                    } else if !seen.insert(("mutex", d.ref_.as_str())) {
                        errs.push(
                            format!("{}.ref", dp()),
                            format!("mutex {:?} is listed twice", d.ref_),
                        );
                    }
                    continue;
                }
                match names.get(d.ref_.as_str()) {
                    None => errs.push(
                        format!("{}.ref", dp()),
                        format!(
                            "{:?} is not a task of this DAG; use one of: {}",
                            truncate(&d.ref_, 63),
                            listed.get_or_init(|| some_task_names(&names))
                        ),
                    ),
                    Some(&j) if j == i => errs.push(
                        format!("{}.ref", dp()),
                        "a task cannot depend on itself; remove this entry",
                    ),
                    Some(&j) => {
                        if !seen.insert(("ref", d.ref_.as_str())) {
                            errs.push(
                                format!("{}.ref", dp()),
                                format!("{:?} is listed twice", d.ref_),
                            );
                        }
                        if d.condition == DependencyCondition::Corresponding
                            && (t.spec.task_group.is_none()
                                || self.allocations[j].spec.task_group.is_none())
                        {
                            errs.push(
                                format!("{}.condition", dp()),
                                "`corresponding` links task N to task N and needs spec.taskGroup on both tasks; add task groups or use success|failure|any",
                            );
                        }
                    }
                }
            }
        }
        if let Err(mut cycle) = self.topological_order() {
            // A task depending on itself was reported above; a longer cycle is named in
            // the order the work would flow (as `lattice dag submit` names it).
            if cycle.len() > 2 || cycle.first() != cycle.last() {
                cycle.reverse();
                errs.push(
                    "spec.allocations",
                    format!(
                        "dependencies form a cycle: {}; remove one of these edges",
                        cycle.join(" → ")
                    ),
                );
            }
        }
    }
}

/// Task names of a DAG for an error message, sorted: all of them, or the first
/// [`NAMES_IN_MESSAGES`] and the count (a message per dangling reference must not grow
/// with the DAG's size).
fn some_task_names(names: &HashMap<&str, usize>) -> String {
    let mut sorted: Vec<&str> = names.keys().copied().collect();
    sorted.sort_unstable();
    if sorted.len() <= NAMES_IN_MESSAGES {
        return sorted.join(", ");
    }
    format!(
        "{} (… {} tasks in all)",
        sorted[..NAMES_IN_MESSAGES].join(", "),
        sorted.len()
    )
}

/// How many task names an error message lists.
const NAMES_IN_MESSAGES: usize = 8;

impl Resource for Dag {
    const KIND: &'static str = "Dag";
    const PLURAL: &'static str = "dags";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        self.spec.default_fields();
    }

    fn validate_fields(&self, errs: &mut Errors) {
        self.spec.validate(
            self.metadata.name.as_deref(),
            self.metadata.namespace.as_deref(),
            errs,
        );
        if let Some(st) = &self.status {
            let tasks: std::collections::HashSet<&str> = self
                .spec
                .allocations
                .iter()
                .map(|t| t.name.as_str())
                .collect();
            for name in st.tasks.keys() {
                if !tasks.contains(name.as_str()) {
                    errs.push(
                        format!("status.tasks[{:?}]", truncate(name, 63)),
                        "is not a task in spec.allocations; remove it",
                    );
                }
            }
        }
    }
}
