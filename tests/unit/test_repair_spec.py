"""The repair loop's spec: reboot timeouts by instance type and the caps on concurrent repairs, each bad value
refused naming its field; the core takes the node's own timeout."""
from __future__ import annotations

import copy
from datetime import timedelta

import pytest
import yaml

from gpufleet.fleetspec import CONFIG_KEY, SpecError, labels, parse_fleet
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair import plan_repair
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.unit.fakes import T0, FakeNodes, World, fleet, pool_node
from tests.unit.test_repair import facts_for, role
from tests.unit.test_spec import ROOT


def prod() -> dict:
    doc = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    return copy.deepcopy(doc["config"][CONFIG_KEY])


def with_pool_repair(**repair) -> dict:
    d = prod()
    d["pools"][0].setdefault("repair", {}).update(repair)
    return d


@pytest.mark.parametrize("value, path, reason", [
    ({"p5.48xlarge": 30}, "pools[0].repair.reboot_timeouts.p5.48xlarge", "greater than or equal to 60"),
    ({"p5.48xlarge": 10_000}, "pools[0].repair.reboot_timeouts.p5.48xlarge", "less than or equal to 7200"),
    ({"p5.48xlarge": "slow"}, "pools[0].repair.reboot_timeouts.p5.48xlarge", "integer"),
    ({" ": 2400}, "pools[0].repair.reboot_timeouts", "blank"),
])
def test_a_bad_reboot_timeout_names_its_field(value, path, reason):
    with pytest.raises(SpecError) as e:
        parse_fleet(with_pool_repair(reboot_timeouts=value))
    paths = [p for p, _ in e.value.issues]
    assert any(p.endswith(path) for p in paths), (paths, str(e.value))
    assert reason in str(e.value), str(e.value)


def test_reboot_timeouts_default_to_the_pools_for_every_type():
    pool = parse_fleet(prod()).pools[0]
    assert pool.repair.reboot_timeouts == {}
    assert pool.repair.timeout("reboot", "p5.48xlarge") == pool.repair.timeout("reboot") == 1200
    mine = parse_fleet(with_pool_repair(reboot_timeouts={"p5.48xlarge": 2400})).pools[0]
    assert mine.repair.timeout("reboot", "p5.48xlarge") == 2400
    assert mine.repair.timeout("reboot", "p4d.24xlarge") == mine.repair.timeout("reboot", None) == 1200
    assert mine.repair.timeout("reset-gpu", "p5.48xlarge") == 300  # a reset's timeout is its own


def slow_booting(timeouts: dict[str, int]) -> World:
    spec = fleet(nodes=4, spares=2, grace_period_seconds=0)
    pool = spec.pools[0]
    spec = spec.model_copy(update={"pools": [pool.model_copy(update={"repair": pool.repair.model_copy(
        update={"reboot_timeouts": timeouts})})]})
    w = World(spec, operator=True)
    w.kube.nodes["h100-0"]["metadata"]["labels"][labels.INSTANCE_TYPE] = "p5.48xlarge"
    w.hardware.state["h100-0"] = FakeNodes.REBOOT_FIXES
    w.hardware.reboot_seconds = 1500  # a reboot that takes 25 minutes: longer than the default 1200 s
    return w


def test_a_slow_booting_type_gets_its_own_reboot_timeout_and_comes_back():
    w = slow_booting({"p5.48xlarge": 2400})
    w.fault("h100-0")
    w.run(seconds=1700, step=5)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETURNED, r.repair
    assert role(w, "h100-0") == labels.ROLE_SPARE and "retired" not in w.notifier.sent


def test_without_its_type_listed_the_same_slow_boot_is_timed_out_by_the_pools_timeout():
    w = slow_booting({"p4d.24xlarge": 2400})
    w.fault("h100-0")
    w.run(seconds=1700, step=5)
    assert "gave no sign of success within 1200s" in w.remediation("h100-0").repair.history[1].message


def test_the_core_sets_the_deadline_from_the_nodes_instance_type():
    spec = parse_fleet(with_pool_repair(reboot_timeouts={"p5.48xlarge": 2400}))
    pool = spec.pools[0]
    n = pool_node(pool, f"{pool.name}-0", labels.ROLE_QUARANTINED)
    n["metadata"]["labels"][labels.INSTANCE_TYPE] = "p5.48xlarge"
    r = Remediation(name="r", node=n["metadata"]["name"], pool=pool.name, xid=79, message="m", phase=Phase.SUCCEEDED,
                    created=T0)
    rep = plan_repair(r, facts_for(r, n), spec, T0).remediation.repair
    assert rep.step == "reboot" and rep.deadline == T0 + timedelta(seconds=2400)


# --- caps on concurrent repairs --------------------------------------------------------------------------

@pytest.mark.parametrize("where, value, path, reason", [
    ("pool", 0, "pools[0].repair.max_concurrent", "greater than or equal to 1"),
    ("pool", "two", "pools[0].repair.max_concurrent", "integer"),
    ("fleet", 0, "healing.repair.max_concurrent", "greater than or equal to 1"),
])
def test_a_bad_cap_names_its_field(where, value, path, reason):
    d = with_pool_repair(max_concurrent=value) if where == "pool" else prod()
    if where == "fleet":
        d.setdefault("healing", {}).setdefault("repair", {})["max_concurrent"] = value
    with pytest.raises(SpecError) as e:
        parse_fleet(d)
    paths = [p for p, _ in e.value.issues]
    assert any(p.endswith(path) for p in paths), (paths, str(e.value))
    assert reason in str(e.value), str(e.value)


def test_the_caps_have_defaults():
    spec = parse_fleet(prod())
    assert spec.healing.repair.max_concurrent == 16 and {p.repair.max_concurrent for p in spec.pools} == {4}


def capped(pool_cap: int = 4, fleet_cap: int = 16, pools=("h100",)) -> World:
    spec = fleet(nodes=4, spares=2, pools=pools, grace_period_seconds=0, repair={"max_concurrent": fleet_cap})
    spec = spec.model_copy(update={"pools": [p.model_copy(update={"repair": p.repair.model_copy(
        update={"max_concurrent": pool_cap})}) for p in spec.pools]})
    return World(spec, operator=True)


def test_a_repair_over_the_pools_cap_waits_its_turn_and_the_record_says_so():
    w = capped(pool_cap=1)
    for n in ("h100-0", "h100-1"):
        w.hardware.state[n] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0")
    w.run(seconds=5)
    w.fault("h100-1")
    w.run(seconds=10)
    first, second = w.remediation("h100-0"), w.remediation("h100-1")
    assert first.repair.phase is RepairPhase.REPAIRING
    assert second.phase is Phase.SUCCEEDED  # the job healed on a spare: only the repair waits
    assert second.repair.phase is RepairPhase.WAITING, second.repair
    assert "1 repair(s) of pool h100 under way" in second.repair.reason and "max_concurrent 1" in second.repair.reason
    assert [x[0] for x in w.hardware.reboots] == ["h100-0"]
    w.run(seconds=600, step=5)
    first, second = w.remediation("h100-0"), w.remediation("h100-1")
    assert first.repair.phase is RepairPhase.RETURNED and second.repair.phase is RepairPhase.RETURNED, second.repair
    assert [p for p, _ in second.repair.phase_times] == ["Waiting", "Repairing", "Validating", "Returned"]
    assert [x[0] for x in w.hardware.reboots] == ["h100-0", "h100-1"]
    began = second.repair.entered(RepairPhase.REPAIRING)
    assert began >= first.repair.ended  # never two at once


def test_the_fleets_cap_holds_a_repair_of_another_pool():
    w = capped(fleet_cap=1, pools=("h100", "l40s"))
    w.hardware.state["h100-0"] = w.hardware.state["l40s-0"] = FakeNodes.REBOOT_FIXES
    w.fault("h100-0")
    w.run(seconds=5)
    w.fault("l40s-0")
    w.run(seconds=10)
    held = w.remediation("l40s-0").repair
    assert held.phase is RepairPhase.WAITING and "healing.repair.max_concurrent 1" in held.reason, held
    w.run(seconds=600, step=5)
    assert w.remediation("l40s-0").repair.phase is RepairPhase.RETURNED


def test_two_workers_never_both_take_the_pools_last_slot():
    """Two workers plan two repairs at once: the second plans while the first's write is on its way to the API
    server. It counts the first as planned (the claims), so only one reboot is asked under a cap of one."""
    import threading

    w = capped(pool_cap=1)
    for n in ("h100-0", "h100-1"):
        w.hardware.state[n] = FakeNodes.REBOOT_FIXES
    repairs = w.manager.repairs
    repairs.reconcile = lambda node: None  # the heals first; no repair begins yet
    w.fault("h100-0")
    w.fault("h100-1")
    w.run(seconds=15)
    del repairs.reconcile
    assert [(w.remediation(n).phase, w.remediation(n).repair) for n in ("h100-0", "h100-1")] == \
        [(Phase.SUCCEEDED, None)] * 2

    writing, go_on = threading.Event(), threading.Event()
    write = repairs.executor.write_status

    def slow(r):  # the first worker's write, held until the second worker has planned
        if r.node == "h100-0" and not go_on.is_set():
            writing.set()
            go_on.wait(10)
        return write(r)

    repairs.executor.write_status = slow
    first = threading.Thread(target=repairs.reconcile, args=("h100-0",))
    first.start()
    assert writing.wait(10)
    second = threading.Thread(target=repairs.reconcile, args=("h100-1",))
    second.start()
    second.join(2)  # it plans and writes without waiting for the first (the claims lock is not held by a write)
    go_on.set()
    first.join(10)
    second.join(10)
    phases = sorted(w.remediation(n).repair.phase.value for n in ("h100-0", "h100-1"))
    assert phases == ["Repairing", "Waiting"], phases
    assert "max_concurrent 1" in w.remediation("h100-1").repair.reason
    w.run(seconds=1)
    assert [x[0] for x in w.hardware.reboots] == ["h100-0"]


def test_the_pools_waiting_repairs_go_oldest_first():
    """Two repairs wait for the pool's one slot: when it frees, the one that waited longer goes first, whichever
    is looked at first."""
    from gpufleet.reconciler.core.repair import RepairSlot, over_cap
    from gpufleet.reconciler.core.repair_phases import begin

    spec = fleet(nodes=4, spares=2)
    spec = spec.model_copy(update={"pools": [spec.pools[0].model_copy(update={"repair": spec.pools[0].repair.model_copy(
        update={"max_concurrent": 1})})]})
    older = Remediation(name="a", node="h100-0", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED, created=T0,
                        repair=begin(RepairPhase.WAITING, T0))
    newer = Remediation(name="b", node="h100-1", pool="h100", xid=79, message="m", phase=Phase.SUCCEEDED, created=T0,
                        repair=begin(RepairPhase.WAITING, T0 + timedelta(seconds=10)))
    slots = (RepairSlot("h100", "b", RepairPhase.WAITING, T0 + timedelta(seconds=10)),
             RepairSlot("h100", "a", RepairPhase.WAITING, T0))
    now = T0 + timedelta(seconds=60)
    assert over_cap(older, slots, spec, now) == ""
    assert "1 waiting before it" in over_cap(newer, slots, spec, now)
    busy = slots + (RepairSlot("h100", "c", RepairPhase.VALIDATING, T0),)
    assert "1 repair(s) of pool h100 under way" in over_cap(older, busy, spec, now)
    stopped = slots[1:] + (RepairSlot("h100", "c", RepairPhase.STOPPED, T0),)  # a person's hold takes no slot
    assert over_cap(older, stopped, spec, now) == ""
