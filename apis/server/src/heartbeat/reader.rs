//! The heartbeat reader: one thread that owns every upgraded plain-TCP heartbeat
//! connection and reads them in batches.
//!
//! Waiting for each connection to become readable would wake the server once per
//! heartbeat (10,000 agents every 10 s: 1,000 wake-ups a second, each a context switch
//! and a task wake-up costing far more than the heartbeat itself). Instead the thread
//! sleeps for [`TICK`], then asks epoll (edge-triggered) which connections received data
//! and reads them all: one wake-up serves about `TICK × heartbeats/s` heartbeats. A heartbeat
//! waits at most one tick, which is nothing next to a TTL of seconds.
//!
//! Renewals leave the thread in batches, one message per tick, to one tokio task that
//! renews each store lease ([`Renewal`]) and sends back the sessions that must end.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_store::KvBackend;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tokio::sync::mpsc;

use super::{credential_check, end_session, farewell, Renewal, Stream};
use crate::auth::CertRef;
use crate::metrics::Metrics;
use crate::node_identity::Revocations;

/// How long the reader sleeps between batches.
pub const TICK: Duration = Duration::from_millis(500);
/// How often idle sessions are looked for.
const SWEEP: Duration = Duration::from_secs(1);
/// Most bytes one connection may deliver in one tick. An agent sends one short line per
/// interval; a connection that floods would otherwise keep the one reader thread from
/// every other node's heartbeats (and from the renewals and the idle sweep), so it ends.
const MAX_BYTES_PER_TICK: usize = 64 * 1024;

fn flooding() -> End {
    (
        "BadRequest",
        format!(
            "a heartbeat stream carries one short line per interval; this one sent more than \
             {} KiB within {} ms",
            MAX_BYTES_PER_TICK / 1024,
            TICK.as_millis()
        ),
    )
}

enum Cmd {
    Add(TcpStream, Option<Box<rustls::ServerConnection>>, Stream),
    End(u64, &'static str, String),
}

enum RenewMsg {
    Add(u64, Renewal, Option<CertRef>),
    Renew(Vec<u64>),
    Forget(u64),
}

/// Handle to the reader thread (created with the first heartbeat stream).
pub struct Reader {
    cmds: std_mpsc::Sender<Cmd>,
}

impl Reader {
    /// Start the thread and the renewal task (needs a tokio runtime).
    pub(crate) fn start(
        backend: Arc<dyn KvBackend>,
        metrics: Arc<Metrics>,
        revocations: Revocations,
        shutting_down: tokio::sync::watch::Receiver<bool>,
        ttl: Duration,
    ) -> std::io::Result<Reader> {
        let (cmds, rx) = std_mpsc::channel();
        let (renew_tx, renew_rx) = mpsc::unbounded_channel();
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let mut thread = Thread {
            epoll,
            conns: HashMap::new(),
            next_id: 1,
            metrics: metrics.clone(),
            renew_tx,
            ttl,
        };
        std::thread::Builder::new()
            .name("heartbeat-reader".into())
            .spawn(move || thread.run(rx, shutting_down))?;
        tokio::spawn(renewer(
            backend,
            metrics,
            revocations,
            renew_rx,
            cmds.clone(),
        ));
        Ok(Reader { cmds })
    }

    /// Hand over an upgraded plain-TCP connection.
    pub(crate) fn add(&self, tcp: TcpStream, stream: Stream) {
        self.send(tcp, None, stream);
    }

    /// Hand over an upgraded TLS connection: its socket and its TLS state.
    pub(crate) fn add_tls(&self, tcp: TcpStream, tls: rustls::ServerConnection, stream: Stream) {
        self.send(tcp, Some(Box::new(tls)), stream);
    }

    fn send(&self, tcp: TcpStream, tls: Option<Box<rustls::ServerConnection>>, stream: Stream) {
        if let Err(std_mpsc::SendError(Cmd::Add(tcp, tls, _))) =
            self.cmds.send(Cmd::Add(tcp, tls, stream))
        {
            let mut conn = Conn {
                tcp,
                tls,
                stream: Stream::new(String::new(), 0, 0, Arc::default()),
            };
            conn.farewell("ShuttingDown", "the API server is shutting down; reconnect");
        }
    }
}

/// Why a session ends: the reason and message of its farewell.
type End = (&'static str, String);

struct Conn {
    tcp: TcpStream,
    /// The TLS state of an HTTPS connection (`None`: plain TCP).
    tls: Option<Box<rustls::ServerConnection>>,
    stream: Stream,
}

impl Conn {
    /// Best effort: the last line into an idle socket's send buffer (TLS: then its
    /// `close_notify`).
    fn farewell(&mut self, reason: &str, message: &str) {
        let line = farewell(reason, message);
        match self.tls.as_mut() {
            None => {
                let _ = self.tcp.write_all(&line);
            }
            Some(tls) => {
                let _ = tls.writer().write_all(&line);
                tls.send_close_notify();
                while tls.wants_write() {
                    if tls.write_tls(&mut self.tcp).is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Read everything the socket has into `out` (plaintext, for TLS); `Err` ends the
    /// session with a reason and message.
    fn drain(
        tcp: &mut TcpStream,
        tls: Option<&mut rustls::ServerConnection>,
        buf: &mut [u8],
        out: &mut dyn FnMut(&[u8]) -> Result<(), End>,
    ) -> Result<(), End> {
        let mut budget = MAX_BYTES_PER_TICK;
        let mut spend = |n: usize| -> Result<(), End> {
            budget = budget.checked_sub(n).ok_or_else(flooding)?;
            Ok(())
        };
        let Some(tls) = tls else {
            loop {
                match tcp.read(buf) {
                    Ok(0) => return Err(("Closed", String::new())),
                    Ok(n) => {
                        spend(n)?;
                        out(&buf[..n])?;
                        // A short read drained the socket; more data is a new edge.
                        if n < buf.len() {
                            return Ok(());
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(("Closed", e.to_string())),
                }
            }
        };
        let result = 'socket: loop {
            // Plaintext rustls holds already (some may have come with the hand-over).
            loop {
                match tls.reader().read(buf) {
                    // The peer's close_notify.
                    Ok(0) => break 'socket Err(("Closed", String::new())),
                    Ok(n) => {
                        if let Err(end) = out(&buf[..n]) {
                            break 'socket Err(end);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => break 'socket Err(("Closed", e.to_string())),
                }
            }
            match tls.read_tls(tcp) {
                Ok(0) => break Err(("Closed", String::new())),
                Ok(n) => {
                    if let Err(end) = spend(n) {
                        break Err(end);
                    }
                    if let Err(e) = tls.process_new_packets() {
                        break Err(("BadRequest", format!("TLS: {e}")));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => break Err(("Closed", e.to_string())),
            }
        };
        // TLS may owe the peer records of its own (a key update's answer).
        while tls.wants_write() {
            if tls.write_tls(tcp).is_err() {
                break;
            }
        }
        result
    }
}

struct Thread {
    epoll: Epoll,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    metrics: Arc<Metrics>,
    renew_tx: mpsc::UnboundedSender<RenewMsg>,
    ttl: Duration,
}

impl Thread {
    fn run(
        &mut self,
        cmds: std_mpsc::Receiver<Cmd>,
        shutting_down: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut events = vec![EpollEvent::empty(); 1024];
        let mut buf = vec![0u8; 16 * 1024];
        let mut last_sweep = Instant::now();
        loop {
            std::thread::sleep(TICK);
            // The server is gone (its shutdown signal dropped) or shutting down.
            let stopping = shutting_down.has_changed().is_err() || *shutting_down.borrow();
            loop {
                match cmds.try_recv() {
                    Ok(Cmd::Add(tcp, tls, stream)) => self.add(tcp, tls, stream),
                    Ok(Cmd::End(id, reason, message)) => self.end(id, reason, &message),
                    Err(std_mpsc::TryRecvError::Empty) => break,
                    Err(std_mpsc::TryRecvError::Disconnected) => {
                        self.end_all("ShuttingDown", "the API server is shutting down; reconnect");
                        return;
                    }
                }
            }
            if stopping {
                self.end_all("ShuttingDown", "the API server is shutting down; reconnect");
                if shutting_down.has_changed().is_err() {
                    return;
                }
                continue;
            }
            let mut renew = Vec::new();
            loop {
                let n = match self.epoll.wait(&mut events, EpollTimeout::ZERO) {
                    Ok(n) => n,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "heartbeat reader: epoll_wait failed");
                        break;
                    }
                };
                for ev in &events[..n] {
                    self.read(ev.data(), &mut buf, &mut renew);
                }
                if n < events.len() {
                    break;
                }
            }
            if !renew.is_empty() {
                let _ = self.renew_tx.send(RenewMsg::Renew(renew));
            }
            if last_sweep.elapsed() >= SWEEP {
                last_sweep = Instant::now();
                let now = Instant::now();
                let idle: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| now.duration_since(c.stream.beats.last_ok) >= self.ttl)
                    .map(|(id, _)| *id)
                    .collect();
                let msg = format!("no heartbeat for {}s; reconnect", self.ttl.as_secs());
                for id in idle {
                    self.end(id, "Idle", &msg);
                }
            }
        }
    }

    fn add(&mut self, tcp: TcpStream, tls: Option<Box<rustls::ServerConnection>>, stream: Stream) {
        let id = self.next_id;
        self.next_id += 1;
        let registered = tcp.set_nonblocking(true).and_then(|()| {
            self.epoll
                .add(
                    tcp.as_fd(),
                    // Edge-triggered: a connection is reported once per arrival, not
                    // polled again after it was drained (`read` drains it).
                    EpollEvent::new(
                        EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET,
                        id,
                    ),
                )
                .map_err(std::io::Error::from)
        });
        if let Err(e) = registered {
            tracing::warn!(node = %stream.node, error = %e, "cannot watch a heartbeat connection");
            return;
        }
        self.metrics.heartbeat_streams.inc();
        let renewal = Renewal::new(&stream.node, stream.lease, self.ttl);
        let _ = self
            .renew_tx
            .send(RenewMsg::Add(id, renewal, stream.credential.clone()));
        self.conns.insert(id, Conn { tcp, tls, stream });
        // Bytes that came with the hand-over (TLS: records already decrypted, or read
        // into its buffer) raise no edge of their own.
        let mut renew = Vec::new();
        self.read(id, &mut [0u8; 4096], &mut renew);
        if !renew.is_empty() {
            let _ = self.renew_tx.send(RenewMsg::Renew(renew));
        }
    }

    /// Read everything a connection has; queue its renewal.
    fn read(&mut self, id: u64, buf: &mut [u8], renew: &mut Vec<u64>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let stream = &mut conn.stream;
        let end = Conn::drain(&mut conn.tcp, conn.tls.as_deref_mut(), buf, &mut |bytes| {
            stream
                .lines
                .feed(bytes, &mut stream.beats)
                .map_err(|e| ("BadRequest", e.to_string()))
        })
        .err();
        conn.stream.beats.flush(&self.metrics);
        if conn.stream.beats.take_renewal() {
            renew.push(id);
        }
        if let Some((reason, message)) = end {
            self.end(id, reason, &message);
        }
    }

    fn end(&mut self, id: u64, reason: &'static str, message: &str) {
        let Some(mut conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = self.epoll.delete(conn.tcp.as_fd());
        end_session(&self.metrics, &conn.stream, reason, message);
        if reason != "Closed" {
            conn.farewell(reason, message);
        }
        let _ = self.renew_tx.send(RenewMsg::Forget(id));
    }

    fn end_all(&mut self, reason: &'static str, message: &str) {
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.end(id, reason, message);
        }
    }
}

/// Renew the store leases the reader asks for, a batch per tick in one store call; end
/// the sessions that must end.
async fn renewer(
    backend: Arc<dyn KvBackend>,
    metrics: Arc<Metrics>,
    revocations: Revocations,
    mut rx: mpsc::UnboundedReceiver<RenewMsg>,
    cmds: std_mpsc::Sender<Cmd>,
) {
    let mut renewals: HashMap<u64, Renewal> = HashMap::new();
    // The client certificates TLS sessions were opened with: a session ends when its
    // certificate expires or is revoked.
    let mut credentials: HashMap<u64, CertRef> = HashMap::new();
    let mut leases = Vec::new();
    while let Some(msg) = rx.recv().await {
        match msg {
            RenewMsg::Add(id, renewal, credential) => {
                renewals.insert(id, renewal);
                if let Some(c) = credential {
                    credentials.insert(id, c);
                }
            }
            RenewMsg::Forget(id) => {
                renewals.remove(&id);
                credentials.remove(&id);
            }
            RenewMsg::Renew(mut ids) => {
                ids.retain(|id| renewals.contains_key(id));
                // Certificates first, all of the batch at once (a store read each while
                // the revocation set is not in sync): a session whose certificate no
                // longer holds gets no renewal.
                let verdicts = futures::future::join_all(ids.iter().map(|id| async {
                    match credentials.get(id) {
                        Some(c) => credential_check(c, &revocations, &backend).await,
                        None => Ok(()),
                    }
                }))
                .await;
                let mut renew = Vec::with_capacity(ids.len());
                for (id, verdict) in ids.into_iter().zip(verdicts) {
                    match verdict {
                        Ok(()) => renew.push(id),
                        Err((reason, message)) => {
                            renewals.remove(&id);
                            credentials.remove(&id);
                            if cmds.send(Cmd::End(id, reason, message)).is_err() {
                                return;
                            }
                        }
                    }
                }
                leases.clear();
                leases.extend(
                    renew
                        .iter()
                        .filter_map(|id| renewals.get(id).map(Renewal::lease)),
                );
                let outcomes: Vec<Result<Option<i64>, String>> =
                    match backend.lease_keep_alive_many(&leases).await {
                        Ok(ttls) => ttls.into_iter().map(Ok).collect(),
                        Err(e) => renew.iter().map(|_| Err(e.to_string())).collect(),
                    };
                for (id, outcome) in renew.into_iter().zip(outcomes) {
                    let Some(r) = renewals.get_mut(&id) else {
                        continue;
                    };
                    let verdict = match r.renewed(outcome, &metrics) {
                        Ok(()) => r.check(backend.as_ref()).await,
                        Err(end) => Err(end),
                    };
                    if let Err((reason, message)) = verdict {
                        renewals.remove(&id);
                        credentials.remove(&id);
                        if cmds.send(Cmd::End(id, reason, message)).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}
