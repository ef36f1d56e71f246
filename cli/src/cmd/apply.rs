//! `lattice apply -f`: server-side apply of manifests, with ApplySet pruning.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};

use serde_json::Value;

use crate::cli::{ApplyArgs, DryRun};
use crate::client::{ClientError, ListParams, WriteOptions};
use crate::errors::{from_status, CliError};
use crate::kinds::KindMeta;
use crate::manifest::{self, Manifest};
use crate::output::format::{name_of, to_json, to_yaml};
use crate::output::OutputFormat;
use crate::Ctx;

/// Label that ties an object to its ApplySet (kubectl ApplySet, KEP-3659).
pub const APPLYSET_LABEL: &str = "applyset.kubernetes.io/part-of";

/// A manifest ready to send: its kind, tenant and the object (namespace filled in).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub kind: KindMeta,
    pub tenant: Option<String>,
    pub name: String,
    pub object: Value,
    pub location: String,
}

impl Prepared {
    pub fn path(&self) -> String {
        self.kind.object_path(self.tenant.as_deref(), &self.name)
    }

    pub fn display(&self) -> String {
        format!("{}/{}", self.kind.display(), self.name)
    }
}

/// Resolves the manifest's kind and fills in the tenant for namespaced kinds; adds the
/// ApplySet label when `applyset` is given.
pub async fn prepare(
    ctx: &mut Ctx,
    m: &Manifest,
    applyset: Option<&str>,
) -> Result<Prepared, CliError> {
    let kind = ctx
        .catalog
        .resolve_gvk(&ctx.client, m.api_version(), m.kind())
        .await
        .map_err(|mut e| {
            e.what = format!("{} in {}", e.what, m.location());
            e
        })?;
    let mut object = m.object.clone();
    let tenant = if kind.namespaced {
        Some(m.namespace().unwrap_or(&ctx.tenant).to_string())
    } else {
        None
    };
    if let Some(md) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        match &tenant {
            Some(t) => {
                md.insert("namespace".into(), Value::String(t.clone()));
            }
            None => {
                md.remove("namespace");
            }
        }
        if let Some(set) = applyset {
            let labels = md
                .entry("labels")
                .or_insert_with(|| Value::Object(Default::default()));
            if !labels.is_object() {
                *labels = Value::Object(Default::default());
            }
            if let Some(l) = labels.as_object_mut() {
                l.insert(APPLYSET_LABEL.into(), Value::String(set.to_string()));
            }
        }
    }
    Ok(Prepared {
        kind,
        tenant,
        name: m.name().to_string(),
        object,
        location: m.location(),
    })
}

/// Turns an apply failure into a human error; 409 conflicts list fields and managers.
pub fn apply_error(p: &Prepared, e: ClientError) -> CliError {
    let what = format!("apply {} from {}", p.display(), p.location);
    match &e {
        ClientError::Status { status, .. }
            if status.code == 409 && status.reason != "AlreadyExists" =>
        {
            let mut err =
                CliError::new(what, "conflicts with fields owned by other field managers");
            if status.causes.is_empty() {
                err = err.detail(status.message_or_reason());
            }
            for c in &status.causes {
                let field = if c.field.is_empty() {
                    "<unknown field>"
                } else {
                    &c.field
                };
                let owner = if c.message.is_empty() {
                    c.reason.clone()
                } else {
                    c.message.clone()
                };
                err = err.detail(format!("{field}: {owner}"));
            }
            err.hint(
                "re-run with --force-conflicts to take ownership of these fields, \
                 or remove them from your manifest",
            )
        }
        ClientError::Status { status, .. } => from_status(what, status),
        _ => CliError::from_client(what, e),
    }
}

/// The result of applying one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// Strips fields that change on every write (for comparing dry-run results).
pub fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["managedFields", "resourceVersion", "generation"] {
            md.remove(k);
        }
    }
    v
}

/// Whether the apply changed the object, judged by content without its status: a
/// controller's status write between the read and the apply bumps the resourceVersion
/// without the apply having changed anything.
fn outcome(before: Option<&Value>, after: &Value) -> Outcome {
    let Some(before) = before else {
        return Outcome::Created;
    };
    let content = |v: &Value| {
        let mut c = comparable(v);
        if let Some(o) = c.as_object_mut() {
            o.remove("status");
        }
        c
    };
    if content(before) == content(after) {
        Outcome::Unchanged
    } else {
        Outcome::Configured
    }
}

/// Runs `apply`.
pub async fn run(
    ctx: &mut Ctx,
    args: &ApplyArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    if args.prune && args.applyset.is_none() {
        return Err(
            CliError::new("apply --prune", "--prune needs --applyset=NAME").hint(
                "name the set of objects these manifests own, e.g. --applyset=my-app; \
                   pruning only deletes objects labelled with that set",
            ),
        );
    }
    let applyset = args.applyset.as_deref().filter(|s| !s.is_empty());
    let manifests = manifest::load(&args.files.filename, args.files.recursive, stdin)?;
    let dry_run = args.dry_run == DryRun::Server;
    let opts = WriteOptions { dry_run };
    let suffix = if dry_run { " (server dry run)" } else { "" };
    let mut code = 0;
    let mut applied: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut kinds_applied: BTreeMap<String, KindMeta> = BTreeMap::new();
    let mut had_error = false;

    for m in &manifests {
        let p = match prepare(ctx, m, applyset).await {
            Ok(p) => p,
            Err(e) => {
                writeln!(err, "{e}")?;
                code = 1;
                had_error = true;
                continue;
            }
        };
        applied.insert((
            p.kind.plural.clone(),
            p.tenant.clone().unwrap_or_default(),
            p.name.clone(),
        ));
        kinds_applied.insert(p.kind.plural.clone(), p.kind.clone());
        let before = match ctx.client.get_opt(&p.path()).await {
            Ok(b) => b,
            Err(e) => {
                let e = apply_error(&p, e);
                if e.what.starts_with("cannot reach") {
                    return Err(e);
                }
                writeln!(err, "{e}")?;
                code = 1;
                had_error = true;
                continue;
            }
        };
        match ctx
            .client
            .apply(
                &p.path(),
                &p.object,
                &args.field_manager,
                args.force_conflicts,
                &opts,
            )
            .await
        {
            Ok(after) => match args.output {
                Some(OutputFormat::Json) => out.write_all(to_json(&after).as_bytes())?,
                Some(OutputFormat::Yaml) => {
                    out.write_all(b"---\n")?;
                    out.write_all(to_yaml(&after).as_bytes())?;
                }
                Some(OutputFormat::Name) => writeln!(out, "{}", name_of(&p.kind, &after))?,
                _ => writeln!(
                    out,
                    "{} {}{suffix}",
                    p.display(),
                    outcome(before.as_ref(), &after).word()
                )?,
            },
            Err(e) => {
                let e = apply_error(&p, e);
                if e.what.starts_with("cannot reach") {
                    return Err(e);
                }
                writeln!(err, "{e}")?;
                code = 1;
                had_error = true;
            }
        }
    }

    if args.prune {
        if let Some(set) = applyset {
            if had_error {
                writeln!(
                    err,
                    "warning: not pruning applyset {set:?} because some objects failed to apply"
                )?;
            } else {
                code = code
                    .max(prune(ctx, set, &applied, &kinds_applied, &opts, suffix, out, err).await?);
            }
        }
    }
    Ok(code)
}

/// Deletes objects labelled with the ApplySet that the manifests no longer contain.
#[allow(clippy::too_many_arguments)]
async fn prune(
    ctx: &mut Ctx,
    set: &str,
    applied: &BTreeSet<(String, String, String)>,
    kinds_applied: &BTreeMap<String, KindMeta>,
    opts: &WriteOptions,
    suffix: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    // Every kind the server serves that can be listed and deleted, so that a kind whose
    // last manifest was removed is still pruned.
    let mut kinds: BTreeMap<String, KindMeta> = kinds_applied.clone();
    for k in ctx.catalog.all(&ctx.client).await {
        if k.prunable() && k.plural != "events" {
            kinds.entry(k.plural.clone()).or_insert(k);
        }
    }
    let params = ListParams {
        label_selector: Some(format!("{APPLYSET_LABEL}={set}")),
        field_selector: None,
    };
    let mut code = 0;
    for kind in kinds.values() {
        let list = match ctx.client.list(&kind.collection_path(None), &params).await {
            Ok(l) => l,
            Err(e) if e.is_not_found() || e.code() == Some(405) => continue,
            Err(e) => {
                writeln!(
                    err,
                    "{}",
                    CliError::from_client(format!("list {} to prune", kind.plural), e)
                )?;
                code = 1;
                continue;
            }
        };
        let items = list
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for o in items {
            let name = o
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let ns = o
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            // Only objects that really carry the label (a server might ignore selectors).
            let label = o
                .pointer("/metadata/labels")
                .and_then(|l| l.get(APPLYSET_LABEL))
                .and_then(Value::as_str);
            if name.is_empty() || label != Some(set) {
                continue;
            }
            let key = (
                kind.plural.clone(),
                if kind.namespaced {
                    ns.clone()
                } else {
                    String::new()
                },
                name.clone(),
            );
            if applied.contains(&key) {
                continue;
            }
            let tenant = kind.namespaced.then_some(ns.as_str());
            match ctx
                .client
                .delete(&kind.object_path(tenant, &name), opts)
                .await
            {
                Ok(_) => writeln!(out, "{}/{name} pruned{suffix}", kind.display())?,
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    writeln!(
                        err,
                        "{}",
                        CliError::from_client(format!("prune {}/{name}", kind.display()), e)
                    )?;
                    code = 1;
                }
            }
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn outcomes() {
        let a = json!({"metadata":{"name":"a","resourceVersion":"1"},"spec":{"x":1}});
        let b = json!({"metadata":{"name":"a","resourceVersion":"2"},"spec":{"x":2}});
        assert_eq!(outcome(None, &a), Outcome::Created);
        assert_eq!(outcome(Some(&a), &a), Outcome::Unchanged);
        assert_eq!(outcome(Some(&a), &b), Outcome::Configured);
        let dry = json!({"metadata":{"name":"a","resourceVersion":"1"},"spec":{"x":2}});
        assert_eq!(outcome(Some(&a), &dry), Outcome::Configured);
    }
}
