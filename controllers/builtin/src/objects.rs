//! Multi-object store transactions for the writes that must be atomic across objects
//! (binding: allocation + nodes + tenant; release: nodes + tenant). Everything else goes
//! through the typed API.
//!
//! Objects are stored exactly as the API server stores them (JSON without
//! `metadata.resourceVersion`, which is the key's `mod_revision`), so the API server's
//! watch cache, the informers and every client see these writes like any other.

use std::sync::Arc;

use bytes::Bytes;
use lattice_apis::Resource;
use lattice_store::{
    Compare, CompareResult, KeyRange, KeyValue, KvBackend, PutRequest, RangeRequest, TxnOp,
    TxnOpResponse, TxnRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Store key of a `K` (the API server's layout).
pub fn key_of<K: Resource>(namespace: Option<&str>, name: &str) -> String {
    let prefix = format!("/registry/lattice.dev/{}/", K::PLURAL);
    match (K::NAMESPACED, namespace) {
        (true, Some(ns)) => format!("{prefix}{ns}/{name}"),
        _ => format!("{prefix}{name}"),
    }
}

/// An object as read from the store, with the revision it was read at.
#[derive(Debug, Clone)]
pub struct Stored<K> {
    /// Store key.
    pub key: String,
    /// The object (typed).
    pub obj: K,
    /// `mod_revision` of the key when read: the guard of a later write.
    pub rev: i64,
}

/// Errors of this module.
#[derive(Debug)]
pub enum TxnError {
    /// The store failed.
    Store(lattice_store::StoreError),
    /// A stored object did not decode.
    Decode(String),
}

impl std::fmt::Display for TxnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => write!(f, "store: {e}"),
            Self::Decode(e) => write!(f, "decode: {e}"),
        }
    }
}

impl std::error::Error for TxnError {}

impl From<lattice_store::StoreError> for TxnError {
    fn from(e: lattice_store::StoreError) -> Self {
        Self::Store(e)
    }
}

/// The raw values of `keys` (of any kinds) at one store revision: one read-only
/// transaction. Decode each with [`decode`].
pub async fn read_raw(
    backend: &Arc<dyn KvBackend>,
    keys: &[String],
) -> Result<Vec<Option<KeyValue>>, TxnError> {
    let req = TxnRequest {
        compare: Vec::new(),
        success: keys
            .iter()
            .map(|k| {
                TxnOp::Range(RangeRequest {
                    range: KeyRange::single(Bytes::from(k.clone())),
                    ..Default::default()
                })
            })
            .collect(),
        failure: Vec::new(),
    };
    let resp = backend.txn(req).await?;
    let mut out: Vec<Option<KeyValue>> = resp
        .responses
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Range(r) => r.kvs.into_iter().next(),
            _ => None,
        })
        .collect();
    out.resize(keys.len(), None);
    Ok(out)
}

/// Decode a value read from `key` by [`read_raw`].
pub fn decode<K: Resource + DeserializeOwned>(
    key: &str,
    kv: Option<KeyValue>,
) -> Result<Option<Stored<K>>, TxnError> {
    let Some(kv) = kv else {
        return Ok(None);
    };
    let obj: K =
        serde_json::from_slice(&kv.value).map_err(|e| TxnError::Decode(format!("{key}: {e}")))?;
    Ok(Some(Stored {
        key: key.to_string(),
        obj,
        rev: kv.mod_revision,
    }))
}

/// Decode the next `keys.len()` values of `raw` (the part of a [`read_raw`] answer that
/// belongs to `keys`).
pub fn decode_next<K: Resource + DeserializeOwned>(
    raw: &mut impl Iterator<Item = Option<KeyValue>>,
    keys: &[String],
) -> Result<Vec<Option<Stored<K>>>, TxnError> {
    keys.iter()
        .map(|k| decode(k, raw.next().flatten()))
        .collect()
}

/// Every object of two kinds, read at one store revision (one read-only transaction):
/// what an audit that compares them needs.
pub async fn read_two_kinds<A, B>(
    backend: &Arc<dyn KvBackend>,
) -> Result<(Vec<Stored<A>>, Vec<Stored<B>>), TxnError>
where
    A: Resource + DeserializeOwned,
    B: Resource + DeserializeOwned,
{
    let prefix = |plural: &str| {
        TxnOp::Range(RangeRequest {
            range: KeyRange::prefix(Bytes::from(format!("/registry/lattice.dev/{plural}/"))),
            ..Default::default()
        })
    };
    let resp = backend
        .txn(TxnRequest {
            compare: Vec::new(),
            success: vec![prefix(A::PLURAL), prefix(B::PLURAL)],
            failure: Vec::new(),
        })
        .await?;
    let mut it = resp.responses.into_iter();
    let decode = |r: Option<TxnOpResponse>| -> Result<Vec<(String, Bytes, i64)>, TxnError> {
        match r {
            Some(TxnOpResponse::Range(r)) => Ok(r
                .kvs
                .into_iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(&kv.key).into_owned(),
                        kv.value,
                        kv.mod_revision,
                    )
                })
                .collect()),
            _ => Ok(Vec::new()),
        }
    };
    let a = decode(it.next())?
        .into_iter()
        .map(|(key, v, rev)| {
            serde_json::from_slice::<A>(&v)
                .map(|obj| Stored {
                    key: key.clone(),
                    obj,
                    rev,
                })
                .map_err(|e| TxnError::Decode(format!("{key}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let b = decode(it.next())?
        .into_iter()
        .map(|(key, v, rev)| {
            serde_json::from_slice::<B>(&v)
                .map(|obj| Stored {
                    key: key.clone(),
                    obj,
                    rev,
                })
                .map_err(|e| TxnError::Decode(format!("{key}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((a, b))
}

/// A write across objects that succeeds only if none of them changed since read.
#[derive(Default)]
pub struct GuardedWrite {
    compare: Vec<Compare>,
    puts: Vec<TxnOp>,
}

impl GuardedWrite {
    /// An empty write.
    pub fn new() -> Self {
        Self::default()
    }

    /// Write `obj` back to where it was read from, guarded by its read revision.
    pub fn put<K: Resource + Serialize>(
        &mut self,
        stored: &Stored<K>,
        obj: &K,
    ) -> Result<(), TxnError> {
        self.compare.push(Compare::mod_revision(
            Bytes::from(stored.key.clone()),
            CompareResult::Equal,
            stored.rev,
        ));
        let mut v = serde_json::to_value(obj).map_err(|e| TxnError::Decode(e.to_string()))?;
        if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            m.remove("resourceVersion");
        }
        let value = serde_json::to_vec(&v).map_err(|e| TxnError::Decode(e.to_string()))?;
        self.puts.push(TxnOp::Put(PutRequest {
            key: Bytes::from(stored.key.clone()),
            value: Bytes::from(value),
            ..Default::default()
        }));
        Ok(())
    }

    /// Guard on an object that is read but not written.
    pub fn guard<K>(&mut self, stored: &Stored<K>) {
        self.compare.push(Compare::mod_revision(
            Bytes::from(stored.key.clone()),
            CompareResult::Equal,
            stored.rev,
        ));
    }

    /// Guard on a plain key (not an object) read at `rev` (0: it did not exist).
    pub fn guard_raw(&mut self, key: &str, rev: i64) {
        self.compare.push(Compare::mod_revision(
            Bytes::from(key.to_string()),
            CompareResult::Equal,
            rev,
        ));
    }

    /// Write a plain key read at `rev` (0: it did not exist), guarded by that revision.
    pub fn put_raw(&mut self, key: &str, rev: i64, value: Vec<u8>) {
        self.guard_raw(key, rev);
        self.puts.push(TxnOp::Put(PutRequest {
            key: Bytes::from(key.to_string()),
            value: Bytes::from(value),
            ..Default::default()
        }));
    }

    /// Whether nothing would be written.
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty()
    }

    /// Commit: `Ok(false)` when a guard failed (someone else wrote first).
    pub async fn commit(self, backend: &Arc<dyn KvBackend>) -> Result<bool, TxnError> {
        if self.puts.is_empty() {
            return Ok(true);
        }
        let resp = backend
            .txn(TxnRequest {
                compare: self.compare,
                success: self.puts,
                failure: Vec::new(),
            })
            .await?;
        Ok(resp.succeeded)
    }
}
