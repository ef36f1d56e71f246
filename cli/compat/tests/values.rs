//! Value parsers: every walltime, array, constraint, gres, nodes and dependency form.

use lattice_compat::values::*;

fn secs(s: &str) -> u64 {
    match parse_walltime(s) {
        Ok(Walltime::Seconds(x)) => x,
        other => panic!("{s}: {other:?}"),
    }
}

#[test]
fn every_slurm_time_form() {
    assert_eq!(secs("30"), 30 * 60); // minutes
    assert_eq!(secs("30:15"), 30 * 60 + 15); // minutes:seconds
    assert_eq!(secs("2:30:15"), 2 * 3600 + 30 * 60 + 15); // hours:minutes:seconds
    assert_eq!(secs("72:00:00"), 72 * 3600);
    assert_eq!(secs("1-12"), 36 * 3600); // days-hours
    assert_eq!(secs("1-12:30"), 36 * 3600 + 30 * 60); // days-hours:minutes
    assert_eq!(secs("2-00:00:30"), 48 * 3600 + 30); // days-hours:minutes:seconds
                                                    // Slurm does not range-check fields
    assert_eq!(secs("0:90"), 90);
    assert_eq!(secs("90"), 5400);
    assert_eq!(secs("2-"), 2 * 86400); // sscanf("%d-%d:%d:%d") leaves the hours at 0
    for u in [
        "UNLIMITED",
        "unlimited",
        "INFINITE",
        "Infinite",
        "-1",
        "0",
        "00:00:00",
    ] {
        assert_eq!(parse_walltime(u).unwrap(), Walltime::Unlimited, "{u}");
    }
}

#[test]
fn every_lattice_time_form() {
    assert_eq!(secs("24h"), 86400);
    assert_eq!(secs("30m"), 1800);
    assert_eq!(secs("90s"), 90);
    assert_eq!(secs("2d"), 172800);
    assert_eq!(secs("1h30m"), 5400);
    assert_eq!(secs("1d2h3m4s"), 93784);
    assert_eq!(secs("12:00:00"), 43200);
    assert_eq!(secs("1-12:00:00"), 129600);
}

#[test]
fn bad_times() {
    for b in [
        "",
        "abc",
        "1:2:3:4",
        "1-2-3",
        "1-2:3:4:5",
        ":30",
        "30:",
        "1h1h",
        "m30",
        "-5",
        "1.5h",
        "24H30X",
        "1--2",
        "400d",
    ] {
        let e = parse_walltime(b).unwrap_err();
        assert!(!e.hint.is_empty(), "{b}");
    }
    assert_eq!(Walltime::Seconds(3725).to_hms().unwrap(), "01:02:05");
    assert_eq!(Walltime::Seconds(100 * 3600).to_hms().unwrap(), "100:00:00");
}

#[test]
fn every_array_form() {
    let a = parse_array("0-15").unwrap();
    assert_eq!((a.range.as_str(), a.limit, a.count()), ("0-15", None, 16));
    let a = parse_array("0,6,16-32").unwrap();
    assert_eq!((a.range.as_str(), a.count()), ("0,6,16-32", 19));
    let a = parse_array("0-15:4").unwrap();
    assert_eq!(a.indices_capped(100), vec![0, 4, 8, 12]);
    let a = parse_array("0-15%4").unwrap();
    assert_eq!((a.range.as_str(), a.limit), ("0-15", Some(4)));
    let a = parse_array("1,3,5-11:2%2").unwrap();
    assert_eq!(
        (a.range.as_str(), a.limit, a.count()),
        ("1,3,5-11:2", Some(2), 6)
    );
    let a = parse_array("0-99%20").unwrap();
    assert_eq!((a.count(), a.limit), (100, Some(20)));
    let a = parse_array("7").unwrap();
    assert_eq!(a.range, "7");
    for b in [
        "",
        "5-1",
        "0-15:0",
        "a-b",
        "0-10%",
        "0-10%0",
        "%5",
        "1,,2",
        "0-99999999999",
        "0-200000",
    ] {
        assert!(parse_array(b).is_err(), "{b}");
    }
}

#[test]
fn nodes_forms() {
    assert_eq!(parse_nodes("4").unwrap(), NodeCount::Exact(4));
    assert_eq!(
        parse_nodes("2-8").unwrap(),
        NodeCount::Range { min: 2, max: 8 }
    );
    assert_eq!(parse_nodes("3-3").unwrap(), NodeCount::Exact(3));
    assert_eq!(parse_nodes("1k").unwrap(), NodeCount::Exact(1024));
    for b in ["0", "", "x", "8-2", "1,2", "-3", "200000"] {
        assert!(parse_nodes(b).is_err(), "{b}");
    }
}

#[test]
fn every_constraint_form() {
    use ConstraintExpr::*;
    let f = |n: &str| Feature {
        name: n.into(),
        count: None,
    };
    assert_eq!(parse_constraint("gpu").unwrap(), f("gpu"));
    assert_eq!(
        parse_constraint("gpu&nvme").unwrap(),
        And {
            items: vec![f("gpu"), f("nvme")]
        }
    );
    assert_eq!(
        parse_constraint("a|b").unwrap(),
        Or {
            items: vec![f("a"), f("b")],
            matching: false
        }
    );
    assert_eq!(
        parse_constraint("[a|b]").unwrap(),
        Or {
            items: vec![f("a"), f("b")],
            matching: true
        }
    );
    assert_eq!(
        parse_constraint("gpu*4").unwrap(),
        Feature {
            name: "gpu".into(),
            count: Some(4)
        }
    );
    assert_eq!(
        parse_constraint("[rack1*2&rack2*4]").unwrap(),
        And {
            items: vec![
                Feature {
                    name: "rack1".into(),
                    count: Some(2)
                },
                Feature {
                    name: "rack2".into(),
                    count: Some(4)
                }
            ]
        }
    );
    assert_eq!(
        parse_constraint("(a|b)&c").unwrap(),
        And {
            items: vec![
                Or {
                    items: vec![f("a"), f("b")],
                    matching: false
                },
                f("c")
            ]
        }
    );
    assert_eq!(
        parse_constraint("gpu_type=GH200,gpu_count=4").unwrap(),
        And {
            items: vec![
                Compare {
                    key: "gpu_type".into(),
                    cmp: "=".into(),
                    value: "GH200".into()
                },
                Compare {
                    key: "gpu_count".into(),
                    cmp: "=".into(),
                    value: "4".into()
                }
            ]
        }
    );
    assert_eq!(
        parse_constraint("memory_gb>=512").unwrap(),
        Compare {
            key: "memory_gb".into(),
            cmp: ">=".into(),
            value: "512".into()
        }
    );
    assert_eq!(
        parse_constraint(" a & b ").unwrap(),
        And {
            items: vec![f("a"), f("b")]
        }
    );
    for b in [
        "", "&a", "a&", "[a|b", "a)", "a*", "a*x", "k>5", "k<=5", "a!b", "x=", "a$b",
    ] {
        let e = parse_constraint(b).unwrap_err();
        assert!(!e.hint.is_empty(), "{b}");
    }
}

#[test]
fn gres_forms() {
    let g = parse_gres("gpu:4").unwrap();
    assert_eq!((g.gpu_type, g.gpu_count), (None, Some(4)));
    let g = parse_gres("gpu:a100:2").unwrap();
    assert_eq!(
        (g.gpu_type.as_deref(), g.gpu_count),
        (Some("a100"), Some(2))
    );
    let g = parse_gres("gpu").unwrap();
    assert_eq!(g.gpu_count, Some(1));
    let g = parse_gres("gpu:tesla").unwrap();
    assert_eq!(
        (g.gpu_type.as_deref(), g.gpu_count),
        (Some("tesla"), Some(1))
    );
    let g = parse_gres("gpu:4,nvme:1").unwrap();
    assert_eq!(g.other, vec!["nvme:1"]);
    let g = parse_gres("gpu:a100:4(S:0-1)").unwrap();
    assert_eq!(g.gpu_count, Some(4));
    assert_eq!(parse_gres("none").unwrap().gpu_count, None);
    for b in ["", "gpu:0", "gpu:a:b:c", ":4", "gpu:100", "gpu:2,gpu:3"] {
        assert!(parse_gres(b).is_err(), "{b}");
    }
}

/// Slurm's `?` (any of), `+MINUTES` (delay) and `ID_TASK` (one array task), alone and
/// combined, become edge options; malformed ones are errors.
#[test]
fn dependency_any_of_delay_and_array_task_forms() {
    let e =
        |target: &str, c: DepCondition, task: Option<u64>, delay: Option<u64>, any: bool| DepEdge {
            task,
            delay_seconds: delay,
            any_of: any,
            ..DepEdge::new(target, c)
        };
    use DepCondition::*;
    let rows: Vec<(&str, Vec<DepEdge>)> = vec![
        (
            "afterok:1+5?afterany:2_3",
            vec![
                e("1", Success, None, Some(300), true),
                e("2", Any, Some(3), None, true),
            ],
        ),
        (
            "after:7_2+1",
            vec![e("7", Started, Some(2), Some(60), false)],
        ),
        (
            "afterok:1+5:2,afternotok:3_0+10",
            vec![
                e("1", Success, None, Some(300), false),
                e("2", Success, None, None, false),
                e("3", Failure, Some(0), Some(600), false),
            ],
        ),
        (
            "afterany:job-a+2:job-b_4?after:job-c+0",
            vec![
                e("job-a", Any, None, Some(120), true),
                e("job-b", Any, Some(4), None, true),
                e("job-c", Started, None, None, true),
            ],
        ),
        // One array task and the whole array are different dependencies.
        (
            "afterok:8_1:8:8_2",
            vec![
                e("8", Success, Some(1), None, false),
                e("8", Success, None, None, false),
                e("8", Success, Some(2), None, false),
            ],
        ),
        ("AFTEROK:9+1", vec![e("9", Success, None, Some(60), false)]),
    ];
    for (text, edges) in rows {
        let d = parse_slurm_dependency(text).unwrap_or_else(|err| panic!("{text}: {err}"));
        assert_eq!(d.edges, edges, "{text}");
        assert!(d.notes.is_empty(), "{text}: {:?}", d.notes);
        assert_eq!(d.any_of, text.contains('?'), "{text}");
        let slurm: Vec<String> = d.edges.iter().map(DepEdge::slurm).collect();
        let sep = if d.any_of { "?" } else { "," };
        let again = parse_slurm_dependency(&slurm.join(sep)).unwrap();
        assert_eq!(
            again
                .edges
                .iter()
                .map(|e| (e.target.clone(), e.task, e.any_of))
                .collect::<Vec<_>>(),
            d.edges
                .iter()
                .map(|e| (e.target.clone(), e.task, e.any_of))
                .collect::<Vec<_>>(),
            "{text}"
        );
    }
    // singleton among alternatives is one; a required singleton wins.
    let d = parse_slurm_dependency("singleton?afterok:1").unwrap();
    assert!(d.singleton && d.singleton_any_of && d.edges[0].any_of);
    let mut d = parse_slurm_dependency("singleton?afterok:1").unwrap();
    d.merge(parse_slurm_dependency("singleton").unwrap())
        .unwrap();
    assert!(d.singleton && !d.singleton_any_of);
    // A merged ',' list stays required next to a '?' list; two '?' lists are refused.
    let mut d = parse_depends_on("a:success").unwrap();
    d.merge(parse_slurm_dependency("afterok:b?afterok:c").unwrap())
        .unwrap();
    let e = d
        .clone()
        .merge(parse_slurm_dependency("afterok:x?afterok:y").unwrap())
        .unwrap_err();
    assert!(e.message.contains("two '?'"), "{e}");
    assert_eq!(
        d.edges
            .iter()
            .map(|e| (e.target.as_str(), e.any_of))
            .collect::<Vec<_>>(),
        [("a", false), ("b", true), ("c", true)]
    );
    // The manifest entries.
    let d = parse_slurm_dependency("afterok:1+5?afterany:2_3?singleton").unwrap();
    let (entries, notes) = d.depends_on(false);
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(
        serde_json::Value::Array(entries),
        serde_json::json!([
            {"ref": "1", "condition": "success", "delay": "5m", "anyOf": true},
            {"ref": "2", "condition": "any", "taskIndex": 3, "anyOf": true},
            {"singleton": true, "anyOf": true},
        ])
    );
    for (bad, needle) in [
        ("afterok:1_x", "array task"),
        ("afterok:1_", "array task"),
        ("afterok:_3", "not a job id"),
        ("afterok:1_2_3", "array task"),
        ("afterok:1_1234567890", "array task"),
        ("afterok:1+", "time offset"),
        ("afterok:1+x", "time offset"),
        ("afterany:1+-5", "time offset"),
        ("afterok:2:1+5m", "time offset"),
        ("afterok:+5", "job id"),
        ("afterok:1+5+5", "time offset"),
        ("after:1+527041", "366 days"),
        ("afterok:1+527041", "366 days"),
        ("afterok:1+99999999999999999999", "time offset"),
        ("aftercorr:1?afterok:2", "'?' alternatives"),
        ("aftercorr:1+5", "only allowed with `after`"),
        ("afterok:1+5,afterok:2?afterok:3", "cannot be mixed"),
        ("afterok:1+5?", "empty entry"),
        ("afterok:a+1:B", "not a job id"),
    ] {
        match parse_slurm_dependency(bad) {
            Ok(d) => panic!("{bad}: accepted as {d:?}"),
            Err(e) => assert!(e.to_string().contains(needle), "{bad}: {e}"),
        }
    }
    // Errors in a delayed list point at the right column.
    let e = parse_slurm_dependency("afterok:1+5:a$b").unwrap_err();
    assert!(e.message.contains("column 14"), "{e}");
    let e = parse_slurm_dependency("afterok:1+x").unwrap_err();
    assert!(e.message.contains("column 11"), "{e}");
}

#[test]
fn dependency_forms() {
    let d = parse_slurm_dependency("afterok:123").unwrap();
    assert_eq!(d.edges, vec![DepEdge::new("123", DepCondition::Success)]);
    let d = parse_slurm_dependency("afterok:1:2,afterany:3,afternotok:4,aftercorr:5").unwrap();
    let c: Vec<_> = d
        .edges
        .iter()
        .map(|e| (e.target.as_str(), e.condition))
        .collect();
    assert_eq!(
        c,
        vec![
            ("1", DepCondition::Success),
            ("2", DepCondition::Success),
            ("3", DepCondition::Any),
            ("4", DepCondition::Failure),
            ("5", DepCondition::Corresponding)
        ]
    );
    let d = parse_slurm_dependency("after:7+10").unwrap();
    assert_eq!(d.edges[0].condition, DepCondition::Started);
    assert_eq!(d.edges[0].delay_seconds, Some(600));
    assert!(d.notes.is_empty(), "{:?}", d.notes);
    let d = parse_slurm_dependency("afterok:8_3").unwrap();
    assert_eq!(
        (d.edges[0].target.as_str(), d.edges[0].task),
        ("8", Some(3))
    );
    let d = parse_slurm_dependency("afterok:1?afterok:2").unwrap();
    assert!(d.any_of);
    assert!(d.edges.iter().all(|e| e.any_of));
    assert!(parse_slurm_dependency("singleton").unwrap().singleton);
    for b in [
        "",
        "afterok",
        "afterok:",
        "before:1",
        "afterok:1,afterok:2?afterok:3",
        "afterok:AB",
        "after:1+x",
    ] {
        assert!(parse_slurm_dependency(b).is_err(), "{b}");
    }
    assert!(!parse_slurm_dependency("afterok:1:2,afterany:3")
        .unwrap()
        .edges
        .iter()
        .any(|e| e.any_of || e.task.is_some() || e.delay_seconds.is_some()));
    let d = parse_depends_on("a1b2c3d4:success,job2:any,job3").unwrap();
    let c: Vec<_> = d.edges.iter().map(|e| e.condition).collect();
    assert_eq!(
        c,
        vec![
            DepCondition::Success,
            DepCondition::Any,
            DepCondition::Success
        ]
    );
    assert_eq!(parse_depends_on("afterok:9").unwrap().edges[0].target, "9");
    assert!(parse_depends_on("x:maybe").is_err());
}

#[test]
fn other_values() {
    let m = parse_data_mount("s3://bucket/dataset:/data").unwrap();
    assert_eq!(
        (m.source.as_str(), m.target.as_str(), m.read_write),
        ("s3://bucket/dataset", "/data", false)
    );
    assert!(parse_data_mount("/store/x:/out:rw").unwrap().read_write);
    assert!(parse_data_mount("nocolon").is_err());
    let e = parse_expose("http:8080").unwrap();
    assert_eq!((e.name.as_str(), e.port), ("http", 8080));
    assert!(parse_expose("53/udp").unwrap().udp);
    assert!(parse_expose("99999").is_err());
    assert_eq!(
        parse_env_pair("A_B=1=2").unwrap(),
        ("A_B".into(), "1=2".into())
    );
    assert!(parse_env_pair("1A=x").is_err());
    assert_eq!(parse_checkpoint("Signal").unwrap(), "signal");
    assert!(parse_checkpoint("sometimes").is_err());
    assert_eq!(parse_preemption_class("10").unwrap(), 10);
    assert!(parse_preemption_class("11").is_err());
    assert_eq!(
        parse_scale_target("100ms").unwrap(),
        serde_json::json!("100ms")
    );
}

#[test]
fn begin_forms() {
    use chrono::{Local, TimeZone};
    // 2025-06-01 12:00:00 local time.
    let now = Local
        .with_ymd_and_hms(2025, 6, 1, 12, 0, 0)
        .single()
        .expect("local time");
    let at = |y, mo, d, h, mi, s| {
        Local
            .with_ymd_and_hms(y, mo, d, h, mi, s)
            .single()
            .expect("local time")
            .timestamp()
    };
    let n = now.timestamp();
    let cases: Vec<(&str, i64)> = vec![
        ("now", n),
        ("now+60", n + 60),
        ("now+90seconds", n + 90),
        ("now+10minutes", n + 600),
        ("now+1hour", n + 3600),
        ("NOW+2days", n + 2 * 86_400),
        ("now+1week", n + 604_800),
        ("16:00", at(2025, 6, 1, 16, 0, 0)),
        ("11:30:15", at(2025, 6, 2, 11, 30, 15)), // passed today: tomorrow
        ("2026-01-20", at(2026, 1, 20, 0, 0, 0)),
        ("2026-01-20T12:34", at(2026, 1, 20, 12, 34, 0)),
        ("2026-01-20T12:34:56", at(2026, 1, 20, 12, 34, 56)),
        ("12/24", at(2025, 12, 24, 0, 0, 0)),
        ("12/24/26-08:00", at(2026, 12, 24, 8, 0, 0)),
        ("01/02", at(2026, 1, 2, 0, 0, 0)), // passed this year: next year
        ("midnight", at(2025, 6, 2, 0, 0, 0)),
        ("noon", at(2025, 6, 1, 12, 0, 0)), // not passed yet: now
        ("teatime", at(2025, 6, 1, 16, 0, 0)),
        ("today", at(2025, 6, 1, 0, 0, 0)),
        ("tomorrow", at(2025, 6, 2, 0, 0, 0)),
    ];
    for (s, want) in cases {
        assert_eq!(
            parse_begin(s, now).map_err(|e| e.to_string()),
            Ok(want),
            "{s}"
        );
    }
    for bad in [
        "",
        "soon",
        "now+",
        "now-1hour",
        "now+1fortnight",
        "25:00",
        "2026-13-01",
        "13/45",
        "12:3x",
    ] {
        let e = parse_begin(bad, now).expect_err(bad);
        assert!(e.hint.contains("now+N"), "{bad}: {e}");
    }
}
