"""What `pip install gpufleet` brings: the product's packages, declared for Python 3.11 to 3.13, and no
development package (the local environment, the demos, the benchmarks, the tests, the stack program).
Builds the wheel as scripts/build-images.sh does (pip wheel; the build backend from PyPI or pip's cache)."""
from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"gpufleet"}  # one package name: the repository's folders install as gpufleet.<folder>


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("gpufleet-*.whl")
    return whl


def test_the_wheel_holds_the_product_and_no_development_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == PRODUCT, sorted(tops)
    assert not [n for n in names if n.split("/", 1)[0] in ("localenv", "demos", "bench", "tests", "infra")]
    assert "gpufleet/cli.py" in names and "gpufleet/local_cluster.py" in names
    for folder in ("fleetspec", "reconciler", "components", "policies"):
        assert f"gpufleet/{folder}/__init__.py" in names, folder
    assert "gpufleet/reconciler/core/decide.py" in names and "gpufleet/policies/PulumiPolicy.yaml" in names


def test_the_wheel_declares_python_3_11_to_3_13(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    assert meta["Requires-Python"] == "<3.14,>=3.11"
    versions = {c.rsplit(" :: ", 1)[1] for c in meta.get_all("Classifier") if c.startswith("Programming Language :: Python :: 3.")}
    assert versions == {"3.11", "3.12", "3.13"}


def test_installed_from_the_wheel_the_cli_has_no_local_environment(wheel, tmp_path):
    """The wheel's packages alone (this Python's dependencies, the checkout off the path): the CLI's plugin
    hook finds no `localenv`, so `gpufleet local` and `gpufleet demo` are not there."""
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    code = (f"import sys; sys.path[:] = [{str(target)!r}] + [p for p in sys.path if p not in ('', {str(ROOT)!r})]\n"
            "import gpufleet, importlib.util\n"
            f"assert gpufleet.__file__.startswith({str(target)!r}), gpufleet.__file__\n"
            "assert importlib.util.find_spec('localenv') is None and importlib.util.find_spec('demos') is None\n"
            "from gpufleet.cli import app, load_plugins\n"
            "assert load_plugins() == []\n"
            "names = {c.name or c.callback.__name__ for c in app.registered_commands} | {g.name for g in app.registered_groups}\n"
            "assert 'reconcile' in names and 'agent' in names and not names & {'demo', 'local'}, names\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
