//! Object metadata and the Kubernetes-style envelope types shared by every kind:
//! [`ObjectMeta`], [`Condition`], [`List`], and the [`Status`] error object.

use std::collections::BTreeMap;

use chrono::{DateTime, SubsecRound, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::validation::validate_dns1123_name;
use crate::validation::{validate_dns1123_label, Errors};

/// Annotation set by `lattice cancel` / `DELETE /v1/allocations/{id}`: the
/// controllers stop the work and finish the object as Cancelled, keeping it for history.
pub use crate::wellknown::CANCEL_REQUESTED_ANNOTATION;
/// Finalizer that makes the checkpoint broker run before an allocation is deleted.
pub use crate::wellknown::CHECKPOINT_FINALIZER;
/// Label put on every Allocation a Dag creates, naming the Dag.
pub use crate::wellknown::DAG_LABEL;
/// Label put on every Allocation a Dag creates, naming its task.
pub use crate::wellknown::DAG_TASK_LABEL;

/// A point in time, serialized as an RFC 3339 string (`2026-03-05T10:00:12Z`).
pub type Time = DateTime<Utc>;

/// The current time truncated to whole seconds, the precision the API stores.
pub fn now() -> Time {
    Utc::now().trunc_subsecs(0)
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `apiVersion` and `kind`, as found at the top of every object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TypeMeta {
    /// `lattice.dev/v1alpha1` for all Lattice kinds.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// The kind, e.g. `Allocation`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

/// Standard object metadata. `namespace` is the tenant; Tenant and Node have none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    /// Unique per (kind, namespace); DNS-1123 subdomain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Prefix for a server-generated name when `name` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    /// The tenant that owns the object (namespaced kinds only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Server-set, immutable UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Opaque; the store's modification revision. Compare only for equality.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Starts at 1; incremented by the server on every spec change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Server-set creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    /// Set when deletion was requested and finalizers are still pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    /// Selectable key/value pairs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Non-selectable key/value pairs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Owners of this object; drives garbage collection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
    /// Cleanup steps that must finish before the object is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    /// Server-side apply bookkeeping.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "managed_fields_or_skip"
    )]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

thread_local! {
    static SKIP_MANAGED_FIELDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `decode` with `metadata.managedFields` read past rather than built (it comes out
/// empty): for caches that drop them anyway, where they were a third of an object's
/// decoding. Only what `decode` deserializes on this thread is affected.
pub fn without_managed_fields<T>(decode: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SKIP_MANAGED_FIELDS.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SKIP_MANAGED_FIELDS.with(|s| s.replace(true)));
    decode()
}

fn managed_fields_or_skip<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<ManagedFieldsEntry>, D::Error> {
    if SKIP_MANAGED_FIELDS.with(|s| s.get()) {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Vec::new())
    } else {
        Vec::deserialize(d)
    }
}

impl ObjectMeta {
    /// Metadata with just a name and an optional namespace.
    pub fn named(name: impl Into<String>, namespace: Option<&str>) -> Self {
        Self {
            name: Some(name.into()),
            namespace: namespace.map(str::to_string),
            ..Self::default()
        }
    }

    /// The name, or "" when unset.
    pub fn name_str(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// The namespace (tenant), or "" when unset.
    pub fn namespace_str(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    /// Validate name, namespace presence for the kind's scope, labels and owner references.
    pub(crate) fn validate(&self, namespaced: bool, kind: &str, errs: &mut Errors) {
        match (&self.name, &self.generate_name) {
            (Some(name), _) => errs.extend(validate_dns1123_name("metadata.name", name)),
            (None, Some(prefix)) => {
                // The server appends a random suffix; the prefix itself must be usable.
                let probe = format!("{prefix}x");
                if validate_dns1123_name("metadata.generateName", &probe).is_some()
                    || prefix.len() > 200
                {
                    errs.push(
                        "metadata.generateName",
                        "must be a DNS-1123 prefix of at most 200 characters (lower-case letters, digits, '-' and '.'), e.g. \"train-\"",
                    );
                }
            }
            (None, None) => errs.push(
                "metadata.name",
                "is required; set metadata.name (lower-case letters, digits and '-', e.g. \"my-job\") or metadata.generateName",
            ),
        }
        match (&self.namespace, namespaced) {
            (Some(ns), true) => errs.extend(validate_dns1123_label("metadata.namespace", ns)),
            (None, true) => errs.push(
                "metadata.namespace",
                format!("is required for {kind}: set it to the tenant that owns the object (e.g. \"ml-team\")"),
            ),
            (Some(_), false) => errs.push(
                "metadata.namespace",
                format!("must not be set: {kind} is cluster-scoped; remove metadata.namespace"),
            ),
            (None, false) => {}
        }
        for (k, v) in &self.labels {
            if !is_qualified_name(k) {
                errs.push(
                    format!("metadata.labels[{k:?}]"),
                    "label keys must be an optional DNS prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.' (e.g. \"lattice.dev/experiment\")",
                );
            }
            if !is_label_value(v) {
                errs.push(
                    format!("metadata.labels[{k:?}]"),
                    format!("value {:?} is not a valid label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", crate::validation::truncate(v, 80)),
                );
            }
        }
        let ann_size: usize = self
            .annotations
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if ann_size > 256 * 1024 {
            errs.push(
                "metadata.annotations",
                format!("total size is {ann_size} bytes, the limit is 262144; move large data elsewhere"),
            );
        }
        for k in self.annotations.keys() {
            if !is_qualified_name(k) {
                errs.push(
                    format!("metadata.annotations[{k:?}]"),
                    "annotation keys must be an optional DNS prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.'",
                );
            }
        }
        for (i, o) in self.owner_references.iter().enumerate() {
            let p = format!("metadata.ownerReferences[{i}]");
            if o.name.is_empty() {
                errs.push(
                    format!("{p}.name"),
                    "is required; set the owner's metadata.name",
                );
            }
            if o.kind.is_empty() {
                errs.push(
                    format!("{p}.kind"),
                    "is required; set the owner's kind, e.g. \"Dag\"",
                );
            }
            if o.uid.is_empty() {
                errs.push(
                    format!("{p}.uid"),
                    "is required; set the owner's metadata.uid",
                );
            }
        }
        if self
            .owner_references
            .iter()
            .filter(|o| o.controller == Some(true))
            .count()
            > 1
        {
            errs.push(
                "metadata.ownerReferences",
                "at most one owner reference may have controller: true; unset it on the others",
            );
        }
        for (i, f) in self.finalizers.iter().enumerate() {
            if !is_qualified_name(f) {
                errs.push(
                    format!("metadata.finalizers[{i}]"),
                    format!("{:?} is not a valid finalizer: use a qualified name such as \"lattice.dev/checkpoint\"", crate::validation::truncate(f, 80)),
                );
            }
        }
    }
}

/// `prefix/name` label keys (the prefix is optional and a DNS subdomain).
pub(crate) fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if !crate::validation::is_dns1123_subdomain(p) {
            return false;
        }
    }
    !name.is_empty() && name.len() <= 63 && is_label_value(name)
}

/// Label values: empty, or at most 63 alphanumerics, '-', '_', '.', alphanumeric at both ends.
pub(crate) fn is_label_value(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Points from a dependent object to its owner (e.g. an Allocation to its Dag).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnerReference {
    /// Owner's apiVersion.
    pub api_version: String,
    /// Owner's kind.
    pub kind: String,
    /// Owner's name (same namespace as the dependent).
    pub name: String,
    /// Owner's uid.
    pub uid: String,
    /// True for the one managing controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    /// Foreground deletion waits for this dependent when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

/// Server-side apply: the fields one manager owns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedFieldsEntry {
    /// Field manager name, e.g. `lattice-cli`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<String>,
    /// `Apply` or `Update`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// apiVersion the fields were written with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// When the entry last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Always `FieldsV1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields_type: Option<String>,
    /// The owned field set, in Kubernetes' `f:`/`k:` notation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields_v1: Option<serde_json::Value>,
    /// `status` when written through the status subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
}

/// Status of a [`Condition`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known yet.
    #[default]
    Unknown,
}

/// A metav1.Condition-style observation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    /// CamelCase condition type, e.g. `Ready`, `Scheduled`.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// The generation this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Last time `status` changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// CamelCase machine-readable reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Condition {
    /// A new condition with the given type/status/reason/message, stamped now.
    pub fn new(
        type_: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_: type_.into(),
            status,
            observed_generation: None,
            last_transition_time: Some(now()),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Insert or update `cond` in `conditions`, keeping `lastTransitionTime` unless
/// the status actually flipped (the Kubernetes rule).
pub fn set_condition(conditions: &mut Vec<Condition>, mut cond: Condition) {
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        if existing.status == cond.status {
            cond.last_transition_time = existing.last_transition_time;
        }
        *existing = cond;
    } else {
        conditions.push(cond);
    }
}

/// Metadata of a list response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// Store revision the list was read at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Token for the next page, if any.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_: Option<String>,
    /// Items left after this page (estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_item_count: Option<i64>,
}

/// A list of objects (`AllocationList`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct List<T> {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `<Kind>List`.
    #[serde(default)]
    pub kind: String,
    /// Revision and paging.
    #[serde(default)]
    pub metadata: ListMeta,
    /// The objects.
    #[serde(default)]
    pub items: Vec<T>,
}

/// The Kubernetes error object returned by the API for every failed request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Always `Status`.
    pub kind: String,
    /// Always `v1`.
    pub api_version: String,
    /// Unused list metadata (kept for wire compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ListMeta>,
    /// `Failure` (or `Success` for delete responses).
    pub status: String,
    /// Human-readable description.
    #[serde(default)]
    pub message: String,
    /// Machine-readable reason: `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`, ...
    #[serde(default)]
    pub reason: String,
    /// HTTP status code.
    #[serde(default)]
    pub code: u16,
    /// Extra details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
}

/// Details of a [`Status`] error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    /// Name of the object concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// API group (`lattice.dev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind, e.g. `allocations` or `Allocation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Object uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// One entry per field error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    /// Suggested client retry delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<i32>,
}

/// One cause inside [`StatusDetails`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusCause {
    /// e.g. `FieldValueInvalid`.
    #[serde(default)]
    pub reason: String,
    /// Human-readable.
    #[serde(default)]
    pub message: String,
    /// JSON path of the field.
    #[serde(default)]
    pub field: String,
}

impl Status {
    /// A `Failure` status with the given code, reason and message.
    pub fn failure(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: "Status".to_string(),
            api_version: "v1".to_string(),
            metadata: None,
            status: "Failure".to_string(),
            message: message.into(),
            reason: reason.into(),
            code,
            details: None,
        }
    }

    /// A 422 `Invalid` status carrying each field error as a cause.
    pub fn invalid(
        kind: &str,
        name: Option<&str>,
        errors: &crate::validation::ValidationErrors,
    ) -> Self {
        let mut s = Self::failure(
            422,
            "Invalid",
            format!(
                "{kind} {:?} is invalid: {}",
                name.unwrap_or(""),
                errors
                    .0
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
        s.details = Some(StatusDetails {
            name: name.map(str::to_string),
            group: Some(crate::registry::GROUP.to_string()),
            kind: Some(kind.to_string()),
            causes: errors
                .0
                .iter()
                .map(|e| StatusCause {
                    reason: "FieldValueInvalid".to_string(),
                    message: e.message.clone(),
                    field: e.path.clone(),
                })
                .collect(),
            ..StatusDetails::default()
        });
        s
    }
}

// Keep `is_false` available for kinds that skip false booleans.
pub(crate) fn skip_false(b: &bool) -> bool {
    is_false(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_fields_are_skipped_only_inside_without_managed_fields() {
        let json = r#"{"name":"a","labels":{"x":"1"},"managedFields":[{"manager":"kubectl",
            "operation":"Apply","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:x":{}}}}],
            "finalizers":["f"]}"#;
        let full: ObjectMeta = serde_json::from_str(json).unwrap();
        assert_eq!(full.managed_fields.len(), 1);
        assert_eq!(full.managed_fields[0].manager.as_deref(), Some("kubectl"));
        let lean: ObjectMeta = without_managed_fields(|| serde_json::from_str(json)).unwrap();
        assert!(lean.managed_fields.is_empty());
        // every other field is read as before, and the setting does not outlive the call
        assert_eq!(
            ObjectMeta {
                managed_fields: Vec::new(),
                ..full.clone()
            },
            lean
        );
        let again: ObjectMeta = serde_json::from_str(json).unwrap();
        assert_eq!(again, full);
        // a malformed managedFields is still an error, skipped or not
        let bad = r#"{"name":"a","managedFields":[1,"#;
        assert!(without_managed_fields(|| serde_json::from_str::<ObjectMeta>(bad)).is_err());
    }
}
