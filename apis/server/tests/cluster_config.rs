//! Cluster settings (`/v1/admin/config`) and the seed's Intent API request shapes, against
//! the real HTTP server over an embedded store.

mod common;

use std::time::Duration;

use common::*;
use lattice_apiserver::{mint_token, ApiConfig, Role};
use reqwest::Method;
use serde_json::{json, Value};

const SETTING: &str = "/v1/admin/config/scheduling.max_dag_size";

fn chain(name: &str, n: usize) -> Value {
    let tasks: Vec<Value> = (0..n)
        .map(|i| {
            let mut t = json!({"name": format!("s{i}"),
                "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}});
            if i > 0 {
                t["dependsOn"] = json!([{"ref": format!("s{}", i - 1)}]);
            }
            t
        })
        .collect();
    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Dag",
           "metadata": {"name": name, "namespace": "t1"}, "spec": {"allocations": tasks}})
}

fn dags() -> String {
    "/apis/lattice.dev/v1alpha1/namespaces/t1/dags".to_string()
}

#[tokio::test]
async fn an_administrator_changes_the_dag_size_limit_while_the_server_runs() {
    let secret = b"cluster-config".to_vec();
    let s = start_with(ApiConfig {
        jwt_secret: secret.clone(),
        auth: true,
        max_dag_size: 5,
        ..Default::default()
    })
    .await;
    let tok = |role| {
        mint_token(
            &secret,
            "someone",
            &["t1".into()],
            role,
            Duration::from_secs(300),
        )
    };
    let admin = tok(Role::Admin);
    let user = tok(Role::User);

    // The server's flag while nothing is stored; any user may read it.
    let (c, v) = call(&s, Method::GET, SETTING, &user, None).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(
        (v["value"].as_u64(), v["source"].as_str()),
        (Some(5), Some("server")),
        "{v}"
    );
    assert!(
        v["description"].as_str().is_some_and(|d| d.contains("Dag")),
        "{v}"
    );
    let (c, _) = call(&s, Method::POST, &dags(), &admin, Some(chain("six", 6))).await;
    assert_eq!(c, 422);

    // Only administrators change it.
    let (c, e) = call(&s, Method::PUT, SETTING, &user, Some(json!({"value": 100}))).await;
    assert_eq!((c, e["reason"].as_str()), (403, Some("Forbidden")), "{e}");
    let (c, _) = call(&s, Method::DELETE, SETTING, &user, None).await;
    assert_eq!(c, 403);

    // Raised: a 6-step Dag is admitted at once, by this and any other API server.
    let (c, v) = call(&s, Method::PUT, SETTING, &admin, Some(json!({"value": 8}))).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(
        (v["value"].as_u64(), v["source"].as_str()),
        (Some(8), Some("cluster")),
        "{v}"
    );
    let (c, v) = call(&s, Method::POST, &dags(), &admin, Some(chain("six", 6))).await;
    assert_eq!(c, 201, "{v}");
    let (c, e) = call(&s, Method::POST, &dags(), &admin, Some(chain("nine", 9))).await;
    assert_eq!(c, 422, "{e}");
    let msg = e["details"]["causes"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(msg.contains("(9 allocations, limit: 8)"), "{e}");
    // Text from `lattice admin config set k=8` counts as the number.
    let (c, v) = call(
        &s,
        Method::PUT,
        SETTING,
        &admin,
        Some(json!({"value": "7"})),
    )
    .await;
    assert_eq!((c, v["value"].as_u64()), (200, Some(7)), "{v}");

    // Bad values and keys are refused, naming the fix; nothing changes.
    for bad in [
        json!(0),
        json!(-3),
        json!("lots"),
        json!(1.5),
        json!(1_000_000),
    ] {
        let (c, e) = call(
            &s,
            Method::PUT,
            SETTING,
            &admin,
            Some(json!({ "value": bad })),
        )
        .await;
        assert_eq!(
            (c, e["reason"].as_str()),
            (422, Some("Invalid")),
            "{bad}: {e}"
        );
        let m = e["message"].as_str().unwrap_or_default();
        assert!(m.contains("whole number of tasks from 1 to 100000"), "{m}");
        assert_eq!(e["details"]["causes"][0]["field"], "value", "{e}");
    }
    let (c, e) = call(&s, Method::PUT, SETTING, &admin, Some(json!({"valu": 3}))).await;
    assert_eq!(c, 400, "{e}");
    let (c, e) = call(
        &s,
        Method::PUT,
        "/v1/admin/config/scheduling.nope",
        &admin,
        Some(json!({"value": 3})),
    )
    .await;
    assert_eq!(c, 404, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("scheduling.max_dag_size"),
        "{e}"
    );
    let (c, v) = call(&s, Method::GET, SETTING, &user, None).await;
    assert_eq!((c, v["value"].as_u64()), (200, Some(7)), "{v}");

    // The list names every setting.
    let (c, l) = call(&s, Method::GET, "/v1/admin/config", &user, None).await;
    assert_eq!(c, 200, "{l}");
    assert_eq!(l["items"][0]["key"], "scheduling.max_dag_size", "{l}");

    // Reset: the flag again; the Dag admitted under the higher limit stays.
    let (c, v) = call(&s, Method::DELETE, SETTING, &admin, None).await;
    assert_eq!(
        (c, v["value"].as_u64(), v["source"].as_str()),
        (200, Some(5), Some("server")),
        "{v}"
    );
    let (c, _) = call(&s, Method::POST, &dags(), &admin, Some(chain("six-b", 6))).await;
    assert_eq!(c, 422);
    let (c, _) = call(&s, Method::GET, &format!("{}/six", dags()), &admin, None).await;
    assert_eq!(c, 200);
}

#[tokio::test]
async fn the_intent_api_takes_the_seeds_request_shapes() {
    let s = start().await;
    // A task group in the seed's form, wrapped in {"allocation": ...}.
    let (c, v) = s
        .post(
            "/v1/allocations",
            &json!({"allocation": {
                "tenant": "t1", "name": "sweep", "type": "task_group",
                "template": {"entrypoint": "/bin/true", "lifecycle": {"type": "bounded", "walltime": "1h"}},
                "range": {"start": 0, "end": 99}, "concurrency": 20
            }}),
        )
        .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["spec"]["taskGroup"]["range"], "0-99", "{v}");
    assert_eq!(v["spec"]["taskGroup"]["concurrency"], 20, "{v}");
    assert_eq!(v["spec"]["entrypoint"], "/bin/true", "{v}");

    // snake_case fields, lifecycle.preemption_class, data.mounts.
    let (c, v) = s
        .post(
            "/v1/allocations",
            &json!({"tenant": "t1", "name": "snake", "entrypoint": "/bin/true",
                    "resources": {"nodes": 1, "constraints": {"gpu_type": "GH200"}},
                    "lifecycle": {"type": "bounded", "walltime": "1h", "preemption_class": 3},
                    "tags": {"experiment_id": "run-42"}}),
        )
        .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["spec"]["preemptionClass"], 3, "{v}");
    assert_eq!(
        v["spec"]["resources"]["constraints"]["gpuType"], "GH200",
        "{v}"
    );
    assert_eq!(
        v["spec"]["tags"]["experiment_id"], "run-42",
        "user keys stay: {v}"
    );

    // A field that does not exist is reported with its path, not dropped.
    let (c, e) = s
        .post(
            "/v1/allocations",
            &json!({"tenant": "t1", "name": "typo", "entrypoint": "/bin/true", "walltime": "1h", "colour": "red"}),
        )
        .await;
    assert_eq!(c, 422, "{e}");
    assert!(e.to_string().contains("colour"), "{e}");

    // `tenant` and `name` beside the wrapper count; the inner ones win.
    let (c, v) = s
        .post(
            "/v1/allocations",
            &json!({"tenant": "t1", "allocation": {"name": "wrapped", "entrypoint": "/bin/true", "walltime": "1h"}}),
        )
        .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["metadata"]["name"], "wrapped", "{v}");

    // Given twice (short form and resource form): refused naming it, not one dropped.
    for (body, needle) in [
        (
            json!({"tenant": "t1", "name": "twice", "entrypoint": "/bin/true", "walltime": "1h",
                   "nodes": 2, "resources": {"nodes": 3}}),
            "nodes",
        ),
        (
            json!({"tenant": "t1", "name": "twice", "type": "task_group", "entrypoint": "/bin/true",
                   "template": {"entrypoint": "/bin/false", "walltime": "1h"}, "range": {"start": 0, "end": 3}}),
            "template",
        ),
        (
            json!({"tenant": "t1", "name": "twice", "type": "task_group", "entrypoint": "/bin/true",
                   "walltime": "1h", "range": {"start": "a", "end": 3}}),
            "range",
        ),
    ] {
        let (c, e) = s.post("/v1/allocations", &body).await;
        assert_eq!(c, 422, "{body}: {e}");
        assert!(e.to_string().contains(needle), "{needle}: {e}");
    }

    // The workflow.yaml short form as a DAG.
    let (c, v) = s
        .post(
            "/v1/dags",
            &json!({"tenant": "t1", "name": "wf", "allocations": [
                {"name": "pre", "entrypoint": "/bin/true", "nodes": 1, "walltime": "1h"},
                {"name": "train", "entrypoint": "/bin/true", "walltime": "2h",
                 "depends_on": [{"pre": "success"}]}
            ]}),
        )
        .await;
    assert_eq!(c, 201, "{v}");
    let tasks = &v["spec"]["allocations"];
    assert_eq!(tasks[0]["spec"]["resources"]["nodes"], 1, "{v}");
    assert_eq!(tasks[1]["spec"]["lifecycle"]["walltime"], "2h", "{v}");
    assert!(tasks[1]["dependsOn"].to_string().contains("pre"), "{v}");
}
