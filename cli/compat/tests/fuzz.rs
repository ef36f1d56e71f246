//! Property tests: the directive parser and the value parsers never panic,
//! and script errors always name the line.

use lattice_compat::directives::scan_script;
use lattice_compat::values::*;
use lattice_compat::{translate, CompatConfig, SubmitFlags};
use proptest::prelude::*;

fn directive_line() -> impl Strategy<Value = String> {
    let opts = prop::sample::select(vec![
        "--nodes",
        "-N",
        "--time",
        "-t",
        "--array",
        "--constraint",
        "-C",
        "--gres",
        "--dependency",
        "-d",
        "--mem",
        "--partition",
        "-p",
        "--qos",
        "--account",
        "--job-name",
        "-J",
        "--ntasks",
        "--ntasks-per-node",
        "--exclusive",
        "--n",
        "--ti",
        "--export",
        "--gpus",
        "--output",
        "--uenv",
        "--view",
        "--nodes=",
        "-",
        "--",
        "hetjob",
        "walltime=",
    ]);
    let vals = prop_oneof![
        "[ -~]{0,16}".boxed(),
        prop::sample::select(vec![
            "4",
            "2-8",
            "0",
            "1k",
            "gpu:4",
            "gpu:a100:2",
            "0-99%20",
            "0-15:4",
            "1,3,5-7",
            "afterok:12",
            "afterany:1:2,afternotok:3",
            "singleton",
            "UNLIMITED",
            "1-12:00",
            "30",
            "24h",
            "high",
            "gpu",
            "debug",
            "a100|h100",
            "[a|b]",
            "gpu*2&ib",
            "gpu_type=GH200,gpu_count=4",
            "memory_gb>=512",
            "ALL,A=1",
            "prgenv-gnu/24.11:v1",
            "default",
            "physics",
            "my job",
        ])
        .prop_map(str::to_string)
        .boxed(),
    ];
    let magic = prop::sample::select(vec![
        "#SBATCH ",
        "#SBATCH",
        "#LATTICE ",
        "# SBATCH ",
        "  #SBATCH ",
        "#SBATCH\t",
    ]);
    (magic, opts, prop::option::of(vals), prop::bool::ANY).prop_map(|(m, o, v, eq)| match v {
        Some(v) if eq => format!("{m}{o}={v}"),
        Some(v) => format!("{m}{o} {v}"),
        None => format!("{m}{o}"),
    })
}

/// 400 cases by default; `PROPTEST_CASES=N` for longer runs.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

fn site() -> CompatConfig {
    CompatConfig::from_yaml(
        "partitions: {gpu: ml-training}\nqos: {high: 7}\nvclusters: [hpc-batch]\n",
    )
    .unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn scan_never_panics_on_bytes(s in "\\PC{0,400}") {
        let _ = scan_script(&s);
    }

    #[test]
    fn structured_scripts_translate_or_fail_with_a_line(lines in prop::collection::vec(directive_line(), 0..12), cmd in prop::bool::ANY) {
        let mut s = String::from("#!/bin/bash\n");
        for l in &lines {
            s.push_str(l);
            s.push('\n');
        }
        if cmd {
            s.push_str("srun ./app\n");
        }
        match translate(&s, &SubmitFlags::default(), &site()) {
            Ok(t) => {
                prop_assert_eq!(t.allocation["kind"].as_str(), Some("Allocation"));
                for w in &t.warnings {
                    prop_assert!(!w.message.is_empty());
                }
                // Whatever translates must also pass the API server's admission.
                let mut v = t.allocation.clone();
                if v["metadata"].get("namespace").is_none() {
                    v["metadata"]["namespace"] = serde_json::json!("physics");
                }
                if v["metadata"].get("name").is_none() {
                    let g = v["metadata"]["generateName"].as_str().unwrap_or("x-").to_string();
                    v["metadata"]["name"] = serde_json::json!(format!("{g}abc12"));
                }
                let kind = lattice_apis::find_kind("Allocation").expect("kind");
                let r = (kind.admit)(v.clone());
                prop_assert!(r.is_ok(), "admission rejected {}: {:?}\nscript:\n{}", v, r.err().map(|e| e.to_string()), s);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.is_empty());
                // Errors coming from a directive name its line (which is within the script).
                if let Some(l) = e.line() {
                    prop_assert!(l >= 2 && l <= lines.len() + 1, "line {} out of range: {}", l, msg);
                    prop_assert!(msg.contains(&format!("line {l}")), "{}", msg);
                }
            }
        }
    }

    #[test]
    fn value_parsers_never_panic(s in "\\PC{0,40}") {
        let _ = parse_walltime(&s);
        let _ = parse_array(&s);
        let _ = parse_constraint(&s);
        let _ = parse_gres(&s);
        let _ = parse_gpus_per_node(&s);
        let _ = parse_nodes(&s);
        let _ = parse_slurm_dependency(&s);
        let _ = parse_depends_on(&s);
        let _ = parse_begin(&s, chrono::Local::now());
        let _ = parse_data_mount(&s);
        let _ = parse_expose(&s);
        let _ = parse_env_pair(&s);
        let _ = parse_scale_target(&s);
        let _ = lattice_compat::hostlist::expand(&s, 1000);
    }

    #[test]
    fn value_parsers_on_syntax_soup(s in "[0-9a-z:,%&|\\[\\]()*=<>!.\\-+_?]{0,30}") {
        if let Ok(a) = parse_array(&s) {
            prop_assert!(a.count() <= MAX_TASKS);
            prop_assert!(parse_array(&a.range).is_ok(), "normalized range reparses");
        }
        if let Ok(Walltime::Seconds(x)) = parse_walltime(&s) {
            prop_assert!(x > 0 && x <= MAX_WALLTIME_SECS);
        }
        let _ = parse_constraint(&s);
        let _ = parse_slurm_dependency(&s);
        let _ = parse_gres(&s);
    }

    #[test]
    fn walltime_hms_roundtrip(h in 0u64..8000, m in 0u64..60, sec in 0u64..60) {
        let total = h * 3600 + m * 60 + sec;
        prop_assume!(total > 0 && total <= MAX_WALLTIME_SECS);
        let s = format!("{h}:{m:02}:{sec:02}");
        prop_assert_eq!(parse_walltime(&s).ok(), Some(Walltime::Seconds(total)));
        prop_assert_eq!(parse_walltime(&format_hms(total)).ok(), Some(Walltime::Seconds(total)));
    }

    #[test]
    fn hostlist_roundtrip(nums in prop::collection::btree_set(0u32..500, 1..40)) {
        let hosts: Vec<String> = nums.iter().map(|n| format!("nid{n:03}")).collect();
        let c = lattice_compat::hostlist::compress(&hosts);
        prop_assert_eq!(lattice_compat::hostlist::expand(&c, 10_000), Some(hosts));
    }
}

/// One job of a Slurm entry: id, array task (`_N`), delay in minutes (`+M`).
type DepJob = (String, Option<u64>, Option<u64>);

fn render_job((id, task, minutes): &DepJob) -> String {
    let mut s = id.clone();
    if let Some(t) = task {
        s.push_str(&format!("_{t}"));
    }
    if let Some(m) = minutes {
        s.push_str(&format!("+{m}"));
    }
    s
}

/// One `--dependency` entry and what it should become.
#[derive(Debug, Clone)]
enum DepItem {
    Slurm(&'static str, Vec<DepJob>),
    Singleton,
    Begin(u32),
    Symbol(String, &'static str, Option<&'static str>),
}

impl DepItem {
    fn render(&self) -> String {
        match self {
            DepItem::Slurm(t, ids) => format!(
                "{t}:{}",
                ids.iter().map(render_job).collect::<Vec<_>>().join(":")
            ),
            DepItem::Singleton => "singleton".into(),
            DepItem::Begin(t) => format!("begin-time:{t}"),
            DepItem::Symbol(n, ty, None) => format!("string:{n}?type={ty}"),
            DepItem::Symbol(n, ty, Some(sc)) => format!("string:{n}?type={ty}&scope={sc}"),
        }
    }
}

fn dep_job() -> impl Strategy<Value = DepJob> {
    (
        "[a-z0-9][a-z0-9-]{0,6}[a-z0-9]",
        prop::option::of(0u64..20),
        prop::option::of(0u64..600),
    )
}

fn slurm_item() -> impl Strategy<Value = DepItem> {
    (
        prop::sample::select(vec!["afterok", "afternotok", "afterany", "after"]),
        prop::collection::vec(dep_job(), 1..3),
    )
        .prop_map(|(t, ids)| DepItem::Slurm(t, ids))
}

fn condition_of(t: &str) -> &'static str {
    match t {
        "afterok" => "success",
        "afternotok" => "failure",
        "afterany" => "any",
        _ => "started",
    }
}

/// The edges a list of items should parse to: first entry per job and task wins.
fn expected_edges(items: &[DepItem]) -> Vec<(String, Option<u64>, &'static str, Option<u64>)> {
    let mut edges: Vec<(String, Option<u64>, &'static str, Option<u64>)> = Vec::new();
    for it in items {
        if let DepItem::Slurm(t, ids) = it {
            for (id, task, minutes) in ids {
                if !edges.iter().any(|(e, k, _, _)| e == id && k == task) {
                    let delay = minutes.map(|m| m * 60).filter(|s| *s > 0);
                    edges.push((id.clone(), *task, condition_of(t), delay));
                }
            }
        }
    }
    edges
}

fn admits(entries: Vec<serde_json::Value>) -> Result<(), String> {
    let v = serde_json::json!({
        "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
        "metadata": {"name": "fuzz", "namespace": "t"},
        "spec": {"entrypoint": "x", "dependsOn": entries},
    });
    let kind = lattice_apis::find_kind("Allocation").expect("kind");
    (kind.admit)(v).map(|_| ()).map_err(|e| e.to_string())
}

fn dep_item() -> impl Strategy<Value = DepItem> {
    prop_oneof![
        slurm_item(),
        Just(DepItem::Singleton),
        (0u32..2_000_000_000).prop_map(DepItem::Begin),
        (
            "[a-z][a-z0-9_.-]{0,8}",
            prop::sample::select(vec!["in", "out", "inout"]),
            prop::option::of(prop::sample::select(vec!["user", "global"]))
        )
            .prop_map(|(n, t, s)| DepItem::Symbol(n, t, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Slurm and Flux forms mixed in one `--dependency` list parse to exactly what was
    /// written (first condition per job, latest begin time, first type per symbol), and
    /// the manifest entries pass API admission.
    #[test]
    fn dependency_lists_parse_to_what_was_written(items in prop::collection::vec(dep_item(), 1..6)) {
        let text = items.iter().map(DepItem::render).collect::<Vec<_>>().join(",");
        let d = parse_slurm_dependency(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let edges = expected_edges(&items);
        let mut symbols: Vec<(String, &str, &str)> = Vec::new();
        let mut begin: Option<f64> = None;
        let mut singleton = false;
        for it in &items {
            match it {
                DepItem::Slurm(..) => {}
                DepItem::Singleton => singleton = true,
                DepItem::Begin(t) => begin = Some(begin.map_or(*t as f64, |b: f64| b.max(*t as f64))),
                DepItem::Symbol(n, ty, sc) => {
                    if !symbols.iter().any(|(s, _, _)| s == n) {
                        symbols.push((n.clone(), ty, sc.unwrap_or("user")));
                    }
                }
            }
        }
        let got: Vec<_> = d.edges.iter().map(|e| (e.target.clone(), e.task, e.condition.as_str(), e.delay_seconds)).collect();
        prop_assert_eq!(got, edges.clone());
        prop_assert!(d.edges.iter().all(|e| !e.any_of), "',' lists are all required");
        prop_assert!(d.notes.iter().all(|n| n.contains("more than once")), "{:?}", d.notes);
        let got: Vec<(String, &str, &str)> = d.symbols.iter().map(|s| (s.name.clone(), s.type_.as_str(), s.scope.as_str())).collect();
        prop_assert_eq!(got, symbols);
        prop_assert_eq!(d.begin_time, begin);
        prop_assert_eq!(d.singleton, singleton);
        prop_assert!(!d.singleton_any_of);
        let (entries, _) = d.depends_on(false);
        if let Err(e) = admits(entries) {
            // A job named like the allocation itself is the only admission refusal.
            prop_assert!(edges.iter().any(|(e, _, _, _)| e == "fuzz"), "{}: {}", text, e);
        }
    }

    /// Slurm's `?` lists (with delays, array tasks and singleton): every entry becomes an
    /// alternative (`anyOf: true`), with the same first-wins rules, and passes admission.
    #[test]
    fn any_of_lists_parse_to_alternatives(
        items in prop::collection::vec(prop_oneof![4 => slurm_item(), 1 => Just(DepItem::Singleton)], 2..5)
    ) {
        let text = items.iter().map(DepItem::render).collect::<Vec<_>>().join("?");
        let d = parse_slurm_dependency(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let edges = expected_edges(&items);
        let got: Vec<_> = d.edges.iter().map(|e| (e.target.clone(), e.task, e.condition.as_str(), e.delay_seconds)).collect();
        prop_assert_eq!(got, edges.clone());
        prop_assert!(d.any_of);
        prop_assert!(d.edges.iter().all(|e| e.any_of));
        let singleton = items.iter().any(|i| matches!(i, DepItem::Singleton));
        prop_assert_eq!((d.singleton, d.singleton_any_of), (singleton, singleton));
        let (entries, notes) = d.depends_on(false);
        prop_assert!(notes.is_empty(), "{:?}", notes);
        prop_assert!(entries.iter().all(|e| e["anyOf"] == true), "{:?}", entries);
        if let Err(e) = admits(entries) {
            prop_assert!(edges.iter().any(|(e, _, _, _)| e == "fuzz"), "{}: {}", text, e);
        }
    }
}
