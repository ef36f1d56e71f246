//! Claims of named nodes (`spec.resources.nodeNames`) in the live scheduler.
//!
//! The core judges a claim ([`lattice_scheduler::claim::judge`]); the binding is the same
//! guarded transaction as every placement, so of two claims over one node the first
//! committed wins. Claims are *immediate* in a `sensitive-reservation` vCluster and for
//! sensitive allocations (Sensitive Workloads chapter: "no queueing or waitlist for
//! sensitive node claims — they are immediate or rejected"): a claim that cannot be granted
//! now fails, with `OwnershipConflict` naming the holder when another claim has the nodes.
//! Elsewhere a claim waits until its nodes are free, and says what it waits for.

use std::sync::Arc;

use lattice_apis::kinds::node::NodeOwner;
use lattice_apis::kinds::vcluster::SchedulerType;
use lattice_apis::meta::{now, set_condition, Condition, ConditionStatus};
use lattice_apis::{lifecycle, Allocation, AllocationPhase, VCluster};
use lattice_runtime::ResourceExt;
use lattice_scheduler::claim::{judge, ClaimVerdict};
use lattice_scheduler::{FilterOutcome, NodeCatalog, NodeId, PendingJob, RunningJob};

use super::adapter::Inventory;
use super::bind::{self, BindOutcome, Binding};
use super::{explain, CycleStats, Shared};
use crate::allocations::USER_ANNOTATION;

/// Whether a claim by `a` in `vc` is immediate-or-rejected.
pub fn immediate(a: &Allocation, vc: &VCluster) -> bool {
    a.spec.sensitive || vc.spec.scheduler_type == Some(SchedulerType::SensitiveReservation)
}

/// What became of one claim.
enum Decision {
    Bound(Vec<NodeId>),
    Wait(&'static str, String),
    Fail(&'static str, String),
    Retry,
}

/// Judge and bind every queued claim of this vCluster, one transaction each, in queue
/// order. Granted claims are added to `inv.running`, so later claims of the same cycle
/// and the core's placement after them see the nodes taken.
#[allow(clippy::too_many_arguments)]
pub async fn process(
    shared: &Shared,
    vc: &VCluster,
    vcluster: &str,
    claims: &[(Arc<Allocation>, PendingJob)],
    inv: &mut Inventory,
    catalog: &NodeCatalog,
    stats: &mut CycleStats,
) -> anyhow::Result<()> {
    for (a, job) in claims {
        let immediate = immediate(a, vc);
        let decision = decide(shared, a, job, vc, vcluster, inv, catalog, immediate).await?;
        match decision {
            Decision::Bound(ids) => {
                stats.bound += 1;
                stats.claims_granted += 1;
                inv.running.push(RunningJob {
                    id: lattice_scheduler::JobId(inv.running.len() as u64),
                    nodes: ids,
                    ..job_as_running(job)
                });
                inv.running_refs.push((
                    a.namespace().unwrap_or("default").to_string(),
                    a.name_any().to_string(),
                ));
            }
            Decision::Wait(code, msg) => explain(shared, a, code, &msg).await,
            Decision::Fail(code, msg) => {
                if code == lifecycle::reason::OWNERSHIP_CONFLICT {
                    stats.claims_conflicted += 1;
                } else {
                    stats.claims_rejected += 1;
                }
                reject(shared, a, code, &msg).await;
            }
            Decision::Retry => {
                stats.conflicts += 1;
                stats.retry_soon = true;
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn decide(
    shared: &Shared,
    a: &Allocation,
    job: &PendingJob,
    vc: &VCluster,
    vcluster: &str,
    inv: &Inventory,
    catalog: &NodeCatalog,
    immediate: bool,
) -> anyhow::Result<Decision> {
    let names = &a.spec.resources.node_names;
    // Names the inventory does not know get ids past its end: the core reports them Unknown.
    let ids: Vec<NodeId> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            inv.names
                .binary_search(n)
                .map(|i| NodeId(i as u32))
                .unwrap_or(NodeId((inv.names.len() + k) as u32))
        })
        .collect();
    let name_of = |id: NodeId| {
        inv.names
            .get(id.0 as usize)
            .cloned()
            .unwrap_or_else(|| names[id.0 as usize - inv.names.len()].clone())
    };
    let same_fp = immediate || a.spec.resources.constraints.require_conformance;
    let verdict = judge(catalog, &inv.running, job, &ids, same_fp);
    let refused = |code: &'static str, msg: String| {
        if immediate {
            Decision::Fail(code, msg)
        } else {
            Decision::Wait(code, msg)
        }
    };
    let invalid = lifecycle::reason::INVALID_CLAIM;
    Ok(match verdict {
        ClaimVerdict::Grant => {
            let b = Binding {
                tenant: a.namespace().unwrap_or("default").to_string(),
                name: a.name_any().to_string(),
                nodes: names.clone(),
                vcluster: vcluster.to_string(),
                walltime_s: super::adapter::walltime_s(a, Some(vc)),
                borrowed: false,
                sensitive: a.spec.sensitive,
            };
            let ops = bind::ops_for_nodes(b.nodes.len(), b.sensitive);
            let max_ops = shared.backend.max_txn_ops();
            if ops > max_ops {
                return Ok(Decision::Fail(
                    invalid,
                    format!(
                        "claiming {} nodes takes {ops} store operations in one transaction, over the store's limit of {max_ops}; raise lattice-server --max-txn-ops to at least {ops}",
                        names.len()
                    ),
                ));
            }
            let outcome = bind::bind_batch(&shared.backend, &b.tenant, std::slice::from_ref(&b))
                .await?
                .pop()
                .unwrap_or(BindOutcome::Stale);
            match outcome {
                BindOutcome::Bound => {
                    tracing::info!(allocation = %format!("{}/{}", b.tenant, b.name), nodes = ?b.nodes, "claim granted");
                    Decision::Bound(ids)
                }
                // The store is ahead of the cache: the first commit won.
                BindOutcome::Taken { node, owner } => refused(
                    lifecycle::reason::OWNERSHIP_CONFLICT,
                    conflict_message(&node, &owner),
                ),
                BindOutcome::Quota(msg) => refused("quota_headroom", msg),
                BindOutcome::Conflict(_) => Decision::Retry,
                BindOutcome::Stale => Decision::Retry,
            }
        }
        ClaimVerdict::Held { node, by } => {
            let name = name_of(node);
            // The holder as the inventory knows it (a claim granted earlier in this cycle
            // is not in the node cache yet).
            let owner = match inv.running_refs.get(by.0 as usize) {
                Some((tenant, alloc)) => NodeOwner {
                    tenant: Some(tenant.clone()),
                    allocation: Some(alloc.clone()),
                    user: shared
                        .allocations
                        .get_named(Some(tenant), alloc)
                        .and_then(|a| a.metadata.annotations.get(USER_ANNOTATION).cloned()),
                    ..Default::default()
                },
                None => Default::default(),
            };
            if immediate {
                Decision::Fail(
                    lifecycle::reason::OWNERSHIP_CONFLICT,
                    conflict_message(&name, &owner),
                )
            } else {
                Decision::Wait(
                    "nodes_occupied",
                    format!("waiting for claimed node {name} ({})", holder(&owner)),
                )
            }
        }
        ClaimVerdict::Unavailable { node, state } => refused(
            invalid,
            format!(
                "node {} is {} and cannot be claimed now; claim Ready nodes (lattice nodes --state=ready)",
                name_of(node),
                format!("{state:?}").to_lowercase()
            ),
        ),
        ClaimVerdict::Unknown { node } => refused(
            invalid,
            format!(
                "node {} is not registered; `lattice nodes` lists the nodes you can claim",
                name_of(node)
            ),
        ),
        ClaimVerdict::MixedConformance { a: x, b: y } => refused(
            invalid,
            format!(
                "nodes {} and {} have different conformance fingerprints and a claim needs one group; claim nodes of one group (lattice nodes -o wide)",
                name_of(x),
                name_of(y)
            ),
        ),
        ClaimVerdict::Unsuitable { node, why } => refused(
            invalid,
            format!("node {} {}", name_of(node), unsuitable(why, job.sensitive)),
        ),
    })
}

/// The seed's `OwnershipConflict`: which node, claimed by whom, and what to do.
pub fn conflict_message(node: &str, owner: &NodeOwner) -> String {
    format!(
        "OwnershipConflict: node {node} is already claimed ({}); select different nodes or wait until the claim is released",
        holder(owner)
    )
}

fn holder(owner: &NodeOwner) -> String {
    let alloc = format!(
        "{}/{}",
        owner.tenant.as_deref().unwrap_or("?"),
        owner.allocation.as_deref().unwrap_or("?")
    );
    match &owner.user {
        Some(u) => format!("by user {u}, allocation {alloc}"),
        None => format!("by allocation {alloc}"),
    }
}

fn unsuitable(why: FilterOutcome, sensitive: bool) -> &'static str {
    match why {
        FilterOutcome::SensitiveIsolation if sensitive => {
            "is not in the sensitive pool; sensitive allocations claim sensitive nodes only"
        }
        FilterOutcome::SensitiveIsolation => {
            "is in the sensitive pool; only sensitive allocations (--sensitive) claim it"
        }
        FilterOutcome::GpuType => "has a different GPU type than resources.constraints.gpuType",
        FilterOutcome::GpuCount => "has fewer GPUs than resources.constraints.gpuCount",
        FilterOutcome::Features => {
            "lacks a feature in resources.constraints.features, or every feature of a resources.constraints.anyOf group, or a capability its agent must report for environment.image, environment.uenv or launch.mpi (lattice.dev/oci, /uenv, /pmix)"
        }
        FilterOutcome::Memory => "has less memory than resources.constraints.memoryGb",
        FilterOutcome::UnifiedMemory => {
            "has no unified memory (resources.constraints.requireUnifiedMemory)"
        }
        FilterOutcome::Ownership => {
            "is a home node of another vCluster; claim nodes of this vCluster or the shared pool"
        }
        FilterOutcome::NotSchedulable | FilterOutcome::Feasible { .. } => "cannot be claimed now",
    }
}

fn job_as_running(job: &PendingJob) -> RunningJob {
    RunningJob {
        id: job.id,
        tenant: job.tenant,
        vcluster: job.vcluster,
        nodes: Vec::new(),
        preemption_class: job.preemption_class,
        sensitive: job.sensitive,
        start_time: job.submit_time,
        walltime_s: job.walltime_s,
        runtime_key: job.runtime_key,
        checkpoint: job.checkpoint,
        last_checkpoint: None,
        gpus_per_node: job.constraints.min_gpus_per_node,
        checkpointing: false,
        preempted_for: None,
        home_protected: false,
    }
}

/// Fail an unbound claim, guarded by the resourceVersion it was judged on.
async fn reject(shared: &Shared, a: &Allocation, code: &str, msg: &str) {
    let name = a.name_any().to_string();
    let rv = a.resource_version();
    let res = shared
        .api
        .for_obj(a)
        .update_status_with_retry(&name, 1, |cur| {
            if cur.resource_version() != rv || !super::adapter::is_queued(cur) {
                return false;
            }
            let st = cur.status.get_or_insert_with(Default::default);
            st.phase = AllocationPhase::Failed;
            st.reason = Some(code.to_string());
            st.message = Some(msg.to_string());
            st.end_time = Some(now());
            let why = if code == lifecycle::reason::OWNERSHIP_CONFLICT {
                "OwnershipConflict"
            } else {
                "InvalidClaim"
            };
            set_condition(
                &mut st.conditions,
                Condition::new("Scheduled", ConditionStatus::False, why, msg),
            );
            true
        })
        .await;
    match res {
        Ok(_) => tracing::info!(allocation = %name, reason = code, %msg, "claim rejected"),
        Err(e) => tracing::debug!(allocation = %name, error = %e, "claim rejection not written"),
    }
}
