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
        visible_short_alias = 't',
        global = true,
        value_name = "TENANT"
    )]
    pub tenant: Option<String>,
    /// Output format: table (default), wide, json, yaml, name
    #[arg(short = 'o', long, global = true, value_enum)]
    pub output: Option<OutputFormat>,
    /// Suppress non-essential output (warnings, progress, empty-result notes)
    #[arg(short = 'q', long, global = true)]
    pub quiet: bool,
    /// Verbose output (pending reasons, extra detail)
    #[arg(short = 'v', long, global = true)]
    pub verbose: bool,
    /// vCluster to submit to / filter by [env: LATTICE_VCLUSTER for submit]
    #[arg(long, global = true, value_name = "VCLUSTER")]
    pub vcluster: Option<String>,
    /// Disable colored output (the CLI never prints colors; accepted for compatibility)
    #[arg(long, global = true)]
    pub no_color: bool,
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
    /// Submit a batch script (#SBATCH/#LATTICE directives) or `-- CMD ARGS` as an Allocation
    Submit(Box<SubmitArgs>),
    /// Show allocations (your own by default)
    Status(StatusArgs),
    /// Cancel allocations (the objects are kept, marked for cancellation)
    Cancel(CancelArgs),
    /// Print an allocation's state changes as they happen, until it finishes
    Watch(WatchArgs),
    /// Print an allocation's output (stdout and stderr)
    Logs(LogsArgs),
    /// Run a command inside a running allocation (a job step, like srun in an allocation)
    Launch(LaunchArgs),
    /// Hold nodes for interactive work: a terminal on the first node, or `-- CMD` here (like salloc)
    Session(Box<SessionArgs>),
    /// Open a terminal (or run a command) inside a running allocation, on one of its nodes
    Attach(AttachArgs),
    /// List the cluster's nodes, or show one
    Nodes(NodesArgs),
    /// Drain, undrain, disable, enable or show one node
    #[command(subcommand)]
    Node(NodeCommand),
    /// Finished allocations with start, end and exit status
    History(HistoryArgs),
    /// Node- and GPU-hours used per tenant and user over the budget period (soft quotas)
    Usage(UsageArgs),
    /// DAG workflows: submit, status, list, cancel
    #[command(subcommand)]
    Dag(DagCommand),
    /// Administration: tenants, vClusters, configuration, Raft status
    #[command(subcommand)]
    Admin(Box<AdminCommand>),
    /// Who you are and what you may do: `whoami`, `can-i VERB RESOURCE`
    #[command(subcommand)]
    Auth(AuthCommand),
    /// The audit log: query, export, verify
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Log in through the site's identity provider (OIDC); the tokens are kept for this
    /// server under ~/.config/lattice/tokens (0600) and refreshed silently
    Login(LoginArgs),
    /// Forget this server's login (and revoke its refresh token)
    Logout,
    /// The user the server sees, its groups and the roles it holds
    Whoami,
    /// Print a shell completion script (bash, zsh, fish, ...)
    Completion(CompletionArgs),
    /// Print shell functions sbatch, squeue, scancel, salloc, srun, sinfo, sacct
    /// (use: eval "$(lattice compat-aliases)")
    CompatAliases,
    /// Slurm front-end: `lattice compat sbatch|squeue|scancel|sinfo|sacct|srun|salloc ARGS`
    #[command(hide = true)]
    Compat(CompatArgs),
    /// Start a local cluster: lattice-server and N lattice-agent processes
    Up(UpArgs),
    /// Stop a cluster started by `lattice up`
    Down(DownArgs),
    /// Names for shell completion (allocations, nodes, vclusters, dags, tenants)
    #[command(name = "__complete", hide = true)]
    Complete(CompleteArgs),
}

/// `submit --dry-run` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SubmitDryRun {
    /// Translate locally and print the Allocation; no server needed.
    Client,
    /// Also have the server validate and default it (dryRun=All); nothing is stored.
    Server,
}

#[derive(Debug, Clone, Default, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub flags: lattice_compat::SubmitFlags,
    /// Print only the allocation name
    #[arg(long)]
    pub parsable: bool,
    /// Print the Allocation (-o yaml|json) and warnings without submitting
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<SubmitDryRun>,
    /// Wait until the allocation finishes; exit 0 only when it Completed
    #[arg(long)]
    pub wait: bool,
    /// Site mapping file [env: LATTICE_COMPAT_CONFIG] [default: ./lattice-compat.yaml, then
    /// ~/.config/lattice/lattice-compat.yaml]
    #[arg(long, value_name = "PATH")]
    pub compat_config: Option<PathBuf>,
    /// Batch script (- reads it from stdin)
    pub script: Option<String>,
    /// Command and arguments to run instead of a script (after `--`; no shell re-quoting)
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct StatusArgs {
    /// Allocation IDs (names); your allocations when omitted
    pub ids: Vec<String>,
    /// Only these states (comma separated): pending, staging, running, checkpointing,
    /// suspended, completed, failed, cancelled; also active, finished
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    pub state: Vec<String>,
    /// Every allocation of the tenant, not only yours
    #[arg(long)]
    pub all: bool,
    /// Allocations submitted by this user
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Across all tenants
    #[arg(short = 'A', long)]
    pub all_tenants: bool,
    /// Refresh every few seconds until Ctrl-C
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch
    #[arg(long, default_value_t = 5, value_name = "SECONDS", hide = true)]
    pub interval: u64,
    /// Print only the number of matching allocations
    #[arg(long)]
    pub count: bool,
    /// Also list the per-task allocations of task groups
    #[arg(long)]
    pub tasks: bool,
    /// Omit the header row
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct CancelArgs {
    /// Allocation IDs (names)
    pub ids: Vec<String>,
    /// With --all-mine: only allocations in these states (comma separated)
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    pub state: Vec<String>,
    /// Cancel all your unfinished allocations (narrow with --state)
    #[arg(long)]
    pub all_mine: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct WatchArgs {
    /// Allocation ID (name)
    pub id: String,
}

#[derive(Debug, Clone, Default, Args)]
pub struct LaunchArgs {
    /// Allocation to run in [default: $LATTICE_ALLOC_ID, then $SLURM_JOB_ID]
    #[arg(long, value_name = "ID")]
    pub alloc: Option<String>,
    /// Tasks in all (`-n N` also works here; use -t/--tenant for the tenant) [default: one
    /// per node, or nodes × --tasks-per-node]
    #[arg(long, value_name = "N")]
    pub ntasks: Option<u32>,
    /// Nodes to use, the allocation's first ones [default: all, or as many as the tasks need]
    #[arg(short = 'N', long, value_name = "N")]
    pub nodes: Option<u32>,
    /// Tasks on each node
    #[arg(long, visible_alias = "ntasks-per-node", value_name = "K")]
    pub tasks_per_node: Option<u32>,
    /// Prefix output lines with the node name
    #[arg(short = 'l', long)]
    pub label: bool,
    /// MPI wire-up: pmi2 (the agent's PMI server: PMI-2 and MPICH's PMI-1, through
    /// PMI_FD), pmix (OpenMPI, where the agents are built with PMIx), or none [default: none]
    #[arg(long, value_name = "pmi2|pmix|none")]
    pub mpi: Option<String>,
    /// How ranks are laid out over the nodes: block (consecutive ranks share a node) or
    /// cyclic [default: block]
    #[arg(short = 'm', long, value_name = "block|cyclic")]
    pub distribution: Option<String>,
    /// GPUs bound to each task (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES)
    #[arg(long, value_name = "N")]
    pub gpus_per_task: Option<u32>,
    /// Bind each task to its own equal share of the node's CPUs (cores), or not (none)
    /// [default: none]
    #[arg(long, value_name = "cores|none")]
    pub cpu_bind: Option<String>,
    /// Extra environment variable for the tasks (repeatable)
    #[arg(long, value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory on the nodes [default: the current directory]
    #[arg(short = 'D', long, value_name = "DIR")]
    pub chdir: Option<String>,
    /// Your environment variables the tasks get, as srun's --export: ALL (all but
    /// LATTICE_*, SLURM_*, HOME, USER, LOGNAME, PWD, OLDPWD, SHLVL, _, HOSTNAME), NONE, or
    /// VAR[,VAR=VALUE...] (only those; with ALL, in addition) [default: ALL]
    #[arg(long, value_name = "ALL|NONE|VARS")]
    pub export: Option<String>,
    /// Run CMD on a terminal on the allocation's first node (`lattice attach`)
    #[arg(long)]
    pub pty: bool,
    /// Command and arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct SessionArgs {
    /// Resources as for submit (--nodes, --walltime, --constraint, --vcluster, --uenv, ...)
    #[command(flatten)]
    pub flags: lattice_compat::SubmitFlags,
    /// Open the shell here with the allocation's variables (like salloc) instead of a
    /// terminal on its first node
    #[arg(long)]
    pub local: bool,
    /// Command to run here instead of a terminal on the first node (after `--`)
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct AttachArgs {
    /// Allocation ID (name)
    pub id: String,
    /// Node to attach on [default: the allocation's first node]
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Command line to run instead of your login shell (run by `sh -c` on the node)
    #[arg(long, value_name = "CMD", conflicts_with = "args")]
    pub command: Option<String>,
    /// Run on a terminal even when this is not one
    #[arg(long, conflicts_with = "no_tty")]
    pub tty: bool,
    /// No terminal, even when this is one (output and exit status only)
    #[arg(long)]
    pub no_tty: bool,
    /// Do not forward standard input
    #[arg(long)]
    pub no_stdin: bool,
    /// Command and arguments (after `--`)
    #[arg(last = true, value_name = "CMD")]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct LogsArgs {
    /// Allocation ID (name)
    pub id: String,
    /// Keep printing new output until the allocation finishes (or Ctrl-C)
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only the last N lines
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,
    /// Only standard error
    #[arg(long, conflicts_with = "stdout")]
    pub stderr: bool,
    /// Only standard output
    #[arg(long)]
    pub stdout: bool,
    /// Only this node's output
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Only output after this time: RFC 3339 (2026-03-05T10:00:00Z) or a duration ago (10m, 2h)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only output before this time: RFC 3339 or a duration ago
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Prefix each line with its timestamp
    #[arg(long)]
    pub timestamps: bool,
    /// With several nodes, print their lines as they are (no `<node>| ` prefix)
    #[arg(long)]
    pub no_prefix: bool,
    /// Prefix lines with `<node>| ` even with one node (`launch -l`, `srun -l`)
    #[arg(skip)]
    pub label: bool,
    /// Write the output to files instead: stdout to the submission's `--output` path
    /// (default `slurm-%j.out`), stderr to its `--error` path (default: the same file);
    /// relative paths are taken from the submission directory; Slurm's `%j %x %u %A %a %N
    /// %%` patterns are expanded
    #[arg(long, conflicts_with_all = ["follow", "stderr", "stdout", "tail", "node", "since", "until"])]
    pub download: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct NodesArgs {
    /// Node names; all nodes when omitted (one name shows its details)
    pub ids: Vec<String>,
    /// Only these states (comma separated): ready, draining, drained, down, degraded,
    /// booting, failed, unknown; also allocated, idle
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    pub state: Vec<String>,
    /// Omit the header row
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Clone, Args)]
pub struct NodeDrainArgs {
    /// Node name
    pub id: String,
    /// Why (shown in `lattice nodes -o wide`)
    #[arg(long)]
    pub reason: Option<String>,
    /// Checkpoint running allocations instead of waiting for them
    #[arg(long)]
    pub urgent: bool,
}

#[derive(Debug, Clone, Args)]
pub struct NodeIdArg {
    /// Node name
    pub id: String,
}

#[derive(Debug, Clone, Subcommand)]
pub enum NodeCommand {
    /// Stop placing work on the node; Ready → Draining → Drained once its allocations end
    Drain(NodeDrainArgs),
    /// Make a Drained node schedulable again (only from Drained)
    Undrain(NodeIdArg),
    /// Take the node out of service at once (it goes Down)
    Disable(NodeIdArg),
    /// Undo `disable`
    Enable(NodeIdArg),
    /// Show the node's state, hardware, owner and conditions
    Status(NodeIdArg),
}

#[derive(Debug, Clone, Default, Args)]
pub struct UsageArgs {
    /// Every tenant (admins), not only the current one
    #[arg(short = 'A', long)]
    pub all_tenants: bool,
    /// Look back this many days (default: the tenant's budget period)
    #[arg(long, value_name = "N")]
    pub days: Option<u64>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct HistoryArgs {
    /// Only allocations that ended at or after this time: RFC 3339, a date (2026-03-01) or a
    /// duration ago (7d)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only allocations that ended before this time
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only these end states (comma separated): completed, failed, cancelled
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    pub state: Vec<String>,
    /// Every allocation of the tenant, not only yours
    #[arg(long)]
    pub all: bool,
    /// Allocations submitted by this user
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Omit the header row
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DagCommand {
    /// Submit a DAG (the short `name:` + `allocations:` form, or a `kind: Dag` manifest)
    Submit {
        /// DAG file (- reads stdin)
        file: String,
        /// Print the Dag manifest without submitting (client: no server; server: validated)
        #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "client")]
        dry_run: Option<SubmitDryRun>,
    },
    /// Show a DAG's allocations and their states (--graph: arrows)
    Status {
        /// DAG ID (name)
        id: String,
        /// Draw the dependency graph
        #[arg(long)]
        graph: bool,
    },
    /// List DAGs
    List {
        /// Omit the header row
        #[arg(long)]
        no_headers: bool,
    },
    /// Cancel a DAG (its unfinished allocations are cancelled)
    Cancel {
        /// DAG ID (name)
        id: String,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Tenants and their quotas
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// vClusters: scheduler type, weights, configuration
    #[command(subcommand)]
    Vcluster(Box<VClusterCommand>),
    /// Cluster settings (scheduling.max_dag_size) and this CLI's own defaults
    ///
    /// Cluster settings live on the server and apply to the whole cluster at once:
    /// `get KEY`, `set KEY=VALUE` and `unset KEY` (back to the server's flag, e.g.
    /// `lattice-server --max-dag-size`) of scheduling.max_dag_size; `cluster` lists them.
    /// Changing one needs administrator credentials.
    ///
    /// Every other key is a client-side default: `get` and `set` only edit the local CLI
    /// config file (`--config`, `$LATTICE_CONFIG`, `$XDG_CONFIG_HOME/lattice/config.yaml`
    /// or `~/.config/lattice/config.yaml`), nothing is sent to the server. The CLI reads the
    /// keys api_url, token, token_file, tenant (default_tenant), default_vcluster and
    /// output_format; any other key is stored but has no effect (the seed's other cluster
    /// settings, `accounting.enabled`, ..., do not exist on the server yet).
    #[command(subcommand)]
    Config(AdminConfigCommand),
    /// Raft / store status of the server
    #[command(subcommand)]
    Raft(RaftCommand),
    /// Node identities: bootstrap tokens for new nodes, revoking a node's certificates
    #[command(subcommand)]
    Node(AdminNodeCommand),
    /// The cluster CA and its certificates (store members, administrators, ...), offline
    #[command(subcommand)]
    Pki(crate::cmd::pki::PkiCommand),
    /// API tokens for automation accounts (GitOps bots, CI, site controllers)
    #[command(subcommand)]
    Token(AdminTokenCommand),
    /// Same as `lattice node drain`
    #[command(hide = true)]
    Drain(NodeDrainArgs),
    /// Same as `lattice node undrain`
    #[command(hide = true)]
    Undrain(NodeIdArg),
}

/// `lattice audit ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Records of the server's audit log that match (newest last); the global -n/--tenant
    /// narrows to one tenant's records (what its tenant admins may read)
    Query {
        /// Only this user's
        #[arg(long)]
        user: Option<String>,
        /// Only since this time (RFC 3339) or for this long (1h, 30m, 2d)
        #[arg(long)]
        since: Option<String>,
        /// Only this verb (create, patch, delete, connect, ...)
        #[arg(long)]
        verb: Option<String>,
        /// Only this resource (allocations, rolebindings, ...)
        #[arg(long)]
        resource: Option<String>,
        /// Only allow or deny
        #[arg(long)]
        decision: Option<String>,
        /// At most this many (the newest)
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// All tenants (an administrator's query), not only the current one's
        #[arg(short = 'A', long)]
        all_tenants: bool,
    },
    /// The server's log as JSON lines, as written (for archives and `verify --file`)
    Export {
        /// Only since this time (RFC 3339) or for this long (1h, 30m, 2d)
        #[arg(long)]
        since: Option<String>,
    },
    /// Check the chain: every record's hash and signature, that none is missing, reordered
    /// or edited; exit 1 if anything is wrong. Without --file the server checks its own log
    Verify {
        /// Check this exported file (`-`: standard input) here, against the servers'
        /// public keys
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
}

/// `lattice login`.
#[derive(Debug, Clone, Args)]
pub struct LoginArgs {
    /// device (a URL and a code, for machines without a browser), browser (authorization
    /// code + PKCE, redirected to this machine), manual (paste the address back); default:
    /// browser when one can be opened, device otherwise
    #[arg(long, value_enum)]
    pub flow: Option<crate::login::Flow>,
    /// The API server to log in to (default: the configured one)
    #[arg(long)]
    pub server: Option<String>,
    /// Which of the server's identity providers (default: its first)
    #[arg(long)]
    pub issuer: Option<String>,
    /// Log in as this client instead of the one the server names
    #[arg(long)]
    pub client_id: Option<String>,
}

/// `lattice auth ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum AuthCommand {
    /// Whether you (or, with --as, another user) may do VERB on RESOURCE: prints yes or
    /// no (exit status 0 or 1) and, with -v, why and the roles held
    CanI {
        /// get, list, watch, create, update, patch, delete, connect, claim, impersonate
        verb: String,
        /// A kind (allocations, dags, nodes, roles, ...), `allocations/log`, or a route
        /// resource (clusterconfig, apitokens, ...)
        resource: String,
        /// One object, by name
        name: Option<String>,
        /// Ask as this user (needs the impersonate verb on users: administrators)
        #[arg(long = "as")]
        as_user: Option<String>,
        /// ... in this group (repeatable)
        #[arg(long = "as-group")]
        as_group: Vec<String>,
    },
    /// The user the server sees, its groups and the roles it holds
    Whoami,
}

/// `lattice admin token ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminTokenCommand {
    /// Issue a token for an automation account; the token is on the last line (shown once)
    Create {
        /// The account's user name (what RoleBindings name, as a ServiceAccount or User)
        #[arg(long)]
        user: String,
        /// The tenant the role applies in (without: cluster-wide)
        #[arg(long)]
        tenant: Option<String>,
        /// A ClusterRole the token holds (built in: system-admin, tenant-admin, operator,
        /// user, readonly, claiming-user); without, only what bindings grant the account
        #[arg(long)]
        role: Option<String>,
        /// A group the account is in (repeatable)
        #[arg(long = "group")]
        groups: Vec<String>,
        /// How long it is valid, e.g. 12h, 30d (at most 366d)
        #[arg(long, default_value = "30d")]
        ttl: String,
        /// What it is for (shown by `list`)
        #[arg(long)]
        description: Option<String>,
    },
    /// List the tokens (never their secrets)
    List {
        /// Only this account's
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token by its id, or every token of an account with --user: refused by
    /// every API server within a moment
    Revoke {
        /// The token's id (`list` shows it)
        id: Option<String>,
        /// Every token of this account
        #[arg(long, conflicts_with = "id")]
        user: Option<String>,
    },
}

/// `lattice admin node ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminNodeCommand {
    /// Create a single-use bootstrap token a new node's agent spends on its certificate
    /// (`lattice-agent --bootstrap-token-file FILE`); the token is on the last line
    BootstrapToken {
        /// The only node the token may enroll (recommended); without it, any node name
        /// that has no live certificate yet
        #[arg(long)]
        node: Option<String>,
        /// How long the token is valid, e.g. 30m, 1h, 2d (at most 7d)
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// What the token is for (shown by `tokens`)
        #[arg(long)]
        description: Option<String>,
    },
    /// List the bootstrap tokens not yet used or expired (never their secrets)
    Tokens,
    /// Revoke every certificate of a node: its agent is refused at once by every API
    /// server and needs a new bootstrap token
    Revoke {
        /// The node
        name: String,
    },
}

#[derive(Debug, Clone, Default, Args)]
pub struct TenantFields {
    /// Tenant name (a DNS label; it becomes the namespace of the tenant's objects)
    #[arg(long)]
    pub name: String,
    /// Human-readable name
    #[arg(long)]
    pub display_name: Option<String>,
    /// Hard quota: most nodes in use at once
    #[arg(long)]
    pub max_nodes: Option<u32>,
    /// Hard quota: most running allocations at once
    #[arg(long)]
    pub max_concurrent_allocations: Option<u32>,
    /// Hard quota: most nodes claimable for sensitive work
    #[arg(long)]
    pub sensitive_pool_size: Option<u32>,
    /// Soft quota: GPU-hours per budget period
    #[arg(long)]
    pub gpu_hours_budget: Option<f64>,
    /// Soft quota: node-hours per budget period
    #[arg(long)]
    pub node_hours_budget: Option<f64>,
    /// Soft quota: share of the system (0-1)
    #[arg(long)]
    pub fair_share_target: Option<f64>,
    /// Soft quota: multiple of the fair share usable when idle (>= 1)
    #[arg(long)]
    pub burst_allowance: Option<f64>,
    /// Budget window in days
    #[arg(long)]
    pub budget_period_days: Option<u32>,
    /// Most network domains
    #[arg(long)]
    pub max_network_domains: Option<u32>,
    /// Tenant admins (OIDC subjects; repeatable)
    #[arg(long = "admin", value_name = "SUBJECT")]
    pub admins: Vec<String>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant
    Create(TenantFields),
    /// Change a tenant's quotas or settings (alias: set-quota)
    #[command(visible_alias = "set-quota")]
    Update(TenantFields),
    /// List tenants with quota and usage
    List {
        /// Omit the header row
        #[arg(long)]
        no_headers: bool,
    },
    /// Show one tenant
    Show {
        /// Tenant name (or --name)
        name: Option<String>,
        #[arg(long = "name", hide = true)]
        name_flag: Option<String>,
        /// Quotas against usage only
        #[arg(long)]
        quotas: bool,
    },
}

#[derive(Debug, Clone, Default, Args)]
pub struct VClusterConfigFields {
    /// Weight profile: hpc-batch, ml-training, service, sensitive, interactive
    #[arg(long)]
    pub profile: Option<String>,
    /// Scheduling cycle interval, e.g. 15s
    #[arg(long)]
    pub cycle_interval: Option<String>,
    /// Future reservations the backfill solver considers
    #[arg(long)]
    pub backfill_depth: Option<u32>,
    /// Backfill order: queue, fcfs, score, shortest, smallest-area, best-fit
    #[arg(long)]
    pub backfill_order: Option<String>,
    /// Runtime estimator: none, user-last2, user-job-last2, user-fraction2, user-job-fraction2
    #[arg(long)]
    pub runtime_estimator: Option<String>,
    /// What an expired runtime prediction becomes: walltime, gradual, double
    #[arg(long)]
    pub prediction_correction: Option<String>,
    /// A head job waiting longer than this gets EASY's guarantee, e.g. 66h, or never
    #[arg(long)]
    pub guarantee_after: Option<String>,
    /// Walltime for allocations that set none, e.g. 1h
    #[arg(long)]
    pub default_walltime: Option<String>,
    /// Longest walltime accepted, e.g. 72h
    #[arg(long)]
    pub max_walltime: Option<String>,
    /// Free-text description
    #[arg(long)]
    pub description: Option<String>,
    /// Home nodes (repeatable, or comma separated)
    #[arg(long = "home-node", value_delimiter = ',', value_name = "NODE")]
    pub home_nodes: Vec<String>,
    /// Preemption mode: class_based, borrowed_nodes_only, never
    #[arg(long)]
    pub preemption: Option<String>,
    /// Lend idle home nodes to other vClusters
    #[arg(long)]
    pub allow_lend: Option<bool>,
    /// Borrow idle nodes from other vClusters
    #[arg(long)]
    pub allow_borrow: Option<bool>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct WeightFields {
    /// w1: priority class
    #[arg(long)]
    pub priority: Option<f64>,
    /// w2: wait time
    #[arg(long)]
    pub wait_time: Option<f64>,
    /// w3: fair-share deficit
    #[arg(long)]
    pub fair_share: Option<f64>,
    /// w4: topology fitness
    #[arg(long)]
    pub topology: Option<f64>,
    /// w5: data readiness
    #[arg(long)]
    pub data_readiness: Option<f64>,
    /// w6: backlog pressure
    #[arg(long)]
    pub backlog: Option<f64>,
    /// w7: energy cost
    #[arg(long)]
    pub energy: Option<f64>,
    /// w8: checkpoint efficiency
    #[arg(long)]
    pub checkpoint_efficiency: Option<f64>,
    /// w9: conformance fitness
    #[arg(long)]
    pub conformance: Option<f64>,
    /// Any weight by its name under spec.weights (e.g. --weight waitTime=0.2, or an alias
    /// w1..w9); repeatable. A name that is no weight is refused, naming the weights
    #[arg(long = "weight", value_name = "NAME=VALUE")]
    pub weight: Vec<String>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum VClusterCommand {
    /// Create a vCluster in the tenant given by -t/--tenant
    Create {
        /// vCluster name
        #[arg(long)]
        name: String,
        /// Scheduler: hpc-backfill, service-binpack, sensitive-reservation, interactive-fifo
        #[arg(long)]
        scheduler: String,
        #[command(flatten)]
        config: VClusterConfigFields,
        #[command(flatten)]
        weights: WeightFields,
    },
    /// Set cost-function weights (0-1 each; unset ones keep their value)
    SetWeights {
        /// vCluster name
        #[arg(long)]
        name: String,
        #[command(flatten)]
        weights: WeightFields,
    },
    /// Change scheduling configuration
    SetConfig {
        /// vCluster name
        #[arg(long)]
        name: String,
        #[command(flatten)]
        config: VClusterConfigFields,
    },
    /// Show a vCluster with its effective weights
    Show {
        /// vCluster name (or --name)
        name: Option<String>,
        #[arg(long = "name", hide = true)]
        name_flag: Option<String>,
    },
    /// List vClusters (all tenants unless -t is given)
    List {
        /// Omit the header row
        #[arg(long)]
        no_headers: bool,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum AdminConfigCommand {
    /// Print a setting: a cluster setting (scheduling.max_dag_size) from the server, any
    /// other dotted key from the local CLI config file (or the whole file, token redacted)
    Get {
        /// Dotted key, e.g. scheduling.max_dag_size or default_vcluster
        key: Option<String>,
    },
    /// Set KEY=VALUE (or KEY VALUE): a cluster setting (scheduling.max_dag_size) on the
    /// server for the whole cluster (administrators), any other key in the local CLI config
    /// file
    Set {
        /// KEY=VALUE or KEY
        assignment: String,
        /// The value, when not given as KEY=VALUE
        value: Option<String>,
    },
    /// Reset a cluster setting to the server's flag (administrators)
    Unset {
        /// The cluster setting, e.g. scheduling.max_dag_size
        key: String,
    },
    /// List the cluster settings with their values and where each comes from
    Cluster,
}

impl AdminConfigCommand {
    /// Whether this command is about the cluster's settings (served by the API server)
    /// rather than the local CLI config file.
    pub fn is_cluster(&self) -> bool {
        let cluster_key = |k: &str| {
            let k = k.split_once('=').map_or(k, |(k, _)| k);
            lattice_apis::cluster_config::find(k).is_some()
        };
        match self {
            Self::Get { key } => key.as_deref().is_some_and(cluster_key),
            Self::Set { assignment, .. } => cluster_key(assignment),
            Self::Unset { key } => cluster_key(key),
            Self::Cluster => true,
        }
    }
}

#[derive(Debug, Clone, Subcommand)]
pub enum RaftCommand {
    /// Readiness, leader, term and commit/apply positions from /readyz and /metrics
    Status,
}

#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// Shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Clone, Default, Args)]
#[command(disable_help_flag = true)]
pub struct CompatArgs {
    /// sbatch, squeue, scancel, sinfo, sacct, srun or salloc
    pub tool: String,
    /// The tool's arguments, as Slurm takes them
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Number of lattice-agent processes (nodes node-01 ... node-NN)
    #[arg(long, default_value_t = 4)]
    pub agents: u32,
    /// Where server state, agent state, logs and up.json go
    #[arg(long, default_value = "./.lattice-up", value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Submit the example training pipeline DAG and show its progress
    #[arg(long)]
    pub demo: bool,
    /// Start everything in the background and return
    #[arg(long)]
    pub detach: bool,
    /// API listen address of the server
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub api_addr: String,
    /// HTTPS listen address of the server, where the agents connect with their node
    /// certificates [default: a free port on 127.0.0.1]
    #[arg(long, value_name = "ADDR")]
    pub tls_addr: Option<String>,
    /// One more flag for every agent, e.g. --agent-arg=--memory-gb=4 or
    /// --agent-arg=--max-pids=512; repeat for several
    #[arg(long = "agent-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Directory with tenant.yaml, vclusters.yaml and training-pipeline.yaml
    /// [default: ./manifests/examples when it exists]
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// Seconds to wait for the server and the nodes to become ready
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    /// The directory given to `lattice up`
    #[arg(long, default_value = "./.lattice-up", value_name = "DIR")]
    pub data_dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct CompleteArgs {
    /// allocations, nodes, vclusters, dags or tenants
    pub kind: String,
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
    /// Output format for applied objects (the global `-o`; name prints `kind/name` only)
    #[arg(skip)]
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
    /// Output format (the global `-o`)
    #[arg(skip)]
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
