"""The node health check's parsers, on outputs real drivers and tools printed (tests/fixtures/gpu/SOURCES.md
says where each comes from), and the verdict it writes for the reconciler. Not run on a real GPU yet."""
from __future__ import annotations

import json
from pathlib import Path

from gpufleet.fleetspec import health_report
from gpufleet.fleetspec.health_report import FAIL, PASS, SKIP
from localenv.gpu_hardware_standin import HEALTHY, NVLINK_DOWN, dcgm_diag, nvlink_status
from gpufleet.reconciler.healthcheck import dcgm, nccl, nvidia_smi, nvlink
from gpufleet.reconciler.healthcheck.floors import floor_for
from gpufleet.reconciler.core.validation import read_report
from tests.unit.fakes import fleet as fleet_spec
from gpufleet.reconciler.healthcheck.run import Ran, run_checks

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
H100 = (GPU / "nvidia-smi-q.h100x8.535.161.08.txt").read_text()
A10_PENDING = (GPU / "nvidia-smi-q.a10.remap-pending.535.129.03.txt").read_text()
DCGM_3X = (GPU / "dcgmi-diag-3x.nvidia-sample.json").read_text()
NCCL_OK = (GPU / "nccl-all-reduce.ok.tail.txt").read_text()
NCCL_H100 = (GPU / "nccl-all-reduce.h100x8.439gbs.txt").read_text()
NCCL_H100_TWO_NODES = (GPU / "nccl-all-reduce.h100x16.two-nodes.143gbs.txt").read_text()
NVLINK_A100 = (GPU / "nvidia-smi-nvlink-s.a100x2.excerpt.txt").read_text()
NVLINK_V100_DEGRADED = (GPU / "nvidia-smi-nvlink-s.v100.two-inactive.txt").read_text()
DCGM_PASS = dcgm_diag()  # DCGM's own sample with its failing results marked passed (the stand-in's)


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
    """Each tool's output by its command: "nvidia-smi -q", "nvidia-smi nvlink", "dcgmi", "all_reduce_perf"."""
    def run(argv, timeout):
        return outputs[" ".join(argv[:2])] if argv[0] == "nvidia-smi" else outputs[argv[0]]
    names = {k.split()[0] for k in outputs}
    return run, (lambda name: name if name in names else None)


def h100_links(down=()):
    """An HGX H100's `nvidia-smi nvlink --status`, in the layout the published outputs show (the stand-in's)."""
    return nvlink_status(NVLINK_DOWN if down else HEALTHY, 8)


HEALTHY_H100 = {"nvidia-smi -q": Ran(0, H100), "nvidia-smi nvlink": Ran(0, nvlink_status(HEALTHY, 8)),
                "dcgmi": Ran(0, DCGM_PASS), "all_reduce_perf": Ran(0, NCCL_H100)}


def test_every_check_passes_on_a_healthy_h100_node():
    run, which = tools(HEALTHY_H100)
    report = run_checks(2, True, 8, run, which)
    assert report.passed, report.summary()
    assert [c.name for c in report.checks] == list(health_report.CHECKS)
    reading = health_report.loads(report.dumps())
    assert reading.passed and reading.action == "none" and "bus bandwidth 439.369 GB/s (floor 350)" in reading.summary


def test_a_missing_tool_is_unproven_unless_the_spec_allows_the_skip():
    """The image without dcgmi and nccl-tests (the default image today): production does not pass the node; the
    local spec lets it skip them, and the verdict says what was not proven."""
    run, which = tools({"nvidia-smi -q": Ran(0, H100), "nvidia-smi nvlink": Ran(0, nvlink_status(HEALTHY, 8))})
    report = run_checks(2, True, 8, run, which)
    assert not report.passed and report.unproven == ("dcgm", "all-reduce") and report.action == "none"
    reading = health_report.loads(report.dumps())
    assert not reading.passed and reading.unproven == ("dcgm", "all-reduce") and not reading.failed
    assert "healing.repair.health_check.image" in reading.summary
    allowed = run_checks(2, True, 8, run, which, allow_skip={"dcgm", "all-reduce"})
    assert allowed.passed and [c.status for c in allowed.checks] == [PASS, PASS, SKIP, SKIP, PASS]
    assert "pcie: pass (idle, so not judged" not in allowed.summary()  # nothing lower to note on this node


def test_an_all_reduce_under_the_models_floor_fails_the_node():
    run, which = tools({**HEALTHY_H100, "all_reduce_perf": Ran(0, NCCL_H100_TWO_NODES)})
    report = run_checks(2, True, 8, run, which)
    assert not report.passed and report.action == "reboot"
    (bad,) = [c for c in report.checks if c.status == FAIL]
    assert bad.name == "all-reduce" and "142.735 GB/s on 8 GPUs, under the 350 GB/s floor of NVIDIA H100" in bad.message


def test_an_nvlink_down_fails_the_node():
    run, which = tools({**HEALTHY_H100, "nvidia-smi nvlink": Ran(0, h100_links(down=True))})
    report = run_checks(2, True, 8, run, which)
    (bad,) = [c for c in report.checks if c.status == FAIL]
    assert (bad.name, bad.action) == ("nvlink", "reboot") and "GPU 3: 17 of 18 NVLinks active (inactive: [5])" in bad.message


def test_a_pcie_link_below_its_width_fails_only_when_read_under_load():
    narrow = H100.replace("                Current                   : 16x", "                Current                   : 8x", 1)
    calls = []

    def run(argv, timeout):
        calls.append(argv[:2])
        if argv[:2] == ["nvidia-smi", "-q"]:  # the first read is idle; the one after the all-reduce is not
            return Ran(0, H100 if calls.count(["nvidia-smi", "-q"]) == 1 else narrow)
        return HEALTHY_H100[" ".join(argv[:2]) if argv[0] == "nvidia-smi" else argv[0]]
    report = run_checks(2, True, 8, run, lambda n: n)
    assert [c.name for c in report.checks if c.status == FAIL] == ["pcie"]
    assert "00000000:19:00.0: PCIe link at x8 of x16" in report.checks[-1].message
    idle = run_checks(2, False, 8, tools({**HEALTHY_H100, "nvidia-smi -q": Ran(0, narrow)})[0], lambda n: n)
    assert idle.checks[-1].status == PASS and "idle, so not judged" in idle.checks[-1].message


def test_dcgm_failures_and_a_pending_remap_say_what_the_node_needs():
    run, which = tools({"nvidia-smi -q": Ran(0, A10_PENDING), "nvidia-smi nvlink": Ran(0, ""), "dcgmi": Ran(0, DCGM_3X),
                        "all_reduce_perf": Ran(0, NCCL_OK)})
    report = run_checks(2, True, 1, run, which)
    assert not report.passed and report.action == "reboot"  # the worst: dcgm's stress failure
    assert [c.status for c in report.checks] == [FAIL, PASS, FAIL, PASS, PASS] and report.gpus == ("00000000:07:00.0",)
    assert "no floor for this model" in report.checks[3].message  # an A10: no published floor here
    assert len(report.dumps().encode()) <= health_report.LIMIT


def test_no_driver_fails_at_once():
    run, which = tools({"nvidia-smi -q": Ran(9, "No devices were found")})
    report = run_checks(2, True, 8, run, which)
    assert not report.passed and report.action == "reboot" and len(report.checks) == 1


# --- NVLink, and the floors ---------------------------------------------------------------------------------

def test_a_healthy_a100_boards_links_read_as_its_model_needs():
    gpus = nvlink.parse(NVLINK_A100)
    assert [(g.index, g.name, len(g.active), g.inactive) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 12, ()), (1, "NVIDIA A100-SXM4-80GB", 12, ())]
    assert nvlink.findings(gpus, floor_for("NVIDIA A100-SXM4-80GB")) == []
    assert nvlink.findings(gpus, floor_for("NVIDIA H100 80GB HBM3")) == [  # 12 links where an H100 has 18
        "GPU 0: 12 of 18 NVLinks active, links [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] below 26.562 GB/s",
        "GPU 1: 12 of 18 NVLinks active, links [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] below 26.562 GB/s"]


def test_inactive_links_of_a_model_without_figures_are_still_a_degraded_gpu():
    (g,) = nvlink.parse(NVLINK_V100_DEGRADED)
    assert g.index == 3 and g.inactive == (3, 5) and len(g.active) == 4
    assert nvlink.findings((g,), floor_for(g.name)) == ["GPU 3: NVLinks [3, 5] inactive, 4 active"]


def test_a_gpu_without_nvlink_prints_nothing_and_says_nothing():
    assert nvlink.parse("") == () and nvlink.findings((), None) == []
    assert nvlink.findings((), floor_for("NVIDIA H100 80GB HBM3")) == [
        "no NVLink reported where NVIDIA H100 80GB HBM3 has 18 per GPU"]


def test_the_h100_floor_sits_under_the_published_healthy_run_and_over_the_degraded_one():
    f = floor_for("NVIDIA H100 80GB HBM3")
    healthy, slow = nccl.parse(NCCL_H100), nccl.parse(NCCL_H100_TWO_NODES)
    assert healthy.healthy and slow.healthy  # both ran clean: only the floor tells them apart
    assert slow.bus_bandwidth < f.bus_bandwidth_gbps < healthy.bus_bandwidth == 439.369
    assert slow.bus_bandwidth == 142.735  # read through `srun -l`'s "0: " labels


# --- the verdict, as the reconciler reads it (reconciler/core/validation.read_report) ------------------------

def test_the_reconciler_reads_passed_failed_unproven_and_no_verdict_apart():
    run, which = tools(HEALTHY_H100)
    passed = run_checks(2, True, 8, run, which)
    assert read_report(passed.dumps(), True).state == "passed"
    assert read_report(passed.dumps(), False).state == "failed"  # the report passed, the Job did not: not proven
    run, which = tools({"nvidia-smi -q": Ran(0, H100), "nvidia-smi nvlink": Ran(0, nvlink_status(HEALTHY, 8))})
    unproven = read_report(run_checks(2, True, 8, run, which).dumps(), False)
    assert unproven.state == "unproven" and "dcgm: unproven" in unproven.message
    run, which = tools({**HEALTHY_H100, "nvidia-smi nvlink": Ran(0, h100_links(down=True)), "dcgmi": Ran(127, "")})
    failed = read_report(run_checks(2, True, 8, run, which).dumps(), False)  # a failure wins over an unproven check
    assert (failed.state, failed.action) == ("failed", "reboot")
    garbled = read_report("Traceback (most recent call last): ...", False)  # the pod died before its report
    assert garbled.state == "inconclusive"


def test_nvmls_all_links_inactive_answer_fails_a_model_with_nvlink_and_not_one_without():
    """The line NVML prints when no link is up (NVIDIA/open-gpu-kernel-modules issue #1150, as posted)."""
    out = "NVML:Unable to retrieve Nvlink information as all links are inActive\n"
    assert nvlink.parse(out) == ()
    assert nvlink.findings((), floor_for("NVIDIA H100 80GB HBM3")) != [] and nvlink.findings((), None) == []
    run, which = tools({**HEALTHY_H100, "nvidia-smi nvlink": Ran(0, out)})
    assert [c.name for c in run_checks(2, True, 8, run, which).checks if c.status == FAIL] == ["nvlink"]
    run, which = tools({"nvidia-smi -q": Ran(0, A10_PENDING), "nvidia-smi nvlink": Ran(0, "something else\n")})
    links = run_checks(None, False, 1, run, which).checks[1]
    assert links.name == "nvlink" and links.status == PASS and "did not read" in links.message


def test_the_command_on_a_machine_without_a_driver_writes_a_failed_report(tmp_path, monkeypatch):
    """`gpufleet health-check` here (no nvidia-smi on this machine's PATH): the report in the termination log
    says the driver is not there, and the command exits non-zero; the spec's options parse."""
    from typer.testing import CliRunner

    from gpufleet.cli import app
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it: no nvidia-smi, whatever the machine has
    log = tmp_path / "termination-log"
    argv = fleet_spec().healing.repair.health_check.argv()[2:]  # the Job's options, its log path replaced
    argv[argv.index("--termination-log") + 1] = str(log)
    r = CliRunner().invoke(app, ["health-check", *argv, "--allow-skip", "dcgm", "--gpus", "8"])
    assert r.exit_code != 0 and "failed (needs reboot)" in r.output
    reading = health_report.loads(log.read_text())
    assert not reading.passed and "nvidia-smi is not in the container" in reading.summary
