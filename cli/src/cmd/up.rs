//! `lattice up` / `lattice down`: a local cluster of one `lattice-server --dev` and N
//! `lattice-agent` processes, for trying Lattice on one machine.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cli::{ApplyArgs, DownArgs, DryRun, FileArgs, UpArgs};
use crate::client::{Client, WriteOptions};
use crate::cmd::dag;
use crate::cmd::workload::{self, collection, hms, name, s};
use crate::errors::{exit, CliError};
use crate::kinds::Catalog;
use crate::output::Aligner;
use crate::{Ctx, Shutdown};

/// File in the data directory that records what `up` started.
pub const STATE_FILE: &str = "up.json";

/// One started process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proc {
    pub name: String,
    pub pid: u32,
    pub binary: String,
    pub log: String,
}

/// `DIR/up.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpState {
    pub api_url: String,
    pub data_dir: String,
    pub token_file: String,
    pub detached: bool,
    pub processes: Vec<Proc>,
}

fn abs(ctx_cwd: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        ctx_cwd.join(p)
    }
}

/// Finds a binary: `$LATTICE_<NAME>_BIN`, next to the running `lattice` (and its parent
/// when that is a cargo `deps` directory), then `PATH`.
pub fn find_binary(name: &str) -> Result<PathBuf, CliError> {
    let var = format!(
        "LATTICE_{}_BIN",
        name.trim_start_matches("lattice-").to_uppercase()
    );
    if let Some(p) = std::env::var_os(&var).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(CliError::new(
                format!("start {name}"),
                format!("{var}={} does not exist", p.display()),
            )
            .hint(format!(
                "build it with `cargo build --release`, or fix {var}"
            )));
        }
        return Ok(p);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            if d.file_name().is_some_and(|n| n == "deps") {
                if let Some(p) = d.parent() {
                    dirs.push(p.to_path_buf());
                }
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    for d in &dirs {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(CliError::new(
        format!("start {name}"),
        "the binary was not found next to `lattice` nor on PATH",
    )
    .detail(format!(
        "Looked in: {}",
        dirs.iter()
            .take(3)
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .hint(format!(
        "build it with `cargo build --release` (it puts {name} next to lattice in target/release), \
         or set {var} to its path"
    )))
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// True when `pid` still runs `binary` (guards against PID reuse; true where /proc is
/// unavailable).
fn pid_is(pid: u32, binary: &str) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(c) => {
            let base = Path::new(binary)
                .file_name()
                .map(|b| b.to_string_lossy().to_string())
                .unwrap_or_default();
            String::from_utf8_lossy(&c).contains(&base)
        }
        Err(_) => !Path::new("/proc/self").exists(),
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: sending a signal to a process we started (checked by the caller).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// SIGTERM, wait up to `grace`, SIGKILL; returns how many were stopped.
fn stop_pids(procs: &[Proc], grace: Duration, children: &mut HashMap<u32, Child>) -> usize {
    let live: Vec<&Proc> = procs
        .iter()
        .filter(|p| pid_alive(p.pid) && pid_is(p.pid, &p.binary))
        .collect();
    for p in &live {
        signal(p.pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    loop {
        // Reap our own children so they do not linger as zombies.
        for c in children.values_mut() {
            let _ = c.try_wait();
        }
        let remaining: Vec<&&Proc> = live
            .iter()
            .filter(|p| match children.get_mut(&p.pid) {
                Some(c) => matches!(c.try_wait(), Ok(None)),
                None => pid_alive(p.pid),
            })
            .collect();
        if remaining.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            for p in remaining {
                signal(p.pid, libc::SIGKILL);
            }
            for c in children.values_mut() {
                let _ = c.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    live.len()
}

fn read_state(dir: &Path) -> Option<UpState> {
    let text = std::fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

fn write_state(dir: &Path, st: &UpState) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(st).unwrap_or_default();
    std::fs::write(dir.join(STATE_FILE), text + "\n").map_err(|e| {
        CliError::new(
            format!("write {}", dir.join(STATE_FILE).display()),
            e.to_string(),
        )
    })
}

fn log_tail(path: &str, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `down`.
pub async fn down(
    args: &DownArgs,
    out: &mut dyn Write,
    _err: &mut dyn Write,
) -> Result<i32, CliError> {
    let dir = abs(&std::env::current_dir().unwrap_or_default(), &args.data_dir);
    let Some(st) = read_state(&dir) else {
        return Err(CliError::new(
            format!("stop the cluster in {}", dir.display()),
            format!("no {STATE_FILE} there"),
        )
        .hint("pass the --data-dir given to `lattice up`")
        .exit_code(exit::NOT_FOUND));
    };
    // Agents first, then the server.
    let mut procs = st.processes.clone();
    procs.reverse();
    let n = stop_pids(&procs, Duration::from_secs(10), &mut HashMap::new());
    let _ = std::fs::remove_file(dir.join(STATE_FILE));
    if n == 0 {
        writeln!(
            out,
            "Nothing was running (cleaned up {}).",
            dir.join(STATE_FILE).display()
        )?;
    } else {
        writeln!(
            out,
            "Stopped {n} process{} from {}",
            if n == 1 { "" } else { "es" },
            dir.display()
        )?;
    }
    Ok(0)
}

struct Cluster {
    dir: PathBuf,
    state: UpState,
    children: HashMap<u32, Child>,
}

impl Cluster {
    fn spawn(
        &mut self,
        name: &str,
        binary: &Path,
        args: &[String],
        envs: &[(&str, String)],
        detach: bool,
    ) -> Result<u32, CliError> {
        let log_path = self.dir.join("logs").join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| CliError::new(format!("create {}", log_path.display()), e.to_string()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| CliError::new(format!("open {}", log_path.display()), e.to_string()))?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        for (k, v) in envs {
            cmd.env(k, v);
        }
        {
            use std::os::unix::process::CommandExt;
            if detach {
                // SAFETY: setsid is async-signal-safe; the new session outlives `lattice up`.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::setsid();
                        Ok(())
                    });
                }
            } else {
                // Own process group: Ctrl-C reaches `lattice up`, which stops them in order.
                cmd.process_group(0);
            }
        }
        let child = cmd.spawn().map_err(|e| {
            CliError::new(format!("start {}", binary.display()), e.to_string())
                .hint("check that the binary is executable")
        })?;
        let pid = child.id();
        self.children.insert(pid, child);
        self.state.processes.push(Proc {
            name: name.to_string(),
            pid,
            binary: binary.display().to_string(),
            log: log_path.display().to_string(),
        });
        write_state(&self.dir, &self.state)?;
        Ok(pid)
    }

    /// The name of a process that has exited, with its log tail.
    fn exited(&mut self) -> Option<(String, String)> {
        for p in &self.state.processes {
            if let Some(c) = self.children.get_mut(&p.pid) {
                if let Ok(Some(status)) = c.try_wait() {
                    return Some((format!("{} ({status})", p.name), log_tail(&p.log, 15)));
                }
            }
        }
        None
    }

    fn stop(&mut self) -> usize {
        let mut procs = self.state.processes.clone();
        procs.reverse();
        let n = stop_pids(&procs, Duration::from_secs(10), &mut self.children);
        let _ = std::fs::remove_file(self.dir.join(STATE_FILE));
        n
    }
}

fn died(what: &str, tail: &str) -> CliError {
    let mut e = CliError::new(format!("start the cluster: {what} exited"), "");
    for l in tail.lines() {
        e = e.detail(format!("| {l}"));
    }
    e.hint(
        "see the log above (and in the logs/ directory); fix the cause and run `lattice up` again",
    )
}

async fn wait_ready(
    cluster: &mut Cluster,
    client: &Client,
    deadline: Instant,
    shutdown: &mut Shutdown,
) -> Result<bool, CliError> {
    loop {
        if let Some((what, tail)) = cluster.exited() {
            return Err(died(&what, &tail));
        }
        if let Ok(t) = client.get_text("/readyz").await {
            if !t.is_empty() {
                return Ok(true);
            }
        }
        if Instant::now() >= deadline {
            return Err(CliError::new(
                "start the cluster",
                "lattice-server did not become ready in time",
            )
            .hint(format!(
                "see {}/logs/server.log; raise --timeout if the machine is slow",
                cluster.dir.display()
            )));
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(false),
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

async fn wait_token(
    cluster: &mut Cluster,
    path: &Path,
    deadline: Instant,
) -> Result<String, CliError> {
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            if !t.is_empty() {
                return Ok(t.trim().to_string());
            }
        }
        if let Some((what, tail)) = cluster.exited() {
            return Err(died(&what, &tail));
        }
        if Instant::now() >= deadline {
            return Err(CliError::new(
                "start the cluster",
                format!("{} did not appear", path.display()),
            )
            .hint("lattice-server --dev writes admin.token into its data directory; see logs/server.log"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_nodes(
    cluster: &mut Cluster,
    client: &Client,
    names: &[String],
    deadline: Instant,
    shutdown: &mut Shutdown,
) -> Result<bool, CliError> {
    let path = collection("nodes", None);
    loop {
        if let Some((what, tail)) = cluster.exited() {
            return Err(died(&what, &tail));
        }
        let ready: Vec<String> = match client.list(&path, &Default::default()).await {
            Ok(l) => l
                .get("items")
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter(|n| s(n, "/status/state") == Some("Ready"))
                        .map(|n| name(n).to_string())
                        .collect()
                })
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let missing: Vec<&String> = names.iter().filter(|n| !ready.contains(n)).collect();
        if missing.is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Err(CliError::new(
                "start the cluster",
                format!(
                    "{} of {} nodes are not Ready: {}",
                    missing.len(),
                    names.len(),
                    missing
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .hint(format!(
                "see the agents' logs in {}/logs/; raise --timeout if the machine is slow",
                cluster.dir.display()
            )));
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(false),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

fn sub_ctx(ctx: &Ctx, client: Client) -> Ctx {
    Ctx {
        client,
        catalog: Catalog::with_builtins(),
        tenant: ctx.tenant.clone(),
        settings: ctx.settings.clone(),
        fixed_now: ctx.fixed_now,
        output: None,
        quiet: ctx.quiet,
        verbose: ctx.verbose,
        vcluster: None,
        env: ctx.env.clone(),
        cwd: ctx.cwd.clone(),
        tty: ctx.tty,
    }
}

/// Runs `up`.
pub async fn up(
    ctx: &mut Ctx,
    args: &UpArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    let dir = abs(&ctx.cwd, &args.data_dir);
    if let Some(st) = read_state(&dir) {
        if st
            .processes
            .iter()
            .any(|p| pid_alive(p.pid) && pid_is(p.pid, &p.binary))
        {
            return Err(CliError::new(
                format!("start a cluster in {}", dir.display()),
                format!("one is already running there (API {})", st.api_url),
            )
            .hint(format!(
                "stop it with `lattice down --data-dir {}`, or pick another --data-dir",
                args.data_dir.display()
            )));
        }
    }
    let manifests = match &args.manifests {
        Some(m) => {
            let m = abs(&ctx.cwd, m);
            if !m.is_dir() {
                return Err(CliError::new(
                    format!("--manifests {}", m.display()),
                    "not a directory",
                )
                .exit_code(exit::USAGE));
            }
            Some(m)
        }
        None => Some(ctx.cwd.join("manifests/examples")).filter(|p| p.is_dir()),
    };
    if args.demo
        && manifests
            .as_ref()
            .is_none_or(|m| !m.join("training-pipeline.yaml").is_file())
    {
        return Err(CliError::new("lattice up --demo", "training-pipeline.yaml not found")
            .hint("run it from the repository root (it has manifests/examples/), or pass --manifests DIR")
            .exit_code(exit::USAGE));
    }
    let server_bin = find_binary("lattice-server")?;
    let agent_bin = if args.agents > 0 {
        Some(find_binary("lattice-agent")?)
    } else {
        None
    };
    for d in ["server", "agents", "logs"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| {
            CliError::new(format!("create {}", dir.join(d).display()), e.to_string())
        })?;
    }
    let api_url = crate::config::normalize_url(&args.api_addr);
    let token_file = dir.join("server").join("admin.token");
    // A stale token from an earlier run would be read before the server rewrites it.
    let _ = std::fs::remove_file(&token_file);
    let mut cluster = Cluster {
        dir: dir.clone(),
        state: UpState {
            api_url: api_url.clone(),
            data_dir: dir.display().to_string(),
            token_file: token_file.display().to_string(),
            detached: args.detach,
            processes: Vec::new(),
        },
        children: HashMap::new(),
    };
    let result = start(
        ctx,
        args,
        &mut cluster,
        &server_bin,
        agent_bin.as_deref(),
        manifests.as_deref(),
        out,
        err,
        &mut shutdown,
    )
    .await;
    let code = match result {
        Ok(Some(code)) => code,
        Ok(None) => {
            // Interrupted while starting.
            let n = cluster.stop();
            writeln!(err, "Interrupted; stopped {n} processes.")?;
            return Ok(130);
        }
        Err(e) => {
            cluster.stop();
            return Err(e);
        }
    };
    if args.detach {
        // The processes are in their own sessions; forget the handles without killing them.
        cluster.children.clear();
        return Ok(code);
    }
    if !args.demo {
        writeln!(out, "Press Ctrl-C to stop.")?;
        out.flush()?;
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if let Some((what, tail)) = cluster.exited() {
                        let n = cluster.stop();
                        writeln!(err, "{}", died(&what, &tail))?;
                        writeln!(err, "Stopped the {n} other processes.")?;
                        return Ok(exit::ERROR);
                    }
                }
            }
        }
    }
    let n = cluster.stop();
    writeln!(
        out,
        "Stopped {n} processes; state and logs are kept in {}",
        dir.display()
    )?;
    Ok(code)
}

#[allow(clippy::too_many_arguments)]
async fn start(
    ctx: &mut Ctx,
    args: &UpArgs,
    cluster: &mut Cluster,
    server_bin: &Path,
    agent_bin: Option<&Path>,
    manifests: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<Option<i32>, CliError> {
    let dir = cluster.dir.clone();
    let api_url = cluster.state.api_url.clone();
    let deadline = Instant::now() + Duration::from_secs(args.timeout.max(1));
    // Agents reach the server over HTTPS with their own node certificates (the same
    // bootstrap-token enrolment as on a real cluster); people use the plain API address
    // on loopback with the admin token.
    let tls_addr = match &args.tls_addr {
        Some(a) => a.clone(),
        None => free_loopback_addr()?,
    };
    let server_args: Vec<String> = vec![
        "--dev".into(),
        "--data-dir".into(),
        dir.join("server").display().to_string(),
        "--api-addr".into(),
        args.api_addr.clone(),
        "--etcd-addr".into(),
        "off".into(),
        "--tls-addr".into(),
        tls_addr.clone(),
    ];
    let pid = cluster.spawn("server", server_bin, &server_args, &[], args.detach)?;
    if !ctx.quiet {
        writeln!(
            err,
            "Started lattice-server (pid {pid}), waiting for {api_url}/readyz ..."
        )?;
    }
    let anon = Client::new(&api_url, None)
        .map_err(|e| CliError::from_client("set up the HTTP client", e))?;
    if !wait_ready(cluster, &anon, deadline, shutdown).await? {
        return Ok(None);
    }
    let token_path = PathBuf::from(&cluster.state.token_file);
    let token = wait_token(cluster, &token_path, deadline).await?;
    let client = Client::new(&api_url, Some(token.clone()))
        .map_err(|e| CliError::from_client("set up the HTTP client", e))?;
    let (me, my_uid) = local_user();
    allow_own_user(&client, &me, "default").await?;
    if !ctx.quiet {
        writeln!(
            err,
            "Tenant default runs work as {me} (uid {my_uid}), even as root: this one-user cluster lists its own user in spec.runAs.allowUsers"
        )?;
    }
    let mut names = Vec::new();
    if let Some(agent_bin) = agent_bin {
        let n = args.agents;
        let ca_file = dir.join("server").join("pki").join("ca.crt");
        for i in 1..=n {
            let node = format!("node-{i:02}");
            let group = ((i - 1) * 2 / n.max(1)).min(1);
            let state_dir = dir.join("agents").join(&node);
            std::fs::create_dir_all(&state_dir).map_err(|e| {
                CliError::new(
                    format!("create the state directory of {node}"),
                    e.to_string(),
                )
            })?;
            let token_file = bootstrap_token(&client, &node, &state_dir).await?;
            let mut a = vec![
                "--node-id".to_string(),
                node.clone(),
                "--api-url".into(),
                format!("https://{tls_addr}"),
                "--ca-file".into(),
                ca_file.display().to_string(),
                "--bootstrap-token-file".into(),
                token_file.display().to_string(),
                "--state-dir".into(),
                state_dir.display().to_string(),
                "--topology-group".into(),
                group.to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                // One user's local cluster: work runs as whoever started it.
                "--unknown-user".into(),
                "agent".into(),
            ];
            // Only root can give workloads cgroups; a user's laptop runs them unlimited
            // (the agent says so at start).
            if my_uid != 0 {
                a.push("--no-cgroups".into());
            }
            a.extend(args.agent_args.iter().cloned());
            cluster.spawn(&node, agent_bin, &a, &[], args.detach)?;
            names.push(node);
        }
        if !ctx.quiet {
            writeln!(
                err,
                "Started {n} lattice-agent processes, waiting for the nodes to be Ready ..."
            )?;
        }
        if !wait_nodes(cluster, &client, &names, deadline, shutdown).await? {
            return Ok(None);
        }
    }
    let mut sub = sub_ctx(ctx, client.clone());
    if let Some(m) = manifests {
        let files: Vec<String> = ["tenant.yaml", "vclusters.yaml"]
            .iter()
            .map(|f| m.join(f))
            .filter(|p| p.is_file())
            .map(|p| p.display().to_string())
            .collect();
        if !files.is_empty() {
            let a = ApplyArgs {
                files: FileArgs {
                    filename: files,
                    recursive: false,
                },
                dry_run: DryRun::None,
                force_conflicts: true,
                prune: false,
                applyset: None,
                field_manager: crate::client::DEFAULT_FIELD_MANAGER.to_string(),
                output: None,
            };
            let mut applied: Vec<u8> = Vec::new();
            let code =
                crate::cmd::apply::run(&mut sub, &a, &mut std::io::empty(), &mut applied, err)
                    .await?;
            if !ctx.quiet {
                err.write_all(&applied)?;
            }
            if code != 0 {
                return Err(CliError::new(
                    "start the cluster",
                    "applying the example manifests failed",
                )
                .hint("see the errors above"));
            }
            // The example tenants run their work as this cluster's one user too.
            let tenants = client
                .get(&collection("tenants", None))
                .await
                .map_err(|e| CliError::from_client("list the tenants", e))?;
            let names: Vec<String> = tenants["items"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|t| s(t, "/metadata/name").map(String::from))
                        .filter(|n| n != "default")
                        .collect()
                })
                .unwrap_or_default();
            for t in &names {
                allow_own_user(&client, &me, t).await?;
            }
            if !ctx.quiet && !names.is_empty() {
                writeln!(
                    err,
                    "Tenant(s) {} run work as {me} too (spec.runAs.allowUsers)",
                    names.join(", ")
                )?;
            }
        }
    }
    let nodes_note = if names.is_empty() {
        "no agents".to_string()
    } else {
        format!(
            "{} agents ({} … {})",
            names.len(),
            names[0],
            names[names.len() - 1]
        )
    };
    writeln!(out, "Lattice is up: lattice-server and {nodes_note}")?;
    writeln!(out, "  API:    {api_url}")?;
    writeln!(out, "  Token:  {}", token_path.display())?;
    writeln!(out, "  Logs:   {}", dir.join("logs").display())?;
    writeln!(out, "export LATTICE_API_URL={api_url}")?;
    writeln!(out, "export LATTICE_TOKEN_FILE={}", token_path.display())?;
    if args.detach {
        writeln!(
            out,
            "Stop it with: lattice down --data-dir {}",
            args.data_dir.display()
        )?;
    }
    out.flush()?;
    if args.demo {
        let m = manifests.expect("checked above");
        return demo(
            &mut sub,
            &m.join("training-pipeline.yaml"),
            out,
            err,
            shutdown,
        )
        .await;
    }
    Ok(Some(0))
}

/// A free TCP address on 127.0.0.1 (for the server's HTTPS port).
fn free_loopback_addr() -> Result<String, CliError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| CliError::new("pick a port for the HTTPS API", e.to_string()))?;
    Ok(l.to_string())
}

/// A bootstrap token for `node`, in `<state dir>/bootstrap-token` (0600): the agent spends
/// it on its certificate at its first start (later starts reuse the certificate, and the
/// token expires unused).
async fn bootstrap_token(
    client: &Client,
    node: &str,
    state_dir: &Path,
) -> Result<PathBuf, CliError> {
    use lattice_apis::node_identity as ni;
    let what = format!("create a bootstrap token for {node}");
    let body = serde_json::to_value(ni::BootstrapTokenRequest {
        node: Some(node.to_string()),
        ttl_seconds: Some(600),
        description: Some("lattice up".into()),
    })
    .map_err(|e| CliError::new(what.clone(), e.to_string()))?;
    let t = client
        .create(
            ni::BOOTSTRAP_TOKENS_PATH,
            &body,
            &crate::client::WriteOptions::default(),
        )
        .await
        .map_err(|e| CliError::from_client(what.clone(), e))?;
    let token = s(&t, "/token").unwrap_or_default();
    let path = state_dir.join("bootstrap-token");
    let _ = std::fs::remove_file(&path);
    let written = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(token.as_bytes()))
    };
    written.map_err(|e| CliError::new(what, format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// The local account running `lattice up` (its agents run work as it): name and uid.
fn local_user() -> (String, u32) {
    // SAFETY: geteuid cannot fail; getpwuid_r fills `pw` from `buf`, both ours.
    unsafe {
        let uid = libc::geteuid();
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 4096];
        let name = if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) == 0
            && !found.is_null()
        {
            std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned()
        } else if uid == 0 {
            "root".to_string()
        } else {
            // No account name: the agents' check names the uid alone, which no
            // allowUsers entry matches; an ordinary uid needs none.
            format!("uid-{uid}")
        };
        (name, uid)
    }
}

/// Add `user` to `tenant`'s `spec.runAs.allowUsers` (keeping what is there): the agents
/// run a job as root, or an account below their `--min-uid`, only for a tenant that
/// lists it, and `lattice up`'s agents run every job as the user who started it.
async fn allow_own_user(client: &Client, user: &str, tenant: &str) -> Result<(), CliError> {
    let path = workload::object("tenants", None, tenant);
    let what = || format!("allow {user} to run work in tenant {tenant}");
    let tenant = client
        .get_opt(&path)
        .await
        .map_err(|e| CliError::from_client(what(), e))?;
    let mut users: Vec<Value> = tenant
        .as_ref()
        .and_then(|t| t.pointer("/spec/runAs/allowUsers"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if users.iter().any(|u| u.as_str() == Some(user)) {
        return Ok(());
    }
    users.push(Value::String(user.to_string()));
    let patch = serde_json::json!({"spec": {"runAs": {"allowUsers": users}}});
    let done = if tenant.is_some() {
        client
            .merge_patch(&path, &patch, &WriteOptions::default())
            .await
    } else {
        let mut obj = serde_json::json!({
            "apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
            "metadata": {"name": tenant},
        });
        obj["spec"] = patch["spec"].clone();
        client
            .create(&collection("tenants", None), &obj, &WriteOptions::default())
            .await
    };
    done.map(drop).map_err(|e| CliError::from_client(what(), e))
}

/// Submits the example DAG and prints a line per step change until it ends; then the
/// steps' last log lines. `Some(0)` when the DAG Completed.
async fn demo(
    ctx: &mut Ctx,
    file: &Path,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<Option<i32>, CliError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::new(format!("read {}", file.display()), e.to_string()))?;
    let (mut m, n) = dag::to_manifest(&file.display().to_string(), &text)?;
    let ns = s(&m, "/metadata/namespace")
        .unwrap_or(&ctx.tenant)
        .to_string();
    m["metadata"]["namespace"] = Value::String(ns.clone());
    let dag_name = s(&m, "/metadata/name")
        .unwrap_or("training-pipeline")
        .to_string();
    // A DAG left over from an earlier demo in this data directory.
    let _ = ctx
        .client
        .delete(
            &workload::object("dags", Some(&ns), &dag_name),
            &WriteOptions::default(),
        )
        .await;
    for _ in 0..50 {
        match ctx
            .client
            .get(&workload::object("dags", Some(&ns), &dag_name))
            .await
        {
            Err(e) if e.is_not_found() => break,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let created = ctx
        .client
        .create(&collection("dags", Some(&ns)), &m, &WriteOptions::default())
        .await
        .map_err(|e| CliError::from_client(format!("submit DAG {}", file.display()), e))?;
    writeln!(
        out,
        "\nSubmitted DAG {} with {n} allocations",
        name(&created)
    )?;
    let started = Instant::now();
    let mut last: HashMap<String, String> = HashMap::new();
    let mut al = Aligner::default();
    let header: Vec<String> = ["TIME", "STEP", "STATE", "NODES", "ELAPSED"]
        .iter()
        .map(|x| x.to_string())
        .collect();
    al.observe(&header);
    al.observe(&[
        "+00:00:00".into(),
        "notify-failure".into(),
        "Checkpointing".into(),
        "node-01,node-02".into(),
        "00:00:00".into(),
    ]);
    out.write_all(al.line(&header).as_bytes())?;
    let final_dag = loop {
        let d = match ctx
            .client
            .get(&workload::object("dags", Some(&ns), &dag_name))
            .await
        {
            Ok(d) => d,
            Err(e) if e.is_transient() => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(CliError::from_client(format!("get DAG {dag_name:?}"), e)),
        };
        let allocs = dag::allocs_by_name(ctx, &ns).await;
        for (step, _, _) in dag::steps(&d) {
            let st = dag::task_phase(&d, &step).to_string();
            let a = allocs.get(&dag::task_allocation(&d, &step));
            let nodes = a
                .and_then(|a| a.pointer("/status/assignedNodes"))
                .and_then(Value::as_array)
                .map(|n| {
                    n.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|x| !x.is_empty())
                .unwrap_or_else(|| workload::DASH.into());
            let key = format!("{st}|{nodes}");
            if last.get(&step) != Some(&key) {
                last.insert(step.clone(), key);
                let row = vec![
                    format!("+{}", hms(started.elapsed().as_secs())),
                    step.clone(),
                    st,
                    nodes,
                    a.map(|a| workload::elapsed_cell(a, ctx.now()))
                        .unwrap_or_else(|| workload::DASH.into()),
                ];
                out.write_all(al.line(&row).as_bytes())?;
                out.flush()?;
            }
        }
        if matches!(dag::dag_phase(&d), "Completed" | "Failed" | "Cancelled") {
            break d;
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(None),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let phase = dag::dag_phase(&final_dag).to_string();
    writeln!(
        out,
        "\nDAG {dag_name} {phase} ({} completed)",
        dag::progress(&final_dag)
    )?;
    let allocs = dag::allocs_by_name(ctx, &ns).await;
    for (step, _, _) in dag::steps(&final_dag) {
        let an = dag::task_allocation(&final_dag, &step);
        // Steps that were never placed on a node (skipped, cancelled before they ran).
        let ran = allocs.get(&an).filter(|a| {
            a.pointer("/status/attempt")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                > 0
        });
        let Some(a) = ran else {
            writeln!(
                out,
                "\n== {step}: {} (never ran)",
                dag::task_phase(&final_dag, &step)
            )?;
            continue;
        };
        let exit_code = crate::cmd::status::exit_cell(a);
        writeln!(
            out,
            "\n== {step} ({an}): {}, exit {exit_code}, elapsed {}",
            workload::phase(a),
            workload::elapsed_cell(a, ctx.now())
        )?;
        let path = format!("{}/log", workload::object("allocations", Some(&ns), &an));
        let q = vec![
            ("tailLines".to_string(), "5".to_string()),
            ("stream".to_string(), "all".to_string()),
        ];
        match ctx.client.get_stream(&path, &q).await {
            Ok(mut body) => {
                let mut text = Vec::new();
                while let Some(Ok(c)) = body.next().await {
                    text.extend_from_slice(&c);
                }
                for l in String::from_utf8_lossy(&text).lines() {
                    writeln!(out, "   {l}")?;
                }
            }
            Err(e) => writeln!(err, "   (no logs: {e})")?,
        }
    }
    out.flush()?;
    Ok(Some(if phase == "Completed" { 0 } else { exit::ERROR }))
}
