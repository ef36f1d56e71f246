#!/usr/bin/env bash
# End-to-end job throughput, Lattice beside real Slurm 22.05 on this machine, with the same
# number of job slots: 4 full-node agents (Lattice) vs `sbatch --exclusive` on 4 slurmd.
# Lattice gets BENCH_JOBS (1000) trivial jobs, Slurm BENCH_SLURM_JOBS (300: with
# --exclusive, Slurm 22.05 runs about 2 jobs/s here, so 1,000 would not fit the 10-minute
# budget); prints `RESULT` lines: submit rate, first-submit-to-all-done time and jobs/s per
# system, `e2e_throughput_ratio_vs_slurm` (jobs/s over jobs/s), and the agent's RSS and CPU
# time per heartbeat.
# Needs root (network namespace for Slurm) and slurm-wlm (hack/install-deps.sh --peers
# installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh --peers >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
JOBS=${BENCH_JOBS:-1000}
SLURM_JOBS=${BENCH_SLURM_JOBS:-300}
lattice_build dist
B=$LATTICE_BIN

work=$(mktemp -d)
chmod 755 "$work"   # munged (user munge) must reach its socket under it
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  SLURMDIR="$work/slurm" hack/slurm/down.sh >/dev/null 2>&1 || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- Lattice
api=127.0.0.1:28580
tls=127.0.0.1:28581
echo "==> Lattice: lattice-server --dev + 4 agents (dist profile), $JOBS jobs"
"$B/lattice-server" --dev --data-dir "$work/server" --api-addr "$api" \
  --tls-addr "$tls" --etcd-addr off >"$work/server.log" 2>&1 &
server=$!; pids+=("$server")
for _ in $(seq 300); do
  curl -fsS "http://$api/readyz" >/dev/null 2>&1 && [ -s "$work/server/admin.token" ] && break
  sleep 0.1
done
token=$(cat "$work/server/admin.token")
# The agents run the jobs as this user (--unknown-user agent): as root, that needs tenant
# default's leave (spec.runAs.allowUsers), as `lattice up` gives it; without root there
# are no cgroups to limit them with.
curl -fsS -X PATCH -H "Authorization: Bearer $token" -H "Content-Type: application/merge-patch+json" \
  -d "{\"spec\":{\"runAs\":{\"allowUsers\":[\"$(id -un)\"]}}}" \
  "http://$api/apis/lattice.dev/v1alpha1/tenants/default" >/dev/null
cgroups=(); [ "$(id -u)" -eq 0 ] || cgroups=(--no-cgroups)
agent_pids=()
for i in 1 2 3 4; do
  # Each agent enrolls with a single-use bootstrap token and talks mutual TLS, as in production.
  mkdir -p "$work/agents/node-0$i"
  LATTICE_TOKEN=$token "$B/lattice" --api-url "http://$api" \
    admin node bootstrap-token --node "node-0$i" --ttl 10m | tail -1 >"$work/agents/node-0$i.token"
  "$B/lattice-agent" --node-id "node-0$i" --ca-file "$work/server/pki/ca.crt" \
    --bootstrap-token-file "$work/agents/node-0$i.token" \
    --api-url "https://$tls" --state-dir "$work/agents/node-0$i" "${cgroups[@]}" \
    --topology-group $(( (i - 1) / 2 )) --unknown-user agent >"$work/agent-$i.log" 2>&1 &
  agent_pids+=($!); pids+=($!)
done
for _ in $(seq 300); do
  ready=$(curl -fsS -H "Authorization: Bearer $token" "http://$api/apis/lattice.dev/v1alpha1/nodes" \
    | grep -o '"state":"Ready"' | wc -l || true)
  [ "$ready" -ge 4 ] && break
  sleep 0.1
done
# Idle cost: the agent's RSS, and CPU time per heartbeat interval (default 5 s) of the
# agent and of the server (all threads, from /proc/PID/task/*/schedstat, over 30 s). The
# server figure is everything the server does per interval with 4 idle agents.
cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{s+=$1} END {print s}'; }
a0=${agent_pids[0]}
ns0=$(cpu_ns "$a0"); sv0=$(cpu_ns "$server")
sleep 30
ns1=$(cpu_ns "$a0"); sv1=$(cpu_ns "$server")
echo "RESULT agent_rss_mib=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$a0/status")"
echo "RESULT agent_cpu_ms_per_heartbeat=$(awk -v a="$ns0" -v b="$ns1" 'BEGIN {printf "%.3f", (b-a)/1e6/6}')"
echo "RESULT server_cpu_ms_per_interval_4_agents=$(awk -v a="$sv0" -v b="$sv1" 'BEGIN {printf "%.3f", (b-a)/1e6/6}')"
lat=$("$B/lattice-e2e-bench" --url "http://$api" --token-file "$work/server/admin.token" \
  --jobs "$JOBS" --clients 16 --prefix lattice)
echo "$lat"
lattice_rate=$(echo "$lat" | sed -n 's/^RESULT lattice_jobs_per_s=//p')
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()

# ---------------------------------------------------------------- Slurm
echo "==> Slurm 22.05: slurmctld + 4 slurmd, $SLURM_JOBS x sbatch --exclusive --wrap=true"
export SLURMDIR="$work/slurm" SLURM_NETNS=lattice-bench-slurm
hack/slurm/up.sh >"$work/slurm-up.log" 2>&1 || { cat "$work/slurm-up.log"; exit 1; }
export SLURM_CONF=$SLURMDIR/slurm.conf
NS="nsenter --net=/run/netns/$SLURM_NETNS"
mkdir -p "$SLURMDIR/out"
start=$(date +%s.%N)
for i in $(seq "$SLURM_JOBS"); do
  $NS sbatch --exclusive --parsable -o /dev/null -e /dev/null --wrap=true >/dev/null
done
submitted=$(date +%s.%N)
while [ "$($NS squeue -h | wc -l)" -gt 0 ]; do sleep 0.1; done
done_t=$(date +%s.%N)
slurm_s=$(awk -v a="$start" -v b="$done_t" 'BEGIN {printf "%.2f", b-a}')
slurm_rate=$(awk -v s="$slurm_s" -v n="$SLURM_JOBS" 'BEGIN {printf "%.2f", n/s}')
echo "RESULT slurm_jobs=$SLURM_JOBS"
echo "RESULT slurm_submit_per_s=$(awk -v a="$start" -v b="$submitted" -v n="$SLURM_JOBS" 'BEGIN {printf "%.1f", n/(b-a)}')"
echo "RESULT slurm_first_submit_to_all_done_s=$slurm_s"
echo "RESULT slurm_jobs_per_s=$slurm_rate"
echo "RESULT e2e_throughput_ratio_vs_slurm=$(awk -v l="$lattice_rate" -v s="$slurm_rate" 'BEGIN {printf "%.2f", l/s}')"
echo "RESULT cores=$(nproc)"
