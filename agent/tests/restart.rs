//! Workloads survive the agent: SIGKILL the agent while jobs run, let one finish while
//! it is down, restart it, and check that it re-attaches, reports the real exit codes
//! and keeps the logs; SIGTERM (graceful shutdown) leaves workloads running too.

mod common;

use common::*;
use lattice_apis::{AllocationPhase, NodeTaskPhase};
use serde_json::json;

fn waiter(mark: &std::path::Path, code: i32) -> serde_json::Value {
    json!({
        "script": format!(
            "echo started $$\nwhile [ ! -e {} ]; do sleep 0.1; done\necho finishing {code}\nexit {code}\n",
            mark.display()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_reattaches_and_reports_real_exit_codes() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    // Two nodes (a node runs one allocation), both agents killed and restarted.
    let mut agent = Agent::start(&server, "node-a", root.path(), &[]);
    let mut agent_b = Agent::start(&server, "node-b", root.path(), &[]);

    let mark_a = marks.path().join("a");
    let mark_b = marks.path().join("b");
    submit(&server, "ends-while-down", "node-a", waiter(&mark_a, 5)).await;
    submit(&server, "ends-after", "node-b", waiter(&mark_b, 0)).await;
    let a = wait_phase(&server, "ends-while-down", AllocationPhase::Running).await;
    let b = wait_phase(&server, "ends-after", AllocationPhase::Running).await;
    let pid_a = node_state(&a, "node-a").pid.unwrap() as i32;
    let pid_b = node_state(&b, "node-b").pid.unwrap() as i32;
    wait_for("output", LIMIT, || async {
        server
            .logs("ends-while-down", "")
            .await
            .1
            .contains("started")
            .then_some(())
    })
    .await;

    let lease_before = server.leases().get("node-a").await.unwrap();
    let seq_before: u64 = lease_before.metadata.annotations["lattice.dev/heartbeat-sequence"]
        .parse()
        .unwrap();

    agent.kill9();
    agent_b.kill9();
    assert!(
        pid_alive(pid_a) && pid_alive(pid_b),
        "workloads must survive the agent"
    );

    // One finishes while the agent is down; its shim records the real exit status.
    std::fs::write(&mark_a, "").unwrap();
    wait_for("the job to end while the agent is down", LIMIT, || async {
        (!group_alive(pid_a)).then_some(())
    })
    .await;
    assert_eq!(
        server
            .allocations()
            .get("ends-while-down")
            .await
            .unwrap()
            .phase(),
        AllocationPhase::Running,
        "nobody reported it yet"
    );

    agent.restart();
    agent_b.restart();
    let a = wait_phase(&server, "ends-while-down", AllocationPhase::Failed).await;
    let n = node_state(&a, "node-a");
    assert_eq!(n.exit_code, Some(5), "the real exit code, not Lost: {n:?}");
    assert_eq!(n.reason.as_deref(), Some("NonZeroExit"));
    assert_eq!(a.status.as_ref().unwrap().exit_code, Some(5));
    // Its output, including what it wrote while the agent was down. The restarted agent
    // listens on a new port, which its registration announces only after it reported
    // the re-attached runs: until then the server answers 503 (agent unreachable).
    let (code, out) = wait_for("the restarted agent's logs", LIMIT, || async {
        let (code, out) = server.logs("ends-while-down", "").await;
        (code != 503).then_some((code, out))
    })
    .await;
    assert_eq!(code, 200, "{out}");
    assert!(
        out.starts_with("started ") && out.ends_with("finishing 5\n"),
        "{out:?}"
    );

    // The other is still running, supervised by the new agent.
    assert!(pid_alive(pid_b));
    assert_eq!(
        server
            .allocations()
            .get("ends-after")
            .await
            .unwrap()
            .phase(),
        AllocationPhase::Running
    );
    std::fs::write(&mark_b, "").unwrap();
    let b = wait_phase(&server, "ends-after", AllocationPhase::Completed).await;
    let n = node_state(&b, "node-b");
    assert_eq!(n.phase, NodeTaskPhase::Succeeded);
    assert_eq!(n.pid, Some(pid_b as u32), "the same process, re-attached");
    assert!(!group_alive(pid_b));

    // The heartbeat sequence never goes back across restarts.
    let api = server.leases();
    wait_for("a higher heartbeat sequence", LIMIT, || async {
        let l = api.get("node-a").await.ok()?;
        let s: u64 = l.metadata.annotations["lattice.dev/heartbeat-sequence"]
            .parse()
            .ok()?;
        (s > seq_before).then_some(())
    })
    .await;
    assert!(agent.log().contains("re-attached"), "{}", agent.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_leaves_workloads_running() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&server, "node-a", root.path(), &[]);
    let mark = marks.path().join("go");
    submit(&server, "survivor", "node-a", waiter(&mark, 0)).await;
    let a = wait_phase(&server, "survivor", AllocationPhase::Running).await;
    let pid = node_state(&a, "node-a").pid.unwrap() as i32;

    let status = agent.terminate();
    assert!(status.success(), "agent exit: {status:?}\n{}", agent.log());
    assert!(
        pid_alive(pid),
        "SIGTERM to the agent must not stop workloads"
    );

    let before = server.nodes().get("node-a").await.expect("node");
    let old_address = before.status.and_then(|s| s.agent).and_then(|a| a.address);
    agent.restart();
    std::fs::write(&mark, "").unwrap();
    let a = wait_phase(&server, "survivor", AllocationPhase::Completed).await;
    assert_eq!(node_state(&a, "node-a").exit_code, Some(0));
    // The logs are read from the agent at the address it publishes when it registers
    // again, which may come after the report.
    let nodes = server.nodes();
    wait_for("the agent's new address", LIMIT, || async {
        let n = nodes.get("node-a").await.ok()?;
        let a = n.status.and_then(|s| s.agent).and_then(|a| a.address);
        (a.is_some() && a != old_address).then_some(())
    })
    .await;
    let (_, out) = server.logs("survivor", "").await;
    assert!(
        out.contains("started") && out.contains("finishing 0"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_wait_for_an_unreachable_api_and_replay_in_order() {
    let mut server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    let agent = Agent::start(&server, "node-a", root.path(), &[]);
    let mark = marks.path().join("go");
    submit(&server, "offline", "node-a", waiter(&mark, 4)).await;
    let a = wait_phase(&server, "offline", AllocationPhase::Running).await;
    let pid = node_state(&a, "node-a").pid.unwrap() as i32;
    let address = server
        .nodes()
        .get("node-a")
        .await
        .unwrap()
        .status
        .and_then(|s| s.agent)
        .and_then(|a| a.address)
        .unwrap();

    // The API goes away; the job ends meanwhile. Its report waits in the state file.
    server.kill9();
    std::fs::write(&mark, "").unwrap();
    wait_for("the buffered report", LIMIT, || async {
        let st = agent.state();
        let pending = st["pendingReports"].as_array()?;
        pending
            .iter()
            .any(|r| r["report"]["phase"] == "Failed" && r["report"]["exitCode"] == 4)
            .then_some(())
    })
    .await;
    assert!(!group_alive(pid));
    // Heartbeats fail meanwhile, and are counted.
    let (http, base) = server.agent_http(&agent.node, &address);
    wait_for("failed heartbeats", LIMIT, || async {
        let m = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        (!m.contains("lattice_agent_heartbeat_failures_total 0\n")).then_some(())
    })
    .await;

    server.restart();
    let a = wait_phase(&server, "offline", AllocationPhase::Failed).await;
    assert_eq!(node_state(&a, "node-a").exit_code, Some(4));
    wait_for("the queue to drain", LIMIT, || async {
        agent.state()["pendingReports"]
            .as_array()
            .is_some_and(|p| p.is_empty())
            .then_some(())
    })
    .await;
}
