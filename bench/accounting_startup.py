"""What running accounting for real adds to the local environment's start-up (issue 24: the reconciler's Slurm
identity lives in slurmdbd): the local Slurm's `up()` without accounting, then applying the local stack's
Accounting (the database stand-in's data folder made, MariaDB, slurmdbd, slurmctld restarted with the
AccountingStorage lines), then the stack's SlurmUsers script until the reconciler's user has its AdminLevel;
cold (a new work folder) and warm (`up()` again after `down()`: the data folder kept).

Usage: bench/accounting_startup.py [--runs N] [--json [FILE]]     (about 1 min for 2 runs)
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._output import Output, Table, exit_on_sigterm, load, say  # noqa: E402
from localenv.ports import free_ports  # noqa: E402
from localenv.slurm import LocalSlurm  # noqa: E402
from tests.fixtures.slurm_cluster import build_slurm_root, start_accounting  # noqa: E402


def one_run(root: Path) -> dict[str, float]:
    wd = Path(tempfile.mkdtemp(prefix="gf-acct-", dir="/tmp"))
    ctld, rest = free_ports(2)
    cluster = LocalSlurm(wd, {"gpu": ["gpu-a"]}, root=root, ctld_port=ctld, rest_port=rest)
    out: dict[str, float] = {}
    try:
        t = time.monotonic()
        cluster.up()
        out["up without accounting"] = time.monotonic() - t
        t = time.monotonic()
        start_accounting(cluster)  # apply_accounting + the SlurmUsers script until it succeeds
        out["accounting and the reconciler's user, cold"] = time.monotonic() - t
        cluster.down()
        t = time.monotonic()
        cluster.up()
        out["up with accounting, warm"] = time.monotonic() - t
    finally:
        cluster.down()
        shutil.rmtree(wd, ignore_errors=True)
    return out


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", nargs="?", const="-", default=None)
    a = ap.parse_args()
    output = Output("accounting_startup", a.json)
    root = build_slurm_root()
    runs = []
    for i in range(a.runs):
        say(f"run {i + 1}/{a.runs}")
        runs.append(one_run(root))
        say(f"  {', '.join(f'{k}: {v:.1f}s' for k, v in runs[-1].items())}")
    steps = list(runs[0])
    rows = [(s, min(r[s] for r in runs), max(r[s] for r in runs)) for s in steps]
    output.emit([Table(f"Local Slurm start-up with accounting ({a.runs} runs, load {load():.2f})",
                       ["step", "min s", "max s"], rows)], raw=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
