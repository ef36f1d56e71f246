//! Property tests from the Testing Strategy chapter: solver validity, topology packing,
//! cost-function bounds, determinism.

use std::collections::{BTreeMap, HashSet};

use lattice_scheduler::catalog::FilterOutcome;
use lattice_scheduler::score;
use lattice_scheduler::*;
use proptest::prelude::*;

/// gpus, gpu type, feature bits, memory tier, group, fingerprint, sensitive pool, state/home.
type NodeSpec = (u8, u8, u8, u8, u8, u8, bool, u8);
/// nodes, gpus, features, memory, class, sensitive, conformance, tenant, cxl/borrow bits.
type JobSpec = (u8, u8, u8, u8, u8, bool, bool, u8, u8);

fn node_strategy() -> impl Strategy<Value = NodeSpec> {
    // gpus, gpu type, features bits, memory tier, group, fingerprint, sensitive pool, state/home
    (
        0u8..3,
        0u8..2,
        0u8..8,
        0u8..3,
        0u8..4,
        0u8..2,
        prop::bool::weighted(0.15),
        0u8..10,
    )
}

fn build_nodes(spec: &[NodeSpec]) -> Vec<NodeView> {
    spec.iter()
        .enumerate()
        .map(|(i, &(g, t, f, m, grp, fp, sens, st))| {
            let mut n = NodeView::slot(i as u32);
            n.gpus = u32::from(g) * 4;
            n.gpu_type = (g > 0).then(|| if t == 0 { "H100" } else { "MI300X" }.to_string());
            n.features = ["nvme", "ib", "a100"]
                .iter()
                .enumerate()
                .filter(|(k, _)| f & (1 << k) != 0)
                .map(|(_, s)| s.to_string())
                .collect();
            n.memory_gb = 256 << m;
            n.cxl_memory_gb = if m == 0 { 1024 } else { 0 };
            n.topology_group = u32::from(grp);
            n.conformance_fingerprint = u64::from(fp);
            n.sensitive_pool = sens;
            n.state = match st {
                0 => NodeState::Down,
                1 => NodeState::Draining,
                _ => NodeState::Ready,
            };
            n.owner.home = (st == 9).then_some(VClusterId(1));
            n
        })
        .collect()
}

fn job_strategy() -> impl Strategy<Value = JobSpec> {
    // nodes, gpus, features, memory, class, sensitive, conformance, tenant, cxl/borrow bits
    (
        1u8..6,
        0u8..3,
        0u8..4,
        0u8..4,
        0u8..11,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.2),
        0u8..3,
        0u8..4,
    )
}

fn build_jobs(spec: &[JobSpec]) -> Vec<PendingJob> {
    spec.iter()
        .enumerate()
        .map(
            |(i, &(n, g, f, m, class, sens, conf, tenant, bits))| PendingJob {
                id: JobId(i as u64 + 1),
                tenant: TenantId(u32::from(tenant)),
                vcluster: VClusterId(0),
                nodes: NodeRequest {
                    min: u32::from(n),
                    max: u32::from(n) + u32::from(bits & 1),
                },
                constraints: Constraints {
                    gpu_type: (g == 2).then(|| "H100".to_string()),
                    min_gpus_per_node: u32::from(g) * 2,
                    features: if f & 1 != 0 {
                        vec!["nvme".to_string()]
                    } else {
                        vec![]
                    },
                    any_of: if f & 2 != 0 {
                        vec![vec!["ib".to_string(), "a100".to_string()]]
                    } else {
                        vec![]
                    },
                    memory_gb_per_node: [0, 256, 600, 1100][m as usize],
                    require_unified_memory: false,
                    allow_cxl_memory: bits & 2 != 0,
                    require_conformance: conf,
                    allow_borrowed: bits & 1 != 0,
                    gpu_heavy: None,
                },
                preemption_class: class,
                sensitive: sens,
                submit_time: i64::from(i as u32 * 7 % 50),
                walltime_s: 600 + 300 * i64::from(n),
                runtime_key: Default::default(),
                checkpoint: CheckpointInfo {
                    mode: if bits & 2 != 0 {
                        CheckpointMode::Auto
                    } else {
                        CheckpointMode::None
                    },
                    estimated_minutes: 2.0,
                },
                data_readiness: None,
                scale_up: None,
            },
        )
        .collect()
}

fn running_on(nodes: &[NodeView], every: usize) -> Vec<RunningJob> {
    nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| i % every == 0 && n.state == NodeState::Ready)
        .map(|(i, n)| RunningJob {
            id: JobId(1000 + i as u64),
            tenant: TenantId((i % 3) as u32),
            vcluster: VClusterId(0),
            nodes: vec![n.id],
            preemption_class: (i % 6) as u8,
            sensitive: n.sensitive_pool,
            start_time: 0,
            walltime_s: 3600 + 60 * i as i64,
            runtime_key: Default::default(),
            checkpoint: CheckpointInfo {
                mode: if i % 2 == 0 {
                    CheckpointMode::Auto
                } else {
                    CheckpointMode::None
                },
                estimated_minutes: 3.0,
            },
            last_checkpoint: None,
            gpus_per_node: n.gpus,
            checkpointing: false,
            preempted_for: None,
            home_protected: false,
        })
        .collect()
}

fn tenants() -> Vec<Tenant> {
    (0..3)
        .map(|i| Tenant {
            id: TenantId(i),
            quota: TenantQuota {
                max_nodes: (i == 1).then_some(4),
                max_concurrent_allocations: (i == 2).then_some(2),
                target_share: 0.3,
                burst_allowance: None,
            },
            usage: TenantUsage::default(),
        })
        .collect()
}

fn kinds() -> impl Strategy<Value = SchedulerConfig> {
    prop_oneof![
        Just(SchedulerConfig::for_kind(SchedulerKind::HpcBackfill)),
        Just(SchedulerConfig::for_kind(SchedulerKind::ServiceBinpack)),
        Just(SchedulerConfig::for_kind(
            SchedulerKind::SensitiveReservation
        )),
        Just(SchedulerConfig::for_kind(SchedulerKind::InteractiveFifo)),
        Just(SchedulerConfig::backfill(usize::MAX)),
        Just(SchedulerConfig::fcfs()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Every placement satisfies all hard constraints, capacity, exclusivity and quotas.
    #[test]
    fn placements_satisfy_constraints(
        nspec in prop::collection::vec(node_strategy(), 1..40),
        jspec in prop::collection::vec(job_strategy(), 0..25),
        every in 2usize..6,
        cfg in kinds(),
    ) {
        let nodes = build_nodes(&nspec);
        let cat = NodeCatalog::new(nodes.clone());
        let pending = build_jobs(&jspec);
        let running = running_on(&nodes, every);
        let tenants = tenants();
        let snap = ClusterSnapshot { now: 100, running: &running, pending: &pending, tenants: &tenants, energy_price: 0.3, history: None };
        let plan = Scheduler::new(cfg.clone()).cycle(&cat, &snap);

        let busy: BTreeMap<NodeId, &RunningJob> = running.iter().flat_map(|r| r.nodes.iter().map(move |n| (*n, r))).collect();
        let mut used = HashSet::new();
        let mut tenant_nodes: BTreeMap<TenantId, u32> = BTreeMap::new();
        let mut tenant_allocs: BTreeMap<TenantId, u32> = BTreeMap::new();
        for r in &running {
            *tenant_nodes.entry(r.tenant).or_default() += r.nodes.len() as u32;
            *tenant_allocs.entry(r.tenant).or_default() += 1;
        }
        let mut victims = HashSet::new();
        for p in &plan.proposals {
            let job = pending.iter().find(|j| j.id == p.job).unwrap();
            let n = p.nodes.len() as u32;
            prop_assert!(n >= job.nodes.min && n <= job.nodes.max.max(job.nodes.min), "count {n} for {:?}", job.nodes);
            let allowed_victims: HashSet<JobId> = match &p.kind {
                ProposalKind::Preempt { victims: v, .. } => {
                    prop_assert!(v.len() <= 3);
                    for vid in v {
                        let r = running.iter().find(|r| r.id == *vid).unwrap();
                        prop_assert!(r.preemption_class < job.preemption_class, "preemption must move down");
                        prop_assert!(!r.sensitive);
                        prop_assert!(victims.insert(*vid), "victim reused");
                    }
                    v.iter().copied().collect()
                }
                _ => HashSet::new(),
            };
            let mut fps = HashSet::new();
            for id in &p.nodes {
                prop_assert!(used.insert(*id), "node {id:?} double-booked");
                if let Some(r) = busy.get(id) {
                    prop_assert!(allowed_victims.contains(&r.id), "node {id:?} busy");
                }
                let idx = cat.index_of(*id).unwrap();
                let outcome = cat.filter(cat.class_of(idx), job);
                prop_assert!(matches!(outcome, FilterOutcome::Feasible { .. }), "{outcome:?}");
                // Features checked against the node itself, not through the filter.
                let has = |f: &String| cat.node(idx).features.contains(f);
                prop_assert!(job.constraints.features.iter().all(has), "node {id:?} lacks a feature of {:?}", job.constraints.features);
                prop_assert!(job.constraints.any_of.iter().all(|g| g.iter().any(has)), "node {id:?} has no feature of a group of {:?}", job.constraints.any_of);
                fps.insert(cat.node(idx).conformance_fingerprint);
            }
            if job.sensitive || job.constraints.require_conformance || cfg.kind == SchedulerKind::SensitiveReservation {
                prop_assert_eq!(fps.len(), 1);
            }
            *tenant_nodes.entry(job.tenant).or_default() += n;
            *tenant_allocs.entry(job.tenant).or_default() += 1;
        }
        // Hard quotas hold for tenants that were within them before the cycle.
        for t in &tenants {
            let before_nodes: u32 = running.iter().filter(|r| r.tenant == t.id).map(|r| r.nodes.len() as u32).sum();
            let before_allocs = running.iter().filter(|r| r.tenant == t.id).count() as u32;
            if let Some(m) = t.quota.max_nodes {
                let added = tenant_nodes.get(&t.id).copied().unwrap_or(0) - before_nodes;
                prop_assert!(added == 0 || before_nodes + added <= m);
            }
            if let Some(m) = t.quota.max_concurrent_allocations {
                let added = tenant_allocs.get(&t.id).copied().unwrap_or(0) - before_allocs;
                prop_assert!(added == 0 || before_allocs + added <= m);
            }
        }
        // Every job is either placed or explained.
        prop_assert_eq!(plan.proposals.len() + plan.pending.len(), pending.len());
    }

    /// A single job never spans more dragonfly groups than the free nodes force it to.
    #[test]
    fn never_more_groups_than_necessary(
        groups in prop::collection::vec(0u32..6, 1..60),
        special in prop::collection::vec(prop::bool::weighted(0.3), 60),
        busy_every in 2usize..7,
        need in 1u32..20,
    ) {
        // Some nodes carry capabilities the job does not need: the scheduler prefers the
        // others, but never at the price of spanning more groups.
        let nodes: Vec<NodeView> = groups.iter().enumerate().map(|(i, g)| {
            let mut n = NodeView::slot(i as u32);
            n.topology_group = *g;
            n.unified_memory = special[i];
            n
        }).collect();
        let cat = NodeCatalog::new(nodes.clone());
        let running = running_on(&nodes, busy_every);
        let busy: HashSet<NodeId> = running.iter().flat_map(|r| r.nodes.clone()).collect();
        let mut per_group: BTreeMap<u32, u32> = BTreeMap::new();
        for n in nodes.iter().filter(|n| !busy.contains(&n.id)) {
            *per_group.entry(n.topology_group).or_default() += 1;
        }
        let mut sizes: Vec<u32> = per_group.values().copied().collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut acc = 0;
        let mut min_groups = None;
        for (i, s) in sizes.iter().enumerate() {
            acc += s;
            if acc >= need { min_groups = Some(i as u32 + 1); break; }
        }
        let mut jobs = build_jobs(&[(1, 0, 0, 0, 5, false, false, 0, 0)]);
        jobs[0].nodes = NodeRequest::exact(need);
        let snap = ClusterSnapshot { now: 10, running: &running, pending: &jobs, tenants: &[], energy_price: 0.0, history: None };
        let mut cfg = SchedulerConfig::default();
        cfg.preemption.enabled = false;
        let plan = Scheduler::new(cfg).cycle(&cat, &snap);
        match min_groups {
            None => prop_assert!(plan.proposals.is_empty()),
            Some(g) => {
                prop_assert_eq!(plan.proposals.len(), 1);
                let used: HashSet<u32> = plan.proposals[0].nodes.iter().map(|id| nodes[id.0 as usize].topology_group).collect();
                prop_assert_eq!(used.len() as u32, g);
            }
        }
    }

    #[test]
    fn f2_increases_with_wait(a in 0.0f64..1e7, d in 1.0f64..1e6, r in 1.0f64..1e5) {
        prop_assert!(score::f2_wait_time(a + d, r) > score::f2_wait_time(a, r));
    }

    #[test]
    fn f3_is_bounded(target in -1.0f64..2.0, actual in -1.0f64..3.0) {
        let f = score::f3_fair_share(target, actual);
        prop_assert!((0.0..=1.0).contains(&f));
    }

    /// Same input, same plan — also when the pending list arrives in another order.
    #[test]
    fn cycle_is_deterministic(
        nspec in prop::collection::vec(node_strategy(), 1..30),
        jspec in prop::collection::vec(job_strategy(), 0..20),
        cfg in kinds(),
    ) {
        let nodes = build_nodes(&nspec);
        let cat = NodeCatalog::new(nodes.clone());
        let pending = build_jobs(&jspec);
        let running = running_on(&nodes, 3);
        let tenants = tenants();
        let s = Scheduler::new(cfg);
        let snap = ClusterSnapshot { now: 100, running: &running, pending: &pending, tenants: &tenants, energy_price: 0.5, history: None };
        let a = s.cycle(&cat, &snap);
        let b = s.cycle(&cat, &snap);
        prop_assert_eq!(&a, &b);
        let mut reversed = pending.clone();
        reversed.reverse();
        let snap_r = ClusterSnapshot { pending: &reversed, ..snap };
        let c = s.cycle(&cat, &snap_r);
        prop_assert_eq!(&a.proposals, &c.proposals);
    }
}
