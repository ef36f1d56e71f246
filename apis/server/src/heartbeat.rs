//! `POST /apis/lattice.dev/v1alpha1/nodes/{name}/heartbeat`: the node agents' heartbeat
//! stream.
//!
//! A heartbeat must cost the control plane almost nothing (the seed: 10,000 agents under
//! 1% of one core), so it is not a write. An agent opens one long-lived request and sends
//! one line per interval, its heartbeat sequence number in decimal (`"41\n"`). When the
//! stream opens, the server writes the node's `Lease` `lattice-node-lease/<node>` once,
//! attached to a store lease whose TTL is the heartbeat timeout; every line then renews
//! that store lease, which the Raft leader keeps in memory (no log entry, no fsync). When
//! the agent goes quiet for the TTL the store deletes the Lease object, and the node
//! lifecycle controller sees the deletion as "heartbeat lost".
//!
//! * Sequence numbers must increase: the opening `?sequence=N` must be above the one the
//!   Lease carries and the last one this server saw for the node (409 otherwise: a
//!   replayed stream, or two agents with one node ID), and a line that does not
//!   increase it is counted as a replay and ignored (it does not keep the stream open).
//! * Renewals failing for a whole TTL end the session (`RenewFailed`), and once per TTL
//!   the session checks that the Lease still exists on its store lease (`LeaseLost`).
//! * At most one renewal per [`MIN_RENEW_SPACING`] per stream (heartbeat storms are
//!   coalesced).
//! * The response is a stream too: headers at once (`X-Lattice-Heartbeat-Ttl-Seconds`),
//!   then, when the server ends the session (lease lost, stream idle for a TTL, shutdown),
//!   one JSON line saying why. The agent reconnects whenever the response ends.
//!
//! Authorized like a write of Leases in `lattice-node-lease`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use lattice_apis::{
    KindInfo, Lease, LeaseSpec, HEARTBEAT_SEQUENCE_ANNOTATION, NODE_LEASE_NAMESPACE,
    STORE_LEASE_ANNOTATION,
};
use lattice_store::{Compare, CompareResult, PutRequest, StoreError, TxnOp, TxnRequest};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::{authorize, Access};
use crate::errors::{ApiError, ApiResult};
use crate::objects::{admit, decode_kv, encode, meta_mut, now_rfc3339, object_key};
use crate::routes::{authenticate, kind_by_plural, Params};
use crate::Inner;

/// Renewals closer together than this on one stream are coalesced into one.
pub const MIN_RENEW_SPACING: Duration = Duration::from_millis(200);
/// Longest line accepted (a sequence number is at most 20 digits).
const MAX_LINE: usize = 32;
/// Response header carrying the heartbeat TTL.
pub const TTL_HEADER: &str = "x-lattice-heartbeat-ttl-seconds";

/// The last sequence number accepted per node, shared by every stream of this server
/// (a replayed or duplicated stream cannot go back).
#[derive(Default)]
pub struct Sequences {
    last: Mutex<HashMap<String, u64>>,
}

impl Sequences {
    /// Accept `seq` for `node` if it is above everything seen; false for a replay.
    fn advance(&self, node: &str, seq: u64) -> bool {
        let Ok(mut g) = self.last.lock() else {
            return false;
        };
        match g.get_mut(node) {
            Some(last) if *last >= seq => false,
            Some(last) => {
                *last = seq;
                true
            }
            None => {
                g.insert(node.to_string(), seq);
                true
            }
        }
    }

    fn last(&self, node: &str) -> u64 {
        self.last
            .lock()
            .ok()
            .and_then(|g| g.get(node).copied())
            .unwrap_or(0)
    }
}

/// The handler.
pub async fn node_heartbeat(
    State(inner): State<Arc<Inner>>,
    Path(node): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let resp = match open(&inner, &node, &uri, &headers).await {
        Ok((lease, first)) => {
            let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(1);
            tokio::spawn(session(inner.clone(), node, lease, first, body, tx));
            let mut resp = Response::new(Body::from_stream(ReceiverStream::new(rx)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
            if let Ok(v) = HeaderValue::from_str(&inner.config.heartbeat_ttl.as_secs().to_string())
            {
                resp.headers_mut().insert(TTL_HEADER, v);
            }
            resp
        }
        Err(e) => {
            tracing::debug!(node, error = %e, "heartbeat stream refused");
            e.into_response()
        }
    };
    inner.metrics.observe(
        "heartbeat",
        "Lease",
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

fn lease_kind() -> ApiResult<&'static KindInfo> {
    kind_by_plural("leases").ok_or_else(|| ApiError::internal("the Lease kind is not registered"))
}

/// Authorize, check the opening sequence, and write the node's Lease attached to a live
/// store lease. Returns the store lease ID and the opening sequence.
async fn open(inner: &Inner, node: &str, uri: &Uri, headers: &HeaderMap) -> ApiResult<(i64, u64)> {
    let user = authenticate(inner, headers).await?;
    let kind = lease_kind()?;
    authorize(&user, Access::Write, kind, Some(NODE_LEASE_NAMESPACE))?;
    let params = Params::from_uri(uri)?;
    let first: u64 = match params.get("sequence") {
        Some(s) => s.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "sequence={s:?} is not a number: send the agent's next heartbeat sequence number"
            ))
        })?,
        None => {
            return Err(ApiError::bad_request(
                "the query parameter `sequence` is required: the agent's next heartbeat sequence number",
            ))
        }
    };
    let ttl = inner.config.heartbeat_ttl.as_secs().max(1) as i64;
    let backend = &inner.resources.backend;
    let key = object_key(kind, Some(NODE_LEASE_NAMESPACE), node);
    // A lease granted by a lost attempt is reused by the next one.
    let mut granted: Option<i64> = None;
    for _ in 0..5 {
        let current = backend.get(key.clone()).await?;
        let (mut obj, rev) = match &current {
            Some(kv) => (decode_kv(kv)?, kv.mod_revision),
            None => (Value::Null, 0),
        };
        let written_seq = obj
            .pointer(&format!(
                "/metadata/annotations/{}",
                HEARTBEAT_SEQUENCE_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let floor = written_seq.max(inner.heartbeats.last(node));
        if first <= floor && floor > 0 {
            inner.metrics.heartbeat_replays.inc();
            return Err(ApiError::conflict(
                "leases",
                node,
                format!(
                    "heartbeat sequence {first} is not above {floor}, the last one seen for this node: \
                     a replayed stream, or a second agent running with --node-id {node}"
                ),
            ));
        }
        // Keep the store lease the object is attached to while it is alive (a reconnect
        // within the TTL), else grant a new one.
        let attached = current.as_ref().map_or(0, |kv| kv.lease);
        let lease = match attached {
            0 => None,
            id => match backend.lease_keep_alive(id).await {
                Ok(_) => Some(id),
                Err(StoreError::LeaseNotFound) => None,
                Err(e) => return Err(e.into()),
            },
        };
        let lease = match (lease, granted) {
            (Some(id), _) | (None, Some(id)) => id,
            (None, None) => {
                inner.metrics.heartbeat_lease_grants.inc();
                let id = backend.lease_grant(0, ttl).await?.id;
                granted = Some(id);
                id
            }
        };
        let now = now_rfc3339();
        let holder_changed =
            obj.pointer("/spec/holderIdentity").and_then(Value::as_str) != Some(node);
        if obj.is_null() {
            let lease_obj = Lease {
                api_version: lattice_apis::API_VERSION.into(),
                kind: "Lease".into(),
                metadata: lattice_apis::ObjectMeta::named(node, Some(NODE_LEASE_NAMESPACE)),
                spec: LeaseSpec {
                    lease_transitions: Some(0),
                    ..Default::default()
                },
            };
            obj = serde_json::to_value(&lease_obj)
                .map_err(|e| ApiError::internal(format!("encoding a Lease: {e}")))?;
            if let Some(m) = meta_mut(&mut obj) {
                m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
                m.insert("generation".into(), json!(1));
                m.insert("creationTimestamp".into(), json!(now.clone()));
            }
        }
        if let Some(m) = meta_mut(&mut obj) {
            m.remove("resourceVersion");
            let ann = m
                .entry("annotations")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .ok_or_else(|| ApiError::internal("metadata.annotations is not a map"))?;
            ann.insert(STORE_LEASE_ANNOTATION.into(), json!(lease.to_string()));
            ann.insert(
                HEARTBEAT_SEQUENCE_ANNOTATION.into(),
                json!(first.to_string()),
            );
        }
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            if holder_changed {
                spec.insert("holderIdentity".into(), json!(node));
                spec.insert("acquireTime".into(), json!(now.clone()));
                if rev != 0 {
                    let t = spec
                        .get("leaseTransitions")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    spec.insert("leaseTransitions".into(), json!(t + 1));
                }
            }
            spec.insert("renewTime".into(), json!(now));
            spec.insert("leaseDurationSeconds".into(), json!(ttl));
        }
        let obj = match admit(kind, obj) {
            Ok(o) => o,
            Err(e) => {
                if let Some(id) = granted {
                    let _ = backend.lease_revoke(id).await;
                }
                return Err(e);
            }
        };
        let put = PutRequest {
            lease,
            ..PutRequest::new(key.clone(), encode(&obj)?)
        };
        let resp = backend
            .txn(TxnRequest {
                compare: vec![Compare::mod_revision(
                    key.clone(),
                    CompareResult::Equal,
                    rev,
                )],
                success: vec![TxnOp::Put(put)],
                failure: vec![],
            })
            .await?;
        if resp.succeeded {
            inner.heartbeats.advance(node, first);
            tracing::debug!(node, lease, sequence = first, "heartbeat stream opened");
            return Ok((lease, first));
        }
    }
    if let Some(id) = granted {
        let _ = backend.lease_revoke(id).await;
    }
    Err(ApiError::conflict(
        "leases",
        node,
        "the heartbeat Lease kept changing while the stream opened; retry",
    ))
}

/// Why a session ended (the last line of the response).
fn farewell(reason: &str, message: &str) -> Bytes {
    let mut v =
        serde_json::to_vec(&json!({"reason": reason, "message": message})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// Read heartbeat lines until the agent stops, the lease is lost, or the server shuts
/// down; renew the store lease for each.
async fn session(
    inner: Arc<Inner>,
    node: String,
    lease: i64,
    mut last_seq: u64,
    body: Body,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let metrics = inner.metrics.clone();
    metrics.heartbeat_streams.inc();
    let ttl = inner.config.heartbeat_ttl.max(Duration::from_secs(1));
    let backend = inner.resources.backend.clone();
    let key = lease_kind()
        .map(|k| object_key(k, Some(NODE_LEASE_NAMESPACE), &node))
        .ok();
    let mut shutdown = inner.shutting_down.subscribe();
    let mut frames = body.into_data_stream();
    let mut line: Vec<u8> = Vec::with_capacity(MAX_LINE);
    let mut last_renew = Instant::now();
    let mut last_check = Instant::now();
    // Idle is judged from the last *accepted* line: replays do not keep a session open.
    let mut deadline = tokio::time::Instant::now() + ttl;
    // Renewals failing for a whole TTL (e.g. this member cut off from the leader) end
    // the session, so the agent reconnects, perhaps elsewhere.
    let mut failing_since: Option<Instant> = None;
    let (reason, message) = 'session: loop {
        let chunk = tokio::select! {
            c = tokio::time::timeout_at(deadline, frames.next()) => c,
            _ = shutdown.wait_for(|s| *s) => break ("ShuttingDown", "the API server is shutting down; reconnect".to_string()),
        };
        let bytes = match chunk {
            Err(_) => {
                break (
                    "Idle",
                    format!("no heartbeat for {}s; reconnect", ttl.as_secs()),
                )
            }
            Ok(None) => break ("Closed", String::new()),
            Ok(Some(Err(e))) => break ("Closed", e.to_string()),
            Ok(Some(Ok(b))) => b,
        };
        for &b in bytes.iter() {
            if b != b'\n' {
                if line.len() >= MAX_LINE {
                    break 'session (
                        "BadRequest",
                        "a heartbeat line is longer than a sequence number".to_string(),
                    );
                }
                line.push(b);
                continue;
            }
            let seq = std::str::from_utf8(&line)
                .ok()
                .map(str::trim)
                .and_then(|s| s.parse::<u64>().ok());
            line.clear();
            let Some(seq) = seq else {
                break 'session (
                    "BadRequest",
                    "a heartbeat line is not a decimal sequence number".to_string(),
                );
            };
            if seq <= last_seq {
                metrics.heartbeat_replays.inc();
                continue;
            }
            last_seq = seq;
            deadline = tokio::time::Instant::now() + ttl;
            metrics.heartbeats.inc();
            if last_renew.elapsed() < MIN_RENEW_SPACING {
                continue;
            }
            last_renew = Instant::now();
            match backend.lease_keep_alive(lease).await {
                Ok(_) => failing_since = None,
                Err(StoreError::LeaseNotFound) => {
                    break 'session (
                        "LeaseExpired",
                        "the heartbeat lease expired; reconnect to register again".to_string(),
                    )
                }
                // The leader may be changing: the next line retries, and the store gives
                // every lease a full TTL when a new leader takes over.
                Err(e) => {
                    metrics.heartbeat_errors.inc();
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= ttl {
                        break 'session (
                            "RenewFailed",
                            format!(
                                "renewing the heartbeat lease failed for {}s: {e}",
                                ttl.as_secs()
                            ),
                        );
                    }
                    if since.elapsed().is_zero() {
                        tracing::warn!(node, error = %e, "heartbeat renewal failed; retrying with the next heartbeat");
                    }
                }
            }
            // Once per TTL: is the Lease object still there, on our store lease? (Someone
            // may have deleted it by hand; the agent must then register again.)
            if last_check.elapsed() >= ttl {
                last_check = Instant::now();
                if let Some(key) = &key {
                    match backend.get(key.clone()).await {
                        Ok(Some(kv)) if kv.lease == lease => {}
                        Ok(_) => {
                            break 'session (
                                "LeaseLost",
                                "the heartbeat Lease was deleted or replaced; reconnect to register again".to_string(),
                            )
                        }
                        Err(e) => tracing::debug!(node, error = %e, "cannot check the heartbeat Lease"),
                    }
                }
            }
        }
    };
    inner.heartbeats.advance(&node, last_seq);
    metrics.heartbeat_streams.dec();
    tracing::debug!(node, reason, message, "heartbeat stream ended");
    if reason != "Closed" {
        let _ = tx.send(Ok(farewell(reason, &message))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_only_go_up() {
        let s = Sequences::default();
        assert!(s.advance("n1", 5));
        assert!(!s.advance("n1", 5));
        assert!(!s.advance("n1", 4));
        assert!(s.advance("n1", 6));
        assert!(s.advance("n2", 1));
        assert_eq!(s.last("n1"), 6);
        assert_eq!(s.last("n3"), 0);
    }
}
