#!/usr/bin/env bash
# Start a real Slurm 22.05 (Debian slurm-wlm) test cluster on this machine: munge,
# slurmctld and four slurmd (n1..n4) in a private network namespace with only loopback
# (slurmctld/slurmd bind 0.0.0.0; 127.0.0.2 is added because glibc resolves nothing with
# loopback alone). Usage: SLURMDIR=/scratch/dir hack/slurm/up.sh; stop with down.sh.
# Afterwards run Slurm commands as: nsenter --net=/run/netns/$SLURM_NETNS sbatch ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
S=${SLURMDIR:?set SLURMDIR to a scratch directory}
NSN=${SLURM_NETNS:-lattice-slurm}
NS="nsenter --net=/run/netns/$NSN"
command -v slurmctld >/dev/null || { echo "slurm-wlm is not installed (apt-get install -y slurm-wlm)" >&2; exit 1; }
echo "slurm: starting munge, slurmctld and slurmd n1..n4 in netns $NSN (state in $S)"
mkdir -p "$S"/munge "$S"/state "$S"/log "$S"/spool "$S"/jobs
chmod 755 "$S"
sed -e "s#@SLURMDIR@#$S#g; s#@HOSTNAME@#$(hostname)#g" "$here/slurm.conf.in" > "$S/slurm.conf"
export SLURM_CONF=$S/slurm.conf
chown munge:munge "$S/munge"; chmod 755 "$S/munge"
[ -f /etc/munge/munge.key ] || /usr/sbin/mungekey --create
ip netns del "$NSN" 2>/dev/null || true
ip netns add "$NSN"
ip netns exec "$NSN" ip link set lo up
ip netns exec "$NSN" ip addr add 127.0.0.2/8 dev lo
setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F --socket="$S/munge/munge.socket.2" \
  --pid-file="$S/munge/munged.pid" --log-file="$S/munge/munged.log" --seed-file="$S/munge/munged.seed" \
  > "$S/log/munged.out" 2>&1 &
echo $! > "$S/munged.pid"
for _ in $(seq 50); do [ -S "$S/munge/munge.socket.2" ] && break; sleep 0.1; done
$NS /usr/sbin/slurmctld -D -c -f "$SLURM_CONF" > "$S/log/slurmctld.out" 2>&1 & echo $! > "$S/slurmctld.pid"
for _ in $(seq 100); do $NS scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
for n in n1 n2 n3 n4; do
  mkdir -p "$S/spool/$n"
  $NS /usr/sbin/slurmd -D -N "$n" -f "$SLURM_CONF" > "$S/log/slurmd.$n.out" 2>&1 & echo $! > "$S/slurmd.$n.pid"
done
for _ in $(seq 150); do [ "$($NS sinfo -h -o %t | sort -u)" = "idle" ] && break; sleep 0.1; done
$NS sinfo
