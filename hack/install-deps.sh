#!/usr/bin/env bash
# Install the system packages Lattice needs to build and test. Idempotent: a package is
# installed only when its command (or marker file) is missing, and `apt-get update` runs
# only if something must be installed.
#
#   gcc                a C compiler for mimalloc (lattice-server's allocator) and the linker
#   protobuf-compiler  protoc, needed by etcd-client's build script (lattice-store)
#   libprotobuf-dev    google/protobuf/*.proto (descriptor.proto, struct.proto) for the same
#   etcd-server        /usr/bin/etcd, the real etcd used by lattice-store's tests
#   etcd-client        /usr/bin/etcdctl, drives the etcd gRPC facade in tests
#   prometheus         promtool, checks the /metrics exposition
#   curl               readiness polling in hack/ scripts
#   iproute2           `ip`: the store's off-loopback tests give a machine without a
#                      non-loopback address one (on lo) for their duration
#   zsh, fish          the CLI's completion scripts are loaded by the real shells in tests
#   passwd             useradd: the agent's hostile-tenant tests make an ordinary user
#   qemu-system-x86, linux-image-amd64, busybox-static
#                      the agent's cgroup v2 test boots Debian's kernel in a small VM
#                      (this machine binds memory and pids to cgroup v1)
#
# Add a package: append a "command package" line to PACKAGES below.
set -euo pipefail

# "<file or command to check> <debian package>" per line; an absolute path is checked with
# `test -e` (a pattern: that something matches it), anything else with `command -v`.
PACKAGES=(
  "cc gcc"
  "protoc protobuf-compiler"
  "/usr/include/google/protobuf/descriptor.proto libprotobuf-dev"
  "etcd etcd-server"
  "etcdctl etcd-client"
  "promtool prometheus"
  "curl curl"
  "ip iproute2"
  "zsh zsh"
  "fish fish"
  "useradd passwd"
  "qemu-system-x86_64 qemu-system-x86"
  "/boot/vmlinuz-* linux-image-amd64"
  "/bin/busybox busybox-static"
)

missing=()
for entry in "${PACKAGES[@]}"; do
  cmd=${entry%% *}
  pkg=${entry##* }
  if [[ "$cmd" == /* ]]; then
    if compgen -G "$cmd" >/dev/null; then
      echo "install-deps: $cmd present, skipping $pkg"
      continue
    fi
  elif command -v "$cmd" >/dev/null 2>&1; then
    echo "install-deps: $cmd found ($(command -v "$cmd")), skipping $pkg"
    continue
  fi
  echo "install-deps: $cmd missing, will install $pkg"
  missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: nothing to install"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-deps: apt-get update"
$SUDO apt-get update -qq
echo "install-deps: apt-get install -y ${missing[*]}"
$SUDO apt-get install -y -qq "${missing[@]}"
echo "install-deps: done"
