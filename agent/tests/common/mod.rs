//! Test helpers: a real `lattice-server --dev` and real `lattice-agent` processes on
//! loopback, and polling helpers (no fixed sleeps: conditions are awaited with generous
//! limits, the shared machine is slow).
//!
//! `lattice-server` must be built first (`cargo build -p lattice-server`); it is found
//! next to the test executable's `deps` directory.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lattice_apis::{Allocation, AllocationPhase, Lease, Node, Tenant};
use lattice_runtime::{Api, Client, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

/// Most conditions are met in well under a second; the limit is for a loaded machine.
pub const LIMIT: Duration = Duration::from_secs(90);

/// `target/<profile>/NAME`, from the test executable's location.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p lattice-server` first",
        p.display()
    );
    p
}

/// A `lattice-server --dev` on random ports, in its own temp dir: plain HTTP for the
/// tests' admin token, HTTPS for the agents' node certificates.
pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub url: String,
    /// Where agents connect.
    pub tls_url: String,
    pub token: String,
    extra: Vec<String>,
}

impl Server {
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// Start with more `lattice-server` flags (kept across [`restart`](Self::restart)).
    pub fn start_with(extra: &[&str]) -> Server {
        Self::start_serving_agents_on("127.0.0.1", extra)
    }

    /// Start with the agents' HTTPS endpoint on `ip` (a [`NetLab`]'s bridge address).
    pub fn start_serving_agents_on(ip: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (child, url, tls_url) =
            Self::spawn(dir.path(), "127.0.0.1:0", &format!("{ip}:0"), &extra);
        let token = std::fs::read_to_string(dir.path().join("data/admin.token"))
            .expect("admin token")
            .trim()
            .to_string();
        let server = Server {
            child: Some(child),
            dir,
            url,
            tls_url,
            token,
            extra,
        };
        server.allow_own_user_in_default_tenant();
        server
    }

    /// The test user runs everything in tenant `default` as the agents' own user (test
    /// allocations name users without accounts, `--unknown-user agent`): as root, that is
    /// root, which the agents run only for a tenant whose `spec.runAs.allowUsers` lists it
    /// — as `lattice up` does for its own user. Tests of that rule use other tenants.
    fn allow_own_user_in_default_tenant(&self) {
        let me = own_user_name();
        let client = self.client();
        // Server::start is called from async tests: a thread of its own for the request.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let tenants: Api<Tenant> = Api::all(client);
                tenants
                    .patch(
                        "default",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"runAs": {"allowUsers": [me]}}})),
                    )
                    .await
                    .expect("allow the test user in tenant default");
            })
        })
        .join()
        .expect("tenant patch thread");
    }

    /// The cluster's tenants.
    pub fn tenants(&self) -> Api<Tenant> {
        Api::all(self.client())
    }

    /// Allocations of another tenant.
    pub fn allocations_in(&self, tenant: &str) -> Api<Allocation> {
        Api::namespaced(self.client(), tenant)
    }

    /// SIGKILL the server (the API becomes unreachable).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same address and data directory.
    pub fn restart(&mut self) {
        self.kill9();
        let addr = self.url.trim_start_matches("http://").to_string();
        let tls = self.tls_url.trim_start_matches("https://").to_string();
        let (child, url, tls_url) = Self::spawn(self.dir.path(), &addr, &tls, &self.extra);
        assert_eq!((url, tls_url), (self.url.clone(), self.tls_url.clone()));
        self.child = Some(child);
    }

    fn spawn(dir: &Path, addr: &str, tls: &str, extra: &[String]) -> (Child, String, String) {
        let log = dir.join("server.log");
        let child = Command::new(workspace_bin("lattice-server"))
            .arg("--dev")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--api-addr", addr])
            .args(["--etcd-addr", "off", "--tls-addr", tls])
            .args(extra)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn lattice-server");
        let start = Instant::now();
        let (url, tls_url) = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("dev server ready") {
                // "API:   http://A  (HTTPS: https://B)"
                if let Some(line) = text.lines().find_map(|l| l.trim().strip_prefix("API:")) {
                    let mut words = line.split_whitespace();
                    let url = words.next().unwrap_or_default().to_string();
                    let tls = words
                        .find(|w| w.starts_with("https://"))
                        .unwrap_or_default()
                        .trim_end_matches(')')
                        .to_string();
                    break (url, tls);
                }
            }
            assert!(
                start.elapsed() < LIMIT,
                "lattice-server did not start; log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        (child, url, tls_url)
    }

    /// The cluster CA agents trust.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("data/pki/ca.crt")
    }

    /// A client to the endpoint of `node`'s agent, published at `address`, as the API
    /// server reaches it (its certificate; the node's name checked), and the base URL.
    pub fn agent_http(&self, node: &str, address: &str) -> (reqwest::Client, String) {
        let pki = self.dir.path().join("data/pki");
        let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("pki file");
        let tls = lattice_pki::client_config(
            &read("ca.crt"),
            Some((&read("apiserver.crt"), &read("apiserver.key"))),
        )
        .expect("tls");
        let addr: std::net::SocketAddr = address.parse().expect("agent address");
        let name = format!("{node}.nodes.lattice.internal");
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .resolve(&name, addr)
            .build()
            .expect("client");
        (http, format!("https://{name}:{}", addr.port()))
    }

    /// A bootstrap token for `node` (what an administrator gives a new node's agent).
    pub fn bootstrap_token(&self, node: &str) -> String {
        let (url, admin, node) = (
            format!(
                "{}{}",
                self.url,
                lattice_apis::node_identity::BOOTSTRAP_TOKENS_PATH
            ),
            self.token.clone(),
            node.to_string(),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let resp = reqwest::Client::new()
                    .post(&url)
                    .bearer_auth(&admin)
                    .json(&json!({"node": node, "ttlSeconds": 600}))
                    .send()
                    .await
                    .expect("bootstrap token request");
                let code = resp.status();
                let v: Value = resp.json().await.expect("bootstrap token answer");
                assert!(code.is_success(), "bootstrap token for {node}: {code} {v}");
                v["token"].as_str().expect("token").to_string()
            })
        })
        .join()
        .expect("bootstrap token thread")
    }

    pub fn client(&self) -> Client {
        Client::http(&self.url, Some(self.token.clone())).expect("client")
    }

    /// A client with the controllers' rights (what the scheduler writes: bindings, node
    /// ownership), from a system token signed with the server's secret.
    pub fn system_client(&self) -> Client {
        let secret = std::fs::read(self.dir.path().join("data/jwt.secret")).expect("jwt.secret");
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &json!({"sub": "test-scheduler", "tenants": "*", "role": "system", "exp": exp}),
            &jsonwebtoken::EncodingKey::from_secret(&secret),
        )
        .expect("system token");
        Client::http(&self.url, Some(token)).expect("client")
    }

    /// Allocations, as the controllers see them.
    pub fn system_allocations(&self) -> Api<Allocation> {
        self.system_allocations_in("default")
    }

    /// Allocations of `tenant`, as the controllers see them.
    pub fn system_allocations_in(&self, tenant: &str) -> Api<Allocation> {
        Api::namespaced(self.system_client(), tenant)
    }

    /// Nodes, as the controllers see them (ownership is theirs to write).
    pub fn system_nodes(&self) -> Api<Node> {
        Api::all(self.system_client())
    }

    pub fn allocations(&self) -> Api<Allocation> {
        Api::namespaced(self.client(), "default")
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client())
    }

    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client(), "lattice-node-lease")
    }

    /// A counter or gauge from the server's `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::Client::new()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("metrics request")
            .text()
            .await
            .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// GET the API server's log route; (status, body).
    pub async fn logs(&self, name: &str, query: &str) -> (u16, String) {
        let url = format!(
            "{}/apis/lattice.dev/v1alpha1/namespaces/default/allocations/{name}/log?{query}",
            self.url
        );
        let r = reqwest::Client::new()
            .get(url)
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("log request");
        let code = r.status().as_u16();
        (code, r.text().await.unwrap_or_default())
    }

    /// Start a streaming log request.
    pub async fn logs_stream(&self, name: &str, query: &str) -> reqwest::Response {
        let url = format!(
            "{}/apis/lattice.dev/v1alpha1/namespaces/default/allocations/{name}/log?{query}",
            self.url
        );
        reqwest::Client::new()
            .get(url)
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("log request")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A `lattice-agent` process for one node.
pub struct Agent {
    child: Option<Child>,
    pub node: String,
    pub state_dir: PathBuf,
    url: String,
    ca_file: PathBuf,
    bootstrap_token: String,
    extra: Vec<String>,
    starts: u32,
    netns: Option<String>,
}

/// Network namespaces joined by a bridge: each one another node's network stack. The
/// host side of the bridge is `host_ip()`; namespace `i` has `node_ip(i)`. Needs root
/// (`ip` from iproute2); removed when dropped.
pub struct NetLab {
    tag: String,
    prefix: String,
    n: usize,
}

impl NetLab {
    /// `n` namespaces, or `None` (with the reason on stderr) where they cannot be made.
    pub fn new(n: usize) -> Option<NetLab> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if !nix::unistd::geteuid().is_root() {
            eprintln!("network namespaces need root; running the agents on loopback instead");
            return None;
        }
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let lab = NetLab {
            tag: format!("lt{}{k}", pid % 100_000),
            prefix: format!("10.{}.{}", 200 + k % 50, pid % 250),
            n,
        };
        let ip = |args: &[&str]| {
            let ok = Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip {} failed", args.join(" "));
        };
        let br = format!("{}b", lab.tag);
        ip(&["link", "add", &br, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}/24", lab.host_ip()), "dev", &br]);
        ip(&["link", "set", &br, "up"]);
        for i in 0..n {
            let ns = lab.netns_name(i);
            let host_side = format!("{}h{i}", lab.tag);
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip(&["link", "set", &host_side, "master", &br, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", lab.node_ip(i)),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        Some(lab)
    }

    fn netns_name(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    /// The path `nsenter --net=` takes for namespace `i`.
    pub fn netns(&self, i: usize) -> String {
        format!("/run/netns/{}", self.netns_name(i))
    }

    /// The bridge's address (where the API server listens for the agents).
    pub fn host_ip(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// Namespace `i`'s address.
    pub fn node_ip(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 2)
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for i in 0..self.n {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.netns_name(i)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}b", self.tag)])
            .status();
    }
}

impl Agent {
    /// Start an agent for `node` with its state under `root/<node>`.
    pub fn start(server: &Server, node: &str, root: &Path, extra: &[&str]) -> Agent {
        Self::start_in(server, node, root, extra, None)
    }

    /// [`start`](Self::start) inside the network namespace `netns` (a path under
    /// `/run/netns`), through `nsenter --net`: another node's network stack.
    pub fn start_in(
        server: &Server,
        node: &str,
        root: &Path,
        extra: &[&str],
        netns: Option<&str>,
    ) -> Agent {
        let mut a = Agent {
            netns: netns.map(str::to_string),
            child: None,
            node: node.to_string(),
            state_dir: root.join(node),
            url: server.tls_url.clone(),
            ca_file: server.ca_file(),
            bootstrap_token: server.bootstrap_token(node),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            starts: 0,
        };
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.state_dir).expect("state dir");
        self.starts += 1;
        let log = self.state_dir.join(format!("agent-{}.log", self.starts));
        let mut cmd = match &self.netns {
            None => Command::new(env!("CARGO_BIN_EXE_lattice-agent")),
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={ns}"))
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_lattice-agent"));
                c
            }
        };
        let child = cmd
            .args(["--node-id", &self.node, "--api-url", &self.url])
            .arg("--ca-file")
            .arg(&self.ca_file)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(["--heartbeat-interval", "500ms", "--grace-period", "1s"])
            // Production agents refuse to run without cgroups; where the test cannot give
            // them any (not root, or no writable hierarchy), say so explicitly.
            .args(
                if cgroups_usable() || self.extra.iter().any(|a| a == "--no-cgroups") {
                    &[][..]
                } else {
                    &["--no-cgroups"][..]
                },
            )
            // Test users have no accounts here; a test that checks refusal says so.
            .args(if self.extra.iter().any(|a| a == "--unknown-user") {
                &[][..]
            } else {
                &["--unknown-user", "agent"][..]
            })
            .args(&self.extra)
            .env("LATTICE_BOOTSTRAP_TOKEN", &self.bootstrap_token)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"))
            .spawn()
            .expect("spawn lattice-agent");
        self.child = Some(child);
    }

    /// SIGKILL the agent (not its workloads).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running agent");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        c.wait().expect("wait")
    }

    /// Start it again on the same state dir.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Everything the agent logged (all starts).
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.state_dir.join(format!("agent-{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }

    /// The state file as JSON.
    pub fn state(&self) -> Value {
        let text =
            std::fs::read_to_string(self.state_dir.join("agent-state.json")).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Workload process groups recorded in the state file.
    pub fn recorded_pgids(&self) -> Vec<i32> {
        let text =
            std::fs::read_to_string(self.state_dir.join("agent-state.json")).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        v["tasks"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|t| t["pid"].as_i64())
                    .map(|p| p as i32)
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Leave nothing behind: the agent, then whatever workloads it still records, then
        // its cgroups (a killed agent cannot remove them).
        let pgids = self.recorded_pgids();
        self.kill9();
        for p in pgids {
            if p > 1 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(-p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        remove_agent_cgroups(&self.node, &self.state_dir);
    }
}

/// Remove the cgroups of the agent of `node` with state directory `state_dir` (its
/// instance's groups in every hierarchy, killing anything left in them).
pub fn remove_agent_cgroups(node: &str, state_dir: &Path) {
    let root = Path::new(lattice_agent::cgroup::DEFAULT_ROOT);
    let instance = lattice_agent::cgroup::instance_id(state_dir);
    let mut mounts = vec![root.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(root) {
        mounts.extend(rd.flatten().map(|e| e.path()));
    }
    for m in mounts {
        let node_dir = m.join("lattice").join(node);
        let base = node_dir.join(&instance);
        let Ok(runs) = std::fs::read_dir(&base) else {
            continue;
        };
        for r in runs.flatten().filter(|e| e.path().is_dir()) {
            lattice_agent::cgroup::Cgroups::remove(&[r.path()]);
        }
        let _ = std::fs::remove_dir(&base);
        let _ = std::fs::remove_dir(&node_dir);
    }
}

/// Poll `f` every 100 ms until it returns `Some`, or panic after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `node`'s agent has registered (its `status.agent` is written): admission
/// reads what agents can run from there.
pub async fn registered(server: &Server, node: &str) {
    let nodes = server.nodes();
    wait_for("the agent's registration", LIMIT, || async {
        nodes
            .get(node)
            .await
            .ok()
            .filter(|n| n.status.as_ref().and_then(|s| s.agent.as_ref()).is_some())
            .map(|_| ())
    })
    .await
}

/// Create an allocation in tenant `default` from a spec (JSON).
pub async fn create(server: &Server, name: &str, spec: Value) -> Allocation {
    create_with(server, name, spec, json!({})).await
}

/// Create with extra metadata (labels, annotations). Every test allocation is held
/// (`lattice.dev/hold`) so that the server's scheduler leaves it alone: the tests bind
/// allocations themselves, exactly as the scheduler would. An allocation that names
/// another user (`lattice.dev/user`) is created with the controllers' rights (a person
/// cannot submit as someone else); otherwise as the admin, whom it then runs as.
pub async fn create_with(server: &Server, name: &str, spec: Value, meta: Value) -> Allocation {
    create_in(server, "default", name, spec, meta).await
}

/// [`create_with`] in another tenant.
pub async fn create_in(
    server: &Server,
    tenant: &str,
    name: &str,
    spec: Value,
    meta: Value,
) -> Allocation {
    let mut metadata = json!({
        "name": name,
        "namespace": tenant,
        "annotations": {"lattice.dev/hold": "true"},
    });
    if let (Some(m), Some(extra)) = (metadata.as_object_mut(), meta.as_object()) {
        for (k, v) in extra {
            if k == "annotations" {
                if let (Some(a), Some(more)) = (m["annotations"].as_object_mut(), v.as_object()) {
                    a.extend(more.clone());
                }
            } else {
                m.insert(k.clone(), v.clone());
            }
        }
    }
    let a: Allocation = serde_json::from_value(json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": metadata,
        "spec": spec,
    }))
    .expect("allocation");
    let api = if a.metadata.annotations.contains_key("lattice.dev/user") {
        server.system_allocations_in(tenant)
    } else {
        server.allocations_in(tenant)
    };
    api.create(&PostParams::default(), &a)
        .await
        .expect("create allocation")
}

/// Bind as the scheduler does: each node's `status.owner` names the allocation's attempt
/// and the allocation is Staging on those nodes with attempt 1 and its walltime.
pub async fn bind(server: &Server, name: &str, nodes: &[&str], walltime: Option<u64>) {
    bind_in(server, "default", name, nodes, walltime).await
}

/// [`bind`] in another tenant. The scheduler writes the allocation and the ownership in
/// one transaction; a test has three writes and orders them so that neither the release
/// controller (which frees a node whose owner does not name it) nor the agent (which
/// refuses what its node does not own) sees a half: the nodes and attempt first while
/// still Pending (nothing runs), then the ownership, then Staging.
pub async fn bind_in(
    server: &Server,
    tenant: &str,
    name: &str,
    nodes: &[&str],
    walltime: Option<u64>,
) {
    let api = server.system_allocations_in(tenant);
    let mut status = json!({"phase": "Pending", "assignedNodes": nodes, "attempt": 1});
    if let Some(w) = walltime {
        status["walltimeSeconds"] = json!(w);
    }
    let a = api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("bind: nodes");
    for n in nodes {
        own(server, n, &a, 1).await;
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Staging"}})),
    )
    .await
    .expect("bind: Staging");
}

/// Write only the allocation's binding (`status.assignedNodes`), as a store written behind
/// the API (or a user's `/status` write) would: no node ownership.
pub async fn bind_status_only(
    server: &Server,
    tenant: &str,
    name: &str,
    nodes: &[&str],
    walltime: Option<u64>,
) {
    let mut status = json!({"phase": "Staging", "assignedNodes": nodes, "attempt": 1});
    if let Some(w) = walltime {
        status["walltimeSeconds"] = json!(w);
    }
    server
        .system_allocations_in(tenant)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("bind");
}

/// Make `a`'s `attempt` the owner of `node` (`status.owner`, as the scheduler's binding
/// transaction writes it), once the node has registered.
pub async fn own(server: &Server, node: &str, a: &Allocation, attempt: u32) {
    let nodes = server.nodes();
    wait_for(&format!("node {node} to register"), LIMIT, || async {
        nodes.get(node).await.ok()
    })
    .await;
    let owner = json!({
        "tenant": a.metadata.namespace,
        "allocation": a.metadata.name,
        "allocationUid": a.metadata.uid,
        "attempt": attempt,
        "user": a.metadata.annotations.get("lattice.dev/user"),
    });
    server
        .system_nodes()
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"owner": owner, "allocations": [a.metadata.name]}})),
        )
        .await
        .expect("node ownership");
}

/// Create a job step of the running allocation `parent` (as `lattice launch` does: its
/// controller reference and user); the step controller binds it to the allocation's
/// nodes, where it runs beside it.
pub async fn create_step(server: &Server, parent: &str, name: &str, mut spec: Value) -> Allocation {
    let p = server.allocations().get(parent).await.expect("parent");
    spec["stepOf"] = json!(parent);
    spec["requeue"] = json!({"policy": "never"});
    let meta = json!({
        "ownerReferences": [{
            "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
            "name": parent, "uid": p.metadata.uid, "controller": true,
        }],
        "annotations": {"lattice.dev/user": p.metadata.annotations.get("lattice.dev/user")},
    });
    create_with(server, name, spec, meta).await
}

/// Create and bind to one node with a generous walltime.
pub async fn submit(server: &Server, name: &str, node: &str, spec: Value) -> Allocation {
    create(server, name, spec).await;
    bind(server, name, &[node], Some(600)).await;
    server.allocations().get(name).await.expect("get")
}

/// Wait until `name` reaches `phase`.
pub async fn wait_phase(server: &Server, name: &str, phase: AllocationPhase) -> Allocation {
    let api = server.allocations();
    let mut last = None;
    let start = Instant::now();
    loop {
        if let Ok(a) = api.get(name).await {
            if a.phase() == phase {
                return a;
            }
            last = Some(a);
        }
        assert!(
            start.elapsed() < LIMIT,
            "{name} did not reach {phase:?}; last: {:#?}",
            last.as_ref().and_then(|a| a.status.as_ref())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `name` reaches a terminal phase.
pub async fn wait_terminal(server: &Server, name: &str) -> Allocation {
    let api = server.allocations();
    wait_for(&format!("{name} to end"), LIMIT, || async {
        api.get(name).await.ok().filter(|a| a.phase().is_terminal())
    })
    .await
}

/// The node entry of `node` in `a`.
pub fn node_state<'a>(a: &'a Allocation, node: &str) -> &'a lattice_apis::NodeTaskState {
    a.status
        .as_ref()
        .and_then(|s| s.node_states.get(node))
        .unwrap_or_else(|| panic!("no report from {node}: {:#?}", a.status))
}

/// Whether any process of group `pgid` exists.
pub fn group_alive(pgid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pgid), None) != Err(nix::errno::Errno::ESRCH)
}

/// Whether `pid` exists (and is not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// The name of the user running the tests.
pub fn own_user_name() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| "root".into())
}

/// Whether an agent started by this test can use cgroups (it runs as root and the
/// machine has the hierarchies it needs).
pub fn cgroups_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        nix::unistd::geteuid().is_root()
            && lattice_agent::cgroup::probe(Path::new(lattice_agent::cgroup::DEFAULT_ROOT)).is_ok()
    })
}

/// An ordinary (non-root, uid >= 1000) local user for the hostile-tenant tests: created
/// with `useradd` on first use (needs root), kept afterwards. Its name is fixed, so runs
/// of the suite share it.
pub const TEST_USER: &str = "lattice-tenant";

/// [`TEST_USER`], created if missing; `None` where the tests cannot create users (not
/// root).
pub fn test_user() -> Option<nix::unistd::User> {
    static USER: std::sync::OnceLock<Option<nix::unistd::User>> = std::sync::OnceLock::new();
    USER.get_or_init(|| {
        if let Ok(Some(u)) = nix::unistd::User::from_name(TEST_USER) {
            return Some(u);
        }
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        // Several test binaries may race: useradd fails with "exists" or a lock error
        // (exit 10) for the loser, which then finds the user.
        for _ in 0..50 {
            let out = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/sh", "--comment"])
                .arg("Lattice test tenant user")
                .arg(TEST_USER)
                .output()
                .expect("useradd (package passwd; hack/install-deps.sh installs it)");
            if let Ok(Some(u)) = nix::unistd::User::from_name(TEST_USER) {
                return Some(u);
            }
            assert!(
                out.status.code() == Some(10),
                "useradd {TEST_USER}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not create the test user {TEST_USER}");
    })
    .clone()
}

/// A preload library that appends `<uid> <euid>` to `marker` whenever a process loads it.
pub fn build_preload(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("mark.c");
    std::fs::write(
        &src,
        format!(
            r#"#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {{
    FILE *f = fopen("{}", "a");
    if (f) {{ fprintf(f, "%d %d\n", (int)getuid(), (int)geteuid()); fclose(f); }}
}}
"#,
            marker.display()
        ),
    )
    .unwrap();
    let lib = dir.join("libmark.so");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc (package gcc)");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    lib
}

/// A repository in `dir` with one image, `tools/1.0:v1`, mounted at `dir/user-environment`
/// (made here), whose view `default` puts its `bin` on `PATH`; the repository and the
/// mount point.
pub fn uenv_repository(dir: &Path) -> (PathBuf, PathBuf) {
    let mount = dir.join("user-environment");
    std::fs::create_dir(&mount).unwrap();
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    let tool = tree.join("bin/hello-uenv");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho \"hello from the uenv at $(dirname \"$0\")\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let image = repo.join("tools-1.0-v1.squashfs");
    let made = Command::new("mksquashfs")
        .arg(&tree)
        .arg(&image)
        .args(["-quiet", "-no-progress", "-noappend", "-all-root"])
        .status()
        .expect("mksquashfs (squashfs-tools): run hack/install-deps.sh");
    assert!(made.success());
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(&image).unwrap(),
    ));
    let index = json!({"images": [{
        "name": "tools", "version": "1.0", "tag": "v1",
        "file": "tools-1.0-v1.squashfs", "sha256": sha,
        "mount": mount.display().to_string(),
        "views": {"default": {"prepend": {"PATH": format!("{}/bin", mount.display())}}},
    }]});
    std::fs::write(repo.join("index.json"), index.to_string()).unwrap();
    (repo, mount)
}

/// `lattice attach NAME ARGS...` against `server` as its admin, without a terminal.
pub fn attach(server: &Server, name: &str, args: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("lattice"))
        .arg("attach")
        .arg(name)
        .args(args)
        .env("LATTICE_API_URL", &server.url)
        .env("LATTICE_TOKEN", &server.token)
        .env_remove("LATTICE_TOKEN_FILE")
        .env_remove("LATTICE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("lattice attach")
}

/// Fake GPU device nodes in `dir`: `nvidia0`, `nvidia1` and `nvidiactl`, character devices
/// of an unassigned major (an allowed open fails with ENXIO, a denied one with EPERM),
/// readable by everyone.
pub fn fake_gpus(dir: &Path) {
    for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
        let p = dir.join(name);
        nix::sys::stat::mknod(
            &p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(240, minor),
        )
        .expect("mknod");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
}
