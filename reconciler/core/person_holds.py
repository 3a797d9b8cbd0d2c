"""A person's Slurm drain that Slinky's operator overwrites to update or scale in a NodeSet pod: gpufleet keeps it
in its own record and puts it back. Pure.

What slurm-operator v1.2.1 does to the Slurm node of a pod it condemns (a RollingUpdate after an image, slurmd or
extraConf change, a scale-in): it drains it with its own reason, `slurm-operator: Pod (<ns>/<pod>) is pending
termination for scale-in`, overriding whatever reason is there (nodeset_sync.go processCondemned ->
makePodCordonAndDrain(..., overrideReason=true); slurmcontrol.go MakeNodeDrain), a person's included; once the
node runs no job it deletes the pod, whose preStop sets the node DOWN with `slurm-operator: Pod is terminating`
(workerbuilder/worker_app.go); the new pod's slurmd registers and the node takes jobs again (ReturnToService, and
syncPodUncordon's UNDRAIN of a reason that is the operator's). So upstream loses the person's drain.

gpufleet keeps it: the machine the Slurm node runs on carries the record (annotation labels.PERSON_HOLDS,
JSON {slurm node: [the person's reason, the uid of the pod it was seen on]}), and:
- a Slurm node a person drained (drains.drained_by_person) is noted with its pod's uid while that pod runs;
- once the pod it was noted on is gone (the operator replaced it) and no person's drain is on the node, the
  drain is put back with the person's reason (DrainSlurm), at once: while the node is DOWN by the preStop or
  its new pod starts, so that DRAIN is there before the new slurmd registers (Slurm keeps a DRAIN across a
  DOWN node's registration; the operator's uncordon leaves a reason that is not its own alone:
  slurmcontrol.go IsNodeReasonOurs). Put back by gpufleet's Slurm user with the person's words, it reads as a
  person's drain again (drains.owner: no gpufleet prefix), so heals and lending keep treating it as one;
- it is forgotten when the person lifted it (the same pod, the Slurm node neither drained nor down), when
  another drain than the operator's replaced it (a heal's, Slurm's own: theirs to lift), or when the Slurm
  node's pod now runs on another machine (a heal moved it); a cordoned machine then carries it, as
  decide.carry_person_drains does for a faulted one (also when the update's drain hid it from the heal);
- nothing is put back while the machine is cordoned: that is a heal's or a person's (decide.py carries a
  person's drain to a faulted machine and moves the Slurm node to a spare).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from gpufleet.fleetspec import labels

from gpufleet.reconciler.core.actions import Action, CarryDrain, DrainSlurm, NoteHolds
from gpufleet.reconciler.core.drains import Owner, drained_by_person, owner
from gpufleet.reconciler.core.model import NodeView, PodView, SlurmNodeView

Holds = dict[str, tuple[str, str]]  # Slurm node -> (the person's reason, the uid of the pod it was seen on)


def parse_holds(text: str) -> Holds:
    """The annotation's JSON; a value that is not ours to read is no record (never raises)."""
    try:
        raw = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): (str(v[0]), str(v[1])) for k, v in raw.items()
            if isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)}


def render_holds(holds: Holds) -> str | None:
    """The annotation's value; None removes it."""
    return json.dumps({k: list(v) for k, v in sorted(holds.items())}, sort_keys=True) if holds else None


def _live_pods(pods: Iterable[PodView]) -> dict[str, PodView]:
    """Slurm node -> its NodeSet pod that is not on its way out (the one placed, if there are two)."""
    out: dict[str, PodView] = {}
    for p in pods:
        name = p.label(labels.SLINKY_POD_HOSTNAME)
        if name and not p.deleting and (name not in out or (p.node and not out[name].node)):
            out[name] = p
    return out


def plan_holds(nodes: Iterable[NodeView], pods: Iterable[PodView],
               slurm: Mapping[str, SlurmNodeView]) -> tuple[Action, ...]:
    """The drains to put back and the records to write (see the module docstring). `slurm` empty (Slurm did not
    answer): nothing is decided."""
    if not slurm:
        return ()
    machines = {n.name: n for n in nodes}
    live = _live_pods(pods)
    have = {m: parse_holds(n.person_holds) for m, n in machines.items()}
    want = {m: dict(h) for m, h in have.items()}
    actions: list[Action] = []
    for m, holds in have.items():
        for name, (reason, uid) in holds.items():
            view, pod = slurm.get(name), live.get(name)
            if view is None or drained_by_person(view):
                continue  # not seen this time, or a person's drain is there (noted below)
            if (view.drained or view.down) and owner(view) is not Owner.OPERATOR:
                del want[m][name]  # someone else's drain now (a heal's, Slurm's own): theirs to lift
                continue
            if pod is not None and pod.uid == uid:
                if not view.drained and not view.down:
                    del want[m][name]  # the person lifted it
                continue
            if pod is not None and pod.node and pod.node != m:
                del want[m][name]  # moved off the machine: the drain goes with the machine, as a heal carries it
                if machines[m].unschedulable:
                    actions.append(CarryDrain(m, ((name, reason),)))
                continue
            if machines[m].unschedulable:
                continue  # a heal's, or a person's cordon: theirs to decide
            actions.append(DrainSlurm(name, reason))
            want[m][name] = (reason, pod.uid if pod is not None and pod.node == m else "")
    for name, view in sorted(slurm.items()):
        pod = live.get(name)
        if not drained_by_person(view) or pod is None or not pod.node or pod.node not in machines:
            continue
        for m in want:
            if m != pod.node:
                want[m].pop(name, None)
        want[pod.node][name] = (view.reason, pod.uid)
    actions += [NoteHolds(m, render_holds(want[m])) for m in sorted(want) if want[m] != have[m]]
    return tuple(actions)
