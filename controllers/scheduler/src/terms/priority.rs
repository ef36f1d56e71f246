//! w₁ · f₁: static priority tier (sensitive claims are the top tier).

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct Priority;

impl ScoreTerm for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w1"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        score::f1_priority(i.job.preemption_class, i.job.sensitive)
    }
}
