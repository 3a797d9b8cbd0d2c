"""The node health check's parsers, on outputs real drivers and tools printed (tests/fixtures/gpu/SOURCES.md
says where each comes from), and the verdict it writes for the reconciler. Not run on a real GPU yet."""
from __future__ import annotations

import json
from pathlib import Path

from fleetspec import health_report
from fleetspec.health_report import FAIL, PASS, SKIP
from reconciler.healthcheck import dcgm, nccl, nvidia_smi
from reconciler.healthcheck.run import Ran, run_checks

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
H100 = (GPU / "nvidia-smi-q.h100x8.535.161.08.txt").read_text()
A10_PENDING = (GPU / "nvidia-smi-q.a10.remap-pending.535.129.03.txt").read_text()
DCGM_3X = (GPU / "dcgmi-diag-3x.nvidia-sample.json").read_text()
NCCL_OK = (GPU / "nccl-all-reduce.ok.tail.txt").read_text()


def test_a_healthy_h100_node_reads_healthy_with_all_eight_gpus():
    r = nvidia_smi.check(H100, expected_gpus=8)
    assert r.driver == "535.161.08" and len(r.gpus) == 8 and r.gpus[0] == "00000000:19:00.0"
    assert r.healthy
    _, gpus = nvidia_smi.parse(H100)
    assert gpus[0].get("Remapped Rows/Pending") == "No"
    assert gpus[0].get("ECC Errors/Volatile/DRAM Uncorrectable") == "0"
    assert gpus[0].get("GPU Reset Status/Drain and Reset Recommended") == "No"


def test_a_pending_row_remap_needs_a_gpu_reset():
    r = nvidia_smi.check(A10_PENDING, expected_gpus=1)
    assert [(f.gpu, f.action) for f in r.findings] == [("00000000:07:00.0", "reset-gpu")]
    assert "4 uncorrectable rows" in r.findings[0].what


def test_a_gpu_gone_from_the_node_needs_a_reboot():
    r = nvidia_smi.check(H100, expected_gpus=9)
    assert [(f.what, f.action) for f in r.findings] == [("8 of 9 GPUs seen", "reboot")]


def test_a_failed_remap_and_volatile_uncorrectable_errors_are_read_from_the_same_layout():
    """The real layout, with the values a broken GPU has (the fields and their indentation as printed)."""
    broken = A10_PENDING.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
    broken = broken.replace("            DRAM Uncorrectable            : 0", "            DRAM Uncorrectable            : 2", 1)
    actions = sorted(f.action for f in nvidia_smi.check(broken).findings)
    assert actions == ["replace", "reset-gpu", "reset-gpu"]


def test_dcgm_3x_json_names_the_failed_test_and_its_gpus():
    r = dcgm.parse("Successfully ran diagnostic for group.\n" + DCGM_3X)
    assert r.ran and r.tests > 10
    (f,) = r.failures
    assert (f.category, f.test, f.gpus) == ("Stress", "sm_stress", ("0", "2", "3"))
    assert "did not exceed desired stress level" in f.warnings[0] and f.action == "reboot"


def test_dcgm_that_could_not_run_proves_nothing():
    r = dcgm.parse(json.dumps({"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"}}))
    assert not r.ran and not r.healthy and "host engine" in r.error


def test_nccl_trailer_ok_and_failed():
    ok = nccl.parse(NCCL_OK)
    assert ok.healthy and ok.bus_bandwidth == 95.3009
    one = nccl.parse((GPU / "nccl-alltoall.rtx5090.one-gpu.txt").read_text())
    assert one.found and one.errors == 0 and one.bus_bandwidth == 0.0
    bad = nccl.parse("# Out of bounds values : 248 FAILED")  # NVIDIA/nccl-tests issue #7's trailer
    assert bad.found and bad.errors == 248 and not bad.healthy


def tools(outputs: dict[str, Ran]):
    def run(argv, timeout):
        return outputs[argv[0]]
    return run, (lambda name: name if name in outputs else None)


def test_the_verdict_says_what_ran_what_was_skipped_and_what_the_node_needs():
    run, which = tools({"nvidia-smi": Ran(0, H100)})
    report = run_checks(2, True, 8, run, which)
    assert report.passed and [c.status for c in report.checks] == [PASS, SKIP, SKIP]
    passed, action, summary = health_report.loads(report.dumps())
    assert passed and action == "none" and "dcgm: skip (dcgmi is not on the node)" in summary

    run, which = tools({"nvidia-smi": Ran(0, A10_PENDING), "dcgmi": Ran(0, DCGM_3X), "all_reduce_perf": Ran(0, NCCL_OK)})
    report = run_checks(2, True, 1, run, which)
    assert not report.passed and report.action == "reboot"  # the worst: dcgm's stress failure
    assert [c.status for c in report.checks] == [FAIL, FAIL, PASS] and report.gpus == ("00000000:07:00.0",)
    assert len(report.dumps().encode()) <= health_report.LIMIT


def test_no_driver_fails_at_once():
    run, which = tools({"nvidia-smi": Ran(9, "No devices were found")})
    report = run_checks(2, True, 8, run, which)
    assert not report.passed and report.action == "reboot" and len(report.checks) == 1
