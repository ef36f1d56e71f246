//! `lattice dag submit|status|list|cancel`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};

use lattice_apis::kinds::dag::{dag_size_error, DEFAULT_MAX_DAG_SIZE};
use lattice_dag::graph::{validate, DagDef, Limits};
use serde_json::{json, Value};

use crate::cli::{DagCommand, SubmitDryRun};
use crate::client::WriteOptions;
use crate::cmd::workload::{
    self, cancel_patch, cancel_requested, collection, elapsed_cell, name, nodes_cell, object, s,
    DASH,
};
use crate::errors::CliError;
use crate::output::format::{age_of, to_json, to_yaml};
use crate::output::{OutputFormat, Table};
use crate::Ctx;

/// Converts a DAG document (short form or `kind: Dag`) into a validated Dag manifest.
pub fn to_manifest(source: &str, text: &str) -> Result<(Value, usize), CliError> {
    let def = DagDef::from_yaml(text).map_err(|e| {
        CliError::new(
            format!("read DAG {source}"),
            format!("{}: {}", e.path, e.message),
        )
        .hint(e.hint)
    })?;
    manifest_of(source, &def)
}

/// Validates a parsed DAG and renders it as a manifest; returns it and the number of
/// allocations it makes (a task group's elements each).
/// The size limit is not checked here: it is the server's (`lattice-server
/// --max-dag-size`), which the client cannot know, and the server enforces it at admission.
pub fn manifest_of(source: &str, def: &DagDef) -> Result<(Value, usize), CliError> {
    let limits = Limits {
        max_dag_size: usize::MAX,
        ..Limits::default()
    };
    let validated = match validate(def, &limits) {
        Ok(v) => v,
        Err(errs) => {
            let mut it = errs.0.iter();
            let first = it.next();
            let label = match &def.name {
                Some(n) => format!("DAG {n:?}"),
                None if source == "-" => "DAG from stdin".to_string(),
                None => format!("DAG {source}"),
            };
            let mut e = CliError::new(
                format!("{label} rejected"),
                first.map(|f| f.message()).unwrap_or_default(),
            );
            for more in it {
                e = e.detail(format!("also: {}", more.message()));
            }
            if let Some(f) = first {
                e = e.hint(f.hint());
            }
            return Err(e);
        }
    };
    // Allocations, as the server counts them for its size limit: a task group's elements each.
    let allocations = validated.allocation_count();
    Ok((def.to_manifest(), allocations))
}

/// True for a YAML/JSON document in the short DAG form (`name:` + `allocations:`/`steps:`,
/// no `kind`).
pub fn is_short_form(v: &Value) -> bool {
    v.is_object()
        && v.get("kind").is_none()
        && v.get("apiVersion").is_none()
        && (v.get("allocations").is_some() || v.get("steps").is_some() || v.get("dag").is_some())
}

fn read_source(
    cwd: &std::path::Path,
    file: &str,
    stdin: &mut dyn Read,
) -> Result<String, CliError> {
    if file == "-" {
        let mut t = String::new();
        stdin
            .read_to_string(&mut t)
            .map_err(|e| CliError::new("read the DAG from stdin", e.to_string()))?;
        return Ok(t);
    }
    std::fs::read_to_string(cwd.join(file)).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "no such file".to_string()
        } else {
            e.to_string()
        };
        CliError::new(format!("read DAG {file}"), why).hint("pass the path of a DAG YAML file")
    })
}

/// Task phase of a DAG step.
pub fn task_phase<'a>(dag: &'a Value, task: &str) -> &'a str {
    dag.pointer("/status/tasks")
        .and_then(|t| t.get(task))
        .and_then(|t| t.get("phase"))
        .and_then(Value::as_str)
        .unwrap_or("Waiting")
}

/// The allocation created for a step.
pub fn task_allocation(dag: &Value, task: &str) -> String {
    dag.pointer("/status/tasks")
        .and_then(|t| t.get(task))
        .and_then(|t| t.get("allocation"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}-{task}", name(dag)))
}

/// One DAG step: name, dependsOn `[(ref, condition)]`, allocation spec.
pub type Step = (String, Vec<(String, String)>, Value);

/// Steps in declaration order.
pub fn steps(dag: &Value) -> Vec<Step> {
    dag.pointer("/spec/allocations")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|t| {
                    let n = t
                        .get("name")
                        .or_else(|| t.get("id"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let deps = t
                        .get("dependsOn")
                        .and_then(Value::as_array)
                        .map(|d| d.iter().filter_map(dep_of).collect())
                        .unwrap_or_default();
                    (n, deps, t.get("spec").cloned().unwrap_or(Value::Null))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn dep_of(d: &Value) -> Option<(String, String)> {
    match d {
        Value::String(s) => Some(match s.rsplit_once(':') {
            Some((r, c)) => (r.to_string(), c.to_string()),
            None => (s.clone(), "success".into()),
        }),
        Value::Object(o) => {
            if let Some(r) = o
                .get("ref")
                .or_else(|| o.get("allocation"))
                .and_then(Value::as_str)
            {
                let c = o
                    .get("condition")
                    .and_then(Value::as_str)
                    .unwrap_or("success");
                return Some((r.to_string(), c.to_string()));
            }
            let (k, v) = o.iter().next()?;
            Some((k.clone(), v.as_str().unwrap_or("success").to_string()))
        }
        _ => None,
    }
}

/// The seed's arrow view: `a [Completed] → b [Running] → c [Pending]`, with `↘` branches.
pub fn graph(dag: &Value) -> String {
    let st = steps(dag);
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut has_parent: HashSet<&str> = HashSet::new();
    for (n, deps, _) in &st {
        for (r, _) in deps {
            children.entry(r.as_str()).or_default().push(n.as_str());
            has_parent.insert(n.as_str());
        }
    }
    // Children in declaration order.
    let order: HashMap<&str, usize> = st
        .iter()
        .enumerate()
        .map(|(i, (n, _, _))| (n.as_str(), i))
        .collect();
    for v in children.values_mut() {
        v.sort_by_key(|c| order.get(c).copied().unwrap_or(usize::MAX));
        v.dedup();
    }
    let mut lines: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    fn label(dag: &Value, n: &str) -> String {
        format!("{n} [{}]", task_phase(dag, n))
    }
    #[allow(clippy::too_many_arguments)]
    fn walk<'a>(
        dag: &Value,
        n: &'a str,
        children: &BTreeMap<&'a str, Vec<&'a str>>,
        seen: &mut HashSet<String>,
        lines: &mut Vec<String>,
    ) {
        let l = label(dag, n);
        let line = lines.last_mut().expect("a line");
        line.push_str(&l);
        let col = line.chars().count();
        if !seen.insert(n.to_string()) {
            return;
        }
        let kids = children.get(n).cloned().unwrap_or_default();
        for (i, c) in kids.iter().enumerate() {
            if i == 0 {
                lines.last_mut().expect("a line").push_str(" → ");
            } else {
                lines.push(format!("{}↘ ", " ".repeat(col + 1)));
            }
            walk(dag, c, children, seen, lines);
        }
    }
    for (n, _, _) in &st {
        if has_parent.contains(n.as_str()) {
            continue;
        }
        lines.push(String::new());
        walk(dag, n, &children, &mut seen, &mut lines);
    }
    // Steps only reachable through a cycle (rejected at submission, but be safe).
    for (n, _, _) in &st {
        if !seen.contains(n) {
            lines.push(String::new());
            walk(dag, n, &children, &mut seen, &mut lines);
        }
    }
    let mut out = String::new();
    for l in lines {
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

/// Per-step rows: STEP STATE ALLOCATION NODES ELAPSED DEPENDS ON.
pub fn step_table(ctx: &Ctx, dag: &Value, allocs: &HashMap<String, Value>) -> Table {
    let mut h = vec![
        "STEP",
        "STATE",
        "ALLOCATION",
        "NODES",
        "ELAPSED",
        "DEPENDS ON",
    ];
    if ctx.verbose {
        h.push("REASON");
    }
    let mut t = Table::new(h.iter().map(|x| x.to_string()).collect());
    for (n, deps, spec) in steps(dag) {
        let an = task_allocation(dag, &n);
        let a = allocs.get(&an);
        let alloc_cell = if a.is_some() {
            an.clone()
        } else {
            DASH.to_string()
        };
        let nodes = match a {
            Some(a) => nodes_cell(a),
            None => nodes_cell(&json!({"spec": spec})),
        };
        let deps = if deps.is_empty() {
            DASH.to_string()
        } else {
            deps.iter()
                .map(|(r, c)| format!("{r} ({c})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut row = vec![
            n.clone(),
            task_phase(dag, &n).to_string(),
            alloc_cell,
            nodes,
            a.map(|a| elapsed_cell(a, ctx.now()))
                .unwrap_or_else(|| DASH.into()),
            deps,
        ];
        if ctx.verbose {
            let task = dag.pointer("/status/tasks").and_then(|t| t.get(&n));
            let why = task
                .and_then(|t| t.get("message").or_else(|| t.get("reason")))
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| a.map(crate::cmd::status::reason))
                .unwrap_or_else(|| DASH.into());
            row.push(why);
        }
        t.rows.push(row);
    }
    t
}

/// `completed/total`.
pub fn progress(dag: &Value) -> String {
    let total = steps(dag).len();
    let done = steps(dag)
        .iter()
        .filter(|(n, _, _)| task_phase(dag, n) == "Completed")
        .count();
    format!("{done}/{total}")
}

/// The DAG's phase.
pub fn dag_phase(dag: &Value) -> &str {
    s(dag, "/status/phase").unwrap_or("Pending")
}

/// The allocations of a tenant by name (for step details).
pub async fn allocs_by_name(ctx: &Ctx, ns: &str) -> HashMap<String, Value> {
    workload::list_items(ctx, "allocations", Some(ns))
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|a| (name(&a).to_string(), a))
        .collect()
}

fn summary(ctx: &Ctx, dag: &Value) -> String {
    let mut out = String::new();
    out.push_str(&format!("DAG:       {}\n", name(dag)));
    let mut st = dag_phase(dag).to_string();
    if let Some(r) = s(dag, "/status/message").or(s(dag, "/status/reason")) {
        // A reason that only repeats the phase ("Cancelled (Cancelled)") says nothing.
        if r != st {
            st.push_str(&format!(" ({r})"));
        }
    }
    out.push_str(&format!("State:     {st}\n"));
    out.push_str(&format!("Progress:  {} completed\n", progress(dag)));
    if let Some(t) = s(dag, "/status/startTime") {
        out.push_str(&format!("Started:   {t} ({} ago)\n", age_of(t, ctx.now())));
    }
    if let Some(t) = s(dag, "/status/completionTime") {
        out.push_str(&format!("Finished:  {t}\n"));
    }
    out
}

/// Runs `dag ...`.
pub async fn run(
    ctx: &mut Ctx,
    c: &DagCommand,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    match c {
        DagCommand::Submit { file, dry_run } => {
            let text = read_source(&ctx.cwd, file, stdin)?;
            let (mut m, n) = to_manifest(file, &text)?;
            let ns = if ctx.settings.tenant_source == crate::config::Source::Flag {
                ctx.tenant.clone()
            } else {
                s(&m, "/metadata/namespace")
                    .map(str::to_string)
                    .unwrap_or_else(|| ctx.tenant.clone())
            };
            m["metadata"]["namespace"] = json!(ns);
            if s(&m, "/metadata/name").is_none() {
                m["metadata"]["generateName"] = json!("dag-");
            }
            if let Some(u) = ctx.user() {
                m["metadata"]["annotations"] = json!({workload::USER_ANNOTATION: u});
            }
            let print = |out: &mut dyn Write, v: &Value| -> std::io::Result<()> {
                if ctx.output == Some(OutputFormat::Json) {
                    out.write_all(to_json(v).as_bytes())
                } else {
                    out.write_all(to_yaml(v).as_bytes())
                }
            };
            if *dry_run == Some(SubmitDryRun::Client) {
                // Offline: the server's limit is unknown, so only warn against the default.
                if let Some(msg) = dag_size_error(n, DEFAULT_MAX_DAG_SIZE) {
                    writeln!(
                        err,
                        "Warning: {msg} (the default limit; a cluster whose administrator \
                         raised it with `lattice admin config set scheduling.max_dag_size=N` \
                         or lattice-server --max-dag-size accepts it)"
                    )?;
                }
                print(out, &m)?;
                return Ok(0);
            }
            let created = ctx
                .client
                .create(
                    &collection("dags", Some(&ns)),
                    &m,
                    &WriteOptions {
                        dry_run: dry_run.is_some(),
                    },
                )
                .await
                .map_err(|e| {
                    let mut e = CliError::from_client(format!("submit DAG {file}"), e);
                    if let Some(at) = e.why.find("DAG exceeds maximum size (") {
                        // The seed's message and hint, once (the server's causes repeat it).
                        let msg = &e.why[at..];
                        let msg = msg.find(')').map_or(msg, |end| &msg[..=end]);
                        return CliError::new(msg, "").hint(format!(
                            "{} (an administrator: `lattice admin config set scheduling.max_dag_size=N`)",
                            lattice_apis::kinds::dag::DAG_SIZE_HINT
                        ));
                    } else if e.why.contains("(422)") {
                        e.hint = Some("fix the fields listed above in the DAG file".into());
                    }
                    e
                })?;
            if dry_run.is_some() {
                print(out, &created)?;
                return Ok(0);
            }
            let plural = if n == 1 { "allocation" } else { "allocations" };
            if ctx.quiet {
                writeln!(out, "{}", name(&created))?;
            } else {
                writeln!(out, "Submitted DAG {} with {n} {plural}", name(&created))?;
            }
            Ok(0)
        }
        DagCommand::Status { id, graph: g } => {
            let ns = ctx.tenant.clone();
            let dag =
                workload::get_object(ctx, "dags", "DAG", Some(&ns), id, "lattice dag list").await?;
            match ctx.output_or(OutputFormat::Table) {
                OutputFormat::Json => out.write_all(to_json(&dag).as_bytes())?,
                OutputFormat::Yaml => out.write_all(to_yaml(&dag).as_bytes())?,
                OutputFormat::Name => writeln!(out, "{}", name(&dag))?,
                _ if *g => out.write_all(graph(&dag).as_bytes())?,
                _ => {
                    let allocs = allocs_by_name(ctx, &ns).await;
                    out.write_all(summary(ctx, &dag).as_bytes())?;
                    writeln!(out)?;
                    out.write_all(step_table(ctx, &dag, &allocs).render(false).as_bytes())?;
                }
            }
            Ok(0)
        }
        DagCommand::List { no_headers } => {
            let ns = ctx.tenant.clone();
            let mut dags = workload::list_items(ctx, "dags", Some(&ns)).await?;
            workload::sort_by_creation(&mut dags);
            match ctx.output_or(OutputFormat::Table) {
                OutputFormat::Json => {
                    out.write_all(to_json(&crate::output::format::list_of(dags, "")).as_bytes())?
                }
                OutputFormat::Yaml => {
                    out.write_all(to_yaml(&crate::output::format::list_of(dags, "")).as_bytes())?
                }
                OutputFormat::Name => {
                    for d in &dags {
                        writeln!(out, "{}", name(d))?;
                    }
                }
                _ => {
                    if dags.is_empty() {
                        if !ctx.quiet {
                            writeln!(err, "No DAGs in tenant {ns:?}.")?;
                        }
                        return Ok(0);
                    }
                    let mut t = Table::new(
                        ["ID", "STATE", "ALLOCATIONS", "COMPLETED", "AGE"]
                            .iter()
                            .map(|x| x.to_string())
                            .collect(),
                    );
                    for d in &dags {
                        t.rows.push(vec![
                            name(d).to_string(),
                            dag_phase(d).to_string(),
                            steps(d).len().to_string(),
                            progress(d),
                            s(d, "/metadata/creationTimestamp")
                                .map(|c| age_of(c, ctx.now()))
                                .unwrap_or_else(|| DASH.into()),
                        ]);
                    }
                    out.write_all(t.render(*no_headers).as_bytes())?;
                }
            }
            Ok(0)
        }
        DagCommand::Cancel { id } => {
            let ns = ctx.tenant.clone();
            let dag =
                workload::get_object(ctx, "dags", "DAG", Some(&ns), id, "lattice dag list").await?;
            let p = dag_phase(&dag);
            if matches!(p, "Completed" | "Failed" | "Cancelled") {
                writeln!(out, "DAG {id} already {p}; nothing to cancel")?;
                return Ok(0);
            }
            if cancel_requested(&dag) {
                writeln!(out, "Cancel already requested for DAG {id}")?;
                return Ok(0);
            }
            ctx.client
                .merge_patch(
                    &object("dags", Some(&ns), id),
                    &cancel_patch(),
                    &WriteOptions::default(),
                )
                .await
                .map_err(|e| CliError::from_client(format!("cancel DAG {id:?}"), e))?;
            writeln!(
                out,
                "Cancel requested for DAG {id}; its unfinished allocations are cancelled"
            )?;
            Ok(0)
        }
    }
}
