//! The Raft log on redb (`raft-log.redb`).
//!
//! Tables: `log`: index → `crc32 | postcard(Entry)`; `meta`: `vote`, `committed`,
//! `last_purged` → `crc32 | postcard(..)`.
//!
//! Durability: appends go to one writer thread that drains every queued append into one
//! redb transaction committed with `Durability::Immediate` (fsync) — group commit — and
//! only *then* fires each append's flush callback, so openraft never counts an entry as
//! durable before it is. Until flushed, appended entries are served to readers from an
//! in-memory overlay. `save_vote` returns only once the vote is on disk; `truncate` and
//! `purge` wait for every earlier append to be flushed, then commit their change.
//! `save_committed` only records the committed log ID in memory: the writer stores it with
//! an append it commits, at most every [`COMMITTED_EVERY`] (and at close), so it costs no
//! transaction of its own and seldom even a page.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{seal, unseal, TypeConfig};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub const LOG_FILE: &str = "raft-log.redb";

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

/// Work for the writer thread.
enum WriteOp {
    Append {
        rows: Vec<(LogId<u64>, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    },
    /// Answered once every earlier append is durable.
    Barrier(tokio::sync::oneshot::Sender<Result<(), String>>),
}

/// Appends committed per fsync at most.
const MAX_GROUP: usize = 1024;

/// The saved committed log ID rides along with an append at most this often: every page a
/// commit touches lengthens its fsync, and the value is only a start-up shortcut (see
/// `save_committed`).
const COMMITTED_EVERY: Duration = Duration::from_millis(100);

/// The open log database, closable so a member can be restarted in the same process.
pub(crate) struct LogDb {
    db: RwLock<Option<Database>>,
    path: PathBuf,
    /// Appended but not yet flushed entries (visible to readers).
    pending: Mutex<BTreeMap<u64, Entry<TypeConfig>>>,
    writer: Mutex<Option<(mpsc::Sender<WriteOp>, std::thread::JoinHandle<()>)>>,
    /// The committed log ID last saved, and whether it still has to be written.
    committed: Mutex<Committed>,
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

fn writer_loop(db: Arc<LogDb>, rx: mpsc::Receiver<WriteOp>) {
    while let Ok(first) = rx.recv() {
        let mut ops = vec![first];
        while ops.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        let written: Vec<LogId<u64>> = ops
            .iter()
            .flat_map(|op| match op {
                WriteOp::Append { rows, .. } => rows.iter().map(|(id, _)| *id).collect(),
                WriteOp::Barrier(_) => Vec::new(),
            })
            .collect();
        let result = if written.is_empty() {
            Ok(())
        } else {
            // The committed log ID saved meanwhile rides along (see `save_committed`).
            let committed = db.take_unwritten_committed(false);
            let result = db.with(|d| {
                let txn = d.begin_write().map_err(|e| e.to_string())?;
                {
                    if let Some(c) = &committed {
                        let payload = postcard::to_allocvec(c).map_err(|e| e.to_string())?;
                        let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
                        meta.insert("committed", seal(&payload).as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                    let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                    for op in &ops {
                        if let WriteOp::Append { rows, .. } = op {
                            for (id, bytes) in rows {
                                table
                                    .insert(id.index, bytes.as_slice())
                                    .map_err(|e| e.to_string())?;
                            }
                        }
                    }
                }
                txn.commit().map_err(|e| e.to_string())
            });
            if result.is_err() && committed.is_some() {
                lock(&db.committed).unwritten = true;
            }
            result
        };
        if result.is_ok() {
            // Durable now: readers find these in the file. Keep any entry that replaced
            // one of them in the meantime (truncate + re-append).
            let mut pending = lock(&db.pending);
            for id in &written {
                if pending.get(&id.index).is_some_and(|e| e.log_id == *id) {
                    pending.remove(&id.index);
                }
            }
        } else if let Err(e) = &result {
            tracing::error!(error = %e, file = %db.path.display(), "flushing the raft log failed");
        }
        for op in ops {
            match op {
                WriteOp::Append { callback, .. } => {
                    callback.log_io_completed(result.clone().map_err(std::io::Error::other))
                }
                WriteOp::Barrier(tx) => {
                    let _ = tx.send(result.clone());
                }
            }
        }
    }
}

impl LogDb {
    pub(crate) fn open(dir: &Path) -> Result<Arc<LogDb>, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(LOG_FILE);
        let db =
            Database::create(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
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
            committed: Mutex::new(Committed::default()),
        });
        let (tx, rx) = mpsc::channel();
        let for_writer = log.clone();
        let handle = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || writer_loop(for_writer, rx))
            .map_err(|e| format!("starting the raft log writer: {e}"))?;
        *lock(&log.writer) = Some((tx, handle));
        Ok(log)
    }

    /// Flush what is queued, stop the writer and close the file; later calls fail.
    pub(crate) fn close(&self) {
        let writer = lock(&self.writer).take();
        if let Some((tx, handle)) = writer {
            drop(tx);
            if handle.join().is_err() {
                tracing::error!("raft log writer panicked");
            }
        }
        if let Some(c) = self.take_unwritten_committed(true) {
            if let Err(e) = self.put_meta("committed", &c) {
                tracing::warn!(error = %e, file = %self.path.display(), "saving the committed log ID failed");
            }
        }
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
            Some((tx, _)) => tx
                .send(op)
                .map_err(|_| "raft log writer stopped".to_string()),
            None => Err(format!("{} is closed", self.path.display())),
        }
    }

    /// Wait until every append queued so far is durable.
    async fn barrier(&self) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(WriteOp::Barrier(tx))?;
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

    /// Write one meta record, durably (`Durability::Immediate`, redb's default: fsync).
    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<(), String> {
        let payload = postcard::to_allocvec(value).map_err(|e| e.to_string())?;
        self.with(|db| {
            let txn = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut table = txn.open_table(META).map_err(|e| e.to_string())?;
                table
                    .insert(key, seal(&payload).as_slice())
                    .map_err(|e| e.to_string())?;
            }
            txn.commit().map_err(|e| e.to_string())
        })
    }

    fn entries(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry<TypeConfig>>, String> {
        // Copy the unflushed overlay *before* reading the file: the writer commits before
        // it drops entries from the overlay, so the union never misses one.
        let overlay: Vec<(u64, Entry<TypeConfig>)> = lock(&self.pending)
            .range(range)
            .map(|(i, e)| (*i, e.clone()))
            .collect();
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

    /// Remove entries in `range`, and (for a purge) record `last_purged`, in one commit.
    fn remove(
        &self,
        range: (Bound<u64>, Bound<u64>),
        purged: Option<&LogId<u64>>,
    ) -> Result<(), String> {
        let purged = match purged {
            Some(p) => Some(postcard::to_allocvec(p).map_err(|e| e.to_string())?),
            None => None,
        };
        self.with(|db| {
            let txn = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut table = txn.open_table(LOG).map_err(|e| e.to_string())?;
                table
                    .retain_in(range, |_, _| false)
                    .map_err(|e| e.to_string())?;
                if let Some(p) = &purged {
                    let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
                    meta.insert("last_purged", seal(p).as_slice())
                        .map_err(|e| e.to_string())?;
                }
            }
            txn.commit().map_err(|e| e.to_string())
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

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("storage task failed: {e}"))?
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
        let db = self.db.clone();
        let vote = *vote;
        blocking(move || db.put_meta("vote", &vote))
            .await
            .map_err(vote_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, SErr> {
        self.db.get_meta("vote").map_err(|e| StorageError::IO {
            source: StorageIOError::read_vote(AnyError::error(e)),
        })
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
        let mut rows = Vec::new();
        let mut overlay = Vec::new();
        for e in entries {
            let payload = postcard::to_allocvec(&e).map_err(write_err)?;
            rows.push((e.log_id, seal(&payload)));
            overlay.push(e);
        }
        lock(&self.db.pending).extend(overlay.into_iter().map(|e| (e.log_id.index, e)));
        // The writer fsyncs, then fires the callback: openraft learns of durability only
        // after the fact.
        self.db
            .send(WriteOp::Append { rows, callback })
            .map_err(write_err)
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        tracing::debug!(%log_id, "truncating raft log");
        lock(&self.db.pending).retain(|i, _| *i < log_id.index);
        self.db.barrier().await.map_err(write_err)?;
        let db = self.db.clone();
        blocking(move || db.remove((Bound::Included(log_id.index), Bound::Unbounded), None))
            .await
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        tracing::debug!(%log_id, "purging raft log");
        self.db.barrier().await.map_err(write_err)?;
        lock(&self.db.pending).retain(|i, _| *i > log_id.index);
        let db = self.db.clone();
        blocking(move || {
            db.remove(
                (Bound::Unbounded, Bound::Included(log_id.index)),
                Some(&log_id),
            )
        })
        .await
        .map_err(write_err)
    }
}
