"""Escalation rules as data: when an Xid, by its register bits or by what came before it on the same GPU,
needs more (or less) than its catalogue row says. Pure.

Each rule is a row of `RULES`, with the page or file it follows. One function, `escalate`, applies them
to an event and the GPU's recent history; the node agent's classifier calls it with the kernel log it has
read (fleetspec/faults/classify.py), and the repair loop with the node's remediation records, which
outlive a reboot's new kernel log (reconciler/core/repair.py). The rows are tried in order; the first
that matches decides, so the escalations come before the one that lowers an action.

Sources, pinned:
- NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, WORKFLOW_NVLINK_ERR
  (Xid 74: "The first, third, fourth and fifth registers are valid for bits analysis", with what each bit
  means), as quoted in NVSentinel's docs/designs/024-workflow-nvlink-err.md;
- NVSentinel's health-events-analyzer rules, github.com/NVIDIA/NVSentinel
  distros/kubernetes/nvsentinel/charts/health-events-analyzer/values.yaml at commit
  09dfc8f9060a99ad1881887154a9440270de8fd3 (`XID74Reg0SoloNVLinkError`, `XID74Reg0ECCParityError`,
  `XID74Reg2Bit13Set`, ..., `RepeatedXIDErrorOnSameGPU`): each counts within 24 h on the same GPU, in
  bursts of 180 s (events that close are one occurrence).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .catalogue import FaultAction

DAY = 86400.0
BURST = 180.0  # NVSentinel's burst window: XIDs this close to the one before on a GPU are one occurrence
CATALOGUE_74 = ("docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html WORKFLOW_NVLINK_ERR; "
                "NVIDIA/NVSentinel docs/designs/024-workflow-nvlink-err.md")
ANALYZER = ("NVIDIA/NVSentinel@09dfc8f9060a99ad1881887154a9440270de8fd3 "
            "distros/kubernetes/nvsentinel/charts/health-events-analyzer/values.yaml")


@dataclass(frozen=True)
class Seen:
    """An Xid on one GPU: the one being judged, or one before it (seconds on one clock)."""

    code: int
    at: float
    action: FaultAction = FaultAction.NONE  # what it needed (a fatal Xid is one that took the node out)
    registers: tuple[int, ...] = ()
    link: int | None = None


@dataclass(frozen=True)
class RegisterRule:
    """Xid 74 by its register bits: any of `bits` set in register `register` (0-based), seen `times` times on
    the same GPU within the window (on the same link when `same_link`); `solo`: no other bit of any register
    set, and no other Xid on the GPU within the window."""

    name: str
    register: int
    bits: tuple[int, ...]
    action: FaultAction
    why: str
    source: str
    times: int = 1
    same_link: bool = False
    solo: bool = False
    only: bool = False  # only these bits are set, in every register (a line that says nothing else)
    code: int = 74

    def mask(self) -> int:
        return sum(1 << b for b in self.bits)

    def hits(self, s: Seen) -> bool:
        return s.code == self.code and len(s.registers) > self.register and bool(s.registers[self.register] & self.mask())


@dataclass(frozen=True)
class RepeatRule:
    """`count` occurrences (bursts) on one GPU within the window: of `codes`, or, with `codes` empty, of every
    Xid that took the node out (a fatal one)."""

    name: str
    codes: frozenset[int]
    count: int
    action: FaultAction
    why: str
    source: str
    window: float = DAY
    burst: float = BURST

    def counts(self, s: Seen) -> bool:
        return s.code in self.codes if self.codes else s.action.remediates


Rule = RegisterRule | RepeatRule

RULES: tuple[Rule, ...] = (
    # --- Xid 74, register 0 (the catalogue's "first register") ---------------------------------------------
    RegisterRule("XID74Reg0HardwareIssue", 0, (8, 9, 12, 16, 17, 24, 28), FaultAction.CONTACT_SUPPORT,
                 "register 0 bits 8, 9, 12, 16, 17, 24, 28: could be the hardware; check the link's mechanical "
                 "connections, run field diagnostics if it persists", CATALOGUE_74),
    RegisterRule("XID74Reg0SoloNVLinkError", 0, (1, 20), FaultAction.CONTACT_SUPPORT,
                 "register 0 bit 1 or 20 alone: a sympathetic error with nothing it follows, unexpected; report a "
                 "bug", CATALOGUE_74 + "; " + ANALYZER, solo=True),
    RegisterRule("XID74Reg0SignalIntegrityError", 0, (21, 22), FaultAction.CONTACT_SUPPORT,
                 "register 0 bit 21 or 22 alone: a marginal channel (signal integrity); check the link's mechanical "
                 "connections, run field diagnostics", CATALOGUE_74, solo=True),
    RegisterRule("XID74Reg0ECCParityError", 0, (4, 5), FaultAction.CONTACT_SUPPORT,
                 "register 0 bit 4 or 5 more than twice on the same link: likely the hardware (ECC/parity)",
                 CATALOGUE_74 + "; " + ANALYZER, times=3, same_link=True),
    RegisterRule("XID74Reg0Bit27Or29Set", 0, (27, 29), FaultAction.CONTACT_SUPPORT,
                 "register 0 bit 27 or 29 repeated on the GPU: unexpected; report a bug", CATALOGUE_74, times=2),
    # --- register 2 (the third) ---------------------------------------------------------------------------
    RegisterRule("XID74Reg2Bit13Set", 2, (13,), FaultAction.CONTACT_SUPPORT,
                 "register 2 bit 13: not expected in production; report a bug", CATALOGUE_74 + "; " + ANALYZER),
    RegisterRule("RepeatedXID74Reg2HardwareIssue", 2, (0, 1, 2, 6), FaultAction.CONTACT_SUPPORT,
                 "register 2 bits 0, 1, 2, 6 more than twice on the same link: likely the hardware (ECC/parity)",
                 CATALOGUE_74, times=3, same_link=True),
    RegisterRule("RepeatedXID74Reg2Bit16Or19Set", 2, (16, 19), FaultAction.CONTACT_SUPPORT,
                 "register 2 bit 16 or 19 repeated on the GPU: run field diagnostics and report a bug",
                 CATALOGUE_74 + "; " + ANALYZER, times=2),
    RegisterRule("RepeatedXID74Reg2Bit17Or18Set", 2, (17, 18), FaultAction.CONTACT_SUPPORT,
                 "register 2 bit 17 or 18 repeated on the GPU: report a bug", CATALOGUE_74, times=2),
    # --- register 3 (the fourth) --------------------------------------------------------------------------
    RegisterRule("XID74Reg3UnexpectedError", 3, (16, 17), FaultAction.CONTACT_SUPPORT,
                 "register 3 bit 16 or 17 alone: a sympathetic error with nothing it follows; report a bug",
                 CATALOGUE_74, solo=True),
    # --- register 4 (the fifth) ---------------------------------------------------------------------------
    RegisterRule("XID74Reg4HardwareIssue", 4, (18, 19, 21, 22, 24, 25, 27, 28), FaultAction.CONTACT_SUPPORT,
                 "register 4 ECC/parity bits more than twice on the same link: likely the hardware", CATALOGUE_74,
                 times=3, same_link=True),
    # --- Xid 48 and any fatal Xid, repeated on one GPU ------------------------------------------------------
    RepeatRule("RepeatedXID48OnSameGPU", frozenset({48}), 2, FaultAction.CONTACT_SUPPORT,
               "a second double-bit ECC error on the same GPU within 24 h: its memory is failing, not one "
               "event (gpufleet's rule: NVSentinel's RepeatedXIDErrorOnSameGPU counts every Xid, 5 in 24 h; for "
               "48, whose catalogue row already resets the GPU, a repeat after that reset is the hardware)",
               ANALYZER + " RepeatedXIDErrorOnSameGPU; docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html "
               "WORKFLOW_XID_48"),
    RepeatRule("RepeatedFatalXIDOnSameGPU", frozenset(), 5, FaultAction.CONTACT_SUPPORT,
               "five or more fatal XIDs (bursts of 180 s) on the same GPU within 24 h: resets and reboots are not "
               "fixing it", ANALYZER + " RepeatedXIDErrorOnSameGPU"),
    # --- lowering: what the catalogue says needs nothing ------------------------------------------------------
    RegisterRule("XID74Reg4ThresholdOnly", 4, (20, 23, 26, 29), FaultAction.NONE,
                 "register 4 bits 20, 23, 26, 29 only: an ECC threshold exceeded with no uncorrectable error; "
                 "continue operation", CATALOGUE_74, only=True),
)


@dataclass(frozen=True)
class Escalation:
    rule: Rule
    action: FaultAction

    @property
    def nvidia(self) -> str:
        return f"{self.rule.name}: {self.rule.why}"


def bursts(times: Sequence[float], burst: float) -> int:
    """Occurrences among `times`: a time within `burst` of the one before is the same occurrence."""
    ts = sorted(times)
    return (1 + sum(1 for a, b in zip(ts, ts[1:]) if b - a > burst)) if ts else 0


def _others_clear(rule: RegisterRule, s: Seen) -> bool:
    """No bit set but the rule's own, in any register."""
    return all((v & ~rule.mask()) == 0 if i == rule.register else v == 0 for i, v in enumerate(s.registers))


def _matches(rule: Rule, ev: Seen, before: Sequence[Seen]) -> bool:
    recent = [s for s in before if ev.at - rule_window(rule) <= s.at <= ev.at]
    if isinstance(rule, RepeatRule):
        if not rule.counts(ev):
            return False
        return bursts([s.at for s in recent if rule.counts(s)] + [ev.at], rule.burst) >= rule.count
    if not rule.hits(ev):
        return False
    if rule.only and not _others_clear(rule, ev):
        return False
    if rule.solo and (not _others_clear(rule, ev) or any(s.code != rule.code for s in recent)):
        return False
    if rule.times > 1:
        same = [s for s in recent if rule.hits(s) and (not rule.same_link or s.link == ev.link)]
        return len(same) + 1 >= rule.times
    return True


def rule_window(rule: Rule) -> float:
    return rule.window if isinstance(rule, RepeatRule) else DAY


def escalate(ev: Seen, before: Sequence[Seen], rules: Sequence[Rule] = RULES) -> Escalation | None:
    """The first rule the event matches, given the Xids seen before it on the same GPU; None: its own
    row (and NVIDIA's other rules) decide."""
    for rule in rules:
        if _matches(rule, ev, before):
            return Escalation(rule, rule.action)
    return None
