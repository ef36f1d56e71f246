//! The watch cache: one store watch per kind feeding a ring buffer of recent events and
//! one broadcast channel per *filter* (namespace and selectors). Any number of API
//! watchers cost one store watch, and watchers with the same filter share one channel:
//! the feeder decides once per change and filter whether the change concerns them
//! ([`Filter::passes`]), so a change no watcher wants wakes none (a thousand watchers of
//! one label do not each wake for every other object's change). Watchers that were left
//! out of changes get a progress message (for their bookmarks) at most every
//! [`PROGRESS_EVERY`]. The broadcast never blocks the feeder, so a slow watcher only
//! hurts itself: when it lags it catches up from the ring, and when the ring no longer
//! covers it, it is ended with 410 and the client relists. Resource versions older than
//! the ring are served by a direct store watch (which answers 410 once compacted).

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

use crate::metrics::Metrics;
use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::objects::{decode, list_prefix};
use crate::registry::selectors::Selectors;

/// How often watchers that were left out of changes learn how far the cache got.
pub const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Messages a group's channel holds for its slowest watcher before that one lags (and
/// catches up from the ring).
const GROUP_CHANNEL: usize = 1024;

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

/// What a change looks like to a watcher with selectors (kube's cacher rules): ADDED when
/// the object starts matching, MODIFIED while it matches, DELETED when it stops or is
/// deleted; `None` when the watcher does not see it.
pub fn classify<'a>(c: &'a Change, sel: &Selectors) -> Option<(&'static str, &'a Value)> {
    match c.kind {
        ChangeKind::Put => {
            let now = sel.matches(&c.object);
            // Without selectors only the previous state's existence matters.
            let before = if sel.is_empty() {
                c.has_prev().then_some(true)
            } else {
                c.prev().map(|p| sel.matches(p))
            };
            match (before, now) {
                (None, true) | (Some(false), true) => Some(("ADDED", &c.object)),
                (Some(true), true) => Some(("MODIFIED", &c.object)),
                (Some(true), false) => Some(("DELETED", &c.object)),
                _ => None,
            }
        }
        ChangeKind::Delete => sel.matches(&c.object).then_some(("DELETED", &c.object)),
    }
}

/// What a group of watchers wants: the changes under a key prefix (one tenant, or the
/// whole kind) that their selectors see.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    pub prefix: Bytes,
    pub selectors: Selectors,
}

impl Filter {
    /// Whether a watcher with this filter is sent `c`.
    pub fn passes(&self, c: &Change) -> bool {
        c.key.starts_with(&self.prefix) && classify(c, &self.selectors).is_some()
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

/// The watchers of one [`Filter`].
struct Group {
    tx: broadcast::Sender<CacheMsg>,
    /// Changes were left out since this group's last progress message.
    behind: bool,
}

struct CacheState {
    ring: VecDeque<Arc<Change>>,
    /// Every change with revision > valid_from is in the ring (or will be broadcast).
    valid_from: i64,
    /// Highest revision seen (change or progress).
    last_rev: i64,
    /// Every change up to this revision was pushed (the last store batch's revision).
    complete_rev: i64,
    ready: bool,
    groups: HashMap<Filter, Group>,
}

pub struct KindCache {
    pub kind: &'static KindInfo,
    state: Mutex<CacheState>,
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
    fn new(kind: &'static KindInfo, capacity: usize) -> Self {
        let (ready_tx, _) = tokio::sync::watch::channel(false);
        KindCache {
            kind,
            state: Mutex::new(CacheState {
                ring: VecDeque::new(),
                valid_from: i64::MAX,
                last_rev: 0,
                complete_rev: 0,
                ready: false,
                groups: HashMap::new(),
            }),
            ready_tx,
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Subscribe for every change with revision > `from` that passes `filter`: the
    /// backlog holds every change of the ring after `from` (unfiltered), the receiver
    /// only those that pass. `None` when the ring does not cover `from` (use a direct
    /// store watch) or the cache is not ready.
    pub fn subscribe(&self, from: i64, filter: &Filter) -> Option<Subscription> {
        let mut st = self.lock();
        if !st.ready || from < st.valid_from {
            return None;
        }
        let rx = match st.groups.get(filter) {
            Some(g) => g.tx.subscribe(),
            None => {
                let (tx, rx) = broadcast::channel(GROUP_CHANNEL);
                st.groups
                    .insert(filter.clone(), Group { tx, behind: false });
                rx
            }
        };
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

    /// Number of watcher groups (distinct filters) with watchers.
    pub fn groups(&self) -> usize {
        self.lock().groups.len()
    }

    fn push(&self, c: Change, metrics: &Metrics) {
        let c = Arc::new(c);
        let mut guard = self.lock();
        let st = &mut *guard;
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
        // Groups whose watchers all left are dropped here.
        st.groups.retain(|filter, g| {
            if g.tx.receiver_count() == 0 {
                return false;
            }
            if filter.passes(&c) {
                let _ = g.tx.send(CacheMsg::Change(c.clone()));
            } else {
                g.behind = true;
            }
            true
        });
    }

    /// Every change up to `rev` was pushed: when that is news (no change reached `rev`),
    /// every group hears it.
    fn progress(&self, rev: i64) {
        let mut st = self.lock();
        st.complete_rev = st.complete_rev.max(rev);
        if rev > st.last_rev {
            st.last_rev = rev;
            for g in st.groups.values_mut() {
                let _ = g.tx.send(CacheMsg::Progress(rev));
                g.behind = false;
            }
        }
    }

    /// Tell the groups that were left out of changes since their last message how far
    /// the cache is complete (called every [`PROGRESS_EVERY`]).
    fn flush_progress(&self) {
        let mut st = self.lock();
        let rev = st.complete_rev;
        for g in st.groups.values_mut().filter(|g| g.behind) {
            let _ = g.tx.send(CacheMsg::Progress(rev));
            g.behind = false;
        }
    }

    fn reset(&self, rev: i64) {
        let mut st = self.lock();
        st.ring.clear();
        st.valid_from = rev;
        st.last_rev = rev;
        st.complete_rev = rev;
        st.ready = false;
        for (_, g) in st.groups.drain() {
            let _ = g.tx.send(CacheMsg::Reset);
        }
        let _ = self.ready_tx.send(false);
    }

    fn start(&self, rev: i64) {
        let mut st = self.lock();
        st.ring.clear();
        st.valid_from = rev;
        st.last_rev = rev;
        st.complete_rev = rev;
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

    /// The cache of `kind`, starting it if needed: from revision `from` when the store
    /// still has it and the changes since would fit in the ring (so the watcher that
    /// starts the cache, and those listing at about the same time, are served by it
    /// rather than by store watches of their own), else from the store's head.
    pub fn get(&self, kind: &'static KindInfo, from: i64) -> Arc<KindCache> {
        let mut map = match self.caches.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if let Some(c) = map.get(kind.plural) {
            return c.clone();
        }
        let cache = Arc::new(KindCache::new(kind, self.capacity));
        map.insert(kind.plural, cache.clone());
        let handle = tokio::spawn(feed(
            self.backend.clone(),
            cache.clone(),
            self.metrics.clone(),
            Some(from),
        ));
        if let Ok(mut t) = self.tasks.lock() {
            t.push(handle.abort_handle());
        }
        cache
    }
}

/// The revision up to which a store watch batch proves every change delivered: its
/// last event's (etcd answers a watch that replays history with the store's current
/// revision in the header while later revisions are still to come; a revision is never
/// split between batches), or, for a progress notification, the batch's revision.
fn complete_up_to(batch: &lattice_store::WatchBatch) -> i64 {
    match batch.events.last() {
        Some(ev) => batch.revision.min(ev.kv.mod_revision),
        None => batch.revision,
    }
}

/// The feeder: one store watch per kind, restarted (with a Reset) when it ends. The
/// first start replays from `from` when that is recent (see [`WatchCaches::get`]).
async fn feed(
    backend: Arc<dyn KvBackend>,
    cache: Arc<KindCache>,
    metrics: Arc<Metrics>,
    mut from: Option<i64>,
) {
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
            // Replaying more than the ring holds would only decode what it drops.
            Ok(r) => match from.take() {
                Some(f) if f >= 0 && f <= r.revision && r.revision - f <= cache.capacity as i64 => {
                    f
                }
                _ => r.revision,
            },
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
            Err(StoreError::Compacted { .. }) => continue, // from the head next time
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
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                _ = tick.tick() => {
                    cache.flush_progress();
                    continue;
                }
            };
            match next {
                Some(Ok(batch)) => {
                    // Each change goes out as soon as it is decoded: a large batch (a
                    // burst of commits) does not hold its first change back until the
                    // last one is decoded.
                    for c in batch.events.iter().filter_map(convert_event) {
                        cache.push(c, &metrics);
                    }
                    cache.progress(complete_up_to(&batch));
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
/// watcher started after them); the last change handed on was `key` at revision `rev`
/// (one transaction can change several keys at one revision, each once); every change
/// for it up to `progress` was handed on (its group's progress messages: a watcher with
/// a narrow filter may have been handed no change for a long time).
#[derive(Debug, Clone)]
pub struct Cursor {
    floor: i64,
    rev: i64,
    key: Bytes,
    progress: i64,
}

impl Cursor {
    fn new(floor: i64) -> Self {
        Cursor {
            floor,
            rev: floor,
            key: Bytes::new(),
            progress: floor,
        }
    }

    fn accept(&mut self, c: &Change) -> bool {
        if c.rev <= self.floor {
            return false;
        }
        self.rev = c.rev;
        self.key = c.key.clone();
        true
    }

    /// Where a watcher that lagged catches up from: its last change's revision minus one
    /// (the rest of that revision may be due), or the progress it was told, if later.
    fn resume_from(&self) -> i64 {
        (self.rev - 1).max(self.floor).max(self.progress)
    }

    /// Drop from a backlog read from [`Cursor::resume_from`] what was already handed on:
    /// the changes of `rev` up to and including `key` (the ring keeps each revision's
    /// changes in order).
    fn skip_delivered(&self, backlog: &mut VecDeque<Arc<Change>>) {
        if self.rev <= self.resume_from() {
            return;
        }
        let delivered = backlog
            .iter()
            .take_while(|c| c.rev == self.rev)
            .position(|c| c.key == self.key);
        if let Some(i) = delivered {
            backlog.drain(..=i);
        }
    }
}

/// Where a watcher's changes come from.
pub enum Source {
    Cache {
        cache: Arc<KindCache>,
        filter: Filter,
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
    /// Open a source delivering every change with revision > `from` that passes
    /// `filter`, and possibly others (the caller still applies the filter).
    pub async fn open(
        caches: &WatchCaches,
        backend: &Arc<dyn KvBackend>,
        kind: &'static KindInfo,
        from: i64,
        filter: Filter,
    ) -> ApiResult<Source> {
        let cache = caches.get(kind, from);
        if cache.wait_ready(Duration::from_secs(5)).await {
            if let Some(sub) = cache.subscribe(from, &filter) {
                return Ok(Source::Cache {
                    cache,
                    filter,
                    backlog: sub.backlog.into(),
                    rx: sub.rx,
                    cursor: Cursor::new(from),
                });
            }
        }
        caches
            .metrics
            .watch_direct
            .get_or_create(&crate::metrics::KindLabel {
                kind: kind.kind.into(),
            })
            .inc();
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
                filter,
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
                            cursor.progress = cursor.progress.max(r);
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
                        let from = cursor.resume_from();
                        match cache.subscribe(from, filter) {
                            Some(sub) => {
                                tracing::debug!(kind = cache.kind.kind, skipped = n, "slow watcher caught up from the ring");
                                let mut b: VecDeque<Arc<Change>> = sub.backlog.into();
                                cursor.skip_delivered(&mut b);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::selectors::LabelSelector;
    use serde_json::json;

    fn kind() -> &'static KindInfo {
        lattice_apis::registry::find_kind("Allocation").expect("Allocation is registered")
    }

    fn key(tenant: &str, name: &str) -> Bytes {
        let mut k = list_prefix(kind(), Some(tenant)).to_vec();
        k.extend_from_slice(name.as_bytes());
        Bytes::from(k)
    }

    fn obj(name: &str, app: &str) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "labels": {"app": app}}}))
    }

    fn put(rev: i64, tenant: &str, name: &str, app: &str, prev: Option<&str>) -> Change {
        Change::new(
            rev,
            key(tenant, name),
            ChangeKind::Put,
            obj(name, app),
            prev.map(|p| obj(name, p)),
        )
    }

    fn web_in(tenant: &str) -> Filter {
        Filter {
            prefix: list_prefix(kind(), Some(tenant)),
            selectors: Selectors {
                labels: LabelSelector::parse("app=web").expect("valid selector"),
                ..Default::default()
            },
        }
    }

    /// What is waiting on a receiver: `(rev, name)` for changes, `(rev, "progress")`.
    fn drain(rx: &mut broadcast::Receiver<CacheMsg>) -> Vec<(i64, String)> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            out.push(match m {
                CacheMsg::Change(c) => (c.rev, c.object["metadata"]["name"].to_string()),
                CacheMsg::Progress(r) => (r, "progress".into()),
                CacheMsg::Reset => (0, "reset".into()),
            });
        }
        out
    }

    #[test]
    fn a_group_is_sent_only_the_changes_its_filter_sees_then_progress() {
        let metrics = Metrics::new();
        let cache = KindCache::new(kind(), 100);
        cache.start(0);
        let mut web = cache.subscribe(0, &web_in("t1")).expect("ready").rx;
        let mut web2 = cache.subscribe(0, &web_in("t1")).expect("ready").rx;
        let all = Filter {
            prefix: list_prefix(kind(), None),
            selectors: Selectors::default(),
        };
        let mut every = cache.subscribe(0, &all).expect("ready").rx;
        assert_eq!(cache.groups(), 2, "equal filters share one group");

        cache.push(put(1, "t1", "x", "web", None), &metrics); // ADDED for web
        cache.push(put(2, "t1", "y", "db", None), &metrics); // never web
        cache.push(put(3, "t2", "z", "web", None), &metrics); // other tenant
        cache.push(put(4, "t1", "x", "db", Some("web")), &metrics); // leaves web: DELETED
        cache.push(put(5, "t1", "y", "db", Some("db")), &metrics); // still not web
        cache.progress(5);

        let seen = drain(&mut web);
        assert_eq!(seen, vec![(1, "\"x\"".into()), (4, "\"x\"".into())]);
        assert_eq!(drain(&mut web2), seen);
        assert_eq!(drain(&mut every).len(), 5);

        // Left out of 2, 3 and 5: the next flush says the cache is complete up to 5;
        // the group that was sent everything hears nothing.
        cache.flush_progress();
        assert_eq!(drain(&mut web), vec![(5, "progress".into())]);
        assert!(drain(&mut every).is_empty());
        cache.flush_progress();
        assert!(drain(&mut web).is_empty(), "one progress per gap");

        // Progress the cache had not seen (an idle store's notification) reaches all.
        cache.progress(9);
        assert_eq!(drain(&mut web), vec![(9, "progress".into())]);
        assert_eq!(drain(&mut every), vec![(9, "progress".into())]);

        // A group is dropped with its last watcher.
        drop((web, web2));
        cache.push(put(10, "t1", "w", "web", None), &metrics);
        assert_eq!(cache.groups(), 1);
        assert_eq!(drain(&mut every), vec![(10, "\"w\"".into())]);
    }

    #[test]
    fn catching_up_skips_exactly_what_was_handed_on() {
        let ring: VecDeque<Arc<Change>> = [
            put(5, "t1", "a", "web", None),
            put(5, "t1", "b", "db", None),
            put(5, "t1", "c", "web", None),
            put(6, "t1", "d", "web", None),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let names = |b: &VecDeque<Arc<Change>>| -> Vec<String> {
            b.iter()
                .map(|c| c.object["metadata"]["name"].to_string())
                .collect()
        };
        // Handed on a, then c (b was filtered out): only d is left.
        let mut cursor = Cursor::new(0);
        assert!(cursor.accept(&ring[0]));
        assert!(cursor.accept(&ring[2]));
        let mut b = ring.clone();
        cursor.skip_delivered(&mut b);
        assert_eq!(names(&b), vec!["\"d\""]);
        // Handed on a only: b and c are still due.
        let mut cursor = Cursor::new(0);
        assert!(cursor.accept(&ring[0]));
        let mut b = ring.clone();
        cursor.skip_delivered(&mut b);
        assert_eq!(names(&b), vec!["\"b\"", "\"c\"", "\"d\""]);
        // Nothing handed on yet: nothing is skipped, and the floor holds.
        let mut cursor = Cursor::new(5);
        let mut b = ring.clone();
        cursor.skip_delivered(&mut b);
        assert_eq!(b.len(), 4);
        assert!(!cursor.accept(&ring[0]));
        assert!(cursor.accept(&ring[3]));
    }

    #[test]
    fn a_replayed_batch_proves_only_what_it_holds() {
        let event = |rev: i64| lattice_store::Event {
            kind: EventType::Put,
            kv: lattice_store::KeyValue {
                key: key("t1", "a"),
                mod_revision: rev,
                ..Default::default()
            },
            prev_kv: None,
        };
        let batch = |revision: i64, events: Vec<lattice_store::Event>| lattice_store::WatchBatch {
            revision,
            events,
        };
        // etcd replaying: header at the current revision 900, events up to 40.
        assert_eq!(complete_up_to(&batch(900, vec![event(12), event(40)])), 40);
        // Live: the header is the events' revision.
        assert_eq!(complete_up_to(&batch(41, vec![event(41)])), 41);
        // Progress notification.
        assert_eq!(complete_up_to(&batch(950, vec![])), 950);
    }

    /// A watcher with a narrow filter is handed few changes; the progress its group is
    /// told moves where it catches up from, so an old last change does not make it fall
    /// out of the ring (410) when it lags.
    #[test]
    fn progress_moves_where_a_lagging_watcher_catches_up_from() {
        let mut cursor = Cursor::new(0);
        assert!(cursor.accept(&put(5, "t1", "a", "web", None)));
        assert_eq!(cursor.resume_from(), 4);
        cursor.progress = 9000;
        assert_eq!(cursor.resume_from(), 9000);
        // Nothing at or below the progress was handed on since: nothing to skip.
        let mut b: VecDeque<Arc<Change>> = [put(9001, "t1", "b", "web", None)]
            .into_iter()
            .map(Arc::new)
            .collect();
        cursor.skip_delivered(&mut b);
        assert_eq!(b.len(), 1);
        // A change after the progress: catch up from just before it, skipping it.
        assert!(cursor.accept(&b[0]));
        assert_eq!(cursor.resume_from(), 9000);
        let mut b2 = b.clone();
        b2.push_back(Arc::new(put(9002, "t1", "c", "web", None)));
        cursor.skip_delivered(&mut b2);
        assert_eq!(b2.len(), 1);
        assert_eq!(b2[0].rev, 9002);
    }

    /// A watcher with a narrow filter that lags after its last change left the ring
    /// catches up from the progress it was told (the changes it lagged on are still in
    /// the ring) instead of ending with 410.
    #[tokio::test]
    async fn a_narrow_watcher_lagging_long_after_its_last_change_catches_up() {
        let metrics = Metrics::new();
        let ring = 2 * GROUP_CHANNEL;
        let cache = Arc::new(KindCache::new(kind(), ring));
        cache.start(0);
        let filter = web_in("t1");
        let sub = cache.subscribe(0, &filter).expect("ready");
        let mut source = Source::Cache {
            cache: cache.clone(),
            filter,
            backlog: sub.backlog.into(),
            rx: sub.rx,
            cursor: Cursor::new(0),
        };
        cache.push(put(1, "t1", "w0", "web", None), &metrics);
        assert!(matches!(source.next().await, Ok(Item::Change(c)) if c.rev == 1));
        // Changes the filter does not see roll revision 1 out of the ring; the group
        // hears how far the cache got.
        let quiet = ring as i64 + 100;
        for rev in 2..=quiet {
            cache.push(put(rev, "t1", &format!("d{rev}"), "db", None), &metrics);
        }
        cache.progress(quiet);
        cache.flush_progress();
        assert!(matches!(source.next().await, Ok(Item::Progress(r)) if r == quiet));
        // Then more matching changes than the group's channel holds, unread: it lags,
        // while the ring still holds all of them.
        let n = GROUP_CHANNEL as i64 + 10;
        for rev in quiet + 1..=quiet + n {
            cache.push(put(rev, "t1", &format!("w{rev}"), "web", None), &metrics);
        }
        let mut got = Vec::new();
        while got.len() < n as usize {
            match source.next().await {
                Ok(Item::Change(c)) => got.push(c.rev),
                Ok(Item::Progress(_)) => {}
                Err(e) => panic!("lagging watcher ended: {e:?}"),
            }
        }
        assert_eq!(got, (quiet + 1..=quiet + n).collect::<Vec<_>>());
    }
}
