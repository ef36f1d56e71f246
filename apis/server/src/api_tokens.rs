//! API tokens for automation (GitOps bots, site controllers, CI) and people without an
//! identity provider: `lattice admin token create --user NAME [--tenant T] [--role R]
//! [--ttl D]`. A token names a user (an automation account: `ServiceAccount` subjects of
//! bindings match it), optionally a role it holds (in one tenant or cluster-wide) and
//! groups, and expires.
//!
//! Kept in the store under `/lattice/apitokens/<id>` (a system key, never reachable
//! through the resource routes): the SHA-256 of the secret, never the secret. Every API
//! server keeps the records in memory from a watch ([`Tokens`]), and checks a token on
//! every request, so a revocation (the record deleted) takes effect on every server as
//! soon as its watch delivers it. A token is `lt_<id>_<secret>`; the id is what `list`
//! shows and `revoke` takes.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lattice_apis::kinds::rbac::builtin;
use lattice_store::{
    Compare, CompareResult, DeleteRangeRequest, KeyRange, PutRequest, TxnOp, TxnRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::{Role, UserInfo};
use crate::authz::{self, resource, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::node_identity::{now, random_word, read_json, rfc3339, sha256_hex, to_bytes};
use crate::rbac::{self, Grant};
use crate::registry::follow::Follower;
use crate::routes::{json_response, read_body};
use crate::Inner;

/// Where the records are kept.
const PREFIX: &str = "/lattice/apitokens/";
/// What every API token starts with.
pub const TOKEN_PREFIX: &str = "lt_";
/// Lifetime when none is asked for.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest lifetime.
pub const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// One token as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
    secret_sha256: String,
    created: u64,
    expires: u64,
    created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

/// `POST /v1/admin/tokens`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateRequest {
    user: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    ttl_seconds: Option<u64>,
    #[serde(default)]
    description: Option<String>,
}

/// The records, kept from the store (one per API server).
#[derive(Clone)]
pub struct Tokens {
    records: Follower,
}

impl Default for Tokens {
    fn default() -> Self {
        Self {
            records: Follower::new(PREFIX),
        }
    }
}

fn unauthorized(why: &str) -> ApiError {
    ApiError::unauthorized(format!("invalid API token: {why}"))
}

/// `lt_<id>_<secret>` → (id, secret).
fn split(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    (ok(id, 32) && ok(secret, 128)).then_some((id, secret))
}

/// The caller an API token in `headers` names; `Ok(None)` when the request carries no
/// API token (another kind of credential, or none).
pub async fn authenticate(inner: &Inner, headers: &HeaderMap) -> ApiResult<Option<UserInfo>> {
    let Some(token) = crate::auth::bearer_token(headers)
        .ok()
        .flatten()
        .filter(|t| t.starts_with(TOKEN_PREFIX))
    else {
        return Ok(None);
    };
    let (id, secret) = split(token).ok_or_else(|| unauthorized("malformed"))?;
    let tokens = &inner.api_tokens.records;
    let backend = &inner.resources.backend;
    tokens.start(backend);
    let key = format!("{PREFIX}{id}");
    // The in-memory copy when it is current; the store otherwise: while the copy is not
    // (a revocation must not be missed), and for a token it does not hold (one made a
    // moment ago through another server may not have reached it yet).
    let cached = if tokens.synced() {
        tokens.get(key.as_bytes())
    } else {
        None
    };
    let raw = match cached {
        Some(v) => Some(v),
        None => backend
            .get(Bytes::from(key.clone()))
            .await?
            .map(|kv| kv.value),
    };
    let rec: Record = raw
        .and_then(|v| serde_json::from_slice(&v).ok())
        .ok_or_else(|| unauthorized("unknown or revoked"))?;
    // Hashes are compared, not secrets: the time a comparison takes says something of the
    // hash of a guess only.
    if sha256_hex(secret) != rec.secret_sha256 {
        return Err(unauthorized("unknown or revoked"));
    }
    if rec.expires <= now() {
        return Err(unauthorized(&format!(
            "token {id} of {:?} expired at {}; ask an administrator for a new one",
            rec.user,
            rfc3339(rec.expires)
        )));
    }
    let grants: Vec<Grant> = rec
        .role
        .as_deref()
        .and_then(|r| rbac::builtin_grant(r, rec.tenant.as_deref()))
        .into_iter()
        .collect();
    let grants = match (grants.is_empty(), &rec.role) {
        // A ClusterRole of the store: its rules as they are now.
        (true, Some(role)) => stored_role_grant(inner, role, rec.tenant.as_deref())
            .await?
            .into_iter()
            .collect(),
        _ => grants,
    };
    Ok(Some(UserInfo {
        name: rec.user,
        tenants: Some(rec.tenant.into_iter().collect()),
        role: Role::Readonly,
        expires: Some(rec.expires),
        groups: rec.groups,
        service_account: true,
        grants: Arc::new(grants),
        ..Default::default()
    }))
}

/// A ClusterRole of the store, held in `tenant` (or cluster-wide); `None` when it is gone.
async fn stored_role_grant(
    inner: &Inner,
    role: &str,
    tenant: Option<&str>,
) -> ApiResult<Option<Grant>> {
    let k = crate::routes::kind_by_plural("clusterroles")
        .ok_or_else(|| ApiError::internal("clusterroles not registered"))?;
    let obj = match inner.resources.trusted().get(k, None, role).await {
        Ok(o) => o,
        Err(e) if e.code == 404 => return Ok(None),
        Err(e) => return Err(e),
    };
    let rules = obj
        .get("rules")
        .cloned()
        .and_then(|r| serde_json::from_value(r).ok())
        .unwrap_or_default();
    Ok(Some(Grant {
        role: role.to_string(),
        tenant: tenant.map(str::to_string),
        rules: Arc::new(rules),
        builtin: false,
    }))
}

fn check_user_name(name: &str) -> ApiResult<()> {
    if name.is_empty()
        || name.len() > 253
        || name.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(ApiError::bad_request(format!(
            "user: {name:?} is not a user name (1 to 253 characters, no spaces)"
        )));
    }
    if name.starts_with("system:") {
        return Err(ApiError::bad_request(format!(
            "user: {name:?}: names starting with system: are the system's (controllers and \
             nodes authenticate with certificates)"
        )));
    }
    Ok(())
}

fn view(id: &str, rec: &Record) -> serde_json::Value {
    json!({
        "id": id,
        "user": rec.user,
        "tenant": rec.tenant,
        "role": rec.role,
        "groups": rec.groups,
        "created": rfc3339(rec.created),
        "expires": rfc3339(rec.expires),
        "expired": rec.expires <= now(),
        "createdBy": rec.created_by,
        "description": rec.description,
    })
}

/// `POST` / `GET` / `DELETE ?user=NAME` on `/v1/admin/tokens`.
pub async fn tokens(
    State(inner): State<Arc<Inner>>,
    method: Method,
    Query(q): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        match method {
            Method::POST => {
                authz::authorize(
                    &user,
                    &Attributes::other(Verb::Create, resource::API_TOKENS),
                )?;
                let b = read_body(&inner, &headers, body).await?;
                let req: CreateRequest = crate::parse::json_as(&b, |e| {
                    format!(
                        "invalid token request: {e}; expected {{\"user\": \"NAME\", \
                         \"tenant\"?: \"T\", \"role\"?: \"R\", \"groups\"?: [..], \
                         \"ttlSeconds\"?: N, \"description\"?: \"...\"}}"
                    )
                })?;
                create(&inner, &user, req).await
            }
            Method::GET => {
                authz::authorize(&user, &Attributes::other(Verb::List, resource::API_TOKENS))?;
                let items = list(&inner).await?;
                let items: Vec<_> = items
                    .iter()
                    .filter(|(_, r)| q.get("user").is_none_or(|u| *u == r.user))
                    .map(|(id, r)| view(id, r))
                    .collect();
                Ok(json_response(StatusCode::OK, &json!({ "items": items })))
            }
            Method::DELETE => {
                let who = q.get("user").ok_or_else(|| {
                    ApiError::bad_request(
                        "name the tokens to revoke: DELETE /v1/admin/tokens/ID or \
                         /v1/admin/tokens?user=NAME",
                    )
                })?;
                authz::authorize(
                    &user,
                    &Attributes::other(Verb::Delete, resource::API_TOKENS),
                )?;
                let ids: Vec<String> = list(&inner)
                    .await?
                    .into_iter()
                    .filter(|(_, r)| &r.user == who)
                    .map(|(id, _)| id)
                    .collect();
                for id in &ids {
                    revoke(&inner, &user, id).await?;
                }
                Ok(json_response(StatusCode::OK, &json!({ "revoked": ids })))
            }
            _ => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "use GET, POST or DELETE",
            )),
        }
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `DELETE /v1/admin/tokens/{id}`.
pub async fn delete(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        authz::authorize(
            &user,
            &Attributes::other(Verb::Delete, resource::API_TOKENS).named(Some(&id)),
        )?;
        if !revoke(&inner, &user, &id).await? {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("no API token {id:?} (lattice admin token list shows them)"),
            ));
        }
        Ok(json_response(StatusCode::OK, &json!({ "revoked": [id] })))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

async fn list(inner: &Inner) -> ApiResult<Vec<(String, Record)>> {
    let p = Bytes::from_static(PREFIX.as_bytes());
    let listed = inner
        .resources
        .backend
        .range(lattice_store::RangeRequest {
            range: KeyRange::prefix(p.clone()),
            ..Default::default()
        })
        .await?;
    Ok(listed
        .kvs
        .iter()
        .filter_map(|kv| {
            let id = std::str::from_utf8(&kv.key).ok()?.strip_prefix(PREFIX)?;
            Some((id.to_string(), serde_json::from_slice(&kv.value).ok()?))
        })
        .collect())
}

/// Deletes token `id`; whether it existed.
async fn revoke(inner: &Inner, by: &UserInfo, id: &str) -> ApiResult<bool> {
    let key = Bytes::from(format!("{PREFIX}{id}"));
    let r = inner
        .resources
        .backend
        .txn(TxnRequest {
            compare: vec![],
            success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single(key),
                prev_kv: true,
            })],
            failure: vec![],
        })
        .await?;
    let deleted = r.responses.iter().any(|resp| match resp {
        lattice_store::TxnOpResponse::DeleteRange(d) => d.deleted > 0,
        _ => false,
    });
    if deleted {
        tracing::warn!(token = %id, by = %by.name, "API token revoked");
    }
    Ok(deleted)
}

async fn create(inner: &Inner, caller: &UserInfo, req: CreateRequest) -> ApiResult<Response> {
    check_user_name(&req.user)?;
    if let Some(t) = &req.tenant {
        if let Some(e) = lattice_apis::validation::validate_dns1123_label("tenant", t) {
            return Err(ApiError::bad_request(e.to_string()));
        }
    }
    for g in &req.groups {
        if g.is_empty() || g.len() > 253 || g.starts_with("system:") {
            return Err(ApiError::bad_request(format!(
                "groups: {g:?} is not a group a token may carry (1 to 253 characters, not \
                 system:)"
            )));
        }
    }
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_TTL.as_secs());
    if ttl == 0 || ttl > MAX_TTL.as_secs() {
        return Err(ApiError::bad_request(format!(
            "ttlSeconds: {ttl} is out of range; an API token lives 1 s to {} s (366 days)",
            MAX_TTL.as_secs()
        )));
    }
    // A token acts as its user and in its groups: for anyone but oneself, or in a group,
    // that takes `impersonate` on that user or group (administrators).
    if !caller.is_system() {
        if req.user != caller.name {
            authz::authorize(
                caller,
                &Attributes::other(Verb::Impersonate, resource::USERS).named(Some(&req.user)),
            )?;
        }
        for g in &req.groups {
            authz::authorize(
                caller,
                &Attributes::other(Verb::Impersonate, resource::GROUPS).named(Some(g)),
            )?;
        }
    }
    // The role must exist, and the caller must hold all of it where the token would.
    if let Some(role) = &req.role {
        let grant = match rbac::builtin_grant(role, req.tenant.as_deref()) {
            Some(g) => Some(g),
            None => stored_role_grant(inner, role, req.tenant.as_deref()).await?,
        };
        let grant = grant.ok_or_else(|| {
            ApiError::bad_request(format!(
                "role: there is no ClusterRole {role:?} (built in: {}; lattice get clusterroles \
                 lists the rest)",
                builtin::CLUSTER_ROLES.join(", ")
            ))
        })?;
        let held: Vec<Grant> = rbac::all_grants(caller).collect();
        if !caller.is_system() {
            rbac::covers(&held, req.tenant.as_deref(), &grant.rules).map_err(|missing| {
                ApiError::forbidden(format!(
                    "user {:?} cannot issue a token with role {role:?}: it does not hold {missing} \
                     (nobody grants more than they hold)",
                    caller.name
                ))
            })?;
        }
    }
    let (id, secret) = (random_word(12)?, random_word(40)?);
    let created = now();
    let rec = Record {
        user: req.user,
        tenant: req.tenant,
        role: req.role,
        groups: req.groups,
        secret_sha256: sha256_hex(&secret),
        created,
        expires: created + ttl,
        created_by: caller.name.clone(),
        description: req.description,
    };
    let key = Bytes::from(format!("{PREFIX}{id}"));
    let r = inner
        .resources
        .backend
        .txn(TxnRequest {
            compare: vec![Compare::create_revision(
                key.clone(),
                CompareResult::Equal,
                0,
            )],
            success: vec![TxnOp::Put(PutRequest::new(key, to_bytes(&rec)?))],
            failure: vec![],
        })
        .await?;
    if !r.succeeded {
        return Err(ApiError::unavailable("token id collision; try again"));
    }
    tracing::info!(token = %id, user = %rec.user, tenant = ?rec.tenant, role = ?rec.role, by = %caller.name, ttl_s = ttl, "API token created");
    let mut v = view(&id, &rec);
    v["token"] = json!(format!("{TOKEN_PREFIX}{id}_{secret}"));
    Ok(json_response(StatusCode::CREATED, &v))
}

/// Whether the stored record of `id` exists (tests).
#[doc(hidden)]
pub async fn exists(inner: &Inner, id: &str) -> ApiResult<bool> {
    Ok(
        read_json::<serde_json::Value>(&*inner.resources.backend, &format!("{PREFIX}{id}"))
            .await?
            .is_some(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_into_id_and_secret() {
        assert_eq!(split("lt_abc_def"), Some(("abc", "def")));
        for bad in [
            "lt_",
            "lt_abc",
            "lt__def",
            "lt_abc_",
            "xx_abc_def",
            "lt_a/b_c",
            "lt_a_b c",
        ] {
            assert_eq!(split(bad), None, "{bad}");
        }
    }
}
