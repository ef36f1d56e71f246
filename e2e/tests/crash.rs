//! Crash safety of the embedded store: SIGKILL the real server repeatedly while 16
//! clients write through the etcd port; after every restart each acknowledged write must
//! be present with its value, and the revision must never go back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use lattice_e2e::{free_port, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (api, etcd) = (free_port(), free_port());
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let mut last_revision = 0i64;
    // The etcd port on loopback in plaintext (the test's client has no certificate).
    let plain = ["--store-plaintext-loopback"];
    let mut server = Server::start(dir.path(), api, etcd, &plain);
    for round in 0..5 {
        let mut writers = Vec::new();
        for w in 0..16 {
            let endpoint = server.etcd_endpoint();
            let acked = acked.clone();
            writers.push(tokio::spawn(async move {
                let Ok(mut c) = Client::connect([endpoint], None).await else {
                    return;
                };
                for i in 0.. {
                    let (k, v) = (format!("/crash/{round}/{w}/{i}"), format!("v{i}"));
                    match c.put(k.clone(), v.clone(), None).await {
                        Ok(_) => {
                            acked.lock().unwrap().insert(k, v);
                        }
                        Err(_) => return, // the server died under us
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300 + 150 * round as u64)).await;
        server.kill9();
        for w in writers {
            let _ = w.await;
        }
        server = Server::start(dir.path(), api, etcd, &plain);
        let mut c = Client::connect([server.etcd_endpoint()], None)
            .await
            .unwrap();
        let resp = c
            .get("/crash/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let revision = resp.header().unwrap().revision();
        assert!(
            revision >= last_revision,
            "revision went back from {last_revision} to {revision}"
        );
        last_revision = revision;
        let stored: HashMap<String, String> = resp
            .kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key_str().unwrap().to_string(),
                    kv.value_str().unwrap().to_string(),
                )
            })
            .collect();
        let acked = acked.lock().unwrap();
        assert!(
            !acked.is_empty(),
            "round {round}: no write was acknowledged"
        );
        for (k, v) in acked.iter() {
            assert_eq!(
                stored.get(k),
                Some(v),
                "round {round}: acknowledged write {k} lost"
            );
        }
        eprintln!(
            "round {round}: {} acknowledged writes all present at revision {revision}",
            acked.len()
        );
    }
}
