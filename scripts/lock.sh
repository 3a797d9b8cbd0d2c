#!/usr/bin/env bash
# Write the lock files from pyproject.toml, with the hash of every file of every pinned version:
#   requirements/dev.lock      gpufleet[test] (pulumi, the test tools) and the build's setuptools: bootstrap and CI
#   requirements/runtime.lock  gpufleet's own dependencies at the same versions: the images (build-images.sh, release.yml)
# Run after changing a dependency in pyproject.toml, and commit both. Needs the network (PyPI).
# pip-compile (pip-tools, pinned below) resolves for this machine's Python (3.11); the hashes cover every file of each
# pinned release, so Python 3.12 and 3.13 install the same versions from their own wheels.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tools=.venv-lock
[ -x "$tools/bin/pip-compile" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install -q "pip-tools==7.6.2"; }
export PIP_FIND_LINKS=  # a machine's local wheel folder must not end up in the lock
common=(--quiet --generate-hashes --allow-unsafe --all-build-deps --strip-extras --no-emit-index-url --no-emit-find-links)
"$tools/bin/pip-compile" "${common[@]}" --extra test -o requirements/dev.lock pyproject.toml
"$tools/bin/pip-compile" "${common[@]}" -c requirements/dev.lock -o requirements/runtime.lock pyproject.toml
# gpufleet itself (its test extra names gpufleet[pulumi]) is the checkout, installed apart with --no-deps
for f in requirements/dev.lock requirements/runtime.lock; do
  python3 - "$f" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = re.sub(r"(?m)^# WARNING: pip install will require the following package to be hashed\.\n(#.*\n)*", "", text)
text = re.sub(r"(?m)^gpufleet @ file://.*\n(    #.*\n)*", "", text)
open(path, "w").write(text)
PY
done
echo "wrote requirements/dev.lock ($(grep -c '==' requirements/dev.lock) pins) and requirements/runtime.lock ($(grep -c '==' requirements/runtime.lock) pins)"
