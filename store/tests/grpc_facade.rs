//! The etcd v3 gRPC facade, driven by real clients over loopback:
//! * the conformance suite through `EtcdBackend` → facade → backend (the embedded store, and
//!   a real etcd, which isolates the facade from engine differences);
//! * `etcd-client` directly, for stream semantics the trait does not show;
//! * Debian's `etcdctl` 3.4 (ETCDCTL_API=3) as an unmodified third-party client.

mod suite;
mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions, WatchOptions};
use lattice_store::etcd_backend::EtcdBackend;
use lattice_store::grpc::{EtcdGrpcServer, ServerHandle, ServerInfo};
use lattice_store::*;

/// Conformance cases where the embedded store differed from etcd 3.4 when this test was
/// written (reported to the store's owner). The same cases pass through the facade over a
/// real etcd, so the facade is not the cause. Remove entries as they are fixed.
/// * `past_revision_reads`: a read at a past revision reports that revision in the header;
///   etcd reports the store's current revision.
/// * `txn_compare_over_range`: a VALUE compare over a range with no keys succeeds; etcd
///   fails it.
/// * `compaction`: after `compact(r)`, a watch from `r` is refused as compacted; etcd keeps
///   `r` itself readable and watchable.
const EMBEDDED_KNOWN_DIVERGENCES: &[&str] = &[];

const CLUSTER_ID: u64 = 0xc1_05_7e_12;
const MEMBER_ID: u64 = 0x3e_3b_e2;

fn info() -> ServerInfo {
    ServerInfo {
        cluster_id: CLUSTER_ID,
        member_id: MEMBER_ID,
        name: "facade-test".into(),
        ..ServerInfo::default()
    }
}

async fn start_facade(backend: Arc<dyn KvBackend>) -> ServerHandle {
    EtcdGrpcServer::bind("127.0.0.1:0".parse().expect("addr"), backend, info())
        .await
        .expect("bind facade")
        .spawn()
}

async fn embedded() -> (tempfile::TempDir, Arc<dyn KvBackend>) {
    let dir = tempfile::tempdir().expect("tempdir");
    // The member id must agree with the facade's, as it would in a real deployment:
    // `etcdctl endpoint status` compares the header's member id with the leader.
    let config = StoreConfig {
        member_id: MEMBER_ID,
        name: "facade-test".into(),
        ..StoreConfig::default()
    };
    let store = EmbeddedStore::open(dir.path(), config)
        .await
        .expect("open store");
    (dir, Arc::new(store))
}

async fn client(server: &ServerHandle) -> Client {
    Client::connect([server.endpoint()], None)
        .await
        .expect("connect etcd-client")
}

// ------------------------------------------------------------------ conformance suite --

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_facade_over_real_etcd() {
    let etcd = support::EtcdProcess::start().await;
    let inner = EtcdBackend::connect(&[etcd.endpoint()])
        .await
        .expect("connect etcd");
    let server = start_facade(Arc::new(inner)).await;
    let outer = EtcdBackend::connect(&[server.endpoint()])
        .await
        .expect("connect facade");
    suite::run_all(Arc::new(outer)).await;
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_facade_over_embedded_store() {
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let outer = EtcdBackend::connect(&[server.endpoint()])
        .await
        .expect("connect facade");
    let failed = suite::run_all_collect(Arc::new(outer)).await;
    let unexpected: Vec<_> = failed
        .iter()
        .filter(|f| !EMBEDDED_KNOWN_DIVERGENCES.contains(&f.as_str()))
        .collect();
    assert!(unexpected.is_empty(), "failed cases: {unexpected:?}");
    if !failed.is_empty() {
        eprintln!("WARNING: embedded store still diverges from etcd in {failed:?}");
    }
    server.shutdown().await.expect("shutdown");
}

// -------------------------------------------------------------------------- etcd-client --

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_carry_cluster_and_member_ids() {
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let mut c = client(&server).await;
    let put = c.put("/h/k", "v", None).await.expect("put");
    let h = put.header().expect("header");
    assert_eq!((h.cluster_id(), h.member_id()), (CLUSTER_ID, MEMBER_ID));
    assert!(h.revision() > 0);
    let get = c.get("/h/k", None).await.expect("get");
    assert_eq!(get.header().map(|h| h.revision()), Some(h.revision()));

    let status = c.status().await.expect("status");
    assert_eq!(status.leader(), MEMBER_ID);
    assert!(!status.version().is_empty());
    assert_eq!(status.header().map(|h| h.revision()), Some(h.revision()));

    let members = c.member_list().await.expect("member list");
    let ms = members.members();
    assert_eq!(ms.len(), 1);
    assert_eq!((ms[0].id(), ms[0].name()), (MEMBER_ID, "facade-test"));
    assert_eq!(
        ms[0].client_urls(),
        [format!("http://{}", server.endpoint())]
    );

    let alarms = c
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .expect("alarm");
    assert!(alarms.alarms().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watchers_on_one_stream_cancel_and_progress() {
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let mut c = client(&server).await;
    let r0 = c
        .put("/w/a/0", "x", None)
        .await
        .expect("put")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);

    let mut ws = c
        .watch(
            "/w/a/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(r0)
                    .with_prev_key(),
            ),
        )
        .await
        .expect("watch a");
    let created = ws.message().await.expect("msg").expect("created");
    assert!(created.created());
    let id_a = created.watch_id();
    // Historical event for watcher a.
    let hist = ws.message().await.expect("msg").expect("history");
    assert_eq!((hist.watch_id(), hist.events().len()), (id_a, 1));

    ws.watch("/w/b/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch b");
    let created_b = ws.message().await.expect("msg").expect("created b");
    assert!(created_b.created());
    let id_b = created_b.watch_id();
    assert_ne!(id_a, id_b);

    // A client-chosen id.
    ws.watch("/w/c", Some(WatchOptions::new().with_watch_id(4242)))
        .await
        .expect("watch c");
    let created_c = ws.message().await.expect("msg").expect("created c");
    assert_eq!((created_c.created(), created_c.watch_id()), (true, 4242));
    // The same id again is refused.
    ws.watch("/w/c", Some(WatchOptions::new().with_watch_id(4242)))
        .await
        .expect("watch dup");
    let dup = ws.message().await.expect("msg").expect("dup");
    assert!(
        dup.canceled(),
        "duplicate watch id must be refused: {dup:?}"
    );

    c.put("/w/b/1", "y", None).await.expect("put b");
    c.put("/w/a/0", "z", None).await.expect("put a");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.message())
            .await
            .expect("stalled")
            .expect("msg")
            .expect("resp");
        for ev in m.events() {
            seen.push((
                m.watch_id(),
                ev.kv().map(|kv| kv.key().to_vec()).unwrap_or_default(),
            ));
            if m.watch_id() == id_a {
                assert_eq!(
                    ev.prev_kv().map(|kv| kv.value().to_vec()),
                    Some(b"x".to_vec())
                );
            }
        }
    }
    assert_eq!(
        seen,
        vec![(id_b, b"/w/b/1".to_vec()), (id_a, b"/w/a/0".to_vec())]
    );

    // Progress request: answered with watch id -1 and the current revision.
    let cur = c
        .get("/w/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    ws.request_progress().await.expect("progress");
    let p = tokio::time::timeout(Duration::from_secs(10), ws.message())
        .await
        .expect("stalled")
        .expect("msg")
        .expect("progress");
    assert_eq!(p.watch_id(), -1);
    assert!(p.events().is_empty());
    assert_eq!(p.header().map(|h| h.revision()), Some(cur));

    // Cancel b: canceled answer, no more events for b.
    ws.cancel(id_b).await.expect("cancel");
    let cm = tokio::time::timeout(Duration::from_secs(10), ws.message())
        .await
        .expect("stalled")
        .expect("msg")
        .expect("cancel");
    assert!(cm.canceled() && cm.watch_id() == id_b);
    c.put("/w/b/2", "y", None).await.expect("put b");
    c.put("/w/a/3", "y", None).await.expect("put a");
    let m = tokio::time::timeout(Duration::from_secs(10), ws.message())
        .await
        .expect("stalled")
        .expect("msg")
        .expect("resp");
    assert_eq!(m.watch_id(), id_a, "only watcher a still receives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_watch_is_canceled_with_compact_revision() {
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let mut c = client(&server).await;
    let r1 = c
        .put("/c/k", "1", None)
        .await
        .expect("put")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    let r2 = c
        .put("/c/k", "2", None)
        .await
        .expect("put")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    c.compact(r2, None).await.expect("compact");
    let mut ws = c
        .watch("/c/k", Some(WatchOptions::new().with_start_revision(r1)))
        .await
        .expect("watch");
    let mut canceled = None;
    for _ in 0..2 {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.message())
            .await
            .expect("stalled")
            .expect("msg")
            .expect("resp");
        if m.canceled() {
            canceled = Some(m);
            break;
        }
        assert!(m.created());
    }
    let m = canceled.expect("watch canceled");
    assert_eq!(m.compact_revision(), r2);
    assert!(m.cancel_reason().contains("compacted"));
    // Range below the compact revision: etcd's error.
    let e = c
        .get("/c/k", Some(GetOptions::new().with_revision(r1)))
        .await
        .expect_err("compacted read");
    assert!(
        e.to_string()
            .contains("required revision has been compacted"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_and_oversized_requests_get_grpc_errors() {
    use etcd_client::proto::*;
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let mut c = client(&server).await;

    // Empty key.
    let e = c.put("", "v", None).await.expect_err("empty key");
    assert!(e.to_string().contains("key is not provided"), "{e}");
    // Oversized put (default limit 1.5 MiB).
    let big = vec![b'x'; 2 * 1024 * 1024];
    let e = c.put("/big", big, None).await.expect_err("oversized");
    assert!(
        e.to_string().contains("too large") || e.to_string().contains("message length"),
        "{e}"
    );
    // Far over the gRPC decode limit: refused by the transport, server still fine.
    let huge = vec![b'x'; 8 * 1024 * 1024];
    assert!(c.put("/huge", huge, None).await.is_err());
    c.put("/after", "ok", Some(PutOptions::new()))
        .await
        .expect("server still serves");

    // Raw calls with values the typed client cannot produce.
    let chan = tonic::transport::Endpoint::from_shared(format!("http://{}", server.endpoint()))
        .expect("endpoint")
        .connect()
        .await
        .expect("channel");
    let mut grpc = tonic::client::Grpc::new(chan);
    async fn call<Req: prost::Message + 'static, Resp: prost::Message + Default + 'static>(
        grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
        path: &'static str,
        req: Req,
    ) -> Result<Resp, tonic::Status> {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unknown(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        grpc.unary(
            tonic::Request::new(req),
            tonic::codegen::http::uri::PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map(|r| r.into_inner())
    }
    let bad_sort = PbRangeRequest {
        key: b"/a".to_vec(),
        sort_order: 7,
        ..Default::default()
    };
    let e = call::<_, PbRangeResponse>(&mut grpc, "/etcdserverpb.KV/Range", bad_sort)
        .await
        .expect_err("bad sort");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let bad_cmp = PbTxnRequest {
        compare: vec![PbCompare {
            result: 0,
            target: 99,
            key: b"/a".to_vec(),
            range_end: vec![],
            target_union: None,
        }],
        success: vec![],
        failure: vec![],
    };
    let e = call::<_, PbTxnResponse>(&mut grpc, "/etcdserverpb.KV/Txn", bad_cmp)
        .await
        .expect_err("bad compare");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let empty_op = PbTxnRequest {
        compare: vec![],
        success: vec![PbTxnRequestOp { request: None }],
        failure: vec![],
    };
    let e = call::<_, PbTxnResponse>(&mut grpc, "/etcdserverpb.KV/Txn", empty_op)
        .await
        .expect_err("empty op");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let too_many = PbTxnRequest {
        compare: vec![],
        success: (0..200)
            .map(|i| PbTxnRequestOp {
                request: Some(PbTxnOpRequest::RequestRange(PbRangeRequest {
                    key: format!("/k{i}").into_bytes(),
                    ..Default::default()
                })),
            })
            .collect(),
        failure: vec![],
    };
    let e = call::<_, PbTxnResponse>(&mut grpc, "/etcdserverpb.KV/Txn", too_many)
        .await
        .expect_err("too many ops");
    assert!(e.message().contains("too many operations"), "{e:?}");
    // Garbage bytes that are not a valid protobuf message.
    let e = call::<_, PbRangeResponse>(
        &mut grpc,
        "/etcdserverpb.KV/Range",
        PbPutRequest {
            key: vec![0xff; 3],
            value: vec![],
            lease: -1,
            ..Default::default()
        },
    )
    .await;
    // (A PutRequest decodes as a RangeRequest with other fields; any answer but a panic is fine.)
    let _ = e;
    let e = c
        .kv_client()
        .get_stream("/a", None)
        .await
        .expect_err("RangeStream");
    assert!(
        e.to_string().contains("Unimplemented") || e.to_string().contains("not supported"),
        "{e}"
    );
    let e = c.defragment().await.expect_err("defragment");
    assert!(
        e.to_string().contains("Unimplemented") || e.to_string().contains("not supported"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keep_alive_stream() {
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let mut c = client(&server).await;
    let g = c.lease_grant(30, None).await.expect("grant");
    let (mut keeper, mut stream) = c.lease_keep_alive(g.id()).await.expect("keep alive");
    for _ in 0..3 {
        keeper.keep_alive().await.expect("send");
        let r = stream.message().await.expect("msg").expect("resp");
        assert_eq!((r.id(), r.ttl()), (g.id(), 30));
    }
    c.lease_revoke(g.id()).await.expect("revoke");
    keeper.keep_alive().await.expect("send");
    let r = stream.message().await.expect("msg").expect("resp");
    assert_eq!(r.ttl(), 0, "a revoked lease answers TTL 0");
    let t = c.lease_time_to_live(g.id(), None).await.expect("ttl");
    assert_eq!(t.ttl(), -1);
}

// ------------------------------------------------------------------------------ etcdctl --

fn etcdctl(endpoint: &str, args: &[&str]) -> (bool, String, String) {
    let bin = support::require_binary("etcdctl");
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=10s")
        .args(args)
        .output()
        .expect("run etcdctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let (success, stdout, stderr) = etcdctl(endpoint, args);
    assert!(success, "etcdctl {args:?} failed: {stderr}{stdout}");
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_drives_the_facade() {
    let (_dir, store) = embedded().await;
    let server = start_facade(store).await;
    let ep = server.endpoint();
    let ep2 = ep.clone();
    // etcdctl blocks; keep it off the runtime threads.
    tokio::task::spawn_blocking(move || etcdctl_session(&ep2))
        .await
        .expect("etcdctl session");
    drop(ep);
    server.shutdown().await.expect("shutdown");
}

/// The header revision in etcdctl's `-w json` output.
fn revision_of(json: &str) -> i64 {
    json.split("\"revision\":")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {json}"))
}

fn etcdctl_session(ep: &str) {
    assert_eq!(ok(ep, &["put", "/ctl/a", "1"]).trim(), "OK");
    ok(ep, &["put", "/ctl/b", "2"]);
    ok(ep, &["put", "/ctl0", "outside"]);
    assert_eq!(
        ok(ep, &["get", "/ctl/", "--prefix"]),
        "/ctl/a\n1\n/ctl/b\n2\n"
    );
    assert_eq!(
        ok(ep, &["get", "/ctl/", "--prefix", "--keys-only"])
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["/ctl/a", "/ctl/b"]
    );
    assert!(ok(ep, &["get", "/ctl/", "--prefix", "-w", "fields"]).contains("\"Count\" : 2"));
    let json = ok(ep, &["get", "/ctl/a", "-w", "json"]);
    assert!(
        json.contains(&format!("\"cluster_id\":{CLUSTER_ID}")),
        "{json}"
    );

    // Watch in the background from the next revision (no race with its start), then write.
    let next_rev = revision_of(&json) + 1;
    let bin = support::require_binary("etcdctl");
    let mut watch = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["watch", "/ctl/", "--prefix", &format!("--rev={next_rev}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl watch");
    ok(ep, &["put", "/ctl/w", "watched"]);
    assert_eq!(ok(ep, &["del", "/ctl/w"]).trim(), "1");

    // Transaction from stdin (non-interactive): compares, success ops, failure ops.
    let bin = support::require_binary("etcdctl");
    let mut txn = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["txn", "--interactive=false"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl txn");
    txn.stdin
        .take()
        .expect("stdin")
        .write_all(b"value(\"/ctl/a\") = \"1\"\n\nput /ctl/t yes\nget /ctl/a\n\nput /ctl/t no\n\n")
        .expect("write txn");
    let out = txn.wait_with_output().expect("txn output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "txn failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("SUCCESS"), "{stdout}");
    assert_eq!(
        ok(ep, &["get", "/ctl/t", "--print-value-only"]).trim(),
        "yes"
    );

    // Leases.
    let grant = ok(ep, &["lease", "grant", "60"]);
    // "lease 694d77aa9e38260f granted with TTL(60s)"
    let id = grant
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_string();
    assert!(grant.contains("TTL(60s)"), "{grant}");
    ok(ep, &["put", "/ctl/leased", "v", &format!("--lease={id}")]);
    let ka = ok(ep, &["lease", "keep-alive", "--once", &id]);
    assert!(ka.contains("TTL(60)"), "{ka}");
    let ttl = ok(ep, &["lease", "timetolive", &id, "--keys"]);
    assert!(ttl.contains("/ctl/leased"), "{ttl}");
    assert!(ok(ep, &["lease", "list"]).contains(&id));
    assert!(ok(ep, &["lease", "revoke", &id]).contains("revoked"));
    assert_eq!(ok(ep, &["get", "/ctl/leased"]), "");

    // Cluster and maintenance.
    let status = ok(ep, &["endpoint", "status", "-w", "json"]);
    assert!(
        status.contains(&format!("\"leader\":{MEMBER_ID}")),
        "{status}"
    );
    let health = etcdctl(ep, &["endpoint", "health"]);
    assert!(
        health.0 && format!("{}{}", health.1, health.2).contains("is healthy"),
        "{health:?}"
    );
    let members = ok(ep, &["member", "list"]);
    assert!(
        members.contains("facade-test") && members.contains(&format!("http://{ep}")),
        "{members}"
    );

    // Compaction and errors as etcdctl shows them.
    let rev = revision_of(&ok(ep, &["get", "/ctl/a", "-w", "json"]));
    assert!(ok(ep, &["compact", &rev.to_string()]).contains("compacted revision"));
    let (success, _, stderr) = etcdctl(ep, &["get", "/ctl/a", "--rev=1"]);
    assert!(
        !success && stderr.contains("required revision has been compacted"),
        "{stderr}"
    );

    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let watched = String::from_utf8_lossy(&out.stdout);
    assert!(
        watched.contains("PUT\n/ctl/w\nwatched"),
        "watch output: {watched}"
    );
    assert!(
        watched.contains("DELETE\n/ctl/w"),
        "watch output: {watched}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_provider_is_pluggable() {
    use lattice_store::grpc::Membership;
    struct Three;
    impl Membership for Three {
        fn members(&self) -> Vec<Member> {
            (1..=3)
                .map(|i| Member {
                    id: i,
                    name: format!("m{i}"),
                    peer_urls: vec![format!("http://127.0.0.1:{}", 7000 + i)],
                    client_urls: vec![format!("http://127.0.0.1:{}", 8000 + i)],
                    is_learner: i == 3,
                })
                .collect()
        }
        fn raft_term(&self) -> Option<u64> {
            Some(7)
        }
    }
    let (_dir, store) = embedded().await;
    let info = ServerInfo {
        membership: Some(Arc::new(Three)),
        ..info()
    };
    let server = EtcdGrpcServer::bind("127.0.0.1:0".parse().expect("addr"), store, info)
        .await
        .expect("bind")
        .spawn();
    let mut c = client(&server).await;
    let list = c.member_list().await.expect("member list");
    let names: Vec<_> = list
        .members()
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    assert_eq!(names, ["m1", "m2", "m3"]);
    assert!(list.members()[2].is_learner());
    assert_eq!(list.header().map(|h| h.raft_term()), Some(7));
    let put = c.put("/m/k", "v", None).await.expect("put");
    assert_eq!(put.header().map(|h| h.raft_term()), Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notify_reaches_etcd_clients() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig {
        member_id: MEMBER_ID,
        progress_interval: Duration::from_millis(200),
        ..StoreConfig::default()
    };
    let store = EmbeddedStore::open(dir.path(), config)
        .await
        .expect("open store");
    let server = start_facade(Arc::new(store)).await;
    let mut c = client(&server).await;
    let rev = c
        .put("/p/k", "v", None)
        .await
        .expect("put")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    let mut ws = c
        .watch(
            "/p/",
            Some(WatchOptions::new().with_prefix().with_progress_notify()),
        )
        .await
        .expect("watch");
    let created = ws.message().await.expect("msg").expect("created");
    assert!(created.created());
    let m = tokio::time::timeout(Duration::from_secs(10), ws.message())
        .await
        .expect("no progress notification within 10s")
        .expect("msg")
        .expect("resp");
    assert_eq!(m.watch_id(), created.watch_id());
    assert!(m.events().is_empty());
    assert!(m.header().map(|h| h.revision()).unwrap_or(0) >= rev);
}
