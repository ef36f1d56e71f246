//! Binding: one store transaction per placement that compares the revisions of the
//! allocation, every chosen node and the tenant it read, and writes the allocation's
//! binding, the node owners and the tenant's usage counters. Double assignment and hard
//! quota overshoot are impossible by construction: two binders that read the same
//! revision cannot both commit.

use std::sync::Arc;

use lattice_apis::kinds::node::NodeOwner;
use lattice_apis::meta::{now, set_condition, Condition, ConditionStatus};
use lattice_apis::{lifecycle, Allocation, AllocationPhase, AllocationStatus, Node, Tenant};
use lattice_store::KvBackend;

use crate::allocations::USER_ANNOTATION;
use crate::objects::{decode_next, key_of, read_raw, GuardedWrite, TxnError};

/// What to bind.
#[derive(Debug, Clone)]
pub struct Binding {
    /// Allocation tenant and name.
    pub tenant: String,
    /// Allocation name.
    pub name: String,
    /// Nodes, in the core's order.
    pub nodes: Vec<String>,
    /// `tenant/vcluster` the allocation is scheduled by.
    pub vcluster: String,
    /// Effective walltime stamped into the status.
    pub walltime_s: Option<u64>,
    /// Nodes taken from another vCluster's idle pool.
    pub borrowed: bool,
    /// The allocation is sensitive: its transaction also updates the cluster-wide
    /// sensitive pool.
    pub sensitive: bool,
}

/// Store operations a binding adds to its transaction: a compare and a put for the
/// allocation and for each node.
pub fn ops_of(b: &Binding) -> usize {
    2 * (1 + b.nodes.len())
}

/// Operations every binding transaction carries besides its bindings: the tenant's
/// usage counters (a compare and a put).
pub const TXN_BASE_OPS: usize = 2;

/// Operations a transaction adds when it binds sensitive work: the cluster-wide
/// sensitive pool (a guard on its limit, a compare and a put of its counter).
pub const TXN_SENSITIVE_OPS: usize = 3;

/// Operations a transaction carries besides its bindings.
pub fn txn_overhead(sensitive: bool) -> usize {
    TXN_BASE_OPS + if sensitive { TXN_SENSITIVE_OPS } else { 0 }
}

/// Operations of a transaction binding one allocation of `nodes` nodes.
pub fn ops_for_nodes(nodes: usize, sensitive: bool) -> usize {
    2 * (1 + nodes) + txn_overhead(sensitive)
}

/// Split one tenant's bindings into batches whose transactions stay within `max_ops`
/// (the store's `--max-txn-ops`), keeping their order. A batch pays for the sensitive
/// pool only when it holds a sensitive binding. Bindings that cannot fit even alone are
/// returned apart, with the operations they would need.
pub fn batches<T>(
    bindings: Vec<T>,
    binding: impl Fn(&T) -> &Binding,
    max_ops: usize,
) -> (Vec<Vec<T>>, Vec<(T, usize)>) {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut too_large = Vec::new();
    // Binding operations and whether the current batch is sensitive.
    let mut ops = 0;
    let mut sensitive = false;
    for item in bindings {
        let b = binding(&item);
        let n = ops_of(b);
        let alone = n + txn_overhead(b.sensitive);
        if alone > max_ops {
            too_large.push((item, alone));
            continue;
        }
        let joined = sensitive || b.sensitive;
        match out.last_mut() {
            Some(batch) if ops + n + txn_overhead(joined) <= max_ops => {
                batch.push(item);
                ops += n;
                sensitive = joined;
            }
            _ => {
                sensitive = b.sensitive;
                out.push(vec![item]);
                ops = n;
            }
        }
    }
    (out, too_large)
}

/// Outcome of one binding attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    /// Committed.
    Bound,
    /// Someone else changed one of the objects first: retry next cycle.
    Conflict(String),
    /// A chosen node is owned by another allocation (the owner as stored).
    Taken {
        /// The node.
        node: String,
        /// Who holds it.
        owner: NodeOwner,
    },
    /// A hard quota would be exceeded (the authoritative check, on the counters read).
    Quota(String),
    /// The allocation is no longer schedulable (cancelled, bound, gone).
    Stale,
}

/// Bind every binding of one tenant in one guarded transaction. Bindings that are no
/// longer valid (allocation changed, node taken, quota) are left out with their outcome;
/// if the transaction loses a race, every included binding is a `Conflict`.
pub async fn bind_batch(
    backend: &Arc<dyn KvBackend>,
    tenant: &str,
    bindings: &[Binding],
) -> Result<Vec<BindOutcome>, TxnError> {
    let alloc_keys: Vec<String> = bindings
        .iter()
        .map(|b| key_of::<Allocation>(Some(&b.tenant), &b.name))
        .collect();
    let node_names: Vec<&String> = bindings.iter().flat_map(|b| b.nodes.iter()).collect();
    let node_keys: Vec<String> = node_names.iter().map(|n| key_of::<Node>(None, n)).collect();
    let tenant_key = [key_of::<Tenant>(None, tenant)];
    // Allocations, nodes and tenant at one revision, in one read.
    let all_keys: Vec<String> = alloc_keys
        .iter()
        .chain(&node_keys)
        .chain(&tenant_key)
        .cloned()
        .collect();
    let mut raw = read_raw(backend, &all_keys).await?.into_iter();
    let allocs = decode_next::<Allocation>(&mut raw, &alloc_keys)?;
    let nodes = decode_next::<Node>(&mut raw, &node_keys)?;
    let tenant_obj = decode_next::<Tenant>(&mut raw, &tenant_key)?
        .pop()
        .flatten();

    let mut outcomes = vec![BindOutcome::Stale; bindings.len()];
    let mut included = Vec::new();
    let mut w = GuardedWrite::new();
    let mut usage = tenant_obj
        .as_ref()
        .and_then(|t| t.obj.status.as_ref().map(|s| s.usage.clone()))
        .unwrap_or_default();
    let quota = tenant_obj.as_ref().map(|t| t.obj.spec.quota.clone());
    // The cluster-wide sensitive pool, read only when this batch claims for sensitive work.
    let any_sensitive = allocs.iter().flatten().any(|a| a.obj.spec.sensitive);
    let pool = if any_sensitive {
        Some(crate::sensitive_pool::read(backend).await?)
    } else {
        None
    };
    let mut pool_used = pool.as_ref().map_or(0, |p| p.used);
    let t = now();
    let mut node_at = 0;
    for (i, b) in bindings.iter().enumerate() {
        let my_nodes = &nodes[node_at..node_at + b.nodes.len()];
        node_at += b.nodes.len();
        let Some(alloc) = &allocs[i] else {
            continue;
        };
        let a = &alloc.obj;
        if !crate::scheduler::adapter::is_queued(a) {
            continue;
        }
        let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or(0) + 1;
        let (_, vc_name) = b.vcluster.split_once('/').unwrap_or(("", &b.vcluster));
        let mut groups = Vec::new();
        let mut node_writes = Vec::new();
        let mut problem = None;
        for (name, n) in b.nodes.iter().zip(my_nodes) {
            let Some(n) = n else {
                problem = Some(BindOutcome::Conflict(format!("node {name} is gone")));
                break;
            };
            if let Some(owner) = n
                .obj
                .status
                .as_ref()
                .and_then(|s| s.owner.as_ref())
                .filter(|o| o.allocation.is_some())
            {
                problem = Some(BindOutcome::Taken {
                    node: name.clone(),
                    owner: owner.clone(),
                });
                break;
            }
            // The same rule the scheduling core was given (adapter::node_state).
            if super::adapter::node_state(&n.obj) != lattice_scheduler::NodeState::Ready {
                problem = Some(BindOutcome::Conflict(format!(
                    "node {name} is not schedulable"
                )));
                break;
            }
            let mut node = n.obj.clone();
            let status = node.status.get_or_insert_with(Default::default);
            status.owner = Some(NodeOwner {
                tenant: Some(b.tenant.clone()),
                vcluster: Some(vc_name.to_string()),
                allocation: Some(b.name.clone()),
                borrowed: b.borrowed,
                attempt: Some(attempt),
                allocation_uid: a.metadata.uid.clone(),
                user: a.metadata.annotations.get(USER_ANNOTATION).cloned(),
            });
            status.allocations = vec![b.name.clone()];
            if let Some(g) = node.spec.topology_group {
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
            node_writes.push((n, node));
        }
        if let Some(p) = problem {
            outcomes[i] = p;
            continue;
        }
        let n = b.nodes.len() as u32;
        if let Some(q) = &quota {
            if let Some(max) = q.max_nodes {
                if usage.nodes + n > max {
                    outcomes[i] = BindOutcome::Quota(format!(
                        "waiting for quota headroom (max_nodes: current {}, requested {n}, limit {max})",
                        usage.nodes
                    ));
                    continue;
                }
            }
            if let Some(max) = q.max_concurrent_allocations {
                if usage.running_allocations + 1 > max {
                    outcomes[i] = BindOutcome::Quota(format!(
                        "waiting for quota headroom (max_concurrent_allocations: current {}, requested 1, limit {max})",
                        usage.running_allocations
                    ));
                    continue;
                }
            }
            if let (true, Some(max)) = (a.spec.sensitive, q.sensitive_pool_size) {
                if usage.sensitive_nodes + n > max {
                    outcomes[i] = BindOutcome::Quota(format!(
                        "waiting for quota headroom (sensitive_pool_size: current {}, requested {n}, limit {max})",
                        usage.sensitive_nodes
                    ));
                    continue;
                }
            }
        }
        if let (true, Some(pool)) = (a.spec.sensitive, &pool) {
            if let Some(msg) = pool.refuse(pool_used, n) {
                outcomes[i] = BindOutcome::Quota(msg);
                continue;
            }
            pool_used += n;
        }
        usage.nodes += n;
        usage.running_allocations += 1;
        if a.spec.sensitive {
            usage.sensitive_nodes += n;
        }
        for (stored, node) in &node_writes {
            w.put(stored, node)?;
        }
        let mut bound = a.clone();
        let status = bound.status.get_or_insert_with(AllocationStatus::default);
        status.phase = AllocationPhase::Staging;
        status.assigned_nodes = b.nodes.clone();
        groups.sort_unstable();
        status.topology_groups = groups;
        status.attempt = attempt;
        status.walltime_seconds = b.walltime_s;
        status.scheduled_time = Some(t);
        status.node_states.clear();
        status.releasing_nodes.clear();
        status.scale = None;
        status.start_time = None;
        status.end_time = None;
        status.exit_code = None;
        status.signal = None;
        if status.submit_time.is_none() {
            status.submit_time = bound.metadata.creation_timestamp.or(Some(t));
        }
        status.reason = None;
        status.message = Some(format!("scheduled on {}", b.nodes.join(",")));
        status.observed_generation = bound.metadata.generation;
        set_condition(
            &mut status.conditions,
            Condition::new(
                "Scheduled",
                ConditionStatus::True,
                "Bound",
                format!("bound to {} by {}", b.nodes.join(","), b.vcluster),
            ),
        );
        // Preemption bookkeeping belongs to the previous attempt.
        bound
            .metadata
            .annotations
            .remove(lifecycle::PREEMPT_ANNOTATION);
        // Deleting a bound allocation waits until its nodes confirmed the processes gone.
        if !bound
            .metadata
            .finalizers
            .iter()
            .any(|f| f == lifecycle::NODES_FINALIZER)
        {
            bound
                .metadata
                .finalizers
                .push(lifecycle::NODES_FINALIZER.to_string());
        }
        w.put(alloc, &bound)?;
        included.push(i);
    }
    if included.is_empty() {
        return Ok(outcomes);
    }
    if let Some(t) = &tenant_obj {
        let mut obj = t.obj.clone();
        obj.status.get_or_insert_with(Default::default).usage = usage;
        w.put(t, &obj)?;
    }
    if let Some(pool) = pool.as_ref().filter(|p| p.used != pool_used) {
        pool.write(&mut w, pool_used)?;
    }
    let ok = w.commit(backend).await?;
    for i in included {
        outcomes[i] = if ok {
            BindOutcome::Bound
        } else {
            BindOutcome::Conflict("a guarded object changed".into())
        };
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(nodes: usize, sensitive: bool) -> Binding {
        Binding {
            tenant: "t".into(),
            name: format!("a{nodes}"),
            nodes: (0..nodes).map(|i| format!("n{i}")).collect(),
            vcluster: "t/default".into(),
            walltime_s: None,
            borrowed: false,
            sensitive,
        }
    }

    fn txn_ops(batch: &[Binding]) -> usize {
        txn_overhead(batch.iter().any(|x| x.sensitive)) + batch.iter().map(ops_of).sum::<usize>()
    }

    #[test]
    fn batches_fit_the_transaction_limit_and_keep_order() {
        // 1-node bindings take 4 ops each; 2 + 31 * 4 = 126 <= 128 → 31 per batch.
        let items: Vec<Binding> = (0..70).map(|_| b(1, false)).collect();
        let (runs, too_large) = batches(items, |x| x, 128);
        assert!(too_large.is_empty());
        assert_eq!(
            runs.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![31, 31, 8]
        );
        for batch in &runs {
            assert!(txn_ops(batch) <= 128, "{}", txn_ops(batch));
        }
        // A binding larger than any transaction is set apart with what it needs.
        let (runs, too_large) = batches(vec![b(2, false), b(70, false), b(3, false)], |x| x, 128);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].len(), 2);
        assert_eq!(too_large.len(), 1);
        assert_eq!(too_large[0].1, 2 * 71 + TXN_BASE_OPS);
        // 62 nodes fit alone unless sensitive (2 * 63 + 2 = 128; + 3 for the pool).
        let (runs, too_large) = batches(vec![b(62, false), b(62, true)], |x| x, 128);
        assert_eq!(runs.len(), 1);
        assert_eq!(too_large.len(), 1);
        assert_eq!(too_large[0].1, 2 * 63 + TXN_BASE_OPS + TXN_SENSITIVE_OPS);
    }

    #[test]
    fn one_sensitive_binding_makes_its_batch_pay_for_the_pool() {
        // 30 plain bindings (122 ops) then a sensitive one: 122 + 4 + 3 > 128, so the
        // sensitive binding starts the next batch.
        let mut items: Vec<Binding> = (0..30).map(|_| b(1, false)).collect();
        items.push(b(1, true));
        items.extend((0..40).map(|_| b(1, false)));
        let (runs, too_large) = batches(items, |x| x, 128);
        assert!(too_large.is_empty());
        assert_eq!(
            runs.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![30, 30, 11]
        );
        assert!(runs[1][0].sensitive);
        for batch in &runs {
            assert!(txn_ops(batch) <= 128, "{}", txn_ops(batch));
        }
    }
}
