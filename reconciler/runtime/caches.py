"""What the reconciler reads: informer caches of nodes, pods and remediations, with its own writes in them.

A write the reconciler made shows in its cache at once, before the watch brings it, so the next step
of the same reconcile sees it (a pod it just evicted is leaving; a remediation it just wrote is the
newest). Neither can be undone by an older copy arriving late: a remediation's revision only grows,
and a pod that has a deletionTimestamp never loses it.
"""
from __future__ import annotations

from dataclasses import replace
from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.placement import nodeset_names

from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.adapters.records import RemediationStore, Unreadable
from gpufleet.reconciler.core.faults import FaultReader
from gpufleet.reconciler.core.model import NodeView, PodView, Remediation
from gpufleet.reconciler.core.observe import node_view, pod_view
from gpufleet.reconciler.core.refills import outstanding, request_name
from gpufleet.reconciler.runtime.informers import Informer, OnChange

PAGE = 500  # items per list page


def _newer(old: Remediation | Unreadable, new: Remediation | Unreadable) -> bool:
    return not (isinstance(old, Remediation) and isinstance(new, Remediation) and new.revision < old.revision)


def _not_undeleted(old: PodView, new: PodView) -> bool:
    return not (old.deleting and not new.deleting and old.uid == new.uid)


class Caches:
    def __init__(self, spec: FleetSpec, kube: Kube, store: RemediationStore,
                 on_node: OnChange, on_pod: OnChange, on_remediation: OnChange):
        self.conditions = FaultReader.from_spec(spec.healing)  # gpufleet's conditions and other detectors'
        opt_out, slurm_ns, nodesets = spec.healing.opt_out_label, spec.slurm.namespace, nodeset_names(spec.pools)
        self.nodes: Informer[NodeView] = Informer(
            "nodes", lambda c: kube.list_page("nodes", PAGE, c), lambda rv: kube.watch("nodes", rv),
            lambda o: node_view(o, self.conditions), indexers={"pool": lambda v: [v.pool] if v.pool else []},
            on_change=on_node)
        self.pods: Informer[PodView] = Informer(
            "pods", lambda c: kube.list_page("pods", PAGE, c), lambda rv: kube.watch("pods", rv),
            lambda o: pod_view(o, opt_out, slurm_namespace=slurm_ns, nodesets=nodesets), key=lambda o: f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}",
            indexers={"node": lambda p: [p.node] if p.node else [],
                      "slurm": lambda p: [h] if (h := p.label(labels.SLINKY_POD_HOSTNAME)) else []},
            on_change=on_pod, accept=_not_undeleted)
        self.remediations: Informer[Remediation | Unreadable] = Informer(
            "remediations", lambda c: kube.list_page("remediations", PAGE, c),
            lambda rv: kube.watch("remediations", rv), store.observe,
            indexers={"node": lambda r: [r.node] if r.node else [],
                      "replacement": lambda r: [r.replacement] if isinstance(r, Remediation) and r.replacement else [],
                      "phase": lambda r: [r.phase] if isinstance(r, Remediation) else [],
                      "refill": lambda r: [request_name(r.pool, r.refill.key)]
                      if isinstance(r, Remediation) and outstanding(r) else []},
            on_change=on_remediation, accept=_newer)
        self.all = (self.nodes, self.pods, self.remediations)

    def synced(self) -> bool:
        """Every cache has its first list: nothing is decided before (a half-filled cache sees no spares)."""
        return all(i.synced.is_set() for i in self.all)

    def relist(self) -> None:
        for i in self.all:
            i.relist()

    def pods_on(self, node: str | None) -> list[PodView]:
        return self.pods.by_index("node", node) if node else []

    def remediations_in(self, pools: set[str]) -> list[Remediation]:
        return [r for r in self.remediations.values() if isinstance(r, Remediation) and r.pool in pools]

    # --- the reconciler's own writes ---------------------------------------------------------------

    def node_written(self, obj: dict | None) -> None:
        if obj and (obj.get("metadata") or {}).get("name"):
            self.nodes.put(obj["metadata"]["name"], node_view(obj, self.conditions))

    def pod_leaving(self, key: str, grace: int | None = None) -> None:
        """Write-through of a deletion asked (`grace` 0: forced, gone from the API server at once)."""
        self.pods.update(key, lambda p: replace(p, deleting=True,
                                                deletion_grace=p.deletion_grace if grace is None else grace))

    def remediation_written(self, r: Remediation) -> None:
        self.remediations.put(r.name, r)

    def remediation_deleted(self, name: str) -> None:
        self.remediations.put(name, None)

