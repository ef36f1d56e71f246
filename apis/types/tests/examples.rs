//! Every manifest under `manifests/examples/` must parse and pass admission.

use std::path::Path;

use lattice_apis::find_kind;
use serde::Deserialize;

fn examples_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/examples")
}

/// Parse a multi-document YAML file into JSON values (empty documents skipped).
fn documents(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde_json::Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn every_example_is_admitted() {
    let mut files: Vec<_> = std::fs::read_dir(examples_dir())
        .expect("manifests/examples exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    for name in [
        "allocations.yaml",
        "tenant.yaml",
        "training-pipeline.yaml",
        "vclusters.yaml",
    ] {
        assert!(
            files
                .iter()
                .any(|f| f.file_name().is_some_and(|n| n == name)),
            "missing example {name}"
        );
    }
    let mut count = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        for (i, doc) in documents(&text).into_iter().enumerate() {
            let kind = doc["kind"].as_str().expect("kind");
            assert_eq!(
                doc["apiVersion"], "lattice.dev/v1alpha1",
                "{file:?} doc {i}"
            );
            let info = find_kind(kind).unwrap_or_else(|| panic!("{file:?}: unknown kind {kind}"));
            let admitted = (info.admit)(doc.clone())
                .unwrap_or_else(|e| panic!("{file:?} document {i} ({kind}) rejected:\n{e}"));
            // Admission is idempotent: admitting the normalized object changes nothing.
            let again = (info.admit)(admitted.clone()).expect("normalized object is valid");
            assert_eq!(admitted, again, "{file:?} document {i}");
            count += 1;
        }
    }
    assert!(
        count >= 11,
        "expected at least 11 example objects, found {count}"
    );
}

#[test]
fn vclusters_example_covers_every_scheduler_type() {
    let text = std::fs::read_to_string(examples_dir().join("vclusters.yaml")).expect("readable");
    let types: std::collections::BTreeSet<String> = documents(&text)
        .iter()
        .map(|d| {
            d["spec"]["schedulerType"]
                .as_str()
                .expect("schedulerType")
                .to_string()
        })
        .collect();
    for t in [
        "hpc-backfill",
        "service-binpack",
        "sensitive-reservation",
        "interactive-fifo",
    ] {
        assert!(types.contains(t), "no VCluster with schedulerType {t}");
    }
}

#[test]
fn training_pipeline_matches_the_seed_graph() {
    let text =
        std::fs::read_to_string(examples_dir().join("training-pipeline.yaml")).expect("readable");
    let doc = documents(&text).remove(0);
    let dag: lattice_apis::Dag = lattice_apis::resource::admit_typed(doc).expect("valid");
    let names: Vec<&str> = dag
        .spec
        .allocations
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names, ["preprocess", "train", "evaluate", "notify-failure"]);
    let order: Vec<&str> = dag
        .spec
        .topological_order()
        .expect("acyclic")
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(order[0], "preprocess");
    let notify = &dag.spec.allocations[3];
    assert_eq!(notify.depends_on[0].ref_, "train");
    assert_eq!(
        notify.depends_on[0].condition,
        lattice_apis::DependencyCondition::Failure
    );
    // defaults were copied into every task
    assert!(dag
        .spec
        .allocations
        .iter()
        .all(|t| t.spec.vcluster.as_deref() == Some("ml-training")));
}
