//! A Wing–Gong linearizability checker (with Lowe's memoization of visited
//! (linearized-set, state) configurations) for single-key registers with put / get / cas,
//! run on histories recorded from concurrent clients against a 3-member Raft cluster
//! while the leader is killed, restarted, and the next leader killed.
//!
//! Linearizability is local (Herlihy & Wing), so a history over several keys is checked
//! key by key. An operation whose outcome is unknown (the client got an error) may take
//! effect at any point after its invocation, or never; its result is not constrained.

mod raft_common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lattice_store::*;
use raft_common::Cluster;
use rand::Rng;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Op {
    Put(u32),
    Get,
    /// Compare-and-swap: expected value, new value.
    Cas(u32, u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// Put acknowledged.
    Ok,
    /// Get result.
    Value(Option<u32>),
    /// Cas result.
    Swapped(bool),
    /// Error: may or may not have taken effect.
    Unknown,
}

#[derive(Clone, Debug)]
struct Call {
    op: Op,
    invoke: u64,
    /// `u64::MAX` for an unknown outcome.
    complete: u64,
    outcome: Outcome,
}

type State = Option<u32>;

/// Apply `op` to `state`; `None` if the recorded outcome is impossible from `state`.
fn step(state: State, call: &Call) -> Option<State> {
    let unknown = call.outcome == Outcome::Unknown;
    match (&call.op, &call.outcome) {
        (Op::Put(v), _) => Some(Some(*v)),
        (Op::Get, Outcome::Value(v)) => (*v == state).then_some(state),
        (Op::Get, _) => Some(state),
        (Op::Cas(exp, new), outcome) => {
            let swaps = state == Some(*exp);
            if unknown {
                return Some(if swaps { Some(*new) } else { state });
            }
            match outcome {
                Outcome::Swapped(true) if swaps => Some(Some(*new)),
                Outcome::Swapped(false) if !swaps => Some(state),
                _ => None,
            }
        }
    }
}

/// Is the single-register history linearizable?
fn linearizable(history: &[Call]) -> bool {
    let n = history.len();
    let words = n.div_ceil(64).max(1);
    let mut done = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    search(history, &mut done, None, &mut seen)
}

fn is_done(done: &[u64], i: usize) -> bool {
    done[i / 64] & (1 << (i % 64)) != 0
}

fn search(
    h: &[Call],
    done: &mut Vec<u64>,
    state: State,
    seen: &mut HashSet<(Vec<u64>, State)>,
) -> bool {
    // Finished when every operation with a known outcome is linearized (unknown ones may
    // never have happened).
    let pending: Vec<usize> = (0..h.len()).filter(|&i| !is_done(done, i)).collect();
    if pending.iter().all(|&i| h[i].outcome == Outcome::Unknown) {
        return true;
    }
    if !seen.insert((done.clone(), state)) {
        return false;
    }
    // Candidates: pending operations invoked before every pending operation completed.
    let min_complete = pending
        .iter()
        .map(|&i| h[i].complete)
        .min()
        .unwrap_or(u64::MAX);
    for &i in &pending {
        if h[i].invoke > min_complete {
            continue;
        }
        if let Some(next) = step(state, &h[i]) {
            done[i / 64] |= 1 << (i % 64);
            if search(h, done, next, seen) {
                return true;
            }
            done[i / 64] &= !(1 << (i % 64));
        }
    }
    false
}

fn call(op: Op, invoke: u64, complete: u64, outcome: Outcome) -> Call {
    Call {
        op,
        invoke,
        complete,
        outcome,
    }
}

#[test]
fn checker_accepts_and_rejects_known_histories() {
    use Outcome::*;
    // Concurrent put and get: the get may see either value.
    let ok = vec![
        call(Op::Put(1), 0, 10, Ok),
        call(Op::Put(2), 5, 15, Ok),
        call(Op::Get, 12, 20, Value(Some(1))),
        call(Op::Get, 21, 22, Value(Some(1))),
    ];
    assert!(linearizable(&ok));
    // A stale read after a completed put is not linearizable.
    let stale = vec![
        call(Op::Put(1), 0, 1, Ok),
        call(Op::Put(2), 2, 3, Ok),
        call(Op::Get, 4, 5, Value(Some(1))),
    ];
    assert!(!linearizable(&stale));
    // Two successful cas from the same expected value: impossible.
    let double = vec![
        call(Op::Put(0), 0, 1, Ok),
        call(Op::Cas(0, 1), 2, 10, Swapped(true)),
        call(Op::Cas(0, 2), 2, 10, Swapped(true)),
    ];
    assert!(!linearizable(&double));
    // An unknown put may explain a later read, or may never have happened.
    let maybe = vec![
        call(Op::Put(7), 0, u64::MAX, Unknown),
        call(Op::Get, 5, 6, Value(Some(7))),
    ];
    assert!(linearizable(&maybe));
    let never = vec![
        call(Op::Put(7), 0, u64::MAX, Unknown),
        call(Op::Get, 5, 6, Value(None)),
    ];
    assert!(linearizable(&never));
    // A read of a value nobody wrote.
    let invented = vec![
        call(Op::Put(1), 0, 1, Ok),
        call(Op::Get, 2, 3, Value(Some(9))),
    ];
    assert!(!linearizable(&invented));
}

fn parse(v: &[u8]) -> Option<u32> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

async fn run(node: &raft::RaftStore, key: &str, op: &Op) -> Outcome {
    match op {
        Op::Put(v) => match node
            .put(PutRequest::new(key.to_owned(), v.to_string()))
            .await
        {
            Ok(_) => Outcome::Ok,
            Err(_) => Outcome::Unknown,
        },
        Op::Get => match node.range(RangeRequest::key(key.to_owned())).await {
            Ok(r) => Outcome::Value(r.kvs.first().and_then(|kv| parse(&kv.value))),
            Err(_) => Outcome::Unknown,
        },
        Op::Cas(exp, new) => {
            let req = TxnRequest {
                compare: vec![Compare::value(
                    key.to_owned(),
                    CompareResult::Equal,
                    exp.to_string(),
                )],
                success: vec![TxnOp::Put(PutRequest::new(key.to_owned(), new.to_string()))],
                failure: vec![],
            };
            match node.txn(req).await {
                Ok(r) => Outcome::Swapped(r.succeeded),
                Err(_) => Outcome::Unknown,
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Shut the leader down, restart it later, then shut the next leader down.
    Kill,
    /// Cut the leader off the network (it keeps running and serving its clients), heal,
    /// then cut the next leader off.
    Partition,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_leader_failure_are_linearizable() {
    check_under(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_leader_partition_are_linearizable() {
    check_under(Fault::Partition).await;
}

async fn check_under(fault: Fault) {
    const KEYS: [&str; 3] = ["/lin/a", "/lin/b", "/lin/c"];
    const CLIENTS: usize = 6;
    const MAX_OPS: usize = 150;
    let mut c = Cluster::start(3, raft_common::no_tune).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let nodes: Arc<Mutex<Vec<Option<raft::RaftStore>>>> = Arc::new(Mutex::new(c.nodes.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let history: Arc<Mutex<Vec<(usize, Call)>>> = Arc::default();
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let nodes = nodes.clone();
        let history = history.clone();
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let mut target = client % 3;
            // Last value this client saw per key: what its cas expects.
            let mut last_seen = [0u32; KEYS.len()];
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < MAX_OPS {
                i += 1;
                let Some(node) = nodes.lock().unwrap()[target].clone() else {
                    target = (target + 1) % 3;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let (key, op) = {
                    let mut rng = rand::thread_rng();
                    let key = rng.gen_range(0..KEYS.len());
                    let v = (client * 10_000 + i) as u32;
                    let op = match rng.gen_range(0..10) {
                        0..=3 => Op::Get,
                        4..=6 => Op::Put(v),
                        _ => Op::Cas(last_seen[key], v),
                    };
                    (key, op)
                };
                let invoke = epoch.elapsed().as_micros() as u64;
                let outcome = run(&node, KEYS[key], &op).await;
                let complete = if outcome == Outcome::Unknown {
                    u64::MAX
                } else {
                    epoch.elapsed().as_micros() as u64
                };
                match (&op, &outcome) {
                    (_, Outcome::Unknown) => target = (target + 1) % 3,
                    (Op::Get, Outcome::Value(Some(v))) => last_seen[key] = *v,
                    (Op::Put(v), _) | (Op::Cas(_, v), Outcome::Swapped(true)) => {
                        last_seen[key] = *v
                    }
                    _ => {}
                }
                // A failed read constrains nothing.
                if !(op == Op::Get && outcome == Outcome::Unknown) {
                    history.lock().unwrap().push((
                        key,
                        Call {
                            op,
                            invoke,
                            complete,
                            outcome,
                        },
                    ));
                }
                let pause = rand::thread_rng().gen_range(0..20);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    }
    // Fault the leader, repair, then fault the next leader.
    let mut victim = leader;
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        match fault {
            Fault::Kill => {
                nodes.lock().unwrap()[victim] = None;
                c.stop(victim).await;
            }
            Fault::Partition => c.node(victim).network().set_partitioned(true),
        }
        // The majority elects a new leader (the cut-off one may still think it leads).
        let deadline = Instant::now() + Duration::from_secs(10);
        let next = loop {
            let leaders: Vec<usize> = (0..3)
                .filter(|&i| i != victim)
                .filter(|&i| c.nodes[i].as_ref().is_some_and(|n| n.is_leader()))
                .collect();
            if let Some(l) = leaders.first() {
                break *l;
            }
            assert!(Instant::now() < deadline, "no new leader in round {round}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        eprintln!(
            "round {round}: {fault:?} member {}, member {} leads",
            victim + 1,
            next + 1
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
        match fault {
            Fault::Kill => {
                c.restart(victim).await;
                nodes.lock().unwrap()[victim] = c.nodes[victim].clone();
            }
            Fault::Partition => c.node(victim).network().set_partitioned(false),
        }
        let rev = c.node(next).revision();
        c.wait_revision(victim, rev, Duration::from_secs(10)).await;
        victim = c.wait_leader(Duration::from_secs(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for cl in clients {
        cl.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let unknown = history
        .iter()
        .filter(|(_, c)| c.outcome == Outcome::Unknown)
        .count();
    let swapped = history
        .iter()
        .filter(|(_, c)| c.outcome == Outcome::Swapped(true))
        .count();
    eprintln!(
        "{} operations recorded, {unknown} with unknown outcome, {swapped} successful cas",
        history.len()
    );
    for (k, key) in KEYS.iter().enumerate() {
        let mut calls: Vec<Call> = history
            .iter()
            .filter(|(kk, _)| *kk == k)
            .map(|(_, c)| c.clone())
            .collect();
        calls.sort_by_key(|c| c.invoke);
        assert!(
            linearizable(&calls),
            "history of {key} is not linearizable: {calls:#?}"
        );
    }
    c.shutdown_all().await;
}
