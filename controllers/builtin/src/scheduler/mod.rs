//! The live scheduler: one loop per vCluster over the shared informer caches, running the
//! pure core (`lattice_scheduler`) and turning its plan into binding transactions.
//!
//! Each loop cycles every `spec.cycleInterval` and is woken early (debounced) by changes
//! that can make a difference: a queued allocation of its own, any node change (nodes
//! freed, drained, registered), any tenant change. Loops of different vCluster race for
//! shared nodes only through the guarded binding transaction, so they need no locks.

pub mod adapter;
pub mod bind;
pub mod claim;
pub mod extender;
pub mod grow;
pub mod history;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_apis::kinds::vcluster::PreemptionMode;
use lattice_apis::meta::now;
use lattice_apis::{lifecycle, Allocation, Node, Tenant, VCluster};
use lattice_runtime::informer::InformerEvent;
use lattice_runtime::reflector::Store;
use lattice_runtime::{Api, HostContext, Patch, PatchParams, ResourceExt};
use lattice_scheduler::{
    ClusterSnapshot, JobId, NodeCatalog, PendingReason, ProposalKind, Scheduler, TenantId,
    VClusterId,
};
use lattice_store::KvBackend;
use serde_json::json;
use tokio::sync::{broadcast, Notify};

use crate::metrics::SchedulerMetrics;
use crate::objects::GuardedWrite;
use crate::AbortOnDrop;
use adapter::{Interner, VClusterKey};
use bind::{BindOutcome, Binding};

/// Shortest pause between two cycles of one vCluster: changes arriving within it are
/// handled by one cycle.
const DEBOUNCE: Duration = Duration::from_millis(5);

/// The pause after a cycle is at least this many times the cycle's computing time (see
/// `vcluster_loop`): a scheduler busy with a long queue computes on at most a twentieth
/// of a core (wall time: a 110,000 queue computes for ≈0.1–0.2 s, so the next cycle comes
/// 2–4 s later; a queue of hundreds, well under a millisecond: no delay).
const PACE: u32 = 19;

/// What every vCluster loop shares.
pub struct Shared {
    backend: Arc<dyn KvBackend>,
    allocations: Store<Allocation>,
    nodes: Store<Node>,
    tenants: Store<Tenant>,
    vclusters: Store<VCluster>,
    api: Api<Allocation>,
    metrics: SchedulerMetrics,
    reasons: ReasonQueue,
    /// Finished allocations' runtimes, refreshed in the background ([`history`]).
    history: Arc<history::HistoryCache>,
    /// Asks the vClusters' scheduler extenders ([`extender`]).
    http: reqwest::Client,
}

/// Run the scheduler until dropped (the controller host drops it on losing leadership).
pub async fn run(ctx: HostContext, backend: Arc<dyn KvBackend>, metrics: SchedulerMetrics) {
    let allocs = ctx.factory.all::<Allocation>();
    let nodes = ctx.factory.all::<Node>();
    let tenants = ctx.factory.all::<Tenant>();
    let vclusters = ctx.factory.all::<VCluster>();
    let mut alloc_rx = allocs.subscribe();
    let mut node_rx = nodes.subscribe();
    let mut tenant_rx = tenants.subscribe();
    let mut vc_rx = vclusters.subscribe();
    allocs.store().wait_until_synced().await;
    nodes.store().wait_until_synced().await;
    tenants.store().wait_until_synced().await;
    vclusters.store().wait_until_synced().await;
    let history = Arc::new(history::HistoryCache::default());
    if let Err(e) = history.load(&backend).await {
        tracing::warn!(error = %e, "runtime history not read yet; planning on walltimes until it is");
    }
    let _history_refresh = AbortOnDrop(tokio::spawn(history::refresh_loop(
        backend.clone(),
        history.clone(),
    )));
    let shared = Arc::new(Shared {
        backend,
        allocations: allocs.store(),
        nodes: nodes.store(),
        tenants: tenants.store(),
        vclusters: vclusters.store(),
        api: Api::all(ctx.client.clone()),
        metrics,
        reasons: ReasonQueue::default(),
        history,
        http: extender::client(),
    });
    let _reason_writer = AbortOnDrop(tokio::spawn(reason_writer(shared.clone())));
    ctx.set_ready(true);
    tracing::info!("scheduler started");

    // Dropping a loop's handle (vCluster gone, or this future dropped) aborts it.
    let mut loops: HashMap<VClusterKey, (Arc<Notify>, AbortOnDrop)> = HashMap::new();
    let sync_loops = |loops: &mut HashMap<VClusterKey, (Arc<Notify>, AbortOnDrop)>| {
        let want: Vec<VClusterKey> = shared
            .vclusters
            .state()
            .iter()
            .filter(|v| !v.is_deleting())
            .map(|v| {
                (
                    v.namespace().unwrap_or_default().to_string(),
                    v.name_any().to_string(),
                )
            })
            .collect();
        loops.retain(|k, _| {
            let keep = want.contains(k);
            if !keep {
                tracing::info!(vcluster = %format!("{}/{}", k.0, k.1), "scheduler loop stopped");
            }
            keep
        });
        for k in want {
            loops.entry(k.clone()).or_insert_with(|| {
                let notify = Arc::new(Notify::new());
                let h = tokio::spawn(vcluster_loop(shared.clone(), k.clone(), notify.clone()));
                tracing::info!(vcluster = %format!("{}/{}", k.0, k.1), "scheduler loop started");
                (notify, AbortOnDrop(h))
            });
        }
    };
    sync_loops(&mut loops);
    let notify_all = |loops: &HashMap<VClusterKey, (Arc<Notify>, AbortOnDrop)>| {
        for (n, _) in loops.values() {
            n.notify_one();
        }
    };
    loop {
        tokio::select! {
            ev = alloc_rx.recv() => match ev {
                Ok(InformerEvent::Applied(a)) => {
                    if adapter::is_queued(&a) || grow::wants_node(&a) {
                        let exists = |k: &VClusterKey| loops.contains_key(k);
                        if let Ok(k) = adapter::resolve_vcluster(&a, exists) {
                            if let Some((n, _)) = loops.get(&k) {
                                n.notify_one();
                            }
                        }
                    }
                    // A terminal allocation frees nodes through the release controller,
                    // which shows up here as a node event.
                }
                Ok(InformerEvent::Deleted(_)) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => notify_all(&loops),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            ev = node_rx.recv() => match ev {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => notify_all(&loops),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            ev = tenant_rx.recv() => match ev {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => notify_all(&loops),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            ev = vc_rx.recv() => match ev {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    sync_loops(&mut loops);
                    notify_all(&loops);
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

async fn vcluster_loop(shared: Arc<Shared>, key: VClusterKey, notify: Arc<Notify>) {
    let label = format!("{}/{}", key.0, key.1);
    let mut last_status = Instant::now() - Duration::from_secs(60);
    loop {
        let interval = shared
            .vclusters
            .get_named(Some(&key.0), &key.1)
            .and_then(|v| v.spec.cycle_interval.clone())
            .and_then(|d| lattice_apis::duration::parse_duration(&d).ok())
            .unwrap_or(15)
            .max(1);
        let started = Instant::now();
        let mut earliest = tokio::time::Instant::now();
        match cycle(&shared, &key).await {
            Ok(stats) => {
                shared
                    .metrics
                    .observe_cycle(&label, started.elapsed(), &stats);
                if last_status.elapsed() >= Duration::from_secs(2) {
                    last_status = Instant::now();
                    write_vcluster_status(&shared, &key, &stats, started.elapsed()).await;
                }
                // A cycle's computing grows with the queue: under a long one the next
                // cycle starts no sooner than PACE times this one's computing time after
                // it, so arrivals gather into fewer cycles and the scheduler leaves the
                // CPU to the rest. Store writes do not count (waiting costs no CPU), so
                // a small queue (the usual case) delays nothing.
                earliest += stats.compute_time * (PACE + 1);
                if stats.retry_soon {
                    // A lost race or a node still being released: try again shortly.
                    let soon = tokio::time::Instant::now() + Duration::from_millis(50);
                    tokio::time::sleep_until(soon.max(earliest)).await;
                    continue;
                }
            }
            Err(e) => tracing::warn!(vcluster = %label, error = %e, "scheduling cycle failed"),
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(interval)) => {}
        }
        tokio::time::sleep_until((tokio::time::Instant::now() + DEBOUNCE).max(earliest)).await;
    }
}

/// One batched request per extender of `vc` for this cycle ([`extender`]): the queued
/// allocations (scale-ups are not sent) and the Ready nodes.
async fn ask_extenders(
    shared: &Shared,
    vc: &VCluster,
    key: &VClusterKey,
    queued: &[Arc<Allocation>],
    pending: &[lattice_scheduler::PendingJob],
    inv: &adapter::Inventory,
) -> extender::Verdict {
    let label = format!("{}/{}", key.0, key.1);
    let jobs: Vec<(&Allocation, &lattice_scheduler::PendingJob)> =
        queued.iter().map(Arc::as_ref).zip(pending).collect();
    let node_objs: Vec<Option<Arc<Node>>> = inv
        .names
        .iter()
        .map(|n| shared.nodes.get_named(None, n))
        .collect();
    let nodes: Vec<(&str, Option<&Node>, &lattice_scheduler::NodeView)> = inv
        .views
        .iter()
        .filter(|v| v.state == lattice_scheduler::NodeState::Ready)
        .map(|v| {
            let i = v.id.0 as usize;
            (inv.names[i].as_str(), node_objs[i].as_deref(), v)
        })
        .collect();
    let all: Vec<String> = nodes.iter().map(|(n, _, _)| n.to_string()).collect();
    let req = extender::request(&label, &jobs, &nodes);
    extender::consult(
        &shared.http,
        &shared.metrics,
        &label,
        &vc.spec.extenders,
        &req,
        &all,
        pending.len(),
    )
    .await
}

/// Figures of one cycle.
#[derive(Debug, Default)]
pub struct CycleStats {
    /// Allocations queued in this vCluster.
    pub pending: usize,
    /// Allocations running in this vCluster (by node ownership).
    pub running: usize,
    /// Proposals committed.
    pub bound: usize,
    /// Proposals lost to a conflicting write.
    pub conflicts: usize,
    /// Bound by backfill.
    pub backfilled: usize,
    /// Preemptions requested for priority.
    pub preemptions: usize,
    /// Borrowers sent back from this vCluster's home nodes.
    pub reclaims: usize,
    /// Claims of named nodes granted.
    pub claims_granted: usize,
    /// Claims failed with `OwnershipConflict`.
    pub claims_conflicted: usize,
    /// Claims failed for another reason (unknown node, wrong pool, quota, ...).
    pub claims_rejected: usize,
    /// Nodes this vCluster could use.
    pub nodes: usize,
    /// Idle among those.
    pub idle_nodes: usize,
    /// Time in the pure core.
    pub core_time: Duration,
    /// Time the cycle spent computing (until its plan was ready, then formatting and
    /// encoding pending reasons), not waiting for store writes: the work that grows with
    /// the queue.
    pub compute_time: Duration,
    /// Run again soon (conflict).
    pub retry_soon: bool,
}

/// One scheduling cycle of vCluster `key`.
pub async fn cycle(shared: &Shared, key: &VClusterKey) -> anyhow::Result<CycleStats> {
    let begun = Instant::now();
    let mut stats = CycleStats::default();
    let Some(vc) = shared.vclusters.get_named(Some(&key.0), &key.1) else {
        return Ok(stats);
    };
    let now_t = now();
    let now_s = now_t.timestamp();
    let vclusters_all = shared.vclusters.state();
    let exists = |k: &VClusterKey| {
        vclusters_all
            .iter()
            .any(|v| v.namespace() == Some(k.0.as_str()) && v.name_any() == k.1)
    };
    let mut vc_ids = Interner::default();
    let mut tenant_ids = Interner::default();
    let self_id = VClusterId(vc_ids.id(&format!("{}/{}", key.0, key.1)));
    let mut home_of: HashMap<String, VClusterKey> = HashMap::new();
    // vClusters that keep their idle home nodes to themselves.
    let private: HashSet<String> = vclusters_all
        .iter()
        .filter(|v| v.spec.borrowing.allow_lend == Some(false))
        .map(|v| format!("{}/{}", v.namespace().unwrap_or_default(), v.name_any()))
        .collect();
    for v in &vclusters_all {
        for n in &v.spec.home_nodes {
            home_of.insert(
                n.clone(),
                (
                    v.namespace().unwrap_or_default().to_string(),
                    v.name_any().to_string(),
                ),
            );
        }
    }
    let nodes = shared.nodes.state();
    let allocs = &shared.allocations;
    let lookup = |t: &str, n: &str| allocs.get_named(Some(t), n);
    let mut inv = adapter::inventory(
        &nodes,
        &lookup,
        &mut vc_ids,
        &mut tenant_ids,
        &home_of,
        &private,
        now_s,
    );
    stats.running = inv.running.iter().filter(|r| r.vcluster == self_id).count();
    // Reactive allocations the autoscaler wants bigger: one node each per cycle, placed by
    // the core like any job (`PendingJob::scale_up`), after the queue below.
    let growing = growing_here(shared, key);

    // The queue of this vCluster; a queued allocation whose vCluster is missing gets told.
    let mut queued: Vec<Arc<Allocation>> = Vec::new();
    let mut unresolved: Vec<(Arc<Allocation>, String)> = Vec::new();
    for (i, a) in allocs.find(adapter::is_queued).into_iter().enumerate() {
        if i % YIELD_EVERY == YIELD_EVERY - 1 {
            tokio::task::yield_now().await;
        }
        match adapter::resolve_vcluster(&a, exists) {
            Ok(k) if &k == key => queued.push(a),
            Ok(_) => {}
            Err(msg) if key.0 == "default" && key.1 == "default" => unresolved.push((a, msg)),
            Err(_) => {}
        }
    }
    for (a, msg) in unresolved {
        explain(shared, &a, "vcluster_not_found", &msg).await;
    }
    queued.sort_by(|a, b| (a.namespace(), a.name_any()).cmp(&(b.namespace(), b.name_any())));
    stats.pending = queued.len();
    // What this vCluster's finished work ran for (read in the background, not here).
    let histories = shared.history.view();
    let vc_history = histories.vcluster(key);
    let mut job_of = |i: usize, a: &Allocation| {
        let t = TenantId(tenant_ids.id(a.namespace().unwrap_or("default")));
        let mut job = adapter::pending_job(JobId(i as u64), a, t, self_id, Some(&vc), now_s);
        if let Some(h) = vc_history {
            job.runtime_key = h.key_of(a);
        }
        job
    };
    // Claims of named nodes are judged and bound first, oldest first; the core places the rest.
    let (claims, queued): (Vec<Arc<Allocation>>, Vec<Arc<Allocation>>) = queued
        .into_iter()
        .partition(|a| !a.spec.resources.node_names.is_empty());
    if !claims.is_empty() {
        let mut claims: Vec<(Arc<Allocation>, lattice_scheduler::PendingJob)> = claims
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let j = job_of(i, &a);
                (a, j)
            })
            .collect();
        claims.sort_by_key(|x| (x.1.submit_time, x.1.id));
        let catalog = NodeCatalog::new(inv.views.clone());
        let label = format!("{}/{}", key.0, key.1);
        claim::process(shared, &vc, &label, &claims, &mut inv, &catalog, &mut stats).await?;
    }
    // The vCluster's walltime limit holds here too, not only at admission: work admitted
    // before the limit was lowered, or written around the API, waits with the reason.
    let (queued, too_long): (Vec<Arc<Allocation>>, Vec<Arc<Allocation>>) = queued
        .into_iter()
        .partition(|a| adapter::within_max_walltime(a, &vc).is_ok());
    for a in &too_long {
        if let Err(msg) = adapter::within_max_walltime(a, &vc) {
            explain(shared, a, "walltime_exceeds_limit", &msg).await;
        }
    }
    // Allocations no store transaction can bind are told so and kept out of the plan, so
    // nodes are not held for them cycle after cycle.
    let max_ops = shared.backend.max_txn_ops();
    let (queued, too_large): (Vec<Arc<Allocation>>, Vec<Arc<Allocation>>) = queued
        .into_iter()
        .partition(|a| bind::ops_for_nodes(start_nodes(a), a.spec.sensitive) <= max_ops);
    for a in &too_large {
        let n = start_nodes(a);
        let msg = too_large_message(n, bind::ops_for_nodes(n, a.spec.sensitive), max_ops);
        explain(shared, a, "too_large_for_one_transaction", &msg).await;
    }
    let mut pending: Vec<lattice_scheduler::PendingJob> = queued
        .iter()
        .enumerate()
        .map(|(i, a)| job_of(i, a))
        .collect();
    // Scale-ups follow the queue: job ids from `queued.len()` on are `growing`'s.
    for (k, a) in growing.iter().enumerate() {
        let t = TenantId(tenant_ids.id(a.namespace().unwrap_or("default")));
        let id = JobId((queued.len() + k) as u64);
        pending.push(adapter::scale_up_job(id, a, t, self_id, &vc, now_s, &inv));
    }
    let name_of = |job: JobId| -> Option<&Arc<Allocation>> {
        let i = job.0 as usize;
        queued.get(i).or_else(|| growing.get(i - queued.len()))
    };
    let busy: usize = inv.running.iter().map(|r| r.nodes.len()).sum();
    stats.idle_nodes = inv
        .views
        .iter()
        .filter(|v| v.state == lattice_scheduler::NodeState::Ready)
        .count()
        .saturating_sub(busy);
    stats.nodes = inv.views.len();
    if pending.is_empty() {
        return Ok(stats);
    }
    // What the core needs about running work only when something is pending.
    adapter::mark_preemptors(&mut inv, &queued, |t, n| allocs.get_named(Some(t), n));
    let home_only: HashSet<VClusterId> = vclusters_all
        .iter()
        .filter(|v| adapter::preemption_mode(v) == PreemptionMode::BorrowedNodesOnly)
        .map(|v| {
            let k = format!("{}/{}", v.namespace().unwrap_or_default(), v.name_any());
            VClusterId(vc_ids.id(&k))
        })
        .collect();
    adapter::protect_home_services(&mut inv, &home_only);
    // This vCluster's running work is expected to end when its users' history says (the
    // start times shown to queued allocations); its kill time stays its walltime.
    if let Some(h) = vc_history {
        for (r, (t, n)) in inv.running.iter_mut().zip(&inv.running_refs) {
            if let Some(a) = allocs.get_named(Some(t), n) {
                if adapter::resolve_vcluster(&a, exists).as_ref() == Ok(key) {
                    r.runtime_key = h.key_of(&a);
                }
            }
        }
    }
    let total_nodes = inv.views.len() as u32;
    // Each tenant's budget period, looked up once (running work is many jobs per tenant).
    let default_period =
        i64::from(lattice_apis::kinds::tenant::TenantSpec::default().budget_period()) * 86_400;
    let periods: HashMap<String, i64> = shared
        .tenants
        .state()
        .iter()
        .map(|t| {
            let days = t.spec.budget_period();
            (t.name_any().to_string(), i64::from(days) * 86_400)
        })
        .collect();
    let running = adapter::running_hours(&inv, now_s, |tenant| {
        periods.get(tenant).copied().unwrap_or(default_period)
    });
    let mut tenants: Vec<lattice_scheduler::Tenant> = shared
        .tenants
        .state()
        .iter()
        .map(|t| {
            let used = running.get(t.name_any()).copied().unwrap_or_default();
            adapter::tenant_model(
                TenantId(tenant_ids.id(t.name_any())),
                t,
                total_nodes,
                used,
                now_t.date_naive(),
            )
        })
        .collect();
    tenants.sort_by_key(|t| t.id);
    let mut config = adapter::scheduler_config(&vc);
    config.vcluster = Some(self_id);
    let mut views = inv.views.clone();
    let mut external = lattice_scheduler::ExternalScores::default();
    if !vc.spec.extenders.is_empty() {
        let verdict = ask_extenders(shared, &vc, key, &queued, &pending, &inv).await;
        if let Some(why) = verdict.blocked {
            // failurePolicy: fail — nothing of this vCluster is placed without it.
            let items: Vec<(&Allocation, &str, String)> = queued
                .iter()
                .map(|a| (a.as_ref(), "extender_unavailable", why.clone()))
                .collect();
            explain_all(shared, &items).await;
            stats.compute_time = begun.elapsed();
            return Ok(stats);
        }
        for v in &mut views {
            if verdict.filtered.contains(&inv.names[v.id.0 as usize]) {
                // Not schedulable for this cycle of this vCluster; running work stays.
                v.state = lattice_scheduler::NodeState::Drained;
            }
        }
        external = verdict.scores;
    }
    let started = Instant::now();
    let catalog = NodeCatalog::new(views);
    let snap = ClusterSnapshot {
        now: now_s,
        running: &inv.running,
        pending: &pending,
        tenants: &tenants,
        energy_price: 0.0,
        history: vc_history.map(|h| &h.history),
    };
    let plan = Scheduler::new(config)
        .with_external_scores(external)
        .cycle(&catalog, &snap);
    stats.core_time = started.elapsed();
    stats.compute_time = begun.elapsed();

    // Bindings, batched per tenant: one transaction per tenant per cycle, split where a
    // batch would exceed the store's operations per transaction.
    let mut by_tenant: BTreeMap<String, Vec<(Binding, bool)>> = BTreeMap::new();
    let vcluster_label = format!("{}/{}", key.0, key.1);
    for p in &plan.proposals {
        let Some(a) = name_of(p.job) else { continue };
        match &p.kind {
            ProposalKind::ScaleUp => {
                let Some(node_id) = p.nodes.first() else {
                    continue;
                };
                let node = inv.names[node_id.0 as usize].clone();
                scale_up(shared, a, &node, &vcluster_label, &mut stats).await?;
            }
            ProposalKind::Preempt { victims, reclaim } => {
                for v in victims {
                    let (t, n) = &inv.running_refs[v.0 as usize];
                    if let Some(victim) = allocs.get_named(Some(t), n) {
                        let by = format!("{}/{}", a.namespace().unwrap_or("default"), a.name_any());
                        request_preemption(shared, &victim, &by).await;
                        if *reclaim {
                            stats.reclaims += 1;
                        } else {
                            stats.preemptions += 1;
                        }
                    }
                }
                let msg = if *reclaim {
                    format!(
                        "reclaiming home nodes lent to {} allocation(s) of other vClusters",
                        victims.len()
                    )
                } else {
                    format!("preempting {} allocation(s) to make room", victims.len())
                };
                explain(shared, a, "waiting_for_preemption", &msg).await;
            }
            _ => {
                let tenant = a.namespace().unwrap_or("default").to_string();
                by_tenant.entry(tenant.clone()).or_default().push((
                    Binding {
                        tenant,
                        name: a.name_any().to_string(),
                        nodes: p
                            .nodes
                            .iter()
                            .map(|n| inv.names[n.0 as usize].clone())
                            .collect(),
                        vcluster: format!("{}/{}", key.0, key.1),
                        walltime_s: adapter::walltime_s(a, Some(&vc)),
                        borrowed: p.borrowed_nodes > 0,
                        sensitive: a.spec.sensitive,
                    },
                    p.kind == ProposalKind::Backfill,
                ));
            }
        }
    }
    let mut batches = Vec::new();
    for (tenant, bindings) in by_tenant {
        let (fit, too_large) = bind::batches(bindings, |(b, _)| b, max_ops);
        for ((b, _), ops) in too_large {
            if let Some(a) = allocs.get_named(Some(&b.tenant), &b.name) {
                let msg = too_large_message(b.nodes.len(), ops, max_ops);
                explain(shared, &a, "too_large_for_one_transaction", &msg).await;
            }
        }
        batches.extend(fit.into_iter().map(|batch| (tenant.clone(), batch)));
    }
    for (tenant, bindings) in batches {
        let list: Vec<Binding> = bindings.iter().map(|(b, _)| b.clone()).collect();
        // A queued reason for one of these is stale, and its write would fail the
        // binding transaction (the guard on the allocation's revision).
        shared.reasons.forget(
            list.iter()
                .map(|b| crate::objects::key_of::<Allocation>(Some(&b.tenant), &b.name)),
        );
        let outcomes = bind::bind_batch(&shared.backend, &tenant, &list).await?;
        for ((b, backfill), outcome) in bindings.iter().zip(outcomes) {
            match outcome {
                BindOutcome::Bound => {
                    stats.bound += 1;
                    if *backfill {
                        stats.backfilled += 1;
                    }
                    tracing::debug!(allocation = %format!("{}/{}", b.tenant, b.name), nodes = ?b.nodes, "bound");
                }
                BindOutcome::Conflict(why) => {
                    stats.conflicts += 1;
                    stats.retry_soon = true;
                    tracing::debug!(allocation = %b.name, %why, "binding lost a race; retrying next cycle");
                }
                BindOutcome::Taken { node, .. } => {
                    stats.conflicts += 1;
                    stats.retry_soon = true;
                    tracing::debug!(allocation = %b.name, %node, "node taken meanwhile; retrying next cycle");
                }
                BindOutcome::Quota(msg) => {
                    if let Some(a) = allocs.get_named(Some(&b.tenant), &b.name) {
                        explain(shared, &a, "quota_headroom", &msg).await;
                    }
                }
                BindOutcome::Stale => {}
            }
        }
    }

    // Every allocation left in the queue carries a reason.
    let formatting = Instant::now();
    let mut reasons: Vec<(&Allocation, &str, String)> = Vec::new();
    for (i, e) in plan.pending.iter().enumerate() {
        if i % YIELD_EVERY == YIELD_EVERY - 1 {
            tokio::task::yield_now().await;
        }
        let Some(a) = name_of(e.job) else { continue };
        let code = reason_code(&e.reason);
        let msg = match &e.reason {
            PendingReason::WaitingBehind { job } => format!(
                "waiting behind {} (strict FIFO)",
                name_of(*job).map_or("an earlier job", |b| b.name_any())
            ),
            // An absolute time: the message stays the same from cycle to cycle.
            PendingReason::Reserved { start, predicted } => format!(
                "reserved: expected to start at {}{}",
                chrono::DateTime::from_timestamp(*start, 0)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| start.to_string()),
                if *predicted {
                    " (predicted runtimes)"
                } else {
                    ""
                }
            ),
            other => other.to_string(),
        };
        if e.job.0 as usize >= queued.len() {
            // A scale-up that waits: the running allocation's scale status says why.
            scale_message(shared, a, &format!("scale-up waits: {msg}")).await;
        } else {
            reasons.push((&**a, code, msg));
        }
    }
    stats.compute_time += formatting.elapsed();
    stats.compute_time += explain_all(shared, &reasons).await;
    Ok(stats)
}

/// The running reactive allocations of this vCluster whose `status.scale.desiredNodes` is
/// above their node count (see [`grow`]), in name order.
fn growing_here(shared: &Shared, key: &VClusterKey) -> Vec<Arc<Allocation>> {
    let vclusters_all = shared.vclusters.state();
    let exists = |k: &VClusterKey| {
        vclusters_all
            .iter()
            .any(|v| v.namespace() == Some(k.0.as_str()) && v.name_any() == k.1)
    };
    let mut growing: Vec<Arc<Allocation>> = shared
        .allocations
        .find(grow::wants_node)
        .into_iter()
        .filter(|a| adapter::resolve_vcluster(a, exists).as_ref() == Ok(key))
        .collect();
    growing.sort_by(|a, b| (a.namespace(), a.name_any()).cmp(&(b.namespace(), b.name_any())));
    growing
}

/// Add `node`, which the core chose for it, to the reactive allocation `a` in one guarded
/// transaction (see [`grow::grow`]).
async fn scale_up(
    shared: &Shared,
    a: &Allocation,
    node: &str,
    vcluster: &str,
    stats: &mut CycleStats,
) -> anyhow::Result<()> {
    let tenant = a.namespace().unwrap_or("default");
    match grow::grow(&shared.backend, tenant, a.name_any(), node, vcluster).await? {
        grow::GrowOutcome::Grown => {
            stats.bound += 1;
            tracing::info!(allocation = %format!("{tenant}/{}", a.name_any()), %node, "reactive allocation scaled up");
        }
        grow::GrowOutcome::Quota(msg) => scale_message(shared, a, &msg).await,
        grow::GrowOutcome::Conflict(why) => {
            stats.conflicts += 1;
            stats.retry_soon = true;
            tracing::debug!(allocation = %a.name_any(), %why, "scale-up lost a race; retrying next cycle");
        }
        grow::GrowOutcome::Stale => {}
    }
    Ok(())
}

/// Writes `status.scale.message` (why a scale-up waits), guarded, when it differs.
async fn scale_message(shared: &Shared, a: &Allocation, msg: &str) {
    let current = a
        .status
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .and_then(|s| s.message.as_deref());
    if current == Some(msg) {
        return;
    }
    let Some(rv) = a.resource_version() else {
        return;
    };
    let ops = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/status/scale/message", "value": msg},
    ]);
    if let Err(e) = shared
        .api
        .for_obj(a)
        .patch_status(a.name_any(), &PatchParams::default(), &Patch::Json(ops))
        .await
    {
        tracing::debug!(allocation = %a.name_any(), error = %e, "scale message not written (changed meanwhile?)");
    }
}

/// The nodes an allocation is bound with (a reactive one starts at `minNodes`).
fn start_nodes(a: &Allocation) -> usize {
    adapter::reactive_start(a).unwrap_or_else(|| a.spec.resources.nodes.min()) as usize
}

fn too_large_message(nodes: usize, ops: usize, max_ops: usize) -> String {
    format!(
        "binding {nodes} nodes takes {ops} store operations in one transaction, over the store's limit of {max_ops}; raise lattice-server --max-txn-ops to at least {ops}"
    )
}

fn reason_code(r: &PendingReason) -> &'static str {
    match r {
        PendingReason::NoMatchingNodes { .. } => "no_matching_nodes",
        PendingReason::InsufficientConformanceGroup { .. } => "insufficient_conformance_group",
        PendingReason::NodesOccupied { .. } => "nodes_occupied",
        PendingReason::QuotaHeadroom { .. } => "quota_headroom",
        PendingReason::WaitingBehind { .. } => "waiting_behind",
        PendingReason::BlockedByReservation { .. } => "blocked_by_reservation",
        PendingReason::Reserved { .. } => "reserved",
        PendingReason::WaitingForPreemption { .. } => "waiting_for_preemption",
        PendingReason::SoftQuotaPenalty { .. } => "soft_quota_penalty",
        PendingReason::NoScaleUpNode { .. } => "no_scale_up_node",
    }
}

/// Write a pending reason when it changed. Guarded by the resourceVersion the decision
/// was made on: if the allocation changed meanwhile (bound by another loop, cancelled,
/// failed a dependency) the stale explanation is dropped, never written over it.
async fn explain(shared: &Shared, a: &Allocation, code: &str, msg: &str) {
    let _computing = explain_all(shared, &[(a, code, msg.to_string())]).await;
}

/// Most allocations explained in one store transaction (a compare and a put each: 128
/// operations, etcd's default `--max-txn-ops`).
const EXPLAIN_BATCH: usize = 64;

/// Loops of a cycle over every queued allocation yield to the runtime this often, so a
/// queue of 100,000 does not hold a worker thread (and the requests behind it) for the
/// whole loop.
const YIELD_EVERY: usize = 4096;

/// Most bytes of stored objects written in one transaction (etcd's default request limit
/// is 1.5 MiB; allocations with large inline scripts are big).
const EXPLAIN_BYTES: usize = 512 * 1024;

/// A pending reason to write: the allocation's store key, the revision the decision was
/// made on, and the reason.
#[derive(Debug, Clone, PartialEq)]
struct Reason {
    key: String,
    rev: i64,
    code: String,
    msg: String,
}

/// Most pending reasons written per second. They are the scheduler's background
/// bookkeeping: under a storm of arrivals (the API benchmark creates 10,000 a second)
/// writing each one at once took the CPU from the requests and the watchers for seconds
/// after every cycle over the queue. kube-scheduler's API client allows 50 writes a
/// second by default; ours are batched, 64 to a transaction.
const REASONS_PER_SECOND: f64 = 2000.0;

/// Reasons decided and not yet written, oldest first, the newest decision per
/// allocation: a reason decided again before it was written replaces the queued one in
/// its place (one write, not two).
#[derive(Default)]
struct ReasonQueue {
    inner: std::sync::Mutex<QueuedReasons>,
    ready: Notify,
}

#[derive(Default)]
struct QueuedReasons {
    order: std::collections::VecDeque<String>,
    by_key: HashMap<String, Reason>,
}

impl ReasonQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueuedReasons> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `reasons`; returns how many are queued now.
    fn push(&self, reasons: Vec<Reason>) -> usize {
        if reasons.is_empty() {
            return self.lock().order.len();
        }
        let mut q = self.lock();
        for r in reasons {
            if !q.by_key.contains_key(&r.key) {
                q.order.push_back(r.key.clone());
            }
            q.by_key.insert(r.key.clone(), r);
        }
        let n = q.order.len();
        drop(q);
        self.ready.notify_one();
        n
    }

    /// Drop the queued reasons of these allocations (keys).
    fn forget(&self, keys: impl Iterator<Item = String>) {
        let mut q = self.lock();
        let gone: HashSet<String> = keys.filter(|k| q.by_key.remove(k).is_some()).collect();
        if !gone.is_empty() {
            q.order.retain(|k| !gone.contains(k));
        }
    }

    /// Up to `n` of the oldest queued reasons.
    fn take(&self, n: usize) -> Vec<Reason> {
        let mut q = self.lock();
        let mut out = Vec::with_capacity(n.min(q.order.len()));
        while out.len() < n {
            let Some(key) = q.order.pop_front() else {
                break;
            };
            if let Some(r) = q.by_key.remove(&key) {
                out.push(r);
            }
        }
        out
    }

    fn len(&self) -> usize {
        self.lock().order.len()
    }
}

/// The reason writer: writes queued reasons a transaction at a time, no faster than
/// [`REASONS_PER_SECOND`].
async fn reason_writer(shared: Arc<Shared>) {
    loop {
        let started = tokio::time::Instant::now();
        let written = write_queued(&shared, 1).await;
        if written == 0 {
            shared.reasons.ready.notified().await;
            continue;
        }
        tokio::time::sleep_until(
            started + Duration::from_secs_f64(written as f64 / REASONS_PER_SECOND),
        )
        .await;
    }
}

/// Write up to `txns` transactions' worth of queued reasons; returns how many were taken
/// from the queue.
async fn write_queued(shared: &Shared, txns: usize) -> usize {
    let per_txn = EXPLAIN_BATCH.min(shared.backend.max_txn_ops() / 2).max(1);
    let batch = shared.reasons.take(per_txn * txns);
    if !batch.is_empty() {
        write_reasons(shared, &batch).await;
        shared.metrics.reasons_written(batch.len());
    }
    shared.metrics.set_reasons_queued(shared.reasons.len());
    batch.len()
}

/// [`explain`] for many allocations: the reasons that changed are queued for the reason
/// writer, which writes them straight to the store, many per transaction, each guarded
/// by the revision the decision was made on (the scheduler's own status field, like a
/// binding's: through the API, one write per allocation cost about as much as the
/// allocation's creation, and every cycle over a queue of new arrivals explains each of
/// them). Returns the time it spent.
async fn explain_all(shared: &Shared, items: &[(&Allocation, &str, String)]) -> Duration {
    let started = Instant::now();
    let mut queue: Vec<Reason> = Vec::new();
    for (i, (a, code, msg)) in items.iter().enumerate() {
        if i % YIELD_EVERY == YIELD_EVERY - 1 {
            tokio::task::yield_now().await;
        }
        let st = a.status.as_ref();
        if st.and_then(|s| s.reason.as_deref()) == Some(*code)
            && st.and_then(|s| s.message.as_deref()) == Some(msg.as_str())
        {
            continue;
        }
        let Some(rev) = a.resource_version().and_then(|rv| rv.parse::<i64>().ok()) else {
            continue;
        };
        queue.push(Reason {
            key: crate::objects::key_of::<Allocation>(a.namespace(), a.name_any()),
            rev,
            code: code.to_string(),
            msg: msg.clone(),
        });
    }
    let queued = shared.reasons.push(queue);
    shared.metrics.set_reasons_queued(queued);
    started.elapsed()
}

/// `stored` (an object as the store holds it) with `status.reason` and `status.message`
/// set, every other stored field as it was.
fn with_reason(stored: &[u8], code: &str, msg: &str) -> Option<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(stored).ok()?;
    let obj = v.as_object_mut()?;
    let status = obj.entry("status").or_insert_with(|| json!({}));
    if !status.is_object() {
        *status = json!({});
    }
    let st = status.as_object_mut()?;
    st.insert("reason".into(), json!(code));
    st.insert("message".into(), json!(msg));
    serde_json::to_vec(&v).ok()
}

/// One batch of queued reasons ([`explain_all`]): the stored objects are read (the informer caches drop
/// managedFields, and a write must keep every stored field), those still at the
/// decision's revision get the reason set in their stored JSON, and are written in
/// transactions guarded by that revision; a transaction that fails is written again one
/// object at a time, so only a stale reason is dropped.
async fn write_reasons(shared: &Shared, chunk: &[Reason]) {
    if chunk.is_empty() {
        return;
    }
    let keys: Vec<String> = chunk.iter().map(|r| r.key.clone()).collect();
    let raw = match crate::objects::read_raw(&shared.backend, &keys).await {
        Ok(raw) => raw,
        Err(e) => {
            tracing::debug!(error = %e, "pending reasons not written: reading the allocations failed");
            return;
        }
    };
    let mut writes: Vec<(&str, i64, Vec<u8>)> = Vec::with_capacity(chunk.len());
    for (r, kv) in chunk.iter().zip(raw) {
        // Gone, or changed since the decision: the reason is stale.
        let Some(kv) = kv.filter(|kv| kv.mod_revision == r.rev) else {
            tracing::debug!(key = %r.key, "pending reason not written (changed meanwhile)");
            continue;
        };
        match with_reason(&kv.value, &r.code, &r.msg) {
            Some(v) => writes.push((&r.key, r.rev, v)),
            None => {
                tracing::warn!(key = %r.key, "pending reason not written: the stored allocation is not a JSON object")
            }
        }
    }
    let mut rest = &writes[..];
    while !rest.is_empty() {
        let mut n = 0;
        let mut bytes = 0;
        while n < rest.len() && (n == 0 || bytes + rest[n].2.len() <= EXPLAIN_BYTES) {
            bytes += rest[n].2.len();
            n += 1;
        }
        let (batch, tail) = rest.split_at(n);
        rest = tail;
        let mut w = GuardedWrite::new();
        for (key, rev, v) in batch {
            w.put_raw(key, *rev, v.clone());
        }
        let failed = match w.commit(&shared.backend).await {
            Ok(true) => continue,
            Ok(false) => "changed meanwhile".to_string(),
            Err(e) => e.to_string(),
        };
        if batch.len() == 1 {
            tracing::debug!(key = %batch[0].0, why = %failed, "pending reason not written");
            continue;
        }
        for (key, rev, v) in batch {
            let mut w = GuardedWrite::new();
            w.put_raw(key, *rev, v.clone());
            match w.commit(&shared.backend).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(%key, "pending reason not written (changed meanwhile)")
                }
                Err(e) => tracing::debug!(%key, error = %e, "pending reason not written"),
            }
        }
    }
}

/// Ask the victim's agents to stop it (checkpoint signal first when it has one). Guarded
/// by the resourceVersion the decision was made on, so a victim that was requeued and
/// re-bound meanwhile is not preempted by a stale decision.
async fn request_preemption(shared: &Shared, victim: &Allocation, by: &str) {
    if lifecycle::preempt_requested(victim) {
        return;
    }
    let Some(rv) = victim.resource_version() else {
        return;
    };
    tracing::info!(victim = %victim.name_any(), preemptor = %by, "requesting preemption");
    let path = format!(
        "/metadata/annotations{}",
        if victim.metadata.annotations.is_empty() {
            ""
        } else {
            "/lattice.dev~1preempt-requested"
        }
    );
    let value = if victim.metadata.annotations.is_empty() {
        json!({lifecycle::PREEMPT_ANNOTATION: by})
    } else {
        json!(by)
    };
    let patch = Patch::Json(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": path, "value": value},
    ]));
    if let Err(e) = shared
        .api
        .for_obj(victim)
        .patch(victim.name_any(), &PatchParams::default(), &patch)
        .await
    {
        tracing::debug!(victim = %victim.name_any(), error = %e, "preemption not requested (changed meanwhile?)");
    }
}

async fn write_vcluster_status(
    shared: &Shared,
    key: &VClusterKey,
    stats: &CycleStats,
    took: Duration,
) {
    let Some(vc) = shared.vclusters.get_named(Some(&key.0), &key.1) else {
        return;
    };
    let st = vc.status.clone().unwrap_or_default();
    let ms = took.as_millis() as u64;
    if st.pending_allocations == stats.pending as u32
        && st.running_allocations == stats.running as u32
        && st.nodes == stats.nodes as u32
        && st.idle_nodes == stats.idle_nodes as u32
        && st.last_cycle_time.is_some()
    {
        return;
    }
    let patch = Patch::Merge(json!({"status": {
        "pendingAllocations": stats.pending,
        "runningAllocations": stats.running,
        "nodes": stats.nodes,
        "idleNodes": stats.idle_nodes,
        "lastCycleTime": now(),
        "lastCycleDurationMs": ms,
    }}));
    let api: Api<VCluster> = Api::namespaced(shared.api.client().clone(), &key.0);
    if let Err(e) = api
        .patch_status(&key.1, &PatchParams::default(), &patch)
        .await
    {
        tracing::debug!(error = %e, "could not write the vCluster status");
    }
}

#[cfg(test)]
mod tests {
    use lattice_apis::ObjectMeta;
    use lattice_runtime::{Client, PostParams};

    use super::*;

    /// What `explain_all` needs: the store and a client (the caches stay empty).
    fn shared_over(backend: Arc<dyn KvBackend>, client: Client) -> Shared {
        Shared {
            backend,
            allocations: lattice_runtime::reflector::store::<Allocation>().0,
            nodes: lattice_runtime::reflector::store::<Node>().0,
            tenants: lattice_runtime::reflector::store::<Tenant>().0,
            vclusters: lattice_runtime::reflector::store::<VCluster>().0,
            api: Api::all(client),
            metrics: SchedulerMetrics::default(),
            reasons: ReasonQueue::default(),
            history: Default::default(),
            http: extender::client(),
        }
    }

    /// The reason queue keeps arrival order, and a reason decided again before it was
    /// written replaces the queued one in its place.
    #[test]
    fn a_newer_reason_replaces_the_queued_one_in_its_place() {
        let r = |key: &str, rev: i64, msg: &str| Reason {
            key: key.into(),
            rev,
            code: "no_matching_nodes".into(),
            msg: msg.into(),
        };
        let q = ReasonQueue::default();
        assert_eq!(
            q.push(vec![r("a", 1, "x"), r("b", 2, "x"), r("c", 3, "x")]),
            3
        );
        assert_eq!(q.push(vec![r("b", 5, "y"), r("d", 6, "x")]), 4);
        let first = q.take(2);
        assert_eq!(first, vec![r("a", 1, "x"), r("b", 5, "y")]);
        // Taken reasons are gone: deciding one again queues it at the end.
        assert_eq!(q.push(vec![r("a", 7, "z")]), 3);
        assert_eq!(
            q.take(10),
            vec![r("c", 3, "x"), r("d", 6, "x"), r("a", 7, "z")]
        );
        assert!(q.take(10).is_empty());
        assert_eq!(q.len(), 0);
        // A forgotten reason (its allocation is being bound) is not written; queuing it
        // again puts it at the end.
        q.push(vec![r("a", 8, "x"), r("b", 9, "x"), r("c", 10, "x")]);
        q.forget(["b".to_string()].into_iter());
        assert_eq!(q.len(), 2);
        q.push(vec![r("b", 11, "y")]);
        assert_eq!(
            q.take(10),
            vec![r("a", 8, "x"), r("c", 10, "x"), r("b", 11, "y")]
        );
    }

    /// The writer takes no more than `REASONS_PER_SECOND` from the queue: 300 queued
    /// reasons (five transactions' worth) take at least the time of four at that rate
    /// (the first goes at once). Their allocations do not exist, so the store does
    /// nothing but the reads: without the pacing the queue empties in milliseconds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reason_writer_keeps_to_its_rate() {
        let dir = tempfile::tempdir().unwrap();
        let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default())
            .await
            .unwrap();
        let backend: Arc<dyn KvBackend> = Arc::new(store);
        let shared = Arc::new(shared_over(
            backend.clone(),
            lattice_apiserver::in_process::client(backend),
        ));
        let n = 300;
        shared.reasons.push(
            (0..n)
                .map(|i| Reason {
                    key: crate::objects::key_of::<Allocation>(Some("t1"), &format!("x{i}")),
                    rev: 1,
                    code: "no_matching_nodes".into(),
                    msg: "none".into(),
                })
                .collect(),
        );
        let started = Instant::now();
        let writer = AbortOnDrop(tokio::spawn(reason_writer(shared.clone())));
        while shared.reasons.len() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = started.elapsed();
        drop(writer);
        let per_txn = EXPLAIN_BATCH.min(shared.backend.max_txn_ops() / 2);
        let floor = Duration::from_secs_f64((n - per_txn) as f64 / REASONS_PER_SECOND);
        assert!(
            took >= floor,
            "{n} reasons taken in {took:?}, under {floor:?}"
        );
    }

    /// Write every queued reason now (the writer task's pacing left out).
    async fn flush(shared: &Shared) {
        while write_queued(shared, 1).await > 0 {}
    }

    /// Reasons go to the store many per transaction, onto the stored objects (every
    /// stored field kept, managedFields included, though the scheduler decides on cached
    /// copies without them); an allocation changed after the decision keeps no reason.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn explanations_are_batched_and_only_stale_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default())
            .await
            .unwrap();
        let backend: Arc<dyn KvBackend> = Arc::new(store);
        let client = lattice_apiserver::in_process::client(backend.clone());
        let api: Api<Allocation> = Api::namespaced(client.clone(), "t1");
        let mut created = Vec::new();
        for i in 0..150 {
            let mut a = Allocation {
                metadata: ObjectMeta::named(format!("a{i:03}"), Some("t1")),
                ..Default::default()
            };
            a.spec.entrypoint = Some("/bin/true".into());
            created.push(api.create(&PostParams::default(), &a).await.unwrap());
        }
        // One allocation changes after the scheduler decided on it; one already says so.
        api.patch(
            "a070",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"changed": "yes"}}})),
        )
        .await
        .unwrap();
        let mut said = created[10].clone();
        said.status = Some(lattice_apis::AllocationStatus {
            reason: Some("no_matching_nodes".into()),
            message: Some("none".into()),
            ..Default::default()
        });
        created[10] = api
            .replace_status("a010", &PostParams::default(), &said)
            .await
            .unwrap();

        let shared = shared_over(backend.clone(), client);
        let before = backend.status().await.unwrap().revision;
        // The scheduler decides on cached copies, which have no managedFields.
        let cached: Vec<Allocation> = created
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a.metadata.managed_fields = Vec::new();
                a
            })
            .collect();
        let items: Vec<(&Allocation, &str, String)> = cached
            .iter()
            .map(|a| (a, "no_matching_nodes", "none".to_string()))
            .collect();
        explain_all(&shared, &items).await;
        flush(&shared).await;
        let after = backend.status().await.unwrap().revision;
        // 149 to write (a010 already says it), 64 per transaction: a065..a128 holds the
        // stale a070, found stale when the batch is read, so 63 go in its transaction.
        assert_eq!(after - before, 3, "revisions used");
        let listed = api.list(&Default::default()).await.unwrap().items;
        assert_eq!(listed.len(), 150);
        for (a, made) in listed.iter().zip(&created) {
            let reason = a.status.as_ref().and_then(|s| s.reason.as_deref());
            let name = a.name_any().to_string();
            assert_eq!(name, made.name_any());
            assert!(
                !a.metadata.managed_fields.is_empty(),
                "{name}: managedFields kept"
            );
            if name == "a070" {
                assert_eq!(reason, None, "a stale explanation is dropped");
                continue;
            }
            assert_eq!(reason, Some("no_matching_nodes"), "{name}");
            assert_eq!(
                a.status.as_ref().and_then(|s| s.message.as_deref()),
                Some("none")
            );
            assert_eq!(a.spec.entrypoint.as_deref(), Some("/bin/true"), "{name}");
            assert_eq!(
                a.metadata.managed_fields, made.metadata.managed_fields,
                "{name}"
            );
        }
    }

    /// Big allocations (20 KB scripts) go in transactions of at most `EXPLAIN_BYTES`; a
    /// transaction the store refuses is written again one allocation at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn big_objects_split_by_bytes_and_a_refused_batch_goes_one_by_one() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().unwrap();
        // The store refuses transactions of more than one write when told to (as a
        // request-size limit would), and counts the transactions that write.
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (r, w) = (refuse.clone(), writes.clone());
        let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default())
            .await
            .unwrap();
        let backend: Arc<dyn KvBackend> =
            Arc::new(lattice_store::WithFaults::new(store).on_txn(move |req| {
                let puts = req
                    .success
                    .iter()
                    .filter(|op| matches!(op, lattice_store::TxnOp::Put(_)))
                    .count();
                if puts > 1 && r.load(SeqCst) {
                    return Some(lattice_store::StoreError::RequestTooLarge {
                        size: puts,
                        limit: 1,
                    });
                }
                if puts > 0 {
                    w.fetch_add(1, SeqCst);
                }
                None
            }));
        let client = lattice_apiserver::in_process::client(backend.clone());
        let api: Api<Allocation> = Api::namespaced(client.clone(), "t1");
        let mut created = Vec::new();
        for i in 0..64 {
            let mut a = Allocation {
                metadata: ObjectMeta::named(format!("big{i:02}"), Some("t1")),
                ..Default::default()
            };
            a.spec.script = Some(format!("#!/bin/sh\n# {}\ntrue\n", "x".repeat(20_000)));
            created.push(api.create(&PostParams::default(), &a).await.unwrap());
        }
        let shared = shared_over(backend.clone(), client);
        let explain_with = |list: &[Allocation], msg: &str| -> Vec<(Allocation, String)> {
            list.iter().map(|a| (a.clone(), msg.to_string())).collect()
        };
        // 64 × ≈20 KB = ≈1.3 MB: three transactions of at most 512 KiB.
        let first = explain_with(&created, "first");
        let items: Vec<(&Allocation, &str, String)> = first
            .iter()
            .map(|(a, m)| (a, "no_matching_nodes", m.clone()))
            .collect();
        writes.store(0, SeqCst);
        explain_all(&shared, &items).await;
        flush(&shared).await;
        assert_eq!(writes.load(SeqCst), 3, "transactions that wrote");
        let now = api.list(&Default::default()).await.unwrap().items;
        assert!(now
            .iter()
            .all(|a| a.status.as_ref().and_then(|s| s.message.as_deref()) == Some("first")));
        // Batches refused: every reason still lands, one transaction each.
        refuse.store(true, SeqCst);
        writes.store(0, SeqCst);
        let second = explain_with(&now, "second");
        let items: Vec<(&Allocation, &str, String)> = second
            .iter()
            .map(|(a, m)| (a, "no_matching_nodes", m.clone()))
            .collect();
        explain_all(&shared, &items).await;
        flush(&shared).await;
        assert_eq!(writes.load(SeqCst), 64, "one by one");
        let now = api.list(&Default::default()).await.unwrap().items;
        assert!(now
            .iter()
            .all(|a| a.status.as_ref().and_then(|s| s.message.as_deref()) == Some("second")));
    }
}
