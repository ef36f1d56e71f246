//! Metrics of the built-in controllers' long-running loops (the seed's "Scheduler
//! Self-Monitoring", by its names, so its alert rules apply): `lattice_scheduling_*`,
//! `lattice_preemptions_total`, `lattice_release_*`, `lattice_node_*`,
//! `lattice_dag_*`, `lattice_autoscaling_*`.

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::scheduler::CycleStats;

/// `vcluster` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VClusterLabel {
    /// `tenant/name`.
    pub vcluster: String,
}

/// `vcluster` and `result` labels (`accepted`, `rejected`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `tenant/name`.
    pub vcluster: String,
    /// Outcome.
    pub result: &'static str,
}

/// `vcluster` and `reason` labels (`priority`, `reclaim`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreemptionLabel {
    /// `tenant/name`.
    pub vcluster: String,
    /// Why.
    pub reason: &'static str,
}

/// `vcluster` and `result` labels (`granted`, `conflict`, `rejected`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabel {
    /// `tenant/name`.
    pub vcluster: String,
    /// Outcome.
    pub result: &'static str,
}

/// `vcluster` and `extender` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExtenderLabel {
    /// `tenant/name`.
    pub vcluster: String,
    /// `spec.extenders[].name`.
    pub extender: String,
}

/// `direction` label (`up`, `down`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    /// Scale direction.
    pub direction: &'static str,
}

/// `state` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// Node state.
    pub state: String,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// Scheduler loop metrics (cheap to clone).
#[derive(Clone)]
pub struct SchedulerMetrics {
    cycle_duration: Family<VClusterLabel, Histogram, fn() -> Histogram>,
    core_duration: Family<VClusterLabel, Histogram, fn() -> Histogram>,
    queue_depth: Family<VClusterLabel, Gauge<i64, AtomicI64>>,
    running: Family<VClusterLabel, Gauge<i64, AtomicI64>>,
    proposals: Family<ResultLabel, Counter>,
    placements: Family<VClusterLabel, Counter>,
    backfills: Family<VClusterLabel, Counter>,
    preemptions: Family<PreemptionLabel, Counter>,
    claims: Family<ClaimLabel, Counter>,
    cycles: Family<VClusterLabel, Counter>,
    reasons_queued: Gauge<i64, AtomicI64>,
    reasons_written: Counter,
    extender_calls: Family<ExtenderLabel, Counter>,
    extender_errors: Family<ExtenderLabel, Counter>,
    extender_duration: Family<ExtenderLabel, Histogram, fn() -> Histogram>,
}

impl Default for SchedulerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl SchedulerMetrics {
    /// Empty families.
    pub fn new() -> Self {
        Self {
            cycle_duration: Family::new_with_constructor(histogram as fn() -> Histogram),
            core_duration: Family::new_with_constructor(histogram as fn() -> Histogram),
            queue_depth: Family::default(),
            running: Family::default(),
            proposals: Family::default(),
            placements: Family::default(),
            backfills: Family::default(),
            preemptions: Family::default(),
            claims: Family::default(),
            cycles: Family::default(),
            reasons_queued: Gauge::default(),
            reasons_written: Counter::default(),
            extender_calls: Family::default(),
            extender_errors: Family::default(),
            extender_duration: Family::new_with_constructor(histogram as fn() -> Histogram),
        }
    }

    /// Pending reasons waiting for the reason writer now.
    pub fn set_reasons_queued(&self, n: usize) {
        self.reasons_queued.set(n as i64);
    }

    /// Pending reasons the reason writer wrote.
    pub fn reasons_written(&self, n: usize) {
        self.reasons_written.inc_by(n as u64);
    }

    /// Register under the seed's names: `lattice_scheduling_*` and
    /// `lattice_preemptions_total` (also as `lattice_scheduling_preemptions_total`, the
    /// name the seed's metrics table gives it).
    pub fn register(&self, root: &mut Registry) {
        root.register(
            "lattice_preemptions",
            "Preemptions requested, by reason (priority: a higher class; reclaim: a lender takes back its home nodes)",
            self.preemptions.clone(),
        );
        let r = root.sub_registry_with_prefix("lattice_scheduling");
        r.register(
            "cycle_duration_seconds",
            "Time to complete one scheduling cycle, store writes included",
            self.cycle_duration.clone(),
        );
        r.register(
            "cost_function_duration_seconds",
            "Time to evaluate the cost function and place the candidates (the pure core) per cycle",
            self.core_duration.clone(),
        );
        r.register(
            "queue_depth",
            "Number of pending allocations",
            self.queue_depth.clone(),
        );
        r.register(
            "running_allocations",
            "Allocations holding nodes",
            self.running.clone(),
        );
        r.register(
            "proposals",
            "Binding proposals sent to the store, by result (accepted: committed; rejected: lost a race, retried next cycle)",
            self.proposals.clone(),
        );
        r.register(
            "placements",
            "Successful placements",
            self.placements.clone(),
        );
        r.register(
            "backfill_jobs",
            "Allocations placed via backfill",
            self.backfills.clone(),
        );
        r.register(
            "preemptions",
            "Preemption events (the same counter as lattice_preemptions_total)",
            self.preemptions.clone(),
        );
        r.register(
            "claims",
            "Claims of named nodes, by result (granted, conflict = OwnershipConflict, rejected)",
            self.claims.clone(),
        );
        r.register("cycles", "Scheduling cycles run", self.cycles.clone());
        r.register(
            "reasons_queued",
            "Pending reasons decided but not yet written (the writer is rate limited; a newer reason for the same allocation replaces a queued one)",
            self.reasons_queued.clone(),
        );
        r.register(
            "reasons_written",
            "Pending reasons written onto allocations",
            self.reasons_written.clone(),
        );
        r.register(
            "extender_calls",
            "Calls of scheduler extenders (spec.extenders), one per extender per cycle",
            self.extender_calls.clone(),
        );
        r.register(
            "extender_errors",
            "Extender calls without a usable answer in time (refused, timed out, HTTP error, unreadable); the extender's failurePolicy then applies",
            self.extender_errors.clone(),
        );
        r.register(
            "extender_duration_seconds",
            "Time of one extender call, answer read",
            self.extender_duration.clone(),
        );
    }

    /// Record one call of a scheduler extender (`ok`: a usable answer in time).
    pub fn observe_extender(&self, vcluster: &str, extender: &str, took: Duration, ok: bool) {
        let l = ExtenderLabel {
            vcluster: vcluster.to_string(),
            extender: extender.to_string(),
        };
        self.extender_calls.get_or_create(&l).inc();
        if !ok {
            self.extender_errors.get_or_create(&l).inc();
        }
        self.extender_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// Calls and failed calls of a scheduler extender so far (for tests and status).
    pub fn extender_counts(&self, vcluster: &str, extender: &str) -> (u64, u64) {
        let l = ExtenderLabel {
            vcluster: vcluster.to_string(),
            extender: extender.to_string(),
        };
        (
            self.extender_calls.get_or_create(&l).get(),
            self.extender_errors.get_or_create(&l).get(),
        )
    }

    /// Record one cycle.
    pub fn observe_cycle(&self, vcluster: &str, took: Duration, s: &CycleStats) {
        let l = VClusterLabel {
            vcluster: vcluster.to_string(),
        };
        self.cycles.get_or_create(&l).inc();
        self.cycle_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
        self.core_duration
            .get_or_create(&l)
            .observe(s.core_time.as_secs_f64());
        self.queue_depth.get_or_create(&l).set(s.pending as i64);
        self.running.get_or_create(&l).set(s.running as i64);
        for (result, n) in [("accepted", s.bound), ("rejected", s.conflicts)] {
            self.proposals
                .get_or_create(&ResultLabel {
                    vcluster: vcluster.to_string(),
                    result,
                })
                .inc_by(n as u64);
        }
        self.placements.get_or_create(&l).inc_by(s.bound as u64);
        self.backfills.get_or_create(&l).inc_by(s.backfilled as u64);
        for (reason, n) in [("priority", s.preemptions), ("reclaim", s.reclaims)] {
            if n > 0 {
                self.preemptions
                    .get_or_create(&PreemptionLabel {
                        vcluster: vcluster.to_string(),
                        reason,
                    })
                    .inc_by(n as u64);
            }
        }
        for (result, n) in [
            ("granted", s.claims_granted),
            ("conflict", s.claims_conflicted),
            ("rejected", s.claims_rejected),
        ] {
            if n > 0 {
                self.claims
                    .get_or_create(&ClaimLabel {
                        vcluster: vcluster.to_string(),
                        result,
                    })
                    .inc_by(n as u64);
            }
        }
    }
}

/// Metrics of the other built-in loops.
#[derive(Clone)]
pub struct ControllerMetrics {
    /// Nodes released (ownership cleared).
    pub nodes_released: Counter,
    /// Release transactions that lost a race.
    pub release_conflicts: Counter,
    /// Node state transitions made by the node lifecycle controller.
    pub node_transitions: Family<StateLabel, Counter>,
    /// Allocations requeued or failed because their node went Down.
    pub node_failures: Counter,
    /// DAG steps released.
    pub dag_releases: Counter,
    /// DAG release latency: from the predecessor's terminal status to the successor
    /// being released.
    pub dag_release_latency: Histogram,
    /// Failed metric queries of the autoscaler
    /// (`lattice_autoscaling_metric_query_failures_total`).
    pub autoscaling_metric_query_failures: Counter,
    /// Scale events decided by the autoscaler, by direction.
    pub autoscaling_scale_events: Family<DirectionLabel, Counter>,
    /// Oscillation alerts of the autoscaler.
    pub autoscaling_oscillation_alerts: Counter,
}

impl ControllerMetrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self {
            nodes_released: Counter::default(),
            release_conflicts: Counter::default(),
            node_transitions: Family::default(),
            node_failures: Counter::default(),
            dag_releases: Counter::default(),
            dag_release_latency: histogram(),
            autoscaling_metric_query_failures: Counter::default(),
            autoscaling_scale_events: Family::default(),
            autoscaling_oscillation_alerts: Counter::default(),
        }
    }

    /// Count one scale event of the autoscaler (`up` or `down`).
    pub fn record_scale_event(&self, direction: &'static str) {
        self.autoscaling_scale_events
            .get_or_create(&DirectionLabel { direction })
            .inc();
    }

    /// Register under `lattice_*`.
    pub fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("lattice");
        r.register(
            "release_nodes_released",
            "Nodes whose ownership was released",
            self.nodes_released.clone(),
        );
        r.register(
            "release_conflicts",
            "Release transactions that lost a race",
            self.release_conflicts.clone(),
        );
        r.register(
            "node_transitions",
            "Node state transitions by the node lifecycle controller",
            self.node_transitions.clone(),
        );
        r.register(
            "node_failure_allocations",
            "Allocations requeued or failed because their node went Down",
            self.node_failures.clone(),
        );
        r.register(
            "dag_releases",
            "DAG steps released",
            self.dag_releases.clone(),
        );
        r.register(
            "dag_release_latency_seconds",
            "From a predecessor's terminal status write to its successor's release",
            self.dag_release_latency.clone(),
        );
        r.register(
            "autoscaling_metric_query_failures",
            "Failed metric queries of the autoscaler (no scaling decision is made without a value)",
            self.autoscaling_metric_query_failures.clone(),
        );
        r.register(
            "autoscaling_scale_events",
            "Scale events decided by the autoscaler, by direction",
            self.autoscaling_scale_events.clone(),
        );
        r.register(
            "autoscaling_oscillation_alerts",
            "Reactive allocations whose scale direction alternated more than 5 times in a row",
            self.autoscaling_oscillation_alerts.clone(),
        );
    }
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's names and labels, so its alert rules (`lattice_scheduling_queue_depth >
    /// 100`, `lattice_scheduling_proposals_total{result="rejected"}`, ...) match.
    #[test]
    fn scheduler_metrics_carry_the_seeds_names() {
        let m = SchedulerMetrics::new();
        let mut r = Registry::default();
        m.register(&mut r);
        let stats = CycleStats {
            pending: 7,
            bound: 3,
            conflicts: 1,
            backfilled: 2,
            preemptions: 1,
            core_time: Duration::from_millis(2),
            ..Default::default()
        };
        m.observe_cycle("t1/batch", Duration::from_millis(5), &stats);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        for line in [
            "lattice_scheduling_queue_depth{vcluster=\"t1/batch\"} 7",
            "lattice_scheduling_proposals_total{vcluster=\"t1/batch\",result=\"accepted\"} 3",
            "lattice_scheduling_proposals_total{vcluster=\"t1/batch\",result=\"rejected\"} 1",
            "lattice_scheduling_placements_total{vcluster=\"t1/batch\"} 3",
            "lattice_scheduling_backfill_jobs_total{vcluster=\"t1/batch\"} 2",
            "lattice_preemptions_total{vcluster=\"t1/batch\",reason=\"priority\"} 1",
            "lattice_scheduling_preemptions_total{vcluster=\"t1/batch\",reason=\"priority\"} 1",
            "lattice_scheduling_cycle_duration_seconds_count{vcluster=\"t1/batch\"} 1",
            "lattice_scheduling_cost_function_duration_seconds_count{vcluster=\"t1/batch\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
