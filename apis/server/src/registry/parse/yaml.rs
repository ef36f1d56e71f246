//! A YAML body to a JSON value, one parser event at a time (see the parent module for
//! why not serde_yaml), within the parent's [`Budget`].
//!
//! The value is the one serde_yaml gives for the same document: one document only;
//! mapping keys are strings (a scalar key as written); quoted and block scalars are
//! strings; plain scalars are typed by YAML 1.2's core schema as serde_yaml types them
//! (`~`/`null`/empty: null; `true`/`false` in three casings; decimal, `0x`, `0o`, `0b`
//! integers, a leading zero making a string; finite floats, `.inf`/`.nan` becoming
//! null as serde_json has no such numbers); an alias is a copy of its anchored node, paid
//! for in full. Tags (`!name`, `!!str`) are refused: no Lattice object uses them, and
//! serde_yaml made a local tag an error for JSON values too.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::TScalarStyle;

use super::{Budget, ENTRY_COST, NODE_COST};

/// A collection being built.
enum Frame {
    Seq {
        items: Vec<Value>,
        anchor: usize,
        /// Budget left when it started (its cost is the difference at its end).
        left_at_start: usize,
    },
    Map {
        map: Map<String, Value>,
        /// The key whose value comes next; `None`: a key comes next.
        key: Option<String>,
        anchor: usize,
        left_at_start: usize,
    },
}

/// An anchored node: its value, what it cost, and how deep it nests.
struct Anchored {
    value: Value,
    cost: usize,
    depth: usize,
}

/// Build the value of `body`; `Err` is the message of a syntax error, or a stop the
/// budget recorded.
pub(super) fn build(body: &[u8], b: &mut Budget) -> Result<Value, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("it is not UTF-8: {e}"))?;
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Anchored> = HashMap::new();
    let mut documents = 0usize;
    let mut root: Option<Value> = None;
    loop {
        let (event, mark) = parser.next_token().map_err(|e| {
            // The scanner looks ahead of the events and has a nesting limit of its own
            // (deeper than ours): the same refusal, said the same way.
            if e.info().contains("recursion limit") {
                b.stop = Some(super::Stop::Depth);
            }
            e.to_string()
        })?;
        let at = || format!("line {} column {}", mark.line(), mark.col() + 1);
        // A complete node to place in its parent (or at the root), with its anchor,
        // cost and depth.
        let done: Option<(Value, usize, usize, usize)> = match event {
            Event::StreamStart | Event::Nothing | Event::DocumentEnd => None,
            Event::StreamEnd => break,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(format!(
                        "more than one document (at {}); send one object per request",
                        at()
                    ));
                }
                None
            }
            Event::Scalar(v, style, anchor, tag) => {
                if tag.is_some() {
                    return Err(format!("YAML tags (!…) are not supported (at {})", at()));
                }
                if let Some(Frame::Map {
                    key: key @ None, ..
                }) = stack.last_mut()
                {
                    if !b.take(ENTRY_COST.saturating_add(v.len())) {
                        return Err("budget".into());
                    }
                    if anchor != 0 {
                        let cost = NODE_COST.saturating_add(v.len());
                        if !b.take(cost) {
                            return Err("budget".into());
                        }
                        let value = Value::String(v.clone());
                        anchors.insert(
                            anchor,
                            Anchored {
                                value,
                                cost,
                                depth: 0,
                            },
                        );
                    }
                    *key = Some(v);
                    continue;
                }
                let value = scalar(v, style).map_err(|e| format!("{e} (at {})", at()))?;
                let cost = NODE_COST + string_len(&value);
                if !b.take(cost) {
                    return Err("budget".into());
                }
                Some((value, anchor, cost, 0))
            }
            Event::SequenceStart(anchor, ref tag) | Event::MappingStart(anchor, ref tag) => {
                if tag.is_some() {
                    return Err(format!("YAML tags (!…) are not supported (at {})", at()));
                }
                if let Some(Frame::Map { key: None, .. }) = stack.last() {
                    return Err(format!(
                        "a mapping key must be a string, not a sequence or mapping (at {})",
                        at()
                    ));
                }
                b.depth = stack.len();
                if !b.fits(1) {
                    return Err("depth".into());
                }
                if !b.take(NODE_COST) {
                    return Err("budget".into());
                }
                let left_at_start = b.left + NODE_COST;
                stack.push(if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq {
                        items: Vec::new(),
                        anchor,
                        left_at_start,
                    }
                } else {
                    Frame::Map {
                        map: Map::new(),
                        key: None,
                        anchor,
                        left_at_start,
                    }
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let frame = stack.pop().ok_or("an end without a start")?;
                let (value, anchor, left_at_start) = match frame {
                    Frame::Seq {
                        items,
                        anchor,
                        left_at_start,
                    } => (Value::Array(items), anchor, left_at_start),
                    Frame::Map {
                        map,
                        key,
                        anchor,
                        left_at_start,
                    } => {
                        if key.is_some() {
                            return Err(format!("a mapping key without a value (at {})", at()));
                        }
                        (Value::Object(map), anchor, left_at_start)
                    }
                };
                // Only an anchored node's depth is needed (for its aliases).
                let d = if anchor != 0 { depth(&value) } else { 0 };
                Some((value, anchor, left_at_start.saturating_sub(b.left), d))
            }
            Event::Alias(id) => {
                let a = anchors
                    .get(&id)
                    .ok_or_else(|| format!("an alias of an unknown anchor (at {})", at()))?;
                if let Some(Frame::Map {
                    key: key @ None, ..
                }) = stack.last_mut()
                {
                    let Value::String(k) = &a.value else {
                        return Err(format!(
                            "a mapping key must be a string, and this alias is not one (at {})",
                            at()
                        ));
                    };
                    if !b.take(ENTRY_COST.saturating_add(k.len())) {
                        return Err("budget".into());
                    }
                    *key = Some(k.clone());
                    continue;
                }
                b.depth = stack.len();
                if !b.fits(a.depth) {
                    return Err("depth".into());
                }
                // The copy is paid for in full: this is where alias bombs stop.
                if !b.take(a.cost) {
                    return Err("budget".into());
                }
                Some((a.value.clone(), 0, a.cost, a.depth))
            }
        };
        let Some((value, anchor, cost, depth)) = done else {
            continue;
        };
        if anchor != 0 {
            // The anchor keeps a copy of its own, paid for as well.
            if !b.take(cost) {
                return Err("budget".into());
            }
            anchors.insert(
                anchor,
                Anchored {
                    value: value.clone(),
                    cost,
                    depth,
                },
            );
        }
        match stack.last_mut() {
            None => root = Some(value),
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { map, key, .. }) => {
                // A key is always set here: keys are taken above.
                let k = key.take().unwrap_or_default();
                map.insert(k, value);
            }
        }
    }
    // An empty document (only comments) is null, as serde_yaml reads it.
    Ok(root.unwrap_or(Value::Null))
}

/// How deep a value nests (a collection counts one level).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn string_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        _ => 0,
    }
}

/// A scalar's value: plain ones typed by the core schema, the others strings.
fn scalar(v: String, style: TScalarStyle) -> Result<Value, String> {
    if style != TScalarStyle::Plain {
        return Ok(Value::String(v));
    }
    if v.is_empty() || matches!(v.as_str(), "~" | "null" | "Null" | "NULL") {
        return Ok(Value::Null);
    }
    match v.as_str() {
        "true" | "True" | "TRUE" => return Ok(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Value::Bool(false)),
        _ => {}
    }
    match integer(&v) {
        Some(Integer::Unsigned(n)) => return Ok(Value::Number(n.into())),
        Some(Integer::Negative(n)) => return Ok(Value::Number(n.into())),
        Some(Integer::TooLarge) => {
            return Err(format!(
                "the integer {v} is out of range (a 64-bit integer is the largest accepted)"
            ))
        }
        None => {}
    }
    if !leading_zero_digits(&v) {
        if let Some(f) = float(&v) {
            return Ok(Number::from_f64(f).map_or(Value::Null, Value::Number));
        }
    }
    Ok(Value::String(v))
}

enum Integer {
    Unsigned(u64),
    Negative(i64),
    /// An integer wider than 64 bits (serde_json's values cannot hold it).
    TooLarge,
}

/// `0123`, `-007`: digits with a leading zero, which YAML 1.2 reads as a string.
fn leading_zero_digits(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    s.len() > 1 && s.starts_with('0') && s[1..].bytes().all(|b| b.is_ascii_digit())
}

/// The digits after a radix prefix, if `s` (sign removed) has one.
fn radix(s: &str) -> Option<(&str, u32)> {
    for (prefix, r) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(rest) = s.strip_prefix(prefix) {
            return (!rest.starts_with(['+', '-'])).then_some((rest, r));
        }
    }
    None
}

fn integer(s: &str) -> Option<Integer> {
    let (negative, unsigned) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if unsigned.starts_with(['+', '-']) || unsigned.is_empty() {
        return None;
    }
    let (digits, r) = match radix(unsigned) {
        Some(d) => d,
        None if leading_zero_digits(s) => return None,
        None => (unsigned, 10),
    };
    // Rust's parsers accept a leading sign; the sign was taken off above.
    if digits.starts_with(['+', '-']) || digits.is_empty() {
        return None;
    }
    let wide = u128::from_str_radix(digits, r).ok()?;
    Some(match (negative, u64::try_from(wide)) {
        (false, Ok(n)) => Integer::Unsigned(n),
        (true, _) => match i64::try_from(wide)
            .ok()
            .map(|n| -n)
            .or_else(|| (wide == 1u128 << 63).then_some(i64::MIN))
        {
            Some(n) => Integer::Negative(n),
            None => Integer::TooLarge,
        },
        (false, Err(_)) => Integer::TooLarge,
    })
}

fn float(s: &str) -> Option<f64> {
    let unsigned = match s.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => s,
    };
    match unsigned {
        ".inf" | ".Inf" | ".INF" => return Some(f64::INFINITY),
        _ => {}
    }
    match s {
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    unsigned.parse::<f64>().ok().filter(|f| f.is_finite())
}

#[cfg(test)]
mod tests {
    use super::super::{value, value_within, BodyError, Format};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn serde_yaml_value(doc: &str) -> Option<Value> {
        serde_yaml::from_str::<Value>(doc).ok()
    }

    #[test]
    fn scalars_are_typed_as_serde_yaml_types_them() {
        let scalars = [
            "",
            "~",
            "null",
            "Null",
            "NULL",
            "nULL",
            "true",
            "True",
            "TRUE",
            "tRUE",
            "false",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "0",
            "1",
            "-1",
            "+1",
            "++1",
            "+-1",
            "-0",
            "007",
            "-007",
            "+007",
            "0.5",
            "00.5",
            "1e3",
            "1E3",
            "-1.5e-3",
            ".5",
            "5.",
            "0x1F",
            "0X1F",
            "-0x1F",
            "+0x1F",
            "0x-1",
            "0o17",
            "-0o17",
            "0b101",
            "-0b101",
            "0b2",
            "1_000",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "9223372036854775808",
            ".inf",
            "-.inf",
            "+.inf",
            ".Inf",
            ".nan",
            ".NaN",
            "nan",
            "inf",
            "infinity",
            "1.0.0",
            "0x",
            "0o",
            "0b",
            "-",
            "+",
            ".",
            "1:2",
            "12:30:00",
            "2026-03-01",
            "1h",
            "abc",
            "1e400",
            "-1e400",
            "0.1e1",
            "6.02e23",
        ];
        for s in scalars {
            let doc = format!("v: {s}\n");
            let want = serde_yaml_value(&doc);
            let got = value(doc.as_bytes(), Format::Yaml).ok();
            match (&want, &got) {
                (Some(w), Some(g)) => assert_eq!(g, w, "{s:?}"),
                // Integers past 64 bits: serde_yaml could not make a JSON value either.
                (None, None) => {}
                _ => panic!("{s:?}: serde_yaml {want:?}, ours {got:?}"),
            }
        }
        for quoted in ["'1'", "\"true\"", "'~'", "|\n  x\n", ">\n  y\n"] {
            let doc = format!("v: {quoted}\n");
            assert_eq!(
                value(doc.as_bytes(), Format::Yaml).unwrap(),
                serde_yaml_value(&doc).unwrap(),
                "{quoted:?}"
            );
        }
    }

    #[test]
    fn documents_keys_and_tags() {
        assert_eq!(value(b"# nothing\n", Format::Yaml).unwrap(), Value::Null);
        assert_eq!(
            value(b"---\na: 1\n...\n", Format::Yaml).unwrap(),
            json!({"a": 1})
        );
        assert!(matches!(
            value(b"a: 1\n---\nb: 2\n", Format::Yaml),
            Err(BodyError::Syntax { .. })
        ));
        assert_eq!(
            value(b"1: a\ntrue: b\n~: c\n", Format::Yaml).unwrap(),
            json!({"1": "a", "true": "b", "~": "c"})
        );
        assert!(value(b"[a]: b\n", Format::Yaml).is_err());
        assert!(value(b"a: !foo b\n", Format::Yaml).is_err());
        assert!(value(b"a: !!str 5\n", Format::Yaml).is_err());
        // Anchors on keys, on scalars and on collections; a later key wins.
        assert_eq!(
            value(
                b"&k a: &v 1\nb: *v\n*k : 2\nc: &m {x: [1]}\nd: *m\n",
                Format::Yaml
            )
            .unwrap(),
            json!({"a": 2, "b": 1, "c": {"x": [1]}, "d": {"x": [1]}})
        );
        assert!(value(b"a: *nope\n", Format::Yaml).is_err());
        assert!(value(b"\xff: 1\n", Format::Yaml).is_err());
    }

    #[test]
    fn aliases_are_paid_for_and_cannot_nest_past_the_limit() {
        // An anchor of depth 40 copied at depth 30.
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let doc = format!(
            "a: &a {}\nb: {}*a{}\n",
            deep(40),
            "[".repeat(30),
            "]".repeat(30)
        );
        assert_eq!(
            value(doc.as_bytes(), Format::Yaml).unwrap_err(),
            BodyError::TooDeep
        );
        // Each copy costs what the anchored node cost.
        let doc = "a: &a [1, 2, 3]\nb: [*a, *a]\n";
        let v = value(doc.as_bytes(), Format::Yaml).unwrap();
        let cost = super::super::tests_cost(&v);
        // The anchor's own copy is paid for too.
        let anchored = super::super::tests_cost(&json!([1, 2, 3]));
        value_within(doc.as_bytes(), Format::Yaml, cost + anchored).unwrap();
        assert!(value_within(doc.as_bytes(), Format::Yaml, cost + anchored - 1).is_err());
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            ".{0,12}".prop_map(Value::String),
            prop::sample::select(vec![
                "~", "null", "true", "0x1F", "007", "1e3", ".inf", "- a", ": b", "#c", "&a", "*a",
                "!t", "'q'", "\"d\"", "", " ", "a\nb", "{x}", "[y]", "%z", "@", "`",
            ])
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(5, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever serde_yaml writes, both parsers read the same.
        #[test]
        fn reads_what_serde_yaml_reads(v in arb_value()) {
            let doc = serde_yaml::to_string(&v).unwrap();
            let want = serde_yaml_value(&doc).unwrap();
            let got = value(doc.as_bytes(), Format::Yaml).unwrap();
            prop_assert_eq!(got, want, "{}", doc);
        }
    }
}
