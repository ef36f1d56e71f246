//! Command-line definition (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::FlagValues;
use crate::output::OutputFormat;

/// The Lattice command-line client.
#[derive(Debug, Parser)]
#[command(
    name = "lattice",
    version,
    about = "Lattice: workload scheduler for HPC/AI clusters — command-line client",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags accepted by every command.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// API server URL [env: LATTICE_API_URL] [default: http://127.0.0.1:8080]
    #[arg(long, global = true, value_name = "URL")]
    pub api_url: Option<String>,
    /// Bearer token [env: LATTICE_TOKEN]
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// File holding the bearer token [env: LATTICE_TOKEN_FILE]
    #[arg(long, global = true, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Tenant (namespace) to work in [env: LATTICE_TENANT] [default: default]
    #[arg(
        long,
        short = 'n',
        short_alias = 't',
        global = true,
        value_name = "TENANT"
    )]
    pub tenant: Option<String>,
    /// PEM file of the CA that signed the server's certificate [env: LATTICE_CA_FILE]
    #[arg(long, global = true, value_name = "PATH")]
    pub certificate_authority: Option<PathBuf>,
    /// Do not verify the server's TLS certificate (insecure; for development only)
    #[arg(long, global = true)]
    pub insecure_skip_tls_verify: bool,
    /// Config file [env: LATTICE_CONFIG] [default: $XDG_CONFIG_HOME/lattice/config.yaml]
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

impl GlobalArgs {
    pub fn flag_values(&self) -> FlagValues {
        FlagValues {
            api_url: self.api_url.clone(),
            token: self.token.clone(),
            token_file: self.token_file.clone(),
            tenant: self.tenant.clone(),
            config: self.config.clone(),
            ca_file: self.certificate_authority.clone(),
            insecure: self.insecure_skip_tls_verify,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update objects from manifests (server-side apply)
    Apply(ApplyArgs),
    /// Show what `apply` would change (server-side dry run); exit 1 when there are changes
    Diff(DiffArgs),
    /// List objects or show some of them
    Get(GetArgs),
    /// Show an object in detail, with its conditions and recent events
    Describe(DescribeArgs),
    /// Delete objects by name, selector or manifest
    Delete(DeleteArgs),
    /// List the kinds the server serves
    ApiResources(ApiResourcesArgs),
    /// Show client and server versions
    Version(VersionArgs),
    /// View or change the client config file
    #[command(subcommand)]
    Config(ConfigCommand),
    // The product's workload verbs (submit, status, cancel, logs, nodes, ...) land here as
    // further variants, each with its module under `cmd/`.
}

/// `--dry-run` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum DryRun {
    /// Really write.
    #[default]
    None,
    /// Send the request with dryRun=All: validated and computed, not persisted.
    Server,
}

/// Manifest sources.
#[derive(Debug, Clone, Default, Args)]
pub struct FileArgs {
    /// File, directory or - (stdin); repeatable
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub filename: Vec<String>,
    /// Descend into subdirectories of -f directories
    #[arg(short = 'R', long)]
    pub recursive: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub files: FileArgs,
    /// `server` validates on the server without persisting
    #[arg(long, value_enum, default_value_t = DryRun::None, num_args = 0..=1, default_missing_value = "server")]
    pub dry_run: DryRun,
    /// Take ownership of fields other managers own
    #[arg(long)]
    pub force_conflicts: bool,
    /// Delete objects of this applyset that are no longer in the manifests (needs --applyset)
    #[arg(long)]
    pub prune: bool,
    /// ApplySet name: objects get the label applyset.kubernetes.io/part-of=NAME
    #[arg(long, value_name = "NAME")]
    pub applyset: Option<String>,
    /// Field manager name for server-side apply
    #[arg(long, default_value = crate::client::DEFAULT_FIELD_MANAGER)]
    pub field_manager: String,
    /// Output format for applied objects (name prints `kind/name` only)
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub files: FileArgs,
    /// Take ownership of fields other managers own
    #[arg(long)]
    pub force_conflicts: bool,
    /// Field manager name for server-side apply
    #[arg(long, default_value = crate::client::DEFAULT_FIELD_MANAGER)]
    pub field_manager: String,
}

#[derive(Debug, Clone, Default, Args)]
pub struct GetArgs {
    /// Kind (allocation, alloc, allocations, ...) or KIND/NAME
    pub kind: String,
    /// Object names (all when omitted)
    pub names: Vec<String>,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Label selector, e.g. `app=train,tier!=test`
    #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Field selector, e.g. `status.phase=Running`
    #[arg(long, value_name = "SELECTOR")]
    pub field_selector: Option<String>,
    /// List across all tenants
    #[arg(short = 'A', long)]
    pub all_tenants: bool,
    /// After listing, watch for changes
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Watch for changes without listing first
    #[arg(long)]
    pub watch_only: bool,
    /// Omit the header row
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DescribeArgs {
    /// Kind or KIND/NAME
    pub kind: String,
    /// Object name(s)
    pub names: Vec<String>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct DeleteArgs {
    /// Kind or KIND/NAME (omit with -f)
    pub kind: Option<String>,
    /// Object names
    pub names: Vec<String>,
    #[command(flatten)]
    pub files: FileArgs,
    /// Delete every object matching this label selector
    #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// `server` validates on the server without deleting
    #[arg(long, value_enum, default_value_t = DryRun::None, num_args = 0..=1, default_missing_value = "server")]
    pub dry_run: DryRun,
    /// Treat "not found" as success
    #[arg(long)]
    pub ignore_not_found: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct ApiResourcesArgs {
    /// Omit the header row
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct VersionArgs {
    /// Client version only; do not contact the server
    #[arg(long)]
    pub client: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ConfigCommand {
    /// Print the config file and the effective settings
    View {
        /// Show the token instead of REDACTED
        #[arg(long)]
        raw: bool,
    },
    /// Set the API server URL
    SetUrl { url: String },
    /// Set the bearer token (or --file to store a token file path)
    SetToken {
        /// The token (omit with --file)
        token: Option<String>,
        /// Store the path of a token file instead of the token
        #[arg(long, value_name = "PATH")]
        file: Option<String>,
    },
    /// Set the default tenant
    SetTenant { tenant: String },
}
