"""The local GPU hardware stand-in's verdicts (localenv/gpu_hardware_standin.py): the real check
(reconciler/healthcheck/run.py) on real drivers' published outputs, changed where a state says a GPU is broken,
read back as the reconciler reads a real check's termination message (fleetspec/health_report.loads). Its API
side is proven against a real API server in tests/integration/test_repair_local.py."""
from __future__ import annotations

import pytest

from fleetspec import health_report, labels
from fleetspec.health_report import PASS, SKIP
from localenv.gpu_hardware_standin import (
    BROKEN, HEALTHY, LOW_BANDWIDTH, NVLINK_DOWN, REBOOT_FIXES, RESET_FIXES, report, state_of,
)
from tests.unit.fakes import fleet

LOCAL_ARGV = fleet(repair={"health_check": {"allow_skip": ["dcgm"]}}).healing.repair.health_check.argv()


@pytest.mark.parametrize("state, passed, action, failed", [
    (HEALTHY, True, "none", None), (RESET_FIXES, False, "reset-gpu", "nvidia-smi"),
    (REBOOT_FIXES, False, "reboot", "nvidia-smi"), (BROKEN, False, "replace", "nvidia-smi"),
    (NVLINK_DOWN, False, "reboot", "nvlink"), (LOW_BANDWIDTH, False, "reboot", "all-reduce")])
def test_the_check_says_what_the_simulated_hardware_needs(state, passed, action, failed):
    reading = health_report.loads(report(state, 8, LOCAL_ARGV).dumps())
    assert (reading.passed, reading.action) == (passed, action), reading.summary
    if action not in ("reboot", "replace") or failed != "nvidia-smi":  # GPUs gone or beyond a reset: nothing else runs
        assert "dcgm: skip" in reading.summary, "a verdict says what it did not prove"
    if failed:
        assert f"{failed}: fail" in reading.summary


def test_a_healthy_stand_in_node_passes_every_check_but_the_one_the_local_spec_skips():
    r = report(HEALTHY, 8, LOCAL_ARGV)
    assert [(c.name, c.status) for c in r.checks] == [
        ("nvidia-smi", PASS), ("nvlink", PASS), ("dcgm", SKIP), ("all-reduce", PASS), ("pcie", PASS)]
    assert "439.369 GB/s (floor 350)" in r.checks[3].message and "144 NVLinks active on 8 GPUs" in r.checks[1].message
    four = report(HEALTHY, 4, LOCAL_ARGV)  # a pool of 4 GPUs: its floor is for 8, so judged on results alone
    assert four.passed and "its floor is for 8 GPUs" in four.checks[3].message


def test_without_the_local_allowance_the_stand_in_node_is_unproven_not_passed():
    r = report(HEALTHY, 8, fleet().healing.repair.health_check.argv())
    assert not r.passed and r.unproven == ("dcgm",) and r.action == "none"


@pytest.mark.parametrize("annotations, state", [({}, HEALTHY), ({labels.SIMULATED_GPU_STATE: REBOOT_FIXES}, REBOOT_FIXES),
                                                ({labels.SIMULATED_GPU_STATE: NVLINK_DOWN}, NVLINK_DOWN),
                                                ({labels.SIMULATED_GPU_STATE: "on-fire"}, BROKEN)])
def test_a_node_without_a_state_is_healthy_and_one_it_does_not_know_is_broken(annotations, state):
    assert state_of({"metadata": {"annotations": annotations}}) == state
