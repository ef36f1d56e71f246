#!/usr/bin/env bash
# Resource API benchmark: a `lattice-server --dev` of the dist profile (embedded store, fsync on every
# commit) driven over HTTP by lattice-api-bench on loopback. Prints
# `RESULT name=value` lines: creates/s with 16 clients, create/get/list p50/p99, watch
# event latency with 1,000 watchers, and server memory per 100,000 stored allocations.
# Tunables: BENCH_CLIENTS (16), BENCH_SECONDS (10), BENCH_WATCHERS (1000),
# BENCH_WATCH_TIMELINE (a file for the watch phase's per-write latencies).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build dist
B=$LATTICE_BIN

work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

echo "==> starting lattice-server --dev on 127.0.0.1:28480"
"$B/lattice-server" --dev --data-dir "$work/data" --api-addr 127.0.0.1:28480 \
  --tls-addr off --etcd-addr off >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  curl -fsS http://127.0.0.1:28480/readyz >/dev/null 2>&1 && [ -s "$work/data/admin.token" ] && break
  sleep 0.1
done
curl -fsS http://127.0.0.1:28480/readyz >/dev/null || { cat "$work/server.log"; exit 1; }
sleep 1 # let --dev finish creating the default tenant and vCluster

echo "==> load: ${BENCH_CLIENTS:-16} clients for ${BENCH_SECONDS:-10}s, then ${BENCH_WATCHERS:-1000} watchers"
"$B/lattice-api-bench" --url http://127.0.0.1:28480 \
  --token-file "$work/data/admin.token" --server-pid "$pid" \
  --clients "${BENCH_CLIENTS:-16}" --seconds "${BENCH_SECONDS:-10}" \
  --watchers "${BENCH_WATCHERS:-1000}" \
  ${BENCH_WATCH_TIMELINE:+--watch-timeline "$BENCH_WATCH_TIMELINE"}
echo "RESULT cores=$(nproc)"
