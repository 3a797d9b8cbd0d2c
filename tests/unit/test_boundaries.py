"""Package boundaries: the reconciler's core imports only the standard library and the spec; adapters
never reach into the core's decisions; the reconciler and the spec never pull in pulumi."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("fleetspec", "reconciler", "components", "policies")  # installed as gpufleet.<folder> (setup.py)


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """The modules a file imports, anywhere in it (relative imports resolved to their package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(root).parent.parts
                out.add(".".join(("gpufleet", *parts) if parts and parts[0] in FOLDERS else parts))
            elif node.module:
                out.add(node.module)
    return out


def foreign(root: Path) -> dict[str, list[str]]:
    """What each module of `root`/reconciler/core imports besides the standard library, fleetspec and the core."""
    out = {}
    for path in sorted((root / "reconciler" / "core").glob("*.py")):
        wrong = sorted(m for m in imports(path, root) if m.split(".")[0] not in sys.stdlib_module_names
                       and not m.startswith(("gpufleet.fleetspec", "gpufleet.reconciler.core")))
        if wrong:
            out[path.name] = wrong
    return out


def test_the_core_imports_only_the_standard_library_the_spec_and_itself():
    assert foreign(ROOT) == {}


def test_the_boundary_check_sees_a_core_module_that_imports_an_adapter_a_client_or_pydantic(tmp_path):
    core = tmp_path / "reconciler" / "core"
    core.mkdir(parents=True)
    (core / "x.py").write_text("import json\nfrom .model import NodeView\n\n\ndef f():\n"
                               "    import httpx\n    from gpufleet.reconciler.adapters.kube import Kube\n"
                               "    from pydantic import BaseModel\n    from kubernetes import client\n")
    assert foreign(tmp_path) == {"x.py": ["gpufleet.reconciler.adapters.kube", "httpx", "kubernetes", "pydantic"]}


def test_adapters_never_import_the_cores_decisions():
    for path in (ROOT / "reconciler" / "adapters").rglob("*.py"):
        decisions = {m for m in imports(path) if m in ("gpufleet.reconciler.core.decide", "gpufleet.reconciler.core.admission",
                                                       "gpufleet.reconciler.core.lending", "gpufleet.reconciler.core.spares")}
        assert not decisions, f"{path.relative_to(ROOT)} imports {sorted(decisions)}"


def test_reconciler_and_spec_import_no_pulumi():
    modules = sorted("gpufleet.reconciler." + ".".join(p.relative_to(ROOT / "reconciler").with_suffix("").parts)
                     for p in (ROOT / "reconciler").rglob("*.py") if p.name != "__init__.py")
    code = (
        "import sys, importlib\n"
        "import gpufleet.fleetspec\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'pulumi' or m.startswith(('pulumi.', 'pulumi_')))\n"
        "assert not bad, bad\n"
        "harness = sorted(m for m in sys.modules if 'localenv' in m or m.startswith('gpufleet.')\n"
        "                 and not m.startswith(('gpufleet.reconciler', 'gpufleet.fleetspec')))\n"
        "assert not harness, harness\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_spec_imports_neither_pulumi_nor_kubernetes():
    code = ("import sys, gpufleet.fleetspec, gpufleet.fleetspec.placement, gpufleet.fleetspec.remediation_crd, gpufleet.fleetspec.ledger\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('pulumi', 'kubernetes')]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr



def old_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """Files that import a folder by its bare name: the wheel installs only `gpufleet`, so such an import works
    in the checkout (its folder is on the path) and fails, or loads the module twice, once installed."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in (".venv", "build", ".local", ".tools") or "tmp" in rel.parts[:1]:
            continue
        wrong = sorted(m for m in imports(path, root) if m.split(".")[0] in FOLDERS)
        if wrong:
            out[str(rel)] = wrong
    return out


def test_every_import_names_the_one_installed_package():
    assert old_imports() == {}


def test_the_import_check_sees_a_bare_folder_import(tmp_path):
    (tmp_path / "x.py").write_text("import fleetspec.models\nfrom components import fleet\nfrom gpufleet.reconciler import app\n")
    assert old_imports(tmp_path) == {"x.py": ["components", "fleetspec.models"]}
