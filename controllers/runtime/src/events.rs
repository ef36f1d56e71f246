//! `events`: a recorder that writes `Event` objects (what `lattice describe` shows),
//! aggregating repeats: the same (object, type, reason, message, reporter) bumps
//! `count` and `lastTimestamp` on one Event instead of creating another.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use lattice_apis::meta::now;
use lattice_apis::{
    Event, EventSource, EventType, ObjectMeta, ObjectReference, Resource, SYSTEM_NAMESPACE,
};
use serde_json::json;

use crate::api::Api;
use crate::client::{Client, Patch, PatchParams, PostParams};
use crate::resource::ResourceExt;

/// Who reports.
#[derive(Clone, Debug, Default)]
pub struct Reporter {
    /// Controller, e.g. `lattice.dev/scheduler`.
    pub component: String,
    /// Instance, e.g. the host name.
    pub instance: Option<String>,
}

/// One event to publish.
#[derive(Clone, Debug)]
pub struct EventSpec {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// What was done, e.g. `Binding`.
    pub action: Option<String>,
}

/// Writes Events about objects. Cheap to share behind an `Arc`.
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    /// Event name → count last written (saves a GET per repeat).
    seen: Mutex<HashMap<String, u32>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

/// The most distinct events remembered; beyond it the memory is cleared (a repeat then
/// costs one extra GET).
const MAX_SEEN: usize = 4096;

impl Recorder {
    /// A recorder writing through `client`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Publish an event about `obj`.
    pub async fn publish<K: Resource>(&self, obj: &K, ev: &EventSpec) -> crate::Result<Event> {
        let regarding = ObjectReference {
            api_version: Some(lattice_apis::API_VERSION.to_string()),
            kind: K::KIND.to_string(),
            namespace: obj.namespace().map(str::to_string),
            name: obj.name_any().to_string(),
            uid: obj.uid().map(str::to_string),
            resource_version: None,
            field_path: None,
        };
        self.publish_ref(regarding, ev).await
    }

    /// Publish an event about the object `regarding` names.
    pub async fn publish_ref(
        &self,
        regarding: ObjectReference,
        ev: &EventSpec,
    ) -> crate::Result<Event> {
        let ns = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| SYSTEM_NAMESPACE.to_string());
        let name = self.event_name(&regarding, ev);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let known = self.seen.lock().ok().and_then(|m| m.get(&name).copied());
        if let Some(count) = known {
            if let Ok(e) = self.bump(&api, &name, count).await {
                return Ok(e);
            }
        }
        let t = now();
        let event = Event {
            metadata: ObjectMeta::named(name.clone(), Some(&ns)),
            involved_object: regarding,
            reason: ev.reason.clone(),
            message: ev.message.clone(),
            type_: ev.type_,
            count: 1,
            first_timestamp: Some(t),
            last_timestamp: Some(t),
            source: EventSource {
                component: Some(self.reporter.component.clone()),
                host: self.reporter.instance.clone(),
            },
            action: ev.action.clone(),
            reporting_component: Some(self.reporter.component.clone()),
            reporting_instance: self.reporter.instance.clone(),
            ..Event::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(e) => {
                self.remember(&name, 1);
                Ok(e)
            }
            Err(e) if e.is_already_exists() => {
                let existing = api.get(&name).await?;
                self.bump(&api, &name, existing.count).await
            }
            Err(e) => Err(e),
        }
    }

    async fn bump(&self, api: &Api<Event>, name: &str, count: u32) -> crate::Result<Event> {
        let patch = Patch::Merge(json!({"count": count + 1, "lastTimestamp": now()}));
        let e = api.patch(name, &PatchParams::default(), &patch).await?;
        self.remember(name, e.count);
        Ok(e)
    }

    fn remember(&self, name: &str, count: u32) {
        if let Ok(mut m) = self.seen.lock() {
            if m.len() >= MAX_SEEN {
                m.clear();
            }
            m.insert(name.to_string(), count);
        }
    }

    /// `<object>.<hash of what makes two events "the same">`: deterministic, so
    /// repeats (even from another process or after a restart) land on one Event.
    fn event_name(&self, r: &ObjectReference, ev: &EventSpec) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&r.kind, &r.namespace, &r.name, &r.uid).hash(&mut h);
        (format!("{:?}", ev.type_), &ev.reason, &ev.message).hash(&mut h);
        self.reporter.component.hash(&mut h);
        let base: String = r.name.chars().take(200).collect();
        format!("{base}.{:016x}", h.finish())
    }
}
