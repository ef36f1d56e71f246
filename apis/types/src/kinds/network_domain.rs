//! `NetworkDomain`: a tenant-scoped group of allocations sharing L3
//! reachability, backed by a Slingshot VNI (the seed's "Network Domains").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;
use crate::meta::{skip_false, Condition, ObjectMeta, Time};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, validate_dns1123_name, Errors};

/// Default grace period before an unused domain releases its VNI.
pub const DEFAULT_GRACE_PERIOD: &str = "5m";
/// Largest VNI value (24 bits).
pub const MAX_VNI: u32 = 0x00FF_FFFF;

/// A network domain.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkDomain {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `NetworkDomain`.
    #[serde(default)]
    pub kind: String,
    /// Name (user-chosen) and namespace (= tenant).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired settings.
    #[serde(default)]
    pub spec: NetworkDomainSpec,
    /// VNI and members, written by the VNI controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NetworkDomainStatus>,
}

/// Network domain settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkDomainSpec {
    /// How long the domain (and its VNI) survives with no allocations (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<String>,
    /// Sensitive domains belong to exactly one allocation and get encrypted transport.
    #[serde(default, skip_serializing_if = "skip_false")]
    pub sensitive: bool,
    /// Free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Network domain phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NetworkDomainPhase {
    /// Waiting for a VNI.
    #[default]
    Pending,
    /// VNI assigned, allocations attached.
    Active,
    /// No allocations left; VNI kept until the grace period ends.
    Draining,
    /// VNI returned to the pool.
    Released,
}

/// Observed domain state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkDomainStatus {
    /// Pending | Active | Draining | Released.
    #[serde(default)]
    pub phase: NetworkDomainPhase,
    /// The assigned VNI (from the pool, 1000–4095 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// Allocations currently in the domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<String>,
    /// When the last allocation left (start of the grace period).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining_since: Option<Time>,
    /// `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl Resource for NetworkDomain {
    const KIND: &'static str = "NetworkDomain";
    const PLURAL: &'static str = "networkdomains";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        if self.spec.grace_period.is_none() {
            self.spec.grace_period = Some(DEFAULT_GRACE_PERIOD.to_string());
        }
    }

    fn validate_fields(&self, errs: &mut Errors) {
        if let Some(g) = &self.spec.grace_period {
            if let Err(e) = parse_duration(g) {
                errs.push("spec.gracePeriod", e);
            }
        }
        if let Some(d) = &self.spec.description {
            check_len(errs, "spec.description", d, 1024);
        }
        if let Some(st) = &self.status {
            if let Some(v) = st.vni {
                if v == 0 || v > MAX_VNI {
                    errs.push(
                        "status.vni",
                        format!("must be between 1 and {MAX_VNI}, got {v}"),
                    );
                }
            }
            if self.spec.sensitive && st.allocations.len() > 1 {
                errs.push(
                    "status.allocations",
                    "a sensitive domain belongs to exactly one allocation",
                );
            }
            for (i, a) in st.allocations.iter().enumerate() {
                errs.extend(validate_dns1123_name(
                    format_args!("status.allocations[{i}]"),
                    a,
                ));
            }
        }
    }
}
