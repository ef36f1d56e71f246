#!/usr/bin/env bash
# Quickstart: build Lattice (release profile) and run a whole local cluster — one
# `lattice-server --dev` and 4 node agents — apply the example tenant and vClusters, submit
# the example workflow (manifests/examples/training-pipeline.yaml) and show its progress
# live until it completes; then print each step's last log lines and stop everything.
# Extra arguments go to `lattice up` (e.g. --agents 8, --data-dir DIR, or --detach
# without --demo to keep the cluster running).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build release

data=${LATTICE_UP_DIR:-.lattice-up}
echo "==> lattice up --demo (4 agents, data in $data)"
if [ "$#" -eq 0 ]; then
  set -- --demo
fi
exec "$LATTICE_BIN/lattice" up --data-dir "$data" "$@"
