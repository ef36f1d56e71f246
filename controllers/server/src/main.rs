//! `lattice-server`: the Lattice control plane in one process — the store (embedded, or an
//! external etcd), its etcd v3 gRPC port, the Kubernetes-style API server, and (as they
//! land) the built-in controllers.
//!
//! ```text
//! lattice-server --dev                      # single member, all defaults, data in ./.lattice-dev
//! lattice-server --data-dir /var/lib/lattice --tls-addr 0.0.0.0:8443 --etcd-addr 0.0.0.0:2379 \
//!   --pki-dir /etc/lattice/pki               # the cluster CA: API, store ports, node certificates
//! lattice-server --backend etcd --etcd-endpoints http://10.0.0.5:2379
//! lattice-server --config /etc/lattice/server.toml   # the same flags from a file (lattice-config)
//! lattice-server backup create --data-dir D FILE | backup verify FILE | restore --data-dir NEW FILE
//! ```

mod api_limits;
mod dev;
mod offline;
mod store_tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use lattice_store::grpc::{EtcdGrpcServer, ServerInfo};
use lattice_store::{EmbeddedStore, KvBackend, Limits, StoreConfig};

/// mimalloc rather than glibc's malloc: the API server's JSON work allocates a lot from
/// many threads, and glibc's malloc/free took about 23 % of the server's CPU under
/// `hack/bench-api.sh` (perf, 2026-11-25).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's option number of `purge_delay` (`mi_option_purge_delay` in mimalloc.h of
/// the v3 sources libmimalloc-sys builds).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

extern "C" {
    // Part of the mimalloc library linked in by the `mimalloc` crate (the Rust binding is
    // behind libmimalloc-sys's `extended` feature, which would pull in one more crate).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// Keep freed memory in the allocator for 10 s (mimalloc's default: 1 s) before giving it
/// back to the kernel, unless `MIMALLOC_PURGE_DELAY` says otherwise. The server frees and
/// reallocates large buffers in cycles (a scheduling cycle over a long queue, request
/// bursts); given back after a second, each came back as fresh pages for the kernel to
/// zero — under `hack/bench-api.sh` 150–170 page faults per 1,000 creates, 5 with the
/// longer delay, and 4–15 % less server CPU per create in paired runs (2026-11-27).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: a plain setter of an integer option; called first in `main`, before
        // any other thread exists.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
    }
}

/// The embedded store's default `--max-txn-ops`: room for one binding of 2,046 nodes
/// (etcd's 128 would cap a binding at 62 nodes).
const EMBEDDED_MAX_TXN_OPS: usize = 4096;

#[derive(Parser, Debug)]
#[command(
    name = "lattice-server",
    version,
    about = "Lattice control plane: store + API + controllers"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// A TOML file of settings: the long flags without `--` as keys (`data-dir =
    /// "/var/lib/lattice"`, `tls-san = ["a", "b"]`, `bootstrap = true`). A flag on the
    /// command line wins over its environment variable, which wins over the file. Not read
    /// by the subcommands.
    #[arg(long, env = "LATTICE_SERVER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args, Debug, Clone)]
struct ServeArgs {
    /// Single member, all defaults: creates tenant and vCluster `default` and writes an
    /// admin token to <data-dir>/admin.token.
    #[arg(long, env = "LATTICE_DEV")]
    dev: bool,
    /// Where the store keeps its files (default ./.lattice-dev with --dev).
    #[arg(long, env = "LATTICE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Plain-HTTP API listen address: loopback only (bearer tokens over plain HTTP can be
    /// read off the network), unless --allow-plaintext-api. Clients elsewhere use the
    /// HTTPS address (--tls-addr).
    #[arg(long, default_value = "127.0.0.1:8080", env = "LATTICE_API_ADDR")]
    api_addr: SocketAddr,
    /// Let --api-addr listen off loopback (behind a TLS-terminating proxy on the same
    /// trusted network, say); warned at start.
    #[arg(long, env = "LATTICE_ALLOW_PLAINTEXT_API")]
    allow_plaintext_api: bool,
    /// HTTPS API listen address ("off" disables). kubectl needs it: client-go sends bearer
    /// tokens only over TLS. Without --tls-cert-file a private CA and certificate are
    /// generated once into <data-dir>/pki (clients trust pki/ca.crt).
    #[arg(long, default_value = "127.0.0.1:8443", env = "LATTICE_TLS_ADDR")]
    tls_addr: String,
    /// PEM certificate chain for the HTTPS listener.
    #[arg(long, requires = "tls_key_file", env = "LATTICE_TLS_CERT_FILE")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key for the HTTPS listener.
    #[arg(long, requires = "tls_cert_file", env = "LATTICE_TLS_KEY_FILE")]
    tls_key_file: Option<PathBuf>,
    /// Where the cluster CA (ca.crt, ca.key) and this server's certificates live
    /// [default: <data-dir>/pki]: the API's serving certificate (apiserver.crt,
    /// apiserver.key) and this store member's (member.crt, member.key, for the mutual TLS
    /// of the etcd and Raft ports), each issued from the CA at start when missing or not
    /// current. A CA is made there on first start if there is none, so every server of a
    /// cluster must be given the same one (copy ca.crt and ca.key, or make it first with
    /// `lattice admin pki init`). The CA signs node certificates (bootstrap tokens,
    /// renewals).
    #[arg(long, env = "LATTICE_PKI_DIR")]
    pki_dir: Option<PathBuf>,
    /// Extra names (DNS names or IP addresses) this server's certificate is for, beside
    /// localhost, 127.0.0.1 and ::1; repeat for several.
    #[arg(long = "tls-san", value_name = "NAME", env = "LATTICE_TLS_SAN")]
    tls_sans: Vec<String>,
    /// Lifetime of the node certificates this server signs; agents renew at two thirds.
    #[arg(long, default_value = "30d", value_parser = parse_duration_arg, env = "LATTICE_NODE_CERT_VALIDITY")]
    node_cert_validity: Duration,
    /// etcd v3 gRPC listen address (etcdctl and etcd clients work against it); "off" disables.
    #[arg(long, default_value = "127.0.0.1:2379", env = "LATTICE_ETCD_ADDR")]
    etcd_addr: String,
    /// Storage backend.
    #[arg(long, value_enum, default_value_t = Backend::Embedded, env = "LATTICE_BACKEND")]
    backend: Backend,
    /// Replicate the embedded store with Raft: this member's Raft listen address. Without
    /// it the embedded store is a single durable member.
    #[arg(long, env = "LATTICE_RAFT_ADDR")]
    raft_addr: Option<SocketAddr>,
    /// Address other members use to reach this one (default: the bound --raft-addr).
    #[arg(long, env = "LATTICE_RAFT_ADVERTISE_ADDR")]
    raft_advertise_addr: Option<String>,
    /// This member's ID in the Raft cluster; never reuse a removed member's ID.
    #[arg(long, default_value_t = 1, env = "LATTICE_RAFT_NODE_ID")]
    node_id: u64,
    /// First member only, once: form a new cluster (harmless on restart).
    #[arg(long, requires = "raft_addr", env = "LATTICE_BOOTSTRAP")]
    bootstrap: bool,
    /// Join an existing cluster through any member's Raft address.
    #[arg(
        long,
        requires = "raft_addr",
        conflicts_with = "bootstrap",
        env = "LATTICE_JOIN"
    )]
    join: Option<String>,
    /// Worker threads of the replicated store's own runtime: openraft's tasks, the Raft
    /// transport (client and server), the proposer and the etcd port run there, the API
    /// server and the controllers on the main runtime. A write passes through a chain of
    /// small tasks; on one thread each hand-off is a queue push, spread over several each
    /// is a wake-up of another thread (on a small VM, about 25 µs when its CPU idles). The
    /// store's slow work (the leader's log writes, state file commits, snapshots) has
    /// threads of its own. Raise it when the etcd port or Raft traffic saturates one core;
    /// 0 runs the store on the main runtime.
    #[arg(long, default_value_t = 1, env = "LATTICE_STORE_THREADS")]
    store_threads: usize,
    /// A Raft member snapshots its state (and purges its log) after this many log entries
    /// since the last snapshot, like etcd's `--snapshot-count`.
    #[arg(long, default_value_t = 100_000, env = "LATTICE_SNAPSHOT_ENTRIES")]
    snapshot_entries: u64,
    /// Endpoints of the external etcd cluster (with --backend etcd), comma separated.
    #[arg(long, value_delimiter = ',', env = "LATTICE_ETCD_ENDPOINTS")]
    etcd_endpoints: Vec<String>,
    /// With --backend etcd: the CA certificate that signed the etcd servers' certificates
    /// (TLS to etcd; with --etcd-certfile and --etcd-keyfile, mutual TLS).
    #[arg(long, requires_all = ["etcd_certfile", "etcd_keyfile"], env = "LATTICE_ETCD_CAFILE")]
    etcd_cafile: Option<PathBuf>,
    /// With --backend etcd: the client certificate presented to etcd (for a Lattice store,
    /// an API server's, `system:apiserver`, or an administrator's).
    #[arg(long, requires = "etcd_cafile", env = "LATTICE_ETCD_CERTFILE")]
    etcd_certfile: Option<PathBuf>,
    /// With --backend etcd: the client certificate's key.
    #[arg(long, requires = "etcd_cafile", env = "LATTICE_ETCD_KEYFILE")]
    etcd_keyfile: Option<PathBuf>,
    #[command(flatten)]
    store_tls: store_tls::StoreTlsArgs,
    /// The store's size quota in bytes (etcd's --quota-backend-bytes; K, M, G, Ki, Mi, Gi
    /// suffixes accepted). The size counts every version the store holds, history not yet
    /// compacted included; a write that would go beyond it raises the NOSPACE alarm and
    /// writes that add data are refused (507 from the API) until space is freed and the
    /// alarm disarmed (`etcdctl alarm disarm`).
    #[arg(long, default_value = "2Gi", value_parser = parse_bytes_arg, env = "LATTICE_QUOTA_BACKEND_BYTES")]
    quota_backend_bytes: u64,
    /// HS256 secret for API tokens (default: generated once into <data-dir>/jwt.secret).
    #[arg(long, env = "LATTICE_JWT_SECRET_FILE")]
    jwt_secret_file: Option<PathBuf>,
    /// The identity providers whose ID tokens are accepted (YAML: `issuers:` with issuer,
    /// audiences, usernameClaim, groupsClaim, tenantsClaim, ...; docs/security.md). With
    /// it, the server's own HS256 tokens (admin.token) are refused unless
    /// --oidc-allow-hs256 (break-glass) or --dev.
    #[arg(long, env = "LATTICE_OIDC_CONFIG")]
    oidc_config: Option<PathBuf>,
    /// With --oidc-config: keep accepting the server's own HS256 tokens (break-glass).
    #[arg(long, env = "LATTICE_OIDC_ALLOW_HS256")]
    oidc_allow_hs256: bool,
    /// Where the audit log, its rotated files and its signing key live (default
    /// <data-dir>/audit).
    #[arg(long, env = "LATTICE_AUDIT_DIR")]
    audit_dir: Option<PathBuf>,
    /// Rotate the audit log at this size (K, M, G, Ki, Mi, Gi suffixes).
    #[arg(long, default_value = "100Mi", value_parser = parse_bytes_arg, env = "LATTICE_AUDIT_MAX_FILE_BYTES")]
    audit_max_file_bytes: u64,
    /// Rotated audit log files kept (older ones are removed).
    #[arg(long, default_value_t = 10, env = "LATTICE_AUDIT_MAX_FILES")]
    audit_max_files: usize,
    /// Also POST audit records (JSON arrays, batched) to this URL.
    #[arg(long, env = "LATTICE_AUDIT_WEBHOOK")]
    audit_webhook: Option<String>,
    /// Also send audit records to this syslog receiver (HOST:PORT, RFC 5424 over UDP).
    #[arg(long, env = "LATTICE_AUDIT_SYSLOG")]
    audit_syslog: Option<std::net::SocketAddr>,
    /// Largest key the store accepts, in bytes.
    #[arg(long, default_value_t = Limits::default().max_key_bytes, env = "LATTICE_MAX_KEY_BYTES")]
    max_key_bytes: usize,
    /// Largest value the store accepts, in bytes.
    #[arg(long, default_value_t = Limits::default().max_value_bytes, env = "LATTICE_MAX_VALUE_BYTES")]
    max_value_bytes: usize,
    /// Most operations (compares + ops) in one store transaction. Binding an allocation
    /// of N nodes is one transaction of 2N+4 operations, so the embedded store's default
    /// (4096) admits allocations of up to 2,046 nodes; raise it for larger ones. With
    /// `--backend etcd`, set it to the etcd cluster's own `--max-txn-ops` (etcd's
    /// default, 128, when omitted) so the scheduler splits its batches to fit. In a
    /// replicated store each member checks it on the transactions it receives, before they
    /// are proposed (never when they are applied), so members may use different values.
    #[arg(long, env = "LATTICE_MAX_TXN_OPS")]
    max_txn_ops: Option<usize>,
    /// A node whose agent has sent no heartbeat for this long goes Degraded (no new
    /// work; running work continues); also the TTL of the store lease behind each
    /// agent's heartbeat stream.
    #[arg(long, default_value = "30s", value_parser = parse_duration_arg, env = "LATTICE_HEARTBEAT_TIMEOUT")]
    heartbeat_timeout: Duration,
    /// A Degraded node goes Down after this further grace period; its allocations are
    /// requeued or failed per their requeue policy.
    #[arg(long, default_value = "60s", value_parser = parse_duration_arg, env = "LATTICE_NODE_GRACE_PERIOD")]
    node_grace_period: Duration,
    /// Grace period of sensitive nodes.
    #[arg(long, default_value = "5m", value_parser = parse_duration_arg, env = "LATTICE_SENSITIVE_GRACE_PERIOD")]
    sensitive_grace_period: Duration,
    /// Largest DAG accepted (steps, the seed's `scheduling.max_dag_size`): the API server
    /// rejects a larger Dag at admission (422 on spec.allocations), and the DAG
    /// controller applies the same limit.
    #[arg(long, default_value_t = lattice_apis::kinds::dag::DEFAULT_MAX_DAG_SIZE, env = "LATTICE_MAX_DAG_SIZE")]
    max_dag_size: usize,
    /// How often the store's history is compacted (to the revision of one interval
    /// earlier, so that at least this much history stays watchable; kube-apiserver's
    /// `--etcd-compaction-interval`). 0 turns it off (then something else must compact,
    /// or memory grows with every write).
    #[arg(long, default_value = "5m", value_parser = parse_duration_arg, env = "LATTICE_COMPACTION_INTERVAL")]
    compaction_interval: Duration,
    /// Prometheus (or compatible TSDB) base URL the autoscaler queries for reactive
    /// allocations' metrics, e.g. http://prometheus:9090. A bare metric name N is queried
    /// as avg(N{lattice_allocation="<name>",lattice_tenant="<tenant>"}). Without it
    /// reactive allocations run at their initial size and say so in status.scale.message.
    #[arg(long, env = "LATTICE_METRICS_URL")]
    metrics_url: Option<String>,
    #[command(flatten)]
    api_limits: api_limits::ApiLimitArgs,
}

/// The autoscaler's metric source from `--metrics-url`.
fn metric_source(
    url: Option<&str>,
) -> anyhow::Result<Option<Arc<dyn lattice_controllers::autoscaler::MetricSource>>> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        tracing::info!("no --metrics-url: reactive allocations are not autoscaled");
        return Ok(None);
    };
    let source = lattice_controllers::autoscaler::PrometheusSource::new(url)
        .map_err(anyhow::Error::msg)
        .context("--metrics-url")?;
    tracing::info!(url = source.base_url(), "autoscaler metric source");
    Ok(Some(Arc::new(source)))
}

/// Bytes, with an optional decimal (K, M, G) or binary (Ki, Mi, Gi) suffix, and `B`.
fn parse_bytes_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix('B').unwrap_or(t);
    let (digits, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(suffix, m)| t.strip_suffix(suffix).map(|d| (d, *m)))
    .unwrap_or((t, 1));
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: not a number of bytes ({e})"))?;
    let bytes = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{s:?}: too large"))?;
    if bytes == 0 {
        return Err(format!("{s:?}: the quota must be above zero"));
    }
    Ok(bytes)
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|e| format!("{s:?}: {e}"));
    }
    lattice_apis::duration::parse_duration(s).map(Duration::from_secs)
}

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
enum Backend {
    Embedded,
    Etcd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Backups of the embedded store (the server must be stopped for `create`).
    Backup {
        #[command(subcommand)]
        cmd: BackupCmd,
    },
    /// Raft membership of a running cluster (members join with `--join`).
    Membership {
        #[command(subcommand)]
        cmd: MembershipCmd,
    },
    /// Create a fresh data directory from a backup file.
    Restore {
        #[arg(long)]
        data_dir: PathBuf,
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum MembershipCmd {
    /// Remove member NODE_ID, asking the member at --peer (any member's Raft address).
    /// With TLS, run it with a member's certificate (--pki-dir of a member of the cluster).
    Remove {
        #[arg(long)]
        peer: String,
        #[arg(long)]
        node_id: u64,
        /// A member's PKI directory (ca.crt, member.crt, member.key): the Raft port takes
        /// mutual TLS from members only. Without it (or the per-file flags), plaintext to a
        /// loopback --peer only.
        #[arg(long)]
        pki_dir: Option<PathBuf>,
        #[command(flatten)]
        tls: store_tls::StoreTlsArgs,
    },
}

#[derive(Subcommand, Debug)]
enum BackupCmd {
    /// Write every live key and lease at the latest revision to one checksummed file.
    Create {
        #[arg(long)]
        data_dir: PathBuf,
        file: PathBuf,
    },
    /// Check a backup file's checksum and print what it holds.
    Verify { file: PathBuf },
}

fn main() -> anyhow::Result<()> {
    tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn,h2=warn,hyper=warn,tower=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Args = lattice_config::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let store_rt = match &args.command {
        None if args.serve.raft_addr.is_some() && args.serve.store_threads > 0 => Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(args.serve.store_threads)
                .thread_name("lattice-store")
                .enable_all()
                .build()?,
        ),
        _ => None,
    };
    let store_handle = store_rt.as_ref().map(|r| r.handle().clone());
    let result = rt.block_on(async move {
        match args.command {
            Some(Cmd::Backup {
                cmd: BackupCmd::Create { data_dir, file },
            }) => offline::backup_create(&data_dir, &file).await,
            Some(Cmd::Backup {
                cmd: BackupCmd::Verify { file },
            }) => offline::backup_verify(&file),
            Some(Cmd::Restore { data_dir, file }) => offline::restore(&data_dir, &file),
            Some(Cmd::Membership {
                cmd:
                    MembershipCmd::Remove {
                        peer,
                        node_id,
                        pki_dir,
                        tls,
                    },
            }) => {
                let tls = match (&pki_dir, &tls.ca_cert_file) {
                    (None, None) => None,
                    (dir, _) => Some(tls.existing(dir.as_deref().unwrap_or(Path::new(".")))?),
                };
                if tls.is_none() && !lattice_store::tls::is_loopback_endpoint(&peer) {
                    anyhow::bail!(
                        "--peer {peer} is not a loopback address: give --pki-dir with a member's \
                         certificate (the Raft port takes mutual TLS only)"
                    );
                }
                lattice_store::raft::RaftStore::remove_member_via(
                    &peer,
                    node_id,
                    Duration::from_secs(30),
                    tls.map(|t| t.raft_client()),
                )
                .await?;
                println!("member {node_id} removed");
                Ok(())
            }
            None => serve(args.serve, store_handle).await,
        }
    });
    if let Some(store_rt) = store_rt {
        store_rt.shutdown_timeout(Duration::from_secs(5));
    }
    result
}

fn secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    if let Ok(s) = std::fs::read(path) {
        if s.len() >= 32 {
            return Ok(s);
        }
        anyhow::bail!("{}: a JWT secret needs at least 32 bytes", path.display());
    }
    let s: Vec<u8> = (0..48).map(|_| rand::random::<u8>()).collect();
    write_private(path, &s)?;
    Ok(s)
}

pub(crate) fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Written to a temporary name and renamed, so a reader (a script or test waiting
    // for the token) never sees a half-written file.
    let tmp = path.with_extension("tmp");
    // A leftover from an interrupted run could carry other permissions.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(())
}

async fn serve(args: ServeArgs, store_rt: Option<tokio::runtime::Handle>) -> anyhow::Result<()> {
    // Where the replicated store and the etcd port run (`--store-threads`).
    let store_rt = store_rt.unwrap_or_else(tokio::runtime::Handle::current);
    let data_dir = match (&args.data_dir, args.dev) {
        (Some(d), _) => d.clone(),
        (None, true) => PathBuf::from(".lattice-dev"),
        (None, false) => {
            anyhow::bail!("--data-dir is required (or use --dev for a local single-member server)")
        }
    };
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let limits = Limits {
        max_key_bytes: args.max_key_bytes,
        max_value_bytes: args.max_value_bytes,
        max_txn_ops: args.max_txn_ops.unwrap_or(match args.backend {
            Backend::Etcd => Limits::default().max_txn_ops,
            Backend::Embedded => EMBEDDED_MAX_TXN_OPS,
        }),
    };
    // The cluster CA first (made on first start): the API's serving certificate, the
    // store member's and the node certificates all come from it.
    let pki_dir = args.pki_dir.clone().unwrap_or_else(|| data_dir.join("pki"));
    let mut sans = args.tls_sans.clone();
    if let Ok(a) = args.tls_addr.parse::<SocketAddr>() {
        if !a.ip().is_unspecified() {
            sans.push(a.ip().to_string());
        }
    }
    let pki = lattice_apiserver::tls::ServerPki::load_or_create(&pki_dir, &sans)
        .with_context(|| format!("the cluster PKI in {}", pki_dir.display()))?;
    let etcd_addr: Option<SocketAddr> = match (args.etcd_addr.as_str(), args.backend) {
        ("off", _) | (_, Backend::Etcd) => None,
        (a, Backend::Embedded) => Some(
            a.parse()
                .with_context(|| format!("--etcd-addr {a:?} is not HOST:PORT (or \"off\")"))?,
        ),
    };
    let mut store_ports = Vec::new();
    if let Some(addr) = etcd_addr {
        store_ports.push(store_tls::Port {
            name: "the etcd port",
            addr,
        });
    }
    if let (Backend::Embedded, Some(addr)) = (args.backend, args.raft_addr) {
        store_ports.push(store_tls::Port {
            name: "the Raft port",
            addr,
        });
    }
    let member_tls = store_tls::resolve(
        &args.store_tls,
        args.dev,
        &pki_dir,
        args.node_id,
        &store_ports,
        args.raft_advertise_addr.as_deref(),
    )?;
    let mut registry = prometheus_client::registry::Registry::default();
    let mut info = ServerInfo {
        max_request_bytes: limits.max_value_bytes + limits.max_key_bytes + 64 * 1024,
        max_txn_ops: limits.max_txn_ops,
        ..Default::default()
    };
    let mut raft_store = None;
    let backend: Arc<dyn KvBackend> = match args.backend {
        Backend::Embedded if args.raft_addr.is_some() => {
            let store = start_raft(
                &args,
                &data_dir,
                limits.clone(),
                member_tls.clone(),
                &store_rt,
            )
            .await?;
            store.metrics().register(&mut registry);
            store.raft_metrics().register(&mut registry);
            register_raft_gauges(&store, &mut registry);
            info.member_id = args.node_id;
            info.membership = Some(Arc::new(RaftMembership(store.clone())));
            raft_store = Some(store.clone());
            Arc::new(store)
        }
        Backend::Embedded => {
            let store = EmbeddedStore::open(
                data_dir.join("store"),
                StoreConfig {
                    limits: limits.clone(),
                    // The etcd port reports this member as leader: the IDs must agree.
                    member_id: ServerInfo::default().member_id,
                    quota_bytes: args.quota_backend_bytes,
                    ..Default::default()
                },
            )
            .await
            .with_context(|| {
                format!("opening the store in {}", data_dir.join("store").display())
            })?;
            store.metrics().register(&mut registry);
            Arc::new(store)
        }
        Backend::Etcd => {
            if args.etcd_endpoints.is_empty() {
                anyhow::bail!("--backend etcd needs --etcd-endpoints http://HOST:PORT[,...]");
            }
            let backend = match (&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile) {
                (Some(ca), Some(cert), Some(key)) => {
                    let tls = lattice_store::tls::load_etcd_client_config(ca, cert, key)?;
                    lattice_store::etcd_backend::EtcdBackend::from_client(
                        lattice_store::tls::etcd_client(&args.etcd_endpoints, Some(tls)).await?,
                    )
                }
                _ => {
                    lattice_store::etcd_backend::EtcdBackend::connect(&args.etcd_endpoints).await?
                }
            };
            Arc::new(backend.with_max_txn_ops(limits.max_txn_ops))
        }
    };

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown = {
        let rx = stop_rx.clone();
        move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|v| *v).await;
            }
        }
    };

    let mut tasks = Vec::new();
    if let Some(addr) = etcd_addr {
        let mut grpc = EtcdGrpcServer::bind(addr, backend.clone(), info)
            .await
            .with_context(|| format!("binding the etcd port {addr}"))?;
        if let Some(tls) = &member_tls {
            grpc = grpc.with_tls(tls.etcd_server(etcd_port_admission(raft_store.clone()))?);
        }
        tracing::info!(addr = %grpc.local_addr(), tls = member_tls.is_some(), "etcd v3 API listening");
        tasks.push(store_rt.spawn(grpc.serve(shutdown())));
    }

    let secret_path = args
        .jwt_secret_file
        .clone()
        .unwrap_or_else(|| data_dir.join("jwt.secret"));
    let jwt_secret = secret(&secret_path)?;
    let authenticator: Arc<dyn lattice_apiserver::Authenticator> = match &args.oidc_config {
        Some(path) => {
            let cfg = lattice_apiserver::oidc::OidcConfig::load(path)?;
            let people = args.oidc_allow_hs256 || args.dev;
            tracing::info!(
                issuers = ?cfg.issuers.iter().map(|i| i.issuer.as_str()).collect::<Vec<_>>(),
                hs256_people = people,
                "OIDC login enabled"
            );
            Arc::new(lattice_apiserver::oidc::OidcAuthenticator::new(
                &cfg,
                lattice_apiserver::JwtAuthenticator::new(&jwt_secret),
                people,
            )?)
        }
        None => Arc::new(lattice_apiserver::JwtAuthenticator::new(&jwt_secret)),
    };
    let api = lattice_apiserver::ApiServer::with_authenticator(
        backend.clone(),
        lattice_apiserver::ApiConfig {
            jwt_secret: jwt_secret.clone(),
            auth: true,
            heartbeat_ttl: args.heartbeat_timeout,
            max_dag_size: args.max_dag_size,
            ca: pki.ca.clone(),
            node_cert_validity: args.node_cert_validity,
            agent_tls: Some(Arc::new(pki.agent_client_config()?)),
            limits: args.api_limits.identity_limits(),
            object_quotas: args.api_limits.object_quotas(),
            ..Default::default()
        },
        authenticator,
    );
    let audit = lattice_apiserver::audit::AuditConfig {
        max_file_bytes: args.audit_max_file_bytes,
        max_files: args.audit_max_files,
        webhook: args.audit_webhook.clone(),
        syslog: args.audit_syslog,
        ..lattice_apiserver::audit::AuditConfig::new(
            args.audit_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("audit")),
            format!("member-{}", args.node_id),
        )
    };
    api.set_audit(
        lattice_apiserver::audit::Auditor::start(audit, backend.clone())
            .await
            .context("opening the audit log")?,
    );
    // Built-in controllers: run on the Raft leader only (every member of a single-member
    // store is its leader), hand over when leadership moves.
    let gate: Arc<dyn lattice_runtime::LeaderGate> = match &raft_store {
        Some(raft) => Arc::new(raft_leader_gate(raft)),
        None => Arc::new(lattice_runtime::AlwaysLeader::new()),
    };
    let mut host = lattice_runtime::ControllerHost::new(
        lattice_apiserver::in_process::client(backend.clone()),
        gate,
    );
    lattice_runtime::gc::register(&mut host);
    let controller_metrics = lattice_controllers::register_all(
        &mut host,
        backend.clone(),
        lattice_controllers::Config {
            node_lifecycle: lattice_controllers::NodeLifecycleConfig {
                heartbeat_timeout: args.heartbeat_timeout,
                grace_period: args.node_grace_period,
                sensitive_grace_period: args.sensitive_grace_period,
            },
            dag_limits: lattice_dag::graph::Limits {
                max_dag_size: args.max_dag_size,
                ..Default::default()
            },
            autoscaler: lattice_controllers::autoscaler::AutoscalerConfig {
                metric_source: metric_source(args.metrics_url.as_deref())?,
            },
        },
    );
    controller_metrics.register(&mut registry);
    host.register_metrics(&mut registry);
    let readiness = host.readiness();
    api.add_readiness_check(
        "controllers",
        Arc::new(move || {
            if readiness.is_ready() {
                Ok(())
            } else {
                let waiting: Vec<String> = readiness
                    .report()
                    .into_iter()
                    .filter(|(_, ready)| !ready)
                    .map(|(name, _)| name)
                    .collect();
                Err(format!("controllers not synced: {}", waiting.join(", ")))
            }
        }),
    );
    tracing::info!(controllers = ?host.controllers(), "controller host");
    tasks.push(tokio::spawn({
        let stop = shutdown();
        async move {
            host.run(stop).await;
            Ok(())
        }
    }));
    if args.compaction_interval.is_zero() {
        tracing::warn!("--compaction-interval 0: the store's history is never compacted here");
    } else {
        let metrics = lattice_apiserver::compactor::CompactorMetrics::default();
        metrics.register(&mut registry);
        let (backend, interval, stop) = (backend.clone(), args.compaction_interval, shutdown());
        tasks.push(tokio::spawn(async move {
            lattice_apiserver::compactor::run(backend, interval, metrics, stop).await;
            Ok(())
        }));
    }
    api.metrics().add_registry(registry);
    if !args.api_addr.ip().is_loopback() {
        if !args.allow_plaintext_api {
            anyhow::bail!(
                "--api-addr {}: the plain-HTTP API listens on loopback only (bearer tokens \
                 over plain HTTP can be read off the network); serve clients elsewhere on \
                 --tls-addr, or pass --allow-plaintext-api behind a TLS-terminating proxy",
                args.api_addr
            );
        }
        tracing::warn!(addr = %args.api_addr, "--allow-plaintext-api: the API accepts bearer tokens over plain HTTP off loopback");
    }
    let listener = tokio::net::TcpListener::bind(args.api_addr)
        .await
        .with_context(|| format!("binding the API address {}", args.api_addr))?;
    let api_addr = listener.local_addr()?;
    tracing::info!(addr = %api_addr, "API server listening");
    tasks.push(tokio::spawn(api.clone().serve(listener, shutdown())));

    let mut tls_url = None;
    let mut ca_file = None;
    if args.tls_addr != "off" {
        let addr: SocketAddr = args.tls_addr.parse().with_context(|| {
            format!(
                "--tls-addr {:?} is not HOST:PORT (or \"off\")",
                args.tls_addr
            )
        })?;
        let config = match (&args.tls_cert_file, &args.tls_key_file) {
            (Some(c), Some(k)) => lattice_apiserver::tls::server_config(c, k, &pki.ca_pem)?,
            _ => {
                ca_file = Some(pki.ca_cert.clone());
                pki.server_config()?
            }
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the HTTPS address {addr}"))?;
        let bound = listener.local_addr()?;
        tls_url = Some(format!("https://{bound}"));
        tasks.push(tokio::spawn(api.clone().serve_tls(
            listener,
            config,
            shutdown(),
        )));
    }

    // In dev mode (`lattice up`: one person's cluster) the admin is the person running
    // the server, so that their work runs as them on the agents.
    let admin_name = match args.dev {
        true => nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map(|u| u.name)
            .filter(|n| !n.is_empty() && !n.starts_with("system:"))
            .unwrap_or_else(|| "admin".to_string()),
        false => "admin".to_string(),
    };
    let admin_token = lattice_apiserver::mint_token(
        &jwt_secret,
        &admin_name,
        &["*".to_string()],
        lattice_apiserver::Role::Admin,
        Duration::from_secs(365 * 24 * 3600),
    );
    // In dev mode the bootstrap objects exist before the token file appears: scripts
    // and tests wait for `admin.token` and then expect tenant and vCluster `default`.
    if args.dev {
        if let Some(raft) = &raft_store {
            raft.wait_for_leader(Duration::from_secs(30)).await?;
        }
        dev::bootstrap(api_addr, &admin_token).await?;
    }
    // The kubeconfig before the token: once `admin.token` exists, everything is written.
    if let (Some(url), Some(ca)) = (&tls_url, &ca_file) {
        write_private(
            &data_dir.join("kubeconfig"),
            kubeconfig(url, ca, &admin_token).as_bytes(),
        )?;
    }
    let token_path = data_dir.join("admin.token");
    write_private(&token_path, admin_token.as_bytes())?;
    if args.dev {
        eprintln!(
            "\nLattice dev server ready.\n  API:   http://{api_addr}{}\n  etcd:  {}\n  token: {}\n\n  export LATTICE_API_URL=http://{api_addr}\n  export LATTICE_TOKEN=$(cat {})\n  lattice get vclusters\n{}",
            tls_url.as_deref().map(|u| format!("  (HTTPS: {u})")).unwrap_or_default(),
            match (etcd_addr, &member_tls) {
                (None, _) => "off".to_string(),
                (Some(a), None) => format!("{a} (plaintext, loopback only)"),
                (Some(a), Some(_)) => format!(
                    "{a} (mutual TLS: etcdctl --cacert {pki}/ca.crt with a certificate from `lattice admin pki issue admin --name NAME --dir {pki}`)",
                    pki = pki_dir.display()
                ),
            },
            token_path.display(),
            token_path.display(),
            if tls_url.is_some() && ca_file.is_some() {
                format!("  kubectl --kubeconfig {} get allocations -A\n", data_dir.join("kubeconfig").display())
            } else {
                String::new()
            }
        );
    }

    wait_for_signal().await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(10), t).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "server task ended with an error"),
            Err(_) => tracing::warn!("server task did not stop within 10s"),
            _ => {}
        }
    }
    if let Some(raft) = raft_store {
        raft.shutdown().await;
    }
    Ok(())
}

/// `lattice_raft_{current_leader,current_term,last_log_index,last_applied_index,is_leader}`
/// gauges: leadership as it changes, the log and applied indexes at most 250 ms behind
/// (what `lattice admin raft status` and alerting read).
fn register_raft_gauges(
    raft: &lattice_store::raft::RaftStore,
    registry: &mut prometheus_client::registry::Registry,
) {
    use prometheus_client::metrics::gauge::Gauge;
    let r = registry.sub_registry_with_prefix("lattice_raft");
    let leader: Gauge = Gauge::default();
    let term: Gauge = Gauge::default();
    let last_log: Gauge = Gauge::default();
    let applied: Gauge = Gauge::default();
    let is_leader: Gauge = Gauge::default();
    r.register(
        "current_leader",
        "Member id of the current leader (0: none known)",
        leader.clone(),
    );
    r.register("current_term", "Current Raft term", term.clone());
    r.register(
        "last_log_index",
        "Index of the last log entry",
        last_log.clone(),
    );
    r.register(
        "last_applied_index",
        "Index of the last applied entry",
        applied.clone(),
    );
    r.register("is_leader", "1 when this member leads", is_leader.clone());
    let id = raft.id();
    // openraft publishes its full metrics on every append and apply, which would wake this
    // task several times per write on every member: leadership is read from the server
    // metrics (they change only with the vote, state or membership), the log and applied
    // indexes at most every 250 ms.
    let mut server = raft.raft().server_metrics();
    let data = raft.raft().data_metrics();
    tokio::spawn(async move {
        loop {
            let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            {
                let m = server.borrow_and_update();
                leader.set(i(m.current_leader.unwrap_or(0)));
                term.set(i(m.vote.leader_id().get_term()));
                is_leader.set(i64::from(m.current_leader == Some(id)));
            }
            {
                let d = data.borrow();
                last_log.set(i(d.last_log.map_or(0, |l| l.index)));
                applied.set(i(d.last_applied.map_or(0, |l| l.index)));
            }
            tokio::select! {
                changed = server.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
            }
        }
    });
}

/// "Am I the Raft leader", pushed as it changes (the controller host's gate).
fn raft_leader_gate(raft: &lattice_store::raft::RaftStore) -> tokio::sync::watch::Receiver<bool> {
    let id = raft.id();
    // The server metrics change only with the vote, state or membership (the full metrics
    // with every write).
    let mut metrics = raft.raft().server_metrics();
    let (tx, rx) = tokio::sync::watch::channel(raft.is_leader());
    tokio::spawn(async move {
        loop {
            let leader = metrics.borrow_and_update().current_leader == Some(id);
            tx.send_if_modified(|v| std::mem::replace(v, leader) != leader);
            if metrics.changed().await.is_err() || tx.is_closed() {
                break;
            }
        }
    });
    rx
}

/// Who may use the etcd port ([`lattice_store::tls::etcd_port_admits`]); of the members,
/// in a replicated store, only those of the cluster as this member knows it (a removed
/// member's certificate stays valid until it expires; its holder no longer gets in).
fn etcd_port_admission(raft: Option<lattice_store::raft::RaftStore>) -> lattice_pki::Admit {
    lattice_pki::Admit::new(lattice_store::tls::ETCD_PORT, move |id| match (id, &raft) {
        (lattice_pki::Identity::Member(m), Some(raft)) => raft.knows_member(*m),
        _ => lattice_store::tls::etcd_port_admits(id),
    })
}

async fn start_raft(
    args: &ServeArgs,
    data_dir: &Path,
    limits: Limits,
    tls: Option<lattice_store::tls::MemberTls>,
    rt: &tokio::runtime::Handle,
) -> anyhow::Result<lattice_store::raft::RaftStore> {
    use lattice_store::raft::{RaftConfig, RaftStore};
    let addr = args
        .raft_addr
        .context("--raft-addr is required for a replicated store")?;
    let mut config = RaftConfig::new(args.node_id, data_dir.join("store"), addr);
    config.advertise_addr = args.raft_advertise_addr.clone();
    config.bootstrap = args.bootstrap;
    config.snapshot_logs = args.snapshot_entries;
    config.limits = limits;
    config.tls = tls;
    config.quota_bytes = args.quota_backend_bytes;
    let (node_id, join) = (args.node_id, args.join.clone());
    // Started on the store's runtime, so that every task it spawns runs there.
    let start = async move {
        let store = RaftStore::start(config)
            .await
            .with_context(|| format!("starting Raft member {node_id} on {addr}"))?;
        if let Some(seed) = join {
            store
                .join(&seed)
                .await
                .with_context(|| format!("joining the cluster through {seed}"))?;
        }
        anyhow::Ok(store)
    };
    let store = rt
        .spawn(start)
        .await
        .context("the store's runtime stopped")??;
    tracing::info!(node = args.node_id, raft = %store.local_addr(), "raft member started");
    Ok(store)
}

/// The etcd port's MemberList and header term, from the Raft membership.
struct RaftMembership(lattice_store::raft::RaftStore);

impl lattice_store::grpc::Membership for RaftMembership {
    fn members(&self) -> Vec<lattice_store::Member> {
        let metrics = self.0.raft().metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| lattice_store::Member {
                id: *id,
                name: format!("member-{id}"),
                peer_urls: vec![format!("http://{}", node.addr)],
                client_urls: Vec::new(),
                is_learner: !voters.contains(id),
            })
            .collect()
    }

    fn raft_term(&self) -> Option<u64> {
        Some(self.0.raft().metrics().borrow().current_term)
    }
}

/// A kubeconfig for kubectl (and GitOps tools) against the HTTPS listener.
fn kubeconfig(url: &str, ca: &Path, token: &str) -> String {
    let ca = std::fs::canonicalize(ca).unwrap_or_else(|_| ca.to_path_buf());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lattice\n  cluster:\n    server: {url}\n    certificate-authority: {}\nusers:\n- name: lattice-admin\n  user:\n    token: {token}\ncontexts:\n- name: lattice\n  context:\n    cluster: lattice\n    user: lattice-admin\n    namespace: default\ncurrent-context: lattice\n",
        ca.display()
    )
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests;
