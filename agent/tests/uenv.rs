//! uenv images for real: a squashfs image built with `mksquashfs` (Debian
//! `squashfs-tools`), served from a repository directory and over HTTP, verified, cached,
//! and mounted read-only in the run's own mount namespace — seen by the run, its job
//! steps and its attach sessions, never by the host — with the view's tools on `PATH`.
//! Needs root (loop devices, mount namespaces).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use lattice_apis::{Allocation, AllocationPhase};
use serde_json::json;

/// An agent for `node` taking its uenvs from `repo`, mounting them at `mount`.
fn uenv_agent(server: &Server, node: &str, root: &Path, repo: &str, mount: &Path) -> Agent {
    Agent::start(
        server,
        node,
        root,
        &[
            "--uenv-repo",
            repo,
            "--uenv-mount-points",
            &mount.display().to_string(),
        ],
    )
}

fn host_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uenv_is_mounted_for_the_run_its_steps_and_attach_sessions_only() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a uenv needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (repo, mount) = uenv_repository(dir.path());
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let node = format!("uenv-{}", std::process::id());
    let agent = uenv_agent(
        &server,
        &node,
        root.path(),
        &repo.display().to_string(),
        &mount,
    );
    registered(&server, &node).await;

    let script = format!(
        "#!/bin/sh\nhello-uenv\ngrep -c ' {m} .* squashfs ' /proc/self/mountinfo\ntouch {m}/x 2>/dev/null || echo read-only\nexec sleep 300\n",
        m = mount.display()
    );
    create(
        &server,
        "held",
        json!({"script": script, "environment": {"uenv": "tools/1.0:v1", "view": "default"}}),
    )
    .await;
    bind(&server, "held", &[&node], Some(600)).await;
    wait_phase(&server, "held", AllocationPhase::Running).await;
    let text = wait_for("the run's output", LIMIT, || async {
        let (_, t) = server.logs("held", "").await;
        t.contains("read-only").then_some(t)
    })
    .await;
    assert!(
        text.contains(&format!("hello from the uenv at {}/bin", mount.display())),
        "{text}\n{}",
        agent.log()
    );
    assert!(
        text.contains("\n1\n"),
        "one squashfs at the mount point: {text}"
    );
    // The host never sees it.
    assert!(!host_mounts().contains(&mount.display().to_string()));

    // A job step of the allocation gets the same environment, in its own namespace.
    // (`lattice launch` copies the allocation's environment into the step, as here.)
    create_step(
        &server,
        "held",
        "held.0",
        json!({"entrypoint": "hello-uenv",
               "environment": {"uenv": "tools/1.0:v1", "view": "default"}}),
    )
    .await;
    let s = wait_terminal(&server, "held.0").await;
    assert_eq!(
        s.phase(),
        AllocationPhase::Completed,
        "{:?}\n{}",
        s.status,
        agent.log()
    );
    let (_, out) = server.logs("held.0", "").await;
    assert!(out.contains("hello from the uenv"), "{out}");

    // An attach session enters the run's namespace.
    let out = attach(&server, "held", &["--", "sh", "-c", "hello-uenv"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hello from the uenv"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_or_corrupt_uenv_fails_the_run_saying_why() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a uenv needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (repo, mount) = uenv_repository(dir.path());
    // Served over HTTP as well: the same repository from a web server.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    /// The web server goes with the test, passed or failed.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _http = Killed(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(&repo)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3"),
    );
    // Serving before the first run asks (a refused connection would be a passing
    // failure, requeued).
    let deadline = std::time::Instant::now() + LIMIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the HTTP server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let node = format!("uenv-http-{}", std::process::id());
    let agent = uenv_agent(
        &server,
        &node,
        root.path(),
        &format!("http://127.0.0.1:{port}/"),
        &mount,
    );
    registered(&server, &node).await;
    for (name, uenv, want) in [
        ("good", "tools/1.0", "hello from the uenv"),
        ("unknown", "nvhpc/24.1:v2", "uenv nvhpc/24.1:v2 is not in"),
    ] {
        create(
            &server,
            name,
            json!({"entrypoint": "hello-uenv", "environment": {"uenv": uenv, "view": "default"}}),
        )
        .await;
        bind(&server, name, &[&node], Some(600)).await;
        let a = wait_terminal(&server, name).await;
        let said = format!(
            "{:?} {}",
            node_state(&a, &node).message,
            server.logs(name, "").await.1
        );
        assert!(said.contains(want), "{name}: {said}\n{}", agent.log());
        if name == "unknown" {
            // Never requeued: every node would refuse it the same way.
            assert_eq!(a.phase(), AllocationPhase::Failed);
            assert_eq!(
                a.status.as_ref().and_then(|s| s.reason.as_deref()),
                Some("environment_unavailable")
            );
        }
    }
    // Corrupt the image: its SHA-256 no longer matches, so it is never mounted (the agent
    // cached the good copy, so a new agent state is needed to fetch it again).
    let image = repo.join("tools-1.0-v1.squashfs");
    let mut bytes = std::fs::read(&image).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&image, bytes).unwrap();
    let root2 = tempfile::tempdir().unwrap();
    let node2 = format!("uenv-bad-{}", std::process::id());
    let _agent2 = uenv_agent(
        &server,
        &node2,
        root2.path(),
        &format!("http://127.0.0.1:{port}/"),
        &mount,
    );
    registered(&server, &node2).await;
    create(
        &server,
        "corrupt",
        json!({"entrypoint": "hello-uenv", "environment": {"uenv": "tools"},
               "requeue": {"policy": "never"}}),
    )
    .await;
    bind(&server, "corrupt", &[&node2], Some(600)).await;
    let a = wait_terminal(&server, "corrupt").await;
    let msg = node_state(&a, &node2).message.clone().unwrap_or_default();
    assert!(msg.contains("SHA-256 is"), "{msg}");
    assert_eq!(a.phase(), AllocationPhase::Failed);
    // A bad copy may be fixed: an ordinary start failure (requeued by the default policy).
    assert_eq!(
        a.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("start_failed")
    );
}

/// Work that needs what no agent reports (`status.agent.capabilities`) is refused when it
/// is submitted, naming the field and what agents need; once an agent that can run it
/// registers, the same work is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_no_node_can_run_is_refused_at_admission() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let plain = Agent::start(&server, "plain", root.path(), &[]);
    registered(&server, "plain").await;
    let node = server.nodes().get("plain").await.unwrap();
    let caps = node
        .status
        .and_then(|s| s.agent)
        .map(|a| a.capabilities)
        .unwrap_or_default();
    assert!(!caps.iter().any(|c| c == "uenv"), "{caps:?}");
    let alloc = |name: &str| -> Allocation {
        serde_json::from_value(json!({
            "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
            "metadata": {"name": name, "annotations": {"lattice.dev/hold": "true"}},
            "spec": {"entrypoint": "true", "environment": {"uenv": "tools/1.0:v1"}},
        }))
        .unwrap()
    };
    let refused = server
        .allocations()
        .create(&lattice_runtime::PostParams::default(), &alloc("nowhere"))
        .await
        .expect_err("no node has a uenv repository");
    let said = refused.to_string();
    assert!(
        said.contains("spec.environment.uenv")
            && said.contains("no agent reports the uenv capability")
            && said.contains("--uenv-repo"),
        "{said}\n{}",
        plain.log()
    );
    // An agent with a repository can run it.
    let dir = tempfile::tempdir().unwrap();
    let (repo, mount) = uenv_repository(dir.path());
    let _able = uenv_agent(
        &server,
        "able",
        root.path(),
        &repo.display().to_string(),
        &mount,
    );
    registered(&server, "able").await;
    server
        .allocations()
        .create(&lattice_runtime::PostParams::default(), &alloc("somewhere"))
        .await
        .expect("admitted once a node can run it");
}
