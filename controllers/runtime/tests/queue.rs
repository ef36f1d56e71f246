//! Work-queue properties: no key runs concurrently with itself, triggers are
//! de-duplicated, every trigger is followed by a run, concurrency is capped, and the
//! per-key backoff grows, caps and resets on success.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lattice_runtime::scheduler::{Outcome, QueueConfig, WorkQueue};
use lattice_runtime::Backoff;
use proptest::prelude::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime")
}

fn fast(min_us: u64, max_us: u64) -> Backoff {
    Backoff {
        min: Duration::from_micros(min_us),
        max: Duration::from_micros(max_us),
        factor: 2.0,
        jitter: 0.0,
        reset_after: Duration::from_secs(60),
    }
}

#[derive(Default)]
struct Log {
    running: Mutex<HashSet<u8>>,
    overlaps: AtomicUsize,
    max_parallel: AtomicUsize,
    runs: AtomicUsize,
    clock: AtomicU64,
    /// key → logical time of each run start.
    starts: Mutex<HashMap<u8, Vec<u64>>>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn exclusive_deduplicated_complete_and_capped(
        adds in proptest::collection::vec((0u8..6, 0u8..4, 0u8..5), 1..80),
        concurrency in 1usize..4,
    ) {
        let rt = rt();
        let (log, last_add, n_adds) = rt.block_on(async move {
            let q = WorkQueue::<u8>::new(QueueConfig { concurrency, backoff: fast(100, 1000) });
            let log = Arc::new(Log::default());
            let runner = {
                let (q, log) = (q.clone(), log.clone());
                tokio::spawn(async move {
                    while let Some(t) = q.next().await {
                        let (q, log) = (q.clone(), log.clone());
                        tokio::spawn(async move {
                            let key = t.key;
                            if !log.running.lock().unwrap().insert(key) {
                                log.overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            let n = log.running.lock().unwrap().len();
                            log.max_parallel.fetch_max(n, Ordering::SeqCst);
                            let at = log.clock.fetch_add(1, Ordering::SeqCst);
                            log.starts.lock().unwrap().entry(key).or_default().push(at);
                            log.runs.fetch_add(1, Ordering::SeqCst);
                            for _ in 0..(key % 3) { tokio::task::yield_now().await; }
                            tokio::time::sleep(Duration::from_micros(50 * u64::from(key % 2))).await;
                            log.running.lock().unwrap().remove(&key);
                            q.done(&key, Outcome::Success { requeue_after: None });
                        });
                    }
                })
            };
            let mut last_add = HashMap::new();
            for (key, yields, sleep_us) in &adds {
                let at = log.clock.fetch_add(1, Ordering::SeqCst);
                q.add(*key);
                last_add.insert(*key, at);
                for _ in 0..*yields { tokio::task::yield_now().await; }
                if *sleep_us > 0 {
                    tokio::time::sleep(Duration::from_micros(20 * u64::from(*sleep_us))).await;
                }
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while !(q.is_empty() && q.running() == 0) {
                assert!(Instant::now() < deadline, "queue drains");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            q.close();
            let _ = runner.await;
            (log, last_add, adds.len())
        });
        prop_assert_eq!(log.overlaps.load(Ordering::SeqCst), 0, "a key ran concurrently with itself");
        prop_assert!(log.max_parallel.load(Ordering::SeqCst) <= concurrency);
        prop_assert!(log.runs.load(Ordering::SeqCst) <= n_adds, "more runs than triggers");
        let starts = log.starts.lock().unwrap();
        for (key, added) in last_add {
            let last_start = starts.get(&key).and_then(|s| s.iter().max().copied());
            prop_assert!(last_start.is_some_and(|s| s > added), "key {} triggered at {} but not run after", key, added);
        }
    }

    #[test]
    fn backoff_grows_caps_and_resets(failures in 1u32..10, key in 0u8..10) {
        let rt = rt();
        let b = fast(200, 3200);
        rt.block_on(async move {
            let q = WorkQueue::<u8>::new(QueueConfig { concurrency: 1, backoff: b });
            q.add(key);
            let mut delays = Vec::new();
            for i in 0..failures {
                let t = q.next().await.expect("open");
                assert_eq!(t.failures, i, "the attempt count is visible");
                let d = q.done(&key, Outcome::Failure { retry_after: None }).expect("retried");
                delays.push(d);
            }
            for (i, d) in delays.iter().enumerate() {
                let want = b.base_delay(i as u32 + 1);
                assert!(*d <= want && *d + Duration::from_micros(500) >= want, "failure {}: {:?} vs {:?}", i + 1, d, want);
            }
            assert!(delays.windows(2).all(|w| w[1] + Duration::from_micros(500) >= w[0]));
            assert_eq!(q.failures(&key), failures);
            let t = q.next().await.expect("open");
            assert_eq!(t.failures, failures);
            q.done(&key, Outcome::Success { requeue_after: None });
            assert_eq!(q.failures(&key), 0, "success resets");
            q.add(key);
            q.next().await.expect("open");
            let d = q.done(&key, Outcome::Failure { retry_after: None }).expect("retried");
            assert!(d <= b.min + Duration::from_micros(100), "restarts from min: {d:?}");
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Keys come out in order of their earliest due time; re-adding a key with a later
    /// time never delays it, with an earlier time moves it forward.
    #[test]
    fn requeue_ordering_by_earliest_due_time(adds in proptest::collection::vec((0u8..8, 0u64..8), 1..24)) {
        let rt = rt();
        let popped = rt.block_on(async {
            let q = WorkQueue::<u8>::new(QueueConfig { concurrency: 0, backoff: fast(100, 1000) });
            for (key, slot) in &adds {
                // 4 ms apart: far more than the time the adds take.
                q.add_after(*key, Duration::from_millis(4 * slot));
            }
            let mut out = Vec::new();
            while !q.is_empty() {
                out.push(q.next().await.expect("open").key);
            }
            out
        });
        let mut due: HashMap<u8, u64> = HashMap::new();
        for (key, slot) in &adds {
            let e = due.entry(*key).or_insert(*slot);
            *e = (*e).min(*slot);
        }
        prop_assert_eq!(popped.len(), due.len(), "each key once");
        let slots: Vec<u64> = popped.iter().map(|k| due[k]).collect();
        prop_assert!(slots.windows(2).all(|w| w[0] <= w[1]), "out of order: {:?}", slots);
    }
}

#[tokio::test]
async fn burst_of_triggers_runs_once() {
    let q = WorkQueue::<&str>::new(QueueConfig::default());
    for _ in 0..100 {
        q.add("a");
    }
    assert_eq!(q.len(), 1);
    let t = q.next().await.unwrap();
    assert_eq!(t.key, "a");
    assert!(q.is_empty());
    q.done(
        &"a",
        Outcome::Success {
            requeue_after: None,
        },
    );
    assert!(q.is_empty());
}

#[tokio::test]
async fn triggers_during_backoff_wait_for_it() {
    let b = Backoff {
        min: Duration::from_millis(80),
        ..fast(80_000, 1_000_000)
    };
    let q = WorkQueue::<&str>::new(QueueConfig {
        concurrency: 1,
        backoff: b,
    });
    q.add("a");
    q.next().await.unwrap();
    q.add("a"); // while running
    let start = Instant::now();
    q.done(&"a", Outcome::Failure { retry_after: None });
    q.add("a"); // during the backoff
    let t = q.next().await.unwrap();
    assert_eq!(t.failures, 1);
    assert!(
        start.elapsed() >= Duration::from_millis(75),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn requeue_after_and_earliest_due_time_wins() {
    let q = WorkQueue::<&str>::new(QueueConfig::default());
    q.add_after("late", Duration::from_millis(200));
    q.add_after("soon", Duration::from_millis(20));
    q.add_after("late", Duration::from_millis(40)); // moves earlier
    let start = Instant::now();
    assert_eq!(q.next().await.unwrap().key, "soon");
    assert_eq!(q.next().await.unwrap().key, "late");
    assert!(
        start.elapsed() < Duration::from_millis(195),
        "moved earlier"
    );
    let d = q.done(
        &"soon",
        Outcome::Success {
            requeue_after: Some(Duration::from_millis(30)),
        },
    );
    assert!(d.is_some());
    let t0 = Instant::now();
    assert_eq!(q.next().await.unwrap().key, "soon");
    assert!(t0.elapsed() >= Duration::from_millis(25));
}

#[tokio::test]
async fn close_ends_next() {
    let q = WorkQueue::<u8>::new(QueueConfig::default());
    let q2 = q.clone();
    let h = tokio::spawn(async move { q2.next().await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    q.close();
    assert!(h.await.unwrap().is_none());
}
