//! `lattice-dag-bench`: admission validation and dispatch latency of the pure
//! engine (no controller, no store). Prints `RESULT name=value` lines.
//!
//! * `engine_validate_10000_ms` — median time to validate a 10,000-step DAG
//!   (random edges, each step depends on up to 3 earlier steps).
//! * `engine_parse_validate_10000_ms` — YAML parse + validate of the same DAG.
//! * `engine_release_p50_ms` / `engine_release_p99_ms` / `engine_release_max_ms` — latency of one
//!   `Engine::on_terminal` call (the dispatch decision for one completion,
//!   including all Release/Cancel actions it produces) while driving the
//!   10,000-step DAG, a 1,000-wide fan-out/fan-in, and a 10,000-element task
//!   group with corresponding edges to completion. (The issue's `release_p99_ms`, from
//!   a terminal status write to the successor's release through the controller and
//!   the store, is printed by `lattice-dag-e2e-bench in-process`.)

use std::time::Instant;

use lattice_dag::dispatch::{Action, Engine};
use lattice_dag::graph::{validate, DagDef, Edge, Limits, StepDef, TaskGroupDef};
use lattice_dag::{Condition, Outcome};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn random_dag(n: usize, rng: &mut Rng) -> DagDef {
    let conds = [
        Condition::Success,
        Condition::Success,
        Condition::Success,
        Condition::Any,
        Condition::Failure,
    ];
    let steps = (0..n)
        .map(|i| {
            let k = if i == 0 { 0 } else { rng.below(4) as usize };
            let mut deps: Vec<Edge> = Vec::new();
            for _ in 0..k {
                let j = rng.below(i as u64) as usize;
                let t = format!("step-{j}");
                if deps.iter().all(|d| d.target != t) {
                    deps.push(Edge::new(t, conds[rng.below(conds.len() as u64) as usize]));
                }
            }
            StepDef::new(format!("step-{i}"), deps)
        })
        .collect();
    DagDef {
        name: Some("bench".into()),
        steps,
        ..Default::default()
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn pct(v: &[f64], p: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Drive an engine to completion; returns per-call latencies in ms.
fn drive(engine: &mut Engine, rng: &mut Rng, fail_pct: u64, lat: &mut Vec<f64>) -> usize {
    let mut in_flight: Vec<(String, Option<u64>)> = Vec::new();
    let push = |acts: Vec<Action>, q: &mut Vec<(String, Option<u64>)>| {
        for a in acts {
            if let Action::Release { step, index } = a {
                q.push((step, index));
            }
        }
    };
    let t = Instant::now();
    let acts = engine.start();
    lat.push(t.elapsed().as_secs_f64() * 1e3);
    push(acts, &mut in_flight);
    let mut done = 0;
    while !in_flight.is_empty() {
        let k = rng.below(in_flight.len() as u64) as usize;
        let (s, i) = in_flight.swap_remove(k);
        let o = if rng.below(100) < fail_pct {
            Outcome::Failed { exit: 1 }
        } else {
            Outcome::Succeeded
        };
        let _ = engine.on_started(&s, i);
        let t = Instant::now();
        let acts = match engine.on_terminal(&s, o, i) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("engine error: {e}");
                std::process::exit(1);
            }
        };
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        push(acts, &mut in_flight);
        done += 1;
    }
    done
}

fn main() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let n = 10_000;
    let def = random_dag(n, &mut rng);
    let limits = Limits {
        max_dag_size: n,
        ..Limits::default()
    };

    // Admission validation.
    let mut times = Vec::new();
    let mut validated = None;
    for _ in 0..21 {
        let t = Instant::now();
        let v = validate(&def, &limits);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        validated = Some(v);
    }
    let Some(Ok(validated)) = validated else {
        eprintln!("bench DAG failed validation");
        std::process::exit(1);
    };
    let edges = validated.edges.len();
    println!("validate: {n} steps, {edges} edges");
    println!("RESULT engine_validate_10000_ms={:.3}", median(&mut times));

    let yaml = match serde_yaml::to_string(&def.to_manifest()) {
        Ok(y) => y,
        Err(e) => {
            eprintln!("yaml: {e}");
            std::process::exit(1);
        }
    };
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let ok = DagDef::from_yaml(&yaml)
            .ok()
            .map(|d| validate(&d, &limits).is_ok());
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if ok != Some(true) {
            eprintln!("yaml round trip failed");
            std::process::exit(1);
        }
    }
    println!(
        "RESULT engine_parse_validate_10000_ms={:.3}",
        median(&mut times)
    );

    // Dispatch latency.
    let mut lat = Vec::new();
    let mut events = 0;
    for round in 0..3 {
        let mut e = Engine::new(validated.clone());
        events += drive(&mut e, &mut rng, if round == 0 { 0 } else { 5 }, &mut lat);
    }
    // Wide fan-out / fan-in.
    let mut steps = vec![StepDef::new("root", vec![])];
    for i in 0..1000 {
        steps.push(StepDef::new(
            format!("w{i}"),
            vec![Edge::new("root", Condition::Success)],
        ));
    }
    steps.push(StepDef::new(
        "join",
        (0..1000)
            .map(|i| Edge::new(format!("w{i}"), Condition::Any))
            .collect(),
    ));
    let wide = DagDef {
        steps,
        ..Default::default()
    };
    let wide = validate(&wide, &limits).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    for _ in 0..5 {
        let mut e = Engine::new(wide.clone());
        events += drive(&mut e, &mut rng, 2, &mut lat);
    }
    // Task groups with corresponding edges (10,000 elements, 500 at a time).
    let mut a = StepDef::new("pre", vec![]);
    a.task_group = Some(TaskGroupDef {
        range: "0-9999%500".into(),
        concurrency: None,
    });
    let mut b = StepDef::new("train", vec![Edge::new("pre", Condition::Corresponding)]);
    b.task_group = Some(TaskGroupDef {
        range: "0-9999%500".into(),
        concurrency: None,
    });
    let c = StepDef::new("report", vec![Edge::new("train", Condition::Any)]);
    let tg = DagDef {
        steps: vec![a, b, c],
        ..Default::default()
    };
    // 20,001 allocations: over the default admission limit, which is not what is timed here.
    let unlimited = Limits {
        max_dag_size: usize::MAX,
        ..Limits::default()
    };
    let tg = validate(&tg, &unlimited).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let mut e = Engine::new(tg);
    events += drive(&mut e, &mut rng, 1, &mut lat);

    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "dispatch: {events} completion events, {} on_terminal/start calls",
        lat.len()
    );
    println!("RESULT engine_release_p50_ms={:.4}", pct(&lat, 0.50));
    println!("RESULT engine_release_p99_ms={:.4}", pct(&lat, 0.99));
    println!("RESULT engine_release_max_ms={:.4}", pct(&lat, 1.0));
}
