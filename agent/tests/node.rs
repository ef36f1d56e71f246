//! Registration and heartbeat: the Node is created Ready with capacity, fingerprint and
//! agent endpoint; the status owner written by the scheduler survives re-registration;
//! heartbeats are a stream that keeps the node's Lease (attached to a store lease) alive
//! without rewriting it; the Lease expires when the agent dies and comes back with it.

mod common;

use common::*;
use lattice_apis::{AllocationPhase, Node, NodeState};
use lattice_runtime::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_is_registered_ready_and_heartbeats() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(
        &server,
        "gpu-node",
        root.path(),
        &[
            "--cpu-cores",
            "72",
            "--memory-gb",
            "480",
            "--gpu-count",
            "4",
            "--gpu-type",
            "GH200",
            "--features",
            "nvme_scratch,gpu",
            "--topology-group",
            "3",
            "--gpu-topology",
            "nvlink-pairs",
        ],
    );
    let nodes = server.nodes();
    let node = wait_for("registration", LIMIT, || async {
        nodes
            .get("gpu-node")
            .await
            .ok()
            .filter(|n| n.status.as_ref().is_some_and(|s| s.agent.is_some()))
    })
    .await;
    let st = node.status.as_ref().unwrap();
    assert_eq!(st.state, NodeState::Ready);
    assert_eq!(st.capacity.cpu_cores, 72);
    assert_eq!(st.capacity.memory_gb, 480);
    assert_eq!(st.capacity.gpu_count, 4);
    assert_eq!(st.capacity.gpu_type.as_deref(), Some("GH200"));
    assert_eq!(st.capacity.gpus.len(), 4);
    // The topology the agent reports: NVLink pairs (0-1, 2-3) and PCIe across them, a NIC
    // per pair; GH200 is a superchip (one unified memory domain where sysfs has NUMA nodes).
    assert!(st.capacity.unified_memory);
    let t = st.capacity.gpu_topology.as_ref().expect("GPU topology");
    assert_eq!(t.links.len(), 6);
    assert!((t.link_fitness(4) - 64.0 / 450.0).abs() < 1e-9);
    assert_eq!(t.nic_affinity(4), 1.0);
    if let Some(m) = &st.capacity.memory_topology {
        assert_eq!(m.domains.len(), 1);
        assert_eq!(m.locality(), 1.0);
    }
    let fp = st.conformance_fingerprint.clone().unwrap();
    assert_eq!(fp.len(), 64);
    assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
    let agent_info = st.agent.clone().unwrap();
    assert!(agent_info.kernel_version.is_some_and(|k| !k.is_empty()));
    assert_eq!(
        agent_info.architecture.as_deref(),
        Some(std::env::consts::ARCH)
    );
    assert_eq!(node.spec.features, vec!["nvme_scratch", "gpu"]);
    assert_eq!(node.spec.topology_group, Some(3));

    // The agent's own endpoint answers at the published address.
    let address = agent_info.address.unwrap();
    let (http, base) = server.agent_http("gpu-node", &address);
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);

    // Heartbeats: a stream. The Lease is written once, attached to a store lease, and
    // the beats reach the server without rewriting it.
    let leases = server.leases();
    let first = wait_for("the Lease", LIMIT, || async {
        leases.get("gpu-node").await.ok()
    })
    .await;
    assert_eq!(first.spec.holder_identity.as_deref(), Some("gpu-node"));
    assert!(
        first
            .metadata
            .annotations
            .contains_key("lattice.dev/store-lease"),
        "{first:?}"
    );
    let seq = |l: &lattice_apis::Lease| -> u64 {
        l.metadata.annotations["lattice.dev/heartbeat-sequence"]
            .parse()
            .unwrap()
    };
    wait_for("beats on the stream", LIMIT, || async {
        (server.metric("lattice_apiserver_heartbeats_total").await >= 3.0).then_some(())
    })
    .await;
    assert_eq!(
        leases
            .get("gpu-node")
            .await
            .unwrap()
            .metadata
            .resource_version,
        first.metadata.resource_version,
        "a heartbeat is not a write"
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("lattice_agent_heartbeats_total"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("lattice_agent_heartbeats_total 0\n"),
        "{metrics}"
    );

    // The scheduler's status.owner survives a re-registration; a spec changed by the
    // operator is left alone. (The owner is a real running allocation, or the release
    // controller would rightly clear it.)
    let job = submit(
        &server,
        "big-job",
        "gpu-node",
        json!({"entrypoint": "sleep 600"}),
    )
    .await;
    wait_phase(&server, "big-job", AllocationPhase::Running).await;
    Api::<Node>::all(server.system_client())
        .patch_status(
            "gpu-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"owner": {
                "tenant": "default",
                "allocation": "big-job",
                "allocationUid": job.metadata.uid,
                "attempt": 1,
            }}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "gpu-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"features": ["nvme_scratch"]}})),
        )
        .await
        .unwrap();
    let s_before = seq(&leases.get("gpu-node").await.unwrap());
    agent.restart();
    let node = wait_for("re-registration", LIMIT, || async {
        nodes.get("gpu-node").await.ok().filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.agent.as_ref())
                .and_then(|a| a.address.as_ref())
                .is_some_and(|a| *a != address)
        })
    })
    .await;
    let owner = node.status.as_ref().unwrap().owner.clone().unwrap();
    assert_eq!(owner.allocation.as_deref(), Some("big-job"));
    assert_eq!(node.spec.features, vec!["nvme_scratch"]);
    assert_eq!(node.status.as_ref().unwrap().state, NodeState::Ready);
    wait_for("a higher sequence after restart", LIMIT, || async {
        leases
            .get("gpu-node")
            .await
            .ok()
            .filter(|l| seq(l) > s_before)
    })
    .await;
}

/// The heartbeat Lease lives exactly as long as the agent's heartbeats: the store deletes
/// it one TTL after the agent dies (the node goes Degraded), a restarted agent brings it
/// back (Ready), and a replayed stream is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_lease_follows_the_agent() {
    let server = Server::start_with(&["--heartbeat-timeout", "2s", "--node-grace-period", "60s"]);
    let root = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&server, "hb-node", root.path(), &[]);
    let nodes = server.nodes();
    let leases = server.leases();
    wait_node_state(&nodes, "hb-node", NodeState::Ready).await;
    let before = wait_for("the Lease", LIMIT, || async {
        leases.get("hb-node").await.ok()
    })
    .await;
    // Healthy for several TTLs: the Lease stays, the node stays Ready.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let still = leases.get("hb-node").await.unwrap();
    assert_eq!(still.metadata.uid, before.metadata.uid);
    assert_eq!(
        nodes.get("hb-node").await.unwrap().status.unwrap().state,
        NodeState::Ready
    );

    agent.kill9();
    wait_for("the Lease to expire", LIMIT, || async {
        leases
            .get("hb-node")
            .await
            .err()
            .filter(|e| e.is_not_found())
    })
    .await;
    let degraded = wait_node_state(&nodes, "hb-node", NodeState::Degraded).await;
    assert!(
        degraded
            .status
            .as_ref()
            .unwrap()
            .last_heartbeat_time
            .is_some(),
        "{degraded:?}"
    );

    // A stream opened with an old sequence number is a replay: 409, nothing written.
    let seq: u64 = before.metadata.annotations["lattice.dev/heartbeat-sequence"]
        .parse()
        .unwrap();
    let url = format!(
        "{}/apis/lattice.dev/v1alpha1/nodes/hb-node/heartbeat?sequence={seq}",
        server.tls_url
    );
    // Only the node itself sends its heartbeats: its certificate.
    let pki = agent.state_dir.join("pki");
    let tls = lattice_pki::client_config(
        &std::fs::read_to_string(server.ca_file()).unwrap(),
        Some((
            &std::fs::read_to_string(pki.join("node.crt")).unwrap(),
            &std::fs::read_to_string(pki.join("node.key")).unwrap(),
        )),
    )
    .unwrap();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .unwrap();
    // Not even an admin may.
    let admin = reqwest::Client::new()
        .post(format!(
            "{}/apis/lattice.dev/v1alpha1/nodes/hb-node/heartbeat?sequence={}",
            server.url,
            seq + 1000
        ))
        .bearer_auth(&server.token)
        .header("connection", "upgrade")
        .header("upgrade", "lattice-heartbeat/1")
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status().as_u16(), 403);
    // Not an upgrade request: 400 saying what to send.
    let plain = http.post(&url).send().await.unwrap();
    assert_eq!(plain.status().as_u16(), 400);
    assert!(plain.text().await.unwrap().contains("lattice-heartbeat/1"));
    let replay = http
        .post(&url)
        .header("connection", "upgrade")
        .header("upgrade", "lattice-heartbeat/1")
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status().as_u16(), 409);
    let msg = replay.text().await.unwrap();
    assert!(msg.contains("second agent"), "{msg}");
    assert!(leases.get("hb-node").await.is_err());

    agent.restart();
    let back = wait_for("the Lease again", LIMIT, || async {
        leases.get("hb-node").await.ok()
    })
    .await;
    assert!(
        back.metadata.annotations["lattice.dev/heartbeat-sequence"]
            .parse::<u64>()
            .unwrap()
            > seq
    );
    wait_node_state(&nodes, "hb-node", NodeState::Ready).await;
}

/// Wait until node `name` is in `want`.
async fn wait_node_state(
    nodes: &lattice_runtime::Api<lattice_apis::Node>,
    name: &str,
    want: NodeState,
) -> lattice_apis::Node {
    wait_for(&format!("{name} {want:?}"), LIMIT, || async {
        nodes
            .get(name)
            .await
            .ok()
            .filter(|n| n.status.as_ref().is_some_and(|s| s.state == want))
    })
    .await
}
