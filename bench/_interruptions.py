"""Every job interruption of Meta's Llama 3 405B run, and what each one is to gpufleet.

Source: Meta, "The Llama 3 Herd of Models" (arXiv:2407.21783), section 3.3.4 "Reliability and Operational
Challenges", table 5 ("Root-cause categorization of unexpected interruptions during a 54-day period of Llama 3
405B pre-training"): 466 job interruptions in a 54-day snapshot on 16,384 H100 GPUs, 47 planned (automated
maintenance such as firmware upgrades, operator-initiated configuration or dataset updates) and 419
unexpected, counted below row by row as the table gives them (component, Meta's category, interruptions).
Meta reports more than 90 % effective training time over it, with its own tooling. (The table as read here:
glennklockwood.com/garden/component-reliability, which reproduces it; DataCenterDynamics' report of the paper
gives the same counts for the rows it names.)

What each row is to gpufleet (`Row.line` and `Row.cost`) is this bench's reading, not the paper's: the
paper names components, not driver messages. A row gpufleet sees is given the kernel line it shows as; the
node agent's own parser and classifier (fleetspec/faults: NVIDIA's catalogue, its rules and the spec's
overrides) say what that line needs, and the real reconciler acts on it (bench/_repair_world.py). A row
gpufleet does not see (no GPU line: the network, the host, the job's own dependencies) costs the job in both
modes alike (`Cost`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from gpufleet.fleetspec.faults import FaultAction
from gpufleet.fleetspec.faults.classify import Classifier
from gpufleet.fleetspec.faults.driver import DriverMessages, GpuEvent
from gpufleet.fleetspec.faults.policy import FaultPolicy

LLAMA3_DAYS, LLAMA3_GPUS = 54, 16_384
LLAMA3_PLANNED, LLAMA3_UNEXPECTED = 47, 419


class Cost(str, Enum):
    """What an interruption gpufleet does not act on costs the job (the same with the loop and without)."""

    RESTART = "the job restarts from its checkpoint; its nodes stay"
    PLANNED = "planned: the job stops at a checkpoint and restarts; its nodes stay"
    PERSON = "the node is lost: a person drains it and swaps in another"
    GPUFLEET = "gpufleet's: what the line needs (the catalogue) decides"


@dataclass(frozen=True)
class Row:
    component: str
    category: str  # Meta's
    count: int  # interruptions in the 54 days
    cost: Cost
    lines: tuple[str, ...] = ()  # the kernel line(s) it shows as (one drawn per interruption); () = none
    why: str = ""  # the reading, where it is not obvious

    @property
    def gpufleet(self) -> bool:
        return bool(self.lines)


def _xid(code: int, text: str) -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, {text}"


# Table 5, in the paper's order; then the planned interruptions (section 3.3.4's text).
TABLE5: tuple[Row, ...] = (
    Row("Faulty GPU", "GPU", 148, Cost.GPUFLEET,
        (_xid(79, "pid=1204, GPU has fallen off the bus."),
         _xid(74, "pid=1204, NVLink: fatal error detected on link 7(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")),
        "the paper counts NVLink failures here: half off the bus (Xid 79), half NVLink (Xid 74)"),
    Row("GPU HBM3 Memory", "GPU", 72, Cost.GPUFLEET, (_xid(48, "pid=1204, An uncorrectable double bit error (DBE) "
                                                          "has been detected on GPU in the framebuffer at partition 1, "
                                                          "subpartition 0."),),
        "double-bit ECC (Xid 48)"),
    Row("Software Bug", "Dependency", 54, Cost.GPUFLEET,
        (_xid(13, "pid=1204, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
         _xid(31, "pid=1204, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_T1_7 "
                  "faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ")),
        "a bug in the training code shows on the GPU as an application Xid (13, 31): restart-app, the node stays"),
    Row("Network Switch/Cable", "Network", 35, Cost.RESTART,
        why="the fabric, not the node: the collective fails, the job restarts once the network team reroutes"),
    Row("Host Maintenance", "Unplanned Maintenance", 32, Cost.PERSON, why="the host is taken away unannounced"),
    Row("GPU SRAM Memory", "GPU", 19, Cost.GPUFLEET, (_xid(95, "pid=1204, Uncontained: SM (0x1). RST: Yes, "
                                                          "D-RST: No"),),
        "uncontained SRAM error (Xid 95)"),
    Row("GPU System Processor", "GPU", 17, Cost.GPUFLEET,
        (_xid(119, "pid=1204, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
                   "(GSP_RM_CONTROL)"),),
        "GSP RPC timeout (Xid 119)"),
    Row("NIC", "Host", 7, Cost.PERSON),
    Row("NCCL Watchdog Timeouts", "Unknown", 7, Cost.RESTART, why="no cause found: the job restarts where it was"),
    Row("Silent Data Corruption", "GPU", 6, Cost.PERSON,
        why="no driver line: the job's own checks find it, a person takes the node out"),
    Row("GPU Thermal Interface + Sensor", "GPU", 6, Cost.GPUFLEET,
        (_xid(54, "pid=1204, Auxiliary power is not connected to the GPU board"),),
        "a mechanical fault: shown as the catalogue's CHECK_MECHANICALS line (Xid 54)"),
    Row("SSD", "Host", 3, Cost.PERSON),
    Row("Power Supply", "Host", 3, Cost.PERSON),
    Row("Server Chassis", "Host", 2, Cost.PERSON),
    Row("IO Expansion Board", "Host", 2, Cost.PERSON),
    Row("Dependency", "Dependency", 2, Cost.RESTART, why="storage or another service the job needs"),
    Row("CPU", "Host", 2, Cost.PERSON),
    Row("System Memory", "Host", 2, Cost.PERSON),
)
PLANNED = Row("Planned (firmware, configuration, dataset updates)", "Planned", LLAMA3_PLANNED, Cost.PLANNED)
ROWS: tuple[Row, ...] = TABLE5 + (PLANNED,)

assert sum(r.count for r in TABLE5) == LLAMA3_UNEXPECTED


def rate_per_gpu_hour(row: Row, scale: float) -> float:
    """Interruptions of `row` per GPU-hour at Llama 3's rate times `scale` (planned ones are not scaled: a
    faultier fleet is not maintained more often)."""
    return row.count / (LLAMA3_DAYS * 24 * LLAMA3_GPUS) * (1.0 if row is PLANNED else scale)


def needs(line: str, policy: FaultPolicy) -> FaultAction:
    """What the node agent decides for `line`: its parser, then its classifier (NVIDIA's catalogue and rules,
    the spec's overrides). A fresh classifier each time: the faults fall on nodes at random, so repeats on one
    GPU (the rules' history) are not modelled."""
    (ev,) = DriverMessages().message(line)
    assert isinstance(ev, GpuEvent), ev
    return Classifier(policy).classify(ev).action


@dataclass(frozen=True)
class Interruption:
    """One interruption of the month: when, which row, the Slurm node (a job's) it strikes, the line it shows
    (its row's, drawn) and `u`, the draw that says what fixes the node (bench/_repair_world.py `truth`)."""

    t: float  # seconds from the start
    k: int
    row: Row
    host: str
    line: str | None
    u: float


def trace(pools: dict[str, tuple[int, int]], days: float, scale: float, seed: int) -> list[Interruption]:
    """A month's interruptions on the nodes in service (`pools`: name -> (nodes, GPUs per node)): Poisson at
    each row's rate per GPU-hour, a node drawn by GPUs. The same seed gives the same trace in every mode."""
    gpus = sum(n * g for n, g in pools.values())
    rates = [rate_per_gpu_hour(r, scale) * gpus / 3600.0 for r in ROWS]
    total = sum(rates)
    rng = random.Random(seed)
    names = sorted(pools)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(total)
        if t >= days * 86400.0:
            return out
        k = len(out)
        pick = random.Random(seed * 1_000_003 + k)  # a per-interruption generator: one draw cannot shift another
        row = pick.choices(ROWS, weights=rates)[0]
        pool = pick.choices(names, weights=[pools[n][0] * pools[n][1] for n in names])[0]
        host = f"{pool}-w{pick.randrange(pools[pool][0])}"
        out.append(Interruption(t, k, row, host, pick.choice(row.lines) if row.lines else None, pick.random()))


# --- faults the kernel never reports: silent corruption, GPUs that degrade before they fail, hangs ---------------
#
# Rates from the same table 5 (per GPU-hour at Llama 3's rate): "Silent Data Corruption" (6), "NCCL Watchdog
# Timeouts" (7: a collective that stopped, found by NCCL's watchdog), and, of the GPU rows that end in a crash, the
# share that warns first in the telemetry dcgm-exporter serves (row remapping pending before an HBM3 double-bit
# error, NVLink CRC and replay counters climbing before the link fails, clocks throttled on heat): that share is an
# ASSUMPTION (`SilentRow.warned`), the paper does not give it. Hangs and stragglers are what Llama 3's section 3.3.4
# and ByteDance's MegaScale (Jiang et al., NSDI 2024, https://www.usenix.org/conference/nsdi24/presentation/jiang-ziheng:
# its fault tolerance and troubleshooting find stragglers and hangs by heartbeats and monitoring, not by any error) name as the hardest to find; neither gives a rate for
# stragglers, so a straggler here is a degrading GPU's slowdown of its job until it is moved or fails.


class Silent(str, Enum):
    SDC = "silent data corruption: no error anywhere; the job's own loss curve shows it, hours later"
    DEGRADING = "a GPU that degrades before it fails: slows its job (a straggler), then crashes it"
    HANG = "a hang: every GPU of the job waits; nothing fails until a watchdog fires"


@dataclass(frozen=True)
class SilentRow:
    source: str  # table 5's row(s)
    count: float  # interruptions in the 54 days that are this kind
    kind: Silent
    warned: float = 1.0  # DEGRADING: the share of the row's crashes that warn first (ASSUMPTION)


SILENT: tuple[SilentRow, ...] = (
    SilentRow("Silent Data Corruption", 6, Silent.SDC),
    SilentRow("GPU HBM3 Memory (row remapping pending first)", 72 * 0.3, Silent.DEGRADING, 0.3),
    SilentRow("Faulty GPU, its NVLink half (CRC and replay errors climb first)", 74 * 0.3, Silent.DEGRADING, 0.3),
    SilentRow("GPU Thermal Interface + Sensor (throttles on heat first)", 6, Silent.DEGRADING, 1.0),
    SilentRow("NCCL Watchdog Timeouts", 7, Silent.HANG),
)


def silent_rate_per_gpu_hour(row: SilentRow, scale: float) -> float:
    return row.count / (LLAMA3_DAYS * 24 * LLAMA3_GPUS) * scale


@dataclass(frozen=True)
class SilentFault:
    t: float
    row: SilentRow
    host: str
    idle: bool  # it began on idle capacity (a spare, an idle node), not under a job


def silent_trace(pools: dict[str, tuple[int, int]], days: float, scale: float, seed: int,
                 idle_share: float) -> list[SilentFault]:
    """The month's silent faults: Poisson at each row's rate on the GPUs in service, a host drawn by GPUs; a
    share `idle_share` of them begins on idle capacity. The same seed, the same faults in both modes."""
    gpus = sum(n * g for n, g in pools.values())
    rng = random.Random(seed)
    hosts = [(f"{p}-w{i}", g) for p, (n, g) in sorted(pools.items()) for i in range(n)]
    weights = [g for _, g in hosts]
    out = []
    for row in SILENT:
        rate = silent_rate_per_gpu_hour(row, scale) * gpus / 3600.0
        t = rng.expovariate(rate) if rate > 0 else float("inf")
        while t < days * 86400:
            host = rng.choices(hosts, weights)[0][0]
            out.append(SilentFault(t, row, host, rng.random() < idle_share))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda f: f.t)
