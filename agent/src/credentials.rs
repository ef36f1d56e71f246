//! What commands inside a job need to reach the API as the job's user, as Slurm jobs can
//! run `srun`, `sbatch` or `squeue` without logging in: before a run starts the agent
//! asks the API server for a job token (`POST /v1/allocations/{id}/token?uid=`, see
//! `apis/server/src/job_token.rs`) and writes, in `<run dir>/creds/` (the agent's own
//! directory, so the user can replace nothing in it while root writes; every file is
//! created through the directory's descriptor, see [`crate::files`]):
//!
//! * `token` (mode 0600, the user's): the token. None with authentication off, and none
//!   when the work would run as the agent's user for someone else (a root agent without
//!   the user's account), unless the agent runs with `--unknown-user=agent` (one user's
//!   cluster) or not as root (every job is the agent's user anyway);
//! * `bin/`: `lattice`, `srun`, `sbatch`, `squeue`, `scancel`, `salloc`, `sinfo` and
//!   `sacct`, each a two-line script that runs the `lattice` CLI (`--lattice-cli`), the
//!   Slurm names through `lattice compat`.
//!
//! The run's environment then has `LATTICE_API_URL` (`--job-api-url`, default
//! `--api-url`), `LATTICE_TOKEN_FILE`, `LATTICE_CA_FILE` (the cluster CA, `creds/ca.crt`)
//! and `creds/bin` first on `PATH`, so `srun ./app`
//! in a batch script starts a job step of it (`LATTICE_ALLOC_ID` says which) on its nodes.
//! Attach sessions in the run get the same. The directory goes with the run's workspace.
//! Everything here is best effort: a run whose token could not be had still runs (its
//! commands get the API's 401, which says why).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lattice_apis::Allocation;

use crate::agent::Ctx;
use crate::config::{Config, UnknownUser};
use crate::files::Dir;
use crate::runtime::RunAs;

/// The cluster CA in the credentials directory.
const CA_FILE: &str = "ca.crt";
/// Under the run's directory.
pub const DIR: &str = "creds";
/// The commands put on a job's `PATH`: `lattice` itself, and Slurm's through `lattice
/// compat`.
pub const COMMANDS: [&str; 8] = [
    "lattice", "srun", "sbatch", "squeue", "scancel", "salloc", "sinfo", "sacct",
];

/// `<run dir>/creds`.
pub fn dir(run_dir: &Path) -> PathBuf {
    run_dir.join(DIR)
}

fn token_path(run_dir: &Path) -> PathBuf {
    dir(run_dir).join("token")
}

fn bin_dir(run_dir: &Path) -> PathBuf {
    dir(run_dir).join("bin")
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

/// Ask the API server for the allocation's job token; `Ok(None)` with authentication off.
async fn request_token(ctx: &Ctx, alloc: &Allocation) -> Result<Option<String>, String> {
    let url = ctx.api.url(&format!(
        "/v1/allocations/{}/token?tenant={}&uid={}&attempt={}",
        alloc.metadata.name_str(),
        alloc.metadata.namespace_str(),
        alloc.metadata.uid.as_deref().unwrap_or_default(),
        alloc.status.as_ref().map_or(0, |s| s.attempt)
    ));
    let req = ctx.api.http.post(url).timeout(Duration::from_secs(10));
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let code = resp.status();
    let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
    if !code.is_success() {
        let msg = crate::api::error_message(code.as_u16(), &bytes);
        return Err(format!("{code}: {msg}"));
    }
    let body: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the API server's token answer does not decode: {e}"))?;
    Ok(body.get("token").and_then(|t| t.as_str()).map(String::from))
}

/// Whether the run of a job of its named user may hold that user's token: it runs as
/// them, or this agent serves one user (`--unknown-user=agent`, or not root).
fn may_hold_token(cfg: &Config, user: Option<&RunAs>) -> bool {
    user.is_some() || cfg.unknown_user == UnknownUser::Agent || !nix::unistd::geteuid().is_root()
}

/// Write the run's token and command wrappers (see the module docs) in `run_dir`.
pub async fn prepare(ctx: &Ctx, alloc: &Allocation, run_dir: &Dir, user: Option<&RunAs>) {
    let name = alloc.metadata.name_str();
    // Readable and searchable by everyone: the token file itself is the user's alone.
    let creds = match run_dir.ensure_dir(DIR, 0o755) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(allocation = %name, dir = %run_dir.join(DIR).display(), error = %e, "cannot make the job's credentials directory");
            return;
        }
    };
    let named = alloc
        .metadata
        .annotations
        .contains_key(lattice_apis::steps::USER_ANNOTATION);
    if named && may_hold_token(&ctx.cfg, user) {
        match request_token(ctx, alloc).await {
            Ok(Some(t)) => {
                let owner = user.map(|u| (u.uid, u.gid));
                if let Err(e) = creds.write_new("token", t.as_bytes(), 0o600, owner) {
                    tracing::warn!(allocation = %name, error = %e, "cannot write the job token");
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(allocation = %name, error = %e, "no job token; commands in the job cannot reach the API")
            }
        }
    }
    // The cluster CA, so that commands in the job trust the API server the agent does
    // (`LATTICE_CA_FILE`); public, readable by the job.
    if let Some(ca) = ctx.identity.as_ref().map(|i| i.ca_pem()) {
        if let Err(e) = creds.write_new(CA_FILE, ca.as_bytes(), 0o644, None) {
            tracing::warn!(allocation = %name, error = %e, "cannot write the cluster CA for the job");
        }
    }
    let Some(cli) = &ctx.cfg.lattice_cli else {
        return;
    };
    let made = creds.ensure_dir("bin", 0o755).and_then(|bin| {
        COMMANDS
            .iter()
            .try_for_each(|c| bin.write_new(c, wrapper(cli, c).as_bytes(), 0o755, None))
    });
    if let Err(e) = made {
        tracing::warn!(allocation = %name, error = %e, "cannot write the job's command wrappers");
    }
}

/// The run's environment additions, from what [`prepare`] left in `run_dir`.
pub fn add_env(cfg: &Config, run_dir: &Path, env: &mut BTreeMap<String, String>) {
    let api = cfg.job_api_url.as_deref().unwrap_or(&cfg.api_url);
    env.insert("LATTICE_API_URL".into(), api.to_string());
    let token = token_path(run_dir);
    if token.exists() {
        env.insert("LATTICE_TOKEN_FILE".into(), token.display().to_string());
    }
    let ca = dir(run_dir).join(CA_FILE);
    if ca.exists() {
        env.insert("LATTICE_CA_FILE".into(), ca.display().to_string());
    }
    let bin = bin_dir(run_dir);
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
