"""What a GPU event needs: NVIDIA's catalogue, NVIDIA's rules, then the spec's overrides. Pure.

The node agent classifies the kernel's events with it, `gpufleet classify-kmsg` explains a log with
it, and the reconciler reads the driver's lines another detector copies into a condition with it.

The rules are the catalogue's workflows that need more than the code (docs.nvidia.com/deploy/
xid-errors/analyzing-xid-catalog.html, "Fault Resolution Buckets" and "XID 144-150 Decode"):
- Xid 154 ("follow Xid 154 reported guidance"): the action is the label it changed *to*
  (gpu.c's _gpuRecoveryActionName: None, GPU Reset Required, Node Reboot Required, Drain P2P, Drain and
  Reset, Recover IMEX Domain; later drivers print other labels, so the value decides when the label is
  new). "... to 0x0 (None)" means the GPU is fine again: nothing to do.
- Xid 48 (WORKFLOW_XID_48): solo RESET_GPU, with 63/64 DRAIN_AND_RESET; a GPU reset either way. DRAIN_AND_RESET
  (and Xid 154's "Drain and Reset") is said when: at the job's boundary (`When.JOB_BOUNDARY`: no new work lands on
  the GPU, the running job finishes, then the reset), where RESET_GPU resets now.
- Xid 144-150 (WORKFLOW_NVLINK5_ERR): the line says Fatal or Nonfatal. Fatal ones reset the GPU, except
  the two link-down reasons of Xid 149 NETIR_LINK_EVT the decode table marks IGNORE (intrInfo[25:20]
  0b100110 and 0b101000); non-fatal ones are counted, not acted on.
- Xid 13 and 31 (WORKFLOW_XID_13/_31): once is the job's bug; repeated on the same GPU (for 13, the same
  GPC and TPC where the line names them) it may be the hardware: the catalogue's RUN_DCGMEUD, so the
  action is `diagnose` (the spec's `faults.repeats`: by default twice within 24 h, NVSentinel's
  RepeatedXID31OnSameGPU and RepeatedXID13OnSameGPCAndTPC in its health-events-analyzer values.yaml);
  on different GPUs (or GPCs) it is nothing more than the job's (RepeatedXID31OnDifferentGPU: NONE).
  One exception is often logged as several lines at once ("Solo, no burst"): lines within the code's
  burst window of the last count once (NVSentinel's: 15 s for 13, 180 s for 31). A log without times
  (a plain file) never escalates: its lines cannot be told apart in time.
- The escalation rules of fleetspec/faults/escalation.py (Xid 74 by its register bits, a repeated Xid 48,
  five fatal Xids on one GPU within 24 h), each a row citing its source.
An override in the spec is final.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from .catalogue import XIDS, FaultAction, Kind, When, default_action
from .driver import GpuEvent
from .escalation import Seen, escalate
from .policy import FaultPolicy

# Xid 154's labels (src/nvidia/src/kernel/gpu/gpu.c, _gpuRecoveryActionName) and values
# (NV2080_CTRL_GPU_RECOVERY_ACTION_*; NVML's nvmlDeviceGpuRecoveryAction_t adds 6 and 7).
RECOVERY_LABELS = {
    "None": FaultAction.NONE,
    "GPU Reset Required": FaultAction.RESET_GPU,
    "Node Reboot Required": FaultAction.REBOOT,
    "Drain P2P": FaultAction.RESTART_APP,           # stop the jobs doing P2P; the next 154 says what follows
    "Drain and Reset": FaultAction.RESET_GPU,
    "Recover IMEX Domain": FaultAction.RESTART_APP,  # the IMEX domain, not this GPU (dra-driver-nvidia-gpu #1441)
}
DRAIN_AND_RESET_LABEL, DRAIN_AND_RESET_VALUE = "Drain and Reset", 4  # NV2080_CTRL_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
RECOVERY_VALUES = {0: FaultAction.NONE, 1: FaultAction.RESET_GPU, 2: FaultAction.REBOOT, 3: FaultAction.RESTART_APP,
                   4: FaultAction.RESET_GPU, 5: FaultAction.RESTART_APP, 6: FaultAction.RESET_GPU, 7: FaultAction.REBOOT}
LINK_DOWN_IGNORED = frozenset({0b100110, 0b101000})  # Xid 149 NETIR_LINK_EVT reasons marked IGNORE
PAIRED_SECONDS = 60.0  # a 63/64 this close to a 48 on the same GPU is "with 63/64"
BURST_SECONDS = {13: 15.0, 31: 180.0}  # Xid 13/31 lines this close to the one before on one GPU: one occurrence
BURST_DEFAULT = 15.0  # for other codes a spec's repeat rule names
HISTORY = 64  # Xids remembered per GPU
GPUS = 512     # GPUs remembered (a node has at most a few dozen; MIG instances count apart)


@dataclass(frozen=True)
class Classification:
    action: FaultAction
    nvidia: str  # what NVIDIA's catalogue says, e.g. "RESTART_APP", "XID_154 -> 0x0 (None)"
    why: str = "catalogue"  # catalogue | rule | override | unknown code
    when: When = When.CHECKPOINT  # JOB_BOUNDARY: NVIDIA's DRAIN_AND_RESET (the running job finishes first)

    @property
    def remediates(self) -> bool:
        return self.action.remediates


def recovery_action(text: str) -> tuple[FaultAction, str] | None:
    """Xid 154's new action from "GPU recovery action changed from 0x%x (%s) to 0x%x (%s)"."""
    _, sep, tail = text[:256].rpartition(" to 0x")
    if not sep:
        return None
    value, _, label = tail.partition(" (")
    label = label[:-1] if label.endswith(")") else label.rstrip(").")
    if label in RECOVERY_LABELS:
        return RECOVERY_LABELS[label], f"0x{value} ({label})"
    if value and len(value) <= 8 and all(c in "0123456789abcdefABCDEF" for c in value):
        v = int(value, 16)
        if v in RECOVERY_VALUES:
            return RECOVERY_VALUES[v], f"0x{value} ({label})"
    return None


def _value(said: str) -> int | None:
    """The value of "0x4 (Drain and Reset)" as `recovery_action` says it; None when unreadable."""
    head = said.partition(" ")[0]
    try:
        return int(head, 16)
    except ValueError:
        return None


class Classifier:
    """Keeps the recent Xids of each GPU for the rules that need them; one per kernel log."""

    def __init__(self, policy: FaultPolicy | None = None):
        self.policy = policy or FaultPolicy()
        self._seen: dict[str, deque[tuple[Seen, tuple[int, int] | None]]] = defaultdict(lambda: deque(maxlen=HISTORY))

    def classify(self, ev: GpuEvent, now: float = 0.0) -> Classification:
        """`now`: the event's time when its line has none (seconds, the same clock as the log's)."""
        t = ev.time if ev.time is not None else now
        v = self._rules(ev, t)
        if ev.kind is Kind.XID:
            seen = Seen(ev.code, t, v.action, ev.registers if ev.code == 74 else (), ev.link)
            if ev.code in XIDS and (esc := escalate(seen, [s for s, _ in self._seen.get(ev.gpu, ())])) is not None:
                v = Classification(esc.action, esc.nvidia, "rule")
                seen = Seen(ev.code, t, v.action, seen.registers, seen.link)
            if ev.gpu not in self._seen and len(self._seen) >= GPUS:
                del self._seen[next(iter(self._seen))]  # the longest-known GPU goes: memory stays bounded
            self._seen[ev.gpu].append((seen, ev.gpc_tpc))
        override = self.policy.override(ev.kind, ev.code)
        return Classification(override, v.nvidia, "override") if override is not None else v

    def _recent(self, gpu: str, codes: frozenset[int] | set[int], t: float, window: float) -> int:
        return sum(1 for s, _ in self._seen.get(gpu, ()) if s.code in codes and t - window <= s.at <= t)

    def _occurrences(self, ev: GpuEvent, t: float, window: float) -> int:
        """Bursts of the event's code on its GPU within the window, this one included; for an Xid 13 that
        names its GPC and TPC, only those that name the same (NVSentinel counts only lines that name one)."""
        times = sorted(s.at for s, where in self._seen.get(ev.gpu, ()) if s.code == ev.code and t - window <= s.at <= t
                       and (ev.gpc_tpc is None or where == ev.gpc_tpc)) + [t]
        burst = BURST_SECONDS.get(ev.code, BURST_DEFAULT)
        return 1 + sum(1 for a, b in zip(times, times[1:]) if b - a > burst)

    def _rules(self, ev: GpuEvent, t: float) -> Classification:
        if ev.kind is Kind.GPU_LOST:
            return Classification(default_action(ev.kind, 0), "GPU lost at probe (as Xid 79: RESTART_BM)")
        if ev.kind is Kind.SXID:
            if ev.fatal is None:
                return Classification(FaultAction.NONE, "SXid detail line", "rule")
            return Classification(default_action(ev.kind, ev.code, ev.fatal), "Fatal" if ev.fatal else "Non-fatal",
                                  "rule")
        entry = XIDS.get(ev.code)
        if entry is None:
            return Classification(default_action(ev.kind, ev.code), "not in the catalogue", "unknown code")
        if ev.code == 154:
            got = recovery_action(ev.text)
            if got is None:
                return Classification(FaultAction.NONE, "XID_154, recovery action unreadable: the Xid it follows "
                                      "decides", "rule")
            drain = got[1].endswith(f"({DRAIN_AND_RESET_LABEL})") or _value(got[1]) == DRAIN_AND_RESET_VALUE
            return Classification(got[0], f"XID_154 -> {got[1]}" + (": DRAIN_AND_RESET" if drain else ""), "rule",
                                  When.JOB_BOUNDARY if drain else When.CHECKPOINT)
        if ev.code == 48:
            paired = self._recent(ev.gpu, {63, 64}, t, PAIRED_SECONDS)
            return Classification(entry.action, "WORKFLOW_XID_48: " + ("with 63/64, DRAIN_AND_RESET" if paired
                                                              else "solo, RESET_GPU"), "rule",
                                  When.JOB_BOUNDARY if paired else When.CHECKPOINT)
        if ev.code in range(144, 151):
            return self._nvlink5(ev)
        rep = self.policy.repeats
        if ev.code in rep.xids:
            n = self._occurrences(ev, t, rep.window_seconds)
            if n >= rep.count:
                where = f" (GPC {ev.gpc_tpc[0]}, TPC {ev.gpc_tpc[1]})" if ev.gpc_tpc else ""
                return Classification(rep.action, f"{entry.nvidia}, {n}x on one GPU{where} within "
                                      f"{rep.window_seconds:.0f}s: possible hardware (RUN_DCGMEUD)", "rule")
        return Classification(entry.action, entry.nvidia or "no immediate action in the catalogue")

    @staticmethod
    def _nvlink5(ev: GpuEvent) -> Classification:
        if ev.fatal is None:
            return Classification(FaultAction.RESET_GPU, "WORKFLOW_NVLINK5_ERR, severity not stated: treated as "
                                  "fatal", "rule")
        if not ev.fatal:
            return Classification(FaultAction.NONE, f"WORKFLOW_NVLINK5_ERR: {ev.unit} Nonfatal", "rule")
        if (ev.code == 149 and ev.unit in ("NETIR_LINK_EVT", "NETIR_LINK_DOWN", "NETIR_LINK_EVT/NETIR_LINK_DOWN")
                and ev.registers and (ev.registers[0] >> 20) & 0x3F in LINK_DOWN_IGNORED):
            return Classification(FaultAction.NONE, f"WORKFLOW_NVLINK5_ERR: {ev.unit} Fatal, link-down reason "
                           f"0b{(ev.registers[0] >> 20) & 0x3F:06b} is IGNORE", "rule")
        return Classification(FaultAction.RESET_GPU, f"WORKFLOW_NVLINK5_ERR: {ev.unit or 'unit not named'} Fatal",
                              "rule")
