#!/usr/bin/env bash
# shellcheck disable=SC2086 # BENCH_*ARGS and the load targets are word lists, split on purpose
# Store benchmark: Lattice's embedded store and Debian's etcd 3.4 side by side on loopback,
# same client (lattice-bench, on etcd-client), same load, equal durability
# (both fsync every commit before answering), and equal security: by default both serve
# mutual TLS on their client and peer ports with certificates of one CA (`lattice admin
# pki`), the client presenting an administrator's certificate, as production runs.
# Prints `RESULT name=value` lines and ratios.
#
# Knobs (environment):
#   BENCH_TLS     1 (default): mutual TLS everywhere; 0: both in plaintext on loopback
#                 (what the figures before TLS measured)
#   BENCH_ARGS    extra lattice-bench flags for every run (e.g. "--puts 500 --seconds 2")
#   BENCH_SKIP_3  =1: skip the 3-member clusters
#   BENCH_ONLY_3  =1: run only the 3-member clusters (skip the single-member runs)
#   BENCH_3_ARGS  lattice-bench flags for the 3-member runs (default --puts-only;
#                 e.g. "--puts-only --seconds 0" for the sequential puts only)
#   BENCH_SEQ_ROUNDS  extra paired rounds of sequential puts per setup (default 4; 0: none).
#                 The sequential figure swings from run to run on a small shared machine
#                 (etcd's as much as Lattice's), so after the full passes the script runs
#                 the sequential phase again, etcd and Lattice back to back, alternating
#                 which goes first. `put_ratio_vs_etcd` and `put3_ratio_vs_etcd` are the
#                 medians of the per-round ratios (the full pass counts as a round); the
#                 rounds' ratios are printed as `put_ratio_rounds` / `put3_ratio_rounds`
#                 and the full pass's alone as `put_ratio_first_pass_vs_etcd` /
#                 `put3_ratio_first_pass_vs_etcd`.
#   BENCH_FOLLOWER_ROUNDS  paired rounds of 1,500 sequential puts through a follower of
#                 each 3-member cluster (default 4; 0: none), after the leader's rounds:
#                 both stores forward such writes to their leader and answer once the
#                 follower has applied them. Prints `etcd3_via_follower_seq_puts_per_s`,
#                 `lattice3_via_follower_seq_puts_per_s` (the means),
#                 `put3_via_follower_ratio_vs_etcd` and its `_pairs_median`.
#   BENCH_LATTICE_SERVER  binary to run instead of target/dist/lattice-server, taking
#                 the same store flags (e.g. target/dist/examples/raft-member: the store
#                 and its etcd port alone, plaintext: with BENCH_TLS=0)
#
# Over Lattice's 3-member paired rounds it also prints, from the members' metrics, where a
# sequential put goes: `lattice3_commit_ms_mean` (the leader's proposal to answer),
# `lattice3_follower_flush_ms_mean` (a follower's log write and fdatasync, on every put's
# path), `lattice3_leader_flush_ms_mean` (the leader's own, in parallel) and
# `lattice3_leader_flush_waited_share` (the puts whose answer waited for the leader's own).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/store-bench-lib.sh
. hack/store-bench-lib.sh
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
hack/install-deps.sh >/dev/null
lattice_build dist
B=$LATTICE_BIN
lattice_server="${BENCH_LATTICE_SERVER:-$B/lattice-server}"

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bench_pki_setup "$work/pki"

if [ "${BENCH_ONLY_3:-}" != 1 ]; then
  echo "==> starting etcd $(etcd --version | head -1 | awk '{print $3}') on 127.0.0.1:23791"
  # shellcheck disable=SC2046 # the TLS flags are words
  etcd --name bench --data-dir "$work/etcd" --listen-client-urls $scheme://127.0.0.1:23791 \
    --advertise-client-urls $scheme://127.0.0.1:23791 --listen-peer-urls $scheme://127.0.0.1:23801 \
    --initial-advertise-peer-urls $scheme://127.0.0.1:23801 --initial-cluster bench=$scheme://127.0.0.1:23801 \
    --initial-cluster-state new --log-level error $(etcd_tls_flags 1) >"$work/etcd.log" 2>&1 &
  pids+=($!)
  echo "==> starting lattice-server on 127.0.0.1:23792 (etcd port)"
  # shellcheck disable=SC2046 # the TLS flags are words
  "$lattice_server" --data-dir "$work/lattice" --api-addr 127.0.0.1:28080 \
    --tls-addr off --etcd-addr 127.0.0.1:23792 $(lattice_tls_flags 1) >"$work/lattice.log" 2>&1 &
  pids+=($!)
  wait_healthy 127.0.0.1:23791
  wait_healthy 127.0.0.1:23792
fi

out="$work/results"
touch "$out"
# The disk's floor: one 256-byte write + fdatasync (O_DSYNC) into space already written,
# on the filesystem both stores use.
dd if=/dev/zero of="$work/dsync" bs=1M count=4 status=none
dsync_start=$(date +%s.%N)
dd if=/dev/zero of="$work/dsync" bs=256 count=2000 oflag=dsync conv=notrunc status=none
echo "RESULT fdatasync_ms=$(awk -v a="$dsync_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", (b - a) * 1000 / 2000 }')" | tee -a "$out"
if [ "${BENCH_ONLY_3:-}" != 1 ]; then
  for target in "etcd 127.0.0.1:23791" "lattice 127.0.0.1:23792"; do
    set -- $target
    echo "==> load against $1"
    "$B/lattice-bench" --name "$1" --endpoint "$2" "${bench_tls_flags[@]}" ${BENCH_ARGS:-} | tee -a "$out"
  done
fi

if [ "${BENCH_SKIP_3:-}" != 1 ]; then
  echo "==> 3-member clusters: etcd on 2479[1-3], Lattice (Raft) on 2579[1-3]"
  cluster="e1=$scheme://127.0.0.1:24801,e2=$scheme://127.0.0.1:24802,e3=$scheme://127.0.0.1:24803"
  for i in 1 2 3; do
    # shellcheck disable=SC2046 # the TLS flags are words
    etcd --name e$i --data-dir "$work/etcd3-$i" --listen-client-urls $scheme://127.0.0.1:2479$i \
      --advertise-client-urls $scheme://127.0.0.1:2479$i --listen-peer-urls $scheme://127.0.0.1:2480$i \
      --initial-advertise-peer-urls $scheme://127.0.0.1:2480$i --initial-cluster "$cluster" \
      --initial-cluster-state new --log-level error $(etcd_tls_flags "$i") >"$work/etcd3-$i.log" 2>&1 &
    pids+=($!)
  done
  start_lattice_cluster "$lattice_server" "$work/lattice3" 3 28180 25790 27900
  wait_healthy 127.0.0.1:24791
  # Both clients talk to their cluster's leader. A write sent to a follower is forwarded
  # (etcd: a proposal to the leader, then the follower applies and answers), which made
  # etcd's figure depend on which member won its first election: about 1,000 puts/s
  # through its leader here against 860-890 through either follower.
  etcd3_ep=$(leader_of 127.0.0.1:24791,127.0.0.1:24792,127.0.0.1:24793)
  lattice3_ep=$(leader_of 127.0.0.1:25791,127.0.0.1:25792,127.0.0.1:25793)
  echo "==> leaders: etcd $etcd3_ep, Lattice $lattice3_ep"
  for target in "etcd3 $etcd3_ep" "lattice3 $lattice3_ep"; do
    set -- $target
    echo "==> load against $1 (3 members)"
    "$B/lattice-bench" --name "$1" --endpoint "$2" "${bench_tls_flags[@]}" ${BENCH_3_ARGS:---puts-only} ${BENCH_ARGS:-} | tee -a "$out"
  done
fi

val() { grep "^RESULT $1=" "$out" | cut -d= -f2; }
ratio() { awk -v a="$(val "$1")" -v b="$(val "$2")" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }

# Paired rounds of sequential puts (see BENCH_SEQ_ROUNDS above). Prints the per-round
# ratios, comma-separated, the full pass first; `median` picks their median.
seq_rounds() { # <etcd name> <etcd endpoint> <lattice name> <lattice endpoint>
  local ratios r
  ratios=$(ratio "$3_seq_puts_per_s" "$1_seq_puts_per_s")
  for r in $(seq "${BENCH_SEQ_ROUNDS:-4}"); do
    local order=("$1 $2" "$3 $4")
    [ $((r % 2)) = 1 ] && order=("$3 $4" "$1 $2")
    local name endpoint t
    for t in "${order[@]}"; do
      read -r name endpoint <<<"$t"
      # (The rounds' own figures go to stderr: stdout is the list of ratios.)
      "$B/lattice-bench" --name "r${r}_$name" --endpoint "$endpoint" --seq-only \
        "${bench_tls_flags[@]}" ${BENCH_ARGS:-} | tee -a "$out" >&2
    done
    ratios="$ratios,$(ratio "r${r}_$3_seq_puts_per_s" "r${r}_$1_seq_puts_per_s")"
  done
  echo "$ratios"
}

# One setup's paired rounds: <label> <ratio prefix> <etcd name> <etcd endpoint>
# <lattice name> <lattice endpoint>.
report_rounds() {
  local rounds
  echo "==> paired rounds of sequential puts, $1"
  rounds=$(seq_rounds "$3" "$4" "$5" "$6")
  echo "RESULT $2_ratio_rounds=$rounds"
  echo "RESULT $2_ratio_first_pass_vs_etcd=$(ratio "$5_seq_puts_per_s" "$3_seq_puts_per_s")"
  echo "RESULT $2_ratio_vs_etcd=$(median %.2f <<<"$rounds")"
}
if [ "${BENCH_ONLY_3:-}" != 1 ]; then
  report_rounds "1 member" put etcd 127.0.0.1:23791 lattice 127.0.0.1:23792
fi
if [ "${BENCH_SKIP_3:-}" != 1 ]; then
  # Where Lattice's 3-member sequential put goes, over its paired rounds: the leader's
  # proposal-to-answer time, its own and its followers' log flush (the followers' is on
  # every put's path), and the share of puts whose answer waited for the leader's own.
  leader_api="127.0.0.1:$((28180 + ${lattice3_ep##*:} - 25790))"
  before=()
  for i in 1 2 3; do before+=("$(raft_timing "127.0.0.1:$((28180 + i))")"); done
  report_rounds "3 members" put3 etcd3 "$etcd3_ep" lattice3 "$lattice3_ep"
  for i in 1 2 3; do
    api="127.0.0.1:$((28180 + i))"
    role=follower
    [ "$api" = "$leader_api" ] && role=leader
    echo "$role ${before[$((i - 1))]} $(raft_timing "$api")"
  done | awk '
    $1 == "leader" { cs = $7 - $2; cc = $8 - $3; lf = $9 - $4; lc = $10 - $5; cl = $11 - $6 }
    $1 == "follower" { ff += $9 - $4; fc += $10 - $5 }
    END {
      if (cc > 0) printf "RESULT lattice3_commit_ms_mean=%.3f\nRESULT lattice3_leader_flush_waited_share=%.3f\n", cs * 1000 / cc, cl / cc
      if (lc > 0) printf "RESULT lattice3_leader_flush_ms_mean=%.3f\n", lf * 1000 / lc
      if (fc > 0) printf "RESULT lattice3_follower_flush_ms_mean=%.3f\n", ff * 1000 / fc
    }'
  if [ "${BENCH_FOLLOWER_ROUNDS:-4}" -gt 0 ]; then
    etcd3_fep=$(follower_of 127.0.0.1:24791,127.0.0.1:24792,127.0.0.1:24793)
    lattice3_fep=$(follower_of 127.0.0.1:25791,127.0.0.1:25792,127.0.0.1:25793)
    echo "==> paired rounds of sequential puts through a follower (etcd $etcd3_fep, Lattice $lattice3_fep)"
    alternate_rounds etcd3_via_follower "$etcd3_fep" lattice3_via_follower "$lattice3_fep" \
      "${BENCH_FOLLOWER_ROUNDS:-4}" 1500 put3_via_follower_ratio_vs_etcd
  fi
fi
echo "RESULT put8_ratio_vs_etcd=$(ratio lattice_puts_per_s_8_clients etcd_puts_per_s_8_clients)"
echo "RESULT put64_ratio_vs_etcd=$(ratio lattice_puts_per_s_64_clients etcd_puts_per_s_64_clients)"
if [ "${BENCH_SKIP_3:-}" != 1 ]; then
  echo "RESULT put3_8_ratio_vs_etcd=$(ratio lattice3_puts_per_s_8_clients etcd3_puts_per_s_8_clients)"
  echo "RESULT put3_64_ratio_vs_etcd=$(ratio lattice3_puts_per_s_64_clients etcd3_puts_per_s_64_clients)"
fi
if [ "${BENCH_ONLY_3:-}" != 1 ]; then
  # What any store answering a put after one fdatasync could reach with this client: its
  # no-op round trip plus the disk's fdatasync, against etcd's mean put time.
  floor=$(awk -v r="$(val lattice_round_trip_p50_ms)" -v f="$(val fdatasync_ms)" 'BEGIN { printf "%.3f", r + f }')
  echo "RESULT seq_put_floor_ms=$floor"
  echo "RESULT put_ratio_ceiling_vs_etcd=$(awk -v e="$(val etcd_seq_puts_per_s)" -v f="$floor" 'BEGIN { printf "%.2f", (1000 / e) / f }')"
fi
echo "RESULT tls=$([ "$scheme" = https ] && echo 1 || echo 0)"
echo "RESULT watch_p99_ratio_vs_etcd=$(ratio lattice_watch_p99_ms etcd_watch_p99_ms)"
echo "RESULT get_p99_ratio_vs_etcd=$(ratio lattice_get_p99_ms etcd_get_p99_ms)"
