//! Command line and the validated agent configuration.
//!
//! `lattice-agent --node-id n1 --state-dir /var/lib/lattice` runs the agent (or
//! `lattice-agent --config /etc/lattice/agent.toml`: the same flags from a file, see
//! `lattice-config`);
//! `lattice-agent shim ...` (hidden) is the per-workload supervisor the agent execs
//! itself as (see [`crate::shim`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// `lattice-agent`.
#[derive(Debug, Parser)]
#[command(
    name = "lattice-agent",
    version,
    about = "Lattice node agent: registers the node, heartbeats, runs allocations, serves their logs",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// Hidden subcommands (the workload shim).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Agent flags.
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Supervise one workload (exec'd by the agent; not for people).
    #[command(hide = true)]
    Shim(ShimArgs),
    /// Serve PMIx to one job step's ranks on this node (started by the agent; needs the
    /// cargo feature `pmix`).
    #[command(hide = true)]
    PmixServer(PmixArgs),
}

/// Flags of `lattice-agent pmix-server`.
#[derive(Debug, Clone, Args)]
pub struct PmixArgs {
    /// The socket to the agent.
    #[arg(long)]
    pub fd: i32,
}

/// Flags of the agent proper.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// A TOML file of settings: the long flags without `--` as keys (`node-id = "n1"`,
    /// `features = ["gpu", "nvme_scratch"]`, `slurm-env = true`). A flag on the command
    /// line wins over its environment variable, which wins over the file.
    #[arg(long, env = "LATTICE_AGENT_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// This node's name (the `Node` object and the heartbeat `Lease`), e.g. `x1000c0s0b0n0`.
    #[arg(long, required = true, env = "LATTICE_NODE_ID")]
    pub node_id: Option<String>,
    /// API server base URL.
    #[arg(long, env = "LATTICE_API_URL", default_value = "http://127.0.0.1:8080")]
    pub api_url: String,
    /// The cluster CA (PEM) the API server's certificate is checked against; required
    /// with an https:// --api-url.
    #[arg(long, env = "LATTICE_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// File holding a bootstrap token from `lattice admin node bootstrap-token`, spent on
    /// this node's certificate at the first start (the environment variable
    /// LATTICE_BOOTSTRAP_TOKEN wins). Not needed once the node has its certificate.
    #[arg(long, env = "LATTICE_BOOTSTRAP_TOKEN_FILE")]
    pub bootstrap_token_file: Option<PathBuf>,
    /// Where the agent keeps its state file, scratch directories and logs.
    #[arg(long, required = true, env = "LATTICE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Address of the agent's own HTTP endpoint (logs, metrics); port 0 picks one. The
    /// bound address is published in `Node.status.agent.address`.
    #[arg(long, default_value = "127.0.0.1:0", env = "LATTICE_LISTEN")]
    pub listen: SocketAddr,
    /// Address to publish instead of the bound one (when listening on 0.0.0.0).
    #[arg(long, env = "LATTICE_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// How often a heartbeat is sent on the heartbeat stream, e.g. `10s`, `500ms`.
    #[arg(long, default_value = "10s", value_parser = parse_duration, env = "LATTICE_HEARTBEAT_INTERVAL")]
    pub heartbeat_interval: Duration,
    /// Time between SIGTERM and SIGKILL when the agent stops a workload.
    #[arg(long, default_value = "30s", value_parser = parse_duration, env = "LATTICE_GRACE_PERIOD")]
    pub grace_period: Duration,
    /// Children per agent in the tree an MPI step's PMI fence runs over: a step on at
    /// most this many nodes plus one exchanges through its first node (a star).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096), env = "LATTICE_PMI_FAN_IN")]
    pub pmi_fan_in: u32,
    /// Where uenv images come from: a directory or an http(s):// location holding
    /// `index.json` and the squashfs files it names (unset: allocations that ask for a
    /// uenv fail to start here, saying so).
    #[arg(long, env = "LATTICE_UENV_REPO")]
    pub uenv_repo: Option<String>,
    /// The only places a uenv image may be mounted (the repository's index names one of
    /// them per image); each must be a directory owned by root that no one else writes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "/user-environment,/user-tools",
        env = "LATTICE_UENV_MOUNT_POINTS"
    )]
    pub uenv_mount_points: Vec<PathBuf>,
    /// The OCI runtime that runs allocations with `environment.image` (crun or runc;
    /// a name is looked up on the agent's fixed PATH). Images need an agent running as
    /// root.
    #[arg(long, default_value = "crun", env = "LATTICE_OCI_RUNTIME")]
    pub oci_runtime: PathBuf,
    /// Host directories bound into every OCI container at the same path, read-write
    /// (home and scratch file systems, e.g. /home,/scratch). The working directory, the
    /// job's scratch directory and its uenv mounts are bound in any case.
    #[arg(long, value_delimiter = ',', env = "LATTICE_OCI_BINDS")]
    pub oci_binds: Vec<PathBuf>,
    /// CPU cores to report (default: discovered).
    #[arg(long, env = "LATTICE_CPU_CORES")]
    pub cpu_cores: Option<u32>,
    /// Memory in GB to report (default: discovered).
    #[arg(long, env = "LATTICE_MEMORY_GB")]
    pub memory_gb: Option<u64>,
    /// Report this many (fake) GPUs instead of discovering them.
    #[arg(long, env = "LATTICE_GPU_COUNT")]
    pub gpu_count: Option<u32>,
    /// GPU model reported with --gpu-count, e.g. `GH200`.
    #[arg(long, env = "LATTICE_GPU_TYPE")]
    pub gpu_type: Option<String>,
    /// Interconnect layout of the --gpu-count GPUs: nvswitch (all pairs, a NIC per two
    /// GPUs), nvlink-pairs, or pcie (one NIC, near half the GPUs).
    #[arg(long, value_enum, default_value_t = crate::topology::FakeLayout::Nvswitch, env = "LATTICE_GPU_TOPOLOGY")]
    pub gpu_topology: crate::topology::FakeLayout,
    /// Node features (spec.features at registration), e.g. `nvme_scratch,gpu`.
    #[arg(long, value_delimiter = ',', env = "LATTICE_FEATURES")]
    pub features: Vec<String>,
    /// Dragonfly group (spec.topologyGroup at registration).
    #[arg(long, env = "LATTICE_TOPOLOGY_GROUP")]
    pub topology_group: Option<u32>,
    /// Also set the SLURM_* environment variables in workloads.
    #[arg(long, env = "LATTICE_SLURM_ENV")]
    pub slurm_env: bool,
    /// An allocation whose user (`lattice.dev/user`) has no account on this node, when the
    /// agent runs as root: `refuse` it (it fails, saying so) or run it as the `agent`'s own
    /// user (single-user dev clusters such as `lattice up`) — for a root agent that is
    /// root, which the --min-uid rule allows only where the tenant's
    /// spec.runAs.allowUsers lists "root".
    #[arg(long, value_enum, default_value_t = UnknownUser::Refuse, env = "LATTICE_UNKNOWN_USER")]
    pub unknown_user: UnknownUser,
    /// Lowest uid a job may run as. Jobs as uid 0, or below this (system and service
    /// accounts), run only when the allocation's Tenant lists the account in
    /// spec.runAs.allowUsers.
    #[arg(
        long,
        default_value_t = 1000,
        value_name = "UID",
        env = "LATTICE_MIN_UID"
    )]
    pub min_uid: u32,
    /// The API URL commands inside jobs use (`LATTICE_API_URL` in workloads) [default:
    /// --api-url].
    #[arg(long, value_name = "URL", env = "LATTICE_JOB_API_URL")]
    pub job_api_url: Option<String>,
    /// The `lattice` CLI that `srun`, `sbatch`, `squeue`, ... on a job's PATH run; `off`
    /// for none [default: `lattice` beside this binary, if there].
    #[arg(long, value_name = "PATH", env = "LATTICE_LATTICE_CLI")]
    pub lattice_cli: Option<PathBuf>,
    /// Bytes of live log tail kept in memory per allocation.
    #[arg(long, default_value_t = 8 * 1024 * 1024, env = "LATTICE_LOG_BUFFER_BYTES")]
    pub log_buffer_bytes: usize,
    /// Where the cgroup hierarchies are mounted (cgroup v2, v1 or both); each run gets
    /// `lattice/<node>/<instance>/<uid>-<attempt>` groups in them, limited to the node's
    /// allocatable share.
    #[arg(long, default_value = crate::cgroup::DEFAULT_ROOT, value_name = "DIR", env = "LATTICE_CGROUP_ROOT")]
    pub cgroup_root: PathBuf,
    /// Run workloads without cgroups: no memory, CPU, pids or device limits (for a
    /// laptop; warned at start). Without it the agent refuses to start where it cannot
    /// use cgroups.
    #[arg(long, env = "LATTICE_NO_CGROUPS")]
    pub no_cgroups: bool,
    /// What allocations may not use of the node, kept for the system:
    /// `memory=<bytes>[Ki|Mi|Gi|Ti|K|M|G|T],cpu=<cores or millicores>,pids=<n>`, e.g.
    /// `memory=2Gi,cpu=1,pids=1024`. Each allocation is limited to the node's capacity
    /// less this.
    #[arg(
        long,
        default_value = "",
        value_name = "LIST",
        env = "LATTICE_SYSTEM_RESERVED"
    )]
    pub system_reserved: String,
    /// The node's capacity in processes and threads, before --system-reserved [default:
    /// the kernel's pid_max or threads-max, whichever is lower].
    #[arg(long, value_name = "N", env = "LATTICE_MAX_PIDS")]
    pub max_pids: Option<u64>,
    /// This node's GPUs among the GPU device nodes found in --device-dir (`nvidiaN`,
    /// `dri/renderD<128+N>`): `all`, `none`, or indexes such as `0,1` (several nodes on
    /// one machine). Jobs cannot open the others.
    #[arg(
        long,
        default_value = "all",
        value_name = "all|none|LIST",
        env = "LATTICE_GPU_DEVICES"
    )]
    pub gpu_devices: String,
    /// Where GPU device nodes are looked for.
    #[arg(
        long,
        default_value = "/dev",
        value_name = "DIR",
        env = "LATTICE_DEVICE_DIR"
    )]
    pub device_dir: PathBuf,
}

/// Flags of `lattice-agent shim`.
#[derive(Debug, Clone, Args)]
pub struct ShimArgs {
    /// The workload's run directory: pid file, exit file and log spools live here.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Working directory of the workload.
    #[arg(long)]
    pub cwd: PathBuf,
    /// cgroup directories the workload joins before it starts (one per hierarchy).
    #[arg(long)]
    pub cgroup: Vec<PathBuf>,
    /// Descriptor holding the workload's environment (`KEY=VALUE\0...`), which the shim
    /// applies to the workload only, after the drop to the user. The shim's own
    /// environment is the agent's fixed one.
    #[arg(long)]
    pub env_fd: Option<i32>,
    /// Descriptor holding the task plans and the container to run them in (JSON, see
    /// `shim::ShimPlan`): one process per task, all in one process group. Absent: one
    /// task, on the host.
    #[arg(long)]
    pub tasks_fd: Option<i32>,
    /// `IMAGE=MOUNT`: mount the squashfs image read-only at MOUNT in a private mount
    /// namespace of the run (uenv), before any task starts.
    #[arg(long)]
    pub squashfs: Vec<String>,
    /// Run the workload as this uid (needs root).
    #[arg(long, requires = "gid")]
    pub uid: Option<u32>,
    /// ... and this gid.
    #[arg(long, requires = "uid")]
    pub gid: Option<u32>,
    /// ... with these supplementary groups (the user's, as login gives them).
    #[arg(long, value_delimiter = ',', requires = "uid")]
    pub groups: Vec<u32>,
    /// The program and its arguments, passed exactly.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// Parse `500ms`, `5s`, `1m30s` (humantime syntax).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration ({e}); use e.g. \"500ms\", \"5s\" or \"1m\""))
}

/// `--unknown-user`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum UnknownUser {
    /// The allocation fails (`user X has no account on node N`).
    #[default]
    Refuse,
    /// Run it as the agent's own user.
    Agent,
}

/// The validated configuration of a running agent.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--node-id`.
    pub node: String,
    /// `--api-url`.
    pub api_url: String,
    /// `--ca-file`.
    pub ca_file: Option<PathBuf>,
    /// The bootstrap token (`LATTICE_BOOTSTRAP_TOKEN` or `--bootstrap-token-file`).
    pub bootstrap_token: Option<String>,
    /// `--state-dir`.
    pub state_dir: PathBuf,
    /// `--listen`.
    pub listen: SocketAddr,
    /// `--advertise-address`.
    pub advertise_address: Option<String>,
    /// `--heartbeat-interval`.
    pub heartbeat_interval: Duration,
    /// `--grace-period`.
    pub grace_period: Duration,
    /// `--pmi-fan-in`.
    pub pmi_fan_in: u32,
    /// `--uenv-repo`.
    pub uenv_repo: Option<String>,
    /// `--uenv-mount-points`.
    pub uenv_mount_points: Vec<PathBuf>,
    /// `--oci-runtime`.
    pub oci_runtime: PathBuf,
    /// `--oci-binds`.
    pub oci_binds: Vec<PathBuf>,
    /// `--cpu-cores`.
    pub cpu_cores: Option<u32>,
    /// `--memory-gb`.
    pub memory_gb: Option<u64>,
    /// `--gpu-count`.
    pub gpu_count: Option<u32>,
    /// `--gpu-type`.
    pub gpu_type: Option<String>,
    /// `--gpu-topology`.
    pub gpu_topology: crate::topology::FakeLayout,
    /// `--features`.
    pub features: Vec<String>,
    /// `--topology-group`.
    pub topology_group: Option<u32>,
    /// `--slurm-env`.
    pub slurm_env: bool,
    /// `--unknown-user`.
    pub unknown_user: UnknownUser,
    /// `--job-api-url`.
    pub job_api_url: Option<String>,
    /// `--lattice-cli` (resolved; `None`: no command wrappers in jobs).
    pub lattice_cli: Option<PathBuf>,
    /// `--log-buffer-bytes`.
    pub log_buffer_bytes: usize,
    /// `--min-uid`.
    pub min_uid: u32,
    /// `--cgroup-root`.
    pub cgroup_root: PathBuf,
    /// `--no-cgroups`.
    pub no_cgroups: bool,
    /// `--system-reserved`.
    pub system_reserved: crate::cgroup::limits::SystemReserved,
    /// `--max-pids`.
    pub max_pids: Option<u64>,
    /// `--gpu-devices`.
    pub gpu_devices: crate::cgroup::devices::GpuSelection,
    /// `--device-dir`.
    pub device_dir: PathBuf,
}

impl Config {
    /// Validate the flags and read the bootstrap token.
    pub fn from_args(a: AgentArgs) -> anyhow::Result<Self> {
        let node = a.node_id.context("--node-id is required")?;
        if let Some(e) = lattice_apis::validate_dns1123_name("--node-id", &node) {
            anyhow::bail!("{}: {}", e.path, e.message);
        }
        let state_dir = a.state_dir.context("--state-dir is required")?;
        let bootstrap_token = match std::env::var("LATTICE_BOOTSTRAP_TOKEN") {
            Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
            _ => match &a.bootstrap_token_file {
                Some(f) => Some(
                    std::fs::read_to_string(f)
                        .with_context(|| format!("reading --bootstrap-token-file {}", f.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            },
        };
        if !a.api_url.starts_with("https://") && !a.listen.ip().is_loopback() {
            anyhow::bail!(
                "--listen {}: an agent without a node identity (a plain http:// --api-url) \
                 serves its endpoint, which runs commands in jobs, to anyone who can reach \
                 it, so it listens on loopback only; use an https:// --api-url with --ca-file \
                 and a bootstrap token",
                a.listen
            );
        }
        if a.heartbeat_interval.is_zero() {
            anyhow::bail!("--heartbeat-interval must be more than 0");
        }
        if a.log_buffer_bytes < 1024 {
            anyhow::bail!("--log-buffer-bytes must be at least 1024");
        }
        if matches!(a.cgroup_root.to_str(), Some("off" | "")) {
            anyhow::bail!(
                "--cgroup-root off no longer turns cgroups off: it names where the hierarchies are mounted; pass --no-cgroups to run workloads without limits"
            );
        }
        let system_reserved = a
            .system_reserved
            .parse()
            .map_err(|e| anyhow::anyhow!("--system-reserved: {e}"))?;
        let gpu_devices = a
            .gpu_devices
            .parse()
            .map_err(|e| anyhow::anyhow!("--gpu-devices: {e}"))?;
        if a.max_pids == Some(0) {
            anyhow::bail!("--max-pids must be more than 0");
        }
        Ok(Self {
            node,
            api_url: a.api_url,
            ca_file: a.ca_file,
            bootstrap_token,
            state_dir,
            listen: a.listen,
            advertise_address: a.advertise_address,
            heartbeat_interval: a.heartbeat_interval,
            grace_period: a.grace_period,
            pmi_fan_in: a.pmi_fan_in,
            uenv_repo: a.uenv_repo,
            uenv_mount_points: a.uenv_mount_points,
            oci_runtime: a.oci_runtime,
            oci_binds: a.oci_binds,
            cpu_cores: a.cpu_cores,
            memory_gb: a.memory_gb,
            gpu_count: a.gpu_count,
            gpu_type: a.gpu_type,
            gpu_topology: a.gpu_topology,
            features: a.features,
            topology_group: a.topology_group,
            slurm_env: a.slurm_env,
            unknown_user: a.unknown_user,
            job_api_url: a.job_api_url,
            lattice_cli: match a.lattice_cli {
                Some(p) if p.as_os_str() == "off" => None,
                Some(p) => {
                    anyhow::ensure!(
                        p.is_file(),
                        "--lattice-cli {}: no such file; give the path of the lattice CLI, or off",
                        p.display()
                    );
                    Some(p)
                }
                None => std::env::current_exe()
                    .ok()
                    .and_then(|e| Some(e.parent()?.join("lattice")))
                    .filter(|p| p.is_file()),
            },
            log_buffer_bytes: a.log_buffer_bytes,
            min_uid: a.min_uid,
            cgroup_root: a.cgroup_root,
            no_cgroups: a.no_cgroups,
            system_reserved,
            max_pids: a.max_pids,
            gpu_devices,
            device_dir: a.device_dir,
        })
    }

    /// `<state-dir>/agent-state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.state_dir.join("agent-state.json")
    }
    /// `<state-dir>/scratch`.
    pub fn scratch_root(&self) -> PathBuf {
        self.state_dir.join("scratch")
    }
    /// `<state-dir>/run`.
    pub fn run_root(&self) -> PathBuf {
        self.state_dir.join("run")
    }
    /// `<state-dir>/logs`.
    pub fn log_root(&self) -> PathBuf {
        self.state_dir.join("logs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn flags_and_shim_subcommand() {
        let cli = Cli::try_parse_from([
            "lattice-agent",
            "--node-id",
            "n1",
            "--state-dir",
            "/tmp/x",
            "--heartbeat-interval",
            "500ms",
            "--features",
            "a,b",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        let c = Config::from_args(cli.agent).unwrap();
        assert_eq!(c.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(c.features, vec!["a", "b"]);
        assert!(Cli::try_parse_from(["lattice-agent", "--state-dir", "/x"]).is_err());
        assert_eq!(c.min_uid, 1000);
        assert!(!c.no_cgroups);
        assert_eq!(c.cgroup_root, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(c.system_reserved, Default::default());

        let parse = |extra: &[&str]| {
            let mut args = vec!["lattice-agent", "--node-id", "n1", "--state-dir", "/x"];
            args.extend_from_slice(extra);
            Config::from_args(Cli::try_parse_from(args).unwrap().agent)
        };
        let c = parse(&[
            "--system-reserved",
            "memory=2Gi,cpu=1,pids=1024",
            "--gpu-devices",
            "0,1",
            "--min-uid",
            "500",
            "--no-cgroups",
        ])
        .unwrap();
        assert_eq!(c.system_reserved.memory, 2 << 30);
        assert!(c.gpu_devices.contains(1) && !c.gpu_devices.contains(2));
        assert_eq!(c.min_uid, 500);
        assert!(c.no_cgroups);
        let e = parse(&["--cgroup-root", "off"]).unwrap_err().to_string();
        assert!(e.contains("--no-cgroups"), "{e}");
        let e = parse(&["--system-reserved", "memory=lots"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--system-reserved: memory="), "{e}");
        assert!(parse(&["--gpu-devices", "first"]).is_err());

        let cli = Cli::try_parse_from([
            "lattice-agent",
            "shim",
            "--run-dir",
            "/r",
            "--cwd",
            "/",
            "--",
            "/bin/echo",
            "a b",
            "--c",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Shim(s)) => assert_eq!(s.command, vec!["/bin/echo", "a b", "--c"]),
            _ => panic!("no shim"),
        }
    }

    /// The long flags `lattice-agent --help` shows.
    fn help_flags() -> std::collections::BTreeSet<String> {
        use clap::CommandFactory;
        lattice_config::help_long_flags(&Cli::command())
    }

    #[test]
    fn every_flag_is_a_config_key_with_its_environment_variable() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let mut flags = help_flags();
        for not_a_key in ["help", "version", "config"] {
            assert!(flags.remove(not_a_key), "--{not_a_key} missing from --help");
        }
        let keys: std::collections::BTreeSet<String> = lattice_config::keys(&cmd)
            .into_iter()
            .map(String::from)
            .collect();
        assert!(
            keys.contains("node-id") && keys.contains("device-dir"),
            "{keys:?}"
        );
        assert_eq!(flags, keys);
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let expected = match long {
                "help" | "version" => continue,
                // LATTICE_CONFIG is the CLI's config file.
                "config" => "LATTICE_AGENT_CONFIG".to_string(),
                _ => format!("LATTICE_{}", long.to_uppercase().replace('-', "_")),
            };
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(expected.as_str()),
                "--{long}"
            );
        }
    }

    #[test]
    fn config_file_under_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "node-id = \"n1\"\nstate-dir = \"/x\"\nfeatures = [\"a\", \"b\"]\n\
             slurm-env = true\nmin-uid = 500\nheartbeat-interval = \"2s\"\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let cli: Cli =
            lattice_config::try_parse_from(["lattice-agent", "--config", file, "--node-id", "n2"])
                .unwrap();
        let c = Config::from_args(cli.agent).unwrap();
        assert_eq!(c.node, "n2");
        assert_eq!(c.state_dir, PathBuf::from("/x"));
        assert_eq!(c.features, ["a", "b"]);
        assert!(c.slurm_env);
        assert_eq!(c.min_uid, 500);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(2));
        std::fs::write(dir.path().join("agent.toml"), "unknown-user = \"nobody\"\n").unwrap();
        let e = lattice_config::try_parse_from::<Cli, _, _>(["lattice-agent", "--config", file])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agent.toml:1: `unknown-user = \"nobody\"`"),
            "{e}"
        );
        assert!(e.contains("is not one of refuse, agent"), "{e}");
    }

    /// The example under manifests/deploy/ stays valid as the flags change.
    #[test]
    fn example_config_file_is_valid() {
        let example =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/deploy/agent.toml");
        // A copy in a directory of the test's own: run as root, the agent takes its config
        // only from a path nobody else may write, and a checkout's directories may be looser.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::copy(&example, &file).unwrap();
        let cli: Cli = lattice_config::try_parse_from([
            "lattice-agent".as_ref(),
            "--config".as_ref(),
            file.as_os_str(),
            "--node-id".as_ref(),
            "node-07".as_ref(),
        ])
        .unwrap();
        assert_eq!(
            cli.agent.state_dir,
            Some(PathBuf::from("/var/lib/lattice-agent"))
        );
        assert_eq!(cli.agent.api_url, "https://lattice.example.org:8443");
    }
}
