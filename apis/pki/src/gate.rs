//! TLS endpoints that admit only some identities.
//!
//! A certificate from the cluster CA proves *who* its holder is; an endpoint still decides
//! *which* of those identities it serves. [`server_config_admitting`] requires a client
//! certificate from the CA and then checks its [`Identity`] against an [`Admit`] rule
//! during the handshake, so a refused peer never gets as far as a request (the Raft port
//! admits store members only; the etcd port members, administrators and the API server,
//! never nodes). [`client_config_expecting`] is the client side: besides the usual chain
//! and name checks it requires the server to hold an admitted identity (a member dialling
//! a peer refuses a node certificate that happens to name the peer's address).
//!
//! A refusal is the TLS alert `access_denied`, logged on the refusing side with the
//! identity, its serial and the endpoint's name.
//!
//! ```
//! use std::time::Duration;
//! use lattice_pki::{Admit, Ca, Identity, IssueRequest, Usage};
//! let ca = Ca::generate("CA", Duration::from_secs(3600)).unwrap();
//! let member = ca
//!     .issue(&IssueRequest::new(Identity::Member(1), Usage::ClientAndServer).name("127.0.0.1"))
//!     .unwrap();
//! let members_only = Admit::new("the Raft port", |id| matches!(id, Identity::Member(_)));
//! let server = lattice_pki::server_config_admitting(
//!     &member.cert_pem, &member.key_pem, ca.cert_pem(), members_only.clone()).unwrap();
//! let client = lattice_pki::client_config_expecting(
//!     ca.cert_pem(), Some((&member.cert_pem, &member.key_pem)), members_only).unwrap();
//! # let _ = (server, client);
//! ```

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::{certs, inspect, private_key, provider, roots, Identity, PkiError, Result};

/// Which verified identities an endpoint admits, and the endpoint's name for the log.
#[derive(Clone)]
pub struct Admit {
    what: &'static str,
    rule: Arc<dyn Fn(&Identity) -> bool + Send + Sync>,
}

impl Admit {
    /// Admit the identities for which `rule` holds, at the endpoint called `what` (a
    /// phrase: "the etcd port").
    pub fn new(
        what: &'static str,
        rule: impl Fn(&Identity) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            what,
            rule: Arc::new(rule),
        }
    }

    /// The endpoint's name.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Whether the end-entity certificate `der` carries an admitted identity; refusals are
    /// logged.
    fn check(
        &self,
        der: &CertificateDer<'_>,
        peer: &str,
    ) -> std::result::Result<(), rustls::Error> {
        let info = inspect(der.as_ref())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        match &info.identity {
            Some(id) if (self.rule)(id) => Ok(()),
            _ => {
                tracing::warn!(
                    endpoint = self.what,
                    peer,
                    common_name = %info.common_name,
                    serial = %info.serial,
                    "TLS peer refused: its certificate is from the cluster CA but its identity may not use this endpoint"
                );
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }
}

impl fmt::Debug for Admit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit").field("what", &self.what).finish()
    }
}

/// Checks client certificates against the CA (`inner`), then their identity.
#[derive(Debug)]
struct AdmittingClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    admit: Admit,
}

impl ClientCertVerifier for AdmittingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.admit.check(end_entity, "client")?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Checks the server's certificate against the CA and the name dialled (`inner`), then
/// its identity.
#[derive(Debug)]
struct ExpectingServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    admit: Admit,
}

impl ServerCertVerifier for ExpectingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        self.admit.check(end_entity, &server_name.to_str())?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A server configuration serving `chain_pem`/`key_pem` that requires a client
/// certificate signed by `ca_pem` whose identity `admit` admits.
pub fn server_config_admitting(
    chain_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    admit: Admit,
) -> Result<ServerConfig> {
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
        .build()
        .map_err(|e| PkiError::invalid("the client certificate verifier", e))?;
    ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::invalid("TLS versions", e))?
        .with_client_cert_verifier(Arc::new(AdmittingClientVerifier { inner, admit }))
        .with_single_cert(certs(chain_pem)?, private_key(key_pem)?)
        .map_err(|e| PkiError::invalid("the serving certificate and key", e))
}

/// A client configuration trusting `ca_pem`, presenting `identity` (chain and key, PEM)
/// when given, that accepts only a server whose identity `admit` admits.
pub fn client_config_expecting(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    admit: Admit,
) -> Result<ClientConfig> {
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
        .build()
        .map_err(|e| PkiError::invalid("the server certificate verifier", e))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::invalid("TLS versions", e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ExpectingServerVerifier { inner, admit }));
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(certs(chain)?, private_key(key)?)
            .map_err(|e| PkiError::invalid("the client certificate and key", e)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::{client_config, Ca, IssueRequest, Usage};

    fn members() -> Admit {
        Admit::new("the test port", |id| matches!(id, Identity::Member(_)))
    }

    /// A server on a real socket that answers "ok" to whoever completes the handshake;
    /// `talk` reports what a client with `cfg` got.
    async fn serve(cfg: ServerConfig) -> std::net::SocketAddr {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(s).await {
                        let _ = tls.write_all(b"ok").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        addr
    }

    async fn talk(
        addr: std::net::SocketAddr,
        cfg: ClientConfig,
    ) -> std::result::Result<String, String> {
        let conn = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = conn.connect(name, s).await.map_err(|e| e.to_string())?;
        let mut out = String::new();
        tls.read_to_string(&mut out)
            .await
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Each refusal is the attack itself: a node certificate from the same CA, a member
    /// certificate from another CA, and no certificate at all, against a members-only
    /// endpoint; a member gets in.
    #[tokio::test]
    async fn only_admitted_identities_complete_the_handshake() {
        let ca = Ca::generate("CA", Duration::from_secs(3600)).unwrap();
        let issue = |ca: &Ca, id: Identity| {
            ca.issue(&IssueRequest::new(id, Usage::ClientAndServer).name("127.0.0.1"))
                .unwrap()
        };
        let server = issue(&ca, Identity::Member(1));
        let addr = serve(
            server_config_admitting(&server.cert_pem, &server.key_pem, ca.cert_pem(), members())
                .unwrap(),
        )
        .await;
        let as_client = |c: &crate::Issued| {
            client_config(ca.cert_pem(), Some((&c.cert_pem, &c.key_pem))).unwrap()
        };
        let member = issue(&ca, Identity::Member(2));
        assert_eq!(talk(addr, as_client(&member)).await.as_deref(), Ok("ok"));

        let node = issue(&ca, Identity::Node("n1".into()));
        let refused = talk(addr, as_client(&node)).await;
        assert!(refused.as_deref() != Ok("ok"), "a node got in: {refused:?}");

        let other_ca = Ca::generate("other", Duration::from_secs(3600)).unwrap();
        let stranger = issue(&other_ca, Identity::Member(2));
        let refused = talk(addr, as_client(&stranger)).await;
        assert!(
            refused.as_deref() != Ok("ok"),
            "another CA's member got in: {refused:?}"
        );

        let anonymous = talk(addr, client_config(ca.cert_pem(), None).unwrap()).await;
        assert!(
            anonymous.as_deref() != Ok("ok"),
            "no certificate got in: {anonymous:?}"
        );
    }

    /// A client expecting a member refuses a server holding a node certificate for the
    /// same address (and from the same CA).
    #[tokio::test]
    async fn a_client_refuses_a_server_of_the_wrong_identity() {
        let ca = Ca::generate("CA", Duration::from_secs(3600)).unwrap();
        let node = ca
            .issue(
                &IssueRequest::new(Identity::Node("n1".into()), Usage::ClientAndServer)
                    .name("127.0.0.1"),
            )
            .unwrap();
        let member = ca
            .issue(
                &IssueRequest::new(Identity::Member(2), Usage::ClientAndServer).name("127.0.0.1"),
            )
            .unwrap();
        let impostor = serve(
            crate::server_config(&node.cert_pem, &node.key_pem, crate::ClientAuth::None).unwrap(),
        )
        .await;
        let cfg = client_config_expecting(
            ca.cert_pem(),
            Some((&member.cert_pem, &member.key_pem)),
            members(),
        )
        .unwrap();
        let err = talk(impostor, cfg.clone()).await.unwrap_err();
        assert!(err.contains("invalid peer certificate"), "{err}");
        let genuine = serve(
            crate::server_config(&member.cert_pem, &member.key_pem, crate::ClientAuth::None)
                .unwrap(),
        )
        .await;
        assert_eq!(talk(genuine, cfg).await.as_deref(), Ok("ok"));
    }
}
