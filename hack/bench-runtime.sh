#!/usr/bin/env bash
# Controller-runtime benchmark: a real API server over an embedded store (temp dir) and a
# controller on the HTTP transport. Prints `RESULT name=value` lines:
#   event_to_reconcile_p50_ms / _p99_ms  (10,000 objects, 1,000 changes/s; target p99 <= 10)
#   noop_reconciles_per_s
# Memory per cached object: `cargo test -p lattice-runtime --test memory -- --nocapture`.
# Knobs: BENCH_OBJECTS, BENCH_RATE, BENCH_SECONDS.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build dist
echo "==> $LATTICE_BIN/examples/bench_runtime" >&2
"$LATTICE_BIN/examples/bench_runtime"
