//! `lattice get KIND [NAME...]`, with `-w` watch.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use serde_json::Value;

use crate::cli::GetArgs;
use crate::client::{ClientError, EventType, ListParams, WatchEvent};
use crate::cmd::{in_tenant, kind_name_groups};
use crate::errors::CliError;
use crate::kinds::{Column, KindMeta};
use crate::output::format::{fill_type_meta, list_of, name_of, to_json, to_yaml};
use crate::output::table::{columns_for, headers, row};
use crate::output::{Aligner, OutputFormat, Table};
use crate::{Ctx, Shutdown};

/// No event (not even a bookmark) for this long: reconnect.
const WATCH_IDLE: Duration = Duration::from_secs(120);
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs `get`.
pub async fn run(
    ctx: &mut Ctx,
    args: &GetArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    let groups = kind_name_groups(&args.kind, &args.names)?;
    if (args.watch || args.watch_only) && groups.len() > 1 {
        return Err(
            CliError::new("watch", "only one kind can be watched at a time")
                .hint("run one `lattice get KIND -w` per kind"),
        );
    }
    let mut code = 0;
    let multi = groups.len() > 1;
    let mut all_items = Vec::new();
    for (i, (kind_name, names)) in groups.iter().enumerate() {
        let kind = ctx.catalog.resolve(&ctx.client, kind_name).await?;
        let view = View::new(ctx, &kind, args);
        if args.all_tenants && !names.is_empty() && kind.namespaced {
            return Err(CliError::new(
                format!("get {} by name", kind.plural),
                "an object cannot be fetched by name across all tenants",
            )
            .hint("drop -A and pick the tenant with -n TENANT"));
        }
        if args.watch || args.watch_only {
            return watch(ctx, &kind, &view, args, names, out, err, &mut shutdown).await;
        }
        let (items, rv, failed) = fetch(ctx, &kind, &view, args, names, err).await?;
        if failed {
            code = 1;
        }
        match args.output {
            OutputFormat::Table | OutputFormat::Wide => {
                if items.is_empty() {
                    if names.is_empty() {
                        writeln!(
                            err,
                            "No {} found{}.",
                            kind.plural,
                            in_tenant(kind.namespaced, view.tenant.as_deref())
                        )?;
                    }
                    continue;
                }
                if multi && i > 0 {
                    writeln!(out)?;
                }
                let mut t = Table::new(headers(&view.cols, view.tenant_column));
                for o in &items {
                    t.rows
                        .push(row(o, &view.cols, view.tenant_column, ctx.now()));
                }
                out.write_all(t.render(args.no_headers).as_bytes())?;
            }
            OutputFormat::Name => {
                for o in &items {
                    writeln!(out, "{}", name_of(&kind, o))?;
                }
            }
            OutputFormat::Json | OutputFormat::Yaml => {
                let single = !multi && names.len() == 1;
                if single {
                    if let Some(o) = items.into_iter().next() {
                        write_object(out, args.output, &o)?;
                    }
                } else if multi {
                    all_items.extend(items);
                } else {
                    write_object(out, args.output, &list_of(items, &rv))?;
                }
            }
        }
    }
    if multi && matches!(args.output, OutputFormat::Json | OutputFormat::Yaml) {
        write_object(out, args.output, &list_of(all_items, ""))?;
    }
    Ok(code)
}

fn write_object(out: &mut dyn Write, fmt: OutputFormat, v: &Value) -> std::io::Result<()> {
    match fmt {
        OutputFormat::Yaml => out.write_all(to_yaml(v).as_bytes()),
        _ => out.write_all(to_json(v).as_bytes()),
    }
}

/// What to show for a kind.
struct View {
    cols: Vec<Column>,
    tenant_column: bool,
    /// `None` = cluster-scoped kind or all tenants.
    tenant: Option<String>,
}

impl View {
    fn new(ctx: &Ctx, kind: &KindMeta, args: &GetArgs) -> View {
        let all = args.all_tenants && kind.namespaced;
        View {
            cols: columns_for(kind, args.output == OutputFormat::Wide, all),
            tenant_column: all,
            tenant: if all || !kind.namespaced {
                None
            } else {
                Some(ctx.tenant.clone())
            },
        }
    }
}

fn params(args: &GetArgs, names: &[String]) -> ListParams {
    let mut field = args.field_selector.clone().filter(|s| !s.is_empty());
    if names.len() == 1 {
        let by_name = format!("metadata.name={}", names[0]);
        field = Some(match field {
            Some(f) => format!("{f},{by_name}"),
            None => by_name,
        });
    }
    ListParams {
        label_selector: args.selector.clone(),
        field_selector: field,
    }
}

/// Gets named objects (reporting the missing ones) or lists; returns the objects, the
/// list resourceVersion, and whether some name failed.
async fn fetch(
    ctx: &Ctx,
    kind: &KindMeta,
    view: &View,
    args: &GetArgs,
    names: &[String],
    err: &mut dyn Write,
) -> Result<(Vec<Value>, String, bool), CliError> {
    let tenant = view.tenant.as_deref();
    if names.is_empty() {
        let list = ctx
            .client
            .list(&kind.collection_path(tenant), &params(args, names))
            .await
            .map_err(|e| list_error(kind, tenant, e))?;
        let rv = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut items = list
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for o in &mut items {
            fill_type_meta(o, kind);
        }
        return Ok((items, rv, false));
    }
    let mut items = Vec::new();
    let mut failed = false;
    for n in names {
        match ctx.client.get(&kind.object_path(tenant, n)).await {
            Ok(mut o) => {
                fill_type_meta(&mut o, kind);
                items.push(o);
            }
            Err(e) if e.is_not_found() => {
                failed = true;
                writeln!(err, "{}", not_found(kind, tenant, n))?;
            }
            Err(e) => {
                return Err(CliError::from_client(
                    format!("get {} {n:?}", kind.display()),
                    e,
                ))
            }
        }
    }
    Ok((items, String::new(), failed))
}

/// `allocation "x" not found in tenant "t"`.
pub fn not_found(kind: &KindMeta, tenant: Option<&str>, name: &str) -> CliError {
    CliError::new(
        format!("get {} {name:?}", kind.display()),
        format!("not found{}", in_tenant(kind.namespaced, tenant)),
    )
    .hint(if kind.namespaced {
        format!(
            "`lattice get {}` lists what exists; add -A to search all tenants or -n TENANT to pick one",
            kind.plural
        )
    } else {
        format!("`lattice get {}` lists what exists", kind.plural)
    })
}

fn list_error(kind: &KindMeta, tenant: Option<&str>, e: ClientError) -> CliError {
    CliError::from_client(
        format!("list {}{}", kind.plural, in_tenant(kind.namespaced, tenant)),
        e,
    )
}

fn object_key(o: &Value) -> String {
    let ns = o
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = o
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    format!("{ns}/{name}")
}

fn rv_of(o: &Value) -> String {
    o.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Prints watched objects in the chosen format, aligned with what came before.
struct WatchPrinter<'a> {
    kind: &'a KindMeta,
    view: &'a View,
    format: OutputFormat,
    aligner: Aligner,
    /// Last printed resourceVersion per object, to skip duplicates after a relist.
    seen: HashMap<String, String>,
}

impl WatchPrinter<'_> {
    fn print(
        &mut self,
        ctx: &Ctx,
        out: &mut dyn Write,
        obj: &Value,
        deleted: bool,
    ) -> std::io::Result<()> {
        let key = object_key(obj);
        let rv = rv_of(obj);
        if deleted {
            self.seen.remove(&key);
        } else {
            if !rv.is_empty() && self.seen.get(&key) == Some(&rv) {
                return Ok(());
            }
            self.seen.insert(key, rv);
        }
        let mut obj = obj.clone();
        fill_type_meta(&mut obj, self.kind);
        match self.format {
            OutputFormat::Table | OutputFormat::Wide => {
                let cells = row(&obj, &self.view.cols, self.view.tenant_column, ctx.now());
                out.write_all(self.aligner.line(&cells).as_bytes())?;
            }
            OutputFormat::Name => writeln!(out, "{}", name_of(self.kind, &obj))?,
            OutputFormat::Json => out.write_all(to_json(&obj).as_bytes())?,
            OutputFormat::Yaml => {
                out.write_all(b"---\n")?;
                out.write_all(to_yaml(&obj).as_bytes())?;
            }
        }
        out.flush()
    }
}

/// Outcome of one watch connection.
enum Next {
    Stop,
    Reconnect,
    Relist,
}

/// Sleeps for `d` unless interrupted; returns false when interrupted.
async fn sleep_or_stop(d: Duration, shutdown: &mut Shutdown) -> bool {
    tokio::select! {
        _ = shutdown => false,
        _ = tokio::time::sleep(d) => true,
    }
}

#[allow(clippy::too_many_arguments)]
async fn watch(
    ctx: &Ctx,
    kind: &KindMeta,
    view: &View,
    args: &GetArgs,
    names: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let mut printer = WatchPrinter {
        kind,
        view,
        format: args.output,
        aligner: Aligner::default(),
        seen: HashMap::new(),
    };
    let p = params(args, names);
    let path = kind.collection_path(view.tenant.as_deref());
    let wanted = |o: &Value| {
        names.is_empty()
            || o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .is_some_and(|n| names.iter().any(|x| x == n))
    };
    // The header is printed with the first batch of rows, so that they share widths.
    let mut header = (args.output.is_table() && !args.no_headers)
        .then(|| headers(&view.cols, view.tenant_column));
    if args.watch_only {
        if let Some(h) = header.take() {
            out.write_all(printer.aligner.line(&h).as_bytes())?;
            out.flush()?;
        }
    }

    let mut rv = String::new();
    let mut need_list = true;
    let mut first_list = true;
    let mut backoff = BACKOFF_START;
    loop {
        if need_list {
            let listed = tokio::select! {
                _ = &mut *shutdown => return Ok(0),
                r = ctx.client.list(&path, &p) => r,
            };
            match listed {
                Ok(list) => {
                    backoff = BACKOFF_START;
                    rv = list
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let items = list
                        .get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    let print = !(first_list && args.watch_only);
                    let items: Vec<&Value> = items.iter().filter(|o| wanted(o)).collect();
                    if print && args.output.is_table() {
                        if let Some(h) = &header {
                            printer.aligner.observe(h);
                        }
                        for o in &items {
                            printer.aligner.observe(&row(
                                o,
                                &view.cols,
                                view.tenant_column,
                                ctx.now(),
                            ));
                        }
                    }
                    if let Some(h) = header.take() {
                        out.write_all(printer.aligner.line(&h).as_bytes())?;
                        out.flush()?;
                    }
                    for o in items {
                        if print {
                            printer.print(ctx, out, o, false)?;
                        } else {
                            printer.seen.insert(object_key(o), rv_of(o));
                        }
                    }
                    first_list = false;
                    need_list = false;
                }
                Err(e) if e.is_transient() && !first_list => {
                    writeln!(err, "warning: relist failed ({e}); retrying in {backoff:?}")?;
                    if !sleep_or_stop(backoff, shutdown).await {
                        return Ok(0);
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
                Err(e) => return Err(list_error(kind, view.tenant.as_deref(), e)),
            }
        }

        let started = tokio::select! {
            _ = &mut *shutdown => return Ok(0),
            r = ctx.client.watch(&path, &p, &rv) => r,
        };
        let next = match started {
            Ok(mut stream) => {
                let mut got_event = false;
                let n = loop {
                    let ev = tokio::select! {
                        _ = &mut *shutdown => break Next::Stop,
                        ev = tokio::time::timeout(WATCH_IDLE, stream.next()) => ev,
                    };
                    match ev {
                        Err(_) | Ok(None) => break Next::Reconnect,
                        Ok(Some(Err(e))) => {
                            writeln!(err, "warning: watch interrupted ({e}); resuming")?;
                            break Next::Reconnect;
                        }
                        Ok(Some(Ok(ev))) => {
                            got_event = true;
                            match handle_event(&ev) {
                                Handled::Object { deleted } => {
                                    if let Some(r) = ev.resource_version() {
                                        rv = r.to_string();
                                    }
                                    if wanted(&ev.object) {
                                        printer.print(ctx, out, &ev.object, deleted)?;
                                    }
                                }
                                Handled::Bookmark => {
                                    if let Some(r) = ev.resource_version() {
                                        rv = r.to_string();
                                    }
                                }
                                Handled::Expired => break Next::Relist,
                                Handled::Error(msg) => {
                                    writeln!(
                                        err,
                                        "warning: watch error from server ({msg}); resuming"
                                    )?;
                                    break Next::Reconnect;
                                }
                            }
                        }
                    }
                };
                if got_event {
                    backoff = BACKOFF_START;
                } else if matches!(n, Next::Reconnect) {
                    // The server ended the stream without a single event: do not spin.
                    if !sleep_or_stop(backoff, shutdown).await {
                        return Ok(0);
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                n
            }
            Err(e) if e.is_gone() => Next::Relist,
            Err(e) if e.is_transient() => {
                writeln!(
                    err,
                    "warning: watch connection failed ({e}); retrying in {backoff:?}"
                )?;
                if !sleep_or_stop(backoff, shutdown).await {
                    return Ok(0);
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                Next::Reconnect
            }
            Err(e) => {
                return Err(CliError::from_client(
                    format!(
                        "watch {}{}",
                        kind.plural,
                        in_tenant(kind.namespaced, view.tenant.as_deref())
                    ),
                    e,
                ))
            }
        };
        match next {
            Next::Stop => return Ok(0),
            Next::Relist => need_list = true,
            Next::Reconnect => {}
        }
    }
}

enum Handled {
    Object { deleted: bool },
    Bookmark,
    Expired,
    Error(String),
}

fn handle_event(ev: &WatchEvent) -> Handled {
    match ev.kind {
        EventType::Added | EventType::Modified => Handled::Object { deleted: false },
        EventType::Deleted => Handled::Object { deleted: true },
        EventType::Bookmark => Handled::Bookmark,
        EventType::Error => {
            let code = ev.object.get("code").and_then(Value::as_u64);
            let reason = ev
                .object
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if code == Some(410) || reason == "Expired" || reason == "Gone" {
                Handled::Expired
            } else {
                Handled::Error(
                    ev.object
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown error")
                        .to_string(),
                )
            }
        }
    }
}
