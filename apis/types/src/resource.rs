//! The [`Resource`] trait every kind implements, and the generic admission
//! pipeline: strict parse → defaulting → validation → normalized JSON.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::meta::ObjectMeta;
use crate::registry::API_VERSION;
use crate::validation::{Errors, FieldError, ValidationErrors};

/// A Lattice resource kind.
pub trait Resource:
    Serialize + DeserializeOwned + JsonSchema + Clone + std::fmt::Debug + PartialEq
{
    /// `Allocation`, `Dag`, ...
    const KIND: &'static str;
    /// URL path segment, e.g. `allocations`.
    const PLURAL: &'static str;
    /// True when `metadata.namespace` (the tenant) is required.
    const NAMESPACED: bool;

    /// Object metadata.
    fn metadata(&self) -> &ObjectMeta;
    /// Mutable object metadata.
    fn metadata_mut(&mut self) -> &mut ObjectMeta;
    /// `apiVersion` as parsed (may be empty before defaulting).
    fn api_version(&self) -> &str;
    /// `kind` as parsed (may be empty before defaulting).
    fn kind(&self) -> &str;
    /// Set `apiVersion` and `kind` to this kind's values where they are empty.
    fn fill_type_meta(&mut self);

    /// Fill in defaults (idempotent).
    fn default_fields(&mut self) {}

    /// Kind-specific validation of spec and status (metadata is checked by [`validate`](Resource::validate)).
    fn validate_fields(&self, _errs: &mut Errors) {}

    /// Full validation: type meta, metadata, then kind-specific rules.
    fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = Errors::default();
        if self.api_version() != API_VERSION {
            errs.push(
                "apiVersion",
                format!(
                    "must be {API_VERSION:?}, got {:?}; set apiVersion: {API_VERSION}",
                    crate::validation::truncate(self.api_version(), 60)
                ),
            );
        }
        if self.kind() != Self::KIND {
            errs.push(
                "kind",
                format!(
                    "must be {:?} for this resource, got {:?}",
                    Self::KIND,
                    crate::validation::truncate(self.kind(), 60)
                ),
            );
        }
        self.metadata()
            .validate(Self::NAMESPACED, Self::KIND, &mut errs);
        self.validate_fields(&mut errs);
        errs.into_result()
    }
}

/// Strict parse of a whole object, with errors that name the field path.
pub fn parse_strict<T: Resource>(value: serde_json::Value) -> Result<T, ValidationErrors> {
    if !value.is_object() {
        return Err(ValidationErrors::single(
            "<root>",
            format!(
                "expected an object (a {} manifest with apiVersion, kind, metadata and spec), got {}",
                T::KIND,
                json_type_name(&value)
            ),
        ));
    }
    if let Some(path) = too_deep(&value, MAX_DEPTH) {
        return Err(ValidationErrors::single(
            path,
            format!("is nested more than {MAX_DEPTH} levels deep; no Lattice field is, so flatten or remove it"),
        ));
    }
    // Valid objects (nearly all) take the plain parse; only a failing one is parsed again
    // with the path tracking that names the field (which costs an owned segment per
    // field visited, a measurable part of a create).
    match T::deserialize(&value) {
        Ok(obj) => Ok(obj),
        Err(_) => serde_path_to_error::deserialize::<_, T>(value).map_err(|e| serde_error(&e)),
    }
}

/// Deepest nesting accepted in an object (the deepest real field is about 10 levels).
pub const MAX_DEPTH: usize = 64;

/// Path of the first value nested deeper than `max`, found without recursion
/// (so a hostile document cannot overflow the stack here). Paths are only built once a
/// document turned out too deep: a valid one costs a walk, no allocation per value.
fn too_deep(root: &serde_json::Value, max: usize) -> Option<String> {
    let mut stack: Vec<(&serde_json::Value, usize)> = vec![(root, 0)];
    let mut deep = false;
    while let Some((v, depth)) = stack.pop() {
        if depth > max {
            deep = true;
            break;
        }
        let nested = |c: &&serde_json::Value| c.is_array() || c.is_object();
        match v {
            serde_json::Value::Array(items) => {
                stack.extend(items.iter().filter(nested).map(|c| (c, depth + 1)))
            }
            serde_json::Value::Object(map) => {
                stack.extend(map.values().filter(nested).map(|c| (c, depth + 1)))
            }
            _ => {}
        }
    }
    if deep {
        too_deep_path(root, max)
    } else {
        None
    }
}

/// [`too_deep`]'s second pass: the path of the first value nested deeper than `max`.
fn too_deep_path(root: &serde_json::Value, max: usize) -> Option<String> {
    let mut stack: Vec<(&serde_json::Value, usize, String)> = vec![(root, 0, String::new())];
    while let Some((v, depth, path)) = stack.pop() {
        if depth > max {
            let p = if path.len() > 200 {
                format!(
                    "{}…",
                    &path[..path
                        .char_indices()
                        .take_while(|(i, _)| *i < 200)
                        .last()
                        .map_or(0, |(i, _)| i)]
                )
            } else {
                path
            };
            return Some(if p.is_empty() {
                "<root>".to_string()
            } else {
                p
            });
        }
        match v {
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if item.is_array() || item.is_object() {
                        stack.push((item, depth + 1, format!("{path}[{i}]")));
                    }
                }
            }
            serde_json::Value::Object(map) => {
                for (k, item) in map {
                    if item.is_array() || item.is_object() {
                        let p = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        stack.push((item, depth + 1, p));
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// Parse, default, validate, and return the typed object.
pub fn admit_typed<T: Resource>(value: serde_json::Value) -> Result<T, ValidationErrors> {
    let mut obj: T = parse_strict(value)?;
    // apiVersion/kind may be omitted (the URL says which kind); wrong values stay
    // and are reported by validation.
    obj.fill_type_meta();
    obj.default_fields();
    obj.validate()?;
    Ok(obj)
}

/// The registry's `admit` for kind `T`: normalized JSON of the admitted object.
pub fn admit_json<T: Resource>(
    value: serde_json::Value,
) -> Result<serde_json::Value, ValidationErrors> {
    let obj = admit_typed::<T>(value)?;
    serde_json::to_value(&obj)
        .map_err(|e| ValidationErrors::single("<root>", format!("cannot serialize: {e}")))
}

/// The registry's `schema` for kind `T`.
pub fn schema_json<T: Resource>() -> serde_json::Value {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<T>();
    serde_json::to_value(schema).unwrap_or(serde_json::Value::Null)
}

pub(crate) fn json_type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Turn a serde error (with its tracked path) into a [`FieldError`] that names
/// the exact field and says how to fix it.
pub(crate) fn serde_error(e: &serde_path_to_error::Error<serde_json::Error>) -> ValidationErrors {
    let mut path = e.path().to_string();
    if path == "." || path == "?" {
        path.clear();
    }
    let raw = e.inner().to_string();
    // serde_json appends " at line X column Y" only for text input; strip it anyway.
    let msg = match raw.find(" at line ") {
        Some(i) => raw[..i].to_string(),
        None => raw,
    };
    let (path, message) = if let Some(field) = between(&msg, "missing field `", "`") {
        (join(&path, field), format!("is required; add {field}"))
    } else if let Some(field) = between(&msg, "unknown field `", "`") {
        let allowed = msg
            .split_once(", expected ")
            .map(|(_, rest)| rest.replace("one of ", ""))
            .unwrap_or_default();
        let p = if path.ends_with(field) {
            path.clone()
        } else {
            join(&path, field)
        };
        let hint = if allowed.is_empty() {
            "remove it".to_string()
        } else {
            format!("remove it or fix the spelling; allowed fields here: {allowed}")
        };
        (p, format!("unknown field {field:?}; {hint}"))
    } else if let Some(variant) = between(&msg, "unknown variant `", "`") {
        let allowed = msg
            .split_once(", expected ")
            .map(|(_, rest)| rest.replace("one of ", ""))
            .unwrap_or_default();
        (
            path.clone(),
            format!(
                "{:?} is not an allowed value; use one of: {allowed}",
                crate::validation::truncate(variant, 60)
            ),
        )
    } else if msg.starts_with("invalid type")
        || msg.starts_with("invalid value")
        || msg.starts_with("invalid length")
    {
        (path.clone(), format!("{msg}; fix the value's type"))
    } else if CHRONO_ERRORS.iter().any(|c| msg.contains(c)) {
        (
            path.clone(),
            "is not an RFC 3339 timestamp; use e.g. \"2026-03-05T10:00:12Z\"".to_string(),
        )
    } else if msg.contains("recursion limit") {
        (
            path.clone(),
            "is nested too deeply; flatten the document".to_string(),
        )
    } else {
        (path.clone(), msg)
    };
    let path = if path.is_empty() {
        "<root>".to_string()
    } else {
        path
    };
    ValidationErrors(vec![FieldError::new(path, message)])
}

/// Messages of chrono's parse errors (timestamps in the wrong format).
const CHRONO_ERRORS: &[&str] = &[
    "input contains invalid characters",
    "premature end of input",
    "input is out of range",
    "trailing input",
    "input is not enough for unique date and time",
    "no possible date and time matching input",
    "bad or unsupported format string",
];

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let i = s.find(start)? + start.len();
    let j = s[i..].find(end)? + i;
    Some(&s[i..j])
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// Implements [`Resource`]'s boilerplate accessors for a kind struct with
/// `api_version`, `kind` and `metadata` fields.
macro_rules! impl_resource_meta {
    () => {
        fn metadata(&self) -> &$crate::meta::ObjectMeta {
            &self.metadata
        }
        fn metadata_mut(&mut self) -> &mut $crate::meta::ObjectMeta {
            &mut self.metadata
        }
        fn api_version(&self) -> &str {
            &self.api_version
        }
        fn kind(&self) -> &str {
            &self.kind
        }
        fn fill_type_meta(&mut self) {
            if self.api_version.is_empty() {
                self.api_version = $crate::registry::API_VERSION.to_string();
            }
            if self.kind.is_empty() {
                self.kind = <Self as $crate::resource::Resource>::KIND.to_string();
            }
        }
    };
}
pub(crate) use impl_resource_meta;
