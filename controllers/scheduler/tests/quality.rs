//! The scheduling-quality bar on real traces: on the first 10,000 jobs of SDSC-SP2,
//! KTH-SP2, CTC-SP2 and HPC2N (size = allocated processors as whole nodes, estimate =
//! requested time, τ = 10 s), the hpc-backfill scheduler as a vCluster runs it by default
//! has an average bounded slowdown at most EASY's and a utilization at least EASY's.

use lattice_scheduler::sim::replay::{self, Policy, TraceOptions};
use lattice_scheduler::sim::swf::{EstimateField, SizeField, SwfOptions};
use lattice_scheduler::{SchedulerConfig, SchedulerKind};

#[test]
fn hpc_backfill_is_at_least_as_good_as_easy_on_four_traces() {
    let hpc = SchedulerConfig::for_kind(SchedulerKind::HpcBackfill);
    for trace in [
        "SDSC-SP2-1998-4.2-cln.swf.gz",
        "KTH-SP2-1996-2.1-cln.swf.gz",
        "CTC-SP2-1996-3.1-cln.swf.gz",
        "HPC2N-2002-2.2-cln.swf.gz",
    ] {
        let path = format!("{}/testdata/{trace}", env!("CARGO_MANIFEST_DIR"));
        let opts = TraceOptions {
            swf: SwfOptions {
                size: SizeField::Allocated,
                estimate: EstimateField::Requested,
                predictsim_filter: false,
                rlscheduler_filter: false,
                jobs: Some(10_000),
            },
        };
        let (w, _) = replay::load_trace(&path, &opts).expect("trace loads");
        let easy = replay::run(Policy::Easy, &hpc, &w);
        let lattice = replay::run(Policy::Lattice, &hpc, &w);
        assert!(
            lattice.avg_bounded_slowdown <= easy.avg_bounded_slowdown + 1e-9,
            "{trace}: slowdown {} > EASY's {}",
            lattice.avg_bounded_slowdown,
            easy.avg_bounded_slowdown
        );
        assert!(
            lattice.utilization >= easy.utilization - 1e-9,
            "{trace}: utilization {} < EASY's {}",
            lattice.utilization,
            easy.utilization
        );
    }
}
