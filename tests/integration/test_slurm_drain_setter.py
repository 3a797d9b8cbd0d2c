"""Who set a node's reason, as the real Slurm 26.05 records it, read by both clients, and whose drain the core
takes it for (reconciler/core/drains.py): slurmctld's own drain (an Epilog that fails) and down (a slurmd that
stops answering) are Slurm's, recorded as the SlurmUser, never a person's hold; a person's drain (their own
account, an Administrator in accounting) is theirs whatever it says; gpufleet's is gpufleet's; the operator's
stand-in drains as the operator's user. The cluster: tests/fixtures/slurm_cluster.py (its Epilog fails on the
node a test names)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.fleetspec import load_stack_file
from gpufleet.waiting import wait_for
from localenv.slinky_standin import OPERATOR_USER, PREFIX
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.adapters.slurm import SlurmClient
from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI
from gpufleet.reconciler.adapters.slurm.rest import SignedToken, SlurmREST
from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.condition import parse_condition
from gpufleet.reconciler.core import slurm_drains
from gpufleet.reconciler.core.drains import (
    Owner, SlurmUsers, drained_by_gpufleet, drained_by_person, drained_by_slurm, owner, slurm_reason,
)
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.observe import node_view
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.slurm_reasons import CHECK, GONE
from gpufleet.reconciler.runtime.facts import slurm_view
from tests.fixtures.slurm_cluster import (
    KUBE_NODE_OF, REPO_ROOT, RECONCILER_USER, SLURM_PARTITION, TENANT_USER, fail_epilog,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FLEET = load_stack_file(REPO_ROOT / "Pulumi.local.yaml").fleet
USERS = SlurmUsers.of(FLEET)  # gpufleet; slurm and root


@pytest.fixture(params=["rest", "cli"])
def client(request, slurm_fresh: LocalSlurm) -> Iterator[SlurmClient]:
    """Each client as the reconciler runs it: slurmrestd with its own user's token, or Slurm's tools."""
    if request.param == "cli":
        yield SlurmCLI(env=slurm_fresh.env(), timeout=20)
        return
    rest = SlurmREST(slurm_fresh.rest_url, SignedToken(slurm_fresh.jwt_key_path, user=RECONCILER_USER), timeout=10)
    yield rest
    rest.close()


def test_slurmctlds_own_drain_is_recorded_as_the_slurm_user_and_not_taken_for_a_persons(
        slurm_fresh: LocalSlurm, client: SlurmClient) -> None:
    """A job's Epilog fails: slurmctld drains the node itself ("Epilog error", src/slurmctld/job_mgr.c, as the
    SlurmUser). Before, any reason without gpufleet's or the operator's prefix was a person's hold."""
    c = slurm_fresh
    fail_epilog(c, "gpu-a-1")
    c.sbatch("-p", SLURM_PARTITION, "-w", "gpu-a-1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "true")
    n = wait_for("slurmctld to drain gpu-a-1", lambda: (x := client.node("gpu-a-1")) and "DRAIN" in x.states and x,
                 60, interval=0.5, explain=lambda: c.scontrol("-o", "show", "node", "gpu-a-1"))
    assert n.reason == "Epilog error" and n.reason_set_by == "slurm" and n.reason_changed_at
    v = slurm_view(n, USERS)
    assert owner(v) is Owner.SLURM and not drained_by_person(v)
    row = drained_by_slurm(v)
    assert row is not None and (row.kind, row.action) == ("epilog-error", CHECK)


def test_a_slurmd_that_stops_answering_is_slurms_down_not_a_persons(slurm_fresh: LocalSlurm) -> None:
    """slurmctld sets it DOWN, "Not responding" (src/slurmctld/ping_nodes.c, as the SlurmUser), SlurmdTimeout
    (the test cluster's 10 s: tests/fixtures/slurm_cluster.py) after its last answer. Both clients read the
    same record, so one wait for that timeout serves both (one test per client waited for it twice)."""
    c = slurm_fresh
    rest = SlurmREST(c.rest_url, SignedToken(c.jwt_key_path, user=RECONCILER_USER), timeout=10)
    clients: dict[str, SlurmClient] = {"rest": rest, "cli": SlurmCLI(env=c.env(), timeout=20)}
    c.stop_daemon("slurmd:gpu-a-1")
    try:
        wait_for("slurmctld to set gpu-a-1 DOWN", lambda: all(
            (x := cl.node("gpu-a-1")) and "DOWN" in x.states for cl in clients.values()),
            120, interval=1, explain=lambda: c.scontrol("-o", "show", "node", "gpu-a-1"))
        for name, cl in clients.items():
            n = cl.node("gpu-a-1")
            assert n.reason == "Not responding" and n.reason_set_by == "slurm", (name, n)
            row = drained_by_slurm(slurm_view(n, USERS))
            assert row is not None and row.action == GONE, (name, n)
        # a person then drains it with their words as root (an admin's sudo): slurmctld keeps "Not responding"
        # replaced by the drain's reason, recorded as root: free text from root is a person's
        c.set_node_state("gpu-a-1", "DRAIN", "ops: PSU swap")
        for name, cl in clients.items():
            held = slurm_view(cl.node("gpu-a-1"), USERS)
            assert held.set_by is not None and held.set_by.user == "root" and drained_by_person(held), (name, held)
    finally:
        rest.close()
        c.up()


def test_a_persons_drain_is_recorded_as_theirs_and_is_a_persons_whatever_it_says(
        slurm_fresh: LocalSlurm, client: SlurmClient) -> None:
    """A person with their own account (an Administrator in accounting, as an on-call engineer is), even when
    they write a reason Slurm or gpufleet would; and gpufleet's own drain, by its own user."""
    c = slurm_fresh
    c.run(["sacctmgr", "-i", "add", "user", f"name={TENANT_USER}", "account=root", "adminlevel=Administrator"],
          check=True)
    try:
        def drained_as_person() -> bool:
            try:
                c.set_node_state("gpu-a-0", "DRAIN", "Kill task failed (JobId=7 StepId=0)", user=TENANT_USER)
            except Exception:  # slurmdbd's update may not have reached slurmctld yet
                return False
            return True

        wait_for("slurmctld to take the person's drain", drained_as_person, 30, interval=1)
        c.set_node_state("gpu-a-1", "DRAIN", "gpufleet: looks like XID 79 to me", user=TENANT_USER)
        for name in ("gpu-a-0", "gpu-a-1"):
            n = client.node(name)
            assert n.reason_set_by == TENANT_USER, n
            v = slurm_view(n, USERS)
            assert owner(v) is Owner.PERSON and drained_by_person(v) and drained_by_slurm(v) is None
    finally:
        c.run(["sacctmgr", "-i", "delete", "user", f"name={TENANT_USER}"], check=True)
    rest = SlurmREST(c.rest_url, SignedToken(c.jwt_key_path, user=RECONCILER_USER), timeout=10)
    try:
        rest.drain("gpu-a-1", "gpufleet: XID 79 [h100-0-xid79-1]")  # gpufleet's own, over the person's words
        n = client.node("gpu-a-1")
        assert n.reason_set_by == RECONCILER_USER and owner(slurm_view(n, USERS)) is Owner.GPUFLEET
    finally:
        rest.close()


def test_the_operator_stand_ins_drain_is_set_by_the_operators_user(slurm_fresh: LocalSlurm, client: SlurmClient) -> None:
    c = slurm_fresh
    c.set_node_state("gpu-a-0", "DRAIN", PREFIX + "cordoned", user=OPERATOR_USER)  # what the stand-in sends
    n = client.node("gpu-a-0")
    assert n.reason_set_by == OPERATOR_USER == "slurm" and owner(slurm_view(n, USERS)) is Owner.OPERATOR


def test_slurmctlds_own_drain_is_marked_for_a_check_and_lifted_once_gpufleet_took_it_over(
        slurm_fresh: LocalSlurm, client: SlurmClient) -> None:
    """The real "Epilog error" drain, read by each client, gets gpufleet's condition naming Slurm's reason, who set
    it and when (core/slurm_drains.py); the diagnosis then drains over it with gpufleet's reason (as gpufleet's
    user: its own now) and, the check passed, resumes it: the node takes jobs again. A person's drain of the same
    words was never marked (test above: drained_by_slurm is None for it)."""
    c = slurm_fresh
    fail_epilog(c, "gpu-a-1")
    c.sbatch("-p", SLURM_PARTITION, "-w", "gpu-a-1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "true")
    n = wait_for("slurmctld to drain gpu-a-1", lambda: (x := client.node("gpu-a-1")) and "DRAIN" in x.states and x,
                 60, interval=0.5, explain=lambda: c.scontrol("-o", "show", "node", "gpu-a-1"))
    fail_epilog(c, "gpu-a-1", fail=False)
    kube = KUBE_NODE_OF["gpu-a-1"]
    view = node_view({"metadata": {"name": kube, "labels": {labels.NODE_POOL: FLEET.pools[0].name,
                                                            labels.ROLE: labels.ROLE_ACTIVE}}},
                     [labels.GPU_CONDITION])
    s = slurm_view(n, USERS)
    assert s.reason_at is not None
    (mark,) = slurm_drains.plan({kube: slurm_drains.Drained(view, (s,))}, [], FLEET, s.reason_at)
    sig = parse_condition(mark.reason, mark.message)
    assert mark.node == kube and (sig.kind, sig.code, sig.action) == (Kind.SLURM_DRAIN, 6, FaultAction.DIAGNOSE)
    assert f"Slurm drained gpu-a-1 itself: Epilog error [slurm at {s.reason_at.isoformat(timespec='seconds')}]" \
        in mark.message
    # the diagnosis's Draining step drains over it with gpufleet's reason; its Passed step resumes what it drained
    r = Remediation(f"{kube}-slurmdrain6-1", kube, FLEET.pools[0].name, 6, mark.message, Phase.DIAGNOSING,
                    s.reason_at, kind=Kind.SLURM_DRAIN)
    gpufleet = SlurmREST(c.rest_url, SignedToken(c.jwt_key_path, user=RECONCILER_USER), timeout=10)
    try:
        gpufleet.drain("gpu-a-1", slurm_reason(r))
        took = slurm_view(client.node("gpu-a-1"), USERS)
        assert drained_by_gpufleet(took) and drained_by_slurm(took) is None and f"[{r.name}]" in took.reason
        gpufleet.resume("gpu-a-1")
    finally:
        gpufleet.close()
    back = wait_for("gpu-a-1 to take jobs again", lambda: (x := client.node("gpu-a-1")) and
                    not ({"DRAIN", "DOWN"} & set(x.states)) and x, 30, interval=0.5,
                    explain=lambda: c.scontrol("-o", "show", "node", "gpu-a-1"))
    assert back.reason == ""
