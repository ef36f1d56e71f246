//! Who is calling, and the rules that follow from it in every verb: the caller's
//! [`Role`] and [`UserInfo`], the user of a request ([`request_user`], recorded by the
//! HTTP layer's authentication), and the submitting-user rule of [`USER_ANNOTATION`]
//! ([`admit_user_on_create`], [`admit_user_on_update`], [`admit_owner`]). How a caller
//! proves who it is (tokens, certificates) is the HTTP layer's (`crate::auth`).

use std::cell::RefCell;
use std::time::SystemTime;

use lattice_apis::KindInfo;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::objects::name_of;

/// The name [`UserInfo::anonymous_admin`] goes by.
pub const ANONYMOUS: &str = "system:anonymous";

/// What a caller is. `Node` and `System` are system identities: only they write status
/// (see [`crate::registry::authz`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A person administering the cluster: every object's spec and metadata, never status.
    Admin,
    /// A person working in their tenants.
    User,
    /// A person who may only read, in their tenants.
    #[default]
    Readonly,
    /// The controllers (in-process ones are trusted without credentials; out-of-process
    /// ones authenticate as `system:controllers`): everything, status included.
    System,
    /// A node's agent (`node:<name>` client certificate only, never a token): its own
    /// Node, its heartbeat Lease and the allocations bound to it (NodeRestriction).
    Node,
}

/// The allocation a job token is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundAllocation {
    /// Its tenant.
    pub ns: String,
    /// Its name.
    pub name: String,
    /// Its uid (a re-created allocation of the same name is another one).
    pub uid: String,
}

/// The client certificate a caller authenticated with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRef {
    /// Its serial (lowercase hex).
    pub serial: String,
    /// Valid from.
    pub not_before: SystemTime,
    /// Valid until.
    pub not_after: SystemTime,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    /// `None`: every tenant.
    pub tenants: Option<Vec<String>>,
    pub role: Role,
    /// The client certificate it authenticated with, if it did.
    pub cert: Option<CertRef>,
    /// For a job token: the allocation it acts for.
    pub bound_to: Option<BoundAllocation>,
    /// For a bearer token: when it expires (seconds since the epoch). Certificates carry
    /// theirs in [`cert`](Self::cert).
    pub expires: Option<u64>,
    /// The groups its credentials list (OIDC groups, a token's `groups` claim).
    pub groups: Vec<String>,
    /// Authenticated with an API token (`lattice admin token`): an automation account,
    /// matched by `ServiceAccount` subjects.
    pub service_account: bool,
    /// What its role bindings grant: the RoleBindings and ClusterRoleBindings naming it or
    /// its groups, the tenants listing it as an admin, an API token's role. Resolved when
    /// it authenticates ([`crate::registry::rbac::Rbac::resolve`]); what its credentials'
    /// [`role`](Self::role) grants is added by the authorizer.
    pub grants: std::sync::Arc<Vec<crate::registry::rbac::Grant>>,
    /// [`grants`](Self::grants) holds everything, the credentials' role included
    /// (set by [`crate::registry::rbac::apply_grants`]); otherwise the authorizer adds
    /// what [`role`](Self::role) and [`tenants`](Self::tenants) grant.
    pub grants_resolved: bool,
}

/// The user name of a node's agent: `system:node:<name>`.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The user name of the controllers.
pub const CONTROLLERS_USER: &str = "system:controllers";

impl UserInfo {
    /// When the credential this caller authenticated with stops working (a token's
    /// expiry, a certificate's notAfter); `None`: never (in-process callers).
    pub fn credential_ends(&self) -> Option<std::time::SystemTime> {
        let token = self
            .expires
            .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let cert = self.cert.as_ref().map(|c| c.not_after);
        match (token, cert) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The agent of node `name`.
    pub fn node(name: &str) -> Self {
        Self {
            name: format!("{NODE_USER_PREFIX}{name}"),
            // No tenant: what a node may touch is decided object by object.
            tenants: Some(Vec::new()),
            role: Role::Node,
            ..Default::default()
        }
    }

    /// The controllers.
    pub fn controllers() -> Self {
        Self {
            name: CONTROLLERS_USER.into(),
            tenants: None,
            role: Role::System,
            ..Default::default()
        }
    }

    /// The node this caller is the agent of.
    pub fn node_name(&self) -> Option<&str> {
        match self.role {
            Role::Node => self.name.strip_prefix(NODE_USER_PREFIX),
            _ => None,
        }
    }

    /// A system identity (controllers, anonymous admin of a server without
    /// authentication): trusted with status and system-owned fields. Nodes are system
    /// identities too, but only for what is theirs ([`crate::registry::authz`]).
    pub fn is_system(&self) -> bool {
        self.role == Role::System || self.is_anonymous()
    }

    pub fn anonymous_admin() -> Self {
        Self {
            name: ANONYMOUS.into(),
            tenants: None,
            role: Role::Admin,
            ..Default::default()
        }
    }

    /// The caller of a server without authentication (`auth: false`), or a request
    /// without credentials to one.
    pub fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS
    }

    pub fn in_tenant(&self, t: &str) -> bool {
        match &self.tenants {
            None => true,
            Some(ts) => ts.iter().any(|x| x == t || x == "*"),
        }
    }

    pub fn all_tenants(&self) -> bool {
        match &self.tenants {
            None => true,
            Some(ts) => ts.iter().any(|x| x == "*"),
        }
    }
}

/// Annotation naming the user who submitted an `Allocation` or `Dag`. The node agent
/// runs the workload as that local Unix user, the controllers scope `scope=user`
/// dependency symbols and mutexes by it, and the CLI's `--all-mine` filters on it, so the
/// server does not take a caller's word for it: see [`admit_user_on_create`] and
/// [`admit_user_on_update`].
pub use lattice_apis::wellknown::USER_ANNOTATION;

/// The field path of [`USER_ANNOTATION`] in `Status` causes.
const USER_FIELD: &str = "metadata.annotations[lattice.dev/user]";

/// Kinds whose [`USER_ANNOTATION`] names the user the work belongs to and runs as.
fn names_submitter(kind: &KindInfo) -> bool {
    matches!(kind.kind, "Allocation" | "Dag")
}

/// The object's [`USER_ANNOTATION`]; `None` when absent (or `null`).
fn user_annotation(obj: &Value) -> Option<&Value> {
    obj.pointer("/metadata/annotations")?
        .get(USER_ANNOTATION)
        .filter(|v| !v.is_null())
}

/// A value as the messages show it: quoted text, or its JSON.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn forbidden_user_change(kind: &KindInfo, obj: &Value, why: String) -> ApiError {
    let name = name_of(obj);
    ApiError::forbidden(format!(
        "{}.lattice.dev {name:?} is forbidden: {why}",
        kind.plural
    ))
    .with_details(json!({
        "name": name,
        "group": "lattice.dev",
        "kind": kind.plural,
        "causes": [{"reason": "FieldValueForbidden", "field": USER_FIELD, "message": why}],
    }))
}

/// Create of an `Allocation` or `Dag` by `user` (`None`: an in-process caller such as
/// the built-in controllers, trusted as is). The [`USER_ANNOTATION`] names the user the
/// work runs as, so it is set from the authenticated identity, never from the request:
///
/// * a person (admins included) who omits it gets it set to their name; one who sends
///   another value gets 403 Forbidden naming the annotation, the value and the fix;
/// * system identities (the controllers creating a Dag's tasks or a job's steps, the
///   anonymous caller of a server without authentication) keep what they send.
pub fn admit_user_on_create(
    user: Option<&UserInfo>,
    kind: &KindInfo,
    obj: &mut Value,
) -> ApiResult<()> {
    let Some(user) = user else {
        return Ok(());
    };
    if !names_submitter(kind) || user.is_system() {
        return Ok(());
    }
    let sent = user_annotation(obj);
    if user.name.is_empty() {
        let why = format!(
            "the credentials name no user (an empty subject), and metadata.annotations[{USER_ANNOTATION:?}] \
             must name the submitting user; use credentials whose subject is your user name"
        );
        return Err(forbidden_user_change(kind, obj, why));
    }
    if let Some(v) = sent {
        if v.as_str() == Some(user.name.as_str()) {
            return Ok(());
        }
        let why = format!(
            "user {:?} cannot create it with metadata.annotations[{USER_ANNOTATION:?}] = {}: \
             the annotation names the user the work runs as, and the server sets it from \
             the authenticated identity ({:?}); omit the annotation or set it to {:?}",
            user.name,
            shown(v),
            user.name,
            user.name
        );
        return Err(forbidden_user_change(kind, obj, why));
    }
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    // Anything but a map is left to admission, which rejects it (422).
    if let Some(a) = annotations.as_object_mut() {
        a.insert(USER_ANNOTATION.into(), Value::String(user.name.clone()));
    }
    Ok(())
}

/// Update (replace, patch, apply) of an existing `Allocation` or `Dag` from `old` to
/// `new` by `user` (`None`: in-process, trusted): no person, admins included, adds,
/// changes or removes the [`USER_ANNOTATION`] (403 Forbidden naming the annotation, both
/// values and the fix).
/// A non-admin may change or delete an Allocation or Dag only when it names no user or
/// names the caller: the work runs as the named user, so changing someone else's would
/// run the caller's command as them. Admins and in-process controllers (`None`) may.
pub fn admit_owner(user: Option<&UserInfo>, kind: &KindInfo, old: &Value) -> ApiResult<()> {
    let Some(user) = user else {
        return Ok(());
    };
    // Nodes write nothing but their reports, held to that by `crate::registry::admission`.
    if !names_submitter(kind) || matches!(user.role, Role::Admin | Role::Node) || user.is_system() {
        return Ok(());
    }
    match user_annotation(old) {
        Some(owner) if owner.as_str() != Some(user.name.as_str()) => {
            let why = format!(
                "it belongs to user {} (metadata.annotations[{USER_ANNOTATION:?}]), whom its \
                 work runs as; only that user or an admin may change or delete it (user {:?} \
                 may not)",
                shown(owner),
                user.name
            );
            Err(forbidden_user_change(kind, old, why))
        }
        _ => Ok(()),
    }
}

pub fn admit_user_on_update(
    user: Option<&UserInfo>,
    kind: &KindInfo,
    old: &Value,
    new: &Value,
) -> ApiResult<()> {
    admit_owner(user, kind, old)?;
    let Some(user) = user else {
        return Ok(());
    };
    if !names_submitter(kind) || user.is_system() || user.role == Role::Node {
        return Ok(());
    }
    let (before, after) = (user_annotation(old), user_annotation(new));
    if before == after {
        return Ok(());
    }
    let field = format!("metadata.annotations[{USER_ANNOTATION:?}]");
    let what = match (before, after) {
        (Some(b), Some(a)) => format!("change {field} from {} to {}", shown(b), shown(a)),
        (Some(b), None) => format!("remove {field} (it is {})", shown(b)),
        (None, Some(a)) => format!(
            "set {field} to {} on an object that names no user",
            shown(a)
        ),
        (None, None) => return Ok(()),
    };
    let fix = match before {
        Some(b) => format!("keep it as {}", shown(b)),
        None => "leave it unset".to_string(),
    };
    let why = format!(
        "user {:?} cannot {what}: the annotation names the user the work runs as, set from \
         the identity that created it, and nobody changes it; {fix}",
        user.name
    );
    Err(forbidden_user_change(kind, old, why))
}

tokio::task_local! {
    /// The authenticated caller of the HTTP request being served, recorded by
    /// [`authn`] inside the scope it opens.
    static REQUEST_USER: RefCell<Option<UserInfo>>;
}

/// Runs `f` in a scope where the caller of the request can be recorded (see
/// [`record_request_user`]) and read back by every verb (see [`request_user`]).
pub(crate) async fn with_request_scope<F: std::future::Future>(f: F) -> F::Output {
    REQUEST_USER.scope(RefCell::new(None), f).await
}

/// Record the caller of the request being served (no-op outside [`authn`]'s scope).
pub(crate) fn record_request_user(user: &UserInfo) {
    let _ = REQUEST_USER.try_with(|u| *u.borrow_mut() = Some(user.clone()));
}

/// The authenticated caller of the HTTP request being served; `None` outside one (the
/// built-in controllers calling [`crate::registry::resources::Resources`] in process).
pub fn request_user() -> Option<UserInfo> {
    REQUEST_USER.try_with(|u| u.borrow().clone()).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(k: &str) -> &'static KindInfo {
        lattice_apis::kinds().iter().find(|i| i.kind == k).unwrap()
    }

    fn user(name: &str, role: Role) -> UserInfo {
        UserInfo {
            name: name.into(),
            tenants: None,
            role,
            ..Default::default()
        }
    }

    fn annotated(v: Value) -> Value {
        serde_json::json!({"metadata": {"name": "a", "annotations": {USER_ANNOTATION: v}}})
    }

    #[test]
    fn user_annotation_rules() {
        let alloc = kind("Allocation");
        let alice = user("alice", Role::User);
        // In process: trusted, untouched.
        let mut o = annotated("bob".into());
        admit_user_on_create(None, alloc, &mut o).unwrap();
        assert_eq!(o, annotated("bob".into()));
        // Only Allocations and Dags carry it.
        let mut o = annotated("bob".into());
        admit_user_on_create(Some(&alice), kind("VCluster"), &mut o).unwrap();
        admit_user_on_update(Some(&alice), kind("VCluster"), &o, &annotated(Value::Null)).unwrap();
        // A value that is not text is another user's, never the caller's.
        let mut o = annotated(serde_json::json!(["alice"]));
        let e = admit_user_on_create(Some(&alice), kind("Dag"), &mut o).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(e.message.contains(r#"= ["alice"]"#), "{}", e.message);
        // Credentials without a name cannot submit as anybody.
        let mut o = serde_json::json!({"metadata": {"name": "a"}});
        let e = admit_user_on_create(Some(&user("", Role::User)), alloc, &mut o).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(e.message.contains("empty subject"), "{}", e.message);
        // The anonymous admin leaves it absent; a named admin fills in their name.
        let mut o = serde_json::json!({"metadata": {"name": "a"}});
        admit_user_on_create(Some(&UserInfo::anonymous_admin()), alloc, &mut o).unwrap();
        assert!(o["metadata"].get("annotations").is_none(), "{o}");
        admit_user_on_create(Some(&user("ops", Role::Admin)), alloc, &mut o).unwrap();
        assert_eq!(o["metadata"]["annotations"][USER_ANNOTATION], "ops");
        // Admins are people too: they cannot submit as someone else.
        let mut o = annotated("bob".into());
        let e = admit_user_on_create(Some(&user("ops", Role::Admin)), alloc, &mut o).unwrap_err();
        assert_eq!(e.code, 403);
        // System identities (the controllers creating a Dag's tasks) keep what they send.
        let mut o = annotated("bob".into());
        admit_user_on_create(Some(&UserInfo::controllers()), alloc, &mut o).unwrap();
        assert_eq!(o, annotated("bob".into()));
        // Annotations that are not a map are left to admission (422).
        let mut o = serde_json::json!({"metadata": {"name": "a", "annotations": "x"}});
        admit_user_on_create(Some(&alice), alloc, &mut o).unwrap();
        assert_eq!(o["metadata"]["annotations"], "x");
        // Update: null and absent are the same; nobody but the system changes it.
        let old = annotated("alice".into());
        admit_user_on_update(Some(&alice), alloc, &old, &annotated("alice".into())).unwrap();
        admit_user_on_update(
            Some(&alice),
            alloc,
            &annotated(Value::Null),
            &serde_json::json!({}),
        )
        .unwrap();
        let e = admit_user_on_update(
            Some(&user("ops", Role::Admin)),
            alloc,
            &old,
            &annotated("bob".into()),
        )
        .unwrap_err();
        assert_eq!(e.code, 403);
        admit_user_on_update(
            Some(&UserInfo::controllers()),
            alloc,
            &old,
            &annotated("bob".into()),
        )
        .unwrap();
        let e =
            admit_user_on_update(Some(&alice), alloc, &old, &serde_json::json!({})).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(e.message.contains(r#"keep it as "alice""#), "{}", e.message);
    }
}
