//! `reflector`: the in-memory cache a watcher feeds — `Arc<K>` per object, with
//! secondary indexes by owner uid, by assigned node and by label.
//!
//! A relist does not build a second copy of the cache: objects are upserted in place
//! and only the *names* seen are remembered, so the peak during a relist is one cache
//! plus a set of keys, not two caches (kube-runtime's buffer doubles memory).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use lattice_apis::{Allocation, Resource};
use tokio::sync::watch;

use crate::resource::{ObjectRef, ResourceExt};

/// Index key → the objects under it (the same `Arc`s as the cache, so a lookup is one
/// hash probe plus clones, not a second probe per object).
type Index<K> = HashMap<String, HashMap<ObjectRef, Arc<K>>>;

struct Inner<K> {
    objects: HashMap<ObjectRef, Arc<K>>,
    by_owner: Index<K>,
    by_node: Index<K>,
    by_label: Index<K>,
}

impl<K> Default for Inner<K> {
    fn default() -> Self {
        Self {
            objects: HashMap::new(),
            by_owner: HashMap::new(),
            by_node: HashMap::new(),
            by_label: HashMap::new(),
        }
    }
}

/// The index keys of one object.
struct Keys {
    owners: Vec<String>,
    nodes: Vec<String>,
    labels: Vec<String>,
}

fn keys<K: Resource + 'static>(obj: &K) -> Keys {
    let owners = obj
        .owner_references()
        .iter()
        .map(|o| o.uid.clone())
        .collect();
    // Only Allocations are bound to nodes (`status.assignedNodes`).
    let nodes = (obj as &dyn Any)
        .downcast_ref::<Allocation>()
        .and_then(|a| a.status.as_ref())
        .map(|s| s.assigned_nodes.clone())
        .unwrap_or_default();
    let labels = obj.labels().iter().map(|(k, v)| label_key(k, v)).collect();
    Keys {
        owners,
        nodes,
        labels,
    }
}

fn label_key(k: &str, v: &str) -> String {
    format!("{k}={v}")
}

fn index_add<K>(idx: &mut Index<K>, keys: &[String], r: &ObjectRef, obj: &Arc<K>) {
    for k in keys {
        idx.entry(k.clone())
            .or_default()
            .insert(r.clone(), obj.clone());
    }
}

fn index_remove<K>(idx: &mut Index<K>, keys: &[String], r: &ObjectRef) {
    for k in keys {
        if let Some(set) = idx.get_mut(k) {
            set.remove(r);
            if set.is_empty() {
                idx.remove(k);
            }
        }
    }
}

/// A read handle on the cache. Cheap to clone; every clone sees the same objects.
pub struct Store<K> {
    inner: Arc<RwLock<Inner<K>>>,
    synced: watch::Receiver<bool>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            synced: self.synced.clone(),
        }
    }
}

/// The write handle, owned by the informer.
pub struct Writer<K> {
    inner: Arc<RwLock<Inner<K>>>,
    synced: watch::Sender<bool>,
    /// Keys seen since the current relist began.
    relisting: Option<HashSet<ObjectRef>>,
}

/// A new empty cache.
pub fn store<K>() -> (Store<K>, Writer<K>) {
    let inner = Arc::new(RwLock::new(Inner::default()));
    let (tx, rx) = watch::channel(false);
    (
        Store {
            inner: inner.clone(),
            synced: rx,
        },
        Writer {
            inner,
            synced: tx,
            relisting: None,
        },
    )
}

fn read<K>(l: &RwLock<Inner<K>>) -> RwLockReadGuard<'_, Inner<K>> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<K>(l: &RwLock<Inner<K>>) -> RwLockWriteGuard<'_, Inner<K>> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl<K: Resource + Send + Sync + 'static> Store<K> {
    /// The cached object, if any.
    pub fn get(&self, r: &ObjectRef) -> Option<Arc<K>> {
        read(&self.inner).objects.get(r).cloned()
    }

    /// The cached object `name` in `namespace`.
    pub fn get_named(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        self.get(&ObjectRef::new::<K>(namespace, name))
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        read(&self.inner).objects.values().cloned().collect()
    }

    /// Every cached object's reference.
    pub fn refs(&self) -> Vec<ObjectRef> {
        read(&self.inner).objects.keys().cloned().collect()
    }

    /// Objects matching `pred`.
    pub fn find(&self, pred: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        read(&self.inner)
            .objects
            .values()
            .filter(|o| pred(o))
            .cloned()
            .collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        read(&self.inner).objects.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lookup(&self, pick: impl Fn(&Inner<K>) -> &Index<K>, key: &str) -> Vec<Arc<K>> {
        let g = read(&self.inner);
        pick(&g)
            .get(key)
            .map(|set| set.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Objects with an owner reference to `uid` (the dependents of an owner).
    pub fn by_owner_uid(&self, uid: &str) -> Vec<Arc<K>> {
        self.lookup(|i| &i.by_owner, uid)
    }

    /// Allocations bound to `node` (`status.assignedNodes`); empty for other kinds.
    pub fn by_node(&self, node: &str) -> Vec<Arc<K>> {
        self.lookup(|i| &i.by_node, node)
    }

    /// Objects labelled `key=value`.
    pub fn by_label(&self, key: &str, value: &str) -> Vec<Arc<K>> {
        self.lookup(|i| &i.by_label, &label_key(key, value))
    }

    /// Whether the first list has completed.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Wait until the first list has completed.
    pub async fn wait_until_synced(&self) {
        let mut rx = self.synced.clone();
        // An error means the writer is gone; nothing will ever sync.
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// What applying one event changed.
pub(crate) enum Applied<K> {
    /// Inserted or replaced (the previous version, if any).
    Upserted(Arc<K>),
    /// Removed.
    Removed,
    /// Nothing (same resourceVersion as cached, or deleting an unknown object).
    Unchanged,
}

impl<K: Resource + Send + Sync + 'static> Writer<K> {
    /// Start a relist.
    pub(crate) fn begin_relist(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// Insert or replace an object. `managedFields` is dropped first: nothing in a
    /// controller reads it, and it is often the biggest part of an object.
    pub(crate) fn apply(&mut self, mut obj: K) -> Applied<K> {
        obj.metadata_mut().managed_fields = Vec::new();
        let r = ObjectRef::from_obj(&obj);
        if let Some(seen) = &mut self.relisting {
            seen.insert(r.clone());
        }
        let mut g = write(&self.inner);
        if let Some(old) = g.objects.get(&r) {
            if old.resource_version().is_some()
                && old.resource_version() == obj.resource_version()
                && old.uid() == obj.uid()
            {
                return Applied::Unchanged;
            }
        }
        let new_keys = keys(&obj);
        let obj = Arc::new(obj);
        if let Some(old) = g.objects.insert(r.clone(), obj.clone()) {
            let k = keys(old.as_ref());
            index_remove(&mut g.by_owner, &k.owners, &r);
            index_remove(&mut g.by_node, &k.nodes, &r);
            index_remove(&mut g.by_label, &k.labels, &r);
        }
        index_add(&mut g.by_owner, &new_keys.owners, &r, &obj);
        index_add(&mut g.by_node, &new_keys.nodes, &r, &obj);
        index_add(&mut g.by_label, &new_keys.labels, &r, &obj);
        Applied::Upserted(obj)
    }

    fn remove_ref(g: &mut Inner<K>, r: &ObjectRef) -> Option<Arc<K>> {
        let old = g.objects.remove(r)?;
        let k = keys(old.as_ref());
        index_remove(&mut g.by_owner, &k.owners, r);
        index_remove(&mut g.by_node, &k.nodes, r);
        index_remove(&mut g.by_label, &k.labels, r);
        Some(old)
    }

    /// Remove an object.
    pub(crate) fn delete(&mut self, obj: &K) -> Applied<K> {
        let r = ObjectRef::from_obj(obj);
        let mut g = write(&self.inner);
        match Self::remove_ref(&mut g, &r) {
            Some(_) => Applied::Removed,
            None => Applied::Unchanged,
        }
    }

    /// Finish a relist: drop what was not seen; returns the dropped objects. The
    /// cache counts as synced from here on.
    pub(crate) fn end_relist(&mut self) -> Vec<Arc<K>> {
        let mut gone = Vec::new();
        if let Some(seen) = self.relisting.take() {
            let mut g = write(&self.inner);
            let stale: Vec<ObjectRef> = g
                .objects
                .keys()
                .filter(|r| !seen.contains(*r))
                .cloned()
                .collect();
            for r in stale {
                if let Some(old) = Self::remove_ref(&mut g, &r) {
                    gone.push(old);
                }
            }
        }
        self.synced.send_replace(true);
        gone
    }
}

/// Test hooks (memory measurements drive a writer without a watcher).
#[doc(hidden)]
impl<K: Resource + Send + Sync + 'static> Writer<K> {
    pub fn begin_relist_for_test(&mut self) {
        self.begin_relist();
    }
    pub fn apply_for_test(&mut self, obj: K) {
        let _ = self.apply(obj);
    }
    pub fn end_relist_for_test(&mut self) {
        let _ = self.end_relist();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::{ObjectMeta, OwnerReference};

    fn alloc(name: &str, rv: &str, owner: Option<&str>, nodes: &[&str]) -> Allocation {
        let mut a = Allocation {
            metadata: ObjectMeta::named(name, Some("t")),
            ..Allocation::default()
        };
        a.metadata.resource_version = Some(rv.into());
        a.metadata.labels.insert("app".into(), "x".into());
        a.metadata.managed_fields = vec![Default::default()];
        if let Some(uid) = owner {
            a.metadata.owner_references = vec![OwnerReference {
                api_version: "lattice.dev/v1alpha1".into(),
                kind: "Dag".into(),
                name: "d".into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }];
        }
        if !nodes.is_empty() {
            a.status = Some(lattice_apis::AllocationStatus {
                assigned_nodes: nodes.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            });
        }
        a
    }

    #[test]
    fn indexes_follow_updates_and_relists() {
        let (store, mut w) = store::<Allocation>();
        assert!(!store.is_synced());
        w.begin_relist();
        w.apply(alloc("a", "1", Some("u1"), &["n1"]));
        w.apply(alloc("b", "2", Some("u1"), &[]));
        assert!(w.end_relist().is_empty());
        assert!(store.is_synced());
        assert_eq!(store.by_owner_uid("u1").len(), 2);
        assert_eq!(store.by_node("n1").len(), 1);
        assert_eq!(store.by_label("app", "x").len(), 2);
        assert!(store
            .get_named(Some("t"), "a")
            .is_some_and(|a| a.metadata.managed_fields.is_empty()));
        // Update moves the node index.
        w.apply(alloc("a", "3", None, &["n2"]));
        assert!(store.by_node("n1").is_empty());
        assert_eq!(store.by_node("n2").len(), 1);
        assert_eq!(store.by_owner_uid("u1").len(), 1);
        // Same resourceVersion: unchanged.
        assert!(matches!(
            w.apply(alloc("a", "3", None, &["n2"])),
            Applied::Unchanged
        ));
        // A relist that no longer has "b" drops it.
        w.begin_relist();
        w.apply(alloc("a", "3", None, &["n2"]));
        let gone = w.end_relist();
        assert_eq!(gone.len(), 1);
        assert_eq!(store.len(), 1);
        assert!(store.by_owner_uid("u1").is_empty());
    }
}
