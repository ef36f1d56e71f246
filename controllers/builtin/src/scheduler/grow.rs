//! Scale-up of reactive allocations: when the autoscaler raised `status.scale.desiredNodes`
//! above the allocation's node count, the vCluster's scheduler adds one node per cycle as
//! a regular proposal: the core scores and places the request like any job
//! (`PendingJob::scale_up`, [`super::adapter::scale_up_job`]), and one guarded transaction
//! compares the allocation, the node and the tenant, and writes the node's owner, the
//! tenant's usage (a scale-up that would exceed `maxNodes` is a no-op: the allocation keeps
//! its size and says why) and the allocation's `assignedNodes`. The node's agent then
//! starts the allocation there.

use std::sync::Arc;

use lattice_apis::kinds::node::NodeOwner;
use lattice_apis::lifecycle;
use lattice_apis::{Allocation, AllocationPhase, LifecycleType, Node, Tenant};
use lattice_runtime::ResourceExt;
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

/// Add `node` to allocation `tenant/name` in one guarded transaction. The node is a home
/// node (scale-ups never borrow: a lender's reclaim could not take back part of an
/// allocation).
pub async fn grow(
    backend: &Arc<dyn KvBackend>,
    tenant: &str,
    name: &str,
    node: &str,
    vcluster: &str,
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
        borrowed: false,
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
}
