//! Placements per second end to end through the store: the real built-in controllers
//! (scheduler, release, ...) in this process on an embedded, fsync'ing store. `--nodes`
//! Ready nodes are registered, then `--allocations` one-node allocations are created as
//! fast as the API takes them; the clock runs from the first create until the last
//! allocation is bound (phase Staging, i.e. its binding transaction committed).
//!
//! Prints `RESULT placements_per_s_<allocations>x<nodes>=…` and the bind latency
//! percentiles (create → bound).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use lattice_apis::meta::{now, ObjectMeta};
use lattice_apis::{Allocation, AllocationPhase, Lease, Node, Tenant, VCluster};
use lattice_runtime::{
    AlwaysLeader, Api, ControllerHost, Patch, PatchParams, PostParams, ResourceExt, WatchEvent,
    WatchParams,
};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Ready nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// One-node allocations to place (at most --nodes).
    #[arg(long, default_value_t = 1000)]
    allocations: usize,
    /// Concurrent creators.
    #[arg(long, default_value_t = 8)]
    clients: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let m = args.allocations.min(args.nodes);
    let dir = tempfile::tempdir()?;
    let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default()).await?;
    let backend: Arc<dyn lattice_store::KvBackend> = Arc::new(store);
    let client = lattice_apiserver::in_process::client(backend.clone());

    // The cluster: a tenant, its vCluster, Ready nodes with live Leases.
    let mut t = Tenant {
        metadata: ObjectMeta::named("bench", None),
        ..Default::default()
    };
    t.spec.quota.max_nodes = None;
    Api::<Tenant>::all(client.clone())
        .create(&PostParams::default(), &t)
        .await?;
    let vc: VCluster = serde_json::from_value(json!({
        "metadata": {"name": "default", "namespace": "bench"},
        "spec": {"schedulerType": "hpc-backfill", "cycleInterval": "1s"},
    }))?;
    Api::<VCluster>::namespaced(client.clone(), "bench")
        .create(&PostParams::default(), &vc)
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "lattice-node-lease");
    for i in 0..args.nodes {
        let name = format!("n{i:05}");
        let mut n = Node {
            metadata: ObjectMeta::named(&name, None),
            ..Default::default()
        };
        n.spec.topology_group = Some((i / 128) as u32);
        nodes.create(&PostParams::default(), &n).await?;
        let status = Patch::Merge(json!({"status": {
            "state": "Ready",
            "capacity": {"cpuCores": 64, "memoryGb": 256},
            "conformanceFingerprint": "fp",
        }}));
        nodes
            .patch_status(&name, &PatchParams::default(), &status)
            .await?;
        // A heartbeat-stream Lease (what the API server writes for a connected agent):
        // live while it exists, so the nodes stay Ready for the whole run.
        let mut l = Lease {
            metadata: ObjectMeta::named(&name, Some("lattice-node-lease")),
            ..Default::default()
        };
        l.metadata
            .annotations
            .insert(lattice_apis::STORE_LEASE_ANNOTATION.into(), "0".into());
        l.spec.renew_time = Some(now());
        leases.create(&PostParams::default(), &l).await?;
    }

    let mut host = ControllerHost::new(client.clone(), Arc::new(AlwaysLeader::new()));
    let _m = lattice_controllers::register_all(&mut host, backend, Default::default());
    tokio::spawn(host.run(std::future::pending()));

    let allocs: Api<Allocation> = Api::namespaced(client.clone(), "bench");
    let mut watch = allocs.watch(&WatchParams::default()).await?;
    // Let the scheduler start (informers synced, loop running) before the clock starts.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let created: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut creators = Vec::new();
    for c in 0..args.clients {
        let allocs = allocs.clone();
        let created = created.clone();
        let clients = args.clients;
        creators.push(tokio::spawn(async move {
            for i in (c..m).step_by(clients) {
                let name = format!("a{i:05}");
                let a: Allocation = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "bench"},
                    "spec": {"entrypoint": "/bin/true", "resources": {"nodes": 1},
                             "lifecycle": {"walltime": "1h"}},
                }))?;
                let t0 = Instant::now();
                allocs.create(&PostParams::default(), &a).await?;
                if let Ok(mut map) = created.lock() {
                    map.insert(name, t0);
                }
            }
            anyhow::Ok(())
        }));
    }
    let mut bound_at: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now()
        + Duration::from_secs(
            std::env::var("BENCH_TIMEOUT_S")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        );
    while bound_at.len() < m {
        let ev = tokio::time::timeout_at(deadline.into(), watch.next()).await;
        let Ok(Some(ev)) = ev else {
            let mut why: HashMap<String, usize> = HashMap::new();
            for a in allocs.list(&Default::default()).await?.items {
                let st = a.status.clone().unwrap_or_default();
                *why.entry(format!("{:?} {:?}", st.phase, st.message))
                    .or_default() += 1;
            }
            let mut states: HashMap<String, usize> = HashMap::new();
            for n in nodes.list(&Default::default()).await?.items {
                let st = n.status.clone().unwrap_or_default();
                *states.entry(format!("{:?}", st.state)).or_default() += 1;
            }
            anyhow::bail!(
                "only {} of {m} allocations bound within 300 s; allocations: {why:?}; nodes: {states:?}",
                bound_at.len()
            );
        };
        if let Ok(WatchEvent::Added(a) | WatchEvent::Modified(a)) = ev {
            if a.phase() == AllocationPhase::Staging {
                bound_at
                    .entry(a.name_any().to_string())
                    .or_insert_with(Instant::now);
            }
        }
    }
    let took = started.elapsed().as_secs_f64();
    for c in creators {
        c.await??;
    }
    let created = created
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let mut lat: Vec<f64> = bound_at
        .iter()
        .filter_map(|(n, t)| {
            created
                .get(n)
                .map(|c| t.duration_since(*c).as_secs_f64() * 1e3)
        })
        .collect();
    let tag = format!("{m}x{}", args.nodes);
    println!("RESULT placements_per_s_{tag}={:.0}", m as f64 / took);
    println!("RESULT placements_total_s_{tag}={took:.2}");
    println!(
        "RESULT bind_latency_p50_ms_{tag}={:.1}",
        lattice_e2e::percentile(&mut lat, 0.50)
    );
    println!(
        "RESULT bind_latency_p99_ms_{tag}={:.1}",
        lattice_e2e::percentile(&mut lat, 0.99)
    );
    Ok(())
}
