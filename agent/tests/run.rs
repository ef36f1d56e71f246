//! Running allocations as real processes: exit codes, exact arguments, scripts, the
//! environment, start failures, job steps beside their allocation, cancellation,
//! walltime. (A node runs one allocation at a time, with its steps: the tests bind one
//! after another, as the scheduler would.)

mod common;

use common::*;
use lattice_apis::lifecycle::CANCEL_ANNOTATION;
use lattice_apis::{AllocationPhase, NodeTaskPhase};
use lattice_runtime::{Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_arguments_scripts_and_environment() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let agent = Agent::start(&server, "node-a", root.path(), &["--slurm-env"]);

    submit(
        &server,
        "ok",
        "node-a",
        json!({"entrypoint": "/bin/sh", "args": ["-c", "exit 0"]}),
    )
    .await;
    wait_terminal(&server, "ok").await;
    submit(
        &server,
        "three",
        "node-a",
        json!({"entrypoint": "/bin/sh", "args": ["-c", "exit 3"]}),
    )
    .await;
    wait_terminal(&server, "three").await;
    submit(
        &server,
        "args",
        "node-a",
        json!({
            "entrypoint": "/bin/sh",
            "args": ["-c", "for a in \"$@\"; do printf '<%s>\\n' \"$a\"; done", "sh",
                     "a b", "it's", "\"quoted\"", "$HOME", "*", "", "  two  spaces "],
        }),
    )
    .await;
    wait_terminal(&server, "args").await;
    submit(
        &server,
        "shebang",
        "node-a",
        json!({"script": "#!/bin/cat\nprinted by cat, not run\n"}),
    )
    .await;
    wait_terminal(&server, "shebang").await;
    submit(
        &server,
        "plain-script",
        "node-a",
        json!({"script": "echo $((6 * 7))\n"}),
    )
    .await;
    wait_terminal(&server, "plain-script").await;
    // Nothing the agent holds (or inherited, e.g. cargo's jobserver pipes here) reaches
    // the workload: 0-2, and 3, the directory ls reads.
    submit(
        &server,
        "descriptors",
        "node-a",
        json!({"script": "echo $(ls /proc/self/fd)\n"}),
    )
    .await;
    wait_terminal(&server, "descriptors").await;
    submit(
        &server,
        "environment",
        "node-a",
        json!({
            "entrypoint": "echo \"$LATTICE_NODEID|$LATTICE_NNODES|$LATTICE_NODE_RANK|$LATTICE_ATTEMPT|$LATTICE_ALLOC_ID|$LATTICE_TENANT|$SLURM_JOB_ID|$SLURM_NODELIST|$MY_VAR\"; pwd; echo \"$LATTICE_SCRATCH\"",
            "env": {"MY_VAR": "from-spec"},
        }),
    )
    .await;
    wait_terminal(&server, "environment").await;
    // A start failure is node-side: requeued by default, so ask for no requeue.
    submit(
        &server,
        "missing",
        "node-a",
        json!({"entrypoint": "/nonexistent/program", "args": ["x"], "requeue": {"policy": "never"}}),
    )
    .await;

    let ok = wait_phase(&server, "ok", AllocationPhase::Completed).await;
    let st = ok.status.as_ref().unwrap();
    assert_eq!(st.exit_code, Some(0));
    let n = node_state(&ok, "node-a");
    assert_eq!(n.phase, NodeTaskPhase::Succeeded);
    assert_eq!(n.reason.as_deref(), Some("Exited"));
    assert!(n.pid.is_some() && n.start_time.is_some() && n.end_time.is_some());

    let three = wait_phase(&server, "three", AllocationPhase::Failed).await;
    let st = three.status.as_ref().unwrap();
    assert_eq!(st.exit_code, Some(3));
    assert_eq!(st.reason.as_deref(), Some("non_zero_exit"));
    assert_eq!(
        node_state(&three, "node-a").reason.as_deref(),
        Some("NonZeroExit")
    );

    wait_phase(&server, "args", AllocationPhase::Completed).await;
    let (code, out) = server.logs("args", "").await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(
        out, "<a b>\n<it's>\n<\"quoted\">\n<$HOME>\n<*>\n<>\n<  two  spaces >\n",
        "arguments must arrive exactly"
    );

    wait_phase(&server, "shebang", AllocationPhase::Completed).await;
    let (_, out) = server.logs("shebang", "").await;
    assert_eq!(out, "#!/bin/cat\nprinted by cat, not run\n");

    wait_phase(&server, "plain-script", AllocationPhase::Completed).await;
    assert_eq!(server.logs("plain-script", "").await.1, "42\n");
    wait_phase(&server, "descriptors", AllocationPhase::Completed).await;
    assert_eq!(server.logs("descriptors", "").await.1, "0 1 2 3\n");

    let env = wait_phase(&server, "environment", AllocationPhase::Completed).await;
    let (_, out) = server.logs("environment", "").await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "node-a|1|0|1|environment|default|environment|node-a|from-spec"
    );
    let uid = env.metadata.uid.clone().unwrap();
    assert!(lines[2].ends_with(&format!("/scratch/{uid}-1")), "{out}");
    assert_eq!(
        lines[1], lines[2],
        "the working directory is the scratch directory"
    );
    // The scratch directory is removed once the process group is gone.
    let scratch = std::path::PathBuf::from(lines[2]);
    wait_for("scratch removal", LIMIT, || async {
        (!scratch.exists()).then_some(())
    })
    .await;

    let missing = wait_phase(&server, "missing", AllocationPhase::Failed).await;
    assert_eq!(
        missing.status.as_ref().unwrap().reason.as_deref(),
        Some("start_failed")
    );
    let n = node_state(&missing, "node-a");
    assert_eq!(n.reason.as_deref(), Some("StartFailed"));
    assert!(
        n.message
            .as_deref()
            .unwrap_or("")
            .contains("/nonexistent/program"),
        "{n:?}"
    );
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_at_once_cancel_and_terminal_phases_stay() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&server, "node-a", root.path(), &[]);

    // A long one first; its job steps run beside it, and it delays none of them.
    submit(
        &server,
        "long",
        "node-a",
        json!({"entrypoint": "sleep 600"}),
    )
    .await;
    let long = wait_phase(&server, "long", AllocationPhase::Running).await;
    let long_pid = node_state(&long, "node-a").pid.unwrap() as i32;
    for i in 0..4 {
        create_step(
            &server,
            "long",
            &format!("quick-{i}"),
            json!({"entrypoint": format!("echo quick {i}")}),
        )
        .await;
    }
    for i in 0..4 {
        wait_phase(&server, &format!("quick-{i}"), AllocationPhase::Completed).await;
    }
    assert_eq!(
        server.allocations().get("long").await.unwrap().phase(),
        AllocationPhase::Running
    );
    assert!(group_alive(long_pid));

    // Cancel: SIGTERM to the group → Cancelled.
    let patch = Patch::Merge(json!({"metadata": {"annotations": {CANCEL_ANNOTATION: "true"}}}));
    server
        .allocations()
        .patch("long", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let long = wait_phase(&server, "long", AllocationPhase::Cancelled).await;
    assert_eq!(
        node_state(&long, "node-a").reason.as_deref(),
        Some("Cancelled")
    );
    assert!(
        !group_alive(long_pid),
        "the process group is gone when Cancelled is reported"
    );

    // A process that takes its time to exit after SIGTERM (and exits 0): still Cancelled.
    submit(
        &server,
        "slow-exit",
        "node-a",
        json!({"script": "trap 'sleep 0.3; echo bye; exit 0' TERM\nwhile :; do sleep 0.1; done\n"}),
    )
    .await;
    wait_phase(&server, "slow-exit", AllocationPhase::Running).await;
    server
        .allocations()
        .patch("slow-exit", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let a = wait_phase(&server, "slow-exit", AllocationPhase::Cancelled).await;
    let n = node_state(&a, "node-a");
    assert_eq!(n.exit_code, Some(0));
    assert_eq!(n.reason.as_deref(), Some("Cancelled"));
    assert_eq!(a.phase(), AllocationPhase::Cancelled);

    // Failed elsewhere (a controller wrote Failed): the agent stops its process and the
    // late report does not change the outcome.
    submit(
        &server,
        "doomed",
        "node-a",
        json!({"entrypoint": "sleep 600"}),
    )
    .await;
    let d = wait_phase(&server, "doomed", AllocationPhase::Running).await;
    let pid = node_state(&d, "node-a").pid.unwrap() as i32;
    server
        .system_allocations()
        .patch_status(
            "doomed",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed", "reason": "node_failure"}})),
        )
        .await
        .unwrap();
    let api = server.allocations();
    let d = wait_for("the stopped report", LIMIT, || async {
        api.get("doomed").await.ok().filter(|a| {
            a.status
                .as_ref()
                .and_then(|s| s.node_states.get("node-a"))
                .is_some_and(|n| n.phase.is_terminal())
        })
    })
    .await;
    assert_eq!(d.phase(), AllocationPhase::Failed);
    assert_eq!(
        d.status.as_ref().unwrap().reason.as_deref(),
        Some("node_failure")
    );
    assert_eq!(node_state(&d, "node-a").reason.as_deref(), Some("Stopped"));
    assert!(!group_alive(pid));

    // Bound, then cancelled before this node's agent saw it: reported NotStarted, so
    // the allocation can end.
    agent.kill9();
    submit(
        &server,
        "never",
        "node-a",
        json!({"entrypoint": "echo never"}),
    )
    .await;
    server
        .allocations()
        .patch("never", &PatchParams::default(), &patch)
        .await
        .unwrap();
    agent.restart();
    let n = wait_phase(&server, "never", AllocationPhase::Cancelled).await;
    assert_eq!(
        node_state(&n, "node-a").reason.as_deref(),
        Some("NotStarted")
    );
    assert!(server.logs("never", "").await.0 == 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walltime_kills_the_whole_group_after_the_grace_period() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let agent = Agent::start(&server, "node-a", root.path(), &[]);

    // Leader and child both ignore SIGTERM; the child would outlive a leader-only kill.
    create(
        &server,
        "stubborn",
        json!({"script": "trap '' TERM\nsleep 1000 &\necho child $!\nwhile :; do sleep 0.2; done\n"}),
    )
    .await;
    bind(&server, "stubborn", &["node-a"], Some(2)).await;
    let running = wait_phase(&server, "stubborn", AllocationPhase::Running).await;
    let pgid = node_state(&running, "node-a").pid.unwrap() as i32;
    let (_, out) = wait_for("the child's pid", LIMIT, || async {
        let (c, o) = server.logs("stubborn", "").await;
        (c == 200 && o.contains("child ")).then_some((c, o))
    })
    .await;
    let child: i32 = out
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {out:?}"));

    let a = wait_phase(&server, "stubborn", AllocationPhase::Failed).await;
    let st = a.status.as_ref().unwrap();
    assert_eq!(st.reason.as_deref(), Some("walltime_exceeded"), "{st:#?}");
    let n = node_state(&a, "node-a");
    assert_eq!(n.reason.as_deref(), Some("WalltimeExceeded"));
    assert_eq!(
        n.signal,
        Some(9),
        "SIGTERM was ignored, so SIGKILL ended it"
    );
    // Walltime (2 s from the start) + grace (1 s) before the kill.
    let ran = n.end_time.unwrap() - n.start_time.unwrap();
    assert!(ran >= chrono::Duration::milliseconds(2900), "{ran:?}");
    assert!(!group_alive(pgid), "a process of the group survived");
    assert!(!pid_alive(child), "the child survived");
    assert!(agent.log().contains("grace period over: SIGKILL"));
}
