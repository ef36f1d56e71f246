//! Dependency-string parsers: Lattice, Slurm, Flux RFC 26 command line; task-group ranges.
use lattice_dag::deps::{
    parse_depends_on, parse_flux_dependency, parse_flux_uri, parse_slurm_dependency, Condition,
    Dependency, FluxDependency, SymbolAccess, SymbolScope,
};
use lattice_dag::taskgroup::{parse_task_group, parse_task_group_with_limit, TaskGroupRun};
use lattice_dag::Outcome;
use proptest::prelude::*;

fn on(t: &str, c: Condition) -> Dependency {
    Dependency::on(t, c)
}

#[test]
fn lattice_depends_on() {
    let ok: &[(&str, Vec<Dependency>)] = &[
        ("a1b2c3d4:success", vec![on("a1b2c3d4", Condition::Success)]),
        ("a1b2c3d4:any", vec![on("a1b2c3d4", Condition::Any)]),
        (
            "job1:success,job2:success",
            vec![
                on("job1", Condition::Success),
                on("job2", Condition::Success),
            ],
        ),
        ("x", vec![on("x", Condition::Success)]),
        (
            "x:failure, y:corresponding",
            vec![
                on("x", Condition::Failure),
                on("y", Condition::Corresponding),
            ],
        ),
        ("gpu-lock:mutex", vec![Dependency::mutex("gpu-lock")]),
    ];
    for (s, want) in ok {
        assert_eq!(&parse_depends_on(s).expect(s), want, "{s}");
    }
    let bad: &[(&str, usize, &str)] = &[
        ("", 0, "is empty"),
        ("a:success,,b", 10, "empty entry"),
        ("a:sucess", 2, "unknown condition"),
        ("a:afterok", 2, "unknown condition"),
        (":success", 0, "missing allocation id"),
        ("a b:success", 1, "unexpected character"),
        ("a:", 2, "unknown condition"),
        ("a:started", 2, "unknown condition"),
    ];
    for (s, pos, msg) in bad {
        let e = parse_depends_on(s).expect_err(s);
        assert_eq!(e.position, *pos, "{s}: {e}");
        assert!(e.message.contains(msg), "{s}: {e}");
        assert!(!e.hint.is_empty());
    }
    let e = parse_depends_on("a:afterok").expect_err("slurm");
    assert!(e.hint.contains("a:success"), "{}", e.hint);
    let text = parse_depends_on("job1:succes").expect_err("x").to_string();
    assert!(
        text.contains("column 6") && text.contains("\n       ^") && text.contains("Hint:"),
        "{text}"
    );
}

#[test]
fn slurm_dependency() {
    let ok: &[(&str, Vec<Dependency>)] = &[
        ("afterok:123", vec![on("123", Condition::Success)]),
        (
            "afterok:123:124",
            vec![on("123", Condition::Success), on("124", Condition::Success)],
        ),
        ("afternotok:5", vec![on("5", Condition::Failure)]),
        (
            "afterany:5,aftercorr:6",
            vec![on("5", Condition::Any), on("6", Condition::Corresponding)],
        ),
        ("after:7", vec![on("7", Condition::Started)]),
        (
            "after:7+10:8",
            vec![
                Dependency::Allocation {
                    target: "7".into(),
                    condition: Condition::Started,
                    delay_seconds: Some(600),
                },
                on("8", Condition::Started),
            ],
        ),
        ("singleton", vec![Dependency::mutex("nightly")]),
        ("afterok:123_4", vec![on("123_4", Condition::Success)]),
    ];
    for (s, want) in ok {
        assert_eq!(
            &parse_slurm_dependency(s, Some("nightly")).expect(s),
            want,
            "{s}"
        );
    }
    let bad: &[(&str, usize, &str)] = &[
        ("afterok:1?afterany:2", 9, "'?'"),
        ("afterok", 7, "needs at least one job id"),
        ("afterok:", 8, "needs at least one job id"),
        ("afterok:1::2", 10, "empty job id"),
        ("afterok:1+5", 9, "only allowed with `after`"),
        ("after:1+x", 8, "invalid time offset"),
        ("afterfoo:1", 0, "unknown dependency type"),
        ("success:1", 0, "Lattice condition"),
        ("afterburstbuffer:1", 0, "not supported"),
        ("singleton:1", 9, "takes no job ids"),
        ("afterok:1,,afterok:2", 10, "empty dependency"),
        ("afterok:1 2", 9, "unexpected character"),
    ];
    for (s, pos, msg) in bad {
        let e = parse_slurm_dependency(s, Some("n")).expect_err(s);
        assert_eq!(e.position, *pos, "{s}: {e}");
        assert!(e.message.contains(msg), "{s}: {e}");
    }
    let e = parse_slurm_dependency("singleton", None).expect_err("no name");
    assert!(e.hint.contains("--job-name"));
}

/// RFC 26 "on command line" and "Simple Dependencies": one test per scheme.
#[test]
fn rfc26_command_line_per_scheme() {
    let cases: &[(&str, Dependency)] = &[
        ("after:ƒ2oLkTLb", on("ƒ2oLkTLb", Condition::Started)),
        ("afterany:ƒ2oLkTLb", on("ƒ2oLkTLb", Condition::Any)),
        ("afterok:1234", on("1234", Condition::Success)),
        ("afternotok:0x1f", on("0x1f", Condition::Failure)),
        (
            "begin-time:1700000000.25",
            Dependency::BeginTime {
                epoch_seconds: 1_700_000_000.25,
            },
        ),
        (
            "begin-time:17",
            Dependency::BeginTime {
                epoch_seconds: 17.0,
            },
        ),
        (
            "string:foo?type=out",
            Dependency::Symbol {
                name: "foo".into(),
                access: SymbolAccess::Out,
                scope: SymbolScope::User,
            },
        ),
        (
            "string:foo?type=in&scope=global",
            Dependency::Symbol {
                name: "foo".into(),
                access: SymbolAccess::In,
                scope: SymbolScope::Global,
            },
        ),
        (
            "string:foo?type=inout;scope=user",
            Dependency::Symbol {
                name: "foo".into(),
                access: SymbolAccess::Inout,
                scope: SymbolScope::User,
            },
        ),
    ];
    for (s, want) in cases {
        assert_eq!(&parse_flux_dependency(s).expect(s), want, "{s}");
        // Translate to the object form and back.
        let obj = parse_flux_uri(s).expect(s);
        let json = serde_json::to_value(&obj).expect("json");
        assert_eq!(json["scheme"], s.split(':').next().unwrap_or_default());
        assert!(json["value"].is_string());
        let back: FluxDependency = serde_json::from_value(json).expect("back");
        assert_eq!(&back.to_dependency().expect("dep"), want);
        assert_eq!(
            want.to_flux()
                .expect("flux form")
                .to_dependency()
                .expect("again"),
            *want
        );
    }
    // The object form from the RFC's examples.
    let obj: FluxDependency = serde_json::from_value(serde_json::json!(
        {"type": "inout", "scope": "user", "scheme": "string", "value": "foo"}
    ))
    .expect("obj");
    assert_eq!(
        obj.to_dependency().expect("dep"),
        Dependency::Symbol {
            name: "foo".into(),
            access: SymbolAccess::Inout,
            scope: SymbolScope::User
        }
    );
    let fluid: FluxDependency = serde_json::from_value(serde_json::json!(
        {"type": "in", "scope": "global", "scheme": "fluid", "value": "hungry-hippo-white-elephant"}
    ))
    .expect("obj");
    assert!(fluid
        .to_dependency()
        .expect_err("reserved")
        .contains("reserved"));
    // Object form without scope: REQUIRED by the RFC.
    let noscope = FluxDependency {
        scheme: "string".into(),
        value: "x".into(),
        options: [("type".to_string(), "in".to_string())].into(),
    };
    assert!(noscope
        .to_dependency()
        .expect_err("scope")
        .contains("scope"));
}

#[test]
fn rfc26_command_line_errors() {
    let bad: &[(&str, &str)] = &[
        ("afterok", "missing ':'"),
        (":123", "missing scheme"),
        ("afterok:", "missing value"),
        ("nosuch:1", "unknown scheme"),
        ("fluid:hungry-hippos", "reserved"),
        ("begin-time:soon", "not a number"),
        ("begin-time:inf", "finite"),
        ("begin-time:-5", "non-negative"),
        ("string:foo", "requires type"),
        ("string:foo?type=sideways", "not one of in, out, inout"),
        ("string:foo?type=in&scope=team", "not one of user, global"),
        ("string:foo?type=in&type=out", "given twice"),
        ("string:foo?type", "not key=val"),
        ("afterok:1?type=in", "does not take key"),
        ("string:foo?type=in&color=red", "does not take key"),
    ];
    for (s, msg) in bad {
        let e = parse_flux_uri(s).expect_err(s);
        assert!(e.message.contains(msg), "{s}: {e}");
        assert!(e.position <= s.len());
        assert!(e.to_string().contains("Hint:"));
    }
}

#[test]
fn dependency_serde_is_camel_case() {
    let d = Dependency::Allocation {
        target: "a".into(),
        condition: Condition::Started,
        delay_seconds: Some(60),
    };
    let j = serde_json::to_value(&d).expect("json");
    assert_eq!(
        j,
        serde_json::json!({"kind": "allocation", "ref": "a", "condition": "started", "delaySeconds": 60})
    );
    let b = Dependency::BeginTime { epoch_seconds: 1.5 };
    assert_eq!(
        serde_json::to_value(&b).expect("json"),
        serde_json::json!({"kind": "beginTime", "epochSeconds": 1.5})
    );
    let s = Dependency::Symbol {
        name: "x".into(),
        access: SymbolAccess::In,
        scope: SymbolScope::Global,
    };
    let j = serde_json::to_value(&s).expect("json");
    assert_eq!(
        j,
        serde_json::json!({"kind": "symbol", "name": "x", "type": "in", "scope": "global"})
    );
    for d in [d, b, s] {
        let t = serde_json::to_string(&d).expect("s");
        assert_eq!(serde_json::from_str::<Dependency>(&t).expect("d"), d);
    }
}

#[test]
fn task_group_ranges() {
    let cases: &[(&str, Vec<u64>, Option<u32>)] = &[
        ("0-3", vec![0, 1, 2, 3], None),
        ("0-99%20", (0..100).collect(), Some(20)),
        ("1,3,5-9:2", vec![1, 3, 5, 7, 9], None),
        ("0-15:4%2", vec![0, 4, 8, 12], Some(2)),
        ("7", vec![7], None),
        ("3,1,2-3", vec![1, 2, 3], None),
        // The API's grammar (what admission stores): blanks around entries, a step on
        // a single index.
        (" 0-2 , 5 %2", vec![0, 1, 2, 5], Some(2)),
        ("3:2", vec![3], None),
    ];
    for (s, idx, c) in cases {
        let g = parse_task_group(s).expect(s);
        assert_eq!(&g.indices, idx, "{s}");
        assert_eq!(g.concurrency, *c, "{s}");
    }
    let bad: &[(&str, usize, &str)] = &[
        ("", 0, "empty"),
        ("5-1", 0, "ends before"),
        ("0-9:0", 4, "step must be"),
        ("0-9%0", 4, "at least 1"),
        ("0-9%x", 4, "invalid concurrency"),
        ("1,,2", 2, "empty range"),
        ("a-3", 0, "non-negative integer"),
        ("1-b", 2, "non-negative integer end"),
        ("0-9,1000000000", 4, "too large"),
        ("0-99999999999", 0, "more than"),
    ];
    for (s, pos, msg) in bad {
        let e = parse_task_group(s).expect_err(s);
        assert_eq!(e.position, *pos, "{s}: {e}");
        assert!(e.message.contains(msg), "{s}: {e}");
    }
    assert!(parse_task_group_with_limit("0-9", 5).is_err());
}

#[test]
fn task_group_lazy_release() {
    let g = parse_task_group("0-9%3").expect("g");
    let mut run = TaskGroupRun::new(&g);
    run.open_all();
    assert_eq!(run.pump(), vec![0, 1, 2]);
    assert!(run.pump().is_empty(), "at most 3 pending-or-running");
    run.started(0).expect("s");
    run.requeued(0).expect("rq");
    assert_eq!(run.status().pending, 3);
    assert!(run.finished(1, Outcome::Failed { exit: 4 }).expect("f"));
    assert!(
        !run.finished(1, Outcome::Succeeded).expect("dup"),
        "duplicate ignored"
    );
    assert_eq!(run.pump(), vec![3]);
    assert!(
        run.finished(5, Outcome::Succeeded).is_err(),
        "never released"
    );
    assert!(
        run.finished(99, Outcome::Succeeded).is_err(),
        "unknown index"
    );
    let mut done = vec![0, 2, 3];
    while let Some(i) = done.pop() {
        run.finished(i, Outcome::Succeeded).expect("ok");
        done.extend(run.pump());
        assert!(run.in_flight() <= 3);
    }
    assert!(run.is_done());
    assert_eq!(run.outcome(), Some(Outcome::Failed { exit: 4 }));
    let s = run.status();
    assert_eq!((s.total, s.succeeded, s.failed), (10, 9, 1));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, .. ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic(s in "\\PC{0,64}") {
        for r in [parse_depends_on(&s).map(|_| ()), parse_slurm_dependency(&s, Some("n")).map(|_| ()),
                  parse_flux_uri(&s).map(|_| ()), parse_task_group(&s).map(|_| ())] {
            if let Err(e) = r {
                prop_assert!(e.position <= s.len());
                prop_assert!(!e.message.is_empty() && !e.hint.is_empty());
                let _ = e.to_string();
            }
        }
    }

    #[test]
    fn parsers_grammar_fuzz(s in "[a-z0-9:,?+%&=;_ .-]{0,40}") {
        for r in [parse_depends_on(&s).map(|_| ()), parse_slurm_dependency(&s, None).map(|_| ()),
                  parse_flux_dependency(&s).map(|_| ()), parse_task_group(&s).map(|_| ())] {
            if let Err(e) = r {
                prop_assert!(e.position <= s.len());
                prop_assert!(e.column() >= 1);
            }
        }
    }

    #[test]
    fn depends_on_round_trip(items in proptest::collection::vec(("[a-z0-9][a-z0-9-]{0,8}", 0usize..5), 1..6)) {
        let conds = ["success", "failure", "any", "corresponding", "mutex"];
        let text = items.iter().map(|(id, c)| format!("{id}:{}", conds[*c])).collect::<Vec<_>>().join(",");
        let parsed = parse_depends_on(&text).expect("valid");
        prop_assert_eq!(parsed.len(), items.len());
        let again = parsed.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
        prop_assert_eq!(again, text);
    }

    #[test]
    fn task_group_matches_naive_expansion(segs in proptest::collection::vec((0u64..50, 0u64..20, 1u64..5), 1..4)) {
        let text = segs.iter().map(|(a, l, s)| format!("{a}-{}:{s}", a + l)).collect::<Vec<_>>().join(",");
        let g = parse_task_group(&text).expect("valid");
        let mut want: Vec<u64> = segs.iter().flat_map(|(a, l, s)| (*a..=a + l).step_by(*s as usize)).collect();
        want.sort_unstable();
        want.dedup();
        prop_assert_eq!(g.indices, want);
    }
}
