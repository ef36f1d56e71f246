//! The HTTP transport against the real API server (in this process, on a real TCP
//! port), and the site-plugin example as a real separate process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use lattice_apis::{Allocation, AllocationPhase};
use lattice_apiserver::{ApiConfig, ApiServer};
use lattice_runtime::watcher::{self, Event};
use lattice_runtime::{
    Action, Api, Client, Controller, DeleteParams, DeleteResult, InformerFactory, ListParams,
    Patch, PatchParams, PostParams, Preconditions, ResourceExt,
};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::json;

const T: Duration = Duration::from_secs(15);

struct Server {
    base: String,
    _dir: tempfile::TempDir,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

async fn server() -> Server {
    server_with(ApiConfig {
        bookmark_interval: Duration::from_millis(500),
        ..ApiConfig::default()
    })
    .await
}

async fn server_with(config: ApiConfig) -> Server {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let backend: Arc<dyn KvBackend> = Arc::new(store);
    let api = ApiServer::new(backend, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = api
            .serve(listener, async move {
                let _ = rx.await;
            })
            .await;
    });
    Server {
        base: format!("http://{addr}"),
        _dir: dir,
        _shutdown: tx,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_over_http() {
    let s = server().await;
    let client = Client::http(&s.base, None).unwrap();
    let api: Api<Allocation> = Api::namespaced(client.clone(), "t1");
    let a = api
        .create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    assert_eq!(a.generation(), Some(1));
    assert!(api.get("nope").await.unwrap_err().is_not_found());
    assert!(api
        .create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap_err()
        .is_already_exists());

    // Merge, JSON and apply patches.
    let p = api
        .patch(
            "a1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"m": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.labels().get("m").map(String::as_str), Some("1"));
    let j = api
        .patch(
            "a1",
            &PatchParams::default(),
            &Patch::Json(json!([{"op": "add", "path": "/metadata/labels/j", "value": "2"}])),
        )
        .await
        .unwrap();
    assert_eq!(j.labels().get("j").map(String::as_str), Some("2"));
    let applied = api
        .patch(
            "a1",
            &PatchParams::apply("test-manager").force(),
            &Patch::Apply(json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation", "metadata": {"name": "a1", "namespace": "t1", "labels": {"ssa": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.labels().get("ssa").map(String::as_str), Some("yes"));
    // A failed JSON patch test is recognisable (the finalizer guard relies on it).
    let e = api
        .patch(
            "a1",
            &PatchParams::default(),
            &Patch::Json(
                json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}]),
            ),
        )
        .await
        .unwrap_err();
    assert!(e.is_patch_test_failed(), "{e}");

    // Status subresource.
    let st = api
        .patch_status(
            "a1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        st.status.as_ref().map(|s| s.phase),
        Some(AllocationPhase::Running)
    );
    assert_eq!(
        st.generation(),
        Some(1),
        "status writes do not bump generation"
    );

    // List with selectors and paging.
    api.create(&PostParams::default(), &alloc("a2", "t1"))
        .await
        .unwrap();
    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert!(page.continue_token.is_some());
    let sel = api
        .list(&ListParams::default().labels("ssa=yes"))
        .await
        .unwrap();
    assert_eq!(sel.items.len(), 1);

    // Delete with preconditions.
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert!(api.delete("a2", &wrong).await.unwrap_err().is_conflict());
    let a2 = api.get("a2").await.unwrap();
    match api
        .delete("a2", &DeleteParams::with_uid(a2.uid().unwrap()))
        .await
        .unwrap()
    {
        DeleteResult::Deleted(o) => assert_eq!(o.name_any(), "a2"),
        DeleteResult::Pending(_) => panic!("no finalizers"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_controller_over_http() {
    let s = server().await;
    let client = Client::http(&s.base, None).unwrap();
    let api: Api<Allocation> = Api::namespaced(client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let mut w = watcher::watcher(Api::<Allocation>::all(client.clone()), fast_watcher());
    // The initial list first (with a1), then a2 created afterwards must come as a change.
    // (Creating a2 before the list has finished made a2 part of the list whenever the list
    // was slow, and the test then waited for a change that never came.)
    let mut listed = Vec::new();
    loop {
        match tokio::time::timeout(T, w.next()).await.unwrap().unwrap() {
            Event::InitDone => break,
            Event::InitApply(o) => listed.push(o.name_any().to_string()),
            _ => {}
        }
    }
    assert!(listed.contains(&"a1".to_string()), "{listed:?}");
    api.create(&PostParams::default(), &alloc("a2", "t1"))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(T, w.next()).await.unwrap().unwrap() {
            Event::Apply(o) if o.name_any() == "a2" => break,
            _ => {}
        }
    }
    drop(w);

    let factory = InformerFactory::with_config(client.clone(), fast_watcher());
    tokio::spawn(
        Controller::<Allocation>::new(&factory)
            .name("http-labeler")
            .run(
                |a: Arc<Allocation>, api: Arc<Api<Allocation>>| async move {
                    if a.labels().contains_key("seen") {
                        return Ok(Action::await_change());
                    }
                    api.patch(
                        a.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {"seen": "yes"}}})),
                    )
                    .await?;
                    Ok::<_, lattice_runtime::Error>(Action::await_change())
                },
                Arc::new(api.clone()),
            ),
    );
    let all = || async {
        api.list(&ListParams::default())
            .await
            .map(|l| l.items.iter().all(|a| a.labels().contains_key("seen")))
            .unwrap_or(false)
    };
    let deadline = tokio::time::Instant::now() + T;
    while !all().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller over HTTP labels everything"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The site-plugin example, built by `cargo test` next to this test binary, run as a
/// real process against the live server.
fn example_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let bin = dir
        .join("examples")
        .join(format!("site_labeler{}", std::env::consts::EXE_SUFFIX));
    bin.exists().then_some(bin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_plugin_example_labels_allocations() {
    let Some(bin) = example_binary() else {
        eprintln!("site_labeler example not built; skipping");
        return;
    };
    let s = server().await;
    let client = Client::http(&s.base, None).unwrap();
    let api: Api<Allocation> = Api::namespaced(client.clone(), "t1");
    let mut a = alloc("job", "t1");
    a.spec.vcluster = Some("hpc".into());
    api.create(&PostParams::default(), &a).await.unwrap();
    let mut child = tokio::process::Command::new(bin)
        .env("LATTICE_SERVER", &s.base)
        .env("SITE_LABELER_IDENTITY", "e2e")
        .env("SITE_LABELER_LEASE_SECONDS", "3")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let got = api.get("job").await.unwrap();
        if got.labels().get("site.example/queue").map(String::as_str) == Some("hpc") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the example labels the allocation"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease: Api<lattice_apis::Lease> = Api::namespaced(client, lattice_apis::SYSTEM_NAMESPACE);
    let l = lease.get("site-labeler").await.unwrap();
    assert_eq!(l.spec.holder_identity.as_deref(), Some("e2e"));
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_sent() {
    let secret = b"test-secret-of-sufficient-length".to_vec();
    let s = server_with(ApiConfig {
        auth: true,
        jwt_secret: secret.clone(),
        ..ApiConfig::default()
    })
    .await;
    let anonymous: Api<Allocation> = Api::namespaced(Client::http(&s.base, None).unwrap(), "t1");
    let err = anonymous.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(err.code(), Some(401), "{err}");
    let token = lattice_apiserver::mint_token(
        &secret,
        "site-controller",
        &["t1".to_string()],
        lattice_apiserver::Role::User,
        Duration::from_secs(300),
    );
    let api: Api<Allocation> = Api::namespaced(Client::http(&s.base, Some(token)).unwrap(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}
