//! openraft's own storage conformance suite (`openraft::testing::Suite`) run against the
//! redb log store and the MVCC state machine, plus durability checks of our own.

use lattice_store::raft::{open_storage, LogStore, StateMachine, TypeConfig};
use lattice_store::Limits;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, Vote};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, sm) = open_storage(dir.path(), Limits::default()).expect("open storage");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).expect("storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vote_and_log_survive_reopen() {
    use openraft::testing::blank_ent;
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm) = open_storage(dir.path(), Limits::default()).unwrap();
        log.save_vote(&Vote::new(3, 2)).await.unwrap();
        let entries = (1..=5)
            .map(|i| blank_ent::<TypeConfig>(3, 2, i))
            .collect::<Vec<_>>();
        // append() needs openraft's flush callback, which only openraft can build: go
        // through the extension helper that waits for it.
        use openraft::storage::RaftLogStorageExt;
        log.blocking_append(entries).await.unwrap();
        log.purge(openraft::testing::log_id(3, 2, 2)).await.unwrap();
        log.close();
        _sm.close();
    }
    let (mut log, mut sm) = open_storage(dir.path(), Limits::default()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(2));
    assert_eq!(state.last_log_id.map(|l| l.index), Some(5));
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied, None);
}

fn normal(index: u64, commands: Vec<lattice_store::mvcc::Command>) -> openraft::Entry<TypeConfig> {
    openraft::Entry {
        log_id: openraft::testing::log_id(1, 1, index),
        payload: openraft::EntryPayload::Normal(lattice_store::raft::Proposal { commands }),
    }
}

fn put(k: &str, v: &str) -> lattice_store::mvcc::Command {
    use lattice_store::*;
    lattice_store::mvcc::Command::Txn(TxnRequest {
        success: vec![TxnOp::Put(PutRequest::new(k.to_owned(), v.to_owned()))],
        ..Default::default()
    })
}

/// Read `key` through the state machine itself (a read-only txn entry).
async fn read(sm: &mut StateMachine, index: u64, key: &str) -> Option<String> {
    use lattice_store::mvcc::{Command, CommandResponse};
    use lattice_store::raft::RaftResponse;
    use lattice_store::*;
    let cmd = Command::Txn(TxnRequest {
        success: vec![TxnOp::Range(RangeRequest::key(key.to_owned()))],
        ..Default::default()
    });
    let out = sm.apply(vec![normal(index, vec![cmd])]).await.unwrap();
    match &out[0] {
        RaftResponse::Commands(r) => match &r[0] {
            Ok(CommandResponse::Txn(t)) => match &t.responses[0] {
                TxnOpResponse::Range(rr) => rr
                    .kvs
                    .first()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_is_durable_idempotent_and_snapshots_round_trip() {
    use lattice_store::raft::RaftResponse;
    use openraft::storage::RaftSnapshotBuilder;
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, mut sm) = open_storage(dir.path(), Limits::default()).unwrap();
        let out = sm
            .apply(vec![
                normal(1, vec![put("/a", "1"), put("/b", "2")]),
                normal(2, vec![put("/a", "3")]),
            ])
            .await
            .unwrap();
        assert_eq!(out.len(), 2);
        log.close();
        sm.close();
    }
    let (log, mut sm) = open_storage(dir.path(), Limits::default()).unwrap();
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(2));
    // Re-applying entries already durable is a no-op.
    let out = sm
        .apply(vec![normal(2, vec![put("/a", "again")])])
        .await
        .unwrap();
    assert_eq!(out, vec![RaftResponse::Skipped]);
    assert_eq!(read(&mut sm, 3, "/a").await, Some("3".into()));

    // Snapshot → install into a fresh member.
    let snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(3));
    let dir2 = tempfile::tempdir().unwrap();
    {
        let (log2, mut sm2) = open_storage(dir2.path(), Limits::default()).unwrap();
        let mut data = sm2.begin_receiving_snapshot().await.unwrap();
        *data = std::io::Cursor::new(snap.snapshot.into_inner());
        sm2.install_snapshot(&snap.meta, data).await.unwrap();
        assert_eq!(
            sm2.applied_state().await.unwrap().0.map(|l| l.index),
            Some(3)
        );
        log2.close();
        sm2.close();
    }
    let (_log2, mut sm2) = open_storage(dir2.path(), Limits::default()).unwrap();
    assert_eq!(
        sm2.applied_state().await.unwrap().0.map(|l| l.index),
        Some(3)
    );
    assert_eq!(read(&mut sm2, 4, "/b").await, Some("2".into()));
    assert_eq!(read(&mut sm2, 5, "/a").await, Some("3".into()));
    log.close();
    sm.close();
}

/// A crash image: `raft-log.redb` as of its last durable commit (the vote), the
/// write-ahead log as of later appends. Opening it inserts the appends again; damage to a
/// record before a valid later one stops the start with an error naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_after_the_last_checkpoint_come_back_from_the_write_ahead_log() {
    use lattice_store::raft::{LOG_FILE, LOG_WAL_FILE};
    use openraft::storage::{RaftLogReader, RaftLogStorageExt};
    use openraft::testing::blank_ent;
    let dir = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let (mut log, sm) = open_storage(dir.path(), Limits::default()).unwrap();
    log.save_vote(&Vote::new(4, 1)).await.unwrap();
    std::fs::copy(dir.path().join(LOG_FILE), image.path().join(LOG_FILE)).unwrap();
    // Two groups: two log records.
    let ents = |r: std::ops::RangeInclusive<u64>| {
        r.map(|i| normal(i, vec![put(&format!("/k{i}"), &format!("v{i}"))]))
            .collect::<Vec<_>>()
    };
    log.blocking_append(ents(1..=3)).await.unwrap();
    log.blocking_append(vec![blank_ent::<TypeConfig>(4, 1, 4)])
        .await
        .unwrap();
    std::fs::copy(
        dir.path().join(LOG_WAL_FILE),
        image.path().join(LOG_WAL_FILE),
    )
    .unwrap();
    log.close();
    sm.close();

    let damaged = tempfile::tempdir().unwrap();
    for f in [LOG_FILE, LOG_WAL_FILE] {
        std::fs::copy(image.path().join(f), damaged.path().join(f)).unwrap();
    }

    for _ in 0..2 {
        // Twice: the second start finds everything in raft-log.redb already.
        let (mut log, sm) = open_storage(image.path(), Limits::default()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(4));
        let got = log.try_get_log_entries(1..=4).await.unwrap();
        let mut want = ents(1..=3);
        want.push(blank_ent::<TypeConfig>(4, 1, 4));
        assert_eq!(got, want);
        log.close();
        sm.close();
    }

    // Damage the first record's payload (its header is 16 bytes; the second record is
    // intact): the start fails and names the log file.
    let wal = damaged.path().join(LOG_WAL_FILE);
    let mut bytes = std::fs::read(&wal).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&wal, bytes).unwrap();
    let err = match open_storage(damaged.path(), Limits::default()) {
        Ok(_) => panic!("a damaged raft log opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(LOG_WAL_FILE), "{err}");
}
