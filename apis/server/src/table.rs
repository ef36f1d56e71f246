//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for) from the kind's printer
//! columns, with a small JSONPath evaluator.

use lattice_apis::KindInfo;
use serde_json::{json, Value};

/// Whether the `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let p = part.replace(' ', "");
        p.contains("as=Table") && p.contains("g=meta.k8s.io")
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// Evaluate a simple JSONPath (`.a.b`, `.a[0].b`, `.a[?(@.type=="Ready")].status`,
/// optionally wrapped in `{}`) against `obj`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let p = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim();
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut cur = obj;
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            if !field.is_empty() {
                cur = cur.get(field)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Ok(i) = inner.parse::<usize>() {
                cur = cur.get(i)?;
            } else if let Some(filter) =
                inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let (field, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                let arr = cur.as_array()?;
                cur = arr.iter().find(|e| {
                    e.get(field.trim()).map(|v| match v {
                        Value::String(s) => s == want,
                        other => {
                            *other == serde_json::from_str::<Value>(want).unwrap_or(Value::Null)
                        }
                    }) == Some(true)
                })?;
            } else if inner == "*" {
                cur = cur.as_array()?.first()?;
            } else {
                let key = inner.trim_matches(|c| c == '"' || c == '\'');
                cur = cur.get(key)?;
            }
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = cur.get(&rest[..end])?;
            rest = &rest[end..];
        }
    }
    Some(cur)
}

/// Kubernetes' short age format (`5s`, `3m`, `2h`, `4d`, `1y`).
pub fn human_age(ts: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(ts) else {
        return "<unknown>".into();
    };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 2 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s if s < 86400 * 365 * 2 => format!("{}d", s / 86400),
        s => format!("{}y", s / (86400 * 365)),
    }
}

fn is_age_column(name: &str, path: &str) -> bool {
    name.eq_ignore_ascii_case("age")
        || path.trim_matches(|c| c == '{' || c == '}') == ".metadata.creationTimestamp"
}

fn is_date_column(c: &lattice_apis::PrinterColumn) -> bool {
    c.type_ == "date" || is_age_column(c.name, c.json_path)
}

pub fn column_definitions(kind: &KindInfo) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."
    })];
    let mut has_age = false;
    for c in kind.printer_columns {
        if c.name.eq_ignore_ascii_case("name") {
            continue;
        }
        has_age |= is_age_column(c.name, c.json_path);
        cols.push(json!({
            "name": c.name,
            "type": if is_date_column(c) { "date" } else { c.type_ },
            "format": "",
            "priority": c.priority,
            "description": c.json_path,
        }));
    }
    if !has_age {
        cols.push(
            json!({"name": "Age", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp of the object."}),
        );
    }
    cols
}

fn cell(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::String("<none>".into()),
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Number(n)) => Value::Number(n.clone()),
        Some(Value::Bool(b)) => Value::String(b.to_string()),
        Some(other) => Value::String(other.to_string()),
    }
}

pub fn row(kind: &KindInfo, obj: &Value, include: IncludeObject) -> Value {
    let mut cells = vec![obj
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::String(String::new()))];
    let mut has_age = false;
    for c in kind.printer_columns {
        if c.name.eq_ignore_ascii_case("name") {
            continue;
        }
        if is_date_column(c) {
            has_age |= is_age_column(c.name, c.json_path);
            let cellv = match json_path(obj, c.json_path).and_then(Value::as_str) {
                Some(ts) => Value::String(human_age(ts)),
                None => Value::String("<none>".into()),
            };
            cells.push(cellv);
        } else {
            cells.push(cell(json_path(obj, c.json_path)));
        }
    }
    if !has_age {
        let ts = obj
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("");
        cells.push(Value::String(human_age(ts)));
    }
    let mut r = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            });
        }
        IncludeObject::Object => {
            r["object"] = obj.clone();
        }
    }
    r
}

/// A Table for a list (`items`) or a single object.
pub fn to_table(kind: &KindInfo, v: &Value, include: IncludeObject) -> Value {
    let (rows, meta) = match v.get("items").and_then(Value::as_array) {
        Some(items) => (
            items
                .iter()
                .map(|o| row(kind, o, include))
                .collect::<Vec<_>>(),
            v.get("metadata").cloned().unwrap_or(json!({})),
        ),
        None => (
            vec![row(kind, v, include)],
            json!({"resourceVersion": v.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)}),
        ),
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": column_definitions(kind),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths() {
        let o = json!({"status": {"phase": "Running", "conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"n": [5, 6]}});
        assert_eq!(json_path(&o, ".status.phase"), Some(&json!("Running")));
        assert_eq!(json_path(&o, "{.spec.n[1]}"), Some(&json!(6)));
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(json_path(&o, ".status.missing"), None);
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
