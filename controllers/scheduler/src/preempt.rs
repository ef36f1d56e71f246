//! Preemption decision (Preemption Policy chapter): classes only move downward, sensitive
//! allocations and allocations near completion are never victims, at most `max_victims` per
//! decision, fewer larger victims preferred, and the total cost must stay below the value of
//! the pending job.

use crate::catalog::NodeCatalog;
use crate::cycle::{merge_counts, CycleState, Feasible};
use crate::model::{CheckpointMode, ClusterSnapshot, JobId, PendingJob, RunningJob, Time};
use crate::profile::PreemptionConfig;
use crate::select::{self, BucketCount};

/// Candidates kept for the combination search (bounds it to C(16, 3) = 560 sets).
const MAX_CANDIDATES: usize = 16;

pub(crate) struct Preemption {
    pub victims: Vec<JobId>,
    pub nodes: Vec<u32>,
    pub groups: u32,
    /// Every victim is a borrower reclaimed from the job's own home nodes.
    pub reclaim: bool,
}

/// Whether `victim` runs only on nodes borrowed from `job`'s vCluster, which may take them
/// back whatever the classes (elastic borrowing: "if vCluster A needs them back:
/// checkpoint + reclaim"). A victim that also holds other nodes is preempted only by the
/// class rules: the reclaim right covers the lender's own nodes, not the rest of the
/// victim. Sensitive work never borrows, and a victim already stopping is left alone.
pub fn reclaimable(cat: &NodeCatalog, victim: &RunningJob, job: &PendingJob) -> bool {
    victim.vcluster != job.vcluster
        && !victim.sensitive
        && !victim.checkpointing
        && !victim.nodes.is_empty()
        && victim.nodes.iter().all(|id| {
            cat.index_of(*id)
                .is_some_and(|i| cat.node(i).owner.home == Some(job.vcluster))
        })
}

/// Whether `victim` may be preempted for a job of class `class` at `now`.
pub fn preemptible(cfg: &PreemptionConfig, victim: &RunningJob, class: u8, now: Time) -> bool {
    if victim.sensitive
        || victim.checkpointing
        || victim.home_protected
        || victim.preemption_class >= class
    {
        return false;
    }
    if victim.checkpoint.mode == CheckpointMode::None && victim.preemption_class >= 7 {
        return false;
    }
    let wall = victim.walltime_s.max(1);
    let elapsed = (now - victim.start_time).max(0);
    // Without a checkpoint all progress is lost: only allocations that have just started
    // (< 10 % of walltime, "little invested") may lose it.
    if victim.checkpoint.mode == CheckpointMode::None && elapsed as f64 >= 0.1 * wall as f64 {
        return false;
    }
    let remaining = wall - elapsed;
    remaining > cfg.near_completion_s
        && (elapsed as f64) / (wall as f64) <= cfg.near_completion_fraction
}

/// preemption_cost = checkpoint_time + recompute_if_no_checkpoint + remaining_walltime_value,
/// all in node-hours (GPU-hours for the recompute term, as the seed states it).
pub fn preemption_cost(cfg: &PreemptionConfig, victim: &RunningJob, now: Time) -> f64 {
    let nodes = victim.nodes.len() as f64;
    let wall_h = victim.walltime_s.max(1) as f64 / 3600.0;
    let elapsed_h = (now - victim.start_time).max(0) as f64 / 3600.0;
    let checkpoint_h = match victim.checkpoint.mode {
        CheckpointMode::Auto => victim.checkpoint.estimated_minutes.max(0.0) / 60.0,
        CheckpointMode::Manual => cfg.manual_checkpoint_minutes / 60.0,
        CheckpointMode::None => 0.0,
    };
    let recompute = if victim.checkpoint.mode == CheckpointMode::None {
        let since = now - victim.last_checkpoint.unwrap_or(victim.start_time);
        since.max(0) as f64 / 3600.0 * nodes * f64::from(victim.gpus_per_node.max(1))
    } else {
        0.0
    };
    // Little invested (<10 % of walltime) costs little; the cost grows with the work done.
    let fraction = (elapsed_h / wall_h).min(1.0);
    let remaining_value = if fraction < 0.1 {
        0.0
    } else {
        fraction * nodes * elapsed_h
    };
    checkpoint_h * nodes + recompute + remaining_value
}

/// Value of starting the pending job: its node-hours weighted by its class.
pub fn job_value(job: &PendingJob) -> f64 {
    f64::from(job.nodes.min) * job.walltime_s.max(1) as f64 / 3600.0
        * (1.0 + f64::from(job.preemption_class))
}

/// A running job that could make room.
struct Candidate {
    /// Feasible nodes it frees.
    freed: u32,
    cost: f64,
    id: JobId,
    nodes: Vec<u32>,
    /// A borrower of the job's own home nodes.
    reclaim: bool,
    checkpointable: bool,
    /// Work of a tenant above its share, for a job of a tenant below its own.
    bursting: bool,
}

/// Find victims whose nodes let `job` start. `class_based`: lower classes may be preempted
/// (otherwise only borrowers of the job's home nodes are candidates).
#[allow(clippy::too_many_arguments)]
pub(crate) fn try_preempt(
    cfg: &PreemptionConfig,
    state: &mut CycleState<'_>,
    snap: &ClusterSnapshot<'_>,
    job: &PendingJob,
    feas: &Feasible,
    already: &[JobId],
    same_fp: bool,
    class_based: bool,
) -> Option<Preemption> {
    let need = job.nodes.min;
    let free_total = state.free_unreserved(feas);
    if free_total >= need || cfg.max_victims == 0 {
        return None;
    }
    let deficit = need - free_total;
    let now = state.now;
    let cat = state.cat;
    // Burst allowance: for a tenant below its share, work of tenants above theirs is the
    // first candidate (the quota chapter: "burst allocations are the first candidates for
    // preemption").
    let needs_share = snap.tenant(job.tenant).is_some_and(|t| t.below_share());
    let mut cands: Vec<Candidate> = snap
        .running
        .iter()
        .enumerate()
        .filter(|(_, r)| !already.contains(&r.id))
        .filter_map(|(k, r)| {
            // The cheap class test first: the node lookups are only for candidates.
            let by_class = class_based && preemptible(cfg, r, job.preemption_class, now);
            let reclaim = reclaimable(cat, r, job);
            if !(reclaim || by_class) {
                return None;
            }
            let nodes: Vec<u32> = state
                .running_nodes(k)
                .iter()
                .copied()
                .filter(|&i| feas.mask[cat.class_of(i) as usize])
                .collect();
            (!nodes.is_empty()).then(|| Candidate {
                freed: nodes.len() as u32,
                cost: preemption_cost(cfg, r, now),
                id: r.id,
                nodes,
                reclaim,
                checkpointable: r.checkpoint.mode != CheckpointMode::None,
                bursting: needs_share && snap.tenant(r.tenant).is_some_and(|t| t.bursting()),
            })
        })
        .collect();
    // Reclaims first (the nodes are the job's own), then burst work, then larger victims,
    // then cheaper ones.
    cands.sort_by(|a, b| {
        b.reclaim
            .cmp(&a.reclaim)
            .then(b.bursting.cmp(&a.bursting))
            .then(b.freed.cmp(&a.freed))
            .then(a.cost.total_cmp(&b.cost))
            .then(a.id.cmp(&b.id))
    });
    cands.truncate(MAX_CANDIDATES);

    // Tiers, first match wins: borrowers of the job's own nodes only; then burst work of
    // tenants above their share (for a tenant below its own); then victims that can
    // checkpoint (they lose no work); then anyone. Within a tier: fewest victims first, then
    // the cheapest set.
    let n = cands.len();
    let mut best: Option<(f64, Vec<usize>)> = None;
    for tier in 0..4 {
        let allowed: Vec<usize> = (0..n)
            .filter(|&i| match tier {
                0 => cands[i].reclaim,
                1 => cands[i].bursting,
                2 => cands[i].checkpointable,
                _ => true,
            })
            .collect();
        let m = allowed.len();
        for k in 1..=cfg.max_victims.min(3).min(m) {
            let mut consider = |set: &[usize]| {
                let set: Vec<usize> = set.iter().map(|&i| allowed[i]).collect();
                let freed: u32 = set.iter().map(|&i| cands[i].freed).sum();
                if freed < deficit {
                    return;
                }
                let cost: f64 = set.iter().map(|&i| cands[i].cost).sum();
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, set));
                }
            };
            match k {
                1 => (0..m).for_each(|a| consider(&[a])),
                2 => (0..m).for_each(|a| (a + 1..m).for_each(|b| consider(&[a, b]))),
                _ => (0..m).for_each(|a| {
                    (a + 1..m).for_each(|b| (b + 1..m).for_each(|c| consider(&[a, b, c])))
                }),
            }
            if best.is_some() {
                break;
            }
        }
        if best.is_some() {
            break;
        }
    }
    let (cost, set) = best?;
    let reclaim = set.iter().all(|&i| cands[i].reclaim);
    // Taking back lent nodes is the lender's right; preempting for priority must be worth it.
    if !reclaim && cost >= job_value(job) {
        return None;
    }
    let mut victim_nodes: Vec<u32> = set
        .iter()
        .flat_map(|&i| cands[i].nodes.iter().copied())
        .collect();
    victim_nodes.sort_unstable();
    let key_of = |i: u32| {
        let n = cat.node(i);
        (n.topology_group, n.conformance_fingerprint)
    };
    let mut counts: Vec<BucketCount> = state.free_counts(feas);
    counts.extend(victim_nodes.iter().map(|&i| (key_of(i), 1)));
    let counts = merge_counts(counts);
    let sel = select::select(&counts, need, need, same_fp, false)?;
    let end = now.saturating_add(job.walltime_s.max(1));
    let mut nodes = Vec::with_capacity(need as usize);
    for &(key, n) in &sel.take {
        let mut left = n;
        for &i in victim_nodes.iter().filter(|&&i| key_of(i) == key) {
            if left == 0 {
                break;
            }
            nodes.push(i);
            left -= 1;
        }
        if left > 0 {
            nodes.extend(state.take_free(feas, key, left, end));
        }
    }
    let mut victims: Vec<JobId> = set.iter().map(|&i| cands[i].id).collect();
    victims.sort_unstable();
    Some(Preemption {
        victims,
        nodes,
        groups: sel.groups,
        reclaim,
    })
}
