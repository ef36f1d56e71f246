//! Output formats and value formatting (ages, JSON, YAML, names).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::kinds::KindMeta;

/// `-o` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns (default).
    #[default]
    Table,
    /// Aligned columns with the extra (priority 1) columns.
    Wide,
    /// JSON: one object, or a List.
    Json,
    /// YAML: one object, or a List.
    Yaml,
    /// `kind/name` per object.
    Name,
}

impl OutputFormat {
    pub fn is_table(self) -> bool {
        matches!(self, OutputFormat::Table | OutputFormat::Wide)
    }
}

/// Kubernetes' humanised duration (`kubectl get`'s AGE): 5s, 119s, 3m20s, 45m, 2h10m, 20h,
/// 3d4h, 12d, 1y20d, 9y.
pub fn human_age(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".to_string();
    }
    let secs = secs.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = hours / 24;
        let d = days % 365;
        return if d == 0 {
            format!("{}y", days / 365)
        } else {
            format!("{}y{d}d", days / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Age of an RFC 3339 timestamp relative to `now`; `<unknown>` when unparsable.
pub fn age_of(ts: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(ts) {
        Ok(t) => human_age((now - t.with_timezone(&Utc)).num_seconds()),
        Err(_) => "<unknown>".to_string(),
    }
}

/// Pretty JSON with 4-space indentation (kubectl's) and a trailing newline.
pub fn to_json(v: &Value) -> String {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    if v.serialize(&mut ser).is_err() {
        return format!("{v}\n");
    }
    let mut s = String::from_utf8(buf).unwrap_or_default();
    s.push('\n');
    s
}

/// YAML with a trailing newline.
pub fn to_yaml(v: &Value) -> String {
    let s = serde_yaml::to_string(v).unwrap_or_else(|e| format!("# cannot render YAML: {e}\n"));
    if s.ends_with('\n') {
        s
    } else {
        format!("{s}\n")
    }
}

/// `allocation/foo`.
pub fn name_of(kind: &KindMeta, obj: &Value) -> String {
    format!(
        "{}/{}",
        kind.display(),
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    )
}

/// Wraps objects in a `List` (what `-o json|yaml` prints for several objects).
pub fn list_of(items: Vec<Value>, resource_version: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": resource_version},
        "items": items,
    })
}

/// Adds `apiVersion`/`kind` to list items that lack them (list items often omit them).
pub fn fill_type_meta(obj: &mut Value, kind: &KindMeta) {
    if let Some(m) = obj.as_object_mut() {
        m.entry("apiVersion")
            .or_insert_with(|| Value::String(kind.group_version.clone()));
        m.entry("kind")
            .or_insert_with(|| Value::String(kind.kind.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (20 * 3600, "20h"),
            (50 * 3600, "2d2h"),
            (4 * 86400, "4d"),
            (30 * 86400, "30d"),
            (800 * 86400, "2y70d"),
            (3650 * 86400, "10y"),
        ];
        for (s, want) in cases {
            assert_eq!(human_age(s), want, "{s}s");
        }
    }

    #[test]
    fn age_of_timestamp() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:10:00Z")
            .expect("ts")
            .with_timezone(&Utc);
        assert_eq!(age_of("2026-01-01T00:00:00Z", now), "10m");
        assert_eq!(age_of("garbage", now), "<unknown>");
    }

    #[test]
    fn json_indent() {
        assert_eq!(
            to_json(&serde_json::json!({"a": 1})),
            "{\n    \"a\": 1\n}\n"
        );
    }
}
