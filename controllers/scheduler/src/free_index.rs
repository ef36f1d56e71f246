//! The free index of one set of node classes: per (dragonfly group, fingerprint) free counts
//! plus per-group totals and largest-fingerprint counts in ordered sets, kept up to date as a
//! cycle takes nodes. [`crate::select::select`] answers the same questions from a list of
//! every bucket (O(buckets) per job, so a cycle grew with pending × groups); this answers the
//! common case — no single-fingerprint requirement, no bin-packing — in O(log groups) plus
//! the groups it picks, with exactly the same choices (a property test holds the two
//! together).
//!
//! Nodes held for a reservation are not in the index; a job that may use them passes their
//! counts as `extra` (few: a reservation's nodes), and the groups they touch are evaluated
//! explicitly beside the index.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::select::{self, BucketCount, Selection};

#[derive(Debug, Default)]
pub(crate) struct SetIndex {
    buckets: BTreeMap<(u32, u64), u32>,
    /// Per group: (total free, largest fingerprint bucket).
    groups: HashMap<u32, (u32, u32)>,
    by_total: BTreeSet<(u32, u32)>,
    by_total_desc: BTreeSet<(Reverse<u32>, u32)>,
    by_fp_max: BTreeSet<(u32, u32)>,
    /// Free nodes per fingerprint, over all groups.
    fp_totals: HashMap<u64, u32>,
}

/// A group's totals as a job sees them (index plus held nodes it may use).
#[derive(Debug, Clone, Copy)]
struct GroupView {
    group: u32,
    total: u32,
    fp_max: u32,
}

impl SetIndex {
    /// From merged, key-sorted counts without zero entries.
    pub(crate) fn new(counts: &[BucketCount]) -> Self {
        let mut ix = SetIndex::default();
        for &(k, c) in counts {
            if c > 0 {
                *ix.buckets.entry(k).or_default() += c;
                *ix.fp_totals.entry(k.1).or_default() += c;
            }
        }
        let groups: Vec<u32> = {
            let mut g: Vec<u32> = ix.buckets.keys().map(|k| k.0).collect();
            g.dedup();
            g
        };
        for g in groups {
            ix.refresh(g);
        }
        ix
    }

    /// `n` free nodes of bucket `key` were taken (or held for a reservation).
    pub(crate) fn remove(&mut self, key: (u32, u64), n: u32) {
        if let Some(c) = self.buckets.get_mut(&key) {
            let n = n.min(*c);
            *c -= n;
            if let Some(f) = self.fp_totals.get_mut(&key.1) {
                *f -= n;
            }
            if *c == 0 {
                self.buckets.remove(&key);
            }
            self.refresh(key.0);
        }
    }

    fn group_buckets(&self, g: u32) -> impl Iterator<Item = (&(u32, u64), &u32)> {
        self.buckets.range((g, 0)..=(g, u64::MAX))
    }

    /// Recompute group `g`'s entry in the ordered sets.
    fn refresh(&mut self, g: u32) {
        if let Some((t, m)) = self.groups.remove(&g) {
            self.by_total.remove(&(t, g));
            self.by_total_desc.remove(&(Reverse(t), g));
            self.by_fp_max.remove(&(m, g));
        }
        let (mut t, mut m) = (0u32, 0u32);
        for (_, &c) in self.group_buckets(g) {
            t += c;
            m = m.max(c);
        }
        if t > 0 {
            self.groups.insert(g, (t, m));
            self.by_total.insert((t, g));
            self.by_total_desc.insert((Reverse(t), g));
            self.by_fp_max.insert((m, g));
        }
    }

    /// Groups touched by `extra` (sorted by key), with their combined counts.
    fn touched(&self, extra: &[BucketCount]) -> Vec<GroupView> {
        let mut out: Vec<GroupView> = Vec::new();
        let mut i = 0;
        while i < extra.len() {
            let g = extra[i].0 .0;
            let mut j = i;
            while j < extra.len() && extra[j].0 .0 == g {
                j += 1;
            }
            let mut merged: BTreeMap<u64, u32> =
                self.group_buckets(g).map(|(k, &c)| (k.1, c)).collect();
            for &((_, fp), c) in &extra[i..j] {
                *merged.entry(fp).or_default() += c;
            }
            out.push(GroupView {
                group: g,
                total: merged.values().sum(),
                fp_max: merged.values().copied().max().unwrap_or(0),
            });
            i = j;
        }
        out
    }

    /// Groups by total free, largest first (ties: lower group first), touched groups with
    /// their combined totals in place of their indexed ones.
    fn largest_first<'a>(
        &'a self,
        touched: &'a [GroupView],
    ) -> impl Iterator<Item = (u32, u32)> + 'a {
        let mut t: Vec<(Reverse<u32>, u32)> = touched
            .iter()
            .map(|v| (Reverse(v.total), v.group))
            .collect();
        t.sort_unstable();
        let is_touched = move |g: u32| touched.iter().any(|v| v.group == g);
        let mut indexed = self
            .by_total_desc
            .iter()
            .filter(move |(_, g)| !is_touched(*g))
            .copied()
            .peekable();
        let mut extra = t.into_iter().peekable();
        std::iter::from_fn(move || {
            let next = match (indexed.peek(), extra.peek()) {
                (Some(a), Some(b)) if a <= b => indexed.next(),
                (Some(_), Some(_)) => extra.next(),
                (Some(_), None) => indexed.next(),
                (None, Some(_)) => extra.next(),
                (None, None) => None,
            };
            next.map(|(Reverse(t), g)| (g, t))
        })
    }

    /// Free nodes per fingerprint (those with any), with `extra`.
    pub(crate) fn fingerprint_totals(&self, extra: &[BucketCount]) -> Vec<(u64, u32)> {
        let mut totals = self.fp_totals.clone();
        for &((_, fp), c) in extra {
            *totals.entry(fp).or_default() += c;
        }
        totals.into_iter().filter(|(_, c)| *c > 0).collect()
    }

    /// The most free nodes sharing one fingerprint, with `extra`
    /// ([`crate::cycle::largest_fingerprint_group`] of the index plus `extra`).
    pub(crate) fn largest_fingerprint(&self, extra: &[BucketCount]) -> u32 {
        self.fingerprint_totals(extra)
            .into_iter()
            .map(|(_, c)| c)
            .max()
            .unwrap_or(0)
    }

    /// [`select::min_groups_needed`] of the index plus `extra`.
    pub(crate) fn min_groups_needed(&self, extra: &[BucketCount], need: u32) -> Option<u32> {
        if need == 0 {
            return Some(0);
        }
        let touched = self.touched(extra);
        let mut acc = 0u32;
        for (i, (_, t)) in self.largest_first(&touched).enumerate() {
            acc += t;
            if acc >= need {
                return Some(i as u32 + 1);
            }
        }
        None
    }

    /// [`select::select`] of the index plus `extra` for a job that needs no single
    /// fingerprint and is not bin-packed (`min` ≥ 1).
    pub(crate) fn select(&self, extra: &[BucketCount], min: u32, max: u32) -> Option<Selection> {
        let touched = self.touched(extra);
        // The smallest (value, group) with value ≥ min, from an ordered set of the untouched
        // groups and the touched groups' combined values.
        let smallest_from = |set: &BTreeSet<(u32, u32)>, value: fn(&GroupView) -> u32| {
            set.range((min, 0)..)
                .find(|(_, g)| !touched.iter().any(|v| v.group == *g))
                .copied()
                .into_iter()
                .chain(
                    touched
                        .iter()
                        .map(|v| (value(v), v.group))
                        .filter(|(x, _)| *x >= min),
                )
                .min()
        };
        // One group suffices: the one whose largest fingerprint bucket covers the job with
        // the least to spare, else the smallest sufficient group (lowest group on ties).
        let single = smallest_from(&self.by_fp_max, |v| v.fp_max)
            .or_else(|| smallest_from(&self.by_total, |v| v.total));
        let chosen: Vec<u32> = match single {
            Some((_, g)) => vec![g],
            None => {
                let mut acc = 0;
                let mut out = Vec::new();
                for (g, t) in self.largest_first(&touched) {
                    out.push(g);
                    acc += t;
                    if acc >= min {
                        break;
                    }
                }
                if acc < min {
                    return None;
                }
                out
            }
        };
        let mut buckets: Vec<BucketCount> = Vec::new();
        for &g in &chosen {
            buckets.extend(self.group_buckets(g).map(|(k, &c)| (*k, c)));
        }
        buckets.extend(
            extra
                .iter()
                .copied()
                .filter(|((g, _), _)| chosen.contains(g)),
        );
        select::finish(crate::cycle::merge_counts(buckets), min, max)
    }

    /// Every bucket with `extra` merged in (for the cases [`SetIndex::select`] leaves to
    /// [`select::select`]).
    #[cfg(test)]
    pub(crate) fn materialize(&self, extra: &[BucketCount]) -> Vec<BucketCount> {
        let mut v: Vec<BucketCount> = self.buckets.iter().map(|(k, &c)| (*k, c)).collect();
        v.extend_from_slice(extra);
        crate::cycle::merge_counts(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts() -> impl Strategy<Value = Vec<BucketCount>> {
        prop::collection::vec(((0u32..12, 0u64..3), 1u32..9), 0..40)
            .prop_map(crate::cycle::merge_counts)
    }

    proptest! {
        /// The index chooses exactly what `select::select` chooses on the same counts, also
        /// after nodes were taken and with held nodes passed as extra.
        #[test]
        fn index_agrees_with_select(
            base in counts(),
            extra in prop::collection::vec(((0u32..12, 0u64..3), 1u32..4), 0..5),
            takes in prop::collection::vec((0usize..40, 1u32..4), 0..8),
            min in 1u32..30,
            more in 0u32..6,
        ) {
            let extra = crate::cycle::merge_counts(extra);
            let mut ix = SetIndex::new(&base);
            for (i, n) in takes {
                if let Some(&(k, c)) = base.get(i) {
                    ix.remove(k, n.min(c));
                }
            }
            let full = ix.materialize(&extra);
            let max = min + more;
            prop_assert_eq!(
                ix.select(&extra, min, max),
                select::select(&full, min, max, false, false)
            );
            prop_assert_eq!(
                ix.min_groups_needed(&extra, min),
                select::min_groups_needed(&full, min)
            );
            prop_assert_eq!(
                ix.largest_fingerprint(&extra),
                crate::cycle::largest_fingerprint_group(&full)
            );
        }
    }
}
