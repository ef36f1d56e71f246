//! This node's identity: a `node:<name>` certificate from the cluster CA, which the agent
//! uses for everything it does with the API server (and the API server with it). The
//! protocol is described in [`lattice_apis::node_identity`]:
//!
//! * first start: no certificate in `<state-dir>/pki/`, so the agent makes a key pair and
//!   a CSR and spends its bootstrap token (`--bootstrap-token-file`, or
//!   `LATTICE_BOOTSTRAP_TOKEN`) on a certificate; the token is single use, so it is
//!   worthless once this has happened;
//! * every start: the certificate and key from `<state-dir>/pki/node.{crt,key}` (0600);
//! * at two thirds of its lifetime, [`renew`] asks for a new one, authenticated by the
//!   current one, and swaps it in for new connections ([`lattice_pki::RotatingCert`]).
//!
//! The agent checks the API server against the cluster CA (`--ca-file`), never against the
//! system's trust store. An agent pointed at a plain `http://` API URL has no identity:
//! that works only against a server without authentication (tests), and the agent then
//! keeps its own endpoint on loopback.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use lattice_apis::node_identity::{CertificateRequest, CertificateResponse};
use lattice_pki::{CertInfo, Identity, RotatingCert};
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// The node's certificate and key, and the CA it trusts.
#[derive(Debug)]
pub struct NodeIdentity {
    node: String,
    dir: PathBuf,
    ca_pem: String,
    cert: Arc<RotatingCert>,
    info: std::sync::RwLock<CertInfo>,
}

/// `<state-dir>/pki`.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("pki")
}

const STEM: &str = "node";

impl NodeIdentity {
    /// The identity the agent runs with: `None` for a plain `http://` API URL (see the
    /// module docs); else the stored certificate, or a new one against the bootstrap
    /// token.
    pub async fn obtain(cfg: &Config) -> anyhow::Result<Option<Arc<NodeIdentity>>> {
        if !cfg.api_url.starts_with("https://") {
            return Ok(None);
        }
        let ca_file = cfg.ca_file.as_ref().context(
            "--ca-file is required with an https:// --api-url: the agent trusts the cluster CA \
             (the server's <data-dir>/pki/ca.crt), not the system's",
        )?;
        let ca_pem = std::fs::read_to_string(ca_file)
            .with_context(|| format!("reading --ca-file {}", ca_file.display()))?;
        lattice_pki::roots(&ca_pem).with_context(|| format!("--ca-file {}", ca_file.display()))?;
        let dir = dir(&cfg.state_dir);
        match lattice_pki::Issued::load(&dir, STEM) {
            Ok(stored) => match usable(&stored, &cfg.node, &ca_pem) {
                Ok(info) => {
                    tracing::info!(node = %cfg.node, serial = %info.serial, expires = ?info.not_after, "node certificate loaded");
                    return Ok(Some(Arc::new(Self::new(cfg, dir, ca_pem, &stored, info)?)));
                }
                Err(why) => {
                    tracing::warn!(%why, "the stored node certificate cannot be used; enrolling again")
                }
            },
            Err(e) if dir.join(format!("{STEM}.crt")).exists() => {
                tracing::warn!(error = %e, "cannot read the stored node certificate; enrolling again")
            }
            Err(_) => {}
        }
        let token = cfg.bootstrap_token.as_deref().with_context(|| {
            format!(
                "node {0} has no certificate in {1} and no bootstrap token: an administrator \
                 creates one with `lattice admin node bootstrap-token --node {0}`, and the \
                 agent takes it with --bootstrap-token-file FILE (or LATTICE_BOOTSTRAP_TOKEN)",
                cfg.node,
                dir.display()
            )
        })?;
        let (csr, key) = lattice_pki::csr(&Identity::Node(cfg.node.clone()))?;
        let plain = lattice_pki::client_config(&ca_pem, None)?;
        let resp = request(
            &plain,
            &cfg.api_url,
            lattice_apis::node_identity::BOOTSTRAP_PATH,
            Some(token),
            &CertificateRequest {
                node: Some(cfg.node.clone()),
                csr,
            },
        )
        .await
        .context("enrolling with the bootstrap token")?;
        let issued = lattice_pki::Issued {
            cert_pem: resp.certificate,
            key_pem: key,
        };
        let info = usable(&issued, &cfg.node, &ca_pem)
            .map_err(|why| anyhow::anyhow!("the API server's certificate for this node: {why}"))?;
        issued.save(&dir, STEM)?;
        tracing::info!(node = %cfg.node, serial = %info.serial, expires = ?info.not_after, "node enrolled: certificate issued against the bootstrap token");
        Ok(Some(Arc::new(Self::new(cfg, dir, ca_pem, &issued, info)?)))
    }

    fn new(
        cfg: &Config,
        dir: PathBuf,
        ca_pem: String,
        issued: &lattice_pki::Issued,
        info: CertInfo,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            node: cfg.node.clone(),
            dir,
            cert: RotatingCert::new(&issued.cert_pem, &issued.key_pem)?,
            ca_pem,
            info: std::sync::RwLock::new(info),
        })
    }

    /// TLS for talking to the API server: trusting the cluster CA, showing this node's
    /// certificate (the current one, renewals included).
    pub fn client_config(&self) -> anyhow::Result<rustls::ClientConfig> {
        Ok(lattice_pki::client_config_rotating(
            &self.ca_pem,
            self.cert.clone(),
        )?)
    }

    /// TLS for this agent's own endpoint: this node's certificate, and only clients with
    /// a certificate from the cluster CA (the handlers then want the API server's).
    pub fn server_config(&self) -> anyhow::Result<rustls::ServerConfig> {
        let mut c = lattice_pki::server_config_rotating(
            self.cert.clone(),
            lattice_pki::ClientAuth::Required(&self.ca_pem),
        )?;
        // HTTP/2 for the other agents' gRPC (the PMI exchange), HTTP/1.1 for the rest.
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(c)
    }

    /// The cluster CA (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// When the current certificate is due for renewal.
    pub fn renew_at(&self) -> SystemTime {
        self.info
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .renew_at()
    }

    /// Renew the certificate at two thirds of its lifetime, until `shutdown`; a failed
    /// renewal is retried (every minute, and loudly once it is close to expiring).
    pub async fn renew(self: Arc<Self>, api_url: String, shutdown: CancellationToken) {
        loop {
            let wait = self
                .renew_at()
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.renew_once(&api_url).await {
                Ok(info) => {
                    tracing::info!(node = %self.node, serial = %info.serial, expires = ?info.not_after, "node certificate renewed");
                }
                Err(e) => {
                    let left = self
                        .info
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .not_after
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    tracing::warn!(error = format!("{e:#}"), expires_in = ?left, "cannot renew the node certificate; retrying in a minute");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                    }
                }
            }
        }
    }

    /// One renewal: a new key, a CSR, the new certificate stored and swapped in.
    pub async fn renew_once(&self, api_url: &str) -> anyhow::Result<CertInfo> {
        let (csr, key) = lattice_pki::csr(&Identity::Node(self.node.clone()))?;
        let resp = request(
            &self.client_config()?,
            api_url,
            lattice_apis::node_identity::RENEW_PATH,
            None,
            &CertificateRequest { node: None, csr },
        )
        .await?;
        let issued = lattice_pki::Issued {
            cert_pem: resp.certificate,
            key_pem: key,
        };
        let info = usable(&issued, &self.node, &self.ca_pem)
            .map_err(|why| anyhow::anyhow!("the renewed certificate: {why}"))?;
        issued.save(&self.dir, STEM)?;
        self.cert.replace(&issued.cert_pem, &issued.key_pem)?;
        *self.info.write().unwrap_or_else(|p| p.into_inner()) = info.clone();
        Ok(info)
    }
}

/// The certificate's facts if it is this node's, from this CA, and not expired.
fn usable(issued: &lattice_pki::Issued, node: &str, ca_pem: &str) -> Result<CertInfo, String> {
    let info = lattice_pki::inspect_pem(&issued.cert_pem).map_err(|e| e.to_string())?;
    if info.identity != Some(Identity::Node(node.to_string())) {
        return Err(format!("it is for {:?}, not node:{node}", info.common_name));
    }
    if info.not_after <= SystemTime::now() {
        return Err("it has expired".into());
    }
    // From this CA: a server configuration that requires clients of this CA accepts it
    // only if the chain verifies, which rustls checks at handshake; here, check that the
    // key matches and that the CA is the one that signed it.
    lattice_pki::RotatingCert::new(&issued.cert_pem, &issued.key_pem).map_err(|e| e.to_string())?;
    if !signed_by(ca_pem, &issued.cert_pem) {
        return Err("it was not signed by the cluster CA of --ca-file".into());
    }
    Ok(info)
}

fn signed_by(ca_pem: &str, cert_pem: &str) -> bool {
    let (Ok(roots), Ok(certs)) = (lattice_pki::roots(ca_pem), lattice_pki::certs(cert_pem)) else {
        return false;
    };
    let Ok(verifier) = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build() else {
        return false;
    };
    verifier
        .verify_client_cert(&certs[0], &certs[1..], rustls::pki_types::UnixTime::now())
        .is_ok()
}

/// POST `body` to `path` of the API server over TLS `tls`.
async fn request(
    tls: &rustls::ClientConfig,
    api_url: &str,
    path: &str,
    bearer: Option<&str>,
    body: &CertificateRequest,
) -> anyhow::Result<CertificateResponse> {
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(tls.clone())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut req = http
        .post(format!("{}{path}", api_url.trim_end_matches('/')))
        .json(body);
    if let Some(t) = bearer {
        req = req.bearer_auth(t.trim());
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("POST {api_url}{path}"))?;
    let code = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if !code.is_success() {
        let msg = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
            .unwrap_or(text);
        anyhow::bail!("{code}: {msg}");
    }
    serde_json::from_str(&text).context("the API server's answer")
}
