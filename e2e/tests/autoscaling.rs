//! Reactive allocations scale with a metric read from a real Prometheus: a test exporter
//! publishes `app_load{lattice_allocation=..., lattice_tenant=...}`, Prometheus scrapes it
//! every second, and `lattice-server --metrics-url` points the autoscaler at Prometheus.
//! High load adds nodes one proposal at a time up to `maxNodes` (each new node's agent
//! starts the workload there); low load gives nodes back down to `minNodes` (their agents
//! stop the processes, then the nodes are released and the tenant's usage drops).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_apis::{Allocation, AllocationPhase, NodeTaskPhase, Tenant};
use lattice_e2e::{free_port, Cluster};
use lattice_runtime::{Api, Client, Patch, PatchParams, PostParams};
use serde_json::json;

/// `/metrics` with one gauge whose value the test sets.
fn exporter(load: Arc<AtomicU64>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind exporter");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let v = f64::from_bits(load.load(Ordering::SeqCst));
            let body = format!(
                "# TYPE app_load gauge\napp_load{{lattice_allocation=\"svc\",lattice_tenant=\"default\"}} {v}\n"
            );
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// A real Prometheus scraping `target` every second; killed on drop.
struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn prometheus(dir: &Path, target: u16) -> Prometheus {
    let bin = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect(
            "prometheus is not installed: run hack/install-deps.sh (Debian package prometheus)",
        );
    std::fs::create_dir_all(dir).expect("prometheus dir");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: app\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let port = free_port();
    let child = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log"))
        .spawn()
        .expect("start prometheus");
    let p = Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .and_then(|mut s| {
                write!(s, "GET /-/ready HTTP/1.0\r\n\r\n").ok()?;
                let mut r = String::new();
                s.read_to_string(&mut r).ok()?;
                r.starts_with("HTTP/1.0 200").then_some(())
            });
        if ready.is_some() {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not become ready:\n{}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn wait_alloc(
    c: &Cluster,
    api: &Api<Allocation>,
    what: &str,
    limit: Duration,
    pred: impl Fn(&Allocation) -> bool,
) -> Allocation {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(a)) = api.get_opt("svc").await {
            if pred(&a) {
                return a;
            }
            if Instant::now() > deadline {
                panic!(
                    "svc: timed out after {limit:?} waiting for {what}; status {:#?}\n{}",
                    a.status,
                    c.logs()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn running_on(a: &Allocation, n: usize) -> bool {
    a.status.as_ref().is_some_and(|s| {
        s.phase == AllocationPhase::Running
            && s.assigned_nodes.len() == n
            && s.releasing_nodes.is_empty()
            && s.assigned_nodes.iter().all(|node| {
                s.node_states
                    .get(node)
                    .is_some_and(|r| r.phase == NodeTaskPhase::Running)
            })
    })
}

async fn tenant_nodes(client: &Client) -> u32 {
    let t: Tenant = Api::all(client.clone())
        .get("default")
        .await
        .expect("tenant");
    t.status.map(|s| s.usage.nodes).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reactive_allocation_follows_its_prometheus_metric() {
    let dir = tempfile::tempdir().unwrap();
    let load = Arc::new(AtomicU64::new(5.0f64.to_bits()));
    let target = exporter(load.clone());
    let prom = prometheus(&dir.path().join("prometheus"), target);
    let c = Cluster::start(dir.path(), 3, &["--metrics-url", &prom.url], &[]);
    let client = Client::http(&c.url(), Some(c.token())).expect("client");
    let api: Api<Allocation> = Api::namespaced(client.clone(), "default");
    let a: Allocation = serde_json::from_value(json!({
        "metadata": {"name": "svc", "namespace": "default"},
        "spec": {
            "entrypoint": "sleep 600",
            "lifecycle": {"type": "reactive", "scalePolicy": {
                "minNodes": 1, "maxNodes": 3, "metric": "app_load", "target": 10,
                "evaluationInterval": "1s", "scaleUpWindow": "2s", "scaleDownWindow": "2s",
                "cooldown": "1s", "scaleDownThreshold": 0.5,
            }},
        },
    }))
    .expect("allocation");
    api.create(&PostParams::default(), &a)
        .await
        .expect("create");

    // Below the target: it starts at minNodes and stays there.
    wait_alloc(
        &c,
        &api,
        "running on 1 node",
        Duration::from_secs(60),
        |a| running_on(a, 1),
    )
    .await;
    let a = wait_alloc(&c, &api, "a metric reading", Duration::from_secs(60), |a| {
        a.status
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .is_some_and(|s| s.last_value == Some(5.0))
    })
    .await;
    assert_eq!(a.status.as_ref().map(|s| s.assigned_nodes.len()), Some(1));

    // Above the target: one node at a time up to maxNodes, each running the workload.
    load.store(50.0f64.to_bits(), Ordering::SeqCst);
    let big = wait_alloc(&c, &api, "3 running nodes", Duration::from_secs(90), |a| {
        running_on(a, 3)
    })
    .await;
    let st = big.status.clone().unwrap_or_default();
    assert_eq!(st.scale.as_ref().map(|s| s.desired_nodes), Some(3));
    let mut nodes = st.assigned_nodes.clone();
    nodes.sort();
    nodes.dedup();
    assert_eq!(
        nodes.len(),
        3,
        "three distinct nodes: {:?}",
        st.assigned_nodes
    );
    assert_eq!(
        tenant_nodes(&client).await,
        3,
        "usage counts the added nodes"
    );
    let nodes_api: Api<lattice_apis::Node> = Api::all(client.clone());
    for n in &st.assigned_nodes {
        let node = nodes_api.get(n).await.expect("node");
        let owner = node.status.and_then(|s| s.owner).and_then(|o| o.allocation);
        assert_eq!(owner.as_deref(), Some("svc"), "{n} is owned by svc");
    }

    // Well below the target: nodes go back down to minNodes, each released only after its
    // agent stopped the workload there.
    load.store(1.0f64.to_bits(), Ordering::SeqCst);
    let small = wait_alloc(&c, &api, "back to 1 node", Duration::from_secs(90), |a| {
        running_on(a, 1)
    })
    .await;
    let st = small.status.clone().unwrap_or_default();
    let gone: Vec<&String> = nodes
        .iter()
        .filter(|n| !st.assigned_nodes.contains(n))
        .collect();
    assert_eq!(gone.len(), 2, "{st:#?}");
    for n in gone {
        let report = st.node_states.get(n).expect("the released node reported");
        assert!(report.phase.is_terminal(), "{n}: {report:?}");
        let node = nodes_api.get(n).await.expect("node");
        assert!(
            node.status.and_then(|s| s.owner).is_none(),
            "{n} was released"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while tenant_nodes(&client).await != 1 {
        assert!(
            Instant::now() < deadline,
            "usage did not drop to 1\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        small.phase(),
        AllocationPhase::Running,
        "scaling never stops it"
    );

    api.patch(
        "svc",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"lattice.dev/cancel-requested": "true"}}}),
        ),
    )
    .await
    .expect("cancel");
    wait_alloc(&c, &api, "cancelled", Duration::from_secs(60), |a| {
        a.phase() == AllocationPhase::Cancelled
    })
    .await;
}
