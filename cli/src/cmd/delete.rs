//! `lattice delete KIND NAME... | -f FILE | -l SELECTOR`.

use std::io::{Read, Write};

use serde_json::Value;

use crate::cli::{DeleteArgs, DryRun};
use crate::client::{ListParams, WriteOptions};
use crate::cmd::apply::prepare;
use crate::cmd::{in_tenant, kind_name_groups};
use crate::errors::CliError;
use crate::kinds::KindMeta;
use crate::manifest;
use crate::Ctx;

struct Target {
    kind: KindMeta,
    tenant: Option<String>,
    name: String,
}

/// Runs `delete`.
pub async fn run(
    ctx: &mut Ctx,
    args: &DeleteArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let mut targets = Vec::new();
    let mut code = 0;
    if !args.files.filename.is_empty() {
        if args.kind.is_some() {
            return Err(CliError::new("delete", "both -f and KIND were given")
                .hint("use either `lattice delete -f FILE` or `lattice delete KIND NAME...`"));
        }
        for m in manifest::load(&args.files.filename, args.files.recursive, stdin)? {
            match prepare(ctx, &m, None).await {
                Ok(p) => targets.push(Target {
                    kind: p.kind,
                    tenant: p.tenant,
                    name: p.name,
                }),
                Err(e) => {
                    writeln!(err, "{e}")?;
                    code = 1;
                }
            }
        }
    } else {
        let Some(kind_arg) = &args.kind else {
            return Err(CliError::new("delete", "nothing to delete")
                .hint("pass KIND NAME..., KIND -l SELECTOR, or -f FILE"));
        };
        for (kind_name, names) in kind_name_groups(kind_arg, &args.names)? {
            let kind = ctx.catalog.resolve(&ctx.client, &kind_name).await?;
            let tenant = kind.namespaced.then(|| ctx.tenant.clone());
            if names.is_empty() {
                let Some(sel) = args.selector.as_deref().filter(|s| !s.is_empty()) else {
                    return Err(CliError::new(
                        format!("delete {}", kind.plural),
                        "no names given",
                    )
                    .hint(format!(
                        "name the objects (`lattice delete {} NAME`) or select them with -l KEY=VALUE",
                        kind.display()
                    )));
                };
                let params = ListParams {
                    label_selector: Some(sel.to_string()),
                    field_selector: None,
                };
                let list = ctx
                    .client
                    .list(&kind.collection_path(tenant.as_deref()), &params)
                    .await
                    .map_err(|e| CliError::from_client(format!("list {}", kind.plural), e))?;
                let items = list
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if items.is_empty() {
                    writeln!(
                        err,
                        "No {} found{} matching {sel:?}.",
                        kind.plural,
                        in_tenant(kind.namespaced, tenant.as_deref())
                    )?;
                }
                for o in items {
                    if let Some(n) = o.pointer("/metadata/name").and_then(Value::as_str) {
                        targets.push(Target {
                            kind: kind.clone(),
                            tenant: tenant.clone(),
                            name: n.to_string(),
                        });
                    }
                }
            } else {
                for name in names {
                    targets.push(Target {
                        kind: kind.clone(),
                        tenant: tenant.clone(),
                        name,
                    });
                }
            }
        }
    }
    let dry_run = args.dry_run == DryRun::Server;
    let suffix = if dry_run { " (server dry run)" } else { "" };
    let opts = WriteOptions { dry_run };
    for t in targets {
        let path = t.kind.object_path(t.tenant.as_deref(), &t.name);
        match ctx.client.delete(&path, &opts).await {
            Ok(_) => writeln!(out, "{} {:?} deleted{suffix}", t.kind.display(), t.name)?,
            Err(e) if e.is_not_found() => {
                if !args.ignore_not_found {
                    let e = CliError::new(
                        format!("delete {} {:?}", t.kind.display(), t.name),
                        format!("not found{}", in_tenant(t.kind.namespaced, t.tenant.as_deref())),
                    )
                    .hint(format!(
                        "`lattice get {}` lists what exists; --ignore-not-found makes this a success",
                        t.kind.plural
                    ));
                    writeln!(err, "{e}")?;
                    code = 1;
                }
            }
            Err(e) => {
                let e =
                    CliError::from_client(format!("delete {} {:?}", t.kind.display(), t.name), e);
                if e.what.starts_with("cannot reach") {
                    return Err(e);
                }
                writeln!(err, "{e}")?;
                code = 1;
            }
        }
    }
    Ok(code)
}
