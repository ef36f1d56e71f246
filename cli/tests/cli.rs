//! End-to-end tests of the CLI library against a fake API server, with golden files.
//! `UPDATE_GOLDEN=1 cargo test -p lattice-cli` regenerates `tests/golden/*`.

mod common;

use std::time::Duration;

use serde_json::json;

use common::*;

#[tokio::test]
async fn get_table_formats() {
    let f = populated().await;
    let r = run_at(&f.url, &["get", "allocations"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_table.txt", &r.out);

    let r = run_at(&f.url, &["get", "alloc", "-o", "wide"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_wide.txt", &r.out);

    let r = run_at(&f.url, &["get", "allocation", "-A"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_all_tenants.txt", &r.out);

    let r = run_at(&f.url, &["get", "alloc", "--no-headers", "-n", "physics"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_no_headers.txt", &r.out);

    // Cluster-scoped kind: no tenant in the path.
    let r = run_at(&f.url, &["get", "nodes"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_nodes.txt", &r.out);
    assert!(f
        .requests()
        .iter()
        .any(|q| q.path == format!("{PREFIX}/nodes")));
}

#[tokio::test]
async fn get_machine_formats() {
    let f = populated().await;
    let r = run_at(&f.url, &["get", "alloc", "eval", "-o", "json"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_one.json", &r.out);

    let r = run_at(&f.url, &["get", "alloc", "eval", "-o", "yaml"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_one.yaml", &r.out);

    let r = run_at(&f.url, &["get", "alloc", "-o", "json"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_list.json", &r.out);
    let v: serde_json::Value = serde_json::from_str(&r.out).expect("valid json");
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(2));

    let r = run_at(&f.url, &["get", "alloc", "-o", "yaml", "-n", "physics"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_list.yaml", &r.out);

    let r = run_at(&f.url, &["get", "alloc", "-o", "name"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("get_name.txt", &r.out);

    let r = run_at(
        &f.url,
        &[
            "get",
            "allocation/eval",
            "allocation/train-large",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(r.out, "allocation/eval\nallocation/train-large\n");
}

#[tokio::test]
async fn get_selectors_are_passed_through() {
    let f = populated().await;
    let r = run_at(
        &f.url,
        &[
            "get",
            "alloc",
            "-l",
            "app=train,tier!=test",
            "--field-selector",
            "status.phase=Running",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let reqs = f.requests();
    let list = reqs
        .iter()
        .find(|q| q.path == format!("{PREFIX}/namespaces/default/allocations"))
        .expect("list request");
    assert_eq!(
        list.query.get("labelSelector").map(String::as_str),
        Some("app=train,tier!=test")
    );
    assert_eq!(
        list.query.get("fieldSelector").map(String::as_str),
        Some("status.phase=Running")
    );
    assert_eq!(list.query.get("limit").map(String::as_str), Some("500"));
    assert!(
        r.out.contains("train-large") && !r.out.contains("eval"),
        "{}",
        r.out
    );
}

#[tokio::test]
async fn get_empty_and_missing() {
    let f = populated().await;
    let r = run_at(&f.url, &["get", "alloc", "-n", "nobody"]).await;
    assert_eq!(r.code, 0);
    assert_eq!(r.out, "");
    assert_eq!(r.err, "No allocations found in tenant \"nobody\".\n");

    let r = run_at(&f.url, &["get", "alloc", "eval", "ghost"]).await;
    assert_eq!(r.code, 1);
    golden("get_missing.txt", &format!("{}---\n{}", r.out, r.err));
}

#[tokio::test]
async fn plugin_kind_from_discovery() {
    let f = populated().await;
    f.insert(
        "widgets",
        json!({"apiVersion": GV, "kind": "Widget", "metadata": {"name": "w1", "namespace": "default",
               "creationTimestamp": "2026-01-01T11:57:00Z"}}),
    );
    let r = run_at(&f.url, &["get", "widgets"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "NAME   AGE\nw1     3m\n");
}

#[tokio::test]
async fn unknown_kind_lists_known_kinds() {
    let f = populated().await;
    let r = run_at(&f.url, &["get", "frobs"]).await;
    assert_eq!(r.code, 1);
    golden("error_unknown_kind.txt", &r.err);
}

#[tokio::test]
async fn unauthorized_hint() {
    let f = populated().await;
    f.state.lock().expect("lock").token = Some("s3cret".into());
    let r = run_at(&f.url, &["get", "alloc"]).await;
    assert_eq!(r.code, 4, "not authenticated exits 4");
    golden("error_401.txt", &r.err);

    let r = run_at(&f.url, &["--token", "s3cret", "get", "alloc", "-o", "name"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(f.requests().iter().any(|q| q.auth == "Bearer s3cret"));
}

#[tokio::test]
async fn connection_refused_hint() {
    // A port that was just free: nothing listens there.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    let url = format!("http://127.0.0.1:{port}");
    let r = run_at(&url, &["get", "alloc"]).await;
    assert_eq!(r.code, 5, "unreachable exits 5");
    golden(
        "error_connection_refused.txt",
        &r.err.replace(&port.to_string(), "PORT"),
    );
}

#[tokio::test]
async fn apply_create_configure_unchanged_and_dry_run() {
    let f = start().await;
    let dir = tempfile::tempdir().expect("tmp");
    let m1 = dir.path().join("a.yaml");
    std::fs::write(
        &m1,
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: a\nspec:\n  resources: {nodes: 2}\n---\napiVersion: lattice.dev/v1alpha1\nkind: Node\nmetadata:\n  name: n1\n  namespace: ignored\n",
    )
    .expect("write");
    let p = m1.to_string_lossy().to_string();
    let r = run_at(&f.url, &["apply", "-f", &p]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.out, "allocation/a created\nnode/n1 created\n");

    // Namespace defaulted to the tenant; cluster-scoped objects lose theirs.
    let stored = f.get("allocations", "default", "a").expect("stored");
    assert_eq!(stored["metadata"]["namespace"], "default");
    let node = f.get("nodes", "", "n1").expect("node");
    assert!(node["metadata"].get("namespace").is_none());
    let patch = f
        .requests()
        .into_iter()
        .find(|q| q.method == "PATCH")
        .expect("patch");
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    assert_eq!(
        patch.query.get("fieldManager").map(String::as_str),
        Some("lattice-cli")
    );
    assert_eq!(patch.query.get("force").map(String::as_str), Some("false"));

    let r = run_at(&f.url, &["apply", "-f", &p]).await;
    assert_eq!(
        r.out, "allocation/a unchanged\nnode/n1 unchanged\n",
        "{}",
        r.err
    );

    std::fs::write(
        &m1,
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: a\nspec:\n  resources: {nodes: 3}\n",
    )
    .expect("write");
    let r = run_at(&f.url, &["apply", "-f", &p, "--dry-run=server"]).await;
    assert_eq!(
        r.out, "allocation/a configured (server dry run)\n",
        "{}",
        r.err
    );
    assert_eq!(
        f.get("allocations", "default", "a").expect("a")["spec"]["resources"]["nodes"],
        2
    );
    let r = run_at(&f.url, &["apply", "-f", &p, "--force-conflicts"]).await;
    assert_eq!(r.out, "allocation/a configured\n", "{}", r.err);
    let last = f
        .requests()
        .into_iter()
        .rev()
        .find(|q| q.method == "PATCH")
        .expect("patch");
    assert_eq!(last.query.get("force").map(String::as_str), Some("true"));
}

#[tokio::test]
async fn apply_from_stdin_and_directories() {
    let f = start().await;
    let doc = |n: &str| {
        format!("apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: {n}\n")
    };
    let r = run_with(
        &f.url,
        &["apply", "-f", "-", "-n", "physics"],
        &doc("from-stdin"),
        None,
    )
    .await;
    assert_eq!(r.out, "allocation/from-stdin created\n", "{}", r.err);
    assert!(f.get("allocations", "physics", "from-stdin").is_some());

    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
    std::fs::write(dir.path().join("1.yaml"), doc("top")).expect("w");
    std::fs::write(dir.path().join("notes.txt"), "not a manifest").expect("w");
    std::fs::write(
        dir.path().join("sub").join("2.json"),
        r#"{"apiVersion":"lattice.dev/v1alpha1","kind":"Allocation","metadata":{"name":"nested"}}"#,
    )
    .expect("w");
    let d = dir.path().to_string_lossy().to_string();
    let r = run_at(&f.url, &["apply", "-f", &d]).await;
    assert_eq!(r.out, "allocation/top created\n", "{}", r.err);
    let r = run_at(&f.url, &["apply", "-R", "-f", &d]).await;
    assert_eq!(
        r.out, "allocation/top unchanged\nallocation/nested created\n",
        "{}",
        r.err
    );
}

#[tokio::test]
async fn apply_bad_yaml_names_file_document_and_line() {
    let f = start().await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("bad.yaml");
    std::fs::write(
        &p,
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: ok}\n---\napiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: broken\n  labels: {a: b\n",
    )
    .expect("write");
    let r = run_at(&f.url, &["apply", "-f", &p.to_string_lossy()]).await;
    assert_eq!(r.code, 1);
    assert!(
        f.requests().iter().all(|q| q.method != "PATCH"),
        "nothing applied"
    );
    golden(
        "error_bad_yaml.txt",
        &r.err
            .replace(&dir.path().to_string_lossy().to_string(), "DIR"),
    );
}

#[tokio::test]
async fn apply_invalid_422_lists_causes() {
    let f = start().await;
    f.state.lock().expect("lock").fail_on.insert(
        "bad".into(),
        (
            422,
            json!({"kind":"Status","status":"Failure","code":422,"reason":"Invalid",
                   "message":"Allocation.lattice.dev \"bad\" is invalid",
                   "details":{"causes":[
                       {"field":"spec.preemptionClass","message":"must be between 0 and 10, got 12"},
                       {"field":"spec.lifecycle.walltime","message":"must be a duration like 4h"}]}}),
        ),
    );
    let m = "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: bad\n";
    let r = run_with(&f.url, &["apply", "-f", "-"], m, None).await;
    assert_eq!(r.code, 1);
    golden("error_422.txt", &r.err);
}

#[tokio::test]
async fn apply_conflict_409_suggests_force() {
    let f = start().await;
    f.state.lock().expect("lock").fail_on.insert(
        "scaled".into(),
        (
            409,
            json!({"kind":"Status","status":"Failure","code":409,"reason":"Conflict",
                   "message":"Apply failed with 1 conflict: conflict with \"autoscaler\": .spec.replicas",
                   "details":{"causes":[{"reason":"FieldManagerConflict","field":".spec.replicas",
                                         "message":"conflict with \"autoscaler\" using lattice.dev/v1alpha1"}]}}),
        ),
    );
    let m = "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: scaled\n";
    let r = run_with(&f.url, &["apply", "-f", "-"], m, None).await;
    assert_eq!(r.code, 1);
    golden("error_409_conflict.txt", &r.err);
}

#[tokio::test]
async fn apply_prune_with_applyset() {
    let f = start().await;
    let two = "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: keep}\n---\napiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: old}\n";
    let r = run_with(
        &f.url,
        &["apply", "-f", "-", "--prune", "--applyset", "app1"],
        two,
        None,
    )
    .await;
    assert_eq!(
        r.out, "allocation/keep created\nallocation/old created\n",
        "{}",
        r.err
    );
    let keep = f.get("allocations", "default", "keep").expect("keep");
    assert_eq!(
        keep["metadata"]["labels"]["applyset.kubernetes.io/part-of"],
        "app1"
    );
    // An object outside the set is never pruned.
    f.insert(
        "allocations",
        json!({"apiVersion": GV, "kind": "Allocation", "metadata": {"name": "other", "namespace": "default"}}),
    );
    let one = "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: keep}\n";
    let r = run_with(
        &f.url,
        &[
            "apply",
            "-f",
            "-",
            "--prune",
            "--applyset=app1",
            "--dry-run=server",
        ],
        one,
        None,
    )
    .await;
    assert_eq!(
        r.out,
        "allocation/keep unchanged (server dry run)\nallocation/old pruned (server dry run)\n",
        "{}",
        r.err
    );
    assert!(f.get("allocations", "default", "old").is_some());
    let r = run_with(
        &f.url,
        &["apply", "-f", "-", "--prune", "--applyset=app1"],
        one,
        None,
    )
    .await;
    assert_eq!(
        r.out, "allocation/keep unchanged\nallocation/old pruned\n",
        "{}",
        r.err
    );
    assert!(f.get("allocations", "default", "old").is_none());
    assert!(f.get("allocations", "default", "other").is_some());

    let r = run_with(&f.url, &["apply", "-f", "-", "--prune"], one, None).await;
    assert_eq!(r.code, 1);
    assert!(r.err.contains("--applyset"), "{}", r.err);
}

#[tokio::test]
async fn diff_exit_codes() {
    let f = start().await;
    let m = |n: u32| {
        format!("apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: d\nspec:\n  resources:\n    nodes: {n}\n")
    };
    let r = run_with(&f.url, &["apply", "-f", "-"], &m(2), None).await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_with(&f.url, &["diff", "-f", "-"], &m(2), None).await;
    assert_eq!((r.code, r.out.as_str()), (0, ""), "{}", r.err);
    let r = run_with(&f.url, &["diff", "-f", "-"], &m(5), None).await;
    assert_eq!(r.code, 1, "{}", r.err);
    golden("diff.txt", &r.out);
    // The live object is untouched (dry run).
    assert_eq!(
        f.get("allocations", "default", "d").expect("d")["spec"]["resources"]["nodes"],
        2
    );
    assert!(f
        .requests()
        .iter()
        .filter(|q| q.method == "PATCH")
        .skip(1)
        .all(|q| q.query.get("dryRun").map(String::as_str) == Some("All")));
}

#[tokio::test]
async fn delete_by_name_selector_and_file() {
    let f = populated().await;
    let r = run_at(&f.url, &["delete", "alloc", "eval", "--dry-run=server"]).await;
    assert_eq!(
        r.out, "allocation \"eval\" deleted (server dry run)\n",
        "{}",
        r.err
    );
    assert!(f.get("allocations", "default", "eval").is_some());
    let r = run_at(&f.url, &["delete", "alloc", "eval", "ghost"]).await;
    assert_eq!(r.code, 1);
    golden("delete.txt", &format!("{}---\n{}", r.out, r.err));
    let r = run_at(&f.url, &["delete", "alloc", "-l", "app=train"]).await;
    assert_eq!(r.out, "allocation \"train-large\" deleted\n", "{}", r.err);
    let r = run_with(
        &f.url,
        &["delete", "-f", "-", "-n", "physics"],
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: sim}\n",
        None,
    )
    .await;
    assert_eq!(r.out, "allocation \"sim\" deleted\n", "{}", r.err);
}

#[tokio::test]
async fn describe_with_conditions_and_events() {
    let f = populated().await;
    f.insert(
        "events",
        json!({"apiVersion": GV, "kind": "Event", "metadata": {"name": "e1", "namespace": "default"},
               "involvedObject": {"kind": "Allocation", "name": "train-large"}, "type": "Normal", "reason": "Scheduled",
               "message": "placed on 64 nodes in 2 groups", "source": {"component": "scheduler"},
               "firstTimestamp": "2026-01-01T10:00:00Z", "lastTimestamp": "2026-01-01T10:00:00Z", "count": 1}),
    );
    f.insert(
        "events",
        json!({"apiVersion": GV, "kind": "Event", "metadata": {"name": "e2", "namespace": "default"},
               "involvedObject": {"kind": "Allocation", "name": "train-large"}, "type": "Warning", "reason": "NodeSlow",
               "message": "node x1 is slow", "source": {"component": "agent"},
               "firstTimestamp": "2026-01-01T11:00:00Z", "lastTimestamp": "2026-01-01T11:50:00Z", "count": 3}),
    );
    f.insert(
        "events",
        json!({"apiVersion": GV, "kind": "Event", "metadata": {"name": "e3", "namespace": "default"},
               "involvedObject": {"kind": "Allocation", "name": "eval"}, "type": "Normal", "reason": "Other",
               "message": "not about train-large", "lastTimestamp": "2026-01-01T11:50:00Z"}),
    );
    let r = run_at(&f.url, &["describe", "alloc", "train-large"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("describe.txt", &r.out);
    let ev_req = f
        .requests()
        .into_iter()
        .find(|q| q.path.ends_with("/events"))
        .expect("events listed");
    assert_eq!(
        ev_req.query.get("fieldSelector").map(String::as_str),
        Some("involvedObject.name=train-large")
    );

    // A server without that field selector: filtered on the client.
    f.state.lock().expect("lock").reject_event_field_selector = true;
    let again = run_at(&f.url, &["describe", "alloc", "train-large"]).await;
    assert_eq!(again.out, r.out);
}

#[tokio::test]
async fn api_resources_and_version() {
    let f = start().await;
    let r = run_at(&f.url, &["api-resources"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    golden("api_resources.txt", &r.out);
    let r = run_at(&f.url, &["version"]).await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.out,
        format!(
            "Client Version: {}\nServer Version: v0.1.0-fake\nServer Commit: abc123\nServer URL: {}\n",
            env!("CARGO_PKG_VERSION"),
            f.url
        )
    );
}

#[tokio::test]
async fn watch_resumes_relists_and_stops() {
    let f = populated().await;
    let obj = |phase: &str, rv: &str| {
        let mut a = alloc("default", "eval", phase, 4, "2026-01-01T11:59:55Z");
        a["metadata"]["resourceVersion"] = json!(rv);
        a
    };
    {
        let mut st = f.state.lock().expect("lock");
        // 1st connection: a change, a bookmark, then the server drops the stream.
        st.watch_script.push_back(WatchReply::Events(vec![
            json!({"type": "MODIFIED", "object": obj("Running", "101")}),
            json!({"type": "BOOKMARK", "object": {"kind": "Allocation", "apiVersion": GV, "metadata": {"resourceVersion": "105"}}}),
        ]));
        // 2nd: the server is restarting -> back off and resume from the bookmark.
        st.watch_script.push_back(WatchReply::Status(503));
        // 3rd: the resource version was compacted -> relist.
        st.watch_script.push_back(WatchReply::Status(410));
        // 4th: an in-stream 410.
        st.watch_script.push_back(WatchReply::Events(vec![
            json!({"type": "DELETED", "object": obj("Running", "110")}),
            json!({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}),
        ]));
    }
    let notify = f.watch_done.clone();
    let shutdown: lattice_cli::Shutdown = Box::pin(async move {
        notify.notified().await;
    });
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        run_with(&f.url, &["get", "alloc", "-w"], "", Some(shutdown)),
    )
    .await
    .expect("watch ends on shutdown");
    assert_eq!(r.code, 0, "{}", r.err);
    golden("watch.txt", &r.out);
    let watches: Vec<_> = f
        .requests()
        .into_iter()
        .filter(|q| q.query.get("watch").map(String::as_str) == Some("true"))
        .collect();
    assert_eq!(watches.len(), 5);
    let rv = |i: usize| {
        watches[i]
            .query
            .get("resourceVersion")
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(rv(0), "100", "watch starts at the list's resourceVersion");
    assert_eq!(rv(1), "105", "resumes from the last bookmark");
    assert_eq!(rv(2), "105", "retries from the same point after a 503");
    assert_eq!(rv(3), "100", "relisted after 410");
    assert_eq!(rv(4), "100", "relisted after in-stream 410");
    assert!(
        r.err.starts_with("warning: watch connection failed"),
        "{}",
        r.err
    );
    assert_eq!(
        watches[0]
            .query
            .get("allowWatchBookmarks")
            .map(String::as_str),
        Some("true")
    );
}

#[tokio::test]
async fn config_commands_write_private_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = dir.path().join("lattice").join("config.yaml");
    let c = cfg.to_string_lossy().to_string();
    let r = run_at(
        "http://unused",
        &["--config", &c, "config", "set-url", "lattice.example:8080"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_at(
        "http://unused",
        &["--config", &c, "config", "set-token", "tok"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let r = run_at(
        "http://unused",
        &["--config", &c, "config", "set-tenant", "physics"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cfg).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let text = std::fs::read_to_string(&cfg).expect("read");
    assert_eq!(
        text,
        "api_url: http://lattice.example:8080\ntoken: tok\ntenant: physics\n"
    );

    // The file's tenant is used when no flag or env says otherwise.
    let f = populated().await;
    let mut argv = vec![
        "lattice",
        "--config",
        &c,
        "--api-url",
        &f.url,
        "get",
        "alloc",
        "-o",
        "name",
    ];
    let cli =
        <lattice_cli::cli::Cli as clap::Parser>::try_parse_from(argv.drain(..)).expect("parse");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let opts = lattice_cli::RunOptions {
        catalog: Some(test_catalog()),
        ..Default::default()
    };
    let env = lattice_cli::config::Env::default();
    let code = lattice_cli::run(cli, &env, opts, &mut out, &mut err).await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(String::from_utf8_lossy(&out), "allocation/sim\n");
    assert!(f.requests().iter().any(|q| q.auth == "Bearer tok"));

    let r = run_at("http://unused", &["--config", &c, "config", "view"]).await;
    assert!(r.out.contains("token: REDACTED"), "{}", r.out);
    assert!(!r.out.contains("tok\n"), "{}", r.out);
}

#[tokio::test]
async fn manifest_errors_name_the_file() {
    let f = start().await;
    let r = run_at(
        &f.url,
        &["apply", "-f", "/nonexistent/lattice/manifest.yaml"],
    )
    .await;
    assert_eq!(r.code, 1);
    golden("error_missing_file.txt", &r.err);

    let m = "apiVersion: lattice.dev/v1alpha1\nkind: Alocation\nmetadata: {name: typo}\n";
    let r = run_with(&f.url, &["apply", "-f", "-"], m, None).await;
    assert_eq!(r.code, 1);
    golden("error_unknown_manifest_kind.txt", &r.err);

    let r = run_with(&f.url, &["diff", "-f", "-"], m, None).await;
    assert_eq!(r.code, 2, "diff errors exit 2 (1 means differences)");
}

#[tokio::test]
async fn builtin_printer_columns_from_lattice_apis() {
    let f = populated().await;
    let mut argv = vec!["lattice", "--api-url", f.url.as_str(), "get", "alloc"];
    let cli =
        <lattice_cli::cli::Cli as clap::Parser>::try_parse_from(argv.drain(..)).expect("parse");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let opts = lattice_cli::RunOptions {
        now: Some(now()),
        ..Default::default()
    };
    let code = lattice_cli::run(
        cli,
        &lattice_cli::config::Env::default(),
        opts,
        &mut out,
        &mut err,
    )
    .await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let out = String::from_utf8_lossy(&out).to_string();
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split("   ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let info = lattice_apis::find_kind("alloc").expect("allocation kind");
    let want: Vec<String> = info
        .printer_columns
        .iter()
        .filter(|c| c.priority == 0)
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(header.first().copied(), Some("NAME"), "{out}");
    for w in &want {
        assert!(header.contains(&w.as_str()), "{w} missing in {header:?}");
    }
    assert_eq!(out.lines().count(), 3, "{out}");
}
