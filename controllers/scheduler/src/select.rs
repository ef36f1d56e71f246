//! Node selection (solver step 2a): fewest dragonfly groups first, then the largest
//! conformance group, best fit for bin-packing. Works on per-(group, fingerprint) free
//! counts, never on individual nodes, so it costs O(buckets), not O(nodes).

/// Free-node count of one (dragonfly group, conformance fingerprint) bucket.
pub type BucketCount = ((u32, u64), u32);

/// How many nodes to take from each (group, fingerprint) bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub take: Vec<BucketCount>,
    pub groups: u32,
    /// Largest number of selected nodes sharing one fingerprint (f₉'s numerator).
    pub largest_conformance: u32,
}

impl Selection {
    pub fn total(&self) -> u32 {
        self.take.iter().map(|(_, n)| n).sum()
    }
}

/// Minimum number of groups any placement of `need` nodes must span, given the free counts
/// (greedy by largest group is optimal for this count).
pub fn min_groups_needed(counts: &[BucketCount], need: u32) -> Option<u32> {
    let mut per_group = group_totals(counts);
    per_group.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut acc = 0u32;
    for (i, (_, c)) in per_group.iter().enumerate() {
        acc += c;
        if acc >= need {
            return Some(i as u32 + 1);
        }
    }
    if need == 0 {
        Some(0)
    } else {
        None
    }
}

fn group_totals(counts: &[BucketCount]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &((g, _), c) in counts {
        match out.last_mut() {
            Some((lg, lc)) if *lg == g => *lc += c,
            _ => out.push((g, c)),
        }
    }
    out
}

/// Choose buckets for a job needing `min..=max` nodes. `counts` must be sorted by key and
/// free of zero entries. `same_fingerprint` makes conformance a hard constraint.
pub fn select(
    counts: &[BucketCount],
    min: u32,
    max: u32,
    same_fingerprint: bool,
    binpack: bool,
) -> Option<Selection> {
    if min == 0 {
        return Some(Selection {
            take: Vec::new(),
            groups: 0,
            largest_conformance: 0,
        });
    }
    let max = max.max(min);
    if same_fingerprint {
        let mut fps: Vec<u64> = counts.iter().map(|((_, fp), _)| *fp).collect();
        fps.sort_unstable();
        fps.dedup();
        let mut best: Option<(u32, u32, Selection)> = None;
        for fp in fps {
            let sub: Vec<BucketCount> = counts
                .iter()
                .copied()
                .filter(|((_, f), _)| *f == fp)
                .collect();
            let total: u32 = sub.iter().map(|(_, c)| c).sum();
            if total < min {
                continue;
            }
            if let Some(sel) = select_groups(&sub, min, max, binpack) {
                // Fewest groups, then best fit (binpack) or largest group.
                let fit = if binpack { total } else { u32::MAX - total };
                let better = match &best {
                    None => true,
                    Some((g, f, _)) => (sel.groups, fit) < (*g, *f),
                };
                if better {
                    best = Some((sel.groups, fit, sel));
                }
            }
        }
        return best.map(|(_, _, s)| s);
    }
    select_groups(counts, min, max, binpack)
}

fn select_groups(counts: &[BucketCount], min: u32, max: u32, binpack: bool) -> Option<Selection> {
    let totals = group_totals(counts);
    let largest_fp_in = |g: u32| {
        counts
            .iter()
            .filter(|((gg, _), _)| *gg == g)
            .map(|(_, c)| *c)
            .max()
            .unwrap_or(0)
    };
    // One group suffices: prefer a group where one fingerprint covers the job, then best fit
    // (smallest sufficient group) to keep large holes for large jobs.
    let single = totals
        .iter()
        .filter(|(_, c)| *c >= min)
        .map(|&(g, c)| {
            let conformant = largest_fp_in(g) >= min;
            let fit = if binpack || !conformant {
                c
            } else {
                largest_fp_in(g)
            };
            (!conformant, fit, g)
        })
        .min();
    let chosen: Vec<u32> = if let Some((_, _, g)) = single {
        vec![g]
    } else {
        let mut by_size = totals.clone();
        by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut acc = 0;
        let mut out = Vec::new();
        for (g, c) in by_size {
            out.push(g);
            acc += c;
            if acc >= min {
                break;
            }
        }
        if acc < min {
            return None;
        }
        out
    };
    let buckets: Vec<BucketCount> = counts
        .iter()
        .copied()
        .filter(|((g, _), _)| chosen.contains(g))
        .collect();
    finish(buckets, min, max)
}

/// Take up to `max` nodes from `buckets` (those of the chosen groups): from the largest
/// fingerprint buckets first, so the node set is as conformant as possible.
pub(crate) fn finish(mut buckets: Vec<BucketCount>, min: u32, max: u32) -> Option<Selection> {
    buckets.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut fp_totals: Vec<(u64, u32)> = Vec::new();
    let mut left = max;
    let mut take = Vec::new();
    for (k, c) in buckets {
        if left == 0 {
            break;
        }
        let n = c.min(left);
        left -= n;
        take.push((k, n));
        match fp_totals.iter_mut().find(|(f, _)| *f == k.1) {
            Some((_, t)) => *t += n,
            None => fp_totals.push((k.1, n)),
        }
    }
    take.sort();
    let total: u32 = take.iter().map(|(_, n)| n).sum();
    if total < min {
        return None;
    }
    let mut groups: Vec<u32> = take.iter().map(|((g, _), _)| *g).collect();
    groups.dedup();
    Some(Selection {
        groups: groups.len() as u32,
        largest_conformance: fp_totals.iter().map(|(_, t)| *t).max().unwrap_or(0),
        take,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_single_group_and_conformant_bucket() {
        let counts = vec![((0, 1), 3), ((0, 2), 3), ((1, 1), 4), ((2, 7), 8)];
        let s = select(&counts, 4, 4, false, false).unwrap();
        assert_eq!(s.groups, 1);
        assert_eq!(s.take, vec![((1, 1), 4)]);
        assert_eq!(s.largest_conformance, 4);
        let s = select(&counts, 10, 10, false, false).unwrap();
        assert_eq!(s.groups, 2);
        assert_eq!(min_groups_needed(&counts, 10), Some(2));
        assert!(select(&counts, 19, 19, false, false).is_none());
    }

    #[test]
    fn hard_conformance_uses_one_fingerprint() {
        let counts = vec![((0, 1), 3), ((0, 2), 3), ((1, 1), 4)];
        let s = select(&counts, 6, 6, true, false).unwrap();
        assert!(s.take.iter().all(|((_, fp), _)| *fp == 1));
        assert!(select(&counts, 8, 8, true, false).is_none());
    }
}
