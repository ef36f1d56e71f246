//! Binding against a real store: two schedulers, bursts, preemption, lending, the
//! vCluster loop's wake-up and topology-aware placement.
//!
//! The same scenarios with the real `lattice-agent` processes are in `e2e/`.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use lattice_apis::{lifecycle, Allocation, AllocationPhase, Node};
use lattice_runtime::{
    Api, ListParams, Patch, PatchParams, PostParams, ResourceExt, WatchEvent, WatchParams,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_never_double_assign() {
    let mut env = env().await;
    env.tenant("t1", Some(3)).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    let names = ["n1", "n2", "n3", "n4"];
    for n in names {
        env.node(n, 0).await;
    }
    let _hb = heartbeats(&env, &names);
    // Watch every node owner change from the beginning.
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut w = nodes.watch(&WatchParams::default()).await.expect("watch");
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let max_owned = Arc::new(Mutex::new(0usize));
    {
        let violations = violations.clone();
        let max_owned = max_owned.clone();
        tokio::spawn(async move {
            let mut owner: HashMap<String, Option<String>> = HashMap::new();
            while let Some(ev) = w.next().await {
                let Ok(WatchEvent::Added(n) | WatchEvent::Modified(n)) = ev else {
                    continue;
                };
                let now = n
                    .status
                    .as_ref()
                    .and_then(|s| s.owner.as_ref())
                    .and_then(|o| o.allocation.clone());
                let before = owner
                    .insert(n.name_any().to_string(), now.clone())
                    .flatten();
                if let (Some(b), Some(a)) = (&before, &now) {
                    if b != a {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("{}: {b} -> {a}", n.name_any()));
                    }
                }
                let owned = owner.values().filter(|o| o.is_some()).count();
                let mut m = max_owned.lock().unwrap();
                *m = (*m).max(owned);
            }
        });
    }
    env.start_controllers(fast_config());
    env.start_controllers(fast_config());
    let _runner = auto_runner(&env, "t1", |_| 0);
    for i in 0..40 {
        env.submit("t1", &format!("j{i}"), 1 + (i % 2), json!({}))
            .await;
    }
    for i in 0..40 {
        env.wait_phase("t1", &format!("j{i}"), AllocationPhase::Completed)
            .await;
    }
    let v = violations.lock().unwrap().clone();
    assert!(
        v.is_empty(),
        "a node changed owner without being released: {v:?}"
    );
    let m = *max_owned.lock().unwrap();
    assert!(
        m <= 3,
        "tenant max_nodes 3 exceeded: {m} nodes owned at once"
    );
    // Every allocation ran exactly once.
    for i in 0..40 {
        let a = env.get("t1", &format!("j{i}")).await;
        assert_eq!(a.status.unwrap().attempt, 1);
    }
}

/// Regression: a burst of bindings larger than one store transaction (the store's
/// `max_txn_ops`, 128 here) once failed every cycle and wedged the scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_one_transaction_is_bound_in_batches() {
    let mut env = env().await;
    assert_eq!(env.backend.max_txn_ops(), 128);
    env.tenant("t1", None).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    let names: Vec<String> = (0..100).map(|i| format!("n{i:03}")).collect();
    for n in &names {
        env.node(n, 0).await;
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let _hb = heartbeats(&env, &refs);
    // All queued before the scheduler starts: its first cycle places them together
    // (36 bindings = 2 + 36 * 4 = 146 operations as one transaction).
    for i in 0..36 {
        env.submit("t1", &format!("j{i:02}"), 1, json!({})).await;
    }
    // And one that cannot fit any transaction: 64 nodes = 2 * 65 + 2 = 132 operations.
    env.submit("t1", "huge", 64, json!({})).await;
    env.start_controllers(fast_config());
    for i in 0..36 {
        env.wait_phase("t1", &format!("j{i:02}"), AllocationPhase::Staging)
            .await;
    }
    let huge = env
        .wait_alloc("t1", "huge", "explained", |a| {
            reason_of(a) == Some("too_large_for_one_transaction")
        })
        .await;
    assert!(
        message_of(&huge).contains("raise lattice-server --max-txn-ops to at least 132"),
        "{}",
        message_of(&huge)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemptor_waits_for_its_victim_instead_of_preempting_more() {
    // Three class-1 jobs fill three nodes; a class-8 job needs one. Its victim takes 3 s to
    // stop (several 1-s cycles): exactly one victim is asked, the others run on.
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    for name in ["low-0", "low-1", "low-2", "urgent"] {
        plans.set(name, Run::Hold);
    }
    let _runner = scripted_runner_stopping_after(&env, "t1", plans, Duration::from_secs(3));
    for i in 0..3 {
        env.submit(
            "t1",
            &format!("low-{i}"),
            1,
            json!({"spec": {"preemptionClass": 1, "checkpoint": {"strategy": "auto"}}}),
        )
        .await;
    }
    for i in 0..3 {
        env.wait_phase("t1", &format!("low-{i}"), AllocationPhase::Running)
            .await;
    }
    env.submit("t1", "urgent", 1, json!({"spec": {"preemptionClass": 8}}))
        .await;
    let asked = |list: &[Allocation]| -> Vec<String> {
        list.iter()
            .filter(|a| {
                lifecycle::preempt_requested(a)
                    || a.status.as_ref().is_some_and(|s| s.preemption_count > 0)
            })
            .map(|a| a.name_any().to_string())
            .collect()
    };
    let api = env.allocations("t1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut waited = false;
    let urgent = loop {
        let list = api.list(&ListParams::default()).await.expect("list").items;
        let victims = asked(&list);
        assert!(victims.len() <= 1, "more victims than needed: {victims:?}");
        let u = list
            .iter()
            .find(|a| a.name_any() == "urgent")
            .cloned()
            .expect("urgent");
        if reason_of(&u) == Some("waiting_for_preemption") {
            waited = true;
        }
        if matches!(
            u.phase(),
            AllocationPhase::Staging | AllocationPhase::Running
        ) {
            break u;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "urgent never started: {:?}",
            u.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(waited, "the preemptor said it waits for its victim");
    let list = api.list(&ListParams::default()).await.expect("list").items;
    let victims = asked(&list);
    assert_eq!(victims.len(), 1, "{victims:?}");
    let victim = list
        .iter()
        .find(|a| a.name_any() == victims[0])
        .expect("victim");
    // The victim is back in the queue (its class-1 work waits), on the node the urgent job took.
    assert_eq!(
        victim.phase(),
        AllocationPhase::Pending,
        "{:?}",
        victim.status
    );
    assert_eq!(victim.status.as_ref().map(|s| s.preemption_count), Some(1));
    let others = list
        .iter()
        .filter(|a| a.name_any().starts_with("low-") && a.name_any() != victims[0])
        .filter(|a| a.phase() == AllocationPhase::Running)
        .count();
    assert_eq!(others, 2, "the other low-class jobs run on");
    assert_eq!(urgent.status.expect("status").assigned_nodes.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_allocation_wakes_its_vcluster_loop_before_the_cycle_interval() {
    // A 10-minute cycle interval: only the wake-up on the allocation's arrival can place it
    // within the test's seconds.
    let mut env = env().await;
    env.tenant("t1", None).await;
    let v: lattice_apis::VCluster = serde_json::from_value(json!({
        "metadata": {"name": "default", "namespace": "t1"},
        "spec": {"schedulerType": "interactive-fifo", "cycleInterval": "10m"},
    }))
    .expect("vcluster");
    Api::<lattice_apis::VCluster>::namespaced(env.client.clone(), "t1")
        .create(&PostParams::default(), &v)
        .await
        .expect("vcluster");
    env.node("n1", 0).await;
    let _hb = heartbeats(&env, &["n1"]);
    env.start_controllers(fast_config());
    let _runner = auto_runner(&env, "t1", |_| 0);
    // Let the loop run its first cycle on an empty queue and go to sleep.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = tokio::time::Instant::now();
    env.submit("t1", "quick", 1, json!({})).await;
    let a = env
        .wait_phase("t1", "quick", AllocationPhase::Completed)
        .await;
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "placed after {:?}",
        t0.elapsed()
    );
    assert_eq!(a.status.expect("status").attempt, 1);
    // A second one while the first's node is busy or free again: woken too.
    env.submit("t1", "quick-2", 1, json!({})).await;
    env.wait_phase("t1", "quick-2", AllocationPhase::Completed)
        .await;
    assert!(t0.elapsed() < Duration::from_secs(40), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_node_gpu_work_lands_where_gpus_sit_next_to_nics() {
    // Four 4-GPU nodes in one group, as their agents report them: g1 and g2 with a NIC
    // near only half their GPUs (PCIe layout), g3 and g4 with one per two GPUs (NVSwitch).
    let (env, _hb) = cluster(&["g1", "g2", "g3", "g4"]).await;
    for (i, n) in ["g1", "g2", "g3", "g4"].iter().enumerate() {
        let mut links = Vec::new();
        for a in 0..4 {
            for b in a + 1..4 {
                links.push(json!({"gpuA": a, "gpuB": b,
                    "linkType": if i < 2 { "Pcie" } else { "NvSwitch" },
                    "bandwidthGbps": if i < 2 { 64.0 } else { 900.0 }}));
            }
        }
        let affinity = if i < 2 {
            json!({"0": "hsn0", "1": "hsn0"})
        } else {
            json!({"0": "hsn0", "1": "hsn0", "2": "hsn1", "3": "hsn1"})
        };
        let patch = Patch::Merge(
            json!({"spec": {"topologyGroup": 0}, "status": {"capacity": {
                "cpuCores": 4, "memoryGb": 16, "gpuCount": 4, "gpuType": "H100",
                "gpuTopology": {"links": links, "nics": ["hsn0", "hsn1"], "nicAffinity": affinity},
            }}}),
        );
        env.nodes()
            .patch_status(n, &PatchParams::default(), &patch)
            .await
            .expect("capacity");
        env.nodes()
            .patch(n, &PatchParams::default(), &patch)
            .await
            .expect("group");
    }
    let _runner = auto_runner(&env, "t1", |_| 0);
    env.submit(
        "t1",
        "allreduce",
        2,
        json!({"spec": {"resources": {"constraints": {"gpuCount": 4}}}}),
    )
    .await;
    let a = env
        .wait_alloc("t1", "allreduce", "bound", |a| {
            a.status
                .as_ref()
                .is_some_and(|s| !s.assigned_nodes.is_empty())
        })
        .await;
    let mut nodes = a.status.expect("status").assigned_nodes;
    nodes.sort();
    assert_eq!(nodes, ["g3", "g4"], "the nodes with a NIC near every GPU");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lender_takes_back_the_nodes_it_lent() {
    let mut env = env().await;
    env.tenant("t1", None).await;
    let vcs: Api<lattice_apis::VCluster> = Api::namespaced(env.client.clone(), "t1");
    for (name, spec) in [
        (
            "lender",
            // Preemption off: taking back lent nodes is not class-based preemption.
            json!({"schedulerType": "service-binpack", "cycleInterval": "1s",
                   "homeNodes": ["n1", "n2"], "preemption": {"mode": "never"}}),
        ),
        (
            "guest",
            json!({"schedulerType": "hpc-backfill", "cycleInterval": "1s"}),
        ),
    ] {
        let v: lattice_apis::VCluster = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "t1"}, "spec": spec}),
        )
        .expect("vcluster");
        vcs.create(&PostParams::default(), &v)
            .await
            .expect("vcluster");
    }
    for n in ["n1", "n2"] {
        env.node(n, 0).await;
    }
    let _hb = heartbeats(&env, &["n1", "n2"]);
    env.start_controllers(fast_config());

    // The guest borrows both idle home nodes of the lender.
    env.submit(
        "t1",
        "borrower",
        2,
        json!({"spec": {"vcluster": "guest", "preemptionClass": 9}}),
    )
    .await;
    let b = env
        .wait_phase("t1", "borrower", AllocationPhase::Staging)
        .await;
    assert_eq!(b.status.expect("status").assigned_nodes.len(), 2);
    let owner = env
        .nodes()
        .get("n1")
        .await
        .expect("n1")
        .status
        .and_then(|s| s.owner)
        .expect("owner");
    assert!(owner.borrowed, "n1 is lent, not owned: {owner:?}");

    // A class-0 job of the lender asks for one node back: the borrower is sent back
    // although it outranks it.
    // Every change of the lender's job, from before it exists (its explanation may be
    // replaced once the borrower is stopping).
    let mut changes = env
        .allocations("t1")
        .watch(&WatchParams::default())
        .await
        .expect("watch");
    env.submit(
        "t1",
        "home-job",
        1,
        json!({"spec": {"vcluster": "lender", "preemptionClass": 0}}),
    )
    .await;
    let b = env
        .wait_alloc(
            "t1",
            "borrower",
            "preemption requested",
            lifecycle::preempt_requested,
        )
        .await;
    assert_eq!(
        b.metadata
            .annotations
            .get(lifecycle::PREEMPT_ANNOTATION)
            .map(String::as_str),
        Some("t1/home-job")
    );
    let h = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(ev) = changes.next().await {
            if let Ok(WatchEvent::Added(a) | WatchEvent::Modified(a)) = ev {
                if a.name_any() == "home-job" && message_of(&a).starts_with("reclaiming home nodes")
                {
                    return a;
                }
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("home-job explained as reclaiming");
    assert_eq!(h.phase(), AllocationPhase::Pending);
    // The simulated agents stop the borrower; the lender's job gets its node.
    let _runner = auto_runner(&env, "t1", |_| 0);
    let h = env
        .wait_phase("t1", "home-job", AllocationPhase::Completed)
        .await;
    let node = &h.status.expect("status").assigned_nodes[0];
    assert!(node == "n1" || node == "n2");
    let b = env.get("t1", "borrower").await;
    assert!(b.status.expect("status").preemption_count >= 1);
}
