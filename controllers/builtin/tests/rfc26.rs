//! Flux RFC 26 conformance of the live allocation controller, checked against the
//! reference model `lattice_dag::flux::FluxDeps` (which `controllers/dag/tests/flux.rs`
//! holds to the RFC's text, examples included).
//!
//! Each row is run twice: through the model (submit, start and finish events) and through
//! the real controllers on a real store, with the dependency written as a user writes it
//! on the command line (`--dependency=afternotok:A`, `string:foo?type=in`) and translated
//! by the same parser `lattice submit` uses. The dependent must run exactly when the model
//! releases it, and fail with `dependency_never_satisfied` exactly when the model raises
//! the RFC's fatal exception — whether the antecedent ends before or after the dependent
//! is submitted.

mod common;

use std::time::Duration;

use common::*;
use lattice_apis::{lifecycle, AllocationPhase};
use lattice_dag::deps::parse_flux_uri;
use lattice_dag::flux::{FluxDeps, FluxEvent};
use lattice_dag::Outcome;
use serde_json::json;

/// What the antecedent does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Antecedent {
    Exit(i32),
    CancelBeforeStart,
    CancelWhileRunning,
}

/// When the antecedent reaches its end: before the dependent is submitted or after.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Timing {
    EndsBefore,
    EndsAfter,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Runs,
    Fatal,
}

struct Row {
    name: String,
    /// The dependency as typed, with `{A}` for the antecedent's name.
    uri: String,
    /// What the antecedent declares (RFC 26 `string` writers), same placeholder.
    antecedent_deps: Vec<String>,
    ante: Antecedent,
    timing: Timing,
}

fn uris(list: &[String], a: &str) -> Vec<String> {
    list.iter().map(|u| u.replace("{A}", a)).collect()
}

/// The reference model's verdict for one row.
fn model(row: &Row) -> Verdict {
    let a = format!("{}-a", row.name);
    let b = format!("{}-d", row.name);
    let parse = |list: &[String]| -> Vec<_> {
        uris(list, &a)
            .iter()
            .map(|u| parse_flux_uri(u).expect(u))
            .collect()
    };
    let mut f = FluxDeps::new();
    let mut events = f
        .submit(&a, "alice", false, &parse(&row.antecedent_deps), 1000.0)
        .expect("submit antecedent");
    let drive = |f: &mut FluxDeps| -> Vec<FluxEvent> {
        match row.ante {
            Antecedent::Exit(code) => {
                let mut ev = f.job_started(&a);
                let outcome = if code == 0 {
                    Outcome::Succeeded
                } else {
                    Outcome::Failed { exit: code }
                };
                ev.extend(f.job_inactive(&a, outcome, true));
                ev
            }
            Antecedent::CancelBeforeStart => f.job_inactive(&a, Outcome::Cancelled, false),
            Antecedent::CancelWhileRunning => {
                let mut ev = f.job_started(&a);
                ev.extend(f.job_inactive(&a, Outcome::Cancelled, true));
                ev
            }
        }
    };
    let dependent = parse(std::slice::from_ref(&row.uri));
    match row.timing {
        Timing::EndsBefore => {
            events.extend(drive(&mut f));
            events.extend(
                f.submit(&b, "alice", false, &dependent, 1000.0)
                    .expect("submit dependent"),
            );
        }
        Timing::EndsAfter => {
            events.extend(
                f.submit(&b, "alice", false, &dependent, 1000.0)
                    .expect("submit dependent"),
            );
            events.extend(drive(&mut f));
        }
    }
    let ready = events
        .iter()
        .any(|e| matches!(e, FluxEvent::Ready { job } if *job == b));
    let fatal = events
        .iter()
        .any(|e| matches!(e, FluxEvent::Fatal { job, .. } if *job == b));
    assert!(
        ready != fatal,
        "{}: the model must decide (ready {ready}, fatal {fatal})",
        row.name
    );
    if ready {
        Verdict::Runs
    } else {
        Verdict::Fatal
    }
}

/// `spec.dependsOn` for a command-line dependency, as `lattice submit --dependency` builds it.
fn depends_on(list: &[String], a: &str) -> serde_json::Value {
    let mut out = Vec::new();
    for u in uris(list, a) {
        let spec = lattice_compat::values::parse_slurm_dependency(&u).expect(&u);
        out.extend(spec.depends_on(false).0);
    }
    json!(out)
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let antes = [
        ("ok", Antecedent::Exit(0)),
        ("failed", Antecedent::Exit(3)),
        ("cancelled", Antecedent::CancelBeforeStart),
        ("killed", Antecedent::CancelWhileRunning),
    ];
    for scheme in ["after", "afterany", "afterok", "afternotok"] {
        for (what, ante) in antes {
            for (when, timing) in [("late", Timing::EndsBefore), ("", Timing::EndsAfter)] {
                let name = [scheme, what, when]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join("-");
                rows.push(Row {
                    name,
                    uri: format!("{scheme}:{{A}}"),
                    antecedent_deps: Vec::new(),
                    ante,
                    timing,
                });
            }
        }
    }
    // The `string` scheme: the antecedent writes a symbol (`out`, or `inout`, which makes
    // it the writer as well), the dependent reads it (`in`).
    for (writer, ante) in [
        ("out", Antecedent::Exit(0)),
        ("out", Antecedent::Exit(3)),
        ("out", Antecedent::CancelWhileRunning),
        ("inout", Antecedent::Exit(0)),
        ("inout", Antecedent::Exit(2)),
    ] {
        let what = match ante {
            Antecedent::Exit(0) => "ok".to_string(),
            Antecedent::Exit(c) => format!("exit{c}"),
            _ => "killed".to_string(),
        };
        let name = format!("string-{writer}-{what}");
        let symbol = format!("sym-{writer}-{what}");
        rows.push(Row {
            uri: format!("string:{symbol}?type=in"),
            antecedent_deps: vec![format!("string:{symbol}?type={writer}")],
            name,
            ante,
            timing: Timing::EndsAfter,
        });
    }
    rows
}

/// Let the antecedent of `r` reach its end.
async fn end(env: &Env, r: &Row) {
    let a = format!("{}-a", r.name);
    match r.ante {
        Antecedent::Exit(_) => annotate(env, &a, HOLD, serde_json::Value::Null).await,
        Antecedent::CancelBeforeStart => {
            annotate(env, &a, lifecycle::CANCEL_ANNOTATION, json!("true")).await
        }
        Antecedent::CancelWhileRunning => {
            annotate(env, &a, HOLD, serde_json::Value::Null).await;
            env.wait_phase("t1", &a, AllocationPhase::Running).await;
            annotate(env, &a, lifecycle::CANCEL_ANNOTATION, json!("true")).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc26_schemes_match_the_reference_model() {
    let (env, _hb) = cluster(&["n1", "n2", "n3", "n4"]).await;
    let plans = Plans::default();
    let _runner = scripted_runner(&env, "t1", plans.clone());
    let rows = rows();
    let verdicts: Vec<Verdict> = rows.iter().map(model).collect();
    // The model says what the RFC says (spot checks, so a broken model cannot pass).
    let verdict_of = |name: &str| {
        let i = rows.iter().position(|r| r.name == name).expect(name);
        verdicts[i]
    };
    assert_eq!(verdict_of("afternotok-cancelled"), Verdict::Runs);
    assert_eq!(verdict_of("afternotok-ok-late"), Verdict::Fatal);
    assert_eq!(verdict_of("after-cancelled"), Verdict::Fatal);
    assert_eq!(verdict_of("after-killed"), Verdict::Runs);
    assert_eq!(verdict_of("afterok-killed-late"), Verdict::Fatal);
    assert_eq!(verdict_of("string-out-exit3"), Verdict::Fatal);

    // Antecedents, held until their turn.
    for r in &rows {
        let a = format!("{}-a", r.name);
        let mut extra = json!({"metadata": {"annotations": {HOLD: "true"}}});
        if !r.antecedent_deps.is_empty() {
            extra["spec"] = json!({"dependsOn": depends_on(&r.antecedent_deps, &a)});
        }
        env.submit("t1", &a, 1, extra).await;
        plans.set(
            &a,
            match r.ante {
                Antecedent::Exit(code) => Run::Exit(code, Duration::ZERO),
                _ => Run::Hold,
            },
        );
    }
    let terminal = |r: &Row| match r.ante {
        Antecedent::Exit(0) => AllocationPhase::Completed,
        Antecedent::Exit(_) => AllocationPhase::Failed,
        _ => AllocationPhase::Cancelled,
    };
    // Rows whose antecedent ends first: end it, wait for its terminal phase.
    for r in rows.iter().filter(|r| r.timing == Timing::EndsBefore) {
        end(&env, r).await;
    }
    for r in rows.iter().filter(|r| r.timing == Timing::EndsBefore) {
        env.wait_phase("t1", &format!("{}-a", r.name), terminal(r))
            .await;
    }
    // Dependents.
    for r in &rows {
        let a = format!("{}-a", r.name);
        let deps = depends_on(std::slice::from_ref(&r.uri), &a);
        env.submit(
            "t1",
            &format!("{}-d", r.name),
            1,
            json!({"spec": {"dependsOn": deps}}),
        )
        .await;
    }
    // Then the other antecedents end.
    for r in rows.iter().filter(|r| r.timing == Timing::EndsAfter) {
        end(&env, r).await;
    }
    for (r, verdict) in rows.iter().zip(&verdicts) {
        let d = format!("{}-d", r.name);
        let a = env
            .wait_alloc("t1", &d, "a terminal phase", |a| a.phase().is_terminal())
            .await;
        let live = match (a.phase(), reason_of(&a)) {
            (AllocationPhase::Completed, _) => Verdict::Runs,
            (AllocationPhase::Failed, Some("dependency_never_satisfied")) => Verdict::Fatal,
            (phase, reason) => panic!(
                "{}: dependent ended {phase} ({reason:?}): {}",
                r.name,
                message_of(&a)
            ),
        };
        assert_eq!(
            live,
            *verdict,
            "{} ({} after {:?}, {:?}): live controller and RFC 26 model disagree: {}",
            r.name,
            r.uri,
            r.ante,
            r.timing,
            message_of(&a)
        );
        let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or_default();
        match live {
            Verdict::Runs => assert_eq!(attempt, 1, "{}: ran once", r.name),
            Verdict::Fatal => assert_eq!(attempt, 0, "{}: never ran", r.name),
        }
    }
}
