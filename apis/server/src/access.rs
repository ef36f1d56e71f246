//! `POST /v1/auth/can-i` (what `lattice auth can-i` asks) and `GET /v1/auth/whoami`: the
//! authorizer's answer for the caller, or, with `as`, for another user (which needs
//! `impersonate` on `users`); and `GET /v1/auth/discovery` (public): which identity
//! providers `lattice login` may log in with.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::auth::{Role, UserInfo};
use crate::authz::{self, resource, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::rbac;
use crate::routes::{json_response, read_body};
use crate::Inner;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CanIRequest {
    verb: String,
    resource: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    name: Option<String>,
    /// Ask for this user instead of the caller.
    #[serde(default, rename = "as")]
    as_user: Option<String>,
    /// ... in these groups.
    #[serde(default)]
    as_groups: Vec<String>,
}

fn parse_verb(v: &str) -> ApiResult<Verb> {
    Verb::from_rule_word(v).ok_or_else(|| {
        ApiError::bad_request(format!(
            "verb: unknown verb {v:?}; use one of {}",
            lattice_apis::kinds::rbac::VERBS.join(", ")
        ))
    })
}

/// What a grant list looks like in answers.
fn shown(user: &UserInfo) -> Vec<String> {
    rbac::all_grants(user).map(|g| g.to_string()).collect()
}

/// `POST /v1/auth/can-i`.
pub async fn can_i(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let caller = crate::routes::authenticate(&inner, &headers).await?;
        let b = read_body(&inner, &headers, body).await?;
        let req: CanIRequest = crate::parse::json_as(&b, |e| {
            format!(
                "invalid request: {e}; expected {{\"verb\": \"get\", \"resource\": \
                 \"allocations[/log]\", \"tenant\"?: \"T\", \"name\"?: \"N\", \"as\"?: \"USER\"}}"
            )
        })?;
        let verb = parse_verb(&req.verb)?;
        let (res, sub) = match req.resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (req.resource.as_str(), None),
        };
        let (plural, namespaced): (&str, bool) = match lattice_apis::find_kind(res) {
            Some(k) => (k.plural, k.namespaced),
            None => match lattice_apis::kinds::rbac::NON_KIND_RESOURCES
                .iter()
                .find(|r| **r == res)
            {
                Some(r) => (r, false),
                None => {
                    return Err(ApiError::bad_request(format!(
                        "resource: unknown resource {res:?}; use a kind (allocations, dags, \
                         nodes, ...) or one of {}",
                        lattice_apis::kinds::rbac::NON_KIND_RESOURCES.join(", ")
                    )))
                }
            },
        };
        let subject = match &req.as_user {
            None => caller.clone(),
            Some(who) => {
                authz::authorize(
                    &caller,
                    &Attributes::other(Verb::Impersonate, resource::USERS).named(Some(who)),
                )?;
                let mut u = UserInfo {
                    name: who.clone(),
                    tenants: Some(Vec::new()),
                    role: Role::Readonly,
                    groups: req.as_groups.clone(),
                    ..Default::default()
                };
                if inner.config.auth {
                    inner.rbac.ready(&inner.resources.backend).await?;
                    inner.rbac.resolve(&mut u);
                }
                u
            }
        };
        let a = Attributes {
            verb,
            resource: plural,
            namespaced,
            subresource: sub,
            namespace: req.tenant.as_deref().filter(|_| namespaced),
            name: req.name.as_deref(),
            field_selector: None,
        };
        let answer = authz::authorize(&subject, &a);
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "allowed": answer.is_ok(),
                "reason": answer.err().map(|e| e.message),
                "user": subject.name,
                "roles": shown(&subject),
            }),
        ))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// Where `lattice login` learns the identity providers (public).
pub const DISCOVERY_PATH: &str = "/v1/auth/discovery";
/// The same, where the product documentation puts it.
pub const SEED_DISCOVERY_PATH: &str = "/api/v1/auth/discovery";

/// `GET /v1/auth/discovery`: `{issuers: [{issuer, clientId}], issuer, client_id,
/// idp_url}` (the last three: the first issuer, in the product documentation's names).
pub async fn discovery(State(inner): State<Arc<Inner>>) -> Response {
    let issuers: Vec<_> = inner
        .authenticator
        .oidc_issuers()
        .into_iter()
        .map(|i| {
            let client = i.client_id.clone().or_else(|| i.audiences.first().cloned());
            json!({"issuer": i.issuer, "clientId": client, "scopes": i.scopes})
        })
        .collect();
    let first = issuers.first().cloned().unwrap_or(json!({}));
    json_response(
        StatusCode::OK,
        &json!({
            "issuers": issuers,
            "issuer": first.get("issuer"),
            "idp_url": first.get("issuer"),
            "client_id": first.get("clientId"),
        }),
    )
}

/// `GET /v1/auth/whoami`.
pub async fn whoami(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    let r = async {
        let u = crate::routes::authenticate(&inner, &headers).await?;
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "user": u.name,
                "groups": u.groups,
                "tenants": u.tenants,
                "roles": shown(&u),
                "serviceAccount": u.service_account,
                "expires": u.expires.map(crate::node_identity::rfc3339),
                "system": u.is_system() || u.role == Role::Node,
            }),
        ))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}
