#!/usr/bin/env bash
# Build every Lattice binary and example as the hack/ scripts do (hack/lib/build.sh):
#   hack/build.sh           release profile, binaries in target/release/
#   hack/build.sh dist      fat LTO, what the benchmarks run and sites deploy: target/dist/
#   hack/build.sh dev       the tests' build: target/debug/
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build "${1:-release}"
echo "==> binaries in $LATTICE_BIN/" >&2
