//! `Event`: a record of something that happened to an object (Kubernetes
//! `v1.Event` shape: fields at the top level, no spec/status). Events about
//! cluster-scoped objects (Node, Tenant) live in the
//! [`SYSTEM_NAMESPACE`](crate::registry::SYSTEM_NAMESPACE).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::meta::{ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, Errors};

/// An event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Event {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Event`.
    #[serde(default)]
    pub kind: String,
    /// Name (usually `<object>.<unique suffix>`) and namespace.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The object the event is about.
    #[serde(default)]
    pub involved_object: ObjectReference,
    /// CamelCase reason, e.g. `Scheduled`, `Preempted`, `NodeDown`.
    #[serde(default)]
    pub reason: String,
    /// Human-readable description.
    #[serde(default)]
    pub message: String,
    /// Normal or Warning.
    #[serde(rename = "type", default)]
    pub type_: EventType,
    /// Times this event was seen (repeats are aggregated).
    #[serde(default = "one")]
    pub count: u32,
    /// First occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_timestamp: Option<Time>,
    /// Latest occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_timestamp: Option<Time>,
    /// Who reported it.
    #[serde(default)]
    pub source: EventSource,
    /// What was done (or failed), e.g. `Binding`, `Preempting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Precise time of a single occurrence (events.k8s.io style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<Time>,
    /// Controller that emitted the event, e.g. `lattice.dev/scheduler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting_component: Option<String>,
    /// Instance of the reporting controller, e.g. its host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting_instance: Option<String>,
    /// A second object involved, e.g. the Node an Allocation was bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related: Option<ObjectReference>,
}

fn one() -> u32 {
    1
}

/// A reference to any object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectReference {
    /// apiVersion of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind of the object.
    #[serde(default)]
    pub kind: String,
    /// Namespace (tenant) of the object, if namespaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the object.
    #[serde(default)]
    pub name: String,
    /// uid of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// resourceVersion the event refers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Part of the object, e.g. `status.assignedNodes[0]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
}

/// Event severity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EventType {
    /// Expected.
    #[default]
    Normal,
    /// Needs attention.
    Warning,
}

/// Reporter of an event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventSource {
    /// Component, e.g. `scheduler`, `dag-controller`, `lattice-agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    /// Node the reporter runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl Resource for Event {
    const KIND: &'static str = "Event";
    const PLURAL: &'static str = "events";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        if self.count == 0 {
            self.count = 1;
        }
        if self.last_timestamp.is_none() {
            self.last_timestamp = self.first_timestamp;
        }
    }

    fn validate_fields(&self, errs: &mut Errors) {
        if self.involved_object.kind.is_empty() {
            errs.push("involvedObject.kind", "is required, e.g. \"Allocation\"");
        }
        if self.involved_object.name.is_empty() {
            errs.push(
                "involvedObject.name",
                "is required: the name of the object the event is about",
            );
        }
        if self.reason.is_empty() {
            errs.push(
                "reason",
                "is required: a CamelCase reason such as \"Scheduled\"",
            );
        }
        check_len(errs, "reason", &self.reason, 128);
        check_len(errs, "message", &self.message, 4096);
        if let (Some(f), Some(l)) = (self.first_timestamp, self.last_timestamp) {
            if l < f {
                errs.push("lastTimestamp", "is before firstTimestamp");
            }
        }
    }
}
