//! `rm-replay`: replays workload traces in simulated time through the same [`Scheduler`]
//! core the live controller uses. Deterministic: the same trace and configuration always
//! give byte-identical reports.
//!
//! [`Scheduler`]: crate::Scheduler

pub mod engine;
pub mod jsonl;
pub mod metrics;
pub mod numpy_rng;
pub mod replay;
pub mod rng;
pub mod scenarios;
pub mod swf;

pub use engine::{simulate, SimJob, Workload};
pub use metrics::Report;

/// A trace parsing error with the 1-based line it was found on.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: line {line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Open a file, transparently decompressing `.gz`.
pub fn open_trace(path: &str) -> Result<Box<dyn std::io::BufRead>, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.to_string(),
        source,
    })?;
    if path.ends_with(".gz") {
        Ok(Box::new(std::io::BufReader::new(
            flate2::read::MultiGzDecoder::new(file),
        )))
    } else {
        Ok(Box::new(std::io::BufReader::new(file)))
    }
}
