//! Running as the submitting user (when the agent is root) and cgroup v2 groups (when
//! the host offers a writable hierarchy). Each test skips itself where the machine
//! cannot do what it checks.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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

/// A writable cgroup v2 mount, if the machine has one.
fn cgroup2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| {
            p.join("cgroup.controllers").exists() && {
                let probe = p.join(format!("lattice-test-probe-{}", std::process::id()));
                let ok = std::fs::create_dir(&probe).is_ok();
                let _ = std::fs::remove_dir(&probe);
                ok
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_holds_the_workload_and_kills_escapees() {
    let Some(cg_root) = cgroup2_root() else {
        eprintln!("skipped: no writable cgroup v2 hierarchy");
        return;
    };
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let node = format!("cg-{}", std::process::id());
    let cg_flag = cg_root.display().to_string();
    let _agent = Agent::start(&server, &node, root.path(), &["--cgroup-root", &cg_flag]);
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
    let group = format!("/lattice/{node}/{uid}-1");
    assert!(out.contains(&group), "{out}");
    let escaped: i32 = out
        .lines()
        .find_map(|l| l.strip_prefix("escaped "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(!pid_alive(escaped), "the escaped daemon survived");
    let dir: PathBuf = Path::new(&cg_root).join(group.trim_start_matches('/'));
    wait_for("the cgroup to go", LIMIT, || async {
        (!dir.exists()).then_some(())
    })
    .await;
}
