"""Render a Helm chart with Helm's own engine and validate every manifest it produces.

Usage: check_chart.py CHART KUBERNETES_VERSIONS [VALUES_FILE ...]

Renders CHART once with its default values and once per VALUES_FILE (helm-python-sdk:
Helm's Go SDK through its C ABI, as `helm template` renders), runs Helm's linter, and
validates each rendered object against the JSON Schemas of each of KUBERNETES_VERSIONS
(comma separated; kubernetes-validate, offline, strict: unknown fields are errors).

The daemons' config files the chart writes (ConfigMap keys ending in .toml) must be TOML
whose keys are long flags of the daemon: with LATTICE_BIN set to a directory of built
binaries, those of `lattice-server --help` and `lattice-agent --help`.

Exits 1 on any failure, naming the values, the template and the object.
"""

import os
import re
import subprocess
import sys
import tomllib

import helm_python as helm
import kubernetes_validate
import yaml

RELEASE, NAMESPACE = "lattice", "lattice-system"


def render(chart_dir, values):
    with helm.Chart.load(chart_dir) as chart:
        return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def long_flags(binary):
    """The long flags a daemon's --help lists (None: the binary is not built)."""
    bin_dir = os.environ.get("LATTICE_BIN")
    if not bin_dir or not os.access(os.path.join(bin_dir, binary), os.X_OK):
        return None
    help_text = subprocess.run(
        [os.path.join(bin_dir, binary), "--help"], check=True, capture_output=True, text=True
    ).stdout
    return set(re.findall(r"^\s+(?:-\w, )?--([a-z][a-z0-9-]*)", help_text, re.M))


FLAGS = {"server.toml": long_flags("lattice-server"), "agent.toml": long_flags("lattice-agent")}


def check_config_files(name, doc):
    """The .toml files of a ConfigMap: TOML, with the daemon's flags as keys."""
    failures = []
    if doc.get("kind") != "ConfigMap":
        return failures
    for key, text in (doc.get("data") or {}).items():
        if not key.endswith(".toml"):
            continue
        try:
            settings = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            failures.append(f"{name}: {key}: not TOML: {e}")
            continue
        flags = FLAGS.get(key)
        if flags is None:
            continue
        for setting in settings:
            if setting not in flags or setting in ("help", "version", "config"):
                failures.append(f"{name}: {key}: `{setting}` is no flag of the daemon")
    return failures


def check(chart_dir, versions, values_file):
    label = values_file or "default values"
    values = {}
    if values_file:
        with open(values_file) as f:
            values = yaml.safe_load(f) or {}
    failures = []
    lint = helm.lint(chart_dir, values, namespace=NAMESPACE, kube_version=f"v{versions[0]}")
    for m in lint.get("messages", []):
        # Severity 1 is informational ("icon is recommended").
        if m.get("severity", 0) > 1:
            failures.append(f"helm lint: {m.get('path')}: {m.get('error')}")
    for e in lint.get("errors") or []:
        failures.append(f"helm lint: {e}")
    try:
        rendered = render(chart_dir, values)
    except helm.HelmError as e:
        return [f"rendering failed: {e}"]
    objects = 0
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            if not text.strip():
                failures.append(f"{template}: empty")
            continue
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            name = f"{template}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            failures.extend(check_config_files(name, doc))
            for version in versions:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    path = "/".join(str(p) for p in e.path)
                    failures.append(f"{name}: Kubernetes {version}: {path}: {e.message}")
                    continue
                except Exception as e:  # an unknown kind or apiVersion
                    failures.append(f"{name}: Kubernetes {version}: {e}")
                    continue
                objects += 1
                print(f"check-chart: [{label}] {name}: valid against Kubernetes {version}")
    if objects == 0:
        failures.append("no objects rendered")
    return failures


def main():
    chart_dir, versions, *values_files = sys.argv[1:]
    versions = versions.split(",")
    for key, flags in FLAGS.items():
        if flags is None:
            print(f"check-chart: no built binaries in LATTICE_BIN: {key}'s keys not checked")
    failed = False
    for values_file in [None, *values_files]:
        for failure in check(chart_dir, versions, values_file):
            print(f"check-chart: [{values_file or 'default values'}] {failure}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
