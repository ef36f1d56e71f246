//! The in-process transport: the API server's verbs called as functions, and watches
//! served straight from the store.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use lattice_apis::KindInfo;
use lattice_client::{
    Client, DeleteParams, Error, ErrorResponse, ListParams, Patch, PatchParams, PostParams,
    PropagationPolicy, RawWatchEvent, RawWatchStream, Result, StoredEvent, StoredEventType,
    Transport, WatchParams,
};
use lattice_store::{KeyRange, KvBackend, StoreError, WatchRequest};
use serde_json::Value;

use crate::registry::errors::ApiError;
use crate::registry::objects::list_prefix;
use crate::registry::patch::PatchType;
use crate::registry::resources::{self, ListOptions, Resources, WriteOptions};
use crate::registry::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::registry::watch_cache::{self, convert_event, Change};

/// A [`Client`] whose verbs are calls into the registry over `backend`: what the
/// controllers built into `lattice-server` use.
pub fn client(backend: Arc<dyn KvBackend>) -> Client {
    Client::new(Arc::new(InProcessTransport::new(backend)))
}

/// The client's form of an API error: the `Status` the HTTP API would answer.
impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api(ErrorResponse {
            code: e.code,
            reason: e.reason.to_string(),
            message: e.message,
        })
    }
}

/// Calls [`Resources`] directly: admission, generation, server-side apply and
/// finalizer handling are exactly the HTTP API's, with no HTTP in between.
#[derive(Clone)]
pub struct InProcessTransport {
    resources: Resources,
}

impl InProcessTransport {
    /// A transport over `backend` (usually the server's own store handle).
    pub fn new(backend: Arc<dyn KvBackend>) -> Self {
        Self {
            resources: Resources::new(backend),
        }
    }

    /// A transport over an existing [`Resources`].
    pub fn from_resources(resources: Resources) -> Self {
        Self { resources }
    }
}

fn selectors(kind: &KindInfo, label: &Option<String>, field: &Option<String>) -> Result<Selectors> {
    let bad = |what: &str, e: String| {
        Error::Api(ErrorResponse {
            code: 400,
            reason: "BadRequest".into(),
            message: format!("unable to parse {what}: {e}"),
        })
    };
    Ok(Selectors {
        labels: LabelSelector::parse(label.as_deref().unwrap_or(""))
            .map_err(|e| bad("labelSelector", e))?,
        fields: FieldSelector::parse(field.as_deref().unwrap_or(""), kind.selectable_fields)
            .map_err(|e| bad("fieldSelector", e))?,
    })
}

fn parse_rv(rv: &str) -> Result<i64> {
    rv.parse::<i64>().ok().filter(|r| *r >= 0).ok_or_else(|| {
        Error::Api(ErrorResponse {
            code: 400,
            reason: "BadRequest".into(),
            message: format!("invalid resourceVersion {rv:?}"),
        })
    })
}

fn gone(message: String) -> ErrorResponse {
    ErrorResponse {
        code: 410,
        reason: "Expired".into(),
        message,
    }
}

/// What a change looks like through a selector (the API server's watch rules,
/// [`watch_cache::classify`]): an object entering the selector is ADDED, leaving it is
/// DELETED.
fn classify(c: &Change, sel: &Selectors) -> Option<RawWatchEvent> {
    let (ty, obj) = watch_cache::classify(c, sel)?;
    let obj = obj.clone();
    Some(match ty {
        "ADDED" => RawWatchEvent::Added(obj),
        "MODIFIED" => RawWatchEvent::Modified(obj),
        _ => RawWatchEvent::Deleted(obj),
    })
}

/// A store event as a [`RawWatchEvent::Stored`] (what [`classify`] makes of it without
/// selectors: a put is ADDED unless the key existed before).
fn stored_event(ev: &lattice_store::Event) -> Option<RawWatchEvent> {
    let (kind, bytes) = match ev.kind {
        lattice_store::EventType::Put if ev.prev_kv.is_some() => {
            (StoredEventType::Modified, &ev.kv.value)
        }
        lattice_store::EventType::Put => (StoredEventType::Added, &ev.kv.value),
        lattice_store::EventType::Delete => {
            let Some(p) = ev.prev_kv.as_ref() else {
                tracing::warn!(key = ?ev.kv.key, "delete event without prev_kv; skipped");
                return None;
            };
            (StoredEventType::Deleted, &p.value)
        }
    };
    Some(RawWatchEvent::Stored(StoredEvent {
        kind,
        bytes: bytes.clone(),
        resource_version: ev.kv.mod_revision,
    }))
}

#[async_trait]
impl Transport for InProcessTransport {
    async fn get(&self, kind: &'static KindInfo, ns: Option<&str>, name: &str) -> Result<Value> {
        Ok(self.resources.get(kind, ns, name).await?)
    }

    async fn list(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        params: &ListParams,
    ) -> Result<Value> {
        let opts = ListOptions {
            selectors: selectors(kind, &params.label_selector, &params.field_selector)?,
            limit: i64::from(params.limit.unwrap_or(0)),
            continue_token: params.continue_token.clone(),
            ..ListOptions::default()
        };
        Ok(self.resources.list(kind, ns, &opts).await?)
    }

    async fn watch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        params: &WatchParams,
    ) -> Result<RawWatchStream> {
        let sel = selectors(kind, &params.label_selector, &params.field_selector)?;
        // No resourceVersion: synthetic ADDED events for the current state first.
        let (initial, from) =
            if params.resource_version.is_empty() || params.resource_version == "0" {
                let list = self
                    .list(
                        kind,
                        ns,
                        &ListParams {
                            label_selector: params.label_selector.clone(),
                            field_selector: params.field_selector.clone(),
                            ..ListParams::default()
                        },
                    )
                    .await?;
                let rv = list
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .map(parse_rv)
                    .transpose()?
                    .unwrap_or(0);
                let items = match list.get("items") {
                    Some(Value::Array(a)) => a.clone(),
                    _ => Vec::new(),
                };
                (items, rv)
            } else {
                (Vec::new(), parse_rv(&params.resource_version)?)
            };
        let req = WatchRequest {
            range: KeyRange::prefix(list_prefix(kind, ns)),
            start_revision: from + 1,
            prev_kv: true,
            progress_notify: true,
            ..WatchRequest::default()
        };
        let store_stream = match self.resources.backend.watch(req).await {
            Ok(s) => s,
            Err(StoreError::Compacted { compact_revision }) => {
                return Err(Error::Api(gone(format!(
                    "too old resource version: {from} (compacted at {compact_revision})"
                ))))
            }
            Err(e) => return Err(ApiError::from(e).into()),
        };
        let initial = futures::stream::iter(
            initial
                .into_iter()
                .map(|o| Ok(RawWatchEvent::Added(o)))
                .collect::<Vec<_>>(),
        );
        let bookmarks = params.bookmarks;
        let changes = store_stream
            .map(move |batch| -> Vec<Result<RawWatchEvent>> {
                match batch {
                    Ok(b) if b.events.is_empty() => {
                        if bookmarks {
                            vec![Ok(RawWatchEvent::Bookmark(b.revision.to_string()))]
                        } else {
                            Vec::new()
                        }
                    }
                    Ok(b) => {
                        let mut out: Vec<Result<RawWatchEvent>> = if sel.is_empty() {
                            // No selector to evaluate: the stored bytes as they are,
                            // decoded once by whoever reads the event.
                            b.events.iter().filter_map(stored_event).map(Ok).collect()
                        } else {
                            b.events
                                .iter()
                                .filter_map(convert_event)
                                .filter_map(|c| classify(&c, &sel))
                                .map(Ok)
                                .collect()
                        };
                        // The batch's revision covers events the selector filtered out.
                        if bookmarks && out.is_empty() {
                            out.push(Ok(RawWatchEvent::Bookmark(b.revision.to_string())));
                        }
                        out
                    }
                    Err(StoreError::Compacted { compact_revision }) => {
                        vec![Ok(RawWatchEvent::Error(gone(format!(
                            "the watch was compacted at revision {compact_revision}"
                        ))))]
                    }
                    Err(e) => vec![Err(Error::Transport(e.to_string()))],
                }
            })
            .flat_map(futures::stream::iter);
        Ok(initial.chain(changes).boxed())
    }

    async fn create(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        obj: Value,
        params: &PostParams,
    ) -> Result<Value> {
        let opts = WriteOptions {
            dry_run: params.dry_run,
            field_manager: params.field_manager.clone(),
            ..WriteOptions::default()
        };
        Ok(self.resources.create(kind, ns, obj, &opts, false).await?)
    }

    async fn replace(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        subresource: Option<&str>,
        params: &PostParams,
    ) -> Result<Value> {
        let opts = WriteOptions {
            dry_run: params.dry_run,
            field_manager: params.field_manager.clone(),
            ..WriteOptions::default()
        };
        Ok(self
            .resources
            .replace(kind, ns, name, obj, subresource, &opts)
            .await?)
    }

    async fn patch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        patch: &Patch,
        subresource: Option<&str>,
        params: &PatchParams,
    ) -> Result<Value> {
        let ptype = match patch {
            Patch::Merge(_) => PatchType::Merge,
            Patch::Json(_) => PatchType::Json,
            Patch::Apply(_) => PatchType::Apply,
        };
        let body = serde_json::to_vec(patch.body()).map_err(|e| Error::decode("patch", e))?;
        let opts = WriteOptions {
            dry_run: params.dry_run,
            field_manager: params.field_manager.clone(),
            force: params.force,
        };
        let (v, _created) = self
            .resources
            .patch(kind, ns, name, ptype, &body, subresource, &opts)
            .await?;
        Ok(v)
    }

    async fn delete(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Value> {
        let pre = params
            .preconditions
            .as_ref()
            .map(|p| resources::Preconditions {
                uid: p.uid.clone(),
                resource_version: p.resource_version.clone(),
            })
            .unwrap_or_default();
        let policy = params.propagation_policy.map(|p| match p {
            PropagationPolicy::Background => resources::PropagationPolicy::Background,
            PropagationPolicy::Foreground => resources::PropagationPolicy::Foreground,
            PropagationPolicy::Orphan => resources::PropagationPolicy::Orphan,
        });
        Ok(self
            .resources
            .delete_propagating(kind, ns, name, &pre, policy, params.dry_run)
            .await?)
    }
}
