//! The registry: every storage-facing verb of the API, with no HTTP in it. The HTTP layer
//! (`crate::routes` and its neighbours) authenticates, routes and encodes; the
//! in-process transport ([`in_process`]) calls the same verbs as functions, so a
//! built-in controller and an HTTP client meet the same admission, generation,
//! server-side apply and finalizer rules.
//!
//! | module | what |
//! |---|---|
//! | [`resources`] | the verbs (get, list, create, replace, patch, apply, delete) over the store |
//! | [`admission`] | what each write must satisfy beyond the kind's own validation |
//! | [`authz`] | the one authorizer: who may do what to which object |
//! | [`identity`] | who is calling ([`identity::UserInfo`]), the user of a request, the submitting-user rule |
//! | [`apply`], [`patch`] | server-side apply (managed fields), merge and JSON patches |
//! | [`objects`], [`parse`] | object keys and metadata; request bodies (JSON, YAML) |
//! | [`selectors`] | label and field selectors |
//! | [`watch_cache`] | the watch cache: one store watch per kind, fanned out |
//! | [`follow`] | an in-memory copy of a store prefix, kept by a watch |
//! | [`rbac`] | role bindings: who holds which role where; the escalation check |
//! | [`quota`] | per-tenant object-count quotas |
//! | [`redact`] | what a reader outside the owning tenant does not see |
//! | [`settings`] | the cluster settings as stored, and the limits in force |
//! | [`errors`] | [`errors::ApiError`]: a `Status` failure |
//! | [`in_process`] | the client transport of the built-in controllers |
//!
//! A module here uses only the registry, the API types, the store and
//! `crate::metrics`: no HTTP framework and no module of the HTTP layer (the test
//! `the_registry_has_no_http_in_it` checks the sources).

pub mod admission;
pub mod apply;
pub mod authz;
pub mod errors;
pub mod follow;
pub mod identity;
pub mod in_process;
pub mod objects;
pub mod parse;
pub mod patch;
pub mod quota;
pub mod rbac;
pub mod redact;
pub mod resources;
pub mod selectors;
pub mod settings;
pub mod watch_cache;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// What a registry source may not name: an HTTP framework, or a module of the crate
    /// outside the registry other than the metrics. Its unit tests (from `#[cfg(test)]`
    /// on) are not the registry.
    fn http_in(source: &str) -> Vec<String> {
        const FRAMEWORKS: [&str; 6] = [
            "axum",
            "hyper",
            "tower",
            "tokio_tungstenite",
            "tokio_rustls",
            "reqwest",
        ];
        let mut found = Vec::new();
        for (n, line) in source.lines().enumerate() {
            if line.trim() == "#[cfg(test)]" {
                break;
            }
            let code = line.split("//").next().unwrap_or_default();
            for w in code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                let root = w.split("::").next().unwrap_or_default();
                if FRAMEWORKS.contains(&root) && w.contains("::") {
                    found.push(format!("line {}: {w}", n + 1));
                }
                if let Some(rest) = w.strip_prefix("crate::") {
                    let module = rest.split("::").next().unwrap_or_default();
                    if !matches!(module, "registry" | "metrics") {
                        found.push(format!("line {}: {w}", n + 1));
                    }
                }
            }
        }
        found
    }

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read the registry's sources") {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn the_registry_has_no_http_in_it() {
        let mut files = Vec::new();
        sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/registry"),
            &mut files,
        );
        assert!(files.len() >= 15, "{files:?}");
        for f in files {
            let src = std::fs::read_to_string(&f).expect("read source");
            let found = http_in(&src);
            assert!(
                found.is_empty(),
                "{} uses the HTTP layer: {found:?}",
                f.display()
            );
        }
    }

    #[test]
    fn the_check_sees_http_and_the_http_layer() {
        assert_eq!(
            http_in("use axum::response::Response;\nlet k = crate::routes::kind_by_plural(p);"),
            [
                "line 1: axum::response::Response",
                "line 2: crate::routes::kind_by_plural"
            ]
        );
        assert!(http_in(
            "use crate::registry::objects::name_of; // see crate::routes\nuse crate::metrics::Metrics;\n#[cfg(test)]\nuse axum::Router;"
        )
        .is_empty());
    }
}
