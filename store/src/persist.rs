//! Durable state of the embedded store in one redb file (`state.redb`).
//!
//! Tables:
//! * `history`: revision → the changes of that revision (every revision newer than the
//!   compact revision);
//! * `base`: key → its value as of `base_revision` (compaction folds the history below
//!   the compact revision into it, keeping the compact revision itself watchable);
//! * `leases`: lease ID → TTL;
//! * `meta`: `revision`, `compact_revision`, `base_revision`, `format`;
//! * `alarms`: `active` → the active alarms ([`crate::quota`]), written in the same
//!   transaction as the command that changed them.
//!
//! Every record carries a CRC-32 of its payload, checked at start-up: a corrupted record
//! stops the member with a message naming the file, never a silently wrong answer. Each
//! redb write transaction holds whole batches of applied commands (one, or several the
//! single-member store merged), so data and the applied revision are always committed
//! together, and every batch is durable before any caller is answered: either through
//! the write-ahead log ([`crate::wal`], the single-member store: `meta.wal_seq` says which
//! log record the file holds last) with redb committing durably only at checkpoints, or
//! by committing with `Durability::Immediate` (fsync). (A Raft member, whose fsynced Raft
//! log is the durable record, commits batches without fsync: see
//! [`Persist::commit_with_raft_meta`].)

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{StoreError, StoreResult};
use crate::mvcc::{Applied, Mvcc};
use crate::types::{Alarm, Event, EventType, KeyValue};
use crate::wal::{Wal, CHECKPOINT_BYTES, CHECKPOINT_EVERY, WAL_FILE};

const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
const BASE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("base");
const LEASES: TableDefinition<i64, i64> = TableDefinition::new("leases");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
/// Raft bookkeeping of a replicated member (`applied`: last applied log ID and membership,
/// an opaque sealed record owned by `crate::raft`). Absent in files written by a single
/// embedded member; adding it keeps format 1 readable by both.
const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// The active alarms (`active`: a sealed list). Absent in older files: none.
const ALARMS: TableDefinition<&str, &[u8]> = TableDefinition::new("alarms");

const FORMAT: i64 = 1;
pub const STATE_FILE: &str = "state.redb";

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

/// One change as stored: deletes keep only the key and revision.
#[derive(Serialize, Deserialize)]
struct StoredChange {
    kind: EventType,
    kv: KeyValue,
}

/// redb's page cache for the store's files. Nothing reads the state file while the store
/// runs (reads are served from memory), so its cache only needs the pages a commit
/// touches: redb's default (1 GiB) kept every page written, growing the server by the
/// size of the history it wrote. The Raft log reads back only recent entries.
pub(crate) const REDB_CACHE_BYTES: usize = 64 << 20;

/// Open (or create) a redb file with [`REDB_CACHE_BYTES`] of cache.
pub(crate) fn open_db(path: &Path) -> Result<Database, redb::DatabaseError> {
    redb::Builder::new()
        .set_cache_size(REDB_CACHE_BYTES)
        .create(path)
}

fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 4);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn unseal<'a>(record: &'a [u8], what: &dyn Fn() -> String) -> StoreResult<&'a [u8]> {
    if record.len() < 4 {
        return Err(StoreError::Corrupt(format!(
            "{}: record is truncated",
            what()
        )));
    }
    let (crc, payload) = record.split_at(4);
    let expected = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(payload) != expected {
        return Err(StoreError::Corrupt(format!(
            "{}: checksum mismatch",
            what()
        )));
    }
    Ok(payload)
}

pub struct Persist {
    db: Database,
    path: PathBuf,
    /// The write-ahead log, when batches are made durable through it.
    wal: Option<WalLog>,
    /// The file's size when last looked at, and when (see [`Persist::size_bytes`]).
    size: std::cell::Cell<(Option<std::time::Instant>, i64)>,
}

/// How stale the reported state file size may be: it was looked up with a `statx` after
/// every commit, one system call per write on the sequential path, for a gauge.
const SIZE_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// The write-ahead log of the single-member store, taken out of its [`Persist`].
pub struct WalLog {
    wal: Wal,
    last_checkpoint: std::time::Instant,
}

impl WalLog {
    /// Make a batch durable: one record and one `fdatasync`. Returns its sequence number,
    /// which [`Persist::materialize`] records in the state file with the batch.
    pub fn append(
        &mut self,
        batch: &[Applied],
        revision: i64,
        compact_revision: i64,
    ) -> StoreResult<u64> {
        let batch = WalBatch::of(batch, revision, compact_revision);
        self.wal
            .append_with(|buf| crate::wal::encode_into(&batch, buf))
    }

    /// Whether the state file should be committed durably now, so that the log can start
    /// over: every [`CHECKPOINT_BYTES`] of log or [`CHECKPOINT_EVERY`].
    pub fn checkpoint_due(&self) -> bool {
        self.wal.written() >= CHECKPOINT_BYTES || self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
    }

    /// The state file durably holds every record appended so far: write the log again
    /// from its start.
    pub fn checkpointed(&mut self) {
        self.wal.restart();
        self.last_checkpoint = std::time::Instant::now();
    }
}

/// One batch as logged: what [`WalLog::append`] was given.
#[derive(Serialize, Deserialize)]
struct WalBatch {
    revision: i64,
    compact_revision: i64,
    applied: Vec<WalApplied>,
    /// The active alarms after the batch, when it changed them. (Last, so that a record
    /// written before alarms existed is told apart: see [`WalBatch::decode`].)
    alarms: Option<Vec<Alarm>>,
}

/// A [`WalBatch`] as logged before alarms existed.
#[derive(Deserialize)]
struct WalBatchV1 {
    revision: i64,
    compact_revision: i64,
    applied: Vec<WalApplied>,
}

#[derive(Serialize, Deserialize)]
struct WalApplied {
    revision: Option<(i64, Vec<StoredChange>)>,
    compacted: Option<i64>,
    leases: Vec<(i64, Option<i64>)>,
}

impl WalBatch {
    /// A logged record. One written before alarms existed ends where the alarms would
    /// begin, so it fails to decode as a [`WalBatch`] (postcard reads past its end) and is
    /// read as a [`WalBatchV1`].
    fn decode(payload: &[u8]) -> Result<WalBatch, postcard::Error> {
        postcard::from_bytes::<WalBatch>(payload).or_else(|e| {
            postcard::from_bytes::<WalBatchV1>(payload)
                .map(|v1| WalBatch {
                    revision: v1.revision,
                    compact_revision: v1.compact_revision,
                    applied: v1.applied,
                    alarms: None,
                })
                .map_err(|_| e)
        })
    }

    fn of(batch: &[Applied], revision: i64, compact_revision: i64) -> WalBatch {
        WalBatch {
            revision,
            compact_revision,
            alarms: batch.iter().rev().find_map(|a| a.alarms.clone()),
            applied: batch
                .iter()
                .map(|a| WalApplied {
                    revision: a.revision.as_ref().map(|(rev, events)| {
                        (
                            *rev,
                            events
                                .iter()
                                .map(|e| StoredChange {
                                    kind: e.kind,
                                    kv: e.kv.clone(),
                                })
                                .collect(),
                        )
                    }),
                    compacted: a.compacted,
                    leases: a.leases.clone(),
                })
                .collect(),
        }
    }

    fn into_applied(self) -> Vec<Applied> {
        let mut applied: Vec<Applied> = self
            .applied
            .into_iter()
            .map(|a| Applied {
                revision: a.revision.map(|(rev, changes)| {
                    let events: Vec<Event> = changes
                        .into_iter()
                        .map(|c| Event {
                            kind: c.kind,
                            kv: c.kv,
                            prev_kv: None,
                        })
                        .collect();
                    (rev, events.into())
                }),
                compacted: a.compacted,
                leases: a.leases,
                alarms: None,
            })
            .collect();
        if let Some(alarms) = self.alarms {
            applied.push(Applied {
                alarms: Some(alarms),
                ..Default::default()
            });
        }
        applied
    }
}

impl Persist {
    /// Open (or create) `dir/state.redb` and rebuild the engine from it.
    pub fn open(dir: &Path) -> StoreResult<(Persist, Mvcc)> {
        let persist = Persist::open_file(dir)?;
        // A directory the single-member store used: its log may hold writes the state
        // file has only in it. Opened without the log they would be lost (and applied
        // over newer data if the log were used again later).
        if Wal::has_newer(dir, persist.wal_seq()?)? {
            return Err(StoreError::Corrupt(format!(
                "{} holds writes that {} does not have yet (a single-member store stopped \
                 without a checkpoint); start this data directory once as a single member \
                 (without --raft-addr) to fold them in",
                dir.join(WAL_FILE).display(),
                persist.path.display()
            )));
        }
        let _ = std::fs::remove_file(dir.join(WAL_FILE));
        let mvcc = persist.load()?;
        Ok((persist, mvcc))
    }

    /// Like [`Persist::open`], with the write-ahead log `dir/wal.log`: the records the
    /// state file does not hold yet (a crash came before their checkpoint) are applied
    /// to it first.
    pub fn open_with_wal(dir: &Path) -> StoreResult<(Persist, Mvcc)> {
        let mut persist = Persist::open_file(dir)?;
        let held = persist.wal_seq()?;
        let (mut wal, batches) =
            Wal::open_decoded_with(dir, WAL_FILE, held, &persist.path, WalBatch::decode)?;
        let wal_path = dir.join(WAL_FILE);
        let mut last = held;
        for (seq, batch) in batches {
            let (revision, compact) = (batch.revision, batch.compact_revision);
            persist.commit_inner(
                &batch.into_applied(),
                revision,
                compact,
                None,
                false,
                Some(seq),
            )?;
            last = seq;
        }
        if last > held {
            tracing::info!(
                records = last - held,
                file = %wal_path.display(),
                "applied the write-ahead log's records after the last checkpoint"
            );
            persist.sync()?;
        }
        wal.restart();
        wal.shrink()?;
        persist.wal = Some(WalLog {
            wal,
            last_checkpoint: std::time::Instant::now(),
        });
        let mvcc = persist.load()?;
        Ok((persist, mvcc))
    }

    /// Open (or create) `dir/state.redb` with its tables, without a log, not loaded.
    fn open_file(dir: &Path) -> StoreResult<Persist> {
        std::fs::create_dir_all(dir).map_err(|e| io(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join(STATE_FILE);
        let db = open_db(&path).map_err(|e| {
            StoreError::Corrupt(format!(
                "cannot open {}: {e}; restore from a backup",
                path.display()
            ))
        })?;
        let persist = Persist {
            db,
            path,
            wal: None,
            size: std::cell::Cell::new((None, 0)),
        };
        persist.init_tables()?;
        Ok(persist)
    }

    /// The last write-ahead log record the state file holds (0: none).
    fn wal_seq(&self) -> StoreResult<u64> {
        let txn = self.db.begin_read().map_err(io)?;
        let meta = txn.open_table(META).map_err(io)?;
        Ok(meta
            .get("wal_seq")
            .map_err(io)?
            .map_or(0, |v| v.value())
            .max(0) as u64)
    }

    fn init_tables(&self) -> StoreResult<()> {
        let txn = self.db.begin_write().map_err(io)?;
        {
            txn.open_table(HISTORY).map_err(io)?;
            txn.open_table(BASE).map_err(io)?;
            txn.open_table(LEASES).map_err(io)?;
            txn.open_table(RAFT_META).map_err(io)?;
            txn.open_table(ALARMS).map_err(io)?;
            let mut meta = txn.open_table(META).map_err(io)?;
            let format = meta.get("format").map_err(io)?.map(|v| v.value());
            match format {
                None => {
                    meta.insert("format", FORMAT).map_err(io)?;
                }
                Some(FORMAT) => {}
                Some(other) => {
                    return Err(StoreError::Corrupt(format!(
                        "{}: unknown format version {other} (this build reads {FORMAT})",
                        self.path.display()
                    )))
                }
            }
        }
        txn.commit().map_err(io)
    }

    fn load(&self) -> StoreResult<Mvcc> {
        let file = self.path.display().to_string();
        let txn = self.db.begin_read().map_err(io)?;
        let meta = txn.open_table(META).map_err(io)?;
        let get_meta =
            |k: &str| -> StoreResult<i64> { Ok(meta.get(k).map_err(io)?.map_or(0, |v| v.value())) };
        let revision = get_meta("revision")?;
        let compact = get_meta("compact_revision")?;
        let base_revision = get_meta("base_revision")?;
        let mut mvcc = Mvcc::new();
        mvcc.restore_meta(base_revision, compact);

        let base = txn.open_table(BASE).map_err(io)?;
        for row in base.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let key = k.value().to_vec();
            let payload = unseal(v.value(), &|| {
                format!(
                    "{file}: base record for key {:?}",
                    String::from_utf8_lossy(&key)
                )
            })?;
            let kv: KeyValue = postcard::from_bytes(payload).map_err(|e| {
                StoreError::Corrupt(format!("{file}: base record undecodable: {e}"))
            })?;
            mvcc.load_base(kv);
        }
        let leases = txn.open_table(LEASES).map_err(io)?;
        for row in leases.iter().map_err(io)? {
            let (id, ttl) = row.map_err(io)?;
            mvcc.load_lease(id.value(), ttl.value());
        }
        let history = txn.open_table(HISTORY).map_err(io)?;
        for (expected, row) in (base_revision + 1..).zip(history.iter().map_err(io)?) {
            let (rev, v) = row.map_err(io)?;
            let rev = rev.value() as i64;
            if rev != expected {
                return Err(StoreError::Corrupt(format!(
                    "{file}: history jumps from revision {} to {rev}",
                    expected - 1
                )));
            }
            let payload = unseal(v.value(), &|| {
                format!("{file}: history record at revision {rev}")
            })?;
            let changes: Vec<StoredChange> = postcard::from_bytes(payload).map_err(|e| {
                StoreError::Corrupt(format!("{file}: history record {rev} undecodable: {e}"))
            })?;
            mvcc.replay_revision(rev, changes.into_iter().map(|c| (c.kind, c.kv)).collect())?;
        }
        if mvcc.revision() != revision {
            return Err(StoreError::Corrupt(format!(
                "{file}: meta says revision {revision} but history ends at {}",
                mvcc.revision()
            )));
        }
        match txn.open_table(ALARMS) {
            Ok(alarms) => {
                if let Some(v) = alarms.get("active").map_err(io)? {
                    let payload = unseal(v.value(), &|| format!("{file}: alarms record"))?;
                    let list: Vec<Alarm> = postcard::from_bytes(payload).map_err(|e| {
                        StoreError::Corrupt(format!("{file}: alarms record undecodable: {e}"))
                    })?;
                    mvcc.load_alarms(list);
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(io(e)),
        }
        mvcc.finish_load();
        Ok(mvcc)
    }

    /// Take the write-ahead log out of a `Persist` opened with [`Persist::open_with_wal`],
    /// so that one thread can make batches durable in it while another writes them into
    /// the state file ([`Persist::materialize`]).
    pub fn take_wal(&mut self) -> Option<WalLog> {
        self.wal.take()
    }

    /// Write batches that [`WalLog::append`] made durable into the state file, in one
    /// redb transaction: `batch` is their applied commands in order, `revision`,
    /// `compact_revision` and `seq` those of the last one. Without fsync unless
    /// `checkpoint` (a crash before the next checkpoint is repaired from the log); after a
    /// checkpoint the log may be written again from its start ([`WalLog::checkpointed`]).
    pub fn materialize(
        &mut self,
        batch: &[Applied],
        revision: i64,
        compact_revision: i64,
        seq: u64,
        checkpoint: bool,
    ) -> StoreResult<()> {
        self.commit_inner(
            batch,
            revision,
            compact_revision,
            None,
            checkpoint,
            Some(seq),
        )
    }

    /// Commit a batch to the state file and, in the same transaction, record the Raft bookkeeping
    /// `raft_meta` (last applied log ID and membership), so the data and the log position it
    /// reflects can never disagree after a crash.
    ///
    /// `durable == false` commits without fsync (`redb::Durability::None`): the batch is
    /// visible at once but becomes durable only with the next durable commit (or
    /// [`Persist::sync`], or closing the file); a crash before then rolls the file back to
    /// the last durable commit, data and `raft_meta` together. Only for a caller that can
    /// redo the lost batches, as a Raft member does by re-applying its log from the
    /// recorded last applied entry.
    pub fn commit_with_raft_meta(
        &self,
        batch: &[Applied],
        revision: i64,
        compact_revision: i64,
        raft_meta: &[u8],
        durable: bool,
    ) -> StoreResult<()> {
        self.commit_inner(
            batch,
            revision,
            compact_revision,
            Some(raft_meta),
            durable,
            None,
        )
    }

    /// Make every earlier commit durable (one fsynced commit).
    pub fn sync(&self) -> StoreResult<()> {
        let txn = self.db.begin_write().map_err(io)?;
        {
            // A write of its own, so that the commit is never skipped as empty.
            let mut meta = txn.open_table(META).map_err(io)?;
            meta.insert("format", FORMAT).map_err(io)?;
        }
        txn.commit().map_err(io)
    }

    /// The Raft bookkeeping last written by [`Persist::commit_with_raft_meta`] or
    /// [`Persist::install`], checksum-verified; `None` for a file never used by Raft.
    pub fn raft_meta(&self) -> StoreResult<Option<Vec<u8>>> {
        let txn = self.db.begin_read().map_err(io)?;
        let table = match txn.open_table(RAFT_META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let file = self.path.display().to_string();
        match table.get("applied").map_err(io)? {
            Some(v) => Ok(Some(
                unseal(v.value(), &|| format!("{file}: raft_meta record"))?.to_vec(),
            )),
            None => Ok(None),
        }
    }

    /// Replace the state in `dir` with `backup` plus `raft_meta` (a Raft snapshot being
    /// installed). The new file is written and fsynced beside the old one, then renamed
    /// over it, so a crash leaves either the old or the new state, never a mix. The
    /// caller must have dropped its previous [`Persist`] for `dir`.
    pub fn install(dir: &Path, backup: &Backup, raft_meta: &[u8]) -> StoreResult<(Persist, Mvcc)> {
        std::fs::create_dir_all(dir).map_err(|e| io(format!("creating {}: {e}", dir.display())))?;
        let tmp_dir = dir.join("state.installing");
        if tmp_dir.exists() {
            std::fs::remove_dir_all(&tmp_dir)
                .map_err(|e| io(format!("{}: {e}", tmp_dir.display())))?;
        }
        backup.restore_into(&tmp_dir)?;
        {
            let db = open_db(&tmp_dir.join(STATE_FILE)).map_err(io)?;
            let txn = db.begin_write().map_err(io)?;
            {
                let mut table = txn.open_table(RAFT_META).map_err(io)?;
                table
                    .insert("applied", seal(raft_meta).as_slice())
                    .map_err(io)?;
            }
            txn.commit().map_err(io)?;
        }
        let final_path = dir.join(STATE_FILE);
        std::fs::rename(tmp_dir.join(STATE_FILE), &final_path).map_err(|e| {
            io(format!(
                "renaming snapshot into {}: {e}",
                final_path.display()
            ))
        })?;
        if let Ok(d) = std::fs::File::open(dir) {
            d.sync_all().map_err(io)?;
        }
        let _ = std::fs::remove_dir_all(&tmp_dir);
        Persist::open(dir)
    }

    fn commit_inner(
        &self,
        batch: &[Applied],
        revision: i64,
        compact_revision: i64,
        raft_meta: Option<&[u8]>,
        durable: bool,
        wal_seq: Option<u64>,
    ) -> StoreResult<()> {
        let mut txn = self.db.begin_write().map_err(io)?;
        if !durable {
            txn.set_durability(redb::Durability::None).map_err(io)?;
        }
        {
            if let Some(raft_meta) = raft_meta {
                let mut table = txn.open_table(RAFT_META).map_err(io)?;
                table
                    .insert("applied", seal(raft_meta).as_slice())
                    .map_err(io)?;
            }
            let mut history = txn.open_table(HISTORY).map_err(io)?;
            let mut base = txn.open_table(BASE).map_err(io)?;
            let mut leases = txn.open_table(LEASES).map_err(io)?;
            if let Some(alarms) = batch.iter().rev().find_map(|a| a.alarms.as_ref()) {
                let payload = postcard::to_allocvec(alarms).map_err(io)?;
                txn.open_table(ALARMS)
                    .map_err(io)?
                    .insert("active", seal(&payload).as_slice())
                    .map_err(io)?;
            }
            for applied in batch {
                if let Some((rev, events)) = &applied.revision {
                    let changes: Vec<StoredChange> = events
                        .iter()
                        .map(|e| StoredChange {
                            kind: e.kind,
                            kv: e.kv.clone(),
                        })
                        .collect();
                    let payload = postcard::to_allocvec(&changes).map_err(io)?;
                    history
                        .insert(*rev as u64, seal(&payload).as_slice())
                        .map_err(io)?;
                }
                if let Some(c) = applied.compacted {
                    // Fold the history below the compact revision into the base; revision
                    // `c` itself stays in history so that it can still be watched.
                    let mut folded = Vec::new();
                    for row in history.range(..(c as u64)).map_err(io)? {
                        let (rev, v) = row.map_err(io)?;
                        let rev = rev.value();
                        let payload = unseal(v.value(), &|| format!("history record {rev}"))?;
                        let changes: Vec<StoredChange> =
                            postcard::from_bytes(payload).map_err(io)?;
                        folded.push((rev, changes));
                    }
                    for (rev, changes) in folded {
                        for ch in changes {
                            match ch.kind {
                                EventType::Put => {
                                    let payload = postcard::to_allocvec(&ch.kv).map_err(io)?;
                                    base.insert(ch.kv.key.as_ref(), seal(&payload).as_slice())
                                        .map_err(io)?;
                                }
                                EventType::Delete => {
                                    base.remove(ch.kv.key.as_ref()).map_err(io)?;
                                }
                            }
                        }
                        history.remove(rev).map_err(io)?;
                    }
                }
                for (id, ttl) in &applied.leases {
                    match ttl {
                        Some(ttl) => leases.insert(*id, *ttl).map_err(io)?,
                        None => leases.remove(*id).map_err(io)?,
                    };
                }
            }
            let mut meta = txn.open_table(META).map_err(io)?;
            meta.insert("revision", revision).map_err(io)?;
            meta.insert("compact_revision", compact_revision)
                .map_err(io)?;
            if let Some(c) = batch.iter().filter_map(|a| a.compacted).max() {
                meta.insert("base_revision", c - 1).map_err(io)?;
            }
            if let Some(seq) = wal_seq {
                meta.insert("wal_seq", seq as i64).map_err(io)?;
            }
        }
        txn.commit().map_err(io)
    }

    /// The state file's size in bytes, looked up at most once every `SIZE_REFRESH` (1 s).
    pub fn size_bytes(&self) -> i64 {
        let (checked, size) = self.size.get();
        if checked.is_some_and(|t| t.elapsed() < SIZE_REFRESH) {
            return size;
        }
        let size = std::fs::metadata(&self.path)
            .map(|m| m.len() as i64)
            .unwrap_or(0);
        self.size.set((Some(std::time::Instant::now()), size));
        size
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Backup files as written before alarms existed.
const BACKUP_MAGIC_V1: &[u8; 16] = b"LATTICE-BACKUP01";
const BACKUP_MAGIC: &[u8; 16] = b"LATTICE-BACKUP02";

/// A point-in-time copy of the store: every live key at `revision`, the leases and the
/// active alarms. (A Raft snapshot is one too: a member that installs it must hold the
/// same alarms as the others.)
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Backup {
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    pub leases: Vec<(i64, i64)>,
    /// Last, so that an older encoding is told apart (see [`Backup::decode`]).
    pub alarms: Vec<Alarm>,
}

/// A [`Backup`] as encoded before alarms existed.
#[derive(Deserialize)]
struct BackupV1 {
    revision: i64,
    kvs: Vec<KeyValue>,
    leases: Vec<(i64, i64)>,
}

impl Backup {
    pub fn from_mvcc(mvcc: &Mvcc, revision: i64) -> Backup {
        Backup {
            revision,
            kvs: mvcc.live_at(revision),
            leases: mvcc.leases().iter().map(|(id, l)| (*id, l.ttl)).collect(),
            alarms: mvcc.alarms(),
        }
    }

    /// The encoding of a Raft snapshot's payload (postcard).
    pub fn encode(&self) -> StoreResult<Vec<u8>> {
        postcard::to_allocvec(self).map_err(io)
    }

    /// Decode [`Backup::encode`]'s output, or a payload encoded before alarms existed: it
    /// ends where the alarms would begin, so it fails to decode as a `Backup` and is read
    /// as one without alarms.
    pub fn decode(payload: &[u8]) -> Result<Backup, postcard::Error> {
        postcard::from_bytes::<Backup>(payload).or_else(|e| {
            postcard::from_bytes::<BackupV1>(payload)
                .map(|v1| Backup {
                    revision: v1.revision,
                    kvs: v1.kvs,
                    leases: v1.leases,
                    alarms: Vec::new(),
                })
                .map_err(|_| e)
        })
    }

    /// Write `magic | crc32 | payload` to `path` (through a temporary file, fsynced, then
    /// renamed, so a crash never leaves a half-written backup under the final name).
    pub fn write(&self, path: &Path) -> StoreResult<()> {
        use std::io::Write;
        let payload = postcard::to_allocvec(self).map_err(io)?;
        let tmp = path.with_extension("partial");
        let mut f =
            std::fs::File::create(&tmp).map_err(|e| io(format!("{}: {e}", tmp.display())))?;
        f.write_all(BACKUP_MAGIC).map_err(io)?;
        f.write_all(&seal(&payload)).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read and verify a backup file.
    pub fn read(path: &Path) -> StoreResult<Backup> {
        let data = std::fs::read(path).map_err(|e| io(format!("{}: {e}", path.display())))?;
        let name = path.display().to_string();
        let magic = data.get(..BACKUP_MAGIC.len());
        if magic != Some(BACKUP_MAGIC) && magic != Some(BACKUP_MAGIC_V1) {
            return Err(StoreError::Corrupt(format!(
                "{name}: not a Lattice backup (bad header)"
            )));
        }
        let payload = unseal(&data[BACKUP_MAGIC.len()..], &|| name.clone())?;
        Backup::decode(payload)
            .map_err(|e| StoreError::Corrupt(format!("{name}: undecodable: {e}")))
    }

    /// Create a fresh data directory holding this backup (compact revision = revision).
    pub fn restore_into(&self, dir: &Path) -> StoreResult<()> {
        let path = dir.join(STATE_FILE);
        // A log left there would be applied over the restored state.
        if let Some(p) = [path.clone(), dir.join(WAL_FILE)]
            .iter()
            .find(|p| p.exists())
        {
            return Err(StoreError::InvalidArgument(format!(
                "{} already exists: restore needs an empty data directory",
                p.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(io)?;
        let db = open_db(&path).map_err(io)?;
        let txn = db.begin_write().map_err(io)?;
        {
            let mut base = txn.open_table(BASE).map_err(io)?;
            for kv in &self.kvs {
                let payload = postcard::to_allocvec(kv).map_err(io)?;
                base.insert(kv.key.as_ref(), seal(&payload).as_slice())
                    .map_err(io)?;
            }
            let mut leases = txn.open_table(LEASES).map_err(io)?;
            for (id, ttl) in &self.leases {
                leases.insert(*id, *ttl).map_err(io)?;
            }
            txn.open_table(HISTORY).map_err(io)?;
            let alarms = postcard::to_allocvec(&self.alarms).map_err(io)?;
            txn.open_table(ALARMS)
                .map_err(io)?
                .insert("active", seal(&alarms).as_slice())
                .map_err(io)?;
            let mut meta = txn.open_table(META).map_err(io)?;
            meta.insert("format", FORMAT).map_err(io)?;
            meta.insert("revision", self.revision).map_err(io)?;
            meta.insert("compact_revision", self.revision).map_err(io)?;
            meta.insert("base_revision", self.revision).map_err(io)?;
        }
        txn.commit().map_err(io)
    }

    pub fn key_count(&self) -> usize {
        self.kvs.len()
    }
}
