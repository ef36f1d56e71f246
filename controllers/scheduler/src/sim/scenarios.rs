//! Synthetic versions of the seed's regression traces (Testing Strategy → Regression Suite).
//! Deterministic: each generator is driven by a seeded [`SplitMix64`].

use super::engine::{SimJob, Workload};
use super::rng::SplitMix64;
use crate::model::{
    CheckpointInfo, CheckpointMode, Constraints, NodeId, NodeView, Tenant, TenantId, TenantQuota,
    VClusterId,
};

/// `n` plain nodes spread over `groups` dragonfly groups in consecutive blocks.
pub fn cluster(n: u32, groups: u32) -> Vec<NodeView> {
    let per = n.div_ceil(groups.max(1)).max(1);
    (0..n)
        .map(|i| {
            let mut v = NodeView::slot(i);
            v.id = NodeId(i);
            v.topology_group = i / per;
            v
        })
        .collect()
}

fn job(
    id: u64,
    tenant: u32,
    submit: i64,
    nodes: u32,
    runtime: i64,
    estimate: i64,
    class: u8,
) -> SimJob {
    SimJob {
        id,
        tenant: TenantId(tenant),
        vcluster: VClusterId(0),
        submit,
        runtime: runtime.max(1),
        estimate: estimate.max(runtime).max(1),
        nodes,
        class,
        sensitive: false,
        constraints: Constraints::default(),
        checkpoint: CheckpointInfo::default(),
        runtime_key: Default::default(),
    }
}

fn size(rng: &mut SplitMix64, max_log2: u32) -> u32 {
    1 << rng.range(0, u64::from(max_log2) + 1)
}

/// Poisson arrivals offering `load` × capacity for `count` jobs.
fn stream(
    rng: &mut SplitMix64,
    nodes: u32,
    count: usize,
    load: f64,
    mean_runtime: f64,
    tenants: u32,
) -> Vec<SimJob> {
    let mean_size = 63.0 / 6.0; // mean of 1,2,4,8,16,32
    let interarrival = mean_size * mean_runtime / (f64::from(nodes) * load);
    let mut t = 0.0;
    (0..count)
        .map(|i| {
            t += rng.exp(interarrival);
            let n = size(rng, 5);
            let run = rng.exp(mean_runtime).max(60.0) as i64;
            let est = (run as f64 * (1.0 + rng.next_f64())) as i64;
            let tenant = rng.range(0, u64::from(tenants)) as u32;
            job(i as u64 + 1, tenant, t as i64, n, run, est, 5)
        })
        .collect()
}

/// Normal mixed load at 95 % offered utilization. Key metric: utilization > 85 %.
pub fn steady_state(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let jobs = stream(&mut rng, 128, 1500, 0.95, 3600.0, 4);
    Workload {
        nodes: cluster(128, 4),
        jobs,
        tenants: Vec::new(),
    }
}

/// 60 % background load with a spike of 300 jobs submitted within ten minutes.
/// Key metric: no starvation, p99 wait < 4 h.
pub fn burst(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut jobs = stream(&mut rng, 128, 600, 0.6, 1800.0, 4);
    let spike_at = jobs[jobs.len() / 2].submit;
    let base = jobs.len() as u64;
    for i in 0..300u64 {
        let n = size(&mut rng, 3);
        let run = rng.exp(600.0).max(60.0) as i64;
        let at = spike_at + rng.range(0, 600) as i64;
        jobs.push(job(base + i + 1, 9, at, n, run, run * 2, 5));
    }
    Workload {
        nodes: cluster(128, 4),
        jobs,
        tenants: Vec::new(),
    }
}

/// Three tenants with equal targets (1/3) that all keep a standing queue; tenant 0 submits
/// five times as many jobs as each of the others. Key metric: fair-share deviation < 10 %.
pub fn unfair(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut jobs = Vec::new();
    let mut id = 0;
    // Each light tenant offers ~45 % of the machine, the heavy one ~225 %.
    let span = 100_000.0;
    for (tenant, count) in [(0u32, 1000usize), (1, 200), (2, 200)] {
        let mut t = 0.0;
        for _ in 0..count {
            t += rng.exp(span / count as f64);
            id += 1;
            let n = size(&mut rng, 3);
            let run = rng.exp(3840.0).max(60.0) as i64;
            jobs.push(job(id, tenant, t as i64, n, run, run * 2, 5));
        }
    }
    let tenants = (0..3)
        .map(|i| Tenant {
            id: TenantId(i),
            quota: TenantQuota {
                target_share: 1.0 / 3.0,
                ..TenantQuota::default()
            },
            usage: Default::default(),
        })
        .collect();
    Workload {
        nodes: cluster(64, 2),
        jobs,
        tenants,
    }
}

/// HPC load plus sensitive claims on a 16-node sensitive pool.
/// Key metric: sensitive wait = 0.
pub fn sensitive_claim(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut nodes = cluster(128, 4);
    for n in nodes.iter_mut().skip(112) {
        n.sensitive_pool = true;
        n.conformance_fingerprint = 42;
    }
    let mut jobs = stream(&mut rng, 112, 800, 0.95, 3600.0, 4);
    let horizon = jobs.last().map_or(0, |j| j.submit);
    let base = jobs.len() as u64;
    let mut t = 0.0;
    for i in 0..40u64 {
        t += horizon as f64 / 40.0;
        let mut j = job(base + i + 1, 7, t as i64, size(&mut rng, 2), 3000, 3600, 10);
        j.sensitive = true;
        jobs.push(j);
    }
    Workload {
        nodes,
        jobs,
        tenants: Vec::new(),
    }
}

/// Long low-class jobs fill the machine; high-class jobs keep arriving.
/// Key metric: victims are jobs that can checkpoint (> 95 %); high-class jobs start fast.
pub fn preemption_heavy(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut jobs = Vec::new();
    let mut id = 0;
    for _ in 0..64 {
        id += 1;
        let mut j = job(
            id,
            1,
            rng.range(0, 600) as i64,
            size(&mut rng, 3),
            40_000,
            43_200,
            rng.range(0, 3) as u8,
        );
        // A quarter cannot checkpoint: they must not be chosen while others can.
        j.checkpoint = if id % 4 == 0 {
            CheckpointInfo::default()
        } else {
            CheckpointInfo {
                mode: CheckpointMode::Auto,
                estimated_minutes: 2.0 + rng.range(0, 5) as f64,
            }
        };
        jobs.push(j);
    }
    let mut t = 1800.0;
    for _ in 0..60 {
        t += rng.exp(1200.0);
        id += 1;
        jobs.push(job(id, 2, t as i64, size(&mut rng, 3), 1800, 3600, 8));
    }
    Workload {
        nodes: cluster(128, 4),
        jobs,
        tenants: Vec::new(),
    }
}

/// 1,000 jobs arrive at once on an idle cluster. Key metric: the first cycle fills it.
pub fn empty_to_full(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let jobs = (0..1000u64)
        .map(|i| {
            let run = rng.exp(3600.0).max(60.0) as i64;
            job(i + 1, (i % 5) as u32, 0, size(&mut rng, 4), run, run * 2, 5)
        })
        .collect();
    Workload {
        nodes: cluster(512, 8),
        jobs,
        tenants: Vec::new(),
    }
}
