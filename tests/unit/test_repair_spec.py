"""The repair loop's spec: reboot timeouts by instance type and the caps on concurrent repairs, each bad value
refused naming its field; the core takes the node's own timeout."""
from __future__ import annotations

import copy
from datetime import timedelta

import pytest
import yaml

from fleetspec import CONFIG_KEY, SpecError, labels, parse_fleet
from reconciler.core.model import Remediation
from reconciler.core.phases import Phase
from reconciler.core.repair import plan_repair
from reconciler.core.repair_phases import RepairPhase
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
