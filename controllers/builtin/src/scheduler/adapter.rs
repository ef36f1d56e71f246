//! API objects → the scheduling core's model (`lattice_scheduler::model`). The core never
//! sees API types; this is the only place that knows both.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use lattice_apis::kinds::vcluster::{PreemptionMode, SchedulerType};
use lattice_apis::{
    lifecycle, Allocation, AllocationPhase, CheckpointStrategy, Node, NodeState, Tenant, VCluster,
};
use lattice_runtime::ResourceExt;
use lattice_scheduler::{
    CheckpointInfo, CheckpointMode, Constraints, CostWeights, Discipline, JobId, NodeId, NodeOwner,
    NodeRequest, NodeView, PendingJob, RunningJob, SchedulerConfig, SchedulerKind, TenantId,
    TenantQuota, TenantUsage, VClusterId,
};

/// Annotation that keeps an allocation out of the queue (value: why). The DAG controller
/// holds steps whose dependencies are not satisfied yet.
pub use lattice_apis::wellknown::HOLD_ANNOTATION;
/// Label of a task-group element: its index.
pub use lattice_apis::wellknown::TASK_INDEX_LABEL;

/// Default walltime when neither the allocation nor its vCluster sets one (bounded work).
pub const DEFAULT_WALLTIME_S: u64 = 3600;
/// "Forever" for unbounded work, in the core's integer seconds.
const UNBOUNDED_S: i64 = 10 * 365 * 24 * 3600;

/// `(tenant, name)` of a vCluster.
pub type VClusterKey = (String, String);

/// Unix seconds of an API time.
pub fn unix(t: &lattice_apis::meta::Time) -> i64 {
    t.timestamp()
}

/// The vCluster an allocation is queued in: `<tenant>/<spec.vcluster or "default">`,
/// else the shared `default/<name>`.
pub fn resolve_vcluster(
    a: &Allocation,
    exists: impl Fn(&VClusterKey) -> bool,
) -> Result<VClusterKey, String> {
    let name = a.spec.vcluster.clone().unwrap_or_else(|| "default".into());
    let ns = a.namespace().unwrap_or("default").to_string();
    let own = (ns, name.clone());
    if exists(&own) {
        return Ok(own);
    }
    let shared = ("default".to_string(), name.clone());
    if exists(&shared) {
        return Ok(shared);
    }
    Err(format!(
        "vCluster {name:?} not found in tenant {:?} or in \"default\"; create it (lattice apply -f vcluster.yaml) or set spec.vcluster",
        a.namespace().unwrap_or("default")
    ))
}

/// Whether an allocation is waiting in a queue at all (not held, not a task-group parent,
/// not cancelled, not bound).
pub fn is_queued(a: &Allocation) -> bool {
    if a.is_deleting() || lifecycle::cancel_requested(a) {
        return false;
    }
    if a.metadata.annotations.contains_key(HOLD_ANNOTATION) {
        return false;
    }
    if a.spec.step_of.is_some() {
        return false; // a job step runs on its allocation's nodes (the step controller)
    }
    if a.spec.task_group.is_some() && !a.labels().contains_key(TASK_INDEX_LABEL) {
        return false; // the parent of a job array: its elements are queued instead
    }
    if !a.spec.depends_on.is_empty() && !crate::allocations::dependencies_met(a) {
        return false;
    }
    let st = a.status.as_ref();
    st.is_none_or(|s| s.phase == AllocationPhase::Pending && s.assigned_nodes.is_empty())
}

/// Effective walltime in seconds (`None`: unbounded).
pub fn walltime_s(a: &Allocation, vc: Option<&VCluster>) -> Option<u64> {
    use lattice_apis::LifecycleType;
    if let Some(w) = a.spec.lifecycle.walltime_seconds() {
        return Some(w);
    }
    if matches!(
        a.spec.lifecycle.type_,
        LifecycleType::Unbounded | LifecycleType::Reactive
    ) {
        return None;
    }
    let default = vc
        .and_then(|v| v.spec.default_walltime.as_deref())
        .and_then(|d| lattice_apis::duration::parse_duration(d).ok());
    Some(default.unwrap_or(DEFAULT_WALLTIME_S))
}

/// Whether `a`'s walltime (its own, else the vCluster's default) fits the vCluster's
/// `maxWalltime`; the reason it waits when not (unbounded work in a limited vCluster
/// included).
pub fn within_max_walltime(a: &Allocation, vc: &VCluster) -> Result<(), String> {
    let Some(max) = vc.spec.max_walltime.as_deref() else {
        return Ok(());
    };
    let Ok(limit) = lattice_apis::duration::parse_duration(max) else {
        return Ok(());
    };
    match walltime_s(a, Some(vc)) {
        Some(w) if w <= limit => Ok(()),
        Some(w) => Err(format!(
            "walltime {} exceeds vCluster {}'s maxWalltime {max}; it waits until the limit \
             is raised, or resubmit it with a shorter walltime",
            lattice_apis::duration::format_hms(w),
            vc.name_any()
        )),
        None => Err(format!(
            "unbounded work in vCluster {} whose maxWalltime is {max}; give it a walltime",
            vc.name_any()
        )),
    }
}

/// The core configuration of a vCluster.
pub fn scheduler_config(vc: &VCluster) -> SchedulerConfig {
    let t = vc.spec.scheduler_type.unwrap_or(SchedulerType::HpcBackfill);
    let kind = match t {
        SchedulerType::HpcBackfill => SchedulerKind::HpcBackfill,
        SchedulerType::ServiceBinpack => SchedulerKind::ServiceBinpack,
        SchedulerType::SensitiveReservation => SchedulerKind::SensitiveReservation,
        SchedulerType::InteractiveFifo => SchedulerKind::InteractiveFifo,
    };
    let mut cfg = SchedulerConfig::for_kind(kind);
    let mut weights = vc.spec.weights.clone();
    if let Some(p) = vc.spec.effective_profile() {
        weights.fill_from(p);
    }
    // By name: every admitted weight name is a registered score term (a test checks), and
    // an unset one counts 0 as it always did.
    let mut w = CostWeights::zero();
    for (name, value) in weights.iter() {
        if let Err(e) = w.set(name, value) {
            tracing::warn!(vcluster = %vc.name_any(), error = %e, "weight ignored");
        }
    }
    cfg.weights = w;
    if kind == SchedulerKind::HpcBackfill {
        apply_prediction(&mut cfg, vc);
        let depth = vc.spec.backfill_depth.unwrap_or(t.default_backfill_depth());
        // The seed's tuning table: depth 0 is "no backfill (only first-fit)": whatever fits
        // starts, in score order, and nothing is reserved.
        cfg.discipline = if depth == 0 {
            Discipline::Greedy
        } else {
            Discipline::Backfill {
                depth: depth as usize,
            }
        };
    }
    // Priority preemption only for class_based; borrowed_nodes_only (services) takes back
    // its lent home nodes (reclaim, always allowed) and never preempts by class.
    let mode = preemption_mode(vc);
    cfg.preemption.enabled = cfg.preemption.enabled && mode == PreemptionMode::ClassBased;
    if let Some(m) = vc.spec.preemption.max_victims {
        cfg.preemption.max_victims = m as usize;
    }
    if let Some(s) = vc
        .spec
        .preemption
        .near_completion_threshold
        .as_deref()
        .and_then(|d| lattice_apis::duration::parse_duration(d).ok())
    {
        cfg.preemption.near_completion_s = s as i64;
    }
    cfg
}

/// The vCluster's backfill order and runtime prediction (unset fields keep hpc-backfill's
/// defaults, which the VCluster kind's defaulting writes out).
fn apply_prediction(cfg: &mut SchedulerConfig, vc: &VCluster) {
    use lattice_apis::kinds::vcluster as api;
    use lattice_scheduler::{BackfillOrder, Correction, RunningEnds};
    if let Some(o) = vc.spec.backfill_order {
        cfg.backfill_order = match o {
            api::BackfillOrder::Queue => BackfillOrder::Queue,
            api::BackfillOrder::Fcfs => BackfillOrder::Fcfs,
            api::BackfillOrder::Score => BackfillOrder::Score,
            api::BackfillOrder::Shortest => BackfillOrder::Shortest,
            api::BackfillOrder::SmallestArea => BackfillOrder::SmallestArea,
            api::BackfillOrder::BestFit => BackfillOrder::BestFit,
        };
    }
    let Some(p) = &vc.spec.runtime_prediction else {
        return;
    };
    let pc = &mut cfg.prediction;
    if let Some(e) = p.estimator {
        pc.estimator = e.name().map(str::to_string);
    }
    if let Some(c) = p.correction {
        pc.correction = match c {
            api::PredictionCorrection::Walltime => Correction::Walltime,
            api::PredictionCorrection::Gradual => Correction::Gradual,
            api::PredictionCorrection::Double => Correction::Double,
        };
    }
    if let Some(r) = p.running_ends {
        pc.running_ends = match r {
            api::RunningEnds::Walltime => RunningEnds::Walltime,
            api::RunningEnds::Predicted => RunningEnds::Predicted,
        };
    }
    // Validated at admission; an unparsable value written around it keeps the default.
    if let Ok(g) = p.guarantee_after_seconds() {
        pc.guarantee_after_s = g.map(|s| i64::try_from(s).unwrap_or(i64::MAX));
    }
}

/// Interns strings to dense ids.
#[derive(Default)]
pub struct Interner {
    ids: HashMap<String, u32>,
}

impl Interner {
    /// The id of `s` (new ids are dense, in order of first use).
    pub fn id(&mut self, s: &str) -> u32 {
        let n = self.ids.len() as u32;
        *self.ids.entry(s.to_string()).or_insert(n)
    }
}

/// `x` rounded to two decimals (topology fitness terms: finer differences do not change
/// a placement and would split node classes).
fn hundredths(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Stable 64-bit hash of a conformance fingerprint string (FNV-1a).
fn fingerprint(s: Option<&str>) -> u64 {
    let Some(s) = s else { return 0 };
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The node inventory of one cycle.
pub struct Inventory {
    /// Node views, `NodeId(i)` = `names[i]`.
    pub views: Vec<NodeView>,
    /// Node names by dense id, sorted (ids follow name order).
    pub names: Vec<String>,
    /// Running work (from node ownership), `JobId(i)` = `running_refs[i]`.
    pub running: Vec<RunningJob>,
    /// `(tenant, name)` of each running job.
    pub running_refs: Vec<(String, String)>,
}

impl Inventory {
    /// The dense id of the node called `name` (a binary search: names are sorted).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }
}

/// Scheduler state of a node.
pub fn node_state(n: &Node) -> lattice_scheduler::NodeState {
    use lattice_scheduler::NodeState as S;
    let state = n.status.as_ref().map(|s| s.state).unwrap_or_default();
    if n.spec.disabled {
        return S::Down;
    }
    match state {
        NodeState::Ready if n.spec.unschedulable || n.spec.drain.is_some() => S::Draining,
        NodeState::Ready => S::Ready,
        NodeState::Degraded | NodeState::Draining => S::Draining,
        NodeState::Drained => S::Drained,
        _ => S::Down,
    }
}

/// Build the inventory: every Node, and running jobs from node ownership.
pub fn inventory(
    nodes: &[Arc<Node>],
    allocations: &impl Fn(&str, &str) -> Option<Arc<Allocation>>,
    vclusters: &mut Interner,
    tenants: &mut Interner,
    home_of: &HashMap<String, VClusterKey>,
    private: &HashSet<String>,
    now: i64,
) -> Inventory {
    let mut sorted: Vec<&Arc<Node>> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name_any().cmp(b.name_any()));
    let mut views = Vec::with_capacity(sorted.len());
    let mut names = Vec::with_capacity(sorted.len());
    let mut owned: BTreeMap<(String, String), Vec<NodeId>> = BTreeMap::new();
    for (i, n) in sorted.iter().enumerate() {
        let id = NodeId(i as u32);
        let st = n.status.as_ref();
        let cap = st.map(|s| s.capacity.clone()).unwrap_or_default();
        // `lattice.dev/...` features are the agents' capabilities alone (a spec cannot
        // claim them), and only the known ones.
        let mut features: Vec<String> = n
            .spec
            .features
            .iter()
            .filter(|f| !f.starts_with("lattice.dev/"))
            .cloned()
            .collect();
        features.extend(
            st.and_then(|s| s.agent.as_ref())
                .into_iter()
                .flat_map(|a| a.capabilities.iter())
                .filter(|c| lattice_apis::kinds::node::capability::ALL.contains(&c.as_str()))
                .map(|c| lattice_apis::kinds::node::capability::feature(c)),
        );
        features.sort();
        features.dedup();
        let home = n
            .spec
            .home_vcluster
            .as_ref()
            .map(|h| {
                // A bare name is a vCluster of the "default" tenant; `tenant/name` is explicit.
                match h.split_once('/') {
                    Some((t, v)) => format!("{t}/{v}"),
                    None => format!("default/{h}"),
                }
            })
            .or_else(|| home_of.get(n.name_any()).map(|(t, v)| format!("{t}/{v}")));
        let owner = NodeOwner {
            private: home.as_ref().is_some_and(|k| private.contains(k)),
            home: home.map(|k| VClusterId(vclusters.id(&k))),
        };
        views.push(NodeView {
            id,
            state: node_state(n),
            gpus: cap.gpu_count,
            gpu_type: cap.gpu_type.clone(),
            features,
            memory_gb: u32::try_from(cap.memory_gb).unwrap_or(u32::MAX),
            cxl_memory_gb: cap
                .cxl_memory_gb
                .map(|c| u32::try_from(c).unwrap_or(u32::MAX))
                .unwrap_or(0),
            unified_memory: cap.unified_memory,
            topology_group: n.spec.topology_group.unwrap_or(0),
            conformance_fingerprint: fingerprint(
                st.and_then(|s| s.conformance_fingerprint.as_deref()),
            ),
            owner,
            sensitive_pool: n.spec.sensitive,
            // The intra-node terms of f₄ and the NIC preference, from what the agent
            // discovered (1 where it reported nothing: nothing to tell nodes apart by).
            // Rounded to hundredths: nodes of one kind whose measured bandwidths differ
            // in the last digits stay one node class (and one free-index bucket).
            gpu_link_fitness: hundredths(
                cap.gpu_topology
                    .as_ref()
                    .map_or(1.0, |t| t.link_fitness(cap.gpu_count)),
            ),
            memory_locality: hundredths(cap.memory_topology.as_ref().map_or(1.0, |m| m.locality())),
            nic_affinity: hundredths(
                cap.gpu_topology
                    .as_ref()
                    .map_or(1.0, |t| t.nic_affinity(cap.gpu_count)),
            ),
        });
        names.push(n.name_any().to_string());
        if let Some(o) = st.and_then(|s| s.owner.as_ref()) {
            if let (Some(t), Some(a)) = (&o.tenant, &o.allocation) {
                owned.entry((t.clone(), a.clone())).or_default().push(id);
            }
        }
    }
    let mut running = Vec::with_capacity(owned.len());
    let mut running_refs = Vec::with_capacity(owned.len());
    for ((tenant, name), ids) in owned {
        let a = allocations(&tenant, &name);
        let job = JobId(running.len() as u64);
        let tid = TenantId(tenants.id(&tenant));
        let r = match a {
            Some(a) => {
                let st = a.status.as_ref();
                let start = st
                    .and_then(|s| s.start_time.as_ref().or(s.scheduled_time.as_ref()))
                    .map(unix)
                    .unwrap_or(now);
                let vc = a.spec.vcluster.clone().unwrap_or_else(|| "default".into());
                RunningJob {
                    id: job,
                    tenant: tid,
                    vcluster: VClusterId(vclusters.id(&format!("{tenant}/{vc}"))),
                    nodes: ids,
                    preemption_class: a.spec.preemption_class.unwrap_or(5).clamp(0, 10) as u8,
                    sensitive: a.spec.sensitive,
                    start_time: start,
                    walltime_s: st
                        .and_then(|s| s.walltime_seconds)
                        .map(|w| w as i64)
                        .unwrap_or(UNBOUNDED_S),
                    runtime_key: Default::default(),
                    checkpoint: checkpoint(&a),
                    last_checkpoint: st.and_then(|s| s.last_checkpoint_time.as_ref()).map(unix),
                    gpus_per_node: a.spec.resources.constraints.gpu_count.unwrap_or(0),
                    checkpointing: lifecycle::preempt_requested(&a)
                        || a.phase() == AllocationPhase::Checkpointing,
                    // Set by the cycle, which knows the pending jobs (`mark_preemptors`).
                    preempted_for: None,
                    home_protected: false,
                }
            }
            // The owner vanished (release pending): busy, never a preemption victim.
            None => RunningJob {
                id: job,
                tenant: tid,
                vcluster: VClusterId(u32::MAX),
                nodes: ids,
                preemption_class: 10,
                sensitive: true,
                start_time: now,
                walltime_s: 60,
                runtime_key: Default::default(),
                checkpoint: CheckpointInfo::default(),
                last_checkpoint: None,
                gpus_per_node: 0,
                checkpointing: true,
                preempted_for: None,
                home_protected: false,
            },
        };
        running.push(r);
        running_refs.push((tenant, name));
    }
    Inventory {
        views,
        names,
        running,
        running_refs,
    }
}

/// Node- and GPU-hours of a tenant's running work within its budget period.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunningHours {
    pub node_hours: f64,
    pub gpu_hours: f64,
}

/// What each tenant's running work has used so far in its budget period (`period_s` of the
/// tenant, seconds): node-hours, and GPU-hours from the nodes' GPU counts (as the release
/// controller charges them when the work ends; a node missing from the inventory counts
/// as 1 GPU, the seed's default for unknown nodes).
pub fn running_hours(
    inv: &Inventory,
    now: i64,
    period_s: impl Fn(&str) -> i64,
) -> HashMap<String, RunningHours> {
    let mut out: HashMap<String, RunningHours> = HashMap::new();
    for (r, (tenant, _)) in inv.running.iter().zip(&inv.running_refs) {
        let since = r.start_time.max(now - period_s(tenant));
        let hours = (now - since).max(0) as f64 / 3600.0;
        if hours == 0.0 {
            continue;
        }
        let gpus: f64 = r
            .nodes
            .iter()
            .map(|n| {
                inv.views
                    .get(n.0 as usize)
                    .map_or(1.0, |v| f64::from(v.gpus))
            })
            .sum();
        let e = out.entry(tenant.clone()).or_default();
        e.node_hours += hours * r.nodes.len() as f64;
        e.gpu_hours += hours * gpus;
    }
    out
}

/// The vCluster's preemption policy, explicit or its scheduler type's default.
pub fn preemption_mode(vc: &VCluster) -> PreemptionMode {
    vc.spec.preemption.mode.unwrap_or(
        vc.spec
            .scheduler_type
            .unwrap_or(SchedulerType::HpcBackfill)
            .default_preemption(),
    )
}

/// Running work of `borrowed_nodes_only` vClusters (services) that holds no other
/// vCluster's home node is protected from priority preemption (`RunningJob::home_protected`).
pub fn protect_home_services(inv: &mut Inventory, home_only: &HashSet<VClusterId>) {
    if home_only.is_empty() {
        return;
    }
    for r in inv.running.iter_mut() {
        r.home_protected = home_only.contains(&r.vcluster)
            && r.nodes.iter().all(|n| {
                inv.views
                    .get(n.0 as usize)
                    .is_none_or(|v| v.owner.home.is_none_or(|h| h == r.vcluster))
            });
    }
}

/// The request for one more node of the running reactive allocation `a` (the autoscaler
/// raised `status.scale.desiredNodes`), as a job the core scores and places like any other:
/// one node of the allocation's kind, near the dragonfly groups it spans (most of its nodes
/// first), never a node this attempt already ran on (a node given back by a scale-down is
/// not taken again by the same attempt), within its conformance group when it needs one,
/// and never borrowed (a lender's reclaim could not take back part of an allocation).
pub fn scale_up_job(
    id: JobId,
    a: &Allocation,
    tenant: TenantId,
    vcluster: VClusterId,
    vc: &VCluster,
    now: i64,
    inv: &Inventory,
) -> PendingJob {
    let mut job = pending_job(id, a, tenant, vcluster, Some(vc), now);
    job.nodes = NodeRequest { min: 1, max: 1 };
    let st = a.status.as_ref();
    let index = |name: &str| inv.index_of(name);
    let assigned: Vec<usize> = st
        .map(|s| s.assigned_nodes.iter().filter_map(|n| index(n)).collect())
        .unwrap_or_default();
    let mut spans: BTreeMap<u32, usize> = BTreeMap::new();
    for &i in &assigned {
        *spans.entry(inv.views[i].topology_group).or_default() += 1;
    }
    let mut near: Vec<(u32, usize)> = spans.into_iter().collect();
    near.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let exclude = st
        .map(|s| {
            s.node_states
                .keys()
                .chain(&s.assigned_nodes)
                .chain(&s.releasing_nodes)
                .filter_map(|n| index(n).map(|i| NodeId(i as u32)))
                .collect()
        })
        .unwrap_or_default();
    let fingerprint = (job.constraints.require_conformance || job.sensitive)
        .then(|| {
            assigned
                .first()
                .map(|&i| inv.views[i].conformance_fingerprint)
        })
        .flatten();
    job.scale_up = Some(lattice_scheduler::ScaleUp {
        near_groups: near.into_iter().map(|(g, _)| g).collect(),
        exclude,
        fingerprint,
        home_only: true,
    });
    job
}

/// Victims still stopping (they hold their nodes, annotated `lattice.dev/preempt-requested`
/// with the preemptor's `tenant/name`) are marked with the pending job they stop for, so the
/// cycle lets that job wait for their nodes instead of preempting more (a preemption takes
/// a checkpoint's time; without this each cycle of the wait chose new victims). A bare name
/// (written by an older server) counts only when one queued allocation has it.
pub fn mark_preemptors(
    inv: &mut Inventory,
    queued: &[Arc<Allocation>],
    allocation: impl Fn(&str, &str) -> Option<Arc<Allocation>>,
) {
    // Only checkpointing work can have been preempted for someone (the common case under
    // a long queue is none: skip indexing the queue).
    if queued.is_empty() || !inv.running.iter().any(|r| r.checkpointing) {
        return;
    }
    let mut by_name: HashMap<String, Option<usize>> = HashMap::new();
    for (i, a) in queued.iter().enumerate() {
        let ns = a.namespace().unwrap_or("default");
        by_name.insert(format!("{ns}/{}", a.name_any()), Some(i));
        by_name
            .entry(a.name_any().to_string())
            .and_modify(|e| *e = None)
            .or_insert(Some(i));
    }
    for (r, (tenant, name)) in inv.running.iter_mut().zip(&inv.running_refs) {
        if !r.checkpointing {
            continue;
        }
        let preemptor = allocation(tenant, name).and_then(|v| {
            v.metadata
                .annotations
                .get(lifecycle::PREEMPT_ANNOTATION)
                .and_then(|by| by_name.get(by.as_str()).copied().flatten())
        });
        r.preempted_for = preemptor.map(|i| JobId(i as u64));
    }
}

fn checkpoint(a: &Allocation) -> CheckpointInfo {
    let strategy = a
        .spec
        .checkpoint
        .as_ref()
        .map(|c| c.strategy)
        .unwrap_or_default();
    CheckpointInfo {
        mode: match strategy {
            CheckpointStrategy::None => CheckpointMode::None,
            CheckpointStrategy::Manual => CheckpointMode::Manual,
            _ => CheckpointMode::Auto,
        },
        estimated_minutes: 5.0,
    }
}

/// A queued allocation as the core sees it.
pub fn pending_job(
    id: JobId,
    a: &Allocation,
    tenant: TenantId,
    vcluster: VClusterId,
    vc: Option<&VCluster>,
    now: i64,
) -> PendingJob {
    let c = &a.spec.resources.constraints;
    let submit = a
        .status
        .as_ref()
        .and_then(|s| s.submit_time.as_ref())
        .or(a.metadata.creation_timestamp.as_ref())
        .map(unix)
        .unwrap_or(now);
    // A reactive allocation's minNodes always come from its home vCluster (the seed's
    // minimum guarantee): a lender's reclaim could not take back part of it.
    let allow_borrow = reactive_start(a).is_none()
        && vc
            .and_then(|v| v.spec.borrowing.allow_borrow)
            .unwrap_or(false);
    let mut features = c.features.clone();
    // An image or a uenv runs only where the agent can run it.
    features.extend(
        lattice_apis::kinds::node::capability::needed(&a.spec)
            .into_iter()
            .map(|(c, _)| lattice_apis::kinds::node::capability::feature(c)),
    );
    features.sort();
    features.dedup();
    PendingJob {
        id,
        tenant,
        vcluster,
        nodes: match reactive_start(a) {
            // A reactive allocation starts at minNodes (the autoscaler adds the rest).
            Some(n) => NodeRequest { min: n, max: n },
            None => NodeRequest {
                min: a.spec.resources.nodes.min().max(1),
                max: a
                    .spec
                    .resources
                    .nodes
                    .max()
                    .max(a.spec.resources.nodes.min().max(1)),
            },
        },
        constraints: Constraints {
            gpu_type: c.gpu_type.clone(),
            min_gpus_per_node: c.gpu_count.unwrap_or(0),
            features,
            any_of: c.any_of.clone(),
            memory_gb_per_node: c
                .memory_gb
                .map(|m| u32::try_from(m).unwrap_or(u32::MAX))
                .unwrap_or(0),
            require_unified_memory: c.require_unified_memory,
            allow_cxl_memory: c.allow_cxl_memory,
            require_conformance: c.require_conformance,
            allow_borrowed: allow_borrow,
            gpu_heavy: c.gpu_count.map(|g| g > 0),
        },
        preemption_class: a.spec.preemption_class.unwrap_or(5).clamp(0, 10) as u8,
        sensitive: a.spec.sensitive,
        submit_time: submit,
        walltime_s: walltime_s(a, vc).map(|w| w as i64).unwrap_or(UNBOUNDED_S),
        runtime_key: Default::default(),
        checkpoint: checkpoint(a),
        data_readiness: None,
        scale_up: None,
    }
}

/// The node count a reactive allocation starts with: its `scalePolicy.minNodes`.
pub fn reactive_start(a: &Allocation) -> Option<u32> {
    use lattice_apis::LifecycleType;
    if a.spec.lifecycle.type_ != LifecycleType::Reactive {
        return None;
    }
    a.spec
        .lifecycle
        .scale_policy
        .as_ref()
        .map(|p| p.min_nodes.max(1))
}

/// Quotas and usage of a tenant for the core.
pub fn tenant_model(
    id: TenantId,
    t: &Tenant,
    total_nodes: u32,
    running: RunningHours,
    today: chrono::NaiveDate,
) -> lattice_scheduler::Tenant {
    let q = &t.spec.quota;
    let usage = t
        .status
        .as_ref()
        .map(|s| s.usage.clone())
        .unwrap_or_default();
    // The ledger holds finished work, by day: what is inside the rolling budget period as of
    // today (the stored totals are only re-rolled when work is charged); running work counts
    // up to now (the seed's internal budget ledger). When both budgets are set, the worse
    // fraction drives the penalty.
    let (ledger_nodes, ledger_gpus) = if usage.ledger.is_empty() {
        (usage.node_hours_used, usage.gpu_hours_used)
    } else {
        let period = t.spec.budget_period();
        let oldest = (today - chrono::Days::new(u64::from(period) - 1))
            .format("%Y-%m-%d")
            .to_string();
        usage
            .ledger
            .iter()
            .filter(|b| b.day >= oldest)
            .fold((0.0, 0.0), |(n, g), b| (n + b.node_hours, g + b.gpu_hours))
    };
    let node_frac = q
        .node_hours_budget
        .filter(|b| *b > 0.0)
        .map(|b| (ledger_nodes + running.node_hours) / b);
    let gpu_frac = q
        .gpu_hours_budget
        .filter(|b| *b > 0.0)
        .map(|b| (ledger_gpus + running.gpu_hours) / b);
    let budget_used = match (node_frac, gpu_frac) {
        (Some(n), Some(g)) => Some(n.max(g)),
        (n, g) => n.or(g),
    };
    lattice_scheduler::Tenant {
        id,
        quota: TenantQuota {
            max_nodes: q.max_nodes,
            max_concurrent_allocations: q.max_concurrent_allocations,
            target_share: q.fair_share_target.unwrap_or(0.0),
            burst_allowance: q.burst_allowance,
        },
        usage: TenantUsage {
            actual_share: if total_nodes == 0 {
                0.0
            } else {
                f64::from(usage.nodes) / f64::from(total_nodes)
            },
            budget_used,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weight names the API admits are exactly the scheduling core's score terms, in
    /// the same order, with the same aliases: a weight admitted is a weight used.
    #[test]
    fn admitted_weight_names_are_the_registered_terms() {
        use lattice_apis::kinds::vcluster::WEIGHT_TERMS;
        let core: Vec<(&str, Vec<&str>)> = lattice_scheduler::terms::REGISTRY
            .iter()
            .map(|t| (t.name(), t.aliases().to_vec()))
            .collect();
        assert_eq!(core.len(), WEIGHT_TERMS.len());
        for ((name, aliases), api) in core.iter().zip(WEIGHT_TERMS) {
            assert_eq!(*name, api.name);
            for a in api.aliases {
                assert!(aliases.contains(a), "{a} of {name}");
            }
        }
    }

    /// A vCluster's weights by name reach the core by name, unset ones from its profile.
    #[test]
    fn vcluster_weights_reach_the_core_by_name() {
        let vc: VCluster = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v", "namespace": "t"},
            "spec": {"schedulerType": "hpc-backfill", "weights": {"w2": 0.9, "checkpoint": 0.4}},
        }))
        .expect("vcluster");
        let cfg = scheduler_config(&vc);
        assert_eq!(cfg.weights.get("waitTime"), Some(0.9));
        assert_eq!(cfg.weights.get("checkpointEfficiency"), Some(0.4));
        assert_eq!(cfg.weights.get("priority"), Some(0.15), "hpc-batch's w1");
    }

    /// The seed (DAG failure handling): a requeued allocation "re-enters the scheduler
    /// queue with its original priority": its class and its wait since the original
    /// submission, not since the requeue.
    #[test]
    fn a_requeued_allocation_keeps_its_original_priority() {
        let mut a: Allocation = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "step", "namespace": "t1",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"entrypoint": "/bin/true", "preemptionClass": 7,
                     "lifecycle": {"walltime": "1h"}},
            "status": {"phase": "Running", "submitTime": "2026-01-01T00:00:00Z",
                       "startTime": "2026-01-01T01:00:00Z", "assignedNodes": ["n1"],
                       "attempt": 0},
        }))
        .expect("allocation");
        let t0 = unix(a.metadata.creation_timestamp.as_ref().expect("created"));
        let now: lattice_apis::meta::Time = "2026-01-01T02:00:00Z".parse().expect("time");
        assert!(lifecycle::node_failed(&mut a, "n1", now));
        assert_eq!(a.phase(), AllocationPhase::Pending, "{:?}", a.status);
        assert!(is_queued(&a));
        let job = pending_job(JobId(1), &a, TenantId(0), VClusterId(0), None, unix(&now));
        assert_eq!(job.submit_time, t0);
        assert_eq!(job.preemption_class, 7);
    }

    /// `resources.constraints.anyOf` reaches the core: a node with one alternative of each
    /// group qualifies, a node without one does not.
    #[test]
    fn any_of_feature_groups_reach_the_core() {
        use lattice_scheduler::catalog::{FilterOutcome, NodeCatalog};
        let a: Allocation = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "t1"},
            "spec": {"entrypoint": "/bin/true", "resources": {"constraints": {
                "features": ["nvme"], "anyOf": [["a100", "h100"]]}}},
        }))
        .expect("allocation");
        let job = pending_job(JobId(1), &a, TenantId(0), VClusterId(0), None, 0);
        assert_eq!(job.constraints.any_of, [["a100", "h100"]]);
        let node = |i: u32, features: &[&str]| {
            let mut v = NodeView::slot(i);
            v.features = features.iter().map(|f| f.to_string()).collect();
            v
        };
        let cat = NodeCatalog::new(vec![node(0, &["h100", "nvme"]), node(1, &["nvme"])]);
        assert!(matches!(
            cat.filter(cat.class_of(0), &job),
            FilterOutcome::Feasible { .. }
        ));
        assert_eq!(cat.filter(cat.class_of(1), &job), FilterOutcome::Features);
    }

    /// An image job needs a node whose agent runs OCI images (`status.agent.capabilities`
    /// become `lattice.dev/<capability>` features of the node).
    #[test]
    fn work_goes_only_where_the_agent_can_run_it() {
        use lattice_scheduler::catalog::{FilterOutcome, NodeCatalog};
        let a: Allocation = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "t1"},
            "spec": {"entrypoint": "/bin/true", "environment": {"image": "ubuntu:24.04"}},
        }))
        .expect("allocation");
        let job = pending_job(JobId(1), &a, TenantId(0), VClusterId(0), None, 0);
        assert_eq!(job.constraints.features, ["lattice.dev/oci"]);
        let node = |i: u32, features: &[&str]| {
            let mut v = NodeView::slot(i);
            v.features = features.iter().map(|f| f.to_string()).collect();
            v
        };
        let cat = NodeCatalog::new(vec![node(0, &["lattice.dev/oci"]), node(1, &[])]);
        assert!(matches!(
            cat.filter(cat.class_of(0), &job),
            FilterOutcome::Feasible { .. }
        ));
        assert_eq!(cat.filter(cat.class_of(1), &job), FilterOutcome::Features);
    }

    fn vcluster(spec: serde_json::Value) -> VCluster {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "svc", "namespace": "t1"}, "spec": spec}))
        .expect("vcluster")
    }

    /// A vCluster's `maxWalltime` holds for work written to the store behind admission
    /// too: longer or unbounded work waits with a reason, never starts.
    #[test]
    fn max_walltime_holds_at_the_scheduler() {
        let vc = vcluster(serde_json::json!({"schedulerType": "hpc-backfill",
                                             "maxWalltime": "2h"}));
        let alloc = |lifecycle: serde_json::Value| -> Allocation {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "a", "namespace": "t1"},
                "spec": {"entrypoint": "/bin/true", "lifecycle": lifecycle}}))
            .expect("allocation")
        };
        assert!(within_max_walltime(&alloc(serde_json::json!({"walltime": "1h"})), &vc).is_ok());
        assert!(within_max_walltime(&alloc(serde_json::json!({"walltime": "2h"})), &vc).is_ok());
        let e = within_max_walltime(&alloc(serde_json::json!({"walltime": "3h"})), &vc)
            .expect_err("3h > 2h");
        assert!(e.contains("maxWalltime 2h"), "{e}");
        let e = within_max_walltime(&alloc(serde_json::json!({"type": "unbounded"})), &vc)
            .expect_err("unbounded");
        assert!(e.contains("give it a walltime"), "{e}");
        let open = vcluster(serde_json::json!({"schedulerType": "hpc-backfill"}));
        assert!(within_max_walltime(&alloc(serde_json::json!({"walltime": "30d"})), &open).is_ok());
    }

    /// The seed's preemption table: services preempt only by taking back their lent nodes
    /// (reclaim, outside the class rules), and their work on home nodes is never a victim.
    #[test]
    fn borrowed_nodes_only_never_preempts_by_class_and_protects_home_work() {
        let svc = vcluster(serde_json::json!({"schedulerType": "service-binpack"}));
        assert_eq!(preemption_mode(&svc), PreemptionMode::BorrowedNodesOnly);
        assert!(!scheduler_config(&svc).preemption.enabled);
        let hpc = vcluster(serde_json::json!({"schedulerType": "hpc-backfill"}));
        assert!(scheduler_config(&hpc).preemption.enabled);
        let never = vcluster(serde_json::json!({"schedulerType": "hpc-backfill",
                                                "preemption": {"mode": "never"}}));
        assert!(!scheduler_config(&never).preemption.enabled);
        // Backfill depth 0 is first-fit, the default 1 is EASY, more reserves further.
        let depth = |d: u32| {
            scheduler_config(&vcluster(
                serde_json::json!({"schedulerType": "hpc-backfill", "backfillDepth": d}),
            ))
            .discipline
        };
        assert_eq!(depth(0), Discipline::Greedy);
        assert_eq!(depth(20), Discipline::Backfill { depth: 20 });
        assert_eq!(
            scheduler_config(&hpc).discipline,
            Discipline::Backfill { depth: 1 }
        );

        // Node 0 is the service's home, node 1 another vCluster's, node 2 shared.
        let (svc_id, other) = (VClusterId(1), VClusterId(2));
        let view = |i: u32, home: Option<VClusterId>| {
            let mut v = NodeView::slot(i);
            v.owner.home = home;
            v
        };
        let job = |id: u64, vc: VClusterId, nodes: &[u32]| {
            RunningJob::new(
                JobId(id),
                TenantId(0),
                vc,
                nodes.iter().map(|&n| NodeId(n)).collect(),
            )
        };
        let mut inv = Inventory {
            views: vec![view(0, Some(svc_id)), view(1, Some(other)), view(2, None)],
            names: vec!["n0".into(), "n1".into(), "n2".into()],
            running: vec![
                job(0, svc_id, &[0]),
                job(1, svc_id, &[1]),
                job(2, svc_id, &[2]),
                job(3, other, &[0]),
            ],
            running_refs: vec![Default::default(); 4],
        };
        protect_home_services(&mut inv, &HashSet::from([svc_id]));
        let protected: Vec<bool> = inv.running.iter().map(|r| r.home_protected).collect();
        // Home and shared nodes: protected; on another vCluster's home node: reclaimable;
        // other vClusters' work: as before.
        assert_eq!(protected, [true, false, true, false]);
    }

    /// A defaulted hpc-backfill vCluster runs the core's hpc-backfill prediction setting
    /// (the figures in the scheduler README), every estimator the API names is registered
    /// in the core, and a vCluster's choices reach the core.
    #[test]
    fn runtime_prediction_reaches_the_core() {
        use lattice_apis::kinds::vcluster::RuntimeEstimator as Api;
        use lattice_apis::Resource;
        let mut hpc = vcluster(serde_json::json!({"schedulerType": "hpc-backfill"}));
        hpc.default_fields();
        let core = SchedulerConfig::for_kind(SchedulerKind::HpcBackfill);
        let cfg = scheduler_config(&hpc);
        assert_eq!(cfg.prediction, core.prediction);
        assert_eq!(cfg.backfill_order, core.backfill_order);
        for e in [
            Api::None,
            Api::UserLast2,
            Api::UserJobLast2,
            Api::UserFraction2,
            Api::UserJobFraction2,
        ] {
            if let Some(name) = e.name() {
                assert!(
                    lattice_scheduler::predict::estimator(name).is_some(),
                    "{name}"
                );
                assert_eq!(serde_json::to_value(e).expect("name"), name);
            }
        }
        let mut tuned = vcluster(serde_json::json!({"schedulerType": "hpc-backfill",
            "backfillOrder": "best-fit",
            "runtimePrediction": {"estimator": "user-job-last2", "correction": "gradual",
                                  "runningEnds": "predicted", "guaranteeAfter": "never"}}));
        tuned.default_fields();
        let cfg = scheduler_config(&tuned);
        assert_eq!(
            cfg.backfill_order,
            lattice_scheduler::BackfillOrder::BestFit
        );
        assert_eq!(
            cfg.prediction,
            lattice_scheduler::PredictionConfig {
                estimator: Some("user-job-last2".into()),
                correction: lattice_scheduler::Correction::Gradual,
                running_ends: lattice_scheduler::RunningEnds::Predicted,
                guarantee_after_s: None,
            }
        );
        let off = vcluster(serde_json::json!({"schedulerType": "hpc-backfill",
            "runtimePrediction": {"estimator": "none"}}));
        assert!(!scheduler_config(&off).prediction.enabled());
    }

    /// The seed's internal budget ledger: running work counts up to now (within the budget
    /// period), GPUs from the nodes (1 for a node without), and the worse of the GPU- and
    /// node-hours fractions drives the penalty.
    #[test]
    fn budgets_count_running_work_and_the_worse_fraction() {
        let view = |i: u32, gpus: u32| {
            let mut v = NodeView::slot(i);
            v.gpus = gpus;
            v
        };
        let job = |nodes: &[u32], start: i64| RunningJob {
            start_time: start,
            walltime_s: 36_000,
            ..RunningJob::new(
                JobId(0),
                TenantId(0),
                VClusterId(0),
                nodes.iter().map(|&n| NodeId(n)).collect(),
            )
        };
        let now = 100 * 3600;
        let inv = Inventory {
            views: vec![view(0, 4), view(1, 0)],
            names: vec!["n0".into(), "n1".into()],
            // 2 h on both nodes (4 + 1 GPUs); a job started before the 10-h period counts
            // from its start.
            running: vec![job(&[0, 1], now - 2 * 3600), job(&[1], now - 50 * 3600)],
            running_refs: vec![("a".into(), "j1".into()), ("a".into(), "j2".into())],
        };
        let used = running_hours(&inv, now, |_| 10 * 3600);
        let a = used["a"];
        assert_eq!(a.node_hours, 2.0 * 2.0 + 10.0);
        // The CPU node has no GPUs: 2 h on 4 GPUs.
        assert_eq!(a.gpu_hours, 2.0 * 4.0);
        let today: chrono::NaiveDate = "2026-03-10".parse().expect("day");
        let tenant: Tenant = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"budgetPeriodDays": 7,
                     "quota": {"nodeHoursBudget": 100.0, "gpuHoursBudget": 40.0}},
            "status": {"usage": {
                // Stale totals (the last charge was long ago): the ledger's days decide.
                "nodeHoursUsed": 506.0, "gpuHoursUsed": 510.0,
                "ledger": [
                    {"day": "2026-01-01", "user": "u", "nodeHours": 500.0, "gpuHours": 500.0},
                    {"day": "2026-03-04", "user": "u", "nodeHours": 6.0, "gpuHours": 10.0},
                ]}},
        }))
        .expect("tenant");
        let t = tenant_model(TenantId(0), &tenant, 2, a, today);
        // node-hours (6 + 14) / 100 = 0.2; GPU-hours (10 + 8) / 40 = 0.45: the worse.
        assert!((t.usage.budget_used.expect("used") - 0.45).abs() < 1e-12);
        let t = tenant_model(TenantId(0), &tenant, 2, RunningHours::default(), today);
        assert_eq!(t.usage.budget_used, Some(0.25));
        // A week later the March 4 work has left the period too.
        let later = today + chrono::Days::new(7);
        let t = tenant_model(TenantId(0), &tenant, 2, RunningHours::default(), later);
        assert_eq!(t.usage.budget_used, Some(0.0));
    }
}
