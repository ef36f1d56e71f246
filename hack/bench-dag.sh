#!/usr/bin/env bash
# DAG benchmarks, printing `RESULT name=value` lines:
#  1. the pure engine (lattice-dag-bench): its validation of a 10,000-step DAG
#     (engine_validate_10000_ms, what the CLI checks before submitting) and one dispatch
#     decision (engine_release_p99_ms); then the API server's admission of a 10,000-step
#     DAG (lattice-dag-e2e-bench admission: typed parse, defaults, every step checked as
#     an Allocation, names, references, cycles; target validate_10000_ms < 20);
#  2. the DAG controller in-process on an embedded store: from a predecessor's terminal
#     status write to its successor's release, over a BENCH_DAG_STEPS-step chain
#     (release_p99_ms; target < 5 ms);
#  3. end to end on a local cluster started with `lattice up --detach` (dist
#     lattice-server --dev + BENCH_DAG_AGENTS agents, default 4; stopped with
#     `lattice down`): a BENCH_DAG_STEPS-step chain and a BENCH_DAG_STEPS-wide
#     fan-out/fan-in (root, BENCH_DAG_STEPS workers, join; the bench raises the cluster's
#     scheduling.max_dag_size for it and resets it) of /bin/true steps. Per shape: total wall time (dag_<shape>_<n>_s),
#     the steps' own runtime on the critical path (dag_<shape>_<n>_steps_runtime_s, from
#     dag_step_runtime_ms, /bin/true measured locally), and the overhead over it
#     (dag_<shape>_<n>_overhead_s, dag_<shape>_<n>_overhead_ms_per_step).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
STEPS=${BENCH_DAG_STEPS:-1000}
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build dist
B=$LATTICE_BIN

echo "==> engine"
"$B/lattice-dag-bench"
echo "==> API server admission of a 10,000-step DAG"
"$B/lattice-dag-e2e-bench" admission --steps 10000
echo "==> controller, in-process, $STEPS-step chain"
"$B/lattice-dag-e2e-bench" in-process --steps "$STEPS"

# Part 3 on a cluster `lattice up --detach` starts (lattice-server --dev and
# BENCH_DAG_AGENTS agents, found next to $B/lattice); `lattice down` stops it.
agents=${BENCH_DAG_AGENTS:-4}
api=${BENCH_DAG_API_ADDR:-127.0.0.1:28680}
work=$(mktemp -d)
data="$work/up"
cleanup() {
  if [ -e "$data/up.json" ]; then
    "$B/lattice" down --data-dir "$data" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
echo "==> cluster: lattice up --detach --agents $agents, $STEPS-step chain and $STEPS-wide fan-out"
up_started=$(date +%s.%N)
if ! "$B/lattice" up --detach --agents "$agents" --data-dir "$data" \
    --api-addr "$api" --timeout 120 >"$work/up.out" 2>"$work/up.err"; then
  cat "$work/up.out" "$work/up.err" >&2
  for f in "$data"/logs/*; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
fi
sed 's/^/    /' "$work/up.out"
awk -v a="$(date +%s.%N)" -v b="$up_started" 'BEGIN { printf "RESULT dag_cluster_up_s=%.2f\n", a - b }'
# `lattice up` prints `export LATTICE_API_URL=...` and `export LATTICE_TOKEN_FILE=...`.
url=$(sed -n 's/^export LATTICE_API_URL=//p' "$work/up.out")
token_file=$(sed -n 's/^export LATTICE_TOKEN_FILE=//p' "$work/up.out")
if [ -z "$url" ] || [ ! -s "$token_file" ]; then
  echo "lattice up printed no API URL or token file" >&2
  exit 1
fi
"$B/lattice-dag-e2e-bench" cluster --url "$url" --token-file "$token_file" --steps "$STEPS"
