//! The DAG controller's `spec.failurePolicy` and `spec.maxParallel`, against a real
//! store with simulated agents (the same harness as `controllers.rs`).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use lattice_apis::kinds::dag::DagPhase;
use lattice_apis::{lifecycle, AllocationPhase, Dag};
use lattice_runtime::{Api, ListParams, PostParams, ResourceExt};
use serde_json::json;

use lattice_apis::wellknown::CANCEL_REASON_ANNOTATION as CANCEL_REASON;

fn step(name: &str, deps: serde_json::Value) -> serde_json::Value {
    json!({"name": name, "dependsOn": deps,
           "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}})
}

async fn create_dag(env: &Env, name: &str, spec: serde_json::Value) {
    let d: Dag = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "t1"},
        "spec": spec,
    }))
    .expect("dag");
    Api::<Dag>::namespaced(env.client.clone(), "t1")
        .create(&PostParams::default(), &d)
        .await
        .expect("create dag");
}

/// Per task: (phase, reason, message) from the Dag's status.
fn tasks(d: &Dag) -> BTreeMap<String, (String, String, String)> {
    d.status
        .as_ref()
        .map(|s| {
            s.tasks
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        (
                            format!("{:?}", v.phase),
                            v.reason.clone().unwrap_or_default(),
                            v.message.clone().unwrap_or_default(),
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `bad` and `slow` run side by side; `after-bad` and `after-slow` follow them.
fn branches(policy: Option<&str>) -> serde_json::Value {
    let mut spec = json!({"allocations": [
        step("bad", json!([])),
        step("slow", json!([])),
        step("after-bad", json!([{"bad": "success"}])),
        step("after-slow", json!([{"slow": "success"}])),
    ]});
    if let Some(p) = policy {
        spec["failurePolicy"] = json!(p);
    }
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_fail_fast_cancels_pending_and_running_steps_and_ends_failed() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    plans.set("ff-bad", Run::Hold);
    plans.set("ff-slow", Run::Hold);
    let _runner = scripted_runner(&env, "t1", plans.clone());
    create_dag(&env, "ff", branches(Some("fail_fast"))).await;
    env.wait_phase("t1", "ff-bad", AllocationPhase::Running)
        .await;
    env.wait_phase("t1", "ff-slow", AllocationPhase::Running)
        .await;
    // after-slow is pending (held: its dependency still runs) when bad fails.
    let held = env.get("t1", "ff-after-slow").await;
    assert!(held.metadata.annotations.contains_key(HOLD));
    plans.set("ff-bad", Run::Exit(3, Duration::ZERO));

    let d = wait_dag(&env, "ff").await;
    let st = d.status.clone().expect("status");
    assert_eq!(st.phase, DagPhase::Failed, "{:?}", tasks(&d));
    let msg = st.message.clone().unwrap_or_default();
    assert!(
        msg.contains("step bad failed") && msg.contains("fail_fast"),
        "{msg}"
    );
    let t = tasks(&d);
    assert_eq!(t["bad"].0, "Failed");
    // The running sibling was stopped, the pending one never ran; both name `bad`.
    for step in ["slow", "after-slow"] {
        assert_eq!(t[step].0, "Cancelled", "{step}: {:?}", t[step]);
        assert_eq!(t[step].1, "FailFast", "{step}");
        assert!(
            t[step].2.contains("step bad failed"),
            "{step}: {:?}",
            t[step]
        );
    }
    // bad's own successor is cancelled by its edge, naming bad too.
    assert_eq!(t["after-bad"].0, "Cancelled");
    assert_eq!(t["after-bad"].2, "dependency bad failed");

    // Stopped the way `lattice dag cancel` stops a running step: the cancel annotation.
    let slow = env.get("t1", "ff-slow").await;
    assert_eq!(slow.phase(), AllocationPhase::Cancelled);
    assert!(lifecycle::cancel_requested(&slow));
    assert_eq!(
        slow.metadata
            .annotations
            .get(CANCEL_REASON)
            .map(String::as_str),
        Some("cancelled: step bad failed and the DAG's failurePolicy is fail_fast")
    );
    assert_eq!(slow.status.as_ref().unwrap().attempt, 1, "slow had started");
    let after = env.get("t1", "ff-after-slow").await;
    assert_eq!(after.phase(), AllocationPhase::Cancelled);
    assert_eq!(after.status.as_ref().unwrap().attempt, 0, "never ran");
    assert_eq!(
        message_of(&after),
        "cancelled: step bad failed and the DAG's failurePolicy is fail_fast"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_propagate_keeps_the_independent_branch_running() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    plans.set("pr-bad", Run::Hold);
    plans.set("pr-slow", Run::Hold);
    let _runner = scripted_runner(&env, "t1", plans.clone());
    create_dag(&env, "pr", branches(None)).await;
    env.wait_phase("t1", "pr-bad", AllocationPhase::Running)
        .await;
    env.wait_phase("t1", "pr-slow", AllocationPhase::Running)
        .await;
    plans.set("pr-bad", Run::Exit(3, Duration::ZERO));
    let a = env
        .wait_phase("t1", "pr-after-bad", AllocationPhase::Cancelled)
        .await;
    assert_eq!(message_of(&a), "dependency bad failed");
    // The other branch runs on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let slow = env.get("t1", "pr-slow").await;
    assert_eq!(slow.phase(), AllocationPhase::Running);
    assert!(!lifecycle::cancel_requested(&slow));
    let after = env.get("t1", "pr-after-slow").await;
    assert!(after.metadata.annotations.contains_key(HOLD));
    assert!(!lifecycle::cancel_requested(&after));
    let d: Dag = Api::<Dag>::namespaced(env.client.clone(), "t1")
        .get("pr")
        .await
        .unwrap();
    assert_eq!(d.status.as_ref().unwrap().phase, DagPhase::Running);

    plans.set("pr-slow", Run::Exit(0, Duration::ZERO));
    let d = wait_dag(&env, "pr").await;
    let t = tasks(&d);
    assert_eq!(t["slow"].0, "Completed");
    assert_eq!(t["after-slow"].0, "Completed");
    let st = d.status.unwrap();
    assert_eq!(st.phase, DagPhase::Failed, "bad's failure is uncaught");
    assert_eq!(st.message.as_deref(), Some("step bad failed (exit code 3)"));
}

async fn wait_released(env: &Env, name: &str) {
    env.wait_alloc("t1", name, "released (hold lifted)", |a| {
        !a.metadata.annotations.contains_key(HOLD)
    })
    .await;
}

async fn held(env: &Env, name: &str) -> bool {
    env.get("t1", name)
        .await
        .metadata
        .annotations
        .contains_key(HOLD)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_max_parallel_releases_at_most_n_steps_at_once() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    plans.set("mp-start", Run::Hold);
    for i in 0..6 {
        plans.set(&format!("mp-w{i}"), Run::Hold);
    }
    let _runner = scripted_runner(&env, "t1", plans.clone());
    // Watch the released steps (created without hold, not finished): never more than 2.
    let most = Arc::new(Mutex::new(0usize));
    let reasons: Arc<Mutex<Vec<String>>> = Arc::default();
    let watcher = {
        let api = env.allocations("t1");
        let (most, reasons) = (most.clone(), reasons.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(list) = api.list(&ListParams::default()).await {
                    let mut n = 0;
                    for a in list.items.iter().filter(|a| {
                        a.labels().get("lattice.dev/dag").map(String::as_str) == Some("mp")
                    }) {
                        if a.metadata.annotations.contains_key(HOLD) {
                            if reason_of(a) == Some("waiting_for_max_parallel") {
                                let m = message_of(a);
                                let mut r = reasons.lock().unwrap();
                                if !r.contains(&m) {
                                    r.push(m);
                                }
                            }
                        } else if !a.phase().is_terminal() {
                            n += 1;
                        }
                    }
                    let mut m = most.lock().unwrap();
                    *m = (*m).max(n);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut allocations = vec![step("start", json!([]))];
    allocations.extend((0..6).map(|i| step(&format!("w{i}"), json!([{"start": "success"}]))));
    create_dag(
        &env,
        "mp",
        json!({"maxParallel": 2, "allocations": allocations}),
    )
    .await;
    env.wait_phase("t1", "mp-start", AllocationPhase::Running)
        .await;
    plans.set("mp-start", Run::Exit(0, Duration::ZERO));
    // The fan-out is ready: two go, the others wait and say why.
    let w5 = env
        .wait_alloc("t1", "mp-w5", "held for maxParallel", |a| {
            reason_of(a) == Some("waiting_for_max_parallel")
        })
        .await;
    assert!(w5.metadata.annotations.contains_key(HOLD));
    assert_eq!(
        message_of(&w5),
        "waiting: maxParallel 2 reached (2 steps running or pending)"
    );
    wait_released(&env, "mp-w0").await;
    wait_released(&env, "mp-w1").await;
    // Whichever finishes, the next in definition order goes.
    for (finish, next) in [("w1", "w2"), ("w0", "w3"), ("w3", "w4"), ("w2", "w5")] {
        for i in 0..6 {
            let name = format!("mp-w{i}");
            let released_before = match next {
                "w2" => 2,
                "w3" => 3,
                "w4" => 4,
                _ => 5,
            };
            assert_eq!(
                held(&env, &name).await,
                i >= released_before,
                "{name} before {finish} ends"
            );
        }
        plans.set(&format!("mp-{finish}"), Run::Exit(0, Duration::ZERO));
        env.wait_phase("t1", &format!("mp-{finish}"), AllocationPhase::Completed)
            .await;
        wait_released(&env, &format!("mp-{next}")).await;
    }
    plans.set("mp-w4", Run::Exit(0, Duration::ZERO));
    plans.set("mp-w5", Run::Exit(0, Duration::ZERO));
    let d = wait_dag(&env, "mp").await;
    watcher.abort();
    let t = tasks(&d);
    assert_eq!(
        d.status.as_ref().unwrap().phase,
        DagPhase::Completed,
        "{t:?}"
    );
    for i in 0..6 {
        let name = format!("mp-w{i}");
        assert_eq!(t[&format!("w{i}")].0, "Completed");
        assert_eq!(
            env.get("t1", &name).await.status.unwrap().attempt,
            1,
            "{name}"
        );
    }
    let most = *most.lock().unwrap();
    assert_eq!(
        most, 2,
        "at most 2 steps released at once, and the limit was used"
    );
    assert_eq!(
        *reasons.lock().unwrap(),
        ["waiting: maxParallel 2 reached (2 steps running or pending)"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_max_parallel_shows_why_a_step_waits_in_the_dag_status() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    for i in 0..3 {
        plans.set(&format!("ms-r{i}"), Run::Hold);
    }
    let _runner = scripted_runner(&env, "t1", plans.clone());
    let roots: Vec<serde_json::Value> = (0..3).map(|i| step(&format!("r{i}"), json!([]))).collect();
    create_dag(&env, "ms", json!({"maxParallel": 1, "allocations": roots})).await;
    env.wait_phase("t1", "ms-r0", AllocationPhase::Running)
        .await;
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    let mut t = BTreeMap::new();
    for _ in 0..500 {
        let d = api.get("ms").await.unwrap();
        t = tasks(&d);
        if t.get("r0").is_some_and(|x| x.0 == "Running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in ["r1", "r2"] {
        assert_eq!(
            t[r],
            (
                "Waiting".to_string(),
                "MaxParallel".to_string(),
                "waiting: maxParallel 1 reached (1 steps running or pending)".to_string()
            )
        );
        let a = env.get("t1", &format!("ms-{r}")).await;
        assert!(a.metadata.annotations.contains_key(HOLD), "{r}");
    }
    for i in 0..3 {
        plans.set(&format!("ms-r{i}"), Run::Exit(0, Duration::ZERO));
    }
    let d = wait_dag(&env, "ms").await;
    assert_eq!(d.status.unwrap().phase, DagPhase::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_fail_fast_stops_a_running_task_group() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    plans.set("fg-bad", Run::Hold);
    for i in 0..4 {
        plans.set(&format!("fg-arr-{i}"), Run::Hold);
    }
    let _runner = scripted_runner(&env, "t1", plans.clone());
    let mut arr = step("arr", json!([]));
    arr["spec"]["taskGroup"] = json!({"range": "0-3", "concurrency": 2});
    create_dag(
        &env,
        "fg",
        json!({"failurePolicy": "fail_fast", "allocations": [step("bad", json!([])), arr]}),
    )
    .await;
    for n in ["fg-bad", "fg-arr-0", "fg-arr-1"] {
        env.wait_phase("t1", n, AllocationPhase::Running).await;
    }
    plans.set("fg-bad", Run::Exit(1, Duration::ZERO));
    let d = wait_dag(&env, "fg").await;
    let st = d.status.clone().unwrap();
    assert_eq!(st.phase, DagPhase::Failed, "{:?}", tasks(&d));
    assert!(st.message.unwrap_or_default().contains("step bad failed"));
    let t = tasks(&d);
    assert_eq!(t["arr"].0, "Cancelled", "{:?}", t["arr"]);
    for i in 0..2 {
        let a = env.get("t1", &format!("fg-arr-{i}")).await;
        assert_eq!(a.phase(), AllocationPhase::Cancelled, "element {i}");
        assert_eq!(
            a.metadata
                .annotations
                .get(CANCEL_REASON)
                .map(String::as_str),
            Some("cancelled: step bad failed and the DAG's failurePolicy is fail_fast")
        );
    }
    // The elements not released yet never were.
    for i in 2..4 {
        let a = env
            .allocations("t1")
            .get_opt(&format!("fg-arr-{i}"))
            .await
            .unwrap();
        assert!(a.is_none(), "element {i} was created");
    }
}
