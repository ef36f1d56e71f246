//! Mutual TLS on the store's ports, with real sockets and certificates from a real CA: a
//! 3-member cluster over mTLS, the etcd port's admission of identities, and plaintext
//! refused off loopback.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_pki::{Admit, Ca, Identity, IssueRequest, Issued, Usage};
use lattice_store::grpc::{EtcdGrpcServer, ServerInfo};
use lattice_store::raft::{RaftConfig, RaftStore};
use lattice_store::tls::{etcd_client, etcd_client_config, etcd_port_admits, MemberTls};
use lattice_store::*;

fn issue(ca: &Ca, id: Identity, names: &[&str]) -> Issued {
    let mut req = IssueRequest::new(id, Usage::ClientAndServer);
    for n in names {
        req = req.name(n);
    }
    ca.issue(&req).expect("issue")
}

fn member_tls(ca: &Ca, id: u64) -> MemberTls {
    let m = issue(ca, Identity::Member(id), &["127.0.0.1"]);
    MemberTls::from_pem(ca.cert_pem(), &m.cert_pem, &m.key_pem).expect("member material")
}

/// An address of this machine that is not a loopback one (a process elsewhere could
/// reach it), from the kernel's interface list. A machine without one (a container with no
/// network) gets one of the benchmarking range (198.18.0.0/15) on `lo` for the test's
/// duration: by address it is not loopback (needs root and `ip`).
struct OffLoopback {
    ip: IpAddr,
    /// The address this test added to `lo`, to be removed.
    added: Option<String>,
}

impl Drop for OffLoopback {
    fn drop(&mut self) {
        if let Some(added) = &self.added {
            let _ = std::process::Command::new("ip")
                .args(["addr", "del", added, "dev", "lo"])
                .status();
        }
    }
}

fn off_loopback() -> OffLoopback {
    if let Some(ip) = lattice_store::tls::local_names()
        .iter()
        .filter_map(|n| n.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4())
    {
        return OffLoopback { ip, added: None };
    }
    let pid = std::process::id();
    let ip = format!("198.18.{}.{}", (pid / 250) % 250 + 1, pid % 250 + 1);
    let added = format!("{ip}/32");
    let st = std::process::Command::new("ip")
        .args(["addr", "add", &added, "dev", "lo"])
        .status();
    assert!(
        matches!(st, Ok(s) if s.success()),
        "this test needs a non-loopback address: there is none, and adding {added} to lo \
         failed ({st:?}; root and iproute2 are needed)"
    );
    OffLoopback {
        ip: ip.parse().unwrap(),
        added: Some(added),
    }
}

struct Member {
    store: RaftStore,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

fn config(id: u64, dir: &std::path::Path, addr: SocketAddr, tls: MemberTls) -> RaftConfig {
    let mut c = RaftConfig::new(id, dir, addr);
    c.request_timeout = Duration::from_secs(8);
    c.tls = Some(tls);
    c
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three members over mutual TLS, members 2 and 3 joining through member 1 (each under
/// the ID its certificate names): they elect, replicate writes sent to a follower, and a
/// restarted member catches up and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_members_over_mutual_tls_elect_replicate_and_survive_a_restart() {
    let ca = Ca::generate("cluster CA", Duration::from_secs(3600)).unwrap();
    let mut members: Vec<Member> = Vec::new();
    for id in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(
            id,
            dir.path(),
            "127.0.0.1:0".parse().unwrap(),
            member_tls(&ca, id),
        );
        cfg.bootstrap = id == 1;
        let store = RaftStore::start(cfg).await.unwrap();
        if id == 1 {
            store
                .wait_for_leader(Duration::from_secs(10))
                .await
                .unwrap();
        } else {
            store.join(&members[0].addr.to_string()).await.unwrap();
        }
        let addr = store.local_addr();
        members.push(Member { store, dir, addr });
    }
    let voters = members[0].store.raft_status().voters;
    assert_eq!(voters.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);

    // A write to a follower travels to the leader (forwarded over TLS) and back.
    let leader = members[0].store.current_leader().unwrap();
    let follower = members.iter().find(|m| m.store.id() != leader).unwrap();
    let rev = follower
        .store
        .put(PutRequest::new("/tls/a", "1"))
        .await
        .unwrap()
        .revision;
    for m in &members {
        wait_for("replication", || m.store.revision() >= rev).await;
    }

    // Restart a follower: it comes back over TLS and catches up on what it missed.
    let i = members.iter().position(|m| m.store.id() != leader).unwrap();
    let id = members[i].store.id();
    members[i].store.shutdown().await;
    let rev = members[(i + 1) % 3]
        .store
        .put(PutRequest::new("/tls/b", "2"))
        .await
        .unwrap()
        .revision;
    let (dir, addr) = (members[i].dir.path().to_path_buf(), members[i].addr);
    let restarted = {
        let mut last = None;
        let mut started = None;
        for _ in 0..50 {
            match RaftStore::start(config(id, &dir, addr, member_tls(&ca, id))).await {
                Ok(s) => {
                    started = Some(s);
                    break;
                }
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        started.unwrap_or_else(|| panic!("restarting member {id}: {last:?}"))
    };
    members[i].store = restarted;
    wait_for("catch-up", || members[i].store.revision() >= rev).await;
    let got = members[i]
        .store
        .range(RangeRequest::key("/tls/b"))
        .await
        .unwrap();
    assert_eq!(got.kvs[0].value, "2");
    let rev = members[i]
        .store
        .put(PutRequest::new("/tls/c", "3"))
        .await
        .unwrap()
        .revision;
    for m in &members {
        wait_for("replication after restart", || m.store.revision() >= rev).await;
    }
    for m in &members {
        m.store.shutdown().await;
    }
}

/// The etcd port is full access to the store: over mutual TLS it admits members,
/// administrators and the API server; a node, the controllers, a certificate from another
/// CA, no certificate and plaintext are each refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_port_admits_members_admins_and_the_api_server_and_never_nodes() {
    let ca = Ca::generate("cluster CA", Duration::from_secs(3600)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let tls = member_tls(&ca, 1);
    let server = EtcdGrpcServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(store),
        ServerInfo::default(),
    )
    .await
    .unwrap()
    .with_tls(
        tls.etcd_server(Admit::new("the etcd port", etcd_port_admits))
            .unwrap(),
    )
    .spawn();
    let endpoint = vec![server.endpoint()];
    let client = |ca: &Ca, who: &Issued| {
        etcd_client_config(ca.cert_pem(), &who.cert_pem, &who.key_pem).unwrap()
    };
    for (i, id) in [
        Identity::Admin("ops".into()),
        Identity::ApiServer,
        Identity::Member(2),
    ]
    .into_iter()
    .enumerate()
    {
        let who = issue(&ca, id.clone(), &[]);
        let mut c = etcd_client(&endpoint, Some(client(&ca, &who)))
            .await
            .unwrap();
        let key = format!("/admitted/{i}");
        c.put(key.as_str(), "yes", None)
            .await
            .unwrap_or_else(|e| panic!("{id} refused: {e}"));
        let got = c.get(key.as_str(), None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"yes");
    }
    let other = Ca::generate("another CA", Duration::from_secs(3600)).unwrap();
    let refused: Vec<(String, Option<Arc<rustls::ClientConfig>>)> = vec![
        (
            "a node".into(),
            Some(client(&ca, &issue(&ca, Identity::Node("n1".into()), &[]))),
        ),
        (
            "the controllers".into(),
            Some(client(&ca, &issue(&ca, Identity::Controllers, &[]))),
        ),
        (
            "an administrator of another CA".into(),
            Some(client(
                &ca,
                &issue(&other, Identity::Admin("ops".into()), &[]),
            )),
        ),
        ("no certificate".into(), {
            let mut c = lattice_pki::client_config(ca.cert_pem(), None).unwrap();
            c.alpn_protocols = vec![b"h2".to_vec()];
            Some(Arc::new(c))
        }),
        ("plaintext".into(), None),
    ];
    for (who, tls) in refused {
        let attempt = async {
            let mut c = etcd_client(&endpoint, tls).await?;
            c.put("/refused", who.as_str(), None)
                .await
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            c.get("/admitted/0", None)
                .await
                .map_err(|e| StoreError::Backend(e.to_string()))
        };
        let res = tokio::time::timeout(Duration::from_secs(10), attempt).await;
        assert!(!matches!(res, Ok(Ok(_))), "{who} got through the etcd port");
    }
    // Nothing of theirs was written.
    let admin = issue(&ca, Identity::Admin("check".into()), &[]);
    let mut c = etcd_client(&endpoint, Some(client(&ca, &admin)))
        .await
        .unwrap();
    assert!(c.get("/refused", None).await.unwrap().kvs().is_empty());
    server.shutdown().await.unwrap();
}

/// Off loopback a store port never serves plaintext: the etcd port and a Raft member
/// without TLS refuse a non-loopback address of this machine (a loopback one is allowed),
/// and a Raft member without TLS refuses to dial a peer off loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_is_refused_off_loopback() {
    let addr = off_loopback();
    let ip = addr.ip;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn KvBackend> = Arc::new(
        EmbeddedStore::open(dir.path(), StoreConfig::default())
            .await
            .unwrap(),
    );
    let server = EtcdGrpcServer::bind(SocketAddr::new(ip, 0), store.clone(), ServerInfo::default())
        .await
        .unwrap();
    let err = server.serve(async {}).await.unwrap_err();
    assert!(
        err.to_string().contains("plaintext on a non-loopback"),
        "{err}"
    );

    let raft_dir = tempfile::tempdir().unwrap();
    let err = RaftStore::start(RaftConfig::new(1, raft_dir.path(), SocketAddr::new(ip, 0)))
        .await
        .err()
        .expect("a plaintext member off loopback must not start");
    assert!(err.to_string().contains("no TLS"), "{err}");
    // Nor on loopback when it tells its peers to dial it elsewhere.
    let mut cfg = RaftConfig::new(1, raft_dir.path(), "127.0.0.1:0".parse().unwrap());
    cfg.advertise_addr = Some(format!("{ip}:7001"));
    assert!(RaftStore::start(cfg).await.is_err());

    // A plaintext member on loopback asked to add a peer off loopback never dials it.
    let mut cfg = RaftConfig::new(1, raft_dir.path(), "127.0.0.1:0".parse().unwrap());
    cfg.bootstrap = true;
    cfg.request_timeout = Duration::from_secs(2);
    let member = RaftStore::start(cfg).await.unwrap();
    member
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .unwrap();
    let peer = listener.local_addr().unwrap();
    let dialled = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(3), listener.accept())
            .await
            .is_ok()
    });
    let _ = tokio::time::timeout(
        Duration::from_secs(3),
        member.add_learner(2, peer.to_string()),
    )
    .await;
    assert!(
        !dialled.await.unwrap(),
        "plaintext Raft traffic went off loopback"
    );
    member.shutdown().await;
}
