//! An in-memory copy of every key under one store prefix, kept current by a watch: what
//! the authorizer's role bindings, API tokens and certificate revocations are read from
//! on every request without a store read. Every API server keeps its own, so a change
//! made through one takes effect on all of them as soon as their watches deliver it
//! (milliseconds on a healthy cluster).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lattice_store::{prefix_end, EventType, KeyRange, KvBackend, RangeRequest, WatchRequest};

/// The keys under a prefix and their values.
pub type Entries = BTreeMap<Bytes, Bytes>;

/// A followed prefix (cheap to clone: clones share the copy).
#[derive(Clone)]
pub struct Follower {
    prefix: Bytes,
    shared: Arc<Shared>,
    started: Arc<OnceLock<()>>,
}

#[derive(Default)]
struct Shared {
    entries: RwLock<Entries>,
    /// Set once the watch has listed everything, cleared while it recovers from an error.
    synced: AtomicBool,
    /// Bumped on every change (and every relist).
    generation: AtomicU64,
    changed: tokio::sync::Notify,
}

impl Follower {
    /// Follows `prefix` once [`start`](Self::start)ed.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: Bytes::from(prefix.into()),
            shared: Arc::default(),
            started: Arc::default(),
        }
    }

    /// The prefix followed.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Starts following (once; later calls do nothing). Needs a tokio runtime. The task
    /// ends when every clone of this follower is gone.
    pub fn start(&self, backend: &Arc<dyn KvBackend>) {
        self.started.get_or_init(|| {
            tokio::spawn(follow(
                self.prefix.clone(),
                Arc::downgrade(&self.shared),
                backend.clone(),
            ));
        });
    }

    /// Whether the copy is complete and current.
    pub fn synced(&self) -> bool {
        self.shared.synced.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for the copy to be complete; whether it is.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.shared.changed.notified();
            if self.synced() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.synced();
            }
        }
    }

    /// Changes so far: a different number means the entries changed.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Reads the entries.
    pub fn read<R>(&self, f: impl FnOnce(&Entries) -> R) -> R {
        let e = self
            .shared
            .entries
            .read()
            .unwrap_or_else(|p| p.into_inner());
        f(&e)
    }

    /// The value of `key` (the whole key, prefix included).
    pub fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.read(|e| e.get(key).cloned())
    }
}

/// List the prefix, then follow it; relist after any error. Ends when the follower is gone.
async fn follow(prefix: Bytes, shared: Weak<Shared>, backend: Arc<dyn KvBackend>) {
    let range = KeyRange::between(prefix.clone(), prefix_end(&prefix));
    let mut backoff = Duration::from_millis(100);
    loop {
        let run = async {
            let listed = backend
                .range(RangeRequest {
                    range: range.clone(),
                    ..Default::default()
                })
                .await?;
            let mut watch = backend
                .watch(WatchRequest {
                    range: range.clone(),
                    start_revision: listed.revision + 1,
                    ..Default::default()
                })
                .await?;
            {
                let Some(s) = shared.upgrade() else {
                    return Ok(());
                };
                *s.entries.write().unwrap_or_else(|p| p.into_inner()) = listed
                    .kvs
                    .into_iter()
                    .map(|kv| (kv.key, kv.value))
                    .collect();
                s.generation.fetch_add(1, Ordering::AcqRel);
                s.synced.store(true, Ordering::Release);
                s.changed.notify_waiters();
            }
            while let Some(batch) = watch.next().await {
                let batch = batch?;
                let Some(s) = shared.upgrade() else {
                    return Ok(());
                };
                {
                    let mut e = s.entries.write().unwrap_or_else(|p| p.into_inner());
                    for ev in batch.events {
                        match ev.kind {
                            EventType::Put => e.insert(ev.kv.key, ev.kv.value),
                            EventType::Delete => e.remove(&ev.kv.key),
                        };
                    }
                }
                s.generation.fetch_add(1, Ordering::AcqRel);
                s.changed.notify_waiters();
            }
            Ok::<(), lattice_store::StoreError>(())
        };
        let result = run.await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        match result {
            Ok(()) => {
                tracing::debug!(prefix = %String::from_utf8_lossy(&prefix), "store watch ended; relisting")
            }
            Err(e) => {
                tracing::warn!(prefix = %String::from_utf8_lossy(&prefix), error = %e, "following the store failed; relisting")
            }
        }
        // While the copy may be stale, readers fall back to the store (or wait).
        s.synced.store(false, Ordering::Release);
        drop(s);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
