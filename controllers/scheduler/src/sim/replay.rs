//! The `rm-replay` driver: load a trace, pick a policy, run, report.

use serde::Serialize;

use super::engine::{simulate, Workload};
use super::metrics::Report;
use super::numpy_rng::NumpyRandomState;
use super::swf::{self, EstimateField, SizeField, SwfOptions};
use super::{jsonl, TraceError};
use crate::profile::SchedulerConfig;

/// The policies `rm-replay` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Fcfs,
    Easy,
    /// EASY on predicted runtimes, shortest predicted first (Tsafrir et al.).
    EasyPlusPlus,
    Conservative,
    /// The vCluster scheduler (hpc-backfill by default, or a YAML profile).
    Lattice,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Policy::Fcfs),
            "easy" => Ok(Policy::Easy),
            "easy++" => Ok(Policy::EasyPlusPlus),
            "conservative" => Ok(Policy::Conservative),
            "lattice" | "hpc-backfill" => Ok(Policy::Lattice),
            other => Err(format!(
                "unknown policy {other:?} (fcfs, easy, easy++, conservative, lattice)"
            )),
        }
    }
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fcfs => "fcfs",
            Policy::Easy => "easy",
            Policy::EasyPlusPlus => "easy++",
            Policy::Conservative => "conservative",
            Policy::Lattice => "lattice",
        }
    }
    pub fn config(self, lattice: &SchedulerConfig) -> SchedulerConfig {
        match self {
            Policy::Fcfs => SchedulerConfig::fcfs(),
            Policy::Easy => SchedulerConfig::backfill(1),
            Policy::EasyPlusPlus => SchedulerConfig::easy_plus_plus(),
            Policy::Conservative => SchedulerConfig::backfill(usize::MAX),
            Policy::Lattice => lattice.clone(),
        }
    }
}

/// Load a YAML `SchedulerConfig` (any subset of fields; the rest are hpc-backfill defaults).
pub fn load_profile(path: &str) -> Result<SchedulerConfig, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_string(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|e| TraceError::Parse {
        path: path.to_string(),
        line: e.location().map_or(0, |l| l.line()),
        message: e.to_string(),
    })
}

#[derive(Debug, Clone)]
pub struct TraceOptions {
    pub swf: SwfOptions,
}

/// Load SWF (`.swf`, `.swf.gz`) or JSON lines (anything else). Returns the workload and the
/// number of dropped SWF records.
pub fn load_trace(path: &str, opts: &TraceOptions) -> Result<(Workload, usize), TraceError> {
    if let Some(spec) = path.strip_prefix("scenario:") {
        let (name, seed) = spec.split_once(':').unwrap_or((spec, "1"));
        let seed: u64 = seed.parse().map_err(|_| TraceError::Invalid {
            path: path.to_string(),
            message: format!("bad scenario seed {seed:?}"),
        })?;
        let w = match name {
            "steady-state" => super::scenarios::steady_state(seed),
            "burst" => super::scenarios::burst(seed),
            "unfair" => super::scenarios::unfair(seed),
            "sensitive-claim" => super::scenarios::sensitive_claim(seed),
            "preemption-heavy" => super::scenarios::preemption_heavy(seed),
            "empty-to-full" => super::scenarios::empty_to_full(seed),
            other => {
                return Err(TraceError::Invalid {
                    path: path.to_string(),
                    message: format!("unknown scenario {other:?}"),
                })
            }
        };
        return Ok((w, 0));
    }
    let is_swf = path.ends_with(".swf") || path.ends_with(".swf.gz");
    if is_swf {
        let t = swf::load(path)?;
        swf::to_workload(&t, &opts.swf, path)
    } else {
        let mut w = jsonl::load(path)?;
        if let Some(n) = opts.swf.jobs {
            w.jobs.sort_by_key(|j| (j.submit, j.id));
            w.jobs.truncate(n);
        }
        if opts.swf.estimate == EstimateField::Actual {
            for j in &mut w.jobs {
                j.estimate = j.runtime.max(1);
            }
        }
        Ok((w, 0))
    }
}

pub fn parse_size(s: &str) -> Result<SizeField, String> {
    match s {
        "allocated" => Ok(SizeField::Allocated),
        "requested" => Ok(SizeField::Requested),
        "max" => Ok(SizeField::Max),
        _ => Err(format!(
            "unknown size field {s:?} (allocated, requested, max)"
        )),
    }
}

pub fn parse_estimate(s: &str) -> Result<EstimateField, String> {
    match s {
        "requested" => Ok(EstimateField::Requested),
        "actual" => Ok(EstimateField::Actual),
        _ => Err(format!("unknown estimate {s:?} (requested, actual)")),
    }
}

pub fn run(policy: Policy, lattice: &SchedulerConfig, w: &Workload) -> Report {
    let r = simulate(w, &policy.config(lattice));
    Report::new(policy.name(), w, &r)
}

#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    pub policy: String,
    pub windows: usize,
    pub window_size: usize,
    pub seed: u64,
    pub starts: Vec<usize>,
    pub jobs: usize,
    /// Mean over windows of each window's average bounded slowdown.
    pub avg_bounded_slowdown: f64,
    pub avg_wait_s: f64,
    pub utilization: f64,
    pub makespan_s: i64,
    pub jain_index: f64,
    pub per_window_bsld: Vec<f64>,
}

/// Jobs a trace needs for [`run_windows`] to draw windows the way RLScheduler does:
/// starts lie in `[size, n - size - 1)`.
pub fn min_jobs_for_windows(size: usize) -> usize {
    2 * size + 2
}

/// Window protocol of RLScheduler (SC'20): `windows` windows of `size` consecutive jobs,
/// each replayed on an empty machine, the mean of their average bounded slowdowns. The
/// first job of each window is `randint(size, n − size − 1)` of numpy's `RandomState`
/// seeded by gym's `np_random(seed)`, drawn in turn from one generator (the same windows
/// RLScheduler's evaluation uses, so its published figures can be checked).
pub fn run_windows(
    policy: Policy,
    lattice: &SchedulerConfig,
    w: &Workload,
    windows: usize,
    size: usize,
    seed: u64,
) -> WindowReport {
    let mut rng = NumpyRandomState::gym_seeded(seed);
    let n = w.jobs.len();
    let mut starts = Vec::new();
    let mut reports = Vec::new();
    for _ in 0..windows {
        // A trace shorter than `min_jobs_for_windows` still gets in-range windows (the
        // CLI refuses it first): the start is kept where a whole window fits.
        let start = rng.randint(size as u64, n.saturating_sub(size + 1) as u64) as usize;
        let start = start.min(n.saturating_sub(size));
        let end = (start + size).min(n);
        let mut sub = Workload {
            nodes: w.nodes.clone(),
            jobs: w.jobs[start..end].to_vec(),
            tenants: w.tenants.clone(),
        };
        let t0 = sub.jobs.iter().map(|j| j.submit).min().unwrap_or(0);
        for j in &mut sub.jobs {
            j.submit -= t0;
        }
        starts.push(start);
        reports.push(run(policy, lattice, &sub));
    }
    let k = reports.len().max(1) as f64;
    WindowReport {
        policy: policy.name().to_string(),
        windows,
        window_size: size,
        seed,
        starts,
        jobs: reports.iter().map(|r| r.jobs).sum(),
        avg_bounded_slowdown: reports.iter().map(|r| r.avg_bounded_slowdown).sum::<f64>() / k,
        avg_wait_s: reports.iter().map(|r| r.avg_wait_s).sum::<f64>() / k,
        utilization: reports.iter().map(|r| r.utilization).sum::<f64>() / k,
        makespan_s: reports.iter().map(|r| r.makespan_s).sum(),
        jain_index: reports.iter().map(|r| r.jain_index).sum::<f64>() / k,
        per_window_bsld: reports.iter().map(|r| r.avg_bounded_slowdown).collect(),
    }
}
