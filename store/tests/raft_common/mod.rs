//! In-process Raft clusters for tests: members on 127.0.0.1 random ports, each with its
//! own temporary data directory (real gRPC, real fsync).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lattice_store::raft::{RaftConfig, RaftStore};
use lattice_store::*;

pub struct Cluster {
    pub dirs: Vec<tempfile::TempDir>,
    pub addrs: Vec<SocketAddr>,
    pub nodes: Vec<Option<RaftStore>>,
    pub tune: fn(&mut RaftConfig),
}

pub fn no_tune(_: &mut RaftConfig) {}

/// Member `i` (0-based) has node ID `i + 1`.
pub fn config(
    id: u64,
    dir: &std::path::Path,
    addr: SocketAddr,
    tune: fn(&mut RaftConfig),
) -> RaftConfig {
    let mut c = RaftConfig::new(id, dir, addr);
    c.request_timeout = Duration::from_secs(8);
    tune(&mut c);
    c
}

impl Cluster {
    /// Bootstrap member 1, then add members 2..=n (learner, then voter).
    pub async fn start(n: usize, tune: fn(&mut RaftConfig)) -> Cluster {
        let mut c = Cluster {
            dirs: Vec::new(),
            addrs: Vec::new(),
            nodes: Vec::new(),
            tune,
        };
        for i in 0..n {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut cfg = config(
                i as u64 + 1,
                dir.path(),
                "127.0.0.1:0".parse().expect("addr"),
                tune,
            );
            cfg.bootstrap = i == 0;
            let node = RaftStore::start(cfg).await.expect("start member");
            c.addrs.push(node.local_addr());
            c.dirs.push(dir);
            if i == 0 {
                node.wait_for_leader(Duration::from_secs(10))
                    .await
                    .expect("first leader");
            }
            c.nodes.push(Some(node));
        }
        let first = c.node(0);
        for i in 1..n {
            first
                .add_member(i as u64 + 1, c.addrs[i].to_string())
                .await
                .expect("add member");
        }
        c
    }

    pub fn node(&self, i: usize) -> RaftStore {
        self.nodes[i].clone().expect("member is running")
    }

    pub fn running(&self) -> Vec<RaftStore> {
        self.nodes.iter().flatten().cloned().collect()
    }

    /// Index of the member every running member agrees leads.
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let running = self.running();
            let leaders: Vec<Option<u64>> = running.iter().map(|n| n.current_leader()).collect();
            if let Some(Some(l)) = leaders.first() {
                let alive = running.iter().any(|n| n.id() == *l && n.is_leader());
                if alive && leaders.iter().all(|x| *x == Some(*l)) {
                    return (*l - 1) as usize;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {timeout:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(&mut self, i: usize) {
        if let Some(n) = self.nodes[i].take() {
            n.shutdown().await;
        }
    }

    pub async fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "member {i} is running");
        let cfg = config(i as u64 + 1, self.dirs[i].path(), self.addrs[i], self.tune);
        let mut last = None;
        for _ in 0..50 {
            match RaftStore::start(cfg.clone()).await {
                Ok(n) => {
                    self.nodes[i] = Some(n);
                    return;
                }
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        panic!("restarting member {i}: {last:?}");
    }

    pub async fn shutdown_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop(i).await;
        }
    }

    /// Wait until member `i` has applied at least `revision`.
    pub async fn wait_revision(&self, i: usize, revision: i64, timeout: Duration) {
        let node = self.node(i);
        let deadline = Instant::now() + timeout;
        while node.revision() < revision {
            assert!(
                Instant::now() < deadline,
                "member {} stuck at revision {} (want {revision})",
                i + 1,
                node.revision()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub async fn get_value(
    node: &RaftStore,
    key: &str,
    serializable: bool,
) -> StoreResult<Option<String>> {
    let mut req = RangeRequest::key(key.to_owned());
    req.serializable = serializable;
    let resp = node.range(req).await?;
    Ok(resp
        .kvs
        .into_iter()
        .next()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}
