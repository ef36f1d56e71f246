//! w₃ · f₃: how far the job's tenant is below its target share.

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct FairShare;

impl ScoreTerm for FairShare {
    fn name(&self) -> &'static str {
        "fairShare"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w3", "fair_share"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        let (target, actual) = i
            .tenant
            .map_or((0.0, 0.0), |t| (t.quota.target_share, t.usage.actual_share));
        score::f3_fair_share(target, actual)
    }
}
