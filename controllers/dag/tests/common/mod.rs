#![allow(dead_code)]
use std::collections::{BTreeMap, BTreeSet};

use lattice_dag::dispatch::{Action, Engine};
use lattice_dag::graph::{validate, DagDef, Edge, Limits, StepDef, TaskGroupDef, ValidatedDag};
use lattice_dag::{Condition, Outcome};

pub type Item = (String, Option<u64>);

pub fn step(name: &str, deps: &[(&str, Condition)]) -> StepDef {
    StepDef::new(name, deps.iter().map(|(t, c)| Edge::new(*t, *c)).collect())
}

pub fn group(name: &str, range: &str, deps: &[(&str, Condition)]) -> StepDef {
    let mut s = step(name, deps);
    s.task_group = Some(TaskGroupDef {
        range: range.to_string(),
        concurrency: None,
    });
    s
}

pub fn dag(steps: Vec<StepDef>) -> ValidatedDag {
    let def = DagDef {
        steps,
        ..Default::default()
    };
    match validate(&def, &Limits::default()) {
        Ok(v) => v,
        Err(e) => panic!("invalid test DAG: {e}"),
    }
}

/// Result of driving an engine to completion.
#[derive(Debug, Default)]
pub struct Run {
    pub ran: BTreeMap<Item, Outcome>,
    pub cancelled: BTreeSet<Item>,
    pub release_order: Vec<Item>,
}

/// Drive `engine` to quiescence: complete released items in an order chosen by
/// `pick` (index into the in-flight list), with outcomes from `outcome`.
/// `requeue_first` requeues each item once before it finishes.
pub fn drive(
    engine: &mut Engine,
    outcome: &dyn Fn(&str, Option<u64>) -> Outcome,
    pick: &mut dyn FnMut(usize) -> usize,
    requeue_first: bool,
    check: &mut dyn FnMut(&Engine, &[Item]),
) -> Run {
    let mut run = Run::default();
    let mut in_flight: Vec<Item> = Vec::new();
    let apply = |acts: Vec<Action>, in_flight: &mut Vec<Item>, run: &mut Run| {
        for a in acts {
            match a {
                Action::Release { step, index } => {
                    run.release_order.push((step.clone(), index));
                    in_flight.push((step, index));
                }
                Action::Cancel { step, index, .. } => {
                    run.cancelled.insert((step, index));
                }
            }
        }
    };
    let acts = engine.start();
    apply(acts, &mut in_flight, &mut run);
    check(engine, &in_flight);
    while !in_flight.is_empty() {
        let k = pick(in_flight.len()) % in_flight.len();
        let (s, i) = in_flight.remove(k);
        engine.on_started(&s, i).expect("start");
        if requeue_first {
            engine.on_requeued(&s, i).expect("requeue");
            engine.on_started(&s, i).expect("restart");
        }
        let o = outcome(&s, i);
        run.ran.insert((s.clone(), i), o);
        let acts = engine.on_terminal(&s, o, i).expect("terminal");
        apply(acts, &mut in_flight, &mut run);
        check(engine, &in_flight);
    }
    run
}

pub fn fifo(engine: &mut Engine, outcome: &dyn Fn(&str, Option<u64>) -> Outcome) -> Run {
    drive(engine, outcome, &mut |_| 0, false, &mut |_, _| {})
}

pub fn ok_except<'a>(failing: &'a [&'a str]) -> impl Fn(&str, Option<u64>) -> Outcome + 'a {
    move |s, _| {
        if failing.contains(&s) {
            Outcome::Failed { exit: 1 }
        } else {
            Outcome::Succeeded
        }
    }
}

pub fn names(items: impl IntoIterator<Item = Item>) -> BTreeSet<String> {
    items
        .into_iter()
        .map(|(s, i)| match i {
            Some(i) => format!("{s}[{i}]"),
            None => s,
        })
        .collect()
}

pub fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}
