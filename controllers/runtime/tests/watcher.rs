//! The watcher against a real store: resume after a cut watch, relist after the store
//! compacted past its resourceVersion (410), no error ever ends the stream.

mod common;

use std::time::Duration;

use common::*;
use lattice_apis::Allocation;
use lattice_runtime::watcher::{self, Event};
use lattice_runtime::{Api, DeleteParams, Patch, PatchParams, PostParams, ResourceExt};
use serde_json::json;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_last_resource_version_after_a_cut() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();

    let inf = factory(&env).all::<Allocation>();
    let store = inf.store();
    tokio::time::timeout(T, store.wait_until_synced())
        .await
        .unwrap();
    assert_eq!(store.len(), 1);

    for i in 0..3 {
        env.transport.cut_watches();
        api.create(&PostParams::default(), &alloc(&format!("b{i}"), "t1"))
            .await
            .unwrap();
    }
    assert!(
        eventually(T, || store.len() == 4).await,
        "events after the cuts arrive"
    );
    // Resumed, not relisted: one list, several watches.
    assert_eq!(env.transport.lists_of("Allocation"), 1);
    assert!(env.transport.watches_of("Allocation") >= 2);
    let h = inf.health().borrow().clone();
    assert_eq!(h.lists, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relists_on_410_after_compaction_and_drops_what_vanished() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    for n in ["a1", "a2", "a3"] {
        api.create(&PostParams::default(), &alloc(n, "t1"))
            .await
            .unwrap();
    }
    let mut w = watcher::watcher(api.clone(), fast_watcher());
    let health = w.health();
    // Initial list.
    let mut init = Vec::new();
    loop {
        match tokio::time::timeout(T, futures::StreamExt::next(&mut w))
            .await
            .unwrap()
            .unwrap()
        {
            Event::Init => {}
            Event::InitApply(o) => init.push(o.name_any().to_string()),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(init.len(), 3);
    assert!(eventually(T, || health.borrow().is_healthy()).await);

    // Outage: watches are cut and refused while the store moves on and compacts.
    env.transport.block(true);
    env.transport.cut_watches();
    api.delete("a1", &DeleteParams::default()).await.unwrap();
    api.patch(
        "a2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &alloc("a4", "t1"))
        .await
        .unwrap();
    let rev = env.store.revision();
    env.backend.compact(rev).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        health.borrow().consecutive_failures >= 1,
        "the outage is visible in health"
    );
    env.transport.block(false);

    // The resume hits 410 and the watcher relists: Init, the current objects, InitDone.
    let mut relisted = None;
    let deadline = tokio::time::Instant::now() + T;
    let mut current = Vec::new();
    while relisted.is_none() {
        let ev = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut w))
            .await
            .expect("relist in time")
            .expect("stream never ends");
        match ev {
            Event::Init => current.clear(),
            Event::InitApply(o) => current.push(o.name_any().to_string()),
            Event::InitDone => relisted = Some(current.clone()),
            _ => {}
        }
    }
    let mut names = relisted.unwrap();
    names.sort();
    assert_eq!(names, vec!["a2", "a3", "a4"]);
    assert_eq!(env.transport.lists_of("Allocation"), 2);
    assert_eq!(health.borrow().lists, 2);
    assert!(eventually(T, || health.borrow().is_healthy()).await);

    // And it keeps watching.
    api.create(&PostParams::default(), &alloc("a5", "t1"))
        .await
        .unwrap();
    loop {
        let ev = tokio::time::timeout(T, futures::StreamExt::next(&mut w))
            .await
            .unwrap()
            .unwrap();
        if let Event::Apply(o) = ev {
            if o.name_any() == "a5" {
                break;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_cache_converges_after_relist() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    for n in ["a1", "a2"] {
        api.create(&PostParams::default(), &alloc(n, "t1"))
            .await
            .unwrap();
    }
    let inf = factory(&env).all::<Allocation>();
    let store = inf.store();
    tokio::time::timeout(T, store.wait_until_synced())
        .await
        .unwrap();
    env.transport.block(true);
    env.transport.cut_watches();
    api.delete("a1", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &alloc("a3", "t1"))
        .await
        .unwrap();
    env.backend.compact(env.store.revision()).await.unwrap();
    env.transport.block(false);
    assert!(
        eventually(T, || {
            let mut n: Vec<String> = store
                .state()
                .iter()
                .map(|a| a.name_any().to_string())
                .collect();
            n.sort();
            n == ["a2", "a3"]
        })
        .await,
        "cache matches the store after the relist"
    );
    assert!(store.by_label("app", "demo").len() == 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_without_managed_fields_lists_and_watches_objects_without_them() {
    use futures::StreamExt;
    use lattice_runtime::{ListParams, WatchEvent, WatchParams};
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let lean = api.clone().without_managed_fields();
    let apply = |label: &str| {
        let mut obj = serde_json::to_value(alloc("a1", "t1")).unwrap();
        obj["metadata"]["labels"] = json!({"v": label});
        lattice_runtime::Patch::Apply(obj)
    };
    api.patch("a1", &PatchParams::apply("tester"), &apply("1"))
        .await
        .unwrap();
    let full = api.list(&ListParams::default()).await.unwrap();
    assert!(!full.items[0].metadata.managed_fields.is_empty());
    let listed = lean.list(&ListParams::default()).await.unwrap();
    assert!(listed.items[0].metadata.managed_fields.is_empty());
    assert_eq!(listed.items[0].labels(), full.items[0].labels());
    assert_eq!(listed.items[0].spec, full.items[0].spec);

    let from = WatchParams {
        resource_version: listed.resource_version.clone(),
        ..Default::default()
    };
    let mut lean_events = lean.watch(&from).await.unwrap();
    let mut full_events = api.watch(&from).await.unwrap();
    api.patch("a1", &PatchParams::apply("tester"), &apply("2"))
        .await
        .unwrap();
    for (events, keeps) in [(&mut lean_events, false), (&mut full_events, true)] {
        match tokio::time::timeout(T, events.next()).await.unwrap() {
            Some(Ok(WatchEvent::Modified(a))) => {
                assert_eq!(a.labels().get("v").map(String::as_str), Some("2"));
                assert_eq!(!a.metadata.managed_fields.is_empty(), keeps);
            }
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
}
