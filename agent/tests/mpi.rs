//! MPI job steps through the agents' PMI server, with real MPICH (PMI-1, its built-in
//! client), Slurm's libpmi2 (PMI-2), real agents with node certificates and the PMI
//! fence between them over gRPC with mutual TLS: hello worlds across two agents, a rank
//! that dies or aborts tearing the step down on every node, and the per-task
//! environment (torchrun's rendezvous variables, GPU binding with fake GPUs).
//!
//! Needs `mpicc.mpich` (Debian `libmpich-dev`), `libpmi2-0-dev` and `python3`:
//! `hack/install-deps.sh` installs them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use lattice_apis::{Allocation, AllocationPhase};
use serde_json::{json, Value};

/// Compile one of `tests/mpi/` into `dir` (MPI programs with MPICH).
fn build(dir: &Path, source: &str, out: &str) -> PathBuf {
    build_with(dir, source, out, "mpicc.mpich")
}

/// Compile one of `tests/mpi/` into `dir`, MPI programs with `mpicc`.
fn build_with(dir: &Path, source: &str, out: &str, mpicc: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mpi")
        .join(source);
    let bin = dir.join(out);
    let (cc, libs): (&str, &[&str]) = if source.starts_with("pmi2") {
        ("cc", &["-lpmi2"])
    } else {
        (mpicc, &[])
    };
    let made = Command::new(cc)
        .arg("-O2")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .args(libs)
        .status()
        .unwrap_or_else(|e| panic!("{cc} not found ({e}): run hack/install-deps.sh"));
    assert!(made.success(), "{cc} {} failed", src.display());
    bin
}

/// What `tests/mpi/hello.c` prints with `n` ranks, sorted.
fn hellos(n: u32) -> Vec<String> {
    let sum: u32 = (0..n).sum();
    (0..n)
        .map(|r| format!("hello rank={r} size={n} sum={sum}"))
        .collect()
}

/// A parent allocation `job` running on `nodes`.
async fn parent(server: &Server, nodes: &[&str]) {
    create(server, "job", json!({"entrypoint": "sleep 600"})).await;
    bind(server, "job", nodes, Some(600)).await;
    wait_phase(server, "job", AllocationPhase::Running).await;
}

/// A step of `job` named `name` with `ntasks` tasks running `spec`.
async fn step(server: &Server, name: &str, ntasks: u32, per_node: Option<u32>, mut spec: Value) {
    let p = server.allocations().get("job").await.expect("parent");
    spec["stepOf"] = json!("job");
    spec["requeue"] = json!({"policy": "never"});
    spec["resources"] = json!({"nodes": p.status.as_ref().map_or(1, |s| s.assigned_nodes.len())});
    spec["env"]["HWLOC_COMPONENTS"] = json!("-gl");
    let mut ann = json!({
        "lattice.dev/user": p.metadata.annotations.get("lattice.dev/user"),
        "lattice.dev/ntasks": ntasks.to_string(),
    });
    if let Some(k) = per_node {
        ann["lattice.dev/ntasks-per-node"] = json!(k.to_string());
    }
    let meta = json!({
        "ownerReferences": [{
            "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
            "name": "job", "uid": p.metadata.uid, "controller": true,
        }],
        "annotations": ann,
    });
    create_with(server, name, spec, meta).await;
}

async fn output(server: &Server, name: &str) -> Vec<String> {
    let (code, text) = server.logs(name, "").await;
    assert_eq!(code, 200, "{text}");
    // Each line comes as `<node>| <text>` from a step on several nodes.
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| l.split_once("| ").map_or(l, |(_, t)| t).to_string())
        .collect();
    lines.sort();
    lines
}

/// Wait for step `name` to end; on a timeout, say where it stood and what the agents
/// logged.
async fn ended(server: &Server, name: &str, agents: &[&Agent]) -> Allocation {
    let api = server.allocations();
    let limit = std::time::Instant::now() + LIMIT;
    loop {
        let a = api.get(name).await.expect("get step");
        if a.phase().is_terminal() {
            return a;
        }
        if std::time::Instant::now() > limit {
            let logs: Vec<String> = agents.iter().map(|a| a.log()).collect();
            panic!(
                "{name} did not end: {:?}\n{}",
                a.status,
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Wait for step `name` to complete; its output lines (sorted). A step that fails says
/// how, with its output.
async fn completed(server: &Server, name: &str, agents: &[&Agent]) -> Vec<String> {
    let s = ended(server, name, agents).await;
    let lines = output(server, name).await;
    let logs: Vec<String> = agents.iter().map(|a| a.log()).collect();
    assert_eq!(
        s.phase(),
        AllocationPhase::Completed,
        "{:?}\n{lines:?}\n{}",
        s.status,
        logs.join("\n----\n")
    );
    lines
}

/// An API server and two agents, `node-a` and `node-b`, each in its own network
/// namespace (as root; on loopback otherwise): "another node" is another network stack,
/// reached over a bridge, for the PMI fence and for the ranks' own traffic.
struct Cluster {
    a: Agent,
    b: Agent,
    /// More agents (`node-c`, ...) when asked for.
    more: Vec<Agent>,
    server: Server,
    lab: Option<NetLab>,
}

fn cluster(extra: &[&str]) -> (Cluster, tempfile::TempDir) {
    cluster_of(2, extra)
}

/// [`cluster`] with `n` (at least 2) agents.
fn cluster_of(n: usize, extra: &[&str]) -> (Cluster, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let lab = NetLab::new(n);
    let server = match &lab {
        Some(l) => Server::start_serving_agents_on(&l.host_ip(), &[]),
        None => Server::start(),
    };
    let agent = |i: usize, node: &str| {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if let Some(l) = &lab {
            args.extend(["--listen".to_string(), format!("{}:0", l.node_ip(i))]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let ns = lab.as_ref().map(|l| l.netns(i));
        Agent::start_in(&server, node, root.path(), &args, ns.as_deref())
    };
    let (a, b) = (agent(0, "node-a"), agent(1, "node-b"));
    let more = (2..n)
        .map(|i| agent(i, &format!("node-{}", (b'a' + i as u8) as char)))
        .collect();
    (
        Cluster {
            a,
            b,
            more,
            server,
            lab,
        },
        root,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_runs_over_a_tree_above_the_fan_in() {
    // Fan-in 1 over three nodes: node-c reports to node-b, node-b to node-a; every put
    // still reaches every rank.
    let bins = tempfile::tempdir().unwrap();
    let hello = build(bins.path(), "hello.c", "hello");
    let (c, _root) = cluster_of(3, &["--pmi-fan-in", "1"]);
    let server = &c.server;
    parent(server, &["node-a", "node-b", "node-c"]).await;
    step(
        server,
        "job.0",
        6,
        None,
        json!({"entrypoint": hello.display().to_string(), "args": [], "launch": {"mpi": "pmi2"}}),
    )
    .await;
    let agents: Vec<&Agent> = [&c.a, &c.b].into_iter().chain(&c.more).collect();
    let lines = completed(server, "job.0", &agents).await;
    assert_eq!(lines, hellos(6));
}

/// OpenMPI 4.1 (Debian's, on OpenPMIx 4.2) launched directly by the agents: each
/// node's PMIx sidecar serves its ranks, and the fence (OpenMPI's modex) crosses the
/// nodes through the agents' exchange; then `MPI_Abort` tears the step down.
#[cfg(feature = "pmix")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmpi_ranks_wire_up_through_pmix_across_two_agents() {
    let bins = tempfile::tempdir().unwrap();
    let hello = build_with(bins.path(), "hello.c", "hello-ompi", "mpicc.openmpi");
    let (c, _root) = cluster(&[]);
    let (server, a, b) = (&c.server, &c.a, &c.b);
    parent(server, &["node-a", "node-b"]).await;
    let env = json!({
        // TCP only, no fabric probing: the test's "nodes" share one machine's host name
        // and /dev/shm, where OpenMPI's shared-memory segments of the two nodes would
        // collide (real nodes have their own).
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl": "self,tcp",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    });
    step(
        server,
        "job.0",
        4,
        None,
        json!({"entrypoint": hello.display().to_string(), "args": [],
               "launch": {"mpi": "pmix"}, "env": env}),
    )
    .await;
    let lines = completed(server, "job.0", &[a, b]).await;
    assert_eq!(lines, hellos(4));

    // MPI_Abort reaches the sidecar as PMIx_Abort, and a rank killed in the middle is seen
    // when its connection drops: either way the step ends on both nodes, at once.
    for (n, mode, why) in [
        (1, "abort", "rank 3 on node node-b called PMIx_Abort"),
        (
            2,
            "crash",
            "rank 3 on node node-b ended without PMIx finalize",
        ),
    ] {
        let name = format!("job.{n}");
        step(
            server,
            &name,
            4,
            None,
            json!({"entrypoint": hello.display().to_string(), "args": [mode],
                   "launch": {"mpi": "pmix"}, "env": env}),
        )
        .await;
        torn_down(server, &name, why, &[a, b]).await;
    }
}

/// Step `name` failed, each node saying `why`, the first with reason MpiAborted (the
/// step fails with the first node's report; the other's follows).
async fn torn_down(server: &Server, name: &str, why: &str, agents: &[&Agent]) {
    let (a, b) = (agents[0], agents[1]);
    // Without the teardown, the other ranks would wait in MPI_Barrier until the walltime.
    let s = ended(server, name, agents).await;
    assert_eq!(s.phase(), AllocationPhase::Failed, "{why}: {:?}", s.status);
    let api = server.allocations();
    let s = wait_for("both nodes' reports", LIMIT, || async {
        api.get(name).await.ok().filter(|s| {
            ["node-a", "node-b"].iter().all(|n| {
                s.status
                    .as_ref()
                    .and_then(|st| st.node_states.get(*n))
                    .is_some_and(|st| st.phase.is_terminal())
            })
        })
    })
    .await;
    for node in ["node-a", "node-b"] {
        let st = node_state(&s, node);
        assert!(st.phase.is_terminal(), "{why}: {node}: {st:?}");
        let msg = st.message.clone().unwrap_or_default();
        assert!(
            msg.contains(why),
            "{node} says {msg:?}, not {why:?}\n{}\n{}",
            a.log(),
            b.log()
        );
    }
    assert_eq!(
        node_state(&s, "node-a").reason.as_deref(),
        Some("MpiAborted")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_and_libpmi2_ranks_wire_up_across_two_agents() {
    let bins = tempfile::tempdir().unwrap();
    let hello = build(bins.path(), "hello.c", "hello");
    let pmi2 = build(bins.path(), "pmi2_hello.c", "pmi2_hello");
    let (c, _root) = cluster(&[]);
    let (server, a, b) = (&c.server, &c.a, &c.b);
    parent(server, &["node-a", "node-b"]).await;

    // MPICH (PMI-1): 4 ranks, 2 per node; the fence crosses the nodes.
    step(
        server,
        "job.0",
        4,
        None,
        json!({"entrypoint": hello.display().to_string(), "args": [], "launch": {"mpi": "pmi2"}}),
    )
    .await;
    let lines = completed(server, "job.0", &[a, b]).await;
    assert_eq!(lines, hellos(4));

    // libpmi2 (PMI-2), cyclic: rank r on node r mod 2; every rank reads every put.
    step(
        server,
        "job.1",
        4,
        None,
        json!({"entrypoint": pmi2.display().to_string(), "args": [],
               "launch": {"mpi": "pmi2", "distribution": "cyclic"}}),
    )
    .await;
    let lines = completed(server, "job.1", &[a, b]).await;
    assert_eq!(
        lines,
        (0..4)
            .map(|r| format!("pmi2 rank={r} size=4 jobid=job.1 mapping=(vector,(0,2,1)) spawned=0"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_dies_or_aborts_tears_the_step_down_on_every_node() {
    let bins = tempfile::tempdir().unwrap();
    let hello = build(bins.path(), "hello.c", "hello");
    let (c, _root) = cluster(&[]);
    let (server, a, b) = (&c.server, &c.a, &c.b);
    parent(server, &["node-a", "node-b"]).await;

    for (n, mode, why) in [
        (
            0,
            "crash",
            "rank 3 on node node-b ended without PMI finalize",
        ),
        (
            1,
            "abort",
            "rank 3 on node node-b called MPI_Abort (exit code 7)",
        ),
    ] {
        let name = format!("job.{n}");
        step(
            server,
            &name,
            4,
            None,
            json!({"entrypoint": hello.display().to_string(), "args": [mode],
                   "launch": {"mpi": "pmi2"}}),
        )
        .await;
        torn_down(server, &name, why, &[a, b]).await;
    }
    assert_eq!(
        server.allocations().get("job").await.unwrap().phase(),
        AllocationPhase::Running,
        "the allocation outlives its failed steps"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_get_torchrun_variables_and_their_own_gpus() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/torch_env.py");
    let (c, _root) = cluster(&["--gpu-count", "4"]);
    let (server, a, b) = (&c.server, &c.a, &c.b);
    parent(server, &["node-a", "node-b"]).await;

    // The rendezvous a training script's env:// init does, across both nodes.
    step(
        server,
        "job.0",
        4,
        Some(2),
        json!({"entrypoint": "/usr/bin/python3", "args": [script.display().to_string()]}),
    )
    .await;
    let lines = completed(server, "job.0", &[a, b]).await;
    let master = lines
        .iter()
        .find_map(|l| {
            l.strip_prefix("rendezvous of 4 ranks at ")?
                .strip_suffix(" complete")
        })
        .unwrap_or_else(|| panic!("rank 0 saw every rank: {lines:?}\n{}\n{}", a.log(), b.log()))
        .to_string();
    if let Some(lab) = &c.lab {
        // Rank 0 listened in node-a's network namespace, and node-b's ranks reached it.
        assert_eq!(master.rsplit_once(':').unwrap().0, lab.node_ip(0));
    }
    let vars: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("LOCAL_RANK="))
        .collect();
    assert_eq!(vars.len(), 4, "{lines:?}");
    for (rank, node_rank, local) in [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)] {
        let want = format!(
            "LOCAL_RANK={local} LOCAL_WORLD_SIZE=2 MASTER_ADDR={} MASTER_PORT={} NODE_RANK={node_rank} RANK={rank} WORLD_SIZE=4",
            master.rsplit_once(':').unwrap().0,
            master.rsplit_once(':').unwrap().1
        );
        assert!(lines.contains(&want), "{want}\n{lines:?}");
    }

    // Two GPUs per task, two tasks per node: disjoint sets, in the node's order.
    step(
        server,
        "job.1",
        4,
        Some(2),
        json!({"entrypoint": "echo rank=$LATTICE_PROCID gpus=$CUDA_VISIBLE_DEVICES rocr=$ROCR_VISIBLE_DEVICES",
               "launch": {"gpusPerTask": 2}}),
    )
    .await;
    let lines = completed(server, "job.1", &[a, b]).await;
    assert_eq!(
        lines,
        [
            "rank=0 gpus=0,1 rocr=0,1",
            "rank=1 gpus=2,3 rocr=2,3",
            "rank=2 gpus=0,1 rocr=0,1",
            "rank=3 gpus=2,3 rocr=2,3"
        ]
    );

    // CPU binding: each task runs on its own share of the node's CPUs, and only there.
    step(
        server,
        "job.3",
        4,
        Some(2),
        json!({"entrypoint": "echo bound=$LATTICE_TASK_CPUS allowed=$(grep Cpus_allowed_list /proc/self/status | cut -f2)",
               "launch": {"cpuBind": "cores"}}),
    )
    .await;
    let lines = completed(server, "job.3", &[a, b]).await;
    assert_eq!(lines.len(), 4, "{lines:?}");
    for l in &lines {
        let (bound, allowed) = l
            .strip_prefix("bound=")
            .and_then(|r| r.split_once(" allowed="))
            .unwrap_or_else(|| panic!("{l}"));
        // The kernel writes ranges (`0-1`); one CPU per task on a two-CPU node.
        let expand = |list: &str| -> Vec<u32> {
            list.split(',')
                .flat_map(|r| match r.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
                    None => vec![r.parse().unwrap()],
                })
                .collect()
        };
        assert_eq!(expand(bound), expand(allowed), "{l}");
    }

    // More GPUs than the node has: the step fails to start, saying why.
    step(
        server,
        "job.2",
        2,
        None,
        json!({"entrypoint": "true", "launch": {"gpusPerTask": 8}}),
    )
    .await;
    let s: Allocation = ended(server, "job.2", &[a, b]).await;
    // The step fails with the first node's report, whichever node it came from.
    let msg = s
        .status
        .as_ref()
        .and_then(|st| st.message.clone())
        .unwrap_or_default();
    assert!(msg.contains("the node has 4"), "{msg}");
}
