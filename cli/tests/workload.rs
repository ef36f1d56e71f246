//! The workload verbs (submit, status, cancel, watch, logs, history, nodes, node, dag,
//! admin, compat) against the in-process fake API server, with golden files.
//! `UPDATE_GOLDEN=1 cargo test -p lattice-cli --test workload` regenerates them.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::*;

const ALLOCS: &str = "/apis/lattice.dev/v1alpha1/namespaces/default/allocations";

fn a(name: &str, phase: &str, user: Option<&str>) -> Value {
    let mut v = json!({
        "apiVersion": GV, "kind": "Allocation",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "7",
                     "creationTimestamp": "2026-01-01T10:00:00Z", "annotations": {}},
        "spec": {"resources": {"nodes": 4}, "vcluster": "hpc-batch", "entrypoint": "/bin/train",
                 "lifecycle": {"walltime": "24h"}},
        "status": {"phase": phase}
    });
    if let Some(u) = user {
        v["metadata"]["annotations"]["lattice.dev/user"] = json!(u);
    }
    v
}

/// The seed's example queue: a running job, a pending one with a reason, a task group,
/// someone else's job, and finished ones.
async fn queue() -> Fake {
    let f = start().await;
    let mut r = a("a1b2c3d4", "Running", Some("alice"));
    r["spec"]["tags"] = json!({"name": "train.sh"});
    r["spec"]["environment"] = json!({"uenv": "prgenv-gnu/24.11:v1"});
    r["spec"]["project"] = json!("gpt");
    r["spec"]["resources"]["constraints"] = json!({"gpuType": "GH200"});
    r["status"]["startTime"] = json!("2026-01-01T11:47:26Z");
    r["status"]["assignedNodes"] = json!(["nid001", "nid002", "nid003", "nid004"]);
    r["status"]["topologyGroups"] = json!([3]);
    f.insert("allocations", r);
    let mut p = a("eval-job", "Pending", Some("alice"));
    p["spec"]["lifecycle"]["walltime"] = json!("2h");
    p["spec"]["resources"]["nodes"] = json!(64);
    p["status"]["reason"] = json!("waiting_for_quota");
    p["status"]["message"] = json!("waiting for quota headroom");
    p["metadata"]["creationTimestamp"] = json!("2026-01-01T11:00:00Z");
    f.insert("allocations", p);
    let mut t = a("sweep", "Running", Some("alice"));
    t["spec"]["resources"]["nodes"] = json!(1);
    t["spec"]["lifecycle"]["walltime"] = json!("4h");
    t["spec"]["taskGroup"] = json!({"range": "0-99", "concurrency": 20});
    t["status"]["startTime"] = json!("2026-01-01T10:47:27Z");
    t["metadata"]["creationTimestamp"] = json!("2026-01-01T11:10:00Z");
    f.insert("allocations", t);
    let mut child = a("sweep-0", "Running", None);
    child["metadata"]["labels"] = json!({"lattice.dev/task-group": "sweep"});
    f.insert("allocations", child);
    let mut b = a("bobs-job", "Running", Some("bob"));
    b["status"]["startTime"] = json!("2026-01-01T11:00:00Z");
    f.insert("allocations", b);
    let mut d = a("done-1", "Completed", Some("alice"));
    d["status"]["startTime"] = json!("2026-01-01T08:00:00Z");
    d["status"]["endTime"] = json!("2026-01-01T09:30:00Z");
    d["status"]["exitCode"] = json!(0);
    f.insert("allocations", d);
    let mut x = a("crashed", "Failed", Some("alice"));
    x["status"]["startTime"] = json!("2026-01-01T09:00:00Z");
    x["status"]["endTime"] = json!("2026-01-01T09:00:42Z");
    x["status"]["exitCode"] = json!(137);
    x["status"]["signal"] = json!(9);
    x["status"]["reason"] = json!("non_zero_exit");
    f.insert("allocations", x);
    f
}

fn alice() -> Opts {
    Opts::alice(std::path::Path::new("/home/alice/project"))
}

async fn run_alice(url: &str, args: &[&str]) -> Run {
    run_opts(url, args, alice()).await
}

fn last(f: &Fake, method: &str) -> Recorded {
    f.requests()
        .into_iter()
        .rev()
        .find(|q| q.method == method)
        .unwrap_or_else(|| panic!("no {method} request"))
}

#[tokio::test]
async fn status_tables() {
    let f = queue().await;
    let r = run_alice(&f.url, &["status"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("status.txt", &r.out);
    let r = run_alice(&f.url, &["status", "--all", "-o", "wide"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("status_wide.txt", &r.out);
    let r = run_alice(&f.url, &["status", "--state=pending", "--verbose"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("status_verbose.txt", &r.out);
    let r = run_alice(&f.url, &["status", "--user=bob", "--no-headers"]).await;
    assert_eq!(r.out.lines().count(), 1, "{}", r.out);
    assert!(r.out.starts_with("bobs-job "), "{}", r.out);
    let r = run_alice(&f.url, &["status", "--state=running,finished", "--count"]).await;
    assert_eq!(r.out, "4\n", "{}", r.err);
    let r = run_alice(&f.url, &["status", "--tasks", "--all", "-o", "name"]).await;
    assert!(r.out.contains("sweep-0\n"), "{}", r.out);
    let r = run_alice(&f.url, &["status", "a1b2c3d4", "-o", "json"]).await;
    let v: Value = serde_json::from_str(&r.out).expect("json");
    assert_eq!(v["metadata"]["name"], "a1b2c3d4");
    let r = run_alice(&f.url, &["status", "-o", "yaml"]).await;
    assert!(r.out.starts_with("apiVersion: v1\nitems:\n"), "{}", r.out);
}

#[tokio::test]
async fn status_errors() {
    let f = queue().await;
    let r = run_alice(&f.url, &["status", "a1b2c3d4", "ghost"]).await;
    assert_eq!(r.code, 3, "not found exits 3");
    golden("status_missing.txt", &format!("{}---\n{}", r.out, r.err));
    let r = run_alice(&f.url, &["status", "--state=sleeping"]).await;
    assert_eq!(r.code, 2, "bad --state is a usage error");
    golden("error_bad_state.txt", &r.err);
    let r = run_alice(&f.url, &["-t", "nobody", "status"]).await;
    assert_eq!((r.code, r.out.as_str()), (0, ""));
    assert_eq!(
        r.err,
        "No allocations of yours in tenant \"nobody\" (--all shows everyone's).\n"
    );
}

#[tokio::test]
async fn status_watch_refreshes_until_interrupted() {
    let f = queue().await;
    let shutdown: lattice_cli::Shutdown = Box::pin(tokio::time::sleep(Duration::from_millis(1500)));
    let mut o = alice();
    o.shutdown = Some(shutdown);
    let r = run_opts(
        &f.url,
        &["status", "--watch", "--interval=1", "--state=pending"],
        o,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let frames = r.out.matches("Every 1s: lattice status").count();
    assert!(frames >= 2, "{}", r.out);
}

#[tokio::test]
async fn status_watch_json_is_json_lines() {
    let f = queue().await;
    // The "cluster": after the first refresh eval-job starts and crashed is removed.
    let state = f.state.clone();
    let changer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut st = state.lock().expect("lock");
        let key = |n: &str| {
            (
                "allocations".to_string(),
                "default".to_string(),
                n.to_string(),
            )
        };
        if let Some(a) = st.objects.get_mut(&key("eval-job")) {
            a["status"]["phase"] = json!("Running");
            a["metadata"]["resourceVersion"] = json!("8");
        }
        st.objects.remove(&key("crashed"));
    });
    let shutdown: lattice_cli::Shutdown = Box::pin(tokio::time::sleep(Duration::from_millis(2600)));
    let mut o = alice();
    o.shutdown = Some(shutdown);
    let r = run_opts(
        &f.url,
        &["status", "--watch", "--interval=1", "-o", "json"],
        o,
    )
    .await;
    changer.await.expect("changer");
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(!r.out.contains("Every"), "no header on stdout: {}", r.out);
    let events: Vec<(String, String, String)> = r
        .out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
            assert!(!l.contains('\n'));
            (
                v["type"].as_str().expect("type").to_string(),
                v["object"]["metadata"]["name"]
                    .as_str()
                    .expect("name")
                    .to_string(),
                v["object"]["status"]["phase"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let e = |t: &str, n: &str, p: &str| (t.to_string(), n.to_string(), p.to_string());
    // First refresh: every allocation of alice's (creation order, then name), then only the changes;
    // refreshes without changes print nothing.
    assert_eq!(
        events,
        vec![
            e("ADDED", "a1b2c3d4", "Running"),
            e("ADDED", "crashed", "Failed"),
            e("ADDED", "done-1", "Completed"),
            e("ADDED", "eval-job", "Pending"),
            e("ADDED", "sweep", "Running"),
            e("MODIFIED", "eval-job", "Running"),
            e("DELETED", "crashed", "Failed"),
        ],
        "{}",
        r.out
    );
}

#[tokio::test]
async fn cancel_marks_and_keeps() {
    let f = queue().await;
    let r = run_alice(&f.url, &["cancel", "eval-job", "done-1", "ghost"]).await;
    assert_eq!(r.code, 3);
    golden("cancel.txt", &format!("{}---\n{}", r.out, r.err));
    let p = last(&f, "PATCH");
    assert_eq!(p.path, format!("{ALLOCS}/eval-job"));
    assert_eq!(p.content_type, "application/merge-patch+json");
    assert_eq!(
        serde_json::from_str::<Value>(&p.body).expect("json"),
        json!({"metadata": {"annotations": {"lattice.dev/cancel-requested": "true"}}})
    );
    // The object is kept, with the annotation.
    let kept = f.get("allocations", "default", "eval-job").expect("kept");
    assert_eq!(
        kept["metadata"]["annotations"]["lattice.dev/cancel-requested"],
        "true"
    );
    let r = run_alice(&f.url, &["cancel", "eval-job"]).await;
    assert_eq!(r.out, "Cancel already requested for allocation eval-job\n");

    // --all-mine: only alice's unfinished ones (not bob's, not the finished ones).
    let f = queue().await;
    let r = run_alice(&f.url, &["cancel", "--state=running", "--all-mine"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.out,
        "Cancel requested for allocation a1b2c3d4\nCancel requested for allocation sweep\n"
    );
    let r = run_alice(&f.url, &["cancel"]).await;
    assert_eq!(r.code, 2);
    golden("error_cancel_usage.txt", &r.err);
}

#[tokio::test]
async fn watch_prints_changes_until_terminal() {
    let f = queue().await;
    let mut staging = a("eval-job", "Staging", Some("alice"));
    staging["status"]["assignedNodes"] = json!(["nid001", "nid002"]);
    let mut running = staging.clone();
    running["status"]["phase"] = json!("Running");
    let mut done = running.clone();
    done["status"]["phase"] = json!("Failed");
    done["status"]["exitCode"] = json!(2);
    done["status"]["reason"] = json!("non_zero_exit");
    done["status"]["message"] = json!("node nid002 exited 2");
    f.state
        .lock()
        .expect("lock")
        .watch_script
        .push_back(WatchReply::Events(vec![
            json!({"type": "MODIFIED", "object": staging}),
            json!({"type": "MODIFIED", "object": running.clone()}),
            json!({"type": "MODIFIED", "object": running}),
            json!({"type": "MODIFIED", "object": done}),
        ]));
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        run_alice(&f.url, &["watch", "eval-job"]),
    )
    .await
    .expect("ends at the terminal state");
    assert_eq!(r.code, 1, "Failed exits 1: {}", r.err);
    golden("watch_alloc.txt", &r.out);
    let w = f
        .requests()
        .into_iter()
        .find(|q| q.query.get("watch").map(String::as_str) == Some("true"))
        .expect("watch request");
    assert_eq!(
        w.query.get("fieldSelector").map(String::as_str),
        Some("metadata.name=eval-job")
    );
    // From the list's revision (100 here), not the object's own last change ("7"), which
    // compaction may have passed.
    assert_eq!(
        w.query.get("resourceVersion").map(String::as_str),
        Some("100")
    );
    // Already finished: one line, exit 0, no watch.
    let r = run_alice(&f.url, &["watch", "done-1", "-o", "json"]).await;
    assert_eq!(r.code, 0);
    let v: Value = serde_json::from_str(r.out.trim()).expect("json line");
    assert_eq!(v["state"], "Completed");
}

#[tokio::test]
async fn logs_query_and_errors() {
    let f = queue().await;
    f.state
        .lock()
        .expect("lock")
        .logs
        .insert("a1b2c3d4".into(), "[2026-03-05T10:00:12Z] Epoch 1/100, loss=2.341\n[2026-03-05T10:01:45Z] Epoch 2/100, loss=1.892\n".into());
    let r = run_alice(
        &f.url,
        &[
            "logs",
            "a1b2c3d4",
            "--follow",
            "--tail=100",
            "--stderr",
            "--node=nid001",
            "--since=10m",
            "--until=2026-01-01T12:30:00Z",
            "--timestamps",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "[2026-03-05T10:00:12Z] Epoch 1/100, loss=2.341\n[2026-03-05T10:01:45Z] Epoch 2/100, loss=1.892\n");
    let q = last(&f, "GET");
    assert_eq!(q.path, format!("{ALLOCS}/a1b2c3d4/log"));
    let g = |k: &str| q.query.get(k).cloned().unwrap_or_default();
    assert_eq!(g("follow"), "true");
    assert_eq!(g("tailLines"), "100");
    assert_eq!(g("stream"), "stderr");
    assert_eq!(g("node"), "nid001");
    assert_eq!(g("sinceTime"), "2026-01-01T11:50:00Z");
    assert_eq!(g("untilTime"), "2026-01-01T12:30:00Z");
    assert_eq!(g("timestamps"), "true");
    let r = run_alice(&f.url, &["logs", "a1b2c3d4", "-o", "json"]).await;
    assert_eq!(
        r.out.lines().next(),
        Some(r#"{"id":"a1b2c3d4","line":"[2026-03-05T10:00:12Z] Epoch 1/100, loss=2.341"}"#)
    );
    let r = run_alice(&f.url, &["logs", "ghost"]).await;
    assert_eq!(r.code, 3);
    golden("error_logs_missing.txt", &r.err);
    f.state.lock().expect("lock").no_log_endpoint = true;
    let r = run_alice(&f.url, &["logs", "a1b2c3d4"]).await;
    assert_eq!(r.code, 1);
    golden("error_logs_no_endpoint.txt", &r.err.replace(&f.url, "URL"));
}

#[tokio::test]
async fn history_lists_finished() {
    let f = queue().await;
    let r = run_alice(&f.url, &["history"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("history.txt", &r.out);
    let r = run_alice(
        &f.url,
        &["history", "--since=2026-01-01T09:15:00Z", "-o", "json"],
    )
    .await;
    let v: Value = serde_json::from_str(&r.out).expect("json");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["items"][0]["metadata"]["name"], "done-1");
    let r = run_alice(&f.url, &["history", "--state=failed", "-o", "name"]).await;
    assert_eq!(r.out, "crashed\n");
}

fn node(name: &str, state: &str) -> Value {
    json!({"apiVersion": GV, "kind": "Node",
           "metadata": {"name": name, "creationTimestamp": "2025-12-01T00:00:00Z", "resourceVersion": "3"},
           "spec": {"topologyGroup": 3, "homeVcluster": "hpc-batch"},
           "status": {"state": state, "capacity": {"cpuCores": 72, "memoryGb": 512, "gpuCount": 4, "gpuType": "GH200"},
                      "conformanceFingerprint": "a1b2c3d4e5f6", "lastHeartbeatTime": "2026-01-01T11:59:55Z",
                      "lastTransitionTime": "2026-01-01T11:00:00Z"}})
}

async fn cluster() -> Fake {
    let f = start().await;
    let mut n0 = node("x1000c0s0b0n0", "Ready");
    n0["status"]["owner"] =
        json!({"tenant": "physics", "vcluster": "hpc-batch", "allocation": "sim"});
    n0["status"]["allocations"] = json!(["sim"]);
    f.insert("nodes", n0);
    let mut n1 = node("x1000c0s0b0n1", "Ready");
    n1["status"]["owner"] =
        json!({"tenant": "physics", "vcluster": "hpc-batch", "allocation": "sim"});
    f.insert("nodes", n1);
    let mut n2 = node("x1000c0s1b0n0", "Draining");
    n2["spec"]["topologyGroup"] = json!(7);
    n2["spec"]["homeVcluster"] = json!("ml-training");
    n2["spec"]["drain"] = json!({"reason": "maintenance"});
    n2["status"]["owner"] =
        json!({"tenant": "ml-team", "vcluster": "ml-training", "allocation": "train"});
    n2["status"]["allocations"] = json!(["train"]);
    f.insert("nodes", n2);
    let mut n3 = node("x1000c0s1b0n1", "Drained");
    n3["spec"]["drain"] = json!({"reason": "disk", "urgent": true});
    n3["status"]["conditions"] = json!([{"type": "Healthy", "status": "False", "reason": "DiskErrors", "message": "nvme0 reports errors"}]);
    f.insert("nodes", n3);
    f
}

#[tokio::test]
async fn nodes_views() {
    let f = cluster().await;
    let r = run_alice(&f.url, &["nodes"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("nodes.txt", &r.out);
    let r = run_alice(&f.url, &["nodes", "-o", "wide"]).await;
    golden("nodes_wide.txt", &r.out);
    let r = run_alice(&f.url, &["nodes", "--state=draining,drained", "-o", "name"]).await;
    assert_eq!(r.out, "x1000c0s1b0n0\nx1000c0s1b0n1\n");
    let r = run_alice(&f.url, &["nodes", "--vcluster=ml-training", "-o", "name"]).await;
    assert_eq!(r.out, "x1000c0s1b0n0\n");
    let r = run_alice(&f.url, &["nodes", "--state=idle", "-o", "name"]).await;
    assert_eq!(r.out, "", "every Ready node is allocated");
    let r = run_alice(&f.url, &["nodes", "x1000c0s1b0n1"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("node_detail.txt", &r.out);
    let r = run_alice(&f.url, &["node", "status", "x1000c0s1b0n1"]).await;
    golden("node_detail.txt", &r.out);
    let r = run_alice(&f.url, &["nodes", "nid999"]).await;
    assert_eq!(r.code, 3);
}

#[tokio::test]
async fn node_drain_undrain_disable_enable() {
    let f = cluster().await;
    let r = run_alice(
        &f.url,
        &[
            "node",
            "drain",
            "x1000c0s0b0n0",
            "--reason",
            "maintenance",
            "--urgent",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("node_drain.txt", &r.out);
    let p = last(&f, "PATCH");
    assert_eq!(p.path, "/apis/lattice.dev/v1alpha1/nodes/x1000c0s0b0n0");
    assert_eq!(p.content_type, "application/merge-patch+json");
    assert_eq!(
        serde_json::from_str::<Value>(&p.body).expect("json"),
        json!({"spec": {"drain": {"reason": "maintenance", "urgent": true}}})
    );
    // Still Draining: a human error with the seed's hint, nothing patched.
    let before = f.requests().len();
    let r = run_alice(&f.url, &["node", "undrain", "x1000c0s1b0n0"]).await;
    assert_eq!(r.code, 1);
    golden("error_undrain_draining.txt", &r.err);
    assert!(f.requests()[before..].iter().all(|q| q.method != "PATCH"));
    // Drained: the drain request is removed with a merge-patch null.
    let r = run_alice(&f.url, &["node", "undrain", "x1000c0s1b0n1"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "Undrained node x1000c0s1b0n1; it returns to Ready\n");
    assert_eq!(last(&f, "PATCH").body, r#"{"spec":{"drain":null}}"#);
    assert!(f.get("nodes", "", "x1000c0s1b0n1").expect("node")["spec"]
        .get("drain")
        .is_none());
    let r = run_alice(&f.url, &["node", "disable", "x1000c0s0b0n1"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(last(&f, "PATCH").body, r#"{"spec":{"disabled":true}}"#);
    let r = run_alice(&f.url, &["node", "enable", "x1000c0s0b0n1"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(last(&f, "PATCH").body, r#"{"spec":{"disabled":null}}"#);
    let r = run_alice(&f.url, &["node", "drain", "ghost"]).await;
    assert_eq!(r.code, 3);
    // The seed's `lattice admin drain/undrain` spelling.
    let r = run_alice(&f.url, &["admin", "undrain", "x1000c0s1b0n0"]).await;
    assert_eq!(r.code, 1);
}

const SCRIPT: &str = "#!/bin/bash\n#SBATCH --job-name=train\n#SBATCH -N 4\n#SBATCH --time=1-00:00:00\n#SBATCH -p gpu\n#SBATCH --mem=64G\n#LATTICE --uenv=prgenv-gnu/24.11:v1\nsrun ./train\n";

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tmp");
    std::fs::write(d.path().join("train.sh"), SCRIPT).expect("script");
    std::fs::write(
        d.path().join("lattice-compat.yaml"),
        "partitions: {gpu: ml-training, normal: hpc-batch}\nvclusters: [hpc-batch, ml-training]\n",
    )
    .expect("compat");
    d
}

fn scrub(s: &str, d: &tempfile::TempDir) -> String {
    s.replace(&d.path().display().to_string(), "DIR")
}

#[tokio::test]
async fn submit_script() {
    let f = start().await;
    let d = project();
    let r = run_opts(&f.url, &["submit", "train.sh"], Opts::alice(d.path())).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "Submitted allocation train-00001\n");
    golden("submit_warnings.txt", &r.err);
    let post = last(&f, "POST");
    assert_eq!(post.path, ALLOCS);
    let body: Value = serde_json::from_str(&post.body).expect("json");
    golden(
        "submit_body.json",
        &scrub(&lattice_cli::output::format::to_json(&body), &d),
    );
    assert_eq!(body["spec"]["script"], SCRIPT);
    assert_eq!(body["metadata"]["annotations"]["lattice.dev/user"], "alice");
    assert_eq!(
        body["metadata"]["annotations"]["lattice.dev/submit-dir"],
        d.path().display().to_string()
    );
    // --parsable, -q: the name only; -t overrides the tenant.
    let r = run_opts(
        &f.url,
        &["submit", "--parsable", "train.sh"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.out, "train-00002\n");
    let r = run_opts(
        &f.url,
        &["-t", "physics", "-q", "submit", "train.sh"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!((r.out.as_str(), r.err.as_str()), ("train-00003\n", ""));
    assert_eq!(
        last(&f, "POST").path,
        "/apis/lattice.dev/v1alpha1/namespaces/physics/allocations"
    );
}

#[tokio::test]
async fn submit_command_keeps_arguments() {
    let f = start().await;
    let d = tempfile::tempdir().expect("tmp");
    let r = run_opts(
        &f.url,
        &[
            "submit",
            "--nodes=2",
            "--walltime=30m",
            "--",
            "python3",
            "-c",
            "print('a b')",
            "$HOME",
        ],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "Submitted allocation python3-00001\n");
    let body: Value = serde_json::from_str(&last(&f, "POST").body).expect("json");
    assert_eq!(body["spec"]["entrypoint"], "python3");
    assert_eq!(body["spec"]["args"], json!(["-c", "print('a b')", "$HOME"]));
    assert!(body["spec"].get("script").is_none());
    assert_eq!(body["spec"]["lifecycle"]["walltime"], "00:30:00");
    assert_eq!(body["spec"]["resources"]["nodes"], 2);
    let r = run_opts(&f.url, &["submit"], Opts::alice(d.path())).await;
    assert_eq!(r.code, 2, "nothing to run is a usage error");
}

#[tokio::test]
async fn submit_dry_runs() {
    let d = project();
    // client: no server at all.
    let r = run_opts(
        "http://127.0.0.1:9",
        &["submit", "--dry-run", "train.sh"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("submit_dry_run.yaml", &scrub(&r.out, &d));
    assert!(
        r.err.starts_with("Warning: #SBATCH --mem=64G ignored"),
        "{}",
        r.err
    );
    let r = run_opts(
        "http://127.0.0.1:9",
        &["submit", "--dry-run=client", "-o", "json", "train.sh"],
        Opts::alice(d.path()),
    )
    .await;
    let v: Value = serde_json::from_str(&r.out).expect("json");
    assert_eq!(v["spec"]["vcluster"], "ml-training");
    // server: dryRun=All, nothing stored.
    let f = start().await;
    let r = run_opts(
        &f.url,
        &["submit", "--dry-run=server", "train.sh"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(r.out.contains("name: train-00001"), "{}", r.out);
    assert_eq!(
        last(&f, "POST").query.get("dryRun").map(String::as_str),
        Some("All")
    );
    assert!(f.get("allocations", "default", "train-00001").is_none());
}

#[tokio::test]
async fn submit_unknown_partition_lists_server_vclusters() {
    let f = start().await;
    for v in ["hpc-batch", "ml-training", "interactive"] {
        f.insert("vclusters", json!({"apiVersion": GV, "kind": "VCluster", "metadata": {"name": v, "namespace": "default"}}));
    }
    let d = project();
    std::fs::write(
        d.path().join("bad.sh"),
        "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --partition=debugq\nhostname\n",
    )
    .expect("w");
    let r = run_opts(&f.url, &["submit", "bad.sh"], Opts::alice(d.path())).await;
    assert_eq!(r.code, 1);
    golden("error_unknown_partition.txt", &r.err);
    assert!(
        f.requests().iter().all(|q| q.method != "POST"),
        "nothing submitted"
    );
    // An explicit --vcluster the server does not know.
    let r = run_opts(
        &f.url,
        &["submit", "--vcluster=gpu-batch", "--", "hostname"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 1);
    golden("error_unknown_vcluster.txt", &r.err);
    // A bad directive value: what, where, hint.
    std::fs::write(
        d.path().join("t.sh"),
        "#!/bin/bash\n#SBATCH --time=forever\nhostname\n",
    )
    .expect("w");
    let r = run_opts(&f.url, &["submit", "t.sh"], Opts::alice(d.path())).await;
    assert_eq!(r.code, 1);
    golden("error_bad_directive.txt", &r.err);
}

#[tokio::test]
async fn submit_rejections_are_explained() {
    let f = start().await;
    f.insert(
        "tenants",
        json!({"apiVersion": GV, "kind": "Tenant", "metadata": {"name": "physics"},
        "spec": {"quota": {"maxNodes": 200}}, "status": {"usage": {"nodes": 195}}}),
    );
    f.state.lock().expect("lock").fail_on.insert(
        "big".into(),
        (
            403,
            json!({"kind": "Status", "code": 403, "reason": "Forbidden",
                     "message": "tenant \"physics\" exceeds max_nodes quota"}),
        ),
    );
    // fail_on matches object names; the fake also checks it on POST bodies by name.
    let d = tempfile::tempdir().expect("tmp");
    let r = run_opts(
        &f.url,
        &[
            "-t",
            "physics",
            "submit",
            "--name=big",
            "--nodes=10",
            "--",
            "hostname",
        ],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 4, "{}", r.err);
    golden("error_quota.txt", &r.err);
}

#[tokio::test]
async fn submit_over_the_hard_node_quota_is_refused_before_posting() {
    let f = start().await;
    f.insert(
        "tenants",
        json!({"apiVersion": GV, "kind": "Tenant", "metadata": {"name": "physics"},
        "spec": {"quota": {"maxNodes": 200}}, "status": {"usage": {"nodes": 195}}}),
    );
    let d = tempfile::tempdir().expect("tmp");
    let submit = |nodes: &'static str| {
        let url = f.url.clone();
        let cwd = d.path().to_path_buf();
        async move {
            run_opts(
                &url,
                &["-t", "physics", "submit", nodes, "--", "hostname"],
                Opts::alice(&cwd),
            )
            .await
        }
    };
    let r = submit("--nodes=250").await;
    assert_eq!(r.code, 4, "{}", r.err);
    golden("error_quota_limit.txt", &r.err);
    assert!(
        f.requests().iter().all(|q| q.method != "POST"),
        "nothing posted"
    );
    assert!(f
        .requests()
        .iter()
        .any(|q| q.method == "GET" && q.path == format!("{PREFIX}/tenants/physics")));
    // A range counts by its minimum: 150-300 can run within 200.
    let r = submit("--nodes=150-300").await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = submit("--nodes=201-300").await;
    assert_eq!(r.code, 4, "{}", r.err);
    assert!(
        r.err.contains("Requested: 201-300 additional nodes"),
        "{}",
        r.err
    );
    // Within the limit (even beyond the current headroom): posted, it waits in the queue.
    let r = submit("--nodes=10").await;
    assert_eq!(r.code, 0, "{}", r.err);
    // The tenant cannot be read (403) or does not exist (404): no check, the server decides.
    f.state.lock().expect("lock").fail_on.insert(
        "physics".into(),
        (
            403,
            json!({"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"}),
        ),
    );
    let r = submit("--nodes=250").await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_opts(
        &f.url,
        &["-t", "chemistry", "submit", "--nodes=250", "--", "hostname"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
}

#[tokio::test]
async fn submit_refuses_a_dependency_on_a_missing_allocation() {
    // As sbatch ("Job dependency problem") and Flux do: nothing is posted.
    let f = start().await;
    f.insert("allocations", a("prep", "Completed", Some("alice")));
    let mut by_uid = a("train", "Running", Some("alice"));
    by_uid["metadata"]["uid"] = json!("0b6f3c4e-2d7a-4a55-9f1e-6c2f0e8d9a11");
    f.insert("allocations", by_uid);
    let d = tempfile::tempdir().expect("tmp");
    let submit = |deps: &'static str| {
        let url = f.url.clone();
        let cwd = d.path().to_path_buf();
        async move { run_opts(&url, &["submit", deps, "--", "hostname"], Opts::alice(&cwd)).await }
    };
    let r = submit("--depends-on=prep:success,nope:any").await;
    assert_eq!(r.code, 3, "{}", r.err);
    golden("error_missing_dependency.txt", &r.err);
    let r = submit("--dependency=afterok:prep:nope2").await;
    assert_eq!(r.code, 3, "{}", r.err);
    assert!(r.err.contains("\"nope2\""), "{}", r.err);
    assert!(
        f.requests().iter().all(|q| q.method != "POST"),
        "nothing posted"
    );
    // Names and uids of existing allocations pass; mutex names a lock, not a job.
    let r = submit("--depends-on=prep:success,0b6f3c4e-2d7a-4a55-9f1e-6c2f0e8d9a11:any").await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = submit("--dependency=singleton").await;
    assert_eq!(r.code, 0, "{}", r.err);
}

#[tokio::test]
async fn usage_sums_the_ledger_over_the_period_against_the_worse_budget() {
    let f = start().await;
    let today = now().date_naive();
    let day = |ago: u64| {
        (today - chrono::Days::new(ago))
            .format("%Y-%m-%d")
            .to_string()
    };
    f.insert(
        "tenants",
        json!({"apiVersion": GV, "kind": "Tenant", "metadata": {"name": "default"},
               "spec": {"budgetPeriodDays": 30,
                        "quota": {"nodeHoursBudget": 100.0, "gpuHoursBudget": 50.0}},
               "status": {"usage": {"ledger": [
                   {"day": day(40), "user": "alice", "nodeHours": 500.0, "gpuHours": 500.0},
                   {"day": day(10), "user": "alice", "nodeHours": 10.0, "gpuHours": 20.0},
                   {"day": day(1), "user": "bob", "nodeHours": 30.0, "gpuHours": 5.0},
                   {"day": day(0), "user": "alice", "nodeHours": 2.5, "gpuHours": 0.0}]}}}),
    );
    // Running work counts up to now: 2 h on two 4-GPU nodes (now is 12:00).
    let mut running = a("sweep-live", "Running", Some("bob"));
    running["status"]["startTime"] = json!(format!("{}T10:00:00Z", day(0)));
    running["status"]["assignedNodes"] = json!(["g1", "g2"]);
    f.insert("allocations", running);
    for g in ["g1", "g2"] {
        f.insert(
            "nodes",
            json!({"apiVersion": GV, "kind": "Node", "metadata": {"name": g},
                   "status": {"capacity": {"gpuCount": 4}}}),
        );
    }
    // 30 days: alice 12.5 / 20, bob 30 + 4 / 5 + 16; node-hours 46.5 % of 100, GPU-hours
    // 41 of 50 = 82 %.
    let r = run_alice(&f.url, &["usage"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("usage.txt", &r.out);
    assert!(r.out.contains("82.0% (GPU-hours)"), "{}", r.out);
    // --days narrows the window (the last 2 days: bob's 30, alice's 2.5, the 4 running).
    let r = run_alice(&f.url, &["usage", "--days", "2", "-o", "json"]).await;
    let v: Value = serde_json::from_str(&r.out).expect("json");
    assert_eq!(v[0]["nodeHours"], 36.5, "{v}");
    assert_eq!(v[0]["days"], 2);
}

#[tokio::test]
async fn submit_nodelist_dry_run_client() {
    let d = tempfile::tempdir().expect("tmp");
    let r = run_opts(
        "http://127.0.0.1:9",
        &[
            "submit",
            "--dry-run=client",
            "-o",
            "json",
            "--nodelist=sn-[01-04],gpu7",
            "--",
            "hostname",
        ],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let v: Value = serde_json::from_str(&r.out).expect("json");
    assert_eq!(
        v["spec"]["resources"],
        json!({"nodes": 5, "nodeNames": ["sn-01", "sn-02", "sn-03", "sn-04", "gpu7"]})
    );
    let r = run_opts(
        "http://127.0.0.1:9",
        &[
            "submit",
            "--dry-run=client",
            "--nodes=4",
            "--nodelist=sn-[01-04]",
            "--",
            "hostname",
        ],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(r.out.contains("nodes: 4\n"), "{}", r.out);
    let r = run_opts(
        "http://127.0.0.1:9",
        &[
            "submit",
            "--dry-run=client",
            "--nodes=8",
            "--nodelist=sn-[01-04]",
            "--",
            "hostname",
        ],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!((r.code, r.out.as_str()), (1, ""));
    golden("error_nodelist_count.txt", &r.err);
}

#[tokio::test]
async fn submit_sbatch_nodelist_and_constraint_or() {
    // `#SBATCH -w` claims the nodes like `--nodelist` (no warning); `-x` is still ignored
    // with a warning; an OR constraint becomes `anyOf` groups the scheduler honours.
    let d = tempfile::tempdir().expect("tmp");
    std::fs::write(
        d.path().join("pin.sh"),
        "#!/bin/bash\n#SBATCH -w sn-[01-02]\n#SBATCH -x sn-03\n#SBATCH -C \"a100|h100\"\nsrun ./app\n",
    )
    .expect("script");
    let r = run_opts(
        "http://127.0.0.1:9",
        &["submit", "--dry-run=client", "-o", "json", "pin.sh"],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let v: Value = serde_json::from_str(&r.out).expect("json");
    assert_eq!(
        v["spec"]["resources"],
        json!({"nodes": 2, "nodeNames": ["sn-01", "sn-02"], "constraints": {"anyOf": [["a100", "h100"]]}})
    );
    assert_eq!(
        r.err,
        "Warning: #SBATCH -x sn-03 ignored (Lattice places allocations itself, packing them into dragonfly groups)\n"
    );
    let r = run_opts(
        "http://127.0.0.1:9",
        &[
            "submit",
            "--dry-run=client",
            "-o",
            "json",
            "--constraint=gpu&nvme|cpu",
            "--",
            "hostname",
        ],
        Opts::alice(d.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let v: Value = serde_json::from_str(&r.out).expect("json");
    // (gpu AND nvme) OR cpu = (gpu OR cpu) AND (nvme OR cpu).
    assert_eq!(
        v["spec"]["resources"]["constraints"],
        json!({"anyOf": [["gpu", "cpu"], ["nvme", "cpu"]]})
    );
    assert_eq!(r.err, "");
}

const SHORT_DAG: &str = r#"name: training-pipeline
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

#[tokio::test]
async fn dag_submit_status_list_cancel() {
    let f = start().await;
    let d = tempfile::tempdir().expect("tmp");
    let file = d.path().join("workflow.yaml");
    std::fs::write(&file, SHORT_DAG).expect("w");
    let p = file.display().to_string();
    let r = run_alice(&f.url, &["dag", "submit", &p]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.out,
        "Submitted DAG training-pipeline with 4 allocations\n"
    );
    let post = last(&f, "POST");
    assert_eq!(
        post.path,
        "/apis/lattice.dev/v1alpha1/namespaces/default/dags"
    );
    let body: Value = serde_json::from_str(&post.body).expect("json");
    golden(
        "dag_submit_body.json",
        &lattice_cli::output::format::to_json(&body),
    );
    // The API types accept it.
    let mut admitted = body.clone();
    admitted["metadata"]["annotations"] = json!({});
    if let Err(e) = (lattice_apis::find_kind("Dag").expect("Dag kind").admit)(admitted) {
        panic!("the API rejects the DAG: {e:?}");
    }

    // Progress written by the controller.
    let mut dag = f
        .get("dags", "default", "training-pipeline")
        .expect("stored");
    dag["status"] = json!({"phase": "Running", "startTime": "2026-01-01T11:50:00Z", "tasks": {
        "preprocess": {"phase": "Completed", "allocation": "training-pipeline-preprocess"},
        "train": {"phase": "Running", "allocation": "training-pipeline-train"},
        "evaluate": {"phase": "Waiting", "allocation": "training-pipeline-evaluate"},
        "notify-failure": {"phase": "Waiting", "allocation": "training-pipeline-notify-failure", "message": "waiting for dependencies: train (failure)"}}});
    f.insert("dags", dag);
    let mut pre = a("training-pipeline-preprocess", "Completed", None);
    pre["spec"]["resources"]["nodes"] = json!(2);
    pre["status"]["startTime"] = json!("2026-01-01T11:50:00Z");
    pre["status"]["endTime"] = json!("2026-01-01T11:52:03Z");
    f.insert("allocations", pre);
    let mut tr = a("training-pipeline-train", "Running", None);
    tr["spec"]["resources"]["nodes"] = json!(64);
    tr["status"]["startTime"] = json!("2026-01-01T11:52:10Z");
    f.insert("allocations", tr);
    let r = run_alice(&f.url, &["dag", "status", "training-pipeline", "--graph"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.out,
        "preprocess [Completed] → train [Running] → evaluate [Waiting]\n                                         ↘ notify-failure [Waiting]\n"
    );
    let r = run_alice(&f.url, &["dag", "status", "training-pipeline", "-v"]).await;
    golden("dag_status.txt", &r.out);
    let r = run_alice(
        &f.url,
        &["dag", "status", "training-pipeline", "-o", "json"],
    )
    .await;
    assert!(serde_json::from_str::<Value>(&r.out).is_ok());
    let r = run_alice(&f.url, &["dag", "list"]).await;
    golden("dag_list.txt", &r.out);
    let r = run_alice(&f.url, &["dag", "cancel", "training-pipeline"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        last(&f, "PATCH").path,
        "/apis/lattice.dev/v1alpha1/namespaces/default/dags/training-pipeline"
    );
    let r = run_alice(&f.url, &["dag", "status", "ghost"]).await;
    assert_eq!(r.code, 3);
}

#[tokio::test]
async fn dag_validation_and_apply_short_form() {
    let f = start().await;
    let cyc = "name: loop\nallocations:\n  - name: a\n    entrypoint: x\n    depends_on: [{b: success}]\n  - name: b\n    entrypoint: y\n    depends_on: [{a: success}]\n";
    let r = run_with(&f.url, &["dag", "submit", "-"], cyc, None).await;
    assert_eq!(r.code, 1);
    golden("error_dag_cycle.txt", &r.err);
    let typo = "name: t\nallocations:\n  - name: train\n    entrypoint: x\n  - name: eval\n    entrypoint: y\n    depends_on: [{trian: success}]\n";
    let r = run_with(&f.url, &["dag", "submit", "-"], typo, None).await;
    golden("error_dag_unknown_ref.txt", &r.err);
    assert!(f.requests().iter().all(|q| q.method != "POST"));
    // `apply -f` accepts the short form too (as a Dag, server-side apply).
    let r = run_with(&f.url, &["apply", "-f", "-"], SHORT_DAG, None).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "dag/training-pipeline created\n");
    let stored = f
        .get("dags", "default", "training-pipeline")
        .expect("applied");
    assert_eq!(stored["kind"], "Dag");
    assert_eq!(
        stored["spec"]["allocations"][1]["dependsOn"][0]["ref"],
        "preprocess"
    );
    // The example manifest (full form) still applies.
    let ex = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/examples/training-pipeline.yaml"
    ))
    .expect("example");
    let r = run_with(
        &f.url,
        &["dag", "submit", "--dry-run", "-", "-o", "json"],
        &ex,
        None,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
}

/// The DAG size limit is the server's (`lattice-server --max-dag-size`): the CLI posts a
/// DAG over the default 1,000 steps and lets the server decide; offline it only warns.
#[tokio::test]
async fn dag_submit_leaves_the_size_limit_to_the_server() {
    let f = start().await;
    let big = |name: &str, n: usize| {
        let mut y = format!("name: {name}\nallocations:\n");
        for i in 0..n {
            y.push_str(&format!("  - name: s{i}\n    entrypoint: /bin/true\n"));
            if i > 0 {
                y.push_str(&format!("    depends_on: [{{s{}: success}}]\n", i - 1));
            }
        }
        y
    };
    let r = run_with(&f.url, &["dag", "submit", "-"], &big("big", 1001), None).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "Submitted DAG big with 1001 allocations\n");
    assert!(f.get("dags", "default", "big").is_some());
    // --dry-run=client: no server to ask, a warning against the default limit.
    let r = run_with(
        "http://127.0.0.1:9",
        &["dag", "submit", "--dry-run=client", "-", "-o", "json"],
        &big("big", 1001),
        None,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(
        r.err
            .starts_with("Warning: DAG exceeds maximum size (1001 allocations, limit: 1000)"),
        "{}",
        r.err
    );
    // The server's rejection is shown with its numbers and the hint.
    let msg = "DAG exceeds maximum size (1001 allocations, limit: 1000). Hint: Split the workflow into smaller DAGs or increase the limit via system configuration.";
    f.state.lock().expect("lock").fail_on.insert(
        "huge".into(),
        (
            422,
            json!({"kind": "Status", "code": 422, "reason": "Invalid",
                "message": format!("Dag.lattice.dev \"huge\" is invalid: spec.allocations: {msg}"),
                "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec.allocations", "message": msg}]}}),
        ),
    );
    let r = run_with(&f.url, &["dag", "submit", "-"], &big("huge", 1001), None).await;
    assert_eq!(r.code, 1, "{}", r.out);
    // The seed's two lines, once.
    assert_eq!(
        r.err,
        "Error: DAG exceeds maximum size (1001 allocations, limit: 1000)\n  Hint: Split the workflow into smaller DAGs or increase the limit via system configuration. (an administrator: `lattice admin config set scheduling.max_dag_size=N`)\n",
    );
}

#[tokio::test]
async fn admin_tenants_and_vclusters() {
    let f = start().await;
    let r = run_alice(
        &f.url,
        &[
            "admin",
            "tenant",
            "create",
            "--name=physics",
            "--max-nodes=200",
            "--display-name=Physics",
        ],
    )
    .await;
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "Created tenant physics\n"),
        "{}",
        r.err
    );
    let body: Value = serde_json::from_str(&last(&f, "POST").body).expect("json");
    assert_eq!(
        body["spec"],
        json!({"displayName": "Physics", "quota": {"maxNodes": 200}})
    );
    let r = run_alice(
        &f.url,
        &[
            "admin",
            "tenant",
            "set-quota",
            "--name=physics",
            "--max-nodes=250",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        last(&f, "PATCH").body,
        r#"{"spec":{"quota":{"maxNodes":250}}}"#
    );
    let mut t = f.get("tenants", "", "physics").expect("tenant");
    t["status"] =
        json!({"usage": {"nodes": 195, "runningAllocations": 3, "pendingAllocations": 1}});
    f.insert("tenants", t);
    let r = run_alice(&f.url, &["admin", "tenant", "list"]).await;
    golden("admin_tenant_list.txt", &r.out);
    let r = run_alice(&f.url, &["admin", "tenant", "show", "physics"]).await;
    golden("admin_tenant_show.txt", &r.out);

    let r = run_alice(
        &f.url,
        &[
            "-t",
            "physics",
            "admin",
            "vcluster",
            "create",
            "--name=hpc-batch",
            "--scheduler=hpc-backfill",
            "--cycle-interval=15s",
        ],
    )
    .await;
    assert_eq!(
        r.out, "Created vCluster hpc-batch in tenant physics\n",
        "{}",
        r.err
    );
    let r = run_alice(
        &f.url,
        &[
            "-t",
            "physics",
            "admin",
            "vcluster",
            "set-weights",
            "--name=hpc-batch",
            "--priority=0.20",
            "--conformance=0.05",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        last(&f, "PATCH").body,
        r#"{"spec":{"weights":{"conformance":0.05,"priority":0.2}}}"#
    );
    let r = run_alice(
        &f.url,
        &[
            "-t",
            "physics",
            "admin",
            "vcluster",
            "set-weights",
            "--name=hpc-batch",
            "--priority=2",
        ],
    )
    .await;
    assert_eq!(r.code, 2);
    let r = run_alice(
        &f.url,
        &[
            "-t",
            "physics",
            "admin",
            "vcluster",
            "set-config",
            "--name=hpc-batch",
            "--max-walltime=72h",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_alice(
        &f.url,
        &[
            "-t",
            "physics",
            "admin",
            "vcluster",
            "set-config",
            "--name=hpc-batch",
            "--backfill-order=smallest-area",
            "--runtime-estimator=user-job-last2",
            "--guarantee-after=48h",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        last(&f, "PATCH").body,
        r#"{"spec":{"backfillOrder":"smallest-area","runtimePrediction":{"estimator":"user-job-last2","guaranteeAfter":"48h"}}}"#
    );
    let r = run_alice(
        &f.url,
        &["-t", "physics", "admin", "vcluster", "show", "hpc-batch"],
    )
    .await;
    golden("admin_vcluster_show.txt", &r.out);
    let r = run_alice(&f.url, &["admin", "vcluster", "list"]).await;
    golden("admin_vcluster_list.txt", &r.out);
    // Any registered term by its name or alias, with the same range check.
    let weight = |args: &'static [&'static str]| {
        let url = f.url.clone();
        async move {
            let mut a = vec![
                "-t",
                "physics",
                "admin",
                "vcluster",
                "set-weights",
                "--name=hpc-batch",
            ];
            a.extend_from_slice(args);
            run_alice(&url, &a).await
        }
    };
    let r = weight(&["--weight", "waitTime=0.3", "--weight=w9=0.1"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        last(&f, "PATCH").body,
        r#"{"spec":{"weights":{"conformance":0.1,"waitTime":0.3}}}"#
    );
    let r = weight(&["--weight", "speed=0.3"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.err.contains("\"speed\" is not a weight") && r.err.contains("waitTime"),
        "{}",
        r.err
    );
    assert_eq!(weight(&["--weight", "waitTime"]).await.code, 2);
    assert_eq!(weight(&["--weight", "waitTime=1.5"]).await.code, 2);
}

#[tokio::test]
async fn admin_config_and_raft() {
    let d = tempfile::tempdir().expect("tmp");
    let cfg = d.path().join("config.yaml").display().to_string();
    let r = run_alice(
        "http://unused",
        &[
            "--config",
            &cfg,
            "admin",
            "config",
            "set",
            "accounting.enabled=true",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_alice(
        "http://unused",
        &[
            "--config",
            &cfg,
            "admin",
            "config",
            "set",
            "default_vcluster",
            "hpc-batch",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_alice(
        "http://unused",
        &[
            "--config",
            &cfg,
            "admin",
            "config",
            "get",
            "accounting.enabled",
        ],
    )
    .await;
    assert_eq!(r.out, "true\n");
    let r = run_alice(
        "http://unused",
        &["--config", &cfg, "admin", "config", "get", "nope.key"],
    )
    .await;
    assert_eq!(r.code, 3);
    let text = std::fs::read_to_string(&cfg).expect("written");
    assert_eq!(
        text,
        "default_vcluster: hpc-batch\naccounting:\n  enabled: true\n"
    );

    let f = start().await;
    f.state.lock().expect("lock").metrics = "# HELP lattice_store_applied_revision Newest durable revision\nlattice_store_applied_revision 42\nlattice_store_write_revisions_total 40\nlattice_raft_current_leader 1\nlattice_raft_current_term 3\nlattice_raft_last_log_index 57\nlattice_raft_is_leader 1\nlattice_raft_last_applied_index 57\n".into();
    let r = run_alice(&f.url, &["admin", "raft", "status"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("admin_raft_status.txt", &r.out.replace(&f.url, "URL"));
    f.state.lock().expect("lock").metrics = "lattice_store_applied_revision 42\n".into();
    let r = run_alice(&f.url, &["admin", "raft", "status"]).await;
    assert!(
        r.out.contains("Raft:             not reported"),
        "{}",
        r.out
    );
}

async fn alice_at(f: &Fake, args: &[&str], d: &std::path::Path) -> Run {
    run_opts(&f.url, args, Opts::alice(d)).await
}

#[tokio::test]
async fn slurm_front_end() {
    let f = queue().await;
    let d = project();
    let r = alice_at(
        &f,
        &["compat", "sbatch", "--parsable", "-N", "2", "train.sh"],
        d.path(),
    )
    .await;
    assert_eq!((r.code, r.out.as_str()), (0, "train-00001\n"), "{}", r.err);
    let body: Value = serde_json::from_str(&last(&f, "POST").body).expect("json");
    assert_eq!(
        body["spec"]["resources"]["nodes"], 2,
        "sbatch options beat the script's"
    );
    assert_eq!(body["spec"]["vcluster"], "ml-training");
    let r = alice_at(
        &f,
        &["compat", "sbatch", "--wrap=hostname -f", "-p", "normal"],
        d.path(),
    )
    .await;
    assert_eq!(r.out, "Submitted batch job wrap-00002\n", "{}", r.err);
    assert!(!r.err.contains("--wrap"), "{}", r.err);
    let body: Value = serde_json::from_str(&last(&f, "POST").body).expect("json");
    assert_eq!(body["spec"]["args"], json!(["-c", "hostname -f"]));

    let r = alice_at(&f, &["compat", "squeue"], d.path()).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("squeue.txt", &r.out);
    let r = alice_at(
        &f,
        &[
            "compat",
            "squeue",
            "-u",
            "alice",
            "-h",
            "-o",
            "%i|%T|%D|%R",
            "-t",
            "PD,R",
        ],
        d.path(),
    )
    .await;
    golden("squeue_format.txt", &r.out);

    let r = alice_at(
        &f,
        &[
            "compat",
            "sacct",
            "-j",
            "done-1,crashed",
            "--format=JobID,JobName%12,State,ExitCode,Elapsed",
        ],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("sacct.txt", &r.out);

    let r = alice_at(&f, &["compat", "scancel", "eval-job"], d.path()).await;
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, ""),
        "scancel is silent: {}",
        r.err
    );
    assert!(last(&f, "PATCH").path.ends_with("/allocations/eval-job"));
    let r = alice_at(&f, &["compat", "scancel"], d.path()).await;
    assert_eq!(r.code, 2);
    // srun inside an allocation runs a step (`--pty`: `lattice attach`); a terminal on an
    // open descriptor of srun's is refused up front.
    let r = alice_at(
        &f,
        &["compat", "srun", "--jobid=eval-job", "--pty=3", "bash"],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(
        r.err.contains("--pty") && r.err.contains("not supported"),
        "{}",
        r.err
    );

    let c = cluster().await;
    let r = alice_at(&c, &["compat", "sinfo"], d.path()).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("sinfo.txt", &r.out);
    let r = alice_at(&c, &["compat", "sinfo", "-N", "-h"], d.path()).await;
    golden("sinfo_nodes.txt", &r.out);
}

#[tokio::test]
async fn sbatch_quiet_prints_neither_the_id_nor_warnings() {
    let f = queue().await;
    let d = project();
    let args = [
        "compat",
        "sbatch",
        "--mem=4G",
        "--wrap=true",
        "-p",
        "normal",
    ];
    let r = alice_at(&f, &args, d.path()).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(r.out.starts_with("Submitted batch job "), "{}", r.out);
    assert!(r.err.contains("--mem=4G ignored"), "{}", r.err);
    // -Q: submitted all the same, nothing printed but errors.
    let posts = f.requests().iter().filter(|q| q.method == "POST").count();
    let quiet: Vec<&str> = ["compat", "sbatch", "-Q"]
        .into_iter()
        .chain(args.into_iter().skip(2))
        .collect();
    let r = alice_at(&f, &quiet, d.path()).await;
    assert_eq!((r.code, r.out.as_str(), r.err.as_str()), (0, "", ""));
    assert_eq!(
        f.requests().iter().filter(|q| q.method == "POST").count(),
        posts + 1
    );
}

/// The names of the allocations a run PATCHed (cancelled), in order.
fn patched(f: &Fake, from: usize) -> Vec<String> {
    f.requests()[from..]
        .iter()
        .filter(|q| q.method == "PATCH")
        .map(|q| q.path.rsplit('/').next().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn scancel_filters_by_user_and_name() {
    let f = queue().await;
    let d = project();
    // Someone else's jobs: refused, nothing cancelled (not "all of mine" instead).
    let before = f.requests().len();
    let r = alice_at(&f, &["compat", "scancel", "-u", "bob"], d.path()).await;
    assert_eq!(r.code, 2, "{}", r.err);
    golden("error_scancel_other_user.txt", &r.err);
    assert!(patched(&f, before).is_empty());
    // Yourself: your unfinished jobs, narrowed by -t.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &["compat", "scancel", "-u", "alice", "-t", "PD"],
        d.path(),
    )
    .await;
    assert_eq!((r.code, r.out.as_str()), (0, ""), "{}", r.err);
    assert_eq!(patched(&f, before), ["eval-job"]);
    // -n NAME: by job name (spec.tags.name), never looked up as a job id.
    let before = f.requests().len();
    let r = alice_at(&f, &["compat", "scancel", "-n", "train.sh"], d.path()).await;
    assert_eq!((r.code, r.out.as_str()), (0, ""), "{}", r.err);
    assert_eq!(patched(&f, before), ["a1b2c3d4"]);
    assert!(
        f.requests()[before..]
            .iter()
            .all(|q| !q.path.ends_with("/train.sh")),
        "NAME was used as an id"
    );
    // Named ids with a name filter: only those that match.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &["compat", "scancel", "--name=sweep", "sweep", "bobs-job"],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(patched(&f, before), ["sweep"]);
    // No match: silent, nothing cancelled.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &["compat", "scancel", "-n", "nothing-by-that-name"],
        d.path(),
    )
    .await;
    assert_eq!((r.code, r.out.as_str(), r.err.as_str()), (0, "", ""));
    assert!(patched(&f, before).is_empty());
    // A filter Lattice cannot apply is an error, not ignored.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &["compat", "scancel", "-u", "alice", "-p", "gpu"],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(
        r.err.contains("--partition=gpu is not supported"),
        "{}",
        r.err
    );
    assert!(patched(&f, before).is_empty());
}

#[tokio::test]
async fn scancel_me_with_job_ids_cancels_only_your_own() {
    let f = queue().await;
    let d = project();
    // bobs-job is bob's: --me (like -u alice) leaves it alone; eval-job is alice's.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &["compat", "scancel", "--me", "bobs-job", "eval-job"],
        d.path(),
    )
    .await;
    assert_eq!((r.code, r.out.as_str(), r.err.as_str()), (0, "", ""));
    assert_eq!(patched(&f, before), ["eval-job"]);
    // Only someone else's job named: nothing is cancelled; `lattice -v` says why.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &["-v", "compat", "scancel", "--me", "bobs-job"],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(patched(&f, before).is_empty(), "bob's job was cancelled");
    assert!(
        r.err.contains("job bobs-job is not yours; not cancelled"),
        "{}",
        r.err
    );
    // --me with -t: both filters apply to the named jobs.
    let before = f.requests().len();
    let r = alice_at(
        &f,
        &[
            "compat", "scancel", "--me", "-t", "R", "a1b2c3d4", "bobs-job",
        ],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(patched(&f, before), ["a1b2c3d4"]);
    // Without $USER nobody's jobs can be shown to be yours: refused, nothing cancelled.
    let before = f.requests().len();
    let r = run_opts(
        &f.url,
        &["compat", "scancel", "--me", "bobs-job"],
        Opts {
            env: vec![],
            ..Opts::alice(d.path())
        },
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(r.err.contains("$USER is not set"), "{}", r.err);
    assert!(patched(&f, before).is_empty());
}

#[tokio::test]
async fn sacct_jobs_with_a_time_window() {
    let f = queue().await;
    let d = project();
    let fmt = "--format=JobID,State";
    // done-1 ended 09:30, crashed at 09:00:42: only done-1 was active after 09:15.
    let r = alice_at(
        &f,
        &[
            "compat",
            "sacct",
            "-j",
            "done-1,crashed",
            "-S",
            "2026-01-01T09:15:00Z",
            "-n",
            "-P",
            fmt,
        ],
        d.path(),
    )
    .await;
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "done-1|COMPLETED|\n"),
        "{}",
        r.err
    );
    // Both were submitted before the end of the window; a running job is active until now.
    let r = alice_at(
        &f,
        &[
            "compat",
            "sacct",
            "-j",
            "done-1,a1b2c3d4",
            "-S",
            "2026-01-01T11:00:00Z",
            "-E",
            "2026-01-02",
            "-n",
            "-P",
            fmt,
        ],
        d.path(),
    )
    .await;
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "a1b2c3d4|RUNNING|\n"),
        "{}",
        r.err
    );
    let r = alice_at(
        &f,
        &[
            "compat",
            "sacct",
            "-j",
            "done-1",
            "-E",
            "2025-12-31",
            "-n",
            "-P",
            fmt,
        ],
        d.path(),
    )
    .await;
    assert_eq!((r.code, r.out.as_str()), (0, ""), "{}", r.err);
    let r = alice_at(
        &f,
        &["compat", "sacct", "-j", "done-1", "-S", "someday"],
        d.path(),
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(r.err.contains("--starttime"), "{}", r.err);
}

#[tokio::test]
async fn srun_waits_and_streams_output() {
    let f = start().await;
    let d = tempfile::tempdir().expect("tmp");
    // The "scheduler": mark the allocation finished as soon as it exists.
    let state = f.state.clone();
    let done = tokio::spawn(async move {
        for _ in 0..200 {
            {
                let mut st = state.lock().expect("lock");
                let key = (
                    "allocations".to_string(),
                    "default".to_string(),
                    "hostname-00001".to_string(),
                );
                if let Some(o) = st.objects.get_mut(&key) {
                    o["status"] = json!({"phase": "Completed", "startTime": "2026-01-01T11:59:00Z",
                                         "endTime": "2026-01-01T11:59:01Z", "exitCode": 0});
                    st.logs
                        .insert("hostname-00001".into(), "nid001\nnid002\n".into());
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        alice_at(&f, &["compat", "srun", "-N", "2", "hostname"], d.path()),
    )
    .await
    .expect("srun ends");
    done.await.expect("helper");
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "nid001\nnid002\n");
    assert_eq!(
        r.err,
        "srun: job hostname-00001 queued and waiting for resources\n"
    );
}

#[tokio::test]
async fn completion_names() {
    let f = queue().await;
    let r = run_alice(&f.url, &["__complete", "allocations"]).await;
    assert_eq!(r.code, 0);
    assert!(r.out.starts_with("a1b2c3d4\nbobs-job\n"), "{}", r.out);
    let c = cluster().await;
    let r = run_alice(&c.url, &["__complete", "nodes"]).await;
    assert_eq!(r.out.lines().count(), 4);
    let r = run_alice("http://127.0.0.1:9", &["__complete", "nodes"]).await;
    assert_eq!((r.code, r.out.as_str(), r.err.as_str()), (1, "", ""));
    // The shell helpers pass the tenant typed on the command line: names from that tenant.
    let mut other = a("phys-run", "Running", Some("alice"));
    other["metadata"]["namespace"] = json!("physics");
    f.insert("allocations", other);
    for args in [
        &["__complete", "allocations", "--tenant", "physics"][..],
        &["-t", "physics", "__complete", "allocations"],
    ] {
        let r = run_alice(&f.url, args).await;
        assert_eq!((r.code, r.out.as_str()), (0, "phys-run\n"), "{args:?}");
    }
}
