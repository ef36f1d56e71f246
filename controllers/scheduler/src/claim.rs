//! Claims of named nodes: the user picks the nodes, the scheduler only judges the claim
//! (Sensitive Workloads chapter, "Isolation Model: User Claims Node"). A claim is granted
//! when every named node is free, schedulable, passes the job's filters, is not another
//! vCluster's home node and, when the claim needs one conformance group, all nodes share a
//! fingerprint. Whether a refused claim waits or fails is the caller's policy: in a
//! `sensitive-reservation` vCluster claims are immediate or rejected.

use crate::catalog::{FilterOutcome, NodeCatalog};
use crate::model::{JobId, NodeId, NodeState, PendingJob, RunningJob};

/// The judgement of one claim, naming the first node that stands in the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimVerdict {
    /// Every named node can be taken now.
    Grant,
    /// `node` is held by the running job `by`.
    Held { node: NodeId, by: JobId },
    /// `node` is not schedulable now (draining, drained, down).
    Unavailable { node: NodeId, state: NodeState },
    /// `node` fails one of the job's filters (the first failing one).
    Unsuitable { node: NodeId, why: FilterOutcome },
    /// The claim needs one conformance group but `a` and `b` differ.
    MixedConformance { a: NodeId, b: NodeId },
    /// `node` is not in the inventory.
    Unknown { node: NodeId },
}

/// Judge a claim of `wanted` for `job`. `same_fingerprint`: every node must share one
/// conformance fingerprint (always for sensitive claims).
pub fn judge(
    cat: &NodeCatalog,
    running: &[RunningJob],
    job: &PendingJob,
    wanted: &[NodeId],
    same_fingerprint: bool,
) -> ClaimVerdict {
    for &node in wanted {
        if let Some(r) = running.iter().find(|r| r.nodes.contains(&node)) {
            return ClaimVerdict::Held { node, by: r.id };
        }
    }
    let mut first: Option<(NodeId, u64)> = None;
    for &node in wanted {
        let Some(i) = cat.index_of(node) else {
            return ClaimVerdict::Unknown { node };
        };
        let view = cat.node(i);
        match cat.filter(cat.class_of(i), job) {
            FilterOutcome::Feasible { borrowed: false } => {}
            FilterOutcome::NotSchedulable => {
                return ClaimVerdict::Unavailable {
                    node,
                    state: view.state,
                }
            }
            // Claimed nodes are dedicated: another vCluster's home node is never lent.
            FilterOutcome::Feasible { borrowed: true } => {
                return ClaimVerdict::Unsuitable {
                    node,
                    why: FilterOutcome::Ownership,
                }
            }
            why => return ClaimVerdict::Unsuitable { node, why },
        }
        match first {
            None => first = Some((node, view.conformance_fingerprint)),
            Some((a, fp)) if same_fingerprint && fp != view.conformance_fingerprint => {
                return ClaimVerdict::MixedConformance { a, b: node }
            }
            Some(_) => {}
        }
    }
    ClaimVerdict::Grant
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn job(sensitive: bool) -> PendingJob {
        PendingJob {
            id: JobId(9),
            tenant: TenantId(0),
            vcluster: VClusterId(0),
            nodes: NodeRequest::exact(2),
            constraints: Constraints::default(),
            preemption_class: 10,
            sensitive,
            submit_time: 0,
            walltime_s: 3600,
            runtime_key: Default::default(),
            checkpoint: CheckpointInfo::default(),
            data_readiness: None,
            scale_up: None,
        }
    }

    fn nodes() -> Vec<NodeView> {
        (0..4)
            .map(|i| NodeView {
                sensitive_pool: i < 3,
                conformance_fingerprint: if i == 2 { 7 } else { 1 },
                ..NodeView::slot(i)
            })
            .collect()
    }

    fn held(id: u64, nodes: &[u32]) -> RunningJob {
        RunningJob {
            preemption_class: 10,
            sensitive: true,
            ..RunningJob::new(
                JobId(id),
                TenantId(1),
                VClusterId(0),
                nodes.iter().map(|&n| NodeId(n)).collect(),
            )
        }
    }

    #[test]
    fn free_sensitive_nodes_are_granted() {
        let cat = NodeCatalog::new(nodes());
        let v = judge(&cat, &[], &job(true), &[NodeId(0), NodeId(1)], true);
        assert_eq!(v, ClaimVerdict::Grant);
    }

    #[test]
    fn a_held_node_names_its_holder_before_anything_else() {
        let cat = NodeCatalog::new(nodes());
        let running = [held(4, &[1])];
        // Node 3 is outside the sensitive pool too, but the holder is what the user needs.
        let v = judge(&cat, &running, &job(true), &[NodeId(3), NodeId(1)], true);
        assert_eq!(
            v,
            ClaimVerdict::Held {
                node: NodeId(1),
                by: JobId(4)
            }
        );
    }

    #[test]
    fn pools_conformance_state_and_unknown_nodes_are_refused() {
        let mut views = nodes();
        views[1].state = NodeState::Draining;
        let cat = NodeCatalog::new(views);
        let j = job(true);
        assert_eq!(
            judge(&cat, &[], &j, &[NodeId(0), NodeId(3)], true),
            ClaimVerdict::Unsuitable {
                node: NodeId(3),
                why: FilterOutcome::SensitiveIsolation
            }
        );
        assert_eq!(
            judge(&cat, &[], &j, &[NodeId(0), NodeId(2)], true),
            ClaimVerdict::MixedConformance {
                a: NodeId(0),
                b: NodeId(2)
            }
        );
        assert_eq!(
            judge(&cat, &[], &j, &[NodeId(0), NodeId(2)], false),
            ClaimVerdict::Grant
        );
        assert_eq!(
            judge(&cat, &[], &j, &[NodeId(1)], true),
            ClaimVerdict::Unavailable {
                node: NodeId(1),
                state: NodeState::Draining
            }
        );
        assert_eq!(
            judge(&cat, &[], &j, &[NodeId(42)], true),
            ClaimVerdict::Unknown { node: NodeId(42) }
        );
        // A regular job may not claim sensitive-pool nodes.
        assert_eq!(
            judge(&cat, &[], &job(false), &[NodeId(0)], false),
            ClaimVerdict::Unsuitable {
                node: NodeId(0),
                why: FilterOutcome::SensitiveIsolation
            }
        );
    }

    #[test]
    fn another_vclusters_home_node_is_never_claimed() {
        let mut views = nodes();
        views[3].owner.home = Some(VClusterId(5));
        let cat = NodeCatalog::new(views);
        let mut j = job(false);
        j.constraints.allow_borrowed = true;
        assert_eq!(
            judge(&cat, &[], &j, &[NodeId(3)], false),
            ClaimVerdict::Unsuitable {
                node: NodeId(3),
                why: FilterOutcome::Ownership
            }
        );
    }
}
