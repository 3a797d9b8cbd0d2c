"""A person's Slurm drain through a NodeSet update by slurm-operator v1.2.1 (core/person_holds.py): noted while a
person's, left alone while the operator drains the old pod for the update (its reason overrides: nodeset_sync.go
processCondemned, slurmcontrol.go MakeNodeDrain), put back once the old pod is gone, forgotten when the person
lifts it or a heal moves the Slurm node to another machine."""
from __future__ import annotations

import json

from gpufleet.fleetspec import labels
from gpufleet.reconciler.core.actions import CarryDrain, DrainSlurm, NoteHolds
from gpufleet.reconciler.core.drains import SlurmUsers, drained_by_person
from gpufleet.reconciler.core.model import NodeView, PodView, SlurmNodeView
from gpufleet.reconciler.core.person_holds import parse_holds, plan_holds

USERS = SlurmUsers(frozenset({"gpufleet"}), frozenset({"slurm", "root"}))
ALICE, OPERATOR, PRESTOP, GPUFLEET = (USERS.setter(u) for u in ("alice", "slurm", "root", "gpufleet"))
HOLD = "maintenance: alice"
UPDATE = "slurm-operator: Pod (slurm/gpu-3) is pending termination for scale-in"
TERMINATING = "slurm-operator: Pod is terminating"


def machine(name: str = "h100-0", holds: dict | None = None, cordoned: bool = False) -> NodeView:
    return NodeView(name, "h100", labels.ROLE_ACTIVE, unschedulable=cordoned,
                    person_holds=json.dumps(holds) if holds is not None else "")


def pod(uid: str, node: str | None = "h100-0", deleting: bool = False) -> PodView:
    return PodView("slurm", "gpu-3", node, labels=((labels.SLINKY_POD_HOSTNAME, "gpu-3"),), uid=uid, deleting=deleting)


def slurm(reason: str, by, *states: str) -> dict[str, SlurmNodeView]:
    return {"gpu-3": SlurmNodeView("gpu-3", frozenset(states), reason, comment_node="h100-0", set_by=by)}


def test_a_persons_drain_survives_an_update_that_overwrites_it() -> None:
    # 1. the person drains it: noted with the pod it runs on
    acts = plan_holds([machine()], [pod("u1")], slurm(HOLD, ALICE, "IDLE", "DRAIN"))
    assert acts == (NoteHolds("h100-0", json.dumps({"gpu-3": [HOLD, "u1"]})),)
    held = {"gpu-3": [HOLD, "u1"]}
    # 2. the operator's update drain overrides the reason while the old pod still runs: gpufleet waits (no fight)
    assert plan_holds([machine(holds=held)], [pod("u1")], slurm(UPDATE, OPERATOR, "IDLE", "DRAIN")) == ()
    # 3. the old pod deleted, the preStop's DOWN: the person's drain goes back at once
    acts = plan_holds([machine(holds=held)], [pod("u1", deleting=True)], slurm(TERMINATING, PRESTOP, "DOWN"))
    assert acts == (DrainSlurm("gpu-3", HOLD), NoteHolds("h100-0", json.dumps({"gpu-3": [HOLD, ""]})))
    # the new pod started before the drain went back (a missed pass): it goes back then too
    acts = plan_holds([machine(holds=held)], [pod("u2")], slurm("", None, "IDLE"))
    assert acts[0] == DrainSlurm("gpu-3", HOLD)
    # 4. back, set by gpufleet's user in the person's words: a person's drain, noted on the new pod
    back = slurm(HOLD, GPUFLEET, "IDLE", "DRAIN")
    assert drained_by_person(back["gpu-3"])
    acts = plan_holds([machine(holds={"gpu-3": [HOLD, ""]})], [pod("u2")], back)
    assert acts == (NoteHolds("h100-0", json.dumps({"gpu-3": [HOLD, "u2"]})),)
    assert plan_holds([machine(holds={"gpu-3": [HOLD, "u2"]})], [pod("u2")], back) == ()  # steady
    # 5. the person resumes it: forgotten
    assert plan_holds([machine(holds={"gpu-3": [HOLD, "u2"]})], [pod("u2")], slurm("", None, "IDLE")) == (
        NoteHolds("h100-0", None),)


def test_a_heal_keeps_it_with_the_machine_and_nothing_is_put_back() -> None:
    """The faulted machine is cordoned: nothing is put back; once the Slurm node runs elsewhere the machine carries
    the drain (as decide.carry_person_drains does; also when the operator's update drain hid it from the heal)."""
    held = {"gpu-3": [HOLD, "u1"]}
    assert plan_holds([machine(holds=held, cordoned=True), machine("spare-0")], [pod("u1", deleting=True)],
                      slurm(TERMINATING, PRESTOP, "DOWN")) == ()
    assert plan_holds([machine(holds=held, cordoned=True), machine("spare-0")], [pod("u2", "spare-0")],
                      slurm("", None, "IDLE")) == (CarryDrain("h100-0", (("gpu-3", HOLD),)), NoteHolds("h100-0", None))


def test_a_drain_that_moves_with_its_pod_is_noted_where_it_runs_and_unknowns_decide_nothing() -> None:
    acts = plan_holds([machine(holds={"gpu-3": [HOLD, "u1"]}), machine("h100-1")], [pod("u2", "h100-1")],
                      slurm(HOLD, ALICE, "IDLE", "DRAIN"))
    assert set(acts) == {NoteHolds("h100-0", None), NoteHolds("h100-1", json.dumps({"gpu-3": [HOLD, "u2"]}))}
    assert plan_holds([machine(holds={"gpu-3": [HOLD, "u1"]})], [], {}) == ()  # Slurm did not answer
    assert plan_holds([machine()], [pod("u1")], slurm("gpufleet: XID 79 [r]", GPUFLEET, "DRAIN")) == ()
    # another drain than the operator's replaced the person's (Slurm's own, here): forgotten, never put back
    held = {"gpu-3": [HOLD, "u1"]}
    for pods_now in ([pod("u1")], [pod("u2", "spare-0")]):
        assert plan_holds([machine(holds=held, cordoned=True), machine("spare-0")], pods_now,
                          slurm("Epilog error", OPERATOR, "IDLE", "DRAIN")) == (NoteHolds("h100-0", None),)
    assert parse_holds("not json") == {} and parse_holds('{"gpu-3": "x"}') == {} and parse_holds("[1]") == {}
