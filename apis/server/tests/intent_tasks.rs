//! `POST /v1/allocations/{id}/tasks`: a job step in a running allocation, as the seed's
//! Intent API names it (the CLI's `lattice launch` creates the same object).

mod common;
use common::*;

use std::time::Duration;

use lattice_apiserver::{mint_token, ApiConfig, Role};
use reqwest::Method;
use serde_json::json;

const SECRET: &[u8] = b"intent-tasks-secret";

#[tokio::test]
async fn tasks_create_numbered_steps_of_a_running_allocation() {
    let s = start_with(ApiConfig {
        jwt_secret: SECRET.to_vec(),
        auth: true,
        ..Default::default()
    })
    .await;
    let admin = mint_token(
        SECRET,
        "root",
        &["*".to_string()],
        Role::Admin,
        Duration::from_secs(300),
    );
    let alice = mint_token(
        SECRET,
        "alice",
        &["t1".to_string()],
        Role::User,
        Duration::from_secs(300),
    );
    let scheduler = mint_token(
        SECRET,
        "scheduler",
        &["*".to_string()],
        Role::System,
        Duration::from_secs(300),
    );
    let bob = mint_token(
        SECRET,
        "bob",
        &["t2".to_string()],
        Role::User,
        Duration::from_secs(300),
    );
    let (c, v) = call(
        &s,
        Method::POST,
        "/v1/allocations",
        &alice,
        Some(
            json!({"tenant": "t1", "name": "job", "entrypoint": "sleep 100",
                    "resources": {"nodes": 2}, "lifecycle": {"walltime": "1h"}}),
        ),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    // Running on two nodes (what the scheduler and agents would write).
    let status =
        json!({"status": {"phase": "Running", "assignedNodes": ["n1", "n2"], "attempt": 1}});
    let r = s
        .client
        .patch(s.url("/apis/lattice.dev/v1alpha1/namespaces/t1/allocations/job/status"))
        .bearer_auth(&scheduler)
        .header("content-type", "application/merge-patch+json")
        .body(status.to_string())
        .send()
        .await
        .expect("patch");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );

    let launch = json!({"command": ["hostname", "-s"], "ntasks": 4});
    let (c, step) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks",
        &alice,
        Some(launch.clone()),
    )
    .await;
    assert_eq!(c, 201, "{step}");
    assert_eq!(step["metadata"]["name"], "job.0");
    assert_eq!(step["spec"]["stepOf"], "job");
    assert_eq!(step["spec"]["resources"]["nodes"], 2);
    assert_eq!(step["metadata"]["annotations"]["lattice.dev/ntasks"], "4");
    assert_eq!(step["metadata"]["annotations"]["lattice.dev/user"], "alice");
    assert_eq!(step["metadata"]["labels"]["lattice.dev/step-of"], "job");
    assert_eq!(step["metadata"]["ownerReferences"][0]["name"], "job");
    // A step runs as its starter on the allocation's nodes: not even an admin starts one
    // in alice's allocation.
    let (c, e) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks?tenant=t1",
        &admin,
        Some(launch.clone()),
    )
    .await;
    assert_eq!(c, 403, "{e}");
    let (c, step) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks?tenant=t1",
        &alice,
        Some(launch),
    )
    .await;
    assert_eq!(c, 201, "{step}");
    assert_eq!(step["metadata"]["name"], "job.1", "numbers go up");
    assert_eq!(step["metadata"]["annotations"]["lattice.dev/user"], "alice");

    // Bad requests say why.
    let (c, e) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks",
        &alice,
        Some(json!({"command": ["true"], "nodes": 3})),
    )
    .await;
    assert_eq!(c, 400, "{e}");
    assert!(
        e["message"].as_str().unwrap_or("").contains("at most 2"),
        "{e}"
    );
    let (c, e) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks",
        &alice,
        Some(json!({"cmd": ["true"]})),
    )
    .await;
    assert_eq!(c, 400, "{e}");
    assert!(
        e["message"].as_str().unwrap_or("").contains("command"),
        "{e}"
    );
    // Another tenant's user cannot see it.
    let (c, _) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks",
        &bob,
        Some(json!({"command": ["true"]})),
    )
    .await;
    assert_eq!(c, 404);
    // A finished allocation takes no more steps.
    let r = s
        .client
        .patch(s.url("/apis/lattice.dev/v1alpha1/namespaces/t1/allocations/job/status"))
        .bearer_auth(&scheduler)
        .header("content-type", "application/merge-patch+json")
        .body(json!({"status": {"phase": "Completed"}}).to_string())
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status().as_u16(), 200);
    let (c, e) = call(
        &s,
        Method::POST,
        "/v1/allocations/job/tasks",
        &alice,
        Some(json!({"command": ["true"]})),
    )
    .await;
    assert_eq!(c, 400, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or("")
            .contains("needs a running allocation"),
        "{e}"
    );
}
