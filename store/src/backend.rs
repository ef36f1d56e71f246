//! The one interface the API server and controllers use to reach storage.
//!
//! Two implementations: [`crate::EmbeddedStore`] (default; our own MVCC engine) and the
//! external etcd backend. Both pass the same conformance suite (`tests/conformance.rs`).

use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

use crate::error::StoreResult;
use crate::types::*;

/// A watch: batches in revision order, ending only when the watch is cancelled by the
/// store (compaction overtook it: `Err(Compacted)`) or the store stops. Dropping it
/// cancels the watch.
pub type WatchStream = Pin<Box<dyn Stream<Item = StoreResult<WatchBatch>> + Send>>;

#[async_trait]
pub trait KvBackend: Send + Sync + 'static {
    /// Range read. Linearizable unless `req.serializable`.
    async fn range(&self, req: RangeRequest) -> StoreResult<RangeResponse>;

    /// Atomic transaction: all compares hold → `success` ops, else `failure` ops; one
    /// revision for all its writes.
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse>;

    async fn put(&self, req: PutRequest) -> StoreResult<PutResponse> {
        let resp = self
            .txn(TxnRequest {
                compare: vec![],
                success: vec![TxnOp::Put(req)],
                failure: vec![],
            })
            .await?;
        match resp.responses.into_iter().next() {
            Some(TxnOpResponse::Put(p)) => Ok(p),
            other => Err(crate::StoreError::Backend(format!(
                "unexpected put response {other:?}"
            ))),
        }
    }

    async fn delete_range(&self, req: DeleteRangeRequest) -> StoreResult<DeleteRangeResponse> {
        let resp = self
            .txn(TxnRequest {
                compare: vec![],
                success: vec![TxnOp::DeleteRange(req)],
                failure: vec![],
            })
            .await?;
        match resp.responses.into_iter().next() {
            Some(TxnOpResponse::DeleteRange(d)) => Ok(d),
            other => Err(crate::StoreError::Backend(format!(
                "unexpected delete response {other:?}"
            ))),
        }
    }

    /// Watch `req.range` from `req.start_revision` (inclusive): history first, then live
    /// events, with no gap and no duplicate. A compacted start revision fails with
    /// `StoreError::Compacted`.
    async fn watch(&self, req: WatchRequest) -> StoreResult<WatchStream>;

    /// Grant a lease with `ttl` seconds; `id == 0` lets the store pick the ID.
    async fn lease_grant(&self, id: i64, ttl: i64) -> StoreResult<LeaseGrant>;
    /// Revoke a lease and delete every key attached to it.
    async fn lease_revoke(&self, id: i64) -> StoreResult<i64>;
    /// Renew a lease; returns its TTL.
    async fn lease_keep_alive(&self, id: i64) -> StoreResult<i64>;
    /// Renew many leases at once (node heartbeats: one call per batch); for each, its
    /// TTL, or `None` when it does not exist. Backends override this to take their locks
    /// once; the default renews one at a time.
    async fn lease_keep_alive_many(&self, ids: &[i64]) -> StoreResult<Vec<Option<i64>>> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            match self.lease_keep_alive(id).await {
                Ok(ttl) => out.push(Some(ttl)),
                Err(crate::StoreError::LeaseNotFound) => out.push(None),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
    async fn lease_time_to_live(&self, id: i64, keys: bool) -> StoreResult<LeaseTimeToLive>;
    async fn lease_leases(&self) -> StoreResult<Vec<i64>>;

    /// Discard history below `revision` (etcd semantics: `revision` itself stays readable
    /// and watchable, and the latest version of each key stays).
    async fn compact(&self, revision: i64) -> StoreResult<i64>;

    async fn status(&self) -> StoreResult<StoreStatus>;

    /// The active alarms (etcd's `Maintenance.Alarm` GET); see [`crate::quota`].
    async fn alarms(&self) -> StoreResult<Vec<Alarm>> {
        Ok(Vec::new())
    }

    /// Raise or disarm an alarm through the log (etcd's `Maintenance.Alarm` ACTIVATE and
    /// DEACTIVATE); returns the alarms it changed.
    async fn alarm(&self, action: AlarmAction, alarm: Alarm) -> StoreResult<Vec<Alarm>> {
        let _ = (action, alarm);
        Err(crate::StoreError::InvalidArgument(
            "this store has no alarms".into(),
        ))
    }

    /// Most operations one transaction may carry (the embedded stores count compares plus
    /// the ops of the larger branch, nested transactions included: [`crate::mvcc::txn_ops`]);
    /// longer transactions fail with `TooManyOps`. The embedded stores check it on the
    /// member that receives the transaction, before proposing it, so members may differ.
    /// Writers that batch (the scheduler's bindings) split their batches by it. etcd's
    /// default is 128.
    fn max_txn_ops(&self) -> usize {
        crate::mvcc::Limits::default().max_txn_ops
    }

    /// Convenience: read one key at the latest revision.
    async fn get(&self, key: Bytes) -> StoreResult<Option<KeyValue>> {
        let resp = self.range(RangeRequest::key(key)).await?;
        Ok(resp.kvs.into_iter().next())
    }
}

/// A fault hook: given the request, an error to fail it with, or `None` to let it through.
pub type FaultHook<R> = Box<dyn Fn(&R) -> Option<crate::StoreError> + Send + Sync>;

/// A backend that hands every call to `inner`, except that transactions and compactions
/// first ask a hook, which may fail them: for tests of how callers take a store's
/// refusals (a request-size limit, a compaction that fails).
pub struct WithFaults<B> {
    pub inner: B,
    txn: FaultHook<TxnRequest>,
    compact: FaultHook<i64>,
}

impl<B: KvBackend> WithFaults<B> {
    /// `inner` with no faults yet.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            txn: Box::new(|_| None),
            compact: Box::new(|_| None),
        }
    }

    /// Ask `hook` before every transaction.
    pub fn on_txn(
        mut self,
        hook: impl Fn(&TxnRequest) -> Option<crate::StoreError> + Send + Sync + 'static,
    ) -> Self {
        self.txn = Box::new(hook);
        self
    }

    /// Ask `hook` (with the revision) before every compaction.
    pub fn on_compact(
        mut self,
        hook: impl Fn(&i64) -> Option<crate::StoreError> + Send + Sync + 'static,
    ) -> Self {
        self.compact = Box::new(hook);
        self
    }
}

#[async_trait]
impl<B: KvBackend> KvBackend for WithFaults<B> {
    async fn range(&self, req: RangeRequest) -> StoreResult<RangeResponse> {
        self.inner.range(req).await
    }
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        match (self.txn)(&req) {
            Some(e) => Err(e),
            None => self.inner.txn(req).await,
        }
    }
    async fn watch(&self, req: WatchRequest) -> StoreResult<WatchStream> {
        self.inner.watch(req).await
    }
    async fn lease_grant(&self, id: i64, ttl: i64) -> StoreResult<LeaseGrant> {
        self.inner.lease_grant(id, ttl).await
    }
    async fn lease_revoke(&self, id: i64) -> StoreResult<i64> {
        self.inner.lease_revoke(id).await
    }
    async fn lease_keep_alive(&self, id: i64) -> StoreResult<i64> {
        self.inner.lease_keep_alive(id).await
    }
    async fn lease_keep_alive_many(&self, ids: &[i64]) -> StoreResult<Vec<Option<i64>>> {
        self.inner.lease_keep_alive_many(ids).await
    }
    async fn lease_time_to_live(&self, id: i64, keys: bool) -> StoreResult<LeaseTimeToLive> {
        self.inner.lease_time_to_live(id, keys).await
    }
    async fn lease_leases(&self) -> StoreResult<Vec<i64>> {
        self.inner.lease_leases().await
    }
    async fn compact(&self, revision: i64) -> StoreResult<i64> {
        match (self.compact)(&revision) {
            Some(e) => Err(e),
            None => self.inner.compact(revision).await,
        }
    }
    async fn status(&self) -> StoreResult<StoreStatus> {
        self.inner.status().await
    }
    async fn alarms(&self) -> StoreResult<Vec<Alarm>> {
        self.inner.alarms().await
    }
    async fn alarm(&self, action: AlarmAction, alarm: Alarm) -> StoreResult<Vec<Alarm>> {
        self.inner.alarm(action, alarm).await
    }
    fn max_txn_ops(&self) -> usize {
        self.inner.max_txn_ops()
    }
}
