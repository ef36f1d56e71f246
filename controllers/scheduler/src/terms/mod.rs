//! Score terms: the fᵢ of `Score(j) = Σ wᵢ·fᵢ(j)` as small named plugins, in the spirit of
//! the Kubernetes scheduling framework's score plugins. A term reads what the cycle computed
//! for one job ([`ScoreInput`]) and returns a value, normally in [0, 1]; the profile's
//! weights ([`CostWeights`]) say how much each term counts.
//!
//! [`REGISTRY`] is the one list of terms. Its order is the order of the sum (and of
//! [`Components`]), so the seed's nine come first in the seed's order and a new term goes
//! at the end. Adding a term is one file in this directory and one line in the `terms!`
//! list below;
//! its `name` is the weight name users write under `spec.weights` (the VCluster kind in
//! `lattice-apis` lists the names it admits, and a test of `lattice-controllers` checks
//! that the two lists agree).
//!
//! Weights are resolved to registry positions once, when a [`CostWeights`] is built or
//! read, never per job: the cycle walks two slices side by side.
//!
//! ```
//! use lattice_scheduler::terms::{self, CostWeights};
//!
//! let mut w = CostWeights::zero();
//! w.set("waitTime", 1.0).unwrap();
//! assert_eq!(w.get("wait_time"), Some(1.0)); // the core's older spelling still works
//! assert!(w.set("speed", 1.0).unwrap_err().to_string().contains("waitTime"));
//! assert_eq!(terms::REGISTRY[1].name(), "waitTime");
//! ```

mod backlog;
mod checkpoint;
mod conformance;
mod data_readiness;
mod energy;
mod fair_share;
mod priority;
mod topology;
mod wait_time;
mod weights;

use serde::Serialize;

use crate::model::{ClusterSnapshot, PendingJob, Tenant};

pub use weights::{CostWeights, UnknownWeight};

/// One term of the cost function.
pub trait ScoreTerm: Sync {
    /// The weight name (`spec.weights.<name>`), camelCase as in the VCluster spec.
    fn name(&self) -> &'static str;
    /// Other names its weight may be given under (older spellings, `wN` of the seed).
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }
    /// fᵢ(job), normally in [0, 1].
    fn score(&self, input: &ScoreInput<'_>) -> f64;
}

/// The one list of score terms, in the order of the sum: it defines both [`REGISTRY`]
/// (names, weights, [`Components`]) and [`weighted_sum`], which evaluates the same terms
/// in the same order without dynamic dispatch (the cycle's hot path: once per job).
macro_rules! terms {
    ($($term:expr),* $(,)?) => {
        /// Every score term, in the order of the sum.
        pub static REGISTRY: &[&dyn ScoreTerm] = &[$(&$term),*];

        /// `Σ wᵢ·fᵢ(job)` straight from the input, without collecting the components. Same
        /// terms, same order, same arithmetic as [`Components::score`].
        #[allow(unused_assignments)] // the index after the last term
        pub fn weighted_sum(input: &ScoreInput<'_>, w: &CostWeights) -> f64 {
            let w = w.values();
            let mut i = 0;
            let products = [$({
                let p = $term.score(input) * w[i];
                i += 1;
                p
            }),*];
            products.into_iter().sum()
        }
    };
}

// Append new terms at the end (the order is the order of the sum).
terms![
    priority::Priority,
    wait_time::WaitTime,
    fair_share::FairShare,
    topology::Topology,
    data_readiness::DataReadiness,
    backlog::Backlog,
    energy::Energy,
    checkpoint::Checkpoint,
    conformance::Conformance,
];

/// The registered term names, in registry order.
pub fn names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|t| t.name())
}

/// The registry position of a weight name or alias.
pub fn index_of(name: &str) -> Option<usize> {
    REGISTRY
        .iter()
        .position(|t| t.name() == name || t.aliases().contains(&name))
}

/// What the cycle knows about one job when it scores it. Inventory-derived values are
/// computed once per set of feasible node classes and shared by the jobs with that set.
#[derive(Debug, Clone, Copy)]
pub struct ScoreInput<'a> {
    pub job: &'a PendingJob,
    pub snap: &'a ClusterSnapshot<'a>,
    /// The job's tenant (`None`: no quota, no fair-share target).
    pub tenant: Option<&'a Tenant>,
    /// f₂'s reference wait in seconds (the profile's).
    pub reference_wait_s: f64,
    /// Queued over running GPU-hours, once per cycle (f₆).
    pub backlog: f64,
    /// Fewest dragonfly groups the job's schedulable inventory lets it span (`None`: it
    /// cannot fit), and how many groups that inventory has.
    pub groups_needed: Option<u32>,
    pub groups_available: u32,
    /// Best intra-node fitness over the job's feasible node classes.
    pub intra_node: f64,
    /// Largest set of the job's schedulable nodes sharing one conformance fingerprint.
    pub largest_conformance: u32,
}

/// Every term's value for one job, in registry order.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Components(pub Vec<f64>);

impl Components {
    /// Evaluate every registered term.
    pub fn of(input: &ScoreInput<'_>) -> Self {
        Components(REGISTRY.iter().map(|t| t.score(input)).collect())
    }

    /// The value of the term named `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        index_of(name).and_then(|i| self.0.get(i).copied())
    }

    /// `Σ wᵢ·fᵢ`.
    pub fn score(&self, w: &CostWeights) -> f64 {
        self.0.iter().zip(w.values()).map(|(f, w)| f * w).sum()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::catalog::NodeCatalog;
    use crate::cycle::Scheduler;
    use crate::model::*;
    use crate::profile::SchedulerConfig;

    /// The seed's nine in the seed's order: the sum's order must not change.
    #[test]
    fn the_registry_begins_with_the_seeds_nine() {
        let names: Vec<&str> = names().collect();
        assert_eq!(
            names[..9],
            [
                "priority",
                "waitTime",
                "fairShare",
                "topology",
                "dataReadiness",
                "backlog",
                "energy",
                "checkpointEfficiency",
                "conformance"
            ]
        );
        let mut all: Vec<&str> = REGISTRY
            .iter()
            .flat_map(|t| std::iter::once(t.name()).chain(t.aliases().iter().copied()))
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "every name and alias names one term");
    }

    #[test]
    fn core_yaml_keeps_its_snake_case_names() {
        let w: CostWeights = serde_yaml::from_str("wait_time: 0.5\ncheckpoint: 0.25").unwrap();
        assert_eq!(w.get("waitTime"), Some(0.5));
        assert_eq!(w.get("checkpointEfficiency"), Some(0.25));
        // Unnamed terms keep the baseline, as the former struct's `serde(default)` did.
        assert_eq!(w.get("priority"), CostWeights::default().get("priority"));
        let e = serde_yaml::from_str::<CostWeights>("speed: 1").unwrap_err();
        assert!(
            e.to_string().contains("known weights: priority, waitTime"),
            "{e}"
        );
    }

    fn jobs(spec: &[(u8, i64, u32, bool)]) -> Vec<PendingJob> {
        spec.iter()
            .enumerate()
            .map(|(i, &(class, submit, nodes, ckpt))| PendingJob {
                id: JobId(i as u64),
                tenant: TenantId(i as u32 % 3),
                vcluster: VClusterId(0),
                nodes: NodeRequest::exact(nodes),
                constraints: Constraints::default(),
                preemption_class: class,
                sensitive: false,
                submit_time: submit,
                walltime_s: 3600,
                runtime_key: Default::default(),
                checkpoint: CheckpointInfo {
                    mode: if ckpt {
                        CheckpointMode::Auto
                    } else {
                        CheckpointMode::None
                    },
                    estimated_minutes: 2.0,
                },
                data_readiness: Some(f64::from(class) / 10.0),
                scale_up: None,
            })
            .collect()
    }

    proptest! {
        /// Weights given by name (in any order) score exactly as the seed's array did:
        /// `Σ fᵢ·wᵢ` over the nine in the seed's order, and the same plan, bit for bit.
        #[test]
        fn named_weights_score_as_the_seed_array(
            w in proptest::array::uniform9(0.0f64..=1.0),
            rotate in 0usize..9,
            spec in proptest::collection::vec((0u8..=10, -86_400i64..0, 1u32..=6, any::<bool>()), 1..24),
        ) {
            let mut named = CostWeights::zero();
            for k in 0..9 {
                let i = (k + rotate) % 9;
                named.set(REGISTRY[i].name(), w[i]).unwrap();
            }
            let seed = CostWeights::seed(w);
            prop_assert_eq!(&named, &seed);

            let nodes: Vec<NodeView> = (0..16)
                .map(|i| {
                    let mut n = NodeView::slot(i);
                    n.topology_group = i / 4;
                    n.conformance_fingerprint = u64::from(i % 3);
                    n
                })
                .collect();
            let catalog = NodeCatalog::new(nodes);
            let pending = jobs(&spec);
            let tenants: Vec<Tenant> = (0..3)
                .map(|i| Tenant {
                    id: TenantId(i),
                    quota: TenantQuota { target_share: 0.3, ..Default::default() },
                    usage: TenantUsage { actual_share: f64::from(i) * 0.2, budget_used: None },
                })
                .collect();
            let snap = ClusterSnapshot {
                now: 0,
                running: &[],
                pending: &pending,
                tenants: &tenants,
                energy_price: 0.3,
                history: None,
            };
            let cfg = |weights: CostWeights| SchedulerConfig { weights, ..SchedulerConfig::default() };
            let by_name = Scheduler::new(cfg(named.clone()));
            for c in by_name.components(&catalog, &snap) {
                let array: [f64; 9] = c.0[..9].try_into().unwrap();
                let old: f64 = array.iter().zip(w.iter()).map(|(f, w)| f * w).sum();
                prop_assert_eq!(c.score(&named).to_bits(), old.to_bits());
            }
            let a = by_name.cycle(&catalog, &snap);
            let b = Scheduler::new(cfg(seed)).cycle(&catalog, &snap);
            prop_assert_eq!(
                serde_json::to_string(&a).unwrap(),
                serde_json::to_string(&b).unwrap()
            );
        }
    }
}
