//! Periodic compaction of the store's history, as kube-apiserver does for etcd.
//!
//! Every write leaves its superseded version behind (watches resume from it, lists read
//! at it), so without compaction the store's memory and history grow with every status
//! update and heartbeat for as long as the server runs. Every `interval` the compactor
//! compacts to the revision it saw one interval earlier, so that at least one interval of
//! history stays readable: a watcher that reconnects within it resumes without a relist,
//! one that comes back later gets 410 Gone and relists.
//!
//! Several API servers can share a store (replicated members, or an external etcd): each
//! round first moves a marker key with a compare on its version, so in each round only
//! the server whose view of the marker is current compacts; the others adopt the marker's
//! new version and try again next round.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lattice_store::{
    Compare, CompareResult, CompareTarget, KeyRange, KvBackend, PutRequest, RangeRequest,
    StoreError, TxnOp, TxnOpResponse, TxnRequest,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The marker key (outside every kind's prefix): its value is the revision last
/// compacted to, its version counts the rounds.
pub const MARKER_KEY: &str = "/registry/compact_rev_key";

/// kube-apiserver's default (`--etcd-compaction-interval`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);

/// Counters of the compaction loop (`lattice_apiserver_compaction_*`).
#[derive(Clone, Debug, Default)]
pub struct CompactorMetrics {
    /// Compactions this server performed.
    pub compactions: Counter,
    /// Rounds in which another server had moved the marker first.
    pub skipped: Counter,
    /// Rounds that failed (store unavailable, ...).
    pub failures: Counter,
    /// Revision this server last compacted to.
    pub revision: Gauge,
}

impl CompactorMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("lattice_apiserver_compaction");
        r.register(
            "runs",
            "Store compactions performed by this server",
            self.compactions.clone(),
        );
        r.register(
            "skipped",
            "Compaction rounds another server did first",
            self.skipped.clone(),
        );
        r.register(
            "failures",
            "Compaction rounds that failed",
            self.failures.clone(),
        );
        r.register(
            "revision",
            "Revision this server last compacted the store to",
            self.revision.clone(),
        );
    }
}

/// What one round found: the marker's version to compare against next time, and the
/// store's revision now (the next round compacts to it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    pub marker_version: i64,
    pub revision: i64,
    /// Whether this round compacted.
    pub compacted: bool,
    /// The round was this server's (the marker moved) but the compaction failed: the
    /// next round goes on from the moved marker.
    pub compact_error: Option<String>,
}

/// One round: claim the round by moving the marker from `marker_version` (to `target`),
/// then compact to `target` (0: nothing yet to compact, the first round only records the
/// revision). Another server having moved the marker is not an error: the round returns
/// the marker's version it found. `Err` only when the marker could not be read or moved;
/// a failed compaction after the marker moved is in [`Round::compact_error`].
pub async fn round(
    backend: &dyn KvBackend,
    marker_version: i64,
    target: i64,
) -> Result<Round, StoreError> {
    let key = Bytes::from_static(MARKER_KEY.as_bytes());
    let resp = backend
        .txn(TxnRequest {
            compare: vec![Compare {
                range: KeyRange::single(key.clone()),
                result: CompareResult::Equal,
                target: CompareTarget::Version(marker_version),
            }],
            success: vec![TxnOp::Put(PutRequest {
                key: key.clone(),
                value: Bytes::from(target.to_string()),
                ..PutRequest::default()
            })],
            failure: vec![TxnOp::Range(RangeRequest {
                range: KeyRange::single(key),
                ..RangeRequest::default()
            })],
        })
        .await?;
    if !resp.succeeded {
        let found = match resp.responses.first() {
            Some(TxnOpResponse::Range(r)) => r.kvs.first().map(|kv| kv.version).unwrap_or(0),
            _ => 0,
        };
        return Ok(Round {
            marker_version: found,
            revision: resp.revision,
            compacted: false,
            compact_error: None,
        });
    }
    let round = Round {
        marker_version: marker_version + 1,
        revision: resp.revision,
        compacted: target > 0,
        compact_error: None,
    };
    if target > 0 {
        match backend.compact(target).await {
            Ok(_) => {}
            // Someone compacted further already (by hand, with etcdctl): nothing to do.
            Err(StoreError::Compacted { .. }) => {
                return Ok(Round {
                    compacted: false,
                    ..round
                })
            }
            Err(e) => {
                return Ok(Round {
                    compacted: false,
                    compact_error: Some(e.to_string()),
                    ..round
                })
            }
        }
    }
    Ok(round)
}

/// Compact every `interval` until `stop` resolves.
pub async fn run(
    backend: Arc<dyn KvBackend>,
    interval: Duration,
    metrics: CompactorMetrics,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut marker_version = 0;
    let mut target = 0;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate: the first round is one interval in
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticker.tick() => {}
        }
        match round(backend.as_ref(), marker_version, target).await {
            Ok(r) => {
                if let Some(e) = &r.compact_error {
                    metrics.failures.inc();
                    tracing::warn!(revision = target, error = %e, "compaction failed; retrying next interval");
                } else if r.compacted {
                    metrics.compactions.inc();
                    metrics.revision.set(target);
                    tracing::info!(revision = target, "compacted the store's history");
                } else if r.marker_version != marker_version + 1 {
                    metrics.skipped.inc();
                    tracing::debug!(
                        marker_version = r.marker_version,
                        "another server compacted this round"
                    );
                }
                marker_version = r.marker_version;
                target = r.revision;
            }
            Err(e) => {
                metrics.failures.inc();
                tracing::warn!(error = %e, "compaction round failed; retrying next interval");
            }
        }
    }
}
