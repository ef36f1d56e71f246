//! Test helpers: a real etcd process on loopback, free ports, binaries.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Find a system binary, or fail the test telling how to install it.
pub fn require_binary(name: &str) -> PathBuf {
    let candidates = [format!("/usr/bin/{name}"), format!("/usr/local/bin/{name}")];
    for c in &candidates {
        let p = PathBuf::from(c);
        if p.is_file() {
            return p;
        }
    }
    if let Ok(path) = std::env::var("PATH") {
        for dir in path.split(':') {
            let p = PathBuf::from(dir).join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "`{name}` not found: these tests need Debian's etcd-server and etcd-client packages. \
         Run hack/install-deps.sh (as root) and try again."
    );
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

/// A single-member etcd on random loopback ports with a temporary data directory. Killed on
/// drop.
pub struct EtcdProcess {
    child: Child,
    pub client_port: u16,
    _dir: tempfile::TempDir,
}

impl EtcdProcess {
    pub async fn start() -> EtcdProcess {
        Self::start_with(&[]).await
    }

    /// Start with extra etcd flags.
    pub async fn start_with(extra_args: &[&str]) -> EtcdProcess {
        let etcd = require_binary("etcd");
        let mut last_err = String::new();
        // Ports can be taken between probing and binding; retry a few times.
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("tempdir");
            let client_port = free_port();
            let peer_port = free_port();
            let client_url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
            let log2 = log.try_clone().expect("log file");
            let child = Command::new(&etcd)
                .arg("--name")
                .arg("conformance")
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .arg("--listen-client-urls")
                .arg(&client_url)
                .arg("--advertise-client-urls")
                .arg(&client_url)
                .arg("--listen-peer-urls")
                .arg(&peer_url)
                .arg("--initial-advertise-peer-urls")
                .arg(&peer_url)
                .arg("--initial-cluster")
                .arg(format!("conformance={peer_url}"))
                .arg("--initial-cluster-state")
                .arg("new")
                .args(extra_args)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2))
                .spawn()
                .expect("spawn etcd");
            let mut proc = EtcdProcess {
                child,
                client_port,
                _dir: dir,
            };
            match proc.wait_healthy(Duration::from_secs(20)).await {
                Ok(()) => return proc,
                Err(e) => {
                    last_err = format!("{e}; log: {}", proc.log());
                    drop(proc);
                }
            }
        }
        panic!("etcd did not become healthy: {last_err}");
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("etcd.log")).unwrap_or_default()
    }

    async fn wait_healthy(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("etcd exited: {status}"));
            }
            let attempt = async {
                let mut c = etcd_client::Client::connect([self.endpoint()], None).await?;
                c.get("health", None).await?;
                Ok::<_, etcd_client::Error>(())
            };
            match tokio::time::timeout(Duration::from_secs(2), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "timeout".into(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("not healthy after {limit:?}: {last}"))
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
