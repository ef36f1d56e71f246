//! Test harness: a real embedded store in a tempdir, the in-process transport (or the
//! real HTTP server), and a transport wrapper that counts calls and cuts watches.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lattice_apis::{Allocation, KindInfo};
use lattice_apiserver::in_process::InProcessTransport;
use lattice_runtime::client::{RawWatchStream, Transport};
use lattice_runtime::{
    Backoff, Client, DeleteParams, InformerFactory, ListParams, Patch, PatchParams, PostParams,
    WatchParams,
};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::{json, Value};
use tokio::sync::watch;

pub struct Env {
    pub store: EmbeddedStore,
    pub backend: Arc<dyn KvBackend>,
    pub transport: Arc<CountingTransport>,
    pub client: Client,
    _dir: tempfile::TempDir,
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub async fn env() -> Env {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig {
        progress_interval: Duration::from_millis(200),
        ..StoreConfig::default()
    };
    let store = EmbeddedStore::open(dir.path(), config)
        .await
        .expect("open store");
    let backend: Arc<dyn KvBackend> = Arc::new(store.clone());
    let transport = Arc::new(CountingTransport::new(Arc::new(InProcessTransport::new(
        backend.clone(),
    ))));
    let client = Client::new(transport.clone());
    Env {
        store,
        backend,
        transport,
        client,
        _dir: dir,
    }
}

/// Watcher settings for tests: fast backoff.
pub fn fast_watcher() -> lattice_runtime::watcher::Config {
    lattice_runtime::watcher::Config {
        backoff: fast_backoff(),
        ..Default::default()
    }
}

pub fn fast_backoff() -> Backoff {
    Backoff {
        min: Duration::from_millis(10),
        max: Duration::from_millis(100),
        factor: 2.0,
        jitter: 0.1,
        reset_after: Duration::from_secs(1),
    }
}

pub fn factory(env: &Env) -> InformerFactory {
    InformerFactory::with_config(env.client.clone(), fast_watcher())
}

pub fn alloc(name: &str, ns: &str) -> Allocation {
    serde_json::from_value(json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "demo"}},
        "spec": {"entrypoint": "/bin/sh", "args": ["-c", "echo hi"], "lifecycle": {"walltime": "10m"}}
    }))
    .expect("allocation")
}

/// Poll `f` until it is true or `timeout` passes.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, mut f: F) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wraps a transport: counts lists and watches per kind, can cut every open watch and
/// refuse new ones (an outage).
pub struct CountingTransport {
    inner: Arc<dyn Transport>,
    pub lists: Mutex<HashMap<&'static str, usize>>,
    pub watches: Mutex<HashMap<&'static str, usize>>,
    cut: watch::Sender<u64>,
    blocked: AtomicBool,
}

impl CountingTransport {
    pub fn new(inner: Arc<dyn Transport>) -> Self {
        Self {
            inner,
            lists: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            cut: watch::channel(0).0,
            blocked: AtomicBool::new(false),
        }
    }

    /// End every open watch stream.
    pub fn cut_watches(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// Refuse (or accept again) lists and watches.
    pub fn block(&self, on: bool) {
        self.blocked.store(on, Ordering::SeqCst);
    }

    /// Full lists of `kind` (pages after the first are not counted).
    pub fn lists_of(&self, kind: &str) -> usize {
        self.lists.lock().unwrap().get(kind).copied().unwrap_or(0)
    }

    pub fn watches_of(&self, kind: &str) -> usize {
        self.watches.lock().unwrap().get(kind).copied().unwrap_or(0)
    }

    fn check(&self) -> lattice_runtime::Result<()> {
        if self.blocked.load(Ordering::SeqCst) {
            Err(lattice_runtime::Error::Transport("blocked by test".into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl Transport for CountingTransport {
    async fn get(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
    ) -> lattice_runtime::Result<Value> {
        self.inner.get(kind, ns, name).await
    }
    async fn list(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        p: &ListParams,
    ) -> lattice_runtime::Result<Value> {
        self.check()?;
        if p.continue_token.is_none() {
            *self.lists.lock().unwrap().entry(kind.kind).or_default() += 1;
        }
        self.inner.list(kind, ns, p).await
    }
    async fn watch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        p: &WatchParams,
    ) -> lattice_runtime::Result<RawWatchStream> {
        self.check()?;
        *self.watches.lock().unwrap().entry(kind.kind).or_default() += 1;
        let s = self.inner.watch(kind, ns, p).await?;
        let mut rx = self.cut.subscribe();
        rx.borrow_and_update();
        let stop = async move {
            let _ = rx.changed().await;
        };
        Ok(s.take_until(Box::pin(stop)).boxed())
    }
    async fn create(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        obj: Value,
        p: &PostParams,
    ) -> lattice_runtime::Result<Value> {
        self.inner.create(kind, ns, obj, p).await
    }
    async fn replace(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        sub: Option<&str>,
        p: &PostParams,
    ) -> lattice_runtime::Result<Value> {
        self.inner.replace(kind, ns, name, obj, sub, p).await
    }
    async fn patch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        patch: &Patch,
        sub: Option<&str>,
        p: &PatchParams,
    ) -> lattice_runtime::Result<Value> {
        self.inner.patch(kind, ns, name, patch, sub, p).await
    }
    async fn delete(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        p: &DeleteParams,
    ) -> lattice_runtime::Result<Value> {
        self.inner.delete(kind, ns, name, p).await
    }
}
