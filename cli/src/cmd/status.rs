//! `lattice status`, `cancel`, `watch` and `history`: allocations as a user sees them.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::{CancelArgs, HistoryArgs, StatusArgs, WatchArgs};
use crate::client::{EventType, ListParams, WriteOptions};
use crate::cmd::workload::{
    self, cancel_patch, cancel_requested, collection, display_name, elapsed_cell, is_terminal,
    name, nodes_cell, object, phase, rfc3339, s, walltime_cell, Owner, StateFilter, DASH,
};
use crate::errors::{exit, CliError};
use crate::output::format::{list_of, to_json, to_yaml};
use crate::output::{OutputFormat, Table};
use crate::{Ctx, Shutdown};

/// Which allocations to show.
#[derive(Debug, Clone)]
pub struct Query {
    /// Explicit IDs (owner filter not applied).
    pub ids: Vec<String>,
    pub states: StateFilter,
    pub owner: Owner,
    /// `None`: all tenants.
    pub tenant: Option<String>,
    pub vcluster: Option<String>,
    /// Include the per-task allocations of task groups.
    pub tasks: bool,
}

/// Label the task-group controller puts on per-task allocations (value: the parent).
pub use lattice_apis::wellknown::TASK_GROUP_LABEL;

impl Query {
    pub fn from_status(ctx: &Ctx, a: &StatusArgs) -> Result<Query, CliError> {
        Ok(Query {
            ids: a.ids.clone(),
            states: StateFilter::phases(&a.state)?,
            owner: Owner::from_flags(a.all || a.all_tenants, a.user.as_deref(), ctx.user()),
            tenant: (!a.all_tenants).then(|| ctx.tenant.clone()),
            vcluster: ctx.vcluster.clone(),
            tasks: a.tasks,
        })
    }
}

/// Fetches the allocations a query selects. Missing IDs are reported on `err`; the second
/// value says whether any was missing.
pub async fn fetch(
    ctx: &Ctx,
    q: &Query,
    err: &mut dyn Write,
) -> Result<(Vec<Value>, bool), CliError> {
    let keep = |a: &Value| {
        q.states.keeps(phase(a))
            && q.vcluster
                .as_deref()
                .is_none_or(|v| s(a, "/spec/vcluster") == Some(v))
    };
    if q.ids.is_empty() {
        let mut items = workload::list_items(ctx, "allocations", q.tenant.as_deref()).await?;
        items.retain(|a| {
            keep(a)
                && q.owner.keeps(a)
                && (q.tasks
                    || a.pointer("/metadata/labels")
                        .and_then(|l| l.get(TASK_GROUP_LABEL))
                        .is_none())
        });
        workload::sort_by_creation(&mut items);
        return Ok((items, false));
    }
    let tenant = q.tenant.clone().unwrap_or_else(|| ctx.tenant.clone());
    let mut items = Vec::new();
    let mut missing = false;
    for id in &q.ids {
        match ctx
            .client
            .get(&object("allocations", Some(&tenant), id))
            .await
        {
            Ok(a) => {
                if keep(&a) {
                    items.push(a);
                }
            }
            Err(e) if e.is_not_found() => {
                missing = true;
                writeln!(
                    err,
                    "{}",
                    workload::not_found("allocation", id, Some(&tenant), "lattice status --all")
                )?;
            }
            Err(e) => return Err(CliError::from_client(format!("get allocation {id:?}"), e)),
        }
    }
    Ok((items, missing))
}

/// The status table.
pub fn table(ctx: &Ctx, items: &[Value], wide: bool, tenants: bool) -> Table {
    let mut h: Vec<&str> = Vec::new();
    if tenants {
        h.push("TENANT");
    }
    h.extend([
        "ID", "NAME", "STATE", "NODES", "WALLTIME", "ELAPSED", "VCLUSTER",
    ]);
    if wide {
        h.extend(["USER", "PROJECT", "UENV", "GPU", "GROUPS"]);
        if !tenants {
            h.insert(7, "TENANT");
        }
    }
    if ctx.verbose {
        h.push("REASON");
    }
    let mut t = Table::new(h.iter().map(|x| x.to_string()).collect());
    let now = ctx.now();
    let or_dash = |v: Option<&str>| v.unwrap_or(DASH).to_string();
    for a in items {
        let mut r = Vec::new();
        if tenants {
            r.push(or_dash(s(a, "/metadata/namespace")));
        }
        r.extend([
            name(a).to_string(),
            display_name(a),
            phase(a).to_string(),
            nodes_cell(a),
            walltime_cell(a),
            elapsed_cell(a, now),
            or_dash(s(a, "/spec/vcluster")),
        ]);
        if wide {
            if !tenants {
                r.push(or_dash(s(a, "/metadata/namespace")));
            }
            r.push(workload::user_of(a).unwrap_or_else(|| DASH.into()));
            r.push(or_dash(s(a, "/spec/project")));
            r.push(or_dash(
                s(a, "/spec/environment/uenv").or(s(a, "/spec/environment/image")),
            ));
            r.push(or_dash(s(a, "/spec/resources/constraints/gpuType")));
            let groups: Vec<String> = a
                .pointer("/status/topologyGroups")
                .and_then(Value::as_array)
                .map(|g| g.iter().map(|x| x.to_string()).collect())
                .unwrap_or_default();
            r.push(if groups.is_empty() {
                DASH.into()
            } else {
                groups.join(",")
            });
        }
        if ctx.verbose {
            r.push(reason(a));
        }
        t.rows.push(r);
    }
    t
}

/// Why an allocation is where it is: `status.message`, else `status.reason`, else the
/// latest False condition's message.
pub fn reason(a: &Value) -> String {
    if let Some(m) = s(a, "/status/message") {
        return m.to_string();
    }
    if let Some(r) = s(a, "/status/reason") {
        return r.replace('_', " ");
    }
    if let Some(cs) = a.pointer("/status/conditions").and_then(Value::as_array) {
        for c in cs {
            if c.get("status").and_then(Value::as_str) == Some("False") {
                if let Some(m) = c.get("message").and_then(Value::as_str) {
                    return m.to_string();
                }
            }
        }
    }
    DASH.to_string()
}

fn print_list(
    ctx: &Ctx,
    out: &mut dyn Write,
    items: Vec<Value>,
    single: bool,
    tenants: bool,
    no_headers: bool,
) -> std::io::Result<()> {
    match ctx.output_or(OutputFormat::Table) {
        OutputFormat::Json | OutputFormat::Yaml => {
            let fmt = ctx.output_or(OutputFormat::Json);
            let v = if single && items.len() == 1 {
                items.into_iter().next().unwrap_or(Value::Null)
            } else {
                list_of(items, "")
            };
            if fmt == OutputFormat::Yaml {
                out.write_all(to_yaml(&v).as_bytes())
            } else {
                out.write_all(to_json(&v).as_bytes())
            }
        }
        OutputFormat::Name => {
            for a in &items {
                writeln!(out, "{}", name(a))?;
            }
            Ok(())
        }
        f => {
            let t = table(ctx, &items, f == OutputFormat::Wide, tenants);
            out.write_all(t.render(no_headers).as_bytes())
        }
    }
}

/// Runs `status`.
pub async fn run(
    ctx: &mut Ctx,
    args: &StatusArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    let q = Query::from_status(ctx, args)?;
    let mut first = true;
    // `--watch -o json`: JSON Lines, one event per change (see `WatchLines`).
    let mut lines = (args.watch && !args.count && ctx.output == Some(OutputFormat::Json))
        .then(WatchLines::default);
    loop {
        let (items, missing) = fetch(ctx, &q, err).await?;
        if let Some(lines) = &mut lines {
            lines.emit(&items, out)?;
        } else if args.count {
            writeln!(out, "{}", items.len())?;
        } else {
            if args.watch && ctx.output == Some(OutputFormat::Yaml) {
                // A YAML stream: one document per refresh.
                out.write_all(b"---\n")?;
            } else if args.watch {
                if ctx.tty {
                    out.write_all(b"\x1b[H\x1b[2J")?;
                } else if !first {
                    writeln!(out)?;
                }
                writeln!(
                    out,
                    "Every {}s: lattice status    {}",
                    args.interval,
                    rfc3339(ctx.now())
                )?;
            }
            if items.is_empty() && ctx.output_or(OutputFormat::Table).is_table() {
                if !ctx.quiet && q.ids.is_empty() {
                    let whose = match &q.owner {
                        Owner::All => String::new(),
                        Owner::User(u) => format!(" of user {u:?}"),
                        Owner::Mine(_) => " of yours".to_string(),
                    };
                    let in_ = match &q.tenant {
                        Some(t) => format!(" in tenant {t:?}"),
                        None => String::new(),
                    };
                    let hint = if matches!(q.owner, Owner::All) {
                        ""
                    } else {
                        " (--all shows everyone's)"
                    };
                    writeln!(err, "No allocations{whose}{in_}{hint}.")?;
                }
            } else {
                print_list(
                    ctx,
                    out,
                    items,
                    q.ids.len() == 1,
                    q.tenant.is_none(),
                    args.no_headers,
                )?;
            }
        }
        out.flush()?;
        if !args.watch {
            return Ok(if missing { exit::NOT_FOUND } else { 0 });
        }
        first = false;
        tokio::select! {
            _ = &mut shutdown => return Ok(0),
            _ = tokio::time::sleep(Duration::from_secs(args.interval.max(1))) => {}
        }
    }
}

/// `status --watch -o json` output: JSON Lines, one compact object per change, shaped
/// like the API's watch events: `{"type":"ADDED","object":{...}}` for each allocation on
/// the first refresh and whenever one joins the selection, `MODIFIED` when it changed
/// since the previous refresh, `DELETED` (with its last known state) when it left the
/// selection (deleted, or no longer matching `--state`). Nothing is printed for a refresh
/// without changes, and there is no header.
#[derive(Debug, Default)]
pub struct WatchLines {
    /// `namespace/name` -> the object as last printed.
    seen: std::collections::BTreeMap<String, Value>,
}

impl WatchLines {
    /// Prints the events that turn the previous refresh into `items`.
    pub fn emit(&mut self, items: &[Value], out: &mut dyn Write) -> std::io::Result<()> {
        let key = |a: &Value| {
            format!(
                "{}/{}",
                s(a, "/metadata/namespace").unwrap_or_default(),
                name(a)
            )
        };
        let mut next = std::collections::BTreeMap::new();
        for a in items {
            let k = key(a);
            let ty = match self.seen.get(&k) {
                None => Some("ADDED"),
                Some(before) if before != a => Some("MODIFIED"),
                Some(_) => None,
            };
            if let Some(ty) = ty {
                writeln!(out, "{}", json!({"type": ty, "object": a}))?;
            }
            next.insert(k, a.clone());
        }
        for (k, a) in &self.seen {
            if !next.contains_key(k) {
                writeln!(out, "{}", json!({"type": "DELETED", "object": a}))?;
            }
        }
        self.seen = next;
        Ok(())
    }
}

/// Cancels one allocation (annotation merge patch). Returns the line to print.
pub async fn cancel_one(ctx: &Ctx, tenant: &str, a: &Value) -> Result<String, CliError> {
    let id = name(a);
    let p = phase(a);
    if is_terminal(p) {
        return Ok(format!("Allocation {id} already {p}; nothing to cancel"));
    }
    if cancel_requested(a) {
        return Ok(format!("Cancel already requested for allocation {id}"));
    }
    ctx.client
        .merge_patch(
            &object("allocations", Some(tenant), id),
            &cancel_patch(),
            &WriteOptions::default(),
        )
        .await
        .map_err(|e| CliError::from_client(format!("cancel allocation {id:?}"), e))?;
    Ok(format!("Cancel requested for allocation {id}"))
}

/// Runs `cancel`.
pub async fn cancel(
    ctx: &mut Ctx,
    args: &CancelArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    if args.ids.is_empty() && !args.all_mine {
        return Err(CliError::new("cancel", "no allocation given")
            .hint("name the allocations (lattice cancel ID...) or use --all-mine [--state=pending]")
            .exit_code(exit::USAGE));
    }
    if !args.ids.is_empty() && args.all_mine {
        return Err(
            CliError::new("cancel", "IDs and --all-mine cannot be combined")
                .hint("either name the allocations or use --all-mine")
                .exit_code(exit::USAGE),
        );
    }
    if !args.state.is_empty() && !args.all_mine {
        return Err(
            CliError::new("cancel", "--state only applies with --all-mine")
                .hint("lattice cancel --state=pending --all-mine")
                .exit_code(exit::USAGE),
        );
    }
    let tenant = ctx.tenant.clone();
    let mut code = 0;
    if args.all_mine {
        let Some(me) = ctx.user() else {
            return Err(CliError::new(
                "cancel --all-mine",
                "cannot tell who you are: $USER is not set",
            )
            .hint("set USER, or name the allocations to cancel"));
        };
        let states = StateFilter::phases(&args.state)?;
        let owner = Owner::User(me.clone());
        let mut items = workload::list_items(ctx, "allocations", Some(&tenant)).await?;
        items.retain(|a| {
            owner.keeps(a)
                && states.keeps(phase(a))
                && !is_terminal(phase(a))
                && !cancel_requested(a)
        });
        workload::sort_by_creation(&mut items);
        if items.is_empty() {
            if !ctx.quiet {
                writeln!(
                    err,
                    "No allocations of {me:?} to cancel in tenant {tenant:?}."
                )?;
            }
            return Ok(0);
        }
        for a in &items {
            match cancel_one(ctx, &tenant, a).await {
                Ok(line) => writeln!(out, "{line}")?,
                Err(e) => {
                    writeln!(err, "{e}")?;
                    code = code.max(e.exit_code);
                }
            }
        }
        return Ok(code);
    }
    for id in &args.ids {
        let a = match workload::get_allocation(ctx, &tenant, id).await {
            Ok(a) => a,
            Err(e) => {
                if e.exit_code == exit::UNREACHABLE {
                    return Err(e);
                }
                writeln!(err, "{e}")?;
                code = code.max(e.exit_code);
                continue;
            }
        };
        match cancel_one(ctx, &tenant, &a).await {
            Ok(line) => writeln!(out, "{line}")?,
            Err(e) => {
                writeln!(err, "{e}")?;
                code = code.max(e.exit_code);
            }
        }
    }
    Ok(code)
}

/// One `watch` line.
fn change_line(ctx: &Ctx, a: &Value) -> String {
    let mut line = format!("{}  {}  {}", rfc3339(ctx.now()), name(a), phase(a));
    let p = phase(a);
    let nodes: Vec<&str> = a
        .pointer("/status/assignedNodes")
        .and_then(Value::as_array)
        .map(|n| n.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if matches!(p, "Staging" | "Running") && !nodes.is_empty() {
        line.push_str(&format!(
            "  nodes: {}",
            lattice_compat::hostlist::compress(
                &nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>()
            )
        ));
    }
    if is_terminal(p) {
        if let Some(c) = a.pointer("/status/exitCode").and_then(Value::as_i64) {
            line.push_str(&format!("  exit code: {c}"));
        }
    }
    let why = reason(a);
    if why != DASH && p != "Running" {
        line.push_str(&format!("  ({why})"));
    }
    line
}

fn change_json(ctx: &Ctx, a: &Value) -> String {
    let v = json!({
        "time": rfc3339(ctx.now()),
        "id": name(a),
        "state": phase(a),
        "reason": s(a, "/status/reason"),
        "message": s(a, "/status/message"),
        "nodes": a.pointer("/status/assignedNodes").cloned().unwrap_or(json!([])),
        "exitCode": a.pointer("/status/exitCode").cloned(),
    });
    v.to_string()
}

/// Runs `watch ID`: one line per state change until the allocation ends.
pub async fn watch(
    ctx: &mut Ctx,
    args: &WatchArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    let tenant = ctx.tenant.clone();
    let json_lines = ctx.output == Some(OutputFormat::Json);
    let mut last = String::new();
    let mut emit = |ctx: &Ctx, a: &Value, out: &mut dyn Write| -> std::io::Result<()> {
        let key = format!(
            "{}|{}",
            phase(a),
            s(a, "/status/reason").unwrap_or_default()
        );
        if key != last {
            last = key;
            let line = if json_lines {
                change_json(ctx, a)
            } else {
                change_line(ctx, a)
            };
            writeln!(out, "{line}")?;
            out.flush()?;
        }
        Ok(())
    };
    let mut backoff = Duration::from_millis(500);
    loop {
        // (Re)read the object: the starting point, and anything missed while disconnected.
        // Listed, not fetched: the watch starts at the list's revision. The object's own
        // resourceVersion is its last change, which compaction may have passed (an
        // allocation running unchanged for a while): a watch from it is 410 Gone, again
        // on every retry.
        let params = ListParams {
            label_selector: None,
            field_selector: Some(format!("metadata.name={}", args.id)),
        };
        let path = collection("allocations", Some(&tenant));
        let list = ctx
            .client
            .list(&path, &params)
            .await
            .map_err(|e| CliError::from_client(format!("watch allocation {:?}", args.id), e))?;
        let listed = list
            .get("items")
            .and_then(Value::as_array)
            .and_then(|items| items.iter().find(|o| name(o) == args.id))
            .cloned();
        let a = match listed {
            Some(a) => a,
            // Not there: the usual not-found error (or the object, created meanwhile).
            None => {
                workload::get_object(
                    ctx,
                    "allocations",
                    "allocation",
                    Some(&tenant),
                    &args.id,
                    "lattice status",
                )
                .await?
            }
        };
        emit(ctx, &a, out)?;
        if is_terminal(phase(&a)) {
            return Ok(if phase(&a) == "Completed" {
                0
            } else {
                exit::ERROR
            });
        }
        let rv = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|rv| !rv.is_empty())
            .or_else(|| s(&a, "/metadata/resourceVersion"))
            .unwrap_or_default()
            .to_string();
        let mut stream = match ctx.client.watch(&path, &params, &rv).await {
            Ok(s) => s,
            Err(e) if e.is_transient() => {
                if !ctx.quiet {
                    writeln!(err, "warning: watch connection failed: {e}; retrying")?;
                }
                tokio::select! {
                    _ = &mut shutdown => return Ok(0),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
            Err(e) => {
                return Err(CliError::from_client(
                    format!("watch allocation {:?}", args.id),
                    e,
                ))
            }
        };
        loop {
            let ev = tokio::select! {
                _ = &mut shutdown => return Ok(0),
                ev = stream.next() => ev,
            };
            match ev {
                Some(Ok(ev)) => match ev.kind {
                    EventType::Added | EventType::Modified => {
                        if name(&ev.object) != args.id {
                            continue;
                        }
                        backoff = Duration::from_millis(500);
                        emit(ctx, &ev.object, out)?;
                        let p = phase(&ev.object);
                        if is_terminal(p) {
                            return Ok(if p == "Completed" { 0 } else { exit::ERROR });
                        }
                    }
                    EventType::Deleted if name(&ev.object) == args.id => {
                        writeln!(err, "Allocation {} was deleted.", args.id)?;
                        return Ok(exit::NOT_FOUND);
                    }
                    EventType::Error => break,
                    _ => {}
                },
                Some(Err(_)) | None => break,
            }
        }
        tokio::select! {
            _ = &mut shutdown => return Ok(0),
            _ = tokio::time::sleep(backoff) => {}
        }
    }
}

/// Runs `history`.
pub async fn history(
    ctx: &mut Ctx,
    args: &HistoryArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let now = ctx.now();
    let (since, until) = workload::parse_window(
        ("--since", args.since.as_deref()),
        ("--until", args.until.as_deref()),
        now,
    )?;
    let states = StateFilter::parse(&args.state, &["completed", "failed", "cancelled"], &[])?;
    let owner = Owner::from_flags(args.all, args.user.as_deref(), ctx.user());
    let items = history_items(ctx, &owner, &states, since, until).await?;
    match ctx.output_or(OutputFormat::Table) {
        OutputFormat::Json => out.write_all(to_json(&list_of(items, "")).as_bytes())?,
        OutputFormat::Yaml => out.write_all(to_yaml(&list_of(items, "")).as_bytes())?,
        OutputFormat::Name => {
            for a in &items {
                writeln!(out, "{}", name(a))?;
            }
        }
        _ => {
            if items.is_empty() {
                if !ctx.quiet {
                    writeln!(err, "No finished allocations in tenant {:?}.", ctx.tenant)?;
                }
                return Ok(0);
            }
            let mut t = Table::new(
                [
                    "ID", "NAME", "STATE", "NODES", "VCLUSTER", "START", "END", "ELAPSED", "EXIT",
                ]
                .iter()
                .map(|x| x.to_string())
                .collect(),
            );
            for a in &items {
                let ts = |p: &str| s(a, p).map(str::to_string).unwrap_or_else(|| DASH.into());
                t.rows.push(vec![
                    name(a).to_string(),
                    display_name(a),
                    phase(a).to_string(),
                    nodes_cell(a),
                    s(a, "/spec/vcluster").unwrap_or(DASH).to_string(),
                    ts("/status/startTime"),
                    ts("/status/endTime"),
                    elapsed_cell(a, now),
                    exit_cell(a),
                ]);
            }
            out.write_all(t.render(args.no_headers).as_bytes())?;
        }
    }
    Ok(0)
}

/// Finished allocations of the tenant, oldest end first.
pub async fn history_items(
    ctx: &Ctx,
    owner: &Owner,
    states: &StateFilter,
    since: Option<chrono::DateTime<chrono::Utc>>,
    until: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Vec<Value>, CliError> {
    let mut items = workload::list_items(ctx, "allocations", Some(&ctx.tenant)).await?;
    let ended = |a: &Value| {
        workload::time(a, "/status/endTime")
            .or_else(|| workload::time(a, "/metadata/creationTimestamp"))
    };
    items.retain(|a| {
        let p = phase(a);
        let t = ended(a);
        is_terminal(p)
            && states.keeps(p)
            && owner.keeps(a)
            && ctx
                .vcluster
                .as_deref()
                .is_none_or(|v| s(a, "/spec/vcluster") == Some(v))
            && since.is_none_or(|s| t.is_some_and(|t| t >= s))
            && until.is_none_or(|u| t.is_some_and(|t| t < u))
    });
    items.sort_by(|a, b| ended(a).cmp(&ended(b)).then_with(|| name(a).cmp(name(b))));
    Ok(items)
}

/// EXIT cell: the exit code, `signal N` when killed by a signal.
pub fn exit_cell(a: &Value) -> String {
    let code = a.pointer("/status/exitCode").and_then(Value::as_i64);
    let sig = a.pointer("/status/signal").and_then(Value::as_i64);
    match (code, sig) {
        (Some(c), None) => c.to_string(),
        (Some(c), Some(s)) => format!("{c} (signal {s})"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => DASH.to_string(),
    }
}
