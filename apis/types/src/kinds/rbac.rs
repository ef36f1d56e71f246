//! Role-based access control as resources, in Kubernetes' shape: `ClusterRole` and `Role`
//! (what may be done: verbs × resources × subresources × resource names) and
//! `ClusterRoleBinding` and `RoleBinding` (to whom: users, groups, service accounts; a
//! `RoleBinding` grants only inside its own tenant). The roles of the product
//! documentation ship as built-in ClusterRoles ([`builtin_cluster_roles`]); the API
//! server's authorizer evaluates them (`docs/security.md` has the table).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::meta::ObjectMeta;
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, Errors};

/// What a rule may allow. `connect` opens a session into a workload or reads its output
/// (the `log` and `attach` subresources); `claim` submits sensitive work, which claims
/// nodes for itself alone; `impersonate` (on `users`) asks what another user may do.
pub const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "connect",
    "claim",
    "impersonate",
];

/// Resources that are routes rather than kinds.
pub const NON_KIND_RESOURCES: &[&str] = &[
    // `/v1/admin/config`: the cluster settings.
    "clusterconfig",
    // Bootstrap tokens for node identities.
    "bootstraptokens",
    // Node certificates: issuing, renewing, revoking.
    "nodecertificates",
    // Attach tickets, redeemed by node agents only.
    "attachtickets",
    // API tokens for people and automation (`lattice admin token`).
    "apitokens",
    // Users and groups, as targets of `impersonate` (`lattice auth can-i --as`, API
    // tokens for another user or in a group).
    "users",
    "groups",
    // The audit log (`lattice audit query`; in a tenant: that tenant's records).
    "auditrecords",
];

/// Subresources a rule may name (`<resource>/<subresource>`).
pub const SUBRESOURCES: &[&str] = &[
    "status",
    "log",
    "attach",
    "token",
    "report",
    "heartbeat",
    "renew",
];

/// One permission: every combination of its verbs, resources and (when given) names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRule {
    /// Verbs ([`VERBS`]) or `*`.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// Resources: a kind's plural (`allocations`), a subresource (`allocations/log`),
    /// every subresource (`allocations/*`), or `*` for every resource and subresource.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Only these objects (by name); empty: all. A rule with names never allows `list`,
    /// `watch` or `create`, which name no object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
}

impl PolicyRule {
    /// A rule of `verbs` on `resources`.
    pub fn new(verbs: &[&str], resources: &[&str]) -> Self {
        Self {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resources: resources.iter().map(|s| s.to_string()).collect(),
            resource_names: Vec::new(),
        }
    }

    /// Whether this rule allows `verb` on `resource` (`sub`resource) `name`.
    pub fn allows(
        &self,
        verb: &str,
        resource: &str,
        sub: Option<&str>,
        name: Option<&str>,
    ) -> bool {
        let verb_ok = self.verbs.iter().any(|v| v == "*" || v == verb);
        let resource_ok = self
            .resources
            .iter()
            .any(|r| resource_matches(r, resource, sub));
        let name_ok = self.resource_names.is_empty()
            || name.is_some_and(|n| self.resource_names.iter().any(|x| x == n));
        verb_ok && resource_ok && name_ok
    }

    fn validate(&self, at: &str, errs: &mut Errors) {
        if self.verbs.is_empty() {
            errs.push(
                format!("{at}.verbs"),
                "must name at least one verb (get, list, watch, create, update, patch, delete, \
                 connect, claim, impersonate) or *",
            );
        }
        for (i, v) in self.verbs.iter().enumerate() {
            if v != "*" && !VERBS.contains(&v.as_str()) {
                errs.push(
                    format!("{at}.verbs[{i}]"),
                    format!(
                        "unknown verb {:?}; use one of {} or *",
                        crate::validation::truncate(v, 60),
                        VERBS.join(", ")
                    ),
                );
            }
        }
        if self.resources.is_empty() {
            errs.push(
                format!("{at}.resources"),
                "must name at least one resource (a kind's plural such as allocations) or *",
            );
        }
        for (i, r) in self.resources.iter().enumerate() {
            if let Err(why) = check_resource(r) {
                errs.push(format!("{at}.resources[{i}]"), why);
            }
        }
        for (i, n) in self.resource_names.iter().enumerate() {
            check_len(errs, format_args!("{at}.resourceNames[{i}]"), n, 253);
            if n.is_empty() {
                errs.push(format!("{at}.resourceNames[{i}]"), "must not be empty");
            }
        }
        if self.verbs.len() > 64 || self.resources.len() > 256 || self.resource_names.len() > 1024 {
            errs.push(
                at.to_string(),
                "has too many entries (at most 64 verbs, 256 resources, 1024 names); split it",
            );
        }
    }
}

/// Whether the rule's `pattern` covers `resource` (`sub`resource).
fn resource_matches(pattern: &str, resource: &str, sub: Option<&str>) -> bool {
    if pattern == "*" {
        return true;
    }
    match (pattern.split_once('/'), sub) {
        (None, None) => pattern == resource,
        (Some((r, s)), Some(sub)) => r == resource && (s == "*" || s == sub),
        _ => false,
    }
}

/// Every resource a rule may name: the kinds' plurals and [`NON_KIND_RESOURCES`].
pub fn known_resources() -> impl Iterator<Item = &'static str> {
    crate::registry::kinds()
        .iter()
        .map(|k| k.plural)
        .chain(NON_KIND_RESOURCES.iter().copied())
}

fn check_resource(r: &str) -> Result<(), String> {
    if r == "*" {
        return Ok(());
    }
    let (res, sub) = match r.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (r, None),
    };
    if !known_resources().any(|k| k == res) {
        let known: Vec<&str> = known_resources().collect();
        return Err(format!(
            "unknown resource {:?}; use a kind's plural ({}) or *",
            crate::validation::truncate(res, 60),
            known.join(", ")
        ));
    }
    if let Some(s) = sub {
        if s != "*" && !SUBRESOURCES.contains(&s) {
            return Err(format!(
                "unknown subresource {:?}; use one of {} or *",
                crate::validation::truncate(s, 60),
                SUBRESOURCES.join(", ")
            ));
        }
    }
    Ok(())
}

fn validate_rules(rules: &[PolicyRule], errs: &mut Errors) {
    if rules.len() > 256 {
        errs.push("rules", "has more than 256 rules; merge them");
    }
    for (i, r) in rules.iter().enumerate() {
        r.validate(&format!("rules[{i}]"), errs);
    }
}

/// Permissions within one tenant (its namespace).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Role {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Role`.
    #[serde(default)]
    pub kind: String,
    /// Name and tenant.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the role allows.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
}

impl Resource for Role {
    const KIND: &'static str = "Role";
    const PLURAL: &'static str = "roles";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn validate_fields(&self, errs: &mut Errors) {
        validate_rules(&self.rules, errs);
    }
}

/// Permissions bound cluster-wide (a `ClusterRoleBinding`) or within one tenant (a
/// `RoleBinding` naming it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterRole {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `ClusterRole`.
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the role allows.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
}

impl Resource for ClusterRole {
    const KIND: &'static str = "ClusterRole";
    const PLURAL: &'static str = "clusterroles";
    const NAMESPACED: bool = false;
    impl_resource_meta!();

    fn validate_fields(&self, errs: &mut Errors) {
        validate_rules(&self.rules, errs);
    }
}

/// The role a binding grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleRef {
    /// `ClusterRole`, or `Role` (a RoleBinding's only: a Role of the same tenant).
    #[serde(default)]
    pub kind: String,
    /// The role's name.
    #[serde(default)]
    pub name: String,
}

/// Who a subject is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SubjectKind {
    /// A person, by the user name their credentials carry.
    #[default]
    User,
    /// Everyone whose credentials list this group (`system:authenticated`: everyone).
    Group,
    /// An automation account: a caller authenticated with a `lattice admin token`
    /// issued for this user name.
    ServiceAccount,
}

/// One subject of a binding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    #[serde(default)]
    pub kind: SubjectKind,
    /// The user, group or account name.
    #[serde(default)]
    pub name: String,
}

fn validate_binding(role_ref: &RoleRef, subjects: &[Subject], cluster: bool, errs: &mut Errors) {
    match role_ref.kind.as_str() {
        "ClusterRole" => {}
        "Role" if !cluster => {}
        "Role" => errs.push(
            "roleRef.kind",
            "a ClusterRoleBinding grants a ClusterRole only (a Role lives in one tenant); \
             use a RoleBinding in that tenant",
        ),
        other => errs.push(
            "roleRef.kind",
            format!(
                "must be ClusterRole{}, got {:?}",
                if cluster { "" } else { " or Role" },
                crate::validation::truncate(other, 60)
            ),
        ),
    }
    if role_ref.name.is_empty() {
        errs.push("roleRef.name", "must name the role to grant");
    } else {
        errs.extend(crate::validation::validate_dns1123_name(
            "roleRef.name",
            &role_ref.name,
        ));
    }
    if subjects.is_empty() {
        errs.push(
            "subjects",
            "must name at least one subject ({kind: User|Group|ServiceAccount, name: ...})",
        );
    }
    if subjects.len() > 1024 {
        errs.push(
            "subjects",
            "has more than 1024 subjects; bind a group instead",
        );
    }
    for (i, s) in subjects.iter().enumerate() {
        if s.name.is_empty() {
            errs.push(format!("subjects[{i}].name"), "must not be empty");
        }
        check_len(errs, format_args!("subjects[{i}].name"), &s.name, 253);
    }
}

/// Grants a role to subjects within the binding's tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleBinding {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `RoleBinding`.
    #[serde(default)]
    pub kind: String,
    /// Name and tenant.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The role granted.
    #[serde(default)]
    pub role_ref: RoleRef,
    /// To whom.
    #[serde(default)]
    pub subjects: Vec<Subject>,
}

impl Resource for RoleBinding {
    const KIND: &'static str = "RoleBinding";
    const PLURAL: &'static str = "rolebindings";
    const NAMESPACED: bool = true;
    impl_resource_meta!();

    fn validate_fields(&self, errs: &mut Errors) {
        validate_binding(&self.role_ref, &self.subjects, false, errs);
    }
}

/// Grants a ClusterRole to subjects in every tenant and on cluster-scoped resources.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterRoleBinding {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `ClusterRoleBinding`.
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The ClusterRole granted.
    #[serde(default)]
    pub role_ref: RoleRef,
    /// To whom.
    #[serde(default)]
    pub subjects: Vec<Subject>,
}

impl Resource for ClusterRoleBinding {
    const KIND: &'static str = "ClusterRoleBinding";
    const PLURAL: &'static str = "clusterrolebindings";
    const NAMESPACED: bool = false;
    impl_resource_meta!();

    fn validate_fields(&self, errs: &mut Errors) {
        validate_binding(&self.role_ref, &self.subjects, true, errs);
    }
}

/// The built-in roles (the product documentation's SystemAdmin, TenantAdmin, Operator,
/// User, ReadOnly, ClaimingUser) and what everyone authenticated may read.
pub mod builtin {
    /// Every operation (status stays the system's).
    pub const SYSTEM_ADMIN: &str = "system-admin";
    /// Everything inside a tenant, roles and bindings included (escalation-checked).
    pub const TENANT_ADMIN: &str = "tenant-admin";
    /// Drains, undrains, disables and enables nodes; reads the workload.
    pub const OPERATOR: &str = "operator";
    /// Submits and manages work in a tenant.
    pub const USER: &str = "user";
    /// Reads only.
    pub const READONLY: &str = "readonly";
    /// A user who may also submit sensitive work (which claims nodes).
    pub const CLAIMING_USER: &str = "claiming-user";
    /// Read what every authenticated caller may: nodes and the cluster settings.
    pub const BASIC: &str = "basic-reader";
    /// The group every authenticated person or account is in.
    pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
    /// The ClusterRoleBinding of [`BASIC`] to [`AUTHENTICATED_GROUP`].
    pub const BASIC_BINDING: &str = "basic-reader";
    /// Label on the built-in roles and bindings.
    pub const LABEL: &str = "lattice.dev/builtin";

    /// Names of the built-in ClusterRoles: reserved, changed by nobody but the system.
    pub const CLUSTER_ROLES: &[&str] = &[
        SYSTEM_ADMIN,
        TENANT_ADMIN,
        OPERATOR,
        USER,
        READONLY,
        CLAIMING_USER,
        BASIC,
    ];
}

/// Tenant work a user manages (`user`, `tenant-admin`, `readonly` read it).
const TENANT_WORK: &[&str] = &[
    "allocations",
    "allocations/*",
    "dags",
    "dags/*",
    "vclusters",
    "vclusters/*",
    "networkdomains",
    "networkdomains/*",
    "leases",
    "events",
];

/// The built-in ClusterRoles, as the API server keeps them in the store.
pub fn builtin_cluster_roles() -> Vec<ClusterRole> {
    use builtin::*;
    let read = &["get", "list", "watch"];
    let rbac_reads = PolicyRule::new(read, &["roles", "rolebindings"]);
    let own_tenant = PolicyRule::new(&["get"], &["tenants"]);
    // Every verb but `claim` (sensitive work) and `impersonate`: a `*` would hold them.
    let work = &[
        "get", "list", "watch", "create", "update", "patch", "delete", "connect",
    ];
    let user_rules = vec![
        PolicyRule::new(work, TENANT_WORK),
        own_tenant.clone(),
        rbac_reads.clone(),
    ];
    let mut claiming = user_rules.clone();
    claiming.push(PolicyRule::new(&["claim"], &["allocations"]));
    let mut tenant_admin = user_rules.clone();
    tenant_admin.push(PolicyRule::new(&["claim"], &["allocations"]));
    tenant_admin.push(PolicyRule::new(&["*"], &["roles", "rolebindings"]));
    tenant_admin.push(PolicyRule::new(&["list"], &["auditrecords"]));
    let mut readonly = vec![PolicyRule::new(read, TENANT_WORK), own_tenant];
    readonly.push(rbac_reads);
    let workload = &[
        "allocations",
        "dags",
        "vclusters",
        "networkdomains",
        "events",
        "tenants",
        "nodes",
    ];
    let roles = [
        (
            SYSTEM_ADMIN,
            "Every operation on every resource (status stays the system's).",
            vec![PolicyRule::new(&["*"], &["*"])],
        ),
        (
            TENANT_ADMIN,
            "Everything in a tenant: any user's work, sensitive work, Roles and RoleBindings \
             (never more than the binder holds).",
            tenant_admin,
        ),
        (
            OPERATOR,
            "Drain, undrain, disable and enable nodes; read the workload.",
            vec![
                PolicyRule::new(read, workload),
                PolicyRule::new(&["update", "patch"], &["nodes"]),
                PolicyRule::new(&["get"], &["clusterconfig"]),
            ],
        ),
        (
            USER,
            "Submit, change and cancel work in a tenant; read its output; attach to it.",
            user_rules,
        ),
        (READONLY, "Read a tenant's work; change nothing.", readonly),
        (
            CLAIMING_USER,
            "A user who may also submit sensitive work, which claims nodes for itself.",
            claiming,
        ),
        (
            BASIC,
            "What every authenticated caller reads: nodes and the cluster settings.",
            vec![
                PolicyRule::new(read, &["nodes"]),
                PolicyRule::new(&["get"], &["clusterconfig"]),
            ],
        ),
    ];
    roles
        .into_iter()
        .map(|(name, about, rules)| {
            let mut r = ClusterRole {
                rules,
                ..Default::default()
            };
            r.metadata.name = Some(name.to_string());
            r.metadata
                .labels
                .insert(LABEL.to_string(), "true".to_string());
            r.metadata
                .annotations
                .insert("lattice.dev/description".to_string(), about.to_string());
            r.fill_type_meta();
            r
        })
        .collect()
}

/// The built-in ClusterRoleBinding of [`builtin::BASIC`] to every authenticated caller.
pub fn builtin_cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    let mut b = ClusterRoleBinding {
        role_ref: RoleRef {
            kind: "ClusterRole".into(),
            name: builtin::BASIC.into(),
        },
        subjects: vec![Subject {
            kind: SubjectKind::Group,
            name: builtin::AUTHENTICATED_GROUP.into(),
        }],
        ..Default::default()
    };
    b.metadata.name = Some(builtin::BASIC_BINDING.into());
    b.metadata
        .labels
        .insert(builtin::LABEL.to_string(), "true".to_string());
    b.fill_type_meta();
    vec![b]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_like_kubernetes() {
        let r = PolicyRule::new(&["get", "list"], &["allocations", "dags/log"]);
        assert!(r.allows("get", "allocations", None, Some("a")));
        assert!(r.allows("list", "allocations", None, None));
        assert!(!r.allows("delete", "allocations", None, Some("a")));
        assert!(!r.allows("get", "allocations", Some("log"), Some("a")));
        assert!(r.allows("get", "dags", Some("log"), Some("a")));
        assert!(!r.allows("get", "dags", None, Some("a")));
        let all_subs = PolicyRule::new(&["*"], &["allocations/*"]);
        assert!(all_subs.allows("connect", "allocations", Some("attach"), Some("a")));
        assert!(!all_subs.allows("connect", "allocations", None, Some("a")));
        let named = PolicyRule {
            resource_names: vec!["a".into()],
            ..PolicyRule::new(&["*"], &["*"])
        };
        assert!(named.allows("get", "nodes", None, Some("a")));
        assert!(!named.allows("get", "nodes", None, Some("b")));
        assert!(
            !named.allows("list", "nodes", None, None),
            "names never list"
        );
    }

    #[test]
    fn unknown_verbs_and_resources_are_refused_by_name() {
        let mut role = Role {
            rules: vec![PolicyRule::new(
                &["get", "eat"],
                &["allocation", "dags/logs"],
            )],
            ..Default::default()
        };
        role.metadata.name = Some("r".into());
        role.metadata.namespace = Some("t1".into());
        role.fill_type_meta();
        let e = role.validate().unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("rules[0].verbs[1]: unknown verb \"eat\""),
            "{text}"
        );
        assert!(
            text.contains("rules[0].resources[0]: unknown resource \"allocation\""),
            "{text}"
        );
        assert!(text.contains("unknown subresource \"logs\""), "{text}");
    }

    #[test]
    fn builtins_are_valid() {
        for r in builtin_cluster_roles() {
            r.validate()
                .unwrap_or_else(|e| panic!("{:?}: {e}", r.metadata.name));
        }
        for b in builtin_cluster_role_bindings() {
            b.validate().unwrap();
        }
        assert_eq!(builtin_cluster_roles().len(), builtin::CLUSTER_ROLES.len());
    }
}
