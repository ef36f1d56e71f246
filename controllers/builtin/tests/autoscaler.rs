//! The autoscaler against a real store (decisions only: the scheduler's placement of a
//! scale-up is simulated by appending to `status.assignedNodes`), and
//! `PrometheusSource` against a tiny in-test HTTP server.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use lattice_apis::{Allocation, AllocationPhase};
use lattice_controllers::autoscaler::{
    self, AutoscalerConfig, MetricSource, PrometheusSource, NO_SOURCE_MESSAGE,
};
use lattice_controllers::ControllerMetrics;
use lattice_runtime::{AlwaysLeader, ControllerHost, PostParams, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TENANT: &str = "ml";

/// A metric source whose answer the test sets; records what it was asked.
#[derive(Default)]
struct FakeSource {
    answer: Mutex<Option<Result<f64, String>>>,
    asked: Mutex<Vec<(String, String, String)>>,
}

impl FakeSource {
    fn set(&self, r: Result<f64, String>) {
        *self.answer.lock().unwrap() = Some(r);
    }
}

#[async_trait]
impl MetricSource for FakeSource {
    async fn query(&self, alloc: &Allocation, metric: &str) -> Result<f64, String> {
        self.asked.lock().unwrap().push((
            alloc.namespace().unwrap_or_default().to_string(),
            alloc.name_any().to_string(),
            metric.to_string(),
        ));
        self.answer
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| Err("no answer set".into()))
    }
}

/// Aborts the host task when dropped.
struct HostTask(tokio::task::JoinHandle<()>);

impl Drop for HostTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Only the autoscaler, on the test's store.
fn start_autoscaler(env: &Env, source: Arc<FakeSource>) -> HostTask {
    let mut host = ControllerHost::new(
        lattice_apiserver::in_process::client(env.backend.clone()),
        Arc::new(AlwaysLeader::new()),
    );
    autoscaler::register(
        &mut host,
        AutoscalerConfig::with_source(source),
        ControllerMetrics::new(),
    );
    HostTask(tokio::spawn(host.run(std::future::pending())))
}

/// A Running reactive allocation on `nodes` (min 1, max 4, 1 s windows and cooldown).
async fn running_reactive(env: &Env, name: &str, nodes: &[&str]) {
    running_reactive_with(env, name, nodes, json!({})).await
}

/// Like [`running_reactive`] with `policy` merged into the scale policy.
async fn running_reactive_with(env: &Env, name: &str, nodes: &[&str], policy: serde_json::Value) {
    let mut v = json!({
        "metadata": {"name": name, "namespace": TENANT},
        "spec": {
            "entrypoint": "/srv/serve",
            "resources": {"nodes": nodes.len()},
            "lifecycle": {"type": "reactive", "scalePolicy": {
                "minNodes": 1, "maxNodes": 4,
                "metric": "gpu_utilization", "target": 0.8,
                "cooldown": "1s", "evaluationInterval": "1s",
                "scaleUpWindow": "1s", "scaleDownWindow": "1s",
            }},
        },
    });
    merge(&mut v["spec"]["lifecycle"]["scalePolicy"], policy);
    let a: Allocation = serde_json::from_value(v).expect("allocation");
    env.allocations(TENANT)
        .create(&PostParams::default(), &a)
        .await
        .expect("create");
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    env.allocations(TENANT)
        .update_status_with_retry(name, 20, |a| {
            let st = a.status.get_or_insert_with(Default::default);
            st.phase = AllocationPhase::Running;
            st.attempt = 1;
            st.assigned_nodes = nodes.clone();
            st.start_time = Some(lattice_apis::meta::now());
            for n in &nodes {
                st.node_states.insert(n.clone(), running_report());
            }
            true
        })
        .await
        .expect("running");
}

fn desired(a: &Allocation) -> Option<u32> {
    a.status.as_ref()?.scale.as_ref().map(|s| s.desired_nodes)
}

fn message(a: &Allocation) -> String {
    a.status
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

fn assigned(a: &Allocation) -> Vec<String> {
    a.status
        .as_ref()
        .map(|s| s.assigned_nodes.clone())
        .unwrap_or_default()
}

fn releasing(a: &Allocation) -> Vec<String> {
    a.status
        .as_ref()
        .map(|s| s.releasing_nodes.clone())
        .unwrap_or_default()
}

/// The agent's report for a node where the process runs (attempt 1).
fn running_report() -> lattice_apis::NodeTaskState {
    lattice_apis::NodeTaskState {
        phase: lattice_apis::NodeTaskPhase::Running,
        attempt: 1,
        ..Default::default()
    }
}

/// What the scheduler does when it places a scale-up: append the node (and what its
/// agent then reports: the process runs).
async fn place(env: &Env, name: &str, node: &str) {
    env.allocations(TENANT)
        .update_status_with_retry(name, 20, |a| {
            let st = a.status.as_mut().expect("status");
            st.assigned_nodes.push(node.to_string());
            st.node_states.insert(node.to_string(), running_report());
            true
        })
        .await
        .expect("place");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_scales_up_on_a_high_metric_and_gives_back_the_last_node_on_a_low_one() {
    let env = env().await;
    env.tenant(TENANT, None).await;
    let source = Arc::new(FakeSource::default());
    source.set(Ok(0.95));
    let _host = start_autoscaler(&env, source.clone());
    running_reactive(&env, "svc", &["n1", "n2"]).await;

    let a = env
        .wait_alloc(TENANT, "svc", "desiredNodes 3", |a| desired(a) == Some(3))
        .await;
    assert!(
        message(&a).starts_with("scaling up to 3: gpu_utilization=0.95 above target 0.8 for 1s"),
        "{}",
        message(&a)
    );
    let scale = a.status.as_ref().unwrap().scale.clone().unwrap();
    assert_eq!(scale.last_value, Some(0.95));
    assert!(scale.last_scale_time.is_some() && scale.last_evaluation_time.is_some());
    assert_eq!(scale.metric_failures, 0);
    // The autoscaler only asks: placing is the scheduler's.
    assert_eq!(assigned(&a), ["n1", "n2"]);
    assert!(releasing(&a).is_empty());
    assert!(source
        .asked
        .lock()
        .unwrap()
        .iter()
        .all(|q| q == &(TENANT.into(), "svc".into(), "gpu_utilization".into())));

    source.set(Ok(0.1));
    let a = env
        .wait_alloc(TENANT, "svc", "a node given back", |a| {
            !releasing(a).is_empty()
        })
        .await;
    assert_eq!(assigned(&a), ["n1"]);
    assert_eq!(releasing(&a), ["n2"]);
    assert_eq!(desired(&a), Some(1));
    assert!(
        message(&a).starts_with("scaling down to 1: gpu_utilization=0.1 below 0.4"),
        "{}",
        message(&a)
    );
    // At minNodes: nothing more is given back.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = env.get(TENANT, "svc").await;
    assert_eq!(assigned(&a), ["n1"]);
    assert_eq!(releasing(&a), ["n2"]);
    assert_eq!(desired(&a), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_waits_for_placement_stops_at_the_bounds_and_never_scales_blindly() {
    let env = env().await;
    env.tenant(TENANT, None).await;
    let source = Arc::new(FakeSource::default());
    source.set(Err("tsdb down".into()));
    let _host = start_autoscaler(&env, source.clone());
    running_reactive(&env, "svc", &["n1", "n2"]).await;

    // Failing queries: counted, first sight recorded, no decision.
    let a = env
        .wait_alloc(TENANT, "svc", "3 metric failures", |a| {
            a.status
                .as_ref()
                .and_then(|s| s.scale.as_ref())
                .is_some_and(|s| s.metric_failures >= 3)
        })
        .await;
    assert_eq!(desired(&a), Some(2));
    assert_eq!(message(&a), "");
    let scale = a.status.as_ref().unwrap().scale.clone().unwrap();
    assert_eq!(scale.last_value, None);
    assert_eq!(scale.last_scale_time, None);

    // Recovery resets the count; a high value asks for a third node.
    source.set(Ok(0.9));
    let a = env
        .wait_alloc(TENANT, "svc", "desiredNodes 3", |a| desired(a) == Some(3))
        .await;
    assert_eq!(
        a.status
            .as_ref()
            .unwrap()
            .scale
            .as_ref()
            .unwrap()
            .metric_failures,
        0
    );

    // The scheduler cannot place it (quota) and says so: the autoscaler neither asks
    // for a fourth node nor overwrites the scheduler's message.
    let quota = "scale-up to 3 waits: tenant ml is at its max_nodes quota";
    env.allocations(TENANT)
        .update_status_with_retry("svc", 20, |a| {
            a.status.as_mut().unwrap().scale.as_mut().unwrap().message = Some(quota.into());
            true
        })
        .await
        .expect("scheduler message");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = env.get(TENANT, "svc").await;
    assert_eq!(desired(&a), Some(3));
    assert_eq!(message(&a), quota);

    // Placed: the next one, then maxNodes (4) holds.
    place(&env, "svc", "n3").await;
    env.wait_alloc(TENANT, "svc", "desiredNodes 4", |a| desired(a) == Some(4))
        .await;
    place(&env, "svc", "n4").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = env.get(TENANT, "svc").await;
    assert_eq!(desired(&a), Some(4));
    assert_eq!(assigned(&a), ["n1", "n2", "n3", "n4"]);

    // A metric outage while the value would be low: nothing is given back.
    source.set(Err("tsdb down".into()));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = env.get(TENANT, "svc").await;
    assert_eq!(assigned(&a), ["n1", "n2", "n3", "n4"]);
    assert!(releasing(&a).is_empty());

    // Low: most recently added first, one at a time, down to minNodes (1).
    source.set(Ok(0.0));
    let a = env
        .wait_alloc(TENANT, "svc", "n4 given back", |a| !releasing(a).is_empty())
        .await;
    assert_eq!(releasing(&a), ["n4"]);
    assert_eq!(assigned(&a), ["n1", "n2", "n3"]);
    assert_eq!(desired(&a), Some(3));
    let a = env
        .wait_alloc(TENANT, "svc", "down to minNodes", |a| {
            assigned(a).len() == 1
        })
        .await;
    assert_eq!(releasing(&a), ["n4", "n3", "n2"]);
    assert_eq!(desired(&a), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_without_a_metric_source_only_says_so() {
    let mut env = env().await;
    env.tenant(TENANT, None).await;
    // Every built-in controller, the default Config: no metric source.
    env.start_controllers(fast_config());
    running_reactive(&env, "svc", &["n1", "n2"]).await;
    let a = env
        .wait_alloc(TENANT, "svc", "the no-source message", |a| {
            message(a) == NO_SOURCE_MESSAGE
        })
        .await;
    assert_eq!(desired(&a), Some(2));
    let rv = a.metadata.resource_version.clone();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b = env.get(TENANT, "svc").await;
    let scale = b.status.as_ref().unwrap().scale.clone().unwrap();
    assert_eq!(scale.last_value, None);
    assert_eq!(scale.last_evaluation_time, None);
    assert_eq!(scale.desired_nodes, 2);
    assert_eq!(assigned(&b), ["n1", "n2"]);
    assert!(releasing(&b).is_empty());
    // Written once: nothing was written since.
    assert_eq!(b.metadata.resource_version, rv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_with_a_metric_source_in_config_scales() {
    let mut env = env().await;
    env.tenant(TENANT, None).await;
    let source = Arc::new(FakeSource::default());
    source.set(Ok(2.0));
    env.start_controllers(lattice_controllers::Config {
        autoscaler: AutoscalerConfig::with_source(source.clone()),
        ..fast_config()
    });
    running_reactive(&env, "svc", &["n1", "n2"]).await;
    let a = env
        .wait_alloc(TENANT, "svc", "desiredNodes 3", |a| desired(a) == Some(3))
        .await;
    assert!(
        message(&a).starts_with("scaling up to 3"),
        "{}",
        message(&a)
    );
    assert!(!source.asked.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_explains_an_unparseable_target_and_does_not_scale() {
    let env = env().await;
    env.tenant(TENANT, None).await;
    let source = Arc::new(FakeSource::default());
    source.set(Ok(100.0));
    let _host = start_autoscaler(&env, source.clone());
    running_reactive_with(&env, "svc", &["n1", "n2"], json!({"target": "fast"})).await;
    let a = env
        .wait_alloc(TENANT, "svc", "the target explained", |a| {
            message(a).contains("not scaling")
        })
        .await;
    assert!(message(&a).contains("\"fast\""), "{}", message(&a));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b = env.get(TENANT, "svc").await;
    assert_eq!(desired(&b), Some(2));
    assert_eq!(b.metadata.resource_version, a.metadata.resource_version);
    assert!(source.asked.lock().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// PrometheusSource against a canned /api/v1/query
// ---------------------------------------------------------------------------------------

/// A one-request-per-connection HTTP server: answers each request with the next canned
/// `(status, body)` (`None`: never answer) and records the request targets.
struct CannedServer {
    base: String,
    targets: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CannedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn canned(responses: Vec<Option<(u16, &'static str)>>) -> CannedServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let targets = Arc::new(Mutex::new(Vec::new()));
    let seen = targets.clone();
    let mut responses: VecDeque<_> = responses.into();
    let task = tokio::spawn(async move {
        let mut parked = Vec::new();
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).to_string();
            let line = head.lines().next().unwrap_or_default().to_string();
            let mut parts = line.split(' ');
            let method = parts.next().unwrap_or_default();
            assert_eq!(method, "GET", "{line}");
            seen.lock()
                .unwrap()
                .push(parts.next().unwrap_or_default().to_string());
            match responses.pop_front().flatten() {
                Some((code, body)) => {
                    let resp = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                }
                None => parked.push(sock), // never answered
            }
        }
    });
    CannedServer {
        base,
        targets,
        task,
    }
}

/// `application/x-www-form-urlencoded` decoding of one query parameter.
fn query_param(target: &str, key: &str) -> Option<String> {
    let (_, qs) = target.split_once('?')?;
    for pair in qs.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != key {
            continue;
        }
        let b = v.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                    out.push(u8::from_str_radix(h, 16).ok()?);
                    i += 2;
                }
                c => out.push(c),
            }
            i += 1;
        }
        return String::from_utf8(out).ok();
    }
    None
}

const OK_093: &str = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1767225600.5,"0.93"]}]}}"#;
const OK_12: &str = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"x"},"value":[1767225600.5,"12"]}]}}"#;
const EMPTY: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
const BAD: &str =
    r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected character"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_prometheus_source_against_a_canned_server() {
    let server = canned(vec![
        Some((200, OK_093)),
        Some((200, OK_12)),
        Some((200, EMPTY)),
        Some((400, BAD)),
    ])
    .await;
    let source = PrometheusSource::new(&format!("{}/", server.base)).expect("source");
    let a = Allocation::new("svc", "ml", Default::default());

    assert_eq!(source.query(&a, "gpu_utilization").await, Ok(0.93));
    assert_eq!(
        source.query(&a, "requests_per_s{job='my-inference'}").await,
        Ok(12.0)
    );
    let empty = source.query(&a, "queue_depth").await.unwrap_err();
    assert_eq!(
        empty,
        "no samples for avg(queue_depth{lattice_allocation=\"svc\",lattice_tenant=\"ml\"})"
    );
    let bad = source.query(&a, "bad_series").await.unwrap_err();
    assert!(
        bad.contains("400") && bad.contains("bad_data") && bad.contains("parse error"),
        "{bad}"
    );
    // Not a selector: refused before any query is sent.
    let refused = source
        .query(&a, "sum(other_tenants_series)")
        .await
        .unwrap_err();
    assert!(refused.contains("not a metric name"), "{refused}");

    let targets = server.targets.lock().unwrap().clone();
    assert_eq!(targets.len(), 4, "{targets:?}");
    for t in &targets {
        assert!(t.starts_with("/api/v1/query?query="), "{t}");
    }
    let queries: Vec<String> = targets
        .iter()
        .map(|t| query_param(t, "query").expect("query parameter"))
        .collect();
    assert_eq!(
        queries,
        [
            "avg(gpu_utilization{lattice_allocation=\"svc\",lattice_tenant=\"ml\"})",
            "avg(requests_per_s{job=\"my-inference\",lattice_allocation=\"svc\",lattice_tenant=\"ml\"})",
            "avg(queue_depth{lattice_allocation=\"svc\",lattice_tenant=\"ml\"})",
            "avg(bad_series{lattice_allocation=\"svc\",lattice_tenant=\"ml\"})",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaler_prometheus_source_times_out_after_5s() {
    let server = canned(vec![None]).await;
    let source = PrometheusSource::new(&server.base).expect("source");
    let a = Allocation::new("svc", "ml", Default::default());
    let start = Instant::now();
    let err = source.query(&a, "gpu_utilization").await.unwrap_err();
    let took = start.elapsed();
    assert!(err.contains("did not answer"), "{err}");
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(9),
        "{took:?}"
    );
}

#[tokio::test]
async fn autoscaler_prometheus_source_unreachable_is_an_error() {
    // A port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let source = PrometheusSource::new(&format!("http://127.0.0.1:{port}")).expect("source");
    let a = Allocation::new("svc", "ml", Default::default());
    let err = source.query(&a, "gpu_utilization").await.unwrap_err();
    assert!(err.contains("gpu_utilization"), "{err}");
}

#[test]
fn autoscaler_metric_family_names() {
    let m = ControllerMetrics::new();
    m.autoscaling_metric_query_failures.inc();
    m.record_scale_event("up");
    let mut r = prometheus_client::registry::Registry::default();
    m.register(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
    assert!(
        out.contains("lattice_autoscaling_metric_query_failures_total 1"),
        "{out}"
    );
    assert!(
        out.contains("lattice_autoscaling_scale_events_total{direction=\"up\"} 1"),
        "{out}"
    );
    assert!(
        out.contains("lattice_autoscaling_oscillation_alerts_total 0"),
        "{out}"
    );
}
