//! etcd v3 gRPC facade over any [`KvBackend`].
//!
//! Serves the subset of etcd's API that `etcdctl` (ETCDCTL_API=3), Go's clientv3 and the
//! `etcd-client` crate need: KV (Range, Put, DeleteRange, Txn, Compact), Watch, Lease,
//! Maintenance (Status, Alarm) and Cluster (MemberList). Everything else answers
//! `Unimplemented`. The service traits and messages are the ones `etcd-client` generates
//! under its `build-server` feature, so the wire format is etcd's own.
//!
//! ```no_run
//! # async fn demo(backend: std::sync::Arc<dyn lattice_store::KvBackend>) -> anyhow::Result<()> {
//! use lattice_store::grpc::{EtcdGrpcServer, ServerInfo};
//! let server = EtcdGrpcServer::bind("127.0.0.1:0".parse()?, backend, ServerInfo::default()).await?;
//! println!("etcd API on {}", server.local_addr());
//! server.serve(std::future::pending::<()>()).await?;
//! # Ok(()) }
//! ```

mod convert;
mod services;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use etcd_client::proto::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::backend::KvBackend;
use crate::types::Member;

pub(crate) use convert::*;
pub use convert::{status_from_store_error, store_error_from_status};

/// etcd's default `--max-request-bytes`.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 3 * 512 * 1024;
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// gRPC framing allowance on top of the request limit (etcd's `grpcOverheadBytes`).
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// Where the facade learns the cluster's membership. The raft layer will implement this;
/// until then [`StaticMembership`] reports one member built from [`ServerInfo`].
pub trait Membership: Send + Sync + 'static {
    fn members(&self) -> Vec<Member>;

    /// The current raft term, stamped on every response header. `None` (the default): the
    /// facade uses the term from the backend's last status report.
    fn raft_term(&self) -> Option<u64> {
        None
    }
}

/// A fixed member list.
#[derive(Clone, Debug, Default)]
pub struct StaticMembership(pub Vec<Member>);

impl Membership for StaticMembership {
    fn members(&self) -> Vec<Member> {
        self.0.clone()
    }
}

impl<F> Membership for F
where
    F: Fn() -> Vec<Member> + Send + Sync + 'static,
{
    fn members(&self) -> Vec<Member> {
        self()
    }
}

/// Identity and limits of the serving member.
#[derive(Clone)]
pub struct ServerInfo {
    pub cluster_id: u64,
    pub member_id: u64,
    pub name: String,
    /// Advertised client URLs. Empty: `http://<bound address>` is used.
    pub client_urls: Vec<String>,
    pub peer_urls: Vec<String>,
    /// Reported by Maintenance.Status when the backend reports no version. Clients parse
    /// it as an etcd version, so keep it semver-shaped.
    pub version: String,
    /// Largest accepted request (etcd's `--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Most operations per transaction branch (etcd's `--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Membership provider; `None` means the single member described by this struct.
    pub membership: Option<Arc<dyn Membership>>,
}

impl Default for ServerInfo {
    fn default() -> Self {
        Self {
            cluster_id: 0x1a77_1ce0_0000_0001,
            member_id: 0x1a77_1ce0_0000_0001,
            name: "lattice".to_string(),
            client_urls: Vec::new(),
            peer_urls: Vec::new(),
            version: "3.5.0".to_string(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            membership: None,
        }
    }
}

impl std::fmt::Debug for ServerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerInfo")
            .field("cluster_id", &self.cluster_id)
            .field("member_id", &self.member_id)
            .field("name", &self.name)
            .field("client_urls", &self.client_urls)
            .field("peer_urls", &self.peer_urls)
            .field("version", &self.version)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("max_txn_ops", &self.max_txn_ops)
            .field("membership", &self.membership.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl ServerInfo {
    pub(crate) fn members(&self) -> Vec<Member> {
        match &self.membership {
            Some(m) => m.members(),
            None => vec![Member {
                id: self.member_id,
                name: self.name.clone(),
                peer_urls: self.peer_urls.clone(),
                client_urls: self.client_urls.clone(),
                is_learner: false,
            }],
        }
    }
}

/// A facade bound to a socket, not yet serving. Bind to port 0 and read
/// [`local_addr`](Self::local_addr) to learn the port.
///
/// Without [`with_tls`](Self::with_tls) it serves plaintext, which it allows on a
/// loopback address only ([`crate::tls::is_loopback`]): [`serve`](Self::serve) refuses any
/// other.
pub struct EtcdGrpcServer {
    listener: TcpListener,
    addr: SocketAddr,
    backend: Arc<dyn KvBackend>,
    info: ServerInfo,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl EtcdGrpcServer {
    pub async fn bind(
        addr: SocketAddr,
        backend: Arc<dyn KvBackend>,
        info: ServerInfo,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Self::from_listener(listener, backend, info)
    }

    pub fn from_listener(
        listener: TcpListener,
        backend: Arc<dyn KvBackend>,
        mut info: ServerInfo,
    ) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        if info.client_urls.is_empty() {
            info.client_urls = vec![format!("http://{addr}")];
        }
        Ok(Self {
            listener,
            addr,
            backend,
            info,
            tls: None,
        })
    }

    /// Serve mutual TLS with `config` (see [`crate::tls::MemberTls::etcd_server`]: it
    /// requires a client certificate and decides which identities get in). The advertised
    /// client URLs become `https://`.
    pub fn with_tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        for url in &mut self.info.client_urls {
            if let Some(rest) = url.strip_prefix("http://") {
                *url = format!("https://{rest}");
            }
        }
        self.tls = Some(config);
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve until `shutdown` completes; open streams (watches, keep-alives) are closed.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let Self {
            listener,
            addr,
            backend,
            info,
            tls,
        } = self;
        if tls.is_none() && !crate::tls::is_loopback(addr.ip()) {
            anyhow::bail!(
                "the etcd port {addr} would serve plaintext on a non-loopback address: \
                 give it TLS (member certificate and the cluster CA)"
            );
        }
        tracing::info!(%addr, cluster_id = info.cluster_id, member_id = info.member_id,
            tls = tls.is_some(), "etcd gRPC facade serving");
        let router = add_services(Server::builder(), backend, info);
        match tls {
            Some(config) => {
                router
                    .serve_with_incoming_shutdown(
                        crate::tls::incoming(listener, config, crate::tls::ETCD_PORT),
                        shutdown,
                    )
                    .await?
            }
            None => {
                router
                    .serve_with_incoming_shutdown(
                        TcpIncoming::from(listener).with_nodelay(Some(true)),
                        shutdown,
                    )
                    .await?
            }
        }
        tracing::info!(%addr, "etcd gRPC facade stopped");
        Ok(())
    }

    /// Serve in a background task; the returned handle stops it.
    pub fn spawn(self) -> ServerHandle {
        let addr = self.addr;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.serve(async move {
            let _ = rx.await;
        }));
        ServerHandle {
            addr,
            stop: Some(tx),
            task,
        }
    }
}

/// A facade running in the background (see [`EtcdGrpcServer::spawn`]). Dropping it stops
/// the server too.
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServerHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port`, as etcdctl's `--endpoints` wants it.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(anyhow::anyhow!("facade task failed: {e}")),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serve the facade on `addr` until `shutdown` completes.
pub async fn serve(
    backend: Arc<dyn KvBackend>,
    addr: SocketAddr,
    info: ServerInfo,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    EtcdGrpcServer::bind(addr, backend, info)
        .await?
        .serve(shutdown)
        .await
}

/// Add the five etcd services to a tonic server builder, e.g. to share a port with other
/// gRPC services (the raft transport).
pub fn add_services(
    mut builder: Server,
    backend: Arc<dyn KvBackend>,
    info: ServerInfo,
) -> tonic::transport::server::Router {
    let max = info.max_request_bytes.saturating_add(GRPC_OVERHEAD_BYTES);
    let state = Arc::new(services::Shared::new(backend, info));
    // Seed the raft term for response headers; Status calls keep it fresh.
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let seed = state.clone();
        handle.spawn(async move { seed.refresh_term().await });
    }
    builder
        .add_service(
            PbKvServer::from_arc(Arc::new(services::KvSvc(state.clone())))
                .max_decoding_message_size(max),
        )
        .add_service(
            PbWatchServer::from_arc(Arc::new(watch::WatchSvc(state.clone())))
                .max_decoding_message_size(max),
        )
        .add_service(
            PbLeaseServer::from_arc(Arc::new(services::LeaseSvc(state.clone())))
                .max_decoding_message_size(max),
        )
        .add_service(
            PbMaintenanceServer::from_arc(Arc::new(services::MaintenanceSvc(state.clone())))
                .max_decoding_message_size(max),
        )
        .add_service(
            PbClusterServer::from_arc(Arc::new(services::ClusterSvc(state)))
                .max_decoding_message_size(max),
        )
}
