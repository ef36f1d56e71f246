//! The agent's PMI server: how the ranks of an MPI job step find each other without
//! `mpiexec` (the seed's ADR-010: native PMI-2).
//!
//! For a step with `spec.launch.mpi: pmi2` the agent makes one socket pair per local
//! rank; the rank inherits its end as `PMI_FD` (with `PMI_RANK`, `PMI_SIZE`,
//! `PMI_JOBID`), and [`PmiServer`] answers on the other end, in PMI-2 or PMI-1 as the
//! rank's first line asks ([`wire`]). Puts are held back until a fence (`kvs-fence`,
//! PMI-1's `barrier_in`); when every local rank has entered it, this node's puts go to
//! the [`Exchange`], which returns every node's, and only then are the ranks released:
//! a fence is global. The cross-node exchange is in [`exchange`].
//!
//! A rank that calls `abort`, or that closes its socket after `init` without
//! `finalize` (it died), ends the whole step: an [`PmiEvent::Abort`] goes to the
//! supervisor, which stops this node's part with the message, and the exchange tells
//! every other node of the step to do the same.

pub mod exchange;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use wire::Message;

/// The longest key a rank may put (PMI-2 clients allow 64 bytes).
pub const MAX_KEY: usize = 256;
/// The longest value a rank may put (PMI-2 clients allow 1,024 bytes).
pub const MAX_VALUE: usize = 4096;
/// The PMI data a step may hold on a node, per rank of the step...
const BUDGET_PER_RANK: usize = 256 << 10;
/// ... and in all: the agent's memory is not the job's.
const MAX_BUDGET: usize = 1 << 30;
/// The longest abort message kept (the rest is cut).
const MAX_MESSAGE: usize = 1024;

/// `message` cut to [`MAX_MESSAGE`] bytes, control characters replaced.
pub(crate) fn tidy(message: &str) -> String {
    let mut out: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str("...");
    }
    out
}

/// What a step's PMI server knows of the step.
#[derive(Debug, Clone)]
pub struct StepInfo {
    /// The PMI job id and PMI-1 KVS name (the same on every node of the step).
    pub jobid: String,
    /// Ranks in all (`PMI_SIZE`).
    pub size: u32,
    /// `PMI_process_mapping` (see `lattice_apis::steps::process_mapping`).
    pub mapping: String,
    /// This node's ranks, one socket each.
    pub local_ranks: Vec<u32>,
    /// This node's name (for messages).
    pub node: String,
}

/// What the server tells the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PmiEvent {
    /// The step must end everywhere: why (which rank, on which node, what it said).
    Abort(String),
}

/// Where a node's contributions to a fence go.
#[async_trait]
pub trait Exchange: Send + Sync + std::fmt::Debug {
    /// This node's puts for fence `round`; answers with every node's.
    async fn fence(
        &self,
        round: u64,
        puts: BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, String>;
    /// Tell every other node of the step that it is over, and why.
    async fn abort(&self, message: &str);
}

/// A single-node step: this node's puts are all there are.
#[derive(Debug, Default)]
pub struct LocalExchange;

#[async_trait]
impl Exchange for LocalExchange {
    async fn fence(
        &self,
        _round: u64,
        puts: BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, String> {
        Ok(puts)
    }
    async fn abort(&self, _message: &str) {}
}

#[derive(Debug, Default)]
struct State {
    /// Everything visible (after the fences so far).
    kv: HashMap<String, String>,
    /// This node's puts since the last fence.
    pending: BTreeMap<String, String>,
    /// Local ranks in the current fence.
    arrived: usize,
    /// Fences started on this node.
    round: u64,
    /// `info-putnodeattr` values (this node's ranks only).
    node_attrs: HashMap<String, String>,
    initialized: BTreeSet<u32>,
    finalized: BTreeSet<u32>,
    /// Set once the step is being torn down.
    failed: Option<String>,
    /// Bytes of keys and values held (`kv`, `pending`, `node_attrs`).
    bytes: usize,
}

#[derive(Debug)]
struct Shared {
    info: StepInfo,
    state: Mutex<State>,
    /// Fences completed on this node.
    done: watch::Sender<u64>,
    node_attr_put: Notify,
    exchange: Arc<dyn Exchange>,
    events: mpsc::UnboundedSender<PmiEvent>,
    stop: CancellationToken,
}

/// One step's PMI server on this node (stops when dropped).
#[derive(Debug)]
pub struct PmiServer {
    shared: Arc<Shared>,
}

impl Drop for PmiServer {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

/// Move a descriptor above `floor` (close-on-exec), so that the runtime can place it at
/// a low, fixed number in the child without overwriting another one it passes.
fn above(fd: OwnedFd, floor: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the copy is owned below.
    let high = unsafe { nix::libc::fcntl(fd.as_raw_fd(), nix::libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

impl PmiServer {
    /// Start serving `info.local_ranks`; returns the server and each rank's end of its
    /// socket (in `local_ranks` order), for the runtime to pass to the tasks.
    pub fn start(
        info: StepInfo,
        exchange: Arc<dyn Exchange>,
        events: mpsc::UnboundedSender<PmiEvent>,
    ) -> std::io::Result<(PmiServer, Vec<OwnedFd>)> {
        let (done, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            info,
            state: Mutex::new(State::default()),
            done,
            node_attr_put: Notify::new(),
            exchange,
            events,
            stop: CancellationToken::new(),
        });
        let floor = 16 + shared.info.local_ranks.len() as i32;
        let mut ends = Vec::new();
        for rank in shared.info.local_ranks.clone() {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            ours.set_nonblocking(true)?;
            let ours = UnixStream::from_std(ours)?;
            ends.push(above(OwnedFd::from(theirs), floor)?);
            let s = shared.clone();
            tokio::spawn(async move {
                let stop = s.stop.clone();
                tokio::select! {
                    _ = serve(s, rank, ours) => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
        Ok((PmiServer { shared }, ends))
    }

    /// Another node of the step says it is over.
    pub fn remote_abort(&self, message: String) {
        self.shared.fail(message, false);
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The step is over: tell the supervisor (and, when it started here, every other
    /// node). Only the first reason counts.
    fn fail(self: &Arc<Self>, message: String, tell_others: bool) {
        let message = tidy(&message);
        {
            let mut st = self.lock();
            if st.failed.is_some() {
                return;
            }
            st.failed = Some(message.clone());
        }
        tracing::warn!(step = %self.info.jobid, %message, "MPI step aborted");
        let _ = self.events.send(PmiEvent::Abort(message.clone()));
        // Wake fence waiters: they answer with an error.
        self.done.send_modify(|_| {});
        if tell_others {
            let s = self.clone();
            tokio::spawn(async move { s.exchange.abort(&message).await });
        }
    }

    /// Rank `rank` enters the next fence; returns once every rank of the step has.
    async fn fence(self: &Arc<Self>, rank: u32) -> Result<(), String> {
        let mut done = self.done.subscribe();
        let (my_round, launch) = {
            let mut st = self.lock();
            if let Some(f) = &st.failed {
                return Err(f.clone());
            }
            st.arrived += 1;
            let r = st.round;
            if st.arrived >= self.info.local_ranks.len() {
                st.arrived = 0;
                st.round += 1;
                (r, Some(std::mem::take(&mut st.pending)))
            } else {
                (r, None)
            }
        };
        tracing::debug!(step = %self.info.jobid, rank, round = my_round, "fence");
        if let Some(puts) = launch {
            let s = self.clone();
            tokio::spawn(async move {
                let exchanged = tokio::select! {
                    r = s.exchange.fence(my_round, puts) => r,
                    // The step is over here: nothing waits for the answer.
                    _ = s.stop.cancelled() => return,
                };
                match exchanged {
                    Ok(all) => {
                        tracing::debug!(step = %s.info.jobid, round = my_round, keys = all.len(), "fence done");
                        if let Err(e) = s.store(all) {
                            s.fail(e, true);
                            return;
                        }
                        s.done.send_modify(|d| *d = (*d).max(my_round + 1));
                    }
                    Err(e) => s.fail(
                        format!(
                            "the PMI fence across the step's nodes failed on {}: {e}",
                            s.info.node
                        ),
                        true,
                    ),
                }
            });
        }
        loop {
            if *done.borrow_and_update() > my_round {
                return Ok(());
            }
            if let Some(f) = &self.lock().failed {
                return Err(f.clone());
            }
            if done.changed().await.is_err() {
                return Err("the PMI server stopped".into());
            }
        }
    }

    /// The most PMI data this step may hold here.
    fn budget(&self) -> usize {
        (self.info.size as usize)
            .saturating_mul(BUDGET_PER_RANK)
            .min(MAX_BUDGET)
    }

    fn over_budget(&self, bytes: usize) -> String {
        format!(
            "the step's PMI data on node {} reached {bytes} bytes, more than its budget of {} ({} KiB per rank, at most {} MiB)",
            self.info.node,
            self.budget(),
            BUDGET_PER_RANK >> 10,
            MAX_BUDGET >> 20
        )
    }

    /// A rank's put (or node attribute); `Err` says why it is refused.
    fn put(&self, key: &str, value: &str, node_attr: bool) -> Result<(), String> {
        if key.is_empty() || key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(format!(
                "put refused: keys are 1 to {MAX_KEY} bytes and values at most {MAX_VALUE}"
            ));
        }
        let mut st = self.lock();
        let add = key.len() + value.len();
        if st.bytes + add > self.budget() {
            return Err(self.over_budget(st.bytes + add));
        }
        st.bytes += add;
        let (k, v) = (key.to_string(), value.to_string());
        if node_attr {
            st.node_attrs.insert(k, v);
        } else {
            st.pending.insert(k, v);
        }
        Ok(())
    }

    /// Every node's puts of a fence, now visible.
    fn store(&self, all: BTreeMap<String, String>) -> Result<(), String> {
        let mut st = self.lock();
        let add: usize = all.iter().map(|(k, v)| k.len() + v.len()).sum();
        if st.bytes + add > self.budget() {
            return Err(self.over_budget(st.bytes + add));
        }
        st.bytes += add;
        st.kv.extend(all);
        Ok(())
    }

    fn get(&self, key: &str) -> Option<String> {
        if key == "PMI_process_mapping" {
            return Some(self.info.mapping.clone());
        }
        let st = self.lock();
        st.kv.get(key).or_else(|| st.pending.get(key)).cloned()
    }

    async fn node_attr(&self, key: &str, wait: bool) -> Option<String> {
        loop {
            let notified = self.node_attr_put.notified();
            if let Some(v) = self.lock().node_attrs.get(key) {
                return Some(v.clone());
            }
            if !wait || self.lock().failed.is_some() {
                return None;
            }
            notified.await;
        }
    }
}

/// What a rank's connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    V1,
    V2,
}

/// Serve rank `rank` until it closes its socket.
async fn serve(s: Arc<Shared>, rank: u32, stream: UnixStream) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut wire = Wire::V1;
    loop {
        let msg = match read_message(&mut rd, wire).await {
            Ok(Some(m)) => {
                tracing::trace!(rank, cmd = %m.cmd, "PMI request");
                m
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(step = %s.info.jobid, rank, error = %e, "unreadable PMI message; closing the rank's connection");
                break;
            }
        };
        let answer = match handle(&s, rank, &mut wire, &msg, &mut rd).await {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(step = %s.info.jobid, rank, cmd = %msg.cmd, error = %e, "PMI request failed");
                break;
            }
        };
        if wr.write_all(&answer).await.is_err() {
            break;
        }
    }
    let (init, fin) = {
        let st = s.lock();
        (st.initialized.contains(&rank), st.finalized.contains(&rank))
    };
    if init && !fin {
        s.fail(
            format!(
                "rank {rank} on node {} ended without PMI finalize (it exited or crashed inside MPI)",
                s.info.node
            ),
            true,
        );
    }
}

/// The next message: a line (PMI-1) or a length-prefixed message (PMI-2); `None` at the
/// end of the stream.
async fn read_message<R: tokio::io::AsyncBufRead + Unpin>(
    rd: &mut R,
    wire: Wire,
) -> Result<Option<Message>, String> {
    match wire {
        Wire::V1 => {
            let Some(line) = read_line(rd).await? else {
                return Ok(None);
            };
            wire::decode_v1(&line).map(Some)
        }
        Wire::V2 => {
            let mut len = [0u8; 6];
            match rd.read_exact(&mut len).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e.to_string()),
            }
            let n: usize = std::str::from_utf8(&len)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .filter(|n| *n <= wire::MAX_MESSAGE)
                .ok_or_else(|| {
                    format!(
                        "bad PMI-2 length prefix {:?}",
                        String::from_utf8_lossy(&len)
                    )
                })?;
            let mut body = vec![0u8; n];
            rd.read_exact(&mut body).await.map_err(|e| e.to_string())?;
            let body =
                String::from_utf8(body).map_err(|_| "PMI-2 message is not UTF-8".to_string())?;
            wire::decode_v2(&body).map(Some)
        }
    }
}

async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    rd: &mut R,
) -> Result<Option<String>, String> {
    let mut buf = Vec::new();
    let mut limited = (&mut *rd).take(wire::MAX_LINE as u64 + 1);
    let n = limited
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| e.to_string())?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > wire::MAX_LINE {
        return Err(format!("PMI-1 line longer than {} bytes", wire::MAX_LINE));
    }
    let line = String::from_utf8(buf).map_err(|_| "PMI-1 line is not UTF-8".to_string())?;
    Ok(Some(line.trim_end_matches(['\n', '\r']).to_string()))
}

/// Answer one request (`None`: no answer is due).
async fn handle<R: tokio::io::AsyncBufRead + Unpin>(
    s: &Arc<Shared>,
    rank: u32,
    wire: &mut Wire,
    m: &Message,
    rd: &mut R,
) -> Result<Option<Vec<u8>>, String> {
    let size = s.info.size.to_string();
    let v1 = wire::encode_v1;
    let v2 = wire::encode_v2;
    if *wire == Wire::V1 {
        let a = match m.cmd.as_str() {
            "init" => {
                s.lock().initialized.insert(rank);
                if m.get("pmi_version") == Some("2") {
                    *wire = Wire::V2;
                    v1(
                        "response_to_init",
                        &[("pmi_version", "2"), ("pmi_subversion", "0"), ("rc", "0")],
                    )
                } else {
                    v1(
                        "response_to_init",
                        &[("pmi_version", "1"), ("pmi_subversion", "1"), ("rc", "0")],
                    )
                }
            }
            "get_maxes" => v1(
                "maxes",
                &[
                    ("rc", "0"),
                    ("kvsname_max", &wire::KVSNAME_MAX.to_string()),
                    ("keylen_max", &wire::KEYLEN_MAX.to_string()),
                    ("vallen_max", &wire::VALLEN_MAX.to_string()),
                ],
            ),
            "get_appnum" => v1("appnum", &[("rc", "0"), ("appnum", "0")]),
            "get_universe_size" => v1("universe_size", &[("rc", "0"), ("size", &size)]),
            "get_my_kvsname" => v1("my_kvsname", &[("rc", "0"), ("kvsname", &s.info.jobid)]),
            "put" => {
                let (Some(k), Some(v)) = (m.get("key"), m.get("value")) else {
                    return Ok(Some(v1(
                        "put_result",
                        &[("rc", "-1"), ("msg", "put_needs_key_and_value")],
                    )));
                };
                if let Err(e) = s.put(k, v, false) {
                    s.fail(format!("rank {rank} on node {}: {e}", s.info.node), true);
                    return Ok(Some(v1("put_result", &[("rc", "-1"), ("msg", "refused")])));
                }
                v1("put_result", &[("rc", "0")])
            }
            "get" => {
                let k = m.get("key").unwrap_or_default();
                match s.get(k) {
                    Some(v) => v1("get_result", &[("rc", "0"), ("value", &v)]),
                    None => v1("get_result", &[("rc", "1"), ("msg", "key_not_found")]),
                }
            }
            "barrier_in" => match s.fence(rank).await {
                Ok(()) => v1("barrier_out", &[("rc", "0")]),
                Err(_) => return Err("the step was aborted during a fence".into()),
            },
            "finalize" => {
                s.lock().finalized.insert(rank);
                v1("finalize_ack", &[("rc", "0")])
            }
            "abort" => {
                s.lock().finalized.insert(rank);
                let code = m.get("exitcode").unwrap_or("1");
                s.fail(
                    format!(
                        "rank {rank} on node {} called MPI_Abort (exit code {code})",
                        s.info.node
                    ),
                    true,
                );
                return Ok(None);
            }
            "spawn" => {
                // A multi-line `mcmd=spawn` request runs to an `endcmd` line.
                while let Some(line) = read_line(rd).await? {
                    if line.trim() == "endcmd" {
                        break;
                    }
                }
                v1(
                    "spawn_result",
                    &[
                        ("rc", "-1"),
                        (
                            "errmsg",
                            "MPI_Comm_spawn_is_not_supported_by_Lattice's_PMI_server",
                        ),
                    ],
                )
            }
            "publish_name" | "unpublish_name" | "lookup_name" => v1(
                &format!("{}_result", m.cmd),
                &[("rc", "-1"), ("msg", "name_service_not_supported")],
            ),
            other => {
                tracing::warn!(step = %s.info.jobid, rank, cmd = other, "unknown PMI-1 command");
                v1(
                    &format!("{other}_result"),
                    &[("rc", "-1"), ("msg", "unknown_command")],
                )
            }
        };
        return Ok(Some(a));
    }
    let a = match m.cmd.as_str() {
        "fullinit" => {
            if let Some(r) = m.get("pmirank").and_then(|r| r.parse::<u32>().ok()) {
                if r != rank {
                    return Ok(Some(v2(
                        "fullinit-response",
                        &[
                            ("rc", "-1"),
                            (
                                "errmsg",
                                &format!("this socket is rank {rank}'s, not rank {r}'s"),
                            ),
                        ],
                    )));
                }
            }
            s.lock().initialized.insert(rank);
            v2(
                "fullinit-response",
                &[
                    ("rc", "0"),
                    ("pmi-version", "2"),
                    ("pmi-subversion", "0"),
                    ("rank", &rank.to_string()),
                    ("size", &size),
                    ("appnum", "0"),
                    // No `spawner-jobid`: its mere presence marks the rank as spawned.
                    ("debugged", "FALSE"),
                    ("pmiverbose", "FALSE"),
                ],
            )
        }
        "job-getid" => v2(
            "job-getid-response",
            &[("rc", "0"), ("jobid", &s.info.jobid)],
        ),
        "info-getjobattr" => {
            let key = m.get("key").unwrap_or_default();
            let v = match key {
                "PMI_process_mapping" => Some(s.info.mapping.clone()),
                "universeSize" => Some(size.clone()),
                _ => None,
            };
            match v {
                Some(v) => v2(
                    "info-getjobattr-response",
                    &[("rc", "0"), ("found", "TRUE"), ("value", &v)],
                ),
                None => v2(
                    "info-getjobattr-response",
                    &[("rc", "0"), ("found", "FALSE")],
                ),
            }
        }
        "info-putnodeattr" => {
            let (Some(k), Some(v)) = (m.get("key"), m.get("value")) else {
                return Ok(Some(v2(
                    "info-putnodeattr-response",
                    &[("rc", "-1"), ("errmsg", "key and value are required")],
                )));
            };
            if let Err(e) = s.put(k, v, true) {
                s.fail(format!("rank {rank} on node {}: {e}", s.info.node), true);
                return Ok(Some(v2(
                    "info-putnodeattr-response",
                    &[("rc", "-1"), ("errmsg", "refused")],
                )));
            }
            s.node_attr_put.notify_waiters();
            v2("info-putnodeattr-response", &[("rc", "0")])
        }
        "info-getnodeattr" => {
            let key = m.get("key").unwrap_or_default();
            let wait = m
                .get("wait")
                .is_some_and(|w| w.eq_ignore_ascii_case("TRUE"));
            match s.node_attr(key, wait).await {
                Some(v) => v2(
                    "info-getnodeattr-response",
                    &[("rc", "0"), ("found", "TRUE"), ("value", &v)],
                ),
                None => v2(
                    "info-getnodeattr-response",
                    &[("rc", "0"), ("found", "FALSE")],
                ),
            }
        }
        "kvs-put" => {
            let (Some(k), Some(v)) = (m.get("key"), m.get("value")) else {
                return Ok(Some(v2(
                    "kvs-put-response",
                    &[("rc", "-1"), ("errmsg", "key and value are required")],
                )));
            };
            if let Err(e) = s.put(k, v, false) {
                s.fail(format!("rank {rank} on node {}: {e}", s.info.node), true);
                return Ok(Some(v2(
                    "kvs-put-response",
                    &[("rc", "-1"), ("errmsg", "refused")],
                )));
            }
            v2("kvs-put-response", &[("rc", "0")])
        }
        "kvs-fence" => match s.fence(rank).await {
            Ok(()) => v2("kvs-fence-response", &[("rc", "0")]),
            Err(e) => v2(
                "kvs-fence-response",
                &[("rc", "-1"), ("errmsg", &e.replace(';', ","))],
            ),
        },
        "kvs-get" => {
            let key = m.get("key").unwrap_or_default();
            match s.get(key) {
                Some(v) => v2(
                    "kvs-get-response",
                    &[("rc", "0"), ("found", "TRUE"), ("value", &v)],
                ),
                None => v2("kvs-get-response", &[("rc", "0"), ("found", "FALSE")]),
            }
        }
        "finalize" => {
            s.lock().finalized.insert(rank);
            v2("finalize-response", &[("rc", "0")])
        }
        "abort" => {
            s.lock().finalized.insert(rank);
            let why = m
                .get("msg")
                .filter(|t| !t.is_empty())
                .unwrap_or("no message");
            s.fail(
                format!(
                    "rank {rank} on node {} called PMI2_Abort: {why}",
                    s.info.node
                ),
                true,
            );
            return Ok(None);
        }
        "spawn" => v2(
            "spawn-response",
            &[
                ("rc", "-1"),
                (
                    "errmsg",
                    "MPI_Comm_spawn is not supported by Lattice's PMI server",
                ),
            ],
        ),
        "name-publish" | "name-unpublish" | "name-lookup" | "job-connect" | "job-disconnect" => v2(
            &format!("{}-response", m.cmd),
            &[
                ("rc", "-1"),
                (
                    "errmsg",
                    &format!("{} is not supported by Lattice's PMI server", m.cmd),
                ),
            ],
        ),
        other => {
            tracing::warn!(step = %s.info.jobid, rank, cmd = other, "unknown PMI-2 command");
            v2(
                &format!("{other}-response"),
                &[("rc", "-1"), ("errmsg", "unknown command")],
            )
        }
    };
    Ok(Some(a))
}

#[cfg(test)]
mod tests;
