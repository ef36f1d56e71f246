//! The PMI fence across a step's nodes: the agents exchange their ranks' puts over gRPC
//! (`proto/pmi.proto`), on the agent endpoint, authenticated by their node certificates.
//!
//! The step's nodes form a tree in their `status.assignedNodes` order: node `i`'s parent
//! is `(i - 1) / fan_in`, so below `fan_in + 1` nodes it is a star around the first node.
//! A node enters fence `r` once its own ranks have and every child has sent its
//! subtree's puts; it sends the union to its parent and waits; the root answers with
//! everything, and each node hands the answer down to its children. Each request is
//! accepted only from the node the tree says is the child at that index (its
//! certificate's `node:<name>`), for a step this node runs.
//!
//! An abort goes from the node where it happened to every other node of the step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lattice_pki::Identity;
use tokio::sync::{mpsc, oneshot, Notify};
use tonic::{Request, Response, Status};

use super::{Exchange, PmiEvent};

/// The generated gRPC code.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("lattice.pmi.v1");
}

use proto::pmi_exchange_client::PmiExchangeClient;
use proto::pmi_exchange_server::{PmiExchange, PmiExchangeServer};

/// The largest fence message accepted (every rank's business card of a large step).
pub const MAX_MESSAGE: usize = 64 << 20;
/// How long a request for a step waits for this node to start its part of it.
const REGISTRATION_WAIT: Duration = Duration::from_secs(30);
/// How long an abort notice may take to reach a node.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The tree: the parent of node `i`.
pub fn parent(i: usize, fan_in: usize) -> Option<usize> {
    (i > 0).then(|| (i - 1) / fan_in.max(1))
}

/// The tree: the children of node `i` among `n`.
pub fn children(i: usize, n: usize, fan_in: usize) -> std::ops::Range<usize> {
    let f = fan_in.max(1);
    let first = (i * f + 1).min(n);
    first..(i * f + f + 1).min(n)
}

/// How to reach the other agents.
#[derive(Clone)]
pub struct Peers {
    /// TLS with this node's certificate (`None`: plain HTTP, an agent without identity).
    tls: Option<Arc<rustls::ClientConfig>>,
    channels: Arc<Mutex<HashMap<String, tonic::transport::Channel>>>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// Peers reached with `tls` (its ALPN is set to HTTP/2 here).
    pub fn new(tls: Option<rustls::ClientConfig>) -> Peers {
        let tls = tls.map(|mut c| {
            c.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(c)
        });
        Peers {
            tls,
            channels: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A client for the agent of `node` at `address` (`host:port`).
    fn client(
        &self,
        node: &str,
        address: &str,
    ) -> Result<PmiExchangeClient<tonic::transport::Channel>, String> {
        if address.is_empty() {
            return Err(format!("node {node} reported no agent address"));
        }
        let key = format!("{node}@{address}");
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let ch = match channels.get(&key) {
            Some(c) => c.clone(),
            None => {
                let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                    .map_err(|e| format!("agent address {address:?} of {node}: {e}"))?
                    .connect_timeout(Duration::from_secs(10))
                    .http2_keep_alive_interval(Duration::from_secs(20))
                    .keep_alive_while_idle(false);
                let ch = match &self.tls {
                    None => endpoint.connect_lazy(),
                    Some(tls) => {
                        let (tls, addr) = (tls.clone(), address.to_string());
                        let name = Identity::node_dns_name(node);
                        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                            let (tls, addr, name) = (tls.clone(), addr.clone(), name.clone());
                            async move {
                                let server = rustls::pki_types::ServerName::try_from(name)
                                    .map_err(std::io::Error::other)?;
                                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                                tcp.set_nodelay(true)?;
                                let s = tokio_rustls::TlsConnector::from(tls)
                                    .connect(server, tcp)
                                    .await?;
                                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                            }
                        });
                        endpoint.connect_with_connector_lazy(connector)
                    }
                };
                channels.insert(key, ch.clone());
                ch
            }
        };
        Ok(PmiExchangeClient::new(ch)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }
}

/// One fence round as seen by one node: its children's contributions so far, and the
/// children waiting for the answer.
#[derive(Default)]
struct Round {
    entries: BTreeMap<String, String>,
    from: BTreeSet<usize>,
    waiting: Vec<oneshot::Sender<Result<BTreeMap<String, String>, String>>>,
}

/// This node's part in one step's exchange.
pub struct StepLink {
    uid: String,
    attempt: u32,
    index: usize,
    nodes: Vec<String>,
    addresses: Vec<String>,
    fan_in: usize,
    rounds: Mutex<HashMap<u64, Round>>,
    /// Fences this node has completed: a child's next request is for exactly this one.
    completed: std::sync::atomic::AtomicU64,
    arrived: Notify,
    events: mpsc::UnboundedSender<PmiEvent>,
    peers: Peers,
}

impl std::fmt::Debug for StepLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepLink")
            .field("uid", &self.uid)
            .field("attempt", &self.attempt)
            .field("index", &self.index)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// The steps this node takes part in, for the gRPC service to find.
#[derive(Debug, Default)]
pub struct Registry {
    steps: Mutex<HashMap<(String, u32), Arc<StepLink>>>,
    added: Notify,
}

impl Registry {
    async fn find(&self, uid: &str, attempt: u32) -> Option<Arc<StepLink>> {
        let deadline = tokio::time::Instant::now() + REGISTRATION_WAIT;
        loop {
            let added = self.added.notified();
            if let Some(l) = self
                .steps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(uid.to_string(), attempt))
            {
                return Some(l.clone());
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return None;
            }
        }
    }
}

/// What a step's exchange is built from.
#[derive(Debug, Clone)]
pub struct StepPeers {
    /// The step's uid and attempt.
    pub uid: String,
    /// The attempt.
    pub attempt: u32,
    /// The step's nodes, in order.
    pub nodes: Vec<String>,
    /// Their agent addresses, in the same order.
    pub addresses: Vec<String>,
    /// This node's index in `nodes`.
    pub index: usize,
    /// Children per node in the tree.
    pub fan_in: usize,
}

/// A multi-node step's [`Exchange`] (deregistered when dropped).
#[derive(Debug)]
pub struct TreeExchange {
    link: Arc<StepLink>,
    registry: Arc<Registry>,
}

impl TreeExchange {
    /// Join the exchange of `step`; remote aborts go to `events`.
    pub fn register(
        registry: Arc<Registry>,
        peers: Peers,
        step: StepPeers,
        events: mpsc::UnboundedSender<PmiEvent>,
    ) -> TreeExchange {
        let link = Arc::new(StepLink {
            uid: step.uid,
            attempt: step.attempt,
            index: step.index,
            nodes: step.nodes,
            addresses: step.addresses,
            fan_in: step.fan_in.max(1),
            rounds: Mutex::new(HashMap::new()),
            completed: std::sync::atomic::AtomicU64::new(0),
            arrived: Notify::new(),
            events,
            peers,
        });
        registry
            .steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((link.uid.clone(), link.attempt), link.clone());
        registry.added.notify_waiters();
        TreeExchange { link, registry }
    }
}

impl Drop for TreeExchange {
    fn drop(&mut self) {
        let mut steps = self
            .registry
            .steps
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (self.link.uid.clone(), self.link.attempt);
        if steps.get(&key).is_some_and(|l| Arc::ptr_eq(l, &self.link)) {
            steps.remove(&key);
        }
        // Children still waiting learn that this node is gone.
        for (_, r) in self
            .link
            .rounds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            for w in r.waiting {
                let _ = w.send(Err("the parent node's part of the step ended".into()));
            }
        }
    }
}

impl StepLink {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Round>> {
        self.rounds.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Exchange for TreeExchange {
    async fn fence(
        &self,
        round: u64,
        puts: BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, String> {
        let l = &self.link;
        let kids: BTreeSet<usize> = children(l.index, l.nodes.len(), l.fan_in).collect();
        // Wait for every child's subtree.
        loop {
            let arrived = l.arrived.notified();
            let all_in = l
                .lock()
                .get(&round)
                .map_or(kids.is_empty(), |r| r.from.is_superset(&kids));
            if all_in {
                break;
            }
            arrived.await;
        }
        let mut all = l
            .lock()
            .get_mut(&round)
            .map(|r| std::mem::take(&mut r.entries))
            .unwrap_or_default();
        all.extend(puts);
        let result = match parent(l.index, l.fan_in) {
            None => Ok(all),
            Some(p) => {
                let (node, addr) = (&l.nodes[p], &l.addresses[p]);
                match l.peers.client(node, addr) {
                    Err(e) => Err(e),
                    Ok(mut c) => c
                        .fence(proto::FenceRequest {
                            step_uid: l.uid.clone(),
                            attempt: l.attempt,
                            round,
                            from_index: l.index as u32,
                            entries: all.into_iter().collect(),
                        })
                        .await
                        .map(|r| r.into_inner().entries.into_iter().collect())
                        .map_err(|s| format!("node {node} ({addr}): {}", s.message())),
                }
            }
        };
        let waiting = {
            let mut rounds = l.lock();
            l.completed
                .store(round + 1, std::sync::atomic::Ordering::SeqCst);
            rounds.remove(&round).map(|r| r.waiting).unwrap_or_default()
        };
        for w in waiting {
            let _ = w.send(result.clone());
        }
        result
    }

    async fn abort(&self, message: &str) {
        let l = &self.link;
        let mut sends = Vec::new();
        for (i, (node, addr)) in l.nodes.iter().zip(&l.addresses).enumerate() {
            if i == l.index {
                continue;
            }
            let req = proto::AbortRequest {
                step_uid: l.uid.clone(),
                attempt: l.attempt,
                from_index: l.index as u32,
                message: message.to_string(),
            };
            let client = l.peers.client(node, addr);
            let node = node.clone();
            sends.push(async move {
                let r = match client {
                    Ok(mut c) => tokio::time::timeout(ABORT_TIMEOUT, c.abort(req))
                        .await
                        .map_err(|_| "timed out".to_string())
                        .and_then(|r| r.map(|_| ()).map_err(|s| s.message().to_string())),
                    Err(e) => Err(e),
                };
                if let Err(e) = r {
                    tracing::warn!(%node, error = %e, "cannot tell a node that the MPI step aborted");
                }
            });
        }
        futures::future::join_all(sends).await;
    }
}

/// The gRPC service (mounted on the agent endpoint).
#[derive(Debug, Clone)]
pub struct Service {
    registry: Arc<Registry>,
}

impl Service {
    /// The service for `registry`'s steps.
    pub fn new(registry: Arc<Registry>) -> PmiExchangeServer<Service> {
        PmiExchangeServer::new(Service { registry })
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }
}

/// The node on the other end: its certificate's name. A plain endpoint (an agent without
/// identity, on loopback only) has no peer identity and trusts the index it is given.
fn peer_node<T>(req: &Request<T>) -> Result<Option<String>, Status> {
    match req.extensions().get::<crate::server::Peer>() {
        None | Some(crate::server::Peer(None)) => Ok(None),
        Some(crate::server::Peer(Some(Identity::Node(n)))) => Ok(Some(n.clone())),
        Some(crate::server::Peer(Some(other))) => Err(Status::permission_denied(format!(
            "{other} is not a node: only the agents of a step exchange its PMI data"
        ))),
    }
}

impl Service {
    async fn link(
        &self,
        uid: &str,
        attempt: u32,
        from: u32,
        who: Option<&str>,
    ) -> Result<Arc<StepLink>, Status> {
        let link = self.registry.find(uid, attempt).await.ok_or_else(|| {
            Status::not_found(format!(
                "this node runs no MPI step {uid} (attempt {attempt}) with a PMI server"
            ))
        })?;
        let from = from as usize;
        let Some(expected) = link.nodes.get(from) else {
            return Err(Status::invalid_argument(format!(
                "node index {from} is outside the step's {} nodes",
                link.nodes.len()
            )));
        };
        if let Some(who) = who {
            if who != expected {
                return Err(Status::permission_denied(format!(
                    "node {who} is not node {from} ({expected}) of this step"
                )));
            }
        }
        Ok(link)
    }
}

#[tonic::async_trait]
impl PmiExchange for Service {
    async fn fence(
        &self,
        req: Request<proto::FenceRequest>,
    ) -> Result<Response<proto::FenceReply>, Status> {
        let who = peer_node(&req)?;
        let r = req.into_inner();
        let link = self
            .link(&r.step_uid, r.attempt, r.from_index, who.as_deref())
            .await?;
        let from = r.from_index as usize;
        if parent(from, link.fan_in) != Some(link.index) {
            return Err(Status::permission_denied(format!(
                "node {from} of the step does not report to node {} in the fence tree",
                link.index
            )));
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut rounds = link.lock();
            let next = link.completed.load(std::sync::atomic::Ordering::SeqCst);
            if r.round != next {
                return Err(Status::failed_precondition(format!(
                    "fence {} is not this node's next one ({next})",
                    r.round
                )));
            }
            let round = rounds.entry(r.round).or_default();
            if !round.from.insert(from) {
                return Err(Status::already_exists(format!(
                    "node {from} already entered fence {}",
                    r.round
                )));
            }
            round.entries.extend(r.entries);
            round.waiting.push(tx);
        }
        link.arrived.notify_waiters();
        match rx.await {
            Ok(Ok(all)) => Ok(Response::new(proto::FenceReply {
                entries: all.into_iter().collect(),
            })),
            Ok(Err(e)) => Err(Status::aborted(e)),
            Err(_) => Err(Status::aborted("this node's part of the step ended")),
        }
    }

    async fn abort(
        &self,
        req: Request<proto::AbortRequest>,
    ) -> Result<Response<proto::AbortReply>, Status> {
        let who = peer_node(&req)?;
        let r = req.into_inner();
        let link = self
            .link(&r.step_uid, r.attempt, r.from_index, who.as_deref())
            .await?;
        let _ = link.events.send(PmiEvent::Abort(super::tidy(&r.message)));
        Ok(Response::new(proto::AbortReply {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_a_star_below_the_fan_in() {
        assert_eq!(children(0, 4, 32), 1..4);
        assert_eq!(children(1, 4, 32), 4..4);
        assert_eq!(parent(3, 32), Some(0));
        // Fan-in 2 over 7 nodes: 0 -> 1,2; 1 -> 3,4; 2 -> 5,6.
        assert_eq!(children(0, 7, 2), 1..3);
        assert_eq!(children(1, 7, 2), 3..5);
        assert_eq!(children(2, 7, 2), 5..7);
        assert_eq!(children(3, 7, 2), 7..7);
        for i in 1..7 {
            let p = parent(i, 2).unwrap();
            assert!(children(p, 7, 2).contains(&i));
        }
        assert_eq!(parent(0, 2), None);
    }
}
