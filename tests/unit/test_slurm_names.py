"""Which Slurm nodes run on a Kubernetes node: from Slinky's NodeSet pods, never from names (pure)."""
from __future__ import annotations

import json

import pytest

from gpufleet.fleetspec import labels
from gpufleet.reconciler.core.slurm_names import comment_node, slurm_nodes_on
from gpufleet.reconciler.core.model import PodView, SlurmNodeView


def worker(hostname: str, node: str | None, phase: str = "Running") -> PodView:
    return PodView("slurm", f"slurm-worker-{hostname}", node, phase, ((labels.SLINKY_POD_HOSTNAME, hostname),))


@pytest.mark.parametrize("pods,node,names", [
    ([worker("gpu-0", "ip-10-0-0-7")], "ip-10-0-0-7", ("gpu-0",)),               # the pod's hostname, not the node's
    ([worker("gpu-0", "ip-10-0-0-7")], "gpu-0", ()),                             # a node named like a Slurm node is not it
    ([worker("gpu-1", "n1"), worker("gpu-0", "n1")], "n1", ("gpu-0", "gpu-1")),  # two NodeSets on one node, sorted
    ([worker("gpu-0", "n1", "Succeeded")], "n1", ()),                            # a finished pod runs no slurmd
    ([worker("gpu-0", None)], "n1", ()),                                         # not scheduled yet
    ([PodView("ml", "train-0", "n1")], "n1", ()),                                # only Kubernetes workloads: no Slurm node
])
def test_slurm_nodes_come_from_the_pods_on_the_node(pods, node, names):
    assert slurm_nodes_on(node, pods).names == names


def test_the_operators_comment_cross_checks_and_the_pod_wins():
    comment = json.dumps({"namespace": "slurm", "podName": "slurm-worker-gpu-0", "node": "n-old",
                          "nodeSetName": "gpu", "nodeSetUID": "u"})
    assert comment_node(comment) == "n-old" and comment_node("") is None and comment_node("a person's note") is None
    seen = {"gpu-0": SlurmNodeView("gpu-0", comment_node=comment_node(comment))}
    r = slurm_nodes_on("n-new", [worker("gpu-0", "n-new")], seen)
    assert r.names == ("gpu-0",) and "its comment says n-old" in r.conflicts[0]
    assert slurm_nodes_on("n-old", [worker("gpu-0", "n-old")], seen).conflicts == ()
