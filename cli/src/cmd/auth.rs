//! `lattice auth can-i | whoami` and `lattice admin token create | list | revoke`.

use std::io::Write;

use serde_json::{json, Value};

use crate::cli::{AdminTokenCommand, AuditCommand, AuthCommand};
use crate::client::WriteOptions;
use crate::errors::CliError;
use crate::output::Table;
use crate::Ctx;

const TOKENS: &str = "/v1/admin/tokens";

/// `TOKENS?user=NAME`, the name encoded.
fn for_user(user: &str) -> String {
    let q: String = reqwest::Url::parse_with_params("http://x/", [("user", user)])
        .ok()
        .and_then(|u| u.query().map(str::to_string))
        .unwrap_or_default();
    format!("{TOKENS}?{q}")
}

fn text<'v>(v: &'v Value, p: &str) -> &'v str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("—")
}

fn list_of(v: &Value, p: &str) -> String {
    let items: Vec<&str> = v
        .pointer(p)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if items.is_empty() {
        "—".into()
    } else {
        items.join(", ")
    }
}

/// `lattice auth ...`.
pub async fn run(ctx: &Ctx, c: &AuthCommand, out: &mut dyn Write) -> Result<i32, CliError> {
    match c {
        AuthCommand::CanI {
            verb,
            resource,
            name,
            as_user,
            as_group,
        } => {
            let body = json!({
                "verb": verb,
                "resource": resource,
                "tenant": ctx.tenant,
                "name": name,
                "as": as_user,
                "asGroups": as_group,
            });
            let v = ctx
                .client
                .create("/v1/auth/can-i", &body, &WriteOptions::default())
                .await
                .map_err(|e| CliError::from_client("ask the authorizer", e))?;
            let allowed = v["allowed"].as_bool().unwrap_or(false);
            writeln!(out, "{}", if allowed { "yes" } else { "no" })?;
            if ctx.verbose {
                if let Some(why) = v["reason"].as_str() {
                    writeln!(out, "reason: {why}")?;
                }
                writeln!(out, "user: {}", text(&v, "/user"))?;
                writeln!(out, "roles: {}", list_of(&v, "/roles"))?;
            }
            Ok(if allowed { 0 } else { 1 })
        }
        AuthCommand::Whoami => {
            let v = ctx
                .client
                .get("/v1/auth/whoami")
                .await
                .map_err(|e| CliError::from_client("ask who you are", e))?;
            writeln!(out, "user:     {}", text(&v, "/user"))?;
            writeln!(out, "groups:   {}", list_of(&v, "/groups"))?;
            let tenants = match v.get("tenants") {
                Some(Value::Null) | None => "(all)".to_string(),
                _ => list_of(&v, "/tenants"),
            };
            writeln!(out, "tenants:  {tenants}")?;
            writeln!(out, "roles:    {}", list_of(&v, "/roles"))?;
            if v["serviceAccount"].as_bool() == Some(true) {
                writeln!(out, "account:  automation (API token)")?;
            }
            writeln!(out, "expires:  {}", text(&v, "/expires"))?;
            Ok(0)
        }
    }
}

/// `lattice admin token ...`.
pub async fn token(ctx: &Ctx, c: &AdminTokenCommand, out: &mut dyn Write) -> Result<i32, CliError> {
    match c {
        AdminTokenCommand::Create {
            user,
            tenant,
            role,
            groups,
            ttl,
            description,
        } => {
            let secs = lattice_apis::duration::parse_duration(ttl).map_err(|e| {
                CliError::new("create an API token", format!("--ttl {ttl:?}: {e}"))
                    .hint("give a duration such as 12h or 30d (at most 366d)")
            })?;
            let body = json!({
                "user": user,
                "tenant": tenant,
                "role": role,
                "groups": groups,
                "ttlSeconds": secs,
                "description": description,
            });
            let t = ctx
                .client
                .create(TOKENS, &body, &WriteOptions::default())
                .await
                .map_err(|e| CliError::from_client("create an API token", e))?;
            let scope = match (t["role"].as_str(), t["tenant"].as_str()) {
                (Some(r), Some(t)) => format!("role {r} in tenant {t}"),
                (Some(r), None) => format!("role {r} cluster-wide"),
                (None, _) => "no role of its own (only what bindings grant)".to_string(),
            };
            writeln!(
                out,
                "API token {} for {}, {scope}, expires {}. It is shown once; revoke it with \
                 `lattice admin token revoke {}`.",
                text(&t, "/id"),
                text(&t, "/user"),
                text(&t, "/expires"),
                text(&t, "/id"),
            )?;
            writeln!(out, "{}", t["token"].as_str().unwrap_or_default())?;
            Ok(0)
        }
        AdminTokenCommand::List { user } => {
            let path = match user {
                Some(u) => for_user(u),
                None => TOKENS.to_string(),
            };
            let v = ctx
                .client
                .get(&path)
                .await
                .map_err(|e| CliError::from_client("list API tokens", e))?;
            let mut t = Table::new(
                [
                    "ID",
                    "USER",
                    "TENANT",
                    "ROLE",
                    "EXPIRES",
                    "CREATED-BY",
                    "DESCRIPTION",
                ]
                .map(String::from)
                .to_vec(),
            );
            for i in v["items"].as_array().into_iter().flatten() {
                let expires = if i["expired"].as_bool() == Some(true) {
                    format!("{} (expired)", text(i, "/expires"))
                } else {
                    text(i, "/expires").to_string()
                };
                t.rows.push(vec![
                    text(i, "/id").to_string(),
                    text(i, "/user").to_string(),
                    i["tenant"].as_str().unwrap_or("(all)").to_string(),
                    text(i, "/role").to_string(),
                    expires,
                    text(i, "/createdBy").to_string(),
                    text(i, "/description").to_string(),
                ]);
            }
            write!(out, "{}", t.render(false))?;
            Ok(0)
        }
        AdminTokenCommand::Revoke { id, user } => {
            let path = match (id, user) {
                (Some(id), _) if id.bytes().all(|b| b.is_ascii_alphanumeric()) => {
                    format!("{TOKENS}/{id}")
                }
                (Some(id), _) => {
                    return Err(CliError::new(
                        "revoke API tokens",
                        format!("{id:?} is not a token id"),
                    )
                    .hint("lattice admin token list shows the ids"))
                }
                (None, Some(u)) => for_user(u),
                (None, None) => {
                    return Err(CliError::new("revoke API tokens", "name the token").hint(
                        "lattice admin token revoke ID, or --user NAME for all of an account's",
                    ))
                }
            };
            let v = ctx
                .client
                .delete(&path, &WriteOptions::default())
                .await
                .map_err(|e| CliError::from_client("revoke API tokens", e))?;
            let ids = list_of(&v, "/revoked");
            writeln!(out, "Revoked: {ids}")?;
            Ok(0)
        }
    }
}

fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let kept: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| (*k, v)))
        .collect();
    if kept.is_empty() {
        return String::new();
    }
    reqwest::Url::parse_with_params("http://x/", kept)
        .ok()
        .and_then(|u| u.query().map(|q| format!("?{q}")))
        .unwrap_or_default()
}

/// `lattice audit ...`.
pub async fn audit(
    ctx: &Ctx,
    c: &AuditCommand,
    stdin: &mut dyn std::io::Read,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    match c {
        AuditCommand::Query {
            user,
            since,
            verb,
            resource,
            decision,
            limit,
            all_tenants,
        } => {
            let limit = limit.to_string();
            let tenant = (!all_tenants).then_some(ctx.tenant.as_str());
            let q = query_string(&[
                ("user", user.as_deref()),
                ("since", since.as_deref()),
                ("verb", verb.as_deref()),
                ("resource", resource.as_deref()),
                ("decision", decision.as_deref()),
                ("tenant", tenant),
                ("limit", Some(&limit)),
            ]);
            let v = ctx
                .client
                .get(&format!("/v1/audit{q}"))
                .await
                .map_err(|e| CliError::from_client("query the audit log", e))?;
            if matches!(ctx.output, Some(crate::output::OutputFormat::Json)) {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&v["items"]).unwrap_or_default()
                )?;
                return Ok(0);
            }
            let mut t = Table::new(
                [
                    "TIME", "USER", "VERB", "RESOURCE", "TENANT", "NAME", "DECISION", "CODE",
                    "SOURCE",
                ]
                .map(String::from)
                .to_vec(),
            );
            for i in v["items"].as_array().into_iter().flatten() {
                let resource = match i["subresource"].as_str() {
                    Some(s) => format!("{}/{s}", text(i, "/resource")),
                    None => text(i, "/resource").to_string(),
                };
                let decision = if i["sensitive"].as_bool() == Some(true) {
                    format!("{} (sensitive)", text(i, "/decision"))
                } else {
                    text(i, "/decision").to_string()
                };
                t.rows.push(vec![
                    text(i, "/time").to_string(),
                    text(i, "/user").to_string(),
                    text(i, "/verb").to_string(),
                    resource,
                    text(i, "/tenant").to_string(),
                    text(i, "/name").to_string(),
                    decision,
                    i["code"].as_u64().map_or("—".into(), |c| c.to_string()),
                    text(i, "/source").to_string(),
                ]);
            }
            write!(out, "{}", t.render(false))?;
            Ok(0)
        }
        AuditCommand::Export { since } => {
            let q = query_string(&[("since", since.as_deref())]);
            let text = ctx
                .client
                .get_text(&format!("/v1/audit/export{q}"))
                .await
                .map_err(|e| CliError::from_client("export the audit log", e))?;
            write!(out, "{text}")?;
            Ok(0)
        }
        AuditCommand::Verify { file: None } => {
            let v = ctx
                .client
                .get("/v1/audit/verify")
                .await
                .map_err(|e| CliError::from_client("verify the audit log", e))?;
            let report: lattice_apis::audit::Report =
                serde_json::from_value(v["report"].clone()).unwrap_or_default();
            print_report(out, &report)
        }
        AuditCommand::Verify { file: Some(path) } => {
            let mut text = String::new();
            if path.as_os_str() == "-" {
                stdin
                    .read_to_string(&mut text)
                    .map_err(|e| CliError::new("read standard input", e.to_string()))?;
            } else {
                text = std::fs::read_to_string(path).map_err(|e| {
                    CliError::new(format!("read {}", path.display()), e.to_string())
                })?;
            }
            let v = ctx
                .client
                .get("/v1/audit/keys")
                .await
                .map_err(|e| CliError::from_client("read the servers' audit keys", e))?;
            let keys = v["keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| {
                    Some((
                        k["keyId"].as_str()?.to_string(),
                        lattice_apis::audit::PublicKey {
                            server: k["server"].as_str()?.to_string(),
                            key: lattice_apis::audit::base64_decode(k["publicKey"].as_str()?)?,
                        },
                    ))
                })
                .collect();
            let report = lattice_apis::audit::verify(text.lines(), &keys, false);
            print_report(out, &report)
        }
    }
}

fn print_report(out: &mut dyn Write, r: &lattice_apis::audit::Report) -> Result<i32, CliError> {
    let mut chains: Vec<_> = r.chains.iter().collect();
    chains.sort();
    for (server, (first, last, _)) in chains {
        writeln!(out, "chain {server}: records {first} to {last}")?;
    }
    if r.ok() {
        writeln!(out, "intact: {} records verified", r.records)?;
        return Ok(0);
    }
    for p in &r.problems {
        writeln!(out, "problem: {p}")?;
    }
    writeln!(
        out,
        "NOT intact: {} problems in {} records",
        r.problems.len(),
        r.records
    )?;
    Ok(1)
}
