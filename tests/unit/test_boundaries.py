"""Package boundaries: the reconciler and the spec never pull in pulumi."""
import subprocess
import sys


def test_reconciler_and_spec_import_no_pulumi():
    code = (
        "import sys\n"
        "import fleetspec, reconciler.app, reconciler.runtime.controller, reconciler.agent.daemon, reconciler.adapters.providers\n"
        "import reconciler.adapters.slurm, reconciler.adapters.notify, reconciler.adapters.records\n"
        "bad = sorted(m for m in sys.modules if m == 'pulumi' or m.startswith(('pulumi.', 'pulumi_')))\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_spec_imports_neither_pulumi_nor_kubernetes():
    code = ("import sys, fleetspec, fleetspec.placement, fleetspec.remediation_crd\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('pulumi', 'kubernetes')]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
