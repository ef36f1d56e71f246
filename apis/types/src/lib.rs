//! # lattice-apis
//!
//! Resource types of the Lattice API (`apiVersion: lattice.dev/v1alpha1`):
//! [`Allocation`], [`Dag`], [`Tenant`], [`VCluster`], [`NetworkDomain`],
//! [`Node`], [`Lease`] and [`Event`], with serde + schemars derives,
//! defaulting, validation whose every error names the field path and the fix,
//! and a [`registry`] that lets the API server and CLI handle any kind
//! generically (plural names, short names, scope, printer columns, field
//! selectors, JSON Schema, admission).
//!
//! ```
//! use lattice_apis::{find_kind, API_VERSION};
//!
//! let info = find_kind("alloc").expect("short name");
//! assert_eq!(info.plural, "allocations");
//!
//! let manifest = serde_json::json!({
//!     "apiVersion": API_VERSION,
//!     "kind": "Allocation",
//!     "metadata": { "name": "hello", "namespace": "ml-team" },
//!     "spec": {
//!         "entrypoint": "/bin/sh",
//!         "args": ["-c", "echo hello"],
//!         "lifecycle": { "walltime": "10m" }
//!     }
//! });
//! // Strict parse, defaulting, validation; the result is normalized JSON.
//! let admitted = (info.admit)(manifest).expect("valid");
//! assert_eq!(admitted["spec"]["preemptionClass"], 5);
//! assert_eq!(admitted["spec"]["requeue"]["policy"], "on_node_failure");
//!
//! // Errors name the field and say how to fix it.
//! let bad = serde_json::json!({
//!     "kind": "Allocation",
//!     "metadata": { "name": "hello", "namespace": "ml-team" },
//!     "spec": { "entrypoint": "/bin/true", "preemptionClass": 12 }
//! });
//! let err = (info.admit)(bad).unwrap_err();
//! assert_eq!(err.0[0].path, "spec.preemptionClass");
//! assert!(err.to_string().starts_with("spec.preemptionClass: must be between 0 and 10, got 12"));
//! ```
//!
//! The string grammars users write — durations, task ranges, dependency strings — are
//! defined once in [`syntax`]; every component that reads one calls it:
//!
//! ```
//! use lattice_apis::syntax::{duration::parse_duration, tasks::TaskRange};
//!
//! assert_eq!(parse_duration("1h30m"), Ok(5_400));
//! assert_eq!(TaskRange::parse("0-15:4").unwrap().indices(), vec![0, 4, 8, 12]);
//! ```
//!
//! Typed use goes through [`Resource`] and [`resource::admit_typed`]:
//!
//! ```
//! use lattice_apis::{resource::admit_typed, Allocation, AllocationPhase};
//!
//! let yaml = "
//! metadata: {name: sweep, namespace: ml-team}
//! spec:
//!   entrypoint: /bin/sh
//!   args: ['-c', 'echo task $LATTICE_TASK_INDEX']
//!   taskGroup: {range: 0-99, concurrency: 20}
//!   lifecycle: {walltime: '4h'}
//! ";
//! let value: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
//! let alloc: Allocation = admit_typed(value).unwrap();
//! assert_eq!(alloc.phase(), AllocationPhase::Pending);
//! assert_eq!(alloc.spec.preemption_class, Some(5));
//! ```

#![warn(missing_docs)]

pub mod attach;
pub mod audit;
pub mod cluster_config;
pub mod extender;
pub mod intent;
pub mod kinds;
pub mod lifecycle;
pub mod meta;
pub mod metric;
pub mod node_identity;
pub mod registry;
pub mod resource;
pub mod schemas;
pub mod steps;
pub mod syntax;
pub mod validation;
pub mod wellknown;

/// Durations (`24h`, `72:00:00`, ...): the grammar lives in [`syntax::duration`].
pub use syntax::duration;

pub use kinds::allocation::{
    Allocation, AllocationPhase, AllocationSpec, AllocationStatus, Checkpoint, CheckpointStrategy,
    Connectivity, Constraints, CpuBind, DataMount, Dependency, DependencyCondition, DependencyKind,
    DependencyStatus, Distribution, Environment, ExposedPort, Lifecycle, LifecycleType,
    LivenessProbe, MountAccess, MpiKind, NodeCount, NodeTaskPhase, NodeTaskState, PortProtocol,
    ProbeType, Requeue, RequeuePolicy, Resources, ScalePolicy, ScaleStatus, ScaleTarget,
    StepLaunch, SymbolScope, SymbolType, TaskGroup, TaskGroupStatus, TaskRange, Telemetry,
    TelemetryMode, TierHint, Topology,
};
pub use kinds::dag::{
    Dag, DagCounts, DagDefaults, DagFailurePolicy, DagPhase, DagSpec, DagStatus, DagTask,
    DagTaskElements, DagTaskPhase, DagTaskStatus,
};
pub use kinds::event::{Event, EventSource, EventType, ObjectReference};
pub use kinds::lease::{
    Lease, LeaseSpec, HEARTBEAT_SEQUENCE_ANNOTATION, NODE_LEASE_NAMESPACE, STORE_LEASE_ANNOTATION,
};
pub use kinds::network_domain::{
    NetworkDomain, NetworkDomainPhase, NetworkDomainSpec, NetworkDomainStatus,
};
pub use kinds::node::{
    Gpu, Node, NodeAgentInfo, NodeCapacity, NodeDrain, NodeOwner, NodeSpec, NodeState, NodeStatus,
};
pub use kinds::rbac::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject, SubjectKind,
};
pub use kinds::tenant::{
    Tenant, TenantQuota, TenantRunAs, TenantSpec, TenantStatus, TenantUsage, UsageBucket,
};
pub use kinds::topology::{
    GpuLink, GpuLinkType, GpuTopology, MemoryDomain, MemoryDomainType, MemoryInterconnect,
    MemoryLinkType, MemoryTopology,
};
pub use kinds::vcluster::{
    Borrowing, PreemptionMode, PreemptionPolicy, SchedulerType, VCluster, VClusterSpec,
    VClusterStatus, WeightProfile, Weights,
};
pub use meta::{
    Condition, ConditionStatus, List, ListMeta, ManagedFieldsEntry, ObjectMeta, OwnerReference,
    Status, StatusCause, StatusDetails, Time, TypeMeta,
};
pub use registry::{
    find_kind, kinds, FieldError, KindInfo, PrinterColumn, ValidationErrors, API_VERSION, GROUP,
    SYSTEM_NAMESPACE, VERSION,
};
pub use resource::Resource;
pub use validation::{validate_dns1123_name, MAX_REPORTED_ERRORS};
