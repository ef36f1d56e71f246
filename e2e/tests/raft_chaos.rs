//! A replicated store made of three real `lattice-server` processes: SIGKILL the leader
//! while 12 clients write through every member's etcd port. A new leader must be elected
//! within 5 s, no acknowledged write may be lost, writers resume, and the killed member
//! catches up after it restarts from its own disk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use lattice_e2e::RaftMember;

async fn leader_of(endpoint: &str) -> Option<u64> {
    let mut c = Client::connect([endpoint], None).await.ok()?;
    let status = tokio::time::timeout(Duration::from_secs(2), c.status())
        .await
        .ok()?
        .ok()?;
    (status.leader() != 0).then(|| status.leader())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_9_loses_no_acknowledged_write() {
    let root = tempfile::tempdir().unwrap();
    let mut members: Vec<RaftMember> = (1..=3).map(|id| RaftMember::new(root.path(), id)).collect();
    members[0].start(&["--bootstrap".into()]);
    let seed = format!("127.0.0.1:{}", members[0].raft);
    for m in members.iter_mut().skip(1) {
        m.start(&["--join".into(), seed.clone()]);
    }
    let endpoints: Vec<String> = members.iter().map(RaftMember::endpoint).collect();
    let mut leader = None;
    for _ in 0..100 {
        leader = leader_of(&endpoints[0]).await;
        if leader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = leader.expect("a leader");

    // 12 writers spread over the three members; each retries on another member when its
    // member dies, and records only acknowledged writes.
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..12usize {
        let endpoints = endpoints.clone();
        let acked = acked.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut i = 0u64;
            let mut target = w % endpoints.len();
            let mut client: Option<Client> = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if client.is_none() {
                    client = Client::connect([endpoints[target].clone()], None)
                        .await
                        .ok();
                }
                let Some(c) = client.as_mut() else {
                    target = (target + 1) % endpoints.len();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let (k, v) = (format!("/chaos/{w}/{i}"), format!("v{i}"));
                match tokio::time::timeout(
                    Duration::from_secs(5),
                    c.put(k.clone(), v.clone(), None),
                )
                .await
                {
                    Ok(Ok(_)) => {
                        acked.lock().unwrap().insert(k, v);
                        i += 1;
                    }
                    _ => {
                        // Unknown outcome: never reuse this key, switch member.
                        i += 1;
                        client = None;
                        target = (target + 1) % endpoints.len();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = acked.lock().unwrap().len();
    assert!(before_kill > 0, "no write acknowledged before the kill");

    let victim = members
        .iter()
        .position(|m| m.id == leader)
        .expect("leader is a member");
    let killed_at = Instant::now();
    members[victim].server.as_mut().expect("running").kill9();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let mut new_leader = None;
    while killed_at.elapsed() < Duration::from_secs(10) {
        if let Some(l) = leader_of(&endpoints[survivors[0]]).await {
            if l != leader {
                new_leader = Some(l);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elected_in = killed_at.elapsed();
    let new_leader = new_leader.expect("no new leader within 10 s");
    eprintln!("leader {leader} killed; member {new_leader} leads after {elected_in:?}");
    assert!(
        elected_in < Duration::from_secs(5),
        "election took {elected_in:?}"
    );

    // Writers resume.
    let at_election = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = acked.lock().unwrap().len();
    assert!(
        after > at_election,
        "writers did not resume after the election"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }

    // Every acknowledged write is on the surviving majority (linearizable read).
    let acked = acked.lock().unwrap().clone();
    let check = |stored: HashMap<String, String>, who: &str| {
        for (k, v) in &acked {
            assert_eq!(stored.get(k), Some(v), "{who}: acknowledged write {k} lost");
        }
    };
    async fn read_all(endpoint: &str, serializable: bool) -> HashMap<String, String> {
        let mut c = Client::connect([endpoint], None).await.unwrap();
        let mut opts = GetOptions::new().with_prefix();
        if serializable {
            opts = opts.with_serializable();
        }
        let resp = c.get("/chaos/", Some(opts)).await.unwrap();
        resp.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key_str().unwrap().to_string(),
                    kv.value_str().unwrap().to_string(),
                )
            })
            .collect()
    }
    check(read_all(&endpoints[survivors[0]], false).await, "survivor");
    eprintln!(
        "{} acknowledged writes present after the leader's kill -9",
        acked.len()
    );

    // The killed member restarts from its own disk and catches up.
    let id = members[victim].id;
    members[victim].server = None;
    members[victim].start(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stored = read_all(&endpoints[victim], true).await;
        if acked.keys().all(|k| stored.contains_key(k)) || Instant::now() > deadline {
            check(stored, &format!("restarted member {id}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
