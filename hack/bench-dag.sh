#!/usr/bin/env bash
# DAG core benchmark (pure library, no controller/store): admission validation
# of a 10,000-step DAG and in-process dispatch latency of the engine.
# Prints `RESULT name=value` lines. Targets: validate_10000_ms < 20,
# release_p99_ms < 5 (engine only; the end-to-end figure is measured elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> building lattice-dag-bench (release)"
cargo build --release -q -p lattice-dag --bin lattice-dag-bench
target/release/lattice-dag-bench
