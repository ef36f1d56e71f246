//! HTTPS for the API server, and the cluster CA it works with.
//!
//! kubectl (client-go) never sends a bearer token over plain HTTP, and node agents
//! authenticate with their client certificates, so the HTTPS listener is where real
//! clients go. Its client-certificate check is optional (people come with bearer tokens)
//! and verifies against the cluster CA; what a verified certificate says becomes the
//! caller ([`TlsConnInfo`], [`crate::node_identity::cert_user`]).
//!
//! [`ServerPki::load_or_create`] keeps the cluster CA in a PKI directory (`ca.crt`,
//! `ca.key`, made on first start unless given) and a serving certificate for this API
//! server (`apiserver.crt`, `apiserver.key`: `system:apiserver`, for `localhost`,
//! `127.0.0.1`, `::1` and the names given), which is also the client certificate it shows
//! node agents when it proxies logs and attach sessions to them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use lattice_pki::{Ca, ClientAuth, Identity, IssueRequest, Usage};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The cluster CA and this API server's certificate.
#[derive(Debug, Clone)]
pub struct ServerPki {
    /// The CA, when its key is here (it signs node certificates); `None` when the key is
    /// kept elsewhere: this server then enrolls no nodes.
    pub ca: Option<Arc<Ca>>,
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// `ca.crt`, for clients to trust.
    pub ca_cert: PathBuf,
    /// The serving (and agent-facing client) certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// How long an API server's own certificate lives (re-issued at start once two thirds
/// are gone).
const APISERVER_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

impl ServerPki {
    /// The CA of `dir` (made if `dir` has none) and a `system:apiserver` certificate for
    /// `localhost`, `127.0.0.1`, `::1` and `extra_names`, made if missing, due for
    /// renewal, or not for every name.
    ///
    /// When `dir` holds the CA certificate but not its key (the key kept offline), the
    /// certificate must be there already (`lattice admin pki issue apiserver`), and this
    /// server signs no node certificates.
    pub fn load_or_create(dir: &Path, extra_names: &[String]) -> anyhow::Result<ServerPki> {
        let key_elsewhere =
            dir.join(lattice_pki::CA_CERT).exists() && !dir.join(lattice_pki::CA_KEY).exists();
        let (ca, ca_pem) = if key_elsewhere {
            let pem = std::fs::read_to_string(dir.join(lattice_pki::CA_CERT))
                .with_context(|| format!("reading the cluster CA in {}", dir.display()))?;
            (None, pem)
        } else {
            let ca = Ca::load_or_generate(dir, "Lattice cluster CA")
                .with_context(|| format!("the cluster CA in {}", dir.display()))?;
            let pem = ca.cert_pem().to_string();
            (Some(Arc::new(ca)), pem)
        };
        let pki = ServerPki {
            ca,
            ca_pem,
            ca_cert: dir.join(lattice_pki::CA_CERT),
            cert: dir.join("apiserver.crt"),
            key: dir.join("apiserver.key"),
        };
        let mut names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        names.extend(extra_names.iter().cloned());
        if !pki.current(&names) {
            let Some(ca) = &pki.ca else {
                anyhow::bail!(
                    "{} has the cluster CA's certificate but not its key, and no current API \
                     server certificate (apiserver.crt, apiserver.key for {}); issue one where \
                     the key is (`lattice admin pki issue apiserver --name HOST --ip ADDR --dir \
                     CA-DIR`) and copy apiserver.crt and apiserver.key here",
                    dir.display(),
                    names.join(", ")
                );
            };
            let mut req = IssueRequest::new(Identity::ApiServer, Usage::ClientAndServer)
                .validity(APISERVER_CERT_VALIDITY);
            for n in &names {
                req = req.name(n);
            }
            let issued = ca.issue(&req)?;
            issued.save(dir, "apiserver")?;
            tracing::info!(cert = %pki.cert.display(), "issued this API server's certificate");
        } else if pki.ca.is_none() {
            tracing::warn!(
                dir = %dir.display(),
                "the cluster CA's key is not here: this server enrolls and renews no nodes"
            );
        }
        Ok(pki)
    }

    /// Whether the stored certificate is from this CA, not due for renewal, and for
    /// every name.
    fn current(&self, names: &[String]) -> bool {
        let Ok(pem) = std::fs::read_to_string(&self.cert) else {
            return false;
        };
        if !self.key.exists() {
            return false;
        }
        let Ok(info) = lattice_pki::inspect_pem(&pem) else {
            return false;
        };
        webpki_verifies(&self.ca_pem, &pem)
            && info.identity == Some(Identity::ApiServer)
            && info.renew_at() > SystemTime::now()
            && names.iter().all(|n| cert_names(&pem).contains(n))
    }

    /// A server configuration for the HTTPS listener: this certificate, client
    /// certificates from the CA optional (see the module docs).
    pub fn server_config(&self) -> anyhow::Result<rustls::ServerConfig> {
        let cert = std::fs::read_to_string(&self.cert)
            .with_context(|| format!("reading {}", self.cert.display()))?;
        let key = std::fs::read_to_string(&self.key)
            .with_context(|| format!("reading {}", self.key.display()))?;
        let mut config =
            lattice_pki::server_config(&cert, &key, ClientAuth::Optional(&self.ca_pem))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The client configuration for reaching node agents: trusting the CA, showing this
    /// API server's certificate.
    pub fn agent_client_config(&self) -> anyhow::Result<rustls::ClientConfig> {
        let cert = std::fs::read_to_string(&self.cert)
            .with_context(|| format!("reading {}", self.cert.display()))?;
        let key = std::fs::read_to_string(&self.key)
            .with_context(|| format!("reading {}", self.key.display()))?;
        Ok(lattice_pki::client_config(
            &self.ca_pem,
            Some((&cert, &key)),
        )?)
    }
}

/// Whether `cert_pem` chains to `ca_pem` (a serving certificate made by an earlier CA
/// of this directory is replaced).
fn webpki_verifies(ca_pem: &str, cert_pem: &str) -> bool {
    let (Ok(roots), Ok(certs)) = (lattice_pki::roots(ca_pem), lattice_pki::certs(cert_pem)) else {
        return false;
    };
    let verifier = match rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    {
        Ok(v) => v,
        Err(_) => return false,
    };
    let Ok(name) = rustls_pki_types::ServerName::try_from("localhost") else {
        return false;
    };
    use rustls::client::danger::ServerCertVerifier;
    verifier
        .verify_server_cert(
            &certs[0],
            &certs[1..],
            &name,
            &[],
            rustls_pki_types::UnixTime::now(),
        )
        .is_ok()
}

/// The DNS names and IP addresses a PEM certificate is for.
fn cert_names(pem: &str) -> Vec<String> {
    let Ok(certs) = lattice_pki::certs(pem) else {
        return Vec::new();
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&certs[0]) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => out.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        _ => None,
                    };
                    out.extend(ip.map(|i| i.to_string()));
                }
                _ => {}
            }
        }
    }
    out
}

/// A rustls server configuration from the PEM files of a site's own certificate, with
/// client certificates from the cluster CA optional.
pub fn server_config(
    cert: &Path,
    key: &Path,
    ca_pem: &str,
) -> anyhow::Result<rustls::ServerConfig> {
    let chain = std::fs::read_to_string(cert)
        .with_context(|| format!("reading certificates from {}", cert.display()))?;
    let key = std::fs::read_to_string(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let mut config = lattice_pki::server_config(&chain, &key, ClientAuth::Optional(ca_pem))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// An [`axum::serve::Listener`] that yields TLS streams whose handshake has completed.
pub struct TlsListener {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
}

/// One TLS connection as hyper sees it. The stream sits in a [`TlsSlot`] that a handler
/// can take it from once hyper has handed the connection over (an upgrade): heartbeat
/// streams leave tokio for the heartbeat reader thread, TLS state and all.
pub struct TlsConn {
    slot: TlsSlot,
}

/// Where a [`TlsConn`]'s stream is, until a handler takes it.
#[derive(Clone, Default)]
pub struct TlsSlot(Arc<std::sync::Mutex<Option<TlsStream<tokio::net::TcpStream>>>>);

impl std::fmt::Debug for TlsSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsSlot")
    }
}

impl TlsSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<TlsStream<tokio::net::TcpStream>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the stream out: from then on hyper's side of the connection reads and
    /// writes nothing. Only for a connection hyper has handed over (an upgrade).
    pub(crate) fn take(&self) -> Option<TlsStream<tokio::net::TcpStream>> {
        self.lock().take()
    }

    fn downgrade(&self) -> WeakTlsSlot {
        WeakTlsSlot(Arc::downgrade(&self.0))
    }
}

/// A [`TlsSlot`] that does not keep the connection open: what a request carries.
#[derive(Clone, Default)]
pub struct WeakTlsSlot(std::sync::Weak<std::sync::Mutex<Option<TlsStream<tokio::net::TcpStream>>>>);

impl std::fmt::Debug for WeakTlsSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakTlsSlot")
    }
}

impl WeakTlsSlot {
    /// The slot, while hyper's connection holds it.
    pub(crate) fn upgrade(&self) -> Option<TlsSlot> {
        self.0.upgrade().map(TlsSlot)
    }
}

fn handed_over() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the connection was handed over",
    )
}

/// Run `f` on the stream, or fail when it was taken.
fn with_stream<T>(
    conn: &TlsConn,
    f: impl FnOnce(
        std::pin::Pin<&mut TlsStream<tokio::net::TcpStream>>,
    ) -> std::task::Poll<std::io::Result<T>>,
) -> std::task::Poll<std::io::Result<T>> {
    match conn.slot.lock().as_mut() {
        Some(s) => f(std::pin::Pin::new(s)),
        None => std::task::Poll::Ready(Err(handed_over())),
    }
}

impl tokio::io::AsyncRead for TlsConn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        with_stream(&self, |s| s.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for TlsConn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        with_stream(&self, |s| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        with_stream(&self, |s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.slot
            .lock()
            .as_ref()
            .is_some_and(tokio::io::AsyncWrite::is_write_vectored)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        with_stream(&self, |s| s.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        with_stream(&self, |s| s.poll_shutdown(cx))
    }
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: rustls::ServerConfig) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => {
                        // No Nagle delay on watch streams (see `heartbeat::ConnFd`).
                        let _ = c.0.set_nodelay(true);
                        c
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "TLS accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        acceptor.accept(tcp),
                    );
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { local_addr, ready })
    }
}

/// What the API server knows of a TLS connection: the peer's address and, when it
/// presented a client certificate the cluster CA signed (rustls verified the chain in the
/// handshake), what that certificate says.
#[derive(Debug, Clone)]
pub struct TlsConnInfo {
    /// The peer's address.
    pub peer: SocketAddr,
    /// The verified client certificate, if any.
    pub cert: Option<lattice_pki::CertInfo>,
    /// The connection's stream, for the heartbeat handler that takes the connection
    /// over once it is upgraded.
    pub(crate) slot: WeakTlsSlot,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for TlsConnInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let slot = &stream.io().slot;
        let cert = slot
            .lock()
            .as_ref()
            .and_then(|s| s.get_ref().1.peer_certificates())
            .and_then(lattice_pki::peer_info);
        TlsConnInfo {
            peer: *stream.remote_addr(),
            cert,
            slot: slot.downgrade(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some((stream, peer)) => (
                TlsConn {
                    slot: TlsSlot(Arc::new(std::sync::Mutex::new(Some(stream)))),
                },
                peer,
            ),
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
