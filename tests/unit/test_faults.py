"""The fault catalogue (NVIDIA's, as data), NVIDIA's rules, the spec's overrides, and how the
reconciler reads a fault from a condition: gpufleet's own and other detectors' (in the formats their
own source shows)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import parse_fleet
from gpufleet.fleetspec.faults import XIDS, FaultAction, Kind, default_action
from gpufleet.fleetspec.faults.catalogue import BUCKET_ACTIONS, CHOICES
from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, parse_condition
from gpufleet.fleetspec.faults.policy import FaultPolicy, Repeats
from gpufleet.fleetspec.models import ConditionSource
from gpufleet.fleetspec.faults.classify import BURST_SECONDS, Classifier, recovery_action
from gpufleet.fleetspec.faults.driver import GpuEvent
from gpufleet.reconciler.core.faults import FaultReader
from gpufleet.reconciler.core.observe import node_view

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


# --- the catalogue --------------------------------------------------------------------------------------

def test_every_code_of_the_catalogue_is_listed_and_its_action_follows_nvidias_bucket():
    assert sorted(XIDS) == list(range(1, 173))
    for e in XIDS.values():
        if e.nvidia:
            assert e.code not in CHOICES and e.action is BUCKET_ACTIONS[e.nvidia], e
        else:  # the catalogue gives no immediate action: gpufleet's choice says why
            assert e.action is CHOICES[e.code][0] and CHOICES[e.code][1], e


@pytest.mark.parametrize("code,bucket", [
    # spot checks against docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Table 1
    (13, "RESTART_APP"), (31, "RESTART_APP"), (43, "IGNORE"), (45, "WORKFLOW_XID_45"), (46, "RESET_GPU"),
    (48, "WORKFLOW_XID_48"), (54, "CHECK_MECHANICALS"), (61, "CONTACT_SUPPORT"), (63, "IGNORE"), (64, "RESET_GPU"),
    (74, "WORKFLOW_NVLINK_ERR"), (78, "UPDATE_SWFW"), (79, "RESTART_BM"), (92, "IGNORE"), (94, "RESTART_APP"),
    (95, "RESET_GPU"), (119, "RESET_GPU"), (137, "IGNORE"), (143, "RESET_GPU"), (149, "WORKFLOW_NVLINK5_ERR"),
    (151, "RESTART_VM"), (154, "XID_154"), (158, "RESET_GPU"), (159, "CHECK_UVM"), (160, "IGNORE"), (167, ""),
])
def test_the_table_keeps_nvidias_immediate_action(code, bucket):
    assert XIDS[code].nvidia == bucket


def test_issue_21s_examples_in_both_directions():
    for healthy in (94, 63, 92, 13, 31, 43, 45):  # were taken out of service, or must never be
        assert not XIDS[healthy].action.remediates, healthy
    for fault in (46, 109, 110, 136, 143, 155, 156, 158):  # were missed
        assert XIDS[fault].action is FaultAction.RESET_GPU, fault
    assert XIDS[79].action is FaultAction.REBOOT and XIDS[54].action is FaultAction.CONTACT_SUPPORT
    assert default_action(Kind.SXID, 24007, fatal=True).remediates
    assert not default_action(Kind.SXID, 12028, fatal=False).remediates
    assert default_action(Kind.GPU_LOST, 0) is FaultAction.REBOOT
    assert default_action(Kind.XID, 999) is FaultAction.NONE  # unknown to the catalogue: logged, not acted on


# --- NVIDIA's rules ---------------------------------------------------------------------------------

def xid(code, text="", pci="0000:3b:00", t=None, **kw):
    return GpuEvent(Kind.XID, code, pci, text, time=t, **kw)


@pytest.mark.parametrize("text,action", [
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", FaultAction.NONE),
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", FaultAction.RESET_GPU),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", FaultAction.REBOOT),
    ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", FaultAction.RESTART_APP),
    ("GPU recovery action changed from 0x3 (Drain P2P) to 0x4 (Drain and Reset)", FaultAction.RESET_GPU),
    ("GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)", FaultAction.RESTART_APP),
    # labels of later drivers, seen in public logs: the value decides
    ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", FaultAction.RESET_GPU),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", FaultAction.REBOOT),
])
def test_xid_154_is_read_by_the_label_it_changed_to(text, action):
    assert recovery_action(text)[0] is action
    assert Classifier().classify(xid(154, text)).action is action


def test_an_unreadable_xid_154_does_nothing_the_xid_it_follows_decides():
    for text in ("", "GPU recovery action changed", "to 0xZZ (Whatever)", "changed from 0x0 (None) to 0x9 (Nope)"):
        assert Classifier().classify(xid(154, text)).action is FaultAction.NONE, text


def test_xid_48_resets_the_gpu_solo_or_with_63_64_and_says_which():
    c = Classifier()
    assert "solo" in c.classify(xid(48, t=100.0)).nvidia
    c.classify(xid(64, t=200.0))
    paired = c.classify(xid(48, t=230.0))
    assert paired.action is FaultAction.RESET_GPU and "DRAIN_AND_RESET" in paired.nvidia
    assert "solo" in c.classify(xid(48, t=400.0)).nvidia  # the 64 was minutes before
    assert "solo" in c.classify(xid(48, pci="0000:3c:00", t=231.0)).nvidia  # another GPU


def test_repeated_xid_13_on_one_gpu_within_the_window_is_possible_hardware():
    c = Classifier(FaultPolicy(repeats=Repeats(frozenset({13, 31}), 3, 3600.0, FaultAction.REPLACE)))
    burst = [c.classify(xid(13, t=10.0 + i * 0.001)).action for i in range(5)]  # one exception, five lines
    assert burst == [FaultAction.RESTART_APP] * 5
    assert c.classify(xid(13, t=10.0 + BURST_SECONDS[13] + 1)).action is FaultAction.RESTART_APP  # the second
    assert c.classify(xid(13, pci="0000:3c:00", t=500.0)).action is FaultAction.RESTART_APP  # another GPU
    assert c.classify(xid(13, gpu_instance=1, t=600.0)).action is FaultAction.RESTART_APP  # another MIG instance
    third = c.classify(xid(13, t=700.0))
    assert third.action is FaultAction.REPLACE and "3x on one GPU" in third.nvidia  # a spec's action is final
    assert c.classify(xid(31, t=701.0)).action is FaultAction.RESTART_APP  # counted per code
    later = Classifier(c.policy)
    for t in (0.0, 2000.0, 4000.0):  # never three within an hour
        assert later.classify(xid(13, t=t)).action is FaultAction.RESTART_APP


# --- the escalation rules (fleetspec/faults/escalation.py), each on a real line ----------------------------

def _lines(*msgs_at):
    """Real messages at the times given (seconds), parsed as the agent parses them."""
    from gpufleet.fleetspec.faults.driver import DriverMessages
    out = []
    for msg, at in msgs_at:
        (ev,) = DriverMessages().message(msg, time=at)
        out.append(ev)
    return out


# docs/designs/024-workflow-nvlink-err.md of github.com/NVIDIA/NVSentinel ("Message Format"): register 2 = 0x10000
NVSENTINEL_74 = ("NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on "
                 "link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
# the SageMaker HyperPod workshop's resiliency page (the Xid 74 it injects): register 0 = 0x10000
HYPERPOD_74 = ("NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error detected on link "
               "6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
# open-gpu-kernel-modules 595.45.04 kern_gpu_error_cont_ga100.c (the comment's example 3)
DRIVER_95 = "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No"
# kernel_rc.c's "%d, pid=%s, name=%s, %s" (595.45.04) rendered, as in tests/fixtures/kernel_lines.yaml
DRIVER_48 = "NVRM: Xid (PCI:0000:10:1c): 48, pid=1896, name=python3, Ch 00000010"


def test_every_escalation_rule_cites_the_page_or_file_it_follows():
    from gpufleet.fleetspec.faults.escalation import RULES
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert ("docs.nvidia.com" in r.source or "NVSentinel" in r.source) and r.why, r.name


def test_xid_74_with_a_fatal_register_0_bit_is_a_case_for_the_vendor_at_once():
    (ev,) = _lines((HYPERPOD_74, 100.0))
    assert (ev.link, ev.registers) == (6, (0x10000, 0, 0, 0, 0, 0, 0))
    c = Classifier().classify(ev)
    assert c.action is FaultAction.CONTACT_SUPPORT and c.nvidia.startswith("XID74Reg0HardwareIssue") and c.why == "rule"


def test_xid_74_register_2_bit_16_resets_once_and_is_a_case_when_repeated_on_the_gpu():
    c = Classifier()
    first, again, elsewhere = _lines((NVSENTINEL_74, 100.0), (NVSENTINEL_74, 3700.0),
                                     (NVSENTINEL_74.replace("0003:00:00", "0004:00:00"), 3800.0))
    assert c.classify(first).action is FaultAction.RESET_GPU  # the catalogue's row (WORKFLOW_NVLINK_ERR)
    assert c.classify(elsewhere).action is FaultAction.RESET_GPU  # another GPU: its first
    repeated = c.classify(again)
    assert repeated.action is FaultAction.CONTACT_SUPPORT and "RepeatedXID74Reg2Bit16Or19Set" in repeated.nvidia
    later = Classifier()
    later.classify(first)
    (day_after,) = _lines((NVSENTINEL_74, 100.0 + 86400 + 1))
    assert later.classify(day_after).action is FaultAction.RESET_GPU  # outside 24 h


def test_xid_74_with_only_the_ecc_threshold_bits_of_register_4_needs_nothing():
    # NVSentinel's 74 line with its registers moved to register 4 bit 20 (NVIDIA: "a threshold of ECC errors
    # being exceeded. There was no uncorrectable error at this time. Continue operation.")
    (ev,) = _lines((NVSENTINEL_74.replace("0x0, 0x0, 0x10000, 0x0, 0x0,", "0x0, 0x0, 0x0, 0x0, 0x100000,"), 10.0))
    assert Classifier().classify(ev).action is FaultAction.NONE
    (older,) = _lines(("NVRM: Xid (PCI:0000:b9:00): 71, NVLink: fatal error detected on link 6".replace("71", "74"), 1.0))
    assert Classifier().classify(older).action is FaultAction.RESET_GPU  # no registers (an older driver): its row


def test_a_repeated_xid_48_on_one_gpu_within_a_day_is_a_case_for_the_vendor():
    c = Classifier()
    first, echo, again = _lines((DRIVER_48, 1000.0), (DRIVER_48, 1030.0), (DRIVER_48, 8200.0))
    assert [c.classify(e).action for e in (first, echo)] == [FaultAction.RESET_GPU] * 2  # one burst: one event
    second = c.classify(again)
    assert second.action is FaultAction.CONTACT_SUPPORT and "RepeatedXID48OnSameGPU" in second.nvidia
    other = Classifier()
    other.classify(first)
    (next_day,) = _lines((DRIVER_48, 1000.0 + 86400 + 60))
    assert other.classify(next_day).action is FaultAction.RESET_GPU


def test_five_fatal_xids_on_one_gpu_within_a_day_are_a_case_for_the_vendor():
    c = Classifier()
    evs = _lines(*((DRIVER_95, 3600.0 * i) for i in range(5)))
    got = [c.classify(e).action for e in evs]
    assert got == [FaultAction.RESET_GPU] * 4 + [FaultAction.CONTACT_SUPPORT]
    apps = Classifier()  # application faults never count: 94 five times is the job's, five times
    contained = "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No"
    assert {apps.classify(e).action for e in _lines(*((contained, 3600.0 * i) for i in range(6)))} == \
        {FaultAction.RESTART_APP}


def test_the_driver_line_after_an_xid_79_is_that_xid_79():
    from gpufleet.fleetspec.faults.driver import DriverMessages
    # github.com/leptonai/gpud components/accelerator/nvidia/sxid/README.md (dmesg of an Xid 79)
    (ev,) = DriverMessages().message("NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.")
    assert (ev.kind, ev.code, ev.pci) == (Kind.XID, 79, "0000:91:00")
    assert Classifier().classify(ev).action is FaultAction.REBOOT


def test_xid_13_repeats_count_on_the_same_gpc_and_tpc_and_ask_for_diagnostics():
    c = Classifier()  # the defaults: NVSentinel's twice within 24 h
    # github.com/leptonai/gpud/pull/46 (dmesg --ctime)
    line = ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
            "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    first, other_tpc, same = _lines((line, 0.0), (line.replace("GPC 7, TPC 7", "GPC 2, TPC 0"), 600.0), (line, 1200.0))
    assert first.gpc_tpc == (7, 7)
    assert [c.classify(e).action for e in (first, other_tpc)] == [FaultAction.RESTART_APP] * 2
    third = c.classify(same)
    assert third.action is FaultAction.DIAGNOSE and "GPC 7, TPC 7" in third.nvidia and not third.remediates


def test_nvlink5_errors_by_their_fatal_word_and_the_149_link_down_decode():
    c = Classifier()
    nonfatal = GpuEvent(Kind.XID, 144, "0000:01:00", fatal=False, unit="SAW_MVB")
    fatal = GpuEvent(Kind.XID, 145, "0000:01:00", fatal=True, unit="RLW_SRC_TRACK", registers=(0x7, 0x1))
    assert (c.classify(nonfatal).action, c.classify(fatal).action) == (FaultAction.NONE, FaultAction.RESET_GPU)
    for unit in ("NETIR_LINK_EVT", "NETIR_LINK_DOWN"):  # V1 (<R575) and V2 names of the same row
        ignored = GpuEvent(Kind.XID, 149, "0000:01:00", fatal=True, unit=unit, registers=(0b101000 << 20 | 0x11,))
        peer = GpuEvent(Kind.XID, 149, "0000:01:00", fatal=True, unit=unit, registers=(0b100101 << 20 | 0x11,))
        assert (c.classify(ignored).action, c.classify(peer).action) == (FaultAction.NONE, FaultAction.RESET_GPU)
    assert c.classify(GpuEvent(Kind.XID, 150, "0000:01:00")).action is FaultAction.RESET_GPU  # no word: as fatal


def test_an_override_is_final_over_the_catalogue_and_the_rules():
    policy = FaultPolicy(xid={94: FaultAction.RESET_GPU, 154: FaultAction.REBOOT, 999: FaultAction.REPLACE},
                         sxid={12028: FaultAction.REBOOT}, gpu_lost=FaultAction.REPLACE)
    c = Classifier(policy)
    assert c.classify(xid(94)).action is FaultAction.RESET_GPU and c.classify(xid(94)).why == "override"
    assert c.classify(xid(154, "changed from 0x1 (GPU Reset Required) to 0x0 (None)")).action is FaultAction.REBOOT
    assert c.classify(xid(999)).action is FaultAction.REPLACE
    assert c.classify(GpuEvent(Kind.SXID, 12028, "0000:05:00.0", fatal=False)).action is FaultAction.REBOOT
    assert c.classify(GpuEvent(Kind.GPU_LOST, 0, "0000:b3:00.0")).action is FaultAction.REPLACE
    assert c.classify(xid(95)).action is FaultAction.RESET_GPU  # the rest as NVIDIA says


def test_the_spec_makes_the_policy_the_agent_and_the_reconciler_share():
    spec = parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "p", "node_type": "k", "gpu_model": "H100", "nodes": 1, "spares": 0}],
        "slurm": {"partitions": [{"name": "p", "pools": ["p"]}]},
        "healing": {"faults": {"actions": {"xid": {"94": "reset-gpu"}, "sxid": {"20034": "replace"}},
                               "repeats": {"count": 5, "window_seconds": 60, "xids": [13]}}},
    })
    policy = FaultPolicy.from_spec(spec.healing)
    assert policy.action(Kind.XID, 94) is FaultAction.RESET_GPU and policy.action(Kind.XID, 95) is FaultAction.RESET_GPU
    assert policy.action(Kind.SXID, 20034) is FaultAction.REPLACE
    assert policy.repeats == Repeats(frozenset({13}), 5, 60.0, FaultAction.DIAGNOSE)
    again = parse_fleet(spec.model_dump(mode="json"))  # as the policy ConfigMap carries it (JSON: string keys)
    assert FaultPolicy.from_spec(again.healing) == policy


# --- the condition: written by the agent, read by the reconciler ----------------------------------------

def test_the_condition_format_round_trips_and_tolerates_junk():
    sig = FaultSignal(Kind.SXID, 24007, FaultAction.REBOOT, "0000:86:00.0")
    msg = format_message(sig, "nvswitch0: Fatal, Link 44 sourcetrack TCEN0 crumbstore ECC DBE Error (First)")
    assert msg.startswith("[action=reboot pci=0000:86:00.0] SXid 24007: ") and parse_condition("SXid24007", msg) == sig
    assert parse_condition("GpuLost", "[action=replace]").action is FaultAction.REPLACE
    for reason in ("Xid", "Xid٧٩", "Xid" + "9" * 50, "XidSeventy", "HealthCheckPassed", ""):
        assert parse_condition(reason, "[action=reboot]") is None, reason
    odd = parse_condition("Xid79", "[action=explode pci=<script> gi=٥ ci=99999] text")
    assert (odd.action, odd.pci, odd.gpu_instance, odd.compute_instance) == (None, "", None, None)


def cond(ctype, status, reason, message, ago=0):
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": (T0 - timedelta(seconds=ago)).isoformat()}


def view(reader, *conditions):
    return node_view({"metadata": {"name": "n", "labels": {"node-restriction.kubernetes.io/gpufleet-pool": "p", "gpufleet.io/role": "active"}},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]}}, reader)


def test_gpufleets_own_condition_is_read_with_what_it_needs_and_where():
    f = view(["GpuHealthy"], cond("GpuHealthy", "False", "Xid94",
                                  "[action=reset-gpu pci=0000:01:00 gi=5 ci=0] XID 94: Contained")).fault
    assert (f.xid, f.kind, f.needs, f.pci, f.gpu_instance, f.compute_instance, f.source) == \
        (94, Kind.XID, FaultAction.RESET_GPU, "0000:01:00", 5, 0, "GpuHealthy")


def test_a_condition_without_the_header_takes_the_catalogue_with_the_specs_overrides():
    plain = cond("GpuHealthy", "False", "Xid79", "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus.")
    assert view(["GpuHealthy"], plain).fault.needs is FaultAction.REBOOT
    reader = FaultReader(("GpuHealthy",), (), FaultPolicy(xid={79: FaultAction.REPLACE}))
    assert view(reader, plain).fault.needs is FaultAction.REPLACE
    legacy = view(["GpuHealthy"], cond("GpuHealthy", "False", "GpuError", "XID_48 seen")).fault  # by hand
    assert (legacy.xid, legacy.needs) == (48, FaultAction.RESET_GPU)
    assert view(["GpuHealthy"], cond("GpuHealthy", "False", "Xid94", "[action=none] x")).fault.needs is FaultAction.NONE
    healthy = view(["GpuHealthy"], cond("GpuHealthy", "True", "HealthCheckPassed", "dcgmi diag passed"))
    assert healthy.fault is None and healthy.health_check_passed


def test_of_several_faulted_conditions_the_one_that_needs_most_is_the_nodes():
    reader = FaultReader(("GpuHealthy",), (ConditionSource(type="AcceleratedHardwareReady", fault_status="False",
                                                           reason_pattern="^NvidiaXID(?P<code>[0-9]{1,6})Error$"),))
    v = view(reader, cond("GpuHealthy", "False", "Xid94", "[action=restart-app] x"),
             cond("AcceleratedHardwareReady", "False", "NvidiaXID79Error", "detected XID-79"))
    assert (v.fault.xid, v.fault.needs, v.fault.source) == (79, FaultAction.REBOOT, "AcceleratedHardwareReady")


# Other detectors, in the formats their own source writes:

NVSENTINEL = ConditionSource(type="SysLogsXIDError", fault_status="True",
                             message_pattern=r"ErrorCode:(?P<code>[0-9]{1,6}) PCI:(?P<pci>[0-9a-fA-F:.]{7,16}) ")


def test_nvsentinels_condition():
    # NVIDIA/NVSentinel platform-connectors/pkg/connectors/kubernetes/process_node_events.go (commit 033cd49):
    # type = the check's name, status True and reason "<check>IsNotHealthy" while unhealthy, the message
    # "ErrorCode:<code> <EntityType>:<EntityValue> ... <message> Recommended Action=<ACTION>;" per event.
    reader = FaultReader(("GpuHealthy",), (NVSENTINEL,))
    msg = ("ErrorCode:79 PCI:0000:b3:00 GPU_UUID:GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b kernel: NVRM: Xid "
           "(PCI:0000:b3:00): 79, GPU has fallen off the bus. Recommended Action=RESTART_BM;")
    f = view(reader, cond("SysLogsXIDError", "True", "SysLogsXIDErrorIsNotHealthy", msg)).fault
    assert (f.xid, f.pci, f.needs) == (79, "0000:b3:00", FaultAction.REBOOT)
    contained = "ErrorCode:94 PCI:0000:18:00 GPU_UUID:GPU-1 Contained: SM (0x1) Recommended Action=NONE;"
    assert view(reader, cond("SysLogsXIDError", "True", "SysLogsXIDErrorIsNotHealthy", contained)).fault.needs \
        is FaultAction.RESTART_APP
    healthy = cond("SysLogsXIDError", "False", "SysLogsXIDErrorIsHealthy", "No Health Failures")
    assert view(reader, healthy).fault is None
    per_source = FaultReader(("GpuHealthy",), (NVSENTINEL.model_copy(update={"actions": {79: FaultAction.REPLACE}}),))
    assert view(per_source, cond("SysLogsXIDError", "True", "x", msg)).fault.needs is FaultAction.REPLACE


def test_node_problem_detectors_condition_carries_the_drivers_lines():
    # kubernetes/node-problem-detector v1.34.0 pkg/systemlogmonitor/log_monitor.go (generateStatus): a
    # "permanent" rule sets its condition True with the rule's reason and the matched kmsg messages joined
    # by "\n" (log_buffer.go concatLogs) as the message.
    reader = FaultReader(("GpuHealthy",), (ConditionSource(type="GPUProblem", read="kernel-log"),))
    lost = "\n".join(["NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: (PCI ID: 10de:26b5) installed in this system has",
                      "NVRM: fallen off the bus and is not responding to commands."])
    f = view(reader, cond("GPUProblem", "True", "GPUFellOffTheBus", lost)).fault
    assert (f.kind, f.pci, f.needs) == (Kind.GPU_LOST, "0000:b3:00.0", FaultAction.REBOOT)
    two = ("NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=python, Contained: SM (0x1). RST: No, D-RST: No\n"
           "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    f = view(reader, cond("GPUProblem", "True", "NVRMXid", two)).fault
    assert (f.xid, f.needs) == (154, FaultAction.RESET_GPU)
    assert view(reader, cond("GPUProblem", "True", "NVRMXid", "kernel: something else")).fault is None
    assert view(reader, cond("GPUProblem", "False", "NoProblem", two)).fault is None


def test_the_eks_node_monitoring_agents_condition():
    # aws/eks-node-monitoring-agent v1.7.0: condition AcceleratedHardwareReady (False when unhealthy,
    # docs/node-health-issues.adoc), reason "NvidiaXID%dError" (pkg/reasons/reasons.go), message "detected
    # XID-%d on the instance, review kernel logs for additional information." (monitors/nvidia/dcgm/dcgm_policies.go)
    eks = ConditionSource(type="AcceleratedHardwareReady", fault_status="False",
                          reason_pattern="^NvidiaXID(?P<code>[0-9]{1,6})Error$", action=FaultAction.REPLACE)
    reader = FaultReader(("GpuHealthy",), (eks,))
    f = view(reader, cond("AcceleratedHardwareReady", "False", "NvidiaXID46Error",
                          "detected XID-46 on the instance, review kernel logs for additional information.")).fault
    assert (f.xid, f.needs) == (46, FaultAction.RESET_GPU)
    f = view(reader, cond("AcceleratedHardwareReady", "False", "NvidiaDoubleBitError", "A double bit error")).fault
    assert (f.xid, f.needs) == (0, FaultAction.REPLACE)  # no code in the reason: the source's own action
    assert view(reader, cond("AcceleratedHardwareReady", "True", "AcceleratedHardwareIsReady", "")).fault is None


# --- detect: is this a fault, and what does it need -------------------------------------------------------

def _spec():
    return parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "p", "node_type": "k", "gpu_model": "H100", "nodes": 4, "spares": 1}],
        "slurm": {"partitions": [{"name": "p", "pools": ["p"]}]},
    })


def _node(fault):
    from gpufleet.reconciler.core.model import NodeView
    return NodeView(name="p-0", pool="p", role="active", fault=fault)


def test_detect_takes_out_only_faults_whose_action_remediates_and_the_remediation_keeps_what_it_needs():
    from gpufleet.reconciler.core.admission import admission_facts
    from gpufleet.reconciler.core.decide import detect
    from gpufleet.reconciler.core.model import Fault

    for need in (FaultAction.NONE, FaultAction.RESTART_APP):  # the job's problem: the node stays in service
        assert detect(_node(Fault(94, "m", T0, action=need)), [], _spec(), T0).remediation is None, need
    f = Fault(24007, "m", T0, Kind.SXID, FaultAction.REBOOT, "0000:86:00.0", source="GpuHealthy")
    r = detect(_node(f), [], _spec(), T0).remediation
    assert (r.name, r.xid, r.kind, r.action, r.pci, r.source) == \
        (f"p-0-sxid24007-{int(T0.timestamp())}", 24007, Kind.SXID, FaultAction.REBOOT, "0000:86:00.0", "GpuHealthy")
    assert r.reason.startswith("SXid 24007 needs reboot")
    gpu = Fault(46, "m", T0, action=FaultAction.RESET_GPU, pci="0000:01:00", gpu_instance=3)
    mig = detect(_node(gpu), [], _spec(), T0)
    assert (mig.remediation.action, mig.remediation.gpu_instance) == (FaultAction.RESET_GPU, 3)
    a = admission_facts(r, [_node(Fault(94, "m", T0, action=FaultAction.RESTART_APP))], [], _spec(), T0)
    assert a.unhealthy == frozenset()  # a restart-app fault is not an unhealthy node for the storm brake


def test_the_remediation_keeps_the_fault_and_reads_remediations_from_before_it():
    from gpufleet.reconciler.adapters.records import from_object, to_object
    from gpufleet.reconciler.core.decide import detect
    from gpufleet.reconciler.core.model import Fault

    f = Fault(94, "m", T0, Kind.XID, FaultAction.RESET_GPU, "0000:01:00", 5, 0, "GpuHealthy", "gpufleet-agent")
    r = detect(_node(f), [], _spec(), T0).remediation
    obj = to_object(r)
    assert obj["spec"]["fault"] == {"kind": "xid", "code": 94, "action": "reset-gpu", "pci": "0000:01:00",
                                    "source": "GpuHealthy", "reportedBy": "gpufleet-agent", "gpuInstance": 5,
                                    "computeInstance": 0}
    assert from_object(obj) == r
    del obj["spec"]["fault"]  # a remediation written before the fault carried its action
    old = from_object(obj)
    assert (old.kind, old.action, old.pci, old.gpu_instance) == (Kind.XID, None, "", None)


def test_the_classifiers_memory_is_bounded_however_many_gpus_a_log_names():
    from gpufleet.fleetspec.faults.classify import GPUS, HISTORY

    c = Classifier()
    for i in range(GPUS * 3):
        c.classify(xid(13, pci=f"{i:04x}:3b:00", t=float(i)))
    for i in range(HISTORY * 3):
        c.classify(xid(31, t=float(i)))
    assert len(c._seen) <= GPUS and all(len(h) <= HISTORY for h in c._seen.values())


# --- through the runtime: what the reconciler does with each fault -----------------------------------------

def _condition(w, node, ctype, status, reason, message):
    w.kube.nodes[node]["status"]["conditions"].append(
        {"type": ctype, "status": status, "reason": reason, "message": message,
         "lastTransitionTime": w.clock.now.isoformat()})


def test_a_restart_app_fault_leaves_the_node_in_service_and_the_reconciler_writes_nothing():
    from tests.unit.fakes import World, fleet

    w = World(fleet(grace_period_seconds=0))
    _condition(w, "h100-0", "GpuHealthy", "False", "Xid94", "[action=restart-app pci=0000:01:00] XID 94: Contained")
    _condition(w, "h100-1", "GpuHealthy", "False", "Xid154", "[action=none pci=0000:3b:00] XID 154: to 0x0 (None)")
    w.run(seconds=5)
    assert (w.store.objects, w.kube.calls, w.slurm.calls, w.notifier.sent) == ({}, [], [], [])


def test_another_detectors_condition_heals_through_the_runtime_and_the_remediation_says_where():
    from tests.unit.fakes import World, fleet

    w = World(fleet(grace_period_seconds=0, condition_sources=[NVSENTINEL.model_dump()]))
    _condition(w, "h100-0", "SysLogsXIDError", "True", "SysLogsXIDErrorIsNotHealthy",
               "ErrorCode:79 PCI:0000:b3:00 GPU_UUID:GPU-1 GPU has fallen off the bus. Recommended Action=RESTART_BM;")
    w.run(seconds=5)
    r = w.remediation("h100-0")
    assert (r.xid, r.action, r.pci, r.source) == (79, FaultAction.REBOOT, "0000:b3:00", "SysLogsXIDError")
    assert ("cordon", "h100-0") in [c[:2] for c in w.kube.calls]


def test_the_storm_brake_weighs_only_faults_that_take_a_node_out():
    from gpufleet.reconciler.core.phases import Phase
    from tests.unit.fakes import World, fleet

    w = World(fleet(nodes=10, max_unhealthy_fraction=0.2, grace_period_seconds=0))
    for i in range(1, 5):  # four restart-app faults: the jobs' problem, no storm
        _condition(w, f"h100-{i}", "GpuHealthy", "False", "Xid94", "[action=restart-app] XID 94: Contained")
    w.fault("h100-0")
    w.run(seconds=5)
    assert [r.node for r in w.store.list()] == ["h100-0"] and w.remediation("h100-0").phase is not Phase.HELD
    assert "storm" not in w.notifier.sent
