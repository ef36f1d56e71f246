use thiserror::Error;

/// Errors the store reports. Variants map one-to-one onto etcd's error codes
/// (`rpctypes`) so the gRPC facade and the API server can answer precisely.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The requested revision was compacted away; `compact_revision` is the oldest
    /// revision still readable. The API server turns this into 410 Gone.
    #[error("mvcc: required revision has been compacted (compact revision {compact_revision})")]
    Compacted { compact_revision: i64 },
    #[error("mvcc: required revision {requested} is a future revision (current {current})")]
    FutureRevision { requested: i64, current: i64 },
    #[error("key is {size} bytes, over the limit of {limit} bytes (raise --max-key-bytes)")]
    KeyTooLarge { size: usize, limit: usize },
    #[error("key is empty: every operation needs a non-empty key")]
    EmptyKey,
    #[error("value is {size} bytes, over the limit of {limit} bytes (raise --max-value-bytes)")]
    ValueTooLarge { size: usize, limit: usize },
    #[error(
        "request is {size} bytes, over the limit of {limit} bytes (raise --max-request-bytes)"
    )]
    RequestTooLarge { size: usize, limit: usize },
    #[error("transaction has {ops} operations, over the limit of {limit} (raise --max-txn-ops)")]
    TooManyOps { ops: usize, limit: usize },
    #[error("duplicate key given in txn request")]
    DuplicateKey,
    #[error("requested lease not found")]
    LeaseNotFound,
    #[error("lease already exists")]
    LeaseExists,
    #[error("lease TTL {0} is out of range")]
    LeaseTtlOutOfRange(i64),
    #[error("key not found (ignore_value/ignore_lease need an existing key)")]
    KeyNotFound,
    #[error("no leader: {0}")]
    NoLeader(String),
    #[error("store is shutting down")]
    Stopped,
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    #[error("storage I/O: {0}")]
    Io(String),
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    #[error("backend error: {0}")]
    Backend(String),
    /// The store is at its size quota and its NOSPACE alarm is raised: writes that add
    /// data are refused until space is freed and the alarm disarmed ([`crate::quota`]).
    /// `quota_bytes` is the quota of the member that refused (0: not known there). The API
    /// server turns this into 507 Insufficient Storage.
    #[error("{}", no_space(*quota_bytes))]
    NoSpace { quota_bytes: u64 },
    /// The caller's identity may not do this (a Raft peer asking for a membership change
    /// it may not make, ...).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
}

fn no_space(quota: u64) -> String {
    let quota = if quota > 0 {
        format!("its size quota of {quota} bytes (--quota-backend-bytes)")
    } else {
        "its size quota (--quota-backend-bytes)".to_string()
    };
    format!(
        "mvcc: database space exceeded: the store reached {quota} and refuses writes that add \
         data (NOSPACE alarm); free space by deleting objects and compacting the history, \
         then disarm the alarm with `etcdctl alarm disarm` (or raise the quota)"
    )
}

pub type StoreResult<T> = Result<T, StoreError>;
