//! Cluster settings an administrator changes while the cluster runs, without restarting
//! a server (`lattice admin config set scheduling.max_dag_size=2000`, the seed's "DAG
//! size limit"). Each one lives in the store under [`STORE_PREFIX`] + its key, as JSON; a
//! server flag gives the value used while none is stored.
//!
//! The API: `GET /v1/admin/config` (all settings), `GET /v1/admin/config/{key}`,
//! `PUT /v1/admin/config/{key}` with `{"value": ...}` (administrators), `DELETE
//! /v1/admin/config/{key}` (back to the server's flag). Answers are [`SettingValue`]s.
//!
//! ```
//! use lattice_apis::cluster_config::{find, MAX_DAG_SIZE};
//!
//! let s = find(MAX_DAG_SIZE).expect("known");
//! assert_eq!(s.check(&serde_json::json!(2000)), Ok(serde_json::json!(2000)));
//! assert!(s.check(&serde_json::json!("lots")).unwrap_err().contains("whole number"));
//! assert!(find("scheduling.nope").is_none());
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where the settings live in the store.
pub const STORE_PREFIX: &str = "/lattice/config/";

/// Largest `Dag` (tasks) the API server admits.
pub const MAX_DAG_SIZE: &str = "scheduling.max_dag_size";

/// Largest value `scheduling.max_dag_size` may take: a Dag's tasks are one object, and
/// the request size limit caps it long before this.
pub const MAX_DAG_SIZE_CEILING: u64 = 100_000;

/// Most nodes claimed for sensitive work at once, over the whole cluster (the seed's
/// system-wide `sensitive_pool_size` hard quota). Unset: no cluster-wide limit (a tenant's
/// `quota.sensitivePoolSize` still applies).
pub const SENSITIVE_POOL_SIZE: &str = "scheduling.sensitive_pool_size";

/// Largest value `scheduling.sensitive_pool_size` may take.
pub const SENSITIVE_POOL_CEILING: u64 = 1_000_000;

/// One setting the cluster knows.
#[derive(Debug)]
pub struct Setting {
    /// Dotted key (`scheduling.max_dag_size`).
    pub key: &'static str,
    /// What it does, for `lattice admin config get` and errors.
    pub description: &'static str,
    /// The server flag that gives the value while none is stored.
    pub flag: &'static str,
    check: fn(&Value) -> Result<Value, String>,
}

impl Setting {
    /// The value to store for `v`, or why `v` is not acceptable (names the fix).
    pub fn check(&self, v: &Value) -> Result<Value, String> {
        (self.check)(v)
    }

    /// The store key of this setting.
    pub fn store_key(&self) -> String {
        format!("{STORE_PREFIX}{}", self.key)
    }
}

fn check_max_dag_size(v: &Value) -> Result<Value, String> {
    // Accept "2000" too: `lattice admin config set k=2000` may arrive as text.
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if (1..=MAX_DAG_SIZE_CEILING).contains(&n) => Ok(Value::from(n)),
        _ => Err(format!(
            "{MAX_DAG_SIZE} must be a whole number of tasks from 1 to {MAX_DAG_SIZE_CEILING}, got {v}; e.g. {MAX_DAG_SIZE}=2000"
        )),
    }
}

fn check_sensitive_pool_size(v: &Value) -> Result<Value, String> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if n <= SENSITIVE_POOL_CEILING => Ok(Value::from(n)),
        _ => Err(format!(
            "{SENSITIVE_POOL_SIZE} must be a whole number of nodes from 0 to {SENSITIVE_POOL_CEILING}, got {v}; e.g. {SENSITIVE_POOL_SIZE}=64"
        )),
    }
}

/// Every setting, by key.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: MAX_DAG_SIZE,
        description: "most tasks a Dag may have; larger Dags are refused at admission (Dags admitted under a higher limit keep running)",
        flag: "lattice-server --max-dag-size",
        check: check_max_dag_size,
    },
    Setting {
        key: SENSITIVE_POOL_SIZE,
        description: "most nodes claimed for sensitive work at once, over the whole cluster (a hard limit checked in the binding transaction; claims beyond it wait)",
        flag: "none: unset means no cluster-wide limit",
        check: check_sensitive_pool_size,
    },
];

/// The setting named `key`.
pub fn find(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

/// The keys, for messages.
pub fn keys() -> String {
    SETTINGS
        .iter()
        .map(|s| s.key)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A setting as the API answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingValue {
    /// Dotted key.
    pub key: String,
    /// The value in force.
    pub value: Value,
    /// `cluster` (set with `lattice admin config set`) or `server` (the server's flag).
    pub source: String,
    /// What it does.
    pub description: String,
}

/// The body of `PUT /v1/admin/config/{key}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetSetting {
    /// The new value.
    pub value: Value,
}
