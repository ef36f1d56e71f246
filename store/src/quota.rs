//! The store's size quota and its `NOSPACE` alarm (etcd's `--quota-backend-bytes`).
//!
//! The store holds every version it keeps in memory, so without a limit a client that
//! writes without end (or a history never compacted) runs the server out of memory. The
//! quota bounds the store's **size**, defined as
//!
//! > the sum, over every version of every key the store still holds — every write since
//! > the last compaction, tombstones of deletions included, plus the version of each key
//! > visible at the compact revision — of its key's and value's bytes plus
//! > [`VERSION_OVERHEAD`], plus [`LEASE_OVERHEAD`] per lease.
//!
//! It is what etcd's database size measures (every revision of every key not yet
//! compacted, with a per-revision overhead), computed from the engine's state alone, so
//! members that applied the same log agree on it (a member that installed a snapshot holds
//! no history before it, and so reports less). [`Mvcc::size_bytes`] keeps it up to date as
//! writes and compactions are applied.
//!
//! When a write that adds data would take the size beyond the quota, the member deciding
//! (the single member, or the Raft leader) raises the `NOSPACE` alarm — in the Raft log
//! like any write, so every member holds it, persisted with the data and carried by
//! snapshots — and refuses the write with etcd's `mvcc: database space exceeded`. While the
//! alarm is raised, applying any command that adds data (a transaction with a put in
//! either branch, a lease grant) fails the same way on every member; reads, deletes,
//! lease revocations and compaction go on. An operator frees space (deletes keys, compacts
//! the history) and disarms the alarm (`etcdctl alarm disarm`); should the store still be
//! over its quota, the next write raises it again.
//!
//! [`Mvcc::size_bytes`]: crate::mvcc::Mvcc::size_bytes

use crate::mvcc::Command;
use crate::types::TxnOp;

/// The default quota: 2 GiB, etcd's default `--quota-backend-bytes`.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 << 30;

/// Bytes counted per version besides its key and value: its revisions, version and lease
/// (etcd keeps a 17-byte revision key and a protobuf `KeyValue` per revision).
pub const VERSION_OVERHEAD: u64 = 64;

/// Bytes counted per lease (etcd's `leaseOverhead`).
pub const LEASE_OVERHEAD: u64 = 64;

/// The size a version of `key` holding `value` adds.
pub fn version_bytes(key: usize, value: usize) -> u64 {
    key as u64 + value as u64 + VERSION_OVERHEAD
}

/// How much `cmd` adds to the size at most; 0 for a command that adds no data (reads,
/// deletions, lease revocation, compaction, alarms), which the alarm never refuses.
///
/// Every put of a transaction counts, in both branches and nested ones (as etcd's quota
/// does: which branch runs is known only when it is applied).
pub fn cost(cmd: &Command) -> u64 {
    fn ops(ops: &[TxnOp]) -> u64 {
        ops.iter()
            .map(|op| match op {
                TxnOp::Put(p) => version_bytes(p.key.len(), p.value.len()),
                TxnOp::Txn(t) => ops_of(t),
                TxnOp::Range(_) | TxnOp::DeleteRange(_) => 0,
            })
            .fold(0u64, u64::saturating_add)
    }
    fn ops_of(t: &crate::types::TxnRequest) -> u64 {
        ops(&t.success).saturating_add(ops(&t.failure))
    }
    match cmd {
        Command::Txn(t) => ops_of(t),
        Command::LeaseGrant { .. } => LEASE_OVERHEAD,
        Command::Compact { .. } | Command::LeaseRevoke { .. } | Command::Alarm { .. } => 0,
    }
}

/// Whether a command costing `cost` is over `quota` at `size`: what raises the alarm.
pub fn exceeds(size: u64, cost: u64, quota: u64) -> bool {
    cost > 0 && size.saturating_add(cost) > quota
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DeleteRangeRequest, KeyRange, PutRequest, RangeRequest, TxnRequest};

    #[test]
    fn only_commands_that_add_data_cost_anything() {
        let put = |k: &str, v: &str| TxnOp::Put(PutRequest::new(k.to_owned(), v.to_owned()));
        let del = TxnOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::single("a"),
            prev_kv: false,
        });
        let txn = |success: Vec<TxnOp>, failure: Vec<TxnOp>| {
            Command::Txn(TxnRequest {
                compare: Vec::new(),
                success,
                failure,
            })
        };
        assert_eq!(
            cost(&txn(vec![put("ab", "xyz")], vec![])),
            5 + VERSION_OVERHEAD
        );
        // Both branches count.
        assert_eq!(
            cost(&txn(vec![put("a", "1")], vec![put("b", "2")])),
            2 * (2 + VERSION_OVERHEAD)
        );
        let nested = txn(
            vec![TxnOp::Txn(TxnRequest {
                compare: Vec::new(),
                success: vec![put("a", "1")],
                failure: Vec::new(),
            })],
            vec![],
        );
        assert_eq!(cost(&nested), 2 + VERSION_OVERHEAD);
        assert_eq!(cost(&txn(vec![del.clone()], vec![])), 0);
        assert_eq!(
            cost(&txn(vec![TxnOp::Range(RangeRequest::key("a"))], vec![del])),
            0
        );
        assert_eq!(cost(&Command::Compact { revision: 3 }), 0);
        assert_eq!(cost(&Command::LeaseRevoke { id: 3 }), 0);
        assert_eq!(cost(&Command::LeaseGrant { id: 3, ttl: 5 }), LEASE_OVERHEAD);
        assert!(exceeds(90, 11, 100));
        assert!(!exceeds(90, 10, 100));
        assert!(
            !exceeds(200, 0, 100),
            "a free command never raises the alarm"
        );
    }
}
