# shellcheck shell=bash
# Shared by hack/bench-store.sh, hack/bench-store-ab.sh and hack/bench-replication-floor.sh
# (sourced, not run): starting Lattice clusters, waiting for members, finding a cluster's
# leader, medians. Callers keep the PIDs they start in the array `pids` and kill them on
# exit, and set `B` to the directory of the built binaries (lattice_build's LATTICE_BIN).
#
# Mutual TLS (BENCH_TLS=1, the default; 0: plaintext on loopback): call `bench_pki_setup
# <dir>` first. It makes a CA and certificates with the real `lattice admin pki` (a
# member certificate for each Lattice member 1-3 and etcd member 101-103, all for
# 127.0.0.1, and an administrator's for the clients), and sets `scheme` (https or http),
# `bench_pki` (the CA's directory) and `bench_tls_flags` (the client's --cacert/--cert/--key,
# for lattice-bench; etcdctl reads them from ETCDCTL_CACERT/CERT/KEY).
scheme=http
bench_pki=
bench_tls_flags=()
bench_pki_setup() {
  [ "${BENCH_TLS:-1}" = 1 ] || { echo "==> plaintext on loopback (BENCH_TLS=0)"; return 0; }
  local cli=${BENCH_LATTICE_CLI:-$B/lattice} i
  "$cli" admin pki init --dir "$1" >/dev/null
  for i in 1 2 3; do
    "$cli" admin pki issue member --id "$i" --ip 127.0.0.1 --dir "$1" >/dev/null
    "$cli" admin pki issue member --id "$((100 + i))" --ip 127.0.0.1 --dir "$1" >/dev/null
  done
  "$cli" admin pki issue admin --name bench --dir "$1" >/dev/null
  # Every Lattice member is an API server too: with the CA key kept elsewhere it needs an
  # API server certificate of its own in its --pki-dir.
  "$cli" admin pki issue apiserver --name localhost --ip 127.0.0.1 --dir "$1" >/dev/null
  for i in 1 2 3; do
    cp "$1/apiserver/apiserver.crt" "$1/apiserver/apiserver.key" "$1/member-$i/"
  done
  scheme=https
  bench_pki=$1
  export ETCDCTL_CACERT="$1/admin-bench/ca.crt" ETCDCTL_CERT="$1/admin-bench/admin.crt" \
    ETCDCTL_KEY="$1/admin-bench/admin.key"
  bench_tls_flags=(--cacert "$ETCDCTL_CACERT" --cert "$ETCDCTL_CERT" --key "$ETCDCTL_KEY")
  echo "==> mutual TLS on every store port and client (certificates in $1)"
}

# The TLS flags of etcd member <n> (its certificate from bench_pki_setup, client and peer
# certificates required); nothing in plaintext.
etcd_tls_flags() {
  [ "$scheme" = https ] || return 0
  local d="$bench_pki/member-$((100 + $1))"
  echo --cert-file "$d/member.crt" --key-file "$d/member.key" --trusted-ca-file "$d/ca.crt" \
    --client-cert-auth --peer-cert-file "$d/member.crt" --peer-key-file "$d/member.key" \
    --peer-trusted-ca-file "$d/ca.crt" --peer-client-cert-auth
}

# The TLS flags of Lattice member <n>: its --pki-dir, or plaintext on loopback.
lattice_tls_flags() {
  if [ "$scheme" = https ]; then
    echo --pki-dir "$bench_pki/member-$1"
  else
    echo --store-plaintext-loopback
  fi
}

# `host:port,...` with the scheme in front of each (TLS); plaintext endpoints stay bare:
# etcdctl 3.4 dials an `http://` endpoint with that whole URL as the HTTP/2 `:authority`
# for some calls (`endpoint status`), which a strict HTTP/2 server (hyper, Lattice's)
# refuses with PROTOCOL_ERROR, and a bare `host:port` means plaintext to etcdctl anyway.
with_scheme() {
  if [ "$scheme" = https ]; then
    echo "$1" | sed "s#\([^,]*\)#$scheme://\1#g"
  else
    echo "$1"
  fi
}

# Wait until the etcd v3 endpoint answers `endpoint health` (up to 30 s).
wait_healthy() {
  for _ in $(seq 150); do
    ETCDCTL_API=3 etcdctl --endpoints="$(with_scheme "$1")" endpoint health >/dev/null 2>&1 && return 0
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
    ep=$(ETCDCTL_API=3 etcdctl --endpoints="$(with_scheme "$2")" endpoint status -w fields 2>/dev/null | awk -v want="$1" '
      /^"MemberID"/ { id = $3 } /^"Leader"/ { lead = $3 }
      /^"Endpoint"/ {
        gsub(/"/, "", $3)
        sub(/^https?:\/\//, "", $3)
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
    # shellcheck disable=SC2046 # the TLS flags are words
    env ${7:-} "$1" --data-dir "$2-$i" --api-addr "127.0.0.1:$(($4 + i))" --tls-addr off \
      --etcd-addr "127.0.0.1:$(($5 + i))" --raft-addr "127.0.0.1:$(($6 + i))" --node-id "$i" \
      $(lattice_tls_flags "$i") ${8:-} "${flags[@]}" >"$2-$i.log" 2>&1 &
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
  "$B/lattice-bench" --name "$1" --endpoint "$2" --puts "$3" --seq-only \
    "${bench_tls_flags[@]}" |
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
