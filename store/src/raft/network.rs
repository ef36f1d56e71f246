//! Raft RPCs over gRPC (tonic): the client side ([`NetworkFactory`] / [`PeerClient`]) and
//! the server side ([`RaftService`]). Payloads are postcard-encoded openraft messages in a
//! `bytes` field (`proto/raft.proto`).
//!
//! AppendEntries, the one RPC on every write's path, travels on a long-lived stream per
//! replication target (`AppendStream`): one HTTP/2 DATA frame each way per request, where
//! a unary call costs the sender a HEADERS, a DATA and an end-of-stream frame (three socket
//! writes) and the receiver a response with trailers. Client requests a member forwards
//! to the leader (writes, read-index, lease keep-alives) travel on one long-lived stream
//! per leader too (`ForwardStream`), tagged with IDs and answered in any order, so many
//! writers share it; a leader without that RPC is asked with unary `Forward` calls. Votes,
//! snapshots, joins and operator removals stay unary.
//!
//! A per-member switch ([`NetShared::set_partitioned`]) makes this member drop all Raft and
//! forward traffic in both directions: tests use it to cut a member off without killing it.

use std::collections::HashMap;
use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode, LogId, Raft};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::log_store::Durability;
use super::pb::raft_transport_client::RaftTransportClient;
use super::pb::raft_transport_server::RaftTransport;
use super::pb::Payload;
use super::state_machine::lock;
use super::{ClientRequest, Inner, TypeConfig, WireError};
use crate::metrics::RaftMetrics;

/// Largest message on the Raft transport (snapshot chunks, entry batches).
pub(crate) const MAX_MESSAGE: usize = 256 * 1024 * 1024;
/// How long connecting to a peer (and its TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Connections to peers, and the test-only partition switch.
#[derive(Default)]
pub struct NetShared {
    partitioned: AtomicBool,
    channels: Mutex<HashMap<String, Channel>>,
    /// Open forward streams, by leader address.
    forwards: Mutex<HashMap<String, Arc<ForwardMux>>>,
    /// Leaders that do not serve `ForwardStream` (older members): asked with unary calls
    /// until their connection fails.
    unary_forward: Mutex<std::collections::HashSet<String>>,
    /// Test switch: refuse `ForwardStream` as an older member would.
    refuse_forward_streams: AtomicBool,
    /// The highest commit index an AppendEntries went out without (lowered to the
    /// durable log): owed to the followers once durable (a heartbeat carries it).
    pub(crate) commit_owed: AtomicU64,
    /// Signalled when `commit_owed` is raised.
    pub(crate) commit_owed_signal: tokio::sync::Notify,
    /// Mutual TLS to peers (this member's certificate; peers must hold a member's).
    /// `None`: plaintext, to loopback addresses only.
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// Why a call to a peer failed.
pub(crate) enum CallError {
    /// Nothing reached the peer (no connection, or partitioned): safe to retry.
    NotSent(String),
    /// The request may or may not have been processed.
    Unknown(String),
}

impl NetShared {
    /// Connections that use mutual TLS with `tls` (from
    /// [`crate::tls::MemberTls::raft_client`]); `None`: plaintext, loopback only.
    pub fn new(tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self {
            tls,
            ..Self::default()
        }
    }

    /// Test switch: while set, this member neither sends nor accepts Raft or forward
    /// traffic, as if a network partition isolated it.
    pub fn set_partitioned(&self, on: bool) {
        self.partitioned.store(on, Ordering::SeqCst);
        if on {
            lock(&self.channels).clear();
            lock(&self.forwards).clear();
        }
    }

    pub fn is_partitioned(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
    }

    /// Test switch: while set, this member answers `ForwardStream` with `Unimplemented`, as
    /// a member from before that RPC does, so the others forward to it with unary calls.
    pub fn set_refuse_forward_streams(&self, on: bool) {
        self.refuse_forward_streams.store(on, Ordering::SeqCst);
    }

    /// Open an `AppendStream` to `addr`.
    async fn open_append_stream(&self, addr: &str, ttl: Duration) -> Result<AppendStream, String> {
        let channel = self.channel(addr).await?;
        let mut client = RaftTransportClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let opened = tokio::time::timeout(
            ttl,
            client.append_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await;
        match opened {
            Ok(Ok(resp)) => Ok(AppendStream {
                tx,
                rx: resp.into_inner(),
            }),
            Ok(Err(status)) => {
                self.forget(addr);
                Err(format!("opening a stream to {addr}: {status}"))
            }
            Err(_) => {
                self.forget(addr);
                Err(format!(
                    "opening a stream to {addr}: timed out after {ttl:?}"
                ))
            }
        }
    }

    async fn channel(&self, addr: &str) -> Result<Channel, String> {
        if let Some(c) = lock(&self.channels).get(addr) {
            return Ok(c.clone());
        }
        let channel = match &self.tls {
            Some(tls) => crate::tls::connect(addr, tls.clone(), CONNECT_TIMEOUT)
                .await
                .map_err(|e| format!("connecting to {addr}: {}", source_chain(&*e)))?,
            None => {
                // Without TLS, Raft traffic (the whole store, replicated) never leaves the
                // machine, whatever address the membership names.
                if !crate::tls::is_loopback_endpoint(addr) {
                    return Err(format!(
                        "refusing to send Raft traffic in plaintext to {addr}, which is not a \
                         loopback address: give this member TLS material (a member certificate \
                         and the cluster CA)"
                    ));
                }
                Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| format!("bad peer address {addr}: {e}"))?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| format!("connecting to {addr}: {}", source_chain(&e)))?
            }
        };
        lock(&self.channels).insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    fn forget(&self, addr: &str) {
        lock(&self.channels).remove(addr);
        lock(&self.unary_forward).remove(addr);
    }

    /// Send a client request (`data`: a postcard [`ClientRequest`]) to the leader at `addr`
    /// on its forward stream, opened if need be, and return the encoded `ClientResult`.
    /// Falls back to a unary `Forward` call when the leader does not know the stream.
    pub(crate) async fn forward(
        &self,
        addr: &str,
        data: Vec<u8>,
        ttl: Duration,
    ) -> Result<Vec<u8>, CallError> {
        if self.is_partitioned() {
            return Err(CallError::NotSent("partitioned".into()));
        }
        if lock(&self.unary_forward).contains(addr) {
            return self.call(addr, Rpc::Forward, data, ttl).await;
        }
        let started = tokio::time::Instant::now();
        let mux = match self.forward_mux(addr, ttl).await {
            Ok(mux) => mux,
            Err(OpenError::Unsupported) => {
                tracing::info!(leader = %addr, "the leader has no forward stream; forwarding with unary calls");
                lock(&self.unary_forward).insert(addr.to_string());
                let ttl = ttl.saturating_sub(started.elapsed());
                return self.call(addr, Rpc::Forward, data, ttl).await;
            }
            Err(OpenError::Failed(e)) => return Err(CallError::NotSent(e)),
        };
        let id = mux.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        {
            let mut pending = lock(&mux.pending);
            if pending.closed {
                drop(pending);
                self.forget_forward(addr, &mux);
                return Err(CallError::NotSent(format!(
                    "{addr}: the forward stream closed"
                )));
            }
            pending.waiting.insert(id, answer_tx);
        }
        if mux
            .tx
            .send(Payload {
                data: frame(id, None, &data),
            })
            .is_err()
        {
            lock(&mux.pending).waiting.remove(&id);
            self.forget_forward(addr, &mux);
            return Err(CallError::NotSent(format!(
                "{addr}: the forward stream closed"
            )));
        }
        let ttl = ttl.saturating_sub(started.elapsed());
        match tokio::time::timeout(ttl, answer_rx).await {
            Ok(Ok(ForwardAnswer::Done(bytes))) => Ok(bytes),
            Ok(Ok(ForwardAnswer::Refused(why))) => {
                self.forget_forward(addr, &mux);
                Err(CallError::NotSent(format!("{addr}: {why}")))
            }
            Ok(Ok(ForwardAnswer::Lost(why))) => {
                self.forget_forward(addr, &mux);
                Err(CallError::Unknown(format!("{addr}: {why}")))
            }
            Ok(Err(_)) => Err(CallError::Unknown(format!(
                "{addr}: the forward stream dropped the request"
            ))),
            Err(_) => {
                lock(&mux.pending).waiting.remove(&id);
                Err(CallError::Unknown(format!(
                    "{addr}: timed out after {ttl:?}"
                )))
            }
        }
    }

    /// The open forward stream to `addr`, or a new one.
    async fn forward_mux(&self, addr: &str, ttl: Duration) -> Result<Arc<ForwardMux>, OpenError> {
        if let Some(mux) = lock(&self.forwards).get(addr) {
            // (A stream the leader ended is closed for its reader before its sender.)
            if !mux.tx.is_closed() && !lock(&mux.pending).closed {
                return Ok(mux.clone());
            }
        }
        let channel = self.channel(addr).await.map_err(OpenError::Failed)?;
        let mut client = RaftTransportClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let opened = tokio::time::timeout(
            ttl,
            client.forward_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
        )
        .await;
        let mut answers = match opened {
            Ok(Ok(resp)) => resp.into_inner(),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                return Err(OpenError::Unsupported)
            }
            Ok(Err(status)) => {
                self.forget(addr);
                return Err(OpenError::Failed(format!(
                    "opening a forward stream to {addr}: {status}"
                )));
            }
            Err(_) => {
                self.forget(addr);
                return Err(OpenError::Failed(format!(
                    "opening a forward stream to {addr}: timed out after {ttl:?}"
                )));
            }
        };
        let pending = Arc::new(Mutex::new(Pending::default()));
        let mux = Arc::new(ForwardMux {
            tx,
            next_id: AtomicU64::new(0),
            pending: pending.clone(),
        });
        lock(&self.forwards).insert(addr.to_string(), mux.clone());
        let leader = addr.to_string();
        tokio::spawn(async move {
            let why = loop {
                match answers.message().await {
                    Ok(Some(p)) => match split_answer(&p.data) {
                        Some((id, answer)) => {
                            let waiter = lock(&pending).waiting.remove(&id);
                            if let Some(waiter) = waiter {
                                let _ = waiter.send(answer);
                            }
                        }
                        None => break "an undecodable answer".to_string(),
                    },
                    Ok(None) => break "the leader ended the forward stream".to_string(),
                    Err(status) => break format!("forward stream: {status}"),
                }
            };
            tracing::debug!(%leader, reason = %why, "forward stream closed");
            let waiting = {
                let mut pending = lock(&pending);
                pending.closed = true;
                std::mem::take(&mut pending.waiting)
            };
            for (_, waiter) in waiting {
                let _ = waiter.send(ForwardAnswer::Lost(format!(
                    "{why} before answering; outcome unknown"
                )));
            }
        });
        Ok(mux)
    }

    /// Drop `mux` as the forward stream to `addr` (a later request opens another).
    fn forget_forward(&self, addr: &str, mux: &Arc<ForwardMux>) {
        let mut forwards = lock(&self.forwards);
        if forwards.get(addr).is_some_and(|m| Arc::ptr_eq(m, mux)) {
            forwards.remove(addr);
        }
    }

    /// One unary call to `addr`.
    pub(crate) async fn call(
        &self,
        addr: &str,
        rpc: Rpc,
        data: Vec<u8>,
        ttl: Duration,
    ) -> Result<Vec<u8>, CallError> {
        if self.is_partitioned() {
            return Err(CallError::NotSent("partitioned".into()));
        }
        let channel = self.channel(addr).await.map_err(CallError::NotSent)?;
        let mut client = RaftTransportClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let req = Payload { data };
        let fut = async {
            match rpc {
                Rpc::Vote => client.vote(req).await,
                Rpc::InstallSnapshot => client.install_snapshot(req).await,
                Rpc::Forward => client.forward(req).await,
            }
        };
        match tokio::time::timeout(ttl, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner().data),
            Ok(Err(status)) => {
                self.forget(addr);
                // The server refuses with `Unavailable` before looking at the request when
                // it is partitioned; other errors leave the outcome unknown.
                if status.code() == tonic::Code::Unavailable && status.message() == PARTITIONED {
                    Err(CallError::NotSent(format!("{addr}: {}", status.message())))
                } else {
                    Err(CallError::Unknown(format!("{addr}: {status}")))
                }
            }
            Err(_) => Err(CallError::Unknown(format!(
                "{addr}: timed out after {ttl:?}"
            ))),
        }
    }
}

const PARTITIONED: &str = "member is partitioned (test switch)";

/// An open `ForwardStream` to one leader: requests go out on `tx` under an ID of their
/// own; a reader task hands each answer to whoever waits under its ID.
struct ForwardMux {
    tx: tokio::sync::mpsc::UnboundedSender<Payload>,
    next_id: AtomicU64,
    pending: Arc<Mutex<Pending>>,
}

#[derive(Default)]
struct Pending {
    /// Set by the reader when the stream ended: nothing more will be answered.
    closed: bool,
    waiting: HashMap<u64, tokio::sync::oneshot::Sender<ForwardAnswer>>,
}

enum OpenError {
    /// The peer does not serve `ForwardStream` (an older member).
    Unsupported,
    Failed(String),
}

/// What came back for one forwarded request.
#[derive(Debug, PartialEq)]
enum ForwardAnswer {
    /// The encoded `ClientResult`.
    Done(Vec<u8>),
    /// Refused before the leader looked at it (partitioned, stopped): safe to retry.
    Refused(String),
    /// The stream broke after the request went out: it may or may not have been applied.
    Lost(String),
}

const ANSWER_DONE: u8 = 0;
const ANSWER_REFUSED: u8 = 1;

/// A `ForwardStream` message: the ID (8 bytes, little-endian), the answer's tag byte
/// (answers only), the body.
fn frame(id: u64, tag: Option<u8>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + body.len());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend(tag);
    out.extend_from_slice(body);
    out
}

/// A request message's ID and body; `None` if it is shorter than an ID.
fn split_request(data: &[u8]) -> Option<(u64, &[u8])> {
    let (id, body) = data.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*id), body))
}

fn split_answer(data: &[u8]) -> Option<(u64, ForwardAnswer)> {
    let (id, rest) = split_request(data)?;
    let (tag, body) = rest.split_first()?;
    let answer = match *tag {
        ANSWER_DONE => ForwardAnswer::Done(body.to_vec()),
        ANSWER_REFUSED => ForwardAnswer::Refused(String::from_utf8_lossy(body).into_owned()),
        _ => return None,
    };
    Some((id, answer))
}

fn source_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Rpc {
    Vote,
    InstallSnapshot,
    Forward,
}

/// Creates a [`PeerClient`] per replication target.
pub struct NetworkFactory {
    pub(crate) net: Arc<NetShared>,
    /// This member's durable log (see [`clamp_commit`]); `None`: sent as openraft says.
    pub(crate) durable: Option<tokio::sync::watch::Receiver<Durability>>,
    pub(crate) metrics: RaftMetrics,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            net: self.net.clone(),
            durable: self.durable.clone(),
            metrics: self.metrics.clone(),
            append: None,
            append_busy: false,
        }
    }
}

/// An open `AppendStream`: requests go in on `tx`, answers come back on `rx`, one each.
struct AppendStream {
    tx: tokio::sync::mpsc::Sender<Payload>,
    rx: tonic::Streaming<Payload>,
}

/// The connection to one peer.
pub struct PeerClient {
    target: u64,
    addr: String,
    net: Arc<NetShared>,
    durable: Option<tokio::sync::watch::Receiver<Durability>>,
    metrics: RaftMetrics,
    /// The AppendEntries stream, opened on first use and after any failure.
    append: Option<AppendStream>,
    /// Set while an AppendEntries is between sending and its answer: found set at the next
    /// call, the last one was abandoned (openraft dropped its future) and its answer may
    /// still be on the way, so the stream is not used again.
    append_busy: bool,
}

type RpcErr<E> = RPCError<u64, BasicNode, RaftError<u64, E>>;

impl PeerClient {
    /// One AppendEntries on this peer's stream (opened if need be). Any failure drops the
    /// stream; the next call opens a new one.
    async fn append_call(&mut self, data: Vec<u8>, ttl: Duration) -> Result<Vec<u8>, String> {
        if self.net.is_partitioned() {
            self.append = None;
            return Err("partitioned".into());
        }
        if std::mem::take(&mut self.append_busy)
            || self.append.as_ref().is_some_and(|s| s.tx.is_closed())
        {
            self.append = None;
        }
        let started = tokio::time::Instant::now();
        let stream = match &mut self.append {
            Some(s) => s,
            None => self
                .append
                .insert(self.net.open_append_stream(&self.addr, ttl).await?),
        };
        let ttl = ttl.saturating_sub(started.elapsed());
        self.append_busy = true;
        let exchange = async {
            stream
                .tx
                .send(Payload { data })
                .await
                .map_err(|_| "the stream closed".to_string())?;
            match stream.rx.message().await {
                Ok(Some(p)) => Ok(p.data),
                Ok(None) => Err("the stream ended".to_string()),
                Err(status) => Err(status.to_string()),
            }
        };
        let result = match tokio::time::timeout(ttl, exchange).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {ttl:?}")),
        };
        self.append_busy = false;
        if result.is_err() {
            self.append = None;
            self.net.forget(&self.addr);
        }
        result.map_err(|e| format!("{}: {e}", self.addr))
    }

    async fn send<Req, Resp, E>(
        &self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let data =
            postcard::to_allocvec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let bytes = match self
            .net
            .call(&self.addr, rpc, data, option.hard_ttl())
            .await
        {
            Ok(b) => b,
            Err(CallError::NotSent(e)) | Err(CallError::Unknown(e)) => {
                return Err(RPCError::Unreachable(Unreachable::new(&AnyError::error(e))));
            }
        };
        let resp: Result<Resp, RaftError<u64, E>> =
            postcard::from_bytes(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        resp.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr<openraft::error::Infallible>> {
        if let Some(durable) = &self.durable {
            let last = durable.borrow().last;
            let commit = rpc.leader_commit.map_or(0, |c| c.index);
            if clamp_commit(&mut rpc, last) {
                self.metrics.commit_clamped.inc();
                self.net.commit_owed.fetch_max(commit, Ordering::AcqRel);
                self.net.commit_owed_signal.notify_one();
            }
        }
        let data =
            postcard::to_allocvec(&rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let bytes = self
            .append_call(data, option.hard_ttl())
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&AnyError::error(e))))?;
        let resp: Result<AppendEntriesResponse<u64>, RaftError<u64>> =
            postcard::from_bytes(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        resp.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<InstallSnapshotError>> {
        self.send(Rpc::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr<openraft::error::Infallible>> {
        self.send(Rpc::Vote, &rpc, &option).await
    }
}

/// Lower the commit index `rpc` carries to `durable`, the end of the sender's durable log;
/// whether it was lowered.
///
/// A leader counts its own entries before their `fdatasync` (see `log_store.rs`), so its
/// commit index may cover an entry a quorum holds only with the leader's unsynced copy.
/// Its own applies wait for the sync; this keeps followers from applying such an entry
/// too: should the leader lose it in a power cut, a new leader may be elected without
/// it, and a follower would have applied an entry the cluster then overwrites.
/// `durable` is an entry of the leader's current log, so it is a valid commit index.
pub(crate) fn clamp_commit(
    rpc: &mut AppendEntriesRequest<TypeConfig>,
    durable: Option<LogId<u64>>,
) -> bool {
    let commit = rpc.leader_commit.map(|c| c.index);
    if commit <= durable.map(|d| d.index) {
        return false;
    }
    rpc.leader_commit = durable;
    true
}

/// The gRPC service a member serves to its peers.
///
/// With TLS (`members_only`) the handshake already admitted members only (see
/// [`crate::tls`]); each request is then held to the member its certificate names:
/// * a Raft message (AppendEntries, Vote, InstallSnapshot) must come from the member whose
///   vote it carries, so no member speaks for another;
/// * a forwarded request must come from a member of the cluster as this member knows it
///   (a removed member's certificate stays valid until it expires, its forwarded writes
///   and membership changes do not), except `Join`, which a new member sends before it is
///   one, and only under the ID its certificate names.
pub(crate) struct RaftService {
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) net: Arc<NetShared>,
    pub(crate) inner: Weak<Inner>,
    /// Turns true when the member stops (ends the forward streams it serves).
    pub(crate) stopped: tokio::sync::watch::Receiver<bool>,
    /// Requests come over mutual TLS and must carry a member's certificate.
    pub(crate) members_only: bool,
}

fn refused(why: String) -> tonic::Status {
    tracing::warn!(reason = %why, "raft request refused");
    tonic::Status::permission_denied(why)
}

impl RaftService {
    /// The member ID the request's client certificate names: `None` without TLS (loopback
    /// only), an error when TLS is on and the request carries no member's certificate.
    fn peer<T>(&self, request: &tonic::Request<T>) -> Result<Option<u64>, tonic::Status> {
        if !self.members_only {
            return Ok(None);
        }
        match request
            .extensions()
            .get::<crate::tls::PeerInfo>()
            .and_then(|p| p.identity.clone())
        {
            Some(lattice_pki::Identity::Member(id)) => Ok(Some(id)),
            other => Err(refused(format!(
                "the Raft port serves store members only, not {}",
                other.map_or("a peer without a certificate".into(), |i| i.to_string())
            ))),
        }
    }
}

/// A Raft message must come from the member whose vote it carries.
fn check_sender(
    peer: Option<u64>,
    vote: &openraft::Vote<u64>,
    what: &str,
) -> Result<(), tonic::Status> {
    match (peer, vote.leader_id().voted_for()) {
        (None, _) => Ok(()),
        (Some(p), Some(v)) if p == v => Ok(()),
        (Some(p), v) => Err(refused(format!(
            "member:{p} sent {what} on behalf of member {v:?}: a member speaks only for itself"
        ))),
    }
}

/// Whether `peer` may have `req` handled here (see [`RaftService`]).
fn check_forward(
    raft: &Raft<TypeConfig>,
    peer: Option<u64>,
    req: &ClientRequest,
) -> Result<(), WireError> {
    let Some(peer) = peer else { return Ok(()) };
    if let ClientRequest::Join { id, .. } = req {
        if *id != peer {
            return Err(WireError::PermissionDenied(format!(
                "member:{peer} may not join as member {id}: a member joins only under the ID \
                 its certificate names"
            )));
        }
        return Ok(());
    }
    let known = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .get_node(&peer)
        .is_some();
    if known {
        Ok(())
    } else {
        Err(WireError::PermissionDenied(format!(
            "member:{peer} is not a member of this cluster (removed, or not joined yet): \
             only members may forward requests or change the membership"
        )))
    }
}

fn bad_request(e: impl std::fmt::Display) -> tonic::Status {
    tonic::Status::invalid_argument(format!("undecodable raft payload: {e}"))
}

fn encode<T: Serialize>(v: &T) -> Result<tonic::Response<Payload>, tonic::Status> {
    postcard::to_allocvec(v)
        .map(|data| tonic::Response::new(Payload { data }))
        .map_err(|e| tonic::Status::internal(e.to_string()))
}

impl RaftService {
    fn check(&self) -> Result<(), tonic::Status> {
        if self.net.is_partitioned() {
            return Err(tonic::Status::unavailable(PARTITIONED));
        }
        Ok(())
    }
}

/// The answers of a streaming RPC.
type PayloadStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Payload, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftTransport for RaftService {
    async fn append_entries(
        &self,
        request: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, tonic::Status> {
        self.check()?;
        let peer = self.peer(&request)?;
        let req: AppendEntriesRequest<TypeConfig> =
            postcard::from_bytes(&request.into_inner().data).map_err(bad_request)?;
        check_sender(peer, &req.vote, "AppendEntries")?;
        encode(&self.raft.append_entries(req).await)
    }

    type AppendStreamStream = PayloadStream;

    /// Answers each request of the stream in turn, in the task that sends the answers
    /// (no hand-over to another task). A refusal (partitioned, undecodable) ends the stream
    /// with its status.
    async fn append_stream(
        &self,
        request: tonic::Request<tonic::Streaming<Payload>>,
    ) -> Result<tonic::Response<Self::AppendStreamStream>, tonic::Status> {
        self.check()?;
        let peer = self.peer(&request)?;
        let state = (
            Some(request.into_inner()),
            self.raft.clone(),
            self.net.clone(),
            self.inner.clone(),
        );
        let answers =
            futures::stream::unfold(state, move |(inbound, raft, net, inner)| async move {
                let mut inbound = inbound?;
                let data = match inbound.message().await {
                    Ok(Some(p)) => p.data,
                    Ok(None) | Err(_) => return None,
                };
                let refusal = if net.is_partitioned() {
                    Some(tonic::Status::unavailable(PARTITIONED))
                } else if inner
                    .upgrade()
                    .is_none_or(|i| i.stopped.load(Ordering::SeqCst))
                {
                    // A stopped member's server lets open streams finish before its connections
                    // close (graceful shutdown): end this one, so the leader reconnects (to
                    // whatever member serves this address next) rather than talk to the
                    // stopped one forever.
                    Some(tonic::Status::unavailable("member stopped"))
                } else {
                    None
                };
                if let Some(refused) = refusal {
                    return Some((Err(refused), (None, raft, net, inner)));
                }
                let req: AppendEntriesRequest<TypeConfig> = match postcard::from_bytes(&data) {
                    Ok(req) => req,
                    Err(e) => return Some((Err(bad_request(e)), (None, raft, net, inner))),
                };
                if let Err(refusal) = check_sender(peer, &req.vote, "AppendEntries") {
                    return Some((Err(refusal), (None, raft, net, inner)));
                }
                let answer = encode(&raft.append_entries(req).await).map(|r| r.into_inner());
                let next = if answer.is_ok() { Some(inbound) } else { None };
                Some((answer, (next, raft, net, inner)))
            });
        Ok(tonic::Response::new(Box::pin(answers)))
    }

    async fn vote(
        &self,
        request: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, tonic::Status> {
        self.check()?;
        let peer = self.peer(&request)?;
        let req: VoteRequest<u64> =
            postcard::from_bytes(&request.into_inner().data).map_err(bad_request)?;
        check_sender(peer, &req.vote, "Vote")?;
        encode(&self.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, tonic::Status> {
        self.check()?;
        let peer = self.peer(&request)?;
        let req: InstallSnapshotRequest<TypeConfig> =
            postcard::from_bytes(&request.into_inner().data).map_err(bad_request)?;
        check_sender(peer, &req.vote, "InstallSnapshot")?;
        encode(&self.raft.install_snapshot(req).await)
    }

    async fn forward(
        &self,
        request: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, tonic::Status> {
        self.check()?;
        let peer = self.peer(&request)?;
        let req: ClientRequest =
            postcard::from_bytes(&request.into_inner().data).map_err(bad_request)?;
        let resp = match (check_forward(&self.raft, peer, &req), self.inner.upgrade()) {
            (Err(refusal), _) => {
                tracing::warn!(?peer, error = ?refusal, "forwarded request refused");
                Err(refusal)
            }
            (Ok(()), Some(inner)) => super::RaftStore::handle_forward(inner, req).await,
            (Ok(()), None) => Err(WireError::Stopped),
        };
        encode(&resp)
    }

    type ForwardStreamStream = PayloadStream;

    /// Reads the member's forwarded requests and handles each in a task of its own,
    /// answering as each finishes. Partitioned or stopped, it refuses the request it read
    /// (the sender may retry it) and ends the stream; it also ends when the member stops.
    async fn forward_stream(
        &self,
        request: tonic::Request<tonic::Streaming<Payload>>,
    ) -> Result<tonic::Response<Self::ForwardStreamStream>, tonic::Status> {
        if self.net.refuse_forward_streams.load(Ordering::SeqCst) {
            return Err(tonic::Status::unimplemented(
                "ForwardStream refused (test switch)",
            ));
        }
        self.check()?;
        let peer = self.peer(&request)?;
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Payload, tonic::Status>>();
        let net = self.net.clone();
        let raft = self.raft.clone();
        let weak = self.inner.clone();
        let mut stopped = self.stopped.clone();
        tokio::spawn(async move {
            loop {
                let data = tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(p)) => p.data,
                        Ok(None) | Err(_) => break,
                    },
                    _ = stopped.wait_for(|s| *s) => break,
                };
                let Some((id, body)) = split_request(&data) else {
                    let _ = tx.send(Err(bad_request("a forward message shorter than its ID")));
                    break;
                };
                let refuse = |why: &str| {
                    Ok(Payload {
                        data: frame(id, Some(ANSWER_REFUSED), why.as_bytes()),
                    })
                };
                if net.is_partitioned() {
                    let _ = tx.send(refuse(PARTITIONED));
                    break;
                }
                let Some(inner) = weak.upgrade().filter(|i| !i.stopped.load(Ordering::SeqCst))
                else {
                    let _ = tx.send(refuse("member stopped"));
                    break;
                };
                let tx = tx.clone();
                let req = postcard::from_bytes::<ClientRequest>(body);
                let allowed = match &req {
                    Ok(req) => check_forward(&raft, peer, req),
                    Err(_) => Ok(()),
                };
                tokio::spawn(async move {
                    let resp = match (req, allowed) {
                        (_, Err(refusal)) => {
                            tracing::warn!(?peer, error = ?refusal, "forwarded request refused");
                            Err(refusal)
                        }
                        (Ok(req), Ok(())) => super::RaftStore::handle_forward(inner, req).await,
                        (Err(e), Ok(())) => Err(WireError::InvalidArgument(format!(
                            "undecodable forwarded request: {e}"
                        ))),
                    };
                    let answer = postcard::to_allocvec(&resp)
                        .map(|b| Payload {
                            data: frame(id, Some(ANSWER_DONE), &b),
                        })
                        .map_err(|e| tonic::Status::internal(e.to_string()));
                    let _ = tx.send(answer);
                });
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_frames_round_trip() {
        let req = frame(7, None, b"request");
        assert_eq!(split_request(&req), Some((7, &b"request"[..])));
        let done = frame(u64::MAX, Some(ANSWER_DONE), b"result");
        assert_eq!(
            split_answer(&done),
            Some((u64::MAX, ForwardAnswer::Done(b"result".to_vec())))
        );
        let refused = frame(3, Some(ANSWER_REFUSED), b"member stopped");
        assert_eq!(
            split_answer(&refused),
            Some((3, ForwardAnswer::Refused("member stopped".into())))
        );
        // An empty body is a valid request (the server's decoder then rejects it).
        assert_eq!(split_request(&frame(1, None, b"")), Some((1, &b""[..])));
    }

    proptest::proptest! {
        /// Any bytes on the stream parse to a frame or to `None`, never a panic; every
        /// frame built comes back as it was.
        #[test]
        fn forward_frames_parse_any_bytes_and_round_trip(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
            id in proptest::prelude::any::<u64>(),
            refused in proptest::prelude::any::<bool>(),
        ) {
            let _ = split_request(&data);
            let _ = split_answer(&data);
            let request = frame(id, None, &data);
            proptest::prop_assert_eq!(split_request(&request), Some((id, &data[..])));
            let (tag, expected) = if refused {
                (ANSWER_REFUSED, ForwardAnswer::Refused(String::from_utf8_lossy(&data).into_owned()))
            } else {
                (ANSWER_DONE, ForwardAnswer::Done(data.clone()))
            };
            proptest::prop_assert_eq!(split_answer(&frame(id, Some(tag), &data)), Some((id, expected)));
        }
    }

    /// The Raft port's defences, each by the attack itself against a one-member cluster
    /// over mutual TLS: a peer without a member certificate (none, an administrator's from
    /// the same CA, a member's from another CA, or plaintext) can neither append entries,
    /// nor vote, nor join; a member may join only as itself, speaks only for itself, and
    /// forwards nothing unless it belongs to the cluster. Nothing of it reaches the state:
    /// the term, the membership and the revision are as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_raft_port_refuses_whoever_is_not_the_member_it_claims_to_be() {
        use lattice_pki::{Ca, Identity, IssueRequest, Usage};
        use openraft::Vote;

        use crate::raft::pb::raft_transport_client::RaftTransportClient;
        use crate::raft::ClientResult;
        use crate::raft::{RaftConfig, RaftStore};
        use crate::tls::MemberTls;
        use crate::types::{PutRequest, TxnOp, TxnRequest};
        use crate::KvBackend;

        let ca = Ca::generate("cluster CA", Duration::from_secs(3600)).unwrap();
        let issue = |ca: &Ca, id: Identity| {
            ca.issue(&IssueRequest::new(id, Usage::ClientAndServer).name("127.0.0.1"))
                .unwrap()
        };
        let m1 = issue(&ca, Identity::Member(1));
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = RaftConfig::new(1, dir.path(), "127.0.0.1:0".parse().unwrap());
        cfg.bootstrap = true;
        cfg.tls = Some(MemberTls::from_pem(ca.cert_pem(), &m1.cert_pem, &m1.key_pem).unwrap());
        let store = RaftStore::start(cfg).await.unwrap();
        store
            .wait_for_leader(Duration::from_secs(10))
            .await
            .unwrap();
        store
            .put(PutRequest::new("/before", "attacks"))
            .await
            .unwrap();
        let addr = store.local_addr().to_string();
        let before = (store.raft_status(), store.revision());

        let h2 = |mut c: rustls::ClientConfig| {
            c.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(c)
        };
        let as_client = |ca_pem: &str, who: Option<&lattice_pki::Issued>| {
            h2(lattice_pki::client_config(
                ca_pem,
                who.map(|w| (w.cert_pem.as_str(), w.key_pem.as_str())),
            )
            .unwrap())
        };
        let vote = |term: u64, node: u64| {
            postcard::to_allocvec(&VoteRequest::<u64> {
                vote: Vote::new(term, node),
                last_log_id: None,
            })
            .unwrap()
        };
        let append = |term: u64, node: u64| {
            postcard::to_allocvec(&AppendEntriesRequest::<TypeConfig> {
                vote: Vote::new_committed(term, node),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            })
            .unwrap()
        };
        let forward = |req: &ClientRequest| postcard::to_allocvec(req).unwrap();
        let join = |id: u64| ClientRequest::Join {
            id,
            addr: "127.0.0.1:9".into(),
        };
        // Every RPC of the attack, on one connection; how each one ended.
        async fn attack(
            addr: &str,
            tls: Option<Arc<rustls::ClientConfig>>,
            calls: Vec<(&'static str, Vec<u8>)>,
        ) -> Vec<(&'static str, Result<Vec<u8>, tonic::Status>)> {
            let channel = match tls {
                Some(tls) => crate::tls::connect(addr, tls, Duration::from_secs(2)).await,
                None => tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect()
                    .await
                    .map_err(Into::into),
            };
            let mut out = Vec::new();
            let Ok(channel) = channel else {
                return calls
                    .into_iter()
                    .map(|(n, _)| (n, Err(tonic::Status::unavailable("no connection"))))
                    .collect();
            };
            let mut client = RaftTransportClient::new(channel);
            for (name, data) in calls {
                let req = Payload { data };
                let res = match name {
                    "vote" => client.vote(req).await,
                    "append" => client.append_entries(req).await,
                    _ => client.forward(req).await,
                };
                out.push((name, res.map(|r| r.into_inner().data)));
            }
            out
        }

        let other_ca = Ca::generate("another CA", Duration::from_secs(3600)).unwrap();
        let admin = issue(&ca, Identity::Admin("ops".into()));
        let foreign_member = issue(&other_ca, Identity::Member(9));
        let strangers: Vec<(&str, Option<Arc<rustls::ClientConfig>>)> = vec![
            (
                "no client certificate",
                Some(as_client(ca.cert_pem(), None)),
            ),
            (
                "an administrator's certificate",
                Some(as_client(ca.cert_pem(), Some(&admin))),
            ),
            (
                "a member certificate from another CA",
                Some(as_client(ca.cert_pem(), Some(&foreign_member))),
            ),
            ("plaintext", None),
        ];
        for (who, tls) in strangers {
            let calls = vec![
                ("vote", vote(100, 9)),
                ("append", append(100, 9)),
                ("forward", forward(&join(9))),
            ];
            for (rpc, res) in attack(&addr, tls, calls).await {
                assert!(res.is_err(), "{who}: {rpc} got through");
            }
        }

        // A genuine member certificate, of a member that is not in the cluster.
        let m5 = issue(&ca, Identity::Member(5));
        let tls = Some(as_client(ca.cert_pem(), Some(&m5)));
        let put = ClientRequest::Write(crate::mvcc::Command::Txn(TxnRequest {
            success: vec![TxnOp::Put(PutRequest::new("/attack", "x"))],
            ..Default::default()
        }));
        let calls = vec![
            ("vote", vote(100, 6)),
            ("append", append(100, 1)),
            ("forward", forward(&join(6))),
            ("forward", forward(&put)),
            ("forward", forward(&ClientRequest::Remove { id: 1 })),
        ];
        let results = attack(&addr, tls, calls).await;
        for (i, (rpc, res)) in results.into_iter().enumerate() {
            match (i, res) {
                (0 | 1, Err(status)) => {
                    assert_eq!(
                        status.code(),
                        tonic::Code::PermissionDenied,
                        "{rpc}: {status}"
                    );
                    assert!(
                        status.message().contains("speaks only for itself"),
                        "{status}"
                    );
                }
                (2..=4, Ok(bytes)) => {
                    let answer: ClientResult = postcard::from_bytes(&bytes).unwrap();
                    let Err(WireError::PermissionDenied(why)) = answer else {
                        panic!("forwarded request #{i} not refused: {answer:?}");
                    };
                    let expected = if i == 2 {
                        "only under the ID"
                    } else {
                        "not a member"
                    };
                    assert!(why.contains(expected), "{why}");
                }
                (i, other) => panic!("call #{i} ({rpc}): {other:?}"),
            }
        }

        let after = (store.raft_status(), store.revision());
        assert_eq!(after.0.term, before.0.term, "no vote counted");
        assert_eq!(after.0.voters, before.0.voters);
        assert!(after.0.learners.is_empty());
        assert_eq!(after.1, before.1, "nothing written");
        assert!(store.is_leader());
        store.shutdown().await;
    }

    #[test]
    fn malformed_forward_frames_are_rejected() {
        assert_eq!(split_request(b"short"), None);
        assert_eq!(split_answer(&7u64.to_le_bytes()), None, "no tag");
        assert_eq!(split_answer(&frame(7, Some(9), b"x")), None, "unknown tag");
    }
}
