"""The local GPU hardware stand-in's verdicts (localenv/gpu_hardware_standin.py): the real check
(reconciler/healthcheck/run.py) on real drivers' published outputs, changed where a state says a GPU is broken,
read back as the reconciler reads a real check's termination message (fleetspec/health_report.loads). Its API
side is proven against a real API server in tests/integration/test_repair_local.py."""
from __future__ import annotations

import pytest

from gpufleet.fleetspec import health_report, labels
from gpufleet.fleetspec.health_report import PASS, SKIP
from localenv.gpu_hardware_standin import (
    BROKEN, HEALTHY, LOW_BANDWIDTH, NVLINK_DOWN, REBOOT_FIXES, RESET_FIXES, report, state_of,
)
from tests.unit.fakes import fleet

ARGV = fleet().healing.repair.health_check.argv()  # the Job's command, as the spec makes it (no skip allowed)


@pytest.mark.parametrize("state, passed, action, failed", [
    (HEALTHY, True, "none", None), (RESET_FIXES, False, "reset-gpu", "nvidia-smi"),
    (REBOOT_FIXES, False, "reboot", "nvidia-smi"), (BROKEN, False, "replace", "nvidia-smi"),
    (NVLINK_DOWN, False, "reboot", "nvlink"), (LOW_BANDWIDTH, False, "reboot", "all-reduce")])
def test_the_check_says_what_the_simulated_hardware_needs(state, passed, action, failed):
    reading = health_report.loads(report(state, 8, ARGV).dumps())
    assert (reading.passed, reading.action) == (passed, action), reading.summary
    if action not in ("reboot", "replace") or failed != "nvidia-smi":  # GPUs gone or beyond a reset: nothing else runs
        assert "dcgm: pass (level 2" in reading.summary
    if failed:
        assert f"{failed}: fail" in reading.summary


def test_a_healthy_stand_in_node_passes_every_check():
    r = report(HEALTHY, 8, ARGV)
    assert [(c.name, c.status) for c in r.checks] == [
        ("nvidia-smi", PASS), ("nvlink", PASS), ("dcgm", PASS), ("all-reduce", PASS), ("pcie", PASS)]
    assert "439.369 GB/s (floor 350)" in r.checks[3].message and "144 NVLinks active on 8 GPUs" in r.checks[1].message
    four = report(HEALTHY, 4, ARGV)  # a pool of 4 GPUs: its floor is for 8, so judged on results alone
    assert four.passed and "its floor is for 8 GPUs" in four.checks[3].message


def test_an_image_without_dcgm_leaves_the_node_unproven_unless_the_spec_allows_the_skip():
    r = report(HEALTHY, 8, ARGV, missing={"dcgmi"})
    assert not r.passed and r.unproven == ("dcgm",) and r.action == "none"
    skipping = fleet(repair={"health_check": {"allow_skip": ["dcgm"]}}).healing.repair.health_check.argv()
    allowed = report(HEALTHY, 8, skipping, missing={"dcgmi"})
    assert allowed.passed and ("dcgm", SKIP) in [(c.name, c.status) for c in allowed.checks]


@pytest.mark.parametrize("annotations, state", [({}, HEALTHY), ({labels.SIMULATED_GPU_STATE: REBOOT_FIXES}, REBOOT_FIXES),
                                                ({labels.SIMULATED_GPU_STATE: NVLINK_DOWN}, NVLINK_DOWN),
                                                ({labels.SIMULATED_GPU_STATE: "on-fire"}, BROKEN)])
def test_a_node_without_a_state_is_healthy_and_one_it_does_not_know_is_broken(annotations, state):
    assert state_of({"metadata": {"annotations": annotations}}) == state
