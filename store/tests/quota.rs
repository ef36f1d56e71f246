//! The size quota and its NOSPACE alarm: raised when a write would go beyond the quota,
//! the same on every member, persisted, visible through etcd's alarm API; writes that add
//! data refused, deletes and compaction allowed; disarming lets writes through again.

mod raft_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_store::grpc::{EtcdGrpcServer, ServerInfo};
use lattice_store::raft::RaftConfig;
use lattice_store::*;
use raft_common::Cluster;

/// 64 KiB: a few dozen 1 KiB writes.
const QUOTA: u64 = 64 * 1024;

fn small_quota(c: &mut RaftConfig) {
    c.quota_bytes = QUOTA;
}

fn kib(i: usize) -> PutRequest {
    PutRequest::new(format!("/fill/{i:04}"), "x".repeat(1024))
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Write 1 KiB values through `via` until the store refuses one; returns how many went in.
async fn fill(via: &dyn KvBackend) -> usize {
    for i in 0..10_000 {
        match via.put(kib(i)).await {
            Ok(_) => {}
            Err(StoreError::NoSpace { quota_bytes }) => {
                assert_eq!(quota_bytes, QUOTA, "the refusal names the quota");
                return i;
            }
            Err(e) => panic!("write {i}: {e}"),
        }
    }
    panic!("10,000 KiB went into a {QUOTA}-byte store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_members_raise_refuse_free_and_disarm_alike() {
    let mut c = Cluster::start(3, small_quota).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.node((leader + 1) % 3);
    let written = fill(&follower).await;
    assert!(
        (40..64).contains(&written),
        "{written} KiB under a 64 KiB quota"
    );

    // Raised by the leader, through the log: every member holds it.
    let expected = vec![Alarm {
        member: leader as u64 + 1,
        kind: AlarmKind::NoSpace,
    }];
    for n in c.running() {
        let n2 = n.clone();
        wait_for("the alarm on every member", || {
            futures::executor::block_on(n2.alarms()).unwrap() == expected
        })
        .await;
        let st = n.status().await.unwrap();
        assert_eq!(st.alarms, expected);
        assert_eq!(st.quota_bytes, QUOTA as i64);
    }
    // Everything that adds data is refused, through any member; nothing is applied.
    let rev = c.node(leader).revision();
    for n in c.running() {
        assert!(matches!(
            n.put(PutRequest::new("/small", "x")).await,
            Err(StoreError::NoSpace { .. })
        ));
        assert!(matches!(
            n.lease_grant(0, 60).await,
            Err(StoreError::NoSpace { .. })
        ));
    }
    assert_eq!(c.node(leader).revision(), rev);

    // Deletes and compaction go on, and free space.
    let before = c.node(leader).status().await.unwrap().size_in_use;
    let del = follower
        .delete_range(DeleteRangeRequest {
            range: KeyRange::prefix("/fill/"),
            prev_kv: false,
        })
        .await
        .unwrap();
    follower.compact(del.revision).await.unwrap();
    let after = c.node(leader).status().await.unwrap().size_in_use;
    assert!(after < before / 4, "size {before} -> {after}");
    // Still refused: the alarm stays until disarmed.
    assert!(follower.put(PutRequest::new("/small", "x")).await.is_err());

    // The alarm survives a restart (it is persisted with the data).
    let victim = (leader + 2) % 3;
    c.stop(victim).await;
    c.restart(victim).await;
    assert_eq!(c.node(victim).alarms().await.unwrap(), expected);

    // Disarmed through a follower: gone on every member; writes go through again.
    let changed = follower
        .alarm(AlarmAction::Deactivate, expected[0])
        .await
        .unwrap();
    assert_eq!(changed, expected);
    for n in c.running() {
        let n2 = n.clone();
        wait_for("the alarm disarmed everywhere", || {
            futures::executor::block_on(n2.alarms()).unwrap().is_empty()
        })
        .await;
    }
    follower.put(PutRequest::new("/small", "x")).await.unwrap();
    c.shutdown_all().await;
}

/// The single member, through the etcd port with an etcd client: the alarm is listed by
/// etcd's alarm API, survives a restart, and `alarm disarm` (DEACTIVATE) lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_member_raises_lists_persists_and_disarms_through_the_etcd_port() {
    use etcd_client::{AlarmAction as EA, AlarmOptions, AlarmType};
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        quota_bytes: QUOTA,
        ..Default::default()
    };
    let store = EmbeddedStore::open(dir.path(), config.clone())
        .await
        .unwrap();
    let server = EtcdGrpcServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(store.clone()),
        ServerInfo::default(),
    )
    .await
    .unwrap()
    .spawn();
    let mut c = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut err = None;
    for i in 0..1000 {
        if let Err(e) = c.put(format!("/fill/{i}"), "x".repeat(1024), None).await {
            err = Some(e.to_string());
            break;
        }
    }
    let err = err.expect("the quota stops the writes");
    assert!(err.contains("database space exceeded"), "{err}");
    let list = c
        .maintenance_client()
        .alarm(EA::Get, AlarmType::None, None)
        .await
        .unwrap();
    let alarms: Vec<(u64, AlarmType)> = list
        .alarms()
        .iter()
        .map(|a| (a.member_id(), a.alarm()))
        .collect();
    assert_eq!(alarms, vec![(config.member_id, AlarmType::Nospace)]);
    // Deletes and compaction go on.
    let del = c
        .delete(
            "/fill/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    c.compact(del.header().unwrap().revision(), None)
        .await
        .unwrap();
    assert!(c.put("/after", "x", None).await.is_err(), "still raised");

    // Persisted: a restart finds it raised.
    drop(c);
    server.shutdown().await.unwrap();
    store.close().await;
    let store = EmbeddedStore::open(dir.path(), config.clone())
        .await
        .unwrap();
    assert_eq!(
        store.alarms().await.unwrap(),
        vec![Alarm {
            member: config.member_id,
            kind: AlarmKind::NoSpace
        }]
    );
    let server = EtcdGrpcServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(store.clone()),
        ServerInfo::default(),
    )
    .await
    .unwrap()
    .spawn();
    let mut c = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut opts = AlarmOptions::new();
    opts.with_member(config.member_id);
    let disarmed = c
        .maintenance_client()
        .alarm(EA::Deactivate, AlarmType::Nospace, Some(opts))
        .await
        .unwrap();
    assert_eq!(disarmed.alarms().len(), 1);
    c.put("/after", "x", None).await.unwrap();
    server.shutdown().await.unwrap();
    store.close().await;
}
