#!/usr/bin/env bash
# Quickstart: build Lattice, start a local single-member dev server, apply the example
# manifests and show them. Leaves the server running in the foreground; Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
export PROTOC="${PROTOC:-$(command -v protoc)}"

echo "==> building (release)"
cargo build --release -p lattice-server -p lattice-cli

data=${LATTICE_DATA_DIR:-.lattice-dev}
api=${LATTICE_API_ADDR:-127.0.0.1:8080}
echo "==> starting lattice-server --dev (data in $data, API on $api)"
target/release/lattice-server --dev --data-dir "$data" --api-addr "$api" --etcd-addr "${LATTICE_ETCD_ADDR:-127.0.0.1:2379}" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT INT TERM
for _ in $(seq 200); do
  [ -s "$data/admin.token" ] && curl -sf "http://$api/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

export LATTICE_API_URL="http://$api" LATTICE_TOKEN="$(cat "$data/admin.token")"
lattice=target/release/lattice
set -x
$lattice api-resources
$lattice apply -f manifests/examples/
$lattice get tenants
$lattice get vclusters -A
$lattice get dags -A -o wide
$lattice get allocations -A
set +x
echo
echo "The dev server keeps running (Ctrl-C to stop). In another shell:"
echo "  export LATTICE_API_URL=$LATTICE_API_URL LATTICE_TOKEN=\$(cat $data/admin.token)"
echo "  $lattice get allocations -A -w"
wait $server
