//! The verbs over the store: get, list, create, replace, patch (merge, JSON, apply),
//! delete. Every write is one store transaction guarded by a `mod_revision` compare
//! (create: `== 0`; update and delete: `==` the revision read), so optimistic
//! concurrency needs no in-process locks.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use lattice_apis::KindInfo;
use lattice_store::{
    prefix_end, Compare, CompareResult, DeleteRangeRequest, KeyRange, KvBackend, PutRequest,
    RangeRequest, StoreError, TxnOp, TxnOpResponse, TxnRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::registry::apply;
use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::identity::{self, UserInfo};
use crate::registry::objects::*;
use crate::registry::patch::{apply_patch, PatchType};
use crate::registry::selectors::Selectors;

/// How many times a PATCH or DELETE re-reads and retries after losing a compare race.
const MAX_RETRIES: usize = 32;
const DEFAULT_MANAGER: &str = "unknown";

#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub force: bool,
}

impl WriteOptions {
    fn manager(&self) -> &str {
        self.field_manager.as_deref().unwrap_or(DEFAULT_MANAGER)
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub selectors: Selectors,
    pub limit: i64,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: i64,
    start: String,
}

pub fn encode_continue(rv: i64, start: &[u8]) -> String {
    let t = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: base64::engine::general_purpose::STANDARD.encode(start),
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_continue(s: &str) -> ApiResult<(i64, Vec<u8>)> {
    let bad = || {
        ApiError::bad_request(
            "invalid continue token: it was not issued by this server for this list",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| bad())?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let start = base64::engine::general_purpose::STANDARD
        .decode(&t.start)
        .map_err(|_| bad())?;
    if t.rv <= 0 {
        return Err(bad());
    }
    Ok((t.rv, start))
}

/// The verbs, over one backend.
#[derive(Clone)]
pub struct Resources {
    pub backend: Arc<dyn KvBackend>,
    /// Per kind: the lists its schema merges by key (server-side apply).
    lists: Arc<std::collections::HashMap<&'static str, apply::ListMaps>>,
    /// Most tasks (`spec.allocations`) a `Dag` may have (`lattice-server --max-dag-size`).
    max_dag_size: usize,
    /// Whom the writes are for (see [`acting_as`](Self::acting_as)).
    caller: Option<UserInfo>,
    /// The server's own writes, trusted whoever the request is from (see
    /// [`trusted`](Self::trusted)).
    trusted: bool,
    /// Per-tenant object-count quotas checked on create ([`crate::registry::quota`]).
    quotas: Option<Arc<crate::registry::quota::Counts>>,
    /// Decoded copies of the objects admission reads on every write ([`Self::typed`]).
    typed: Arc<TypedCache>,
    /// Told of every person's write of sensitive work before it is committed (the audit
    /// log: see [`SensitiveWrites`]).
    sensitive: Arc<std::sync::OnceLock<Arc<dyn SensitiveWrites>>>,
}

/// What must happen before a person's write of sensitive work is committed: the audit
/// log commits its record of it (through the store), and an error stops the write.
#[async_trait::async_trait]
pub trait SensitiveWrites: Send + Sync {
    /// `caller` is about to `verb` (create, update, delete) `kind` `ns/name`.
    async fn before(
        &self,
        caller: &UserInfo,
        verb: &str,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<()>;
}

/// Whether `v` (an Allocation, or a Dag with a sensitive task) is or makes sensitive work.
fn is_sensitive(v: &Value) -> bool {
    let sensitive = |s: &Value| s.pointer("/spec/sensitive").and_then(Value::as_bool) == Some(true);
    sensitive(v)
        || v.pointer("/spec/allocations")
            .and_then(Value::as_array)
            .is_some_and(|tasks| tasks.iter().any(sensitive))
}

/// Most entries [`TypedCache`] holds before it starts over: admission reads Tenants and
/// vClusters, a few thousand at most on the largest site.
const TYPED_CACHE_ENTRIES: usize = 8192;

/// Decoded objects by store key, each valid for as long as the key's `mod_revision` is
/// the one it was decoded at: admission reads the caller's Tenant and vCluster on every
/// write, and decoding them each time cost more than the rest of admission together.
#[derive(Default)]
struct TypedCache {
    map: std::sync::Mutex<std::collections::HashMap<Bytes, TypedEntry>>,
}

type TypedEntry = (i64, Arc<dyn std::any::Any + Send + Sync>);

impl TypedCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Bytes, TypedEntry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum WriteOutcome {
    Done(Value),
    /// Lost the compare race: the key changed since it was read.
    Raced,
}

impl Resources {
    pub fn new(backend: Arc<dyn KvBackend>) -> Self {
        let lists = lattice_apis::kinds()
            .iter()
            .map(|k| (k.plural, apply::ListMaps::from_schema(&(k.schema)())))
            .collect();
        Self {
            backend,
            lists: Arc::new(lists),
            max_dag_size: lattice_apis::kinds::dag::DEFAULT_MAX_DAG_SIZE,
            caller: None,
            trusted: false,
            quotas: None,
            typed: Arc::default(),
            sensitive: Arc::default(),
        }
    }

    /// Calls `hook` before every person's write of sensitive work (once; later calls do
    /// nothing).
    pub fn set_sensitive_writes(&self, hook: Arc<dyn SensitiveWrites>) {
        let _ = self.sensitive.set(hook);
    }

    /// Tells the hook of a person's write of `kind` `old` → `new` when either is sensitive.
    async fn before_sensitive(
        &self,
        caller: &UserInfo,
        verb: &str,
        kind: &'static KindInfo,
        obj: &Value,
        other: Option<&Value>,
    ) -> ApiResult<()> {
        let Some(hook) = self.sensitive.get() else {
            return Ok(());
        };
        if !matches!(kind.kind, "Allocation" | "Dag")
            || caller.is_system()
            || caller.role == crate::registry::identity::Role::Node
            || !(is_sensitive(obj) || other.is_some_and(is_sensitive))
        {
            return Ok(());
        }
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        hook.before(
            caller,
            verb,
            kind,
            ns,
            crate::registry::objects::name_of(obj),
        )
        .await
    }

    /// The object `ns/name` of `kind` decoded as `T`, for the server's own checks (no
    /// caller's read rules apply): the current version, decoded once per version.
    pub(crate) async fn typed<T>(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Option<Arc<T>>>
    where
        T: serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        let key = object_key(kind, ns, name);
        let Some(kv) = self.backend.get(key.clone()).await? else {
            return Ok(None);
        };
        let hit = self
            .typed
            .lock()
            .get(&key)
            .filter(|(rev, _)| *rev == kv.mod_revision)
            .and_then(|(_, v)| v.clone().downcast::<T>().ok());
        if let Some(v) = hit {
            return Ok(Some(v));
        }
        let v: Arc<T> = Arc::new(serde_json::from_slice(&kv.value).map_err(|e| {
            ApiError::internal(format!("a stored {} does not decode: {e}", kind.kind))
        })?);
        let mut map = self.typed.lock();
        if map.len() >= TYPED_CACHE_ENTRIES {
            map.clear();
        }
        map.insert(key, (kv.mod_revision, v.clone()));
        Ok(Some(v))
    }

    /// Check creates against the tenants' object-count quotas kept by `quotas`.
    pub fn with_quotas(mut self, quotas: Arc<crate::registry::quota::Counts>) -> Self {
        self.quotas = Some(quotas);
        self
    }

    /// These verbs on behalf of an authenticated caller: writes of `Allocation`s and
    /// `Dag`s follow the caller's rules for the `lattice.dev/user` annotation
    /// ([`identity::admit_user_on_create`], [`identity::admit_user_on_update`]). Without it the
    /// caller is the HTTP request's ([`identity::request_user`]), and outside a request
    /// (in-process callers such as the built-in controllers) the writes are trusted.
    pub fn acting_as(&self, user: &UserInfo) -> Self {
        Self {
            caller: Some(user.clone()),
            ..self.clone()
        }
    }

    /// These verbs as the server itself, whoever the request being served is from: for
    /// what a handler writes on the caller's behalf after checking it (a node's report,
    /// which the server applies to the allocation itself).
    pub fn trusted(&self) -> Self {
        Self {
            caller: None,
            trusted: true,
            ..self.clone()
        }
    }

    /// The caller the writes are checked for; `None`: trusted in-process caller.
    fn caller(&self) -> Option<UserInfo> {
        if self.trusted {
            return None;
        }
        self.caller.clone().or_else(identity::request_user)
    }

    /// The administrator's limit on tasks per `Dag` (default
    /// [`DEFAULT_MAX_DAG_SIZE`](lattice_apis::kinds::dag::DEFAULT_MAX_DAG_SIZE)).
    pub fn with_max_dag_size(mut self, max_dag_size: usize) -> Self {
        self.max_dag_size = max_dag_size;
        self
    }

    /// The server's limit on tasks per `Dag` (`--max-dag-size`); the cluster setting
    /// `scheduling.max_dag_size` overrides it ([`dag_limit`](Self::dag_limit)).
    pub fn max_dag_size(&self) -> usize {
        self.max_dag_size
    }

    /// The limit on tasks per `Dag` in force for a write of `kind`: read from the store
    /// (the cluster setting, else the server's flag) only for writes that may grow a
    /// Dag's tasks; a `/status` write keeps the spec, so it needs no read.
    pub async fn dag_limit(&self, kind: &KindInfo, subresource: Option<&str>) -> ApiResult<usize> {
        if kind.kind != "Dag" || subresource == Some("status") {
            return Ok(self.max_dag_size);
        }
        crate::registry::settings::max_dag_size(&*self.backend, self.max_dag_size).await
    }

    /// Admission checks that depend on the server's configuration (the kinds' own
    /// `admit` takes none): a `Dag` may create at most `max_dag_size` allocations (a task
    /// group's elements each count). On update the limit applies only when that count grows, so a Dag admitted under a higher
    /// limit keeps accepting status writes and shrinking edits after the limit is lowered.
    fn admit_configured(
        &self,
        kind: &KindInfo,
        new: &Value,
        old: Option<&Value>,
        dag_limit: usize,
    ) -> ApiResult<()> {
        if kind.kind != "Dag" {
            return Ok(());
        }
        let tasks = |v: &Value| {
            v.pointer("/spec/allocations")
                .and_then(Value::as_array)
                .map_or(0, |tasks| {
                    tasks
                        .iter()
                        .map(lattice_apis::kinds::dag::task_allocation_count)
                        .sum()
                })
        };
        let n = tasks(new);
        if old.is_some_and(|o| n <= tasks(o)) {
            return Ok(());
        }
        match lattice_apis::kinds::dag::dag_size_error(n, dag_limit) {
            None => Ok(()),
            Some(msg) => Err(ApiError::invalid(
                kind.kind,
                name_of(new),
                vec![("spec.allocations".into(), msg)],
            )),
        }
    }

    /// The caller's object-level rules ([`crate::registry::admission`]) for storing `new` over
    /// `old`; trusted in-process callers pass.
    async fn admit_caller(
        &self,
        kind: &'static KindInfo,
        old: Option<&Value>,
        new: Value,
        subresource: Option<&str>,
    ) -> ApiResult<Value> {
        match self.caller() {
            Some(c) => {
                let new =
                    crate::registry::admission::admit_write(self, &c, kind, old, new, subresource)
                        .await?;
                let verb = if old.is_some() { "update" } else { "create" };
                self.before_sensitive(&c, verb, kind, &new, old).await?;
                Ok(new)
            }
            None => Ok(new),
        }
    }

    fn lists(&self, kind: &KindInfo) -> &apply::ListMaps {
        static EMPTY: std::sync::OnceLock<apply::ListMaps> = std::sync::OnceLock::new();
        self.lists
            .get(kind.plural)
            .unwrap_or_else(|| EMPTY.get_or_init(apply::ListMaps::default))
    }

    async fn read(&self, key: &Bytes) -> ApiResult<Option<(Value, i64)>> {
        match self.backend.get(key.clone()).await? {
            Some(kv) => Ok(Some((decode_kv(&kv)?, kv.mod_revision))),
            None => Ok(None),
        }
    }

    pub async fn get(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Value> {
        let key = object_key(kind, ns, name);
        match self.read(&key).await? {
            Some((v, _)) => {
                if let Some(c) = self.caller() {
                    crate::registry::authz::node_read(&c, kind, &v)?;
                    if let (Some(me), "Tenant") = (c.node_name(), kind.kind) {
                        self.node_reads_tenant(me, kind, name).await?;
                    }
                }
                Ok(v)
            }
            None => Err(ApiError::not_found(kind.kind, kind.plural, name)),
        }
    }

    /// A node reads the Tenant of the work its Node is owned by (its run-as policy), no
    /// other: a 404 otherwise.
    async fn node_reads_tenant(&self, me: &str, kind: &KindInfo, name: &str) -> ApiResult<()> {
        let nodes = crate::registry::objects::kind_by_plural("nodes")
            .ok_or_else(|| ApiError::internal("nodes not registered"))?;
        let owner = match self.read(&object_key(nodes, None, me)).await? {
            Some((n, _)) => n
                .pointer("/status/owner/tenant")
                .and_then(Value::as_str)
                .map(String::from),
            None => None,
        };
        if owner.as_deref() == Some(name) {
            Ok(())
        } else {
            Err(ApiError::not_found(kind.kind, kind.plural, name))
        }
    }

    /// List with selectors and pagination; returns the `<Kind>List`.
    pub async fn list(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> ApiResult<Value> {
        let prefix = list_prefix(kind, ns);
        let end = prefix_end(&prefix);
        let (mut rev, mut start) = match &opts.continue_token {
            Some(tok) if !tok.is_empty() => {
                let (rv, start) = decode_continue(tok)?;
                if !start.starts_with(&prefix) {
                    return Err(ApiError::bad_request(
                        "invalid continue token: it belongs to another list",
                    ));
                }
                (rv, Bytes::from(start))
            }
            _ => {
                let rv = match (
                    opts.resource_version.as_deref(),
                    opts.resource_version_match.as_deref(),
                ) {
                    (Some(rv), Some("Exact")) => parse_rv(rv)?,
                    (Some(rv), _) if !rv.is_empty() => {
                        parse_rv(rv)?;
                        0
                    }
                    _ => 0,
                };
                (rv, prefix.clone())
            }
        };
        let from_continue = opts
            .continue_token
            .as_deref()
            .is_some_and(|t| !t.is_empty());
        let limit = opts.limit.max(0);
        let page = if limit == 0 {
            0
        } else if opts.selectors.is_empty() {
            limit
        } else {
            limit.max(256)
        };
        let mut items = Vec::new();
        let mut continue_from: Option<Bytes> = None;
        let mut remaining: Option<i64> = None;
        loop {
            let req = RangeRequest {
                range: KeyRange::between(start.clone(), end.clone()),
                limit: page,
                revision: rev,
                ..Default::default()
            };
            let resp = match self.backend.range(req).await {
                Ok(r) => r,
                Err(StoreError::Compacted { compact_revision }) if from_continue => {
                    return Err(ApiError::expired(format!(
                        "The provided continue parameter is too old to display a consistent list result (compacted at revision {compact_revision}). You can start a new list without the continue parameter."
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            if rev == 0 {
                rev = resp.revision;
            }
            let n = resp.kvs.len();
            let mut stopped_at = None;
            for (i, kv) in resp.kvs.iter().enumerate() {
                let obj = decode_kv(kv)?;
                if opts.selectors.matches(&obj) {
                    items.push(obj);
                }
                if limit > 0 && items.len() as i64 >= limit {
                    stopped_at = Some(i);
                    break;
                }
            }
            match stopped_at {
                Some(i) => {
                    let more_in_page = i + 1 < n;
                    if more_in_page || resp.more {
                        let mut next = resp.kvs[i].key.to_vec();
                        next.push(0);
                        continue_from = Some(Bytes::from(next));
                        if opts.selectors.is_empty() {
                            remaining = Some(resp.count - (i as i64 + 1));
                        }
                    }
                    break;
                }
                None => {
                    if resp.more && n > 0 {
                        let mut next = resp.kvs[n - 1].key.to_vec();
                        next.push(0);
                        start = Bytes::from(next);
                        continue;
                    }
                    break;
                }
            }
        }
        let mut meta = Map::new();
        meta.insert("resourceVersion".into(), Value::String(rev.to_string()));
        if let Some(c) = continue_from {
            meta.insert("continue".into(), Value::String(encode_continue(rev, &c)));
            if let Some(r) = remaining.filter(|r| *r > 0) {
                meta.insert("remainingItemCount".into(), json!(r));
            }
        }
        Ok(json!({
            "apiVersion": lattice_apis::API_VERSION,
            "kind": format!("{}List", kind.kind),
            "metadata": meta,
            "items": items,
        }))
    }

    /// POST: create. `keep_managed` keeps managedFields computed by apply.
    pub async fn create(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
        keep_managed: bool,
    ) -> ApiResult<Value> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        check_type_meta(kind, &obj)?;
        let meta = meta_mut(&mut obj).ok_or_else(|| ApiError::bad_request("missing metadata"))?;
        match (kind.namespaced, ns) {
            (true, Some(ns)) => {
                if let Some(n) = meta.get("namespace").and_then(Value::as_str) {
                    if !n.is_empty() && n != ns {
                        return Err(ApiError::bad_request(format!(
                            "the namespace of the provided object ({n}) does not match the namespace sent on the request ({ns})"
                        )));
                    }
                }
                meta.insert("namespace".into(), Value::String(ns.to_string()));
            }
            (true, None) => {
                return Err(ApiError::bad_request(
                    "a namespace (tenant) is required to create this kind",
                ))
            }
            (false, _) => {
                meta.remove("namespace");
            }
        }
        let name = match meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            Some(n) => n.to_string(),
            None => match meta
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                Some(g) => {
                    let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..5].to_string();
                    let n = format!("{g}{suffix}");
                    meta.insert("name".into(), Value::String(n.clone()));
                    n
                }
                None => {
                    return Err(ApiError::invalid(
                        kind.kind,
                        "",
                        vec![(
                            "metadata.name".into(),
                            "name or generateName is required".into(),
                        )],
                    ))
                }
            },
        };
        meta.remove("resourceVersion");
        meta.remove("deletionTimestamp");
        meta.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        if !keep_managed {
            meta.remove("managedFields");
        }
        if kind.has_status {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        if !keep_managed {
            apply::record_update(None, &mut obj, opts.manager(), None, self.lists(kind));
        }
        // After the managed fields: a `lattice.dev/user` the server fills in belongs to
        // no field manager, so a later apply that omits it keeps it.
        identity::admit_user_on_create(self.caller().as_ref(), kind, &mut obj)?;
        let dag_limit = self.dag_limit(kind, None).await?;
        self.admit_configured(kind, &obj, None, dag_limit)?;
        let obj = admit(kind, obj)?;
        let obj = self.admit_caller(kind, None, obj, None).await?;
        if name_of(&obj) != name {
            return Err(ApiError::internal("admission changed the object's name"));
        }
        let key = object_key(kind, ns, &name);
        // Released on every way out but a committed create (dry runs are checked too).
        let reservation = match &self.quotas {
            Some(q) => q.reserve(kind, ns, self.caller().as_ref()).await?,
            None => None,
        };
        if opts.dry_run {
            if self.backend.get(key).await?.is_some() {
                return Err(ApiError::already_exists(kind.plural, &name));
            }
            return Ok(obj);
        }
        let value = encode(&obj)?;
        let resp = self
            .backend
            .txn(TxnRequest {
                compare: vec![Compare::mod_revision(key.clone(), CompareResult::Equal, 0)],
                success: vec![TxnOp::Put(PutRequest::new(key, value))],
                failure: vec![],
            })
            .await?;
        if !resp.succeeded {
            return Err(ApiError::already_exists(kind.plural, &name));
        }
        if let Some(r) = reservation {
            r.created(resp.revision);
        }
        let mut obj = obj;
        set_rv(&mut obj, resp.revision);
        Ok(obj)
    }

    /// Build the object to store from the current one and the caller's new version,
    /// following the spec/status rules; `None` when nothing changes.
    #[allow(clippy::too_many_arguments)]
    fn prepare_update(
        &self,
        kind: &'static KindInfo,
        old: &Value,
        new: Value,
        subresource: Option<&str>,
        opts: &WriteOptions,
        apply_op: bool,
        dag_limit: usize,
    ) -> ApiResult<Value> {
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        let name = name_of(old).to_string();
        let new_name = name_of(&new);
        if !new_name.is_empty() && new_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
        }
        if let (Some(a), Some(b)) = (meta_str(&new, "namespace"), meta_str(old, "namespace")) {
            if !a.is_empty() && a != b {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the object ({a}) does not match the namespace on the URL ({b})"
                )));
            }
        }
        check_type_meta(kind, &new)?;
        if kind.kind == "Allocation" && subresource == Some("status") {
            check_terminal_phase(old, &new)?;
        }
        let mut result = if subresource == Some("status") && !apply_op && old.is_object() {
            status_over(old, new)
        } else if subresource == Some("status") {
            let mut r = old.clone();
            if let Some(o) = r.as_object_mut() {
                match new.get("status") {
                    Some(s) if !s.is_null() => {
                        o.insert("status".into(), s.clone());
                    }
                    _ => {
                        o.remove("status");
                    }
                }
            }
            if apply_op {
                if let Some(mf) = new.pointer("/metadata/managedFields") {
                    if let Some(m) = meta_mut(&mut r) {
                        m.insert("managedFields".into(), mf.clone());
                    }
                }
            }
            r
        } else {
            let mut r = new;
            if let Some(o) = r.as_object_mut() {
                o.insert(
                    "apiVersion".into(),
                    Value::String(lattice_apis::API_VERSION.into()),
                );
                o.insert("kind".into(), Value::String(kind.kind.into()));
                if kind.has_status {
                    match old.get("status") {
                        Some(s) => {
                            o.insert("status".into(), s.clone());
                        }
                        None => {
                            o.remove("status");
                        }
                    }
                }
            }
            let om = old.get("metadata").cloned().unwrap_or(Value::Null);
            if let Some(m) = meta_mut(&mut r) {
                for f in [
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "namespace",
                    "name",
                ] {
                    match om.get(f) {
                        Some(v) => {
                            m.insert(f.into(), v.clone());
                        }
                        None => {
                            m.remove(f);
                        }
                    }
                }
                if !apply_op {
                    match om.get("managedFields") {
                        Some(v) => {
                            m.insert("managedFields".into(), v.clone());
                        }
                        None => {
                            m.remove("managedFields");
                        }
                    }
                }
                m.remove("resourceVersion");
            }
            r
        };
        identity::admit_user_on_update(self.caller().as_ref(), kind, old, &result)?;
        if is_terminating(old) {
            let old_f = finalizers(old);
            if finalizers(&result).iter().any(|f| !old_f.contains(f)) {
                return Err(ApiError::forbidden(format!(
                    "no new finalizers can be added if the object is being deleted ({} {name})",
                    kind.kind
                )));
            }
        }
        if !apply_op {
            apply::record_update(
                Some(old),
                &mut result,
                opts.manager(),
                subresource,
                self.lists(kind),
            );
        }
        self.admit_configured(kind, &result, Some(old), dag_limit)?;
        let mut result = admit(kind, result)?;
        let old_gen = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let gen = if !same_spec(&result, old) {
            old_gen + 1
        } else {
            old_gen
        };
        if let Some(m) = meta_mut(&mut result) {
            m.insert("generation".into(), json!(gen));
            m.remove("resourceVersion");
        }
        Ok(result)
    }

    /// Write `result` over `old` (read at `old_rev`): no-op, delete (last finalizer gone
    /// while terminating) or put.
    async fn commit(
        &self,
        kind: &'static KindInfo,
        key: Bytes,
        old: &Value,
        old_rev: i64,
        mut result: Value,
        dry_run: bool,
    ) -> ApiResult<WriteOutcome> {
        if same_but_rv(&result, old) {
            return Ok(WriteOutcome::Done(old.clone()));
        }
        let value = encode(&result)?;
        let delete_now = is_terminating(&result) && finalizers(&result).is_empty();
        if dry_run {
            set_rv(&mut result, old_rev);
            return Ok(WriteOutcome::Done(result));
        }
        let op = if delete_now {
            TxnOp::DeleteRange(DeleteRangeRequest {
                range: KeyRange::single(key.clone()),
                prev_kv: false,
            })
        } else {
            // An update never changes which store lease the key is attached to (a node's
            // heartbeat Lease must stay attached to its stream's lease).
            TxnOp::Put(PutRequest {
                ignore_lease: true,
                ..PutRequest::new(key.clone(), value)
            })
        };
        let resp = self
            .backend
            .txn(TxnRequest {
                compare: vec![Compare::mod_revision(key, CompareResult::Equal, old_rev)],
                success: vec![op],
                failure: vec![],
            })
            .await?;
        if !resp.succeeded {
            return Ok(WriteOutcome::Raced);
        }
        if delete_now {
            tracing::debug!(
                kind = kind.kind,
                name = name_of(&result),
                "last finalizer removed; object deleted"
            );
        }
        set_rv(&mut result, resp.revision);
        Ok(WriteOutcome::Done(result))
    }

    /// PUT (main resource or `/status`): `metadata.resourceVersion` is required.
    pub async fn replace(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        new: Value,
        subresource: Option<&str>,
        opts: &WriteOptions,
    ) -> ApiResult<Value> {
        let Some(rv) = rv_of(&new).map(String::from) else {
            return Err(ApiError::invalid(
                kind.kind,
                name,
                vec![(
                    "metadata.resourceVersion".into(),
                    "must be specified for an update".into(),
                )],
            ));
        };
        let rv = parse_rv(&rv)?;
        let key = object_key(kind, ns, name);
        let Some((old, old_rev)) = self.read(&key).await? else {
            return Err(ApiError::not_found(kind.kind, kind.plural, name));
        };
        if rv != old_rev {
            return Err(ApiError::stale(kind.plural, name));
        }
        let dag_limit = self.dag_limit(kind, subresource).await?;
        let result = self.prepare_update(kind, &old, new, subresource, opts, false, dag_limit)?;
        let result = self
            .admit_caller(kind, Some(&old), result, subresource)
            .await?;
        match self
            .commit(kind, key, &old, old_rev, result, opts.dry_run)
            .await?
        {
            WriteOutcome::Done(v) => Ok(v),
            WriteOutcome::Raced => Err(ApiError::stale(kind.plural, name)),
        }
    }

    /// PATCH: merge, JSON or server-side apply; re-reads and retries on a lost race.
    /// Returns the object and whether it was created (apply only).
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        ptype: PatchType,
        body: &[u8],
        subresource: Option<&str>,
        opts: &WriteOptions,
    ) -> ApiResult<(Value, bool)> {
        let key = object_key(kind, ns, name);
        let applied = if ptype == PatchType::Apply {
            if opts.field_manager.as_deref().unwrap_or("").is_empty() {
                return Err(ApiError::bad_request(
                    "PATCH with application/apply-patch+yaml requires the fieldManager parameter",
                ));
            }
            let cfg = parse_body(body, "yaml")?;
            if !cfg.is_object() {
                return Err(ApiError::bad_request(
                    "an apply configuration must be an object",
                ));
            }
            check_type_meta(kind, &cfg)?;
            if cfg.get("apiVersion").is_none() || cfg.get("kind").is_none() {
                return Err(ApiError::bad_request(
                    "an apply configuration must set apiVersion and kind",
                ));
            }
            let n = name_of(&cfg);
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            Some(cfg)
        } else {
            None
        };
        let manager = opts.field_manager.clone().unwrap_or_default();
        for attempt in 0..MAX_RETRIES {
            backoff(attempt).await;
            let current = self.read(&key).await?;
            let Some((old, old_rev)) = current else {
                if let (Some(cfg), None) = (&applied, subresource) {
                    let mut skeleton = json!({
                        "apiVersion": lattice_apis::API_VERSION,
                        "kind": kind.kind,
                        "metadata": {"name": name},
                    });
                    if let (true, Some(ns)) = (kind.namespaced, ns) {
                        skeleton["metadata"]["namespace"] = Value::String(ns.to_string());
                    }
                    let merged =
                        apply::apply(&skeleton, cfg, &manager, opts.force, None, self.lists(kind))
                            .map_err(|c| conflict_error(kind, name, &c))?;
                    let mut merged = merged;
                    if let Some(m) = meta_mut(&mut merged) {
                        m.remove("resourceVersion");
                    }
                    match self.create(kind, ns, merged, opts, true).await {
                        Ok(v) => return Ok((v, true)),
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        Err(e) => return Err(e),
                    }
                }
                return Err(ApiError::not_found(kind.kind, kind.plural, name));
            };
            let patched = match (&applied, ptype) {
                (Some(cfg), _) => {
                    if let Some(rv) = rv_of(cfg) {
                        if parse_rv(rv)? != old_rev {
                            return Err(ApiError::stale(kind.plural, name));
                        }
                    }
                    apply::apply(
                        &old,
                        cfg,
                        &manager,
                        opts.force,
                        subresource,
                        self.lists(kind),
                    )
                    .map_err(|c| conflict_error(kind, name, &c))?
                }
                (None, t) => {
                    let p = apply_patch(&old, t, body)?;
                    if let Some(rv) = rv_of(&p) {
                        if parse_rv(rv)? != old_rev {
                            return Err(ApiError::stale(kind.plural, name));
                        }
                    }
                    p
                }
            };
            let dag_limit = self.dag_limit(kind, subresource).await?;
            let result = self.prepare_update(
                kind,
                &old,
                patched,
                subresource,
                opts,
                applied.is_some(),
                dag_limit,
            )?;
            let result = self
                .admit_caller(kind, Some(&old), result, subresource)
                .await?;
            match self
                .commit(kind, key.clone(), &old, old_rev, result, opts.dry_run)
                .await?
            {
                WriteOutcome::Done(v) => return Ok((v, false)),
                WriteOutcome::Raced => continue,
            }
        }
        Err(ApiError::conflict(
            kind.plural,
            name,
            "too many concurrent writers; try again",
        ))
    }

    /// DELETE with optional preconditions and the default propagation (background,
    /// or whatever garbage-collection finalizer the object already carries);
    /// finalizers turn it into setting `deletionTimestamp`.
    pub async fn delete(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> ApiResult<Value> {
        self.delete_propagating(kind, ns, name, preconditions, None, dry_run)
            .await
    }

    /// DELETE with optional preconditions and an optional propagation policy.
    ///
    /// `Foreground` and `Orphan` add the finalizer `foregroundDeletion` or `orphan`
    /// (and drop the other one): the object is only marked with `deletionTimestamp`
    /// and the garbage collector finishes the job (deletes the dependents first, or
    /// removes this object from their `ownerReferences`), then removes its finalizer.
    /// An explicit `Background` drops both; `None` keeps what the object carries. Any
    /// finalizer turns the delete into setting `deletionTimestamp`; on an object that is
    /// already terminating only the garbage-collection finalizers can change.
    pub async fn delete_propagating(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        preconditions: &Preconditions,
        propagation: Option<PropagationPolicy>,
        dry_run: bool,
    ) -> ApiResult<Value> {
        let key = object_key(kind, ns, name);
        for attempt in 0..MAX_RETRIES {
            backoff(attempt).await;
            let Some((old, old_rev)) = self.read(&key).await? else {
                return Err(ApiError::not_found(kind.kind, kind.plural, name));
            };
            identity::admit_owner(self.caller().as_ref(), kind, &old)?;
            if let Some(c) = self.caller() {
                crate::registry::admission::admit_delete(self, &c, kind, &old).await?;
                self.before_sensitive(&c, "delete", kind, &old, None)
                    .await?;
            }
            if let Some(uid) = &preconditions.uid {
                let actual = meta_str(&old, "uid").unwrap_or("");
                if actual != uid {
                    return Err(ApiError::conflict(
                        kind.plural,
                        name,
                        format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"),
                    ));
                }
            }
            if let Some(rv) = &preconditions.resource_version {
                if parse_rv(rv)? != old_rev {
                    return Err(ApiError::conflict(
                        kind.plural,
                        name,
                        format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {old_rev}"),
                    ));
                }
            }
            let old_f = finalizers(&old);
            let new_f = deletion_finalizers(&old_f, propagation);
            let terminating = is_terminating(&old);
            if terminating && new_f == old_f {
                return Ok(old);
            }
            if terminating || !new_f.is_empty() {
                // Mark (or re-mark) the object; `commit` deletes it outright when an
                // explicit policy removed the last finalizer of a terminating object.
                let mut result = old.clone();
                if let Some(m) = meta_mut(&mut result) {
                    if !terminating {
                        m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
                    }
                    if new_f.is_empty() {
                        m.remove("finalizers");
                    } else {
                        m.insert("finalizers".into(), json!(new_f));
                    }
                    m.remove("resourceVersion");
                }
                match self
                    .commit(kind, key.clone(), &old, old_rev, result, dry_run)
                    .await?
                {
                    WriteOutcome::Done(v) => return Ok(v),
                    WriteOutcome::Raced => continue,
                }
            }
            if dry_run {
                return Ok(old);
            }
            let resp = self
                .backend
                .txn(TxnRequest {
                    compare: vec![Compare::mod_revision(
                        key.clone(),
                        CompareResult::Equal,
                        old_rev,
                    )],
                    success: vec![TxnOp::DeleteRange(DeleteRangeRequest {
                        range: KeyRange::single(key.clone()),
                        prev_kv: false,
                    })],
                    failure: vec![],
                })
                .await?;
            if resp.succeeded {
                let deleted = resp
                    .responses
                    .iter()
                    .any(|r| matches!(r, TxnOpResponse::DeleteRange(d) if d.deleted > 0));
                if !deleted {
                    continue;
                }
                let mut obj = old;
                set_rv(&mut obj, resp.revision);
                return Ok(obj);
            }
        }
        Err(ApiError::conflict(
            kind.plural,
            name,
            "too many concurrent writers; try again",
        ))
    }
}

/// After a lost compare race: retry at once, then with a small, growing, jittered pause.
async fn backoff(attempt: usize) {
    if attempt < 2 {
        return;
    }
    let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0] % 4);
    let ms = (attempt as u64).min(20) + jitter;
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// Finalizer of a foreground deletion: the garbage collector deletes the object's
/// dependents first, then removes it.
pub use lattice_apis::wellknown::FOREGROUND_FINALIZER;
/// Finalizer of an orphaning deletion: the garbage collector removes the object from
/// its dependents' `ownerReferences` (they survive), then removes it.
pub use lattice_apis::wellknown::ORPHAN_FINALIZER;

/// `DeleteOptions.propagationPolicy`: what happens to the dependents of a deleted
/// object (objects whose `ownerReferences` name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropagationPolicy {
    /// Delete the object now; the garbage collector deletes the dependents afterwards.
    Background,
    /// Delete the dependents first (finalizer `foregroundDeletion`).
    Foreground,
    /// Keep the dependents, without their reference to the object (finalizer `orphan`).
    Orphan,
}

impl PropagationPolicy {
    /// The accepted spellings, as the API names them.
    pub const SUPPORTED: [&'static str; 3] = ["Foreground", "Background", "Orphan"];

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Background => "Background",
            Self::Foreground => "Foreground",
            Self::Orphan => "Orphan",
        }
    }

    /// Parse the API's spelling (case-sensitive, as in Kubernetes); anything else is a
    /// 422 naming the field and the supported values.
    pub fn parse(s: &str) -> ApiResult<Self> {
        match s {
            "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            "Orphan" => Ok(Self::Orphan),
            other => {
                let shown: String = other.chars().take(64).collect();
                let supported: Vec<String> =
                    Self::SUPPORTED.iter().map(|v| format!("{v:?}")).collect();
                Err(invalid_delete_options(
                    "propagationPolicy",
                    "FieldValueNotSupported",
                    format!(
                        "Unsupported value: {shown:?}: supported values: {}",
                        supported.join(", ")
                    ),
                ))
            }
        }
    }

    /// The garbage-collection finalizer this policy adds, if any.
    pub fn finalizer(self) -> Option<&'static str> {
        match self {
            Self::Background => None,
            Self::Foreground => Some(FOREGROUND_FINALIZER),
            Self::Orphan => Some(ORPHAN_FINALIZER),
        }
    }
}

/// A 422 `Invalid` about a `DeleteOptions` field.
pub fn invalid_delete_options(field: &str, reason: &str, message: String) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("DeleteOptions \"\" is invalid: {field}: {message}"),
    )
    .with_details(json!({
        "name": "",
        "kind": "DeleteOptions",
        "causes": [{"reason": reason, "field": field, "message": message}],
    }))
}

/// The finalizers a delete leaves on an object that carries `current`: an explicit
/// policy replaces the garbage-collection finalizers with its own (none for
/// `Background`); no policy keeps them. Unchanged as a set → `current` as is.
fn deletion_finalizers(current: &[String], policy: Option<PropagationPolicy>) -> Vec<String> {
    let Some(policy) = policy else {
        return current.to_vec();
    };
    let mut next: Vec<String> = current
        .iter()
        .filter(|f| *f != FOREGROUND_FINALIZER && *f != ORPHAN_FINALIZER)
        .cloned()
        .collect();
    if let Some(f) = policy.finalizer() {
        next.push(f.to_string());
    }
    let same = next.len() == current.len() && next.iter().all(|f| current.contains(f));
    if same {
        current.to_vec()
    } else {
        next
    }
}

/// `DeleteOptions.preconditions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

fn check_type_meta(kind: &KindInfo, obj: &Value) -> ApiResult<()> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
        if av != lattice_apis::API_VERSION {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                lattice_apis::API_VERSION
            )));
        }
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if k != kind.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                kind.kind
            )));
        }
    }
    Ok(())
}

fn conflict_error(kind: &KindInfo, name: &str, conflicts: &[apply::Conflict]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with \"{}\"", c.manager),
                "field": apply::path_string(&c.path),
            })
        })
        .collect();
    let list: Vec<String> = conflicts
        .iter()
        .map(|c| {
            format!(
                "- {} (owned by \"{}\")",
                apply::path_string(&c.path),
                c.manager
            )
        })
        .collect();
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Apply failed with {} conflict(s):\n{}\nRe-apply with force=true to take them over, or drop them from your configuration",
            conflicts.len(),
            list.join("\n")
        ),
    )
    .with_details(json!({"name": name, "group": GROUP, "kind": kind.plural, "causes": causes}))
}

/// A `/status` write's result: `old` with `new`'s status (none if `new` has none or
/// null). Built from `new`, replacing only what differs from `old` (usually nothing:
/// `new` is `old` patched), so a large object is compared, not copied.
fn status_over(old: &Value, mut new: Value) -> Value {
    let (Some(old_o), Some(r)) = (old.as_object(), new.as_object_mut()) else {
        return new;
    };
    r.retain(|k, _| k == "status" || old_o.contains_key(k));
    for (k, v) in old_o {
        if k == "status" {
            continue;
        }
        if !r.get(k).is_some_and(|x| identical(x, v)) {
            r.insert(k.clone(), v.clone());
        }
    }
    if r.get("status").is_some_and(Value::is_null) {
        r.remove("status");
    }
    new
}

/// Completed, Failed and Cancelled are final: a late report from an agent or a
/// controller working from a stale cache may add detail but never change the outcome.
fn check_terminal_phase(old: &Value, new: &Value) -> ApiResult<()> {
    const TERMINAL: [&str; 3] = ["Completed", "Failed", "Cancelled"];
    let was = old.pointer("/status/phase").and_then(Value::as_str);
    let now = new.pointer("/status/phase").and_then(Value::as_str);
    match (was, now) {
        (Some(w), n) if TERMINAL.contains(&w) && n != Some(w) => Err(ApiError::invalid(
            "Allocation",
            name_of(old),
            vec![(
                "status.phase".into(),
                format!(
                    "is {w}, a terminal phase, and cannot become {}; terminal phases are final (submit a new allocation to run it again)",
                    n.unwrap_or("unset")
                ),
            )],
        )),
        _ => Ok(()),
    }
}
