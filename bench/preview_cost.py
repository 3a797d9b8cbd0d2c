"""Preview cost: `pulumi preview` wall time, peak memory and resource count for fleets of 1 to 64
pools and up to 5,000 nodes. The program declares a pool's capacity (a ConfigMap, a NodeSet), never
its nodes, so its resources should grow with pools, not with nodes.

Each fleet is a generated stack file (cluster.kind local, slurm.operator.mode crds-only) previewed in
a throwaway copy of the project (gpufleet.preview.scratch_stack: empty state in a temporary file
backend, placeholder secrets) in render mode (GPUFLEET_RENDER_DIR: the Kubernetes provider renders
YAML, no cluster is needed). Peak memory is the summed VmRSS of the whole process tree (pulumi CLI,
language host, the Python program, the Kubernetes provider), sampled every 0.1 s from /proc.

    .venv/bin/python bench/preview_cost.py                          # pools 1,4,16,64 x nodes 64,5000
    .venv/bin/python bench/preview_cost.py --pools 1,16 --nodes 64,5000 --repeat 1   # quicker
    .venv/bin/python bench/preview_cost.py --policy-pack off        # only without the policy pack
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _output import add_json_option, exit_on_sigterm, load, machine, Output, pct, say, Table  # noqa: E402
from _fleets import fleet_doc, make_spec, pool_doc  # noqa: E402
from _procstats import TreeSampler  # noqa: E402

STACK = "bench"


def fleet(pools: int, nodes: int) -> dict:
    per, extra = divmod(nodes, pools)
    docs = [pool_doc(f"p{i:02d}", per + (1 if i < extra else 0), 2, provider="kubernetes-spares")
            for i in range(pools)]
    return fleet_doc(docs, {"grace_period_seconds": 120}, environment="bench")


def preview_once(pools: int, nodes: int, policy_pack: bool, workdir: Path, timeout: float) -> dict:
    from gpufleet.preview import POLICY_PACK_DIR, parse_digest, scratch_stack
    from gpufleet.stack import pulumi_binary

    doc = fleet(pools, nodes)
    spec = make_spec(doc["pools"], doc["healing"])
    stack_file = workdir / f"Pulumi.{STACK}-{pools}x{nodes}.yaml"
    stack_file.write_text(yaml.safe_dump({"config": {"gpufleet:fleet": doc}}, sort_keys=False))
    render = Path(tempfile.mkdtemp(prefix="render-", dir=workdir))
    with scratch_stack(STACK, spec.secret_keys(), {"GPUFLEET_RENDER_DIR": str(render)}, stack_yaml=stack_file) as st:
        argv = [pulumi_binary(), "preview", "--json", "--color", "never", "--cwd", str(st.project_dir),
                "--non-interactive", "--stack", STACK]
        if policy_pack:
            argv += ["--policy-pack", str(POLICY_PACK_DIR)]
        out, err = workdir / "preview.out", workdir / "preview.err"
        l0 = load()
        t0 = time.monotonic()
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=st.env())
            with TreeSampler(proc.pid) as sampler:
                try:
                    rc = proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                    raise
        wall = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"pulumi preview failed ({rc}): {err.read_text()[-2000:]} {out.read_text()[-2000:]}")
        digest = parse_digest(out.read_text()) or {}
    steps = digest.get("steps") or []
    types = [s.get("newState", {}).get("type") or s.get("urn", "").split("::")[-2] for s in steps]
    return {
        "pools": pools, "nodes": nodes, "wall_s": wall, "peak_tree_mib": sampler.peak_kib / 1024,
        "peak_single_mib": sampler.peak_single_kib / 1024, "peak_single": sampler.peak_single_name,
        "resources": len(steps), "k8s_resources": sum(1 for t in types if t and t.startswith("kubernetes:")),
        "creates": (digest.get("changeSummary") or {}).get("create"), "load": (l0 + load()) / 2,
    }


def result_tables(results: list[dict], a) -> list[Table]:
    return [Table(
        f"pulumi preview cost ({machine()}; render mode; median of {a.repeat} per row)",
        ["pools", "nodes", "policy pack", "resources", "Kubernetes resources", "wall s", "runs s",
         "peak MiB (tree)", "largest process MiB", "load"],
        [[r["pools"], r["nodes"], "yes" if r["policy_pack"] else "no", r["resources"], r["k8s_resources"],
          r["wall_s"], " / ".join(f"{w:.1f}" for w in r["wall_all"]), r["peak_tree_med"],
          f"{r['peak_single_mib']:.0f} ({r['peak_single']})", r["load"]] for r in results])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pools", default="1,4,16,64", help="pool counts (comma separated)")
    ap.add_argument("--nodes", default="64,5000", help="total active nodes (comma separated), split over the pools")
    ap.add_argument("--repeat", type=int, default=2, help="previews per fleet (the median is reported: the mean of two)")
    ap.add_argument("--policy-pack", choices=["off", "on", "both"], default="both",
                    help="run without and/or with the policy pack (policies/), as `gpufleet preview` does (default both)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per preview")
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output("preview_cost", a.json)
    exit_on_sigterm()
    pools = [int(x) for x in a.pools.split(",")]
    nodes = [int(x) for x in a.nodes.split(",")]

    local = Path(tempfile.mkdtemp(prefix="gf-preview-local-"))
    os.environ["GPUFLEET_LOCAL_DIR"] = str(local)  # never the project's own .local
    workdir = Path(tempfile.mkdtemp(prefix="gf-preview-"))
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.policy_pack]
    say(f"preview cost: {machine()}; pools {pools} x nodes {nodes}, {a.repeat} run(s) each; "
        f"policy pack {a.policy_pack}; work folder {workdir}")
    results = []
    try:
        for pack in modes:
            say(f"warm-up preview{' with the policy pack' if pack else ''} (plugins, bytecode) ...")
            preview_once(1, 8, pack, workdir, a.timeout)
            for p in pools:
                for n in nodes:
                    if n < p:
                        continue
                    runs = []
                    for _ in range(a.repeat):
                        r = preview_once(p, n, pack, workdir, a.timeout)
                        runs.append(r)
                        say(f"{p:>3} pools, {n:>5} nodes{', policy pack' if pack else ''}: {r['wall_s']:.1f}s, "
                            f"peak {r['peak_tree_mib']:.0f} MiB (tree), {r['resources']} resources "
                            f"({r['k8s_resources']} Kubernetes)")
                    best = dict(runs[0])
                    best["wall_all"] = [r["wall_s"] for r in runs]
                    best["wall_s"] = pct(best["wall_all"], 50)
                    best["peak_tree_med"] = pct([r["peak_tree_mib"] for r in runs], 50)
                    best["policy_pack"] = pack
                    results.append(best)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    out.emit(result_tables(results, a), raw=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
