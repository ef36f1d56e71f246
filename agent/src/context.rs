//! What every part of the agent shares ([`Ctx`]), and the count of re-attached runs not
//! yet settled ([`SettleGuard`]).

use std::sync::Arc;

use lattice_apis::Node;
use lattice_runtime::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::ApiHttp;
use crate::cgroup::Cgroups;
use crate::config::Config;
use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::reporter::Reporter;
use crate::runtime::ProcessRuntime;
use crate::state::StateFile;

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
    /// The MPI steps this node serves PMI for (found by the agents' fence exchange).
    pub pmi: Arc<crate::pmi::exchange::Registry>,
    /// How this agent reaches the other agents of a step.
    pub peers: crate::pmi::exchange::Peers,
    /// The GPUs this node reported (their indices, in order), for per-task binding.
    pub gpus: Vec<u32>,
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
