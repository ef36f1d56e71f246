//! TLS of the store's ports (the etcd port and the Raft port): where a member's
//! certificate comes from, and when plaintext is allowed.
//!
//! * `--pki-dir DIR` (`ca.crt`, `member.crt`, `member.key`, as `lattice admin pki issue
//!   member` writes them) or the three files one by one: mutual TLS on both ports.
//! * Neither: the server refuses to start while a store port is open, unless every one of
//!   them listens on a loopback address and `--dev` or `--store-plaintext-loopback` allows
//!   plaintext there (said at start, naming the ports). Off loopback plaintext is never
//!   allowed.
//! * `--dev` makes the cluster CA and this member's certificate in `<data-dir>/pki` (the
//!   API server's development CA lives there too: one CA) and uses them when a store port
//!   is off loopback.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use lattice_pki::{Ca, Identity, IssueRequest, Usage};
use lattice_store::tls::{is_loopback, is_loopback_endpoint, MemberTls};

/// Where the member's TLS material is, from the command line.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct StoreTlsArgs {
    /// Directory with the cluster CA certificate and this member's certificate and key
    /// (`ca.crt`, `member.crt`, `member.key`: what `lattice admin pki issue member`
    /// writes). The etcd port and the Raft port then use mutual TLS.
    #[arg(long, env = "LATTICE_PKI_DIR")]
    pub pki_dir: Option<PathBuf>,
    /// The cluster CA certificate (default: <pki-dir>/ca.crt).
    #[arg(long)]
    pub ca_cert_file: Option<PathBuf>,
    /// This member's certificate, `member:<node-id>` (default: <pki-dir>/member.crt).
    #[arg(long)]
    pub member_cert_file: Option<PathBuf>,
    /// This member's private key (default: <pki-dir>/member.key).
    #[arg(long)]
    pub member_key_file: Option<PathBuf>,
    /// Serve the etcd and Raft ports without TLS. Allowed only when every store address
    /// (listen and advertised) is a loopback one; for tests and one-machine setups (where
    /// any local user can then read and write the whole store).
    #[arg(long)]
    pub store_plaintext_loopback: bool,
}

impl StoreTlsArgs {
    fn explicit(&self) -> bool {
        self.pki_dir.is_some()
            || self.ca_cert_file.is_some()
            || self.member_cert_file.is_some()
            || self.member_key_file.is_some()
    }

    /// The three files, from `--pki-dir` and the per-file flags.
    fn files(&self) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
        let from_dir = |name: &str, flag: &str| match &self.pki_dir {
            Some(d) => Ok(d.join(name)),
            None => Err(anyhow::anyhow!(
                "{flag} is missing: give --pki-dir DIR (with ca.crt, member.crt, member.key) or \
                 all of --ca-cert-file, --member-cert-file and --member-key-file"
            )),
        };
        Ok((
            match &self.ca_cert_file {
                Some(p) => p.clone(),
                None => from_dir(lattice_pki::CA_CERT, "--ca-cert-file")?,
            },
            match &self.member_cert_file {
                Some(p) => p.clone(),
                None => from_dir("member.crt", "--member-cert-file")?,
            },
            match &self.member_key_file {
                Some(p) => p.clone(),
                None => from_dir("member.key", "--member-key-file")?,
            },
        ))
    }

    /// The member's material when given (`None`: none given).
    pub fn load(&self) -> anyhow::Result<Option<MemberTls>> {
        if !self.explicit() {
            return Ok(None);
        }
        let (ca, cert, key) = self.files()?;
        Ok(Some(MemberTls::load(&ca, &cert, &key)?))
    }
}

/// A store port: its name and the address it listens on.
pub struct Port {
    pub name: &'static str,
    pub addr: SocketAddr,
}

/// Decide the store ports' TLS. `ports`: the open store ports; `advertised`: the Raft
/// address peers dial, if it differs from the listen address.
pub fn resolve(
    args: &StoreTlsArgs,
    dev: bool,
    data_dir: &Path,
    node_id: u64,
    ports: &[Port],
    advertised: Option<&str>,
) -> anyhow::Result<Option<MemberTls>> {
    if let Some(tls) = args.load()? {
        tracing::info!(
            member = tls.member_id(),
            serial = tls.serial(),
            ports = %names(ports),
            "store ports use mutual TLS"
        );
        return Ok(Some(tls));
    }
    if ports.is_empty() {
        return Ok(None);
    }
    let off_loopback: Vec<String> = ports
        .iter()
        .filter(|p| !is_loopback(p.addr.ip()))
        .map(|p| format!("{} {}", p.name, p.addr))
        .chain(
            advertised
                .filter(|a| !is_loopback_endpoint(a))
                .map(|a| format!("the advertised Raft address {a}")),
        )
        .collect();
    if dev {
        let dir = data_dir.join("pki");
        let tls = dev_material(&dir, node_id, ports, advertised)?;
        if off_loopback.is_empty() {
            tracing::warn!(
                ports = %names(ports),
                "--dev: the store ports serve PLAINTEXT on loopback: any local user can read and \
                 write the whole store through them. Give --pki-dir for mutual TLS (a CA and \
                 this member's certificate are in {})",
                dir.display()
            );
            return Ok(None);
        }
        tracing::info!(
            ports = %names(ports),
            pki = %dir.display(),
            "--dev with a store port off loopback: mutual TLS with the development CA"
        );
        return Ok(Some(tls));
    }
    if !off_loopback.is_empty() {
        anyhow::bail!(
            "{} would serve plaintext off loopback: give this member its certificate and the \
             cluster CA (--pki-dir DIR with ca.crt, member.crt and member.key; issue them with \
             `lattice admin pki init` and `lattice admin pki issue member --id {node_id} --ip ...`)",
            off_loopback.join(" and ")
        );
    }
    if args.store_plaintext_loopback {
        tracing::warn!(
            ports = %names(ports),
            "--store-plaintext-loopback: the store ports serve PLAINTEXT on loopback: any local \
             user can read and write the whole store through them"
        );
        return Ok(None);
    }
    anyhow::bail!(
        "{} need TLS: give --pki-dir DIR (ca.crt, member.crt and member.key, from `lattice \
         admin pki init` and `lattice admin pki issue member --id {node_id}`), or, on loopback \
         only, --store-plaintext-loopback (or --dev); --etcd-addr off closes the etcd port",
        names(ports)
    )
}

fn names(ports: &[Port]) -> String {
    ports
        .iter()
        .map(|p| format!("{} ({})", p.name, p.addr))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--dev`: the development CA in `dir` (made if missing) and a member certificate for
/// this member's addresses, issued afresh at every start (so it always matches the CA and
/// the addresses of this start).
fn dev_material(
    dir: &Path,
    node_id: u64,
    ports: &[Port],
    advertised: Option<&str>,
) -> anyhow::Result<MemberTls> {
    let ca = Ca::load_or_generate(dir, "Lattice development CA")
        .with_context(|| format!("the development CA in {}", dir.display()))?;
    let mut req = IssueRequest::new(Identity::Member(node_id), Usage::ClientAndServer)
        .validity(Duration::from_secs(365 * 24 * 3600))
        .name("localhost")
        .name("127.0.0.1")
        .name("::1");
    for p in ports {
        if !p.addr.ip().is_unspecified() {
            req = req.name(&p.addr.ip().to_string());
        }
    }
    if let Some(host) = advertised.and_then(host_of) {
        req = req.name(&host);
    }
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            req = req.name(h);
        }
    }
    let issued = ca.issue(&req)?;
    issued.save(dir, "member")?;
    Ok(MemberTls::from_pem(
        ca.cert_pem(),
        &issued.cert_pem,
        &issued.key_pem,
    )?)
}

/// The host of `host:port` (brackets of an IPv6 address removed).
fn host_of(endpoint: &str) -> Option<String> {
    let (host, _) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some(match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.to_string(),
    })
}
