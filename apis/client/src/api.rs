//! [`Api<K>`]: typed verbs over a [`Client`], scoped to one tenant or to all.

use std::marker::PhantomData;

use futures::stream::BoxStream;
use futures::StreamExt;
use lattice_apis::{KindInfo, Resource};
use serde_json::Value;

use crate::client::{
    Client, DeleteParams, ListParams, Patch, PatchParams, PostParams, RawWatchEvent,
    StoredEventType, WatchParams,
};
use crate::error::{Error, ErrorResponse, Result};
use crate::resource::{kind_info, ResourceExt};

/// A typed watch event.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent<K> {
    /// Created or entered the selector.
    Added(K),
    /// Changed.
    Modified(K),
    /// Deleted or left the selector (last state).
    Deleted(K),
    /// Progress: every later event has a higher resourceVersion.
    Bookmark(String),
    /// In-stream error (410: relist).
    Error(ErrorResponse),
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct ObjectList<K> {
    /// The objects.
    pub items: Vec<K>,
    /// Store revision the list was read at.
    pub resource_version: String,
    /// Token of the next page, if any.
    pub continue_token: Option<String>,
}

/// What a delete did.
#[derive(Clone, Debug, PartialEq)]
pub enum DeleteResult<K> {
    /// Gone; the object's last state.
    Deleted(K),
    /// Finalizers are pending: the object is terminating.
    Pending(K),
}

/// Typed access to one kind, within one tenant (`namespaced`) or across all
/// (`all`, also the form for cluster-scoped kinds).
pub struct Api<K> {
    client: Client,
    kind: &'static KindInfo,
    namespace: Option<String>,
    /// Lists and watches leave `metadata.managedFields` empty (see
    /// [`Api::without_managed_fields`]).
    skip_managed_fields: bool,
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            kind: self.kind,
            namespace: self.namespace.clone(),
            skip_managed_fields: self.skip_managed_fields,
            _k: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Api<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("kind", &self.kind.kind)
            .field("namespace", &self.namespace)
            .finish()
    }
}

pub(crate) fn decode<K: Resource>(v: Value) -> Result<K> {
    serde_json::from_value(v).map_err(|e| Error::decode(K::KIND, e))
}

/// `decode()`, reading past managedFields when `skip` (see [`Api::without_managed_fields`]).
fn lean<T>(skip: bool, decode: impl FnOnce() -> T) -> T {
    if skip {
        lattice_apis::meta::without_managed_fields(decode)
    } else {
        decode()
    }
}

fn encode<K: Resource>(obj: &K) -> Result<Value> {
    let mut v = serde_json::to_value(obj).map_err(|e| Error::decode(K::KIND, e))?;
    if let Some(o) = v.as_object_mut() {
        // `Default` objects carry empty type meta; the URL says which kind it is.
        for (field, value) in [("apiVersion", lattice_apis::API_VERSION), ("kind", K::KIND)] {
            if o.get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                o.insert(field.to_string(), Value::String(value.to_string()));
            }
        }
    }
    Ok(v)
}

impl<K: Resource + Send + Sync + 'static> Api<K> {
    /// Objects of `K` in tenant `namespace` (for cluster-scoped kinds the namespace
    /// is ignored).
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Self::scoped(client, Some(namespace))
    }

    /// Objects of `K` in every tenant (or a cluster-scoped kind).
    pub fn all(client: Client) -> Self {
        Self::scoped(client, None)
    }

    /// `namespaced` or `all`.
    pub fn scoped(client: Client, namespace: Option<&str>) -> Self {
        let kind = kind_info::<K>();
        Self {
            client,
            kind,
            namespace: if kind.namespaced {
                namespace.map(str::to_string)
            } else {
                None
            },
            skip_managed_fields: false,
            _k: PhantomData,
        }
    }

    /// The same Api, except that the objects its lists and watches return have no
    /// `metadata.managedFields` (they are read past, not built): for caches, which have
    /// no use for them. Gets and writes are unchanged.
    pub fn without_managed_fields(mut self) -> Self {
        self.skip_managed_fields = true;
        self
    }

    /// The same Api scoped to another tenant (`None`: all).
    pub fn within(&self, namespace: Option<&str>) -> Self {
        Self::scoped(self.client.clone(), namespace)
    }

    /// The Api for the tenant of `obj`.
    pub fn for_obj(&self, obj: &K) -> Self {
        self.within(obj.namespace())
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The kind's registry entry.
    pub fn kind_info(&self) -> &'static KindInfo {
        self.kind
    }

    /// The tenant this Api is scoped to.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    fn ns(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// GET.
    pub async fn get(&self, name: &str) -> Result<K> {
        decode(
            self.client
                .transport()
                .get(self.kind, self.ns(), name)
                .await?,
        )
    }

    /// GET, with 404 as `None`.
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>> {
        match self.get(name).await {
            Ok(o) => Ok(Some(o)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LIST one page.
    pub async fn list(&self, params: &ListParams) -> Result<ObjectList<K>> {
        let v = self
            .client
            .transport()
            .list(self.kind, self.ns(), params)
            .await?;
        let resource_version = v
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let continue_token = v
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let items = match v {
            Value::Object(mut m) => match m.remove("items") {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        let items = items
            .into_iter()
            .map(|v| lean(self.skip_managed_fields, || decode(v)))
            .collect::<Result<Vec<K>>>()?;
        Ok(ObjectList {
            items,
            resource_version,
            continue_token,
        })
    }

    /// WATCH. Objects that fail to decode come out as `Err` items.
    pub async fn watch(
        &self,
        params: &WatchParams,
    ) -> Result<BoxStream<'static, Result<WatchEvent<K>>>> {
        let raw = self
            .client
            .transport()
            .watch(self.kind, self.ns(), params)
            .await?;
        let skip = self.skip_managed_fields;
        let decode = move |v: Value| -> Result<K> { lean(skip, || decode(v)) };
        Ok(raw
            .map(move |ev| {
                Ok(match ev? {
                    RawWatchEvent::Added(v) => WatchEvent::Added(decode(v)?),
                    RawWatchEvent::Modified(v) => WatchEvent::Modified(decode(v)?),
                    RawWatchEvent::Deleted(v) => WatchEvent::Deleted(decode(v)?),
                    RawWatchEvent::Bookmark(rv) => WatchEvent::Bookmark(rv),
                    RawWatchEvent::Error(e) => WatchEvent::Error(e),
                    RawWatchEvent::Stored(s) => {
                        let obj = lean(skip, || s.decode())?;
                        match s.kind {
                            StoredEventType::Added => WatchEvent::Added(obj),
                            StoredEventType::Modified => WatchEvent::Modified(obj),
                            StoredEventType::Deleted => WatchEvent::Deleted(obj),
                        }
                    }
                })
            })
            .boxed())
    }

    /// POST. The object's namespace, if unset, is the Api's.
    pub async fn create(&self, params: &PostParams, obj: &K) -> Result<K> {
        let ns = obj.namespace().or(self.ns()).map(str::to_string);
        let v = self
            .client
            .transport()
            .create(self.kind, ns.as_deref(), encode(obj)?, params)
            .await?;
        decode(v)
    }

    /// PUT: optimistic concurrency on the object's resourceVersion (409 when stale).
    pub async fn replace(&self, name: &str, params: &PostParams, obj: &K) -> Result<K> {
        let v = self
            .client
            .transport()
            .replace(self.kind, self.ns(), name, encode(obj)?, None, params)
            .await?;
        decode(v)
    }

    /// PUT `/status`: only `.status` changes.
    pub async fn replace_status(&self, name: &str, params: &PostParams, obj: &K) -> Result<K> {
        let v = self
            .client
            .transport()
            .replace(
                self.kind,
                self.ns(),
                name,
                encode(obj)?,
                Some("status"),
                params,
            )
            .await?;
        decode(v)
    }

    /// PATCH (merge, JSON or apply).
    pub async fn patch(&self, name: &str, params: &PatchParams, patch: &Patch) -> Result<K> {
        let v = self
            .client
            .transport()
            .patch(self.kind, self.ns(), name, patch, None, params)
            .await?;
        decode(v)
    }

    /// PATCH `/status`.
    pub async fn patch_status(&self, name: &str, params: &PatchParams, patch: &Patch) -> Result<K> {
        let v = self
            .client
            .transport()
            .patch(self.kind, self.ns(), name, patch, Some("status"), params)
            .await?;
        decode(v)
    }

    /// PATCH `/status` without decoding the answer, for a writer that does not use it
    /// (decoding the updated object costs as much as a good part of the patch).
    pub async fn patch_status_unread(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<()> {
        self.client
            .transport()
            .patch(self.kind, self.ns(), name, patch, Some("status"), params)
            .await
            .map(drop)
    }

    /// DELETE with optional preconditions.
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> Result<DeleteResult<K>> {
        let v = self
            .client
            .transport()
            .delete(self.kind, self.ns(), name, params)
            .await?;
        let obj: K = decode(v)?;
        // With finalizers pending the server only stamps deletionTimestamp.
        if obj.is_deleting() && !obj.finalizers().is_empty() {
            Ok(DeleteResult::Pending(obj))
        } else {
            Ok(DeleteResult::Deleted(obj))
        }
    }

    /// Read-modify-write with conflict retry: `mutate` is applied to the latest
    /// object and written with PUT; a 409 re-reads and tries again (up to `attempts`).
    /// `mutate` returning `false` skips the write.
    pub async fn update_with_retry<F>(&self, name: &str, attempts: usize, mutate: F) -> Result<K>
    where
        F: FnMut(&mut K) -> bool + Send,
    {
        self.retry_update(name, attempts, mutate, false).await
    }

    /// Like [`update_with_retry`](Self::update_with_retry) for the `/status`
    /// subresource: read, `mutate` (return `false` to write nothing), write the status
    /// with the resourceVersion read, and start over on a 409.
    pub async fn update_status_with_retry<F>(
        &self,
        name: &str,
        attempts: usize,
        mutate: F,
    ) -> Result<K>
    where
        F: FnMut(&mut K) -> bool + Send,
    {
        self.retry_update(name, attempts, mutate, true).await
    }

    async fn retry_update<F>(
        &self,
        name: &str,
        attempts: usize,
        mut mutate: F,
        status: bool,
    ) -> Result<K>
    where
        F: FnMut(&mut K) -> bool + Send,
    {
        let mut last = None;
        for _ in 0..attempts.max(1) {
            let mut obj = self.get(name).await?;
            if !mutate(&mut obj) {
                return Ok(obj);
            }
            let written = if status {
                self.replace_status(name, &PostParams::default(), &obj)
                    .await
            } else {
                self.replace(name, &PostParams::default(), &obj).await
            };
            match written {
                Ok(o) => return Ok(o),
                Err(e) if e.is_conflict() => {
                    tracing::debug!(kind = K::KIND, name, status, "update conflict; re-reading");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Request("no attempt made".into())))
    }
}
