//! The pure decision: a policy, the metric's windows and the cooldown in, a
//! [`Decision`] out (no clock, no I/O).

#[allow(unused_imports)]
use super::*;

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
pub(super) fn fmt_duration(d: Duration) -> String {
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
pub(super) fn fmt_value(v: f64) -> String {
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
