//! The seed's cost-function components f₁..f₉ and the composite `Score(j) = Σ wᵢ·fᵢ(j)`.
//! Each component is a small pure function so it can be unit- and property-tested alone;
//! the score terms of [`crate::terms`] call them.

use crate::model::{CheckpointInfo, CheckpointMode};

/// f₁: static priority tier 0..=10 normalised to [0, 1]. Sensitive claims are class 10.
pub fn f1_priority(preemption_class: u8, sensitive: bool) -> f64 {
    let class = if sensitive {
        10
    } else {
        preemption_class.min(10)
    };
    f64::from(class) / 10.0
}

/// f₂ = ln(1 + wait / reference_wait): monotone in wait, log keeps it from dominating.
pub fn f2_wait_time(wait_s: f64, reference_wait_s: f64) -> f64 {
    let reference = if reference_wait_s > 0.0 {
        reference_wait_s
    } else {
        3600.0
    };
    (wait_s.max(0.0) / reference).ln_1p()
}

/// f₃ = max(0, target − actual) / target, in [0, 1]; 0 without a target.
pub fn f3_fair_share(target_share: f64, actual_share: f64) -> f64 {
    if target_share.is_nan() || target_share <= 0.0 || !actual_share.is_finite() {
        return 0.0;
    }
    ((target_share - actual_share.max(0.0)).max(0.0) / target_share).clamp(0.0, 1.0)
}

/// Inter-node part of f₄: 1 − groups_needed / max_groups_available (0 when it cannot fit).
///
/// On a machine of one group the formula would give every multi-node job 0, as if each
/// spanned every group, while the seed's rule is that "jobs that fit in a single group
/// score highest": there every job fits in a single group and none can span, so each
/// scores 1. (Otherwise a one-group cluster would rank single-node jobs above multi-node
/// ones by a topology term that has nothing to distinguish.)
pub fn f4_inter_node(groups_needed: Option<u32>, max_groups_available: u32) -> f64 {
    match groups_needed {
        Some(1) if max_groups_available == 1 => 1.0,
        Some(g) if max_groups_available > 0 => {
            (1.0 - f64::from(g) / f64::from(max_groups_available)).clamp(0.0, 1.0)
        }
        _ => 0.0,
    }
}

/// Intra-node part of f₄ (GPU and memory topology chapters):
/// β·gpu_link_fitness + (1−β)·memory_locality_fitness, β = 0.7 GPU-heavy, 0.3 CPU-heavy,
/// 0.5 unknown.
pub fn f4_intra_node(gpu_link_fitness: f64, memory_locality: f64, gpu_heavy: Option<bool>) -> f64 {
    let beta = match gpu_heavy {
        Some(true) => 0.7,
        Some(false) => 0.3,
        None => 0.5,
    };
    (beta * gpu_link_fitness + (1.0 - beta) * memory_locality).clamp(0.0, 1.0)
}

/// f₄ = α·inter + (1−α)·intra. The seed sets α = 0.7 for multi-node jobs and says that for
/// single-node jobs "intra-node only matters", so single-node jobs use the intra term alone.
pub fn f4_topology(requested_nodes: u32, inter: f64, intra: f64) -> f64 {
    if requested_nodes <= 1 {
        intra
    } else {
        0.7 * inter + 0.3 * intra
    }
}

/// f₅: fraction of input data on the hot tier; 0.5 (neutral) when unknown.
pub fn f5_data_readiness(fraction: Option<f64>) -> f64 {
    fraction.map_or(0.5, |f| {
        if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            0.5
        }
    })
}

/// f₆ = min(1, queued_gpu_hours / running_gpu_hours); a global, per-cycle signal.
pub fn f6_backlog(queued_gpu_hours: f64, running_gpu_hours: f64) -> f64 {
    if queued_gpu_hours <= 0.0 {
        0.0
    } else if running_gpu_hours <= 0.0 {
        1.0
    } else {
        (queued_gpu_hours / running_gpu_hours).min(1.0)
    }
}

/// f₇ = 1 − normalised energy price.
pub fn f7_energy(normalized_price: f64) -> f64 {
    1.0 - normalized_price.clamp(0.0, 1.0)
}

/// f₈ = 1 / (1 + estimated_checkpoint_minutes); 0 for jobs that cannot checkpoint.
pub fn f8_checkpoint(info: &CheckpointInfo) -> f64 {
    match info.mode {
        CheckpointMode::None => 0.0,
        _ => 1.0 / (1.0 + info.estimated_minutes.max(0.0)),
    }
}

/// f₉ = largest_conformance_group_size(candidates) / requested_nodes (capped at 1).
pub fn f9_conformance(largest_group: u32, requested_nodes: u32) -> f64 {
    if requested_nodes == 0 {
        return 1.0;
    }
    (f64::from(largest_group) / f64::from(requested_nodes)).min(1.0)
}

/// Soft GPU/node-hours budget (quota chapter): no penalty below 80 % used, a linear penalty
/// to 0.5 at 100 %, and a near-starvation factor beyond it. Never a hard block.
pub fn budget_factor(budget_used: Option<f64>) -> f64 {
    match budget_used {
        None => 1.0,
        Some(u) if u <= 0.8 => 1.0,
        Some(u) if u <= 1.0 => 1.0 - 2.5 * (u - 0.8),
        Some(_) => 0.05,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{CostWeights, WeightProfile};

    #[test]
    fn components_match_seed_formulas() {
        assert_eq!(f1_priority(5, false), 0.5);
        assert_eq!(f1_priority(0, true), 1.0);
        assert!((f2_wait_time(3600.0, 3600.0) - 2f64.ln()).abs() < 1e-12);
        assert_eq!(f3_fair_share(0.2, 0.0), 1.0);
        assert_eq!(f3_fair_share(0.2, 0.3), 0.0);
        assert!((f3_fair_share(0.2, 0.1) - 0.5).abs() < 1e-12);
        assert_eq!(f4_inter_node(Some(1), 4), 0.75);
        assert_eq!(f4_inter_node(Some(4), 4), 0.0);
        assert_eq!(f4_inter_node(Some(1), 1), 1.0);
        assert_eq!(f4_inter_node(None, 1), 0.0);
        assert_eq!(f5_data_readiness(None), 0.5);
        assert_eq!(f6_backlog(10.0, 5.0), 1.0);
        assert_eq!(f6_backlog(1.0, 4.0), 0.25);
        assert_eq!(f7_energy(0.25), 0.75);
        let ck = CheckpointInfo {
            mode: CheckpointMode::Auto,
            estimated_minutes: 4.0,
        };
        assert_eq!(f8_checkpoint(&ck), 0.2);
        assert_eq!(f9_conformance(3, 4), 0.75);
        assert_eq!(f4_topology(1, 0.0, 0.8), 0.8);
    }

    /// The seed's "Weight Profiles" table, row by row (w₁..w₉), column by column (HPC
    /// Batch, ML Training, Service, Sensitive, Interactive), as the seed prints it.
    #[test]
    fn profiles_are_the_seeds_table() {
        const SEED: [&str; 9] = [
            "w₁ (priority)0.150.100.150.900.10",
            "w₂ (wait_time)0.200.100.050.000.30",
            "w₃ (fair_share)0.200.100.100.000.10",
            "w₄ (topology)0.150.250.050.000.00",
            "w₅ (data_ready)0.100.150.100.000.05",
            "w₆ (backlog)0.050.050.050.000.15",
            "w₇ (energy)0.000.050.100.000.00",
            "w₈ (checkpoint)0.050.100.100.000.00",
            "w₉ (conformance)0.100.100.300.100.30",
        ];
        for (row, line) in SEED.iter().enumerate() {
            let digits = &line[line.find(')').expect("label") + 1..];
            let values: Vec<f64> = (0..5)
                .map(|k| digits[k * 4..k * 4 + 4].parse().expect("weight"))
                .collect();
            for (col, p) in WeightProfile::ALL.iter().enumerate() {
                assert_eq!(
                    p.weights().values()[row],
                    values[col],
                    "w{} of {p:?}",
                    row + 1
                );
            }
        }
    }

    /// The quota chapter's budget penalty: none to 80 %, linear to 0.5 at 100 %, a
    /// near-starvation factor beyond; no budget, no penalty.
    #[test]
    fn budget_penalty_curve() {
        assert_eq!(budget_factor(None), 1.0);
        assert_eq!(budget_factor(Some(0.0)), 1.0);
        assert_eq!(budget_factor(Some(0.8)), 1.0);
        assert!((budget_factor(Some(0.9)) - 0.75).abs() < 1e-12);
        assert!((budget_factor(Some(1.0)) - 0.5).abs() < 1e-12);
        assert_eq!(budget_factor(Some(1.01)), 0.05);
        assert_eq!(budget_factor(Some(7.0)), 0.05);
        let mut last = 1.0;
        for i in 0..=300 {
            let f = budget_factor(Some(f64::from(i) / 100.0));
            assert!(f <= last && f > 0.0, "monotone and never a hard block");
            last = f;
        }
    }

    #[test]
    fn profiles_sum_to_one() {
        for p in WeightProfile::ALL {
            let s: f64 = p.weights().values().iter().sum();
            assert!((s - 1.0).abs() < 1e-9, "{p:?} sums to {s}");
        }
        let s: f64 = CostWeights::default().values().iter().sum();
        assert!((s - 1.0).abs() < 1e-9);
    }
}
