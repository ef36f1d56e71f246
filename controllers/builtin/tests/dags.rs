//! The DAG controller against a real store: steps owned by their Dag, success and
//! failure paths, cancellation, a controller restart mid-run, mutex steps.
//!
//! The same scenarios with the real `lattice-agent` processes are in `e2e/`.

mod common;

use std::time::Duration;

use common::*;
use lattice_apis::{lifecycle, AllocationPhase, Dag, NodeTaskPhase};
use lattice_runtime::{Api, Patch, PatchParams, PostParams, ResourceExt};
use serde_json::json;

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
