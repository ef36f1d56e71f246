//! `raft-member`: one replicated store member (Raft + the etcd v3 port) and nothing else,
//! started with the same flags `lattice-server` takes for its store, so the store can be
//! benchmarked alone (`BENCH_LATTICE_SERVER=target/dist/examples/raft-member
//! hack/bench-store.sh`), without the server's controllers writing in the background.
//!
//! ```text
//! raft-member --data-dir DIR --etcd-addr HOST:PORT --raft-addr HOST:PORT --node-id N
//!             [--bootstrap | --join HOST:PORT]
//! ```
//! Unknown `--flag value` pairs (`--api-addr`, `--tls-addr`) are ignored. Without
//! `--raft-addr` it serves an [`EmbeddedStore`] (single member, no Raft).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use lattice_store::grpc::{EtcdGrpcServer, ServerInfo};
use lattice_store::raft::{RaftConfig, RaftStore};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut flags: HashMap<String, String> = HashMap::new();
    let mut args = std::env::args().skip(1).peekable();
    while let Some(a) = args.next() {
        let name = a
            .strip_prefix("--")
            .with_context(|| format!("unexpected argument {a:?}"))?
            .to_string();
        let value = match args.peek() {
            Some(v) if !v.starts_with("--") => args.next().unwrap_or_default(),
            _ => String::new(),
        };
        flags.insert(name, value);
    }
    let data_dir = PathBuf::from(flags.get("data-dir").context("--data-dir is required")?);
    let etcd_addr: SocketAddr = flags
        .get("etcd-addr")
        .map_or("127.0.0.1:2379", |s| s.as_str())
        .parse()?;
    let mut info = ServerInfo::default();
    let backend: Arc<dyn KvBackend> = match flags.get("raft-addr") {
        Some(addr) => {
            let node_id: u64 = flags.get("node-id").map_or("1", |s| s.as_str()).parse()?;
            let mut config = RaftConfig::new(node_id, data_dir.join("store"), addr.parse()?);
            config.bootstrap = flags.contains_key("bootstrap");
            let store = RaftStore::start(config).await?;
            if let Some(seed) = flags.get("join") {
                store.join(seed).await?;
            }
            info.member_id = node_id;
            Arc::new(store)
        }
        None => {
            Arc::new(EmbeddedStore::open(data_dir.join("store"), StoreConfig::default()).await?)
        }
    };
    EtcdGrpcServer::bind(etcd_addr, backend, info)
        .await?
        .serve(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}
