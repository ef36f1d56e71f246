//! Property tests: random sequences of puts, deletes, guarded transactions and
//! compactions against a deliberately simple model (a full copy of the key space per
//! revision). Checked after every step: reads at the latest and at every past revision,
//! compaction errors, and watch replays from arbitrary revisions. The durable store is
//! then reopened from disk and must answer identically.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::StreamExt;
use lattice_store::mvcc::{Command, Limits, Mvcc};
use lattice_store::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u8),
    Delete(u8),
    DeletePrefix(u8),
    CasVersion(u8, i64, u8),
    Compact(u8),
}

fn key(k: u8) -> Bytes {
    Bytes::from(format!("k{}/{}", k % 3, k))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0u8..12).prop_map(Op::Delete),
        1 => (0u8..3).prop_map(Op::DeletePrefix),
        2 => (0u8..12, 0i64..4, any::<u8>()).prop_map(|(k, ver, v)| Op::CasVersion(k, ver, v)),
        1 => any::<u8>().prop_map(Op::Compact),
    ]
}

/// The model: the whole key space at every revision.
#[derive(Default)]
struct Model {
    states: Vec<BTreeMap<Bytes, KeyValue>>, // index = revision
    compact: i64,
}

impl Model {
    fn new() -> Self {
        Model {
            states: vec![BTreeMap::new()],
            compact: 0,
        }
    }
    fn rev(&self) -> i64 {
        self.states.len() as i64 - 1
    }
    fn latest(&self) -> &BTreeMap<Bytes, KeyValue> {
        &self.states[self.states.len() - 1]
    }
    fn commit(&mut self, next: BTreeMap<Bytes, KeyValue>) {
        self.states.push(next);
    }
    fn put(&self, state: &mut BTreeMap<Bytes, KeyValue>, k: Bytes, v: Bytes, rev: i64) {
        let prev = state.get(&k).cloned();
        state.insert(
            k.clone(),
            KeyValue {
                key: k,
                value: v,
                create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                mod_revision: rev,
                version: prev.map_or(1, |p| p.version + 1),
                lease: 0,
            },
        );
    }
}

fn command(op: &Op, model: &Model) -> Command {
    match op {
        Op::Put(k, v) => Command::Txn(TxnRequest {
            success: vec![TxnOp::Put(PutRequest::new(key(*k), vec![*v]))],
            ..Default::default()
        }),
        Op::Delete(k) => Command::Txn(TxnRequest {
            success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single(key(*k)),
                prev_kv: true,
            })],
            ..Default::default()
        }),
        Op::DeletePrefix(p) => Command::Txn(TxnRequest {
            success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::prefix(format!("k{p}/")),
                prev_kv: false,
            })],
            ..Default::default()
        }),
        Op::CasVersion(k, ver, v) => Command::Txn(TxnRequest {
            compare: vec![Compare::version(key(*k), CompareResult::Equal, *ver)],
            success: vec![TxnOp::Put(PutRequest::new(key(*k), vec![*v]))],
            failure: vec![TxnOp::Range(RangeRequest::key(key(*k)))],
        }),
        Op::Compact(r) => {
            let span = (model.rev() - model.compact).max(1);
            Command::Compact {
                revision: model.compact + 1 + (*r as i64 % span),
            }
        }
    }
}

/// Apply `op` to the model; returns whether it should succeed.
fn model_apply(op: &Op, cmd: &Command, model: &mut Model) -> bool {
    let rev = model.rev() + 1;
    let mut next = model.latest().clone();
    match op {
        Op::Put(k, v) => {
            model.put(&mut next, key(*k), Bytes::from(vec![*v]), rev);
            model.commit(next);
        }
        Op::Delete(k) => {
            if next.remove(&key(*k)).is_some() {
                model.commit(next);
            }
        }
        Op::DeletePrefix(p) => {
            let before = next.len();
            let prefix = format!("k{p}/");
            next.retain(|k, _| !k.starts_with(prefix.as_bytes()));
            if next.len() != before {
                model.commit(next);
            }
        }
        Op::CasVersion(k, ver, v) => {
            let cur = next.get(&key(*k)).map_or(0, |kv| kv.version);
            if cur == *ver {
                model.put(&mut next, key(*k), Bytes::from(vec![*v]), rev);
                model.commit(next);
            }
        }
        Op::Compact(_) => {
            let Command::Compact { revision } = cmd else {
                unreachable!()
            };
            if *revision > model.rev() || *revision <= model.compact {
                return false;
            }
            model.compact = *revision;
        }
    }
    true
}

fn check_reads(m: &Mvcc, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(m.revision(), model.rev());
    // Revision 0 means "latest" (etcd), so past reads start at 1.
    for rev in 1..=model.rev() {
        let req = RangeRequest {
            range: KeyRange::between("\0", "\0"),
            revision: rev,
            ..Default::default()
        };
        let got = m.range(&req, i64::MAX);
        if rev < model.compact {
            prop_assert!(
                matches!(got, Err(StoreError::Compacted { .. })),
                "rev {} should be compacted",
                rev
            );
            continue;
        }
        let got = got.map_err(|e| TestCaseError::fail(format!("read at {rev}: {e}")))?;
        let want: Vec<KeyValue> = model.states[rev as usize].values().cloned().collect();
        prop_assert_eq!(&got.kvs, &want, "read at revision {}", rev);
        prop_assert_eq!(got.count as usize, want.len());
    }
    // Limit and count.
    let req = RangeRequest {
        range: KeyRange::between("\0", "\0"),
        limit: 2,
        ..Default::default()
    };
    let got = m
        .range(&req, i64::MAX)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(got.count as usize, model.latest().len());
    prop_assert_eq!(got.more, model.latest().len() > 2);
    Ok(())
}

/// Replay history from `from` and check it rebuilds the model's state at every revision.
fn check_replay(m: &Mvcc, model: &Model, from: i64) -> Result<(), TestCaseError> {
    let from = from.max(model.compact.max(1));
    if from > model.rev() {
        return Ok(());
    }
    let events = m
        .events_between(from, model.rev())
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut state = model.states[(from - 1) as usize].clone();
    for (rev, evs) in events {
        for e in evs.iter() {
            prop_assert_eq!(
                e.prev_kv.as_ref(),
                state.get(&e.kv.key),
                "prev_kv at {}",
                rev
            );
            match e.kind {
                EventType::Put => {
                    state.insert(e.kv.key.clone(), e.kv.clone());
                }
                EventType::Delete => {
                    state.remove(&e.kv.key);
                }
            }
        }
        prop_assert_eq!(
            &state,
            &model.states[rev as usize],
            "state after replaying {}",
            rev
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_model(ops in proptest::collection::vec(op(), 1..60), replay_from in 1i64..30) {
        let mut m = Mvcc::new();
        let mut model = Model::new();
        let limits = Limits::default();
        for op in &ops {
            let cmd = command(op, &model);
            let ok = model_apply(op, &cmd, &mut model);
            let res = m.apply(&cmd, &limits);
            prop_assert_eq!(res.is_ok(), ok, "op {:?} -> {:?}", op, res.err());
            check_reads(&m, &model)?;
        }
        check_replay(&m, &model, replay_from)?;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// The durable store answers like the model, keeps every acknowledged write across
    /// a reopen, and a watch from revision 1 replays exactly the model's history.
    #[test]
    fn durable_store_matches_model_across_reopen(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = runtime();
        rt.block_on(async {
            let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let store = EmbeddedStore::open(dir.path(), StoreConfig::default()).await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut model = Model::new();
            for op in &ops {
                let cmd = command(op, &model);
                let ok = model_apply(op, &cmd, &mut model);
                let res = store.propose(cmd).await;
                prop_assert_eq!(res.is_ok(), ok, "op {:?}", op);
            }
            store.close().await;
            drop(store);
            let store = EmbeddedStore::open(dir.path(), StoreConfig::default()).await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(store.revision(), model.rev());
            let all = store.range(RangeRequest { range: KeyRange::between("\0", "\0"), ..Default::default() }).await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want: Vec<KeyValue> = model.latest().values().cloned().collect();
            prop_assert_eq!(all.kvs, want);
            if model.rev() > model.compact {
                let start = model.compact + 1;
                let mut w = store.watch(WatchRequest { range: KeyRange::between("\0", "\0"), start_revision: start, prev_kv: true, ..Default::default() }).await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut state = model.states[(start - 1) as usize].clone();
                let mut seen_rev = start - 1;
                while seen_rev < model.rev() {
                    let batch = tokio::time::timeout(std::time::Duration::from_secs(5), w.next()).await
                        .map_err(|_| TestCaseError::fail("watch replay stalled"))?
                        .ok_or_else(|| TestCaseError::fail("watch ended"))?
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    for e in batch.events {
                        prop_assert!(e.kv.mod_revision >= seen_rev);
                        if e.kv.mod_revision > seen_rev {
                            // Revision boundary: state so far must equal the model's.
                            prop_assert_eq!(&state, &model.states[seen_rev as usize]);
                            seen_rev = e.kv.mod_revision;
                        }
                        match e.kind {
                            EventType::Put => { state.insert(e.kv.key.clone(), e.kv.clone()); }
                            EventType::Delete => { state.remove(&e.kv.key); }
                        }
                    }
                    if batch.revision >= model.rev() { break; }
                }
                prop_assert_eq!(&state, model.latest());
            }
            store.close().await;
            Ok(())
        })?;
    }
}
