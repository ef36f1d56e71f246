//! Request and response types of the store, modelled on etcd's v3 API (`rpc.proto`,
//! `kv.proto`) so the gRPC facade and the external-etcd backend translate field for field.
//!
//! Revisions are `i64` as on etcd's wire. Keys and values are [`Bytes`] so that reads,
//! watch fan-out and history share one allocation per stored version.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One stored version of a key (etcd's `mvccpb.KeyValue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KeyValue {
    pub key: Bytes,
    pub value: Bytes,
    /// Revision of the last creation of this key.
    pub create_revision: i64,
    /// Revision of the last modification (for a deletion event: the deletion revision).
    pub mod_revision: i64,
    /// Number of modifications since creation; 1 for a fresh key, 0 in a delete event.
    pub version: i64,
    /// Lease the key is attached to, 0 for none.
    pub lease: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Put,
    Delete,
}

/// A change to one key (etcd's `mvccpb.Event`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventType,
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

/// `[key, range_end)`: empty `range_end` means the single key `key`; `range_end == "\0"`
/// means every key `>= key`; `range_end == prefix_end(key)` means the prefix `key`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRange {
    pub key: Bytes,
    pub range_end: Bytes,
}

impl KeyRange {
    pub fn single(key: impl Into<Bytes>) -> Self {
        Self {
            key: key.into(),
            range_end: Bytes::new(),
        }
    }

    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let key: Bytes = prefix.into();
        let range_end = prefix_end(&key);
        Self { key, range_end }
    }

    pub fn between(key: impl Into<Bytes>, range_end: impl Into<Bytes>) -> Self {
        Self {
            key: key.into(),
            range_end: range_end.into(),
        }
    }

    /// Whether `k` falls inside this range.
    pub fn contains(&self, k: &[u8]) -> bool {
        if self.range_end.is_empty() {
            return k == &self.key[..];
        }
        if k < &self.key[..] {
            return false;
        }
        if self.range_end.as_ref() == b"\0" {
            return true;
        }
        k < &self.range_end[..]
    }

    pub fn is_single(&self) -> bool {
        self.range_end.is_empty()
    }
}

/// The smallest key greater than every key that starts with `prefix` (etcd's
/// `GetPrefixRangeEnd`). An all-`0xff` or empty prefix maps to `"\0"`, i.e. "to the end".
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRequest {
    pub range: KeyRange,
    /// Maximum number of keys returned; 0 means no limit.
    pub limit: i64,
    /// Read at this revision; `<= 0` means the latest.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    /// Serve from the local member without a read-index round (may be stale on followers).
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

impl RangeRequest {
    pub fn key(key: impl Into<Bytes>) -> Self {
        Self {
            range: KeyRange::single(key),
            ..Default::default()
        }
    }
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        Self {
            range: KeyRange::prefix(prefix),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeResponse {
    /// Store revision the read was served at.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// More keys matched than `limit` allowed.
    pub more: bool,
    /// Number of keys in the range (ignoring `limit`).
    pub count: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRequest {
    pub key: Bytes,
    pub value: Bytes,
    pub lease: i64,
    pub prev_kv: bool,
    /// Keep the current value (error if the key does not exist).
    pub ignore_value: bool,
    /// Keep the current lease (error if the key does not exist).
    pub ignore_lease: bool,
}

impl PutRequest {
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutResponse {
    pub revision: i64,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeResponse {
    pub revision: i64,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a [`Compare`] looks at, with the operand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Bytes),
    Lease(i64),
}

/// One guard of a transaction. Over a range (`range_end` set) every key must satisfy it.
/// A missing key has version, create and mod revision 0, lease 0, and fails every value
/// compare (etcd's rule).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub range: KeyRange,
    pub result: CompareResult,
    pub target: CompareTarget,
}

impl Compare {
    pub fn mod_revision(key: impl Into<Bytes>, result: CompareResult, rev: i64) -> Self {
        Self {
            range: KeyRange::single(key),
            result,
            target: CompareTarget::ModRevision(rev),
        }
    }
    pub fn version(key: impl Into<Bytes>, result: CompareResult, v: i64) -> Self {
        Self {
            range: KeyRange::single(key),
            result,
            target: CompareTarget::Version(v),
        }
    }
    pub fn create_revision(key: impl Into<Bytes>, result: CompareResult, rev: i64) -> Self {
        Self {
            range: KeyRange::single(key),
            result,
            target: CompareTarget::CreateRevision(rev),
        }
    }
    pub fn value(key: impl Into<Bytes>, result: CompareResult, v: impl Into<Bytes>) -> Self {
        Self {
            range: KeyRange::single(key),
            result,
            target: CompareTarget::Value(v.into()),
        }
    }
    pub fn lease(key: impl Into<Bytes>, result: CompareResult, lease: i64) -> Self {
        Self {
            range: KeyRange::single(key),
            result,
            target: CompareTarget::Lease(lease),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOpResponse {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResponse {
    /// Store revision after the transaction (unchanged if it wrote nothing).
    pub revision: i64,
    pub succeeded: bool,
    pub responses: Vec<TxnOpResponse>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchFilters {
    pub no_put: bool,
    pub no_delete: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    pub range: KeyRange,
    /// First revision to deliver (inclusive); `<= 0` means "from the next write".
    pub start_revision: i64,
    pub prev_kv: bool,
    /// Send an empty batch (a progress notification) when idle for the progress interval.
    pub progress_notify: bool,
    pub filters: WatchFilters,
}

/// A batch delivered on a watch stream. Events come in revision order; an empty `events`
/// is a progress notification: every later event has a revision greater than `revision`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchBatch {
    pub revision: i64,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub id: i64,
    pub ttl: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTimeToLive {
    pub id: i64,
    /// Remaining seconds; -1 if the lease has expired or does not exist.
    pub ttl: i64,
    pub granted_ttl: i64,
    pub keys: Vec<Bytes>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    pub version: String,
    pub revision: i64,
    pub compact_revision: i64,
    pub db_size: i64,
    pub member_id: u64,
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub is_learner: bool,
    /// The size the quota is held to (see [`crate::quota`]); 0: not reported.
    pub size_in_use: i64,
    /// The size quota (`--quota-backend-bytes`); 0: not reported.
    pub quota_bytes: i64,
    /// Active alarms.
    pub alarms: Vec<Alarm>,
}

/// What an alarm is about (etcd's `AlarmType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmKind {
    /// The store reached its size quota: writes that add data are refused until the
    /// alarm is disarmed (etcd's `NOSPACE`).
    NoSpace,
    /// A member found its data corrupt (etcd's `CORRUPT`; never raised by Lattice, kept
    /// so that etcd's alarm API maps one to one).
    Corrupt,
}

impl AlarmKind {
    /// etcd's name for it (`etcdctl alarm list` prints it).
    pub fn etcd_name(self) -> &'static str {
        match self {
            AlarmKind::NoSpace => "NOSPACE",
            AlarmKind::Corrupt => "CORRUPT",
        }
    }
}

/// An alarm raised by a member (etcd's `AlarmMember`). Alarms are replicated state: raised
/// and disarmed through the log, the same on every member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Alarm {
    pub member: u64,
    pub kind: AlarmKind,
}

impl std::fmt::Display for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memberID:{} alarm:{}",
            self.member,
            self.kind.etcd_name()
        )
    }
}

/// Raise or disarm (etcd's `AlarmRequest.AlarmAction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlarmAction {
    Activate,
    Deactivate,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_matches_etcd() {
        assert_eq!(prefix_end(b"abc"), Bytes::from_static(b"abd"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff\xff"), Bytes::from_static(b"\0"));
        assert_eq!(prefix_end(b""), Bytes::from_static(b"\0"));
    }

    #[test]
    fn key_range_contains() {
        let r = KeyRange::prefix("/a/");
        assert!(r.contains(b"/a/x"));
        assert!(!r.contains(b"/a0"));
        assert!(!r.contains(b"/b"));
        let all = KeyRange::between("", "\0");
        assert!(all.contains(b"anything"));
        let one = KeyRange::single("k");
        assert!(one.contains(b"k") && !one.contains(b"k2"));
    }
}
