//! `controller`: the builder that glues informers, the work queue and a reconciler.
//!
//! * `Controller::new(&factory)` — the primary kind `K` (`for`), from a shared informer.
//! * [`owns`](Controller::owns) — children whose *controller* owner reference points at
//!   a `K` trigger that `K`.
//! * [`watches`](Controller::watches) — any other kind, mapped to keys by a function.
//! * [`trigger`](Controller::trigger), [`reconcile_all_on`](Controller::reconcile_all_on)
//!   — extra trigger streams; [`resync_every`](Controller::resync_every) — periodic,
//!   jittered reconcile of everything (default 10 min).
//! * The work queue ([`crate::scheduler`]) de-duplicates, never runs a key twice at
//!   once, caps concurrency, honours requeue-after and backs off per key.
//! * Level-triggered: the reconciler gets the **latest cached object** when its turn
//!   comes, never an event payload. A key whose object is gone is a successful no-op
//!   (with an optional [`on_deleted`](Controller::on_deleted) hook), not an error.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lattice_apis::{Allocation, ObjectMeta};
//! use lattice_runtime::{Action, Api, Client, Controller, InformerFactory, PostParams};
//!
//! let dir = tempfile::tempdir()?;
//! let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default()).await?;
//! let client = lattice_apiserver::in_process::client(Arc::new(store));
//! let factory = InformerFactory::new(client.clone());
//!
//! let api: Api<Allocation> = Api::namespaced(client.clone(), "ml-team");
//! let mut a = Allocation::default();
//! a.metadata = ObjectMeta::named("hello", Some("ml-team"));
//! a.spec.entrypoint = Some("/bin/true".into());
//! api.create(&PostParams::default(), &a).await?;
//!
//! let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
//! let controller = Controller::<Allocation>::new(&factory).name("demo");
//! tokio::spawn(controller.run(
//!     |a: Arc<Allocation>, tx: Arc<tokio::sync::mpsc::UnboundedSender<String>>| async move {
//!         let _ = tx.send(a.metadata.name_str().to_string());
//!         Ok::<_, std::convert::Infallible>(Action::await_change())
//!     },
//!     Arc::new(seen_tx),
//! ));
//! assert_eq!(seen.recv().await.as_deref(), Some("hello"));
//! # Ok(()) }
//! ```

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use lattice_apis::Resource;
use rand::Rng;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;

use crate::backoff::Backoff;
use crate::informer::{InformerEvent, InformerFactory, InformerParams, SharedInformer};
use crate::metrics::RuntimeMetrics;
use crate::resource::{ObjectRef, ResourceExt};
use crate::scheduler::{Outcome, QueueConfig, WorkQueue};

/// What the reconciler wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Run again after `d` even if nothing changes.
    pub fn requeue(d: Duration) -> Self {
        Self {
            requeue_after: Some(d),
        }
    }

    /// Run again only when something changes.
    pub fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// The requeue delay, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// What the error policy learns about a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorContext {
    /// Consecutive failures of this key, this one included (1 = first failure).
    pub failures: u32,
    /// The per-key exponential backoff for this many failures.
    pub backoff: Duration,
}

impl ErrorContext {
    /// Retry after the per-key backoff (the default policy).
    pub fn backoff(&self) -> Action {
        Action::requeue(self.backoff)
    }
}

/// Controller settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Name in logs and metrics.
    pub name: String,
    /// Most reconciles at once.
    pub concurrency: usize,
    /// Reconcile everything this often (±10 % jitter); `None`: never.
    pub resync: Option<Duration>,
    /// Per-key retry backoff.
    pub backoff: Backoff,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: "controller".into(),
            concurrency: 16,
            resync: Some(Duration::from_secs(600)),
            backoff: Backoff::RECONCILE,
        }
    }
}

type TriggerFn = Box<dyn FnOnce(WorkQueue<ObjectRef>) -> BoxFuture<'static, ()> + Send>;
type Predicate<K> = Arc<dyn Fn(&K) -> Option<u64> + Send + Sync>;
type Filter<K> = Arc<std::sync::OnceLock<Box<dyn Fn(&K) -> bool + Send + Sync>>>;
/// Last predicate value per object.
type Memo = Arc<Mutex<std::collections::HashMap<ObjectRef, u64>>>;

/// Predicates for [`Controller::predicate`]: a value per object; a change event whose
/// value equals the last one seen for that object is dropped.
pub mod predicates {
    use std::hash::{Hash, Hasher};

    use lattice_apis::Resource;

    use crate::resource::ResourceExt;

    fn hash(v: impl Hash) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    }

    /// Spec changes (`metadata.generation`), plus deletion requests and finalizer
    /// changes (which do not bump the generation but a finalizer-driven controller
    /// must see). Skips status-only and label/annotation-only updates.
    pub fn generation<K: Resource>(obj: &K) -> Option<u64> {
        Some(hash((
            obj.generation(),
            obj.is_deleting(),
            obj.finalizers(),
        )))
    }

    /// Label changes.
    pub fn labels<K: Resource>(obj: &K) -> Option<u64> {
        Some(hash(obj.labels()))
    }

    /// Annotation changes.
    pub fn annotations<K: Resource>(obj: &K) -> Option<u64> {
        Some(hash(&obj.metadata().annotations))
    }
}
type SyncGate = BoxFuture<'static, ()>;
type OnDeleted = Arc<dyn Fn(ObjectRef) -> BoxFuture<'static, ()> + Send + Sync>;

/// Forward an informer's changes to the queue through `map`. Subscribes at once (not
/// when first polled), so nothing between building and running is missed; a lagging
/// subscriber resyncs everything from the cache.
fn forward<O, F>(inf: SharedInformer<O>, map: F) -> TriggerFn
where
    O: Resource + Send + Sync + 'static,
    F: Fn(&InformerEvent<O>) -> Vec<ObjectRef> + Send + Sync + 'static,
{
    let mut rx = inf.subscribe();
    let store = inf.store();
    Box::new(move |q: WorkQueue<ObjectRef>| {
        async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        for r in map(&ev) {
                            q.add(r);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(
                            kind = O::KIND,
                            skipped = n,
                            "trigger lagged; resyncing from the cache"
                        );
                        for o in store.state() {
                            for r in map(&InformerEvent::Applied(o)) {
                                q.add(r);
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
        .boxed()
    })
}

/// Refs of the cached primaries `filter` accepts (all of them without one).
fn primary_refs<K: Resource + Send + Sync + 'static>(
    store: &crate::reflector::Store<K>,
    filter: &Filter<K>,
) -> Vec<ObjectRef> {
    match filter.get() {
        None => store.refs(),
        Some(f) => store
            .state()
            .into_iter()
            .filter(|o| f(o))
            .map(|o| o.object_ref())
            .collect(),
    }
}

fn sync_gate<O: Resource + Send + Sync + 'static>(inf: &SharedInformer<O>) -> SyncGate {
    let store = inf.store();
    async move { store.wait_until_synced().await }.boxed()
}

/// A controller for kind `K`; see the [module docs](self).
pub struct Controller<K> {
    config: Config,
    informer: SharedInformer<K>,
    factory: InformerFactory,
    triggers: Vec<TriggerFn>,
    gates: Vec<SyncGate>,
    metrics: Arc<RuntimeMetrics>,
    on_deleted: Option<OnDeleted>,
    shutdown: Option<BoxFuture<'static, ()>>,
    ready: Arc<watch::Sender<bool>>,
    predicate: Arc<Mutex<Option<Predicate<K>>>>,
    memo: Memo,
    filter: Filter<K>,
}

impl<K: Resource + Send + Sync + 'static> Controller<K> {
    /// A controller of every `K` in every tenant.
    pub fn new(factory: &InformerFactory) -> Self {
        Self::with_params(factory, &InformerParams::default())
    }

    /// A controller of the `K`s `params` selects.
    pub fn with_params(factory: &InformerFactory, params: &InformerParams) -> Self {
        let informer = factory.informer::<K>(params);
        let predicate: Arc<Mutex<Option<Predicate<K>>>> = Arc::new(Mutex::new(None));
        let memo: Memo = Arc::default();
        let filter: Filter<K> = Arc::default();
        let seen = memo.clone();
        let pred = predicate.clone();
        let only = filter.clone();
        let primary = forward(informer.clone(), move |ev: &InformerEvent<K>| {
            let r = ev.object().object_ref();
            let p = pred.lock().ok().and_then(|g| g.clone());
            if only.get().is_some_and(|f| !f(ev.object())) {
                // Refused: forget its predicate value, so that an object accepted again
                // later is compared with nothing (and nothing stays behind for it).
                if p.is_some() {
                    seen.lock().unwrap_or_else(|e| e.into_inner()).remove(&r);
                }
                return Vec::new();
            }
            if let Some(p) = p {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                match ev {
                    InformerEvent::Deleted(_) => {
                        seen.remove(&r);
                    }
                    InformerEvent::Applied(o) => {
                        if let Some(v) = p(o) {
                            if seen.insert(r.clone(), v) == Some(v) {
                                return Vec::new();
                            }
                        }
                    }
                }
            }
            vec![r]
        });
        let gates = vec![sync_gate(&informer)];
        Self {
            config: Config::default(),
            informer,
            factory: factory.clone(),
            triggers: vec![primary],
            gates,
            metrics: Arc::new(RuntimeMetrics::new()),
            on_deleted: None,
            shutdown: None,
            ready: Arc::new(watch::channel(false).0),
            predicate,
            memo,
            filter,
        }
    }

    /// Name in logs and metrics.
    pub fn name(mut self, name: &str) -> Self {
        self.config.name = name.to_string();
        self
    }

    /// Replace the whole config.
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Most reconciles at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Reconcile everything this often (jittered); `None` disables.
    pub fn resync_every(mut self, every: Option<Duration>) -> Self {
        self.config.resync = every;
        self
    }

    /// Per-key retry backoff.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.config.backoff = b;
        self
    }

    /// Report into these metric families (a host shares one set).
    pub fn metrics(mut self, m: Arc<RuntimeMetrics>) -> Self {
        self.metrics = m;
        self
    }

    /// Drop primary change events whose `predicate` value did not change (e.g.
    /// [`predicates::generation`] skips status-only updates). Resyncs, triggers and
    /// related kinds still reconcile.
    pub fn predicate(self, predicate: impl Fn(&K) -> Option<u64> + Send + Sync + 'static) -> Self {
        if let Ok(mut g) = self.predicate.lock() {
            *g = Some(Arc::new(predicate));
        }
        self
    }

    /// Only the `K`s `filter` accepts are this controller's primaries: their change and
    /// deletion events (judged on the new, or the last known, state) enqueue them, and
    /// the start-up pass and resyncs include only them. Triggers from owned and watched
    /// kinds still enqueue whatever they map to. For controllers that care about a few
    /// objects of a busy kind (controller-runtime's event filters): the reconcile of an
    /// object the filter refuses must be a no-op, since it is never called for one. Set
    /// once; a second call is ignored.
    pub fn filter(self, filter: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        if self.filter.set(Box::new(filter)).is_err() {
            tracing::warn!(controller = %self.config.name, "a controller's filter is set once; ignoring the second");
        }
        self
    }

    /// Children of kind `C` whose controller owner reference names a `K` trigger it.
    pub fn owns<C: Resource + Send + Sync + 'static>(self) -> Self {
        self.owns_with::<C>(&InformerParams::default())
    }

    /// [`owns`](Self::owns), following only the `C`s `params` selects.
    pub fn owns_with<C: Resource + Send + Sync + 'static>(
        mut self,
        params: &InformerParams,
    ) -> Self {
        let inf = self.factory.informer::<C>(params);
        self.gates.push(sync_gate(&inf));
        self.triggers.push(forward(inf, |ev: &InformerEvent<C>| {
            let child = ev.object();
            child
                .controller_owner()
                .filter(|o| o.kind == K::KIND)
                .map(|o| vec![ObjectRef::from_owner(o, child.namespace())])
                .unwrap_or_default()
        }));
        self
    }

    /// Objects of kind `O` trigger the `K`s `mapper` names (on change and deletion).
    pub fn watches<O, F>(mut self, params: &InformerParams, mapper: F) -> Self
    where
        O: Resource + Send + Sync + 'static,
        F: Fn(&O) -> Vec<ObjectRef> + Send + Sync + 'static,
    {
        let inf = self.factory.informer::<O>(params);
        self.gates.push(sync_gate(&inf));
        self.triggers
            .push(forward(inf, move |ev: &InformerEvent<O>| {
                mapper(ev.object())
            }));
        self
    }

    /// Like [`watches`](Self::watches), with the event (to act on deletions only).
    pub fn watches_events<O, F>(mut self, params: &InformerParams, mapper: F) -> Self
    where
        O: Resource + Send + Sync + 'static,
        F: Fn(&InformerEvent<O>) -> Vec<ObjectRef> + Send + Sync + 'static,
    {
        let inf = self.factory.informer::<O>(params);
        self.gates.push(sync_gate(&inf));
        self.triggers.push(forward(inf, mapper));
        self
    }

    /// Every key this stream yields is reconciled.
    pub fn trigger<S>(mut self, stream: S) -> Self
    where
        S: Stream<Item = ObjectRef> + Send + 'static,
    {
        self.triggers.push(Box::new(move |q: WorkQueue<ObjectRef>| {
            stream
                .for_each(move |r| {
                    q.add(r);
                    futures::future::ready(())
                })
                .boxed()
        }));
        self
    }

    /// Each item of this stream reconciles every cached `K`.
    pub fn reconcile_all_on<S>(mut self, stream: S) -> Self
    where
        S: Stream<Item = ()> + Send + 'static,
    {
        let store = self.informer.store();
        let filter = self.filter.clone();
        self.triggers.push(Box::new(move |q: WorkQueue<ObjectRef>| {
            stream
                .for_each(move |()| {
                    for r in primary_refs(&store, &filter) {
                        q.add(r);
                    }
                    futures::future::ready(())
                })
                .boxed()
        }));
        self
    }

    /// Called (instead of the reconciler) for a key whose object is gone.
    pub fn on_deleted<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(ObjectRef) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.on_deleted = Some(Arc::new(move |r| hook(r).boxed()));
        self
    }

    /// Stop (after in-flight reconciles finish) when `fut` resolves.
    pub fn graceful_shutdown_on<F: Future<Output = ()> + Send + 'static>(mut self, fut: F) -> Self {
        self.shutdown = Some(fut.boxed());
        self
    }

    /// The primary informer's cache.
    pub fn store(&self) -> crate::reflector::Store<K> {
        self.informer.store()
    }

    /// Report readiness into this sender (a host shares one per controller).
    pub fn ready_sender(mut self, tx: Arc<watch::Sender<bool>>) -> Self {
        self.ready = tx;
        self
    }

    /// `true` once every informer this controller uses has synced and it runs.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Run with the default error policy (retry after the per-key backoff).
    pub async fn run<Ctx, E, R, Fut>(self, reconcile: R, ctx: Arc<Ctx>)
    where
        Ctx: Send + Sync + 'static,
        E: Display + Send + 'static,
        R: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        self.run_with_error_policy(
            reconcile,
            |_, _: &E, e: &ErrorContext, _: &Ctx| e.backoff(),
            ctx,
        )
        .await;
    }

    /// Run until the shutdown future (if any) resolves. `error_policy` decides the
    /// retry of a failed reconcile: [`ErrorContext::backoff`] is the default, an
    /// explicit [`Action::requeue`] overrides it, [`Action::await_change`] waits for a
    /// change.
    pub async fn run_with_error_policy<Ctx, E, R, Fut, P>(
        self,
        reconcile: R,
        error_policy: P,
        ctx: Arc<Ctx>,
    ) where
        Ctx: Send + Sync + 'static,
        E: Display + Send + 'static,
        R: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(Arc<K>, &E, &ErrorContext, &Ctx) -> Action + Send + Sync + 'static,
    {
        let Controller {
            config,
            informer,
            factory: _,
            triggers,
            gates,
            metrics,
            on_deleted,
            shutdown,
            ready,
            predicate,
            memo,
            filter,
        } = self;
        let primaries = |store: &crate::reflector::Store<K>| primary_refs(store, &filter);
        let name = config.name.clone();
        let label = RuntimeMetrics::label(&name);
        let queue = WorkQueue::<ObjectRef>::new(QueueConfig {
            concurrency: config.concurrency,
            backoff: config.backoff,
        });
        let mut shutdown = shutdown.unwrap_or_else(|| futures::future::pending().boxed());
        let mut trigger_tasks = JoinSet::new();
        for t in triggers {
            trigger_tasks.spawn(t(queue.clone()));
        }
        let store = informer.store();
        tokio::select! {
            _ = futures::future::join_all(gates) => {}
            _ = &mut shutdown => return,
        }
        // The initial list is not broadcast, so seed the predicate's memory from the
        // synced cache: the first change after it is compared with the listed state.
        if let Some(p) = predicate.lock().ok().and_then(|g| g.clone()) {
            let mut m = memo.lock().unwrap_or_else(|e| e.into_inner());
            for o in store.state() {
                if let Some(v) = p(&o) {
                    m.entry(o.object_ref()).or_insert(v);
                }
            }
        }
        for r in primaries(&store) {
            queue.add(r);
        }
        ready.send_replace(true);
        metrics.running.get_or_create(&label).set(1);
        tracing::info!(controller = %name, objects = store.len(), "controller started");

        let reconcile = Arc::new(reconcile);
        let error_policy = Arc::new(error_policy);
        let last_success: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let mut running = JoinSet::new();
        let resync_period = config
            .resync
            .unwrap_or(Duration::from_secs(3600 * 24 * 365));
        let next_resync = |p: Duration| {
            let j = rand::thread_rng().gen_range(0.9..1.1);
            tokio::time::Instant::now() + p.mul_f64(j)
        };
        let resync = tokio::time::sleep_until(next_resync(resync_period));
        tokio::pin!(resync);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                t = queue.next() => {
                    let Some(t) = t else { break };
                    let job = Job {
                        name: name.clone(),
                        store: store.clone(),
                        queue: queue.clone(),
                        metrics: metrics.clone(),
                        last_success: last_success.clone(),
                        on_deleted: on_deleted.clone(),
                        backoff: config.backoff,
                    };
                    let (reconcile, error_policy, ctx) =
                        (reconcile.clone(), error_policy.clone(), ctx.clone());
                    metrics.in_flight.get_or_create(&label).inc();
                    running.spawn(async move {
                        job.run(t.key, t.failures, &*reconcile, &*error_policy, ctx).await;
                    });
                }
                Some(_) = running.join_next(), if !running.is_empty() => {
                    metrics.in_flight.get_or_create(&label).dec();
                }
                _ = &mut resync, if config.resync.is_some() => {
                    for r in primaries(&store) {
                        queue.add(r);
                    }
                    resync.as_mut().reset(next_resync(resync_period));
                }
                _ = tick.tick() => {
                    metrics.queue_depth.get_or_create(&label).set(queue.len() as i64);
                    let since = last_success
                        .lock()
                        .map(|g| g.map_or(-1.0, |t| t.elapsed().as_secs_f64()))
                        .unwrap_or(-1.0);
                    metrics.seconds_since_success.get_or_create(&label).set(since);
                }
            }
        }
        queue.close();
        trigger_tasks.abort_all();
        // Let in-flight reconciles finish: a half-done reconcile is safe (level
        // triggered), but finishing avoids needless retries on the next leader.
        while running.join_next().await.is_some() {
            metrics.in_flight.get_or_create(&label).dec();
        }
        ready.send_replace(false);
        metrics.running.get_or_create(&label).set(0);
        tracing::info!(controller = %name, "controller stopped");
    }
}

/// One reconcile of one key.
struct Job<K> {
    name: String,
    store: crate::reflector::Store<K>,
    queue: WorkQueue<ObjectRef>,
    metrics: Arc<RuntimeMetrics>,
    last_success: Arc<Mutex<Option<Instant>>>,
    on_deleted: Option<OnDeleted>,
    backoff: Backoff,
}

impl<K: Resource + Send + Sync + 'static> Job<K> {
    async fn run<Ctx, E, R, Fut, P>(
        self,
        key: ObjectRef,
        failures: u32,
        reconcile: &R,
        error_policy: &P,
        ctx: Arc<Ctx>,
    ) where
        E: Display,
        R: Fn(Arc<K>, Arc<Ctx>) -> Fut,
        Fut: Future<Output = Result<Action, E>>,
        P: Fn(Arc<K>, &E, &ErrorContext, &Ctx) -> Action,
    {
        let start = Instant::now();
        let observe = |result: &str| {
            let l = RuntimeMetrics::result(&self.name, result);
            self.metrics.reconciles.get_or_create(&l).inc();
            self.metrics
                .reconcile_duration
                .get_or_create(&l)
                .observe(start.elapsed().as_secs_f64());
        };
        // Level-triggered: whatever the cache holds *now*.
        let Some(obj) = self.store.get(&key) else {
            if let Some(hook) = &self.on_deleted {
                hook(key.clone()).await;
            }
            tracing::debug!(controller = %self.name, object = %key, "object gone; nothing to do");
            self.queue.forget(&key);
            self.queue.done(
                &key,
                Outcome::Success {
                    requeue_after: None,
                },
            );
            observe("deleted");
            return;
        };
        let result = AssertUnwindSafe(reconcile(obj.clone(), ctx.clone()))
            .catch_unwind()
            .await;
        match result {
            Ok(Ok(action)) => {
                self.queue.done(
                    &key,
                    Outcome::Success {
                        requeue_after: action.requeue_after(),
                    },
                );
                if let Ok(mut g) = self.last_success.lock() {
                    *g = Some(Instant::now());
                }
                observe("success");
            }
            Ok(Err(e)) => {
                let failures = failures.saturating_add(1);
                let ectx = ErrorContext {
                    failures,
                    backoff: self.backoff.delay(failures),
                };
                let action = error_policy(obj, &e, &ectx, &ctx);
                let outcome = match action.requeue_after() {
                    Some(d) => Outcome::Failure {
                        retry_after: Some(d),
                    },
                    None => Outcome::FailureNoRetry,
                };
                let next = self.queue.done(&key, outcome);
                tracing::warn!(controller = %self.name, object = %key, error = %e, failures,
                    retry_in_ms = next.map(|d| d.as_millis() as u64), "reconcile failed");
                if next.is_some() {
                    self.metrics
                        .retries
                        .get_or_create(&RuntimeMetrics::label(&self.name))
                        .inc();
                }
                observe("error");
            }
            Err(_) => {
                tracing::error!(controller = %self.name, object = %key, "reconcile panicked");
                self.queue
                    .done(&key, Outcome::Failure { retry_after: None });
                self.metrics
                    .retries
                    .get_or_create(&RuntimeMetrics::label(&self.name))
                    .inc();
                observe("error");
            }
        }
    }
}
