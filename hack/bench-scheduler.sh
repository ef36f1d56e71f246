#!/usr/bin/env bash
# Scheduler benchmarks, printing RESULT lines:
#  1. one lattice-scheduler cycle (the pure core), release mode: cycle_<pending>x<nodes>_ms =
#     median wall time of Scheduler::cycle over 7 runs on a synthetic cluster (128-node
#     dragonfly groups, 2 GPU types, CXL class, 3 conformance fingerprints, 70 % busy),
#     hpc-backfill configuration. Targets: cycle_1000x10000_ms < 50,
#     cycle_10000x100000_ms < 1000. Then cycle_growth_10x_ratio (10,000 x 100,000 over
#     1,000 x 10,000) beside what O(pending x log nodes) allows, and the scaling curve as
#     CURVE lines (pending at fixed nodes, nodes at fixed pending, both).
#  2. placements per second end to end through the store (lattice-placement-bench): the
#     built-in controllers on an embedded fsync'ing store, BENCH_PLACE_NODES Ready nodes,
#     as many one-node allocations created by 8 clients; from the first create until the
#     last binding transaction committed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PROTOC="${PROTOC:-$(command -v protoc)}"
NODES=${BENCH_PLACE_NODES:-2000}
echo "==> cargo build --release -p lattice-scheduler -p lattice-e2e" >&2
cargo build --release -p lattice-scheduler --bin bench-scheduler >&2
cargo build --release -p lattice-e2e --bin lattice-placement-bench >&2
echo "==> target/release/bench-scheduler" >&2
target/release/bench-scheduler
echo "==> target/release/lattice-placement-bench --nodes $NODES --allocations $NODES" >&2
target/release/lattice-placement-bench --nodes "$NODES" --allocations "$NODES"
