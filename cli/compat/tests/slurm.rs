//! Slurm front-end: argument translation, squeue formatting, SLURM_* annotations, hostlists.

mod common;
use common::*;

use chrono::{TimeZone, Utc};
use lattice_compat::hostlist::{compress, expand};
use lattice_compat::slurm::*;
use serde_json::json;

fn a(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn h(v: &[&str]) -> Vec<String> {
    a(v)
}

#[test]
fn hostlist_compression() {
    assert_eq!(
        compress(&h(&["nid001", "nid002", "nid003", "nid004", "nid007"])),
        "nid[001-004,007]"
    );
    assert_eq!(
        compress(&h(&["nid007", "nid001", "nid002", "nid001"])),
        "nid[001-002,007]"
    );
    assert_eq!(compress(&h(&["nid001"])), "nid001");
    assert_eq!(compress(&h(&["n9", "n10", "n11"])), "n[9-11]");
    assert_eq!(
        compress(&h(&["x1000c0s0b0n0", "x1000c0s0b0n1", "login"])),
        "login,x1000c0s0b0n[0-1]"
    );
    assert_eq!(compress(&h(&["a1", "b1", "b2"])), "a1,b[1-2]");
    assert_eq!(compress(&[]), "");
}

#[test]
fn hostlist_expansion_roundtrip() {
    let hosts = h(&["nid001", "nid002", "nid003", "nid004", "nid007"]);
    assert_eq!(expand(&compress(&hosts), 100).unwrap(), hosts);
    assert_eq!(expand("a[1-2],b", 10).unwrap(), h(&["a1", "a2", "b"]));
    assert!(expand("a[1-2", 10).is_none());
    assert!(expand("a[1-100000]", 10).is_none());
}

fn alloc() -> serde_json::Value {
    json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": {
            "name": "a1b2c3d4",
            "namespace": "physics",
            "annotations": {"lattice.dev/user": "alice", "lattice.dev/ntasks-per-node": "4", "lattice.dev/submit-dir": "/home/alice", "lattice.dev/slurm-qos": "high"}
        },
        "spec": {
            "vcluster": "hpc-batch",
            "tags": {"name": "train.sh"},
            "resources": {"nodes": 4},
            "lifecycle": {"walltime": "24:00:00"},
            "taskGroup": {"range": "0-15:4", "concurrency": 2}
        },
        "status": {
            "phase": "Running",
            "assignedNodes": ["nid001", "nid002", "nid003", "nid007"],
            "startTime": "2026-03-05T10:00:00Z"
        }
    })
}

fn pending() -> serde_json::Value {
    json!({
        "metadata": {"name": "e5f6", "namespace": "physics"},
        "spec": {"resources": {"nodes": {"min": 2, "max": 8}}, "dependsOn": [{"ref": "a1b2c3d4", "condition": "success"}]},
        "status": {"phase": "Pending", "reason": "Dependency"}
    })
}

fn now() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 5, 11, 2, 3).unwrap()
}

#[test]
fn squeue_h_o_percent_i() {
    let out = format_squeue(&[alloc(), pending()], Some("%i"), true, now());
    assert_eq!(out, "a1b2c3d4\ne5f6\n");
}

#[test]
fn squeue_default_format() {
    let out = format_squeue(&[alloc(), pending()], None, false, now());
    let expected = "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n          a1b2c3d4 hpc-batch train.sh    alice  R    1:02:03      4 nid[001-003,007]\n              e5f6               e5f6        - PD       0:00      2 (Dependency)\n";
    assert_eq!(out, expected);
}

#[test]
fn squeue_all_fields() {
    let out = format_squeue(
        &[alloc()],
        Some("%i|%j|%T|%t|%u|%M|%l|%L|%D|%N|%P|%a|%q|%R|%K|%S|%%"),
        false,
        now(),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "JOBID|NAME|STATE|ST|USER|TIME|TIME_LIMIT|TIME_LEFT|NODES|NODELIST|PARTITION|ACCOUNT|QOS|NODELIST(REASON)|ARRAY_TASK_ID|START_TIME|%");
    assert_eq!(lines[1], "a1b2c3d4|train.sh|RUNNING|R|alice|1:02:03|1-00:00:00|22:57:57|4|nid[001-003,007]|hpc-batch|physics|high|nid[001-003,007]|0-15:4|2026-03-05T10:00:00|%");
    let out = format_squeue(&[pending()], Some("%.10i %-6T %E"), true, now());
    assert_eq!(
        out, "      e5f6 PENDIN afterok:a1b2c3d4\n",
        "squeue truncates to the width"
    );
}

/// The agent sets `SLURM_*` from what the translator writes: the opt-in annotation (site
/// `set_slurm_env: true`), the task counts, the job name and the submit directory
/// (`lattice-agent`'s `env` module reads the same keys).
#[test]
fn manifest_carries_what_the_agent_needs_for_slurm_env() {
    let t = tr(&script(
        "#SBATCH -J sim\n#SBATCH -n 8\n#SBATCH --ntasks-per-node=4",
    ));
    let ann = &t.allocation["metadata"]["annotations"];
    assert_eq!(ann["lattice.dev/set-slurm-env"], "true");
    assert_eq!(ann["lattice.dev/ntasks"], "8");
    assert_eq!(ann["lattice.dev/ntasks-per-node"], "4");
    assert_eq!(ann["lattice.dev/submit-dir"], "/home/alice/project");
    assert_eq!(t.allocation["spec"]["tags"]["name"], "sim");
    // Without the site setting there is no annotation (agents' --slurm-env still applies).
    let plain = lattice_compat::translate("#!/bin/sh\nhostname\n", &flags(), &Default::default())
        .expect("translate");
    assert!(plain.allocation["metadata"]["annotations"]
        .get("lattice.dev/set-slurm-env")
        .is_none());
}

#[test]
fn sbatch_translation() {
    let i = sbatch_to_lattice(&a(&[
        "--parsable",
        "-N",
        "4",
        "--time=24:00:00",
        "-p",
        "gpu",
        "train.sh",
        "arg1",
    ]))
    .unwrap();
    assert_eq!(i.script.as_deref(), Some("train.sh"));
    assert_eq!(
        i.sbatch_args,
        a(&["--parsable", "-N", "4", "--time=24:00:00", "-p", "gpu"])
    );
    assert!(i.invocation.parsable);
    assert_eq!(
        i.invocation.argv,
        a(&[
            "submit",
            "--nodes=4",
            "--walltime=24:00:00",
            "--vcluster=gpu",
            "train.sh"
        ])
    );
    assert_eq!(i.invocation.warnings.len(), 1, "script args warned");
    let i = sbatch_to_lattice(&a(&[
        "--array=0-99%20",
        "--dependency=afterok:123",
        "job.sh",
    ]))
    .unwrap();
    assert_eq!(
        i.invocation.argv,
        a(&[
            "submit",
            "--task-group=0-99%20",
            "--dependency=afterok:123",
            "job.sh"
        ])
    );
    let i = sbatch_to_lattice(&a(&["--wrap", "hostname", "-N2"])).unwrap();
    assert_eq!(i.wrap.as_deref(), Some("hostname"));
    let i = sbatch_to_lattice(&a(&["--mem=4G", "x.sh"])).unwrap();
    assert_eq!(i.invocation.warnings.len(), 1);
    // -w has a `lattice submit` flag now: --nodelist, not a warning.
    let i = sbatch_to_lattice(&a(&["-w", "nid[01-02]", "-x", "nid03", "x.sh"])).unwrap();
    assert_eq!(
        i.invocation.argv,
        a(&["submit", "--nodelist=nid[01-02]", "x.sh"])
    );
    assert_eq!(
        i.invocation.warnings,
        ["--exclude has no `lattice submit` flag; it is applied through the sbatch options"]
    );
    assert_eq!(sbatch_output("123", true), "123");
    assert_eq!(sbatch_output("123", false), "Submitted batch job 123");
}

#[test]
fn squeue_translation() {
    let i = squeue_to_lattice(&a(&["-h", "-o", "%i", "-u", "alice"])).unwrap();
    assert!(i.noheader);
    assert_eq!(i.format.as_deref(), Some("%i"));
    assert_eq!(i.argv, a(&["status", "--user=alice", "-o", "json"]));
    let i = squeue_to_lattice(&a(&["-j", "12,13", "-t", "PD,R"])).unwrap();
    assert_eq!(
        i.argv,
        a(&[
            "status",
            "12",
            "13",
            "--state=pending,running",
            "--all",
            "-o",
            "json"
        ])
    );
    let i = squeue_to_lattice(&a(&["--me", "-p", "debug"])).unwrap();
    assert_eq!(i.argv, a(&["status", "--vcluster=debug", "-o", "json"]));
    assert!(squeue_to_lattice(&a(&["-u"])).is_err());
}

#[test]
fn scancel_translation() {
    assert_eq!(
        scancel_to_lattice(&a(&["123", "124"])).unwrap().argv,
        a(&["cancel", "123", "124"])
    );
    assert_eq!(
        scancel_to_lattice(&a(&["-u", "alice"])).unwrap().argv,
        a(&["cancel", "--all-mine"])
    );
    assert_eq!(
        scancel_to_lattice(&a(&["-u", "alice", "-t", "PENDING"]))
            .unwrap()
            .argv,
        a(&["cancel", "--all-mine", "--state=pending"])
    );
    let i = scancel_to_lattice(&a(&["123_4"])).unwrap();
    assert_eq!(i.argv, a(&["cancel", "123"]));
    assert_eq!(i.warnings.len(), 1);
    assert!(scancel_to_lattice(&[]).is_err());
}

#[test]
fn scancel_keeps_the_user_and_the_name() {
    // -u USER is kept for the caller to check against the current user.
    let i = scancel_to_lattice(&a(&["-u", "bob"])).unwrap();
    assert_eq!(i.user.as_deref(), Some("bob"));
    let i = scancel_to_lattice(&a(&["--user=alice", "-t", "R"])).unwrap();
    assert_eq!(i.user.as_deref(), Some("alice"));
    assert_eq!(i.argv, a(&["cancel", "--all-mine", "--state=running"]));
    assert!(scancel_to_lattice(&a(&["-u", "alice,bob"])).is_err());
    // -n NAME is a job-name filter, never a job id.
    for args in [
        &["-n", "train.sh"][..],
        &["--name=train.sh"],
        &["--jobname", "train.sh"],
        &["-ntrain.sh"],
    ] {
        let i = scancel_to_lattice(&a(args)).unwrap();
        assert_eq!(i.name.as_deref(), Some("train.sh"), "{args:?}");
        assert_eq!(i.argv, a(&["cancel", "--all-mine"]), "{args:?}");
        assert!(i.user.is_none());
    }
    let i = scancel_to_lattice(&a(&["-n", "sim", "123"])).unwrap();
    assert_eq!(
        (i.name.as_deref(), i.argv),
        (Some("sim"), a(&["cancel", "123"]))
    );
    assert!(scancel_to_lattice(&a(&["-n"])).is_err());
    // --me is kept for the caller, with job ids too (Slurm ANDs it with the ids).
    let i = scancel_to_lattice(&a(&["--me", "123", "124"])).unwrap();
    assert!(i.me && i.user.is_none());
    assert_eq!(i.argv, a(&["cancel", "123", "124"]));
    let i = scancel_to_lattice(&a(&["--me"])).unwrap();
    assert!(i.me);
    assert_eq!(i.argv, a(&["cancel", "--all-mine"]));
    assert!(!scancel_to_lattice(&a(&["123"])).unwrap().me);
    // -Q is quiet; filters Lattice cannot apply, --signal, -i and unknown options are errors
    // (ignoring them would cancel more than asked).
    assert_eq!(
        scancel_to_lattice(&a(&["-Q", "123"])).unwrap().argv,
        a(&["cancel", "123"])
    );
    for args in [
        &["-p", "debug", "-u", "alice"][..],
        &["-q", "high", "123"],
        &["--account=physics", "--me"],
        &["-w", "nid001"],
        &["--signal=USR1", "123"],
        &["-s", "KILL", "123"],
        &["-i", "123"],
        &["--bogus", "123"],
    ] {
        let e = scancel_to_lattice(&a(args)).expect_err(&format!("{args:?}"));
        let text = e.to_string();
        assert!(text.contains("Hint:"), "{args:?}: {text}");
    }
}

#[test]
fn sinfo_and_sacct_translation() {
    assert_eq!(sinfo_to_lattice(&[]).unwrap().argv, a(&["nodes"]));
    assert_eq!(
        sinfo_to_lattice(&a(&["-N", "-p", "gpu", "-t", "idle,drain"]))
            .unwrap()
            .argv,
        a(&["nodes", "--vcluster=gpu", "--state=ready,draining"])
    );
    assert_eq!(
        sinfo_to_lattice(&a(&["-n", "nid[001-002]"])).unwrap().argv,
        a(&["nodes", "nid001", "nid002"])
    );
    assert_eq!(
        sacct_to_lattice(&[]).unwrap().argv,
        a(&["history", "-o", "json"])
    );
    assert_eq!(
        sacct_to_lattice(&a(&["-j", "123", "-X", "-n", "-P"]))
            .unwrap()
            .argv,
        a(&["status", "123", "-o", "json"])
    );
    // -j with -S/-E: `lattice status` has no --since; the window travels separately.
    let i = sacct_to_lattice(&a(&["-j", "123", "-S", "2026-03-01", "-E", "2026-03-02"])).unwrap();
    assert_eq!(i.argv, a(&["status", "123", "-o", "json"]));
    assert_eq!(i.since.as_deref(), Some("2026-03-01"));
    assert_eq!(i.until.as_deref(), Some("2026-03-02"));
    let i = sacct_to_lattice(&a(&["--starttime=2026-03-01", "--jobs=7,8", "-u", "bob"])).unwrap();
    assert_eq!(i.argv, a(&["status", "7", "8", "--user=bob", "-o", "json"]));
    assert_eq!((i.since.as_deref(), i.until), (Some("2026-03-01"), None));
    assert_eq!(
        sacct_to_lattice(&a(&["-S", "2026-03-01", "-E", "2026-03-02", "-u", "bob"]))
            .unwrap()
            .argv,
        a(&[
            "history",
            "--since=2026-03-01",
            "--until=2026-03-02",
            "--user=bob",
            "-o",
            "json"
        ])
    );
}

#[test]
fn state_mapping() {
    assert_eq!(slurm_state_to_phase("pd"), Some("pending"));
    assert_eq!(slurm_state_to_phase("TIMEOUT"), Some("failed"));
    assert_eq!(phase_to_slurm("Running"), ("RUNNING", "R"));
    assert_eq!(slurm_duration(59), "0:59");
    assert_eq!(slurm_duration(3600), "1:00:00");
    assert_eq!(slurm_duration(90061), "1-01:01:01");
}
