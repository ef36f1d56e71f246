//! Options of standalone allocations' dependencies (issue 7, Slurm's `?`, `ID+MINUTES`
//! and `ID_TASK`): `anyOf` alternatives, `delay` after the dependency's recorded start or
//! end, and `taskIndex` on one element of a job array — against a real store with the
//! built-in controllers and simulated agents.

mod common;

use std::time::Duration;

use common::*;
use lattice_apis::meta::ConditionStatus;
use lattice_apis::{lifecycle, Allocation, AllocationPhase};
use lattice_controllers::allocations::{dependencies_met, DEPENDENCIES_MET};
use serde_json::json;

/// When `DependenciesMet` became True (epoch seconds, whole seconds as stored).
fn met_at(a: &Allocation) -> f64 {
    let c = a
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == DEPENDENCIES_MET))
        .expect("DependenciesMet condition");
    assert_eq!(c.status, ConditionStatus::True);
    c.last_transition_time.expect("transition time").timestamp() as f64
}

fn end_of(a: &Allocation) -> f64 {
    a.status
        .as_ref()
        .and_then(|s| s.end_time)
        .expect("end time")
        .timestamp() as f64
}

fn start_of(a: &Allocation) -> f64 {
    a.status
        .as_ref()
        .and_then(|s| s.start_time)
        .expect("start time")
        .timestamp() as f64
}

async fn wait_waiting(env: &Env, name: &str, needle: &str) -> Allocation {
    wait_waiting_only(env, name, needle, "\u{0}").await
}

/// Waiting, with `needle` in the message and no longer `gone`.
async fn wait_waiting_only(env: &Env, name: &str, needle: &str, gone: &str) -> Allocation {
    env.wait_alloc(
        "t1",
        name,
        &format!("waiting ({needle}, not {gone})"),
        |a| {
            let m = message_of(a);
            reason_of(a) == Some("waiting_for_dependencies")
                && m.contains(needle)
                && !m.contains(gone)
        },
    )
    .await
}

/// Submit an allocation held out of the queue until [`release`].
async fn held(env: &Env, name: &str, extra: serde_json::Value) {
    let mut v = json!({"metadata": {"annotations": {HOLD: "true"}}});
    merge(&mut v, extra);
    env.submit("t1", name, 1, v).await;
}

async fn release(env: &Env, name: &str) {
    annotate(env, name, HOLD, serde_json::Value::Null).await;
}

async fn deps(env: &Env, name: &str, depends_on: serde_json::Value) {
    env.submit("t1", name, 1, json!({"spec": {"dependsOn": depends_on}}))
        .await;
}

/// Slurm `afterok:A?afterok:B`: the first alternative that holds releases the
/// allocation; one that can never hold does not cancel it while another may still hold;
/// only when every alternative can never hold is it cancelled. Entries without `anyOf`
/// must hold as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_of_releases_on_the_first_alternative_and_cancels_only_when_none_can_hold() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    for a in ["a1", "a2", "b1", "b2", "c1", "c2", "r", "g1", "g2"] {
        held(&env, a, json!({})).await;
    }
    let alt = |r: &str, c: &str| json!({"ref": r, "condition": c, "anyOf": true});
    deps(
        &env,
        "first",
        json!([alt("a1", "success"), alt("a2", "success")]),
    )
    .await;
    deps(
        &env,
        "second",
        json!([alt("b1", "success"), alt("b2", "success")]),
    )
    .await;
    deps(
        &env,
        "none",
        json!([alt("c1", "success"), alt("c2", "failure")]),
    )
    .await;
    deps(
        &env,
        "mixed",
        json!([{"ref": "r", "condition": "success"}, alt("g1", "any"), alt("g2", "any")]),
    )
    .await;
    for d in ["first", "second", "none", "mixed"] {
        let w = wait_waiting(&env, d, "any of:").await;
        assert!(!dependencies_met(&w), "{d}");
        assert!(
            records(&w).iter().all(|(_, s)| !s),
            "{d}: {:?}",
            records(&w)
        );
    }

    // The second alternative holds first: released while the first is still pending.
    release(&env, "a2").await;
    let first = env
        .wait_phase("t1", "first", AllocationPhase::Completed)
        .await;
    assert_eq!(
        records(&first),
        [
            ("afterok:a1".to_string(), false),
            ("afterok:a2".to_string(), true)
        ]
    );
    assert_eq!(env.get("t1", "a1").await.phase(), AllocationPhase::Pending);

    // An alternative that fails does not cancel; the other one releases it later.
    plans.set("b1", Run::Exit(3, Duration::ZERO));
    release(&env, "b1").await;
    env.wait_phase("t1", "b1", AllocationPhase::Failed).await;
    // Still waiting, now for b2 only.
    let w = wait_waiting_only(&env, "second", "any of: b2 (success)", "b1").await;
    assert_eq!(w.phase(), AllocationPhase::Pending);
    assert_eq!(
        records(&w),
        [
            ("afterok:b1".to_string(), false),
            ("afterok:b2".to_string(), false)
        ]
    );
    release(&env, "b2").await;
    env.wait_phase("t1", "second", AllocationPhase::Completed)
        .await;

    // Every alternative can never hold: cancelled, naming each.
    plans.set("c1", Run::Exit(3, Duration::ZERO));
    release(&env, "c1").await;
    env.wait_phase("t1", "c1", AllocationPhase::Failed).await;
    wait_waiting_only(&env, "none", "any of: c2 (failure)", "c1").await;
    release(&env, "c2").await; // exits 0: afternotok can never hold
    let n = wait_never(&env, "none", "none of the any-of alternatives can hold").await;
    let msg = message_of(&n);
    assert!(
        msg.contains("afterok:c1: c1 (success) ended Failed")
            && msg.contains("afternotok:c2: c2 (failure) ended Completed"),
        "{msg}"
    );

    // The group holds (g1 ended), the required entry does not yet.
    release(&env, "g1").await;
    env.wait_phase("t1", "g1", AllocationPhase::Completed).await;
    let w = wait_waiting_only(&env, "mixed", "r (success)", "any of").await;
    assert!(!dependencies_met(&w));
    release(&env, "r").await;
    let m = env
        .wait_phase("t1", "mixed", AllocationPhase::Completed)
        .await;
    assert_eq!(
        records(&m),
        [
            ("afterok:r".to_string(), true),
            ("afterany:g1".to_string(), true),
            ("afterany:g2".to_string(), false)
        ]
    );
}

/// Slurm `after:A+MIN` (and Lattice's delay on the other conditions): released not
/// before the dependency's recorded end (start, for `started`) plus the delay, by a
/// timer of the controller (nothing else changes), and never later than that because
/// the controller noticed late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_releases_not_before_the_recorded_event_plus_the_delay() {
    let (mut env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    held(&env, "p", json!({})).await;
    held(&env, "s", json!({})).await;
    plans.set("s", Run::Hold);
    deps(
        &env,
        "after-end",
        json!([{"ref": "p", "condition": "any", "delay": "2s"}]),
    )
    .await;
    deps(
        &env,
        "after-start",
        json!([{"ref": "s", "condition": "started", "delay": 1}]),
    )
    .await;
    let w = wait_waiting(&env, "after-end", "p (any)").await;
    assert_eq!(records(&w), [("afterany:p+2s".to_string(), false)]);
    wait_waiting(&env, "after-start", "s (started)").await;

    release(&env, "p").await;
    release(&env, "s").await;
    let p = env.wait_phase("t1", "p", AllocationPhase::Completed).await;
    let end = end_of(&p);
    // Never seen released before p's recorded end + 2 s (a look that returned earlier
    // finds it held), and released by the controller's own timer soon after.
    let mut looks = 0;
    loop {
        let a = env.get("t1", "after-end").await;
        let t1 = epoch_now();
        if dependencies_met(&a) {
            assert!(t1 >= end + 2.0, "released by {t1}, p ended at {end}");
            break;
        }
        assert!(t1 < end + 10.0, "not released 10 s after p ended");
        looks += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        looks > 0,
        "p's end was not observed before its delay ran out"
    );
    let a = env
        .wait_phase("t1", "after-end", AllocationPhase::Completed)
        .await;
    assert!(
        met_at(&a) >= end + 2.0,
        "met {} < end {end} + 2",
        met_at(&a)
    );
    let scheduled = a
        .status
        .as_ref()
        .unwrap()
        .scheduled_time
        .unwrap()
        .timestamp() as f64;
    assert!(scheduled >= end + 2.0, "bound at {scheduled}");
    assert_eq!(records(&a), [("afterany:p+2s".to_string(), true)]);

    // `started`: from the recorded start, while s still runs.
    let a = env
        .wait_phase("t1", "after-start", AllocationPhase::Completed)
        .await;
    let s = env.get("t1", "s").await;
    assert_eq!(s.phase(), AllocationPhase::Running);
    assert!(met_at(&a) >= start_of(&s) + 1.0);

    // Noticed late (controllers down while the dependency ended and its delay ran out):
    // released at once, not a delay after the controller noticed.
    held(&env, "q", json!({})).await;
    deps(
        &env,
        "late",
        json!([{"ref": "q", "condition": "success", "delay": "3s"}]),
    )
    .await;
    wait_waiting(&env, "late", "q (success)").await;
    plans.set("q", Run::Hold);
    release(&env, "q").await;
    env.wait_phase("t1", "q", AllocationPhase::Running).await;
    env.stop_controllers();
    plans.set("q", Run::Exit(0, Duration::ZERO));
    let q = env.wait_phase("t1", "q", AllocationPhase::Completed).await;
    let end = end_of(&q);
    while epoch_now() < end + 3.5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dependencies_met(&env.get("t1", "late").await));
    let restart = epoch_now();
    env.start_controllers(fast_config());
    env.wait_alloc("t1", "late", "dependencies met", dependencies_met)
        .await;
    let seen = epoch_now();
    assert!(
        seen - restart < 2.5,
        "released {:.1} s after the restart: timed from the restart, not from q's end",
        seen - restart
    );
    env.wait_phase("t1", "late", AllocationPhase::Completed)
        .await;
}

/// Slurm `afterok:ARRAY_TASK`: one element of a job array decides, whatever the other
/// elements and the array as a whole do; an index the array does not have, an array that
/// ends without creating the element, or a ref that is no job array can never hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn array_task_dependency_follows_only_that_element() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4", "n5", "n6"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    plans.set("arr-1", Run::Exit(3, Duration::ZERO));
    plans.set("arr-2", Run::Hold);
    // Submitted before the array exists: waits for it.
    deps(&env, "t0-ok", json!([{"ref": "arr", "taskIndex": 0}])).await;
    wait_waiting(&env, "t0-ok", "arr (not found yet)").await;
    deps(
        &env,
        "t1-ok",
        json!([{"ref": "arr", "taskIndex": 1, "condition": "success"}]),
    )
    .await;
    deps(
        &env,
        "t1-notok",
        json!([{"ref": "arr", "taskIndex": 1, "condition": "failure"}]),
    )
    .await;
    deps(
        &env,
        "t2-any",
        json!([{"ref": "arr", "taskIndex": 2, "condition": "any"}]),
    )
    .await;
    deps(&env, "t9", json!([{"ref": "arr", "taskIndex": 9}])).await;
    held(&env, "plain", json!({})).await;
    deps(&env, "not-array", json!([{"ref": "plain", "taskIndex": 0}])).await;
    env.submit(
        "t1",
        "arr",
        1,
        json!({"spec": {"taskGroup": {"range": "0-3"}}}),
    )
    .await;

    // Element 0 completed: released while element 2 still runs and the array, which
    // will fail (element 1), has not ended.
    let t0 = env
        .wait_phase("t1", "t0-ok", AllocationPhase::Completed)
        .await;
    assert_eq!(records(&t0), [("afterok:arr_0".to_string(), true)]);
    assert!(!env.get("t1", "arr").await.phase().is_terminal());
    wait_never(&env, "t1-ok", "arr[1] (arr-1) (success) ended Failed").await;
    env.wait_phase("t1", "t1-notok", AllocationPhase::Completed)
        .await;
    wait_never(&env, "t9", "arr has no task 9 (its range is 0-3)").await;
    wait_never(&env, "not-array", "plain is not a job array").await;
    let w = wait_waiting(&env, "t2-any", "arr[2] (arr-2) (any)").await;
    assert_eq!(
        env.get("t1", "arr-2").await.phase(),
        AllocationPhase::Running
    );
    assert!(!dependencies_met(&w));
    plans.set("arr-2", Run::Exit(5, Duration::ZERO));
    env.wait_phase("t1", "t2-any", AllocationPhase::Completed)
        .await;
    env.wait_phase("t1", "arr", AllocationPhase::Failed).await;

    // An element not created yet (concurrency 1) is waited for; when the array is
    // cancelled without creating it, the dependency can never hold.
    plans.set("lazy-0", Run::Hold);
    env.submit(
        "t1",
        "lazy",
        1,
        json!({"spec": {"taskGroup": {"range": "0-2", "concurrency": 1}}}),
    )
    .await;
    deps(&env, "lazy-2-dep", json!([{"ref": "lazy", "taskIndex": 2}])).await;
    env.wait_phase("t1", "lazy-0", AllocationPhase::Running)
        .await;
    wait_waiting(&env, "lazy-2-dep", "lazy[2] (not created yet)").await;
    annotate(&env, "lazy", lifecycle::CANCEL_ANNOTATION, json!("true")).await;
    wait_never(
        &env,
        "lazy-2-dep",
        "task 2 of lazy was never created (lazy ended Cancelled)",
    )
    .await;
}

/// The three forms together, as `--dependency=afterok:A+MIN?afterany:ARRAY_TASK` writes
/// them: the array task alternative releases, its delay timed from the element's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_array_task_alternative() {
    let (env, _hb) = cluster(&["n1", "n2", "n3"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    held(&env, "never-runs", json!({})).await;
    env.submit(
        "t1",
        "sweep",
        1,
        json!({"spec": {"taskGroup": {"range": "0-1"}}}),
    )
    .await;
    deps(
        &env,
        "combo",
        json!([
            {"ref": "never-runs", "condition": "success", "delay": "5m", "anyOf": true},
            {"ref": "sweep", "taskIndex": 1, "condition": "any", "delay": "1s", "anyOf": true}
        ]),
    )
    .await;
    let a = env
        .wait_phase("t1", "combo", AllocationPhase::Completed)
        .await;
    let element = env.get("t1", "sweep-1").await;
    assert!(met_at(&a) >= end_of(&element) + 1.0);
    assert_eq!(
        records(&a),
        [
            ("afterok:never-runs+300s".to_string(), false),
            ("afterany:sweep_1+1s".to_string(), true)
        ]
    );
    assert_eq!(
        env.get("t1", "never-runs").await.phase(),
        AllocationPhase::Pending
    );
}
