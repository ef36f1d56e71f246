//! Property test: for random DAGs, random outcomes and random completion
//! orders, the engine agrees with an independent naive evaluator that
//! recomputes every step from scratch until a fixed point.
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::*;
use lattice_dag::dispatch::{DagPhase, Engine, StepState};
use lattice_dag::graph::StepDef;
use lattice_dag::{Condition, Outcome};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct GenStep {
    deps: Vec<(usize, u8)>,
    group: Option<(u64, u64)>,
    mutex: Option<u8>,
    /// Per element: 0 succeed, 1 fail, 2 killed (reported Cancelled).
    fail: Vec<u8>,
    /// Task-group `%N`.
    limit: Option<u8>,
}

fn gen_dag() -> impl Strategy<Value = Vec<GenStep>> {
    (1usize..10).prop_flat_map(|n| {
        proptest::collection::vec(
            (
                proptest::collection::vec((0usize..100, 0u8..5), 0..4),
                proptest::option::weighted(0.5, (0u64..3, 1u64..4)),
                proptest::option::weighted(0.2, 0u8..2),
                proptest::collection::vec(
                    prop_oneof![6 => Just(0u8), 3 => Just(1u8), 1 => Just(2u8)],
                    8,
                ),
                proptest::option::weighted(0.3, 1u8..3),
            ),
            n,
        )
        .prop_map(|raw| {
            raw.into_iter()
                .enumerate()
                .map(|(i, (deps, group, mutex, fail, limit))| GenStep {
                    deps: if i == 0 {
                        Vec::new()
                    } else {
                        deps.into_iter().map(|(j, c)| (j % i, c)).collect()
                    },
                    group,
                    mutex,
                    fail,
                    limit,
                })
                .collect()
        })
    })
}

fn cond_of(c: u8, both_groups: bool) -> Condition {
    match c {
        0 => Condition::Success,
        1 => Condition::Failure,
        2 => Condition::Any,
        _ if both_groups => Condition::Corresponding,
        _ => Condition::Success,
    }
}

/// Normalized edges: (pred, cond) per step, first mention of a pred wins.
fn edges(g: &[GenStep]) -> Vec<Vec<(usize, Condition)>> {
    g.iter()
        .map(|s| {
            let mut seen = BTreeSet::new();
            s.deps
                .iter()
                .filter(|(j, _)| seen.insert(*j))
                .map(|(j, c)| (*j, cond_of(*c, s.group.is_some() && g[*j].group.is_some())))
                .collect()
        })
        .collect()
}

fn indices(s: &GenStep) -> Vec<Option<u64>> {
    match s.group {
        None => vec![None],
        Some((a, l)) => (a..a + l).map(Some).collect(),
    }
}

fn build(g: &[GenStep]) -> Vec<StepDef> {
    let es = edges(g);
    g.iter()
        .enumerate()
        .map(|(i, s)| {
            let mut deps: Vec<(String, Condition)> =
                es[i].iter().map(|(j, c)| (format!("s{j}"), *c)).collect();
            if let Some(m) = s.mutex {
                deps.push((format!("m{m}"), Condition::Mutex));
            }
            let deps: Vec<(&str, Condition)> = deps.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            match s.group {
                None => step(&format!("s{i}"), &deps),
                Some((a, l)) => {
                    let limit = s.limit.map(|c| format!("%{c}")).unwrap_or_default();
                    group(
                        &format!("s{i}"),
                        &format!("{a}-{}{limit}", a + l - 1),
                        &deps,
                    )
                }
            }
        })
        .collect()
}

fn outcome_of(g: &[GenStep], s: &str, i: Option<u64>) -> Outcome {
    let k: usize = s[1..].parse().unwrap_or(0);
    let pos = i.unwrap_or(0) as usize % 8;
    match g[k].fail[pos] {
        0 => Outcome::Succeeded,
        1 => Outcome::Failed { exit: 1 },
        _ => Outcome::Cancelled,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum R {
    Unknown,
    Ran(Outcome),
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum O {
    Succ,
    Fail,
    Canc,
}

/// The naive reference: fixed point over the whole graph.
type Elements = Vec<Vec<(Option<u64>, R)>>;

fn reference(g: &[GenStep]) -> (Elements, DagPhase) {
    let es = edges(g);
    let mut st: Elements = g
        .iter()
        .map(|s| indices(s).into_iter().map(|i| (i, R::Unknown)).collect())
        .collect();
    let step_outcome = |st: &Elements, j: usize| -> Option<O> {
        let els = &st[j];
        if els.iter().any(|(_, r)| *r == R::Unknown) {
            return None;
        }
        if els
            .iter()
            .any(|(_, r)| matches!(r, R::Ran(Outcome::Failed { .. })))
        {
            Some(O::Fail)
        } else if els
            .iter()
            .any(|(_, r)| matches!(r, R::Cancelled | R::Ran(Outcome::Cancelled)))
        {
            Some(O::Canc)
        } else {
            Some(O::Succ)
        }
    };
    loop {
        let mut changed = false;
        for i in 0..g.len() {
            // Gate over step-level edges.
            let mut and_dead = false;
            let mut and_ok = true;
            let fails: Vec<Option<O>> = es[i]
                .iter()
                .filter(|(_, c)| *c == Condition::Failure)
                .map(|(j, _)| step_outcome(&st, *j))
                .collect();
            for (j, c) in &es[i] {
                let o = step_outcome(&st, *j);
                match c {
                    Condition::Success => {
                        and_dead |= matches!(o, Some(O::Fail | O::Canc));
                        and_ok &= o == Some(O::Succ);
                    }
                    Condition::Any => and_ok &= o.is_some(),
                    _ => {}
                }
            }
            let or_ok = fails.is_empty() || fails.contains(&Some(O::Fail));
            let or_dead = !fails.is_empty() && !or_ok && fails.iter().all(|f| f.is_some());
            let dead = and_dead || or_dead;
            let open = and_ok && or_ok && !dead;
            for k in 0..st[i].len() {
                let (idx, r) = st[i][k];
                if r != R::Unknown {
                    continue;
                }
                let mut next = R::Unknown;
                if dead {
                    next = R::Cancelled;
                } else {
                    let mut corr_dead = false;
                    let mut corr_ok = true;
                    for (j, c) in &es[i] {
                        if *c != Condition::Corresponding {
                            continue;
                        }
                        if let Some((_, pr)) = st[*j].iter().find(|(pi, _)| *pi == idx) {
                            match pr {
                                R::Ran(Outcome::Succeeded) => {}
                                R::Unknown => corr_ok = false,
                                _ => corr_dead = true,
                            }
                        }
                    }
                    if corr_dead {
                        next = R::Cancelled;
                    } else if open && corr_ok {
                        let name = format!("s{i}");
                        next = R::Ran(outcome_of(g, &name, idx));
                    }
                }
                if next != R::Unknown {
                    st[i][k].1 = next;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let catches: Vec<bool> = (0..g.len())
        .map(|j| {
            es.iter().any(|e| {
                e.iter()
                    .any(|(p, c)| *p == j && matches!(c, Condition::Failure | Condition::Any))
            })
        })
        .collect();
    let failed = (0..g.len()).any(|j| step_outcome(&st, j) == Some(O::Fail) && !catches[j]);
    let all_done = (0..g.len()).all(|j| step_outcome(&st, j).is_some());
    let phase = if !all_done {
        DagPhase::Running
    } else if failed {
        DagPhase::Failed
    } else {
        DagPhase::Completed
    };
    (st, phase)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, .. ProptestConfig::default() })]

    #[test]
    fn engine_matches_naive_reference(
        g in gen_dag(),
        picks in proptest::collection::vec(0usize..1000, 64),
        requeue in any::<bool>(),
    ) {
        let d = dag(build(&g));
        let mut e = Engine::new(d);
        let mutex_of: HashMap<String, Option<u8>> = g.iter().enumerate().map(|(i, s)| (format!("s{i}"), s.mutex)).collect();
        let limit_of: HashMap<String, Option<u8>> = g.iter().enumerate().map(|(i, s)| (format!("s{i}"), s.limit.filter(|_| s.group.is_some()))).collect();
        let mut k = 0usize;
        let mut pick = |n: usize| { k += 1; picks[k % picks.len()] % n };
        let mut violation = None;
        let mut check = |_: &Engine, in_flight: &[Item]| {
            let mut holders: BTreeMap<u8, BTreeSet<&str>> = BTreeMap::new();
            for (s, _) in in_flight {
                if let Some(Some(m)) = mutex_of.get(s) {
                    holders.entry(*m).or_default().insert(s.as_str());
                }
            }
            if let Some((m, h)) = holders.iter().find(|(_, h)| h.len() > 1) {
                violation = Some(format!("mutex m{m} held by {h:?}"));
            }
            let mut per_step: BTreeMap<&str, usize> = BTreeMap::new();
            for (s, _) in in_flight {
                *per_step.entry(s.as_str()).or_default() += 1;
            }
            for (s, n) in per_step {
                if let Some(Some(limit)) = limit_of.get(s) {
                    if n > *limit as usize {
                        violation = Some(format!("{s} has {n} elements in flight, limit {limit}"));
                    }
                }
            }
        };
        let gg = g.clone();
        let run = drive(&mut e, &move |s, i| outcome_of(&gg, s, i), &mut pick, requeue, &mut check);
        prop_assert_eq!(violation, None);

        let (refst, refphase) = reference(&g);
        let mut ref_ran = BTreeMap::new();
        let mut ref_cancelled_steps = BTreeSet::new();
        let mut ref_cancelled_elems: BTreeMap<String, u32> = BTreeMap::new();
        for (i, els) in refst.iter().enumerate() {
            let name = format!("s{i}");
            for (idx, r) in els {
                match r {
                    R::Ran(o) => {
                        ref_ran.insert((name.clone(), *idx), *o);
                    }
                    R::Cancelled | R::Unknown => {}
                }
                // A step killed while running counts as cancelled too.
                if matches!(r, R::Cancelled | R::Ran(Outcome::Cancelled)) {
                    if idx.is_none() { ref_cancelled_steps.insert(name.clone()); }
                    else { *ref_cancelled_elems.entry(name.clone()).or_default() += 1; }
                }
            }
        }
        prop_assert_eq!(&run.ran, &ref_ran, "ran sets differ for {:?}", g);
        let eng_cancelled_steps: BTreeSet<String> = e.states().into_iter()
            .filter(|(n, s)| matches!(s, StepState::Cancelled { .. }) && e.group_status(n).is_none())
            .map(|(n, _)| n).collect();
        prop_assert_eq!(eng_cancelled_steps, ref_cancelled_steps, "cancelled sets differ for {:?}", g);
        for (i, s) in g.iter().enumerate() {
            if s.group.is_some() {
                let name = format!("s{i}");
                let gs = e.group_status(&name).expect("group");
                prop_assert_eq!(gs.cancelled, ref_cancelled_elems.get(&name).copied().unwrap_or(0), "element cancels of {}", name);
            }
        }
        prop_assert_eq!(e.phase(), refphase, "phase for {:?}", g);
        prop_assert!(e.phase() != DagPhase::Running, "engine stalled: {:?}", e.status());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// `maxParallel` only delays steps: the same steps run with the same outcomes as
    /// without a limit (the naive reference), never more than the limit of steps are
    /// in flight at once, and the engine never stalls (mutexes, task groups and
    /// corresponding edges included).
    #[test]
    fn max_parallel_only_delays(
        g in gen_dag(),
        limit in 1u32..4,
        picks in proptest::collection::vec(0usize..1000, 64),
    ) {
        use lattice_dag::dispatch::Policy;
        let mut e = Engine::with_policy(dag(build(&g)), Policy { max_parallel: Some(limit), ..Default::default() });
        let mut k = 0usize;
        let mut pick = |n: usize| { k += 1; picks[k % picks.len()] % n };
        let mut violation = None;
        let mut check = |e: &Engine, in_flight: &[Item]| {
            let steps: BTreeSet<&str> = in_flight.iter().map(|(s, _)| s.as_str()).collect();
            if steps.len() > limit as usize || e.slots_used() > limit {
                violation = Some(format!("{} steps in flight ({:?}), {} slots used, limit {limit}", steps.len(), steps, e.slots_used()));
            }
        };
        let gg = g.clone();
        let run = drive(&mut e, &move |s, i| outcome_of(&gg, s, i), &mut pick, false, &mut check);
        prop_assert_eq!(violation, None);
        let (refst, refphase) = reference(&g);
        let mut ref_ran = BTreeMap::new();
        for (i, els) in refst.iter().enumerate() {
            for (idx, r) in els {
                if let R::Ran(o) = r {
                    ref_ran.insert((format!("s{i}"), *idx), *o);
                }
            }
        }
        prop_assert_eq!(&run.ran, &ref_ran, "ran sets differ for {:?}", g);
        prop_assert_eq!(e.phase(), refphase, "phase for {:?}: {:?}", g, e.status());
        prop_assert_eq!(e.slots_used(), 0);
    }

    /// `fail_fast` ends in the same phase as `propagate` (Failed exactly when some
    /// failure goes uncaught), releases nothing after the failure that stopped it,
    /// and never stalls.
    #[test]
    fn fail_fast_stops_releasing_and_ends_like_propagate(
        g in gen_dag(),
        limit in proptest::option::of(1u32..4),
        picks in proptest::collection::vec(0usize..1000, 64),
    ) {
        use lattice_dag::dispatch::{FailurePolicy, Policy};
        let policy = Policy { failure_policy: FailurePolicy::FailFast, max_parallel: limit };
        let mut e = Engine::with_policy(dag(build(&g)), policy);
        let mut k = 0usize;
        let mut pick = |n: usize| { k += 1; picks[k % picks.len()] % n };
        let mut at_abort: Option<BTreeSet<Item>> = None;
        let mut violation = None;
        let mut check = |e: &Engine, in_flight: &[Item]| {
            let now: BTreeSet<Item> = in_flight.iter().cloned().collect();
            match &at_abort {
                Some(before) => {
                    if let Some(x) = now.iter().find(|i| !before.contains(*i)) {
                        violation = Some(format!("{x:?} released after {:?} failed", e.aborted_by()));
                    }
                }
                None if e.aborted_by().is_some() => at_abort = Some(now),
                None => {}
            }
        };
        let gg = g.clone();
        drive(&mut e, &move |s, i| outcome_of(&gg, s, i), &mut pick, false, &mut check);
        prop_assert_eq!(violation, None);
        let (_, refphase) = reference(&g);
        prop_assert_eq!(e.phase(), refphase, "phase for {:?}: {:?}", g, e.status());
        prop_assert_eq!(e.aborted_by().is_some(), refphase == DagPhase::Failed);
    }
}
