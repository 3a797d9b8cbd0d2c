#!/usr/bin/env bash
# Everything gpufleet needs on this machine, idempotent and with progress:
#   1. a Python virtualenv (.venv) with the project and its test dependencies, from requirements/dev.lock
#   2. a root filesystem of Debian sid with Slurm 26.05 and munge (the local Slurm runs from it)
#   3. the Go-built tools (Pulumi CLI, language host, Kubernetes provider, kube-apiserver, kubelet, etcd, kwok)
#   4. podman, buildah, containerd (Debian's) and gpufleet's images built from a Debian root
#   5. Prometheus and promtool (Debian's), for the tests of the metrics, alerts and dashboard
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$SECONDS
step() { printf '[bootstrap %3ds] %s\n' "$((SECONDS - start))" "$*"; }

py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python3
stamp=.venv/.installed-$(cat pyproject.toml setup.py requirements/dev.lock | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  # Every package at the version and hash of requirements/dev.lock (scripts/lock.sh writes it), then
  # gpufleet itself, editable, with the locked setuptools: nothing unpinned is fetched.
  step "python: creating .venv and installing the locked dependencies, hashes checked (about a minute)"
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements/dev.lock
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-*; touch "$stamp"
else
  step "python: .venv up to date"
fi
# The checkout on the venv's path: the development packages the wheel does not ship (localenv/, demos/)
# become importable, so the CLI's plugin hook (gpufleet/cli.py) adds `gpufleet local` and `gpufleet demo`.
.venv/bin/python -c 'import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()["purelib"], "gpufleet-checkout.pth").write_text(sys.argv[1] + "\n")' "$root"

step "slurm: Debian sid root with Slurm 26.05 (cached; about 3 minutes when cold)"
scripts/build-slurm-root.sh

step "go tools: pulumi engine and local control plane"
scripts/build-tools.sh
step "containers: podman, buildah, containerd, runc, debootstrap, CNI plugins"
scripts/install-containers.sh

step "prometheus: Prometheus and promtool (Debian's), for the metrics, alert and dashboard tests"
scripts/install-prometheus.sh

step "images: reconciler, agent and pause (a Debian root + the gpufleet wheel; cached)"
scripts/build-images.sh --print-json

step "ready"
