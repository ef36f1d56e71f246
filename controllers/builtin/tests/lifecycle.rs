//! Allocations through their life against a real store: bound, run and released;
//! held by quota; stopped by a failed node; cancelled; requeued; drained; audited.
//!
//! The same scenarios with the real `lattice-agent` processes are in `e2e/`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use lattice_apis::{lifecycle, Allocation, AllocationPhase, NodeTaskPhase};
use lattice_runtime::{Api, ListParams, Patch, PatchParams, ResourceExt};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_runs_and_releases() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    env.submit("t1", "a", 1, json!({})).await;
    let a = env.wait_phase("t1", "a", AllocationPhase::Staging).await;
    let st = a.status.clone().expect("status");
    assert_eq!(st.assigned_nodes.len(), 1);
    assert_eq!(st.attempt, 1);
    assert_eq!(st.walltime_seconds, Some(600));
    let node = st.assigned_nodes[0].clone();
    assert_eq!(env.owners().await[&node].as_deref(), Some("a"));
    assert_eq!(env.tenant_usage("t1").await, (1, 1));
    env.run_to_end("t1", "a", 0).await;
    let a = env.get("t1", "a").await;
    assert_eq!(a.phase(), AllocationPhase::Completed);
    assert_eq!(a.status.as_ref().and_then(|s| s.exit_code), Some(0));
    // Released after the node confirmed.
    for _ in 0..500 {
        if env.owners().await[&node].is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(env.owners().await[&node], None);
    assert_eq!(env.tenant_usage("t1").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_quota_holds_and_is_explained() {
    let mut env = env().await;
    env.tenant("t1", Some(2)).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    for n in ["n1", "n2", "n3", "n4"] {
        env.node(n, 0).await;
    }
    let _hb = heartbeats(&env, &["n1", "n2", "n3", "n4"]);
    env.start_controllers(fast_config());
    for n in ["a", "b", "c"] {
        env.submit("t1", n, 1, json!({})).await;
    }
    env.wait_phase("t1", "a", AllocationPhase::Staging).await;
    env.wait_phase("t1", "b", AllocationPhase::Staging).await;
    let c = env
        .wait_alloc("t1", "c", "quota reason", |a| {
            a.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("quota_headroom")
        })
        .await;
    let msg = c.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        msg.contains("max_nodes: current 2, requested 1, limit 2"),
        "{msg}"
    );
    assert_eq!(env.tenant_usage("t1").await, (2, 2));
    env.run_to_end("t1", "a", 0).await;
    env.wait_phase("t1", "c", AllocationPhase::Staging).await;
    assert_eq!(env.tenant_usage("t1").await, (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_stops_the_others_and_nodes_wait_for_confirmation() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    env.submit(
        "t1",
        "mpi",
        2,
        json!({"spec": {"requeue": {"policy": "never"}}}),
    )
    .await;
    let a = env.wait_phase("t1", "mpi", AllocationPhase::Staging).await;
    let nodes = a.status.unwrap().assigned_nodes;
    for n in &nodes {
        env.report("t1", "mpi", n, NodeTaskPhase::Running, None, "")
            .await;
    }
    env.wait_phase("t1", "mpi", AllocationPhase::Running).await;
    env.report(
        "t1",
        "mpi",
        &nodes[0],
        NodeTaskPhase::Failed,
        Some(3),
        "NonZeroExit",
    )
    .await;
    let a = env.get("t1", "mpi").await;
    assert_eq!(a.phase(), AllocationPhase::Failed);
    assert_eq!(a.status.as_ref().and_then(|s| s.exit_code), Some(3));
    assert_eq!(
        lifecycle::should_run(&a, &nodes[1], 1),
        lifecycle::RunDecision::Stop("Stopped")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let owners = env.owners().await;
    assert_eq!(owners[&nodes[0]], None, "the failed node is released");
    assert_eq!(
        owners[&nodes[1]].as_deref(),
        Some("mpi"),
        "held until its agent confirms"
    );
    env.report(
        "t1",
        "mpi",
        &nodes[1],
        NodeTaskPhase::Failed,
        None,
        "Stopped",
    )
    .await;
    for _ in 0..500 {
        if env.owners().await[&nodes[1]].is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(env.owners().await[&nodes[1]], None);
    assert_eq!(
        env.get("t1", "mpi").await.phase(),
        AllocationPhase::Failed,
        "terminal stays"
    );
    assert_eq!(env.tenant_usage("t1").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_start() {
    let (env, _hb) = cluster(&["n1"]).await;
    env.submit("t1", "big", 4, json!({})).await; // never fits
    env.wait_alloc("t1", "big", "pending reason", |a| {
        a.status.as_ref().and_then(|s| s.reason.as_ref()).is_some()
    })
    .await;
    let patch =
        Patch::Merge(json!({"metadata": {"annotations": {lifecycle::CANCEL_ANNOTATION: "true"}}}));
    env.allocations("t1")
        .patch("big", &PatchParams::default(), &patch)
        .await
        .expect("cancel");
    let a = env
        .wait_phase("t1", "big", AllocationPhase::Cancelled)
        .await;
    assert_eq!(a.status.unwrap().reason.as_deref(), Some("cancelled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_group_respects_concurrency() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let seen_active = Arc::new(Mutex::new(0usize));
    let runner = auto_runner(&env, "t1", |_| 0);
    env.submit(
        "t1",
        "sweep",
        1,
        json!({"spec": {
            "taskGroup": {"range": "0-9", "concurrency": 2},
            // The seed's template placeholder.
            "entrypoint": "python sweep.py --config=${INDEX}",
        }}),
    )
    .await;
    let api = env.allocations("t1");
    let parent = loop {
        let list = api.list(&ListParams::default()).await.expect("list");
        let active = list
            .items
            .iter()
            .filter(|a| {
                a.labels().contains_key("lattice.dev/task-index") && !a.phase().is_terminal()
            })
            .count();
        {
            let mut m = seen_active.lock().unwrap();
            *m = (*m).max(active);
        }
        let parent = list
            .items
            .iter()
            .find(|a| a.name_any() == "sweep")
            .cloned()
            .expect("parent");
        if parent.phase().is_terminal() {
            break parent;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    runner.abort();
    assert_eq!(parent.phase(), AllocationPhase::Completed);
    let tasks = parent.status.unwrap().tasks.unwrap();
    assert_eq!((tasks.total, tasks.completed), (10, 10));
    assert!(
        *seen_active.lock().unwrap() <= 2,
        "concurrency 2 exceeded: {}",
        seen_active.lock().unwrap()
    );
    let elements: Vec<Allocation> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|a| a.labels().contains_key("lattice.dev/task-index"))
        .collect();
    assert_eq!(elements.len(), 10);
    for e in &elements {
        let i = &e.labels()["lattice.dev/task-index"];
        assert_eq!(
            e.spec.entrypoint.as_deref(),
            Some(format!("python sweep.py --config={i}").as_str()),
            "element {i}"
        );
        assert!(e.spec.task_group.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_down_requeues_on_another_node() {
    let mut env = env().await;
    env.tenant("t1", None).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    env.node("n1", 0).await;
    env.node("n2", 0).await;
    env.start_controllers(fast_config());
    // Only n1 beats at first, so the allocation lands there.
    let hb1 = heartbeats(&env, &["n1"]);
    let patch = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    env.nodes()
        .patch("n2", &PatchParams::default(), &patch)
        .await
        .expect("cordon");
    env.submit("t1", "job", 1, json!({})).await;
    let a = env.wait_phase("t1", "job", AllocationPhase::Staging).await;
    assert_eq!(
        a.status.as_ref().unwrap().assigned_nodes,
        vec!["n1".to_string()]
    );
    env.report("t1", "job", "n1", NodeTaskPhase::Running, None, "")
        .await;
    let _hb2 = heartbeats(&env, &["n2"]);
    let patch = Patch::Merge(json!({"spec": {"unschedulable": false}}));
    env.nodes()
        .patch("n2", &PatchParams::default(), &patch)
        .await
        .expect("uncordon");
    hb1.abort(); // n1's agent dies
    let a = env
        .wait_alloc("t1", "job", "rebound on n2", |a| {
            a.status
                .as_ref()
                .is_some_and(|s| s.assigned_nodes == vec!["n2".to_string()])
        })
        .await;
    let st = a.status.unwrap();
    assert_eq!(st.requeue_count, 1);
    assert_eq!(st.attempt, 2);
    let n1 = env.nodes().get("n1").await.unwrap();
    assert_eq!(format!("{:?}", n1.status.unwrap().state), "Down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_allocation_keeps_its_node_until_the_agent_confirms() {
    let (env, _hb) = cluster(&["n1"]).await;
    env.submit("t1", "long", 1, json!({})).await;
    let a = env.wait_phase("t1", "long", AllocationPhase::Staging).await;
    assert!(a
        .metadata
        .finalizers
        .iter()
        .any(|f| f == lifecycle::NODES_FINALIZER));
    env.report("t1", "long", "n1", NodeTaskPhase::Running, None, "")
        .await;
    env.allocations("t1")
        .delete("long", &Default::default())
        .await
        .expect("delete");
    // Deletion is a cancel: the agent is told to stop...
    let a = env.get("t1", "long").await;
    assert!(a.metadata.deletion_timestamp.is_some());
    assert_eq!(
        lifecycle::should_run(&a, "n1", 1),
        lifecycle::RunDecision::Stop("Cancelled")
    );
    // ...and until it confirms, the node stays owned and nothing else lands there.
    env.submit("t1", "next", 1, json!({})).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(env.owners().await["n1"].as_deref(), Some("long"));
    assert_eq!(
        env.get("t1", "next").await.phase(),
        AllocationPhase::Pending
    );
    env.report("t1", "long", "n1", NodeTaskPhase::Failed, None, "Cancelled")
        .await;
    let next = env.wait_phase("t1", "next", AllocationPhase::Staging).await;
    assert_eq!(next.status.unwrap().assigned_nodes, vec!["n1".to_string()]);
    assert!(
        env.allocations("t1")
            .get_opt("long")
            .await
            .unwrap()
            .is_none(),
        "deleted after confirmation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_drains_at_once_and_a_busy_one_after_its_work() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    env.submit("t1", "busy", 1, json!({})).await;
    let a = env.wait_phase("t1", "busy", AllocationPhase::Staging).await;
    let busy = a.status.unwrap().assigned_nodes[0].clone();
    let idle = if busy == "n1" { "n2" } else { "n1" };
    let drain = Patch::Merge(json!({"spec": {"drain": {"reason": "maintenance"}}}));
    for n in [idle, busy.as_str()] {
        env.nodes()
            .patch(n, &PatchParams::default(), &drain)
            .await
            .expect("drain");
    }
    let state = |n: &str| {
        let api = env.nodes();
        let n = n.to_string();
        async move { format!("{:?}", api.get(&n).await.unwrap().status.unwrap().state) }
    };
    for _ in 0..200 {
        if state(idle).await == "Drained" && state(&busy).await == "Draining" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state(idle).await, "Drained");
    assert_eq!(state(&busy).await, "Draining");
    env.run_to_end("t1", "busy", 0).await;
    for _ in 0..200 {
        if state(&busy).await == "Drained" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state(&busy).await, "Drained");
    let undrain = Patch::Merge(json!({"spec": {"drain": null}}));
    env.nodes()
        .patch(idle, &PatchParams::default(), &undrain)
        .await
        .expect("undrain");
    for _ in 0..200 {
        if state(idle).await == "Ready" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state(idle).await, "Ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_audit_corrects_drifted_counters() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    env.submit("t1", "a", 1, json!({})).await;
    env.wait_phase("t1", "a", AllocationPhase::Staging).await;
    // Corrupt the counters behind the controllers' back.
    let tenants: Api<lattice_apis::Tenant> = Api::all(env.client.clone());
    let patch = Patch::Merge(json!({"status": {"usage": {"nodes": 7, "runningAllocations": 5}}}));
    tenants
        .patch_status("t1", &PatchParams::default(), &patch)
        .await
        .expect("corrupt");
    let fixed = lattice_controllers::release::audit_usage(&env.backend)
        .await
        .expect("audit");
    assert_eq!(fixed, 1);
    assert_eq!(env.tenant_usage("t1").await, (1, 1));
    assert_eq!(
        lattice_controllers::release::audit_usage(&env.backend)
            .await
            .expect("audit"),
        0
    );
}
