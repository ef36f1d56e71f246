//! Published-figure check that is fast enough for the debug test run: EASY backfilling on
//! KTH-SP2 version 2 (uncleaned) after the predictsim filter, as in Gaussier et al. (SC'15):
//! average bounded slowdown 92.5765 over 28,481 jobs. Must be within 0.5 %.

use lattice_scheduler::sim::replay::{self, Policy, TraceOptions};
use lattice_scheduler::sim::swf::{EstimateField, SizeField, SwfOptions};
use lattice_scheduler::SchedulerConfig;

#[test]
fn easy_on_kth_sp2_matches_gaussier_et_al() {
    let path = format!(
        "{}/testdata/KTH-SP2-1996-2.swf.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    let opts = TraceOptions {
        swf: SwfOptions {
            size: SizeField::Requested,
            estimate: EstimateField::Requested,
            predictsim_filter: true,
            jobs: None,
        },
    };
    let (w, dropped) = replay::load_trace(&path, &opts).expect("trace loads");
    assert_eq!(w.jobs.len(), 28_481);
    assert_eq!(dropped, 8);
    let r = replay::run(Policy::Easy, &SchedulerConfig::default(), &w);
    let published = 92.5765;
    let err = (r.avg_bounded_slowdown - published).abs() / published;
    assert!(
        err < 0.005,
        "avg bounded slowdown {:.4} vs published {published} ({:.3}%)",
        r.avg_bounded_slowdown,
        err * 100.0
    );
}
