"""The local GPU hardware stand-in's verdicts (localenv/gpu_hardware_standin.py), read back as the reconciler
reads a real check's termination message (fleetspec/health_report.loads). Its API side is proven against a
real API server in tests/integration/test_repair_local.py."""
from __future__ import annotations

import pytest

from fleetspec import health_report, labels
from localenv.gpu_hardware_standin import BROKEN, HEALTHY, REBOOT_FIXES, RESET_FIXES, report, state_of


@pytest.mark.parametrize("state, passed, action", [(HEALTHY, True, "none"), (RESET_FIXES, False, "reset-gpu"),
                                                   (REBOOT_FIXES, False, "reboot"), (BROKEN, False, "replace")])
def test_the_check_says_what_the_simulated_hardware_needs(state, passed, action):
    got_passed, got_action, summary = health_report.loads(report(state).dumps())
    assert (got_passed, got_action) == (passed, action)
    assert "dcgm: skip" in summary and "all-reduce: skip" in summary, "a pass says what it did not prove"


@pytest.mark.parametrize("annotations, state", [({}, HEALTHY), ({labels.SIMULATED_GPU_STATE: REBOOT_FIXES}, REBOOT_FIXES),
                                                ({labels.SIMULATED_GPU_STATE: "on-fire"}, BROKEN)])
def test_a_node_without_a_state_is_healthy_and_one_it_does_not_know_is_broken(annotations, state):
    assert state_of({"metadata": {"annotations": annotations}}) == state
