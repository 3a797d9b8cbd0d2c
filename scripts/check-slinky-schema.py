#!/usr/bin/env python3
"""Compare gpufleet's Slinky definitions (components/slinky_schema.py) with a slurm-operator release's
own CRD files, and optionally check rendered Slinky resources against those files.

    scripts/check-slinky-schema.py --crds DIR [--render FILE ...]

DIR holds the release's `slinky.slurm.net_*.yaml` (`config/crd/bases/` of SlinkyProject/slurm-operator
at the tag gpufleet pins, or the slurm-operator-crds chart's templates). Every difference in what the
API server enforces (fields, types, required, enums, defaults, patterns, CEL rules, list/map types,
names, printer columns, subresources) is printed; descriptions are ignored. With --render, each
Slinky resource in the YAML stream(s) (e.g. `gpufleet render --stack prod --without-operator-chart`)
is validated against the release's own schema with unknown fields refused (CEL rules are not
evaluated here: tests/integration/test_slinky_crds.py runs them on a real API server).
Exit 1 when anything differs or is refused. Nothing of the release is kept or copied.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpufleet.components.slinky_schema import GROUP, KINDS, crd_manifest, plural, strict_json_schema  # noqa: E402

IGNORED = {"description"}


def normalise(node):
    if isinstance(node, dict):
        return {k: normalise(v) for k, v in node.items() if k not in IGNORED}
    if isinstance(node, list):
        return [normalise(v) for v in node]
    return node


def diff(a, b, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{path}.{k}: only in the release: {b[k]!r}"[:300])
            elif k not in b:
                out.append(f"{path}.{k}: only in gpufleet: {a[k]!r}"[:300])
            else:
                diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: gpufleet {a!r} != release {b!r}"[:300])


def release_crd(crds: Path, kind: str) -> dict:
    return yaml.safe_load((crds / f"{GROUP}_{plural(kind)}.yaml").read_text())


def compare(crds: Path) -> list[str]:
    out: list[str] = []
    for kind in KINDS:
        ours = crd_manifest(kind, with_webhook=False)
        theirs = release_crd(crds, kind)
        diff(normalise(ours["spec"]), normalise(theirs["spec"]), kind, out)
    return out


def check_render(crds: Path, files: list[Path]) -> list[str]:
    import jsonschema

    schemas = {k: strict_json_schema(release_crd(crds, k)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
               for k in KINDS}
    out, seen = [], 0
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not isinstance(doc, dict) or not str(doc.get("apiVersion", "")).startswith(GROUP + "/"):
                continue
            seen += 1
            body = {k: v for k, v in doc.items() if k in ("apiVersion", "kind", "spec")}
            for e in jsonschema.Draft7Validator(schemas[doc["kind"]]).iter_errors(body):
                out.append(f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")
    print(f"{seen} Slinky resource(s) checked against the release's CRDs")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crds", type=Path, required=True)
    ap.add_argument("--render", type=Path, nargs="*", default=[])
    a = ap.parse_args()
    problems = compare(a.crds)
    problems += check_render(a.crds, a.render) if a.render else []
    for p in problems:
        print(p)
    print("same as the release" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
