//! The built-in controllers against a real store, with simulated agents reporting through
//! the ADR-002 contract. (The same scenarios with the real `lattice-agent` processes are
//! in `e2e/`.)

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use lattice_apis::{lifecycle, Allocation, AllocationPhase, Dag, Node, NodeTaskPhase};
use lattice_runtime::{
    Api, ListParams, Patch, PatchParams, PostParams, ResourceExt, WatchEvent, WatchParams,
};
use serde_json::json;

/// Keep every node's heartbeat fresh.
fn heartbeats(env: &Env, nodes: &[&str]) -> tokio::task::JoinHandle<()> {
    let client = env.client.clone();
    let nodes: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    tokio::spawn(async move {
        loop {
            for n in &nodes {
                beat(&client, n).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// A simulated agent fleet: runs every bound allocation to its end, exit code chosen by
/// `exit_of(name)`.
fn auto_runner(
    env: &Env,
    tenant: &str,
    exit_of: impl Fn(&str) -> i32 + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), tenant);
    let exit_of = Arc::new(exit_of);
    tokio::spawn(async move {
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                for a in list.items {
                    let st = a.status.clone().unwrap_or_default();
                    if st.phase != AllocationPhase::Staging && st.phase != AllocationPhase::Running
                    {
                        continue;
                    }
                    let exit = exit_of(a.name_any());
                    for n in st.assigned_nodes.clone() {
                        let node_done = st
                            .node_states
                            .get(&n)
                            .is_some_and(|s| s.attempt == st.attempt && s.phase.is_terminal());
                        if node_done {
                            continue;
                        }
                        let name = a.name_any().to_string();
                        let _ = api
                            .update_status_with_retry(&name, 20, |cur| {
                                let attempt = cur.status.as_ref().map(|s| s.attempt).unwrap_or(0);
                                let stop = lifecycle::should_run(cur, &n, attempt);
                                let (phase, code, why) = match stop {
                                    lifecycle::RunDecision::Stop(r) => {
                                        (NodeTaskPhase::Failed, None, r)
                                    }
                                    _ if exit == 0 => (
                                        NodeTaskPhase::Succeeded,
                                        Some(0),
                                        lifecycle::node_reason::EXITED,
                                    ),
                                    _ => (
                                        NodeTaskPhase::Failed,
                                        Some(exit),
                                        lifecycle::node_reason::NON_ZERO_EXIT,
                                    ),
                                };
                                let r = lattice_apis::NodeTaskState {
                                    phase,
                                    attempt,
                                    start_time: Some(lattice_apis::meta::now()),
                                    end_time: Some(lattice_apis::meta::now()),
                                    exit_code: code,
                                    reason: Some(why.into()),
                                    ..Default::default()
                                };
                                lifecycle::record_node_state(cur, &n, r, lattice_apis::meta::now())
                            })
                            .await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
}

async fn cluster(nodes: &[&str]) -> (Env, tokio::task::JoinHandle<()>) {
    let mut env = env().await;
    env.tenant("t1", None).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    for (i, n) in nodes.iter().enumerate() {
        env.node(n, (i / 2) as u32).await;
    }
    let hb = heartbeats(&env, nodes);
    env.start_controllers(fast_config());
    (env, hb)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependencies_between_allocations() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    let _runner = auto_runner(&env, "t1", |name| if name == "first" { 1 } else { 0 });
    env.submit("t1", "first", 1, json!({})).await;
    env.submit(
        "t1",
        "on-ok",
        1,
        json!({"spec": {"dependsOn": [{"ref": "first", "condition": "success"}]}}),
    )
    .await;
    env.submit(
        "t1",
        "on-fail",
        1,
        json!({"spec": {"dependsOn": [{"ref": "first", "condition": "failure"}]}}),
    )
    .await;
    env.submit(
        "t1",
        "on-any",
        1,
        json!({"spec": {"dependsOn": [{"ref": "first", "condition": "any"}]}}),
    )
    .await;
    let held = env.get("t1", "on-ok").await;
    assert_ne!(held.phase(), AllocationPhase::Staging);
    env.wait_phase("t1", "first", AllocationPhase::Failed).await;
    let ok = env
        .wait_phase("t1", "on-ok", AllocationPhase::Cancelled)
        .await;
    assert_eq!(
        ok.status.unwrap().reason.as_deref(),
        Some("dependency_never_satisfied")
    );
    env.wait_phase("t1", "on-fail", AllocationPhase::Completed)
        .await;
    env.wait_phase("t1", "on-any", AllocationPhase::Completed)
        .await;
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
        json!({"spec": {"taskGroup": {"range": "0-9", "concurrency": 2}}}),
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
}

fn dag_manifest(name: &str) -> Dag {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "t1"},
        "spec": {"allocations": [
            {"name": "preprocess", "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
            {"name": "train", "dependsOn": [{"ref": "preprocess", "condition": "success"}],
             "spec": {"entrypoint": "/bin/true", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1h"}}},
            {"name": "evaluate", "dependsOn": [{"ref": "train", "condition": "success"}],
             "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
            {"name": "notify-failure", "dependsOn": [{"ref": "train", "condition": "failure"}],
             "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
        ]},
    }))
    .expect("dag")
}

async fn wait_dag(env: &Env, name: &str) -> Dag {
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    for _ in 0..1500 {
        let d = api.get(name).await.expect("dag");
        let phase = d.status.as_ref().map(|s| s.phase).unwrap_or_default();
        if matches!(
            phase,
            lattice_apis::kinds::dag::DagPhase::Completed
                | lattice_apis::kinds::dag::DagPhase::Failed
                | lattice_apis::kinds::dag::DagPhase::Cancelled
        ) {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("DAG {name} did not finish");
}

fn task_phases(d: &Dag) -> BTreeMap<String, String> {
    d.status
        .as_ref()
        .map(|s| {
            s.tasks
                .iter()
                .map(|(k, v)| (k.clone(), format!("{:?}", v.phase)))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_success_path() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let _runner = auto_runner(&env, "t1", |_| 0);
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &dag_manifest("pipe"))
        .await
        .expect("dag");
    // Every step exists at once; non-roots are held.
    let held = env
        .wait_alloc("t1", "pipe-evaluate", "created held", |a| {
            a.metadata.annotations.contains_key("lattice.dev/hold")
        })
        .await;
    assert_eq!(
        held.labels().get("lattice.dev/dag").map(String::as_str),
        Some("pipe")
    );
    let d = wait_dag(&env, "pipe").await;
    let phases = task_phases(&d);
    assert_eq!(phases["preprocess"], "Completed");
    assert_eq!(phases["train"], "Completed");
    assert_eq!(phases["evaluate"], "Completed");
    assert_eq!(phases["notify-failure"], "Skipped");
    assert_eq!(format!("{:?}", d.status.unwrap().phase), "Completed");
    // The skipped step never ran.
    let n = env.get("t1", "pipe-notify-failure").await;
    assert_eq!(n.phase(), AllocationPhase::Cancelled);
    assert_eq!(n.status.unwrap().attempt, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_failure_path() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let _runner = auto_runner(
        &env,
        "t1",
        |name| if name.ends_with("-train") { 1 } else { 0 },
    );
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &dag_manifest("pipe"))
        .await
        .expect("dag");
    let d = wait_dag(&env, "pipe").await;
    let phases = task_phases(&d);
    assert_eq!(phases["train"], "Failed");
    assert_eq!(phases["evaluate"], "Cancelled");
    assert_eq!(phases["notify-failure"], "Completed");
    // train's failure was caught by notify-failure.
    assert_eq!(format!("{:?}", d.status.unwrap().phase), "Completed");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_dag_stops_its_running_steps() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &dag_manifest("pipe"))
        .await
        .expect("dag");
    // preprocess runs and never ends on its own.
    env.wait_phase("t1", "pipe-preprocess", AllocationPhase::Staging)
        .await;
    let node = env
        .get("t1", "pipe-preprocess")
        .await
        .status
        .unwrap()
        .assigned_nodes[0]
        .clone();
    env.report(
        "t1",
        "pipe-preprocess",
        &node,
        NodeTaskPhase::Running,
        None,
        "",
    )
    .await;
    let patch =
        Patch::Merge(json!({"metadata": {"annotations": {lifecycle::CANCEL_ANNOTATION: "true"}}}));
    api.patch("pipe", &PatchParams::default(), &patch)
        .await
        .expect("cancel");
    let a = env
        .wait_alloc("t1", "pipe-preprocess", "cancel requested", |a| {
            lifecycle::cancel_requested(a)
        })
        .await;
    assert_eq!(
        lifecycle::should_run(&a, &node, 1),
        lifecycle::RunDecision::Stop("Cancelled")
    );
    env.report(
        "t1",
        "pipe-preprocess",
        &node,
        NodeTaskPhase::Failed,
        None,
        "Cancelled",
    )
    .await;
    let d = wait_dag(&env, "pipe").await;
    assert_eq!(
        format!("{:?}", d.status.as_ref().unwrap().phase),
        "Cancelled"
    );
    for step in ["train", "evaluate", "notify-failure"] {
        let c = env.get("t1", &format!("pipe-{step}")).await;
        assert_eq!(c.phase(), AllocationPhase::Cancelled, "{step}");
        assert_eq!(c.status.unwrap().attempt, 0, "{step} never ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_survives_a_controller_restart_mid_run() {
    let mut env = env().await;
    env.tenant("t1", None).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    for n in ["n1", "n2", "n3"] {
        env.node(n, 0).await;
    }
    let _hb = heartbeats(&env, &["n1", "n2", "n3"]);
    env.start_controllers(fast_config());
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &dag_manifest("pipe"))
        .await
        .expect("dag");
    env.wait_phase("t1", "pipe-preprocess", AllocationPhase::Staging)
        .await;
    env.run_to_end("t1", "pipe-preprocess", 0).await;
    env.wait_phase("t1", "pipe-train", AllocationPhase::Staging)
        .await;
    // "Leader change": the controllers restart from the store alone.
    env.stop_controllers();
    env.run_to_end("t1", "pipe-train", 0).await; // finishes while nobody watches
    env.start_controllers(fast_config());
    let _runner = auto_runner(&env, "t1", |_| 0);
    let d = wait_dag(&env, "pipe").await;
    let phases = task_phases(&d);
    assert_eq!(phases["evaluate"], "Completed");
    assert_eq!(phases["notify-failure"], "Skipped");
    for step in ["preprocess", "train", "evaluate"] {
        assert_eq!(
            env.get("t1", &format!("pipe-{step}"))
                .await
                .status
                .unwrap()
                .attempt,
            1,
            "{step} ran once"
        );
    }
}
