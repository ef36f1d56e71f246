//! w₄ · f₄: topology fitness, inter-node (dragonfly groups) and intra-node (GPU links, memory locality).

use super::{ScoreInput, ScoreTerm};
use crate::score;

pub(crate) struct Topology;

impl ScoreTerm for Topology {
    fn name(&self) -> &'static str {
        "topology"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["w4"]
    }
    #[inline]
    fn score(&self, i: &ScoreInput<'_>) -> f64 {
        let inter = score::f4_inter_node(i.groups_needed, i.groups_available);
        score::f4_topology(i.job.nodes.min, inter, i.intra_node)
    }
}
