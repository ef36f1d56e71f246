//! The backend conformance suite against a real etcd (Debian's etcd 3.4), through
//! `EtcdBackend`. Needs /usr/bin/etcd: run hack/install-deps.sh.

mod suite;
mod support;

use std::sync::Arc;

use lattice_store::etcd_backend::EtcdBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backend_passes_conformance_against_real_etcd() {
    let etcd = support::EtcdProcess::start().await;
    let backend = EtcdBackend::connect(&[etcd.endpoint()])
        .await
        .expect("connect");
    suite::run_all(Arc::new(backend)).await;
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backend_reports_unreachable_cluster() {
    use lattice_store::KvBackend;
    let port = support::free_port();
    let backend = EtcdBackend::connect(&[format!("127.0.0.1:{port}")]).await;
    // Connecting is lazy or fails; either way a request must error, not hang or panic.
    if let Ok(b) = backend {
        let r = tokio::time::timeout(std::time::Duration::from_secs(20), b.get("k".into())).await;
        assert!(matches!(r, Ok(Err(_))), "expected an error, got {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_progress_notifications_become_empty_batches() {
    use futures::StreamExt;
    use lattice_store::{KeyRange, KvBackend, PutRequest, WatchRequest};
    let etcd =
        support::EtcdProcess::start_with(&["--experimental-watch-progress-notify-interval=300ms"])
            .await;
    let backend = EtcdBackend::connect(&[etcd.endpoint()])
        .await
        .expect("connect");
    let rev = backend
        .put(PutRequest::new("/progress/k", "v"))
        .await
        .expect("put")
        .revision;
    let mut w = backend
        .watch(WatchRequest {
            range: KeyRange::prefix("/progress/"),
            progress_notify: true,
            ..Default::default()
        })
        .await
        .expect("watch");
    let batch = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
        .await
        .expect("no progress notification within 10s")
        .expect("stream ended")
        .expect("watch error");
    assert!(
        batch.events.is_empty(),
        "expected a progress notification, got {batch:?}"
    );
    assert!(batch.revision >= rev);
}
