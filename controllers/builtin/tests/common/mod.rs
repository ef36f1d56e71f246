//! Harness: a real embedded store in a tempdir, the built-in controllers on the
//! in-process transport, and a simulated agent that reports through the same contract as
//! `lattice-agent` (`lattice_apis::lifecycle::record_node_state`).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lattice_apis::kinds::dag::DagPhase;
use lattice_apis::meta::now;
use lattice_apis::{
    lifecycle, Allocation, AllocationPhase, Dag, Lease, Node, NodeState, NodeTaskPhase,
    NodeTaskState, ObjectMeta, Tenant, VCluster,
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
    let client = lattice_apiserver::in_process::client(backend.clone());
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
            lattice_apiserver::in_process::client(self.backend.clone()),
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

// ---------------------------------------------------------------------------------------
// Shared by controllers.rs, dag_policies.rs and dependency_options.rs
// ---------------------------------------------------------------------------------------

#[allow(unused_imports)] // not every test binary holds work
pub use lattice_apis::wellknown::HOLD_ANNOTATION as HOLD;

/// Keep every node's heartbeat fresh.
pub fn heartbeats(env: &Env, nodes: &[&str]) -> tokio::task::JoinHandle<()> {
    let client = env.client.clone();
    let nodes: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    tokio::spawn(async move {
        loop {
            for n in &nodes {
                beat(&client, n).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

pub async fn cluster(nodes: &[&str]) -> (Env, tokio::task::JoinHandle<()>) {
    let mut env = env().await;
    env.tenant("t1", None).await;
    env.vcluster("t1", "default", "hpc-backfill").await;
    for (i, n) in nodes.iter().enumerate() {
        env.node(n, (i / 2) as u32).await;
    }
    let hb = heartbeats(&env, nodes);
    env.start_controllers(fast_config());
    (env, hb)
}

/// What the simulated agents do with an allocation once it is bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Run {
    /// Report Running, then exit with this code after running this long.
    Exit(i32, Duration),
    /// Report Running and keep running (until the plan changes or a stop is requested).
    Hold,
}

/// Plans by allocation name; names without a plan exit 0 at once.
#[derive(Clone, Default)]
pub struct Plans(Arc<Mutex<HashMap<String, Run>>>);

impl Plans {
    pub fn set(&self, name: &str, run: Run) {
        self.0.lock().unwrap().insert(name.to_string(), run);
    }
    pub fn get(&self, name: &str) -> Run {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(Run::Exit(0, Duration::ZERO))
    }
}

/// Report `phase` (exit code `exit`) on every assigned node of the current attempt; a
/// node asked to stop reports how it stopped.
pub async fn report_all(
    api: &Api<Allocation>,
    name: &str,
    phase: NodeTaskPhase,
    exit: Option<i32>,
) {
    let _ = api
        .update_status_with_retry(name, 20, |cur| {
            let Some(st) = cur.status.clone() else {
                return false;
            };
            let mut changed = false;
            for n in &st.assigned_nodes {
                let (phase, code, why) = match lifecycle::should_run(cur, n, st.attempt) {
                    lifecycle::RunDecision::Stop(r) => (NodeTaskPhase::Failed, None, r),
                    _ => match (phase, exit) {
                        (NodeTaskPhase::Running, _) => (NodeTaskPhase::Running, None, ""),
                        (_, Some(0)) => (
                            NodeTaskPhase::Succeeded,
                            Some(0),
                            lifecycle::node_reason::EXITED,
                        ),
                        (_, c) => (
                            NodeTaskPhase::Failed,
                            c,
                            lifecycle::node_reason::NON_ZERO_EXIT,
                        ),
                    },
                };
                let r = lattice_apis::NodeTaskState {
                    phase,
                    attempt: st.attempt,
                    pid: Some(1),
                    start_time: Some(now()),
                    end_time: phase.is_terminal().then(now),
                    exit_code: code,
                    reason: (!why.is_empty()).then(|| why.to_string()),
                    ..Default::default()
                };
                changed |= lifecycle::record_node_state(cur, n, r, now());
            }
            changed
        })
        .await;
}

/// Simulated agents following `plans`.
pub fn scripted_runner(env: &Env, tenant: &str, plans: Plans) -> tokio::task::JoinHandle<()> {
    scripted_runner_stopping_after(env, tenant, plans, Duration::ZERO)
}

/// Simulated agents following `plans` that take `stop_after` to stop work asked to stop
/// (a checkpoint's time, for preemption tests).
pub fn scripted_runner_stopping_after(
    env: &Env,
    tenant: &str,
    plans: Plans,
    stop_after: Duration,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), tenant);
    tokio::spawn(async move {
        let mut since: HashMap<(String, u32), tokio::time::Instant> = HashMap::new();
        let mut stopping: HashMap<(String, u32), tokio::time::Instant> = HashMap::new();
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                for a in list.items {
                    let st = a.status.clone().unwrap_or_default();
                    let name = a.name_any().to_string();
                    let stop = st.assigned_nodes.iter().any(|n| {
                        matches!(
                            lifecycle::should_run(&a, n, st.attempt),
                            lifecycle::RunDecision::Stop(_)
                        )
                    });
                    match st.phase {
                        AllocationPhase::Staging => {
                            report_all(&api, &name, NodeTaskPhase::Running, None).await;
                        }
                        AllocationPhase::Running => {
                            let t0 = *since
                                .entry((name.clone(), st.attempt))
                                .or_insert_with(tokio::time::Instant::now);
                            match plans.get(&name) {
                                _ if stop => {
                                    let asked = *stopping
                                        .entry((name.clone(), st.attempt))
                                        .or_insert_with(tokio::time::Instant::now);
                                    if asked.elapsed() >= stop_after {
                                        report_all(&api, &name, NodeTaskPhase::Failed, None).await
                                    }
                                }
                                Run::Exit(code, after) if t0.elapsed() >= after => {
                                    report_all(&api, &name, NodeTaskPhase::Succeeded, Some(code))
                                        .await
                                }
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

pub async fn wait_dag(env: &Env, name: &str) -> Dag {
    let api: Api<Dag> = Api::namespaced(env.client.clone(), "t1");
    for _ in 0..1500 {
        let d = api.get(name).await.expect("dag");
        let phase = d.status.as_ref().map(|s| s.phase).unwrap_or_default();
        if matches!(
            phase,
            DagPhase::Completed | DagPhase::Failed | DagPhase::Cancelled
        ) {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("DAG {name} did not finish");
}

pub fn message_of(a: &Allocation) -> String {
    a.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

pub fn reason_of(a: &Allocation) -> Option<&str> {
    a.status.as_ref().and_then(|s| s.reason.as_deref())
}

pub fn records(a: &Allocation) -> Vec<(String, bool)> {
    a.status
        .as_ref()
        .map(|s| {
            s.dependencies
                .iter()
                .map(|d| (d.description.clone(), d.satisfied))
                .collect()
        })
        .unwrap_or_default()
}

pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

pub async fn wait_never(env: &Env, name: &str, needle: &str) -> Allocation {
    let a = env.wait_phase("t1", name, AllocationPhase::Failed).await;
    assert_eq!(reason_of(&a), Some("dependency_never_satisfied"), "{name}");
    assert!(
        message_of(&a).contains(needle),
        "{name}: {}",
        message_of(&a)
    );
    assert_eq!(a.status.as_ref().unwrap().attempt, 0, "{name} never ran");
    a
}

pub async fn annotate(env: &Env, name: &str, key: &str, value: serde_json::Value) {
    let patch = Patch::Merge(json!({"metadata": {"annotations": {key: value}}}));
    env.allocations("t1")
        .patch(name, &PatchParams::default(), &patch)
        .await
        .expect("annotate");
}

// ---------------------------------------------------------------------------------------
// Simulated agents, monitors and fixtures shared by the scenario files
// ---------------------------------------------------------------------------------------

/// A simulated agent fleet: runs every bound allocation to its end, exit code chosen by
/// `exit_of(name)`.
pub fn auto_runner(
    env: &Env,
    tenant: &str,
    exit_of: impl Fn(&str) -> i32 + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), tenant);
    let exit_of = Arc::new(exit_of);
    tokio::spawn(async move {
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                for a in list.items {
                    let st = a.status.clone().unwrap_or_default();
                    if st.phase != AllocationPhase::Staging && st.phase != AllocationPhase::Running
                    {
                        continue;
                    }
                    let exit = exit_of(a.name_any());
                    for n in st.assigned_nodes.clone() {
                        let node_done = st
                            .node_states
                            .get(&n)
                            .is_some_and(|s| s.attempt == st.attempt && s.phase.is_terminal());
                        if node_done {
                            continue;
                        }
                        let name = a.name_any().to_string();
                        let _ = api
                            .update_status_with_retry(&name, 20, |cur| {
                                let attempt = cur.status.as_ref().map(|s| s.attempt).unwrap_or(0);
                                let stop = lifecycle::should_run(cur, &n, attempt);
                                let (phase, code, why) = match stop {
                                    lifecycle::RunDecision::Stop(r) => {
                                        (NodeTaskPhase::Failed, None, r)
                                    }
                                    _ if exit == 0 => (
                                        NodeTaskPhase::Succeeded,
                                        Some(0),
                                        lifecycle::node_reason::EXITED,
                                    ),
                                    _ => (
                                        NodeTaskPhase::Failed,
                                        Some(exit),
                                        lifecycle::node_reason::NON_ZERO_EXIT,
                                    ),
                                };
                                let r = lattice_apis::NodeTaskState {
                                    phase,
                                    attempt,
                                    start_time: Some(lattice_apis::meta::now()),
                                    end_time: Some(lattice_apis::meta::now()),
                                    exit_code: code,
                                    reason: Some(why.into()),
                                    ..Default::default()
                                };
                                lifecycle::record_node_state(cur, &n, r, lattice_apis::meta::now())
                            })
                            .await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
}

/// Watches allocations and records, per group, the largest number bound at once and the
/// order in which they were first seen bound.
#[derive(Clone, Default)]
pub struct Monitor {
    pub max_active: Arc<Mutex<HashMap<String, usize>>>,
    pub started: Arc<Mutex<Vec<String>>>,
}

pub fn monitor(
    env: &Env,
    tenant: &str,
    group_of: impl Fn(&Allocation) -> Option<String> + Send + Sync + 'static,
) -> (Monitor, tokio::task::JoinHandle<()>) {
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), tenant);
    let m = Monitor::default();
    let out = m.clone();
    let h = tokio::spawn(async move {
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                let mut active: HashMap<String, usize> = HashMap::new();
                for a in &list.items {
                    let bound = matches!(
                        a.phase(),
                        AllocationPhase::Staging | AllocationPhase::Running
                    );
                    if !bound {
                        continue;
                    }
                    let mut s = m.started.lock().unwrap();
                    if !s.iter().any(|n| n == a.name_any()) {
                        s.push(a.name_any().to_string());
                    }
                    if let Some(g) = group_of(a) {
                        *active.entry(g).or_default() += 1;
                    }
                }
                let mut max = m.max_active.lock().unwrap();
                for (g, n) in active {
                    let e = max.entry(g).or_default();
                    *e = (*e).max(n);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    (out, h)
}

pub async fn wait_waiting(env: &Env, name: &str) -> Allocation {
    env.wait_alloc("t1", name, "waiting for dependencies", |a| {
        reason_of(a) == Some("waiting_for_dependencies")
    })
    .await
}

pub async fn set_admins(env: &Env, admins: &[&str]) {
    let patch = Patch::Merge(json!({"spec": {"admins": admins}}));
    Api::<lattice_apis::Tenant>::all(env.client.clone())
        .patch("t1", &PatchParams::default(), &patch)
        .await
        .expect("tenant admins");
}

pub fn dag_manifest(name: &str) -> Dag {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "t1"},
        "spec": {"allocations": [
            {"name": "preprocess", "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
            {"name": "train", "dependsOn": [{"ref": "preprocess", "condition": "success"}],
             "spec": {"entrypoint": "/bin/true", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1h"}}},
            {"name": "evaluate", "dependsOn": [{"ref": "train", "condition": "success"}],
             "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
            {"name": "notify-failure", "dependsOn": [{"ref": "train", "condition": "failure"}],
             "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}}},
        ]},
    }))
    .expect("dag")
}

pub fn task_phases(d: &Dag) -> BTreeMap<String, String> {
    d.status
        .as_ref()
        .map(|s| {
            s.tasks
                .iter()
                .map(|(k, v)| (k.clone(), format!("{:?}", v.phase)))
                .collect()
        })
        .unwrap_or_default()
}

/// A sensitive-pool node.
pub async fn sensitive_node(env: &Env, name: &str) {
    env.node(name, 0).await;
    env.nodes()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sensitive": true}})),
        )
        .await
        .expect("mark sensitive");
}

pub fn claim(user: &str, nodes: &[&str]) -> serde_json::Value {
    json!({
        "metadata": {"annotations": {"lattice.dev/user": user}},
        "spec": {"sensitive": true, "vcluster": "secure",
                 "resources": {"nodes": nodes.len(), "nodeNames": nodes}},
    })
}
