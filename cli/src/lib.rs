//! `lattice`: the command-line client of the Lattice API.
//!
//! Every command is a library function that writes to the writers it is given, so tests
//! can run commands against a fake server and capture their output. `main.rs` only parses
//! arguments, picks the real stdout/stderr, and exits with the code [`run`] returns.

pub mod cli;
pub mod client;
pub mod cmd;
pub mod config;
pub mod errors;
pub mod kinds;
pub mod manifest;
pub mod output;

use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;

use chrono::{DateTime, Utc};

use crate::cli::{Cli, Command};
use crate::client::Client;
use crate::config::{Env, Settings};
use crate::errors::CliError;
use crate::kinds::Catalog;

/// A future that resolves when the user asks to stop (Ctrl-C); watches end on it.
pub type Shutdown = Pin<Box<dyn Future<Output = ()>>>;

/// Everything a command needs: the client, kind catalog, current tenant and clock.
pub struct Ctx {
    pub client: Client,
    pub catalog: Catalog,
    pub tenant: String,
    pub settings: Settings,
    /// Fixed "now" for reproducible ages (tests); the real clock when `None`.
    pub fixed_now: Option<DateTime<Utc>>,
}

impl Ctx {
    pub fn now(&self) -> DateTime<Utc> {
        self.fixed_now.unwrap_or_else(Utc::now)
    }
}

/// Knobs for embedding the CLI (tests).
pub struct RunOptions {
    /// Kind catalog to use instead of the built-in one.
    pub catalog: Option<Catalog>,
    /// Fixed clock.
    pub now: Option<DateTime<Utc>>,
    /// Standard input (for `-f -`).
    pub stdin: Box<dyn Read>,
    /// Resolves when the user interrupts; a never-ending future when `None`.
    pub shutdown: Option<Shutdown>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            catalog: None,
            now: None,
            stdin: Box::new(std::io::empty()),
            shutdown: None,
        }
    }
}

/// Runs a parsed command line; errors are printed to `err`. Returns the exit code.
pub async fn run(
    cli: Cli,
    env: &Env,
    opts: RunOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    match dispatch(cli, env, opts, out, err).await {
        Ok(code) => code,
        // The reader went away (`lattice get ... | head`): stop quietly.
        Err(e) if e.exit_code == BROKEN_PIPE_EXIT => e.exit_code,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            e.exit_code
        }
    }
}

async fn dispatch(
    cli: Cli,
    env: &Env,
    mut opts: RunOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, CliError> {
    let flags = cli.global.flag_values();
    if let Command::Config(c) = &cli.command {
        return cmd::config_cmd::run(c, &flags, env, out);
    }
    let settings = config::load(&flags, env, false)?;
    let tls = client::TlsOptions {
        ca_pem: match &settings.ca_file {
            Some(p) => Some(std::fs::read(p).map_err(|e| {
                CliError::new(format!("read CA file {}", p.display()), e.to_string())
                    .hint("check --certificate-authority, LATTICE_CA_FILE or ca_file in the config")
            })?),
            None => None,
        },
        insecure: settings.insecure,
    };
    let client = Client::with_tls(&settings.api_url, settings.token.clone(), &tls)
        .map_err(|e| CliError::from_client("set up the HTTP client", e))?;
    let mut ctx = Ctx {
        client,
        catalog: opts.catalog.take().unwrap_or_else(Catalog::with_builtins),
        tenant: settings.tenant.clone(),
        settings,
        fixed_now: opts.now,
    };
    let shutdown: Shutdown = opts
        .shutdown
        .take()
        .unwrap_or_else(|| Box::pin(std::future::pending::<()>()));
    match cli.command {
        Command::Apply(a) => cmd::apply::run(&mut ctx, &a, &mut opts.stdin, out, err).await,
        Command::Diff(a) => cmd::diff::run(&mut ctx, &a, &mut opts.stdin, out, err).await,
        Command::Get(a) => cmd::get::run(&mut ctx, &a, out, err, shutdown).await,
        Command::Describe(a) => cmd::describe::run(&mut ctx, &a, out, err).await,
        Command::Delete(a) => cmd::delete::run(&mut ctx, &a, &mut opts.stdin, out, err).await,
        Command::ApiResources(a) => cmd::api_resources::run(&mut ctx, &a, out).await,
        Command::Version(a) => cmd::version::run(&mut ctx, &a, out).await,
        Command::Config(_) => Ok(0),
    }
}

/// Exit code when stdout is closed early (128 + SIGPIPE, like a shell).
pub const BROKEN_PIPE_EXIT: i32 = 141;

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        let err = CliError::new("write output", e.to_string());
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            err.exit_code(BROKEN_PIPE_EXIT)
        } else {
            err
        }
    }
}
