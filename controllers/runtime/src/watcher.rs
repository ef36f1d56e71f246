//! `watcher`: a stream of a kind's objects that lists, then watches, and never ends.
//!
//! * Lists page by page, then watches from the list's resourceVersion.
//! * Resumes a dropped watch from the last resourceVersion seen (events and bookmarks).
//! * Relists when the server answers 410 (the resourceVersion was compacted).
//! * Backs off with jitter between failed attempts (800 ms → 30 s, reset after 120 s
//!   healthy) — built in, not opt-in.
//! * Errors never come out of the stream (a `try_for_each` cannot end it); they go to
//!   `tracing` and to the [`Health`] on [`Watcher::health`].
//!
//! ```no_run
//! # async fn demo(client: lattice_runtime::Client) {
//! use futures::StreamExt;
//! use lattice_apis::Allocation;
//! use lattice_runtime::{watcher, Api};
//!
//! let api: Api<Allocation> = Api::all(client);
//! let mut w = watcher::watcher(api, watcher::Config::default());
//! while let Some(ev) = w.next().await {
//!     if let watcher::Event::Apply(a) = ev {
//!         println!("{} changed", a.metadata.name_str());
//!     }
//! }
//! # }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use lattice_apis::Resource;
use rand::Rng;
use tokio::sync::{mpsc, watch};

use crate::api::{Api, WatchEvent};
use crate::backoff::{Backoff, BackoffState};
use crate::client::{ListParams, WatchParams};
use crate::resource::ResourceExt;

/// What the watcher tells its consumer.
#[derive(Clone, Debug, PartialEq)]
pub enum Event<K> {
    /// A (re)list starts: the objects that follow until `InitDone` are the whole state.
    Init,
    /// An object of the (re)list.
    InitApply(K),
    /// The (re)list is complete; objects not seen since `Init` are gone.
    InitDone,
    /// Created or changed.
    Apply(K),
    /// Deleted.
    Delete(K),
}

/// Watcher settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Label selector.
    pub label_selector: Option<String>,
    /// Field selector.
    pub field_selector: Option<String>,
    /// List page size.
    pub page_size: u32,
    /// Server-side watch lifetime; each watch picks a random value in [t, 2t) so
    /// that many watchers do not reconnect at once.
    pub timeout: Duration,
    /// Ask for bookmarks (cheap resumes after quiet periods).
    pub bookmarks: bool,
    /// Reconnect backoff.
    pub backoff: Backoff,
    /// A watch silent for this long (no event, no bookmark) is presumed dead — a
    /// half-open connection to a crashed server — and resumed from the last
    /// resourceVersion. Servers send bookmarks every few seconds, so only a dead
    /// stream trips it.
    pub idle_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            label_selector: None,
            field_selector: None,
            page_size: 500,
            timeout: Duration::from_secs(290),
            bookmarks: true,
            backoff: Backoff::WATCH,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl Config {
    /// Only objects matching this label selector.
    pub fn labels(mut self, s: &str) -> Self {
        self.label_selector = Some(s.to_string());
        self
    }
    /// Only objects matching this field selector.
    pub fn fields(mut self, s: &str) -> Self {
        self.field_selector = Some(s.to_string());
        self
    }
}

/// Where the watcher is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not started yet.
    Starting,
    /// Listing.
    Listing,
    /// Watching: healthy.
    Watching,
    /// Waiting before the next attempt after a failure.
    BackingOff,
}

/// The watcher's health, published on a `tokio::sync::watch` channel.
#[derive(Clone, Debug)]
pub struct Health {
    /// Current phase.
    pub phase: Phase,
    /// Last resourceVersion seen.
    pub resource_version: Option<String>,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// The last failure.
    pub last_error: Option<String>,
    /// Completed lists (1 = the initial one; more = relists).
    pub lists: u64,
    /// Watches opened.
    pub watches: u64,
    /// When the phase last changed.
    pub since: Instant,
}

impl Health {
    fn new() -> Self {
        Self {
            phase: Phase::Starting,
            resource_version: None,
            consecutive_failures: 0,
            last_error: None,
            lists: 0,
            watches: 0,
            since: Instant::now(),
        }
    }

    /// Watching with no pending failure.
    pub fn is_healthy(&self) -> bool {
        self.phase == Phase::Watching
    }
}

/// The stream returned by [`watcher`]. Dropping it stops the watch.
pub struct Watcher<K> {
    rx: mpsc::Receiver<Event<K>>,
    health: watch::Receiver<Health>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Drop for Watcher<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Watcher<K> {
    /// The watcher's health.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }
}

impl<K> Stream for Watcher<K> {
    type Item = Event<K>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event<K>>> {
        self.rx.poll_recv(cx)
    }
}

/// Start watching `api` (must be called inside a tokio runtime).
pub fn watcher<K: Resource + Send + Sync + 'static>(api: Api<K>, config: Config) -> Watcher<K> {
    let (tx, rx) = mpsc::channel(1024);
    let (health_tx, health) = watch::channel(Health::new());
    let task = tokio::spawn(run(api, config, tx, health_tx));
    Watcher { rx, health, task }
}

/// Why a list or watch attempt ended.
enum Stop {
    /// The consumer is gone.
    Closed,
    /// 410: the resourceVersion is gone; relist.
    Gone(String),
    /// Anything else: back off and retry.
    Failed(String),
}

struct Run<K: Resource + Send + Sync + 'static> {
    api: Api<K>,
    config: Config,
    tx: mpsc::Sender<Event<K>>,
    health: watch::Sender<Health>,
    backoff: BackoffState,
}

impl<K: Resource + Send + Sync + 'static> Run<K> {
    fn set_phase(&self, phase: Phase) {
        self.health.send_modify(|h| {
            if h.phase != phase {
                h.phase = phase;
                h.since = Instant::now();
            }
        });
    }

    fn set_rv(&self, rv: &Option<String>) {
        self.health
            .send_modify(|h| h.resource_version.clone_from(rv));
    }

    async fn send(&self, ev: Event<K>) -> Result<(), Stop> {
        self.tx.send(ev).await.map_err(|_| Stop::Closed)
    }

    /// List every page; returns the list's resourceVersion.
    async fn list(&mut self) -> Result<String, Stop> {
        self.set_phase(Phase::Listing);
        let mut params = ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            limit: Some(self.config.page_size),
            continue_token: None,
        };
        let mut rv = None;
        let mut first = true;
        loop {
            let page = match self.api.list(&params).await {
                Ok(p) => p,
                Err(e) if e.is_gone() => return Err(Stop::Gone(e.to_string())),
                Err(e) => return Err(Stop::Failed(e.to_string())),
            };
            if first {
                // Only announce the relist once its first page is in hand, so a failed
                // list leaves the consumer's view untouched.
                self.send(Event::Init).await?;
                first = false;
            }
            if rv.is_none() {
                rv = Some(page.resource_version.clone());
            }
            for obj in page.items {
                self.send(Event::InitApply(obj)).await?;
            }
            match page.continue_token {
                Some(c) => params.continue_token = Some(c),
                None => break,
            }
        }
        // Counted before InitDone goes out: a consumer that saw InitDone sees the count.
        self.health.send_modify(|h| h.lists += 1);
        self.send(Event::InitDone).await?;
        Ok(rv.unwrap_or_default())
    }

    /// Watch from `rv` until the stream ends or fails; keeps `rv` current.
    async fn watch(&mut self, rv: &mut Option<String>) -> Result<(), Stop> {
        let timeout = {
            let t = self.config.timeout.as_secs_f64().max(1.0);
            Duration::from_secs_f64(rand::thread_rng().gen_range(t..2.0 * t))
        };
        let params = WatchParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            resource_version: rv.clone().unwrap_or_default(),
            bookmarks: self.config.bookmarks,
            timeout: Some(timeout),
        };
        let mut stream = match self.api.watch(&params).await {
            Ok(s) => s,
            Err(e) if e.is_gone() => return Err(Stop::Gone(e.to_string())),
            Err(e) => return Err(Stop::Failed(e.to_string())),
        };
        self.health.send_modify(|h| {
            h.watches += 1;
            h.consecutive_failures = 0;
        });
        self.set_phase(Phase::Watching);
        self.backoff.healthy();
        loop {
            let item = match tokio::time::timeout(self.config.idle_timeout, stream.next()).await {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(_) => {
                    tracing::info!(kind = K::KIND, "watch idle too long; resuming");
                    break;
                }
            };
            match item {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                    *rv = o.resource_version().map(str::to_string).or(rv.take());
                    self.send(Event::Apply(o)).await?;
                }
                Ok(WatchEvent::Deleted(o)) => {
                    *rv = o.resource_version().map(str::to_string).or(rv.take());
                    self.send(Event::Delete(o)).await?;
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    if !b.is_empty() {
                        *rv = Some(b);
                    }
                }
                Ok(WatchEvent::Error(e)) if e.code == 410 => return Err(Stop::Gone(e.to_string())),
                Ok(WatchEvent::Error(e)) => return Err(Stop::Failed(e.to_string())),
                // An undecodable object: skip it (its resourceVersion is unknown, so a
                // resume may deliver it again, which is harmless).
                Err(e @ crate::Error::Decode { .. }) => {
                    tracing::warn!(kind = K::KIND, error = %e, "watch: skipping an object that does not decode");
                }
                Err(e) => return Err(Stop::Failed(e.to_string())),
            }
            self.set_rv(rv);
        }
        Ok(())
    }

    async fn fail(&mut self, why: String, relist: bool) {
        // A 410 after a healthy run relists at once; repeated failures back off.
        let first_gone = relist && self.backoff.attempts() == 0;
        let delay = self.backoff.failure();
        let delay = if first_gone { Duration::ZERO } else { delay };
        tracing::warn!(kind = K::KIND, error = %why, retry_in_ms = delay.as_millis() as u64, relist, "watcher failure");
        self.health.send_modify(|h| {
            h.consecutive_failures += 1;
            h.last_error = Some(why);
        });
        if !delay.is_zero() {
            self.set_phase(Phase::BackingOff);
            tokio::time::sleep(delay).await;
        }
    }
}

async fn run<K: Resource + Send + Sync + 'static>(
    api: Api<K>,
    config: Config,
    tx: mpsc::Sender<Event<K>>,
    health: watch::Sender<Health>,
) {
    let backoff = BackoffState::new(config.backoff);
    let mut r = Run {
        api,
        config,
        tx,
        health,
        backoff,
    };
    let mut rv: Option<String> = None;
    loop {
        if rv.is_none() {
            match r.list().await {
                Ok(v) => {
                    rv = Some(v);
                    r.set_rv(&rv);
                }
                Err(Stop::Closed) => return,
                Err(Stop::Gone(e) | Stop::Failed(e)) => {
                    r.fail(e, false).await;
                    continue;
                }
            }
        }
        let started = Instant::now();
        match r.watch(&mut rv).await {
            Ok(()) => {
                // The server ended the watch (timeout): resume from rv. An immediate end
                // is suspicious (a proxy cutting connections): back off.
                if started.elapsed() < Duration::from_secs(1) {
                    r.fail("watch ended immediately".into(), false).await;
                } else {
                    tracing::debug!(kind = K::KIND, rv = ?rv, "watch ended; resuming");
                }
            }
            Err(Stop::Closed) => return,
            Err(Stop::Gone(e)) => {
                tracing::info!(kind = K::KIND, error = %e, "resourceVersion expired; relisting");
                rv = None;
                r.fail(e, true).await;
            }
            Err(Stop::Failed(e)) => r.fail(e, false).await,
        }
    }
}
