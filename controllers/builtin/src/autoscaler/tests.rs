//! The decision, its windows and cooldown, and the controller's helpers.

use super::*;
use chrono::TimeDelta;

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-05T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn at(secs: i64) -> DateTime<Utc> {
    t0() + TimeDelta::seconds(secs)
}

fn spec() -> ScalePolicy {
    ScalePolicy {
        min_nodes: 1,
        max_nodes: 4,
        metric: "gpu_utilization".into(),
        target: ScaleTarget::Number(0.8),
        ..Default::default()
    }
}

fn policy() -> Policy {
    Policy::from_spec(&spec()).unwrap()
}

fn scale(desired: u32) -> ScaleStatus {
    ScaleStatus {
        desired_nodes: desired,
        ..Default::default()
    }
}

/// Feed `values` every 60 s from t0 and return the decision after the last one.
fn run(p: &Policy, s: &ScaleStatus, assigned: u32, values: &[f64]) -> Decision {
    let mut w = Windows::default();
    let mut d = Decision::Hold(HoldReason::Steady);
    for (i, v) in values.iter().enumerate() {
        let now = at(60 * i as i64);
        w.observe(p, *v, now);
        d = decide(p, s, assigned, &w, *v, now);
    }
    d
}

#[test]
fn autoscaler_policy_defaults() {
    let p = policy();
    assert_eq!(p.cooldown, Duration::from_secs(180));
    assert_eq!(p.evaluation_interval, Duration::from_secs(60));
    assert_eq!(p.scale_up_window, Duration::from_secs(120));
    assert_eq!(p.scale_down_window, Duration::from_secs(300));
    assert_eq!(p.scale_down_threshold, 0.5);
    assert!((p.scale_down_below() - 0.4).abs() < 1e-12);
    let mut sp = spec();
    sp.evaluation_interval = Some("0s".into());
    sp.cooldown = Some("5m".into());
    let p = Policy::from_spec(&sp).unwrap();
    assert_eq!(p.evaluation_interval, Duration::from_secs(1));
    assert_eq!(p.cooldown, Duration::from_secs(300));
    sp.cooldown = Some("soon".into());
    assert!(Policy::from_spec(&sp)
        .unwrap_err()
        .contains("scalePolicy.cooldown"));
}

#[test]
fn autoscaler_scale_up_needs_the_whole_window() {
    let p = policy();
    // Above at 0, 60 s: held for 60 s < 2m.
    assert_eq!(
        run(&p, &scale(2), 2, &[0.9, 0.95]),
        Decision::Hold(HoldReason::Window)
    );
    // Above at 0, 60, 120 s: held for 2m.
    match run(&p, &scale(2), 2, &[0.9, 0.95, 0.93]) {
        Decision::ScaleUp { desired, message } => {
            assert_eq!(desired, 3);
            assert_eq!(
                message,
                "scaling up to 3: gpu_utilization=0.93 above target 0.8 for 2m"
            );
        }
        d => panic!("expected a scale-up, got {d:?}"),
    }
    // A dip to the target (not above) restarts the window.
    assert_eq!(
        run(&p, &scale(2), 2, &[0.9, 0.8, 0.9, 0.9]),
        Decision::Hold(HoldReason::Window)
    );
    assert!(matches!(
        run(&p, &scale(2), 2, &[0.9, 0.8, 0.9, 0.9, 0.9]),
        Decision::ScaleUp { desired: 3, .. }
    ));
    // In the band: nothing.
    assert_eq!(
        run(&p, &scale(2), 2, &[0.5; 10]),
        Decision::Hold(HoldReason::Steady)
    );
}

#[test]
fn autoscaler_scale_down_needs_the_whole_window_and_releases_the_last_node() {
    let p = policy();
    // Below 0.4 for 4m < 5m.
    assert_eq!(
        run(&p, &scale(3), 3, &[0.1; 5]),
        Decision::Hold(HoldReason::Window)
    );
    // 0.5 is below the target but not below target × 0.5: no scale-down window.
    assert_eq!(
        run(&p, &scale(3), 3, &[0.5; 10]),
        Decision::Hold(HoldReason::Steady)
    );
    // A value above 0.4 restarts it.
    assert_eq!(
        run(
            &p,
            &scale(3),
            3,
            &[0.1, 0.1, 0.1, 0.5, 0.1, 0.1, 0.1, 0.1, 0.1]
        ),
        Decision::Hold(HoldReason::Window)
    );
    let d = run(&p, &scale(3), 3, &[0.1; 6]);
    match &d {
        Decision::ScaleDown { desired, message } => {
            assert_eq!(*desired, 2);
            assert_eq!(
                message,
                "scaling down to 2: gpu_utilization=0.1 below 0.4 (target 0.8 × 0.5) for 5m"
            );
        }
        d => panic!("expected a scale-down, got {d:?}"),
    }
    let mut st = AllocationStatus {
        assigned_nodes: vec!["n1".into(), "n2".into(), "n3".into()],
        releasing_nodes: vec!["n0".into()],
        scale: Some(scale(3)),
        ..Default::default()
    };
    apply(&mut st, &d, at(300));
    assert_eq!(st.assigned_nodes, ["n1", "n2"]);
    assert_eq!(st.releasing_nodes, ["n0", "n3"]);
    let s = st.scale.unwrap();
    assert_eq!(s.desired_nodes, 2);
    assert_eq!(s.last_scale_time, Some(at(300)));
    assert!(s.message.unwrap().starts_with("scaling down to 2"));
}

#[test]
fn autoscaler_cooldown_blocks_both_directions() {
    let p = policy();
    let mut s = scale(2);
    s.last_scale_time = Some(at(-60));
    // The up window is complete at 120 s, but the last scale was at -60 s: 180 s of
    // cooldown end at 120 s exactly.
    assert_eq!(
        run(&p, &s, 2, &[0.9, 0.9]),
        Decision::Hold(HoldReason::Cooldown)
    );
    assert!(matches!(
        run(&p, &s, 2, &[0.9, 0.9, 0.9]),
        Decision::ScaleUp { desired: 3, .. }
    ));
    s.last_scale_time = Some(at(200));
    assert_eq!(
        run(&p, &s, 2, &[0.1; 6]),
        Decision::Hold(HoldReason::Cooldown)
    );
    assert_eq!(
        run(&p, &s, 2, &[0.9; 4]),
        Decision::Hold(HoldReason::Cooldown)
    );
    // The cooldown ends at 380 s: the value at 360 s still waits, the one at 420 s not.
    assert_eq!(
        run(&p, &s, 2, &[0.1; 7]),
        Decision::Hold(HoldReason::Cooldown)
    );
    assert!(matches!(
        run(&p, &s, 2, &[0.1; 8]),
        Decision::ScaleDown { desired: 1, .. }
    ));
}

#[test]
fn autoscaler_respects_min_and_max() {
    let p = policy();
    assert_eq!(
        run(&p, &scale(4), 4, &[0.99; 5]),
        Decision::Hold(HoldReason::AtMax)
    );
    assert!(matches!(
        run(&p, &scale(3), 3, &[0.99; 5]),
        Decision::ScaleUp { desired: 4, .. }
    ));
    assert_eq!(
        run(&p, &scale(1), 1, &[0.0; 10]),
        Decision::Hold(HoldReason::AtMin)
    );
    assert!(matches!(
        run(&p, &scale(2), 2, &[0.0; 10]),
        Decision::ScaleDown { desired: 1, .. }
    ));
}

#[test]
fn autoscaler_waits_for_the_previous_scale_up_to_be_placed() {
    let p = policy();
    // desired 3, but the scheduler has placed only 2 so far.
    assert_eq!(
        run(&p, &scale(3), 2, &[0.99; 5]),
        Decision::Hold(HoldReason::WaitingForPlacement)
    );
    // Once placed, the next one.
    assert!(matches!(
        run(&p, &scale(3), 3, &[0.99; 5]),
        Decision::ScaleUp { desired: 4, .. }
    ));
    // Once the value is no longer above the target an unplaced scale-up is dropped
    // first (nothing is released; the next decision may then scale down) ...
    let d = run(&p, &scale(3), 2, &[0.5; 10]);
    assert!(
        matches!(&d, Decision::ScaleDown { desired: 2, message } if message.starts_with("scale-up to 3 cancelled")),
        "{d:?}"
    );
    let d = run(&p, &scale(3), 2, &[0.0; 10]);
    assert!(matches!(d, Decision::ScaleDown { desired: 2, .. }), "{d:?}");
    // ... at minNodes the unplaced scale-up is cancelled, nothing is released.
    let d = run(&p, &scale(2), 1, &[0.0; 10]);
    match &d {
        Decision::ScaleDown {
            desired: 1,
            message,
        } => {
            assert!(message.starts_with("scale-up to 2 cancelled"), "{message}")
        }
        d => panic!("{d:?}"),
    }
    let mut st = AllocationStatus {
        assigned_nodes: vec!["n1".into()],
        scale: Some(scale(2)),
        ..Default::default()
    };
    apply(&mut st, &d, at(600));
    assert_eq!(st.assigned_nodes, ["n1"]);
    assert!(st.releasing_nodes.is_empty());
    assert_eq!(st.scale.unwrap().desired_nodes, 1);
}

#[test]
fn autoscaler_hold_leaves_the_status_alone() {
    let mut st = AllocationStatus {
        assigned_nodes: vec!["n1".into(), "n2".into()],
        scale: Some(ScaleStatus {
            desired_nodes: 3,
            message: Some("scale-up waits: tenant quota".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let before = st.clone();
    apply(
        &mut st,
        &Decision::Hold(HoldReason::WaitingForPlacement),
        at(0),
    );
    assert_eq!(st, before);
}

#[test]
fn autoscaler_text_targets() {
    let num = |s: &str| parse_target(&ScaleTarget::Text(s.into()));
    assert_eq!(num("100ms").unwrap(), 0.1);
    assert_eq!(num("2s").unwrap(), 2.0);
    assert_eq!(num("1.5s").unwrap(), 1.5);
    assert_eq!(num("250us").unwrap(), 0.00025);
    assert_eq!(num("80%").unwrap(), 0.8);
    assert_eq!(num(" 0.8 ").unwrap(), 0.8);
    assert_eq!(num("100").unwrap(), 100.0);
    for bad in ["fast", "", "ms", "-1", "1e3", "10 apples", "NaN", "inf"] {
        let e = num(bad).unwrap_err();
        assert!(e.contains("not scaling"), "{bad}: {e}");
    }
    assert!(parse_target(&ScaleTarget::Number(f64::NAN)).is_err());
    assert_eq!(parse_target(&ScaleTarget::Number(0.8)).unwrap(), 0.8);

    // A latency target in ms compares with a metric in seconds.
    let mut sp = spec();
    sp.metric = "request_latency_p99".into();
    sp.target = ScaleTarget::Text("100ms".into());
    let p = Policy::from_spec(&sp).unwrap();
    match run(&p, &scale(2), 2, &[0.25, 0.25, 0.25]) {
        Decision::ScaleUp { message, .. } => assert_eq!(
            message,
            "scaling up to 3: request_latency_p99=0.25 above target 100ms for 2m"
        ),
        d => panic!("{d:?}"),
    }
    assert_eq!(
        run(&p, &scale(2), 2, &[0.09; 3]),
        Decision::Hold(HoldReason::Steady)
    );
    sp.target = ScaleTarget::Text("quick".into());
    let e = Policy::from_spec(&sp).unwrap_err();
    assert!(e.contains("\"quick\"") && e.contains("not scaling"), "{e}");
}

#[test]
fn autoscaler_failures_count_reset_and_alert() {
    let mut s = scale(2);
    s.last_value = Some(0.5);
    let alerts: Vec<bool> = (0..12).map(|_| record_failure(&mut s)).collect();
    assert_eq!(s.metric_failures, 12);
    assert_eq!(
        alerts,
        [false, false, true, false, false, false, false, false, false, true, false, false]
    );
    // A failure changes nothing else.
    assert_eq!(s.desired_nodes, 2);
    assert_eq!(s.last_value, Some(0.5));
    assert_eq!(s.last_scale_time, None);
    record_success(&mut s, 0.7, at(5));
    assert_eq!(s.metric_failures, 0);
    assert_eq!(s.last_value, Some(0.7));
    assert_eq!(s.last_evaluation_time, Some(at(5)));
    assert!(failure_alert(20) && !failure_alert(21) && !failure_alert(2));
}

#[test]
fn autoscaler_windows_restart_after_a_reset() {
    let p = policy();
    let mut w = Windows::default();
    w.observe(&p, 0.9, at(0));
    w.observe(&p, 0.9, at(60));
    assert_eq!(w.above_since, Some(at(0)));
    assert_eq!(w.below_since, None);
    w.reset(); // e.g. a failed query in between
    w.observe(&p, 0.9, at(120));
    assert_eq!(w.above_since, Some(at(120)));
    assert_eq!(
        decide(&p, &scale(2), 2, &w, 0.9, at(120)),
        Decision::Hold(HoldReason::Window)
    );
    w.observe(&p, 0.1, at(180));
    assert_eq!(w.above_since, None);
    assert_eq!(w.below_since, Some(at(180)));
}

#[test]
fn autoscaler_oscillation_alert() {
    let mut o = Oscillation::default();
    assert!(!o.record(Direction::Up));
    assert!(!o.record(Direction::Up));
    let mut alerts = Vec::new();
    for i in 0..7 {
        let d = if i % 2 == 0 {
            Direction::Down
        } else {
            Direction::Up
        };
        alerts.push(o.record(d));
    }
    // Alternations 1..=7: more than 5 from the 6th on.
    assert_eq!(alerts, [false, false, false, false, false, true, true]);
    // The same direction twice breaks the run.
    assert!(!o.record(Direction::Down));
    assert_eq!(o.alternations(), 0);
}

#[test]
fn autoscaler_promql() {
    let a = Allocation::new("svc", "ml-team", Default::default());
    assert_eq!(
        PrometheusSource::promql(&a, "gpu_utilization").unwrap(),
        "avg(gpu_utilization{lattice_allocation=\"svc\",lattice_tenant=\"ml-team\"})"
    );
    // Matchers of the policy are kept; the allocation's scope is always added.
    assert_eq!(
        PrometheusSource::promql(&a, "custom_metric{job='my-inference'}").unwrap(),
        "avg(custom_metric{job=\"my-inference\",lattice_allocation=\"svc\",lattice_tenant=\"ml-team\"})"
    );
    // No free-form PromQL: another tenant's series are out of reach.
    assert!(PrometheusSource::promql(&a, "rate(requests_total[1m])").is_err());
    assert!(PrometheusSource::promql(&a, "a + b").is_err());
    assert!(PrometheusSource::promql(&a, "x{lattice_tenant=\"other\"}").is_err());
}

#[test]
fn autoscaler_prometheus_response_parsing() {
    let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1767225600.123,"0.93"]}]}}"#;
    assert_eq!(parse_prometheus_response(ok, "q").unwrap(), 0.93);
    let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
    assert_eq!(
        parse_prometheus_response(empty, "avg(x)").unwrap_err(),
        "no samples for avg(x)"
    );
    let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1767225600,"2"]}}"#;
    assert_eq!(parse_prometheus_response(scalar, "q").unwrap(), 2.0);
    let nan = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#;
    assert!(parse_prometheus_response(nan, "q").is_err());
    let err = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#;
    let e = parse_prometheus_response(err, "q").unwrap_err();
    assert!(e.contains("bad_data") && e.contains("parse error"), "{e}");
    assert!(parse_prometheus_response("<html>", "q").is_err());
    let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
    assert!(parse_prometheus_response(matrix, "q").is_err());
}

#[test]
fn autoscaler_formatting() {
    assert_eq!(fmt_duration(Duration::from_secs(0)), "0s");
    assert_eq!(fmt_duration(Duration::from_millis(1500)), "1s");
    assert_eq!(fmt_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
    assert_eq!(fmt_duration(Duration::from_secs(3700)), "1h1m40s");
    assert_eq!(fmt_value(0.1 + 0.2), "0.3");
    assert_eq!(fmt_value(0.93), "0.93");
    assert_eq!(fmt_value(3.0), "3");
    assert_eq!(fmt_value(0.0001), "0");
}

#[test]
fn autoscaler_config_is_debug_without_a_source() {
    assert!(format!("{:?}", AutoscalerConfig::default()).contains("None"));
    assert!(PrometheusSource::new("prometheus:9090").is_err());
    let p = PrometheusSource::new("http://prom:9090/").unwrap();
    assert_eq!(p.base_url(), "http://prom:9090");
}
