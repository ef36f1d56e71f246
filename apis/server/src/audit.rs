//! The audit log: who did what, when, from where, and how it ended.
//!
//! * **What is recorded**: every request an authenticated caller makes, at the level the
//!   cluster's `AuditPolicy` (or [`default_rules`]) gives it ([`layer`], a middleware
//!   inside authentication); and, whatever the policy says, every access to sensitive
//!   work: a record committed through the store (Raft) *before* the action proceeds
//!   ([`Auditor::commit_sensitive`]; the action is refused when it cannot be recorded).
//! * **The chain**: one per API server; each record carries the previous record's hash and
//!   is signed with the server's Ed25519 key (`lattice_apis::audit`). The public key is
//!   kept in the store (`/lattice/audit/keys/<server>/<keyId>`), and every second the
//!   chain's head (`/lattice/audit/heads/<server>`), so a log cut short is detected too.
//! * **Where**: `<dir>/audit.log`, JSON lines, appended by one writer task and synced to
//!   disk at least every 200 ms (sensitive records before their action), rotated at a size into `audit-<first seq>.log` (the oldest beyond
//!   a count are removed). Sensitive records are also under
//!   `/lattice/audit/sensitive/<server>/<seq>` in the store. Optionally forwarded to a
//!   webhook (JSON arrays, batched) and to syslog (RFC 5424 over UDP).
//! * **Reading**: `GET /v1/audit` (query), `/v1/audit/export` (JSON lines),
//!   `/v1/audit/verify` (this server's chain, against its key and its committed head),
//!   `/v1/audit/keys` (every server's public keys, for verifying an export elsewhere).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lattice_apis::audit::{Level, Record, GENESIS};
use lattice_apis::kinds::audit_policy::{
    default_rules, level_for, AuditRequest, AuditRule, POLICY_NAME,
};
use lattice_store::{KeyRange, KvBackend, PutRequest, RangeRequest};
use prometheus_client::metrics::counter::Counter;
use ring::signature::KeyPair;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::auth::{Role, UserInfo};
use crate::authz::{self, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::registry::follow::Follower;
use crate::routes::json_response;
use crate::Inner;

/// Store prefix of the servers' public keys.
const KEYS: &str = "/lattice/audit/keys/";
/// Store prefix of the chains' committed heads.
const HEADS: &str = "/lattice/audit/heads/";
/// Store prefix of the sensitive records.
const SENSITIVE: &str = "/lattice/audit/sensitive/";
/// The current file.
const CURRENT: &str = "audit.log";
/// The stage of a message that only asks the writer to finish what is queued.
const FLUSH: &str = "Flush";
/// Longest a written record waits for the disk (non-sensitive records; sensitive ones
/// are synced before their action proceeds).
const SYNC_EVERY: Duration = Duration::from_millis(200);
/// Largest request or response body recorded (larger ones are noted, not kept).
const MAX_BODY: usize = 256 * 1024;

/// Audit settings (`lattice-server --audit-*`).
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Where the log, its rotated files and the signing key live.
    pub dir: PathBuf,
    /// This server's name in the records (its chain).
    pub server_id: String,
    /// Rotate the current file at this size.
    pub max_file_bytes: u64,
    /// Rotated files kept (older ones are removed).
    pub max_files: usize,
    /// Also POST records (JSON arrays) here.
    pub webhook: Option<String>,
    /// Also send records to this syslog receiver (RFC 5424 over UDP).
    pub syslog: Option<std::net::SocketAddr>,
}

impl AuditConfig {
    /// Defaults for a server whose data lives in `dir`.
    pub fn new(dir: PathBuf, server_id: impl Into<String>) -> Self {
        Self {
            dir,
            server_id: server_id.into(),
            max_file_bytes: 100 * 1024 * 1024,
            max_files: 10,
            webhook: None,
            syslog: None,
        }
    }
}

struct Msg {
    record: Record,
    /// Committed to the store before the ack (sensitive records).
    commit: bool,
    ack: Option<oneshot::Sender<Result<(), String>>>,
}

/// The chain's head: the last record's seq and hash.
#[derive(Debug, Clone, Default, PartialEq)]
struct Head {
    seq: u64,
    hash: String,
}

/// Counts for `/metrics` (`lattice_audit_*`).
#[derive(Default)]
pub struct AuditCounts {
    /// Records written.
    pub records: Counter,
    /// Sensitive records committed to the store.
    pub sensitive: Counter,
    /// Records a forwarder (webhook, syslog) could not take or deliver.
    pub forward_dropped: Counter,
    /// Records that could not be written or committed.
    pub write_errors: Counter,
}

impl AuditCounts {
    /// A registry holding these counters.
    pub fn registry(&self) -> prometheus_client::registry::Registry {
        let mut r = prometheus_client::registry::Registry::with_prefix("lattice_audit");
        r.register("records", "Audit records written", self.records.clone());
        r.register(
            "sensitive_records",
            "Audit records of sensitive work committed to the store before the action",
            self.sensitive.clone(),
        );
        r.register(
            "forward_dropped",
            "Audit records the webhook or syslog forwarder could not deliver",
            self.forward_dropped.clone(),
        );
        r.register(
            "write_errors",
            "Audit records that could not be written or committed",
            self.write_errors.clone(),
        );
        r
    }
}

/// The audit log of one API server.
pub struct Auditor {
    cfg: AuditConfig,
    tx: mpsc::Sender<Msg>,
    policy: Follower,
    rules: Mutex<(u64, Arc<Vec<AuditRule>>)>,
    key_id: String,
    public_key: Vec<u8>,
    pub counts: Arc<AuditCounts>,
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Reads the Ed25519 key in `dir`, making it (0600) the first time.
fn signing_key(dir: &Path) -> anyhow::Result<ring::signature::Ed25519KeyPair> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("signing-key.pk8");
    match std::fs::read(&path) {
        Ok(pk8) => ring::signature::Ed25519KeyPair::from_pkcs8(&pk8)
            .map_err(|e| anyhow::anyhow!("{} is not an Ed25519 PKCS#8 key: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let rng = ring::rand::SystemRandom::new();
            let pk8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
                .map_err(|_| anyhow::anyhow!("no randomness for the audit key"))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            f.write_all(pk8.as_ref())?;
            f.sync_all()?;
            ring::signature::Ed25519KeyPair::from_pkcs8(pk8.as_ref())
                .map_err(|e| anyhow::anyhow!("the new audit key: {e}"))
        }
        Err(e) => Err(anyhow::anyhow!("read {}: {e}", path.display())),
    }
}

/// The log's files, oldest first (rotated ones, then the current one).
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
        })
        .collect();
    rotated.sort();
    let current = dir.join(CURRENT);
    if current.exists() {
        rotated.push(current);
    }
    rotated
}

/// The last complete record of the log (a torn last line, from a crash mid-write, is cut
/// off the current file).
fn recover(dir: &Path) -> anyhow::Result<Head> {
    let current = dir.join(CURRENT);
    if let Ok(bytes) = std::fs::read(&current) {
        let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if keep < bytes.len() {
            tracing::warn!(file = %current.display(), cut = bytes.len() - keep, "the audit log ends in a torn record; cutting it off");
            let f = std::fs::OpenOptions::new().write(true).open(&current)?;
            f.set_len(keep as u64)?;
            f.sync_all()?;
        }
    }
    for f in log_files(dir).iter().rev() {
        let text = std::fs::read_to_string(f)?;
        if let Some(line) = text.lines().rev().find(|l| !l.trim().is_empty()) {
            let r: Record = serde_json::from_str(line).map_err(|e| {
                anyhow::anyhow!("the last record of {} does not parse: {e}", f.display())
            })?;
            return Ok(Head {
                seq: r.seq,
                hash: r.hash,
            });
        }
    }
    Ok(Head {
        seq: 0,
        hash: GENESIS.to_string(),
    })
}

struct Writer {
    cfg: AuditConfig,
    key: ring::signature::Ed25519KeyPair,
    key_id: String,
    backend: Arc<dyn KvBackend>,
    file: std::io::BufWriter<std::fs::File>,
    size: u64,
    head: Arc<Mutex<Head>>,
    /// The head as synced to disk: what is committed to the store as the chain's head.
    durable: Arc<Mutex<Head>>,
    counts: Arc<AuditCounts>,
    forward: Vec<mpsc::Sender<Arc<Record>>>,
}

impl Writer {
    fn open_current(dir: &Path) -> std::io::Result<(std::io::BufWriter<std::fs::File>, u64)> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(dir.join(CURRENT))?;
        let size = f.metadata()?.len();
        Ok((std::io::BufWriter::with_capacity(256 * 1024, f), size))
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_all()?;
        let head = self.head.lock().unwrap_or_else(|p| p.into_inner()).seq;
        let first = {
            let text = std::fs::File::open(self.cfg.dir.join(CURRENT))?;
            std::io::BufReader::new(text)
                .lines()
                .next()
                .and_then(Result::ok)
                .and_then(|l| serde_json::from_str::<Record>(&l).ok())
                .map_or(head, |r| r.seq)
        };
        std::fs::rename(
            self.cfg.dir.join(CURRENT),
            self.cfg.dir.join(format!("audit-{first:020}.log")),
        )?;
        let (f, size) = Self::open_current(&self.cfg.dir)?;
        self.file = f;
        self.size = size;
        let files = log_files(&self.cfg.dir);
        let rotated = files.len().saturating_sub(1);
        for old in files
            .iter()
            .take(rotated.saturating_sub(self.cfg.max_files))
        {
            tracing::info!(file = %old.display(), "removing an old audit log file");
            let _ = std::fs::remove_file(old);
        }
        Ok(())
    }

    /// Seals `r` as the chain's next record.
    fn seal(&self, r: &mut Record) {
        let head = self.head.lock().unwrap_or_else(|p| p.into_inner()).clone();
        r.seq = head.seq + 1;
        r.prev = head.hash;
        r.server = self.cfg.server_id.clone();
        r.seal(&self.key, &self.key_id);
    }

    fn advance(&self, r: &Record) {
        *self.head.lock().unwrap_or_else(|p| p.into_inner()) = Head {
            seq: r.seq,
            hash: r.hash.clone(),
        };
    }

    fn append(&mut self, r: &Record) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if self.size > 0 && self.size + line.len() as u64 > self.cfg.max_file_bytes {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    /// Syncs the file to disk; the chain's durable head (what is checkpointed to the
    /// store) moves up to the last record written.
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_data()?;
        let head = self.head.lock().unwrap_or_else(|p| p.into_inner()).clone();
        *self.durable.lock().unwrap_or_else(|p| p.into_inner()) = head;
        Ok(())
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut batch = Vec::with_capacity(256);
        let mut last_sync = tokio::time::Instant::now();
        let mut dirty = false;
        loop {
            // Records wait at most SYNC_EVERY for the disk; a sync is due when that has
            // passed with nothing more to write.
            let received = if dirty {
                let wait = SYNC_EVERY.saturating_sub(last_sync.elapsed());
                match tokio::time::timeout(wait, rx.recv_many(&mut batch, 256)).await {
                    Ok(n) => n,
                    Err(_) => {
                        if let Err(e) = self.sync() {
                            self.counts.write_errors.inc();
                            tracing::error!(error = %e, "cannot sync the audit log");
                        }
                        dirty = false;
                        last_sync = tokio::time::Instant::now();
                        continue;
                    }
                }
            } else {
                rx.recv_many(&mut batch, 256).await
            };
            if received == 0 {
                let _ = self.sync();
                return;
            }
            let mut acks = Vec::new();
            let mut must_sync = false;
            for msg in batch.drain(..) {
                let Msg {
                    mut record,
                    commit,
                    ack,
                } = msg;
                if record.stage == FLUSH {
                    acks.extend(ack);
                    continue;
                }
                self.seal(&mut record);
                if commit {
                    let key = format!("{SENSITIVE}{}/{:020}", self.cfg.server_id, record.seq);
                    let body = serde_json::to_vec(&record).unwrap_or_default();
                    if let Err(e) = self
                        .backend
                        .put(PutRequest::new(Bytes::from(key), Bytes::from(body)))
                        .await
                    {
                        // Not in the chain: the action it was for does not proceed.
                        self.counts.write_errors.inc();
                        if let Some(a) = ack {
                            let _ = a.send(Err(e.to_string()));
                        }
                        continue;
                    }
                    self.counts.sensitive.inc();
                    must_sync = true;
                }
                if let Err(e) = self.append(&record) {
                    self.counts.write_errors.inc();
                    tracing::error!(error = %e, seq = record.seq, "cannot write the audit log");
                    if commit {
                        // In the store already: the chain goes on from it (verify names it
                        // as missing from the log, which it is).
                        self.advance(&record);
                    }
                    if let Some(a) = ack {
                        let _ = a.send(Err(e.to_string()));
                    }
                    continue;
                }
                self.advance(&record);
                self.counts.records.inc();
                let shared = Arc::new(record);
                for f in &self.forward {
                    if f.try_send(shared.clone()).is_err() {
                        self.counts.forward_dropped.inc();
                    }
                }
                if let Some(a) = ack {
                    acks.push(a);
                }
            }
            // Written through to the file at once (readers see it); synced to disk for
            // sensitive records before their ack, otherwise every SYNC_EVERY (a group
            // commit: one sync for every record of the interval).
            let written = if must_sync || last_sync.elapsed() >= SYNC_EVERY {
                last_sync = tokio::time::Instant::now();
                dirty = false;
                self.sync()
            } else {
                dirty = true;
                self.file.flush()
            };
            if let Err(e) = &written {
                self.counts.write_errors.inc();
                tracing::error!(error = %e, "cannot write the audit log to disk");
            }
            for a in acks {
                let _ = a.send(written.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            }
        }
    }
}

/// Commits the chain's head to the store every second it changed.
async fn checkpoint_heads(head: Arc<Mutex<Head>>, backend: Arc<dyn KvBackend>, server: String) {
    let mut last = Head::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = head.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if now == last || now.seq == 0 {
            continue;
        }
        let v = json!({"seq": now.seq, "hash": now.hash, "time": now_rfc3339()});
        match backend
            .put(PutRequest::new(
                Bytes::from(format!("{HEADS}{server}")),
                Bytes::from(v.to_string()),
            ))
            .await
        {
            Ok(_) => last = now,
            Err(e) => tracing::warn!(error = %e, "cannot commit the audit chain's head"),
        }
    }
}

async fn forward_webhook(
    url: String,
    mut rx: mpsc::Receiver<Arc<Record>>,
    counts: Arc<AuditCounts>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 500).await > 0 {
        let body: Vec<&Record> = batch.iter().map(|r| r.as_ref()).collect();
        let mut wait = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            match http.post(&url).json(&body).send().await {
                Ok(r) if r.status().is_success() => break,
                Ok(r) => {
                    tracing::warn!(status = %r.status(), %url, "the audit webhook refused a batch")
                }
                Err(e) => tracing::warn!(error = %e, %url, "cannot reach the audit webhook"),
            }
            tries += 1;
            if tries >= 5 {
                counts.forward_dropped.inc_by(body.len() as u64);
                break;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(10));
        }
        batch.clear();
    }
}

async fn forward_syslog(
    to: std::net::SocketAddr,
    mut rx: mpsc::Receiver<Arc<Record>>,
    counts: Arc<AuditCounts>,
) {
    let bind = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let sock = match tokio::net::UdpSocket::bind(bind).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot open a socket for audit syslog");
            return;
        }
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h.is_ascii() && !h.contains(' '))
        .unwrap_or_else(|| "-".into());
    while let Some(r) = rx.recv().await {
        // <110>: facility 13 (log audit), severity 6 (informational).
        let msg = format!(
            "<110>1 {} {host} lattice-apiserver - audit - {}",
            r.time,
            serde_json::to_string(r.as_ref()).unwrap_or_default()
        );
        if sock.send_to(msg.as_bytes(), to).await.is_err() {
            counts.forward_dropped.inc();
        }
    }
}

impl Auditor {
    /// Opens (or starts) the log in `cfg.dir` and starts its writer. Needs a tokio runtime.
    pub async fn start(cfg: AuditConfig, backend: Arc<dyn KvBackend>) -> anyhow::Result<Arc<Self>> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cfg.dir)?;
        let key = signing_key(&cfg.dir)?;
        let public_key = key.public_key().as_ref().to_vec();
        let key_id = lattice_apis::audit::key_id(&public_key);
        let mut head = recover(&cfg.dir)?;
        let (mut file, size) = Writer::open_current(&cfg.dir)?;
        // Sensitive records committed to the store but not written before a crash: the
        // chain goes on from them. (A store that cannot answer yet, a Raft member before
        // its cluster has a leader, leaves them for the next start: the chain still
        // links, and `verify` names the records missing from this file.)
        let prefix = Bytes::from(format!("{SENSITIVE}{}/", cfg.server_id));
        let listed = tokio::time::timeout(
            Duration::from_secs(5),
            backend.range(RangeRequest {
                range: KeyRange::prefix(prefix.clone()),
                ..Default::default()
            }),
        )
        .await;
        let mut size = size;
        match listed {
            Ok(Ok(stored)) => {
                for kv in stored.kvs {
                    if let Ok(r) = serde_json::from_slice::<Record>(&kv.value) {
                        if r.seq == head.seq + 1 && r.prev == head.hash {
                            let line = format!("{}\n", serde_json::to_string(&r)?);
                            file.write_all(line.as_bytes())?;
                            size += line.len() as u64;
                            head = Head {
                                seq: r.seq,
                                hash: r.hash,
                            };
                        }
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the sensitive audit records from the store")
            }
            Err(_) => tracing::warn!("the store did not answer for the sensitive audit records"),
        }
        file.flush()?;
        // The public key, for verifying this server's records anywhere (retried until the
        // store takes it).
        {
            let backend = backend.clone();
            let key = Bytes::from(format!("{KEYS}{}/{key_id}", cfg.server_id));
            let value = Bytes::from(lattice_apis::audit::base64_encode(&public_key));
            tokio::spawn(async move {
                let mut wait = Duration::from_millis(200);
                while let Err(e) = backend
                    .put(PutRequest::new(key.clone(), value.clone()))
                    .await
                {
                    tracing::warn!(error = %e, "cannot publish the audit public key yet; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
            });
        }
        let durable = Arc::new(Mutex::new(head.clone()));
        let head = Arc::new(Mutex::new(head));
        let counts = Arc::new(AuditCounts::default());
        let mut forward = Vec::new();
        if let Some(url) = &cfg.webhook {
            let (tx, rx) = mpsc::channel(10_000);
            forward.push(tx);
            tokio::spawn(forward_webhook(url.clone(), rx, counts.clone()));
        }
        if let Some(to) = cfg.syslog {
            let (tx, rx) = mpsc::channel(10_000);
            forward.push(tx);
            tokio::spawn(forward_syslog(to, rx, counts.clone()));
        }
        let (tx, rx) = mpsc::channel(65_536);
        let writer = Writer {
            cfg: cfg.clone(),
            key,
            key_id: key_id.clone(),
            backend: backend.clone(),
            file,
            size,
            head: head.clone(),
            durable: durable.clone(),
            counts: counts.clone(),
            forward,
        };
        tokio::spawn(writer.run(rx));
        tokio::spawn(checkpoint_heads(
            durable,
            backend.clone(),
            cfg.server_id.clone(),
        ));
        let policy = Follower::new(
            lattice_apis::find_kind("auditpolicies")
                .map(|k| k.key_prefix())
                .unwrap_or_default(),
        );
        policy.start(&backend);
        tracing::info!(dir = %cfg.dir.display(), server = %cfg.server_id, key = %key_id, "audit log open");
        Ok(Arc::new(Self {
            cfg,
            tx,
            policy,
            rules: Mutex::new((u64::MAX, Arc::new(default_rules()))),
            key_id,
            public_key,
            counts,
        }))
    }

    /// The rules in force: the `default` AuditPolicy's, else [`default_rules`].
    fn rules(&self) -> Arc<Vec<AuditRule>> {
        let gen = self.policy.generation();
        let mut cached = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        if cached.0 != gen {
            let key = format!(
                "{}{POLICY_NAME}",
                String::from_utf8_lossy(self.policy.prefix())
            );
            let rules = self
                .policy
                .get(key.as_bytes())
                .and_then(|v| serde_json::from_slice::<Value>(&v).ok())
                .and_then(|v| {
                    serde_json::from_value::<Vec<AuditRule>>(v.get("rules")?.clone()).ok()
                })
                .unwrap_or_else(default_rules);
            *cached = (gen, Arc::new(rules));
        }
        cached.1.clone()
    }

    /// Records `r` (its chain fields are filled by the writer); waits only for room in the
    /// queue, never for the disk.
    pub async fn record(&self, r: Record) {
        if self
            .tx
            .send(Msg {
                record: r,
                commit: false,
                ack: None,
            })
            .await
            .is_err()
        {
            self.counts.write_errors.inc();
        }
    }

    /// Records `r` about sensitive work and returns once it is committed to the store
    /// (replicated through Raft) and written to the log: only then may the action
    /// proceed. An error: it could not be recorded, and the action must not happen.
    pub async fn commit_sensitive(&self, mut r: Record) -> ApiResult<()> {
        r.sensitive = true;
        r.stage = "RequestReceived".into();
        if r.level < Level::Metadata {
            r.level = Level::Metadata;
        }
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Msg {
                record: r,
                commit: true,
                ack: Some(tx),
            })
            .await
            .map_err(|_| ApiError::unavailable("the audit log is closed"))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ApiError::unavailable(format!(
                "cannot record this access to sensitive work in the audit log ({e}); it was \
                 not performed"
            ))),
            Err(_) => Err(ApiError::unavailable("the audit log is closed")),
        }
    }

    /// This server's key id and public key.
    pub fn key(&self) -> (&str, &[u8]) {
        (&self.key_id, &self.public_key)
    }

    /// Waits until every record queued so far is written (tests, shutdown).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        let _ = self
            .tx
            .send(Msg {
                record: Record {
                    stage: FLUSH.into(),
                    ..Default::default()
                },
                commit: false,
                ack: Some(tx),
            })
            .await;
        let _ = rx.await;
    }
}

/// What a request is, for the record and the policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Target {
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub tenant: Option<String>,
    pub name: Option<String>,
}

/// What `method path?query` asks, in the authorizer's words; `None` for what is not
/// recorded (health, metrics, discovery, OpenAPI, `/v1/auth/*`).
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Option<Target> {
    let watch = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch"))
    });
    let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match seg.as_slice() {
        ["apis", "lattice.dev", "v1alpha1", rest @ ..] => rest,
        ["v1", "admin", route @ ("tokens" | "config" | "bootstrap-tokens"), rest @ ..] => {
            let resource = match *route {
                "tokens" => "apitokens",
                "config" => "clusterconfig",
                _ => "bootstraptokens",
            };
            return Some(Target {
                verb: verb(method, !rest.is_empty(), false, None),
                resource: resource.into(),
                name: rest.first().map(|s| s.to_string()),
                ..Default::default()
            });
        }
        ["v1", "admin", "nodes", n, "revoke"] => {
            return Some(Target {
                verb: "delete".into(),
                resource: "nodecertificates".into(),
                name: Some(n.to_string()),
                ..Default::default()
            })
        }
        ["v1", "nodes", "certificate", "renew"] => {
            return Some(Target {
                verb: "create".into(),
                resource: "nodecertificates".into(),
                subresource: Some("renew".into()),
                ..Default::default()
            })
        }
        ["v1", "attach", ..] => {
            return Some(Target {
                verb: "create".into(),
                resource: "attachtickets".into(),
                ..Default::default()
            })
        }
        ["v1", "audit", ..] => {
            return Some(Target {
                verb: "list".into(),
                resource: "auditrecords".into(),
                ..Default::default()
            })
        }
        ["v1", "auth", ..] | ["api", ..] => return None,
        ["v1", plural, rest @ ..] => {
            let sub = rest.get(1).map(|s| s.to_string());
            // The Intent routes name the tenant in the query (`?tenant=`).
            // As the routes read it: decoded, the last one given.
            let tenant = query.and_then(|q| {
                reqwest::Url::parse(&format!("http://x/?{q}"))
                    .ok()?
                    .query_pairs()
                    .filter(|(k, _)| k == "tenant")
                    .last()
                    .map(|(_, v)| v.into_owned())
                    .filter(|t| !t.is_empty())
            });
            return Some(Target {
                verb: verb(method, !rest.is_empty(), watch, sub.as_deref()),
                resource: plural.to_string(),
                subresource: sub,
                tenant,
                name: rest.first().map(|s| s.to_string()),
            });
        }
        _ => return None,
    };
    let (tenant, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        r => (None, r),
    };
    let plural = rest.first()?.to_string();
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    Some(Target {
        verb: verb(method, name.is_some(), watch, sub.as_deref()),
        resource: plural,
        subresource: sub,
        tenant,
        name,
    })
}

fn verb(method: &Method, named: bool, watch: bool, sub: Option<&str>) -> String {
    match *method {
        Method::GET if matches!(sub, Some("log" | "attach")) => "connect",
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST if matches!(sub, Some("attach")) => "connect",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
    .to_string()
}

/// A record of `user` doing `t`, before its outcome is known.
pub fn record_for(
    user: &UserInfo,
    t: &Target,
    request_uri: &str,
    source: Option<String>,
    user_agent: Option<String>,
) -> Record {
    Record {
        time: now_rfc3339(),
        stage: "ResponseComplete".into(),
        user: user.name.clone(),
        groups: user.groups.clone(),
        service_account: user.service_account,
        verb: t.verb.clone(),
        resource: t.resource.clone(),
        subresource: t.subresource.clone(),
        tenant: t.tenant.clone(),
        name: t.name.clone(),
        request_uri: request_uri.to_string(),
        source,
        user_agent,
        decision: "allow".into(),
        ..Default::default()
    }
}

fn source_of(req: &Request) -> Option<String> {
    use axum::extract::ConnectInfo;
    if let Some(c) = req
        .extensions()
        .get::<ConnectInfo<crate::heartbeat::ConnFd>>()
    {
        return c.0 .1.map(|a| a.to_string());
    }
    req.extensions()
        .get::<ConnectInfo<crate::tls::TlsConnInfo>>()
        .map(|c| c.0.peer.to_string())
}

/// What a body looks like in a record: its JSON, its text, or a note.
fn body_value(bytes: &[u8]) -> Value {
    if bytes.len() > MAX_BODY {
        return json!({"omitted": format!("{} bytes, more than the {MAX_BODY} recorded", bytes.len())});
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// Responses that carry secrets, never recorded: API tokens, job tokens, bootstrap tokens.
fn secret_response(t: &Target) -> bool {
    matches!(t.resource.as_str(), "apitokens" | "bootstraptokens")
        || t.subresource.as_deref() == Some("token")
}

/// The middleware: records each authenticated request at the policy's level.
pub async fn layer(State(inner): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    let Some(auditor) = inner.auditor() else {
        return next.run(req).await;
    };
    let Some(user) = req.extensions().get::<UserInfo>().cloned() else {
        return next.run(req).await;
    };
    let Some(t) = classify(req.method(), req.uri().path(), req.uri().query()) else {
        return next.run(req).await;
    };
    let mut groups = user.groups.clone();
    if user.role == Role::Node {
        groups.push("system:nodes".into());
    }
    let level = level_for(
        &auditor.rules(),
        &AuditRequest {
            user: &user.name,
            groups: &groups,
            verb: &t.verb,
            resource: &t.resource,
            subresource: t.subresource.as_deref(),
            tenant: t.tenant.as_deref(),
        },
    );
    if level == Level::None {
        return next.run(req).await;
    }
    let uri = format!("{} {}", req.method(), req.uri());
    let ua = req
        .headers()
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut record = record_for(&user, &t, &uri, source_of(&req), ua);
    record.level = level;
    let streaming = matches!(t.verb.as_str(), "watch" | "connect");
    // The body is read for the record at Request and above, and for a create at any level
    // (the object's name is in it, not in the path).
    let read_body = !streaming
        && req.method() != Method::GET
        && (level >= Level::Request || (t.verb == "create" && t.name.is_none()));
    let req = if read_body {
        let (parts, body) = req.into_parts();
        match axum::body::to_bytes(body, inner.config.max_body_bytes).await {
            Ok(bytes) => {
                if record.name.is_none() && t.verb == "create" {
                    record.name = serde_json::from_slice::<Value>(&bytes)
                        .ok()
                        .and_then(|v| v.pointer("/metadata/name")?.as_str().map(str::to_string));
                }
                if level >= Level::Request && !bytes.is_empty() {
                    record.request_object = Some(body_value(&bytes));
                }
                Request::from_parts(parts, Body::from(bytes))
            }
            Err(_) => {
                record.code = 413;
                record.decision = "deny".into();
                record.reason = Some("request body too large".into());
                auditor.record(record).await;
                return ApiError::new(
                    413,
                    "RequestEntityTooLarge",
                    "the request body is too large",
                )
                .into_response();
            }
        }
    } else {
        req
    };
    let resp = next.run(req).await;
    let status = resp.status();
    record.code = status.as_u16();
    if status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED {
        record.decision = "deny".into();
    }
    let keep_body = (status.is_client_error() || status.is_server_error())
        || (level == Level::RequestResponse && !streaming && !secret_response(&t));
    let resp = if keep_body && !streaming {
        let (parts, body) = resp.into_parts();
        match axum::body::to_bytes(body, MAX_BODY * 4).await {
            Ok(bytes) => {
                let v = body_value(&bytes);
                if !status.is_success() {
                    record.reason = v.get("message").and_then(Value::as_str).map(str::to_string);
                }
                if level == Level::RequestResponse && !secret_response(&t) {
                    record.response_object = Some(v);
                }
                Response::from_parts(parts, Body::from(bytes))
            }
            Err(_) => Response::from_parts(parts, Body::empty()),
        }
    } else {
        resp
    };
    auditor.record(record).await;
    resp
}

/// Records a session into, or a read of the output of, sensitive work before it happens
/// (see [`Auditor::commit_sensitive`]); nothing for other work, or when the server keeps no
/// audit log.
pub async fn sensitive_access(
    inner: &Inner,
    user: &UserInfo,
    obj: &Value,
    subresource: &str,
    request_uri: &str,
) -> ApiResult<()> {
    let Some(a) = inner.auditor() else {
        return Ok(());
    };
    if !crate::admission::sensitive_work(&inner.resources, obj).await? {
        return Ok(());
    }
    let at = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
    let t = Target {
        verb: "connect".into(),
        resource: "allocations".into(),
        subresource: Some(subresource.to_string()),
        tenant: at("/metadata/namespace"),
        name: at("/metadata/name"),
    };
    let mut r = record_for(user, &t, request_uri, None, None);
    r.level = Level::Metadata;
    a.commit_sensitive(r).await
}

/// The audit log's hook on writes of sensitive work ([`crate::resources::SensitiveWrites`]).
pub struct SensitiveHook(pub Arc<Auditor>);

#[async_trait::async_trait]
impl crate::resources::SensitiveWrites for SensitiveHook {
    async fn before(
        &self,
        caller: &UserInfo,
        verb: &str,
        kind: &'static lattice_apis::KindInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<()> {
        let t = Target {
            verb: verb.to_string(),
            resource: kind.plural.to_string(),
            tenant: ns.map(str::to_string),
            name: Some(name.to_string()),
            ..Default::default()
        };
        let uri = format!("{verb} {}/{}/{name}", kind.plural, ns.unwrap_or("-"));
        let mut r = record_for(caller, &t, &uri, None, None);
        r.level = Level::Metadata;
        self.0.commit_sensitive(r).await
    }
}

/// Reads every record of this server's log, oldest first, through `f` (stops when `f`
/// returns false).
fn each_record(dir: &Path, mut f: impl FnMut(&str, Record) -> bool) -> std::io::Result<()> {
    for file in log_files(dir) {
        let r = std::io::BufReader::new(std::fs::File::open(&file)?);
        for line in r.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            if let Ok(rec) = serde_json::from_str::<Record>(&line) {
                if !f(&line, rec) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

fn audit_dir(inner: &Inner) -> ApiResult<PathBuf> {
    inner
        .auditor()
        .map(|a| a.cfg.dir.clone())
        .ok_or_else(|| ApiError::new(404, "NotFound", "this API server keeps no audit log"))
}

/// Who may read the log: `list auditrecords` cluster-wide (system admins), or in the
/// tenant asked for (its tenant admins).
fn may_read(user: &UserInfo, tenant: Option<&str>) -> ApiResult<()> {
    let mut a = Attributes::other(Verb::List, "auditrecords");
    if let Some(t) = tenant {
        a.namespaced = true;
        a.namespace = Some(t);
    }
    authz::authorize(user, &a)
}

/// A `since` as RFC 3339 or an age (`1h`, `30m`, `2d`).
fn parse_since(s: &str) -> ApiResult<chrono::DateTime<chrono::Utc>> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let secs = lattice_apis::duration::parse_duration(s).map_err(|e| {
        ApiError::bad_request(format!(
            "since: {s:?} is neither an RFC 3339 time nor an age such as 1h ({e})"
        ))
    })?;
    Ok(chrono::Utc::now() - chrono::Duration::seconds(secs as i64))
}

fn matches(
    q: &HashMap<String, String>,
    r: &Record,
    since: Option<&chrono::DateTime<chrono::Utc>>,
) -> bool {
    let eq = |k: &str, v: Option<&str>| q.get(k).is_none_or(|want| Some(want.as_str()) == v);
    eq("user", Some(&r.user))
        && eq("tenant", r.tenant.as_deref())
        && eq("verb", Some(&r.verb))
        && eq("resource", Some(&r.resource))
        && eq("name", r.name.as_deref())
        && eq("decision", Some(&r.decision))
        && since.is_none_or(|s| {
            chrono::DateTime::parse_from_rfc3339(&r.time)
                .is_ok_and(|t| t.with_timezone(&chrono::Utc) >= *s)
        })
}

/// `GET /v1/audit?user=&tenant=&verb=&resource=&name=&decision=&since=&limit=`: the
/// newest matching records of this server's log (newest last).
pub async fn query(
    State(inner): State<Arc<Inner>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        may_read(&user, q.get("tenant").map(String::as_str))?;
        let dir = audit_dir(&inner)?;
        let since = q.get("since").map(|s| parse_since(s)).transpose()?;
        let limit: usize = match q.get("limit") {
            Some(l) => l
                .parse()
                .ok()
                .filter(|n| (1..=100_000).contains(n))
                .ok_or_else(|| ApiError::bad_request("limit: a number from 1 to 100000"))?,
            None => 1000,
        };
        if let Some(a) = inner.auditor() {
            a.flush().await;
        }
        let mut out: std::collections::VecDeque<Value> = Default::default();
        let scan = tokio::task::spawn_blocking(move || {
            each_record(&dir, |_, r| {
                if matches(&q, &r, since.as_ref()) {
                    if out.len() == limit {
                        out.pop_front();
                    }
                    out.push_back(serde_json::to_value(&r).unwrap_or_default());
                }
                true
            })
            .map(|()| out)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("read the audit log: {e}")))?;
        Ok(json_response(StatusCode::OK, &json!({ "items": scan })))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `GET /v1/audit/export?since=`: this server's log as JSON lines, as written (what
/// `lattice audit verify --file` checks).
pub async fn export(
    State(inner): State<Arc<Inner>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        may_read(&user, None)?;
        let dir = audit_dir(&inner)?;
        let since = q.get("since").map(|s| parse_since(s)).transpose()?;
        if let Some(a) = inner.auditor() {
            a.flush().await;
        }
        let text = tokio::task::spawn_blocking(move || {
            let mut out = String::new();
            each_record(&dir, |line, r| {
                if matches(&HashMap::new(), &r, since.as_ref()) {
                    out.push_str(line);
                    out.push('\n');
                }
                true
            })
            .map(|()| out)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("read the audit log: {e}")))?;
        let mut resp = (StatusCode::OK, text).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/jsonl"),
        );
        Ok(resp)
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// Every server's audit public keys, from the store: keyId → raw key.
async fn all_keys(backend: &Arc<dyn KvBackend>) -> ApiResult<HashMap<String, (String, Vec<u8>)>> {
    let p = Bytes::from_static(KEYS.as_bytes());
    let listed = backend
        .range(RangeRequest {
            range: KeyRange::prefix(p.clone()),
            ..Default::default()
        })
        .await?;
    Ok(listed
        .kvs
        .iter()
        .filter_map(|kv| {
            let k = std::str::from_utf8(&kv.key).ok()?.strip_prefix(KEYS)?;
            let (server, id) = k.rsplit_once('/')?;
            let pk = lattice_apis::audit::base64_decode(std::str::from_utf8(&kv.value).ok()?)?;
            Some((id.to_string(), (server.to_string(), pk)))
        })
        .collect())
}

/// `GET /v1/audit/keys`: `{keys: [{server, keyId, publicKey}]}`.
pub async fn keys(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        may_read(&user, None)?;
        let keys = all_keys(&inner.resources.backend).await?;
        let items: Vec<Value> = keys
            .iter()
            .map(|(id, (server, pk))| {
                json!({"server": server, "keyId": id, "publicKey": lattice_apis::audit::base64_encode(pk)})
            })
            .collect();
        Ok(json_response(StatusCode::OK, &json!({ "keys": items })))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `GET /v1/audit/verify`: this server's chain checked (hashes, links, signatures) and
/// held against the head committed to the store (a log cut short).
pub async fn verify(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    let r = async {
        let user = crate::routes::authenticate(&inner, &headers).await?;
        may_read(&user, None)?;
        let dir = audit_dir(&inner)?;
        let a = inner
            .auditor()
            .ok_or_else(|| ApiError::internal("no audit log"))?;
        a.flush().await;
        let keys: HashMap<String, lattice_apis::audit::PublicKey> =
            all_keys(&inner.resources.backend)
                .await?
                .into_iter()
                .map(|(id, (server, key))| (id, lattice_apis::audit::PublicKey { server, key }))
                .collect();
        // The sensitive records committed to the store: each must be in the log as it was
        // committed.
        let prefix = Bytes::from(format!("{SENSITIVE}{}/", a.cfg.server_id));
        let committed_sensitive: Vec<Record> = inner
            .resources
            .backend
            .range(RangeRequest {
                range: KeyRange::prefix(prefix.clone()),
                ..Default::default()
            })
            .await?
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect();
        let committed = inner
            .resources
            .backend
            .get(Bytes::from(format!("{HEADS}{}", a.cfg.server_id)))
            .await?
            .and_then(|kv| serde_json::from_slice::<Value>(&kv.value).ok());
        let server = a.cfg.server_id.clone();
        let head_seq = committed
            .as_ref()
            .and_then(|h| h["seq"].as_u64())
            .unwrap_or(0);
        let server_name = server.clone();
        let report = tokio::task::spawn_blocking(move || {
            let mut lines = Vec::new();
            for f in log_files(&dir) {
                let text = std::fs::read_to_string(&f)?;
                lines.extend(text.lines().map(str::to_string));
            }
            let mut report =
                lattice_apis::audit::verify(lines.iter().map(String::as_str), &keys, false);
            // What the store holds of this chain, looked up in the log by seq.
            let mut wanted: HashMap<u64, String> = committed_sensitive
                .into_iter()
                .map(|r| (r.seq, r.hash))
                .collect();
            let mut head_hash = None;
            for l in &lines {
                let Ok(r) = serde_json::from_str::<Record>(l) else {
                    continue;
                };
                if r.seq == head_seq {
                    head_hash = Some(r.hash.clone());
                }
                if let Some(h) = wanted.remove(&r.seq) {
                    if h != r.hash {
                        report.problems.push(format!(
                            "record {} differs from the sensitive record committed to the store",
                            r.seq
                        ));
                    }
                }
            }
            let first = report.chains.get(&server_name).map_or(u64::MAX, |c| c.0);
            let mut missing: Vec<u64> = wanted.into_keys().filter(|s| *s >= first).collect();
            missing.sort_unstable();
            if !missing.is_empty() {
                report.problems.push(format!(
                    "sensitive records committed to the store are not in the log: {missing:?}"
                ));
            }
            Ok::<_, std::io::Error>((report, head_hash))
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("read the audit log: {e}")))?;
        let (mut report, head_hash) = report;
        if let Some(h) = committed {
            let seq = h["seq"].as_u64().unwrap_or(0);
            let hash = h["hash"].as_str().unwrap_or_default();
            match report.chains.get(&server) {
                Some((first, _, _)) if *first > seq + 1 => report.problems.push(format!(
                    "the log starts at record {first}, after record {seq} that was committed \
                     as the chain's head: the records up to it were removed"
                )),
                Some((first, last, _)) if *last >= seq => {
                    if seq >= *first && head_hash.as_deref() != Some(hash) {
                        report.problems.push(format!(
                            "record {seq} is not the one committed to the store as the \
                             chain's head: the log was rewritten"
                        ));
                    }
                }
                Some((_, last, _)) => report.problems.push(format!(
                    "the log ends at record {last}, but record {seq} was committed: records \
                     {} to {seq} were removed from its end",
                    last + 1
                )),
                None => report
                    .problems
                    .push(format!("the log is empty, but record {seq} was committed")),
            }
        }
        Ok(json_response(
            StatusCode::OK,
            &json!({"ok": report.ok(), "server": server, "report": report}),
        ))
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_record_is_cut_off_and_the_chain_goes_on_from_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recover(dir.path()).unwrap().hash, GENESIS);
        let key = signing_key(dir.path()).unwrap();
        let mut r = Record {
            seq: 1,
            prev: GENESIS.into(),
            ..Default::default()
        };
        r.seal(&key, "k");
        let line = serde_json::to_string(&r).unwrap();
        std::fs::write(
            dir.path().join(CURRENT),
            format!("{line}\n{{\"seq\": 2, \"ti"),
        )
        .unwrap();
        let head = recover(dir.path()).unwrap();
        assert_eq!((head.seq, head.hash), (1, r.hash.clone()));
        assert_eq!(
            std::fs::read_to_string(dir.path().join(CURRENT)).unwrap(),
            format!("{line}\n")
        );
        // The key is kept, readable by its owner only.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("signing-key.pk8"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            signing_key(dir.path()).unwrap().public_key().as_ref(),
            key.public_key().as_ref()
        );
    }

    #[test]
    fn requests_are_named_as_the_authorizer_names_them() {
        let c = |m: Method, p: &str, q: Option<&str>| classify(&m, p, q).unwrap();
        let t = c(
            Method::POST,
            "/apis/lattice.dev/v1alpha1/namespaces/t1/allocations",
            None,
        );
        assert_eq!(
            (t.verb.as_str(), t.resource.as_str(), t.tenant.as_deref()),
            ("create", "allocations", Some("t1"))
        );
        let t = c(
            Method::GET,
            "/apis/lattice.dev/v1alpha1/namespaces/t1/allocations/a/log",
            None,
        );
        assert_eq!(
            (t.verb.as_str(), t.subresource.as_deref(), t.name.as_deref()),
            ("connect", Some("log"), Some("a"))
        );
        let t = c(
            Method::GET,
            "/apis/lattice.dev/v1alpha1/nodes",
            Some("watch=true"),
        );
        assert_eq!((t.verb.as_str(), t.tenant), ("watch", None));
        let t = c(Method::DELETE, "/v1/admin/tokens/abc", None);
        assert_eq!(
            (t.verb.as_str(), t.resource.as_str()),
            ("delete", "apitokens")
        );
        // The Intent routes' tenant, as they read it: decoded, the last one.
        let t = c(
            Method::POST,
            "/v1/allocations",
            Some("tenant=decoy&tenant=min%65"),
        );
        assert_eq!(t.tenant.as_deref(), Some("mine"));
        assert!(classify(&Method::GET, "/v1/auth/whoami", None).is_none());
        assert!(classify(&Method::GET, "/healthz", None).is_none());
    }
}
