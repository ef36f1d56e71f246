//! w₂ · f₂: time waited, on a log scale (anti-starvation).

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct WaitTime;

impl ScoreTerm for WaitTime {
    fn name(&self) -> &'static str {
        "waitTime"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w2", "wait_time"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        score::f2_wait_time((i.snap.now - i.job.submit_time) as f64, i.reference_wait_s)
    }
}
