#!/usr/bin/env bash
# How much could a replication path of our own gain? Runs a 3-member Lattice cluster beside
# `replication-floor` (store/examples/replication-floor.rs: a leader and two followers made
# of the same parts — the etcd port and the peer stream on tonic, a record `fdatasync`ed
# on every member, the leader's own write in parallel — with no Raft, no commit notices
# and no apply on the followers), and alternates rounds of sequential puts between
# Lattice's leader and the floor's, as hack/bench-store-ab.sh does for two clusters.
#
# Prints each round's puts/s, `RESULT floor_seq_puts_per_s=` and
# `RESULT lattice3_seq_puts_per_s=` (the means), `RESULT lattice3_vs_floor=` (ratio of the
# means) and `RESULT lattice3_vs_floor_pairs_median=`. The floor is an upper bound: a
# real store must add what it leaves out.
#
# Knobs (environment): FLOOR_ROUNDS (rounds per side, default 6), FLOOR_PUTS (sequential
# puts per round, default 2000). Both sides run plaintext on loopback (the floor has no
# TLS; BENCH_TLS=1 would measure Lattice with it against a floor without).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/store-bench-lib.sh
. hack/store-bench-lib.sh
BENCH_TLS=${BENCH_TLS:-0}
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
hack/install-deps.sh >/dev/null
lattice_build dist
B=$LATTICE_BIN

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bench_pki_setup "$work/pki"

floor=$B/examples/replication-floor
for i in 2 3; do
  "$floor" follower "127.0.0.1:2795$i" "$work/floor-$i" >"$work/floor-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/27952 && exec 4<>/dev/tcp/127.0.0.1/27953) 2>/dev/null && break
  sleep 0.2
done
"$floor" leader 127.0.0.1:25891 "$work/floor-1" 127.0.0.1:27952,127.0.0.1:27953 \
  >"$work/floor-1.log" 2>&1 &
pids+=($!)
wait_healthy 127.0.0.1:25891 || { cat "$work"/floor-*.log >&2; exit 1; }
start_lattice_cluster "$B/lattice-server" "$work/lattice3" 3 28180 25790 27900
lattice=$(leader_of 127.0.0.1:25791,127.0.0.1:25792,127.0.0.1:25793)
echo "==> Lattice's leader: $lattice; the floor's: 127.0.0.1:25891"

seq_round warm_f 127.0.0.1:25891 500 >/dev/null
seq_round warm_l "$lattice" 500 >/dev/null
alternate_rounds floor 127.0.0.1:25891 lattice3 "$lattice" "${FLOOR_ROUNDS:-6}" \
  "${FLOOR_PUTS:-2000}" lattice3_vs_floor
