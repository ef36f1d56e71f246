//! Property tests: `admit` never panics on arbitrary, malformed or hostile
//! input, every error names a path, and admission is idempotent.

use lattice_apis::{kinds, ValidationErrors};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{0,12}",
        "\\PC{0,40}",
        Just("24h".to_string()),
        Just("0-99".to_string()),
        Just("success".to_string()),
        Just("Running".to_string()),
        Just("2026-03-05T10:00:12Z".to_string()),
        (1usize..300_000).prop_map(|n| "x".repeat(n)),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(arb_key(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Keys biased towards real field names so the fuzzer gets past the first error.
fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "apiVersion", "kind", "metadata", "spec", "status", "name", "namespace", "labels",
            "entrypoint", "args", "resources", "nodes", "min", "max", "constraints", "lifecycle",
            "type", "walltime", "scalePolicy", "preemptionClass", "requeue", "policy", "dependsOn",
            "ref", "condition", "taskGroup", "range", "concurrency", "allocations", "schedulerType",
            "weights", "quota", "maxNodes", "state", "capacity", "gpus", "phase", "vni",
            "involvedObject", "holderIdentity", "fieldsV1", "managedFields",
        ]).prop_map(str::to_string),
        1 => "[a-zA-Z]{1,10}",
    ]
}

fn check(kind_idx: usize, v: Value) -> Result<(), TestCaseError> {
    let info = &kinds()[kind_idx % kinds().len()];
    match (info.admit)(v) {
        Ok(out) => {
            let again = (info.admit)(out.clone());
            prop_assert_eq!(
                again.as_ref().ok(),
                Some(&out),
                "admission must be idempotent"
            );
        }
        Err(ValidationErrors(errs)) => {
            prop_assert!(!errs.is_empty());
            for e in errs {
                prop_assert!(!e.path.is_empty(), "error without a path: {:?}", e);
                prop_assert!(!e.message.is_empty(), "error without a message: {:?}", e);
            }
        }
    }
    Ok(())
}

fn base(kind: &str) -> Value {
    json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "fuzz", "namespace": "ml-team"},
        "spec": {"entrypoint": "/bin/true", "schedulerType": "hpc-backfill"}
    })
}

/// Replace (or insert) the value at a random path inside `v`.
fn graft(v: &mut Value, path: &[String], new: Value) {
    let mut cur = v;
    for (i, seg) in path.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let map = cur.as_object_mut().expect("object");
        if i + 1 == path.len() {
            map.insert(seg.clone(), new);
            return;
        }
        cur = map.entry(seg.clone()).or_insert_with(|| json!({}));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_never_panics(k in 0usize..8, v in arb_json()) {
        check(k, v)?;
    }

    #[test]
    fn mutated_manifests_never_panic(
        k in 0usize..8,
        path in prop::collection::vec(arb_key(), 1..5),
        new in arb_json(),
    ) {
        let info = &kinds()[k];
        let mut v = base(info.kind);
        graft(&mut v, &path, new);
        check(k, v)?;
    }

    #[test]
    fn random_yaml_never_panics(
        k in 0usize..8,
        lines in prop::collection::vec(
            prop_oneof![
                Just("apiVersion: lattice.dev/v1alpha1".to_string()),
                Just("metadata: {name: y, namespace: t}".to_string()),
                Just("spec:".to_string()),
                Just("  entrypoint: /bin/true".to_string()),
                Just("  resources: {nodes: {min: 3, max: 1}}".to_string()),
                Just("  dependsOn: [{a: success}, b, {ref: c, condition: any}]".to_string()),
                Just("  lifecycle: {type: reactive, walltime: 25:99:00}".to_string()),
                Just("  taskGroup: {range: 9-1}".to_string()),
                Just("  allocations: [{name: a, spec: {entrypoint: x}}, {name: a}]".to_string()),
                Just("  - &a [*a]".to_string()),
                Just("status: {phase: Running, state: Ready}".to_string()),
                "[ -~]{0,40}",
            ],
            0..12,
        ),
    ) {
        let text = lines.join("\n");
        if let Ok(v) = serde_yaml::from_str::<Value>(&text) {
            check(k, v)?;
        }
    }

    #[test]
    fn deep_nesting_is_rejected_with_a_path(k in 0usize..8, depth in 61usize..400, in_array in any::<bool>()) {
        let mut deep = json!(1);
        for _ in 0..depth {
            deep = if in_array { json!([deep]) } else { json!({"a": deep}) };
        }
        let mut v = base(kinds()[k].kind);
        v["metadata"]["managedFields"] = json!([{"fieldsV1": deep}]);
        let r = (kinds()[k].admit)(v);
        if depth > 61 {
            let e = r.expect_err("too deep");
            prop_assert!(e.0[0].path.starts_with("metadata.managedFields[0].fieldsV1"), "{}", e);
        }
    }
}

#[test]
fn huge_inputs_are_rejected_cleanly() {
    let huge = "a".repeat(2_000_000);
    let v = json!({
        "metadata": {"name": huge.clone(), "namespace": "t"},
        "spec": {"entrypoint": huge.clone(), "args": [huge.clone()], "script": null}
    });
    let e = (lattice_apis::find_kind("alloc").expect("kind").admit)(v).expect_err("too big");
    let paths = e.paths();
    assert!(paths.contains(&"metadata.name"), "{paths:?}");
    assert!(paths.contains(&"spec.entrypoint"), "{paths:?}");
    assert!(paths.contains(&"spec.args[0]"), "{paths:?}");
    // messages stay short even though the input is huge
    assert!(e.to_string().len() < 2_000, "{}", e.to_string().len());
}

fn arb_dependency() -> impl Strategy<Value = Value> {
    let name = "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?";
    prop_oneof![
        (
            name,
            prop::sample::select(vec!["success", "failure", "any", "started"])
        )
            .prop_map(|(r, c)| json!({"ref": r, "condition": c})),
        (
            name,
            prop::sample::select(vec!["success", "failure", "any", "started"])
        )
            .prop_map(|(r, c)| json!({ r: c })),
        (
            name,
            prop::sample::select(vec!["", ":success", ":any", ":started"])
        )
            .prop_map(|(r, c)| json!(format!("{r}{c}"))),
        (0u64..4_000_000_000u64, 0u32..1000)
            .prop_map(|(s, ms)| json!({"beginTime": s as f64 + ms as f64 / 1000.0})),
        (
            "[a-zA-Z0-9_.:/-]{1,20}",
            prop::sample::select(vec!["in", "out", "inout"]),
            prop::option::of(prop::sample::select(vec!["user", "global"]))
        )
            .prop_map(|(s, t, sc)| match sc {
                Some(sc) => json!({"symbol": s, "type": t, "scope": sc}),
                None => json!({"symbol": s, "type": t}),
            }),
        Just(json!({"singleton": true})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Every dependency form is admitted alone, normalized to one long form, and the
    /// normalized form is a fixed point with the same RFC 26 description.
    #[test]
    fn dependency_forms_normalize_to_a_fixed_point(dep in arb_dependency()) {
        let doc = json!({
            "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
            "metadata": {"name": "job-x", "namespace": "t"},
            "spec": {"entrypoint": "x", "dependsOn": [dep.clone()]},
        });
        let admit = lattice_apis::find_kind("Allocation").expect("kind").admit;
        let once = admit(doc).map_err(|e| TestCaseError::fail(format!("{dep}: {e}")))?;
        let twice = admit(once.clone()).map_err(|e| TestCaseError::fail(format!("{dep}: {e}")))?;
        prop_assert_eq!(&once, &twice);
        let a: lattice_apis::Allocation = serde_json::from_value(once).unwrap();
        let d = &a.spec.depends_on[0];
        prop_assert!(d.kind().is_some());
        let back: lattice_apis::Dependency = serde_json::from_value(serde_json::to_value(d).unwrap()).unwrap();
        prop_assert_eq!(back.description(), d.description());
    }
}
