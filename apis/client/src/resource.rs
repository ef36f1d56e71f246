//! [`ObjectRef`] and [`ResourceExt`]: naming objects and reading their metadata.
//!
//! The [`Resource`] trait itself lives in `lattice-apis` (every kind implements it);
//! this module adds what controllers need on top.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, OnceLock};

use lattice_apis::{KindInfo, OwnerReference, Resource, API_VERSION};

/// The registry entry of kind `K`.
///
/// Every kind of `lattice-apis` is in the registry. A kind defined elsewhere gets an
/// entry built from its [`Resource`] constants (once, then cached), so an `Api` can
/// still be built for it; the server must of course serve it.
pub fn kind_info<K: Resource>() -> &'static KindInfo {
    if let Some(k) = lattice_apis::kinds().iter().find(|k| k.kind == K::KIND) {
        return k;
    }
    static EXTRA: OnceLock<Mutex<HashMap<&'static str, &'static KindInfo>>> = OnceLock::new();
    let mut extra = EXTRA
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    extra.entry(K::KIND).or_insert_with(|| {
        let singular: &'static str = Box::leak(K::KIND.to_ascii_lowercase().into_boxed_str());
        // Leaked once per kind for the life of the process, like the static registry.
        Box::leak(Box::new(KindInfo {
            kind: K::KIND,
            plural: K::PLURAL,
            singular,
            short_names: &[],
            namespaced: K::NAMESPACED,
            has_status: true,
            printer_columns: &[],
            selectable_fields: &[],
            schema: lattice_apis::resource::schema_json::<K>,
            admit: lattice_apis::resource::admit_json::<K>,
        }))
    })
}

/// Names one object: (kind, tenant?, name). The uid is carried for logs only and
/// takes no part in equality or hashing, so a recreated object maps to the same key.
#[derive(Clone, Debug, Eq, PartialOrd, Ord)]
pub struct ObjectRef {
    /// `Allocation`, `Dag`, ...
    pub kind: String,
    /// Tenant; `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`, when known (debugging only).
    pub uid: Option<String>,
}

impl PartialEq for ObjectRef {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.namespace == other.namespace && self.name == other.name
    }
}

impl Hash for ObjectRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.namespace.hash(state);
        self.name.hash(state);
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.kind, ns, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

impl ObjectRef {
    /// A reference to `K` named `name` in `namespace` (ignored for cluster-scoped kinds).
    pub fn new<K: Resource>(namespace: Option<&str>, name: &str) -> Self {
        Self {
            kind: K::KIND.to_string(),
            namespace: if K::NAMESPACED {
                namespace.map(str::to_string)
            } else {
                None
            },
            name: name.to_string(),
            uid: None,
        }
    }

    /// The reference of an object.
    pub fn from_obj<K: Resource>(obj: &K) -> Self {
        let m = obj.metadata();
        Self {
            kind: K::KIND.to_string(),
            namespace: if K::NAMESPACED {
                m.namespace.clone()
            } else {
                None
            },
            name: m.name_str().to_string(),
            uid: m.uid.clone(),
        }
    }

    /// The owner an owner reference points at, as seen from a dependent in
    /// `dependent_namespace` (owners of namespaced kinds share the dependent's tenant).
    pub fn from_owner(owner: &OwnerReference, dependent_namespace: Option<&str>) -> Self {
        let namespaced = lattice_apis::kinds()
            .iter()
            .find(|k| k.kind == owner.kind)
            .is_none_or(|k| k.namespaced);
        Self {
            kind: owner.kind.clone(),
            namespace: if namespaced {
                dependent_namespace.map(str::to_string)
            } else {
                None
            },
            name: owner.name.clone(),
            uid: Some(owner.uid.clone()),
        }
    }

    /// Whether this names an object of kind `K`.
    pub fn is_kind<K: Resource>(&self) -> bool {
        self.kind == K::KIND
    }
}

/// Metadata accessors for every [`Resource`].
pub trait ResourceExt: Resource {
    /// `metadata.name` ("" when unset).
    fn name_any(&self) -> &str {
        self.metadata().name_str()
    }
    /// `metadata.namespace` (the tenant).
    fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }
    /// `metadata.uid`.
    fn uid(&self) -> Option<&str> {
        self.metadata().uid.as_deref()
    }
    /// `metadata.resourceVersion`.
    fn resource_version(&self) -> Option<&str> {
        self.metadata().resource_version.as_deref()
    }
    /// `metadata.generation`.
    fn generation(&self) -> Option<i64> {
        self.metadata().generation
    }
    /// `metadata.finalizers`.
    fn finalizers(&self) -> &[String] {
        &self.metadata().finalizers
    }
    /// `metadata.ownerReferences`.
    fn owner_references(&self) -> &[OwnerReference] {
        &self.metadata().owner_references
    }
    /// The owner reference with `controller: true`, if any.
    fn controller_owner(&self) -> Option<&OwnerReference> {
        self.owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
    }
    /// Whether deletion was requested (`metadata.deletionTimestamp` is set).
    fn is_deleting(&self) -> bool {
        self.metadata().deletion_timestamp.is_some()
    }
    /// `metadata.labels`.
    fn labels(&self) -> &std::collections::BTreeMap<String, String> {
        &self.metadata().labels
    }
    /// This object's [`ObjectRef`].
    fn object_ref(&self) -> ObjectRef {
        ObjectRef::from_obj(self)
    }
    /// An owner reference pointing at this object, for a dependent to carry.
    /// `controller` marks the one managing controller (what `Controller::owns` follows).
    fn owner_ref(&self, controller: bool) -> Option<OwnerReference> {
        let m = self.metadata();
        Some(OwnerReference {
            api_version: API_VERSION.to_string(),
            kind: Self::KIND.to_string(),
            name: m.name.clone()?,
            uid: m.uid.clone()?,
            controller: controller.then_some(true),
            block_owner_deletion: controller.then_some(true),
        })
    }
}

impl<K: Resource> ResourceExt for K {}
