//! The autoscaler: the *decisions* of reactive allocations (`spec.lifecycle.type:
//! reactive` with a `scalePolicy`), after the seed's "Autoscaling" chapter. Simple,
//! metric-driven, one node at a time, no control theory.
//!
//! Level-triggered: for every Running reactive allocation (not deleting, no cancel
//! requested) the controller
//!
//! 1. on first sight sets `status.scale.desiredNodes` to the number of assigned nodes;
//! 2. every `scalePolicy.evaluationInterval` (default 60s) queries the metric through a
//!    [`MetricSource`] (in `lattice-server`: [`PrometheusSource`], `--metrics-url`);
//! 3. keeps, in memory per allocation, how long the value has been *above* the target
//!    and how long *below* `target × scaleDownThreshold` (a window restarts when its
//!    condition breaks, after a failed query and after a scale event);
//! 4. decides with the pure [`decide`]:
//!    * no decision while `now − lastScaleTime < cooldown` (default 3m);
//!    * **scale up** after `scaleUpWindow` (2m) above the target, below `maxNodes`, once
//!      the previous scale-up has been placed (`desiredNodes ≤ len(assignedNodes)`):
//!      `desiredNodes += 1`. The *scheduler* places the node and appends it to
//!      `assignedNodes`; when it cannot (tenant quota, no free node) it explains why in
//!      `status.scale.message`, which the autoscaler leaves alone until its next decision;
//!    * **scale down** after `scaleDownWindow` (5m) below `target × scaleDownThreshold`
//!      (0.5) while above `minNodes`: one guarded status write moves the most recently
//!      added node (the last of `assignedNodes`) to `status.releasingNodes` and sets
//!      `desiredNodes` to the new count. The node's agent stops the processes there, and
//!      the release controller frees the node once the agent confirmed. At `minNodes` a
//!      scale-up that was never placed is cancelled instead (`desiredNodes` back to the
//!      assigned count).
//!
//! The decision is re-checked inside the guarded (resourceVersion) status write on the
//! fresh object, so a concurrent scheduler placement or agent report never races it.
//!
//! **Metric query failures** (the seed's "TSDB down"): the evaluation is skipped,
//! `status.scale.metricFailures` counts the consecutive failures, a warning is logged
//! and `lattice_autoscaling_metric_query_failures_total` counts them; from the third
//! consecutive failure on an `error!` "alert" line is logged (at the 3rd and every 10th
//! after). The allocation is never scaled blindly: no value, no decision. The first
//! successful query resets the count.
//!
//! **Oscillation**: when scale directions alternate more than 5 times in a row a
//! warning "alert" suggests raising `cooldown` or adjusting the target, and
//! `lattice_autoscaling_oscillation_alerts_total` counts it. No automatic adjustment.
//!
//! Status writes are kept small: an evaluation writes only when the value, the failure
//! count, `desiredNodes` or the message changed, or at every 10th evaluation (to keep
//! `lastEvaluationTime` fresh).
//!
//! Without a metric source (`lattice-server` without `--metrics-url`) the controller
//! writes [`NO_SOURCE_MESSAGE`] into `status.scale.message` once and does nothing else.
//!
//! ## Targets
//!
//! `target` is a number (`0.8`) or a value with a unit, converted to the Prometheus base
//! unit the metric is expected in: `"100ms"` → `0.1` (seconds), `"2s"` → `2`, `"250us"`
//! → `0.00025`, `"80%"` → `0.8` (a ratio), `"0.8"` → `0.8`. Anything else is reported in
//! `status.scale.message` and the allocation is not scaled.
//!
//! ## Prometheus queries and the labelling convention
//!
//! [`PrometheusSource`] runs an instant query (`GET {base}/api/v1/query?query=Q`, 5 s
//! timeout) and uses the first sample of the vector result:
//!
//! * the metric is a name with optional label matchers (`gpu_utilization`,
//!   `queue_depth{queue="inference"}`; admission accepts nothing else, see
//!   `lattice_apis::metric`), and the query is always scoped to the allocation:
//!   `avg(N{<matchers>,lattice_allocation="<name>",lattice_tenant="<namespace>"})`. The
//!   workload's exporter, or (better, since a workload could label its series as another
//!   allocation's) a relabel rule of the scrape job, attaches `lattice_allocation` (the
//!   allocation's name) and `lattice_tenant` (its namespace) to the series of every node
//!   of the allocation. Free-form PromQL is refused: a tenant reads only series labelled
//!   as its own allocation's.
//!
//! An empty result is a failed query ("no samples for Q"), as is a non-finite value.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use lattice_apis::duration::parse_duration;
use lattice_apis::lifecycle;
use lattice_apis::meta::now as now_truncated;
use lattice_apis::{
    Allocation, AllocationPhase, AllocationStatus, LifecycleType, NodeTaskPhase, ScalePolicy,
    ScaleStatus, ScaleTarget,
};
use lattice_runtime::{Action, Api, HostContext, ObjectRef, ResourceExt};
use tracing::{debug, error, info, warn};

use crate::metrics::ControllerMetrics;

mod controller;
mod decision;
mod prometheus;

#[cfg(test)]
mod tests;

pub use controller::*;
pub use decision::*;
pub use prometheus::*;

/// `status.scale.message` of reactive allocations when no metric source is configured.
pub const NO_SOURCE_MESSAGE: &str =
    "no metric source configured (lattice-server --metrics-url); not scaling";
/// Default `scalePolicy.cooldown`.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(180);
/// Default `scalePolicy.evaluationInterval`.
pub const DEFAULT_EVALUATION_INTERVAL: Duration = Duration::from_secs(60);
/// Default `scalePolicy.scaleUpWindow`.
pub const DEFAULT_SCALE_UP_WINDOW: Duration = Duration::from_secs(120);
/// Default `scalePolicy.scaleDownWindow`.
pub const DEFAULT_SCALE_DOWN_WINDOW: Duration = Duration::from_secs(300);
/// Default `scalePolicy.scaleDownThreshold`.
pub const DEFAULT_SCALE_DOWN_THRESHOLD: f64 = 0.5;
/// Consecutive metric query failures from which an alert is logged.
pub const FAILURE_ALERT_THRESHOLD: u32 = 3;
/// Alternating scale directions beyond which an oscillation alert is logged.
pub const OSCILLATION_ALERT_ALTERNATIONS: u32 = 5;
/// An evaluation that changed nothing but the time is written at least this often.
pub const WRITE_EVERY_EVALUATIONS: u32 = 10;
/// Shortest evaluation interval honoured (a `0s` interval would spin).
const MIN_EVALUATION_INTERVAL: Duration = Duration::from_secs(1);
/// Upper bound on one metric query, whatever the source does.
const QUERY_DEADLINE: Duration = Duration::from_secs(10);

/// Where the autoscaler reads a reactive allocation's metric.
#[async_trait]
pub trait MetricSource: Send + Sync {
    /// The current value of `metric` (`scalePolicy.metric`) for `alloc`; `Err` says why
    /// there is none (the evaluation is skipped, nothing is scaled).
    async fn query(&self, alloc: &Allocation, metric: &str) -> Result<f64, String>;
}

/// Autoscaler settings (`lattice_controllers::Config::autoscaler`).
#[derive(Clone, Default)]
pub struct AutoscalerConfig {
    /// The metric source; `None`: reactive allocations are not scaled (and say so).
    pub metric_source: Option<Arc<dyn MetricSource>>,
}

impl AutoscalerConfig {
    /// Scale with metrics from `source`.
    pub fn with_source(source: Arc<dyn MetricSource>) -> Self {
        Self {
            metric_source: Some(source),
        }
    }
}

impl fmt::Debug for AutoscalerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutoscalerConfig")
            .field(
                "metric_source",
                &self.metric_source.as_ref().map(|_| "<dyn MetricSource>"),
            )
            .finish()
    }
}
