//! One scheduling cycle: order → filter → place (select) → reserve/backfill → preempt →
//! explain. Pure: the same catalog, snapshot and config always give the same `Plan`.

use std::collections::HashMap;

use crate::catalog::{FilterOutcome, NodeCatalog};
use crate::free_index::SetIndex;
use crate::model::{ClusterSnapshot, Constraints, JobId, NodeId, PendingJob, TenantId, Time};
use crate::plan::{
    PendingExplanation, PendingReason, Plan, Proposal, ProposalKind, QuotaKind, Reservation,
};
use crate::predict::{Predictor, RunningEnds};
use crate::preempt;
use crate::profile::{BackfillOrder, Discipline, QueueOrder, SchedulerConfig, SchedulerKind};
use crate::score;
use crate::select::{self, BucketCount};
use crate::terms::{self, Components, ScoreInput};

const NEVER: Time = Time::MAX;

/// A vCluster scheduler instance: configuration plus the pure cycle function.
#[derive(Debug, Clone)]
pub struct Scheduler {
    config: SchedulerConfig,
    external: ExternalScores,
}

/// Score terms computed outside the core for one cycle (the live controller's scheduler
/// extenders): each adds `weight × value` to `Score(j)` of the pending job at the same
/// index of `ClusterSnapshot::pending`. Empty, the cycle's scores are exactly the
/// registered terms' sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExternalScores {
    terms: Vec<ExternalTerm>,
}

/// One external term.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalTerm {
    /// Who computed it (for logs).
    pub name: String,
    pub weight: f64,
    /// Per pending job (snapshot order); missing entries count 0.
    pub values: Vec<f64>,
}

impl ExternalScores {
    /// Add a term.
    pub fn push(&mut self, term: ExternalTerm) {
        self.terms.push(term);
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// `Σ weight × value` of the pending job at `index`.
    fn sum(&self, index: usize) -> f64 {
        self.terms
            .iter()
            .map(|t| t.weight * t.values.get(index).copied().unwrap_or(0.0))
            .sum()
    }
}

/// Free nodes of one class in one (group, fingerprint) bucket; popped lowest id first.
#[derive(Debug)]
struct Bucket {
    key: (u32, u64),
    nodes: Vec<u32>,
}

/// Free, unreserved nodes of a scale-up's feasible classes that it may not take, by rule.
#[derive(Debug, Default)]
struct ScaleUpMiss {
    excluded: u32,
    other_fingerprint: u32,
    borrowed: u32,
}

impl ScaleUpMiss {
    fn any(&self) -> bool {
        self.excluded + self.other_fingerprint + self.borrowed > 0
    }
}

/// How one pass of a cycle plans runtimes (see [`crate::predict`]).
#[derive(Clone, Copy)]
pub(crate) struct Planning<'a> {
    /// Predicts runtimes: the backfill order, the expected start shown to users and,
    /// when `checks` is set, the backfill checks.
    predictor: Option<Predictor<'a>>,
    /// Backfill checks on predicted runtimes (false: on walltimes, EASY's guarantee).
    checks: bool,
    /// Running work, and work placed this cycle, is planned to end when predicted (else
    /// at its kill time).
    running_predicted: bool,
}

impl Planning<'_> {
    /// Walltimes everywhere: EASY and every policy without prediction.
    const WALLTIME: Planning<'static> = Planning {
        predictor: None,
        checks: false,
        running_predicted: false,
    };

    /// The runtime a pending job ranks by: its prediction, else its walltime.
    fn rank(&self, job: &PendingJob) -> i64 {
        match &self.predictor {
            Some(p) => p.pending(&job.runtime_key, job.walltime_s),
            None => job.walltime_s.max(1),
        }
    }

    /// The runtime a backfill check plans on.
    fn check(&self, job: &PendingJob) -> i64 {
        if self.checks {
            self.rank(job)
        } else {
            job.walltime_s.max(1)
        }
    }

    /// How long a job placed now holds its nodes, for later reservations.
    fn hold(&self, job: &PendingJob) -> i64 {
        if self.checks && self.running_predicted {
            self.rank(job)
        } else {
            job.walltime_s.max(1)
        }
    }

    /// When a running job's nodes are planned free: for reservations (`hold`) and as
    /// predicted (`expect`, shown to users).
    fn running(&self, r: &crate::model::RunningJob, now: Time) -> (Time, Time) {
        let kill = r.expected_end();
        let predicted = self.predictor.as_ref().map_or(kill, |p| {
            p.running_end(&r.runtime_key, r.start_time, now, r.walltime_s)
        });
        let hold = if self.checks && self.running_predicted {
            predicted
        } else {
            kill
        };
        (hold, predicted)
    }
}

/// When a job placed now is planned to end: `check` against reservations (a job may use
/// nodes held for one only if it ends before it starts), `hold` for when its nodes are
/// next free to later reservations, `expect` as predicted (the start times shown).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ends {
    check: Time,
    hold: Time,
    expect: Time,
}

impl Ends {
    /// One end for everything (walltime planning, preemption placements).
    pub(crate) fn at(t: Time) -> Ends {
        Ends {
            check: t,
            hold: t,
            expect: t,
        }
    }
}

/// Free nodes held for a reservation: usable only by jobs that end before `start`.
#[derive(Debug)]
struct Held {
    start: Time,
    nodes: Vec<u32>,
}

/// Mutable per-cycle view of node availability.
pub(crate) struct CycleState<'a> {
    pub(crate) cat: &'a NodeCatalog,
    pub(crate) now: Time,
    pub(crate) busy: Vec<bool>,
    /// When each node is next free (running jobs' expected ends, jobs started this cycle).
    avail: Vec<Time>,
    /// When each node is predicted free (as `avail` without prediction): the expected
    /// start times shown to users.
    expect: Vec<Time>,
    buckets: Vec<Bucket>,
    class_buckets: Vec<(usize, usize)>,
    pub(crate) class_free: Vec<u32>,
    held: Vec<Held>,
    held_by: Vec<u32>,
    intervals: HashMap<u32, Vec<(Time, Time)>>,
    /// The bucket of each (class, key): one per pair.
    bucket_of: HashMap<(u32, (u32, u64)), usize>,
    /// Free indexes of the class sets jobs were placed against (built on first use).
    indices: Vec<SetIndex>,
    index_of: HashMap<Vec<u32>, HashMap<Option<u64>, usize>>,
    /// Per class, the indexes that contain it (updated when its nodes are taken).
    class_indices: Vec<Vec<usize>>,
    /// The largest fingerprint group of a class set's schedulable inventory (which a cycle
    /// does not change).
    inventory_fp: HashMap<Vec<u32>, u32>,
    /// Node indexes of each running job (`snap.running` order).
    running_nodes: Vec<Vec<u32>>,
}

/// Which nodes of a selected bucket a job takes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeOrder {
    /// Lowest node first.
    Plain,
    /// GPU-to-NIC affinity, then GPU links, then memory locality.
    MultiNodeGpu,
    /// GPU links, then memory locality.
    SingleNodeGpu,
}

/// Feasibility of every class for one job.
pub(crate) struct Feasible {
    pub(crate) mask: Vec<bool>,
    pub(crate) borrowed: Vec<bool>,
    pub(crate) classes: Vec<u32>,
}

impl<'a> CycleState<'a> {
    /// Running jobs' nodes are busy whatever was predicted; `planning` says when they are
    /// planned free.
    fn new(cat: &'a NodeCatalog, snap: &ClusterSnapshot<'_>, planning: &Planning<'_>) -> Self {
        let n = cat.len();
        let now = snap.now;
        let mut busy = vec![false; n];
        let mut avail = vec![now; n];
        let mut expect = vec![now; n];
        let mut running_nodes = Vec::with_capacity(snap.running.len());
        for r in snap.running {
            let (hold, predicted) = planning.running(r, now);
            let nodes: Vec<u32> = r.nodes.iter().filter_map(|id| cat.index_of(*id)).collect();
            for &i in &nodes {
                busy[i as usize] = true;
                avail[i as usize] = hold.max(now);
                expect[i as usize] = predicted.max(now);
            }
            running_nodes.push(nodes);
        }
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut bucket_of: HashMap<(u32, (u32, u64)), usize> = HashMap::new();
        let mut class_buckets = Vec::with_capacity(cat.classes().len());
        let mut class_free = vec![0u32; cat.classes().len()];
        for (c, class) in cat.classes().iter().enumerate() {
            let first = buckets.len();
            if !class.key.schedulable {
                for &i in &class.members {
                    avail[i as usize] = NEVER;
                    expect[i as usize] = NEVER;
                }
                class_buckets.push((first, first));
                continue;
            }
            // Members are sorted by (group, fingerprint, id): a bucket's nodes are adjacent,
            // so a bucket is looked up once, not once per node.
            let mut current: Option<((u32, u64), usize)> = None;
            for &i in &class.members {
                if busy[i as usize] {
                    continue;
                }
                let node = cat.node(i);
                let key = (node.topology_group, node.conformance_fingerprint);
                let b = match current {
                    Some((k, b)) if k == key => b,
                    _ => {
                        let b = *bucket_of.entry((c as u32, key)).or_insert_with(|| {
                            buckets.push(Bucket {
                                key,
                                nodes: Vec::new(),
                            });
                            buckets.len() - 1
                        });
                        current = Some((key, b));
                        b
                    }
                };
                buckets[b].nodes.push(i);
                class_free[c] += 1;
            }
            // Members come in id order: reversed, a bucket pops its lowest id first.
            for b in &mut buckets[first..] {
                b.nodes.reverse();
            }
            class_buckets.push((first, buckets.len()));
        }
        CycleState {
            cat,
            now,
            busy,
            avail,
            expect,
            buckets,
            class_buckets,
            class_free,
            held: Vec::new(),
            held_by: vec![u32::MAX; n],
            intervals: HashMap::new(),
            bucket_of,
            indices: Vec::new(),
            index_of: HashMap::new(),
            class_indices: vec![Vec::new(); cat.classes().len()],
            inventory_fp: HashMap::new(),
            running_nodes,
        }
    }

    /// A free, unreserved node for one more node of a reactive allocation: of a feasible
    /// class (not borrowed when `home_only`), of the fingerprint asked, not excluded; in a
    /// group the allocation spans (in `near_groups` order), else in the group with the most
    /// such nodes (room to grow); the lowest node of that group. Without one, what kept the
    /// free feasible nodes out.
    fn pick_scale_up_node(
        &self,
        feas: &Feasible,
        grow: &crate::model::ScaleUp,
    ) -> Result<u32, ScaleUpMiss> {
        let exclude: std::collections::HashSet<NodeId> = grow.exclude.iter().copied().collect();
        let mut miss = ScaleUpMiss::default();
        let mut by_group: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for &c in &feas.classes {
            let (a, b) = self.class_buckets[c as usize];
            for bk in &self.buckets[a..b] {
                let free = bk.nodes.len() as u32;
                if grow.home_only && feas.borrowed[c as usize] {
                    miss.borrowed += free;
                    continue;
                }
                if grow.fingerprint.is_some_and(|f| f != bk.key.1) {
                    miss.other_fingerprint += free;
                    continue;
                }
                for &i in &bk.nodes {
                    if exclude.contains(&self.cat.node(i).id) {
                        miss.excluded += 1;
                    } else {
                        by_group.entry(bk.key.0).or_default().push(i);
                    }
                }
            }
        }
        let group = grow
            .near_groups
            .iter()
            .find(|g| by_group.contains_key(g))
            .copied()
            .or_else(|| {
                by_group
                    .iter()
                    .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                    .map(|(g, _)| *g)
            });
        group
            .and_then(|g| by_group.get(&g)?.iter().copied().min())
            .ok_or(miss)
    }

    /// Take the free node `i` (busy until `ends`).
    fn take_node(&mut self, i: u32, ends: Ends) {
        self.unindex_free(i);
        self.busy[i as usize] = true;
        self.avail[i as usize] = ends.hold;
        self.expect[i as usize] = ends.expect;
    }

    /// Node indexes of `snap.running[k]`.
    pub(crate) fn running_nodes(&self, k: usize) -> &[u32] {
        &self.running_nodes[k]
    }

    /// [`largest_fingerprint_group`] of `feas`'s schedulable inventory, once per class set.
    fn inventory_largest_fp(&mut self, feas: &Feasible) -> u32 {
        if let Some(&l) = self.inventory_fp.get(&feas.classes) {
            return l;
        }
        let l = largest_fingerprint_group(&self.inventory_counts(feas));
        self.inventory_fp.insert(feas.classes.clone(), l);
        l
    }

    /// [`largest_fingerprint_group`] of [`CycleState::counts`], through the free index.
    fn free_largest_fp(&mut self, feas: &Feasible, end: Option<Time>) -> u32 {
        let extra = self.held_extra(feas, end);
        let id = self.index_for(feas, None);
        self.indices[id].largest_fingerprint(&extra)
    }

    /// The free index of `feas`'s classes (of one fingerprint's nodes only, with `fp`),
    /// built on first use.
    fn index_for(&mut self, feas: &Feasible, fp: Option<u64>) -> usize {
        // Looked up by slice: the class list is cloned only when an index is built.
        if let Some(&id) = self
            .index_of
            .get(feas.classes.as_slice())
            .and_then(|by_fp| by_fp.get(&fp))
        {
            return id;
        }
        let mut counts = self.counts(feas, None);
        if let Some(fp) = fp {
            counts.retain(|((_, f), _)| *f == fp);
        }
        let id = self.indices.len();
        self.indices.push(SetIndex::new(&counts));
        self.index_of
            .entry(feas.classes.clone())
            .or_default()
            .insert(fp, id);
        for &c in &feas.classes {
            self.class_indices[c as usize].push(id);
        }
        id
    }

    /// `n` free nodes of class `c` in bucket `key` left the free pool.
    fn unindex(&mut self, c: u32, key: (u32, u64), n: u32) {
        self.class_free[c as usize] -= n;
        for &id in &self.class_indices[c as usize] {
            self.indices[id].remove(key, n);
        }
    }

    /// Held nodes a job ending at `end` may use, per bucket.
    fn held_extra(&self, feas: &Feasible, end: Option<Time>) -> Vec<BucketCount> {
        let Some(end) = end else {
            return Vec::new();
        };
        let mut out: Vec<BucketCount> = Vec::new();
        for h in self.held.iter().filter(|h| h.start >= end) {
            for &i in &h.nodes {
                if feas.mask[self.cat.class_of(i) as usize] {
                    let n = self.cat.node(i);
                    out.push(((n.topology_group, n.conformance_fingerprint), 1));
                }
            }
        }
        merge_counts(out)
    }

    /// [`select::select`] on [`CycleState::counts`], through the free index in the common
    /// case (no single fingerprint required, no bin-packing).
    fn select_for(
        &mut self,
        feas: &Feasible,
        end: Option<Time>,
        min: u32,
        max: u32,
        same_fp: bool,
        binpack: bool,
    ) -> Option<select::Selection> {
        if binpack || min == 0 {
            return select::select(&self.counts(feas, end), min, max, same_fp, binpack);
        }
        let extra = self.held_extra(feas, end);
        let id = self.index_for(feas, None);
        if !same_fp {
            return self.indices[id].select(&extra, min, max);
        }
        // One fingerprint (`select::select` with `same_fingerprint`): per fingerprint with
        // enough nodes, its own index; fewest groups, then the largest fingerprint.
        let mut fps: Vec<(u64, u32)> = self.indices[id].fingerprint_totals(&extra);
        fps.sort_unstable();
        let mut best: Option<(u32, u32, select::Selection)> = None;
        for (fp, total) in fps {
            if total < min {
                continue;
            }
            let sub: Vec<BucketCount> = extra
                .iter()
                .copied()
                .filter(|((_, f), _)| *f == fp)
                .collect();
            let fid = self.index_for(feas, Some(fp));
            if let Some(sel) = self.indices[fid].select(&sub, min, max) {
                let fit = u32::MAX - total;
                if best
                    .as_ref()
                    .is_none_or(|(g, f, _)| (sel.groups, fit) < (*g, *f))
                {
                    best = Some((sel.groups, fit, sel));
                }
            }
        }
        best.map(|(_, _, s)| s)
    }

    /// [`select::min_groups_needed`] on [`CycleState::counts`], through the free index.
    fn min_groups_needed(&mut self, feas: &Feasible, end: Option<Time>, need: u32) -> Option<u32> {
        let extra = self.held_extra(feas, end);
        let id = self.index_for(feas, None);
        self.indices[id].min_groups_needed(&extra, need)
    }

    pub(crate) fn feasible(&self, job: &PendingJob) -> Feasible {
        let k = self.cat.classes().len();
        let mut f = Feasible {
            mask: vec![false; k],
            borrowed: vec![false; k],
            classes: Vec::new(),
        };
        for c in 0..k as u32 {
            if let FilterOutcome::Feasible { borrowed } = self.cat.filter(c, job) {
                f.mask[c as usize] = true;
                f.borrowed[c as usize] = borrowed;
                f.classes.push(c);
            }
        }
        f
    }

    /// Cumulative subsets of the feasible classes by *excess*: how many capabilities a class
    /// offers that the job did not ask for (GPUs, unified memory, CXL memory, extra
    /// features) plus one when it is borrowed. The last tier is every feasible class.
    fn tiers(&self, feas: &Feasible, job: &PendingJob) -> Vec<Feasible> {
        let c = &job.constraints;
        let excess = |k: u32| -> usize {
            let key = &self.cat.classes()[k as usize].key;
            usize::from(feas.borrowed[k as usize])
                + usize::from(key.gpus > 0 && c.min_gpus_per_node == 0 && c.gpu_type.is_none())
                + usize::from(key.unified_memory && !c.require_unified_memory)
                + usize::from(key.cxl_memory_gb > 0 && !c.allow_cxl_memory)
                + extra_features(&key.features, c)
        };
        let levels: Vec<usize> = {
            let mut l: Vec<usize> = feas.classes.iter().map(|&k| excess(k)).collect();
            l.sort_unstable();
            l.dedup();
            l
        };
        let mut out = Vec::with_capacity(levels.len().min(3));
        // At most two narrower tiers before the full set keeps the cost bounded.
        for &level in levels.iter().take(levels.len().saturating_sub(1)).take(2) {
            let classes: Vec<u32> = feas
                .classes
                .iter()
                .copied()
                .filter(|&k| excess(k) <= level)
                .collect();
            let mut mask = vec![false; feas.mask.len()];
            for &k in &classes {
                mask[k as usize] = true;
            }
            out.push(Feasible {
                mask,
                borrowed: feas.borrowed.clone(),
                classes,
            });
        }
        out
    }

    /// Free feasible nodes per (group, fingerprint): unreserved ones plus those held by
    /// reservations that start no earlier than `end`.
    fn counts(&self, feas: &Feasible, end: Option<Time>) -> Vec<BucketCount> {
        let mut out: Vec<BucketCount> = Vec::new();
        for &c in &feas.classes {
            let (a, b) = self.class_buckets[c as usize];
            for bk in &self.buckets[a..b] {
                if !bk.nodes.is_empty() {
                    out.push((bk.key, bk.nodes.len() as u32));
                }
            }
        }
        out.extend(self.held_extra(feas, end));
        merge_counts(out)
    }

    /// All schedulable feasible nodes per (group, fingerprint), free or not.
    fn inventory_counts(&self, feas: &Feasible) -> Vec<BucketCount> {
        let out: Vec<BucketCount> = feas
            .classes
            .iter()
            .flat_map(|&c| self.cat.classes()[c as usize].inventory.iter().copied())
            .collect();
        merge_counts(out)
    }

    pub(crate) fn free_unreserved(&self, feas: &Feasible) -> u32 {
        feas.classes
            .iter()
            .map(|&c| self.class_free[c as usize])
            .sum()
    }

    fn held_feasible(&self, feas: &Feasible, end: Option<Time>) -> u32 {
        self.held
            .iter()
            .filter(|h| end.is_none_or(|e| h.start >= e))
            .flat_map(|h| h.nodes.iter())
            .filter(|&&i| feas.mask[self.cat.class_of(i) as usize])
            .count() as u32
    }

    /// Remove the selected nodes from the free index (held pools first, so unreserved nodes
    /// stay available for long backfill candidates) and mark them busy until `end`.
    fn take(&mut self, feas: &Feasible, sel: &select::Selection, end: Time) -> Vec<u32> {
        self.take_ordered(feas, sel, Ends::at(end), NodeOrder::Plain)
    }

    /// [`CycleState::take`], with the nodes of each selected bucket taken from the classes
    /// that suit a GPU job best first: for multi-node GPU work the best GPU-to-NIC affinity
    /// (inter-node traffic leaves through those NICs), then GPU links, then memory locality;
    /// for single-node GPU work GPU links, then memory locality (the seed's intra-node
    /// placement). Groups and fingerprints are chosen before, by topology.
    fn take_ordered(
        &mut self,
        feas: &Feasible,
        sel: &select::Selection,
        ends: Ends,
        order: NodeOrder,
    ) -> Vec<u32> {
        let end = ends.check;
        let classes: Vec<u32> = if order == NodeOrder::Plain {
            feas.classes.clone()
        } else {
            let mut c = feas.classes.clone();
            let key = |k: u32| {
                let cl = &self.cat.classes()[k as usize];
                let nic = if order == NodeOrder::MultiNodeGpu {
                    cl.nic_affinity
                } else {
                    1.0
                };
                (nic, cl.gpu_link_fitness, cl.memory_locality)
            };
            // Best first; stable, so equal classes keep their order.
            c.sort_by(|a, b| {
                let (ka, kb) = (key(*a), key(*b));
                kb.0.total_cmp(&ka.0)
                    .then(kb.1.total_cmp(&ka.1))
                    .then(kb.2.total_cmp(&ka.2))
            });
            c
        };
        let mut out = Vec::with_capacity(sel.total() as usize);
        for &(key, mut n) in &sel.take {
            for h in self.held.iter_mut().filter(|h| h.start >= end) {
                let mut j = 0;
                while j < h.nodes.len() && n > 0 {
                    let i = h.nodes[j];
                    let node = self.cat.node(i);
                    if feas.mask[self.cat.class_of(i) as usize]
                        && (node.topology_group, node.conformance_fingerprint) == key
                    {
                        h.nodes.remove(j);
                        out.push(i);
                        n -= 1;
                    } else {
                        j += 1;
                    }
                }
            }
            for &c in &classes {
                if n == 0 {
                    break;
                }
                let Some(&b) = self.bucket_of.get(&(c, key)) else {
                    continue;
                };
                let mut popped = 0;
                while n > 0 {
                    let Some(i) = self.buckets[b].nodes.pop() else {
                        break;
                    };
                    out.push(i);
                    popped += 1;
                    n -= 1;
                }
                if popped > 0 {
                    self.unindex(c, key, popped);
                }
            }
        }
        for &i in &out {
            self.busy[i as usize] = true;
            self.avail[i as usize] = ends.hold;
            self.expect[i as usize] = ends.expect;
            self.held_by[i as usize] = u32::MAX;
        }
        out
    }

    /// Mark nodes (freed by preemption victims) as committed to a new job.
    pub(crate) fn commit_busy(&mut self, nodes: &[u32], ends: Ends) {
        for &i in nodes {
            self.avail[i as usize] = ends.hold;
            self.expect[i as usize] = ends.expect;
        }
    }

    /// The start shown to users for a reservation at `start` on `reserved`: when its
    /// nodes are all predicted free, unless earlier reservations hold it back further.
    fn expected_start(&self, reserved: &[u32], start: Time) -> Time {
        let max = |v: &[Time]| reserved.iter().map(|&i| v[i as usize]).max();
        match (max(&self.avail), max(&self.expect)) {
            (Some(free), Some(predicted)) if start <= free => predicted.clamp(self.now, start),
            _ => start,
        }
    }

    /// Earliest start for `need` feasible nodes for `duration`, honouring earlier
    /// reservations. Chooses the nodes that free up last, so nodes free now stay available
    /// to backfill (this is what makes depth 1 behave exactly like EASY's "extra" nodes).
    fn reserve(&mut self, feas: &Feasible, need: u32, duration: i64) -> Option<(Time, Vec<u32>)> {
        let mut cand: Vec<(Time, bool, u32)> = Vec::new();
        for &c in &feas.classes {
            for &i in &self.cat.classes()[c as usize].members {
                let a = self.avail[i as usize];
                if a != NEVER {
                    cand.push((a, self.busy[i as usize], i));
                }
            }
        }
        let need_us = need as usize;
        if need == 0 || cand.len() < need_us {
            return None;
        }
        cand.sort_unstable();
        let first_t = cand[need_us - 1].0;
        let conflicts = |i: u32, t: Time| {
            self.intervals.get(&i).is_some_and(|v| {
                v.iter()
                    .any(|&(s, e)| s < t.saturating_add(duration) && t < e)
            })
        };
        let chosen: Option<(Time, Vec<u32>)> = if self.intervals.is_empty() {
            let k = cand.partition_point(|c| c.0 <= first_t);
            Some((first_t, cand[k - need_us..k].iter().map(|c| c.2).collect()))
        } else {
            let mut times: Vec<Time> = cand.iter().map(|c| c.0).filter(|&t| t >= first_t).collect();
            for &c in &feas.classes {
                for &i in &self.cat.classes()[c as usize].members {
                    if let Some(v) = self.intervals.get(&i) {
                        times.extend(v.iter().map(|&(_, e)| e).filter(|&e| e >= first_t));
                    }
                }
            }
            times.sort_unstable();
            times.dedup();
            let mut found = None;
            for t in times {
                let k = cand.partition_point(|c| c.0 <= t);
                let ok: Vec<u32> = cand[..k]
                    .iter()
                    .rev()
                    .filter(|c| !conflicts(c.2, t))
                    .take(need_us)
                    .map(|c| c.2)
                    .collect();
                if ok.len() == need_us {
                    found = Some((t, ok));
                    break;
                }
            }
            found
        };
        let (start, mut nodes) = chosen?;
        nodes.sort_unstable();
        let slot = self.held.len() as u32;
        self.held.push(Held {
            start,
            nodes: Vec::new(),
        });
        for &i in &nodes {
            self.intervals
                .entry(i)
                .or_default()
                .push((start, start.saturating_add(duration)));
            if self.busy[i as usize] {
                continue;
            }
            let prev = self.held_by[i as usize];
            if prev == u32::MAX {
                self.unindex_free(i);
            } else if self.held[prev as usize].start > start {
                self.held[prev as usize].nodes.retain(|&x| x != i);
            } else {
                continue;
            }
            self.held_by[i as usize] = slot;
            self.held[slot as usize].nodes.push(i);
        }
        Some((start, nodes))
    }

    fn unindex_free(&mut self, i: u32) {
        let c = self.cat.class_of(i);
        let node = self.cat.node(i);
        let key = (node.topology_group, node.conformance_fingerprint);
        let Some(&b) = self.bucket_of.get(&(c, key)) else {
            return;
        };
        let bk = &mut self.buckets[b];
        if let Some(p) = bk.nodes.iter().position(|&x| x == i) {
            bk.nodes.remove(p);
            self.unindex(c, key, 1);
        }
    }

    /// Unreserved free nodes of feasible classes, as node indices (preemption needs them).
    pub(crate) fn free_counts(&self, feas: &Feasible) -> Vec<BucketCount> {
        self.counts(feas, None)
    }

    pub(crate) fn take_free(
        &mut self,
        feas: &Feasible,
        key: (u32, u64),
        n: u32,
        end: Time,
    ) -> Vec<u32> {
        let sel = select::Selection {
            take: vec![(key, n)],
            groups: 1,
            largest_conformance: n,
        };
        // `None` end: held pools are never raided for preemption placements.
        let held = std::mem::take(&mut self.held);
        let out = self.take(feas, &sel, end);
        self.held = held;
        out
    }
}

/// How many of a feasible node class's (sorted) features the job asked for neither in
/// `features` nor in an `anyOf` group: the capabilities it would keep from jobs that need
/// them.
fn extra_features(class_features: &[String], c: &Constraints) -> usize {
    if c.any_of.is_empty() {
        // The class is feasible, so it has every feature the job asked for.
        return class_features.len().saturating_sub(c.features.len());
    }
    class_features
        .iter()
        .filter(|f| !c.features.contains(f) && !c.any_of.iter().any(|g| g.contains(f)))
        .count()
}

pub(crate) fn merge_counts(mut v: Vec<BucketCount>) -> Vec<BucketCount> {
    v.sort_unstable_by_key(|e| e.0);
    let mut out: Vec<BucketCount> = Vec::with_capacity(v.len());
    for (k, c) in v {
        match out.last_mut() {
            Some((lk, lc)) if *lk == k => *lc += c,
            _ => out.push((k, c)),
        }
    }
    out
}

/// Inventory-derived scoring inputs shared by jobs with the same feasible classes.
pub(crate) struct Inventory {
    /// Schedulable node count per dragonfly group, largest first.
    group_sizes: Vec<u32>,
    largest_fp: u32,
}

/// Per-tenant counters for hard quotas, updated as the cycle places jobs.
struct QuotaLedger {
    nodes: HashMap<TenantId, u32>,
    allocations: HashMap<TenantId, u32>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler {
            config,
            external: ExternalScores::default(),
        }
    }

    /// This cycle's external score terms (scheduler extenders).
    pub fn with_external_scores(mut self, external: ExternalScores) -> Self {
        self.external = external;
        self
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Every score term of every job in `snap.pending` against the current free index (no
    /// placement), in registry order ([`terms::REGISTRY`]).
    pub fn components(&self, catalog: &NodeCatalog, snap: &ClusterSnapshot<'_>) -> Vec<Components> {
        let state = CycleState::new(catalog, snap, &Planning::WALLTIME);
        let f6 = backlog(snap);
        let mut cache = HashMap::new();
        snap.pending
            .iter()
            .map(|j| Components::of(&self.score_input(&state, snap, j, f6, &mut cache)))
            .collect()
    }

    /// What the score terms read about `job`.
    fn score_input<'s>(
        &self,
        state: &CycleState<'_>,
        snap: &'s ClusterSnapshot<'s>,
        job: &'s PendingJob,
        f6: f64,
        cache: &mut HashMap<Vec<u32>, Inventory>,
    ) -> ScoreInput<'s> {
        let feas = state.feasible(job);
        // Topology and conformance fitness are scored against the schedulable inventory the
        // job could use, not against the nodes free this instant: otherwise a blocked large
        // job would sink in the queue exactly when it most needs its reservation. Jobs with
        // the same feasible classes share that inventory, so it is computed once per set.
        let inv = cache.entry(feas.classes.clone()).or_insert_with(|| {
            let counts = state.inventory_counts(&feas);
            let mut groups: Vec<(u32, u32)> = Vec::new();
            for &((g, _), c) in &counts {
                match groups.last_mut() {
                    Some((lg, lc)) if *lg == g => *lc += c,
                    _ => groups.push((g, c)),
                }
            }
            let mut group_sizes: Vec<u32> = groups.iter().map(|g| g.1).collect();
            group_sizes.sort_unstable_by(|a, b| b.cmp(a));
            Inventory {
                group_sizes,
                largest_fp: largest_fingerprint_group(&counts),
            }
        });
        let need = job.nodes.min;
        let groups_needed = {
            let mut acc = 0u32;
            inv.group_sizes
                .iter()
                .position(|&c| {
                    acc += c;
                    acc >= need
                })
                .map(|p| p as u32 + 1)
        };
        let intra = feas
            .classes
            .iter()
            .map(|&c| {
                let cl = &state.cat.classes()[c as usize];
                score::f4_intra_node(
                    cl.gpu_link_fitness,
                    cl.memory_locality,
                    job.constraints.gpu_heavy,
                )
            })
            .fold(0.0, f64::max);
        ScoreInput {
            job,
            snap,
            tenant: snap.tenant(job.tenant),
            reference_wait_s: self.config.reference_wait_s,
            backlog: f6,
            groups_needed,
            groups_available: inv.group_sizes.len() as u32,
            intra_node: intra,
            largest_conformance: inv.largest_fp,
        }
    }

    /// Run one cycle. `catalog` must describe the nodes the snapshot's jobs refer to.
    ///
    /// With runtime prediction on, the cycle plans backfill on predicted runtimes; if the
    /// job that got the first reservation (EASY's head) has waited longer than the
    /// profile's `guarantee_after_s`, the cycle is planned again on walltimes, so that job
    /// gets EASY's guarantee: nothing started behind it can delay it, however wrong a
    /// prediction.
    pub fn cycle(&self, catalog: &NodeCatalog, snap: &ClusterSnapshot<'_>) -> Plan {
        let cfg = &self.config.prediction;
        let Some(predictor) = Predictor::new(cfg, snap.history) else {
            return self.plan(catalog, snap, Planning::WALLTIME);
        };
        let planning = Planning {
            predictor: Some(predictor),
            checks: true,
            running_predicted: cfg.running_ends == RunningEnds::Predicted,
        };
        let plan = self.plan(catalog, snap, planning);
        let starving = |guard: i64| {
            plan.reservations.first().is_some_and(|r| {
                snap.pending
                    .iter()
                    .find(|j| j.id == r.job)
                    .is_some_and(|j| snap.now.saturating_sub(j.submit_time) > guard)
            })
        };
        match cfg.guarantee_after_s {
            Some(guard) if starving(guard) => self.plan(
                catalog,
                snap,
                // The order of the backfill candidates still comes from the predictions.
                Planning {
                    checks: false,
                    ..planning
                },
            ),
            _ => plan,
        }
    }

    fn plan(
        &self,
        catalog: &NodeCatalog,
        snap: &ClusterSnapshot<'_>,
        planning: Planning<'_>,
    ) -> Plan {
        let cfg = &self.config;
        let now = snap.now;
        let mut state = CycleState::new(catalog, snap, &planning);
        let mut plan = Plan {
            now,
            ..Plan::default()
        };

        // Queue order.
        let mut order: Vec<(f64, usize)> = snap
            .pending
            .iter()
            .enumerate()
            .filter(|(_, j)| cfg.vcluster.is_none_or(|v| v == j.vcluster))
            .map(|(i, _)| (0.0, i))
            .collect();
        if cfg.order == QueueOrder::Score || cfg.backfill_order == BackfillOrder::Score {
            let f6 = backlog(snap);
            let mut cache = HashMap::new();
            for o in &mut order {
                let j = &snap.pending[o.1];
                let input = self.score_input(&state, snap, j, f6, &mut cache);
                let budget = snap.tenant(j.tenant).and_then(|t| t.usage.budget_used);
                let mut sum = terms::weighted_sum(&input, &cfg.weights);
                // Only with extenders: without, the sum is the registered terms' alone.
                if !self.external.is_empty() {
                    sum += self.external.sum(o.1);
                }
                o.0 = sum * score::budget_factor(budget);
            }
        }
        if cfg.order == QueueOrder::Score {
            order.sort_by(|a, b| {
                let (ja, jb) = (&snap.pending[a.1], &snap.pending[b.1]);
                b.0.total_cmp(&a.0)
                    .then(ja.submit_time.cmp(&jb.submit_time))
                    .then(ja.id.cmp(&jb.id))
            });
        } else {
            order.sort_by_key(|&(_, i)| (snap.pending[i].submit_time, snap.pending[i].id));
        }
        // Burst allowance: a tenant at or beyond `burst_allowance` × its target share is
        // considered after everyone else (it bursts only on capacity nobody else asked for);
        // the sort is stable, so each part keeps its order.
        let over_burst = |i: usize| {
            snap.tenant(snap.pending[i].tenant)
                .is_some_and(|t| t.over_burst())
        };
        if order.iter().any(|&(_, i)| over_burst(i)) {
            order.sort_by_key(|&(_, i)| over_burst(i));
        }

        let mut ledger = QuotaLedger {
            nodes: HashMap::new(),
            allocations: HashMap::new(),
        };
        for r in snap.running {
            *ledger.nodes.entry(r.tenant).or_default() += r.nodes.len() as u32;
            *ledger.allocations.entry(r.tenant).or_default() += 1;
        }

        let depth = match cfg.discipline {
            Discipline::Backfill { depth } => depth,
            _ => 0,
        };
        let mut blocked: Option<JobId> = None;
        let mut reservations = 0usize;
        let mut preempt_attempts = 0usize;
        let mut victims_taken: Vec<JobId> = Vec::new();
        let binpack = cfg.kind == SchedulerKind::ServiceBinpack;
        // Jobs whose victims are still stopping (a preemption under way, decided in an
        // earlier cycle): they wait for those nodes rather than choose more victims.
        let mut stopping_for: HashMap<JobId, u32> = HashMap::new();
        for r in snap.running {
            if let Some(j) = r.preempted_for {
                *stopping_for.entry(j).or_default() += 1;
            }
        }

        let mut next = 0;
        while next < order.len() {
            let (score_value, idx) = order[next];
            next += 1;
            let job = &snap.pending[idx];
            let explain = |plan: &mut Plan, reason: PendingReason| {
                if cfg.explain {
                    plan.pending.push(PendingExplanation {
                        job: job.id,
                        reason,
                    });
                }
            };
            if let Some(b) = blocked {
                explain(&mut plan, PendingReason::WaitingBehind { job: b });
                continue;
            }
            let max_take = match quota_check(snap, &ledger, job) {
                Ok(m) => m,
                Err(reason) => {
                    explain(&mut plan, reason);
                    continue;
                }
            };
            let need = job.nodes.min;
            let want = job.nodes.max.max(need).min(max_take);
            // Backfill checks plan on `end`; the job's kill time stays its walltime.
            let ends = Ends {
                check: now.saturating_add(planning.check(job)),
                hold: now.saturating_add(planning.hold(job)),
                expect: now.saturating_add(planning.rank(job)),
            };
            let end = ends.check;
            if let Some(grow) = &job.scale_up {
                // One more node of a running reactive allocation, scored in this order like
                // any job: a free node it may use, near the groups it spans. It reserves and
                // preempts nothing (the allocation runs already).
                let feas = state.feasible(job);
                match state.pick_scale_up_node(&feas, grow) {
                    Ok(i) => {
                        state.take_node(i, ends);
                        *ledger.nodes.entry(job.tenant).or_default() += 1;
                        let node = catalog.node(i);
                        plan.proposals.push(Proposal {
                            job: job.id,
                            nodes: vec![node.id],
                            kind: ProposalKind::ScaleUp,
                            score: score_value,
                            borrowed_nodes: 0,
                            groups: 1,
                        });
                    }
                    // Free feasible nodes, none it may take: say which rule kept them out
                    // (not "occupied", which would send the user looking for busy nodes).
                    Err(miss) if miss.any() => explain(
                        &mut plan,
                        PendingReason::NoScaleUpNode {
                            excluded: miss.excluded,
                            other_fingerprint: miss.other_fingerprint,
                            borrowed: miss.borrowed,
                        },
                    ),
                    Err(_) => {
                        let reason = diagnose(&mut state, &feas, job, end, false);
                        explain(&mut plan, reason);
                    }
                }
                continue;
            }
            let same_fp = job.constraints.require_conformance
                || job.sensitive
                || cfg.kind == SchedulerKind::SensitiveReservation;
            let feas = state.feasible(job);

            // Try the nodes with the least the job did not ask for first (no special memory,
            // no extra features, not borrowed), so special hardware and other vClusters' nodes
            // stay available for the jobs that need them; fall back to every feasible node.
            let narrower = state.tiers(&feas, job);
            // A narrower tier is taken only if it spans no more dragonfly groups than the
            // full feasible set would need: topology beats keeping special nodes free.
            // (Computed only when a narrower tier found nodes.)
            let mut full_groups: Option<Option<u32>> = None;
            let mut selection = None;
            for tier in narrower.iter().chain(std::iter::once(&feas)) {
                let fast_total = state.free_unreserved(tier) + state.held_feasible(tier, Some(end));
                if fast_total >= need {
                    let sel = state.select_for(tier, Some(end), need, want, same_fp, binpack);
                    if let Some(sel) = sel {
                        let is_full = std::ptr::eq(tier, &feas);
                        let within = is_full || {
                            let g = *full_groups.get_or_insert_with(|| {
                                state.min_groups_needed(&feas, Some(end), need)
                            });
                            g.is_none_or(|g| sel.groups <= g)
                        };
                        if within {
                            selection = Some((sel, tier));
                            break;
                        }
                    }
                }
            }
            if let Some((sel, tier)) = selection {
                let unreserved_before = state.free_unreserved(&feas);
                let order = match (job.constraints.min_gpus_per_node > 0, need > 1) {
                    (false, _) => NodeOrder::Plain,
                    (true, true) => NodeOrder::MultiNodeGpu,
                    (true, false) => NodeOrder::SingleNodeGpu,
                };
                let taken = state.take_ordered(tier, &sel, ends, order);
                let borrowed = taken
                    .iter()
                    .filter(|&&i| feas.borrowed[catalog.class_of(i) as usize])
                    .count() as u32;
                let used_reserved_gap =
                    unreserved_before - state.free_unreserved(&feas) < taken.len() as u32;
                let kind = if cfg.kind == SchedulerKind::SensitiveReservation {
                    ProposalKind::Claim
                } else if reservations > 0 || used_reserved_gap {
                    ProposalKind::Backfill
                } else {
                    ProposalKind::Start
                };
                *ledger.nodes.entry(job.tenant).or_default() += taken.len() as u32;
                *ledger.allocations.entry(job.tenant).or_default() += 1;
                plan.proposals.push(proposal(
                    catalog,
                    job.id,
                    &taken,
                    kind,
                    score_value,
                    borrowed,
                    sel.groups,
                ));
                continue;
            }

            if let Some(&victims) = stopping_for.get(&job.id) {
                if cfg.discipline == Discipline::Strict {
                    blocked = Some(job.id);
                }
                explain(&mut plan, PendingReason::WaitingForPreemption { victims });
                continue;
            }

            // Preemption: only downward, bounded attempts per cycle. A vCluster takes back
            // its lent home nodes whatever its preemption policy.
            let class_based = cfg.preemption.enabled && job.preemption_class > 0;
            if preempt_attempts < cfg.preemption.max_attempts_per_cycle
                && (class_based || lent_out(snap, catalog, job))
            {
                preempt_attempts += 1;
                if let Some(p) = preempt::try_preempt(
                    &cfg.preemption,
                    &mut state,
                    snap,
                    job,
                    &feas,
                    &victims_taken,
                    same_fp,
                    class_based,
                ) {
                    victims_taken.extend(p.victims.iter().copied());
                    state.commit_busy(&p.nodes, ends);
                    *ledger.nodes.entry(job.tenant).or_default() += p.nodes.len() as u32;
                    *ledger.allocations.entry(job.tenant).or_default() += 1;
                    plan.proposals.push(proposal(
                        catalog,
                        job.id,
                        &p.nodes,
                        ProposalKind::Preempt {
                            victims: p.victims,
                            reclaim: p.reclaim,
                        },
                        score_value,
                        0,
                        p.groups,
                    ));
                    continue;
                }
            }

            let reason = diagnose(&mut state, &feas, job, end, same_fp);
            let occupancy = matches!(
                reason,
                PendingReason::NodesOccupied { .. } | PendingReason::BlockedByReservation { .. }
            );
            let reason = if occupancy {
                with_budget_penalty(snap, job, reason)
            } else {
                reason
            };
            match cfg.discipline {
                Discipline::Strict => {
                    blocked = Some(job.id);
                    explain(&mut plan, reason);
                }
                Discipline::Greedy => explain(&mut plan, reason),
                Discipline::Backfill { .. } => {
                    if occupancy && reservations < depth {
                        let duration = ends.hold.saturating_sub(now);
                        if let Some((start, nodes)) = state.reserve(&feas, need, duration) {
                            reservations += 1;
                            let expected = if planning.checks {
                                state.expected_start(&nodes, start)
                            } else {
                                start
                            };
                            plan.reservations.push(Reservation {
                                job: job.id,
                                start,
                                expected,
                                nodes: nodes.iter().map(|&i| catalog.node(i).id).collect(),
                            });
                            explain(
                                &mut plan,
                                PendingReason::Reserved {
                                    start: expected,
                                    predicted: planning.checks,
                                },
                            );
                            if reservations == depth {
                                // Every job behind the reservations is a backfill
                                // candidate: they are tried in the backfill order.
                                backfill_order(cfg, snap, &mut order[next..], |j| planning.rank(j));
                            }
                            continue;
                        }
                    }
                    explain(&mut plan, reason);
                }
            }
        }
        plan
    }
}

/// Sort the backfill candidates `rest` (in queue order, with their scores when the
/// backfill order needs them) into the profile's backfill order, by `runtime` (the
/// predicted runtime when prediction is on); ties keep the queue order (stable sorts).
fn backfill_order(
    cfg: &SchedulerConfig,
    snap: &ClusterSnapshot<'_>,
    rest: &mut [(f64, usize)],
    runtime: impl Fn(&PendingJob) -> i64,
) {
    let job = |i: usize| &snap.pending[i];
    match cfg.backfill_order {
        BackfillOrder::Queue => {}
        BackfillOrder::Fcfs => rest.sort_by_key(|&(_, i)| (job(i).submit_time, job(i).id)),
        BackfillOrder::Score => rest.sort_by(|a, b| b.0.total_cmp(&a.0)),
        BackfillOrder::Shortest => rest.sort_by_cached_key(|&(_, i)| runtime(job(i))),
        BackfillOrder::SmallestArea => rest.sort_by_cached_key(|&(_, i)| {
            i128::from(job(i).nodes.min.max(1)) * i128::from(runtime(job(i)))
        }),
        BackfillOrder::BestFit => rest
            .sort_by_cached_key(|&(_, i)| (std::cmp::Reverse(job(i).nodes.min), runtime(job(i)))),
    }
}

/// Whether some running job of another vCluster holds a node homed at `job`'s vCluster.
fn lent_out(snap: &ClusterSnapshot<'_>, cat: &NodeCatalog, job: &PendingJob) -> bool {
    snap.running
        .iter()
        .any(|r| preempt::reclaimable(cat, r, job))
}

fn proposal(
    cat: &NodeCatalog,
    job: JobId,
    nodes: &[u32],
    kind: ProposalKind,
    score: f64,
    borrowed_nodes: u32,
    groups: u32,
) -> Proposal {
    let mut ids: Vec<NodeId> = nodes.iter().map(|&i| cat.node(i).id).collect();
    ids.sort_unstable();
    Proposal {
        job,
        nodes: ids,
        kind,
        score,
        borrowed_nodes,
        groups,
    }
}

/// f₆ inputs: node(GPU)-hours queued vs running.
fn backlog(snap: &ClusterSnapshot<'_>) -> f64 {
    // Integer GPU-seconds: the sum must not depend on the order jobs arrive in.
    let queued: u128 = snap
        .pending
        .iter()
        .map(|j| {
            u128::from(j.nodes.min) * u128::from(j.gpus_per_node()) * j.walltime_s.max(0) as u128
        })
        .sum();
    let running: u128 = snap
        .running
        .iter()
        .map(|r| {
            r.nodes.len() as u128 * u128::from(r.gpus_per_node.max(1)) * r.walltime_s.max(0) as u128
        })
        .sum();
    score::f6_backlog(queued as f64 / 3600.0, running as f64 / 3600.0)
}

/// Hard quotas as filters: returns how many nodes the job may take at most.
fn quota_check(
    snap: &ClusterSnapshot<'_>,
    ledger: &QuotaLedger,
    job: &PendingJob,
) -> Result<u32, PendingReason> {
    let Some(t) = snap.tenant(job.tenant) else {
        return Ok(u32::MAX);
    };
    let mut max_take = u32::MAX;
    // A scale-up adds a node to an allocation that already runs: no new allocation.
    let new_allocation = job.scale_up.is_none();
    if let (true, Some(limit)) = (new_allocation, t.quota.max_concurrent_allocations) {
        let current = ledger.allocations.get(&job.tenant).copied().unwrap_or(0);
        if current + 1 > limit {
            return Err(PendingReason::QuotaHeadroom {
                quota: QuotaKind::MaxConcurrentAllocations,
                current,
                requested: 1,
                limit,
            });
        }
    }
    if let Some(limit) = t.quota.max_nodes {
        let current = ledger.nodes.get(&job.tenant).copied().unwrap_or(0);
        if current.saturating_add(job.nodes.min) > limit {
            return Err(PendingReason::QuotaHeadroom {
                quota: QuotaKind::MaxNodes,
                current,
                requested: job.nodes.min,
                limit,
            });
        }
        max_take = limit - current;
    }
    Ok(max_take)
}

/// An occupancy reason of a job whose tenant's soft budget penalty lowers its score becomes
/// [`PendingReason::SoftQuotaPenalty`]: that is why others go first.
fn with_budget_penalty(
    snap: &ClusterSnapshot<'_>,
    job: &PendingJob,
    reason: PendingReason,
) -> PendingReason {
    let Some(used) = snap.tenant(job.tenant).and_then(|t| t.usage.budget_used) else {
        return reason;
    };
    let factor = score::budget_factor(Some(used));
    if factor >= 1.0 {
        return reason;
    }
    let free = match reason {
        PendingReason::NodesOccupied { free, .. }
        | PendingReason::BlockedByReservation { free } => free,
        _ => return reason,
    };
    PendingReason::SoftQuotaPenalty {
        budget_used_pct: (used * 100.0).round().clamp(0.0, f64::from(u32::MAX)) as u32,
        priority_factor: factor,
        requested: job.nodes.min,
        free,
    }
}

fn diagnose(
    state: &mut CycleState<'_>,
    feas: &Feasible,
    job: &PendingJob,
    end: Time,
    same_fp: bool,
) -> PendingReason {
    let cat = state.cat;
    let need = job.nodes.min;
    let matching: u32 = feas
        .classes
        .iter()
        .map(|&c| cat.classes()[c as usize].members.len() as u32)
        .sum();
    if matching < need {
        return PendingReason::NoMatchingNodes {
            requested: need,
            matching,
            total: cat.len() as u32,
        };
    }
    if same_fp {
        let largest = state.inventory_largest_fp(feas);
        if largest < need {
            return PendingReason::InsufficientConformanceGroup {
                requested: need,
                largest,
            };
        }
    }
    let unreserved = state.free_unreserved(feas);
    let usable = unreserved + state.held_feasible(feas, Some(end));
    let all_free = unreserved + state.held_feasible(feas, None);
    if usable < need && all_free >= need {
        return PendingReason::BlockedByReservation { free: all_free };
    }
    if usable >= need && same_fp {
        let largest = state.free_largest_fp(feas, Some(end));
        return PendingReason::InsufficientConformanceGroup {
            requested: need,
            largest,
        };
    }
    PendingReason::NodesOccupied {
        requested: need,
        free: usable,
    }
}

/// Size of the largest set of nodes sharing one conformance fingerprint.
pub(crate) fn largest_fingerprint_group(counts: &[BucketCount]) -> u32 {
    let mut per_fp: Vec<(u64, u32)> = counts.iter().map(|((_, f), c)| (*f, *c)).collect();
    per_fp.sort_unstable();
    let mut largest = 0;
    let mut i = 0;
    while i < per_fp.len() {
        let f = per_fp[i].0;
        let mut t = 0;
        while i < per_fp.len() && per_fp[i].0 == f {
            t += per_fp[i].1;
            i += 1;
        }
        largest = largest.max(t);
    }
    largest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        CheckpointInfo, Constraints, NodeRequest, NodeView, RunningJob, VClusterId,
    };
    use proptest::prelude::*;

    fn pending(need: u32, gpus: u32) -> PendingJob {
        PendingJob {
            id: JobId(1),
            tenant: TenantId(0),
            vcluster: VClusterId(0),
            nodes: NodeRequest::exact(need),
            constraints: Constraints {
                min_gpus_per_node: gpus,
                ..Constraints::default()
            },
            preemption_class: 5,
            sensitive: false,
            submit_time: 0,
            walltime_s: 600,
            runtime_key: Default::default(),
            checkpoint: CheckpointInfo::default(),
            data_readiness: None,
            scale_up: None,
        }
    }

    proptest! {
        /// The free index answers what `select::select` answers on the full counts, for both
        /// kinds of job, as nodes are taken and held for reservations.
        #[test]
        fn indexed_selection_matches_the_full_counts(
            nodes in prop::collection::vec((0u32..6, 0u64..3, 0u32..2, any::<bool>()), 4..60),
            steps in prop::collection::vec((1u32..9, 0u32..2, any::<bool>(), any::<bool>(), 0u8..3), 1..12),
        ) {
            let views: Vec<NodeView> = nodes
                .iter()
                .enumerate()
                .map(|(i, &(g, fp, gpus, _))| {
                    let mut v = NodeView::slot(i as u32);
                    v.topology_group = g;
                    v.conformance_fingerprint = fp;
                    v.gpus = gpus * 4;
                    v
                })
                .collect();
            let cat = NodeCatalog::new(views);
            let running: Vec<RunningJob> = nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.3)
                .map(|(i, _)| RunningJob {
                    walltime_s: 300 + 100 * i as i64,
                    ..RunningJob::new(
                        JobId(100 + i as u64),
                        TenantId(0),
                        VClusterId(0),
                        vec![NodeId(i as u32)],
                    )
                })
                .collect();
            let snap = ClusterSnapshot { now: 0, running: &running, pending: &[], tenants: &[], energy_price: 0.0, history: None };
            let mut state = CycleState::new(&cat, &snap, &Planning::WALLTIME);
            for (need, gpus, same_fp, long, action) in steps {
                let job = pending(need, gpus);
                let feas = state.feasible(&job);
                // Jobs ending before or after the reservations' start see held nodes or not.
                let end_t = if long { 100_000 } else { 10 };
                let end = Some(end_t);
                for fp in [false, same_fp] {
                    let full = select::select(&state.counts(&feas, end), need, need + 2, fp, false);
                    prop_assert_eq!(state.select_for(&feas, end, need, need + 2, fp, false), full);
                }
                prop_assert_eq!(
                    state.min_groups_needed(&feas, end, need),
                    select::min_groups_needed(&state.counts(&feas, end), need)
                );
                prop_assert_eq!(
                    state.free_largest_fp(&feas, end),
                    largest_fingerprint_group(&state.counts(&feas, end))
                );
                match action {
                    0 => {
                        if let Some(sel) = state.select_for(&feas, end, need, need, same_fp, false) {
                            state.take(&feas, &sel, end_t);
                        }
                    }
                    1 => {
                        let _ = state.reserve(&feas, need, 600);
                    }
                    _ => {}
                }
            }
        }
    }
}
