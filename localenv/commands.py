"""The local environment's commands: `gpufleet local up | down | status` and `gpufleet demo`.

They reach the CLI through its one plugin hook (:func:`gpufleet.cli.load_plugins` calls :func:`register`),
and only where this package is importable: a development checkout. The wheel and the images ship neither
this package nor these commands."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from gpufleet.console import EXIT_FAILED, EXIT_INVALID, _err, load_spec

local = typer.Typer(help="The local environment: control plane, fake GPU nodes (kwok), real Slurm.",
                    no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add `gpufleet local` and `gpufleet demo` to the CLI (the plugin hook's entry), and tell the product's
    commands where this checkout's environment records itself (unless GPUFLEET_LOCAL_STATE says otherwise)."""
    from gpufleet import local_cluster
    from localenv.paths import state_file

    local_cluster.set_default_state(state_file)
    app.add_typer(local, name="local")
    app.command()(demo)


def make_env(stack: str = "local", file: Optional[Path] = None, kubelet: bool = False):
    """The environment; with ``kubelet`` its system pool is real kubelet nodes, one per reconciler replica."""
    from localenv.env import LocalEnv

    spec = load_spec(stack, file)
    if spec.cluster.kind != "local":
        _err(f"stack {stack} is not a local cluster (cluster.kind: {spec.cluster.kind})")
        raise typer.Exit(EXIT_FAILED)
    return LocalEnv(spec, kubelet_nodes=spec.healing.reconciler.replicas if kubelet else 0)


@local.command("up")
def local_up(stack: str = typer.Option("local", "--stack", "-s"),
             kubelet: bool = typer.Option(True, "--kubelet/--no-kubelet",
                                          help="Real kubelet nodes as the system pool (the reconciler runs there as "
                                               "pods after `pulumi up`); --no-kubelet: a kwok node, and the "
                                               "reconciler as a host process.")) -> None:
    """Start etcd, the API server, controller manager, scheduler, kwok, the fake GPU nodes, the kubelet nodes
    and Slurm, and prepare the local stack, so that `gpufleet pulumi -s local up` is the next step
    (idempotent)."""
    from gpufleet.stack import PulumiError
    from localenv.slurm import LocalSlurmError
    from localenv.stack_config import StackConfigError
    from localenv.supervisor import SupervisorError

    env = make_env(stack, kubelet=kubelet)
    try:
        env.up()
    except (SupervisorError, LocalSlurmError, StackConfigError) as e:
        _err(f"local environment failed to come up:\n{e}")
        raise typer.Exit(EXIT_FAILED)
    try:
        env.prepare_stack()
    except PulumiError as e:
        _err(f"local environment up, but the local stack could not be prepared:\n{e}")
        raise typer.Exit(EXIT_FAILED)


@local.command("down")
def local_down(stack: str = typer.Option("local", "--stack", "-s")) -> None:
    """Stop everything the local environment started (idempotent). State and certificates are kept."""
    make_env(stack).down()


@local.command("status")
def local_status(stack: str = typer.Option("local", "--stack", "-s"),
                 as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show what runs. Exit 1 when something is down."""
    env = make_env(stack)
    st = env.status()
    # A kubelet node is whole or stopped (`up --no-kubelet` after a kubelet run leaves stopped ones).
    nodes_ok = all(bool(n["containerd"]["pid"]) == bool(n["kubelet"]["pid"]) for n in st["nodes"].values())
    healthy = (bool(st["kube"].get("ready")) and env.slurm.healthy() and env.standin_running()
               and env.autoscaler_running() and nodes_ok)
    if as_json:
        typer.echo(json.dumps({**st, "healthy": healthy}, indent=2, default=str))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"local environment ({env.root})")
        for col in ("COMPONENT", "STATE", "DETAIL"):
            t.add_column(col)
        for name, c in st["kube"]["components"].items():
            state = "healthy" if c["healthy"] else ("running" if c["running"] else "stopped")
            t.add_row(name, state, f"pid {c['pid']}, port {c['port']}" if c["pid"] else c["log"])
        for name, pid in st["slurm"]["daemons"].items():
            t.add_row(name, "running" if pid else "stopped", f"pid {pid}" if pid else "")
        nodes = st["slurm"].get("nodes") or {}
        if nodes:
            t.add_row("slurm nodes", ", ".join(sorted({v for v in nodes.values()})),
                      f"{len(nodes)} nodes: {', '.join(sorted(nodes))}")
        t.add_row("slinky stand-in", st["slinky_standin"], str(env.standin_log))
        t.add_row("cluster autoscaler stand-in", st["autoscaler_standin"], str(env.autoscaler_log))
        for node, procs in st["nodes"].items():
            for proc, p in procs.items():
                t.add_row(f"{proc} {node}", "running" if p["pid"] else "stopped",
                          f"pid {p['pid']}" if p["pid"] else p["log"])
        for pod in st["pods"]:
            state = "Ready" if pod["ready"] else pod["phase"]
            t.add_row(f"pod {pod['name']}", state + (" (Lease holder)" if pod["leader"] else ""),
                      f"node {pod['node']}, restarts {pod['restarts']}")
        t.add_row("reconciler (host process)", st["reconciler"], str(env.reconciler_log))
        Console().print(t)
        typer.echo(f"KUBECONFIG={st['kube']['kubeconfig']} SLURM_CONF={st['slurm']['conf']} "
                   f"SLURM_REST={st['slurm']['rest_url']}")
    if not healthy:
        raise typer.Exit(EXIT_FAILED)


def demo(
    keep: bool = typer.Option(False, "--keep", help="Reuse the running environment instead of starting clean, and "
                              "leave it running at the end (by default the demo takes it down: `make test` needs "
                              "the default ports free)."),
    xid: int = typer.Option(79, help="XID to inject; one whose action takes the node out (79: reboot)."),
    grace: Optional[int] = typer.Option(None, help="Override the grace period (seconds); host-process mode only."),
    kubelet: bool = typer.Option(True, "--kubelet/--no-kubelet",
                                 help="Heal through the reconciler pods on real kubelet nodes (default), or a host process."),
    lending: bool = typer.Option(False, "--lending",
                                 help="The second demo: idle GPUs lent to inference, taken back by training and by a fault."),
) -> None:
    """The main job: local up, pulumi up, a training job, an XID 79, and the fleet healing itself
    (`--lending`: idle spares and nodes serving inference, and taken back)."""
    from demos.demo import demo_fault, run_demo
    from demos.lending_demo import run_lending_demo
    from gpufleet.stack import PulumiError

    env = make_env("local", kubelet=kubelet)
    if not lending:
        try:
            demo_fault(env.spec, xid)
        except ValueError as e:
            _err(f"demo: {e}")
            raise typer.Exit(EXIT_INVALID)
    try:
        if lending:
            run_lending_demo(env.spec, env, env.stack(), fresh=not keep)
            return
        tl = run_demo(env.spec, env, env.stack(), fresh=not keep, xid=xid, grace=grace)
    except (PulumiError, RuntimeError, TimeoutError) as e:
        _err(f"demo failed: {e}\n  reconciler log: {env.reconciler_log}")
        raise typer.Exit(EXIT_FAILED)
    finally:
        leave(env, keep)
    if tl.outcome != "Succeeded":
        raise typer.Exit(EXIT_FAILED)


def leave(env, keep: bool) -> None:
    """The demo's last step: what stays running. By default nothing (the local environment holds the default
    ports, which `make test`'s README test needs); with --keep everything, and the demo says how to stop it."""
    if keep:
        typer.echo(f"\nThe local environment is still running (--keep), its state in {env.root}: try "
                   "`gpufleet why 1`, `gpufleet remediations`, `gpufleet capacity`; stop it with "
                   "`gpufleet local down` (before `make test`).")
        return
    typer.echo("\nTaking the local environment down (`gpufleet demo --keep` leaves it running to look around).")
    env.down()
