//! Real workloads end to end: `lattice-server --dev` (API, scheduler, DAG, release and node
//! lifecycle controllers) and real `lattice-agent` processes running real processes.

use std::path::Path;
use std::time::{Duration, Instant};

use lattice_apis::{Allocation, AllocationPhase, Dag, Node, NodeState};
use lattice_e2e::{pid_alive, Cluster};
use lattice_runtime::{Api, Client, ListParams, Patch, PatchParams, PostParams, ResourceExt};
use serde_json::json;

fn client(c: &Cluster) -> Client {
    Client::http(&c.url(), Some(c.token())).expect("client")
}

async fn wait_nodes_ready(c: &Cluster, n: usize) {
    let api: Api<Node> = Api::all(client(c));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = api
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .is_some_and(|s| s.state == NodeState::Ready)
                    })
                    .count()
            })
            .unwrap_or(0);
        if ready >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} nodes not Ready in time\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn submit(c: &Cluster, name: &str, spec: serde_json::Value) -> Allocation {
    let a: Allocation = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))
    .expect("allocation");
    Api::<Allocation>::namespaced(client(c), "default")
        .create(&PostParams::default(), &a)
        .await
        .expect("create")
}

async fn wait_alloc(
    c: &Cluster,
    name: &str,
    what: &str,
    limit: Duration,
    pred: impl Fn(&Allocation) -> bool,
) -> Allocation {
    let api: Api<Allocation> = Api::namespaced(client(c), "default");
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(a)) = api.get_opt(name).await {
            if pred(&a) {
                return a;
            }
            if Instant::now() > deadline {
                panic!(
                    "{name}: timed out waiting for {what}; status {:?}\n{}",
                    a.status,
                    c.logs()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_terminal(c: &Cluster, name: &str) -> Allocation {
    wait_alloc(c, name, "a terminal phase", Duration::from_secs(60), |a| {
        a.phase().is_terminal()
    })
    .await
}

fn shell(cmd: &str) -> serde_json::Value {
    json!({"entrypoint": "/bin/sh", "args": ["-c", cmd], "lifecycle": {"walltime": "10m"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_complete_or_fail_with_their_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, &[], &[]);
    wait_nodes_ready(&c, 2).await;
    submit(&c, "ok", shell("echo hello; exit 0")).await;
    submit(&c, "three", shell("echo oops >&2; exit 3")).await;
    let ok = wait_terminal(&c, "ok").await;
    assert_eq!(ok.phase(), AllocationPhase::Completed, "{:?}", ok.status);
    assert_eq!(ok.status.as_ref().and_then(|s| s.exit_code), Some(0));
    let three = wait_terminal(&c, "three").await;
    assert_eq!(three.phase(), AllocationPhase::Failed);
    assert_eq!(three.status.as_ref().and_then(|s| s.exit_code), Some(3));
    // Nodes are given back.
    let nodes: Api<Node> = Api::all(client(&c));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let owned = nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|n| n.status.as_ref().and_then(|s| s.owner.as_ref()).is_some())
            .count();
        if owned == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "nodes still owned\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_short_jobs_each_run_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 4, &[], &[]);
    wait_nodes_ready(&c, 4).await;
    let marker = dir.path().join("runs");
    std::fs::create_dir_all(&marker).unwrap();
    let n = 120;
    for i in 0..n {
        let cmd = format!(
            "echo $LATTICE_ALLOC_ID >> {}/$LATTICE_ALLOC_ID",
            marker.display()
        );
        submit(&c, &format!("j{i}"), shell(&cmd)).await;
    }
    for i in 0..n {
        let a = wait_alloc(
            &c,
            &format!("j{i}"),
            "Completed",
            Duration::from_secs(120),
            |a| a.phase().is_terminal(),
        )
        .await;
        assert_eq!(
            a.phase(),
            AllocationPhase::Completed,
            "j{i}: {:?}",
            a.status
        );
        // A second attempt means a requeue (start failure or lost process): say why.
        let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or_default();
        if attempt != 1 {
            let logs = c.logs();
            let mine: Vec<&str> = logs
                .lines()
                .filter(|l| {
                    l.contains(&format!("j{i}")) || l.contains("WARN") || l.contains("ERROR")
                })
                .collect();
            panic!(
                "j{i} was bound {attempt} times: {:?}\n{}",
                a.status,
                mine.join("\n")
            );
        }
    }
    for i in 0..n {
        let runs = std::fs::read_to_string(marker.join(format!("j{i}"))).unwrap_or_default();
        assert_eq!(
            runs.lines().count(),
            1,
            "j{i} ran {} times",
            runs.lines().count()
        );
    }
    // No scratch directory is left behind.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for a in &c.agents {
        let scratch = a.state_dir.join("scratch");
        let left: Vec<_> = std::fs::read_dir(&scratch)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{}: scratch left behind: {left:?}", a.node);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_down_requeues_or_fails_per_policy() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(
        dir.path(),
        2,
        &["--heartbeat-timeout", "2s", "--node-grace-period", "2s"],
        &[],
    );
    let mut c = c;
    wait_nodes_ready(&c, 2).await;
    submit(&c, "requeue-me", shell("sleep 30")).await;
    let mut spec = shell("sleep 30");
    spec["requeue"] = json!({"policy": "never"});
    submit(&c, "fail-me", spec).await;
    let a = wait_alloc(&c, "requeue-me", "Running", Duration::from_secs(30), |a| {
        a.phase() == AllocationPhase::Running
    })
    .await;
    let b = wait_alloc(&c, "fail-me", "Running", Duration::from_secs(30), |a| {
        a.phase() == AllocationPhase::Running
    })
    .await;
    let node_a = a.status.unwrap().assigned_nodes[0].clone();
    let b_status = b.status.unwrap();
    let node_b = b_status.assigned_nodes[0].clone();
    let pid_b = b_status.node_states[&node_b].pid.expect("fail-me's pid") as i32;
    assert_ne!(node_a, node_b, "full nodes: one allocation per node");
    // Kill node_b's agent: fail-me (policy never) fails; requeue-me is untouched.
    let idx = c.agents.iter().position(|x| x.node == node_b).unwrap();
    c.agents[idx].kill9();
    let failed = wait_alloc(&c, "fail-me", "Failed", Duration::from_secs(30), |a| {
        a.phase().is_terminal()
    })
    .await;
    assert_eq!(failed.phase(), AllocationPhase::Failed);
    assert_eq!(
        failed.status.as_ref().unwrap().reason.as_deref(),
        Some("node_failure")
    );
    let nodes: Api<Node> = Api::all(client(&c));
    let down = nodes.get(&node_b).await.unwrap();
    assert_eq!(down.status.unwrap().state, NodeState::Down);
    assert!(
        pid_alive(pid_b),
        "the workload outlives its agent until the agent is back"
    );
    // The workload of the dead agent is killed when its agent comes back (superseded),
    // and the node takes no new work before that: it is Ready only once it is gone.
    c.agents[idx].restart();
    let back = Instant::now() + Duration::from_secs(30);
    loop {
        let n = nodes.get(&node_b).await.unwrap();
        if n.status
            .as_ref()
            .is_some_and(|s| s.state == NodeState::Ready)
        {
            assert!(
                !pid_alive(pid_b),
                "node {node_b} is Ready while the superseded run (pid {pid_b}) still runs"
            );
            break;
        }
        assert!(
            Instant::now() < back,
            "node did not come back\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Now kill node_a's agent: requeue-me (on_node_failure) moves to the other node.
    let idx = c.agents.iter().position(|x| x.node == node_a).unwrap();
    c.agents[idx].kill9();
    let moved = wait_alloc(
        &c,
        "requeue-me",
        "rebound elsewhere",
        Duration::from_secs(40),
        |a| {
            a.status
                .as_ref()
                .is_some_and(|s| s.requeue_count == 1 && s.assigned_nodes == vec![node_b.clone()])
        },
    )
    .await;
    assert_eq!(moved.status.unwrap().attempt, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_running_work() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, &[], &[]);
    wait_nodes_ready(&c, 1).await;
    submit(&c, "work", shell("sleep 2")).await;
    let a = wait_alloc(&c, "work", "Running", Duration::from_secs(30), |a| {
        a.phase() == AllocationPhase::Running
    })
    .await;
    let node = a.status.unwrap().assigned_nodes[0].clone();
    let nodes: Api<Node> = Api::all(client(&c));
    let patch = Patch::Merge(json!({"spec": {"drain": {"reason": "maintenance"}}}));
    nodes
        .patch(&node, &PatchParams::default(), &patch)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = nodes.get(&node).await.unwrap().status.unwrap().state;
        if s == NodeState::Draining {
            break;
        }
        assert!(Instant::now() < deadline, "not Draining: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_terminal(&c, "work").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = nodes.get(&node).await.unwrap().status.unwrap().state;
        if s == NodeState::Drained {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not Drained: {s:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing new lands on a drained node.
    submit(&c, "later", shell("true")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later: Api<Allocation> = Api::namespaced(client(&c), "default");
    assert_eq!(
        later.get("later").await.unwrap().phase(),
        AllocationPhase::Pending
    );
    // Undrain: Ready, and the queued work runs.
    let patch = Patch::Merge(json!({"spec": {"drain": null}}));
    nodes
        .patch(&node, &PatchParams::default(), &patch)
        .await
        .unwrap();
    let done = wait_terminal(&c, "later").await;
    assert_eq!(done.phase(), AllocationPhase::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_workflow_runs_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 4, &[], &[]);
    wait_nodes_ready(&c, 4).await;
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    // The tenant and vClusters of the examples, then the workflow itself.
    for file in ["tenant.yaml", "vclusters.yaml", "training-pipeline.yaml"] {
        let out = std::process::Command::new(lattice_e2e::bin("lattice"))
            .args(["apply", "-f"])
            .arg(repo.join("manifests/examples").join(file))
            .env("LATTICE_API_URL", c.url())
            .env("LATTICE_TOKEN", c.token())
            .env("HOME", dir.path())
            .output()
            .expect("lattice apply");
        assert!(
            out.status.success(),
            "apply {file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if file == "tenant.yaml" {
            // The agents run this work as the test user (root here): the tenant allows it.
            lattice_e2e::allow_own_user(&c.url(), &c.token(), "ml-team");
        }
    }
    let dags: Api<Dag> = Api::namespaced(client(&c), "ml-team");
    let deadline = Instant::now() + Duration::from_secs(120);
    let dag = loop {
        let d = dags.get("training-pipeline").await.unwrap();
        let phase = d
            .status
            .as_ref()
            .map(|s| format!("{:?}", s.phase))
            .unwrap_or_default();
        if ["Completed", "Failed", "Cancelled"].contains(&phase.as_str()) {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "DAG did not finish: {:?}\n{}",
            d.status,
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let st = dag.status.unwrap();
    assert_eq!(format!("{:?}", st.phase), "Completed", "{st:?}");
    let phase = |t: &str| format!("{:?}", st.tasks[t].phase);
    assert_eq!(phase("preprocess"), "Completed");
    assert_eq!(phase("train"), "Completed");
    assert_eq!(phase("evaluate"), "Completed");
    assert_eq!(phase("notify-failure"), "Skipped");
    // train ran on two nodes of one topology group and saw both in LATTICE_NODELIST.
    let allocs: Api<Allocation> = Api::namespaced(client(&c), "ml-team");
    let train = allocs.get("training-pipeline-train").await.unwrap();
    let tst = train.status.clone().unwrap();
    assert_eq!(tst.assigned_nodes.len(), 2);
    assert_eq!(tst.topology_groups.len(), 1);
    assert!(train.labels().contains_key("lattice.dev/dag"));
}
