//! The Raft log: `raft-log.redb`, made durable through a write-ahead log
//! (`raft-log.wal`, [`crate::wal`]).
//!
//! Tables: `log`: index → `crc32 | postcard(Entry)`; `meta`: `vote`, `committed`,
//! `last_purged`, `wal_seq` → `crc32 | postcard(..)`.
//!
//! Durability: appends go to one writer thread that drains every queued append into one
//! write-ahead log record made durable with one `fdatasync` — group commit — and only
//! *then* fires each append's flush callback, so openraft never counts an entry as durable
//! before it is. The entries are later inserted into `raft-log.redb` in a transaction
//! committed *without* fsync (a redb commit with `Durability::Immediate` is two fsyncs and
//! several page writes, about four times the cost of the log record); a durable redb
//! commit (a checkpoint) follows every [`CHECKPOINT_BYTES`] of log or [`CHECKPOINT_EVERY`],
//! after which the write-ahead log starts over. Every redb commit records the sequence
//! number of the last log record it holds (`wal_seq`); at start-up the records after it
//! are inserted again. Until inserted, appended entries are served to readers from an
//! in-memory overlay.
//!
//! **Insertions are deferred and batched**: logged entries wait (in the overlay, see
//! [`Deferred`]) until [`INSERT_DELAY`] after the first of them, [`INSERT_ROWS`] rows or
//! [`INSERT_BYTES`], and go into `raft-log.redb` in one transaction. Inserting each
//! append on its own cost every write a redb commit and, after an inline append (below),
//! a wake-up of the writer thread on its path. Every checkpoint (so every truncation,
//! purge, vote and the close) inserts what is deferred first, in the same transaction:
//! the write-ahead log never starts over while it holds a record not in the file.
//!
//! An append that finds the writer idle (nothing queued, its state free) is logged by the
//! appending task itself: openraft 0.9's core awaits the flush of every append before it
//! goes on, so handing the append to the writer thread and its callback back costs two
//! thread wake-ups on every write's path (leader and follower) and gains nothing. Its
//! insertion is deferred like any other; the writer thread is woken only to arm the
//! deadline of a new batch (or when a batch or checkpoint is due). While anything is
//! queued, appends go to the writer thread, which keeps all log operations in order.
//!
//! **A leader's own appends are answered early.** openraft 0.9's core awaits the flush of
//! each append before it starts replicating it, which puts the leader's `fdatasync` and
//! the followers' one after the other on every write's path. A running member (see
//! [`LogDb::enable_early_ack`]) therefore reports its own entries as leader (the entries'
//! leader ID is the committed vote it saved last, and that vote is its own) flushed at
//! once and queues them for the writer thread; replication and the leader's write run in
//! parallel. openraft then counts the leader's copy toward the quorum before it is
//! durable, so everything that must not run ahead of it waits for [`LogDb::durable`],
//! the end of the durable log, published after every `fdatasync`:
//! - the state machine applies an entry only once it is durable here (so no client is
//!   answered, no read served and no watcher told of it before; snapshots and log
//!   purges follow the applied state);
//! - the commit index sent to followers is lowered to it (`network::clamp_commit`), so
//!   no follower applies an entry that a power cut of the leader could still take from a
//!   quorum (a heartbeat brings the rest once durable);
//! - the committed log ID is never saved past it.
//!
//! A failed or closed writer marks `durable` failed: what waits for it gives up and the
//! member stops. Followers' appends are reported only once durable, as before, because
//! their answer is what the leader counts.
//!
//! `save_vote`, `truncate` and `purge` go through the same writer, after every earlier
//! append, and commit durably (a checkpoint): so a log record is never replayed over a
//! later truncation. `save_committed` only records the committed log ID in memory: the
//! writer stores it with an append, at most every [`COMMITTED_EVERY`] (and at close), so
//! it costs nothing of its own.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, StorageError, StorageIOError, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{seal, unseal, TypeConfig};
use crate::metrics::RaftMetrics;
use crate::wal::{Wal, CHECKPOINT_BYTES, CHECKPOINT_EVERY};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub const LOG_FILE: &str = "raft-log.redb";
/// The write-ahead log of `raft-log.redb`.
pub const LOG_WAL_FILE: &str = "raft-log.wal";

type SErr = StorageError<u64>;

fn read_err(e: impl ToString) -> SErr {
    StorageError::IO {
        source: StorageIOError::read_logs(AnyError::error(e.to_string())),
    }
}

fn write_err(e: impl ToString) -> SErr {
    StorageError::IO {
        source: StorageIOError::write_logs(AnyError::error(e.to_string())),
    }
}

fn vote_err(e: impl ToString) -> SErr {
    StorageError::IO {
        source: StorageIOError::write_vote(AnyError::error(e.to_string())),
    }
}

type Reply = tokio::sync::oneshot::Sender<Result<(), String>>;
/// Sealed log rows (`crc32 | postcard(Entry)`) by log ID.
type Rows = Vec<(LogId<u64>, Vec<u8>)>;

/// Work for the writer thread, done in the order sent.
enum WriteOp {
    Append {
        rows: Rows,
        /// `None`: a leader append already reported flushed (see [`LogDb::durable`]).
        callback: Option<LogFlushed<TypeConfig>>,
    },
    /// An inline append deferred an insertion (see the module docs): insert when due.
    Deferred,
    /// Remove the entries in `range` and, for a purge, record `last_purged`; durably.
    Remove {
        range: (Bound<u64>, Bound<u64>),
        purged: Option<LogId<u64>>,
        /// A truncation from this index: the durable log ends at the given entry before
        /// it (if it ended at or after the index).
        truncated: Option<(u64, Option<LogId<u64>>)>,
        reply: Reply,
    },
    /// Write one meta record (`crc32 | postcard`), durably.
    Meta {
        key: &'static str,
        sealed: Vec<u8>,
        reply: Reply,
    },
}

/// One write-ahead log record: the rows of a group of appends, and the committed log ID
/// if it was due to be saved.
#[derive(Serialize)]
struct LogBatchRef<'a> {
    rows: Vec<(u64, &'a [u8])>,
    committed: Option<Option<LogId<u64>>>,
}

/// [`LogBatchRef`] read back (same encoding).
#[derive(Deserialize)]
struct LogBatch {
    rows: Vec<(u64, Vec<u8>)>,
    committed: Option<Option<LogId<u64>>>,
}

/// One append waiting for the writer: its rows and, unless already answered, its callback.
type Append = (Rows, Option<LogFlushed<TypeConfig>>);

/// How far this member's log is durable: what a leader's early-answered appends wait for.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Durability {
    /// The last entry of the durable prefix of the log: an entry of the current log (a
    /// truncation below it moves it back), or, after a purge or an installed snapshot, the
    /// last purged one.
    pub(crate) last: Option<LogId<u64>>,
    /// The log writer failed or closed: nothing more becomes durable.
    pub(crate) failed: Option<String>,
}

impl Durability {
    /// Whether the entry at `index` is durable; `Err` once nothing more can become so.
    pub(crate) fn covers(&self, index: u64) -> Result<bool, String> {
        if self.last.is_some_and(|l| l.index >= index) {
            return Ok(true);
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(false),
        }
    }
}

/// Wait until the entry at `index` is durable in the log `rx` watches; `Err` once nothing
/// more can become durable (the log failed or closed).
pub(crate) async fn wait_durable(
    rx: &mut tokio::sync::watch::Receiver<Durability>,
    index: u64,
) -> Result<(), String> {
    let durability = rx
        .wait_for(|d| !matches!(d.covers(index), Ok(false)))
        .await
        .map_err(|_| "the raft log closed".to_string())?;
    durability.covers(index).map(|_| ())
}

/// Appends committed per fsync at most.
const MAX_GROUP: usize = 1024;

/// Logged entries are inserted into `raft-log.redb` at most this long after the first of a
/// batch was logged (see the module docs)...
const INSERT_DELAY: Duration = Duration::from_millis(20);
/// ... or once this many rows ...
const INSERT_ROWS: usize = 1024;
/// ... or this many bytes are waiting.
const INSERT_BYTES: usize = 4 << 20;

/// The saved committed log ID rides along with an append at most this often: the value
/// is only a start-up shortcut (see `save_committed`).
const COMMITTED_EVERY: Duration = Duration::from_millis(100);

/// The open log database, closable so a member can be restarted in the same process.
pub(crate) struct LogDb {
    db: RwLock<Option<Database>>,
    path: PathBuf,
    /// Appended but not yet in `raft-log.redb` (visible to readers).
    pending: Mutex<BTreeMap<u64, Entry<TypeConfig>>>,
    writer: Mutex<Option<(mpsc::Sender<WriteOp>, std::thread::JoinHandle<()>)>>,
    /// The log writer's state: taken by the writer thread for each round of work, or by an
    /// inline append. `None` once closed.
    state: Mutex<Option<Writer>>,
    /// Operations sent to the writer thread and not yet done.
    queued: AtomicUsize,
    /// The committed log ID last saved, and whether it still has to be written.
    committed: Mutex<Committed>,
    /// Set by a running member to its node ID: its own appends as leader are then reported
    /// flushed to openraft at once (see the module docs).
    early_ack: OnceLock<u64>,
    /// The vote last saved.
    vote: Mutex<Option<Vote<u64>>>,
    /// The durable prefix of the log, published after every `fdatasync`.
    pub(crate) durable: tokio::sync::watch::Sender<Durability>,
    /// Signalled when `durable` turns failed: what waits only for that waits here, not on
    /// `durable`, which changes with every write.
    pub(crate) failure: Arc<tokio::sync::Notify>,
    /// Test switch: every log write takes this much longer (milliseconds), as on a slow
    /// disk.
    pub(crate) flush_delay_ms: AtomicU64,
    /// Test switch: log writes fail, as on a failing disk.
    pub(crate) fail_writes: std::sync::atomic::AtomicBool,
    /// Flush latency and checkpoints here; the member's commit latency (`RaftStore`).
    pub(crate) metrics: RaftMetrics,
}

#[derive(Default)]
struct Committed {
    /// `None`: nothing saved since the file was opened (read it from the file).
    latest: Option<Option<LogId<u64>>>,
    unwritten: bool,
    /// When it was last handed to the writer.
    written_at: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn put_sealed(txn: &WriteTransaction, key: &str, sealed: &[u8]) -> Result<(), String> {
    let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
    meta.insert(key, sealed).map_err(|e| e.to_string())?;
    Ok(())
}

fn sealed<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    postcard::to_allocvec(value)
        .map(|p| seal(&p))
        .map_err(|e| e.to_string())
}

/// The writer thread's state.
struct Writer {
    db: Arc<LogDb>,
    wal: Wal,
    /// Sequence number of the last log record `raft-log.redb` holds.
    wal_seq: u64,
    last_checkpoint: Instant,
    /// Logged, not yet inserted.
    deferred: Deferred,
    /// A failed redb commit: the entries are durable in the log but the state file can no
    /// longer be trusted to hold them, so nothing more is accepted.
    failed: Option<String>,
}

/// Logged appends waiting to be inserted into `raft-log.redb` together (module docs);
/// readers find them in the overlay meanwhile.
#[derive(Default)]
struct Deferred {
    rows: Vec<Rows>,
    count: usize,
    bytes: usize,
    /// The latest committed log ID logged with them, if one was.
    committed: Option<Option<LogId<u64>>>,
    /// The log record that holds the last of them.
    seq: u64,
    /// When the first of them was logged; `None`: nothing waits.
    since: Option<Instant>,
}

impl Deferred {
    fn push(&mut self, logged: Logged) {
        let Logged {
            rows,
            committed,
            seq,
        } = logged;
        for r in &rows {
            self.count += r.len();
            self.bytes += r.iter().map(|(_, b)| b.len()).sum::<usize>();
        }
        self.rows.extend(rows);
        if committed.is_some() {
            self.committed = committed;
        }
        self.seq = seq;
        self.since.get_or_insert_with(Instant::now);
    }

    fn is_empty(&self) -> bool {
        self.since.is_none()
    }

    /// When the batch must be inserted at the latest.
    fn deadline(&self) -> Option<Instant> {
        self.since.map(|s| s + INSERT_DELAY)
    }

    fn due(&self) -> bool {
        self.count >= INSERT_ROWS
            || self.bytes >= INSERT_BYTES
            || self.deadline().is_some_and(|d| d <= Instant::now())
    }

    /// Write the rows (and committed log ID) into `txn`.
    fn fill(&self, txn: &WriteTransaction) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        if let Some(c) = &self.committed {
            put_sealed(txn, "committed", &sealed(c)?)?;
        }
        let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
        for (id, bytes) in self.rows.iter().flatten() {
            table
                .insert(id.index, bytes.as_slice())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Writer {
    /// One redb transaction: `fill`, then `wal_seq`; fsynced when `durable`.
    fn commit(
        &self,
        durable: bool,
        fill: impl FnOnce(&WriteTransaction) -> Result<(), String>,
    ) -> Result<(), String> {
        self.db.with(|d| {
            let mut txn = d.begin_write().map_err(|e| e.to_string())?;
            if !durable {
                txn.set_durability(redb::Durability::None)
                    .map_err(|e| e.to_string())?;
            }
            fill(&txn)?;
            put_sealed(&txn, "wal_seq", &sealed(&self.wal_seq)?)?;
            txn.commit().map_err(|e| e.to_string())
        })
    }

    /// A durable commit of everything so far (with `fill`); the log starts over.
    fn checkpoint(
        &mut self,
        fill: impl FnOnce(&WriteTransaction) -> Result<(), String>,
    ) -> Result<(), String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // What is deferred goes in first, in the same transaction: the log starts over
        // below, so every record it holds must be in the file.
        let deferred = std::mem::take(&mut self.deferred);
        let held = self.wal_seq;
        if !deferred.is_empty() {
            self.wal_seq = deferred.seq;
        }
        if let Err(e) = self.commit(true, |txn| {
            deferred.fill(txn)?;
            fill(txn)
        }) {
            // Nothing of it was committed: still deferred, the log unchanged.
            self.wal_seq = held;
            self.deferred = deferred;
            return Err(e);
        }
        self.db.drop_inserted(&deferred.rows);
        self.wal.restart();
        self.last_checkpoint = Instant::now();
        self.db.metrics.log_checkpoints.inc();
        Ok(())
    }

    /// Make a group of appends durable, answer them, and defer their insertion.
    fn flush(&mut self, appends: Vec<Append>) {
        if let Some(logged) = self.log(appends) {
            self.defer(logged);
        }
    }

    /// Make a group of appends durable with one log record and `fdatasync`, and answer
    /// them (openraft may count them then). `None`: nothing to insert (no appends, or the
    /// log failed and they were answered with the error).
    fn log(&mut self, appends: Vec<Append>) -> Option<Logged> {
        if appends.is_empty() {
            return None;
        }
        let last = appends
            .iter()
            .rev()
            .find_map(|(rows, _)| rows.last().map(|(id, _)| *id));
        let mut committed = self.db.take_unwritten_committed(false);
        // A leader counts its early-answered appends, so the committed log ID may run
        // ahead of what this record makes durable: never save one past it (a restart
        // would look for entries the log lacks). The full value goes with a later record.
        if let (Some(Some(c)), Some(l)) = (committed, last) {
            if c.index > l.index {
                committed = Some(Some(l));
                lock(&self.db.committed).unwritten = true;
            }
        }
        let logged = match &self.failed {
            Some(e) => Err(e.clone()),
            None if self.db.fail_writes.load(Ordering::Relaxed) => Err(format!(
                "{}: injected log write failure (test switch)",
                self.db.path.display()
            )),
            None => {
                let batch = LogBatchRef {
                    rows: appends
                        .iter()
                        .flat_map(|(rows, _)| rows.iter().map(|(id, b)| (id.index, b.as_slice())))
                        .collect(),
                    committed,
                };
                let started = Instant::now();
                let logged = self
                    .wal
                    .append_with(|buf| crate::wal::encode_into(&batch, buf))
                    .map_err(|e| e.to_string());
                let delay = self.db.flush_delay_ms.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(Duration::from_millis(delay));
                }
                self.db
                    .metrics
                    .log_flush_seconds
                    .observe(started.elapsed().as_secs_f64());
                logged
            }
        };
        let seq = match logged {
            Ok(seq) => seq,
            Err(e) => {
                tracing::error!(error = %e, file = %self.db.path.display(), "flushing the raft log failed; the member stops accepting log writes");
                // The record's bytes may have reached the disk under a sequence number
                // the log will hand out again: no checkpoint (which restarts the log
                // and would let a later start replay that record) may follow.
                self.failed.get_or_insert_with(|| e.clone());
                if committed.is_some() {
                    lock(&self.db.committed).unwritten = true;
                }
                self.db.mark_failed(&e);
                let mut pending = lock(&self.db.pending);
                for (rows, callback) in appends {
                    // Answered early: openraft already counts them as in the log, so they
                    // stay readable (removing them could leave a hole in what replication
                    // reads); the member stops on `durable.failed` (`RaftStore`).
                    let Some(callback) = callback else { continue };
                    // Not durable anywhere: readers must not see them.
                    for (id, _) in &rows {
                        if pending.get(&id.index).is_some_and(|en| en.log_id == *id) {
                            pending.remove(&id.index);
                        }
                    }
                    callback.log_io_completed(Err(std::io::Error::other(e.clone())));
                }
                return None;
            }
        };
        // Durable: openraft may count these entries now, and what waits for a leader's
        // early-answered ones may go on.
        if last.is_some() {
            self.db.durable.send_modify(|d| d.last = last);
        }
        let mut rows_all = Vec::with_capacity(appends.len());
        for (rows, callback) in appends {
            if let Some(callback) = callback {
                callback.log_io_completed(Ok(()));
            }
            rows_all.push(rows);
        }
        Some(Logged {
            rows: rows_all,
            committed,
            seq,
        })
    }

    /// Queue logged appends for insertion into redb (see the module docs).
    fn defer(&mut self, logged: Logged) {
        if self.failed.is_some() {
            // The entries stay in the overlay and in the log (the next start inserts
            // them); nothing more is written.
            return;
        }
        self.deferred.push(logged);
    }

    /// Whether [`Writer::maintain`] has work now.
    fn maintenance_due(&self) -> bool {
        self.failed.is_none() && (self.deferred.due() || self.checkpoint_due())
    }

    fn checkpoint_due(&self) -> bool {
        self.wal.written() > 0
            && (self.wal.written() >= CHECKPOINT_BYTES
                || self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY)
    }

    /// Insert the deferred appends if due (no fsync), and checkpoint if one is due.
    fn maintain(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if self.checkpoint_due() {
            if let Err(e) = self.checkpoint(|_| Ok(())) {
                tracing::error!(error = %e, file = %self.db.path.display(), "raft log checkpoint failed; the member stops accepting log writes");
                self.db.mark_failed(&e);
                self.failed = Some(e);
            }
            return;
        }
        if !self.deferred.due() {
            return;
        }
        let deferred = std::mem::take(&mut self.deferred);
        self.wal_seq = deferred.seq;
        if let Err(e) = self.commit(false, |txn| deferred.fill(txn)) {
            // The entries stay in the overlay (readers still find them) and in the log
            // (the next start inserts them); nothing more is accepted.
            tracing::error!(error = %e, file = %self.db.path.display(), "writing the raft log file failed; the member stops accepting log writes");
            let e = format!("{}: {e}", self.db.path.display());
            self.db.mark_failed(&e);
            self.failed = Some(e);
            return;
        }
        self.db.drop_inserted(&deferred.rows);
    }
}

/// Appends made durable, to be inserted into `raft-log.redb`.
struct Logged {
    rows: Vec<Rows>,
    committed: Option<Option<LogId<u64>>>,
    /// The log record that holds them.
    seq: u64,
}

/// Marks the durable log failed should the writer thread panic: nothing would ever
/// become durable again, and what waits for it must not wait forever.
struct PanicGuard<'a>(&'a LogDb);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.mark_failed("the raft log writer panicked");
        }
    }
}

fn writer_loop(db: Arc<LogDb>, rx: mpsc::Receiver<WriteOp>) {
    let _guard = PanicGuard(&db);
    // When the deferred insertions are due, if any wait.
    let mut deadline: Option<Instant> = None;
    loop {
        let first = match deadline {
            None => match rx.recv() {
                Ok(op) => Some(op),
                Err(_) => break,
            },
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(op) => Some(op),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
        };
        let mut ops: Vec<WriteOp> = first.into_iter().collect();
        while ops.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        let taken = ops.len();
        {
            let mut state = lock(&db.state);
            deadline = match state.as_mut() {
                Some(w) => {
                    work(w, ops);
                    w.maintain();
                    w.deferred.deadline().filter(|_| w.failed.is_none())
                }
                None => {
                    refuse(&db, ops, &format!("{} is closed", db.path.display()));
                    None
                }
            };
        }
        db.queued.fetch_sub(taken, Ordering::AcqRel);
    }
    // Closing: everything into the file durably (what is deferred, the committed log ID).
    let Some(mut w) = lock(&db.state).take() else {
        return;
    };
    let committed = w.db.take_unwritten_committed(true);
    let res = w.checkpoint(|txn| match &committed {
        Some(c) => put_sealed(txn, "committed", &sealed(c)?),
        None => Ok(()),
    });
    if let Err(e) = res {
        tracing::warn!(error = %e, file = %w.db.path.display(), "final raft log checkpoint failed (the next start replays the log)");
    }
}

/// One round of the writer thread: `ops` in order, appends in between grouped into one
/// log record.
fn work(w: &mut Writer, ops: Vec<WriteOp>) {
    let mut appends = Vec::new();
    for op in ops {
        match op {
            WriteOp::Append { rows, callback } => appends.push((rows, callback)),
            // (Ordered after the appends before it like every other op; the caller then
            // runs `maintain`.)
            WriteOp::Deferred => {}
            WriteOp::Remove {
                range,
                purged,
                truncated,
                reply,
            } => {
                w.flush(std::mem::take(&mut appends));
                let res = w.checkpoint(|txn| {
                    let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                    table
                        .retain_in(range, |_, _| false)
                        .map_err(|e| e.to_string())?;
                    if let Some(p) = &purged {
                        put_sealed(txn, "last_purged", &sealed(p)?)?;
                    }
                    Ok(())
                });
                if let Some((since, before)) = truncated {
                    w.db.durable.send_modify(|d| {
                        if d.last.is_some_and(|l| l.index >= since) {
                            d.last = before;
                        }
                    });
                }
                let _ = reply.send(res);
            }
            WriteOp::Meta { key, sealed, reply } => {
                w.flush(std::mem::take(&mut appends));
                let res = w.checkpoint(|txn| put_sealed(txn, key, &sealed));
                let _ = reply.send(res);
            }
        }
    }
    w.flush(appends);
}

/// Answer `ops` with `e` (the writer's state is gone).
fn refuse(db: &LogDb, ops: Vec<WriteOp>, e: &str) {
    if ops.iter().any(|op| matches!(op, WriteOp::Append { .. })) {
        db.mark_failed(e);
    }
    for op in ops {
        match op {
            WriteOp::Append { callback, .. } => {
                if let Some(callback) = callback {
                    callback.log_io_completed(Err(std::io::Error::other(e.to_string())))
                }
            }
            WriteOp::Deferred => {}
            WriteOp::Remove { reply, .. } | WriteOp::Meta { reply, .. } => {
                let _ = reply.send(Err(e.to_string()));
            }
        }
    }
}

impl LogDb {
    pub(crate) fn open(dir: &Path) -> Result<Arc<LogDb>, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(LOG_FILE);
        let db = crate::persist::open_db(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        {
            let txn = db.begin_write().map_err(|e| e.to_string())?;
            txn.open_table(LOG).map_err(|e| e.to_string())?;
            txn.open_table(META).map_err(|e| e.to_string())?;
            txn.commit().map_err(|e| e.to_string())?;
        }
        let log = Arc::new(LogDb {
            db: RwLock::new(Some(db)),
            path,
            pending: Mutex::new(BTreeMap::new()),
            writer: Mutex::new(None),
            state: Mutex::new(None),
            queued: AtomicUsize::new(0),
            committed: Mutex::new(Committed::default()),
            early_ack: OnceLock::new(),
            vote: Mutex::new(None),
            durable: tokio::sync::watch::Sender::new(Durability::default()),
            failure: Arc::new(tokio::sync::Notify::new()),
            flush_delay_ms: AtomicU64::new(0),
            fail_writes: std::sync::atomic::AtomicBool::new(false),
            metrics: RaftMetrics::default(),
        });
        let wal = log.recover(dir)?;
        // Everything in the file and the replayed log is durable.
        let last = log.last_log_id()?;
        log.durable.send_modify(|d| d.last = last);
        *lock(&log.vote) = log.get_meta::<Vote<u64>>("vote")?;
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            db: log.clone(),
            wal_seq: log.get_meta::<u64>("wal_seq")?.unwrap_or(0),
            wal,
            last_checkpoint: Instant::now(),
            deferred: Deferred::default(),
            failed: None,
        };
        *lock(&log.state) = Some(writer);
        let thread_log = log.clone();
        let handle = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || writer_loop(thread_log, rx))
            .map_err(|e| format!("starting the raft log writer: {e}"))?;
        *lock(&log.writer) = Some((tx, handle));
        Ok(log)
    }

    /// Insert the write-ahead log's records that `raft-log.redb` does not hold (a crash
    /// came before their checkpoint), durably; the log then starts over.
    fn recover(&self, dir: &Path) -> Result<Wal, String> {
        let held = self.get_meta::<u64>("wal_seq")?.unwrap_or(0);
        let (mut wal, records) = Wal::open_decoded::<LogBatch>(dir, LOG_WAL_FILE, held, &self.path)
            .map_err(|e| e.to_string())?;
        let wal_path = dir.join(LOG_WAL_FILE);
        let last = records.last().map_or(held, |(seq, _)| *seq);
        let batches: Vec<LogBatch> = records.into_iter().map(|(_, b)| b).collect();
        if last > held {
            let entries: usize = batches.iter().map(|b| b.rows.len()).sum();
            self.with(|d| {
                let txn = d.begin_write().map_err(|e| e.to_string())?;
                {
                    let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                    for batch in &batches {
                        if let Some(c) = &batch.committed {
                            put_sealed(&txn, "committed", &sealed(c)?)?;
                        }
                        for (index, bytes) in &batch.rows {
                            table
                                .insert(*index, bytes.as_slice())
                                .map_err(|e| e.to_string())?;
                        }
                    }
                }
                put_sealed(&txn, "wal_seq", &sealed(&last)?)?;
                txn.commit().map_err(|e| e.to_string())
            })?;
            tracing::info!(
                records = last - held,
                entries,
                file = %wal_path.display(),
                "inserted the raft log's write-ahead records after the last checkpoint"
            );
        }
        wal.restart();
        wal.shrink().map_err(|e| e.to_string())?;
        Ok(wal)
    }

    /// Flush what is queued, stop the writer (which checkpoints) and close the file;
    /// later calls fail.
    pub(crate) fn close(&self) {
        let writer = lock(&self.writer).take();
        if let Some((tx, handle)) = writer {
            drop(tx);
            if handle.join().is_err() {
                tracing::error!("raft log writer panicked");
            }
        }
        // (The writer thread took it when it ended; not if it panicked.)
        drop(lock(&self.state).take());
        let mut g = self.db.write().unwrap_or_else(|p| p.into_inner());
        g.take();
    }

    /// The committed log ID saved since the last write of it, if any and if due (always
    /// with `force`): now to be written.
    fn take_unwritten_committed(&self, force: bool) -> Option<Option<LogId<u64>>> {
        let mut c = lock(&self.committed);
        let recent = c.written_at.is_some_and(|t| t.elapsed() < COMMITTED_EVERY);
        if !c.unwritten || (recent && !force) {
            return None;
        }
        c.unwritten = false;
        c.written_at = Some(Instant::now());
        c.latest
    }

    fn send(&self, op: WriteOp) -> Result<(), String> {
        match lock(&self.writer).as_ref() {
            Some((tx, _)) => {
                self.queued.fetch_add(1, Ordering::AcqRel);
                tx.send(op).map_err(|_| {
                    self.queued.fetch_sub(1, Ordering::AcqRel);
                    "raft log writer stopped".to_string()
                })
            }
            None => Err(format!("{} is closed", self.path.display())),
        }
    }

    /// Log `rows` on the calling thread if the writer is idle (nothing queued, its state
    /// free), then defer their insertion; otherwise hand them back.
    fn append_inline(&self, rows: Rows, callback: LogFlushed<TypeConfig>) -> Result<(), Append> {
        let callback = Some(callback);
        if self.queued.load(Ordering::Acquire) != 0 {
            return Err((rows, callback));
        }
        let Ok(mut state) = self.state.try_lock() else {
            return Err((rows, callback));
        };
        let Some(w) = state.as_mut() else {
            return Err((rows, callback));
        };
        self.metrics.log_inline_appends.inc();
        let mut wake = false;
        if let Some(logged) = w.log(vec![(rows, callback)]) {
            // The writer thread inserts them: woken to arm the deadline of a new batch, or
            // when something is due now; not on every append.
            let first = w.deferred.is_empty();
            w.defer(logged);
            wake = (first && !w.deferred.is_empty()) || w.maintenance_due();
        }
        drop(state);
        if wake {
            // Answered already; should the writer be gone, the entries stay in the overlay
            // and the log, and the next start inserts them.
            if let Err(e) = self.send(WriteOp::Deferred) {
                tracing::warn!(error = %e, "waking the raft log writer for deferred insertions");
            }
        }
        Ok(())
    }

    /// `rows` are in the file now: drop them from the overlay, keeping any entry that
    /// replaced one of them meanwhile (truncate + re-append).
    fn drop_inserted(&self, rows: &[Rows]) {
        let mut pending = lock(&self.pending);
        for (id, _) in rows.iter().flatten() {
            if pending.get(&id.index).is_some_and(|e| e.log_id == *id) {
                pending.remove(&id.index);
            }
        }
    }

    /// Nothing more can be written: whatever waits for the durable log gives up, and the
    /// member stops (`RaftStore`).
    fn mark_failed(&self, e: &str) {
        self.durable.send_modify(|d| {
            d.failed.get_or_insert_with(|| e.to_string());
        });
        self.failure.notify_one();
    }

    /// Report this member's own appends as leader flushed to openraft before they are
    /// (see the module docs). Only for a running member: what gates its answers, its
    /// applies and its followers' commit index on [`LogDb::durable`] must be in place.
    pub(crate) fn enable_early_ack(&self, node_id: u64) {
        let _ = self.early_ack.set(node_id);
        let mut vote = lock(&self.vote);
        *vote = vote.map(|v| self.restart_vote(v));
    }

    /// The vote this member starts with. openraft 0.9 restarts a member whose saved vote
    /// is its own committed one as the leader of that term, without an election, and
    /// numbers new entries from the end of its log. With early-answered appends, entries
    /// it had sent but not yet written may be gone from its log while a follower holds
    /// them: the new entries would reuse their log IDs (same term, leader and index) and
    /// the follower would take its old ones as matching. So such a member starts with the
    /// same vote uncommitted and becomes leader only through an election in a later term
    /// (like a candidate that restarted; any log ID another leader of the same term hands
    /// out carries that leader's node ID, so it never equals one of this member's).
    fn restart_vote(&self, v: Vote<u64>) -> Vote<u64> {
        match self.early_ack.get() {
            Some(me) if v.is_committed() && v.leader_id().voted_for() == Some(*me) => {
                Vote::new(v.leader_id().term, *me)
            }
            _ => v,
        }
    }

    /// Whether `rows` are this member's own entries as the leader of the vote it saved
    /// last: appended by its leader role, never received from another member (a later
    /// leader replicating this member's old entries back has a later vote).
    fn is_own_leader_append(&self, rows: &Rows) -> bool {
        let Some(me) = self.early_ack.get() else {
            return false;
        };
        let vote = lock(&self.vote);
        let Some(v) = vote.as_ref() else {
            return false;
        };
        v.is_committed()
            && v.leader_id().voted_for() == Some(*me)
            && !rows.is_empty()
            && rows.iter().all(|(id, _)| id.leader_id == *v.leader_id())
    }

    /// Send `op` (made with the reply channel) and wait for the writer's answer.
    async fn request(&self, op: impl FnOnce(Reply) -> WriteOp) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(op(tx))?;
        rx.await
            .map_err(|_| "raft log writer stopped".to_string())?
    }

    fn with<T>(&self, f: impl FnOnce(&Database) -> Result<T, String>) -> Result<T, String> {
        let g = self.db.read().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(db) => f(db),
            None => Err(format!("{} is closed", self.path.display())),
        }
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        let file = self.path.display().to_string();
        self.with(|db| {
            let txn = db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(META).map_err(|e| e.to_string())?;
            match table.get(key).map_err(|e| e.to_string())? {
                Some(v) => {
                    let payload =
                        unseal(v.value()).map_err(|e| format!("{file}: meta {key}: {e}"))?;
                    postcard::from_bytes(payload)
                        .map(Some)
                        .map_err(|e| format!("{file}: meta {key}: {e}"))
                }
                None => Ok(None),
            }
        })
    }

    fn entries(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry<TypeConfig>>, String> {
        // Copy the unflushed overlay *before* reading the file: the writer commits before
        // it drops entries from the overlay, so the union never misses one.
        let overlay: Vec<(u64, Entry<TypeConfig>)> = lock(&self.pending)
            .range(range)
            .map(|(i, e)| (*i, e.clone()))
            .collect();
        // A bounded range the overlay holds in full (what replication and the state
        // machine read of recent entries) needs no read of the file.
        let wanted = match range {
            (Bound::Included(a), Bound::Excluded(b)) => b.checked_sub(a),
            (Bound::Included(a), Bound::Included(b)) => b.checked_sub(a).map(|n| n + 1),
            _ => None,
        };
        if wanted.is_some_and(|n| n > 0 && n == overlay.len() as u64) {
            return Ok(overlay.into_iter().map(|(_, e)| e).collect());
        }
        let mut out = self.file_entries(range)?;
        if overlay.is_empty() {
            return Ok(out);
        }
        let mut merged: BTreeMap<u64, Entry<TypeConfig>> =
            out.drain(..).map(|e| (e.log_id.index, e)).collect();
        merged.extend(overlay);
        Ok(merged.into_values().collect())
    }

    fn file_entries(
        &self,
        range: (Bound<u64>, Bound<u64>),
    ) -> Result<Vec<Entry<TypeConfig>>, String> {
        let file = self.path.display().to_string();
        self.with(|db| {
            let txn = db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(LOG).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            for row in table.range(range).map_err(|e| e.to_string())? {
                let (k, v) = row.map_err(|e| e.to_string())?;
                let index = k.value();
                let payload =
                    unseal(v.value()).map_err(|e| format!("{file}: log entry {index}: {e}"))?;
                let entry: Entry<TypeConfig> = postcard::from_bytes(payload)
                    .map_err(|e| format!("{file}: log entry {index}: {e}"))?;
                out.push(entry);
            }
            Ok(out)
        })
    }

    fn last_log_id(&self) -> Result<Option<LogId<u64>>, String> {
        if let Some((_, e)) = lock(&self.pending).last_key_value() {
            return Ok(Some(e.log_id));
        }
        let file = self.path.display().to_string();
        self.with(|db| {
            let txn = db.begin_read().map_err(|e| e.to_string())?;
            let table = txn.open_table(LOG).map_err(|e| e.to_string())?;
            let last = table.last().map_err(|e| e.to_string())?;
            let out = match last {
                Some((k, v)) => {
                    let index = k.value();
                    let payload =
                        unseal(v.value()).map_err(|e| format!("{file}: log entry {index}: {e}"))?;
                    let entry: Entry<TypeConfig> = postcard::from_bytes(payload)
                        .map_err(|e| format!("{file}: log entry {index}: {e}"))?;
                    Some(entry.log_id)
                }
                None => None,
            };
            Ok(out)
        })
    }
}

/// openraft's log storage (and log reader) over [`LogDb`].
#[derive(Clone)]
pub struct LogStore {
    pub(crate) db: Arc<LogDb>,
}

impl LogStore {
    /// Flush queued appends, stop the writer thread and close `raft-log.redb` (what
    /// `RaftStore::shutdown` does; for storage used without a `RaftStore`).
    pub fn close(&self) {
        self.db.close();
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        self.db.entries(bounds).map_err(read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let last_purged: Option<LogId<u64>> = self.db.get_meta("last_purged").map_err(read_err)?;
        let last = self.db.last_log_id().map_err(read_err)?;
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), SErr> {
        let sealed = sealed(vote).map_err(vote_err)?;
        self.db
            .request(|reply| WriteOp::Meta {
                key: "vote",
                sealed,
                reply,
            })
            .await
            .map_err(vote_err)?;
        *lock(&self.db.vote) = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, SErr> {
        let vote: Option<Vote<u64>> = self.db.get_meta("vote").map_err(|e| StorageError::IO {
            source: StorageIOError::read_vote(AnyError::error(e)),
        })?;
        Ok(vote.map(|v| self.db.restart_vote(v)))
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), SErr> {
        // The committed index is an optimisation (entries up to it are re-applied on
        // start-up, which the state machine does idempotently): losing it is safe, so it
        // costs neither an fsync nor a transaction of its own. It is written with an append
        // the writer commits, at most every `COMMITTED_EVERY`, and at close.
        let mut c = lock(&self.db.committed);
        c.latest = Some(committed);
        c.unwritten = true;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, SErr> {
        if let Some(c) = lock(&self.db.committed).latest {
            return Ok(c);
        }
        Ok(self
            .db
            .get_meta::<Option<LogId<u64>>>("committed")
            .map_err(read_err)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        if let Some(e) = self.db.durable.borrow().failed.clone() {
            return Err(write_err(e));
        }
        let mut rows = Vec::new();
        let mut overlay = Vec::new();
        let mut membership = false;
        for e in entries {
            let payload = postcard::to_allocvec(&e).map_err(write_err)?;
            rows.push((e.log_id, seal(&payload)));
            membership |= matches!(e.payload, EntryPayload::Membership(_));
            overlay.push(e);
        }
        lock(&self.db.pending).extend(overlay.into_iter().map(|e| (e.log_id.index, e)));
        // Membership changes are never answered early: openraft counts one as committed
        // (and may start the next) at commit, not at apply.
        if !membership && self.db.is_own_leader_append(&rows) {
            // The leader's own entries: queued for the writer thread and reported flushed
            // at once, so openraft replicates them while they are written here. What must
            // wait for them waits on `durable` (module docs).
            self.db.metrics.log_early_appends.inc();
            return match self.db.send(WriteOp::Append {
                rows,
                callback: None,
            }) {
                Ok(()) => {
                    callback.log_io_completed(Ok(()));
                    Ok(())
                }
                Err(e) => Err(write_err(e)),
            };
        }
        // Whoever logs them fsyncs, then fires the callback: openraft learns of durability
        // only after the fact.
        match self.db.append_inline(rows, callback) {
            Ok(()) => Ok(()),
            Err((rows, callback)) => self
                .db
                .send(WriteOp::Append { rows, callback })
                .map_err(write_err),
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        tracing::debug!(%log_id, "truncating raft log");
        lock(&self.db.pending).retain(|i, _| *i < log_id.index);
        // The entry the log will end with (or the purged one before it).
        let before = match log_id.index.checked_sub(1) {
            None => None,
            Some(i) => match self
                .db
                .entries((Bound::Included(i), Bound::Included(i)))
                .map_err(read_err)?
                .first()
            {
                Some(e) => Some(e.log_id),
                None => self.db.get_meta("last_purged").map_err(read_err)?,
            },
        };
        // After every earlier append (the writer keeps the order), durably.
        self.db
            .request(|reply| WriteOp::Remove {
                range: (Bound::Included(log_id.index), Bound::Unbounded),
                purged: None,
                truncated: Some((log_id.index, before)),
                reply,
            })
            .await
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        tracing::debug!(%log_id, "purging raft log");
        self.db
            .request(|reply| WriteOp::Remove {
                range: (Bound::Unbounded, Bound::Included(log_id.index)),
                purged: Some(log_id),
                truncated: None,
                reply,
            })
            .await
            .map_err(write_err)?;
        lock(&self.db.pending).retain(|i, _| *i > log_id.index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    /// Append `entries` as an early-answered leader append does (no callback).
    fn append(db: &LogDb, entries: Vec<Entry<TypeConfig>>) {
        let rows = entries
            .iter()
            .map(|e| (e.log_id, seal(&postcard::to_allocvec(e).unwrap())))
            .collect();
        lock(&db.pending).extend(entries.into_iter().map(|e| (e.log_id.index, e)));
        db.send(WriteOp::Append {
            rows,
            callback: None,
        })
        .unwrap();
    }

    #[tokio::test]
    async fn the_durable_log_follows_writes_and_moves_back_on_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let db = LogDb::open(dir.path()).unwrap();
        let mut rx = db.durable.subscribe();
        assert_eq!(rx.borrow().last, None);
        assert_eq!(rx.borrow().covers(1), Ok(false));

        // A leader's committed log ID may run ahead of its log: never saved past it.
        {
            let mut c = lock(&db.committed);
            c.latest = Some(Some(entry(1, 9).log_id));
            c.unwritten = true;
        }
        append(&db, (1..=5).map(|i| entry(1, i)).collect());
        rx.wait_for(|d| d.covers(5) == Ok(true)).await.unwrap();
        assert_eq!(rx.borrow().last, Some(entry(1, 5).log_id));
        let deadline = Instant::now() + Duration::from_secs(5);
        let saved = loop {
            if let Some(c) = db.get_meta::<Option<LogId<u64>>>("committed").unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "committed log ID never saved");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(saved, Some(entry(1, 5).log_id));
        assert!(
            lock(&db.committed).unwritten,
            "the full value is still to be saved"
        );

        // A truncation from 3: the durable log ends at entry 2 of the old log.
        let mut store = LogStore { db: db.clone() };
        store.truncate(entry(1, 3).log_id).await.unwrap();
        assert_eq!(rx.borrow().last, Some(entry(1, 2).log_id));
        assert_eq!(rx.borrow().covers(3), Ok(false));
        // New entries from a later term take their place once written.
        append(&db, vec![entry(2, 3)]);
        rx.wait_for(|d| d.covers(3) == Ok(true)).await.unwrap();
        assert_eq!(rx.borrow().last, Some(entry(2, 3).log_id));
        // A truncation above the durable end leaves it.
        store.truncate(entry(2, 9).log_id).await.unwrap();
        assert_eq!(rx.borrow().last, Some(entry(2, 3).log_id));

        // Reopened: everything in the file is durable.
        db.close();
        let db = LogDb::open(dir.path()).unwrap();
        assert_eq!(db.durable.borrow().last, Some(entry(2, 3).log_id));

        // A log write that fails: whatever waits for durability hears of it.
        *lock(&db.state) = None;
        append(&db, vec![entry(2, 4)]);
        let mut rx = db.durable.subscribe();
        let failed = rx.wait_for(|d| d.failed.is_some()).await.unwrap().covers(4);
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(db.durable.borrow().covers(3), Ok(true));
        db.close();
    }
    fn indexes(entries: &[Entry<TypeConfig>]) -> Vec<(u64, u64)> {
        entries
            .iter()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect()
    }

    /// Log `entries` and defer their insertion, as an inline append does, and wait for
    /// nothing: they are in the write-ahead log and the overlay only.
    fn log_deferred(db: &LogDb, entries: Vec<Entry<TypeConfig>>) {
        let r = rows(&entries);
        lock(&db.pending).extend(entries.into_iter().map(|e| (e.log_id.index, e)));
        let mut state = lock(&db.state);
        let w = state.as_mut().unwrap();
        let logged = w.log(vec![(r, None)]).unwrap();
        w.defer(logged);
    }

    const ALL: (Bound<u64>, Bound<u64>) = (Bound::Unbounded, Bound::Unbounded);

    #[tokio::test]
    async fn deferred_insertions_reach_the_file_by_their_deadline_and_before_every_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let db = LogDb::open(dir.path()).unwrap();
        let mut store = LogStore { db: db.clone() };

        // Logged, not yet inserted: readers find them in the overlay (with no file read
        // for a range it holds in full).
        log_deferred(&db, (1..=4).map(|i| entry(1, i)).collect());
        assert!(db.file_entries(ALL).unwrap().is_empty());
        let read = db
            .entries((Bound::Included(2), Bound::Excluded(5)))
            .unwrap();
        assert_eq!(indexes(&read), vec![(1, 2), (1, 3), (1, 4)]);

        // A truncation inserts what is deferred first, then removes from its index, in
        // one durable commit.
        store.truncate(entry(1, 3).log_id).await.unwrap();
        assert_eq!(
            indexes(&db.file_entries(ALL).unwrap()),
            vec![(1, 1), (1, 2)]
        );
        assert!(lock(&db.pending).is_empty());

        // With nothing else to do, the writer inserts a batch once its deadline passes
        // (an inline append wakes it to arm the deadline).
        log_deferred(&db, vec![entry(2, 3), entry(2, 4)]);
        db.send(WriteOp::Deferred).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !lock(&db.pending).is_empty() {
            assert!(Instant::now() < deadline, "deferred entries never inserted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            indexes(&db.file_entries(ALL).unwrap()),
            vec![(1, 1), (1, 2), (2, 3), (2, 4)]
        );

        // Deferred at close: the final checkpoint inserts it.
        log_deferred(&db, vec![entry(2, 5)]);
        db.close();
        let db = LogDb::open(dir.path()).unwrap();
        assert_eq!(indexes(&db.file_entries(ALL).unwrap()).len(), 5);

        // Deferred when the member dies (no insertion, no checkpoint): the next start
        // inserts it from the write-ahead log.
        log_deferred(&db, vec![entry(2, 6)]);
        std::mem::forget(lock(&db.state).take());
        db.close();
        let db = LogDb::open(dir.path()).unwrap();
        assert_eq!(
            indexes(&db.file_entries(ALL).unwrap()),
            vec![(1, 1), (1, 2), (2, 3), (2, 4), (2, 5), (2, 6)]
        );
        assert_eq!(db.durable.borrow().last, Some(entry(2, 6).log_id));
        db.close();
    }

    fn rows(entries: &[Entry<TypeConfig>]) -> Rows {
        entries
            .iter()
            .map(|e| (e.log_id, seal(&postcard::to_allocvec(e).unwrap())))
            .collect()
    }

    #[test]
    fn only_a_running_leaders_own_entries_are_answered_early_and_it_restarts_as_a_candidate() {
        let dir = tempfile::tempdir().unwrap();
        let db = LogDb::open(dir.path()).unwrap();
        let mine = rows(&[entry(3, 7), entry(3, 8)]);
        *lock(&db.vote) = Some(Vote::new_committed(3, 1));
        // Not a running member: never.
        assert!(!db.is_own_leader_append(&mine));
        db.enable_early_ack(1);
        // The committed vote was demoted when the member started (see below); once it
        // leads again (a new committed vote saved), its own entries are answered early.
        assert_eq!(*lock(&db.vote), Some(Vote::new(3, 1)));
        assert!(!db.is_own_leader_append(&mine));
        *lock(&db.vote) = Some(Vote::new_committed(3, 1));
        assert!(db.is_own_leader_append(&mine));
        // Entries of another term or leader (replicated back by a later leader), a mix,
        // an uncommitted vote, another member's vote: never.
        assert!(!db.is_own_leader_append(&rows(&[entry(2, 7)])));
        assert!(!db.is_own_leader_append(&rows(&[entry(3, 7), entry(2, 8)])));
        assert!(!db.is_own_leader_append(&rows(&[])));
        *lock(&db.vote) = Some(Vote::new(3, 1));
        assert!(!db.is_own_leader_append(&mine));
        *lock(&db.vote) = Some(Vote::new_committed(3, 2));
        assert!(!db.is_own_leader_append(&mine));

        // Restart: its own committed vote comes back uncommitted (an election follows);
        // any other vote as saved.
        assert_eq!(db.restart_vote(Vote::new_committed(3, 1)), Vote::new(3, 1));
        assert_eq!(
            db.restart_vote(Vote::new_committed(3, 2)),
            Vote::new_committed(3, 2)
        );
        assert_eq!(db.restart_vote(Vote::new(4, 1)), Vote::new(4, 1));
        db.close();
    }
    #[tokio::test]
    async fn a_leaders_committed_vote_reads_back_uncommitted_once_running() {
        let dir = tempfile::tempdir().unwrap();
        let db = LogDb::open(dir.path()).unwrap();
        let mut store = LogStore { db: db.clone() };
        store.save_vote(&Vote::new_committed(4, 1)).await.unwrap();
        db.close();
        // Opened by tools (no running member): as saved.
        let db = LogDb::open(dir.path()).unwrap();
        let mut store = LogStore { db: db.clone() };
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(4, 1))
        );
        // Member 1 starting: its own committed vote comes back uncommitted.
        db.enable_early_ack(1);
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
        db.close();
        // Member 2 starting with member 1's vote: as saved.
        let db = LogDb::open(dir.path()).unwrap();
        db.enable_early_ack(2);
        let mut store = LogStore { db: db.clone() };
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(4, 1))
        );
        db.close();
    }

    #[tokio::test]
    async fn a_failed_write_keeps_early_answered_entries_readable_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let db = LogDb::open(dir.path()).unwrap();
        db.fail_writes.store(true, Ordering::Relaxed);
        append(&db, vec![entry(1, 1), entry(1, 2)]);
        let mut rx = db.durable.subscribe();
        rx.wait_for(|d| d.failed.is_some()).await.unwrap();
        // openraft counts them as in the log: still there for replication to read.
        let kept = db.entries((Bound::Unbounded, Bound::Unbounded)).unwrap();
        assert_eq!(kept.len(), 2);
        // What waits for them hears of the failure (and `append` refuses from now on).
        assert!(db.durable.borrow().covers(1).is_err());
        db.close();
    }
}
