//! Kind resolution: user-typed names ("alloc", "allocations", "Allocation") to the
//! plural, scope and printer columns of a resource.
//!
//! Built-in kinds come from `lattice-apis`; anything else (plugin kinds, kinds newer than
//! this client) comes from API discovery with NAME/AGE columns.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::client::{Client, ClientError};
use crate::errors::CliError;

/// The API group of the built-in kinds.
pub const GROUP: &str = "lattice.dev";
/// The group/version of the built-in kinds.
pub use lattice_apis::wellknown::API_VERSION as GROUP_VERSION;

/// A printer column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// JSONPath-like path, e.g. `.status.phase`.
    pub json_path: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// 0 = always shown; 1 = `-o wide` only.
    pub priority: i32,
}

impl Column {
    pub fn new(name: &str, json_path: &str, type_: &str, priority: i32) -> Column {
        Column {
            name: name.to_string(),
            json_path: json_path.to_string(),
            type_: type_.to_string(),
            priority,
        }
    }
}

/// What the CLI needs to know about a kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindMeta {
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub group_version: String,
    pub verbs: Vec<String>,
    pub columns: Vec<Column>,
}

impl KindMeta {
    /// Builds a kind with no printer columns.
    pub fn new(kind: &str, plural: &str, namespaced: bool) -> KindMeta {
        KindMeta {
            kind: kind.to_string(),
            plural: plural.to_string(),
            singular: kind.to_lowercase(),
            short_names: Vec::new(),
            namespaced,
            group_version: GROUP_VERSION.to_string(),
            verbs: Vec::new(),
            columns: Vec::new(),
        }
    }

    /// The group part of the group/version ("" for the core group).
    pub fn group(&self) -> &str {
        match self.group_version.split_once('/') {
            Some((g, _)) => g,
            None => "",
        }
    }

    fn api_prefix(&self) -> String {
        if self.group_version.contains('/') {
            format!("/apis/{}", self.group_version)
        } else {
            format!("/api/{}", self.group_version)
        }
    }

    /// Path of the collection; `tenant = None` for cluster-scoped kinds or all tenants.
    pub fn collection_path(&self, tenant: Option<&str>) -> String {
        match tenant.filter(|_| self.namespaced) {
            Some(t) => format!("{}/namespaces/{}/{}", self.api_prefix(), t, self.plural),
            None => format!("{}/{}", self.api_prefix(), self.plural),
        }
    }

    /// Path of one object.
    pub fn object_path(&self, tenant: Option<&str>, name: &str) -> String {
        format!("{}/{}", self.collection_path(tenant), name)
    }

    /// Lowercase kind name used in messages: `allocation`.
    pub fn display(&self) -> String {
        if self.singular.is_empty() {
            self.kind.to_lowercase()
        } else {
            self.singular.clone()
        }
    }

    /// True when `name` (as typed by a user) refers to this kind.
    pub fn matches(&self, name: &str) -> bool {
        let n = name.to_lowercase();
        let n = n
            .strip_suffix(&format!(".{}", self.group()))
            .map(str::to_string)
            .unwrap_or(n);
        n == self.kind.to_lowercase()
            || n == self.plural
            || n == self.singular
            || self.short_names.contains(&n)
    }

    fn supports(&self, verb: &str) -> bool {
        self.verbs.is_empty() || self.verbs.iter().any(|v| v == verb)
    }

    /// Kinds that can be listed and deleted (candidates for pruning).
    pub fn prunable(&self) -> bool {
        self.supports("list") && self.supports("delete")
    }
}

/// Converts one `lattice-apis` registry entry.
pub fn from_kind_info(k: &lattice_apis::KindInfo) -> KindMeta {
    KindMeta {
        kind: k.kind.to_string(),
        plural: k.plural.to_string(),
        singular: k.singular.to_string(),
        short_names: k.short_names.iter().map(|s| s.to_string()).collect(),
        namespaced: k.namespaced,
        group_version: k.api_version().to_string(),
        verbs: Vec::new(),
        columns: k
            .printer_columns
            .iter()
            .map(|c| Column::new(c.name, c.json_path, c.type_, c.priority))
            .collect(),
    }
}

/// The built-in kinds of `lattice-apis`.
pub fn builtin_kinds() -> Vec<KindMeta> {
    lattice_apis::kinds().iter().map(from_kind_info).collect()
}

/// Parses an `APIResourceList` document into kinds (subresources skipped).
pub fn parse_discovery(doc: &Value) -> Vec<KindMeta> {
    let gv = doc
        .get("groupVersion")
        .and_then(Value::as_str)
        .unwrap_or(GROUP_VERSION)
        .to_string();
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    doc.get("resources")
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .filter_map(|r| {
                    let name = r.get("name")?.as_str()?;
                    if name.contains('/') {
                        return None;
                    }
                    let kind = r.get("kind").and_then(Value::as_str).unwrap_or(name);
                    let singular = r
                        .get("singularName")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .unwrap_or_else(|| kind.to_lowercase());
                    Some(KindMeta {
                        kind: kind.to_string(),
                        plural: name.to_string(),
                        singular,
                        short_names: strs(r.get("shortNames")),
                        namespaced: r.get("namespaced").and_then(Value::as_bool).unwrap_or(true),
                        group_version: gv.clone(),
                        verbs: strs(r.get("verbs")),
                        columns: Vec::new(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Resolves kinds from the built-in registry, then discovery (cached per group/version).
#[derive(Debug, Default)]
pub struct Catalog {
    builtin: Vec<KindMeta>,
    discovered: BTreeMap<String, Vec<KindMeta>>,
}

impl Catalog {
    /// The catalog with the `lattice-apis` kinds.
    pub fn with_builtins() -> Catalog {
        Catalog::new(builtin_kinds())
    }

    /// A catalog with the given static kinds (tests use this for stable columns).
    pub fn new(builtin: Vec<KindMeta>) -> Catalog {
        Catalog {
            builtin,
            discovered: BTreeMap::new(),
        }
    }

    /// Fetches (once) the discovery document of `gv`; a 404 means "no such group".
    pub async fn discover(
        &mut self,
        client: &Client,
        gv: &str,
    ) -> Result<Vec<KindMeta>, ClientError> {
        if let Some(k) = self.discovered.get(gv) {
            return Ok(k.clone());
        }
        let path = if gv.contains('/') {
            format!("/apis/{gv}")
        } else {
            format!("/api/{gv}")
        };
        let kinds = match client.get(&path).await {
            Ok(doc) => {
                let mut ks = parse_discovery(&doc);
                for k in &mut ks {
                    if let Some(b) = self
                        .builtin
                        .iter()
                        .find(|b| b.kind == k.kind && b.group_version == k.group_version)
                    {
                        k.columns = b.columns.clone();
                    }
                }
                ks
            }
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e),
        };
        self.discovered.insert(gv.to_string(), kinds.clone());
        Ok(kinds)
    }

    /// Resolves a name typed by a user (`alloc`, `allocations`, `Allocation`,
    /// `allocations.lattice.dev`).
    pub async fn resolve(&mut self, client: &Client, name: &str) -> Result<KindMeta, CliError> {
        if let Some(k) = self.builtin.iter().find(|k| k.matches(name)) {
            return Ok(k.clone());
        }
        let discovered = self
            .discover(client, GROUP_VERSION)
            .await
            .map_err(|e| CliError::from_client(format!("look up resource type {name:?}"), e))?;
        if let Some(k) = discovered.iter().find(|k| k.matches(name)) {
            return Ok(k.clone());
        }
        Err(self.unknown_kind(name, &discovered))
    }

    /// Resolves `apiVersion` + `kind` from a manifest.
    pub async fn resolve_gvk(
        &mut self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<KindMeta, CliError> {
        if let Some(k) = self
            .builtin
            .iter()
            .find(|k| k.kind == kind && k.group_version == api_version)
        {
            return Ok(k.clone());
        }
        let discovered = self.discover(client, api_version).await.map_err(|e| {
            CliError::from_client(format!("look up kind {kind} ({api_version})"), e)
        })?;
        if let Some(k) = discovered.iter().find(|k| k.kind == kind) {
            return Ok(k.clone());
        }
        let mut err = self.unknown_kind(kind, &discovered);
        err.why = format!("the server does not serve kind {kind:?} in {api_version}");
        Err(err)
    }

    fn unknown_kind(&self, name: &str, discovered: &[KindMeta]) -> CliError {
        let mut all: BTreeMap<String, &KindMeta> = BTreeMap::new();
        for k in self.builtin.iter().chain(discovered.iter()) {
            all.entry(k.plural.clone()).or_insert(k);
        }
        let mut e = CliError::new(
            format!("unknown resource type {name:?}"),
            "the server has no such kind",
        );
        if all.is_empty() {
            e = e.detail("the server lists no kinds at all");
        } else {
            let names: Vec<String> = all
                .values()
                .map(|k| {
                    if k.short_names.is_empty() {
                        k.plural.clone()
                    } else {
                        format!("{} ({})", k.plural, k.short_names.join(", "))
                    }
                })
                .collect();
            e = e.detail(format!("known kinds: {}", names.join(", ")));
        }
        e.hint("run `lattice api-resources` to list every kind the server serves")
    }

    /// Every kind known (builtins plus lattice.dev discovery when reachable).
    pub async fn all(&mut self, client: &Client) -> Vec<KindMeta> {
        let mut out = self.builtin.clone();
        if let Ok(ds) = self.discover(client, GROUP_VERSION).await {
            for d in ds {
                if !out
                    .iter()
                    .any(|k| k.kind == d.kind && k.group_version == d.group_version)
                {
                    out.push(d);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_matching() {
        let mut k = KindMeta::new("Allocation", "allocations", true);
        k.short_names = vec!["alloc".into()];
        assert_eq!(
            k.object_path(Some("physics"), "a1"),
            "/apis/lattice.dev/v1alpha1/namespaces/physics/allocations/a1"
        );
        assert_eq!(
            k.collection_path(None),
            "/apis/lattice.dev/v1alpha1/allocations"
        );
        for n in [
            "alloc",
            "allocation",
            "Allocation",
            "allocations",
            "allocations.lattice.dev",
        ] {
            assert!(k.matches(n), "{n}");
        }
        assert!(!k.matches("node"));
        let n = KindMeta::new("Node", "nodes", false);
        assert_eq!(
            n.object_path(Some("x"), "n1"),
            "/apis/lattice.dev/v1alpha1/nodes/n1"
        );
    }

    #[test]
    fn builtins_come_from_lattice_apis() {
        let ks = builtin_kinds();
        let alloc = ks
            .iter()
            .find(|k| k.matches("alloc"))
            .expect("allocations built in");
        assert_eq!(alloc.plural, "allocations");
        assert!(alloc.namespaced);
        assert!(!alloc.columns.is_empty());
        assert_eq!(alloc.group_version, GROUP_VERSION);
    }

    #[test]
    fn discovery_parsing_skips_subresources() {
        let doc = serde_json::json!({"groupVersion":"lattice.dev/v1alpha1","resources":[
            {"name":"allocations","singularName":"allocation","namespaced":true,"kind":"Allocation","verbs":["get","list"],"shortNames":["alloc"]},
            {"name":"allocations/status","namespaced":true,"kind":"Allocation"},
            {"name":"nodes","singularName":"","namespaced":false,"kind":"Node"}]});
        let ks = parse_discovery(&doc);
        assert_eq!(ks.len(), 2);
        assert_eq!(ks[0].short_names, vec!["alloc".to_string()]);
        assert_eq!(ks[1].singular, "node");
        assert!(!ks[1].namespaced);
    }
}
