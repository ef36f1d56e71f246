//! `POST .../namespaces/{ns}/allocations/{name}/report`: a node's report on an allocation
//! bound to it ([`lattice_apis::lifecycle::NodeReport`]). The server applies
//! `lifecycle::record_node_state` to the stored allocation inside a guarded write (and
//! retries a lost race), so the phase is always derived from every node's latest report,
//! and a node's agent writes its own report and nothing else of the status: not the
//! phase, not the nodes, not the walltime, not another node's report.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use lattice_apis::lifecycle::{record_node_state, NodeReport, REPORT_SUBRESOURCE};
use lattice_apis::Allocation;
use serde_json::{json, Value};

use crate::authz::{self, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::resources::WriteOptions;
use crate::routes::{authenticate, json_response, kind_by_plural, read_body};
use crate::Inner;

/// Lost races retried before answering 409.
const RETRIES: usize = 32;

/// The handler.
pub async fn report(
    State(inner): State<Arc<Inner>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let r = serve(&inner, &ns, &name, &headers, body).await;
    let resp = r.unwrap_or_else(|e| e.into_response());
    inner.metrics.observe(
        "report",
        "Allocation",
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

async fn serve(
    inner: &Inner,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let user = authenticate(inner, headers).await?;
    let k = kind_by_plural("allocations")
        .ok_or_else(|| ApiError::internal("allocations not registered"))?;
    authz::authorize(
        &user,
        &Attributes::kind(Verb::Update, k, Some(ns))
            .named(Some(name))
            .subresource(Some(REPORT_SUBRESOURCE)),
    )?;
    let b = read_body(inner, headers, body).await?;
    let r: NodeReport = serde_json::from_slice(&b).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid node report: {e}; expected {{\"node\": \"NAME\", \"uid\": \"UID\", \"report\": {{\"phase\": ..., \"attempt\": N, ...}}}}"
        ))
    })?;
    if let Some(me) = user.node_name() {
        if r.node != me {
            return Err(ApiError::forbidden(format!(
                "node {me:?} reports for itself only, not for node {:?}",
                r.node
            )));
        }
    }
    let res = inner.resources.trusted();
    for _ in 0..RETRIES {
        let obj = match res.get(k, Some(ns), name).await {
            Ok(o) => o,
            Err(e) if e.code == 404 => {
                return Err(ApiError::not_found(k.kind, k.plural, name));
            }
            Err(e) => return Err(e),
        };
        // A node learns nothing of allocations not bound to it (404, as for a read), not
        // even whether one of that name exists.
        if !authz::node_may_see(&r.node, &obj) {
            return Err(ApiError::not_found(k.kind, k.plural, name));
        }
        if obj.pointer("/metadata/uid").and_then(Value::as_str) != Some(r.uid.as_str()) {
            return Err(ApiError::conflict(
                k.plural,
                name,
                format!(
                    "it is not the allocation with uid {} (it was replaced)",
                    r.uid
                ),
            ));
        }
        let mut a: Allocation = serde_json::from_value(obj)
            .map_err(|e| ApiError::internal(format!("a stored Allocation does not decode: {e}")))?;
        if !record_node_state(&mut a, &r.node, r.report.clone(), lattice_apis::meta::now()) {
            // A duplicate, a stale attempt, or a node no longer bound: nothing to record.
            return Ok(json_response(StatusCode::OK, &json!({"recorded": false})));
        }
        let v = serde_json::to_value(&a).map_err(|e| ApiError::internal(e.to_string()))?;
        match res
            .replace(
                k,
                Some(ns),
                name,
                v,
                Some("status"),
                &WriteOptions::default(),
            )
            .await
        {
            Ok(_) => return Ok(json_response(StatusCode::OK, &json!({"recorded": true}))),
            Err(e) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::conflict(
        k.plural,
        name,
        "too many concurrent writers; try again",
    ))
}
