//! rm-replay: replay a workload trace through the Lattice scheduling core.
//!
//! ```text
//! rm-replay --trace KTH-SP2-1996-2.swf.gz --policy easy --filter predictsim --size requested
//! rm-replay --trace t.jsonl --policy lattice --profile hpc.yaml --compare easy -o json
//! rm-replay --trace SDSC-SP2-1998-4.2-cln.swf.gz --policy fcfs --filter rlscheduler \
//!     --size max --windows 10 --window-size 1024 --seed 1
//! ```

use std::process::ExitCode;

use clap::Parser;
use lattice_scheduler::sim::replay::{self, Policy, TraceOptions};
use lattice_scheduler::sim::swf::SwfOptions;
use lattice_scheduler::SchedulerConfig;

#[derive(Debug, Parser)]
#[command(
    name = "rm-replay",
    about = "Replay SWF / JSON-lines traces through the Lattice scheduler core"
)]
struct Args {
    /// Trace file: .swf / .swf.gz (Standard Workload Format) or JSON lines (.jsonl[.gz]).
    #[arg(long)]
    trace: String,
    /// Keep only the first N jobs (after filtering).
    #[arg(long)]
    jobs: Option<usize>,
    /// fcfs, easy, easy++ (EASY on predicted runtimes, Tsafrir et al.), conservative or
    /// lattice (the profile; hpc-backfill by default).
    #[arg(long, default_value = "lattice")]
    policy: Policy,
    /// YAML scheduler configuration for the lattice policy (kind, weights, discipline, ...).
    #[arg(long)]
    profile: Option<String>,
    /// Walltime estimate the scheduler sees: requested or actual.
    #[arg(long, default_value = "requested", value_parser = replay::parse_estimate)]
    estimate: lattice_scheduler::sim::swf::EstimateField,
    /// SWF job size: allocated, requested or max.
    #[arg(long, default_value = "allocated", value_parser = replay::parse_size)]
    size: lattice_scheduler::sim::swf::SizeField,
    /// RLScheduler's window protocol: this many windows of --window-size jobs among the
    /// first 10,000 (or --jobs), each on an empty machine, starts drawn by numpy's
    /// RandomState seeded by gym's np_random(--seed).
    #[arg(long)]
    windows: Option<usize>,
    #[arg(long, default_value_t = 1024)]
    window_size: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Trace cleaning: `predictsim` (Gaussier et al.) or `rlscheduler` (RLScheduler's job
    /// loading: requested time -1 = run time, negative run time = 10 s, zero run time dropped).
    #[arg(long)]
    filter: Option<String>,
    /// Output format: text or json.
    #[arg(short = 'o', long = "output", default_value = "text")]
    output: String,
    /// Also run this policy and print both.
    #[arg(long)]
    compare: Option<Policy>,
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rm-replay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<(), String> {
    let args = Args::parse();
    let (predictsim, rlscheduler) = match args.filter.as_deref() {
        None => (false, false),
        Some("predictsim") => (true, false),
        Some("rlscheduler") => (false, true),
        Some(f) => return Err(format!("unknown filter {f:?} (predictsim, rlscheduler)")),
    };
    if args.output != "text" && args.output != "json" {
        return Err(format!("unknown output {:?} (text, json)", args.output));
    }
    let lattice = match &args.profile {
        Some(p) => replay::load_profile(p).map_err(|e| e.to_string())?,
        None => SchedulerConfig::default(),
    };
    let jobs = match (args.jobs, args.windows) {
        (None, Some(_)) => Some(10_000),
        (j, _) => j,
    };
    let opts = TraceOptions {
        swf: SwfOptions {
            size: args.size,
            estimate: args.estimate,
            predictsim_filter: predictsim,
            rlscheduler_filter: rlscheduler,
            jobs,
        },
    };
    let (w, dropped) = replay::load_trace(&args.trace, &opts).map_err(|e| e.to_string())?;
    let json = args.output == "json";
    let mut policies = vec![args.policy];
    policies.extend(args.compare);
    if let Some(windows) = args.windows {
        let need = replay::min_jobs_for_windows(args.window_size);
        if w.jobs.len() < need {
            return Err(format!(
                "--windows needs at least {need} jobs for --window-size {} (windows start between job {} and the last {} jobs); the trace has {} after filtering: lower --window-size or raise --jobs",
                args.window_size,
                args.window_size,
                args.window_size + 1,
                w.jobs.len()
            ));
        }
        let reports: Vec<_> = policies
            .iter()
            .map(|&p| replay::run_windows(p, &lattice, &w, windows, args.window_size, args.seed))
            .collect();
        if json {
            print_json(&reports)?;
        } else {
            for r in &reports {
                emit(&format!(
                    "policy {}  windows {}x{}  seed {}  avg bounded slowdown {:.4}  avg wait {:.1} s\n",
                    r.policy, r.windows, r.window_size, r.seed, r.avg_bounded_slowdown, r.avg_wait_s
                ));
            }
        }
        return Ok(());
    }
    let reports: Vec<_> = policies
        .iter()
        .map(|&p| replay::run(p, &lattice, &w))
        .collect();
    if json {
        print_json(&reports)?;
    } else {
        emit(&format!(
            "trace {}  ({} records dropped)\n",
            args.trace, dropped
        ));
        if let [a, b] = reports.as_slice() {
            emit(&lattice_scheduler::sim::Report::side_by_side(a, b));
        } else {
            for r in &reports {
                emit(&r.to_text());
            }
        }
        if reports.len() == 2 {
            let (a, b) = (&reports[0], &reports[1]);
            emit(&format!(
                "compare: {} vs {}: bounded slowdown {:+.2}%, avg wait {:+.2}%, utilization {:+.4}\n",
                a.policy,
                b.policy,
                pct(a.avg_bounded_slowdown, b.avg_bounded_slowdown),
                pct(a.avg_wait_s, b.avg_wait_s),
                a.utilization - b.utilization
            ));
        }
    }
    Ok(())
}

fn pct(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        (a - b) / b * 100.0
    }
}

fn print_json<T: serde::Serialize>(reports: &[T]) -> Result<(), String> {
    let out = if reports.len() == 1 {
        serde_json::to_string_pretty(&reports[0])
    } else {
        serde_json::to_string_pretty(
            &serde_json::json!({ "base": &reports[0], "compare": &reports[1] }),
        )
    };
    emit(&format!("{}\n", out.map_err(|e| e.to_string())?));
    Ok(())
}

/// Write to stdout; a closed pipe (`| head`) ends the output quietly instead of panicking.
fn emit(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
