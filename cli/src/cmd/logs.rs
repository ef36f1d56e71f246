//! `lattice logs ID`: `GET .../allocations/{id}/log` (text/plain, streamed as it arrives).

use std::io::Write;

use serde_json::json;

use crate::cli::LogsArgs;
use crate::cmd::workload::{self, object, parse_when, rfc3339};
use crate::errors::{exit, CliError};
use crate::output::OutputFormat;
use crate::{Ctx, Shutdown};

/// The log endpoint's query for `args`.
pub fn query(ctx: &Ctx, args: &LogsArgs) -> Result<Vec<(String, String)>, CliError> {
    let mut q: Vec<(String, String)> = Vec::new();
    if args.follow {
        q.push(("follow".into(), "true".into()));
    }
    if let Some(n) = args.tail {
        q.push(("tailLines".into(), n.to_string()));
    }
    let stream = if args.stderr {
        "stderr"
    } else if args.stdout {
        "stdout"
    } else {
        "all"
    };
    q.push(("stream".into(), stream.into()));
    if let Some(n) = &args.node {
        q.push(("node".into(), n.clone()));
    }
    let now = ctx.now();
    if let Some(s) = &args.since {
        q.push(("sinceTime".into(), rfc3339(parse_when("--since", s, now)?)));
    }
    if let Some(u) = &args.until {
        q.push(("untilTime".into(), rfc3339(parse_when("--until", u, now)?)));
    }
    if args.timestamps {
        q.push(("timestamps".into(), "true".into()));
    }
    Ok(q)
}

/// Streams an allocation's log to `out`. Returns when the server ends the body (or on
/// Ctrl-C); `Ok(false)` when interrupted.
pub async fn stream(
    ctx: &Ctx,
    tenant: &str,
    args: &LogsArgs,
    out: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<bool, CliError> {
    let q = query(ctx, args)?;
    let path = format!("{}/log", object("allocations", Some(tenant), &args.id));
    let mut body = match ctx.client.get_stream(&path, &q).await {
        Ok(b) => b,
        Err(e0) if e0.is_not_found() => {
            // No such allocation, or a server without the log endpoint?
            return Err(
                match ctx
                    .client
                    .get(&object("allocations", Some(tenant), &args.id))
                    .await
                {
                    Err(e2) if e2.is_not_found() => workload::not_found(
                        "allocation",
                        &args.id,
                        Some(tenant),
                        "lattice status --all",
                    ),
                    _ => CliError::new(
                        format!("get logs of allocation {:?}", args.id),
                        format!(
                            "the server has no log endpoint (404 for {})",
                            path.rsplit_once("/allocations/")
                                .map(|x| x.1)
                                .unwrap_or(&path)
                        ),
                    )
                    .hint("upgrade lattice-server; logs are served at .../allocations/NAME/log"),
                },
            );
        }
        Err(e) => {
            return Err(CliError::from_client(
                format!("get logs of allocation {:?}", args.id),
                e,
            ))
        }
    };
    let json_lines = ctx.output == Some(OutputFormat::Json);
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            _ = &mut *shutdown => return Ok(false),
            c = body.next() => c,
        };
        match chunk {
            Some(Ok(bytes)) => {
                if json_lines {
                    pending.extend_from_slice(&bytes);
                    while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=pos).collect();
                        let text = String::from_utf8_lossy(&line[..line.len() - 1]).to_string();
                        writeln!(out, "{}", json!({"id": args.id, "line": text}))?;
                    }
                } else {
                    out.write_all(&bytes)?;
                }
                out.flush()?;
            }
            Some(Err(e)) => {
                return Err(CliError::from_client(
                    format!("stream logs of allocation {:?}", args.id),
                    e,
                ))
            }
            None => break,
        }
    }
    if json_lines && !pending.is_empty() {
        let text = String::from_utf8_lossy(&pending).to_string();
        writeln!(out, "{}", json!({"id": args.id, "line": text}))?;
    }
    out.flush()?;
    Ok(true)
}

/// Runs `logs`.
pub async fn run(
    ctx: &mut Ctx,
    args: &LogsArgs,
    out: &mut dyn Write,
    _err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    if args.id.is_empty() {
        return Err(CliError::new("logs", "no allocation given")
            .hint("lattice logs ID [--follow]")
            .exit_code(exit::USAGE));
    }
    let tenant = ctx.tenant.clone();
    stream(ctx, &tenant, args, out, &mut shutdown).await?;
    Ok(0)
}
