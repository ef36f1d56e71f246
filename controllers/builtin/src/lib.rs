//! # lattice-controllers
//!
//! Lattice's built-in controllers, hosted by `lattice-server` on the Raft leader
//! (`lattice_runtime::ControllerHost`). Each is level-triggered and restartable from the
//! store alone; the contract between them and the node agents is ADR-002
//! (`docs/adr/002-allocation-execution.md`, `lattice_apis::lifecycle`).
//!
//! | module | what |
//! |---|---|
//! | [`scheduler`] | one loop per vCluster: the pure core (`lattice_scheduler`) over the shared caches, binding transactions, pending reasons, preemption requests |
//! | [`release`] | frees nodes whose owner is done (after the node's agent confirmed), tenant usage counters |
//! | [`allocations`] | cancels unbound allocations; `spec.dependsOn` of standalone allocations: Slurm `afterok`/`afternotok`/`afterany`/`aftercorr`/`after`/`singleton` with `?` (`anyOf`), `+MINUTES` (`delay`) and `ID_TASK` (`taskIndex`), and Flux RFC 26 `begin-time`/`string` (see the module docs) |
//! | [`dag`] | runs `Dag` steps with the `lattice_dag` dispatch engine |
//! | [`task_groups`] | job arrays: elements created lazily within the concurrency limit |
//! | [`steps`] | job steps (`spec.stepOf`: `lattice launch`, `srun` in an allocation) bound to their allocation's nodes |
//! | [`node_lifecycle`] | heartbeat leases → Degraded/Down (requeue or fail), drain/undrain/disable |
//! | [`autoscaler`] | reactive allocations: metric windows, cooldown, `status.scale.desiredNodes`, scale-down to `status.releasingNodes` ([`autoscaler::MetricSource`], Prometheus) |
//! | [`objects`] | guarded multi-object store transactions |
//!
//! ## Dependencies of standalone allocations
//!
//! `spec.dependsOn` entries hold an allocation out of the queue until the condition
//! `DependenciesMet` is True (or fail it with reason `dependency_never_satisfied`):
//!
//! ```yaml
//! dependsOn:
//!   - {ref: prep, condition: success}      # afterok (also failure, any, corresponding)
//!   - {ref: server, condition: started}    # after: once it has started running
//!   - {beginTime: 1767225600}              # Flux begin-time: not before this epoch second
//!   - {symbol: ckpt, type: inout}          # Flux string scheme (scope: user | global)
//!   - {singleton: true}                    # Slurm singleton, by spec.tags.name and user
//! ```
//!
//! "Earlier" means created earlier by the store (`create_revision`), `status.dependencies`
//! records each dependency's RFC 26 state (a satisfied one stays satisfied), and dependents
//! are woken through an index keyed by what they wait on. The full table of semantics is
//! in [`allocations`].
//!
//! ```no_run
//! # async fn demo(backend: std::sync::Arc<dyn lattice_store::KvBackend>) {
//! use std::sync::Arc;
//! use lattice_runtime::{AlwaysLeader, Client, ControllerHost};
//! let mut host = ControllerHost::new(lattice_apiserver::in_process::client(backend.clone()), Arc::new(AlwaysLeader::new()));
//! let metrics = lattice_controllers::register_all(&mut host, backend, lattice_controllers::Config::default());
//! # let _ = metrics;
//! tokio::spawn(host.run(std::future::pending()));
//! # }
//! ```

pub mod allocations;
pub mod autoscaler;
pub mod dag;
pub mod metrics;
pub mod node_lifecycle;
pub mod objects;
pub mod release;
pub mod scheduler;
pub mod sensitive_pool;
pub mod steps;
pub mod task_groups;

use std::sync::Arc;

use lattice_runtime::ControllerHost;
use lattice_store::KvBackend;

pub use metrics::{ControllerMetrics, SchedulerMetrics};
pub use node_lifecycle::NodeLifecycleConfig;

/// A spawned task that is aborted when this handle is dropped (helper tasks that must
/// not outlive the controller that started them, e.g. when leadership moves).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Settings of the built-in controllers.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Heartbeat timeouts.
    pub node_lifecycle: NodeLifecycleConfig,
    /// DAG admission limits.
    pub dag_limits: lattice_dag::graph::Limits,
    /// Autoscaler: where reactive allocations' metrics come from (none: not scaled).
    pub autoscaler: autoscaler::AutoscalerConfig,
}

/// The metric families of the built-in controllers (register them on `/metrics`).
pub struct Metrics {
    /// Scheduler loops.
    pub scheduler: SchedulerMetrics,
    /// The other loops.
    pub controllers: ControllerMetrics,
}

impl Metrics {
    /// Register every family.
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        self.scheduler.register(r);
        self.controllers.register(r);
    }
}

/// Register every built-in controller (the garbage collector is registered by
/// `lattice_runtime::gc::register`).
pub fn register_all(
    host: &mut ControllerHost,
    backend: Arc<dyn KvBackend>,
    config: Config,
) -> Metrics {
    let metrics = Metrics {
        scheduler: SchedulerMetrics::new(),
        controllers: ControllerMetrics::new(),
    };
    {
        let backend = backend.clone();
        let m = metrics.scheduler.clone();
        host.register("scheduler", move |hc| {
            scheduler::run(hc, backend.clone(), m.clone())
        });
    }
    release::register(host, backend.clone(), metrics.controllers.clone());
    steps::register(host, backend.clone());
    allocations::register(host, backend);
    dag::register(host, config.dag_limits, metrics.controllers.clone());
    task_groups::register(host);
    node_lifecycle::register(host, config.node_lifecycle, metrics.controllers.clone());
    autoscaler::register(host, config.autoscaler, metrics.controllers.clone());
    metrics
}
