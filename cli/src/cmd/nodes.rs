//! `lattice nodes` and `lattice node drain|undrain|disable|enable|status`.

use std::io::Write;

use serde_json::{json, Value};

use crate::cli::{NodeCommand, NodeDrainArgs, NodesArgs};
use crate::client::WriteOptions;
use crate::cmd::workload::{self, name, object, s, StateFilter, DASH};
use crate::errors::{exit, CliError};
use crate::output::format::{human_age, list_of, to_json, to_yaml};
use crate::output::{OutputFormat, Table};
use crate::Ctx;

const NODE_STATES: [&str; 8] = [
    "unknown", "booting", "ready", "degraded", "down", "draining", "drained", "failed",
];

/// A node's state (Unknown without status).
pub fn state(n: &Value) -> &str {
    s(n, "/status/state").unwrap_or("Unknown")
}

/// True when an allocation owns the node. Work of another tenant shows as an empty
/// `status.owner` (the server hides whose it is): taken all the same.
pub fn allocated(n: &Value) -> bool {
    n.pointer("/status/owner").is_some_and(Value::is_object)
        || n.pointer("/status/allocations")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

/// GPUS cell: `4×GH200`, `4`, or a dash.
pub fn gpus_cell(n: &Value) -> String {
    let count = n
        .pointer("/status/capacity/gpuCount")
        .and_then(Value::as_u64)
        .filter(|c| *c > 0)
        .or_else(|| {
            n.pointer("/status/capacity/gpus")
                .and_then(Value::as_array)
                .map(|g| g.len() as u64)
                .filter(|c| *c > 0)
        });
    let ty = s(n, "/status/capacity/gpuType").or_else(|| s(n, "/status/capacity/gpus/0/type"));
    match (count, ty) {
        (Some(c), Some(t)) => format!("{c}×{t}"),
        (Some(c), None) => c.to_string(),
        _ => DASH.into(),
    }
}

/// The vCluster using the node (its home one when idle).
pub fn vcluster_of(n: &Value) -> Option<&str> {
    s(n, "/status/owner/vcluster").or_else(|| s(n, "/spec/homeVcluster"))
}

fn group_cell(n: &Value) -> String {
    n.pointer("/spec/topologyGroup")
        .and_then(Value::as_u64)
        .map(|g| g.to_string())
        .unwrap_or_else(|| DASH.into())
}

fn conformance_cell(n: &Value) -> String {
    s(n, "/status/conformanceFingerprint")
        .map(|f| f.trim_start_matches("sha256:").chars().take(6).collect())
        .unwrap_or_else(|| DASH.into())
}

/// Heartbeats are a stream: `status.lastHeartbeatTime` is written when the node lifecycle
/// controller changes the node's state, so it dates a lost heartbeat (Degraded, Down);
/// a node in any other state is heard from now.
fn heartbeat_cell(ctx: &Ctx, n: &Value) -> String {
    let last = workload::time(n, "/status/lastHeartbeatTime");
    match (state(n), last) {
        ("Degraded" | "Down" | "Unknown", Some(t)) => {
            format!("{} ago", human_age((ctx.now() - t).num_seconds()))
        }
        ("Degraded" | "Down" | "Unknown", None) => DASH.into(),
        _ => "live".into(),
    }
}

/// Filters for `nodes`.
pub fn keep(ctx: &Ctx, states: &StateFilter, n: &Value) -> bool {
    let st = state(n);
    let state_ok = states.is_empty()
        || states.keeps(st)
        || (states.keeps("allocated") && allocated(n))
        || (states.keeps("idle") && st == "Ready" && !allocated(n));
    state_ok
        && ctx
            .vcluster
            .as_deref()
            .is_none_or(|v| vcluster_of(n) == Some(v) || s(n, "/spec/homeVcluster") == Some(v))
}

/// Parses `--state` for nodes.
pub fn node_states(values: &[String]) -> Result<StateFilter, CliError> {
    let mut allowed: Vec<&str> = NODE_STATES.to_vec();
    allowed.extend(["allocated", "idle"]);
    StateFilter::parse(values, &allowed, &[])
}

/// The nodes table.
pub fn table(ctx: &Ctx, nodes: &[Value], wide: bool) -> Table {
    let mut h = vec![
        "NODE",
        "STATE",
        "GPUS",
        "VCLUSTER",
        "TENANT",
        "GROUP",
        "CONFORMANCE",
    ];
    if wide {
        h.extend(["CPUS", "MEMORY", "ALLOCATION", "HEARTBEAT", "DRAIN"]);
    }
    let mut t = Table::new(h.iter().map(|x| x.to_string()).collect());
    for n in nodes {
        let mut r = vec![
            name(n).to_string(),
            state(n).to_string(),
            gpus_cell(n),
            vcluster_of(n).unwrap_or(DASH).to_string(),
            s(n, "/status/owner/tenant").unwrap_or(DASH).to_string(),
            group_cell(n),
            conformance_cell(n),
        ];
        if wide {
            r.push(
                n.pointer("/status/capacity/cpuCores")
                    .and_then(Value::as_u64)
                    .filter(|c| *c > 0)
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| DASH.into()),
            );
            r.push(
                n.pointer("/status/capacity/memoryGb")
                    .and_then(Value::as_u64)
                    .filter(|c| *c > 0)
                    .map(|c| format!("{c}GB"))
                    .unwrap_or_else(|| DASH.into()),
            );
            r.push(s(n, "/status/owner/allocation").unwrap_or(DASH).to_string());
            r.push(heartbeat_cell(ctx, n));
            r.push(match n.pointer("/spec/drain") {
                Some(d) if d.is_object() => {
                    let mut x = d
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("requested")
                        .to_string();
                    if d.get("urgent").and_then(Value::as_bool) == Some(true) {
                        x.push_str(" (urgent)");
                    }
                    x
                }
                _ => DASH.into(),
            });
        }
        t.rows.push(r);
    }
    t
}

/// The detail view of one node.
pub fn detail(ctx: &Ctx, n: &Value) -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut add = |k: &str, v: String| rows.push((k.to_string(), v));
    add("Node", name(n).to_string());
    let mut st = state(n).to_string();
    if let Some(t) = workload::time(n, "/status/lastTransitionTime") {
        st.push_str(&format!(
            " (for {})",
            human_age((ctx.now() - t).num_seconds())
        ));
    }
    add("State", st);
    if let Some(r) = s(n, "/status/reason") {
        let mut r = r.to_string();
        if let Some(m) = s(n, "/status/message") {
            r.push_str(&format!(": {m}"));
        }
        add("Reason", r);
    }
    add("GPUs", gpus_cell(n));
    if let Some(c) = n
        .pointer("/status/capacity/cpuCores")
        .and_then(Value::as_u64)
    {
        add("CPU cores", c.to_string());
    }
    if let Some(m) = n
        .pointer("/status/capacity/memoryGb")
        .and_then(Value::as_u64)
    {
        add("Memory", format!("{m} GB"));
    }
    add("Group", group_cell(n));
    let home = s(n, "/spec/homeVcluster");
    let vc = match (s(n, "/status/owner/vcluster"), home) {
        (Some(v), Some(h)) if v != h => format!("{v} (borrowed from {h})"),
        (Some(v), _) => v.to_string(),
        (None, Some(h)) => format!("{h} (home, idle)"),
        (None, None) => DASH.into(),
    };
    add("vCluster", vc);
    add(
        "Tenant",
        s(n, "/status/owner/tenant").unwrap_or(DASH).to_string(),
    );
    add(
        "Allocation",
        s(n, "/status/owner/allocation").unwrap_or(DASH).to_string(),
    );
    add(
        "Conformance",
        s(n, "/status/conformanceFingerprint")
            .unwrap_or(DASH)
            .to_string(),
    );
    let drain = match n.pointer("/spec/drain") {
        Some(d) if d.is_object() => {
            let mut x = "requested".to_string();
            if let Some(r) = d.get("reason").and_then(Value::as_str) {
                x.push_str(&format!(" (reason: {r})"));
            }
            if d.get("urgent").and_then(Value::as_bool) == Some(true) {
                x.push_str(", urgent");
            }
            x
        }
        _ => "no".into(),
    };
    add("Drain", drain);
    add(
        "Disabled",
        if n.pointer("/spec/disabled").and_then(Value::as_bool) == Some(true) {
            "yes".into()
        } else {
            "no".into()
        },
    );
    add("Heartbeat", heartbeat_cell(ctx, n));
    if let Some(v) = s(n, "/status/agent/version") {
        let mut a = v.to_string();
        if let Some(addr) = s(n, "/status/agent/address") {
            a.push_str(&format!(" at {addr}"));
        }
        add("Agent", a);
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{:<width$}{v}\n", format!("{k}:")));
    }
    if let Some(cs) = n.pointer("/status/conditions").and_then(Value::as_array) {
        if !cs.is_empty() {
            out.push_str("Conditions:\n");
            let mut t = Table::new(
                ["TYPE", "STATUS", "REASON", "MESSAGE"]
                    .iter()
                    .map(|x| x.to_string())
                    .collect(),
            );
            for c in cs {
                let g = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or(DASH).to_string();
                t.rows
                    .push(vec![g("type"), g("status"), g("reason"), g("message")]);
            }
            for line in t.render(false).lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    out
}

fn print_one(ctx: &Ctx, n: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    match ctx.output_or(OutputFormat::Table) {
        OutputFormat::Json => out.write_all(to_json(n).as_bytes()),
        OutputFormat::Yaml => out.write_all(to_yaml(n).as_bytes()),
        OutputFormat::Name => writeln!(out, "{}", name(n)),
        OutputFormat::Wide => out.write_all(
            table(ctx, std::slice::from_ref(n), true)
                .render(false)
                .as_bytes(),
        ),
        OutputFormat::Table => out.write_all(detail(ctx, n).as_bytes()),
    }
}

async fn get_node(ctx: &Ctx, id: &str) -> Result<Value, CliError> {
    workload::get_object(ctx, "nodes", "node", None, id, "lattice nodes").await
}

/// Runs `nodes`.
pub async fn list(
    ctx: &mut Ctx,
    args: &NodesArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let states = node_states(&args.state)?;
    if args.ids.len() == 1 {
        let n = get_node(ctx, &args.ids[0]).await?;
        print_one(ctx, &n, out)?;
        return Ok(0);
    }
    let mut code = 0;
    let mut nodes = Vec::new();
    if args.ids.is_empty() {
        nodes = workload::list_items(ctx, "nodes", None).await?;
    } else {
        for id in &args.ids {
            match get_node(ctx, id).await {
                Ok(n) => nodes.push(n),
                Err(e) if e.exit_code == exit::NOT_FOUND => {
                    writeln!(err, "{e}")?;
                    code = exit::NOT_FOUND;
                }
                Err(e) => return Err(e),
            }
        }
    }
    nodes.retain(|n| keep(ctx, &states, n));
    nodes.sort_by(|a, b| name(a).cmp(name(b)));
    match ctx.output_or(OutputFormat::Table) {
        OutputFormat::Json => out.write_all(to_json(&list_of(nodes, "")).as_bytes())?,
        OutputFormat::Yaml => out.write_all(to_yaml(&list_of(nodes, "")).as_bytes())?,
        OutputFormat::Name => {
            for n in &nodes {
                writeln!(out, "{}", name(n))?;
            }
        }
        f => {
            if nodes.is_empty() {
                if !ctx.quiet {
                    writeln!(err, "No nodes found.")?;
                }
            } else {
                out.write_all(
                    table(ctx, &nodes, f == OutputFormat::Wide)
                        .render(args.no_headers)
                        .as_bytes(),
                )?;
            }
        }
    }
    Ok(code)
}

async fn patch(ctx: &Ctx, id: &str, what: &str, p: Value) -> Result<Value, CliError> {
    // Read first: a clear "not found" instead of a patch that creates nothing.
    get_node(ctx, id).await?;
    ctx.client
        .merge_patch(&object("nodes", None, id), &p, &WriteOptions::default())
        .await
        .map_err(|e| CliError::from_client(format!("{what} node {id:?}"), e))
}

/// `node drain`.
pub async fn drain(ctx: &Ctx, a: &NodeDrainArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    let mut d = serde_json::Map::new();
    if let Some(r) = a.reason.as_deref().filter(|r| !r.is_empty()) {
        d.insert("reason".into(), json!(r));
    }
    if a.urgent {
        d.insert("urgent".into(), json!(true));
    }
    patch(ctx, &a.id, "drain", json!({"spec": {"drain": d}})).await?;
    let mut line = format!("Drain requested for node {}", a.id);
    match (a.urgent, &a.reason) {
        (true, Some(r)) => line.push_str(&format!(" (urgent; reason: {r})")),
        (true, None) => line.push_str(" (urgent)"),
        (false, Some(r)) => line.push_str(&format!(" (reason: {r})")),
        (false, None) => {}
    }
    writeln!(out, "{line}")?;
    if !ctx.quiet {
        writeln!(
            out,
            "It goes Draining, then Drained once its allocations finish; `lattice nodes {}` shows the state.",
            a.id
        )?;
    }
    Ok(0)
}

/// `node undrain` (only from Drained).
pub async fn undrain(ctx: &Ctx, id: &str, out: &mut dyn Write) -> Result<i32, CliError> {
    let n = get_node(ctx, id).await?;
    let st = state(&n);
    if st != "Drained" {
        let mut e = CliError::new(
            format!("undrain node {id}"),
            format!("the node is {st}, not Drained"),
        );
        let running: Vec<String> = n
            .pointer("/status/allocations")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if !running.is_empty() {
            e = e.detail(format!("Running allocations: {}", running.join(", ")));
        }
        e = e.hint(if st == "Draining" {
            "Undrain only works when the node is in Drained state. The node is still Draining \
             (allocations running): wait for them to complete or cancel them first."
                .to_string()
        } else {
            format!(
                "Undrain only works when the node is in Drained state; a {st} node has nothing \
                 to undrain{}",
                if n.pointer("/spec/disabled").and_then(Value::as_bool) == Some(true) {
                    " (it is disabled: use `lattice node enable`)"
                } else {
                    ""
                }
            )
        });
        return Err(e);
    }
    patch(ctx, id, "undrain", json!({"spec": {"drain": null}})).await?;
    writeln!(out, "Undrained node {id}; it returns to Ready")?;
    Ok(0)
}

/// Runs `node ...`.
pub async fn node(
    ctx: &mut Ctx,
    c: &NodeCommand,
    out: &mut dyn Write,
    _err: &mut dyn Write,
) -> Result<i32, CliError> {
    match c {
        NodeCommand::Drain(a) => drain(ctx, a, out).await,
        NodeCommand::Undrain(a) => undrain(ctx, &a.id, out).await,
        NodeCommand::Disable(a) => {
            patch(ctx, &a.id, "disable", json!({"spec": {"disabled": true}})).await?;
            writeln!(
                out,
                "Disabled node {}; it goes Down and takes no work",
                a.id
            )?;
            Ok(0)
        }
        NodeCommand::Enable(a) => {
            patch(ctx, &a.id, "enable", json!({"spec": {"disabled": null}})).await?;
            writeln!(out, "Enabled node {}", a.id)?;
            Ok(0)
        }
        NodeCommand::Status(a) => {
            let n = get_node(ctx, &a.id).await?;
            print_one(ctx, &n, out)?;
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_taken_by_another_tenant_is_not_idle() {
        // What the server shows a person outside the owning tenant.
        let hidden = json!({"status": {"state": "Ready", "owner": {}}});
        assert!(allocated(&hidden));
        let mine = json!({"status": {"state": "Ready",
            "owner": {"tenant": "t1", "allocation": "a1"}}});
        assert!(allocated(&mine));
        for free in [
            json!({"status": {"state": "Ready"}}),
            json!({"status": {"state": "Ready", "owner": null, "allocations": []}}),
        ] {
            assert!(!allocated(&free), "{free}");
        }
    }
}
