//! Node identities (kubelet-style TLS bootstrap; the protocol is described in
//! [`lattice_apis::node_identity`]): bootstrap tokens, signing a node's CSR against one,
//! renewal, revocation, and turning a verified client certificate into a caller
//! ([`cert_user`]).
//!
//! What is kept in the store (system keys, never reachable through the resource routes):
//!
//! * `/lattice/pki/bootstrap-tokens/<id>`: a token's SHA-256 (never the token), expiry,
//!   optional node binding. Spending it deletes it in the same transaction that records
//!   the enrolment, guarded by the revision read, so a token enrolls exactly one node
//!   even when two agents race with it.
//! * `/lattice/pki/nodes/<name>`: the serials (and expiries) of the node's certificates
//!   that have not expired: what a revocation revokes. An unbound token cannot enroll a
//!   name that already has a live certificate (it would impersonate that node).
//! * `/lattice/pki/revoked/<serial>`: revoked certificates until they expire. Every API
//!   server keeps the set in memory, fed by a watch, so a revocation takes effect
//!   everywhere within a moment.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lattice_apis::node_identity::{
    parse_bootstrap_token, BootstrapToken, BootstrapTokenRequest, CertificateRequest,
    CertificateResponse, DEFAULT_TOKEN_TTL_SECS, MAX_TOKEN_TTL_SECS,
};
use lattice_pki::{CertInfo, Identity, IssueRequest, Usage};
use lattice_store::{
    prefix_end, Compare, CompareResult, DeleteRangeRequest, KeyRange, KvBackend, PutRequest,
    RangeRequest, TxnOp, TxnRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::{Role, UserInfo};
use crate::authz::{self, resource, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::routes::{json_response, read_body};
use crate::Inner;

pub use lattice_apis::node_identity::BOOTSTRAP_PATH;

const TOKENS: &str = "/lattice/pki/bootstrap-tokens/";
const NODES: &str = "/lattice/pki/nodes/";
const REVOKED: &str = "/lattice/pki/revoked/";

/// A stored bootstrap token.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenRecord {
    /// Hex SHA-256 of the secret part.
    secret_sha256: String,
    /// Unix seconds.
    expires: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

/// The live certificates of one node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Enrolment {
    certificates: Vec<Issued>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Issued {
    serial: String,
    /// Unix seconds.
    not_after: u64,
}

/// A revoked certificate (kept until it would have expired).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Revoked {
    node: String,
    not_after: u64,
    by: String,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(crate) fn now() -> u64 {
    unix(SystemTime::now())
}

pub(crate) fn rfc3339(secs: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp(secs as i64, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn random_word(n: usize) -> ApiResult<String> {
    use ring::rand::SecureRandom;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ApiError::internal("no randomness for a token"))?;
    // 252 = 7 × 36: rejecting larger bytes would be exact; the bias of `% 36` over 256
    // values is below 2 % per character and the secret has 16 of them (>80 bits).
    Ok(bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect())
}

pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    backend: &dyn KvBackend,
    key: &str,
) -> ApiResult<Option<(T, i64)>> {
    match backend.get(Bytes::from(key.to_string())).await? {
        None => Ok(None),
        Some(kv) => serde_json::from_slice(&kv.value)
            .map(|v| Some((v, kv.mod_revision)))
            .map_err(|e| ApiError::internal(format!("the stored record {key} is not valid: {e}"))),
    }
}

pub(crate) fn to_bytes<T: Serialize>(v: &T) -> ApiResult<Bytes> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// The caller a verified client certificate names; 401 for an expired or revoked one, or
/// one that is not an API client's.
pub async fn cert_user(inner: &Inner, cert: &CertInfo) -> ApiResult<UserInfo> {
    if cert.not_after < SystemTime::now() {
        return Err(ApiError::unauthorized(format!(
            "the client certificate {:?} (serial {}) expired at {}; a node renews it before \
             that, or enrolls again with a new bootstrap token",
            cert.common_name,
            cert.serial,
            rfc3339(unix(cert.not_after))
        )));
    }
    if inner
        .revocations
        .is_revoked(&inner.resources.backend, &cert.serial)
        .await?
    {
        return Err(ApiError::unauthorized(format!(
            "the client certificate {:?} (serial {}) was revoked; enroll the node again with \
             a new bootstrap token (`lattice admin node bootstrap-token --node NAME`)",
            cert.common_name, cert.serial
        )));
    }
    let cert_ref = Some(crate::auth::CertRef {
        serial: cert.serial.clone(),
        not_before: cert.not_before,
        not_after: cert.not_after,
    });
    match &cert.identity {
        Some(Identity::Node(n)) => Ok(UserInfo {
            cert: cert_ref,
            ..UserInfo::node(n)
        }),
        Some(Identity::Controllers) => Ok(UserInfo {
            cert: cert_ref,
            ..UserInfo::controllers()
        }),
        Some(Identity::Admin(n)) => Ok(UserInfo {
            name: n.clone(),
            tenants: None,
            role: Role::Admin,
            cert: cert_ref,
            ..Default::default()
        }),
        _ => Err(ApiError::unauthorized(format!(
            "the client certificate {:?} is not an API client's (nodes, controllers and \
             administrators have certificates for the API)",
            cert.common_name
        ))),
    }
}

/// The revoked serials, kept in memory from a watch of the store.
#[derive(Clone)]
pub struct Revocations {
    revoked: crate::registry::follow::Follower,
}

impl Default for Revocations {
    fn default() -> Self {
        Self {
            revoked: crate::registry::follow::Follower::new(REVOKED),
        }
    }
}

impl Revocations {
    /// Whether `serial` is revoked. Until the watch has listed everything once, the store
    /// is asked directly.
    pub async fn is_revoked(&self, backend: &Arc<dyn KvBackend>, serial: &str) -> ApiResult<bool> {
        self.revoked.start(backend);
        let key = format!("{REVOKED}{serial}");
        if self.revoked.synced() {
            return Ok(self.revoked.get(key.as_bytes()).is_some());
        }
        Ok(backend.get(Bytes::from(key)).await?.is_some())
    }
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let h = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    h.strip_prefix("Bearer ")
        .or_else(|| h.strip_prefix("bearer "))
        .map(str::trim)
}

fn ca(inner: &Inner) -> ApiResult<&lattice_pki::Ca> {
    inner.config.ca.as_deref().ok_or_else(|| {
        ApiError::unavailable(
            "this API server has no cluster CA to sign node certificates with (start it with \
             --pki-dir holding ca.crt and ca.key)",
        )
    })
}

fn check_node_name(name: &str) -> ApiResult<()> {
    if lattice_apis::validation::validate_dns1123_label("node", name).is_some() {
        return Err(ApiError::bad_request(format!(
            "node: {name:?} is not a valid node name (a DNS label: lowercase letters, digits \
             and '-', at most 63 characters)"
        )));
    }
    Ok(())
}

fn parse_request(body: &[u8]) -> ApiResult<CertificateRequest> {
    crate::parse::json_as(body, |e| {
        format!(
            "invalid certificate request: {e}; expected {{\"node\": \"NAME\", \"csr\": \"-----BEGIN CERTIFICATE REQUEST-----...\"}}"
        )
    })
}

/// How a certificate is being asked for.
enum Ask<'a> {
    /// With a bootstrap token bound to this node (the token id and the revision it was
    /// read at): spent in the same transaction; a live certificate the node had is revoked
    /// in it too (re-enrolment replaces, never adds).
    Bound { token: &'a str, rev: i64 },
    /// With an unbound token: only a name that was never enrolled and has no Node yet (it
    /// would take over that node's identity, its home vCluster and its history).
    Unbound { token: &'a str, rev: i64 },
    /// A renewal by the node presenting the certificate with this serial, issued at
    /// `not_before` and valid until `not_after`.
    Renewal {
        serial: &'a str,
        not_before: SystemTime,
        not_after: SystemTime,
    },
}

/// Sign `csr` for `node` and record the certificate in the node's enrolment, guarded so
/// that a token enrolls once, a revocation is never outrun, and a renewal is of a
/// certificate that is still the node's.
async fn issue(
    inner: &Inner,
    node: &str,
    csr: &str,
    ask: Ask<'_>,
) -> ApiResult<CertificateResponse> {
    let backend = &inner.resources.backend;
    let ca = ca(inner)?;
    let enrol_key = format!("{NODES}{node}");
    let stored = read_json::<Enrolment>(&**backend, &enrol_key).await?;
    let enrolled = stored.is_some();
    let (mut enrolment, enrol_rev) = stored.unwrap_or_default();
    let t = now();
    enrolment.certificates.retain(|c| c.not_after > t);
    let mut compare = vec![Compare::mod_revision(
        Bytes::from(enrol_key.clone()),
        CompareResult::Equal,
        enrol_rev,
    )];
    let mut success = Vec::new();
    match &ask {
        Ask::Unbound { .. } => {
            let nk = crate::routes::kind_by_plural("nodes")
                .ok_or_else(|| ApiError::internal("nodes not registered"))?;
            let exists = inner.resources.trusted().get(nk, None, node).await.is_ok();
            if enrolled || exists {
                return Err(ApiError::forbidden(format!(
                    "node {node:?} {} ; a token not bound to it cannot enroll it (it would take \
                     over that node's identity): create a token with --node {node}",
                    if enrolled {
                        "was enrolled before"
                    } else {
                        "is already registered"
                    }
                )));
            }
        }
        Ask::Bound { .. } => {
            // Re-enrolment: the certificates the node had are revoked with the token spent.
            for c in enrolment.certificates.drain(..) {
                let rec = Revoked {
                    node: node.to_string(),
                    not_after: c.not_after,
                    by: "re-enrolment".into(),
                };
                success.push(TxnOp::Put(PutRequest::new(
                    Bytes::from(format!("{REVOKED}{}", c.serial)),
                    to_bytes(&rec)?,
                )));
            }
        }
        Ask::Renewal {
            serial,
            not_before,
            not_after,
        } => {
            if !enrolment.certificates.iter().any(|c| c.serial == *serial) {
                return Err(ApiError::unauthorized(format!(
                    "the certificate {serial} is not one of node {node:?}'s live certificates \
                     (revoked, or replaced by a re-enrolment); enroll again with a bootstrap token"
                )));
            }
            // At most one renewal per half lifetime: the agent renews at two thirds.
            let half = *not_before + not_after.duration_since(*not_before).unwrap_or_default() / 2;
            if SystemTime::now() < half {
                return Err(ApiError::new(
                    429,
                    "TooManyRequests",
                    format!(
                        "the certificate {serial} is not half through its lifetime; renew after {}",
                        rfc3339(unix(half))
                    ),
                ));
            }
            // Not revoked meanwhile (a revocation the in-memory set has not seen yet).
            compare.push(Compare::create_revision(
                Bytes::from(format!("{REVOKED}{serial}")),
                CompareResult::Equal,
                0,
            ));
        }
    }
    let req = IssueRequest::new(Identity::Node(node.to_string()), Usage::ClientAndServer)
        .validity(inner.config.node_cert_validity);
    let cert = ca
        .sign_csr(csr, &req)
        .map_err(|e| ApiError::bad_request(format!("csr: {e}")))?;
    let info = lattice_pki::inspect_pem(&cert)
        .map_err(|e| ApiError::internal(format!("the certificate just issued: {e}")))?;
    enrolment.certificates.push(Issued {
        serial: info.serial.clone(),
        not_after: unix(info.not_after),
    });
    success.push(TxnOp::Put(PutRequest::new(
        Bytes::from(enrol_key),
        to_bytes(&enrolment)?,
    )));
    if let Ask::Bound { token, rev } | Ask::Unbound { token, rev } = &ask {
        let key = Bytes::from(format!("{TOKENS}{token}"));
        compare.push(Compare::mod_revision(
            key.clone(),
            CompareResult::Equal,
            *rev,
        ));
        success.push(TxnOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single(key),
            prev_kv: false,
        }));
    }
    let r = backend
        .txn(TxnRequest {
            compare,
            success,
            failure: vec![],
        })
        .await?;
    if !r.succeeded {
        return Err(match ask {
            Ask::Renewal { .. } => ApiError::conflict(
                "nodes",
                node,
                "the node's certificates changed meanwhile (revoked or renewed); try again",
            ),
            _ => ApiError::unauthorized(
                "the bootstrap token was used at the same moment by another request (a token \
                 enrolls one node once); ask for a new one",
            ),
        });
    }
    Ok(CertificateResponse {
        certificate: cert,
        ca: ca.cert_pem().to_string(),
        not_after: rfc3339(unix(info.not_after)),
    })
}

/// `POST /v1/nodes/certificate`: a node's first certificate, against a bootstrap token.
pub async fn bootstrap(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let unauthorized = |why: &str| {
            ApiError::unauthorized(format!(
                "{why}; a node enrolls with a bootstrap token from `lattice admin node \
                 bootstrap-token` (sent as 'Authorization: Bearer <id>.<secret>')"
            ))
        };
        let token = bearer(&headers).ok_or_else(|| unauthorized("no bootstrap token"))?;
        let (id, secret) =
            parse_bootstrap_token(token).ok_or_else(|| unauthorized("not a bootstrap token"))?;
        // The token is the credential of this public path: checked before the body is
        // read, so that a caller without one cannot make the server parse anything.
        let key = format!("{TOKENS}{id}");
        let (rec, rev) = read_json::<TokenRecord>(&*inner.resources.backend, &key)
            .await?
            .ok_or_else(|| unauthorized("unknown or already used bootstrap token"))?;
        // Hashes are compared, not secrets: how long the comparison takes tells a guesser
        // about the hash of their guess only, which is no step towards the secret.
        if sha256_hex(secret) != rec.secret_sha256 {
            return Err(unauthorized("unknown or already used bootstrap token"));
        }
        if rec.expires <= now() {
            return Err(unauthorized(&format!(
                "the bootstrap token {id} expired at {}",
                rfc3339(rec.expires)
            )));
        }
        // The token is good: only now is the body read.
        let b = read_body(&inner, &headers, body).await?;
        let req = parse_request(&b)?;
        let node = req
            .node
            .as_deref()
            .ok_or_else(|| ApiError::bad_request("node: the node's name is required"))?;
        check_node_name(node)?;
        if let Some(bound) = &rec.node {
            if bound != node {
                return Err(ApiError::forbidden(format!(
                    "the bootstrap token {id} is for node {bound:?}, not {node:?}"
                )));
            }
        }
        let ask = match rec.node {
            Some(_) => Ask::Bound { token: id, rev },
            None => Ask::Unbound { token: id, rev },
        };
        let resp = issue(&inner, node, &req.csr, ask).await?;
        tracing::info!(%node, token = %id, not_after = %resp.not_after, "node enrolled: certificate issued against a bootstrap token");
        Ok(json_response(StatusCode::OK, &json!(resp)))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `POST /v1/nodes/certificate/renew`: a new certificate for the node of the caller's.
pub async fn renew(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        authz::authorize(
            &user,
            &Attributes::other(Verb::Create, resource::NODE_CERTIFICATES)
                .subresource(Some("renew")),
        )?;
        let node = user
            .node_name()
            .ok_or_else(|| {
                ApiError::forbidden(
                    "only a node's agent renews its certificate, authenticated by it",
                )
            })?
            .to_string();
        let b = read_body(&inner, &headers, body).await?;
        let req = parse_request(&b)?;
        if req.node.as_deref().is_some_and(|n| n != node) {
            return Err(ApiError::forbidden(format!(
                "node {node:?} can renew only its own certificate, not {:?}'s",
                req.node.unwrap_or_default()
            )));
        }
        let cert = user.cert.clone().ok_or_else(|| {
            ApiError::unauthorized("a renewal is authenticated by the node's current certificate")
        })?;
        let resp = issue(
            &inner,
            &node,
            &req.csr,
            Ask::Renewal {
                serial: &cert.serial,
                not_before: cert.not_before,
                not_after: cert.not_after,
            },
        )
        .await?;
        tracing::info!(%node, not_after = %resp.not_after, "node certificate renewed");
        Ok(json_response(StatusCode::OK, &json!(resp)))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

fn admin_only(user: &UserInfo, verb: Verb) -> ApiResult<()> {
    authz::authorize(user, &Attributes::other(verb, resource::BOOTSTRAP_TOKENS))?;
    if !(user.role == Role::Admin || user.is_system()) {
        return Err(ApiError::forbidden(
            "bootstrap tokens and node certificates are for administrators",
        ));
    }
    Ok(())
}

/// Delete expired bootstrap tokens and revocations of certificates that have expired
/// anyway (best effort; run when a token is made, so the prefixes stay as small as the
/// tokens in use).
async fn sweep(backend: &Arc<dyn KvBackend>) {
    let t = now();
    for prefix in [TOKENS, REVOKED] {
        let p = Bytes::from_static(prefix.as_bytes());
        let Ok(listed) = backend
            .range(RangeRequest {
                range: KeyRange::between(p.clone(), prefix_end(&p)),
                ..Default::default()
            })
            .await
        else {
            continue;
        };
        for kv in listed.kvs {
            let expires = serde_json::from_slice::<serde_json::Value>(&kv.value)
                .ok()
                .and_then(|v| {
                    v.get(if prefix == TOKENS {
                        "expires"
                    } else {
                        "notAfter"
                    })?
                    .as_u64()
                });
            if expires.is_some_and(|e| e <= t) {
                let _ = backend
                    .txn(TxnRequest {
                        compare: vec![Compare::mod_revision(
                            kv.key.clone(),
                            CompareResult::Equal,
                            kv.mod_revision,
                        )],
                        success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                            range: KeyRange::single(kv.key.clone()),
                            prev_kv: false,
                        })],
                        failure: vec![],
                    })
                    .await;
            }
        }
    }
}

/// `POST` / `GET /v1/admin/bootstrap-tokens`.
pub async fn tokens(
    State(inner): State<Arc<Inner>>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        let backend = &inner.resources.backend;
        match method {
            Method::POST => {
                admin_only(&user, Verb::Create)?;
                let b = read_body(&inner, &headers, body).await?;
                let req: BootstrapTokenRequest = if b.iter().all(u8::is_ascii_whitespace) {
                    BootstrapTokenRequest::default()
                } else {
                    crate::parse::json_as(&b, |e| {
                        format!(
                            "invalid bootstrap token request: {e}; expected {{\"node\"?: \"NAME\", \"ttlSeconds\"?: N, \"description\"?: \"...\"}}"
                        )
                    })?
                };
                if let Some(n) = &req.node {
                    check_node_name(n)?;
                }
                let ttl = req.ttl_seconds.unwrap_or(DEFAULT_TOKEN_TTL_SECS);
                if ttl == 0 || ttl > MAX_TOKEN_TTL_SECS {
                    return Err(ApiError::bad_request(format!(
                        "ttlSeconds: {ttl} is out of range; a bootstrap token lives 1 s to {MAX_TOKEN_TTL_SECS} s (7 days)"
                    )));
                }
                sweep(backend).await;
                let (id, secret) = (random_word(6)?, random_word(16)?);
                let rec = TokenRecord {
                    secret_sha256: sha256_hex(&secret),
                    expires: now() + ttl,
                    node: req.node.clone(),
                    created_by: user.name.clone(),
                    description: req.description.clone(),
                };
                let key = Bytes::from(format!("{TOKENS}{id}"));
                let r = backend
                    .txn(TxnRequest {
                        compare: vec![Compare::create_revision(key.clone(), CompareResult::Equal, 0)],
                        success: vec![TxnOp::Put(PutRequest::new(key, to_bytes(&rec)?))],
                        failure: vec![],
                    })
                    .await?;
                if !r.succeeded {
                    return Err(ApiError::unavailable("token id collision; try again"));
                }
                tracing::info!(token = %id, node = ?req.node, by = %user.name, ttl_s = ttl, "bootstrap token created");
                let out = BootstrapToken {
                    id: id.clone(),
                    token: Some(format!("{id}.{secret}")),
                    node: rec.node,
                    expires: rfc3339(rec.expires),
                    created_by: rec.created_by,
                    description: rec.description,
                };
                Ok(json_response(StatusCode::CREATED, &json!(out)))
            }
            Method::GET => {
                admin_only(&user, Verb::List)?;
                let prefix = Bytes::from_static(TOKENS.as_bytes());
                let listed = backend
                    .range(RangeRequest {
                        range: KeyRange::between(prefix.clone(), prefix_end(&prefix)),
                        ..Default::default()
                    })
                    .await?;
                let t = now();
                let items: Vec<BootstrapToken> = listed
                    .kvs
                    .iter()
                    .filter_map(|kv| {
                        let rec: TokenRecord = serde_json::from_slice(&kv.value).ok()?;
                        let id = String::from_utf8_lossy(&kv.key[TOKENS.len()..]).to_string();
                        (rec.expires > t).then(|| BootstrapToken {
                            id,
                            token: None,
                            node: rec.node,
                            expires: rfc3339(rec.expires),
                            created_by: rec.created_by,
                            description: rec.description,
                        })
                    })
                    .collect();
                Ok(json_response(StatusCode::OK, &json!({ "items": items })))
            }
            m => Err(ApiError::method_not_allowed(format!(
                "{m} is not supported on bootstrap tokens; use POST or GET"
            ))),
        }
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `DELETE /v1/admin/bootstrap-tokens/{id}`.
pub async fn delete_token(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        admin_only(&user, Verb::Delete)?;
        let d = inner
            .resources
            .backend
            .delete_range(DeleteRangeRequest {
                range: KeyRange::single(Bytes::from(format!("{TOKENS}{id}"))),
                prev_kv: false,
            })
            .await?;
        if d.deleted == 0 {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("there is no bootstrap token {id:?}"),
            ));
        }
        Ok(json_response(StatusCode::OK, &json!({ "deleted": id })))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `POST /v1/admin/nodes/{name}/revoke`: revoke every live certificate of a node.
pub async fn revoke(
    State(inner): State<Arc<Inner>>,
    Path(node): Path<String>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        authz::authorize(
            &user,
            &Attributes::other(Verb::Delete, resource::NODE_CERTIFICATES).named(Some(&node)),
        )?;
        if !(user.role == Role::Admin || user.is_system()) {
            return Err(ApiError::forbidden(
                "revoking node certificates is for administrators",
            ));
        }
        check_node_name(&node)?;
        let backend = &inner.resources.backend;
        let key = format!("{NODES}{node}");
        let (enrolment, rev) =
            read_json::<Enrolment>(&**backend, &key)
                .await?
                .ok_or_else(|| {
                    ApiError::new(
                        404,
                        "NotFound",
                        format!("node {node:?} has no certificates to revoke"),
                    )
                })?;
        // The record stays, emptied: the name was enrolled once, so an unbound token can
        // never take it over.
        let mut success = vec![TxnOp::Put(PutRequest::new(
            Bytes::from(key.clone()),
            to_bytes(&Enrolment::default())?,
        ))];
        for c in &enrolment.certificates {
            let rec = Revoked {
                node: node.clone(),
                not_after: c.not_after,
                by: user.name.clone(),
            };
            success.push(TxnOp::Put(PutRequest::new(
                Bytes::from(format!("{REVOKED}{}", c.serial)),
                to_bytes(&rec)?,
            )));
        }
        let r = backend
            .txn(TxnRequest {
                compare: vec![Compare::mod_revision(
                    Bytes::from(key),
                    CompareResult::Equal,
                    rev,
                )],
                success,
                failure: vec![],
            })
            .await?;
        if !r.succeeded {
            return Err(ApiError::conflict(
                "nodes",
                &node,
                "its certificates changed while revoking them; try again",
            ));
        }
        let serials: Vec<&str> = enrolment
            .certificates
            .iter()
            .map(|c| c.serial.as_str())
            .collect();
        tracing::warn!(%node, by = %user.name, ?serials, "node certificates revoked");
        Ok(json_response(
            StatusCode::OK,
            &json!({ "node": node, "revoked": serials }),
        ))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}
