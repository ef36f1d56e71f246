//! The garbage collector in a ControllerHost against a real store: orphans are
//! deleted, dependents follow a deleted owner, dangling references to one of several
//! owners are dropped, finalizers are respected; foreground deletion waits for the
//! (blocking) dependent tree and cascades, orphan deletion releases the dependents;
//! invalid propagation policies are refused (over real HTTP).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use lattice_apis::Allocation;
use lattice_apis::OwnerReference;
use lattice_apiserver::{ApiConfig, ApiServer};
use lattice_runtime::wait::{await_condition, conditions};
use lattice_runtime::{
    gc, AlwaysLeader, Api, Client, ControllerHost, DeleteParams, DeleteResult, Patch, PatchParams,
    PostParams, PropagationPolicy, ResourceExt, WatchEvent, WatchParams,
};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(10);
use lattice_apis::wellknown::FOREGROUND_FINALIZER as FOREGROUND;
use lattice_apis::wellknown::HOLD_ANNOTATION as HOLD;
use lattice_apis::wellknown::ORPHAN_FINALIZER as ORPHAN;

/// A host running only the garbage collector, ready.
async fn start_gc(env: &Env) {
    let mut host = ControllerHost::new(env.client.clone(), Arc::new(AlwaysLeader::new()))
        .with_factory(factory(env));
    gc::register(&mut host);
    let readiness = host.readiness();
    tokio::spawn(host.run(std::future::pending()));
    assert!(
        eventually(T, || readiness.is_ready()).await,
        "host becomes ready"
    );
}

async fn create(api: &Api<Allocation>, a: Allocation) -> Allocation {
    api.create(&PostParams::default(), &a).await.unwrap()
}

/// Wait until `cond` holds for the object `name`; its last state.
async fn wait_for<F>(api: &Api<Allocation>, name: &str, what: &str, cond: F) -> Option<Allocation>
where
    F: Fn(Option<&Allocation>) -> bool,
{
    tokio::time::timeout(T, await_condition(api.clone(), name, cond))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting: {what}"))
}

/// Names of the objects deleted after `rv`, in order, as the watch reports them.
fn record_deletions(api: &Api<Allocation>, rv: &str) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (api, rv, out) = (api.clone(), rv.to_string(), seen.clone());
    tokio::spawn(async move {
        let params = WatchParams {
            resource_version: rv,
            ..WatchParams::default()
        };
        let mut w = api.watch(&params).await.unwrap();
        while let Some(Ok(ev)) = w.next().await {
            if let WatchEvent::Deleted(o) = ev {
                out.lock().unwrap().push(o.name_any().to_string());
            }
        }
    });
    seen
}

fn owned_by(name: &str, owners: &[&Allocation]) -> Allocation {
    let mut a = alloc(name, "t1");
    a.metadata.owner_references = owners
        .iter()
        .enumerate()
        .map(|(i, o)| o.owner_ref(i == 0).unwrap())
        .collect();
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_orphans_and_follows_owner_deletion() {
    let env = env().await;
    let mut host = ControllerHost::new(env.client.clone(), Arc::new(AlwaysLeader::new()))
        .with_factory(factory(&env));
    gc::register(&mut host);
    let readiness = host.readiness();
    tokio::spawn(host.run(std::future::pending()));
    assert!(
        eventually(T, || readiness.is_ready()).await,
        "host becomes ready"
    );

    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let p1 = api
        .create(&PostParams::default(), &alloc("p1", "t1"))
        .await
        .unwrap();
    let p2 = api
        .create(&PostParams::default(), &alloc("p2", "t1"))
        .await
        .unwrap();
    let child = api
        .create(&PostParams::default(), &owned_by("child", &[&p1]))
        .await
        .unwrap();
    let shared = api
        .create(&PostParams::default(), &owned_by("shared", &[&p1, &p2]))
        .await
        .unwrap();
    let mut orphan = alloc("orphan", "t1");
    orphan.metadata.owner_references = vec![OwnerReference {
        api_version: "lattice.dev/v1alpha1".into(),
        kind: "Allocation".into(),
        name: "gone".into(),
        uid: "00000000-0000-0000-0000-000000000000".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }];
    let orphan = api.create(&PostParams::default(), &orphan).await.unwrap();

    // An object whose owner never existed is collected.
    tokio::time::timeout(
        T,
        await_condition(
            api.clone(),
            "orphan",
            conditions::is_deleted(orphan.uid().unwrap()),
        ),
    )
    .await
    .expect("orphan collected");
    // Live owners protect their dependents.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(api.get_opt("child").await.unwrap().is_some());

    // Deleting p1: child (only owner p1) goes; shared keeps p2 and loses the p1 ref.
    api.delete("p1", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        T,
        await_condition(
            api.clone(),
            "child",
            conditions::is_deleted(child.uid().unwrap()),
        ),
    )
    .await
    .expect("dependent of a deleted owner collected");
    let p2_uid = p2.uid().unwrap().to_string();
    let s = tokio::time::timeout(
        T,
        await_condition(api.clone(), "shared", move |o: Option<&Allocation>| {
            o.is_some_and(|o| {
                o.owner_references().len() == 1 && o.owner_references()[0].uid == p2_uid
            })
        }),
    )
    .await
    .expect("dangling reference dropped")
    .unwrap();
    assert_eq!(s.uid(), shared.uid(), "the same object, not a recreation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respects_finalizers_on_dependents() {
    let env = env().await;
    let mut host = ControllerHost::new(env.client.clone(), Arc::new(AlwaysLeader::new()))
        .with_factory(factory(&env));
    gc::register(&mut host);
    tokio::spawn(host.run(std::future::pending()));
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let p = api
        .create(&PostParams::default(), &alloc("p", "t1"))
        .await
        .unwrap();
    let mut c = owned_by("c", &[&p]);
    c.metadata.finalizers = vec!["lattice.dev/keep".into()];
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("p", &DeleteParams::default()).await.unwrap();
    let terminating = tokio::time::timeout(
        T,
        await_condition(api.clone(), "c", |o: Option<&Allocation>| {
            o.is_some_and(|o| o.is_deleting())
        }),
    )
    .await
    .expect("marked for deletion")
    .unwrap();
    assert_eq!(terminating.finalizers(), ["lattice.dev/keep".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_delete_waits_for_the_dependent_tree() {
    let env = env().await;
    start_gc(&env).await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let owner = create(&api, alloc("fg", "t1")).await;
    let other = create(&api, alloc("fg-other", "t1")).await;
    // fg <- fg-child <- fg-grandchild (held by a finalizer); blocking references.
    let child = create(&api, owned_by("fg-child", &[&owner])).await;
    let mut g = owned_by("fg-grandchild", &[&child]);
    g.metadata.finalizers = vec![HOLD.into()];
    let grandchild = create(&api, g).await;
    // A dependent whose reference does not block the owner, held by a finalizer.
    let mut l = alloc("fg-loose", "t1");
    l.metadata.owner_references = vec![owner.owner_ref(false).unwrap()];
    l.metadata.finalizers = vec![HOLD.into()];
    let loose = create(&api, l).await;
    // A dependent with another, live owner: it keeps that one and survives.
    let shared = create(&api, owned_by("fg-shared", &[&owner, &other])).await;
    let deletions = record_deletions(&api, shared.resource_version().unwrap());

    match api.delete("fg", &DeleteParams::foreground()).await.unwrap() {
        DeleteResult::Pending(o) => {
            assert!(o.is_deleting());
            assert_eq!(o.finalizers(), [FOREGROUND.to_string()]);
        }
        DeleteResult::Deleted(_) => panic!("a foreground delete only marks the owner"),
    }

    // The cascade reaches the grandchild (foreground too), which its finalizer holds.
    let gc_ = wait_for(&api, "fg-grandchild", "grandchild marked", |o| {
        o.is_some_and(|o| o.is_deleting())
    })
    .await
    .unwrap();
    assert_eq!(gc_.uid(), grandchild.uid());
    wait_for(
        &api,
        "fg-child",
        "child marked for foreground deletion",
        |o| o.is_some_and(|o| o.is_deleting() && o.finalizers().contains(&FOREGROUND.to_string())),
    )
    .await;
    wait_for(&api, "fg-loose", "loose dependent marked", |o| {
        o.is_some_and(|o| o.is_deleting())
    })
    .await;
    let other_uid = other.uid().unwrap().to_string();
    let s = wait_for(&api, "fg-shared", "shared dependent released", move |o| {
        o.is_some_and(|o| {
            o.owner_references().len() == 1 && o.owner_references()[0].uid == other_uid
        })
    })
    .await
    .unwrap();
    assert_eq!(s.uid(), shared.uid());
    assert!(
        !s.is_deleting(),
        "a dependent with a live owner is not deleted"
    );

    // Nothing above the held grandchild goes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let o = api.get("fg").await.unwrap();
    assert_eq!(o.uid(), owner.uid());
    assert!(o.is_deleting());
    assert_eq!(o.finalizers(), [FOREGROUND.to_string()]);
    let c = api.get("fg-child").await.unwrap();
    assert_eq!(c.uid(), child.uid());
    assert!(deletions.lock().unwrap().is_empty(), "{deletions:?}");

    // Release the grandchild: the tree goes bottom-up.
    api.patch(
        "fg-grandchild",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_for(
        &api,
        "fg",
        "owner deleted",
        conditions::is_deleted(owner.uid().unwrap()),
    )
    .await;
    assert!(api.get_opt("fg-child").await.unwrap().is_none());
    assert!(api.get_opt("fg-grandchild").await.unwrap().is_none());
    assert!(
        eventually(T, || deletions.lock().unwrap().len() >= 3).await,
        "{deletions:?}"
    );
    assert_eq!(
        deletions.lock().unwrap()[..3],
        ["fg-grandchild", "fg-child", "fg"],
        "bottom-up"
    );
    // The non-blocking dependent did not hold the owner: still there on its finalizer.
    let l = api.get("fg-loose").await.unwrap();
    assert_eq!(l.uid(), loose.uid());
    assert!(l.is_deleting());
    assert!(l.finalizers().contains(&HOLD.to_string()));
    assert!(api.get_opt("fg-shared").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_delete_keeps_dependents_without_the_reference() {
    let env = env().await;
    start_gc(&env).await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let owner = create(&api, alloc("or", "t1")).await;
    let other = create(&api, alloc("or-other", "t1")).await;
    let d1 = create(&api, owned_by("or-d1", &[&owner])).await;
    let d2 = create(&api, owned_by("or-d2", &[&owner, &other])).await;
    let gd = create(&api, owned_by("or-grandchild", &[&d1])).await;

    match api.delete("or", &DeleteParams::orphan()).await.unwrap() {
        DeleteResult::Pending(o) => assert_eq!(o.finalizers(), [ORPHAN.to_string()]),
        DeleteResult::Deleted(_) => panic!("an orphan delete only marks the owner"),
    }
    wait_for(
        &api,
        "or",
        "owner deleted",
        conditions::is_deleted(owner.uid().unwrap()),
    )
    .await;
    // By the time the owner is gone its dependents no longer name it.
    let a = api.get("or-d1").await.unwrap();
    assert_eq!(a.uid(), d1.uid());
    assert!(
        a.owner_references().is_empty(),
        "{:?}",
        a.owner_references()
    );
    let b = api.get("or-d2").await.unwrap();
    assert_eq!(b.uid(), d2.uid());
    assert_eq!(b.owner_references().len(), 1);
    assert_eq!(b.owner_references()[0].uid, other.uid().unwrap());
    // ... and nothing collects them afterwards.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (name, uid) in [("or-d1", &d1), ("or-d2", &d2), ("or-grandchild", &gd)] {
        let o = api.get(name).await.unwrap();
        assert_eq!(o.uid(), uid.uid(), "{name}");
        assert!(!o.is_deleting(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagation_policy_over_http() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let backend: Arc<dyn KvBackend> = Arc::new(store);
    let server = ApiServer::new(backend, ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = server
            .serve(listener, async move {
                let _ = rx.await;
            })
            .await;
    });
    let api: Api<Allocation> = Api::namespaced(Client::http(&base, None).unwrap(), "t1");
    create(&api, alloc("h", "t1")).await;
    let url = format!("{base}/apis/lattice.dev/v1alpha1/namespaces/t1/allocations/h");
    let http = reqwest::Client::new();

    // Invalid policies, in the body or the query: 422 naming the field and the values.
    let bad = [
        http.delete(&url).json(
            &json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Sideways"}),
        ),
        http.delete(format!("{url}?propagationPolicy=foreground")),
    ];
    for req in bad {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 422);
        let status: Value = resp.json().await.unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "Invalid");
        let msg = status["message"].as_str().unwrap();
        for word in ["propagationPolicy", "Foreground", "Background", "Orphan"] {
            assert!(msg.contains(word), "{word} in {msg}");
        }
        assert_eq!(status["details"]["causes"][0]["field"], "propagationPolicy");
    }
    assert!(
        !api.get("h").await.unwrap().is_deleting(),
        "nothing deleted"
    );
    assert!("Sideways".parse::<PropagationPolicy>().is_err());
    assert_eq!(
        "Orphan".parse::<PropagationPolicy>().unwrap(),
        PropagationPolicy::Orphan
    );

    // The HTTP transport sends the policy: the server marks the object.
    match api.delete("h", &DeleteParams::foreground()).await.unwrap() {
        DeleteResult::Pending(o) => assert_eq!(o.finalizers(), [FOREGROUND.to_string()]),
        DeleteResult::Deleted(_) => panic!("marked only"),
    }
    // A second delete may change its mind (Kubernetes does the same).
    match api.delete("h", &DeleteParams::orphan()).await.unwrap() {
        DeleteResult::Pending(o) => assert_eq!(o.finalizers(), [ORPHAN.to_string()]),
        DeleteResult::Deleted(_) => panic!("marked only"),
    }
    // An explicit Background drops the garbage-collection finalizer: gone now.
    match api.delete("h", &DeleteParams::background()).await.unwrap() {
        DeleteResult::Deleted(o) => assert!(o.finalizers().is_empty()),
        DeleteResult::Pending(o) => panic!("still pending: {:?}", o.finalizers()),
    }
    assert!(api.get_opt("h").await.unwrap().is_none());
    drop(tx);
}
