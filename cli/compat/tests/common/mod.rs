#![allow(dead_code)]

use lattice_compat::{translate, CompatConfig, SubmitFlags, Translation};
use serde_json::Value;

pub const SITE: &str = r#"
partitions:
  normal: hpc-batch
  debug: interactive
  gpu: ml-training
  long: hpc-batch
  sensitive: sensitive-secure
qos:
  low: 1
  normal: 4
  high: 7
  urgent: 9
accounts:
  ml_team: ml-team
vclusters: [hpc-batch, ml-training, interactive, sensitive-secure]
default_vcluster: hpc-batch
set_slurm_env: true
"#;

pub fn site() -> CompatConfig {
    CompatConfig::from_yaml(SITE).expect("site config parses")
}

pub fn flags() -> SubmitFlags {
    SubmitFlags {
        script_name: Some("job.sh".into()),
        submit_dir: Some("/home/alice/project".into()),
        // 2025-06-01T12:00:00Z: relative times (`--begin=now+1hour`) are reproducible.
        now: Some(1_748_779_200),
        ..Default::default()
    }
}

pub fn tr(script: &str) -> Translation {
    match translate(script, &flags(), &site()) {
        Ok(t) => t,
        Err(e) => panic!("translate failed: {e}\n--- script ---\n{script}"),
    }
}

pub fn tr_flags(script: &str, f: &SubmitFlags) -> Translation {
    match translate(script, f, &site()) {
        Ok(t) => t,
        Err(e) => panic!("translate failed: {e}\n--- script ---\n{script}"),
    }
}

pub fn spec(t: &Translation) -> &Value {
    &t.allocation["spec"]
}

pub fn warnings(t: &Translation) -> Vec<String> {
    t.warnings.iter().map(|w| w.to_string()).collect()
}

/// Validate with the API types' admission (strict parse + defaults + validation).
pub fn admit(t: &Translation) -> Value {
    let mut v = t.allocation.clone();
    if v["metadata"].get("namespace").is_none() {
        v["metadata"]["namespace"] = Value::String("physics".into());
    }
    if v["metadata"].get("name").is_none() {
        // The server would generate the name from generateName.
        let g = v["metadata"]["generateName"]
            .as_str()
            .unwrap_or("x-")
            .to_string();
        v["metadata"]["name"] = Value::String(format!("{g}abc12"));
    }
    let kind = lattice_apis::find_kind("Allocation").expect("Allocation kind");
    match (kind.admit)(v.clone()) {
        Ok(a) => a,
        Err(e) => panic!(
            "admission rejected the manifest: {e}\n{}",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        ),
    }
}

pub fn script(directives: &str) -> String {
    format!("#!/bin/bash\n{directives}\nsrun ./app\n")
}
