#!/usr/bin/env bash
# Heartbeat load on the control plane (the seed's "10,000 node agents reporting: < 1% CPU
# on quorum"): a `lattice-server --dev` of the dist profile and lattice-heartbeat-bench,
# which holds one heartbeat stream per simulated agent open (what lattice-agent does: over
# mutual TLS, each simulated agent with a node certificate of its own from the server's CA)
# and beats on each every interval, spread evenly. Prints `RESULT name=value` lines: the
# server's CPU (all threads, utime + stime) in % of one core with the streams beating, the
# idle baseline, heartbeats/s and CPU per heartbeat; and the RSS and CPU per heartbeat
# interval of one real, idle lattice-agent running beside them.
# Tunables: BENCH_AGENTS (10000), BENCH_INTERVAL (10, seconds: the agent's default),
# BENCH_SECONDS (60, each measurement window).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build dist
B=$LATTICE_BIN

# One socket per simulated agent on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
need=$(( ${BENCH_AGENTS:-10000} + 1000 ))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
  echo "open-file limit $(ulimit -n) is below $need: raise it (ulimit -n) or lower BENCH_AGENTS" >&2
  exit 1
fi

work=$(mktemp -d)
pid=
agent=
cleanup() {
  [ -n "$agent" ] && kill "$agent" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

api=127.0.0.1:28490
tls=127.0.0.1:28491
echo "==> starting lattice-server --dev on $api (HTTPS $tls)"
RUST_LOG=warn "$B/lattice-server" --dev --data-dir "$work/data" --api-addr "$api" \
  --tls-addr "$tls" --etcd-addr off >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  curl -fsS "http://$api/readyz" >/dev/null 2>&1 && [ -s "$work/data/admin.token" ] && break
  sleep 0.1
done
{ curl -fsS "http://$api/readyz" >/dev/null && [ -s "$work/data/admin.token" ]; } || { cat "$work/server.log"; exit 1; }

echo "==> one real lattice-agent (10s heartbeat interval), enrolled with a bootstrap token"
cgroups=(); [ "$(id -u)" -eq 0 ] || cgroups=(--no-cgroups)  # only root can make them
LATTICE_TOKEN=$(cat "$work/data/admin.token") "$B/lattice" --api-url "http://$api" \
  admin node bootstrap-token --node real-agent-0 --ttl 10m | tail -1 >"$work/bootstrap-token"
RUST_LOG=warn "$B/lattice-agent" --node-id real-agent-0 --api-url "https://$tls" "${cgroups[@]}" \
  --ca-file "$work/data/pki/ca.crt" --bootstrap-token-file "$work/bootstrap-token" \
  --state-dir "$work/agent" --heartbeat-interval 10s >"$work/agent.log" 2>&1 &
agent=$!

echo "==> ${BENCH_AGENTS:-10000} simulated agents, one beat per ${BENCH_INTERVAL:-10}s each; ${BENCH_SECONDS:-60}s windows"
"$B/lattice-heartbeat-bench" --url "http://$api" --tls-addr "$tls" --pki-dir "$work/data/pki" \
  --token-file "$work/data/admin.token" --server-pid "$pid" \
  --agents "${BENCH_AGENTS:-10000}" --interval "${BENCH_INTERVAL:-10}" \
  --measure-s "${BENCH_SECONDS:-60}" --agent-pid "$agent" --agent-interval 10
echo "RESULT cores=$(nproc)"
