//! What commands inside a job need to reach the API as the job's user, as Slurm jobs can
//! run `srun`, `sbatch` or `squeue` without logging in: before a run starts the agent
//! asks the API server for a job token (`POST /v1/allocations/{id}/token`, see
//! `apis/server/src/job_token.rs`) and writes, in the run's scratch directory, owned by
//! the user:
//!
//! * `.lattice/token` (mode 0600): the token (none with authentication off);
//! * `.lattice/bin/`: `lattice`, `srun`, `sbatch`, `squeue`, `scancel`, `salloc`, `sinfo`
//!   and `sacct`, each a two-line script that runs the `lattice` CLI (`--lattice-cli`),
//!   the Slurm names through `lattice compat`.
//!
//! The run's environment then has `LATTICE_API_URL` (`--job-api-url`, default
//! `--api-url`), `LATTICE_TOKEN_FILE` and `.lattice/bin` first on `PATH`, so `srun ./app`
//! in a batch script starts a job step of it (`LATTICE_ALLOC_ID` says which) on its nodes.
//! Attach sessions in the run get the same. Everything here is best effort: a run whose
//! token could not be had still runs (its commands get the API's 401, which says why).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lattice_apis::Allocation;

use crate::agent::Ctx;
use crate::config::Config;
use crate::runtime::RunAs;

/// Under the run's scratch directory.
pub const DIR: &str = ".lattice";
/// The commands put on a job's `PATH`: `lattice` itself, and Slurm's through `lattice
/// compat`.
pub const COMMANDS: [&str; 8] = [
    "lattice", "srun", "sbatch", "squeue", "scancel", "salloc", "sinfo", "sacct",
];

fn token_path(scratch: &Path) -> PathBuf {
    scratch.join(DIR).join("token")
}

fn bin_dir(scratch: &Path) -> PathBuf {
    scratch.join(DIR).join("bin")
}

/// Single-quoted for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The wrapper script of `command`.
pub fn wrapper(cli: &Path, command: &str) -> String {
    let cli = sh_quote(&cli.display().to_string());
    if command == "lattice" {
        format!("#!/bin/sh\nexec {cli} \"$@\"\n")
    } else {
        format!("#!/bin/sh\nexec {cli} compat {command} \"$@\"\n")
    }
}

fn write_owned(path: &Path, text: &str, mode: u32, user: Option<&RunAs>) -> std::io::Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(u) = user {
        std::os::unix::fs::chown(path, Some(u.uid), Some(u.gid))?;
    }
    Ok(())
}

fn mkdir_owned(path: &Path, user: Option<&RunAs>) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    if let Some(u) = user {
        std::os::unix::fs::chown(path, Some(u.uid), Some(u.gid))?;
    }
    Ok(())
}

/// Ask the API server for the allocation's job token; `Ok(None)` with authentication off.
async fn request_token(ctx: &Ctx, alloc: &Allocation) -> Result<Option<String>, String> {
    let url = format!(
        "{}/v1/allocations/{}/token?tenant={}",
        ctx.cfg.api_url.trim_end_matches('/'),
        alloc.metadata.name_str(),
        alloc.metadata.namespace_str()
    );
    let mut req = reqwest::Client::new()
        .post(url)
        .timeout(Duration::from_secs(10));
    if let Some(t) = &ctx.cfg.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let code = resp.status();
    let body: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    if !code.is_success() {
        let msg = body
            .get("message")
            .and_then(|m| m.as_str())
            .unwrap_or_default();
        return Err(format!("{code}: {msg}"));
    }
    Ok(body.get("token").and_then(|t| t.as_str()).map(String::from))
}

/// Write the run's token and command wrappers (see the module docs).
pub async fn prepare(ctx: &Ctx, alloc: &Allocation, scratch: &Path, user: Option<&RunAs>) {
    let name = alloc.metadata.name_str();
    let dir = scratch.join(DIR);
    if let Err(e) = mkdir_owned(&dir, user) {
        tracing::warn!(allocation = %name, dir = %dir.display(), error = %e, "cannot make the job's credentials directory");
        return;
    }
    if alloc
        .metadata
        .annotations
        .contains_key(lattice_apis::steps::USER_ANNOTATION)
    {
        match request_token(ctx, alloc).await {
            Ok(Some(t)) => {
                if let Err(e) = write_owned(&token_path(scratch), &t, 0o600, user) {
                    tracing::warn!(allocation = %name, error = %e, "cannot write the job token");
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(allocation = %name, error = %e, "no job token; commands in the job cannot reach the API")
            }
        }
    }
    let Some(cli) = &ctx.cfg.lattice_cli else {
        return;
    };
    let bin = bin_dir(scratch);
    let made = mkdir_owned(&bin, user).and_then(|()| {
        COMMANDS
            .iter()
            .try_for_each(|c| write_owned(&bin.join(c), &wrapper(cli, c), 0o755, user))
    });
    if let Err(e) = made {
        tracing::warn!(allocation = %name, error = %e, "cannot write the job's command wrappers");
    }
}

/// The run's environment additions, from what [`prepare`] left in `scratch`.
pub fn add_env(cfg: &Config, scratch: &Path, env: &mut BTreeMap<String, String>) {
    let api = cfg.job_api_url.as_deref().unwrap_or(&cfg.api_url);
    env.insert("LATTICE_API_URL".into(), api.to_string());
    let token = token_path(scratch);
    if token.exists() {
        env.insert("LATTICE_TOKEN_FILE".into(), token.display().to_string());
    }
    let bin = bin_dir(scratch);
    if bin.is_dir() {
        let path = match env.get("PATH") {
            Some(p) if !p.is_empty() => format!("{}:{p}", bin.display()),
            _ => bin.display().to_string(),
        };
        env.insert("PATH".into(), path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrappers_run_the_cli_quoted() {
        let cli = Path::new("/opt/it's/lattice");
        assert_eq!(
            wrapper(cli, "srun"),
            "#!/bin/sh\nexec '/opt/it'\\''s/lattice' compat srun \"$@\"\n"
        );
        assert_eq!(
            wrapper(cli, "lattice"),
            "#!/bin/sh\nexec '/opt/it'\\''s/lattice' \"$@\"\n"
        );
    }
}
