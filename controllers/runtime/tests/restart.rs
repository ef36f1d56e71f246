//! A controller converges across a restart of the store behind its transport: the old
//! store is closed (its watches die with it), a new one is opened on the same
//! directory, and the watcher resumes from its resourceVersion on the new one.

mod common;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use futures::StreamExt;
use lattice_apis::{Allocation, KindInfo};
use lattice_apiserver::in_process::InProcessTransport;
use lattice_runtime::client::{RawWatchStream, Transport};
use lattice_runtime::{
    Action, Api, Client, Controller, DeleteParams, InformerFactory, ListParams, Patch, PatchParams,
    PostParams, ResourceExt, WatchParams,
};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::Value;
use tokio::sync::watch;

type R<T> = lattice_runtime::Result<T>;

/// A transport whose target can be swapped (a restarted server); swapping drops every
/// open watch, as a restart drops connections.
struct Switch {
    inner: RwLock<Arc<dyn Transport>>,
    generation: watch::Sender<u64>,
}

impl Switch {
    fn current(&self) -> Arc<dyn Transport> {
        self.inner.read().unwrap().clone()
    }
    fn swap(&self, t: Arc<dyn Transport>) {
        *self.inner.write().unwrap() = t;
        self.generation.send_modify(|g| *g += 1);
    }
}

#[async_trait]
impl Transport for Switch {
    async fn get(&self, k: &'static KindInfo, ns: Option<&str>, n: &str) -> R<Value> {
        self.current().get(k, ns, n).await
    }
    async fn list(&self, k: &'static KindInfo, ns: Option<&str>, p: &ListParams) -> R<Value> {
        self.current().list(k, ns, p).await
    }
    async fn watch(
        &self,
        k: &'static KindInfo,
        ns: Option<&str>,
        p: &WatchParams,
    ) -> R<RawWatchStream> {
        let s = self.current().watch(k, ns, p).await?;
        let mut rx = self.generation.subscribe();
        rx.borrow_and_update();
        Ok(s.take_until(Box::pin(async move {
            let _ = rx.changed().await;
        }))
        .boxed())
    }
    async fn create(
        &self,
        k: &'static KindInfo,
        ns: Option<&str>,
        o: Value,
        p: &PostParams,
    ) -> R<Value> {
        self.current().create(k, ns, o, p).await
    }
    async fn replace(
        &self,
        k: &'static KindInfo,
        ns: Option<&str>,
        n: &str,
        o: Value,
        sub: Option<&str>,
        p: &PostParams,
    ) -> R<Value> {
        self.current().replace(k, ns, n, o, sub, p).await
    }
    async fn patch(
        &self,
        k: &'static KindInfo,
        ns: Option<&str>,
        n: &str,
        pa: &Patch,
        sub: Option<&str>,
        p: &PatchParams,
    ) -> R<Value> {
        self.current().patch(k, ns, n, pa, sub, p).await
    }
    async fn delete(
        &self,
        k: &'static KindInfo,
        ns: Option<&str>,
        n: &str,
        p: &DeleteParams,
    ) -> R<Value> {
        self.current().delete(k, ns, n, p).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_converges_across_a_store_restart() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let backend: Arc<dyn KvBackend> = Arc::new(store.clone());
    let switch = Arc::new(Switch {
        inner: RwLock::new(Arc::new(InProcessTransport::new(backend))),
        generation: watch::channel(0).0,
    });
    let client = Client::new(switch.clone());
    let api: Api<Allocation> = Api::namespaced(client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();

    let factory = InformerFactory::with_config(client.clone(), fast_watcher());
    tokio::spawn(Controller::<Allocation>::new(&factory).name("restart").run(
        |a: Arc<Allocation>, api: Arc<Api<Allocation>>| async move {
            if !a.labels().contains_key("seen") {
                api.patch(
                    a.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {"seen": "yes"}}})),
                )
                .await?;
            }
            Ok::<_, lattice_runtime::Error>(Action::await_change())
        },
        Arc::new(api.clone()),
    ));
    let labelled = |name: &'static str| {
        let api = api.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(a)) = api.get_opt(name).await {
                    if a.labels().contains_key("seen") {
                        return true;
                    }
                }
                if tokio::time::Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(labelled("a1").await);

    // Restart: close the store, reopen it on the same directory, point the transport at it.
    store.close().await;
    let reopened = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let backend: Arc<dyn KvBackend> = Arc::new(reopened.clone());
    switch.swap(Arc::new(InProcessTransport::new(backend)));

    api.create(&PostParams::default(), &alloc("a2", "t1"))
        .await
        .unwrap();
    assert!(
        labelled("a2").await,
        "the controller converges after the restart"
    );
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
}
