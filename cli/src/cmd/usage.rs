//! `lattice usage [--tenant T | --all-tenants] [--days N]`: the soft-quota ledger —
//! node- and GPU-hours per tenant and user over the budget period (finished work from the
//! tenant's ledger, running work up to now), against the budgets.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{json, Value};

use crate::cli::UsageArgs;
use crate::cmd::workload;
use crate::errors::CliError;
use crate::output::{OutputFormat, Table};
use crate::Ctx;

/// Run `lattice usage`.
pub async fn run(ctx: &mut Ctx, args: &UsageArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    let tenants: Vec<Value> = if args.all_tenants {
        workload::list_items(ctx, "tenants", None).await?
    } else {
        let path = workload::object("tenants", None, &ctx.tenant);
        vec![ctx
            .client
            .get(&path)
            .await
            .map_err(|e| CliError::from_client(format!("get tenant {:?}", ctx.tenant), e))?]
    };
    let now = ctx.now();
    let today = now.date_naive();
    // GPU counts of the nodes, for running work (best effort: a node that cannot be read
    // counts as 1 GPU, the seed's default for unknown nodes).
    let node_gpus: BTreeMap<String, f64> = workload::list_items(ctx, "nodes", None)
        .await
        .unwrap_or_default()
        .iter()
        .filter_map(|n| {
            let name = n.pointer("/metadata/name")?.as_str()?.to_string();
            let gpus = n
                .pointer("/status/capacity/gpuCount")
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            Some((name, gpus))
        })
        .collect();
    let mut rows = Vec::new();
    for t in &tenants {
        let name = t
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let period = t
            .pointer("/spec/budgetPeriodDays")
            .and_then(Value::as_u64)
            .unwrap_or(90);
        let days = args.days.unwrap_or(period).max(1);
        let oldest = (today - chrono::Days::new(days - 1))
            .format("%Y-%m-%d")
            .to_string();
        let mut by_user: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for b in t
            .pointer("/status/usage/ledger")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let day = b["day"].as_str().unwrap_or("");
            if day < oldest.as_str() {
                continue;
            }
            let e = by_user
                .entry(b["user"].as_str().unwrap_or("unknown").to_string())
                .or_default();
            e.0 += b["nodeHours"].as_f64().unwrap_or(0.0);
            e.1 += b["gpuHours"].as_f64().unwrap_or(0.0);
        }
        // Work still running counts up to now (the seed's ledger; the scheduler's budget
        // penalty counts it too).
        let since = now - chrono::Duration::days(days as i64);
        for a in workload::list_items(ctx, "allocations", Some(name))
            .await
            .unwrap_or_default()
        {
            let phase = a.pointer("/status/phase").and_then(Value::as_str);
            if !matches!(phase, Some("Running" | "Checkpointing" | "Suspended")) {
                continue;
            }
            let Some(start) = a
                .pointer("/status/startTime")
                .and_then(Value::as_str)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            else {
                continue;
            };
            let start = start.with_timezone(&chrono::Utc).max(since);
            let hours = (now - start).num_seconds().max(0) as f64 / 3600.0;
            let nodes: Vec<&str> = a
                .pointer("/status/assignedNodes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let gpus: f64 = nodes
                .iter()
                .map(|n| node_gpus.get(*n).copied().unwrap_or(1.0))
                .sum();
            let user = a
                .pointer("/metadata/annotations/lattice.dev~1user")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            let e = by_user.entry(user.to_string()).or_default();
            e.0 += hours * nodes.len() as f64;
            e.1 += hours * gpus;
        }
        let node_budget = t
            .pointer("/spec/quota/nodeHoursBudget")
            .and_then(Value::as_f64);
        let gpu_budget = t
            .pointer("/spec/quota/gpuHoursBudget")
            .and_then(Value::as_f64);
        let (tn, tg) = by_user
            .values()
            .fold((0.0, 0.0), |acc, v| (acc.0 + v.0, acc.1 + v.1));
        rows.push(json!({
            "tenant": name,
            "days": days,
            "nodeHours": tn,
            "gpuHours": tg,
            "nodeHoursBudget": node_budget,
            "gpuHoursBudget": gpu_budget,
            "users": by_user.iter().map(|(u, (n, g))| json!({"user": u, "nodeHours": n, "gpuHours": g})).collect::<Vec<_>>(),
        }));
    }
    match ctx.output_or(OutputFormat::Table) {
        OutputFormat::Json => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        )?,
        OutputFormat::Yaml => write!(out, "{}", serde_yaml::to_string(&rows).unwrap_or_default())?,
        _ => {
            let mut table = Table::new(
                [
                    "TENANT",
                    "USER",
                    "DAYS",
                    "NODE-HOURS",
                    "GPU-HOURS",
                    "BUDGET USED",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            );
            for r in &rows {
                let frac = |v: f64, b: Option<f64>| b.filter(|b| *b > 0.0).map(|b| v / b);
                let tn = r["nodeHours"].as_f64().unwrap_or(0.0);
                let tg = r["gpuHours"].as_f64().unwrap_or(0.0);
                // The worse fraction drives the scheduler's penalty (the seed's rule).
                let budget = match (
                    frac(tg, r["gpuHoursBudget"].as_f64()),
                    frac(tn, r["nodeHoursBudget"].as_f64()),
                ) {
                    (Some(g), Some(n)) if g >= n => format!("{:.1}% (GPU-hours)", 100.0 * g),
                    (Some(_), Some(n)) => format!("{:.1}% (node-hours)", 100.0 * n),
                    (Some(f), None) | (None, Some(f)) => format!("{:.1}%", 100.0 * f),
                    (None, None) => "-".to_string(),
                };
                table.rows.push(vec![
                    r["tenant"].as_str().unwrap_or("").to_string(),
                    "(all)".into(),
                    r["days"].to_string(),
                    format!("{tn:.2}"),
                    format!("{tg:.2}"),
                    budget,
                ]);
                for u in r["users"].as_array().into_iter().flatten() {
                    table.rows.push(vec![
                        String::new(),
                        u["user"].as_str().unwrap_or("").to_string(),
                        String::new(),
                        format!("{:.2}", u["nodeHours"].as_f64().unwrap_or(0.0)),
                        format!("{:.2}", u["gpuHours"].as_f64().unwrap_or(0.0)),
                        String::new(),
                    ]);
                }
            }
            out.write_all(table.render(false).as_bytes())?;
        }
    }
    Ok(0)
}
