//! Conversions between etcd's protobuf messages (as generated inside `etcd-client`) and the
//! store's own types, plus the mapping of [`StoreError`] to and from gRPC statuses.
//!
//! The error messages mirror etcd's `rpctypes` strings so that clients which match on the
//! text (etcdctl, clientv3, and our own [`crate::etcd_backend::EtcdBackend`]) behave the
//! same against the facade as against a real etcd.

use bytes::Bytes;
use etcd_client::proto::{
    PbCompare, PbDeleteRequest, PbDeleteResponse, PbEvent, PbKeyValue, PbPutRequest, PbPutResponse,
    PbRangeRequest, PbRangeResponse, PbResponseHeader, PbResponseOp, PbTargetUnion, PbTxnOpRequest,
    PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp, PbTxnResponse,
};
use tonic::{Code, Status};

use crate::error::StoreError;
use crate::types::*;

// etcd's error strings (api/v3rpc/rpctypes/error.go).
pub(crate) const MSG_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
pub(crate) const MSG_FUTURE_REV: &str = "etcdserver: mvcc: required revision is a future revision";
pub(crate) const MSG_EMPTY_KEY: &str = "etcdserver: key is not provided";
pub(crate) const MSG_KEY_NOT_FOUND: &str = "etcdserver: key not found";
pub(crate) const MSG_TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";
pub(crate) const MSG_DUPLICATE_KEY: &str = "etcdserver: duplicate key given in txn request";
pub(crate) const MSG_REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";
pub(crate) const MSG_LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
pub(crate) const MSG_LEASE_EXISTS: &str = "etcdserver: lease already exists";
pub(crate) const MSG_LEASE_TTL_TOO_LARGE: &str = "etcdserver: too large lease TTL";
pub(crate) const MSG_NO_LEADER: &str = "etcdserver: no leader";
pub(crate) const MSG_STOPPED: &str = "etcdserver: server stopped";
pub(crate) const MSG_CORRUPT: &str = "etcdserver: corrupt cluster";
/// etcd's `ErrGRPCNoSpace`: clients (etcdctl, client-go) recognise it by this text.
pub(crate) const MSG_NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
pub(crate) const MSG_PERMISSION_DENIED: &str = "etcdserver: permission denied";

/// Store error → gRPC status, with etcd's codes and messages.
pub fn status_from_store_error(err: &StoreError) -> Status {
    match err {
        StoreError::Compacted { .. } => Status::out_of_range(MSG_COMPACTED),
        StoreError::FutureRevision { .. } => Status::out_of_range(MSG_FUTURE_REV),
        StoreError::KeyTooLarge { .. }
        | StoreError::ValueTooLarge { .. }
        | StoreError::RequestTooLarge { .. } => Status::invalid_argument(MSG_REQUEST_TOO_LARGE),
        StoreError::EmptyKey => Status::invalid_argument(MSG_EMPTY_KEY),
        StoreError::TooManyOps { .. } => Status::invalid_argument(MSG_TOO_MANY_OPS),
        StoreError::DuplicateKey => Status::invalid_argument(MSG_DUPLICATE_KEY),
        StoreError::LeaseNotFound => Status::not_found(MSG_LEASE_NOT_FOUND),
        StoreError::LeaseExists => Status::failed_precondition(MSG_LEASE_EXISTS),
        StoreError::LeaseTtlOutOfRange(_) => Status::out_of_range(MSG_LEASE_TTL_TOO_LARGE),
        StoreError::KeyNotFound => Status::invalid_argument(MSG_KEY_NOT_FOUND),
        StoreError::NoLeader(_) => Status::unavailable(MSG_NO_LEADER),
        StoreError::Stopped => Status::unavailable(MSG_STOPPED),
        StoreError::Corrupt(_) => Status::data_loss(MSG_CORRUPT),
        StoreError::Io(m) => Status::internal(format!("etcdserver: storage I/O: {m}")),
        StoreError::InvalidArgument(m) => Status::invalid_argument(format!("etcdserver: {m}")),
        StoreError::Backend(m) => Status::unknown(format!("etcdserver: {m}")),
        StoreError::NoSpace { .. } => Status::resource_exhausted(MSG_NO_SPACE),
        StoreError::PermissionDenied(m) => {
            Status::permission_denied(format!("{MSG_PERMISSION_DENIED}: {m}"))
        }
    }
}

impl From<StoreError> for Status {
    fn from(err: StoreError) -> Self {
        status_from_store_error(&err)
    }
}

/// The part of a gRPC status that can be mapped without extra round trips. Compacted and
/// future-revision errors carry no revisions on etcd's wire; the caller fills them in.
pub fn store_error_from_status(status: &Status) -> StoreError {
    let msg = status.message();
    let has = |s: &str| msg.contains(s.trim_start_matches("etcdserver: "));
    if has(MSG_COMPACTED) {
        StoreError::Compacted {
            compact_revision: 0,
        }
    } else if has(MSG_FUTURE_REV) {
        StoreError::FutureRevision {
            requested: 0,
            current: 0,
        }
    } else if has(MSG_LEASE_NOT_FOUND) {
        StoreError::LeaseNotFound
    } else if has(MSG_LEASE_EXISTS) {
        StoreError::LeaseExists
    } else if has(MSG_LEASE_TTL_TOO_LARGE) {
        StoreError::LeaseTtlOutOfRange(0)
    } else if has(MSG_EMPTY_KEY) {
        StoreError::EmptyKey
    } else if has(MSG_KEY_NOT_FOUND) {
        StoreError::KeyNotFound
    } else if has(MSG_TOO_MANY_OPS) {
        StoreError::TooManyOps { ops: 0, limit: 0 }
    } else if has(MSG_DUPLICATE_KEY) {
        StoreError::DuplicateKey
    } else if has(MSG_REQUEST_TOO_LARGE) {
        StoreError::RequestTooLarge { size: 0, limit: 0 }
    } else if has(MSG_NO_LEADER) {
        StoreError::NoLeader(msg.to_string())
    } else if has(MSG_STOPPED) {
        StoreError::Stopped
    } else if has(MSG_CORRUPT) {
        StoreError::Corrupt(msg.to_string())
    } else if has(MSG_NO_SPACE) {
        StoreError::NoSpace { quota_bytes: 0 }
    } else if status.code() == Code::PermissionDenied {
        StoreError::PermissionDenied(msg.to_string())
    } else {
        match status.code() {
            Code::InvalidArgument => StoreError::InvalidArgument(msg.to_string()),
            Code::DataLoss => StoreError::Corrupt(msg.to_string()),
            _ => StoreError::Backend(format!("{:?}: {msg}", status.code())),
        }
    }
}

// ---------------------------------------------------------------------------------------
// protobuf → store types (requests arriving at the facade, responses arriving from etcd)
// ---------------------------------------------------------------------------------------

pub fn kv_from_pb(kv: PbKeyValue) -> KeyValue {
    KeyValue {
        key: Bytes::from(kv.key),
        value: Bytes::from(kv.value),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

pub fn kv_to_pb(kv: KeyValue) -> PbKeyValue {
    PbKeyValue {
        key: kv.key.to_vec(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value.to_vec(),
        lease: kv.lease,
    }
}

pub fn event_to_pb(ev: Event) -> PbEvent {
    PbEvent {
        r#type: match ev.kind {
            EventType::Put => 0,
            EventType::Delete => 1,
        },
        kv: Some(kv_to_pb(ev.kv)),
        prev_kv: ev.prev_kv.map(kv_to_pb),
    }
}

pub fn event_from_pb(ev: PbEvent) -> Result<Event, StoreError> {
    let kind = match ev.r#type {
        0 => EventType::Put,
        1 => EventType::Delete,
        other => return Err(StoreError::Backend(format!("unknown event type {other}"))),
    };
    Ok(Event {
        kind,
        kv: ev.kv.map(kv_from_pb).unwrap_or_default(),
        prev_kv: ev.prev_kv.map(kv_from_pb),
    })
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(format!("etcdserver: {}", msg.into()))
}

pub fn sort_order_from_i32(v: i32) -> Result<SortOrder, Status> {
    Ok(match v {
        0 => SortOrder::None,
        1 => SortOrder::Ascend,
        2 => SortOrder::Descend,
        other => return Err(invalid(format!("invalid sort order {other}"))),
    })
}

pub fn sort_target_from_i32(v: i32) -> Result<SortTarget, Status> {
    Ok(match v {
        0 => SortTarget::Key,
        1 => SortTarget::Version,
        2 => SortTarget::Create,
        3 => SortTarget::Mod,
        4 => SortTarget::Value,
        other => return Err(invalid(format!("invalid sort target {other}"))),
    })
}

fn require_key(key: &[u8]) -> Result<(), Status> {
    if key.is_empty() {
        return Err(Status::invalid_argument(MSG_EMPTY_KEY));
    }
    Ok(())
}

pub fn range_from_pb(r: PbRangeRequest) -> Result<RangeRequest, Status> {
    require_key(&r.key)?;
    Ok(RangeRequest {
        range: KeyRange::between(r.key, r.range_end),
        // etcd treats a negative limit as "no limit".
        limit: r.limit.max(0),
        revision: r.revision,
        sort_order: sort_order_from_i32(r.sort_order)?,
        sort_target: sort_target_from_i32(r.sort_target)?,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

pub fn put_from_pb(p: PbPutRequest) -> Result<PutRequest, Status> {
    require_key(&p.key)?;
    Ok(PutRequest {
        key: Bytes::from(p.key),
        value: Bytes::from(p.value),
        lease: p.lease,
        prev_kv: p.prev_kv,
        ignore_value: p.ignore_value,
        ignore_lease: p.ignore_lease,
    })
}

pub fn delete_from_pb(d: PbDeleteRequest) -> Result<DeleteRangeRequest, Status> {
    require_key(&d.key)?;
    Ok(DeleteRangeRequest {
        range: KeyRange::between(d.key, d.range_end),
        prev_kv: d.prev_kv,
    })
}

pub fn compare_from_pb(c: PbCompare) -> Result<Compare, Status> {
    require_key(&c.key)?;
    let result = match c.result {
        0 => CompareResult::Equal,
        1 => CompareResult::Greater,
        2 => CompareResult::Less,
        3 => CompareResult::NotEqual,
        other => return Err(invalid(format!("invalid compare result {other}"))),
    };
    // The target enum says which union member is meant; a missing union member is the
    // zero value of that type (proto3 default), as etcd treats it.
    let target = match (c.target, c.target_union) {
        (0, Some(PbTargetUnion::Version(v))) => CompareTarget::Version(v),
        (0, None) => CompareTarget::Version(0),
        (1, Some(PbTargetUnion::CreateRevision(v))) => CompareTarget::CreateRevision(v),
        (1, None) => CompareTarget::CreateRevision(0),
        (2, Some(PbTargetUnion::ModRevision(v))) => CompareTarget::ModRevision(v),
        (2, None) => CompareTarget::ModRevision(0),
        (3, Some(PbTargetUnion::Value(v))) => CompareTarget::Value(Bytes::from(v)),
        (3, None) => CompareTarget::Value(Bytes::new()),
        (4, Some(PbTargetUnion::Lease(v))) => CompareTarget::Lease(v),
        (4, None) => CompareTarget::Lease(0),
        (t @ 0..=4, Some(_)) => {
            return Err(invalid(format!(
                "compare target {t} does not match its operand"
            )))
        }
        (other, _) => return Err(invalid(format!("invalid compare target {other}"))),
    };
    Ok(Compare {
        range: KeyRange::between(c.key, c.range_end),
        result,
        target,
    })
}

#[cfg(test)]
pub fn compare_to_pb(c: &Compare) -> PbCompare {
    let result = match c.result {
        CompareResult::Equal => 0,
        CompareResult::Greater => 1,
        CompareResult::Less => 2,
        CompareResult::NotEqual => 3,
    };
    let (target, union) = match &c.target {
        CompareTarget::Version(v) => (0, PbTargetUnion::Version(*v)),
        CompareTarget::CreateRevision(v) => (1, PbTargetUnion::CreateRevision(*v)),
        CompareTarget::ModRevision(v) => (2, PbTargetUnion::ModRevision(*v)),
        CompareTarget::Value(v) => (3, PbTargetUnion::Value(v.to_vec())),
        CompareTarget::Lease(v) => (4, PbTargetUnion::Lease(*v)),
    };
    PbCompare {
        result,
        target,
        key: c.range.key.to_vec(),
        range_end: c.range.range_end.to_vec(),
        target_union: Some(union),
    }
}

/// Limits applied while converting an incoming transaction.
#[derive(Clone, Copy, Debug)]
pub struct TxnLimits {
    /// Maximum operations in one branch list (etcd's `--max-txn-ops`, default 128).
    pub max_txn_ops: usize,
}

pub fn txn_from_pb(t: PbTxnRequest, limits: TxnLimits) -> Result<TxnRequest, Status> {
    let n = t.compare.len().max(t.success.len()).max(t.failure.len());
    if n > limits.max_txn_ops {
        return Err(Status::invalid_argument(MSG_TOO_MANY_OPS));
    }
    let compare = t
        .compare
        .into_iter()
        .map(compare_from_pb)
        .collect::<Result<Vec<_>, _>>()?;
    let ops = |ops: Vec<PbTxnRequestOp>| -> Result<Vec<TxnOp>, Status> {
        ops.into_iter()
            .map(|op| txn_op_from_pb(op, limits))
            .collect()
    };
    Ok(TxnRequest {
        compare,
        success: ops(t.success)?,
        failure: ops(t.failure)?,
    })
}

fn txn_op_from_pb(op: PbTxnRequestOp, limits: TxnLimits) -> Result<TxnOp, Status> {
    match op.request {
        Some(PbTxnOpRequest::RequestRange(r)) => Ok(TxnOp::Range(range_from_pb(r)?)),
        Some(PbTxnOpRequest::RequestPut(p)) => Ok(TxnOp::Put(put_from_pb(p)?)),
        Some(PbTxnOpRequest::RequestDeleteRange(d)) => Ok(TxnOp::DeleteRange(delete_from_pb(d)?)),
        Some(PbTxnOpRequest::RequestTxn(t)) => Ok(TxnOp::Txn(txn_from_pb(t, limits)?)),
        None => Err(invalid("txn operation has no request")),
    }
}

// ---------------------------------------------------------------------------------------
// store types → protobuf responses (the facade answering)
// ---------------------------------------------------------------------------------------

/// Builds response headers: the same cluster/member/term on every response, the revision
/// varying.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeaderTemplate {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
}

impl HeaderTemplate {
    pub fn at(&self, revision: i64) -> Option<PbResponseHeader> {
        Some(PbResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        })
    }
}

pub fn range_resp_to_pb(r: RangeResponse, h: &HeaderTemplate) -> PbRangeResponse {
    PbRangeResponse {
        header: h.at(r.revision),
        kvs: r.kvs.into_iter().map(kv_to_pb).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_resp_to_pb(r: PutResponse, h: &HeaderTemplate) -> PbPutResponse {
    PbPutResponse {
        header: h.at(r.revision),
        prev_kv: r.prev_kv.map(kv_to_pb),
    }
}

pub fn delete_resp_to_pb(r: DeleteRangeResponse, h: &HeaderTemplate) -> PbDeleteResponse {
    PbDeleteResponse {
        header: h.at(r.revision),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(kv_to_pb).collect(),
    }
}

pub fn txn_resp_to_pb(r: TxnResponse, h: &HeaderTemplate) -> PbTxnResponse {
    let responses = r
        .responses
        .into_iter()
        .map(|op| PbResponseOp {
            response: Some(match op {
                TxnOpResponse::Range(x) => PbTxnOpResponse::ResponseRange(range_resp_to_pb(x, h)),
                TxnOpResponse::Put(x) => PbTxnOpResponse::ResponsePut(put_resp_to_pb(x, h)),
                TxnOpResponse::DeleteRange(x) => {
                    PbTxnOpResponse::ResponseDeleteRange(delete_resp_to_pb(x, h))
                }
                TxnOpResponse::Txn(x) => PbTxnOpResponse::ResponseTxn(txn_resp_to_pb(x, h)),
            }),
        })
        .collect();
    PbTxnResponse {
        header: h.at(r.revision),
        succeeded: r.succeeded,
        responses,
    }
}

// ---------------------------------------------------------------------------------------
// protobuf responses → store types (the etcd backend reading etcd's answers)
// ---------------------------------------------------------------------------------------

fn header_rev(h: &Option<PbResponseHeader>) -> i64 {
    h.as_ref().map(|h| h.revision).unwrap_or_default()
}

pub fn range_resp_from_pb(r: PbRangeResponse) -> RangeResponse {
    RangeResponse {
        revision: header_rev(&r.header),
        kvs: r.kvs.into_iter().map(kv_from_pb).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_resp_from_pb(r: PbPutResponse) -> PutResponse {
    PutResponse {
        revision: header_rev(&r.header),
        prev_kv: r.prev_kv.map(kv_from_pb),
    }
}

pub fn delete_resp_from_pb(r: PbDeleteResponse) -> DeleteRangeResponse {
    DeleteRangeResponse {
        revision: header_rev(&r.header),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(kv_from_pb).collect(),
    }
}

pub fn txn_resp_from_pb(r: PbTxnResponse) -> Result<TxnResponse, StoreError> {
    let mut responses = Vec::with_capacity(r.responses.len());
    for op in r.responses {
        responses.push(match op.response {
            Some(PbTxnOpResponse::ResponseRange(x)) => TxnOpResponse::Range(range_resp_from_pb(x)),
            Some(PbTxnOpResponse::ResponsePut(x)) => TxnOpResponse::Put(put_resp_from_pb(x)),
            Some(PbTxnOpResponse::ResponseDeleteRange(x)) => {
                TxnOpResponse::DeleteRange(delete_resp_from_pb(x))
            }
            Some(PbTxnOpResponse::ResponseTxn(x)) => TxnOpResponse::Txn(txn_resp_from_pb(x)?),
            None => {
                return Err(StoreError::Backend(
                    "txn response op without a response".into(),
                ))
            }
        });
    }
    Ok(TxnResponse {
        revision: header_rev(&r.header),
        succeeded: r.succeeded,
        responses,
    })
}

pub fn member_to_pb(m: Member) -> etcd_client::proto::PbMember {
    etcd_client::proto::PbMember {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_through_status() {
        let cases = [
            StoreError::Compacted {
                compact_revision: 5,
            },
            StoreError::FutureRevision {
                requested: 9,
                current: 3,
            },
            StoreError::EmptyKey,
            StoreError::LeaseNotFound,
            StoreError::LeaseExists,
            StoreError::DuplicateKey,
            StoreError::KeyNotFound,
            StoreError::Stopped,
        ];
        for e in cases {
            let back = store_error_from_status(&status_from_store_error(&e));
            assert_eq!(
                std::mem::discriminant(&back),
                std::mem::discriminant(&e),
                "{e:?}"
            );
        }
    }

    #[test]
    fn compare_rejects_bad_enums() {
        let c = PbCompare {
            result: 9,
            target: 0,
            key: b"k".to_vec(),
            range_end: vec![],
            target_union: None,
        };
        assert_eq!(
            compare_from_pb(c).err().map(|s| s.code()),
            Some(Code::InvalidArgument)
        );
        let c = PbCompare {
            result: 0,
            target: 3,
            key: b"k".to_vec(),
            range_end: vec![],
            target_union: Some(PbTargetUnion::Version(1)),
        };
        assert_eq!(
            compare_from_pb(c).err().map(|s| s.code()),
            Some(Code::InvalidArgument)
        );
    }

    #[test]
    fn nested_txn_round_trip() {
        let inner = TxnRequest {
            compare: vec![Compare::value("a", CompareResult::Equal, "1")],
            success: vec![TxnOp::Put(PutRequest::new("b", "2"))],
            failure: vec![],
        };
        let pb = PbTxnRequest {
            compare: inner.compare.iter().map(compare_to_pb).collect(),
            success: vec![PbTxnRequestOp {
                request: Some(PbTxnOpRequest::RequestPut(PbPutRequest {
                    key: b"b".to_vec(),
                    value: b"2".to_vec(),
                    ..Default::default()
                })),
            }],
            failure: vec![],
        };
        let outer = PbTxnRequest {
            compare: vec![],
            success: vec![PbTxnRequestOp {
                request: Some(PbTxnOpRequest::RequestTxn(pb)),
            }],
            failure: vec![],
        };
        let got = txn_from_pb(outer, TxnLimits { max_txn_ops: 128 }).expect("valid txn");
        assert_eq!(got.success, vec![TxnOp::Txn(inner)]);
    }
}
