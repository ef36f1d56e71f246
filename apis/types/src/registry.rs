//! The kind registry: everything the API server and CLI need to serve and
//! print a kind without knowing its Rust type.

use crate::kinds::{
    allocation::Allocation,
    audit_policy::AuditPolicy,
    dag::Dag,
    event::Event,
    lease::Lease,
    network_domain::NetworkDomain,
    node::Node,
    rbac::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    tenant::Tenant,
    vcluster::VCluster,
};
use crate::resource::{admit_json, schema_json};
pub use crate::validation::{FieldError, ValidationErrors};

/// API group of all Lattice kinds.
pub const GROUP: &str = "lattice.dev";
/// API version of all Lattice kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of all Lattice kinds.
pub use crate::wellknown::API_VERSION;
/// Namespace for objects that belong to no tenant: Leases of cluster
/// components and node heartbeats, Events about Nodes and Tenants.
pub const SYSTEM_NAMESPACE: &str = "lattice-system";

/// A column of `lattice get` table output.
#[derive(Debug, Clone, Copy)]
pub struct PrinterColumn {
    /// Header, e.g. `STATE`.
    pub name: &'static str,
    /// Simple JSON path into the object, e.g. `.status.phase`.
    pub json_path: &'static str,
    /// `string`, `integer` or `date` (dates print as an age, e.g. `5m`).
    pub type_: &'static str,
    /// 0 = normal table, 1 = only with `-o wide`.
    pub priority: i32,
}

/// Everything about one kind.
pub struct KindInfo {
    /// `Allocation`.
    pub kind: &'static str,
    /// `allocations`.
    pub plural: &'static str,
    /// `allocation`.
    pub singular: &'static str,
    /// e.g. `["alloc"]`.
    pub short_names: &'static [&'static str],
    /// Namespace == tenant; Tenant and Node are cluster-scoped.
    pub namespaced: bool,
    /// Whether the kind has a `status` subresource.
    pub has_status: bool,
    /// Table columns.
    pub printer_columns: &'static [PrinterColumn],
    /// Field-selector paths besides `metadata.name` / `metadata.namespace`.
    pub selectable_fields: &'static [&'static str],
    /// JSON Schema (schemars) of the whole object.
    pub schema: fn() -> serde_json::Value,
    /// Strictly parse the whole object JSON (unknown fields and wrong types
    /// are errors naming the field path), apply defaulting, validate, and
    /// return the normalized object JSON (camelCase, defaults filled).
    pub admit: fn(serde_json::Value) -> Result<serde_json::Value, ValidationErrors>,
}

impl std::fmt::Debug for KindInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindInfo")
            .field("kind", &self.kind)
            .field("plural", &self.plural)
            .field("namespaced", &self.namespaced)
            .finish_non_exhaustive()
    }
}

impl KindInfo {
    /// `lattice.dev/v1alpha1`.
    pub fn api_version(&self) -> &'static str {
        API_VERSION
    }

    /// `<Kind>List`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Store key prefix: `/registry/lattice.dev/<plural>/`.
    pub fn key_prefix(&self) -> String {
        format!("/registry/{GROUP}/{}/", self.plural)
    }

    /// Store key of one object: `/registry/lattice.dev/<plural>/<tenant>/<name>` for
    /// namespaced kinds, `/registry/lattice.dev/<plural>/<name>` for cluster-scoped ones.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("{}{ns}/{name}", self.key_prefix()),
            _ => format!("{}{name}", self.key_prefix()),
        }
    }

    /// Whether `field` may be used in a field selector.
    pub fn is_selectable(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.selectable_fields.contains(&field)
    }
}

const fn col(
    name: &'static str,
    json_path: &'static str,
    type_: &'static str,
    priority: i32,
) -> PrinterColumn {
    PrinterColumn {
        name,
        json_path,
        type_,
        priority,
    }
}

const NAME: PrinterColumn = col("NAME", ".metadata.name", "string", 0);
const AGE: PrinterColumn = col("AGE", ".metadata.creationTimestamp", "date", 0);

// `lattice status`: ID NAME STATE NODES WALLTIME ELAPSED VCLUSTER;
// wide adds tenant, project, uenv, GPU type, dragonfly groups, nodes, reason and message.
const ALLOCATION_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("STATE", ".status.phase", "string", 0),
    col("NODES", ".spec.resources.nodes", "string", 0),
    col("WALLTIME", ".spec.lifecycle.walltime", "string", 0),
    col("ELAPSED", ".status.startTime", "date", 0),
    col("VCLUSTER", ".spec.vcluster", "string", 0),
    AGE,
    col("TENANT", ".metadata.namespace", "string", 1),
    col("PROJECT", ".spec.project", "string", 1),
    col("UENV", ".spec.environment.uenv", "string", 1),
    col(
        "GPU TYPE",
        ".spec.resources.constraints.gpuType",
        "string",
        1,
    ),
    col("GROUPS", ".status.topologyGroups", "string", 1),
    col("ASSIGNED NODES", ".status.assignedNodes", "string", 1),
    col("REASON", ".status.reason", "string", 1),
    // What a pending allocation waits for, with the numbers (the scheduler's explanation).
    col("MESSAGE", ".status.message", "string", 1),
];

const DAG_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("STATE", ".status.phase", "string", 0),
    col("TASKS", ".status.counts.total", "integer", 0),
    col("COMPLETED", ".status.counts.completed", "integer", 0),
    col("RUNNING", ".status.counts.running", "integer", 0),
    col("FAILED", ".status.counts.failed", "integer", 0),
    AGE,
    col("WAITING", ".status.counts.waiting", "integer", 1),
    col("PENDING", ".status.counts.pending", "integer", 1),
    col("SKIPPED", ".status.counts.skipped", "integer", 1),
    col("CANCELLED", ".status.counts.cancelled", "integer", 1),
    col("FAILURE POLICY", ".spec.failurePolicy", "string", 1),
];

const TENANT_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("MAX NODES", ".spec.quota.maxNodes", "integer", 0),
    col("NODES", ".status.usage.nodes", "integer", 0),
    col(
        "MAX ALLOCATIONS",
        ".spec.quota.maxConcurrentAllocations",
        "integer",
        0,
    ),
    col("RUNNING", ".status.usage.runningAllocations", "integer", 0),
    AGE,
    col("PENDING", ".status.usage.pendingAllocations", "integer", 1),
    col("FAIR SHARE", ".spec.quota.fairShareTarget", "string", 1),
    col(
        "GPU-HOURS BUDGET",
        ".spec.quota.gpuHoursBudget",
        "string",
        1,
    ),
    col("GPU-HOURS USED", ".status.usage.gpuHoursUsed", "string", 1),
    col(
        "SENSITIVE POOL",
        ".spec.quota.sensitivePoolSize",
        "integer",
        1,
    ),
];

const VCLUSTER_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("SCHEDULER", ".spec.schedulerType", "string", 0),
    col("NODES", ".status.nodes", "integer", 0),
    col("PENDING", ".status.pendingAllocations", "integer", 0),
    col("RUNNING", ".status.runningAllocations", "integer", 0),
    AGE,
    col("PROFILE", ".spec.profile", "string", 1),
    col("CYCLE", ".spec.cycleInterval", "string", 1),
    col("BACKFILL DEPTH", ".spec.backfillDepth", "integer", 1),
    col("BORROWED", ".status.borrowedNodes", "integer", 1),
    col("LENT", ".status.lentNodes", "integer", 1),
    col("PREEMPTION", ".spec.preemption.mode", "string", 1),
];

const NETWORK_DOMAIN_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("STATE", ".status.phase", "string", 0),
    col("VNI", ".status.vni", "integer", 0),
    AGE,
    col("ALLOCATIONS", ".status.allocations", "string", 1),
    col("GRACE", ".spec.gracePeriod", "string", 1),
    col("SENSITIVE", ".spec.sensitive", "string", 1),
];

// `lattice nodes`: NODE STATE GPUS VCLUSTER TENANT GROUP CONFORMANCE.
const NODE_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("STATE", ".status.state", "string", 0),
    col("GPUS", ".status.capacity.gpuCount", "integer", 0),
    col("GPU TYPE", ".status.capacity.gpuType", "string", 0),
    col("VCLUSTER", ".status.owner.vcluster", "string", 0),
    col("TENANT", ".status.owner.tenant", "string", 0),
    col("GROUP", ".spec.topologyGroup", "integer", 0),
    col("CONFORMANCE", ".status.conformanceFingerprint", "string", 0),
    AGE,
    col("ALLOCATION", ".status.owner.allocation", "string", 1),
    col("HOME VCLUSTER", ".spec.homeVcluster", "string", 1),
    col("CPUS", ".status.capacity.cpuCores", "integer", 1),
    col("MEMORY GB", ".status.capacity.memoryGb", "integer", 1),
    col("LAST HEARTBEAT", ".status.lastHeartbeatTime", "date", 1),
    col("REASON", ".status.reason", "string", 1),
];

const LEASE_COLUMNS: &[PrinterColumn] = &[
    NAME,
    col("HOLDER", ".spec.holderIdentity", "string", 0),
    col("RENEWED", ".spec.renewTime", "date", 0),
    AGE,
    col("DURATION", ".spec.leaseDurationSeconds", "integer", 1),
    col("TRANSITIONS", ".spec.leaseTransitions", "integer", 1),
];

const ROLE_COLUMNS: &[PrinterColumn] = &[NAME, AGE];
const BINDING_COLUMNS: &[PrinterColumn] = &[NAME, col("ROLE", ".roleRef.name", "string", 0), AGE];

const EVENT_COLUMNS: &[PrinterColumn] = &[
    col("LAST SEEN", ".lastTimestamp", "date", 0),
    col("TYPE", ".type", "string", 0),
    col("REASON", ".reason", "string", 0),
    col("OBJECT", ".involvedObject.name", "string", 0),
    col("MESSAGE", ".message", "string", 0),
    AGE,
    col("NAME", ".metadata.name", "string", 1),
    col("KIND", ".involvedObject.kind", "string", 1),
    col("COUNT", ".count", "integer", 1),
    col("SOURCE", ".source.component", "string", 1),
];

static KINDS: &[KindInfo] = &[
    KindInfo {
        kind: "Allocation",
        plural: "allocations",
        singular: "allocation",
        short_names: &["alloc", "allocs"],
        namespaced: true,
        has_status: true,
        printer_columns: ALLOCATION_COLUMNS,
        selectable_fields: &[
            "status.phase",
            "spec.vcluster",
            "status.assignedNodes",
            "spec.project",
            "spec.lifecycle.type",
            "spec.sensitive",
        ],
        schema: schema_json::<Allocation>,
        admit: admit_json::<Allocation>,
    },
    KindInfo {
        kind: "Dag",
        plural: "dags",
        singular: "dag",
        short_names: &["wf", "workflow"],
        namespaced: true,
        has_status: true,
        printer_columns: DAG_COLUMNS,
        selectable_fields: &["status.phase"],
        schema: schema_json::<Dag>,
        admit: admit_json::<Dag>,
    },
    KindInfo {
        kind: "Tenant",
        plural: "tenants",
        singular: "tenant",
        short_names: &["tn"],
        namespaced: false,
        has_status: true,
        printer_columns: TENANT_COLUMNS,
        selectable_fields: &[],
        schema: schema_json::<Tenant>,
        admit: admit_json::<Tenant>,
    },
    KindInfo {
        kind: "VCluster",
        plural: "vclusters",
        singular: "vcluster",
        short_names: &["vc"],
        namespaced: true,
        has_status: true,
        printer_columns: VCLUSTER_COLUMNS,
        selectable_fields: &["spec.schedulerType"],
        schema: schema_json::<VCluster>,
        admit: admit_json::<VCluster>,
    },
    KindInfo {
        kind: "NetworkDomain",
        plural: "networkdomains",
        singular: "networkdomain",
        short_names: &["nd", "netdom"],
        namespaced: true,
        has_status: true,
        printer_columns: NETWORK_DOMAIN_COLUMNS,
        selectable_fields: &["status.phase", "status.vni"],
        schema: schema_json::<NetworkDomain>,
        admit: admit_json::<NetworkDomain>,
    },
    KindInfo {
        kind: "Node",
        plural: "nodes",
        singular: "node",
        short_names: &["no"],
        namespaced: false,
        has_status: true,
        printer_columns: NODE_COLUMNS,
        selectable_fields: &[
            "status.state",
            "spec.topologyGroup",
            "spec.unschedulable",
            "spec.homeVcluster",
            "status.owner.vcluster",
            "status.owner.tenant",
            "status.owner.allocation",
        ],
        schema: schema_json::<Node>,
        admit: admit_json::<Node>,
    },
    KindInfo {
        kind: "Lease",
        plural: "leases",
        singular: "lease",
        short_names: &[],
        namespaced: true,
        has_status: false,
        printer_columns: LEASE_COLUMNS,
        selectable_fields: &["spec.holderIdentity"],
        schema: schema_json::<Lease>,
        admit: admit_json::<Lease>,
    },
    KindInfo {
        kind: "Event",
        plural: "events",
        singular: "event",
        short_names: &["ev"],
        namespaced: true,
        has_status: false,
        printer_columns: EVENT_COLUMNS,
        selectable_fields: &[
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
            "source.component",
        ],
        schema: schema_json::<Event>,
        admit: admit_json::<Event>,
    },
    KindInfo {
        kind: "Role",
        plural: "roles",
        singular: "role",
        short_names: &[],
        namespaced: true,
        has_status: false,
        printer_columns: ROLE_COLUMNS,
        selectable_fields: &[],
        schema: schema_json::<Role>,
        admit: admit_json::<Role>,
    },
    KindInfo {
        kind: "ClusterRole",
        plural: "clusterroles",
        singular: "clusterrole",
        short_names: &[],
        namespaced: false,
        has_status: false,
        printer_columns: ROLE_COLUMNS,
        selectable_fields: &[],
        schema: schema_json::<ClusterRole>,
        admit: admit_json::<ClusterRole>,
    },
    KindInfo {
        kind: "RoleBinding",
        plural: "rolebindings",
        singular: "rolebinding",
        short_names: &[],
        namespaced: true,
        has_status: false,
        printer_columns: BINDING_COLUMNS,
        selectable_fields: &["roleRef.name"],
        schema: schema_json::<RoleBinding>,
        admit: admit_json::<RoleBinding>,
    },
    KindInfo {
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        short_names: &[],
        namespaced: false,
        has_status: false,
        printer_columns: BINDING_COLUMNS,
        selectable_fields: &["roleRef.name"],
        schema: schema_json::<ClusterRoleBinding>,
        admit: admit_json::<ClusterRoleBinding>,
    },
    KindInfo {
        kind: "AuditPolicy",
        plural: "auditpolicies",
        singular: "auditpolicy",
        short_names: &[],
        namespaced: false,
        has_status: false,
        printer_columns: ROLE_COLUMNS,
        selectable_fields: &[],
        schema: schema_json::<AuditPolicy>,
        admit: admit_json::<AuditPolicy>,
    },
];

/// All kinds, in a stable order.
pub fn kinds() -> &'static [KindInfo] {
    KINDS
}

/// Case-insensitive match on kind, plural, singular or any short name.
pub fn find_kind(name: &str) -> Option<&'static KindInfo> {
    let name = name.trim();
    KINDS.iter().find(|k| {
        k.kind.eq_ignore_ascii_case(name)
            || k.plural.eq_ignore_ascii_case(name)
            || k.singular.eq_ignore_ascii_case(name)
            || k.short_names.iter().any(|s| s.eq_ignore_ascii_case(name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Resource;

    #[test]
    fn find_kind_by_any_name_case_insensitively() {
        for (name, kind) in [
            ("alloc", "Allocation"),
            ("Allocations", "Allocation"),
            ("ALLOCATION", "Allocation"),
            ("dag", "Dag"),
            ("dags", "Dag"),
            ("wf", "Dag"),
            ("vc", "VCluster"),
            ("vcluster", "VCluster"),
            ("tn", "Tenant"),
            ("tenants", "Tenant"),
            ("no", "Node"),
            ("nodes", "Node"),
            ("nd", "NetworkDomain"),
            ("networkdomains", "NetworkDomain"),
            ("NetworkDomain", "NetworkDomain"),
            ("lease", "Lease"),
            ("ev", "Event"),
            ("events", "Event"),
        ] {
            assert_eq!(find_kind(name).map(|k| k.kind), Some(kind), "{name}");
        }
        assert!(find_kind("pods").is_none());
        assert!(find_kind("").is_none());
    }

    #[test]
    fn names_are_unique_across_kinds() {
        let mut seen = std::collections::BTreeMap::new();
        for k in kinds() {
            for n in [k.kind, k.plural, k.singular].iter().chain(k.short_names) {
                let prev = seen.insert(n.to_ascii_lowercase(), k.kind);
                assert!(
                    prev.is_none() || prev == Some(k.kind),
                    "{n} names two kinds"
                );
            }
        }
    }

    #[test]
    fn registry_matches_resource_impls() {
        fn check<T: Resource>() {
            let k = find_kind(T::KIND).expect("registered");
            assert_eq!(k.plural, T::PLURAL);
            assert_eq!(k.namespaced, T::NAMESPACED);
            assert_eq!(k.singular, T::KIND.to_ascii_lowercase());
        }
        check::<Allocation>();
        check::<Dag>();
        check::<Tenant>();
        check::<VCluster>();
        check::<NetworkDomain>();
        check::<Node>();
        check::<Lease>();
        check::<Event>();
        check::<Role>();
        check::<ClusterRole>();
        check::<RoleBinding>();
        check::<ClusterRoleBinding>();
        check::<AuditPolicy>();
        assert_eq!(kinds().len(), 13);
        assert!(!find_kind("tenant").expect("tenant").namespaced);
        assert!(!find_kind("node").expect("node").namespaced);
    }

    #[test]
    fn printer_columns() {
        for k in kinds() {
            let age = k
                .printer_columns
                .iter()
                .find(|c| c.name == "AGE")
                .unwrap_or_else(|| panic!("{} has no AGE column", k.kind));
            assert_eq!(age.json_path, ".metadata.creationTimestamp");
            assert_eq!(age.type_, "date");
            assert_eq!(age.priority, 0);
            for c in k.printer_columns {
                assert!(c.json_path.starts_with('.'), "{}: {}", k.kind, c.name);
                assert!(
                    ["string", "integer", "date"].contains(&c.type_),
                    "{}: {}",
                    k.kind,
                    c.name
                );
                assert!(c.priority == 0 || c.priority == 1);
            }
            // Every column path must exist in the kind's schema.
            let schema = (k.schema)();
            for c in k.printer_columns {
                assert!(
                    schema_has_path(&schema, &schema, c.json_path),
                    "{}: column {} path {} not in schema",
                    k.kind,
                    c.name,
                    c.json_path
                );
            }
        }
        let names = |kind: &str, prio: i32| -> Vec<&str> {
            find_kind(kind)
                .expect("kind")
                .printer_columns
                .iter()
                .filter(|c| c.priority == prio)
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(
            names("alloc", 0),
            ["NAME", "STATE", "NODES", "WALLTIME", "ELAPSED", "VCLUSTER", "AGE"]
        );
        for wide in [
            "TENANT",
            "PROJECT",
            "UENV",
            "GPU TYPE",
            "ASSIGNED NODES",
            "REASON",
        ] {
            assert!(names("alloc", 1).contains(&wide), "{wide}");
        }
        assert_eq!(
            names("node", 0),
            [
                "NAME",
                "STATE",
                "GPUS",
                "GPU TYPE",
                "VCLUSTER",
                "TENANT",
                "GROUP",
                "CONFORMANCE",
                "AGE"
            ]
        );
    }

    #[test]
    fn selectable_fields_exist_in_schema() {
        for k in kinds() {
            let schema = (k.schema)();
            for f in k.selectable_fields {
                assert!(
                    schema_has_path(&schema, &schema, &format!(".{f}")),
                    "{}: selectable field {f} not in schema",
                    k.kind
                );
            }
            assert!(k.is_selectable("metadata.name"));
            assert_eq!(k.is_selectable("metadata.namespace"), k.namespaced);
        }
        assert!(find_kind("node")
            .expect("node")
            .is_selectable("status.state"));
    }

    /// Whether a `.a.b.c` path is described by the schema (following `$ref`, `anyOf`, `oneOf`).
    fn schema_has_path(root: &serde_json::Value, node: &serde_json::Value, path: &str) -> bool {
        let node = resolve(root, node);
        let Some(rest) = path.strip_prefix('.') else {
            return true;
        };
        if rest.is_empty() {
            return true;
        }
        let (head, tail) = match rest.find('.') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let candidates: Vec<&serde_json::Value> = std::iter::once(node)
            .chain(node["anyOf"].as_array().into_iter().flatten())
            .chain(node["oneOf"].as_array().into_iter().flatten())
            .collect();
        candidates.into_iter().any(|c| {
            let c = resolve(root, c);
            match c["properties"].get(head) {
                Some(p) => schema_has_path(root, p, if tail.is_empty() { "." } else { tail }),
                None => false,
            }
        })
    }

    fn resolve<'a>(
        root: &'a serde_json::Value,
        node: &'a serde_json::Value,
    ) -> &'a serde_json::Value {
        match node["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            Some(name) => &root["$defs"][name],
            None => node,
        }
    }
}
