//! Tables in kubectl's style: upper-case headers, columns separated by three spaces, no
//! borders, last column unpadded.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::kinds::{Column, KindMeta};
use crate::output::format::age_of;

/// Space between columns.
pub const GAP: usize = 3;
/// Shown for missing values.
pub const NONE: &str = "<none>";

/// A table to render at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: Vec<String>) -> Table {
        Table {
            headers,
            rows: Vec::new(),
        }
    }

    /// Renders all rows (and the header unless `no_headers`).
    pub fn render(&self, no_headers: bool) -> String {
        let mut a = Aligner::default();
        if !no_headers {
            a.observe(&self.headers);
        }
        for r in &self.rows {
            a.observe(r);
        }
        let mut out = String::new();
        if !no_headers {
            out.push_str(&a.line(&self.headers));
        }
        for r in &self.rows {
            out.push_str(&a.line(r));
        }
        out
    }
}

/// Column widths that only grow: used for watch output, where rows arrive one at a time
/// and should line up with what was printed before.
#[derive(Debug, Clone, Default)]
pub struct Aligner {
    widths: Vec<usize>,
}

impl Aligner {
    /// Widens columns to fit `cells`.
    pub fn observe(&mut self, cells: &[String]) {
        if self.widths.len() < cells.len() {
            self.widths.resize(cells.len(), 0);
        }
        for (w, c) in self.widths.iter_mut().zip(cells) {
            *w = (*w).max(c.chars().count());
        }
    }

    /// One line (with newline), padding every column but the last.
    pub fn line(&mut self, cells: &[String]) -> String {
        self.observe(cells);
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            s.push_str(c);
            if i + 1 < cells.len() {
                let pad = self.widths[i] - c.chars().count() + GAP;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.push('\n');
        s
    }
}

/// The columns shown for a kind: NAME, its printer columns (priority 1 only when `wide`),
/// then AGE unless the kind already has one.
/// With `tenant_column`, a kind's own tenant/namespace column is dropped (TENANT comes
/// first instead).
pub fn columns_for(kind: &KindMeta, wide: bool, tenant_column: bool) -> Vec<Column> {
    let mut cols = vec![Column::new("NAME", ".metadata.name", "string", 0)];
    for c in &kind.columns {
        if c.priority > 0 && !wide {
            continue;
        }
        if c.name.eq_ignore_ascii_case("name") || c.json_path == ".metadata.name" {
            continue;
        }
        if tenant_column && c.json_path.trim_start_matches('.') == "metadata.namespace" {
            continue;
        }
        cols.push(c.clone());
    }
    if !cols.iter().any(|c| c.name.eq_ignore_ascii_case("age")) {
        cols.push(Column::new("AGE", ".metadata.creationTimestamp", "date", 0));
    }
    cols
}

/// Header cells (upper-cased), with TENANT first when `tenant_column`.
pub fn headers(cols: &[Column], tenant_column: bool) -> Vec<String> {
    let mut h = Vec::new();
    if tenant_column {
        h.push("TENANT".to_string());
    }
    h.extend(cols.iter().map(|c| c.name.to_uppercase()));
    h
}

/// The cells of one object.
pub fn row(obj: &Value, cols: &[Column], tenant_column: bool, now: DateTime<Utc>) -> Vec<String> {
    let mut r = Vec::new();
    if tenant_column {
        r.push(
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or(NONE)
                .to_string(),
        );
    }
    for c in cols {
        let vals = eval_path(obj, &c.json_path);
        r.push(format_cell(&vals, &c.type_, now));
    }
    r
}

fn format_scalar(v: &Value, type_: &str, now: DateTime<Utc>) -> String {
    match v {
        Value::Null => NONE.to_string(),
        Value::String(s) if type_ == "date" => age_of(s, now),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Array(a) => a
            .iter()
            .map(|x| format_scalar(x, type_, now))
            .collect::<Vec<_>>()
            .join(","),
        Value::Object(m) => {
            // Ranges such as a node count `{min, max}` read best as `2-8`.
            if let (Some(lo), Some(hi), 2) = (m.get("min"), m.get("max"), m.len()) {
                return format!(
                    "{}-{}",
                    format_scalar(lo, type_, now),
                    format_scalar(hi, type_, now)
                );
            }
            m.iter()
                .map(|(k, x)| format!("{k}={}", format_scalar(x, type_, now)))
                .collect::<Vec<_>>()
                .join(",")
        }
    }
}

/// Formats the values a path selected.
pub fn format_cell(vals: &[Value], type_: &str, now: DateTime<Utc>) -> String {
    let parts: Vec<String> = vals
        .iter()
        .filter(|v| !v.is_null())
        .map(|v| format_scalar(v, type_, now))
        .filter(|s| !s.is_empty())
        .collect();
    if parts.is_empty() {
        NONE.to_string()
    } else {
        parts.join(",")
    }
}

#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    /// `[?(@.key=="value")]`
    Filter(Vec<String>, String),
}

fn parse_path(path: &str) -> Option<Vec<Step>> {
    let p = path.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .unwrap_or(p);
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut steps = Vec::new();
    let chars: Vec<char> = p.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                i += 1;
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                if !name.is_empty() {
                    steps.push(Step::Field(name));
                }
            }
            '[' => {
                let close = chars[i..].iter().position(|c| *c == ']')? + i;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Ok(n) = inner.parse::<usize>() {
                    steps.push(Step::Index(n));
                } else if let Some(f) = inner.strip_prefix("?(@.").and_then(|x| x.strip_suffix(')'))
                {
                    let (k, v) = f.split_once("==")?;
                    let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
                    let keys = k.trim().split('.').map(str::to_string).collect();
                    steps.push(Step::Filter(keys, v.to_string()));
                } else {
                    let key = inner.trim_matches(|c| c == '"' || c == '\'');
                    steps.push(Step::Field(key.to_string()));
                }
                i = close + 1;
            }
            _ => {
                // A path without a leading dot: `status.phase`.
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                steps.push(Step::Field(chars[start..i].iter().collect()));
            }
        }
    }
    Some(steps)
}

/// Evaluates the JSONPath subset used by printer columns: `.a.b`, `[N]`, `[*]`,
/// `[?(@.type=="Ready")]`. Returns every value selected.
pub fn eval_path(obj: &Value, path: &str) -> Vec<Value> {
    let Some(steps) = parse_path(path) else {
        return Vec::new();
    };
    let mut cur = vec![obj.clone()];
    for s in steps {
        let mut next = Vec::new();
        for v in &cur {
            match &s {
                Step::Field(f) => {
                    if let Some(x) = v.get(f) {
                        next.push(x.clone());
                    }
                }
                Step::Index(n) => {
                    if let Some(x) = v.get(n) {
                        next.push(x.clone());
                    }
                }
                Step::All => {
                    if let Some(a) = v.as_array() {
                        next.extend(a.iter().cloned());
                    }
                }
                Step::Filter(keys, want) => {
                    if let Some(a) = v.as_array() {
                        for item in a {
                            let mut f = Some(item);
                            for k in keys {
                                f = f.and_then(|x| x.get(k));
                            }
                            let matched = match f {
                                Some(Value::String(s)) => s == want,
                                Some(other) => {
                                    serde_json::from_str::<Value>(want).is_ok_and(|w| w == *other)
                                }
                                None => false,
                            };
                            if matched {
                                next.push(item.clone());
                            }
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths() {
        let o = json!({"status":{"phase":"Running","conditions":[
            {"type":"Ready","status":"True"},{"type":"Scheduled","status":"False"}]},
            "spec":{"nodes":[{"n":"a"},{"n":"b"}]}});
        assert_eq!(eval_path(&o, ".status.phase"), vec![json!("Running")]);
        assert_eq!(eval_path(&o, "status.phase"), vec![json!("Running")]);
        assert_eq!(
            eval_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![json!("True")]
        );
        assert_eq!(
            eval_path(&o, ".spec.nodes[*].n"),
            vec![json!("a"), json!("b")]
        );
        assert_eq!(eval_path(&o, ".spec.nodes[1].n"), vec![json!("b")]);
        assert!(eval_path(&o, ".nope.x").is_empty());
    }

    #[test]
    fn cells() {
        let now = Utc::now();
        let c = |v: Value| format_cell(&[v], "string", now);
        assert_eq!(c(json!({"min": 2, "max": 8})), "2-8");
        assert_eq!(c(json!({"a": 1, "b": "x"})), "a=1,b=x");
        assert_eq!(c(json!(["a", "b"])), "a,b");
        assert_eq!(c(json!(null)), NONE);
        assert_eq!(c(json!(4)), "4");
        assert_eq!(format_cell(&[], "string", now), NONE);
    }

    #[test]
    fn alignment() {
        let mut t = Table::new(vec!["NAME".into(), "PHASE".into(), "AGE".into()]);
        t.rows
            .push(vec!["a-long-name".into(), "Running".into(), "5s".into()]);
        t.rows.push(vec!["b".into(), "<none>".into(), "10m".into()]);
        assert_eq!(
            t.render(false),
            "NAME          PHASE     AGE\na-long-name   Running   5s\nb             <none>    10m\n"
        );
        assert_eq!(
            t.render(true),
            "a-long-name   Running   5s\nb             <none>    10m\n"
        );
    }
}
