//! Bounded parsing of request bodies: every JSON or YAML body the server reads becomes a
//! [`serde_json::Value`] through [`value`], which stops building the moment the value
//! would grow past a budget proportional to the body, or nest deeper than [`MAX_DEPTH`].
//!
//! Why: the body limit (`ApiConfig::max_body_bytes`) bounds what a client sends, not what
//! the server builds from it. YAML aliases replay an anchored node wherever they appear,
//! so ten nested levels of ten aliases each ("billion laughs") describe 10⁹ nodes in a
//! few hundred bytes. serde_yaml caps the number of alias jumps (100 × the document's
//! events) but not what each jump replays: a 200 KB anchored list referenced 200,000
//! times passes that cap and describes 4·10¹⁰ nodes. The builder here counts what it
//! builds (see [`Budget`]) and refuses such a body with 413 as soon as the budget is
//! spent, so the memory a body costs is bounded by its size, whatever its shape.
//!
//! What is counted: every value costs [`NODE_COST`] bytes (a `Value` is 32), every map
//! entry [`ENTRY_COST`] more (its key and its slot in the map), and every string its
//! length. The budget is [`EXPANSION`] times the body's size, at least [`BUDGET_FLOOR`]:
//! an ordinary manifest costs 2-5 times its size under this measure (the examples in
//! `manifests/examples`, as YAML and as compact JSON: at most 4.5), a document without
//! aliases up to about 33 times (a YAML flow map of one-letter keys
//! with no values, `{a, b, c}`), so only bodies built to be expanded reach it.
//!
//! Nesting: JSON and YAML both nest without a bound in their grammar; serde_json and
//! serde_yaml stop at 128 levels (their recursion limits). [`MAX_DEPTH`] stops earlier,
//! with a message that names the limit: no Lattice object nests half as deep, and every
//! later step over the value (admission, merge patches, apply, drop) recurses over it.
//!
//! YAML is not read with serde_yaml: its loader turns the whole document into a list of
//! events before anything is built, about 170 bytes per event, and an event can be a
//! single byte of input (`[[[[`, `- - - -`), so a 1 MB body held 170 MB before any check
//! could run. [`yaml`] pulls events one at a time from a streaming parser (yaml-rust2)
//! and builds the value as they come, with the same budget, so what a YAML body costs
//! is the value it builds and a parser state that the depth limit keeps small. Plain
//! scalars are typed as serde_yaml types them (YAML 1.2's core schema), so a manifest
//! means what it meant before.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::registry::errors::ApiError;

mod yaml;

/// Deepest nesting of arrays and objects accepted in a body.
pub const MAX_DEPTH: usize = 64;
/// A body may build a value of at most this many times its size (see the module docs).
pub const EXPANSION: usize = 8;
/// ... and at least this many bytes whatever its size (small bodies).
pub const BUDGET_FLOOR: usize = 1 << 20;
/// What one value costs (the size of a `serde_json::Value`).
pub const NODE_COST: usize = std::mem::size_of::<Value>();
/// What one map entry costs beyond its value and the bytes of its key: the key's
/// `String` and the entry's share of the map's node.
pub const ENTRY_COST: usize = 32;

/// The budget of a body of `len` bytes.
pub fn budget_for(len: usize) -> usize {
    len.saturating_mul(EXPANSION).max(BUDGET_FLOOR)
}

/// The format of a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    /// YAML (a superset of JSON: server-side apply bodies are read as YAML).
    Yaml,
}

impl Format {
    /// The format a `Content-Type` names: YAML when it says so, else JSON.
    pub fn of_content_type(content_type: &str) -> Self {
        if content_type.to_ascii_lowercase().contains("yaml") {
            Format::Yaml
        } else {
            Format::Json
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
        }
    }
}

/// Why a body was not turned into a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Not valid JSON/YAML (or a YAML construct a JSON value cannot hold, such as a tag).
    Syntax { format: Format, message: String },
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Would build more than `budget` bytes (a body of `body_bytes`).
    TooLarge { body_bytes: usize, budget: usize },
}

impl BodyError {
    /// The API's answer: 400 for syntax and depth (the message from `syntax` for the
    /// former), 413 for an expansion past the budget.
    pub fn into_api(self, syntax: impl FnOnce(&str) -> String) -> ApiError {
        match self {
            BodyError::Syntax { message, .. } => ApiError::bad_request(syntax(&message)),
            BodyError::TooDeep => ApiError::bad_request(format!(
                "the body nests arrays and objects deeper than {MAX_DEPTH} levels, the limit"
            )),
            BodyError::TooLarge { body_bytes, budget } => ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!(
                    "the body ({body_bytes} bytes) expands to more than {budget} bytes when \
                     parsed, the limit ({EXPANSION} times its size, at least {BUDGET_FLOOR}); \
                     YAML aliases (*name) that repeat large anchored nodes are the usual cause: \
                     write the repeated parts out, or send JSON"
                ),
            ),
        }
    }

    /// The API's answer with the default syntax message ("the body is not valid JSON: ...").
    pub fn into_default_api(self) -> ApiError {
        let format = match &self {
            BodyError::Syntax { format, .. } => format.name(),
            _ => "",
        };
        self.into_api(|m| format!("the body is not valid {format}: {m}"))
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.clone().into_default_api().message)
    }
}

/// Parse `body` as `format` into a value, within the budget of its size and
/// [`MAX_DEPTH`].
pub fn value(body: &[u8], format: Format) -> Result<Value, BodyError> {
    value_within(body, format, budget_for(body.len()))
}

/// [`value`] with an explicit budget in bytes (tests).
pub fn value_within(body: &[u8], format: Format, budget: usize) -> Result<Value, BodyError> {
    let mut b = Budget {
        left: budget,
        depth: 0,
        stop: None,
    };
    let parsed = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_slice(body);
            Node(&mut b)
                .deserialize(&mut de)
                .and_then(|v| de.end().map(|()| v))
                .map_err(|e| e.to_string())
        }
        Format::Yaml => yaml::build(body, &mut b),
    };
    match (parsed, b.stop) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(Stop::Depth)) => Err(BodyError::TooDeep),
        (Err(_), Some(Stop::Budget)) => Err(BodyError::TooLarge {
            body_bytes: body.len(),
            budget,
        }),
        (Err(message), None) => Err(BodyError::Syntax { format, message }),
    }
}

/// A JSON body as a value (see [`value`]), with the default messages.
pub fn json(body: &[u8]) -> Result<Value, ApiError> {
    value(body, Format::Json).map_err(BodyError::into_default_api)
}

/// A JSON body as a `T`, through a bounded value (see [`value`]); `invalid` words the
/// 400 for a body that is not JSON or not a `T`.
pub fn json_as<T: serde::de::DeserializeOwned>(
    body: &[u8],
    invalid: impl Fn(&str) -> String,
) -> Result<T, ApiError> {
    let v = value(body, Format::Json).map_err(|e| e.into_api(&invalid))?;
    serde_json::from_value(v).map_err(|e| ApiError::bad_request(invalid(&e.to_string())))
}

/// What is left to build, and how deep the builder is.
#[derive(Debug)]
struct Budget {
    left: usize,
    depth: usize,
    /// Why the builder stopped, when it was its own limit (not the body's syntax).
    stop: Option<Stop>,
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    Depth,
    Budget,
}

impl Budget {
    /// Take `bytes` from the budget; false (and the builder must stop) when it has not
    /// that much left.
    fn take(&mut self, bytes: usize) -> bool {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                true
            }
            None => {
                self.stop = Some(Stop::Budget);
                false
            }
        }
    }

    /// Whether a node may nest `levels` deeper than the builder is now; records the stop
    /// when not.
    fn fits(&mut self, levels: usize) -> bool {
        if self.depth.saturating_add(levels) > MAX_DEPTH {
            self.stop = Some(Stop::Depth);
            return false;
        }
        true
    }

    fn spend<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        if self.take(bytes) {
            Ok(())
        } else {
            Err(E::custom("the body expands past its budget"))
        }
    }

    fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        if !self.fits(1) {
            return Err(E::custom("the body nests too deep"));
        }
        self.depth += 1;
        Ok(())
    }
}

/// One value, built by deserializing it (the seed of the whole body and of every
/// element and entry in it).
struct Node<'a>(&'a mut Budget);

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.spend(NODE_COST)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.spend(NODE_COST)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.spend(NODE_COST)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.spend(NODE_COST)?;
        // As serde_json's own Value: a non-finite float (YAML's .nan, .inf) is null.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.spend(NODE_COST.saturating_add(v.len()))?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.0.spend(NODE_COST.saturating_add(v.len()))?;
        Ok(Value::String(v))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.0.spend(NODE_COST)?;
        Ok(Value::Null)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.visit_none()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Node(self.0).deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let b = self.0;
        b.spend(NODE_COST)?;
        b.enter()?;
        // The hint is the parser's claim, not a promise: capped so that it cannot reserve
        // more than the budget allows.
        let hint = seq.size_hint().unwrap_or(0).min(b.left / NODE_COST);
        let mut out = Vec::with_capacity(hint.min(4096));
        while let Some(v) = seq.next_element_seed(Node(&mut *b))? {
            out.push(v);
        }
        b.depth -= 1;
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let b = self.0;
        b.spend(NODE_COST)?;
        b.enter()?;
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(Key(&mut *b))? {
            let v = map.next_value_seed(Node(&mut *b))?;
            out.insert(k, v);
        }
        b.depth -= 1;
        Ok(Value::Object(out))
    }
}

/// A map key: a string (YAML scalars of other types are taken as written, as serde_json
/// takes them from serde_yaml).
struct Key<'a>(&'a mut Budget);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.spend(ENTRY_COST.saturating_add(v.len()))?;
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        self.0.spend(ENTRY_COST.saturating_add(v.len()))?;
        Ok(v)
    }
}

/// What the builders count for `v` (for tests).
#[cfg(test)]
fn tests_cost(v: &Value) -> usize {
    tests::cost(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What [`value`] counts for `v` (the same measure, computed over the result).
    pub(super) fn cost(v: &Value) -> usize {
        NODE_COST
            + match v {
                Value::String(s) => s.len(),
                Value::Array(a) => a.iter().map(cost).sum(),
                Value::Object(m) => m.iter().map(|(k, v)| ENTRY_COST + k.len() + cost(v)).sum(),
                _ => 0,
            }
    }

    #[test]
    fn parses_what_serde_parses() {
        let docs: [(&str, Format); 6] = [
            (
                r#"{"a": [1, -2, 3.5, true, null, "x"], "b": {"c": {}}}"#,
                Format::Json,
            ),
            ("a: [1, -2, 3.5, true, null, x]\nb: {c: {}}\n", Format::Yaml),
            ("a: &x {k: v}\nb: *x\n", Format::Yaml),
            ("1: one\ntrue: yes\n", Format::Yaml),
            ("n: .nan\n", Format::Yaml),
            ("[]", Format::Json),
        ];
        for (doc, f) in docs {
            let want: Value = match f {
                Format::Json => serde_json::from_str(doc).unwrap(),
                Format::Yaml => serde_yaml::from_str(doc).unwrap(),
            };
            let got = value(doc.as_bytes(), f).unwrap();
            assert_eq!(got, want, "{doc}");
            assert!(cost(&got) <= BUDGET_FLOOR);
        }
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = value(b"{\"a\": ", Format::Json).unwrap_err();
        assert!(matches!(&e, BodyError::Syntax { message, .. } if message.contains("line 1")));
        let api = e.into_default_api();
        assert_eq!(api.code, 400);
        assert!(
            api.message.starts_with("the body is not valid JSON"),
            "{}",
            api.message
        );
        let e = value(b"a: [", Format::Yaml).unwrap_err();
        assert!(e.into_default_api().message.contains("not valid YAML"));
        // Trailing garbage after a JSON value.
        assert!(value(b"{} x", Format::Json).is_err());
        // A second YAML document.
        assert!(value(b"a: 1\n---\nb: 2\n", Format::Yaml).is_err());
    }

    #[test]
    fn the_budget_is_exact_on_its_own_measure() {
        let v = json!({"metadata": {"name": "n", "labels": {"a": "b"}}, "spec": [1, "xy", null]});
        let body = serde_json::to_vec(&v).unwrap();
        let c = cost(&v);
        assert_eq!(value_within(&body, Format::Json, c).unwrap(), v);
        assert_eq!(
            value_within(&body, Format::Json, c - 1).unwrap_err(),
            BodyError::TooLarge {
                body_bytes: body.len(),
                budget: c - 1
            }
        );
    }

    #[test]
    fn depth_is_bounded() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        value(ok.as_bytes(), Format::Json).unwrap();
        for f in [Format::Json, Format::Yaml] {
            let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
            let e = value(deep.as_bytes(), f).unwrap_err();
            assert_eq!(e, BodyError::TooDeep, "{f:?}");
            let api = e.into_default_api();
            assert_eq!(api.code, 400);
            assert!(
                api.message.contains("deeper than 64 levels"),
                "{}",
                api.message
            );
        }
        // Far past the parsers' own limits: refused at once, by ours.
        let deep = "{\"a\":".repeat(100_000);
        assert_eq!(
            value(deep.as_bytes(), Format::Json).unwrap_err(),
            BodyError::TooDeep
        );
        let deep = "- ".repeat(10_000);
        assert_eq!(
            value(deep.as_bytes(), Format::Yaml).unwrap_err(),
            BodyError::TooDeep
        );
        let deep = "[".repeat(100_000);
        assert_eq!(
            value(deep.as_bytes(), Format::Yaml).unwrap_err(),
            BodyError::TooDeep
        );
        let deep = "{a: ".repeat(100_000);
        assert_eq!(
            value(deep.as_bytes(), Format::Yaml).unwrap_err(),
            BodyError::TooDeep
        );
    }

    #[test]
    fn alias_bombs_stop_at_the_budget() {
        // Classic billion laughs: 9 levels of 10 aliases each.
        let mut doc = String::from("a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 10].join(",");
            doc.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        let e = value(doc.as_bytes(), Format::Yaml).unwrap_err();
        assert!(
            matches!(e, BodyError::Syntax { .. } | BodyError::TooLarge { .. }),
            "{e:?}"
        );
        // Few alias jumps, each a large node: within serde_yaml's jump limit, past ours.
        let wide: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
        let mut doc = format!("big: &big [{}]\nrefs: [", wide.join(","));
        doc.push_str(&vec!["*big"; 2_000].join(","));
        doc.push_str("]\n");
        let e = value(doc.as_bytes(), Format::Yaml).unwrap_err();
        assert!(matches!(e, BodyError::TooLarge { .. }), "{e:?}");
        let api = e.into_default_api();
        assert_eq!(api.code, 413);
        assert!(api.message.contains("aliases"), "{}", api.message);
    }

    #[test]
    fn manifests_cost_a_few_times_their_size() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/examples");
        let mut worst = 0.0f64;
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let Ok(v) = <Value as serde::Deserialize>::deserialize(doc) else {
                    continue;
                };
                let yaml = serde_yaml::to_string(&v).unwrap();
                let json = serde_json::to_string(&v).unwrap();
                for (body, f) in [
                    (yaml.as_bytes(), Format::Yaml),
                    (json.as_bytes(), Format::Json),
                ] {
                    let got = value(body, f).unwrap();
                    let ratio = cost(&got) as f64 / body.len() as f64;
                    worst = worst.max(ratio);
                    n += 1;
                }
            }
        }
        assert!(n > 10, "read {n} manifests from {}", dir.display());
        assert!(
            worst * 1.5 < EXPANSION as f64,
            "a manifest costs {worst:.1}× its size"
        );
    }
}
