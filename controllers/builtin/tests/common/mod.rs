//! Harness: a real embedded store in a tempdir, the built-in controllers on the
//! in-process transport, and a simulated agent that reports through the same contract as
//! `lattice-agent` (`lattice_apis::lifecycle::record_node_state`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lattice_apis::meta::now;
use lattice_apis::{
    lifecycle, Allocation, AllocationPhase, Lease, Node, NodeState, NodeTaskPhase, NodeTaskState,
    ObjectMeta, Tenant, VCluster,
};
use lattice_runtime::{
    AlwaysLeader, Api, Client, ControllerHost, ListParams, Patch, PatchParams, PostParams,
    ResourceExt,
};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::json;

pub struct Env {
    pub backend: Arc<dyn KvBackend>,
    pub client: Client,
    _dir: tempfile::TempDir,
    hosts: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for h in &self.hosts {
            h.abort();
        }
    }
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub async fn env() -> Env {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .expect("open store");
    let backend: Arc<dyn KvBackend> = Arc::new(store);
    let client = Client::in_process(backend.clone());
    Env {
        backend,
        client,
        _dir: dir,
        hosts: Vec::new(),
    }
}

impl Env {
    /// Start a controller host (another "scheduler replica" when called twice).
    pub fn start_controllers(&mut self, config: lattice_controllers::Config) {
        let mut host = ControllerHost::new(
            Client::in_process(self.backend.clone()),
            Arc::new(AlwaysLeader::new()),
        );
        lattice_runtime::gc::register(&mut host);
        let _m = lattice_controllers::register_all(&mut host, self.backend.clone(), config);
        self.hosts
            .push(tokio::spawn(host.run(std::future::pending())));
    }

    /// Stop every controller host (as on losing leadership).
    pub fn stop_controllers(&mut self) {
        for h in self.hosts.drain(..) {
            h.abort();
        }
    }

    pub fn allocations(&self, tenant: &str) -> Api<Allocation> {
        Api::namespaced(self.client.clone(), tenant)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub async fn tenant(&self, name: &str, max_nodes: Option<u32>) {
        let mut t = Tenant {
            metadata: ObjectMeta::named(name, None),
            ..Default::default()
        };
        t.spec.quota.max_nodes = max_nodes;
        Api::<Tenant>::all(self.client.clone())
            .create(&PostParams::default(), &t)
            .await
            .expect("tenant");
    }

    pub async fn vcluster(&self, tenant: &str, name: &str, scheduler: &str) {
        let v: VCluster = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": tenant},
            "spec": {"schedulerType": scheduler, "cycleInterval": "1s"},
        }))
        .expect("vcluster");
        Api::<VCluster>::namespaced(self.client.clone(), tenant)
            .create(&PostParams::default(), &v)
            .await
            .expect("vcluster");
    }

    /// Register a Ready node the way an agent does (create + status patch).
    pub async fn node(&self, name: &str, group: u32) {
        let mut n = Node {
            metadata: ObjectMeta::named(name, None),
            ..Default::default()
        };
        n.spec.topology_group = Some(group);
        self.nodes()
            .create(&PostParams::default(), &n)
            .await
            .expect("node");
        let patch = Patch::Merge(json!({"status": {
            "state": NodeState::Ready,
            "capacity": {"cpuCores": 4, "memoryGb": 16},
            "conformanceFingerprint": "abc",
        }}));
        self.nodes()
            .patch_status(name, &PatchParams::default(), &patch)
            .await
            .expect("node status");
    }

    pub async fn submit(
        &self,
        tenant: &str,
        name: &str,
        nodes: u32,
        extra: serde_json::Value,
    ) -> Allocation {
        let mut v = json!({
            "metadata": {"name": name, "namespace": tenant},
            "spec": {"entrypoint": "/bin/true", "resources": {"nodes": nodes}, "lifecycle": {"walltime": "10m"}},
        });
        merge(&mut v, extra);
        let a: Allocation = serde_json::from_value(v).expect("allocation");
        self.allocations(tenant)
            .create(&PostParams::default(), &a)
            .await
            .expect("create allocation")
    }

    pub async fn get(&self, tenant: &str, name: &str) -> Allocation {
        self.allocations(tenant).get(name).await.expect("get")
    }

    /// Poll until `pred` holds for the allocation.
    pub async fn wait_alloc(
        &self,
        tenant: &str,
        name: &str,
        what: &str,
        pred: impl Fn(&Allocation) -> bool,
    ) -> Allocation {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let a = self.allocations(tenant).get_opt(name).await.expect("get");
            if let Some(a) = &a {
                if pred(a) {
                    return a.clone();
                }
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for {tenant}/{name}: {what}; last: {:?}",
                    a.map(|a| a.status)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn wait_phase(&self, tenant: &str, name: &str, phase: AllocationPhase) -> Allocation {
        self.wait_alloc(tenant, name, phase.as_str(), |a| a.phase() == phase)
            .await
    }

    /// Simulated agent: report `phase` for `node` (attempt = current).
    pub async fn report(
        &self,
        tenant: &str,
        name: &str,
        node: &str,
        phase: NodeTaskPhase,
        exit: Option<i32>,
        reason: &str,
    ) {
        let api = self.allocations(tenant);
        api.update_status_with_retry(name, 20, |a| {
            let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or(0);
            let r = NodeTaskState {
                phase,
                attempt,
                pid: Some(1),
                start_time: Some(now()),
                end_time: phase.is_terminal().then(now),
                exit_code: exit,
                reason: (!reason.is_empty()).then(|| reason.to_string()),
                ..Default::default()
            };
            lifecycle::record_node_state(a, node, r, now())
        })
        .await
        .expect("report");
    }

    /// Run an allocation to completion on its nodes (simulated agents): Running, then exit.
    pub async fn run_to_end(&self, tenant: &str, name: &str, exit: i32) {
        let a = self.get(tenant, name).await;
        let nodes = a
            .status
            .as_ref()
            .map(|s| s.assigned_nodes.clone())
            .unwrap_or_default();
        for n in &nodes {
            self.report(tenant, name, n, NodeTaskPhase::Running, None, "")
                .await;
        }
        for n in &nodes {
            let (p, r) = if exit == 0 {
                (NodeTaskPhase::Succeeded, lifecycle::node_reason::EXITED)
            } else {
                (NodeTaskPhase::Failed, lifecycle::node_reason::NON_ZERO_EXIT)
            };
            self.report(tenant, name, n, p, Some(exit), r).await;
        }
    }

    pub async fn owners(&self) -> BTreeMap<String, Option<String>> {
        self.nodes()
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .into_iter()
            .map(|n| {
                let o = n
                    .status
                    .as_ref()
                    .and_then(|s| s.owner.as_ref())
                    .and_then(|o| o.allocation.clone());
                (n.name_any().to_string(), o)
            })
            .collect()
    }

    pub async fn tenant_usage(&self, name: &str) -> (u32, u32) {
        let t = Api::<Tenant>::all(self.client.clone())
            .get(name)
            .await
            .expect("tenant");
        let u = t.status.map(|s| s.usage).unwrap_or_default();
        (u.nodes, u.running_allocations)
    }
}

pub fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

pub fn fast_config() -> lattice_controllers::Config {
    lattice_controllers::Config {
        node_lifecycle: lattice_controllers::NodeLifecycleConfig {
            heartbeat_timeout: Duration::from_secs(2),
            grace_period: Duration::from_secs(2),
            sensitive_grace_period: Duration::from_secs(10),
        },
        ..Default::default()
    }
}

/// Renew a node's heartbeat lease once (what an agent does every interval).
pub async fn beat(client: &Client, node: &str) {
    let api: Api<Lease> = Api::namespaced(client.clone(), "lattice-node-lease");
    match api.get_opt(node).await {
        Ok(None) => {
            let mut l = Lease {
                metadata: ObjectMeta::named(node, Some("lattice-node-lease")),
                ..Default::default()
            };
            l.spec.renew_time = Some(now());
            let _ = api.create(&PostParams::default(), &l).await;
        }
        Ok(Some(mut l)) => {
            let seq = l
                .metadata
                .annotations
                .get("seq")
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
            l.metadata
                .annotations
                .insert("seq".into(), (seq + 1).to_string());
            l.spec.renew_time = Some(now());
            let _ = api.replace(node, &PostParams::default(), &l).await;
        }
        Err(_) => {}
    }
}
