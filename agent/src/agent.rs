//! The agent process: wires registration, heartbeat, the report queue, the HTTP
//! endpoint and the allocation dispatcher together, and recovers after a restart.
//!
//! The dispatcher watches the allocations bound to this node
//! (`status.assignedNodes=<node>`, every tenant) and, per `(uid, attempt)`, starts a
//! [supervisor](crate::supervisor) when `lifecycle::should_run` says `Run` and nothing
//! runs yet; every later version of the allocation is handed to the running
//! supervisors, which stop their workload when it says `Stop` (level-triggered).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lattice_apis::lifecycle::{
    cancel_requested, node_reason, preempt_requested, should_run, RunDecision,
};
use lattice_apis::{Allocation, AllocationPhase, Node, NodeTaskPhase, NodeTaskState};
use lattice_runtime::{watcher, Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cgroup::Cgroups;
use crate::config::Config;
use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::reporter::Reporter;
use crate::runtime::{BareProcess, ProcessRuntime};
use crate::state::{StateFile, TaskKey};
use crate::supervisor::{self, AllocView};
use crate::{discovery, heartbeat, registration, server};

/// Raw HTTP to the API server, for the routes the typed client does not cover (job
/// tokens, attach tickets, the heartbeat stream), with this node's identity.
#[derive(Debug, Clone)]
pub struct ApiHttp {
    base: String,
    tls: Option<rustls::ClientConfig>,
    /// The client (TLS with the node's certificate, when it has one).
    pub http: reqwest::Client,
}

impl ApiHttp {
    /// For the API at `base`, over `tls` when given.
    pub fn new(base: &str, tls: Option<rustls::ClientConfig>) -> anyhow::Result<Self> {
        let http = Self::builder_with(tls.clone())
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            tls,
            http,
        })
    }

    fn builder_with(tls: Option<rustls::ClientConfig>) -> reqwest::ClientBuilder {
        let b = reqwest::Client::builder();
        match tls {
            Some(t) => b.use_preconfigured_tls(t),
            None => b,
        }
    }

    /// A builder for a client of its own (the heartbeat stream's), with the same TLS.
    pub fn builder(&self) -> reqwest::ClientBuilder {
        Self::builder_with(self.tls.clone())
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// What every part of the agent shares.
#[derive(Debug)]
pub struct Ctx {
    /// Configuration.
    pub cfg: Config,
    /// API client.
    pub client: Client,
    /// Raw HTTP to the API server.
    pub api: ApiHttp,
    /// This node's certificate (`None`: no identity, see [`crate::identity`]).
    pub identity: Option<Arc<crate::identity::NodeIdentity>>,
    /// The state file.
    pub state: Arc<StateFile>,
    /// The report queue.
    pub reporter: Arc<Reporter>,
    /// Starts and signals workloads.
    pub runtime: Arc<dyn ProcessRuntime>,
    /// Workload logs.
    pub logs: Arc<Logs>,
    /// Workload cgroups.
    pub cgroups: Cgroups,
    /// This node's `Node` as last seen by the agent's watch of it (`None` before the
    /// first event or when it does not exist): its `status.owner` says which allocation
    /// the scheduler bound here ([`crate::binding`]).
    pub node: watch::Receiver<Option<Arc<Node>>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Cancelled when the agent stops (workloads keep running).
    pub shutdown: CancellationToken,
    /// Re-attached runs not yet confirmed as still this node's (or stopped): the node is
    /// not registered Ready until this is 0, so no new work lands beside a superseded
    /// run that is still being stopped (e.g. after the node was Down and its work
    /// requeued elsewhere).
    pub unsettled: Arc<tokio::sync::watch::Sender<usize>>,
}

/// Holds one re-attached run's place in [`Ctx::unsettled`] until dropped.
#[derive(Debug)]
pub struct SettleGuard(Arc<tokio::sync::watch::Sender<usize>>);

impl SettleGuard {
    /// Count one more unsettled run.
    pub fn new(ctx: &Ctx) -> Self {
        ctx.unsettled.send_modify(|n| *n += 1);
        Self(ctx.unsettled.clone())
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The agent's directories: its state directory and the scratch and run roots are
/// searchable by everyone (a job's user reaches their own scratch and run directories,
/// lists nothing) and writable by the agent alone; logs are the agent's only.
fn make_dirs(cfg: &Config) -> anyhow::Result<()> {
    for (d, mode) in [
        (cfg.state_dir.clone(), 0o711),
        (cfg.scratch_root(), 0o711),
        (cfg.run_root(), 0o711),
        (cfg.log_root(), 0o700),
    ] {
        let dir = crate::files::Dir::own(&d, mode)
            .map_err(|e| anyhow::anyhow!("--state-dir: {}: {e}", d.display()))?;
        if d != cfg.state_dir {
            dir.set_mode(mode)
                .map_err(|e| anyhow::anyhow!("setting the mode of {}: {e}", d.display()))?;
        }
    }
    Ok(())
}

/// The node's cgroups, limited to its allocatable share; an error when they cannot be
/// used (unless `--no-cgroups`).
fn open_cgroups(cfg: &Config, facts: &discovery::NodeFacts) -> anyhow::Result<Cgroups> {
    use crate::cgroup::{devices, limits, Limits};
    if cfg.no_cgroups {
        tracing::warn!("--no-cgroups: workloads run WITHOUT memory, CPU, pids or device limits; a job can take the whole machine. Use this on a laptop only");
        return Ok(Cgroups::disabled());
    }
    let memory = match cfg.memory_gb {
        Some(gb) => gb << 30,
        None => std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| limits::mem_total(&m))
            .unwrap_or(facts.capacity.memory_gb << 30),
    };
    let capacity = limits::Resources {
        memory,
        cpu_millis: u64::from(facts.capacity.cpu_cores) * 1000,
        pids: cfg
            .max_pids
            .unwrap_or_else(|| limits::pid_capacity(Path::new("/proc"))),
    };
    let resources = cfg
        .system_reserved
        .allocatable(capacity)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let found = devices::discover(&cfg.device_dir);
    let deny = devices::denied(&found, &cfg.gpu_devices);
    let instance = crate::cgroup::instance_id(&cfg.state_dir);
    Cgroups::open(
        &cfg.cgroup_root,
        &cfg.node,
        &instance,
        Limits { resources, deny },
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot limit workloads with cgroups: {e}. The agent runs no workload without memory, CPU and pids limits; fix the cgroup mounts (or point --cgroup-root at them), run it as root, or pass --no-cgroups on a laptop"
        )
    })
}

/// Keep `tx` up to date with this node's `Node` (a watch of that one object).
async fn watch_node(
    ctx_client: lattice_runtime::Client,
    node: String,
    tx: watch::Sender<Option<Arc<Node>>>,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(ctx_client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = watcher::watcher(api, config);
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(watcher::Event::InitApply(n) | watcher::Event::Apply(n)) => {
                    tx.send_replace(Some(Arc::new(n)));
                }
                Some(watcher::Event::Delete(_)) => {
                    tx.send_replace(None);
                }
                Some(_) => {}
                None => return,
            },
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Run the agent until SIGTERM/SIGINT.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let started = lattice_apis::meta::now();
    make_dirs(&cfg)?;
    let facts = discovery::discover(
        &cfg,
        discovery::gpu_discovery(&cfg).as_ref(),
        Path::new("/proc"),
    );
    let cgroups = open_cgroups(&cfg, &facts)?;
    let state = Arc::new(StateFile::load(&cfg.state_file(), &cfg.node)?);
    let identity = crate::identity::NodeIdentity::obtain(&cfg).await?;
    let tls = match &identity {
        Some(id) => Some(id.client_config()?),
        None => {
            tracing::warn!(api = %cfg.api_url, "no node identity (plain http:// API URL): this works only against an API server without authentication, and the agent's endpoint is open to anyone on this machine");
            None
        }
    };
    let client = match &tls {
        Some(t) => Client::https(&cfg.api_url, t.clone())?,
        None => Client::http(&cfg.api_url, None)?,
    };
    let api = ApiHttp::new(&cfg.api_url, tls)?;
    let metrics = Arc::new(Metrics::new());
    let logs = Arc::new(Logs::new(cfg.log_root(), cfg.log_buffer_bytes, &cfg.node));
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("binding --listen {}: {e}", cfg.listen))?;
    let bound = listener.local_addr()?;
    let address = cfg
        .advertise_address
        .clone()
        .unwrap_or_else(|| bound.to_string());
    let shim_exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find the agent's own binary for the shim: {e}"))?;
    let shutdown = CancellationToken::new();
    let reporter = Arc::new(Reporter::new(
        api.clone(),
        &cfg.node,
        state.clone(),
        metrics.clone(),
    ));
    let (node_tx, node_rx) = watch::channel(None);
    tokio::spawn(watch_node(
        client.clone(),
        cfg.node.clone(),
        node_tx,
        shutdown.clone(),
    ));
    let ctx = Arc::new(Ctx {
        cgroups,
        node: node_rx,
        client,
        api,
        identity: identity.clone(),
        state,
        reporter: reporter.clone(),
        runtime: Arc::new(BareProcess::new(shim_exe)),
        logs: logs.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        unsettled: Arc::new(tokio::sync::watch::channel(0).0),
        cfg,
    });
    tracing::info!(node = %ctx.cfg.node, api = %ctx.cfg.api_url, %address, state_dir = %ctx.cfg.state_dir.display(), cgroups = %ctx.cgroups.describe(), min_uid = ctx.cfg.min_uid, "lattice agent starting");

    let http = tokio::spawn(server::serve(
        listener,
        server::AppState {
            logs,
            metrics,
            attach: Some(ctx.clone()),
        },
        shutdown.clone(),
        identity.as_ref().map(|i| i.server_config()).transpose()?,
    ));
    if let Some(id) = &identity {
        tokio::spawn(id.clone().renew(ctx.cfg.api_url.clone(), shutdown.clone()));
    }
    let reports = tokio::spawn(reporter.run(shutdown.clone()));
    // Re-attach first: registration waits until every re-attached run is settled.
    let mut dispatcher = Dispatcher::new(ctx.clone());
    dispatcher.recover();
    // Both wait for the re-attached runs to settle: a heartbeat alone brings a Down
    // node back to Ready.
    tokio::spawn(registration::run(ctx.clone(), facts, address, started));
    tokio::spawn({
        let ctx = ctx.clone();
        async move {
            if registration::wait_settled(&ctx).await {
                heartbeat::run(ctx).await;
            }
        }
    });

    tokio::select! {
        _ = dispatcher.run() => {}
        _ = shutdown_signal() => tracing::info!("shutting down; workloads keep running"),
    }
    shutdown.cancel();
    dispatcher.detach_all().await;
    ctx.cgroups.release();
    let _ = tokio::time::timeout(Duration::from_secs(2), reports).await;
    // Open follow requests would hold the graceful shutdown: give them a moment only.
    let _ = tokio::time::timeout(Duration::from_secs(2), http).await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

struct TaskHandle {
    /// `namespace/name` of the allocation: a supervisor hears only of its own (an object
    /// elsewhere claiming the same uid is not it).
    name: String,
    tx: watch::Sender<AllocView>,
    join: JoinHandle<()>,
}

fn full_name(a: &Allocation) -> String {
    format!("{}/{}", a.metadata.namespace_str(), a.metadata.name_str())
}

/// Starts supervisors for the allocations bound to this node and feeds them updates.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
    tasks: HashMap<TaskKey, TaskHandle>,
    /// Runs that ended (or were reported without running) in this process.
    finished: HashSet<TaskKey>,
    done_tx: mpsc::UnboundedSender<TaskKey>,
    done_rx: mpsc::UnboundedReceiver<TaskKey>,
    /// uids seen during a (re)list.
    listing: Option<HashSet<String>>,
}

impl Dispatcher {
    /// A dispatcher with no runs.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            ctx,
            tasks: HashMap::new(),
            finished: HashSet::new(),
            done_tx,
            done_rx,
            listing: None,
        }
    }

    /// After a restart: clean up orphans and re-attach to the recorded runs.
    pub fn recover(&mut self) {
        let snap = self.ctx.state.snapshot();
        for r in &snap.pending_reports {
            if r.report.phase.is_terminal() {
                self.finished.insert(TaskKey::new(&r.uid, r.report.attempt));
            }
        }
        let known: HashSet<String> = snap.tasks.keys().cloned().collect();
        for root in [self.ctx.cfg.scratch_root(), self.ctx.cfg.run_root()] {
            remove_orphans(&root, &known);
        }
        let cgroups: HashSet<PathBuf> = snap.tasks.values().flat_map(|t| t.cgroup_dirs()).collect();
        self.ctx.cgroups.remove_orphans(&cgroups);
        for rec in snap.tasks.into_values() {
            let key = TaskKey::new(&rec.uid, rec.attempt);
            let name = format!("{}/{}", rec.namespace, rec.name);
            let (tx, rx) = watch::channel(AllocView::Unknown);
            let ctx = self.ctx.clone();
            let done = self.done_tx.clone();
            let k = key.clone();
            let settle = SettleGuard::new(&ctx);
            let join = tokio::spawn(async move {
                supervisor::run_reattached(ctx, rec, rx, settle).await;
                let _ = done.send(k);
            });
            self.tasks.insert(key, TaskHandle { name, tx, join });
        }
    }

    /// Watch and dispatch until shutdown.
    pub async fn run(&mut self) {
        let api: Api<Allocation> = Api::all(self.ctx.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("status.assignedNodes={}", self.ctx.cfg.node));
        let mut events = watcher::watcher(api, config);
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => return,
                },
                Some(key) = self.done_rx.recv() => {
                    self.tasks.remove(&key);
                    self.finished.insert(key);
                }
                _ = self.ctx.shutdown.cancelled() => return,
            }
        }
    }

    /// Let every supervisor store its logs and stop watching (workloads keep running).
    pub async fn detach_all(&mut self) {
        for (_, t) in self.tasks.drain() {
            drop(t.tx);
            if tokio::time::timeout(Duration::from_secs(5), t.join)
                .await
                .is_err()
            {
                tracing::warn!("a supervisor did not stop in time");
            }
        }
    }

    fn on_event(&mut self, ev: watcher::Event<Allocation>) {
        match ev {
            watcher::Event::Init => self.listing = Some(HashSet::new()),
            watcher::Event::InitApply(a) => {
                if let (Some(seen), Some(uid)) = (self.listing.as_mut(), a.metadata.uid.as_ref()) {
                    seen.insert(uid.clone());
                }
                self.apply(a);
            }
            watcher::Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    for (k, t) in &self.tasks {
                        if !seen.contains(&k.uid) {
                            t.tx.send_replace(AllocView::Gone);
                        }
                    }
                }
            }
            watcher::Event::Apply(a) => self.apply(a),
            watcher::Event::Delete(a) => {
                let Some(uid) = a.metadata.uid.as_deref() else {
                    return;
                };
                let name = full_name(&a);
                for (k, t) in &self.tasks {
                    if k.uid == uid && t.name == name {
                        t.tx.send_replace(AllocView::Gone);
                    }
                }
                self.finished.retain(|k| k.uid != uid);
            }
        }
    }

    fn apply(&mut self, a: Allocation) {
        let Some(uid) = a.metadata.uid.clone() else {
            return;
        };
        let a = Arc::new(a);
        let name = full_name(&a);
        for (k, t) in &self.tasks {
            if k.uid == uid && t.name == name {
                t.tx.send_replace(AllocView::Present(a.clone()));
            }
        }
        let node = self.ctx.cfg.node.clone();
        let Some(st) = a.status.as_ref() else {
            return;
        };
        let key = TaskKey::new(&uid, st.attempt);
        if st.attempt == 0
            || !st.assigned_nodes.contains(&node)
            || self.tasks.contains_key(&key)
            || self.finished.contains(&key)
        {
            return;
        }
        let entry = st
            .node_states
            .get(&node)
            .filter(|s| s.attempt == st.attempt);
        match (should_run(&a, &node, st.attempt), entry) {
            (RunDecision::Run, None) => self.start(key, a),
            (RunDecision::Run, Some(e)) if !e.phase.is_terminal() => {
                // This node reported the run but has no record of it: the state was lost.
                let report = NodeTaskState {
                    phase: NodeTaskPhase::Failed,
                    attempt: st.attempt,
                    pid: e.pid,
                    start_time: e.start_time,
                    end_time: Some(lattice_apis::meta::now()),
                    reason: Some(node_reason::LOST.into()),
                    message: Some(
                        "the agent has no record of this process (its state was lost)".into(),
                    ),
                    ..Default::default()
                };
                self.report(key, &a, report);
            }
            (RunDecision::Run, Some(_)) => {
                self.finished.insert(key);
            }
            (RunDecision::Stop(_), None) if ended_before_start(&a) => {
                // Tell the release controller this node will never run it.
                let report = NodeTaskState {
                    phase: NodeTaskPhase::Failed,
                    attempt: st.attempt,
                    end_time: Some(lattice_apis::meta::now()),
                    reason: Some(node_reason::NOT_STARTED.into()),
                    message: Some("the allocation stopped before this node started it".into()),
                    ..Default::default()
                };
                self.report(key, &a, report);
            }
            (RunDecision::Stop(_), _) => {}
        }
    }

    fn report(&mut self, key: TaskKey, a: &Allocation, report: NodeTaskState) {
        let m = &a.metadata;
        if let Err(e) = self
            .ctx
            .reporter
            .enqueue(m.namespace_str(), m.name_str(), &key.uid, report)
        {
            tracing::warn!(error = %e, "cannot queue a report");
        }
        self.finished.insert(key);
    }

    fn start(&mut self, key: TaskKey, a: Arc<Allocation>) {
        let (tx, rx) = watch::channel(AllocView::Present(a.clone()));
        let ctx = self.ctx.clone();
        let done = self.done_tx.clone();
        let k = key.clone();
        let name = full_name(&a);
        let join = tokio::spawn(async move {
            supervisor::run_new(ctx, a, rx).await;
            let _ = done.send(k);
        });
        self.tasks.insert(key, TaskHandle { name, tx, join });
    }
}

/// The allocation will not run this attempt any more (finished, cancelled, preempted,
/// or failed on a peer) — as opposed to merely not being runnable yet.
fn ended_before_start(a: &Allocation) -> bool {
    let phase = a.phase();
    phase.is_terminal()
        || cancel_requested(a)
        || preempt_requested(a)
        || matches!(
            phase,
            AllocationPhase::Staging | AllocationPhase::Running | AllocationPhase::Checkpointing
        )
}

/// Remove entries of `root` (scratch or run directories) that belong to no known run.
fn remove_orphans(root: &Path, known: &HashSet<String>) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().to_string();
        if !known.contains(&name) {
            tracing::info!(path = %e.path().display(), "removing orphaned directory");
            crate::files::remove_tree(&e.path());
        }
    }
}
