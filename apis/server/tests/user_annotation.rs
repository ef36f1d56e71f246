//! The `lattice.dev/user` annotation of Allocations and Dags names the submitting user
//! (the node agent runs the work as that Unix user): with authentication on, the server
//! fills it in for non-admins and refuses values naming someone else; admins may
//! impersonate; without authentication the client's value stands.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use lattice_apiserver::resources::{Resources, WriteOptions};
use lattice_apiserver::{mint_token, ApiConfig, Role};
use lattice_store::KvBackend;
use reqwest::Method;
use serde_json::{json, Value};

const SECRET: &[u8] = b"user-annotation-test-secret";
use lattice_apis::wellknown::USER_ANNOTATION as USER;

fn token(sub: &str, role: Role) -> String {
    let tenants = match role {
        Role::Admin => vec!["*".to_string()],
        _ => vec!["t1".to_string()],
    };
    mint_token(SECRET, sub, &tenants, role, Duration::from_secs(300))
}

async fn auth_server() -> TestServer {
    start_with(ApiConfig {
        jwt_secret: SECRET.to_vec(),
        auth: true,
        ..Default::default()
    })
    .await
}

/// One request with an optional bearer token and body (`ct` picks the patch type).
async fn call(
    s: &TestServer,
    method: Method,
    path: &str,
    token: Option<&str>,
    ct: &str,
    body: Option<String>,
) -> (u16, Value) {
    let mut r = s.client.request(method, s.url(path));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.header("content-type", ct).body(b);
    }
    let resp = r.send().await.expect("send");
    let code = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post(s: &TestServer, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    call(
        s,
        Method::POST,
        path,
        token,
        "application/json",
        Some(body.to_string()),
    )
    .await
}

async fn put(s: &TestServer, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    call(
        s,
        Method::PUT,
        path,
        token,
        "application/json",
        Some(body.to_string()),
    )
    .await
}

async fn patch(
    s: &TestServer,
    path: &str,
    token: Option<&str>,
    ct: &str,
    body: &Value,
) -> (u16, Value) {
    call(s, Method::PATCH, path, token, ct, Some(body.to_string())).await
}

async fn get(s: &TestServer, path: &str, token: Option<&str>) -> (u16, Value) {
    call(s, Method::GET, path, token, "", None).await
}

fn alloc_as(name: &str, user: Option<&str>) -> Value {
    let mut a = alloc(name, "t1");
    if let Some(u) = user {
        a["metadata"]["annotations"] = json!({USER: u});
    }
    a
}

fn dag_as(name: &str, user: Option<&str>) -> Value {
    let mut d = json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Dag",
        "metadata": {"name": name, "namespace": "t1"},
        "spec": {"allocations": [
            {"name": "s0", "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}}
        ]},
    });
    if let Some(u) = user {
        d["metadata"]["annotations"] = json!({USER: u});
    }
    d
}

fn dags() -> String {
    format!("{API}/namespaces/t1/dags")
}

fn user_of(v: &Value) -> &Value {
    &v["metadata"]["annotations"][USER]
}

/// 403 Forbidden whose message names the annotation, `parts` (values, users, the fix),
/// with the field in `details.causes`.
fn assert_forbidden(c: u16, e: &Value, parts: &[&str]) {
    assert_eq!((c, e["reason"].as_str()), (403, Some("Forbidden")), "{e}");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(r#"metadata.annotations["lattice.dev/user"]"#),
        "{msg}"
    );
    for p in parts {
        assert!(msg.contains(p), "{p:?} not in {msg}");
    }
    assert_eq!(
        e["details"]["causes"][0]["field"], "metadata.annotations[lattice.dev/user]",
        "{e}"
    );
}

#[tokio::test]
async fn non_admin_create_without_annotation_gets_it_stamped() {
    let s = auth_server().await;
    let alice = token("alice", Role::User);
    let (c, v) = post(&s, &allocs("t1"), Some(&alice), &alloc_as("a1", None)).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    let (_, g) = get(&s, &format!("{}/a1", allocs("t1")), Some(&alice)).await;
    assert_eq!(user_of(&g), "alice", "stored: {g}");
    // Other annotations are kept alongside; a null value is filled in too.
    let mut a = alloc_as("a2", None);
    a["metadata"]["annotations"] = json!({"lattice.dev/submit-dir": "/home/alice", USER: null});
    let (c, v) = post(&s, &allocs("t1"), Some(&alice), &a).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    assert_eq!(
        v["metadata"]["annotations"]["lattice.dev/submit-dir"],
        "/home/alice"
    );
    // Dags too.
    let (c, v) = post(&s, &dags(), Some(&alice), &dag_as("d1", None)).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    // The Intent API, in both body forms, goes through the same admission.
    let (c, v) = post(
        &s,
        "/v1/allocations",
        Some(&alice),
        &json!({"tenant": "t1", "name": "i1", "entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    let (c, v) = post(&s, "/v1/dags", Some(&alice), &dag_as("i2", None)).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    // Server-side apply creating the object: filled in, owned by no field manager, so
    // re-applying the same configuration keeps it.
    let cfg = alloc_as("ssa", None);
    let path = format!("{}/ssa?fieldManager=cli", allocs("t1"));
    let (c, v) = patch(
        &s,
        &path,
        Some(&alice),
        "application/apply-patch+yaml",
        &cfg,
    )
    .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    let mut cfg2 = cfg.clone();
    cfg2["metadata"]["labels"] = json!({"app": "demo", "v": "2"});
    let (c, v) = patch(
        &s,
        &path,
        Some(&alice),
        "application/apply-patch+yaml",
        &cfg2,
    )
    .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(user_of(&v), "alice");
    assert_eq!(v["metadata"]["labels"]["v"], "2");
    // Other kinds are not touched (an admin-only Tenant here).
    let ops = token("ops", Role::Admin);
    let tenant = json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "t9"}, "spec": {"quota": {}}});
    let (c, v) = post(&s, &format!("{API}/tenants"), Some(&ops), &tenant).await;
    assert_eq!(c, 201, "{v}");
    assert!(user_of(&v).is_null(), "{v}");
}

#[tokio::test]
async fn non_admin_create_as_another_user_is_forbidden() {
    let s = auth_server().await;
    let alice = token("alice", Role::User);
    let admin = token("ops", Role::Admin);
    let fix = r#"omit the annotation or set it to "alice""#;
    for who in ["bob", "root", ""] {
        let (c, e) = post(&s, &allocs("t1"), Some(&alice), &alloc_as("a1", Some(who))).await;
        assert_forbidden(c, &e, &[&format!("= {who:?}"), r#"user "alice""#, fix]);
    }
    let (c, _) = get(&s, &format!("{}/a1", allocs("t1")), Some(&admin)).await;
    assert_eq!(c, 404, "nothing was created");
    // The whole message, once.
    let (c, e) = post(
        &s,
        &allocs("t1"),
        Some(&alice),
        &alloc_as("a1", Some("bob")),
    )
    .await;
    assert_eq!(c, 403);
    assert_eq!(
        e["message"],
        r#"allocations.lattice.dev "a1" is forbidden: user "alice" cannot create it with metadata.annotations["lattice.dev/user"] = "bob": the annotation names the user the work runs as, and the server sets it from the authenticated identity ("alice"); omit the annotation or set it to "alice""#
    );
    // Every create path: dry run, Dags, server-side apply, the Intent API.
    let (c, e) = post(
        &s,
        &format!("{}?dryRun=All", allocs("t1")),
        Some(&alice),
        &alloc_as("a1", Some("bob")),
    )
    .await;
    assert_forbidden(c, &e, &[r#""bob""#, fix]);
    let (c, e) = post(&s, &dags(), Some(&alice), &dag_as("d1", Some("bob"))).await;
    assert_forbidden(c, &e, &[r#""bob""#, fix]);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"dags.lattice.dev "d1" is forbidden"#),
        "{e}"
    );
    let (c, e) = patch(
        &s,
        &format!("{}/ssa?fieldManager=cli", allocs("t1")),
        Some(&alice),
        "application/apply-patch+yaml",
        &alloc_as("ssa", Some("bob")),
    )
    .await;
    assert_forbidden(c, &e, &[r#""bob""#, fix]);
    let (c, e) = post(
        &s,
        "/v1/allocations",
        Some(&alice),
        &alloc_as("i1", Some("bob")),
    )
    .await;
    assert_forbidden(c, &e, &[r#""bob""#, fix]);
    let (c, e) = post(&s, "/v1/dags", Some(&alice), &dag_as("i2", Some("bob"))).await;
    assert_forbidden(c, &e, &[r#""bob""#, fix]);
    let (c, l) = get(&s, &format!("{API}/allocations"), Some(&admin)).await;
    assert_eq!(c, 200);
    assert_eq!(l["items"].as_array().map(Vec::len), Some(0), "{l}");
}

#[tokio::test]
async fn non_admin_create_with_own_name_works() {
    let s = auth_server().await;
    let alice = token("alice", Role::User);
    let (c, v) = post(
        &s,
        &allocs("t1"),
        Some(&alice),
        &alloc_as("a1", Some("alice")),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
    let (c, v) = post(&s, &dags(), Some(&alice), &dag_as("d1", Some("alice"))).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "alice");
}

/// Admins are people too: the work they submit runs as them, never as someone they
/// name, and what an object runs as never changes.
#[tokio::test]
async fn admins_cannot_submit_as_someone_else() {
    let s = auth_server().await;
    let ops = token("ops", Role::Admin);
    let (c, v) = post(&s, &allocs("t1"), Some(&ops), &alloc_as("a1", Some("bob"))).await;
    assert_forbidden(
        c,
        &v,
        &[r#"= "bob""#, r#"omit the annotation or set it to "ops""#],
    );
    let (c, v) = post(&s, &dags(), Some(&ops), &dag_as("d1", Some("bob"))).await;
    assert_eq!(c, 403, "{v}");
    // A named admin who names nobody submits as themselves.
    let (c, v) = post(&s, &allocs("t1"), Some(&ops), &alloc_as("a2", None)).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "ops");
    // ... and cannot change it later.
    let (c, v) = patch(
        &s,
        &format!("{}/a2", allocs("t1")),
        Some(&ops),
        "application/merge-patch+json",
        &json!({"metadata": {"annotations": {USER: "carol"}}}),
    )
    .await;
    assert_forbidden(c, &v, &[r#"from "ops" to "carol""#]);
}

#[tokio::test]
async fn non_admin_update_changing_it_is_forbidden() {
    let s = auth_server().await;
    let alice = token("alice", Role::User);
    let ops = token("ops", Role::Admin);
    let path = format!("{}/a1", allocs("t1"));
    let (c, created) = post(&s, &allocs("t1"), Some(&alice), &alloc_as("a1", None)).await;
    assert_eq!(c, 201, "{created}");
    let keep = r#"keep it as "alice""#;

    // PUT with another value.
    let mut o = created.clone();
    o["metadata"]["annotations"][USER] = json!("bob");
    let (c, e) = put(&s, &path, Some(&alice), &o).await;
    assert_forbidden(
        c,
        &e,
        &[r#"from "alice" to "bob""#, r#"user "alice""#, keep],
    );
    assert_eq!(
        e["message"],
        r#"allocations.lattice.dev "a1" is forbidden: user "alice" cannot change metadata.annotations["lattice.dev/user"] from "alice" to "bob": the annotation names the user the work runs as, set from the identity that created it, and nobody changes it; keep it as "alice""#
    );
    // PUT without it: a removal.
    let mut o = created.clone();
    o["metadata"]["annotations"] = json!({});
    let (c, e) = put(&s, &path, Some(&alice), &o).await;
    assert_forbidden(c, &e, &["remove", keep]);
    // Merge patch: change, and remove with null.
    let merge = "application/merge-patch+json";
    let (c, e) = patch(
        &s,
        &path,
        Some(&alice),
        merge,
        &json!({"metadata": {"annotations": {USER: "root"}}}),
    )
    .await;
    assert_forbidden(c, &e, &[r#"to "root""#, keep]);
    let (c, e) = patch(
        &s,
        &path,
        Some(&alice),
        merge,
        &json!({"metadata": {"annotations": {USER: null}}}),
    )
    .await;
    assert_forbidden(c, &e, &["remove", keep]);
    let (c, e) = patch(
        &s,
        &path,
        Some(&alice),
        merge,
        &json!({"metadata": {"annotations": null}}),
    )
    .await;
    assert_forbidden(c, &e, &["remove", keep]);
    // JSON patch.
    let (c, e) = patch(
        &s,
        &path,
        Some(&alice),
        "application/json-patch+json",
        &json!([{"op": "replace", "path": "/metadata/annotations/lattice.dev~1user", "value": "bob"}]),
    )
    .await;
    assert_forbidden(c, &e, &[r#"to "bob""#, keep]);
    // Server-side apply, even forced.
    let (c, e) = patch(
        &s,
        &format!("{path}?fieldManager=cli&force=true"),
        Some(&alice),
        "application/apply-patch+yaml",
        &alloc_as("a1", Some("bob")),
    )
    .await;
    assert_forbidden(c, &e, &[r#"to "bob""#, keep]);
    let (_, g) = get(&s, &path, Some(&alice)).await;
    assert_eq!(user_of(&g), "alice", "unchanged: {g}");

    // Writes that leave it alone still work: a label, a PUT of what was read, the
    // Intent API's cancel.
    let (c, v) = patch(
        &s,
        &path,
        Some(&alice),
        merge,
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(user_of(&v), "alice");
    let (c, v) = put(&s, &path, Some(&alice), &v).await;
    assert_eq!(c, 200, "{v}");
    let (c, v) = call(
        &s,
        Method::DELETE,
        "/v1/allocations/a1",
        Some(&alice),
        "",
        None,
    )
    .await;
    assert_eq!(c, 202, "{v}");
    assert_eq!(user_of(&v), "alice");

    // Dags too.
    let (c, d) = post(&s, &dags(), Some(&alice), &dag_as("d1", None)).await;
    assert_eq!(c, 201, "{d}");
    let (c, e) = patch(
        &s,
        &format!("{}/d1", dags()),
        Some(&alice),
        merge,
        &json!({"metadata": {"annotations": {USER: "bob"}}}),
    )
    .await;
    assert_forbidden(c, &e, &[r#"to "bob""#, keep]);

    // An object that names no user (created by the anonymous admin or in process):
    // a non-admin may not claim it for anyone, themselves included.
    let res = Resources::new(Arc::new(s.store.clone()) as Arc<dyn KvBackend>);
    res.create(
        lattice_apis::kinds()
            .iter()
            .find(|k| k.kind == "Allocation")
            .unwrap(),
        Some("t1"),
        alloc_as("nobody", None),
        &WriteOptions::default(),
        false,
    )
    .await
    .unwrap();
    let (c, e) = patch(
        &s,
        &format!("{}/nobody", allocs("t1")),
        Some(&alice),
        merge,
        &json!({"metadata": {"annotations": {USER: "alice"}}}),
    )
    .await;
    assert_forbidden(
        c,
        &e,
        &["on an object that names no user", "leave it unset"],
    );

    // Nor may an admin.
    let (c, v) = patch(
        &s,
        &path,
        Some(&ops),
        merge,
        &json!({"metadata": {"annotations": {USER: "bob"}}}),
    )
    .await;
    assert_forbidden(c, &v, &[r#"from "alice" to "bob""#, keep]);
}

#[tokio::test]
async fn auth_off_keeps_the_client_value() {
    // `lattice-server --dev`-style: no authentication, everyone is the anonymous admin.
    let s = start().await;
    let (c, v) = s.post(&allocs("t1"), &alloc_as("a1", Some("bob"))).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "bob");
    let (c, v) = s.post(&allocs("t1"), &alloc_as("a2", None)).await;
    assert_eq!(c, 201, "{v}");
    assert!(v["metadata"]["annotations"].get(USER).is_none(), "{v}");
    let (c, v) = s.post(&dags(), &dag_as("d1", Some("carol"))).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(user_of(&v), "carol");
    let (c, v) = s
        .patch(
            &format!("{}/a1", allocs("t1")),
            "application/merge-patch+json",
            r#"{"metadata": {"annotations": {"lattice.dev/user": "dave"}}}"#,
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(user_of(&v), "dave");
    // An authenticated server's request without a token is still a 401, not anonymous.
    let a = auth_server().await;
    let (c, _) = post(&a, &allocs("t1"), None, &alloc_as("x", Some("bob"))).await;
    assert_eq!(c, 401);
}

#[tokio::test]
async fn in_process_writes_are_trusted() {
    // The built-in controllers (the DAG controller copying a Dag's user onto its step
    // allocations) call `Resources` in process, outside any HTTP request.
    let s = auth_server().await;
    let res = Resources::new(Arc::new(s.store.clone()) as Arc<dyn KvBackend>);
    let kind = lattice_apis::kinds()
        .iter()
        .find(|k| k.kind == "Allocation")
        .unwrap();
    let v = res
        .create(
            kind,
            Some("t1"),
            alloc_as("step", Some("bob")),
            &WriteOptions::default(),
            false,
        )
        .await
        .unwrap();
    assert_eq!(user_of(&v), "bob");
    // The same verbs on behalf of a caller apply the caller's rules.
    let alice = lattice_apiserver::UserInfo {
        name: "alice".into(),
        tenants: Some(vec!["t1".into()]),
        role: Role::User,
        ..Default::default()
    };
    let e = res
        .acting_as(&alice)
        .create(
            kind,
            Some("t1"),
            alloc_as("step2", Some("bob")),
            &WriteOptions::default(),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, 403, "{e}");
    let v = res
        .acting_as(&alice)
        .create(
            kind,
            Some("t1"),
            alloc_as("step3", None),
            &WriteOptions::default(),
            false,
        )
        .await
        .unwrap();
    assert_eq!(user_of(&v), "alice");
}

#[tokio::test]
async fn a_non_admin_may_not_change_or_delete_another_users_work() {
    let s = auth_server().await;
    let alice = token("alice", Role::User);
    let bob = token("bob", Role::User);
    let admin = token("root", Role::Admin);
    let (c, v) = post(&s, &allocs("t1"), Some(&bob), &alloc_as("bobs", None)).await;
    assert_eq!(c, 201, "{v}");
    let path = format!("{}/bobs", allocs("t1"));
    // Alice would run her command as bob.
    let (c, e) = patch(
        &s,
        &path,
        Some(&alice),
        "application/merge-patch+json",
        &json!({"spec": {"entrypoint": "/bin/echo pwned"}}),
    )
    .await;
    assert_forbidden(c, &e, &["belongs to user \"bob\"", "\"alice\""]);
    let (c, e) = call(&s, Method::DELETE, &path, Some(&alice), "", None).await;
    assert_forbidden(c, &e, &["belongs to user \"bob\""]);
    // Bob and an admin may.
    let (c, v) = patch(
        &s,
        &path,
        Some(&bob),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await;
    assert_eq!(c, 200, "{v}");
    let (c, v) = call(&s, Method::DELETE, &path, Some(&admin), "", None).await;
    assert!(c == 200 || c == 202, "{c} {v}");
}
