//! Scheduler extenders against a real store and the built-in scheduler: the example
//! extender (`controllers/runtime/examples/scheduler_extender.rs`, the same code) filters
//! and ranks; an extender that is down or slow follows its failure policy.

mod common;

#[path = "../../runtime/examples/scheduler_extender.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use common::*;
use lattice_apis::{AllocationPhase, Node, VCluster};
use lattice_runtime::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Serve `router` on a free local port; its URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}{}", example::PATH)
}

/// A URL nothing listens on.
async fn closed_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}/lattice/extender")
}

async fn vcluster_with(env: &Env, extender: serde_json::Value) {
    let v: VCluster = serde_json::from_value(json!({
        "metadata": {"name": "default", "namespace": "t1"},
        "spec": {"schedulerType": "hpc-backfill", "cycleInterval": "1s", "extenders": [extender]},
    }))
    .expect("vcluster");
    Api::<VCluster>::namespaced(env.client.clone(), "t1")
        .create(&PostParams::default(), &v)
        .await
        .expect("vcluster with an extender");
}

async fn label_node(env: &Env, node: &str, key: &str, value: &str) {
    Api::<Node>::all(env.client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .expect("label node");
}

async fn nodes(env: &Env, names: &[&str]) -> tokio::task::JoinHandle<()> {
    env.tenant("t1", None).await;
    for n in names {
        env.node(n, 0).await;
    }
    heartbeats(env, names)
}

fn reason(a: &lattice_apis::Allocation) -> (String, String) {
    let st = a.status.clone().unwrap_or_default();
    (
        st.reason.unwrap_or_default(),
        st.message.unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_extender_filters_nodes_and_ranks_the_queue() {
    let mut env = env().await;
    let _hb = nodes(&env, &["n1", "n2", "n3"]).await;
    label_node(&env, "n1", example::MAINTENANCE_LABEL, "true").await;
    label_node(&env, "n3", example::MAINTENANCE_LABEL, "true").await;
    let url = serve(example::router()).await;
    vcluster_with(
        &env,
        json!({"name": "maintenance", "url": url, "filter": true, "score": true, "weight": 1.0}),
    )
    .await;
    // Queued before the scheduler starts, "a-plain" first: without the extender's score
    // it would go first (same score, earlier submission, and first by name), and onto n1
    // (lowest node first) without its filter.
    env.submit("t1", "a-plain", 1, json!({})).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    env.submit(
        "t1",
        "b-boosted",
        1,
        json!({"metadata": {"labels": {example::BOOST_LABEL: "1"}}}),
    )
    .await;
    env.start_controllers(fast_config());
    let high = env
        .wait_phase("t1", "b-boosted", AllocationPhase::Staging)
        .await;
    let nodes = high.status.clone().unwrap_or_default().assigned_nodes;
    assert_eq!(nodes, ["n2"], "the only node not in maintenance");
    // n1 and n3 stay free while "a-plain" waits: the filter holds cycle after cycle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let low = env.get("t1", "a-plain").await;
    assert_eq!(low.phase(), AllocationPhase::Pending, "{:?}", reason(&low));
    let owners = env.owners().await;
    assert_eq!(owners["n1"], None);
    assert_eq!(owners["n3"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extender_that_is_down_is_ignored_with_policy_ignore() {
    let mut env = env().await;
    let _hb = nodes(&env, &["n1"]).await;
    let url = closed_url().await;
    vcluster_with(
        &env,
        json!({"name": "gone", "url": url, "filter": true, "failurePolicy": "ignore"}),
    )
    .await;
    env.start_controllers(fast_config());
    env.submit("t1", "a", 1, json!({})).await;
    env.wait_phase("t1", "a", AllocationPhase::Staging).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extender_that_is_down_keeps_jobs_pending_with_policy_fail() {
    let mut env = env().await;
    let _hb = nodes(&env, &["n1"]).await;
    let url = closed_url().await;
    vcluster_with(
        &env,
        json!({"name": "gone", "url": url, "filter": true, "failurePolicy": "fail"}),
    )
    .await;
    env.start_controllers(fast_config());
    env.submit("t1", "a", 1, json!({})).await;
    let a = env
        .wait_alloc("t1", "a", "extender reason", |a| {
            reason(a).0 == "extender_unavailable"
        })
        .await;
    let (_, msg) = reason(&a);
    assert!(
        msg.contains("\"gone\"") && msg.contains("failurePolicy: fail"),
        "{msg}"
    );
    assert_eq!(env.owners().await["n1"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_extender_times_out_and_its_policy_applies() {
    let mut env = env().await;
    let _hb = nodes(&env, &["n1"]).await;
    let slow = axum::Router::new().route(
        example::PATH,
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "{}"
        }),
    );
    let url = serve(slow).await;
    vcluster_with(
        &env,
        json!({"name": "slow", "url": url, "filter": true, "timeout": "200ms", "failurePolicy": "fail"}),
    )
    .await;
    env.start_controllers(fast_config());
    env.submit("t1", "a", 1, json!({})).await;
    let a = env
        .wait_alloc("t1", "a", "timeout reason", |a| {
            reason(a).0 == "extender_unavailable"
        })
        .await;
    let (_, msg) = reason(&a);
    assert!(msg.contains("no answer within 200 ms"), "{msg}");
}

/// The cost of one extender call on the 1,000 × 10,000 cycle (the size of
/// `hack/bench-scheduler.sh`'s `cycle_1000x10000`): a request of 1,000 jobs and 10,000
/// nodes to the example extender on loopback, answer read and applied. Prints a RESULT
/// line; run with `--release -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --release"]
async fn extender_call_cost_on_the_1000_x_10000_cycle() {
    use lattice_apis::extender::{ExtenderJob, ExtenderNode, ExtenderRequest};
    use lattice_apis::kinds::vcluster::Extender;
    use lattice_controllers::scheduler::extender;

    let url = serve(example::router()).await;
    let req = ExtenderRequest {
        vcluster: "t1/default".into(),
        filter: false,
        score: false,
        jobs: (0..1_000)
            .map(|i| ExtenderJob {
                name: format!("t1/job-{i}"),
                tenant: "t1".into(),
                nodes: 1 << (i % 7),
                labels: [(example::BOOST_LABEL.to_string(), format!("0.{}", i % 10))].into(),
                ..Default::default()
            })
            .collect(),
        nodes: (0..10_000)
            .map(|i| ExtenderNode {
                name: format!("node-{i:05}"),
                labels: [(
                    example::MAINTENANCE_LABEL.to_string(),
                    (i % 50 == 0).to_string(),
                )]
                .into(),
                gpus: 4,
                gpu_type: Some("H100".into()),
                group: i / 128,
                ..Default::default()
            })
            .collect(),
    };
    let all: Vec<String> = req.nodes.iter().map(|n| n.name.clone()).collect();
    let e = Extender {
        name: "maintenance".into(),
        url,
        filter: true,
        score: true,
        weight: Some(0.5),
        ..Default::default()
    };
    let http = extender::client();
    let metrics = lattice_controllers::SchedulerMetrics::new();
    let mut times = Vec::new();
    for _ in 0..9 {
        let t = std::time::Instant::now();
        let v = extender::consult(
            &http,
            &metrics,
            "t1/default",
            std::slice::from_ref(&e),
            &req,
            &all,
            1_000,
        )
        .await;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(v.filtered.len(), 200);
        assert!(v.blocked.is_none());
    }
    times.sort_by(f64::total_cmp);
    let bytes = serde_json::to_vec(&req).expect("json").len();
    println!(
        "RESULT extender_call_1000x10000_ms={:.2}",
        times[times.len() / 2]
    );
    println!("RESULT extender_request_1000x10000_bytes={bytes}");
}

/// A failed call is counted (calls and errors) whatever the policy; only `fail` blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_are_counted_and_only_fail_blocks() {
    use lattice_apis::extender::{ExtenderJob, ExtenderRequest};
    use lattice_apis::kinds::vcluster::{Extender, ExtenderFailurePolicy};
    use lattice_controllers::scheduler::extender;

    let url = closed_url().await;
    let req = ExtenderRequest {
        vcluster: "t1/default".into(),
        jobs: vec![ExtenderJob {
            name: "t1/a".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let http = extender::client();
    let metrics = lattice_controllers::SchedulerMetrics::new();
    let ignore = Extender {
        name: "ignored".into(),
        url: url.clone(),
        score: true,
        weight: Some(1.0),
        ..Default::default()
    };
    let fail = Extender {
        name: "required".into(),
        url,
        filter: true,
        failure_policy: Some(ExtenderFailurePolicy::Fail),
        ..Default::default()
    };
    let v = extender::consult(
        &http,
        &metrics,
        "t1/default",
        std::slice::from_ref(&ignore),
        &req,
        &[],
        1,
    )
    .await;
    assert!(v.blocked.is_none() && v.scores.is_empty() && v.filtered.is_empty());
    assert_eq!(metrics.extender_counts("t1/default", "ignored"), (1, 1));
    let v = extender::consult(&http, &metrics, "t1/default", &[ignore, fail], &req, &[], 1).await;
    let why = v.blocked.expect("fail blocks");
    assert!(why.contains("\"required\""), "{why}");
    assert_eq!(metrics.extender_counts("t1/default", "ignored"), (2, 2));
    assert_eq!(metrics.extender_counts("t1/default", "required"), (1, 1));
}
