//! `lattice admin tenant|vcluster|config|raft` (`pki` is in `cmd::pki`).

use std::io::Write;

use lattice_apis::kinds::vcluster::{known_weight_names, weight_term};
use serde_json::{json, Map, Value};

use crate::cli::{
    AdminCommand, AdminConfigCommand, RaftCommand, TenantCommand, TenantFields, VClusterCommand,
    VClusterConfigFields, WeightFields,
};
use crate::client::WriteOptions;
use crate::cmd::workload::{self, collection, name, object, s, DASH};
use crate::config::{self, Env, FlagValues};
use crate::errors::{exit, CliError};
use crate::output::format::{age_of, list_of, to_json, to_yaml};
use crate::output::{OutputFormat, Table};
use crate::Ctx;

fn num(v: Option<&Value>) -> String {
    match v {
        Some(Value::Number(n)) => n.to_string(),
        _ => DASH.to_string(),
    }
}

fn quota_of(f: &TenantFields) -> Map<String, Value> {
    let mut q = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            q.insert(k.into(), v);
        }
    };
    put("maxNodes", f.max_nodes.map(|v| json!(v)));
    put(
        "maxConcurrentAllocations",
        f.max_concurrent_allocations.map(|v| json!(v)),
    );
    put("sensitivePoolSize", f.sensitive_pool_size.map(|v| json!(v)));
    put("gpuHoursBudget", f.gpu_hours_budget.map(|v| json!(v)));
    put("nodeHoursBudget", f.node_hours_budget.map(|v| json!(v)));
    put("fairShareTarget", f.fair_share_target.map(|v| json!(v)));
    put("burstAllowance", f.burst_allowance.map(|v| json!(v)));
    q
}

fn tenant_spec(f: &TenantFields) -> Map<String, Value> {
    let mut spec = Map::new();
    if let Some(d) = &f.display_name {
        spec.insert("displayName".into(), json!(d));
    }
    let q = quota_of(f);
    if !q.is_empty() {
        spec.insert("quota".into(), Value::Object(q));
    }
    if let Some(d) = f.budget_period_days {
        spec.insert("budgetPeriodDays".into(), json!(d));
    }
    if let Some(d) = f.max_network_domains {
        spec.insert("maxNetworkDomains".into(), json!(d));
    }
    if !f.admins.is_empty() {
        spec.insert("admins".into(), json!(f.admins));
    }
    spec
}

fn write_err(what: String, e: crate::client::ClientError) -> CliError {
    let mut err = CliError::from_client(what, e);
    if err.why.contains("(422)") {
        err.hint = Some("fix the values listed above and run the command again".into());
    }
    err
}

fn print_obj(ctx: &Ctx, out: &mut dyn Write, v: &Value) -> std::io::Result<bool> {
    match ctx.output {
        Some(OutputFormat::Json) => out.write_all(to_json(v).as_bytes()).map(|_| true),
        Some(OutputFormat::Yaml) => out.write_all(to_yaml(v).as_bytes()).map(|_| true),
        _ => Ok(false),
    }
}

fn kv_block(rows: &[(String, String)]) -> String {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
    rows.iter()
        .map(|(k, v)| format!("{:<width$}{v}\n", format!("{k}:")))
        .collect()
}

/// Quota against usage: (label, used, limit).
fn quota_rows(t: &Value) -> Vec<(String, String, String)> {
    let q = |k: &str| num(t.pointer(&format!("/spec/quota/{k}")));
    let u = |k: &str| num(t.pointer(&format!("/status/usage/{k}")));
    vec![
        ("Nodes (hard)".into(), u("nodes"), q("maxNodes")),
        (
            "Running allocations (hard)".into(),
            u("runningAllocations"),
            q("maxConcurrentAllocations"),
        ),
        (
            "Sensitive nodes (hard)".into(),
            u("sensitiveNodes"),
            q("sensitivePoolSize"),
        ),
        (
            "GPU-hours (soft)".into(),
            u("gpuHoursUsed"),
            q("gpuHoursBudget"),
        ),
        (
            "Node-hours (soft)".into(),
            u("nodeHoursUsed"),
            q("nodeHoursBudget"),
        ),
        (
            "Fair share target".into(),
            DASH.into(),
            q("fairShareTarget"),
        ),
        ("Burst allowance".into(), DASH.into(), q("burstAllowance")),
        (
            "Network domains".into(),
            u("networkDomains"),
            num(t.pointer("/spec/maxNetworkDomains")),
        ),
    ]
}

async fn tenant(
    ctx: &Ctx,
    c: &TenantCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    match c {
        TenantCommand::Create(f) => {
            let obj = json!({
                "apiVersion": crate::kinds::GROUP_VERSION,
                "kind": "Tenant",
                "metadata": {"name": f.name},
                "spec": tenant_spec(f),
            });
            let v = ctx
                .client
                .create(&collection("tenants", None), &obj, &WriteOptions::default())
                .await
                .map_err(|e| write_err(format!("create tenant {:?}", f.name), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(out, "Created tenant {}", name(&v))?;
            }
            Ok(0)
        }
        TenantCommand::Update(f) => {
            workload::get_object(
                ctx,
                "tenants",
                "tenant",
                None,
                &f.name,
                "lattice admin tenant list",
            )
            .await?;
            let spec = tenant_spec(f);
            if spec.is_empty() {
                return Err(CliError::new(format!("update tenant {:?}", f.name), "nothing to change")
                    .hint("pass at least one of --max-nodes, --max-concurrent-allocations, --gpu-hours-budget, --display-name, ...")
                    .exit_code(exit::USAGE));
            }
            let v = ctx
                .client
                .merge_patch(
                    &object("tenants", None, &f.name),
                    &json!({"spec": spec}),
                    &WriteOptions::default(),
                )
                .await
                .map_err(|e| write_err(format!("update tenant {:?}", f.name), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(out, "Updated tenant {}", f.name)?;
            }
            Ok(0)
        }
        TenantCommand::List { no_headers } => {
            let mut items = workload::list_items(ctx, "tenants", None).await?;
            items.sort_by(|a, b| name(a).cmp(name(b)));
            if print_obj(ctx, out, &list_of(items.clone(), ""))? {
                return Ok(0);
            }
            if items.is_empty() {
                if !ctx.quiet {
                    writeln!(err, "No tenants.")?;
                }
                return Ok(0);
            }
            let mut t = Table::new(
                [
                    "NAME",
                    "DISPLAY NAME",
                    "NODES",
                    "MAX NODES",
                    "RUNNING",
                    "PENDING",
                    "AGE",
                ]
                .iter()
                .map(|x| x.to_string())
                .collect(),
            );
            for a in &items {
                t.rows.push(vec![
                    name(a).to_string(),
                    s(a, "/spec/displayName").unwrap_or(DASH).to_string(),
                    num(a.pointer("/status/usage/nodes")),
                    num(a.pointer("/spec/quota/maxNodes")),
                    num(a.pointer("/status/usage/runningAllocations")),
                    num(a.pointer("/status/usage/pendingAllocations")),
                    s(a, "/metadata/creationTimestamp")
                        .map(|c| age_of(c, ctx.now()))
                        .unwrap_or_else(|| DASH.into()),
                ]);
            }
            out.write_all(t.render(*no_headers).as_bytes())?;
            Ok(0)
        }
        TenantCommand::Show {
            name: n,
            name_flag,
            quotas,
        } => {
            let Some(n) = n.clone().or_else(|| name_flag.clone()) else {
                return Err(CliError::new("admin tenant show", "no tenant given")
                    .hint("lattice admin tenant show NAME")
                    .exit_code(exit::USAGE));
            };
            let t = workload::get_object(
                ctx,
                "tenants",
                "tenant",
                None,
                &n,
                "lattice admin tenant list",
            )
            .await?;
            if print_obj(ctx, out, &t)? {
                return Ok(0);
            }
            if !quotas {
                let mut rows = vec![("Tenant".to_string(), n.clone())];
                if let Some(d) = s(&t, "/spec/displayName") {
                    rows.push(("Display name".into(), d.into()));
                }
                rows.push((
                    "Budget period".into(),
                    t.pointer("/spec/budgetPeriodDays")
                        .map(|d| format!("{d} days"))
                        .unwrap_or_else(|| DASH.into()),
                ));
                let admins: Vec<&str> = t
                    .pointer("/spec/admins")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                rows.push((
                    "Admins".into(),
                    if admins.is_empty() {
                        DASH.into()
                    } else {
                        admins.join(", ")
                    },
                ));
                out.write_all(kv_block(&rows).as_bytes())?;
                writeln!(out)?;
            }
            let mut q = Table::new(
                ["QUOTA", "USED", "LIMIT"]
                    .iter()
                    .map(|x| x.to_string())
                    .collect(),
            );
            for (k, u, l) in quota_rows(&t) {
                q.rows
                    .push(vec![k, u, if l == DASH { "unlimited".into() } else { l }]);
            }
            out.write_all(q.render(false).as_bytes())?;
            Ok(0)
        }
    }
}

fn weights_of(w: &WeightFields) -> Result<Map<String, Value>, CliError> {
    let mut m = Map::new();
    // `--weight NAME=VALUE`: any registered term (lattice_apis' WEIGHT_TERMS), so a term
    // added to the scheduler needs no flag of its own here.
    let mut named = Vec::new();
    for arg in &w.weight {
        let bad = |why: String| {
            CliError::new(format!("--weight {arg}"), why)
                .hint("pass NAME=VALUE, e.g. --weight waitTime=0.2")
                .exit_code(exit::USAGE)
        };
        let (name, value) = arg
            .split_once('=')
            .ok_or_else(|| bad("expected NAME=VALUE".into()))?;
        let term = weight_term(name.trim()).ok_or_else(|| {
            bad(format!(
                "{name:?} is not a weight; the weights are: {}",
                known_weight_names()
            ))
        })?;
        let value: f64 = value
            .trim()
            .parse()
            .map_err(|_| bad(format!("{value:?} is not a number")))?;
        named.push((term.name, Some(value)));
    }
    for (k, v) in [
        ("priority", w.priority),
        ("waitTime", w.wait_time),
        ("fairShare", w.fair_share),
        ("topology", w.topology),
        ("dataReadiness", w.data_readiness),
        ("backlog", w.backlog),
        ("energy", w.energy),
        ("checkpointEfficiency", w.checkpoint_efficiency),
        ("conformance", w.conformance),
    ]
    .into_iter()
    .chain(named)
    {
        if let Some(v) = v {
            if !(0.0..=1.0).contains(&v) || !v.is_finite() {
                return Err(CliError::new(
                    format!("--{} {v}", kebab(k)),
                    "a weight must be between 0 and 1",
                )
                .hint("weights are the wᵢ of Score(j) = Σ wᵢ·fᵢ(j); e.g. --priority=0.20")
                .exit_code(exit::USAGE));
            }
            m.insert(k.into(), json!(v));
        }
    }
    Ok(m)
}

fn kebab(k: &str) -> String {
    let mut o = String::new();
    for c in k.chars() {
        if c.is_ascii_uppercase() {
            o.push('-');
            o.push(c.to_ascii_lowercase());
        } else {
            o.push(c);
        }
    }
    o
}

fn config_spec(c: &VClusterConfigFields) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(v) = &c.profile {
        m.insert("profile".into(), json!(v));
    }
    if let Some(v) = &c.cycle_interval {
        m.insert("cycleInterval".into(), json!(v));
    }
    if let Some(v) = c.backfill_depth {
        m.insert("backfillDepth".into(), json!(v));
    }
    if let Some(v) = &c.backfill_order {
        m.insert("backfillOrder".into(), json!(v));
    }
    let mut p = Map::new();
    for (k, v) in [
        ("estimator", &c.runtime_estimator),
        ("correction", &c.prediction_correction),
        ("guaranteeAfter", &c.guarantee_after),
    ] {
        if let Some(v) = v {
            p.insert(k.into(), json!(v));
        }
    }
    if !p.is_empty() {
        m.insert("runtimePrediction".into(), Value::Object(p));
    }
    if let Some(v) = &c.default_walltime {
        m.insert("defaultWalltime".into(), json!(v));
    }
    if let Some(v) = &c.max_walltime {
        m.insert("maxWalltime".into(), json!(v));
    }
    if let Some(v) = &c.description {
        m.insert("description".into(), json!(v));
    }
    if !c.home_nodes.is_empty() {
        m.insert("homeNodes".into(), json!(c.home_nodes));
    }
    if let Some(v) = &c.preemption {
        m.insert("preemption".into(), json!({"mode": v}));
    }
    let mut b = Map::new();
    if let Some(v) = c.allow_lend {
        b.insert("allowLend".into(), json!(v));
    }
    if let Some(v) = c.allow_borrow {
        b.insert("allowBorrow".into(), json!(v));
    }
    if !b.is_empty() {
        m.insert("borrowing".into(), Value::Object(b));
    }
    m
}

/// The backfill order `admin vcluster show` prints: the spec's (defaulted at admission
/// for hpc-backfill), `-` where the scheduler type does not backfill.
fn backfill_order(v: &Value, st: Option<lattice_apis::SchedulerType>) -> String {
    match s(v, "/spec/backfillOrder") {
        Some(o) => o.to_string(),
        None if st == Some(lattice_apis::SchedulerType::HpcBackfill) => "shortest (default)".into(),
        None => DASH.into(),
    }
}

/// One line on runtime prediction: the estimator, the correction of expired predictions,
/// what reservations wait for and when a head job gets EASY's guarantee, e.g.
/// `user-fraction2 (expired: gradual; reservations wait for walltimes; head guaranteed
/// after 66h)`.
fn runtime_prediction(v: &Value, st: Option<lattice_apis::SchedulerType>) -> String {
    if st != Some(lattice_apis::SchedulerType::HpcBackfill) {
        return DASH.into();
    }
    let p = |k: &str| s(v, &format!("/spec/runtimePrediction/{k}"));
    // Unset fields are hpc-backfill's defaults (what the scheduler runs).
    match p("estimator").unwrap_or("user-fraction2") {
        "none" => "off (walltimes)".into(),
        e => format!(
            "{e} (expired: {}; reservations wait for {}; head guaranteed after {})",
            p("correction").unwrap_or("gradual"),
            match p("runningEnds") {
                Some("predicted") => "predicted ends",
                _ => "walltimes",
            },
            p("guaranteeAfter").unwrap_or("66h"),
        ),
    }
}

/// Effective weights: the spec's, else the profile's (from `lattice-apis`).
fn effective_weights(v: &Value) -> Vec<(String, f64, bool)> {
    use lattice_apis::{SchedulerType, WeightProfile};
    let profile: Option<WeightProfile> = v
        .pointer("/spec/profile")
        .and_then(|p| serde_json::from_value(p.clone()).ok())
        .or_else(|| {
            v.pointer("/spec/schedulerType")
                .and_then(|p| serde_json::from_value::<SchedulerType>(p.clone()).ok())
                .map(|s| s.default_profile())
        });
    let defaults = profile.map(|p| p.weights()).unwrap_or_default();
    lattice_apis::kinds::vcluster::WEIGHT_TERMS
        .iter()
        .map(|t| (t.name, defaults.get(t.name).unwrap_or(0.0)))
        .map(|(k, d)| {
            match v
                .pointer(&format!("/spec/weights/{k}"))
                .and_then(Value::as_f64)
            {
                Some(x) => (k.to_string(), x, true),
                None => (k.to_string(), d, false),
            }
        })
        .collect()
}

async fn vcluster(
    ctx: &Ctx,
    c: &VClusterCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let ns = ctx.tenant.clone();
    match c {
        VClusterCommand::Create {
            name: n,
            scheduler,
            config,
            weights,
        } => {
            let mut spec = config_spec(config);
            spec.insert("schedulerType".into(), json!(scheduler));
            let w = weights_of(weights)?;
            if !w.is_empty() {
                spec.insert("weights".into(), Value::Object(w));
            }
            let obj = json!({
                "apiVersion": crate::kinds::GROUP_VERSION,
                "kind": "VCluster",
                "metadata": {"name": n, "namespace": ns},
                "spec": spec,
            });
            let v = ctx
                .client
                .create(
                    &collection("vclusters", Some(&ns)),
                    &obj,
                    &WriteOptions::default(),
                )
                .await
                .map_err(|e| write_err(format!("create vCluster {n:?} in tenant {ns:?}"), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(out, "Created vCluster {} in tenant {ns}", name(&v))?;
            }
            Ok(0)
        }
        VClusterCommand::SetWeights { name: n, weights } => {
            let w = weights_of(weights)?;
            if w.is_empty() {
                return Err(CliError::new(
                    format!("set weights of vCluster {n:?}"),
                    "no weight given",
                )
                .hint("pass e.g. --priority=0.20 --wait-time=0.20 (--help lists all nine)")
                .exit_code(exit::USAGE));
            }
            workload::get_object(
                ctx,
                "vclusters",
                "vCluster",
                Some(&ns),
                n,
                "lattice admin vcluster list",
            )
            .await?;
            let v = ctx
                .client
                .merge_patch(
                    &object("vclusters", Some(&ns), n),
                    &json!({"spec": {"weights": w}}),
                    &WriteOptions::default(),
                )
                .await
                .map_err(|e| write_err(format!("set weights of vCluster {n:?}"), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(out, "Updated weights of vCluster {n}")?;
            }
            Ok(0)
        }
        VClusterCommand::SetConfig { name: n, config } => {
            let spec = config_spec(config);
            if spec.is_empty() {
                return Err(CliError::new(
                    format!("set config of vCluster {n:?}"),
                    "nothing to change",
                )
                .hint("pass e.g. --cycle-interval=15s or --max-walltime=72h")
                .exit_code(exit::USAGE));
            }
            workload::get_object(
                ctx,
                "vclusters",
                "vCluster",
                Some(&ns),
                n,
                "lattice admin vcluster list",
            )
            .await?;
            let v = ctx
                .client
                .merge_patch(
                    &object("vclusters", Some(&ns), n),
                    &json!({"spec": spec}),
                    &WriteOptions::default(),
                )
                .await
                .map_err(|e| write_err(format!("set config of vCluster {n:?}"), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(out, "Updated vCluster {n}")?;
            }
            Ok(0)
        }
        VClusterCommand::Show { name: n, name_flag } => {
            let Some(n) = n.clone().or_else(|| name_flag.clone()) else {
                return Err(CliError::new("admin vcluster show", "no vCluster given")
                    .hint("lattice admin vcluster show NAME [-t TENANT]")
                    .exit_code(exit::USAGE));
            };
            let v = workload::get_object(
                ctx,
                "vclusters",
                "vCluster",
                Some(&ns),
                &n,
                "lattice admin vcluster list",
            )
            .await?;
            if print_obj(ctx, out, &v)? {
                return Ok(0);
            }
            let g = |p: &str| s(&v, p).unwrap_or(DASH).to_string();
            let sched = g("/spec/schedulerType");
            let st: Option<lattice_apis::SchedulerType> = v
                .pointer("/spec/schedulerType")
                .and_then(|p| serde_json::from_value(p.clone()).ok());
            let with_default = |p: &str, d: Option<String>| match s(&v, p) {
                Some(x) => x.to_string(),
                None => d
                    .map(|d| format!("{d} (default)"))
                    .unwrap_or_else(|| DASH.into()),
            };
            let rows = vec![
                ("vCluster".to_string(), n.clone()),
                ("Tenant".into(), ns.clone()),
                ("Scheduler".into(), sched),
                (
                    "Profile".into(),
                    with_default(
                        "/spec/profile",
                        st.and_then(|t| serde_json::to_value(t.default_profile()).ok())
                            .and_then(|p| p.as_str().map(str::to_string)),
                    ),
                ),
                (
                    "Cycle interval".into(),
                    with_default(
                        "/spec/cycleInterval",
                        st.map(|t| t.default_cycle_interval().to_string()),
                    ),
                ),
                (
                    "Backfill depth".into(),
                    v.pointer("/spec/backfillDepth")
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| {
                            st.map(|t| format!("{} (default)", t.default_backfill_depth()))
                                .unwrap_or_else(|| DASH.into())
                        }),
                ),
                ("Backfill order".into(), backfill_order(&v, st)),
                ("Runtime prediction".into(), runtime_prediction(&v, st)),
                (
                    "Preemption".into(),
                    with_default(
                        "/spec/preemption/mode",
                        st.and_then(|t| serde_json::to_value(t.default_preemption()).ok())
                            .and_then(|p| p.as_str().map(str::to_string)),
                    ),
                ),
                ("Default walltime".into(), g("/spec/defaultWalltime")),
                ("Max walltime".into(), g("/spec/maxWalltime")),
                (
                    "Nodes".into(),
                    format!(
                        "{} home, {} idle, {} borrowed, {} lent",
                        num(v.pointer("/status/nodes")),
                        num(v.pointer("/status/idleNodes")),
                        num(v.pointer("/status/borrowedNodes")),
                        num(v.pointer("/status/lentNodes"))
                    ),
                ),
                (
                    "Queue".into(),
                    format!(
                        "{} pending, {} running",
                        num(v.pointer("/status/pendingAllocations")),
                        num(v.pointer("/status/runningAllocations"))
                    ),
                ),
            ];
            out.write_all(kv_block(&rows).as_bytes())?;
            writeln!(out)?;
            let mut t = Table::new(
                ["WEIGHT", "VALUE", "SOURCE"]
                    .iter()
                    .map(|x| x.to_string())
                    .collect(),
            );
            for (i, (k, w, set)) in effective_weights(&v).into_iter().enumerate() {
                t.rows.push(vec![
                    format!("w{} {}", i + 1, kebab(&k)),
                    format!("{w:.2}"),
                    if set { "set".into() } else { "profile".into() },
                ]);
            }
            out.write_all(t.render(false).as_bytes())?;
            Ok(0)
        }
        VClusterCommand::List { no_headers } => {
            let tenant = ctx.tenant_explicit().then(|| ns.clone());
            let mut items = workload::list_items(ctx, "vclusters", tenant.as_deref()).await?;
            items.sort_by(|a, b| {
                s(a, "/metadata/namespace")
                    .cmp(&s(b, "/metadata/namespace"))
                    .then_with(|| name(a).cmp(name(b)))
            });
            if print_obj(ctx, out, &list_of(items.clone(), ""))? {
                return Ok(0);
            }
            if items.is_empty() {
                if !ctx.quiet {
                    writeln!(err, "No vClusters.")?;
                }
                return Ok(0);
            }
            let mut t = Table::new(
                [
                    "NAME",
                    "TENANT",
                    "SCHEDULER",
                    "NODES",
                    "IDLE",
                    "PENDING",
                    "RUNNING",
                    "AGE",
                ]
                .iter()
                .map(|x| x.to_string())
                .collect(),
            );
            for a in &items {
                t.rows.push(vec![
                    name(a).to_string(),
                    s(a, "/metadata/namespace").unwrap_or(DASH).to_string(),
                    s(a, "/spec/schedulerType").unwrap_or(DASH).to_string(),
                    num(a.pointer("/status/nodes")),
                    num(a.pointer("/status/idleNodes")),
                    num(a.pointer("/status/pendingAllocations")),
                    num(a.pointer("/status/runningAllocations")),
                    s(a, "/metadata/creationTimestamp")
                        .map(|c| age_of(c, ctx.now()))
                        .unwrap_or_else(|| DASH.into()),
                ]);
            }
            out.write_all(t.render(*no_headers).as_bytes())?;
            Ok(0)
        }
    }
}

/// `admin config get|set` of keys that are not cluster settings: dotted keys in the CLI
/// config file.
pub fn config(
    c: &AdminConfigCommand,
    flags: &FlagValues,
    env: &Env,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let Some(path) = config::config_path(flags.config.as_deref(), env) else {
        return Err(CliError::new("admin config", "no config file location")
            .hint("set HOME, XDG_CONFIG_HOME or pass --config PATH"));
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(CliError::new(
                format!("read {}", path.display()),
                e.to_string(),
            ))
        }
    };
    let mut doc: serde_yaml::Value = if text.trim().is_empty() {
        serde_yaml::Value::Mapping(Default::default())
    } else {
        serde_yaml::from_str(&text).map_err(|e| {
            CliError::new(format!("read {}", path.display()), e.to_string())
                .hint("fix the YAML, or remove the file")
        })?
    };
    match c {
        AdminConfigCommand::Get { key } => {
            let Some(key) = key else {
                let s = serde_yaml::to_string(&redact(doc)).unwrap_or_default();
                out.write_all(if s.trim() == "{}" { b"" } else { s.as_bytes() })?;
                return Ok(0);
            };
            let mut cur = &doc;
            for part in key.split('.') {
                match cur.get(part) {
                    Some(v) => cur = v,
                    None => {
                        return Err(CliError::new(
                            format!("config key {key:?}"),
                            format!("not set in {}", path.display()),
                        )
                        .hint(format!(
                            "set it with `lattice admin config set {key}=VALUE`"
                        ))
                        .exit_code(exit::NOT_FOUND))
                    }
                }
            }
            let v = if key == "token" || key.ends_with(".token") {
                serde_yaml::Value::String("REDACTED".into())
            } else {
                cur.clone()
            };
            match &v {
                serde_yaml::Value::String(s) => writeln!(out, "{s}")?,
                serde_yaml::Value::Bool(b) => writeln!(out, "{b}")?,
                serde_yaml::Value::Number(n) => writeln!(out, "{n}")?,
                other => {
                    out.write_all(serde_yaml::to_string(other).unwrap_or_default().as_bytes())?
                }
            }
            Ok(0)
        }
        AdminConfigCommand::Set { assignment, value } => {
            let (key, raw) = match (assignment.split_once('='), value) {
                (_, Some(v)) => (assignment.as_str(), v.as_str()),
                (Some((k, v)), None) => (k, v),
                (None, None) => {
                    return Err(CliError::new(
                        format!("admin config set {assignment}"),
                        "no value given",
                    )
                    .hint("lattice admin config set KEY=VALUE")
                    .exit_code(exit::USAGE))
                }
            };
            if key.is_empty() || key.split('.').any(str::is_empty) {
                return Err(
                    CliError::new(format!("admin config set {assignment}"), "empty key")
                        .hint("keys are dotted names, e.g. accounting.enabled")
                        .exit_code(exit::USAGE),
                );
            }
            let val: serde_yaml::Value =
                serde_yaml::from_str(raw).unwrap_or_else(|_| serde_yaml::Value::String(raw.into()));
            let parts: Vec<&str> = key.split('.').collect();
            let mut cur = &mut doc;
            for (i, part) in parts.iter().enumerate() {
                if !cur.is_mapping() {
                    *cur = serde_yaml::Value::Mapping(Default::default());
                }
                let m = cur.as_mapping_mut().expect("mapping");
                let k = serde_yaml::Value::String(part.to_string());
                if i + 1 == parts.len() {
                    m.insert(k, val.clone());
                    break;
                }
                if !m.contains_key(&k) {
                    m.insert(k.clone(), serde_yaml::Value::Mapping(Default::default()));
                }
                cur = m.get_mut(&k).expect("just inserted");
            }
            let file: config::FileConfig = serde_yaml::from_value(doc.clone()).map_err(|e| {
                CliError::new(format!("set {key}"), e.to_string())
                    .hint("api_url, token, token_file, tenant and ca_file are strings")
                    .exit_code(exit::USAGE)
            })?;
            config::save_file(&path, &file)?;
            writeln!(out, "Set {key} = {raw} in {}", path.display())?;
            Ok(0)
        }
        AdminConfigCommand::Unset { key } => Err(CliError::new(
            format!("admin config unset {key}"),
            format!(
                "{key:?} is not a cluster setting (those are: {})",
                lattice_apis::cluster_config::keys()
            ),
        )
        .hint("edit the local CLI config file with `lattice admin config set KEY=VALUE`")
        .exit_code(exit::USAGE)),
        AdminConfigCommand::Cluster => Ok(0),
    }
}

fn redact(mut doc: serde_yaml::Value) -> serde_yaml::Value {
    if let Some(m) = doc.as_mapping_mut() {
        if let Some(t) = m.get_mut("token") {
            *t = serde_yaml::Value::String("REDACTED".into());
        }
    }
    doc
}

/// Prometheus samples `(name{labels}, value)` from the text format.
fn samples(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// `lattice admin node bootstrap-token | tokens | revoke`.
async fn node_identity(
    ctx: &Ctx,
    c: &crate::cli::AdminNodeCommand,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    use crate::cli::AdminNodeCommand as C;
    use lattice_apis::node_identity as ni;
    match c {
        C::BootstrapToken {
            node,
            ttl,
            description,
        } => {
            let secs = lattice_apis::duration::parse_duration(ttl).map_err(|e| {
                CliError::new("create a bootstrap token", format!("--ttl {ttl:?}: {e}"))
                    .hint("give a duration such as 30m, 1h or 2d (at most 7d)")
            })?;
            let body = serde_json::to_value(ni::BootstrapTokenRequest {
                node: node.clone(),
                ttl_seconds: Some(secs),
                description: description.clone(),
            })
            .map_err(|e| CliError::new("create a bootstrap token", e.to_string()))?;
            let t = ctx
                .client
                .create(ni::BOOTSTRAP_TOKENS_PATH, &body, &WriteOptions::default())
                .await
                .map_err(|e| CliError::from_client("create a bootstrap token", e))?;
            let for_node = match s(&t, "/node") {
                Some(n) => format!("node {n}"),
                None => "any node not yet enrolled".to_string(),
            };
            writeln!(
                out,
                "Bootstrap token {} for {for_node}, single use, expires {}.\nOn the node: lattice-agent --node-id NAME --bootstrap-token-file FILE --ca-file CA ... with FILE holding:",
                s(&t, "/id").unwrap_or(DASH),
                s(&t, "/expires").unwrap_or(DASH)
            )
            ?;
            writeln!(out, "{}", s(&t, "/token").unwrap_or_default())?;
            Ok(0)
        }
        C::Tokens => {
            let v = ctx
                .client
                .get(ni::BOOTSTRAP_TOKENS_PATH)
                .await
                .map_err(|e| CliError::from_client("list bootstrap tokens", e))?;
            let mut t = Table::new(
                ["ID", "NODE", "EXPIRES", "CREATED-BY", "DESCRIPTION"]
                    .map(String::from)
                    .to_vec(),
            );
            for i in v["items"].as_array().into_iter().flatten() {
                t.rows.push(vec![
                    s(i, "/id").unwrap_or(DASH).to_string(),
                    s(i, "/node").unwrap_or("(any)").to_string(),
                    s(i, "/expires").unwrap_or(DASH).to_string(),
                    s(i, "/createdBy").unwrap_or(DASH).to_string(),
                    s(i, "/description").unwrap_or(DASH).to_string(),
                ]);
            }
            write!(out, "{}", t.render(false))?;
            Ok(0)
        }
        C::Revoke { name } => {
            let v = ctx
                .client
                .create(&ni::revoke_path(name), &json!({}), &WriteOptions::default())
                .await
                .map_err(|e| CliError::from_client(format!("revoke node {name}"), e))?;
            let n = v["revoked"].as_array().map_or(0, Vec::len);
            writeln!(
                out,
                "Revoked {n} certificate(s) of node {name}; its agent needs a new bootstrap token \
                 (lattice admin node bootstrap-token --node {name})."
            )?;
            Ok(0)
        }
    }
}

async fn raft_status(ctx: &Ctx, out: &mut dyn Write) -> Result<i32, CliError> {
    let url = ctx.client.base_url().to_string();
    let ready = match ctx.client.get_text("/readyz").await {
        Ok(t) => format!("yes ({})", t.trim()),
        Err(e @ crate::client::ClientError::Connect { .. }) => {
            return Err(CliError::from_client("get /readyz", e))
        }
        Err(e) => format!("no ({e})"),
    };
    let metrics = ctx
        .client
        .get_text("/metrics")
        .await
        .map_err(|e| CliError::from_client("get /metrics", e))?;
    let all = samples(&metrics);
    let find = |pred: &dyn Fn(&str) -> bool| -> Vec<(String, String)> {
        all.iter()
            .filter(|(k, _)| pred(k.split('{').next().unwrap_or(k)))
            .cloned()
            .collect()
    };
    let raft = find(&|n: &str| n.contains("raft"));
    let pick = |words: &[&str]| {
        raft.iter()
            .find(|(k, _)| {
                let n = k.split('{').next().unwrap_or(k);
                words.iter().all(|w| n.contains(w))
            })
            .map(|(_, v)| v.clone())
    };
    let mut rows = vec![("API".to_string(), url), ("Ready".to_string(), ready)];
    let leader = pick(&["current_leader"]).or_else(|| pick(&["leader"]));
    let term = pick(&["term"]);
    let commit = pick(&["last_log_index"]).or_else(|| pick(&["commit"]));
    let applied = pick(&["applied_index"]).or_else(|| {
        find(&|n: &str| n == "lattice_store_applied_revision")
            .first()
            .map(|(_, v)| v.clone())
    });
    if raft.is_empty() {
        rows.push((
            "Raft".into(),
            "not reported (single-member store, or no lattice_raft_* metrics exported)".into(),
        ));
    } else {
        rows.push(("Leader".into(), leader.unwrap_or_else(|| DASH.into())));
        rows.push(("Term".into(), term.unwrap_or_else(|| DASH.into())));
        rows.push((
            "Last log index".into(),
            commit.unwrap_or_else(|| DASH.into()),
        ));
    }
    rows.push((
        "Applied revision".into(),
        applied.unwrap_or_else(|| DASH.into()),
    ));
    for (label, metric) in [
        ("Store writes", "lattice_store_write_revisions_total"),
        ("Store size (bytes)", "lattice_store_db_size_bytes"),
        ("Watchers", "lattice_store_watchers"),
    ] {
        if let Some((_, v)) = find(&|n: &str| n == metric).first() {
            rows.push((label.into(), v.clone()));
        }
    }
    out.write_all(kv_block(&rows).as_bytes())?;
    if !raft.is_empty() && ctx.verbose {
        writeln!(out)?;
        for (k, v) in &raft {
            writeln!(out, "{k} {v}")?;
        }
    }
    Ok(0)
}

/// Runs `admin ...` (except `config`, which needs no server).
pub async fn run(
    ctx: &mut Ctx,
    c: &AdminCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    match c {
        AdminCommand::Tenant(t) => tenant(ctx, t, out, err).await,
        AdminCommand::Vcluster(v) => vcluster(ctx, v, out, err).await,
        AdminCommand::Raft(RaftCommand::Status) => raft_status(ctx, out).await,
        AdminCommand::Node(n) => node_identity(ctx, n, out).await,
        AdminCommand::Drain(a) => crate::cmd::nodes::drain(ctx, a, out).await,
        AdminCommand::Undrain(a) => crate::cmd::nodes::undrain(ctx, &a.id, out).await,
        AdminCommand::Config(c) => cluster_config(ctx, c, out).await,
        AdminCommand::Pki(p) => crate::cmd::pki::run(p, out),
        AdminCommand::Token(t) => crate::cmd::auth::token(ctx, t, out).await,
    }
}

/// A setting's value as a line (`2000`, `true`, `text`).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `admin config get KEY|set KEY=VALUE|unset KEY|cluster` for the cluster's settings
/// (`/v1/admin/config`): stored on the server, in force for every API server at once.
async fn cluster_config(
    ctx: &mut Ctx,
    c: &AdminConfigCommand,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let path = |k: &str| format!("/v1/admin/config/{k}");
    let v = match c {
        AdminConfigCommand::Get { key: Some(key) } => ctx
            .client
            .get(&path(key))
            .await
            .map_err(|e| CliError::from_client(format!("get the cluster setting {key}"), e))?,
        AdminConfigCommand::Set { assignment, value } => {
            let (key, raw) = match (assignment.split_once('='), value) {
                (_, Some(v)) => (assignment.as_str(), v.as_str()),
                (Some((k, v)), None) => (k, v),
                (None, None) => {
                    return Err(CliError::new(
                        format!("admin config set {assignment}"),
                        "no value given",
                    )
                    .hint(format!("lattice admin config set {assignment}=VALUE"))
                    .exit_code(exit::USAGE))
                }
            };
            let val: Value =
                serde_yaml::from_str(raw).unwrap_or_else(|_| Value::String(raw.into()));
            let v = ctx
                .client
                .put_json(&path(key), &json!({ "value": val }))
                .await
                .map_err(|e| write_err(format!("set the cluster setting {key}"), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(
                    out,
                    "Set {key} = {} for the whole cluster",
                    plain(&v["value"])
                )?;
            }
            return Ok(0);
        }
        AdminConfigCommand::Unset { key } => {
            let v = ctx
                .client
                .delete(&path(key), &WriteOptions::default())
                .await
                .map_err(|e| write_err(format!("reset the cluster setting {key}"), e))?;
            if !print_obj(ctx, out, &v)? {
                writeln!(
                    out,
                    "Reset {key}: {} (the server's flag)",
                    plain(&v["value"])
                )?;
            }
            return Ok(0);
        }
        AdminConfigCommand::Cluster | AdminConfigCommand::Get { key: None } => {
            let v = ctx
                .client
                .get("/v1/admin/config")
                .await
                .map_err(|e| CliError::from_client("list the cluster settings", e))?;
            if !print_obj(ctx, out, &v)? {
                let mut t = Table::new(
                    ["SETTING", "VALUE", "SOURCE", "DESCRIPTION"]
                        .iter()
                        .map(|x| x.to_string())
                        .collect(),
                );
                for item in v["items"].as_array().into_iter().flatten() {
                    t.rows.push(vec![
                        s(item, "/key").unwrap_or(DASH).to_string(),
                        item.get("value").map_or_else(|| DASH.to_string(), plain),
                        s(item, "/source").unwrap_or(DASH).to_string(),
                        s(item, "/description").unwrap_or(DASH).to_string(),
                    ]);
                }
                out.write_all(t.render(false).as_bytes())?;
            }
            return Ok(0);
        }
    };
    if !print_obj(ctx, out, &v)? {
        writeln!(out, "{}", plain(&v["value"]))?;
    }
    Ok(0)
}
