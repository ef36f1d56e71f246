//! The `rm-replay` binary as users run it: the issue's flags, the JSON keys, `--compare`
//! side by side, and byte-for-byte determinism.

use std::process::Command;

fn trace() -> String {
    format!(
        "{}/testdata/KTH-SP2-1996-2.swf.gz",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(args)
        .output()
        .expect("run rm-replay");
    assert!(
        out.status.success(),
        "rm-replay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn json_report_has_the_issue_keys_and_is_deterministic() {
    let t = trace();
    let args = [
        "--trace",
        t.as_str(),
        "--jobs",
        "2000",
        "--policy",
        "lattice",
        "--estimate",
        "requested",
        "--size",
        "allocated",
        "-o",
        "json",
    ];
    let a = run(&args);
    let b = run(&args);
    assert_eq!(a, b, "same trace and weights give the same bytes");
    let v: serde_json::Value = serde_json::from_str(&a).expect("json");
    for key in [
        "jobs",
        "avg_bounded_slowdown",
        "avg_wait_s",
        "utilization",
        "makespan_s",
        "jain_index",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    assert_eq!(v["jobs"], 2000);
    let u = v["utilization"].as_f64().expect("utilization");
    assert!(u > 0.0 && u <= 1.0, "{u}");
}

#[test]
fn compare_prints_both_policies_side_by_side() {
    let t = trace();
    let text = run(&[
        "--trace",
        &t,
        "--jobs",
        "1000",
        "--policy",
        "fcfs",
        "--compare",
        "easy",
    ]);
    let policy = text
        .lines()
        .find(|l| l.starts_with("policy "))
        .expect("policy row");
    let cols: Vec<&str> = policy.split_whitespace().collect();
    assert_eq!(cols, ["policy", "fcfs", "easy"], "{text}");
    let bsld = text
        .lines()
        .find(|l| l.starts_with("avg bounded slowdown"))
        .expect("slowdown row");
    assert_eq!(bsld.split_whitespace().count(), 5, "{bsld}");
    assert!(text.contains("compare: fcfs vs easy:"), "{text}");
    // JSON: both reports.
    let v: serde_json::Value = serde_json::from_str(&run(&[
        "--trace",
        &t,
        "--jobs",
        "1000",
        "--policy",
        "fcfs",
        "--compare",
        "easy",
        "-o",
        "json",
    ]))
    .expect("json");
    assert_eq!(v["base"]["policy"], "fcfs");
    assert_eq!(v["compare"]["policy"], "easy");
    // EASY backfills what FCFS leaves idle.
    assert!(
        v["compare"]["avg_bounded_slowdown"].as_f64() < v["base"]["avg_bounded_slowdown"].as_f64()
    );
}

#[test]
fn bad_arguments_are_explained() {
    let out = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(["--trace", "/nonexistent.swf", "--policy", "easy"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.swf"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(["--trace", &trace(), "--filter", "nope"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown filter \"nope\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn windows_larger_than_the_trace_are_refused_not_panicked() {
    let out = Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args([
            "--trace",
            &trace(),
            "--jobs",
            "100",
            "--windows",
            "2",
            "--window-size",
            "64",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 130 jobs"), "{err}");
    assert!(err.contains("--window-size"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
