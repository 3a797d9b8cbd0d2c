"""The lock files: every dependency pyproject.toml declares is pinned there at a version it allows, with the
hashes of its files; the images' lock is the development lock's versions (scripts/lock.sh writes both)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of a pip-compile --generate-hashes file."""
    out: dict[str, tuple[str, int]] = {}
    entries = re.split(r"\n(?=[A-Za-z0-9])", path.read_text())
    for e in entries:
        m = re.match(r"([A-Za-z0-9_.-]+)==([^\s\\;]+)", e)
        if m:
            out[canonicalize_name(m.group(1))] = (m.group(2), len(re.findall(r"--hash=sha256:[0-9a-f]{64}", e)))
    return out


def declared(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if canonicalize_name(r.name) != "gpufleet"]


@pytest.mark.parametrize("lock,extras", [("dev.lock", ("pulumi", "test")), ("runtime.lock", ())])
def test_every_declared_dependency_is_pinned_with_hashes(lock, extras):
    got = pins(ROOT / "requirements" / lock)
    for req in declared(extras):
        name = canonicalize_name(req.name)
        assert name in got, f"{req.name} is declared but not in requirements/{lock}: run scripts/lock.sh"
        version, hashes = got[name]
        assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} is outside {req.specifier}"
    assert all(h >= 1 for _, h in got.values()), [n for n, (_, h) in got.items() if not h]
    assert "setuptools" in got  # the build's own, so `pip install --no-build-isolation -e .` fetches nothing


def test_the_images_run_the_versions_the_tests_ran():
    dev, runtime = pins(ROOT / "requirements" / "dev.lock"), pins(ROOT / "requirements" / "runtime.lock")
    assert {n: v for n, (v, _) in runtime.items()} == {n: dev[n][0] for n in runtime}
    assert "pytest" not in runtime and "pulumi" not in runtime
