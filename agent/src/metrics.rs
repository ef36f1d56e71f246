//! The agent's Prometheus metrics, served on `GET /metrics` of its HTTP endpoint.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Counters and gauges of one agent.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Heartbeats sent on the heartbeat stream.
    pub heartbeats: Counter,
    /// Heartbeat streams that could not be opened or failed.
    pub heartbeat_failures: Counter,
    /// Time to open a heartbeat stream (the server writes the node's Lease first).
    pub heartbeat_latency: Histogram,
    /// Node reports the API acknowledged.
    pub reports_sent: Counter,
    /// Attempts to send a report that failed (and will be retried).
    pub report_failures: Counter,
    /// Reports waiting to be sent.
    pub reports_pending: Gauge,
    /// Workloads started.
    pub workloads_started: Counter,
    /// Workloads that could not be started.
    pub workloads_start_failed: Counter,
    /// Workloads supervised now.
    pub workloads_running: Gauge,
    /// Runs refused before anything started, by node reason (`NotBound`,
    /// `NotPermitted`, `StartFailed`).
    pub workloads_refused: Family<Vec<(String, String)>, Counter>,
    /// Runs that ended with a process killed at the memory limit.
    pub workloads_oom_killed: Counter,
    /// MPI steps stopped here because a rank aborted or died (on any node).
    pub mpi_aborts: Counter,
    /// `lattice attach` sessions started.
    pub attach_sessions: Counter,
    /// `lattice attach` sessions open now.
    pub attach_sessions_open: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh metrics.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lattice_agent");
        let m = Self {
            registry: Registry::default(),
            heartbeats: Counter::default(),
            heartbeat_failures: Counter::default(),
            heartbeat_latency: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reports_sent: Counter::default(),
            report_failures: Counter::default(),
            reports_pending: Gauge::default(),
            workloads_started: Counter::default(),
            workloads_start_failed: Counter::default(),
            workloads_running: Gauge::default(),
            workloads_refused: Family::default(),
            workloads_oom_killed: Counter::default(),
            mpi_aborts: Counter::default(),
            attach_sessions: Counter::default(),
            attach_sessions_open: Gauge::default(),
        };
        registry.register(
            "heartbeats",
            "Heartbeats sent on the heartbeat stream",
            m.heartbeats.clone(),
        );
        registry.register(
            "heartbeat_failures",
            "Heartbeat streams that could not be opened or failed",
            m.heartbeat_failures.clone(),
        );
        registry.register(
            "heartbeat_latency_seconds",
            "Time to open a heartbeat stream (the server writes the node's Lease first)",
            m.heartbeat_latency.clone(),
        );
        registry.register(
            "reports",
            "Node reports acknowledged by the API",
            m.reports_sent.clone(),
        );
        registry.register(
            "report_failures",
            "Node report attempts that failed and are retried",
            m.report_failures.clone(),
        );
        registry.register(
            "reports_pending",
            "Node reports waiting to be sent",
            m.reports_pending.clone(),
        );
        registry.register(
            "workloads_started",
            "Workloads started",
            m.workloads_started.clone(),
        );
        registry.register(
            "workloads_start_failed",
            "Workloads that could not be started",
            m.workloads_start_failed.clone(),
        );
        registry.register(
            "workloads_running",
            "Workloads supervised now",
            m.workloads_running.clone(),
        );
        registry.register(
            "workloads_refused",
            "Runs refused before anything started, by node reason",
            m.workloads_refused.clone(),
        );
        registry.register(
            "workloads_oom_killed",
            "Runs that ended with a process killed at the memory limit",
            m.workloads_oom_killed.clone(),
        );
        registry.register(
            "mpi_aborts",
            "MPI steps stopped here because one of their ranks aborted or died",
            m.mpi_aborts.clone(),
        );
        registry.register(
            "attach_sessions",
            "lattice attach sessions started",
            m.attach_sessions.clone(),
        );
        registry.register(
            "attach_sessions_open",
            "lattice attach sessions open now",
            m.attach_sessions_open.clone(),
        );
        Self { registry, ..m }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names() {
        let m = Metrics::new();
        m.heartbeats.inc();
        m.heartbeats.inc();
        let text = m.encode();
        assert!(text.contains("lattice_agent_heartbeats_total 2"), "{text}");
        assert!(
            text.contains("lattice_agent_heartbeat_failures_total 0"),
            "{text}"
        );
        assert!(text.contains("lattice_agent_workloads_running 0"), "{text}");
        m.workloads_refused
            .get_or_create(&vec![("reason".into(), "NotBound".into())])
            .inc();
        let text = m.encode();
        assert!(
            text.contains("lattice_agent_workloads_refused_total{reason=\"NotBound\"} 1"),
            "{text}"
        );
    }
}
