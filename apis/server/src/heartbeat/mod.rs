//! `POST /apis/lattice.dev/v1alpha1/nodes/{name}/heartbeat`: the node agents' heartbeat
//! stream.
//!
//! A heartbeat must cost the control plane almost nothing (the seed: 10,000 agents under
//! 1% of one core), so it is not a write, and it does not even wake the server up on its
//! own. An agent sends one request with `Upgrade: lattice-heartbeat/1`; the server writes
//! the node's `Lease` `lattice-node-lease/<node>` once, attached to a store lease whose
//! TTL is the heartbeat timeout, and answers `101 Switching Protocols` (with
//! `X-Lattice-Heartbeat-Ttl-Seconds`). From then on the connection carries one line per
//! interval from the agent, its heartbeat sequence number in decimal (`"41\n"`), and each
//! line renews the store lease, which the Raft leader keeps in memory (no log entry, no
//! fsync). When the agent goes quiet for the TTL the store deletes the Lease object, and
//! the node lifecycle controller sees the deletion as "heartbeat lost".
//!
//! Upgraded connections are handed to one [`reader`] thread that sleeps between ticks and
//! reads every connection that has data in one batch (epoll), so a heartbeat costs a
//! `read` and a little parsing instead of a wake-up of its own; renewals go to one task in
//! batches. HTTPS connections go with their TLS state (the reader decrypts); a task reads
//! a connection only when the reader cannot be started.
//!
//! * Sequence numbers must increase: the opening `?sequence=N` must be above the one the
//!   Lease carries and the last one this server saw for the node (409 otherwise: a
//!   replayed stream, or two agents with one node ID), and a line that does not
//!   increase it is counted as a replay and ignored (it does not keep the stream open).
//! * At most one renewal per [`MIN_RENEW_SPACING`] per stream (heartbeat storms are
//!   coalesced). Renewals failing for a whole TTL end the session (`RenewFailed`), and
//!   once per TTL the session checks that the Lease still exists on its store lease
//!   (`LeaseLost`).
//! * When the server ends a session (lease lost, idle for a TTL, shutdown) it writes one
//!   JSON line saying why and closes the connection; the agent reconnects whenever the
//!   connection ends.
//!
//! Authorized like a write of Leases in `lattice-node-lease`.

pub mod reader;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lattice_apis::{
    KindInfo, Lease, LeaseSpec, HEARTBEAT_SEQUENCE_ANNOTATION, NODE_LEASE_NAMESPACE,
    STORE_LEASE_ANNOTATION,
};
use lattice_store::{Compare, CompareResult, KvBackend, PutRequest, StoreError, TxnOp, TxnRequest};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::authz::{self, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::objects::{admit, decode_kv, encode, meta_mut, now_rfc3339, object_key};
use crate::routes::{authenticate, kind_by_plural, Params};
use crate::Inner;

/// Renewals closer together than this on one stream are coalesced into one.
pub const MIN_RENEW_SPACING: Duration = Duration::from_millis(200);
/// Longest line accepted (a sequence number is at most 20 digits).
const MAX_LINE: usize = 32;
/// Response header carrying the heartbeat TTL.
pub const TTL_HEADER: &str = "x-lattice-heartbeat-ttl-seconds";
/// The `Upgrade` protocol of a heartbeat stream.
pub const PROTOCOL: &str = "lattice-heartbeat/1";

/// The accepted socket's file descriptor, recorded per connection by
/// [`ApiServer::serve`](crate::ApiServer::serve) (`ConnectInfo`), so that an upgraded
/// heartbeat connection can be handed to the [`reader`] thread.
#[derive(Debug, Clone, Copy)]
pub struct ConnFd(pub std::os::fd::RawFd, pub Option<std::net::SocketAddr>);

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for ConnFd
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        use std::os::fd::AsRawFd;
        // Called once per accepted connection, so also the place for its socket options:
        // watch streams are many small writes, and with Nagle's algorithm each one waits
        // for the client's (delayed) ACK of the previous one — tens of milliseconds.
        if let Err(e) = stream.io().set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        ConnFd(stream.io().as_raw_fd(), Some(*stream.remote_addr()))
    }
}

/// The last sequence number accepted per node, shared by every stream of this server
/// (a replayed or duplicated stream cannot go back).
#[derive(Default)]
pub struct Sequences {
    last: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

impl Sequences {
    /// The node's cell: live streams raise it with every accepted line (an atomic, no
    /// lock on the heartbeat path), so an opening stream is judged against them too.
    fn cell(&self, node: &str) -> Arc<AtomicU64> {
        let mut g = self.last.lock().unwrap_or_else(|p| p.into_inner());
        g.entry(node.to_string()).or_default().clone()
    }

    /// Accept `seq` for `node` if it is above everything seen; false for a replay.
    fn advance(&self, node: &str, seq: u64) -> bool {
        self.cell(node).fetch_max(seq, Ordering::Relaxed) < seq
    }

    fn last(&self, node: &str) -> u64 {
        self.cell(node).load(Ordering::Relaxed)
    }
}

/// The handler.
pub async fn node_heartbeat(
    State(inner): State<Arc<Inner>>,
    Path(node): Path<String>,
    mut req: Request,
) -> Response {
    let start = Instant::now();
    let resp = match accept(&inner, &node, &mut req).await {
        Ok(resp) => resp,
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

/// Check the upgrade request, open the session, and answer 101; the upgraded
/// connection is picked up once hyper hands it over.
async fn accept(inner: &Arc<Inner>, node: &str, req: &mut Request) -> ApiResult<Response> {
    let wants = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(PROTOCOL));
    if !wants {
        return Err(ApiError::bad_request(format!(
            "a heartbeat stream is an upgraded connection: send `Connection: Upgrade` and `Upgrade: {PROTOCOL}`"
        )));
    }
    let (lease, first) = open(inner, node, req.uri(), req.headers()).await?;
    let fd = req
        .extensions()
        .get::<ConnectInfo<ConnFd>>()
        .map(|c| c.0 .0);
    let tls = req
        .extensions()
        .get::<ConnectInfo<crate::tls::TlsConnInfo>>()
        .map(|c| c.0.slot.clone());
    // (Weak: upgraded only once hyper hands the connection over.)
    let on_upgrade = hyper::upgrade::on(req);
    let inner2 = inner.clone();
    let mut state = Stream::new(node.to_string(), lease, first, inner.heartbeats.cell(node));
    // The session ends when the certificate it was opened with is revoked or expires.
    state.credential = crate::auth::request_user().and_then(|u| u.cert);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => hand_over(inner2, upgraded, fd, tls, state).await,
            Err(e) => tracing::debug!(node = %state.node, error = %e, "heartbeat upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static(PROTOCOL));
    if let Ok(v) = HeaderValue::from_str(&inner.config.heartbeat_ttl.as_secs().to_string()) {
        h.insert(TTL_HEADER, v);
    }
    Ok(resp)
}

/// Give an upgraded connection to the reader thread (plain TCP, or TLS with its state),
/// or read it here.
async fn hand_over(
    inner: Arc<Inner>,
    upgraded: hyper::upgrade::Upgraded,
    fd: Option<std::os::fd::RawFd>,
    tls: Option<crate::tls::WeakTlsSlot>,
    mut state: Stream,
) {
    let mut upgraded = hyper_util::rt::TokioIo::new(upgraded);
    // Bytes hyper read past the request head (an agent should wait for the 101, but
    // nothing it sent may be lost): read what is there without waiting.
    // All of it (bounded: an agent sends a line per interval, not a stream of bytes
    // before its answer).
    let mut early = [0u8; 512];
    for _ in 0..16 {
        match futures::FutureExt::now_or_never(upgraded.read(&mut early)) {
            Some(Ok(0)) => return,
            Some(Ok(n)) => {
                if let Err(e) = state.lines.feed(&early[..n], &mut state.beats) {
                    let _ = upgraded.write_all(&farewell("BadRequest", e)).await;
                    return;
                }
            }
            Some(Err(_)) => return,
            None => break,
        }
    }
    if let (Some(slot), Some(reader)) = (
        tls.as_ref().and_then(crate::tls::WeakTlsSlot::upgrade),
        inner.heartbeat_reader(),
    ) {
        // hyper is done with the connection (it handed it over): the TLS stream leaves
        // it for the reader thread, which decrypts in its batches.
        let Some(mut stream) = slot.take() else {
            tracing::warn!(node = %state.node, "a heartbeat connection's TLS stream was already taken");
            return;
        };
        drop(upgraded);
        // Whatever TLS records are still buffered (the 101's) go out first.
        if let Err(e) = stream.flush().await {
            tracing::debug!(node = %state.node, error = %e, "heartbeat connection lost while handing it over");
            return;
        }
        let (tcp, conn) = stream.into_inner();
        match tcp.into_std() {
            Ok(tcp) => reader.add_tls(tcp, conn, state),
            Err(e) => {
                tracing::warn!(node = %state.node, error = %e, "cannot hand a heartbeat connection to the reader")
            }
        }
        return;
    }
    if let (Some(fd), Some(reader)) = (fd, inner.heartbeat_reader()) {
        // SAFETY: `fd` is this connection's socket, open for as long as `upgraded` lives
        // (it is dropped below, after the duplicate is made).
        let dup = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned();
        match dup {
            Ok(owned) => {
                let tcp = std::net::TcpStream::from(owned);
                // The duplicate takes over; dropping ours deregisters it from tokio.
                drop(upgraded);
                reader.add(tcp, state);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot duplicate a heartbeat socket; reading it in a task")
            }
        }
    }
    session(inner, upgraded, state).await;
}

/// Why a session ended (the last line sent to the agent).
pub(crate) fn farewell(reason: &str, message: &str) -> Bytes {
    let mut v =
        serde_json::to_vec(&json!({"reason": reason, "message": message})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// Splits the byte stream into sequence numbers.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    line: Vec<u8>,
}

impl Lines {
    /// Feed bytes; every complete line goes to `beats`. `Err` names a protocol error.
    pub(crate) fn feed(&mut self, bytes: &[u8], beats: &mut Beats) -> Result<(), &'static str> {
        for &b in bytes {
            if b != b'\n' {
                if self.line.len() >= MAX_LINE {
                    return Err("a heartbeat line is longer than a sequence number");
                }
                self.line.push(b);
                continue;
            }
            let seq = std::str::from_utf8(&self.line)
                .ok()
                .map(str::trim)
                .and_then(|s| s.parse::<u64>().ok());
            self.line.clear();
            match seq {
                Some(seq) => beats.offer(seq),
                None => return Err("a heartbeat line is not a decimal sequence number"),
            }
        }
        Ok(())
    }
}

/// Sequence bookkeeping of one stream.
#[derive(Debug)]
pub(crate) struct Beats {
    pub(crate) last_seq: u64,
    /// When a line last raised the sequence (idle is judged from here).
    pub(crate) last_ok: Instant,
    last_renew: Instant,
    /// A renewal is due (set by an accepted line, cleared by [`Beats::take_renewal`]).
    renew_due: bool,
    pub(crate) accepted: u64,
    pub(crate) replays: u64,
    /// The node's cell in [`Sequences`].
    published: Arc<AtomicU64>,
}

impl Beats {
    fn new(first: u64, published: Arc<AtomicU64>) -> Self {
        let now = Instant::now();
        Self {
            published,
            last_seq: first,
            last_ok: now,
            last_renew: now,
            renew_due: false,
            accepted: 0,
            replays: 0,
        }
    }

    fn offer(&mut self, seq: u64) {
        if seq <= self.last_seq {
            self.replays += 1;
            return;
        }
        self.last_seq = seq;
        self.published.fetch_max(seq, Ordering::Relaxed);
        self.last_ok = Instant::now();
        self.accepted += 1;
        self.renew_due = true;
    }

    /// Whether to renew now (at most one renewal per [`MIN_RENEW_SPACING`]).
    pub(crate) fn take_renewal(&mut self) -> bool {
        if self.renew_due && self.last_renew.elapsed() >= MIN_RENEW_SPACING {
            self.renew_due = false;
            self.last_renew = Instant::now();
            return true;
        }
        false
    }

    /// Move the counts to the metrics.
    pub(crate) fn flush(&mut self, metrics: &Metrics) {
        if self.accepted > 0 {
            metrics
                .heartbeats
                .inc_by(std::mem::take(&mut self.accepted));
        }
        if self.replays > 0 {
            metrics
                .heartbeat_replays
                .inc_by(std::mem::take(&mut self.replays));
        }
    }
}

/// One heartbeat stream.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) node: String,
    pub(crate) lease: i64,
    pub(crate) lines: Lines,
    pub(crate) beats: Beats,
    /// The client certificate the stream was opened with (TLS sessions).
    pub(crate) credential: Option<crate::auth::CertRef>,
}

impl Stream {
    fn new(node: String, lease: i64, first: u64, published: Arc<AtomicU64>) -> Self {
        Self {
            node,
            lease,
            lines: Lines::default(),
            beats: Beats::new(first, published),
            credential: None,
        }
    }
}

/// Renewal of one stream's store lease, and the checks that end a session.
#[derive(Debug)]
pub(crate) struct Renewal {
    node: String,
    lease: i64,
    key: Option<Bytes>,
    ttl: Duration,
    failing_since: Option<Instant>,
    last_check: Instant,
}

impl Renewal {
    pub(crate) fn new(node: &str, lease: i64, ttl: Duration) -> Self {
        Self {
            node: node.to_string(),
            lease,
            key: lease_kind()
                .map(|k| object_key(k, Some(NODE_LEASE_NAMESPACE), node))
                .ok(),
            ttl,
            failing_since: None,
            last_check: Instant::now(),
        }
    }

    /// The store lease this renews.
    pub(crate) fn lease(&self) -> i64 {
        self.lease
    }

    /// Renew (one stream); `Err((reason, message))` when the session must end.
    pub(crate) async fn renew(
        &mut self,
        backend: &dyn KvBackend,
        metrics: &Metrics,
    ) -> Result<(), (&'static str, String)> {
        let outcome = match backend.lease_keep_alive(self.lease).await {
            Ok(ttl) => Ok(Some(ttl)),
            Err(StoreError::LeaseNotFound) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
        self.renewed(outcome, metrics)?;
        self.check(backend).await
    }

    /// Judge a keep-alive's outcome: `Ok(Some(ttl))` renewed, `Ok(None)` the lease is
    /// gone, `Err` it failed.
    pub(crate) fn renewed(
        &mut self,
        outcome: Result<Option<i64>, String>,
        metrics: &Metrics,
    ) -> Result<(), (&'static str, String)> {
        match outcome {
            Ok(Some(_)) => {
                self.failing_since = None;
                Ok(())
            }
            Ok(None) => Err((
                "LeaseExpired",
                "the heartbeat lease expired; reconnect to register again".into(),
            )),
            // The leader may be changing: the next line retries, and the store gives
            // every lease a full TTL when a new leader takes over. Failing for a whole
            // TTL (e.g. this member cut off from the leader) ends the session, so the
            // agent reconnects, perhaps elsewhere.
            Err(e) => {
                metrics.heartbeat_errors.inc();
                let since = *self.failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.ttl {
                    return Err((
                        "RenewFailed",
                        format!(
                            "renewing the heartbeat lease failed for {}s: {e}",
                            self.ttl.as_secs()
                        ),
                    ));
                }
                if since.elapsed().is_zero() {
                    tracing::warn!(node = %self.node, error = %e, "heartbeat renewal failed; retrying with the next heartbeat");
                }
                Ok(())
            }
        }
    }

    /// Once per TTL: is the Lease object still there, on our store lease? (Someone may
    /// have deleted it by hand; the agent must then register again.)
    pub(crate) async fn check(
        &mut self,
        backend: &dyn KvBackend,
    ) -> Result<(), (&'static str, String)> {
        if self.last_check.elapsed() < self.ttl {
            return Ok(());
        }
        self.last_check = Instant::now();
        let Some(key) = &self.key else {
            return Ok(());
        };
        // A local (serializable) read: no quorum round per check.
        let req = lattice_store::RangeRequest {
            serializable: true,
            keys_only: true,
            ..lattice_store::RangeRequest::key(key.clone())
        };
        match backend.range(req).await.map(|r| r.kvs.into_iter().next()) {
            Ok(Some(kv)) if kv.lease == self.lease => Ok(()),
            Ok(_) => Err((
                "LeaseLost",
                "the heartbeat Lease was deleted or replaced; reconnect to register again".into(),
            )),
            Err(e) => {
                tracing::debug!(node = %self.node, error = %e, "cannot check the heartbeat Lease");
                Ok(())
            }
        }
    }
}

/// Read a stream in this task (connections that are not plain TCP).
async fn session<S>(inner: Arc<Inner>, mut io: S, mut state: Stream)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let metrics = inner.metrics.clone();
    metrics.heartbeat_streams.inc();
    let ttl = inner.config.heartbeat_ttl.max(Duration::from_secs(1));
    let backend = inner.resources.backend.clone();
    let mut renewal = Renewal::new(&state.node, state.lease, ttl);
    let mut shutdown = inner.shutting_down.subscribe();
    let mut buf = [0u8; 1024];
    let (reason, message) = loop {
        let deadline = tokio::time::Instant::from_std(state.beats.last_ok + ttl);
        let read = tokio::select! {
            r = tokio::time::timeout_at(deadline, io.read(&mut buf)) => r,
            _ = shutdown.wait_for(|s| *s) => break ("ShuttingDown", "the API server is shutting down; reconnect".to_string()),
        };
        let n = match read {
            Err(_) => {
                break (
                    "Idle",
                    format!("no heartbeat for {}s; reconnect", ttl.as_secs()),
                )
            }
            Ok(Ok(0)) => break ("Closed", String::new()),
            Ok(Err(e)) => break ("Closed", e.to_string()),
            Ok(Ok(n)) => n,
        };
        if let Err(e) = state.lines.feed(&buf[..n], &mut state.beats) {
            break ("BadRequest", e.to_string());
        }
        state.beats.flush(&metrics);
        if state.beats.take_renewal() {
            if let Some(c) = &state.credential {
                if let Err(end) = credential_check(c, &inner.revocations, &backend).await {
                    break end;
                }
            }
            if let Err(end) = renewal.renew(backend.as_ref(), &metrics).await {
                break end;
            }
        }
    };
    end_session(&metrics, &state, reason, &message);
    if reason != "Closed" {
        let _ = io.write_all(&farewell(reason, &message)).await;
        let _ = io.shutdown().await;
    }
}

/// A TLS session's certificate still holds: not expired, not revoked (checked before
/// each renewal, by a session task and by the reader's renewer alike).
pub(crate) async fn credential_check(
    c: &crate::auth::CertRef,
    revocations: &crate::node_identity::Revocations,
    backend: &Arc<dyn lattice_store::KvBackend>,
) -> Result<(), (&'static str, String)> {
    if c.not_after <= std::time::SystemTime::now() {
        return Err((
            "Unauthorized",
            "the node certificate expired; renew it and reconnect".into(),
        ));
    }
    if matches!(revocations.is_revoked(backend, &c.serial).await, Ok(true)) {
        return Err(("Unauthorized", "the node certificate was revoked".into()));
    }
    Ok(())
}

/// Bookkeeping when a session ends (either kind).
pub(crate) fn end_session(metrics: &Metrics, state: &Stream, reason: &str, message: &str) {
    metrics.heartbeat_streams.dec();
    tracing::debug!(node = %state.node, reason, message, "heartbeat stream ended");
}

fn lease_kind() -> ApiResult<&'static KindInfo> {
    kind_by_plural("leases").ok_or_else(|| ApiError::internal("the Lease kind is not registered"))
}

/// Authorize, check the opening sequence, and write the node's Lease attached to a live
/// store lease. Returns the store lease ID and the opening sequence.
async fn open(inner: &Inner, node: &str, uri: &Uri, headers: &HeaderMap) -> ApiResult<(i64, u64)> {
    let user = authenticate(inner, headers).await?;
    let nodes = kind_by_plural("nodes")
        .ok_or_else(|| ApiError::internal("the Node kind is not registered"))?;
    authz::authorize(
        &user,
        &Attributes::kind(Verb::Update, nodes, None)
            .named(Some(node))
            .subresource(Some("heartbeat")),
    )?;
    let kind = lease_kind()?;
    let params = Params::from_uri(uri)?;
    let first: u64 = match params.get("sequence") {
        Some(s) => crate::ranges::integer("sequence", s, &crate::ranges::HEARTBEAT_SEQUENCE)?,
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
