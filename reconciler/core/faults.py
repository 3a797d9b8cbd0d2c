"""Read a GPU fault from a node condition: gpufleet's own or another detector's. Pure.

gpufleet's own conditions (`healing.condition_types`, written by the node agent or inject-fault) say
what the fault needs in their message (fleetspec/faults/condition.py); one without that header takes
the effective catalogue's action for its code. Another detector's condition (`healing.condition_sources`)
is read as its source says: the code from its reason or message (the operator's pattern, matched on a
bounded prefix of the text), or the driver's own lines in the message, classified as the agent would.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.faults import FaultAction, Kind
from gpufleet.fleetspec.faults.catalogue import When
from gpufleet.fleetspec.faults.classify import Classifier
from gpufleet.fleetspec.faults.condition import parse_condition
from gpufleet.fleetspec.faults.driver import DriverMessages, GpuEvent
from gpufleet.fleetspec.faults.policy import FaultPolicy
from gpufleet.fleetspec.models import ConditionSource, HealingSpec

from gpufleet.reconciler.core.model import Fault

_LEGACY = re.compile(r"(?i)xid[ _-]?([0-9]{1,6})(?![0-9])")  # conditions from before the header, or by hand
REASON_MAX, MESSAGE_MAX = 256, 1024


def _digits(text: str | None) -> int | None:
    return int(text) if text and len(text) <= 6 and all("0" <= c <= "9" for c in text) else None


@dataclass(frozen=True)
class FaultReader:
    own: tuple[str, ...] = (labels.GPU_CONDITION,)
    sources: tuple[ConditionSource, ...] = ()
    policy: FaultPolicy = field(default_factory=FaultPolicy)

    @classmethod
    def from_spec(cls, healing: HealingSpec) -> FaultReader:
        return cls(tuple(healing.condition_types), tuple(healing.condition_sources), FaultPolicy.from_spec(healing))

    @classmethod
    def of(cls, conditions: FaultReader | Iterable[str]) -> FaultReader:
        """A reader, or condition types in gpufleet's format read with NVIDIA's catalogue as is."""
        return conditions if isinstance(conditions, FaultReader) else cls(tuple(conditions))

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self.own) | {s.type for s in self.sources}

    def read(self, cond: dict[str, Any], since) -> Fault | None:
        """The fault a condition signals, or None (healthy, or not a GPU fault it can read)."""
        ctype = cond.get("type")
        if ctype in self.own:
            return self._own(cond, since) if cond.get("status") == "False" else None
        src = next((s for s in self.sources if s.type == ctype), None)
        if src is None or cond.get("status") != src.fault_status:
            return None
        reason, message = str(cond.get("reason") or "")[:REASON_MAX], str(cond.get("message") or "")
        if src.read == "kernel-log":
            return self._kernel_log(src, message, since)
        return self._pattern(src, reason, message, since)

    def _own(self, cond: dict[str, Any], since) -> Fault | None:
        reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
        sig = parse_condition(reason, message)
        if sig is not None:
            action = sig.action or self.policy.action(sig.kind, sig.code, fatal=True)
            return Fault(sig.code, message, since, sig.kind, action, sig.pci, sig.gpu_instance,
                         sig.compute_instance, cond.get("type", ""), when=sig.when if sig.action is not None else
                         When.CHECKPOINT)
        m = _LEGACY.search(reason[:REASON_MAX]) or _LEGACY.search(message[:MESSAGE_MAX])
        if m is None:
            return None
        code = int(m.group(1))
        return Fault(code, message, since, Kind.XID, self.policy.action(Kind.XID, code), source=cond.get("type", ""))

    def _pattern(self, src: ConditionSource, reason: str, message: str, since) -> Fault | None:
        matches = []
        for pattern, text in ((src.reason_pattern, reason), (src.message_pattern, message[:MESSAGE_MAX])):
            if pattern:
                m = _compiled(pattern).search(text)
                if m is None:
                    return self._fixed(src, message, since)
                matches.append(m)
        groups: dict[str, str] = {}
        for m in matches:
            groups.update({k: v for k, v in m.groupdict().items() if v and k not in groups})
        code = _digits(groups.get("code"))
        if code is None:
            return self._fixed(src, message, since)
        action = src.actions.get(code) or self.policy.action(src.kind, code, fatal=True)
        pci = groups.get("pci", "")[:16]
        return Fault(code, message, since, src.kind, action, pci, source=src.type)

    def _fixed(self, src: ConditionSource, message: str, since) -> Fault | None:
        """A fault of this source whose code cannot be read: its own action, if it names one."""
        if src.kind is Kind.GPU_LOST:
            return Fault(0, message, since, Kind.GPU_LOST, src.action or self.policy.action(Kind.GPU_LOST, 0),
                         source=src.type)
        if src.action is None:
            return None
        return Fault(0, message, since, src.kind, src.action, source=src.type)

    def _kernel_log(self, src: ConditionSource, message: str, since) -> Fault | None:
        """The driver's lines in the message (node-problem-detector's kmsg monitor copies them): the
        event that needs most decides."""
        parser, classifier = DriverMessages(), Classifier(self.policy)
        best: tuple[FaultAction, GpuEvent, When] | None = None
        for line in message[:8 * MESSAGE_MAX].split("\n")[:32]:
            for ev in parser.feed_message(line):
                if not isinstance(ev, GpuEvent):
                    continue
                said = classifier.classify(ev)
                action, when = (src.actions[ev.code], When.CHECKPOINT) if ev.code in src.actions else \
                    (said.action, said.when)
                if best is None or action.rank > best[0].rank:
                    best = (action, ev, when)
        if best is None:
            return self._fixed(src, message, since)
        action, ev, when = best
        return Fault(ev.code, message, since, ev.kind, action, ev.pci, ev.gpu_instance, ev.compute_instance, src.type,
                     when=when)


_CACHE: dict[str, re.Pattern] = {}


def _compiled(pattern: str) -> re.Pattern:
    rx = _CACHE.get(pattern)
    if rx is None:
        rx = _CACHE[pattern] = re.compile(pattern)
    return rx
