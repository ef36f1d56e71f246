//! Replicated store: in-process 3- and 5-member clusters over real gRPC on loopback, with real
//! fsyncs in temporary directories.

mod raft_common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lattice_store::raft::RaftConfig;
use lattice_store::*;
use raft_common::{get_value, no_tune, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bootstrap_replicates_to_every_member() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let members = c.node(0).members().await.unwrap();
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|m| !m.is_learner));
    // Writes through any member (followers forward to the leader).
    let mut last = 0;
    for i in 0..30 {
        let node = c.node(i % 3);
        last = node
            .put(PutRequest::new(format!("/k/{i}"), format!("v{i}")))
            .await
            .unwrap()
            .revision;
    }
    assert_eq!(last, 30);
    for i in 0..3 {
        c.wait_revision(i, last, Duration::from_secs(10)).await;
        let resp = c
            .node(i)
            .range(RangeRequest {
                serializable: true,
                ..RangeRequest::prefix("/k/")
            })
            .await
            .unwrap();
        assert_eq!(resp.count, 30, "member {}", i + 1);
    }
    assert_eq!(
        c.node((leader + 1) % 3).metrics().applied_revision.get(),
        last
    );
    let st = c.node(leader).status().await.unwrap();
    assert_eq!(st.leader, leader as u64 + 1);
    assert!(st.raft_term >= 1 && st.raft_applied_index >= 30);
    // The leader timed the 30 proposals (some share one when they arrive together) and
    // every member its log writes.
    let count =
        |i: usize, name: &str| histogram_count(|r| c.node(i).raft_metrics().register(r), name);
    assert!(count(leader, "lattice_raft_commit_duration_seconds") >= 1);
    for i in 0..3 {
        assert!(
            count(i, "lattice_raft_log_flush_duration_seconds") >= 1,
            "member {i}"
        );
    }
    // One write at a time: the log writers were idle, and the appends were logged by the
    // Raft tasks themselves (the data above was read back from them).
    let inline: u64 = (0..3)
        .map(|i| c.node(i).raft_metrics().log_inline_appends.get())
        .sum();
    assert!(inline >= 30, "{inline} appends logged inline");
    c.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linearizable_reads_from_a_follower_see_every_acknowledged_write() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.node((leader + 1) % 3);
    let leader_node = c.node(leader);
    for i in 0..40 {
        let v = format!("v{i}");
        leader_node
            .put(PutRequest::new("/lin", v.clone()))
            .await
            .unwrap();
        // Read index: no waiting, no retry; the follower must already answer the new value.
        assert_eq!(get_value(&follower, "/lin", false).await.unwrap(), Some(v));
    }
    // And a write through the follower is visible on the leader at once.
    follower.put(PutRequest::new("/lin2", "x")).await.unwrap();
    assert_eq!(
        get_value(&leader_node, "/lin2", false).await.unwrap(),
        Some("x".into())
    );
    c.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_under_50_writers_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let nodes = c.running();
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let after_kill = Arc::new(AtomicBool::new(false));
    let acked_after_kill = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..50usize {
        let nodes = nodes.clone();
        let acked = acked.clone();
        let stop = stop.clone();
        let after_kill = after_kill.clone();
        let acked_after_kill = acked_after_kill.clone();
        writers.push(tokio::spawn(async move {
            let mut seq = 0u64;
            let mut target = w % nodes.len();
            while !stop.load(Ordering::Relaxed) {
                let key = format!("/load/{w}/{seq}");
                seq += 1;
                match nodes[target].put(PutRequest::new(key.clone(), "x")).await {
                    Ok(_) => {
                        acked.lock().unwrap().push(key);
                        if after_kill.load(Ordering::Relaxed) {
                            acked_after_kill.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        target = (target + 1) % nodes.len();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = acked.lock().unwrap().len();
    assert!(before > 0, "no write succeeded before the kill");
    let killed_at = Instant::now();
    c.stop(leader).await;
    after_kill.store(true, Ordering::Relaxed);
    let new_leader = c.wait_leader(Duration::from_secs(5)).await;
    let elected_in = killed_at.elapsed();
    assert_ne!(new_leader, leader);
    assert!(
        elected_in < Duration::from_secs(5),
        "new leader took {elected_in:?}"
    );
    // Writers resume.
    let deadline = Instant::now() + Duration::from_secs(10);
    while acked_after_kill.load(Ordering::Relaxed) < 100 {
        assert!(
            Instant::now() < deadline,
            "writers did not resume after the leader was killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "new leader after {elected_in:?}; {} writes acknowledged ({before} before the kill)",
        acked.len()
    );
    // Every acknowledged write is on both survivors.
    for node in c.running() {
        let resp = node.range(RangeRequest::prefix("/load/")).await.unwrap();
        let present: BTreeSet<Vec<u8>> = resp.kvs.iter().map(|kv| kv.key.to_vec()).collect();
        for k in &acked {
            assert!(
                present.contains(k.as_bytes()),
                "member {} lost acknowledged write {k}",
                node.id()
            );
        }
    }
    c.shutdown_all().await;
}

fn small_snapshots(c: &mut RaftConfig) {
    c.snapshot_logs = 50;
    c.keep_logs_after_snapshot = 5;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_member_catches_up_after_restart_via_snapshot() {
    let mut c = Cluster::start(3, small_snapshots).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let victim = (leader + 1) % 3;
    c.stop(victim).await;
    let writer = c.node(leader);
    let mut last = 0;
    for i in 0..300 {
        last = writer
            .put(PutRequest::new(format!("/cu/{i:04}"), format!("{i}")))
            .await
            .unwrap()
            .revision;
    }
    // The leader's log is purged past what the stopped member has: it needs a snapshot.
    // (openraft postpones a purge while a replication attempt to the stopped member still
    // covers the entries, so writes go on until one happens.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut extra = 0;
    while writer.raft().metrics().borrow().purged.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader's log was never purged: {:?}",
            writer.raft().metrics().borrow()
        );
        last = writer
            .put(PutRequest::new(format!("/cu/x{extra:04}"), "x"))
            .await
            .unwrap()
            .revision;
        extra += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A purge follows a snapshot, which the member timed.
    let snapshots = histogram_count(
        |r| writer.metrics().register(r),
        "lattice_store_snapshot_duration_seconds",
    );
    assert!(snapshots >= 1, "no snapshot was timed");
    c.restart(victim).await;
    c.wait_revision(victim, last, Duration::from_secs(20)).await;
    let node = c.node(victim);
    let resp = node
        .range(RangeRequest {
            serializable: true,
            ..RangeRequest::prefix("/cu/")
        })
        .await
        .unwrap();
    assert_eq!(resp.count, 300 + extra);
    // It keeps replicating normally afterwards.
    let rev = writer
        .put(PutRequest::new("/cu/after", "y"))
        .await
        .unwrap()
        .revision;
    c.wait_revision(victim, rev, Duration::from_secs(10)).await;
    assert_eq!(
        get_value(&node, "/cu/after", true).await.unwrap(),
        Some("y".into())
    );
    c.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_cluster_restarted_from_disk_keeps_all_data() {
    let mut c = Cluster::start(3, small_snapshots).await;
    c.wait_leader(Duration::from_secs(10)).await;
    let node = c.node(0);
    for i in 0..120 {
        node.put(PutRequest::new(format!("/dur/{i:03}"), format!("{i}")))
            .await
            .unwrap();
    }
    let lease = node.lease_grant(0, 3600).await.unwrap();
    let mut p = PutRequest::new("/dur/leased", "l");
    p.lease = lease.id;
    let last = node.put(p).await.unwrap().revision;
    c.shutdown_all().await;
    // Member 1 restarts with --bootstrap again: an initialized log is not re-initialized.
    for i in 0..3 {
        c.restart(i).await;
    }
    let leader = c.wait_leader(Duration::from_secs(15)).await;
    let l = c.node(leader);
    let resp = l.range(RangeRequest::prefix("/dur/")).await.unwrap();
    assert_eq!(resp.count, 121);
    assert!(resp.revision >= last);
    assert_eq!(l.lease_leases().await.unwrap(), vec![lease.id]);
    assert_eq!(l.members().await.unwrap().len(), 3);
    // Still writable.
    l.put(PutRequest::new("/dur/new", "n")).await.unwrap();
    c.shutdown_all().await;
}

/// Applying an entry does not fsync `state.redb` (only checkpoints do): the fsynced log is
/// the durable record. A crash, simulated by copying a running member's files (what a power
/// cut leaves on disk), loses the applies since the last checkpoint, and the member redoes
/// them from its log: every acknowledged write is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_image_redoes_unsynced_applies_from_the_log() {
    crash_image_keeps_acknowledged_writes(no_tune, 20, true).await;
}

fn snapshot_and_purge_often(c: &mut RaftConfig) {
    c.snapshot_logs = 10;
    c.keep_logs_after_snapshot = 0;
}

/// The same with the log purged right behind every snapshot: a snapshot makes the state it
/// covers durable before the log below it can go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_image_after_snapshots_and_purges_keeps_acknowledged_writes() {
    crash_image_keeps_acknowledged_writes(snapshot_and_purge_often, 45, false).await;
}

async fn crash_image_keeps_acknowledged_writes(
    tune: fn(&mut RaftConfig),
    writes: usize,
    expect_lag: bool,
) {
    let started = Instant::now();
    let mut c = Cluster::start(1, tune).await;
    let node = c.node(0);
    let mut last = 0;
    for i in 0..writes {
        last = node
            .put(PutRequest::new(format!("/crash/{i:02}"), format!("{i}")))
            .await
            .unwrap()
            .revision;
    }
    // Within a second (and 1,024 entries) of the first apply no checkpoint was due.
    let no_checkpoint = started.elapsed() < Duration::from_millis(800);
    if !expect_lag {
        // Let snapshot builds and log purges triggered by the writes finish.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let image = tempfile::tempdir().unwrap();
    // The log first: an image whose state is newer than its log is fine, the reverse would
    // not be a possible crash.
    for f in [
        lattice_store::raft::LOG_WAL_FILE,
        lattice_store::raft::LOG_FILE,
        lattice_store::persist::STATE_FILE,
    ] {
        std::fs::copy(c.dirs[0].path().join(f), image.path().join(f)).unwrap();
    }
    c.stop(0).await;
    if expect_lag && no_checkpoint {
        let (_, mvcc) = lattice_store::persist::Persist::open(image.path()).unwrap();
        assert!(
            mvcc.revision() < last,
            "the image's state.redb is at revision {} already: nothing to redo",
            mvcc.revision()
        );
    }
    c.dirs[0] = image;
    c.restart(0).await;
    c.wait_leader(Duration::from_secs(10)).await;
    let node = c.node(0);
    let resp = node.range(RangeRequest::prefix("/crash/")).await.unwrap();
    assert_eq!(resp.count, writes as i64);
    assert!(resp.revision >= last, "{} < {last}", resp.revision);
    let key = format!("/crash/{:02}", writes - 1);
    assert_eq!(
        get_value(&node, &key, true).await.unwrap(),
        Some(format!("{}", writes - 1))
    );
    node.put(PutRequest::new("/crash/new", "n")).await.unwrap();
    c.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_and_remove_members() {
    let mut c = Cluster::start(3, no_tune).await;
    c.wait_leader(Duration::from_secs(10)).await;
    c.node(0).put(PutRequest::new("/m/a", "1")).await.unwrap();
    // A fourth member joins: learner first (it catches up), then voter.
    let dir = tempfile::tempdir().unwrap();
    let cfg = raft_common::config(4, dir.path(), "127.0.0.1:0".parse().unwrap(), no_tune);
    let n4 = lattice_store::raft::RaftStore::start(cfg).await.unwrap();
    c.node(1)
        .add_learner(4, n4.local_addr().to_string())
        .await
        .unwrap();
    let m = c.node(0).members().await.unwrap();
    assert!(m.iter().any(|m| m.id == 4 && m.is_learner), "{m:?}");
    c.node(2).promote(4).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = n4.raft_status();
        if st.voters.len() == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "member 4 never saw itself as voter: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        get_value(&n4, "/m/a", false).await.unwrap(),
        Some("1".into())
    );
    // Remove member 2 (whoever leads), then keep writing with the rest.
    c.node(0).remove_member(2).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ids: BTreeSet<u64> = n4.members().await.unwrap().iter().map(|m| m.id).collect();
        if ids == BTreeSet::from([1, 3, 4]) {
            break;
        }
        assert!(Instant::now() < deadline, "member 2 still listed: {ids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.stop(1).await;
    let rev = n4.put(PutRequest::new("/m/b", "2")).await.unwrap().revision;
    assert_eq!(
        get_value(&c.node(0), "/m/b", false).await.unwrap(),
        Some("2".into())
    );
    assert!(rev > 1);
    n4.shutdown().await;
    c.shutdown_all().await;
}

fn short_requests(c: &mut RaftConfig) {
    c.request_timeout = Duration::from_secs(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_minority_cannot_commit() {
    let mut c = Cluster::start(3, short_requests).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    // 1) A partitioned follower can neither write nor serve linearizable reads; the
    //    majority goes on.
    let f = (leader + 1) % 3;
    let follower = c.node(f);
    follower.network().set_partitioned(true);
    assert!(follower
        .put(PutRequest::new("/p/minority", "x"))
        .await
        .is_err());
    assert!(get_value(&follower, "/p/minority", false).await.is_err());
    let rev = c
        .node(leader)
        .put(PutRequest::new("/p/majority", "y"))
        .await
        .unwrap()
        .revision;
    follower.network().set_partitioned(false);
    c.wait_revision(f, rev, Duration::from_secs(10)).await;
    assert_eq!(
        get_value(&follower, "/p/minority", false).await.unwrap(),
        None
    );

    // 2) A partitioned leader cannot commit: its write is never acknowledged, the other two
    //    elect a new leader and commit, and the old leader's entry is discarded on healing.
    let old = c.wait_leader(Duration::from_secs(10)).await;
    let old_leader = c.node(old);
    old_leader.network().set_partitioned(true);
    let res = old_leader
        .put(PutRequest::new("/p/old-leader", "lost"))
        .await;
    assert!(
        res.is_err(),
        "a partitioned leader acknowledged a write: {res:?}"
    );
    let other = c.node((old + 1) % 3);
    // The first attempts may fail while the majority still waits for the old leader.
    let deadline = Instant::now() + Duration::from_secs(10);
    let rev = loop {
        match other.put(PutRequest::new("/p/new-leader", "ok")).await {
            Ok(r) => break r.revision,
            Err(e) => assert!(Instant::now() < deadline, "majority cannot commit: {e}"),
        }
    };
    old_leader.network().set_partitioned(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while old_leader.revision() < rev || old_leader.is_leader() {
        assert!(Instant::now() < deadline, "old leader did not rejoin");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in c.running() {
        assert_eq!(
            get_value(&n, "/p/old-leader", false).await.unwrap(),
            None,
            "member {}",
            n.id()
        );
        assert_eq!(
            get_value(&n, "/p/new-leader", false).await.unwrap(),
            Some("ok".into())
        );
    }
    c.shutdown_all().await;
}

/// Put `key` through any running member, retrying while a leader is being elected;
/// returns the revision once acknowledged.
async fn put_until_acknowledged(c: &Cluster, key: &str, value: &str, within: Duration) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        for n in c.running() {
            match n
                .put(PutRequest::new(key.to_owned(), value.to_owned()))
                .await
            {
                Ok(r) => return r.revision,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "{key} not acknowledged within {within:?}: {e}"
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Five members need three for a majority: with the leader and a follower gone the other
/// three elect a leader and go on; with a third gone the last two commit nothing (and
/// elect no leader); with three running again writes resume, and every member, the
/// stopped ones included once restarted, ends with every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_members_survive_two_failures_but_not_three() {
    let mut c = Cluster::start(5, short_requests).await;
    let first = c.wait_leader(Duration::from_secs(10)).await;
    for i in 0..5 {
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.node(i).raft_status().voters.len() != 5 {
            assert!(
                Instant::now() < deadline,
                "member {} never saw 5 voters",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut acked = vec![(
        "/five/0".to_string(),
        put_until_acknowledged(&c, "/five/0", "0", Duration::from_secs(5)).await,
    )];

    // Two down, the leader among them: a new leader within 5 s, writes go on.
    let second = (first + 1) % 5;
    c.stop(first).await;
    c.stop(second).await;
    let stopped = Instant::now();
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "new leader after {:?}",
        stopped.elapsed()
    );
    assert!(leader != first && leader != second);
    for k in 1..=20 {
        let key = format!("/five/{k}");
        let rev = put_until_acknowledged(&c, &key, "3 up", Duration::from_secs(10)).await;
        acked.push((key, rev));
    }

    // A third down (the leader): two of five are no majority.
    c.stop(leader).await;
    let last = acked.last().map_or(0, |a| a.1);
    for n in c.running() {
        let res = n.put(PutRequest::new("/five/minority", "lost")).await;
        assert!(res.is_err(), "two of five acknowledged a write: {res:?}");
        assert!(
            get_value(&n, "/five/0", false).await.is_err(),
            "two of five served a linearizable read"
        );
        // (It may lag the last acknowledged write: the commit index may not have reached it
        // before the leader stopped.)
        assert!(
            n.revision() <= last,
            "member {} applied past {last}",
            n.id()
        );
        assert!(!n.is_leader(), "member {} leads two of five", n.id());
    }

    // Three again: writes resume.
    c.restart(first).await;
    let rev = put_until_acknowledged(&c, "/five/back", "3 up", Duration::from_secs(15)).await;
    acked.push(("/five/back".into(), rev));

    // All five: the restarted members catch up with everything acknowledged.
    c.restart(second).await;
    c.restart(leader).await;
    for i in 0..5 {
        c.wait_revision(i, rev, Duration::from_secs(20)).await;
    }
    for n in c.running() {
        for (key, _) in &acked {
            assert!(
                get_value(&n, key, true).await.unwrap().is_some(),
                "member {} lost acknowledged {key}",
                n.id()
            );
        }
        assert_eq!(
            get_value(&n, "/five/minority", true).await.unwrap(),
            None,
            "member {}",
            n.id()
        );
    }
    c.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_expire_by_the_leaders_decision_and_keep_alive_goes_to_the_leader() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.node((leader + 1) % 3);
    // Granted through a follower, attached to a key.
    let short = follower.lease_grant(0, 1).await.unwrap();
    let kept = follower.lease_grant(0, 2).await.unwrap();
    for (key, lease) in [("/l/short", short.id), ("/l/kept", kept.id)] {
        let mut p = PutRequest::new(key, "v");
        p.lease = lease;
        follower.put(p).await.unwrap();
    }
    let ttl = follower.lease_time_to_live(kept.id, true).await.unwrap();
    assert_eq!(ttl.granted_ttl, 2);
    assert_eq!(ttl.keys.len(), 1);
    // Keep one alive through the follower for 4 s; the other expires.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        assert_eq!(follower.lease_keep_alive(kept.id).await.unwrap(), 2);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    for n in c.running() {
        assert_eq!(
            get_value(&n, "/l/short", false).await.unwrap(),
            None,
            "member {}",
            n.id()
        );
        assert_eq!(
            get_value(&n, "/l/kept", false).await.unwrap(),
            Some("v".into())
        );
        assert_eq!(n.lease_leases().await.unwrap(), vec![kept.id]);
    }
    assert!(matches!(
        follower.lease_keep_alive(short.id).await,
        Err(StoreError::LeaseNotFound)
    ));
    // Without keep-alives the second one expires too.
    let deadline = Instant::now() + Duration::from_secs(6);
    while get_value(&follower, "/l/kept", false)
        .await
        .unwrap()
        .is_some()
    {
        assert!(Instant::now() < deadline, "lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_on_a_follower_sees_replicated_writes() {
    use futures::StreamExt;
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.node((leader + 1) % 3);
    let mut w = follower
        .watch(WatchRequest {
            range: KeyRange::prefix("/w/"),
            start_revision: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..10 {
        c.node(leader)
            .put(PutRequest::new(format!("/w/{i}"), "x"))
            .await
            .unwrap();
    }
    let mut seen = 0;
    while seen < 10 {
        let batch = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen += batch.events.len();
    }
    assert_eq!(seen, 10);
    c.shutdown_all().await;
}

mod suite;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_member_joins_through_any_seed_address() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    c.node(0).put(PutRequest::new("/j/a", "1")).await.unwrap();
    let seed = c.addrs[(leader + 1) % 3].to_string(); // a follower's address
    let dir = tempfile::tempdir().unwrap();
    let cfg = raft_common::config(4, dir.path(), "127.0.0.1:0".parse().unwrap(), no_tune);
    let n4 = lattice_store::raft::RaftStore::start(cfg).await.unwrap();
    n4.join(&seed).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while n4.raft_status().voters != BTreeSet::from([1, 2, 3, 4]) {
        assert!(Instant::now() < deadline, "{:?}", n4.raft_status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    n4.join(&seed).await.unwrap(); // idempotent
    assert_eq!(
        get_value(&n4, "/j/a", true).await.unwrap(),
        Some("1".into())
    );
    n4.put(PutRequest::new("/j/b", "2")).await.unwrap();
    assert_eq!(
        get_value(&c.node(leader), "/j/b", false).await.unwrap(),
        Some("2".into())
    );
    n4.shutdown().await;
    c.shutdown_all().await;
}

/// The shared `KvBackend` conformance suite (etcd's semantics), through a follower of a
/// 3-member cluster: every write is forwarded, every linearizable read takes a read index.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_passes_the_backend_conformance_suite() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.node((leader + 1) % 3);
    let failed = suite::run_all_collect(Arc::new(follower)).await;
    assert!(failed.is_empty(), "conformance failures: {failed:#?}");
    c.shutdown_all().await;
}

/// Members 1 and 3 run with `--max-txn-ops 8`, member 2 with 64.
fn mixed_txn_limits(c: &mut RaftConfig) {
    c.limits.max_txn_ops = if c.node_id == 2 { 64 } else { 8 };
}

fn puts(prefix: &str, n: usize) -> Vec<TxnOp> {
    (0..n)
        .map(|i| TxnOp::Put(PutRequest::new(format!("{prefix}{i}"), "v")))
        .collect()
}

/// `--max-txn-ops` is checked by the member that receives a transaction, before it is
/// proposed, and never when an entry is applied: a transaction one member admits is
/// applied by every member, whatever their own limits (they used to reject it at apply
/// and diverge), and one it refuses never reaches the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_with_different_max_txn_ops_apply_alike() {
    let mut c = Cluster::start(3, mixed_txn_limits).await;
    c.wait_leader(Duration::from_secs(10)).await;
    assert_eq!(c.node(1).max_txn_ops(), 64);
    assert_eq!(c.node(0).max_txn_ops(), 8);

    // 20 operations: within member 2's limit, over members 1 and 3's.
    let big = TxnRequest {
        compare: vec![Compare::version("/big/0", CompareResult::Equal, 0)],
        success: puts("/big/", 19),
        failure: vec![],
    };
    let resp = c.node(1).txn(big.clone()).await.unwrap();
    assert!(resp.succeeded);
    let rev = resp.revision;
    for i in 0..3 {
        c.wait_revision(i, rev, Duration::from_secs(10)).await;
        let got = c
            .node(i)
            .range(RangeRequest {
                serializable: true,
                ..RangeRequest::prefix("/big/")
            })
            .await
            .unwrap();
        assert_eq!(got.count, 19, "member {} diverged", i + 1);
        assert_eq!(c.node(i).revision(), rev, "member {}", i + 1);
    }

    // The same transaction through members 1 and 3 (leader or follower alike) is refused
    // there, with their limit, and nothing is proposed: no log entry, no revision.
    let logs: Vec<u64> = (0..3)
        .map(|i| c.node(i).raft_status().last_log_index)
        .collect();
    for i in [0, 2] {
        let err = c.node(i).txn(big.clone()).await.unwrap_err();
        assert_eq!(
            err,
            StoreError::TooManyOps { ops: 20, limit: 8 },
            "member {}",
            i + 1
        );
        assert!(err.to_string().contains("--max-txn-ops"), "{err}");
    }
    // A write that is admitted afterwards takes the very next revision and log index.
    let small = c.node(0).put(PutRequest::new("/small", "x")).await.unwrap();
    assert_eq!(small.revision, rev + 1);
    for (i, log) in logs.iter().enumerate() {
        c.wait_revision(i, rev + 1, Duration::from_secs(10)).await;
        assert_eq!(
            c.node(i).raft_status().last_log_index,
            log + 1,
            "member {}: an entry besides the small put reached the log",
            i + 1
        );
    }
    c.shutdown_all().await;
}

/// The AppendEntries stream (`AppendStream`): each request gets one answer, in order, on
/// one stream; an undecodable message ends that stream with `InvalidArgument` and nothing
/// else; the member goes on replicating (its leader's streams are untouched).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn append_stream_answers_in_order_and_refuses_garbage_without_harm() {
    use lattice_store::raft::pb::raft_transport_client::RaftTransportClient;
    use lattice_store::raft::pb::Payload;
    use lattice_store::raft::TypeConfig;
    use openraft::error::RaftError;
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};

    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let f = (leader + 1) % 3;
    let addr = format!("http://{}", c.node(f).local_addr());
    let mut client = RaftTransportClient::connect(addr.clone()).await.unwrap();

    // Two stale heartbeats (term 0, from a member that does not exist) on one stream: two
    // answers, both "higher vote", in order, and the stream stays open.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = client
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        let req: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
            vote: openraft::Vote::new(0, 99),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        };
        tx.send(Payload {
            data: postcard::to_allocvec(&req).unwrap(),
        })
        .await
        .unwrap();
        let answer = answers.message().await.unwrap().expect("an answer");
        let resp: Result<AppendEntriesResponse<u64>, RaftError<u64>> =
            postcard::from_bytes(&answer.data).unwrap();
        assert!(
            matches!(resp, Ok(AppendEntriesResponse::HigherVote(_))),
            "{resp:?}"
        );
    }
    // Garbage: the stream ends with InvalidArgument.
    tx.send(Payload {
        data: vec![0xff; 7],
    })
    .await
    .unwrap();
    let status = answers.message().await.expect_err("garbage refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(answers.message().await.map_or(true, |m| m.is_none()));

    // The member still replicates: a write through the leader reaches it.
    let rev = c
        .node(leader)
        .put(PutRequest::new("/stream/after", "ok"))
        .await
        .unwrap()
        .revision;
    c.wait_revision(f, rev, Duration::from_secs(10)).await;
    assert_eq!(
        get_value(&c.node(f), "/stream/after", true).await.unwrap(),
        Some("ok".into())
    );
    c.shutdown_all().await;
}

/// Heartbeats far apart: followers learn a commit index held back for the leader's log
/// (below) only through the heartbeat sent once it is written.
fn slow_heartbeats(c: &mut RaftConfig) {
    c.heartbeat_interval = Duration::from_secs(5);
    c.election_timeout_min = Duration::from_secs(15);
    c.election_timeout_max = Duration::from_secs(20);
}

/// The leader replicates an entry while it writes it to its own log, but nothing is
/// answered, applied or sent to followers as committed before its own log has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_leader_log_delays_answers_and_follower_applies_not_replication() {
    let mut c = Cluster::start(3, slow_heartbeats).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let l = c.node(leader);
    let rev = l
        .put(PutRequest::new("/slow/warm", "1"))
        .await
        .unwrap()
        .revision;
    for i in 0..3 {
        c.wait_revision(i, rev, Duration::from_secs(10)).await;
    }
    let before = l.durable_log_index().expect("a durable log");
    let followers: Vec<lattice_store::raft::RaftStore> =
        (0..3).filter(|i| *i != leader).map(|i| c.node(i)).collect();

    let delay = Duration::from_millis(400);
    l.delay_log_writes(delay);
    let started = Instant::now();
    let writer = l.clone();
    let put = tokio::spawn(async move {
        let r = writer.put(PutRequest::new("/slow/k", "v")).await;
        (r, Instant::now())
    });

    // While the leader's write is held up: the followers receive the entry (replication
    // did not wait for the leader's log) but apply nothing past the leader's durable log.
    let mut replicated = false;
    while started.elapsed() < delay - Duration::from_millis(100) {
        let durable = l.durable_log_index().unwrap_or(0);
        for f in &followers {
            let m = f.raft().metrics().borrow().clone();
            let applied = m.last_applied.map_or(0, |a| a.index);
            assert!(
                applied <= durable,
                "follower {} applied {applied} past the leader's durable log {durable}",
                f.id()
            );
            if m.last_log_index.unwrap_or(0) > before {
                replicated = true;
            }
        }
        assert!(
            !put.is_finished(),
            "answered before the leader's log had it"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        replicated,
        "the followers got the entry only after the leader's write"
    );
    assert_eq!(
        l.durable_log_index(),
        Some(before),
        "the leader's write was not held up"
    );

    let (res, answered) = put.await.unwrap();
    let rev = res.unwrap().revision;
    assert!(
        answered - started >= delay,
        "answered after {:?}",
        answered - started
    );
    l.delay_log_writes(Duration::ZERO);
    // The followers learn the commit once the leader's log has it: from the heartbeat
    // sent then, well before the next regular one (5 s).
    for i in 0..3 {
        c.wait_revision(i, rev, Duration::from_millis(1500)).await;
    }
    assert!(l.raft_metrics().commit_clamped.get() > 0);
    assert!(l.raft_metrics().commit_heartbeats.get() > 0);
    assert_eq!(
        get_value(&followers[0], "/slow/k", true).await.unwrap(),
        Some("v".into())
    );
    c.shutdown_all().await;
}

/// A leader that restarts comes back through an election in a later term, never as the
/// leader of its old term (whose log IDs it could then hand out again; see
/// `LogDb::restart_vote`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_leader_leads_again_only_after_an_election() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let rev = c
        .node(leader)
        .put(PutRequest::new("/restart/a", "1"))
        .await
        .unwrap()
        .revision;
    let term = c.node(leader).raft().metrics().borrow().current_term;
    c.stop(leader).await;
    c.restart(leader).await;
    let metrics = c.node(leader).raft().metrics().borrow().clone();
    assert!(
        metrics.current_leader != Some(leader as u64 + 1) || metrics.current_term > term,
        "restarted as the leader of term {term}"
    );
    let now = c.wait_leader(Duration::from_secs(10)).await;
    let new_term = c.node(now).raft().metrics().borrow().current_term;
    assert!(new_term > term, "leader of term {new_term}, was {term}");
    let rev2 = c
        .node(now)
        .put(PutRequest::new("/restart/b", "2"))
        .await
        .unwrap()
        .revision;
    assert!(rev2 > rev);
    for i in 0..3 {
        c.wait_revision(i, rev2, Duration::from_secs(10)).await;
    }
    c.shutdown_all().await;
}

/// A leader whose Raft log fails stops; the others elect a leader and go on, and no
/// acknowledged write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_log_fails_stops_and_the_others_go_on() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let l = c.node(leader);
    let rev = l
        .put(PutRequest::new("/fail/a", "1"))
        .await
        .unwrap()
        .revision;
    l.fail_log_writes();
    // Not acknowledged (its outcome is unknown to the client).
    let res = l.put(PutRequest::new("/fail/b", "2")).await;
    assert!(res.is_err(), "{res:?}");
    // The member stops as a whole: not even a local read is served any more.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match get_value(&l, "/fail/a", true).await {
            Err(StoreError::Stopped) => break,
            other => assert!(Instant::now() < deadline, "still serving: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        l.current_leader() != Some(l.id()),
        "still names itself leader"
    );
    // The others elect a leader among themselves and take writes.
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let new_leader = loop {
        let found = others.iter().copied().find(|i| {
            let m = c.node(*i).raft().metrics().borrow().clone();
            m.current_leader == Some(*i as u64 + 1)
        });
        if let Some(i) = found {
            break i;
        }
        assert!(Instant::now() < deadline, "no new leader among the others");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let rev2 = c
        .node(new_leader)
        .put(PutRequest::new("/fail/c", "3"))
        .await
        .unwrap()
        .revision;
    assert!(rev2 > rev);
    for i in &others {
        c.wait_revision(*i, rev2, Duration::from_secs(10)).await;
        assert_eq!(
            get_value(&c.node(*i), "/fail/a", true).await.unwrap(),
            Some("1".into())
        );
    }
    c.shutdown_all().await;
}

/// The observation count of histogram `name` among the metrics `register` adds.
fn histogram_count(
    register: impl FnOnce(&mut prometheus_client::registry::Registry),
    name: &str,
) -> u64 {
    let mut registry = prometheus_client::registry::Registry::default();
    register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let line = format!("{name}_count ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .unwrap_or_else(|| panic!("no {name}_count in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Many writers through one follower: their requests share its forward stream to the
/// leader and each gets its own answer back (a put's previous value is the writer's own
/// last one), whatever order the leader answers in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_through_a_follower_each_get_their_own_answer() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let f = (leader + 1) % 3;
    let follower = c.node(f);
    let mut writers = Vec::new();
    for w in 0..32usize {
        let follower = follower.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..20usize {
                let mut put = PutRequest::new(format!("/fw/{w}"), format!("{w}-{i}"));
                put.prev_kv = true;
                let resp = follower.put(put).await.unwrap();
                let prev = resp
                    .prev_kv
                    .map(|kv| String::from_utf8(kv.value.to_vec()).unwrap());
                let expected = i.checked_sub(1).map(|p| format!("{w}-{p}"));
                assert_eq!(prev, expected, "writer {w}, write {i}");
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let forwarded = histogram_count(
        |r| follower.raft_metrics().register(r),
        "lattice_raft_forward_duration_seconds",
    );
    assert!(forwarded >= 640, "{forwarded} forwarded requests counted");
    for i in 0..3 {
        assert_eq!(
            get_value(&c.node(i), "/fw/31", false).await.unwrap(),
            Some("31-19".into()),
            "member {i}"
        );
    }
    c.shutdown_all().await;
}

/// A leader that does not serve the forward stream (as a member from before it) is asked
/// with unary calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_through_a_follower_fall_back_to_unary_calls() {
    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    c.node(leader).network().set_refuse_forward_streams(true);
    let f = (leader + 1) % 3;
    for i in 0..5 {
        c.node(f)
            .put(PutRequest::new(format!("/unary/{i}"), "v"))
            .await
            .unwrap();
    }
    assert_eq!(
        get_value(&c.node(leader), "/unary/4", false).await.unwrap(),
        Some("v".into())
    );
    c.shutdown_all().await;
}

/// Malformed forward-stream messages never crash the leader: one shorter than its ID ends
/// the stream with InvalidArgument; an undecodable request is answered (under its ID) with
/// an error and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forward_stream_refuses_garbage_without_harm() {
    use lattice_store::raft::pb::raft_transport_client::RaftTransportClient;
    use lattice_store::raft::pb::Payload;

    let mut c = Cluster::start(3, no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let addr = format!("http://{}", c.node(leader).local_addr());
    let mut client = RaftTransportClient::connect(addr).await.unwrap();

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = client
        .forward_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for id in [5u64, 6] {
        let mut data = id.to_le_bytes().to_vec();
        data.extend_from_slice(&[0xff; 16]);
        tx.send(Payload { data }).await.unwrap();
        let answer = answers.message().await.unwrap().expect("an answer");
        assert_eq!(answer.data[..8], id.to_le_bytes(), "answered under its ID");
        assert_eq!(answer.data[8], 0, "a result (an error), not a refusal");
        assert!(answer.data.len() > 9);
    }
    tx.send(Payload { data: vec![1; 7] }).await.unwrap();
    let status = answers.message().await.expect_err("garbage refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");

    // The cluster still takes writes through a follower.
    let f = (leader + 1) % 3;
    c.node(f)
        .put(PutRequest::new("/forward/after", "ok"))
        .await
        .unwrap();
    assert_eq!(
        get_value(&c.node(leader), "/forward/after", false)
            .await
            .unwrap(),
        Some("ok".into())
    );
    c.shutdown_all().await;
}
