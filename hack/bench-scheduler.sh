#!/usr/bin/env bash
# Benchmark one lattice-scheduler cycle in release mode.
# Prints RESULT lines: cycle_<pending>x<nodes>_ms = median wall time of Scheduler::cycle over
# 7 runs on a synthetic cluster (128-node dragonfly groups, 2 GPU types, CXL class,
# 3 conformance fingerprints, 70 % busy), hpc-backfill configuration.
# Targets: cycle_1000x10000_ms < 50, cycle_10000x100000_ms < 1000.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> cargo build --release -p lattice-scheduler" >&2
cargo build --release -p lattice-scheduler --bin bench-scheduler >&2
echo "==> target/release/bench-scheduler" >&2
target/release/bench-scheduler
