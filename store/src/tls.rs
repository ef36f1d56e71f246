//! Mutual TLS for the store's two ports: the etcd v3 port (clients) and the Raft port
//! (members).
//!
//! Both use certificates from the cluster CA (`lattice-pki`), one per member (common name
//! `member:<id>`, the member's addresses as subject alternative names, client and server
//! usage). Who may connect is decided in the handshake, before any request:
//!
//! | port | client certificate required from the CA, with identity | the client checks the server |
//! |---|---|---|
//! | Raft | a member (`member:<id>`) | chain, address, and that it is a member |
//! | etcd | a member, an administrator (`admin:<name>`) or the API server (`system:apiserver`) | chain and address |
//!
//! The etcd port is full read and write access to the whole store, so nodes
//! (`node:<name>`) and the controllers' identity never get in: they go through the API
//! server, which authorizes every request. The Raft port's requests that change the
//! membership are further checked per request (see `raft::network`).
//!
//! TLS runs under tonic (`serve_with_incoming`, `connect_with_connector`) with
//! tokio-rustls, so a handshake happens once per connection and the Raft transport's
//! long-lived HTTP/2 streams (one per replication target, one per leader for forwarded
//! requests) carry every later request without another. Handshakes run in tasks of their
//! own (at most [`MAX_HANDSHAKES`] at a time, each at most [`HANDSHAKE_TIMEOUT`]), so a
//! silent client holds up neither the accept loop nor other clients.
//!
//! Plaintext is for loopback only: [`is_loopback`] is the test, and a port serving
//! without TLS refuses any other listen address (and the Raft client refuses to dial one).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use lattice_pki::{Admit, Identity};
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{StoreError, StoreResult};

/// rustls' client configuration, as [`etcd_client_config`] returns it.
pub use rustls::ClientConfig as TlsClientConfig;

/// The etcd port's name in logs and messages.
pub const ETCD_PORT: &str = "the etcd port";
/// The Raft port's name in logs and messages.
pub const RAFT_PORT: &str = "the Raft port";

/// Most TLS handshakes in progress on one port; connections beyond are closed at once.
pub const MAX_HANDSHAKES: usize = 256;
/// Longest a TLS handshake may take before the connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A member certificate this close to its expiry is warned about at start.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whether `ip` is a loopback address (127.0.0.0/8, ::1, or ::ffff:127.x.y.z): what a
/// process on another machine cannot reach. The unspecified address (0.0.0.0, ::) is not:
/// a listener bound to it is reachable on every interface.
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Whether a `host:port` endpoint names a loopback address: a loopback IP, or `localhost`
/// (which resolves to one, RFC 6761).
pub fn is_loopback_endpoint(endpoint: &str) -> bool {
    let Some((host, _port)) = split_host_port(endpoint) else {
        return false;
    };
    match host.parse::<IpAddr>() {
        Ok(ip) => is_loopback(ip),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// `host:port` or `[v6]:port` → (host without brackets, port).
fn split_host_port(endpoint: &str) -> Option<(&str, &str)> {
    let endpoint = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .unwrap_or(endpoint);
    let (host, port) = endpoint.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty() && !port.is_empty()).then_some((host, port))
}

/// Who may connect to the Raft port: members only.
pub fn raft_port_admits(id: &Identity) -> bool {
    matches!(id, Identity::Member(_))
}

/// Who may connect to the etcd port: members, administrators and the API server. Never
/// nodes or the controllers' identity (the etcd port bypasses the API server's
/// authorization: it reads and writes every key).
pub fn etcd_port_admits(id: &Identity) -> bool {
    matches!(
        id,
        Identity::Member(_) | Identity::Admin(_) | Identity::ApiServer
    )
}

fn tls_err(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::InvalidArgument(format!("{what}: {e}"))
}

/// A member's TLS material: the cluster CA and its own certificate and key, with the
/// configurations built from them.
#[derive(Clone)]
pub struct MemberTls {
    member_id: u64,
    serial: String,
    not_after: SystemTime,
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    raft_server: Arc<ServerConfig>,
    raft_client: Arc<ClientConfig>,
}

impl std::fmt::Debug for MemberTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberTls")
            .field("member_id", &self.member_id)
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl MemberTls {
    /// From PEM texts: the CA certificate, this member's certificate (chain) and key. The
    /// certificate must be a member's (`member:<id>`), signed by the CA and valid now.
    pub fn from_pem(ca_pem: &str, cert_pem: &str, key_pem: &str) -> StoreResult<MemberTls> {
        let info =
            lattice_pki::inspect_pem(cert_pem).map_err(|e| tls_err("member certificate", e))?;
        let member_id = match info.identity {
            Some(Identity::Member(id)) => id,
            _ => {
                return Err(StoreError::InvalidArgument(format!(
                    "the member certificate is for {:?}, not a store member (common name \
                     member:<id>; issue one with `lattice admin pki issue member --id N`)",
                    info.common_name
                )))
            }
        };
        check_signed_by(ca_pem, cert_pem)?;
        let members = Admit::new(RAFT_PORT, raft_port_admits);
        let mut raft_server =
            lattice_pki::server_config_admitting(cert_pem, key_pem, ca_pem, members.clone())
                .map_err(|e| tls_err("Raft port TLS", e))?;
        raft_server.alpn_protocols = vec![b"h2".to_vec()];
        let mut raft_client =
            lattice_pki::client_config_expecting(ca_pem, Some((cert_pem, key_pem)), members)
                .map_err(|e| tls_err("Raft client TLS", e))?;
        raft_client.alpn_protocols = vec![b"h2".to_vec()];
        if let Ok(left) = info.not_after.duration_since(SystemTime::now()) {
            if left < EXPIRY_WARNING {
                tracing::warn!(
                    member = member_id,
                    serial = %info.serial,
                    days_left = left.as_secs() / 86_400,
                    "the member certificate expires soon: issue a new one and rotate it in \
                     (docs/operations/certificates.md, \"Certificates for store members\")"
                );
            }
        }
        Ok(MemberTls {
            member_id,
            serial: info.serial,
            not_after: info.not_after,
            ca_pem: ca_pem.to_string(),
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            raft_server: Arc::new(raft_server),
            raft_client: Arc::new(raft_client),
        })
    }

    /// From files: the CA certificate, this member's certificate and key.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> StoreResult<MemberTls> {
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map_err(|e| StoreError::InvalidArgument(format!("{}: {e}", p.display())))
        };
        Self::from_pem(&read(ca)?, &read(cert)?, &read(key)?).map_err(|e| match e {
            StoreError::InvalidArgument(m) => StoreError::InvalidArgument(format!(
                "{m} (CA {}, certificate {}, key {})",
                ca.display(),
                cert.display(),
                key.display()
            )),
            other => other,
        })
    }

    /// The member ID the certificate names.
    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// The certificate's serial number (hex).
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// When the certificate expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The Raft port's server configuration (members only).
    pub fn raft_server(&self) -> Arc<ServerConfig> {
        self.raft_server.clone()
    }

    /// The Raft client's configuration: presents this member's certificate, accepts only
    /// a member's.
    pub fn raft_client(&self) -> Arc<ClientConfig> {
        self.raft_client.clone()
    }

    /// The etcd port's server configuration, admitting what `admit` admits (normally
    /// [`etcd_port_admits`]).
    pub fn etcd_server(&self, admit: Admit) -> StoreResult<Arc<ServerConfig>> {
        let mut cfg = lattice_pki::server_config_admitting(
            &self.cert_pem,
            &self.key_pem,
            &self.ca_pem,
            admit,
        )
        .map_err(|e| tls_err("etcd port TLS", e))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// A member's certificate and key in its PKI directory (beside `ca.crt`).
pub const MEMBER_CERT: &str = "member.crt";
/// The member certificate's key.
pub const MEMBER_KEY: &str = "member.key";
/// Lifetime of a member certificate issued at start; it is issued again once two thirds
/// are gone (at a start).
pub const MEMBER_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The names every member certificate is issued for, beside its addresses.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl MemberTls {
    /// This member's material in `dir` (its `--pki-dir`, where the cluster CA lives):
    /// `member.crt` and `member.key` when they are this member's, from `dir/ca.crt`, valid
    /// for every name in `names` (and the loopback names) and not due for renewal.
    /// Otherwise, when the CA's key is in `dir`, a new certificate is issued and written
    /// there (for `names`, the loopback names and `extra`: the machine's other addresses
    /// and host name); the CA itself is made when `dir` holds none, as the API server makes
    /// it. A certificate that is not current while no CA key is at hand is still used if
    /// it is valid, with a warning; one that is not this member's, or not valid, is an
    /// error naming what to do.
    pub fn load_or_issue(
        dir: &Path,
        node_id: u64,
        names: &[String],
        extra: &[String],
    ) -> StoreResult<MemberTls> {
        let (ca_crt, ca_key) = (
            dir.join(lattice_pki::CA_CERT),
            dir.join(lattice_pki::CA_KEY),
        );
        let (crt, key) = (dir.join(MEMBER_CERT), dir.join(MEMBER_KEY));
        let mut required: Vec<String> = LOOPBACK_NAMES.iter().map(|n| n.to_string()).collect();
        for n in names {
            if !required.contains(n) {
                required.push(n.clone());
            }
        }
        let existing = match (
            std::fs::read_to_string(&ca_crt),
            std::fs::read_to_string(&crt),
            std::fs::read_to_string(&key),
        ) {
            (Ok(ca), Ok(c), Ok(k)) => Some((ca, c, k)),
            _ => None,
        };
        if let Some((ca, c, k)) = &existing {
            let mine = lattice_pki::inspect_pem(c).is_ok_and(|i| {
                i.identity == Some(Identity::Member(node_id)) && i.renew_at() > SystemTime::now()
            });
            if mine && valid_for(ca, c, &required) {
                return Self::from_pem(ca, c, k);
            }
        }
        let have_ca_key = ca_key.exists();
        if !have_ca_key && ca_crt.exists() {
            // Issued elsewhere (the CA's key is kept off this machine): use it as it is
            // if it can be used at all.
            let (ca, c, k) = existing.ok_or_else(|| {
                StoreError::InvalidArgument(format!(
                    "{} holds the cluster CA's certificate but neither this member's \
                     certificate ({MEMBER_CERT}, {MEMBER_KEY}) nor the CA's key to issue one: \
                     issue it with `lattice admin pki issue member --id {node_id} --ip ADDRESS \
                     --out {}` where the CA's key is",
                    dir.display(),
                    dir.display()
                ))
            })?;
            let tls = Self::from_pem(&ca, &c, &k)
                .map_err(|e| StoreError::InvalidArgument(format!("{e} ({})", crt.display())))?;
            if tls.member_id != node_id {
                return Err(StoreError::InvalidArgument(format!(
                    "{} is member {}'s certificate, this is member {node_id}",
                    crt.display(),
                    tls.member_id
                )));
            }
            tracing::warn!(
                cert = %crt.display(),
                names = ?required,
                "the member certificate is due for renewal or not for every address this \
                 member uses, and the CA's key is not here to issue another"
            );
            return Ok(tls);
        }
        let ca = lattice_pki::Ca::load_or_generate(dir, "Lattice cluster CA")
            .map_err(|e| tls_err("the cluster CA", e))?;
        let mut req = lattice_pki::IssueRequest::new(
            Identity::Member(node_id),
            lattice_pki::Usage::ClientAndServer,
        )
        .validity(MEMBER_CERT_VALIDITY);
        for n in required.iter().chain(extra) {
            req = req.name(n);
        }
        let issued = ca
            .issue(&req)
            .map_err(|e| tls_err("issuing the member certificate", e))?;
        issued
            .save(dir, "member")
            .map_err(|e| tls_err("saving the member certificate", e))?;
        tracing::info!(
            member = node_id,
            cert = %crt.display(),
            dns_names = ?req.dns_names,
            ips = ?req.ips,
            "issued this member's certificate from the cluster CA"
        );
        Self::from_pem(ca.cert_pem(), &issued.cert_pem, &issued.key_pem)
    }
}

/// Whether `cert_pem` chains to `ca_pem`, is valid now, and a client dialling any of
/// `names` would accept it as the server.
fn valid_for(ca_pem: &str, cert_pem: &str, names: &[String]) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    let (Ok(roots), Ok(chain)) = (lattice_pki::roots(ca_pem), lattice_pki::certs(cert_pem)) else {
        return false;
    };
    let Ok(verifier) = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build() else {
        return false;
    };
    let now = rustls_pki_types::UnixTime::now();
    names.iter().all(|n| {
        ServerName::try_from(n.clone()).is_ok_and(|name| {
            verifier
                .verify_server_cert(&chain[0], &chain[1..], &name, &[], now)
                .is_ok()
        })
    })
}

/// This machine's host name and its addresses that are up and reachable from elsewhere
/// (not loopback, not link-local): what a certificate for a listener on the unspecified
/// address (`0.0.0.0`, `::`) is issued for.
pub fn local_names() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            out.push(h.to_string());
        }
    }
    // SAFETY: getifaddrs fills a list it allocates; it is only read here, then freed once.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut cur = list;
        while !cur.is_null() {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_flags & (libc::IFF_UP as u32) == 0 || ifa.ifa_addr.is_null() {
                continue;
            }
            let ip = match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            };
            let link_local = match ip {
                IpAddr::V4(v4) => v4.is_link_local(),
                IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
            };
            if !is_loopback(ip) && !link_local && !out.contains(&ip.to_string()) {
                out.push(ip.to_string());
            }
        }
        libc::freeifaddrs(list);
    }
    out
}

/// Fail unless `cert_pem` chains to `ca_pem` and is valid now (as a client certificate:
/// every member certificate is one).
fn check_signed_by(ca_pem: &str, cert_pem: &str) -> StoreResult<()> {
    let roots = lattice_pki::roots(ca_pem).map_err(|e| tls_err("CA certificate", e))?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| tls_err("CA certificate", e))?;
    let chain = lattice_pki::certs(cert_pem).map_err(|e| tls_err("member certificate", e))?;
    verifier
        .verify_client_cert(&chain[0], &chain[1..], rustls_pki_types::UnixTime::now())
        .map(|_| ())
        .map_err(|e| {
            StoreError::InvalidArgument(format!(
                "the member certificate does not verify against the CA certificate ({e}): \
                 it is from another CA, expired, or not valid for client use"
            ))
        })
}

/// A TLS client configuration for the etcd port (etcdctl's `--cacert/--cert/--key`):
/// trusts `ca_pem`, presents `cert_pem`/`key_pem`.
pub fn etcd_client_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> StoreResult<Arc<ClientConfig>> {
    let mut cfg = lattice_pki::client_config(ca_pem, Some((cert_pem, key_pem)))
        .map_err(|e| tls_err("etcd client TLS", e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// [`etcd_client_config`] from files.
pub fn load_etcd_client_config(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> StoreResult<Arc<ClientConfig>> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| StoreError::InvalidArgument(format!("{}: {e}", p.display())))
    };
    etcd_client_config(&read(ca)?, &read(cert)?, &read(key)?)
}

/// What a request on a TLS connection knows of its peer (a request extension: tonic
/// puts the connection's [`Connected::connect_info`] on every request).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub remote_addr: SocketAddr,
    /// The identity its (verified) client certificate carries.
    pub identity: Option<Identity>,
    /// Its certificate's serial (hex).
    pub serial: Option<String>,
}

/// A server-side TLS connection whose handshake has completed.
pub struct TlsConn {
    inner: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
}

impl Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The accepted, handshaken connections of `listener`, for tonic's
/// `serve_with_incoming`. Accepting stops (and the listener closes) once the stream is
/// dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    what: &'static str,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        let handshaking = Arc::new(AtomicUsize::new(0));
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(endpoint = what, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // One small write per Raft message: no Nagle delay.
            let _ = tcp.set_nodelay(true);
            if handshaking.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
                handshaking.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(endpoint = what, %peer, "too many TLS handshakes in progress; connection closed");
                continue;
            }
            let (acceptor, tx, handshaking) = (acceptor.clone(), tx.clone(), handshaking.clone());
            tokio::spawn(async move {
                let shaken = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                handshaking.fetch_sub(1, Ordering::AcqRel);
                match shaken {
                    Ok(Ok(stream)) => {
                        let peer_cert = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(lattice_pki::peer_info);
                        let info = PeerInfo {
                            remote_addr: peer,
                            identity: peer_cert.as_ref().and_then(|c| c.identity.clone()),
                            serial: peer_cert.map(|c| c.serial),
                        };
                        tracing::debug!(endpoint = what, %peer, identity = ?info.identity, "TLS connection");
                        let _ = tx
                            .send(Ok(TlsConn {
                                inner: stream,
                                info,
                            }))
                            .await;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(endpoint = what, %peer, error = %e, "TLS handshake failed")
                    }
                    Err(_) => {
                        tracing::info!(endpoint = what, %peer, "TLS handshake timed out")
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Dial `endpoint` (`host:port`) and complete a TLS handshake, verifying the server's
/// certificate for `host`.
async fn dial(
    endpoint: &str,
    config: Arc<ClientConfig>,
) -> io::Result<hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>> {
    let (host, _) = split_host_port(endpoint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{endpoint:?} is not HOST:PORT"),
        )
    })?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is not a server name: {e}"),
        )
    })?;
    let addr = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .unwrap_or(endpoint);
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    Ok(hyper_util::rt::TokioIo::new(tls))
}

/// The endpoint and connector of a TLS channel to `endpoints`. A new connection tries
/// the endpoints in turn from the one last connected to, so a dead endpoint is skipped.
#[allow(clippy::type_complexity)]
fn endpoint_and_connector(
    endpoints: &[String],
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> StoreResult<(
    Endpoint,
    impl tower::Service<
            Uri,
            Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
            Error = io::Error,
            Future = Pin<
                Box<
                    dyn std::future::Future<
                            Output = io::Result<
                                hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
                            >,
                        > + Send,
                >,
            >,
        > + Send
        + Clone
        + 'static,
)> {
    let first = endpoints
        .first()
        .ok_or_else(|| StoreError::InvalidArgument("no endpoints given".into()))?;
    let (host, port) = split_host_port(first)
        .ok_or_else(|| StoreError::InvalidArgument(format!("{first:?} is not HOST:PORT")))?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let endpoint = Endpoint::from_shared(format!("https://{host}:{port}"))
        .map_err(|e| StoreError::InvalidArgument(format!("{first:?}: {e}")))?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let endpoints: Arc<Vec<String>> = Arc::new(endpoints.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let connector = tower::service_fn(move |_: Uri| {
        let (endpoints, config, next) = (endpoints.clone(), config.clone(), next.clone());
        let dialled: Pin<Box<dyn std::future::Future<Output = _> + Send>> = Box::pin(async move {
            let start = next.load(Ordering::Relaxed);
            let mut last = None;
            for i in 0..endpoints.len() {
                let at = (start + i) % endpoints.len();
                match dial(&endpoints[at], config.clone()).await {
                    Ok(io) => {
                        next.store(at, Ordering::Relaxed);
                        return Ok(io);
                    }
                    Err(e) => {
                        last = Some(io::Error::new(e.kind(), format!("{}: {e}", endpoints[at])))
                    }
                }
            }
            Err(last.unwrap_or_else(|| io::Error::other("no endpoints")))
        });
        dialled
    });
    Ok((endpoint, connector))
}

/// A tonic channel to `endpoints` over TLS with `config`, connected on first use (and
/// again after a failure, to the next endpoint that answers).
pub fn channel(
    endpoints: &[String],
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> StoreResult<Channel> {
    let (endpoint, connector) = endpoint_and_connector(endpoints, config, connect_timeout)?;
    Ok(endpoint.connect_with_connector_lazy(connector))
}

/// A tonic channel to `endpoint` over TLS with `config`, connected (and handshaken) now.
pub async fn connect(
    endpoint: &str,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> Result<Channel, Box<dyn std::error::Error + Send + Sync>> {
    let (ep, connector) = endpoint_and_connector(&[endpoint.to_string()], config, connect_timeout)?;
    Ok(ep.connect_with_connector(connector).await?)
}

/// An `etcd-client` [`Client`](etcd_client::Client) for `endpoints` over TLS (`config`
/// from [`etcd_client_config`]); without `config`, the plain client.
pub async fn etcd_client(
    endpoints: &[String],
    config: Option<Arc<ClientConfig>>,
) -> StoreResult<etcd_client::Client> {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
    match config {
        None => etcd_client::Client::connect(endpoints, Some(opts)).await,
        Some(config) => {
            let channel = channel(endpoints, config, Duration::from_secs(5))?;
            etcd_client::Client::from_channel(etcd_client::Channel::Tonic(channel), Some(opts))
                .await
        }
    }
    .map_err(|e| StoreError::Backend(format!("connecting to {endpoints:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_what_another_machine_cannot_reach() {
        for yes in [
            "127.0.0.1",
            "127.0.0.2",
            "127.255.255.254",
            "::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_loopback(yes.parse().unwrap()), "{yes}");
        }
        for no in [
            "0.0.0.0",
            "::",
            "10.0.0.5",
            "192.0.2.2",
            "::ffff:10.0.0.1",
            "fe80::1",
        ] {
            assert!(!is_loopback(no.parse().unwrap()), "{no}");
        }
        for yes in [
            "127.0.0.1:2379",
            "[::1]:2379",
            "localhost:7001",
            "http://127.0.0.1:2379",
        ] {
            assert!(is_loopback_endpoint(yes), "{yes}");
        }
        for no in [
            "10.0.0.5:7001",
            "lattice-02:9000",
            "[::]:1",
            "0.0.0.0:2379",
            "nonsense",
        ] {
            assert!(!is_loopback_endpoint(no), "{no}");
        }
    }

    #[test]
    fn the_etcd_port_never_admits_nodes_or_controllers() {
        assert!(etcd_port_admits(&Identity::Member(1)));
        assert!(etcd_port_admits(&Identity::Admin("ops".into())));
        assert!(etcd_port_admits(&Identity::ApiServer));
        assert!(!etcd_port_admits(&Identity::Node("n1".into())));
        assert!(!etcd_port_admits(&Identity::Controllers));
        assert!(raft_port_admits(&Identity::Member(1)));
        assert!(!raft_port_admits(&Identity::Admin("ops".into())));
        assert!(!raft_port_admits(&Identity::ApiServer));
    }

    /// A member's directory: issued from the CA there on first start, kept while it is
    /// current, issued again for a new address; one issued elsewhere (no CA key here) is
    /// used as it is, and another member's is refused.
    #[test]
    fn member_certificates_are_issued_from_the_cluster_ca_and_kept_while_current() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let first = MemberTls::load_or_issue(d, 2, &["10.0.0.6".into()], &[]).unwrap();
        assert_eq!(first.member_id(), 2);
        assert!(
            d.join("ca.key").exists(),
            "the CA is made when there is none"
        );
        let again = MemberTls::load_or_issue(d, 2, &["10.0.0.6".into()], &[]).unwrap();
        assert_eq!(
            again.serial(),
            first.serial(),
            "a current certificate is kept"
        );
        let moved = MemberTls::load_or_issue(d, 2, &["10.0.0.7".into()], &[]).unwrap();
        assert_ne!(
            moved.serial(),
            first.serial(),
            "a new address gets a new certificate"
        );
        assert_eq!(moved.ca_pem(), first.ca_pem(), "from the same CA");
        // Another member's ID: a certificate of its own.
        let other = MemberTls::load_or_issue(d, 3, &[], &[]).unwrap();
        assert_eq!(other.member_id(), 3);
        // Without the CA's key: used as it is, but only if it is this member's.
        std::fs::remove_file(d.join("ca.key")).unwrap();
        let kept = MemberTls::load_or_issue(d, 3, &["10.9.9.9".into()], &[]).unwrap();
        assert_eq!(kept.serial(), other.serial());
        let err = MemberTls::load_or_issue(d, 4, &[], &[]).unwrap_err();
        assert!(err.to_string().contains("member 3's certificate"), "{err}");
        std::fs::remove_file(d.join(MEMBER_CERT)).unwrap();
        let err = MemberTls::load_or_issue(d, 3, &[], &[]).unwrap_err();
        assert!(
            err.to_string().contains("lattice admin pki issue member"),
            "{err}"
        );
    }

    #[test]
    fn member_material_must_be_a_member_certificate_from_the_ca() {
        use lattice_pki::{Ca, IssueRequest, Usage};
        let ca = Ca::generate("CA", Duration::from_secs(3600)).unwrap();
        let m = ca
            .issue(&IssueRequest::new(
                Identity::Member(3),
                Usage::ClientAndServer,
            ))
            .unwrap();
        let tls = MemberTls::from_pem(ca.cert_pem(), &m.cert_pem, &m.key_pem).unwrap();
        assert_eq!(tls.member_id(), 3);
        let admin = ca
            .issue(&IssueRequest::new(
                Identity::Admin("ops".into()),
                Usage::Client,
            ))
            .unwrap();
        let err = MemberTls::from_pem(ca.cert_pem(), &admin.cert_pem, &admin.key_pem).unwrap_err();
        assert!(err.to_string().contains("not a store member"), "{err}");
        let other = Ca::generate("other", Duration::from_secs(3600)).unwrap();
        let err = MemberTls::from_pem(other.cert_pem(), &m.cert_pem, &m.key_pem).unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");
    }
}
