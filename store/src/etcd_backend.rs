//! [`KvBackend`] over an external etcd cluster, through the `etcd-client` crate.
//!
//! Every request field is carried over (range filters and sort, compare targets over
//! ranges, nested transactions, put `ignore_value`/`ignore_lease`, watch filters and
//! progress notifications). etcd reports compaction and future-revision errors without
//! revisions; this backend fetches them (the compact revision by opening a throw-away watch
//! from revision 1, the current revision by a serializable read) so callers get the same
//! [`StoreError`] values as from the embedded store.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare as EcCompare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions,
    SortOrder as EcSortOrder, SortTarget as EcSortTarget, Txn, TxnOp as EcTxnOp, WatchFilterType,
    WatchOptions,
};

use crate::backend::{KvBackend, WatchStream};
use crate::error::{StoreError, StoreResult};
use crate::grpc::store_error_from_status;
use crate::types::*;

/// How long to wait for etcd to answer a probe that completes an error report.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Watch responses buffered between etcd's stream and the consumer.
const WATCH_BUFFER: usize = 256;

/// A [`KvBackend`] that forwards to an etcd v3 cluster.
#[derive(Clone)]
pub struct EtcdBackend {
    client: Client,
    max_txn_ops: usize,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend").finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connect to `endpoints` (`host:port` or `http://host:port`). No request is made;
    /// the first call fails if the cluster is unreachable.
    pub async fn connect(endpoints: &[String]) -> StoreResult<Self> {
        if endpoints.is_empty() {
            return Err(StoreError::InvalidArgument(
                "no etcd endpoints given".into(),
            ));
        }
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| StoreError::Backend(format!("connect to etcd {endpoints:?}: {e}")))?;
        Ok(Self::from_client(client))
    }

    /// Wrap an already configured client (TLS, auth, ...).
    pub fn from_client(client: Client) -> Self {
        Self {
            client,
            max_txn_ops: crate::mvcc::Limits::default().max_txn_ops,
        }
    }

    /// The external cluster's `--max-txn-ops` (etcd's default, 128, unless set here).
    pub fn with_max_txn_ops(mut self, n: usize) -> Self {
        self.max_txn_ops = n;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Turn an etcd-client error into a store error, completing the revisions etcd leaves
    /// out. `requested` is the revision the call asked for, if any.
    async fn map_err(&self, err: etcd_client::Error, requested: i64) -> StoreError {
        let mapped = match &err {
            etcd_client::Error::GRpcStatus(status) => store_error_from_status(status),
            etcd_client::Error::LeaseKeepAliveError(m) if m.contains("not found") => {
                StoreError::LeaseNotFound
            }
            etcd_client::Error::InvalidArgs(m) => StoreError::InvalidArgument(m.clone()),
            other => StoreError::Backend(other.to_string()),
        };
        match mapped {
            StoreError::Compacted { .. } => {
                let compact_revision = self.compact_revision().await.unwrap_or(0);
                StoreError::Compacted { compact_revision }
            }
            StoreError::FutureRevision { .. } => {
                let current = self.current_revision().await.unwrap_or(0);
                StoreError::FutureRevision { requested, current }
            }
            other => {
                tracing::debug!(error = %err, mapped = %other, "etcd request failed");
                other
            }
        }
    }

    /// The store's current revision (serializable read of one key).
    async fn current_revision(&self) -> StoreResult<i64> {
        let mut kv = self.client.kv_client();
        let opts = GetOptions::new().with_serializable().with_count_only();
        let fut = kv.get(&b"\0"[..], Some(opts));
        match tokio::time::timeout(PROBE_TIMEOUT, fut).await {
            Ok(Ok(resp)) => Ok(resp.header().map(|h| h.revision()).unwrap_or(0)),
            Ok(Err(e)) => Err(StoreError::Backend(e.to_string())),
            Err(_) => Err(StoreError::Backend("timed out reading the revision".into())),
        }
    }

    /// etcd's compact revision, the oldest revision still readable (0 when nothing was
    /// compacted). etcd does not report it on reads, so binary-search the revisions: a read
    /// at `r` fails as compacted exactly when `r` is below it. About log2(revision)
    /// serializable count-only reads.
    async fn compact_revision(&self) -> StoreResult<i64> {
        let probe = async {
            let current = self.current_revision().await?;
            let readable = |rev: i64| {
                let mut kv = self.client.kv_client();
                async move {
                    let opts = GetOptions::new()
                        .with_serializable()
                        .with_count_only()
                        .with_revision(rev);
                    match kv.get(&b"\0"[..], Some(opts)).await {
                        Ok(_) => Ok(true),
                        Err(etcd_client::Error::GRpcStatus(s))
                            if matches!(
                                store_error_from_status(&s),
                                StoreError::Compacted { .. }
                            ) =>
                        {
                            Ok(false)
                        }
                        Err(e) => Err(StoreError::Backend(e.to_string())),
                    }
                }
            };
            if current <= 1 || readable(1).await? {
                return Ok(0);
            }
            // Invariant: `lo` is compacted, `hi` is readable (the current revision always is).
            let (mut lo, mut hi) = (1, current);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if readable(mid).await? {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            Ok(hi)
        };
        tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .map_err(|_| StoreError::Backend("timed out probing the compact revision".into()))?
    }
}

fn compare_op(r: CompareResult) -> CompareOp {
    match r {
        CompareResult::Equal => CompareOp::Equal,
        CompareResult::Greater => CompareOp::Greater,
        CompareResult::Less => CompareOp::Less,
        CompareResult::NotEqual => CompareOp::NotEqual,
    }
}

fn to_compare(c: &Compare) -> EcCompare {
    let key = c.range.key.to_vec();
    let op = compare_op(c.result);
    let cmp = match &c.target {
        CompareTarget::Version(v) => EcCompare::version(key, op, *v),
        CompareTarget::CreateRevision(v) => EcCompare::create_revision(key, op, *v),
        CompareTarget::ModRevision(v) => EcCompare::mod_revision(key, op, *v),
        CompareTarget::Value(v) => EcCompare::value(key, op, v.to_vec()),
        CompareTarget::Lease(v) => EcCompare::lease(key, op, *v),
    };
    if c.range.range_end.is_empty() {
        cmp
    } else {
        cmp.with_range(c.range.range_end.to_vec())
    }
}

fn get_options(r: &RangeRequest) -> GetOptions {
    let mut o = GetOptions::new();
    if !r.range.range_end.is_empty() {
        o = o.with_range(r.range.range_end.to_vec());
    }
    if r.limit != 0 {
        o = o.with_limit(r.limit);
    }
    if r.revision != 0 {
        o = o.with_revision(r.revision);
    }
    if r.sort_order != SortOrder::None || r.sort_target != SortTarget::Key {
        let target = match r.sort_target {
            SortTarget::Key => EcSortTarget::Key,
            SortTarget::Version => EcSortTarget::Version,
            SortTarget::Create => EcSortTarget::Create,
            SortTarget::Mod => EcSortTarget::Mod,
            SortTarget::Value => EcSortTarget::Value,
        };
        let order = match r.sort_order {
            SortOrder::None => EcSortOrder::None,
            SortOrder::Ascend => EcSortOrder::Ascend,
            SortOrder::Descend => EcSortOrder::Descend,
        };
        o = o.with_sort(target, order);
    }
    if r.serializable {
        o = o.with_serializable();
    }
    if r.keys_only {
        o = o.with_keys_only();
    }
    if r.count_only {
        o = o.with_count_only();
    }
    if r.min_mod_revision != 0 {
        o = o.with_min_mod_revision(r.min_mod_revision);
    }
    if r.max_mod_revision != 0 {
        o = o.with_max_mod_revision(r.max_mod_revision);
    }
    if r.min_create_revision != 0 {
        o = o.with_min_create_revision(r.min_create_revision);
    }
    if r.max_create_revision != 0 {
        o = o.with_max_create_revision(r.max_create_revision);
    }
    o
}

fn put_options(p: &PutRequest) -> PutOptions {
    let mut o = PutOptions::new();
    if p.lease != 0 {
        o = o.with_lease(p.lease);
    }
    if p.prev_kv {
        o = o.with_prev_key();
    }
    if p.ignore_value {
        o = o.with_ignore_value();
    }
    if p.ignore_lease {
        o = o.with_ignore_lease();
    }
    o
}

fn delete_options(d: &DeleteRangeRequest) -> DeleteOptions {
    let mut o = DeleteOptions::new();
    if !d.range.range_end.is_empty() {
        o = o.with_range(d.range.range_end.to_vec());
    }
    if d.prev_kv {
        o = o.with_prev_key();
    }
    o
}

fn to_txn_op(op: &TxnOp) -> EcTxnOp {
    match op {
        TxnOp::Range(r) => EcTxnOp::get(r.range.key.to_vec(), Some(get_options(r))),
        TxnOp::Put(p) => EcTxnOp::put(p.key.to_vec(), p.value.to_vec(), Some(put_options(p))),
        TxnOp::DeleteRange(d) => EcTxnOp::delete(d.range.key.to_vec(), Some(delete_options(d))),
        TxnOp::Txn(t) => EcTxnOp::txn(to_txn(t)),
    }
}

fn to_txn(t: &TxnRequest) -> Txn {
    Txn::new()
        .when(t.compare.iter().map(to_compare).collect::<Vec<_>>())
        .and_then(t.success.iter().map(to_txn_op).collect::<Vec<_>>())
        .or_else(t.failure.iter().map(to_txn_op).collect::<Vec<_>>())
}

/// The revision a request asks for, to complete a future-revision error.
fn requested_revision(t: &TxnRequest) -> i64 {
    t.success
        .iter()
        .chain(t.failure.iter())
        .map(|op| match op {
            TxnOp::Range(r) => r.revision,
            TxnOp::Txn(t) => requested_revision(t),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

fn check_key(key: &Bytes) -> StoreResult<()> {
    if key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    Ok(())
}

#[async_trait]
impl KvBackend for EtcdBackend {
    fn max_txn_ops(&self) -> usize {
        self.max_txn_ops
    }

    async fn range(&self, req: RangeRequest) -> StoreResult<RangeResponse> {
        check_key(&req.range.key)?;
        let mut kv = self.client.kv_client();
        match kv
            .get(req.range.key.to_vec(), Some(get_options(&req)))
            .await
        {
            Ok(resp) => Ok(crate::grpc::range_resp_from_pb(resp.0)),
            Err(e) => Err(self.map_err(e, req.revision).await),
        }
    }

    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        let mut kv = self.client.kv_client();
        match kv.txn(to_txn(&req)).await {
            Ok(resp) => crate::grpc::txn_resp_from_pb(resp.0),
            Err(e) => Err(self.map_err(e, requested_revision(&req)).await),
        }
    }

    async fn put(&self, req: PutRequest) -> StoreResult<PutResponse> {
        check_key(&req.key)?;
        let mut kv = self.client.kv_client();
        let opts = put_options(&req);
        match kv
            .put(req.key.to_vec(), req.value.to_vec(), Some(opts))
            .await
        {
            Ok(resp) => Ok(crate::grpc::put_resp_from_pb(resp.0)),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn delete_range(&self, req: DeleteRangeRequest) -> StoreResult<DeleteRangeResponse> {
        check_key(&req.range.key)?;
        let mut kv = self.client.kv_client();
        match kv
            .delete(req.range.key.to_vec(), Some(delete_options(&req)))
            .await
        {
            Ok(resp) => Ok(crate::grpc::delete_resp_from_pb(resp.0)),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn watch(&self, req: WatchRequest) -> StoreResult<WatchStream> {
        let mut opts = WatchOptions::new();
        if !req.range.range_end.is_empty() {
            opts = opts.with_range(req.range.range_end.to_vec());
        }
        if req.start_revision > 0 {
            opts = opts.with_start_revision(req.start_revision);
        }
        if req.prev_kv {
            opts = opts.with_prev_key();
        }
        if req.progress_notify {
            opts = opts.with_progress_notify();
        }
        let mut filters = Vec::new();
        if req.filters.no_put {
            filters.push(WatchFilterType::NoPut);
        }
        if req.filters.no_delete {
            filters.push(WatchFilterType::NoDelete);
        }
        if !filters.is_empty() {
            opts = opts.with_filters(filters);
        }

        // etcd reports a compacted start revision only after creating the watch, from a
        // background sync; check up front so the caller gets the error from `watch` itself.
        if req.start_revision > 0 {
            let mut kv = self.client.kv_client();
            let opts = GetOptions::new()
                .with_serializable()
                .with_count_only()
                .with_revision(req.start_revision);
            if let Err(e) = kv.get(&b"\0"[..], Some(opts)).await {
                match self.map_err(e, req.start_revision).await {
                    err @ StoreError::Compacted { .. } => return Err(err),
                    // A future start revision is fine for a watch: it waits.
                    StoreError::FutureRevision { .. } => {}
                    other => return Err(other),
                }
            }
        }

        let mut wc = self.client.watch_client();
        let mut stream = match wc.watch(req.range.key.to_vec(), Some(opts)).await {
            Ok(s) => s,
            Err(e) => return Err(self.map_err(e, req.start_revision).await),
        };
        // The first answer says whether the watch exists; a compacted start revision is
        // reported as a cancel right after (or instead of) the creation.
        let first = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return Err(StoreError::Backend("etcd closed the watch stream".into())),
            Err(e) => return Err(self.map_err(e, req.start_revision).await),
        };
        if first.canceled() {
            return Err(watch_cancel_error(
                first.compact_revision(),
                first.cancel_reason(),
            ));
        }
        if !first.created() {
            return Err(StoreError::Backend(
                "etcd answered a watch create without created".into(),
            ));
        }
        let watch_id = first.watch_id();

        // Pump etcd's responses into a channel; the request sender lives in the task so
        // dropping the returned stream ends the task and with it the etcd watch.
        let (tx, rx) = tokio::sync::mpsc::channel::<StoreResult<WatchBatch>>(WATCH_BUFFER);
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    _ = tx.closed() => {
                        let _ = stream.cancel(watch_id).await;
                        return;
                    }
                };
                let item = match msg {
                    Ok(Some(m)) => {
                        if m.canceled() {
                            let _ = tx
                                .send(Err(watch_cancel_error(
                                    m.compact_revision(),
                                    m.cancel_reason(),
                                )))
                                .await;
                            return;
                        }
                        if m.created() {
                            continue;
                        }
                        let revision = m.header().map(|h| h.revision()).unwrap_or(0);
                        let mut events = Vec::with_capacity(m.0.events.len());
                        let mut bad = None;
                        for ev in m.0.events {
                            match crate::grpc::event_from_pb(ev) {
                                Ok(ev) => events.push(ev),
                                Err(e) => bad = Some(e),
                            }
                        }
                        match bad {
                            Some(e) => Err(e),
                            None => Ok(WatchBatch { revision, events }),
                        }
                    }
                    Ok(None) => {
                        tracing::debug!(watch_id, "etcd closed the watch stream");
                        return;
                    }
                    Err(e) => Err(StoreError::Backend(format!("etcd watch stream: {e}"))),
                };
                let stop = item.is_err();
                if tx.send(item).await.is_err() || stop {
                    return;
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn lease_grant(&self, id: i64, ttl: i64) -> StoreResult<LeaseGrant> {
        let mut lc = self.client.lease_client();
        let opts = (id != 0).then(|| etcd_client::LeaseGrantOptions::new().with_id(id));
        match lc.grant(ttl, opts).await {
            Ok(resp) => {
                if !resp.error().is_empty() {
                    return Err(StoreError::Backend(resp.error().to_string()));
                }
                Ok(LeaseGrant {
                    id: resp.id(),
                    ttl: resp.ttl(),
                })
            }
            Err(e) => Err(match self.map_err(e, 0).await {
                StoreError::LeaseTtlOutOfRange(_) => StoreError::LeaseTtlOutOfRange(ttl),
                other => other,
            }),
        }
    }

    async fn lease_revoke(&self, id: i64) -> StoreResult<i64> {
        let mut lc = self.client.lease_client();
        match lc.revoke(id).await {
            Ok(resp) => Ok(resp.header().map(|h| h.revision()).unwrap_or(0)),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn lease_keep_alive(&self, id: i64) -> StoreResult<i64> {
        let mut lc = self.client.lease_client();
        let (mut keeper, mut stream) = match lc.keep_alive(id).await {
            Ok(x) => x,
            Err(e) => return Err(self.map_err(e, 0).await),
        };
        // `keep_alive` sent one renewal and swallowed its answer (failing on TTL 0); renew
        // once more on the same stream to read the TTL etcd granted.
        if let Err(e) = keeper.keep_alive().await {
            return Err(self.map_err(e, 0).await);
        }
        match stream.message().await {
            Ok(Some(resp)) if resp.ttl() > 0 => Ok(resp.ttl()),
            Ok(Some(_)) => Err(StoreError::LeaseNotFound),
            Ok(None) => Err(StoreError::Backend(
                "etcd closed the keep-alive stream".into(),
            )),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn lease_time_to_live(&self, id: i64, keys: bool) -> StoreResult<LeaseTimeToLive> {
        let mut lc = self.client.lease_client();
        let opts = keys.then(|| etcd_client::LeaseTimeToLiveOptions::new().with_keys());
        match lc.time_to_live(id, opts).await {
            Ok(resp) => Ok(LeaseTimeToLive {
                id: resp.id(),
                ttl: resp.ttl(),
                granted_ttl: resp.granted_ttl(),
                keys: resp
                    .keys()
                    .iter()
                    .map(|k| Bytes::copy_from_slice(k))
                    .collect(),
            }),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn lease_leases(&self) -> StoreResult<Vec<i64>> {
        let mut lc = self.client.lease_client();
        match lc.leases().await {
            Ok(resp) => Ok(resp.leases().iter().map(|l| l.id()).collect()),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn compact(&self, revision: i64) -> StoreResult<i64> {
        let mut kv = self.client.kv_client();
        match kv.compact(revision, None).await {
            Ok(resp) => Ok(resp.header().map(|h| h.revision()).unwrap_or(0)),
            Err(e) => Err(self.map_err(e, revision).await),
        }
    }

    async fn status(&self) -> StoreResult<StoreStatus> {
        let mut mc = self.client.maintenance_client();
        let resp = match mc.status().await {
            Ok(r) => r,
            Err(e) => return Err(self.map_err(e, 0).await),
        };
        let header = resp.header();
        let compact_revision = self.compact_revision().await.unwrap_or(0);
        Ok(StoreStatus {
            version: resp.version().to_string(),
            revision: header.map(|h| h.revision()).unwrap_or(0),
            compact_revision,
            db_size: resp.db_size(),
            member_id: header.map(|h| h.member_id()).unwrap_or(0),
            leader: resp.leader(),
            raft_term: resp.raft_term(),
            raft_index: resp.raft_index(),
            raft_applied_index: resp.raft_applied_index(),
            is_learner: resp.is_learner(),
            size_in_use: resp.raft_used_db_size(),
            quota_bytes: 0,
            alarms: self.alarms().await.unwrap_or_default(),
        })
    }

    async fn alarms(&self) -> StoreResult<Vec<Alarm>> {
        let mut mc = self.client.maintenance_client();
        match mc
            .alarm(
                etcd_client::AlarmAction::Get,
                etcd_client::AlarmType::None,
                None,
            )
            .await
        {
            Ok(resp) => Ok(alarms_from_etcd(resp.alarms())),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }

    async fn alarm(&self, action: AlarmAction, alarm: Alarm) -> StoreResult<Vec<Alarm>> {
        let mut mc = self.client.maintenance_client();
        let action = match action {
            AlarmAction::Activate => etcd_client::AlarmAction::Activate,
            AlarmAction::Deactivate => etcd_client::AlarmAction::Deactivate,
        };
        let kind = match alarm.kind {
            AlarmKind::NoSpace => etcd_client::AlarmType::Nospace,
            AlarmKind::Corrupt => etcd_client::AlarmType::Corrupt,
        };
        let mut opts = etcd_client::AlarmOptions::new();
        opts.with_member(alarm.member);
        match mc.alarm(action, kind, Some(opts)).await {
            Ok(resp) => Ok(alarms_from_etcd(resp.alarms())),
            Err(e) => Err(self.map_err(e, 0).await),
        }
    }
}

fn alarms_from_etcd(list: &[etcd_client::AlarmMember]) -> Vec<Alarm> {
    list.iter()
        .filter_map(|a| {
            let kind = match a.alarm() {
                etcd_client::AlarmType::Nospace => AlarmKind::NoSpace,
                etcd_client::AlarmType::Corrupt => AlarmKind::Corrupt,
                _ => return None,
            };
            Some(Alarm {
                member: a.member_id(),
                kind,
            })
        })
        .collect()
}

fn watch_cancel_error(compact_revision: i64, reason: &str) -> StoreError {
    if compact_revision > 0 {
        StoreError::Compacted { compact_revision }
    } else if reason.contains("future revision") {
        StoreError::FutureRevision {
            requested: 0,
            current: 0,
        }
    } else {
        StoreError::Backend(format!("etcd canceled the watch: {reason}"))
    }
}
