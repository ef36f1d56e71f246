//! Heartbeat streams over real sockets, through both readers: the batched reader thread
//! (connections accepted by `ApiServer::serve`) and the per-connection task (any other
//! listener, e.g. HTTPS). Each keeps the node's Lease alive while lines arrive, lets it
//! expire when they stop, and says why it ended the session.

mod common;

use std::time::{Duration, Instant};

use common::*;
use lattice_apiserver::ApiConfig;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LEASE: &str = "/apis/lattice.dev/v1alpha1/namespaces/lattice-node-lease/leases";

/// Open a heartbeat stream on `addr`; returns the socket after `101`.
async fn open(addr: &str, node: &str, seq: u64) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "POST /apis/lattice.dev/v1alpha1/nodes/{node}/heartbeat?sequence={seq} HTTP/1.1\r\n\
         Host: {addr}\r\nConnection: Upgrade\r\nUpgrade: lattice-heartbeat/1\r\n\
         Content-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.expect("read"), 1, "closed: {head:?}");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-lattice-heartbeat-ttl-seconds: 2"),
        "{head}"
    );
    s
}

async fn lease(t: &TestServer, node: &str) -> Option<Value> {
    let r = t
        .client
        .get(t.url(&format!("{LEASE}/{node}")))
        .send()
        .await
        .ok()?;
    if r.status() != 200 {
        return None;
    }
    r.json().await.ok()
}

async fn beats(t: &TestServer) -> f64 {
    let text = t
        .client
        .get(t.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("lattice_apiserver_heartbeats_total ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Beat on `s` for `secs`, every 300 ms; the Lease must stay the same object throughout.
async fn beat_for(t: &TestServer, s: &mut TcpStream, node: &str, from: u64, secs: u64) -> u64 {
    let uid = lease(t, node).await.expect("the Lease")["metadata"]["uid"].clone();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut seq = from;
    while Instant::now() < end {
        seq += 1;
        s.write_all(format!("{seq}\n").as_bytes())
            .await
            .expect("beat");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let l = lease(t, node).await.expect("the Lease stays while beating");
        assert_eq!(l["metadata"]["uid"], uid);
        assert!(l["metadata"]["annotations"]["lattice.dev/store-lease"].is_string());
    }
    seq
}

/// Stop beating: the session ends `Idle` after the TTL and the store deletes the Lease.
async fn goes_idle(t: &TestServer, mut s: TcpStream, node: &str) {
    let mut rest = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut rest))
        .await
        .expect("the server ends an idle session")
        .expect("read");
    assert!(rest.contains("\"reason\":\"Idle\""), "{rest}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease(t, node).await.is_some() {
        assert!(Instant::now() < deadline, "the Lease did not expire");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn config() -> ApiConfig {
    ApiConfig {
        heartbeat_ttl: Duration::from_secs(2),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_reader_keeps_the_lease_alive_and_lets_it_expire() {
    let t = start_with(config()).await;
    let addr = t.base.trim_start_matches("http://").to_string();
    let before = beats(&t).await;
    let mut s = open(&addr, "n1", 10).await;
    let last = beat_for(&t, &mut s, "n1", 10, 5).await;
    assert!(beats(&t).await - before >= 10.0);
    // A line that does not raise the sequence is a replay, not a heartbeat.
    s.write_all(format!("{last}\n").as_bytes()).await.unwrap();
    // A second stream below the last sequence is refused.
    let r = t
        .client
        .post(t.url(&format!(
            "/apis/lattice.dev/v1alpha1/nodes/n1/heartbeat?sequence={last}"
        )))
        .header("connection", "upgrade")
        .header("upgrade", "lattice-heartbeat/1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    goes_idle(&t, s, "n1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_reader_serves_other_listeners() {
    let t = start_with(config()).await;
    // The same server on a listener without the per-connection socket (like HTTPS).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let router = t.server.router();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let mut s = open(&addr, "n2", 1).await;
    beat_for(&t, &mut s, "n2", 1, 4).await;
    // Garbage ends the session with a reason.
    s.write_all(b"not-a-number\n").await.unwrap();
    let mut rest = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut rest))
        .await
        .expect("ended")
        .expect("read");
    assert!(rest.contains("BadRequest"), "{rest}");
    let mut s = open(&addr, "n2", 100).await;
    beat_for(&t, &mut s, "n2", 100, 1).await;
    goes_idle(&t, s, "n2").await;
}
