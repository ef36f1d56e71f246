//! `scheduler`: the work queue behind every controller.
//!
//! * **De-duplicates**: a key is queued at most once; adding it again only moves its
//!   due time earlier.
//! * **Exclusive**: a key being reconciled is never handed out again until
//!   [`WorkQueue::done`]; triggers that arrive meanwhile are remembered and the key
//!   runs once more afterwards (nothing is lost, nothing runs twice at once).
//! * **Bounded**: at most `concurrency` keys are out at once (0 = unbounded).
//! * **Requeue-after** and **per-key exponential backoff**: a failure delays the key
//!   by [`Backoff::RECONCILE`] (1 s → 5 min) per consecutive failure, and triggers
//!   that arrive during the backoff do not cut it short — a controller failing on an
//!   object it keeps changing cannot hot-loop. A success resets the count. The count
//!   is handed to the error policy with each ticket.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use lattice_runtime::scheduler::{Outcome, QueueConfig, WorkQueue};
//!
//! let q = WorkQueue::new(QueueConfig::default());
//! q.add("a");
//! q.add("a"); // de-duplicated
//! let t = q.next().await.expect("open");
//! assert_eq!((t.key, t.failures), ("a", 0));
//! q.add("a"); // while running: runs again after done
//! q.done(&"a", Outcome::Failure { retry_after: None });
//! assert_eq!(q.failures(&"a"), 1);
//! assert_eq!(q.len(), 1);
//! # }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backoff::Backoff;

/// Queue settings.
#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    /// Most keys out at once; 0 = unbounded.
    pub concurrency: usize,
    /// Per-key retry backoff.
    pub backoff: Backoff,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            concurrency: 16,
            backoff: Backoff::RECONCILE,
        }
    }
}

/// A key handed out by [`WorkQueue::next`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket<T> {
    /// The key.
    pub key: T,
    /// Consecutive failures before this run.
    pub failures: u32,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Success: reset the failure count; run again after `requeue_after` if set.
    Success {
        /// Run again after this long.
        requeue_after: Option<Duration>,
    },
    /// Failure: count it and retry after `retry_after`, or after the backoff when
    /// `None`.
    Failure {
        /// Overrides the backoff.
        retry_after: Option<Duration>,
    },
    /// Failure, but do not retry (only a new trigger runs it again); still counted.
    FailureNoRetry,
}

struct State<T> {
    /// Due time → key, ordered; `seq` keeps equal times FIFO.
    queue: BTreeMap<(Instant, u64), T>,
    /// Key → its slot in `queue`.
    slots: HashMap<T, (Instant, u64)>,
    running: HashSet<T>,
    /// Triggered while running: when to run again after `done`.
    rerun: HashMap<T, Instant>,
    failures: HashMap<T, u32>,
    /// A failed key may not run before this, whatever triggers it.
    not_before: HashMap<T, Instant>,
    seq: u64,
    closed: bool,
}

/// A de-duplicating, exclusive, rate-limited delay queue. Cheap to clone.
pub struct WorkQueue<T> {
    state: Arc<Mutex<State<T>>>,
    notify: Arc<Notify>,
    config: QueueConfig,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            notify: self.notify.clone(),
            config: self.config,
        }
    }
}

impl<T: Clone + Eq + Hash + Send + 'static> WorkQueue<T> {
    /// An empty queue.
    pub fn new(config: QueueConfig) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                queue: BTreeMap::new(),
                slots: HashMap::new(),
                running: HashSet::new(),
                rerun: HashMap::new(),
                failures: HashMap::new(),
                not_before: HashMap::new(),
                seq: 0,
                closed: false,
            })),
            notify: Arc::new(Notify::new()),
            config,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `key` now.
    pub fn add(&self, key: T) {
        self.add_at(key, Instant::now());
    }

    /// Queue `key` after `delay` (an earlier due time already queued wins).
    pub fn add_after(&self, key: T, delay: Duration) {
        self.add_at(key, Instant::now() + delay);
    }

    fn add_at(&self, key: T, at: Instant) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let at = match st.not_before.get(&key) {
            Some(nb) if *nb > at => *nb,
            _ => at,
        };
        Self::schedule(&mut st, key, at);
        drop(st);
        self.notify.notify_one();
    }

    fn schedule(st: &mut State<T>, key: T, at: Instant) {
        if st.running.contains(&key) {
            let e = st.rerun.entry(key).or_insert(at);
            if at < *e {
                *e = at;
            }
            return;
        }
        if let Some(slot) = st.slots.get(&key).copied() {
            if slot.0 <= at {
                return;
            }
            st.queue.remove(&slot);
        }
        st.seq += 1;
        let slot = (at, st.seq);
        st.queue.insert(slot, key.clone());
        st.slots.insert(key, slot);
    }

    /// The next due key, waiting as needed; `None` once the queue is closed.
    pub async fn next(&self) -> Option<Ticket<T>> {
        loop {
            let wait = {
                let mut st = self.lock();
                if st.closed {
                    return None;
                }
                let room =
                    self.config.concurrency == 0 || st.running.len() < self.config.concurrency;
                match st.queue.first_key_value().map(|(slot, _)| *slot) {
                    Some(slot) if room => {
                        if slot.0 <= Instant::now() {
                            if let Some(key) = st.queue.remove(&slot) {
                                st.slots.remove(&key);
                                st.running.insert(key.clone());
                                let failures = st.failures.get(&key).copied().unwrap_or(0);
                                return Some(Ticket { key, failures });
                            }
                            continue;
                        }
                        Some(slot.0)
                    }
                    _ => None,
                }
            };
            match wait {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.notify.notified() => {}
                    }
                }
                None => self.notify.notified().await,
            }
        }
    }

    /// Report how the run of `key` ended; returns when it will run next, if scheduled.
    pub fn done(&self, key: &T, outcome: Outcome) -> Option<Duration> {
        let mut st = self.lock();
        st.running.remove(key);
        let now = Instant::now();
        let rerun = st.rerun.remove(key);
        let next = match outcome {
            Outcome::Success { requeue_after } => {
                st.failures.remove(key);
                st.not_before.remove(key);
                let after = requeue_after.map(|d| now + d);
                match (after, rerun) {
                    (Some(a), Some(r)) => Some(a.min(r)),
                    (a, r) => a.or(r),
                }
            }
            Outcome::Failure { retry_after } => {
                let n = {
                    let f = st.failures.entry(key.clone()).or_insert(0);
                    *f = f.saturating_add(1);
                    *f
                };
                let at = now + retry_after.unwrap_or_else(|| self.config.backoff.delay(n));
                st.not_before.insert(key.clone(), at);
                // A trigger that came in meanwhile waits for the backoff too.
                Some(at)
            }
            Outcome::FailureNoRetry => {
                let f = st.failures.entry(key.clone()).or_insert(0);
                *f = f.saturating_add(1);
                rerun
            }
        };
        if let Some(at) = next {
            Self::schedule(&mut st, key.clone(), at);
        }
        drop(st);
        // Room for another key, or a new due time.
        self.notify.notify_one();
        next.map(|at| at.saturating_duration_since(now))
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &T) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting (queued, or triggered while running).
    pub fn len(&self) -> usize {
        let st = self.lock();
        st.queue.len() + st.rerun.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys being run now.
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// Forget everything about `key`'s failures (e.g. the object was deleted).
    pub fn forget(&self, key: &T) {
        let mut st = self.lock();
        st.failures.remove(key);
        st.not_before.remove(key);
    }

    /// Stop handing out keys; `next` returns `None` from now on.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}
