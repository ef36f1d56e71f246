//! One module per command. Each exposes `run(ctx, args, out, ...) -> Result<exit code>`.
//!
//! The workload verbs (`submit`, `status`, `cancel`, `logs`, `nodes`, `dag`, ...) share
//! helpers in [`workload`]; they reuse `Ctx`, the client and `output`.

pub mod admin;
pub mod api_resources;
pub mod apply;
pub mod attach;
pub mod auth;
pub mod compat;
pub mod completion;
pub mod config_cmd;
pub mod dag;
pub mod delete;
pub mod describe;
pub mod diff;
pub mod get;
pub mod launch;
pub mod logs;
pub mod nodes;
pub mod pki;
pub mod status;
pub mod submit;
pub mod up;
pub mod usage;
pub mod version;
pub mod workload;

use crate::errors::CliError;

/// Splits `KIND NAME...` or `KIND/NAME...` into `(kind, names)` groups, keeping order.
pub fn kind_name_groups(
    first: &str,
    rest: &[String],
) -> Result<Vec<(String, Vec<String>)>, CliError> {
    if !first.contains('/') {
        if let Some(bad) = rest.iter().find(|n| n.contains('/')) {
            return Err(CliError::new(
                format!("parse arguments {first} {bad}"),
                "mixes a KIND with KIND/NAME arguments",
            )
            .hint("use either `lattice get KIND NAME...` or `lattice get KIND/NAME...`"));
        }
        return Ok(vec![(first.to_string(), rest.to_vec())]);
    }
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for arg in std::iter::once(first).chain(rest.iter().map(String::as_str)) {
        let Some((k, n)) = arg
            .split_once('/')
            .filter(|(k, n)| !k.is_empty() && !n.is_empty())
        else {
            return Err(CliError::new(
                format!("parse argument {arg:?}"),
                "expected KIND/NAME when the first argument is KIND/NAME",
            )
            .hint("e.g. `allocation/train-1 allocation/train-2`"));
        };
        match groups.iter_mut().find(|(gk, _)| gk == k) {
            Some((_, names)) => names.push(n.to_string()),
            None => groups.push((k.to_string(), vec![n.to_string()])),
        }
    }
    Ok(groups)
}

/// `in tenant "x"` for namespaced kinds, empty otherwise.
pub fn in_tenant(namespaced: bool, tenant: Option<&str>) -> String {
    match tenant.filter(|_| namespaced) {
        Some(t) => format!(" in tenant {t:?}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups() {
        let g = kind_name_groups("alloc", &["a".into(), "b".into()]).expect("ok");
        assert_eq!(
            g,
            vec![("alloc".to_string(), vec!["a".to_string(), "b".to_string()])]
        );
        let g = kind_name_groups("alloc/a", &["node/n".into(), "alloc/b".into()]).expect("ok");
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].1, vec!["a".to_string(), "b".to_string()]);
        assert!(kind_name_groups("alloc/a", &["b".into()]).is_err());
        assert!(kind_name_groups("alloc", &["x/b".into()]).is_err());
    }
}
