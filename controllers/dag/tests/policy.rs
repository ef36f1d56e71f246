//! `failurePolicy` and `maxParallel` (the engine's [`Policy`]).
mod common;

use common::*;
use lattice_dag::dispatch::{Action, CancelReason, DagPhase, Engine, FailurePolicy, Policy};
use lattice_dag::graph::DagDef;
use lattice_dag::Condition::{Failure, Mutex, Success};
use lattice_dag::{Outcome, StepState};

fn fail_fast() -> Policy {
    Policy {
        failure_policy: FailurePolicy::FailFast,
        max_parallel: None,
    }
}

fn limit(n: u32) -> Policy {
    Policy {
        max_parallel: Some(n),
        ..Default::default()
    }
}

fn released(acts: &[Action]) -> Vec<String> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Release { step, .. } => Some(step.clone()),
            _ => None,
        })
        .collect()
}

fn cancelled(acts: &[Action]) -> Vec<(String, CancelReason)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Cancel { step, reason, .. } => Some((step.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

/// a and b run side by side; c needs a, d needs b, e is another root.
fn two_branches() -> Vec<lattice_dag::graph::StepDef> {
    vec![
        step("a", &[]),
        step("b", &[]),
        step("c", &[("a", Success)]),
        step("d", &[("b", Success)]),
        step("e", &[]),
    ]
}

#[test]
fn fail_fast_cancels_waiting_and_running_steps_and_ends_failed() {
    let mut e = Engine::with_policy(dag(two_branches()), fail_fast());
    assert_eq!(released(&e.start()), ["a", "b", "e"]);
    e.on_started("a", None).unwrap();
    e.on_started("b", None).unwrap();
    let acts = e
        .on_terminal("a", Outcome::Failed { exit: 3 }, None)
        .unwrap();
    let ff = CancelReason::FailFast { failed: "a".into() };
    let mut got = cancelled(&acts);
    got.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        got,
        vec![
            ("b".to_string(), ff.clone()),
            (
                "c".to_string(),
                CancelReason::DependencyFailed {
                    dependency: "a".into()
                }
            ),
            ("d".to_string(), ff.clone()),
            ("e".to_string(), ff.clone()),
        ]
    );
    assert!(released(&acts).is_empty());
    assert_eq!(e.aborted_by(), Some("a"));
    assert_eq!(e.first_failure(), Some("a"));
    // The running steps stop when their terminal events arrive.
    assert_eq!(e.cancelling("b"), Some(&ff));
    assert_eq!(e.cancelling("d"), None, "d never ran: cancelled at once");
    assert_eq!(
        e.state("d"),
        Some(&StepState::Cancelled { reason: ff.clone() })
    );
    assert_eq!(e.phase(), DagPhase::Running);
    e.on_terminal("b", Outcome::Cancelled, None).unwrap();
    assert_eq!(
        e.state("b"),
        Some(&StepState::Cancelled { reason: ff.clone() })
    );
    // A step that finishes anyway (the cancel raced its exit) keeps its outcome, and
    // nothing is released after it.
    assert!(e
        .on_terminal("e", Outcome::Succeeded, None)
        .unwrap()
        .is_empty());
    assert_eq!(e.phase(), DagPhase::Failed);
}

#[test]
fn propagate_keeps_independent_branches_running() {
    let mut e = Engine::new(dag(two_branches()));
    assert_eq!(released(&e.start()), ["a", "b", "e"]);
    let acts = e
        .on_terminal("a", Outcome::Failed { exit: 1 }, None)
        .unwrap();
    assert_eq!(
        cancelled(&acts),
        [(
            "c".to_string(),
            CancelReason::DependencyFailed {
                dependency: "a".into()
            }
        )]
    );
    assert_eq!(e.aborted_by(), None);
    assert_eq!(
        released(&e.on_terminal("b", Outcome::Succeeded, None).unwrap()),
        ["d"]
    );
    e.on_terminal("d", Outcome::Succeeded, None).unwrap();
    e.on_terminal("e", Outcome::Succeeded, None).unwrap();
    assert_eq!(e.phase(), DagPhase::Failed);
    assert_eq!(e.first_failure(), Some("a"));
}

#[test]
fn fail_fast_ignores_caught_failures() {
    let mut e = Engine::with_policy(
        dag(vec![
            step("a", &[]),
            step("b", &[]),
            step("on-a-failure", &[("a", Failure)]),
        ]),
        fail_fast(),
    );
    e.start();
    let acts = e
        .on_terminal("a", Outcome::Failed { exit: 1 }, None)
        .unwrap();
    assert_eq!(released(&acts), ["on-a-failure"]);
    assert!(cancelled(&acts).is_empty());
    assert_eq!(e.aborted_by(), None);
    e.on_terminal("b", Outcome::Succeeded, None).unwrap();
    e.on_terminal("on-a-failure", Outcome::Succeeded, None)
        .unwrap();
    assert_eq!(e.phase(), DagPhase::Completed);
}

#[test]
fn fail_fast_stops_a_task_group_at_its_first_failed_element() {
    let mut e = Engine::with_policy(
        dag(vec![group("g", "0-9%2", &[]), step("other", &[])]),
        fail_fast(),
    );
    let acts = e.start();
    assert_eq!(released(&acts), ["g", "g", "other"]);
    let acts = e
        .on_terminal("g", Outcome::Failed { exit: 1 }, Some(0))
        .unwrap();
    assert!(released(&acts).is_empty(), "{acts:?}");
    let ff = CancelReason::FailFast { failed: "g".into() };
    assert!(cancelled(&acts).contains(&("other".to_string(), ff.clone())));
    assert!(cancelled(&acts).contains(&("g".to_string(), ff.clone())));
    e.on_terminal("g", Outcome::Cancelled, Some(1)).unwrap();
    e.on_terminal("other", Outcome::Cancelled, None).unwrap();
    assert!(matches!(e.state("g"), Some(StepState::Failed { .. })));
    assert_eq!(e.group_status("g").unwrap().cancelled, 9);
    assert_eq!(e.phase(), DagPhase::Failed);
}

#[test]
fn switching_to_fail_fast_after_a_replay_stops_the_dag_then() {
    // A controller replays under `propagate`, then switches (see set_failure_policy).
    let mut e = Engine::new(dag(two_branches()));
    e.start();
    e.on_terminal("a", Outcome::Failed { exit: 1 }, None)
        .unwrap();
    e.on_terminal("e", Outcome::Succeeded, None).unwrap();
    let acts = e.set_failure_policy(FailurePolicy::FailFast);
    let ff = CancelReason::FailFast { failed: "a".into() };
    assert_eq!(
        cancelled(&acts),
        [("b".to_string(), ff.clone()), ("d".to_string(), ff)]
    );
    assert_eq!(e.state("e"), Some(&StepState::Succeeded));
    e.on_terminal("b", Outcome::Cancelled, None).unwrap();
    assert_eq!(e.phase(), DagPhase::Failed);
}

#[test]
fn max_parallel_releases_in_definition_order_as_steps_finish() {
    let steps = (0..6).map(|i| step(&format!("s{i}"), &[])).collect();
    let mut e = Engine::with_policy(dag(steps), limit(2));
    assert_eq!(released(&e.start()), ["s0", "s1"]);
    assert_eq!(e.slots_used(), 2);
    assert!(e.waiting_for_slot("s2"));
    assert_eq!(e.state("s5"), Some(&StepState::Queued));
    assert_eq!(e.take_parked(), ["s2", "s3", "s4", "s5"]);
    assert!(e.take_parked().is_empty());
    // Whatever finishes, the lowest waiting step goes next.
    assert_eq!(
        released(&e.on_terminal("s1", Outcome::Succeeded, None).unwrap()),
        ["s2"]
    );
    assert_eq!(
        released(
            &e.on_terminal("s2", Outcome::Failed { exit: 1 }, None)
                .unwrap()
        ),
        ["s3"]
    );
    assert_eq!(
        released(&e.on_terminal("s0", Outcome::Succeeded, None).unwrap()),
        ["s4"]
    );
    assert_eq!(
        released(&e.on_terminal("s4", Outcome::Succeeded, None).unwrap()),
        ["s5"]
    );
    assert_eq!(e.slots_used(), 2);
    e.on_terminal("s3", Outcome::Succeeded, None).unwrap();
    e.on_terminal("s5", Outcome::Succeeded, None).unwrap();
    assert_eq!(e.slots_used(), 0);
    assert_eq!(e.phase(), DagPhase::Failed);
}

#[test]
fn max_parallel_counts_steps_whose_dependencies_came_to_hold() {
    let mut e = Engine::with_policy(
        dag(vec![
            step("root", &[]),
            step("x", &[("root", Success)]),
            step("y", &[("root", Success)]),
            step("z", &[("root", Success)]),
        ]),
        limit(2),
    );
    assert_eq!(released(&e.start()), ["root"]);
    assert!(e.take_parked().is_empty());
    let acts = e.on_terminal("root", Outcome::Succeeded, None).unwrap();
    assert_eq!(released(&acts), ["x", "y"]);
    assert_eq!(e.take_parked(), ["z"]);
    assert_eq!(
        released(&e.on_terminal("y", Outcome::Succeeded, None).unwrap()),
        ["z"]
    );
}

#[test]
fn a_started_step_still_waiting_for_a_slot_is_taken_as_released() {
    // Replaying a record in another order than it happened: s2 ran although the
    // engine would have released s1 first.
    let steps = (0..3).map(|i| step(&format!("s{i}"), &[])).collect();
    let mut e = Engine::with_policy(dag(steps), limit(1));
    assert_eq!(released(&e.start()), ["s0"]);
    e.on_started("s2", None).unwrap();
    assert_eq!(e.state("s2"), Some(&StepState::Running));
    assert!(!e.waiting_for_slot("s2"));
    assert_eq!(e.slots_used(), 2);
    // Two slots are in use: s0's end frees none for s1.
    assert!(released(&e.on_terminal("s0", Outcome::Succeeded, None).unwrap()).is_empty());
    assert_eq!(
        released(&e.on_terminal("s2", Outcome::Succeeded, None).unwrap()),
        ["s1"]
    );
}

#[test]
fn max_parallel_and_mutexes_do_not_deadlock() {
    // One slot; b holds the lock only after a (same lock) ends, and a plain
    // step c waits for the slot meanwhile.
    let mut e = Engine::with_policy(
        dag(vec![
            step("a", &[("gpu", Mutex)]),
            step("b", &[("gpu", Mutex)]),
            step("c", &[]),
            group("g", "0-2%2", &[("gpu", Mutex)]),
        ]),
        limit(1),
    );
    let mut most = 0;
    let run = drive(
        &mut e,
        &|_, _| Outcome::Succeeded,
        &mut |n| n - 1,
        false,
        &mut |e, in_flight| {
            let steps: std::collections::BTreeSet<&str> =
                in_flight.iter().map(|(s, _)| s.as_str()).collect();
            most = most.max(steps.len());
            assert!(e.slots_used() <= 1, "{in_flight:?}");
        },
    );
    assert_eq!(most, 1);
    assert_eq!(run.ran.len(), 6, "{:?}", run.ran);
    assert_eq!(e.phase(), DagPhase::Completed, "{:?}", e.status());
}

#[test]
fn cancelling_the_dag_clears_the_slot_queue() {
    let steps = (0..4).map(|i| step(&format!("s{i}"), &[])).collect();
    let mut e = Engine::with_policy(dag(steps), limit(1));
    e.start();
    let acts = e.cancel_dag();
    assert_eq!(cancelled(&acts).len(), 4);
    assert!(released(&e.on_terminal("s0", Outcome::Cancelled, None).unwrap()).is_empty());
    assert_eq!(e.phase(), DagPhase::Cancelled);
    assert_eq!(e.slots_used(), 0);
}

#[test]
fn policy_from_a_manifest() {
    let def = DagDef::from_yaml(
        "name: p\nfailure_policy: fail_fast\nmax_parallel: 4\nallocations: [{name: a}]\n",
    )
    .unwrap();
    assert_eq!(
        Policy::from_def(&def),
        Policy {
            failure_policy: FailurePolicy::FailFast,
            max_parallel: Some(4)
        }
    );
    let def =
        DagDef::from_yaml("kind: Dag\nmetadata: {name: p}\nspec: {allocations: [{name: a}]}\n")
            .unwrap();
    assert_eq!(Policy::from_def(&def), Policy::default());
}
