//! The logs of one running allocation: lines from its spools go into the live ring and
//! the chunk writer; readers take a consistent snapshot and follow new lines.
//!
//! Invariant: every line older than the ring's oldest is already in the store (the ring
//! closes open chunks before it evicts a line that is not stored yet), so a reader
//! needs the store only for `seq < ring.first_seq` and never sees a gap or a duplicate.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::ring::RingBuffer;
use super::spool::Frame;
use super::store::{ChunkWriter, LineFilter, LogIndex, LogKey, LogStore};
use super::{LogLine, Stream};

/// What followers watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Sequence number of the next line.
    pub next_seq: u64,
    /// No more lines will come.
    pub finished: bool,
}

/// A consistent view of the hub.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Ring lines passing the filter with `seq >= from`.
    pub lines: Vec<Arc<LogLine>>,
    /// Lines below this are only in the store.
    pub ring_first_seq: u64,
    /// Time of the oldest ring line.
    pub ring_first_time: Option<chrono::DateTime<chrono::Utc>>,
    /// Where the hub stands.
    pub progress: Progress,
}

/// One attempt's live logs.
#[derive(Debug)]
pub struct LogHub {
    key: LogKey,
    store: Arc<dyn LogStore>,
    inner: Mutex<Inner>,
    progress: watch::Sender<Progress>,
}

#[derive(Debug)]
struct Inner {
    ring: RingBuffer,
    writer: ChunkWriter,
    next_seq: u64,
    finished: bool,
}

impl LogHub {
    /// A hub resuming from `index` (a new one for a fresh run).
    pub fn new(key: LogKey, store: Arc<dyn LogStore>, index: LogIndex, ring_bytes: usize) -> Self {
        let next_seq = index.next_seq;
        let finished = index.complete;
        Self {
            key: key.clone(),
            store,
            inner: Mutex::new(Inner {
                ring: RingBuffer::new(ring_bytes),
                writer: ChunkWriter::new(key, index),
                next_seq,
                finished,
            }),
            progress: watch::channel(Progress { next_seq, finished }).0,
        }
    }

    /// Which logs.
    pub fn key(&self) -> &LogKey {
        &self.key
    }

    /// The store behind the hub.
    pub fn store(&self) -> &Arc<dyn LogStore> {
        &self.store
    }

    /// Spool offsets the store covers (where reading resumes after a restart).
    pub fn spool_offsets(&self) -> (u64, u64) {
        let g = self.lock();
        let idx = g.writer.index();
        (idx.stdout.spool_offset, idx.stderr.spool_offset)
    }

    /// Take in frames read from the spools (each with its stream and the spool offset
    /// after it), oldest first.
    pub fn push(&self, frames: Vec<(Stream, Frame, u64)>) {
        if frames.is_empty() {
            return;
        }
        let mut g = self.lock();
        for (stream, f, offset) in frames {
            let line = LogLine {
                seq: g.next_seq,
                stream,
                time: f.time,
                newline: f.newline,
                data: f.data,
            };
            g.next_seq += 1;
            let cost = line.cost();
            if let (Some(evict), Some(unstored)) =
                (g.ring.would_evict(cost), g.writer.first_unstored_seq())
            {
                if unstored <= evict {
                    if let Err(e) = g.writer.close_all(self.store.as_ref()) {
                        tracing::warn!(logs = ?self.key, error = %e, "cannot store log chunk");
                    }
                }
            }
            if let Err(e) = g.writer.append(self.store.as_ref(), line.clone(), offset) {
                tracing::warn!(logs = ?self.key, error = %e, "cannot store log chunk");
            }
            g.ring.push(Arc::new(line));
        }
        let p = Progress {
            next_seq: g.next_seq,
            finished: g.finished,
        };
        drop(g);
        self.progress.send_replace(p);
    }

    /// Close chunks that are old enough (called periodically).
    pub fn tick(&self) {
        let mut g = self.lock();
        if let Err(e) = g.writer.close_aged(self.store.as_ref()) {
            tracing::warn!(logs = ?self.key, error = %e, "cannot store log chunk");
        }
    }

    /// Store every open chunk (before a shutdown).
    pub fn flush(&self) {
        let mut g = self.lock();
        if let Err(e) = g.writer.close_all(self.store.as_ref()) {
            tracing::warn!(logs = ?self.key, error = %e, "cannot store log chunk");
        }
    }

    /// The process is gone and its output read: store everything, wake followers.
    pub fn finish(&self) {
        let mut g = self.lock();
        if let Err(e) = g.writer.finish(self.store.as_ref()) {
            tracing::warn!(logs = ?self.key, error = %e, "cannot store the log index");
        }
        g.finished = true;
        let p = Progress {
            next_seq: g.next_seq,
            finished: true,
        };
        drop(g);
        self.progress.send_replace(p);
    }

    /// Ring lines from `from` passing `filter`, and where the ring starts.
    pub fn snapshot(&self, filter: &LineFilter, from: u64) -> Snapshot {
        let g = self.lock();
        let ring_first_seq = g.ring.first_seq().unwrap_or(g.next_seq);
        let ring_first_time = g.ring.since(0).next().map(|l| l.time);
        let lines = g
            .ring
            .since(from)
            .filter(|l| filter.matches(l))
            .cloned()
            .collect();
        Snapshot {
            lines,
            ring_first_seq,
            ring_first_time,
            progress: Progress {
                next_seq: g.next_seq,
                finished: g.finished,
            },
        }
    }

    /// The stored index as the writer has it now.
    pub fn index(&self) -> LogIndex {
        self.lock().writer.index().clone()
    }

    /// Watch for new lines.
    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::{read_stored, LocalLogStore};
    use super::*;

    fn frame(s: &str) -> Frame {
        Frame {
            time: chrono::Utc::now(),
            newline: true,
            data: s.as_bytes().to_vec(),
        }
    }

    #[test]
    fn eviction_stores_first_so_ring_plus_store_is_complete() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn LogStore> = Arc::new(LocalLogStore::new(dir.path().to_path_buf()));
        let key = LogKey {
            namespace: "t".into(),
            name: "a".into(),
            attempt: 1,
        };
        // A tiny ring: a few lines only.
        let hub = LogHub::new(key.clone(), store.clone(), LogIndex::default(), 300);
        let mut rx = hub.subscribe();
        for i in 0..20 {
            let s = if i % 2 == 0 {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            hub.push(vec![(s, frame(&format!("line {i}")), i as u64 + 1)]);
        }
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().next_seq, 20);
        let all = LineFilter {
            streams: Stream::ALL.to_vec(),
            ..Default::default()
        };
        let snap = hub.snapshot(&all, 0);
        assert!(snap.ring_first_seq > 0, "the ring wrapped");
        let older = read_stored(
            store.as_ref(),
            &key,
            &hub.index(),
            &LineFilter {
                before_seq: Some(snap.ring_first_seq),
                ..all.clone()
            },
            None,
        )
        .unwrap();
        let mut seqs: Vec<u64> = older.iter().map(|l| l.seq).collect();
        seqs.extend(snap.lines.iter().map(|l| l.seq));
        assert_eq!(seqs, (0..20).collect::<Vec<_>>());
        hub.finish();
        assert!(rx.borrow_and_update().finished);
        let idx = store.get_index(&key).unwrap().unwrap();
        assert!(idx.complete);
        let stored = read_stored(store.as_ref(), &key, &idx, &all, None).unwrap();
        assert_eq!(stored.len(), 20);
        assert_eq!(stored[19].data, b"line 19");
    }
}
