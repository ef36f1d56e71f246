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

// ---------------------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------------------

/// A [`MetricSource`] backed by the Prometheus HTTP API (instant queries); see the
/// module docs for the query built from `scalePolicy.metric`.
#[derive(Clone)]
pub struct PrometheusSource {
    base_url: String,
    client: reqwest::Client,
}

impl fmt::Debug for PrometheusSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrometheusSource")
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// Timeout of one Prometheus query.
pub const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(5);

impl PrometheusSource {
    /// A source querying the Prometheus (or compatible TSDB) at `base_url`, e.g.
    /// `http://prometheus:9090` (a path prefix is kept: `http://h/prom`).
    pub fn new(base_url: &str) -> Result<Self, String> {
        let base = base_url.trim().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) || base.len() < 8 {
            return Err(format!(
                "metrics URL {base_url:?} must be an http:// or https:// URL, e.g. http://prometheus:9090"
            ));
        }
        let client = reqwest::Client::builder()
            .timeout(PROMETHEUS_TIMEOUT)
            .connect_timeout(PROMETHEUS_TIMEOUT)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(Self {
            base_url: base,
            client,
        })
    }

    /// The base URL queries go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The PromQL query for `metric` of `alloc` (see the module docs).
    pub fn promql(alloc: &Allocation, metric: &str) -> Result<String, String> {
        let sel = lattice_apis::metric::MetricSelector::parse(metric)?;
        Ok(format!(
            "avg({})",
            sel.to_promql(&[
                ("lattice_allocation", alloc.name_any()),
                ("lattice_tenant", alloc.namespace().unwrap_or_default()),
            ])
        ))
    }
}

/// The value of a Prometheus `/api/v1/query` response body for query `q`.
pub fn parse_prometheus_response(body: &str, q: &str) -> Result<f64, String> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(|e| {
        format!(
            "query {q}: the response is not Prometheus JSON ({e}): {}",
            snippet(body)
        )
    })?;
    let status = v.get("status").and_then(|s| s.as_str()).unwrap_or("");
    if status != "success" {
        let kind = v.get("errorType").and_then(|s| s.as_str()).unwrap_or("");
        let msg = v
            .get("error")
            .and_then(|s| s.as_str())
            .unwrap_or("no error given");
        return Err(format!(
            "query {q}: prometheus answered status {status:?}: {kind} {msg}"
        ));
    }
    let data = v
        .get("data")
        .ok_or_else(|| format!("query {q}: the response has no data"))?;
    let result_type = data
        .get("resultType")
        .and_then(|s| s.as_str())
        .unwrap_or("");
    let sample = match result_type {
        "vector" => {
            let result = data
                .get("result")
                .and_then(|r| r.as_array())
                .ok_or_else(|| format!("query {q}: the vector result is not a list"))?;
            let Some(first) = result.first() else {
                return Err(format!("no samples for {q}"));
            };
            first
                .get("value")
                .ok_or_else(|| format!("query {q}: the first sample has no value"))?
        }
        "scalar" => data
            .get("result")
            .ok_or_else(|| format!("query {q}: the scalar result is missing"))?,
        other => {
            return Err(format!(
                "query {q}: expected an instant vector, got resultType {other:?}"
            ))
        }
    };
    let raw = sample
        .get(1)
        .and_then(|s| s.as_str())
        .ok_or_else(|| format!("query {q}: the sample is not [time, \"value\"]"))?;
    let value: f64 = raw
        .trim()
        .parse()
        .map_err(|_| format!("query {q}: the value {raw:?} is not a number"))?;
    if !value.is_finite() {
        return Err(format!(
            "query {q}: the value is {raw}, not a finite number"
        ));
    }
    Ok(value)
}

fn snippet(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[async_trait]
impl MetricSource for PrometheusSource {
    async fn query(&self, alloc: &Allocation, metric: &str) -> Result<f64, String> {
        let q = Self::promql(alloc, metric)?;
        let url = format!("{}/api/v1/query", self.base_url);
        let resp = self
            .client
            .get(&url)
            .query(&[("query", q.as_str())])
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    format!("query {q}: {url} did not answer within {PROMETHEUS_TIMEOUT:?}")
                } else {
                    format!("query {q}: {url}: {e}")
                }
            })?;
        let code = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| format!("query {q}: reading the response: {e}"))?;
        match parse_prometheus_response(&body, &q) {
            Ok(v) if code.is_success() => Ok(v),
            Ok(_) => Err(format!("query {q}: HTTP {code}")),
            // Prometheus explains a 4xx/5xx in the JSON body; say both.
            Err(e) if !code.is_success() => Err(format!("HTTP {code}: {e}")),
            Err(e) => Err(e),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The pure decision
// ---------------------------------------------------------------------------------------

/// A [`ScalePolicy`] with its defaults filled in and its durations and target parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Floor of a scale-down.
    pub min_nodes: u32,
    /// Ceiling of a scale-up.
    pub max_nodes: u32,
    /// The metric, as written.
    pub metric: String,
    /// The target in the metric's base unit.
    pub target: f64,
    /// The target as written (for messages).
    pub target_text: String,
    /// No decision this long after the last one.
    pub cooldown: Duration,
    /// How often the metric is read.
    pub evaluation_interval: Duration,
    /// Above the target this long before a scale-up.
    pub scale_up_window: Duration,
    /// Below `target × scale_down_threshold` this long before a scale-down.
    pub scale_down_window: Duration,
    /// Fraction of the target under which the allocation scales down.
    pub scale_down_threshold: f64,
}

impl Policy {
    /// Parse `sp`; the error is a message for `status.scale.message`.
    pub fn from_spec(sp: &ScalePolicy) -> Result<Self, String> {
        let dur = |field: &str, v: &Option<String>, default: Duration| match v {
            None => Ok(default),
            Some(s) => parse_duration(s)
                .map(Duration::from_secs)
                .map_err(|e| format!("scalePolicy.{field} {s:?}: {e}; not scaling")),
        };
        let target = parse_target(&sp.target)?;
        let threshold = sp
            .scale_down_threshold
            .unwrap_or(DEFAULT_SCALE_DOWN_THRESHOLD);
        if !(threshold.is_finite() && (0.0..=1.0).contains(&threshold)) {
            return Err(format!(
                "scalePolicy.scaleDownThreshold {threshold} is not between 0 and 1; not scaling"
            ));
        }
        if sp.min_nodes > sp.max_nodes {
            return Err(format!(
                "scalePolicy.minNodes ({}) is above maxNodes ({}); not scaling",
                sp.min_nodes, sp.max_nodes
            ));
        }
        Ok(Self {
            min_nodes: sp.min_nodes,
            max_nodes: sp.max_nodes,
            metric: sp.metric.trim().to_string(),
            target,
            target_text: match &sp.target {
                ScaleTarget::Number(n) => fmt_value(*n),
                ScaleTarget::Text(t) => t.trim().to_string(),
            },
            cooldown: dur("cooldown", &sp.cooldown, DEFAULT_COOLDOWN)?,
            evaluation_interval: dur(
                "evaluationInterval",
                &sp.evaluation_interval,
                DEFAULT_EVALUATION_INTERVAL,
            )?
            .max(MIN_EVALUATION_INTERVAL),
            scale_up_window: dur(
                "scaleUpWindow",
                &sp.scale_up_window,
                DEFAULT_SCALE_UP_WINDOW,
            )?,
            scale_down_window: dur(
                "scaleDownWindow",
                &sp.scale_down_window,
                DEFAULT_SCALE_DOWN_WINDOW,
            )?,
            scale_down_threshold: threshold,
        })
    }

    /// The value under which the allocation scales down.
    pub fn scale_down_below(&self) -> f64 {
        self.target * self.scale_down_threshold
    }
}

/// A target as a number in the metric's base unit: a number, or text with `ms`, `us`
/// (`µs`), `s` (seconds) or `%` (a ratio), or a plain number.
pub fn parse_target(t: &ScaleTarget) -> Result<f64, String> {
    let v = match t {
        ScaleTarget::Number(n) => Some(*n),
        ScaleTarget::Text(s) => parse_target_text(s),
    };
    match v {
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "scalePolicy.target {} is not a number or a value with a unit (e.g. 0.8, \"80%\", \"100ms\", \"2s\"); not scaling",
            match t {
                ScaleTarget::Number(n) => n.to_string(),
                ScaleTarget::Text(s) => format!("{s:?}"),
            }
        )),
    }
}

fn parse_target_text(s: &str) -> Option<f64> {
    let s = s.trim();
    let num = |n: &str| -> Option<f64> {
        let n = n.trim();
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return None;
        }
        n.parse::<f64>().ok()
    };
    if let Some(n) = s.strip_suffix("ms") {
        num(n).map(|v| v / 1e3)
    } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        num(n).map(|v| v / 1e6)
    } else if let Some(n) = s.strip_suffix('s') {
        num(n)
    } else if let Some(n) = s.strip_suffix('%') {
        num(n).map(|v| v / 100.0)
    } else {
        num(s)
    }
}

/// How long the metric has been past the thresholds (kept in memory per allocation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Windows {
    /// Since when the value has been above the target.
    pub above_since: Option<DateTime<Utc>>,
    /// Since when the value has been below `target × scaleDownThreshold`.
    pub below_since: Option<DateTime<Utc>>,
}

impl Windows {
    /// Record the value read at `now`: a window starts when its condition starts to
    /// hold and restarts when it breaks.
    pub fn observe(&mut self, p: &Policy, value: f64, now: DateTime<Utc>) {
        if value > p.target {
            self.above_since.get_or_insert(now);
        } else {
            self.above_since = None;
        }
        if value < p.scale_down_below() {
            self.below_since.get_or_insert(now);
        } else {
            self.below_since = None;
        }
    }

    /// Forget both windows (after a failed query or a scale event).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Why no scaling happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// The value is within the band.
    Steady,
    /// Above or below, but not for long enough yet.
    Window,
    /// The last scale event is more recent than the cooldown.
    Cooldown,
    /// At `maxNodes`.
    AtMax,
    /// At `minNodes`.
    AtMin,
    /// The previous scale-up has not been placed by the scheduler yet.
    WaitingForPlacement,
    /// The fresh object forbids it (see [`scale_blocked`]).
    Blocked,
}

/// What the autoscaler does after one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing (the message is left alone).
    Hold(HoldReason),
    /// Ask the scheduler for one more node: `desiredNodes = desired`.
    ScaleUp {
        /// The new `desiredNodes`.
        desired: u32,
        /// The new `status.scale.message`.
        message: String,
    },
    /// Give back the last assigned nodes until `desired` remain (one node, or none when
    /// an unplaced scale-up is cancelled at `minNodes`): `desiredNodes = desired`.
    ScaleDown {
        /// The new `desiredNodes` (and the number of nodes kept).
        desired: u32,
        /// The new `status.scale.message`.
        message: String,
    },
}

/// Scale direction (oscillation tracking, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A node was asked for.
    Up,
    /// A node was given back (or a scale-up cancelled).
    Down,
}

impl Direction {
    /// `up` / `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

impl Decision {
    /// The direction of a scale event; `None` for [`Decision::Hold`].
    pub fn direction(&self) -> Option<Direction> {
        match self {
            Decision::Hold(_) => None,
            Decision::ScaleUp { .. } => Some(Direction::Up),
            Decision::ScaleDown { .. } => Some(Direction::Down),
        }
    }
}

/// The decision after the value `value` was read at `now` (with `windows` already
/// updated by [`Windows::observe`]) for an allocation with `assigned` nodes whose scale
/// state is `scale`. Pure: the caller applies it.
pub fn decide(
    p: &Policy,
    scale: &ScaleStatus,
    assigned: u32,
    windows: &Windows,
    value: f64,
    now: DateTime<Utc>,
) -> Decision {
    if let Some(last) = scale.last_scale_time {
        if elapsed(last, now) < p.cooldown {
            return Decision::Hold(HoldReason::Cooldown);
        }
    }
    if let Some(since) = windows.above_since {
        let held = elapsed(since, now);
        if held < p.scale_up_window {
            return Decision::Hold(HoldReason::Window);
        }
        if scale.desired_nodes > assigned {
            return Decision::Hold(HoldReason::WaitingForPlacement);
        }
        if assigned >= p.max_nodes || scale.desired_nodes >= p.max_nodes {
            return Decision::Hold(HoldReason::AtMax);
        }
        let desired = assigned + 1;
        return Decision::ScaleUp {
            desired,
            message: format!(
                "scaling up to {desired}: {}={} above target {} for {}",
                p.metric,
                fmt_value(value),
                p.target_text,
                fmt_duration(held)
            ),
        };
    }
    // A scale-up the scheduler has not placed yet is dropped once the value is no longer
    // above the target (the seed: a scale-up that cannot happen is a no-op, not a debt
    // paid hours later when quota frees up).
    if windows.above_since.is_none() && scale.desired_nodes > assigned {
        return Decision::ScaleDown {
            desired: assigned,
            message: format!(
                "scale-up to {} cancelled, staying at {assigned}: {}={} no longer above target {}",
                scale.desired_nodes,
                p.metric,
                fmt_value(value),
                p.target_text
            ),
        };
    }
    if let Some(since) = windows.below_since {
        let held = elapsed(since, now);
        if held < p.scale_down_window {
            return Decision::Hold(HoldReason::Window);
        }
        let why = format!(
            "{}={} below {} (target {} × {}) for {}",
            p.metric,
            fmt_value(value),
            fmt_value(p.scale_down_below()),
            p.target_text,
            fmt_value(p.scale_down_threshold),
            fmt_duration(held)
        );
        if assigned > p.min_nodes {
            let desired = assigned - 1;
            return Decision::ScaleDown {
                desired,
                message: format!("scaling down to {desired}: {why}"),
            };
        }
        if scale.desired_nodes > assigned {
            return Decision::ScaleDown {
                desired: assigned,
                message: format!(
                    "scale-up to {} cancelled, staying at {assigned}: {why}",
                    scale.desired_nodes
                ),
            };
        }
        return Decision::Hold(HoldReason::AtMin);
    }
    Decision::Hold(HoldReason::Steady)
}

/// Apply `d` to `status` (scale state initialised): the new `desiredNodes`, message and
/// `lastScaleTime`; a scale-down moves the last assigned nodes to `releasingNodes`.
pub fn apply(status: &mut AllocationStatus, d: &Decision, now: DateTime<Utc>) {
    let (desired, message) = match d {
        Decision::Hold(_) => return,
        Decision::ScaleUp { desired, message } | Decision::ScaleDown { desired, message } => {
            (*desired, message)
        }
    };
    if matches!(d, Decision::ScaleDown { .. }) {
        while status.assigned_nodes.len() > desired as usize {
            let Some(node) = status.assigned_nodes.pop() else {
                break;
            };
            if !status.releasing_nodes.contains(&node) {
                status.releasing_nodes.push(node);
            }
        }
    }
    let scale = status.scale.get_or_insert_with(Default::default);
    scale.desired_nodes = desired;
    scale.message = Some(message.clone());
    scale.last_scale_time = Some(now);
}

/// Record a successful query of `value` at `now` (resets the failure count).
pub fn record_success(scale: &mut ScaleStatus, value: f64, now: DateTime<Utc>) {
    scale.metric_failures = 0;
    scale.last_value = Some(value);
    scale.last_evaluation_time = Some(now);
}

/// Record a failed query; `true` when an alert is due (the 3rd consecutive failure and
/// every 10th after). No decision is made and nothing else changes.
pub fn record_failure(scale: &mut ScaleStatus) -> bool {
    scale.metric_failures = scale.metric_failures.saturating_add(1);
    failure_alert(scale.metric_failures)
}

/// Whether `failures` consecutive failures raise an alert.
pub fn failure_alert(failures: u32) -> bool {
    failures == FAILURE_ALERT_THRESHOLD
        || (failures > FAILURE_ALERT_THRESHOLD && failures.checked_rem(10) == Some(0))
}

/// Scale directions of one allocation, to detect oscillation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Oscillation {
    last: Option<Direction>,
    alternations: u32,
}

impl Oscillation {
    /// Record a scale event; `true` when directions have alternated more than
    /// [`OSCILLATION_ALERT_ALTERNATIONS`] times in a row.
    pub fn record(&mut self, d: Direction) -> bool {
        match self.last {
            Some(l) if l != d => self.alternations += 1,
            _ => self.alternations = 0,
        }
        self.last = Some(d);
        self.alternations > OSCILLATION_ALERT_ALTERNATIONS
    }

    /// Consecutive alternations so far.
    pub fn alternations(&self) -> u32 {
        self.alternations
    }
}

fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or(Duration::ZERO)
}

/// `90s` → `1m30s`, `120s` → `2m`, `3700s` → `1h1m40s`.
fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// A value with at most 3 decimals, no trailing zeros.
fn fmt_value(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------
// The controller
// ---------------------------------------------------------------------------------------

/// In-memory state of one allocation (lost on restart or leader change: the windows
/// then start over, which only delays a decision).
#[derive(Debug, Default)]
struct Memory {
    uid: Option<String>,
    attempt: u32,
    windows: Windows,
    oscillation: Oscillation,
    last_evaluation: Option<Instant>,
    evaluations_since_write: u32,
    /// The explanation [`explain`] wrote (written once per allocation run).
    explained: Option<String>,
}

struct Ctx {
    api: Api<Allocation>,
    /// Every allocation (to see the job steps running on a node before giving it back).
    store: lattice_runtime::reflector::Store<Allocation>,
    source: Option<Arc<dyn MetricSource>>,
    metrics: ControllerMetrics,
    memory: Mutex<HashMap<String, Memory>>,
}

fn key(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or_default())
}

impl Ctx {
    /// Run `f` on the memory of `a` (reset when the allocation was re-created or
    /// re-bound).
    fn with_memory<R>(&self, a: &Allocation, f: impl FnOnce(&mut Memory) -> R) -> R {
        let mut all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or(0);
        let uid = a.uid().map(str::to_string);
        let m = all.entry(key(a.namespace(), a.name_any())).or_default();
        if m.uid != uid || m.attempt != attempt {
            *m = Memory {
                uid,
                attempt,
                ..Default::default()
            };
        }
        f(m)
    }

    /// Whether anything is remembered for `a`.
    fn remembers(&self, a: &Allocation) -> bool {
        let all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        !all.is_empty() && all.contains_key(&key(a.namespace(), a.name_any()))
    }

    fn forget(&self, namespace: Option<&str>, name: &str) {
        let mut all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        all.remove(&key(namespace, name));
    }
}

/// Whether the autoscaler evaluates `a`: Running, reactive with a scale policy, not
/// deleting, no cancel requested.
pub fn evaluable(a: &Allocation) -> bool {
    a.phase() == AllocationPhase::Running
        && a.spec.lifecycle.type_ == LifecycleType::Reactive
        && a.spec.lifecycle.scale_policy.is_some()
        && !a.is_deleting()
        && !lifecycle::cancel_requested(a)
        // A preemption in progress cancels scaling (the seed's "Preemption During
        // Scale-Up"); its stop sequence (checkpoint signal first) is the agents'.
        && !lifecycle::preempt_requested(a)
}

/// Why a scale decision must wait on the fresh object, whatever the metric says: a node
/// failed in this attempt (a requeue or failure is under way; giving a node back now
/// would hide it), or — for a scale-down — the node to give back has not reported
/// Running yet (its agent may not know it has it) or runs a job step of the allocation
/// (`step_nodes`: the step would keep running on a released node).
pub fn scale_blocked(st: &AllocationStatus, d: &Decision, step_nodes: &[String]) -> Option<String> {
    let failed = st.assigned_nodes.iter().find(|n| {
        st.node_states
            .get(*n)
            .is_some_and(|r| r.attempt == st.attempt && r.phase == NodeTaskPhase::Failed)
    });
    if let Some(n) = failed {
        return Some(format!(
            "node {n} failed; no scaling until the allocation recovers"
        ));
    }
    let Decision::ScaleDown { desired, .. } = d else {
        return None;
    };
    for n in st.assigned_nodes.iter().skip(*desired as usize) {
        let running = st
            .node_states
            .get(n)
            .is_some_and(|r| r.attempt == st.attempt && r.phase == NodeTaskPhase::Running);
        if !running {
            return Some(format!(
                "scale-down waits: node {n} has not reported its process running yet"
            ));
        }
        if step_nodes.contains(n) {
            return Some(format!(
                "scale-down waits: a job step of the allocation runs on node {n}"
            ));
        }
    }
    None
}

/// `fresh` is still the object `seen` was (same uid and attempt) and still evaluable.
fn same_run(fresh: &Allocation, seen: &Allocation) -> bool {
    evaluable(fresh)
        && fresh.uid() == seen.uid()
        && fresh.status.as_ref().map(|s| s.attempt) == seen.status.as_ref().map(|s| s.attempt)
}

/// `status.scale`, initialised on first sight (`desiredNodes` = assigned nodes).
fn scale_of(st: &mut AllocationStatus) -> &mut ScaleStatus {
    let assigned = st.assigned_nodes.len() as u32;
    st.scale.get_or_insert_with(|| ScaleStatus {
        desired_nodes: assigned,
        ..Default::default()
    })
}

/// Register the autoscaler (always: without a metric source it only explains that it
/// does not scale).
pub fn register(
    host: &mut lattice_runtime::ControllerHost,
    config: AutoscalerConfig,
    metrics: ControllerMetrics,
) {
    host.register("autoscaler", move |hc: HostContext| {
        let source = config.metric_source.clone();
        let metrics = metrics.clone();
        async move {
            let controller = hc.controller::<Allocation>();
            let ctx = Arc::new(Ctx {
                api: Api::all(hc.client.clone()),
                store: controller.store(),
                source,
                metrics,
                memory: Mutex::new(HashMap::new()),
            });
            let forget = ctx.clone();
            let mine = ctx.clone();
            controller
                // Only reactive allocations with a scale policy are ever evaluated;
                // the rest of a busy kind need not wake this controller. One it still
                // remembers comes in, so that its memory is dropped.
                .filter(move |a: &Allocation| {
                    (a.spec.lifecycle.type_ == LifecycleType::Reactive
                        && a.spec.lifecycle.scale_policy.is_some())
                        || mine.remembers(a)
                })
                .on_deleted(move |r: ObjectRef| {
                    forget.forget(r.namespace.as_deref(), &r.name);
                    async {}
                })
                .run(reconcile, ctx)
                .await;
        }
    });
}

async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, lattice_runtime::Error> {
    if !evaluable(&a) {
        ctx.forget(a.namespace(), a.name_any());
        return Ok(Action::await_change());
    }
    let Some(sp) = a.spec.lifecycle.scale_policy.as_ref() else {
        return Ok(Action::await_change());
    };
    let api = ctx.api.for_obj(&a);
    let Some(source) = ctx.source.clone() else {
        return explain(&ctx, &api, &a, NO_SOURCE_MESSAGE).await;
    };
    let policy = match Policy::from_spec(sp) {
        Ok(p) => p,
        Err(msg) => return explain(&ctx, &api, &a, &msg).await,
    };

    // Evaluate at most once per interval, whatever else triggers a reconcile.
    let wait = ctx.with_memory(&a, |m| {
        m.explained = None;
        m.last_evaluation.and_then(|t| {
            let since = t.elapsed();
            (since < policy.evaluation_interval).then(|| policy.evaluation_interval - since)
        })
    });
    if let Some(wait) = wait {
        return Ok(Action::requeue(wait));
    }

    let queried = tokio::time::timeout(QUERY_DEADLINE, source.query(&a, &policy.metric))
        .await
        .unwrap_or_else(|_| Err(format!("the query took longer than {QUERY_DEADLINE:?}")));
    let now = Utc::now();
    let stamp = now_truncated();
    let requeue = Action::requeue(policy.evaluation_interval);

    let value = match queried {
        Ok(v) => v,
        Err(err) => {
            ctx.metrics.autoscaling_metric_query_failures.inc();
            ctx.with_memory(&a, |m| {
                m.last_evaluation = Some(Instant::now());
                // Never scale on a window that spans an outage.
                m.windows.reset();
            });
            let mut failures = 0;
            let mut alert = false;
            api.update_status_with_retry(a.name_any(), 5, |cur| {
                if !same_run(cur, &a) {
                    return false;
                }
                let scale = scale_of(cur.status.get_or_insert_with(Default::default));
                alert = record_failure(scale);
                failures = scale.metric_failures;
                true
            })
            .await?;
            ctx.with_memory(&a, |m| m.evaluations_since_write = 0);
            if failures > 0 {
                warn!(
                    allocation = %a.object_ref(), metric = %policy.metric, failures, error = %err,
                    "autoscaling: metric query failed; skipping this evaluation (no scaling without a value)"
                );
            }
            if alert {
                error!(
                    allocation = %a.object_ref(), metric = %policy.metric, failures, error = %err,
                    "alert: autoscaling metric query failed {failures} times in a row; the allocation stays at its current size (lattice_autoscaling_metric_query_failures_total)"
                );
            }
            return Ok(requeue);
        }
    };

    let (windows, write_due) = ctx.with_memory(&a, |m| {
        m.last_evaluation = Some(Instant::now());
        m.windows.observe(&policy, value, now);
        m.evaluations_since_write += 1;
        (
            m.windows,
            m.evaluations_since_write >= WRITE_EVERY_EVALUATIONS,
        )
    });

    // Nodes running a live job step of this allocation (never given back under it).
    let step_nodes: Vec<String> = ctx
        .store
        .find(|s| {
            s.spec.step_of.as_deref() == a.metadata.name.as_deref()
                && s.namespace() == a.namespace()
                && !s.phase().is_terminal()
        })
        .iter()
        .filter_map(|s| s.status.as_ref())
        .flat_map(|st| st.assigned_nodes.iter().cloned())
        .collect();
    let mut decided: Option<Decision> = None;
    let mut wrote = false;
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        decided = None;
        wrote = false;
        if !same_run(cur, &a) {
            return false;
        }
        let st = cur.status.get_or_insert_with(Default::default);
        let first_sight = st.scale.is_none();
        let before = st.scale.clone().unwrap_or_default();
        let releasing_before = st.releasing_nodes.len();
        record_success(scale_of(st), value, stamp);
        let assigned = st.assigned_nodes.len() as u32;
        let mut d = decide(
            &policy,
            st.scale.as_ref().expect("initialised"),
            assigned,
            &windows,
            value,
            now,
        );
        if let Some(why) = scale_blocked(st, &d, &step_nodes) {
            if d.direction().is_some() {
                debug!(allocation = %a.object_ref(), %why, "autoscaling: decision held");
            }
            d = Decision::Hold(HoldReason::Blocked);
        }
        apply(st, &d, stamp);
        let after = st.scale.as_ref().expect("initialised");
        let changed = first_sight
            || after.last_value != before.last_value
            || after.metric_failures != before.metric_failures
            || after.desired_nodes != before.desired_nodes
            || after.message != before.message
            || st.releasing_nodes.len() != releasing_before
            || before.last_evaluation_time.is_none();
        decided = Some(d);
        wrote = changed || write_due;
        wrote
    })
    .await?;

    if wrote {
        ctx.with_memory(&a, |m| m.evaluations_since_write = 0);
    }
    match decided {
        Some(d @ (Decision::ScaleUp { .. } | Decision::ScaleDown { .. })) => {
            let dir = d.direction().expect("a scale event");
            let oscillating = ctx.with_memory(&a, |m| {
                m.windows.reset();
                m.oscillation.record(dir)
            });
            ctx.metrics.record_scale_event(dir.as_str());
            if let Decision::ScaleUp { message, .. } | Decision::ScaleDown { message, .. } = &d {
                info!(allocation = %a.object_ref(), direction = dir.as_str(), "{message}");
            }
            if oscillating {
                ctx.metrics.autoscaling_oscillation_alerts.inc();
                warn!(
                    allocation = %a.object_ref(), metric = %policy.metric,
                    cooldown = ?policy.cooldown, target = %policy.target_text,
                    "alert: autoscaling oscillates (scale directions alternated more than {OSCILLATION_ALERT_ALTERNATIONS} times in a row); raise scalePolicy.cooldown or adjust the target"
                );
            }
        }
        Some(Decision::Hold(reason)) => {
            debug!(allocation = %a.object_ref(), value, ?reason, "autoscaling: no change");
        }
        None => {}
    }
    Ok(requeue)
}

/// Write `message` into `status.scale.message` once (initialising the scale state), and
/// wait for a change.
async fn explain(
    ctx: &Ctx,
    api: &Api<Allocation>,
    a: &Allocation,
    message: &str,
) -> Result<Action, lattice_runtime::Error> {
    let done = ctx.with_memory(a, |m| m.explained.as_deref() == Some(message));
    let current = a
        .status
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .and_then(|s| s.message.as_deref());
    if done || current == Some(message) {
        ctx.with_memory(a, |m| m.explained = Some(message.to_string()));
        return Ok(Action::await_change());
    }
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        if !same_run(cur, a) {
            return false;
        }
        let scale = scale_of(cur.status.get_or_insert_with(Default::default));
        if scale.message.as_deref() == Some(message) {
            return false;
        }
        scale.message = Some(message.to_string());
        true
    })
    .await?;
    ctx.with_memory(a, |m| m.explained = Some(message.to_string()));
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-03-05T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn at(secs: i64) -> DateTime<Utc> {
        t0() + TimeDelta::seconds(secs)
    }

    fn spec() -> ScalePolicy {
        ScalePolicy {
            min_nodes: 1,
            max_nodes: 4,
            metric: "gpu_utilization".into(),
            target: ScaleTarget::Number(0.8),
            ..Default::default()
        }
    }

    fn policy() -> Policy {
        Policy::from_spec(&spec()).unwrap()
    }

    fn scale(desired: u32) -> ScaleStatus {
        ScaleStatus {
            desired_nodes: desired,
            ..Default::default()
        }
    }

    /// Feed `values` every 60 s from t0 and return the decision after the last one.
    fn run(p: &Policy, s: &ScaleStatus, assigned: u32, values: &[f64]) -> Decision {
        let mut w = Windows::default();
        let mut d = Decision::Hold(HoldReason::Steady);
        for (i, v) in values.iter().enumerate() {
            let now = at(60 * i as i64);
            w.observe(p, *v, now);
            d = decide(p, s, assigned, &w, *v, now);
        }
        d
    }

    #[test]
    fn autoscaler_policy_defaults() {
        let p = policy();
        assert_eq!(p.cooldown, Duration::from_secs(180));
        assert_eq!(p.evaluation_interval, Duration::from_secs(60));
        assert_eq!(p.scale_up_window, Duration::from_secs(120));
        assert_eq!(p.scale_down_window, Duration::from_secs(300));
        assert_eq!(p.scale_down_threshold, 0.5);
        assert!((p.scale_down_below() - 0.4).abs() < 1e-12);
        let mut sp = spec();
        sp.evaluation_interval = Some("0s".into());
        sp.cooldown = Some("5m".into());
        let p = Policy::from_spec(&sp).unwrap();
        assert_eq!(p.evaluation_interval, Duration::from_secs(1));
        assert_eq!(p.cooldown, Duration::from_secs(300));
        sp.cooldown = Some("soon".into());
        assert!(Policy::from_spec(&sp)
            .unwrap_err()
            .contains("scalePolicy.cooldown"));
    }

    #[test]
    fn autoscaler_scale_up_needs_the_whole_window() {
        let p = policy();
        // Above at 0, 60 s: held for 60 s < 2m.
        assert_eq!(
            run(&p, &scale(2), 2, &[0.9, 0.95]),
            Decision::Hold(HoldReason::Window)
        );
        // Above at 0, 60, 120 s: held for 2m.
        match run(&p, &scale(2), 2, &[0.9, 0.95, 0.93]) {
            Decision::ScaleUp { desired, message } => {
                assert_eq!(desired, 3);
                assert_eq!(
                    message,
                    "scaling up to 3: gpu_utilization=0.93 above target 0.8 for 2m"
                );
            }
            d => panic!("expected a scale-up, got {d:?}"),
        }
        // A dip to the target (not above) restarts the window.
        assert_eq!(
            run(&p, &scale(2), 2, &[0.9, 0.8, 0.9, 0.9]),
            Decision::Hold(HoldReason::Window)
        );
        assert!(matches!(
            run(&p, &scale(2), 2, &[0.9, 0.8, 0.9, 0.9, 0.9]),
            Decision::ScaleUp { desired: 3, .. }
        ));
        // In the band: nothing.
        assert_eq!(
            run(&p, &scale(2), 2, &[0.5; 10]),
            Decision::Hold(HoldReason::Steady)
        );
    }

    #[test]
    fn autoscaler_scale_down_needs_the_whole_window_and_releases_the_last_node() {
        let p = policy();
        // Below 0.4 for 4m < 5m.
        assert_eq!(
            run(&p, &scale(3), 3, &[0.1; 5]),
            Decision::Hold(HoldReason::Window)
        );
        // 0.5 is below the target but not below target × 0.5: no scale-down window.
        assert_eq!(
            run(&p, &scale(3), 3, &[0.5; 10]),
            Decision::Hold(HoldReason::Steady)
        );
        // A value above 0.4 restarts it.
        assert_eq!(
            run(
                &p,
                &scale(3),
                3,
                &[0.1, 0.1, 0.1, 0.5, 0.1, 0.1, 0.1, 0.1, 0.1]
            ),
            Decision::Hold(HoldReason::Window)
        );
        let d = run(&p, &scale(3), 3, &[0.1; 6]);
        match &d {
            Decision::ScaleDown { desired, message } => {
                assert_eq!(*desired, 2);
                assert_eq!(
                    message,
                    "scaling down to 2: gpu_utilization=0.1 below 0.4 (target 0.8 × 0.5) for 5m"
                );
            }
            d => panic!("expected a scale-down, got {d:?}"),
        }
        let mut st = AllocationStatus {
            assigned_nodes: vec!["n1".into(), "n2".into(), "n3".into()],
            releasing_nodes: vec!["n0".into()],
            scale: Some(scale(3)),
            ..Default::default()
        };
        apply(&mut st, &d, at(300));
        assert_eq!(st.assigned_nodes, ["n1", "n2"]);
        assert_eq!(st.releasing_nodes, ["n0", "n3"]);
        let s = st.scale.unwrap();
        assert_eq!(s.desired_nodes, 2);
        assert_eq!(s.last_scale_time, Some(at(300)));
        assert!(s.message.unwrap().starts_with("scaling down to 2"));
    }

    #[test]
    fn autoscaler_cooldown_blocks_both_directions() {
        let p = policy();
        let mut s = scale(2);
        s.last_scale_time = Some(at(-60));
        // The up window is complete at 120 s, but the last scale was at -60 s: 180 s of
        // cooldown end at 120 s exactly.
        assert_eq!(
            run(&p, &s, 2, &[0.9, 0.9]),
            Decision::Hold(HoldReason::Cooldown)
        );
        assert!(matches!(
            run(&p, &s, 2, &[0.9, 0.9, 0.9]),
            Decision::ScaleUp { desired: 3, .. }
        ));
        s.last_scale_time = Some(at(200));
        assert_eq!(
            run(&p, &s, 2, &[0.1; 6]),
            Decision::Hold(HoldReason::Cooldown)
        );
        assert_eq!(
            run(&p, &s, 2, &[0.9; 4]),
            Decision::Hold(HoldReason::Cooldown)
        );
        // The cooldown ends at 380 s: the value at 360 s still waits, the one at 420 s not.
        assert_eq!(
            run(&p, &s, 2, &[0.1; 7]),
            Decision::Hold(HoldReason::Cooldown)
        );
        assert!(matches!(
            run(&p, &s, 2, &[0.1; 8]),
            Decision::ScaleDown { desired: 1, .. }
        ));
    }

    #[test]
    fn autoscaler_respects_min_and_max() {
        let p = policy();
        assert_eq!(
            run(&p, &scale(4), 4, &[0.99; 5]),
            Decision::Hold(HoldReason::AtMax)
        );
        assert!(matches!(
            run(&p, &scale(3), 3, &[0.99; 5]),
            Decision::ScaleUp { desired: 4, .. }
        ));
        assert_eq!(
            run(&p, &scale(1), 1, &[0.0; 10]),
            Decision::Hold(HoldReason::AtMin)
        );
        assert!(matches!(
            run(&p, &scale(2), 2, &[0.0; 10]),
            Decision::ScaleDown { desired: 1, .. }
        ));
    }

    #[test]
    fn autoscaler_waits_for_the_previous_scale_up_to_be_placed() {
        let p = policy();
        // desired 3, but the scheduler has placed only 2 so far.
        assert_eq!(
            run(&p, &scale(3), 2, &[0.99; 5]),
            Decision::Hold(HoldReason::WaitingForPlacement)
        );
        // Once placed, the next one.
        assert!(matches!(
            run(&p, &scale(3), 3, &[0.99; 5]),
            Decision::ScaleUp { desired: 4, .. }
        ));
        // Once the value is no longer above the target an unplaced scale-up is dropped
        // first (nothing is released; the next decision may then scale down) ...
        let d = run(&p, &scale(3), 2, &[0.5; 10]);
        assert!(
            matches!(&d, Decision::ScaleDown { desired: 2, message } if message.starts_with("scale-up to 3 cancelled")),
            "{d:?}"
        );
        let d = run(&p, &scale(3), 2, &[0.0; 10]);
        assert!(matches!(d, Decision::ScaleDown { desired: 2, .. }), "{d:?}");
        // ... at minNodes the unplaced scale-up is cancelled, nothing is released.
        let d = run(&p, &scale(2), 1, &[0.0; 10]);
        match &d {
            Decision::ScaleDown {
                desired: 1,
                message,
            } => {
                assert!(message.starts_with("scale-up to 2 cancelled"), "{message}")
            }
            d => panic!("{d:?}"),
        }
        let mut st = AllocationStatus {
            assigned_nodes: vec!["n1".into()],
            scale: Some(scale(2)),
            ..Default::default()
        };
        apply(&mut st, &d, at(600));
        assert_eq!(st.assigned_nodes, ["n1"]);
        assert!(st.releasing_nodes.is_empty());
        assert_eq!(st.scale.unwrap().desired_nodes, 1);
    }

    #[test]
    fn autoscaler_hold_leaves_the_status_alone() {
        let mut st = AllocationStatus {
            assigned_nodes: vec!["n1".into(), "n2".into()],
            scale: Some(ScaleStatus {
                desired_nodes: 3,
                message: Some("scale-up waits: tenant quota".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let before = st.clone();
        apply(
            &mut st,
            &Decision::Hold(HoldReason::WaitingForPlacement),
            at(0),
        );
        assert_eq!(st, before);
    }

    #[test]
    fn autoscaler_text_targets() {
        let num = |s: &str| parse_target(&ScaleTarget::Text(s.into()));
        assert_eq!(num("100ms").unwrap(), 0.1);
        assert_eq!(num("2s").unwrap(), 2.0);
        assert_eq!(num("1.5s").unwrap(), 1.5);
        assert_eq!(num("250us").unwrap(), 0.00025);
        assert_eq!(num("80%").unwrap(), 0.8);
        assert_eq!(num(" 0.8 ").unwrap(), 0.8);
        assert_eq!(num("100").unwrap(), 100.0);
        for bad in ["fast", "", "ms", "-1", "1e3", "10 apples", "NaN", "inf"] {
            let e = num(bad).unwrap_err();
            assert!(e.contains("not scaling"), "{bad}: {e}");
        }
        assert!(parse_target(&ScaleTarget::Number(f64::NAN)).is_err());
        assert_eq!(parse_target(&ScaleTarget::Number(0.8)).unwrap(), 0.8);

        // A latency target in ms compares with a metric in seconds.
        let mut sp = spec();
        sp.metric = "request_latency_p99".into();
        sp.target = ScaleTarget::Text("100ms".into());
        let p = Policy::from_spec(&sp).unwrap();
        match run(&p, &scale(2), 2, &[0.25, 0.25, 0.25]) {
            Decision::ScaleUp { message, .. } => assert_eq!(
                message,
                "scaling up to 3: request_latency_p99=0.25 above target 100ms for 2m"
            ),
            d => panic!("{d:?}"),
        }
        assert_eq!(
            run(&p, &scale(2), 2, &[0.09; 3]),
            Decision::Hold(HoldReason::Steady)
        );
        sp.target = ScaleTarget::Text("quick".into());
        let e = Policy::from_spec(&sp).unwrap_err();
        assert!(e.contains("\"quick\"") && e.contains("not scaling"), "{e}");
    }

    #[test]
    fn autoscaler_failures_count_reset_and_alert() {
        let mut s = scale(2);
        s.last_value = Some(0.5);
        let alerts: Vec<bool> = (0..12).map(|_| record_failure(&mut s)).collect();
        assert_eq!(s.metric_failures, 12);
        assert_eq!(
            alerts,
            [false, false, true, false, false, false, false, false, false, true, false, false]
        );
        // A failure changes nothing else.
        assert_eq!(s.desired_nodes, 2);
        assert_eq!(s.last_value, Some(0.5));
        assert_eq!(s.last_scale_time, None);
        record_success(&mut s, 0.7, at(5));
        assert_eq!(s.metric_failures, 0);
        assert_eq!(s.last_value, Some(0.7));
        assert_eq!(s.last_evaluation_time, Some(at(5)));
        assert!(failure_alert(20) && !failure_alert(21) && !failure_alert(2));
    }

    #[test]
    fn autoscaler_windows_restart_after_a_reset() {
        let p = policy();
        let mut w = Windows::default();
        w.observe(&p, 0.9, at(0));
        w.observe(&p, 0.9, at(60));
        assert_eq!(w.above_since, Some(at(0)));
        assert_eq!(w.below_since, None);
        w.reset(); // e.g. a failed query in between
        w.observe(&p, 0.9, at(120));
        assert_eq!(w.above_since, Some(at(120)));
        assert_eq!(
            decide(&p, &scale(2), 2, &w, 0.9, at(120)),
            Decision::Hold(HoldReason::Window)
        );
        w.observe(&p, 0.1, at(180));
        assert_eq!(w.above_since, None);
        assert_eq!(w.below_since, Some(at(180)));
    }

    #[test]
    fn autoscaler_oscillation_alert() {
        let mut o = Oscillation::default();
        assert!(!o.record(Direction::Up));
        assert!(!o.record(Direction::Up));
        let mut alerts = Vec::new();
        for i in 0..7 {
            let d = if i % 2 == 0 {
                Direction::Down
            } else {
                Direction::Up
            };
            alerts.push(o.record(d));
        }
        // Alternations 1..=7: more than 5 from the 6th on.
        assert_eq!(alerts, [false, false, false, false, false, true, true]);
        // The same direction twice breaks the run.
        assert!(!o.record(Direction::Down));
        assert_eq!(o.alternations(), 0);
    }

    #[test]
    fn autoscaler_promql() {
        let a = Allocation::new("svc", "ml-team", Default::default());
        assert_eq!(
            PrometheusSource::promql(&a, "gpu_utilization").unwrap(),
            "avg(gpu_utilization{lattice_allocation=\"svc\",lattice_tenant=\"ml-team\"})"
        );
        // Matchers of the policy are kept; the allocation's scope is always added.
        assert_eq!(
            PrometheusSource::promql(&a, "custom_metric{job='my-inference'}").unwrap(),
            "avg(custom_metric{job=\"my-inference\",lattice_allocation=\"svc\",lattice_tenant=\"ml-team\"})"
        );
        // No free-form PromQL: another tenant's series are out of reach.
        assert!(PrometheusSource::promql(&a, "rate(requests_total[1m])").is_err());
        assert!(PrometheusSource::promql(&a, "a + b").is_err());
        assert!(PrometheusSource::promql(&a, "x{lattice_tenant=\"other\"}").is_err());
    }

    #[test]
    fn autoscaler_prometheus_response_parsing() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1767225600.123,"0.93"]}]}}"#;
        assert_eq!(parse_prometheus_response(ok, "q").unwrap(), 0.93);
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(
            parse_prometheus_response(empty, "avg(x)").unwrap_err(),
            "no samples for avg(x)"
        );
        let scalar =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1767225600,"2"]}}"#;
        assert_eq!(parse_prometheus_response(scalar, "q").unwrap(), 2.0);
        let nan = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#;
        assert!(parse_prometheus_response(nan, "q").is_err());
        let err = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#;
        let e = parse_prometheus_response(err, "q").unwrap_err();
        assert!(e.contains("bad_data") && e.contains("parse error"), "{e}");
        assert!(parse_prometheus_response("<html>", "q").is_err());
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_prometheus_response(matrix, "q").is_err());
    }

    #[test]
    fn autoscaler_formatting() {
        assert_eq!(fmt_duration(Duration::from_secs(0)), "0s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1s");
        assert_eq!(fmt_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
        assert_eq!(fmt_duration(Duration::from_secs(3700)), "1h1m40s");
        assert_eq!(fmt_value(0.1 + 0.2), "0.3");
        assert_eq!(fmt_value(0.93), "0.93");
        assert_eq!(fmt_value(3.0), "3");
        assert_eq!(fmt_value(0.0001), "0");
    }

    #[test]
    fn autoscaler_config_is_debug_without_a_source() {
        assert!(format!("{:?}", AutoscalerConfig::default()).contains("None"));
        assert!(PrometheusSource::new("prometheus:9090").is_err());
        let p = PrometheusSource::new("http://prom:9090/").unwrap();
        assert_eq!(p.base_url(), "http://prom:9090");
    }
}
