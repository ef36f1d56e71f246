//! Running as the submitting user (when the agent is root) and the run's cgroups (when
//! the host offers them). Each test skips itself where the machine cannot do what it
//! checks.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use lattice_apis::AllocationPhase;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_the_annotated_user_when_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        eprintln!("skipped: no user nobody");
        return;
    };
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    // The scratch directory must be reachable by the user.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _agent = Agent::start(&server, "node-a", root.path(), &[]);
    create_with(
        &server,
        "as-nobody",
        json!({"entrypoint": "id -u; echo $USER; touch $LATTICE_SCRATCH/mine && echo wrote"}),
        json!({"annotations": {"lattice.dev/user": "nobody"}}),
    )
    .await;
    bind(&server, "as-nobody", &["node-a"], Some(600)).await;
    wait_phase(&server, "as-nobody", AllocationPhase::Completed).await;
    let (_, out) = server.logs("as-nobody", "").await;
    assert_eq!(out, format!("{}\nnobody\nwrote\n", nobody.uid.as_raw()));
}

/// A user with no account on the node: as root the agent refuses the work (it fails,
/// naming the user and the fix) unless `--unknown-user=agent` lets it run as the agent's
/// user; not as root it never switches users.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_an_account_is_refused_unless_the_agent_runs_it_as_itself() {
    let server = Server::start();
    let strict_root = tempfile::tempdir().unwrap();
    let lax_root = tempfile::tempdir().unwrap();
    let _strict = Agent::start(
        &server,
        "node-strict",
        strict_root.path(),
        &["--unknown-user", "refuse"],
    );
    let _lax = Agent::start(&server, "node-lax", lax_root.path(), &[]);
    let ghost = json!({"annotations": {"lattice.dev/user": "no-such-user-lattice-test"}});
    let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_default();
    for (name, node) in [("ghost-strict", "node-strict"), ("ghost-lax", "node-lax")] {
        create_with(
            &server,
            name,
            json!({"entrypoint": "id -un"}),
            ghost.clone(),
        )
        .await;
        bind(&server, name, &[node], Some(600)).await;
    }
    if nix::unistd::geteuid().is_root() {
        // The start failure is reported (and the allocation requeued, as for any start
        // failure, until its requeue budget is spent).
        let api = server.allocations();
        let message = wait_for("the refusal", Duration::from_secs(60), || {
            let api = api.clone();
            async move {
                let a = api.get("ghost-strict").await.ok()?;
                let m = a.status?.message?;
                m.contains("has no account on this node").then_some(m)
            }
        })
        .await;
        assert!(
            message.contains(r#"user "no-such-user-lattice-test" has no account on this node"#)
                && message.contains("--unknown-user=agent"),
            "{message}"
        );
    } else {
        wait_phase(&server, "ghost-strict", AllocationPhase::Completed).await;
    }
    wait_phase(&server, "ghost-lax", AllocationPhase::Completed).await;
    let (_, out) = server.logs("ghost-lax", "").await;
    assert_eq!(out.trim(), me, "ran as the agent's user");
}

/// The run's groups in every hierarchy under /sys/fs/cgroup that has `rel` (a path
/// relative to a hierarchy's root).
fn groups_named(rel: &str) -> Vec<PathBuf> {
    let root = Path::new(lattice_agent::cgroup::DEFAULT_ROOT);
    let mut mounts = vec![root.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(root) {
        mounts.extend(rd.flatten().map(|e| e.path()));
    }
    mounts
        .into_iter()
        .map(|m| m.join(rel))
        .filter(|p| p.is_dir())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_holds_the_workload_and_kills_escapees() {
    if !cgroups_usable() {
        eprintln!("skipped: no usable cgroups");
        return;
    }
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let node = format!("cg-{}", std::process::id());
    let agent = Agent::start(&server, &node, root.path(), &[]);
    // A daemon that leaves the process group (setsid) is still in the cgroup.
    let job = submit(
        &server,
        "escapee",
        &node,
        json!({"script": "setsid sleep 1000 < /dev/null > /dev/null 2>&1 &\necho escaped $!\ncat /proc/self/cgroup\nsleep 0.5\n"}),
    )
    .await;
    let uid = job.metadata.uid.clone().unwrap();
    wait_phase(&server, "escapee", AllocationPhase::Completed).await;
    let (_, out) = server.logs("escapee", "").await;
    let instance = lattice_agent::cgroup::instance_id(&agent.state_dir);
    let group = format!("lattice/{node}/{instance}/{uid}-1");
    assert!(out.contains(&format!("/{group}\n")), "{out}");
    let escaped: i32 = out
        .lines()
        .find_map(|l| l.strip_prefix("escaped "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(!pid_alive(escaped), "the escaped daemon survived");
    wait_for("the cgroups to go", LIMIT, || async {
        groups_named(&group).is_empty().then_some(())
    })
    .await;
    assert!(!groups_named(&format!("lattice/{node}/{instance}")).is_empty());
}

/// `lattice attach` into a root agent's run of user nobody: the session runs as nobody, in
/// the run's scratch directory and cgroup (where the machine has one), on a terminal owned
/// by nobody, with no descriptor of the agent's (a PTY master, say) inherited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_runs_as_the_user_in_the_runs_directory_and_cgroup() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    if nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .is_none()
    {
        eprintln!("skipped: no user nobody");
        return;
    }
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let node = format!("att-{}", std::process::id());
    let _agent = Agent::start(&server, &node, root.path(), &[]);
    // The allocation's environment reaches attach sessions too, but only through the
    // exec after the drop to the user: a preload library in it never loads as root.
    let tools = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tools.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = tools.path().join("loaded");
    let lib = build_preload(tools.path(), &marker);
    let job = create_with(
        &server,
        "held",
        json!({"script": "#!/bin/sh\nexec sleep 300\n", "env": {"LD_PRELOAD": lib.display().to_string()}}),
        json!({"annotations": {"lattice.dev/user": "nobody"}}),
    )
    .await;
    let uid = job.metadata.uid.clone().unwrap();
    bind(&server, "held", &[&node], Some(600)).await;
    wait_phase(&server, "held", AllocationPhase::Running).await;
    let attach = |args: &[&str]| {
        let out = attach(&server, "held", args);
        let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let out = attach(&[
        "--",
        "sh",
        "-c",
        "id -un; pwd; cat /proc/self/cgroup; echo fds $(ls /proc/self/fd); echo groups $(id -G)",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"nobody"), "{out}");
    // Its groups as login gives them (initgroups), not just the primary one.
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let mut want: Vec<u32> = nix::unistd::getgrouplist(c"nobody", nobody.gid)
        .unwrap()
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    want.sort();
    want.dedup();
    let mut got: Vec<u32> = out
        .lines()
        .find_map(|l| l.strip_prefix("groups "))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    got.sort();
    got.dedup();
    assert_eq!(got, want, "{out}");
    assert!(
        lines
            .get(1)
            .is_some_and(|d| d.ends_with(&format!("scratch/{uid}-1"))),
        "{out}"
    );
    if cgroups_usable() {
        assert!(out.contains(&format!("/lattice/{node}/")), "{out}");
        assert!(out.contains(&format!("/{uid}-1\n")), "{out}");
    }
    // 0-2, and 3: the directory ls reads.
    assert!(out.contains("fds 0 1 2 3\n"), "{out}");
    let out = attach(&[
        "--tty",
        "--",
        "sh",
        "-c",
        "stat -c %U $(tty); echo fds $(ls /proc/self/fd)",
    ]);
    assert!(out.starts_with("nobody\n"), "{out}");
    assert!(out.contains("fds 0 1 2 3\n"), "{out}");
    let loaded = std::fs::read_to_string(&marker).unwrap_or_default();
    let nobody_ids = format!("{0} {0}", nobody.uid);
    assert!(
        loaded.lines().count() >= 2,
        "the sessions never loaded it: {loaded:?}"
    );
    assert!(
        loaded.lines().all(|l| l == nobody_ids),
        "loaded by another user (uid euid): {loaded}"
    );
}
