//! Standard Workload Format (Parallel Workloads Archive) reader and the job-shaping options
//! that change published results: size field, estimate field, the predictsim filter.

use std::io::BufRead;

use super::engine::{SimJob, Workload};
use super::TraceError;
use crate::model::{NodeView, TenantId, VClusterId};
use crate::predict::RuntimeKey;

/// One SWF record (the fields the simulator uses).
#[derive(Debug, Clone, PartialEq)]
pub struct SwfRecord {
    pub line: usize,
    pub id: i64,
    pub submit: i64,
    pub wait: i64,
    pub runtime: i64,
    pub allocated: i64,
    pub requested_procs: i64,
    pub requested_time: i64,
    pub status: i64,
    pub user: i64,
    pub group: i64,
    /// Executable (application) number: the job's name for runtime history.
    pub executable: i64,
    pub queue: i64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct SwfTrace {
    pub records: Vec<SwfRecord>,
    /// `MaxProcs` (or `MaxNodes`) from the header.
    pub max_procs: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeField {
    Allocated,
    Requested,
    /// max(allocated, requested): the RLScheduler protocol.
    Max,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimateField {
    Requested,
    Actual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwfOptions {
    pub size: SizeField,
    pub estimate: EstimateField,
    /// Gaussier et al. (predictsim) cleaning, see `traces/README.md`.
    pub predictsim_filter: bool,
    /// RLScheduler's job loading (DIR-LAB/deep-batch-scheduler `job.py`): a requested time
    /// of -1 becomes the run time, a negative run time becomes 10 s, jobs with a run time
    /// of 0 are dropped.
    pub rlscheduler_filter: bool,
    /// Keep only the first N jobs (after filtering).
    pub jobs: Option<usize>,
}

impl Default for SwfOptions {
    fn default() -> Self {
        SwfOptions {
            size: SizeField::Allocated,
            estimate: EstimateField::Requested,
            predictsim_filter: false,
            rlscheduler_filter: false,
            jobs: None,
        }
    }
}

/// Parse SWF text. Header lines start with ';'; `MaxProcs: N` may carry text after N.
pub fn parse(reader: impl BufRead, path: &str) -> Result<SwfTrace, TraceError> {
    let mut trace = SwfTrace::default();
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|e| TraceError::Parse {
            path: path.to_string(),
            line: lineno,
            message: format!("cannot read line: {e}"),
        })?;
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(h) = t.strip_prefix(';') {
            let h = h.trim();
            for key in ["MaxProcs:", "MaxNodes:"] {
                if let Some(v) = h.strip_prefix(key) {
                    let num: String = v
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    if let Ok(n) = num.parse::<i64>() {
                        if key == "MaxProcs:" || trace.max_procs.is_none() {
                            trace.max_procs = Some(n);
                        }
                    }
                }
            }
            continue;
        }
        let fields: Vec<&str> = t.split_whitespace().collect();
        if fields.len() < 18 {
            return Err(TraceError::Parse {
                path: path.to_string(),
                line: lineno,
                message: format!("expected 18 SWF fields, found {}", fields.len()),
            });
        }
        let num = |k: usize| -> Result<i64, TraceError> {
            let s = fields[k];
            s.parse::<i64>()
                .or_else(|_| s.parse::<f64>().map(|f| f as i64))
                .map_err(|_| TraceError::Parse {
                    path: path.to_string(),
                    line: lineno,
                    message: format!("field {} ({s:?}) is not a number", k + 1),
                })
        };
        trace.records.push(SwfRecord {
            line: lineno,
            id: num(0)?,
            submit: num(1)?,
            wait: num(2)?,
            runtime: num(3)?,
            allocated: num(4)?,
            requested_procs: num(7)?,
            requested_time: num(8)?,
            status: num(10)?,
            user: num(11)?,
            group: num(12)?,
            executable: num(13)?,
            queue: num(14)?,
        });
    }
    Ok(trace)
}

pub fn load(path: &str) -> Result<SwfTrace, TraceError> {
    parse(super::open_trace(path)?, path)
}

/// Turn SWF records into simulator jobs on `max_procs` one-processor "nodes" (full-node
/// semantics). Returns the workload and the number of dropped records.
pub fn to_workload(
    trace: &SwfTrace,
    opts: &SwfOptions,
    path: &str,
) -> Result<(Workload, usize), TraceError> {
    let max_procs = trace
        .max_procs
        .filter(|&m| m > 0)
        .ok_or_else(|| TraceError::Invalid {
            path: path.to_string(),
            message: "header has no positive MaxProcs/MaxNodes".into(),
        })?;
    let mut jobs = Vec::new();
    let mut dropped = 0usize;
    for r in &trace.records {
        let mut alloc = r.allocated;
        let mut req = r.requested_procs;
        let mut runtime = r.runtime;
        let mut req_time = r.requested_time;
        if opts.predictsim_filter {
            // Gaussier et al.: copy one processor field into the other when <= 0, drop
            // oversize, non-positive runtime/request and negative submit, cap runtime.
            if req <= 0 {
                req = alloc;
            }
            if alloc <= 0 {
                alloc = req;
            }
            if req > max_procs || runtime <= 0 || req_time <= 0 || r.submit < 0 {
                dropped += 1;
                continue;
            }
            runtime = runtime.min(req_time);
        }
        if opts.rlscheduler_filter {
            if req_time == -1 {
                req_time = runtime;
            }
            if runtime < 0 {
                runtime = 10;
            }
            if runtime == 0 {
                dropped += 1;
                continue;
            }
        }
        let size = match opts.size {
            SizeField::Allocated => {
                if alloc > 0 {
                    alloc
                } else {
                    req
                }
            }
            SizeField::Requested => {
                if req > 0 {
                    req
                } else {
                    alloc
                }
            }
            SizeField::Max => alloc.max(req),
        };
        if size <= 0 || size > max_procs || runtime < 0 || r.submit < 0 {
            dropped += 1;
            continue;
        }
        if req_time <= 0 {
            req_time = runtime;
        }
        let estimate = match opts.estimate {
            EstimateField::Requested => req_time,
            EstimateField::Actual => runtime,
        };
        jobs.push(SimJob {
            id: r.id.max(0) as u64,
            tenant: TenantId(r.user.max(0) as u32),
            vcluster: VClusterId(0),
            submit: r.submit,
            runtime,
            estimate: estimate.max(1),
            nodes: size as u32,
            class: 5,
            sensitive: false,
            constraints: Default::default(),
            checkpoint: Default::default(),
            // Users and executables as numbered by the archive (-1: unknown).
            runtime_key: RuntimeKey {
                user: u32::try_from(r.user).ok(),
                name: u32::try_from(r.executable).ok(),
            },
        });
        if opts.jobs.is_some_and(|n| jobs.len() >= n) {
            break;
        }
    }
    let nodes = (0..max_procs as u32).map(NodeView::slot).collect();
    Ok((
        Workload {
            nodes,
            jobs,
            tenants: Vec::new(),
        },
        dropped,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "; Version: 2.2\n; MaxProcs: 8 (some text)\n\
1 0 5 100 4 -1 -1 4 200 -1 1 3 1 -1 1 -1 -1 -1\n\
2 10 0 -1 2 -1 -1 2 50 -1 5 4 1 -1 1 -1 -1 -1\n";

    #[test]
    fn parses_header_and_records() {
        let t = parse(SAMPLE.as_bytes(), "sample").unwrap();
        assert_eq!(t.max_procs, Some(8));
        assert_eq!(t.records.len(), 2);
        let (w, dropped) = to_workload(&t, &SwfOptions::default(), "sample").unwrap();
        assert_eq!((w.jobs.len(), dropped), (1, 1));
        assert_eq!(w.nodes.len(), 8);
    }

    #[test]
    fn reports_line_numbers() {
        let bad = "; MaxProcs: 8\n1 0 5 x 4 -1 -1 4 200 -1 1 3 1 -1 1 -1 -1 -1\n";
        let err = parse(bad.as_bytes(), "bad.swf").unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("field 4"), "{err}");
    }
}
