"""Whose a Slurm drain is, from who set its reason (Slurm's record) and what it says: a person's hold, gpufleet's,
the operator's, or Slurm's own (a fault of its own kind, with its action). The reasons and setters below are
what Slurm 26.05 records (reconciler/core/slurm_reasons.py cites where); the real Slurm does it in
tests/integration/test_slurm_drain_setter.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.fleetspec import labels
from gpufleet.reconciler.adapters.slurm.cli import _node, _parse_oneliner
from gpufleet.reconciler.adapters.slurm.rest import NodesResponse, _node as rest_node
from gpufleet.reconciler.core.decide import plan_step
from gpufleet.reconciler.core.drains import (
    Owner, SlurmUsers, drained_by_gpufleet, drained_by_operator, drained_by_person, drained_by_slurm, owner,
)
from gpufleet.reconciler.core.model import Setter, SlurmNodeView, StepFacts
from gpufleet.reconciler.core.actions import CarryDrain, DrainSlurm, Notify
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair import RepairFacts, stop_reason
from gpufleet.reconciler.core.slurm_reasons import CHECK, GONE, REASONS
from tests.unit.test_decide import T0, node, rec, spares, spec

USERS = SlurmUsers(frozenset({"gpufleet"}), frozenset({"slurm", "root"}))
GPUFLEET, SLURMCTLD, SLURMD, ALICE = (USERS.setter(u) for u in ("gpufleet", "slurm", "root", "alice"))


def view(reason: str, by: Setter | None, *states: str) -> SlurmNodeView:
    return SlurmNodeView("gpu-3", frozenset(states or ("IDLE", "DRAIN")), reason, comment_node="h100-0", set_by=by)


@pytest.mark.parametrize("reason, by, states, expected", [
    # slurmctld's own (the SlurmUser), slurmd's own (root): Slurm's, not a person's
    ("Kill task failed (JobId=41 StepId=0)", SLURMD, (), Owner.SLURM),
    ("Not responding", SLURMCTLD, ("DOWN", "NOT_RESPONDING"), Owner.SLURM),
    ("Prolog error", SLURMCTLD, (), Owner.SLURM),
    ("Epilog error", SLURMCTLD, (), Owner.SLURM),
    ("Prolog/Epilog failure", SLURMCTLD, (), Owner.SLURM),
    ("gres/gpu count reported lower than configured (7 < 8)", SLURMCTLD, (), Owner.SLURM),
    ("Prolog error : Not responding", SLURMCTLD, ("DOWN", "DRAIN"), Owner.SLURM),  # slurmctld appended its own
    # a person with their own account: a person's, whatever the text says
    ("Kill task failed", ALICE, (), Owner.PERSON),
    ("gpufleet: XID 79 [h100-0-xid79-1]", ALICE, (), Owner.PERSON),
    ("slurm-operator: Pod is terminating", ALICE, ("DOWN",), Owner.PERSON),
    ("bad fan, RMA open", ALICE, (), Owner.PERSON),
    # root and the SlurmUser are accounts a person can use: free text from them is a person's
    ("hardware check by ops", SLURMD, (), Owner.PERSON),
    ("hardware check by ops", SLURMCTLD, (), Owner.PERSON),
    # a person's drain that slurmctld appended to is still the person's
    ("hardware check by ops : Not responding", SLURMCTLD, ("DOWN", "DRAIN"), Owner.PERSON),
    # gpufleet's own, also when slurmctld appended its own reason
    ("gpufleet: XID 79 [h100-0-xid79-1]", GPUFLEET, (), Owner.GPUFLEET),
    ("gpufleet: XID 79 [h100-0-xid79-1] : Not responding", SLURMCTLD, ("DOWN", "DRAIN"), Owner.GPUFLEET),
    ("gpufleet: XID 79 [h100-0-xid79-1]", SLURMD, (), Owner.GPUFLEET),  # the CLI backend's scontrol as root
    ("gpufleet-lending: idle, lent to preemptible work [h100-1]", GPUFLEET, (), Owner.LENDING),
    # the operator's: its client's `slurm`, its preStop's root
    ("slurm-operator: Pod is terminating", SLURMD, ("DOWN",), Owner.OPERATOR),
    ("slurm-operator: cordoned for maintenance", SLURMCTLD, (), Owner.OPERATOR),
    # gpufleet's user writes only its own prefixes: anything else under it is someone using its token
    ("Kill task failed", GPUFLEET, (), Owner.PERSON),
    # Slurm did not name the setter: the prefix decides, and anything else is a person's (as before)
    ("gpufleet: XID 79 [h100-0-xid79-1]", None, (), Owner.GPUFLEET),
    ("Kill task failed", None, (), Owner.PERSON),
])
def test_whose_drain_is_decided_by_who_set_it(reason, by, states, expected):
    n = view(reason, by, *states)
    assert owner(n) is expected
    assert drained_by_person(n) is (expected is Owner.PERSON and n.drained)
    assert drained_by_gpufleet(n) is (expected is Owner.GPUFLEET)
    assert drained_by_operator(n) is (expected is Owner.OPERATOR)
    assert (drained_by_slurm(n) is not None) is (expected is Owner.SLURM)


def test_slurms_own_drains_are_faults_of_their_own_kind_each_with_its_action():
    kill = drained_by_slurm(view("Kill task failed (JobId=41 StepId=0)", SLURMD))
    assert (kill.kind, kill.action) == ("kill-task-failed", CHECK)  # a node problem: checked before it serves
    gone = drained_by_slurm(view("Not responding", SLURMCTLD, "DOWN", "NOT_RESPONDING"))
    assert (gone.kind, gone.action) == ("not-responding", GONE)  # a node that is gone: Slurm set it DOWN
    for r in ("Prolog error", "Epilog error", "Prolog/Epilog failure"):
        assert drained_by_slurm(view(r, SLURMCTLD)).action == CHECK
    assert all(r.source.startswith("src/") and r.action in (CHECK, GONE) for r in REASONS)  # each row cites Slurm


def test_the_setter_is_known_by_name_and_a_nameless_one_tells_nothing():
    assert USERS.setter("gpufleet") == Setter("gpufleet", gpufleet=True)
    assert USERS.setter("slurm") == Setter("slurm", slurm=True) and USERS.setter("root").slurm
    assert USERS.setter("alice") == Setter("alice")
    assert USERS.setter(None) is None and USERS.setter("") is None  # slurmrestd: a uid it cannot name
    assert USERS.setter("4294967294") is None  # scontrol: the uid in digits (NO_VAL: no one recorded)
    local = SlurmUsers.of(spec())  # the spec's reconciler user; Slinky's SlurmUser; slurmd's root
    assert local == SlurmUsers(frozenset({"gpufleet"}), frozenset({"slurm", "root"}))
    assert SlurmUsers.of(spec(), acts_as="svc-gpu").setter("svc-gpu").gpufleet  # the CLI backend's own uid
    both = SlurmUsers(frozenset({"slurm"}), frozenset({"slurm", "root"})).setter("slurm")  # a local reconciler as the SlurmUser
    assert both.gpufleet and both.slurm


def test_a_repair_goes_on_through_slurms_own_drain_and_stops_for_a_persons():
    r = rec(node("h100-0", xid=79))
    quarantined = node("h100-0", role=labels.ROLE_QUARANTINED)
    for own in (view("Kill task failed (JobId=41 StepId=0)", SLURMD), view("Epilog error", SLURMCTLD)):
        assert stop_reason(r, RepairFacts(node=quarantined, slurm=(own,)), spec()) == ""
    held = stop_reason(r, RepairFacts(node=quarantined, slurm=(view("Kill task failed", ALICE),)), spec())
    assert "drained by a person" in held and "set by alice" in held


def test_a_heal_drains_over_slurms_own_drain_and_keeps_a_persons():
    """A Kill task failed on the faulted node is not carried off as a person's hold (no page, no annotation that
    keeps the machine from the spares): gpufleet's own drain replaces it, lifted once the node is healthy."""
    r = rec(node("h100-0", xid=79))
    st = plan_step(r, StepFacts(slurm_names=("gpu-3",)), spec(), T0)
    own = view("Kill task failed (JobId=41 StepId=0)", SLURMD)
    st2 = plan_step(st.remediation, StepFacts(slurm=(own,)), spec(), T0)
    assert st2.remediation.kept_drains == ()
    assert any(isinstance(a, DrainSlurm) and a.node == "gpu-3" for a in st2.actions)
    assert not any(isinstance(a, (CarryDrain, Notify)) for a in st2.actions)
    person = view("Kill task failed (JobId=41 StepId=0)", ALICE)  # the same words, a person's hand
    st3 = plan_step(st.remediation, StepFacts(slurm=(person,)), spec(), T0)
    assert st3.remediation.kept_drains == ("gpu-3",) and any(isinstance(a, CarryDrain) for a in st3.actions)
    (told,) = [a for a in st3.actions if isinstance(a, Notify)]
    assert told.event == "person-drain-carried" and "set by alice" in told.text  # who, as Slurm recorded it


def test_a_spare_slurm_drained_itself_is_not_promoted():
    r = rec(node("h100-0", xid=79), Phase.REPLACING)
    facts = StepFacts(pool_nodes=spares("h100-spare-0", "h100-spare-1"),
                      spare_slurm=(("h100-spare-0", (replace(view("Kill task failed", SLURMD), name="s0"),)),
                                   ("h100-spare-1", (replace(view("gpufleet: spare", GPUFLEET), name="s1"),))))
    assert plan_step(r, facts, spec(), T0).remediation.replacement == "h100-spare-1"


# --- both backends read who set it -----------------------------------------------------------------------

def test_the_cli_reads_who_set_the_reason_from_scontrols_stamp():
    # `scontrol -o show node` (Slurm 26.05, src/api/node_info.c): Reason=<reason> [<user>@<time>], then Comment
    line = ("NodeName=h100-0 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN Partitions=train "
            "Reason=Kill task failed (JobId=41 StepId=0) [root@2026-12-06T01:02:03] Comment={\"node\":\"kwok-h100-1\"}")
    n = _node(_parse_oneliner(line))
    assert (n.reason, n.reason_set_by) == ("Kill task failed (JobId=41 StepId=0)", "root")
    assert n.reason_changed_at is not None and n.comment == '{"node":"kwok-h100-1"}'
    unnamed = _node(_parse_oneliner("NodeName=x State=IDLE+DRAIN Reason=ops [4294967294@2026-12-06T01:02:03]"))
    assert (unnamed.reason, unnamed.reason_set_by) == ("ops", "4294967294")
    none = _node(_parse_oneliner("NodeName=x State=IDLE"))
    assert (none.reason, none.reason_set_by) == ("", None)


def test_the_rest_client_reads_reason_set_by_user():
    # GET /slurm/v0.0.45/nodes (data parser v0.0.45: reason, reason_changed_at, reason_set_by_user)
    body = {"nodes": [
        {"name": "h100-0", "state": ["IDLE", "DRAIN"], "reason": "Not responding",
         "reason_changed_at": {"set": True, "infinite": False, "number": 1796000000}, "reason_set_by_user": "slurm"},
        {"name": "h100-1", "state": ["IDLE"], "reason": "", "reason_changed_at": {"set": False, "number": 0},
         "reason_set_by_user": ""},
    ]}
    a, b = (rest_node(n) for n in NodesResponse.model_validate(body).nodes)
    assert (a.reason_set_by, a.reason_changed_at) == ("slurm", 1796000000.0)
    assert (b.reason_set_by, b.reason_changed_at) == (None, None)
