//! Behaviour of the durable embedded store: watches under concurrent writes, slow
//! watchers, leases, limits, corruption detection, backup and restore. Real files in a
//! temporary directory, real fsyncs.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lattice_store::*;

async fn open(dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::open(dir, StoreConfig::default())
        .await
        .expect("open store")
}

async fn next(w: &mut WatchStream) -> WatchBatch {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("watch stalled")
        .expect("watch ended")
        .expect("watch error")
}

/// `<name>_count` of a histogram in the store's metrics.
fn histogram_count(store: &EmbeddedStore, name: &str) -> u64 {
    let mut registry = prometheus_client::registry::Registry::default();
    store.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let prefix = format!("lattice_store_{name}_count ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
}

/// A lone writer's writes (after its first three) are committed by the request itself,
/// not handed to the writer thread and back; concurrent writers still queue for the writer thread and share
/// fsyncs; a write that finds a checkpoint due goes to the writer thread, which
/// checkpoints; and everything comes back after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_writes_commit_inline_and_the_log_still_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let inline = || store.metrics().inline_commits.get();
    for i in 0..20 {
        store
            .put(PutRequest::new(format!("/in/{i:03}"), "v"))
            .await
            .unwrap();
    }
    // The first three establish that one client writes in turn; the rest go inline (but
    // for one that found the log's 5-second checkpoint due, on a very slow machine).
    assert!(
        (16..=17).contains(&inline()),
        "{} of 20 sequential puts inline",
        inline()
    );
    assert_eq!(histogram_count(&store, "commit_batch_size"), 20);

    let writers: Vec<_> = (0..64)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    store
                        .put(PutRequest::new(format!("/in/c{w:02}-{i}"), "v"))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let batches = histogram_count(&store, "commit_batch_size") - 20;
    assert!(
        batches < 640,
        "64 concurrent writers shared no fsync: {batches} batches for 640 puts"
    );
    assert!(inline() < 20 + 640, "every concurrent put went inline");

    // 9 values of 1.4 MiB pass the log's 12 MiB checkpoint mark.
    let big = "x".repeat(1400 * 1024);
    let checkpoints = histogram_count(&store, "checkpoint_duration_seconds");
    for i in 0..10 {
        store
            .put(PutRequest::new(format!("/in/big{i}"), big.clone()))
            .await
            .unwrap();
    }
    assert!(
        histogram_count(&store, "checkpoint_duration_seconds") > checkpoints,
        "no checkpoint after 14 MiB of log"
    );

    // With many watchers (here 100) even a lone writer's writes go to the writer thread,
    // whose wake-ups of the watchers' tasks spread over the runtime's workers.
    let mut watches = Vec::new();
    for _ in 0..100 {
        watches.push(
            store
                .watch(WatchRequest {
                    range: KeyRange::prefix("/in/w"),
                    ..Default::default()
                })
                .await
                .unwrap(),
        );
    }
    let before = inline();
    for i in 0..10 {
        store
            .put(PutRequest::new(format!("/in/w{i}"), "v"))
            .await
            .unwrap();
    }
    assert_eq!(inline(), before, "watched writes committed inline");
    for w in &mut watches {
        let mut seen = 0;
        while seen < 10 {
            seen += next(w).await.events.len();
        }
    }
    drop(watches);

    let revision = store.revision();
    store.close().await;
    drop(store);
    let store = open(dir.path()).await;
    assert_eq!(store.revision(), revision);
    let all = store.range(RangeRequest::prefix("/in/")).await.unwrap();
    assert_eq!(all.kvs.len(), 20 + 640 + 10 + 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_every_revision_once_under_concurrent_writers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for i in 0..50 {
        store
            .put(PutRequest::new(format!("/w/{i}"), "x"))
            .await
            .unwrap();
    }
    // Start in the past while 8 writers keep going: history then live, no gap.
    let mut writers = Vec::new();
    for w in 0..8 {
        let s = store.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..100 {
                s.put(PutRequest::new(format!("/w/{w}-{i}"), "y"))
                    .await
                    .unwrap();
            }
        }));
    }
    let mut watch = store
        .watch(WatchRequest {
            range: KeyRange::prefix("/w/"),
            start_revision: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    for w in writers {
        w.await.unwrap();
    }
    let last = store.revision();
    let mut expect = 10;
    while expect <= last {
        for e in next(&mut watch).await.events {
            assert_eq!(e.kv.mod_revision, expect, "gap or duplicate in watch");
            expect += 1;
        }
    }
    assert_eq!(expect, 50 + 800 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_blocks_nobody_and_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        watch_buffer: 2,
        ..Default::default()
    };
    let store = EmbeddedStore::open(dir.path(), config).await.unwrap();
    let mut slow = store
        .watch(WatchRequest {
            range: KeyRange::prefix("/s/"),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut fast = store
        .watch(WatchRequest {
            range: KeyRange::prefix("/s/"),
            ..Default::default()
        })
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        let mut n = 0;
        while n < 2000 {
            n += next(&mut fast).await.events.len();
        }
        n
    });
    let mut batch = Vec::new();
    for i in 0..2000 {
        let s = store.clone();
        batch.push(tokio::spawn(async move {
            s.put(PutRequest::new(format!("/s/{i}"), "v"))
                .await
                .unwrap()
        }));
    }
    for b in batch {
        b.await.unwrap();
    }
    assert_eq!(reader.await.unwrap(), 2000);
    // The slow one was never read while writes happened; it still gets all 2000, in order.
    let mut seen = 0;
    let mut last_rev = 0;
    while seen < 2000 {
        for e in next(&mut slow).await.events {
            assert!(e.kv.mod_revision > last_rev);
            last_rev = e.kv.mod_revision;
            seen += 1;
        }
    }
    assert_eq!(seen, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_deletes_its_keys_and_notifies_watchers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let lease = store.lease_grant(0, 1).await.unwrap();
    assert!(lease.id > 0);
    let mut put = PutRequest::new("/lease/k", "v");
    put.lease = lease.id;
    store.put(put).await.unwrap();
    let ttl = store.lease_time_to_live(lease.id, true).await.unwrap();
    assert_eq!(ttl.keys, vec![Bytes::from("/lease/k")]);
    assert_eq!(ttl.granted_ttl, 1);
    let mut w = store
        .watch(WatchRequest {
            range: KeyRange::single("/lease/k"),
            ..Default::default()
        })
        .await
        .unwrap();
    let batch = next(&mut w).await;
    assert_eq!(batch.events[0].kind, EventType::Delete);
    assert!(store.get(Bytes::from("/lease/k")).await.unwrap().is_none());
    assert_eq!(
        store.lease_time_to_live(lease.id, false).await.unwrap().ttl,
        -1
    );
    assert_eq!(
        store.lease_keep_alive(lease.id).await,
        Err(StoreError::LeaseNotFound)
    );
}

#[tokio::test]
async fn keep_alive_holds_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let lease = store.lease_grant(42, 1).await.unwrap();
    assert_eq!(lease.id, 42);
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(store.lease_keep_alive(42).await.unwrap(), 1);
    }
    assert_eq!(store.lease_leases().await.unwrap(), vec![42]);
    store.lease_revoke(42).await.unwrap();
    assert!(store.lease_leases().await.unwrap().is_empty());
}

#[tokio::test]
async fn limits_give_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let big_key = "k".repeat(5000);
    let err = store.put(PutRequest::new(big_key, "v")).await.unwrap_err();
    assert!(err.to_string().contains("--max-key-bytes"), "{err}");
    let big_value = vec![0u8; 2 * 1024 * 1024];
    let err = store
        .put(PutRequest::new("k", big_value))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ValueTooLarge { .. }));
    assert_eq!(
        store.put(PutRequest::new("", "v")).await.unwrap_err(),
        StoreError::EmptyKey
    );
    let mut put = PutRequest::new("k", "v");
    put.lease = 999;
    assert_eq!(store.put(put).await.unwrap_err(), StoreError::LeaseNotFound);
    assert_eq!(store.revision(), 0);
}

#[tokio::test]
async fn too_many_ops_is_refused_before_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let limit = store.max_txn_ops();
    let puts = |n: usize| -> Vec<TxnOp> {
        (0..n)
            .map(|i| TxnOp::Put(PutRequest::new(format!("/t/{i}"), "v")))
            .collect()
    };
    let err = store
        .txn(TxnRequest {
            compare: vec![],
            success: puts(limit + 1),
            failure: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::TooManyOps {
            ops: limit + 1,
            limit
        }
    );
    assert!(err.to_string().contains("--max-txn-ops"), "{err}");
    // Counted before the compares are evaluated: the larger branch counts, taken or not.
    let err = store
        .txn(TxnRequest {
            compare: vec![Compare::version("/t/0", CompareResult::Equal, 0)],
            success: puts(1),
            failure: puts(limit),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooManyOps { .. }), "{err}");
    assert_eq!(store.revision(), 0);
    // Exactly at the limit is fine.
    let resp = store
        .txn(TxnRequest {
            compare: vec![],
            success: puts(limit),
            failure: vec![],
        })
        .await
        .unwrap();
    assert_eq!(resp.revision, 1);
}

#[tokio::test]
async fn compaction_answers_compacted_for_reads_and_watches() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for i in 0..10 {
        store
            .put(PutRequest::new("/c/k", format!("{i}")))
            .await
            .unwrap();
    }
    store.compact(6).await.unwrap();
    let mut old = RangeRequest::key("/c/k");
    old.revision = 3;
    assert_eq!(
        store.range(old).await.unwrap_err(),
        StoreError::Compacted {
            compact_revision: 6
        }
    );
    let err = store
        .watch(WatchRequest {
            range: KeyRange::single("/c/k"),
            start_revision: 2,
            ..Default::default()
        })
        .await
        .err();
    assert_eq!(
        err,
        Some(StoreError::Compacted {
            compact_revision: 6
        })
    );
    // Compaction survives a restart, and the latest value is intact.
    store.close().await;
    let store = open(dir.path()).await;
    let mut at6 = RangeRequest::key("/c/k");
    at6.revision = 6;
    assert_eq!(
        store.range(at6).await.unwrap().kvs[0].value,
        Bytes::from("5")
    );
    assert_eq!(
        store.get(Bytes::from("/c/k")).await.unwrap().unwrap().value,
        Bytes::from("9")
    );
    assert_eq!(store.status().await.unwrap().compact_revision, 6);
}

#[tokio::test]
async fn corrupted_record_stops_startup_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    store
        .put(PutRequest::new("/x", "CORRUPT-ME-0123456789"))
        .await
        .unwrap();
    store.close().await;
    drop(store);
    let path = dir.path().join("state.redb");
    let mut data = std::fs::read(&path).unwrap();
    let needle = b"CORRUPT-ME-0123456789";
    let mut hits = 0;
    let mut i = 0;
    while i + needle.len() <= data.len() {
        if &data[i..i + needle.len()] == needle {
            data[i] ^= 0x20;
            hits += 1;
        }
        i += 1;
    }
    assert!(hits > 0, "value not found in the state file");
    std::fs::write(&path, data).unwrap();
    let err = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .err()
        .expect("must refuse to start");
    let msg = err.to_string();
    assert!(
        msg.contains("state.redb"),
        "message should name the file: {msg}"
    );
}

#[tokio::test]
async fn backup_verify_and_restore_into_a_fresh_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for i in 0..100 {
        store
            .put(PutRequest::new(format!("/b/{i:03}"), format!("v{i}")))
            .await
            .unwrap();
    }
    store
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single("/b/000"),
            prev_kv: false,
        })
        .await
        .unwrap();
    let file = dir.path().join("backup.lbk");
    let backup = store.backup(&file).await.unwrap();
    assert_eq!(backup.key_count(), 99);
    let verified = Backup::read(&file).unwrap();
    assert_eq!(verified.revision, 101);

    let fresh = tempfile::tempdir().unwrap();
    verified.restore_into(fresh.path()).unwrap();
    let restored = open(fresh.path()).await;
    assert_eq!(restored.revision(), 101);
    let all = restored.range(RangeRequest::prefix("/b/")).await.unwrap();
    assert_eq!(all.count, 99);
    assert_eq!(all.kvs[0].value, Bytes::from("v1"));
    // Writes continue from the restored revision.
    assert_eq!(
        restored
            .put(PutRequest::new("/b/new", "x"))
            .await
            .unwrap()
            .revision,
        102
    );

    // A flipped bit in the backup is caught.
    let mut data = std::fs::read(&file).unwrap();
    let n = data.len();
    data[n - 3] ^= 1;
    std::fs::write(&file, data).unwrap();
    assert!(matches!(Backup::read(&file), Err(StoreError::Corrupt(_))));
}

/// A crash after acknowledged writes but before redb's next durable commit: redb comes
/// back at that commit (simulated by putting back the file as it was then) and the
/// write-ahead log must bring back every write after it: puts, a delete, a lease and
/// its key, and a compaction, at the same revisions.
#[tokio::test]
async fn writes_after_the_last_checkpoint_come_back_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    // Opening ends with a durable commit: what a crash rolls redb back to.
    let durable = std::fs::read(dir.path().join("state.redb")).unwrap();
    for i in 0..40 {
        store
            .put(PutRequest::new(format!("/wal/{i}"), format!("v{i}")))
            .await
            .unwrap();
    }
    store
        .delete_range(DeleteRangeRequest {
            range: KeyRange::single("/wal/7"),
            prev_kv: false,
        })
        .await
        .unwrap();
    let lease = store.lease_grant(77, 600).await.unwrap();
    store
        .put(PutRequest {
            lease: lease.id,
            ..PutRequest::new("/wal/leased", "l")
        })
        .await
        .unwrap();
    store.compact(20).await.unwrap();
    let before = store.status().await.unwrap();
    store.close().await;
    drop(store);
    std::fs::write(dir.path().join("state.redb"), durable).unwrap();

    let store = open(dir.path()).await;
    let after = store.status().await.unwrap();
    assert_eq!(after.revision, before.revision);
    assert_eq!(after.compact_revision, 20);
    let all = store.range(RangeRequest::prefix("/wal/")).await.unwrap();
    assert_eq!(
        all.kvs.len(),
        40,
        "39 puts left after the delete, and the leased key"
    );
    assert!(store.get(Bytes::from("/wal/7")).await.unwrap().is_none());
    assert_eq!(
        store
            .get(Bytes::from("/wal/39"))
            .await
            .unwrap()
            .unwrap()
            .value,
        Bytes::from("v39")
    );
    let leases = store.lease_leases().await.unwrap();
    assert!(leases.contains(&77), "{leases:?}");
    let mut old = RangeRequest::key("/wal/3");
    old.revision = 5;
    assert!(matches!(
        store.range(old).await,
        Err(StoreError::Compacted { .. })
    ));
    // Replayed once: a second restart changes nothing.
    store.close().await;
    drop(store);
    let store = open(dir.path()).await;
    assert_eq!(store.status().await.unwrap().revision, before.revision);
}

/// Where the crash test's child process works (set only in that child).
const CRASH_DIR_ENV: &str = "LATTICE_TEST_CRASH_DIR";

/// The crash test's child: concurrent writers whose log passes a checkpoint (12 MiB)
/// while the state file is written behind the answers on its own thread (merging
/// batches), more writes after it, each acknowledged key recorded, then SIGKILL: redb's
/// commits since the checkpoint's durable one are lost with the process (redb keeps a
/// non-durable commit's header in memory), so everything after it must come back from
/// the log, which may only have started over once the checkpoint was durable.
async fn crash_child(dir: std::path::PathBuf) -> ! {
    use std::io::Write;
    let store = open(&dir).await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::File::create(dir.join("acked")).unwrap(),
    ));
    let value = Bytes::from(vec![b'v'; 64 * 1024]);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (store, value, acked) = (store.clone(), value.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let key = format!("/big/{t}/{i}");
                let resp = store
                    .put(PutRequest::new(key.clone(), value.clone()))
                    .await
                    .unwrap();
                writeln!(acked.lock().unwrap(), "{key} {}", resp.revision).unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 320 × 64 KiB = 20 MiB of log records in a file of 16 MiB: still 16 MiB means the
    // log started over (a checkpoint).
    let wal_len = std::fs::metadata(dir.join("wal.log")).unwrap().len();
    writeln!(acked.lock().unwrap(), "wal_len {wal_len}").unwrap();
    for i in 0..50 {
        let key = format!("/after/{i}");
        let resp = store.put(PutRequest::new(key.clone(), "x")).await.unwrap();
        writeln!(acked.lock().unwrap(), "{key} {}", resp.revision).unwrap();
    }
    // SIGKILL, as a crash: no destructor runs, no core file is written (`abort` could).
    let _ = std::process::Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[tokio::test]
async fn a_crash_after_a_checkpoint_keeps_every_acknowledged_write() {
    if let Some(dir) = std::env::var_os(CRASH_DIR_ENV) {
        crash_child(dir.into()).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_crash_after_a_checkpoint_keeps_every_acknowledged_write",
            "--test-threads=1",
        ])
        .env(CRASH_DIR_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child was to be killed");
    let acked = std::fs::read_to_string(dir.path().join("acked")).unwrap();
    let mut keys = std::collections::BTreeMap::new();
    let mut wal_len = None;
    for line in acked.lines() {
        let (key, n) = line.split_once(' ').unwrap();
        let n: i64 = n.parse().unwrap();
        if key == "wal_len" {
            wal_len = Some(n);
        } else {
            keys.insert(key.to_string(), n);
        }
    }
    assert_eq!(keys.len(), 370, "the child did not finish its writes");
    let wal_len = wal_len.unwrap();
    assert!(
        wal_len <= 16 << 20,
        "no checkpoint: the log is {wal_len} bytes"
    );

    let store = open(dir.path()).await;
    let newest = keys.values().copied().max().unwrap();
    assert_eq!(store.status().await.unwrap().revision, newest);
    for (key, rev) in &keys {
        let kv = store
            .get(Bytes::from(key.clone()))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key} (revision {rev}) lost"));
        assert_eq!(kv.mod_revision, *rev, "{key}");
    }
}
