#!/usr/bin/env bash
# Do gpufleet's dependencies (with the pulumi and test extras, the Pulumi SDK pins included) resolve to
# binary wheels for each Python it declares? pip resolves them for that version without installing
# anything (--dry-run; PyPI or pip's cache). CI runs the suite on this machine's Python; this checks the others.
#   scripts/check-python-versions.sh [VERSION...]    (default: 3.11 3.12 3.13)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
"$py" - "$root/pyproject.toml" > "$tmp/requirements.txt" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = p["optional-dependencies"]
print("\n".join(p["dependencies"] + extras["pulumi"] + [r for r in extras["test"] if not r.startswith("gpufleet")]))
PY
status=0
for v in "${@:-3.11 3.12 3.13}"; do
  for ver in $v; do
    if "$py" -m pip install -q --disable-pip-version-check --dry-run --ignore-installed --only-binary=:all: \
        --python-version "$ver" --target "$tmp/target-$ver" --report "$tmp/$ver.json" -r "$tmp/requirements.txt" \
        > "$tmp/$ver.log" 2>&1; then
      n=$("$py" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["install"]))' "$tmp/$ver.json")
      echo "Python $ver: resolves ($n packages, binary wheels only)"
    else
      echo "Python $ver: does not resolve:"; tail -5 "$tmp/$ver.log"; status=1
    fi
  done
done
exit $status
