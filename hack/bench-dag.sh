#!/usr/bin/env bash
# DAG benchmarks, printing `RESULT name=value` lines:
#  1. the pure engine (lattice-dag-bench): validation of a 10,000-step DAG
#     (target validate_10000_ms < 20) and one dispatch decision (engine_release_p99_ms);
#  2. the DAG controller in-process on an embedded store: from a predecessor's terminal
#     status write to its successor's release, over a BENCH_DAG_STEPS-step chain
#     (release_p99_ms; target < 5 ms);
#  3. end to end on a local cluster (release lattice-server --dev + 4 agents): a
#     BENCH_DAG_STEPS-step chain and a BENCH_DAG_STEPS-wide fan-out/fan-in of /bin/true
#     steps, total time and overhead per step.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
export PROTOC="${PROTOC:-$(command -v protoc)}"
STEPS=${BENCH_DAG_STEPS:-1000}
echo "==> building release binaries"
cargo build --release -q -p lattice-dag --bin lattice-dag-bench
cargo build --release -q -p lattice-server -p lattice-agent -p lattice-e2e --bins

echo "==> engine"
target/release/lattice-dag-bench
echo "==> controller, in-process, $STEPS-step chain"
target/release/lattice-dag-e2e-bench in-process --steps "$STEPS"

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
api=127.0.0.1:28680
echo "==> cluster: lattice-server --dev + 4 agents, $STEPS-step chain and $STEPS-wide fan-out"
target/release/lattice-server --dev --data-dir "$work/server" --api-addr "$api" \
  --tls-addr off --etcd-addr off >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  curl -fsS "http://$api/readyz" >/dev/null 2>&1 && [ -s "$work/server/admin.token" ] && break
  sleep 0.1
done
token=$(cat "$work/server/admin.token")
for i in 1 2 3 4; do
  LATTICE_AGENT_TOKEN=$token target/release/lattice-agent --node-id "node-0$i" \
    --api-url "http://$api" --state-dir "$work/agents/node-0$i" \
    --topology-group $(( (i - 1) / 2 )) >"$work/agent-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 300); do
  ready=$(curl -fsS -H "Authorization: Bearer $token" "http://$api/apis/lattice.dev/v1alpha1/nodes" \
    | grep -o '"state":"Ready"' | wc -l || true)
  [ "$ready" -ge 4 ] && break
  sleep 0.1
done
target/release/lattice-dag-e2e-bench cluster --url "http://$api" \
  --token-file "$work/server/admin.token" --steps "$STEPS"
