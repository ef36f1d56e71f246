//! `lattice diff -f`: server-side dry-run apply, unified diff of live vs. would-be
//! objects. Exit code 0: no differences, 1: differences, >1: errors (kubectl's convention).

use std::io::{Read, Write};

use serde_json::Value;
use similar::TextDiff;

use crate::cli::DiffArgs;
use crate::client::WriteOptions;
use crate::cmd::apply::{apply_error, comparable, prepare};
use crate::errors::CliError;
use crate::manifest;
use crate::output::format::to_yaml;
use crate::Ctx;

/// Exit code for errors (1 means "there are differences").
pub const ERROR_EXIT: i32 = 2;

/// Removes what always differs and is not part of the user's intent.
fn for_diff(v: &Value) -> Value {
    let mut v = comparable(v);
    if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        md.remove("creationTimestamp");
        md.remove("uid");
    }
    v
}

/// The unified diff of two YAML renderings, with `live/…` and `merged/…` headers;
/// empty when equal.
pub fn unified(name: &str, live: Option<&Value>, merged: &Value) -> String {
    let old = live.map(|l| to_yaml(&for_diff(l))).unwrap_or_default();
    let new = to_yaml(&for_diff(merged));
    if old == new {
        return String::new();
    }
    let d = TextDiff::from_lines(&old, &new);
    let mut s = d
        .unified_diff()
        .context_radius(3)
        .header(&format!("live/{name}"), &format!("merged/{name}"))
        .to_string();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// Runs `diff`.
pub async fn run(
    ctx: &mut Ctx,
    args: &DiffArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let manifests = manifest::load(&args.files.filename, args.files.recursive, stdin)
        .map_err(|e| e.exit_code(ERROR_EXIT))?;
    let opts = WriteOptions { dry_run: true };
    let mut differs = false;
    let mut failed = false;
    for m in &manifests {
        let p = match prepare(ctx, m, None).await {
            Ok(p) => p,
            Err(e) => {
                writeln!(err, "{e}")?;
                failed = true;
                continue;
            }
        };
        let result = async {
            let live = ctx.client.get_opt(&p.path()).await?;
            let merged = ctx
                .client
                .apply(
                    &p.path(),
                    &p.object,
                    &args.field_manager,
                    args.force_conflicts,
                    &opts,
                )
                .await?;
            Ok::<_, crate::client::ClientError>((live, merged))
        }
        .await;
        match result {
            Ok((live, merged)) => {
                let d = unified(&p.display(), live.as_ref(), &merged);
                if !d.is_empty() {
                    differs = true;
                    out.write_all(d.as_bytes())?;
                }
            }
            Err(e) => {
                let e = apply_error(&p, e).exit_code(ERROR_EXIT);
                if e.what.starts_with("cannot reach") {
                    return Err(e);
                }
                writeln!(err, "{e}")?;
                failed = true;
            }
        }
    }
    Ok(if failed {
        ERROR_EXIT
    } else if differs {
        1
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_ignores_server_noise() {
        let live = json!({"metadata":{"name":"a","resourceVersion":"1","uid":"u"},"spec":{"x":1}});
        let same = json!({"metadata":{"name":"a","resourceVersion":"1","managedFields":[]},"spec":{"x":1}});
        assert_eq!(unified("allocation/a", Some(&live), &same), "");
        let changed = json!({"metadata":{"name":"a"},"spec":{"x":2}});
        let d = unified("allocation/a", Some(&live), &changed);
        assert!(
            d.starts_with("--- live/allocation/a\n+++ merged/allocation/a\n"),
            "{d}"
        );
        assert!(d.contains("-  x: 1\n+  x: 2\n"), "{d}");
    }
}
