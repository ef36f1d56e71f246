//! TLS of the store's ports (the etcd port and the Raft port): where a member's
//! certificate comes from, and when plaintext is allowed.
//!
//! * By default both ports use mutual TLS with this member's certificate from
//!   `<pki-dir>` (`member.crt`, `member.key`, beside the cluster CA's `ca.crt`): issued there
//!   from the cluster CA at start when missing, not this member's, due for renewal or not
//!   for the addresses the member uses (the CA's key is in `<pki-dir>` on every server; the
//!   CA itself is made on first start when there is none, so every member of a cluster
//!   must be given the same one before it starts). A certificate issued elsewhere (`lattice
//!   admin pki issue member`) is used as it is when the CA's key is not there.
//! * `--ca-cert-file`, `--member-cert-file` and `--member-key-file` name the files
//!   instead; they are used as they are.
//! * Plaintext only on loopback, and only when asked: `--dev` or
//!   `--store-plaintext-loopback`, said at start, naming the ports. Off loopback plaintext
//!   is never allowed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use lattice_store::tls::{is_loopback, is_loopback_endpoint, MemberTls};

/// The store ports' TLS flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct StoreTlsArgs {
    /// The cluster CA certificate the store ports trust (instead of <pki-dir>/ca.crt;
    /// with --member-cert-file and --member-key-file).
    #[arg(long, requires_all = ["member_cert_file", "member_key_file"], env = "LATTICE_CA_CERT_FILE")]
    pub ca_cert_file: Option<PathBuf>,
    /// This member's certificate, `member:<node-id>` (instead of <pki-dir>/member.crt).
    #[arg(long, requires = "ca_cert_file", env = "LATTICE_MEMBER_CERT_FILE")]
    pub member_cert_file: Option<PathBuf>,
    /// This member's private key (instead of <pki-dir>/member.key).
    #[arg(long, requires = "ca_cert_file", env = "LATTICE_MEMBER_KEY_FILE")]
    pub member_key_file: Option<PathBuf>,
    /// Serve the etcd and Raft ports without TLS. Allowed only when every store address
    /// (listen and advertised) is a loopback one; for tests and one-machine setups (any
    /// local user can then read and write the whole store).
    #[arg(long, env = "LATTICE_STORE_PLAINTEXT_LOOPBACK")]
    pub store_plaintext_loopback: bool,
}

impl StoreTlsArgs {
    /// The material named by the per-file flags (`None`: none named).
    fn explicit(&self) -> anyhow::Result<Option<MemberTls>> {
        match (
            &self.ca_cert_file,
            &self.member_cert_file,
            &self.member_key_file,
        ) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(MemberTls::load(ca, cert, key)?)),
            _ => Ok(None),
        }
    }

    /// A member's existing material, for a tool acting as that member (`membership
    /// remove`): the per-file flags, or `<pki_dir>/{ca.crt,member.crt,member.key}`.
    pub fn existing(&self, pki_dir: &Path) -> anyhow::Result<MemberTls> {
        if let Some(tls) = self.explicit()? {
            return Ok(tls);
        }
        Ok(MemberTls::load(
            &pki_dir.join(lattice_pki::CA_CERT),
            &pki_dir.join(lattice_store::tls::MEMBER_CERT),
            &pki_dir.join(lattice_store::tls::MEMBER_KEY),
        )?)
    }
}

/// A store port: its name and the address it listens on.
pub struct Port {
    pub name: &'static str,
    pub addr: SocketAddr,
}

/// Decide the store ports' TLS. `ports`: the open store ports; `advertised`: the Raft
/// address peers dial, when it is not the listen address.
pub fn resolve(
    args: &StoreTlsArgs,
    dev: bool,
    pki_dir: &Path,
    node_id: u64,
    ports: &[Port],
    advertised: Option<&str>,
) -> anyhow::Result<Option<MemberTls>> {
    if ports.is_empty() {
        return Ok(None);
    }
    if let Some(tls) = args.explicit()? {
        log_tls(&tls, ports);
        return Ok(Some(tls));
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
    let plaintext = if dev {
        Some("--dev")
    } else if args.store_plaintext_loopback {
        Some("--store-plaintext-loopback")
    } else {
        None
    };
    match plaintext {
        Some(flag) if off_loopback.is_empty() => {
            if dev {
                // The CA and this member's certificate are made all the same, so that
                // dropping --dev (or giving the files to etcdctl) needs nothing more.
                if let Err(e) = MemberTls::load_or_issue(pki_dir, node_id, &[], &[]) {
                    tracing::warn!(error = %e, "--dev: no member certificate in {}", pki_dir.display());
                }
            }
            tracing::warn!(
                ports = %names(ports),
                "{flag}: the store ports serve PLAINTEXT on loopback: any local user can read \
                 and write the whole store through them (without {flag} they use mutual TLS \
                 with this member's certificate from {})",
                pki_dir.display()
            );
            return Ok(None);
        }
        Some("--store-plaintext-loopback") => anyhow::bail!(
            "--store-plaintext-loopback: {} would serve plaintext off loopback; off loopback \
             the store ports take mutual TLS only (drop the flag: this member's certificate \
             is then issued from the cluster CA in {}, or give one from `lattice admin pki \
             issue member --id {node_id}`)",
            off_loopback.join(" and "),
            pki_dir.display()
        ),
        _ => {}
    }
    let mut required = Vec::new();
    let mut unspecified = false;
    for p in ports {
        if p.addr.ip().is_unspecified() {
            unspecified = true;
        } else {
            required.push(p.addr.ip().to_string());
        }
    }
    if let Some(host) = advertised.and_then(host_of) {
        required.push(host);
    }
    let mut extra = Vec::new();
    if unspecified {
        extra = lattice_store::tls::local_names();
    } else if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        extra.push(h.trim().to_string());
    }
    extra.retain(|n| !n.is_empty());
    let tls = MemberTls::load_or_issue(pki_dir, node_id, &required, &extra).map_err(|e| {
        anyhow::anyhow!(
            "{e}; the store ports ({}) take mutual TLS (see `lattice admin pki`), or, on \
             loopback only, plaintext with --store-plaintext-loopback",
            names(ports)
        )
    })?;
    log_tls(&tls, ports);
    Ok(Some(tls))
}

fn log_tls(tls: &MemberTls, ports: &[Port]) {
    tracing::info!(
        member = tls.member_id(),
        serial = tls.serial(),
        ports = %names(ports),
        "store ports use mutual TLS"
    );
}

fn names(ports: &[Port]) -> String {
    ports
        .iter()
        .map(|p| format!("{} ({})", p.name, p.addr))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The host of `host:port` (brackets of an IPv6 address removed).
fn host_of(endpoint: &str) -> Option<String> {
    let (host, _) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
}
