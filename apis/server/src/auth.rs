//! Authentication: client certificates from the cluster CA (nodes, controllers,
//! administrators; see [`crate::node_identity`]) and bearer tokens (HS256 JWTs through the
//! pluggable [`Authenticator`]), in one middleware around every route ([`authn`]). Who a
//! caller is once authenticated, and the rules that follow from it, are the registry's
//! ([`crate::registry::identity`], re-exported here). Authorization is
//! [`crate::authz`]'s.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::errors::{ApiError, ApiResult};

pub use crate::registry::identity::*;

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
    /// Groups the subject is in (RoleBindings and ClusterRoleBindings may name them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// Turns a request's credentials into a user. `Ok(None)`: no credentials given.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, headers: &HeaderMap) -> ApiResult<Option<UserInfo>>;

    /// The identity providers it trusts (for `GET /v1/auth/discovery`); none by default.
    fn oidc_issuers(&self) -> Vec<crate::oidc::IssuerConfig> {
        Vec::new()
    }
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
            groups: c.groups,
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
        match bearer_token(headers)? {
            Some(token) => self.verify(token).map(Some),
            None => Ok(None),
        }
    }
}

/// The bearer token of a request: `Ok(None)` without an Authorization header, 401 for one
/// that is not `Bearer <token>`.
pub fn bearer_token(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    let Some(h) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let h = h
        .to_str()
        .map_err(|_| ApiError::unauthorized("the Authorization header is not valid text"))?;
    h.strip_prefix("Bearer ")
        .or_else(|| h.strip_prefix("bearer "))
        .map(|t| Some(t.trim()))
        .ok_or_else(|| ApiError::unauthorized("expected 'Authorization: Bearer <token>'"))
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
        groups: Vec::new(),
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
        groups: Vec::new(),
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

/// Paths anyone may reach without credentials: health, metrics, version, and where a node
/// exchanges its single-use bootstrap token for a certificate (the token is checked there).
fn public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/livez" | "/readyz" | "/metrics" | "/version"
    ) || path == crate::node_identity::BOOTSTRAP_PATH
        || path == crate::access::DISCOVERY_PATH
        || path == crate::access::SEED_DISCOVERY_PATH
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
    with_request_scope(async move {
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
    let mut user = if let Some(cert) = peer {
        crate::node_identity::cert_user(inner, cert).await?
    } else if let Some(u) = crate::api_tokens::authenticate(inner, headers).await? {
        u
    } else {
        match inner.authenticator.authenticate(headers).await? {
            Some(u) if u.bound_to.is_some() => job_token_alive(inner, u).await?,
            Some(u) => u,
            None => {
                return Err(ApiError::unauthorized(
                    "authentication required: send 'Authorization: Bearer <token>' (node \
                     agents: their node certificate over HTTPS)",
                ))
            }
        }
    };
    if !user.is_system() && user.role != Role::Node {
        inner.rbac.ready(&inner.resources.backend).await?;
        inner.rbac.resolve(&mut user);
    }
    Ok(user)
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
}
