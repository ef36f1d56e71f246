//! Object plumbing shared by the verbs: keys, (de)serialisation, metadata helpers.

use bytes::Bytes;
use lattice_apis::KindInfo;
use lattice_store::KeyValue;
use serde_json::{Map, Value};

use crate::registry::errors::{ApiError, ApiResult};

pub const GROUP: &str = "lattice.dev";
pub const REGISTRY_PREFIX: &str = "/registry/lattice.dev/";

/// Which objects a request addresses.
#[derive(Debug, Clone)]
pub struct Scope {
    pub kind: &'static KindInfo,
    /// Tenant; `None` for cluster-scoped kinds and cross-tenant lists.
    pub namespace: Option<String>,
}

pub fn object_key(kind: &KindInfo, ns: Option<&str>, name: &str) -> Bytes {
    match (kind.namespaced, ns) {
        (true, Some(ns)) => Bytes::from(format!("{REGISTRY_PREFIX}{}/{ns}/{name}", kind.plural)),
        _ => Bytes::from(format!("{REGISTRY_PREFIX}{}/{name}", kind.plural)),
    }
}

/// Prefix of every key of a kind, or of one tenant's keys.
pub fn list_prefix(kind: &KindInfo, ns: Option<&str>) -> Bytes {
    match (kind.namespaced, ns) {
        (true, Some(ns)) => Bytes::from(format!("{REGISTRY_PREFIX}{}/{ns}/", kind.plural)),
        _ => Bytes::from(format!("{REGISTRY_PREFIX}{}/", kind.plural)),
    }
}

/// Decode a stored value and stamp `metadata.resourceVersion`.
pub fn decode(value: &[u8], rv: i64) -> ApiResult<Value> {
    let mut obj: Value = serde_json::from_slice(value)
        .map_err(|e| ApiError::internal(format!("stored object is not valid JSON: {e}")))?;
    set_rv(&mut obj, rv);
    Ok(obj)
}

pub fn decode_kv(kv: &KeyValue) -> ApiResult<Value> {
    decode(&kv.value, kv.mod_revision)
}

/// Serialise for storage: the object without `metadata.resourceVersion` (written
/// around it, not from a copy: stored objects can be a megabyte).
pub fn encode(obj: &Value) -> ApiResult<Bytes> {
    let bytes = serde_json::to_vec(&WithoutRv(obj))
        .map_err(|e| ApiError::internal(format!("cannot encode object: {e}")))?;
    // The store keeps these bytes in memory for as long as the version is retained, and
    // `Bytes::from(Vec)` keeps the whole buffer the serializer grew (a 2.3 KB object in
    // 4 KB; `shrink_to_fit` leaves the allocator's block as it is): a copy of exactly
    // the object's length.
    Ok(Bytes::copy_from_slice(&bytes))
}

/// An object serialised without `metadata.resourceVersion`.
struct WithoutRv<'a>(&'a Value);

impl serde::Serialize for WithoutRv<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Value::Object(top) = self.0 else {
            return self.0.serialize(s);
        };
        let mut map = s.serialize_map(Some(top.len()))?;
        for (k, v) in top {
            match v {
                Value::Object(meta) if k == "metadata" => {
                    map.serialize_entry(k, &MetaWithoutRv(meta))?
                }
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

struct MetaWithoutRv<'a>(&'a Map<String, Value>);

impl serde::Serialize for MetaWithoutRv<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let n = self.0.len() - usize::from(self.0.contains_key("resourceVersion"));
        let mut map = s.serialize_map(Some(n))?;
        for (k, v) in self.0 {
            if k != "resourceVersion" {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// Equality of JSON as stored: unlike `Value`'s `==`, it tells `0.0` from `-0.0`, which
/// serialise differently.
pub fn identical(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y && x.as_f64().map(f64::to_bits) == y.as_f64().map(f64::to_bits)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| identical(v, w))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| identical(v, w)))
        }
        _ => a == b,
    }
}

/// Whether two objects are the same but for `metadata.resourceVersion` (what
/// comparing their [`encode`]d forms says, without encoding either).
pub fn same_but_rv(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| match y.get(k) {
                    Some(w) if k == "metadata" => {
                        same_except(v, w, &["resourceVersion"], identical)
                    }
                    Some(w) => identical(v, w),
                    None => false,
                })
        }
        _ => identical(a, b),
    }
}

/// Whether two objects have the same spec part (all but metadata, status, apiVersion
/// and kind), compared in place.
pub fn same_spec(a: &Value, b: &Value) -> bool {
    same_except(
        a,
        b,
        &["metadata", "status", "apiVersion", "kind"],
        |v, w| v == w,
    )
}

/// Whether two values are equal by `eq` once the fields `skip` are removed from both
/// (when they are objects).
fn same_except(a: &Value, b: &Value, skip: &[&str], eq: fn(&Value, &Value) -> bool) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let kept =
                |m: &Map<String, Value>| m.keys().filter(|k| !skip.contains(&k.as_str())).count();
            kept(x) == kept(y)
                && x.iter()
                    .all(|(k, v)| skip.contains(&k.as_str()) || y.get(k).is_some_and(|w| eq(v, w)))
        }
        _ => eq(a, b),
    }
}

pub fn set_rv(obj: &mut Value, rv: i64) {
    if let Some(m) = meta_mut(obj) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// `metadata` as a mutable map (created when missing on an object).
pub fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let o = obj.as_object_mut()?;
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut()
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub fn rv_of(obj: &Value) -> Option<&str> {
    meta_str(obj, "resourceVersion").filter(|s| !s.is_empty())
}

pub fn parse_rv(s: &str) -> ApiResult<i64> {
    s.parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
        ApiError::bad_request(format!(
            "invalid resourceVersion {s:?}: must be a non-negative integer"
        ))
    })
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Convert a body to JSON from JSON or YAML.
pub fn parse_body(body: &[u8], content_type: &str) -> ApiResult<Value> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    // Bounded: aliases and nesting cannot make the value outgrow the body (413 / 400).
    crate::registry::parse::value(
        body,
        crate::registry::parse::Format::of_content_type(content_type),
    )
    .map_err(crate::registry::parse::BodyError::into_default_api)
}

/// Run the kind's admission (strict parse, defaults, validation), as a 422 on failure.
pub fn admit(kind: &KindInfo, obj: Value) -> ApiResult<Value> {
    let name = name_of(&obj).to_string();
    let rv = rv_of(&obj).map(String::from);
    let mut o = obj;
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    match (kind.admit)(o) {
        Ok(mut v) => {
            if let Some(rv) = rv {
                if let Some(m) = meta_mut(&mut v) {
                    m.insert("resourceVersion".into(), Value::String(rv));
                }
            }
            Ok(v)
        }
        Err(errs) => Err(ApiError::invalid(
            kind.kind,
            &name,
            errs.0.into_iter().map(|e| (e.path, e.message)).collect(),
        )),
    }
}

/// The kind served under `plural` (`allocations`, `vclusters`, ...).
pub fn kind_by_plural(plural: &str) -> Option<&'static lattice_apis::KindInfo> {
    lattice_apis::kinds().iter().find(|k| k.plural == plural)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn in_place_comparisons_agree_with_the_stored_forms() {
        let a = json!({"apiVersion": "v", "kind": "K",
            "metadata": {"name": "x", "resourceVersion": "5"},
            "spec": {"x": 0.0, "l": [1, 2]}, "status": {"p": 1}});
        // encode drops metadata.resourceVersion and nothing else.
        let stored: Value = serde_json::from_slice(&encode(&a).unwrap()).unwrap();
        let mut expect = a.clone();
        expect["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        assert_eq!(stored, expect);

        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("9");
        assert!(same_but_rv(&a, &b));
        assert_eq!(encode(&a).unwrap(), encode(&b).unwrap());
        // -0.0 == 0.0 as values, but not as stored text.
        let mut c = a.clone();
        c["spec"]["x"] = json!(-0.0);
        assert!(!same_but_rv(&a, &c));
        assert_ne!(encode(&a).unwrap(), encode(&c).unwrap());
        assert!(
            same_spec(&a, &c),
            "the generation compares values, as before"
        );
        let mut d = a.clone();
        d["status"]["p"] = json!(2);
        assert!(same_spec(&a, &d) && !same_but_rv(&a, &d));
        let mut e = a.clone();
        e["spec"]["l"] = json!([1]);
        assert!(!same_spec(&a, &e));
        let mut f = a.clone();
        f["metadata"]["labels"] = json!({"k": "v"});
        assert!(same_spec(&a, &f) && !same_but_rv(&a, &f));
    }
}
