//! Scenario tests of one cycle, Nomad-style: real scheduler, in-memory state, assert the plan.

use lattice_scheduler::*;

fn nodes(n: u32, per_group: u32) -> Vec<NodeView> {
    (0..n)
        .map(|i| {
            let mut v = NodeView::slot(i);
            v.topology_group = i / per_group;
            v
        })
        .collect()
}

fn job(id: u64, n: u32, submit: i64, wall: i64) -> PendingJob {
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
        runtime_key: Default::default(),
        checkpoint: CheckpointInfo::default(),
        data_readiness: None,
        scale_up: None,
    }
}

fn running(id: u64, on: std::ops::Range<u32>, start: i64, wall: i64, class: u8) -> RunningJob {
    RunningJob {
        id: JobId(id),
        tenant: TenantId(9),
        vcluster: VClusterId(0),
        nodes: on.map(NodeId).collect(),
        preemption_class: class,
        sensitive: false,
        start_time: start,
        walltime_s: wall,
        runtime_key: Default::default(),
        checkpoint: CheckpointInfo {
            mode: CheckpointMode::Auto,
            estimated_minutes: 2.0,
        },
        last_checkpoint: None,
        gpus_per_node: 0,
        checkpointing: false,
        preempted_for: None,
        home_protected: false,
    }
}

fn cycle(
    cfg: SchedulerConfig,
    nodes: Vec<NodeView>,
    run: &[RunningJob],
    pending: &[PendingJob],
    tenants: &[Tenant],
) -> Plan {
    let cat = NodeCatalog::new(nodes);
    let snap = ClusterSnapshot {
        now: 1000,
        running: run,
        pending,
        tenants,
        energy_price: 0.0,
        history: None,
    };
    Scheduler::new(cfg).cycle(&cat, &snap)
}

fn reason(plan: &Plan, id: u64) -> &PendingReason {
    &plan
        .pending
        .iter()
        .find(|p| p.job == JobId(id))
        .expect("explained")
        .reason
}

#[test]
fn easy_backfills_short_jobs_and_protects_the_reservation() {
    // 10 nodes; 6 busy until t=2000. Head needs 8 -> reserved at 2000 on the 6 busy nodes
    // plus 2 free ones; 2 free nodes are "extra".
    let run = [running(100, 0..6, 0, 2000, 5)];
    let pending = [
        job(1, 8, 0, 3600), // head, blocked
        job(2, 4, 1, 500),  // short: ends at 1500 <= 2000 -> backfills on any free node
        job(3, 3, 2, 9000), // long, needs 3 > extra 2 -> must wait
        job(4, 2, 3, 9000), // long but fits in extra... only 0 free left after job 2
    ];
    let plan = cycle(
        SchedulerConfig::backfill(1),
        nodes(10, 10),
        &run,
        &pending,
        &[],
    );
    let started: Vec<u64> = plan.proposals.iter().map(|p| p.job.0).collect();
    assert_eq!(started, vec![2]);
    assert!(matches!(plan.proposals[0].kind, ProposalKind::Backfill));
    assert_eq!(plan.reservations.len(), 1);
    assert_eq!(plan.reservations[0].start, 2000);
    assert!(matches!(
        reason(&plan, 1),
        PendingReason::Reserved {
            start: 2000,
            predicted: false
        }
    ));
    // Job 4 (2 nodes, long) would fit the extra nodes had job 2 not taken free nodes.
    let pending2 = [job(1, 8, 0, 3600), job(4, 2, 3, 9000), job(3, 3, 2, 9000)];
    let plan = cycle(
        SchedulerConfig::backfill(1),
        nodes(10, 10),
        &run,
        &pending2,
        &[],
    );
    let started: Vec<u64> = plan.proposals.iter().map(|p| p.job.0).collect();
    assert_eq!(started, vec![4]);
    assert!(matches!(
        reason(&plan, 3),
        PendingReason::BlockedByReservation { .. } | PendingReason::NodesOccupied { .. }
    ));
}

#[test]
fn fcfs_blocks_behind_the_head() {
    let run = [running(100, 0..6, 0, 2000, 5)];
    let pending = [job(1, 8, 0, 3600), job(2, 1, 1, 10)];
    let plan = cycle(SchedulerConfig::fcfs(), nodes(10, 10), &run, &pending, &[]);
    assert!(plan.proposals.is_empty());
    assert_eq!(
        reason(&plan, 2),
        &PendingReason::WaitingBehind { job: JobId(1) }
    );
    assert_eq!(
        reason(&plan, 1).to_string(),
        "all suitable nodes occupied (requested 8, 4 free)"
    );
}

#[test]
fn conservative_reserves_for_every_blocked_job() {
    let run = [running(100, 0..6, 0, 2000, 5)];
    let pending = [
        job(1, 8, 0, 3600),
        job(2, 8, 1, 3600),
        job(3, 4, 2, 100_000),
    ];
    let plan = cycle(
        SchedulerConfig::backfill(usize::MAX),
        nodes(10, 10),
        &run,
        &pending,
        &[],
    );
    // Every blocked job gets a reservation; job 3 cannot start now without delaying job 1
    // (it would hold free nodes past t=2000), so it is reserved behind the others.
    assert_eq!(plan.reservations.len(), 3);
    assert_eq!(plan.reservations[0].start, 2000);
    assert_eq!(plan.reservations[1].start, 2000 + 3600);
    assert!(plan.reservations[2].start >= 2000);
    assert!(plan.proposals.is_empty());
}

#[test]
fn reasons_name_the_constraint_and_numbers() {
    let mut ns = nodes(4, 2);
    ns[0].gpus = 4;
    ns[0].gpu_type = Some("H100".into());
    let mut a = job(1, 2, 0, 100);
    a.constraints.gpu_type = Some("H100".into());
    let plan = cycle(SchedulerConfig::default(), ns, &[], &[a], &[]);
    assert_eq!(
        reason(&plan, 1).to_string(),
        "no nodes matching constraints (requested 2, 1 of 4 nodes match)"
    );

    let mut ns = nodes(4, 2);
    ns[0].conformance_fingerprint = 1;
    ns[1].conformance_fingerprint = 2;
    ns[2].conformance_fingerprint = 3;
    let mut b = job(2, 2, 0, 100);
    b.constraints.require_conformance = true;
    let plan = cycle(SchedulerConfig::default(), ns, &[], &[b], &[]);
    assert!(matches!(
        reason(&plan, 2),
        PendingReason::InsufficientConformanceGroup {
            requested: 2,
            largest: 1
        }
    ));
}

#[test]
fn hard_quotas_are_filters() {
    let tenants = [Tenant {
        id: TenantId(0),
        quota: TenantQuota {
            max_nodes: Some(3),
            max_concurrent_allocations: Some(2),
            target_share: 0.0,
            burst_allowance: None,
        },
        usage: TenantUsage::default(),
    }];
    let pending = [
        job(1, 2, 0, 100),
        job(2, 2, 1, 100),
        job(3, 1, 2, 100),
        job(4, 1, 3, 100),
    ];
    let plan = cycle(
        SchedulerConfig::for_kind(SchedulerKind::InteractiveFifo),
        nodes(8, 8),
        &[],
        &pending,
        &tenants,
    );
    let started: Vec<u64> = plan.proposals.iter().map(|p| p.job.0).collect();
    assert_eq!(started, vec![1, 3]);
    assert_eq!(
        reason(&plan, 2).to_string(),
        "waiting for quota headroom (max_nodes: current 2, requested 2, limit 3)"
    );
    assert!(matches!(
        reason(&plan, 4),
        PendingReason::QuotaHeadroom {
            quota: plan::QuotaKind::MaxConcurrentAllocations,
            ..
        }
    ));
}

#[test]
fn cxl_memory_only_on_opt_in_and_unified_memory_is_hard() {
    let mut ns = nodes(2, 2);
    ns[0].memory_gb = 512;
    ns[0].cxl_memory_gb = 2048;
    ns[1].memory_gb = 512;
    ns[1].unified_memory = true;
    let mut big = job(1, 1, 0, 100);
    big.constraints.memory_gb_per_node = 1024;
    let plan = cycle(
        SchedulerConfig::default(),
        ns.clone(),
        &[],
        &[big.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    big.constraints.allow_cxl_memory = true;
    let plan = cycle(SchedulerConfig::default(), ns.clone(), &[], &[big], &[]);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(0)]);
    let mut uni = job(2, 1, 0, 100);
    uni.constraints.require_unified_memory = true;
    let plan = cycle(SchedulerConfig::default(), ns, &[], &[uni], &[]);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(1)]);
}

#[test]
fn borrowing_needs_opt_in_and_preemptibility_and_sensitive_is_isolated() {
    let mut ns = nodes(3, 3);
    ns[0].owner.home = Some(VClusterId(7));
    ns[1].owner.home = Some(VClusterId(7));
    ns[2].sensitive_pool = true;
    let mut j = job(1, 2, 0, 100);
    let plan = cycle(
        SchedulerConfig::default(),
        ns.clone(),
        &[],
        &[j.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    j.constraints.allow_borrowed = true;
    let plan = cycle(
        SchedulerConfig::default(),
        ns.clone(),
        &[],
        &[j.clone()],
        &[],
    );
    assert_eq!(plan.proposals[0].borrowed_nodes, 2);
    // Non-preemptible work (no checkpoint, class >= 7) stays off borrowed nodes.
    j.preemption_class = 8;
    let plan = cycle(SchedulerConfig::default(), ns.clone(), &[], &[j], &[]);
    assert!(plan.proposals.is_empty());
    let mut s = job(2, 1, 0, 100);
    s.sensitive = true;
    let plan = cycle(
        SchedulerConfig::for_kind(SchedulerKind::SensitiveReservation),
        ns,
        &[],
        &[s],
        &[],
    );
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(2)]);
    assert!(matches!(plan.proposals[0].kind, ProposalKind::Claim));
}

#[test]
fn a_lender_reclaims_its_home_nodes_whatever_the_classes() {
    // Nodes 0..4 are vCluster 7's home; vCluster 0 borrowed all four for a class-9 job.
    let mut ns = nodes(4, 4);
    for n in &mut ns {
        n.owner.home = Some(VClusterId(7));
    }
    let borrower = running(10, 0..4, 900, 36_000, 9);
    // The lender's job is class 0, in a vCluster whose preemption is switched off: the
    // nodes are still its own to take back.
    let mut home = job(1, 2, 0, 3600);
    home.vcluster = VClusterId(7);
    home.preemption_class = 0;
    let mut cfg = SchedulerConfig::for_kind(SchedulerKind::ServiceBinpack);
    cfg.preemption.enabled = false;
    cfg.vcluster = Some(VClusterId(7));
    let plan = cycle(
        cfg.clone(),
        ns.clone(),
        std::slice::from_ref(&borrower),
        &[home.clone()],
        &[],
    );
    match &plan.proposals[0].kind {
        ProposalKind::Preempt { victims, reclaim } => {
            assert_eq!(victims, &vec![JobId(10)]);
            assert!(reclaim);
        }
        k => panic!("expected a reclaim, got {k:?}"),
    }
    // Work of the same vCluster on its own nodes is not "borrowed": no reclaim.
    let mut own = borrower.clone();
    own.vcluster = VClusterId(7);
    let plan = cycle(cfg.clone(), ns.clone(), &[own], &[home.clone()], &[]);
    assert!(plan.proposals.is_empty(), "{:?}", plan.proposals);
    // A borrower that also holds a shared-pool node is not covered by the reclaim right
    // (only the class rules could preempt it, and they are off here).
    let mut wider = ns.clone();
    wider.push(NodeView::slot(4));
    let spread = running(10, 0..5, 900, 36_000, 9);
    let plan = cycle(cfg.clone(), wider, &[spread], &[home.clone()], &[]);
    assert!(plan.proposals.is_empty(), "{:?}", plan.proposals);
    // A borrower already stopping is not asked twice.
    let mut stopping = borrower.clone();
    stopping.checkpointing = true;
    let plan = cycle(cfg, ns, &[stopping], &[home], &[]);
    assert!(plan.proposals.is_empty(), "{:?}", plan.proposals);
}

#[test]
fn a_vcluster_that_does_not_lend_keeps_its_idle_nodes() {
    let mut ns = nodes(2, 2);
    for n in &mut ns {
        n.owner.home = Some(VClusterId(7));
        n.owner.private = true;
    }
    let mut j = job(1, 1, 0, 100);
    j.constraints.allow_borrowed = true;
    let plan = cycle(
        SchedulerConfig::default(),
        ns.clone(),
        &[],
        &[j.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    // Its own jobs still use them.
    j.vcluster = VClusterId(7);
    let plan = cycle(SchedulerConfig::default(), ns, &[], &[j], &[]);
    assert_eq!(plan.proposals.len(), 1);
}

#[test]
fn a_preemption_under_way_is_waited_for_not_repeated() {
    // 3 busy nodes; job 10 already stops for the urgent job 1 (chosen in an earlier cycle).
    let mut stopping = running(10, 0..1, 900, 36_000, 1);
    stopping.checkpointing = true;
    stopping.preempted_for = Some(JobId(1));
    let run = [
        stopping,
        running(11, 1..2, 900, 36_000, 1),
        running(12, 2..3, 900, 36_000, 1),
    ];
    let mut urgent = job(1, 1, 0, 3600);
    urgent.preemption_class = 8;
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(3, 3),
        &run,
        &[urgent.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty(), "{:?}", plan.proposals);
    assert_eq!(
        reason(&plan, 1),
        &PendingReason::WaitingForPreemption { victims: 1 }
    );
    // Without the preemption under way, it preempts one victim.
    let run = [
        running(10, 0..1, 900, 36_000, 1),
        running(11, 1..2, 900, 36_000, 1),
        running(12, 2..3, 900, 36_000, 1),
    ];
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(3, 3),
        &run,
        &[urgent],
        &[],
    );
    match &plan.proposals[0].kind {
        ProposalKind::Preempt { victims, .. } => assert_eq!(victims.len(), 1),
        k => panic!("expected preemption, got {k:?}"),
    }
}

#[test]
fn a_tenant_near_its_soft_budget_is_told_why_others_go_first() {
    // Both nodes busy; tenant 0 has used 95 % of its budget: penalty factor 1 − 2.5 × 0.15.
    let run = [running(10, 0..2, 900, 36_000, 9)];
    let tenants = [Tenant {
        id: TenantId(0),
        quota: TenantQuota::default(),
        usage: TenantUsage {
            actual_share: 0.0,
            budget_used: Some(0.95),
        },
    }];
    let plan = cycle(
        SchedulerConfig::fcfs(),
        nodes(2, 2),
        &run,
        &[job(1, 1, 0, 3600)],
        &tenants,
    );
    match reason(&plan, 1) {
        PendingReason::SoftQuotaPenalty {
            budget_used_pct: 95,
            priority_factor,
            requested: 1,
            free: 0,
        } => assert!((priority_factor - 0.625).abs() < 1e-9),
        r => panic!("{r:?}"),
    }
    assert!(reason(&plan, 1)
        .to_string()
        .starts_with("soft quota penalty: the tenant has used 95%"));
    // Under 80 % there is no penalty: the plain reason.
    let tenants = [Tenant {
        usage: TenantUsage {
            actual_share: 0.0,
            budget_used: Some(0.5),
        },
        ..tenants[0]
    }];
    let plan = cycle(
        SchedulerConfig::fcfs(),
        nodes(2, 2),
        &run,
        &[job(1, 1, 0, 3600)],
        &tenants,
    );
    assert!(matches!(
        reason(&plan, 1),
        PendingReason::NodesOccupied { .. }
    ));
}

fn tenant(id: u32, target: f64, burst: Option<f64>, actual: f64) -> Tenant {
    Tenant {
        id: TenantId(id),
        quota: TenantQuota {
            target_share: target,
            burst_allowance: burst,
            ..TenantQuota::default()
        },
        usage: TenantUsage {
            actual_share: actual,
            budget_used: None,
        },
    }
}

#[test]
fn a_tenant_beyond_its_burst_allowance_goes_after_everyone_else() {
    // One free node of two. Tenant 1 uses 50 % against a 25 % target with a 1.5 burst
    // allowance (cap 37.5 %): its earlier, higher-class job waits for tenant 2's.
    let run = [running(10, 0..1, 900, 36_000, 10)];
    let mut first = job(1, 1, 0, 3600);
    first.tenant = TenantId(1);
    first.preemption_class = 9;
    let mut second = job(2, 1, 50, 3600);
    second.tenant = TenantId(2);
    let tenants = [tenant(1, 0.25, Some(1.5), 0.5), tenant(2, 0.0, None, 0.0)];
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(2, 2),
        &run,
        &[first.clone(), second.clone()],
        &tenants,
    );
    let started: Vec<u64> = plan.proposals.iter().map(|p| p.job.0).collect();
    assert_eq!(started, vec![2]);
    // Within its burst allowance (2.0 × 25 % = 50 % > 40 %): the ordinary order.
    let tenants = [tenant(1, 0.25, Some(2.0), 0.4), tenant(2, 0.0, None, 0.0)];
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(2, 2),
        &run,
        &[first, second],
        &tenants,
    );
    let started: Vec<u64> = plan.proposals.iter().map(|p| p.job.0).collect();
    assert_eq!(started, vec![1]);
}

#[test]
fn burst_work_is_the_first_preemption_candidate() {
    // Two busy nodes: job 10 of tenant 1 (bursting: 60 % against 25 %), job 11 of tenant 3
    // (below its share). Job 11 is the cheaper victim, but tenant 2, below its own share,
    // takes the burst work's node.
    // (It has run 30 % of its walltime, so it costs more to preempt.)
    let mut burst = running(10, 0..1, -10_000, 36_000, 1);
    burst.tenant = TenantId(1);
    let mut modest = running(11, 1..2, 900, 36_000, 1);
    modest.tenant = TenantId(3);
    let mut urgent = job(1, 1, 0, 3600);
    urgent.tenant = TenantId(2);
    urgent.preemption_class = 8;
    let tenants = [
        tenant(1, 0.25, None, 0.6),
        tenant(2, 0.25, None, 0.0),
        tenant(3, 0.5, None, 0.1),
    ];
    let victims = |tenants: &[Tenant]| match &cycle(
        SchedulerConfig::default(),
        nodes(2, 2),
        &[burst.clone(), modest.clone()],
        &[urgent.clone()],
        tenants,
    )
    .proposals[0]
        .kind
    {
        ProposalKind::Preempt { victims, .. } => victims.clone(),
        k => panic!("expected preemption, got {k:?}"),
    };
    assert_eq!(victims(&tenants), vec![JobId(10)]);
    // Without fair-share targets the cheaper victim goes.
    assert_eq!(victims(&[]), vec![JobId(11)]);
}

#[test]
fn multi_node_gpu_jobs_take_the_nodes_whose_gpus_sit_next_to_nics() {
    // One group, four GPU nodes: 0 and 1 have a NIC near half their GPUs, 2 and 3 near all.
    let views: Vec<NodeView> = (0..4)
        .map(|i| {
            let mut v = NodeView::slot(i);
            v.gpus = 4;
            v.nic_affinity = if i < 2 { 0.5 } else { 1.0 };
            v
        })
        .collect();
    let mut gpu_job = job(1, 2, 0, 3600);
    gpu_job.constraints.min_gpus_per_node = 4;
    let plan = cycle(
        SchedulerConfig::default(),
        views.clone(),
        &[],
        &[gpu_job],
        &[],
    );
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(2), NodeId(3)]);
    // A single-node job has no inter-node traffic: NIC affinity does not matter to it.
    let mut one = job(2, 1, 0, 3600);
    one.constraints.min_gpus_per_node = 4;
    let plan = cycle(
        SchedulerConfig::default(),
        views.clone(),
        &[],
        &[one.clone()],
        &[],
    );
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(0)]);
    // But its GPUs' links do: node 1 has NVLink pairs only (slow across pairs), node 3 an
    // NVSwitch; a GPU job takes the best-linked node, a CPU job the lowest.
    let mut views = views;
    for (i, v) in views.iter_mut().enumerate() {
        v.nic_affinity = 1.0;
        v.gpu_link_fitness = if i == 3 { 1.0 } else { 0.14 };
    }
    let plan = cycle(SchedulerConfig::default(), views.clone(), &[], &[one], &[]);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(3)]);
    let plan = cycle(
        SchedulerConfig::default(),
        views,
        &[],
        &[job(3, 1, 0, 3600)],
        &[],
    );
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(0)]);
}

#[test]
fn a_reactive_scale_up_is_scored_and_placed_like_any_job() {
    // Groups 0 (nodes 0-1) and 1 (nodes 2-3). The allocation runs in group 1 and already
    // ran on node 2 this attempt: its next node is 3, although 0 is lower.
    let mut grow = job(7, 1, 0, 3600);
    grow.scale_up = Some(ScaleUp {
        near_groups: vec![1],
        exclude: vec![NodeId(2)],
        fingerprint: None,
        home_only: true,
    });
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(4, 2),
        &[],
        &[grow.clone()],
        &[],
    );
    assert_eq!(plan.proposals[0].kind, ProposalKind::ScaleUp);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(3)]);
    // Node 3 busy: no node near it, so the group with the most free nodes (group 0).
    let run = [running(10, 3..4, 900, 36_000, 5)];
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(4, 2),
        &run,
        &[grow.clone()],
        &[],
    );
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(0)]);
    // Scored like any job: one free node, and a higher-class job wants it first.
    let run = [
        running(10, 0..2, 900, 36_000, 9),
        running(11, 2..3, 900, 36_000, 9),
    ];
    let mut urgent = job(8, 1, 0, 3600);
    urgent.preemption_class = 9;
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(4, 2),
        &run,
        &[grow.clone(), urgent],
        &[],
    );
    assert_eq!(plan.proposals.len(), 1);
    assert_eq!(plan.proposals[0].job, JobId(8));
    assert!(matches!(
        reason(&plan, 7),
        PendingReason::NodesOccupied { .. }
    ));
    // A node of another fingerprint is never added to a conformance-bound allocation, and
    // the reason says so rather than calling the free nodes occupied.
    if let Some(g) = grow.scale_up.as_mut() {
        g.fingerprint = Some(5);
    }
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(4, 2),
        &[],
        &[grow.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    assert_eq!(
        reason(&plan, 7),
        &PendingReason::NoScaleUpNode {
            excluded: 0,
            other_fingerprint: 4,
            borrowed: 0
        }
    );
    // The only free node already ran this attempt.
    if let Some(g) = grow.scale_up.as_mut() {
        g.fingerprint = None;
    }
    let run = [
        running(10, 0..2, 900, 36_000, 5),
        running(11, 3..4, 900, 36_000, 5),
    ];
    let plan = cycle(SchedulerConfig::default(), nodes(4, 2), &run, &[grow], &[]);
    assert_eq!(
        reason(&plan, 7),
        &PendingReason::NoScaleUpNode {
            excluded: 1,
            other_fingerprint: 0,
            borrowed: 0
        }
    );
}

#[test]
fn services_on_their_home_nodes_are_not_priority_victims() {
    // The seed: "services on home nodes are not preempted" (borrowed_nodes_only).
    let mut service = running(10, 0..2, 900, 36_000, 1);
    service.home_protected = true;
    let mut urgent = job(1, 2, 0, 3600);
    urgent.preemption_class = 9;
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(2, 2),
        &[service.clone()],
        &[urgent.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty(), "{:?}", plan.proposals);
    service.home_protected = false;
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(2, 2),
        &[service],
        &[urgent],
        &[],
    );
    assert!(matches!(
        plan.proposals[0].kind,
        ProposalKind::Preempt { .. }
    ));
}

#[test]
fn preemption_moves_down_only_and_prefers_one_large_victim() {
    // 8 nodes, all busy: a class-2 job on 4 nodes, two class-1 jobs on 2 nodes each.
    let run = [
        running(10, 0..4, 900, 36_000, 2),
        running(11, 4..6, 900, 36_000, 1),
        running(12, 6..8, 900, 36_000, 1),
    ];
    let mut urgent = job(1, 4, 0, 3600);
    urgent.preemption_class = 8;
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(8, 8),
        &run,
        &[urgent.clone()],
        &[],
    );
    match &plan.proposals[0].kind {
        ProposalKind::Preempt { victims, .. } => assert_eq!(victims, &vec![JobId(10)]),
        k => panic!("expected preemption, got {k:?}"),
    }
    // Same class cannot preempt.
    urgent.preemption_class = 2;
    let run2 = [running(10, 0..8, 900, 36_000, 2)];
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(8, 8),
        &run2,
        &[urgent.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    // Near completion (> 90 % of walltime used) is never preempted.
    urgent.preemption_class = 9;
    let run3 = [running(10, 0..8, -31_000, 35_000, 0)];
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(8, 8),
        &run3,
        &[urgent.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    // Sensitive allocations are never victims.
    let mut s = running(10, 0..8, 900, 36_000, 0);
    s.sensitive = true;
    let plan = cycle(
        SchedulerConfig::default(),
        nodes(8, 8),
        &[s],
        &[urgent],
        &[],
    );
    assert!(plan.proposals.is_empty());
}

#[test]
fn placement_packs_into_one_group_and_one_fingerprint() {
    let mut ns = nodes(12, 4); // groups 0,1,2 of 4 nodes
    for n in ns.iter_mut() {
        n.conformance_fingerprint = u64::from(n.id.0 % 2);
    }
    ns[8].conformance_fingerprint = 5; // group 2: fingerprints 5,1,0,1
    let run = [running(100, 0..2, 0, 9999, 5)]; // group 0 has 2 free
    let plan = cycle(
        SchedulerConfig::default(),
        ns,
        &run,
        &[job(1, 3, 0, 100)],
        &[],
    );
    let p = &plan.proposals[0];
    assert_eq!(p.groups, 1);
    // No fingerprint has 3 free nodes inside one group, so conformance cannot be perfect;
    // the job must still land in a single group.
    let groups: std::collections::BTreeSet<u32> = p.nodes.iter().map(|n| n.0 / 4).collect();
    assert_eq!(groups.len(), 1);
}

#[test]
fn unconstrained_jobs_leave_special_nodes_free() {
    let mut ns = nodes(12, 4);
    for n in ns.iter_mut().skip(8) {
        n.unified_memory = true; // group 2: GH200-like nodes
    }
    let run = [running(100, 0..2, 0, 9999, 5)];
    // 4 nodes fit exactly in group 2 (best fit), but group 1 has 4 plain nodes too.
    let plan = cycle(
        SchedulerConfig::default(),
        ns,
        &run,
        &[job(1, 4, 0, 100)],
        &[],
    );
    assert_eq!(
        plan.proposals[0].nodes,
        (4..8).map(NodeId).collect::<Vec<_>>()
    );
}

/// Slurm's `--constraint="a100|h100"` (`anyOf`): a node with either alternative will do,
/// one with neither never; with several groups, each must hold.
#[test]
fn any_of_takes_a_node_with_one_alternative_and_never_one_with_none() {
    let mut ns = nodes(3, 3);
    ns[0].features = vec!["mc".into()];
    ns[1].features = vec!["h100".into()];
    let mut j = job(1, 1, 0, 100);
    j.constraints.any_of = vec![vec!["a100".into(), "h100".into()]];
    let plan = cycle(
        SchedulerConfig::default(),
        ns.clone(),
        &[],
        &[j.clone()],
        &[],
    );
    assert_eq!(plan.proposals.len(), 1, "{:?}", plan.pending);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(1)]);

    // Two nodes, but only one has an alternative: the job waits and says why.
    j.nodes = NodeRequest::exact(2);
    let plan = cycle(
        SchedulerConfig::default(),
        ns.clone(),
        &[],
        &[j.clone()],
        &[],
    );
    assert!(plan.proposals.is_empty());
    assert_eq!(
        reason(&plan, 1).to_string(),
        "no nodes matching constraints (requested 2, 1 of 3 nodes match)"
    );

    // (a100 | h100) & (ib | slingshot): node 2 has an accelerator but no fabric feature.
    ns[1].features = vec!["h100".into(), "ib".into()];
    ns[2].features = vec!["a100".into()];
    j.nodes = NodeRequest::exact(1);
    j.constraints
        .any_of
        .push(vec!["ib".into(), "slingshot".into()]);
    let plan = cycle(SchedulerConfig::default(), ns, &[], &[j], &[]);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(1)]);
}

/// A job that asks for `a100|h100` counts both as asked for: it takes the node whose
/// features are all alternatives before one with a feature nobody asked for.
#[test]
fn any_of_jobs_leave_nodes_with_other_features_free() {
    let mut ns = nodes(2, 2);
    ns[0].features = vec!["a100".into(), "nvme".into()];
    ns[1].features = vec!["a100".into(), "h100".into()];
    let mut j = job(1, 1, 0, 100);
    j.constraints.any_of = vec![vec!["a100".into(), "h100".into()]];
    let plan = cycle(SchedulerConfig::default(), ns, &[], &[j], &[]);
    assert_eq!(plan.proposals[0].nodes, vec![NodeId(1)]);
}
