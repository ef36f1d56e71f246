//! Role bindings: which roles a caller holds, and where ([`Grant`]); whether they allow a
//! request ([`allows`]); and the escalation check ([`covers`]) that keeps anyone from
//! granting more than they hold.
//!
//! A caller's grants come from three places:
//!
//! * its credentials: the role of an HS256 token or an administrator's certificate
//!   (`admin` → `system-admin` cluster-wide, `user` / `readonly` → that role in each of
//!   the token's tenants), an API token's role ([`implicit_grants`]);
//! * the store: RoleBindings (their role within their tenant), ClusterRoleBindings
//!   (everywhere) naming the caller, one of its groups or its service account, and the
//!   Tenants listing it in `spec.admins` (`tenant-admin` there), kept in memory by
//!   [`Rbac`] from watches of the store;
//! * every authenticated caller: `basic-reader` (nodes, the cluster settings).
//!
//! The built-in ClusterRoles ([`lattice_apis::kinds::rbac::builtin_cluster_roles`]) are
//! evaluated from the code, never from the store, whose copies are for reading: admission
//! lets nobody but the system change them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lattice_apis::kinds::rbac::{builtin, builtin_cluster_roles, PolicyRule, SubjectKind};
use lattice_store::KvBackend;
use serde_json::Value;

use crate::registry::authz::{Attributes, Verb};
use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::follow::Follower;
use crate::registry::identity::{Role, UserInfo};
use crate::registry::objects::name_of;
use crate::registry::resources::Resources;
use lattice_apis::KindInfo;

/// A role held in one tenant (`tenant: Some`) or everywhere (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The role's name (`ClusterRole` or, for a RoleBinding to a Role, the Role's).
    pub role: String,
    /// Where it applies.
    pub tenant: Option<String>,
    /// What it allows.
    pub rules: Arc<Vec<PolicyRule>>,
    /// The role is a built-in ClusterRole (its name means what the product says it means;
    /// a tenant's Role may have any name).
    pub builtin: bool,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tenant {
            Some(t) => write!(f, "{} in tenant {t}", self.role),
            None => write!(f, "{} cluster-wide", self.role),
        }
    }
}

fn builtins() -> &'static HashMap<String, Arc<Vec<PolicyRule>>> {
    static B: OnceLock<HashMap<String, Arc<Vec<PolicyRule>>>> = OnceLock::new();
    B.get_or_init(|| {
        builtin_cluster_roles()
            .into_iter()
            .map(|r| (r.metadata.name.unwrap_or_default(), Arc::new(r.rules)))
            .collect()
    })
}

/// A built-in ClusterRole held in `tenant` (or everywhere).
pub fn builtin_grant(role: &str, tenant: Option<&str>) -> Option<Grant> {
    builtins().get(role).map(|rules| Grant {
        role: role.to_string(),
        tenant: tenant.map(str::to_string),
        rules: rules.clone(),
        builtin: true,
    })
}

/// Whether `name` is a built-in ClusterRole.
pub fn is_builtin_role(name: &str) -> bool {
    builtins().contains_key(name)
}

/// What a person's credentials grant by themselves: every authenticated caller's
/// `basic-reader`, and the role its token or certificate carries.
pub fn implicit_grants(user: &UserInfo) -> Vec<Grant> {
    let mut out: Vec<Grant> = builtin_grant(builtin::BASIC, None).into_iter().collect();
    if user.service_account {
        // An API token's role is in its grants already.
        return out;
    }
    let role = match user.role {
        Role::Admin => builtin::SYSTEM_ADMIN,
        Role::User => builtin::USER,
        Role::Readonly => builtin::READONLY,
        Role::System | Role::Node => return out,
    };
    match (&user.tenants, user.role) {
        (_, Role::Admin) | (None, _) => out.extend(builtin_grant(role, None)),
        (Some(ts), _) if ts.iter().any(|t| t == "*") => out.extend(builtin_grant(role, None)),
        (Some(ts), _) => out.extend(ts.iter().filter_map(|t| builtin_grant(role, Some(t)))),
    }
    out
}

/// Every grant of a person: its credentials' and its bindings'.
pub fn all_grants(user: &UserInfo) -> impl Iterator<Item = Grant> + '_ {
    let implicit = if user.grants_resolved {
        Vec::new()
    } else {
        implicit_grants(user)
    };
    implicit.into_iter().chain(user.grants.iter().cloned())
}

/// The verb as rules name it.
pub fn rule_verb(v: Verb) -> &'static str {
    match v {
        Verb::Get => "get",
        Verb::List => "list",
        Verb::Watch => "watch",
        Verb::Create => "create",
        Verb::Update => "update",
        Verb::Patch => "patch",
        Verb::Delete => "delete",
        Verb::Connect => "connect",
        Verb::Claim => "claim",
        Verb::Impersonate => "impersonate",
    }
}

/// Whether the grant reaches the request: a cluster-wide one reaches everything; one in
/// tenant T the tenant's objects, and reading the Tenant T itself.
fn reaches(g: &Grant, a: &Attributes) -> bool {
    match &g.tenant {
        None => true,
        Some(t) => {
            (a.namespaced && a.namespace == Some(t.as_str()))
                || (a.resource == "tenants" && a.verb == Verb::Get && a.name == Some(t.as_str()))
        }
    }
}

/// Whether one of `grants` allows `a`.
pub fn grants_allow<'g>(mut grants: impl Iterator<Item = &'g Grant>, a: &Attributes) -> bool {
    let verb = rule_verb(a.verb);
    grants.any(|g| {
        reaches(g, a)
            && g.rules
                .iter()
                .any(|r| r.allows(verb, a.resource, a.subresource, a.name))
    })
}

/// Whether the person `user` holds a role that allows `a`.
pub fn allows(user: &UserInfo, a: &Attributes) -> bool {
    if user.grants_resolved {
        return grants_allow(user.grants.iter(), a);
    }
    let implicit = implicit_grants(user);
    grants_allow(implicit.iter().chain(user.grants.iter()), a)
}

/// Whether `user` holds the built-in role `role` in `tenant` (or cluster-wide).
pub fn holds(user: &UserInfo, role: &str, tenant: &str) -> bool {
    all_grants(user)
        .any(|g| g.builtin && g.role == role && g.tenant.as_deref().is_none_or(|t| t == tenant))
}

/// Whether one rule `o` that is held covers the single permission `verb` × `resource` ×
/// `name` (as Kubernetes decides it: a `*` asked for is covered only by a `*` held).
fn covers_one(o: &PolicyRule, verb: &str, resource: &str, name: Option<&str>) -> bool {
    let verb_ok = o.verbs.iter().any(|v| v == "*" || v == verb);
    let resource_ok = o.resources.iter().any(|h| {
        h == "*"
            || h == resource
            || match (h.split_once('/'), resource.split_once('/')) {
                (Some((hr, "*")), Some((rr, _))) => hr == rr,
                _ => false,
            }
    });
    let name_ok = o.resource_names.is_empty()
        || name.is_some_and(|n| o.resource_names.iter().any(|x| x == n));
    verb_ok && resource_ok && name_ok
}

/// The escalation check: whether the grants `held` (a caller's) cover every permission
/// of `rules` where they would apply, `tenant` (`None`: cluster-wide). `Err` names the
/// first permission not held.
pub fn covers(held: &[Grant], tenant: Option<&str>, rules: &[PolicyRule]) -> Result<(), String> {
    let usable: Vec<&PolicyRule> = held
        .iter()
        .filter(|g| g.tenant.is_none() || g.tenant.as_deref() == tenant && tenant.is_some())
        .flat_map(|g| g.rules.iter())
        .collect();
    for r in rules {
        let names: Vec<Option<&str>> = if r.resource_names.is_empty() {
            vec![None]
        } else {
            r.resource_names.iter().map(|n| Some(n.as_str())).collect()
        };
        for verb in &r.verbs {
            for resource in &r.resources {
                for name in &names {
                    if !usable.iter().any(|o| covers_one(o, verb, resource, *name)) {
                        let on = match name {
                            Some(n) => format!("{resource} {n:?}"),
                            None => resource.clone(),
                        };
                        let scope = match tenant {
                            Some(t) => format!("in tenant {t:?}"),
                            None => "cluster-wide".to_string(),
                        };
                        return Err(format!("{verb} on {on} {scope}"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The rules of the role a binding names, as the store and the built-ins have them
/// (`None`: no such role).
fn role_rules(
    index_roles: &HashMap<(String, String), Arc<Vec<PolicyRule>>>,
    cluster_roles: &HashMap<String, Arc<Vec<PolicyRule>>>,
    binding_tenant: Option<&str>,
    role_ref: &Value,
) -> Option<(String, Arc<Vec<PolicyRule>>, bool)> {
    let kind = role_ref.get("kind").and_then(Value::as_str)?;
    let name = role_ref.get("name").and_then(Value::as_str)?.to_string();
    let (rules, builtin) = match (kind, binding_tenant) {
        ("ClusterRole", _) => match builtins().get(&name) {
            Some(r) => (r.clone(), true),
            None => (cluster_roles.get(&name).cloned()?, false),
        },
        ("Role", Some(t)) => (
            index_roles.get(&(t.to_string(), name.clone())).cloned()?,
            false,
        ),
        _ => return None,
    };
    Some((name, rules, builtin))
}

fn rules_of(v: &Value) -> Arc<Vec<PolicyRule>> {
    Arc::new(
        v.get("rules")
            .cloned()
            .and_then(|r| serde_json::from_value(r).ok())
            .unwrap_or_default(),
    )
}

type SubjectKey = (SubjectKind, String);

/// The bindings by subject.
#[derive(Default)]
struct Index {
    by_subject: HashMap<SubjectKey, Vec<Grant>>,
    /// Bindings whose role does not exist (yet): counted for the metrics and logs.
    dangling: usize,
}

/// The role bindings of the store, in memory (one per API server).
pub struct Rbac {
    roles: Follower,
    cluster_roles: Follower,
    bindings: Follower,
    cluster_bindings: Follower,
    tenants: Follower,
    index: Mutex<Option<([u64; 5], Arc<Index>)>>,
}

impl Default for Rbac {
    fn default() -> Self {
        let prefix = |plural: &str| {
            lattice_apis::kinds()
                .iter()
                .find(|k| k.plural == plural)
                .map(|k| k.key_prefix())
                .unwrap_or_else(|| format!("/registry/lattice.dev/{plural}/"))
        };
        Self {
            roles: Follower::new(prefix("roles")),
            cluster_roles: Follower::new(prefix("clusterroles")),
            bindings: Follower::new(prefix("rolebindings")),
            cluster_bindings: Follower::new(prefix("clusterrolebindings")),
            tenants: Follower::new(prefix("tenants")),
            index: Mutex::new(None),
        }
    }
}

/// How long a request waits for the bindings to be loaded before it is refused (503).
const LOAD_WAIT: Duration = Duration::from_secs(10);

impl Rbac {
    fn followers(&self) -> [&Follower; 5] {
        [
            &self.roles,
            &self.cluster_roles,
            &self.bindings,
            &self.cluster_bindings,
            &self.tenants,
        ]
    }

    /// Starts following the store (once) and waits until the bindings are loaded: a
    /// request is never authorized on a partial view (503 after [`LOAD_WAIT`]).
    pub async fn ready(&self, backend: &Arc<dyn KvBackend>) -> ApiResult<()> {
        for f in self.followers() {
            f.start(backend);
        }
        for f in self.followers() {
            if !f.synced() && !f.wait_synced(LOAD_WAIT).await {
                return Err(ApiError::unavailable(
                    "this API server has not loaded the role bindings from the store yet; \
                     try again in a moment",
                ));
            }
        }
        Ok(())
    }

    fn index(&self) -> Arc<Index> {
        let gens = self.followers().map(Follower::generation);
        let mut cached = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, idx)) = cached.as_ref() {
            if *g == gens {
                return idx.clone();
            }
        }
        let idx = Arc::new(self.build());
        *cached = Some((gens, idx.clone()));
        idx
    }

    fn build(&self) -> Index {
        let objects = |f: &Follower| -> Vec<Value> {
            f.read(|e| {
                e.values()
                    .filter_map(|v| serde_json::from_slice::<Value>(v).ok())
                    .collect()
            })
        };
        let ns_name = |v: &Value| {
            (
                v.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                v.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            )
        };
        let roles: HashMap<(String, String), Arc<Vec<PolicyRule>>> = objects(&self.roles)
            .iter()
            .map(|v| (ns_name(v), rules_of(v)))
            .collect();
        let cluster_roles: HashMap<String, Arc<Vec<PolicyRule>>> = objects(&self.cluster_roles)
            .iter()
            .map(|v| (ns_name(v).1, rules_of(v)))
            .collect();
        let mut idx = Index::default();
        let mut bind = |v: &Value, tenant: Option<String>| {
            let Some(role_ref) = v.get("roleRef") else {
                return;
            };
            let Some((role, rules, builtin)) =
                role_rules(&roles, &cluster_roles, tenant.as_deref(), role_ref)
            else {
                idx.dangling += 1;
                return;
            };
            let subjects: Vec<lattice_apis::Subject> = v
                .get("subjects")
                .cloned()
                .and_then(|s| serde_json::from_value(s).ok())
                .unwrap_or_default();
            for s in subjects {
                idx.by_subject
                    .entry((s.kind, s.name))
                    .or_default()
                    .push(Grant {
                        role: role.clone(),
                        tenant: tenant.clone(),
                        rules: rules.clone(),
                        builtin,
                    });
            }
        };
        for v in objects(&self.cluster_bindings) {
            bind(&v, None);
        }
        for v in objects(&self.bindings) {
            let t = ns_name(&v).0;
            bind(&v, Some(t));
        }
        for v in objects(&self.tenants) {
            let t = ns_name(&v).1;
            let admins = v
                .pointer("/spec/admins")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for a in admins.iter().filter_map(Value::as_str) {
                if let Some(g) = builtin_grant(builtin::TENANT_ADMIN, Some(&t)) {
                    idx.by_subject
                        .entry((SubjectKind::User, a.to_string()))
                        .or_default()
                        .push(g);
                }
            }
        }
        if idx.dangling > 0 {
            tracing::debug!(
                bindings = idx.dangling,
                "role bindings name roles that do not exist; they grant nothing"
            );
        }
        idx
    }

    /// The grants of the bindings naming user `name`, its `groups` (every caller is in
    /// `system:authenticated`) or, for an API token's caller, its service account.
    pub fn bound(&self, name: &str, groups: &[String], service_account: bool) -> Vec<Grant> {
        let idx = self.index();
        let mut keys: Vec<SubjectKey> = vec![
            (SubjectKind::User, name.to_string()),
            (SubjectKind::Group, builtin::AUTHENTICATED_GROUP.to_string()),
        ];
        keys.extend(groups.iter().map(|g| (SubjectKind::Group, g.clone())));
        if service_account {
            keys.push((SubjectKind::ServiceAccount, name.to_string()));
        }
        let mut out: Vec<Grant> = Vec::new();
        for k in keys {
            for g in idx.by_subject.get(&k).into_iter().flatten() {
                if !out.contains(g) {
                    out.push(g.clone());
                }
            }
        }
        out
    }

    /// Adds to a person what its bindings grant, and what follows for the rest of the
    /// server: `system-admin` cluster-wide makes it an admin; a role in a tenant makes it
    /// a member of that tenant (any cluster-wide role: of every tenant). System
    /// identities and nodes are left as they are.
    pub fn resolve(&self, user: &mut UserInfo) {
        if user.is_system() || user.role == Role::Node || user.grants_resolved {
            return;
        }
        // A job's token acts for its job: `user` in the job's tenant, whatever else its
        // user is granted (a node or the job's processes hold it).
        if user.bound_to.is_some() {
            return;
        }
        // What the credentials grant, from their own role and tenants, before those are
        // widened by what the bindings grant.
        let mut grants = implicit_grants(user);
        grants.extend(user.grants.iter().cloned());
        for g in self.bound(&user.name, &user.groups, user.service_account) {
            if !grants.contains(&g) {
                grants.push(g);
            }
        }
        apply_grants(user, grants);
    }
}

/// Records `grants` on `user` and derives its role and tenants from them (see
/// [`Rbac::resolve`]).
pub fn apply_grants(user: &mut UserInfo, grants: Vec<Grant>) {
    // Every tenant's member: a role held cluster-wide that reads every tenant's work (a
    // narrower cluster-wide role, say one to drain nodes, makes nobody a member).
    let reads_work = |g: &Grant| {
        g.rules
            .iter()
            .any(|r| r.allows("list", "allocations", None, None))
    };
    if grants
        .iter()
        .any(|g| g.builtin && g.role == builtin::SYSTEM_ADMIN && g.tenant.is_none())
    {
        user.role = Role::Admin;
        user.tenants = None;
    } else if grants.iter().any(|g| g.tenant.is_none() && reads_work(g)) {
        user.tenants = None;
    } else if let Some(ts) = &mut user.tenants {
        for g in &grants {
            if let Some(t) = &g.tenant {
                if !ts.contains(t) {
                    ts.push(t.clone());
                }
            }
        }
    }
    user.grants = Arc::new(grants);
    user.grants_resolved = true;
}

fn is_rbac_kind(kind: &KindInfo) -> bool {
    matches!(
        kind.kind,
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
    )
}

/// Whether `obj` of `kind` is a built-in role or binding, which nobody but the system
/// changes or deletes.
fn is_builtin_object(kind: &KindInfo, obj: &Value) -> bool {
    let name = name_of(obj);
    match kind.kind {
        "ClusterRole" => builtin::CLUSTER_ROLES.contains(&name),
        "ClusterRoleBinding" => name == builtin::BASIC_BINDING,
        _ => false,
    }
}

fn forbidden(kind: &KindInfo, obj: &Value, field: &str, why: String) -> ApiError {
    let name = name_of(obj);
    ApiError::forbidden(format!(
        "{}.lattice.dev {name:?} is forbidden: {why}",
        kind.plural
    ))
    .with_details(serde_json::json!({
        "name": name,
        "group": "lattice.dev",
        "kind": kind.plural,
        "causes": [{"reason": "FieldValueForbidden", "field": field, "message": why}],
    }))
}

const BUILTIN: &str = "it is built in: the API server keeps it as the product defines it; \
     copy it under another name to change it";

/// A person's write of a role or binding: never a built-in one, and never granting more
/// than the writer holds where it applies (the escalation check). A binding to a role
/// that does not exist is refused unless the writer holds everything there.
pub async fn admit_write(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    new: &Value,
) -> ApiResult<()> {
    if !is_rbac_kind(kind) || caller.is_system() {
        return Ok(());
    }
    if is_builtin_object(kind, new) {
        return Err(forbidden(kind, new, "metadata.name", BUILTIN.into()));
    }
    let tenant = new.pointer("/metadata/namespace").and_then(Value::as_str);
    let tenant = if kind.namespaced { tenant } else { None };
    let held: Vec<Grant> = all_grants(caller).collect();
    let (field, what, rules) = match kind.kind {
        "Role" | "ClusterRole" => ("rules", "these rules".to_string(), rules_of(new)),
        _ => {
            let role_ref = new.get("roleRef").cloned().unwrap_or(Value::Null);
            let name = role_ref
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let rk = role_ref
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let rules = match (rk, builtins().get(name)) {
                ("ClusterRole", Some(r)) => Some(r.clone()),
                _ => {
                    let k = crate::registry::objects::kind_by_plural(if rk == "Role" {
                        "roles"
                    } else {
                        "clusterroles"
                    })
                    .ok_or_else(|| ApiError::internal("roles not registered"))?;
                    let ns = if rk == "Role" { tenant } else { None };
                    match res.trusted().get(k, ns, name).await {
                        Ok(v) => Some(rules_of(&v)),
                        Err(e) if e.code == 404 => None,
                        Err(e) => return Err(e),
                    }
                }
            };
            let rules = match rules {
                Some(r) => r,
                None => {
                    // Nothing to check it against: only someone holding everything here
                    // binds a role before it exists (GitOps applying in any order).
                    let all = [PolicyRule::new(&["*"], &["*"])];
                    if covers(&held, tenant, &all).is_ok() {
                        return Ok(());
                    }
                    return Err(ApiError::invalid(
                        kind.kind,
                        name_of(new),
                        vec![(
                            "roleRef.name".into(),
                            format!(
                                "there is no {rk} {name:?}{}; create the role first",
                                tenant
                                    .map(|t| format!(" in tenant {t:?}"))
                                    .unwrap_or_default()
                            ),
                        )],
                    ));
                }
            };
            ("roleRef", format!("{rk} {name:?}"), rules)
        }
    };
    covers(&held, tenant, &rules).map_err(|missing| {
        forbidden(
            kind,
            new,
            field,
            format!(
                "user {:?} cannot grant {what}: it does not hold {missing} itself (a role is \
                 granted only by someone who holds all of it where it applies)",
                caller.name
            ),
        )
    })
}

/// A person's delete of a role or binding: never a built-in one.
pub fn admit_delete(caller: &UserInfo, kind: &'static KindInfo, old: &Value) -> ApiResult<()> {
    if caller.is_system() || !is_builtin_object(kind, old) {
        return Ok(());
    }
    Err(forbidden(kind, old, "metadata.name", BUILTIN.into()))
}

/// Writes the built-in ClusterRoles and ClusterRoleBindings into the store as the code
/// defines them (created when missing, put back when changed), for `lattice get
/// clusterroles` and GitOps tools to read. Idempotent; API servers racing do no harm.
pub async fn seed_builtins(res: &Resources) -> ApiResult<()> {
    let roles = lattice_apis::kinds::rbac::builtin_cluster_roles()
        .into_iter()
        .map(|r| ("clusterroles", serde_json::to_value(r)));
    let bindings = lattice_apis::kinds::rbac::builtin_cluster_role_bindings()
        .into_iter()
        .map(|b| ("clusterrolebindings", serde_json::to_value(b)));
    let res = res.trusted();
    for (plural, v) in roles.chain(bindings) {
        let want = v.map_err(|e| ApiError::internal(e.to_string()))?;
        let k = crate::registry::objects::kind_by_plural(plural)
            .ok_or_else(|| ApiError::internal("rbac kinds not registered"))?;
        let name = name_of(&want).to_string();
        let opts = crate::registry::resources::WriteOptions::default();
        match res.get(k, None, &name).await {
            Ok(have) => {
                let same = |f: &str| have.get(f) == want.get(f);
                if same("rules") && same("roleRef") && same("subjects") {
                    continue;
                }
                let mut next = want.clone();
                next["metadata"]["resourceVersion"] = have
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                match res.replace(k, None, &name, next, None, &opts).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.code == 404 => match res.create(k, None, want, &opts, false).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(role: &str, tenant: Option<&str>) -> Grant {
        builtin_grant(role, tenant).unwrap()
    }

    #[test]
    fn a_tenant_admin_grants_what_it_holds_in_its_tenant_only() {
        let ta = vec![
            held(builtin::TENANT_ADMIN, Some("t1")),
            held(builtin::BASIC, None),
        ];
        let user_rules = builtins()[builtin::USER].as_slice();
        covers(&ta, Some("t1"), user_rules).unwrap();
        covers(&ta, Some("t1"), &builtins()[builtin::CLAIMING_USER]).unwrap();
        // Not in another tenant, not cluster-wide.
        assert!(covers(&ta, Some("t2"), user_rules).is_err());
        assert!(covers(&ta, None, user_rules).is_err());
        // Not more than it holds: nodes, the admin role, a wildcard.
        let e = covers(&ta, Some("t1"), &builtins()[builtin::SYSTEM_ADMIN]).unwrap_err();
        assert!(e.contains("* on * in tenant \"t1\""), "{e}");
        let nodes = [PolicyRule::new(&["patch"], &["nodes"])];
        assert!(covers(&ta, Some("t1"), &nodes).is_err());
        let listed = [PolicyRule::new(
            &["create", "delete", "claim"],
            &["allocations"],
        )];
        covers(&ta, Some("t1"), &listed).unwrap();
        // A `*` asked for is covered only by a `*` held (it would hold future verbs too).
        let wild = [PolicyRule::new(&["*"], &["allocations"])];
        assert!(covers(&ta, Some("t1"), &wild).is_err());
        let everything = [PolicyRule::new(&["get"], &["*"])];
        assert!(covers(&ta, Some("t1"), &everything).is_err());
        // A system admin covers everything everywhere.
        let sa = vec![held(builtin::SYSTEM_ADMIN, None)];
        covers(&sa, None, &builtins()[builtin::SYSTEM_ADMIN]).unwrap();
    }

    #[test]
    fn named_rules_are_covered_by_names_or_by_all() {
        let named = |names: &[&str]| PolicyRule {
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            ..PolicyRule::new(&["get"], &["dags"])
        };
        let holds_a = vec![Grant {
            role: "r".into(),
            tenant: Some("t1".into()),
            rules: Arc::new(vec![named(&["a"])]),
            builtin: false,
        }];
        covers(&holds_a, Some("t1"), &[named(&["a"])]).unwrap();
        assert!(covers(&holds_a, Some("t1"), &[named(&["a", "b"])]).is_err());
        assert!(covers(
            &holds_a,
            Some("t1"),
            &[PolicyRule::new(&["get"], &["dags"])]
        )
        .is_err());
    }

    #[test]
    fn a_tenants_role_named_like_a_builtin_one_is_not_it() {
        let mut u = UserInfo {
            name: "eve".into(),
            tenants: Some(vec![]),
            role: Role::Readonly,
            ..Default::default()
        };
        let fake = |role: &str, tenant: Option<&str>| Grant {
            role: role.into(),
            tenant: tenant.map(str::to_string),
            rules: Arc::new(vec![PolicyRule::new(&["get"], &["dags"])]),
            builtin: false,
        };
        apply_grants(
            &mut u,
            vec![
                fake(builtin::TENANT_ADMIN, Some("t1")),
                fake(builtin::SYSTEM_ADMIN, None),
            ],
        );
        assert!(!holds(&u, builtin::TENANT_ADMIN, "t1"));
        assert_eq!(u.role, Role::Readonly);
        // A narrow role held cluster-wide makes nobody a member of every tenant.
        assert_eq!(u.tenants, Some(vec!["t1".to_string()]));
        apply_grants(&mut u, vec![held(builtin::TENANT_ADMIN, Some("t1"))]);
        assert!(holds(&u, builtin::TENANT_ADMIN, "t1"));
    }

    #[test]
    fn bindings_make_members_and_admins() {
        let mut u = UserInfo {
            name: "bob".into(),
            tenants: Some(vec![]),
            role: Role::Readonly,
            ..Default::default()
        };
        apply_grants(&mut u, vec![held(builtin::USER, Some("t2"))]);
        assert_eq!(u.tenants, Some(vec!["t2".to_string()]));
        // What it may do is the grants' alone now: not what a readonly token of all
        // tenants would add.
        assert!(u.grants_resolved);
        apply_grants(&mut u, vec![held(builtin::SYSTEM_ADMIN, None)]);
        assert_eq!((u.role, u.tenants.clone()), (Role::Admin, None));
    }
}
