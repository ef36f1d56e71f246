//! `wait`: block until an object satisfies a condition (what `lattice wait` uses).

use futures::StreamExt;
use lattice_apis::Resource;

use crate::api::Api;
use crate::resource::ResourceExt;
use crate::watcher::{self, Event};

/// Wait until `cond` holds for the object `name` (`None` = it does not exist); returns
/// the object at that moment. Never fails on its own: the watcher retries every
/// error, so bound it with `tokio::time::timeout`.
pub async fn await_condition<K, F>(api: Api<K>, name: &str, cond: F) -> Option<K>
where
    K: Resource + Send + Sync + 'static,
    F: Fn(Option<&K>) -> bool,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut w = watcher::watcher(api, config);
    let mut current: Option<K> = None;
    let mut listing = false;
    while let Some(ev) = w.next().await {
        match ev {
            Event::Init => {
                listing = true;
                current = None;
                continue;
            }
            Event::InitApply(o) => {
                current = Some(o);
                continue;
            }
            Event::InitDone => listing = false,
            Event::Apply(o) => current = Some(o),
            Event::Delete(_) => current = None,
        }
        if !listing && cond(current.as_ref()) {
            return current;
        }
    }
    None
}

/// Conditions for [`await_condition`].
pub mod conditions {
    use super::*;

    /// The object with this uid is gone (deleted, or replaced by a new one).
    pub fn is_deleted<K: Resource>(uid: &str) -> impl Fn(Option<&K>) -> bool + '_ {
        move |o| o.is_none_or(|o| o.uid() != Some(uid))
    }

    /// The object exists.
    pub fn exists<K: Resource>() -> impl Fn(Option<&K>) -> bool {
        |o| o.is_some()
    }
}
