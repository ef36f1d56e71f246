//! The deterministic MVCC engine: etcd's revision model over an in-memory multi-version
//! index. No clock, no I/O, no randomness: given the same sequence of [`Command`]s every
//! member reaches the same state, which is what lets the same code sit behind a Raft log.
//!
//! * `index`: key → every version still readable (ascending `mod_revision`), with
//!   tombstones marking deletions, so a read at any revision ≥ the compact revision is a
//!   binary search.
//! * `history`: revision → the events of that revision (with `prev_kv`), which serves
//!   watch replay from any revision newer than the compact revision.
//!
//! Values are [`Bytes`]: a version, its event and a read result share one allocation.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{StoreError, StoreResult};
use crate::types::*;

/// A state-machine command. The leader fills in everything non-deterministic (lease IDs)
/// before the command is proposed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Txn(TxnRequest),
    Compact {
        revision: i64,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    /// Raise or disarm an alarm (see [`crate::quota`]).
    Alarm {
        action: AlarmAction,
        alarm: Alarm,
    },
}

/// The answer to one applied [`Command`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResponse {
    Txn(TxnResponse),
    Compacted {
        revision: i64,
    },
    LeaseGranted(LeaseGrant),
    LeaseRevoked {
        revision: i64,
    },
    /// The alarms the command raised or disarmed (none if there was nothing to change).
    Alarms(Vec<Alarm>),
}

/// What one applied command changed, for persistence and watch fan-out.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// The new revision and its events, if the command wrote anything.
    pub revision: Option<(i64, Arc<[Event]>)>,
    /// Compaction performed at this revision.
    pub compacted: Option<i64>,
    /// Lease table changes: `(id, Some(ttl))` granted, `(id, None)` revoked.
    pub leases: Vec<(i64, Option<i64>)>,
    /// Every active alarm after this command, when it changed them.
    pub alarms: Option<Vec<Alarm>>,
}

impl Applied {
    /// Whether there is anything to make durable.
    pub fn wrote(&self) -> bool {
        self.revision.is_some()
            || self.compacted.is_some()
            || !self.leases.is_empty()
            || self.alarms.is_some()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Version {
    Live(KeyValue),
    Tombstone(i64),
}

impl Version {
    fn mod_revision(&self) -> i64 {
        match self {
            Version::Live(kv) => kv.mod_revision,
            Version::Tombstone(rev) => *rev,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct KeyHistory {
    versions: Vec<Version>,
}

impl KeyHistory {
    /// The version visible at `rev`, if the key existed then.
    fn at(&self, rev: i64) -> Option<&KeyValue> {
        let idx = self.versions.partition_point(|v| v.mod_revision() <= rev);
        match idx.checked_sub(1).map(|i| &self.versions[i]) {
            Some(Version::Live(kv)) => Some(kv),
            _ => None,
        }
    }

    fn latest(&self) -> Option<&KeyValue> {
        match self.versions.last() {
            Some(Version::Live(kv)) => Some(kv),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    pub ttl: i64,
    pub keys: BTreeSet<Bytes>,
}

/// Request limits. Key and value sizes are checked before a command is applied, so a bad
/// request never changes state. `max_txn_ops` is checked only where a request enters the
/// store, before it is proposed ([`Limits::check_command`]), never when it is applied: a
/// replicated command must apply the same way on every member, whatever each member's
/// `--max-txn-ops`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    /// Most operations one transaction may carry, counted by [`txn_ops`].
    pub max_txn_ops: usize,
}

impl Limits {
    /// The `--max-txn-ops` check, made once, by the member that receives a write, before
    /// the command is proposed (so an oversized transaction never reaches the log and
    /// never takes a revision). [`Mvcc::apply`] does not repeat it.
    pub fn check_command(&self, cmd: &Command) -> StoreResult<()> {
        if let Command::Txn(req) = cmd {
            let ops = txn_ops(req);
            if ops > self.max_txn_ops {
                return Err(StoreError::TooManyOps {
                    ops,
                    limit: self.max_txn_ops,
                });
            }
        }
        Ok(())
    }
}

/// The operations of a transaction, as `--max-txn-ops` counts them: its compares plus the
/// ops of its larger branch, a nested transaction counting as one op plus its own count.
/// It is the most any path through the transaction can execute (the count does not depend
/// on which branches the compares pick, so it can be checked before the transaction is
/// proposed); for a transaction without a failure branch it is compares + ops, nested ones
/// included.
pub fn txn_ops(req: &TxnRequest) -> usize {
    fn branch(ops: &[TxnOp]) -> usize {
        ops.iter().fold(ops.len(), |n, op| match op {
            TxnOp::Txn(t) => n.saturating_add(txn_ops(t)),
            _ => n,
        })
    }
    req.compare
        .len()
        .saturating_add(branch(&req.success).max(branch(&req.failure)))
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: 4 * 1024,
            max_value_bytes: 1536 * 1024,
            max_txn_ops: 128,
        }
    }
}

#[derive(Debug, Default)]
pub struct Mvcc {
    index: BTreeMap<Bytes, KeyHistory>,
    history: BTreeMap<i64, Arc<[Event]>>,
    revision: i64,
    compact_revision: i64,
    leases: BTreeMap<i64, LeaseState>,
    /// The versions' part of [`Mvcc::size_bytes`], kept up to date as versions come and go.
    version_bytes: u64,
    /// Active alarms (replicated state: changed only by [`Command::Alarm`]).
    alarms: BTreeSet<Alarm>,
}

/// The size a version of `key` adds (see [`crate::quota`]).
fn version_size(key: &Bytes, v: &Version) -> u64 {
    match v {
        Version::Live(kv) => crate::quota::version_bytes(key.len(), kv.value.len()),
        Version::Tombstone(_) => crate::quota::version_bytes(key.len(), 0),
    }
}

/// One path through a transaction's compares: which branch each (nested) txn takes,
/// decided entirely against the state before the transaction (etcd's `compareToPath`).
struct TxnPath {
    succeeded: bool,
    nested: Vec<TxnPath>,
}

impl Mvcc {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }

    pub fn leases(&self) -> &BTreeMap<i64, LeaseState> {
        &self.leases
    }

    pub fn key_count(&self) -> usize {
        self.index.len()
    }

    /// The store's size as the quota counts it ([`crate::quota`]): every version held
    /// (history not yet compacted included) and every lease.
    pub fn size_bytes(&self) -> u64 {
        self.version_bytes
            .saturating_add(self.leases.len() as u64 * crate::quota::LEASE_OVERHEAD)
    }

    /// The active alarms, in order.
    pub fn alarms(&self) -> Vec<Alarm> {
        self.alarms.iter().copied().collect()
    }

    /// Whether an alarm of `kind` is raised (by any member).
    pub fn has_alarm(&self, kind: AlarmKind) -> bool {
        self.alarms.iter().any(|a| a.kind == kind)
    }

    /// Restore the alarms from persisted state.
    pub fn load_alarms(&mut self, alarms: impl IntoIterator<Item = Alarm>) {
        self.alarms = alarms.into_iter().collect();
    }

    fn push_version(&mut self, key: &Bytes, v: Version) {
        self.version_bytes = self.version_bytes.saturating_add(version_size(key, &v));
        self.index.entry(key.clone()).or_default().versions.push(v);
    }

    /// Rebuild from persisted state: the base (every live key as of `revision`) is
    /// loaded with [`Mvcc::load_base`], then later revisions are replayed with
    /// [`Mvcc::replay_revision`].
    pub fn restore_meta(&mut self, revision: i64, compact_revision: i64) {
        self.revision = revision;
        self.compact_revision = compact_revision;
    }

    pub fn load_base(&mut self, kv: KeyValue) {
        if kv.lease != 0 {
            self.leases.entry(kv.lease).or_insert_with(|| LeaseState {
                ttl: 0,
                keys: BTreeSet::new(),
            });
            if let Some(l) = self.leases.get_mut(&kv.lease) {
                l.keys.insert(kv.key.clone());
            }
        }
        let key = kv.key.clone();
        let v = Version::Live(kv);
        self.version_bytes = self.version_bytes.saturating_add(version_size(&key, &v));
        if let Some(old) = self
            .index
            .insert(key.clone(), KeyHistory { versions: vec![v] })
        {
            let freed: u64 = old.versions.iter().map(|v| version_size(&key, v)).sum();
            self.version_bytes = self.version_bytes.saturating_sub(freed);
        }
    }

    pub fn load_lease(&mut self, id: i64, ttl: i64) {
        self.leases
            .entry(id)
            .or_insert_with(|| LeaseState {
                ttl,
                keys: BTreeSet::new(),
            })
            .ttl = ttl;
    }

    /// Re-apply a persisted revision: its events, with `prev_kv` recomputed from the index.
    pub fn replay_revision(
        &mut self,
        rev: i64,
        changes: Vec<(EventType, KeyValue)>,
    ) -> StoreResult<()> {
        if rev <= self.revision {
            return Err(StoreError::Corrupt(format!(
                "revision {rev} replayed after revision {}",
                self.revision
            )));
        }
        let mut events = Vec::with_capacity(changes.len());
        for (kind, kv) in changes {
            let prev = self.index.get(&kv.key).and_then(|h| h.latest()).cloned();
            if let Some(p) = &prev {
                self.detach_lease(p.lease, &p.key);
            }
            let version = match kind {
                EventType::Put => {
                    self.attach_lease(kv.lease, &kv.key);
                    Version::Live(kv.clone())
                }
                EventType::Delete => Version::Tombstone(rev),
            };
            self.push_version(&kv.key, version);
            events.push(Event {
                kind,
                kv,
                prev_kv: prev,
            });
        }
        self.history.insert(rev, events.into());
        self.revision = rev;
        Ok(())
    }

    /// Apply one command. Validation happens before any mutation, so an `Err` leaves the
    /// state untouched (and is itself deterministic). `limits.max_txn_ops` is not checked
    /// here (see [`Limits::check_command`]): a transaction that reached the log applies
    /// whatever this member's `--max-txn-ops`.
    pub fn apply(
        &mut self,
        cmd: &Command,
        limits: &Limits,
    ) -> StoreResult<(CommandResponse, Applied)> {
        // While the NOSPACE alarm is raised nothing that adds data is applied, on any
        // member alike (the alarm is replicated state).
        if self.has_alarm(AlarmKind::NoSpace) && crate::quota::cost(cmd) > 0 {
            return Err(StoreError::NoSpace { quota_bytes: 0 });
        }
        match cmd {
            Command::Alarm { action, alarm } => {
                let changed = match action {
                    AlarmAction::Activate => self.alarms.insert(*alarm),
                    AlarmAction::Deactivate => self.alarms.remove(alarm),
                };
                Ok((
                    CommandResponse::Alarms(if changed { vec![*alarm] } else { Vec::new() }),
                    Applied {
                        alarms: changed.then(|| self.alarms()),
                        ..Default::default()
                    },
                ))
            }
            Command::Txn(req) => {
                let (resp, applied) = self.apply_txn(req, limits)?;
                Ok((CommandResponse::Txn(resp), applied))
            }
            Command::Compact { revision } => {
                self.compact(*revision)?;
                Ok((
                    CommandResponse::Compacted {
                        revision: *revision,
                    },
                    Applied {
                        compacted: Some(*revision),
                        ..Default::default()
                    },
                ))
            }
            Command::LeaseGrant { id, ttl } => {
                if *id <= 0 {
                    return Err(StoreError::InvalidArgument(format!(
                        "lease ID must be positive, got {id}"
                    )));
                }
                if *ttl <= 0 || *ttl > 9_000_000_000 {
                    return Err(StoreError::LeaseTtlOutOfRange(*ttl));
                }
                if self.leases.contains_key(id) {
                    return Err(StoreError::LeaseExists);
                }
                self.leases.insert(
                    *id,
                    LeaseState {
                        ttl: *ttl,
                        keys: BTreeSet::new(),
                    },
                );
                Ok((
                    CommandResponse::LeaseGranted(LeaseGrant { id: *id, ttl: *ttl }),
                    Applied {
                        leases: vec![(*id, Some(*ttl))],
                        ..Default::default()
                    },
                ))
            }
            Command::LeaseRevoke { id } => {
                let lease = self.leases.get(id).ok_or(StoreError::LeaseNotFound)?;
                let keys: Vec<Bytes> = lease.keys.iter().cloned().collect();
                let mut applied = Applied {
                    leases: vec![(*id, None)],
                    ..Default::default()
                };
                if !keys.is_empty() {
                    let rev = self.revision + 1;
                    let mut events = Vec::with_capacity(keys.len());
                    for key in keys {
                        if let Some(ev) = self.delete_key(&key, rev) {
                            events.push(ev);
                        }
                    }
                    self.finish_revision(rev, events, &mut applied);
                }
                self.leases.remove(id);
                Ok((
                    CommandResponse::LeaseRevoked {
                        revision: self.revision,
                    },
                    applied,
                ))
            }
        }
    }

    fn finish_revision(&mut self, rev: i64, events: Vec<Event>, applied: &mut Applied) {
        if events.is_empty() {
            return;
        }
        let events: Arc<[Event]> = events.into();
        self.history.insert(rev, events.clone());
        self.revision = rev;
        applied.revision = Some((rev, events));
    }

    fn check_revision(&self, rev: i64) -> StoreResult<i64> {
        if rev <= 0 {
            return Ok(self.revision);
        }
        if rev > self.revision {
            return Err(StoreError::FutureRevision {
                requested: rev,
                current: self.revision,
            });
        }
        if rev < self.compact_revision {
            return Err(StoreError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        Ok(rev)
    }

    fn range_iter<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> Box<dyn Iterator<Item = (&'a Bytes, &'a KeyHistory)> + 'a> {
        if range.is_single() {
            return Box::new(self.index.get_key_value(&range.key).into_iter());
        }
        let start = Bound::Included(range.key.clone());
        let end = if range.range_end.as_ref() == b"\0" {
            Bound::Unbounded
        } else if range.range_end <= range.key {
            // An empty interval; etcd returns nothing.
            return Box::new(std::iter::empty());
        } else {
            Bound::Excluded(range.range_end.clone())
        };
        Box::new(self.index.range::<Bytes, _>((start, end)))
    }

    /// A read at a past or the latest revision. `upto` caps "latest" (used to hide
    /// revisions applied in memory but not yet durable).
    pub fn range(&self, req: &RangeRequest, upto: i64) -> StoreResult<RangeResponse> {
        if req.range.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
        let latest = upto.min(self.revision);
        let rev = if req.revision <= 0 {
            latest
        } else {
            req.revision
        };
        if rev > latest {
            return Err(StoreError::FutureRevision {
                requested: rev,
                current: latest,
            });
        }
        self.check_revision(rev)?;
        // etcd's header carries the current revision even for a read in the past.
        Ok(RangeResponse {
            revision: latest,
            ..self.range_at(req, rev)?
        })
    }

    fn range_at(&self, req: &RangeRequest, rev: i64) -> StoreResult<RangeResponse> {
        let filtered = req.min_mod_revision > 0
            || req.max_mod_revision > 0
            || req.min_create_revision > 0
            || req.max_create_revision > 0;
        let sorted = req.sort_order != SortOrder::None
            && !(req.sort_order == SortOrder::Ascend && req.sort_target == SortTarget::Key);
        let limit = if req.limit > 0 {
            req.limit as usize
        } else {
            usize::MAX
        };
        let mut kvs = Vec::new();
        let mut count = 0i64;
        for (_, hist) in self.range_iter(&req.range) {
            let Some(kv) = hist.at(rev) else { continue };
            if filtered && !passes_revision_filters(req, kv) {
                continue;
            }
            count += 1;
            if req.count_only {
                continue;
            }
            // Without a sort that reorders, the first `limit` keys in key order are the
            // answer; keep counting without cloning the rest.
            if !sorted && kvs.len() >= limit {
                continue;
            }
            let mut kv = kv.clone();
            if req.keys_only {
                kv.value = Bytes::new();
            }
            kvs.push(kv);
        }
        if sorted {
            sort_kvs(&mut kvs, req.sort_order, req.sort_target);
        }
        let more = count as usize > kvs.len() && !req.count_only;
        kvs.truncate(limit);
        Ok(RangeResponse {
            revision: rev,
            kvs,
            more,
            count,
        })
    }

    fn compare(&self, c: &Compare) -> bool {
        let check = |kv: Option<&KeyValue>| -> bool {
            use std::cmp::Ordering;
            let ord = match (&c.target, kv) {
                (CompareTarget::Value(v), Some(kv)) => kv.value.as_ref().cmp(v.as_ref()),
                // A value compare on a missing key always fails (etcd).
                (CompareTarget::Value(_), None) => return false,
                (CompareTarget::Version(v), kv) => kv.map_or(0, |k| k.version).cmp(v),
                (CompareTarget::CreateRevision(v), kv) => {
                    kv.map_or(0, |k| k.create_revision).cmp(v)
                }
                (CompareTarget::ModRevision(v), kv) => kv.map_or(0, |k| k.mod_revision).cmp(v),
                (CompareTarget::Lease(v), kv) => kv.map_or(0, |k| k.lease).cmp(v),
            };
            match c.result {
                CompareResult::Equal => ord == Ordering::Equal,
                CompareResult::NotEqual => ord != Ordering::Equal,
                CompareResult::Greater => ord == Ordering::Greater,
                CompareResult::Less => ord == Ordering::Less,
            }
        };
        if c.range.is_single() {
            return check(self.index.get(&c.range.key).and_then(|h| h.latest()));
        }
        // Over a range every existing key must satisfy the compare. An empty range is
        // compared as one absent key (etcd): a VALUE compare fails, the others see zeros.
        let mut any = false;
        let all = self
            .range_iter(&c.range)
            .filter_map(|(_, h)| h.latest())
            .all(|kv| {
                any = true;
                check(Some(kv))
            });
        if any {
            all
        } else {
            check(None)
        }
    }

    fn txn_path(&self, req: &TxnRequest) -> TxnPath {
        let succeeded = req.compare.iter().all(|c| self.compare(c));
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let nested = ops
            .iter()
            .filter_map(|op| match op {
                TxnOp::Txn(t) => Some(self.txn_path(t)),
                _ => None,
            })
            .collect();
        TxnPath { succeeded, nested }
    }

    /// Validate the ops the path will execute: sizes, leases, keys that must exist, and
    /// etcd's rule that one transaction may not write the same key twice. (The operation
    /// count is not checked here: it was checked before the transaction was proposed.)
    fn validate_ops(
        &self,
        req: &TxnRequest,
        path: &TxnPath,
        limits: &Limits,
        puts: &mut BTreeSet<Bytes>,
        deletes: &mut Vec<KeyRange>,
    ) -> StoreResult<()> {
        let ops = if path.succeeded {
            &req.success
        } else {
            &req.failure
        };
        for c in &req.compare {
            check_key(&c.range.key, limits)?;
        }
        let mut nested = path.nested.iter();
        for op in ops {
            match op {
                TxnOp::Range(r) => check_key(&r.range.key, limits)?,
                TxnOp::Put(p) => {
                    check_key(&p.key, limits)?;
                    if p.value.len() > limits.max_value_bytes {
                        return Err(StoreError::ValueTooLarge {
                            size: p.value.len(),
                            limit: limits.max_value_bytes,
                        });
                    }
                    if p.lease != 0 && !p.ignore_lease && !self.leases.contains_key(&p.lease) {
                        return Err(StoreError::LeaseNotFound);
                    }
                    if (p.ignore_value || p.ignore_lease)
                        && self.index.get(&p.key).and_then(|h| h.latest()).is_none()
                    {
                        return Err(StoreError::KeyNotFound);
                    }
                    if !puts.insert(p.key.clone()) || deletes.iter().any(|d| d.contains(&p.key)) {
                        return Err(StoreError::DuplicateKey);
                    }
                }
                TxnOp::DeleteRange(d) => {
                    check_key(&d.range.key, limits)?;
                    if puts.iter().any(|k| d.range.contains(k)) {
                        return Err(StoreError::DuplicateKey);
                    }
                    deletes.push(d.range.clone());
                }
                TxnOp::Txn(t) => {
                    let p = nested.next().ok_or_else(|| {
                        StoreError::Backend("nested transaction path out of step".into())
                    })?;
                    self.validate_ops(t, p, limits, puts, deletes)?;
                }
            }
        }
        Ok(())
    }

    fn apply_txn(
        &mut self,
        req: &TxnRequest,
        limits: &Limits,
    ) -> StoreResult<(TxnResponse, Applied)> {
        let path = self.txn_path(req);
        self.validate_ops(req, &path, limits, &mut BTreeSet::new(), &mut Vec::new())?;
        let rev = self.revision + 1;
        let mut events = Vec::new();
        let responses = self.execute(req, &path, rev, &mut events);
        let mut applied = Applied::default();
        self.finish_revision(rev, events, &mut applied);
        Ok((
            TxnResponse {
                revision: self.revision,
                succeeded: path.succeeded,
                responses,
            },
            applied,
        ))
    }

    fn execute(
        &mut self,
        req: &TxnRequest,
        path: &TxnPath,
        rev: i64,
        events: &mut Vec<Event>,
    ) -> Vec<TxnOpResponse> {
        let ops = if path.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut nested = path.nested.iter();
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let resp = match op {
                TxnOp::Range(r) => {
                    // Reads inside a transaction see its own earlier writes (etcd's txn view).
                    let read_rev = if events.is_empty() {
                        self.revision
                    } else {
                        rev
                    };
                    let mut r = r.clone();
                    let at = if r.revision <= 0 {
                        read_rev
                    } else {
                        r.revision
                    };
                    r.revision = at;
                    let resp = if at < self.compact_revision {
                        RangeResponse {
                            revision: read_rev,
                            ..Default::default()
                        }
                    } else {
                        self.range_at(&r, at.min(read_rev)).unwrap_or_default()
                    };
                    TxnOpResponse::Range(RangeResponse {
                        revision: read_rev,
                        ..resp
                    })
                }
                TxnOp::Put(p) => {
                    let prev = self.index.get(&p.key).and_then(|h| h.latest()).cloned();
                    let value = if p.ignore_value {
                        prev.as_ref().map(|k| k.value.clone()).unwrap_or_default()
                    } else {
                        p.value.clone()
                    };
                    let lease = if p.ignore_lease {
                        prev.as_ref().map_or(0, |k| k.lease)
                    } else {
                        p.lease
                    };
                    let kv = KeyValue {
                        key: p.key.clone(),
                        value,
                        create_revision: prev.as_ref().map_or(rev, |k| k.create_revision),
                        mod_revision: rev,
                        version: prev.as_ref().map_or(1, |k| k.version + 1),
                        lease,
                    };
                    if let Some(prev) = &prev {
                        self.detach_lease(prev.lease, &prev.key);
                    }
                    self.attach_lease(lease, &kv.key);
                    self.push_version(&kv.key, Version::Live(kv.clone()));
                    events.push(Event {
                        kind: EventType::Put,
                        kv,
                        prev_kv: prev.clone(),
                    });
                    TxnOpResponse::Put(PutResponse {
                        revision: rev,
                        prev_kv: if p.prev_kv { prev } else { None },
                    })
                }
                TxnOp::DeleteRange(d) => {
                    let keys: Vec<Bytes> = self
                        .range_iter(&d.range)
                        .filter(|(_, h)| h.latest().is_some())
                        .map(|(k, _)| k.clone())
                        .collect();
                    let mut prev_kvs = Vec::new();
                    for key in &keys {
                        if let Some(ev) = self.delete_key(key, rev) {
                            if d.prev_kv {
                                prev_kvs.extend(ev.prev_kv.clone());
                            }
                            events.push(ev);
                        }
                    }
                    TxnOpResponse::DeleteRange(DeleteRangeResponse {
                        revision: rev,
                        deleted: keys.len() as i64,
                        prev_kvs,
                    })
                }
                TxnOp::Txn(t) => {
                    let Some(p) = nested.next() else {
                        continue;
                    };
                    let responses = self.execute(t, p, rev, events);
                    TxnOpResponse::Txn(TxnResponse {
                        revision: rev,
                        succeeded: p.succeeded,
                        responses,
                    })
                }
            };
            out.push(resp);
        }
        // Responses carry the final revision: unchanged if nothing was written.
        let final_rev = if events.is_empty() {
            self.revision
        } else {
            rev
        };
        for r in &mut out {
            set_revision(r, final_rev);
        }
        out
    }

    fn delete_key(&mut self, key: &Bytes, rev: i64) -> Option<Event> {
        let hist = self.index.get_mut(key)?;
        let prev = hist.latest()?.clone();
        hist.versions.push(Version::Tombstone(rev));
        self.version_bytes = self
            .version_bytes
            .saturating_add(crate::quota::version_bytes(key.len(), 0));
        self.detach_lease(prev.lease, key);
        Some(Event {
            kind: EventType::Delete,
            kv: KeyValue {
                key: key.clone(),
                mod_revision: rev,
                ..Default::default()
            },
            prev_kv: Some(prev),
        })
    }

    fn attach_lease(&mut self, lease: i64, key: &Bytes) {
        if lease != 0 {
            if let Some(l) = self.leases.get_mut(&lease) {
                l.keys.insert(key.clone());
            }
        }
    }

    fn detach_lease(&mut self, lease: i64, key: &Bytes) {
        if lease != 0 {
            if let Some(l) = self.leases.get_mut(&lease) {
                l.keys.remove(key);
            }
        }
    }

    /// Compact at `revision` (etcd semantics): `revision` itself stays readable and
    /// watchable; versions superseded before it, and history below it, are dropped.
    fn compact(&mut self, revision: i64) -> StoreResult<()> {
        if revision <= self.compact_revision {
            return Err(StoreError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        if revision > self.revision {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: self.revision,
            });
        }
        self.drop_superseded(revision);
        self.history = self.history.split_off(&revision);
        self.compact_revision = revision;
        Ok(())
    }

    /// After a restart from persisted state (the keys as of the revision before the compact
    /// revision, then the history from it), drop what a compaction at the compact revision
    /// dropped before the restart: the versions no read can reach any more, which the
    /// size ([`Mvcc::size_bytes`]) would otherwise count again.
    pub fn finish_load(&mut self) {
        if self.compact_revision > 0 {
            self.drop_superseded(self.compact_revision);
        }
    }

    /// Drop, for every key, the versions superseded at or before `revision`, keeping the
    /// one visible at `revision` unless it is a tombstone.
    fn drop_superseded(&mut self, revision: i64) {
        let mut freed = 0u64;
        self.index.retain(|key, hist| {
            // Keep versions newer than `revision` and the one visible at `revision`, unless
            // that one is a tombstone (then the key did not exist at `revision`).
            let visible = hist
                .versions
                .partition_point(|v| v.mod_revision() <= revision);
            let mut drop = visible.saturating_sub(1);
            if let Some(Version::Tombstone(_)) = visible.checked_sub(1).map(|i| &hist.versions[i]) {
                drop = visible;
            }
            freed += hist
                .versions
                .drain(..drop)
                .map(|v| version_size(key, &v))
                .sum::<u64>();
            !hist.versions.is_empty()
        });
        self.version_bytes = self.version_bytes.saturating_sub(freed);
    }

    /// Events of revisions `from..=to` (inclusive), for watch catch-up.
    pub fn events_between(&self, from: i64, to: i64) -> StoreResult<Vec<(i64, Arc<[Event]>)>> {
        if from < self.compact_revision {
            return Err(StoreError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        Ok(self
            .history
            .range(from..=to)
            .map(|(r, e)| (*r, e.clone()))
            .collect())
    }

    /// The live key-values at `revision` (must be ≥ the compact revision): the base of a
    /// snapshot or backup.
    pub fn live_at(&self, revision: i64) -> Vec<KeyValue> {
        self.index
            .values()
            .filter_map(|h| h.at(revision).cloned())
            .collect()
    }

    pub fn lease_keys(&self, id: i64) -> StoreResult<Vec<Bytes>> {
        self.leases
            .get(&id)
            .map(|l| l.keys.iter().cloned().collect())
            .ok_or(StoreError::LeaseNotFound)
    }
}

fn set_revision(r: &mut TxnOpResponse, rev: i64) {
    match r {
        TxnOpResponse::Range(_) => {}
        TxnOpResponse::Put(p) => p.revision = rev,
        TxnOpResponse::DeleteRange(d) => d.revision = rev,
        TxnOpResponse::Txn(t) => {
            t.revision = rev;
            for r in &mut t.responses {
                set_revision(r, rev);
            }
        }
    }
}

fn check_key(key: &[u8], limits: &Limits) -> StoreResult<()> {
    if key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    if key.len() > limits.max_key_bytes {
        return Err(StoreError::KeyTooLarge {
            size: key.len(),
            limit: limits.max_key_bytes,
        });
    }
    Ok(())
}

fn passes_revision_filters(req: &RangeRequest, kv: &KeyValue) -> bool {
    (req.min_mod_revision <= 0 || kv.mod_revision >= req.min_mod_revision)
        && (req.max_mod_revision <= 0 || kv.mod_revision <= req.max_mod_revision)
        && (req.min_create_revision <= 0 || kv.create_revision >= req.min_create_revision)
        && (req.max_create_revision <= 0 || kv.create_revision <= req.max_create_revision)
}

fn sort_kvs(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    kvs.sort_by(|a, b| {
        let ord = match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        };
        // Ties keep key order, as etcd's stable sort does.
        let ord = ord.then_with(|| a.key.cmp(&b.key));
        if order == SortOrder::Descend {
            ord.reverse()
        } else {
            ord
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(m: &mut Mvcc, k: &str, v: &str) -> i64 {
        let req = TxnRequest {
            success: vec![TxnOp::Put(PutRequest::new(k.to_owned(), v.to_owned()))],
            ..Default::default()
        };
        match m.apply(&Command::Txn(req), &Limits::default()) {
            Ok((CommandResponse::Txn(t), _)) => t.revision,
            other => panic!("put failed: {other:?}"),
        }
    }

    fn get(m: &Mvcc, k: &str, rev: i64) -> StoreResult<Option<KeyValue>> {
        let mut r = RangeRequest::key(k.to_owned());
        r.revision = rev;
        Ok(m.range(&r, i64::MAX)?.kvs.into_iter().next())
    }

    #[test]
    fn revisions_versions_and_past_reads() {
        let mut m = Mvcc::new();
        assert_eq!(put(&mut m, "a", "1"), 1);
        assert_eq!(put(&mut m, "a", "2"), 2);
        assert_eq!(put(&mut m, "b", "x"), 3);
        let a = get(&m, "a", 0).unwrap().unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (1, 2, 2));
        assert_eq!(get(&m, "a", 1).unwrap().unwrap().value, Bytes::from("1"));
        assert!(get(&m, "b", 2).unwrap().is_none());
        assert!(matches!(
            get(&m, "a", 9),
            Err(StoreError::FutureRevision { .. })
        ));
    }

    #[test]
    fn failed_compare_does_not_bump_revision() {
        let mut m = Mvcc::new();
        put(&mut m, "a", "1");
        let req = TxnRequest {
            compare: vec![Compare::value("a", CompareResult::Equal, "nope")],
            success: vec![TxnOp::Put(PutRequest::new("a", "2"))],
            failure: vec![TxnOp::Range(RangeRequest::key("a"))],
        };
        let (resp, applied) = m.apply(&Command::Txn(req), &Limits::default()).unwrap();
        let CommandResponse::Txn(t) = resp else {
            panic!()
        };
        assert!(!t.succeeded);
        assert_eq!(t.revision, 1);
        assert!(applied.revision.is_none());
    }

    #[test]
    fn compaction_keeps_latest_and_rejects_old_reads() {
        let mut m = Mvcc::new();
        put(&mut m, "a", "1");
        put(&mut m, "a", "2");
        put(&mut m, "b", "1");
        let del = TxnRequest {
            success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single("b"),
                prev_kv: true,
            })],
            ..Default::default()
        };
        m.apply(&Command::Txn(del), &Limits::default()).unwrap();
        m.apply(&Command::Compact { revision: 4 }, &Limits::default())
            .unwrap();
        assert!(matches!(
            get(&m, "a", 2),
            Err(StoreError::Compacted {
                compact_revision: 4
            })
        ));
        assert_eq!(get(&m, "a", 4).unwrap().unwrap().value, Bytes::from("2"));
        assert!(get(&m, "b", 0).unwrap().is_none());
        assert_eq!(m.key_count(), 1);
        assert!(matches!(
            m.events_between(3, 4),
            Err(StoreError::Compacted { .. })
        ));
    }

    #[test]
    fn duplicate_keys_in_txn_are_rejected() {
        let mut m = Mvcc::new();
        let req = TxnRequest {
            success: vec![
                TxnOp::Put(PutRequest::new("a", "1")),
                TxnOp::Put(PutRequest::new("a", "2")),
            ],
            ..Default::default()
        };
        assert_eq!(
            m.apply(&Command::Txn(req), &Limits::default()).unwrap_err(),
            StoreError::DuplicateKey
        );
        assert_eq!(m.revision(), 0);
    }

    fn puts(prefix: &str, n: usize) -> Vec<TxnOp> {
        (0..n)
            .map(|i| TxnOp::Put(PutRequest::new(format!("{prefix}{i}"), "v")))
            .collect()
    }

    fn compares(n: usize) -> Vec<Compare> {
        (0..n)
            .map(|i| Compare {
                range: KeyRange::single(format!("c{i}")),
                result: CompareResult::Equal,
                target: CompareTarget::Version(0),
            })
            .collect()
    }

    /// A transaction that reached the log applies whatever the local `--max-txn-ops`: the
    /// limit is checked before proposing, so members with different limits never diverge.
    #[test]
    fn apply_ignores_the_local_max_txn_ops() {
        let tiny = Limits {
            max_txn_ops: 2,
            ..Limits::default()
        };
        let req = TxnRequest {
            compare: compares(3),
            success: vec![
                TxnOp::Put(PutRequest::new("a", "1")),
                TxnOp::Txn(TxnRequest {
                    success: puts("n", 6),
                    ..Default::default()
                }),
            ],
            failure: vec![],
        };
        let cmd = Command::Txn(req);
        // 3 compares + 2 ops + the nested txn's 6.
        assert_eq!(
            tiny.check_command(&cmd).unwrap_err(),
            StoreError::TooManyOps { ops: 11, limit: 2 }
        );
        let mut m = Mvcc::new();
        match m.apply(&cmd, &tiny).unwrap() {
            (CommandResponse::Txn(t), _) => assert!(t.succeeded),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.revision(), 1);
        assert_eq!(m.key_count(), 7);
    }

    #[test]
    fn txn_ops_counts_compares_the_larger_branch_and_nested_txns() {
        let flat = TxnRequest {
            compare: compares(2),
            success: puts("s", 5),
            failure: vec![],
        };
        assert_eq!(txn_ops(&flat), 7);
        // The larger branch counts, whichever the compares would pick.
        let lopsided = TxnRequest {
            compare: compares(1),
            success: puts("s", 2),
            failure: puts("f", 9),
        };
        assert_eq!(txn_ops(&lopsided), 10);
        // A nested txn is one op of its parent's branch plus its own count.
        let nested = TxnRequest {
            compare: compares(1),
            success: vec![
                TxnOp::Put(PutRequest::new("a", "1")),
                TxnOp::Txn(lopsided.clone()),
            ],
            failure: puts("f", 3),
        };
        assert_eq!(txn_ops(&nested), 1 + 2 + 10);
        assert_eq!(txn_ops(&TxnRequest::default()), 0);
        let at_limit = Limits {
            max_txn_ops: 13,
            ..Limits::default()
        };
        at_limit
            .check_command(&Command::Txn(nested.clone()))
            .unwrap();
        let below = Limits {
            max_txn_ops: 12,
            ..Limits::default()
        };
        assert_eq!(
            below.check_command(&Command::Txn(nested)).unwrap_err(),
            StoreError::TooManyOps { ops: 13, limit: 12 }
        );
        // Non-transaction commands carry no operations.
        below
            .check_command(&Command::Compact { revision: 1 })
            .unwrap();
    }

    #[test]
    fn lease_revoke_deletes_attached_keys() {
        let mut m = Mvcc::new();
        m.apply(&Command::LeaseGrant { id: 7, ttl: 10 }, &Limits::default())
            .unwrap();
        let mut p = PutRequest::new("k", "v");
        p.lease = 7;
        m.apply(
            &Command::Txn(TxnRequest {
                success: vec![TxnOp::Put(p)],
                ..Default::default()
            }),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(m.lease_keys(7).unwrap(), vec![Bytes::from("k")]);
        let (_, applied) = m
            .apply(&Command::LeaseRevoke { id: 7 }, &Limits::default())
            .unwrap();
        assert_eq!(applied.revision.as_ref().map(|r| r.0), Some(2));
        assert!(get(&m, "k", 0).unwrap().is_none());
        assert!(m.lease_keys(7).is_err());
    }

    /// The size recomputed from scratch: what `size_bytes` must always equal.
    fn recomputed_size(m: &Mvcc) -> u64 {
        let versions: u64 = m
            .index
            .iter()
            .flat_map(|(k, h)| h.versions.iter().map(move |v| version_size(k, v)))
            .sum();
        versions + m.leases.len() as u64 * crate::quota::LEASE_OVERHEAD
    }

    proptest::proptest! {
        /// Whatever puts, deletes, lease grants/revokes and compactions are applied, the
        /// size kept up to date equals the size recomputed from the versions held, and a
        /// restart from the persisted form (a backup: base + no history) counts only what
        /// it holds.
        #[test]
        fn the_size_follows_every_version_held(
            ops in proptest::collection::vec((0u8..5, 0u8..6, 0usize..40), 1..60)
        ) {
            let mut m = Mvcc::new();
            let limits = Limits::default();
            for (op, key, len) in ops {
                let key = format!("/k{key}");
                let cmd = match op {
                    0 | 1 => Command::Txn(TxnRequest {
                        success: vec![TxnOp::Put(PutRequest::new(key, "x".repeat(len)))],
                        ..Default::default()
                    }),
                    2 => Command::Txn(TxnRequest {
                        success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                            range: KeyRange::single(key),
                            prev_kv: false,
                        })],
                        ..Default::default()
                    }),
                    3 => Command::Compact { revision: (m.revision() - len as i64 % 3).max(1) },
                    _ if len % 2 == 0 => Command::LeaseGrant { id: 1 + len as i64, ttl: 5 },
                    _ => Command::LeaseRevoke { id: len as i64 },
                };
                let _ = m.apply(&cmd, &limits);
                proptest::prop_assert_eq!(m.size_bytes(), recomputed_size(&m));
            }
            let mut restored = Mvcc::new();
            for kv in m.live_at(m.revision()) {
                restored.load_base(kv);
            }
            proptest::prop_assert_eq!(restored.size_bytes(), recomputed_size(&restored));
            proptest::prop_assert!(restored.size_bytes() <= m.size_bytes() + m.leases.len() as u64 * 64);
        }
    }

    #[test]
    fn the_nospace_alarm_refuses_what_adds_data_and_nothing_else() {
        let mut m = Mvcc::new();
        let limits = Limits::default();
        put(&mut m, "a", "1");
        put(&mut m, "b", "2");
        let nospace = Alarm {
            member: 7,
            kind: AlarmKind::NoSpace,
        };
        let raise = Command::Alarm {
            action: AlarmAction::Activate,
            alarm: nospace,
        };
        let (resp, applied) = m.apply(&raise, &limits).unwrap();
        assert_eq!(resp, CommandResponse::Alarms(vec![nospace]));
        assert_eq!(applied.alarms, Some(vec![nospace]));
        // Raising it again changes nothing (and persists nothing).
        let (resp, applied) = m.apply(&raise, &limits).unwrap();
        assert_eq!(resp, CommandResponse::Alarms(vec![]));
        assert!(!applied.wrote());

        let put_cmd = |k: &str| {
            Command::Txn(TxnRequest {
                success: vec![TxnOp::Put(PutRequest::new(k.to_owned(), "v".to_owned()))],
                ..Default::default()
            })
        };
        let rev = m.revision();
        assert_eq!(
            m.apply(&put_cmd("c"), &limits).unwrap_err(),
            StoreError::NoSpace { quota_bytes: 0 }
        );
        assert_eq!(
            m.apply(&Command::LeaseGrant { id: 1, ttl: 5 }, &limits)
                .unwrap_err(),
            StoreError::NoSpace { quota_bytes: 0 }
        );
        // A put in a branch that would not even run still counts (etcd's rule).
        let guarded = Command::Txn(TxnRequest {
            compare: vec![Compare::value("a", CompareResult::Equal, "nope")],
            success: vec![TxnOp::Put(PutRequest::new("a", "2"))],
            failure: vec![TxnOp::Range(RangeRequest::key("a"))],
        });
        assert!(m.apply(&guarded, &limits).is_err());
        assert_eq!(m.revision(), rev, "nothing refused took a revision");

        // Deletes and compaction go on, and free space.
        let before = m.size_bytes();
        let del = Command::Txn(TxnRequest {
            success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single("a"),
                prev_kv: false,
            })],
            ..Default::default()
        });
        m.apply(&del, &limits).unwrap();
        m.apply(
            &Command::Compact {
                revision: m.revision(),
            },
            &limits,
        )
        .unwrap();
        assert!(m.size_bytes() < before);

        // Disarmed, writes go through again.
        m.apply(
            &Command::Alarm {
                action: AlarmAction::Deactivate,
                alarm: nospace,
            },
            &limits,
        )
        .unwrap();
        assert!(m.alarms().is_empty());
        put(&mut m, "c", "3");
    }
}
