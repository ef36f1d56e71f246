//! A hostile tenant on a root agent: each test performs an attack an ordinary user could
//! try and checks that it fails — the user's environment never reaches a root process,
//! planted symlinks are never followed, work runs only as an allowed account, resource
//! limits hold (memory, pids, GPU devices), and nothing the scheduler did not bind runs.
//!
//! The tests need root (the agent must be able to switch users and use cgroups) and
//! create one ordinary local user, `lattice-tenant` (uid >= 1000, no home directory),
//! with `useradd` on first use; without root they skip themselves.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::*;
use lattice_apis::lifecycle::CANCEL_ANNOTATION;
use lattice_apis::{AllocationPhase, NodeTaskPhase, Tenant};
use lattice_runtime::{Patch, PatchParams, PostParams};
use serde_json::json;

/// Root and the test user, or `None` (the test is skipped).
fn hostile_setup() -> Option<nix::unistd::User> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return None;
    }
    if !cgroups_usable() {
        eprintln!("skipped: needs writable cgroups");
        return None;
    }
    test_user()
}

/// A directory every user may enter and read (the agent's state dir must be reachable
/// by the job's user).
fn open_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn user_meta(user: &str) -> serde_json::Value {
    json!({"annotations": {"lattice.dev/user": user}})
}

/// The first recorded run of the agent's state file: (shim pid, cgroup directories).
fn recorded_run(agent: &Agent) -> Option<(i32, Vec<PathBuf>)> {
    let state = agent.state();
    let t = state["tasks"].as_object()?.values().next()?.clone();
    let shim = t["shimPid"].as_i64()? as i32;
    let groups = t["cgroups"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(PathBuf::from))
                .collect()
        })
        .unwrap_or_default();
    Some((shim, groups))
}

async fn cancel(server: &Server, tenant: &str, name: &str) {
    server
        .allocations_in(tenant)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {CANCEL_ANNOTATION: "true"}}})),
        )
        .await
        .unwrap();
}

/// `LD_PRELOAD` (and the loader's other variables) in `spec.env` reach only the user's
/// own processes: the shim, which runs as root until it starts the workload, gets an
/// environment the agent builds from scratch (`PATH` alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_in_spec_env_never_reaches_a_root_process() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let root = open_dir();
    let tools = open_dir();
    let marks = open_dir();
    std::fs::set_permissions(marks.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = marks.path().join("loaded");
    let lib = build_preload(tools.path(), &marker);
    let agent = Agent::start(&server, "node-a", root.path(), &[]);
    create_with(
        &server,
        "preload",
        json!({
            "entrypoint": "id -u; sleep 300",
            "env": {
                "LD_PRELOAD": lib.display().to_string(),
                "LD_LIBRARY_PATH": tools.path().display().to_string(),
                "GCONV_PATH": tools.path().display().to_string(),
            },
        }),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "preload", &["node-a"], Some(600)).await;
    wait_phase(&server, "preload", AllocationPhase::Running).await;
    let (shim, _) = wait_for("the run's record", LIMIT, || async { recorded_run(&agent) }).await;
    // The user's processes did load it (so the marker would show a root process too).
    let uid = user.uid.as_raw();
    let lines = wait_for("the workload to load the library", LIMIT, || async {
        std::fs::read_to_string(&marker)
            .ok()
            .filter(|m| m.contains(&format!("{uid} {uid}")))
    })
    .await;
    let root_lines: Vec<&str> = lines
        .lines()
        .filter(|l| *l != format!("{uid} {uid}"))
        .collect();
    assert!(
        root_lines.is_empty(),
        "the preload library ran in another process (uid euid): {lines}"
    );
    // The shim's own environment: PATH and nothing else.
    let environ = std::fs::read(format!("/proc/{shim}/environ")).expect("shim environ");
    let vars: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    assert_eq!(vars.len(), 1, "{vars:?}");
    assert!(vars[0].starts_with("PATH="), "{vars:?}");
    cancel(&server, "default", "preload").await;
    wait_phase(&server, "preload", AllocationPhase::Cancelled).await;
    let lines = std::fs::read_to_string(&marker).unwrap_or(lines);
    for l in lines.lines() {
        assert_eq!(
            l,
            format!("{uid} {uid}"),
            "the preload library ran in another process (uid euid): {lines}"
        );
    }
}

/// The user owns their scratch directory, so they can plant a symlink where the agent
/// used to write the job's script. The agent writes job files only in its own run
/// directory, through directory descriptors with O_NOFOLLOW|O_EXCL; a root-owned file
/// the link points at stays as it was. Cleaning up the scratch directory does not follow
/// a link the job left there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_planted_in_scratch_are_never_followed() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let root = open_dir();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("secret");
    std::fs::write(&target, "untouched\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let keep_dir = outside.path().join("keep");
    std::fs::create_dir(&keep_dir).unwrap();
    std::fs::write(keep_dir.join("file"), "kept\n").unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _agent = Agent::start(&server, "node-a", root.path(), &[]);
    let a = create_with(
        &server,
        "planted",
        json!({"script": format!("#!/bin/sh\nln -s {} \"$LATTICE_SCRATCH/link\"\necho ran\n", keep_dir.display())}),
        user_meta(&user.name),
    )
    .await;
    // The user wins the race: their scratch directory already holds a link where the
    // script used to go.
    let uid = a.metadata.uid.clone().unwrap();
    let scratch = root.path().join("node-a/scratch").join(format!("{uid}-1"));
    std::fs::create_dir_all(&scratch).unwrap();
    std::os::unix::fs::symlink(&target, scratch.join("lattice-script")).unwrap();
    std::os::unix::fs::lchown(&scratch, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
    bind(&server, "planted", &["node-a"], Some(600)).await;
    let done = wait_terminal(&server, "planted").await;
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "untouched\n",
        "the agent wrote through the planted link"
    );
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    assert_eq!(
        done.phase(),
        AllocationPhase::Completed,
        "{:?}",
        done.status
    );
    assert_eq!(server.logs("planted", "").await.1, "ran\n");
    wait_for("the scratch directory to go", LIMIT, || async {
        (!scratch.exists()).then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(keep_dir.join("file")).unwrap(),
        "kept\n"
    );
}

/// Work never runs as root or a system account (uid below `--min-uid`, 1000 by
/// default) unless the tenant's `spec.runAs.allowUsers` lists the account — also when
/// `--unknown-user=agent` would run it as a root agent's own user; and an allocation
/// that names no user is refused by a root agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_and_system_accounts_run_only_where_the_tenant_allows_them() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let tenant: Tenant = serde_json::from_value(json!({
        "apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "hostile"}, "spec": {}
    }))
    .unwrap();
    server
        .tenants()
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let root = open_dir();
    let _agent = Agent::start(&server, "node-a", root.path(), &["--unknown-user", "agent"]);
    let daemon = nix::unistd::User::from_name("daemon")
        .unwrap()
        .expect("user daemon");
    let cases = [
        ("as-daemon", "daemon"),
        ("as-ghost", "no-such-user-lattice-test"),
    ];
    let api = server.allocations_in("hostile");
    for (name, who) in cases {
        create_in(
            &server,
            "hostile",
            name,
            json!({"entrypoint": "id -u"}),
            user_meta(who),
        )
        .await;
        bind_in(&server, "hostile", name, &["node-a"], Some(600)).await;
        let a = wait_for(&format!("{name} to end"), LIMIT, || async {
            api.get(name).await.ok().filter(|a| a.phase().is_terminal())
        })
        .await;
        let st = a.status.clone().unwrap();
        assert_eq!(a.phase(), AllocationPhase::Failed, "{st:#?}");
        assert_eq!(st.reason.as_deref(), Some("not_permitted"), "{st:#?}");
        let n = node_state(&a, "node-a");
        assert_eq!(n.reason.as_deref(), Some("NotPermitted"));
        assert!(n.pid.is_none(), "nothing may run: {n:?}");
        let msg = n.message.clone().unwrap_or_default();
        assert!(
            msg.contains("--min-uid") && msg.contains("spec.runAs.allowUsers"),
            "{msg}"
        );
        if who == "daemon" {
            assert!(msg.contains(&format!("uid {}", daemon.uid)), "{msg}");
        } else {
            assert!(
                msg.contains("root") && msg.contains("--unknown-user=agent"),
                "{msg}"
            );
        }
    }
    // No user at all (a store written behind the API; admission always sets one).
    create_in(
        &server,
        "hostile",
        "nobody-named",
        json!({"entrypoint": "id -u"}),
        user_meta(&user.name),
    )
    .await;
    // (Only a system identity could: people never change whom work runs as.)
    server
        .system_allocations_in("hostile")
        .patch(
            "nobody-named",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"lattice.dev/user": null}}})),
        )
        .await
        .unwrap();
    bind_in(&server, "hostile", "nobody-named", &["node-a"], Some(600)).await;
    let a = wait_for("nobody-named to end", LIMIT, || async {
        api.get("nobody-named")
            .await
            .ok()
            .filter(|a| a.phase().is_terminal())
    })
    .await;
    let n = node_state(&a, "node-a");
    assert_eq!(n.reason.as_deref(), Some("NotPermitted"), "{n:?}");
    assert!(
        n.message
            .as_deref()
            .unwrap_or_default()
            .contains("names no user"),
        "{n:?}"
    );

    // An ordinary user runs; the admin's policy lets daemon and root through.
    create_in(
        &server,
        "hostile",
        "as-user",
        json!({"entrypoint": "id -u"}),
        user_meta(&user.name),
    )
    .await;
    bind_in(&server, "hostile", "as-user", &["node-a"], Some(600)).await;
    server
        .tenants()
        .patch(
            "hostile",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runAs": {"allowUsers": ["daemon", "root"]}}})),
        )
        .await
        .unwrap();
    for (name, who, uid) in [
        ("allowed-daemon", "daemon", daemon.uid.as_raw()),
        ("allowed-root", "no-such-user-lattice-test", 0),
    ] {
        create_in(
            &server,
            "hostile",
            name,
            json!({"entrypoint": "id -u"}),
            user_meta(who),
        )
        .await;
        bind_in(&server, "hostile", name, &["node-a"], Some(600)).await;
        let a = wait_for(&format!("{name} to end"), LIMIT, || async {
            api.get(name).await.ok().filter(|a| a.phase().is_terminal())
        })
        .await;
        assert_eq!(a.phase(), AllocationPhase::Completed, "{:#?}", a.status);
        let (_, out) = logs_in(&server, "hostile", name).await;
        assert_eq!(out.trim(), uid.to_string());
    }
    let a = wait_for("as-user to end", LIMIT, || async {
        api.get("as-user")
            .await
            .ok()
            .filter(|a| a.phase().is_terminal())
    })
    .await;
    assert_eq!(a.phase(), AllocationPhase::Completed, "{:#?}", a.status);
}

async fn logs_in(server: &Server, tenant: &str, name: &str) -> (u16, String) {
    let url = format!(
        "{}/apis/lattice.dev/v1alpha1/namespaces/{tenant}/allocations/{name}/log",
        server.url
    );
    let r = reqwest::Client::new()
        .get(url)
        .bearer_auth(&server.token)
        .send()
        .await
        .expect("log request");
    let code = r.status().as_u16();
    (code, r.text().await.unwrap_or_default())
}

/// A job that allocates more memory than its node's allocatable share (capacity less
/// `--system-reserved`) is killed by the kernel at the limit and ends `OutOfMemory`,
/// the limit in the message; a job on another node keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_ends_out_of_memory_and_its_neighbour_keeps_running() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let root = open_dir();
    let _small = Agent::start(
        &server,
        "node-small",
        root.path(),
        &["--memory-gb", "1", "--system-reserved", "memory=768Mi"],
    );
    let _calm = Agent::start(&server, "node-calm", root.path(), &[]);
    create_with(
        &server,
        "neighbour",
        json!({"entrypoint": "sleep 300"}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "neighbour", &["node-calm"], Some(600)).await;
    let n = wait_phase(&server, "neighbour", AllocationPhase::Running).await;
    let neighbour_pid = node_state(&n, "node-calm").pid.unwrap() as i32;
    create_with(
        &server,
        "hog",
        json!({
            "entrypoint": "/bin/dd",
            "args": ["if=/dev/zero", "of=/dev/null", "bs=512M", "count=1"],
            "requeue": {"policy": "never"},
        }),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "hog", &["node-small"], Some(600)).await;
    let hog = wait_phase(&server, "hog", AllocationPhase::Failed).await;
    let st = hog.status.clone().unwrap();
    assert_eq!(st.reason.as_deref(), Some("out_of_memory"), "{st:#?}");
    let r = node_state(&hog, "node-small");
    assert_eq!(r.reason.as_deref(), Some("OutOfMemory"), "{r:?}");
    assert_eq!(r.signal, Some(9), "{r:?}");
    let msg = r.message.clone().unwrap_or_default();
    assert!(msg.contains("256 MiB"), "{msg}");
    assert!(
        st.message
            .as_deref()
            .unwrap_or_default()
            .contains("256 MiB"),
        "{st:#?}"
    );
    assert_eq!(
        server.allocations().get("neighbour").await.unwrap().phase(),
        AllocationPhase::Running
    );
    assert!(pid_alive(neighbour_pid), "the neighbour was hit");
    cancel(&server, "default", "neighbour").await;
    wait_phase(&server, "neighbour", AllocationPhase::Cancelled).await;
}

/// A fork bomb stops at the pids limit (here 64: `--max-pids 64` with nothing reserved)
/// and is gone once the job is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stops_at_the_pids_limit() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let root = open_dir();
    let agent = Agent::start(&server, "node-a", root.path(), &["--max-pids", "64"]);
    create_with(
        &server,
        "bomb",
        json!({"script": "#!/bin/sh\nbomb() { bomb | bomb & }\nbomb\nwhile :; do sleep 1; done\n"}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "bomb", &["node-a"], Some(600)).await;
    wait_phase(&server, "bomb", AllocationPhase::Running).await;
    let (_, groups) = wait_for("the run's cgroups", LIMIT, || async {
        recorded_run(&agent).filter(|(_, g)| !g.is_empty())
    })
    .await;
    let pids = groups
        .iter()
        .find(|g| g.join("pids.max").exists())
        .expect("a pids cgroup")
        .clone();
    assert_eq!(
        std::fs::read_to_string(pids.join("pids.max"))
            .unwrap()
            .trim(),
        "64"
    );
    // The limit was reached (forks refused) and never passed.
    let start = Instant::now();
    wait_for("the bomb to reach the limit", LIMIT, || async {
        let events = std::fs::read_to_string(pids.join("pids.events")).unwrap_or_default();
        let refused = events
            .lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let current: u64 = std::fs::read_to_string(pids.join("pids.current"))
            .ok()
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(0);
        assert!(current <= 64, "{current} processes in the job");
        (refused > 0).then_some(())
    })
    .await;
    eprintln!("limit reached after {:?}", start.elapsed());
    cancel(&server, "default", "bomb").await;
    let a = wait_phase(&server, "bomb", AllocationPhase::Cancelled).await;
    assert_eq!(node_state(&a, "node-a").phase, NodeTaskPhase::Failed);
    assert!(
        groups.iter().all(|g| !g.exists()),
        "cgroups left: {groups:?}"
    );
}

/// A job uses only its node's GPU device nodes: the device dir here holds two fake GPUs
/// (character devices of an unassigned major, so an allowed open fails with ENXIO and
/// a denied one with EPERM) and nvidiactl; the node has GPU 0, GPU 1 belongs to
/// another node on the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_device_nodes_of_other_gpus_are_denied() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let root = open_dir();
    let dev = open_dir();
    fake_gpus(dev.path());
    let dev_dir = dev.path().display().to_string();
    let _agent = Agent::start(
        &server,
        "node-a",
        root.path(),
        &["--device-dir", &dev_dir, "--gpu-devices", "0"],
    );
    create_with(
        &server,
        "gpus",
        json!({"script": format!(
            "#!/bin/sh\nfor d in nvidia0 nvidia1 nvidiactl; do e=$(head -c1 {dev_dir}/$d 2>&1 >/dev/null); echo \"$d: ${{e##*: }}\"; done\n"
        )}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "gpus", &["node-a"], Some(600)).await;
    wait_phase(&server, "gpus", AllocationPhase::Completed).await;
    let (_, out) = server.logs("gpus", "").await;
    assert_eq!(
        out,
        "nvidia0: No such device or address\nnvidia1: Operation not permitted\nnvidiactl: No such device or address\n",
        "{out}"
    );
}

/// An allocation whose status names this node without the node's ownership (a store
/// written behind the API, or a `/status` write that got through) is refused and runs
/// nothing; the allocation that owns the node keeps running. A job step runs only on a
/// node its own allocation owns, in the same tenant, for the same user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_the_scheduler_did_not_bind_is_refused() {
    let Some(user) = hostile_setup() else { return };
    let server = Server::start();
    let root = open_dir();
    let marks = open_dir();
    std::fs::set_permissions(marks.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let _a = Agent::start(&server, "node-a", root.path(), &[]);
    let legit = create_with(
        &server,
        "legit",
        json!({"entrypoint": "sleep 300"}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "legit", &["node-a"], Some(600)).await;
    let l = wait_phase(&server, "legit", AllocationPhase::Running).await;
    let legit_pid = node_state(&l, "node-a").pid.unwrap() as i32;

    let ran = marks.path().join("ran");
    let touch = json!({"entrypoint": format!("touch {}-$LATTICE_JOB_NAME", ran.display())});
    // Not bound at all.
    create_with(&server, "intruder", touch.clone(), user_meta(&user.name)).await;
    bind_status_only(&server, "default", "intruder", &["node-a"], Some(600)).await;
    {
        let name = "intruder";
        let a = wait_terminal(&server, name).await;
        let n = node_state(&a, "node-a");
        assert_eq!(n.reason.as_deref(), Some("NotBound"), "{name}: {n:?}");
        assert!(n.pid.is_none(), "{name}: {n:?}");
        let msg = n.message.clone().unwrap_or_default();
        assert!(msg.contains("status.owner"), "{name}: {msg}");
        assert_eq!(
            a.status.as_ref().unwrap().reason.as_deref(),
            Some("not_bound")
        );
    }
    // A job step of the owner (bound by the step controller, as `srun` inside the job
    // would have it) runs beside it. (Steps that do not match the node's owner are
    // refused the same way; the unit tests of `binding` go through each field.)
    let mut step_spec = touch;
    step_spec["stepOf"] = json!("legit");
    step_spec["requeue"] = json!({"policy": "never"});
    let meta = json!({
        "ownerReferences": [{
            "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
            "name": "legit", "uid": legit.metadata.uid, "controller": true,
        }],
        "annotations": {"lattice.dev/user": user.name},
    });
    create_with(&server, "legit.1", step_spec, meta).await;
    wait_phase(&server, "legit.1", AllocationPhase::Completed).await;
    assert!(Path::new(&format!("{}-legit.1", ran.display())).exists());
    assert!(!Path::new(&format!("{}-intruder", ran.display())).exists());
    // The owner was not disturbed.
    assert_eq!(
        server.allocations().get("legit").await.unwrap().phase(),
        AllocationPhase::Running
    );
    assert!(pid_alive(legit_pid));
}
