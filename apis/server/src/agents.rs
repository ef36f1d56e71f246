//! How the API server reaches node agents (proxied logs, attach sessions).
//!
//! With a node identity, an agent serves HTTPS with its `node:<name>` certificate and
//! accepts only the API server's client certificate. The server dials the address the
//! agent published (`Node.status.agent.address`) but verifies the certificate against
//! the cluster CA for the name `<node>.nodes.lattice.internal`: an agent that published
//! another node's address, or anything else listening there, cannot pass for that node.
//! Without TLS configured (a server without authentication, whose agents have no
//! identity) agents are reached over plain HTTP.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::errors::{ApiError, ApiResult};

/// A byte stream to an agent (TCP, or TLS over TCP).
pub trait AgentIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AgentIo for T {}

/// A connection to an agent.
pub type AgentStream = Pin<Box<dyn AgentIo>>;

/// Resolves `<node>.nodes.lattice.internal` to the address that node's agent published.
#[derive(Default)]
struct NodeAddrs(RwLock<HashMap<String, SocketAddr>>);

impl reqwest::dns::Resolve for NodeAddrs {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let found = self
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name.as_str())
            .copied();
        Box::pin(async move {
            match found {
                Some(a) => Ok(Box::new(std::iter::once(a)) as reqwest::dns::Addrs),
                None => Err(format!("no agent address known for {}", name.as_str()).into()),
            }
        })
    }
}

/// Dials agents.
pub struct Agents {
    tls: Option<Arc<rustls::ClientConfig>>,
    addrs: Arc<NodeAddrs>,
    http: OnceLock<reqwest::Client>,
}

impl Agents {
    /// Over TLS with `tls` (see the module docs), or plain HTTP without.
    pub fn new(tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self {
            tls,
            addrs: Arc::default(),
            http: OnceLock::new(),
        }
    }

    /// The HTTP client for [`url`](Self::url)s.
    pub fn http(&self) -> &reqwest::Client {
        self.http.get_or_init(|| {
            let b = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .dns_resolver(self.addrs.clone());
            let b = match &self.tls {
                Some(tls) => b.use_preconfigured_tls((**tls).clone()),
                None => b,
            };
            b.build().unwrap_or_default()
        })
    }

    /// The URL of `path` on `node`'s agent, published at `addr`.
    pub async fn url(&self, node: &str, addr: &str, path: &str) -> ApiResult<String> {
        if self.tls.is_none() {
            return Ok(format!("http://{addr}{path}"));
        }
        let sock = resolve(node, addr).await?;
        let name = lattice_pki::Identity::node_dns_name(node);
        self.addrs
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), sock);
        Ok(format!("https://{name}:{}{path}", sock.port()))
    }

    /// A connection to `node`'s agent at `addr` (for a WebSocket), and the scheme to
    /// speak over it (`ws` or `wss`).
    pub async fn connect(&self, node: &str, addr: &str) -> ApiResult<(AgentStream, &'static str)> {
        let unreachable = |e: String| {
            ApiError::unavailable(format!("cannot reach node {node}'s agent at {addr}: {e}"))
        };
        let sock = resolve(node, addr).await?;
        let tcp =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(sock))
                .await
                .map_err(|_| unreachable("timed out".into()))?
                .map_err(|e| unreachable(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Ok((Box::pin(tcp), "ws"));
        };
        let name =
            rustls_pki_types::ServerName::try_from(lattice_pki::Identity::node_dns_name(node))
                .map_err(|e| ApiError::internal(format!("node name {node:?}: {e}")))?;
        let conn = tokio_rustls::TlsConnector::from(tls.clone());
        let stream = tokio::time::timeout(Duration::from_secs(5), conn.connect(name, tcp))
            .await
            .map_err(|_| unreachable("TLS handshake timed out".into()))?
            .map_err(|e| unreachable(format!("TLS: {e} (is it really node {node}'s agent?)")))?;
        Ok((Box::pin(stream), "wss"))
    }
}

/// `addr` (`host:port`) as a socket address.
async fn resolve(node: &str, addr: &str) -> ApiResult<SocketAddr> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    tokio::net::lookup_host(addr)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            ApiError::unavailable(format!(
                "node {node}'s agent address {addr:?} does not resolve"
            ))
        })
}

/// An error with its causes ("error sending request: connection refused"): reqwest's
/// own message names only the outermost.
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}
