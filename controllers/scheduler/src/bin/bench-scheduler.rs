//! Release-mode benchmark of one scheduling cycle (`hack/bench-scheduler.sh` runs it).
//!
//! For each (pending, nodes) size it builds a deterministic synthetic cluster — dragonfly
//! groups of 128 nodes, two GPU types, a CXL-expanded class, three conformance fingerprints,
//! 70 % of the nodes busy — and a queue of mixed jobs, then times `Scheduler::cycle` with the
//! hpc-backfill configuration (scoring, reservations, preemption, explanations and runtime
//! prediction enabled: jobs belong to 64 users with a runtime history each).

use std::time::Instant;

use lattice_scheduler::sim::rng::SplitMix64;
use lattice_scheduler::*;

fn cluster(nodes: u32) -> Vec<NodeView> {
    (0..nodes)
        .map(|i| {
            let mut n = NodeView::slot(i);
            n.topology_group = i / 128;
            n.conformance_fingerprint = u64::from(i % 7 / 3);
            n.gpus = 4;
            n.gpu_type = Some(if i % 4 == 0 { "MI300X" } else { "H100" }.into());
            n.memory_gb = 512;
            n.cxl_memory_gb = if i % 8 == 0 { 2048 } else { 0 };
            n.features = if i % 2 == 0 {
                vec!["nvme".into()]
            } else {
                vec![]
            };
            n
        })
        .collect()
}

fn workload(pending: usize, nodes: u32, seed: u64) -> (Vec<RunningJob>, Vec<PendingJob>) {
    let mut rng = SplitMix64::new(seed);
    let mut running = Vec::new();
    let mut next = 0u32;
    let busy = nodes * 7 / 10;
    while next < busy {
        let size = (1u32 << rng.range(0, 6)).min(busy - next);
        running.push(RunningJob {
            id: JobId(1_000_000 + u64::from(next)),
            tenant: TenantId(rng.range(0, 8) as u32),
            vcluster: VClusterId(0),
            nodes: (next..next + size).map(NodeId).collect(),
            preemption_class: rng.range(0, 6) as u8,
            sensitive: false,
            start_time: -(rng.range(0, 7200) as i64),
            walltime_s: 3600 + rng.range(0, 36_000) as i64,
            runtime_key: user_key(&mut rng),
            checkpoint: CheckpointInfo {
                mode: CheckpointMode::Auto,
                estimated_minutes: 3.0,
            },
            last_checkpoint: None,
            gpus_per_node: 4,
            checkpointing: false,
            preempted_for: None,
            home_protected: false,
        });
        next += size;
    }
    let jobs = (0..pending)
        .map(|i| {
            let kind = rng.range(0, 10);
            PendingJob {
                id: JobId(i as u64 + 1),
                tenant: TenantId(rng.range(0, 8) as u32),
                vcluster: VClusterId(0),
                nodes: NodeRequest::exact(1 << rng.range(0, 7)),
                constraints: Constraints {
                    gpu_type: (kind == 0).then(|| "MI300X".into()),
                    min_gpus_per_node: if kind < 5 { 4 } else { 0 },
                    features: if kind == 1 {
                        vec!["nvme".into()]
                    } else {
                        vec![]
                    },
                    memory_gb_per_node: if kind == 2 { 1024 } else { 0 },
                    allow_cxl_memory: kind == 2,
                    require_conformance: kind == 3,
                    ..Constraints::default()
                },
                preemption_class: rng.range(0, 9) as u8,
                sensitive: false,
                submit_time: -(rng.range(0, 86_400) as i64),
                walltime_s: 600 + rng.range(0, 86_400) as i64,
                runtime_key: user_key(&mut rng),
                checkpoint: CheckpointInfo::default(),
                data_readiness: None,
                scale_up: None,
            }
        })
        .collect();
    (running, jobs)
}

/// One of 64 users, running one of 8 job names.
fn user_key(rng: &mut SplitMix64) -> RuntimeKey {
    RuntimeKey {
        user: Some(rng.range(0, 64) as u32),
        name: Some(rng.range(0, 8) as u32),
    }
}

/// Four finished runs of every user's every job name.
fn history() -> RuntimeHistory {
    let mut rng = SplitMix64::new(7);
    let mut h = RuntimeHistory::default();
    for user in 0..64 {
        for name in 0..8 {
            for _ in 0..4 {
                let wall = 600 + rng.range(0, 86_400) as i64;
                let key = RuntimeKey {
                    user: Some(user),
                    name: Some(name),
                };
                h.record(key, rng.range(0, wall as u64) as i64, wall);
            }
        }
    }
    h
}

fn bench(pending: usize, nodes: u32) -> (f64, usize) {
    let catalog = NodeCatalog::new(cluster(nodes));
    let (running, jobs) = workload(pending, nodes, 42);
    let history = history();
    let tenants: Vec<Tenant> = (0..8)
        .map(|i| Tenant {
            id: TenantId(i),
            quota: TenantQuota {
                target_share: 0.125,
                ..TenantQuota::default()
            },
            usage: TenantUsage {
                actual_share: f64::from(i) * 0.03,
                budget_used: None,
            },
        })
        .collect();
    let snap = ClusterSnapshot {
        now: 0,
        running: &running,
        pending: &jobs,
        tenants: &tenants,
        energy_price: 0.4,
        history: Some(&history),
    };
    let scheduler = Scheduler::new(SchedulerConfig::for_kind(SchedulerKind::HpcBackfill));
    let mut times = Vec::new();
    let mut placed = 0;
    for _ in 0..7 {
        let t = Instant::now();
        let plan = scheduler.cycle(&catalog, &snap);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        placed = plan.proposals.len();
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], placed)
}

/// Median time of scoring every pending job with every registered score term
/// (`Scheduler::components`: feasibility, inventory and the terms' dispatch), and of the
/// filters alone (every registered filter, every job × node class).
fn bench_plugins(pending: usize, nodes: u32) -> (f64, f64) {
    let catalog = NodeCatalog::new(cluster(nodes));
    let (running, jobs) = workload(pending, nodes, 42);
    let snap = ClusterSnapshot {
        now: 0,
        running: &running,
        pending: &jobs,
        tenants: &[],
        energy_price: 0.4,
        history: None,
    };
    let scheduler = Scheduler::new(SchedulerConfig::for_kind(SchedulerKind::HpcBackfill));
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut score = Vec::new();
    let mut filter = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        std::hint::black_box(scheduler.components(&catalog, &snap));
        score.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let mut feasible = 0usize;
        for j in &jobs {
            for c in 0..catalog.classes().len() as u32 {
                feasible += usize::from(matches!(
                    catalog.filter(c, j),
                    FilterOutcome::Feasible { .. }
                ));
            }
        }
        std::hint::black_box(feasible);
        filter.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (median(score), median(filter))
}

fn main() {
    let mut at = std::collections::HashMap::new();
    for (p, n) in [(500usize, 5_000u32), (1_000, 10_000), (10_000, 100_000)] {
        let (ms, placed) = bench(p, n);
        eprintln!("pending={p} nodes={n}: median {ms:.2} ms over 7 cycles, {placed} proposals");
        println!("RESULT cycle_{p}x{n}_ms={ms:.2}");
        at.insert((p, n), ms);
    }
    let (score_ms, filter_ms) = bench_plugins(1_000, 10_000);
    println!("RESULT score_terms_1000x10000_ms={score_ms:.2}");
    println!("RESULT filters_1000x10000_ms={filter_ms:.3}");
    // Growth from 1,000 x 10,000 to 10,000 x 100,000 against what O(pending × log nodes)
    // allows (10 × log 100,000 / log 10,000 = 12.5).
    let ratio = at[&(10_000, 100_000)] / at[&(1_000, 10_000)];
    let bound = 10.0 * (100_000f64).ln() / (10_000f64).ln();
    println!("RESULT cycle_growth_10x_ratio={ratio:.1}");
    println!("RESULT cycle_growth_bound_pending_log_nodes={bound:.1}");
    // The scaling curve: pending at a fixed node count, nodes at a fixed queue (more nodes
    // free also means more placements per cycle), and both together.
    for (p, n) in [
        (1_000usize, 10_000u32),
        (2_000, 10_000),
        (4_000, 10_000),
        (8_000, 10_000),
        (1_000, 20_000),
        (1_000, 40_000),
        (1_000, 80_000),
        (2_000, 20_000),
        (4_000, 40_000),
        (8_000, 80_000),
    ] {
        let (ms, placed) = bench(p, n);
        println!("CURVE pending={p} nodes={n} ms={ms:.2} proposals={placed}");
    }
}
