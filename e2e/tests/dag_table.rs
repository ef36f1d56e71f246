//! Issue 7's acceptance table: every DAG condition and edge case of the seed
//! ("DAG Scheduling" and the user docs' "DAG Workflows") run end to end on a real
//! `lattice-server --dev` with real `lattice-agent` processes, whose steps are real
//! `/bin/sh -c` processes that exit 0 or 1 (or sleep).
//!
//! Each [`Case`] is a Dag manifest plus the expected final state of the Dag and of every
//! step (Completed / Failed / Cancelled / Skipped, and whether its process ran, ran and was
//! sent SIGTERM, or never ran), and of every task-group element (phase, or never created).
//! Admission cases (size limit, cycle, duplicate names, dangling reference, self
//! reference) expect the exact rejection from the API server (422 and its causes) and
//! from `lattice dag submit`.
//!
//! Every step appends to `$MARKS/<allocation>.log`: `start <attempt> <time> <pid> <node>`
//! when it begins, `end <attempt> <time> <exit>` when it ends, `term <attempt> <time>` from
//! its SIGTERM trap. Ordering checks (a successor starts only after its predecessors ended,
//! mutex holders never overlap, ...) use those timestamps.
//!
//! Three clusters, each started once per test binary run: [`dag_table`] runs the ordinary
//! cases concurrently on one; [`dag_table_node_failure`] runs the cases that kill an agent
//! (requeue during a DAG, of a task-group element, node failure with `requeue: never`) one
//! after the other on another, with short heartbeat timeouts; [`dag_table_server_restart`]
//! crashes and restarts the server mid-DAG. A failure names the case and the step (or
//! element) that differed. The whole file takes about 20 s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lattice_e2e::{bin, pid_alive, Cluster};
use serde_json::{json, Value};

const NS: &str = "default";
const API: &str = "/apis/lattice.dev/v1alpha1";

// ------------------------------------------------------------------------------------
// The table
// ------------------------------------------------------------------------------------

/// Whether a step's process ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    /// Never started.
    No,
    /// Started and ended by itself.
    Yes,
    /// Started and got SIGTERM (its trap wrote `term`), and is gone.
    Terminated,
    /// Started and never ended by itself (SIGTERM or not: a process on a failed node).
    Killed,
}

impl Ran {
    /// What the markers of one allocation say (its last attempt decides).
    fn of(m: Option<&Marks>) -> Ran {
        match m.and_then(|m| m.attempts.last()) {
            None => Ran::No,
            Some(a) if a.end.is_some() => Ran::Yes,
            Some(a) if a.term.is_some() => Ran::Terminated,
            Some(_) => Ran::Killed,
        }
    }

    /// Whether `self`, observed, satisfies `want`.
    fn satisfies(self, want: Ran) -> bool {
        self == want || (want == Ran::Killed && self == Ran::Terminated)
    }
}

/// Expected final state of one step.
struct StepWant {
    step: &'static str,
    /// The Dag's `status.tasks[step].phase`.
    phase: &'static str,
    /// The allocation's `status.exitCode`, when it matters.
    exit: Option<i32>,
    ran: Ran,
}

fn want(step: &'static str, phase: &'static str, exit: Option<i32>, ran: Ran) -> StepWant {
    StepWant {
        step,
        phase,
        exit,
        ran,
    }
}

fn completed(step: &'static str) -> StepWant {
    want(step, "Completed", Some(0), Ran::Yes)
}

fn failed(step: &'static str) -> StepWant {
    want(step, "Failed", Some(1), Ran::Yes)
}

fn cancelled_unrun(step: &'static str) -> StepWant {
    want(step, "Cancelled", None, Ran::No)
}

/// Expected final state of one task-group element (`<dag>-<step>-<index>`).
struct ElemWant {
    step: &'static str,
    index: u64,
    /// Allocation phase; `None`: the element was never created (and never ran).
    phase: Option<&'static str>,
}

fn elems(step: &'static str, phases: &[Option<&'static str>]) -> Vec<ElemWant> {
    phases
        .iter()
        .enumerate()
        .map(|(i, p)| ElemWant {
            step,
            index: i as u64,
            phase: *p,
        })
        .collect()
}

/// What the driver does while the Dag runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum During {
    Nothing,
    /// Cancel the Dag (`via` the CLI or the Intent API) once the allocations
    /// `<dag>-<running>` run (their processes started) and the steps `completed` completed.
    Cancel {
        via: Via,
        running: &'static [&'static str],
        completed: &'static [&'static str],
    },
    /// SIGKILL the agent running the allocation `<dag>-<target>` (requeue policy from
    /// the manifest). With `requeue`, check it is requeued onto another node and the
    /// allocations `<dag>-<blocked>` stay blocked (not created, or held and Pending; no
    /// process started) until it completed; without, check it fails (`node_failure`).
    KillAgent {
        requeue: bool,
        target: &'static str,
        blocked: &'static [&'static str],
    },
    /// SIGKILL `lattice-server` while the allocation `<dag>-<running>` runs, and start
    /// it again on the same store: the DAG controller rebuilds its state from the store.
    RestartServer {
        running: &'static str,
    },
}

/// How a case cancels its Dag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `lattice dag cancel <dag>`.
    Cli,
    /// `DELETE /v1/dags/<dag>` (the Intent API).
    Delete,
}

/// Extra check over the step markers; returns the mismatches.
type Extra = fn(&Outcome) -> Vec<String>;

enum Expect {
    Run {
        dag: &'static str,
        steps: Vec<StepWant>,
        elements: Vec<ElemWant>,
        extra: Option<Extra>,
    },
    Reject {
        /// `(field, message)` of every cause of the API server's 422.
        causes: Vec<(&'static str, String)>,
        /// What `lattice dag submit` prints on stderr (`{file}`: the manifest's file name,
        /// `{dag}`: the Dag's name).
        cli: Stderr,
    },
}

/// Expected stderr of a rejected `lattice dag submit`.
enum Stderr {
    /// Exactly this.
    Exact(String),
}

struct Case {
    name: &'static str,
    steps: Vec<Value>,
    during: During,
    expect: Expect,
}

/// The step process: records start/end/SIGTERM in `$MARKS/<allocation>.log`, runs `body`
/// (which sets `rc`, and runs long commands as `cmd & wait $!` so the trap fires at once)
/// and exits with `rc`.
fn script(body: &str) -> String {
    format!(
        r#"m="$MARKS/$LATTICE_ALLOC_ID.log"; a="$LATTICE_ATTEMPT"
echo "start $a $(date +%s.%N) $$ $LATTICE_NODEID" >> "$m"
trap 'echo "term $a $(date +%s.%N)" >> "$m"; kill $! 2>/dev/null; exit 143' TERM
rc=0
{body}
echo "end $a $(date +%s.%N) $rc" >> "$m"
exit $rc"#
    )
}

/// Exit with `code` at once.
fn exits(code: i32) -> String {
    format!("rc={code}")
}

/// Sleep `secs`, then exit with `code`.
fn sleeps(secs: f64, code: i32) -> String {
    format!("sleep {secs} & wait $!; rc={code}")
}

/// Exit 1 for the task-group elements in `failing`, 0 for the others.
fn fails_at(failing: &[u64]) -> String {
    let list: Vec<String> = failing.iter().map(u64::to_string).collect();
    format!(
        r#"case " {} " in *" $LATTICE_TASK_INDEX "*) rc=1;; esac"#,
        list.join(" ")
    )
}

/// A step: `name`, its edges `(ref, condition)`, and the shell `body` of its process.
fn step(name: &str, deps: &[(&str, &str)], body: &str) -> Value {
    json!({
        "name": name,
        "dependsOn": deps.iter().map(|(r, c)| json!({"ref": r, "condition": c})).collect::<Vec<_>>(),
        "spec": {
            "entrypoint": "/bin/sh",
            "args": ["-c", script(body)],
            "lifecycle": {"walltime": "10m"},
        },
    })
}

/// `step` as a task group over `range`.
fn group(name: &str, range: &str, deps: &[(&str, &str)], body: &str) -> Value {
    let mut s = step(name, deps, body);
    s["spec"]["taskGroup"] = json!({"range": range});
    s
}

/// `step` with `spec.requeue.policy`.
fn requeue(mut s: Value, policy: &str) -> Value {
    s["spec"]["requeue"] = json!({"policy": policy});
    s
}

const SIZE_HINT: &str =
    "Split the workflow into smaller DAGs or increase the limit via system configuration.";

fn cases() -> Vec<Case> {
    use During::*;
    let run = |dag: &'static str, steps: Vec<StepWant>| Expect::Run {
        dag,
        steps,
        elements: Vec::new(),
        extra: None,
    };
    vec![
        // `success` (afterok): a diamond, every successor after all its predecessors.
        Case {
            name: "success",
            steps: vec![
                step("a", &[], &exits(0)),
                step("b", &[("a", "success")], &exits(0)),
                step("c", &[("a", "success")], &sleeps(0.5, 0)),
                step("d", &[("b", "success"), ("c", "success")], &exits(0)),
            ],
            during: Nothing,
            expect: run(
                "Completed",
                vec![
                    completed("a"),
                    completed("b"),
                    completed("c"),
                    completed("d"),
                ],
            ),
        },
        // `failure` (afternotok): the seed's error-handling path. evaluate fails, so
        // notify-failure runs and deploy (success on evaluate) is cancelled; the failure
        // is caught by notify-failure's edge, so the Dag is Completed.
        Case {
            name: "failure-runs-handler",
            steps: vec![
                step("train", &[], &exits(0)),
                step("evaluate", &[("train", "success")], &exits(1)),
                step("deploy", &[("evaluate", "success")], &exits(0)),
                step(
                    "notify-failure",
                    &[("train", "failure"), ("evaluate", "failure")],
                    &exits(0),
                ),
            ],
            during: Nothing,
            expect: run(
                "Completed",
                vec![
                    completed("train"),
                    failed("evaluate"),
                    cancelled_unrun("deploy"),
                    completed("notify-failure"),
                ],
            ),
        },
        // The same paths when train fails: evaluate and deploy can never run (cancelled,
        // never started) and notify-failure runs on train's failure edge; caught, so the
        // Dag is Completed.
        Case {
            name: "failure-train-fails",
            steps: vec![
                step("train", &[], &exits(1)),
                step("evaluate", &[("train", "success")], &exits(0)),
                step("deploy", &[("evaluate", "success")], &exits(0)),
                step(
                    "notify-failure",
                    &[("train", "failure"), ("evaluate", "failure")],
                    &exits(0),
                ),
            ],
            during: Nothing,
            expect: run(
                "Completed",
                vec![
                    failed("train"),
                    cancelled_unrun("evaluate"),
                    cancelled_unrun("deploy"),
                    completed("notify-failure"),
                ],
            ),
        },
        // `failure` whose predecessor succeeds: the handler is skipped, never runs.
        Case {
            name: "failure-not-met-skips",
            steps: vec![
                step("train", &[], &exits(0)),
                step("deploy", &[("train", "success")], &exits(0)),
                step("notify-failure", &[("train", "failure")], &exits(0)),
            ],
            during: Nothing,
            expect: run(
                "Completed",
                vec![
                    completed("train"),
                    completed("deploy"),
                    want("notify-failure", "Skipped", None, Ran::No),
                ],
            ),
        },
        // `any` (afterany): cleanup runs after a failing and after a succeeding step.
        Case {
            name: "any",
            steps: vec![
                step("exp-fail", &[], &exits(1)),
                step("cleanup-fail", &[("exp-fail", "any")], &exits(0)),
                step("exp-ok", &[], &exits(0)),
                step("cleanup-ok", &[("exp-ok", "any")], &exits(0)),
            ],
            during: Nothing,
            expect: run(
                "Completed",
                vec![
                    failed("exp-fail"),
                    completed("cleanup-fail"),
                    completed("exp-ok"),
                    completed("cleanup-ok"),
                ],
            ),
        },
        // Cascading cancellation: a fails; b, c, d (a chain of `success`) are cancelled
        // without running; e (`any` on the cancelled c) still runs; f (`failure` on the
        // cancelled c) is cancelled too (reason DependencyCancelled: c never got to fail).
        // a's failure is uncaught: the Dag is Failed.
        Case {
            name: "cascading-cancel",
            steps: vec![
                step("a", &[], &exits(1)),
                step("b", &[("a", "success")], &exits(0)),
                step("c", &[("b", "success")], &exits(0)),
                step("d", &[("c", "success")], &exits(0)),
                step("e", &[("c", "any")], &exits(0)),
                step("f", &[("c", "failure")], &exits(0)),
            ],
            during: Nothing,
            expect: run(
                "Failed",
                vec![
                    failed("a"),
                    cancelled_unrun("b"),
                    cancelled_unrun("c"),
                    cancelled_unrun("d"),
                    completed("e"),
                    cancelled_unrun("f"),
                ],
            ),
        },
        // `corresponding` with mixed exit codes: pre[1] fails, so train[1] is cancelled
        // (never created); train[3] fails on its own and does not affect train[4].
        Case {
            name: "corresponding-mixed-exit-codes",
            steps: vec![
                group("pre", "0-4", &[], &fails_at(&[1])),
                group("train", "0-4", &[("pre", "corresponding")], &fails_at(&[3])),
            ],
            during: Nothing,
            expect: Expect::Run {
                dag: "Failed",
                steps: vec![
                    want("pre", "Failed", None, Ran::Yes),
                    want("train", "Failed", None, Ran::Yes),
                ],
                elements: [
                    elems(
                        "pre",
                        &[
                            Some("Completed"),
                            Some("Failed"),
                            Some("Completed"),
                            Some("Completed"),
                            Some("Completed"),
                        ],
                    ),
                    elems(
                        "train",
                        &[
                            Some("Completed"),
                            None,
                            Some("Completed"),
                            Some("Failed"),
                            Some("Completed"),
                        ],
                    ),
                ]
                .into_iter()
                .flatten()
                .collect(),
                extra: None,
            },
        },
        // `corresponding` with mismatched sizes (pre[0..2] → train[0..4]): train[3] and
        // train[4] have no matching element and start at once, before pre ends.
        Case {
            name: "corresponding-mismatched-sizes",
            steps: vec![
                group("pre", "0-2", &[], &sleeps(6.0, 0)),
                group("train", "0-4", &[("pre", "corresponding")], &exits(0)),
            ],
            during: Nothing,
            expect: Expect::Run {
                dag: "Completed",
                steps: vec![
                    want("pre", "Completed", None, Ran::Yes),
                    want("train", "Completed", None, Ran::Yes),
                ],
                elements: [
                    elems("pre", &[Some("Completed"); 3]),
                    elems("train", &[Some("Completed"); 5]),
                ]
                .into_iter()
                .flatten()
                .collect(),
                extra: Some(unmatched_elements_start_at_once),
            },
        },
        // `mutex` (singleton): holders of one lock never overlap, though nodes are free
        // for all of them; m2 fails, which releases the lock like success does.
        Case {
            name: "mutex",
            steps: vec![
                step("m1", &[("gpu-lock", "mutex")], &sleeps(1.0, 0)),
                step("m2", &[("gpu-lock", "mutex")], &sleeps(1.0, 1)),
                step("m3", &[("gpu-lock", "mutex")], &sleeps(1.0, 0)),
                step(
                    "after",
                    &[("m1", "any"), ("m2", "any"), ("m3", "any")],
                    &exits(0),
                ),
            ],
            during: Nothing,
            expect: Expect::Run {
                dag: "Completed",
                steps: vec![
                    completed("m1"),
                    failed("m2"),
                    completed("m3"),
                    completed("after"),
                ],
                elements: Vec::new(),
                extra: Some(gpu_lock_holders_never_overlap),
            },
        },
        // The same lock from another Dag, run at the same time: the lock is the tenant's,
        // so these never overlap with the holders above either. The step named like the
        // lock holds it too (Slurm singleton: the job name is the lock).
        Case {
            name: "mutex-other-dag",
            steps: vec![
                step("n1", &[("gpu-lock", "mutex")], &sleeps(1.0, 0)),
                step("gpu-lock", &[], &sleeps(1.0, 0)),
                step("n2", &[("gpu-lock", "mutex")], &sleeps(1.0, 0)),
            ],
            during: Nothing,
            expect: Expect::Run {
                dag: "Completed",
                steps: vec![completed("n1"), completed("gpu-lock"), completed("n2")],
                elements: Vec::new(),
                extra: Some(gpu_lock_holders_never_overlap),
            },
        },
        // Cancel mid-run with `lattice dag cancel`: the running step gets SIGTERM, the
        // waiting one is cancelled without running, the finished one stays Completed.
        Case {
            name: "cancel-mid-run-cli",
            steps: cancel_steps(),
            during: Cancel {
                via: Via::Cli,
                running: &["sleeper"],
                completed: &["quick"],
            },
            expect: cancel_expect(),
        },
        // The same through the Intent API: DELETE /v1/dags/{id}.
        Case {
            name: "cancel-mid-run-delete",
            steps: cancel_steps(),
            during: Cancel {
                via: Via::Delete,
                running: &["sleeper"],
                completed: &["quick"],
            },
            expect: cancel_expect(),
        },
        // Cancel while a task group runs two elements at a time (concurrency 2): both
        // running elements get SIGTERM, the four not yet released are never created.
        Case {
            name: "cancel-mid-run-task-group",
            steps: vec![{
                let mut g = group("work", "0-5", &[], &sleeps(300.0, 0));
                g["spec"]["taskGroup"]["concurrency"] = json!(2);
                g
            }],
            during: Cancel {
                via: Via::Cli,
                running: &["work-0", "work-1"],
                completed: &[],
            },
            expect: Expect::Run {
                dag: "Cancelled",
                steps: vec![want("work", "Cancelled", None, Ran::Terminated)],
                elements: elems(
                    "work",
                    &[
                        Some("Cancelled"),
                        Some("Cancelled"),
                        None,
                        None,
                        None,
                        None,
                    ],
                ),
                extra: None,
            },
        },
        // Requeue during a DAG: the agent running `a` dies; `a` (default policy
        // on_node_failure) is requeued to another node; `b` and `c` stay blocked until the
        // requeued `a` completes.
        Case {
            name: "requeue-during-dag",
            steps: vec![
                step(
                    "a",
                    &[],
                    r#"if [ "$LATTICE_ATTEMPT" = 1 ]; then sleep 120 & wait $!; rc=1; else sleep 1 & wait $!; rc=0; fi"#,
                ),
                step("b", &[("a", "success")], &exits(0)),
                step("c", &[("a", "any")], &exits(0)),
            ],
            during: KillAgent {
                requeue: true,
                target: "a",
                blocked: &["b", "c"],
            },
            expect: run(
                "Completed",
                vec![completed("a"), completed("b"), completed("c")],
            ),
        },
        // Requeue of one task-group element: pre[0]'s node dies, pre[0] is requeued;
        // train[0] (corresponding) waits for it, train[1] does not.
        Case {
            name: "requeue-task-group-element",
            steps: vec![
                group(
                    "pre",
                    "0-1",
                    &[],
                    r#"if [ "$LATTICE_TASK_INDEX$LATTICE_ATTEMPT" = 01 ]; then sleep 120 & wait $!; rc=1; else sleep 1 & wait $!; rc=0; fi"#,
                ),
                group("train", "0-1", &[("pre", "corresponding")], &exits(0)),
            ],
            during: KillAgent {
                requeue: true,
                target: "pre-0",
                blocked: &["train-0"],
            },
            expect: Expect::Run {
                dag: "Completed",
                steps: vec![
                    want("pre", "Completed", None, Ran::Yes),
                    want("train", "Completed", None, Ran::Yes),
                ],
                elements: [
                    elems("pre", &[Some("Completed"); 2]),
                    elems("train", &[Some("Completed"); 2]),
                ]
                .into_iter()
                .flatten()
                .collect(),
                extra: Some(train_1_did_not_wait_for_pre_0),
            },
        },
        // Node failure during a DAG with `requeue: never`: `a` fails (node_failure); its
        // `success` successor is cancelled, `failure` and `any` successors run; the
        // failure is caught, so the Dag is Completed.
        Case {
            name: "node-failure-during-dag",
            steps: vec![
                requeue(step("a", &[], &sleeps(120.0, 0)), "never"),
                step("b", &[("a", "success")], &exits(0)),
                step("c", &[("a", "failure")], &exits(0)),
                step("d", &[("a", "any")], &exits(0)),
            ],
            during: KillAgent {
                requeue: false,
                target: "a",
                blocked: &[],
            },
            expect: run(
                "Completed",
                vec![
                    // Killed with its node: its process never ended by itself.
                    want("a", "Failed", None, Ran::Killed),
                    cancelled_unrun("b"),
                    completed("c"),
                    completed("d"),
                ],
            ),
        },
        // Not in the seed's list, but what the controller promises ("restartable from the
        // store alone"): the server crashes while b runs and comes back; every step runs
        // exactly once and the Dag ends as if nothing happened.
        Case {
            name: "server-restart-during-dag",
            steps: vec![
                step("a", &[], &exits(0)),
                step("b", &[("a", "success")], &sleeps(4.0, 0)),
                step("c", &[("b", "success")], &exits(0)),
                step("d", &[("b", "failure")], &exits(0)),
                step("e", &[("c", "any")], &exits(1)),
            ],
            during: RestartServer { running: "b" },
            expect: run(
                "Failed",
                vec![
                    completed("a"),
                    completed("b"),
                    completed("c"),
                    want("d", "Skipped", None, Ran::No),
                    failed("e"),
                ],
            ),
        },
        // Admission: more than 1000 steps (the default --max-dag-size).
        Case {
            name: "size-limit",
            steps: (0..1001)
                .map(|i| {
                    let deps: Vec<Value> = if i == 0 {
                        vec![]
                    } else {
                        vec![json!({"ref": format!("s{}", i - 1), "condition": "success"})]
                    };
                    json!({"name": format!("s{i}"), "dependsOn": deps,
                           "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "10m"}}})
                })
                .collect(),
            during: Nothing,
            expect: Expect::Reject {
                causes: vec![(
                    "spec.allocations",
                    format!(
                        "DAG exceeds maximum size (1001 allocations, limit: 1000). Hint: {SIZE_HINT}"
                    ),
                )],
                // The server's rejection, with the seed's message and hint (the client
                // cannot know the server's limit, so it does not check it).
                // The seed's two lines, once.
                cli: Stderr::Exact(format!(
                    "Error: DAG exceeds maximum size (1001 allocations, limit: 1000)\n  \
                     Hint: {SIZE_HINT} (an administrator: `lattice admin config set scheduling.max_dag_size=N`)\n"
                )),
            },
        },
        // Admission: a cycle, with the path in the message, named along the flow (a feeds
        // b feeds c feeds a) by the API server and by `lattice dag submit` (which
        // validates before sending).
        Case {
            name: "cycle",
            steps: vec![
                step("a", &[("c", "success")], &exits(0)),
                step("b", &[("a", "success")], &exits(0)),
                step("c", &[("b", "any")], &exits(0)),
            ],
            during: Nothing,
            expect: Expect::Reject {
                causes: vec![(
                    "spec.allocations",
                    "dependencies form a cycle: a → b → c → a; remove one of these edges".into(),
                )],
                cli: Stderr::Exact(
                    "Error: DAG \"{dag}\" rejected — dependency cycle: a → b → c → a\n  \
                     Hint: Remove one of the edges on the cycle; a DAG must not loop.\n"
                        .into(),
                ),
            },
        },
        // Admission: two steps with one name.
        Case {
            name: "duplicate-names",
            steps: vec![
                step("a", &[], &exits(0)),
                step("b", &[("a", "success")], &exits(0)),
                step("a", &[], &exits(0)),
            ],
            during: Nothing,
            expect: Expect::Reject {
                causes: vec![(
                    "spec.allocations[2].name",
                    "\"a\" is already used by spec.allocations[0]; task names must be unique"
                        .into(),
                )],
                cli: Stderr::Exact(
                    "Error: DAG \"{dag}\" rejected — duplicate allocation name \"a\" \
                     (allocations #0 and #2)\n  \
                     Hint: Allocation names must be unique within a DAG; rename one of them.\n"
                        .into(),
                ),
            },
        },
        // Admission: dependencies on steps that are not in the DAG (a typo, with a
        // suggestion, and a name like no step).
        Case {
            name: "dangling-ref",
            steps: vec![
                step("train", &[], &exits(0)),
                step("eval", &[("traim", "success")], &exits(0)),
                step("report", &[("eval", "any"), ("nowhere", "any")], &exits(0)),
            ],
            during: Nothing,
            expect: Expect::Reject {
                causes: vec![
                    (
                        "spec.allocations[1].dependsOn[0].ref",
                        "\"traim\" is not a task of this DAG; use one of: eval, report, train"
                            .into(),
                    ),
                    (
                        "spec.allocations[2].dependsOn[1].ref",
                        "\"nowhere\" is not a task of this DAG; use one of: eval, report, train"
                            .into(),
                    ),
                ],
                cli: Stderr::Exact(
                    "Error: DAG \"{dag}\" rejected — allocation \"eval\" depends on \"traim\", \
                     which is not in this DAG\n  \
                     also: allocation \"report\" depends on \"nowhere\", which is not in this DAG\n  \
                     Hint: Did you mean \"train\"? Dependencies must name allocations of the \
                     same DAG.\n"
                        .into(),
                ),
            },
        },
        // Admission: a step depending on itself (the shortest cycle).
        Case {
            name: "self-reference",
            steps: vec![step("a", &[("a", "success")], &exits(0))],
            during: Nothing,
            expect: Expect::Reject {
                // Reported once, as a self-dependency (not again as the cycle a → a).
                causes: vec![(
                    "spec.allocations[0].dependsOn[0].ref",
                    "a task cannot depend on itself; remove this entry".into(),
                )],
                cli: Stderr::Exact(
                    "Error: DAG \"{dag}\" rejected — allocation \"a\" depends on itself\n  \
                     Hint: Remove the dependency on itself.\n"
                        .into(),
                ),
            },
        },
    ]
}

fn cancel_steps() -> Vec<Value> {
    vec![
        step("sleeper", &[], &sleeps(300.0, 0)),
        step("after-sleeper", &[("sleeper", "success")], &exits(0)),
        step("quick", &[], &exits(0)),
    ]
}

fn cancel_expect() -> Expect {
    Expect::Run {
        dag: "Cancelled",
        steps: vec![
            want("sleeper", "Cancelled", None, Ran::Terminated),
            cancelled_unrun("after-sleeper"),
            completed("quick"),
        ],
        elements: Vec::new(),
        extra: None,
    }
}

/// corresponding-mismatched-sizes: train[3] and train[4] (no pre[3], pre[4]) started
/// before any pre element ended.
fn unmatched_elements_start_at_once(o: &Outcome) -> Vec<String> {
    let first_pre_end = (0..3)
        .filter_map(|i| o.marks(&format!("pre-{i}")).and_then(|m| m.finished_at()))
        .fold(f64::INFINITY, f64::min);
    let mut bad = Vec::new();
    for i in [3, 4] {
        match o.marks(&format!("train-{i}")).and_then(|m| m.first_start()) {
            Some(t) if t < first_pre_end => {}
            Some(t) => bad.push(format!(
                "element train[{i}] started {:.2}s after the first pre element ended; \
                 unmatched elements must start at once",
                t - first_pre_end
            )),
            None => bad.push(format!("element train[{i}] never started")),
        }
    }
    bad
}

/// requeue-task-group-element: train[1] started before the requeued pre[0] ended.
fn train_1_did_not_wait_for_pre_0(o: &Outcome) -> Vec<String> {
    let pre0 = o.marks("pre-0").and_then(|m| m.ended_at());
    let train1 = o.marks("train-1").and_then(|m| m.first_start());
    match (pre0, train1) {
        (Some(p), Some(t)) if t < p => Vec::new(),
        _ => vec![format!(
            "element train[1] should start before the requeued pre[0] ends: \
             train[1] started at {train1:?}, pre[0] ended at {pre0:?}"
        )],
    }
}

/// mutex, mutex-other-dag: the run windows of every holder of `gpu-lock`, in both Dags,
/// are pairwise disjoint (a holder still running counts as running until now).
fn gpu_lock_holders_never_overlap(o: &Outcome) -> Vec<String> {
    let holders = [
        "mutex-m1",
        "mutex-m2",
        "mutex-m3",
        "mutex-other-dag-n1",
        "mutex-other-dag-gpu-lock",
        "mutex-other-dag-n2",
    ];
    let windows: Vec<(&str, f64, f64)> = holders
        .iter()
        .filter_map(|h| {
            let m = Marks::read(&o.marks_dir.join(format!("{h}.log")))?;
            Some((
                *h,
                m.first_start()?,
                m.finished_at().unwrap_or(f64::INFINITY),
            ))
        })
        .collect();
    let mut bad = Vec::new();
    for (i, (a, a0, a1)) in windows.iter().enumerate() {
        for (b, b0, b1) in &windows[i + 1..] {
            if a0 < b1 && b0 < a1 {
                bad.push(format!(
                    "holders of gpu-lock {a} [{a0:.2}, {a1:.2}] and {b} [{b0:.2}, {b1:.2}] ran at the same time"
                ));
            }
        }
    }
    bad
}

// ------------------------------------------------------------------------------------
// Markers
// ------------------------------------------------------------------------------------

/// One attempt of a step process, from its marker file.
#[derive(Debug, Default, Clone)]
struct Attempt {
    attempt: u32,
    start: f64,
    pid: i32,
    node: String,
    end: Option<(f64, i32)>,
    term: Option<f64>,
}

/// Everything one allocation's processes recorded.
#[derive(Debug, Default, Clone)]
struct Marks {
    attempts: Vec<Attempt>,
}

impl Marks {
    fn read(path: &Path) -> Option<Marks> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut m = Marks::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
            let attempt: u32 = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            match f.first().copied() {
                Some("start") => m.attempts.push(Attempt {
                    attempt,
                    start: num(2).unwrap_or(0.0),
                    pid: f.get(3).and_then(|v| v.parse().ok()).unwrap_or(0),
                    node: f.get(4).unwrap_or(&"").to_string(),
                    ..Default::default()
                }),
                Some(kind @ ("end" | "term")) => {
                    if let Some(a) = m.attempts.iter_mut().rev().find(|a| a.attempt == attempt) {
                        let t = num(2).unwrap_or(0.0);
                        if kind == "end" {
                            a.end = Some((t, num(3).unwrap_or(-1.0) as i32));
                        } else {
                            a.term = Some(t);
                        }
                    }
                }
                _ => {}
            }
        }
        Some(m)
    }

    fn first_start(&self) -> Option<f64> {
        self.attempts.first().map(|a| a.start)
    }

    /// When the last attempt ended (by itself or on SIGTERM).
    fn finished_at(&self) -> Option<f64> {
        let a = self.attempts.last()?;
        a.end.map(|e| e.0).or(a.term)
    }

    /// When the last attempt ended by itself (not when a killed run was stopped: a step
    /// failed with its node is over for the Dag before its process is gone).
    fn ended_at(&self) -> Option<f64> {
        self.attempts.last()?.end.map(|e| e.0)
    }
}

// ------------------------------------------------------------------------------------
// Driving a case
// ------------------------------------------------------------------------------------

/// What the tests talk to: the API (as JSON) and the `lattice` binary.
#[derive(Clone)]
struct Ctx {
    http: reqwest::Client,
    url: String,
    token: String,
    /// Marker files, one per allocation.
    marks: PathBuf,
    /// HOME and working directory of `lattice` runs.
    work: PathBuf,
}

impl Ctx {
    fn new(c: &Cluster, dir: &Path) -> Ctx {
        let marks = dir.join("marks");
        let work = dir.join("work");
        std::fs::create_dir_all(&marks).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        Ctx {
            http: reqwest::Client::new(),
            url: c.url(),
            token: c.token().trim().to_string(),
            marks,
            work,
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(30));
        if let Some(b) = body {
            req = req.json(b);
        }
        match req.send().await {
            Ok(r) => {
                let code = r.status().as_u16();
                (code, r.json().await.unwrap_or(Value::Null))
            }
            Err(e) => (0, json!({"error": e.to_string()})),
        }
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    async fn dag(&self, name: &str) -> Value {
        self.get(&format!("{API}/namespaces/{NS}/dags/{name}"))
            .await
            .1
    }

    /// The allocation, or `None` when it does not exist (404).
    async fn alloc(&self, name: &str) -> Option<Value> {
        let (code, v) = self
            .get(&format!("{API}/namespaces/{NS}/allocations/{name}"))
            .await;
        (code != 404).then_some(v)
    }

    async fn nodes_ready(&self) -> usize {
        let (_, v) = self.get(&format!("{API}/nodes")).await;
        v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|n| n["status"]["state"] == "Ready")
                    .count()
            })
            .unwrap_or(0)
    }

    async fn wait_nodes_ready(&self, n: usize, c: &Cluster) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.nodes_ready().await < n {
            assert!(
                Instant::now() < deadline,
                "{n} nodes not Ready in time\n{}",
                tail(&c.logs())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `lattice ARGS` as a user runs it against this cluster: (exit code, stdout, stderr).
    async fn lattice(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = tokio::process::Command::new(bin("lattice"))
            .args(args)
            .current_dir(&self.work)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.work)
            .env("USER", "tester")
            .env("LATTICE_API_URL", &self.url)
            .env("LATTICE_TOKEN", &self.token)
            .output()
            .await
            .expect("run lattice");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }
}

/// The end of a long log, for failure messages.
fn tail(s: &str) -> String {
    let n = s.chars().count();
    if n <= 12_000 {
        return s.to_string();
    }
    format!("…{}", s.chars().skip(n - 12_000).collect::<String>())
}

/// A finished run of a case: the Dag, its step allocations, the markers.
struct Outcome {
    dag_name: String,
    /// Where every allocation's markers are (other Dags' too).
    marks_dir: PathBuf,
    dag: Value,
    allocs: BTreeMap<String, Option<Value>>,
    marks: BTreeMap<String, Marks>,
}

impl Outcome {
    /// Markers of the allocation `<dag>-<suffix>`.
    fn marks(&self, suffix: &str) -> Option<&Marks> {
        self.marks.get(&format!("{}-{suffix}", self.dag_name))
    }
}

/// The Dag name of a case (unique per test run and case).
fn dag_name(case: &Case) -> String {
    case.name.to_string()
}

fn manifest(name: &str, steps: &[Value], marks: &Path) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .cloned()
        .map(|mut s| {
            s["spec"]["env"] = json!({"MARKS": marks.display().to_string()});
            s
        })
        .collect();
    json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Dag",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"allocations": steps},
    })
}

fn terminal(phase: &str) -> bool {
    matches!(phase, "Completed" | "Failed" | "Cancelled")
}

/// Runs one case; returns its mismatches, each naming the case (and step).
async fn run_case(ctx: &Ctx, case: &Case, cluster: Option<&mut Cluster>) -> Vec<String> {
    let name = dag_name(case);
    let m = manifest(&name, &case.steps, &ctx.marks);
    let mut bad: Vec<String> = match &case.expect {
        Expect::Reject { causes, cli } => check_reject(ctx, &name, &m, causes, cli).await,
        Expect::Run { .. } => run_dag(ctx, case, &name, &m, cluster).await,
    };
    for b in &mut bad {
        *b = format!("case {}: {b}", case.name);
    }
    bad
}

async fn check_reject(
    ctx: &Ctx,
    name: &str,
    m: &Value,
    causes: &[(&str, String)],
    cli: &Stderr,
) -> Vec<String> {
    let mut bad = Vec::new();
    let (code, v) = ctx
        .send(
            reqwest::Method::POST,
            &format!("{API}/namespaces/{NS}/dags"),
            Some(m),
        )
        .await;
    if code != 422 {
        bad.push(format!("API: expected 422, got {code}: {v}"));
    }
    let got: Vec<(String, String)> = v["details"]["causes"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    (
                        c["field"].as_str().unwrap_or_default().to_string(),
                        c["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let want: Vec<(String, String)> = causes
        .iter()
        .map(|(f, msg)| (f.to_string(), msg.clone()))
        .collect();
    if got != want {
        bad.push(format!(
            "API rejection causes differ:\n  expected {want:?}\n  got      {got:?}"
        ));
    }
    let summary: Vec<String> = want.iter().map(|(f, msg)| format!("{f}: {msg}")).collect();
    let msg = format!(
        "Dag.lattice.dev \"{name}\" is invalid: {}",
        summary.join(", ")
    );
    if v["message"].as_str() != Some(msg.as_str()) {
        bad.push(format!(
            "API message differs:\n  expected {msg:?}\n  got      {:?}",
            v["message"]
        ));
    }
    // `lattice dag submit` with the same manifest.
    let file = format!("{name}.json");
    std::fs::write(ctx.work.join(&file), serde_json::to_vec_pretty(m).unwrap()).unwrap();
    let (code, out, err) = ctx.lattice(&["dag", "submit", &file]).await;
    let fill = |t: &str| t.replace("{file}", &file).replace("{dag}", name);
    let (ok, want_err) = match cli {
        Stderr::Exact(t) => (err == fill(t), fill(t)),
    };
    if code != Some(1) || !out.is_empty() || !ok {
        bad.push(format!(
            "`lattice dag submit {file}`: expected exit 1, no stdout and stderr\n{want_err}\
             got exit {code:?}, stdout {out:?}, stderr\n{err}"
        ));
    }
    // Nothing was created.
    let (code, _) = ctx.get(&format!("{API}/namespaces/{NS}/dags/{name}")).await;
    if code != 404 {
        bad.push(format!("the rejected Dag exists (GET answered {code})"));
    }
    bad
}

/// A deadline for a wait: `tick` sleeps a little, or fails naming `what` once passed.
struct Deadline {
    at: Instant,
    limit: Duration,
    what: String,
}

impl Deadline {
    fn new(what: impl Into<String>, limit: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + limit,
            limit,
            what: what.into(),
        }
    }

    async fn tick(&self) -> Result<(), String> {
        if Instant::now() > self.at {
            return Err(format!(
                "timed out after {:?} waiting for {}",
                self.limit, self.what
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(())
    }
}

fn marks_of(ctx: &Ctx, alloc: &str) -> Option<Marks> {
    Marks::read(&ctx.marks.join(format!("{alloc}.log")))
}

async fn run_dag(
    ctx: &Ctx,
    case: &Case,
    name: &str,
    m: &Value,
    cluster: Option<&mut Cluster>,
) -> Vec<String> {
    let Expect::Run {
        dag: want_dag,
        steps: want_steps,
        elements: want_elems,
        extra,
    } = &case.expect
    else {
        unreachable!("run_dag runs Expect::Run cases")
    };
    let mut bad = Vec::new();
    let (code, v) = ctx
        .send(
            reqwest::Method::POST,
            &format!("{API}/namespaces/{NS}/dags"),
            Some(m),
        )
        .await;
    if code != 201 {
        return vec![format!("submit: expected 201, got {code}: {v}")];
    }
    let alloc_of = |step: &str| format!("{name}-{step}");
    match case.during {
        During::Nothing => {}
        During::Cancel {
            via,
            running,
            completed,
        } => {
            if let Err(e) = cancel_mid_run(ctx, name, via, running, completed).await {
                return vec![e];
            }
        }
        During::KillAgent {
            requeue,
            target,
            blocked,
        } => {
            let Some(c) = cluster else {
                return vec!["needs the cluster to kill an agent".into()];
            };
            if let Err(e) =
                kill_agent_mid_run(ctx, c, name, requeue, target, blocked, &mut bad).await
            {
                bad.push(e);
                return bad;
            }
        }
        During::RestartServer { running } => {
            let Some(c) = cluster else {
                return vec!["needs the cluster to restart the server".into()];
            };
            let alloc = format!("{name}-{running}");
            let wait = Deadline::new(format!("{alloc} to run"), Duration::from_secs(60));
            while marks_of(ctx, &alloc).is_none() {
                if let Err(e) = wait.tick().await {
                    return vec![e];
                }
            }
            c.restart_server();
            ctx.wait_nodes_ready(c.agents.len(), c).await;
        }
    }
    // The Dag ends.
    let wait = Deadline::new("the Dag to end", Duration::from_secs(120));
    let dag = loop {
        let d = ctx.dag(name).await;
        if terminal(d["status"]["phase"].as_str().unwrap_or_default()) {
            break d;
        }
        if let Err(e) = wait.tick().await {
            bad.push(format!("{e}; status now {}", d["status"]));
            return bad;
        }
    };
    let phase = dag["status"]["phase"].as_str().unwrap_or_default();
    if phase != *want_dag {
        bad.push(format!(
            "Dag phase: expected {want_dag}, got {phase} (status {})",
            dag["status"]
        ));
    }
    bad.extend(check_counts(&dag["status"]));
    // Every step and element allocation, and the markers.
    let mut allocs = BTreeMap::new();
    let mut marks = BTreeMap::new();
    for w in want_steps {
        let a = alloc_of(w.step);
        allocs.insert(a.clone(), ctx.alloc(&a).await);
        if let Some(mk) = marks_of(ctx, &a) {
            marks.insert(a, mk);
        }
    }
    for e in want_elems {
        let a = alloc_of(&format!("{}-{}", e.step, e.index));
        allocs.insert(a.clone(), ctx.alloc(&a).await);
        if let Some(mk) = marks_of(ctx, &a) {
            marks.insert(a, mk);
        }
    }
    // The Dag ends only once every step has: no allocation of it is left unfinished.
    for (a, v) in &allocs {
        let p = v
            .as_ref()
            .and_then(|v| v["status"]["phase"].as_str())
            .unwrap_or("Pending");
        if v.is_some() && !terminal(p) {
            bad.push(format!(
                "the Dag is {phase} but its allocation {a} is still {p}"
            ));
        }
    }
    let out = Outcome {
        dag_name: name.to_string(),
        marks_dir: ctx.marks.clone(),
        dag,
        allocs,
        marks,
    };
    for w in want_steps {
        bad.extend(
            check_step(&out, w)
                .await
                .into_iter()
                .map(|b| format!("step {}: {b}", w.step)),
        );
    }
    for e in want_elems {
        bad.extend(
            check_element(&out, e)
                .await
                .into_iter()
                .map(|b| format!("element {}[{}]: {b}", e.step, e.index)),
        );
    }
    bad.extend(check_order(case, &out));
    // Every process ran once (but the requeued one, twice).
    let requeued = match case.during {
        During::KillAgent {
            requeue: true,
            target,
            ..
        } => Some(format!("{name}-{target}")),
        _ => None,
    };
    for (a, m) in &out.marks {
        let want_runs = if requeued.as_deref() == Some(a.as_str()) {
            2
        } else {
            1
        };
        if m.attempts.len() != want_runs {
            bad.push(format!(
                "{a} ran {} times, expected {want_runs}: {m:?}",
                m.attempts.len()
            ));
        }
    }
    if let Some(f) = extra {
        bad.extend(f(&out));
    }
    bad
}

/// A finished Dag's `status.counts` agree with its tasks' phases, and a task group that
/// ran to its end (Completed or Failed) has every element accounted for in `elements`.
fn check_counts(status: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let tasks = status["tasks"].as_object().cloned().unwrap_or_default();
    let counts = &status["counts"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let of_phase = |p: &str| tasks.values().filter(|t| t["phase"] == p).count() as u64;
    let want = [
        ("total", tasks.len() as u64),
        ("completed", of_phase("Completed")),
        ("failed", of_phase("Failed")),
        ("cancelled", of_phase("Cancelled")),
        ("skipped", of_phase("Skipped")),
        ("waiting", 0),
        ("pending", 0),
        ("running", 0),
    ];
    for (field, value) in want {
        if n(&counts[field]) != value {
            bad.push(format!(
                "status.counts.{field} is {}, the tasks say {value} (counts {counts})",
                counts[field]
            ));
        }
    }
    for (name, t) in &tasks {
        let e = &t["elements"];
        if e.is_null() {
            continue;
        }
        let done = n(&e["completed"]) + n(&e["failed"]) + n(&e["cancelled"]);
        let ran = matches!(t["phase"].as_str(), Some("Completed" | "Failed"));
        if n(&e["total"]) == 0 || done > n(&e["total"]) || (ran && done != n(&e["total"])) {
            bad.push(format!(
                "task {name}: elements {e} do not account for every element"
            ));
        }
        let phase = t["phase"].as_str().unwrap_or_default();
        if phase == "Completed" && n(&e["completed"]) != n(&e["total"]) {
            bad.push(format!("task {name} Completed with elements {e}"));
        }
    }
    bad
}

async fn check_step(o: &Outcome, w: &StepWant) -> Vec<String> {
    let mut bad = Vec::new();
    let task = &o.dag["status"]["tasks"][w.step];
    let phase = task["phase"].as_str().unwrap_or("<none>");
    if phase != w.phase {
        bad.push(format!(
            "expected {}, got {phase} (task status {task})",
            w.phase
        ));
    }
    let alloc_name = format!("{}-{}", o.dag_name, w.step);
    let is_group = o.dag["spec"]["allocations"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == w.step))
        .is_some_and(|s| !s["spec"]["taskGroup"].is_null());
    let marks = o.marks.get(&alloc_name);
    if !is_group {
        let alloc = o.allocs.get(&alloc_name).cloned().flatten();
        let a_phase = alloc
            .as_ref()
            .and_then(|a| a["status"]["phase"].as_str())
            .unwrap_or("<absent>")
            .to_string();
        // The allocation ends in the step's phase; a skipped step's is cancelled (or it
        // was never created).
        let ok = match w.phase {
            "Skipped" => matches!(a_phase.as_str(), "Cancelled" | "<absent>"),
            "Cancelled" if w.ran == Ran::No => {
                matches!(a_phase.as_str(), "Cancelled" | "<absent>")
            }
            p => a_phase == p,
        };
        if !ok {
            bad.push(format!(
                "allocation {alloc_name}: expected phase {}, got {a_phase}",
                w.phase
            ));
        }
        if let Some(x) = w.exit {
            let got = alloc
                .as_ref()
                .and_then(|a| a["status"]["exitCode"].as_i64());
            if got != Some(x as i64) {
                bad.push(format!(
                    "allocation {alloc_name}: expected exit code {x}, got {got:?}"
                ));
            }
        }
    }
    // Did its process run? A task group's processes are its elements': the "worst" of
    // theirs (never < ended < terminated < killed).
    let ran = if is_group {
        let prefix = format!("{alloc_name}-");
        o.marks
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, m)| Ran::of(Some(m)))
            .max_by_key(|r| *r as u8)
            .unwrap_or(Ran::No)
    } else {
        Ran::of(marks)
    };
    if !ran.satisfies(w.ran) {
        bad.push(format!(
            "expected its process {:?}, got {ran:?} (markers {marks:?})",
            w.ran
        ));
    }
    // A process the Dag's cancellation stopped is gone.
    if w.ran == Ran::Terminated {
        bad.extend(processes_gone(marks).await);
    }
    bad
}

/// Every process in `marks` has exited (waiting up to 20 s).
async fn processes_gone(marks: Option<&Marks>) -> Vec<String> {
    let mut bad = Vec::new();
    for a in marks.map(|m| m.attempts.as_slice()).unwrap_or_default() {
        let wait = Deadline::new("the process to exit", Duration::from_secs(20));
        while pid_alive(a.pid) {
            if wait.tick().await.is_err() {
                bad.push(format!(
                    "attempt {} (pid {}) still runs after the Dag ended",
                    a.attempt, a.pid
                ));
                break;
            }
        }
    }
    bad
}

/// An element's process: never ran when it was never created, got SIGTERM when it was
/// cancelled (the table cancels elements only while they run), ended by itself otherwise.
async fn check_element(o: &Outcome, e: &ElemWant) -> Vec<String> {
    let mut bad = Vec::new();
    let name = format!("{}-{}-{}", o.dag_name, e.step, e.index);
    let alloc = o.allocs.get(&name).cloned().flatten();
    let marks = o.marks.get(&name);
    match (e.phase, &alloc) {
        (None, None) => {}
        (None, Some(a)) => bad.push(format!(
            "expected never created, but {name} exists in phase {}",
            a["status"]["phase"]
        )),
        (Some(p), None) => bad.push(format!("expected {p}, but {name} was never created")),
        (Some(p), Some(a)) => {
            let got = a["status"]["phase"].as_str().unwrap_or("<none>");
            if got != p {
                bad.push(format!("expected {p}, got {got}"));
            }
            let code = a["status"]["exitCode"].as_i64();
            let want_code = match p {
                "Completed" => Some(0),
                "Failed" => Some(1),
                _ => None,
            };
            if want_code.is_some() && code != want_code {
                bad.push(format!("expected exit code {want_code:?}, got {code:?}"));
            }
        }
    }
    let want_ran = match e.phase {
        None => Ran::No,
        Some("Cancelled") => Ran::Terminated,
        Some(_) => Ran::Yes,
    };
    let ran = Ran::of(marks);
    if !ran.satisfies(want_ran) {
        bad.push(format!(
            "expected its process {want_ran:?}, got {ran:?} (markers {marks:?})"
        ));
    }
    if want_ran == Ran::Terminated {
        bad.extend(processes_gone(marks).await);
    }
    bad
}

/// Every successor that ran started after each of its predecessors (that ran) ended:
/// `success`/`failure`/`any` step to step, `corresponding` element to element.
fn check_order(case: &Case, o: &Outcome) -> Vec<String> {
    let mut bad = Vec::new();
    let groups: BTreeMap<&str, Option<&str>> = case
        .steps
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default(),
                s["spec"]["taskGroup"]["range"].as_str(),
            )
        })
        .collect();
    for s in &case.steps {
        let succ = s["name"].as_str().unwrap_or_default();
        for d in s["dependsOn"].as_array().into_iter().flatten() {
            let pred = d["ref"].as_str().unwrap_or_default();
            let cond = d["condition"].as_str().unwrap_or_default();
            let pairs: Vec<(String, String)> = match cond {
                "mutex" => continue,
                "corresponding" => (0..16)
                    .map(|i| (format!("{pred}-{i}"), format!("{succ}-{i}")))
                    .collect(),
                _ if groups.get(succ).copied().flatten().is_some()
                    || groups.get(pred).copied().flatten().is_some() =>
                {
                    continue
                }
                _ => vec![(pred.to_string(), succ.to_string())],
            };
            for (p, q) in pairs {
                let (Some(pm), Some(qm)) = (o.marks(&p), o.marks(&q)) else {
                    continue;
                };
                let (Some(p_end), Some(q_start)) = (pm.ended_at(), qm.first_start()) else {
                    continue;
                };
                if q_start < p_end {
                    bad.push(format!(
                        "step {q} ({cond} on {p}) started {:.3}s before {p} ended",
                        p_end - q_start
                    ));
                }
            }
        }
    }
    bad
}

/// Cancel cases: wait until the allocations `<name>-<running>` run (and their processes
/// started) and the steps `completed` completed, then cancel the Dag `via` the CLI or the
/// Intent API.
async fn cancel_mid_run(
    ctx: &Ctx,
    name: &str,
    via: Via,
    running: &[&str],
    completed: &[&str],
) -> Result<(), String> {
    for r in running {
        let alloc = format!("{name}-{r}");
        let wait = Deadline::new(format!("{alloc} to run"), Duration::from_secs(60));
        loop {
            let started = marks_of(ctx, &alloc).is_some_and(|m| !m.attempts.is_empty());
            let runs = ctx
                .alloc(&alloc)
                .await
                .is_some_and(|a| a["status"]["phase"] == "Running");
            if started && runs {
                break;
            }
            wait.tick().await?;
        }
    }
    for c in completed {
        let wait = Deadline::new(format!("step {c} to complete"), Duration::from_secs(60));
        while ctx.dag(name).await["status"]["tasks"][c]["phase"] != "Completed" {
            wait.tick().await?;
        }
    }
    if via == Via::Cli {
        let (code, out, err) = ctx.lattice(&["dag", "cancel", name]).await;
        let want =
            format!("Cancel requested for DAG {name}; its unfinished allocations are cancelled\n");
        if code != Some(0) || out != want {
            return Err(format!(
                "`lattice dag cancel {name}`: expected exit 0 and {want:?}, got {code:?} {out:?} {err:?}"
            ));
        }
    } else {
        let (code, v) = ctx
            .send(
                reqwest::Method::DELETE,
                &format!("/v1/dags/{name}?tenant={NS}"),
                None,
            )
            .await;
        if code != 202 {
            return Err(format!(
                "DELETE /v1/dags/{name}: expected 202, got {code}: {v}"
            ));
        }
    }
    Ok(())
}

/// Node failure cases: SIGKILL the agent running `<name>-<target>` (see
/// [`During::KillAgent`]). The killed agent is restarted at the end (which stops the
/// superseded run) and the test waits for its node to be Ready again.
async fn kill_agent_mid_run(
    ctx: &Ctx,
    c: &mut Cluster,
    name: &str,
    requeue: bool,
    target: &str,
    blocked: &[&str],
    bad: &mut Vec<String>,
) -> Result<(), String> {
    let t_name = format!("{name}-{target}");
    let wait = Deadline::new(format!("{t_name} to run"), Duration::from_secs(60));
    let node = loop {
        if let Some(a) = ctx.alloc(&t_name).await {
            let node = a["status"]["assignedNodes"][0].as_str().map(str::to_string);
            if a["status"]["phase"] == "Running" && marks_of(ctx, &t_name).is_some() {
                if let Some(n) = node {
                    break n;
                }
            }
        }
        wait.tick().await?;
    };
    let idx = c
        .agents
        .iter()
        .position(|x| x.node == node)
        .ok_or_else(|| format!("no agent for node {node}"))?;
    c.agents[idx].kill9();
    let outcome = if requeue {
        watch_requeue(ctx, name, target, blocked, &node, bad).await
    } else {
        let wait = Deadline::new(format!("{t_name} to fail"), Duration::from_secs(60));
        loop {
            match ctx.alloc(&t_name).await {
                Some(a) if a["status"]["phase"] == "Failed" => {
                    if a["status"]["reason"] != "node_failure" {
                        bad.push(format!(
                            "{target}: expected reason node_failure, got {}",
                            a["status"]["reason"]
                        ));
                    }
                    break Ok(());
                }
                _ => {}
            }
            if let Err(e) = wait.tick().await {
                break Err(e);
            }
        }
    };
    // Bring the node back either way (this stops the superseded process).
    c.agents[idx].restart();
    outcome?;
    ctx.wait_nodes_ready(c.agents.len(), c).await;
    Ok(())
}

/// Requeue cases, after the agent of `node` (running `<name>-<target>`) was killed:
/// until the target completes, the `blocked` allocations stay blocked and the Dag runs;
/// then the target shows one requeue, and its second attempt ran on another node.
async fn watch_requeue(
    ctx: &Ctx,
    name: &str,
    target: &str,
    blocked: &[&str],
    node: &str,
    bad: &mut Vec<String>,
) -> Result<(), String> {
    let t_name = format!("{name}-{target}");
    let mut seen = std::collections::BTreeSet::new();
    let wait = Deadline::new(
        format!("{t_name} to be requeued and complete"),
        Duration::from_secs(90),
    );
    let a = loop {
        let a = ctx.alloc(&t_name).await.unwrap_or(Value::Null);
        let a_phase = a["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if a_phase == "Completed" {
            break a;
        }
        let mut problems = Vec::new();
        for s in blocked {
            let alloc = format!("{name}-{s}");
            if marks_of(ctx, &alloc).is_some() {
                problems.push(format!("{s} started while {target} was {a_phase}"));
            }
            if let Some(sa) = ctx.alloc(&alloc).await {
                let held = sa["metadata"]["annotations"]["lattice.dev/hold"].is_string();
                if !held || sa["status"]["phase"] != "Pending" {
                    problems.push(format!(
                        "{s} released (held: {held}, phase {}) while {target} was {a_phase}",
                        sa["status"]["phase"]
                    ));
                }
            }
        }
        let d = ctx.dag(name).await;
        if terminal(d["status"]["phase"].as_str().unwrap_or_default()) {
            problems.push(format!(
                "the Dag ended ({}) while {target} was {a_phase}",
                d["status"]["phase"]
            ));
        }
        // Only what held while the target had still not completed afterwards counts (it
        // may have completed, and released them, between the reads).
        if !problems.is_empty()
            && ctx
                .alloc(&t_name)
                .await
                .is_some_and(|x| x["status"]["phase"] != "Completed")
        {
            for p in problems {
                if seen.insert(p.clone()) {
                    bad.push(p);
                }
            }
        }
        wait.tick().await?;
    };
    let st = &a["status"];
    if st["requeueCount"].as_u64() != Some(1) {
        bad.push(format!(
            "{target}: expected requeueCount 1, got {}",
            st["requeueCount"]
        ));
    }
    let moved_to = st["assignedNodes"][0].as_str().unwrap_or_default();
    if moved_to == node {
        bad.push(format!("{target}: requeued onto the dead node {node}"));
    }
    let m = marks_of(ctx, &t_name).unwrap_or_default();
    let first = m.attempts.first().cloned().unwrap_or_default();
    let last = m.attempts.last().cloned().unwrap_or_default();
    if m.attempts.len() != 2
        || (first.attempt, first.node.as_str()) != (1, node)
        || (last.attempt, last.node.as_str()) != (2, moved_to)
    {
        bad.push(format!(
            "{target}: expected attempt 1 on {node} and attempt 2 on {moved_to}, markers {m:?}"
        ));
    }
    if first.end.is_some() {
        bad.push(format!("{target}: attempt 1 ended by itself: {m:?}"));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------
// The tests
// ------------------------------------------------------------------------------------

fn report(what: &str, bad: &[String], started: Instant, logs: &str) {
    eprintln!("{what}: {:.1}s", started.elapsed().as_secs_f64());
    assert!(
        bad.is_empty(),
        "{what}: {} mismatches:\n  {}\n\n--- cluster logs (tail) ---\n{}",
        bad.len(),
        bad.join("\n  "),
        tail(logs)
    );
}

/// The cases that need no agent killed, concurrently, on one cluster of 12 agents
/// (whole nodes per step: enough that every case's first steps find a node at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_table() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 12, &[], &[]);
    let ctx = Ctx::new(&c, dir.path());
    ctx.wait_nodes_ready(12, &c).await;
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| {
            !matches!(
                c.during,
                During::KillAgent { .. } | During::RestartServer { .. }
            )
        })
        .collect();
    let runs = cases.iter().map(|case| {
        let ctx = ctx.clone();
        async move {
            let t = Instant::now();
            let bad = run_case(&ctx, case, None).await;
            eprintln!(
                "case {}: {} in {:.1}s",
                case.name,
                if bad.is_empty() { "ok" } else { "FAILED" },
                t.elapsed().as_secs_f64()
            );
            bad
        }
    });
    let bad: Vec<String> = futures::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect();
    report("dag_table", &bad, started, &c.logs());
}

/// The cases that kill an agent, one after the other, on a cluster of 3 agents whose
/// nodes go Down 4 s after their last heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_table_node_failure() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(
        dir.path(),
        3,
        &["--heartbeat-timeout", "2s", "--node-grace-period", "2s"],
        &[],
    );
    let ctx = Ctx::new(&c, dir.path());
    ctx.wait_nodes_ready(3, &c).await;
    let mut bad = Vec::new();
    for case in cases()
        .iter()
        .filter(|c| matches!(c.during, During::KillAgent { .. }))
    {
        let t = Instant::now();
        let b = run_case(&ctx, case, Some(&mut c)).await;
        eprintln!(
            "case {}: {} in {:.1}s",
            case.name,
            if b.is_empty() { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        bad.extend(b);
    }
    report("dag_table_node_failure", &bad, started, &c.logs());
}

/// The case that crashes the server, on its own cluster of 2 agents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dag_table_server_restart() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 2, &[], &[]);
    let ctx = Ctx::new(&c, dir.path());
    ctx.wait_nodes_ready(2, &c).await;
    let mut bad = Vec::new();
    for case in cases()
        .iter()
        .filter(|c| matches!(c.during, During::RestartServer { .. }))
    {
        let t = Instant::now();
        let b = run_case(&ctx, case, Some(&mut c)).await;
        eprintln!(
            "case {}: {} in {:.1}s",
            case.name,
            if b.is_empty() { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        bad.extend(b);
    }
    report("dag_table_server_restart", &bad, started, &c.logs());
}
