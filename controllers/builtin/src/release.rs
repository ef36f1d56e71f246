//! The release controller: gives nodes back to the pool once their owner is done with
//! them (`lattice_apis::lifecycle::node_released`), and decrements the tenant's usage
//! counters in the same guarded transaction.
//!
//! A node stays owned until its own agent has confirmed that the owner's process group is
//! gone (or the node is Down), so a new allocation can never start on a node where the
//! previous one is still in its SIGTERM grace period.

use std::sync::Arc;
use std::time::Duration;

use lattice_apis::kinds::tenant::TenantSpec;
use lattice_apis::{lifecycle, Allocation, Node, NodeState, Tenant};
use lattice_runtime::informer::InformerParams;
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, HostContext, ObjectRef, ResourceExt};
use lattice_store::KvBackend;

use crate::metrics::ControllerMetrics;
use crate::objects::{decode_next, key_of, read_raw, GuardedWrite};

struct Ctx {
    backend: Arc<dyn KvBackend>,
    nodes: Store<Node>,
    allocations: Store<Allocation>,
    metrics: ControllerMetrics,
}

/// `(tenant, allocation, allocation uid, attempt)` of a node's owner: a re-created
/// allocation with the same name is a different owner.
type OwnerKey = (String, String, Option<String>, u32);

fn owner_key(n: &Node) -> Option<OwnerKey> {
    let o = n.status.as_ref()?.owner.as_ref()?;
    Some((
        o.tenant.clone()?,
        o.allocation.clone()?,
        o.allocation_uid.clone(),
        o.attempt.unwrap_or(0),
    ))
}

/// The owner allocation of `n` as `a` (if it is the same object: a re-created allocation
/// with the same name is a different owner).
fn same_owner(n: &Node, a: Option<&Allocation>) -> bool {
    let Some(a) = a else { return false };
    let want = n
        .status
        .as_ref()
        .and_then(|s| s.owner.as_ref())
        .and_then(|o| o.allocation_uid.as_deref());
    match (want, a.uid()) {
        (Some(w), Some(h)) => w == h,
        _ => true,
    }
}

fn releasable(n: &Node, a: Option<&Allocation>) -> bool {
    let Some((_, _, _, attempt)) = owner_key(n) else {
        return false;
    };
    let down = n
        .status
        .as_ref()
        .is_some_and(|s| s.state == NodeState::Down);
    let a = a.filter(|a| same_owner(n, Some(a)));
    lifecycle::node_released(a, n.name_any(), attempt, down)
}

/// Hours a node was held by the allocation's current attempt: from its start on that node
/// (or the binding) to its end there (or now).
fn held_hours(a: Option<&Allocation>, node: &str) -> f64 {
    let Some(st) = a.and_then(|a| a.status.as_ref()) else {
        return 0.0;
    };
    let report = st.node_states.get(node).filter(|r| r.attempt == st.attempt);
    let start = report
        .and_then(|r| r.start_time)
        .or(st.start_time)
        .or(st.scheduled_time);
    let end = report
        .and_then(|r| r.end_time)
        .or(st.end_time)
        .unwrap_or_else(lattice_apis::meta::now);
    match start {
        Some(s) if end > s => (end - s).num_milliseconds() as f64 / 3_600_000.0,
        _ => 0.0,
    }
}

/// Register the release controller.
pub fn register(
    host: &mut lattice_runtime::ControllerHost,
    backend: Arc<dyn KvBackend>,
    metrics: ControllerMetrics,
) {
    host.register("release", move |hc: HostContext| {
        let backend = backend.clone();
        let metrics = metrics.clone();
        async move {
            let controller = hc.controller::<Node>();
            let nodes = controller.store();
            let allocations = hc.factory.all::<Allocation>().store();
            let by_owner = nodes.clone();
            let ctx = Arc::new(Ctx {
                backend: backend.clone(),
                nodes,
                allocations,
                metrics,
            });
            let audit = tokio::spawn(audit_loop(backend));
            let _audit = crate::AbortOnDrop(audit);
            controller
                .watches::<Allocation, _>(&InformerParams::default(), move |a| {
                    // The nodes this allocation owns (any attempt); for a job step, the
                    // nodes of its allocation (their release waits for the step).
                    let ns = a.namespace().map(str::to_string);
                    let name = a
                        .spec
                        .step_of
                        .clone()
                        .unwrap_or_else(|| a.name_any().to_string());
                    by_owner
                        .find(|n| {
                            n.status
                                .as_ref()
                                .and_then(|s| s.owner.as_ref())
                                .is_some_and(|o| {
                                    o.tenant == ns && o.allocation.as_deref() == Some(name.as_str())
                                })
                        })
                        .iter()
                        .map(|n| ObjectRef::from_obj(n.as_ref()))
                        .collect()
                })
                .resync_every(Some(Duration::from_secs(30)))
                .run(reconcile, ctx)
                .await;
        }
    });
}

/// Whether a job step of the owner allocation still runs (is not terminal) on `node`: its
/// processes there must be gone before the node can be handed to anyone else.
fn step_running_on(ctx: &Ctx, owner: &OwnerKey, node: &str) -> bool {
    let live_here = |s: &Allocation| {
        s.spec.step_of.as_deref() == Some(owner.1.as_str())
            && s.namespace() == Some(owner.0.as_str())
            && !s.phase().is_terminal()
            && s.status
                .as_ref()
                .is_some_and(|st| st.assigned_nodes.iter().any(|n| n == node))
    };
    // Steps are owned by their allocation: the owner index, not a scan of every object.
    match &owner.2 {
        Some(uid) => ctx
            .allocations
            .by_owner_uid(uid)
            .iter()
            .any(|s| live_here(s)),
        None => !ctx.allocations.find(live_here).is_empty(),
    }
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, anyhow::Error> {
    let Some(owner) = owner_key(&node) else {
        return Ok(Action::await_change());
    };
    if step_running_on(&ctx, &owner, node.name_any()) {
        return Ok(Action::await_change());
    }
    // The cache may not have caught up with a binding made a moment ago: a cached view
    // that says "not released" is final for now, but "released" is only acted on after
    // reading the allocation from the store.
    let cached = ctx.allocations.get_named(Some(&owner.0), &owner.1);
    if cached.is_some() && !releasable(&node, cached.as_deref()) {
        return Ok(Action::await_change());
    }
    // Every node of the same owner: released together, so the allocation count of the
    // tenant drops exactly once (when the last of them goes).
    let group: Vec<Arc<Node>> = ctx.nodes.find(|n| owner_key(n).as_ref() == Some(&owner));
    let mut keys: Vec<String> = group
        .iter()
        .map(|n| key_of::<Node>(None, n.name_any()))
        .collect();
    let own_key = key_of::<Node>(None, node.name_any());
    if !keys.contains(&own_key) {
        keys.push(own_key);
    }
    // Allocation, nodes and tenant at one revision, in one read.
    let alloc_key = [key_of::<Allocation>(Some(&owner.0), &owner.1)];
    let tenant_key = [key_of::<Tenant>(None, &owner.0)];
    let all_keys: Vec<String> = alloc_key
        .iter()
        .chain(&keys)
        .chain(&tenant_key)
        .cloned()
        .collect();
    let mut raw = read_raw(&ctx.backend, &all_keys).await?.into_iter();
    let alloc_stored = decode_next::<Allocation>(&mut raw, &alloc_key)?
        .pop()
        .flatten();
    let alloc = alloc_stored.as_ref().map(|s| s.obj.clone());
    if !releasable(&node, alloc.as_ref()) {
        return Ok(Action::await_change());
    }
    let fresh = decode_next::<Node>(&mut raw, &keys)?;
    let tenant = decode_next::<Tenant>(&mut raw, &tenant_key)?
        .pop()
        .flatten();
    let mut w = GuardedWrite::new();
    let mut released = 0u32;
    let mut released_names: Vec<String> = Vec::new();
    let mut still_owned = 0u32;
    let (mut node_hours, mut gpu_hours) = (0.0f64, 0.0f64);
    // Only what falls inside the tenant's budget period is charged (as the scheduler counts
    // running work).
    let period_hours = f64::from(tenant.as_ref().map_or_else(
        || TenantSpec::default().budget_period(),
        |t| t.obj.spec.budget_period(),
    )) * 24.0;
    for stored in fresh.iter().flatten() {
        if owner_key(&stored.obj).as_ref() != Some(&owner) {
            continue;
        }
        if releasable(&stored.obj, alloc.as_ref())
            && !step_running_on(&ctx, &owner, stored.obj.name_any())
        {
            let hours = held_hours(alloc.as_ref(), stored.obj.name_any()).min(period_hours);
            node_hours += hours;
            gpu_hours += hours
                * f64::from(
                    stored
                        .obj
                        .status
                        .as_ref()
                        .map(|s| s.capacity.gpu_count)
                        .unwrap_or(0),
                );
            let mut n = stored.obj.clone();
            if let Some(st) = n.status.as_mut() {
                st.owner = None;
                st.allocations.clear();
            }
            w.put(stored, &n)?;
            released += 1;
            released_names.push(stored.obj.name_any().to_string());
        } else {
            w.guard(stored);
            still_owned += 1;
        }
    }
    if released == 0 {
        return Ok(Action::await_change());
    }
    // Nodes a scale-down gave back leave `status.releasingNodes` in the same transaction.
    if let Some(stored) = &alloc_stored {
        let giving_back = stored.obj.status.as_ref().is_some_and(|st| {
            st.releasing_nodes
                .iter()
                .any(|n| released_names.contains(n))
        });
        if giving_back {
            let mut a = stored.obj.clone();
            if let Some(st) = a.status.as_mut() {
                // The node's final report stays in nodeStates: the scheduler does not give
                // this attempt the same node again (its agent has finished that run).
                st.releasing_nodes.retain(|n| !released_names.contains(n));
            }
            // The allocation may have been waiting only for this node (e.g. it went Down
            // without reporting): its phase is recomputed in the same write.
            lattice_apis::lifecycle::aggregate(&mut a, lattice_apis::meta::now());
            w.put(stored, &a)?;
        }
    }
    let sensitive = alloc.as_ref().is_some_and(|a| a.spec.sensitive);
    if sensitive {
        // The cluster-wide sensitive pool gets the nodes back in the same transaction.
        let pool = crate::sensitive_pool::read(&ctx.backend).await?;
        pool.write(&mut w, pool.used.saturating_sub(released))?;
    }
    if still_owned == 0 {
        if let Some(a) = &alloc {
            record_runtime(&ctx.backend, &mut w, a).await?;
        }
    }
    if let Some(t) = &tenant {
        let mut obj = t.obj.clone();
        let usage = &mut obj.status.get_or_insert_with(Default::default).usage;
        usage.nodes = usage.nodes.saturating_sub(released);
        if sensitive {
            usage.sensitive_nodes = usage.sensitive_nodes.saturating_sub(released);
        }
        if still_owned == 0 {
            usage.running_allocations = usage.running_allocations.saturating_sub(1);
        }
        // The budget ledger (soft quotas): what the released nodes were held for.
        if node_hours > 0.0 {
            let user = alloc
                .as_ref()
                .and_then(|a| {
                    a.metadata
                        .annotations
                        .get(lattice_apis::wellknown::USER_ANNOTATION)
                        .cloned()
                })
                .unwrap_or_else(|| "unknown".into());
            let period = t.obj.spec.budget_period();
            usage.charge(
                chrono::Utc::now().date_naive(),
                &user,
                node_hours,
                gpu_hours,
                period,
            );
        }
        w.put(t, &obj)?;
    }
    if w.commit(&ctx.backend).await? {
        ctx.metrics.nodes_released.inc_by(u64::from(released));
        tracing::debug!(allocation = %format!("{}/{}", owner.0, owner.1), attempt = owner.3, released, "nodes released");
        Ok(Action::await_change())
    } else {
        ctx.metrics.release_conflicts.inc();
        Ok(Action::requeue(Duration::from_millis(20)))
    }
}

/// A finished allocation's last nodes are being released: its runtime joins its user's
/// history in its vCluster (the scheduler's runtime estimators learn from it), in the
/// same transaction, so it counts exactly once and survives any restart.
async fn record_runtime(
    backend: &Arc<dyn KvBackend>,
    w: &mut GuardedWrite,
    a: &Allocation,
) -> Result<(), crate::objects::TxnError> {
    use crate::scheduler::history;
    let Some(run) = history::finished_run(a) else {
        return Ok(());
    };
    let [(own, own_key), (shared, shared_key)] = history::vcluster_candidates(a);
    let hist = [
        history::key(&own, &run.user),
        history::key(&shared, &run.user),
    ];
    let keys = [own_key, shared_key, hist[0].clone(), hist[1].clone()];
    let raw = read_raw(backend, &keys).await?;
    // The vCluster the scheduler queued it in: its tenant's, else the shared one.
    let at = if raw[0].is_some() {
        0
    } else if raw[1].is_some() {
        1
    } else {
        return Ok(());
    };
    let stored = raw[2 + at].as_ref();
    let mut h: history::UserHistory = stored
        .and_then(|kv| serde_json::from_slice(&kv.value).ok())
        .unwrap_or_default();
    h.record(&run);
    let value =
        serde_json::to_vec(&h).map_err(|e| crate::objects::TxnError::Decode(e.to_string()))?;
    w.put_raw(&hist[at], stored.map_or(0, |kv| kv.mod_revision), value);
    Ok(())
}

/// How often tenant usage counters are checked against node ownership.
const AUDIT_EVERY: Duration = Duration::from_secs(15);

/// Recompute every tenant's `usage.nodes` / `usage.runningAllocations` from node
/// ownership and correct drift (a Tenant created after its allocations were bound, a node
/// deleted while owned). Nodes and tenants are read at one revision and each correction
/// is guarded by the tenant's revision, so it can never undo a concurrent bind or release
/// (both write the tenant).
async fn audit_loop(backend: Arc<dyn KvBackend>) {
    loop {
        if let Err(e) = audit_usage(&backend).await {
            tracing::debug!(error = %e, "tenant usage audit failed");
        }
        tokio::time::sleep(AUDIT_EVERY).await;
    }
}

/// One audit pass; returns how many tenants were corrected.
pub async fn audit_usage(backend: &Arc<dyn KvBackend>) -> Result<usize, crate::objects::TxnError> {
    use std::collections::{BTreeMap, BTreeSet};
    // The sensitive pool's counter is read before the nodes: a claim that commits in between
    // changes the counter, so the correction below (guarded by this read) is refused rather
    // than undo that claim's count.
    let pool = crate::sensitive_pool::read(backend).await?;
    let (nodes, tenants) = crate::objects::read_two_kinds::<Node, Tenant>(backend).await?;
    let mut counted: BTreeMap<String, (u32, BTreeSet<OwnerKey>, u32)> = BTreeMap::new();
    for n in &nodes {
        if let Some(key) = owner_key(&n.obj) {
            let e = counted.entry(key.0.clone()).or_default();
            e.0 += 1;
            e.1.insert(key);
            if n.obj.spec.sensitive {
                e.2 += 1;
            }
        }
    }
    // The cluster-wide sensitive pool: sensitive-pool nodes run only sensitive work, so
    // the owned ones are what it holds.
    let sensitive_held: u32 = counted.values().map(|c| c.2).sum();
    let mut fixed = 0;
    if pool.used != sensitive_held {
        tracing::warn!(
            counted = pool.used,
            actual = sensitive_held,
            "the cluster-wide sensitive pool counter drifted from node ownership; correcting"
        );
        if crate::sensitive_pool::correct(backend, &pool, sensitive_held).await? {
            fixed += 1;
        }
    }
    for t in &tenants {
        let (nodes, allocs, sensitive) = counted
            .get(t.obj.name_any())
            .map(|(n, a, s)| (*n, a.len() as u32, *s))
            .unwrap_or((0, 0, 0));
        let usage = t
            .obj
            .status
            .as_ref()
            .map(|s| s.usage.clone())
            .unwrap_or_default();
        if usage.nodes == nodes
            && usage.running_allocations == allocs
            && usage.sensitive_nodes == sensitive
        {
            continue;
        }
        let mut obj = t.obj.clone();
        let u = &mut obj.status.get_or_insert_with(Default::default).usage;
        tracing::warn!(
            tenant = %t.obj.name_any(),
            counted_nodes = usage.nodes, actual_nodes = nodes,
            counted_allocations = usage.running_allocations, actual_allocations = allocs,
            "tenant usage drifted from node ownership; correcting"
        );
        u.nodes = nodes;
        u.running_allocations = allocs;
        u.sensitive_nodes = sensitive;
        let mut w = GuardedWrite::new();
        w.put(t, &obj)?;
        if w.commit(backend).await? {
            fixed += 1;
        }
    }
    Ok(fixed)
}
