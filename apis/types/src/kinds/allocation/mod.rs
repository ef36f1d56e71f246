//! `Allocation`: the universal work unit (batch job, task group, service,
//! autoscaled service, interactive session), mirroring the seed's full Intent
//! API allocation request.
//!
//! * `spec` — what the user asks for (`AllocationSpec` and its parts);
//! * `dependencies` — `spec.dependsOn` entries, their serde forms, schema and checks;
//! * `status` — what the controllers and agents observe (`AllocationStatus`);
//! * `validation` — defaulting and admission checks of a spec and a status.
//!
//! Every item is re-exported here, so `kinds::allocation::X` names each of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::duration::{parse_duration, DURATION_FORMATS};
use crate::meta::{skip_false, Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{
    check_len, is_feature_name, truncate, validate_dns1123_label, validate_dns1123_name, Errors,
    FEATURE_NAME_RULE, MAX_SCRIPT_LEN, MAX_TEXT_LEN,
};

mod dependencies;
mod spec;
mod status;
mod validation;

#[cfg(test)]
mod tests;

pub use dependencies::*;
pub use spec::*;
pub use status::*;
pub use validation::*;

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
/// Most groups in `resources.constraints.anyOf`.
pub const MAX_ANY_OF_GROUPS: usize = 16;
/// Most alternatives in one `resources.constraints.anyOf` group.
pub const MAX_ANY_OF_ALTERNATIVES: usize = 16;
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
