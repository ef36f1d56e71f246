#!/usr/bin/env bash
# Replays the Parallel Workloads Archive traces through rm-replay (dist profile) and prints
# our figures next to the published ones (controllers/scheduler/testdata/README.md), then
# hpc-backfill against EASY and the EASY++ figures of issue 36 on the first 10,000 jobs of
# four traces: average bounded slowdown, utilization, longest and p95 wait. TRACES overrides
# the trace directory (controllers/scheduler/testdata, where the tests read them too).
set -euo pipefail
cd "$(dirname "$0")/.."
TRACES="${TRACES:-controllers/scheduler/testdata}"
hack/install-deps.sh >/dev/null
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
lattice_build dist
R=$LATTICE_BIN/rm-replay

bsld() { "$R" "$@" -o json | sed -n 's/^ *"avg_bounded_slowdown": \([0-9.eE+-]*\),*$/\1/p' | head -1; }
row() { # name published ours
  awk -v n="$1" -v p="$2" -v o="$3" 'BEGIN { d = (o - p) / p * 100;
    printf "%-46s published %10.4f  ours %10.4f  diff %+7.3f%%  %s\n", n, p, o, d, (d < 0.5 && d > -0.5) ? "OK" : "MISS" }'
}

echo "== Gaussier et al. (SC'15): EASY, requested times, predictsim filter, size = requested"
echo "   $R --trace \$TRACES/<trace> --policy easy --filter predictsim --size requested"
row "EASY KTH-SP2 v2 uncleaned (28,481 jobs)" 92.5765 \
  "$(bsld --trace "$TRACES/KTH-SP2-1996-2.swf.gz" --policy easy --filter predictsim --size requested)"
row "EASY CTC-SP2 3.1-cln (77,199 jobs)" 49.571 \
  "$(bsld --trace "$TRACES/CTC-SP2-1996-3.1-cln.swf.gz" --policy easy --filter predictsim --size requested)"

echo
echo "== RLScheduler (SC'20): FCFS, 10 windows x 1024 jobs of the first 10,000 (numpy RandomState seeded"
echo "   by gym's np_random(1)), size = max, RLScheduler's job loading"
echo "   $R --trace \$TRACES/<trace> --policy fcfs --filter rlscheduler --windows 10 --window-size 1024 --seed 1 --size max"
for t in "SDSC-SP2-1998-4.2-cln:1727.54" "HPC2N-2002-2.2-cln:297.18" "lublin_256:7273.77"; do
  name="${t%%:*}"; pub="${t##*:}"
  row "FCFS windows $name" "$pub" \
    "$(bsld --trace "$TRACES/$name.swf.gz" --policy fcfs --filter rlscheduler --windows 10 --window-size 1024 --seed 1 --size max)"
done

echo
echo "== hpc-backfill (lattice policy: learned runtimes, shortest predicted backfilled first) vs EASY"
echo "   and EASY++ (Tsafrir et al.; an independent reference implementation, issue 36), first 10,000"
echo "   jobs, size = allocated, estimate = requested; goal: bsld below EASY++, utilization no lower"
echo "   than EASY's minus 0.5 %, longest wait no more than 1.5 x EASY's"
echo "   $R --trace \$TRACES/<trace> --jobs 10000 --policy easy --compare lattice -o json  (and --policy easy++)"
printf "%-22s %9s %9s %9s %9s %8s %8s %15s %17s %15s  %s\n" trace easy easy++ "(ours)" lattice \
  lat/easy lat/e++ "util easy/lat" "longest wait e/l" "p95 wait e/l" goal
for t in "SDSC-SP2-1998-4.2-cln:19.31" "KTH-SP2-1996-2.1-cln:84.25" "CTC-SP2-1996-3.1-cln:16.25" \
         "HPC2N-2002-2.2-cln:49.61"; do
  name="${t%%:*}"; pp="${t##*:}"
  # EASY++ as rm-replay runs it (--policy easy++), beside the reference's figure.
  ours_pp="$(bsld --trace "$TRACES/$name.swf.gz" --jobs 10000 --policy easy++)"
  "$R" --trace "$TRACES/$name.swf.gz" --jobs 10000 --policy easy --compare lattice -o json |
    awk -v n="$name" -v pp="$pp" -v opp="$ours_pp" '
      function val() { v = $0; gsub(/[ ,]/, "", v); split(v, a, ":"); return a[2] }
      /"avg_bounded_slowdown"/ { b[++nb] = val() }
      /"utilization"/ { u[++nu] = val() }
      /"max_wait_s"/ { m[++nm] = val() }
      /"p95_wait_s"/ { p[++np] = val() }
      END {
        ok = (b[2] < pp && u[2] >= u[1] * 0.995 && m[2] <= 1.5 * m[1]) ? "MET" : "MISSED"
        printf "%-22s %9.4f %9.2f %9.4f %9.4f %8.3f %8.3f %7.4f/%-7.4f %8d/%-8d %7d/%-7d  %s\n",
          n, b[1], pp, opp, b[2], b[2] / b[1], b[2] / pp, u[1], u[2], m[1], m[2], p[1], p[2], ok
      }'
done
