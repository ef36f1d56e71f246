//! w₆ · f₆: backlog pressure, one value per cycle.

use super::{ScoreInput, ScoreTerm};

pub(crate) struct Backlog;

impl ScoreTerm for Backlog {
    fn name(&self) -> &'static str {
        "backlog"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w6"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        i.backlog
    }
}
