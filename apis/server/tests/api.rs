//! Contract tests: the real HTTP server over EmbeddedStore, driven with reqwest.

mod common;

use std::time::Duration;

use common::*;
use lattice_apiserver::{mint_token, ApiConfig, Role};
use lattice_store::KvBackend;
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn crud_conflicts_and_generation() {
    let s = start().await;
    let path = format!("{}/a", allocs("t1"));
    let (c, created) = s.post(&allocs("t1"), &alloc("a", "t1")).await;
    assert_eq!(c, 201, "{created}");
    assert!(created["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| u.len() == 36));
    assert!(created["metadata"]["creationTimestamp"].is_string());
    assert_eq!(created["metadata"]["generation"], 1);

    // 409 AlreadyExists
    let (c, e) = s.post(&allocs("t1"), &alloc("a", "t1")).await;
    assert_eq!(
        (c, e["reason"].as_str()),
        (409, Some("AlreadyExists")),
        "{e}"
    );
    assert_eq!(e["kind"], "Status");
    assert_eq!(e["code"], 409);

    // 404 on a missing object, and on unknown kinds
    let (c, e) = s.get(&format!("{}/nope", allocs("t1"))).await;
    assert_eq!((c, e["reason"].as_str()), (404, Some("NotFound")));
    let (c, _) = s.get(&format!("{API}/namespaces/t1/widgets")).await;
    assert_eq!(c, 404);

    // PUT: metadata-only change keeps generation; status in the body is ignored
    let mut upd = created.clone();
    upd["metadata"]["labels"]["extra"] = json!("1");
    upd["status"] = json!({"phase": "Running"});
    let (c, v) = s.put(&path, &upd).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["generation"], 1);
    assert_eq!(v["metadata"]["labels"]["extra"], "1");
    assert!(
        v["status"].is_null() || v["status"]["phase"] != "Running",
        "{v}"
    );
    assert!(rv(&v) > rv(&created));

    // stale resourceVersion: 409 Conflict
    let (c, e) = s.put(&path, &upd).await;
    assert_eq!((c, e["reason"].as_str()), (409, Some("Conflict")), "{e}");

    // missing resourceVersion: 422
    let mut no_rv = v.clone();
    no_rv["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let (c, e) = s.put(&path, &no_rv).await;
    assert_eq!(c, 422, "{e}");

    // spec change bumps generation
    let mut spec = v.clone();
    spec["spec"]["args"] = json!(["-c", "echo changed"]);
    let (c, v2) = s.put(&path, &spec).await;
    assert_eq!(c, 200, "{v2}");
    assert_eq!(v2["metadata"]["generation"], 2);
    assert_eq!(v2["metadata"]["uid"], created["metadata"]["uid"]);

    // PUT identical object: nothing changes (no new revision)
    let (c, v3) = s.put(&path, &v2).await;
    assert_eq!(c, 200);
    assert_eq!(rv(&v3), rv(&v2));

    // name mismatch: 400
    let mut other = v2.clone();
    other["metadata"]["name"] = json!("b");
    let (c, _) = s.put(&path, &other).await;
    assert_eq!(c, 400);

    let (c, d) = s.delete(&path).await;
    assert_eq!(c, 200, "{d}");
    let (c, _) = s.delete(&path).await;
    assert_eq!(c, 404);

    // wrong method
    let (c, e) = s.req(Method::POST, &path, Some(&json!({}))).await;
    assert_eq!((c, e["reason"].as_str()), (405, Some("MethodNotAllowed")));
}

#[tokio::test]
async fn validation_is_422_with_field_paths() {
    let s = start().await;
    let mut bad = alloc("bad", "t1");
    bad["spec"]["preemptionClass"] = json!(12);
    let (c, e) = s.post(&allocs("t1"), &bad).await;
    assert_eq!(c, 422, "{e}");
    assert_eq!(e["reason"], "Invalid");
    let causes = e["details"]["causes"].as_array().unwrap();
    assert!(
        causes.iter().any(|c| c["field"] == "spec.preemptionClass"),
        "{e}"
    );

    let mut unknown = alloc("bad2", "t1");
    unknown["spec"]["bogus"] = json!(1);
    let (c, e) = s.post(&allocs("t1"), &unknown).await;
    assert_eq!(c, 422, "{e}");
    assert!(
        e["details"]["causes"][0]["field"]
            .as_str()
            .unwrap()
            .contains("bogus"),
        "{e}"
    );

    // not JSON at all: 400; namespace mismatch: 400; kind mismatch: 400
    let resp = s
        .client
        .post(s.url(&allocs("t1")))
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let (c, _) = s.post(&allocs("t2"), &alloc("x", "t1")).await;
    assert_eq!(c, 400);
    let mut wrong = alloc("x", "t1");
    wrong["kind"] = json!("Dag");
    let (c, _) = s.post(&allocs("t1"), &wrong).await;
    assert_eq!(c, 400);
    // missing name: 422
    let mut noname = alloc("x", "t1");
    noname["metadata"].as_object_mut().unwrap().remove("name");
    let (c, e) = s.post(&allocs("t1"), &noname).await;
    assert_eq!(c, 422, "{e}");
    // generateName works
    noname["metadata"]["generateName"] = json!("gen-");
    let (c, v) = s.post(&allocs("t1"), &noname).await;
    assert_eq!(c, 201, "{v}");
    assert!(v["metadata"]["name"].as_str().unwrap().starts_with("gen-"));
}

#[tokio::test]
async fn status_subresource_rules() {
    let s = start().await;
    let path = format!("{}/a", allocs("t1"));
    let (_, v) = s.post(&allocs("t1"), &alloc("a", "t1")).await;

    // PUT /status changes only status, not spec, and no generation bump
    let mut st = v.clone();
    st["status"] = json!({"phase": "Running"});
    st["spec"]["args"] = json!(["ignored"]);
    st["metadata"]["labels"] = json!({"ignored": "yes"});
    let (c, v2) = s.put(&format!("{path}/status"), &st).await;
    assert_eq!(c, 200, "{v2}");
    assert_eq!(v2["status"]["phase"], "Running");
    assert_eq!(v2["spec"]["args"], json!(["-c", "echo hi"]));
    assert!(v2["metadata"]["labels"]["ignored"].is_null());
    assert_eq!(v2["metadata"]["generation"], 1);

    // main resource writes keep the stored status
    let (c, v3) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"status":{"phase":"Failed"},"spec":{"args":["x"]}}"#,
        )
        .await;
    assert_eq!(c, 200, "{v3}");
    assert_eq!(v3["status"]["phase"], "Running");
    assert_eq!(v3["spec"]["args"], json!(["x"]));
    assert_eq!(v3["metadata"]["generation"], 2);

    // PATCH /status
    let (c, v4) = s
        .patch(
            &format!("{path}/status"),
            "application/merge-patch+json",
            r#"{"status":{"phase":"Completed"}}"#,
        )
        .await;
    assert_eq!(c, 200, "{v4}");
    assert_eq!(v4["status"]["phase"], "Completed");
    assert_eq!(v4["metadata"]["generation"], 2);
    let (c, g) = s.get(&format!("{path}/status")).await;
    assert_eq!(c, 200);
    assert_eq!(g["status"]["phase"], "Completed");

    // invalid status: 422
    let (c, e) = s
        .patch(
            &format!("{path}/status"),
            "application/merge-patch+json",
            r#"{"status":{"phase":"Exploded"}}"#,
        )
        .await;
    assert_eq!(c, 422, "{e}");
}

#[tokio::test]
async fn label_and_field_selectors() {
    let s = start().await;
    for (name, app, tier) in [
        ("a", "web", "gpu"),
        ("b", "web", "cpu"),
        ("c", "db", "cpu"),
        ("d", "db", ""),
    ] {
        let mut o = alloc(name, "t1");
        o["metadata"]["labels"] = if tier.is_empty() {
            json!({"app": app})
        } else {
            json!({"app": app, "tier": tier})
        };
        assert_eq!(s.post(&allocs("t1"), &o).await.0, 201);
    }
    s.post(&allocs("t2"), &alloc("e", "t2")).await;
    let (_, c) = s.get(&format!("{}/c", allocs("t1"))).await;
    let mut st = c.clone();
    st["status"] = json!({"phase": "Running"});
    assert_eq!(
        s.put(&format!("{}/c/status", allocs("t1")), &st).await.0,
        200
    );

    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let q = |sel: &str| format!("{}?labelSelector={}", allocs("t1"), urlenc(sel));
    for (sel, want) in [
        ("app=web", vec!["a", "b"]),
        ("app==db", vec!["c", "d"]),
        ("app!=web", vec!["c", "d"]),
        ("tier in (gpu,cpu)", vec!["a", "b", "c"]),
        ("tier notin (cpu)", vec!["a", "d"]),
        ("tier", vec!["a", "b", "c"]),
        ("!tier", vec!["d"]),
        ("app=web,tier=cpu", vec!["b"]),
    ] {
        let (code, v) = s.get(&q(sel)).await;
        assert_eq!(code, 200, "{sel}: {v}");
        assert_eq!(names(&v), want, "selector {sel}");
    }
    let (code, e) = s.get(&q("app in (web")).await;
    assert_eq!((code, e["reason"].as_str()), (400, Some("BadRequest")));

    let f = |sel: &str| format!("{}?fieldSelector={}", allocs("t1"), urlenc(sel));
    assert_eq!(names(&s.get(&f("metadata.name=b")).await.1), vec!["b"]);
    assert_eq!(names(&s.get(&f("status.phase=Running")).await.1), vec!["c"]);
    assert_eq!(
        names(&s.get(&f("metadata.name!=a,metadata.name!=b")).await.1),
        vec!["c", "d"]
    );
    assert_eq!(s.get(&f("spec.entrypoint=x")).await.0, 400);

    // all tenants
    let (_, all) = s.get(&format!("{API}/allocations")).await;
    assert_eq!(names(&all).len(), 5);
    let (_, t2) = s
        .get(&format!(
            "{API}/allocations?fieldSelector=metadata.namespace%3Dt2"
        ))
        .await;
    assert_eq!(names(&t2), vec!["e"]);
}

pub fn urlenc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn pagination_and_compaction() {
    let s = start().await;
    for i in 0..25 {
        assert_eq!(
            s.post(&allocs("t1"), &alloc(&format!("a{i:02}"), "t1"))
                .await
                .0,
            201
        );
    }
    let (_, p1) = s.get(&format!("{}?limit=10", allocs("t1"))).await;
    assert_eq!(p1["items"].as_array().unwrap().len(), 10);
    assert_eq!(p1["metadata"]["remainingItemCount"], 15);
    let list_rv = p1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let tok = p1["metadata"]["continue"].as_str().unwrap().to_string();
    // a write between pages is not visible: every page is read at the list revision
    assert_eq!(s.post(&allocs("t1"), &alloc("a99", "t1")).await.0, 201);
    let (_, p2) = s
        .get(&format!("{}?limit=10&continue={tok}", allocs("t1")))
        .await;
    assert_eq!(p2["items"].as_array().unwrap().len(), 10);
    assert_eq!(p2["metadata"]["resourceVersion"], list_rv.as_str());
    assert_eq!(p2["items"][0]["metadata"]["name"], "a10");
    let tok2 = p2["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, p3) = s
        .get(&format!("{}?limit=10&continue={tok2}", allocs("t1")))
        .await;
    assert_eq!(p3["items"].as_array().unwrap().len(), 5);
    assert!(p3["metadata"]["continue"].is_null(), "{}", p3["metadata"]);

    // limit with a selector
    let (_, sel) = s
        .get(&format!(
            "{}?limit=3&labelSelector=app%3Ddemo",
            allocs("t1")
        ))
        .await;
    assert_eq!(sel["items"].as_array().unwrap().len(), 3);
    assert!(sel["metadata"]["continue"].is_string());

    // garbage token: 400
    assert_eq!(
        s.get(&format!("{}?limit=10&continue=zzz", allocs("t1")))
            .await
            .0,
        400
    );

    // compaction past the list revision: 410 Expired
    let (_, q1) = s.get(&format!("{}?limit=5", allocs("t1"))).await;
    let tok = q1["metadata"]["continue"].as_str().unwrap().to_string();
    for i in 0..3 {
        s.post(&allocs("t1"), &alloc(&format!("b{i}"), "t1")).await;
    }
    let head = s.store.status().await.unwrap().revision;
    s.store.compact(head).await.unwrap();
    let (c, e) = s
        .get(&format!("{}?limit=5&continue={tok}", allocs("t1")))
        .await;
    assert_eq!((c, e["reason"].as_str()), (410, Some("Expired")), "{e}");
}

#[tokio::test]
async fn merge_and_json_patch() {
    let s = start().await;
    let path = format!("{}/a", allocs("t1"));
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    let (c, v) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"x":"y","app":null}}}"#,
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["labels"], json!({"x": "y"}));
    assert_eq!(v["metadata"]["generation"], 1);
    let (c, v) = s
        .patch(
            &path,
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/args","value":["-c","true"]}]"#,
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["args"], json!(["-c", "true"]));
    assert_eq!(v["metadata"]["generation"], 2);
    // failing test op: 422
    let (c, _) = s
        .patch(
            &path,
            "application/json-patch+json",
            r#"[{"op":"test","path":"/spec/entrypoint","value":"x"}]"#,
        )
        .await;
    assert_eq!(c, 422);
    // stale resourceVersion inside a patch: 409
    let (c, _) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"metadata":{"resourceVersion":"1"}}"#,
        )
        .await;
    assert_eq!(c, 409);
    // unknown patch type: 415
    let (c, e) = s
        .patch(&path, "application/strategic-merge-patch+json", "{}")
        .await;
    assert_eq!(
        (c, e["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    // patch of a missing object: 404
    let (c, _) = s
        .patch(
            &format!("{}/zz", allocs("t1")),
            "application/merge-patch+json",
            "{}",
        )
        .await;
    assert_eq!(c, 404);
    // invalid result: 422
    let (c, _) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"spec":{"preemptionClass":99}}"#,
        )
        .await;
    assert_eq!(c, 422);
}

#[tokio::test]
async fn concurrent_patches_all_land() {
    let s = std::sync::Arc::new(start().await);
    let path = format!("{}/a", allocs("t1"));
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let s = s.clone();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            s.patch(
                &path,
                "application/merge-patch+json",
                &format!(r#"{{"metadata":{{"labels":{{"k{i}":"v"}}}}}}"#),
            )
            .await
            .0
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let (_, v) = s.get(&path).await;
    assert_eq!(v["metadata"]["labels"].as_object().unwrap().len(), 21);
}

const MANIFEST: &str = r#"
apiVersion: lattice.dev/v1alpha1
kind: Allocation
metadata:
  name: ssa
  namespace: t1
  labels: {team: ml}
spec:
  entrypoint: /bin/sh
  args: ["-c", "echo hi"]
  lifecycle: {walltime: 10m}
"#;

#[tokio::test]
async fn server_side_apply() {
    let s = start().await;
    let path = format!("{}/ssa", allocs("t1"));
    // apply creates
    let (c, v1) = s.apply(&path, "gitops", false, MANIFEST).await;
    assert_eq!(c, 201, "{v1}");
    let mf = &v1["metadata"]["managedFields"];
    assert_eq!(mf[0]["manager"], "gitops");
    assert_eq!(mf[0]["operation"], "Apply");
    assert!(
        mf[0]["fieldsV1"]["f:spec"]["f:entrypoint"].is_object(),
        "{mf}"
    );
    // idempotent: nothing changes, no new revision, no generation bump
    let (c, v2) = s.apply(&path, "gitops", false, MANIFEST).await;
    assert_eq!(c, 200, "{v2}");
    assert_eq!(v2, v1);
    assert_eq!(v2["metadata"]["generation"], 1);

    // another manager changing an owned field: 409 naming field and manager
    let other = "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: ssa, namespace: t1}\nspec:\n  args: [\"-c\", \"echo other\"]\n";
    let (c, e) = s.apply(&path, "autoscaler", false, other).await;
    assert_eq!(c, 409, "{e}");
    assert_eq!(e["reason"], "Conflict");
    let causes = e["details"]["causes"].as_array().unwrap();
    assert!(
        causes.iter().any(
            |c| c["field"] == ".spec.args" && c["message"].as_str().unwrap().contains("gitops")
        ),
        "{e}"
    );
    // force takes it over
    let (c, v3) = s.apply(&path, "autoscaler", true, other).await;
    assert_eq!(c, 200, "{v3}");
    assert_eq!(v3["spec"]["args"], json!(["-c", "echo other"]));
    assert_eq!(v3["metadata"]["generation"], 2);

    // a manager dropping a field it alone owns removes it
    let (c, v4) = s
        .apply(
            &path,
            "gitops",
            false,
            &MANIFEST
                .replace("  labels: {team: ml}\n", "")
                .replace("echo hi", "echo other"),
        )
        .await;
    assert_eq!(c, 200, "{v4}");
    assert!(v4["metadata"]["labels"]["team"].is_null(), "{v4}");

    // fieldManager is required
    let (c, _) = s
        .patch(&path, "application/apply-patch+yaml", MANIFEST)
        .await;
    assert_eq!(c, 400);
    // invalid apply: 422
    let (c, _) = s
        .apply(
            &path,
            "gitops",
            false,
            &MANIFEST
                .replace("walltime: 10m", "walltime: forever")
                .replace("echo hi", "echo other"),
        )
        .await;
    assert_eq!(c, 422);
    // dry-run apply changes nothing
    let (c, d) = s
        .apply(
            &format!("{path}?dryRun=All"),
            "gitops",
            false,
            &MANIFEST.replace("echo hi", "echo dry"),
        )
        .await;
    assert_eq!(c, 409, "{d}"); // still conflicts with autoscaler's ownership of args
    let (c, d) = s
        .apply(
            &format!("{path}?dryRun=All"),
            "gitops",
            false,
            &MANIFEST
                .replace("echo hi", "echo other")
                .replace("team: ml", "team: dry"),
        )
        .await;
    assert_eq!(c, 200, "{d}");
    assert_eq!(d["metadata"]["labels"]["team"], "dry");
    let (_, g) = s.get(&path).await;
    assert!(g["metadata"]["labels"]["team"].is_null());
}

#[tokio::test]
async fn finalizers_block_delete() {
    let s = start().await;
    let path = format!("{}/f", allocs("t1"));
    let mut o = alloc("f", "t1");
    o["metadata"]["finalizers"] = json!(["lattice.dev/checkpoint"]);
    assert_eq!(s.post(&allocs("t1"), &o).await.0, 201);
    let (c, d) = s.delete(&path).await;
    assert_eq!(c, 200, "{d}");
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    let (c, g) = s.get(&path).await;
    assert_eq!(c, 200);
    assert!(g["metadata"]["deletionTimestamp"].is_string());
    // deleting again changes nothing
    let (c, d2) = s.delete(&path).await;
    assert_eq!(c, 200);
    assert_eq!(rv(&d2), rv(&g));
    // adding a finalizer while terminating is forbidden
    let (c, _) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":["lattice.dev/checkpoint","x/y"]}}"#,
        )
        .await;
    assert_eq!(c, 403);
    // removing the last finalizer deletes it
    let (c, v) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":null}}"#,
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(s.get(&path).await.0, 404);
}

#[tokio::test]
async fn delete_preconditions_and_dry_run() {
    let s = start().await;
    let path = format!("{}/p", allocs("t1"));
    let (_, v) = s.post(&allocs("t1"), &alloc("p", "t1")).await;
    let wrong_uid =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}});
    let (c, e) = s.req(Method::DELETE, &path, Some(&wrong_uid)).await;
    assert_eq!((c, e["reason"].as_str()), (409, Some("Conflict")));
    let wrong_rv = json!({"preconditions": {"resourceVersion": "999"}});
    assert_eq!(s.req(Method::DELETE, &path, Some(&wrong_rv)).await.0, 409);
    // dry run
    assert_eq!(
        s.req(Method::DELETE, &format!("{path}?dryRun=All"), None)
            .await
            .0,
        200
    );
    assert_eq!(s.get(&path).await.0, 200);
    let (c, _) = s
        .post(&format!("{}?dryRun=All", allocs("t1")), &alloc("dry", "t1"))
        .await;
    assert_eq!(c, 201);
    assert_eq!(s.get(&format!("{}/dry", allocs("t1"))).await.0, 404);
    let (c, pv) = s
        .patch(
            &format!("{path}?dryRun=All"),
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"d":"1"}}}"#,
        )
        .await;
    assert_eq!(c, 200);
    assert_eq!(pv["metadata"]["labels"]["d"], "1");
    assert!(s.get(&path).await.1["metadata"]["labels"]["d"].is_null());
    assert_eq!(s.get(&format!("{}?dryRun=Some", allocs("t1"))).await.0, 200); // ignored on reads
    assert_eq!(
        s.post(&format!("{}?dryRun=Some", allocs("t1")), &alloc("q", "t1"))
            .await
            .0,
        400
    );
    // right preconditions delete
    let right = json!({"preconditions": {"uid": v["metadata"]["uid"], "resourceVersion": v["metadata"]["resourceVersion"]}});
    assert_eq!(s.req(Method::DELETE, &path, Some(&right)).await.0, 200);
}

#[tokio::test]
async fn delete_propagation_policy_sets_gc_finalizers() {
    let s = start().await;
    let finals = |v: &Value| -> Vec<String> {
        v["metadata"]["finalizers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let opts = |policy: &str| json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy});

    // Foreground: marked with foregroundDeletion, not deleted.
    let path = format!("{}/fg", allocs("t1"));
    assert_eq!(s.post(&allocs("t1"), &alloc("fg", "t1")).await.0, 201);
    let (c, d) = s
        .req(Method::DELETE, &path, Some(&opts("Foreground")))
        .await;
    assert_eq!(c, 200, "{d}");
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(finals(&d), ["foregroundDeletion"]);
    let (c, g) = s.get(&path).await;
    assert_eq!(c, 200);
    assert_eq!(finals(&g), ["foregroundDeletion"]);
    let ts = g["metadata"]["deletionTimestamp"].clone();
    // The same delete again changes nothing; Orphan swaps the finalizer, keeps the timestamp.
    let (_, again) = s
        .req(Method::DELETE, &path, Some(&opts("Foreground")))
        .await;
    assert_eq!(rv(&again), rv(&g));
    let (c, o) = s.req(Method::DELETE, &path, Some(&opts("Orphan"))).await;
    assert_eq!(c, 200, "{o}");
    assert_eq!(finals(&o), ["orphan"]);
    assert_eq!(o["metadata"]["deletionTimestamp"], ts);
    // Removing the last finalizer completes the delete.
    let (c, _) = s
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":null}}"#,
        )
        .await;
    assert_eq!(c, 200);
    assert_eq!(s.get(&path).await.0, 404);

    // Orphan as a query parameter, next to a finalizer of the user's own.
    let path = format!("{}/or", allocs("t1"));
    let mut o = alloc("or", "t1");
    o["metadata"]["finalizers"] = json!(["lattice.dev/checkpoint"]);
    assert_eq!(s.post(&allocs("t1"), &o).await.0, 201);
    let (c, d) = s
        .req(
            Method::DELETE,
            &format!("{path}?propagationPolicy=Orphan"),
            None,
        )
        .await;
    assert_eq!(c, 200, "{d}");
    assert_eq!(finals(&d), ["lattice.dev/checkpoint", "orphan"]);
    // An explicit Background drops the garbage-collection finalizer only.
    let (c, d) = s
        .req(Method::DELETE, &path, Some(&opts("Background")))
        .await;
    assert_eq!(c, 200, "{d}");
    assert_eq!(finals(&d), ["lattice.dev/checkpoint"]);
    assert_eq!(s.get(&path).await.0, 200);

    // The deprecated orphanDependents means Orphan.
    let path = format!("{}/od", allocs("t1"));
    assert_eq!(s.post(&allocs("t1"), &alloc("od", "t1")).await.0, 201);
    let (c, d) = s
        .req(
            Method::DELETE,
            &path,
            Some(&json!({"orphanDependents": true})),
        )
        .await;
    assert_eq!(c, 200, "{d}");
    assert_eq!(finals(&d), ["orphan"]);

    // Dry run: the answer is marked, the store is not.
    let path = format!("{}/dry", allocs("t1"));
    assert_eq!(s.post(&allocs("t1"), &alloc("dry", "t1")).await.0, 201);
    let (c, d) = s
        .req(
            Method::DELETE,
            &format!("{path}?dryRun=All&propagationPolicy=Foreground"),
            None,
        )
        .await;
    assert_eq!(c, 200, "{d}");
    assert_eq!(finals(&d), ["foregroundDeletion"]);
    let (_, g) = s.get(&path).await;
    assert!(g["metadata"]["deletionTimestamp"].is_null());
    assert!(finals(&g).is_empty());

    // Background (the default) on an object without finalizers deletes at once.
    let (c, _) = s
        .req(Method::DELETE, &path, Some(&opts("Background")))
        .await;
    assert_eq!(c, 200);
    assert_eq!(s.get(&path).await.0, 404);
}

#[tokio::test]
async fn delete_rejects_invalid_propagation_policy() {
    let s = start().await;
    let path = format!("{}/bad", allocs("t1"));
    assert_eq!(s.post(&allocs("t1"), &alloc("bad", "t1")).await.0, 201);
    let check = |c: u16, e: &Value| {
        assert_eq!(c, 422, "{e}");
        assert_eq!(e["kind"], "Status");
        assert_eq!(e["reason"], "Invalid");
        assert_eq!(e["details"]["causes"][0]["field"], "propagationPolicy");
    };
    for body in [
        json!({"propagationPolicy": "Sideways"}),
        json!({"propagationPolicy": "foreground"}),
    ] {
        let (c, e) = s.req(Method::DELETE, &path, Some(&body)).await;
        check(c, &e);
        let msg = e["message"].as_str().unwrap_or_default();
        for word in [
            "propagationPolicy",
            "\"Foreground\"",
            "\"Background\"",
            "\"Orphan\"",
        ] {
            assert!(msg.contains(word), "{word} in {msg}");
        }
    }
    let (c, e) = s
        .req(
            Method::DELETE,
            &format!("{path}?propagationPolicy=All"),
            None,
        )
        .await;
    check(c, &e);
    let (c, e) = s
        .req(
            Method::DELETE,
            &path,
            Some(&json!({"propagationPolicy": 3})),
        )
        .await;
    check(c, &e);
    let (c, e) = s
        .req(
            Method::DELETE,
            &path,
            Some(&json!({"propagationPolicy": "Orphan", "orphanDependents": true})),
        )
        .await;
    check(c, &e);
    // Nothing happened to the object.
    let (c, g) = s.get(&path).await;
    assert_eq!(c, 200);
    assert!(g["metadata"]["deletionTimestamp"].is_null());
    assert!(g["metadata"]["finalizers"].is_null());
}

#[tokio::test]
async fn auth_roles_and_tenants() {
    let secret = b"test-secret".to_vec();
    let s = start_with(ApiConfig {
        jwt_secret: secret.clone(),
        auth: true,
        ..Default::default()
    })
    .await;
    let tok = |role, tenants: &[&str]| {
        let t: Vec<String> = tenants.iter().map(|s| s.to_string()).collect();
        mint_token(&secret, "someone", &t, role, Duration::from_secs(300))
    };
    let call = |method: Method, path: String, token: Option<String>, body: Option<Value>| {
        let mut r = s.client.request(method, s.url(&path));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let resp = r.send().await.unwrap();
            let code = resp.status().as_u16();
            (code, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (c, e) = call(Method::GET, allocs("t1"), None, None).await;
    assert_eq!((c, e["reason"].as_str()), (401, Some("Unauthorized")));
    let (c, _) = call(Method::GET, allocs("t1"), Some("garbage".into()), None).await;
    assert_eq!(c, 401);
    let bad_secret = mint_token(
        b"other",
        "x",
        &["*".into()],
        Role::Admin,
        Duration::from_secs(60),
    );
    assert_eq!(
        call(Method::GET, allocs("t1"), Some(bad_secret), None)
            .await
            .0,
        401
    );

    let user = tok(Role::User, &["t1"]);
    assert_eq!(
        call(
            Method::POST,
            allocs("t1"),
            Some(user.clone()),
            Some(alloc("a", "t1"))
        )
        .await
        .0,
        201
    );
    let (c, e) = call(
        Method::POST,
        allocs("t2"),
        Some(user.clone()),
        Some(alloc("a", "t2")),
    )
    .await;
    assert_eq!((c, e["reason"].as_str()), (403, Some("Forbidden")));
    assert_eq!(
        call(Method::GET, allocs("t2"), Some(user.clone()), None)
            .await
            .0,
        403
    );
    assert_eq!(
        call(
            Method::GET,
            format!("{API}/allocations"),
            Some(user.clone()),
            None
        )
        .await
        .0,
        403
    );
    // Their own tenant by name, not the list of every tenant.
    assert_eq!(
        call(
            Method::GET,
            format!("{API}/tenants"),
            Some(user.clone()),
            None
        )
        .await
        .0,
        403
    );
    let tenant = json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "t9"}, "spec": {"quota": {}}});
    assert_eq!(
        call(
            Method::POST,
            format!("{API}/tenants"),
            Some(user.clone()),
            Some(tenant.clone())
        )
        .await
        .0,
        403
    );

    let ro = tok(Role::Readonly, &["t1"]);
    assert_eq!(
        call(
            Method::GET,
            format!("{}/a", allocs("t1")),
            Some(ro.clone()),
            None
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(
            Method::DELETE,
            format!("{}/a", allocs("t1")),
            Some(ro.clone()),
            None
        )
        .await
        .0,
        403
    );

    let admin = tok(Role::Admin, &["*"]);
    assert_eq!(
        call(
            Method::GET,
            format!("{API}/allocations"),
            Some(admin.clone()),
            None
        )
        .await
        .0,
        200
    );
    let (c, e) = call(
        Method::POST,
        format!("{API}/tenants"),
        Some(admin.clone()),
        Some(tenant),
    )
    .await;
    assert!(c == 201 || c == 422, "{c} {e}");
    // discovery needs a token; health does not
    assert_eq!(call(Method::GET, "/apis".into(), None, None).await.0, 401);
    assert_eq!(
        call(Method::GET, "/apis".into(), Some(ro), None).await.0,
        200
    );
    assert_eq!(
        call(Method::GET, "/healthz".into(), None, None).await.0,
        200
    );
}

#[tokio::test]
async fn body_limit_is_413() {
    let s = start_with(ApiConfig {
        max_body_bytes: 2048,
        ..Default::default()
    })
    .await;
    let mut o = alloc("big", "t1");
    o["metadata"]["annotations"] = json!({"x": "y".repeat(4096)});
    let (c, e) = s.post(&allocs("t1"), &o).await;
    assert_eq!(
        (c, e["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );
    // chunked (no content-length) too
    let body = serde_json::to_vec(&o).unwrap();
    let stream = futures::stream::iter(
        body.chunks(512)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let resp = s
        .client
        .post(s.url(&allocs("t1")))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
}

#[tokio::test]
async fn discovery_openapi_table_metrics() {
    let s = start().await;
    let (c, v) = s.get("/version").await;
    assert_eq!(c, 200);
    assert!(v["gitVersion"].as_str().unwrap().starts_with('v'));
    assert_eq!(s.get("/api").await.1["kind"], "APIVersions");
    let (_, groups) = s.get("/apis").await;
    assert_eq!(groups["groups"][0]["name"], "lattice.dev");
    assert_eq!(
        groups["groups"][0]["preferredVersion"]["groupVersion"],
        "lattice.dev/v1alpha1"
    );
    assert_eq!(s.get("/apis/lattice.dev").await.1["kind"], "APIGroup");
    let (_, rl) = s.get("/apis/lattice.dev/v1alpha1").await;
    let res = rl["resources"].as_array().unwrap();
    let a = res.iter().find(|r| r["name"] == "allocations").unwrap();
    assert_eq!(a["kind"], "Allocation");
    assert_eq!(a["namespaced"], true);
    assert!(a["verbs"].as_array().unwrap().contains(&json!("watch")));
    assert!(a["shortNames"]
        .as_array()
        .unwrap()
        .contains(&json!("alloc")));
    assert!(res.iter().any(|r| r["name"] == "allocations/status"));
    assert!(res
        .iter()
        .any(|r| r["name"] == "tenants" && r["namespaced"] == false));

    let (_, idx) = s.get("/openapi/v3").await;
    let url = idx["paths"]["apis/lattice.dev/v1alpha1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    let (c, doc) = s.get(&url).await;
    assert_eq!(c, 200);
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let alloc_schema = schemas
        .values()
        .find(|sc| sc["x-kubernetes-group-version-kind"][0]["kind"] == "Allocation")
        .unwrap();
    assert!(alloc_schema["properties"]["spec"].is_object());
    // every $ref resolves
    let text = serde_json::to_string(&doc).unwrap();
    for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &part[..part.find('"').unwrap()];
        assert!(schemas.contains_key(name), "dangling ref {name}");
    }
    assert_eq!(s.get("/openapi/v2").await.0, 404);

    // Table
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    let resp = s
        .client
        .get(s.url(&allocs("t1")))
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .send()
        .await
        .unwrap();
    let t: Value = resp.json().await.unwrap();
    assert_eq!(t["kind"], "Table", "{t}");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols[0], "Name");
    assert!(cols.contains(&"STATE") && cols.contains(&"AGE"), "{cols:?}");
    assert_eq!(t["rows"][0]["cells"][0], "a");
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "a");
    assert_eq!(t["rows"][0]["cells"].as_array().unwrap().len(), cols.len());

    // health and metrics
    assert_eq!(s.get("/healthz").await.0, 200);
    assert_eq!(s.get("/readyz").await.0, 200);
    let m = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains(
            "lattice_apiserver_requests_total{verb=\"create\",kind=\"Allocation\",code=\"201\"}"
        ),
        "{m}"
    );
    assert!(m.contains("# TYPE lattice_apiserver_requests_total counter"));
    assert!(m.contains("lattice_apiserver_request_duration_seconds_bucket"));
    assert!(!m.contains("# EOF"));
}

#[tokio::test]
async fn intent_api() {
    let s = start().await;
    let (c, v) = s
        .post("/v1/allocations", &json!({"tenant": "t1", "name": "job1", "entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}))
        .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["metadata"]["namespace"], "t1");
    let (c, g) = s.get("/v1/allocations/job1").await;
    assert_eq!(c, 200);
    assert_eq!(g["spec"]["entrypoint"], "/bin/true");
    let (c, l) = s.get("/v1/allocations?tenant=t1").await;
    assert_eq!(c, 200);
    assert_eq!(l["items"].as_array().unwrap().len(), 1);
    let (c, d) = s.delete("/v1/allocations/job1").await;
    assert_eq!(c, 202, "{d}");
    assert_eq!(
        d["metadata"]["annotations"]["lattice.dev/cancel-requested"],
        "true"
    );
    assert_eq!(s.get("/v1/allocations/nope").await.0, 404);
    assert_eq!(s.get("/v1/nodes").await.0, 200);
    assert_eq!(s.get("/v1/tenants").await.0, 200);
    assert_eq!(s.get("/v1/vclusters").await.0, 200);
    assert_eq!(s.get("/v1/widgets").await.0, 404);
}

#[tokio::test]
async fn intent_api_refuses_dependencies_on_missing_allocations() {
    let s = start().await;
    let (c, first) = s
        .post("/v1/allocations", &json!({"tenant": "t1", "name": "prep", "entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}))
        .await;
    assert_eq!(c, 201, "{first}");
    let uid = first["metadata"]["uid"].as_str().expect("uid").to_string();
    let job = |deps: Value| {
        json!({"tenant": "t1", "entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"},
               "depends_on": deps})
    };
    // Like sbatch --dependency on an unknown job: refused, naming the field.
    let (c, e) = s
        .post(
            "/v1/allocations",
            &job(json!([{"ref": "prep", "condition": "success"}, {"ref": "nope", "condition": "any"}])),
        )
        .await;
    assert_eq!((c, e["reason"].as_str()), (422, Some("Invalid")), "{e}");
    assert_eq!(
        e["details"]["causes"][0]["field"], "spec.dependsOn[1].ref",
        "{e}"
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("\"nope\""),
        "{e}"
    );
    // By name, by uid, and a mutex lock name: accepted.
    let (c, v) = s
        .post(
            "/v1/allocations",
            &job(
                json!([{"ref": "prep", "condition": "success"}, {"ref": uid, "condition": "any"},
                        {"ref": "gpu-lock", "condition": "mutex"}]),
            ),
        )
        .await;
    assert_eq!(c, 201, "{v}");
    // The resource API stays declarative: a manifest may name one applied later.
    let (c, v) = s
        .post(
            &format!("{API}/namespaces/t1/allocations"),
            &json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
                    "metadata": {"name": "later", "namespace": "t1"},
                    "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"},
                             "dependsOn": [{"ref": "not-yet", "condition": "success"}]}}),
        )
        .await;
    assert_eq!(c, 201, "{v}");
}

/// A Dag of `n` steps chained by `success` edges, built programmatically.
fn chain_dag(name: &str, ns: &str, n: usize) -> Value {
    let tasks: Vec<Value> = (0..n)
        .map(|i| {
            let mut t = json!({
                "name": format!("s{i}"),
                "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}},
            });
            if i > 0 {
                t["dependsOn"] = json!([{"ref": format!("s{}", i - 1), "condition": "success"}]);
            }
            t
        })
        .collect();
    json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Dag",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"allocations": tasks},
    })
}

fn assert_dag_too_large(c: u16, e: &Value, steps: usize, limit: usize) {
    assert_eq!((c, e["reason"].as_str()), (422, Some("Invalid")), "{e}");
    let cause = &e["details"]["causes"][0];
    assert_eq!(cause["field"], "spec.allocations", "{e}");
    let want = format!("DAG exceeds maximum size ({steps} allocations, limit: {limit})");
    let msg = cause["message"].as_str().unwrap_or_default();
    assert!(msg.contains(&want), "{e}");
    assert!(
        msg.contains(
            "Split the workflow into smaller DAGs or increase the limit via system configuration."
        ),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap_or_default().contains(&want),
        "{e}"
    );
}

#[tokio::test]
async fn dag_size_limit_is_the_configured_one() {
    let s = start_with(ApiConfig {
        max_dag_size: 3,
        ..Default::default()
    })
    .await;
    let dags = format!("{API}/namespaces/t1/dags");
    let (c, e) = s.post(&dags, &chain_dag("big", "t1", 4)).await;
    assert_dag_too_large(c, &e, 4, 3);
    // dryRun and the Intent API go through the same admission.
    let (c, e) = s
        .post(&format!("{dags}?dryRun=All"), &chain_dag("big", "t1", 4))
        .await;
    assert_dag_too_large(c, &e, 4, 3);
    let (c, e) = s.post("/v1/dags", &chain_dag("big", "t1", 4)).await;
    assert_dag_too_large(c, &e, 4, 3);
    // At the limit: accepted.
    let (c, v) = s.post(&dags, &chain_dag("ok", "t1", 3)).await;
    assert_eq!(c, 201, "{v}");
    // Growing it past the limit is rejected; status writes and shrinking are not.
    let mut four = chain_dag("ok", "t1", 4);
    four["metadata"]["resourceVersion"] = v["metadata"]["resourceVersion"].clone();
    let (c, e) = s.put(&format!("{dags}/ok"), &four).await;
    assert_dag_too_large(c, &e, 4, 3);
    let mut st = v.clone();
    st["status"] = json!({"phase": "Running"});
    let (c, v) = s.put(&format!("{dags}/ok/status"), &st).await;
    assert_eq!(c, 200, "{v}");
    let mut two = chain_dag("ok", "t1", 2);
    two["metadata"]["resourceVersion"] = v["metadata"]["resourceVersion"].clone();
    let (c, v) = s.put(&format!("{dags}/ok"), &two).await;
    assert_eq!(c, 200, "{v}");
    // The limit counts allocations: a task group's elements each (the seed's "allocations
    // per DAG"). Two tasks, one of them an array of 3: 4 allocations.
    let mut arrays = chain_dag("arrays", "t1", 2);
    arrays["spec"]["allocations"][1]["spec"]["taskGroup"] = json!({"range": "0-2"});
    let (c, e) = s.post(&dags, &arrays).await;
    assert_dag_too_large(c, &e, 4, 3);
    arrays["spec"]["allocations"][1]["spec"]["taskGroup"] = json!({"range": "0-1"});
    let (c, v) = s.post(&dags, &arrays).await;
    assert_eq!(c, 201, "{v}");
}

#[tokio::test]
async fn dag_over_1000_steps_needs_a_raised_limit() {
    let dags = format!("{API}/namespaces/t1/dags");
    // Default: 1000.
    let s = start().await;
    let (c, e) = s.post(&dags, &chain_dag("big", "t1", 1001)).await;
    assert_dag_too_large(c, &e, 1001, 1000);
    let (c, v) = s.post(&dags, &chain_dag("max", "t1", 1000)).await;
    assert_eq!(c, 201, "{v}");
    // `lattice-server --max-dag-size 2000`.
    let s = start_with(ApiConfig {
        max_dag_size: 2000,
        ..Default::default()
    })
    .await;
    let (c, v) = s.post(&dags, &chain_dag("big", "t1", 1200)).await;
    assert_eq!(c, 201, "{}", v["message"]);
    assert_eq!(
        v["spec"]["allocations"].as_array().map(Vec::len),
        Some(1200)
    );
    let (c, e) = s.post(&dags, &chain_dag("huge", "t1", 2001)).await;
    assert_dag_too_large(c, &e, 2001, 2000);
}

#[tokio::test]
async fn intent_dag_graph() {
    let s = start().await;
    let step = |name: &str, deps: Value| json!({"name": name, "dependsOn": deps, "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}});
    let (c, v) = s
        .post(
            "/v1/dags?tenant=t1",
            &json!({"name": "pipe", "allocations": [
                step("preprocess", json!([])),
                step("train", json!([{"ref": "preprocess", "condition": "success"}])),
                step("evaluate", json!([{"ref": "train"}])),
                step("notify-failure", json!([{"ref": "train", "condition": "failure"}, {"ref": "evaluate", "condition": "failure"}])),
            ]}),
        )
        .await;
    assert_eq!(c, 201, "{v}");
    // Progress as the DAG controller writes it.
    let mut st = v.clone();
    st["status"] = json!({"phase": "Running", "tasks": {
        "preprocess": {"phase": "Completed", "allocation": "pipe-preprocess"},
        "train": {"phase": "Running", "allocation": "pipe-train"},
    }});
    let (c, v) = s
        .put(&format!("{API}/namespaces/t1/dags/pipe/status"), &st)
        .await;
    assert_eq!(c, 200, "{v}");

    let (c, g) = s.get("/v1/dags/pipe/graph?tenant=t1").await;
    assert_eq!(c, 200, "{g}");
    assert_eq!(
        g,
        json!({
            "kind": "DagGraph",
            "dag": "pipe",
            "tenant": "t1",
            "phase": "Running",
            "nodes": [
                {"name": "preprocess", "allocation": "pipe-preprocess", "phase": "Completed"},
                {"name": "train", "allocation": "pipe-train", "phase": "Running"},
                {"name": "evaluate", "allocation": "pipe-evaluate", "phase": "Waiting"},
                {"name": "notify-failure", "allocation": "pipe-notify-failure", "phase": "Waiting"},
            ],
            "edges": [
                {"from": "preprocess", "to": "train", "condition": "success"},
                {"from": "train", "to": "evaluate", "condition": "success"},
                {"from": "train", "to": "notify-failure", "condition": "failure"},
                {"from": "evaluate", "to": "notify-failure", "condition": "failure"},
            ],
        })
    );
    // Without ?tenant=: found by name.
    let (c, g2) = s.get("/v1/dags/pipe/graph").await;
    assert_eq!((c, &g2), (200, &g));
    // Missing: 404 naming the DAG (and the tenant when given).
    for (path, want) in [
        (
            "/v1/dags/ghost/graph?tenant=t1",
            "DAG \"ghost\" not found in tenant \"t1\"",
        ),
        (
            "/v1/dags/pipe/graph?tenant=t2",
            "DAG \"pipe\" not found in tenant \"t2\"",
        ),
        ("/v1/dags/ghost/graph", "DAG \"ghost\" not found"),
    ] {
        let (c, e) = s.get(path).await;
        assert_eq!(
            (c, e["reason"].as_str()),
            (404, Some("NotFound")),
            "{path}: {e}"
        );
        assert_eq!(e["message"], want, "{path}");
    }
    assert_eq!(s.get("/v1/dags/pipe/graph?tenant=t1").await.0, 200);
    assert_eq!(
        s.client
            .post(s.url("/v1/dags/pipe/graph"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        405
    );
}

#[tokio::test]
async fn metrics_pass_promtool() {
    let s = start().await;
    s.post(&allocs("t1"), &alloc("a", "t1")).await;
    s.get(&allocs("t1")).await;
    s.get(&format!("{}/zz", allocs("t1"))).await;
    let mut w = s.watch(&format!("{}?watch=1", allocs("t1"))).await;
    w.next(Duration::from_secs(5)).await;
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("lattice_apiserver_watchers{kind=\"Allocation\"} 1"),
        "{text}"
    );
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not found; skipping the lint");
        return;
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn apply_merges_list_map_items_by_key() {
    let s = start().await;
    let path = format!("{API}/namespaces/t1/dags/pipe");
    let dag = |task: &str| {
        format!(
            "apiVersion: lattice.dev/v1alpha1\nkind: Dag\nmetadata: {{name: pipe, namespace: t1}}\nspec:\n  allocations:\n  - name: {task}\n    spec: {{entrypoint: /bin/true, lifecycle: {{walltime: 1h}}}}\n"
        )
    };
    let (c, v) = s.apply(&path, "team-a", false, &dag("prep")).await;
    assert_eq!(c, 201, "{v}");
    let (c, v) = s.apply(&path, "team-b", false, &dag("train")).await;
    assert_eq!(c, 200, "{v}");
    let names: Vec<&str> = v["spec"]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["prep", "train"], "{v}");
    let mf = v["metadata"]["managedFields"].as_array().unwrap();
    let b = mf.iter().find(|e| e["manager"] == "team-b").unwrap();
    assert!(
        b["fieldsV1"]["f:spec"]["f:allocations"]["k:{\"name\":\"train\"}"].is_object(),
        "{b}"
    );
    // team-a drops its task: only train remains
    let (c, v) = s
        .apply(
            &path,
            "team-a",
            false,
            "apiVersion: lattice.dev/v1alpha1\nkind: Dag\nmetadata: {name: pipe, namespace: t1}\n",
        )
        .await;
    assert_eq!(c, 200, "{v}");
    let names: Vec<&str> = v["spec"]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["train"]);
    // idempotent re-apply by team-b
    let (_, again) = s.apply(&path, "team-b", false, &dag("train")).await;
    assert_eq!(again, v);
}
