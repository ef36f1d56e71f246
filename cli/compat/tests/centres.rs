//! Scripts as HPC centres write them run unchanged: every line of the header is either
//! honoured or named in a warning, and names that are not Lattice names are made valid.

mod common;
use common::*;

use lattice_compat::directives::{ArgKind, SBATCH_OPTIONS};
use lattice_compat::{translate, CompatConfig, SubmitFlags, Translation};
use serde_json::{json, Value};

/// A GPU job as a centre's user guide shows it (CSCS / NERSC / JSC style): a project
/// account and a partition with underscores, a feature alternative, a DataWarp burst
/// buffer, requeue on node failure, and the usual binding and mail options.
const CENTRE_SCRIPT: &str = r#"#!/bin/bash -l
#SBATCH --job-name=climate-run
#SBATCH --account=proj_1234
#SBATCH --partition=gpu_long
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=72
#SBATCH --time=1-00:00:00
#SBATCH --constraint="gpu|mc"
#SBATCH --hint=nomultithread
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=alice@example.org
#SBATCH --output=run-%j.out
#SBATCH --error=run-%j.err
#DW jobdw type=scratch capacity=2TiB access_mode=striped
#DW stage_in source=/project/proj_1234/input destination=$DW_JOB_STRIPED/input type=directory

export OMP_NUM_THREADS=72
srun --cpu-bind=cores ./climate.exe
"#;

/// The centre's mapping: its vClusters listed, no entry for `proj_1234` or `gpu_long`.
const CENTRE_SITE: &str = "partitions:\n  normal: hpc-batch\n  debug: interactive\nqos:\n  normal: 4\nvclusters: [hpc-batch, interactive, gpu-long]\ndefault_vcluster: hpc-batch\n";

fn centre() -> Translation {
    let site = CompatConfig::from_yaml(CENTRE_SITE).expect("site");
    let f = SubmitFlags {
        script_name: Some("climate.sh".into()),
        ..flags()
    };
    match translate(CENTRE_SCRIPT, &f, &site) {
        Ok(t) => t,
        Err(e) => panic!("translate failed: {e}"),
    }
}

#[test]
fn a_centre_script_runs_unchanged_with_every_difference_named() {
    let t = centre();
    let w: Vec<String> = t.warnings.iter().map(|w| w.with_location()).collect();
    let bb =
        "(burst buffers are not supported; use --data-mount to pre-stage data to the hot tier)";
    let full = "(Lattice uses full-node scheduling; every allocated node is entirely yours)";
    let mail = "(use `lattice watch` for event notifications)";
    assert_eq!(
        w,
        [
            "line 3: #SBATCH --account=proj_1234: account \"proj_1234\" is not a valid tenant name; using tenant \"proj-1234\" (map it under accounts: in lattice-compat.yaml to choose another)".to_string(),
            "line 4: #SBATCH --partition=gpu_long: partition \"gpu_long\" is not a valid vCluster name; using vCluster \"gpu-long\" (map it under partitions: in lattice-compat.yaml to choose another)".to_string(),
            format!("line 7: #SBATCH --cpus-per-task=72 ignored {full}"),
            format!("line 10: #SBATCH --hint=nomultithread ignored {full}"),
            format!("line 13: #SBATCH --mail-type=END,FAIL ignored {mail}"),
            format!("line 14: #SBATCH --mail-user=alice@example.org ignored {mail}"),
            format!("line 17: #DW jobdw type=scratch capacity=2TiB access_mode=striped ignored {bb}"),
            format!("line 18: #DW stage_in source=/project/proj_1234/input destination=$DW_JOB_STRIPED/input type=directory ignored {bb}"),
        ]
    );

    let mut a = t.allocation.clone();
    assert_eq!(a["spec"]["script"], CENTRE_SCRIPT);
    a["spec"]["script"] = json!("<script>");
    assert_eq!(
        a,
        json!({
            "apiVersion": "lattice.dev/v1alpha1",
            "kind": "Allocation",
            "metadata": {
                "generateName": "climate-run-",
                "namespace": "proj-1234",
                "labels": {"lattice.dev/frontend": "sbatch"},
                "annotations": {
                    "lattice.dev/batch-host": "first",
                    "lattice.dev/error": "run-%j.err",
                    "lattice.dev/ntasks": "16",
                    "lattice.dev/ntasks-per-node": "4",
                    "lattice.dev/output": "run-%j.out",
                    "lattice.dev/slurm-account": "proj_1234",
                    "lattice.dev/slurm-partition": "gpu_long",
                    "lattice.dev/submit-dir": "/home/alice/project",
                },
            },
            "spec": {
                "script": "<script>",
                "vcluster": "gpu-long",
                "tags": {"name": "climate-run"},
                "workingDir": "/home/alice/project",
                "lifecycle": {"walltime": "24:00:00"},
                "resources": {
                    "nodes": 4,
                    "constraints": {"anyOf": [["gpu", "mc"]]},
                },
                "requeue": {"policy": "on_node_failure"},
            },
        })
    );
    // The API server admits it as it is.
    let admitted = admit(&t);
    assert_eq!(
        admitted["spec"]["resources"]["constraints"]["anyOf"],
        json!([["gpu", "mc"]])
    );
    assert_eq!(admitted["spec"]["requeue"]["policy"], "on_node_failure");
}

/// The value each translated option is tried with (any value does for the others).
fn sample(option: &str) -> &'static str {
    match option {
        "account" => "physics",
        "array" => "0-3",
        "begin" => "now+1hour",
        "chdir" => "/scratch/run",
        "constraint" => "nvme",
        "dependency" => "afterok:123",
        "export" => "A=1",
        "gpus" | "gpus-per-node" => "4",
        "gres" => "gpu:4",
        "nodelist" => "n1",
        "nodes" => "2",
        "ntasks" | "ntasks-per-node" => "4",
        "partition" => "gpu",
        "qos" => "high",
        "time" => "10",
        "uenv" => "prgenv-gnu/24.11:v1",
        _ => "x",
    }
}

/// Options that change nothing because Lattice already does what they ask.
const HONOURED_AS_DEFAULT: &[(&str, &str)] = &[
    ("exclusive", "every allocation has whole nodes of its own"),
    (
        "ignore-pbs",
        "Lattice never reads #PBS / #BSUB lines (tested below)",
    ),
];

/// Every sbatch option changes the manifest or the client's behaviour, or is named in a
/// warning: none is accepted and dropped without a word.
#[test]
fn no_sbatch_option_is_dropped_silently() {
    let base_script = script("#SBATCH -N 1");
    let base = tr(&base_script);
    let outcome = |t: &Translation| -> Value {
        let mut a = t.allocation.clone();
        a["spec"]["script"] = Value::Null;
        json!({"allocation": a, "warnings": t.warnings, "client": t.client})
    };
    let mut silent = Vec::new();
    for def in SBATCH_OPTIONS {
        if HONOURED_AS_DEFAULT.iter().any(|(n, _)| *n == def.long) {
            continue;
        }
        let opt = match def.arg {
            ArgKind::Required => format!("--{}={}", def.long, sample(def.long)),
            ArgKind::None | ArgKind::Optional => format!("--{}", def.long),
        };
        let text = script(&format!("#SBATCH -N 1\n#SBATCH {opt}"));
        match translate(&text, &flags(), &site()) {
            Ok(t) if outcome(&t) == outcome(&base) => silent.push(opt),
            Ok(_) => {}
            Err(e) => silent.push(format!("{opt} (failed: {e})")),
        }
    }
    assert!(
        silent.is_empty(),
        "accepted without effect or warning: {silent:?}"
    );
}

#[test]
fn ignore_pbs_silences_the_pbs_warning_only() {
    let text = "#!/bin/bash\n#PBS -l walltime=1:00:00\n#BSUB -q normal\n#DW jobdw capacity=1GB\n#SBATCH -N 1\nsrun ./app\n";
    let bb = "#DW jobdw capacity=1GB ignored (burst buffers are not supported; use --data-mount to pre-stage data to the hot tier)";
    let t = tr(text);
    assert_eq!(
        warnings(&t),
        [
            "#PBS directives on line(s) 2 are not supported and were ignored; use #SBATCH or #LATTICE",
            "#BSUB directives on line(s) 3 are not supported and were ignored; use #SBATCH or #LATTICE",
            bb,
        ]
    );
    // In the script or on the sbatch command line; the burst buffer is still named
    // (--ignore-pbs is about other schedulers' directives).
    let in_script = tr(&text.replace("#SBATCH -N 1", "#SBATCH -N 1 --ignore-pbs"));
    assert_eq!(warnings(&in_script), [bb]);
    let f = SubmitFlags {
        sbatch_args: vec!["--ignore-pbs".into()],
        ..flags()
    };
    assert_eq!(warnings(&tr_flags(text, &f)), [bb]);
}
