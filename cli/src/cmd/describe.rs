//! `lattice describe KIND NAME`: metadata, spec, status, conditions and recent events.

use std::io::Write;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::cli::DescribeArgs;
use crate::client::ListParams;
use crate::cmd::get::not_found;
use crate::cmd::kind_name_groups;
use crate::errors::CliError;
use crate::kinds::KindMeta;
use crate::output::format::{age_of, to_yaml};
use crate::output::table::NONE;
use crate::output::Table;
use crate::Ctx;

const LABEL_WIDTH: usize = 18;

/// Runs `describe`.
pub async fn run(
    ctx: &mut Ctx,
    args: &DescribeArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let groups = kind_name_groups(&args.kind, &args.names)?;
    let mut code = 0;
    let mut first = true;
    for (kind_name, names) in groups {
        let kind = ctx.catalog.resolve(&ctx.client, &kind_name).await?;
        let tenant = kind.namespaced.then(|| ctx.tenant.clone());
        let names = if names.is_empty() {
            // Describe every object of the kind, like kubectl.
            let list = ctx
                .client
                .list(
                    &kind.collection_path(tenant.as_deref()),
                    &ListParams::default(),
                )
                .await
                .map_err(|e| CliError::from_client(format!("list {}", kind.plural), e))?;
            list.get("items")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        } else {
            names
        };
        for name in names {
            let obj = match ctx
                .client
                .get(&kind.object_path(tenant.as_deref(), &name))
                .await
            {
                Ok(o) => o,
                Err(e) if e.is_not_found() => {
                    writeln!(err, "{}", not_found(&kind, tenant.as_deref(), &name))?;
                    code = 1;
                    continue;
                }
                Err(e) => {
                    return Err(CliError::from_client(
                        format!("describe {} {name:?}", kind.display()),
                        e,
                    ))
                }
            };
            if !first {
                writeln!(out)?;
            }
            first = false;
            let events = events_for(ctx, &kind, tenant.as_deref(), &name).await;
            out.write_all(render(&kind, &obj, events.as_deref(), ctx.now()).as_bytes())?;
        }
    }
    Ok(code)
}

fn field(label: &str, value: &str) -> String {
    let l = format!("{label}:");
    format!("{l:<LABEL_WIDTH$}{value}\n")
}

fn multi_field(label: &str, values: &[String]) -> String {
    if values.is_empty() {
        return field(label, NONE);
    }
    let mut s = field(label, &values[0]);
    for v in &values[1..] {
        s.push_str(&format!("{:LABEL_WIDTH$}{v}\n", ""));
    }
    s
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn map_entries(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn indented_yaml(v: &Value) -> String {
    to_yaml(v).lines().map(|l| format!("  {l}\n")).collect()
}

/// Renders the description (pure; tested with golden files).
pub fn render(
    kind: &KindMeta,
    obj: &Value,
    events: Option<&[Value]>,
    now: DateTime<Utc>,
) -> String {
    let mut s = String::new();
    s += &field("Name", str_at(obj, "/metadata/name").unwrap_or(NONE));
    if kind.namespaced {
        s += &field("Tenant", str_at(obj, "/metadata/namespace").unwrap_or(NONE));
    }
    s += &field("Kind", str_at(obj, "/kind").unwrap_or(&kind.kind));
    s += &field(
        "API Version",
        str_at(obj, "/apiVersion").unwrap_or(&kind.group_version),
    );
    s += &multi_field("Labels", &map_entries(obj.pointer("/metadata/labels")));
    let annotations: Vec<String> = map_entries(obj.pointer("/metadata/annotations"))
        .into_iter()
        .filter(|a| !a.starts_with("kubectl.kubernetes.io/last-applied-configuration="))
        .collect();
    s += &multi_field("Annotations", &annotations);
    if let Some(uid) = str_at(obj, "/metadata/uid") {
        s += &field("UID", uid);
    }
    if let Some(rv) = str_at(obj, "/metadata/resourceVersion") {
        s += &field("Resource Version", rv);
    }
    if let Some(g) = obj.pointer("/metadata/generation").and_then(Value::as_i64) {
        s += &field("Generation", &g.to_string());
    }
    if let Some(ts) = str_at(obj, "/metadata/creationTimestamp") {
        s += &field("Created", &format!("{ts} ({} ago)", age_of(ts, now)));
    }
    if let Some(ts) = str_at(obj, "/metadata/deletionTimestamp") {
        s += &field("Deleting Since", &format!("{ts} ({} ago)", age_of(ts, now)));
    }
    if let Some(f) = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
    {
        let fs: Vec<&str> = f.iter().filter_map(Value::as_str).collect();
        if !fs.is_empty() {
            s += &field("Finalizers", &fs.join(", "));
        }
    }
    if let Some(owners) = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
    {
        let os: Vec<String> = owners
            .iter()
            .map(|o| {
                let k = str_at(o, "/kind").unwrap_or("?");
                let n = str_at(o, "/name").unwrap_or("?");
                let ctl = if o.get("controller").and_then(Value::as_bool) == Some(true) {
                    " (controller)"
                } else {
                    ""
                };
                format!("{k}/{n}{ctl}")
            })
            .collect();
        if !os.is_empty() {
            s += &multi_field("Owned By", &os);
        }
    }
    match obj.get("spec") {
        Some(spec) if !spec.is_null() && spec.as_object().is_none_or(|m| !m.is_empty()) => {
            s += "Spec:\n";
            s += &indented_yaml(spec);
        }
        _ => s += &field("Spec", NONE),
    }
    let mut conditions = Vec::new();
    match obj.get("status") {
        Some(Value::Object(st)) if !st.is_empty() => {
            let mut st = st.clone();
            if let Some(Value::Array(c)) = st.remove("conditions") {
                conditions = c;
            }
            if st.is_empty() {
                s += &field("Status", NONE);
            } else {
                s += "Status:\n";
                s += &indented_yaml(&Value::Object(st));
            }
        }
        _ => s += &field("Status", NONE),
    }
    if conditions.is_empty() {
        s += &field("Conditions", NONE);
    } else {
        s += "Conditions:\n";
        let mut t = Table::new(
            ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]
                .iter()
                .map(|h| h.to_string())
                .collect(),
        );
        for c in &conditions {
            let g = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let age = str_at(c, "/lastTransitionTime")
                .map(|t| age_of(t, now))
                .unwrap_or_else(|| NONE.to_string());
            t.rows
                .push(vec![g("type"), g("status"), g("reason"), age, g("message")]);
        }
        for l in t.render(false).lines() {
            s += &format!("  {}\n", l.trim_end());
        }
    }
    match events {
        None => s += &field("Events", "<unavailable>"),
        Some([]) => s += &field("Events", NONE),
        Some(evs) => {
            s += "Events:\n";
            let mut t = Table::new(
                ["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]
                    .iter()
                    .map(|h| h.to_string())
                    .collect(),
            );
            for e in evs {
                t.rows.push(event_row(e, now));
            }
            for l in t.render(false).lines() {
                s += &format!("  {}\n", l.trim_end());
            }
        }
    }
    s
}

fn event_time(e: &Value) -> Option<&str> {
    [
        "/lastTimestamp",
        "/eventTime",
        "/series/lastObservedTime",
        "/firstTimestamp",
        "/metadata/creationTimestamp",
    ]
    .iter()
    .find_map(|p| str_at(e, p))
}

fn event_row(e: &Value, now: DateTime<Utc>) -> Vec<String> {
    let last = event_time(e);
    let count = e
        .get("count")
        .or_else(|| e.pointer("/series/count"))
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let age = match (last, str_at(e, "/firstTimestamp")) {
        (Some(l), Some(f)) if count > 1 => {
            format!("{} (x{count} over {})", age_of(l, now), age_of(f, now))
        }
        (Some(l), _) => age_of(l, now),
        (None, _) => NONE.to_string(),
    };
    let from = [
        "/source/component",
        "/reportingController",
        "/reportingComponent",
    ]
    .iter()
    .find_map(|p| str_at(e, p))
    .unwrap_or("")
    .to_string();
    let msg = str_at(e, "/message")
        .or_else(|| str_at(e, "/note"))
        .unwrap_or("")
        .to_string();
    vec![
        str_at(e, "/type").unwrap_or("Normal").to_string(),
        str_at(e, "/reason").unwrap_or("").to_string(),
        age,
        from,
        msg,
    ]
}

fn involves(e: &Value, kind: &KindMeta, name: &str) -> bool {
    let target = e.get("involvedObject").or_else(|| e.get("regarding"));
    let Some(t) = target else { return false };
    str_at(t, "/name") == Some(name) && str_at(t, "/kind").is_none_or(|k| k == kind.kind)
}

/// Recent events about the object; `None` when the server serves no events.
async fn events_for(
    ctx: &mut Ctx,
    kind: &KindMeta,
    tenant: Option<&str>,
    name: &str,
) -> Option<Vec<Value>> {
    let ev_kind = ctx.catalog.resolve(&ctx.client, "events").await.ok()?;
    let tenant = if ev_kind.namespaced {
        Some(tenant.unwrap_or(&ctx.tenant).to_string())
    } else {
        None
    };
    let path = ev_kind.collection_path(tenant.as_deref());
    let by_field = ListParams {
        label_selector: None,
        field_selector: Some(format!("involvedObject.name={name}")),
    };
    let list = match ctx.client.list(&path, &by_field).await {
        Ok(l) => l,
        // The server may not support that field selector: filter here instead.
        Err(e) if e.code() == Some(400) => {
            ctx.client.list(&path, &ListParams::default()).await.ok()?
        }
        Err(_) => return None,
    };
    let mut evs: Vec<Value> = list
        .get("items")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|e| involves(e, kind, name))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    evs.sort_by(|a, b| event_time(a).cmp(&event_time(b)));
    Some(evs)
}
