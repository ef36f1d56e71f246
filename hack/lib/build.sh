# shellcheck shell=bash
# Sourced by every hack/ script that builds Lattice (not run): one package and feature set
# for all of them, so that a script finds what the one before it built and compiles
# nothing again.
#
# Cargo resolves dependency features over everything one command builds, so
# `-p lattice-server -p lattice-agent` and `-p lattice-server -p lattice-e2e` enable
# different features of shared dependencies (num-traits, getrandom, ...), and examples add
# their crates' dev-dependencies. Each selection then compiled those dependencies and every
# crate above them again, and linked every binary anew. Every script builds the same
# selection instead: every binary and example of the workspace, whose dependency features
# are exactly those of `cargo test --workspace`.
#
#   lattice_build PROFILE   builds that selection with PROFILE and sets LATTICE_BIN to the
#                           directory of its binaries (examples in $LATTICE_BIN/examples);
#                           LATTICE_BENCH_PROFILE replaces the dist profile the benchmarks ask for
#
# Profiles (Cargo.toml): `dev` for the tests (hack/test.sh), `release` for the quickstart
# and users, `dist` (fat LTO, one codegen unit) for every benchmark and for distribution.

lattice_build() {
  local profile=$1 dir
  # LATTICE_BENCH_PROFILE=release runs a benchmark on the quicker release build (its
  # figures then say so): the dist profile's fat LTO takes a long while on 2 cores.
  if [ "$profile" = dist ] && [ -n "${LATTICE_BENCH_PROFILE:-}" ]; then
    profile=$LATTICE_BENCH_PROFILE
  fi
  case "$profile" in
    dev) dir=debug ;;
    *) dir=$profile ;;
  esac
  export PROTOC="${PROTOC:-$(command -v protoc)}"
  echo "==> cargo build --profile $profile --workspace --bins --examples" >&2
  cargo build --profile "$profile" --workspace --bins --examples >&2
  # shellcheck disable=SC2034 # read by the scripts that source this file
  LATTICE_BIN="${CARGO_TARGET_DIR:-target}/$dir"
}
