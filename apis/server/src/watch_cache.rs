//! The watch cache: one store watch per kind feeding a ring buffer of recent events and
//! a broadcast channel. Any number of API watchers cost one store watch; the broadcast
//! never blocks the feeder, so a slow watcher only hurts itself: when it lags it catches
//! up from the ring, and when the ring no longer covers it, it is ended with 410 and the
//! client relists. Resource versions older than the ring are served by a direct store
//! watch (which answers 410 once compacted).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lattice_apis::KindInfo;
use lattice_store::{
    prefix_end, EventType, KeyRange, KvBackend, RangeRequest, StoreError, WatchRequest, WatchStream,
};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use crate::errors::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::objects::{decode, list_prefix};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Put,
    Delete,
}

/// One change to one object, decoded once and shared by every watcher.
#[derive(Debug)]
pub struct Change {
    pub rev: i64,
    pub key: Bytes,
    pub kind: ChangeKind,
    /// Put: the new object; Delete: the last state, with the deletion's resourceVersion.
    pub object: Arc<Value>,
    /// The previous state (None for a creation): decoded on first use, as only
    /// watchers with selectors look at it.
    prev: OnceLock<Option<Arc<Value>>>,
    /// The stored previous value and its revision, until `prev` is decoded.
    prev_raw: Option<(Bytes, i64)>,
    /// The NDJSON line of this change as ADDED / MODIFIED / DELETED, serialised once
    /// for all watchers.
    lines: [OnceLock<Bytes>; 3],
}

impl Change {
    pub fn new(
        rev: i64,
        key: Bytes,
        kind: ChangeKind,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Self {
        Self {
            rev,
            key,
            kind,
            object,
            prev: OnceLock::from(prev),
            prev_raw: None,
            lines: Default::default(),
        }
    }

    /// A change whose previous state is decoded from `prev` (the stored value and its
    /// revision) only if [`Change::prev`] is called.
    pub fn with_stored_prev(
        rev: i64,
        key: Bytes,
        kind: ChangeKind,
        object: Arc<Value>,
        prev: Option<(Bytes, i64)>,
    ) -> Self {
        Self {
            rev,
            key,
            kind,
            object,
            prev: OnceLock::new(),
            prev_raw: prev,
            lines: Default::default(),
        }
    }

    /// Whether there is a previous state (false for a creation); does not decode it.
    pub fn has_prev(&self) -> bool {
        match self.prev.get() {
            Some(p) => p.is_some(),
            None => self.prev_raw.is_some(),
        }
    }

    /// The previous state (None for a creation, or when it does not decode).
    pub fn prev(&self) -> Option<&Arc<Value>> {
        self.prev
            .get_or_init(|| {
                let (value, rev) = self.prev_raw.as_ref()?;
                decode(value, *rev).ok().map(Arc::new)
            })
            .as_ref()
    }

    /// `{"type": ty, "object": <object>}\n`, memoised.
    pub fn line(&self, ty: &str) -> Bytes {
        let i = match ty {
            "ADDED" => 0,
            "MODIFIED" => 1,
            _ => 2,
        };
        self.lines[i]
            .get_or_init(|| {
                let mut v =
                    serde_json::to_vec(&serde_json::json!({"type": ty, "object": &*self.object}))
                        .unwrap_or_default();
                v.push(b'\n');
                Bytes::from(v)
            })
            .clone()
    }
}

#[derive(Debug, Clone)]
pub enum CacheMsg {
    Change(Arc<Change>),
    /// Every later change has a higher revision.
    Progress(i64),
    /// The cache lost its store watch; watchers must end (410) so clients relist.
    Reset,
}

struct CacheState {
    ring: VecDeque<Arc<Change>>,
    /// Every change with revision > valid_from is in the ring (or will be broadcast).
    valid_from: i64,
    /// Highest revision seen (change or progress).
    last_rev: i64,
    ready: bool,
}

pub struct KindCache {
    pub kind: &'static KindInfo,
    state: Mutex<CacheState>,
    tx: broadcast::Sender<CacheMsg>,
    ready_tx: tokio::sync::watch::Sender<bool>,
    capacity: usize,
}

/// What a watcher gets when it subscribes: the backlog, then the live receiver.
pub struct Subscription {
    pub backlog: Vec<Arc<Change>>,
    pub rx: broadcast::Receiver<CacheMsg>,
    pub last_rev: i64,
}

impl KindCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Subscribe for every change with revision > `from`. `None` when the ring does not
    /// cover `from` (use a direct store watch) or the cache is not ready.
    pub fn subscribe(&self, from: i64) -> Option<Subscription> {
        let st = self.lock();
        if !st.ready || from < st.valid_from {
            return None;
        }
        let rx = self.tx.subscribe();
        let start = st.ring.partition_point(|c| c.rev <= from);
        let backlog = st.ring.iter().skip(start).cloned().collect();
        Some(Subscription {
            backlog,
            rx,
            last_rev: st.last_rev.max(from),
        })
    }

    pub fn last_rev(&self) -> i64 {
        self.lock().last_rev
    }

    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut rx = self.ready_tx.subscribe();
        let ok = matches!(
            tokio::time::timeout(timeout, rx.wait_for(|r| *r)).await,
            Ok(Ok(_))
        );
        ok
    }

    fn push(&self, c: Change, metrics: &Metrics) {
        let c = Arc::new(c);
        let mut st = self.lock();
        st.last_rev = st.last_rev.max(c.rev);
        st.ring.push_back(c.clone());
        while st.ring.len() > self.capacity {
            if let Some(old) = st.ring.pop_front() {
                st.valid_from = st.valid_from.max(old.rev);
            }
        }
        metrics
            .watch_cache_events
            .get_or_create(&crate::metrics::KindLabel {
                kind: self.kind.kind.into(),
            })
            .inc();
        let _ = self.tx.send(CacheMsg::Change(c));
    }

    /// Every change up to `rev` was pushed.
    fn progress(&self, rev: i64) {
        let mut st = self.lock();
        if rev > st.last_rev {
            st.last_rev = rev;
            let _ = self.tx.send(CacheMsg::Progress(rev));
        }
    }

    fn reset(&self, rev: i64) {
        let mut st = self.lock();
        st.ring.clear();
        st.valid_from = rev;
        st.last_rev = rev;
        st.ready = false;
        let _ = self.tx.send(CacheMsg::Reset);
        let _ = self.ready_tx.send(false);
    }

    fn start(&self, rev: i64) {
        let mut st = self.lock();
        st.ring.clear();
        st.valid_from = rev;
        st.last_rev = rev;
        st.ready = true;
        let _ = self.ready_tx.send(true);
    }
}

/// Convert a store event into a [`Change`].
pub fn convert_event(ev: &lattice_store::Event) -> Option<Change> {
    let prev = ev
        .prev_kv
        .as_ref()
        .map(|p| (p.value.clone(), p.mod_revision));
    match ev.kind {
        EventType::Put => {
            let object = decode(&ev.kv.value, ev.kv.mod_revision).ok()?;
            Some(Change::with_stored_prev(
                ev.kv.mod_revision,
                ev.kv.key.clone(),
                ChangeKind::Put,
                Arc::new(object),
                prev,
            ))
        }
        EventType::Delete => {
            let Some(p) = ev.prev_kv.as_ref() else {
                tracing::warn!(key = ?ev.kv.key, "delete event without prev_kv; skipped");
                return None;
            };
            let object = decode(&p.value, ev.kv.mod_revision).ok()?;
            Some(Change::with_stored_prev(
                ev.kv.mod_revision,
                ev.kv.key.clone(),
                ChangeKind::Delete,
                Arc::new(object),
                prev,
            ))
        }
    }
}

/// All kinds' caches, started lazily on the first watch of a kind.
pub struct WatchCaches {
    backend: Arc<dyn KvBackend>,
    capacity: usize,
    metrics: Arc<Metrics>,
    caches: Mutex<HashMap<&'static str, Arc<KindCache>>>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for WatchCaches {
    fn drop(&mut self) {
        if let Ok(t) = self.tasks.lock() {
            for h in t.iter() {
                h.abort();
            }
        }
    }
}

impl WatchCaches {
    pub fn new(backend: Arc<dyn KvBackend>, capacity: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            backend,
            capacity: capacity.max(16),
            metrics,
            caches: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The cache of `kind`, starting it if needed.
    pub fn get(&self, kind: &'static KindInfo) -> Arc<KindCache> {
        let mut map = match self.caches.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if let Some(c) = map.get(kind.plural) {
            return c.clone();
        }
        let (tx, _) = broadcast::channel(1024);
        let (ready_tx, _) = tokio::sync::watch::channel(false);
        let cache = Arc::new(KindCache {
            kind,
            state: Mutex::new(CacheState {
                ring: VecDeque::new(),
                valid_from: i64::MAX,
                last_rev: 0,
                ready: false,
            }),
            tx,
            ready_tx,
            capacity: self.capacity,
        });
        map.insert(kind.plural, cache.clone());
        let handle = tokio::spawn(feed(
            self.backend.clone(),
            cache.clone(),
            self.metrics.clone(),
        ));
        if let Ok(mut t) = self.tasks.lock() {
            t.push(handle.abort_handle());
        }
        cache
    }
}

/// The feeder: one store watch per kind, restarted (with a Reset) when it ends.
async fn feed(backend: Arc<dyn KvBackend>, cache: Arc<KindCache>, metrics: Arc<Metrics>) {
    let prefix = list_prefix(cache.kind, None);
    let mut backoff = Duration::from_millis(100);
    loop {
        let head = backend
            .range(RangeRequest {
                range: KeyRange::prefix(prefix.clone()),
                count_only: true,
                ..Default::default()
            })
            .await;
        let rev = match head {
            Ok(r) => r.revision,
            Err(e) => {
                tracing::warn!(kind = cache.kind.kind, error = %e, "watch cache: cannot read the store revision");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let req = WatchRequest {
            range: KeyRange::between(prefix.clone(), prefix_end(&prefix)),
            start_revision: rev + 1,
            prev_kv: true,
            progress_notify: true,
            ..Default::default()
        };
        let mut stream = match backend.watch(req).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(kind = cache.kind.kind, error = %e, "watch cache: cannot start the store watch");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        cache.start(rev);
        backoff = Duration::from_millis(100);
        tracing::debug!(kind = cache.kind.kind, rev, "watch cache started");
        loop {
            match stream.next().await {
                Some(Ok(batch)) => {
                    // Each change goes out as soon as it is decoded: a large batch (a
                    // burst of commits) does not hold its first change back until the
                    // last one is decoded.
                    for c in batch.events.iter().filter_map(convert_event) {
                        cache.push(c, &metrics);
                    }
                    cache.progress(batch.revision);
                }
                Some(Err(e)) => {
                    tracing::warn!(kind = cache.kind.kind, error = %e, "watch cache: store watch failed; restarting");
                    break;
                }
                None => {
                    tracing::info!(
                        kind = cache.kind.kind,
                        "watch cache: store watch ended; restarting"
                    );
                    break;
                }
            }
        }
        cache.reset(cache.last_rev());
        tokio::time::sleep(backoff).await;
    }
}

/// How far a cache watcher got: changes at or below `floor` are never delivered (the
/// watcher started after them); `seen` changes of revision `rev` were delivered (one
/// transaction can change several keys at one revision).
#[derive(Debug, Clone, Copy)]
pub struct Cursor {
    floor: i64,
    rev: i64,
    seen: usize,
}

impl Cursor {
    fn accept(&mut self, c: &Change) -> bool {
        if c.rev <= self.floor {
            return false;
        }
        if c.rev == self.rev {
            self.seen += 1;
        } else {
            self.rev = c.rev;
            self.seen = 1;
        }
        true
    }
}

/// Where a watcher's changes come from.
pub enum Source {
    Cache {
        cache: Arc<KindCache>,
        backlog: VecDeque<Arc<Change>>,
        rx: broadcast::Receiver<CacheMsg>,
        cursor: Cursor,
    },
    Direct {
        stream: WatchStream,
        pending: VecDeque<Arc<Change>>,
    },
}

pub enum Item {
    Change(Arc<Change>),
    Progress(i64),
}

impl Source {
    /// Open a source delivering every change with revision > `from`.
    pub async fn open(
        caches: &WatchCaches,
        backend: &Arc<dyn KvBackend>,
        kind: &'static KindInfo,
        from: i64,
    ) -> ApiResult<Source> {
        let cache = caches.get(kind);
        if cache.wait_ready(Duration::from_secs(5)).await {
            if let Some(sub) = cache.subscribe(from) {
                return Ok(Source::Cache {
                    cache,
                    backlog: sub.backlog.into(),
                    rx: sub.rx,
                    cursor: Cursor {
                        floor: from,
                        rev: from,
                        seen: 0,
                    },
                });
            }
        }
        let prefix = list_prefix(kind, None);
        let req = WatchRequest {
            range: KeyRange::between(prefix.clone(), prefix_end(&prefix)),
            start_revision: from + 1,
            prev_kv: true,
            progress_notify: true,
            ..Default::default()
        };
        let stream = backend.watch(req).await.map_err(|e| match e {
            StoreError::Compacted { compact_revision } => ApiError::expired(format!(
                "too old resource version: {from} ({compact_revision})"
            )),
            other => other.into(),
        })?;
        Ok(Source::Direct {
            stream,
            pending: VecDeque::new(),
        })
    }

    pub async fn next(&mut self) -> ApiResult<Item> {
        match self {
            Source::Cache {
                cache,
                backlog,
                rx,
                cursor,
            } => loop {
                if let Some(c) = backlog.pop_front() {
                    if cursor.accept(&c) {
                        return Ok(Item::Change(c));
                    }
                    continue;
                }
                match rx.recv().await {
                    Ok(CacheMsg::Change(c)) => {
                        if cursor.accept(&c) {
                            return Ok(Item::Change(c));
                        }
                    }
                    Ok(CacheMsg::Progress(r)) => {
                        if r > cursor.floor {
                            return Ok(Item::Progress(r));
                        }
                    }
                    Ok(CacheMsg::Reset) | Err(broadcast::error::RecvError::Closed) => {
                        return Err(ApiError::expired(
                            "the watch cache was reset; relist and watch again",
                        ));
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        // Catch up from the ring (re-reading the current revision, minus
                        // what was already delivered of it), or give up with 410.
                        let from = (cursor.rev - 1).max(cursor.floor);
                        match cache.subscribe(from) {
                            Some(sub) => {
                                tracing::debug!(kind = cache.kind.kind, skipped = n, "slow watcher caught up from the ring");
                                let mut b: VecDeque<Arc<Change>> = sub.backlog.into();
                                if cursor.rev > cursor.floor {
                                    let mut skip = cursor.seen;
                                    while skip > 0 && b.front().is_some_and(|c| c.rev == cursor.rev) {
                                        b.pop_front();
                                        skip -= 1;
                                    }
                                }
                                *rx = sub.rx;
                                *backlog = b;
                            }
                            None => {
                                return Err(ApiError::expired(format!(
                                    "the watcher fell too far behind (resourceVersion {} left the watch cache); relist and watch again",
                                    cursor.rev
                                )))
                            }
                        }
                    }
                }
            },
            Source::Direct { stream, pending } => loop {
                if let Some(c) = pending.pop_front() {
                    return Ok(Item::Change(c));
                }
                match stream.next().await {
                    Some(Ok(batch)) => {
                        if batch.events.is_empty() {
                            return Ok(Item::Progress(batch.revision));
                        }
                        pending.extend(batch.events.iter().filter_map(convert_event).map(Arc::new));
                    }
                    Some(Err(StoreError::Compacted { compact_revision })) => {
                        return Err(ApiError::expired(format!(
                            "the watch was compacted at revision {compact_revision}; relist and watch again"
                        )))
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => return Err(ApiError::expired("the store watch ended; relist and watch again")),
                }
            },
        }
    }
}
