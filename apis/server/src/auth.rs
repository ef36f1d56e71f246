//! Authentication: client certificates from the cluster CA (nodes, controllers,
//! administrators; see [`crate::node_identity`]) and bearer tokens (HS256 JWTs through the
//! pluggable [`Authenticator`]), in one middleware around every route ([`authn`]); and
//! the submitting-user rule of [`USER_ANNOTATION`] (see [`admit_user_on_create`]).
//! Authorization is [`crate::authz`]'s.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use lattice_apis::KindInfo;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::errors::{ApiError, ApiResult};
use crate::objects::name_of;

/// The name [`UserInfo::anonymous_admin`] goes by.
pub const ANONYMOUS: &str = "system:anonymous";

/// What a caller is. `Node` and `System` are system identities: only they write status
/// (see [`crate::authz`]).
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

/// `tenants` claim: a list or `"*"` for all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Tenants {
    All(String),
    List(Vec<String>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub tenants: Tenants,
    pub role: Role,
    pub exp: u64,
    /// A job token's allocation: the token acts for the job and dies with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc: Option<BoundAllocation>,
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
    /// identities too, but only for what is theirs ([`crate::authz`]).
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

/// Turns a request's credentials into a user. `Ok(None)`: no credentials given.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, headers: &HeaderMap) -> ApiResult<Option<UserInfo>>;
}

/// Authentication off: everyone is an admin (tests, `--dev`).
pub struct AllowAll;

#[async_trait]
impl Authenticator for AllowAll {
    async fn authenticate(&self, _headers: &HeaderMap) -> ApiResult<Option<UserInfo>> {
        Ok(Some(UserInfo::anonymous_admin()))
    }
}

/// HS256 JWT bearer tokens with [`Claims`].
pub struct JwtAuthenticator {
    key: DecodingKey,
    validation: Validation,
    /// Tokens already verified, with their expiry: a client sends the same token with
    /// every request, and checking its signature again is a measurable part of a small
    /// request. Keyed by the whole token (signature included), so a hit is exactly the
    /// token that was verified; expiry is checked on every hit as `verify` would.
    verified: std::sync::Mutex<std::collections::HashMap<String, (UserInfo, u64)>>,
}

/// Verified tokens remembered at most (the cache is emptied when full).
const VERIFIED_TOKENS: usize = 4096;

impl JwtAuthenticator {
    pub fn new(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 5;
        Self {
            key: DecodingKey::from_secret(secret),
            validation,
            verified: Default::default(),
        }
    }

    pub fn verify(&self, token: &str) -> ApiResult<UserInfo> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Expired once `exp` is more than the leeway in the past, as jsonwebtoken decides
        // (its rule, with `reject_tokens_expiring_in_less_than` left at 0 by `new`).
        let live = |exp: u64| exp.saturating_add(self.validation.leeway) >= now;
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((user, exp)) = verified.get(token) {
            if live(*exp) {
                return Ok(user.clone());
            }
            verified.remove(token);
        }
        drop(verified);
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| ApiError::unauthorized(format!("invalid bearer token: {e}")))?;
        let c = data.claims;
        if c.sub.starts_with("system:") {
            return Err(ApiError::unauthorized(format!(
                "invalid bearer token: the subject {:?} is reserved for system identities \
                 (they authenticate with client certificates)",
                c.sub
            )));
        }
        if c.role == Role::Node {
            return Err(ApiError::unauthorized(
                "a bearer token cannot carry the node role: node agents authenticate with \
                 their node:<name> client certificate",
            ));
        }
        let tenants = match c.tenants {
            Tenants::All(s) if s == "*" => None,
            Tenants::All(s) => Some(vec![s]),
            Tenants::List(l) if l.iter().any(|t| t == "*") => None,
            Tenants::List(l) => Some(l),
        };
        if c.alloc.is_some() && c.role != Role::User {
            return Err(ApiError::unauthorized(
                "invalid bearer token: a job token carries the user role only",
            ));
        }
        let user = UserInfo {
            name: c.sub,
            tenants,
            role: c.role,
            bound_to: c.alloc,
            expires: Some(c.exp),
            ..Default::default()
        };
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= VERIFIED_TOKENS {
            verified.clear();
        }
        verified.insert(token.to_string(), (user.clone(), c.exp));
        Ok(user)
    }
}

#[async_trait]
impl Authenticator for JwtAuthenticator {
    async fn authenticate(&self, headers: &HeaderMap) -> ApiResult<Option<UserInfo>> {
        let Some(h) = headers.get(axum::http::header::AUTHORIZATION) else {
            return Ok(None);
        };
        let h = h
            .to_str()
            .map_err(|_| ApiError::unauthorized("the Authorization header is not valid text"))?;
        let token = h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
            .ok_or_else(|| ApiError::unauthorized("expected 'Authorization: Bearer <token>'"))?;
        self.verify(token.trim()).map(Some)
    }
}

/// Mint a job token: a user token of `sub` in the allocation's tenant only, bound to the
/// allocation (see [`crate::job_token`]).
pub fn mint_job_token(secret: &[u8], sub: &str, alloc: BoundAllocation, ttl: Duration) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        + ttl;
    let claims = Claims {
        sub: sub.to_string(),
        tenants: Tenants::List(vec![alloc.ns.clone()]),
        role: Role::User,
        exp: exp.as_secs(),
        alloc: Some(alloc),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap_or_default()
}

/// Mint an HS256 token (for `lattice up`, tests and admins).
pub fn mint_token(
    secret: &[u8],
    sub: &str,
    tenants: &[String],
    role: Role,
    ttl: Duration,
) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        + ttl;
    let tenants = if tenants.iter().any(|t| t == "*") {
        Tenants::All("*".into())
    } else {
        Tenants::List(tenants.to_vec())
    };
    let claims = Claims {
        sub: sub.to_string(),
        tenants,
        role,
        exp: exp.as_secs(),
        alloc: None,
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap_or_default()
}

/// A job token is good while its allocation exists (the same one: its uid) and has not
/// ended: it dies with the job.
pub(crate) async fn job_token_alive(inner: &crate::Inner, user: UserInfo) -> ApiResult<UserInfo> {
    let Some(b) = &user.bound_to else {
        return Ok(user);
    };
    let dead = || {
        ApiError::unauthorized(format!(
            "this job token was for allocation {}/{}, which has ended (or is gone): a job's \
             token dies with it",
            b.ns, b.name
        ))
    };
    let k = crate::routes::kind_by_plural("allocations")
        .ok_or_else(|| ApiError::internal("allocations not registered"))?;
    let obj = match inner.resources.trusted().get(k, Some(&b.ns), &b.name).await {
        Ok(o) => o,
        Err(e) if e.code == 404 => return Err(dead()),
        Err(e) => return Err(e),
    };
    let uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
    let phase = obj
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending");
    if uid != Some(b.uid.as_str()) || matches!(phase, "Completed" | "Failed" | "Cancelled") {
        return Err(dead());
    }
    Ok(user)
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
    // Nodes write nothing but their reports, held to that by `crate::admission`.
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

/// Paths anyone may reach without credentials: health, metrics, version, and where a node
/// exchanges its single-use bootstrap token for a certificate (the token is checked there).
fn public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/livez" | "/readyz" | "/metrics" | "/version"
    ) || path == crate::node_identity::BOOTSTRAP_PATH
}

/// Middleware around every route: authenticates the caller (401 without valid
/// credentials, except on [`public`] paths) and opens the scope in which the caller is
/// recorded, so that every handler and the verbs of [`crate::resources::Resources`] apply
/// the caller's rules (see [`request_user`]) even on paths that do not pass the caller
/// along, such as the Intent API.
pub async fn authn(
    axum::extract::State(inner): axum::extract::State<std::sync::Arc<crate::Inner>>,
    mut req: Request,
    next: Next,
) -> Response {
    use axum::response::IntoResponse;
    REQUEST_USER
        .scope(RefCell::new(None), async move {
            if !public(req.uri().path()) {
                let peer = req
                    .extensions()
                    .get::<axum::extract::ConnectInfo<crate::tls::TlsConnInfo>>()
                    .and_then(|c| c.0.cert.clone());
                match authenticate_request(&inner, req.headers(), peer.as_ref()).await {
                    Ok(user) => {
                        record_request_user(&user);
                        req.extensions_mut().insert(user);
                    }
                    Err(e) => return e.into_response(),
                }
            }
            next.run(req).await
        })
        .await
}

/// The caller of a request: its verified client certificate first (nodes, controllers,
/// administrators' certificates), else its bearer token; the anonymous admin when the
/// server runs without authentication.
pub(crate) async fn authenticate_request(
    inner: &crate::Inner,
    headers: &HeaderMap,
    peer: Option<&lattice_pki::CertInfo>,
) -> ApiResult<UserInfo> {
    if !inner.config.auth {
        return Ok(UserInfo::anonymous_admin());
    }
    if let Some(cert) = peer {
        return crate::node_identity::cert_user(inner, cert).await;
    }
    match inner.authenticator.authenticate(headers).await? {
        Some(u) if u.bound_to.is_some() => job_token_alive(inner, u).await,
        Some(u) => Ok(u),
        None => Err(ApiError::unauthorized(
            "authentication required: send 'Authorization: Bearer <token>' (node agents: \
             their node certificate over HTTPS)",
        )),
    }
}

/// Record the caller of the request being served (no-op outside [`authn`]'s scope).
pub(crate) fn record_request_user(user: &UserInfo) {
    let _ = REQUEST_USER.try_with(|u| *u.borrow_mut() = Some(user.clone()));
}

/// The authenticated caller of the HTTP request being served; `None` outside one (the
/// built-in controllers calling [`crate::resources::Resources`] in process).
pub fn request_user() -> Option<UserInfo> {
    REQUEST_USER.try_with(|u| u.borrow().clone()).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let t = mint_token(
            b"s3cret",
            "alice",
            &["t1".to_string()],
            Role::User,
            Duration::from_secs(60),
        );
        let u = JwtAuthenticator::new(b"s3cret").verify(&t).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.tenants, Some(vec!["t1".into()]));
        assert_eq!(u.role, Role::User);
        assert_eq!(
            JwtAuthenticator::new(b"other").verify(&t).unwrap_err().code,
            401
        );
        let t = mint_token(
            b"s3cret",
            "root",
            &["*".to_string()],
            Role::Admin,
            Duration::from_secs(60),
        );
        assert_eq!(
            JwtAuthenticator::new(b"s3cret").verify(&t).unwrap().tenants,
            None
        );
    }

    #[test]
    fn remembered_tokens_still_expire_and_others_are_checked() {
        let mut auth = JwtAuthenticator::new(b"s3cret");
        auth.validation.leeway = 0;
        let t = mint_token(b"s3cret", "alice", &[], Role::User, Duration::from_secs(1));
        assert_eq!(auth.verify(&t).unwrap().name, "alice");
        assert_eq!(auth.verify(&t).unwrap().name, "alice", "from the cache");
        // Another signature is another token: verified, and refused.
        let mut forged = t.clone().into_bytes();
        let i = forged.len() - 5; // inside the signature
        forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(auth.verify(&forged).unwrap_err().code, 401);
        std::thread::sleep(Duration::from_millis(2100));
        let e = auth.verify(&t).unwrap_err();
        assert_eq!(e.code, 401);
        assert!(e.message.contains("Expired"), "{}", e.message);
    }

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
