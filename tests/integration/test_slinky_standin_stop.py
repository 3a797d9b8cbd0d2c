"""The Slinky stand-in as a process under the local environment's supervisor: SIGTERM ends it within its grace
even while its pass waits on Slurm, as slurm-operator's manager (controller-runtime) cancels its context on
SIGTERM and the reconcile in flight returns. `gpufleet local down` used to SIGKILL it 10 s after its SIGTERM."""
from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from dataclasses import asdict

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels
from gpufleet.paths import PROJECT_DIR
from gpufleet.waiting import wait_for
from localenv import slinky_conf
from localenv.fake_nodes import fake_node
from localenv.ports import free_ports
from localenv.slinky_standin import NodeSetDef, StandInConfig
from localenv.slurm import LocalSlurm
from localenv.supervisor import Proc, Supervisor
from tests.fixtures.slurm_cluster import build_slurm_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NS = "standin-stop-it"
POOL = "stop-a"
KUBE_NODE = "kwok-stop-a-0"
NODESET = NodeSetDef(POOL, 1, {labels.POOL: POOL}, [], gpus=8)
STANDIN = "slinky-standin"
GRACE = 10.0  # LocalEnv.stop_standin's


@pytest.fixture
def slurm(kube_cluster, tmp_path_factory) -> Iterator[LocalSlurm]:
    core = client.CoreV1Api(kube_cluster.api_client())
    core.create_node(fake_node(KUBE_NODE, {labels.POOL: POOL}, [], cpus=8, memory="32Gi", gpus=8))
    kube_cluster.wait_node_ready(KUBE_NODE)
    ctld, rest = free_ports(2)
    s = LocalSlurm(tmp_path_factory.mktemp("stop-slurm"), {"gpu": [POOL]}, root=build_slurm_root(),
                   ctld_port=ctld, rest_port=rest)
    files = s.operator_files()  # the operator's slurm.conf for the NodeSet (as test_slinky_standin.py)
    extra = f"GresTypes=gpu\nPartitionName=gpu Nodes={POOL} State=UP Default=YES\n" + "\n".join(s.extra_conf) + "\n"
    files["slurm.conf"] = slinky_conf.slurm_conf(slinky_conf.synthetic_controller("stop-it", extra), None,
                                                 [NODESET.resource(NS)])
    s.operator_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (s.operator_dir / name).write_text(text)
    s.up()
    try:
        yield s
    finally:
        s.down()
        for delete, name in ((core.delete_node, KUBE_NODE), (core.delete_namespace, NS)):
            try:
                delete(name)
            except ApiException:
                pass


def test_sigterm_ends_the_standin_within_its_grace_while_it_waits_on_slurm(kube_cluster, slurm, tmp_path) -> None:
    # The stand-in as LocalEnv.start_standin runs it, for a NodeSet of one pod.
    config = tmp_path / "standin.json"
    StandInConfig(kubeconfig=str(kube_cluster.kubeconfig_path), namespace=NS, nodesets=[asdict(NODESET)],
                  slurm={"workdir": str(slurm.workdir), "partitions": slurm.partitions, "root": str(slurm.root),
                         "ctld_port": slurm.ctld_port, "rest_port": slurm.rest_port}).write(config)
    said: list[str] = []
    sup = Supervisor(tmp_path, tmp_path, start_timeout=30.0, progress=said.append)
    sup.ensure([Proc(STANDIN, [sys.executable, "-m", "localenv.slinky_standin", "--config", str(config)],
                     lambda: True, cwd=PROJECT_DIR)])
    node = NODESET.hostname(0)
    try:
        # Its pod Running, it starts the pod's slurmd and waits for it to register: that slurmd hangs first.
        slurmd = wait_for(f"the stand-in to start slurmd {node}", lambda: slurm.supervisor.process(f"slurmd:{node}"),
                          120, interval=0.01, explain=lambda: sup.tail(STANDIN))
        slurmd.suspend()
        try:
            assert not slurm.nodes_up([node])  # not registered: the stand-in's pass is still waiting on Slurm
            said.clear()
            sup.stop([STANDIN], GRACE, tree=False)  # as LocalEnv.stop_standin (`gpufleet local down`)
        finally:
            slurmd.resume()
    finally:
        sup.stop([STANDIN], 0.0, sig=signal.SIGKILL, tree=False)  # nothing left when the test failed early
    assert [line.split(" (")[0] for line in said] == [f"[local] {STANDIN} stopped"], said  # not "killed"
    assert "the pass in flight abandoned" in sup.tail(STANDIN)
