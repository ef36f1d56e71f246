#!/usr/bin/env bash
# Resource API benchmark: a `lattice-server --dev` of the dist profile (embedded store, fsync on every
# commit) driven over HTTP by lattice-api-bench on loopback. Prints
# `RESULT name=value` lines: creates/s with 16 clients, create/get/list p50/p99, watch
# event latency with 1,000 watchers, and server memory per 100,000 stored allocations.
#
# The machines' disks swing by 3x from day to day, so the same run first measures Debian's
# etcd 3.4 (/usr/bin/etcd, fsync on every commit too) with the same number of clients
# doing plain 256-byte puts (lattice-bench --concurrent-clients) on the same
# filesystem, and prints `creates_ratio_vs_etcd_puts` (Lattice creates/s / etcd puts/s;
# the target is >= 2.0).
#
# The load is a person's: an OIDC ID token from the test OpenID provider (hack/oidc, the
# account `bench`, made system-admin by its `lattice_role` claim as the admin token was:
# a user's per-identity rate limit, 100 requests/s, would be the figure otherwise),
# obtained through the device flow by hack/oidc/device-login.py, checked by the server's
# OIDC authenticator and RBAC, with the default audit policy writing a signed record of
# every create. BENCH_AUTH=hs256 uses the
# server's admin token instead (the figure before identity and audit).
#
# Tunables: BENCH_CLIENTS (16), BENCH_SECONDS (10), BENCH_WATCHERS (1000),
# BENCH_WATCH_TIMELINE (a file for the watch phase's per-write latencies),
# BENCH_SERVER / BENCH_API_CLIENT (other lattice-server / lattice-api-bench binaries, e.g.
# an earlier build's, for before/after comparisons; the etcd client is always this tree's).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build dist
B=$LATTICE_BIN
server="${BENCH_SERVER:-$B/lattice-server}"
api_client="${BENCH_API_CLIENT:-$B/lattice-api-bench}"
clients="${BENCH_CLIENTS:-16}"
seconds="${BENCH_SECONDS:-10}"

work=$(mktemp -d)
pid=
etcd_pid=
idp_pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  [ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null
  [ -n "$idp_pid" ] && kill "$idp_pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
out="$work/results"
touch "$out"

echo "==> starting etcd $(etcd --version | head -1 | awk '{print $3}') on 127.0.0.1:23891"
etcd --name bench-api --data-dir "$work/etcd" --listen-client-urls http://127.0.0.1:23891 \
  --advertise-client-urls http://127.0.0.1:23891 --listen-peer-urls http://127.0.0.1:23901 \
  --initial-advertise-peer-urls http://127.0.0.1:23901 \
  --initial-cluster bench-api=http://127.0.0.1:23901 --initial-cluster-state new \
  --log-level error >"$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 150); do
  ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:23891 endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:23891 endpoint health >/dev/null || { cat "$work/etcd.log"; exit 1; }
echo "==> etcd: $clients clients doing plain puts for ${seconds}s"
"$B/lattice-bench" --name etcd --endpoint 127.0.0.1:23891 \
  --concurrent-clients "$clients" --seconds "$seconds" | tee -a "$out"
# etcd is done before Lattice starts: the two never share the disk's time.
kill "$etcd_pid" 2>/dev/null || true
wait "$etcd_pid" 2>/dev/null || true
etcd_pid=

auth="${BENCH_AUTH:-oidc}"
oidc_args=()
if [ "$auth" = oidc ]; then
  echo "==> starting the test OpenID provider (hack/oidc)"
  (cd hack/oidc && ACCOUNTS='{"bench": {"tenants": ["default"], "lattice_role": "system-admin"}}' exec node provider.js) >"$work/idp.log" 2>&1 &
  idp_pid=$!
  for _ in $(seq 100); do grep -q '^READY ' "$work/idp.log" && break; sleep 0.1; done
  issuer=$(awk '/^READY /{print $2}' "$work/idp.log")
  [ -n "$issuer" ] || { cat "$work/idp.log"; exit 1; }
  printf 'issuers:\n- issuer: %s\n  audiences: [lattice]\n  usernameClaim: preferred_username\n' "$issuer" >"$work/oidc.yaml"
  oidc_args=(--oidc-config "$work/oidc.yaml")
fi

echo "==> starting lattice-server --dev on 127.0.0.1:28480 (auth: $auth, audit: default policy)"
"$server" --dev --data-dir "$work/data" --api-addr 127.0.0.1:28480 \
  --tls-addr off --etcd-addr off "${oidc_args[@]}" >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  curl -fsS http://127.0.0.1:28480/readyz >/dev/null 2>&1 && [ -s "$work/data/admin.token" ] && break
  sleep 0.1
done
curl -fsS http://127.0.0.1:28480/readyz >/dev/null || { cat "$work/server.log"; exit 1; }
sleep 1 # let --dev finish creating the default tenant and vCluster
token_file="$work/data/admin.token"
if [ "$auth" = oidc ]; then
  hack/oidc/device-login.py "$issuer" bench >"$work/oidc.token"
  token_file="$work/oidc.token"
  curl -fsS -H "Authorization: Bearer $(cat "$token_file")" http://127.0.0.1:28480/v1/auth/whoami
  echo
fi

echo "==> load: $clients clients for ${seconds}s, then ${BENCH_WATCHERS:-1000} watchers"
"$api_client" --url http://127.0.0.1:28480 \
  --token-file "$token_file" --server-pid "$pid" \
  --clients "$clients" --seconds "$seconds" \
  --watchers "${BENCH_WATCHERS:-1000}" \
  ${BENCH_WATCH_TIMELINE:+--watch-timeline "$BENCH_WATCH_TIMELINE"} | tee -a "$out"
val() { grep "^RESULT $1=" "$out" | cut -d= -f2; }
echo "RESULT creates_ratio_vs_etcd_puts=$(awk -v a="$(val creates_per_s)" -v b="$(val "etcd_puts_per_s_${clients}_clients")" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')"
echo "RESULT auth=$auth"
echo "RESULT audit_records=$(curl -fsS http://127.0.0.1:28480/metrics | awk '/^lattice_audit_records_total /{print $2}')"
echo "RESULT cores=$(nproc)"
