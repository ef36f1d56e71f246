//! Table-driven tests for every condition and edge case of the seed.
mod common;

use common::*;
use lattice_dag::dispatch::{Action, CancelReason, DagPhase, Engine, StepState};
use lattice_dag::graph::{StepDef, TaskGroupDef};
use lattice_dag::Condition::{self, Any, Corresponding, Failure, Mutex, Success};
use lattice_dag::Outcome;

struct Case {
    name: &'static str,
    steps: Vec<StepDef>,
    failing: &'static [&'static str],
    ran: &'static [&'static str],
    cancelled: &'static [&'static str],
    phase: DagPhase,
}

fn seed_error_paths() -> Vec<StepDef> {
    vec![
        step("train", &[]),
        step("evaluate", &[("train", Success)]),
        step("deploy", &[("evaluate", Success)]),
        step(
            "notify_failure",
            &[("train", Failure), ("evaluate", Failure)],
        ),
    ]
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "success satisfied",
            steps: vec![step("a", &[]), step("b", &[("a", Success)])],
            failing: &[],
            ran: &["a", "b"],
            cancelled: &[],
            phase: DagPhase::Completed,
        },
        Case {
            name: "success failed cascades",
            steps: vec![
                step("a", &[]),
                step("b", &[("a", Success)]),
                step("c", &[("b", Success)]),
                step("d", &[("c", Success)]),
            ],
            failing: &["a"],
            ran: &["a"],
            cancelled: &["b", "c", "d"],
            phase: DagPhase::Failed,
        },
        Case {
            name: "failure edge runs handler on failure",
            steps: vec![step("a", &[]), step("h", &[("a", Failure)])],
            failing: &["a"],
            ran: &["a", "h"],
            cancelled: &[],
            phase: DagPhase::Completed,
        },
        Case {
            name: "failure edge skipped on success",
            steps: vec![
                step("a", &[]),
                step("h", &[("a", Failure)]),
                step("after_h", &[("h", Any)]),
            ],
            failing: &[],
            ran: &["a", "after_h"],
            cancelled: &["h"],
            phase: DagPhase::Completed,
        },
        Case {
            name: "any runs after success",
            steps: vec![
                step("run_experiment", &[]),
                step("cleanup", &[("run_experiment", Any)]),
            ],
            failing: &[],
            ran: &["run_experiment", "cleanup"],
            cancelled: &[],
            phase: DagPhase::Completed,
        },
        Case {
            name: "any runs after failure",
            steps: vec![
                step("run_experiment", &[]),
                step("cleanup", &[("run_experiment", Any)]),
            ],
            failing: &["run_experiment"],
            ran: &["run_experiment", "cleanup"],
            cancelled: &[],
            phase: DagPhase::Completed,
        },
        Case {
            name: "any runs after a cancelled predecessor",
            steps: vec![
                step("a", &[]),
                step("b", &[("a", Success)]),
                step("cleanup", &[("b", Any)]),
            ],
            failing: &["a"],
            ran: &["a", "cleanup"],
            cancelled: &["b"],
            phase: DagPhase::Failed,
        },
        Case {
            name: "seed error paths: all succeed",
            steps: seed_error_paths(),
            failing: &[],
            ran: &["train", "evaluate", "deploy"],
            cancelled: &["notify_failure"],
            phase: DagPhase::Completed,
        },
        Case {
            name: "seed error paths: train fails",
            steps: seed_error_paths(),
            failing: &["train"],
            ran: &["train", "notify_failure"],
            cancelled: &["evaluate", "deploy"],
            phase: DagPhase::Completed,
        },
        Case {
            name: "seed error paths: evaluate fails",
            steps: seed_error_paths(),
            failing: &["evaluate"],
            ran: &["train", "evaluate", "notify_failure"],
            cancelled: &["deploy"],
            phase: DagPhase::Completed,
        },
        Case {
            name: "seed error paths: handler fails too",
            steps: seed_error_paths(),
            failing: &["train", "notify_failure"],
            ran: &["train", "notify_failure"],
            cancelled: &["evaluate", "deploy"],
            phase: DagPhase::Failed,
        },
        Case {
            name: "diamond waits for both",
            steps: vec![
                step("a", &[]),
                step("b", &[("a", Success)]),
                step("c", &[("a", Success)]),
                step("d", &[("b", Success), ("c", Success)]),
            ],
            failing: &["c"],
            ran: &["a", "b", "c"],
            cancelled: &["d"],
            phase: DagPhase::Failed,
        },
        Case {
            name: "independent branches continue",
            steps: vec![
                step("a", &[]),
                step("b", &[("a", Success)]),
                step("x", &[]),
                step("y", &[("x", Success)]),
            ],
            failing: &["a"],
            ran: &["a", "x", "y"],
            cancelled: &["b"],
            phase: DagPhase::Failed,
        },
    ]
}

#[test]
fn table() {
    for c in cases() {
        let mut e = Engine::new(dag(c.steps));
        let failing = c.failing;
        let run = fifo(&mut e, &ok_except(failing));
        assert_eq!(
            names(run.ran.keys().cloned()),
            set(c.ran),
            "{}: ran",
            c.name
        );
        assert_eq!(
            names(run.cancelled.iter().cloned()),
            set(c.cancelled),
            "{}: cancelled",
            c.name
        );
        assert_eq!(e.phase(), c.phase, "{}: phase", c.name);
    }
}

#[test]
fn cancel_reasons_and_skipped_counts() {
    let mut e = Engine::new(dag(seed_error_paths()));
    fifo(&mut e, &ok_except(&["train"]));
    assert_eq!(
        e.state("evaluate"),
        Some(&StepState::Cancelled {
            reason: CancelReason::DependencyFailed {
                dependency: "train".into()
            }
        })
    );
    assert_eq!(
        e.state("deploy"),
        Some(&StepState::Cancelled {
            reason: CancelReason::DependencyCancelled {
                dependency: "evaluate".into()
            }
        })
    );
    let mut e = Engine::new(dag(seed_error_paths()));
    fifo(&mut e, &ok_except(&[]));
    let st = e.status();
    assert_eq!(st.counts.skipped, 1);
    assert_eq!(st.counts.succeeded, 3);
    assert_eq!(st.phase, DagPhase::Completed);
    assert_eq!(
        e.state("notify_failure").map(StepState::phase_name),
        Some("Skipped")
    );
}

#[test]
fn corresponding_mixed_exit_codes() {
    let mut e = Engine::new(dag(vec![
        group("preprocess", "0-4", &[]),
        group("train", "0-4", &[("preprocess", Corresponding)]),
        step("report", &[("train", Any)]),
    ]));
    let out = |s: &str, i: Option<u64>| {
        if s == "preprocess" && i == Some(3) {
            Outcome::Failed { exit: 3 }
        } else if s == "train" && i == Some(1) {
            Outcome::Failed { exit: 7 }
        } else {
            Outcome::Succeeded
        }
    };
    let run = fifo(&mut e, &out);
    let ran = names(run.ran.keys().cloned());
    for i in [0, 1, 2, 4] {
        assert!(
            ran.contains(&format!("train[{i}]")),
            "train[{i}] should run"
        );
    }
    assert!(!ran.contains("train[3]"));
    assert!(names(run.cancelled.iter().cloned()).contains("train[3]"));
    assert!(
        ran.contains("report"),
        "report waits for all evaluable elements, then runs"
    );
    assert_eq!(e.state("train"), Some(&StepState::Failed { exit: 7 }));
    let g = e.group_status("train").expect("group");
    assert_eq!((g.succeeded, g.failed, g.cancelled), (3, 1, 1));
    // preprocess failed with no catching edge.
    assert_eq!(e.phase(), DagPhase::Failed);
}

#[test]
fn corresponding_element_waits_only_for_its_index() {
    let mut e = Engine::new(dag(vec![
        group("pre", "0-2", &[]),
        group("train", "0-2", &[("pre", Corresponding)]),
    ]));
    let acts = e.start();
    assert_eq!(acts.len(), 3);
    e.on_started("pre", Some(2)).expect("start");
    let acts = e
        .on_terminal("pre", Outcome::Succeeded, Some(2))
        .expect("done");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "train".into(),
            index: Some(2)
        }]
    );
}

#[test]
fn corresponding_mismatched_sizes_extra_run_as_roots() {
    let mut e = Engine::new(dag(vec![
        group("preprocess", "0-9", &[]),
        group("train", "0-14", &[("preprocess", Corresponding)]),
    ]));
    assert!(e.dag().warnings.iter().any(|w| w.contains("5 of 15")));
    let acts = e.start();
    let released = names(acts.into_iter().filter_map(|a| match a {
        Action::Release { step, index } => Some((step, index)),
        _ => None,
    }));
    for i in 10..15 {
        assert!(
            released.contains(&format!("train[{i}]")),
            "train[{i}] is a root"
        );
    }
    for i in 0..10 {
        assert!(!released.contains(&format!("train[{i}]")));
    }
    // Successor smaller than predecessor: extra predecessor elements are irrelevant.
    let mut e = Engine::new(dag(vec![
        group("a", "0-9", &[]),
        group("b", "0-2", &[("a", Corresponding)]),
    ]));
    let run = fifo(&mut e, &ok_except(&[]));
    assert_eq!(run.ran.len(), 13);
    assert_eq!(e.phase(), DagPhase::Completed);
}

#[test]
fn corresponding_cascades_per_index() {
    let mut e = Engine::new(dag(vec![
        group("a", "0-3", &[]),
        group("b", "0-3", &[("a", Corresponding)]),
        group("c", "0-3", &[("b", Corresponding)]),
    ]));
    let out = |s: &str, i: Option<u64>| {
        if s == "a" && i == Some(0) {
            Outcome::Failed { exit: 1 }
        } else {
            Outcome::Succeeded
        }
    };
    let run = fifo(&mut e, &out);
    let c = names(run.cancelled.iter().cloned());
    assert!(c.contains("b[0]") && c.contains("c[0]"));
    assert_eq!(run.ran.len(), 4 + 3 + 3);
}

#[test]
fn mutex_one_at_a_time() {
    let mut e = Engine::new(dag(vec![
        step("a", &[("gpu-lock", Mutex)]),
        step("b", &[("gpu-lock", Mutex)]),
        step("c", &[("gpu-lock", Mutex)]),
        step("free", &[]),
    ]));
    let acts = e.start();
    assert_eq!(
        acts,
        vec![
            Action::Release {
                step: "a".into(),
                index: None
            },
            Action::Release {
                step: "free".into(),
                index: None
            },
        ]
    );
    assert_eq!(e.state("b"), Some(&StepState::Queued));
    let acts = e
        .on_terminal("a", Outcome::Failed { exit: 2 }, None)
        .expect("a");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "b".into(),
            index: None
        }]
    );
    let acts = e.on_terminal("b", Outcome::Succeeded, None).expect("b");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "c".into(),
            index: None
        }]
    );
    let acts = e.on_terminal("c", Outcome::Succeeded, None).expect("c");
    assert!(acts.is_empty());
}

#[test]
fn mutex_by_step_name() {
    // eval must not overlap `train` (the mutex is named after the step).
    let mut e = Engine::new(dag(vec![
        step("train", &[]),
        step("eval", &[("train", Mutex)]),
    ]));
    let acts = e.start();
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "train".into(),
            index: None
        }]
    );
    let acts = e.on_terminal("train", Outcome::Succeeded, None).expect("t");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "eval".into(),
            index: None
        }]
    );
}

#[test]
fn requeue_keeps_successors_blocked() {
    let mut e = Engine::new(dag(vec![step("a", &[]), step("b", &[("a", Success)])]));
    e.start();
    e.on_started("a", None).expect("start");
    e.on_requeued("a", None).expect("requeue");
    assert_eq!(e.state("a"), Some(&StepState::Pending));
    assert_eq!(e.state("b"), Some(&StepState::Waiting));
    assert_eq!(e.phase(), DagPhase::Running);
    e.on_started("a", None).expect("restart");
    let acts = e.on_terminal("a", Outcome::Succeeded, None).expect("done");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "b".into(),
            index: None
        }]
    );
}

#[test]
fn cancel_mid_run() {
    let mut e = Engine::new(dag(vec![
        step("a", &[]),
        step("b", &[("a", Success)]),
        step("cleanup", &[("a", Any)]),
    ]));
    e.start();
    e.on_started("a", None).expect("start");
    let acts = e.cancel_step("a").expect("cancel");
    assert_eq!(
        acts,
        vec![Action::Cancel {
            step: "a".into(),
            index: None,
            reason: CancelReason::UserRequested
        }]
    );
    assert_eq!(
        e.state("a"),
        Some(&StepState::Running),
        "finishes when the kill is reported"
    );
    let acts = e.on_terminal("a", Outcome::Cancelled, None).expect("done");
    assert!(acts.contains(&Action::Release {
        step: "cleanup".into(),
        index: None
    }));
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Cancel { step, .. } if step == "b")));
}

#[test]
fn cancel_dag_releases_nothing_more() {
    let mut e = Engine::new(dag(vec![
        step("a", &[]),
        step("b", &[("a", Success)]),
        step("cleanup", &[("a", Any)]),
    ]));
    e.start();
    let acts = e.cancel_dag();
    assert_eq!(acts.len(), 3);
    let acts = e.on_terminal("a", Outcome::Cancelled, None).expect("done");
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(e.phase(), DagPhase::Cancelled);
    assert_eq!(e.status().counts.cancelled, 3);
}

#[test]
fn duplicate_and_invalid_events() {
    let mut e = Engine::new(dag(vec![
        step("a", &[]),
        step("b", &[("a", Success)]),
        group("g", "0-1", &[]),
    ]));
    e.start();
    assert!(
        e.on_terminal("b", Outcome::Succeeded, None).is_err(),
        "b was never released"
    );
    assert!(e.on_terminal("zzz", Outcome::Succeeded, None).is_err());
    assert!(
        e.on_terminal("g", Outcome::Succeeded, None).is_err(),
        "index required"
    );
    assert!(
        e.on_terminal("a", Outcome::Succeeded, Some(1)).is_err(),
        "no index on plain steps"
    );
    assert!(
        e.on_terminal("g", Outcome::Succeeded, Some(9)).is_err(),
        "unknown element"
    );
    let first = e.on_terminal("a", Outcome::Succeeded, None).expect("a");
    assert_eq!(first.len(), 1);
    let dup = e
        .on_terminal("a", Outcome::Failed { exit: 1 }, None)
        .expect("dup");
    assert!(dup.is_empty());
    assert_eq!(e.state("a"), Some(&StepState::Succeeded));
    assert!(e.start().is_empty(), "start is idempotent");
}

#[test]
fn task_group_concurrency_limit() {
    let mut s = group("sweep", "0-9", &[]);
    s.task_group = Some(TaskGroupDef {
        range: "0-9%3".into(),
        concurrency: None,
    });
    let d = dag(vec![s, step("merge", &[("sweep", Success)])]);
    let mut e = Engine::new(d.clone());
    assert_eq!(e.start().len(), 3);
    let mut e = Engine::new(d);
    let mut max_in_flight = 0;
    let run = drive(
        &mut e,
        &ok_except(&[]),
        &mut |n| n - 1,
        false,
        &mut |eng, _| {
            if let Some(g) = eng.group_status("sweep") {
                max_in_flight = max_in_flight.max(g.pending + g.running);
            }
        },
    );
    assert!(max_in_flight <= 3);
    assert_eq!(run.ran.len(), 11);
    assert_eq!(e.phase(), DagPhase::Completed);
}

#[test]
fn group_step_level_edges_wait_for_all_elements() {
    let mut e = Engine::new(dag(vec![
        group("g", "0-2", &[]),
        step("after", &[("g", Success)]),
    ]));
    e.start();
    for i in 0..2 {
        let acts = e.on_terminal("g", Outcome::Succeeded, Some(i)).expect("el");
        assert!(acts.is_empty());
    }
    let acts = e.on_terminal("g", Outcome::Succeeded, Some(2)).expect("el");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "after".into(),
            index: None
        }]
    );
}

#[test]
fn status_counts_running() {
    let mut e = Engine::new(dag(seed_error_paths()));
    e.start();
    e.on_started("train", None).expect("start");
    let st = e.status();
    assert_eq!(st.phase, DagPhase::Running);
    assert_eq!(
        (st.counts.running, st.counts.waiting, st.counts.total),
        (1, 3, 4)
    );
    let json = serde_json::to_value(&st).expect("json");
    assert_eq!(json["steps"][0]["state"]["state"], "running");
}

#[allow(dead_code)]
fn _cond(_: Condition) {}

#[test]
fn group_mutex_does_not_deadlock_with_corresponding() {
    // `t` (corresponding on `p`) and `p` share a mutex. `t` must not hold the
    // mutex while it only waits for `p`'s elements (regression: deadlock).
    let mut e = Engine::new(dag(vec![
        step("root", &[]),
        group("p", "0-1", &[("root", Any), ("m", Mutex)]),
        group("t", "0-1", &[("p", Corresponding), ("m", Mutex)]),
    ]));
    let run = fifo(&mut e, &ok_except(&[]));
    assert_eq!(run.ran.len(), 5);
    assert_eq!(e.phase(), DagPhase::Completed);
}

#[test]
fn group_mutex_excludes_plain_holder() {
    let mut e = Engine::new(dag(vec![
        group("g", "0-2%1", &[("m", Mutex)]),
        step("s", &[("m", Mutex)]),
    ]));
    let acts = e.start();
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "g".into(),
            index: Some(0)
        }]
    );
    let acts = e.on_terminal("g", Outcome::Succeeded, Some(0)).expect("g0");
    // The group keeps the mutex while it has elements in flight.
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "g".into(),
            index: Some(1)
        }]
    );
    e.on_terminal("g", Outcome::Succeeded, Some(1)).expect("g1");
    let acts = e.on_terminal("g", Outcome::Succeeded, Some(2)).expect("g2");
    assert_eq!(
        acts,
        vec![Action::Release {
            step: "s".into(),
            index: None
        }]
    );
}
