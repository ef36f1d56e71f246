#!/usr/bin/env bash
# A/B of the replicated store: two Lattice clusters side by side (A on ports 25xxx, B on
# 26xxx), then sequential-put rounds against each cluster's leader in turn, alternating
# which goes first. Meant for deciding whether a change to the store helps, on a machine
# whose speed drifts by ±10 % within a minute: both arms see the same minutes, and neither
# runs while the other does.
#
# Prints each round's puts/s, `RESULT ab_a_seq_puts_per_s=` / `ab_b_seq_puts_per_s=` (the
# means), `RESULT ab_b_vs_a=` (ratio of the means) and `RESULT ab_b_vs_a_pairs_median=`
# (the median of the rounds' B/A ratios). A against A (same binary, same settings) gave
# B/A 1.005, 1.071 and 1.031 in three runs of ten rounds here, single rounds up to ±12 %
# apart, and arm B (started second) never lost: run a change in both arms' places
# (AB_A_* and AB_B_* swapped) and trust only an effect that holds both ways and is larger
# than that (the leader's log write moved onto its store thread: 0.904 and, swapped,
# 1/1.061).
#
# Knobs (environment):
#   AB_A_SERVER, AB_B_SERVER  lattice-server binaries (default target/dist/lattice-server,
#                 rebuilt from the tree whenever an arm uses it); build the other arm into a
#                 copy first (hack/build.sh dist, then copy target/dist/lattice-server)
#   AB_A_ENV, AB_B_ENV  `NAME=value ...` environment for that arm's members
#   AB_A_FLAGS, AB_B_FLAGS  extra lattice-server flags for that arm (e.g. "--store-threads 0")
#   AB_MEMBERS    members per cluster, 1 or 3 (default 3)
#   AB_ROUNDS     rounds per arm (default 10)
#   AB_PUTS       sequential puts per round (default 1500)
#   AB_VIA        `leader` (default) or `follower`: the member each client talks to (a
#                 follower forwards the writes to its leader)
#   BENCH_TLS     1 (default): both arms and the client use mutual TLS; 0: plaintext
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/store-bench-lib.sh
. hack/store-bench-lib.sh
# shellcheck source=hack/lib/build.sh
. hack/lib/build.sh
hack/install-deps.sh >/dev/null
# Both arms given and the client built: the tree is not built (it may hold an arm's change).
B=${CARGO_TARGET_DIR:-target}/dist
if [ ! -x "$B/lattice-bench" ] ||
  { [ -z "${AB_A_SERVER:-}" ] || [ -z "${AB_B_SERVER:-}" ]; }; then
  lattice_build dist
fi
members=${AB_MEMBERS:-3}
case "$members" in 1 | 3) ;; *) echo "AB_MEMBERS must be 1 or 3" >&2; exit 2 ;; esac

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bench_pki_setup "$work/pki"

start_lattice_cluster "${AB_A_SERVER:-$B/lattice-server}" "$work/a" "$members" \
  25180 25790 25900 "${AB_A_ENV:-}" "${AB_A_FLAGS:-}"
start_lattice_cluster "${AB_B_SERVER:-$B/lattice-server}" "$work/b" "$members" \
  26180 26790 26900 "${AB_B_ENV:-}" "${AB_B_FLAGS:-}"
case "${AB_VIA:-leader}" in
  leader) pick=leader_of ;;
  follower) [ "$members" = 3 ] || { echo "AB_VIA=follower needs AB_MEMBERS=3" >&2; exit 2; }; pick=follower_of ;;
  *) echo "AB_VIA must be leader or follower" >&2; exit 2 ;;
esac
ep_a=$($pick "$(seq -s, -f 127.0.0.1:2579%g "$members")")
ep_b=$($pick "$(seq -s, -f 127.0.0.1:2679%g "$members")")
echo "==> A: $ep_a, B: $ep_b (${AB_VIA:-leader})"

seq_round warm_a "$ep_a" 500 >/dev/null
seq_round warm_b "$ep_b" 500 >/dev/null
alternate_rounds ab_a "$ep_a" ab_b "$ep_b" "${AB_ROUNDS:-10}" "${AB_PUTS:-1500}" ab_b_vs_a
