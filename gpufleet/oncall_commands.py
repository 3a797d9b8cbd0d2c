"""The on-call commands: `gpufleet release | return | retire NODE`, a person's decision about a node gpufleet
holds, and `gpufleet hold | unhold NODE`, a person's hold on its repair.

release, return and retire write one request on the node's newest Remediation (the annotation of
fleetspec/oncall.py); the reconciler carries it out under its Lease and notes it as done, with what it did
or why it refused (reconciler/core/oncall.py). The command waits for that note and prints it, so a person
learns at once whether it happened. A hold is the pool's opt-out label on the node, which stops the repair
loop (`RepairStopped`) and keeps a heal from replacing the node; unhold removes it and the repair goes on
where it stopped. Exit 0: done; 1: refused, not carried out within --timeout, or the cluster unreachable;
2: bad arguments or no remediation of that node.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from gpufleet.console import EXIT_FAILED, EXIT_INVALID, _err, app

BY_HELP = "Who decides (recorded on the remediation and in its Events); default: $USER."


def newest(records, node: str):
    """The node's newest remediation (the one a request is about), or None."""
    mine = [r for r in records if r.node == node]
    return max(mine, key=lambda r: (r.created, r.name)) if mine else None


def outcome(r, request_id: str) -> str | None:
    """What the reconciler noted for the request (None while it is not carried out): the note it appended
    to the record's reason, `<action> by <who>: <what it did>`."""
    if request_id not in r.requests_done:
        return None
    return r.reason.rsplit("; ", 1)[-1] if r.reason else "done"


def _person(by: Optional[str]) -> str:
    import getpass

    return by or getpass.getuser()


def _ask(action: str, node: str, reason: str, by: Optional[str], wait: bool, timeout: float, as_json: bool,
         kubeconfig: Optional[Path], stack: Optional[str]) -> None:
    from gpufleet.fleetspec import labels
    from gpufleet.fleetspec.oncall import PersonRequest
    from gpufleet.commands import _api
    from gpufleet.waiting import wait_for
    from gpufleet.reconciler.adapters.records import KubeRemediationStore
    from gpufleet.reconciler.errors import PermanentError, TemporaryError

    store = KubeRemediationStore(_api(kubeconfig, stack))
    try:
        r = newest(store.list(), node)
    except (TemporaryError, PermanentError) as e:
        _err(f"cannot read the remediations: {e}")
        raise typer.Exit(EXIT_FAILED)
    if r is None:
        _err(f"{node}: no remediation of this node; `gpufleet remediations` lists them")
        raise typer.Exit(EXIT_INVALID)
    req = PersonRequest(action, _person(by), datetime.now(timezone.utc), reason)
    try:
        store.annotate(r.name, {labels.ONCALL_REQUEST: req.dumps()})
    except (TemporaryError, PermanentError) as e:
        _err(f"cannot write the request on remediation {r.name}: {e}")
        raise typer.Exit(EXIT_FAILED)
    said = {"node": node, "remediation": r.name, "action": action, "request": req.id, "by": req.by}
    if not wait:
        typer.echo(json.dumps({**said, "done": None}) if as_json else f"{action} of {node} asked ({r.name})")
        return

    def carried_out():
        found = next((x for x in store.list() if x.name == r.name), None)
        return outcome(found, req.id) if found is not None else None

    try:
        what = wait_for(f"the reconciler to carry out {req.id} on {r.name}", carried_out, timeout, interval=1.0)
    except TimeoutError:
        _err(f"{action} of {node} is asked ({r.name}) but not carried out within {timeout:.0f}s: is the reconciler "
             "running and holding its Lease? The request stays; it is carried out when the reconciler gets to it.")
        raise typer.Exit(EXIT_FAILED)
    refused = ": refused: " in what
    if as_json:
        typer.echo(json.dumps({**said, "done": what, "refused": refused}))
    else:
        typer.echo(f"{node}: {what}")
    if refused:
        raise typer.Exit(EXIT_FAILED)


def _options():
    return dict(
        reason=typer.Option("", "--reason", "-r", help="Why (recorded)."),
        by=typer.Option(None, "--by", help=BY_HELP),
        wait=typer.Option(True, "--wait/--no-wait", help="Wait until the reconciler has carried it out."),
        timeout=typer.Option(120.0, help="Seconds to wait."),
        as_json=typer.Option(False, "--json", help="The outcome as JSON."),
        kubeconfig=typer.Option(None),
        stack=typer.Option(None, "--stack", "-s"),
    )


_o = _options()


@app.command()
def release(node: str = typer.Argument(..., help="A node whose remediation is held (storm brake, max_concurrent), "
                                       "opted out or escalated."),
            reason: str = _o["reason"], by: Optional[str] = _o["by"], wait: bool = _o["wait"],
            timeout: float = _o["timeout"], as_json: bool = _o["as_json"], kubeconfig: Optional[Path] = _o["kubeconfig"],
            stack: Optional[str] = _o["stack"]) -> None:
    """Let a held, opted-out or escalated remediation go on: NODE is replaced from the spares, then repaired."""
    _ask("release", node, reason, by, wait, timeout, as_json, kubeconfig, stack)


@app.command("return")
def return_(node: str = typer.Argument(..., help="A node out of service: its repair stopped, retired, or never begun."),
            reason: str = _o["reason"], by: Optional[str] = _o["by"], wait: bool = _o["wait"],
            timeout: float = _o["timeout"], as_json: bool = _o["as_json"], kubeconfig: Optional[Path] = _o["kubeconfig"],
            stack: Optional[str] = _o["stack"]) -> None:
    """Health-check NODE and, when it passes, put it back among the spares (after a person fixed it)."""
    _ask("return", node, reason, by, wait, timeout, as_json, kubeconfig, stack)


@app.command()
def retire(node: str = typer.Argument(..., help="A node gpufleet holds."),
           reason: str = _o["reason"], by: Optional[str] = _o["by"], wait: bool = _o["wait"],
           timeout: float = _o["timeout"], as_json: bool = _o["as_json"], kubeconfig: Optional[Path] = _o["kubeconfig"],
           stack: Optional[str] = _o["stack"]) -> None:
    """Retire NODE now, for good (its provider retires it; no page: you know)."""
    _ask("retire", node, reason, by, wait, timeout, as_json, kubeconfig, stack)


def _hold(node: str, on: bool, reason: str, by: Optional[str], as_json: bool, kubeconfig: Optional[Path],
          stack: Optional[str]) -> None:
    from gpufleet.fleetspec import labels
    from gpufleet.commands import _api
    from gpufleet.console import load_spec
    from gpufleet.reconciler.adapters.kube import Kube
    from gpufleet.reconciler.errors import PermanentError, TemporaryError

    key = load_spec(stack, None).healing.opt_out_label
    kube = Kube(_api(kubeconfig, stack))
    note = f"held by {_person(by)}" + (f": {reason}" if reason else "")
    try:  # the label and its reason annotation, as the policy pack asks of every opt-out (policies/rules/opt_out.py)
        kube.patch_node(node, {"metadata": {"labels": {key: "true" if on else None},
                                            "annotations": {labels.OPT_OUT_REASON: note[:250] if on else None}}})
    except (TemporaryError, PermanentError) as e:
        _err(f"cannot {'hold' if on else 'release the hold on'} {node}: {e}")
        raise typer.Exit(EXIT_FAILED)
    if as_json:
        typer.echo(json.dumps({"node": node, "held": on, "label": key, "by": note}))
    else:
        typer.echo(f"{node}: {key}={'true' if on else '(removed)'}: " + (
            "its repair stops (RepairStopped) and no heal replaces it until `gpufleet unhold`" if on else
            "a stopped repair goes on where it stopped"))


@app.command()
def hold(node: str = typer.Argument(..., help="A node whose repair (or replacement) a person takes over."),
         reason: str = _o["reason"], by: Optional[str] = _o["by"], as_json: bool = _o["as_json"],
         kubeconfig: Optional[Path] = _o["kubeconfig"], stack: Optional[str] = _o["stack"]) -> None:
    """Hold NODE for a person: the spec's opt-out label on it stops its repair and keeps heals off it."""
    _hold(node, True, reason, by, as_json, kubeconfig, stack)


@app.command()
def unhold(node: str = typer.Argument(..., help="A node held with `gpufleet hold`."),
           by: Optional[str] = _o["by"], as_json: bool = _o["as_json"],
           kubeconfig: Optional[Path] = _o["kubeconfig"], stack: Optional[str] = _o["stack"]) -> None:
    """Lift a person's hold on NODE: a stopped repair goes on where it stopped."""
    _hold(node, False, "", by, as_json, kubeconfig, stack)
