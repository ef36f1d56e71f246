//! Backend conformance suite: etcd's observable semantics, written once against
//! `Arc<dyn KvBackend>`. Reference run: `tests/etcd_conformance.rs` (a real etcd 3.4
//! through `EtcdBackend`). Any other backend runs the same cases:
//!
//! ```ignore
//! mod suite;
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn embedded_conformance() {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = EmbeddedStore::open(dir.path(), StoreConfig::default()).await.unwrap();
//!     suite::run_all(std::sync::Arc::new(store)).await;
//! }
//! ```
//!
//! Cases share one store: each writes under its own unique prefix and only asserts on
//! revisions relative to ones it observed. Compaction runs last because it is global.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lattice_store::*;

pub type Backend = Arc<dyn KvBackend>;
type CaseFn = fn(Backend, String) -> Pin<Box<dyn Future<Output = ()> + Send>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every case, in the order `run_all` runs them (compaction last).
        pub const CASES: &[(&str, CaseFn)] = &[
            $((stringify!($name), |b, p| Box::pin($name(b, p)))),*
        ];
    };
}

cases!(
    put_and_get,
    put_ignore_value_and_lease,
    empty_key_rejected,
    range_prefix_limit_count_and_flags,
    range_sort_and_revision_filters,
    past_revision_reads,
    future_revision_read,
    txn_compare_value,
    txn_compare_version_create_mod,
    txn_compare_lease,
    txn_compare_over_range,
    txn_failure_branch_and_read_only_revision,
    nested_txn,
    delete_range_prev_kv,
    watch_replay_then_live_without_gap,
    watch_prev_kv_and_filters,
    watch_from_now_and_drop,
    leases_grant_attach_ttl_keepalive_list_revoke,
    lease_errors,
    lease_expiry_deletes_keys,
    status_reports_revision,
    compaction,
);

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A unique key prefix for one case run.
pub fn unique_prefix(case: &str) -> String {
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("/conformance/{case}/{t:x}-{n}/")
}

/// Run every case in order; a failing case panics with its name.
pub async fn run_all(backend: Backend) {
    run_all_except(backend, &[]).await;
}

/// Run every case except the named ones (known divergences, to be fixed). The skipped
/// names are printed so they stay visible.
pub async fn run_all_except(backend: Backend, skip: &[&str]) {
    for s in skip {
        assert!(
            CASES.iter().any(|(n, _)| n == s),
            "unknown conformance case {s}"
        );
    }
    for (name, case) in CASES {
        if skip.contains(name) {
            eprintln!("conformance: {name} SKIPPED (known divergence)");
            continue;
        }
        run_case(backend.clone(), name, *case).await;
    }
}

/// Run every case, collecting failures instead of stopping at the first; returns the
/// names of the failed cases.
pub async fn run_all_collect(backend: Backend) -> Vec<String> {
    let mut failed = Vec::new();
    for (name, case) in CASES {
        let b = backend.clone();
        let n = name.to_string();
        let c = *case;
        if tokio::spawn(async move { run_case(b, &n, c).await })
            .await
            .is_err()
        {
            failed.push(name.to_string());
        }
    }
    failed
}

/// Run one case by name (for backends that want one test per case).
pub async fn run_named(backend: Backend, name: &str) {
    let (n, case) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no conformance case named {name}"));
    run_case(backend, n, *case).await;
}

async fn run_case(backend: Backend, name: &str, case: CaseFn) {
    eprintln!("conformance: {name} ...");
    let started = std::time::Instant::now();
    let fut = case(backend, unique_prefix(name));
    match tokio::time::timeout(Duration::from_secs(60), tokio::spawn(fut)).await {
        Ok(Ok(())) => eprintln!("conformance: {name} ok ({:?})", started.elapsed()),
        Ok(Err(e)) => {
            let msg = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "non-string panic".into()),
                Err(e) => e.to_string(),
            };
            panic!("conformance case `{name}` failed: {msg}");
        }
        Err(_) => panic!("conformance case `{name}` timed out after 60s"),
    }
}

// ------------------------------------------------------------------------------ helpers

fn k(prefix: &str, s: &str) -> Bytes {
    Bytes::from(format!("{prefix}{s}"))
}

async fn put(b: &Backend, key: Bytes, value: &str) -> i64 {
    b.put(PutRequest::new(key.clone(), value.to_string()))
        .await
        .unwrap_or_else(|e| panic!("put {key:?}: {e}"))
        .revision
}

async fn get(b: &Backend, key: Bytes) -> Option<KeyValue> {
    b.get(key.clone())
        .await
        .unwrap_or_else(|e| panic!("get {key:?}: {e}"))
}

async fn get_at(b: &Backend, key: Bytes, rev: i64) -> StoreResult<Option<KeyValue>> {
    let req = RangeRequest {
        revision: rev,
        ..RangeRequest::key(key)
    };
    Ok(b.range(req).await?.kvs.into_iter().next())
}

async fn current_revision(b: &Backend) -> i64 {
    b.range(RangeRequest {
        serializable: true,
        ..RangeRequest::key("\0")
    })
    .await
    .expect("read revision")
    .revision
}

fn values(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
        .collect()
}

fn keys(kvs: &[KeyValue], prefix: &str) -> Vec<String> {
    kvs.iter()
        .map(|kv| {
            String::from_utf8_lossy(&kv.key)
                .trim_start_matches(prefix)
                .to_string()
        })
        .collect()
}

async fn txn(
    b: &Backend,
    compare: Vec<Compare>,
    success: Vec<TxnOp>,
    failure: Vec<TxnOp>,
) -> TxnResponse {
    b.txn(TxnRequest {
        compare,
        success,
        failure,
    })
    .await
    .expect("txn")
}

/// Whether a single-compare txn succeeds.
async fn holds(b: &Backend, c: Compare) -> bool {
    txn(b, vec![c], vec![], vec![]).await.succeeded
}

async fn next_batch(w: &mut WatchStream) -> WatchBatch {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(b))) => b,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("watch stalled for 10s"),
    }
}

/// Collect `n` events (skipping progress notifications).
async fn collect_events(w: &mut WatchStream, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    while out.len() < n {
        let batch = next_batch(w).await;
        for ev in &batch.events {
            assert!(
                ev.kv.mod_revision <= batch.revision || batch.revision == 0,
                "event revision {} above its batch revision {}",
                ev.kv.mod_revision,
                batch.revision
            );
        }
        out.extend(batch.events);
    }
    assert_eq!(out.len(), n, "more events than expected: {out:?}");
    out
}

/// No event arrives within `d` (progress notifications allowed).
async fn assert_quiet(w: &mut WatchStream, d: Duration) {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Err(_) => return,
            Ok(Some(Ok(b))) if b.events.is_empty() => continue,
            Ok(other) => panic!("expected no events, got {other:?}"),
        }
    }
}

fn is_compacted(e: &StoreError, at: i64) -> bool {
    matches!(e, StoreError::Compacted { compact_revision } if *compact_revision == at)
}

// -------------------------------------------------------------------------------- cases

async fn put_and_get(b: Backend, p: String) {
    let key = k(&p, "a");
    assert!(get(&b, key.clone()).await.is_none(), "fresh key exists");
    let r1 = put(&b, key.clone(), "v1").await;
    assert!(r1 > 0);
    let kv = get(&b, key.clone()).await.expect("key after put");
    assert_eq!(kv.key, key);
    assert_eq!(kv.value, Bytes::from("v1"));
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version, kv.lease),
        (r1, r1, 1, 0)
    );

    let resp = b
        .put(PutRequest {
            prev_kv: true,
            ..PutRequest::new(key.clone(), "v2")
        })
        .await
        .expect("put with prev_kv");
    let r2 = resp.revision;
    assert_eq!(
        r2,
        r1 + 1,
        "one revision per write (no other writers in this case)"
    );
    let prev = resp.prev_kv.expect("prev_kv requested");
    assert_eq!(
        (prev.value.clone(), prev.mod_revision, prev.version),
        (Bytes::from("v1"), r1, 1)
    );
    let kv = get(&b, key.clone()).await.expect("key");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r1, r2, 2)
    );
    assert_eq!(kv.value, Bytes::from("v2"));

    // Without prev_kv, no prev_kv.
    let resp = b
        .put(PutRequest::new(key.clone(), "v3"))
        .await
        .expect("put");
    assert!(resp.prev_kv.is_none());

    // prev_kv on a fresh key: none.
    let resp = b
        .put(PutRequest {
            prev_kv: true,
            ..PutRequest::new(k(&p, "fresh"), "x")
        })
        .await
        .expect("put");
    assert!(resp.prev_kv.is_none());

    // Delete then recreate: create_revision and version restart.
    let d = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single(key.clone()),
            prev_kv: false,
        })
        .await
        .expect("delete");
    assert_eq!(d.deleted, 1);
    let r = put(&b, key.clone(), "again").await;
    let kv = get(&b, key).await.expect("recreated");
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r, r, 1));
}

async fn put_ignore_value_and_lease(b: Backend, p: String) {
    let key = k(&p, "k");
    let err = b
        .put(PutRequest {
            ignore_value: true,
            ..PutRequest::new(key.clone(), "")
        })
        .await
        .expect_err("ignore_value on a missing key");
    assert_eq!(err, StoreError::KeyNotFound);

    let lease = b.lease_grant(0, 60).await.expect("grant");
    b.put(PutRequest {
        lease: lease.id,
        ..PutRequest::new(key.clone(), "orig")
    })
    .await
    .expect("put");
    // ignore_value keeps the value, ignore_lease keeps the lease.
    b.put(PutRequest {
        ignore_value: true,
        ignore_lease: true,
        ..PutRequest::new(key.clone(), "")
    })
    .await
    .expect("put ignore both");
    let kv = get(&b, key.clone()).await.expect("key");
    assert_eq!(
        (kv.value.clone(), kv.lease, kv.version),
        (Bytes::from("orig"), lease.id, 2)
    );
    // A plain put detaches the lease.
    put(&b, key.clone(), "new").await;
    let kv = get(&b, key.clone()).await.expect("key");
    assert_eq!(kv.lease, 0);
    b.lease_revoke(lease.id).await.expect("revoke");
    assert!(
        get(&b, key).await.is_some(),
        "detached key survives the revoke"
    );
}

async fn empty_key_rejected(b: Backend, _p: String) {
    let e = b
        .put(PutRequest::new(Bytes::new(), "v"))
        .await
        .expect_err("empty key put");
    assert_eq!(e, StoreError::EmptyKey);
    let e = b
        .range(RangeRequest::key(Bytes::new()))
        .await
        .expect_err("empty key range");
    assert_eq!(e, StoreError::EmptyKey);
}

async fn range_prefix_limit_count_and_flags(b: Backend, p: String) {
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        put(&b, k(&p, name), &format!("v{i}")).await;
    }
    // A key just outside the prefix must not show.
    let outside = format!("{}0", p.trim_end_matches('/'));
    put(&b, Bytes::from(outside.clone()), "out").await;

    let all = b
        .range(RangeRequest::prefix(p.clone()))
        .await
        .expect("prefix");
    assert_eq!(keys(&all.kvs, &p), ["a", "b", "c", "d"]);
    assert_eq!(values(&all.kvs), ["v0", "v1", "v2", "v3"]);
    assert_eq!((all.count, all.more), (4, false));

    let lim = b
        .range(RangeRequest {
            limit: 2,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("limit");
    assert_eq!(keys(&lim.kvs, &p), ["a", "b"]);
    assert_eq!((lim.count, lim.more), (4, true));

    let lim4 = b
        .range(RangeRequest {
            limit: 4,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("limit 4");
    assert_eq!((lim4.kvs.len(), lim4.more), (4, false));

    let ko = b
        .range(RangeRequest {
            keys_only: true,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("keys_only");
    assert_eq!(keys(&ko.kvs, &p), ["a", "b", "c", "d"]);
    assert!(ko
        .kvs
        .iter()
        .all(|kv| kv.value.is_empty() && kv.mod_revision > 0 && kv.version == 1));

    let co = b
        .range(RangeRequest {
            count_only: true,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("count_only");
    assert!(co.kvs.is_empty());
    assert_eq!(co.count, 4);

    // [b, d)
    let between = b
        .range(RangeRequest {
            range: KeyRange::between(k(&p, "b"), k(&p, "d")),
            ..Default::default()
        })
        .await
        .expect("between");
    assert_eq!(keys(&between.kvs, &p), ["b", "c"]);

    // From c to the end of the keyspace ("\0").
    let from = b
        .range(RangeRequest {
            range: KeyRange::between(k(&p, "c"), "\0"),
            ..Default::default()
        })
        .await
        .expect("from key");
    let got: Vec<_> = from.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert!(got.contains(&k(&p, "c")) && got.contains(&k(&p, "d")));
    assert!(!got.contains(&k(&p, "a")) && !got.contains(&k(&p, "b")));
    assert!(got.windows(2).all(|w| w[0] < w[1]), "keys sorted ascending");

    // Single key miss.
    let miss = b.range(RangeRequest::key(k(&p, "zz"))).await.expect("miss");
    assert!(miss.kvs.is_empty() && miss.count == 0 && miss.revision > 0);
}

async fn range_sort_and_revision_filters(b: Backend, p: String) {
    let ra = put(&b, k(&p, "a"), "3").await;
    let rb = put(&b, k(&p, "b"), "1").await;
    let rc = put(&b, k(&p, "c"), "2").await;
    put(&b, k(&p, "a"), "9").await; // a: version 2, newest mod revision

    let sorted = |order, target| RangeRequest {
        sort_order: order,
        sort_target: target,
        ..RangeRequest::prefix(p.clone())
    };
    let r = b
        .range(sorted(SortOrder::Descend, SortTarget::Key))
        .await
        .expect("desc key");
    assert_eq!(keys(&r.kvs, &p), ["c", "b", "a"]);
    let r = b
        .range(sorted(SortOrder::Ascend, SortTarget::Value))
        .await
        .expect("asc value");
    assert_eq!(keys(&r.kvs, &p), ["b", "c", "a"]);
    let r = b
        .range(sorted(SortOrder::Descend, SortTarget::Mod))
        .await
        .expect("desc mod");
    assert_eq!(keys(&r.kvs, &p), ["a", "c", "b"]);
    let r = b
        .range(sorted(SortOrder::Ascend, SortTarget::Create))
        .await
        .expect("asc create");
    assert_eq!(keys(&r.kvs, &p), ["a", "b", "c"]);
    let r = b
        .range(sorted(SortOrder::Descend, SortTarget::Version))
        .await
        .expect("desc version");
    assert_eq!(keys(&r.kvs, &p)[0], "a");
    // Sort with limit: the limit applies after sorting.
    let r = b
        .range(RangeRequest {
            limit: 1,
            ..sorted(SortOrder::Descend, SortTarget::Key)
        })
        .await
        .expect("sort+limit");
    assert_eq!(keys(&r.kvs, &p), ["c"]);

    let r = b
        .range(RangeRequest {
            min_mod_revision: rc,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("min mod");
    assert_eq!(keys(&r.kvs, &p), ["a", "c"]);
    let r = b
        .range(RangeRequest {
            max_mod_revision: rb,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("max mod");
    assert_eq!(keys(&r.kvs, &p), ["b"]);
    let r = b
        .range(RangeRequest {
            min_create_revision: rb,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("min create");
    assert_eq!(keys(&r.kvs, &p), ["b", "c"]);
    let r = b
        .range(RangeRequest {
            max_create_revision: ra,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("max create");
    assert_eq!(keys(&r.kvs, &p), ["a"]);
}

async fn past_revision_reads(b: Backend, p: String) {
    let key = k(&p, "k");
    let r1 = put(&b, key.clone(), "v1").await;
    let r2 = put(&b, key.clone(), "v2").await;
    put(&b, k(&p, "other"), "o").await;
    let d = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single(key.clone()),
            prev_kv: false,
        })
        .await
        .expect("delete");
    let r3 = d.revision;
    assert!(r1 < r2 && r2 < r3);

    let at = |rev| get_at(&b, key.clone(), rev);
    let kv1 = at(r1).await.expect("read r1").expect("present at r1");
    assert_eq!(
        (kv1.value.clone(), kv1.version, kv1.mod_revision),
        (Bytes::from("v1"), 1, r1)
    );
    let kv2 = at(r2).await.expect("read r2").expect("present at r2");
    assert_eq!((kv2.value.clone(), kv2.version), (Bytes::from("v2"), 2));
    assert_eq!(
        at(r2 + 1).await.expect("between").map(|kv| kv.value),
        Some(Bytes::from("v2"))
    );
    assert!(at(r3).await.expect("read r3").is_none(), "deleted at r3");
    assert!(get(&b, key.clone()).await.is_none());
    // A past read reports the revision it asked for? etcd reports the current revision.
    let resp = b
        .range(RangeRequest {
            revision: r1,
            ..RangeRequest::key(key.clone())
        })
        .await
        .expect("past");
    assert!(
        resp.revision >= r3,
        "header revision is the store's current revision"
    );
    // Prefix read at a past revision.
    let resp = b
        .range(RangeRequest {
            revision: r1,
            ..RangeRequest::prefix(p.clone())
        })
        .await
        .expect("past prefix");
    assert_eq!(keys(&resp.kvs, &p), ["k"]);
}

async fn future_revision_read(b: Backend, p: String) {
    let r = put(&b, k(&p, "k"), "v").await;
    let asked = r + 1_000_000;
    let err = b
        .range(RangeRequest {
            revision: asked,
            ..RangeRequest::key(k(&p, "k"))
        })
        .await
        .expect_err("future revision");
    match err {
        StoreError::FutureRevision { requested, current } => {
            assert_eq!(requested, asked);
            assert!(current >= r && current < asked, "current {current}");
        }
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

async fn txn_compare_value(b: Backend, p: String) {
    let key = k(&p, "v");
    use CompareResult::*;
    // Missing key: every value compare fails, whatever the operator.
    for op in [Equal, NotEqual, Greater, Less] {
        assert!(
            !holds(&b, Compare::value(key.clone(), op, "")).await,
            "{op:?} on missing key"
        );
    }
    put(&b, key.clone(), "m").await;
    assert!(holds(&b, Compare::value(key.clone(), Equal, "m")).await);
    assert!(!holds(&b, Compare::value(key.clone(), Equal, "n")).await);
    assert!(holds(&b, Compare::value(key.clone(), NotEqual, "n")).await);
    assert!(!holds(&b, Compare::value(key.clone(), NotEqual, "m")).await);
    assert!(holds(&b, Compare::value(key.clone(), Greater, "a")).await);
    assert!(!holds(&b, Compare::value(key.clone(), Greater, "z")).await);
    assert!(holds(&b, Compare::value(key.clone(), Less, "z")).await);
    assert!(!holds(&b, Compare::value(key.clone(), Less, "m")).await);
    // Bytewise, not numeric.
    assert!(holds(&b, Compare::value(key.clone(), Greater, "10000")).await);
}

async fn txn_compare_version_create_mod(b: Backend, p: String) {
    use CompareResult::*;
    let key = k(&p, "x");
    // Missing key: version, create and mod revision are 0.
    assert!(holds(&b, Compare::version(key.clone(), Equal, 0)).await);
    assert!(holds(&b, Compare::create_revision(key.clone(), Equal, 0)).await);
    assert!(holds(&b, Compare::mod_revision(key.clone(), Equal, 0)).await);
    assert!(!holds(&b, Compare::version(key.clone(), Greater, 0)).await);

    // kube-apiserver's create: If mod_revision == 0 Then put.
    let create = txn(
        &b,
        vec![Compare::mod_revision(key.clone(), Equal, 0)],
        vec![TxnOp::Put(PutRequest::new(key.clone(), "1"))],
        vec![TxnOp::Range(RangeRequest::key(key.clone()))],
    )
    .await;
    assert!(create.succeeded);
    let rc = create.revision;
    let again = txn(
        &b,
        vec![Compare::mod_revision(key.clone(), Equal, 0)],
        vec![TxnOp::Put(PutRequest::new(key.clone(), "1"))],
        vec![TxnOp::Range(RangeRequest::key(key.clone()))],
    )
    .await;
    assert!(!again.succeeded, "second create must fail");
    assert_eq!(
        again.revision, rc,
        "failed compare with a read-only branch writes nothing"
    );
    match &again.responses[..] {
        [TxnOpResponse::Range(r)] => assert_eq!(r.kvs[0].mod_revision, rc),
        other => panic!("unexpected responses {other:?}"),
    }
    let rm = put(&b, key.clone(), "2").await;

    for (cmp, expect) in [
        (Compare::version(key.clone(), Equal, 2), true),
        (Compare::version(key.clone(), NotEqual, 2), false),
        (Compare::version(key.clone(), Greater, 1), true),
        (Compare::version(key.clone(), Greater, 2), false),
        (Compare::version(key.clone(), Less, 3), true),
        (Compare::version(key.clone(), Less, 2), false),
        (Compare::create_revision(key.clone(), Equal, rc), true),
        (Compare::create_revision(key.clone(), NotEqual, rc), false),
        (Compare::create_revision(key.clone(), Greater, rc - 1), true),
        (Compare::create_revision(key.clone(), Less, rc), false),
        (Compare::mod_revision(key.clone(), Equal, rm), true),
        (Compare::mod_revision(key.clone(), Equal, rc), false),
        (Compare::mod_revision(key.clone(), NotEqual, rc), true),
        (Compare::mod_revision(key.clone(), Greater, rc), true),
        (Compare::mod_revision(key.clone(), Less, rm), false),
        (Compare::mod_revision(key.clone(), Less, rm + 1), true),
    ] {
        assert_eq!(holds(&b, cmp.clone()).await, expect, "{cmp:?}");
    }

    // Guarded update (optimistic concurrency).
    let upd = txn(
        &b,
        vec![Compare::mod_revision(key.clone(), Equal, rm)],
        vec![TxnOp::Put(PutRequest::new(key.clone(), "3"))],
        vec![],
    )
    .await;
    assert!(upd.succeeded && upd.revision == rm + 1);
    let stale = txn(
        &b,
        vec![Compare::mod_revision(key.clone(), Equal, rm)],
        vec![TxnOp::Put(PutRequest::new(key.clone(), "4"))],
        vec![],
    )
    .await;
    assert!(!stale.succeeded);
    assert_eq!(
        get(&b, key).await.map(|kv| kv.value),
        Some(Bytes::from("3"))
    );
}

async fn txn_compare_lease(b: Backend, p: String) {
    use CompareResult::*;
    let key = k(&p, "l");
    let lease = b.lease_grant(0, 60).await.expect("grant");
    b.put(PutRequest {
        lease: lease.id,
        ..PutRequest::new(key.clone(), "v")
    })
    .await
    .expect("put");
    assert!(holds(&b, Compare::lease(key.clone(), Equal, lease.id)).await);
    assert!(!holds(&b, Compare::lease(key.clone(), Equal, 0)).await);
    assert!(holds(&b, Compare::lease(key.clone(), NotEqual, 0)).await);
    assert!(holds(&b, Compare::lease(key.clone(), Greater, 0)).await);
    assert!(!holds(&b, Compare::lease(key.clone(), Less, lease.id)).await);
    // A key without a lease has lease 0; a missing key too.
    assert!(holds(&b, Compare::lease(k(&p, "missing"), Equal, 0)).await);
    b.lease_revoke(lease.id).await.expect("revoke");
}

async fn txn_compare_over_range(b: Backend, p: String) {
    use CompareResult::*;
    put(&b, k(&p, "r/a"), "1").await;
    put(&b, k(&p, "r/b"), "1").await;
    let range = KeyRange::prefix(k(&p, "r/"));
    let over = |target, result| Compare {
        range: range.clone(),
        result,
        target,
    };
    assert!(holds(&b, over(CompareTarget::Version(1), Equal)).await);
    assert!(holds(&b, over(CompareTarget::Value(Bytes::from("1")), Equal)).await);
    put(&b, k(&p, "r/b"), "2").await;
    assert!(
        !holds(&b, over(CompareTarget::Version(1), Equal)).await,
        "one key differs"
    );
    assert!(holds(&b, over(CompareTarget::Version(0), Greater)).await);
    assert!(!holds(&b, over(CompareTarget::Value(Bytes::from("1")), Equal)).await);
    // An empty range: version compares against 0, value compares fail.
    let empty = KeyRange::prefix(k(&p, "none/"));
    assert!(
        holds(
            &b,
            Compare {
                range: empty.clone(),
                result: Equal,
                target: CompareTarget::Version(0)
            }
        )
        .await
    );
    assert!(
        !holds(
            &b,
            Compare {
                range: empty,
                result: Equal,
                target: CompareTarget::Value(Bytes::new())
            }
        )
        .await
    );
}

async fn txn_failure_branch_and_read_only_revision(b: Backend, p: String) {
    let a = k(&p, "a");
    let c = k(&p, "c");
    put(&b, a.clone(), "1").await;
    let before = current_revision(&b).await;
    // Read-only success branch: no new revision.
    let ro = txn(
        &b,
        vec![],
        vec![TxnOp::Range(RangeRequest::key(a.clone()))],
        vec![],
    )
    .await;
    assert!(ro.succeeded);
    assert_eq!(ro.revision, before);
    // Deleting nothing writes nothing either.
    let nothing = txn(
        &b,
        vec![],
        vec![TxnOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single(k(&p, "nope")),
            prev_kv: false,
        })],
        vec![],
    )
    .await;
    assert_eq!(nothing.revision, before);
    // Failure branch with several writes: one revision for all.
    let r = txn(
        &b,
        vec![Compare::value(a.clone(), CompareResult::Equal, "other")],
        vec![TxnOp::Put(PutRequest::new(c.clone(), "never"))],
        vec![
            TxnOp::Put(PutRequest::new(k(&p, "f1"), "x")),
            TxnOp::Put(PutRequest::new(k(&p, "f2"), "y")),
            TxnOp::Range(RangeRequest::prefix(k(&p, "f"))),
        ],
    )
    .await;
    assert!(!r.succeeded);
    assert_eq!(r.revision, before + 1);
    assert!(get(&b, c).await.is_none());
    let f1 = get(&b, k(&p, "f1")).await.expect("f1");
    let f2 = get(&b, k(&p, "f2")).await.expect("f2");
    assert_eq!((f1.mod_revision, f2.mod_revision), (before + 1, before + 1));
    match &r.responses[..] {
        [TxnOpResponse::Put(p1), TxnOpResponse::Put(_), TxnOpResponse::Range(rr)] => {
            assert_eq!(p1.revision, before + 1);
            // The range inside the txn sees the txn's own writes.
            assert_eq!(rr.count, 2);
        }
        other => panic!("unexpected responses {other:?}"),
    }
}

async fn nested_txn(b: Backend, p: String) {
    let a = k(&p, "a");
    put(&b, a.clone(), "1").await;
    let before = current_revision(&b).await;
    let inner = TxnRequest {
        compare: vec![Compare::value(a.clone(), CompareResult::Equal, "1")],
        success: vec![TxnOp::Put(PutRequest::new(k(&p, "inner-ok"), "y"))],
        failure: vec![TxnOp::Put(PutRequest::new(k(&p, "inner-fail"), "n"))],
    };
    let inner_fails = TxnRequest {
        compare: vec![Compare::value(a.clone(), CompareResult::Equal, "2")],
        success: vec![],
        failure: vec![TxnOp::Range(RangeRequest::key(a.clone()))],
    };
    let r = txn(
        &b,
        vec![Compare::version(a.clone(), CompareResult::Equal, 1)],
        vec![
            TxnOp::Put(PutRequest::new(k(&p, "outer"), "x")),
            TxnOp::Txn(inner),
            TxnOp::Txn(inner_fails),
        ],
        vec![],
    )
    .await;
    assert!(r.succeeded);
    assert_eq!(r.revision, before + 1, "nested writes share one revision");
    match &r.responses[..] {
        [TxnOpResponse::Put(_), TxnOpResponse::Txn(t1), TxnOpResponse::Txn(t2)] => {
            assert!(t1.succeeded);
            assert!(matches!(&t1.responses[..], [TxnOpResponse::Put(_)]));
            assert!(!t2.succeeded);
            match &t2.responses[..] {
                [TxnOpResponse::Range(rr)] => assert_eq!(values(&rr.kvs), ["1"]),
                other => panic!("inner failure responses {other:?}"),
            }
        }
        other => panic!("unexpected responses {other:?}"),
    }
    assert_eq!(
        get(&b, k(&p, "outer")).await.map(|kv| kv.mod_revision),
        Some(before + 1)
    );
    assert_eq!(
        get(&b, k(&p, "inner-ok")).await.map(|kv| kv.mod_revision),
        Some(before + 1)
    );
    assert!(get(&b, k(&p, "inner-fail")).await.is_none());
}

async fn delete_range_prev_kv(b: Backend, p: String) {
    put(&b, k(&p, "d/a"), "1").await;
    put(&b, k(&p, "d/b"), "2").await;
    put(&b, k(&p, "d/c"), "3").await;
    put(&b, k(&p, "keep"), "k").await;
    let one = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single(k(&p, "d/a")),
            prev_kv: true,
        })
        .await
        .expect("delete one");
    assert_eq!(one.deleted, 1);
    assert_eq!(values(&one.prev_kvs), ["1"]);
    let many = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::prefix(k(&p, "d/")),
            prev_kv: true,
        })
        .await
        .expect("delete prefix");
    assert_eq!(many.deleted, 2);
    assert_eq!(values(&many.prev_kvs), ["2", "3"]);
    assert_eq!(many.revision, one.revision + 1);
    let none = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::prefix(k(&p, "d/")),
            prev_kv: true,
        })
        .await
        .expect("delete nothing");
    assert_eq!((none.deleted, none.prev_kvs.len()), (0, 0));
    assert_eq!(
        none.revision, many.revision,
        "deleting nothing does not bump the revision"
    );
    let no_prev = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single(k(&p, "keep")),
            prev_kv: false,
        })
        .await
        .expect("delete keep");
    assert_eq!(no_prev.deleted, 1);
    assert!(no_prev.prev_kvs.is_empty());
}

async fn watch_replay_then_live_without_gap(b: Backend, p: String) {
    let r1 = put(&b, k(&p, "a"), "1").await;
    let r2 = put(&b, k(&p, "b"), "1").await;
    let r3 = put(&b, k(&p, "a"), "2").await;
    let d = b
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single(k(&p, "b")),
            prev_kv: false,
        })
        .await
        .expect("delete");
    let r4 = d.revision;
    put(
        &b,
        Bytes::from(format!("{}x", p.trim_end_matches('/'))),
        "outside",
    )
    .await;

    let mut w = b
        .watch(WatchRequest {
            range: KeyRange::prefix(p.clone()),
            start_revision: r2,
            ..Default::default()
        })
        .await
        .expect("watch from the past");
    // Live writes race with the replay.
    let writer = {
        let b = b.clone();
        let p = p.clone();
        tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..20 {
                revs.push(put(&b, k(&p, &format!("live{i:02}")), "x").await);
            }
            revs
        })
    };
    let events = collect_events(&mut w, 3 + 20).await;
    let live_revs = writer.await.expect("writer");
    let got: Vec<i64> = events.iter().map(|e| e.kv.mod_revision).collect();
    let mut want = vec![r2, r3, r4];
    want.extend(live_revs);
    assert_eq!(
        got, want,
        "history then live, in order, no gap, no duplicate"
    );
    assert!(r1 < r2);

    let e_b = &events[0];
    assert_eq!(
        (e_b.kind, e_b.kv.key.clone(), e_b.kv.version),
        (EventType::Put, k(&p, "b"), 1)
    );
    assert_eq!(e_b.kv.create_revision, r2);
    let e_a = &events[1];
    assert_eq!(
        (e_a.kind, e_a.kv.version, e_a.kv.create_revision),
        (EventType::Put, 2, r1)
    );
    assert_eq!(e_a.kv.value, Bytes::from("2"));
    assert!(e_a.prev_kv.is_none(), "prev_kv not requested");
    let e_del = &events[2];
    assert_eq!(e_del.kind, EventType::Delete);
    assert_eq!(
        (e_del.kv.key.clone(), e_del.kv.mod_revision),
        (k(&p, "b"), r4)
    );
    assert!(e_del.kv.value.is_empty());
    assert_quiet(&mut w, Duration::from_millis(300)).await;
}

async fn watch_prev_kv_and_filters(b: Backend, p: String) {
    let key = k(&p, "k");
    let start = put(&b, key.clone(), "1").await;
    put(&b, key.clone(), "2").await;
    b.delete_range(DeleteRangeRequest {
        range: KeyRange::single(key.clone()),
        prev_kv: false,
    })
    .await
    .expect("delete");
    put(&b, key.clone(), "3").await;

    let req = |filters, prev_kv| WatchRequest {
        range: KeyRange::single(key.clone()),
        start_revision: start,
        prev_kv,
        filters,
        ..Default::default()
    };
    let mut all = b
        .watch(req(WatchFilters::default(), true))
        .await
        .expect("watch prev_kv");
    let ev = collect_events(&mut all, 4).await;
    assert!(ev[0].prev_kv.is_none(), "create has no previous version");
    assert_eq!(
        ev[1].prev_kv.as_ref().map(|kv| kv.value.clone()),
        Some(Bytes::from("1"))
    );
    assert_eq!(ev[2].kind, EventType::Delete);
    let prev = ev[2].prev_kv.as_ref().expect("delete carries prev_kv");
    assert_eq!((prev.value.clone(), prev.version), (Bytes::from("2"), 2));
    assert!(
        ev[3].prev_kv.is_none(),
        "re-create after delete has no prev_kv"
    );
    assert_eq!(ev[3].kv.version, 1);

    let mut no_put = b
        .watch(req(
            WatchFilters {
                no_put: true,
                no_delete: false,
            },
            false,
        ))
        .await
        .expect("noput");
    let ev = collect_events(&mut no_put, 1).await;
    assert_eq!(ev[0].kind, EventType::Delete);
    let mut no_del = b
        .watch(req(
            WatchFilters {
                no_put: false,
                no_delete: true,
            },
            false,
        ))
        .await
        .expect("nodelete");
    let ev = collect_events(&mut no_del, 3).await;
    assert!(ev.iter().all(|e| e.kind == EventType::Put));

    // Live events respect the filters too.
    put(&b, key.clone(), "4").await;
    b.delete_range(DeleteRangeRequest {
        range: KeyRange::single(key.clone()),
        prev_kv: false,
    })
    .await
    .expect("delete");
    let ev = collect_events(&mut no_put, 1).await;
    assert_eq!(ev[0].kind, EventType::Delete);
    let ev = collect_events(&mut no_del, 1).await;
    assert_eq!(
        (ev[0].kind, ev[0].kv.value.clone()),
        (EventType::Put, Bytes::from("4"))
    );
}

async fn watch_from_now_and_drop(b: Backend, p: String) {
    put(&b, k(&p, "old"), "o").await;
    let mut w = b
        .watch(WatchRequest {
            range: KeyRange::prefix(p.clone()),
            ..Default::default()
        })
        .await
        .expect("watch from now");
    let r = put(&b, k(&p, "new"), "n").await;
    let ev = collect_events(&mut w, 1).await;
    assert_eq!(
        (ev[0].kv.key.clone(), ev[0].kv.mod_revision),
        (k(&p, "new"), r)
    );
    // A txn writing two watched keys arrives with one revision.
    let t = txn(
        &b,
        vec![],
        vec![
            TxnOp::Put(PutRequest::new(k(&p, "t1"), "1")),
            TxnOp::Put(PutRequest::new(k(&p, "t2"), "2")),
        ],
        vec![],
    )
    .await;
    let ev = collect_events(&mut w, 2).await;
    assert!(ev.iter().all(|e| e.kv.mod_revision == t.revision));
    drop(w);
    // Writes after the drop must not break anything.
    put(&b, k(&p, "after"), "a").await;
}

async fn leases_grant_attach_ttl_keepalive_list_revoke(b: Backend, p: String) {
    let auto = b.lease_grant(0, 60).await.expect("grant auto id");
    assert!(auto.id != 0);
    assert_eq!(auto.ttl, 60);
    let chosen_id = 0x1a77_0000 + (NONCE.fetch_add(1, Ordering::Relaxed) as i64 % 100_000) * 7 + 3;
    let chosen = b.lease_grant(chosen_id, 30).await.expect("grant chosen id");
    assert_eq!(chosen.id, chosen_id);

    let list = b.lease_leases().await.expect("leases");
    assert!(
        list.contains(&auto.id) && list.contains(&chosen.id),
        "{list:?}"
    );

    b.put(PutRequest {
        lease: auto.id,
        ..PutRequest::new(k(&p, "l1"), "1")
    })
    .await
    .expect("attach l1");
    b.put(PutRequest {
        lease: auto.id,
        ..PutRequest::new(k(&p, "l2"), "2")
    })
    .await
    .expect("attach l2");
    put(&b, k(&p, "free"), "f").await;
    assert_eq!(get(&b, k(&p, "l1")).await.map(|kv| kv.lease), Some(auto.id));

    let ttl = b.lease_time_to_live(auto.id, true).await.expect("ttl");
    assert_eq!((ttl.id, ttl.granted_ttl), (auto.id, 60));
    assert!(ttl.ttl > 0 && ttl.ttl <= 60, "remaining {}", ttl.ttl);
    let mut ks = ttl.keys.clone();
    ks.sort();
    assert_eq!(ks, vec![k(&p, "l1"), k(&p, "l2")]);
    let ttl_nokeys = b
        .lease_time_to_live(auto.id, false)
        .await
        .expect("ttl without keys");
    assert!(ttl_nokeys.keys.is_empty());

    let renewed = b.lease_keep_alive(auto.id).await.expect("keep alive");
    assert_eq!(renewed, 60);

    let mut w = b
        .watch(WatchRequest {
            range: KeyRange::prefix(p.clone()),
            ..Default::default()
        })
        .await
        .expect("watch");
    let rev_before = current_revision(&b).await;
    b.lease_revoke(auto.id).await.expect("revoke");
    assert!(
        get(&b, k(&p, "l1")).await.is_none(),
        "revoke deletes attached keys"
    );
    assert!(get(&b, k(&p, "l2")).await.is_none());
    assert!(get(&b, k(&p, "free")).await.is_some());
    let ev = collect_events(&mut w, 2).await;
    assert!(ev.iter().all(|e| e.kind == EventType::Delete));
    assert_eq!(
        ev[0].kv.mod_revision, ev[1].kv.mod_revision,
        "one revision for the revoke"
    );
    assert_eq!(ev[0].kv.mod_revision, rev_before + 1);

    let gone = b
        .lease_time_to_live(auto.id, true)
        .await
        .expect("ttl of a revoked lease");
    assert_eq!(gone.ttl, -1, "a missing lease reports TTL -1");
    assert!(!b.lease_leases().await.expect("leases").contains(&auto.id));
    b.lease_revoke(chosen.id).await.expect("revoke chosen");
}

async fn lease_errors(b: Backend, p: String) {
    let missing = 0x7eed_0000_0000 + NONCE.fetch_add(1, Ordering::Relaxed) as i64;
    assert_eq!(
        b.lease_revoke(missing).await.expect_err("revoke missing"),
        StoreError::LeaseNotFound
    );
    assert_eq!(
        b.lease_keep_alive(missing)
            .await
            .expect_err("keep alive missing"),
        StoreError::LeaseNotFound
    );
    let e = b
        .put(PutRequest {
            lease: missing,
            ..PutRequest::new(k(&p, "x"), "v")
        })
        .await
        .expect_err("put with a missing lease");
    assert_eq!(e, StoreError::LeaseNotFound);
    let g = b.lease_grant(missing, 30).await.expect("grant");
    assert_eq!(
        b.lease_grant(missing, 30).await.expect_err("grant twice"),
        StoreError::LeaseExists
    );
    b.lease_revoke(g.id).await.expect("revoke");
}

async fn lease_expiry_deletes_keys(b: Backend, p: String) {
    let g = b.lease_grant(0, 2).await.expect("grant short lease");
    assert!(g.ttl >= 2);
    b.put(PutRequest {
        lease: g.id,
        ..PutRequest::new(k(&p, "ephemeral"), "e")
    })
    .await
    .expect("put");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(g.ttl as u64 + 8);
    loop {
        if get(&b, k(&p, "ephemeral")).await.is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease did not expire"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = b
        .lease_time_to_live(g.id, false)
        .await
        .expect("ttl after expiry");
    assert_eq!(t.ttl, -1);
}

async fn status_reports_revision(b: Backend, p: String) {
    let r = put(&b, k(&p, "s"), "v").await;
    let s = b.status().await.expect("status");
    assert!(s.revision >= r, "status revision {} < {r}", s.revision);
    assert!(!s.version.is_empty());
}

async fn compaction(b: Backend, p: String) {
    let key = k(&p, "c");
    let r1 = put(&b, key.clone(), "1").await;
    let r2 = put(&b, key.clone(), "2").await;
    let r3 = put(&b, key.clone(), "3").await;
    b.compact(r2).await.expect("compact");

    let e = get_at(&b, key.clone(), r1)
        .await
        .expect_err("read below the compact revision");
    assert!(
        is_compacted(&e, r2),
        "expected Compacted{{{r2}}}, got {e:?}"
    );
    // The compact revision itself stays readable.
    assert_eq!(
        get_at(&b, key.clone(), r2)
            .await
            .expect("read at compact rev")
            .map(|kv| kv.value),
        Some(Bytes::from("2"))
    );
    assert_eq!(
        get(&b, key.clone()).await.map(|kv| (kv.value, kv.version)),
        Some((Bytes::from("3"), 3))
    );

    let e = b
        .watch(WatchRequest {
            range: KeyRange::single(key.clone()),
            start_revision: r1,
            ..Default::default()
        })
        .await;
    match e {
        Err(e) => assert!(
            is_compacted(&e, r2),
            "expected Compacted{{{r2}}}, got {e:?}"
        ),
        Ok(mut w) => match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Err(e))) => assert!(is_compacted(&e, r2), "got {e:?}"),
            other => panic!("watch from a compacted revision must fail, got {other:?}"),
        },
    }
    let mut w = b
        .watch(WatchRequest {
            range: KeyRange::single(key.clone()),
            start_revision: r2,
            ..Default::default()
        })
        .await
        .expect("watch from the compact revision");
    let ev = collect_events(&mut w, 2).await;
    assert_eq!(
        ev.iter().map(|e| e.kv.mod_revision).collect::<Vec<_>>(),
        [r2, r3]
    );

    // Compacting again at or below the compact revision fails the same way.
    let e = b.compact(r1).await.expect_err("compact an older revision");
    assert!(is_compacted(&e, r2), "got {e:?}");
    let s = b.status().await.expect("status");
    assert!(
        s.compact_revision >= r2,
        "status compact_revision {}",
        s.compact_revision
    );
}
