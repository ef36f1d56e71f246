//! Raft replication of the store with openraft 0.9 (`storage-v2`): [`RaftStore`], a
//! replicated [`KvBackend`].
//!
//! # Pieces
//! * `log_store`: the Raft log on redb (`<data_dir>/raft-log.redb`) behind a write-ahead
//!   log (`raft-log.wal`), fsynced before openraft is told an append or a vote is durable
//!   — except the leader's own appends, reported at once so that replication overlaps
//!   the leader's write; then its applies (answers, reads, watch events, snapshots), the
//!   commit index it sends to followers and the committed log ID it saves all wait for
//!   its durable log (see that module's docs).
//! * `state_machine`: [`crate::mvcc::Mvcc`] + [`crate::persist::Persist`]
//!   (`<data_dir>/state.redb`); each applied batch commits data, last applied log ID and
//!   membership in one transaction, fsynced only at checkpoints (the fsynced log is the
//!   durable record; a member redoes what a crash lost from it); snapshots are
//!   [`crate::Backup`] payloads.
//! * `network`: Raft RPCs and client forwarding over gRPC (`proto/raft.proto`, tonic).
//!
//! # Semantics
//! * Writes (`txn` with writes, leases, compaction) are Raft log entries. A member that is
//!   not the leader forwards them to the leader over gRPC, on one long-lived stream per
//!   leader shared by all its writers, and answers once the leader has answered and it
//!   has applied the entry itself. An `Ok` answer means the entry is committed and
//!   applied. A request that may or may not have been applied (the leader
//!   died or stepped down mid-request, or commit took longer than
//!   [`RaftConfig::request_timeout`]) fails with `StoreError::Backend("… outcome
//!   unknown …")`; the store never retries such a request itself, so a write is never
//!   applied twice. A request that surely was not applied (no leader yet, the member asked
//!   does not lead) is retried until `request_timeout`, then fails with
//!   `StoreError::NoLeader`.
//! * Linearizable reads (`serializable == false`) first get a read index from the leader
//!   (`Raft::ensure_linearizable`), wait until this member has applied it, then read
//!   locally. Serializable reads and watches are served from the local applied state.
//! * Leases: the leader tracks deadlines (all refreshed when a member becomes leader) and
//!   proposes `LeaseRevoke` through the log when one expires; keep-alives go to the leader.
//!
//! # Cluster lifecycle (what `lattice-server` wires to `--node-id`, `--raft-addr`,
//! `--bootstrap`, `--join`)
//! ```no_run
//! # async fn demo() -> lattice_store::StoreResult<()> {
//! use lattice_store::raft::{RaftConfig, RaftStore};
//! // First member, once, with --bootstrap: forms a one-member cluster if its log is empty
//! // (a restart with --bootstrap is harmless: an initialized log is never re-initialized).
//! let mut c1 = RaftConfig::new(1, "/var/lib/lattice/1", "127.0.0.1:7001".parse().unwrap());
//! c1.bootstrap = true;
//! let s1 = RaftStore::start(c1).await?;
//! // Other members start without --bootstrap and wait to be added...
//! let s2 = RaftStore::start(RaftConfig::new(2, "/var/lib/lattice/2", "127.0.0.1:7002".parse().unwrap())).await?;
//! // ...by any member (forwarded to the leader): learner first, then promoted to voter.
//! s1.add_member(2, s2.advertise_addr().to_string()).await?;
//! println!("{:?}", s1.members().await?);
//! s1.remove_member(2).await?;
//! # Ok(()) }
//! ```
//! `--join <addr>` maps to `RaftStore::start` without bootstrap followed by
//! [`RaftStore::join`]`(addr)`: the member at `addr` (any member's Raft address) adds the
//! newcomer as a learner, waits for it to catch up, then promotes it (forwarding to the
//! leader). Joining again after a restart is a no-op. Never reuse the ID of a removed
//! member, and shut a removed member down (it is no longer told about the cluster).
//!
//! # Notes
//! * Concurrent writes are coalesced into one log entry ([`Proposal`]) and proposals are
//!   pipelined; each command still gets its own revision. The log is group-committed
//!   (one fsync for every append queued meanwhile).
//! * A write returns once applied on the leader *and* on the member it was sent to, so a
//!   client sees its own writes on that member, even with serializable reads or watches.
//! * A member that installs a snapshot has no history before it: its watchers are ended
//!   (`StoreError::Stopped`) and must re-watch; older revisions read as compacted there.
//! * Call [`RaftStore::shutdown`] to stop a member; dropping the handles does not stop Raft.

mod log_store;
mod network;
mod state_machine;

#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("lattice.raft.v1");
}

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;

use crate::backend::{KvBackend, WatchStream};
use crate::error::{StoreError, StoreResult};
use crate::mvcc::{Command, CommandResponse, Limits};
use crate::types::*;

pub use log_store::{LogStore, LOG_FILE, LOG_WAL_FILE};
pub use network::{NetShared, NetworkFactory, PeerClient};
pub use state_machine::{SnapshotBuilder, StateMachine};

use network::{CallError, Rpc};
use state_machine::{lock, SmShared};

openraft::declare_raft_types!(
    /// openraft type configuration of the store.
    pub TypeConfig:
        D = Proposal,
        R = RaftResponse,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// One log entry's payload: commands proposed together (concurrent client writes are
/// coalesced into one entry, so one round of replication and fsyncs serves them all).
/// They are applied in order, each as if it were its own entry: every write still gets its
/// own revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub commands: Vec<Command>,
}

/// The state machine's answer to one log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftResponse {
    /// Blank, membership, or already-applied entries.
    Skipped,
    /// One result per command of the [`Proposal`], in order.
    Commands(Vec<Result<CommandResponse, WireError>>),
}

/// Most commands coalesced into one log entry.
const MAX_PROPOSAL: usize = 256;

/// A command's result and the index of the log entry that carried it.
type Reply = tokio::sync::oneshot::Sender<Result<(CommandResponse, u64), WireError>>;

/// Coalesce queued writes into proposals; proposals are pipelined (each one's commit is
/// awaited in its own task).
///
/// openraft 0.9's core appends one proposal at a time and waits for its log flush before it
/// takes the next one (for the leader's own appends the flush is reported at once, see
/// `log_store`, but the core still takes them one by one). So a proposal is handed over
/// only once the core has dealt with the previous one (a no-op core request queued behind
/// it answers then): writes arriving meanwhile wait here and go out together, in one
/// entry, one fsync and one round of replication, instead of queueing one by one inside
/// the core.
async fn proposer(
    raft: Raft<TypeConfig>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(Command, Reply)>,
    metrics: crate::metrics::RaftMetrics,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_PROPOSAL {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (commands, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
        let proposed = std::time::Instant::now();
        let commit_seconds = metrics.commit_seconds.clone();
        let receiver = match raft.client_write_ff(Proposal { commands }).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "proposal refused: raft stopped");
                for reply in replies {
                    let _ = reply.send(Err(WireError::Stopped));
                }
                continue;
            }
        };
        tokio::spawn(async move {
            let answer = receiver.await;
            if matches!(answer, Ok(Ok(_))) {
                commit_seconds.observe(proposed.elapsed().as_secs_f64());
            }
            let answers: Vec<Result<(CommandResponse, u64), WireError>> = match answer {
                Ok(Ok(resp)) => match resp.data {
                    RaftResponse::Commands(results) if results.len() == replies.len() => {
                        let index = resp.log_id.index;
                        results.into_iter().map(|r| r.map(|c| (c, index))).collect()
                    }
                    other => {
                        let e = WireError::Backend(format!("unexpected apply result {other:?}"));
                        vec![Err(e); replies.len()]
                    }
                },
                // openraft answers ForwardToLeader both when it refuses a proposal and when
                // it truncates an appended-but-uncommitted one on stepping down; the latter
                // may still be committed by a later leader holding a copy, so a write can
                // never be retried on this answer. (`handle_local` refuses up front, safely,
                // when this member does not lead.)
                Ok(Err(ClientWriteError::ForwardToLeader(f))) => vec![
                    Err(WireError::Backend(format!(
                        "leadership moved (to {:?}) before the write was confirmed; outcome unknown",
                        f.leader_id
                    )));
                    replies.len()
                ],
                Ok(Err(e)) => vec![Err(write_error(RaftError::APIError(e))); replies.len()],
                // The leader stepped down or stopped before answering: the entry may
                // still be committed by the next leader.
                Err(_) => vec![
                    Err(WireError::Backend(
                        "leader changed before the write was confirmed; outcome unknown".into()
                    ));
                    replies.len()
                ],
            };
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        });
        // Wait until the core has appended (and flushed) this proposal; an error means Raft
        // stopped, which the next `client_write_ff` reports.
        let _ = raft.with_raft_state(|_| ()).await;
    }
}

/// [`StoreError`] on the wire (the error type itself carries no serde derives).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    Compacted {
        compact_revision: i64,
    },
    FutureRevision {
        requested: i64,
        current: i64,
    },
    KeyTooLarge {
        size: usize,
        limit: usize,
    },
    EmptyKey,
    ValueTooLarge {
        size: usize,
        limit: usize,
    },
    RequestTooLarge {
        size: usize,
        limit: usize,
    },
    TooManyOps {
        ops: usize,
        limit: usize,
    },
    DuplicateKey,
    LeaseNotFound,
    LeaseExists,
    LeaseTtlOutOfRange(i64),
    KeyNotFound,
    NoLeader(String),
    Stopped,
    Corrupt(String),
    Io(String),
    InvalidArgument(String),
    Backend(String),
    /// The member asked is not the leader (the request was not applied); the leader it
    /// knows of, if any.
    NotLeader(Option<u64>),
    NoSpace {
        quota_bytes: u64,
    },
    PermissionDenied(String),
}

impl From<StoreError> for WireError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Compacted { compact_revision } => WireError::Compacted { compact_revision },
            StoreError::FutureRevision { requested, current } => {
                WireError::FutureRevision { requested, current }
            }
            StoreError::KeyTooLarge { size, limit } => WireError::KeyTooLarge { size, limit },
            StoreError::EmptyKey => WireError::EmptyKey,
            StoreError::ValueTooLarge { size, limit } => WireError::ValueTooLarge { size, limit },
            StoreError::RequestTooLarge { size, limit } => {
                WireError::RequestTooLarge { size, limit }
            }
            StoreError::TooManyOps { ops, limit } => WireError::TooManyOps { ops, limit },
            StoreError::DuplicateKey => WireError::DuplicateKey,
            StoreError::LeaseNotFound => WireError::LeaseNotFound,
            StoreError::LeaseExists => WireError::LeaseExists,
            StoreError::LeaseTtlOutOfRange(t) => WireError::LeaseTtlOutOfRange(t),
            StoreError::KeyNotFound => WireError::KeyNotFound,
            StoreError::NoLeader(s) => WireError::NoLeader(s),
            StoreError::Stopped => WireError::Stopped,
            StoreError::Corrupt(s) => WireError::Corrupt(s),
            StoreError::Io(s) => WireError::Io(s),
            StoreError::InvalidArgument(s) => WireError::InvalidArgument(s),
            StoreError::Backend(s) => WireError::Backend(s),
            StoreError::NoSpace { quota_bytes } => WireError::NoSpace { quota_bytes },
            StoreError::PermissionDenied(s) => WireError::PermissionDenied(s),
        }
    }
}

impl From<WireError> for StoreError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Compacted { compact_revision } => StoreError::Compacted { compact_revision },
            WireError::FutureRevision { requested, current } => {
                StoreError::FutureRevision { requested, current }
            }
            WireError::KeyTooLarge { size, limit } => StoreError::KeyTooLarge { size, limit },
            WireError::EmptyKey => StoreError::EmptyKey,
            WireError::ValueTooLarge { size, limit } => StoreError::ValueTooLarge { size, limit },
            WireError::RequestTooLarge { size, limit } => {
                StoreError::RequestTooLarge { size, limit }
            }
            WireError::TooManyOps { ops, limit } => StoreError::TooManyOps { ops, limit },
            WireError::DuplicateKey => StoreError::DuplicateKey,
            WireError::LeaseNotFound => StoreError::LeaseNotFound,
            WireError::LeaseExists => StoreError::LeaseExists,
            WireError::LeaseTtlOutOfRange(t) => StoreError::LeaseTtlOutOfRange(t),
            WireError::KeyNotFound => StoreError::KeyNotFound,
            WireError::NoLeader(s) => StoreError::NoLeader(s),
            WireError::Stopped => StoreError::Stopped,
            WireError::Corrupt(s) => StoreError::Corrupt(s),
            WireError::Io(s) => StoreError::Io(s),
            WireError::InvalidArgument(s) => StoreError::InvalidArgument(s),
            WireError::Backend(s) => StoreError::Backend(s),
            WireError::NoSpace { quota_bytes } => StoreError::NoSpace { quota_bytes },
            WireError::PermissionDenied(s) => StoreError::PermissionDenied(s),
            WireError::NotLeader(l) => StoreError::NoLeader(match l {
                Some(l) => format!("member {l} is the leader"),
                None => "no leader elected".into(),
            }),
        }
    }
}

/// What a member asks the leader (the `Forward` RPC); also handled locally by a leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ClientRequest {
    Write(Command),
    ReadIndex,
    KeepAlive(i64),
    TimeToLive {
        id: i64,
        keys: bool,
    },
    KeepAliveMany(Vec<i64>),
    AddLearner {
        id: u64,
        addr: String,
    },
    Promote {
        id: u64,
    },
    Remove {
        id: u64,
    },
    /// Sent by a new member to any member (`--join`): that member adds the sender as a
    /// learner and promotes it, forwarding to the leader as needed.
    Join {
        id: u64,
        addr: String,
    },
    /// Sent by an operator tool to any member (`lattice-server membership remove`): that
    /// member removes `id`, forwarding to the leader as needed.
    RemoveVia {
        id: u64,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ClientReply {
    /// The command's result and its log index (for read-your-writes on the asking member).
    Write(CommandResponse, u64),
    ReadIndex(u64),
    KeepAlive(i64),
    TimeToLive(LeaseTimeToLive),
    KeepAliveMany(Vec<Option<i64>>),
    Done,
}

type ClientResult = Result<ClientReply, WireError>;

pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 4);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) fn unseal(record: &[u8]) -> Result<&[u8], String> {
    if record.len() < 4 {
        return Err("record is truncated".into());
    }
    let (crc, payload) = record.split_at(4);
    let expected = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(payload) != expected {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

/// Configuration of one replicated member.
#[derive(Clone, Debug)]
pub struct RaftConfig {
    /// This member's ID (`--node-id`); never reuse the ID of a removed member.
    pub node_id: u64,
    /// Holds `raft-log.redb`, `raft-log.wal` and `state.redb`.
    pub data_dir: PathBuf,
    /// Where the Raft gRPC service listens (`--raft-addr`); port 0 picks a free port.
    pub raft_addr: SocketAddr,
    /// Address peers use to reach this member; defaults to the bound listen address.
    pub advertise_addr: Option<String>,
    /// `--bootstrap`: form a new one-member cluster if the log is empty.
    pub bootstrap: bool,
    pub cluster_name: String,
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot (and purge the log) after this many entries since the last one.
    /// Default 100,000, etcd's `--snapshot-count` since 3.2. A snapshot here serializes
    /// the whole key space (etcd's only marks its backend file), and every member builds
    /// it at the same index: at 10,000, with 96,000 keys (27 MB), a 3-member cluster on
    /// two cores did 955–1,327 sequential puts/s in rounds of 2,000 that overlapped one,
    /// 1,361–1,600 in the rounds around them.
    pub snapshot_logs: u64,
    /// Log entries kept after a snapshot (lets a slightly lagging follower catch up from the
    /// log rather than a snapshot). Default 5,000, as etcd keeps.
    pub keep_logs_after_snapshot: u64,
    /// How long a client request waits for a leader and for its commit.
    pub request_timeout: Duration,
    pub limits: Limits,
    pub watch_buffer: usize,
    pub progress_interval: Duration,
    pub lease_check_interval: Duration,
    /// Mutual TLS on the Raft port and to peers (this member's certificate and the
    /// cluster CA). `None`: plaintext, which the member allows only when its listen and
    /// advertised addresses are loopback ones and then dials loopback peers only.
    pub tls: Option<crate::tls::MemberTls>,
    /// The store's size quota (etcd's `--quota-backend-bytes`), see [`crate::quota`].
    pub quota_bytes: u64,
}

impl RaftConfig {
    pub fn new(node_id: u64, data_dir: impl Into<PathBuf>, raft_addr: SocketAddr) -> Self {
        Self {
            node_id,
            data_dir: data_dir.into(),
            raft_addr,
            advertise_addr: None,
            bootstrap: false,
            cluster_name: "lattice".into(),
            heartbeat_interval: Duration::from_millis(150),
            election_timeout_min: Duration::from_millis(600),
            election_timeout_max: Duration::from_millis(1200),
            snapshot_logs: 100_000,
            keep_logs_after_snapshot: 5_000,
            request_timeout: Duration::from_secs(10),
            limits: Limits::default(),
            watch_buffer: 256,
            progress_interval: Duration::from_secs(5),
            lease_check_interval: Duration::from_millis(200),
            tls: None,
            quota_bytes: crate::quota::DEFAULT_QUOTA_BYTES,
        }
    }
}

/// Open the Raft log and the state machine in `dir` without starting Raft: what
/// [`RaftStore::start`] hands to openraft. Exposed for storage tests (openraft's
/// `testing::Suite`) and tools; a directory must not be opened twice at once.
pub fn open_storage(
    dir: impl Into<PathBuf>,
    limits: Limits,
) -> StoreResult<(LogStore, StateMachine)> {
    let dir = dir.into();
    let log = log_store::LogDb::open(&dir).map_err(StoreError::Io)?;
    let sm = match SmShared::open(dir, limits) {
        Ok(sm) => sm,
        Err(e) => {
            // Stop the log's writer thread and close its file, or a retry in this
            // process would find them still held.
            log.close();
            return Err(e);
        }
    };
    Ok((
        LogStore { db: log },
        StateMachine {
            shared: sm,
            durable: None,
        },
    ))
}

/// Raft view of a member: who leads, term, log and apply positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftStatus {
    pub id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub last_log_index: u64,
    pub last_applied_index: u64,
    pub state: String,
    pub is_leader: bool,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
}

pub(crate) struct Inner {
    config: RaftConfig,
    advertise: String,
    local_addr: SocketAddr,
    raft: Raft<TypeConfig>,
    sm: Arc<SmShared>,
    log: Arc<log_store::LogDb>,
    net: Arc<NetShared>,
    stopped: AtomicBool,
    /// Turns true with `stopped`, for tasks that wait (the forward streams served).
    stopped_watch: tokio::sync::watch::Sender<bool>,
    server_stop: Mutex<Option<oneshot::Sender<()>>>,
    server_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    proposals: tokio::sync::mpsc::UnboundedSender<(Command, Reply)>,
    /// Set while this member (leading) proposes the NOSPACE alarm, so that the writes
    /// refused meanwhile do not each propose it again.
    raising_alarm: AtomicBool,
}

/// A replicated [`KvBackend`] member. Cheap to clone.
#[derive(Clone)]
pub struct RaftStore {
    inner: Arc<Inner>,
}

fn raft_config(c: &RaftConfig) -> StoreResult<openraft::Config> {
    let cfg = openraft::Config {
        cluster_name: c.cluster_name.clone(),
        heartbeat_interval: c.heartbeat_interval.as_millis() as u64,
        election_timeout_min: c.election_timeout_min.as_millis() as u64,
        election_timeout_max: c.election_timeout_max.as_millis() as u64,
        install_snapshot_timeout: 10_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(c.snapshot_logs.max(1)),
        max_in_snapshot_log_to_keep: c.keep_logs_after_snapshot,
        ..Default::default()
    };
    cfg.validate()
        .map_err(|e| StoreError::InvalidArgument(format!("raft config: {e}")))
}

fn fatal(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("raft: {e}"))
}

impl RaftStore {
    /// Open (or create) the member's data, start Raft and its gRPC service, and bootstrap a
    /// one-member cluster if `config.bootstrap` and the log is empty.
    pub async fn start(config: RaftConfig) -> StoreResult<RaftStore> {
        let rcfg = Arc::new(raft_config(&config)?);
        if let Some(tls) = &config.tls {
            if tls.member_id() != config.node_id {
                return Err(StoreError::InvalidArgument(format!(
                    "the member certificate is for member {} but this member is {}: issue one \
                     for it with `lattice admin pki issue member --id {}`",
                    tls.member_id(),
                    config.node_id,
                    config.node_id
                )));
            }
        } else {
            let plain_ok = crate::tls::is_loopback(config.raft_addr.ip())
                && config
                    .advertise_addr
                    .as_deref()
                    .is_none_or(crate::tls::is_loopback_endpoint);
            if !plain_ok {
                return Err(StoreError::InvalidArgument(format!(
                    "the Raft port ({}{}) is not on a loopback address and has no TLS: give the \
                     member its certificate and the cluster CA",
                    config.raft_addr,
                    config
                        .advertise_addr
                        .as_deref()
                        .map(|a| format!(", advertised as {a}"))
                        .unwrap_or_default()
                )));
            }
        }
        // Bind first: a failure here leaves no file open.
        let listener = tokio::net::TcpListener::bind(config.raft_addr)
            .await
            .map_err(|e| {
                StoreError::Io(format!("binding raft address {}: {e}", config.raft_addr))
            })?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let advertise = config
            .advertise_addr
            .clone()
            .unwrap_or_else(|| local_addr.to_string());

        let dir = config.data_dir.clone();
        let limits = config.limits.clone();
        let log = tokio::task::spawn_blocking(move || log_store::LogDb::open(&dir))
            .await
            .map_err(|e| StoreError::Io(e.to_string()))?
            .map_err(StoreError::Io)?;
        let dir = config.data_dir.clone();
        let sm = match tokio::task::spawn_blocking(move || SmShared::open(dir, limits)).await {
            Ok(Ok(sm)) => sm,
            Ok(Err(e)) => {
                log.close();
                return Err(e);
            }
            Err(e) => {
                log.close();
                return Err(StoreError::Io(e.to_string()));
            }
        };

        let net = Arc::new(NetShared::new(config.tls.as_ref().map(|t| t.raft_client())));
        // The leader replicates its appends while it writes them; applies here and the
        // commit index sent to followers wait for them to be durable here.
        log.enable_early_ack(config.node_id);
        let raft = match Raft::new(
            config.node_id,
            rcfg,
            NetworkFactory {
                net: net.clone(),
                durable: Some(log.durable.subscribe()),
                metrics: log.metrics.clone(),
            },
            LogStore { db: log.clone() },
            StateMachine {
                shared: sm.clone(),
                durable: Some(log.durable.subscribe()),
            },
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                sm.close();
                log.close();
                return Err(fatal(e));
            }
        };

        let (proposals, proposals_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(proposer(raft.clone(), proposals_rx, log.metrics.clone()));
        let inner = Arc::new(Inner {
            proposals,
            advertise: advertise.clone(),
            local_addr,
            raft: raft.clone(),
            sm,
            log,
            net: net.clone(),
            stopped: AtomicBool::new(false),
            stopped_watch: tokio::sync::watch::Sender::new(false),
            server_stop: Mutex::new(None),
            server_task: Mutex::new(None),
            raising_alarm: AtomicBool::new(false),
            config,
        });

        // The gRPC service.
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let tls = inner.config.tls.as_ref().map(|t| t.raft_server());
        let service = network::RaftService {
            raft: raft.clone(),
            net,
            inner: Arc::downgrade(&inner),
            stopped: inner.stopped_watch.subscribe(),
            members_only: tls.is_some(),
        };
        let server = pb::raft_transport_server::RaftTransportServer::new(service)
            .max_decoding_message_size(network::MAX_MESSAGE)
            .max_encoding_message_size(network::MAX_MESSAGE);
        let task = tokio::spawn(async move {
            let router = tonic::transport::Server::builder().add_service(server);
            let stop = async {
                let _ = stop_rx.await;
            };
            let res = match tls {
                Some(tls) => {
                    router
                        .serve_with_incoming_shutdown(
                            crate::tls::incoming(listener, tls, crate::tls::RAFT_PORT),
                            stop,
                        )
                        .await
                }
                None => {
                    let incoming = tonic::transport::server::TcpIncoming::from(listener)
                        .with_nodelay(Some(true));
                    router.serve_with_incoming_shutdown(incoming, stop).await
                }
            };
            if let Err(e) = res {
                tracing::error!(error = %e, "raft gRPC server failed");
            }
        });
        *lock(&inner.server_stop) = Some(stop_tx);
        *lock(&inner.server_task) = Some(task);

        let store = RaftStore { inner };
        let quota = i64::try_from(store.inner.config.quota_bytes).unwrap_or(i64::MAX);
        store.inner.sm.metrics.quota_bytes.set(quota);
        store.spawn_background();

        if store.inner.config.bootstrap {
            if let Err(e) = store.bootstrap().await {
                store.shutdown().await;
                return Err(e);
            }
        }
        tracing::info!(node = store.id(), addr = %advertise, "raft member started");
        Ok(store)
    }

    /// Form a one-member cluster, unless the log already holds a membership (bootstrap
    /// happens once; restarting with `--bootstrap` is harmless).
    async fn bootstrap(&self) -> StoreResult<()> {
        let raft = &self.inner.raft;
        if raft.is_initialized().await.map_err(fatal)? {
            tracing::info!(
                node = self.id(),
                "--bootstrap given but the log is not empty; not re-initializing"
            );
            return Ok(());
        }
        let mut members = BTreeMap::new();
        members.insert(self.id(), BasicNode::new(&self.inner.advertise));
        raft.initialize(members).await.map_err(fatal)?;
        tracing::info!(node = self.id(), addr = %self.inner.advertise, "bootstrapped a new cluster");
        Ok(())
    }

    pub fn id(&self) -> u64 {
        self.inner.config.node_id
    }

    /// The address peers reach this member at.
    pub fn advertise_addr(&self) -> &str {
        &self.inner.advertise
    }

    /// The bound listen address of the Raft service.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The openraft handle (metrics, advanced operations).
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.inner.raft
    }

    /// The network switches of this member (tests: [`NetShared::set_partitioned`]).
    pub fn network(&self) -> &NetShared {
        &self.inner.net
    }

    /// The index of the last entry of this member's durable log. A leader replicates its
    /// entries while it writes them, so its own log may trail what it has sent; nothing
    /// past this index is applied, answered or reported committed to followers.
    pub fn durable_log_index(&self) -> Option<u64> {
        self.inner.log.durable.borrow().last.map(|l| l.index)
    }

    /// Test switch: every write of this member's Raft log fails from now on, as on a
    /// failing disk.
    #[doc(hidden)]
    pub fn fail_log_writes(&self) {
        self.inner.log.fail_writes.store(true, Ordering::Relaxed);
    }

    /// Test switch: every write of this member's Raft log takes `delay` longer, as on a
    /// slow disk (zero: off).
    #[doc(hidden)]
    pub fn delay_log_writes(&self, delay: Duration) {
        self.inner
            .log
            .flush_delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Raft metrics of this member (`lattice_raft_*`: commit latency, log flush latency,
    /// log checkpoints); register with the server's registry.
    pub fn raft_metrics(&self) -> &crate::RaftMetrics {
        &self.inner.log.metrics
    }

    /// Store metrics of this member (`lattice_store_*`; register with
    /// [`crate::StoreMetrics::register`]).
    pub fn metrics(&self) -> &crate::StoreMetrics {
        &self.inner.sm.metrics
    }

    /// Newest revision applied on this member (durable: its entries are in the fsynced
    /// log, and a crash before the next state checkpoint is redone from there).
    pub fn revision(&self) -> i64 {
        self.inner.sm.published.load(Ordering::Acquire)
    }

    pub fn is_leader(&self) -> bool {
        self.inner.raft.metrics().borrow().state == ServerState::Leader
    }

    pub fn current_leader(&self) -> Option<u64> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            // openraft's last metrics outlive it; a stopped member knows no leader.
            return None;
        }
        self.inner.raft.metrics().borrow().current_leader
    }

    /// Raft status of this member.
    pub fn raft_status(&self) -> RaftStatus {
        // Clone, never hold the borrow across an await.
        let m = self.inner.raft.metrics().borrow().clone();
        RaftStatus {
            id: m.id,
            leader: self.current_leader(),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied_index: m.last_applied.map_or(0, |l| l.index),
            state: format!("{:?}", m.state),
            is_leader: m.state == ServerState::Leader,
            voters: m.membership_config.membership().voter_ids().collect(),
            learners: m.membership_config.membership().learner_ids().collect(),
        }
    }

    /// Whether `id` is a voter or a learner of the cluster as this member knows it.
    pub fn knows_member(&self, id: u64) -> bool {
        self.inner
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .is_some()
    }

    /// Members as this member knows them (voters and learners, with addresses).
    pub async fn members(&self) -> StoreResult<Vec<Member>> {
        let m = self.inner.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        Ok(membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                name: format!("member-{id}"),
                peer_urls: vec![format!("http://{}", node.addr)],
                client_urls: Vec::new(),
                is_learner: !voters.contains(id),
            })
            .collect())
    }

    /// Add a learner (replicates, does not vote), waiting until it has caught up.
    pub async fn add_learner(&self, id: u64, addr: impl Into<String>) -> StoreResult<()> {
        self.request(ClientRequest::AddLearner {
            id,
            addr: addr.into(),
        })
        .await
        .map(|_| ())
    }

    /// Promote a learner to voter (joint consensus).
    pub async fn promote(&self, id: u64) -> StoreResult<()> {
        self.request(ClientRequest::Promote { id })
            .await
            .map(|_| ())
    }

    /// `add_learner` then `promote`.
    pub async fn add_member(&self, id: u64, addr: impl Into<String>) -> StoreResult<()> {
        self.add_learner(id, addr).await?;
        self.promote(id).await
    }

    /// Remove a voter or learner from the cluster.
    /// `--join <seed>`: ask the member at `seed` (any member's Raft address) to add this
    /// member as a learner and promote it to voter. A no-op if this member already votes
    /// (restart with the same flags).
    pub async fn join(&self, seed: &str) -> StoreResult<()> {
        if self.raft_status().voters.contains(&self.id()) {
            tracing::info!(
                node = self.id(),
                "already a voting member; not joining again"
            );
            return Ok(());
        }
        let req = ClientRequest::Join {
            id: self.id(),
            addr: self.inner.advertise.clone(),
        };
        let data = postcard::to_allocvec(&req).map_err(|e| StoreError::Backend(e.to_string()))?;
        // Adding a learner waits for it to catch up, which may take a while on a big store.
        let timeout = (self.inner.config.request_timeout * 6).max(Duration::from_secs(60));
        let deadline = Instant::now() + timeout;
        loop {
            self.check_stopped()?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            match self
                .inner
                .net
                .call(seed, Rpc::Forward, data.clone(), remaining)
                .await
            {
                Ok(bytes) => {
                    let res: ClientResult = postcard::from_bytes(&bytes).map_err(|e| {
                        StoreError::Backend(format!("undecodable answer from {seed}: {e}"))
                    })?;
                    res.map_err(StoreError::from)?;
                    tracing::info!(node = self.id(), %seed, "joined the cluster");
                    return Ok(());
                }
                // A refused TLS handshake does not pass by waiting (another CA, another
                // member's certificate): fail at once, saying why.
                Err(CallError::NotSent(e))
                    if Instant::now() < deadline && !e.contains("certificate") =>
                {
                    tracing::debug!(%seed, error = %e, "seed unreachable; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(CallError::NotSent(e)) | Err(CallError::Unknown(e)) => {
                    let hint = if self.inner.config.tls.is_some() && e.contains("certificate") {
                        " (every member needs the same cluster CA and a member certificate \
                         from it: give this member the ca.crt and ca.key of the others before \
                         its first start)"
                    } else {
                        ""
                    };
                    return Err(StoreError::NoLeader(format!(
                        "joining through {seed}: {e}{hint}"
                    )));
                }
            }
        }
    }

    /// Answer a `Forward` RPC: joins go through the normal leader-forwarding path, the
    /// rest is handled here (the sender already targeted the leader).
    pub(crate) async fn handle_forward(inner: Arc<Inner>, req: ClientRequest) -> ClientResult {
        match req {
            ClientRequest::Join { id, addr } => {
                let store = RaftStore { inner };
                store
                    .add_member(id, addr)
                    .await
                    .map(|_| ClientReply::Done)
                    .map_err(WireError::from)
            }
            ClientRequest::RemoveVia { id } => {
                let store = RaftStore { inner };
                store
                    .remove_member(id)
                    .await
                    .map(|_| ClientReply::Done)
                    .map_err(WireError::from)
            }
            other => inner.handle_local(other).await,
        }
    }

    /// Ask the member at `peer` (any member's Raft address) to remove member `id`, from a
    /// process that is not a member itself (`lattice-server membership remove`).
    ///
    /// With TLS (`tls`: a member's [`crate::tls::MemberTls::raft_client`]) the member asked
    /// holds the request to that certificate: only a member of the cluster may remove one.
    pub async fn remove_member_via(
        peer: &str,
        id: u64,
        timeout: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> StoreResult<()> {
        let net = NetShared::new(tls);
        let data = postcard::to_allocvec(&ClientRequest::RemoveVia { id })
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        match net.call(peer, Rpc::Forward, data, timeout).await {
            Ok(bytes) => {
                let res: ClientResult = postcard::from_bytes(&bytes).map_err(|e| {
                    StoreError::Backend(format!("undecodable answer from {peer}: {e}"))
                })?;
                res.map(|_| ()).map_err(StoreError::from)
            }
            Err(CallError::NotSent(e)) | Err(CallError::Unknown(e)) => {
                Err(StoreError::NoLeader(format!("asking {peer}: {e}")))
            }
        }
    }

    pub async fn remove_member(&self, id: u64) -> StoreResult<()> {
        self.request(ClientRequest::Remove { id }).await.map(|_| ())
    }

    /// Write a consistent backup of this member's latest applied revision to `path`
    /// (restorable with [`crate::Backup::restore_into`] into a single embedded member, or
    /// used to seed a new cluster).
    pub fn backup(&self, path: impl AsRef<std::path::Path>) -> StoreResult<crate::Backup> {
        let backup = {
            let st = self.inner.sm.read();
            crate::Backup::from_mvcc(&st.mvcc, self.revision())
        };
        backup.write(path.as_ref())?;
        Ok(backup)
    }

    /// Wait until some member is known as leader (useful right after start).
    pub async fn wait_for_leader(&self, timeout: Duration) -> StoreResult<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_stopped()?;
            if let Some(l) = self.current_leader() {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                return Err(StoreError::NoLeader(format!(
                    "no leader within {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop this member: Raft, its gRPC service and background tasks; close its files so
    /// the same directory can be reopened in this process.
    pub async fn shutdown(&self) {
        if self.inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.stopped_watch.send_replace(true);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        if let Some(tx) = lock(&self.inner.server_stop).take() {
            let _ = tx.send(());
        }
        let task = lock(&self.inner.server_task).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        self.inner.sm.close();
        self.inner.log.close();
        tracing::info!(node = self.id(), "raft member stopped");
    }

    fn check_stopped(&self) -> StoreResult<()> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(StoreError::Stopped);
        }
        Ok(())
    }

    /// Send a request to the leader (locally if this member leads), retrying only while it
    /// is certain that it was not applied.
    async fn request(&self, req: ClientRequest) -> StoreResult<ClientReply> {
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let mut delay = Duration::from_millis(20);
        let idempotent = matches!(
            req,
            ClientRequest::ReadIndex
                | ClientRequest::KeepAlive(_)
                | ClientRequest::KeepAliveMany(_)
                | ClientRequest::TimeToLive { .. }
        );
        loop {
            self.check_stopped()?;
            let (leader, leader_addr) = {
                let metrics = self.inner.raft.metrics();
                let m = metrics.borrow();
                let addr = m.current_leader.and_then(|l| {
                    m.membership_config
                        .membership()
                        .get_node(&l)
                        .map(|n| n.addr.clone())
                });
                (m.current_leader, addr)
            };
            let attempt: ClientResult = match (leader, leader_addr) {
                (Some(l), _) if l == self.id() => self.inner.handle_local(req.clone()).await,
                (Some(l), Some(addr)) => {
                    let data = postcard::to_allocvec(&req)
                        .map_err(|e| StoreError::Backend(e.to_string()))?;
                    let remaining = deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(100));
                    let sent = Instant::now();
                    let answer = self.inner.net.forward(&addr, data, remaining).await;
                    if answer.is_ok() {
                        let took = sent.elapsed().as_secs_f64();
                        self.inner.log.metrics.forward_seconds.observe(took);
                    }
                    match answer {
                        Ok(bytes) => postcard::from_bytes::<ClientResult>(&bytes).map_err(|e| {
                            StoreError::Backend(format!("undecodable answer from {l}: {e}"))
                        })?,
                        Err(CallError::NotSent(e)) => {
                            tracing::debug!(leader = l, error = %e, "leader unreachable; retrying");
                            Err(WireError::NotLeader(None))
                        }
                        // Reads and keep-alives are safe to repeat.
                        Err(CallError::Unknown(e)) if idempotent => {
                            tracing::debug!(leader = l, error = %e, "request to leader failed; retrying");
                            Err(WireError::NotLeader(None))
                        }
                        Err(CallError::Unknown(e)) => {
                            return Err(StoreError::Backend(format!(
                                "request to leader {l} failed, outcome unknown: {e}"
                            )))
                        }
                    }
                }
                _ => Err(WireError::NotLeader(None)),
            };
            match attempt {
                Err(WireError::NotLeader(hint)) => {
                    if Instant::now() >= deadline {
                        return Err(WireError::NotLeader(hint).into());
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                other => return other.map_err(StoreError::from),
            }
        }
    }

    /// Propose a write and return once it is applied on the leader *and* on this member
    /// (as etcd does), so reads here — serializable ones and watches included — see it.
    ///
    /// `--max-txn-ops` is checked here, once, against this member's limit (the one
    /// [`KvBackend::max_txn_ops`] reports to the writers that batch by it), before the
    /// command is forwarded or proposed: an oversized transaction never reaches the log.
    /// Neither the leader nor the state machine checks it again, so members started with
    /// different limits apply every entry alike.
    async fn propose(&self, cmd: Command) -> StoreResult<CommandResponse> {
        self.inner.sm.limits.check_command(&cmd)?;
        match self.request(ClientRequest::Write(cmd)).await {
            Ok(ClientReply::Write(r, index)) => {
                self.wait_applied(index).await?;
                Ok(r)
            }
            Ok(other) => Err(StoreError::Backend(format!("unexpected reply {other:?}"))),
            // Refused when applied (the alarm was raised), where no member's quota is known.
            Err(StoreError::NoSpace { quota_bytes: 0 }) => {
                self.inner.sm.metrics.nospace_refusals.inc();
                Err(StoreError::NoSpace {
                    quota_bytes: self.inner.config.quota_bytes,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Wait until this member has applied (and published to its readers) log `index`.
    async fn wait_applied(&self, index: u64) -> StoreResult<()> {
        let mut applied = self.inner.sm.applied_index.subscribe();
        if index == 0 || *applied.borrow() >= index {
            return Ok(());
        }
        let timeout = self.inner.config.request_timeout;
        let waited = tokio::time::timeout(timeout, applied.wait_for(|a| *a >= index))
            .await
            .map(|r| r.map(|_| ()));
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(StoreError::Stopped),
            Err(_) => Err(StoreError::NoLeader(format!(
                "waiting to apply log index {index}: not applied here within {timeout:?}"
            ))),
        }
    }

    /// Read-index: make this member's state at least as new as the leader's commit point.
    async fn linearize(&self) -> StoreResult<()> {
        let index = match self.request(ClientRequest::ReadIndex).await? {
            ClientReply::ReadIndex(i) => i,
            other => return Err(StoreError::Backend(format!("unexpected reply {other:?}"))),
        };
        self.wait_applied(index).await
    }

    fn spawn_background(&self) {
        // A failed Raft log stops the member: the leader answers its own appends before
        // they are written (see `log_store.rs`), so it must not go on leading once it
        // cannot write them; a new leader is then elected among the others.
        // (It waits for the failure signal, not on `durable`, which changes with every
        // write: a wake-up of this task per write, on every member.)
        let weak = Arc::downgrade(&self.inner);
        let durable = self.inner.log.durable.subscribe();
        let failure = self.inner.log.failure.clone();
        tokio::spawn(async move {
            let failed = loop {
                if let Some(f) = durable.borrow().failed.clone() {
                    break f;
                }
                if !signalled_while_running(&weak, &failure).await {
                    return;
                }
            };
            let Some(inner) = weak.upgrade() else { return };
            if inner.stopped.load(Ordering::SeqCst) {
                return;
            }
            tracing::error!(error = %failed, node = inner.config.node_id, "the raft log failed; this member stops");
            // The whole member: Raft, its gRPC server, its watches; requests answer
            // `Stopped` (not "not leader", which a client would retry here).
            RaftStore { inner }.shutdown().await;
        });
        // The commit index owed to followers: an AppendEntries that went out with it
        // lowered to the durable log (`network::clamp_commit`) is followed, once the log
        // is durable that far, by a heartbeat that carries it (else they would learn it
        // with the next write or heartbeat).
        let weak = Arc::downgrade(&self.inner);
        let net = self.inner.net.clone();
        let mut durable = self.inner.log.durable.subscribe();
        tokio::spawn(async move {
            while signalled_while_running(&weak, &net.commit_owed_signal).await {
                let owed = net.commit_owed.swap(0, Ordering::AcqRel);
                if owed == 0 {
                    continue;
                }
                let done = log_store::wait_durable(&mut durable, owed).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopped.load(Ordering::SeqCst) || done.is_err() {
                    return;
                }
                inner.log.metrics.commit_heartbeats.inc();
                let _ = inner.raft.trigger().heartbeat().await;
            }
        });
        // Held-back commits to `state.redb` (`state_machine.rs`): made within
        // `COMMIT_DELAY` of the first of a batch even when no later apply comes.
        let weak = Arc::downgrade(&self.inner);
        let deferred = self.inner.sm.deferred.clone();
        tokio::spawn(async move {
            while signalled_while_running(&weak, &deferred).await {
                tokio::time::sleep(state_machine::COMMIT_DELAY).await;
                let Some(inner) = weak.upgrade() else { return };
                let sm = inner.sm.clone();
                drop(inner);
                match tokio::task::spawn_blocking(move || sm.commit_deferred_if_due()).await {
                    Ok(Ok(())) => {}
                    // The batches stay held back; the next apply retries the commit and
                    // stops the member should it fail again.
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "committing held-back applied entries to state.redb failed")
                    }
                    Err(e) => tracing::error!(error = %e, "deferred state.redb commit task failed"),
                }
            }
        });
        // Watch catch-up.
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let sm = inner.sm.clone();
                drop(inner);
                if lock(&sm.hub).unsynced() > 0 {
                    let st = sm.read();
                    let mut hub = lock(&sm.hub);
                    // Read under the hub's lock, which `publish` holds: read before it, a
                    // revision published in between would go only to synced watchers and
                    // a watcher caught up to the older one would never get it.
                    let published = sm.published.load(Ordering::Acquire);
                    hub.catch_up(&st.mvcc, published);
                }
                if lock(&sm.hub).unsynced() > 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    let _ =
                        tokio::time::timeout(Duration::from_millis(500), sm.catch_up.notified())
                            .await;
                }
            }
        });
        // Progress notifications.
        let weak = Arc::downgrade(&self.inner);
        let every = self.inner.config.progress_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let mut hub = lock(&inner.sm.hub);
                // Under the hub's lock: never older than a revision already sent.
                let published = inner.sm.published.load(Ordering::Acquire);
                hub.progress(published);
            }
        });
        // Lease expiry, decided by the leader only.
        let weak = Arc::downgrade(&self.inner);
        let every = self.inner.config.lease_check_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut was_leader = false;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let leader = inner.raft.metrics().borrow().state == ServerState::Leader;
                if leader && !was_leader {
                    // A new leader does not know how long ago keep-alives reached the
                    // old one: every lease gets a full TTL again (etcd does the same).
                    let now = Instant::now();
                    let st = inner.sm.read();
                    let mut deadlines = lock(&inner.sm.deadlines);
                    deadlines.clear();
                    for (id, l) in st.mvcc.leases() {
                        deadlines.insert(*id, now + Duration::from_secs(l.ttl.max(1) as u64));
                    }
                    tracing::info!(
                        node = inner.config.node_id,
                        leases = deadlines.len(),
                        "became leader; lease deadlines refreshed"
                    );
                }
                was_leader = leader;
                if !leader {
                    continue;
                }
                let now = Instant::now();
                let expired: Vec<i64> = lock(&inner.sm.deadlines)
                    .iter()
                    .filter(|(_, d)| **d <= now)
                    .map(|(id, _)| *id)
                    .collect();
                for id in expired {
                    match inner
                        .handle_local(ClientRequest::Write(Command::LeaseRevoke { id }))
                        .await
                    {
                        Ok(_) | Err(WireError::LeaseNotFound) => {
                            tracing::debug!(lease = id, "lease expired and revoked");
                            lock(&inner.sm.deadlines).remove(&id);
                        }
                        Err(e) => {
                            tracing::warn!(lease = id, error = ?e, "revoking expired lease failed");
                            break;
                        }
                    }
                }
            }
        });
    }

    fn new_lease_id(&self) -> i64 {
        let st = self.inner.sm.read();
        loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 && !st.mvcc.leases().contains_key(&id) {
                return id;
            }
        }
    }
}

impl Inner {
    /// Handle a client request on this member, which should be the leader.
    pub(crate) async fn handle_local(&self, req: ClientRequest) -> ClientResult {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(WireError::Stopped);
        }
        let timeout = self.config.request_timeout;
        match req {
            ClientRequest::Write(cmd) => {
                // Not submitted at all unless this member leads: a safe, retryable refusal.
                // (No `--max-txn-ops` check here: the member that received the write made
                // it, against its own limit, before forwarding; see `RaftStore::propose`.)
                self.check_leader()?;
                self.check_quota(&cmd).await?;
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.proposals
                    .send((cmd, tx))
                    .map_err(|_| WireError::Stopped)?;
                match tokio::time::timeout(timeout, rx).await {
                    Ok(Ok(r)) => r.map(|(resp, index)| ClientReply::Write(resp, index)),
                    Ok(Err(_)) => Err(WireError::Stopped),
                    Err(_) => Err(WireError::Backend(format!(
                        "commit not confirmed within {timeout:?}, outcome unknown"
                    ))),
                }
            }
            ClientRequest::ReadIndex => {
                let res = tokio::time::timeout(timeout, self.raft.ensure_linearizable())
                    .await
                    .map_err(|_| WireError::NotLeader(None))?;
                match res {
                    Ok(log_id) => Ok(ClientReply::ReadIndex(log_id.map_or(0, |l| l.index))),
                    Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                        Err(WireError::NotLeader(f.leader_id))
                    }
                    Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                        Err(WireError::NotLeader(None))
                    }
                    Err(RaftError::Fatal(_)) => Err(WireError::Stopped),
                }
            }
            ClientRequest::KeepAlive(id) => {
                self.check_leader()?;
                let ttl = {
                    let st = self.sm.read();
                    st.mvcc
                        .leases()
                        .get(&id)
                        .map(|l| l.ttl)
                        .ok_or(WireError::LeaseNotFound)?
                };
                lock(&self.sm.deadlines)
                    .insert(id, Instant::now() + Duration::from_secs(ttl.max(1) as u64));
                Ok(ClientReply::KeepAlive(ttl))
            }
            ClientRequest::KeepAliveMany(ids) => {
                self.check_leader()?;
                let ttls: Vec<Option<i64>> = {
                    let st = self.sm.read();
                    ids.iter()
                        .map(|id| st.mvcc.leases().get(id).map(|l| l.ttl))
                        .collect()
                };
                let now = Instant::now();
                let mut deadlines = lock(&self.sm.deadlines);
                for (id, ttl) in ids.iter().zip(&ttls) {
                    if let Some(ttl) = ttl {
                        deadlines.insert(*id, now + Duration::from_secs((*ttl).max(1) as u64));
                    }
                }
                Ok(ClientReply::KeepAliveMany(ttls))
            }
            ClientRequest::TimeToLive { id, keys } => {
                self.check_leader()?;
                let (granted, lease_keys) = {
                    let st = self.sm.read();
                    match st.mvcc.leases().get(&id) {
                        Some(l) => (
                            l.ttl,
                            if keys {
                                l.keys.iter().cloned().collect()
                            } else {
                                Vec::new()
                            },
                        ),
                        None => {
                            return Ok(ClientReply::TimeToLive(LeaseTimeToLive {
                                id,
                                ttl: -1,
                                granted_ttl: 0,
                                keys: Vec::new(),
                            }))
                        }
                    }
                };
                let remaining = lock(&self.sm.deadlines)
                    .get(&id)
                    .map(|d| d.saturating_duration_since(Instant::now()).as_secs() as i64)
                    .unwrap_or(granted);
                Ok(ClientReply::TimeToLive(LeaseTimeToLive {
                    id,
                    ttl: remaining,
                    granted_ttl: granted,
                    keys: lease_keys,
                }))
            }
            ClientRequest::AddLearner { id, addr } => {
                tracing::info!(learner = id, %addr, "adding learner");
                self.raft
                    .add_learner(id, BasicNode::new(addr), true)
                    .await
                    .map_err(write_error)?;
                Ok(ClientReply::Done)
            }
            ClientRequest::Promote { id } => {
                tracing::info!(member = id, "promoting learner to voter");
                let mut ids = BTreeSet::new();
                ids.insert(id);
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(ids), false)
                    .await
                    .map_err(write_error)?;
                Ok(ClientReply::Done)
            }
            ClientRequest::Join { .. } | ClientRequest::RemoveVia { .. } => {
                // Handled by `RaftStore::handle_forward`; never sent to the leader as such.
                Err(WireError::InvalidArgument(
                    "join must be sent to the raft service".into(),
                ))
            }
            ClientRequest::Remove { id } => {
                tracing::info!(member = id, "removing member");
                let mut ids = BTreeSet::new();
                ids.insert(id);
                let is_voter = {
                    let m = self.raft.metrics().borrow().clone();
                    let voters: BTreeSet<u64> =
                        m.membership_config.membership().voter_ids().collect();
                    voters.contains(&id)
                };
                let change = if is_voter {
                    ChangeMembers::RemoveVoters(ids)
                } else {
                    ChangeMembers::RemoveNodes(ids)
                };
                self.raft
                    .change_membership(change, false)
                    .await
                    .map_err(write_error)?;
                Ok(ClientReply::Done)
            }
        }
    }

    /// The leader's quota check before it proposes a write ([`crate::quota`]): a write
    /// that adds data is refused while the NOSPACE alarm is raised, and one that would
    /// take the store beyond its quota raises the alarm (through the log, so that every
    /// member holds it) and is refused.
    async fn check_quota(&self, cmd: &Command) -> Result<(), WireError> {
        let cost = crate::quota::cost(cmd);
        if cost == 0 {
            return Ok(());
        }
        let quota = self.config.quota_bytes;
        let state = &self.sm.quota_state;
        if state.nospace.load(Ordering::Relaxed) {
            self.sm.metrics.nospace_refusals.inc();
            return Err(WireError::NoSpace { quota_bytes: quota });
        }
        let size = state.size.load(Ordering::Relaxed);
        if !crate::quota::exceeds(size, cost, quota) {
            return Ok(());
        }
        self.sm.metrics.nospace_refusals.inc();
        if !self.raising_alarm.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                size,
                quota,
                write_bytes = cost,
                "the store reached its size quota: raising the NOSPACE alarm; writes that \
                 add data are refused until space is freed and the alarm disarmed"
            );
            let alarm = Command::Alarm {
                action: AlarmAction::Activate,
                alarm: Alarm {
                    member: self.config.node_id,
                    kind: AlarmKind::NoSpace,
                },
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            if self.proposals.send((alarm, tx)).is_ok() {
                match tokio::time::timeout(self.config.request_timeout, rx).await {
                    Ok(Ok(Ok(_))) => {}
                    other => tracing::warn!(result = ?other, "raising the NOSPACE alarm failed"),
                }
            }
            self.raising_alarm.store(false, Ordering::SeqCst);
        }
        Err(WireError::NoSpace { quota_bytes: quota })
    }

    fn check_leader(&self) -> Result<(), WireError> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.state == ServerState::Leader {
            Ok(())
        } else {
            Err(WireError::NotLeader(m.current_leader))
        }
    }
}

/// Wait for `signal` on behalf of a background task of the member `weak`: `false` once the
/// member is gone or stopped (looked at every second while nothing is signalled).
async fn signalled_while_running(
    weak: &std::sync::Weak<Inner>,
    signal: &tokio::sync::Notify,
) -> bool {
    loop {
        if tokio::time::timeout(Duration::from_secs(1), signal.notified())
            .await
            .is_ok()
        {
            return true;
        }
        match weak.upgrade() {
            Some(inner) if !inner.stopped.load(Ordering::SeqCst) => {}
            _ => return false,
        }
    }
}

fn write_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> WireError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            WireError::NotLeader(f.leader_id)
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            WireError::InvalidArgument(c.to_string())
        }
        RaftError::Fatal(f) => {
            tracing::warn!(error = %f, "raft is not running");
            WireError::Stopped
        }
    }
}

fn txn_response(resp: CommandResponse) -> StoreResult<TxnResponse> {
    match resp {
        CommandResponse::Txn(t) => Ok(t),
        other => Err(StoreError::Backend(format!(
            "unexpected response {other:?}"
        ))),
    }
}

#[async_trait]
impl KvBackend for RaftStore {
    fn max_txn_ops(&self) -> usize {
        self.inner.sm.limits.max_txn_ops
    }

    async fn range(&self, req: RangeRequest) -> StoreResult<RangeResponse> {
        self.check_stopped()?;
        if !req.serializable {
            self.linearize().await?;
        }
        let published = self.revision();
        let st = self.inner.sm.read();
        st.mvcc.range(&req, published)
    }

    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        self.check_stopped()?;
        let read_only = req
            .success
            .iter()
            .chain(req.failure.iter())
            .all(|op| matches!(op, TxnOp::Range(_)));
        if read_only && req.compare.is_empty() {
            let linearizable = req
                .success
                .iter()
                .any(|op| matches!(op, TxnOp::Range(r) if !r.serializable));
            if linearizable {
                self.linearize().await?;
            }
            let published = self.revision();
            let st = self.inner.sm.read();
            let mut responses = Vec::new();
            for op in &req.success {
                if let TxnOp::Range(r) = op {
                    responses.push(TxnOpResponse::Range(st.mvcc.range(r, published)?));
                }
            }
            return Ok(TxnResponse {
                revision: published,
                succeeded: true,
                responses,
            });
        }
        txn_response(self.propose(Command::Txn(req)).await?)
    }

    async fn watch(&self, req: WatchRequest) -> StoreResult<WatchStream> {
        self.check_stopped()?;
        let sm = &self.inner.sm;
        // Never wait for the state lock while holding the hub lock (the catch-up task
        // takes them in the other order).
        let compact = sm.read().mvcc.compact_revision();
        let rx = {
            let mut hub = lock(&sm.hub);
            let published = sm.published.load(Ordering::Acquire);
            let rx = hub.add(req, published, compact, self.inner.config.watch_buffer)?;
            if hub.unsynced() > 0 {
                sm.catch_up.notify_one();
            }
            rx
        };
        Ok(ReceiverStream::new(rx).boxed())
    }

    async fn lease_grant(&self, id: i64, ttl: i64) -> StoreResult<LeaseGrant> {
        let id = if id == 0 { self.new_lease_id() } else { id };
        match self.propose(Command::LeaseGrant { id, ttl }).await? {
            CommandResponse::LeaseGranted(g) => Ok(g),
            other => Err(StoreError::Backend(format!(
                "unexpected response {other:?}"
            ))),
        }
    }

    async fn lease_revoke(&self, id: i64) -> StoreResult<i64> {
        match self.propose(Command::LeaseRevoke { id }).await? {
            CommandResponse::LeaseRevoked { revision } => Ok(revision),
            other => Err(StoreError::Backend(format!(
                "unexpected response {other:?}"
            ))),
        }
    }

    async fn lease_keep_alive(&self, id: i64) -> StoreResult<i64> {
        match self.request(ClientRequest::KeepAlive(id)).await? {
            ClientReply::KeepAlive(ttl) => Ok(ttl),
            other => Err(StoreError::Backend(format!("unexpected reply {other:?}"))),
        }
    }

    async fn lease_keep_alive_many(&self, ids: &[i64]) -> StoreResult<Vec<Option<i64>>> {
        match self
            .request(ClientRequest::KeepAliveMany(ids.to_vec()))
            .await?
        {
            ClientReply::KeepAliveMany(ttls) => Ok(ttls),
            other => Err(StoreError::Backend(format!("unexpected reply {other:?}"))),
        }
    }

    async fn lease_time_to_live(&self, id: i64, keys: bool) -> StoreResult<LeaseTimeToLive> {
        match self.request(ClientRequest::TimeToLive { id, keys }).await? {
            ClientReply::TimeToLive(t) => Ok(t),
            other => Err(StoreError::Backend(format!("unexpected reply {other:?}"))),
        }
    }

    async fn lease_leases(&self) -> StoreResult<Vec<i64>> {
        let st = self.inner.sm.read();
        Ok(st.mvcc.leases().keys().copied().collect())
    }

    async fn compact(&self, revision: i64) -> StoreResult<i64> {
        match self.propose(Command::Compact { revision }).await? {
            CommandResponse::Compacted { revision } => Ok(revision),
            other => Err(StoreError::Backend(format!(
                "unexpected response {other:?}"
            ))),
        }
    }

    async fn alarms(&self) -> StoreResult<Vec<Alarm>> {
        self.check_stopped()?;
        Ok(self.inner.sm.read().mvcc.alarms())
    }

    async fn alarm(&self, action: AlarmAction, alarm: Alarm) -> StoreResult<Vec<Alarm>> {
        match self.propose(Command::Alarm { action, alarm }).await? {
            CommandResponse::Alarms(changed) => {
                tracing::info!(?action, %alarm, changed = changed.len(), "alarm request applied");
                Ok(changed)
            }
            other => Err(StoreError::Backend(format!(
                "unexpected response {other:?}"
            ))),
        }
    }

    async fn status(&self) -> StoreResult<StoreStatus> {
        self.check_stopped()?;
        let rs = self.raft_status();
        let (compact, size_in_use, alarms) = {
            let st = self.inner.sm.read();
            (
                st.mvcc.compact_revision(),
                st.mvcc.size_bytes(),
                st.mvcc.alarms(),
            )
        };
        Ok(StoreStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: self.revision(),
            compact_revision: compact,
            db_size: self.inner.sm.db_size.load(Ordering::Relaxed),
            member_id: rs.id,
            leader: rs.leader.unwrap_or(0),
            raft_term: rs.term,
            raft_index: rs.last_log_index,
            raft_applied_index: rs.last_applied_index,
            is_learner: rs.learners.contains(&rs.id),
            size_in_use: i64::try_from(size_in_use).unwrap_or(i64::MAX),
            quota_bytes: i64::try_from(self.inner.config.quota_bytes).unwrap_or(i64::MAX),
            alarms,
        })
    }
}
