//! `AuditPolicy`: how much of each request the audit log records (Kubernetes' audit
//! policy: levels None / Metadata / Request / RequestResponse, first matching rule wins).
//! The cluster's policy is the one named [`POLICY_NAME`]; without it, [`default_rules`].
//! Whatever a policy says, access to sensitive work is recorded at least at Metadata, and
//! API token secrets are never recorded.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::audit::Level;
use crate::meta::ObjectMeta;
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::Errors;

/// The only name an AuditPolicy may have: the cluster has one policy.
pub const POLICY_NAME: &str = "default";

/// One rule: the level for the requests it matches (every listed condition must hold; an
/// empty list matches everything).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditRule {
    /// The level.
    pub level: Level,
    /// Users (a trailing `*` matches a prefix: `system:node:*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Verbs (get, list, watch, create, update, patch, delete, connect, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verbs: Vec<String>,
    /// Resources as rules name them: `allocations`, `allocations/log`, `allocations/*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Tenants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
}

/// What is asked of a rule.
pub struct AuditRequest<'a> {
    /// The caller.
    pub user: &'a str,
    /// Its groups.
    pub groups: &'a [String],
    /// The verb.
    pub verb: &'a str,
    /// The resource.
    pub resource: &'a str,
    /// The subresource.
    pub subresource: Option<&'a str>,
    /// The tenant.
    pub tenant: Option<&'a str>,
}

impl AuditRule {
    /// Whether the rule matches `r`.
    pub fn matches(&self, r: &AuditRequest) -> bool {
        let user = self.users.is_empty()
            || self.users.iter().any(|u| match u.strip_suffix('*') {
                Some(p) => r.user.starts_with(p),
                None => u == r.user,
            });
        let group = self.groups.is_empty() || self.groups.iter().any(|g| r.groups.contains(g));
        let verb = self.verbs.is_empty() || self.verbs.iter().any(|v| v == "*" || v == r.verb);
        let resource = self.resources.is_empty()
            || self.resources.iter().any(|p| {
                p == "*"
                    || match (p.split_once('/'), r.subresource) {
                        (None, None) => p == r.resource,
                        (Some((res, s)), Some(sub)) => res == r.resource && (s == "*" || s == sub),
                        _ => false,
                    }
            });
        let tenant = self.tenants.is_empty()
            || r.tenant
                .is_some_and(|t| self.tenants.iter().any(|x| x == t));
        user && group && verb && resource && tenant
    }
}

/// The level of `r` under `rules`: the first match's; `None` when no rule matches.
pub fn level_for(rules: &[AuditRule], r: &AuditRequest) -> Level {
    rules
        .iter()
        .find(|rule| rule.matches(r))
        .map_or(Level::None, |rule| rule.level)
}

/// The policy without an AuditPolicy: node heartbeats and leases not at all, reads not
/// (sensitive ones are recorded anyway), grants of rights with their request, every other
/// change and every session or log read at Metadata.
pub fn default_rules() -> Vec<AuditRule> {
    let rule = |level, verbs: &[&str], resources: &[&str]| AuditRule {
        level,
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        resources: resources.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    vec![
        rule(Level::None, &[], &["nodes/heartbeat", "leases"]),
        rule(Level::None, &["get", "list", "watch"], &[]),
        rule(
            Level::Request,
            &[],
            &[
                "roles",
                "clusterroles",
                "rolebindings",
                "clusterrolebindings",
                "apitokens",
                "auditpolicies",
            ],
        ),
        rule(Level::Metadata, &[], &[]),
    ]
}

/// The cluster's audit policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditPolicy {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `AuditPolicy`.
    #[serde(default)]
    pub kind: String,
    /// Name: `default`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The rules, first match wins; no match: not recorded.
    #[serde(default)]
    pub rules: Vec<AuditRule>,
}

impl Resource for AuditPolicy {
    const KIND: &'static str = "AuditPolicy";
    const PLURAL: &'static str = "auditpolicies";
    const NAMESPACED: bool = false;
    impl_resource_meta!();

    fn validate_fields(&self, errs: &mut Errors) {
        if self
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n != POLICY_NAME)
        {
            errs.push(
                "metadata.name",
                format!(
                    "the cluster has one audit policy, named {POLICY_NAME:?}; name it so (another \
                     name would never be read)"
                ),
            );
        }
        if self.rules.len() > 256 {
            errs.push("rules", "has more than 256 rules; merge them");
        }
        for (i, r) in self.rules.iter().enumerate() {
            for (j, v) in r.verbs.iter().enumerate() {
                if v != "*" && !crate::kinds::rbac::VERBS.contains(&v.as_str()) {
                    errs.push(
                        format!("rules[{i}].verbs[{j}]"),
                        format!(
                            "unknown verb {v:?}; use one of {} or *",
                            crate::kinds::rbac::VERBS.join(", ")
                        ),
                    );
                }
            }
            for (j, res) in r.resources.iter().enumerate() {
                let base = res.split('/').next().unwrap_or_default();
                if res != "*" && !crate::kinds::rbac::known_resources().any(|k| k == base) {
                    errs.push(
                        format!("rules[{i}].resources[{j}]"),
                        format!("unknown resource {base:?}; use a kind's plural (allocations, ...) or *"),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(
        user: &'a str,
        verb: &'a str,
        resource: &'a str,
        sub: Option<&'a str>,
    ) -> AuditRequest<'a> {
        AuditRequest {
            user,
            groups: &[],
            verb,
            resource,
            subresource: sub,
            tenant: Some("t1"),
        }
    }

    #[test]
    fn the_default_records_changes_and_sessions_not_reads_or_heartbeats() {
        let d = default_rules();
        assert_eq!(
            level_for(&d, &req("alice", "create", "allocations", None)),
            Level::Metadata
        );
        assert_eq!(
            level_for(&d, &req("alice", "connect", "allocations", Some("attach"))),
            Level::Metadata
        );
        assert_eq!(
            level_for(&d, &req("alice", "get", "allocations", None)),
            Level::None
        );
        assert_eq!(
            level_for(
                &d,
                &req("system:node:n1", "update", "nodes", Some("heartbeat"))
            ),
            Level::None
        );
        assert_eq!(
            level_for(&d, &req("root", "create", "rolebindings", None)),
            Level::Request
        );
        let users = AuditRule {
            level: Level::RequestResponse,
            users: vec!["system:node:*".into()],
            ..Default::default()
        };
        assert!(users.matches(&req("system:node:n7", "get", "nodes", None)));
        assert!(!users.matches(&req("alice", "get", "nodes", None)));
    }
}
