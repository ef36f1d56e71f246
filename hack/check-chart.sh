#!/usr/bin/env bash
# Render the Helm chart charts/lattice and validate everything it produces, offline:
#   * rendered with Helm's own engine (PyPI helm-python-sdk: Helm's Go SDK as a library, no
#     helm binary), with the chart's default values and with each charts/lattice/ci/*.yaml,
#     and linted by Helm's linter;
#   * every object validated (strict: unknown fields are errors) against the Kubernetes
#     API schemas of the oldest release the chart supports and of the newest one pinned
#     (PyPI kubernetes-validate);
#   * the config files it writes for lattice-server and lattice-agent are TOML whose keys
#     are the daemons' flags (from the binaries in $LATTICE_BIN, when built).
# The tools come from hack/install-deps.sh (.tools/chart-venv). Exits non-zero on any error.
set -euo pipefail
cd "$(dirname "$0")/.."

# Chart.yaml's kubeVersion floor, and the newest release kubernetes-validate knows.
KUBERNETES_VERSIONS=${KUBERNETES_VERSIONS:-1.27.0,1.37.0}
python=.tools/chart-venv/bin/python
if [ ! -x "$python" ]; then
  echo "check-chart: $python missing: run hack/install-deps.sh" >&2
  exit 1
fi
values=()
for f in charts/lattice/ci/*.yaml; do
  values+=("$f")
done
echo "check-chart: rendering charts/lattice (default values${values[*]:+, ${values[*]}}), validating against Kubernetes $KUBERNETES_VERSIONS"
"$python" hack/lib/check_chart.py charts/lattice "$KUBERNETES_VERSIONS" "${values[@]}"
echo "check-chart: charts/lattice renders and validates"
