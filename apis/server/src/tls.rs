//! HTTPS for the API server.
//!
//! kubectl (client-go) never sends a bearer token over plain HTTP, so any real client
//! with a token needs TLS. Sites pass their own certificate; a dev or single-machine
//! server generates a private CA and a serving certificate once ([`DevPki::load_or_create`])
//! and writes `ca.crt` for clients to trust.
//!
//! TLS handshakes run in their own tasks, so a slow or silent client never holds up the
//! accept loop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Certificate files of a server: the CA clients trust, and the serving pair.
#[derive(Debug, Clone)]
pub struct DevPki {
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl DevPki {
    /// Reuse `dir/{ca.crt,server.crt,server.key}` if present, else generate a CA and a
    /// serving certificate for `localhost`, `127.0.0.1`, `::1` and `extra_names`.
    pub fn load_or_create(dir: &Path, extra_names: &[String]) -> anyhow::Result<DevPki> {
        let pki = DevPki {
            ca_cert: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        };
        if pki.ca_cert.exists() && pki.cert.exists() && pki.key.exists() {
            return Ok(pki);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Lattice dev CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key)?;

        let mut names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        names.extend(extra_names.iter().cloned());
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "lattice-server");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &ca, &ca_key)?;

        write_file(&pki.ca_cert, ca.pem().as_bytes(), 0o644)?;
        write_file(
            &dir.join("ca.key"),
            ca_key.serialize_pem().as_bytes(),
            0o600,
        )?;
        write_file(&pki.cert, cert.pem().as_bytes(), 0o644)?;
        write_file(&pki.key, key.serialize_pem().as_bytes(), 0o600)?;
        tracing::info!(ca = %pki.ca_cert.display(), "generated a dev CA and serving certificate");
        Ok(pki)
    }
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(())
}

/// A rustls server configuration from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading certificates from {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing certificates in {}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no PEM certificate found", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// An [`axum::serve::Listener`] that yields TLS streams whose handshake has completed.
pub struct TlsListener {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
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
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for TlsConnInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let cert = stream
            .io()
            .get_ref()
            .1
            .peer_certificates()
            .and_then(lattice_pki::peer_info);
        TlsConnInfo {
            peer: *stream.remote_addr(),
            cert,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
