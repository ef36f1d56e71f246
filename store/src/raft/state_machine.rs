//! The replicated state machine: the deterministic [`Mvcc`] engine made durable by
//! [`Persist`] (`state.redb`), shared with [`super::RaftStore`] for local reads and watches.
//!
//! * `apply`: a batch of committed entries is applied in memory (readers and watchers
//!   read the engine in memory), then its changes *and* the last applied log ID and
//!   membership go to `state.redb` in one redb transaction, and the new revision is
//!   published to readers and watchers. Entries at or below the recorded `last_applied`
//!   are skipped, so re-applying after a restart is a no-op (idempotent).
//! * Durability: the fsynced Raft log is the durable record of every applied entry, so an
//!   apply batch is committed *without* fsync (`redb::Durability::None`), and only every
//!   [`CHECKPOINT_ENTRIES`] entries or [`CHECKPOINT_INTERVAL`] is a commit fsynced (a
//!   checkpoint). Nor is each batch committed on its own: batches are held back
//!   ([`Deferred`]) and committed together, in order, once [`COMMIT_DELAY`] has passed
//!   since the first of them, [`COMMIT_ENTRIES`] entries or [`COMMIT_BYTES`] wait, or a
//!   checkpoint is due (as etcd's backend commits its batch every 100 ms). A crash loses
//!   at most the commits since the last checkpoint and what was held back — data and
//!   `last_applied` together, never one without the other — and the member redoes them
//!   from its log on restart: openraft re-applies `(last_applied, committed]` before it
//!   starts, and the rest as the leader reports it committed. The log is purged only
//!   below a snapshot, and building a snapshot first makes the state covering it durable
//!   (held-back batches included; see `SmShared::build_snapshot`), so the entries to redo
//!   are never gone. Closing the member (shutdown) makes the state durable too.
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

/// An apply batch is committed with fsync (a checkpoint) once this many log entries were
/// applied since the last one...
pub(crate) const CHECKPOINT_ENTRIES: u64 = 1024;
/// ...or once the oldest commit not yet fsynced is this old.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Applied batches are committed to `state.redb` at most this long after the first of
/// them was held back (module docs)...
pub(crate) const COMMIT_DELAY: Duration = Duration::from_millis(20);
/// ...or once this many log entries...
const COMMIT_ENTRIES: u64 = 256;
/// ...or about this many bytes of keys and values wait.
const COMMIT_BYTES: usize = 4 << 20;

/// `state.redb`, and how much of it is not yet durable.
struct StateFile {
    persist: Persist,
    /// Log entries applied by commits made since the last durable one.
    unsynced: u64,
    /// When the oldest of those commits was made.
    unsynced_since: Option<Instant>,
    /// Applied, not yet committed.
    deferred: Deferred,
}

/// Apply batches held back from `state.redb`, to be committed together (module docs).
#[derive(Default)]
struct Deferred {
    applied: Vec<Applied>,
    /// Log entries they cover.
    entries: u64,
    /// Keys and values in their events.
    bytes: usize,
    /// The state after the last of them: revision, compact revision, Raft meta
    /// (`last_applied`, membership). `None`: nothing held back.
    tail: Option<(i64, i64, Vec<u8>)>,
    /// When the first of them was held back.
    since: Option<Instant>,
}

impl Deferred {
    fn due(&self) -> bool {
        self.entries >= COMMIT_ENTRIES
            || self.bytes >= COMMIT_BYTES
            || self.since.is_some_and(|t| t.elapsed() >= COMMIT_DELAY)
    }
}

impl StateFile {
    fn new(persist: Persist) -> Self {
        Self {
            persist,
            unsynced: 0,
            unsynced_since: None,
            deferred: Deferred::default(),
        }
    }

    /// Commit what is held back, fsynced if `durable`; with nothing held back, a durable
    /// commit still makes the earlier ones durable. Returns the commands committed (for
    /// metrics): 0 if nothing was held back.
    fn commit_deferred(&mut self, durable: bool) -> StoreResult<usize> {
        let Some((revision, compact, meta)) = self.deferred.tail.take() else {
            if durable && self.unsynced_since.is_some() {
                self.persist.sync()?;
                self.unsynced = 0;
                self.unsynced_since = None;
            }
            return Ok(0);
        };
        let res = self.persist.commit_with_raft_meta(
            &self.deferred.applied,
            revision,
            compact,
            &meta,
            durable,
        );
        if let Err(e) = res {
            // Nothing of it was committed: still held back (a later commit retries it; the
            // apply that meets the error stops the member).
            self.deferred.tail = Some((revision, compact, meta));
            return Err(e);
        }
        let d = std::mem::take(&mut self.deferred);
        if durable {
            self.unsynced = 0;
            self.unsynced_since = None;
        } else {
            self.unsynced += d.entries;
            let since = d.since.unwrap_or_else(Instant::now);
            self.unsynced_since.get_or_insert(since);
        }
        Ok(d.applied.len())
    }

    /// Make every applied batch so far durable.
    fn sync(&mut self) -> StoreResult<()> {
        self.commit_deferred(true).map(|_| ())
    }
}

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
    /// Newest revision applied and visible to readers (durable through the Raft log; its
    /// commit to `state.redb` may be held back, see the module docs).
    pub(crate) published: AtomicI64,
    pub(crate) hub: Mutex<WatchHub>,
    pub(crate) catch_up: Notify,
    /// The index of the last entry applied and published to readers (raised right after
    /// each apply, without waiting for openraft's metrics): what a member waits on to
    /// read its own forwarded writes and read-index reads.
    pub(crate) applied_index: tokio::sync::watch::Sender<u64>,
    /// Signalled when an apply batch is held back with nothing before it: the deferred
    /// commit task (`RaftStore`) then commits it within [`COMMIT_DELAY`] should no later
    /// apply do so.
    pub(crate) deferred: Arc<Notify>,
    /// Lease deadlines; acted upon only by the leader (see `RaftStore`).
    pub(crate) deadlines: Mutex<HashMap<i64, Instant>>,
    /// This member's limits. `max_txn_ops` is enforced by `RaftStore::propose` before a
    /// write is proposed and is never consulted when applying (`Mvcc::apply` ignores it).
    pub(crate) limits: Limits,
    dir: PathBuf,
    /// Lock order: `state` before `persist`, never the other way round.
    persist: Mutex<Option<StateFile>>,
    current_snapshot: Mutex<Option<StoredSnapshot>>,
    snapshot_seq: AtomicU64,
    pub(crate) db_size: AtomicI64,
    pub(crate) metrics: StoreMetrics,
    /// The engine's size and whether its NOSPACE alarm is raised, as of the last apply
    /// (read on every write's path by the leader's quota check, without the state lock).
    pub(crate) quota_state: QuotaState,
}

/// The engine's quota figures, published after each apply.
#[derive(Default)]
pub(crate) struct QuotaState {
    pub(crate) size: AtomicU64,
    pub(crate) nospace: std::sync::atomic::AtomicBool,
}

impl QuotaState {
    pub(crate) fn set(&self, mvcc: &Mvcc) {
        self.size.store(mvcc.size_bytes(), Ordering::Relaxed);
        self.nospace.store(
            mvcc.has_alarm(crate::types::AlarmKind::NoSpace),
            Ordering::Relaxed,
        );
    }
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
        let applied_index = tokio::sync::watch::Sender::new(last_applied.map_or(0, |l| l.index));
        metrics.applied_revision.set(mvcc.revision());
        metrics.db_size_bytes.set(persist.size_bytes());
        let quota_state = QuotaState::default();
        quota_state.set(&mvcc);
        Ok(Arc::new(SmShared {
            quota_state,
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
            applied_index,
            deferred: Arc::new(Notify::new()),
            deadlines: Mutex::new(deadlines),
            limits,
            dir,
            persist: Mutex::new(Some(StateFile::new(persist))),
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

    /// Make `state.redb` durable and close it (member shutdown), and end every watch.
    pub(crate) fn close(&self) {
        if let Some(mut file) = lock(&self.persist).take() {
            if let Err(e) = file.sync() {
                // Not fatal: what was not made durable is redone from the log on restart.
                tracing::warn!(error = %e, "making state.redb durable at shutdown failed");
            }
        }
        lock(&self.hub).close_all();
    }

    /// Apply `entries` to the engine and commit the outcome to `state.redb` (blocking).
    /// Returns the answers, what changed, and the new revision (to publish).
    fn apply_entries(
        &self,
        entries: Vec<Entry<TypeConfig>>,
        durable: bool,
    ) -> StoreResult<(Vec<RaftResponse>, Vec<Applied>, i64)> {
        let mut responses = Vec::with_capacity(entries.len());
        let mut applied = Vec::new();
        let mut fresh = 0u64;
        let mut guard = self.write();
        let st = &mut *guard;
        for entry in entries {
            // Idempotence: whatever is already applied (and committed) is not applied twice.
            if st
                .last_applied
                .is_some_and(|l| entry.log_id.index <= l.index)
            {
                responses.push(RaftResponse::Skipped);
                continue;
            }
            fresh += 1;
            st.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(RaftResponse::Skipped),
                EntryPayload::Normal(proposal) => {
                    let mut results = Vec::with_capacity(proposal.commands.len());
                    for cmd in &proposal.commands {
                        match st.mvcc.apply(cmd, &self.limits) {
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
        let revision = st.mvcc.revision();
        if fresh == 0 {
            return Ok((responses, applied, revision));
        }
        self.quota_state.set(&st.mvcc);
        let meta = encode_meta(&st.last_applied, &st.membership)?;
        let compact = st.mvcc.compact_revision();
        // Take the file before letting go of the state: whoever reads the state after this
        // (a snapshot being built) and then takes the file finds this batch committed.
        let mut file = lock(&self.persist);
        drop(guard);
        let file = file.as_mut().ok_or(StoreError::Stopped)?;
        self.commit(file, &applied, revision, compact, meta, fresh, durable)?;
        Ok((responses, applied, revision))
    }

    /// Whether the commit of the next apply batch, of up to `entries` log entries, is to be
    /// a checkpoint (fsynced; see the module docs).
    fn checkpoint_due(&self, entries: u64) -> bool {
        match lock(&self.persist).as_ref() {
            Some(file) => {
                let oldest = match (file.unsynced_since, file.deferred.since) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                file.unsynced + file.deferred.entries + entries >= CHECKPOINT_ENTRIES
                    || oldest.is_some_and(|t| t.elapsed() >= CHECKPOINT_INTERVAL)
            }
            None => false,
        }
    }

    /// Hold back one apply batch covering `entries` log entries, then commit what is held
    /// back if that is due, fsynced if `durable` (module docs).
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        file: &mut StateFile,
        applied: &[Applied],
        revision: i64,
        compact: i64,
        meta: Vec<u8>,
        entries: u64,
        durable: bool,
    ) -> StoreResult<()> {
        let d = &mut file.deferred;
        let first = d.tail.is_none();
        d.applied.extend(applied.iter().cloned());
        d.entries += entries;
        d.bytes += applied
            .iter()
            .filter_map(|a| a.revision.as_ref())
            .flat_map(|(_, events)| events.iter())
            .map(|e| e.kv.key.len() + e.kv.value.len())
            .sum::<usize>();
        d.tail = Some((revision, compact, meta));
        d.since.get_or_insert_with(Instant::now);
        if durable || d.due() {
            self.commit_deferred(file, durable)?;
        } else if first {
            self.deferred.notify_one();
        }
        Ok(())
    }

    /// Commit what `file` holds back, with metrics.
    fn commit_deferred(&self, file: &mut StateFile, durable: bool) -> StoreResult<()> {
        let started = Instant::now();
        let commands = file.commit_deferred(durable)?;
        if commands == 0 {
            return Ok(());
        }
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        self.metrics.batch_size.observe(commands as f64);
        let size = file.persist.size_bytes();
        self.db_size.store(size, Ordering::Relaxed);
        self.metrics.db_size_bytes.set(size);
        Ok(())
    }

    /// Commit the held-back apply batches if they are due (the deferred commit task).
    pub(crate) fn commit_deferred_if_due(&self) -> StoreResult<()> {
        match lock(&self.persist).as_mut() {
            Some(file) if file.deferred.due() => self.commit_deferred(file, false),
            _ => Ok(()),
        }
    }

    /// Raise `applied_index` to `index` (never lowers it), waking whoever waits for it.
    fn raise_applied_index(&self, index: u64) {
        self.applied_index.send_if_modified(|applied| {
            let raise = index > *applied;
            if raise {
                *applied = index;
            }
            raise
        });
    }

    fn publish(&self, applied: &[Applied], revision: i64) {
        crate::embedded::track_lease_deadlines(&mut lock(&self.deadlines), applied);
        self.metrics.applied_revision.set(revision);
        let size = self.quota_state.size.load(Ordering::Relaxed);
        self.metrics
            .size_in_use_bytes
            .set(i64::try_from(size).unwrap_or(i64::MAX));
        let nospace = self.quota_state.nospace.load(Ordering::Relaxed);
        self.metrics.alarm_nospace.set(i64::from(nospace));
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
        let started = std::time::Instant::now();
        let (backup, last_applied, membership) = {
            let st = self.read();
            (
                Backup::from_mvcc(&st.mvcc, st.mvcc.revision()),
                st.last_applied,
                st.membership.clone(),
            )
        };
        // Once this snapshot exists openraft may purge the log up to `last_applied`, and a
        // crash must then not take the state back below it: make it durable first. Every
        // batch up to `last_applied` is committed by now (`apply_entries` takes the file
        // before it lets go of the state, the other way round from here).
        match lock(&self.persist).as_mut() {
            Some(file) => file.sync().map_err(|e| e.to_string())?,
            None => return Err("state.redb is closed".into()),
        }
        let data = backup.encode().map_err(|e| e.to_string())?;
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
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.snapshot_seconds.observe(seconds);
        tracing::info!(snapshot = %meta, keys = backup.key_count(), bytes = data.len(), seconds, "built raft snapshot");
        *lock(&self.current_snapshot) = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// Most commands in an apply batch applied and committed (without fsync) on the calling
/// task rather than on a blocking thread.
const MAX_INLINE_COMMANDS: usize = 256;

/// Whether `entries` are cheap to apply and commit without fsync: few commands, none of
/// them a compaction (which rewrites history in `state.redb`).
fn is_light(entries: &[Entry<TypeConfig>]) -> bool {
    let mut commands = 0;
    for e in entries {
        if let EntryPayload::Normal(p) = &e.payload {
            if p.commands
                .iter()
                .any(|c| matches!(c, crate::mvcc::Command::Compact { .. }))
            {
                return false;
            }
            commands += p.commands.len();
        }
    }
    commands <= MAX_INLINE_COMMANDS
}

/// openraft's state machine handle.
pub struct StateMachine {
    pub(crate) shared: Arc<SmShared>,
    /// This member's durable log: entries are applied only once durable here (a leader
    /// reports its own appends flushed before they are; see `log_store.rs`). `None`: no
    /// early-answered appends (storage used without a running member).
    pub(crate) durable: Option<tokio::sync::watch::Receiver<super::log_store::Durability>>,
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
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let last_index = entries.last().map_or(0, |e| e.log_id.index);
        if let (Some(rx), Some(last)) = (self.durable.as_mut(), entries.last()) {
            // Nothing is answered, read, watched or snapshotted before it is durable on
            // this member: a leader counted its own entry before its fdatasync.
            if let Err(e) = super::log_store::wait_durable(rx, last.log_id.index).await {
                tracing::error!(error = %e, "the raft log failed before entries to apply became durable; this member stops");
                return Err(sm_write_err(e));
            }
        }
        let durable = self.shared.checkpoint_due(entries.len() as u64);
        // A small batch committed without fsync takes a fraction of a millisecond: done
        // here, it saves the hand-over to a blocking thread and back on every write's path.
        // A checkpoint (fsync), a big batch or a compaction goes to a blocking thread.
        let result = if durable || !is_light(&entries) {
            let shared = self.shared.clone();
            tokio::task::spawn_blocking(move || shared.apply_entries(entries, durable))
                .await
                .map_err(sm_write_err)?
        } else {
            self.shared.apply_entries(entries, false)
        };
        let (responses, applied, revision) = result.map_err(|e| {
            tracing::error!(error = %e, "committing applied entries failed; this member stops");
            sm_write_err(e)
        })?;
        self.shared.publish(&applied, revision);
        self.shared.raise_applied_index(last_index);
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
        let backup = Backup::decode(&data)
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
            *guard = Some(StateFile::new(persist));
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
            self.shared.quota_state.set(&mvcc);
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
        self.shared
            .raise_applied_index(meta.last_log_id.map_or(0, |l| l.index));
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

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;
    use crate::mvcc::Command;
    use crate::{PutRequest, TxnOp, TxnRequest};

    fn put(index: u64) -> Entry<TypeConfig> {
        let put = PutRequest::new(format!("/k{index}"), "v".to_owned());
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(super::super::Proposal {
                commands: vec![Command::Txn(TxnRequest {
                    success: vec![TxnOp::Put(put)],
                    ..Default::default()
                })],
            }),
        }
    }

    /// The last applied index `state.redb` holds (what a start-up would find).
    fn in_file(sm: &SmShared) -> Option<u64> {
        let guard = lock(&sm.persist);
        let bytes = guard.as_ref().unwrap().persist.raft_meta().unwrap()?;
        let (applied, _): (Option<LogId<u64>>, Membership) = postcard::from_bytes(&bytes).unwrap();
        applied.map(|l| l.index)
    }

    /// Pretend the batch held back now began `ago` before now (`None`: never comes due by
    /// time).
    fn held_since(sm: &SmShared, ago: Option<Duration>) {
        let mut guard = lock(&sm.persist);
        let d = &mut guard.as_mut().unwrap().deferred;
        d.since = Some(match ago {
            Some(ago) => Instant::now() - ago,
            None => Instant::now() + Duration::from_secs(3600),
        });
    }

    #[test]
    fn applied_batches_are_committed_together_when_due_and_before_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let sm = SmShared::open(dir.path().to_owned(), Limits::default()).unwrap();

        // Held back: applied (readers see it), not in the file.
        sm.apply_entries(vec![put(1)], false).unwrap();
        held_since(&sm, None);
        sm.apply_entries(vec![put(2), put(3)], false).unwrap();
        assert_eq!(sm.read().mvcc.revision(), 3);
        assert_eq!(in_file(&sm), None);
        sm.commit_deferred_if_due().unwrap();
        assert_eq!(in_file(&sm), None, "not due yet");

        // Due by time: the deferred commit task commits all three batches in one go.
        held_since(&sm, Some(COMMIT_DELAY));
        sm.commit_deferred_if_due().unwrap();
        assert_eq!(in_file(&sm), Some(3));
        assert_eq!(lock(&sm.persist).as_ref().unwrap().unsynced, 3);

        // Due by size: a batch of COMMIT_ENTRIES entries is committed by its own apply.
        let big: Vec<_> = (4..4 + COMMIT_ENTRIES).map(put).collect();
        sm.apply_entries(big, false).unwrap();
        assert_eq!(in_file(&sm), Some(3 + COMMIT_ENTRIES));

        // A snapshot makes what is held back durable first.
        let next = 4 + COMMIT_ENTRIES;
        sm.apply_entries(vec![put(next)], false).unwrap();
        held_since(&sm, None);
        assert_eq!(in_file(&sm), Some(next - 1));
        let snap = sm.build_snapshot().unwrap();
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(next));
        assert_eq!(in_file(&sm), Some(next));
        assert_eq!(lock(&sm.persist).as_ref().unwrap().unsynced, 0);

        // A crash loses only what was held back (the Raft log redoes it); a close loses
        // nothing.
        sm.apply_entries(vec![put(next + 1)], false).unwrap();
        held_since(&sm, None);
        drop(lock(&sm.persist).take());
        drop(sm);
        let sm = SmShared::open(dir.path().to_owned(), Limits::default()).unwrap();
        assert_eq!(sm.read().last_applied.map(|l| l.index), Some(next));
        sm.apply_entries(vec![put(next + 1)], false).unwrap();
        held_since(&sm, None);
        sm.close();
        drop(sm);
        let sm = SmShared::open(dir.path().to_owned(), Limits::default()).unwrap();
        assert_eq!(sm.read().last_applied.map(|l| l.index), Some(next + 1));
        assert_eq!(sm.read().mvcc.revision(), next as i64 + 1);
    }
}
