//! w₅ · f₅: fraction of the input data on the hot tier.

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct DataReadiness;

impl ScoreTerm for DataReadiness {
    fn name(&self) -> &'static str {
        "dataReadiness"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w5", "dataReady", "data_readiness"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        score::f5_data_readiness(i.job.data_readiness)
    }
}
