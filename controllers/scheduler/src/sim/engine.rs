//! Discrete-event replay. Events are processed one at a time in (time, kind) order with
//! submissions before terminations at equal times, and one scheduling cycle after each event
//! — the protocol of the published EASY figures (see `traces/README.md`). Jobs that run
//! exactly to their walltime estimate release their nodes at the start of that instant, as
//! the reference simulators' availability profiles do (this reproduces Gaussier et al.'s KTH
//! figure to all four published decimals).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde::{Deserialize, Serialize};

use crate::model::{
    CheckpointInfo, CheckpointMode, ClusterSnapshot, Constraints, JobId, NodeId, NodeRequest,
    NodeView, PendingJob, RunningJob, Tenant, TenantId, Time, VClusterId,
};
use crate::plan::ProposalKind;
use crate::predict::{RuntimeHistory, RuntimeKey};
use crate::{NodeCatalog, Scheduler, SchedulerConfig};

/// One job of a replayed trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimJob {
    pub id: u64,
    pub tenant: TenantId,
    pub vcluster: VClusterId,
    pub submit: Time,
    /// Actual runtime in seconds.
    pub runtime: i64,
    /// Walltime estimate the scheduler sees.
    pub estimate: i64,
    pub nodes: u32,
    pub class: u8,
    pub sensitive: bool,
    pub constraints: Constraints,
    pub checkpoint: CheckpointInfo,
    /// User and job name, for runtime prediction.
    #[serde(default)]
    pub runtime_key: RuntimeKey,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Workload {
    pub nodes: Vec<NodeView>,
    pub jobs: Vec<SimJob>,
    /// Quotas and fair-share targets (sorted by id by the engine).
    pub tenants: Vec<Tenant>,
}

/// What happened to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    pub job: usize,
    pub first_start: Option<Time>,
    /// Start of the last run (the only one unless preempted).
    pub last_start: Option<Time>,
    /// Nodes of the last run.
    pub nodes: Vec<NodeId>,
    pub end: Option<Time>,
    pub backfilled: bool,
    pub preempted: u32,
    /// The start it was first told to expect (its first reservation), if it had one.
    pub first_expected: Option<Time>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    pub outcomes: Vec<JobOutcome>,
    pub backfills: u64,
    pub preemptions: u64,
    /// Node-seconds each tenant received while the queue was non-empty.
    pub contended_node_seconds: HashMap<TenantId, f64>,
    pub cycles: u64,
}

struct RunMeta {
    job: usize,
    seq: u64,
    start: Time,
    contended_at_start: f64,
}

/// Replay `w` through the scheduler core with `config`.
pub fn simulate(w: &Workload, config: &SchedulerConfig) -> SimResult {
    let mut config = config.clone();
    config.explain = false;
    let scheduler = Scheduler::new(config.clone());
    let catalog = NodeCatalog::new(w.nodes.clone());
    let mut tenants = w.tenants.clone();
    tenants.sort_by_key(|t| t.id);
    let capacity = w.nodes.len().max(1) as f64;
    let track_usage = tenants.iter().any(|t| t.quota.target_share > 0.0);

    let mut order: Vec<usize> = (0..w.jobs.len()).collect();
    order.sort_by_key(|&i| (w.jobs[i].submit, i));
    let mut next = 0usize;
    let last_submit = order.last().map_or(0, |&i| w.jobs[i].submit);

    let mut outcomes: Vec<JobOutcome> = (0..w.jobs.len())
        .map(|job| JobOutcome {
            job,
            first_start: None,
            last_start: None,
            nodes: Vec::new(),
            end: None,
            backfilled: false,
            preempted: 0,
            first_expected: None,
        })
        .collect();
    let mut remaining: Vec<i64> = w.jobs.iter().map(|j| j.runtime.max(0)).collect();
    let mut index_of: HashMap<JobId, usize> = HashMap::with_capacity(w.jobs.len());

    let mut pending: Vec<PendingJob> = Vec::new();
    let mut running: Vec<RunningJob> = Vec::new();
    let mut run_meta: Vec<RunMeta> = Vec::new();
    let mut run_pos: HashMap<JobId, usize> = HashMap::new();
    // (time, seq, job); submissions at the same time go first.
    let mut ends: BinaryHeap<Reverse<(Time, u64, JobId)>> = BinaryHeap::new();
    let mut tenant_nodes: HashMap<TenantId, u32> = HashMap::new();
    let mut seq = 0u64;

    let mut result = SimResult {
        outcomes: Vec::new(),
        backfills: 0,
        preemptions: 0,
        contended_node_seconds: HashMap::new(),
        cycles: 0,
    };
    // Runtimes of finished jobs, as the live scheduler reads them from the store: a job's
    // runtime is known from its end on (preempted runs are not finished jobs).
    let mut history = RuntimeHistory::default();
    let mut contended = 0.0f64; // cumulative seconds with a non-empty queue
    let mut last_t: Option<Time> = None;

    loop {
        let submit_t = order.get(next).map(|&i| w.jobs[i].submit);
        let end_t = ends.peek().map(|Reverse((t, _, _))| *t);
        let submit_first = match (submit_t, end_t) {
            (None, None) => break,
            (Some(s), Some(e)) => s <= e,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        let now = match (submit_first, submit_t, end_t) {
            (true, Some(s), _) => s,
            (_, _, Some(e)) => e,
            _ => break,
        };
        // Shares are compared while jobs are still arriving and some wait: the final drain,
        // when only the heaviest tenant has work left, says nothing about fairness.
        if let Some(prev) = last_t {
            if !pending.is_empty() && prev < last_submit {
                contended += (now.min(last_submit) - prev) as f64;
            }
        }
        let new_instant = last_t != Some(now);
        last_t = Some(now);

        // Jobs that run exactly to their walltime estimate end when the scheduler already
        // expected them to: their nodes count as free from that instant on, before anything
        // else happens at it (as in the reference simulators' availability profiles).
        //
        // Every termination is an event with its own scheduling pass, in the order the
        // jobs started (pyss/predictsim, whose published EASY figures this reproduces).
        // When the instant's first event is such an expected end, its pass sees only the
        // expected ends freed; a job that ended earlier than its estimate is freed by its
        // own, later event at the same instant, not folded into the first pass.
        let mut first_event_expected = false;
        if new_instant {
            let mut later = Vec::new();
            let mut first = true;
            while let Some(&Reverse((t, s, id))) = ends.peek() {
                if t != now {
                    break;
                }
                ends.pop();
                let Some(&pos) = run_pos.get(&id) else {
                    continue;
                };
                if run_meta[pos].seq != s {
                    continue;
                }
                let expected = now - run_meta[pos].start >= running[pos].walltime_s;
                if first {
                    first_event_expected = expected && !submit_first;
                    first = false;
                }
                if !expected {
                    later.push(Reverse((t, s, id)));
                    continue;
                }
                let (r, meta) = remove_running(&mut running, &mut run_meta, &mut run_pos, pos);
                *tenant_nodes.entry(r.tenant).or_default() -= r.nodes.len() as u32;
                *result.contended_node_seconds.entry(r.tenant).or_default() +=
                    r.nodes.len() as f64 * (contended - meta.contended_at_start);
                remaining[meta.job] = 0;
                outcomes[meta.job].end = Some(now);
                let j = &w.jobs[meta.job];
                history.record(j.runtime_key, j.runtime, j.estimate);
            }
            ends.extend(later);
        }

        if submit_first {
            let i = order[next];
            next += 1;
            let j = &w.jobs[i];
            let id = JobId(j.id);
            index_of.insert(id, i);
            pending.push(pending_job(j, j.estimate, j.submit));
        } else {
            // The instant's termination may already have been applied by the exact-end release
            // above; the cycle still runs once for it.
            let due =
                !first_event_expected && ends.peek().is_some_and(|Reverse((t, _, _))| *t == now);
            if let Some(Reverse((_, s, id))) = if due { ends.pop() } else { None } {
                let Some(&pos) = run_pos.get(&id) else {
                    continue;
                };
                if run_meta[pos].seq != s {
                    continue;
                }
                let (r, meta) = remove_running(&mut running, &mut run_meta, &mut run_pos, pos);
                *tenant_nodes.entry(r.tenant).or_default() -= r.nodes.len() as u32;
                *result.contended_node_seconds.entry(r.tenant).or_default() +=
                    r.nodes.len() as f64 * (contended - meta.contended_at_start);
                remaining[meta.job] = 0;
                outcomes[meta.job].end = Some(now);
                let j = &w.jobs[meta.job];
                history.record(j.runtime_key, j.runtime, j.estimate);
            }
        }

        if pending.is_empty() {
            continue;
        }
        if track_usage {
            for t in &mut tenants {
                t.usage.actual_share =
                    f64::from(tenant_nodes.get(&t.id).copied().unwrap_or(0)) / capacity;
            }
        }
        let snap = ClusterSnapshot {
            now,
            running: &running,
            pending: &pending,
            tenants: &tenants,
            energy_price: 0.0,
            history: Some(&history),
        };
        let plan = scheduler.cycle(&catalog, &snap);
        result.cycles += 1;
        for r in &plan.reservations {
            if let Some(&ji) = index_of.get(&r.job) {
                outcomes[ji].first_expected.get_or_insert(r.expected);
            }
        }
        if plan.proposals.is_empty() {
            continue;
        }
        let mut started: Vec<JobId> = Vec::with_capacity(plan.proposals.len());
        for p in plan.proposals {
            let Some(&ji) = index_of.get(&p.job) else {
                continue;
            };
            let Some(pj) = pending.iter().find(|x| x.id == p.job).cloned() else {
                continue;
            };
            if let ProposalKind::Preempt { victims, .. } = &p.kind {
                for v in victims {
                    let Some(&pos) = run_pos.get(v) else { continue };
                    let (r, meta) = remove_running(&mut running, &mut run_meta, &mut run_pos, pos);
                    *tenant_nodes.entry(r.tenant).or_default() -= r.nodes.len() as u32;
                    *result.contended_node_seconds.entry(r.tenant).or_default() +=
                        r.nodes.len() as f64 * (contended - meta.contended_at_start);
                    let vj = &w.jobs[meta.job];
                    let elapsed = now - meta.start;
                    // Checkpointed progress survives; without a checkpoint all is lost.
                    if r.checkpoint.mode != CheckpointMode::None {
                        remaining[meta.job] = (remaining[meta.job] - elapsed).max(0);
                    }
                    outcomes[meta.job].preempted += 1;
                    result.preemptions += 1;
                    let est = (r.walltime_s - elapsed).max(1);
                    let est = if r.checkpoint.mode != CheckpointMode::None {
                        est
                    } else {
                        vj.estimate
                    };
                    pending.push(pending_job(vj, est, vj.submit));
                }
            }
            if matches!(p.kind, ProposalKind::Backfill) {
                result.backfills += 1;
                outcomes[ji].backfilled = true;
            }
            started.push(p.job);
            let o = &mut outcomes[ji];
            o.first_start.get_or_insert(now);
            o.last_start = Some(now);
            o.nodes.clone_from(&p.nodes);
            seq += 1;
            let end = now + remaining[ji];
            ends.push(Reverse((end, seq, p.job)));
            *tenant_nodes.entry(pj.tenant).or_default() += p.nodes.len() as u32;
            run_pos.insert(p.job, running.len());
            running.push(RunningJob {
                id: p.job,
                tenant: pj.tenant,
                vcluster: pj.vcluster,
                nodes: p.nodes,
                preemption_class: pj.preemption_class,
                sensitive: pj.sensitive,
                start_time: now,
                walltime_s: pj.walltime_s,
                runtime_key: pj.runtime_key,
                checkpoint: pj.checkpoint,
                last_checkpoint: None,
                gpus_per_node: pj.constraints.min_gpus_per_node,
                checkpointing: false,
                preempted_for: None,
                home_protected: false,
            });
            run_meta.push(RunMeta {
                job: ji,
                seq,
                start: now,
                contended_at_start: contended,
            });
        }
        started.sort_unstable();
        pending.retain(|x| started.binary_search(&x.id).is_err());
    }
    result.outcomes = outcomes;
    result
}

fn pending_job(j: &SimJob, estimate: i64, submit: Time) -> PendingJob {
    PendingJob {
        id: JobId(j.id),
        tenant: j.tenant,
        vcluster: j.vcluster,
        nodes: NodeRequest::exact(j.nodes),
        constraints: j.constraints.clone(),
        preemption_class: j.class.min(10),
        sensitive: j.sensitive,
        submit_time: submit,
        walltime_s: estimate.max(1),
        runtime_key: j.runtime_key,
        checkpoint: j.checkpoint,
        data_readiness: None,
        scale_up: None,
    }
}

fn remove_running(
    running: &mut Vec<RunningJob>,
    meta: &mut Vec<RunMeta>,
    pos_of: &mut HashMap<JobId, usize>,
    pos: usize,
) -> (RunningJob, RunMeta) {
    let r = running.swap_remove(pos);
    let m = meta.swap_remove(pos);
    pos_of.remove(&r.id);
    if pos < running.len() {
        pos_of.insert(running[pos].id, pos);
    }
    (r, m)
}
