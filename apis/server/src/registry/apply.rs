//! Server-side apply (SSA v0) and managed-fields bookkeeping.
//!
//! * A field set is a set of leaf paths (field names from the root). Scalars, lists
//!   (atomic) and empty objects are leaves; objects are recursed into.
//! * Scope: the main resource manages everything except `apiVersion`, `kind`, `status`
//!   and the server-owned metadata (only `metadata.labels`, `metadata.annotations`,
//!   `metadata.finalizers` and `metadata.ownerReferences` are managed); the `status`
//!   subresource manages only `status`.
//! * Apply: conflicts are fields owned by another manager whose live value differs from
//!   the applied one (409 unless `force`, which takes them over); fields the manager
//!   applied before but no longer specifies are removed unless someone else owns them.
//! * Update (PUT/PATCH/POST): the writer silently takes ownership of the fields it changed.
//! * Stored in `metadata.managedFields` in the `FieldsV1` format (`{"f:spec":{"f:x":{}}}`).

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::{json, Map, Value};

use crate::registry::objects::now_rfc3339;

const MANAGED_META: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// One manager's entry in `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub subresource: Option<String>,
    pub api_version: String,
    pub time: Option<String>,
    pub fields: FieldSet,
}

impl Entry {
    fn same_slot(&self, manager: &str, operation: &str, sub: Option<&str>) -> bool {
        self.manager == manager && self.operation == operation && self.subresource.as_deref() == sub
    }
}

/// One step of a field path: an object field, or a list-map item by its key
/// (canonical JSON of the key fields, e.g. `{"name":"a"}`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Seg {
    F(String),
    K(String),
}

pub type Path = Vec<Seg>;
pub type FieldSet = BTreeSet<Path>;

/// Lists the schema marks `x-kubernetes-list-type: map`, by field path (list items
/// do not appear in the path), with their key fields.
#[derive(Debug, Clone, Default)]
pub struct ListMaps(HashMap<Vec<String>, Vec<String>>);

impl ListMaps {
    pub fn from_schema(root: &Value) -> Self {
        fn walk(
            node: &Value,
            defs: Option<&Value>,
            path: &mut Vec<String>,
            out: &mut HashMap<Vec<String>, Vec<String>>,
            depth: usize,
        ) {
            if depth > 48 {
                return;
            }
            let Some(o) = node.as_object() else { return };
            if let Some(r) = o.get("$ref").and_then(Value::as_str) {
                if let (Some(name), Some(d)) = (r.rsplit('/').next(), defs) {
                    if let Some(target) = d.get(name) {
                        walk(target, defs, path, out, depth + 1);
                    }
                }
            }
            for comb in ["anyOf", "oneOf", "allOf"] {
                if let Some(a) = o.get(comb).and_then(Value::as_array) {
                    for sub in a {
                        walk(sub, defs, path, out, depth + 1);
                    }
                }
            }
            if o.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
                let mut keys: Vec<String> = o
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|k| k.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                keys.sort();
                if !keys.is_empty() {
                    out.insert(path.clone(), keys);
                }
            }
            if let Some(props) = o.get("properties").and_then(Value::as_object) {
                for (k, sub) in props {
                    path.push(k.clone());
                    walk(sub, defs, path, out, depth + 1);
                    path.pop();
                }
            }
            if let Some(items) = o.get("items") {
                walk(items, defs, path, out, depth + 1);
            }
        }
        let defs = root.get("$defs").or_else(|| root.get("definitions"));
        let mut out = HashMap::new();
        walk(root, defs, &mut Vec::new(), &mut out, 0);
        Self(out)
    }

    fn keys_for(&self, p: &[Seg]) -> Option<&Vec<String>> {
        if self.0.is_empty() {
            return None;
        }
        let fields: Vec<String> = p
            .iter()
            .filter_map(|s| match s {
                Seg::F(f) => Some(f.clone()),
                Seg::K(_) => None,
            })
            .collect();
        self.0.get(&fields)
    }
}

/// Canonical key of a list-map item, if it has every key field.
fn item_key(e: &Value, keys: &[String]) -> Option<String> {
    let o = e.as_object()?;
    let mut m = std::collections::BTreeMap::new();
    for k in keys {
        m.insert(k.clone(), o.get(k)?.clone());
    }
    serde_json::to_string(&m).ok()
}

/// A list-map item key (`{"name":"a"}`), parsed once per lookup rather than once per
/// item compared.
struct ItemKey(Option<Map<String, Value>>);

impl ItemKey {
    fn parse(k: &str) -> Self {
        match serde_json::from_str::<Value>(k) {
            Ok(Value::Object(km)) => ItemKey(Some(km)),
            _ => ItemKey(None),
        }
    }

    fn matches(&self, e: &Value) -> bool {
        self.0
            .as_ref()
            .is_some_and(|km| km.iter().all(|(kk, kv)| e.get(kk) == Some(kv)))
    }

    /// Position of the item with this key in `a`.
    fn position(&self, a: &[Value]) -> Option<usize> {
        a.iter().position(|e| self.matches(e))
    }
}

/// One conflict: a field and the manager that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    pub path: Path,
}

pub fn path_string(p: &Path) -> String {
    let mut s = String::new();
    for seg in p {
        match seg {
            Seg::F(f) => {
                s.push('.');
                s.push_str(f);
            }
            Seg::K(k) => {
                s.push('[');
                s.push_str(k);
                s.push(']');
            }
        }
    }
    s
}

/// Leaf paths of `v`, recursing into objects and list-map items.
fn leaves_into(v: &Value, prefix: &mut Path, out: &mut FieldSet, lists: &ListMaps) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(Seg::F(k.clone()));
                leaves_into(child, prefix, out, lists);
                prefix.pop();
            }
        }
        Value::Array(a) if !a.is_empty() => {
            if let Some(keys) = lists.keys_for(prefix) {
                if let Some(ks) = a
                    .iter()
                    .map(|e| item_key(e, keys))
                    .collect::<Option<Vec<_>>>()
                {
                    for (e, k) in a.iter().zip(ks) {
                        prefix.push(Seg::K(k));
                        leaves_into(e, prefix, out, lists);
                        prefix.pop();
                    }
                    return;
                }
            }
            out.insert(prefix.clone());
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// The part of an object a write through `subresource` manages (see the module docs).
pub fn scoped(obj: &Value, subresource: Option<&str>) -> Value {
    let mut out = Map::new();
    let Some(o) = obj.as_object() else {
        return Value::Object(out);
    };
    if subresource == Some("status") {
        if let Some(s) = o.get("status") {
            out.insert("status".into(), s.clone());
        }
        return Value::Object(out);
    }
    for (k, v) in o {
        match k.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                let mut meta = Map::new();
                if let Some(m) = v.as_object() {
                    for f in MANAGED_META {
                        if let Some(x) = m.get(*f) {
                            if !x.is_null() {
                                meta.insert((*f).to_string(), x.clone());
                            }
                        }
                    }
                }
                if !meta.is_empty() {
                    out.insert("metadata".into(), Value::Object(meta));
                }
            }
            _ => {
                if !v.is_null() {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Value::Object(out)
}

/// The leaf paths of `new` (as [`leaves_into`] lists them) whose value differs from the
/// one at the same path in `old`: one walk of both trees, with each list-map of `old`
/// indexed by item key once, instead of a lookup from the root per path (linear in
/// every list on the way, so quadratic for a Dag's thousand steps).
fn changed_leaves(new_root: &Value, old_root: Option<&Value>, lists: &ListMaps) -> FieldSet {
    struct Walk<'a> {
        new_root: &'a Value,
        old_root: Option<&'a Value>,
        lists: &'a ListMaps,
        out: FieldSet,
    }
    impl Walk<'_> {
        fn go(&mut self, new: &Value, old: Option<&Value>, prefix: &mut Path) {
            match new {
                Value::Object(m) if !m.is_empty() => {
                    let old_m = old.and_then(Value::as_object);
                    for (k, child) in m {
                        prefix.push(Seg::F(k.clone()));
                        self.go(child, old_m.and_then(|o| o.get(k)), prefix);
                        prefix.pop();
                    }
                }
                Value::Array(a) if !a.is_empty() => {
                    if let Some(keys) = self.lists.keys_for(prefix) {
                        if let Some(ks) = a
                            .iter()
                            .map(|e| item_key(e, keys))
                            .collect::<Option<Vec<_>>>()
                        {
                            // The first item with a key is the one a path names.
                            let mut old_items: HashMap<String, &Value> = HashMap::new();
                            if let Some(oa) = old.and_then(Value::as_array) {
                                for e in oa {
                                    if let Some(k) = item_key(e, keys) {
                                        old_items.entry(k).or_insert(e);
                                    }
                                }
                            }
                            let mut seen: HashSet<&str> = HashSet::new();
                            for (e, k) in a.iter().zip(&ks) {
                                prefix.push(Seg::K(k.clone()));
                                if seen.insert(k.as_str()) {
                                    self.go(e, old_items.get(k).copied(), prefix);
                                } else {
                                    self.duplicate(e, prefix);
                                }
                                prefix.pop();
                            }
                            return;
                        }
                    }
                    self.leaf(new, old, prefix);
                }
                _ => self.leaf(new, old, prefix),
            }
        }

        fn leaf(&mut self, new: &Value, old: Option<&Value>, prefix: &Path) {
            if old != Some(new) {
                self.out.insert(prefix.clone());
            }
        }

        /// A later item with an earlier item's key: its paths name the first item's
        /// values, so compare them the slow way (invalid input; never on a hot path).
        fn duplicate(&mut self, item: &Value, prefix: &mut Path) {
            let mut paths = FieldSet::new();
            leaves_into(item, prefix, &mut paths, self.lists);
            for p in paths {
                if self.old_root.and_then(|o| get_path(o, &p)) != get_path(self.new_root, &p) {
                    self.out.insert(p);
                }
            }
        }
    }
    let mut w = Walk {
        new_root,
        old_root,
        lists,
        out: FieldSet::new(),
    };
    if let Value::Object(m) = new_root {
        let old_m = old_root.and_then(Value::as_object);
        for (k, v) in m {
            let mut p = vec![Seg::F(k.clone())];
            w.go(v, old_m.and_then(|o| o.get(k)), &mut p);
        }
    }
    w.out
}

pub fn field_set(obj: &Value, subresource: Option<&str>, lists: &ListMaps) -> FieldSet {
    scoped_field_set(&scoped(obj, subresource), lists)
}

/// [`field_set`] of an object already [`scoped`].
fn scoped_field_set(s: &Value, lists: &ListMaps) -> FieldSet {
    let mut out = FieldSet::new();
    if let Value::Object(m) = s {
        for (k, v) in m {
            let mut p = vec![Seg::F(k.clone())];
            leaves_into(v, &mut p, &mut out, lists);
        }
    }
    out
}

pub fn get_path<'a>(v: &'a Value, p: &[Seg]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in p {
        cur = match seg {
            Seg::F(f) => cur.as_object()?.get(f)?,
            Seg::K(k) => {
                let a = cur.as_array()?;
                &a[ItemKey::parse(k).position(a)?]
            }
        };
    }
    Some(cur)
}

/// Set `p` to `val`, creating (or replacing mismatched) intermediate objects, lists
/// and list-map items.
pub fn set_path(v: &mut Value, p: &[Seg], val: Value) {
    let Some(first) = p.first() else {
        *v = val;
        return;
    };
    match first {
        Seg::F(f) => {
            if !v.is_object() {
                *v = Value::Object(Map::new());
            }
            if let Value::Object(m) = v {
                let child = m.entry(f.clone()).or_insert(Value::Null);
                set_path(child, &p[1..], val);
            }
        }
        Seg::K(k) => {
            if !v.is_array() {
                *v = Value::Array(Vec::new());
            }
            if let Value::Array(a) = v {
                let idx = match ItemKey::parse(k).position(a) {
                    Some(i) => i,
                    None => {
                        a.push(
                            serde_json::from_str::<Value>(k).unwrap_or(Value::Object(Map::new())),
                        );
                        a.len() - 1
                    }
                };
                set_path(&mut a[idx], &p[1..], val);
            }
        }
    }
}

fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Remove `p`; containers left empty by the removal are removed too.
pub fn remove_path(v: &mut Value, p: &[Seg]) -> bool {
    let Some(first) = p.first() else { return false };
    match first {
        Seg::F(f) => {
            let Some(m) = v.as_object_mut() else {
                return false;
            };
            if p.len() == 1 {
                return m.remove(f).is_some();
            }
            let Some(child) = m.get_mut(f) else {
                return false;
            };
            let removed = remove_path(child, &p[1..]);
            if removed && is_empty_container(child) {
                m.remove(f);
            }
            removed
        }
        Seg::K(k) => {
            let Some(a) = v.as_array_mut() else {
                return false;
            };
            let Some(i) = ItemKey::parse(k).position(a) else {
                return false;
            };
            if p.len() == 1 {
                a.remove(i);
                return true;
            }
            let removed = remove_path(&mut a[i], &p[1..]);
            if removed && is_empty_container(&a[i]) {
                a.remove(i);
            }
            removed
        }
    }
}

/// Whether `set` holds `p` or one of its ancestors: one lookup per prefix of `p`.
fn has_prefix_of(set: &FieldSet, p: &[Seg]) -> bool {
    (0..=p.len()).any(|n| set.contains(&p[..n]))
}

/// The paths of `set` that are `p` or below it: a contiguous run in the set's order,
/// starting at `p`.
fn under<'a>(set: &'a FieldSet, p: &'a [Seg]) -> impl Iterator<Item = &'a Path> + 'a {
    use std::ops::Bound;
    set.range::<[Seg], _>((Bound::Included(p), Bound::Unbounded))
        .take_while(move |q| q.starts_with(p))
}

/// Whether `set` holds a path related to `p` (an ancestor, `p` itself or a descendant),
/// in O(depth · log n) rather than a scan of the set: status writes of large objects
/// (a Dag with a thousand steps) compare thousands of paths against each other.
fn owns_related(set: &FieldSet, p: &Path) -> bool {
    has_prefix_of(set, p) || under(set, p).next().is_some()
}

/// The paths of `set` related to `q`, in set order.
fn related_in<'a>(set: &'a FieldSet, q: &'a Path) -> impl Iterator<Item = &'a Path> + 'a {
    (0..q.len())
        .filter_map(move |n| set.get(&q[..n]))
        .chain(under(set, q))
}

/// `{"f:a":{"f:b":{}}}` for the set (`k:{...}` for list-map items).
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Value::Object(Map::new());
    for p in set {
        let mut cur = &mut root;
        for seg in p {
            let Value::Object(m) = cur else { break };
            let key = match seg {
                Seg::F(f) => format!("f:{f}"),
                Seg::K(k) => format!("k:{k}"),
            };
            cur = m.entry(key).or_insert_with(|| Value::Object(Map::new()));
        }
    }
    root
}

pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        let mut any_child = false;
        for (k, child) in m {
            if let Some(name) = k.strip_prefix("f:") {
                any_child = true;
                prefix.push(Seg::F(name.to_string()));
                walk(child, prefix, out);
                prefix.pop();
            } else if let Some(key) = k.strip_prefix("k:") {
                any_child = true;
                prefix.push(Seg::K(key.to_string()));
                walk(child, prefix, out);
                prefix.pop();
            } else if k == "." {
                if !prefix.is_empty() {
                    out.insert(prefix.clone());
                }
            } else {
                // v:/i: (set or positional items): own the whole list.
                if !prefix.is_empty() {
                    out.insert(prefix.clone());
                }
                any_child = true;
            }
        }
        if !any_child && !prefix.is_empty() {
            out.insert(prefix.clone());
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

pub fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(arr) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    arr.iter().filter_map(read_entry).collect()
}

fn read_entry(e: &Value) -> Option<Entry> {
    Some(Entry {
        manager: e.get("manager")?.as_str()?.to_string(),
        operation: e
            .get("operation")
            .and_then(Value::as_str)
            .unwrap_or("Update")
            .to_string(),
        subresource: e
            .get("subresource")
            .and_then(Value::as_str)
            .map(String::from),
        api_version: e
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(lattice_apis::API_VERSION)
            .to_string(),
        time: e.get("time").and_then(Value::as_str).map(String::from),
        fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
    })
}

/// One entry as stored; `None` for an entry that owns nothing (dropped).
fn entry_value(e: &Entry) -> Option<Value> {
    if e.fields.is_empty() {
        return None;
    }
    let mut v = json!({
        "manager": e.manager,
        "operation": e.operation,
        "apiVersion": e.api_version,
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(&e.fields),
    });
    if let Some(t) = &e.time {
        v["time"] = Value::String(t.clone());
    }
    if let Some(s) = &e.subresource {
        v["subresource"] = Value::String(s.clone());
    }
    Some(v)
}

pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let arr: Vec<Value> = entries.iter().filter_map(entry_value).collect();
    if let Some(m) = crate::registry::objects::meta_mut(obj) {
        if arr.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

fn upsert(entries: &mut Vec<Entry>, manager: &str, op: &str, sub: Option<&str>, fields: FieldSet) {
    match entries.iter_mut().find(|e| e.same_slot(manager, op, sub)) {
        Some(e) => {
            if e.fields != fields {
                e.fields = fields;
                e.time = Some(now_rfc3339());
            }
        }
        None => entries.push(Entry {
            manager: manager.to_string(),
            operation: op.to_string(),
            subresource: sub.map(String::from),
            api_version: lattice_apis::API_VERSION.to_string(),
            time: Some(now_rfc3339()),
            fields,
        }),
    }
}

fn retain_nonempty(entries: &mut Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
}

/// Server-side apply of `applied` by `manager` onto `live`. Returns the merged object
/// (managedFields updated) or the conflicts.
pub fn apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    lists: &ListMaps,
) -> Result<Value, Vec<Conflict>> {
    let mut entries = read_entries(live);
    let new_set = field_set(applied, subresource, lists);
    let old_set: FieldSet = entries
        .iter()
        .find(|e| e.same_slot(manager, "Apply", subresource))
        .map(|e| e.fields.clone())
        .unwrap_or_default();

    // Conflicts with other managers.
    let mut conflicts = Vec::new();
    let mut taken: Vec<(usize, Path)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.manager == manager {
            continue;
        }
        for q in &e.fields {
            for p in related_in(&new_set, q) {
                let (lp, ap) = if p.len() >= q.len() { (p, p) } else { (q, q) };
                let live_v = get_path(live, lp);
                let applied_v = get_path(applied, ap);
                if live_v != applied_v {
                    if force {
                        taken.push((i, q.clone()));
                    } else {
                        conflicts.push(Conflict {
                            manager: e.manager.clone(),
                            path: p.clone(),
                        });
                    }
                }
            }
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| (&a.path, &a.manager).cmp(&(&b.path, &b.manager)));
        conflicts.dedup();
        return Err(conflicts);
    }
    for (i, q) in taken {
        if let Some(e) = entries.get_mut(i) {
            if e.fields.remove(&q) {
                e.time = Some(now_rfc3339());
            }
        }
    }

    let mut result = live.clone();
    for p in &new_set {
        if let Some(v) = get_path(applied, p) {
            set_path(&mut result, p, v.clone());
        }
    }
    // Fields this manager dropped: remove unless someone else still owns them.
    for p in old_set.difference(&new_set) {
        if owns_related(&new_set, p) {
            continue;
        }
        let owned_elsewhere = entries
            .iter()
            .any(|e| !e.same_slot(manager, "Apply", subresource) && owns_related(&e.fields, p));
        if owned_elsewhere {
            continue;
        }
        // A list-map item nobody else uses goes whole; an item that stays keeps its keys.
        let mut target: Option<&[Seg]> = Some(p);
        for (i, seg) in p.iter().enumerate() {
            let Seg::K(k) = seg else { continue };
            let item = &p[..=i];
            let used = new_set.iter().any(|q| q.starts_with(item))
                || entries.iter().any(|e| {
                    !e.same_slot(manager, "Apply", subresource)
                        && e.fields.iter().any(|q| q.starts_with(item))
                });
            if !used {
                target = Some(item);
                break;
            }
            if i + 2 == p.len() {
                if let Some(Seg::F(f)) = p.last() {
                    if serde_json::from_str::<Value>(k)
                        .ok()
                        .and_then(|v| v.get(f).cloned())
                        .is_some()
                    {
                        target = None;
                    }
                }
            }
        }
        if let Some(t) = target {
            remove_path(&mut result, t);
        }
    }
    // The manager's own Update entry gives up what its Apply now owns.
    for e in entries.iter_mut() {
        if e.manager == manager && e.operation != "Apply" {
            e.fields.retain(|q| !owns_related(&new_set, q));
        }
    }
    upsert(&mut entries, manager, "Apply", subresource, new_set);
    retain_nonempty(&mut entries);
    write_entries(&mut result, &entries);
    Ok(result)
}

/// Record an Update-operation write: `manager` takes ownership of every field it
/// changed; fields that disappeared are dropped from every manager.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    lists: &ListMaps,
) {
    // Only the entries of this write's scope (the status, or everything else) can
    // change: the others are carried over as they are, unparsed (a Dag's spec entry
    // is hundreds of kilobytes that a status write need not read or rebuild).
    let status_scope = subresource == Some("status");
    if old.is_none() {
        // A creation: every field is new and nobody else owns any, so the writer owns
        // exactly the object's fields (what the general path below computes, without
        // its set differences).
        let fields = scoped_field_set(&scoped(new, subresource), lists);
        let mut entries = Vec::new();
        if !fields.is_empty() {
            upsert(&mut entries, manager, "Update", subresource, fields);
        }
        write_scope(new, Vec::new(), &entries);
        return;
    }
    let (mut entries, slots) = read_scope(old, new, status_scope);
    let new_s = scoped(new, subresource);
    let old_s = old.map(|o| scoped(o, subresource));
    let new_set = scoped_field_set(&new_s, lists);
    let old_set = old_s
        .as_ref()
        .map(|o| scoped_field_set(o, lists))
        .unwrap_or_default();
    let changed: FieldSet = match &old_s {
        // On create every field is new.
        None => new_set.clone(),
        Some(o) => changed_leaves(&new_s, Some(o), lists),
    };
    let removed: FieldSet = old_set.difference(&new_set).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        write_scope(new, slots, &entries);
        return;
    }
    for e in entries.iter_mut() {
        let before = e.fields.len();
        e.fields.retain(|q| {
            // drop changed fields (and related paths) and removed subtrees
            !(owns_related(&changed, q) || has_prefix_of(&removed, q))
        });
        if e.fields.len() != before {
            e.time = Some(now_rfc3339());
        }
    }
    let mut mine: FieldSet = entries
        .iter()
        .find(|e| e.same_slot(manager, "Update", subresource))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    mine.extend(changed);
    // only keep what still exists
    mine.retain(|p| new_set.contains(p));
    upsert(&mut entries, manager, "Update", subresource, mine);
    write_scope(new, slots, &entries);
}

/// Where each kept managedFields entry sits: carried over unparsed (another scope), or
/// parsed (index into the entries of this scope).
enum Slot {
    Raw(Value),
    Parsed(usize),
}

/// The managedFields of `old` as entries of the status scope (or of the other one),
/// parsed, and the slots of all entries in their order. `new` usually carries the same
/// array (an update starts from the stored object): then it is moved out of `new`
/// rather than copied.
fn read_scope(old: Option<&Value>, new: &mut Value, status_scope: bool) -> (Vec<Entry>, Vec<Slot>) {
    let mut entries = Vec::new();
    let mut slots = Vec::new();
    let Some(old_arr) = old
        .and_then(|o| o.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
    else {
        return (entries, slots);
    };
    let arr = match new
        .pointer_mut("/metadata/managedFields")
        .filter(|v| v.as_array() == Some(old_arr))
    {
        Some(v) => match v.take() {
            Value::Array(a) => a,
            _ => Vec::new(),
        },
        None => old_arr.clone(),
    };
    for e in arr {
        // As read_entries: an entry without a manager is dropped.
        if e.get("manager").and_then(Value::as_str).is_none() {
            continue;
        }
        let in_scope =
            (e.get("subresource").and_then(Value::as_str) == Some("status")) == status_scope;
        if in_scope {
            if let Some(parsed) = read_entry(&e) {
                slots.push(Slot::Parsed(entries.len()));
                entries.push(parsed);
            }
        } else if e
            .get("fieldsV1")
            .and_then(Value::as_object)
            .is_some_and(|f| !f.is_empty())
        {
            slots.push(Slot::Raw(e));
        }
    }
    (entries, slots)
}

/// Write managedFields back in their order: carried-over entries as they were, this
/// scope's (non-empty) entries rebuilt, new ones last.
fn write_scope(obj: &mut Value, slots: Vec<Slot>, entries: &[Entry]) {
    let mut arr = Vec::with_capacity(slots.len() + 1);
    let mut written = vec![false; entries.len()];
    for slot in slots {
        match slot {
            Slot::Raw(v) => arr.push(v),
            Slot::Parsed(i) => {
                written[i] = true;
                if let Some(v) = entry_value(&entries[i]) {
                    arr.push(v);
                }
            }
        }
    }
    for (e, done) in entries.iter().zip(written) {
        if !done {
            if let Some(v) = entry_value(e) {
                arr.push(v);
            }
        }
    }
    if let Some(m) = crate::registry::objects::meta_mut(obj) {
        if arr.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_path() -> impl Strategy<Value = Path> {
        proptest::collection::vec(
            prop_oneof![
                (0..3u8).prop_map(|i| Seg::F(format!("f{i}"))),
                (0..2u8).prop_map(|i| Seg::K(format!("k{i}"))),
            ],
            0..4,
        )
    }

    proptest! {
        /// The indexed prefix queries agree with a scan of the set.
        #[test]
        fn prefix_queries_match_a_scan(
            set in proptest::collection::btree_set(arb_path(), 0..24),
            p in arb_path(),
        ) {
            let related = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
            prop_assert_eq!(owns_related(&set, &p), set.iter().any(|q| related(&p, q)));
            prop_assert_eq!(has_prefix_of(&set, &p), set.iter().any(|q| p.starts_with(q)));
            let fast: Vec<&Path> = related_in(&set, &p).collect();
            let slow: Vec<&Path> = set.iter().filter(|q| related(q, &p)).collect();
            prop_assert_eq!(fast, slow);
        }
    }

    fn p(s: &str) -> Path {
        s.split('.').map(|x| Seg::F(x.to_string())).collect()
    }

    fn none() -> ListMaps {
        ListMaps::default()
    }

    /// managedFields without their timestamps (two writes a second apart differ there).
    fn untimed(obj: &Value) -> Value {
        let mut mf = obj["metadata"]["managedFields"].clone();
        if let Some(a) = mf.as_array_mut() {
            for e in a {
                if let Some(o) = e.as_object_mut() {
                    o.remove("time");
                }
            }
        }
        mf
    }

    #[test]
    fn a_creation_records_what_the_general_update_path_records_from_nothing() {
        // The shortcut for `old == None` against the full computation from an empty old
        // object: same entries, for the main resource and the status, with list-maps,
        // client-sent managedFields (replaced) and an object with no managed fields.
        let schema = json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {"tasks": {
                "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}}}
            }}}}
        });
        let lists = ListMaps::from_schema(&schema);
        let objects = [
            json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a", "labels": {"x": "1"}, "annotations": {"y": "2"}},
                   "spec": {"tasks": [{"name": "t1", "cmd": "c"}, {"name": "t2"}], "n": 3, "list": [1, 2], "empty": {}},
                   "status": {"phase": "Pending", "reason": "r"}}),
            json!({"metadata": {"name": "b", "managedFields": [{"manager": "forged", "operation": "Apply",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]}, "spec": {"a": null}}),
            json!({"metadata": {"name": "c"}}),
        ];
        for obj in objects {
            for sub in [None, Some("status")] {
                let mut created = obj.clone();
                record_update(None, &mut created, "m", sub, &lists);
                let mut general = obj.clone();
                record_update(Some(&json!({})), &mut general, "m", sub, &lists);
                assert_eq!(untimed(&created), untimed(&general), "{obj} {sub:?}");
                let mut rest = created.clone();
                rest["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("managedFields");
                let mut rest_g = general.clone();
                rest_g["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("managedFields");
                assert_eq!(rest, rest_g);
            }
        }
    }

    #[test]
    fn fields_v1_roundtrip() {
        let obj = json!({"metadata": {"name": "x", "labels": {"a": "1"}}, "spec": {"x": 1, "y": {"z": [1, 2]}, "e": {}}, "status": {"s": 1}});
        let set = field_set(&obj, None, &none());
        assert_eq!(
            set,
            [
                p("metadata.labels.a"),
                p("spec.x"),
                p("spec.y.z"),
                p("spec.e")
            ]
            .into_iter()
            .collect()
        );
        let v1 = to_fields_v1(&set);
        assert_eq!(v1["f:spec"]["f:y"]["f:z"], json!({}));
        assert_eq!(from_fields_v1(&v1), set);
        assert_eq!(
            field_set(&obj, Some("status"), &none()),
            [p("status.s")].into_iter().collect()
        );
    }

    #[test]
    fn apply_is_idempotent() {
        let live =
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "K", "metadata": {"name": "x"}});
        let cfg = json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "K", "metadata": {"name": "x"}, "spec": {"a": 1, "b": {"c": "d"}}});
        let once = apply(&live, &cfg, "m", false, None, &none()).unwrap();
        let twice = apply(&once, &cfg, "m", false, None, &none()).unwrap();
        assert_eq!(once, twice);
        assert_eq!(once["spec"], json!({"a": 1, "b": {"c": "d"}}));
        assert_eq!(read_entries(&once).len(), 1);
    }

    #[test]
    fn conflicts_and_force() {
        let live = json!({"metadata": {"name": "x"}});
        let a = apply(
            &live,
            &json!({"spec": {"a": 1, "b": 2}}),
            "alice",
            false,
            None,
            &none(),
        )
        .unwrap();
        // same value: shared ownership, no conflict
        let shared = apply(&a, &json!({"spec": {"a": 1}}), "bob", false, None, &none()).unwrap();
        assert_eq!(read_entries(&shared).len(), 2);
        // different value: conflict
        let err = apply(&a, &json!({"spec": {"a": 5}}), "bob", false, None, &none()).unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "alice".into(),
                path: p("spec.a")
            }]
        );
        // force takes it over
        let forced = apply(&a, &json!({"spec": {"a": 5}}), "bob", true, None, &none()).unwrap();
        assert_eq!(forced["spec"], json!({"a": 5, "b": 2}));
        let entries = read_entries(&forced);
        let alice = entries.iter().find(|e| e.manager == "alice").unwrap();
        assert_eq!(alice.fields, [p("spec.b")].into_iter().collect());
    }

    #[test]
    fn dropped_fields_are_removed_unless_shared() {
        let live = json!({"metadata": {"name": "x"}});
        let a = apply(
            &live,
            &json!({"spec": {"a": 1, "b": 2, "c": 3}}),
            "alice",
            false,
            None,
            &none(),
        )
        .unwrap();
        let b = apply(&a, &json!({"spec": {"c": 3}}), "bob", false, None, &none()).unwrap();
        let a2 = apply(
            &b,
            &json!({"spec": {"a": 1}}),
            "alice",
            false,
            None,
            &none(),
        )
        .unwrap();
        // b removed (nobody owns it), c kept (bob owns it)
        assert_eq!(a2["spec"], json!({"a": 1, "c": 3}));
    }

    #[test]
    fn update_takes_ownership() {
        let live = json!({"metadata": {"name": "x"}});
        let a = apply(
            &live,
            &json!({"spec": {"a": 1, "b": 2}}),
            "alice",
            false,
            None,
            &none(),
        )
        .unwrap();
        let mut edited = a.clone();
        edited["spec"]["a"] = json!(9);
        record_update(Some(&a), &mut edited, "kubectl-edit", None, &none());
        let entries = read_entries(&edited);
        let alice = entries.iter().find(|e| e.manager == "alice").unwrap();
        assert_eq!(alice.fields, [p("spec.b")].into_iter().collect());
        let ed = entries
            .iter()
            .find(|e| e.manager == "kubectl-edit")
            .unwrap();
        assert_eq!(ed.fields, [p("spec.a")].into_iter().collect());
        // alice re-applying a=1 now conflicts with kubectl-edit
        assert!(apply(
            &edited,
            &json!({"spec": {"a": 1, "b": 2}}),
            "alice",
            false,
            None,
            &none()
        )
        .is_err());
    }

    #[test]
    fn list_maps_merge_by_key() {
        let schema = json!({
            "type": "object",
            "properties": {"spec": {"$ref": "#/$defs/Spec"}},
            "$defs": {"Spec": {"type": "object", "properties": {"tasks": {
                "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}, "cmd": {"type": "string"}}}
            }}}}
        });
        let lists = ListMaps::from_schema(&schema);
        let live = json!({"metadata": {"name": "d"}});
        let a = apply(
            &live,
            &json!({"spec": {"tasks": [{"name": "a", "cmd": "x"}]}}),
            "alice",
            false,
            None,
            &lists,
        )
        .unwrap();
        let b = apply(
            &a,
            &json!({"spec": {"tasks": [{"name": "b", "cmd": "y"}]}}),
            "bob",
            false,
            None,
            &lists,
        )
        .unwrap();
        assert_eq!(
            b["spec"]["tasks"],
            json!([{"name": "a", "cmd": "x"}, {"name": "b", "cmd": "y"}])
        );
        let entries = read_entries(&b);
        let bob = entries.iter().find(|e| e.manager == "bob").unwrap();
        assert!(
            to_fields_v1(&bob.fields)["f:spec"]["f:tasks"]["k:{\"name\":\"b\"}"]["f:cmd"]
                .is_object()
        );
        // bob changing alice's item conflicts on that item only
        let err = apply(
            &b,
            &json!({"spec": {"tasks": [{"name": "a", "cmd": "z"}, {"name": "b", "cmd": "y"}]}}),
            "bob",
            false,
            None,
            &lists,
        )
        .unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(
            path_string(&err[0].path),
            ".spec.tasks[{\"name\":\"a\"}].cmd"
        );
        // alice dropping her item removes it, bob's stays
        let a2 = apply(
            &b,
            &json!({"metadata": {"name": "d"}}),
            "alice",
            false,
            None,
            &lists,
        )
        .unwrap();
        assert_eq!(a2["spec"]["tasks"], json!([{"name": "b", "cmd": "y"}]));
        // idempotent
        assert_eq!(
            apply(
                &a2,
                &json!({"spec": {"tasks": [{"name": "b", "cmd": "y"}]}}),
                "bob",
                false,
                None,
                &lists
            )
            .unwrap(),
            a2
        );
    }

    fn arb_spec() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z]{0,4}".prop_map(|s| json!(s)),
            proptest::collection::vec(any::<u8>(), 0..3).prop_map(|v| json!(v)),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            proptest::collection::btree_map("[a-c]{1,2}", inner, 1..4).prop_map(|m| json!(m))
        })
    }

    proptest::proptest! {
        #[test]
        fn apply_is_idempotent_and_sets_every_leaf(spec in arb_spec(), other in arb_spec()) {
            let live = json!({"metadata": {"name": "x"}, "spec": {"seed": other}});
            let cfg = json!({"metadata": {"name": "x"}, "spec": {"mine": spec}});
            let once = apply(&live, &cfg, "m", false, None, &none()).unwrap();
            let twice = apply(&once, &cfg, "m", false, None, &none()).unwrap();
            proptest::prop_assert_eq!(&once, &twice);
            for p in field_set(&cfg, None, &none()) {
                proptest::prop_assert_eq!(get_path(&once, &p), get_path(&cfg, &p));
            }
            // the unmanaged part is untouched
            proptest::prop_assert_eq!(&once["spec"]["seed"], &live["spec"]["seed"]);
            // and withdrawing everything removes exactly what was applied
            let gone = apply(&once, &json!({"metadata": {"name": "x"}}), "m", false, None, &none()).unwrap();
            proptest::prop_assert!(gone["spec"].get("mine").is_none());
            proptest::prop_assert_eq!(&gone["spec"]["seed"], &live["spec"]["seed"]);
        }
    }
}
