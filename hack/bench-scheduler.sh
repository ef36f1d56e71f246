#!/usr/bin/env bash
# Scheduler benchmarks, printing RESULT lines:
#  1. one lattice-scheduler cycle (the pure core), dist profile: cycle_<pending>x<nodes>_ms =
#     median wall time of Scheduler::cycle over 7 runs on a synthetic cluster (128-node
#     dragonfly groups, 2 GPU types, CXL class, 3 conformance fingerprints, 70 % busy),
#     hpc-backfill configuration. Targets: cycle_1000x10000_ms < 50,
#     cycle_10000x100000_ms < 1000. Then cycle_growth_10x_ratio (10,000 x 100,000 over
#     1,000 x 10,000) beside what O(pending x log nodes) allows, and the scaling curve as
#     CURVE lines (pending at fixed nodes, nodes at fixed pending, both). The plugins alone
#     at 1,000 x 10,000: score_terms_1000x10000_ms (every registered score term of every
#     job) and filters_1000x10000_ms (every registered filter, every job x node class).
#  2. placements per second end to end through the store (lattice-placement-bench): the
#     built-in controllers on an embedded fsync'ing store, BENCH_PLACE_NODES Ready nodes,
#     as many one-node allocations created by 8 clients; from the first create until the
#     last binding transaction committed.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
NODES=${BENCH_PLACE_NODES:-2000}
lattice_build dist
B=$LATTICE_BIN
echo "==> $B/bench-scheduler" >&2
"$B/bench-scheduler"
echo "==> $B/lattice-placement-bench --nodes $NODES --allocations $NODES" >&2
"$B/lattice-placement-bench" --nodes "$NODES" --allocations "$NODES"
