//! The Intent API's by-name lookups (`GET /v1/dags/{id}`, `/v1/dags/{id}/graph`,
//! `/v1/allocations/{id}`) under JWT auth with two tenants: without `?tenant=` only the
//! tenants the caller may read are searched.

mod common;
use common::*;

use std::time::Duration;

use lattice_apiserver::{mint_token, ApiConfig, Role};
use reqwest::Method;
use serde_json::{json, Value};

const SECRET: &[u8] = b"intent-tenants-secret";

fn token(role: Role, tenants: &[&str]) -> String {
    let t: Vec<String> = tenants.iter().map(|s| s.to_string()).collect();
    mint_token(SECRET, "someone", &t, role, Duration::from_secs(300))
}

fn dag(name: &str, first_step: &str) -> Value {
    let step = |n: &str, deps: Value| json!({"name": n, "dependsOn": deps, "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}});
    json!({"name": name, "allocations": [
        step(first_step, json!([])),
        step("train", json!([{"ref": first_step, "condition": "success"}])),
    ]})
}

/// `pipe` in t1 (steps prep -> train) and in t2 (steps fetch -> train); `only1` in t1.
async fn two_tenants() -> (TestServer, String) {
    let s = start_with(ApiConfig {
        jwt_secret: SECRET.to_vec(),
        auth: true,
        ..Default::default()
    })
    .await;
    let admin = token(Role::Admin, &["*"]);
    for (tenant, name, first) in [
        ("t1", "pipe", "prep"),
        ("t2", "pipe", "fetch"),
        ("t1", "only1", "prep"),
    ] {
        let (c, v) = call(
            &s,
            Method::POST,
            &format!("/v1/dags?tenant={tenant}"),
            &admin,
            Some(dag(name, first)),
        )
        .await;
        assert_eq!(c, 201, "{v}");
    }
    for (tenant, name) in [("t1", "job"), ("t2", "job")] {
        let (c, v) = call(
            &s,
            Method::POST,
            "/v1/allocations",
            &admin,
            Some(json!({"tenant": tenant, "name": name, "entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}})),
        )
        .await;
        assert_eq!(c, 201, "{v}");
    }
    (s, admin)
}

#[tokio::test]
async fn dag_by_name_is_looked_up_in_the_callers_tenants_only() {
    let (s, _) = two_tenants().await;
    // A member of t2 gets t2's `pipe`, not a 403 for (or a view of) t1's.
    let t2 = token(Role::User, &["t2"]);
    let (c, v) = call(&s, Method::GET, "/v1/dags/pipe", &t2, None).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["namespace"], "t2");
    let (c, g) = call(&s, Method::GET, "/v1/dags/pipe/graph", &t2, None).await;
    assert_eq!(c, 200, "{g}");
    assert_eq!(
        (g["tenant"].as_str(), g["nodes"][0]["name"].as_str()),
        (Some("t2"), Some("fetch"))
    );
    // The same for t1's members, and for the readonly role.
    for tok in [token(Role::User, &["t1"]), token(Role::Readonly, &["t1"])] {
        let (c, g) = call(&s, Method::GET, "/v1/dags/pipe/graph", &tok, None).await;
        assert_eq!(c, 200, "{g}");
        assert_eq!(
            (g["tenant"].as_str(), g["nodes"][0]["name"].as_str()),
            (Some("t1"), Some("prep"))
        );
    }
    // A DAG only another tenant has: 404, as if it did not exist (no 403, no tenant named).
    let (c, e) = call(&s, Method::GET, "/v1/dags/only1", &t2, None).await;
    assert_eq!((c, e["reason"].as_str()), (404, Some("NotFound")), "{e}");
    assert!(
        !e["message"].as_str().unwrap_or_default().contains("t1"),
        "{e}"
    );
    let (c, e) = call(&s, Method::GET, "/v1/dags/only1/graph", &t2, None).await;
    assert_eq!(
        (c, e["message"].as_str()),
        (404, Some("DAG \"only1\" not found")),
        "{e}"
    );
    // Naming another tenant explicitly is refused before looking: 403 whether or not it exists.
    for path in [
        "/v1/dags/pipe?tenant=t1",
        "/v1/dags/ghost?tenant=t1",
        "/v1/dags/pipe/graph?tenant=t1",
    ] {
        let (c, e) = call(&s, Method::GET, path, &t2, None).await;
        assert_eq!(
            (c, e["reason"].as_str()),
            (403, Some("Forbidden")),
            "{path}: {e}"
        );
    }
    // ?tenant= on the item route works like on the graph route.
    let (c, v) = call(&s, Method::GET, "/v1/dags/pipe?tenant=t2", &t2, None).await;
    assert_eq!(
        (c, v["metadata"]["namespace"].as_str()),
        (200, Some("t2")),
        "{v}"
    );
}

#[tokio::test]
async fn dag_name_in_several_readable_tenants_asks_for_the_tenant() {
    let (s, admin) = two_tenants().await;
    for tok in [admin.clone(), token(Role::User, &["t1", "t2"])] {
        for path in ["/v1/dags/pipe", "/v1/dags/pipe/graph"] {
            let (c, e) = call(&s, Method::GET, path, &tok, None).await;
            assert_eq!(
                (c, e["reason"].as_str()),
                (409, Some("Conflict")),
                "{path}: {e}"
            );
            let m = e["message"].as_str().unwrap_or_default();
            assert!(
                m.contains("?tenant=") && m.contains("t1, t2"),
                "{path}: {m}"
            );
        }
        // Naming the tenant picks one.
        let (c, g) = call(&s, Method::GET, "/v1/dags/pipe/graph?tenant=t2", &tok, None).await;
        assert_eq!((c, g["tenant"].as_str()), (200, Some("t2")), "{g}");
        let (c, v) = call(&s, Method::GET, "/v1/dags/pipe?tenant=t1", &tok, None).await;
        assert_eq!(
            (c, v["metadata"]["namespace"].as_str()),
            (200, Some("t1")),
            "{v}"
        );
        // A name only one tenant has needs no tenant.
        let (c, v) = call(&s, Method::GET, "/v1/dags/only1", &tok, None).await;
        assert_eq!(
            (c, v["metadata"]["namespace"].as_str()),
            (200, Some("t1")),
            "{v}"
        );
    }
}

#[tokio::test]
async fn cancel_and_allocation_lookups_stay_in_the_callers_tenants() {
    let (s, admin) = two_tenants().await;
    let t2 = token(Role::User, &["t2"]);
    let (c, v) = call(&s, Method::GET, "/v1/allocations/job", &t2, None).await;
    assert_eq!(
        (c, v["metadata"]["namespace"].as_str()),
        (200, Some("t2")),
        "{v}"
    );
    // DELETE (cancel) by name reaches t2's DAG; t1's is untouched.
    let (c, v) = call(&s, Method::DELETE, "/v1/dags/pipe", &t2, None).await;
    assert_eq!(
        (c, v["metadata"]["namespace"].as_str()),
        (202, Some("t2")),
        "{v}"
    );
    let cancelled =
        |v: &Value| v["metadata"]["annotations"]["lattice.dev/cancel-requested"] == "true";
    let (_, v1) = call(&s, Method::GET, "/v1/dags/pipe?tenant=t1", &admin, None).await;
    let (_, v2) = call(&s, Method::GET, "/v1/dags/pipe?tenant=t2", &admin, None).await;
    assert!(!cancelled(&v1), "{v1}");
    assert!(cancelled(&v2), "{v2}");
    // The readonly role finds it but may not cancel it.
    let ro = token(Role::Readonly, &["t1"]);
    let (c, e) = call(&s, Method::DELETE, "/v1/dags/pipe", &ro, None).await;
    assert_eq!((c, e["reason"].as_str()), (403, Some("Forbidden")), "{e}");
    // Another tenant's allocation is not found by name.
    let (c, _) = call(
        &s,
        Method::DELETE,
        "/v1/allocations/job",
        &token(Role::User, &["t3"]),
        None,
    )
    .await;
    assert_eq!(c, 404);
}
