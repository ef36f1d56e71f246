//! w₈ · f₈: how cheaply the job checkpoints.

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct Checkpoint;

impl ScoreTerm for Checkpoint {
    fn name(&self) -> &'static str {
        "checkpointEfficiency"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w8", "checkpoint"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        score::f8_checkpoint(&i.job.checkpoint)
    }
}
