//! Runtime benchmark (run by `hack/bench-runtime.sh`): a real API server over an
//! embedded store in a temp dir, a controller using the **HTTP transport**, and:
//!
//! * `event_to_reconcile_p50_ms` / `_p99_ms`: N objects, R changes/s for S seconds;
//!   from the moment the write is acknowledged (committed) to the reconcile that sees
//!   it (0 when the reconcile came first);
//! * `send_to_reconcile_p50_ms` / `_p99_ms`: the same from the moment the change was
//!   sent, so including the write itself (and any queueing at the store);
//! * `noop_reconciles_per_s`: a no-op controller reconciling all N objects at once.
//!
//! Environment: `BENCH_OBJECTS` (10000), `BENCH_RATE` (1000), `BENCH_SECONDS` (5).
//! Prints `RESULT name=value` lines.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use lattice_apis::Allocation;
use lattice_apiserver::{ApiConfig, ApiServer};
use lattice_runtime::{
    Action, Api, Client, Controller, InformerFactory, Patch, PatchParams, PostParams, ResourceExt,
};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::json;

const SENT: &str = "bench.lattice.dev/sent";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[derive(Default)]
struct Ctx {
    reconciles: AtomicUsize,
    seen: Mutex<HashSet<(String, String)>>,
    /// (sent micros, reconciled micros) of each change's first reconcile.
    reconciled: Mutex<HashMap<(String, String), u64>>,
}

async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, std::convert::Infallible> {
    ctx.reconciles.fetch_add(1, Ordering::Relaxed);
    if let Some(sent) = a.metadata.annotations.get(SENT) {
        let key = (a.name_any().to_string(), sent.clone());
        let first = ctx.seen.lock().map(|mut s| s.insert(key)).unwrap_or(false);
        if first {
            let now = now_micros();
            if let Ok(mut r) = ctx.reconciled.lock() {
                r.insert((a.name_any().to_string(), sent.clone()), now);
            }
        }
    }
    Ok(Action::await_change())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn allocation(i: u64) -> Allocation {
    serde_json::from_value(json!({
        "metadata": {"name": format!("bench-{i:06}"), "namespace": "bench"},
        "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}
    }))
    .expect("allocation")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env_or("BENCH_OBJECTS", 10_000);
    let rate = env_or("BENCH_RATE", 1_000).max(1);
    let secs = env_or("BENCH_SECONDS", 5);

    let dir = tempfile::tempdir()?;
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default()).await?;
    let backend: Arc<dyn KvBackend> = Arc::new(store);
    let server = ApiServer::new(backend, ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(server.serve(listener, std::future::pending()));
    let client = Client::http(&base, None)?;
    let api: Api<Allocation> = Api::namespaced(client.clone(), "bench");

    eprintln!("==> creating {n} allocations");
    let t = Instant::now();
    let created = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &allocation(i)).await }
        })
        .buffer_unordered(64)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await;
    eprintln!("    {created} created in {:.1}s", t.elapsed().as_secs_f64());

    let ctx = Arc::new(Ctx::default());
    let factory = InformerFactory::new(client.clone());
    let (all_tx, all_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let controller = Controller::<Allocation>::new(&factory)
        .name("bench")
        .concurrency(64)
        .resync_every(None)
        .reconcile_all_on(tokio_stream::wrappers::UnboundedReceiverStream::new(all_rx));
    tokio::spawn(controller.run(reconcile, ctx.clone()));
    let wait_for = |target: usize, limit: Duration| {
        let ctx = ctx.clone();
        async move {
            let deadline = Instant::now() + limit;
            while ctx.reconciles.load(Ordering::Relaxed) < target && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    let t = Instant::now();
    wait_for(created, Duration::from_secs(120)).await;
    eprintln!(
        "    initial sync + reconcile of {created} in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // No-op throughput: reconcile everything once more.
    let before = ctx.reconciles.load(Ordering::Relaxed);
    let t = Instant::now();
    let _ = all_tx.send(());
    wait_for(before + created, Duration::from_secs(120)).await;
    let rps = created as f64 / t.elapsed().as_secs_f64();

    // Latency under a steady change rate.
    eprintln!("==> {rate} changes/s for {secs}s");
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = rate * secs;
    let errors = Arc::new(AtomicUsize::new(0));
    let acked: Arc<Mutex<HashMap<(String, String), u64>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        tick.tick().await;
        let api = api.clone();
        let errors = errors.clone();
        let acked = acked.clone();
        tasks.spawn(async move {
            let name = format!("bench-{:06}", i % n.max(1));
            let sent = now_micros().to_string();
            let patch = Patch::Merge(json!({"metadata": {"annotations": {SENT: sent.clone()}}}));
            match api.patch(&name, &PatchParams::default(), &patch).await {
                Ok(_) => {
                    if let Ok(mut a) = acked.lock() {
                        a.insert((name, sent), now_micros());
                    }
                }
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reconciled = ctx.reconciled.lock().map(|r| r.clone()).unwrap_or_default();
    let acked = acked.lock().map(|a| a.clone()).unwrap_or_default();
    let mut from_ack = Vec::new();
    let mut from_send = Vec::new();
    for (key, done) in &reconciled {
        if let Ok(sent) = key.1.parse::<u64>() {
            from_send.push(done.saturating_sub(sent) as f64 / 1000.0);
        }
        if let Some(ack) = acked.get(key) {
            from_ack.push(done.saturating_sub(*ack) as f64 / 1000.0);
        }
    }
    from_ack.sort_by(|a, b| a.total_cmp(b));
    from_send.sort_by(|a, b| a.total_cmp(b));
    println!(
        "RESULT event_to_reconcile_p50_ms={:.2}",
        percentile(&from_ack, 0.50)
    );
    println!(
        "RESULT event_to_reconcile_p99_ms={:.2}",
        percentile(&from_ack, 0.99)
    );
    println!(
        "RESULT send_to_reconcile_p50_ms={:.2}",
        percentile(&from_send, 0.50)
    );
    println!(
        "RESULT send_to_reconcile_p99_ms={:.2}",
        percentile(&from_send, 0.99)
    );
    println!(
        "RESULT changes_observed={} changes_sent={} write_errors={}",
        reconciled.len(),
        total,
        errors.load(Ordering::Relaxed)
    );
    println!("RESULT noop_reconciles_per_s={rps:.0}");
    Ok(())
}
