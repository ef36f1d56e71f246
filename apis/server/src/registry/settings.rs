//! The cluster settings of [`lattice_apis::cluster_config`] as the store holds them: what
//! an administrator set, and the limits in force that the verbs apply (the HTTP routes
//! that read and change them are `crate::cluster_config`'s).

use bytes::Bytes;
use lattice_apis::cluster_config::{self as cc, Setting};
use lattice_store::KvBackend;
use serde_json::Value;

use crate::registry::errors::{ApiError, ApiResult};

/// The stored value of `s`, if an administrator set one.
pub async fn stored(backend: &dyn KvBackend, s: &Setting) -> ApiResult<Option<Value>> {
    let kv = backend
        .get(Bytes::from(s.store_key()))
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot read the setting {}: {e}", s.key)))?;
    match kv {
        None => Ok(None),
        Some(kv) => serde_json::from_slice(&kv.value).map(Some).map_err(|e| {
            ApiError::internal(format!(
                "the stored setting {} is not JSON ({e}); set it again with `lattice admin config set {}=VALUE`",
                s.key, s.key
            ))
        }),
    }
}

/// The Dag size limit in force: the cluster setting, else `flag` (`--max-dag-size`). A
/// stored value that is not a valid limit (written around the API) counts as unset, with
/// a warning: it must not block every Dag write.
pub async fn max_dag_size(backend: &dyn KvBackend, flag: usize) -> ApiResult<usize> {
    let s = setting(cc::MAX_DAG_SIZE)?;
    let kv = backend
        .get(Bytes::from(s.store_key()))
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot read the setting {}: {e}", s.key)))?;
    let Some(kv) = kv else {
        return Ok(flag);
    };
    let valid = serde_json::from_slice::<Value>(&kv.value)
        .ok()
        .and_then(|v| s.check(&v).ok())
        .and_then(|v| v.as_u64())
        .and_then(|n| usize::try_from(n).ok());
    Ok(valid.unwrap_or_else(|| {
        tracing::warn!(
            key = s.key,
            "the stored cluster setting is not a valid value; using the server's flag (set it again with `lattice admin config set`)"
        );
        flag
    }))
}

/// The setting named `key`; 404 naming the settings there are.
pub fn setting(key: &str) -> ApiResult<&'static Setting> {
    cc::find(key).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            format!(
                "there is no cluster setting {key:?}; the settings are: {}",
                cc::keys()
            ),
        )
    })
}
