"""Which Slurm nodes run on a Kubernetes node. Pure.

Slinky names a Slurm node after its NodeSet pod, not after the Kubernetes node, and the pod may move.
slurm-operator v1.2.1 (internal/controller/nodeset/utils/utils.go initIdentity, GetOrdinalPodName,
GetSlurmNodeName) names a NodeSet's pods `<nodeset>-<ordinal>` (the ordinal zero-padded to the NodeSet's
`ordinalPadding`, none by default), with no `slurm-worker-` prefix: pod `gpu-0` of NodeSet `gpu` runs Slurm
node `gpu-0`, its hostname. The template's `hostname`, if set, is a prefix the padded ordinal is appended to,
and a pod on the host's network takes the Kubernetes node's name; a DaemonSet-mode NodeSet's pod takes the
node's short name (GetDaemonSetPodHostname). Whatever the rule, the operator writes the result into the pod's
`nodeset.slinky.slurm.net/pod-hostname` label, so that label is the truth, read from the pods: those on the
node that carry it and that a NodeSet of the spec controls in the Slurm namespace (`observe.pod_view` drops the
label on any other pod). The operator also writes the Kubernetes node into each Slurm node's comment (JSON,
slurmcontrol.go UpdateNodeWithPodInfo); that is a cross-check, never the source.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping

from gpufleet.fleetspec import labels

from gpufleet.reconciler.core.model import PodView, SlurmNodeView


def comment_node(comment: str) -> str | None:
    """The Kubernetes node in the operator's comment `{"namespace","podName","node",...}`; None
    when the comment is empty or not the operator's."""
    try:
        data = json.loads(comment) if comment else None
    except ValueError:
        return None
    node = data.get("node") if isinstance(data, dict) else None
    return node if isinstance(node, str) and node else None


@dataclass(frozen=True)
class SlurmNames:
    names: tuple[str, ...]  # Slurm nodes whose pods run on the node, sorted
    conflicts: tuple[str, ...] = ()  # human-readable disagreements with the Slurm comments


def slurm_nodes_on(node: str, pods: Iterable[PodView],
                   slurm: Mapping[str, SlurmNodeView] | None = None) -> SlurmNames:
    """The Slurm nodes of the NodeSet pods on `node` (a terminating pod's slurmd still runs there)."""
    names: set[str] = set()
    for p in pods:
        hostname = p.label(labels.SLINKY_POD_HOSTNAME)
        if p.node == node and hostname and p.phase not in ("Succeeded", "Failed"):
            names.add(hostname)
    conflicts = []
    for name in sorted(names):
        seen = (slurm or {}).get(name)
        if seen is not None and seen.comment_node not in (None, node):
            conflicts.append(f"Slurm node {name} runs in a pod on {node}, but its comment says {seen.comment_node}")
    return SlurmNames(tuple(sorted(names)), tuple(conflicts))
