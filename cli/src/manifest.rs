//! Loading manifests: files, directories (optionally recursive) and stdin; multi-document
//! YAML and JSON; `kind: List` expanded.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::errors::CliError;

/// One object read from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// File it came from (`-` for stdin).
    pub source: String,
    /// 1-based document index in that file.
    pub document: usize,
    /// 1-based line where the document starts.
    pub line: usize,
    pub object: Value,
}

impl Manifest {
    pub fn api_version(&self) -> &str {
        self.object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn kind(&self) -> &str {
        self.object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    /// `file (document N, line L)` for messages.
    pub fn location(&self) -> String {
        format!(
            "{} (document {}, line {})",
            self.source, self.document, self.line
        )
    }
}

fn is_manifest_file(p: &Path) -> bool {
    matches!(
        p.extension()
            .and_then(|e| e.to_str())
            .map(str::to_lowercase)
            .as_deref(),
        Some("yaml" | "yml" | "json")
    )
}

fn collect_dir(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<(), CliError> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| CliError::new(format!("read directory {}", dir.display()), e.to_string()))?;
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if recursive {
                collect_dir(&p, recursive, out)?;
            }
        } else if is_manifest_file(&p) {
            out.push(p);
        }
    }
    Ok(())
}

/// Loads every object named by `-f` arguments. `stdin` is read for `-`.
pub fn load(
    sources: &[String],
    recursive: bool,
    stdin: &mut dyn Read,
) -> Result<Vec<Manifest>, CliError> {
    if sources.is_empty() {
        return Err(CliError::new("read manifests", "no -f/--filename given")
            .hint("pass -f FILE, -f DIR or -f - (stdin)"));
    }
    let mut out = Vec::new();
    let mut stdin_used = false;
    for src in sources {
        if src == "-" {
            if stdin_used {
                continue;
            }
            stdin_used = true;
            let mut text = String::new();
            stdin
                .read_to_string(&mut text)
                .map_err(|e| CliError::new("read manifests from stdin", e.to_string()))?;
            out.extend(parse_text("-", &text)?);
            continue;
        }
        let path = Path::new(src);
        if path.is_dir() {
            let mut files = Vec::new();
            collect_dir(path, recursive, &mut files)?;
            if files.is_empty() {
                return Err(CliError::new(
                    format!("read manifests from {src}"),
                    "the directory has no .yaml, .yml or .json files",
                )
                .hint(if recursive {
                    "check the path"
                } else {
                    "use -R to include subdirectories"
                }));
            }
            for f in files {
                out.extend(load_file(&f)?);
            }
        } else {
            out.extend(load_file(path)?);
        }
    }
    Ok(out)
}

/// Loads one file.
pub fn load_file(path: &Path) -> Result<Vec<Manifest>, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "no such file or directory".to_string()
        } else {
            e.to_string()
        };
        CliError::new(format!("read manifest {}", path.display()), why)
            .hint("check the path given to -f")
    })?;
    parse_text(&path.display().to_string(), &text)
}

/// Splits YAML text into documents: `(start line (1-based), text)`.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut cur = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let is_sep = line == "---"
            || line.starts_with("--- ")
            || line.starts_with("---\t")
            || line == "..."
            || line.starts_with("... ");
        if is_sep {
            docs.push((start, std::mem::take(&mut cur)));
            start = lineno + 1;
            // `--- {inline}` keeps its content on the separator line.
            if let Some(rest) = line.strip_prefix("--- ") {
                if !rest.trim().is_empty() && !rest.trim_start().starts_with('#') {
                    cur.push_str(rest);
                    cur.push('\n');
                    start = lineno;
                }
            }
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
    }
    docs.push((start, cur));
    docs
}

fn is_blank_doc(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    })
}

/// Parses the content of one file (YAML or JSON; JSON is a subset of YAML, but a JSON
/// parser gives better messages for `.json`).
pub fn parse_text(source: &str, text: &str) -> Result<Vec<Manifest>, CliError> {
    let mut out = Vec::new();
    let trimmed = text.trim_start();
    if source.ends_with(".json") || trimmed.starts_with('{') || trimmed.starts_with('[') {
        let leading_lines = text.len() - trimmed.len();
        let first_line = text[..leading_lines].matches('\n').count() + 1;
        let de = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let mut idx = 0;
        for v in de {
            idx += 1;
            let v = v.map_err(|e| {
                CliError::new(
                    format!("parse {source} (document {idx}, line {})", e.line()),
                    format!("invalid JSON: {e}"),
                )
                .hint("fix the JSON syntax at that line")
            })?;
            push_object(&mut out, source, idx, first_line, v)?;
        }
        return Ok(out);
    }
    let mut idx = 0;
    for (start, doc) in split_documents(text) {
        if is_blank_doc(&doc) {
            continue;
        }
        idx += 1;
        let v: Value = serde_yaml::from_str::<serde_yaml::Value>(&doc)
            .and_then(serde_yaml::from_value::<Value>)
            .map_err(|e| {
                let (line, col) = e
                    .location()
                    .map(|l| (start + l.line() - 1, l.column()))
                    .unwrap_or((start, 0));
                let msg = e.to_string();
                // serde_yaml appends " at line X column Y" relative to the document.
                let msg = match msg.find(" at line ") {
                    Some(p) => msg[..p].to_string(),
                    None => msg,
                };
                CliError::new(
                    format!("parse {source} (document {idx}, line {line}, column {col})"),
                    format!("invalid YAML: {msg}"),
                )
                .hint("fix the YAML at that line (check indentation and quoting)")
            })?;
        if v.is_null() {
            continue;
        }
        push_object(&mut out, source, idx, start, v)?;
    }
    Ok(out)
}

fn push_object(
    out: &mut Vec<Manifest>,
    source: &str,
    document: usize,
    line: usize,
    v: Value,
) -> Result<(), CliError> {
    let at = || format!("{source} (document {document}, line {line})");
    if !v.is_object() {
        return Err(CliError::new(
            format!("read {}", at()),
            "a manifest must be a mapping with apiVersion, kind and metadata.name",
        )
        .hint("each YAML document must be one object"));
    }
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind == "List" || kind.ends_with("List") && v.get("items").is_some() {
        let items = v
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for item in items {
            push_object(out, source, document, line, item)?;
        }
        return Ok(());
    }
    // The seed's short DAG form (`name:` + `allocations:` with `depends_on`): a Dag.
    let v = if crate::cmd::dag::is_short_form(&v) {
        let def = lattice_dag::graph::DagDef::from_value(&v).map_err(|e| {
            CliError::new(
                format!("read DAG in {}", at()),
                format!("{}: {}", e.path, e.message),
            )
            .hint(e.hint.clone())
        })?;
        crate::cmd::dag::manifest_of(&at(), &def)?.0
    } else {
        v
    };
    let m = Manifest {
        source: source.to_string(),
        document,
        line,
        object: v,
    };
    let mut missing = Vec::new();
    if m.api_version().is_empty() {
        missing.push("apiVersion");
    }
    if m.kind().is_empty() {
        missing.push("kind");
    }
    if m.name().is_empty() {
        missing.push("metadata.name");
    }
    if !missing.is_empty() {
        return Err(CliError::new(
            format!("read {}", at()),
            format!("missing required field(s): {}", missing.join(", ")),
        )
        .hint(
            "every object needs apiVersion (e.g. lattice.dev/v1alpha1), kind and metadata.name",
        ));
    }
    out.push(m);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_doc_with_comments_and_empty_docs() {
        let text = "# leading comment\n---\napiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata:\n  name: a\n---\n---\n# only a comment\n---\napiVersion: lattice.dev/v1alpha1\nkind: Node\nmetadata: {name: n1}\n";
        let ms = parse_text("x.yaml", text).expect("parse");
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[0].name(), "a");
        assert_eq!(ms[0].line, 3);
        assert_eq!(ms[1].kind(), "Node");
        assert_eq!(ms[1].document, 2);
        assert_eq!(ms[1].line, 11);
    }

    #[test]
    fn bad_yaml_reports_absolute_line() {
        let text = "apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\napiVersion: v1\nkind: B\nmetadata:\n  name: [b\n";
        let e = parse_text("bad.yaml", text).expect_err("bad");
        assert!(
            e.what.starts_with("parse bad.yaml (document 2, line "),
            "{e}"
        );
        let line: usize = e.what["parse bad.yaml (document 2, line ".len()..]
            .split(',')
            .next()
            .and_then(|s| s.parse().ok())
            .expect("line");
        assert!((8..=9).contains(&line), "{e}");
    }

    #[test]
    fn json_and_list() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"lattice.dev/v1alpha1","kind":"Allocation","metadata":{"name":"a"}},
            {"apiVersion":"lattice.dev/v1alpha1","kind":"Allocation","metadata":{"name":"b"}}]}"#;
        let ms = parse_text("x.json", text).expect("parse");
        assert_eq!(
            ms.iter().map(Manifest::name).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let e = parse_text("y.json", "{\n\"a\": }").expect_err("bad");
        assert!(e.what.contains("line 2"), "{e}");
    }

    #[test]
    fn missing_fields() {
        let e = parse_text("m.yaml", "kind: Allocation\nmetadata: {}\n").expect_err("bad");
        assert!(
            e.why.contains("apiVersion") && e.why.contains("metadata.name"),
            "{e}"
        );
    }
}
