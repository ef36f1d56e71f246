//! [`ControllerHost`]: runs a set of controllers while this process is leader, stops
//! them within moments of losing leadership, and exposes their metrics and readiness.
//!
//! ```no_run
//! # async fn demo(backend: std::sync::Arc<dyn lattice_store::KvBackend>) {
//! use std::sync::Arc;
//! use lattice_runtime::{gc, AlwaysLeader, Client, ControllerHost};
//!
//! let mut host = ControllerHost::new(lattice_apiserver::in_process::client(backend), Arc::new(AlwaysLeader::new()));
//! gc::register(&mut host);
//! let mut registry = prometheus_client::registry::Registry::default();
//! host.register_metrics(&mut registry);
//! let readiness = host.readiness();
//! tokio::spawn(host.run(std::future::pending()));
//! # let _ = readiness.is_ready();
//! # }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use lattice_apis::Resource;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::controller::Controller;
use crate::informer::{InformerFactory, InformerParams};
use crate::leader::LeaderGate;
use crate::metrics::RuntimeMetrics;

/// What a registered controller gets each time it is started.
#[derive(Clone)]
pub struct HostContext {
    /// The controller's registered name.
    pub name: String,
    /// The client (in-process inside `lattice-server`).
    pub client: Client,
    /// The host's shared informers.
    pub factory: InformerFactory,
    /// The host's metric families.
    pub metrics: Arc<RuntimeMetrics>,
    ready: Arc<watch::Sender<bool>>,
}

impl HostContext {
    /// A controller of every `K`, named, reporting into the host's metrics and
    /// readiness.
    pub fn controller<K: Resource + Send + Sync + 'static>(&self) -> Controller<K> {
        self.controller_with::<K>(&InformerParams::default())
    }

    /// Like [`controller`](Self::controller) for the `K`s `params` selects.
    pub fn controller_with<K: Resource + Send + Sync + 'static>(
        &self,
        params: &InformerParams,
    ) -> Controller<K> {
        Controller::with_params(&self.factory, params)
            .name(&self.name)
            .metrics(self.metrics.clone())
            .ready_sender(self.ready.clone())
    }

    /// Mark this controller ready by hand (for controllers not built on [`Controller`]).
    pub fn set_ready(&self, ready: bool) {
        self.ready.send_replace(ready);
    }
}

type StartFn = Arc<dyn Fn(HostContext) -> BoxFuture<'static, ()> + Send + Sync>;

struct Entry {
    name: String,
    start: StartFn,
    ready: Arc<watch::Sender<bool>>,
}

/// Readiness of a host's controllers; cheap to clone (hand it to `/readyz`).
#[derive(Clone)]
pub struct Readiness {
    gate: watch::Receiver<bool>,
    controllers: Arc<Vec<(String, watch::Receiver<bool>)>>,
    started: Arc<Mutex<bool>>,
}

impl Readiness {
    /// Ready: the host runs, and either this member is a standby (not leader) or every
    /// controller has synced its caches and is running.
    pub fn is_ready(&self) -> bool {
        let started = self.started.lock().map(|g| *g).unwrap_or(false);
        started && (!*self.gate.borrow() || self.controllers.iter().all(|(_, r)| *r.borrow()))
    }

    /// Per-controller readiness.
    pub fn report(&self) -> BTreeMap<String, bool> {
        self.controllers
            .iter()
            .map(|(n, r)| (n.clone(), *r.borrow()))
            .collect()
    }
}

/// Hosts controllers under a [`LeaderGate`].
pub struct ControllerHost {
    client: Client,
    factory: InformerFactory,
    gate: Arc<dyn LeaderGate>,
    metrics: Arc<RuntimeMetrics>,
    entries: Vec<Entry>,
    started: Arc<Mutex<bool>>,
}

impl ControllerHost {
    /// A host whose controllers use `client` and run while `gate` says leader.
    pub fn new(client: Client, gate: Arc<dyn LeaderGate>) -> Self {
        Self {
            factory: InformerFactory::new(client.clone()),
            client,
            gate,
            metrics: Arc::new(RuntimeMetrics::new()),
            entries: Vec::new(),
            started: Arc::new(Mutex::new(false)),
        }
    }

    /// Use this informer factory (e.g. with test watcher settings).
    pub fn with_factory(mut self, factory: InformerFactory) -> Self {
        self.factory = factory;
        self
    }

    /// The shared informers.
    pub fn factory(&self) -> &InformerFactory {
        &self.factory
    }

    /// The metric families.
    pub fn metrics(&self) -> Arc<RuntimeMetrics> {
        self.metrics.clone()
    }

    /// Register a controller: `start` is called each time this member becomes leader,
    /// and the future it returns is dropped when leadership is lost.
    pub fn register<F, Fut>(&mut self, name: &str, start: F)
    where
        F: Fn(HostContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.entries.push(Entry {
            name: name.to_string(),
            start: Arc::new(move |ctx| start(ctx).boxed()),
            ready: Arc::new(watch::channel(false).0),
        });
    }

    /// Names of the registered controllers.
    pub fn controllers(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.name.clone()).collect()
    }

    /// Register the controllers' metric families into `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    /// A readiness handle.
    pub fn readiness(&self) -> Readiness {
        Readiness {
            gate: self.gate.subscribe(),
            controllers: Arc::new(
                self.entries
                    .iter()
                    .map(|e| (e.name.clone(), e.ready.subscribe()))
                    .collect(),
            ),
            started: self.started.clone(),
        }
    }

    fn start_all(&self) -> JoinSet<()> {
        let mut set = JoinSet::new();
        for e in &self.entries {
            let ctx = HostContext {
                name: e.name.clone(),
                client: self.client.clone(),
                factory: self.factory.clone(),
                metrics: self.metrics.clone(),
                ready: e.ready.clone(),
            };
            let start = e.start.clone();
            let name = e.name.clone();
            set.spawn(async move {
                // A controller future should run until dropped; if it returns, restart
                // it rather than silently lose the controller.
                loop {
                    start(ctx.clone()).await;
                    ctx.set_ready(false);
                    tracing::warn!(controller = %name, "controller returned; restarting in 1s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
        set
    }

    fn stop_all(&self, set: &mut JoinSet<()>) {
        set.abort_all();
        for e in &self.entries {
            e.ready.send_replace(false);
            self.metrics
                .running
                .get_or_create(&RuntimeMetrics::label(&e.name))
                .set(0);
        }
    }

    /// Run until `shutdown` resolves: start the controllers on becoming leader, stop
    /// them on losing it.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        if let Ok(mut g) = self.started.lock() {
            *g = true;
        }
        let mut leader = self.gate.subscribe();
        let mut running: Option<JoinSet<()>> = None;
        tokio::pin!(shutdown);
        loop {
            let is_leader = *leader.borrow_and_update();
            match (is_leader, running.is_some()) {
                (true, false) => {
                    tracing::info!(
                        controllers = self.entries.len(),
                        "leader: starting controllers"
                    );
                    running = Some(self.start_all());
                }
                (false, true) => {
                    tracing::info!("no longer leader: stopping controllers");
                    if let Some(mut set) = running.take() {
                        self.stop_all(&mut set);
                    }
                }
                _ => {}
            }
            tokio::select! {
                _ = &mut shutdown => break,
                changed = leader.changed() => {
                    if changed.is_err() {
                        // The gate is gone: nobody can tell us we lead any more.
                        if let Some(mut set) = running.take() {
                            self.stop_all(&mut set);
                        }
                        shutdown.as_mut().await;
                        break;
                    }
                }
            }
        }
        if let Some(mut set) = running.take() {
            self.stop_all(&mut set);
        }
        if let Ok(mut g) = self.started.lock() {
            *g = false;
        }
    }
}
