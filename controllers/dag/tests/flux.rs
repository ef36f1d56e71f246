//! RFC 26 conformance: dependency events, simple schemes, fatal exceptions,
//! and the `string` scheme's symbolic registry (the RFC's three examples).
use lattice_dag::deps::{parse_flux_uri, FluxDependency};
use lattice_dag::flux::{AddResult, DependencyTracker, EventError, FluxDeps, FluxError, FluxEvent};
use lattice_dag::Outcome;

fn d(s: &str) -> FluxDependency {
    parse_flux_uri(s).expect(s)
}

fn ready(ev: &[FluxEvent], job: &str) -> bool {
    ev.iter()
        .any(|e| matches!(e, FluxEvent::Ready { job: j } if j == job))
}

fn fatal(ev: &[FluxEvent], job: &str) -> Option<String> {
    ev.iter().find_map(|e| match e {
        FluxEvent::Fatal { job: j, reason } if j == job => Some(reason.clone()),
        _ => None,
    })
}

fn submit(f: &mut FluxDeps, job: &str, deps: &[&str]) -> Vec<FluxEvent> {
    let deps: Vec<FluxDependency> = deps.iter().map(|s| d(s)).collect();
    f.submit(job, "alice", false, &deps, 1000.0)
        .expect("submit")
}

#[test]
fn tracker_duplicate_rules() {
    let mut t = DependencyTracker::default();
    assert_eq!(t.add("afterok:1"), Ok(AddResult::Posted));
    // Duplicate add of an unsatisfied dependency: not posted, not an error.
    assert_eq!(t.add("afterok:1"), Ok(AddResult::DuplicateIgnored));
    assert_eq!(t.outstanding(), 1);
    assert!(!t.is_satisfied());
    assert_eq!(t.remove("afterok:1"), Ok(true));
    assert!(t.is_satisfied());
    // Duplicate add of a satisfied dependency: plugin error.
    assert_eq!(
        t.add("afterok:1"),
        Err(EventError::DuplicateSatisfied("afterok:1".into()))
    );
    assert_eq!(t.remove("afterok:1"), Ok(false));
    assert!(matches!(
        t.remove("nope"),
        Err(EventError::UnknownRemove(_))
    ));
    t.raise_fatal("boom");
    assert!(!t.is_satisfied());
    assert_eq!(t.fatal(), Some("boom"));
}

#[test]
fn after_satisfied_on_start_fatal_if_never_ran() {
    let mut f = FluxDeps::new();
    assert!(ready(&submit(&mut f, "A", &[]), "A"));
    let ev = submit(&mut f, "B", &["after:A"]);
    assert!(
        matches!(&ev[0], FluxEvent::DependencyAdd { job, description } if job == "B" && description == "after:A")
    );
    assert!(!ready(&ev, "B"));
    let ev = f.job_started("A");
    assert!(matches!(&ev[0], FluxEvent::DependencyRemove { .. }));
    assert!(ready(&ev, "B"));

    let mut f = FluxDeps::new();
    submit(&mut f, "A", &[]);
    submit(&mut f, "B", &["after:A"]);
    let ev = f.job_inactive("A", Outcome::Cancelled, false);
    let why = fatal(&ev, "B").expect("fatal");
    assert!(
        why.contains("after:A") && why.contains("never ran"),
        "{why}"
    );
    // Already running at submit time: satisfied immediately, no events.
    let mut f = FluxDeps::new();
    submit(&mut f, "A", &[]);
    f.job_started("A");
    let ev = submit(&mut f, "C", &["after:A"]);
    assert_eq!(ev, vec![FluxEvent::Ready { job: "C".into() }]);
}

#[test]
fn afterany_afterok_afternotok() {
    for (scheme, outcome, satisfied) in [
        ("afterany", Outcome::Succeeded, true),
        ("afterany", Outcome::Failed { exit: 1 }, true),
        ("afterany", Outcome::Cancelled, true),
        ("afterok", Outcome::Succeeded, true),
        ("afterok", Outcome::Failed { exit: 2 }, false),
        ("afterok", Outcome::Cancelled, false),
        ("afternotok", Outcome::Succeeded, false),
        ("afternotok", Outcome::Failed { exit: 2 }, true),
        ("afternotok", Outcome::Cancelled, true),
    ] {
        // Antecedent finishes after the dependent is submitted...
        let mut f = FluxDeps::new();
        submit(&mut f, "A", &[]);
        f.job_started("A");
        submit(&mut f, "B", &[&format!("{scheme}:A")]);
        let ev = f.job_inactive("A", outcome, true);
        assert_eq!(ready(&ev, "B"), satisfied, "{scheme} {outcome:?}");
        assert_eq!(
            fatal(&ev, "B").is_some(),
            !satisfied,
            "{scheme} {outcome:?}"
        );
        // ...or before.
        let mut f = FluxDeps::new();
        submit(&mut f, "A", &[]);
        f.job_started("A");
        f.job_inactive("A", outcome, true);
        let ev = submit(&mut f, "B", &[&format!("{scheme}:A")]);
        assert_eq!(ready(&ev, "B"), satisfied, "late {scheme} {outcome:?}");
        if !satisfied {
            let why = fatal(&ev, "B").expect("fatal");
            assert!(
                why.contains("can never be satisfied") && why.contains("job A"),
                "{why}"
            );
        }
    }
}

#[test]
fn fatal_exceptions_cascade() {
    let mut f = FluxDeps::new();
    submit(&mut f, "A", &[]);
    submit(&mut f, "B", &["afterok:A"]);
    submit(&mut f, "C", &["afterok:B"]);
    submit(&mut f, "D", &["afterany:B"]);
    submit(&mut f, "E", &["afternotok:B"]);
    let ev = f.job_inactive("A", Outcome::Failed { exit: 1 }, true);
    assert!(fatal(&ev, "B").is_some());
    assert!(
        fatal(&ev, "C").is_some(),
        "B never ran, so C's afterok can never hold"
    );
    assert!(ready(&ev, "D"), "afterany holds once B is inactive");
    assert!(ready(&ev, "E"), "B's result is unsuccessful");
}

#[test]
fn multiple_dependencies_all_required() {
    let mut f = FluxDeps::new();
    submit(&mut f, "A", &[]);
    submit(&mut f, "B", &[]);
    let ev = submit(&mut f, "C", &["afterok:A", "afterany:B", "begin-time:2000"]);
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, FluxEvent::DependencyAdd { .. }))
            .count(),
        3
    );
    assert!(!ready(&f.job_inactive("A", Outcome::Succeeded, true), "C"));
    assert!(!ready(
        &f.job_inactive("B", Outcome::Failed { exit: 1 }, true),
        "C"
    ));
    assert!(f.tick(1999.5).is_empty());
    let ev = f.tick(2000.0);
    assert!(ready(&ev, "C"));
    assert!(f.is_ready("C"));
}

#[test]
fn begin_time_in_the_past_is_satisfied() {
    let mut f = FluxDeps::new();
    let ev = submit(&mut f, "A", &["begin-time:999.5"]);
    assert_eq!(ev, vec![FluxEvent::Ready { job: "A".into() }]);
}

#[test]
fn submit_errors() {
    let mut f = FluxDeps::new();
    submit(&mut f, "A", &[]);
    let e = f
        .submit("B", "u", false, &[d("afterok:nope")], 0.0)
        .expect_err("unknown");
    assert!(matches!(e, FluxError::UnknownJob { .. }));
    assert!(e.to_string().contains("not found"));
    assert!(matches!(
        f.submit("A", "u", false, &[], 0.0),
        Err(FluxError::DuplicateJob(_))
    ));
    let e = f
        .submit(
            "X",
            "u",
            false,
            &[d("string:data?type=out&scope=global")],
            0.0,
        )
        .expect_err("policy");
    assert!(matches!(e, FluxError::GlobalScopeDenied(_)));
    assert!(f
        .submit(
            "X",
            "root",
            true,
            &[d("string:data?type=out&scope=global")],
            0.0
        )
        .is_ok());
    assert!(f
        .submit(
            "Y",
            "u",
            false,
            &[d("string:data?type=in&scope=global")],
            0.0
        )
        .is_ok());
    let bad = FluxDependency {
        scheme: "fluid".into(),
        value: "x".into(),
        options: Default::default(),
    };
    assert!(matches!(
        f.submit("Z", "u", false, &[bad], 0.0),
        Err(FluxError::Invalid { .. })
    ));
    assert!(!f.is_ready("Z"), "rejected submissions leave no state");
}

#[test]
fn readd_after_restart_follows_duplicate_rules() {
    let mut f = FluxDeps::new();
    submit(&mut f, "A", &[]);
    submit(&mut f, "B", &[]);
    submit(&mut f, "C", &["afterok:A", "afterok:B"]);
    assert_eq!(f.readd("C", "afterok:A"), Ok(AddResult::DuplicateIgnored));
    f.job_inactive("A", Outcome::Succeeded, true);
    assert!(matches!(
        f.readd("C", "afterok:A"),
        Err(EventError::DuplicateSatisfied(_))
    ));
    assert_eq!(f.tracker("C").map(|t| t.outstanding()), Some(1));
}

/// RFC 26 Example 1: a chain of jobs with `inout`.
#[test]
fn rfc26_example1_inout_chain() {
    let mut f = FluxDeps::new();
    let dep = ["string:foo?type=inout&scope=user"];
    assert!(ready(&submit(&mut f, "j1", &dep), "j1"));
    assert!(!ready(&submit(&mut f, "j2", &dep), "j2"));
    assert!(!ready(&submit(&mut f, "j3", &dep), "j3"));
    let ev = f.job_inactive("j1", Outcome::Succeeded, true);
    assert!(
        ready(&ev, "j2") && !ready(&ev, "j3"),
        "runs one after another"
    );
    let ev = f.job_inactive("j2", Outcome::Succeeded, true);
    assert!(ready(&ev, "j3"));
}

/// RFC 26 Example 2: depend on a system job in global scope.
#[test]
fn rfc26_example2_global_in() {
    let mut f = FluxDeps::new();
    f.submit(
        "dat",
        "root",
        true,
        &[d("string:dat-window?type=out&scope=global")],
        0.0,
    )
    .expect("owner");
    let ev = f
        .submit(
            "mine",
            "alice",
            false,
            &[d("string:dat-window?type=in&scope=global")],
            0.0,
        )
        .expect("in");
    assert!(!ready(&ev, "mine"));
    let ev = f.job_inactive("dat", Outcome::Succeeded, true);
    assert!(ready(&ev, "mine"));
}

/// RFC 26 Example 3: fan-out / fan-in A -> B B B -> C.
#[test]
fn rfc26_example3_fan_out_fan_in() {
    let mut f = FluxDeps::new();
    submit(&mut f, "A", &["string:A?type=out&scope=user"]);
    for b in ["B1", "B2", "B3"] {
        assert!(!ready(
            &submit(
                &mut f,
                b,
                &[
                    "string:A?type=in&scope=user",
                    "string:B?type=out&scope=user"
                ]
            ),
            b
        ));
    }
    assert!(!ready(
        &submit(&mut f, "C", &["string:B?type=in&scope=user"]),
        "C"
    ));
    let ev = f.job_inactive("A", Outcome::Succeeded, true);
    assert!(ready(&ev, "B1") && ready(&ev, "B2") && ready(&ev, "B3"));
    assert!(!ready(&f.job_inactive("B1", Outcome::Succeeded, true), "C"));
    assert!(!ready(&f.job_inactive("B2", Outcome::Succeeded, true), "C"));
    assert!(ready(&f.job_inactive("B3", Outcome::Succeeded, true), "C"));
}

#[test]
fn string_scope_user_is_per_user_and_failed_writer_is_fatal() {
    let mut f = FluxDeps::new();
    f.submit("a", "alice", false, &[d("string:x?type=out")], 0.0)
        .expect("a");
    let ev = f
        .submit("b", "bob", false, &[d("string:x?type=in")], 0.0)
        .expect("b");
    assert!(
        ready(&ev, "b"),
        "bob does not see alice's user-scoped symbol"
    );
    let ev = f
        .submit("c", "alice", false, &[d("string:x?type=in")], 0.0)
        .expect("c");
    assert!(!ready(&ev, "c"));
    let ev = f.job_inactive("a", Outcome::Failed { exit: 3 }, true);
    let why = fatal(&ev, "c").expect("fatal");
    assert!(
        why.contains("string:x") && why.contains("failed with exit code 3"),
        "{why}"
    );
}
