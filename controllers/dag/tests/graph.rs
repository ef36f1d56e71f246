//! DAG parsing (short form, API form, manifest) and admission validation.
mod common;

use common::*;
use lattice_dag::graph::{validate, DagDef, DagError, Limits, StepDef, API_VERSION};
use lattice_dag::Condition::{self, Corresponding, Failure, Mutex, Started, Success};
use proptest::prelude::*;

const SEED_YAML: &str = r#"
# workflow.yaml
name: training-pipeline
allocations:
  - name: preprocess
    entrypoint: "python preprocess.py"
    nodes: 2
    walltime: "2h"
  - name: train
    entrypoint: "torchrun train.py"
    nodes: 64
    walltime: "72h"
    uenv: "prgenv-gnu/24.11:v1"
    depends_on:
      - preprocess: success
  - name: evaluate
    entrypoint: "python eval.py"
    nodes: 1
    walltime: "1h"
    depends_on:
      - train: success
  - name: notify-failure
    entrypoint: "python notify.py --status=failed"
    nodes: 1
    walltime: "10m"
    depends_on:
      - train: failure
"#;

fn errors(steps: Vec<StepDef>, limits: &Limits) -> Vec<DagError> {
    let def = DagDef {
        steps,
        ..Default::default()
    };
    match validate(&def, limits) {
        Ok(_) => Vec::new(),
        Err(e) => e.0,
    }
}

#[test]
fn seed_short_form_parses_and_validates() {
    let d = DagDef::from_yaml(SEED_YAML).expect("parse");
    assert_eq!(d.name.as_deref(), Some("training-pipeline"));
    assert_eq!(d.steps.len(), 4);
    assert_eq!(d.steps[1].depends_on[0].target, "preprocess");
    assert_eq!(d.steps[3].depends_on[0].condition, Failure);
    assert_eq!(d.steps[1].spec["resources"]["nodes"], 64);
    assert_eq!(d.steps[1].spec["lifecycle"]["walltime"], "72h");
    assert_eq!(
        d.steps[1].spec["environment"]["uenv"],
        "prgenv-gnu/24.11:v1"
    );
    let v = validate(&d, &Limits::default()).expect("valid");
    assert_eq!(v.len(), 4);
}

#[test]
fn manifest_round_trip_in_types_crate_shape() {
    let d = DagDef::from_yaml(SEED_YAML).expect("parse");
    let m = d.to_manifest();
    assert_eq!(m["apiVersion"], API_VERSION);
    assert_eq!(m["kind"], "Dag");
    assert_eq!(m["metadata"]["name"], "training-pipeline");
    let t = &m["spec"]["allocations"][1];
    assert_eq!(t["name"], "train");
    assert_eq!(t["dependsOn"][0]["ref"], "preprocess");
    assert_eq!(t["dependsOn"][0]["condition"], "success");
    assert_eq!(t["spec"]["entrypoint"], "torchrun train.py");
    let back = DagDef::from_value(&m).expect("manifest parses");
    assert_eq!(back, d);
    let text = serde_yaml::to_string(&m).expect("yaml");
    assert_eq!(DagDef::from_yaml(&text).expect("yaml manifest"), d);
}

#[test]
fn manifest_with_task_groups_and_api_form() {
    let m = r#"
apiVersion: lattice.dev/v1alpha1
kind: Dag
metadata: {name: sweep, namespace: physics}
spec:
  failurePolicy: propagate
  allocations:
    - name: pre
      spec: {entrypoint: a, taskGroup: {range: "0-9", concurrency: 2}}
    - name: train
      dependsOn: [{ref: pre, condition: corresponding}]
      spec: {entrypoint: b, taskGroup: {range: "0-14"}}
"#;
    let d = DagDef::from_yaml(m).expect("parse");
    assert_eq!(d.namespace.as_deref(), Some("physics"));
    assert_eq!(d.extra["failurePolicy"], "propagate");
    let v = validate(&d, &Limits::default()).expect("valid");
    assert_eq!(v.groups[0].as_ref().map(|g| g.concurrency), Some(Some(2)));
    assert_eq!(v.warnings.len(), 1);
    assert_eq!(
        d.to_manifest()["spec"]["allocations"][0]["spec"]["taskGroup"]["concurrency"],
        2
    );

    let api = r#"
dag:
  allocations:
    - id: stage-data
      entrypoint: "python stage.py"
    - id: train
      depends_on: [{ ref: "stage-data", condition: "success" }]
    - id: evaluate
      depends_on: [{ ref: "train", condition: "any" }, "stage-data:any"]
"#;
    let d = DagDef::from_yaml(api).expect("api form");
    assert_eq!(d.steps[2].depends_on.len(), 2);
    validate(&d, &Limits::default()).expect("valid");
}

#[test]
fn short_form_percent_becomes_concurrency() {
    let d = DagDef::from_yaml("allocations:\n  - name: sweep\n    task_group: \"0-99%20\"\n")
        .expect("parse");
    let m = d.to_manifest();
    let tg = &m["spec"]["allocations"][0]["spec"]["taskGroup"];
    assert_eq!(tg["range"], "0-99");
    assert_eq!(tg["concurrency"], 20);
    let v = validate(&d, &Limits::default()).expect("valid");
    assert_eq!(
        v.groups[0].as_ref().map(|g| (g.len(), g.concurrency)),
        Some((100, Some(20)))
    );
    // An invalid limit stays in the range so validation can point at it.
    let d =
        DagDef::from_yaml("allocations:\n  - name: s\n    task_group: \"0-9%x\"\n").expect("parse");
    let e = validate(&d, &Limits::default()).expect_err("bad");
    assert!(e.to_string().contains("invalid concurrency limit"), "{e}");
}

#[test]
fn parse_errors_name_the_path() {
    let cases: &[(&str, &str)] = &[
        ("allocations: 3", "allocations"),
        ("allocations:\n  - entrypoint: x", "allocations[0]"),
        (
            "allocations:\n  - name: a\n    depends_on: [{b: sometimes}]",
            "allocations[0].depends_on[0].b",
        ),
        (
            "allocations:\n  - name: a\n    depends_on: {b: success}",
            "allocations[0].depends_on",
        ),
        (
            "allocations:\n  - name: a\n    depends_on: [{b: success, c: any}]",
            "allocations[0].depends_on[0]",
        ),
        ("kind: Pod\nspec: {}", "kind"),
        (
            "kind: Dag\nspec: {allocations: [{name: a, spec: {dependsOn: [b]}}]}",
            "spec.allocations[0].spec.dependsOn",
        ),
        ("name: [unclosed", "line"),
        ("- just\n- a list", "document"),
    ];
    for (text, path) in cases {
        match DagDef::from_yaml(text) {
            Ok(d) => panic!("{text:?} parsed: {d:?}"),
            Err(e) => {
                assert!(
                    e.path.starts_with(path),
                    "{text:?}: path {:?} (want {path:?}): {e}",
                    e.path
                );
                assert!(!e.hint.is_empty());
            }
        }
    }
}

#[test]
fn size_limit_message_matches_seed() {
    let steps: Vec<StepDef> = (0..1234).map(|i| step(&format!("s{i}"), &[])).collect();
    let errs = errors(steps.clone(), &Limits::default());
    assert_eq!(
        errs,
        vec![DagError::TooLarge {
            count: 1234,
            limit: 1000
        }]
    );
    assert_eq!(
        errs[0].to_string(),
        "DAG exceeds maximum size (1234 allocations, limit: 1000)\nHint: Split the workflow into smaller DAGs or increase the limit via system configuration."
    );
    let limits = Limits {
        max_dag_size: 2000,
        ..Limits::default()
    };
    assert!(errors(steps, &limits).is_empty());
}

#[test]
fn size_limit_counts_task_group_elements() {
    // Two steps, one a task group of 999 elements: 1,000 allocations, at the limit.
    let mut steps = vec![step("prep", &[]), step("sweep", &[("prep", Success)])];
    steps[1].task_group = Some(lattice_dag::graph::TaskGroupDef {
        range: "0-998".into(),
        concurrency: None,
    });
    assert!(errors(steps.clone(), &Limits::default()).is_empty());
    steps[1].task_group = Some(lattice_dag::graph::TaskGroupDef {
        range: "0-999".into(),
        concurrency: Some(10),
    });
    assert_eq!(
        errors(steps, &Limits::default()),
        vec![DagError::TooLarge {
            count: 1001,
            limit: 1000
        }]
    );
}

#[test]
fn validation_table() {
    type Check = fn(&[DagError]) -> bool;
    let cases: Vec<(&str, Vec<StepDef>, Check)> = vec![
        (
            "cycle names one path",
            vec![
                step("a", &[("c", Success)]),
                step("b", &[("a", Success)]),
                step("c", &[("b", Success)]),
                step("d", &[]),
            ],
            |e| {
                e.iter()
                    .any(|e| e.to_string().starts_with("dependency cycle: a → b → c → a"))
            },
        ),
        (
            "two-node cycle",
            vec![
                step("x", &[("y", Condition::Any)]),
                step("y", &[("x", Failure)]),
            ],
            |e| matches!(e, [DagError::Cycle { path }] if path.len() == 3 && path[0] == path[2]),
        ),
        (
            "duplicate names",
            vec![step("a", &[]), step("b", &[]), step("a", &[])],
            |e| matches!(e, [DagError::DuplicateName { name, first: 0, second: 2 }] if name == "a"),
        ),
        (
            "dangling ref with suggestion",
            vec![
                step("preprocess", &[]),
                step("train", &[("preproces", Success)]),
            ],
            |e| {
                matches!(e, [DagError::UnknownRef { suggestion: Some(s), .. }] if s == "preprocess")
                    && e[0].to_string().contains("Did you mean \"preprocess\"")
            },
        ),
        (
            "dangling ref without suggestion",
            vec![step("a", &[("zzzzzz", Success)])],
            |e| {
                matches!(
                    e,
                    [DagError::UnknownRef {
                        suggestion: None,
                        ..
                    }]
                )
            },
        ),
        ("self dependency", vec![step("a", &[("a", Success)])], |e| {
            matches!(e, [DagError::SelfDependency { .. }])
        }),
        (
            "duplicate edge",
            vec![step("a", &[]), step("b", &[("a", Success), ("a", Failure)])],
            |e| matches!(e, [DagError::DuplicateEdge { .. }]),
        ),
        (
            "corresponding needs task groups",
            vec![step("a", &[]), group("b", "0-3", &[("a", Corresponding)])],
            |e| matches!(e, [DagError::CorrespondingNeedsTaskGroups { .. }]),
        ),
        (
            "started not allowed in DAG",
            vec![step("a", &[]), step("b", &[("a", Started)])],
            |e| matches!(e, [DagError::ConditionNotAllowed { .. }]),
        ),
        ("bad task group", vec![group("a", "5-1", &[])], |e| {
            matches!(e, [DagError::InvalidTaskGroup { .. }])
        }),
        ("invalid name", vec![step("a b", &[])], |e| {
            matches!(e, [DagError::InvalidName { .. }])
        }),
        ("empty dag", vec![], |e| matches!(e, [DagError::Empty])),
        (
            "invalid mutex name",
            vec![step("a", &[("bad lock", Mutex)])],
            |e| matches!(e, [DagError::InvalidMutexName { .. }]),
        ),
        (
            "mutex names need not be steps",
            vec![step("a", &[("lock", Mutex)])],
            |e| e.is_empty(),
        ),
        (
            "mismatched corresponding sizes are allowed",
            vec![
                group("p", "0-9", &[]),
                group("t", "0-14", &[("p", Corresponding)]),
            ],
            |e| e.is_empty(),
        ),
        (
            "several problems reported together",
            vec![step("a", &[("nope", Success)]), step("a", &[])],
            |e| e.len() == 2,
        ),
    ];
    for (name, steps, check) in cases {
        let errs = errors(steps, &Limits::default());
        assert!(check(&errs), "{name}: {errs:?}");
        for e in &errs {
            assert!(!e.hint().is_empty(), "{name}: hint");
        }
    }
}

#[test]
fn deep_chain_and_wide_dag_validate() {
    let n = 10_000;
    let steps: Vec<StepDef> = (0..n)
        .map(|i| {
            if i == 0 {
                step("s0", &[])
            } else {
                step(&format!("s{i}"), &[(&format!("s{}", i - 1), Success)])
            }
        })
        .collect();
    let limits = Limits {
        max_dag_size: n,
        ..Limits::default()
    };
    assert!(
        errors(steps, &limits).is_empty(),
        "no stack overflow on long chains"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn yaml_parser_never_panics(s in "\\PC{0,200}") {
        let _ = DagDef::from_yaml(&s);
    }

    #[test]
    fn yaml_parser_structured_fuzz(
        names in proptest::collection::vec("[a-c]{1,2}", 1..6),
        conds in proptest::collection::vec("(success|failure|any|corresponding|mutex|bogus|)", 0..6),
        groups in proptest::collection::vec(proptest::option::of("[0-9%,:-]{1,6}"), 6),
    ) {
        let mut y = String::from("name: fuzz\nallocations:\n");
        for (i, n) in names.iter().enumerate() {
            y.push_str(&format!("  - name: {n}\n"));
            if let Some(Some(g)) = groups.get(i) { y.push_str(&format!("    task_group: \"{g}\"\n")); }
            if let Some(c) = conds.get(i) {
                let target = &names[(i + 1) % names.len()];
                y.push_str(&format!("    depends_on:\n      - {target}: {c}\n"));
            }
        }
        match DagDef::from_yaml(&y) {
            Err(e) => prop_assert!(!e.message.is_empty() && !e.hint.is_empty()),
            Ok(d) => {
                if let Err(errs) = validate(&d, &Limits::default()) {
                    prop_assert!(!errs.0.is_empty());
                    let text = errs.to_string();
                    prop_assert!(text.contains("Hint:"));
                }
            }
        }
    }
}
