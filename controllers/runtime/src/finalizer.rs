//! `finalizer`: run cleanup before an object may disappear.
//!
//! The 2×2 matrix of (finalizer present?, deletion requested?):
//!
//! | finalizer | deleting | what happens |
//! |---|---|---|
//! | absent  | no  | add it with a JSON patch guarded by a `test` of the resourceVersion; wait for the change |
//! | present | no  | [`Event::Apply`]: the normal reconcile |
//! | present | yes | [`Event::Cleanup`]; on success remove it with a patch guarded by a `test` of that entry |
//! | absent  | yes | nothing: someone else's finalizers are pending |
//!
//! Both patches are guarded, so a stale cached object can neither add a finalizer to an
//! object that changed meanwhile nor remove the wrong entry of the list.

use std::future::Future;
use std::sync::Arc;

use lattice_apis::Resource;
use serde_json::json;

use crate::api::Api;
use crate::client::{Patch, PatchParams};
use crate::controller::Action;
use crate::resource::ResourceExt;

/// What the finalizer asks the reconciler to do.
#[derive(Debug)]
pub enum Event<K> {
    /// The object lives (and carries the finalizer): reconcile it.
    Apply(Arc<K>),
    /// Deletion was requested: clean up. Must be idempotent; the finalizer is removed
    /// only after it succeeds.
    Cleanup(Arc<K>),
}

/// Finalizer failures.
#[derive(Debug, thiserror::Error)]
pub enum Error<E: std::error::Error + 'static> {
    /// The reconciler's `Apply` failed.
    #[error("apply failed: {0}")]
    ApplyFailed(#[source] E),
    /// The reconciler's `Cleanup` failed.
    #[error("cleanup failed: {0}")]
    CleanupFailed(#[source] E),
    /// Adding the finalizer failed.
    #[error("failed to add finalizer: {0}")]
    AddFinalizer(#[source] crate::Error),
    /// Removing the finalizer failed.
    #[error("failed to remove finalizer: {0}")]
    RemoveFinalizer(#[source] crate::Error),
    /// The object has no name.
    #[error("object has no name")]
    UnnamedObject,
}

/// Drive `reconcile` through the finalizer matrix for `obj`; `api` may be scoped to
/// any tenant (the object's own is used).
pub async fn finalizer<K, E, F, Fut>(
    api: &Api<K>,
    finalizer_name: &str,
    obj: Arc<K>,
    reconcile: F,
) -> Result<Action, Error<E>>
where
    K: Resource + Send + Sync + 'static,
    E: std::error::Error + 'static,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
{
    let name = obj.name_any().to_string();
    if name.is_empty() {
        return Err(Error::UnnamedObject);
    }
    let api = api.for_obj(&obj);
    let index = obj.finalizers().iter().position(|f| f == finalizer_name);
    match (index, obj.is_deleting()) {
        (Some(_), false) => reconcile(Event::Apply(obj))
            .await
            .map_err(Error::ApplyFailed),
        (Some(i), true) => {
            let action = reconcile(Event::Cleanup(obj.clone()))
                .await
                .map_err(Error::CleanupFailed)?;
            let path = format!("/metadata/finalizers/{i}");
            let patch = Patch::Json(json!([
                {"op": "test", "path": path, "value": finalizer_name},
                {"op": "remove", "path": path},
            ]));
            match api.patch(&name, &PatchParams::default(), &patch).await {
                Ok(_) => Ok(action),
                // Already gone (our removal was the last finalizer and it was deleted),
                // or the list moved under us: the next event re-runs the matrix.
                Err(e) if e.is_not_found() => Ok(Action::await_change()),
                Err(e) if e.is_patch_test_failed() || e.is_conflict() => Ok(Action::await_change()),
                Err(e) => Err(Error::RemoveFinalizer(e)),
            }
        }
        (None, false) => {
            let rv = obj.resource_version().unwrap_or("").to_string();
            let add = if obj.finalizers().is_empty() {
                json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer_name]})
            } else {
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer_name})
            };
            let patch = Patch::Json(json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                add,
            ]));
            match api.patch(&name, &PatchParams::default(), &patch).await {
                // The write triggers a new reconcile, which takes the Apply branch.
                Ok(_) => Ok(Action::await_change()),
                Err(e) if e.is_patch_test_failed() || e.is_conflict() || e.is_not_found() => {
                    Ok(Action::await_change())
                }
                Err(e) => Err(Error::AddFinalizer(e)),
            }
        }
        (None, true) => Ok(Action::await_change()),
    }
}
