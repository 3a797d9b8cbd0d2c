#!/usr/bin/env bash
# Build what is missing of the Pulumi engine, the local Kubernetes control plane and kubectl from their
# Go modules, into a cache outside the clone (keyed by pinned versions), linked into .tools/bin.
# Seconds when the cache is there; a cold build takes long (see docs/local.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/build-pulumi.sh"
"$here/build-kube.sh"
"$here/build-kubectl.sh"
