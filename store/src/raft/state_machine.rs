//! The replicated state machine: the deterministic [`Mvcc`] engine made durable by
//! [`Persist`] (`state.redb`), shared with [`super::RaftStore`] for local reads and watches.
//!
//! * `apply`: a batch of committed entries is applied in memory, then the data *and* the
//!   last applied log ID and membership are committed in one fsynced redb transaction;
//!   only then is the new revision published to readers and watchers. Entries at or
//!   below the durable `last_applied` are skipped, so re-applying after a restart is a
//!   no-op (idempotent).
//! * Snapshots are built from a consistent view (the engine under its read lock, with the
//!   matching `last_applied`) while `apply` may continue afterwards; installing one
//!   replaces `state.redb` atomically (write beside, fsync, rename).

use std::collections::HashMap;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, StorageError,
    StorageIOError, StoredMembership,
};
use tokio::sync::Notify;

use super::{RaftResponse, TypeConfig, WireError};
use crate::error::{StoreError, StoreResult};
use crate::metrics::StoreMetrics;
use crate::mvcc::{Applied, Limits, Mvcc};
use crate::persist::{Backup, Persist};
use crate::types::Event;
use crate::watch::WatchHub;

type SErr = StorageError<u64>;
type Membership = StoredMembership<u64, BasicNode>;
/// The latest snapshot: its meta and payload.
type StoredSnapshot = (SnapshotMeta<u64, BasicNode>, Vec<u8>);

fn sm_write_err(e: impl ToString) -> SErr {
    StorageError::IO {
        source: StorageIOError::write_state_machine(AnyError::error(e.to_string())),
    }
}

fn sm_read_err(e: impl ToString) -> SErr {
    StorageError::IO {
        source: StorageIOError::read_state_machine(AnyError::error(e.to_string())),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The engine together with the log position it reflects.
pub(crate) struct SmState {
    pub(crate) mvcc: Mvcc,
    pub(crate) last_applied: Option<LogId<u64>>,
    pub(crate) membership: Membership,
}

/// State shared by the state machine (driven by openraft) and the store front end.
pub(crate) struct SmShared {
    pub(crate) state: RwLock<SmState>,
    /// Newest revision that is durable and visible to readers.
    pub(crate) published: AtomicI64,
    pub(crate) hub: Mutex<WatchHub>,
    pub(crate) catch_up: Notify,
    /// Lease deadlines; acted upon only by the leader (see `RaftStore`).
    pub(crate) deadlines: Mutex<HashMap<i64, Instant>>,
    pub(crate) limits: Limits,
    dir: PathBuf,
    persist: Mutex<Option<Persist>>,
    current_snapshot: Mutex<Option<StoredSnapshot>>,
    snapshot_seq: AtomicU64,
    pub(crate) db_size: AtomicI64,
    pub(crate) metrics: StoreMetrics,
}

fn encode_meta(last_applied: &Option<LogId<u64>>, membership: &Membership) -> StoreResult<Vec<u8>> {
    postcard::to_allocvec(&(last_applied, membership)).map_err(|e| StoreError::Io(e.to_string()))
}

impl SmShared {
    pub(crate) fn open(dir: PathBuf, limits: Limits) -> StoreResult<Arc<SmShared>> {
        let (persist, mvcc) = Persist::open(&dir)?;
        let (last_applied, membership) = match persist.raft_meta()? {
            Some(bytes) => postcard::from_bytes::<(Option<LogId<u64>>, Membership)>(&bytes)
                .map_err(|e| {
                    StoreError::Corrupt(format!(
                        "{}: raft_meta undecodable: {e}",
                        persist.path().display()
                    ))
                })?,
            None => (None, Membership::default()),
        };
        let now = Instant::now();
        let deadlines = mvcc
            .leases()
            .iter()
            .map(|(id, l)| (*id, now + Duration::from_secs(l.ttl.max(1) as u64)))
            .collect();
        tracing::info!(
            revision = mvcc.revision(),
            last_applied = ?last_applied,
            path = %persist.path().display(),
            "raft state machine opened"
        );
        let metrics = StoreMetrics::default();
        metrics.applied_revision.set(mvcc.revision());
        metrics.db_size_bytes.set(persist.size_bytes());
        Ok(Arc::new(SmShared {
            metrics,
            published: AtomicI64::new(mvcc.revision()),
            db_size: AtomicI64::new(persist.size_bytes()),
            state: RwLock::new(SmState {
                mvcc,
                last_applied,
                membership,
            }),
            hub: Mutex::new(WatchHub::default()),
            catch_up: Notify::new(),
            deadlines: Mutex::new(deadlines),
            limits,
            dir,
            persist: Mutex::new(Some(persist)),
            current_snapshot: Mutex::new(None),
            snapshot_seq: AtomicU64::new(0),
        }))
    }

    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, SmState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, SmState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Close `state.redb` (member shutdown) and end every watch.
    pub(crate) fn close(&self) {
        lock(&self.persist).take();
        lock(&self.hub).close_all();
    }

    fn commit(
        &self,
        applied: &[Applied],
        revision: i64,
        compact: i64,
        meta: &[u8],
    ) -> StoreResult<()> {
        let guard = lock(&self.persist);
        let persist = guard.as_ref().ok_or(StoreError::Stopped)?;
        let started = Instant::now();
        persist.commit_with_raft_meta(applied, revision, compact, meta)?;
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        self.metrics.batch_size.observe(applied.len() as f64);
        self.db_size.store(persist.size_bytes(), Ordering::Relaxed);
        self.metrics.db_size_bytes.set(persist.size_bytes());
        Ok(())
    }

    fn publish(&self, applied: &[Applied], revision: i64) {
        {
            let mut deadlines = lock(&self.deadlines);
            let now = Instant::now();
            for a in applied {
                for (id, ttl) in &a.leases {
                    match ttl {
                        Some(ttl) => {
                            deadlines.insert(*id, now + Duration::from_secs((*ttl).max(1) as u64));
                        }
                        None => {
                            deadlines.remove(id);
                        }
                    }
                }
            }
        }
        self.metrics.applied_revision.set(revision);
        let revisions: Vec<(i64, Arc<[Event]>)> =
            applied.iter().filter_map(|a| a.revision.clone()).collect();
        let mut hub = lock(&self.hub);
        self.published.store(revision, Ordering::Release);
        hub.publish(&revisions, revision);
        self.metrics.writes.inc_by(revisions.len() as u64);
        self.metrics.watchers.set(hub.len() as i64);
        if hub.unsynced() > 0 {
            self.catch_up.notify_one();
        }
    }

    fn build_snapshot(&self) -> Result<Snapshot<TypeConfig>, String> {
        let (backup, last_applied, membership) = {
            let st = self.read();
            (
                Backup::from_mvcc(&st.mvcc, st.mvcc.revision()),
                st.last_applied,
                st.membership.clone(),
            )
        };
        let data = postcard::to_allocvec(&backup).map_err(|e| e.to_string())?;
        let seq = self.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match &last_applied {
            Some(l) => format!("{}-{}-{seq}", l.leader_id.term, l.index),
            None => format!("0-0-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        tracing::info!(snapshot = %meta, keys = backup.key_count(), bytes = data.len(), "built raft snapshot");
        *lock(&self.current_snapshot) = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// openraft's state machine handle.
pub struct StateMachine {
    pub(crate) shared: Arc<SmShared>,
}

impl StateMachine {
    /// Close `state.redb` (for storage used without a `RaftStore`).
    pub fn close(&self) {
        self.shared.close();
    }
}

/// Builds snapshots concurrently with `apply`.
pub struct SnapshotBuilder {
    shared: Arc<SmShared>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.build_snapshot())
            .await
            .map_err(sm_read_err)?
            .map_err(sm_read_err)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, Membership), SErr> {
        let st = self.shared.read();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<RaftResponse>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let shared = self.shared.clone();
        let mut responses = Vec::new();
        let mut applied = Vec::new();
        let (revision, compact, meta) = {
            let mut guard = shared.write();
            let st = &mut *guard;
            for entry in entries {
                // Idempotence: whatever is already durable is not applied twice.
                if st
                    .last_applied
                    .is_some_and(|l| entry.log_id.index <= l.index)
                {
                    responses.push(RaftResponse::Skipped);
                    continue;
                }
                st.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => responses.push(RaftResponse::Skipped),
                    EntryPayload::Normal(proposal) => {
                        let mut results = Vec::with_capacity(proposal.commands.len());
                        for cmd in &proposal.commands {
                            match st.mvcc.apply(cmd, &shared.limits) {
                                Ok((resp, a)) => {
                                    applied.push(a);
                                    results.push(Ok(resp));
                                }
                                Err(e) => results.push(Err(WireError::from(e))),
                            }
                        }
                        responses.push(RaftResponse::Commands(results));
                    }
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(entry.log_id), m);
                        responses.push(RaftResponse::Skipped);
                    }
                }
            }
            let meta = encode_meta(&st.last_applied, &st.membership).map_err(sm_write_err)?;
            (st.mvcc.revision(), st.mvcc.compact_revision(), meta)
        };
        let commit_shared = shared.clone();
        let applied = tokio::task::spawn_blocking(move || {
            commit_shared
                .commit(&applied, revision, compact, &meta)
                .map(|_| applied)
        })
        .await
        .map_err(sm_write_err)?
        .map_err(|e| {
            tracing::error!(error = %e, "committing applied entries failed; this member stops");
            sm_write_err(e)
        })?;
        shared.publish(&applied, revision);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let backup: Backup = postcard::from_bytes(&data)
            .map_err(|e| sm_write_err(format!("snapshot undecodable: {e}")))?;
        let raft_meta =
            encode_meta(&meta.last_log_id, &meta.last_membership).map_err(sm_write_err)?;
        let shared = self.shared.clone();
        let dir = shared.dir.clone();
        tracing::info!(snapshot = %meta, keys = backup.key_count(), "installing raft snapshot");
        let mvcc = tokio::task::spawn_blocking(move || -> StoreResult<Mvcc> {
            let mut guard = lock(&shared.persist);
            // Close the old file before the new one is renamed over it.
            guard.take();
            let (persist, mvcc) = Persist::install(&dir, &backup, &raft_meta)?;
            shared
                .db_size
                .store(persist.size_bytes(), Ordering::Relaxed);
            *guard = Some(persist);
            Ok(mvcc)
        })
        .await
        .map_err(sm_write_err)?
        .map_err(sm_write_err)?;
        let revision = mvcc.revision();
        let now = Instant::now();
        let deadlines: HashMap<i64, Instant> = mvcc
            .leases()
            .iter()
            .map(|(id, l)| (*id, now + Duration::from_secs(l.ttl.max(1) as u64)))
            .collect();
        {
            let mut st = self.shared.write();
            st.mvcc = mvcc;
            st.last_applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
        }
        *lock(&self.shared.deadlines) = deadlines;
        {
            // History before the snapshot is gone here: watchers must start over.
            let mut hub = lock(&self.shared.hub);
            hub.close_all();
            self.shared.published.store(revision, Ordering::Release);
        }
        *lock(&self.shared.current_snapshot) = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        if let Some((meta, data)) = lock(&self.shared.current_snapshot).clone() {
            return Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            }));
        }
        // After a restart no snapshot is kept in memory: the durable state *is* one.
        if self.shared.read().last_applied.is_none() {
            return Ok(None);
        }
        let shared = self.shared.clone();
        let snap = tokio::task::spawn_blocking(move || shared.build_snapshot())
            .await
            .map_err(sm_read_err)?
            .map_err(sm_read_err)?;
        Ok(Some(snap))
    }
}
