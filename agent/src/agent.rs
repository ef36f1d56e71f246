//! The agent process: wires registration, heartbeat, the report queue, the HTTP
//! endpoint and the allocation [dispatcher](crate::dispatcher) together, and recovers
//! after a restart.
//!
//! The dispatcher watches the allocations bound to this node
//! (`status.assignedNodes=<node>`, every tenant) and, per `(uid, attempt)`, starts a
//! [supervisor](crate::supervisor) when `lifecycle::should_run` says `Run` and nothing
//! runs yet; every later version of the allocation is handed to the running
//! supervisors, which stop their workload when it says `Stop` (level-triggered).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lattice_apis::Node;
use lattice_runtime::{watcher, Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cgroup::Cgroups;
use crate::config::Config;
use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::reporter::Reporter;
use crate::runtime::BareProcess;
use crate::state::StateFile;
use crate::{discovery, heartbeat, registration, server};

pub use crate::api::ApiHttp;
pub use crate::context::{Ctx, SettleGuard};
pub use crate::dispatcher::Dispatcher;

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
    let peers = crate::pmi::exchange::Peers::new(tls.clone());
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
    let pmi = Arc::new(crate::pmi::exchange::Registry::default());
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
        pmi: pmi.clone(),
        peers,
        gpus: facts.capacity.gpus.iter().map(|g| g.index).collect(),
        cfg,
    });
    tracing::info!(node = %ctx.cfg.node, api = %ctx.cfg.api_url, %address, state_dir = %ctx.cfg.state_dir.display(), cgroups = %ctx.cgroups.describe(), min_uid = ctx.cfg.min_uid, "lattice agent starting");

    let http = tokio::spawn(server::serve(
        listener,
        server::AppState {
            logs,
            metrics,
            attach: Some(ctx.clone()),
            pmi,
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
