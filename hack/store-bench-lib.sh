# shellcheck shell=bash
# Shared by hack/bench-store.sh, hack/bench-store-ab.sh and hack/bench-replication-floor.sh
# (sourced, not run): starting Lattice clusters, waiting for members, finding a cluster's
# leader, medians. Callers keep the PIDs they start in the array `pids` and kill them on
# exit, and set `B` to the directory of the built binaries (lattice_build's LATTICE_BIN).

# Wait until the etcd v3 endpoint answers `endpoint health` (up to 30 s).
wait_healthy() {
  for _ in $(seq 150); do
    ETCDCTL_API=3 etcdctl --endpoints="$1" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "no healthy member at $1" >&2
  return 1
}

# member_of <leader|follower> <endpoints, comma-separated>: the first endpoint whose
# member leads (or does not), as `etcdctl endpoint status` reports it (etcd and Lattice
# alike), once some member leads; waits for one.
member_of() {
  local ep
  for _ in $(seq 100); do
    ep=$(ETCDCTL_API=3 etcdctl --endpoints="$2" endpoint status -w fields 2>/dev/null | awk -v want="$1" '
      /^"MemberID"/ { id = $3 } /^"Leader"/ { lead = $3 }
      /^"Endpoint"/ {
        gsub(/"/, "", $3)
        if (id != "" && lead != "0" && (((id "") == (lead "")) == (want == "leader"))) { print $3; exit }
      }' || true)
    [ -n "$ep" ] && { echo "$ep"; return; }
    sleep 0.2
  done
  echo "no $1 among $2" >&2
  return 1
}
leader_of() { member_of leader "$1"; }
follower_of() { member_of follower "$1"; }

# start_lattice_cluster <binary> <data dir prefix> <members> <api port base>
#   <etcd port base> <raft port base> [env words] [flag words]
# Member i (from 1) listens on base + i for each port and logs to <prefix>-i.log; member
# 1 bootstraps and the others join it, one at a time, each waited for.
start_lattice_cluster() {
  local i flags
  for i in $(seq "$3"); do
    flags=(--bootstrap)
    [ "$i" -gt 1 ] && flags=(--join "127.0.0.1:$(($6 + 1))")
    # shellcheck disable=SC2086 # the env and flag arguments are word lists
    env ${7:-} "$1" --data-dir "$2-$i" --api-addr "127.0.0.1:$(($4 + i))" --tls-addr off \
      --etcd-addr "127.0.0.1:$(($5 + i))" --raft-addr "127.0.0.1:$(($6 + i))" --node-id "$i" \
      ${8:-} "${flags[@]}" >"$2-$i.log" 2>&1 &
    pids+=($!)
    wait_healthy "127.0.0.1:$(($5 + i))"
  done
}

# The median of numbers given one per line or comma-separated on stdin; an even count's
# mean of the middle two is printed with the printf format $1 (default %.3f).
median() {
  tr ',' '\n' | sort -g | awk -v fmt="${1:-%.3f}" '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf fmt, (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# One Lattice member's Raft timing totals from its metrics endpoint (`host:port` of its
# API): "<commit sum s> <commit count> <log flush sum s> <log flush count> <commit
# heartbeats>" (a commit heartbeat follows a commit reached before the leader's own log
# flush, so it counts the writes whose answer waited for that flush). All zero when the
# member serves no metrics.
raft_timing() {
  { curl -sf "http://$1/metrics" || true; } | awk '
    /^lattice_raft_commit_duration_seconds_sum/ { cs = $2 }
    /^lattice_raft_commit_duration_seconds_count/ { cc = $2 }
    /^lattice_raft_log_flush_duration_seconds_sum/ { fs = $2 }
    /^lattice_raft_log_flush_duration_seconds_count/ { fc = $2 }
    /^lattice_raft_commit_heartbeats_total/ { cl = $2 }
    END { printf "%s %s %s %s %s\n", cs + 0, cc + 0, fs + 0, fc + 0, cl + 0 }'
}

# One round of sequential puts: `seq_round <name> <endpoint> <puts>` prints its puts/s.
seq_round() {
  "$B/lattice-bench" --name "$1" --endpoint "$2" --puts "$3" --seq-only |
    sed -n "s/^RESULT $1_seq_puts_per_s=//p"
}

# The mean of its arguments, to one decimal.
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.1f", s / NR }'; }

# Rounds of sequential puts against two endpoints, alternating which goes first:
#   alternate_rounds <name a> <endpoint a> <name b> <endpoint b> <rounds> <puts> <ratio>
# Prints each round, then `RESULT <name a>_seq_puts_per_s=` and `<name b>_seq_puts_per_s=`
# (the means), `RESULT <ratio>=` (b's mean over a's) and `RESULT <ratio>_pairs_median=`
# (the median of the rounds' b/a).
alternate_rounds() {
  local r x y pair ma mb all_a=() all_b=() pairs=()
  for r in $(seq "$5"); do
    if [ $((r % 2)) = 1 ]; then
      x=$(seq_round "$1" "$2" "$6")
      y=$(seq_round "$3" "$4" "$6")
    else
      y=$(seq_round "$3" "$4" "$6")
      x=$(seq_round "$1" "$2" "$6")
    fi
    all_a+=("$x") all_b+=("$y")
    pair=$(awk -v a="$x" -v b="$y" 'BEGIN { printf "%.3f", b / a }')
    pairs+=("$pair")
    echo "round $r: $1 $x  $3 $y  $3/$1 $pair"
  done
  ma=$(mean "${all_a[@]}")
  mb=$(mean "${all_b[@]}")
  echo "RESULT $1_seq_puts_per_s=$ma"
  echo "RESULT $3_seq_puts_per_s=$mb"
  echo "RESULT $7=$(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", b / a }')"
  echo "RESULT $7_pairs_median=$(printf '%s\n' "${pairs[@]}" | median "%.3f")"
}
