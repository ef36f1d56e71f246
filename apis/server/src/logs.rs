//! `GET /apis/lattice.dev/v1alpha1/namespaces/{ns}/allocations/{name}/log`: an
//! allocation's output, proxied (streaming) from the node agents that ran it.
//!
//! Query parameters: `stream=stdout|stderr|all`, `tailLines=N`, `sinceTime=RFC3339`,
//! `untilTime=RFC3339`, `follow=true`, `timestamps=true`, `attempt=N` (passed to the
//! agents as they are) and `node=NAME` (one node only). Authorized like a GET of the
//! allocation. The nodes are `status.assignedNodes` (or those in `status.nodeStates`
//! once the assignment was cleared); each node's agent is reached at
//! `status.agent.address` of its Node. With several nodes every line is prefixed with
//! `<node>| ` (unless `prefix=false`; `prefix=true` prefixes a single node's lines too); without `follow` the nodes come one after
//! another, with `follow` their lines interleave as they arrive (whole lines only).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::admission::{admit_connect, Connect};
use crate::authz::{self, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::routes::{authenticate, kind_by_plural};
use crate::Inner;

/// Parameters forwarded to the agents.
const FORWARDED: [&str; 7] = [
    "stream",
    "tailLines",
    "sinceTime",
    "untilTime",
    "follow",
    "timestamps",
    "attempt",
];

/// The handler.
pub async fn allocation_log(
    State(inner): State<Arc<Inner>>,
    Path((ns, name)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let resp = match serve(&inner, &ns, &name, &uri, &headers).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(path = uri.path(), error = %e, "log request failed");
            e.into_response()
        }
    };
    inner.metrics.observe(
        "log",
        "Allocation",
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

/// Check the parameters (so a typo is a 400 here, not on every agent).
fn check(params: &[(String, String)]) -> ApiResult<()> {
    for (k, v) in params {
        let ok = match k.as_str() {
            "follow" | "timestamps" | "prefix" => {
                matches!(v.as_str(), "" | "true" | "false" | "1" | "0")
            }
            "tailLines" => {
                crate::ranges::optional(k, Some(v.as_str()), &crate::ranges::TAIL_LINES)?;
                true
            }
            "attempt" => {
                crate::ranges::optional(k, Some(v.as_str()), &crate::ranges::ATTEMPT)?;
                true
            }
            "sinceTime" | "untilTime" => {
                v.is_empty() || chrono::DateTime::parse_from_rfc3339(v).is_ok()
            }
            "stream" => matches!(v.as_str(), "" | "all" | "stdout" | "stderr"),
            "node" => !v.is_empty(),
            _ => true,
        };
        if !ok {
            let want = match k.as_str() {
                "follow" | "timestamps" | "prefix" => "true or false",
                "sinceTime" | "untilTime" => "an RFC 3339 time such as 2026-03-01T10:00:00Z",
                "stream" => "stdout, stderr or all",
                _ => "a node name",
            };
            return Err(ApiError::bad_request(format!(
                "{k} must be {want}, got {v:?}"
            )));
        }
    }
    let time = |k: &str| {
        params
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| chrono::DateTime::parse_from_rfc3339(v).ok())
    };
    if let (Some(since), Some(until)) = (time("sinceTime"), time("untilTime")) {
        if until < since {
            return Err(ApiError::bad_request(format!(
                "untilTime ({until}) is before sinceTime ({since})"
            )));
        }
    }
    Ok(())
}

/// The nodes an allocation ran on: `status.assignedNodes`, else `status.nodeStates`.
fn nodes_of(alloc: &Value) -> Vec<String> {
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let assigned = strings(alloc.pointer("/status/assignedNodes"));
    if !assigned.is_empty() {
        return assigned;
    }
    alloc
        .pointer("/status/nodeStates")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

async fn serve(
    inner: &Arc<Inner>,
    ns: &str,
    name: &str,
    uri: &Uri,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let user = authenticate(inner, headers).await?;
    let allocations = kind_by_plural("allocations")
        .ok_or_else(|| ApiError::internal("the Allocation kind is not registered"))?;
    let nodes_kind = kind_by_plural("nodes")
        .ok_or_else(|| ApiError::internal("the Node kind is not registered"))?;
    authz::authorize(
        &user,
        &Attributes::kind(Verb::Connect, allocations, Some(ns))
            .named(Some(name))
            .subresource(Some("log")),
    )?;
    let params = match Query::<Vec<(String, String)>>::try_from_uri(uri) {
        Ok(Query(v)) => v,
        Err(e) => return Err(ApiError::bad_request(format!("invalid query string: {e}"))),
    };
    check(&params)?;
    // Held by the response's body: the stream counts until the client has it all or leaves.
    let slot = inner
        .limiter
        .acquire(&user, crate::limits::Session::LogStream)?;
    let get = |k: &str| {
        params
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let follow = matches!(get("follow"), Some("true" | "1" | ""));
    let prefixed = !matches!(get("prefix"), Some("false" | "0"));
    let always_prefixed = matches!(get("prefix"), Some("true" | "1"));
    let forwarded: Vec<(String, String)> = FORWARDED
        .iter()
        .filter_map(|k| get(k).map(|v| (k.to_string(), v.to_string())))
        .collect();

    let alloc = inner.resources.get(allocations, Some(ns), name).await?;
    admit_connect(&inner.resources, &user, &alloc, Connect::Logs).await?;
    crate::audit::sensitive_access(inner, &user, &alloc, "log", &format!("GET {uri}")).await?;
    let all = nodes_of(&alloc);
    let selected: Vec<String> = match get("node") {
        Some(n) if all.iter().any(|x| x == n) => vec![n.to_string()],
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "allocation {name} did not run on node {n:?}; its nodes are {all:?}"
            )))
        }
        None => all,
    };
    if selected.is_empty() {
        return Err(ApiError::bad_request(format!(
            "allocation {name} has not been placed on a node yet, so it has no logs"
        )));
    }

    let mut upstreams = Vec::new();
    let mut missing = Vec::new();
    for node in &selected {
        let obj = match inner.resources.get(nodes_kind, None, node).await {
            Ok(v) => v,
            Err(e) if e.code == 404 => {
                return Err(ApiError::unavailable(format!(
                    "node {node} is not registered, so its agent cannot be reached"
                )))
            }
            Err(e) => return Err(e),
        };
        let Some(addr) = obj
            .pointer("/status/agent/address")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
        else {
            return Err(ApiError::unavailable(format!(
                "node {node} has no agent address (its agent never registered)"
            )));
        };
        let url = inner
            .agents
            .url(node, addr, &format!("/logs/{ns}/{name}"))
            .await?;
        let uid = alloc
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let resp = inner
            .agents
            .http()
            .get(&url)
            .query(&forwarded)
            .query(&[("uid", uid)])
            .send()
            .await
            .map_err(|e| {
                ApiError::unavailable(format!(
                    "the agent of node {node} at {addr} is unreachable: {}",
                    crate::agents::describe(&e)
                ))
            })?;
        let status = resp.status();
        if status.is_success() {
            upstreams.push((node.clone(), resp));
            continue;
        }
        let body = resp.text().await.unwrap_or_default();
        let msg = format!("node {node}: {}", body.trim());
        match status.as_u16() {
            // Several nodes: one that has nothing (yet) does not spoil the others.
            404 if selected.len() > 1 => missing.push(msg),
            404 => return Err(ApiError::new(404, "NotFound", msg)),
            400 => return Err(ApiError::bad_request(msg)),
            _ => return Err(ApiError::unavailable(msg)),
        }
    }
    if upstreams.is_empty() {
        return Err(ApiError::new(404, "NotFound", missing.join("; ")));
    }

    let body = if upstreams.len() == 1 && selected.len() == 1 && !always_prefixed {
        let (_, resp) = upstreams.remove(0);
        Body::from_stream(resp.bytes_stream())
    } else {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        if follow {
            for (node, resp) in upstreams {
                let tx = tx.clone();
                let prefix = if prefixed {
                    format!("{node}| ")
                } else {
                    String::new()
                };
                tokio::spawn(async move { prefix_lines(&node, &prefix, resp, &tx).await });
            }
        } else {
            tokio::spawn(async move {
                for (node, resp) in upstreams {
                    let prefix = if prefixed {
                        format!("{node}| ")
                    } else {
                        String::new()
                    };
                    if !prefix_lines(&node, &prefix, resp, &tx).await {
                        return;
                    }
                }
            });
        }
        Body::from_stream(ReceiverStream::new(rx))
    };
    let body = Body::from_stream(body.into_data_stream().map(move |chunk| {
        let _held = &slot;
        chunk
    }));
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r.into_response())
}

/// Copy `resp` (from `node`) to `tx` in whole lines, each prefixed with `prefix`. False
/// once the client is gone.
async fn prefix_lines(
    node: &str,
    prefix: &str,
    resp: reqwest::Response,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> bool {
    let mut stream = resp.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(node, error = %e, "log stream from the agent broke off");
                break;
            }
        };
        pending.extend_from_slice(&chunk);
        let Some(last_nl) = pending.iter().rposition(|&b| b == b'\n') else {
            continue;
        };
        let rest = pending.split_off(last_nl + 1);
        let mut out = Vec::with_capacity(pending.len() + 16);
        for line in pending.split_inclusive(|&b| b == b'\n') {
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(line);
        }
        pending = rest;
        if tx.send(Ok(Bytes::from(out))).await.is_err() {
            return false;
        }
    }
    if !pending.is_empty() {
        let mut out = prefix.as_bytes().to_vec();
        out.extend_from_slice(&pending);
        out.push(b'\n');
        if tx.send(Ok(Bytes::from(out))).await.is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parameters_are_checked() {
        assert!(check(&p(&[
            ("follow", "true"),
            ("tailLines", "5"),
            ("stream", "stderr")
        ]))
        .is_ok());
        assert_eq!(check(&p(&[("tailLines", "x")])).unwrap_err().code, 400);
        assert_eq!(check(&p(&[("sinceTime", "noon")])).unwrap_err().code, 400);
        assert_eq!(check(&p(&[("stream", "stdin")])).unwrap_err().code, 400);
        assert_eq!(check(&p(&[("follow", "yes")])).unwrap_err().code, 400);
    }

    #[test]
    fn nodes_from_assignment_or_reports() {
        assert_eq!(
            nodes_of(&json!({"status": {"assignedNodes": ["a", "b"], "nodeStates": {"c": {}}}})),
            vec!["a", "b"]
        );
        assert_eq!(
            nodes_of(&json!({"status": {"nodeStates": {"c": {}, "d": {}}}})),
            vec!["c", "d"]
        );
        assert!(nodes_of(&json!({})).is_empty());
    }
}
