//! The one authorizer. Every route asks [`authorize`] whether its caller may do what the
//! request asks, described as [`Attributes`] (verb, resource, subresource, tenant, name,
//! field selector) before it reads a body; the verbs over the store then ask the
//! object-level questions that need the stored object ([`node_may_see`],
//! [`crate::registry::admission`]).
//!
//! Who may do what (a person's role comes from their credentials; see `docs/security.md`):
//!
//! | caller | may |
//! |---|---|
//! | anonymous (a server without authentication: tests, `--dev` without tokens) | everything |
//! | `system:controllers` ([`Role::System`]) | everything, status included |
//! | `system:node:<n>` ([`Role::Node`], from a `node:<n>` client certificate only) | its own Node (create; status, not `owner`), its heartbeat Lease, and the allocations bound to it: list/watch only through `status.assignedNodes=<n>`, get, and its own report on them (the `report` subresource, [`crate::reports`]: the server derives the rest of the status) |
//! | admin | every object's spec and metadata, never status |
//! | user | objects of its tenants (reads and writes), its own Tenant, Nodes and the cluster settings (reads); never status, never anything that takes nodes from others (`homeNodes`), never system-owned annotations |
//! | readonly | reads in its tenants |
//!
//! Status and every field the system owns (assigned nodes, attempts, phases, node
//! ownership) are thus written only by system identities: a person's `/status` write is
//! a 403 that says so.

use lattice_apis::kinds::lease::NODE_LEASE_NAMESPACE;
use lattice_apis::KindInfo;
use serde_json::Value;

use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::identity::{Role, UserInfo};
use crate::registry::rbac;
use crate::registry::selectors::FieldSelector;

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Read one object.
    Get,
    /// Read a collection.
    List,
    /// Watch a collection.
    Watch,
    /// Create.
    Create,
    /// Replace.
    Update,
    /// Patch (merge, JSON, apply).
    Patch,
    /// Delete.
    Delete,
    /// Open a session into a workload (attach) or read its output (logs).
    Connect,
    /// Submit sensitive work, which claims nodes for itself alone.
    Claim,
    /// Ask as another user (`lattice auth can-i --as`).
    Impersonate,
}

impl Verb {
    /// Every verb.
    pub const ALL: [Verb; 10] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::Connect,
        Verb::Claim,
        Verb::Impersonate,
    ];

    /// The verb rules name `word` (`get`, `connect`, ...).
    pub fn from_rule_word(word: &str) -> Option<Verb> {
        Verb::ALL
            .into_iter()
            .find(|v| crate::registry::rbac::rule_verb(*v) == word)
    }

    /// Reads only.
    pub fn is_read(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }

    fn word(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::Connect => "connect to",
            Verb::Claim => "claim nodes with",
            Verb::Impersonate => "impersonate",
        }
    }
}

/// A request as the authorizer sees it.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The verb.
    pub verb: Verb,
    /// The resource (a kind's plural, or one of the [`resource`] names of routes that are
    /// not kinds).
    pub resource: &'a str,
    /// Whether the resource is tenant-scoped.
    pub namespaced: bool,
    /// `status`, `log`, `attach`, `token`, `heartbeat`, ...
    pub subresource: Option<&'a str>,
    /// The tenant (namespace), when the request names one.
    pub namespace: Option<&'a str>,
    /// The object, when the request names one.
    pub name: Option<&'a str>,
    /// The list or watch field selector, when given.
    pub field_selector: Option<&'a FieldSelector>,
}

impl<'a> Attributes<'a> {
    /// `verb` on `kind` in `namespace`.
    pub fn kind(verb: Verb, kind: &'a KindInfo, namespace: Option<&'a str>) -> Self {
        Self {
            verb,
            resource: kind.plural,
            namespaced: kind.namespaced,
            subresource: None,
            namespace,
            name: None,
            field_selector: None,
        }
    }

    /// `verb` on a route that is not a kind (see [`resource`]).
    pub fn other(verb: Verb, resource: &'a str) -> Self {
        Self {
            verb,
            resource,
            namespaced: false,
            subresource: None,
            namespace: None,
            name: None,
            field_selector: None,
        }
    }

    /// ... of the object `name`.
    pub fn named(mut self, name: Option<&'a str>) -> Self {
        self.name = name;
        self
    }

    /// ... its `subresource`.
    pub fn subresource(mut self, subresource: Option<&'a str>) -> Self {
        self.subresource = subresource;
        self
    }

    /// ... with this field selector.
    pub fn fields(mut self, selector: &'a FieldSelector) -> Self {
        self.field_selector = Some(selector);
        self
    }

    /// A write of what the system owns: status, a node's reports and its heartbeats.
    fn is_status_write(&self) -> bool {
        matches!(self.subresource, Some("status" | "heartbeat" | "report")) && !self.verb.is_read()
    }
}

/// Routes that are not kinds, as resources.
pub mod resource {
    /// `/v1/admin/config`: cluster settings.
    pub const CLUSTER_CONFIG: &str = "clusterconfig";
    /// Bootstrap tokens for node identities.
    pub const BOOTSTRAP_TOKENS: &str = "bootstraptokens";
    /// Node certificates: issuing, renewing, revoking.
    pub const NODE_CERTIFICATES: &str = "nodecertificates";
    /// Attach tickets redeemed by node agents.
    pub const ATTACH_TICKETS: &str = "attachtickets";
    /// API tokens (`lattice admin token`).
    pub const API_TOKENS: &str = "apitokens";
    /// Users, as what `impersonate` is asked on.
    pub const USERS: &str = "users";
    /// Groups, as what `impersonate` is asked on.
    pub const GROUPS: &str = "groups";
}

fn deny(user: &UserInfo, a: &Attributes, why: impl std::fmt::Display) -> ApiError {
    let what = match a.subresource {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.to_string(),
    };
    let object = a.name.map(|n| format!(" {n:?}")).unwrap_or_default();
    let scope = a
        .namespace
        .map(|n| format!(" in tenant {n:?}"))
        .unwrap_or_default();
    ApiError::forbidden(format!(
        "{} {:?} cannot {} {what}{object}{scope}: {why}",
        match user.role {
            Role::Node => "node",
            Role::System => "system identity",
            _ => "user",
        },
        user.name,
        a.verb.word(),
    ))
}

const STATUS_IS_SYSTEMS: &str = "status is written only by the controllers and the node \
     agents (it records what the system did); change the spec instead (to stop work: \
     `lattice cancel`)";

/// May `user` do `a`? The object-level rules that need the stored object come after
/// (see the module docs).
pub fn authorize(user: &UserInfo, a: &Attributes) -> ApiResult<()> {
    if user.is_system() {
        return Ok(());
    }
    match user.role {
        Role::System => Ok(()),
        Role::Node => node(user, a),
        Role::Admin | Role::User | Role::Readonly => person(user, a),
    }
}

/// Whether a field selector on nodes names owners only inside the caller's tenants: it has
/// no `status.owner.*` requirement, or it requires `status.owner.tenant=<theirs>`.
fn owner_selector_is_own(user: &UserInfo, a: &Attributes) -> bool {
    let Some(sel) = a.field_selector else {
        return true;
    };
    let on_owner = sel
        .requirements
        .iter()
        .any(|r| r.field.starts_with("status.owner."));
    !on_owner
        || sel
            .requirements
            .iter()
            .any(|r| r.field == "status.owner.tenant" && r.equal && user.in_tenant(&r.value))
}

/// People and automation accounts: what no role can grant is refused first; then the
/// roles they hold decide ([`rbac`]).
fn person(user: &UserInfo, a: &Attributes) -> ApiResult<()> {
    if let (Some(b), Verb::Connect) = (&user.bound_to, a.verb) {
        // A job's token does what commands in a job do (submit, start steps, list,
        // cancel, and `srun` showing its own steps' output); it reads no other output and
        // opens no sessions, not even its user's. (The object check, that the allocation
        // is a step of the job's, is the log route's.)
        let own_step = a.resource == "allocations"
            && a.subresource == Some("log")
            && a.namespace == Some(b.ns.as_str())
            && a.name.is_some_and(|n| {
                n.strip_prefix(b.name.as_str())
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(|step| !step.is_empty())
            });
        if !own_step {
            return Err(deny(
                user,
                a,
                "a job's token reads only the output of its own job's steps and opens no \
                 sessions; use your own credentials",
            ));
        }
    }
    if a.resource == "nodes" && !user.all_tenants() && !owner_selector_is_own(user, a) {
        // Who owns a node is hidden from people outside the owning tenant (see
        // `crate::registry::redact`); selecting on it would tell them anyway.
        return Err(deny(
            user,
            a,
            "selecting nodes by status.owner needs status.owner.tenant=<one of your tenants>",
        ));
    }
    if a.is_status_write() {
        return Err(deny(user, a, STATUS_IS_SYSTEMS));
    }
    if a.resource == resource::ATTACH_TICKETS {
        // A ticket grants a session as the allocation's user on its node.
        return Err(deny(user, a, "attach tickets are redeemed by node agents"));
    }
    if rbac::allows(user, a) {
        return Ok(());
    }
    Err(deny(user, a, why_not(user, a)))
}

/// Why no role of `user` allows `a`, in the words that help most.
fn why_not(user: &UserInfo, a: &Attributes) -> String {
    let grants: Vec<rbac::Grant> = rbac::all_grants(user)
        .filter(|g| g.role != lattice_apis::kinds::rbac::builtin::BASIC)
        .collect();
    if a.namespaced {
        match a.namespace {
            Some(t)
                if !grants
                    .iter()
                    .any(|g| g.tenant.as_deref().is_none_or(|x| x == t)) =>
            {
                return "not a member of this tenant: no role is bound to you in it (its \
                        tenant admin can bind one with a RoleBinding)"
                    .into();
            }
            None if !grants.iter().any(|g| g.tenant.is_none()) => {
                return "listing across tenants needs access to every tenant (a role bound \
                        cluster-wide); name a tenant"
                    .into();
            }
            _ => {}
        }
    }
    if a.resource == "tenants" && a.name.is_none() && a.verb.is_read() {
        return "listing tenants needs access to every tenant; get your own by name".into();
    }
    let held: Vec<String> = grants.iter().map(|g| g.to_string()).collect();
    format!(
        "no role you hold allows it (you hold: {}); `lattice auth can-i` tells what you may do",
        if held.is_empty() {
            "none".to_string()
        } else {
            held.join(", ")
        }
    )
}

/// NodeRestriction: a node's agent touches its own Node, its heartbeat Lease and the
/// allocations bound to it, nothing else.
fn node(user: &UserInfo, a: &Attributes) -> ApiResult<()> {
    let Some(me) = user.node_name() else {
        return Err(deny(user, a, "not a node identity"));
    };
    let named_me = a.name == Some(me);
    let selects = |field: &str| {
        a.field_selector.is_some_and(|s| {
            s.requirements
                .iter()
                .any(|r| r.equal && r.field == field && r.value == me)
        })
    };
    let ok = match (a.resource, a.verb, a.subresource) {
        ("nodes", Verb::Get, None) => named_me,
        // The name is in the body: admission holds it to the node's own.
        ("nodes", Verb::Create, None) => true,
        ("nodes", Verb::Update | Verb::Patch, Some("status" | "heartbeat")) => named_me,
        ("nodes", Verb::List | Verb::Watch, None) => named_me || selects("metadata.name"),
        ("leases", Verb::Get | Verb::Update | Verb::Patch, None) => {
            named_me && a.namespace == Some(NODE_LEASE_NAMESPACE)
        }
        // Which allocations: the object decides (`node_may_see`), after it is read.
        ("allocations", Verb::Get, None | Some("token")) => a.name.is_some(),
        ("allocations", Verb::Update, Some("report")) => a.name.is_some(),
        ("allocations", Verb::List | Verb::Watch, None) => selects("status.assignedNodes"),
        // The run-as policy of a bound allocation's tenant.
        ("tenants", Verb::Get, None) => a.name.is_some(),
        (resource::ATTACH_TICKETS, Verb::Create, None) => true,
        (resource::NODE_CERTIFICATES, Verb::Create, Some("renew")) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(deny(
            user,
            a,
            "a node's agent may touch only its own Node, its heartbeat Lease and the \
             allocations bound to it (NodeRestriction)",
        ))
    }
}

/// [`authorize`] for `verb` on the object `name` (or the collection) of `kind` in `ns`.
pub fn allow(
    user: &UserInfo,
    verb: Verb,
    kind: &KindInfo,
    ns: Option<&str>,
    name: Option<&str>,
) -> ApiResult<()> {
    authorize(user, &Attributes::kind(verb, kind, ns).named(name))
}

/// Whether node `me` may see `alloc`: it is (or was, for this attempt) bound to it.
pub fn node_may_see(me: &str, alloc: &Value) -> bool {
    let listed = |p: &str| {
        alloc
            .pointer(p)
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|n| n.as_str() == Some(me)))
    };
    listed("/status/assignedNodes")
        || listed("/status/releasingNodes")
        || alloc
            .pointer("/status/nodeStates")
            .and_then(Value::as_object)
            .is_some_and(|m| m.contains_key(me))
}

/// The object-level check of a node's read of an allocation: a 404 for one not bound to
/// it, so that a node learns nothing of other nodes' work.
pub fn node_read(user: &UserInfo, kind: &KindInfo, obj: &Value) -> ApiResult<()> {
    let Some(me) = user.node_name() else {
        return Ok(());
    };
    if kind.kind == "Allocation" && !node_may_see(me, obj) {
        return Err(ApiError::not_found(
            kind.kind,
            kind.plural,
            crate::registry::objects::name_of(obj),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(k: &str) -> &'static KindInfo {
        lattice_apis::kinds().iter().find(|i| i.kind == k).unwrap()
    }

    fn person(role: Role, tenants: &[&str]) -> UserInfo {
        UserInfo {
            name: "alice".into(),
            tenants: Some(tenants.iter().map(|t| t.to_string()).collect()),
            role,
            ..Default::default()
        }
    }

    /// Selecting nodes by owner would reveal whose work runs where: only inside one's tenant.
    #[test]
    fn people_select_nodes_by_owner_only_inside_their_tenants() {
        let nodes = kind("Node");
        let alice = person(Role::User, &["t1"]);
        let sel = |s: &str| {
            crate::registry::selectors::FieldSelector::parse(
                s,
                &[
                    "status.owner.tenant",
                    "status.owner.allocation",
                    "status.state",
                ],
            )
            .expect("selector")
        };
        let allowed = |s: &str| {
            let f = sel(s);
            authorize(
                &alice,
                &Attributes::kind(Verb::List, nodes, None).fields(&f),
            )
            .is_ok()
        };
        for ok in [
            "status.state=Ready",
            "status.owner.tenant=t1,status.owner.allocation=a",
        ] {
            assert!(allowed(ok), "{ok}");
        }
        for no in ["status.owner.allocation=secret", "status.owner.tenant=t2"] {
            assert!(!allowed(no), "{no}");
        }
    }

    /// A job's token: `srun` shows its own steps' output; nothing else is read or opened.
    #[test]
    fn a_job_token_reads_only_its_own_steps_output() {
        let alloc = kind("Allocation");
        let job = UserInfo {
            bound_to: Some(crate::registry::identity::BoundAllocation {
                ns: "t1".into(),
                name: "train".into(),
                uid: "u1".into(),
            }),
            ..person(Role::User, &["t1"])
        };
        let log = |ns: &'static str, name: &'static str| {
            Attributes::kind(Verb::Connect, alloc, Some(ns))
                .named(Some(name))
                .subresource(Some("log"))
        };
        assert!(authorize(&job, &log("t1", "train.0")).is_ok());
        assert!(authorize(&job, &log("t1", "train.12")).is_ok());
        for refused in [
            log("t1", "train"),
            log("t1", "train."),
            log("t1", "trainee.0"),
            log("t1", "other.0"),
            log("t2", "train.0"),
        ] {
            assert!(authorize(&job, &refused).is_err(), "{:?}", refused.name);
        }
        let attach = Attributes::kind(Verb::Connect, alloc, Some("t1"))
            .named(Some("train.0"))
            .subresource(Some("attach"));
        assert!(authorize(&job, &attach).is_err());
    }

    #[test]
    fn status_is_written_only_by_system_identities() {
        let alloc = kind("Allocation");
        let put_status = Attributes::kind(Verb::Update, alloc, Some("t1"))
            .named(Some("a"))
            .subresource(Some("status"));
        let e = authorize(&person(Role::Readonly, &["t1"]), &put_status).unwrap_err();
        assert_eq!(e.code, 403);
        for who in [person(Role::User, &["t1"]), person(Role::Admin, &["*"])] {
            let e = authorize(&who, &put_status).unwrap_err();
            assert_eq!(e.code, 403, "{who:?}");
            assert!(
                e.message.contains("status is written only"),
                "{}",
                e.message
            );
        }
        authorize(&UserInfo::controllers(), &put_status).unwrap();
        authorize(&UserInfo::anonymous_admin(), &put_status).unwrap();
        // Reading status is anyone's with read access.
        let get = Attributes::kind(Verb::Get, alloc, Some("t1"))
            .named(Some("a"))
            .subresource(Some("status"));
        authorize(&person(Role::User, &["t1"]), &get).unwrap();
    }

    #[test]
    fn persons_stay_in_their_tenants() {
        let alloc = kind("Allocation");
        let u = person(Role::User, &["t1"]);
        authorize(&u, &Attributes::kind(Verb::Create, alloc, Some("t1"))).unwrap();
        let e = authorize(&u, &Attributes::kind(Verb::List, alloc, Some("t2"))).unwrap_err();
        assert!(e.message.contains("not a member"), "{}", e.message);
        authorize(&u, &Attributes::kind(Verb::Watch, alloc, None)).unwrap_err();
        // Tenants: their own by name only.
        let tenants = kind("Tenant");
        authorize(
            &u,
            &Attributes::kind(Verb::Get, tenants, None).named(Some("t1")),
        )
        .unwrap();
        authorize(
            &u,
            &Attributes::kind(Verb::Get, tenants, None).named(Some("t2")),
        )
        .unwrap_err();
        authorize(&u, &Attributes::kind(Verb::List, tenants, None)).unwrap_err();
        authorize(
            &u,
            &Attributes::kind(Verb::Patch, tenants, None).named(Some("t1")),
        )
        .unwrap_err();
        for r in [resource::BOOTSTRAP_TOKENS, resource::NODE_CERTIFICATES] {
            authorize(&u, &Attributes::other(Verb::Create, r)).unwrap_err();
        }
    }

    #[test]
    fn node_restriction() {
        let n1 = UserInfo::node("n1");
        assert_eq!(n1.node_name(), Some("n1"));
        assert!(!n1.in_tenant("t1") && !n1.all_tenants());
        let nodes = kind("Node");
        let allocs = kind("Allocation");
        let ok = |a: Attributes| authorize(&n1, &a).unwrap();
        let no = |a: Attributes| {
            let e = authorize(&n1, &a).unwrap_err();
            assert_eq!(e.code, 403);
            assert!(e.message.contains("NodeRestriction"), "{}", e.message);
        };
        ok(Attributes::kind(Verb::Get, nodes, None).named(Some("n1")));
        no(Attributes::kind(Verb::Get, nodes, None).named(Some("n2")));
        ok(Attributes::kind(Verb::Patch, nodes, None)
            .named(Some("n1"))
            .subresource(Some("status")));
        no(Attributes::kind(Verb::Patch, nodes, None)
            .named(Some("n2"))
            .subresource(Some("status")));
        // Its Node's spec is the admins'.
        no(Attributes::kind(Verb::Patch, nodes, None).named(Some("n1")));
        no(Attributes::kind(Verb::Delete, nodes, None).named(Some("n1")));
        // Allocations: only its own view of them.
        let mine =
            FieldSelector::parse("status.assignedNodes=n1", &["status.assignedNodes"]).unwrap();
        let theirs =
            FieldSelector::parse("status.assignedNodes=n2", &["status.assignedNodes"]).unwrap();
        ok(Attributes::kind(Verb::Watch, allocs, None).fields(&mine));
        no(Attributes::kind(Verb::Watch, allocs, None).fields(&theirs));
        no(Attributes::kind(Verb::List, allocs, Some("t1")));
        no(Attributes::kind(Verb::Create, allocs, Some("t1")));
        no(Attributes::kind(Verb::Patch, allocs, Some("t1")).named(Some("a")));
        no(Attributes::kind(Verb::Update, allocs, Some("t1"))
            .named(Some("a"))
            .subresource(Some("status")));
        ok(Attributes::kind(Verb::Update, allocs, Some("t1"))
            .named(Some("a"))
            .subresource(Some("report")));
        // Leases: its heartbeat Lease only.
        let leases = kind("Lease");
        ok(Attributes::kind(Verb::Update, leases, Some(NODE_LEASE_NAMESPACE)).named(Some("n1")));
        no(Attributes::kind(Verb::Update, leases, Some(NODE_LEASE_NAMESPACE)).named(Some("n2")));
        no(Attributes::kind(Verb::Update, leases, Some("t1")).named(Some("n1")));
        // Nothing else.
        no(Attributes::kind(Verb::Get, kind("VCluster"), Some("t1")).named(Some("v")));
        no(Attributes::other(Verb::Create, resource::BOOTSTRAP_TOKENS));
        no(Attributes::other(Verb::Get, resource::CLUSTER_CONFIG));
    }

    #[test]
    fn a_node_sees_only_the_allocations_bound_to_it() {
        let a = serde_json::json!({"status": {
            "assignedNodes": ["n1"], "releasingNodes": ["n2"], "nodeStates": {"n3": {}}}});
        for n in ["n1", "n2", "n3"] {
            assert!(node_may_see(n, &a), "{n}");
        }
        assert!(!node_may_see("n4", &a));
        assert!(!node_may_see("n1", &serde_json::json!({})));
        let e = node_read(&UserInfo::node("n4"), kind("Allocation"), &a).unwrap_err();
        assert_eq!(e.code, 404);
    }
}
