//! Translation of the seed's Intent API request shapes (snake_case,
//! `allocation: {...}`, `dag: {...}`, the `workflow.yaml` short form) into
//! Lattice resource specs. The API server's `/v1/...` routes and the CLI's
//! `lattice dag submit workflow.yaml` use these, then run normal admission.
//!
//! ```
//! use lattice_apis::intent::{allocation_from_intent, dag_from_workflow};
//!
//! let req = serde_json::json!({"allocation": {
//!     "tenant": "ml-team", "vcluster": "ml-training",
//!     "entrypoint": "torchrun train.py",
//!     "resources": {"nodes": 64, "constraints": {"gpu_type": "GH200"}},
//!     "lifecycle": {"type": "bounded", "walltime": "72h", "preemption_class": 2},
//!     "data": {"mounts": [{"source": "s3://datasets/imagenet", "target": "/data/input",
//!                          "access": "read-only", "tier_hint": "hot"}], "defaults": true},
//!     "depends_on": [{"ref": "preprocess-job", "condition": "success"}]
//! }});
//! let intent = allocation_from_intent(&req);
//! assert_eq!(intent.tenant.as_deref(), Some("ml-team"));
//! assert_eq!(intent.spec["preemptionClass"], 2);
//! assert_eq!(intent.spec["resources"]["constraints"]["gpuType"], "GH200");
//! assert_eq!(intent.spec["dataMounts"][0]["tierHint"], "hot");
//!
//! let wf: serde_json::Value = serde_yaml::from_str("
//! name: training-pipeline
//! allocations:
//!   - {name: preprocess, entrypoint: 'python preprocess.py', nodes: 2, walltime: 2h}
//!   - {name: train, entrypoint: 'torchrun train.py', nodes: 64, walltime: 72h,
//!      uenv: 'prgenv-gnu/24.11:v1', depends_on: [{preprocess: success}]}
//! ").unwrap();
//! let dag = dag_from_workflow(&wf);
//! assert_eq!(dag.name.as_deref(), Some("training-pipeline"));
//! assert_eq!(dag.spec["allocations"][1]["dependsOn"][0]["preprocess"], "success");
//! assert_eq!(dag.spec["allocations"][1]["spec"]["environment"]["uenv"], "prgenv-gnu/24.11:v1");
//! ```

use serde_json::{Map, Value};

/// Keys whose values are free-form maps: their keys are user data, not field names.
const FREE_FORM: &[&str] = &["tags", "env", "labels", "annotations"];

/// `gpu_type` → `gpuType`.
pub fn snake_to_camel(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut upper = false;
    for c in s.chars() {
        if c == '_' && !out.is_empty() {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Rename every object key from snake_case to camelCase, except inside free-form maps.
/// Iterative over nesting depth is unnecessary: inputs are parsed with serde's recursion limit.
pub fn camel_case_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = snake_to_camel(k);
                    let val = if FREE_FORM.contains(&key.as_str()) {
                        v.clone()
                    } else {
                        camel_case_keys(v)
                    };
                    (key, val)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(camel_case_keys).collect()),
        other => other.clone(),
    }
}

/// An Intent API allocation request, split into identity and spec.
#[derive(Debug, Clone, PartialEq)]
pub struct IntentAllocation {
    /// `name`, if the request had one (otherwise use `metadata.generateName`).
    pub name: Option<String>,
    /// `tenant` (the namespace).
    pub tenant: Option<String>,
    /// The `AllocationSpec` JSON (camelCase; not yet admitted).
    pub spec: Value,
}

/// Translate a seed Intent API allocation request (bare or wrapped in
/// `{"allocation": ...}`) into an Allocation spec. Unknown fields are kept so
/// that admission reports them with their path.
pub fn allocation_from_intent(req: &Value) -> IntentAllocation {
    let body = req.get("allocation").unwrap_or(req);
    let mut spec = match camel_case_keys(body) {
        Value::Object(m) => m,
        other => {
            return IntentAllocation {
                name: None,
                tenant: None,
                spec: other,
            }
        }
    };
    let name = take_string(&mut spec, "name");
    let tenant = take_string(&mut spec, "tenant");
    // Task group form: {type: task_group, template: {...}, range: {start, end}, concurrency}.
    // Nothing is dropped: a template field also given beside it stays in `template`, and
    // a range without whole-number bounds stays as written, for admission to report.
    if spec.get("type").and_then(Value::as_str) == Some("task_group") {
        spec.remove("type");
        let template = spec.remove("template");
        let range = spec.remove("range");
        let concurrency = spec.remove("concurrency");
        match template {
            Some(Value::Object(t)) => {
                let mut left = Map::new();
                for (k, v) in t {
                    if spec.contains_key(&k) {
                        left.insert(k, v);
                    } else {
                        spec.insert(k, v);
                    }
                }
                if !left.is_empty() {
                    spec.insert("template".into(), Value::Object(left));
                }
            }
            Some(other) => {
                spec.insert("template".into(), other);
            }
            None => {}
        }
        let range = match range {
            Some(Value::Object(r)) => {
                let n = |k: &str| r.get(k).and_then(Value::as_u64);
                match (n("start"), n("end"), r.len()) {
                    (Some(a), Some(b), 2) => Value::String(format!("{a}-{b}")),
                    _ => Value::Object(r),
                }
            }
            Some(other) => other,
            None => Value::Null,
        };
        let mut tg = Map::new();
        tg.insert("range".into(), range);
        if let Some(c) = concurrency {
            tg.insert("concurrency".into(), c);
        }
        spec.insert("taskGroup".into(), Value::Object(tg));
    }
    normalize_spec(&mut spec);
    IntentAllocation {
        name,
        tenant,
        spec: Value::Object(spec),
    }
}

/// Move seed-only shapes to their resource fields. Nothing is dropped: a value whose
/// place is already taken (both `nodes` and `resources.nodes`, say) stays where it was
/// written, and admission reports it by its path.
fn normalize_spec(spec: &mut Map<String, Value>) {
    // data: {mounts, defaults} → dataMounts, dataDefaults
    if let Some(Value::Object(mut data)) = spec.remove("data") {
        for (from, to) in [("mounts", "dataMounts"), ("defaults", "dataDefaults")] {
            if !spec.contains_key(to) {
                if let Some(v) = data.remove(from) {
                    spec.insert(to.into(), v);
                }
            }
        }
        if !data.is_empty() {
            spec.insert("data".into(), Value::Object(data)); // reported as unknown
        }
    }
    // lifecycle.preemptionClass → preemptionClass
    if !spec.contains_key("preemptionClass") {
        if let Some(Value::Object(lc)) = spec.get_mut("lifecycle") {
            if let Some(pc) = lc.remove("preemptionClass") {
                spec.insert("preemptionClass".into(), pc);
            }
        }
    }
    // The workflow.yaml short form: nodes / walltime / uenv / view / image at the top.
    for (key, parent) in [
        ("nodes", "resources"),
        ("walltime", "lifecycle"),
        ("uenv", "environment"),
        ("view", "environment"),
        ("image", "environment"),
    ] {
        move_into(spec, key, parent);
    }
}

/// `spec[key]` → `spec[parent][key]` when `parent` is an object (or absent) without `key`.
fn move_into(spec: &mut Map<String, Value>, key: &str, parent: &str) {
    let free = match spec.get(parent) {
        None => true,
        Some(Value::Object(o)) => !o.contains_key(key),
        Some(_) => false,
    };
    if !free {
        return;
    }
    if let Some(v) = spec.remove(key) {
        if let Value::Object(o) = spec
            .entry(parent)
            .or_insert_with(|| Value::Object(Map::new()))
        {
            o.insert(key.into(), v);
        }
    }
}

fn take_string(m: &mut Map<String, Value>, key: &str) -> Option<String> {
    match m.get(key) {
        Some(Value::String(_)) => match m.remove(key) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

/// A DAG request split into identity and spec.
#[derive(Debug, Clone, PartialEq)]
pub struct IntentDag {
    /// `name` of the workflow, if given.
    pub name: Option<String>,
    /// `tenant`, if given.
    pub tenant: Option<String>,
    /// The `DagSpec` JSON (not yet admitted).
    pub spec: Value,
}

/// Translate the seed's `workflow.yaml` (`{name, allocations: [{name, ...,
/// depends_on}]}`) or Intent API DAG submission (`{dag: {allocations: [{id,
/// ..., depends_on}]}}`) into a Dag spec.
pub fn dag_from_workflow(req: &Value) -> IntentDag {
    let body = req.get("dag").unwrap_or(req);
    let Value::Object(top) = body else {
        return IntentDag {
            name: None,
            tenant: None,
            spec: body.clone(),
        };
    };
    let mut top = top.clone();
    let name = take_string(&mut top, "name");
    let tenant = take_string(&mut top, "tenant");
    let tasks = match top.remove("allocations") {
        Some(Value::Array(items)) => Value::Array(items.iter().map(task_from_intent).collect()),
        Some(other) => other,
        None => Value::Array(Vec::new()),
    };
    let mut spec = match camel_case_keys(&Value::Object(top)) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    spec.insert("allocations".into(), tasks);
    IntentDag {
        name,
        tenant,
        spec: Value::Object(spec),
    }
}

fn task_from_intent(item: &Value) -> Value {
    let Value::Object(m) = item else {
        return item.clone();
    };
    let mut m = m.clone();
    if m.contains_key("spec") {
        // Already a task of the resource form (`{name, dependsOn, spec}`): kept as it is,
        // so admission reports anything else with its path.
        if let Some(d) = m.remove("depends_on") {
            m.entry("dependsOn").or_insert(d);
        }
        return Value::Object(m);
    }
    let name = m.remove("name").or_else(|| m.remove("id"));
    let deps = m.remove("depends_on").or_else(|| m.remove("dependsOn"));
    let spec = allocation_from_intent(&Value::Object(m)).spec;
    let mut task = Map::new();
    if let Some(n) = name {
        task.insert("name".into(), n);
    }
    if let Some(d) = deps {
        // Dependency entries are data (`{preprocess: success}`), not field names.
        task.insert("dependsOn".into(), d);
    }
    task.insert("spec".into(), spec);
    Value::Object(task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::admit_typed;
    use crate::{Allocation, Dag};
    use serde_json::json;

    #[test]
    fn seed_full_request_is_admitted() {
        let req = json!({"allocation": {
            "tenant": "ml-team", "project": "gpt-training", "vcluster": "ml-training",
            "tags": {"experiment_id": "run-42"},
            "intent": "train",
            "environment": {"uenv": "prgenv-gnu/24.11:v1", "view": "default"},
            "entrypoint": "torchrun --nproc_per_node=4 train.py",
            "resources": {"nodes": {"min": 32, "max": 128},
                          "constraints": {"gpu_type": "GH200", "features": ["nvme_scratch"], "topology": "tight"}},
            "lifecycle": {"type": "bounded", "walltime": "72h", "preemption_class": 2},
            "data": {"mounts": [{"source": "s3://datasets/imagenet", "target": "/data/input",
                                 "access": "read-only", "tier_hint": "hot"}], "defaults": true},
            "connectivity": {"network_domain": "ml-workspace", "expose": [{"name": "metrics", "port": 9090}]},
            "depends_on": [{"ref": "preprocess-job", "condition": "success"}],
            "checkpoint": {"strategy": "auto"},
            "telemetry": {"mode": "prod"}
        }});
        let i = allocation_from_intent(&req);
        assert_eq!(i.tenant.as_deref(), Some("ml-team"));
        let obj = json!({"metadata": {"name": "run", "namespace": "ml-team"}, "spec": i.spec});
        let a: Allocation = admit_typed(obj).expect("valid");
        assert_eq!(a.spec.preemption_class, Some(2));
        assert_eq!(
            a.spec.tags.get("experiment_id").map(String::as_str),
            Some("run-42")
        );
        assert_eq!(a.spec.data_defaults, Some(true));
    }

    #[test]
    fn task_group_form() {
        let req = json!({"allocation": {"type": "task_group",
            "template": {"entrypoint": "python sweep.py --config=${INDEX}",
                         "resources": {"nodes": 1, "constraints": {"gpu_type": "GH200"}},
                         "lifecycle": {"type": "bounded", "walltime": "4h"}},
            "range": {"start": 0, "end": 99}, "concurrency": 20}});
        let i = allocation_from_intent(&req);
        assert_eq!(
            i.spec["taskGroup"],
            json!({"range": "0-99", "concurrency": 20})
        );
        let obj = json!({"metadata": {"name": "sweep", "namespace": "t"}, "spec": i.spec});
        admit_typed::<Allocation>(obj).expect("valid");
    }

    #[test]
    fn seed_workflow_and_dag_forms_are_admitted() {
        let wf = json!({"name": "training-pipeline", "allocations": [
            {"name": "preprocess", "entrypoint": "python preprocess.py", "nodes": 2, "walltime": "2h"},
            {"name": "train", "entrypoint": "torchrun train.py", "nodes": 64, "walltime": "72h",
             "uenv": "prgenv-gnu/24.11:v1", "depends_on": [{"preprocess": "success"}]},
            {"name": "evaluate", "entrypoint": "python eval.py", "nodes": 1, "walltime": "1h",
             "depends_on": [{"train": "success"}]},
            {"name": "notify-failure", "entrypoint": "python notify.py --status=failed", "nodes": 1,
             "walltime": "10m", "depends_on": [{"train": "failure"}]}
        ]});
        let d = dag_from_workflow(&wf);
        let obj = json!({"metadata": {"name": d.name, "namespace": "ml-team"}, "spec": d.spec});
        let dag: Dag = admit_typed(obj).expect("valid");
        assert_eq!(dag.spec.allocations.len(), 4);

        let api = json!({"dag": {"allocations": [
            {"id": "stage-data", "entrypoint": "python stage.py", "resources": {"nodes": 1},
             "lifecycle": {"type": "bounded", "walltime": "2h"}},
            {"id": "train", "entrypoint": "torchrun train.py",
             "resources": {"nodes": 64, "constraints": {"topology": "tight"}},
             "lifecycle": {"type": "bounded", "walltime": "72h"},
             "depends_on": [{"ref": "stage-data", "condition": "success"}]},
            {"id": "evaluate", "entrypoint": "python eval.py", "resources": {"nodes": 4},
             "depends_on": [{"ref": "train", "condition": "any"}]}
        ]}});
        let d = dag_from_workflow(&api);
        let obj = json!({"metadata": {"name": "wf", "namespace": "ml-team"}, "spec": d.spec});
        admit_typed::<Dag>(obj).expect("valid");
    }

    #[test]
    fn camel_case() {
        assert_eq!(snake_to_camel("gpu_type"), "gpuType");
        assert_eq!(snake_to_camel("already"), "already");
        assert_eq!(snake_to_camel("_x"), "_x");
    }
}
