//! Watch fan-out, after etcd's watchable store: watchers are *synced* (caught up; new
//! revisions are pushed to them as they are published) or *unsynced* (behind: a catch-up
//! pass replays history to them in bounded batches). Publishing never waits on a watcher:
//! a full channel just moves that watcher to the unsynced group, so a slow reader can not
//! slow writers or other watchers.
//!
//! Invariant: a watcher has been sent every matching event with revision `< next_rev`
//! and none with revision `>= next_rev`. Both publishing and catch-up run under the hub
//! lock, so there is never a gap nor a duplicate.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::error::{StoreError, StoreResult};
use crate::mvcc::Mvcc;
use crate::types::{Event, EventType, WatchBatch, WatchRequest};

/// Upper bound on events in one catch-up batch (whole revisions are never split).
const CATCH_UP_BATCH: usize = 1000;

struct Watcher {
    req: WatchRequest,
    tx: mpsc::Sender<StoreResult<WatchBatch>>,
    next_rev: i64,
    synced: bool,
}

impl Watcher {
    fn select(&self, events: &[Event], out: &mut Vec<Event>) {
        for e in events {
            if !self.req.range.contains(&e.kv.key) {
                continue;
            }
            match e.kind {
                EventType::Put if self.req.filters.no_put => continue,
                EventType::Delete if self.req.filters.no_delete => continue,
                _ => {}
            }
            let mut e = e.clone();
            if !self.req.prev_kv {
                e.prev_kv = None;
            }
            out.push(e);
        }
    }
}

#[derive(Default)]
pub struct WatchHub {
    watchers: HashMap<u64, Watcher>,
    next_id: u64,
    unsynced: usize,
}

impl WatchHub {
    pub fn len(&self) -> usize {
        self.watchers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }

    pub fn unsynced(&self) -> usize {
        self.unsynced
    }

    /// Register a watcher. `published` is the newest durable revision.
    pub fn add(
        &mut self,
        req: WatchRequest,
        published: i64,
        compact_revision: i64,
        capacity: usize,
    ) -> StoreResult<mpsc::Receiver<StoreResult<WatchBatch>>> {
        let start = if req.start_revision <= 0 {
            published + 1
        } else {
            req.start_revision
        };
        if start < compact_revision {
            return Err(StoreError::Compacted { compact_revision });
        }
        let (tx, rx) = mpsc::channel(capacity);
        let synced = start > published;
        if !synced {
            self.unsynced += 1;
        }
        self.watchers.insert(
            self.next_id,
            Watcher {
                req,
                tx,
                next_rev: start,
                synced,
            },
        );
        self.next_id += 1;
        Ok(rx)
    }

    /// Push newly durable revisions to synced watchers.
    pub fn publish(&mut self, revisions: &[(i64, Arc<[Event]>)], published: i64) {
        let Some(first) = revisions.first().map(|r| r.0) else {
            return;
        };
        let mut closed = Vec::new();
        let mut selected = Vec::new();
        for (id, w) in self.watchers.iter_mut() {
            if w.tx.is_closed() {
                closed.push(*id);
                continue;
            }
            if !w.synced {
                continue;
            }
            // A watcher created with a future start revision skips what precedes it.
            selected.clear();
            for (rev, events) in revisions {
                if *rev >= w.next_rev {
                    w.select(events, &mut selected);
                }
            }
            if !selected.is_empty() {
                let batch = WatchBatch {
                    revision: published,
                    events: std::mem::take(&mut selected),
                };
                match w.tx.try_send(Ok(batch)) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        w.synced = false;
                        w.next_rev = w.next_rev.max(first);
                        self.unsynced += 1;
                        continue;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        closed.push(*id);
                        continue;
                    }
                }
            }
            w.next_rev = w.next_rev.max(published + 1);
        }
        for id in closed {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(w) = self.watchers.remove(&id) {
            if !w.synced {
                self.unsynced -= 1;
            }
        }
    }

    /// Replay history to unsynced watchers, as far as their channels allow.
    pub fn catch_up(&mut self, mvcc: &Mvcc, published: i64) {
        let mut done = Vec::new();
        let mut dropped = Vec::new();
        for (id, w) in self.watchers.iter_mut().filter(|(_, w)| !w.synced) {
            if w.next_rev > published {
                done.push(*id);
                continue;
            }
            let revisions = match mvcc.events_between(w.next_rev, published) {
                Ok(r) => r,
                Err(e) => {
                    // Compaction overtook this watcher: tell it and drop it.
                    let _ = w.tx.try_send(Err(e));
                    dropped.push(*id);
                    continue;
                }
            };
            let mut batch = Vec::new();
            let mut caught_up = true;
            let mut iter = revisions.iter().peekable();
            while let Some((rev, events)) = iter.next() {
                w.select(events, &mut batch);
                let last = iter.peek().is_none();
                if batch.len() >= CATCH_UP_BATCH || (last && !batch.is_empty()) {
                    let upto = if last { published } else { *rev };
                    match w.tx.try_send(Ok(WatchBatch {
                        revision: upto,
                        events: std::mem::take(&mut batch),
                    })) {
                        Ok(()) => w.next_rev = rev + 1,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            caught_up = false;
                            break;
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            dropped.push(*id);
                            caught_up = false;
                            break;
                        }
                    }
                }
            }
            if caught_up {
                w.next_rev = published + 1;
                done.push(*id);
            }
        }
        for id in done {
            if let Some(w) = self.watchers.get_mut(&id) {
                if !w.synced {
                    w.synced = true;
                    self.unsynced -= 1;
                }
            }
        }
        for id in dropped {
            self.remove(id);
        }
    }

    /// Progress notifications for synced watchers that asked for them.
    pub fn progress(&mut self, published: i64) {
        for w in self.watchers.values() {
            if w.synced && w.req.progress_notify {
                let _ = w.tx.try_send(Ok(WatchBatch {
                    revision: published,
                    events: Vec::new(),
                }));
            }
        }
    }

    /// The store stopped: end every watch.
    pub fn close_all(&mut self) {
        for w in self.watchers.values() {
            let _ = w.tx.try_send(Err(StoreError::Stopped));
        }
        self.watchers.clear();
        self.unsynced = 0;
    }
}
