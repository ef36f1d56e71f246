#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
# Installs every tool the tests start (hack/install-deps.sh, idempotent: Debian packages,
# kubectl and the Helm chart's tools), then: format check, clippy, build of every binary
# and example (the e2e tests start the binaries), the Helm chart's rendering and
# validation, and every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> installing test dependencies (hack/install-deps.sh)"
hack/install-deps.sh
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
export PROTOC="${PROTOC:-$(command -v protoc)}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# No incremental caches: a one-shot run gains nothing from them and they cost gigabytes of
# disk (set CARGO_INCREMENTAL=1 to keep them for repeated local runs).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

echo "==> cargo clippy -p lattice-agent --features nvidia,pmix (the NVML path builds without a GPU; the PMIx sidecar on OpenPMIx)"
cargo clippy -p lattice-agent --all-targets --features nvidia,pmix -- -D warnings

# The binaries the end-to-end tests start, built with the same dependency features as the
# tests below (hack/lib/build.sh), so `cargo test` compiles only the test targets on top.
lattice_build dev

# The Helm chart, rendered and validated offline; its config files checked against the
# flags of the binaries just built.
echo "==> hack/check-chart.sh"
LATTICE_BIN="$LATTICE_BIN" hack/check-chart.sh

echo "==> cargo test --workspace"
cargo test --workspace --no-fail-fast -- --test-threads="${LATTICE_TEST_THREADS:-2}"

# The agent with its PMIx sidecar (cargo feature pmix, on Debian's OpenPMIx): OpenMPI
# ranks launched by the agents, the MPI tests again over the rebuilt binary.
echo "==> cargo test -p lattice-agent --features pmix --test mpi (OpenMPI through PMIx)"
cargo build -p lattice-agent --features pmix --bin lattice-agent
cargo test -p lattice-agent --features pmix --test mpi --no-fail-fast -- --test-threads="${LATTICE_TEST_THREADS:-2}"
