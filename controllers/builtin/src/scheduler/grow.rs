//! Scale-up of reactive allocations: when the autoscaler raised `status.scale.desiredNodes`
//! above the allocation's node count, the vCluster's scheduler adds one node per cycle as
//! a regular proposal: the node passes the allocation's filters (the same catalog the
//! core uses), and one guarded transaction compares the allocation, the node and the
//! tenant, and writes the node's owner, the tenant's usage (a scale-up that would exceed
//! `maxNodes` is a no-op: the allocation keeps its size and says why) and the allocation's
//! `assignedNodes`. The node's agent then starts the allocation there.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use lattice_apis::kinds::node::NodeOwner;
use lattice_apis::lifecycle;
use lattice_apis::{Allocation, AllocationPhase, LifecycleType, Node, Tenant};
use lattice_runtime::ResourceExt;
use lattice_scheduler::catalog::{FilterOutcome, NodeCatalog};
use lattice_scheduler::{NodeId, NodeRequest, PendingJob};
use lattice_store::KvBackend;

use crate::allocations::USER_ANNOTATION;
use crate::objects::{decode_next, key_of, read_raw, GuardedWrite, TxnError};

/// Whether `a` is a running reactive allocation that wants more nodes than it has.
pub fn wants_node(a: &Allocation) -> bool {
    if a.spec.lifecycle.type_ != LifecycleType::Reactive
        || a.is_deleting()
        || lifecycle::cancel_requested(a)
        || lifecycle::preempt_requested(a)
    {
        return false;
    }
    let Some(st) = a.status.as_ref() else {
        return false;
    };
    let max = a
        .spec
        .lifecycle
        .scale_policy
        .as_ref()
        .map_or(0, |p| p.max_nodes as usize);
    st.phase == AllocationPhase::Running
        && st.scale.as_ref().is_some_and(|s| {
            (s.desired_nodes as usize) > st.assigned_nodes.len() && st.assigned_nodes.len() < max
        })
}

/// A free node for one more node of `job` (asking for one node): never a borrowed node (a
/// lender's reclaim could not take back part of an allocation; the seed's minimum
/// guarantee comes from the home vCluster) and, when `fingerprint` is given (conformance
/// required, or sensitive work), only nodes with that fingerprint. `taken`: nodes held by
/// running work, and nodes the allocation already ran on in this attempt (their agents
/// finished that run: a node given back by a scale-down is not taken again by the same
/// attempt). Topology as for any placement: a node in a dragonfly group the allocation
/// already spans (the one holding most of its nodes first), else in the group with the most
/// such free nodes (room to grow on); the lowest node of that group. O(nodes): the filters
/// run once per node class.
pub fn pick_node(
    cat: &NodeCatalog,
    job: &PendingJob,
    taken: &HashSet<NodeId>,
    fingerprint: Option<u64>,
    current: &[NodeId],
) -> Option<(NodeId, bool)> {
    let mut one = job.clone();
    one.nodes = NodeRequest { min: 1, max: 1 };
    // Free nodes that fit, per group, in catalog order.
    let mut by_group: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (c, class) in cat.classes().iter().enumerate() {
        if !matches!(
            cat.filter(c as u32, &one),
            FilterOutcome::Feasible { borrowed: false }
        ) {
            continue;
        }
        for &i in &class.members {
            let view = cat.node(i);
            if taken.contains(&view.id)
                || fingerprint.is_some_and(|f| view.conformance_fingerprint != f)
            {
                continue;
            }
            by_group.entry(view.topology_group).or_default().push(i);
        }
    }
    let mut spans: BTreeMap<u32, usize> = BTreeMap::new();
    for id in current {
        if let Some(i) = cat.index_of(*id) {
            *spans.entry(cat.node(i).topology_group).or_default() += 1;
        }
    }
    let group = spans
        .iter()
        .filter(|(g, _)| by_group.contains_key(g))
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(g, _)| *g)
        .or_else(|| {
            by_group
                .iter()
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                .map(|(g, _)| *g)
        })?;
    let i = by_group.get(&group)?.iter().copied().min()?;
    Some((cat.node(i).id, false))
}

/// Outcome of one scale-up transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrowOutcome {
    /// The node was added.
    Grown,
    /// The tenant's `maxNodes` leaves no room (the message says so, with the numbers).
    Quota(String),
    /// Something changed since it was read; try again next cycle.
    Conflict(String),
    /// The allocation no longer wants a node.
    Stale,
}

/// Add `node` to allocation `tenant/name` in one guarded transaction.
pub async fn grow(
    backend: &Arc<dyn KvBackend>,
    tenant: &str,
    name: &str,
    node: &str,
    vcluster: &str,
    borrowed: bool,
) -> Result<GrowOutcome, TxnError> {
    let keys = [
        key_of::<Allocation>(Some(tenant), name),
        key_of::<Node>(None, node),
        key_of::<Tenant>(None, tenant),
    ];
    let mut raw = read_raw(backend, &keys).await?.into_iter();
    let Some(alloc) = decode_next::<Allocation>(&mut raw, &keys[..1])?
        .pop()
        .flatten()
    else {
        return Ok(GrowOutcome::Stale);
    };
    let Some(n) = decode_next::<Node>(&mut raw, &keys[1..2])?.pop().flatten() else {
        return Ok(GrowOutcome::Conflict(format!("node {node} is gone")));
    };
    let t = decode_next::<Tenant>(&mut raw, &keys[2..])?.pop().flatten();
    if !wants_node(&alloc.obj) {
        return Ok(GrowOutcome::Stale);
    }
    if n.obj
        .status
        .as_ref()
        .and_then(|s| s.owner.as_ref())
        .is_some_and(|o| o.allocation.is_some())
    {
        return Ok(GrowOutcome::Conflict(format!("node {node} was taken")));
    }
    if super::adapter::node_state(&n.obj) != lattice_scheduler::NodeState::Ready {
        return Ok(GrowOutcome::Conflict(format!(
            "node {node} is not schedulable"
        )));
    }
    let a = &alloc.obj;
    let st = a.status.clone().unwrap_or_default();
    // The caches the node was picked from may lag: never a node this attempt already has,
    // gives back, or ran on (its agent finished that run).
    if st.assigned_nodes.iter().any(|n| n == node)
        || st.releasing_nodes.iter().any(|n| n == node)
        || st.node_states.contains_key(node)
    {
        return Ok(GrowOutcome::Conflict(format!(
            "node {node} already ran this attempt of the allocation"
        )));
    }
    let mut w = GuardedWrite::new();
    if a.spec.sensitive {
        let pool = crate::sensitive_pool::read(backend).await?;
        if let Some(msg) = pool.refuse(pool.used, 1) {
            return Ok(GrowOutcome::Quota(format!(
                "scale-up to {} {msg}",
                st.assigned_nodes.len() + 1
            )));
        }
        pool.write(&mut w, pool.used + 1)?;
    }
    if let Some(t) = &t {
        let mut obj = t.obj.clone();
        let usage = &mut obj.status.get_or_insert_with(Default::default).usage;
        if let Some(max) = t.obj.spec.quota.max_nodes {
            if usage.nodes + 1 > max {
                return Ok(GrowOutcome::Quota(format!(
                    "scale-up to {} waits for quota headroom (max_nodes: current {}, requested 1, limit {max})",
                    st.assigned_nodes.len() + 1,
                    usage.nodes
                )));
            }
        }
        if let (true, Some(max)) = (a.spec.sensitive, t.obj.spec.quota.sensitive_pool_size) {
            if usage.sensitive_nodes + 1 > max {
                return Ok(GrowOutcome::Quota(format!(
                    "scale-up to {} waits for quota headroom (sensitive_pool_size: current {}, requested 1, limit {max})",
                    st.assigned_nodes.len() + 1,
                    usage.sensitive_nodes
                )));
            }
        }
        usage.nodes += 1;
        if a.spec.sensitive {
            usage.sensitive_nodes += 1;
        }
        w.put(t, &obj)?;
    }
    let (_, vc_name) = vcluster.split_once('/').unwrap_or(("", vcluster));
    let mut owned = n.obj.clone();
    let ns = owned.status.get_or_insert_with(Default::default);
    ns.owner = Some(NodeOwner {
        tenant: Some(tenant.to_string()),
        vcluster: Some(vc_name.to_string()),
        allocation: Some(name.to_string()),
        borrowed,
        attempt: Some(st.attempt),
        allocation_uid: a.metadata.uid.clone(),
        user: a.metadata.annotations.get(USER_ANNOTATION).cloned(),
    });
    ns.allocations = vec![name.to_string()];
    w.put(&n, &owned)?;
    let mut bigger = a.clone();
    let bst = bigger.status.get_or_insert_with(Default::default);
    bst.assigned_nodes.push(node.to_string());
    if let Some(g) = n.obj.spec.topology_group {
        if !bst.topology_groups.contains(&g) {
            bst.topology_groups.push(g);
            bst.topology_groups.sort_unstable();
        }
    }
    let count = bst.assigned_nodes.len();
    if let Some(scale) = bst.scale.as_mut() {
        scale.message = Some(format!("scaled up to {count} node(s): added {node}"));
        // The cooldown counts from the node's arrival, not from the decision.
        scale.last_scale_time = Some(lattice_apis::meta::now());
    }
    w.put(&alloc, &bigger)?;
    Ok(if w.commit(backend).await? {
        GrowOutcome::Grown
    } else {
        GrowOutcome::Conflict("a guarded object changed".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::{AllocationSpec, AllocationStatus, ScalePolicy, ScaleStatus};

    fn reactive(assigned: usize, desired: u32, max: u32) -> Allocation {
        let mut a = Allocation::new("svc", "t", AllocationSpec::default());
        a.spec.lifecycle.type_ = LifecycleType::Reactive;
        a.spec.lifecycle.scale_policy = Some(ScalePolicy {
            min_nodes: 1,
            max_nodes: max,
            metric: "m".into(),
            ..Default::default()
        });
        a.status = Some(AllocationStatus {
            phase: AllocationPhase::Running,
            assigned_nodes: (0..assigned).map(|i| format!("n{i}")).collect(),
            attempt: 1,
            scale: Some(ScaleStatus {
                desired_nodes: desired,
                ..Default::default()
            }),
            ..Default::default()
        });
        a
    }

    #[test]
    fn only_running_reactive_allocations_below_their_desired_size_grow() {
        assert!(wants_node(&reactive(2, 3, 4)));
        assert!(!wants_node(&reactive(3, 3, 4)), "at the desired size");
        assert!(!wants_node(&reactive(4, 5, 4)), "at maxNodes");
        let mut a = reactive(2, 3, 4);
        a.spec.lifecycle.type_ = LifecycleType::Unbounded;
        assert!(!wants_node(&a));
        let mut a = reactive(2, 3, 4);
        if let Some(st) = a.status.as_mut() {
            st.phase = AllocationPhase::Checkpointing;
        }
        assert!(
            !wants_node(&a),
            "a preemption in progress cancels scale-ups"
        );
        let mut a = reactive(2, 3, 4);
        a.metadata
            .annotations
            .insert(lifecycle::CANCEL_ANNOTATION.into(), "true".into());
        assert!(!wants_node(&a));
    }

    fn node(i: u32, group: u32) -> lattice_scheduler::NodeView {
        let mut v = lattice_scheduler::NodeView::slot(i);
        v.topology_group = group;
        v
    }

    fn one_node_job() -> PendingJob {
        PendingJob {
            id: lattice_scheduler::JobId(1),
            tenant: lattice_scheduler::TenantId(0),
            vcluster: lattice_scheduler::VClusterId(0),
            nodes: NodeRequest::exact(1),
            constraints: Default::default(),
            preemption_class: 5,
            sensitive: false,
            submit_time: 0,
            walltime_s: 3600,
            checkpoint: Default::default(),
            data_readiness: None,
        }
    }

    #[test]
    fn a_scale_up_stays_in_the_groups_it_spans() {
        // Group 0: nodes 0-3, group 1: nodes 4-9, group 2: nodes 10-11.
        let views: Vec<_> = (0..12)
            .map(|i| {
                node(
                    i,
                    if i < 4 {
                        0
                    } else if i < 10 {
                        1
                    } else {
                        2
                    },
                )
            })
            .collect();
        let cat = NodeCatalog::new(views);
        let job = one_node_job();
        let ids = |v: &[u32]| v.iter().map(|&i| NodeId(i)).collect::<Vec<_>>();
        // Running on 10 (group 2): the other node of group 2, not the lowest node overall.
        let current = ids(&[10]);
        let taken: HashSet<NodeId> = current.iter().copied().collect();
        assert_eq!(
            pick_node(&cat, &job, &taken, None, &current),
            Some((NodeId(11), false))
        );
        // Group 2 full: most of its nodes... it spans nothing else, so the group with the
        // most free nodes (group 1).
        let taken: HashSet<NodeId> = ids(&[10, 11]).into_iter().collect();
        assert_eq!(
            pick_node(&cat, &job, &taken, None, &ids(&[10, 11])),
            Some((NodeId(4), false))
        );
        // Nothing free that fits: none; a fingerprint no node has: none.
        let all: HashSet<NodeId> = (0..12).map(NodeId).collect();
        assert_eq!(pick_node(&cat, &job, &all, None, &[]), None);
        assert_eq!(pick_node(&cat, &job, &HashSet::new(), Some(7), &[]), None);
    }
}
