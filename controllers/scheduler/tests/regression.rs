//! The seed's regression suite (Testing Strategy), on synthetic traces replayed through the
//! real core, each with its pass/fail threshold.

use lattice_scheduler::sim::engine::simulate;
use lattice_scheduler::sim::{scenarios, Report};
use lattice_scheduler::*;

fn lattice() -> SchedulerConfig {
    SchedulerConfig::for_kind(SchedulerKind::HpcBackfill)
}

fn run(w: &sim::Workload, cfg: &SchedulerConfig) -> Report {
    Report::new("lattice", w, &simulate(w, cfg))
}

#[test]
fn steady_state_utilization_above_85_percent() {
    let w = scenarios::steady_state(1);
    let r = run(&w, &lattice());
    assert_eq!(r.unscheduled, 0);
    assert!(r.utilization > 0.85, "utilization {:.4}", r.utilization);
}

#[test]
fn burst_does_not_starve() {
    let w = scenarios::burst(2);
    let r = run(&w, &lattice());
    assert_eq!(r.unscheduled, 0);
    let p99 = r
        .wait_by_class
        .values()
        .map(|s| s.p99_s)
        .fold(0.0, f64::max);
    assert!(p99 < 4.0 * 3600.0, "p99 wait {p99} s");
}

#[test]
fn unfair_tenant_is_held_to_its_share() {
    // Weights are per-vCluster data: the fair-share-tuned profile shipped with the crate.
    let path = format!("{}/profiles/fair-share.yaml", env!("CARGO_MANIFEST_DIR"));
    let profile = sim::replay::load_profile(&path).expect("profile loads");
    let w = scenarios::unfair(3);
    let fair = run(&w, &profile);
    let easy = run(&w, &SchedulerConfig::backfill(1));
    assert!(
        fair.max_share_deviation < 0.10,
        "fair-share deviation {:.4} (EASY: {:.4})",
        fair.max_share_deviation,
        easy.max_share_deviation
    );
    // The bar: Jain's index over actual/target shares >= 0.95, with utilization
    // within 2 % of EASY.
    assert!(fair.jain_index >= 0.95, "Jain {:.4}", fair.jain_index);
    assert!(
        fair.utilization >= easy.utilization - 0.02,
        "utilization {:.4} vs EASY {:.4}",
        fair.utilization,
        easy.utilization
    );
    // The trace really is unfair: plain EASY lets the heavy tenant take far more.
    assert!(
        easy.max_share_deviation > 0.2,
        "EASY deviation {:.4}",
        easy.max_share_deviation
    );
    assert!(easy.jain_index < 0.8, "EASY Jain {:.4}", easy.jain_index);
}

#[test]
fn sensitive_claims_start_immediately() {
    let w = scenarios::sensitive_claim(4);
    let r = simulate(&w, &lattice());
    for o in &r.outcomes {
        let j = &w.jobs[o.job];
        if j.sensitive {
            assert_eq!(
                o.first_start,
                Some(j.submit),
                "sensitive job {} waited",
                j.id
            );
        }
    }
}

#[test]
fn preemption_heavy_picks_checkpointable_victims() {
    let w = scenarios::preemption_heavy(5);
    let r = simulate(&w, &lattice());
    assert!(r.preemptions > 0, "expected preemptions");
    let preempted: Vec<_> = r.outcomes.iter().filter(|o| o.preempted > 0).collect();
    let with_ckpt = preempted
        .iter()
        .filter(|o| w.jobs[o.job].checkpoint.mode != CheckpointMode::None)
        .count();
    let rate = with_ckpt as f64 / preempted.len() as f64;
    assert!(rate > 0.95, "checkpointable victim rate {rate:.3}");
    // Every job still completes (preempted ones resume from their checkpoints).
    assert!(r.outcomes.iter().all(|o| o.end.is_some()));
}

#[test]
fn empty_to_full_first_cycle_fills_the_cluster() {
    let w = scenarios::empty_to_full(6);
    let cat = NodeCatalog::new(w.nodes.clone());
    let pending: Vec<PendingJob> = w
        .jobs
        .iter()
        .map(|j| PendingJob {
            id: JobId(j.id),
            tenant: j.tenant,
            vcluster: j.vcluster,
            nodes: NodeRequest::exact(j.nodes),
            constraints: j.constraints.clone(),
            preemption_class: j.class,
            sensitive: false,
            submit_time: 0,
            walltime_s: j.estimate,
            runtime_key: Default::default(),
            checkpoint: j.checkpoint,
            data_readiness: None,
            scale_up: None,
        })
        .collect();
    let snap = ClusterSnapshot {
        now: 0,
        running: &[],
        pending: &pending,
        tenants: &[],
        energy_price: 0.0,
        history: None,
    };
    let plan = Scheduler::new(lattice()).cycle(&cat, &snap);
    let used: usize = plan.proposals.iter().map(|p| p.nodes.len()).sum();
    assert!(
        used as f64 >= 0.95 * w.nodes.len() as f64,
        "first cycle placed {used} of {} nodes",
        w.nodes.len()
    );
    assert_eq!(plan.proposals.len() + plan.pending.len(), pending.len());
    let r = run(&w, &lattice());
    assert_eq!(r.unscheduled, 0);
}

#[test]
fn replay_is_deterministic() {
    let w = scenarios::steady_state(9);
    let a = serde_json::to_string(&run(&w, &lattice())).unwrap();
    let b = serde_json::to_string(&run(&w, &lattice())).unwrap();
    assert_eq!(a, b);
}
