//! The untyped client: a [`Transport`] trait, and the parameter types shared by every
//! verb.
//!
//! * [`HttpTransport`]: any process, Kubernetes paths, bearer token or client
//!   certificate, NDJSON watch.
//! * `lattice_apiserver::in_process::InProcessTransport`: built-in controllers inside
//!   `lattice-server` call the registry directly (the same admission, generation,
//!   server-side apply and finalizer code as the HTTP API) and watch the store, so
//!   there is no HTTP and no serialisation round trip per request. It lives with the
//!   server, so that nothing that links this crate links the server.
//!
//! Typed access goes through [`Api`](crate::Api), which wraps a [`Client`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use lattice_apis::{KindInfo, Resource};
use serde_json::Value;

use crate::error::{ErrorResponse, Result};

mod http;

pub use http::HttpTransport;

/// Parameters of a list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListParams {
    /// Label selector, e.g. `app=web,tier!=db`.
    pub label_selector: Option<String>,
    /// Field selector, e.g. `metadata.name=x`.
    pub field_selector: Option<String>,
    /// Page size (0 or `None`: everything).
    pub limit: Option<u32>,
    /// Continue token of the previous page.
    pub continue_token: Option<String>,
}

impl ListParams {
    /// Only objects matching this label selector.
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_string());
        self
    }
    /// Only objects matching this field selector.
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_string());
        self
    }
    /// Page size.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// Parameters of a watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchParams {
    /// Label selector.
    pub label_selector: Option<String>,
    /// Field selector.
    pub field_selector: Option<String>,
    /// Deliver every change after this resourceVersion. Empty: synthetic ADDED
    /// events for every current object first, then changes.
    pub resource_version: String,
    /// Ask for BOOKMARK events.
    pub bookmarks: bool,
    /// Server-side lifetime of the watch (HTTP only).
    pub timeout: Option<Duration>,
}

/// How to patch.
#[derive(Clone, Debug, PartialEq)]
pub enum Patch {
    /// JSON merge patch (RFC 7386).
    Merge(Value),
    /// JSON patch (RFC 6902): an array of operations.
    Json(Value),
    /// Server-side apply: the fields this manager wants; needs a field manager.
    Apply(Value),
}

impl Patch {
    /// The request's `Content-Type`.
    pub fn content_type(&self) -> &'static str {
        match self {
            Patch::Merge(_) => "application/merge-patch+json",
            Patch::Json(_) => "application/json-patch+json",
            Patch::Apply(_) => "application/apply-patch+yaml",
        }
    }
    /// The patch document.
    pub fn body(&self) -> &Value {
        match self {
            Patch::Merge(v) | Patch::Json(v) | Patch::Apply(v) => v,
        }
    }
}

/// Parameters of create and replace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostParams {
    /// Field manager recorded in managedFields.
    pub field_manager: Option<String>,
    /// Validate only; write nothing.
    pub dry_run: bool,
}

/// Parameters of a patch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatchParams {
    /// Field manager (required for [`Patch::Apply`]).
    pub field_manager: Option<String>,
    /// Apply only: take over fields owned by other managers.
    pub force: bool,
    /// Validate only; write nothing.
    pub dry_run: bool,
}

impl PatchParams {
    /// Server-side apply as `manager`.
    pub fn apply(manager: &str) -> Self {
        Self {
            field_manager: Some(manager.to_string()),
            ..Self::default()
        }
    }
    /// Take over conflicting fields (apply only).
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }
}

/// DELETE preconditions: the delete fails with 409 unless they hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The object's uid must be this (it was not deleted and recreated).
    pub uid: Option<String>,
    /// The object's resourceVersion must be this (nobody changed it since).
    pub resource_version: Option<String>,
}

/// What a delete does to the object's dependents (the objects whose
/// `ownerReferences` name it). Sent as `DeleteOptions.propagationPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PropagationPolicy {
    /// The object goes now; the garbage collector deletes the dependents afterwards
    /// (the server's default).
    Background,
    /// The object is only marked (`deletionTimestamp`, finalizer `foregroundDeletion`);
    /// the garbage collector deletes the dependents — in the foreground too, so the
    /// whole tree goes — and the object goes once no dependent that has
    /// `blockOwnerDeletion: true` remains.
    Foreground,
    /// The object is only marked (finalizer `orphan`); the garbage collector removes
    /// it from the dependents' `ownerReferences`, then the object goes. The
    /// dependents survive.
    Orphan,
}

impl PropagationPolicy {
    /// The API's spelling: `Background`, `Foreground` or `Orphan`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Background => "Background",
            Self::Foreground => "Foreground",
            Self::Orphan => "Orphan",
        }
    }
}

impl std::fmt::Display for PropagationPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PropagationPolicy {
    type Err = crate::Error;

    /// The API's spelling (case-sensitive, as the server checks it).
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            "Orphan" => Ok(Self::Orphan),
            other => Err(crate::Error::Request(format!(
                "unsupported propagationPolicy {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            ))),
        }
    }
}

/// Parameters of a delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteParams {
    /// Preconditions.
    pub preconditions: Option<Preconditions>,
    /// What happens to the dependents; `None`: the server's default (background,
    /// or the garbage-collection finalizer the object already carries).
    pub propagation_policy: Option<PropagationPolicy>,
    /// Validate only.
    pub dry_run: bool,
}

impl DeleteParams {
    /// Delete only if the object still has this uid.
    pub fn with_uid(uid: &str) -> Self {
        Self {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Self::default()
        }
    }

    /// Delete in the background (explicitly).
    pub fn background() -> Self {
        Self::default().propagation(PropagationPolicy::Background)
    }

    /// Delete the dependents first, then the object.
    pub fn foreground() -> Self {
        Self::default().propagation(PropagationPolicy::Foreground)
    }

    /// Delete the object and keep its dependents.
    pub fn orphan() -> Self {
        Self::default().propagation(PropagationPolicy::Orphan)
    }

    /// Use this propagation policy.
    pub fn propagation(mut self, policy: PropagationPolicy) -> Self {
        self.propagation_policy = Some(policy);
        self
    }
}

/// A raw watch event, as JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum RawWatchEvent {
    /// Created, or entered the selector.
    Added(Value),
    /// Changed.
    Modified(Value),
    /// Deleted (last state, with the deletion's resourceVersion), or left the selector.
    Deleted(Value),
    /// Every later event has a higher resourceVersion than this one.
    Bookmark(String),
    /// An in-stream error (410 when the watch fell behind compaction).
    Error(ErrorResponse),
    /// ADDED, MODIFIED or DELETED as the store holds the object: its JSON without
    /// `metadata.resourceVersion`, and that revision. The in-process transport sends
    /// these so that a typed watch decodes the bytes once, straight into its type;
    /// [`RawWatchEvent::into_json`] turns one into the JSON variant.
    Stored(StoredEvent),
}

/// Which JSON event a [`StoredEvent`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredEventType {
    /// As [`RawWatchEvent::Added`].
    Added,
    /// As [`RawWatchEvent::Modified`].
    Modified,
    /// As [`RawWatchEvent::Deleted`].
    Deleted,
}

/// A watch event as stored bytes (see [`RawWatchEvent::Stored`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    /// ADDED, MODIFIED or DELETED.
    pub kind: StoredEventType,
    /// The object's JSON as stored (without `metadata.resourceVersion`).
    pub bytes: bytes::Bytes,
    /// Its resourceVersion (for a deletion, the deletion's).
    pub resource_version: i64,
}

impl StoredEvent {
    /// The object as JSON, with its resourceVersion.
    pub fn to_json(&self) -> Result<Value> {
        let mut v: Value = serde_json::from_slice(&self.bytes)
            .map_err(|e| crate::Error::decode("watch event", e))?;
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert(
                "resourceVersion".into(),
                Value::String(self.resource_version.to_string()),
            );
        }
        Ok(v)
    }

    /// The object decoded straight into `K`, with its resourceVersion.
    pub fn decode<K: Resource>(&self) -> Result<K> {
        let mut obj: K =
            serde_json::from_slice(&self.bytes).map_err(|e| crate::Error::decode(K::KIND, e))?;
        obj.metadata_mut().resource_version = Some(self.resource_version.to_string());
        Ok(obj)
    }
}

impl RawWatchEvent {
    /// The event with its object as JSON (a [`RawWatchEvent::Stored`] is decoded; the
    /// others are returned as they are).
    pub fn into_json(self) -> Result<RawWatchEvent> {
        Ok(match self {
            RawWatchEvent::Stored(s) => {
                let v = s.to_json()?;
                match s.kind {
                    StoredEventType::Added => RawWatchEvent::Added(v),
                    StoredEventType::Modified => RawWatchEvent::Modified(v),
                    StoredEventType::Deleted => RawWatchEvent::Deleted(v),
                }
            }
            other => other,
        })
    }
}

/// A raw watch stream.
pub type RawWatchStream = BoxStream<'static, Result<RawWatchEvent>>;

/// The verbs, over JSON. Implemented by [`HttpTransport`] and the server's in-process
/// transport;
/// tests wrap one to count calls or inject faults.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// GET one object.
    async fn get(&self, kind: &'static KindInfo, ns: Option<&str>, name: &str) -> Result<Value>;
    /// LIST (one page): a `<Kind>List` with `metadata.resourceVersion` and `continue`.
    async fn list(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        params: &ListParams,
    ) -> Result<Value>;
    /// WATCH. A compacted resourceVersion fails with a 410 error (before the stream)
    /// or ends the stream with [`RawWatchEvent::Error`] code 410.
    async fn watch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        params: &WatchParams,
    ) -> Result<RawWatchStream>;
    /// POST.
    async fn create(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        obj: Value,
        params: &PostParams,
    ) -> Result<Value>;
    /// PUT (the object must carry the resourceVersion it was read at).
    async fn replace(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        subresource: Option<&str>,
        params: &PostParams,
    ) -> Result<Value>;
    /// PATCH.
    async fn patch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        patch: &Patch,
        subresource: Option<&str>,
        params: &PatchParams,
    ) -> Result<Value>;
    /// DELETE: the deleted object's last state, or the object now terminating
    /// (finalizers pending).
    async fn delete(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Value>;
}

/// A cheaply clonable handle on a [`Transport`].
#[derive(Clone)]
pub struct Client {
    transport: Arc<dyn Transport>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// A client over any transport.
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Self { transport }
    }

    /// HTTP client for `base_url` (e.g. `http://127.0.0.1:6443`), with an optional
    /// bearer token.
    pub fn http(base_url: &str, token: Option<String>) -> Result<Self> {
        Ok(Self::new(Arc::new(HttpTransport::new(base_url, token)?)))
    }

    /// HTTPS client for `base_url` with a TLS configuration of its own: the cluster CA to
    /// trust and a client certificate to show (a node's agent, the controllers).
    pub fn https(base_url: &str, tls: rustls::ClientConfig) -> Result<Self> {
        Ok(Self::new(Arc::new(HttpTransport::with_tls(
            base_url, None, tls,
        )?)))
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }
}

#[cfg(test)]
mod tests {
    use lattice_apis::kinds::allocation::Allocation;

    use super::*;
    use crate::resource::ResourceExt;

    fn stored(kind: StoredEventType) -> StoredEvent {
        let obj = serde_json::json!({
            "apiVersion": "lattice.dev/v1alpha1",
            "kind": "Allocation",
            "metadata": {"name": "a", "namespace": "t", "labels": {"team": "ml"}},
            "spec": {"entrypoint": "/bin/true", "resources": {"nodes": 2}, "vcluster": "default"}
        });
        StoredEvent {
            kind,
            bytes: serde_json::to_vec(&obj).unwrap().into(),
            resource_version: 42,
        }
    }

    #[test]
    fn a_stored_event_decodes_like_its_json_form() {
        for kind in [
            StoredEventType::Added,
            StoredEventType::Modified,
            StoredEventType::Deleted,
        ] {
            let s = stored(kind);
            let typed: Allocation = s.decode().unwrap();
            assert_eq!(typed.resource_version(), Some("42"));
            let (json, got_kind) = match RawWatchEvent::Stored(s).into_json().unwrap() {
                RawWatchEvent::Added(v) => (v, StoredEventType::Added),
                RawWatchEvent::Modified(v) => (v, StoredEventType::Modified),
                RawWatchEvent::Deleted(v) => (v, StoredEventType::Deleted),
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(got_kind, kind);
            assert_eq!(json["metadata"]["resourceVersion"], "42");
            let via_json: Allocation = serde_json::from_value(json).unwrap();
            assert_eq!(typed, via_json);
        }
    }

    #[test]
    fn a_stored_event_that_is_not_the_kind_is_a_decode_error() {
        let s = StoredEvent {
            kind: StoredEventType::Added,
            bytes: bytes::Bytes::from_static(b"{\"metadata\": 7}"),
            resource_version: 1,
        };
        assert!(matches!(
            s.decode::<Allocation>(),
            Err(crate::Error::Decode { .. })
        ));
    }
}
