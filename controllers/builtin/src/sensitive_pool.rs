//! The cluster-wide sensitive pool (the seed's Quota Enforcement: `sensitive_pool_size`,
//! "system-wide hard limit on the number of nodes that can be claimed for sensitive use").
//!
//! The limit is the cluster setting `scheduling.sensitive_pool_size` (`lattice admin config
//! set scheduling.sensitive_pool_size=64`); the nodes held by sensitive work are a counter
//! in the store ([`COUNTER_KEY`]). A binding or scale-up of sensitive work reads both and
//! writes the counter in its own guarded transaction, so two schedulers racing cannot
//! claim past the limit; the release controller gives nodes back the same way, and its
//! usage audit recounts the counter from node ownership (sensitive-pool nodes run only
//! sensitive work) when it drifted.

use std::sync::Arc;

use bytes::Bytes;
use lattice_apis::cluster_config::{self as cc};
use lattice_store::KvBackend;

use crate::objects::{GuardedWrite, TxnError};

/// Nodes held by sensitive work, cluster-wide (JSON `{"nodes": N}`).
pub const COUNTER_KEY: &str = "/lattice/usage/sensitive-nodes";

/// The pool as read in one transaction's snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pool {
    /// Nodes held by sensitive work.
    pub used: u32,
    /// The counter's mod revision (0: never written).
    rev: i64,
    /// The cluster-wide limit, if set.
    pub limit: Option<u32>,
    /// The setting's mod revision (0: unset).
    limit_rev: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Counter {
    nodes: u32,
}

async fn get(backend: &Arc<dyn KvBackend>, key: &str) -> Result<Option<(Vec<u8>, i64)>, TxnError> {
    Ok(backend
        .get(Bytes::from(key.to_string()))
        .await?
        .map(|kv| (kv.value.to_vec(), kv.mod_revision)))
}

/// Read the counter and the limit.
pub async fn read(backend: &Arc<dyn KvBackend>) -> Result<Pool, TxnError> {
    let mut pool = Pool::default();
    if let Some((v, rev)) = get(backend, COUNTER_KEY).await? {
        pool.used = serde_json::from_slice::<Counter>(&v)
            .map(|c| c.nodes)
            .map_err(|e| TxnError::Decode(format!("{COUNTER_KEY}: {e}")))?;
        pool.rev = rev;
    }
    let setting = cc::find(cc::SENSITIVE_POOL_SIZE).map(|s| s.store_key());
    if let Some(key) = setting {
        if let Some((v, rev)) = get(backend, &key).await? {
            pool.limit_rev = rev;
            // A value written around the API that is not a limit counts as unset.
            pool.limit = serde_json::from_slice::<serde_json::Value>(&v)
                .ok()
                .and_then(|v| v.as_u64())
                .and_then(|n| u32::try_from(n).ok());
        }
    }
    Ok(pool)
}

impl Pool {
    /// Why `n` more nodes cannot be claimed when `used` are held, if they cannot.
    pub fn refuse(&self, used: u32, n: u32) -> Option<String> {
        let limit = self.limit?;
        (used + n > limit).then(|| {
            format!(
                "waiting for quota headroom (sensitive_pool_size, cluster-wide: current {used}, requested {n}, limit {limit})"
            )
        })
    }

    /// Add the counter's new value to `w`, guarded by what was read (the counter and the
    /// limit), so a racing claim or a changed limit makes the transaction fail and retry.
    pub fn write(&self, w: &mut GuardedWrite, used: u32) -> Result<(), TxnError> {
        if let Some(key) = cc::find(cc::SENSITIVE_POOL_SIZE).map(|s| s.store_key()) {
            w.guard_raw(&key, self.limit_rev);
        }
        self.put_counter(w, used)
    }

    /// Add the counter's new value to `w`, guarded by the counter as read.
    fn put_counter(&self, w: &mut GuardedWrite, used: u32) -> Result<(), TxnError> {
        let value = serde_json::to_vec(&Counter { nodes: used })
            .map_err(|e| TxnError::Decode(e.to_string()))?;
        w.put_raw(COUNTER_KEY, self.rev, value);
        Ok(())
    }
}

/// Set the counter to `used` unless someone wrote it since `pool` was read (the audit).
pub async fn correct(
    backend: &Arc<dyn KvBackend>,
    pool: &Pool,
    used: u32,
) -> Result<bool, TxnError> {
    let mut w = GuardedWrite::new();
    pool.put_counter(&mut w, used)?;
    w.commit(backend).await
}
