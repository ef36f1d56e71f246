//! One test per row of the seed's directive mapping table, plus conflicts,
//! unsupported directives, overrides and errors. Every manifest is admitted
//! by the API types.

mod common;
use common::*;

use lattice_compat::{translate, CompatConfig, SubmitError, SubmitFlags};
use serde_json::json;

#[test]
fn nodes_exact_match() {
    let t = tr(&script("#SBATCH --nodes=64"));
    assert_eq!(spec(&t)["resources"]["nodes"], json!(64));
    admit(&t);
}

#[test]
fn nodes_range() {
    let t = tr(&script("#SBATCH -N 2-8"));
    assert_eq!(spec(&t)["resources"]["nodes"], json!({"min": 2, "max": 8}));
    admit(&t);
}

#[test]
fn ntasks_maps_to_node_count() {
    let t = tr(&script("#SBATCH --ntasks=10\n#SBATCH --ntasks-per-node=4"));
    assert_eq!(spec(&t)["resources"]["nodes"], json!(3));
    let ann = &t.allocation["metadata"]["annotations"];
    assert_eq!(ann["lattice.dev/ntasks"], "10");
    assert_eq!(ann["lattice.dev/ntasks-per-node"], "4");
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
}

#[test]
fn ntasks_without_tasks_per_node_warns_and_uses_one_node() {
    let t = tr(&script("#SBATCH -n 256"));
    assert_eq!(spec(&t)["resources"]["nodes"], json!(1));
    assert_eq!(t.warnings.len(), 1);
    assert_eq!(t.warnings[0].source.line(), Some(2));
    assert!(
        t.warnings[0].message.contains("-n 256"),
        "{}",
        t.warnings[0]
    );
}

#[test]
fn ntasks_uses_site_default_tasks_per_node() {
    let mut c = site();
    c.default_tasks_per_node = Some(128);
    let t = translate(&script("#SBATCH --ntasks=256"), &flags(), &c).unwrap();
    assert_eq!(spec(&t)["resources"]["nodes"], json!(2));
    assert!(t.warnings.is_empty());
}

#[test]
fn ntasks_per_node_is_task_config() {
    let t = tr(&script("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4"));
    assert_eq!(spec(&t)["resources"]["nodes"], json!(2));
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/ntasks"],
        "8"
    );
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/ntasks-per-node"],
        "4"
    );
}

#[test]
fn time_maps_to_walltime() {
    let t = tr(&script("#SBATCH --time=72:00:00"));
    assert_eq!(spec(&t)["lifecycle"]["walltime"], "72:00:00");
    let t = tr(&script("#SBATCH -t 1-12:30"));
    assert_eq!(spec(&t)["lifecycle"]["walltime"], "36:30:00");
    let t = tr(&script("#LATTICE --walltime=24h"));
    assert_eq!(spec(&t)["lifecycle"]["walltime"], "24:00:00");
    admit(&t);
}

#[test]
fn time_unlimited_warns_and_omits() {
    let t = tr(&script("#SBATCH --time=UNLIMITED"));
    assert!(spec(&t).get("lifecycle").is_none());
    assert_eq!(t.warnings.len(), 1);
    admit(&t);
}

#[test]
fn partition_maps_to_vcluster() {
    let t = tr(&script("#SBATCH --partition=gpu"));
    assert_eq!(spec(&t)["vcluster"], "ml-training");
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/slurm-partition"],
        "gpu"
    );
    let t = tr(&script("#SBATCH -p ml-training"));
    assert_eq!(spec(&t)["vcluster"], "ml-training");
    admit(&t);
}

#[test]
fn default_vcluster_applies() {
    let t = tr(&script("#SBATCH -N1"));
    assert_eq!(spec(&t)["vcluster"], "hpc-batch");
}

#[test]
fn unknown_partition_is_an_error_listing_vclusters() {
    let e = translate(&script("#SBATCH --partition=bigmem"), &flags(), &site()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("vCluster \"bigmem\" not found. Available: hpc-batch, interactive, ml-training, sensitive-secure"), "{msg}");
    assert_eq!(e.line(), Some(2));
}

#[test]
fn unknown_partition_overridden_by_vcluster_flag_is_fine() {
    let f = SubmitFlags {
        vcluster: Some("interactive".into()),
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH --partition=bigmem"), &f);
    assert_eq!(spec(&t)["vcluster"], "interactive");
}

#[test]
fn partition_passes_through_without_site_mapping() {
    let t = translate(
        &script("#SBATCH -p whatever"),
        &flags(),
        &CompatConfig::default(),
    )
    .unwrap();
    assert_eq!(spec(&t)["vcluster"], "whatever");
}

#[test]
fn partition_list_uses_first_known() {
    let t = tr(&script("#SBATCH -p bigmem,debug"));
    assert_eq!(spec(&t)["vcluster"], "interactive");
    assert_eq!(t.warnings.len(), 1);
}

#[test]
fn account_maps_to_tenant() {
    let t = tr(&script("#SBATCH --account=physics"));
    assert_eq!(t.allocation["metadata"]["namespace"], "physics");
    let t = tr(&script("#SBATCH -A ml_team"));
    assert_eq!(t.allocation["metadata"]["namespace"], "ml-team");
    admit(&t);
}

#[test]
fn job_name_is_a_tag_and_generate_name() {
    let t = tr(&script("#SBATCH --job-name=My_Training.Run"));
    assert_eq!(spec(&t)["tags"]["name"], "My_Training.Run");
    assert_eq!(t.allocation["metadata"]["generateName"], "my-training-run-");
    admit(&t);
}

#[test]
fn default_name_is_script_name() {
    let t = tr(&script("#SBATCH -N 1"));
    assert_eq!(spec(&t)["tags"]["name"], "job.sh");
    assert_eq!(t.allocation["metadata"]["generateName"], "job-sh-");
}

#[test]
fn lattice_name_is_the_object_name() {
    let t = tr(&script("#LATTICE --name=large-training-run"));
    assert_eq!(t.allocation["metadata"]["name"], "large-training-run");
    admit(&t);
    let e = translate(&script("#LATTICE --name=Bad_Name"), &flags(), &site()).unwrap_err();
    assert!(e.to_string().contains("bad-name"), "{e}");
}

#[test]
fn output_and_error_are_download_hints() {
    let t = tr(&script(
        "#SBATCH --output=slurm-%j.out\n#SBATCH -e err-%j.txt",
    ));
    let ann = &t.allocation["metadata"]["annotations"];
    assert_eq!(ann["lattice.dev/output"], "slurm-%j.out");
    assert_eq!(ann["lattice.dev/error"], "err-%j.txt");
    assert!(t.warnings.is_empty());
    admit(&t);
}

#[test]
fn constraint_features() {
    let t = tr(&script("#SBATCH --constraint=gpu&nvme_scratch"));
    assert_eq!(
        spec(&t)["resources"]["constraints"]["features"],
        json!(["gpu", "nvme_scratch"])
    );
    assert!(t.warnings.is_empty());
    admit(&t);
}

#[test]
fn constraint_lattice_keys() {
    let t = tr(&script("#LATTICE --constraint=gpu_type=GH200,gpu_count=4,memory_gb>=512,require_unified_memory,prefer_same_numa"));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"gpuType": "GH200", "gpuCount": 4, "memoryGb": 512, "requireUnifiedMemory": true, "preferSameNuma": true})
    );
    admit(&t);
}

#[test]
fn constraint_or_becomes_any_of() {
    // One node: Slurm's brackets ask nothing more than a plain OR.
    let t = tr(&script("#SBATCH -C \"[a100|h100]\""));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"anyOf": [["a100", "h100"]]})
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    assert!(t.allocation["metadata"]["annotations"]
        .get("lattice.dev/constraint")
        .is_none());
    admit(&t);
    // `lattice submit --constraint` and `#SBATCH --constraint` say the same thing.
    let cli = SubmitFlags {
        constraint: Some("a|b|c".into()),
        ..flags()
    };
    let t = tr_flags(&script("srun ./app"), &cli);
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"anyOf": [["a", "b", "c"]]})
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    let t = tr(&script("#SBATCH --constraint=a|b|c"));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"anyOf": [["a", "b", "c"]]})
    );
    admit(&t);
}

#[test]
fn constraint_and_or_mixes_keep_the_same_nodes() {
    // '&' binds tighter than '|': (gpu AND ib) OR cpu = (gpu OR cpu) AND (ib OR cpu).
    let t = tr(&script("#SBATCH --constraint=gpu&ib|cpu"));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"anyOf": [["gpu", "cpu"], ["ib", "cpu"]]})
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
    // An OR inside an AND: the required feature and one group.
    let t = tr(&script("#SBATCH --constraint=nvme&(a100|h100)"));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"features": ["nvme"], "anyOf": [["a100", "h100"]]})
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
    // Plain AND (and ','): every feature, no warning.
    for c in ["a&b&c", "a,b,c"] {
        let t = tr_flags(
            &script("srun ./app"),
            &SubmitFlags {
                constraint: Some(c.into()),
                ..flags()
            },
        );
        assert_eq!(
            spec(&t)["resources"]["constraints"],
            json!({"features": ["a", "b", "c"]}),
            "{c}"
        );
        assert!(t.warnings.is_empty(), "{c}: {:?}", warnings(&t));
    }
}

#[test]
fn constraint_brackets_on_several_nodes_warn_that_nodes_may_differ() {
    let t = tr(&script(
        "#SBATCH -N 4
#SBATCH -C \"[a100|h100]\"",
    ));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"anyOf": [["a100", "h100"]]})
    );
    assert_eq!(
        warnings(&t),
        ["#SBATCH --constraint=[a100|h100]: [a100|h100] asks Slurm to give every node the same alternative; Lattice requires one of them on each node but may mix them across nodes"]
    );
    assert_eq!(t.warnings[0].source.line(), Some(3));
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/constraint"],
        "[a100|h100]"
    );
    admit(&t);
}

#[test]
fn constraint_alternatives_of_lattice_keys_keep_the_first() {
    let t = tr_flags(
        &script("srun ./app"),
        &SubmitFlags {
            constraint: Some("gpu_type=GH200|gpu_type=MI300A".into()),
            ..flags()
        },
    );
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"gpuType": "GH200"})
    );
    assert_eq!(
        warnings(&t),
        ["--constraint=gpu_type=GH200|gpu_type=MI300A: alternatives other than node features are not supported (anyOf lists features); using \"gpu_type=GH200\" and dropping \"gpu_type=MI300A\" (pick one)"]
    );
    admit(&t);
}

#[test]
fn constraint_too_many_alternatives_is_an_error() {
    let e = translate(
        &script("#SBATCH --constraint=a1&a2&a3&a4&a5|b1&b2&b3&b4&b5"),
        &flags(),
        &site(),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(2));
    let m = e.to_string();
    assert!(
        m.contains("expand to 25 groups") && m.contains("allows 16"),
        "{m}"
    );
}

#[test]
fn constraint_counts_warn() {
    let t = tr(&script("#SBATCH --constraint=\"gpu*2&ib\""));
    assert_eq!(
        spec(&t)["resources"]["constraints"]["features"],
        json!(["gpu", "ib"])
    );
    assert_eq!(t.warnings.len(), 1);
}

#[test]
fn constraint_unknown_key_is_an_error() {
    let e = translate(
        &script("#SBATCH --constraint=cpu_arch=x86"),
        &flags(),
        &site(),
    )
    .unwrap_err();
    let m = e.to_string();
    assert!(m.contains("line 2") && m.contains("Hint"), "{m}");
}

#[test]
fn gres_gpu_count_and_type() {
    let t = tr(&script("#SBATCH --gres=gpu:4"));
    assert_eq!(spec(&t)["resources"]["constraints"], json!({"gpuCount": 4}));
    let t = tr(&script("#SBATCH --gres=gpu:a100:2"));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"gpuCount": 2, "gpuType": "a100"})
    );
    admit(&t);
}

#[test]
fn gres_non_gpu_warns() {
    let t = tr(&script("#SBATCH --gres=gpu:4,nvme:1"));
    assert_eq!(spec(&t)["resources"]["constraints"]["gpuCount"], 4);
    assert_eq!(t.warnings.len(), 1);
}

#[test]
fn gpus_total_divided_over_nodes() {
    let t = tr(&script("#SBATCH -N 2\n#SBATCH --gpus=8"));
    assert_eq!(spec(&t)["resources"]["constraints"]["gpuCount"], 4);
    let t = tr(&script("#SBATCH --gpus-per-node=h100:4"));
    assert_eq!(
        spec(&t)["resources"]["constraints"],
        json!({"gpuCount": 4, "gpuType": "h100"})
    );
}

#[test]
fn exclusive_is_default_and_silent() {
    for e in ["--exclusive", "--exclusive=user", "--exclusive=mcs"] {
        let t = tr(&script(&format!("#SBATCH {e}")));
        assert!(t.warnings.is_empty(), "{e}: {:?}", warnings(&t));
    }
    // A whole topology segment is not reserved.
    let t = tr(&script("#SBATCH --exclusive=topo"));
    assert_eq!(t.warnings.len(), 1, "{:?}", warnings(&t));
    assert!(
        t.warnings[0]
            .message
            .starts_with("#SBATCH --exclusive=topo ignored ("),
        "{}",
        t.warnings[0]
    );
}

#[test]
fn array_maps_to_task_group() {
    let t = tr(&script("#SBATCH --array=0-99%20"));
    assert_eq!(
        spec(&t)["taskGroup"],
        json!({"range": "0-99", "concurrency": 20})
    );
    let t = tr(&script("#SBATCH -a 1,3,5-7:2"));
    assert_eq!(spec(&t)["taskGroup"], json!({"range": "1,3,5-7:2"}));
    admit(&t);
}

#[test]
fn dependency_maps_to_depends_on() {
    let t = tr(&script("#SBATCH --dependency=afterok:123"));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"ref": "123", "condition": "success"}])
    );
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/dependency"],
        "afterok:123"
    );
    let t = tr(&script("#SBATCH -d afterany:1:2,afternotok:3"));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"ref": "1", "condition": "any"}, {"ref": "2", "condition": "any"}, {"ref": "3", "condition": "failure"}])
    );
    admit(&t);
}

#[test]
fn dependency_any_of_and_singleton_are_translated() {
    let t = tr(&script("#SBATCH --dependency=afterok:1?afterok:2"));
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([
            {"ref": "1", "condition": "success", "anyOf": true},
            {"ref": "2", "condition": "success", "anyOf": true}
        ])
    );
    admit(&t);
    // Delays, array tasks and alternatives together, without approximation warnings.
    let t = tr(&script(
        "#SBATCH --dependency=afterok:1+5?afterany:2_3?after:4+1\n#SBATCH --begin=now+1hour",
    ));
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([
            {"ref": "1", "condition": "success", "delay": "5m", "anyOf": true},
            {"ref": "2", "condition": "any", "taskIndex": 3, "anyOf": true},
            {"ref": "4", "condition": "started", "delay": "1m", "anyOf": true},
            {"beginTime": 1_748_782_800.0}
        ])
    );
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/dependency"],
        "afterok:1+5?afterany:2_3?after:4+1"
    );
    admit(&t);
    // `aftercorr` pairs array tasks and cannot be an alternative.
    let f = SubmitFlags {
        dependency: vec!["aftercorr:1?afterok:2".into()],
        task_group: Some("0-3".into()),
        command: vec!["/bin/true".into()],
        script_name: None,
        ..flags()
    };
    let e = translate("", &f, &site()).unwrap_err().to_string();
    assert!(e.contains("'?' alternatives"), "{e}");
    // --depends-on and --dependency add up: a '?' list stays the group of alternatives
    // next to required entries; a second '?' list is refused.
    let f = SubmitFlags {
        depends_on: Some("1:success".into()),
        dependency: vec!["afterok:2?afterok:3".into()],
        command: vec!["/bin/true".into()],
        script_name: None,
        ..flags()
    };
    let t = translate("", &f, &site()).expect("translate");
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([
            {"ref": "1", "condition": "success"},
            {"ref": "2", "condition": "success", "anyOf": true},
            {"ref": "3", "condition": "success", "anyOf": true}
        ])
    );
    admit(&t);
    let f = SubmitFlags {
        depends_on: Some("afterok:1?afterok:2".into()),
        dependency: vec!["afterok:2?afterok:3".into()],
        command: vec!["/bin/true".into()],
        script_name: None,
        ..flags()
    };
    let e = translate("", &f, &site()).unwrap_err().to_string();
    assert!(e.contains("one group of alternatives"), "{e}");
    let t = tr(&script(
        "#SBATCH --job-name=nightly\n#SBATCH --dependency=singleton",
    ));
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    assert_eq!(spec(&t)["dependsOn"], json!([{"singleton": true}]));
    assert_eq!(spec(&t)["tags"]["name"], "nightly");
    admit(&t);
    // Without any job name singleton has nothing to serialize on.
    let f = SubmitFlags {
        dependency: vec!["singleton".into()],
        command: vec!["/bin/true".into()],
        script_name: None,
        ..flags()
    };
    let t = tr_flags("", &f);
    assert!(
        warnings(&t).iter().any(|w| w.contains("no name")),
        "{:?}",
        warnings(&t)
    );
}

/// `lattice submit --dependency` (repeatable) and `--depends-on`: Slurm and Flux RFC 26
/// forms map onto spec.dependsOn.
#[test]
fn slurm_and_flux_dependency_forms_translate() {
    let rows: Vec<(Vec<&str>, Option<&str>, serde_json::Value)> = vec![
        (
            vec!["afterok:a1:a2,afterany:a3"],
            None,
            json!([{"ref": "a1", "condition": "success"}, {"ref": "a2", "condition": "success"}, {"ref": "a3", "condition": "any"}]),
        ),
        (
            vec!["after:a1"],
            None,
            json!([{"ref": "a1", "condition": "started"}]),
        ),
        (
            vec!["afternotok:a1"],
            None,
            json!([{"ref": "a1", "condition": "failure"}]),
        ),
        (vec!["singleton"], None, json!([{"singleton": true}])),
        (
            vec!["begin-time:1767225600.5"],
            None,
            json!([{"beginTime": 1767225600.5}]),
        ),
        (
            vec!["string:ckpt?type=inout"],
            None,
            json!([{"symbol": "ckpt", "type": "inout", "scope": "user"}]),
        ),
        (
            vec!["string:data?type=in&scope=global"],
            None,
            json!([{"symbol": "data", "type": "in", "scope": "global"}]),
        ),
        (
            vec!["afterok:a1", "string:ckpt?type=out", "singleton"],
            None,
            json!([{"ref": "a1", "condition": "success"}, {"symbol": "ckpt", "type": "out", "scope": "user"}, {"singleton": true}]),
        ),
        (
            vec!["afterok:a1,begin-time:100,string:s?type=in;scope=user,after:a2"],
            None,
            json!([{"ref": "a1", "condition": "success"}, {"ref": "a2", "condition": "started"}, {"beginTime": 100.0}, {"symbol": "s", "type": "in", "scope": "user"}]),
        ),
        (
            vec!["after:a3"],
            Some("a1:success,a2:any"),
            json!([{"ref": "a1", "condition": "success"}, {"ref": "a2", "condition": "any"}, {"ref": "a3", "condition": "started"}]),
        ),
        (
            vec![],
            Some("a1:ok,a2:notok"),
            json!([{"ref": "a1", "condition": "success"}, {"ref": "a2", "condition": "failure"}]),
        ),
        (
            vec![],
            Some("0b7c2a64-3f59-4a5e-9b1e-2f2d8c1a9e77"),
            json!([{"ref": "0b7c2a64-3f59-4a5e-9b1e-2f2d8c1a9e77", "condition": "success"}]),
        ),
    ];
    for (i, (dependency, depends_on, expected)) in rows.into_iter().enumerate() {
        let f = SubmitFlags {
            name: Some("nightly".into()),
            dependency: dependency.iter().map(|s| s.to_string()).collect(),
            depends_on: depends_on.map(String::from),
            command: vec!["/bin/true".into()],
            script_name: None,
            ..flags()
        };
        let t = translate("", &f, &site())
            .unwrap_or_else(|e| panic!("row {i} {dependency:?} {depends_on:?}: {e}"));
        assert_eq!(
            spec(&t)["dependsOn"],
            expected,
            "row {i} {dependency:?} {depends_on:?}"
        );
        admit(&t);
    }
    // #SBATCH and #LATTICE directives take the same forms.
    let t = tr(&script(
        "#SBATCH --dependency=after:5+10\n#LATTICE --dependency=string:x?type=out",
    ));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"symbol": "x", "type": "out", "scope": "user"}])
    );
    let t = tr(&script("#SBATCH --dependency=after:5+10"));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"ref": "5", "condition": "started", "delay": "10m"}])
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
    // One array task.
    let t = tr(&script("#SBATCH --dependency=afterok:8_3"));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"ref": "8", "condition": "success", "taskIndex": 3}])
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
}

#[test]
fn slurm_begin_becomes_begin_time() {
    // flags() pins the submission time to 2025-06-01T12:00:00Z.
    let t = tr(&script("#SBATCH --begin=now+1hour"));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"beginTime": 1_748_782_800.0}])
    );
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
    // With other dependencies: one beginTime, the later of --begin and begin-time.
    let t = tr(&script(
        "#SBATCH --begin=now+1hour\n#SBATCH --dependency=afterok:7,begin-time:1748790000",
    ));
    assert_eq!(
        spec(&t)["dependsOn"],
        json!([{"ref": "7", "condition": "success"}, {"beginTime": 1_748_790_000.0}])
    );
    admit(&t);
    let e = translate(&script("#SBATCH --begin=someday"), &flags(), &site()).expect_err("bad");
    assert!(e.to_string().contains("now+N"), "{e}");
}

#[test]
fn dependency_errors_say_what_to_write() {
    let bad: Vec<(Option<&str>, Option<&str>, &str)> = vec![
        (Some("string:foo"), None, "type=in|out|inout"),
        (Some("string:foo?type=sideways"), None, "in, out, inout"),
        (Some("begin-time:soon"), None, "begin-time"),
        (Some("fluid:hungry-hippo"), None, "reserved"),
        (Some("afterok:A1"), None, "is not a job id"),
        (
            Some("afterok:1?afterok:2,afterok:3"),
            None,
            "cannot be mixed",
        ),
        (Some("before:1"), None, "unknown dependency type"),
        (None, Some("a:started"), "--dependency=after:ID"),
        (None, Some("a:mutex"), "singleton"),
        (
            None,
            Some("a1:success,string:x?type=in"),
            "unknown condition",
        ),
    ];
    for (dependency, depends_on, needle) in bad {
        let f = SubmitFlags {
            dependency: dependency.map(|d| vec![d.to_string()]).unwrap_or_default(),
            depends_on: depends_on.map(String::from),
            command: vec!["/bin/true".into()],
            script_name: None,
            ..flags()
        };
        let e = translate("", &f, &site()).expect_err("rejected");
        let text = e.to_string();
        assert!(
            text.contains(needle),
            "{dependency:?} {depends_on:?}: {text}"
        );
    }
}

#[test]
fn qos_maps_to_preemption_class() {
    let t = tr(&script("#SBATCH --qos=high"));
    assert_eq!(spec(&t)["preemptionClass"], 7);
    let t = tr(&script("#SBATCH -q nosuch"));
    assert!(spec(&t).get("preemptionClass").is_none());
    assert_eq!(t.warnings.len(), 1);
    admit(&t);
}

#[test]
fn uenv_and_view() {
    let t = tr(&script(
        "#SBATCH --uenv=prgenv-gnu/24.11:v1\n#SBATCH --view=default",
    ));
    assert_eq!(
        spec(&t)["environment"],
        json!({"uenv": "prgenv-gnu/24.11:v1", "view": "default"})
    );
    admit(&t);
}

#[test]
fn images_from_lattice_and_pyxis_directives() {
    let t = tr(&script("#LATTICE --image=ghcr.io/acme/train:v3"));
    assert_eq!(
        spec(&t)["environment"],
        json!({"image": "ghcr.io/acme/train:v3"})
    );
    assert!(warnings(&t).is_empty(), "{:?}", warnings(&t));
    admit(&t);
    // pyxis writes the registry before a '#' (escaped: in a directive, '#' starts a
    // comment, as in sbatch).
    let t = tr(&script(
        "#SBATCH --container-image=nvcr.io\\#nvidia/pytorch:24.01-py3",
    ));
    assert_eq!(
        spec(&t)["environment"],
        json!({"image": "nvcr.io/nvidia/pytorch:24.01-py3"})
    );
    assert_eq!(
        warnings(&t),
        vec!["#SBATCH --container-image=nvcr.io#nvidia/pytorch:24.01-py3: the pyxis image nvcr.io#nvidia/pytorch:24.01-py3 runs as the OCI image nvcr.io/nvidia/pytorch:24.01-py3"]
    );
    admit(&t);
    // A malformed reference names the option and the part.
    let e = translate(&script("#LATTICE --image=Ubuntu:24.04"), &flags(), &site())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--image") && e.contains("\"Ubuntu\""), "{e}");
}

#[test]
fn unsupported_directives_warn_once_each_with_seed_wording() {
    let t = tr(&script(
        "#SBATCH --mem=64G\n#SBATCH --mail-user=user@example.com\n#SBATCH --mail-type=ALL\n#SBATCH --cpus-per-task=8",
    ));
    assert_eq!(
        warnings(&t),
        vec![
            "#SBATCH --mem=64G ignored (Lattice uses full-node scheduling, memory is not constrainable)",
            "#SBATCH --mail-user=user@example.com ignored (use `lattice watch` for event notifications)",
            "#SBATCH --mail-type=ALL ignored (use `lattice watch` for event notifications)",
            "#SBATCH --cpus-per-task=8 ignored (Lattice uses full-node scheduling; every allocated node is entirely yours)",
        ]
    );
    let lines: Vec<_> = t.warnings.iter().map(|w| w.source.line()).collect();
    assert_eq!(lines, vec![Some(2), Some(3), Some(4), Some(5)]);
    admit(&t);
}

#[test]
fn conflict_nodes_take_precedence_over_ntasks() {
    let t = tr(&script(
        "#SBATCH --nodes=64\n#SBATCH --ntasks=128\n#SBATCH --ntasks-per-node=4",
    ));
    assert_eq!(spec(&t)["resources"]["nodes"], 64);
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/ntasks-per-node"],
        "4"
    );
    assert!(t.warnings.is_empty());
}

#[test]
fn conflict_exclusive_with_mem_warns_about_mem_only() {
    let t = tr(&script("#SBATCH --exclusive\n#SBATCH --mem=64G"));
    assert_eq!(warnings(&t), vec!["#SBATCH --mem=64G ignored (Lattice uses full-node scheduling, memory is not constrainable)"]);
}

#[test]
fn command_line_overrides_directives() {
    let f = SubmitFlags {
        nodes: Some("8".into()),
        walltime: Some("30m".into()),
        tenant: Some("chem".into()),
        ..flags()
    };
    let t = tr_flags(
        &script("#SBATCH -N 2\n#SBATCH -t 10:00:00\n#SBATCH -A physics"),
        &f,
    );
    assert_eq!(spec(&t)["resources"]["nodes"], 8);
    assert_eq!(spec(&t)["lifecycle"]["walltime"], "00:30:00");
    assert_eq!(t.allocation["metadata"]["namespace"], "chem");
}

#[test]
fn sbatch_command_line_args_override_directives_and_lose_to_lattice_flags() {
    let f = SubmitFlags {
        sbatch_args: vec!["-N".into(), "4".into(), "--time=5".into()],
        walltime: Some("1h".into()),
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH -N 2\n#SBATCH -t 10"), &f);
    assert_eq!(spec(&t)["resources"]["nodes"], 4);
    assert_eq!(spec(&t)["lifecycle"]["walltime"], "01:00:00");
}

#[test]
fn later_directive_wins() {
    let t = tr(&script("#SBATCH -N 2\n#SBATCH --nodes=3"));
    assert_eq!(spec(&t)["resources"]["nodes"], 3);
}

#[test]
fn all_lattice_flags() {
    let f = SubmitFlags {
        nodes: Some("4".into()),
        walltime: Some("2h".into()),
        constraint: Some("gpu_type=GH200".into()),
        uenv: Some("prgenv-gnu/24.11:v1".into()),
        view: Some("default".into()),
        tools_uenv: Some("debug-tools/1.0".into()),
        vcluster: Some("ml-training".into()),
        tenant: Some("physics".into()),
        project: Some("gpt".into()),
        name: Some("train-1".into()),
        task_group: Some("0-99%20".into()),
        depends_on: Some("prep:success,other:any".into()),
        data_mount: vec![
            "s3://bucket/dataset:/data".into(),
            "/store/x:/out:rw".into(),
        ],
        preemption_class: Some("8".into()),
        checkpoint: Some("grpc".into()),
        checkpoint_port: Some("9999".into()),
        network_domain: Some("my-run".into()),
        env: vec!["OMP_NUM_THREADS=8".into()],
        command: vec!["torchrun".into(), "train.py".into()],
        script_name: None,
        ..Default::default()
    };
    let t = translate("", &f, &site()).unwrap();
    let s = spec(&t);
    assert_eq!(s["entrypoint"], "torchrun");
    assert_eq!(s["args"], json!(["train.py"]));
    assert_eq!(s["environment"]["toolsUenv"], "debug-tools/1.0");
    assert_eq!(s["checkpoint"], json!({"strategy": "grpc", "port": 9999}));
    assert_eq!(s["preemptionClass"], 8);
    assert_eq!(s["dataMounts"][1]["access"], "read-write");
    assert_eq!(s["connectivity"]["networkDomain"], "my-run");
    assert_eq!(s["project"], "gpt");
    assert_eq!(
        t.allocation["metadata"]["labels"]["lattice.dev/frontend"],
        "lattice"
    );
    admit(&t);
}

#[test]
fn service_and_reactive() {
    let f = SubmitFlags {
        service: true,
        expose: vec!["8080".into(), "metrics:9090".into()],
        command: vec!["serve".into()],
        ..Default::default()
    };
    let t = translate("", &f, &site()).unwrap();
    assert_eq!(spec(&t)["lifecycle"]["type"], "unbounded");
    assert_eq!(spec(&t)["connectivity"]["expose"][0]["name"], "port-8080");
    admit(&t);
    let f = SubmitFlags {
        reactive: true,
        min_nodes: Some("1".into()),
        max_nodes: Some("8".into()),
        scale_metric: Some("gpu_utilization".into()),
        scale_target: Some("0.8".into()),
        command: vec!["serve".into()],
        ..Default::default()
    };
    let t = translate("", &f, &site()).unwrap();
    assert_eq!(
        spec(&t)["lifecycle"]["scalePolicy"],
        json!({"minNodes": 1, "maxNodes": 8, "metric": "gpu_utilization", "target": 0.8})
    );
    admit(&t);
    let f = SubmitFlags {
        reactive: true,
        command: vec!["serve".into()],
        ..Default::default()
    };
    assert!(matches!(
        translate("", &f, &site()),
        Err(SubmitError::Conflict { .. })
    ));
}

#[test]
fn no_preempt_and_sensitive() {
    let f = SubmitFlags {
        no_preempt: true,
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH -N1"), &f);
    assert_eq!(spec(&t)["checkpoint"]["strategy"], "none");
    assert_eq!(spec(&t)["preemptionClass"], 7);
    admit(&t);
    let f = SubmitFlags {
        sensitive: true,
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH --qos=low\n#SBATCH --no-requeue"), &f);
    assert_eq!(spec(&t)["sensitive"], true);
    assert!(spec(&t).get("preemptionClass").is_none());
    admit(&t);
}

/// What becomes of the admitted allocation, running on `n1`, when `n1` goes Down.
fn after_node_failure(t: &lattice_compat::Translation) -> lattice_apis::AllocationPhase {
    let mut v = admit(t);
    v["status"] = json!({"phase": "Running", "assignedNodes": ["n1"], "attempt": 0});
    let mut a: lattice_apis::Allocation = serde_json::from_value(v).expect("allocation");
    let now: lattice_apis::meta::Time = "2026-01-01T02:00:00Z".parse().expect("time");
    lattice_apis::lifecycle::node_failed(&mut a, "n1", now);
    a.phase()
}

#[test]
fn requeue_options_set_the_requeue_policy() {
    use lattice_apis::AllocationPhase;
    // --requeue: back in the queue after a node failure, as Slurm requeues the batch job.
    let t = tr(&script("#SBATCH --requeue"));
    assert_eq!(spec(&t)["requeue"], json!({"policy": "on_node_failure"}));
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    assert_eq!(after_node_failure(&t), AllocationPhase::Pending);
    // --no-requeue: never.
    let t = tr(&script("#SBATCH --no-requeue"));
    assert_eq!(spec(&t)["requeue"], json!({"policy": "never"}));
    assert_eq!(after_node_failure(&t), AllocationPhase::Failed);
    // The last one given wins; the sbatch command line overrides the script.
    let t = tr(&script("#SBATCH --requeue\n#SBATCH --no-requeue"));
    assert_eq!(spec(&t)["requeue"]["policy"], "never");
    let f = SubmitFlags {
        sbatch_args: vec!["--requeue".into()],
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH --no-requeue"), &f);
    assert_eq!(spec(&t)["requeue"]["policy"], "on_node_failure");
    // Neither: the API's default (which also requeues after a node failure).
    let t = tr(&script("#SBATCH -N 1"));
    assert!(spec(&t).get("requeue").is_none());
    // Sensitive work is never requeued automatically: --requeue is refused with a warning.
    let f = SubmitFlags {
        sensitive: true,
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH --requeue"), &f);
    assert!(spec(&t).get("requeue").is_none());
    assert_eq!(
        warnings(&t),
        ["#SBATCH --requeue ignored (sensitive allocations are never requeued automatically)"]
    );
    admit(&t);
}

#[test]
fn lattice_directives_without_dashes() {
    let t = tr("#!/bin/bash\n#LATTICE nodes=64\n#LATTICE walltime=2:00:00\n#LATTICE vcluster=hpc-batch\n#LATTICE network_domain=my-training-run\nmpirun ./app\n");
    assert_eq!(spec(&t)["resources"]["nodes"], 64);
    assert_eq!(spec(&t)["lifecycle"]["walltime"], "02:00:00");
    assert_eq!(spec(&t)["connectivity"]["networkDomain"], "my-training-run");
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
}

#[test]
fn invalid_time_names_line_and_hint() {
    let e = translate(
        &script("#SBATCH -N 2\n#SBATCH --time=1:2:3:4"),
        &flags(),
        &site(),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(3));
    let m = e.to_string();
    assert!(
        m.contains("--time") && m.contains("1:2:3:4") && m.contains("Hint:"),
        "{m}"
    );
}

#[test]
fn nothing_to_run() {
    assert!(matches!(
        translate("", &SubmitFlags::default(), &site()),
        Err(SubmitError::NothingToRun { .. })
    ));
}

#[test]
fn chdir_and_submit_dir() {
    let t = tr(&script("#SBATCH -D /scratch/run"));
    assert_eq!(spec(&t)["workingDir"], "/scratch/run");
    let t = tr(&script("#SBATCH --chdir=sub"));
    assert_eq!(spec(&t)["workingDir"], "/home/alice/project/sub");
    let t = tr(&script("#SBATCH -N 1"));
    assert_eq!(spec(&t)["workingDir"], "/home/alice/project");
    assert_eq!(
        t.allocation["metadata"]["annotations"]["lattice.dev/submit-dir"],
        "/home/alice/project"
    );
}

#[test]
fn export_pairs_become_env() {
    let t = tr(&script("#SBATCH --export=NONE,OMP_NUM_THREADS=4"));
    assert_eq!(spec(&t)["env"], json!({"OMP_NUM_THREADS": "4"}));
    assert!(t.warnings.is_empty());
    let t = tr(&script("#SBATCH --export=PATH,HOME"));
    assert_eq!(t.warnings.len(), 1);
    // ALL (sbatch copies the submitting shell's environment) is not honoured: said so.
    let t = tr(&script("#SBATCH --export=ALL,OMP_NUM_THREADS=4"));
    assert_eq!(spec(&t)["env"], json!({"OMP_NUM_THREADS": "4"}));
    assert_eq!(
        warnings(&t),
        ["#SBATCH --export=ALL,OMP_NUM_THREADS=4: sbatch would copy the submitting shell's whole environment (ALL); Lattice does not forward the submit environment, set what the job needs with --env KEY=VALUE"]
    );
}

#[test]
fn client_options() {
    let t = tr(&script("#SBATCH --parsable\n#SBATCH --wait"));
    assert!(t.client.parsable && t.client.wait);
    assert!(t.warnings.is_empty());
}

#[test]
fn script_is_kept_verbatim() {
    let s = script("#SBATCH -N 1");
    let t = tr(&s);
    assert_eq!(spec(&t)["script"], s.as_str());
    assert_eq!(t.allocation["apiVersion"], "lattice.dev/v1alpha1");
    assert_eq!(t.allocation["kind"], "Allocation");
}

#[test]
fn site_config_compat_section_and_aliases() {
    let c = CompatConfig::from_yaml("compat:\n  partition_mapping:\n    gpu: ml-training\n  qos_mapping:\n    high: 7\n  set_slurm_env: true\n").unwrap();
    assert_eq!(c.partitions["gpu"], "ml-training");
    assert_eq!(c.qos["high"], 7);
    assert!(c.set_slurm_env);
    assert!(CompatConfig::from_yaml("qos:\n  x: 11\n").is_err());
    assert!(CompatConfig::from_yaml("partitons: {}\n").is_err());
    assert_eq!(
        CompatConfig::from_yaml("").unwrap(),
        CompatConfig::default()
    );
}

#[test]
fn unknown_vcluster_flag_is_an_error_when_the_site_lists_vclusters() {
    let f = SubmitFlags {
        vcluster: Some("nope".into()),
        ..flags()
    };
    let e = translate(&script("#SBATCH -N 1"), &f, &site()).unwrap_err();
    assert!(
        e.to_string()
            .contains("Available: hpc-batch, interactive, ml-training, sensitive-secure"),
        "{e}"
    );
    let t = translate(&script("#SBATCH -N 1"), &f, &CompatConfig::default()).unwrap();
    assert_eq!(spec(&t)["vcluster"], "nope");
}

#[test]
fn view_without_uenv_warns_on_its_line() {
    let t = tr(&script("#SBATCH -N 1\n#SBATCH --view=default"));
    assert_eq!(t.warnings.len(), 1);
    assert_eq!(t.warnings[0].source.line(), Some(3));
    assert!(spec(&t).get("environment").is_none());
    admit(&t);
}

#[test]
fn unsupported_on_sbatch_command_line_warns_without_prefix() {
    let f = SubmitFlags {
        sbatch_args: vec!["--mem=4G".into()],
        ..flags()
    };
    let t = tr_flags(&script("#SBATCH -N 1"), &f);
    assert_eq!(
        warnings(&t),
        vec!["--mem=4G ignored (Lattice uses full-node scheduling, memory is not constrainable)"]
    );
}

#[test]
fn names_the_api_would_reject_are_errors_at_their_line() {
    // An account with nothing to make a tenant name of.
    let e = translate(
        &script("#SBATCH -N 1\n#SBATCH --account=__"),
        &flags(),
        &site(),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(3));
    let m = e.to_string();
    assert!(
        m.contains("no letter or digit") && m.contains("accounts:"),
        "{m}"
    );
    let e = translate(
        &script("#LATTICE --network-domain=My_Net"),
        &flags(),
        &site(),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(2));
    let e = translate(&script("#SBATCH --uenv=\"a b\""), &flags(), &site()).unwrap_err();
    assert_eq!(e.line(), Some(2));
}

/// A site without a vCluster list: partitions pass through as vCluster names.
fn open_site() -> CompatConfig {
    CompatConfig::from_yaml("accounts:\n  ml_team: ml-team\n").expect("site")
}

#[test]
fn slurm_account_and_partition_names_are_made_valid_with_a_warning() {
    let t = translate(
        &script("#SBATCH -A proj_1234\n#SBATCH -p gpu_long"),
        &flags(),
        &open_site(),
    )
    .unwrap();
    assert_eq!(t.allocation["metadata"]["namespace"], "proj-1234");
    assert_eq!(spec(&t)["vcluster"], "gpu-long");
    // The names as written stay in the annotations.
    let ann = &t.allocation["metadata"]["annotations"];
    assert_eq!(ann["lattice.dev/slurm-account"], "proj_1234");
    assert_eq!(ann["lattice.dev/slurm-partition"], "gpu_long");
    assert_eq!(
        warnings(&t),
        [
            "#SBATCH --account=proj_1234: account \"proj_1234\" is not a valid tenant name; using tenant \"proj-1234\" (map it under accounts: in lattice-compat.yaml to choose another)",
            "#SBATCH --partition=gpu_long: partition \"gpu_long\" is not a valid vCluster name; using vCluster \"gpu-long\" (map it under partitions: in lattice-compat.yaml to choose another)",
        ]
    );
    assert_eq!(t.warnings[0].source.line(), Some(2));
    assert_eq!(t.warnings[1].source.line(), Some(3));
    admit(&t);
    // Upper case too, from the sbatch command line.
    let f = SubmitFlags {
        sbatch_args: vec!["-A".into(), "ABC-DEF99".into()],
        ..flags()
    };
    let t = translate(&script("srun ./app"), &f, &open_site()).unwrap();
    assert_eq!(t.allocation["metadata"]["namespace"], "abc-def99");
    assert_eq!(
        warnings(&t),
        ["--account=ABC-DEF99: account \"ABC-DEF99\" is not a valid tenant name; using tenant \"abc-def99\" (map it under accounts: in lattice-compat.yaml to choose another)"]
    );
    // Valid names need no warning.
    let t = translate(
        &script("#SBATCH -A physics\n#SBATCH -p debug"),
        &flags(),
        &open_site(),
    )
    .unwrap();
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
}

#[test]
fn a_site_mapping_wins_over_the_made_valid_name() {
    let site = CompatConfig::from_yaml(
        "accounts:\n  proj_1234: climate\npartitions:\n  gpu_long: ml-training\n",
    )
    .expect("site");
    let t = translate(
        &script("#SBATCH -A proj_1234\n#SBATCH -p gpu_long"),
        &flags(),
        &site,
    )
    .unwrap();
    assert_eq!(t.allocation["metadata"]["namespace"], "climate");
    assert_eq!(spec(&t)["vcluster"], "ml-training");
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
}

#[test]
fn a_listed_vcluster_is_found_under_the_made_valid_name() {
    let site = CompatConfig::from_yaml("vclusters: [gpu-long, normal]\n").expect("site");
    let t = translate(&script("#SBATCH -p gpu_long"), &flags(), &site).unwrap();
    assert_eq!(spec(&t)["vcluster"], "gpu-long");
    assert_eq!(t.warnings.len(), 1, "{:?}", warnings(&t));
    // Made valid but still not offered: the usual error listing what is.
    let e = translate(&script("#SBATCH -p big_mem"), &flags(), &site).unwrap_err();
    let m = e.to_string();
    assert!(
        m.starts_with("vCluster \"big_mem\" not found. Available: gpu-long, normal"),
        "{m}"
    );
    assert_eq!(e.line(), Some(2));
}

#[test]
fn invalid_lattice_tenant_and_vcluster_flags_stay_errors() {
    // --tenant and --vcluster are Lattice names, taken as written.
    for (f, line) in [
        (
            SubmitFlags {
                tenant: Some("Big_Lab".into()),
                ..flags()
            },
            None,
        ),
        (
            SubmitFlags {
                vcluster: Some("GPU_Long".into()),
                ..flags()
            },
            None,
        ),
    ] {
        let e = translate(&script("srun ./app"), &f, &open_site()).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("is not a valid"), "{m}");
        assert_eq!(e.line(), line);
    }
    let e = translate(&script("#LATTICE --tenant=Big_Lab"), &flags(), &open_site()).unwrap_err();
    assert_eq!(e.line(), Some(2));
    let m = e.to_string();
    assert!(
        m.contains("--tenant") && m.contains("not a valid tenant name") && m.contains("big-lab"),
        "{m}"
    );
    let e = translate(
        &script("#LATTICE --vcluster=GPU_Long"),
        &flags(),
        &open_site(),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(2));
    assert!(e.to_string().contains("--vcluster=gpu-long"), "{e}");
}

#[test]
fn a_site_mapping_to_an_invalid_name_is_refused_when_read() {
    for (yaml, key) in [
        ("accounts:\n  ml_team: ML_Team\n", "accounts.ml_team"),
        ("partitions:\n  gpu: GPU\n", "partitions.gpu"),
        ("vclusters: [ok, Not_Ok]\n", "vclusters[1]"),
        ("default_vcluster: Batch_Q\n", "default_vcluster"),
    ] {
        let e = CompatConfig::from_yaml(yaml).unwrap_err().to_string();
        assert!(
            e.contains(key) && e.contains("is not a valid") && e.contains("Hint: write e.g."),
            "{yaml}: {e}"
        );
    }
}

fn nodelist_flags(list: &str, nodes: Option<&str>) -> SubmitFlags {
    SubmitFlags {
        nodelist: Some(list.into()),
        nodes: nodes.map(str::to_string),
        ..flags()
    }
}

#[test]
fn nodelist_claims_nodes_and_sets_the_count() {
    // Hostlist syntax; the count follows the list when --nodes is not given.
    let t = tr_flags(
        &script("srun ./app"),
        &nodelist_flags("sn-[01-04],gpu7", None),
    );
    assert_eq!(
        spec(&t)["resources"]["nodeNames"],
        json!(["sn-01", "sn-02", "sn-03", "sn-04", "gpu7"])
    );
    assert_eq!(spec(&t)["resources"]["nodes"], json!(5));
    assert!(t.warnings.is_empty(), "{:?}", warnings(&t));
    admit(&t);
    // An explicit --nodes that agrees is fine, also from the script.
    let t = tr_flags(&script("srun ./app"), &nodelist_flags("n1,n2", Some("2")));
    assert_eq!(spec(&t)["resources"]["nodes"], json!(2));
    let t = tr_flags(&script("#SBATCH -N 2"), &nodelist_flags("n[1-2]", None));
    assert_eq!(spec(&t)["resources"]["nodeNames"], json!(["n1", "n2"]));
    admit(&t);
    // #LATTICE --nodelist works like the flag.
    let t = tr(&script("#LATTICE --nodelist=x[08-10]"));
    assert_eq!(
        spec(&t)["resources"]["nodeNames"],
        json!(["x08", "x09", "x10"])
    );
    assert_eq!(spec(&t)["resources"]["nodes"], json!(3));
    admit(&t);
}

#[test]
fn nodelist_and_a_different_node_count_is_an_error_naming_both() {
    let e = translate(
        &script("srun ./app"),
        &nodelist_flags("sn-[01-04]", Some("8")),
        &site(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("asks for 8 nodes but --nodelist=sn-[01-04] names 4"),
        "{e}"
    );
    assert!(e.contains("--nodes=4"), "{e}");
    let e = translate(
        &script("#SBATCH -N 3"),
        &nodelist_flags("a,b", None),
        &site(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("#SBATCH -N 3 (line 2 (#SBATCH)) asks for 3 nodes"),
        "{e}"
    );
    assert!(e.contains("names 2"), "{e}");
    let e = translate(
        &script("srun ./app"),
        &nodelist_flags("a,b", Some("1-4")),
        &site(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("1-4 nodes") && e.contains("exactly 2"), "{e}");
}

#[test]
fn nodelist_errors() {
    for (list, want) in [
        ("a[1-2", "not a valid hostlist"),
        ("", "empty"),
        ("n1,n2,n1", "listed twice"),
        ("Node_1", "not a node name"),
    ] {
        let e = translate(&script("srun ./app"), &nodelist_flags(list, None), &site())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{list:?}: {e}");
        assert!(e.contains("Hint:"), "{list:?}: {e}");
    }
    let reactive = SubmitFlags {
        reactive: true,
        min_nodes: Some("1".into()),
        max_nodes: Some("4".into()),
        scale_metric: Some("gpu_utilization".into()),
        scale_target: Some("0.8".into()),
        ..nodelist_flags("a,b", None)
    };
    assert!(matches!(
        translate(&script("srun ./app"), &reactive, &site()),
        Err(SubmitError::Conflict { .. })
    ));
    let array = SubmitFlags {
        task_group: Some("0-3".into()),
        ..nodelist_flags("a,b", None)
    };
    assert!(matches!(
        translate(&script("srun ./app"), &array, &site()),
        Err(SubmitError::Conflict { .. })
    ));
}

#[test]
fn sbatch_nodelist_directive_claims_nodes_like_the_flag() {
    for line in [
        "#SBATCH --nodelist=nid[001-004]",
        "#SBATCH -w nid[001-004]",
        "#SBATCH -wnid[001-004]",
        "#SBATCH --nodel=nid[001-004]",
    ] {
        let t = tr(&script(line));
        assert_eq!(
            spec(&t)["resources"]["nodeNames"],
            json!(["nid001", "nid002", "nid003", "nid004"]),
            "{line}"
        );
        assert_eq!(spec(&t)["resources"]["nodes"], json!(4), "{line}");
        assert!(t.warnings.is_empty(), "{line}: {:?}", warnings(&t));
        admit(&t);
    }
    // Same result as `lattice submit --nodelist`.
    let flag = tr_flags(
        &script("srun ./app"),
        &nodelist_flags("sn-[01-04],gpu7", None),
    );
    let directive = tr(&script("#SBATCH -w sn-[01-04],gpu7"));
    assert_eq!(
        spec(&directive)["resources"],
        spec(&flag)["resources"],
        "the directive and the flag expand the same way"
    );
    // With -N: they must agree (Lattice claims exactly the listed nodes).
    let t = tr(&script("#SBATCH -N 2\n#SBATCH -w n[1-2]"));
    assert_eq!(spec(&t)["resources"]["nodeNames"], json!(["n1", "n2"]));
    let e = translate(
        &script("#SBATCH -N 4\n#SBATCH -w n[1-2]"),
        &flags(),
        &site(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(
            "#SBATCH -N 4 (line 2 (#SBATCH)) asks for 4 nodes but #SBATCH -w n[1-2] (line 3 (#SBATCH)) names 2"
        ),
        "{e}"
    );
    assert!(
        e.contains("--nodes=2") && e.contains("exactly the listed nodes"),
        "{e}"
    );
    // The command line's --nodelist replaces the script's.
    let t = tr_flags(&script("#SBATCH -w n[1-2]"), &nodelist_flags("m7", None));
    assert_eq!(spec(&t)["resources"]["nodeNames"], json!(["m7"]));
    assert_eq!(spec(&t)["resources"]["nodes"], json!(1));
    // --exclude (and --nodefile) still cannot be honoured: one warning each.
    let t = tr(&script(
        "#SBATCH -w n[1-2]\n#SBATCH -x n3\n#SBATCH --exclude=n4",
    ));
    assert_eq!(
        warnings(&t),
        [
            "#SBATCH -x n3 ignored (Lattice places allocations itself, packing them into dragonfly groups)",
            "#SBATCH --exclude=n4 ignored (Lattice places allocations itself, packing them into dragonfly groups)",
        ]
    );
    assert_eq!(spec(&t)["resources"]["nodeNames"], json!(["n1", "n2"]));
}

#[test]
fn sbatch_nodelist_directive_errors_name_the_line() {
    for (line, want) in [
        ("#SBATCH -w n[1-2", "not a valid hostlist"),
        ("#SBATCH -w n1,n1", "listed twice"),
        ("#SBATCH --nodelist=Node_1", "not a node name"),
        // sbatch reads a value with '/' as a file of names; Lattice does not.
        ("#SBATCH --nodelist=./hosts.txt", "node-list files"),
        ("#SBATCH -w /etc/hosts", "node-list files"),
    ] {
        let e = translate(&script(line), &flags(), &site()).unwrap_err();
        assert_eq!(e.line(), Some(2), "{line}");
        let m = e.to_string();
        assert!(m.contains(want), "{line}: {m}");
        assert!(m.contains("Hint:"), "{line}: {m}");
    }
    // A task group or --reactive cannot claim nodes, from a directive either.
    let e = translate(
        &script("#SBATCH -w n[1-2]\n#SBATCH --array=0-3"),
        &flags(),
        &site(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("#SBATCH -w n[1-2] (line 2 (#SBATCH)) and a task group"),
        "{e}"
    );
}
