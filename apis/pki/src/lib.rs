//! # lattice-pki
//!
//! The cluster CA and the identities it certifies. Every party that is not a human with a
//! bearer token proves who it is with a certificate signed by the cluster CA, and the
//! certificate's common name says who that is ([`Identity`]):
//!
//! | identity | common name | used by |
//! |---|---|---|
//! | a node's agent | `node:<name>` | agent → API server, API server → agent (serving), agent ↔ agent |
//! | a store member | `member:<id>` | the Raft port and the etcd port, both ways |
//! | an API server | `system:apiserver` | API server → agents (logs, attach) |
//! | the controllers | `system:controllers` | out-of-process controllers → API server |
//! | an administrator | `admin:<name>` | etcdctl and other store clients |
//!
//! Whatever a certificate signing request (CSR) asks for, the CA signs only its public key:
//! the subject, names, usages and lifetime come from the [`IssueRequest`] the server built
//! from what it authenticated (a bootstrap token names the node; a renewing node is the
//! node its current certificate names). A CSR is checked for proof of possession (its
//! self-signature) and nothing else is taken from it.
//!
//! ```
//! use std::time::Duration;
//! use lattice_pki::{Ca, Identity, IssueRequest, Usage};
//! let ca = Ca::generate("Lattice test CA", Duration::from_secs(3600)).unwrap();
//! // The agent makes a key and a CSR; only the public key matters to the CA.
//! let (csr, _key) = lattice_pki::csr(&Identity::Node("n1".into())).unwrap();
//! let req = IssueRequest::new(Identity::Node("n1".into()), Usage::ClientAndServer)
//!     .validity(Duration::from_secs(600));
//! let cert = ca.sign_csr(&csr, &req).unwrap();
//! let info = lattice_pki::inspect_pem(&cert).unwrap();
//! assert_eq!(info.identity, Some(Identity::Node("n1".into())));
//! ```

use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

mod gate;
pub use gate::{client_config_expecting, server_config_admitting, Admit};

/// The domain of the DNS names in node and member certificates: the API server reaches a
/// node's agent as `<node>.nodes.lattice.internal`, whatever address it dials.
pub const NODE_DOMAIN: &str = "nodes.lattice.internal";
/// Certificates are valid from this long before they are issued, so that a member whose
/// clock is a little behind the CA's still accepts them.
const BACKDATE: Duration = Duration::from_secs(300);

/// A failure of the PKI, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A certificate, key or CSR that cannot be used.
    #[error("{0}")]
    Invalid(String),
    /// A file that cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

impl PkiError {
    fn invalid(what: impl fmt::Display, e: impl fmt::Display) -> Self {
        PkiError::Invalid(format!("{what}: {e}"))
    }
    fn io(path: &Path, source: std::io::Error) -> Self {
        PkiError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, PkiError>;

/// Who a certificate says its holder is (from its common name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// The agent of node `<name>`: `node:<name>`.
    Node(String),
    /// Store member `<id>`: `member:<id>`.
    Member(u64),
    /// An API server: `system:apiserver`.
    ApiServer,
    /// The built-in controllers (or a site's controller acting with their rights):
    /// `system:controllers`.
    Controllers,
    /// An administrator (store clients such as etcdctl): `admin:<name>`.
    Admin(String),
}

impl Identity {
    /// The common name that carries this identity.
    pub fn common_name(&self) -> String {
        match self {
            Identity::Node(n) => format!("node:{n}"),
            Identity::Member(id) => format!("member:{id}"),
            Identity::ApiServer => "system:apiserver".into(),
            Identity::Controllers => "system:controllers".into(),
            Identity::Admin(n) => format!("admin:{n}"),
        }
    }

    /// The identity a common name carries; `None` for anything else (an empty name after
    /// the prefix included).
    pub fn from_common_name(cn: &str) -> Option<Identity> {
        let named = |prefix: &str| {
            cn.strip_prefix(prefix)
                .filter(|n| valid_name(n))
                .map(String::from)
        };
        if let Some(n) = named("node:") {
            return Some(Identity::Node(n));
        }
        if let Some(n) = named("admin:") {
            return Some(Identity::Admin(n));
        }
        if let Some(id) = cn.strip_prefix("member:") {
            return id.parse().ok().filter(|id| *id > 0).map(Identity::Member);
        }
        match cn {
            "system:apiserver" => Some(Identity::ApiServer),
            "system:controllers" => Some(Identity::Controllers),
            _ => None,
        }
    }

    /// The DNS name a node's agent serves under (`<node>.nodes.lattice.internal`).
    pub fn node_dns_name(node: &str) -> String {
        format!("{node}.{NODE_DOMAIN}")
    }
}

/// Node and admin names: what a DNS label allows, plus `.` and `_` (user names).
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.common_name())
    }
}

/// What a certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// TLS client only.
    Client,
    /// TLS server only.
    Server,
    /// Both (nodes, members: each dials and is dialled).
    ClientAndServer,
}

/// What the CA puts into a certificate: everything but the public key.
#[derive(Debug, Clone)]
pub struct IssueRequest {
    /// Who it certifies.
    pub identity: Identity,
    /// What for.
    pub usage: Usage,
    /// DNS names (subject alternative names).
    pub dns_names: Vec<String>,
    /// IP addresses (subject alternative names).
    pub ips: Vec<IpAddr>,
    /// How long it is valid from now.
    pub validity: Duration,
}

impl IssueRequest {
    /// One year, no names but the defaults of the identity (a node's DNS name).
    pub fn new(identity: Identity, usage: Usage) -> Self {
        let dns_names = match &identity {
            Identity::Node(n) if usage != Usage::Client => vec![Identity::node_dns_name(n)],
            _ => Vec::new(),
        };
        Self {
            identity,
            usage,
            dns_names,
            ips: Vec::new(),
            validity: Duration::from_secs(365 * 24 * 3600),
        }
    }

    /// Valid for `d`.
    pub fn validity(mut self, d: Duration) -> Self {
        self.validity = d;
        self
    }

    /// Add a name to serve under: an IP address, or a DNS name.
    pub fn name(mut self, name: &str) -> Self {
        match name.parse::<IpAddr>() {
            Ok(ip) if !self.ips.contains(&ip) => self.ips.push(ip),
            Ok(_) => {}
            Err(_) if !self.dns_names.iter().any(|d| d == name) => {
                self.dns_names.push(name.to_string())
            }
            Err(_) => {}
        }
        self
    }

    fn params(&self) -> Result<CertificateParams> {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, self.identity.common_name());
        dn.push(DnType::OrganizationName, "Lattice");
        p.distinguished_name = dn;
        for d in &self.dns_names {
            let name = d
                .clone()
                .try_into()
                .map_err(|e| PkiError::invalid(format!("DNS name {d:?}"), e))?;
            p.subject_alt_names.push(SanType::DnsName(name));
        }
        for ip in &self.ips {
            p.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = match self.usage {
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::ClientAndServer => vec![
                ExtendedKeyUsagePurpose::ClientAuth,
                ExtendedKeyUsagePurpose::ServerAuth,
            ],
        };
        let now = SystemTime::now();
        p.not_before = (now - BACKDATE).into();
        p.not_after = (now + self.validity).into();
        p.serial_number = Some(random_serial()?);
        p.use_authority_key_identifier_extension = true;
        Ok(p)
    }
}

/// 16 random bytes, positive (top bit clear) and never all zero.
fn random_serial() -> Result<SerialNumber> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| PkiError::Invalid("no randomness for a serial number".into()))?;
    b[0] = (b[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&b))
}

/// A certificate and its private key, as PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl Issued {
    /// Write `<dir>/<stem>.crt` (0644) and `<dir>/<stem>.key` (0600), replacing older ones.
    pub fn save(&self, dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf)> {
        let crt = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        write_file(&key, self.key_pem.as_bytes(), 0o600)?;
        write_file(&crt, self.cert_pem.as_bytes(), 0o644)?;
        Ok((crt, key))
    }

    /// Read `<dir>/<stem>.crt` and `<dir>/<stem>.key`.
    pub fn load(dir: &Path, stem: &str) -> Result<Issued> {
        Ok(Issued {
            cert_pem: read_file(&dir.join(format!("{stem}.crt")))?,
            key_pem: read_file(&dir.join(format!("{stem}.key")))?,
        })
    }
}

/// The cluster certificate authority.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    /// The CA certificate as it was issued (what everyone trusts).
    cert_pem: String,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// File names of the CA in a PKI directory.
pub const CA_CERT: &str = "ca.crt";
/// The CA's private key.
pub const CA_KEY: &str = "ca.key";

impl Ca {
    /// A new self-signed CA named `name`, valid for `validity`.
    pub fn generate(name: &str, validity: Duration) -> Result<Ca> {
        let key = KeyPair::generate().map_err(|e| PkiError::invalid("generating a key", e))?;
        let mut p = CertificateParams::default();
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationName, "Lattice");
        p.distinguished_name = dn;
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        p.not_before = (now - BACKDATE).into();
        p.not_after = (now + validity).into();
        p.serial_number = Some(random_serial()?);
        let cert = p
            .self_signed(&key)
            .map_err(|e| PkiError::invalid("signing the CA certificate", e))?;
        let cert_pem = cert.pem();
        Ok(Ca {
            cert,
            key,
            cert_pem,
        })
    }

    /// The CA of a certificate and its key (PEM).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::invalid("the CA key", e))?;
        let params = CertificateParams::from_ca_cert_pem(cert_pem)
            .map_err(|e| PkiError::invalid("the CA certificate", e))?;
        let info = inspect_pem(cert_pem)?;
        if !info.is_ca {
            return Err(PkiError::Invalid(
                "the CA certificate is not a CA (no basicConstraints CA:TRUE)".into(),
            ));
        }
        // rcgen signs with an issuer object; rebuilding it from the parsed parameters keeps
        // the subject and key identifier that the issued certificates must name.
        let cert = params
            .self_signed(&key)
            .map_err(|e| PkiError::invalid("the CA certificate and key do not go together", e))?;
        if key.public_key_der() != public_key_info(cert_pem)? {
            return Err(PkiError::Invalid(
                "the CA key does not belong to the CA certificate".into(),
            ));
        }
        Ok(Ca {
            cert,
            key,
            cert_pem: cert_pem.to_string(),
        })
    }

    /// `<dir>/ca.crt` and `<dir>/ca.key`.
    pub fn load(dir: &Path) -> Result<Ca> {
        Ca::from_pem(
            &read_file(&dir.join(CA_CERT))?,
            &read_file(&dir.join(CA_KEY))?,
        )
    }

    /// Load `<dir>/ca.{crt,key}`, or make a CA named `name` there if neither exists.
    pub fn load_or_generate(dir: &Path, name: &str) -> Result<Ca> {
        if dir.join(CA_CERT).exists() || dir.join(CA_KEY).exists() {
            return Ca::load(dir);
        }
        let ca = Ca::generate(name, Duration::from_secs(10 * 365 * 24 * 3600))?;
        ca.save(dir)?;
        Ok(ca)
    }

    /// Write `<dir>/ca.crt` (0644) and `<dir>/ca.key` (0600); never over existing files.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| PkiError::io(dir, e))?;
        create_new(
            &dir.join(CA_KEY),
            self.key.serialize_pem().as_bytes(),
            0o600,
        )?;
        create_new(&dir.join(CA_CERT), self.cert_pem.as_bytes(), 0o644)
    }

    /// The CA certificate (PEM), what every party trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A new key pair and a certificate for it.
    pub fn issue(&self, req: &IssueRequest) -> Result<Issued> {
        let key = KeyPair::generate().map_err(|e| PkiError::invalid("generating a key", e))?;
        let cert = req
            .params()?
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| PkiError::invalid("signing a certificate", e))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A certificate for the public key of `csr_pem` (after checking its self-signature),
    /// with everything else from `req`.
    pub fn sign_csr(&self, csr_pem: &str, req: &IssueRequest) -> Result<String> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
            PkiError::invalid(
                "the certificate signing request (a PEM 'CERTIFICATE REQUEST' signed by its own key)",
                e,
            )
        })?;
        let cert = req
            .params()?
            .signed_by(&csr.public_key, &self.cert, &self.key)
            .map_err(|e| PkiError::invalid("signing a certificate", e))?;
        Ok(cert.pem())
    }
}

/// The subject public key info (DER) of a PEM certificate.
fn public_key_info(cert_pem: &str) -> Result<Vec<u8>> {
    let der = first_cert_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| PkiError::invalid("the CA certificate", e))?;
    Ok(cert.public_key().raw.to_vec())
}

/// A fresh key pair and a CSR for `identity` (PEM CSR, PEM private key).
pub fn csr(identity: &Identity) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(|e| PkiError::invalid("generating a key", e))?;
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, identity.common_name());
    p.distinguished_name = dn;
    let csr = p
        .serialize_request(&key)
        .map_err(|e| PkiError::invalid("making a CSR", e))?;
    let pem = csr
        .pem()
        .map_err(|e| PkiError::invalid("encoding a CSR", e))?;
    Ok((pem, key.serialize_pem()))
}

/// What a certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Its identity, when its common name is one.
    pub identity: Option<Identity>,
    /// Its common name as written.
    pub common_name: String,
    /// Serial number, lowercase hex without separators.
    pub serial: String,
    /// Valid from.
    pub not_before: SystemTime,
    /// Valid until.
    pub not_after: SystemTime,
    /// A CA certificate.
    pub is_ca: bool,
}

impl CertInfo {
    /// The point at which a holder should renew: two thirds of its lifetime.
    pub fn renew_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + life * 2 / 3
    }
}

/// Read a DER certificate.
pub fn inspect(der: &[u8]) -> Result<CertInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| PkiError::invalid("a certificate", e))?;
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    let serial = cert
        .raw_serial()
        .iter()
        .skip_while(|b| **b == 0)
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(CertInfo {
        identity: Identity::from_common_name(&common_name),
        common_name,
        serial,
        not_before: at(cert.validity().not_before),
        not_after: at(cert.validity().not_after),
        is_ca: cert.is_ca(),
    })
}

/// Read the first certificate of a PEM file.
pub fn inspect_pem(pem: &str) -> Result<CertInfo> {
    inspect(&first_cert_der(pem)?)
}

fn first_cert_der(pem: &str) -> Result<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| PkiError::Invalid("no PEM certificate found".into()))?
        .map_err(|e| PkiError::invalid("a PEM certificate", e))
}

/// Every certificate of a PEM text.
pub fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    let v = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| PkiError::invalid("a PEM certificate", e))?;
    if v.is_empty() {
        return Err(PkiError::Invalid("no PEM certificate found".into()));
    }
    Ok(v)
}

/// The private key of a PEM text.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| PkiError::invalid("a PEM private key", e))
}

/// A trust store holding the CA certificate(s) of `ca_pem`.
pub fn roots(ca_pem: &str) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for c in certs(ca_pem)? {
        store
            .add(c)
            .map_err(|e| PkiError::invalid("the CA certificate", e))?;
    }
    Ok(store)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether a TLS server asks its clients for certificates.
#[derive(Debug, Clone, Copy)]
pub enum ClientAuth<'a> {
    /// It does not.
    None,
    /// Clients may present one signed by this CA (PEM); those that do are verified, those
    /// that do not go on without (and must authenticate another way).
    Optional(&'a str),
    /// Clients must present one signed by this CA (PEM).
    Required(&'a str),
}

/// A rustls server configuration serving `chain_pem`/`key_pem`.
pub fn server_config(chain_pem: &str, key_pem: &str, clients: ClientAuth) -> Result<ServerConfig> {
    server_config_rotating(RotatingCert::new(chain_pem, key_pem)?, clients)
}

/// A rustls client configuration trusting `ca_pem`, presenting `identity` (certificate
/// chain and key, PEM) when given.
pub fn client_config(ca_pem: &str, identity: Option<(&str, &str)>) -> Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::invalid("TLS versions", e))?
        .with_root_certificates(roots(ca_pem)?);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(certs(chain)?, private_key(key)?)
            .map_err(|e| PkiError::invalid("the client certificate and key", e)),
    }
}

/// A certificate and key that can be replaced while configurations use it: a renewed
/// node certificate takes effect for every new connection without rebuilding the
/// clients and servers that hold it.
#[derive(Debug)]
pub struct RotatingCert {
    current: std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>,
}

fn certified_key(chain_pem: &str, key_pem: &str) -> Result<Arc<rustls::sign::CertifiedKey>> {
    let key = provider()
        .key_provider
        .load_private_key(private_key(key_pem)?)
        .map_err(|e| PkiError::invalid("a private key", e))?;
    let ck = rustls::sign::CertifiedKey::new(certs(chain_pem)?, key);
    ck.keys_match()
        .map_err(|e| PkiError::invalid("the certificate and key do not go together", e))?;
    Ok(Arc::new(ck))
}

impl RotatingCert {
    /// Holding `chain_pem` and `key_pem`.
    pub fn new(chain_pem: &str, key_pem: &str) -> Result<Arc<Self>> {
        Ok(Arc::new(Self {
            current: std::sync::RwLock::new(certified_key(chain_pem, key_pem)?),
        }))
    }

    /// Use `chain_pem` and `key_pem` from now on.
    pub fn replace(&self, chain_pem: &str, key_pem: &str) -> Result<()> {
        let ck = certified_key(chain_pem, key_pem)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = ck;
        Ok(())
    }

    fn get(&self) -> Arc<rustls::sign::CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl rustls::client::ResolvesClientCert for RotatingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for RotatingCert {
    fn resolve(
        &self,
        _client_hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.get())
    }
}

/// A client configuration trusting `ca_pem` and presenting whatever `cert` holds.
pub fn client_config_rotating(ca_pem: &str, cert: Arc<RotatingCert>) -> Result<ClientConfig> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::invalid("TLS versions", e))?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_cert_resolver(cert))
}

/// A server configuration serving whatever `cert` holds.
pub fn server_config_rotating(
    cert: Arc<RotatingCert>,
    clients: ClientAuth,
) -> Result<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::invalid("TLS versions", e))?;
    let builder = match clients {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional(ca) | ClientAuth::Required(ca) => {
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
            let v = if matches!(clients, ClientAuth::Optional(_)) {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(
                v.build()
                    .map_err(|e| PkiError::invalid("the client certificate verifier", e))?,
            )
        }
    };
    Ok(builder.with_cert_resolver(cert))
}

/// The identity of a verified TLS peer: its end-entity certificate (the first of the
/// chain rustls verified).
pub fn peer_info(chain: &[CertificateDer<'_>]) -> Option<CertInfo> {
    inspect(chain.first()?.as_ref()).ok()
}

fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| PkiError::io(path, e))
}

/// Write `bytes` to `path` with `mode`, atomically (a temporary file renamed over it), so
/// a reader never sees half a key and a key is never readable by others, not even briefly.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| PkiError::io(dir, e))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    create_new(&tmp, bytes, mode)?;
    std::fs::rename(&tmp, path).map_err(|e| PkiError::io(path, e))
}

fn create_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(|e| PkiError::io(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| PkiError::io(path, e))
}

/// `O_NOFOLLOW` (Linux), without a libc dependency for one constant.
const fn libc_o_nofollow() -> i32 {
    0o400000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> Ca {
        Ca::generate("test CA", Duration::from_secs(3600)).unwrap()
    }

    #[test]
    fn identities_round_trip_through_common_names() {
        for id in [
            Identity::Node("x1000c0s0b0n0".into()),
            Identity::Member(3),
            Identity::ApiServer,
            Identity::Controllers,
            Identity::Admin("ops".into()),
        ] {
            assert_eq!(Identity::from_common_name(&id.common_name()), Some(id));
        }
        for bad in [
            "node:",
            "member:0",
            "member:x",
            "node:a/b",
            "system:admin",
            "root",
        ] {
            assert_eq!(Identity::from_common_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_csr_gets_the_identity_the_ca_chose_not_the_one_it_asked_for() {
        let ca = ca();
        let (csr, _) = csr(&Identity::Admin("mallory".into())).unwrap();
        let cert = ca
            .sign_csr(
                &csr,
                &IssueRequest::new(Identity::Node("n7".into()), Usage::ClientAndServer),
            )
            .unwrap();
        let info = inspect_pem(&cert).unwrap();
        assert_eq!(info.identity, Some(Identity::Node("n7".into())));
        assert!(!info.is_ca);
    }

    #[test]
    fn a_tampered_csr_is_refused() {
        let (csr, _) = csr(&Identity::Node("n1".into())).unwrap();
        // Flip one character of the base64 body, inside the signed part.
        let mut lines: Vec<String> = csr.lines().map(String::from).collect();
        let l = &mut lines[2];
        let c = if l.as_bytes()[10] == b'A' { "B" } else { "A" };
        l.replace_range(10..11, c);
        let err = ca()
            .sign_csr(
                &lines.join("\n"),
                &IssueRequest::new(Identity::Node("n1".into()), Usage::Client),
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("certificate signing request"),
            "{err}"
        );
    }

    #[test]
    fn the_ca_survives_a_save_and_load_and_still_signs_verifiable_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_generate(dir.path(), "c").unwrap();
        let again = Ca::load_or_generate(dir.path(), "c").unwrap();
        assert_eq!(ca.cert_pem(), again.cert_pem());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(CA_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A certificate from the reloaded CA verifies against the original CA cert.
        let leaf = again
            .issue(&IssueRequest::new(Identity::ApiServer, Usage::Server).name("127.0.0.1"))
            .unwrap();
        server_config(
            &leaf.cert_pem,
            &leaf.key_pem,
            ClientAuth::Required(ca.cert_pem()),
        )
        .unwrap();
        // A key that is not the CA's is refused.
        let other = Ca::generate("other", Duration::from_secs(60)).unwrap();
        let err = Ca::from_pem(ca.cert_pem(), &other.key.serialize_pem()).unwrap_err();
        assert!(err.to_string().contains("does not belong"), "{err}");
        // A leaf is not a CA.
        assert!(Ca::from_pem(&leaf.cert_pem, &leaf.key_pem).is_err());
    }

    #[test]
    fn renewal_is_due_at_two_thirds_of_the_lifetime() {
        let ca = ca();
        let c = ca
            .issue(
                &IssueRequest::new(Identity::Node("n".into()), Usage::Client)
                    .validity(Duration::from_secs(3000)),
            )
            .unwrap();
        let info = inspect_pem(&c.cert_pem).unwrap();
        let life = info.not_after.duration_since(info.not_before).unwrap();
        assert_eq!(life, Duration::from_secs(3300), "backdated by 5 minutes");
        assert_eq!(info.renew_at(), info.not_before + Duration::from_secs(2200));
        assert_eq!(info.serial.len(), 32);
    }

    /// Mutual TLS over a real socket: a client with a certificate from the CA gets in and
    /// is identified; one from another CA, and one without, do not.
    #[tokio::test]
    async fn mutual_tls_identifies_the_peer_and_refuses_strangers() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ca = ca();
        let server = ca
            .issue(
                &IssueRequest::new(Identity::Member(1), Usage::ClientAndServer).name("127.0.0.1"),
            )
            .unwrap();
        let cfg = server_config(
            &server.cert_pem,
            &server.key_pem,
            ClientAuth::Required(ca.cert_pem()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(s).await {
                        let who = peer_info(tls.get_ref().1.peer_certificates().unwrap_or(&[]))
                            .and_then(|i| i.identity)
                            .map(|i| i.to_string())
                            .unwrap_or_default();
                        let _ = tls.write_all(who.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        let talk = |cfg: ClientConfig| async move {
            let conn = tokio_rustls::TlsConnector::from(Arc::new(cfg));
            let s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = conn.connect(name, s).await.map_err(|e| e.to_string())?;
            let mut out = String::new();
            tls.read_to_string(&mut out)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<String, String>(out)
        };
        let node = ca
            .issue(&IssueRequest::new(
                Identity::Node("n2".into()),
                Usage::Client,
            ))
            .unwrap();
        let ok = talk(client_config(ca.cert_pem(), Some((&node.cert_pem, &node.key_pem))).unwrap())
            .await
            .unwrap();
        assert_eq!(ok, "node:n2");
        let stranger_ca = Ca::generate("stranger", Duration::from_secs(60)).unwrap();
        let stranger = stranger_ca
            .issue(&IssueRequest::new(
                Identity::Node("n2".into()),
                Usage::Client,
            ))
            .unwrap();
        let refused = talk(
            client_config(ca.cert_pem(), Some((&stranger.cert_pem, &stranger.key_pem))).unwrap(),
        )
        .await;
        assert!(
            refused.is_err() || refused.as_deref() == Ok(""),
            "{refused:?}"
        );
        let anonymous = talk(client_config(ca.cert_pem(), None).unwrap()).await;
        assert!(
            anonymous.is_err() || anonymous.as_deref() == Ok(""),
            "{anonymous:?}"
        );
    }
}
