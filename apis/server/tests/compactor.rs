//! The periodic compactor against the real embedded store: rounds claim the marker, the
//! history below the previous round's revision goes, one interval of it stays, and a
//! server whose view of the marker is stale skips the round.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lattice_apiserver::compactor::{self, CompactorMetrics, Round};
use lattice_store::{EmbeddedStore, KvBackend, PutRequest, RangeRequest, StoreConfig, StoreError};

async fn put(store: &EmbeddedStore, key: &str, value: &str) -> i64 {
    store
        .put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..PutRequest::default()
        })
        .await
        .unwrap()
        .revision
}

async fn read_at(store: &EmbeddedStore, key: &str, revision: i64) -> Result<Vec<u8>, StoreError> {
    let resp = store
        .range(RangeRequest {
            range: lattice_store::KeyRange::single(Bytes::copy_from_slice(key.as_bytes())),
            revision,
            ..RangeRequest::default()
        })
        .await?;
    Ok(resp
        .kvs
        .first()
        .map(|kv| kv.value.to_vec())
        .unwrap_or_default())
}

#[tokio::test]
async fn rounds_compact_to_the_previous_rounds_revision_and_stale_servers_skip() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let old = put(&store, "/k", "v1").await;
    put(&store, "/k", "v2").await;

    // First round: claims the marker, compacts nothing, records the revision.
    let r1 = compactor::round(&store, 0, 0).await.unwrap();
    assert_eq!(r1.marker_version, 1);
    assert!(!r1.compacted);
    assert_eq!(store.status().await.unwrap().compact_revision, 0);
    assert_eq!(read_at(&store, "/k", old).await.unwrap(), b"v1");

    let after = put(&store, "/k", "v3").await;
    // Second round: compacts to the first round's revision, not further.
    let r2 = compactor::round(&store, 1, r1.revision).await.unwrap();
    assert_eq!(
        r2,
        Round {
            marker_version: 2,
            revision: r2.revision,
            compacted: true,
            compact_error: None,
        }
    );
    assert_eq!(store.status().await.unwrap().compact_revision, r1.revision);
    assert!(matches!(
        read_at(&store, "/k", old).await,
        Err(StoreError::Compacted { .. })
    ));
    // The history since the previous round stays readable.
    assert_eq!(read_at(&store, "/k", after).await.unwrap(), b"v3");
    assert_eq!(read_at(&store, "/k", r1.revision).await.unwrap(), b"v2");

    // A second server still at marker version 1: the round is not its own.
    let stale = compactor::round(&store, 1, r2.revision).await.unwrap();
    assert_eq!(stale.marker_version, 2);
    assert!(!stale.compacted);
    assert_eq!(store.status().await.unwrap().compact_revision, r1.revision);

    // Someone compacted further by hand: the next round's older target is no error.
    put(&store, "/k", "v4").await;
    let now = store.status().await.unwrap().revision;
    store.compact(now).await.unwrap();
    let r3 = compactor::round(&store, 2, r2.revision).await.unwrap();
    assert_eq!(r3.marker_version, 3);
    assert!(!r3.compacted);
    assert_eq!(store.status().await.unwrap().compact_revision, now);
}

#[tokio::test]
async fn the_loop_keeps_compacting_while_writes_go_on_and_stops_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), StoreConfig::default())
            .await
            .unwrap(),
    );
    let metrics = CompactorMetrics::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let backend: Arc<dyn KvBackend> = store.clone();
    let looping = tokio::spawn(compactor::run(
        backend,
        Duration::from_millis(100),
        metrics.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let first = put(&store, "/w", "0").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    while metrics.compactions.get() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} compactions in 20 s",
            metrics.compactions.get()
        );
        i += 1;
        put(&store, "/w", &i.to_string()).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = store.status().await.unwrap();
    assert!(status.compact_revision > first, "{status:?}");
    assert_eq!(metrics.revision.get(), status.compact_revision);
    assert!(status.compact_revision < status.revision);
    assert_eq!(metrics.failures.get(), 0);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), looping)
        .await
        .expect("the loop stops when told")
        .unwrap();
}

#[tokio::test]
async fn a_failed_compaction_keeps_the_round_and_the_next_one_compacts() {
    let dir = tempfile::tempdir().unwrap();
    // The embedded store whose compactions fail while `fail` is set.
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let failing = fail.clone();
    let store = lattice_store::WithFaults::new(
        EmbeddedStore::open(dir.path(), StoreConfig::default())
            .await
            .unwrap(),
    )
    .on_compact(move |_| {
        failing
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| StoreError::Backend("disk on fire".into()))
    });
    put(&store.inner, "/k", "v1").await;
    let r1 = compactor::round(&store, 0, 0).await.unwrap();
    put(&store.inner, "/k", "v2").await;
    // The marker moves, the compaction fails: reported in the round, not as Err.
    let r2 = compactor::round(&store, r1.marker_version, r1.revision)
        .await
        .unwrap();
    assert_eq!(r2.marker_version, 2);
    assert!(!r2.compacted);
    assert!(r2
        .compact_error
        .as_deref()
        .unwrap()
        .contains("disk on fire"));
    // Going on from the moved marker, the next round is this server's and compacts.
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let r3 = compactor::round(&store, r2.marker_version, r2.revision)
        .await
        .unwrap();
    assert_eq!((r3.marker_version, r3.compacted), (3, true));
    assert_eq!(
        store.inner.status().await.unwrap().compact_revision,
        r2.revision
    );
}
