//! `lattice admin pki`: the cluster CA and the certificates it issues, offline (no server:
//! it reads and writes the CA's files).
//!
//! ```text
//! lattice admin pki init --dir /secure/lattice-ca
//! lattice admin pki issue member --id 2 --ip 10.0.0.6 --name lattice-02 --dir /secure/lattice-ca
//! lattice admin pki issue admin --name ops --dir /secure/lattice-ca
//! lattice admin pki show /secure/lattice-ca/member-2/member.crt
//! ```
//!
//! Each `issue` writes a directory ready to copy to where it is used: the CA certificate,
//! the certificate and its key (mode 0600). A member's is what `lattice-server --pki-dir`
//! reads (`ca.crt`, `member.crt`, `member.key`).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use lattice_pki::{Ca, Identity, IssueRequest, Usage};

use crate::errors::{exit, CliError};

#[derive(Debug, Clone, Subcommand)]
pub enum PkiCommand {
    /// Make a new cluster CA: <dir>/ca.crt and <dir>/ca.key (mode 0600). Keep the key
    /// off the servers; whoever holds it can issue any identity.
    Init {
        /// Where the CA's files go (created if missing; existing ones are never replaced)
        #[arg(long)]
        dir: PathBuf,
        /// The CA's common name
        #[arg(long, default_value = "Lattice cluster CA")]
        name: String,
        /// Validity in days
        #[arg(long, default_value_t = 3650)]
        days: u64,
    },
    /// Issue a certificate from the CA in --dir
    #[command(subcommand)]
    Issue(IssueCommand),
    /// Print what a certificate says: identity, serial, validity
    Show {
        /// A PEM certificate file
        file: PathBuf,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum IssueCommand {
    /// A store member (CN member:<id>, client and server use): its Raft and etcd ports.
    /// Names: the addresses other members and clients dial it at (--ip, --name), plus
    /// localhost, 127.0.0.1 and ::1.
    Member {
        /// The member's ID (lattice-server --node-id)
        #[arg(long)]
        id: u64,
        #[command(flatten)]
        names: Names,
        #[command(flatten)]
        common: IssueArgs,
    },
    /// An administrator (CN admin:<name>, client use): etcdctl and other clients of the
    /// etcd port, which is full access to the store
    Admin {
        /// Who it is for
        #[arg(long)]
        name: String,
        #[command(flatten)]
        common: IssueArgs,
    },
    /// An API server (CN system:apiserver, client and server use): to agents, and to a
    /// store's etcd port with `lattice-server --backend etcd --etcd-certfile ...`
    Apiserver {
        #[command(flatten)]
        names: Names,
        #[command(flatten)]
        common: IssueArgs,
    },
    /// The controllers' identity (CN system:controllers, client use)
    Controllers {
        #[command(flatten)]
        common: IssueArgs,
    },
    /// A node's agent (CN node:<name>, client and server use). Agents normally obtain
    /// theirs with a bootstrap token; this is for provisioning by hand.
    Node {
        /// The node's name
        #[arg(long)]
        name: String,
        /// IP addresses it serves on
        #[arg(long = "ip", value_name = "IP")]
        ips: Vec<std::net::IpAddr>,
        #[command(flatten)]
        common: IssueArgs,
    },
}

/// Subject alternative names.
#[derive(Debug, Clone, Default, Args)]
pub struct Names {
    /// DNS names it is reached at (repeatable)
    #[arg(long = "name", value_name = "DNS_NAME")]
    pub dns: Vec<String>,
    /// IP addresses it is reached at (repeatable)
    #[arg(long = "ip", value_name = "IP")]
    pub ips: Vec<std::net::IpAddr>,
}

#[derive(Debug, Clone, Args)]
pub struct IssueArgs {
    /// The CA's directory (ca.crt, ca.key)
    #[arg(long)]
    pub dir: PathBuf,
    /// Where to write ca.crt, <kind>.crt and <kind>.key (default: <dir>/<kind>-<name>)
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Validity in days (default: 365; administrators 90)
    #[arg(long)]
    pub days: Option<u64>,
    /// Replace a certificate and key already in --out
    #[arg(long)]
    pub force: bool,
}

fn pki_err(what: impl Into<String>, e: impl std::fmt::Display) -> CliError {
    CliError::new(what, e.to_string())
}

fn time(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

const DAY: u64 = 24 * 3600;

/// Runs `admin pki ...`.
pub fn run(c: &PkiCommand, out: &mut dyn Write) -> Result<i32, CliError> {
    match c {
        PkiCommand::Init { dir, name, days } => {
            let (crt, key) = (
                dir.join(lattice_pki::CA_CERT),
                dir.join(lattice_pki::CA_KEY),
            );
            if crt.exists() || key.exists() {
                return Err(CliError::new(
                    format!("make a CA in {}", dir.display()),
                    "a CA is already there",
                )
                .hint("issue certificates from it with `lattice admin pki issue ...`, or choose another --dir")
                .exit_code(exit::USAGE));
            }
            let ca = Ca::generate(name, Duration::from_secs(days.saturating_mul(DAY)))
                .map_err(|e| pki_err("generate the CA", e))?;
            ca.save(dir)
                .map_err(|e| pki_err(format!("write the CA to {}", dir.display()), e))?;
            let info = lattice_pki::inspect_pem(ca.cert_pem())
                .map_err(|e| pki_err("read the new CA certificate back", e))?;
            writeln!(
                out,
                "Wrote {} (the CA certificate: every member, server and client trusts it; valid until {})",
                crt.display(),
                time(info.not_after)
            )?;
            writeln!(
                out,
                "Wrote {} (the CA's private key, mode 0600: keep it off the servers)",
                key.display()
            )?;
            Ok(0)
        }
        PkiCommand::Issue(i) => issue(i, out),
        PkiCommand::Show { file } => {
            let pem = std::fs::read_to_string(file)
                .map_err(|e| pki_err(format!("read {}", file.display()), e))?;
            let info = lattice_pki::inspect_pem(&pem)
                .map_err(|e| pki_err(format!("read {}", file.display()), e))?;
            let identity = info
                .identity
                .as_ref()
                .map(|i| i.to_string())
                .unwrap_or_else(|| {
                    if info.is_ca {
                        "a CA".into()
                    } else {
                        "none Lattice knows".into()
                    }
                });
            writeln!(out, "Subject:    CN={}", info.common_name)?;
            writeln!(out, "Identity:   {identity}")?;
            writeln!(out, "Serial:     {}", info.serial)?;
            writeln!(out, "Not before: {}", time(info.not_before))?;
            writeln!(out, "Not after:  {}", time(info.not_after))?;
            Ok(0)
        }
    }
}

fn issue(c: &IssueCommand, out: &mut dyn Write) -> Result<i32, CliError> {
    let (identity, usage, names, common, stem, label) = match c {
        IssueCommand::Member { id, names, common } => {
            if *id == 0 {
                return Err(
                    CliError::new("issue a member certificate", "--id must be above 0")
                        .exit_code(exit::USAGE),
                );
            }
            let mut names = names.clone();
            names.dns.push("localhost".into());
            names.ips.push([127, 0, 0, 1].into());
            names.ips.push(std::net::Ipv6Addr::LOCALHOST.into());
            (
                Identity::Member(*id),
                Usage::ClientAndServer,
                names,
                common,
                "member",
                format!("member-{id}"),
            )
        }
        IssueCommand::Admin { name, common } => (
            Identity::Admin(name.clone()),
            Usage::Client,
            Names::default(),
            common,
            "admin",
            format!("admin-{name}"),
        ),
        IssueCommand::Apiserver { names, common } => {
            // As the server issues its own: local clients reach it on loopback too.
            let mut names = names.clone();
            names.dns.push("localhost".into());
            names.ips.push([127, 0, 0, 1].into());
            names.ips.push(std::net::Ipv6Addr::LOCALHOST.into());
            (
                Identity::ApiServer,
                Usage::ClientAndServer,
                names,
                common,
                "apiserver",
                "apiserver".to_string(),
            )
        }
        IssueCommand::Controllers { common } => (
            Identity::Controllers,
            Usage::Client,
            Names::default(),
            common,
            "controllers",
            "controllers".to_string(),
        ),
        IssueCommand::Node { name, ips, common } => (
            Identity::Node(name.clone()),
            Usage::ClientAndServer,
            Names {
                dns: Vec::new(),
                ips: ips.clone(),
            },
            common,
            "node",
            format!("node-{name}"),
        ),
    };
    let what = format!("issue a certificate for {identity}");
    if Identity::from_common_name(&identity.common_name()).as_ref() != Some(&identity) {
        return Err(
            CliError::new(&what, "the name is not valid in a certificate")
                .hint("use letters, digits, '-', '.' and '_' only")
                .exit_code(exit::USAGE),
        );
    }
    let ca = Ca::load(&common.dir).map_err(|e| {
        pki_err(&what, e).hint(format!(
            "make a CA first with `lattice admin pki init --dir {}`",
            common.dir.display()
        ))
    })?;
    let days = common
        .days
        .unwrap_or(if stem == "admin" { 90 } else { 365 });
    let mut req = IssueRequest::new(identity.clone(), usage)
        .validity(Duration::from_secs(days.saturating_mul(DAY)));
    for d in &names.dns {
        req = req.name(d);
    }
    for ip in &names.ips {
        req = req.name(&ip.to_string());
    }
    let dir = common
        .out
        .clone()
        .unwrap_or_else(|| common.dir.join(&label));
    let (crt, key) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    if !common.force && (crt.exists() || key.exists()) {
        return Err(CliError::new(
            &what,
            format!("{} already holds a certificate or key", dir.display()),
        )
        .hint("pass --force to replace them, or --out for another directory")
        .exit_code(exit::USAGE));
    }
    let issued = ca.issue(&req).map_err(|e| pki_err(&what, e))?;
    let ca_path = dir.join(lattice_pki::CA_CERT);
    lattice_pki::write_file(&ca_path, ca.cert_pem().as_bytes(), 0o644)
        .map_err(|e| pki_err(&what, e))?;
    issued.save(&dir, stem).map_err(|e| pki_err(&what, e))?;
    let info = lattice_pki::inspect_pem(&issued.cert_pem).map_err(|e| pki_err(&what, e))?;
    let mut sans: Vec<String> = req.dns_names.clone();
    sans.extend(req.ips.iter().map(|ip| ip.to_string()));
    writeln!(out, "Wrote {} (the CA certificate)", ca_path.display())?;
    writeln!(
        out,
        "Wrote {} ({identity}, serial {}, valid until {}{})",
        crt.display(),
        info.serial,
        time(info.not_after),
        if sans.is_empty() {
            String::new()
        } else {
            format!(", names {}", sans.join(", "))
        }
    )?;
    writeln!(out, "Wrote {} (its private key, mode 0600)", key.display())?;
    match c {
        IssueCommand::Member { id, .. } => writeln!(
            out,
            "Copy {} to the member and start it with: lattice-server --node-id {id} --pki-dir <that directory> ...",
            dir.display()
        )?,
        IssueCommand::Admin { .. } => writeln!(
            out,
            "Use it with: etcdctl --endpoints https://MEMBER:2379 --cacert {} --cert {} --key {} ...",
            ca_path.display(),
            crt.display(),
            key.display()
        )?,
        _ => {}
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn run_ok(c: PkiCommand) -> String {
        let mut out = Vec::new();
        assert_eq!(run(&c, &mut out).unwrap(), 0);
        String::from_utf8(out).unwrap()
    }

    fn common(dir: &Path) -> IssueArgs {
        IssueArgs {
            dir: dir.to_path_buf(),
            out: None,
            days: None,
            force: false,
        }
    }

    /// The whole offline flow on real files: a CA, a member's directory as
    /// `lattice-server --pki-dir` reads it, an administrator's; keys are 0600, nothing is
    /// overwritten unasked.
    #[test]
    fn init_and_issue_write_usable_files_with_private_keys() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let ca_dir = tmp.path().join("ca");
        let said = run_ok(PkiCommand::Init {
            dir: ca_dir.clone(),
            name: "test CA".into(),
            days: 30,
        });
        assert!(said.contains("ca.key"), "{said}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);

        let said = run_ok(PkiCommand::Issue(IssueCommand::Member {
            id: 2,
            names: Names {
                dns: vec!["lattice-02".into()],
                ips: vec!["10.0.0.6".parse().unwrap()],
            },
            common: common(&ca_dir),
        }));
        let member_dir = ca_dir.join("member-2");
        assert!(said.contains("member:2"), "{said}");
        assert!(
            said.contains("10.0.0.6") && said.contains("lattice-02"),
            "{said}"
        );
        assert_eq!(mode(&member_dir.join("member.key")), 0o600);
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        let info = lattice_pki::inspect_pem(&read(member_dir.join("member.crt"))).unwrap();
        assert_eq!(info.identity, Some(Identity::Member(2)));
        // Usable as a member's material (it verifies against the CA written beside it).
        lattice_pki::server_config(
            &read(member_dir.join("member.crt")),
            &read(member_dir.join("member.key")),
            lattice_pki::ClientAuth::Required(&read(member_dir.join("ca.crt"))),
        )
        .unwrap();

        run_ok(PkiCommand::Issue(IssueCommand::Admin {
            name: "ops".into(),
            common: common(&ca_dir),
        }));
        let admin = lattice_pki::inspect_pem(&read(ca_dir.join("admin-ops/admin.crt"))).unwrap();
        assert_eq!(admin.identity, Some(Identity::Admin("ops".into())));
        let days = admin
            .not_after
            .duration_since(admin.not_before)
            .unwrap()
            .as_secs()
            / DAY;
        assert_eq!(
            days, 90,
            "administrators' certificates are short-lived by default"
        );

        // Nothing is overwritten unasked: a second init, a second issue.
        let mut out = Vec::new();
        let again = PkiCommand::Init {
            dir: ca_dir.clone(),
            name: "x".into(),
            days: 1,
        };
        assert_eq!(run(&again, &mut out).unwrap_err().exit_code, exit::USAGE);
        let twice = PkiCommand::Issue(IssueCommand::Admin {
            name: "ops".into(),
            common: common(&ca_dir),
        });
        assert_eq!(run(&twice, &mut out).unwrap_err().exit_code, exit::USAGE);
        // Issuing without a CA says how to make one.
        let none = PkiCommand::Issue(IssueCommand::Controllers {
            common: common(&tmp.path().join("nowhere")),
        });
        let err = run(&none, &mut out).unwrap_err();
        assert!(err.hint.unwrap_or_default().contains("pki init"));
        let bad = PkiCommand::Issue(IssueCommand::Admin {
            name: "a/b".into(),
            common: common(&ca_dir),
        });
        assert_eq!(run(&bad, &mut out).unwrap_err().exit_code, exit::USAGE);
    }
}
