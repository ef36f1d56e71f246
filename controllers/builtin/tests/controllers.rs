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
    let ok = env.wait_phase("t1", "on-ok", AllocationPhase::Failed).await;
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
async fn dag_steps_are_owned_by_the_dag_and_held_steps_say_why() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    // The root needs more nodes than there are: it stays Pending, its successor held.
    let dag: Dag = serde_json::from_value(json!({
        "metadata": {"name": "wait", "namespace": "t1"},
        "spec": {"allocations": [
            {"name": "big", "spec": {"entrypoint": "/bin/true", "resources": {"nodes": 9}, "lifecycle": {"walltime": "1h"}}},
            {"name": "after", "dependsOn": [{"ref": "big", "condition": "any"}],
             "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
        ]},
    }))
    .expect("dag");
    let created = api.create(&PostParams::default(), &dag).await.expect("dag");
    let held = env
        .wait_alloc("t1", "wait-after", "held with a reason", |a| {
            a.metadata.annotations.contains_key("lattice.dev/hold")
                && a.status.as_ref().and_then(|s| s.reason.as_deref())
                    == Some("waiting_for_dependencies")
        })
        .await;
    assert_eq!(
        held.status.as_ref().and_then(|s| s.message.as_deref()),
        Some("waiting for dependencies: big (any)")
    );
    assert_eq!(held.phase(), AllocationPhase::Pending);
    for step in ["wait-big", "wait-after"] {
        let a = env.get("t1", step).await;
        assert_eq!(
            a.labels().get("lattice.dev/dag").map(String::as_str),
            Some("wait"),
            "{step}"
        );
        let owner = &a.metadata.owner_references;
        assert_eq!(owner.len(), 1, "{step}: {owner:?}");
        assert_eq!(
            (owner[0].kind.as_str(), owner[0].name.as_str()),
            ("Dag", "wait"),
            "{step}"
        );
        assert_eq!(Some(&owner[0].uid), created.metadata.uid.as_ref(), "{step}");
        assert_eq!(owner[0].controller, Some(true), "{step}");
    }
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

// ---------------------------------------------------------------------------------------
// Dependency schemes (Slurm --dependency, Flux RFC 26) on standalone allocations
// ---------------------------------------------------------------------------------------

/// Watches allocations and records, per group, the largest number bound at once and the
/// order in which they were first seen bound.
#[derive(Clone, Default)]
struct Monitor {
    max_active: Arc<Mutex<HashMap<String, usize>>>,
    started: Arc<Mutex<Vec<String>>>,
}

fn monitor(
    env: &Env,
    tenant: &str,
    group_of: impl Fn(&Allocation) -> Option<String> + Send + Sync + 'static,
) -> (Monitor, tokio::task::JoinHandle<()>) {
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), tenant);
    let m = Monitor::default();
    let out = m.clone();
    let h = tokio::spawn(async move {
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                let mut active: HashMap<String, usize> = HashMap::new();
                for a in &list.items {
                    let bound = matches!(
                        a.phase(),
                        AllocationPhase::Staging | AllocationPhase::Running
                    );
                    if !bound {
                        continue;
                    }
                    let mut s = m.started.lock().unwrap();
                    if !s.iter().any(|n| n == a.name_any()) {
                        s.push(a.name_any().to_string());
                    }
                    if let Some(g) = group_of(a) {
                        *active.entry(g).or_default() += 1;
                    }
                }
                let mut max = m.max_active.lock().unwrap();
                for (g, n) in active {
                    let e = max.entry(g).or_default();
                    *e = (*e).max(n);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    (out, h)
}

async fn wait_waiting(env: &Env, name: &str) -> Allocation {
    env.wait_alloc("t1", name, "waiting for dependencies", |a| {
        reason_of(a) == Some("waiting_for_dependencies")
    })
    .await
}

#[derive(Debug, Clone, Copy)]
enum Antecedent {
    Exit(i32),
    CancelBeforeStart,
    KeepsRunning,
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    Runs,
    Never(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_and_flux_conditions_on_allocations() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    // (row, condition, by uid, what the antecedent does, what happens to the dependent)
    let rows: &[(&str, &str, bool, Antecedent, Expect)] = &[
        (
            "afterok-ok",
            "success",
            false,
            Antecedent::Exit(0),
            Expect::Runs,
        ),
        (
            "afterok-failed",
            "success",
            false,
            Antecedent::Exit(3),
            Expect::Never("ended Failed"),
        ),
        (
            "afternotok-failed",
            "failure",
            false,
            Antecedent::Exit(3),
            Expect::Runs,
        ),
        (
            "afternotok-ok",
            "failure",
            false,
            Antecedent::Exit(0),
            Expect::Never("ended Completed"),
        ),
        (
            // RFC 26: "an unsuccessful result"; Slurm's afternotok takes CANCELLED too.
            "afternotok-cancelled",
            "failure",
            false,
            Antecedent::CancelBeforeStart,
            Expect::Runs,
        ),
        (
            "afterok-cancelled",
            "success",
            false,
            Antecedent::CancelBeforeStart,
            Expect::Never("ended Cancelled"),
        ),
        (
            "afterany-failed",
            "any",
            false,
            Antecedent::Exit(3),
            Expect::Runs,
        ),
        (
            "afterany-cancelled",
            "any",
            false,
            Antecedent::CancelBeforeStart,
            Expect::Runs,
        ),
        (
            "after-running",
            "started",
            false,
            Antecedent::KeepsRunning,
            Expect::Runs,
        ),
        (
            "after-ended",
            "started",
            false,
            Antecedent::Exit(0),
            Expect::Runs,
        ),
        (
            "after-never-started",
            "started",
            false,
            Antecedent::CancelBeforeStart,
            Expect::Never("without starting"),
        ),
        (
            "afterok-by-uid",
            "success",
            true,
            Antecedent::Exit(0),
            Expect::Runs,
        ),
    ];
    for (row, cond, by_uid, _, _) in rows {
        let a = env
            .submit(
                "t1",
                &format!("{row}-a"),
                1,
                json!({"metadata": {"annotations": {HOLD: "true"}}}),
            )
            .await;
        let target = if *by_uid {
            a.metadata.uid.clone().expect("uid")
        } else {
            a.name_any().to_string()
        };
        env.submit(
            "t1",
            &format!("{row}-d"),
            1,
            json!({"spec": {"dependsOn": [{"ref": target, "condition": cond}]}}),
        )
        .await;
    }
    // Every dependent is held while its antecedent has not moved.
    for (row, cond, by_uid, _, _) in rows {
        let d = wait_waiting(&env, &format!("{row}-d")).await;
        assert!(
            !lattice_controllers::allocations::dependencies_met(&d),
            "{row}"
        );
        let recs = records(&d);
        assert_eq!(recs.len(), 1, "{row}: {recs:?}");
        assert!(!recs[0].1, "{row}");
        if !by_uid {
            let slurm = match *cond {
                "success" => "afterok",
                "failure" => "afternotok",
                "any" => "afterany",
                _ => "after",
            };
            assert_eq!(recs[0].0, format!("{slurm}:{row}-a"));
        }
    }
    for (row, _, _, ante, _) in rows {
        let a = format!("{row}-a");
        match ante {
            Antecedent::Exit(code) => {
                plans.set(&a, Run::Exit(*code, Duration::ZERO));
                annotate(&env, &a, HOLD, serde_json::Value::Null).await;
            }
            Antecedent::KeepsRunning => {
                plans.set(&a, Run::Hold);
                annotate(&env, &a, HOLD, serde_json::Value::Null).await;
            }
            Antecedent::CancelBeforeStart => {
                annotate(&env, &a, lifecycle::CANCEL_ANNOTATION, json!("true")).await;
            }
        }
    }
    for (row, _, _, ante, expect) in rows {
        let d = format!("{row}-d");
        match expect {
            Expect::Runs => {
                let done = env.wait_phase("t1", &d, AllocationPhase::Completed).await;
                assert_eq!(done.status.as_ref().unwrap().attempt, 1, "{row}");
                assert!(records(&done).iter().all(|(_, s)| *s), "{row}");
                if let Antecedent::KeepsRunning = ante {
                    assert_eq!(
                        env.get("t1", &format!("{row}-a")).await.phase(),
                        AllocationPhase::Running,
                        "{row}: released while its antecedent still runs"
                    );
                }
            }
            Expect::Never(needle) => {
                wait_never(&env, &d, needle).await;
            }
        }
    }
    plans.set("after-running-a", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "after-running-a", AllocationPhase::Completed)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_time_holds_until_the_wall_clock_reaches_it() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    let _runner = scripted_runner(&env, "t1", Plans::default());
    let begin = (epoch_now() + 3.0).floor() + 0.5;
    env.submit(
        "t1",
        "later",
        1,
        json!({"spec": {"dependsOn": [{"beginTime": begin}]}}),
    )
    .await;
    env.submit(
        "t1",
        "past",
        1,
        json!({"spec": {"dependsOn": [{"beginTime": epoch_now() - 60.0}]}}),
    )
    .await;
    let past = env
        .wait_phase("t1", "past", AllocationPhase::Completed)
        .await;
    assert!(records(&past)[0].0.starts_with("begin-time:"));
    let w = wait_waiting(&env, "later").await;
    assert!(message_of(&w).contains("begin time"), "{}", message_of(&w));
    // Never released before its time.
    while epoch_now() < begin - 0.3 {
        let a = env.get("t1", "later").await;
        assert!(
            !lattice_controllers::allocations::dependencies_met(&a),
            "released at {} before {begin}",
            epoch_now()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = env
        .wait_phase("t1", "later", AllocationPhase::Completed)
        .await;
    let st = a.status.unwrap();
    let scheduled = st.scheduled_time.expect("scheduled").timestamp() as f64;
    assert!(scheduled >= begin.floor(), "{scheduled} < {begin}");
    assert_eq!(st.attempt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn singleton_runs_one_job_per_name_and_user_at_a_time() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    let (mon, _m) = monitor(&env, "t1", |a| {
        (a.spec.tags.get("name").map(String::as_str) == Some("nightly"))
            .then(|| lattice_controllers::allocations::user_of(a).to_string())
    });
    let job = |user: &str, singleton: bool| {
        let mut v = json!({"metadata": {"annotations": {"lattice.dev/user": user}},
                           "spec": {"tags": {"name": "nightly"}}});
        if singleton {
            v["spec"]["dependsOn"] = json!([{"singleton": true}]);
        }
        v
    };
    // An earlier job of the same name and user without singleton holds the others too.
    plans.set("n0", Run::Hold);
    env.submit("t1", "n0", 1, job("alice", false)).await;
    env.wait_phase("t1", "n0", AllocationPhase::Running).await;
    for s in ["s1", "s2", "s3"] {
        plans.set(s, Run::Exit(0, Duration::from_millis(300)));
    }
    // Names deliberately out of submission order: order is the submission order.
    for s in ["s3", "s1", "s2"] {
        env.submit("t1", s, 1, job("alice", true)).await;
    }
    env.submit("t1", "bob-1", 1, job("bob", true)).await;
    for s in ["s3", "s1", "s2"] {
        let w = wait_waiting(&env, s).await;
        assert!(
            message_of(&w).contains("singleton \"nightly\" of alice"),
            "{}",
            message_of(&w)
        );
    }
    // Another user's job of the same name is not held.
    env.wait_phase("t1", "bob-1", AllocationPhase::Completed)
        .await;
    assert_eq!(env.get("t1", "n0").await.phase(), AllocationPhase::Running);
    plans.set("n0", Run::Exit(0, Duration::ZERO));
    for s in ["s3", "s1", "s2"] {
        env.wait_phase("t1", s, AllocationPhase::Completed).await;
    }
    let max = mon.max_active.lock().unwrap().clone();
    assert_eq!(max.get("alice"), Some(&1), "singleton overlap: {max:?}");
    let order: Vec<String> = mon
        .started
        .lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with('s'))
        .cloned()
        .collect();
    assert_eq!(
        order,
        ["s3", "s1", "s2"],
        "singletons run in submission order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flux_string_symbols_chain_and_fail() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    let (mon, _m) = monitor(&env, "t1", |a| {
        a.name_any()
            .starts_with("chain-")
            .then(|| "chain".to_string())
    });
    let sym = |user: &str, deps: serde_json::Value| json!({"metadata": {"annotations": {"lattice.dev/user": user}}, "spec": {"dependsOn": deps}});
    let inout = json!([{"symbol": "ckpt", "type": "inout"}]);

    // inout chains: one after another, in submission order.
    for c in ["chain-c", "chain-a", "chain-b"] {
        plans.set(c, Run::Exit(0, Duration::from_millis(300)));
        env.submit("t1", c, 1, sym("alice", inout.clone())).await;
    }

    // in waits for every current writer (out) of its scope.
    for w in ["w1", "w2"] {
        plans.set(w, Run::Hold);
        env.submit(
            "t1",
            w,
            1,
            sym("alice", json!([{"symbol": "data", "type": "out"}])),
        )
        .await;
    }
    env.submit(
        "t1",
        "r-user",
        1,
        sym("alice", json!([{"symbol": "data", "type": "in"}])),
    )
    .await;
    env.submit(
        "t1",
        "r-global",
        1,
        sym(
            "alice",
            json!([{"symbol": "data", "type": "in", "scope": "global"}]),
        ),
    )
    .await;
    env.submit(
        "t1",
        "r-bob",
        1,
        sym("bob", json!([{"symbol": "data", "type": "in"}])),
    )
    .await;
    let r = wait_waiting(&env, "r-user").await;
    assert!(
        message_of(&r).contains("string:data (writers w1, w2)"),
        "{}",
        message_of(&r)
    );
    assert_eq!(
        records(&r),
        [("string:data?scope=user&type=in".to_string(), false)]
    );
    env.wait_phase("t1", "r-global", AllocationPhase::Completed)
        .await;
    env.wait_phase("t1", "r-bob", AllocationPhase::Completed)
        .await;
    plans.set("w1", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "w1", AllocationPhase::Completed).await;
    env.wait_alloc("t1", "r-user", "waiting for w2 only", |r| {
        message_of(r).ends_with("string:data (writers w2)")
    })
    .await;
    plans.set("w2", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "r-user", AllocationPhase::Completed)
        .await;

    // A global writer of another user holds a global reader (bob is a tenant admin: only
    // instance owners may write in scope global).
    set_admins(&env, &["bob"]).await;
    plans.set("g-bob", Run::Hold);
    env.submit(
        "t1",
        "g-bob",
        1,
        sym(
            "bob",
            json!([{"symbol": "dataset", "type": "out", "scope": "global"}]),
        ),
    )
    .await;
    env.submit(
        "t1",
        "g-alice",
        1,
        sym(
            "alice",
            json!([{"symbol": "dataset", "type": "in", "scope": "global"}]),
        ),
    )
    .await;
    wait_waiting(&env, "g-alice").await;
    plans.set("g-bob", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "g-alice", AllocationPhase::Completed)
        .await;

    // A failed writer is a fatal exception for its readers, and it cascades down a chain.
    plans.set("f1", Run::Hold);
    env.submit(
        "t1",
        "f1",
        1,
        sym("alice", json!([{"symbol": "model", "type": "out"}])),
    )
    .await;
    env.wait_phase("t1", "f1", AllocationPhase::Running).await;
    env.submit(
        "t1",
        "f2",
        1,
        sym("alice", json!([{"symbol": "model", "type": "in"}])),
    )
    .await;
    env.submit(
        "t1",
        "f3",
        1,
        sym("alice", json!([{"symbol": "model", "type": "inout"}])),
    )
    .await;
    env.submit(
        "t1",
        "f4",
        1,
        sym("alice", json!([{"symbol": "model", "type": "in"}])),
    )
    .await;
    env.wait_alloc("t1", "f4", "waiting for the last inout writer", |f4| {
        message_of(f4).ends_with("string:model (writers f3)")
    })
    .await;
    plans.set("f1", Run::Exit(2, Duration::ZERO));
    wait_never(&env, "f2", "writer f1 of symbol \"model\" ended Failed").await;
    wait_never(&env, "f3", "writer f1").await;
    wait_never(&env, "f4", "writer f3 of symbol \"model\" ended Failed").await;
    // Writers that had ended unsuccessfully before a job was submitted are not current.
    let ended = env.get("t1", "f3").await.status.unwrap().end_time.unwrap();
    while lattice_apis::meta::now() <= ended {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.submit(
        "t1",
        "f5",
        1,
        sym("alice", json!([{"symbol": "model", "type": "in"}])),
    )
    .await;
    env.wait_phase("t1", "f5", AllocationPhase::Completed).await;

    for c in ["chain-c", "chain-a", "chain-b"] {
        env.wait_phase("t1", c, AllocationPhase::Completed).await;
    }
    let max = mon.max_active.lock().unwrap().clone();
    assert_eq!(
        max.get("chain"),
        Some(&1),
        "inout chain overlapped: {max:?}"
    );
    let order: Vec<String> = mon
        .started
        .lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with("chain-"))
        .cloned()
        .collect();
    assert_eq!(order, ["chain-c", "chain-a", "chain-b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn satisfied_dependencies_stay_satisfied_through_duplicates_deletion_and_restart() {
    let (mut env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    plans.set("a", Run::Hold);
    plans.set("c", Run::Hold);
    env.submit("t1", "a", 1, json!({})).await;
    env.submit("t1", "c", 1, json!({})).await;
    env.submit(
        "t1",
        "b",
        1,
        json!({"spec": {"dependsOn": [
            {"ref": "a", "condition": "started"},
            {"ref": "c", "condition": "success"}
        ]}}),
    )
    .await;
    env.wait_phase("t1", "a", AllocationPhase::Running).await;
    env.wait_alloc("t1", "b", "after:a satisfied", |b| {
        records(b)
            == [
                ("after:a".to_string(), true),
                ("afterok:c".to_string(), false),
            ]
    })
    .await;
    // Duplicate events: a finishes, its terminal report is posted again, it is touched
    // repeatedly, then deleted; the dependent is touched too and the controllers restart.
    plans.set("a", Run::Exit(0, Duration::ZERO));
    let a = env.wait_phase("t1", "a", AllocationPhase::Completed).await;
    let node = a.status.as_ref().unwrap().assigned_nodes[0].clone();
    for i in 0..3 {
        env.report(
            "t1",
            "a",
            &node,
            NodeTaskPhase::Succeeded,
            Some(0),
            "Exited",
        )
        .await;
        annotate(&env, "a", "touch", json!(i.to_string())).await;
        annotate(&env, "b", "touch", json!(i.to_string())).await;
    }
    env.allocations("t1")
        .delete("a", &Default::default())
        .await
        .expect("delete a");
    env.wait_alloc("t1", "b", "still waiting for c only", |b| {
        message_of(b) == "waiting for dependencies: c (success)"
    })
    .await;
    env.stop_controllers();
    plans.set("c", Run::Exit(0, Duration::ZERO)); // c ends while no controller runs
    env.wait_phase("t1", "c", AllocationPhase::Completed).await;
    env.start_controllers(fast_config());
    let b = env.wait_phase("t1", "b", AllocationPhase::Completed).await;
    let st = b.status.as_ref().unwrap();
    assert_eq!(st.attempt, 1, "released and run exactly once");
    assert_eq!(
        records(&b),
        [
            ("after:a".to_string(), true),
            ("afterok:c".to_string(), true)
        ]
    );
    assert_eq!(
        st.conditions
            .iter()
            .filter(|c| c.type_ == "DependenciesMet")
            .count(),
        1
    );
}

/// A sensitive-pool node.
async fn sensitive_node(env: &Env, name: &str) {
    env.node(name, 0).await;
    env.nodes()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sensitive": true}})),
        )
        .await
        .expect("mark sensitive");
}

fn claim(user: &str, nodes: &[&str]) -> serde_json::Value {
    json!({
        "metadata": {"annotations": {"lattice.dev/user": user}},
        "spec": {"sensitive": true, "vcluster": "secure",
                 "resources": {"nodes": nodes.len(), "nodeNames": nodes}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensitive_claims_first_commit_wins_and_the_loser_names_the_holder() {
    let mut env = env().await;
    env.tenant("hospital", None).await;
    env.vcluster("hospital", "secure", "sensitive-reservation")
        .await;
    let names = ["s1", "s2", "s3", "s4"];
    for n in names {
        sensitive_node(&env, n).await;
    }
    env.node("plain", 1).await;
    let _hb = heartbeats(&env, &["s1", "s2", "s3", "s4", "plain"]);
    // Two scheduler replicas race for every claim.
    env.start_controllers(fast_config());
    env.start_controllers(fast_config());

    // Overlapping claims submitted together: exactly one gets s2.
    let (a, b) = tokio::join!(
        env.submit("hospital", "claim-a", 2, claim("alice", &["s1", "s2"])),
        env.submit("hospital", "claim-b", 2, claim("bob", &["s2", "s3"])),
    );
    drop((a, b));
    let settled = |a: &Allocation| {
        a.phase() == AllocationPhase::Staging || a.phase() == AllocationPhase::Failed
    };
    let a = env
        .wait_alloc("hospital", "claim-a", "bound or failed", settled)
        .await;
    let b = env
        .wait_alloc("hospital", "claim-b", "bound or failed", settled)
        .await;
    let (won, lost, winner_user) = match (a.phase(), b.phase()) {
        (AllocationPhase::Staging, AllocationPhase::Failed) => (a, b, "alice"),
        (AllocationPhase::Failed, AllocationPhase::Staging) => (b, a, "bob"),
        other => panic!("exactly one claim must win, got {other:?}"),
    };
    assert_eq!(won.status.as_ref().expect("status").assigned_nodes.len(), 2);
    assert_eq!(reason_of(&lost), Some("ownership_conflict"));
    let msg = message_of(&lost);
    assert!(
        msg.starts_with("OwnershipConflict: node s2 is already claimed")
            && msg.contains(&format!("by user {winner_user}"))
            && msg.contains(&format!("hospital/{}", won.name_any())),
        "{msg}"
    );
    // The store records the claiming user with the ownership.
    let s2 = env.nodes().get("s2").await.expect("s2");
    let owner = s2.status.and_then(|s| s.owner).expect("owned");
    assert_eq!(owner.user.as_deref(), Some(winner_user));
    assert_eq!(owner.allocation.as_deref(), Some(won.name_any()));

    // Claims that can never be granted fail at once, saying why.
    env.submit("hospital", "ghost", 1, claim("carol", &["nope"]))
        .await;
    env.submit("hospital", "wrong-pool", 1, claim("carol", &["plain"]))
        .await;
    let ghost = env
        .wait_phase("hospital", "ghost", AllocationPhase::Failed)
        .await;
    assert_eq!(reason_of(&ghost), Some("invalid_claim"));
    assert!(message_of(&ghost).contains("node nope is not registered"));
    let wrong = env
        .wait_phase("hospital", "wrong-pool", AllocationPhase::Failed)
        .await;
    assert!(
        message_of(&wrong).contains("node plain is not in the sensitive pool"),
        "{}",
        message_of(&wrong)
    );
    // A disjoint claim is granted beside the winner.
    let free: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            !won.status
                .as_ref()
                .expect("status")
                .assigned_nodes
                .iter()
                .any(|a| a == n)
        })
        .filter(|n| *n != "s3" || winner_user == "alice")
        .take(1)
        .collect();
    env.submit("hospital", "claim-c", 1, claim("carol", &free))
        .await;
    env.wait_phase("hospital", "claim-c", AllocationPhase::Staging)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_outside_sensitive_vclusters_wait_for_their_nodes() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    let on = |n: &str| json!({"spec": {"resources": {"nodeNames": [n]}}});
    env.submit("t1", "holder", 1, on("n1")).await;
    env.wait_phase("t1", "holder", AllocationPhase::Staging)
        .await;
    // A second claim of n1 waits for it (n2 is free, but not what it asked for).
    env.submit("t1", "waiter", 1, on("n1")).await;
    let w = env
        .wait_alloc("t1", "waiter", "waiting for n1", |a| {
            reason_of(a) == Some("nodes_occupied")
        })
        .await;
    assert_eq!(w.phase(), AllocationPhase::Pending);
    assert!(
        message_of(&w).contains("waiting for claimed node n1 (by allocation t1/holder)"),
        "{}",
        message_of(&w)
    );
    // A claim of a cordoned node waits too, and says why.
    env.nodes()
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    env.submit("t1", "wants-n2", 1, on("n2")).await;
    let c = env
        .wait_alloc("t1", "wants-n2", "explained", |a| {
            reason_of(a) == Some("invalid_claim")
        })
        .await;
    assert_eq!(c.phase(), AllocationPhase::Pending);
    assert!(
        message_of(&c).contains("node n2 is draining and cannot be claimed now"),
        "{}",
        message_of(&c)
    );
    env.nodes()
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .expect("uncordon");
    // Everything runs once its nodes are free.
    let _runner = auto_runner(&env, "t1", |_| 0);
    for (name, node) in [("holder", "n1"), ("waiter", "n1"), ("wants-n2", "n2")] {
        let a = env.wait_phase("t1", name, AllocationPhase::Completed).await;
        assert_eq!(
            a.status.expect("status").assigned_nodes,
            vec![node],
            "{name}"
        );
    }
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

async fn set_admins(env: &Env, admins: &[&str]) {
    let patch = Patch::Merge(json!({"spec": {"admins": admins}}));
    Api::<lattice_apis::Tenant>::all(env.client.clone())
        .patch("t1", &PatchParams::default(), &patch)
        .await
        .expect("tenant admins");
}

/// DAG `mutex` (the seed: "Only one allocation with this mutex name runs at a time"):
/// the holders of a lock run one at a time within a DAG, across DAGs, and against
/// standalone `mutex` and Slurm `singleton` jobs of that name (same tenant and user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_mutex_steps_never_run_at_once() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    let (mon, _m) = monitor(&env, "t1", |a| {
        let holds = a.spec.tags.get("name").map(String::as_str) == Some("gpu")
            || a.spec
                .depends_on
                .iter()
                .any(|d| d.kind() == Some(lattice_apis::DependencyKind::Mutex("gpu")));
        holds.then(|| lattice_controllers::allocations::user_of(a).to_string())
    });
    let user = |u: &str| json!({"lattice.dev/user": u});
    // A Slurm singleton job named like the lock holds it first.
    plans.set("s0", Run::Hold);
    env.submit(
        "t1",
        "s0",
        1,
        json!({"metadata": {"annotations": user("alice")},
               "spec": {"tags": {"name": "gpu"}, "dependsOn": [{"singleton": true}]}}),
    )
    .await;
    env.wait_phase("t1", "s0", AllocationPhase::Running).await;
    for n in ["m1-a", "m1-b", "m1-c", "m2-x", "m3"] {
        plans.set(n, Run::Exit(0, Duration::from_millis(300)));
    }
    let step = |name: &str, deps: serde_json::Value| {
        json!({"name": name, "dependsOn": deps,
               "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}})
    };
    let dags: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    let m1: Dag = serde_json::from_value(json!({
        "metadata": {"name": "m1", "namespace": "t1", "annotations": user("alice")},
        "spec": {"allocations": [
            step("a", json!([{"gpu": "mutex"}])),
            step("b", json!([{"gpu": "mutex"}])),
            step("free", json!([])),
            step("c", json!([{"a": "success"}, {"gpu": "mutex"}])),
        ]},
    }))
    .expect("dag");
    let m2: Dag = serde_json::from_value(json!({
        "metadata": {"name": "m2", "namespace": "t1", "annotations": user("alice")},
        "spec": {"allocations": [step("x", json!([{"ref": "gpu", "condition": "mutex"}]))]},
    }))
    .expect("dag");
    dags.create(&PostParams::default(), &m1).await.expect("m1");
    dags.create(&PostParams::default(), &m2).await.expect("m2");
    // A step without the lock runs at once; the holders wait for the singleton job.
    env.wait_phase("t1", "m1-free", AllocationPhase::Completed)
        .await;
    let x = wait_waiting(&env, "m2-x").await;
    assert!(
        message_of(&x).contains("mutex \"gpu\" of alice") && message_of(&x).contains("s0"),
        "{}",
        message_of(&x)
    );
    assert_eq!(records(&x), [("mutex:gpu".to_string(), false)]);
    // Standalone: a mutex allocation of alice, and one of bob (another scope).
    env.submit(
        "t1",
        "m3",
        1,
        json!({"metadata": {"annotations": user("alice")},
               "spec": {"dependsOn": [{"gpu": "mutex"}]}}),
    )
    .await;
    env.submit(
        "t1",
        "bob-gpu",
        1,
        json!({"metadata": {"annotations": user("bob")},
               "spec": {"dependsOn": [{"gpu": "mutex"}]}}),
    )
    .await;
    env.wait_phase("t1", "bob-gpu", AllocationPhase::Completed)
        .await;
    assert_eq!(env.get("t1", "s0").await.phase(), AllocationPhase::Running);
    for n in ["m1-a", "m1-b", "m1-c", "m2-x", "m3"] {
        if let Ok(Some(a)) = env.allocations("t1").get_opt(n).await {
            assert!(!a.phase().is_terminal(), "{n} ran while s0 held the lock");
        }
    }
    plans.set("s0", Run::Exit(0, Duration::ZERO));
    for d in ["m1", "m2"] {
        let d = wait_dag(&env, d).await;
        assert_eq!(
            format!("{:?}", d.status.as_ref().unwrap().phase),
            "Completed",
            "{:?}",
            task_phases(&d)
        );
    }
    env.wait_phase("t1", "m3", AllocationPhase::Completed).await;
    for n in ["m1-a", "m1-b", "m1-c", "m2-x", "m3"] {
        assert_eq!(env.get("t1", n).await.status.unwrap().attempt, 1, "{n}");
    }
    let max = mon.max_active.lock().unwrap().clone();
    assert_eq!(
        max.get("alice"),
        Some(&1),
        "mutex holders overlapped: {max:?}"
    );
    let order = mon.started.lock().unwrap().clone();
    let pos = |n: &str| order.iter().position(|o| o == n).expect(n);
    // Holders run in the order their dependencies came to hold: s0, then m1-a and m2-x
    // (released at once), m3; m1's b and c only after m1-a.
    assert!(
        pos("s0") < pos("m1-a") && pos("s0") < pos("m2-x"),
        "{order:?}"
    );
    assert!(
        pos("m1-a") < pos("m1-b") && pos("m1-a") < pos("m1-c"),
        "{order:?}"
    );
}

/// Slurm `aftercorr` between two job arrays: element i waits for element i of the other
/// array, is cancelled when that one fails, and indices the other array lacks run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aftercorr_between_job_arrays_is_per_index() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    plans.set("pre-1", Run::Exit(3, Duration::ZERO));
    plans.set("pre-2", Run::Hold);
    env.submit(
        "t1",
        "pre",
        1,
        json!({"spec": {"taskGroup": {"range": "0-3"}}}),
    )
    .await;
    env.submit(
        "t1",
        "train",
        1,
        json!({"spec": {"taskGroup": {"range": "0-5"},
                        "dependsOn": [{"pre": "corresponding"}]}}),
    )
    .await;
    env.wait_phase("t1", "pre-2", AllocationPhase::Running)
        .await;
    // Matched indices follow their own element; extra indices (4, 5) do not wait.
    for i in [0, 3, 4, 5] {
        let t = env
            .wait_phase("t1", &format!("train-{i}"), AllocationPhase::Completed)
            .await;
        assert_eq!(records(&t), [("aftercorr:pre".to_string(), true)], "{i}");
    }
    wait_never(&env, "train-1", "element 1 of pre (pre-1) ended Failed").await;
    let t2 = wait_waiting(&env, "train-2").await;
    assert!(
        message_of(&t2).contains("pre-2 (corresponding)"),
        "{}",
        message_of(&t2)
    );
    assert_eq!(
        env.get("t1", "pre-2").await.phase(),
        AllocationPhase::Running
    );
    plans.set("pre-2", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "train-2", AllocationPhase::Completed)
        .await;
    let train = env.wait_phase("t1", "train", AllocationPhase::Failed).await;
    let tasks = train.status.unwrap().tasks.unwrap();
    assert_eq!((tasks.total, tasks.completed, tasks.failed), (6, 5, 1));

    // A predecessor array cancelled before creating some elements: their successors
    // fail (they can never run), each for its own reason.
    plans.set("p2-0", Run::Hold);
    env.submit(
        "t1",
        "p2",
        1,
        json!({"spec": {"taskGroup": {"range": "0-2", "concurrency": 1}}}),
    )
    .await;
    env.submit(
        "t1",
        "q2",
        1,
        json!({"spec": {"taskGroup": {"range": "0-2"},
                        "dependsOn": [{"ref": "p2", "condition": "corresponding"}]}}),
    )
    .await;
    env.wait_phase("t1", "p2-0", AllocationPhase::Running).await;
    wait_waiting(&env, "q2-1").await;
    annotate(&env, "p2", lifecycle::CANCEL_ANNOTATION, json!("true")).await;
    wait_never(&env, "q2-0", "element 0 of p2 (p2-0) ended").await;
    wait_never(&env, "q2-1", "element 1 of p2 never ran").await;
    wait_never(&env, "q2-2", "element 2 of p2 never ran").await;
}

/// Flux RFC 26: "A non-instance owner can only create a dependency with the type in
/// within this scope" (global). Instance owners of a tenant are its admins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_symbol_writers_must_be_instance_owners() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    set_admins(&env, &["root"]).await;
    let sym = |user: &str, deps: serde_json::Value| json!({"metadata": {"annotations": {"lattice.dev/user": user}}, "spec": {"dependsOn": deps}});
    for (name, ty) in [("alice-out", "out"), ("alice-inout", "inout")] {
        env.submit(
            "t1",
            name,
            1,
            sym(
                "alice",
                json!([{"symbol": "ds", "type": ty, "scope": "global"}]),
            ),
        )
        .await;
        let a = env.wait_phase("t1", name, AllocationPhase::Cancelled).await;
        assert_eq!(reason_of(&a), Some("dependency_not_permitted"), "{name}");
        let m = message_of(&a);
        for needle in [
            &format!("string:ds?scope=global&type={ty}"),
            "only the instance owner may create out/inout dependencies in global scope",
            "use type=in or scope=user",
            "Flux RFC 26",
            "spec.admins",
            "\"alice\" is not one",
        ] {
            assert!(m.contains(needle), "{name}: {m}");
        }
        assert_eq!(a.status.unwrap().attempt, 0, "{name} never ran");
    }
    // The refused declarations are no writers: a global reader does not wait for them.
    env.submit(
        "t1",
        "carol-in",
        1,
        sym(
            "carol",
            json!([{"symbol": "ds", "type": "in", "scope": "global"}]),
        ),
    )
    .await;
    env.wait_phase("t1", "carol-in", AllocationPhase::Completed)
        .await;
    // In scope user anyone may write.
    env.submit(
        "t1",
        "alice-user-out",
        1,
        sym("alice", json!([{"symbol": "ds", "type": "out"}])),
    )
    .await;
    env.wait_phase("t1", "alice-user-out", AllocationPhase::Completed)
        .await;
    // The instance owner may write in scope global, and global readers wait for it.
    plans.set("root-out", Run::Hold);
    env.submit(
        "t1",
        "root-out",
        1,
        sym(
            "root",
            json!([{"symbol": "ds", "type": "out", "scope": "global"}]),
        ),
    )
    .await;
    env.wait_phase("t1", "root-out", AllocationPhase::Running)
        .await;
    env.submit(
        "t1",
        "carol-in-2",
        1,
        sym(
            "carol",
            json!([{"symbol": "ds", "type": "in", "scope": "global"}]),
        ),
    )
    .await;
    let w = wait_waiting(&env, "carol-in-2").await;
    assert!(message_of(&w).contains("root-out"), "{}", message_of(&w));
    plans.set("root-out", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "carol-in-2", AllocationPhase::Completed)
        .await;
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
async fn the_cluster_wide_sensitive_pool_is_a_hard_limit_across_tenants() {
    // Three sensitive nodes, two tenants, and `scheduling.sensitive_pool_size=2`.
    let (env, _hb) = cluster(&["s1", "s2", "s3"]).await;
    for n in ["s1", "s2", "s3"] {
        env.nodes()
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"sensitive": true}})),
            )
            .await
            .expect("mark sensitive");
    }
    env.tenant("t2", None).await;
    env.vcluster("t2", "default", "hpc-backfill").await;
    let setting =
        lattice_apis::cluster_config::find(lattice_apis::cluster_config::SENSITIVE_POOL_SIZE)
            .expect("setting");
    env.backend
        .put(lattice_store::PutRequest {
            key: setting.store_key().into_bytes().into(),
            value: b"2".to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("set the limit");
    let plans = Plans::default();
    let _r1 = scripted_runner(&env, "t1", plans.clone());
    let _r2 = scripted_runner(&env, "t2", plans.clone());
    let sensitive = json!({"spec": {"sensitive": true}});
    plans.set("first", Run::Hold);
    plans.set("second", Run::Hold);
    plans.set("third", Run::Hold);
    env.submit("t1", "first", 1, sensitive.clone()).await;
    env.submit("t2", "second", 1, sensitive.clone()).await;
    env.wait_phase("t1", "first", AllocationPhase::Running)
        .await;
    env.wait_phase("t2", "second", AllocationPhase::Running)
        .await;
    let counter = || async {
        let kv = env
            .backend
            .get(lattice_controllers::sensitive_pool::COUNTER_KEY.into())
            .await
            .expect("get")
            .expect("counter written");
        serde_json::from_slice::<serde_json::Value>(&kv.value).expect("json")["nodes"].clone()
    };
    assert_eq!(counter().await, 2);
    // A third sensitive claim waits, although s3 is free and t2's own quota has room.
    env.submit("t2", "third", 1, sensitive).await;
    let w = env
        .wait_alloc("t2", "third", "the cluster-wide limit", |a| {
            message_of(a).contains("cluster-wide")
        })
        .await;
    assert_eq!(w.phase(), AllocationPhase::Pending);
    assert!(
        message_of(&w)
            .contains("sensitive_pool_size, cluster-wide: current 2, requested 1, limit 2"),
        "{}",
        message_of(&w)
    );
    // The first ends: its node goes back to the pool, and the third is bound.
    plans.set("first", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "first", AllocationPhase::Completed)
        .await;
    env.wait_phase("t2", "third", AllocationPhase::Running)
        .await;
    assert_eq!(counter().await, 2);
    // The usage audit recounts a drifted counter from node ownership.
    env.backend
        .put(lattice_store::PutRequest {
            key: lattice_controllers::sensitive_pool::COUNTER_KEY.into(),
            value: br#"{"nodes": 9}"#.to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("drift");
    assert!(
        lattice_controllers::release::audit_usage(&env.backend)
            .await
            .expect("audit")
            >= 1
    );
    assert_eq!(counter().await, 2);
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
