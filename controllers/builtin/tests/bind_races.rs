//! Binding under races, against the real store: several scheduler replicas bind random
//! proposals at once (random allocations, nodes and batches, in whatever order the
//! runtime interleaves them). Whatever wins, no node is ever given to two allocations, no
//! allocation is bound twice, and the tenant's hard quotas (`maxNodes`,
//! `maxConcurrentAllocations`) hold, with the usage counters equal to what is bound.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::*;
use lattice_apis::{Allocation, AllocationPhase, Node, Tenant};
use lattice_controllers::scheduler::bind::{bind_batch, BindOutcome, Binding};
use lattice_runtime::{Api, ListParams, ResourceExt};
use proptest::prelude::*;
use serde_json::json;

const NODES: usize = 6;
const ALLOCATIONS: usize = 8;

/// One replica's proposals: batches of (allocation, nodes).
type Proposals = Vec<Vec<(usize, Vec<usize>)>>;

/// Batches as one cycle's plan makes them: an allocation and a node at most once per batch
/// (replicas and batches still overlap freely).
fn proposals() -> impl Strategy<Value = Proposals> {
    let binding = (
        0..ALLOCATIONS,
        prop::collection::btree_set(0..NODES, 1..3).prop_map(|s| s.into_iter().collect()),
    );
    let batch =
        prop::collection::vec(binding, 1..4).prop_map(|bindings: Vec<(usize, Vec<usize>)>| {
            let (mut allocs, mut nodes) = (BTreeSet::new(), BTreeSet::new());
            bindings
                .into_iter()
                .filter(|(a, ns)| {
                    let fresh = !allocs.contains(a) && ns.iter().all(|n| !nodes.contains(n));
                    if fresh {
                        allocs.insert(*a);
                        nodes.extend(ns.iter().copied());
                    }
                    fresh
                })
                .collect::<Vec<_>>()
        });
    prop::collection::vec(batch, 1..4)
}

async fn race(replicas: Vec<Proposals>, max_nodes: u32, max_allocs: u32) {
    let env = env().await;
    let mut t: Tenant = serde_json::from_value(json!({"metadata": {"name": "t1"}})).expect("t");
    t.spec.quota.max_nodes = Some(max_nodes);
    t.spec.quota.max_concurrent_allocations = Some(max_allocs);
    Api::<Tenant>::all(env.client.clone())
        .create(&Default::default(), &t)
        .await
        .expect("tenant");
    for n in 0..NODES {
        env.node(&format!("n{n}"), (n / 3) as u32).await;
    }
    for a in 0..ALLOCATIONS {
        env.submit("t1", &format!("a{a}"), 1, json!({})).await;
    }
    let backend = env.backend.clone();
    let tasks: Vec<_> = replicas
        .into_iter()
        .enumerate()
        .map(|(r, batches)| {
            let backend = Arc::clone(&backend);
            tokio::spawn(async move {
                let mut bound = 0;
                for batch in batches {
                    let bindings: Vec<Binding> = batch
                        .iter()
                        .map(|(a, nodes)| Binding {
                            tenant: "t1".into(),
                            name: format!("a{a}"),
                            nodes: nodes.iter().map(|n| format!("n{n}")).collect(),
                            vcluster: format!("t1/replica-{r}"),
                            walltime_s: Some(600),
                            borrowed: false,
                            sensitive: false,
                        })
                        .collect();
                    let outcomes = bind_batch(&backend, "t1", &bindings).await.expect("bind");
                    bound += outcomes
                        .iter()
                        .filter(|o| matches!(o, BindOutcome::Bound))
                        .count();
                    tokio::task::yield_now().await;
                }
                bound
            })
        })
        .collect();
    let mut reported = 0;
    for t in tasks {
        reported += t.await.expect("replica");
    }
    // What the store says.
    let allocs = Api::<Allocation>::namespaced(env.client.clone(), "t1")
        .list(&ListParams::default())
        .await
        .expect("allocations")
        .items;
    let nodes = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items;
    let bound: Vec<&Allocation> = allocs
        .iter()
        .filter(|a| a.phase() == AllocationPhase::Staging)
        .collect();
    assert_eq!(
        bound.len(),
        reported,
        "every Bound answer is in the store, once"
    );
    let mut holder: BTreeMap<String, String> = BTreeMap::new();
    for a in &bound {
        let st = a.status.as_ref().expect("status");
        assert_eq!(st.attempt, 1, "{} bound twice", a.name_any());
        for n in &st.assigned_nodes {
            if let Some(other) = holder.insert(n.clone(), a.name_any().to_string()) {
                panic!("node {n} given to {other} and {}", a.name_any());
            }
        }
    }
    for n in &nodes {
        let owner = n.status.as_ref().and_then(|s| s.owner.as_ref());
        let owned_by = owner.and_then(|o| o.allocation.clone());
        assert_eq!(
            owned_by.as_ref(),
            holder.get(n.name_any()),
            "node {} owner vs assignments",
            n.name_any()
        );
    }
    let nodes_used: usize = holder.len();
    let (usage_nodes, usage_allocs) = env.tenant_usage("t1").await;
    assert_eq!(usage_nodes as usize, nodes_used);
    assert_eq!(usage_allocs as usize, bound.len());
    assert!(
        usage_nodes <= max_nodes,
        "{usage_nodes} > maxNodes {max_nodes}"
    );
    assert!(
        usage_allocs <= max_allocs,
        "{usage_allocs} > maxConcurrentAllocations {max_allocs}"
    );
    let distinct: BTreeSet<&str> = bound.iter().map(|a| a.name_any()).collect();
    assert_eq!(distinct.len(), bound.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn racing_replicas_never_double_assign_or_exceed_quotas(
        replicas in prop::collection::vec(proposals(), 2..4),
        max_nodes in 2u32..7,
        max_allocs in 1u32..5,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(race(replicas, max_nodes, max_allocs));
    }
}
