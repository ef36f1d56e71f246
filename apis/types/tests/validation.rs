//! Admission behaviour: error paths and messages, defaulting, round trips.

use lattice_apis::resource::admit_typed;
use lattice_apis::*;
use serde_json::{json, Value};

fn admit(kind: &str, v: Value) -> Result<Value, ValidationErrors> {
    (find_kind(kind).expect("kind").admit)(v)
}

fn alloc(spec: Value) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Allocation",
        "metadata": {"name": "job-1", "namespace": "ml-team"},
        "spec": spec
    })
}

/// The single error's (path, message), or panic.
fn one_error(r: Result<Value, ValidationErrors>) -> (String, String) {
    let e = r.expect_err("should be rejected");
    assert_eq!(e.0.len(), 1, "expected one error, got: {e}");
    (e.0[0].path.clone(), e.0[0].message.clone())
}

fn has_error(r: &Result<Value, ValidationErrors>, path: &str, needle: &str) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => {
            e.0.iter()
                .any(|f| f.path == path && f.message.contains(needle))
        }
    }
}

#[test]
fn minimal_allocation_gets_defaults() {
    let v = admit("Allocation", alloc(json!({"entrypoint": "/bin/true"}))).expect("valid");
    assert_eq!(v["spec"]["preemptionClass"], 5);
    assert_eq!(v["spec"]["lifecycle"]["type"], "bounded");
    assert_eq!(v["spec"]["resources"]["nodes"], 1);
    assert_eq!(
        v["spec"]["requeue"],
        json!({"policy": "on_node_failure", "maxRequeue": 3})
    );
    assert_eq!(v["spec"]["checkpoint"]["strategy"], "auto");
    assert_eq!(v["spec"]["telemetry"]["mode"], "prod");
    assert!(v.get("status").is_none());
}

#[test]
fn api_version_and_kind_may_be_omitted_but_not_wrong() {
    let mut v = alloc(json!({"entrypoint": "/bin/true"}));
    v.as_object_mut().unwrap().remove("apiVersion");
    v.as_object_mut().unwrap().remove("kind");
    let out = admit("Allocation", v).expect("valid");
    assert_eq!(out["apiVersion"], API_VERSION);
    assert_eq!(out["kind"], "Allocation");

    let mut v = alloc(json!({"entrypoint": "/bin/true"}));
    v["kind"] = json!("Dag");
    let (p, m) = one_error(admit("Allocation", v));
    assert_eq!(p, "kind");
    assert!(m.contains("\"Allocation\""), "{m}");

    let mut v = alloc(json!({"entrypoint": "/bin/true"}));
    v["apiVersion"] = json!("v1");
    let (p, _) = one_error(admit("Allocation", v));
    assert_eq!(p, "apiVersion");
}

#[test]
fn preemption_class_out_of_range() {
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "preemptionClass": 12})),
    ));
    assert_eq!(p, "spec.preemptionClass");
    assert!(
        m.starts_with("must be between 0 and 10, got 12; use 0 (best effort)"),
        "{m}"
    );
}

#[test]
fn sensitive_defaults_and_rules() {
    let v = admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "sensitive": true})),
    )
    .expect("valid");
    assert_eq!(v["spec"]["preemptionClass"], 10);
    assert_eq!(v["spec"]["requeue"]["policy"], "never");
    assert_eq!(v["spec"]["telemetry"]["mode"], "audit");
    let r = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "/bin/true", "sensitive": true, "preemptionClass": 3,
                     "requeue": {"policy": "always"}}),
        ),
    );
    assert!(has_error(&r, "spec.preemptionClass", "always class 10"));
    assert!(has_error(&r, "spec.requeue.policy", "never"));
}

#[test]
fn unknown_fields_name_their_path() {
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "resources": {"nodes": 2, "gpus": 4}})),
    ));
    assert_eq!(p, "spec.resources.gpus");
    assert!(
        m.contains("unknown field") && m.contains("constraints"),
        "{m}"
    );

    let (p, _) = one_error(admit(
        "Allocation",
        json!({"metadata": {"name": "a", "namespace": "t", "nmae": "x"}, "spec": {"entrypoint": "x"}}),
    ));
    assert_eq!(p, "metadata.nmae");

    let (p, _) = one_error(admit(
        "Allocation",
        json!({"metadata": {"name": "a", "namespace": "t"}, "spec": {"entrypoint": "x"}, "extra": 1}),
    ));
    assert_eq!(p, "extra");
}

#[test]
fn wrong_types_name_their_path() {
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "resources": {"nodes": "many"}})),
    ));
    assert_eq!(p, "spec.resources.nodes");
    assert!(m.contains("node count"), "{m}");
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "args": ["ok", 3]})),
    ));
    assert_eq!(p, "spec.args[1]");
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "lifecycle": {"type": "forever"}})),
    ));
    assert_eq!(p, "spec.lifecycle.type");
    assert!(m.contains("bounded") && m.contains("reactive"), "{m}");
    let (p, m) = one_error(admit(
        "Allocation",
        json!({"metadata": {"name": "a", "namespace": "t", "creationTimestamp": "yesterday"},
               "spec": {"entrypoint": "x"}}),
    ));
    assert_eq!(p, "metadata.creationTimestamp");
    assert!(m.contains("RFC 3339"), "{m}");
    let (p, _) = one_error(admit("Allocation", json!("just a string")));
    assert_eq!(p, "<root>");
}

#[test]
fn node_count_forms() {
    let v = admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "resources": {"nodes": {"min": 32, "max": 128}}})),
    )
    .expect("valid");
    assert_eq!(
        v["spec"]["resources"]["nodes"],
        json!({"min": 32, "max": 128})
    );
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "resources": {"nodes": {"min": 8, "max": 4}}})),
    ));
    assert_eq!(p, "spec.resources.nodes.min");
    assert!(m.contains("<= max"), "{m}");
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "resources": {"nodes": 0}})),
    ));
    assert_eq!(p, "spec.resources.nodes");
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "resources": {"nodes": {"min": 1}}})),
    ));
    assert_eq!(p, "spec.resources.nodes.max");
}

#[test]
fn node_names_must_match_the_count_and_be_node_names() {
    let ok = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "resources": {"nodes": 2, "nodeNames": ["sn-01", "sn-02"]}}),
        ),
    )
    .expect("valid");
    assert_eq!(
        ok["spec"]["resources"]["nodeNames"],
        json!(["sn-01", "sn-02"])
    );
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "resources": {"nodeNames": ["sn-01", "sn-02"]}})),
    ));
    assert_eq!(p, "spec.resources.nodes");
    assert!(m.contains("set nodes: 2"), "{m}");
    let r = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "resources": {"nodes": 2, "nodeNames": ["sn-01", "sn-01"]}}),
        ),
    );
    assert!(
        has_error(&r, "spec.resources.nodeNames[1]", "listed twice"),
        "{r:?}"
    );
    let r = admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "resources": {"nodes": 1, "nodeNames": ["Bad_Name"]}})),
    );
    assert!(
        r.is_err() && has_error(&r, "spec.resources.nodeNames[0]", ""),
        "{r:?}"
    );
    let r = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "resources": {"nodes": {"min": 1, "max": 2}, "nodeNames": ["a"]}}),
        ),
    );
    assert!(
        has_error(&r, "spec.resources.nodes", "exact count"),
        "{r:?}"
    );
}

#[test]
fn any_of_feature_groups() {
    let spec = |c: Value| json!({"entrypoint": "/bin/true", "resources": {"constraints": c}});
    let v = admit(
        "Allocation",
        alloc(spec(
            json!({"features": ["nvme"], "anyOf": [["a100", "h100"], ["ib", "slingshot"]]}),
        )),
    )
    .expect("valid");
    assert_eq!(
        v["spec"]["resources"]["constraints"]["anyOf"],
        json!([["a100", "h100"], ["ib", "slingshot"]])
    );
    let c = "spec.resources.constraints.anyOf";
    let (path, msg) = one_error(admit(
        "Allocation",
        alloc(spec(json!({"anyOf": [["a"], []]}))),
    ));
    assert_eq!(path, format!("{c}[1]"));
    assert!(
        msg.starts_with("is empty") && msg.contains("remove"),
        "{msg}"
    );
    let (path, msg) = one_error(admit(
        "Allocation",
        alloc(spec(json!({"anyOf": [["a100", "h 100"]]}))),
    ));
    assert_eq!(path, format!("{c}[0][1]"));
    assert!(msg.contains("is not a feature name"), "{msg}");
    let (path, msg) = one_error(admit(
        "Allocation",
        alloc(spec(json!({"anyOf": [["a", "b", "a"]]}))),
    ));
    assert_eq!(path, format!("{c}[0][2]"));
    assert!(msg.contains("listed twice"), "{msg}");
    // Bounded: 16 groups of 16 alternatives.
    let groups: Vec<Vec<String>> = (0..17).map(|i| vec![format!("f{i}")]).collect();
    let (path, msg) = one_error(admit("Allocation", alloc(spec(json!({"anyOf": groups})))));
    assert_eq!(path, c);
    assert!(msg.contains("17 groups, the limit is 16"), "{msg}");
    let wide: Vec<String> = (0..17).map(|i| format!("f{i}")).collect();
    let (path, msg) = one_error(admit("Allocation", alloc(spec(json!({"anyOf": [wide]})))));
    assert_eq!(path, format!("{c}[0]"));
    assert!(msg.contains("17 features, the limit is 16"), "{msg}");
    // Not a list of lists: the usual type error with the path.
    let r = admit(
        "Allocation",
        alloc(spec(json!({"anyOf": ["a100", "h100"]}))),
    );
    assert!(r.is_err());
}

#[test]
fn walltime_formats() {
    for ok in ["24h", "1h30m", "72:00:00", "1-12:00:00", "30", "10m"] {
        admit(
            "Allocation",
            alloc(json!({"entrypoint": "x", "lifecycle": {"walltime": ok}})),
        )
        .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in ["24 hours", "1y", "25:61:00", "", "0s"] {
        let (p, m) = one_error(admit(
            "Allocation",
            alloc(json!({"entrypoint": "x", "lifecycle": {"walltime": bad}})),
        ));
        assert_eq!(p, "spec.lifecycle.walltime", "{bad}");
        assert!(m.contains("24h") || m.contains("zero"), "{bad}: {m}");
    }
}

#[test]
fn entrypoint_or_script_required() {
    let (p, m) = one_error(admit("Allocation", alloc(json!({}))));
    assert_eq!(p, "spec.entrypoint");
    assert!(m.contains("spec.script"), "{m}");
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "script": "#!/bin/sh\necho"})),
    ));
    assert_eq!(p, "spec.script");
}

#[test]
fn metadata_rules() {
    let r = admit(
        "Allocation",
        json!({"metadata": {"name": "Bad_Name", "namespace": "ml-team"}, "spec": {"entrypoint": "x"}}),
    );
    assert!(has_error(&r, "metadata.name", "\"bad-name\""), "{r:?}");
    let (p, m) = one_error(admit(
        "Allocation",
        json!({"metadata": {"name": "ok"}, "spec": {"entrypoint": "x"}}),
    ));
    assert_eq!(p, "metadata.namespace");
    assert!(m.contains("tenant"), "{m}");
    let (p, m) = one_error(admit(
        "Node",
        json!({"metadata": {"name": "n1", "namespace": "x"}}),
    ));
    assert_eq!(p, "metadata.namespace");
    assert!(m.contains("cluster-scoped"), "{m}");
    let (p, _) = one_error(admit("Tenant", json!({"metadata": {}})));
    assert_eq!(p, "metadata.name");
    let (p, _) = one_error(admit("Tenant", json!({"metadata": {"name": "a.b"}})));
    assert_eq!(p, "metadata.name");
    let r = admit(
        "Allocation",
        json!({"metadata": {"name": "ok", "namespace": "t", "labels": {"bad key!": "v"}}, "spec": {"entrypoint": "x"}}),
    );
    assert!(r.is_err());
    admit(
        "Allocation",
        json!({"metadata": {"generateName": "job-", "namespace": "t"}, "spec": {"entrypoint": "x"}}),
    )
    .expect("generateName is enough");
}

#[test]
fn tenant_must_match_namespace() {
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "tenant": "physics"})),
    ));
    assert_eq!(p, "spec.tenant");
    admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "tenant": "ml-team"})),
    )
    .expect("valid");
}

#[test]
fn task_group_range_syntax() {
    for ok in ["0-99", "0-15:4", "1,3,5-7", "7"] {
        admit(
            "Allocation",
            alloc(json!({"entrypoint": "x", "taskGroup": {"range": ok, "concurrency": 2}})),
        )
        .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in ["99-0", "0-99%20", "a-b", "", "0-999999999", "1-2:0"] {
        let (p, m) = one_error(admit(
            "Allocation",
            alloc(json!({"entrypoint": "x", "taskGroup": {"range": bad}})),
        ));
        assert_eq!(p, "spec.taskGroup.range", "{bad}");
        assert!(!m.is_empty());
    }
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "taskGroup": {"range": "0-9", "concurrency": 0}})),
    ));
    assert_eq!(p, "spec.taskGroup.concurrency");
    assert_eq!(
        TaskRange::parse("0-15:4").expect("ok").indices(),
        vec![0, 4, 8, 12]
    );
    assert_eq!(TaskRange::parse("1,3,2-4").expect("ok").count(), 4);
}

#[test]
fn dependencies_long_and_short_forms() {
    let v = admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "dependsOn": [
            {"prep": "success"},
            {"ref": "other", "condition": "any"},
            {"allocation": "third"},
            "fourth:failure"
        ]})),
    )
    .expect("valid");
    assert_eq!(
        v["spec"]["dependsOn"],
        json!([
            {"ref": "prep", "condition": "success"},
            {"ref": "other", "condition": "any"},
            {"ref": "third", "condition": "success"},
            {"ref": "fourth", "condition": "failure"}
        ])
    );
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "dependsOn": [{"ref": "a", "condition": "afterok"}]})),
    ));
    assert_eq!(p, "spec.dependsOn[0].condition");
    assert!(m.contains("corresponding"), "{m}");
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "dependsOn": [{"ref": "job-1"}]})),
    ));
    assert_eq!(p, "spec.dependsOn[0].ref");
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "dependsOn": [{"ref": "a", "condition": "corresponding"}]}),
        ),
    ));
    assert_eq!(p, "spec.dependsOn[0].condition");
}

#[test]
fn reactive_needs_scale_policy() {
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "lifecycle": {"type": "reactive"}})),
    ));
    assert_eq!(p, "spec.lifecycle.scalePolicy");
    let v = admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "lifecycle": {"type": "reactive",
            "scalePolicy": {"min": 4, "max": 16, "metric": "request_latency_p99", "target": "100ms"}}})),
    )
    .expect("seed's short min/max names are accepted");
    assert_eq!(v["spec"]["lifecycle"]["scalePolicy"]["minNodes"], 4);
    let (p, _) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "lifecycle": {"type": "reactive",
            "scalePolicy": {"minNodes": 9, "maxNodes": 2, "metric": "m", "target": 1}}})),
    ));
    assert_eq!(p, "spec.lifecycle.scalePolicy.minNodes");
}

#[test]
fn probes_checkpoint_ports() {
    let r = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "lifecycle": {"type": "unbounded"},
            "livenessProbe": {"probeType": "http", "port": 70000},
            "checkpoint": {"strategy": "grpc"},
            "connectivity": {"expose": [{"name": "m", "port": 0}]}}),
        ),
    );
    assert!(has_error(&r, "spec.livenessProbe.port", "65535"));
    assert!(has_error(&r, "spec.livenessProbe.path", "/healthz"));
    assert!(has_error(&r, "spec.checkpoint.port", "required"));
    assert!(has_error(&r, "spec.connectivity.expose[0].port", "65535"));
    let v = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "lifecycle": {"type": "unbounded"},
            "livenessProbe": {"probeType": "tcp", "port": 80}}),
        ),
    )
    .expect("valid");
    assert_eq!(v["spec"]["livenessProbe"]["periodSecs"], 30);
    assert_eq!(v["spec"]["livenessProbe"]["failureThreshold"], 3);
    assert_eq!(v["spec"]["livenessProbe"]["timeoutSecs"], 5);
}

#[test]
fn requeue_limit() {
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "requeue": {"maxRequeue": 101}})),
    ));
    assert_eq!(p, "spec.requeue.maxRequeue");
    assert!(m.contains("100"));
    let (p, m) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "requeue": {"policy": "on_any_failure"}})),
    ));
    assert_eq!(p, "spec.requeue.policy");
    assert!(m.contains("on_node_failure"), "{m}");
}

#[test]
fn status_is_strict_too() {
    let mut v = alloc(json!({"entrypoint": "x"}));
    v["status"] = json!({"phase": "Running", "assignedNodes": ["n1", "n2"], "startTime": "2026-03-05T10:00:12Z"});
    let out = admit("Allocation", v).expect("valid");
    assert_eq!(out["status"]["startTime"], "2026-03-05T10:00:12Z");
    let mut v = alloc(json!({"entrypoint": "x"}));
    v["status"] = json!({"phase": "Done"});
    let (p, m) = one_error(admit("Allocation", v));
    assert_eq!(p, "status.phase");
    assert!(m.contains("Completed"), "{m}");
}

fn dag(tasks: Value) -> Value {
    json!({"kind": "Dag", "metadata": {"name": "wf", "namespace": "ml-team"}, "spec": {"allocations": tasks}})
}

#[test]
fn dag_rules() {
    let t = |name: &str, deps: Value| json!({"name": name, "dependsOn": deps, "spec": {"entrypoint": "x"}});
    admit(
        "Dag",
        dag(json!([
            t("a", json!([])),
            t("b", json!([{"a": "success"}]))
        ])),
    )
    .expect("valid");
    let r = admit(
        "Dag",
        dag(json!([
            t("a", json!([{"b": "success"}])),
            t("b", json!([{"a": "any"}]))
        ])),
    );
    assert!(has_error(&r, "spec.allocations", "cycle"), "{r:?}");
    let r = admit("Dag", dag(json!([t("a", json!([])), t("a", json!([]))])));
    assert!(has_error(&r, "spec.allocations[1].name", "unique"), "{r:?}");
    let r = admit("Dag", dag(json!([t("a", json!([{"zzz": "success"}]))])));
    assert!(
        has_error(&r, "spec.allocations[0].dependsOn[0].ref", "not a task"),
        "{r:?}"
    );
    let r = admit("Dag", dag(json!([])));
    assert!(has_error(&r, "spec.allocations", "at least one"), "{r:?}");
    let r = admit(
        "Dag",
        dag(json!([{"name": "a", "spec": {"entrypoint": "x", "preemptionClass": 11}}])),
    );
    assert!(
        has_error(
            &r,
            "spec.allocations[0].spec.preemptionClass",
            "between 0 and 10"
        ),
        "{r:?}"
    );
    // The size limit is the API server's (configurable) admission check, not the
    // type's: 1,001 tasks are a valid Dag here.
    let many: Vec<Value> = (0..1001).map(|i| t(&format!("t{i}"), json!([]))).collect();
    admit("Dag", dag(Value::Array(many))).expect("no size limit in the type");
    assert_eq!(
        lattice_apis::kinds::dag::dag_size_error(1234, 1000).as_deref(),
        Some("DAG exceeds maximum size (1234 allocations, limit: 1000). Hint: Split the workflow into smaller DAGs or increase the limit via system configuration.")
    );
    assert_eq!(lattice_apis::kinds::dag::dag_size_error(1000, 1000), None);
    // A long chain (deep DFS) must not overflow the stack.
    let chain: Vec<Value> = (0..1000)
        .map(|i| {
            if i == 0 {
                t("t0", json!([]))
            } else {
                t(&format!("t{i}"), json!([{"ref": format!("t{}", i - 1)}]))
            }
        })
        .collect();
    admit("Dag", dag(Value::Array(chain))).expect("long chain is fine");
    // Many dangling references: the answer stays small (a capped list of errors, each
    // naming a few tasks), whatever the DAG's size.
    // A cycle (t0 → t1 → t0) among them is still reported.
    let dangling: Vec<Value> = (0..1000)
        .map(|i| {
            let mut refs: Vec<Value> = (0..20)
                .map(|k| json!({"ref": format!("gone-{i}-{k}")}))
                .collect();
            if i < 2 {
                refs.push(json!({"ref": format!("t{}", 1 - i)}));
            }
            t(&format!("t{i}"), Value::Array(refs))
        })
        .collect();
    let e = admit("Dag", dag(Value::Array(dangling))).expect_err("dangling refs");
    assert_eq!(e.0.len(), MAX_REPORTED_ERRORS + 1, "{}", e.0.len());
    // Sorted names: t0, t1, t10, t100, ...
    assert!(
        e.0[0]
            .message
            .contains("use one of: t0, t1, t10, t100, t101"),
        "{}",
        e.0[0]
    );
    assert!(e.0[0].message.contains("1000 tasks in all"), "{}", e.0[0]);
    assert!(
        e.0.iter()
            .any(|f| f.path == "spec.allocations" && f.message.contains("cycle")),
        "{e}"
    );
    let last = e.0.last().expect("errors");
    assert!(last.message.starts_with("19901 more errors"), "{last}");
    assert!(
        e.to_string().len() < 32 * 1024,
        "{} bytes",
        e.to_string().len()
    );
}

#[test]
fn vcluster_defaults_from_scheduler_type() {
    let v = admit(
        "VCluster",
        json!({"kind": "VCluster", "metadata": {"name": "hpc", "namespace": "ml-team"},
               "spec": {"schedulerType": "hpc-backfill", "weights": {"fairShare": 0.35}}}),
    )
    .expect("valid");
    let s = &v["spec"];
    assert_eq!(s["profile"], "hpc-batch");
    assert_eq!(s["weights"]["priority"], 0.15);
    assert_eq!(s["weights"]["fairShare"], 0.35, "explicit weights are kept");
    assert_eq!(s["weights"]["conformance"], 0.10);
    assert_eq!(s["cycleInterval"], "15s");
    assert_eq!(s["backfillDepth"], 1, "EASY by default");
    assert_eq!(s["borrowing"]["allowLend"], true);
    assert_eq!(s["preemption"]["mode"], "class_based");

    let v = admit(
        "VCluster",
        json!({"metadata": {"name": "s", "namespace": "ml-team"}, "spec": {"schedulerType": "sensitive-reservation"}}),
    )
    .expect("valid");
    assert_eq!(v["spec"]["weights"]["priority"], 0.9);
    assert_eq!(v["spec"]["borrowing"]["allowBorrow"], false);
    assert_eq!(v["spec"]["preemption"]["mode"], "never");

    let v = admit(
        "VCluster",
        json!({"metadata": {"name": "i", "namespace": "ml-team"}, "spec": {"schedulerType": "interactive-fifo", "weights": {"w2": 0.5}}}),
    )
    .expect("valid");
    assert_eq!(v["spec"]["weights"]["waitTime"], 0.5, "w2 alias");
    assert_eq!(v["spec"]["cycleInterval"], "5s");

    let (p, m) = one_error(admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {}}),
    ));
    assert_eq!(p, "spec.schedulerType");
    assert!(m.contains("interactive-fifo"), "{m}");
    let (p, m) = one_error(admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "slurm"}}),
    ));
    assert_eq!(p, "spec.schedulerType");
    assert!(m.contains("hpc-backfill"), "{m}");
    let (p, _) = one_error(admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill", "weights": {"energy": 1.5}}}),
    ));
    assert_eq!(p, "spec.weights.energy");
    // A name that is not a weight is refused by name, with the names that exist.
    let (p, m) = one_error(admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill", "weights": {"speed": 0.5}}}),
    ));
    assert_eq!(p, "spec.weights.speed");
    assert!(
        m.contains("priority, waitTime, fairShare") && m.contains("checkpointEfficiency"),
        "{m}"
    );
    // An extender's URL must be http(s), and the error says why.
    let (p, m) = one_error(admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill",
            "extenders": [{"name": "site", "url": "ftp://x/", "filter": true}]}}),
    ));
    assert_eq!(p, "spec.extenders[0].url");
    assert!(m.contains("use http:// or https://"), "{m}");
    let r = admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "sensitive-reservation", "borrowing": {"allowLend": true}}}),
    );
    assert!(has_error(&r, "spec.borrowing.allowLend", "false"));
}

/// hpc-backfill plans backfill on runtimes learned from finished allocations by default;
/// the other scheduler types reserve nothing, so the fields are refused there.
#[test]
fn vcluster_runtime_prediction_defaults_and_refusals() {
    let v = admit(
        "VCluster",
        json!({"metadata": {"name": "hpc", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill"}}),
    )
    .expect("valid");
    let s = &v["spec"];
    assert_eq!(s["backfillOrder"], "shortest");
    let p = &s["runtimePrediction"];
    assert_eq!(p["estimator"], "user-fraction2");
    assert_eq!(p["correction"], "gradual");
    assert_eq!(p["runningEnds"], "walltime");
    assert_eq!(p["guaranteeAfter"], "66h");
    // Explicit choices are kept; `never` turns the guarantee off.
    let v = admit(
        "VCluster",
        json!({"metadata": {"name": "hpc", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill",
               "backfillOrder": "best-fit",
               "runtimePrediction": {"estimator": "none", "guaranteeAfter": "never"}}}),
    )
    .expect("valid");
    assert_eq!(v["spec"]["backfillOrder"], "best-fit");
    assert_eq!(v["spec"]["runtimePrediction"]["estimator"], "none");
    assert_eq!(v["spec"]["runtimePrediction"]["guaranteeAfter"], "never");
    let (p, m) = one_error(admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill",
               "runtimePrediction": {"guaranteeAfter": "soon"}}}),
    ));
    assert_eq!(p, "spec.runtimePrediction.guaranteeAfter");
    assert!(m.contains("never"), "{m}");
    let r = admit(
        "VCluster",
        json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {"schedulerType": "hpc-backfill",
               "runtimePrediction": {"estimator": "oracle"}}}),
    );
    assert!(r.is_err(), "unknown estimator");
    for (field, spec) in [
        (
            "spec.backfillOrder",
            json!({"schedulerType": "service-binpack", "backfillOrder": "shortest"}),
        ),
        (
            "spec.runtimePrediction",
            json!({"schedulerType": "interactive-fifo", "runtimePrediction": {"estimator": "user-last2"}}),
        ),
    ] {
        let r = admit(
            "VCluster",
            json!({"metadata": {"name": "x", "namespace": "t"}, "spec": spec}),
        );
        assert!(has_error(&r, field, "only hpc-backfill"), "{field}");
    }
}

#[test]
fn weight_profiles_sum_to_one() {
    for p in [
        WeightProfile::HpcBatch,
        WeightProfile::MlTraining,
        WeightProfile::Service,
        WeightProfile::Sensitive,
        WeightProfile::Interactive,
    ] {
        let sum: f64 = p.weights().iter().map(|(_, w)| w).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{p:?} sums to {sum}");
    }
}

#[test]
fn tenant_quotas() {
    let v = admit(
        "Tenant",
        json!({"metadata": {"name": "physics"}, "spec": {"quota": {"maxNodes": 200}}}),
    )
    .expect("valid");
    assert_eq!(v["spec"]["budgetPeriodDays"], 90);
    let r = admit(
        "Tenant",
        json!({"metadata": {"name": "physics"}, "spec": {"quota": {"fairShareTarget": 1.5, "burstAllowance": 0.5,
               "maxNodes": 10, "sensitivePoolSize": 20}}}),
    );
    assert!(has_error(
        &r,
        "spec.quota.fairShareTarget",
        "between 0 and 1"
    ));
    assert!(has_error(&r, "spec.quota.burstAllowance", "1.5"));
    assert!(has_error(&r, "spec.quota.sensitivePoolSize", "maxNodes"));
}

#[test]
fn node_status_and_defaults() {
    let v = admit(
        "Node",
        json!({"metadata": {"name": "x1000c0s0b0n0"},
               "spec": {"topologyGroup": 3, "features": ["nvme_scratch"]},
               "status": {"state": "Ready", "capacity": {"cpuCores": 72, "memoryGb": 480,
                 "gpus": [{"index": 0, "type": "GH200", "memoryGb": 96}, {"index": 1, "type": "GH200"}]},
                 "conformanceFingerprint": "a1b2c3", "owner": {"tenant": "physics", "vcluster": "hpc-batch"}}}),
    )
    .expect("valid");
    assert_eq!(v["status"]["capacity"]["gpuCount"], 2);
    assert_eq!(v["status"]["capacity"]["gpuType"], "GH200");
    let (p, m) = one_error(admit(
        "Node",
        json!({"metadata": {"name": "n"}, "status": {"state": "Healthy"}}),
    ));
    assert_eq!(p, "status.state");
    for s in [
        "Unknown", "Booting", "Ready", "Degraded", "Down", "Draining", "Drained", "Failed",
    ] {
        assert!(m.contains(s), "{m}");
    }
    assert!(NodeState::Ready.can_transition_to(NodeState::Draining));
    assert!(NodeState::Draining.can_transition_to(NodeState::Drained));
    assert!(!NodeState::Drained.can_transition_to(NodeState::Draining));
    assert!(
        NodeState::Booting.can_transition_to(NodeState::Down),
        "Any → Down"
    );
}

#[test]
fn lease_event_network_domain() {
    let v = admit(
        "Lease",
        json!({"metadata": {"name": "node-n1", "namespace": SYSTEM_NAMESPACE}, "spec": {"holderIdentity": "n1"}}),
    )
    .expect("valid");
    assert_eq!(v["spec"]["leaseDurationSeconds"], 15);
    let v = admit(
        "Event",
        json!({"metadata": {"name": "job-1.17a", "namespace": "ml-team"},
               "involvedObject": {"kind": "Allocation", "name": "job-1"},
               "reason": "Scheduled", "message": "bound to 2 nodes", "type": "Normal",
               "firstTimestamp": "2026-03-05T10:00:12Z", "source": {"component": "scheduler"}}),
    )
    .expect("valid");
    assert_eq!(v["count"], 1);
    assert_eq!(v["lastTimestamp"], "2026-03-05T10:00:12Z");
    let (p, _) = one_error(admit(
        "Event",
        json!({"metadata": {"name": "e", "namespace": "t"}, "involvedObject": {"kind": "Node", "name": "n"},
               "reason": "X", "type": "Error"}),
    ));
    assert_eq!(p, "type");
    let v = admit(
        "NetworkDomain",
        json!({"metadata": {"name": "ml-workspace", "namespace": "ml-team"}, "status": {"phase": "Active", "vni": 1000}}),
    )
    .expect("valid");
    assert_eq!(v["spec"]["gracePeriod"], "5m");
    let (p, _) = one_error(admit(
        "NetworkDomain",
        json!({"metadata": {"name": "d", "namespace": "t"}, "status": {"vni": 0}}),
    ));
    assert_eq!(p, "status.vni");
}

#[test]
fn typed_round_trip() {
    let mut spec = AllocationSpec {
        entrypoint: Some("/bin/sh".into()),
        args: vec!["-c".into(), "echo hi".into()],
        ..Default::default()
    };
    spec.resources.nodes = NodeCount::Range { min: 2, max: 4 };
    spec.lifecycle.walltime = Some("1h".into());
    spec.depends_on
        .push(Dependency::on("prep", DependencyCondition::Any));
    let a = Allocation::new("rt", "ml-team", spec);
    let v = serde_json::to_value(&a).expect("serialize");
    let back: Allocation = admit_typed(v.clone()).expect("valid");
    let mut expected = a.clone();
    expected.spec.default_fields();
    assert_eq!(back, expected);
    // YAML round trip of the normalized form
    let yaml = serde_yaml::to_string(&back).expect("yaml");
    let from_yaml: Allocation = serde_yaml::from_str(&yaml).expect("parse yaml");
    assert_eq!(from_yaml, back);
    assert_eq!(back.spec.lifecycle.walltime_seconds(), Some(3600));
}

#[test]
fn status_object_from_validation_errors() {
    let e = admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "preemptionClass": -1})),
    )
    .expect_err("invalid");
    let s = Status::invalid("Allocation", Some("job-1"), &e);
    let v = serde_json::to_value(&s).expect("json");
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["status"], "Failure");
    assert_eq!(v["code"], 422);
    assert_eq!(v["reason"], "Invalid");
    assert_eq!(v["details"]["causes"][0]["field"], "spec.preemptionClass");
}

#[test]
fn dependency_schemes_round_trip_and_normalize() {
    let v = admit(
        "Allocation",
        alloc(
            json!({"entrypoint": "x", "tags": {"name": "train"}, "dependsOn": [
                {"ref": "prep", "condition": "started"},
                "other:started",
                {"ref": "0b7c2a64-3f59-4a5e-9b1e-2f2d8c1a9e77", "condition": "any"},
                {"beginTime": 1767225600.5},
                {"symbol": "ckpt", "type": "inout"},
                {"symbol": "data", "type": "in", "scope": "global"},
                {"singleton": true}
            ]}),
        ),
    )
    .expect("valid");
    assert_eq!(
        v["spec"]["dependsOn"],
        json!([
            {"ref": "prep", "condition": "started"},
            {"ref": "other", "condition": "started"},
            {"ref": "0b7c2a64-3f59-4a5e-9b1e-2f2d8c1a9e77", "condition": "any"},
            {"beginTime": 1767225600.5},
            {"symbol": "ckpt", "type": "inout", "scope": "user"},
            {"symbol": "data", "type": "in", "scope": "global"},
            {"singleton": true}
        ])
    );
    let a: Allocation = serde_json::from_value(v).expect("typed");
    let kinds: Vec<DependencyKind> = a.spec.depends_on.iter().filter_map(|d| d.kind()).collect();
    assert_eq!(kinds.len(), 7);
    assert_eq!(kinds[3], DependencyKind::BeginTime(1767225600.5));
    assert_eq!(
        kinds[4],
        DependencyKind::Symbol {
            name: "ckpt",
            type_: SymbolType::Inout,
            scope: SymbolScope::User
        }
    );
    assert_eq!(kinds[6], DependencyKind::Singleton);
    let descs: Vec<String> = a.spec.depends_on.iter().map(|d| d.description()).collect();
    assert_eq!(
        descs,
        [
            "after:prep",
            "after:other",
            "afterany:0b7c2a64-3f59-4a5e-9b1e-2f2d8c1a9e77",
            "begin-time:1767225600.5",
            "string:ckpt?scope=user&type=inout",
            "string:data?scope=global&type=in",
            "singleton"
        ]
    );
    // YAML and JSON round trips keep the normalized form.
    let yaml = serde_yaml::to_string(&a).expect("yaml");
    let back: Allocation = serde_yaml::from_str(&yaml).expect("parse");
    assert_eq!(back, a);
}

#[test]
fn dependency_scheme_errors_name_the_field_and_the_fix() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({}), "spec.dependsOn[0]", "names nothing"),
        (
            json!({"ref": "a", "beginTime": 5}),
            "spec.dependsOn[0].beginTime",
            "only one of",
        ),
        (
            json!({"symbol": "s", "singleton": true}),
            "spec.dependsOn[0].singleton",
            "split it",
        ),
        (json!({"symbol": "s"}), "spec.dependsOn[0].type", "in (wait"),
        (
            json!({"symbol": "has space", "type": "in"}),
            "spec.dependsOn[0].symbol",
            "without spaces",
        ),
        (
            json!({"beginTime": -1}),
            "spec.dependsOn[0].beginTime",
            "epoch",
        ),
        (
            json!({"singleton": false}),
            "spec.dependsOn[0]",
            "names nothing",
        ),
        (json!({"ref": "Bad_Name"}), "spec.dependsOn[0].ref", ""),
    ];
    for (dep, path, needle) in cases {
        let r = admit(
            "Allocation",
            alloc(json!({"entrypoint": "x", "dependsOn": [dep.clone()]})),
        );
        assert!(has_error(&r, path, needle), "{dep}: {r:?}");
    }
    // Deserialization errors carry the path and say what to write.
    let deser: Vec<(Value, &str, &str)> = vec![
        (
            json!({"symbol": "s", "type": "both"}),
            "spec.dependsOn[0].type",
            "inout",
        ),
        (
            json!({"symbol": "s", "type": "in", "scope": "site"}),
            "spec.dependsOn[0].scope",
            "global",
        ),
        (json!({"type": "in"}), "spec.dependsOn[0]", "needs `symbol`"),
        (
            json!({"scope": "user", "ref": "a"}),
            "spec.dependsOn[0]",
            "needs `symbol`",
        ),
        (
            json!({"condition": "any"}),
            "spec.dependsOn[0]",
            "needs `ref`",
        ),
        (
            json!({"ref": "a", "conditon": "any"}),
            "spec.dependsOn[0].conditon",
            "allowed fields here: `ref`, `condition`",
        ),
        (
            json!({"singleton": "yes"}),
            "spec.dependsOn[0].singleton",
            "",
        ),
        (
            json!({"beginTime": "tomorrow"}),
            "spec.dependsOn[0].beginTime",
            "",
        ),
    ];
    for (dep, path, needle) in deser {
        let (p, m) = one_error(admit(
            "Allocation",
            alloc(json!({"entrypoint": "x", "dependsOn": [dep.clone()]})),
        ));
        assert_eq!(p, path, "{dep}: {m}");
        assert!(m.contains(needle), "{dep}: {m}");
    }
    // Duplicates.
    let r = admit(
        "Allocation",
        alloc(json!({"entrypoint": "x", "dependsOn": [
            {"symbol": "s", "type": "in"}, {"symbol": "s", "type": "out"},
            {"beginTime": 1}, {"beginTime": 2},
            {"singleton": true}, {"singleton": true}
        ]})),
    );
    assert!(
        has_error(&r, "spec.dependsOn[1].symbol", "listed twice"),
        "{r:?}"
    );
    assert!(
        has_error(&r, "spec.dependsOn[3].beginTime", "twice"),
        "{r:?}"
    );
    assert!(
        has_error(&r, "spec.dependsOn[5].singleton", "twice"),
        "{r:?}"
    );
}

#[test]
fn dag_edges_reject_standalone_dependency_schemes() {
    let dag = |dep: Value| {
        json!({
            "apiVersion": API_VERSION, "kind": "Dag",
            "metadata": {"name": "wf", "namespace": "ml-team"},
            "spec": {"allocations": [
                {"name": "a", "spec": {"entrypoint": "x"}},
                {"name": "b", "dependsOn": [dep], "spec": {"entrypoint": "x"}}
            ]}
        })
    };
    let r = admit("Dag", dag(json!({"ref": "a", "condition": "started"})));
    assert!(
        has_error(
            &r,
            "spec.allocations[1].dependsOn[0].condition",
            "standalone"
        ),
        "{r:?}"
    );
    let r = admit("Dag", dag(json!({"symbol": "s", "type": "in"})));
    assert!(
        has_error(&r, "spec.allocations[1].dependsOn[0].symbol", "standalone"),
        "{r:?}"
    );
    let r = admit("Dag", dag(json!({"beginTime": 5})));
    assert!(
        has_error(
            &r,
            "spec.allocations[1].dependsOn[0].beginTime",
            "standalone"
        ),
        "{r:?}"
    );
    admit("Dag", dag(json!({"a": "any"}))).expect("short form still valid");
}

#[test]
fn documents_nested_too_deep_are_refused_with_the_path() {
    // 70 levels of lists under spec.args: refused before typed parsing, naming where.
    let mut v = json!("x");
    for _ in 0..70 {
        v = json!([v]);
    }
    let (path, msg) = one_error(admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "args": v})),
    ));
    assert!(path.starts_with("spec.args[0][0]"), "{path}");
    assert!(msg.contains("nested more than 64 levels deep"), "{msg}");
    // 60 levels deep is not refused for depth (it is a wrong type instead).
    let mut v = json!("x");
    for _ in 0..60 {
        v = json!([v]);
    }
    let e = admit(
        "Allocation",
        alloc(json!({"entrypoint": "/bin/true", "args": v})),
    )
    .expect_err("type");
    assert!(!e.to_string().contains("levels deep"), "{e}");
}
