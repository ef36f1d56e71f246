//! Replay report: utilization, waits per priority class, bounded slowdown, fairness.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use super::engine::{SimResult, Workload};
use crate::model::TenantId;

/// Bounded-slowdown threshold τ (seconds).
pub const TAU_S: f64 = 10.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitStats {
    pub jobs: usize,
    pub p50_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub policy: String,
    pub jobs: usize,
    /// Jobs that never started (unsatisfiable requests).
    pub unscheduled: usize,
    pub utilization: f64,
    pub avg_wait_s: f64,
    /// 95th percentile of all jobs' waits (nearest rank).
    pub p95_wait_s: f64,
    /// The longest any job waited (starvation shows here first).
    pub max_wait_s: f64,
    /// How far the start a job was first told to expect (its first reservation) was from
    /// when it started: median and mean of the absolute error, over jobs that were told.
    pub expected_start_error_p50_s: f64,
    pub expected_start_error_mean_s: f64,
    pub avg_bounded_slowdown: f64,
    pub wait_by_class: BTreeMap<u8, WaitStats>,
    /// Jain's index over tenants' actual/target share ratios (the seed's "actual share
    /// vs. target share per tenant"; shares as for `max_share_deviation`). 1 = every
    /// tenant got exactly its target.
    pub jain_index: f64,
    /// Jain's index over tenants' mean bounded slowdowns (1 = every tenant waited alike
    /// relative to its job lengths).
    pub slowdown_jain_index: f64,
    /// max |contended share − target share| over tenants (see README).
    pub max_share_deviation: f64,
    pub backfilled: u64,
    pub preemptions: u64,
    pub makespan_s: i64,
    pub cycles: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // Nearest-rank percentile.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Jain's fairness index (Σx)² / (n·Σx²); 1 for an empty or all-zero input.
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let s2: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || s2 == 0.0 {
        1.0
    } else {
        s * s / (xs.len() as f64 * s2)
    }
}

impl Report {
    pub fn new(policy: &str, w: &Workload, r: &SimResult) -> Report {
        let mut waits = Vec::new();
        let mut by_class: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
        let mut bsld_sum = 0.0;
        let mut per_tenant: BTreeMap<TenantId, (f64, usize)> = BTreeMap::new();
        let mut unscheduled = 0;
        let mut first_submit = i64::MAX;
        let mut last_end = i64::MIN;
        let mut work = 0.0;
        for o in &r.outcomes {
            let j = &w.jobs[o.job];
            first_submit = first_submit.min(j.submit);
            let (Some(start), Some(end)) = (o.first_start, o.end) else {
                unscheduled += 1;
                continue;
            };
            last_end = last_end.max(end);
            work += f64::from(j.nodes) * j.runtime.max(0) as f64;
            let wait = (start - j.submit) as f64;
            let run = j.runtime.max(0) as f64;
            let response = (end - j.submit) as f64;
            let bsld = (response / run.max(TAU_S)).max(1.0);
            bsld_sum += bsld;
            waits.push(wait);
            by_class.entry(j.class).or_default().push(wait);
            let e = per_tenant.entry(j.tenant).or_default();
            e.0 += bsld;
            e.1 += 1;
        }
        let done = waits.len();
        let makespan = if done > 0 { last_end - first_submit } else { 0 };
        let capacity = w.nodes.len() as f64 * makespan as f64;
        let wait_by_class = by_class
            .into_iter()
            .map(|(c, mut v)| {
                v.sort_by(f64::total_cmp);
                (
                    c,
                    WaitStats {
                        jobs: v.len(),
                        p50_s: percentile(&v, 50.0),
                        p95_s: percentile(&v, 95.0),
                        p99_s: percentile(&v, 99.0),
                    },
                )
            })
            .collect();
        let tenant_bsld: Vec<f64> = per_tenant.values().map(|(s, n)| s / *n as f64).collect();
        let mut told: Vec<f64> = r
            .outcomes
            .iter()
            .filter_map(|o| Some((o.first_expected? - o.first_start?).abs() as f64))
            .collect();
        told.sort_by(f64::total_cmp);
        let mut sorted_waits = waits.clone();
        sorted_waits.sort_by(f64::total_cmp);
        Report {
            policy: policy.to_string(),
            jobs: done,
            unscheduled,
            utilization: if capacity > 0.0 { work / capacity } else { 0.0 },
            avg_wait_s: if done > 0 {
                waits.iter().sum::<f64>() / done as f64
            } else {
                0.0
            },
            p95_wait_s: percentile(&sorted_waits, 95.0),
            max_wait_s: sorted_waits.last().copied().unwrap_or(0.0),
            expected_start_error_p50_s: percentile(&told, 50.0),
            expected_start_error_mean_s: if told.is_empty() {
                0.0
            } else {
                told.iter().sum::<f64>() / told.len() as f64
            },
            avg_bounded_slowdown: if done > 0 {
                bsld_sum / done as f64
            } else {
                0.0
            },
            wait_by_class,
            jain_index: jain(&share_ratios(w, &r.contended_node_seconds)),
            slowdown_jain_index: jain(&tenant_bsld),
            max_share_deviation: share_deviation(w, &r.contended_node_seconds),
            backfilled: r.backfills,
            preemptions: r.preemptions,
            makespan_s: makespan,
            cycles: r.cycles,
        }
    }

    /// The report as (label, value) rows, in the order `to_text` prints them.
    fn rows(&self) -> Vec<(String, String)> {
        let mut r = vec![
            ("policy".to_string(), self.policy.clone()),
            (
                "jobs".into(),
                format!("{} (unscheduled {})", self.jobs, self.unscheduled),
            ),
            ("utilization".into(), format!("{:.4}", self.utilization)),
            ("avg wait (s)".into(), format!("{:.1}", self.avg_wait_s)),
            ("wait p95 (s)".into(), format!("{:.0}", self.p95_wait_s)),
            ("longest wait (s)".into(), format!("{:.0}", self.max_wait_s)),
            (
                "start estimate err (s)".into(),
                format!("{:.0}", self.expected_start_error_p50_s),
            ),
            (
                "avg bounded slowdown".into(),
                format!("{:.4}", self.avg_bounded_slowdown),
            ),
        ];
        for (c, w) in &self.wait_by_class {
            r.push((format!("wait class {c} (n)"), w.jobs.to_string()));
            for (q, v) in [("p50", w.p50_s), ("p95", w.p95_s), ("p99", w.p99_s)] {
                r.push((format!("wait class {c} {q} (s)"), format!("{v:.0}")));
            }
        }
        r.extend([
            (
                "jain index (shares)".into(),
                format!("{:.4}", self.jain_index),
            ),
            (
                "jain index (slowdown)".into(),
                format!("{:.4}", self.slowdown_jain_index),
            ),
            (
                "max share deviation".into(),
                format!("{:.4}", self.max_share_deviation),
            ),
            ("backfilled".into(), self.backfilled.to_string()),
            ("preemptions".into(), self.preemptions.to_string()),
            ("makespan (s)".into(), self.makespan_s.to_string()),
        ]);
        r
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (label, value) in self.rows() {
            let _ = writeln!(s, "{label:<22} {value}");
        }
        s
    }

    /// Two reports side by side (`rm-replay --compare`): one row per figure, a column per
    /// policy; a figure only one report has (a priority class the other never saw) shows
    /// `-` for the other.
    pub fn side_by_side(a: &Report, b: &Report) -> String {
        let (ra, rb) = (a.rows(), b.rows());
        let mut labels: Vec<&String> = ra.iter().map(|(l, _)| l).collect();
        for (l, _) in &rb {
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        let value = |rows: &[(String, String)], l: &str| {
            rows.iter()
                .find(|(x, _)| x == l)
                .map_or("-".to_string(), |(_, v)| v.clone())
        };
        let width = ra
            .iter()
            .chain(&rb)
            .map(|(_, v)| v.len())
            .max()
            .unwrap_or(0)
            .max(12);
        let mut s = String::new();
        for l in labels {
            let _ = writeln!(s, "{l:<22} {:<width$}  {}", value(&ra, l), value(&rb, l));
        }
        s
    }
}

/// Shares are measured only while the queue is non-empty (when the scheduler had a choice).
/// Targets are the tenants' `target_share`s, renormalised over tenants that ran work; without
/// targets every such tenant's target is an equal share.
fn share_deviation(w: &Workload, contended: &HashMap<TenantId, f64>) -> f64 {
    shares(w, contended)
        .into_iter()
        .map(|(actual, target)| (actual - target).abs())
        .fold(0.0, f64::max)
}

/// actual / target share per tenant (the inputs of the share Jain index).
fn share_ratios(w: &Workload, contended: &HashMap<TenantId, f64>) -> Vec<f64> {
    shares(w, contended)
        .into_iter()
        .filter(|(_, target)| *target > 0.0)
        .map(|(actual, target)| actual / target)
        .collect()
}

/// (actual, target) share per tenant that ran work while others waited, by tenant id.
fn shares(w: &Workload, contended: &HashMap<TenantId, f64>) -> Vec<(f64, f64)> {
    let total: f64 = contended.values().sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let mut ids: Vec<TenantId> = contended.keys().copied().collect();
    ids.sort_unstable();
    let target_of = |id: TenantId| {
        w.tenants
            .iter()
            .find(|t| t.id == id)
            .map_or(0.0, |t| t.quota.target_share)
    };
    let target_sum: f64 = ids.iter().map(|&i| target_of(i)).sum();
    ids.iter()
        .map(|&i| {
            let actual = contended.get(&i).copied().unwrap_or(0.0) / total;
            let target = if target_sum > 0.0 {
                target_of(i) / target_sum
            } else {
                1.0 / ids.len() as f64
            };
            (actual, target)
        })
        .collect()
}
