//! Watch contract tests: initial events, resume, bookmarks, selectors, 410, fan-out.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lattice_apiserver::ApiConfig;
use lattice_store::KvBackend;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(10);

#[tokio::test]
async fn initial_events_then_changes() {
    let s = start().await;
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    s.post(&allocs("t1"), &alloc("b", "t1")).await;
    s.post(&allocs("t2"), &alloc("other", "t2")).await;
    let mut w = s.watch(&format!("{}?watch=1", allocs("t1"))).await;
    assert_eq!(w.status, 200);
    let e1 = w.next(T).await.unwrap();
    let e2 = w.next(T).await.unwrap();
    assert_eq!(
        (e1["type"].as_str(), e2["type"].as_str()),
        (Some("ADDED"), Some("ADDED"))
    );
    assert_eq!(e1["object"]["metadata"]["name"], "a");
    assert_eq!(e2["object"]["metadata"]["name"], "b");

    let (_, c) = s.post(&allocs("t1"), &alloc("c", "t1")).await;
    s.post(&allocs("t2"), &alloc("c", "t2")).await; // other tenant: not seen
    let e = w.next(T).await.unwrap();
    assert_eq!(e["type"], "ADDED");
    assert_eq!(
        e["object"]["metadata"]["resourceVersion"],
        c["metadata"]["resourceVersion"]
    );
    let (_, m) = s
        .patch(
            &format!("{}/c", allocs("t1")),
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"x":"1"}}}"#,
        )
        .await;
    let e = w.next(T).await.unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(rv(&e["object"]), rv(&m));
    let (_, d) = s.delete(&format!("{}/c", allocs("t1"))).await;
    let e = w.next(T).await.unwrap();
    assert_eq!(e["type"], "DELETED");
    assert_eq!(e["object"]["metadata"]["name"], "c");
    assert!(rv(&e["object"]) > rv(&m), "{e} {d}");

    // cross-tenant watch sees every tenant
    let mut all = s
        .watch(&format!(
            "{API}/allocations?watch=true&resourceVersion={}",
            rv(&m)
        ))
        .await;
    let e = all.next(T).await.unwrap();
    assert_eq!(e["type"], "DELETED");
}

#[tokio::test]
async fn resume_from_resource_version_and_timeout() {
    let s = start().await;
    let (_, a) = s.post(&allocs("t1"), &alloc("a", "t1")).await;
    let start_rv = rv(&a);
    for n in ["b", "c", "d"] {
        s.post(&allocs("t1"), &alloc(n, "t1")).await;
    }
    // from an rv before the cache existed (the cache starts there), then live
    let mut w = s
        .watch(&format!(
            "{}?watch=1&resourceVersion={start_rv}",
            allocs("t1")
        ))
        .await;
    for n in ["b", "c", "d"] {
        let e = w.next(T).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("ADDED"), Some(n))
        );
    }
    s.post(&allocs("t1"), &alloc("e", "t1")).await;
    assert_eq!(w.next(T).await.unwrap()["object"]["metadata"]["name"], "e");

    // now the cache is warm: resume from the middle
    let (_, list) = s.get(&allocs("t1")).await;
    let b_rv = rv(&list["items"][1]);
    let mut w2 = s
        .watch(&format!(
            "{}?watch=1&resourceVersion={b_rv}&timeoutSeconds=1",
            allocs("t1")
        ))
        .await;
    // c, d and e follow (from the cache's ring)
    let mut names = Vec::new();
    for _ in 0..3 {
        names.push(
            w2.next(T).await.unwrap()["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(names, ["c", "d", "e"]);
    let head = rv(&s.get(&allocs("t1")).await.1);
    let mut w3 = s
        .watch(&format!(
            "{}?watch=1&resourceVersion={head}&timeoutSeconds=1",
            allocs("t1")
        ))
        .await;
    s.post(&allocs("t1"), &alloc("f", "t1")).await;
    assert_eq!(w3.next(T).await.unwrap()["object"]["metadata"]["name"], "f");
    // timeoutSeconds ends the stream
    let started = Instant::now();
    assert!(w3.next(Duration::from_secs(5)).await.is_none());
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// `lattice_apiserver_watch_direct_total{kind="Allocation"}` (0 when absent).
async fn direct_watches(s: &TestServer) -> u64 {
    let (_, m) = s.get("/metrics").await;
    m.as_str()
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("lattice_apiserver_watch_direct_total{kind=\"Allocation\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn watchers_listing_before_the_cache_starts_are_served_by_it() {
    let s = start().await;
    let (_, first) = s.post(&allocs("t1"), &alloc("a0", "t1")).await;
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    // Clients list, the store moves on (another writer), then they all watch from the
    // list's revision: the cache starts there, and no watcher needs a store watch.
    let listed = rv(&s.get(&allocs("t1")).await.1);
    for n in ["b", "c"] {
        s.post(&allocs("t1"), &alloc(n, "t1")).await;
    }
    let mut ws = Vec::new();
    for _ in 0..20 {
        ws.push(
            s.watch(&format!(
                "{}?watch=1&resourceVersion={listed}&labelSelector=app%3Ddemo",
                allocs("t1")
            ))
            .await,
        );
    }
    s.post(&allocs("t1"), &alloc("d", "t1")).await;
    for w in &mut ws {
        for n in ["b", "c", "d"] {
            let e = w.next(T).await.unwrap();
            assert_eq!(
                (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
                (Some("ADDED"), Some(n))
            );
        }
    }
    assert_eq!(direct_watches(&s).await, 0);
    // A revision older than the cache's start still works, through the store.
    let mut old = s
        .watch(&format!(
            "{}?watch=1&resourceVersion={}",
            allocs("t1"),
            rv(&first)
        ))
        .await;
    let e = old.next(T).await.unwrap();
    assert_eq!(e["object"]["metadata"]["name"], "a");
    assert_eq!(direct_watches(&s).await, 1);
}

#[tokio::test]
async fn bookmarks_and_initial_events_end() {
    let s = start_with(ApiConfig {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    let mut w = s
        .watch(&format!(
            "{}?watch=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            allocs("t1")
        ))
        .await;
    let e = w.next(T).await.unwrap();
    assert_eq!(e["type"], "ADDED");
    let b = w.next(T).await.unwrap();
    assert_eq!(b["type"], "BOOKMARK", "{b}");
    assert_eq!(
        b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(b["object"]["kind"], "Allocation");
    // periodic bookmarks with only kind/apiVersion/metadata.resourceVersion
    let b = w.next(T).await.unwrap();
    assert_eq!(b["type"], "BOOKMARK");
    let keys: Vec<&String> = b["object"].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{b}");
    assert!(b["object"]["metadata"]["resourceVersion"].is_string());
    // a later change: its rv is above the bookmark's
    let brv = rv(&b["object"]);
    s.post(&allocs("t1"), &alloc("b", "t1")).await;
    let e = w.next_change(T).await.unwrap();
    assert!(rv(&e["object"]) > brv);
}

#[tokio::test]
async fn compacted_resource_version_is_410() {
    let s = start().await;
    for i in 0..5 {
        s.post(&allocs("t1"), &alloc(&format!("a{i}"), "t1")).await;
    }
    let head = s.store.status().await.unwrap().revision;
    s.store.compact(head).await.unwrap();
    let w = s
        .watch(&format!("{}?watch=1&resourceVersion=1", allocs("t1")))
        .await;
    assert_eq!(w.status, 410);
    let body = w.body().await;
    assert_eq!(body["reason"], "Expired");
    assert_eq!(body["code"], 410);
    // bad rv: 400
    let w = s
        .watch(&format!("{}?watch=1&resourceVersion=abc", allocs("t1")))
        .await;
    assert_eq!(w.status, 400);
}

#[tokio::test]
async fn selector_transitions() {
    let s = start().await;
    let mut w = s
        .watch(&format!("{}?watch=1&labelSelector=app%3Dweb", allocs("t1")))
        .await;
    let path = format!("{}/x", allocs("t1"));
    let mut o = alloc("x", "t1");
    o["metadata"]["labels"] = json!({"app": "web"});
    s.post(&allocs("t1"), &o).await;
    let mut other = alloc("y", "t1");
    other["metadata"]["labels"] = json!({"app": "db"});
    s.post(&allocs("t1"), &other).await; // never matches
    assert_eq!(w.next(T).await.unwrap()["type"], "ADDED");
    s.patch(
        &path,
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"app":"db"}}}"#,
    )
    .await;
    let e = w.next(T).await.unwrap();
    assert_eq!(e["type"], "DELETED", "{e}");
    s.patch(
        &path,
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"app":"web"}}}"#,
    )
    .await;
    assert_eq!(w.next(T).await.unwrap()["type"], "ADDED");
    s.patch(
        &path,
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"v":"2"}}}"#,
    )
    .await;
    assert_eq!(w.next(T).await.unwrap()["type"], "MODIFIED");
    s.delete(&path).await;
    assert_eq!(w.next(T).await.unwrap()["type"], "DELETED");
    assert!(w.next(Duration::from_millis(300)).await.is_none());
}

#[tokio::test]
async fn slow_watcher_falls_out_with_410_error_event() {
    let s = Arc::new(
        start_with(ApiConfig {
            // Small, so that the watcher that never reads falls out; not so small that
            // the one that reads falls out too when the machine is busy (15 writers).
            watch_cache_size: 64,
            ..Default::default()
        })
        .await,
    );
    let head = s.store.status().await.unwrap().revision;
    let mut slow = s
        .watch(&format!("{}?watch=1&resourceVersion={head}", allocs("t1")))
        .await;
    let mut fast = s
        .watch(&format!("{}?watch=1&resourceVersion={head}", allocs("t1")))
        .await;
    let big = "z".repeat(16 * 1024);
    let total = 1500;
    let mut tasks = Vec::new();
    for t in 0..15 {
        let s = s.clone();
        let big = big.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..total / 15 {
                let mut o = alloc(&format!("o{t}-{i}"), "t1");
                o["metadata"]["annotations"] = json!({"pad": big});
                assert_eq!(s.post(&allocs("t1"), &o).await.0, 201);
            }
        }));
    }
    // the fast watcher keeps up while the slow one never reads
    let mut seen = 0;
    while seen < total {
        let e = fast.next(T).await.expect("fast watcher stalled");
        assert_eq!(e["type"], "ADDED", "{}", e["object"]);
        seen += 1;
    }
    for t in tasks {
        t.await.unwrap();
    }
    // the slow one eventually reports 410 in-stream (or, if buffers absorbed it all, has every event)
    let mut n = 0;
    let mut last_type = Value::Null;
    while let Some(e) = slow.next(Duration::from_secs(2)).await {
        last_type = e["type"].clone();
        if e["type"] == "ERROR" {
            assert_eq!(e["object"]["code"], 410, "{e}");
            assert_eq!(e["object"]["reason"], "Expired");
            break;
        }
        n += 1;
    }
    assert!(
        last_type == "ERROR" || n == total,
        "slow watcher got {n} events, last {last_type}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_watchers_and_one_that_never_reads() {
    let s = Arc::new(start().await);
    let head = s.store.status().await.unwrap().revision;
    // The one that never reads, with its pipes filled well past the socket buffers.
    let _stuck = s
        .watch(&format!("{}?watch=1&resourceVersion={head}", allocs("t1")))
        .await;
    let big = "z".repeat(64 * 1024);
    for i in 0..150 {
        let mut o = alloc(&format!("big{i}"), "t1");
        o["metadata"]["annotations"] = json!({"pad": big});
        assert_eq!(s.post(&allocs("t1"), &o).await.0, 201);
    }
    let head = s.store.status().await.unwrap().revision;
    let mut watchers = Vec::new();
    let mut opens = Vec::new();
    for _ in 0..1000 {
        let s = s.clone();
        opens.push(tokio::spawn(async move {
            s.watch(&format!("{}?watch=1&resourceVersion={head}", allocs("t1")))
                .await
        }));
    }
    for o in opens {
        let w = o.await.unwrap();
        assert_eq!(w.status, 200);
        watchers.push(w);
    }
    let rounds = 5;
    let mut readers = Vec::new();
    let started = Instant::now();
    for mut w in watchers {
        readers.push(tokio::spawn(async move {
            let mut got = 0;
            while got < rounds {
                match w.next(Duration::from_secs(30)).await {
                    Some(e) if e["type"] == "ADDED" => got += 1,
                    Some(_) => {}
                    None => return Err(got),
                }
            }
            Ok(())
        }));
    }
    for i in 0..rounds {
        assert_eq!(
            s.post(&allocs("t1"), &alloc(&format!("w{i}"), "t1"))
                .await
                .0,
            201
        );
    }
    let mut failed = 0;
    for r in readers {
        if r.await.unwrap().is_err() {
            failed += 1;
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(failed, 0, "{failed} watchers missed events");
    assert!(
        elapsed < Duration::from_secs(30),
        "fan-out took {elapsed:?}"
    );
    eprintln!("1000 watchers x {rounds} events delivered in {elapsed:?}");
    // the metrics report the open watchers
    let m = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("lattice_apiserver_watchers{kind=\"Allocation\"}"),
        "{m}"
    );
}

#[tokio::test]
async fn graceful_shutdown_ends_watches() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        lattice_store::EmbeddedStore::open(dir.path(), lattice_store::StoreConfig::default())
            .await
            .unwrap();
    let server = lattice_apiserver::ApiServer::new(Arc::new(store), ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    let client = reqwest::Client::new();
    let resp = client
        .get(format!(
            "http://{addr}{API}/namespaces/t1/allocations?watch=1"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let started = Instant::now();
    tx.send(()).unwrap();
    let body = tokio::time::timeout(Duration::from_secs(3), resp.bytes()).await;
    assert!(matches!(body, Ok(Ok(_))), "the watch did not end: {body:?}");
    let res = tokio::time::timeout(Duration::from_secs(5), serving).await;
    assert!(
        matches!(res, Ok(Ok(Ok(())))),
        "serve did not return promptly: {res:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}
