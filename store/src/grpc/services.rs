//! KV, Lease, Maintenance and Cluster services of the facade.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use etcd_client::proto::*;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::convert::*;
use super::ServerInfo;
use crate::backend::KvBackend;
use crate::error::StoreError;
use crate::types::{AlarmAction, AlarmKind, KeyRange, RangeRequest};

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// State shared by every service of one facade.
pub(crate) struct Shared {
    pub backend: Arc<dyn KvBackend>,
    pub info: ServerInfo,
    /// Last raft term seen in a status report, stamped on every header.
    raft_term: AtomicU64,
}

impl Shared {
    pub fn new(backend: Arc<dyn KvBackend>, info: ServerInfo) -> Self {
        Self {
            backend,
            info,
            raft_term: AtomicU64::new(0),
        }
    }

    pub fn header(&self) -> HeaderTemplate {
        let raft_term = self
            .info
            .membership
            .as_ref()
            .and_then(|m| m.raft_term())
            .unwrap_or_else(|| self.raft_term.load(Ordering::Relaxed));
        HeaderTemplate {
            cluster_id: self.info.cluster_id,
            member_id: self.info.member_id,
            raft_term,
        }
    }

    /// Read the raft term from the backend's status.
    pub async fn refresh_term(&self) {
        match self.backend.status().await {
            Ok(s) => self.note_term(s.raft_term),
            Err(e) => tracing::debug!(error = %e, "etcd facade: no status for the raft term"),
        }
    }

    /// The store's current revision, for responses of calls that do not report one
    /// (leases, maintenance, cluster). A serializable count-only read of one key.
    pub async fn current_revision(&self) -> Result<i64, Status> {
        let req = RangeRequest {
            range: KeyRange::single(&b"\0"[..]),
            serializable: true,
            count_only: true,
            ..Default::default()
        };
        Ok(self
            .backend
            .range(req)
            .await
            .map_err(|e| log_err("revision", e))?
            .revision)
    }

    fn note_term(&self, term: u64) {
        if term != 0 {
            self.raft_term.store(term, Ordering::Relaxed);
        }
    }
}

/// Map a store error to a status, logging the ones that are not the caller's fault.
pub(crate) fn log_err(op: &str, e: StoreError) -> Status {
    match &e {
        StoreError::Io(_)
        | StoreError::Corrupt(_)
        | StoreError::Backend(_)
        | StoreError::Stopped
        | StoreError::NoLeader(_) => tracing::warn!(op, error = %e, "etcd facade: store error"),
        _ => tracing::debug!(op, error = %e, "etcd facade: request rejected"),
    }
    status_from_store_error(&e)
}

/// etcd's `MaxLeaseTTL`.
const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// Refuse writes larger than `--max-request-bytes`, as etcd does before proposing them.
fn check_size<M: prost::Message>(info: &ServerInfo, msg: &M) -> Result<(), Status> {
    if msg.encoded_len() > info.max_request_bytes {
        return Err(Status::invalid_argument(MSG_REQUEST_TOO_LARGE));
    }
    Ok(())
}

// -------------------------------------------------------------------------------- KV --

pub(crate) struct KvSvc(pub Arc<Shared>);

#[tonic::async_trait]
impl PbKvService for KvSvc {
    async fn range(
        &self,
        request: Request<PbRangeRequest>,
    ) -> Result<Response<PbRangeResponse>, Status> {
        let req = range_from_pb(request.into_inner())?;
        let resp = self
            .0
            .backend
            .range(req)
            .await
            .map_err(|e| log_err("range", e))?;
        Ok(Response::new(range_resp_to_pb(resp, &self.0.header())))
    }

    type RangeStreamStream = BoxStream<PbRangeStreamResponse>;

    async fn range_stream(
        &self,
        _request: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented(
            "RangeStream is not supported; use Range with limit",
        ))
    }

    async fn put(&self, request: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let p = request.into_inner();
        check_size(&self.0.info, &p)?;
        let req = put_from_pb(p)?;
        let resp = self
            .0
            .backend
            .put(req)
            .await
            .map_err(|e| log_err("put", e))?;
        Ok(Response::new(put_resp_to_pb(resp, &self.0.header())))
    }

    async fn delete_range(
        &self,
        request: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        let d = request.into_inner();
        check_size(&self.0.info, &d)?;
        let req = delete_from_pb(d)?;
        let resp = self
            .0
            .backend
            .delete_range(req)
            .await
            .map_err(|e| log_err("delete", e))?;
        Ok(Response::new(delete_resp_to_pb(resp, &self.0.header())))
    }

    async fn txn(&self, request: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let limits = TxnLimits {
            max_txn_ops: self.0.info.max_txn_ops,
        };
        let t = request.into_inner();
        check_size(&self.0.info, &t)?;
        let req = txn_from_pb(t, limits)?;
        let resp = self
            .0
            .backend
            .txn(req)
            .await
            .map_err(|e| log_err("txn", e))?;
        Ok(Response::new(txn_resp_to_pb(resp, &self.0.header())))
    }

    async fn compact(
        &self,
        request: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        let req = request.into_inner();
        let rev = self
            .0
            .backend
            .compact(req.revision)
            .await
            .map_err(|e| log_err("compact", e))?;
        Ok(Response::new(PbCompactionResponse {
            header: self.0.header().at(rev),
        }))
    }
}

// ----------------------------------------------------------------------------- Lease --

pub(crate) struct LeaseSvc(pub Arc<Shared>);

#[tonic::async_trait]
impl PbLeaseService for LeaseSvc {
    async fn lease_grant(
        &self,
        request: Request<PbLeaseGrantRequest>,
    ) -> Result<Response<PbLeaseGrantResponse>, Status> {
        let req = request.into_inner();
        if req.ttl > MAX_LEASE_TTL {
            return Err(Status::out_of_range(MSG_LEASE_TTL_TOO_LARGE));
        }
        let g = self
            .0
            .backend
            .lease_grant(req.id, req.ttl)
            .await
            .map_err(|e| log_err("lease_grant", e))?;
        let rev = self.0.current_revision().await?;
        Ok(Response::new(PbLeaseGrantResponse {
            header: self.0.header().at(rev),
            id: g.id,
            ttl: g.ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<PbLeaseRevokeRequest>,
    ) -> Result<Response<PbLeaseRevokeResponse>, Status> {
        let req = request.into_inner();
        let rev = self
            .0
            .backend
            .lease_revoke(req.id)
            .await
            .map_err(|e| log_err("lease_revoke", e))?;
        let rev = if rev > 0 {
            rev
        } else {
            self.0.current_revision().await?
        };
        Ok(Response::new(PbLeaseRevokeResponse {
            header: self.0.header().at(rev),
        }))
    }

    type LeaseKeepAliveStream = BoxStream<PbLeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let mut inbound = request.into_inner();
        let shared = self.0.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<PbLeaseKeepAliveResponse, Status>>(16);
        tokio::spawn(async move {
            loop {
                let req = match inbound.next().await {
                    None => break,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "lease keep-alive stream ended by client");
                        break;
                    }
                    Some(Ok(r)) => r,
                };
                let ttl = match shared.backend.lease_keep_alive(req.id).await {
                    Ok(ttl) => ttl,
                    // etcd answers an unknown lease with TTL 0 and keeps the stream open.
                    Err(StoreError::LeaseNotFound) => 0,
                    Err(e) => {
                        let _ = tx.send(Err(log_err("lease_keep_alive", e))).await;
                        break;
                    }
                };
                let rev = match shared.current_revision().await {
                    Ok(r) => r,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                let resp = PbLeaseKeepAliveResponse {
                    header: shared.header().at(rev),
                    id: req.id,
                    ttl,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<PbLeaseTimeToLiveRequest>,
    ) -> Result<Response<PbLeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        let rev = self.0.current_revision().await?;
        let header = self.0.header().at(rev);
        match self.0.backend.lease_time_to_live(req.id, req.keys).await {
            Ok(t) => Ok(Response::new(PbLeaseTimeToLiveResponse {
                header,
                id: t.id,
                ttl: t.ttl,
                granted_ttl: t.granted_ttl,
                keys: t.keys.into_iter().map(|k| k.to_vec()).collect(),
            })),
            // etcd reports a missing lease as TTL -1, not as an error.
            Err(StoreError::LeaseNotFound) => Ok(Response::new(PbLeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            })),
            Err(e) => Err(log_err("lease_time_to_live", e)),
        }
    }

    async fn lease_leases(
        &self,
        _request: Request<PbLeaseLeasesRequest>,
    ) -> Result<Response<PbLeaseLeasesResponse>, Status> {
        let ids = self
            .0
            .backend
            .lease_leases()
            .await
            .map_err(|e| log_err("lease_leases", e))?;
        let rev = self.0.current_revision().await?;
        Ok(Response::new(PbLeaseLeasesResponse {
            header: self.0.header().at(rev),
            leases: ids.into_iter().map(|id| PbLeaseStatus { id }).collect(),
        }))
    }
}

// ----------------------------------------------------------------------- Maintenance --

pub(crate) struct MaintenanceSvc(pub Arc<Shared>);

// etcd's `AlarmRequest.AlarmAction` and `AlarmType` numbers.
const ALARM_ACTION_GET: i32 = 0;
const ALARM_ACTION_ACTIVATE: i32 = 1;
const ALARM_ACTION_DEACTIVATE: i32 = 2;
const ALARM_TYPE_NONE: i32 = 0;
const ALARM_TYPE_NOSPACE: i32 = 1;
const ALARM_TYPE_CORRUPT: i32 = 2;

fn alarm_to_pb(a: &crate::types::Alarm) -> PbAlarmMember {
    PbAlarmMember {
        member_id: a.member,
        alarm: match a.kind {
            AlarmKind::NoSpace => ALARM_TYPE_NOSPACE,
            AlarmKind::Corrupt => ALARM_TYPE_CORRUPT,
        },
    }
}

#[tonic::async_trait]
impl PbMaintenanceService for MaintenanceSvc {
    /// etcd's alarm API: GET lists every active alarm; ACTIVATE and DEACTIVATE raise and
    /// disarm one (member and type) through the log, answering with the alarms changed.
    /// (`etcdctl alarm disarm` lists the alarms, then deactivates each.)
    async fn alarm(
        &self,
        request: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
        let req = request.into_inner();
        let alarms = match req.action {
            ALARM_ACTION_GET => self
                .0
                .backend
                .alarms()
                .await
                .map_err(|e| log_err("alarm", e))?,
            ALARM_ACTION_ACTIVATE | ALARM_ACTION_DEACTIVATE => {
                let kind = match req.alarm {
                    ALARM_TYPE_NOSPACE => AlarmKind::NoSpace,
                    ALARM_TYPE_CORRUPT => AlarmKind::Corrupt,
                    ALARM_TYPE_NONE => {
                        // etcd answers a request for no alarm with nothing changed.
                        let rev = self.0.current_revision().await?;
                        return Ok(Response::new(PbAlarmResponse {
                            header: self.0.header().at(rev),
                            alarms: Vec::new(),
                        }));
                    }
                    other => {
                        return Err(Status::invalid_argument(format!(
                            "etcdserver: unknown alarm type {other}"
                        )))
                    }
                };
                let action = if req.action == ALARM_ACTION_ACTIVATE {
                    AlarmAction::Activate
                } else {
                    AlarmAction::Deactivate
                };
                let alarm = crate::types::Alarm {
                    member: req.member_id,
                    kind,
                };
                self.0
                    .backend
                    .alarm(action, alarm)
                    .await
                    .map_err(|e| log_err("alarm", e))?
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "etcdserver: unknown alarm action {other}"
                )))
            }
        };
        let rev = self.0.current_revision().await?;
        Ok(Response::new(PbAlarmResponse {
            header: self.0.header().at(rev),
            alarms: alarms.iter().map(alarm_to_pb).collect(),
        }))
    }

    async fn status(
        &self,
        _request: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        let s = self
            .0
            .backend
            .status()
            .await
            .map_err(|e| log_err("status", e))?;
        self.0.note_term(s.raft_term);
        let info = &self.0.info;
        let version = if s.version.is_empty() {
            info.version.clone()
        } else {
            s.version
        };
        let leader = if s.leader == 0 {
            info.member_id
        } else {
            s.leader
        };
        Ok(Response::new(PbStatusResponse {
            header: self.0.header().at(s.revision),
            version,
            db_size: s.db_size,
            leader,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            // etcd lists active alarms here ("memberID:N alarm:NOSPACE").
            errors: s.alarms.iter().map(|a| a.to_string()).collect(),
            db_size_in_use: if s.size_in_use > 0 {
                s.size_in_use
            } else {
                s.db_size
            },
            is_learner: s.is_learner,
            storage_version: String::new(),
            db_size_quota: s.quota_bytes,
            downgrade_info: None,
        }))
    }

    async fn defragment(
        &self,
        _request: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        Err(Status::unimplemented("Defragment is not supported"))
    }

    async fn hash(
        &self,
        _request: Request<PbHashRequest>,
    ) -> Result<Response<PbHashResponse>, Status> {
        Err(Status::unimplemented("Hash is not supported"))
    }

    async fn hash_kv(
        &self,
        _request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        Err(Status::unimplemented("HashKV is not supported"))
    }

    type SnapshotStream = BoxStream<PbSnapshotResponse>;

    async fn snapshot(
        &self,
        _request: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(Status::unimplemented("Snapshot is not supported"))
    }

    async fn move_leader(
        &self,
        _request: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        Err(Status::unimplemented("MoveLeader is not supported"))
    }

    async fn downgrade(
        &self,
        _request: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        Err(Status::unimplemented("Downgrade is not supported"))
    }
}

// --------------------------------------------------------------------------- Cluster --

pub(crate) struct ClusterSvc(pub Arc<Shared>);

#[tonic::async_trait]
impl PbClusterService for ClusterSvc {
    async fn member_add(
        &self,
        _request: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        Err(Status::unimplemented("MemberAdd is not supported"))
    }

    async fn member_remove(
        &self,
        _request: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        Err(Status::unimplemented("MemberRemove is not supported"))
    }

    async fn member_update(
        &self,
        _request: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        Err(Status::unimplemented("MemberUpdate is not supported"))
    }

    async fn member_list(
        &self,
        _request: Request<PbMemberListRequest>,
    ) -> Result<Response<PbMemberListResponse>, Status> {
        let rev = self.0.current_revision().await?;
        let members = self
            .0
            .info
            .members()
            .into_iter()
            .map(member_to_pb)
            .collect();
        Ok(Response::new(PbMemberListResponse {
            header: self.0.header().at(rev),
            members,
        }))
    }

    async fn member_promote(
        &self,
        _request: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        Err(Status::unimplemented("MemberPromote is not supported"))
    }
}
