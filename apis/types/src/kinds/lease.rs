//! `Lease`: coordination lease used for node heartbeats and controller
//! leader election (Kubernetes `coordination.k8s.io/Lease` semantics).
//! Leases of cluster-wide components live in the [`SYSTEM_NAMESPACE`](crate::registry::SYSTEM_NAMESPACE).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::meta::{ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, Errors};

/// Namespace of the node agents' heartbeat Leases (one per node, named after it).
pub const NODE_LEASE_NAMESPACE: &str = "lattice-node-lease";
/// On a node heartbeat Lease: the agent's heartbeat sequence number when the object
/// was last written (it never goes back, not even across agent restarts).
pub use crate::wellknown::HEARTBEAT_SEQUENCE_ANNOTATION;
/// On a node heartbeat Lease written by the API server's heartbeat stream: the store
/// lease (decimal ID) the object is attached to. The store deletes the object when the
/// agent's heartbeats stop for the lease's TTL, so the object's existence is the
/// node's liveness; nobody renews it by writing.
pub use crate::wellknown::STORE_LEASE_ANNOTATION;

/// A lease.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lease {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Lease`.
    #[serde(default)]
    pub kind: String,
    /// Name, e.g. `node-x1000c0s0b0n0` or `lattice-scheduler`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Holder and timing.
    #[serde(default)]
    pub spec: LeaseSpec,
}

/// Lease holder and timing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseSpec {
    /// Identity of the current holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_identity: Option<String>,
    /// Seconds a holder keeps the lease without renewing (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
    /// When the current holder acquired it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<Time>,
    /// Last renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Time>,
    /// Times the lease changed hands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_transitions: Option<i32>,
}

impl LeaseSpec {
    /// Whether the lease has expired at `now` (never renewed = expired).
    pub fn is_expired(&self, now: Time) -> bool {
        match (
            self.renew_time.or(self.acquire_time),
            self.lease_duration_seconds,
        ) {
            (Some(t), Some(d)) => now > t + chrono::Duration::seconds(i64::from(d)),
            _ => true,
        }
    }
}

impl Resource for Lease {
    const KIND: &'static str = "Lease";
    const PLURAL: &'static str = "leases";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        self.spec.lease_duration_seconds.get_or_insert(15);
    }

    fn validate_fields(&self, errs: &mut Errors) {
        if let Some(d) = self.spec.lease_duration_seconds {
            if !(1..=86_400).contains(&d) {
                errs.push(
                    "spec.leaseDurationSeconds",
                    format!("must be between 1 and 86400, got {d}; 15 is typical"),
                );
            }
        }
        if let Some(t) = self.spec.lease_transitions {
            if t < 0 {
                errs.push(
                    "spec.leaseTransitions",
                    format!("must not be negative, got {t}"),
                );
            }
        }
        if let Some(h) = &self.spec.holder_identity {
            check_len(errs, "spec.holderIdentity", h, 253);
        }
    }
}
