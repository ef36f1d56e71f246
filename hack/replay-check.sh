#!/usr/bin/env bash
# Replays the Parallel Workloads Archive traces through rm-replay (dist profile) and prints
# our figures next to the published ones (controllers/scheduler/testdata/README.md), then
# hpc-backfill vs EASY on the first 10,000 jobs of four traces. TRACES overrides the trace
# directory (controllers/scheduler/testdata, where the tests read them too).
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
echo "== hpc-backfill (lattice policy, HPC Batch weights, depth 1) vs EASY, first 10,000 jobs,"
echo "   size = allocated, estimate = requested"
printf "%-24s %14s %14s %10s %10s\n" trace easy_bsld lattice_bsld easy_util lat_util
for name in SDSC-SP2-1998-4.2-cln KTH-SP2-1996-2.1-cln CTC-SP2-1996-3.1-cln HPC2N-2002-2.2-cln; do
  out="$("$R" --trace "$TRACES/$name.swf.gz" --jobs 10000 --policy easy --compare lattice -o json)"
  printf "%-24s %s\n" "$name" "$(echo "$out" | awk '
    /"avg_bounded_slowdown"/ { gsub(/[ ,]/, ""); split($0, a, ":"); b[++nb] = a[2] }
    /"utilization"/ { gsub(/[ ,]/, ""); split($0, a, ":"); u[++nu] = a[2] }
    END { printf "%14.4f %14.4f %10.4f %10.4f", b[1], b[2], u[1], u[2] }')"
done
