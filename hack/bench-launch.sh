#!/usr/bin/env bash
# MPI launch and wire-up time, Lattice beside mpiexec and real Slurm 22.05 on this machine:
# from invocation to exit of the launcher, for an MPI hello world (agent/tests/mpi/hello.c:
# MPI_Init, a barrier, an allreduce, MPI_Finalize; `mpicc.mpich -O2`, MPICH 4.0.2) of 4, 16
# and 64 ranks. Each rank prints a line, and a launch counts only if it exits 0 with one
# correct `hello rank=` line per rank.
#   lattice  lattice-server --dev and 4 agents, as hack/bench-e2e.sh starts them; one holder
#            allocation (`lattice submit -N 4 -- sleep 3600`) runs on all four, and each
#            launch is a job step in it: `lattice launch --alloc=HOLDER --mpi=pmi2
#            --ntasks N --tasks-per-node N/4` (the agents' PMI server wires the ranks up; the
#            CLI creates the step, streams its output and waits for it to end).
#   slurm    hack/slurm/up.sh's 4 slurmd (n1..n4, 4 CPUs each); one holder job (`sbatch -N4
#            --exclusive --wrap='sleep 3600'`), and each launch is a step in it, like
#            Lattice's: `srun --jobid=HOLDER -N4 -n N --ntasks-per-node=N/4 --overcommit
#            --mpi=pmi2` (Slurm's pmi2 plugin also serves MPICH's PMI-1). A bare `srun -N4`
#            would create and schedule a job for every launch as well, which Lattice's
#            figure does not include. --overcommit: 64 ranks are 16 per 4-CPU node, and
#            without it slurmctld refuses the step ("More processors requested than
#            permitted"); it is given at every size. srun runs in Slurm's network namespace
#            (`nsenter --net`, a few ms of the figure).
#   mpiexec  `mpiexec.mpich -n N` with hydra's default launcher on localhost: one proxy and
#            every rank on one node, so MPICH wires them up over shared memory alone; no
#            scheduler, no allocation. Lattice and Slurm tell MPICH of 4 nodes of N/4 ranks
#            (PMI_process_mapping), so their ranks also connect over TCP on loopback.
# All ranks get HWLOC_COMPONENTS=-gl (without it each one probes 40 X11 addresses). The
# systems run one after the other (mpiexec, Lattice, Slurm), each alone on the machine:
# one untimed launch of the fewest ranks first, then BENCH_LAUNCH_RUNS (5) timed launches
# per rank count. Lattice's agents put every task in cgroups (as root); this Slurm uses
# proctrack/linuxproc and task/none, so it places none.
# Prints `RESULT` lines: `{mpiexec,lattice,slurm}_launch_N_s` (medians, seconds) for each
# rank count and `launch_ratio_N_vs_best_peer` (Lattice's median over the faster peer's, for
# the most ranks; target <= 1 at 64). Knobs: BENCH_LAUNCH_RUNS, BENCH_LAUNCH_RANKS ("4 16
# 64", multiples of 4).
# Needs root (network namespace for Slurm), slurm-wlm and mpich (hack/install-deps.sh
# --peers installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh --peers >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
RUNS=${BENCH_LAUNCH_RUNS:-5}
RANKS=${BENCH_LAUNCH_RANKS:-4 16 64}
most=0  # the most ranks: the ratio's rank count
for n in $RANKS; do
  if [ "$n" -le 0 ] || [ $((n % 4)) -ne 0 ]; then
    echo "BENCH_LAUNCH_RANKS: $n is not a positive multiple of 4" >&2
    exit 1
  fi
  if [ "$n" -gt "$most" ]; then most=$n; fi
done
lattice_build dist
B=$LATTICE_BIN

work=$(mktemp -d)
chmod 755 "$work"   # munged (user munge) must reach its socket under it
pids=()
lattice=()       # the CLI with the API's address and token, once the server is up
holder=""        # Lattice's holder allocation, cancelled before its agents stop
slurm_holder=""  # Slurm's, cancelled before slurmd stops (its slurmstepd would outlive it)
cleanup() {
  # The agents' task shims outlive an agent by design: end the holder's tasks first.
  if [ -n "$holder" ]; then
    "${lattice[@]}" cancel "$holder" >/dev/null 2>&1 || true
    for _ in $(seq 100); do
      [ "$("${lattice[@]}" status "$holder" --state active --count 2>/dev/null || echo 0)" = 0 ] && break
      sleep 0.1
    done
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$slurm_holder" ]; then
    $NS scancel "$slurm_holder" 2>/dev/null || true
    for _ in $(seq 100); do
      [ -z "$($NS squeue -h 2>/dev/null || true)" ] && break
      sleep 0.1
    done
  fi
  SLURMDIR="$work/slurm" hack/slurm/down.sh >/dev/null 2>&1 || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

hello=$work/hello
echo "==> mpicc.mpich -O2 agent/tests/mpi/hello.c"
mpicc.mpich -O2 -o "$hello" agent/tests/mpi/hello.c

# The median of numbers, one per line on stdin; an even count's mean of the middle two.
median_of() {
  sort -g | awk '{ v[NR] = $1 }
    END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# timed N CMD...: runs CMD (a launch of N ranks) and prints the seconds from its start to
# its exit; stops the benchmark unless it exited 0 with N correct hello lines (each launch
# has 5 minutes, so that a wire-up that hangs fails it).
timed() {
  local n=$1 t0 t1 got
  shift
  t0=$(date +%s.%N)
  "$@" >"$work/launch.out" 2>&1 || { echo "failed: $*" >&2; cat "$work/launch.out" >&2; return 1; }
  t1=$(date +%s.%N)
  got=$(grep -c "^hello rank=[0-9]* size=$n sum=$((n * (n - 1) / 2))\$" "$work/launch.out" || true)
  if [ "$got" -ne "$n" ]; then
    echo "$* printed $got of $n hello lines:" >&2
    cat "$work/launch.out" >&2
    return 1
  fi
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", b - a}'
}

# bench SYSTEM: launch_SYSTEM N K runs N ranks, K on each of 4 nodes. One untimed launch,
# then RUNS timed ones per rank count; their median goes to median[SYSTEM_N].
declare -A median
bench() {
  local sys=$1 n times t
  timed 4 "launch_$sys" 4 1 >/dev/null
  for n in $RANKS; do
    times=()
    for _ in $(seq "$RUNS"); do
      t=$(timed "$n" "launch_$sys" "$n" $((n / 4)))
      times+=("$t")
    done
    echo "    $sys, $n ranks: ${times[*]} s"
    median[${sys}_$n]=$(printf '%s\n' "${times[@]}" | median_of)
    echo "RESULT ${sys}_launch_${n}_s=${median[${sys}_$n]}"
  done
}

# ---------------------------------------------------------------- mpiexec
echo "==> mpiexec.mpich -n N (hydra, one node), $RUNS runs per rank count"
launch_mpiexec() { timeout 300 mpiexec.mpich -n "$1" -genv HWLOC_COMPONENTS -gl "$hello"; }
bench mpiexec

# ---------------------------------------------------------------- Lattice
api=127.0.0.1:28780
tls=127.0.0.1:28781
echo "==> Lattice: lattice-server --dev + 4 agents ($(basename "$B") profile), $RUNS runs per rank count"
"$B/lattice-server" --dev --data-dir "$work/server" --api-addr "$api" \
  --tls-addr "$tls" --etcd-addr off >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  curl -fsS "http://$api/readyz" >/dev/null 2>&1 && [ -s "$work/server/admin.token" ] && break
  sleep 0.1
done
token=$(cat "$work/server/admin.token")
lattice=("$B/lattice" --api-url "http://$api" --token-file "$work/server/admin.token")
# The agents run the tasks as this user (--unknown-user agent): as root, that needs tenant
# default's leave (spec.runAs.allowUsers), as `lattice up` gives it; without root there
# are no cgroups to limit them with.
curl -fsS -X PATCH -H "Authorization: Bearer $token" -H "Content-Type: application/merge-patch+json" \
  -d "{\"spec\":{\"runAs\":{\"allowUsers\":[\"$(id -un)\"]}}}" \
  "http://$api/apis/lattice.dev/v1alpha1/tenants/default" >/dev/null
cgroups=(); [ "$(id -u)" -eq 0 ] || cgroups=(--no-cgroups)
for i in 1 2 3 4; do
  # Each agent enrolls with a single-use bootstrap token and talks mutual TLS, as in production.
  mkdir -p "$work/agents/node-0$i"
  "${lattice[@]}" admin node bootstrap-token --node "node-0$i" --ttl 10m | tail -1 >"$work/agents/node-0$i.token"
  "$B/lattice-agent" --node-id "node-0$i" --ca-file "$work/server/pki/ca.crt" \
    --bootstrap-token-file "$work/agents/node-0$i.token" \
    --api-url "https://$tls" --state-dir "$work/agents/node-0$i" "${cgroups[@]}" \
    --topology-group $(( (i - 1) / 2 )) --unknown-user agent >"$work/agent-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 300); do
  ready=$(curl -fsS -H "Authorization: Bearer $token" "http://$api/apis/lattice.dev/v1alpha1/nodes" \
    | grep -o '"state":"Ready"' | wc -l || true)
  [ "$ready" -ge 4 ] && break
  sleep 0.1
done
holder=$("${lattice[@]}" submit -N 4 --walltime 1h --name launch-holder --parsable -- sleep 3600)
for _ in $(seq 300); do
  [ "$("${lattice[@]}" status "$holder" --state running --count)" = 1 ] && break
  sleep 0.1
done
[ "$("${lattice[@]}" status "$holder" --state running --count)" = 1 ] \
  || { echo "holder allocation $holder is not running" >&2; "${lattice[@]}" status "$holder" >&2; exit 1; }
launch_lattice() {
  timeout 300 "${lattice[@]}" launch --alloc="$holder" --mpi=pmi2 --ntasks "$1" --tasks-per-node "$2" \
    --env HWLOC_COMPONENTS=-gl -- "$hello"
}
bench lattice
"${lattice[@]}" cancel "$holder" >/dev/null
for _ in $(seq 100); do
  [ "$("${lattice[@]}" status "$holder" --state active --count)" = 0 ] && break
  sleep 0.1
done
holder=""
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()

# ---------------------------------------------------------------- Slurm
echo "==> Slurm 22.05: slurmctld + 4 slurmd, srun --mpi=pmi2 steps in one job, $RUNS runs per rank count"
export SLURMDIR="$work/slurm" SLURM_NETNS=lattice-bench-launch
hack/slurm/up.sh >"$work/slurm-up.log" 2>&1 || { cat "$work/slurm-up.log"; exit 1; }
export SLURM_CONF=$SLURMDIR/slurm.conf
NS="nsenter --net=/run/netns/$SLURM_NETNS"
slurm_holder=$($NS sbatch -N4 --exclusive --parsable -o /dev/null -e /dev/null --wrap='sleep 3600')
for _ in $(seq 300); do
  [ "$($NS squeue -h -j "$slurm_holder" -o %t)" = R ] && break
  sleep 0.1
done
[ "$($NS squeue -h -j "$slurm_holder" -o %t)" = R ] \
  || { echo "holder job $slurm_holder is not running" >&2; $NS squeue >&2; exit 1; }
launch_slurm() {
  timeout 300 nsenter --net="/run/netns/$SLURM_NETNS" srun --jobid="$slurm_holder" -N4 -n "$1" \
    --ntasks-per-node="$2" --overcommit --mpi=pmi2 --export=ALL,HWLOC_COMPONENTS=-gl "$hello"
}
bench slurm

# ---------------------------------------------------------------- ratio
echo "RESULT launch_ratio_${most}_vs_best_peer=$(awk -v l="${median[lattice_$most]}" \
  -v m="${median[mpiexec_$most]}" -v s="${median[slurm_$most]}" 'BEGIN {printf "%.2f", l / (m < s ? m : s)}')"
echo "RESULT cores=$(nproc)"
