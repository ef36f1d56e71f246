//! Shared informers: one list+watch per (kind, tenant, selectors) per process, one
//! cache of `Arc<K>` shared by every controller that asks for it, and a broadcast of
//! what changed.
//!
//! ```no_run
//! # async fn demo(client: lattice_runtime::Client) {
//! use lattice_apis::Allocation;
//! use lattice_runtime::informer::{InformerFactory, InformerParams};
//!
//! let factory = InformerFactory::new(client);
//! let a = factory.informer::<Allocation>(&InformerParams::default());
//! let b = factory.informer::<Allocation>(&InformerParams::default()); // same watch
//! a.store().wait_until_synced().await;
//! assert_eq!(a.store().len(), b.store().len());
//! # }
//! ```

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use lattice_apis::Resource;
use tokio::sync::{broadcast, watch};

use crate::api::Api;
use crate::client::Client;
use crate::reflector::{self, Applied, Store};
use crate::watcher::{self, Config, Event, Health};

/// A change the informer applied to its cache.
#[derive(Debug)]
pub enum InformerEvent<K> {
    /// Created or changed (the new version, as cached).
    Applied(Arc<K>),
    /// Deleted (the last known state).
    Deleted(Arc<K>),
}

impl<K> Clone for InformerEvent<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Applied(o) => Self::Applied(o.clone()),
            Self::Deleted(o) => Self::Deleted(o.clone()),
        }
    }
}

impl<K> InformerEvent<K> {
    /// The object concerned.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Self::Applied(o) | Self::Deleted(o) => o,
        }
    }
}

/// Which objects an informer follows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct InformerParams {
    /// One tenant, or all (`None`).
    pub namespace: Option<String>,
    /// Label selector.
    pub label_selector: Option<String>,
    /// Field selector.
    pub field_selector: Option<String>,
}

struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A running list+watch feeding a shared cache. Cheap to clone; the watch stops when
/// the last clone is dropped.
pub struct SharedInformer<K> {
    store: Store<K>,
    events: broadcast::Sender<InformerEvent<K>>,
    health: watch::Receiver<Health>,
    _task: Arc<Task>,
}

impl<K> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            events: self.events.clone(),
            health: self.health.clone(),
            _task: self._task.clone(),
        }
    }
}

/// Capacity of the change broadcast; a subscriber that falls further behind gets
/// `Lagged` and must resync from the store.
const BROADCAST_CAPACITY: usize = 8192;

impl<K: Resource + Send + Sync + 'static> SharedInformer<K> {
    /// Start an informer of its own (prefer [`InformerFactory::informer`], which
    /// shares).
    pub fn start(api: Api<K>, config: Config) -> Self {
        let (store, mut writer) = reflector::store::<K>();
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let mut w = watcher::watcher(api, config);
        let health = w.health();
        let tx = events.clone();
        let task = tokio::spawn(async move {
            // Until the first list completes nobody needs per-object events: every
            // controller enqueues the whole cache once it has synced. Skipping them
            // spares a broadcast flood (and lagging subscribers) on big initial lists.
            let mut synced = false;
            while let Some(ev) = w.next().await {
                match ev {
                    Event::Init => writer.begin_relist(),
                    Event::InitApply(o) | Event::Apply(o) => {
                        if let Applied::Upserted(a) = writer.apply(o) {
                            if synced {
                                let _ = tx.send(InformerEvent::Applied(a));
                            }
                        }
                    }
                    Event::InitDone => {
                        for gone in writer.end_relist() {
                            if synced {
                                let _ = tx.send(InformerEvent::Deleted(gone));
                            }
                        }
                        synced = true;
                    }
                    Event::Delete(o) => {
                        if let Applied::Removed = writer.delete(&o) {
                            let _ = tx.send(InformerEvent::Deleted(Arc::new(o)));
                        }
                    }
                }
            }
        });
        Self {
            store,
            events,
            health,
            _task: Arc::new(Task(task)),
        }
    }

    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<InformerEvent<K>> {
        self.events.subscribe()
    }

    /// The underlying watcher's health.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: &'static str,
    params: InformerParams,
}

/// Hands out shared informers: the first request for a (kind, params) starts the
/// list+watch, later ones share it.
#[derive(Clone)]
pub struct InformerFactory {
    client: Client,
    config: Config,
    informers: Arc<Mutex<HashMap<Key, Box<dyn Any + Send + Sync>>>>,
}

impl std::fmt::Debug for InformerFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerFactory")
            .field("informers", &self.len())
            .finish()
    }
}

impl InformerFactory {
    /// A factory over `client` with default watcher settings.
    pub fn new(client: Client) -> Self {
        Self::with_config(client, Config::default())
    }

    /// A factory whose watchers use `config` (selectors in it are ignored; they come
    /// from each request's [`InformerParams`]).
    pub fn with_config(client: Client, config: Config) -> Self {
        Self {
            client,
            config,
            informers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Number of informers started.
    pub fn len(&self) -> usize {
        self.informers.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no informer was started.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The informer of `K` for `params`, started on first use.
    pub fn informer<K: Resource + Send + Sync + 'static>(
        &self,
        params: &InformerParams,
    ) -> SharedInformer<K> {
        let key = Key {
            kind: K::KIND,
            params: params.clone(),
        };
        let mut map = self.informers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map
            .get(&key)
            .and_then(|b| b.downcast_ref::<SharedInformer<K>>())
        {
            return existing.clone();
        }
        // The reflector drops managedFields: not building them saves their decoding.
        let api = Api::<K>::scoped(self.client.clone(), params.namespace.as_deref())
            .without_managed_fields();
        let config = Config {
            label_selector: params.label_selector.clone(),
            field_selector: params.field_selector.clone(),
            ..self.config.clone()
        };
        tracing::debug!(kind = K::KIND, ?params, "starting shared informer");
        let inf = SharedInformer::start(api, config);
        map.insert(key, Box::new(inf.clone()));
        inf
    }

    /// The informer of every `K` in every tenant.
    pub fn all<K: Resource + Send + Sync + 'static>(&self) -> SharedInformer<K> {
        self.informer(&InformerParams::default())
    }
}
