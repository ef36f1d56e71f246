//! w₇ · f₇: cheap electricity now.

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct Energy;

impl ScoreTerm for Energy {
    fn name(&self) -> &'static str {
        "energy"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w7"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        score::f7_energy(i.snap.energy_price)
    }
}
