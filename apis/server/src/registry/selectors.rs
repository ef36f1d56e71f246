//! Label and field selectors (Kubernetes syntax).
//!
//! Labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k`
//! (does not exist), `k>n`, `k<n`; a comma means AND.
//! Fields: `path=v`, `path==v`, `path!=v` over `metadata.name`, `metadata.namespace` and
//! the kind's selectable fields.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub op: LabelOp,
}

/// A parsed label selector: all requirements must hold. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/')
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

fn check_key(k: &str) -> Result<(), String> {
    if k.is_empty() {
        return Err("empty label key".into());
    }
    if k.len() > 317 {
        return Err(format!("label key {k:?} is too long"));
    }
    if !k.chars().all(is_key_char) {
        return Err(format!("invalid label key {k:?}"));
    }
    if k.matches('/').count() > 1 || k.starts_with('/') || k.ends_with('/') {
        return Err(format!("invalid label key {k:?}"));
    }
    Ok(())
}

fn check_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!("label value {v:?} is longer than 63 characters"));
    }
    if !v.chars().all(is_value_char) {
        return Err(format!("invalid label value {v:?}"));
    }
    Ok(())
}

/// Split at commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => {
                depth += 1;
                if depth > 1 {
                    return Err("nested parentheses in selector".into());
                }
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ')' in selector".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '(' in selector".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected '(values)' but found {rest:?}"))?;
    let mut vals = Vec::new();
    for v in inner.split(',') {
        let v = v.trim();
        check_value(v)?;
        vals.push(v.to_string());
    }
    Ok(vals)
}

/// Split `word<ws>rest`, returning the first whitespace-delimited word.
fn split_word(s: &str) -> (&str, &str) {
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], s[i..].trim_start()),
        None => (s, ""),
    }
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        let mut requirements = Vec::new();
        for part in split_top_level(s)? {
            let part = part.trim();
            if part.is_empty() {
                return Err("empty requirement in selector".into());
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
    }

    /// Match against an object's `metadata.labels`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.requirements.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str);
            r.matches(v)
        })
    }
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(k) = part.strip_prefix('!') {
        let k = k.trim();
        check_key(k)?;
        return Ok(Requirement {
            key: k.to_string(),
            op: LabelOp::DoesNotExist,
        });
    }
    // Operators without surrounding words.
    let op_pos = part.find(['=', '!', '>', '<']);
    if let Some(i) = op_pos {
        let key = part[..i].trim();
        let rest = &part[i..];
        let (op_len, kind) = if rest.starts_with("==") {
            (2, 0)
        } else if rest.starts_with("!=") {
            (2, 1)
        } else if rest.starts_with('=') {
            (1, 0)
        } else if rest.starts_with('>') {
            (1, 2)
        } else if rest.starts_with('<') {
            (1, 3)
        } else {
            return Err(format!("invalid operator in {part:?}"));
        };
        check_key(key)?;
        let value = rest[op_len..].trim();
        let op = match kind {
            0 | 1 => {
                check_value(value)?;
                if kind == 0 {
                    LabelOp::Eq(value.to_string())
                } else {
                    LabelOp::NotEq(value.to_string())
                }
            }
            _ => {
                let n: i64 = value
                    .parse()
                    .map_err(|_| format!("{value:?} is not an integer in {part:?}"))?;
                if kind == 2 {
                    LabelOp::Gt(n)
                } else {
                    LabelOp::Lt(n)
                }
            }
        };
        return Ok(Requirement {
            key: key.to_string(),
            op,
        });
    }
    let (key, rest) = split_word(part);
    check_key(key)?;
    if rest.is_empty() {
        return Ok(Requirement {
            key: key.to_string(),
            op: LabelOp::Exists,
        });
    }
    let (word, set) = split_word(rest);
    // `in(` without a space
    let (word, set) = match word.find('(') {
        Some(i) => (&word[..i], &rest[i..]),
        None => (word, set),
    };
    let op = match word {
        "in" => LabelOp::In(parse_set(set)?),
        "notin" => LabelOp::NotIn(parse_set(set)?),
        other => return Err(format!("unknown operator {other:?} in {part:?}")),
    };
    Ok(Requirement {
        key: key.to_string(),
        op,
    })
}

impl Requirement {
    pub fn matches(&self, v: Option<&str>) -> bool {
        match (&self.op, v) {
            (LabelOp::Eq(x), Some(v)) => x == v,
            (LabelOp::Eq(_), None) => false,
            (LabelOp::NotEq(x), Some(v)) => x != v,
            (LabelOp::NotEq(_), None) => true,
            (LabelOp::In(xs), Some(v)) => xs.iter().any(|x| x == v),
            (LabelOp::In(_), None) => false,
            (LabelOp::NotIn(xs), Some(v)) => !xs.iter().any(|x| x == v),
            (LabelOp::NotIn(_), None) => true,
            (LabelOp::Exists, v) => v.is_some(),
            (LabelOp::DoesNotExist, v) => v.is_none(),
            (LabelOp::Gt(n), Some(v)) => v.parse::<i64>().map(|x| x > *n).unwrap_or(false),
            (LabelOp::Lt(n), Some(v)) => v.parse::<i64>().map(|x| x < *n).unwrap_or(false),
            (LabelOp::Gt(_) | LabelOp::Lt(_), None) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    /// Dotted path, e.g. `metadata.name`, `status.phase`.
    pub field: String,
    pub value: String,
    pub equal: bool,
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parse, accepting only `metadata.name`, `metadata.namespace` and `allowed`.
    pub fn parse(s: &str, allowed: &[&str]) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        let mut requirements = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (field, value, equal) = if let Some(i) = part.find("!=") {
                (&part[..i], &part[i + 2..], false)
            } else if let Some(i) = part.find("==") {
                (&part[..i], &part[i + 2..], true)
            } else if let Some(i) = part.find('=') {
                (&part[..i], &part[i + 1..], true)
            } else {
                return Err(format!("invalid field selector requirement {part:?}"));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !allowed.contains(&field)
            {
                return Err(format!("field label not supported: {field}"));
            }
            requirements.push(FieldRequirement {
                field: field.to_string(),
                value: value.trim().to_string(),
                equal,
            });
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// An array field (e.g. `status.assignedNodes`) matches `=` when any element equals
    /// the value, so an agent can watch `status.assignedNodes=<node>`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let hit = match field(obj, &r.field) {
                Some(Value::Array(items)) => items.iter().any(|v| scalar(v) == r.value),
                Some(v) => scalar(v) == r.value,
                None => r.value.is_empty(),
            };
            hit == r.equal
        })
    }

    /// The value required for `metadata.name` with `=`, if any (lets a list read one key).
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.equal && r.field == "metadata.name")
            .map(|r| r.value.as_str())
    }
}

/// The string form of a dotted field path on an object ("" when missing).
pub fn field_value(obj: &Value, path: &str) -> String {
    field(obj, path).map(scalar).unwrap_or_default()
}

fn field<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path.split('.') {
        cur = cur.get(seg)?;
    }
    Some(cur)
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Both selectors together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches_object(obj) && self.fields.matches_object(obj)
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_all_operators() {
        let s = LabelSelector::parse(
            "a=1, b==2,c!=3,d in (x, y),e notin (z),f,!g,lattice.dev/x=y,h in(p),n>3,m<2",
        )
        .unwrap();
        assert_eq!(s.requirements.len(), 11);
        assert_eq!(
            s.requirements[0],
            Requirement {
                key: "a".into(),
                op: LabelOp::Eq("1".into())
            }
        );
        assert_eq!(s.requirements[2].op, LabelOp::NotEq("3".into()));
        assert_eq!(
            s.requirements[3].op,
            LabelOp::In(vec!["x".into(), "y".into()])
        );
        assert_eq!(s.requirements[4].op, LabelOp::NotIn(vec!["z".into()]));
        assert_eq!(s.requirements[5].op, LabelOp::Exists);
        assert_eq!(s.requirements[6].op, LabelOp::DoesNotExist);
        assert_eq!(s.requirements[7].key, "lattice.dev/x");
        assert_eq!(s.requirements[8].op, LabelOp::In(vec!["p".into()]));
        assert_eq!(s.requirements[9].op, LabelOp::Gt(3));
    }

    #[test]
    fn matching() {
        let l = labels(&[("app", "web"), ("tier", "gpu"), ("n", "5")]);
        let ok = |s: &str| LabelSelector::parse(s).unwrap().matches(&l);
        assert!(ok(""));
        assert!(ok("app=web"));
        assert!(ok("app==web,tier"));
        assert!(!ok("app!=web"));
        assert!(ok("missing!=x"));
        assert!(ok("tier in (cpu,gpu)"));
        assert!(!ok("tier notin (cpu,gpu)"));
        assert!(ok("missing notin (a)"));
        assert!(!ok("missing in (a)"));
        assert!(ok("!missing"));
        assert!(!ok("!app"));
        assert!(ok("n>4,n<6"));
        assert!(!ok("app>1"));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "a in x",
            "a in (b",
            "=x",
            "a=b=c",
            "a,,b",
            "a notin",
            "a in ((b))",
            "a b",
            "!",
            "a=(x)",
        ] {
            assert!(LabelSelector::parse(s).is_err(), "{s} should fail");
        }
    }

    #[test]
    fn field_selector_on_an_array_matches_any_element() {
        let f = FieldSelector::parse("status.assignedNodes=n2", &["status.assignedNodes"]).unwrap();
        assert!(f.matches_object(&json!({"status": {"assignedNodes": ["n1", "n2"]}})));
        assert!(!f.matches_object(&json!({"status": {"assignedNodes": ["n1"]}})));
        assert!(!f.matches_object(&json!({"status": {}})));
        let ne =
            FieldSelector::parse("status.assignedNodes!=n2", &["status.assignedNodes"]).unwrap();
        assert!(ne.matches_object(&json!({"status": {"assignedNodes": ["n1"]}})));
    }

    #[test]
    fn field_selectors() {
        let obj = json!({"metadata": {"name": "x", "namespace": "t"}, "status": {"phase": "Running"}, "spec": {"n": 3}});
        let f = FieldSelector::parse("metadata.name=x,status.phase!=Pending", &["status.phase"])
            .unwrap();
        assert!(f.matches_object(&obj));
        let f = FieldSelector::parse("metadata.namespace==u", &[]).unwrap();
        assert!(!f.matches_object(&obj));
        assert!(FieldSelector::parse("spec.secret=1", &["status.phase"]).is_err());
        let f = FieldSelector::parse("spec.n=3", &["spec.n"]).unwrap();
        assert!(f.matches_object(&obj));
        assert_eq!(
            FieldSelector::parse("metadata.name=x", &[])
                .unwrap()
                .exact_name(),
            Some("x")
        );
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,64}") {
            let _ = LabelSelector::parse(&s);
            let _ = FieldSelector::parse(&s, &["status.phase"]);
        }

        #[test]
        fn never_panics_on_selector_alphabet(s in "[a-z!=,() in notin<>0-9./-]{0,40}") {
            if let Ok(sel) = LabelSelector::parse(&s) {
                let _ = sel.matches(&labels(&[("a", "1")]));
            }
        }
    }
}
