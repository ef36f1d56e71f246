//! [`EmbeddedStore`]: the MVCC engine made durable, with group commit, watches and
//! leases, behind [`KvBackend`].
//!
//! Write path: callers send [`Command`]s to one writer thread, which drains whatever is
//! queued (group commit) — or, for a lone writer, the caller commits its write itself
//! under the same lock (see [`EmbeddedStore::propose`]) — applies the batch to the engine
//! in memory, makes it durable with one write-ahead log record and `fdatasync`
//! ([`crate::wal`]), and only then *publishes*
//! the new revision: readers never see a revision above the published one, watchers are
//! fed, and callers are answered. An acknowledged write is therefore always on disk, and
//! no reader observes a write that a crash could still take back. The state file
//! (`state.redb`) is written behind, on a second thread (the materializer), as many
//! logged batches per redb transaction as are waiting, without fsync except at the log's
//! checkpoints; the writer starts the log over only once a checkpoint's durable commit
//! holds every record before it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_stream::wrappers::ReceiverStream;

use crate::backend::{KvBackend, WatchStream};
use crate::error::{StoreError, StoreResult};
use crate::metrics::StoreMetrics;
use crate::mvcc::{Applied, Command, CommandResponse, Limits, Mvcc};
use crate::persist::{Backup, Persist, WalLog};
use crate::types::*;
use crate::watch::WatchHub;

/// Tunables of the embedded store. Limits are documented in the README.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub limits: Limits,
    /// Most commands committed in one fsync.
    pub max_batch: usize,
    /// Batches buffered per watcher before it is moved to the catch-up group.
    pub watch_buffer: usize,
    /// Interval of progress notifications for watchers that asked for them.
    pub progress_interval: Duration,
    /// How often lease deadlines are checked.
    pub lease_check_interval: Duration,
    pub member_id: u64,
    pub name: String,
    /// The size quota (etcd's `--quota-backend-bytes`), see [`crate::quota`].
    pub quota_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            max_batch: 512,
            watch_buffer: 256,
            progress_interval: Duration::from_secs(5),
            lease_check_interval: Duration::from_millis(200),
            member_id: 1,
            name: "default".into(),
            quota_bytes: crate::quota::DEFAULT_QUOTA_BYTES,
        }
    }
}

enum Request {
    Apply(Command, oneshot::Sender<StoreResult<CommandResponse>>),
    Backup(PathBuf, oneshot::Sender<StoreResult<Backup>>),
    Stop(oneshot::Sender<()>),
}

struct Shared {
    mvcc: RwLock<Mvcc>,
    /// Newest revision that is durable and visible.
    published: AtomicI64,
    hub: Mutex<WatchHub>,
    catch_up: Notify,
    /// Lease deadlines: decided here, outside the deterministic engine; an expired lease
    /// is revoked by proposing `LeaseRevoke` like any other write.
    deadlines: Mutex<HashMap<i64, Instant>>,
    config: StoreConfig,
    metrics: StoreMetrics,
    db_path: PathBuf,
    db_size: AtomicI64,
    /// Set when a commit failed: the in-memory state may be ahead of disk, so the store
    /// refuses further work rather than serve data that may vanish.
    failed: Mutex<Option<StoreError>>,
    /// The write-ahead log and the materializer's inbox: whoever holds this commits (the
    /// writer thread, or a caller committing inline, see [`EmbeddedStore::propose`]).
    /// `None` once the store stopped.
    committer: Mutex<Option<Committer>>,
    /// Writes between `propose` and their answer.
    proposing: AtomicUsize,
    /// Writes in a row that started with no other write in progress.
    lone_streak: AtomicU32,
}

/// Counts a write in [`Shared::proposing`] while it lives.
struct Proposing<'a> {
    count: &'a AtomicUsize,
    /// No other write was in progress when this one started.
    alone: bool,
}

/// Writes in a row that must each have started alone before they are committed inline
/// (see [`EmbeddedStore::propose`]).
const LONE_STREAK: u32 = 3;

impl<'a> Proposing<'a> {
    /// Count a write in; it may commit inline if it and the [`LONE_STREAK`] writes before
    /// it each started with no other write in progress (one client writing in turn, not a
    /// lull between concurrent ones).
    fn enter(count: &'a AtomicUsize, streak: &AtomicU32) -> Self {
        let alone = count.fetch_add(1, Ordering::AcqRel) == 0;
        let alone = if alone {
            streak.fetch_add(1, Ordering::AcqRel) >= LONE_STREAK
        } else {
            streak.store(0, Ordering::Release);
            false
        };
        Proposing { count, alone }
    }
}

impl Drop for Proposing<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What committing a batch needs besides [`Shared`].
struct Committer {
    wal: WalLog,
    materializer: ToMaterializer,
}

/// The default [`KvBackend`]: a single durable member. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    requests: mpsc::Sender<Request>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EmbeddedStore {
    /// Open the store in `dir` (created if missing), replaying its durable state.
    pub async fn open(dir: impl AsRef<Path>, config: StoreConfig) -> StoreResult<EmbeddedStore> {
        let dir = dir.as_ref().to_path_buf();
        let (persist, mvcc) = tokio::task::spawn_blocking(move || Persist::open_with_wal(&dir))
            .await
            .map_err(|e| StoreError::Io(e.to_string()))??;
        let now = Instant::now();
        let deadlines = mvcc
            .leases()
            .iter()
            // A restarted (or newly elected) member refreshes every lease, as etcd does.
            .map(|(id, l)| (*id, now + Duration::from_secs(l.ttl.max(1) as u64)))
            .collect();
        let metrics = StoreMetrics::default();
        metrics.applied_revision.set(mvcc.revision());
        metrics
            .quota_bytes
            .set(i64::try_from(config.quota_bytes).unwrap_or(i64::MAX));
        set_quota_gauges(&metrics, &mvcc);
        let shared = Arc::new(Shared {
            published: AtomicI64::new(mvcc.revision()),
            mvcc: RwLock::new(mvcc),
            hub: Mutex::new(WatchHub::default()),
            catch_up: Notify::new(),
            deadlines: Mutex::new(deadlines),
            db_path: persist.path().to_path_buf(),
            db_size: AtomicI64::new(persist.size_bytes()),
            config,
            metrics,
            failed: Mutex::new(None),
            committer: Mutex::new(None),
            proposing: AtomicUsize::new(0),
            lone_streak: AtomicU32::new(0),
        });
        let mut persist = persist;
        let wal = persist.take_wal().ok_or_else(|| {
            StoreError::Backend("the embedded store opened without its write-ahead log".into())
        })?;
        let (tx, from_writer) = std::sync::mpsc::channel();
        let materializer_shared = shared.clone();
        let materializer = std::thread::Builder::new()
            .name("store-materializer".into())
            .spawn(move || materializer_loop(materializer_shared, persist, from_writer))
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let to_materializer = ToMaterializer {
            tx,
            thread: materializer.thread().clone(),
        };
        *lock(&shared.committer) = Some(Committer {
            wal,
            materializer: to_materializer,
        });
        let (tx, rx) = mpsc::channel(4096);
        let writer_shared = shared.clone();
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                writer_loop(&writer_shared, rx);
                // Whatever ended the writer, the state file is closed before it is gone:
                // a `close()` answered (or refused) after this may reopen the directory.
                drop(lock(&writer_shared.committer).take());
                if materializer.join().is_err() {
                    stop_store(
                        &writer_shared,
                        StoreError::Backend("the state file's writer panicked".into()),
                    );
                }
            })
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let store = EmbeddedStore {
            shared,
            requests: tx,
        };
        store.spawn_background();
        tracing::info!(
            revision = store.revision(),
            path = %store.shared.db_path.display(),
            "embedded store opened"
        );
        Ok(store)
    }

    fn spawn_background(&self) {
        // Catch-up of unsynced watchers.
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let Some(shared) = weak.upgrade() else { return };
                {
                    // The published revision is read under the hub's lock, which the writer
                    // holds while it publishes: read before it, a revision published in
                    // between would go only to synced watchers, and a watcher caught up to
                    // the older one would be marked synced with those events never sent.
                    // (Lock order: the hub, then the engine, as in `watch`.)
                    let mut hub = lock(&shared.hub);
                    if hub.unsynced() > 0 {
                        let published = shared.published.load(Ordering::Acquire);
                        let mvcc = shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
                        hub.catch_up(&mvcc, published);
                    }
                }
                let still = lock(&shared.hub).unsynced() > 0;
                if still {
                    drop(shared);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    // Holding the strong reference here delays the store's teardown by
                    // at most this timeout.
                    let _ = tokio::time::timeout(
                        Duration::from_millis(500),
                        shared.catch_up.notified(),
                    )
                    .await;
                }
            }
        });
        // Progress notifications.
        let weak = Arc::downgrade(&self.shared);
        let every = self.shared.config.progress_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                let mut hub = lock(&shared.hub);
                // Under the hub's lock: never older than a revision already sent.
                let published = shared.published.load(Ordering::Acquire);
                hub.progress(published);
                shared.metrics.watchers.set(hub.len() as i64);
            }
        });
        // Lease expiry: this member decides, the log (here: the writer) carries it out.
        let weak = Arc::downgrade(&self.shared);
        let requests = self.requests.downgrade();
        let every = self.shared.config.lease_check_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                let now = Instant::now();
                let expired: Vec<i64> = lock(&shared.deadlines)
                    .iter()
                    .filter(|(_, d)| **d <= now)
                    .map(|(id, _)| *id)
                    .collect();
                drop(shared);
                let Some(requests) = requests.upgrade() else {
                    return;
                };
                for id in expired {
                    let (tx, rx) = oneshot::channel();
                    if requests
                        .send(Request::Apply(Command::LeaseRevoke { id }, tx))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    match rx.await {
                        Ok(Ok(_)) | Ok(Err(StoreError::LeaseNotFound)) => {
                            tracing::debug!(lease = id, "lease expired and revoked");
                            if let Some(shared) = weak.upgrade() {
                                lock(&shared.deadlines).remove(&id);
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(lease = id, error = %e, "revoking expired lease failed")
                        }
                        Err(_) => return,
                    }
                }
            }
        });
    }

    pub fn revision(&self) -> i64 {
        self.shared.published.load(Ordering::Acquire)
    }

    pub fn metrics(&self) -> &StoreMetrics {
        &self.shared.metrics
    }

    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    fn check_failed(&self) -> StoreResult<()> {
        match &*lock(&self.shared.failed) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Propose a command and wait until it is durable. `--max-txn-ops` is checked here,
    /// before the command reaches the writer ([`Limits::check_command`]), not when it is
    /// applied.
    ///
    /// A lone write — no other write in progress, nor when the few writes before it
    /// started; nothing queued, nobody committing — is committed by the caller itself, on its own thread (a sequential client's case):
    /// handing it to the writer thread and the answer back costs two thread wake-ups,
    /// about a quarter of a sequential put's time on a small machine. The caller's thread
    /// (a runtime worker) then blocks for one `fdatasync`. Any other write goes to the
    /// writer thread, so concurrent writes are still group-committed there (committing
    /// them inline whenever the log happened to be free cost the API benchmark a tenth of
    /// its throughput: smaller batches, more fsyncs, a worker blocked in each), and a
    /// checkpoint (a durable
    /// state-file commit, milliseconds) is left to that thread too, and so are writes to
    /// a store with many watchers (see `INLINE_MAX_WATCHERS`).
    pub async fn propose(&self, cmd: Command) -> StoreResult<CommandResponse> {
        self.check_failed()?;
        self.shared.config.limits.check_command(&cmd)?;
        let (tx, rx) = oneshot::channel();
        let mut request = Request::Apply(cmd, tx);
        let proposing = Proposing::enter(&self.shared.proposing, &self.shared.lone_streak);
        if proposing.alone && self.requests.capacity() == self.requests.max_capacity() {
            request = match commit_inline(&self.shared, request) {
                Ok(()) => return rx.await.map_err(|_| StoreError::Stopped)?,
                Err(request) => request,
            };
        }
        self.requests
            .send(request)
            .await
            .map_err(|_| StoreError::Stopped)?;
        rx.await.map_err(|_| StoreError::Stopped)?
    }

    /// Write a consistent backup of the latest durable revision to `path`.
    pub async fn backup(&self, path: impl AsRef<Path>) -> StoreResult<Backup> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Backup(path.as_ref().to_path_buf(), tx))
            .await
            .map_err(|_| StoreError::Stopped)?;
        rx.await.map_err(|_| StoreError::Stopped)?
    }

    /// Stop the writer and close the database file (so it can be reopened in-process).
    pub async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.requests.send(Request::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    fn new_lease_id(&self) -> i64 {
        let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
        loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 && !mvcc.leases().contains_key(&id) {
                return id;
            }
        }
    }
}

fn set_quota_gauges(metrics: &StoreMetrics, mvcc: &Mvcc) {
    metrics
        .size_in_use_bytes
        .set(i64::try_from(mvcc.size_bytes()).unwrap_or(i64::MAX));
    metrics
        .alarm_nospace
        .set(i64::from(mvcc.has_alarm(AlarmKind::NoSpace)));
}

/// The quota check of a write about to be applied ([`crate::quota`]): one that would take
/// the store beyond its quota raises the NOSPACE alarm first (in the same batch, so the
/// alarm is durable with it), and the engine then refuses it, as it refuses every write
/// that adds data while the alarm is raised.
fn raise_alarm_if_over_quota(
    shared: &Shared,
    mvcc: &mut Mvcc,
    cmd: &Command,
    applied: &mut Vec<Applied>,
) {
    let cost = crate::quota::cost(cmd);
    let quota = shared.config.quota_bytes;
    if mvcc.has_alarm(AlarmKind::NoSpace) || !crate::quota::exceeds(mvcc.size_bytes(), cost, quota)
    {
        return;
    }
    tracing::warn!(
        size = mvcc.size_bytes(),
        quota,
        write_bytes = cost,
        "the store reached its size quota: raising the NOSPACE alarm; writes that add data \
         are refused until space is freed and the alarm disarmed"
    );
    let alarm = Command::Alarm {
        action: AlarmAction::Activate,
        alarm: Alarm {
            member: shared.config.member_id,
            kind: AlarmKind::NoSpace,
        },
    };
    match mvcc.apply(&alarm, &shared.config.limits) {
        Ok((_, a)) => applied.push(a),
        Err(e) => tracing::error!(error = %e, "raising the NOSPACE alarm failed"),
    }
}

/// What the writer hands the thread that writes the state file.
enum Materialize {
    /// A batch the write-ahead log made durable as record `seq`.
    Batch {
        applied: Vec<Applied>,
        revision: i64,
        compact_revision: i64,
        seq: u64,
    },
    /// Commit everything sent before durably, then answer: the log may start over.
    Checkpoint(std::sync::mpsc::SyncSender<StoreResult<()>>),
    /// Commit everything sent before, close the file, then answer.
    Stop(std::sync::mpsc::SyncSender<()>),
}

/// At most this many applied commands go into one state-file transaction.
const MATERIALIZE_BATCH: usize = 4096;
/// Batches that come within this long of the last state-file transaction wait for the
/// next one: under load one redb transaction takes many log records instead of one or
/// two each (a transaction has a fixed cost: its tables' roots, checksums and pages are
/// written again). Nothing reads the state file while the store runs, and a crash
/// replays these batches from the log, so waiting costs neither reads nor durability.
const MATERIALIZE_EVERY: Duration = Duration::from_millis(10);
/// A state-file transaction this long after the last durable one is itself durable
/// (see [`Materializer::flush`]).
const DURABLE_EVERY: Duration = Duration::from_millis(500);

/// The store stops taking work: the in-memory state may be ahead of what a restart finds.
fn stop_store(shared: &Shared, e: StoreError) {
    let mut failed = lock(&shared.failed);
    if failed.is_none() {
        *failed = Some(e);
    }
    drop(failed);
    lock(&shared.hub).close_all();
}

/// Most times the writer yields its CPU to let a batch grow (see `writer_loop`).
const GATHER_YIELDS: usize = 4;

/// Move waiting requests into `pending`, up to `max` in all.
fn drain(rx: &mut mpsc::Receiver<Request>, pending: &mut Vec<Request>, max: usize) {
    while pending.len() < max {
        match rx.try_recv() {
            Ok(r) => pending.push(r),
            Err(_) => break,
        }
    }
}

/// Above this many watchers a write is not committed inline: publishing it wakes every
/// watcher's task, and woken from a runtime worker they queue on that worker (the writer
/// thread's wake-ups spread over all of them). With 1,000 watchers, committing inline
/// cut the store benchmark's writes per second while watched from ≈150 to ≈112.
const INLINE_MAX_WATCHERS: usize = 64;

/// Commit `request` on the calling thread if the log is free and no checkpoint is due;
/// otherwise hand the request back (for the writer thread). See [`EmbeddedStore::propose`].
fn commit_inline(shared: &Shared, request: Request) -> Result<(), Request> {
    let Ok(mut guard) = shared.committer.try_lock() else {
        return Err(request);
    };
    let Some(committer) = guard.as_mut() else {
        return Err(request);
    };
    // A failed store takes nothing (checked under the lock: a commit that failed on the
    // writer thread set it before letting the committer go).
    if committer.wal.checkpoint_due()
        || lock(&shared.failed).is_some()
        || lock(&shared.hub).len() > INLINE_MAX_WATCHERS
    {
        return Err(request);
    }
    shared.metrics.inline_commits.inc();
    let mut pending = vec![request];
    let mut answers = Vec::with_capacity(1);
    // No checkpoint here (its durable state-file commit takes milliseconds): the next
    // write finds it due and goes to the writer thread, which makes it.
    match commit_batch(shared, committer, &mut pending, &mut answers, false) {
        Flow::Continue => {}
        // The log failed (and `commit_batch` answered and said why): the writer thread
        // finds no committer and ends.
        Flow::Stopped => *guard = None,
        // (Only the writer thread is ever sent a stop; handled alike all the same.)
        Flow::Stop(done) => {
            *guard = None;
            drop(guard);
            answer(&mut answers);
            let _ = done.send(());
            return Ok(());
        }
    }
    drop(guard);
    answer(&mut answers);
    Ok(())
}

/// Lease bookkeeping after an apply: a granted (or re-granted) lease expires its TTL from
/// now, a revoked one is forgotten. (Deadlines live outside the deterministic engine.)
pub(crate) fn track_lease_deadlines(deadlines: &mut HashMap<i64, Instant>, applied: &[Applied]) {
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

/// A write's answer and where it goes.
type Answer = (
    oneshot::Sender<StoreResult<CommandResponse>>,
    StoreResult<CommandResponse>,
);

/// Send what [`commit_batch`] left to answer.
fn answer(answers: &mut Vec<Answer>) {
    for (reply, result) in answers.drain(..) {
        let _ = reply.send(result);
    }
}

/// Whether the store goes on after a batch.
enum Flow {
    Continue,
    /// A commit failed; the store stopped (see `Shared::failed`).
    Stopped,
    /// Stopped as asked: answer once the log is closed (the committer dropped).
    Stop(oneshot::Sender<()>),
}

/// Applies requests in batches ([`commit_batch`]), as many as are queued at a time (group
/// commit).
fn writer_loop(shared: &Shared, mut rx: mpsc::Receiver<Request>) {
    let max_batch = shared.config.max_batch.max(1);
    let mut pending: Vec<Request> = Vec::with_capacity(max_batch);
    let mut answers = Vec::with_capacity(max_batch);
    let mut last_batch = 0usize;
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        drain(&mut rx, &mut pending, max_batch);
        // Group commit under load: when the last batch held more than one request,
        // give the CPU away before committing, and again while that brings more. On a
        // busy machine (the request threads runnable) they add to this batch, so one
        // fdatasync covers more writes: under the API benchmark's load this cut the
        // server's CPU per create by about a tenth. On an idle machine `yield_now`
        // returns at once, and a lone writer (last batch of one) never yields, so
        // sequential latency is unchanged.
        if last_batch > 1 {
            for _ in 0..GATHER_YIELDS {
                let before = pending.len();
                if before >= max_batch {
                    break;
                }
                std::thread::yield_now();
                drain(&mut rx, &mut pending, max_batch);
                if pending.len() == before {
                    break;
                }
            }
        }
        last_batch = pending.len();
        let mut guard = lock(&shared.committer);
        let Some(committer) = guard.as_mut() else {
            // An inline commit failed and stopped the store.
            let e = lock(&shared.failed).clone().unwrap_or(StoreError::Stopped);
            for req in pending.drain(..) {
                match req {
                    Request::Apply(_, reply) => {
                        let _ = reply.send(Err(e.clone()));
                    }
                    Request::Backup(_, reply) => {
                        let _ = reply.send(Err(e.clone()));
                    }
                    Request::Stop(done) => {
                        let _ = done.send(());
                    }
                }
            }
            return;
        };
        let flow = commit_batch(shared, committer, &mut pending, &mut answers, true);
        if !matches!(flow, Flow::Continue) {
            // Failed or stopped: no write may be committed inline after this one.
            *guard = None;
        }
        drop(guard);
        answer(&mut answers);
        match flow {
            Flow::Continue => {}
            Flow::Stopped => return,
            Flow::Stop(done) => {
                let _ = done.send(());
                return;
            }
        }
    }
}

/// Commit one batch: apply it to the engine in memory, make it durable with one log
/// record and `fdatasync`, publish it to watchers, answer, and leave writing it into the
/// state file to [`materializer_loop`] on its own thread, so that the next batch does not
/// wait for the redb commit (a sequential client's next request arrives while it runs).
/// Called with the committer locked, by the writer thread or inline.
///
/// The answers to the batch's writes are left in `answers`, for the caller to send once
/// it has let go of the committer: a sequential client's next write, sent the moment it
/// has its answer, then finds the log free.
fn commit_batch(
    shared: &Shared,
    committer: &mut Committer,
    pending: &mut Vec<Request>,
    answers: &mut Vec<Answer>,
    may_checkpoint: bool,
) -> Flow {
    let limits = &shared.config.limits;
    let Committer { wal, materializer } = committer;
    let mut replies = Vec::with_capacity(pending.len());
    let mut applied: Vec<Applied> = Vec::new();
    let mut backups = Vec::new();
    let mut stop = None;
    let (revision, compact_revision) = {
        let mut mvcc = shared.mvcc.write().unwrap_or_else(|p| p.into_inner());
        for req in pending.drain(..) {
            match req {
                Request::Apply(cmd, reply) => {
                    raise_alarm_if_over_quota(shared, &mut mvcc, &cmd, &mut applied);
                    let result = match mvcc.apply(&cmd, limits) {
                        Ok((resp, a)) => {
                            applied.push(a);
                            Ok(resp)
                        }
                        Err(StoreError::NoSpace { .. }) => {
                            shared.metrics.nospace_refusals.inc();
                            Err(StoreError::NoSpace {
                                quota_bytes: shared.config.quota_bytes,
                            })
                        }
                        Err(e) => Err(e),
                    };
                    replies.push((reply, result));
                }
                // Written once this batch is logged, below: a backup holds only
                // durable writes.
                Request::Backup(path, reply) => backups.push((path, reply)),
                Request::Stop(done) => stop = Some(done),
            }
        }
        if applied
            .iter()
            .any(|a| a.alarms.is_some() || a.revision.is_some() || a.compacted.is_some())
        {
            set_quota_gauges(&shared.metrics, &mvcc);
        }
        (mvcc.revision(), mvcc.compact_revision())
    };
    let started = Instant::now();
    let wrote = applied.iter().any(Applied::wrote);
    // Durable first (the write-ahead log); the state file is written after the
    // answers, by the materializer: a crash in between is repaired from the log.
    let result = if wrote {
        wal.append(&applied, revision, compact_revision).map(Some)
    } else {
        Ok(None)
    };
    let logged = match result {
        Ok(logged) => logged,
        Err(e) => {
            tracing::error!(error = %e, "commit failed; the store stops accepting requests");
            for (reply, _) in replies {
                let _ = reply.send(Err(e.clone()));
            }
            for (_, reply) in backups {
                let _ = reply.send(Err(e.clone()));
            }
            stop_store(shared, e);
            return Flow::Stopped;
        }
    };
    if wrote {
        shared
            .metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        shared.metrics.batch_size.observe(replies.len() as f64);
    }
    track_lease_deadlines(&mut lock(&shared.deadlines), &applied);
    // Publish, then answer.
    let revisions: Vec<(i64, Arc<[Event]>)> =
        applied.iter().filter_map(|a| a.revision.clone()).collect();
    {
        let mut hub = lock(&shared.hub);
        shared.published.store(revision, Ordering::Release);
        hub.publish(&revisions, revision);
        if hub.unsynced() > 0 {
            shared.catch_up.notify_one();
        }
    }
    shared.metrics.applied_revision.set(revision);
    shared.metrics.writes.inc_by(revisions.len() as u64);
    answers.extend(replies);
    if !backups.is_empty() {
        // The engine is at `revision` (only this thread changes it), all of it logged.
        let mvcc = shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
        let backup = Backup::from_mvcc(&mvcc, revision);
        drop(mvcc);
        for (path, reply) in backups {
            let _ = reply.send(backup.write(&path).map(|_| backup.clone()));
        }
    }
    if let Some(seq) = logged {
        let batch = Materialize::Batch {
            applied,
            revision,
            compact_revision,
            seq,
        };
        if materializer.batch(batch).is_err() {
            // The materializer stopped (and said why). This batch was answered and
            // published to a hub already closed: it is in the log, and the next start
            // writes it into the state file.
            stop_store(shared, StoreError::Stopped);
            return Flow::Stopped;
        }
        if may_checkpoint && wal.checkpoint_due() {
            let started = Instant::now();
            let (tx, done) = std::sync::mpsc::sync_channel(1);
            let result = materializer
                .now(Materialize::Checkpoint(tx))
                .map_err(|_| StoreError::Stopped)
                .and_then(|_| done.recv().map_err(|_| StoreError::Stopped)?);
            shared
                .metrics
                .checkpoint_seconds
                .observe(started.elapsed().as_secs_f64());
            match result {
                Ok(()) => wal.checkpointed(),
                Err(e) => {
                    stop_store(shared, e);
                    return Flow::Stopped;
                }
            }
        }
    }
    if let Some(done) = stop {
        let (tx, closed) = std::sync::mpsc::sync_channel(1);
        if materializer.now(Materialize::Stop(tx)).is_ok() {
            let _ = closed.recv();
        }
        lock(&shared.hub).close_all();
        return Flow::Stop(done);
    }
    Flow::Continue
}

/// The writer's end of the materializer's channel. Batches wait for the materializer's
/// next round; checkpoints and stopping wake it.
struct ToMaterializer {
    tx: std::sync::mpsc::Sender<Materialize>,
    thread: std::thread::Thread,
}

impl ToMaterializer {
    fn batch(&self, msg: Materialize) -> Result<(), std::sync::mpsc::SendError<Materialize>> {
        self.tx.send(msg)
    }

    fn now(&self, msg: Materialize) -> Result<(), std::sync::mpsc::SendError<Materialize>> {
        self.tx.send(msg)?;
        self.thread.unpark();
        Ok(())
    }
}

impl Drop for ToMaterializer {
    fn drop(&mut self) {
        // The channel closes with this; let a waiting materializer see it at once.
        self.thread.unpark();
    }
}

/// What [`Materializer::handle`] made of a message.
enum Handled {
    Continue,
    /// Stopped: answer once the file is closed.
    Stop(std::sync::mpsc::SyncSender<()>),
}

/// The state file and the logged batches not yet written into it.
struct Materializer {
    shared: Arc<Shared>,
    persist: Persist,
    /// Applied commands of the waiting batches, in order.
    applied: Vec<Applied>,
    /// Revision, compact revision and log record of the last waiting batch.
    last: Option<(i64, i64, u64)>,
    /// Log records among the waiting batches.
    records: u64,
    /// When the state file was last committed durably.
    last_durable: Instant,
}

impl Materializer {
    /// Write the waiting batches in one redb transaction, durably at a checkpoint (which
    /// commits durably even with nothing waiting: earlier commits may not be).
    fn flush(&mut self, checkpoint: bool) -> StoreResult<()> {
        // Between checkpoints, now and then a durable commit on this thread's time: the
        // checkpoint, which the writer waits for, then has little left to flush.
        let durable = checkpoint || self.last_durable.elapsed() >= DURABLE_EVERY;
        match self.last.take() {
            Some((revision, compact_revision, seq)) => {
                self.persist
                    .materialize(&self.applied, revision, compact_revision, seq, durable)?
            }
            None if checkpoint => self.persist.sync()?,
            None => return Ok(()),
        }
        self.applied.clear();
        if durable {
            self.last_durable = Instant::now();
        }
        let metrics = &self.shared.metrics;
        metrics.materialized_txns.inc();
        metrics
            .materialized_records
            .inc_by(std::mem::take(&mut self.records));
        let size = self.persist.size_bytes();
        self.shared.db_size.store(size, Ordering::Relaxed);
        self.shared.metrics.db_size_bytes.set(size);
        Ok(())
    }

    fn handle(&mut self, msg: Materialize) -> StoreResult<Handled> {
        match msg {
            Materialize::Batch {
                applied,
                revision,
                compact_revision,
                seq,
            } => {
                self.applied.extend(applied);
                self.last = Some((revision, compact_revision, seq));
                self.records += 1;
                if self.applied.len() >= MATERIALIZE_BATCH {
                    self.flush(false)?;
                }
            }
            Materialize::Checkpoint(done) => {
                let result = self.flush(true);
                let _ = done.send(result.clone());
                result?;
            }
            Materialize::Stop(done) => {
                // Durably, so that a failure is seen here (closing the file would commit
                // it too, and report nothing).
                if let Err(e) = self.flush(true) {
                    tracing::error!(error = %e, "writing the state file failed while stopping; the next start repairs it from the log");
                }
                return Ok(Handled::Stop(done));
            }
        }
        Ok(Handled::Continue)
    }
}

/// Writes the batches the writer made durable into the state file, as many as are
/// waiting in one redb transaction, without fsync except at checkpoints.
fn materializer_loop(
    shared: Arc<Shared>,
    persist: Persist,
    rx: std::sync::mpsc::Receiver<Materialize>,
) {
    let mut m = Materializer {
        shared,
        persist,
        applied: Vec::new(),
        last: None,
        records: 0,
        last_durable: Instant::now(),
    };
    let mut last_flush = Instant::now();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let result = loop {
            let Some(msg) = next.take() else {
                // Nothing more waiting: write what came, once the last transaction is
                // long enough ago (a checkpoint or a full batch writes at once).
                // Parked rather than blocked on the channel, so that a batch sent meanwhile
                // does not wake this thread (a checkpoint or stop does: `ToMaterializer`).
                let wait =
                    (last_flush + MATERIALIZE_EVERY).saturating_duration_since(Instant::now());
                if !wait.is_zero() && m.last.is_some() {
                    std::thread::park_timeout(wait);
                    next = rx.try_recv().ok();
                    if next.is_some() {
                        continue;
                    }
                }
                last_flush = Instant::now();
                break m.flush(false);
            };
            match m.handle(msg) {
                Ok(Handled::Continue) => {}
                Ok(Handled::Stop(done)) => {
                    drop(m); // closes the file
                    let _ = done.send(());
                    return;
                }
                Err(e) => break Err(e),
            }
            next = rx.try_recv().ok();
        };
        if let Err(e) = result {
            // Everything answered is in the log; the next start writes it to the state
            // file. Until then this member stops. The file is closed before the writer
            // can notice (by its sends failing once `rx` is gone).
            let shared = m.shared.clone();
            drop(m);
            tracing::error!(error = %e, "writing the state file failed; the store stops accepting requests");
            stop_store(&shared, e);
            return;
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
impl KvBackend for EmbeddedStore {
    fn max_txn_ops(&self) -> usize {
        self.shared.config.limits.max_txn_ops
    }

    async fn range(&self, req: RangeRequest) -> StoreResult<RangeResponse> {
        self.check_failed()?;
        let published = self.revision();
        let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
        mvcc.range(&req, published)
    }

    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        let read_only = req
            .success
            .iter()
            .chain(req.failure.iter())
            .all(|op| matches!(op, TxnOp::Range(_)));
        if read_only && req.compare.is_empty() {
            // Pure reads need no log entry; serve them at the published revision.
            let mut responses = Vec::new();
            let published = self.revision();
            let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
            for op in &req.success {
                if let TxnOp::Range(r) = op {
                    responses.push(TxnOpResponse::Range(mvcc.range(r, published)?));
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
        self.check_failed()?;
        let rx = {
            let mut hub = lock(&self.shared.hub);
            let published = self.shared.published.load(Ordering::Acquire);
            let compact = self
                .shared
                .mvcc
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .compact_revision();
            let rx = hub.add(req, published, compact, self.shared.config.watch_buffer)?;
            self.shared.metrics.watchers.set(hub.len() as i64);
            if hub.unsynced() > 0 {
                self.shared.catch_up.notify_one();
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
        self.check_failed()?;
        let ttl = {
            let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
            mvcc.leases()
                .get(&id)
                .map(|l| l.ttl)
                .ok_or(StoreError::LeaseNotFound)?
        };
        lock(&self.shared.deadlines)
            .insert(id, Instant::now() + Duration::from_secs(ttl.max(1) as u64));
        Ok(ttl)
    }

    async fn lease_keep_alive_many(&self, ids: &[i64]) -> StoreResult<Vec<Option<i64>>> {
        self.check_failed()?;
        let ttls: Vec<Option<i64>> = {
            let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
            ids.iter()
                .map(|id| mvcc.leases().get(id).map(|l| l.ttl))
                .collect()
        };
        let now = Instant::now();
        let mut deadlines = lock(&self.shared.deadlines);
        for (id, ttl) in ids.iter().zip(&ttls) {
            if let Some(ttl) = ttl {
                deadlines.insert(*id, now + Duration::from_secs((*ttl).max(1) as u64));
            }
        }
        Ok(ttls)
    }

    async fn lease_time_to_live(&self, id: i64, keys: bool) -> StoreResult<LeaseTimeToLive> {
        let (granted, lease_keys) = {
            let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
            match mvcc.leases().get(&id) {
                Some(l) => (
                    l.ttl,
                    if keys {
                        l.keys.iter().cloned().collect()
                    } else {
                        Vec::new()
                    },
                ),
                None => {
                    return Ok(LeaseTimeToLive {
                        id,
                        ttl: -1,
                        granted_ttl: 0,
                        keys: Vec::new(),
                    })
                }
            }
        };
        let remaining = lock(&self.shared.deadlines)
            .get(&id)
            .map(|d| d.saturating_duration_since(Instant::now()).as_secs() as i64)
            .unwrap_or(granted);
        Ok(LeaseTimeToLive {
            id,
            ttl: remaining,
            granted_ttl: granted,
            keys: lease_keys,
        })
    }

    async fn lease_leases(&self) -> StoreResult<Vec<i64>> {
        let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
        Ok(mvcc.leases().keys().copied().collect())
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
        self.check_failed()?;
        let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
        Ok(mvcc.alarms())
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
        self.check_failed()?;
        let (compact, size_in_use, alarms) = {
            let mvcc = self.shared.mvcc.read().unwrap_or_else(|p| p.into_inner());
            (mvcc.compact_revision(), mvcc.size_bytes(), mvcc.alarms())
        };
        let revision = self.revision();
        Ok(StoreStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision,
            compact_revision: compact,
            db_size: self.shared.db_size.load(Ordering::Relaxed),
            member_id: self.shared.config.member_id,
            leader: self.shared.config.member_id,
            raft_term: 1,
            raft_index: revision as u64,
            raft_applied_index: revision as u64,
            is_learner: false,
            size_in_use: i64::try_from(size_in_use).unwrap_or(i64::MAX),
            quota_bytes: i64::try_from(self.shared.config.quota_bytes).unwrap_or(i64::MAX),
            alarms,
        })
    }
}
