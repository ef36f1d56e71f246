//! `lattice attach`: `GET .../namespaces/{ns}/allocations/{name}/attach` and
//! `GET /v1/allocations/{id}/attach` (WebSocket), relayed to the node agent, and
//! `POST /v1/attach/redeem`, where agents exchange the ticket the relay presents for
//! what it allows. The protocol is described in [`lattice_apis::attach`].
//!
//! Who may attach: with write access to the allocation's tenant, its owner (the user of
//! `lattice.dev/user`) or an admin; for a sensitive allocation its owner only (the
//! seed's "claiming user only"). The allocation must be Running and the node one of
//! its assigned nodes (default: the first). Every attach is recorded as an `Attached`
//! Event on the allocation (who, which node, which command).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{self, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lattice_apis::attach::{AttachTicket, RedeemRequest, PROTOCOL, TICKET_PREFIX, TICKET_TTL_SECS};
use lattice_store::{DeleteRangeRequest, KeyRange, PutRequest};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

use crate::admission::{admit_connect, Connect};
use crate::auth::UserInfo;
use crate::authz::{self, resource, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::resources::WriteOptions;
use crate::routes::{authenticate, json_response, kind_by_plural, read_body};
use crate::Inner;

type AgentSocket = tokio_tungstenite::WebSocketStream<crate::agents::AgentStream>;

/// What the client asked for.
#[derive(Debug, Default)]
struct Request {
    node: Option<String>,
    command: Vec<String>,
    tty: bool,
    stdin: bool,
    /// Passed to the agent as they are.
    rows: Option<u16>,
    cols: Option<u16>,
    term: Option<String>,
}

fn flag(v: &str, key: &str) -> ApiResult<bool> {
    match v {
        "" | "1" | "true" | "True" => Ok(true),
        "0" | "false" | "False" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "query parameter {key}={v:?} is not a boolean; use {key}=true or {key}=false"
        ))),
    }
}

impl Request {
    fn parse(uri: &Uri) -> ApiResult<Self> {
        let Query(pairs) =
            Query::<Vec<(String, String)>>::try_from_uri(uri).map_err(|e: QueryRejection| {
                ApiError::bad_request(format!("invalid query string: {e}"))
            })?;
        let mut r = Request::default();
        for (k, v) in pairs {
            let size = |v: &str| {
                crate::ranges::integer(&k, v, &crate::ranges::TERMINAL_SIZE)
                    .map(|n| u16::try_from(n).unwrap_or(u16::MAX))
            };
            match k.as_str() {
                "node" => r.node = Some(v),
                "command" => r.command.push(v),
                "tty" => r.tty = flag(&v, &k)?,
                "stdin" => r.stdin = flag(&v, &k)?,
                "rows" => r.rows = Some(size(&v)?),
                "cols" => r.cols = Some(size(&v)?),
                "term" => r.term = Some(v),
                "tenant" => {}
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {k:?}; attach takes node, command (one per \
                         argument), tty, stdin, rows, cols and term"
                    )))
                }
            }
        }
        Ok(r)
    }
}

/// `GET .../namespaces/{ns}/allocations/{name}/attach`.
pub async fn attach(
    State(inner): State<Arc<Inner>>,
    Path((ns, name)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let r = async {
        let user = authenticate(&inner, &headers).await?;
        let k = allocations()?;
        authz::authorize(
            &user,
            &Attributes::kind(Verb::Connect, k, Some(&ns))
                .named(Some(&name))
                .subresource(Some("attach")),
        )?;
        let obj = inner.resources.get(k, Some(&ns), &name).await?;
        Ok::<_, ApiError>((user, obj))
    }
    .await;
    finish(&inner, r, &uri, ws).await
}

/// `GET /v1/allocations/{id}/attach` (`?tenant=` where the id is ambiguous).
pub async fn attach_by_id(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let r = async {
        let user = authenticate(&inner, &headers).await?;
        let tenant = Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .ok()
            .and_then(|Query(p)| p.into_iter().rev().find(|(k, _)| k == "tenant"))
            .map(|(_, v)| v);
        let obj =
            crate::intent::find(&inner, allocations()?, &id, tenant.as_deref(), &user).await?;
        Ok::<_, ApiError>((user, obj))
    }
    .await;
    finish(&inner, r, &uri, ws).await
}

fn allocations() -> ApiResult<&'static lattice_apis::KindInfo> {
    kind_by_plural("allocations").ok_or_else(|| ApiError::internal("allocations not registered"))
}

async fn finish(
    inner: &Arc<Inner>,
    found: ApiResult<(UserInfo, Value)>,
    uri: &Uri,
    ws: Result<WebSocketUpgrade, ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let start = Instant::now();
    let r = async {
        let (user, obj) = found?;
        // Who may attach, before anything else is looked at.
        let k = allocations()?;
        let at = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
        authz::authorize(
            &user,
            &Attributes::kind(Verb::Connect, k, Some(at("/metadata/namespace")))
                .named(Some(at("/metadata/name")))
                .subresource(Some("attach")),
        )?;
        admit_connect(&inner.resources, &user, &obj, Connect::Attach).await?;
        crate::audit::sensitive_access(inner, &user, &obj, "attach", &format!("GET {uri}")).await?;
        let req = Request::parse(uri)?;
        // Held by the relay: the session counts until either side closes.
        let slot = inner
            .limiter
            .acquire(&user, crate::limits::Session::Attach)?;
        let ws = ws.map_err(|e| {
            ApiError::bad_request(format!(
                "attach is a WebSocket (GET with 'Connection: Upgrade', 'Upgrade: websocket'; \
                 subprotocol {PROTOCOL}): {e}; use `lattice attach`"
            ))
        })?;
        let (ticket, agent) = open(inner, &user, &obj, req).await?;
        tracing::info!(user = %user.name, allocation = %ticket.name, tenant = %ticket.namespace, node = %ticket.node, command = ?ticket.command, "attached");
        Ok::<_, ApiError>(
            ws.protocols([PROTOCOL])
                .on_upgrade(move |client| async move {
                    let _slot = slot;
                    relay(client, agent).await
                }),
        )
    }
    .await;
    observed(inner, "attach", start, r)
}

/// Check, record and open the agent's side. Errors here are the client's HTTP answer.
async fn open(
    inner: &Inner,
    user: &UserInfo,
    obj: &Value,
    req: Request,
) -> ApiResult<(AttachTicket, AgentSocket)> {
    let str_at = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (ns, name) = (str_at("/metadata/namespace"), str_at("/metadata/name"));
    let phase = str_at("/status/phase");
    if phase != "Running" {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "allocation {ns}/{name} is {}; attach needs a Running allocation (follow it with \
                 `lattice watch {name}`)",
                if phase.is_empty() { "Pending" } else { phase }
            ),
        ));
    }
    let nodes: Vec<&str> = obj
        .pointer("/status/assignedNodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let node = match &req.node {
        Some(n) if nodes.contains(&n.as_str()) => n.clone(),
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "node {n:?} is not one of allocation {name}'s nodes ({}); pick one with --node",
                nodes.join(", ")
            )))
        }
        None => nodes.first().map(|n| n.to_string()).ok_or_else(|| {
            ApiError::new(
                409,
                "Conflict",
                format!("allocation {ns}/{name} has no assigned nodes"),
            )
        })?,
    };
    let node_kind =
        kind_by_plural("nodes").ok_or_else(|| ApiError::internal("nodes not registered"))?;
    let node_obj = inner.resources.get(node_kind, None, &node).await?;
    let addr = node_obj
        .pointer("/status/agent/address")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| {
            ApiError::unavailable(format!(
                "node {node} has no agent address (its agent never registered)"
            ))
        })?
        .to_string();
    let ticket = AttachTicket {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid: str_at("/metadata/uid").to_string(),
        node: node.clone(),
        user: user.name.clone(),
        command: req.command.clone(),
        tty: req.tty,
        stdin: req.stdin,
    };
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let backend = &inner.resources.backend;
    let lease = backend
        .lease_grant(0, TICKET_TTL_SECS)
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot record the attach ticket: {e}")))?;
    let value = serde_json::to_vec(&ticket).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut put = PutRequest::new(format!("{TICKET_PREFIX}{secret}"), value);
    put.lease = lease.id;
    backend
        .put(put)
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot record the attach ticket: {e}")))?;
    match connect(inner, &addr, ns, name, &node, &secret, &req).await {
        Ok(sock) => {
            record_event(inner, &ticket, obj).await;
            Ok((ticket, sock))
        }
        Err(e) => {
            // A ticket no agent took is void at once, not in a minute.
            let _ = backend.lease_revoke(lease.id).await;
            Err(e)
        }
    }
}

/// Open the agent's side, presenting the ticket `secret`.
async fn connect(
    inner: &Inner,
    addr: &str,
    ns: &str,
    name: &str,
    node: &str,
    secret: &str,
    req: &Request,
) -> ApiResult<AgentSocket> {
    let (stream, scheme) = inner.agents.connect(node, addr).await?;
    let mut url = reqwest::Url::parse(&format!("{scheme}://{addr}/attach/{ns}/{name}"))
        .map_err(|e| ApiError::internal(format!("node {node}'s agent address {addr:?}: {e}")))?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("tty", if req.tty { "true" } else { "false" });
        if let Some(r) = req.rows {
            q.append_pair("rows", &r.to_string());
        }
        if let Some(c) = req.cols {
            q.append_pair("cols", &c.to_string());
        }
        if let Some(t) = &req.term {
            q.append_pair("term", t);
        }
    }
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| ApiError::internal(format!("attach request: {e}")))?;
    let h = request.headers_mut();
    let bearer = format!("Bearer {secret}")
        .parse()
        .map_err(|_| ApiError::internal("attach ticket is not a header value"))?;
    h.insert(axum::http::header::AUTHORIZATION, bearer);
    h.insert(
        axum::http::header::SEC_WEBSOCKET_PROTOCOL,
        axum::http::HeaderValue::from_static(PROTOCOL),
    );
    let unreachable = |e: String| {
        ApiError::unavailable(format!("cannot reach node {node}'s agent at {addr}: {e}"))
    };
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((sock, _)) => Ok(sock),
        Err(tungstenite::Error::Http(resp)) => {
            // The agent's own refusal (not running there, say): its status and message.
            let code = resp.status().as_u16();
            let body = resp.body().as_deref().unwrap_or_default();
            let msg = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(String::from))
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
            Err(ApiError::new(
                if code == 409 { 409 } else { 502 },
                if code == 409 {
                    "Conflict"
                } else {
                    "BadGateway"
                },
                format!("node {node}'s agent refused the attach ({code}): {msg}"),
            ))
        }
        Err(e) => Err(unreachable(e.to_string())),
    }
}

/// The audit trail: an `Attached` Event on the allocation (best effort).
async fn record_event(inner: &Inner, t: &AttachTicket, obj: &Value) {
    let Some(k) = kind_by_plural("events") else {
        return;
    };
    let now = lattice_apis::meta::now();
    let what = if t.command.is_empty() {
        "a shell".to_string()
    } else {
        format!("{:?}", t.command.join(" "))
    };
    let ev = json!({
        "apiVersion": lattice_apis::API_VERSION,
        "kind": "Event",
        "metadata": {
            "name": format!("{}.attach-{}", t.name, uuid::Uuid::new_v4().simple()),
            "namespace": t.namespace,
        },
        "involvedObject": {
            "apiVersion": lattice_apis::API_VERSION,
            "kind": "Allocation",
            "namespace": t.namespace,
            "name": t.name,
            "uid": t.uid,
            "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
        },
        "reason": "Attached",
        "message": format!("user {} attached {what} on node {}{}", t.user, t.node, if t.tty { " (terminal)" } else { "" }),
        "type": "Normal",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "lattice-apiserver", "host": t.node},
    });
    if let Err(e) = inner
        .resources
        .create(k, Some(&t.namespace), ev, &WriteOptions::default(), false)
        .await
    {
        tracing::warn!(allocation = %t.name, error = %e, "cannot record the Attached event");
    }
}

/// Pass frames both ways until either side closes.
async fn relay(client: WebSocket, agent: AgentSocket) {
    let (mut c_tx, mut c_rx) = client.split();
    let (mut a_tx, mut a_rx) = agent.split();
    let up = async {
        while let Some(Ok(m)) = c_rx.next().await {
            let m = match m {
                ws::Message::Binary(b) => tungstenite::Message::Binary(b),
                ws::Message::Text(t) => tungstenite::Message::Text(t.as_str().into()),
                ws::Message::Close(_) => break,
                ws::Message::Ping(_) | ws::Message::Pong(_) => continue,
            };
            if a_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = a_tx.send(tungstenite::Message::Close(None)).await;
    };
    let down = async {
        while let Some(Ok(m)) = a_rx.next().await {
            let m = match m {
                tungstenite::Message::Binary(b) => ws::Message::Binary(b),
                tungstenite::Message::Text(t) => ws::Message::Text(t.as_str().into()),
                tungstenite::Message::Close(_) => break,
                _ => continue,
            };
            if c_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = c_tx.send(ws::Message::Close(None)).await;
    };
    // Output after the client left, or input after the command ended, goes nowhere:
    // the first side to finish ends the relay.
    let client_left = tokio::select! {
        _ = up => true,
        _ = down => false,
    };
    // Finish the close handshake with the side just told to close: dropping a socket
    // whose peer still sends (its Close reply) resets the connection, and a reset can
    // discard frames the peer has not read yet (the exit status, say).
    let _ = tokio::time::timeout(LINGER, async {
        if client_left {
            while let Some(Ok(m)) = a_rx.next().await {
                if m.is_close() {
                    break;
                }
            }
        } else {
            while let Some(Ok(m)) = c_rx.next().await {
                if matches!(m, ws::Message::Close(_)) {
                    break;
                }
            }
        }
    })
    .await;
}

/// How long a closing side waits for its peer's Close.
const LINGER: Duration = Duration::from_secs(2);

/// `POST /v1/attach/redeem` (node agents, for their own node): the ticket's grant, once.
pub async fn redeem(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let user = authenticate(&inner, &headers).await?;
        authz::authorize(
            &user,
            &Attributes::other(Verb::Create, resource::ATTACH_TICKETS),
        )?;
        let b = read_body(&inner, &headers, body).await?;
        let req: RedeemRequest = crate::parse::json_as(&b, |e| {
            format!("invalid redeem request: {e}; expected {{\"ticket\": \"...\"}}")
        })?;
        if req.ticket.is_empty() || !req.ticket.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(ApiError::forbidden(
                "unknown, used or expired attach ticket",
            ));
        }
        // Deleting is reading: a ticket is good once.
        let del = inner
            .resources
            .backend
            .delete_range(DeleteRangeRequest {
                range: KeyRange::single(Bytes::from(format!("{TICKET_PREFIX}{}", req.ticket))),
                prev_kv: true,
            })
            .await
            .map_err(|e| ApiError::unavailable(format!("cannot read the attach ticket: {e}")))?;
        let kv = del
            .prev_kvs
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::forbidden("unknown, used or expired attach ticket"))?;
        if kv.lease != 0 {
            let _ = inner.resources.backend.lease_revoke(kv.lease).await;
        }
        let t: AttachTicket = serde_json::from_slice(&kv.value).map_err(|e| {
            ApiError::internal(format!("stored attach ticket does not decode: {e}"))
        })?;
        // A ticket is for the agent of one node: another node's agent that got hold of it
        // only spends it.
        if user.node_name().is_some_and(|me| me != t.node) {
            return Err(ApiError::forbidden(format!(
                "the attach ticket is for node {:?}'s agent",
                t.node
            )));
        }
        Ok(json_response(
            StatusCode::OK,
            &serde_json::to_value(&t).unwrap_or_default(),
        ))
    }
    .await;
    observed(&inner, "redeem", start, r)
}

/// The answer of a handler of allocation subresources, counted in the request metrics
/// under `verb` (attach, redeem, token).
pub fn observed(
    inner: &Inner,
    verb: &'static str,
    start: std::time::Instant,
    r: ApiResult<Response>,
) -> Response {
    let resp = r.unwrap_or_else(|e| e.into_response());
    inner.metrics.observe(
        verb,
        "Allocation",
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}
