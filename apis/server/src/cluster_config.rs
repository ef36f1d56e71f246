//! `/v1/admin/config[/{key}]`: the cluster settings of [`lattice_apis::cluster_config`],
//! stored in the store so every API server of the cluster sees a change at once. Any
//! authenticated caller reads them; administrators change them (the last write wins: a
//! setting is one value, not an object with a resourceVersion), and each change is logged
//! with the administrator's name.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use lattice_apis::cluster_config::{self as cc, SetSetting, Setting, SettingValue};
use lattice_store::{DeleteRangeRequest, KeyRange, PutRequest};
use serde_json::{json, Value};

use crate::auth::UserInfo;
use crate::authz::{self, resource, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::{routes, Inner};

use crate::registry::settings::setting;
pub use crate::registry::settings::{max_dag_size, stored};

/// The value the server's flag gives `s`.
fn flag_value(inner: &Inner, s: &Setting) -> Value {
    match s.key {
        cc::MAX_DAG_SIZE => json!(inner.resources.max_dag_size()),
        _ => Value::Null,
    }
}

async fn value_of(inner: &Inner, s: &Setting) -> ApiResult<SettingValue> {
    let (value, source) = match stored(&*inner.resources.backend, s).await? {
        Some(v) => (v, "cluster"),
        None => (flag_value(inner, s), "server"),
    };
    Ok(SettingValue {
        key: s.key.to_string(),
        value,
        source: source.to_string(),
        description: s.description.to_string(),
    })
}

async fn admin(inner: &Inner, headers: &HeaderMap, what: &str) -> ApiResult<UserInfo> {
    let user = routes::authenticate(inner, headers).await?;
    authz::authorize(
        &user,
        &Attributes::other(Verb::Update, resource::CLUSTER_CONFIG),
    )
    .map_err(|_| ApiError::forbidden(format!("only administrators {what} cluster settings")))?;
    Ok(user)
}

/// Any caller that may read the settings (people, not nodes).
async fn reader(inner: &Inner, headers: &HeaderMap) -> ApiResult<UserInfo> {
    let user = routes::authenticate(inner, headers).await?;
    authz::authorize(
        &user,
        &Attributes::other(Verb::Get, resource::CLUSTER_CONFIG),
    )?;
    Ok(user)
}

fn answer(r: ApiResult<Value>) -> Response {
    match r {
        Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/admin/config`.
pub async fn list(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    answer(
        async {
            reader(&inner, &headers).await?;
            let mut items = Vec::new();
            for s in cc::SETTINGS {
                items.push(value_of(&inner, s).await?);
            }
            Ok(json!({ "items": items }))
        }
        .await,
    )
}

/// `GET /v1/admin/config/{key}`.
pub async fn get(
    State(inner): State<Arc<Inner>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            reader(&inner, &headers).await?;
            let s = setting(&key)?;
            Ok(json!(value_of(&inner, s).await?))
        }
        .await,
    )
}

/// `PUT /v1/admin/config/{key}` with `{"value": ...}`.
pub async fn put(
    State(inner): State<Arc<Inner>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        async {
            let user = admin(&inner, &headers, "change").await?;
            let s = setting(&key)?;
            let body = routes::read_body(&inner, &headers, body).await?;
            let req: SetSetting = crate::parse::json_as(&body, |e| {
                format!("the body must be {{\"value\": ...}}: {e}")
            })?;
            let value = s.check(&req.value).map_err(|msg| {
                ApiError::new(422, "Invalid", msg.clone()).with_details(json!({
                    "name": s.key,
                    "causes": [{"field": "value", "message": msg, "reason": "FieldValueInvalid"}],
                }))
            })?;
            let bytes = serde_json::to_vec(&value)
                .map_err(|e| ApiError::internal(format!("encode {}: {e}", s.key)))?;
            inner
                .resources
                .backend
                .put(PutRequest::new(s.store_key(), bytes))
                .await
                .map_err(|e| ApiError::unavailable(format!("cannot store {}: {e}", s.key)))?;
            tracing::info!(key = s.key, %value, user = %user.name, "cluster setting changed");
            Ok(json!(value_of(&inner, s).await?))
        }
        .await,
    )
}

/// `DELETE /v1/admin/config/{key}`: back to the server's flag.
pub async fn delete(
    State(inner): State<Arc<Inner>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let user = admin(&inner, &headers, "reset").await?;
            let s = setting(&key)?;
            inner
                .resources
                .backend
                .delete_range(DeleteRangeRequest {
                    range: KeyRange::single(s.store_key()),
                    prev_kv: false,
                })
                .await
                .map_err(|e| ApiError::unavailable(format!("cannot reset {}: {e}", s.key)))?;
            tracing::info!(key = s.key, user = %user.name, "cluster setting reset to the server's flag");
            Ok(json!(value_of(&inner, s).await?))
        }
        .await,
    )
}
