//! Runtime prediction in the cycle: backfill checks on predicted runtimes, the backfill
//! order, the head job's guarantee, what users are told, and the invariant that a
//! prediction never costs a job its work (properties, on the cycle and through replays).

use std::collections::BTreeMap;

use lattice_scheduler::sim::engine::{simulate, SimJob, Workload};
use lattice_scheduler::*;
use proptest::prelude::*;

const NOW: i64 = 1000;

fn nodes(n: u32) -> Vec<NodeView> {
    (0..n).map(NodeView::slot).collect()
}

fn user(u: u32) -> RuntimeKey {
    RuntimeKey {
        user: Some(u),
        name: None,
    }
}

fn job(id: u64, n: u32, submit: i64, wall: i64, key: RuntimeKey) -> PendingJob {
    PendingJob {
        id: JobId(id),
        tenant: TenantId(0),
        vcluster: VClusterId(0),
        nodes: NodeRequest::exact(n),
        constraints: Constraints::default(),
        preemption_class: 5,
        sensitive: false,
        submit_time: submit,
        walltime_s: wall,
        runtime_key: key,
        checkpoint: CheckpointInfo::default(),
        data_readiness: None,
        scale_up: None,
    }
}

fn running(
    id: u64,
    on: std::ops::Range<u32>,
    start: i64,
    wall: i64,
    key: RuntimeKey,
) -> RunningJob {
    RunningJob {
        start_time: start,
        walltime_s: wall,
        runtime_key: key,
        ..RunningJob::new(
            JobId(id),
            TenantId(9),
            VClusterId(0),
            on.map(NodeId).collect(),
        )
    }
}

/// A profile with prediction on (hpc-backfill's), `guard` as the guarantee.
fn predicting(guard: Option<i64>) -> SchedulerConfig {
    let mut c = SchedulerConfig::for_kind(SchedulerKind::HpcBackfill);
    c.prediction.guarantee_after_s = guard;
    c
}

fn cycle(
    cfg: SchedulerConfig,
    n: u32,
    run: &[RunningJob],
    pending: &[PendingJob],
    history: Option<&RuntimeHistory>,
) -> Plan {
    let cat = NodeCatalog::new(nodes(n));
    let snap = ClusterSnapshot {
        now: NOW,
        running: run,
        pending,
        tenants: &[],
        energy_price: 0.0,
        history,
    };
    Scheduler::new(cfg).cycle(&cat, &snap)
}

fn started(plan: &Plan) -> Vec<u64> {
    plan.proposals.iter().map(|p| p.job.0).collect()
}

fn reason(plan: &Plan, id: u64) -> &PendingReason {
    &plan
        .pending
        .iter()
        .find(|p| p.job == JobId(id))
        .expect("explained")
        .reason
}

/// User 1 runs for a tenth of what they ask (history: 360 s of 3600 twice).
fn history() -> RuntimeHistory {
    let mut h = RuntimeHistory::default();
    h.record(user(1), 360, 3600);
    h.record(user(1), 360, 3600);
    h
}

/// 10 nodes, 6 busy until t=2000 (their walltime); the head needs 8, so it is reserved at
/// 2000 and 2 of the 4 free nodes are EASY's "extra" nodes. A 4-node candidate asking for
/// 9000 s cannot backfill on its walltime; its user's history says it will run 900 s,
/// ending at 1900, before the reservation: it backfills, and its kill time stays 9000 s.
#[test]
fn a_job_predicted_to_end_before_the_reservation_backfills() {
    let run = [running(100, 0..6, 0, 2000, RuntimeKey::default())];
    let pending = [
        job(1, 8, 0, 3600, RuntimeKey::default()),
        job(2, 4, 1, 9000, user(1)),
    ];
    let h = history();
    let easy = cycle(SchedulerConfig::backfill(1), 10, &run, &pending, Some(&h));
    assert!(started(&easy).is_empty(), "EASY plans on the walltime");
    let plan = cycle(predicting(None), 10, &run, &pending, Some(&h));
    assert_eq!(started(&plan), vec![2]);
    assert_eq!(plan.proposals[0].kind, ProposalKind::Backfill);
    assert_eq!(plan.reservations[0].start, 2000, "the head keeps its start");
    // Without history there is nothing to predict from: EASY's decision.
    let blind = cycle(
        predicting(None),
        10,
        &run,
        &pending,
        Some(&RuntimeHistory::default()),
    );
    assert!(started(&blind).is_empty());
}

/// Behind the reservation, candidates are tried shortest predicted first (EASY++'s
/// order): of two 3-node jobs that each fit the 4 free nodes before the reservation
/// (predicted 900 s and 500 s), the later, shorter one goes first.
#[test]
fn the_shortest_predicted_candidate_backfills_first() {
    let run = [running(100, 0..6, 0, 2000, RuntimeKey::default())];
    let h = history();
    let pending = [
        job(1, 8, 0, 3600, RuntimeKey::default()),
        job(2, 3, 1, 9000, user(1)),
        job(3, 3, 2, 5000, user(1)),
    ];
    let mut queue = predicting(None);
    queue.backfill_order = BackfillOrder::Queue;
    assert_eq!(
        started(&cycle(queue, 10, &run, &pending, Some(&h))),
        vec![2]
    );
    let plan = cycle(predicting(None), 10, &run, &pending, Some(&h));
    assert_eq!(started(&plan), vec![3]);
}

/// A head that has waited longer than `guarantee_after_s` gets EASY's guarantee: the
/// candidate predicted to end in time, whose walltime does not, waits.
#[test]
fn a_starving_head_gets_the_walltime_guarantee() {
    let run = [running(100, 0..6, 0, 2000, RuntimeKey::default())];
    let pending = [
        job(1, 8, 0, 3600, RuntimeKey::default()),
        job(2, 4, 1, 9000, user(1)),
    ];
    let h = history();
    let young = cycle(predicting(Some(NOW)), 10, &run, &pending, Some(&h));
    assert_eq!(started(&young), vec![2], "waited {NOW} s, not longer");
    let old = cycle(predicting(Some(NOW - 1)), 10, &run, &pending, Some(&h));
    assert!(started(&old).is_empty());
    assert!(matches!(
        reason(&old, 1),
        PendingReason::Reserved {
            start: 2000,
            predicted: false
        }
    ));
}

/// The reason shown for a reserved job is its predicted start: the running job's user
/// runs a tenth of their walltime, so its nodes are expected free at 360, well before its
/// kill time (2000, where the reservation waits).
#[test]
fn a_reserved_job_is_told_its_predicted_start() {
    let run = [running(100, 0..6, 0, 2000, user(3))];
    let mut h = history();
    h.record(user(3), 1500, 2000);
    let pending = [job(1, 8, 0, 3600, RuntimeKey::default())];
    let plan = cycle(predicting(None), 10, &run, &pending, Some(&h));
    assert_eq!(plan.reservations[0].start, 2000);
    let r = reason(&plan, 1);
    assert_eq!(
        r,
        &PendingReason::Reserved {
            start: 1500,
            predicted: true
        }
    );
    assert_eq!(
        r.to_string(),
        "expected to start at t=1500 (predicted runtimes)"
    );
    // Once the prediction has expired (started at -600, it ran past 1500 s), the expected
    // start is the corrected prediction: 1500 s + 1 min + 5 min with hpc-backfill's gradual
    // correction (the reservation itself still waits for the kill time, 1400).
    let late = [running(100, 0..6, -600, 2000, user(3))];
    let plan = cycle(predicting(None), 10, &late, &pending, Some(&h));
    assert_eq!(plan.reservations[0].start, 1400);
    assert_eq!(
        reason(&plan, 1),
        &PendingReason::Reserved {
            start: -600 + 1500 + 60 + 300,
            predicted: true
        }
    );
    let mut walltime = predicting(None);
    walltime.prediction.correction = Correction::Walltime;
    assert_eq!(
        reason(&cycle(walltime, 10, &late, &pending, Some(&h)), 1),
        &PendingReason::Reserved {
            start: 1400,
            predicted: true
        }
    );
}

/// `running_ends: predicted` (EASY++): the reservation itself waits only for the
/// predicted end, and moves to the corrected prediction once that expired.
#[test]
fn reservations_on_predicted_ends_follow_the_correction() {
    let pending = [job(1, 8, 0, 3600, RuntimeKey::default())];
    let mut h = RuntimeHistory::default();
    h.record(user(3), 1500, 4000);
    let mut cfg = predicting(None);
    cfg.prediction.running_ends = RunningEnds::Predicted;
    cfg.prediction.estimator = Some("user-last2".into());
    cfg.prediction.correction = Correction::Walltime;
    let fresh = [running(100, 0..6, 0, 4000, user(3))];
    assert_eq!(
        cycle(cfg.clone(), 10, &fresh, &pending, Some(&h)).reservations[0].start,
        1500
    );
    // Started at -1000: predicted to end at 500, expired at NOW. Corrections: the
    // walltime (3000), or Tsafrir's steps from the prediction until past the elapsed
    // 2000 s (1500 s + 1 min + 5 min + 15 min).
    let expired = [running(100, 0..6, -1000, 4000, user(3))];
    assert_eq!(
        cycle(cfg.clone(), 10, &expired, &pending, Some(&h)).reservations[0].start,
        3000
    );
    cfg.prediction.correction = Correction::Gradual;
    assert_eq!(
        cycle(cfg, 10, &expired, &pending, Some(&h)).reservations[0].start,
        -1000 + 1500 + 60 + 300 + 900
    );
}

/// EASY and FCFS never look at the history (the published figures depend on it).
#[test]
fn easy_and_fcfs_plan_on_walltimes_whatever_the_history() {
    let run = [running(100, 0..6, 0, 2000, user(1))];
    let pending = [
        job(1, 8, 0, 3600, user(1)),
        job(2, 4, 1, 9000, user(1)),
        job(3, 2, 2, 500, user(1)),
    ];
    let h = history();
    for cfg in [SchedulerConfig::backfill(1), SchedulerConfig::fcfs()] {
        let with = cycle(cfg.clone(), 10, &run, &pending, Some(&h));
        let without = cycle(cfg, 10, &run, &pending, None);
        assert_eq!(with, without);
    }
}

fn any_prediction() -> impl Strategy<Value = SchedulerConfig> {
    (
        0usize..predict::ESTIMATORS.len(),
        prop_oneof![
            Just(Correction::Walltime),
            Just(Correction::Gradual),
            Just(Correction::Double)
        ],
        any::<bool>(),
        prop::option::of(0i64..20_000),
        prop_oneof![
            Just(BackfillOrder::Shortest),
            Just(BackfillOrder::SmallestArea),
            Just(BackfillOrder::BestFit),
            Just(BackfillOrder::Queue)
        ],
        1usize..4,
    )
        .prop_map(|(e, correction, predicted, guard, order, depth)| {
            let mut c = SchedulerConfig::for_kind(SchedulerKind::HpcBackfill);
            c.prediction = PredictionConfig {
                estimator: Some(predict::ESTIMATORS[e].name().to_string()),
                correction,
                running_ends: if predicted {
                    RunningEnds::Predicted
                } else {
                    RunningEnds::Walltime
                },
                guarantee_after_s: guard,
            };
            c.backfill_order = order;
            c.discipline = Discipline::Backfill { depth };
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    /// However wrong the predictions (histories say anything from 0 to far beyond the
    /// walltime; running jobs long past their predicted ends), a cycle never hands out a
    /// node a running job holds, and never picks a preemption victim its walltime rules
    /// out: a prediction never stops a job before its walltime.
    #[test]
    fn predictions_never_take_a_running_jobs_nodes(
        runs in prop::collection::vec((0u32..4, 0i64..50_000, 1i64..40_000), 0..24),
        busy in prop::collection::vec((1u32..5, -30_000i64..NOW, 60i64..40_000, 0u32..4, 0u8..10, any::<bool>()), 0..8),
        queue in prop::collection::vec((1u32..12, 0i64..NOW, 60i64..40_000, 0u32..4, 0u8..10), 0..16),
        cfg in any_prediction(),
    ) {
        let mut h = RuntimeHistory::default();
        for (u, r, w) in runs {
            h.record(user(u), r, w);
        }
        let mut next = 0u32;
        let mut run = Vec::new();
        for (i, (n, start, wall, u, class, ckpt)) in busy.into_iter().enumerate() {
            let mut r = running(100 + i as u64, next..next + n, start, wall, user(u));
            r.preemption_class = class;
            if ckpt {
                r.checkpoint = CheckpointInfo { mode: CheckpointMode::Auto, estimated_minutes: 1.0 };
            }
            next += n;
            run.push(r);
        }
        let pending: Vec<PendingJob> = queue
            .into_iter()
            .enumerate()
            .map(|(i, (n, submit, wall, u, class))| {
                let mut j = job(i as u64 + 1, n, submit, wall, user(u));
                j.preemption_class = class;
                j
            })
            .collect();
        let plan = cycle(cfg.clone(), 24, &run, &pending, Some(&h));
        let holder: BTreeMap<NodeId, &RunningJob> =
            run.iter().flat_map(|r| r.nodes.iter().map(move |n| (*n, r))).collect();
        let mut given = std::collections::BTreeSet::new();
        for p in &plan.proposals {
            for n in &p.nodes {
                prop_assert!(given.insert(*n), "node {n:?} given twice");
            }
            match &p.kind {
                ProposalKind::Preempt { victims, .. } => {
                    let class = pending.iter().find(|j| j.id == p.job).map(|j| j.preemption_class).unwrap_or(0);
                    for v in victims {
                        let r = run.iter().find(|r| r.id == *v).expect("victim runs");
                        prop_assert!(
                            preempt::preemptible(&cfg.preemption, r, class, NOW),
                            "victim {v:?} is protected by its walltime rules"
                        );
                    }
                    for n in &p.nodes {
                        if let Some(r) = holder.get(n) {
                            prop_assert!(victims.contains(&r.id), "{n:?} held by {:?}", r.id);
                        }
                    }
                }
                _ => {
                    for n in &p.nodes {
                        prop_assert!(!holder.contains_key(n), "{n:?} still runs {:?}", holder[n].id);
                    }
                }
            }
        }
    }

    /// Replays with wrong predictions (each user's jobs run anything from seconds to past
    /// their walltime): every job runs its whole runtime once started (nothing is stopped
    /// at a predicted end), and no two jobs ever share a node.
    #[test]
    fn no_replayed_job_is_cut_short_or_doubled_up(
        jobs in prop::collection::vec((0i64..20_000, 1u32..9, 1i64..20_000, 1i64..20_000, 0u32..4), 1..60),
        cfg in any_prediction(),
    ) {
        let jobs: Vec<SimJob> = jobs
            .into_iter()
            .enumerate()
            .map(|(i, (submit, n, runtime, estimate, u))| SimJob {
                id: i as u64 + 1,
                tenant: TenantId(u),
                vcluster: VClusterId(0),
                submit,
                runtime,
                estimate,
                nodes: n,
                class: 5,
                sensitive: false,
                constraints: Constraints::default(),
                checkpoint: CheckpointInfo::default(),
                runtime_key: user(u),
            })
            .collect();
        let w = Workload { nodes: nodes(12), jobs, tenants: Vec::new() };
        let r = simulate(&w, &cfg);
        let mut spans: BTreeMap<NodeId, Vec<(i64, i64)>> = BTreeMap::new();
        for o in &r.outcomes {
            let j = &w.jobs[o.job];
            let (Some(start), Some(end)) = (o.last_start, o.end) else {
                prop_assert!(false, "job {} never ran", j.id);
                continue;
            };
            prop_assert_eq!(end - start, j.runtime, "job {} cut short", j.id);
            for n in &o.nodes {
                spans.entry(*n).or_default().push((start, end));
            }
        }
        for (n, mut v) in spans {
            v.sort_unstable();
            for pair in v.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "node {n:?} shared: {pair:?}");
            }
        }
    }
}
