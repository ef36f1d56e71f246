//! w₉ · f₉: largest conformance group the job could get, over the nodes it needs.

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct Conformance;

impl ScoreTerm for Conformance {
    fn name(&self) -> &'static str {
        "conformance"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w9"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        score::f9_conformance(i.largest_conformance, i.job.nodes.min)
    }
}
