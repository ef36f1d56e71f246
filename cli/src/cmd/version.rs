//! `lattice version`: client version, and the server's from `/version`.

use std::io::Write;

use serde_json::Value;

use crate::cli::VersionArgs;
use crate::errors::CliError;
use crate::Ctx;

/// Client version string.
pub const CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs `version`.
pub async fn run(ctx: &mut Ctx, args: &VersionArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    writeln!(out, "Client Version: {CLIENT_VERSION}")?;
    if args.client {
        return Ok(0);
    }
    let v = ctx
        .client
        .get("/version")
        .await
        .map_err(|e| CliError::from_client("get the server version", e))?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let version = s("gitVersion")
        .or_else(|| s("version"))
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string());
    writeln!(out, "Server Version: {version}")?;
    if let Some(c) = s("gitCommit") {
        writeln!(out, "Server Commit: {c}")?;
    }
    writeln!(out, "Server URL: {}", ctx.client.base_url())?;
    Ok(0)
}
