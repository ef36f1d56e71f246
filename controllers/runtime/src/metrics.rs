//! Per-controller metrics (prometheus-client): queue depth, reconciles and their
//! latency by result, retries, and time since the last successful reconcile.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// Controller name.
    pub controller: String,
}

/// `controller` and `result` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// Controller name.
    pub controller: String,
    /// `success`, `error` or `deleted` (the object was gone: a no-op).
    pub result: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// The metric families, shared by every controller of a host (labelled by name).
#[derive(Clone)]
pub struct RuntimeMetrics {
    /// Keys waiting in the queue.
    pub queue_depth: Family<ControllerLabel, Gauge<i64, AtomicI64>>,
    /// Reconciles in progress.
    pub in_flight: Family<ControllerLabel, Gauge<i64, AtomicI64>>,
    /// Reconciles by result.
    pub reconciles: Family<ResultLabel, Counter>,
    /// Reconcile latency by result.
    pub reconcile_duration: Family<ResultLabel, Histogram, fn() -> Histogram>,
    /// Retries scheduled after failures.
    pub retries: Family<ControllerLabel, Counter>,
    /// Seconds since the last successful reconcile (-1: none yet).
    pub seconds_since_success: Family<ControllerLabel, Gauge<f64, AtomicU64>>,
    /// Whether the controller is running (leader and started): 1 or 0.
    pub running: Family<ControllerLabel, Gauge<i64, AtomicI64>>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for RuntimeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeMetrics").finish_non_exhaustive()
    }
}

impl RuntimeMetrics {
    /// Empty families.
    pub fn new() -> Self {
        Self {
            queue_depth: Family::default(),
            in_flight: Family::default(),
            reconciles: Family::default(),
            reconcile_duration: Family::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            ),
            retries: Family::default(),
            seconds_since_success: Family::default(),
            running: Family::default(),
        }
    }

    /// Register every family under `lattice_controller_*` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("lattice_controller");
        r.register(
            "queue_depth",
            "Keys waiting in the controller's work queue",
            self.queue_depth.clone(),
        );
        r.register(
            "in_flight",
            "Reconciles in progress",
            self.in_flight.clone(),
        );
        r.register(
            "reconciles",
            "Reconciles by result (success, error, deleted)",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Reconcile latency by result",
            self.reconcile_duration.clone(),
        );
        r.register(
            "retries",
            "Retries scheduled after failed reconciles",
            self.retries.clone(),
        );
        r.register(
            "seconds_since_last_success",
            "Seconds since the last successful reconcile (-1: none yet)",
            self.seconds_since_success.clone(),
        );
        r.register(
            "running",
            "1 while the controller runs (leader, started), else 0",
            self.running.clone(),
        );
    }

    pub(crate) fn label(name: &str) -> ControllerLabel {
        ControllerLabel {
            controller: name.to_string(),
        }
    }

    pub(crate) fn result(name: &str, result: &str) -> ResultLabel {
        ResultLabel {
            controller: name.to_string(),
            result: result.to_string(),
        }
    }
}
