"""GPU telemetry as data: the DCGM fields gpufleet reads through dcgm-exporter, and the thresholds past which a
node is degraded, each row citing the NVIDIA (or DCGM) page it follows.

The fields are dcgm-exporter's metrics: a metric is named after its DCGM field (the counters CSV's first
column) and carries the labels `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName` and `Hostname` (the node's
name: NODE_NAME in Kubernetes), and, with `--kubernetes`, the `pod`, `namespace`, `container` of the pod using
the GPU (github.com/NVIDIA/dcgm-exporter at tag 4.5.3-4.8.2, commit 691c927: internal/pkg/rendermetrics/
render_metrics.go `gpuMetricsFormat`, internal/pkg/hostname/hostname.go, internal/pkg/transformation/const.go
and kubernetes.go). The field ids are DCGM's (github.com/NVIDIA/go-dcgm at ec245c09fe3e, the version
dcgm-exporter 4.5.3-4.8.2's go.mod pins: pkg/dcgm/const_fields.go); a condition gpufleet writes for a
threshold carries the id as its code (`Dcgm396`, as an Xid's is `Xid79`). The exporter's default counters
(etc/default-counters.csv) leave ROW_REMAP_PENDING, the ECC totals, the NVLink error totals, SM_ACTIVE and the
clock event reasons out (commented or absent): a fleet that wants these rows adds them to its counters CSV
(`-f`), as `REQUIRED_COUNTERS` lists.

Each threshold row says what crossing it needs (a `FaultAction`) and when the running job moves:
- `checkpoint`: now, through the heal every fault takes (the job gets SIGTERM and the grace period to
  checkpoint, is requeued, the node is replaced by a spare and enters the repair loop), before the GPU crashes it;
- `job-boundary`: the node is drained in Slurm (no new job lands; DRAIN lets the running job finish) and healed
  once it runs no job: NVIDIA's "DRAIN_AND_RESET" (the Xid catalogue's WORKFLOW_XID_48 with 63/64 and Xid 154's
  "Drain and Reset": docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
A pure module: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .catalogue import FaultAction, When

DCGM_EXPORTER = "github.com/NVIDIA/dcgm-exporter 4.5.3-4.8.2"
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")  # render_metrics.go gpuMetricsFormat
POD_LABELS = ("pod", "namespace", "container")  # transformation/const.go (without --use-old-namespace)
HOSTNAME = "Hostname"


@dataclass(frozen=True)
class DcgmField:
    name: str      # the metric's name, as the counters CSV spells it
    id: int        # DCGM's field id (go-dcgm pkg/dcgm/const_fields.go)
    prom_type: str  # gauge | counter, as the counters CSV declares it
    help: str      # the CSV's help text (dcp-metrics-included.csv, default-counters.csv)


FIELDS: dict[str, DcgmField] = {f.name: f for f in (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz)."),
    DcgmField("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 112, "gauge",
              "Current clock throttle reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)."),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C)."),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "counter", "Total number of PCIe retries."),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %)."),
    DcgmField("DCGM_FI_DEV_XID_ERRORS", 230, "gauge", "Value of the last XID error encountered."),
    DcgmField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 310, "counter", "Total number of single-bit volatile ECC errors."),
    DcgmField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, "counter", "Total number of double-bit volatile ECC errors."),
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 393, "counter",
              "Number of remapped rows for uncorrectable errors"),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 394, "counter", "Number of remapped rows for correctable errors"),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, "gauge", "Whether remapping of rows has failed"),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING", 396, "gauge", "Whether remapping of rows is pending"),
    DcgmField("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 409, "counter",
              "Total number of NVLink flow-control CRC errors."),
    DcgmField("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, "counter", "Total number of NVLink retries."),
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", 1002, "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
)}
BY_ID = {f.id: f for f in FIELDS.values()}

# DCGM_CLOCKS_EVENT_REASON_* (go-dcgm pkg/dcgm/dcgm_fields.h): the bits that slow a GPU for a hardware reason
# (HW_SLOWDOWN, HW_THERMAL, HW_POWER_BRAKE) or a thermal one (SW_THERMAL). SW_POWER_CAP (0x4) and GPU_IDLE (0x1)
# are the normal life of a busy or an idle GPU and never count.
HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80
SLOWDOWN_BITS = HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
SLOWDOWN_NAMES = {HW_SLOWDOWN: "HW_SLOWDOWN", SW_THERMAL: "SW_THERMAL", HW_THERMAL: "HW_THERMAL",
                  HW_POWER_BRAKE: "HW_POWER_BRAKE"}


def slowdown_reasons(mask: float) -> str:
    """`HW_THERMAL|HW_POWER_BRAKE` for a mask; "" when none of the slowing bits is set."""
    m = int(mask)
    return "|".join(n for bit, n in SLOWDOWN_NAMES.items() if m & bit)


class Check(str, Enum):
    AT_LEAST = "at-least"      # the latest value is at least `limit`
    INCREASE = "increase"      # the counter rose by at least `limit` within `window_seconds`
    BITS_HELD = "bits-held"    # any of the SLOWDOWN_BITS set in every sample for `window_seconds`


@dataclass(frozen=True)
class Threshold:
    field: str
    test: Check
    limit: float
    action: FaultAction
    when: When
    meaning: str     # what crossing it means, for the page and `gpufleet why`
    source: str      # the page or file it follows
    window_seconds: int = 0

    @property
    def code(self) -> int:
        return FIELDS[self.field].id

    def describe(self) -> str:
        if self.test is Check.INCREASE:
            return f"rose by >= {self.limit:g} within {self.window_seconds}s"
        if self.test is Check.BITS_HELD:
            return f"slowdown reasons held for {self.window_seconds}s"
        return f">= {self.limit:g}"


_MEM = "docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt"
_DCGM_HEALTH = "NVIDIA DCGM's health watches (DcgmHealthWatch.cpp, limits in DcgmGpuHardwareLimits.h)"

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold("DCGM_FI_DEV_ROW_REMAP_FAILURE", Check.AT_LEAST, 1, FaultAction.CONTACT_SUPPORT, When.CHECKPOINT,
              "a row remap failed: the memory bank has no spare row left",
              f"{_MEM} 'RMA Policy Thresholds for Row-Remapping': a remapping failure is an RMA"),
    Threshold("DCGM_FI_DEV_ROW_REMAP_PENDING", Check.AT_LEAST, 1, FaultAction.RESET_GPU, When.CHECKPOINT,
              "a row remap is pending: it takes effect only at the next GPU reset",
              f"{_MEM} 'Error Recovery and Response Flags': row-remapping pending 'will happen at the next GPU "
              "reset'; nvmlDeviceGetRemappedRows: 'A reset will be required to actually remap the row'. NVIDIA lets "
              "unaffected work run on; gpufleet moves the job at a checkpoint, as the memory that needed the remap "
              "has already had an uncorrectable error"),
    Threshold("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Check.INCREASE, 1, FaultAction.RESET_GPU, When.JOB_BOUNDARY,
              "an uncorrectable (double-bit) ECC error",
              "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: Xid 48 (DBE) with 63/64 is "
              "DRAIN_AND_RESET; a GPU reset retires or remaps the page", window_seconds=3600),
    Threshold("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", Check.INCREASE, 6001, FaultAction.RESET_GPU,
              When.JOB_BOUNDARY, "NVLink CRC flit errors above DCGM's health limit",
              f"{_DCGM_HEALTH}: DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100.0 ('CRC errors only matter at rates of 100+ "
              "per second'), here more than 6000 in 60 s", window_seconds=60),
    Threshold("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", Check.INCREASE, 1, FaultAction.RESET_GPU,
              When.JOB_BOUNDARY, "NVLink replays climbing",
              f"{_DCGM_HEALTH}: DCGM_LIMIT_MAX_NVLINK_ERROR 1: a replay or recovery error within the minute "
              "fails the NVLink watch",
              window_seconds=60),
    Threshold("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Check.INCREASE, 9, FaultAction.RESET_GPU, When.JOB_BOUNDARY,
              "PCIe replays above DCGM's health limit",
              f"{_DCGM_HEALTH}: DCGM_LIMIT_MAX_PCIREPLAY_RATE 8 ('8 replays per minute is the maximum "
              "recommended by RM'; more is DCGM_FR_PCI_REPLAY_RATE)",
              window_seconds=60),
    Threshold("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", Check.BITS_HELD, 1, FaultAction.CONTACT_SUPPORT, When.JOB_BOUNDARY,
              "held in a hardware or thermal slowdown (the cooling, power or board, not the job)",
              "go-dcgm dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_HW_SLOWDOWN/HW_THERMAL/HW_POWER_BRAKE/SW_THERMAL "
              "('clocks reduced by a factor of 2 or more'); docs.nvidia.com/deploy/nvml-api "
              "nvmlClocksEventReasons: a reset does not cool a GPU, a person looks", window_seconds=600),
)

# The fields the thresholds, the hang and the straggler rules read: what a fleet's counters CSV must include.
REQUIRED_COUNTERS = tuple(sorted({t.field for t in THRESHOLDS} | {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"}))


def describe_field(code: int) -> str:
    f = BY_ID.get(code)
    return f.name if f else f"DCGM field {code}"


def threshold_for(code: int) -> Threshold | None:
    return next((t for t in THRESHOLDS if t.code == code), None)
