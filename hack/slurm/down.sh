#!/usr/bin/env bash
# Stop what hack/slurm/up.sh started and remove its network namespace.
S=${SLURMDIR:?set SLURMDIR}
NSN=${SLURM_NETNS:-lattice-slurm}
for f in "$S"/slurmd.n1.pid "$S"/slurmd.n2.pid "$S"/slurmd.n3.pid "$S"/slurmd.n4.pid "$S"/slurmctld.pid "$S"/munged.pid; do
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; rm -f "$f"
done
sleep 1
ip netns del "$NSN" 2>/dev/null || true
