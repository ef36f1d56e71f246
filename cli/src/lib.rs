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
pub mod login;
pub mod manifest;
pub mod output;

use std::future::Future;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::pin::Pin;

use chrono::{DateTime, Utc};

use crate::cli::{Cli, Command};
use crate::client::Client;
use crate::config::{Env, Settings};
use crate::errors::CliError;
use crate::kinds::Catalog;
use crate::output::OutputFormat;

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
    /// Global `-o`.
    pub output: Option<OutputFormat>,
    /// Global `-q`.
    pub quiet: bool,
    /// Global `-v`.
    pub verbose: bool,
    /// Global `--vcluster`.
    pub vcluster: Option<String>,
    /// Environment (USER, LATTICE_*, HOME).
    pub env: Env,
    /// Working directory (submit directory, ./lattice-compat.yaml).
    pub cwd: PathBuf,
    /// Standard output is a terminal (refreshing views clear the screen).
    pub tty: bool,
}

impl Ctx {
    pub fn now(&self) -> DateTime<Utc> {
        self.fixed_now.unwrap_or_else(Utc::now)
    }

    /// The output format, `default` when `-o` was not given.
    pub fn output_or(&self, default: OutputFormat) -> OutputFormat {
        self.output.unwrap_or(default)
    }

    /// Whom the server knows this CLI's caller as: the subject of its bearer token (the
    /// server sets `lattice.dev/user` from it), else the local user (`$USER`, for a server
    /// without authentication). The token is only read, not verified: the server does that.
    pub fn user(&self) -> Option<String> {
        self.settings
            .token
            .as_deref()
            .and_then(token_subject)
            .or_else(|| self.env.get("USER").or_else(|| self.env.get("LOGNAME")))
    }

    /// True when the tenant was chosen by flag or environment (not defaulted).
    pub fn tenant_explicit(&self) -> bool {
        matches!(
            self.settings.tenant_source,
            config::Source::Flag | config::Source::Env
        )
    }
}

/// The `sub` claim of a JWT (`header.payload.signature`, base64url JSON).
fn token_subject(token: &str) -> Option<String> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    v.get("sub")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(String::from)
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
    /// Working directory; the process's when `None`.
    pub cwd: Option<PathBuf>,
    /// Standard output is a terminal.
    pub tty: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            catalog: None,
            now: None,
            stdin: Box::new(std::io::empty()),
            shutdown: None,
            cwd: None,
            tty: false,
        }
    }
}

/// Parses the command line. `lattice compat TOOL ARGS...` is split by hand so that the
/// Slurm tool's own flags (`-o`, `-t`, `-n`, `-v`, ...) are never taken for global flags.
pub fn parse_args<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    if argv.len() >= 3 && argv[1] == "compat" && !argv[2].to_string_lossy().starts_with('-') {
        let mut cli = Cli::try_parse_from(&argv[..3])?;
        if let Command::Compat(c) = &mut cli.command {
            c.args = argv[3..]
                .iter()
                .map(|a| a.to_string_lossy().to_string())
                .collect();
        }
        return Ok(cli);
    }
    Cli::try_parse_from(launch_ntasks(argv))
}

/// Global options (`global = true`) that take a value, valid before and after the
/// subcommand. `--opt=value` forms take no next word.
const GLOBAL_LONG_WITH_VALUE: [&str; 8] = [
    "--api-url",
    "--token",
    "--token-file",
    "--tenant",
    "--output",
    "--vcluster",
    "--config",
    "--certificate-authority",
];
/// `lattice launch`'s own options that take a value.
const LAUNCH_LONG_WITH_VALUE: [&str; 8] = [
    "--alloc",
    "--nodes",
    "--ntasks",
    "--tasks-per-node",
    "--ntasks-per-node",
    "--env",
    "--chdir",
    "--export",
];

/// In `lattice launch`, `-n N` is the task count (as in the seed and in srun), not the
/// global tenant flag: it is rewritten to `--ntasks N` before the command starts. The walk
/// skips the values of options that take one (so `-N 2 -n 4`, `--env K=V -n 2` and
/// `lattice -o json launch -n 4` are all seen) and stops at `--` or at the command.
fn launch_ntasks(argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    /// Words an option at `argv[i]` takes (itself and a separate value, if any), given
    /// its short options that take a value; `None` for a positional word or `--`.
    fn option_len(argv: &[std::ffi::OsString], i: usize, short_with_value: &str) -> Option<usize> {
        let t = argv[i].to_string_lossy();
        if t == "--" || t == "-" || !t.starts_with('-') {
            return None;
        }
        if t.starts_with("--") {
            let takes = !t.contains('=')
                && (GLOBAL_LONG_WITH_VALUE.contains(&t.as_ref())
                    || LAUNCH_LONG_WITH_VALUE.contains(&t.as_ref()));
            return Some(if takes { 2 } else { 1 });
        }
        // A cluster of short flags (`-qv`); the first one taking a value takes the rest
        // of the word (`-ojson`), else the next word (`-o json`).
        let body = &t[1..];
        for (at, c) in body.char_indices() {
            if short_with_value.contains(c) {
                return Some(if at + c.len_utf8() == body.len() {
                    2
                } else {
                    1
                });
            }
        }
        Some(1)
    }
    // Before the subcommand: global options (`-n`/`-t` is the tenant there).
    let mut at = 1;
    loop {
        match argv.get(at) {
            None => return argv,
            Some(a) if a == "launch" => break,
            Some(_) => match option_len(&argv, at, "nto") {
                Some(n) => at += n,
                // Another subcommand (or `--`): nothing to rewrite.
                None => return argv,
            },
        }
    }
    let mut out: Vec<std::ffi::OsString> = argv[..=at].to_vec();
    let mut i = at + 1;
    while i < argv.len() {
        let t = argv[i].to_string_lossy().to_string();
        // A short option with a value (`-n 4`, `-n4`, `-ln 4`, `-N2`, `-D/tmp`): spelled
        // long, as `-n` is the task count here and clap would take an attached value
        // (`-N2`) for the start of the command (it takes hyphen values).
        if t.starts_with('-') && !t.starts_with("--") {
            let body = &t[1..];
            let long = |c: char| match c {
                'n' => Some("--ntasks"),
                'N' => Some("--nodes"),
                'D' => Some("--chdir"),
                't' => Some("--tenant"),
                'o' => Some("--output"),
                _ => None,
            };
            if let Some((pos, name)) = body
                .char_indices()
                .find_map(|(pos, c)| Some((pos, long(c)?)))
            {
                if pos > 0 {
                    out.push(format!("-{}", &body[..pos]).into());
                }
                let rest = &body[pos + 1..];
                if rest.is_empty() {
                    out.push(name.into());
                    if let Some(v) = argv.get(i + 1) {
                        out.push(v.clone());
                    }
                    i += 2;
                } else {
                    out.push(format!("{name}={}", rest.trim_start_matches('=')).into());
                    i += 1;
                }
                continue;
            }
        }
        match option_len(&argv, i, "") {
            Some(n) => {
                let end = (i + n).min(argv.len());
                out.extend(argv[i..end].iter().cloned());
                i = end;
            }
            // `--` or the command: the rest is the command's.
            None => {
                out.extend(argv[i..].iter().cloned());
                break;
            }
        }
    }
    out
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
    match &cli.command {
        Command::Config(c) => return cmd::config_cmd::run(c, &flags, env, out),
        Command::Completion(a) => return cmd::completion::run(a, out),
        Command::CompatAliases => return cmd::compat::aliases(out),
        Command::Down(a) => return cmd::up::down(a, out, err).await,
        Command::Admin(a) => {
            if let cli::AdminCommand::Config(c) = a.as_ref() {
                if !c.is_cluster() {
                    return cmd::admin::config(c, &flags, env, out);
                }
            }
            // Offline: the CA's files, no server.
            if let cli::AdminCommand::Pki(p) = a.as_ref() {
                return cmd::pki::run(p, out);
            }
        }
        _ => {}
    }
    let mut settings = config::load(&flags, env, false)?;
    let ca_pem = match &settings.ca_file {
        Some(p) => Some(std::fs::read(p).map_err(|e| {
            CliError::new(format!("read CA file {}", p.display()), e.to_string())
                .hint("check --certificate-authority, LATTICE_CA_FILE or ca_file in the config")
        })?),
        None => None,
    };
    match &cli.command {
        Command::Login(a) => {
            let server = a
                .server
                .as_deref()
                .map(config::normalize_url)
                .unwrap_or_else(|| settings.api_url.clone());
            let req = login::LoginRequest {
                server: &server,
                flow: a.flow,
                issuer: a.issuer.as_deref(),
                client_id: a.client_id.as_deref(),
                insecure: settings.insecure,
                ca_pem: ca_pem.as_deref(),
            };
            let mut input = std::io::BufReader::new(&mut opts.stdin);
            let path = login::login(env, &req, err, &mut input).await?;
            writeln!(out, "Logged in to {server} (tokens in {}).", path.display())?;
            settings.api_url = server;
            settings.token =
                login::token_for(env, &settings.api_url, settings.insecure, ca_pem.as_deref())
                    .await?;
        }
        Command::Logout => {
            let had =
                login::logout(env, &settings.api_url, settings.insecure, ca_pem.as_deref()).await?;
            writeln!(
                out,
                "{}",
                if had {
                    format!("Logged out of {}.", settings.api_url)
                } else {
                    format!("Not logged in to {}.", settings.api_url)
                }
            )?;
            return Ok(0);
        }
        _ => {}
    }
    // Without a configured token, this server's login, if any (refreshed when due).
    if settings.token.is_none() {
        settings.token =
            login::token_for(env, &settings.api_url, settings.insecure, ca_pem.as_deref()).await?;
    }
    let tls = client::TlsOptions {
        ca_pem,
        insecure: settings.insecure,
        user_agent: Some(client::USER_AGENT.to_string()),
    };
    let client = Client::with_tls(&settings.api_url, settings.token.clone(), &tls)
        .map_err(|e| CliError::from_client("set up the HTTP client", e))?;
    let output = cli.global.output.or_else(|| {
        settings
            .output_format
            .as_deref()
            .and_then(|f| <OutputFormat as clap::ValueEnum>::from_str(f, true).ok())
    });
    let mut ctx = Ctx {
        client,
        catalog: opts.catalog.take().unwrap_or_else(Catalog::with_builtins),
        tenant: settings.tenant.clone(),
        settings,
        fixed_now: opts.now,
        output,
        quiet: cli.global.quiet,
        verbose: cli.global.verbose,
        vcluster: cli.global.vcluster.clone().filter(|v| !v.is_empty()),
        env: env.clone(),
        cwd: opts
            .cwd
            .take()
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from(".")),
        tty: opts.tty,
    };
    let shutdown: Shutdown = opts
        .shutdown
        .take()
        .unwrap_or_else(|| Box::pin(std::future::pending::<()>()));
    match cli.command {
        Command::Apply(mut a) => {
            a.output = ctx.output;
            cmd::apply::run(&mut ctx, &a, &mut opts.stdin, out, err).await
        }
        Command::Diff(a) => cmd::diff::run(&mut ctx, &a, &mut opts.stdin, out, err).await,
        Command::Get(mut a) => {
            a.output = ctx.output.unwrap_or_default();
            cmd::get::run(&mut ctx, &a, out, err, shutdown).await
        }
        Command::Describe(a) => cmd::describe::run(&mut ctx, &a, out, err).await,
        Command::Delete(a) => cmd::delete::run(&mut ctx, &a, &mut opts.stdin, out, err).await,
        Command::ApiResources(a) => cmd::api_resources::run(&mut ctx, &a, out).await,
        Command::Version(a) => cmd::version::run(&mut ctx, &a, out).await,
        Command::Submit(a) => {
            cmd::submit::run(&mut ctx, &a, &mut opts.stdin, out, err, shutdown).await
        }
        Command::Status(a) => cmd::status::run(&mut ctx, &a, out, err, shutdown).await,
        Command::Cancel(a) => cmd::status::cancel(&mut ctx, &a, out, err).await,
        Command::Watch(a) => cmd::status::watch(&mut ctx, &a, out, err, shutdown).await,
        Command::History(a) => cmd::status::history(&mut ctx, &a, out, err).await,
        Command::Usage(a) => cmd::usage::run(&mut ctx, &a, out).await,
        Command::Logs(a) => cmd::logs::run(&mut ctx, &a, out, err, shutdown).await,
        Command::Launch(a) => cmd::launch::launch(&ctx, &a, out, err, shutdown).await,
        Command::Session(a) => {
            let shell = cmd::launch::Shell::for_session(&a);
            cmd::launch::session(&mut ctx, "session", &a, shell, out, err, shutdown).await
        }
        Command::Attach(a) => cmd::attach::run(&ctx, &a, out, err, shutdown).await,
        Command::Nodes(a) => cmd::nodes::list(&mut ctx, &a, out, err).await,
        Command::Node(c) => cmd::nodes::node(&mut ctx, &c, out, err).await,
        Command::Dag(c) => cmd::dag::run(&mut ctx, &c, &mut opts.stdin, out, err).await,
        Command::Admin(c) => cmd::admin::run(&mut ctx, &c, out, err).await,
        Command::Auth(c) => cmd::auth::run(&ctx, &c, out).await,
        Command::Whoami => cmd::auth::run(&ctx, &cli::AuthCommand::Whoami, out).await,
        Command::Audit(c) => cmd::auth::audit(&ctx, &c, &mut opts.stdin, out).await,
        // Logged in: what the server makes of the new token.
        Command::Login(_) => cmd::auth::run(&ctx, &cli::AuthCommand::Whoami, out).await,
        Command::Logout => Ok(0),
        Command::Compat(a) => {
            cmd::compat::run(&mut ctx, &a, &mut opts.stdin, out, err, shutdown).await
        }
        Command::Up(a) => cmd::up::up(&mut ctx, &a, out, err, shutdown).await,
        Command::Complete(a) => cmd::completion::complete(&mut ctx, &a, out).await,
        Command::Config(_) | Command::Completion(_) | Command::CompatAliases | Command::Down(_) => {
            Ok(0)
        }
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
