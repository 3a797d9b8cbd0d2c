"""The README's local-environment commands, as written there, on a fresh environment folder: `gpufleet
local up` leaves the local stack ready (backend, stack, secrets), so `gpufleet pulumi -s local up` is the
next step, as the README says; a second `local up` changes nothing pulumi would deploy.

The commands are read from the README's first bash block under "## The local environment", so the test
and the README cannot part. Where a command cannot run unattended it is changed, and only so:
`pulumi ... up` gets `--yes` (pulumi asks for a confirmation that needs a terminal, and refuses without
one); `remediations --watch` runs without `--watch` (it refreshes until interrupted), until the record of
the injected fault shows; `.local` is the fresh folder GPUFLEET_LOCAL_DIR names (the README's `$PWD/.local`
in the by-hand line), never the checkout's own. The environment uses the default ports, as the README's
commands do, so none may be in use.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from gpufleet.waiting import wait_for
from localenv.control_plane import DEFAULT_PORTS
from localenv.env import SLURM_PORTS
from localenv.ports import port_free

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
GPUFLEET = ".venv/bin/gpufleet"


def readme_commands() -> list[str]:
    """The command lines of the README's local-environment block (continuation lines joined)."""
    section = (ROOT / "README.md").read_text().split("\n## The local environment\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [line for line in block.replace("\\\n", " ").splitlines() if shlex.split(line, comments=True)]


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUFLEET_LOCAL_STATE", "PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "KUBECONFIG")}
    return {**env, "GPUFLEET_LOCAL_DIR": str(root), "COLUMNS": "200"}


def _run(cmd: str, root: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    print(f"$ {cmd}", flush=True)
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=_env(root), capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n", flush=True)
    return r


def _unattended(cmd: str, root: Path) -> str:
    """The README's line as it runs here (the module docstring lists each change)."""
    argv = shlex.split(cmd, comments=True)
    line = cmd.split(" #", 1)[0].strip()
    if "pulumi" in argv and "up" in argv[argv.index("pulumi") + 1:]:  # gpufleet's or pulumi's own
        line += " --yes"
    line = line.replace(" --watch", "")
    return line.replace("$PWD/.local", str(root)).replace(" .local/", f" {root}/")


@pytest.fixture
def fresh_local(tmp_path_factory, kube_bin_dir, slurm_root, pulumi_bin_dir, built_images, kubectl):
    busy = sorted(p for p in {*DEFAULT_PORTS.values(), *SLURM_PORTS.values()} if not port_free(p))
    if busy:
        pytest.fail(f"ports {busy} are in use: a local environment on the default ports is up (the README's "
                    f"commands use them); `gpufleet local down` it first", pytrace=False)
    root = tmp_path_factory.mktemp("readme") / "local"  # short: containerd's socket paths must be
    try:
        yield root
    finally:
        _run(f"{GPUFLEET} local down", root)


def test_the_readmes_commands_drive_a_fresh_local_environment(fresh_local):
    root = fresh_local
    tracked = (ROOT / "Pulumi.local.yaml").read_text()
    commands = readme_commands()
    assert [shlex.split(c, comments=True)[:3] for c in commands if c.startswith(GPUFLEET)][:2] == [
        [GPUFLEET, "local", "up"], [GPUFLEET, "pulumi", "-s"]]  # the sequence this test is about
    assert not (root / "state").exists()
    faulted = None
    for cmd in commands:
        argv = shlex.split(cmd, comments=True)
        line = _unattended(cmd, root)
        if argv[:3] == [GPUFLEET, "local", "status"]:
            # Exit 0 when everything runs; the pods come up after `pulumi up` applied the Deployment.
            wait_for("`local status`: healthy, the reconciler pods Ready with a Lease holder",
                     lambda: (r := _run(line, root, 120)).returncode == 0 and "(Lease holder)" in r.stdout,
                     timeout=300, interval=5)
            continue
        if argv[:2] == [GPUFLEET, "remediations"]:
            assert faulted
            wait_for(f"a remediation of {faulted} in `gpufleet remediations`",
                     lambda: (r := _run(line, root, 120)).returncode == 0 and faulted in r.stdout,
                     timeout=180, interval=5)
            continue
        if argv[:2] == [GPUFLEET, "inject-fault"]:
            faulted = argv[2]
        if argv[:3] == [GPUFLEET, "local", "down"]:
            # Before it: `local up` again changes nothing the stack would deploy (its secrets are kept).
            assert _run(f"{GPUFLEET} local up", root).returncode == 0
            r = _run(f"{GPUFLEET} pulumi -s local preview --expect-no-changes", root)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        r = _run(line, root)
        assert r.returncode == 0, f"{line}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        if argv[:3] == [GPUFLEET, "local", "up"]:
            assert "stack local: created" in r.stdout
        if argv[0].endswith("kubectl") and "logs" in argv:
            assert "[pod/gpufleet-reconciler-" in r.stdout  # the pods' lines, read through their kubelets
    assert (ROOT / "Pulumi.local.yaml").read_text() == tracked  # the tracked stack file is never written
