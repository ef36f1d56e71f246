//! Workload logs: capture, live tail, persistence and the HTTP endpoint.
//!
//! ```text
//! workload ──pipes──▶ shim ──frames──▶ <run-dir>/{stdout,stderr}.spool   (spool)
//!                                          │  agent tails from the committed offset
//!                                          ▼
//!                                       LogHub ──▶ RingBuffer (live tail, bounded)
//!                                          └────▶ ChunkWriter ──▶ LogStore (gzip chunks + index.json)
//! GET /logs/{ns}/{name} ◀── store (older lines) + ring (recent) + follow (new)   (http)
//! ```
//!
//! Logs outlive the process: once it is gone the hub is dropped and requests are
//! served from the store alone.

pub mod http;
pub mod hub;
pub mod ring;
pub mod spool;
pub mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

pub use hub::LogHub;
pub use store::{LineFilter, LocalLogStore, LogIndex, LogKey, LogStore};

/// Standard output or standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// Both.
    pub const ALL: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// `stdout` / `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One line of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Order across both streams of the attempt.
    pub seq: u64,
    /// Where it was written.
    pub stream: Stream,
    /// When its first byte was read.
    pub time: DateTime<Utc>,
    /// It ended with a newline (not part of `data`); partial lines did not.
    pub newline: bool,
    /// The bytes, as written.
    pub data: Vec<u8>,
}

impl LogLine {
    /// Bytes it costs in the ring.
    pub fn cost(&self) -> usize {
        self.data.len() + 64
    }

    /// Append the line as served: optional RFC 3339 timestamp, the data, a newline.
    pub fn write_to(&self, timestamps: bool, out: &mut Vec<u8>) {
        if timestamps {
            out.extend_from_slice(
                self.time
                    .to_rfc3339_opts(SecondsFormat::Nanos, true)
                    .as_bytes(),
            );
            out.push(b' ');
        }
        out.extend_from_slice(&self.data);
        if self.newline || timestamps {
            out.push(b'\n');
        }
    }
}

/// A log request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Streams wanted.
    pub streams: Vec<Stream>,
    /// Only the last N lines (of the history; followed lines all come).
    pub tail_lines: Option<usize>,
    /// Lines at or after.
    pub since: Option<DateTime<Utc>>,
    /// Lines at or before.
    pub until: Option<DateTime<Utc>>,
    /// Keep streaming until the process is gone and its output stored.
    pub follow: bool,
    /// Prefix lines with their time.
    pub timestamps: bool,
    /// Which attempt (default: the latest on this node).
    pub attempt: Option<u32>,
    /// The allocation's uid (the API server always sends it): logs of another allocation
    /// that had the same name are not these.
    pub uid: Option<String>,
}

impl LogQuery {
    fn filter(&self) -> LineFilter {
        LineFilter {
            streams: self.streams.clone(),
            since: self.since,
            until: self.until,
            before_seq: None,
            from_seq: None,
        }
    }
}

/// Why a log request failed.
#[derive(Debug)]
pub enum LogError {
    /// Nothing is known about these logs.
    NotFound(String),
    /// Reading the store failed.
    Io(std::io::Error),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::NotFound(m) => f.write_str(m),
            LogError::Io(e) => write!(f, "reading the logs: {e}"),
        }
    }
}

impl std::error::Error for LogError {}

impl From<std::io::Error> for LogError {
    fn from(e: std::io::Error) -> Self {
        LogError::Io(e)
    }
}

/// The history a request asked for and, with `follow`, what comes next.
#[derive(Debug)]
pub struct LogRead {
    /// Lines up to now.
    pub history: Vec<LogLine>,
    /// New lines, while the process runs.
    pub follower: Option<Follower>,
}

/// Streams the lines that follow a [`LogRead`]'s history.
#[derive(Debug)]
pub struct Follower {
    hub: Arc<LogHub>,
    rx: tokio::sync::watch::Receiver<hub::Progress>,
    cursor: u64,
    filter: LineFilter,
}

impl Follower {
    /// The next lines; `None` once the process is gone and everything was returned.
    pub async fn next_batch(&mut self) -> Option<Vec<LogLine>> {
        loop {
            self.rx.borrow_and_update();
            let snap = self.hub.snapshot(&self.filter, self.cursor);
            let mut out = Vec::new();
            if self.cursor < snap.ring_first_seq {
                // Fell behind the ring: the missing lines are in the store.
                let f = LineFilter {
                    from_seq: Some(self.cursor),
                    before_seq: Some(snap.ring_first_seq),
                    ..self.filter.clone()
                };
                let store = self.hub.store().clone();
                let key = self.hub.key().clone();
                let index = self.hub.index();
                let stored = tokio::task::spawn_blocking(move || {
                    store::read_stored(store.as_ref(), &key, &index, &f, None)
                })
                .await;
                match stored {
                    Ok(Ok(lines)) => out.extend(lines),
                    Ok(Err(e)) => tracing::warn!(error = %e, "follow: cannot read stored logs"),
                    Err(e) => tracing::warn!(error = %e, "follow: reader task failed"),
                }
            }
            out.extend(snap.lines.iter().map(|l| LogLine::clone(l)));
            self.cursor = snap.progress.next_seq;
            if !out.is_empty() {
                return Some(out);
            }
            if snap.progress.finished {
                return None;
            }
            if self.rx.changed().await.is_err() {
                return None;
            }
        }
    }
}

/// Every allocation's logs on this node: the live hubs and the store.
#[derive(Debug)]
pub struct Logs {
    store: Arc<dyn LogStore>,
    root: PathBuf,
    ring_bytes: usize,
    node: String,
    hubs: Mutex<HashMap<LogKey, Arc<LogHub>>>,
}

impl Logs {
    /// Logs under `root` (`<state-dir>/logs`) with rings of `ring_bytes`.
    pub fn new(root: PathBuf, ring_bytes: usize, node: &str) -> Self {
        Self {
            store: Arc::new(LocalLogStore::new(root.clone())),
            root,
            ring_bytes,
            node: node.to_string(),
            hubs: Mutex::new(HashMap::new()),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LogStore> {
        &self.store
    }

    /// `<root>/<namespace>/<name>/<attempt>`.
    pub fn dir(&self, key: &LogKey) -> PathBuf {
        LocalLogStore::new(self.root.clone()).dir(key)
    }

    /// The hub of a run of allocation `uid`, resuming from its stored index when there is
    /// one; the stored logs of another allocation that had the same name are removed.
    pub fn open_hub(&self, key: &LogKey, uid: &str) -> std::io::Result<Arc<LogHub>> {
        // One hold of the lock from the index to the hub: a reader that sees the new
        // attempt's stored index finds its hub too (else it served that index's empty
        // history as a finished run, and `logs --follow` right after a start ended at once).
        let mut hubs = self.lock();
        if let Some(h) = hubs.get(key) {
            return Ok(h.clone());
        }
        let mut index = match self.store.get_index(key)? {
            Some(i) if i.uid.as_deref() == Some(uid) => i,
            Some(_) => {
                // A deleted allocation's: its logs go with it, not into the new one's.
                self.store.remove(key)?;
                LogIndex::default()
            }
            None => LogIndex::default(),
        };
        index.uid = Some(uid.to_string());
        index.complete = false;
        index.node = self.node.clone();
        self.store.put_index(key, &index)?;
        let hub = Arc::new(LogHub::new(
            key.clone(),
            self.store.clone(),
            index,
            self.ring_bytes,
        ));
        hubs.insert(key.clone(), hub.clone());
        Ok(hub)
    }

    /// Forget a finished run's hub (its logs stay in the store).
    pub fn close_hub(&self, key: &LogKey) {
        self.lock().remove(key);
    }

    /// Every live hub.
    pub fn hubs(&self) -> Vec<Arc<LogHub>> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LogKey, Arc<LogHub>>> {
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answer a request (blocking file reads: call from a blocking task).
    pub fn read(&self, namespace: &str, name: &str, q: &LogQuery) -> Result<LogRead, LogError> {
        let key_of = |attempt: u32| LogKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
            attempt,
        };
        // Whether a run's logs are the asked allocation's (by uid, when asked by uid).
        let ours = |k: &LogKey| -> std::io::Result<bool> {
            let Some(uid) = &q.uid else {
                return Ok(true);
            };
            let live = self.lock().get(k).map(|h| h.index().uid);
            let uid_of = match live {
                Some(u) => u,
                None => self.store.get_index(k)?.and_then(|i| i.uid),
            };
            Ok(uid_of.as_deref() == Some(uid.as_str()))
        };
        let attempt = match q.attempt {
            Some(a) => a,
            None => {
                // Collected first: `ours` takes the lock itself.
                let running: Vec<u32> = self
                    .lock()
                    .keys()
                    .filter(|k| k.namespace == namespace && k.name == name)
                    .map(|k| k.attempt)
                    .collect();
                let live = running
                    .into_iter()
                    .filter(|a| ours(&key_of(*a)).unwrap_or(false))
                    .max();
                let mut stored = None;
                for a in self.store.attempts(namespace, name)? {
                    if ours(&key_of(a))? {
                        stored = stored.max(Some(a));
                    }
                }
                live.max(stored).ok_or_else(|| {
                    LogError::NotFound(format!(
                        "no logs for allocation {namespace}/{name} on node {}",
                        self.node
                    ))
                })?
            }
        };
        let key = key_of(attempt);
        if !ours(&key)? {
            return Err(LogError::NotFound(format!(
                "no logs for attempt {attempt} of this allocation {namespace}/{name} on node {} \
                 (those there are of an earlier allocation of that name)",
                self.node
            )));
        }
        let filter = q.filter();
        let hub = self.lock().get(&key).cloned();
        match hub {
            Some(hub) => {
                let rx = hub.subscribe();
                let snap = hub.snapshot(&filter, 0);
                let ring_covers = q.tail_lines.is_some_and(|n| snap.lines.len() >= n)
                    || q.since
                        .is_some_and(|t| snap.ring_first_time.is_some_and(|f| f <= t))
                    || snap.ring_first_seq == 0;
                let mut history = if ring_covers {
                    Vec::new()
                } else {
                    let f = LineFilter {
                        before_seq: Some(snap.ring_first_seq),
                        ..filter.clone()
                    };
                    store::read_stored(self.store.as_ref(), &key, &hub.index(), &f, q.tail_lines)?
                };
                history.extend(snap.lines.iter().map(|l| LogLine::clone(l)));
                tail(&mut history, q.tail_lines);
                let follower = (q.follow && !snap.progress.finished).then(|| Follower {
                    hub: hub.clone(),
                    rx,
                    cursor: snap.progress.next_seq,
                    filter,
                });
                Ok(LogRead { history, follower })
            }
            None => {
                let index = self.store.get_index(&key)?.ok_or_else(|| {
                    LogError::NotFound(format!(
                        "no logs for attempt {attempt} of allocation {namespace}/{name} on node {}",
                        self.node
                    ))
                })?;
                let mut history =
                    store::read_stored(self.store.as_ref(), &key, &index, &filter, q.tail_lines)?;
                tail(&mut history, q.tail_lines);
                Ok(LogRead {
                    history,
                    follower: None,
                })
            }
        }
    }
}

fn tail(lines: &mut Vec<LogLine>, n: Option<usize>) {
    if let Some(n) = n {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
}

#[cfg(test)]
mod tests {
    use super::spool::Frame;
    use super::*;

    fn push(hub: &LogHub, s: Stream, text: &str) {
        hub.push(vec![(
            s,
            Frame {
                time: Utc::now(),
                newline: true,
                data: text.as_bytes().to_vec(),
            },
            0,
        )]);
    }

    #[tokio::test]
    async fn history_tail_streams_and_follow() {
        let dir = tempfile::tempdir().unwrap();
        let logs = Logs::new(dir.path().to_path_buf(), 1 << 20, "n1");
        let key = LogKey {
            namespace: "t".into(),
            name: "a".into(),
            attempt: 1,
        };
        let hub = logs.open_hub(&key, "uid-1").unwrap();
        push(&hub, Stream::Stdout, "o1");
        push(&hub, Stream::Stderr, "e1");
        push(&hub, Stream::Stdout, "o2");
        let all = LogQuery {
            streams: Stream::ALL.to_vec(),
            follow: true,
            ..Default::default()
        };
        let r = logs.read("t", "a", &all).unwrap();
        let text: Vec<&[u8]> = r.history.iter().map(|l| l.data.as_slice()).collect();
        assert_eq!(text, [b"o1", b"e1", b"o2"]);
        let q = LogQuery {
            streams: vec![Stream::Stdout],
            tail_lines: Some(1),
            ..Default::default()
        };
        let r2 = logs.read("t", "a", &q).unwrap();
        assert_eq!(r2.history.len(), 1);
        assert_eq!(r2.history[0].data, b"o2");
        assert!(r2.follower.is_none());

        let mut f = r.follower.unwrap();
        let h2 = hub.clone();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            push(&h2, Stream::Stderr, "e2");
            h2.finish();
        });
        let mut followed = Vec::new();
        while let Some(batch) = f.next_batch().await {
            followed.extend(batch);
        }
        writer.await.unwrap();
        assert_eq!(followed.len(), 1);
        assert_eq!(followed[0].data, b"e2");

        // After the process: served from the store alone.
        logs.close_hub(&key);
        let r = logs.read("t", "a", &all).unwrap();
        assert_eq!(r.history.len(), 4);
        assert!(r.follower.is_none());
        let mut out = Vec::new();
        r.history[0].write_to(false, &mut out);
        assert_eq!(out, b"o1\n");
        assert!(matches!(
            logs.read("t", "nope", &all),
            Err(LogError::NotFound(_))
        ));
    }

    /// An allocation made later under the same name (a tenant-mate's, say) neither reads
    /// the earlier one's logs nor appends to them.
    #[tokio::test]
    async fn logs_belong_to_one_allocation_uid() {
        let dir = tempfile::tempdir().unwrap();
        let logs = Logs::new(dir.path().to_path_buf(), 1 << 20, "n1");
        let key = LogKey {
            namespace: "t".into(),
            name: "train".into(),
            attempt: 1,
        };
        let hub = logs.open_hub(&key, "alice-uid").unwrap();
        push(&hub, Stream::Stdout, "alice's secret");
        hub.finish();
        logs.close_hub(&key);
        let by = |uid: &str| LogQuery {
            streams: Stream::ALL.to_vec(),
            uid: Some(uid.into()),
            ..Default::default()
        };
        let r = logs.read("t", "train", &by("alice-uid")).unwrap();
        assert_eq!(r.history.len(), 1);
        for q in [
            by("eve-uid"),
            LogQuery {
                attempt: Some(1),
                ..by("eve-uid")
            },
        ] {
            assert!(matches!(
                logs.read("t", "train", &q),
                Err(LogError::NotFound(_))
            ));
        }
        // Eve's run of a new `train` starts empty: Alice's logs went with her allocation.
        let hub = logs.open_hub(&key, "eve-uid").unwrap();
        push(&hub, Stream::Stdout, "eve");
        let r = logs.read("t", "train", &by("eve-uid")).unwrap();
        let text: Vec<&[u8]> = r.history.iter().map(|l| l.data.as_slice()).collect();
        assert_eq!(text, [b"eve"]);
    }
}
