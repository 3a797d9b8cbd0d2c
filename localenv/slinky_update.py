"""slurm-operator v1.2.1's NodeSet scale and update decisions, pure (the stand-in, `slinky_standin.py`, acts on them).

Each function follows the upstream function it is named after (SlinkyProject/slurm-operator at v1.2.1):

* `less` / `sort_active` / `split_active`: internal/controller/nodeset/utils/sort.go `ActivePods.Less` and
  `SplitActivePods`: which pods a scale-in (or an update) takes first: unassigned before assigned; Pending,
  then Unknown, then Running; not Ready before Ready; lower `pod-deletion-cost`; earlier `pod-deadline`
  (none is earliest); cordoned (`pod-cordon`) first; higher ordinal; the shorter Ready; the newer.
* `free_ordinals`: nodeset_sync.go `syncNodeSetPods` (StatefulSet mode): a scale-out makes the lowest ordinals
  no pod of the NodeSet holds (a terminating one included).
* `find_updated`, `split_unhealthy`: nodeset_sync.go `findUpdatedPods` (terminating pods are neither),
  utils/sort.go `SplitUnhealthyPods` (healthy: Running, Ready, not terminating; each sorted by creation).
* `split_update`: nodeset_sync.go `splitUpdatePods`: RollingUpdate condemns at most `maxUnavailable`
  (default 25 % of `replicas`, rounded up: internal/defaults/nodeset.go, mathutils.GetScaledValueFromIntOrPercent)
  healthy old pods, less the new pods not yet available and the replica slots with no live pod; OnDelete
  condemns none (a pod is made at the new revision only when someone deletes the old one).
  ScheduledUpdate (a Slurm reservation's window) is not modelled: `split_update` refuses it.
* `revision`: nodeset_history.go `getPatch`: what makes a new revision (the pod template, `ordinalPadding`,
  `oversubscribeNode`, `slurmd`, `extraConf`, `logfile`); its hash goes in the pod's `controller-revision-hash`
  label (historycontrol/utils.go SetRevision). Upstream hashes the ControllerRevision; any stable hash of the
  same fields changes when, and only when, upstream's does.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

NODESET_PREFIX = "nodeset.slinky.slurm.net/"  # api/v1beta1/well_known.go
POD_CORDON_ANNOTATION = NODESET_PREFIX + "pod-cordon"
POD_DELETION_COST_ANNOTATION = NODESET_PREFIX + "pod-deletion-cost"
POD_DEADLINE_ANNOTATION = NODESET_PREFIX + "pod-deadline"
REVISION_LABEL = "controller-revision-hash"  # k8s.io/kubernetes/pkg/controller/history ControllerRevisionHashLabel
ROLLING_UPDATE, ON_DELETE, SCHEDULED_UPDATE = "RollingUpdate", "OnDelete", "ScheduledUpdate"
DEFAULT_MAX_UNAVAILABLE = "25%"  # internal/defaults/nodeset.go DefaultNodeSetRollingUpdateMaxUnavailable
_ORDINAL = re.compile(r"(.*)-([0-9]+)$")  # utils/utils.go nodesetPodRegex
_PHASE_WEIGHT = {"Pending": 0, "Unknown": 1, "Running": 2}  # sort.go podPhaseToWeight (others: 0)


@dataclass(frozen=True)
class PodFacts:
    """What the operator's decisions read of a pod. Times are seconds (epoch); None where Kubernetes has none."""

    name: str
    node_name: str = ""
    phase: str = "Pending"
    ready: bool = False
    ready_since: float | None = None  # the Ready condition's lastTransitionTime
    created: float | None = None
    annotations: tuple[tuple[str, str], ...] = ()
    revision: str = ""
    terminating: bool = False

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)

    @property
    def healthy(self) -> bool:
        """podutils.IsHealthy: Running and Ready, not terminating."""
        return self.phase == "Running" and self.ready and not self.terminating


def ordinal(name: str) -> int:
    """utils.go GetOrdinal: the number after the last '-', or -1."""
    m = _ORDINAL.match(name)
    if not m:
        return -1
    value = int(m.group(2))
    return value if value < 2**31 else -1  # strconv.ParseInt(..., 10, 32) fails: -1


def deletion_cost(p: PodFacts) -> int:
    """structutils.GetNumberFromAnnotations: an int32; '+10', '008', junk: 0."""
    v = p.annotation(POD_DELETION_COST_ANNOTATION)
    if not v or not (v[0] == "-" or v == "0" or "1" <= v[0] <= "9"):
        return 0
    try:
        n = int(v, 10)
    except ValueError:
        return 0
    return n if -2**31 <= n < 2**31 else 0


def deadline(p: PodFacts) -> float | None:
    """structutils.GetTimeFromAnnotations: RFC 3339, None (Go's zero time: before every other) when absent or bad."""
    v = p.annotation(POD_DEADLINE_ANNOTATION)
    if not v:
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def cordoned(p: PodFacts) -> bool:
    """structutils.GetBoolFromAnnotations (strconv.ParseBool) of pod-cordon, as the sort reads it."""
    return (p.annotation(POD_CORDON_ANNOTATION) or "") in ("1", "t", "T", "TRUE", "true", "True")


def _after_or_zero(t1: float | None, t2: float | None) -> bool:
    """sort.go afterOrZero: t1 after t2; a zero time counts as after any other."""
    if t1 is None or t2 is None:
        return t1 is None
    return t1 > t2


def less(p1: PodFacts, p2: PodFacts) -> bool:
    """sort.go ActivePods.Less: True when p1 is to be deleted before p2."""
    if p1.node_name != p2.node_name and (not p1.node_name or not p2.node_name):
        return not p1.node_name
    w1, w2 = _PHASE_WEIGHT.get(p1.phase, 0), _PHASE_WEIGHT.get(p2.phase, 0)
    if w1 != w2:
        return w1 < w2
    if p1.ready != p2.ready:
        return not p1.ready
    c1, c2 = deletion_cost(p1), deletion_cost(p2)
    if c1 != c2:
        return c1 < c2
    d1, d2 = deadline(p1), deadline(p2)
    if d1 != d2:
        return d2 is not None and (d1 is None or d1 < d2)  # time.Before, the zero time earliest
    k1, k2 = cordoned(p1), cordoned(p2)
    if k1 != k2:
        return k1
    o1, o2 = ordinal(p1.name), ordinal(p2.name)
    if o1 != o2:
        return o1 > o2
    if p1.ready and p2.ready:
        r1, r2 = p1.ready_since, p2.ready_since
        if r1 != r2:
            return _after_or_zero(r1, r2)
    if p1.created != p2.created:
        return _after_or_zero(p1.created, p2.created)
    return False


def sort_active(pods: list[PodFacts]) -> list[PodFacts]:
    """sort.Sort(ActivePods(pods)): the first ones the operator deletes first."""
    return sorted(pods, key=functools.cmp_to_key(lambda a, b: -1 if less(a, b) else (1 if less(b, a) else 0)))


def split_active(pods: list[PodFacts], n: int) -> tuple[list[PodFacts], list[PodFacts]]:
    """SplitActivePods: the first `n` (clamped) of the sorted pods, and the rest."""
    ordered = sort_active(pods)
    pivot = max(0, min(n, len(ordered)))
    return ordered[:pivot], ordered[pivot:]


def free_ordinals(used: set[int], count: int) -> list[int]:
    """syncNodeSetPods' scale-out: the lowest `count` ordinals not in `used`."""
    out: list[int] = []
    i = 0
    while len(out) < count:
        if i not in used:
            out.append(i)
        i += 1
    return out


def find_updated(pods: list[PodFacts], revision: str) -> tuple[list[PodFacts], list[PodFacts]]:
    """findUpdatedPods: (new, old) among the pods not terminating."""
    live = [p for p in pods if not p.terminating]
    return [p for p in live if p.revision == revision], [p for p in live if p.revision != revision]


def _by_creation(p: PodFacts) -> tuple[float, str]:
    return (p.created if p.created is not None else float("-inf"), p.name)  # PodsByCreationTimestamp


def split_unhealthy(pods: list[PodFacts]) -> tuple[list[PodFacts], list[PodFacts]]:
    """SplitUnhealthyPods: (unhealthy, healthy), each by creation time then name."""
    return (sorted((p for p in pods if not p.healthy), key=_by_creation),
            sorted((p for p in pods if p.healthy), key=_by_creation))


def scaled(value: int | str | None, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true), 1 when it is invalid
    (mathutils.GetScaledValueFromIntOrPercent's default as splitUpdatePods passes it)."""
    if value is None:
        value = DEFAULT_MAX_UNAVAILABLE
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        return 1  # intstr: "string is not a percentage"
    try:
        return math.ceil(int(text[:-1]) * total / 100)
    except ValueError:
        return 1


def strategy(nodeset_spec: dict[str, Any]) -> tuple[str, int | str | None]:
    """spec.updateStrategy's type (RollingUpdate when unset: syncUpdate's default) and maxUnavailable."""
    us = nodeset_spec.get("updateStrategy") or {}
    return us.get("type") or ROLLING_UPDATE, (us.get("rollingUpdate") or {}).get("maxUnavailable")


def split_update(nodeset_spec: dict[str, Any], pods: list[PodFacts], revision: str,
                 now: float) -> tuple[list[PodFacts], list[PodFacts]]:
    """splitUpdatePods (StatefulSet mode): (the pods to delete for the update, the pods to keep).

    A new pod is available once Ready for `minReadySeconds` (podutil.IsPodAvailable)."""
    kind, max_unavailable = strategy(nodeset_spec)
    if kind == ON_DELETE:
        return [], []
    if kind == SCHEDULED_UPDATE:
        raise ValueError("ScheduledUpdate (a Slurm reservation's window) is not modelled by the stand-in")
    new, old = find_updated(pods, revision)
    _, healthy_old = split_unhealthy(old)
    replicas = nodeset_spec.get("replicas")
    total = int(replicas if replicas is not None else 1)
    unavailable = max(0, min(total - len(new) - len(old), total))
    min_ready = int(nodeset_spec.get("minReadySeconds") or 0)
    for p in new:
        available = p.ready and (min_ready == 0 or (p.ready_since is not None and p.ready_since + min_ready <= now))
        if not available:
            unavailable += 1
    budget = scaled(max_unavailable, total)
    remaining = max(0, min(budget - unavailable, budget))
    condemned, kept_old = split_active(healthy_old, remaining)
    return condemned, list(new) + kept_old


def revision(nodeset: dict[str, Any]) -> str:
    """A hash of what getPatch records for a NodeSet revision (the fields that make an update)."""
    spec = nodeset.get("spec") or {}
    fields = {"template": spec.get("template") or {}, "ordinalPadding": spec.get("ordinalPadding") or 0,
              "oversubscribeNode": spec.get("oversubscribeNode") or False}
    for key in ("slurmd", "extraConf", "logfile"):
        if key in spec:
            fields[key] = spec[key]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
