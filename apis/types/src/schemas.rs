//! Generated JSON Schemas, one file per kind under `manifests/schemas/<plural>.json`.
//!
//! The files are kept in sync with the code by the `schemas_match_files`
//! test; regenerate them with
//! `LATTICE_UPDATE_SCHEMAS=1 cargo test -p lattice-apis schemas_match_files`.

use std::path::{Path, PathBuf};

use crate::registry::{kinds, KindInfo};

/// The command that regenerates the schema files.
pub const REGENERATE_COMMAND: &str =
    "LATTICE_UPDATE_SCHEMAS=1 cargo test -p lattice-apis schemas_match_files";

/// The schema file text for `kind`: pretty JSON with a trailing newline.
pub fn render(kind: &KindInfo) -> String {
    let mut s = serde_json::to_string_pretty(&(kind.schema)()).unwrap_or_default();
    s.push('\n');
    s
}

/// `manifests/schemas` in the source tree.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/schemas")
}

/// Write every kind's schema into `dir` (created if missing).
pub fn write_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for k in kinds() {
        let path = dir.join(format!("{}.json", k.plural));
        std::fs::write(&path, render(k))?;
        written.push(path);
    }
    Ok(written)
}

/// Kinds whose file in `dir` is missing or differs from the code.
pub fn stale(dir: &Path) -> Vec<PathBuf> {
    kinds()
        .iter()
        .filter_map(|k| {
            let path = dir.join(format!("{}.json", k.plural));
            match std::fs::read_to_string(&path) {
                Ok(text) if text == render(k) => None,
                _ => Some(path),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_match_files() {
        let dir = default_dir();
        if std::env::var_os("LATTICE_UPDATE_SCHEMAS").is_some() {
            write_all(&dir).expect("write schemas");
        }
        let stale = stale(&dir);
        assert!(
            stale.is_empty(),
            "JSON Schemas are out of date: {stale:?}\nregenerate them with: {REGENERATE_COMMAND}"
        );
    }

    #[test]
    fn every_schema_is_an_object_schema_with_the_envelope() {
        for k in kinds() {
            let s = (k.schema)();
            let props = s["properties"].as_object().expect("properties");
            for f in ["apiVersion", "kind", "metadata"] {
                assert!(props.contains_key(f), "{}: missing {f}", k.kind);
            }
            assert_eq!(s["additionalProperties"], false, "{}", k.kind);
        }
    }
}
