//! Dependency schemes (Slurm `--dependency`, Flux RFC 26) on standalone allocations,
//! against a real store with simulated agents.
//!
//! The same scenarios with the real `lattice-agent` processes are in `e2e/`.

mod common;

use std::time::Duration;

use common::*;
use lattice_apis::{lifecycle, AllocationPhase, NodeTaskPhase};
use lattice_runtime::ResourceExt;
use serde_json::json;

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
