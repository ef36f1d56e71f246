//! Prometheus metrics of the store (`lattice_store_*`), registered by the server.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// Time to make one batch durable (the fsync), in seconds.
    pub commit_seconds: Histogram,
    /// Commands per durable batch (group commit effectiveness).
    pub batch_size: Histogram,
    /// Time the writer waits for a checkpoint (the state file's durable commit that
    /// lets the log start over), in seconds.
    pub checkpoint_seconds: Histogram,
    /// State-file transactions written behind the log (and the log records in them).
    pub materialized_txns: Counter,
    pub materialized_records: Counter,
    /// Batches committed by the writing caller itself (nothing queued, log free) rather
    /// than by the writer thread.
    pub inline_commits: Counter,
    pub applied_revision: Gauge,
    pub writes: Counter,
    pub watchers: Gauge,
    pub db_size_bytes: Gauge,
    /// The store's size as its quota counts it (`crate::quota`).
    pub size_in_use_bytes: Gauge,
    /// The size quota (`--quota-backend-bytes`).
    pub quota_bytes: Gauge,
    /// 1 while the NOSPACE alarm is raised (writes that add data are refused).
    pub alarm_nospace: Gauge,
    /// Writes refused for the quota.
    pub nospace_refusals: Counter,
    /// Time to build a snapshot of the state (a Raft member's, for log purges and
    /// follower catch-up), made durable first, in seconds.
    pub snapshot_seconds: Histogram,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            checkpoint_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            snapshot_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            materialized_txns: Counter::default(),
            materialized_records: Counter::default(),
            inline_commits: Counter::default(),
            applied_revision: Gauge::default(),
            writes: Counter::default(),
            watchers: Gauge::default(),
            db_size_bytes: Gauge::default(),
            size_in_use_bytes: Gauge::default(),
            quota_bytes: Gauge::default(),
            alarm_nospace: Gauge::default(),
            nospace_refusals: Counter::default(),
        }
    }
}

impl StoreMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("lattice_store");
        r.register(
            "commit_duration_seconds",
            "Time to fsync one batch of writes",
            self.commit_seconds.clone(),
        );
        r.register(
            "commit_batch_size",
            "Commands per durable batch",
            self.batch_size.clone(),
        );
        r.register(
            "checkpoint_duration_seconds",
            "Time the writer waits for the state file's durable commit before the log starts over",
            self.checkpoint_seconds.clone(),
        );
        r.register(
            "inline_commits",
            "Batches committed by the writing request itself (nothing queued) instead of the writer thread",
            self.inline_commits.clone(),
        );
        r.register(
            "materialized_transactions",
            "State-file transactions written behind the log",
            self.materialized_txns.clone(),
        );
        r.register(
            "materialized_log_records",
            "Log records written into the state file",
            self.materialized_records.clone(),
        );
        r.register(
            "applied_revision",
            "Newest durable revision",
            self.applied_revision.clone(),
        );
        r.register("write_revisions", "Revisions written", self.writes.clone());
        r.register("watchers", "Open watchers", self.watchers.clone());
        r.register(
            "db_size_bytes",
            "Size of the state file",
            self.db_size_bytes.clone(),
        );
        r.register(
            "size_in_use_bytes",
            "The store's size as its quota counts it: every version held (history not yet compacted included) plus leases",
            self.size_in_use_bytes.clone(),
        );
        r.register(
            "quota_bytes",
            "The store's size quota (--quota-backend-bytes)",
            self.quota_bytes.clone(),
        );
        r.register(
            "alarm_nospace",
            "1 while the NOSPACE alarm is raised: writes that add data are refused",
            self.alarm_nospace.clone(),
        );
        r.register(
            "nospace_refusals",
            "Writes refused because the store is at its size quota",
            self.nospace_refusals.clone(),
        );
        r.register(
            "snapshot_duration_seconds",
            "Time to build a Raft snapshot of the state (made durable first)",
            self.snapshot_seconds.clone(),
        );
    }
}

/// Prometheus metrics of a Raft member (`lattice_raft_*`), besides the gauges the server
/// derives from openraft's own metrics.
#[derive(Clone, Debug)]
pub struct RaftMetrics {
    /// From a proposal handed to openraft until its entry is committed and applied here
    /// (the leader's view of a replicated write).
    pub commit_seconds: Histogram,
    /// One write of the Raft log: its write-ahead record and `fdatasync`.
    pub log_flush_seconds: Histogram,
    /// Durable commits of `raft-log.redb` (after each, the write-ahead log starts over).
    pub log_checkpoints: Counter,
    /// Appends made durable by openraft's own task (the log writer idle) rather than
    /// handed to the log writer thread.
    pub log_inline_appends: Counter,
    /// Leader appends handed to openraft as flushed before their `fdatasync` (replication
    /// starts at once; see `raft/log_store.rs`).
    pub log_early_appends: Counter,
    /// AppendEntries whose commit index was lowered to the leader's durable log.
    pub commit_clamped: Counter,
    /// Heartbeats sent to carry such a commit index once durable.
    pub commit_heartbeats: Counter,
    /// A client request this member forwarded to the leader (it does not lead), from
    /// sending it to the leader's answer.
    pub forward_seconds: Histogram,
}

impl Default for RaftMetrics {
    fn default() -> Self {
        Self {
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            log_flush_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            log_checkpoints: Counter::default(),
            log_inline_appends: Counter::default(),
            log_early_appends: Counter::default(),
            commit_clamped: Counter::default(),
            commit_heartbeats: Counter::default(),
            forward_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
        }
    }
}

impl RaftMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("lattice_raft");
        r.register(
            "commit_duration_seconds",
            "From a proposal to its entry committed and applied on this member",
            self.commit_seconds.clone(),
        );
        r.register(
            "log_flush_duration_seconds",
            "Time to make one Raft log write durable (write-ahead record and fdatasync)",
            self.log_flush_seconds.clone(),
        );
        r.register(
            "log_checkpoints",
            "Durable commits of the Raft log file",
            self.log_checkpoints.clone(),
        );
        r.register(
            "log_inline_appends",
            "Raft log appends made durable by the Raft task itself (log writer idle) instead of the log writer thread",
            self.log_inline_appends.clone(),
        );
        r.register(
            "log_early_appends",
            "Leader appends reported flushed to Raft before their fdatasync, so replication starts in parallel (answers, reads and followers still wait for it)",
            self.log_early_appends.clone(),
        );
        r.register(
            "commit_clamped",
            "AppendEntries whose commit index was lowered to the leader's durable log",
            self.commit_clamped.clone(),
        );
        r.register(
            "commit_heartbeats",
            "Heartbeats sent to carry a commit index held back for the leader's log once it is durable",
            self.commit_heartbeats.clone(),
        );
        r.register(
            "forward_duration_seconds",
            "A client request this member forwarded to the leader, from sending it to the answer",
            self.forward_seconds.clone(),
        );
    }
}
