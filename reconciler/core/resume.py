"""Whether a remediation's Slurm nodes are back: each one it moved runs on a healthy node (not the faulted
one, nor a replacement that broke) and takes jobs. Pure.

A remediation succeeds only then: a ready replacement is not enough (another Slurm node's pod may have
landed there while the remediation's own waits Pending with nowhere to go). While one is not back, the
record says why (`Remediation.waiting`): no pod yet, a pod the scheduler can place on no node (with the
scheduler's words), a pod still on the faulted node or on a broken replacement, a Slurm node that does not
take jobs. A person's drain went with the faulted machine (decide.carry_person_drains: slurm-operator
1.2.1's preStop and its IDLE on the new node clear it on the Slurm node), so every Slurm node that moved
is waited for until it takes jobs, the person's too.
"""
from __future__ import annotations

from gpufleet.fleetspec import labels

from gpufleet.reconciler.core.model import PodView, Remediation, SlurmNodeView, StepFacts


def _pods(name: str, pods: tuple[PodView, ...]) -> list[PodView]:
    return [p for p in pods if p.label(labels.SLINKY_POD_HOSTNAME) == name and not p.deleting]


def _elsewhere(r: Remediation, pod: PodView) -> bool:
    """The pod runs on a node that can hold the Slurm node: not the faulted node (unless it was repaired in
    place and is its own replacement: issue 25), nor a replacement that broke."""
    healthy_here = r.replacement == r.node
    return bool(pod.node) and (pod.node != r.node or healthy_here) \
        and pod.node not in {f.node for f in r.failed_replacements}


def moved(r: Remediation, facts: StepFacts) -> tuple[str, ...]:
    """The remediation's Slurm nodes whose pods now run on a healthy node (the ones to resume once there)."""
    return tuple(n for n in r.slurm_nodes if any(_elsewhere(r, p) for p in _pods(n, facts.slurm_pods)))


def landed(r: Remediation, facts: StepFacts) -> str | None:
    """The node every one of the remediation's Slurm nodes now runs on, off the faulted node (one node; None when
    some are not placed yet, or they are spread over several): Slurm capacity back under these names, whichever
    spare it was promoted for."""
    if not r.slurm_nodes or set(moved(r, facts)) != set(r.slurm_nodes):
        return None
    hosts = {p.node for n in r.slurm_nodes for p in _pods(n, facts.slurm_pods) if _elsewhere(r, p)}
    return hosts.pop() if len(hosts) == 1 else None


def taken_by_others(r: Remediation, facts: StepFacts) -> tuple[str, ...]:
    """Slurm nodes not the remediation's own that run on its replacement while its own have not come back and one
    of their pods can be placed nowhere: the scheduler gave the promoted spare to another Slurm node."""
    if r.replacement is None or r.replacement == r.node or moved(r, facts) or not unplaceable(r, facts):
        return ()
    return tuple(sorted(set(facts.replacement_slurm) - set(r.slurm_nodes)))


def not_back(r: Remediation, facts: StepFacts) -> dict[str, str]:
    """The remediation's Slurm nodes that are not back, each with why (empty: all are back)."""
    slurm: dict[str, SlurmNodeView] = {n.name: n for n in facts.slurm}
    out: dict[str, str] = {}
    for name in r.slurm_nodes:
        pods = _pods(name, facts.slurm_pods)
        placed = [p for p in pods if _elsewhere(r, p)]
        if not placed:
            stuck = next((p for p in pods if not p.node and p.unschedulable), None)
            if stuck is not None:
                out[name] = f"pod {stuck.key} cannot be scheduled: {stuck.unschedulable}"
            elif any(p.node for p in pods):
                out[name] = f"its pod is still on {next(p.node for p in pods if p.node)}"
            else:
                out[name] = "no pod placed yet"
        elif name not in slurm:
            out[name] = f"Slurm does not know it yet (pod on {placed[0].node})"
        elif not slurm[name].takes_jobs:
            states = "+".join(sorted(slurm[name].states))
            out[name] = f"it does not take jobs ({states}{': ' + slurm[name].reason if slurm[name].reason else ''})"
    return out


def unplaceable(r: Remediation, facts: StepFacts) -> bool:
    """A Slurm node of the remediation has a pod the scheduler can place on no node."""
    return any(why.startswith("pod ") and "cannot be scheduled" in why for why in not_back(r, facts).values())


def waiting(r: Remediation, facts: StepFacts) -> str:
    """One line for the record: which Slurm nodes are not back, and why."""
    left = not_back(r, facts)
    return "; ".join(f"Slurm node {n}: {why}" for n, why in sorted(left.items()))
