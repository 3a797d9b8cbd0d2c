"""A machine dies under a running `--requeue` job, on the local pieces production's contracts run on (a real API
server and scheduler with kwok nodes, a real Slurm 26.05 through slurmrestd, the Slinky stand-in, the reconciler
as built for a cluster). Its kubelet dies with it (localenv/fake_nodes.py kill_kubelet): no preStop runs, its
NodeSet pod stays on it, and slurmctld finds the Slurm node not responding (DOWN only SlurmdTimeout later, 300 s by
default). Past `healing.node_lost_after_seconds` the reconciler heals it (reconciler/core/node_lost.py): the job
requeued, the spare promoted, the Slurm node set DOWN as the preStop would have, the NodeSet pod force-deleted and
made again on the spare, the job running again and not killed there by its old run's termination; then the repair
loop takes the
dead node: its pool's provider (kubernetes-spares) asks a reboot of the node agent, which died with the machine, so
it is retired at once, with a page and a node asked for (a power cycle through EC2, aws-asg, is shown with fakes:
tests/unit/test_node_lost.py)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels, parse_fleet
from gpufleet.fleetspec.faults import Kind
from localenv import fake_nodes
from localenv.ports import free_ports
from localenv.slinky_standin import NodeSetDef, SlinkyStandIn
from localenv.slurm import LocalSlurm
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.fixtures.reconciler_kube import reconciler
from tests.fixtures.slurm_cluster import build_slurm_root
from tests.integration.test_two_faults import World, proven

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NS = "slurm-dead"
POOL = "dm"  # a name no other test of the session uses
K = "kwok-"
NODES = [f"{K}{POOL}-0", f"{K}{POOL}-1", f"{K}{POOL}-spare-0"]


def spec():
    return parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": POOL, "node_type": "kwok", "gpu_model": "H100", "gpus_per_node": 8, "cpus_per_node": 8,
                   "memory_per_node": "32Gi", "nodes": 2, "spares": 1, "provider": "kubernetes-spares",
                   "repair": {"in_place": False}}],
        "slurm": {"namespace": NS, "partitions": [{"name": f"{POOL}p", "pools": [POOL]}]},
        "healing": {"grace_period_seconds": 0, "drain_timeout_seconds": 10, "max_unhealthy_fraction": 1.0,
                    "node_lost_after_seconds": 30, "reconciler": {"namespace": "default"}},
    })


class DeadWorld(World):
    """test_two_faults.py's world, on this module's spec and Slurm namespace."""

    def reconciler(self, fraction: float = 1.0):
        self.rec = reconciler(self.api, spec(), slurm=self.rest)
        return self.rec

    def nodeset_pods(self, nodeset: str | None = None) -> dict[str, str | None]:
        """Slurm name -> the Kubernetes node its NodeSet pod runs on (None: pending)."""
        return {p.metadata.labels[labels.SLINKY_POD_HOSTNAME]: (p.spec.node_name if p.status.phase == "Running" else None)
                for p in self.core.list_namespaced_pod(NS).items if p.metadata.deletion_timestamp is None
                and (nodeset is None or p.metadata.labels[labels.SLINKY_POD_HOSTNAME].startswith(nodeset))}


@pytest.fixture(scope="module")
def world(kube_cluster, api, tmp_path_factory) -> Iterator[DeadWorld]:  # noqa: F811
    core = client.CoreV1Api(api)
    for node in fake_nodes.fleet_nodes(spec(), prefix=K)[1:]:
        core.create_node(node)
    for name in NODES:
        kube_cluster.wait_node_ready(name)
    ctld, rest = free_ports(2)
    slurm = LocalSlurm(tmp_path_factory.mktemp("dead-machine-slurm"), {f"{POOL}p": [POOL]}, root=build_slurm_root(),
                       ctld_port=ctld, rest_port=rest)
    slurm.up()
    w = DeadWorld(api, slurm, SlinkyStandIn(api, slurm, [NodeSetDef(POOL, 2, {labels.NODE_POOL: POOL}, [], gpus=8)],
                                             namespace=NS))
    try:
        w.until("NodeSet pods Running on the active nodes", lambda: sorted(v or "" for v in w.nodeset_pods().values())
                == NODES[:2], timeout=90)
        yield w
    finally:
        w.rest.close()
        slurm.down()
        for name in NODES:
            try:
                core.delete_node(name)
            except ApiException:
                pass


def test_a_machine_that_dies_under_a_requeue_job_is_replaced_its_pod_force_deleted_and_the_job_runs_again(world):
    w = world
    w.reconciler()
    w.until("the spare proven", lambda: proven(w, NODES[2]))
    jid = w.slurm.sbatch("--requeue", "-p", f"{POOL}p", "-N", "1", "-w", f"{POOL}-0", "--output=/dev/null",
                         "--wrap", "sleep 3600")
    w.until("the job running on the first node", lambda: w.job(jid) == ("RUNNING", f"{POOL}-0"))
    dead = w.nodeset_pods(POOL)[f"{POOL}-0"]  # the machine the scheduler put the job's Slurm node on
    assert dead in NODES[:2]
    fake_nodes.kill_kubelet(w.core, dead)

    w.until("the heal over", lambda: (r := w.record(dead)) is not None and r.phase is Phase.SUCCEEDED, timeout=240)
    r = w.record(dead)
    assert r.kind is Kind.NODE_LOST and r.replacement == NODES[2], r
    assert "the machine stopped answering" in r.reason and "force-deleted" in r.reason, r.reason
    assert w.nodeset_pods(POOL).get(f"{POOL}-0") == NODES[2]  # made again on the spare
    waiting = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING", ""}
    w.until("the job running again (or ended)", lambda: w.job(jid)[0] not in waiting, timeout=120)
    # Not ended: the requeued job's old run, never confirmed killed on the dead slurmd, would have its termination
    # resent to the slurmd made again on the spare, killing the new run (ExitCode 0:15), had the heal not set the
    # Slurm node DOWN before the pod was made again (reconciler/core/node_lost.py let_go).
    assert w.job(jid) == ("RUNNING", f"{POOL}-0"), w.slurm.run(["scontrol", "show", "job", str(jid)]).stdout
    # The old run was over in slurmctld's books (batch_requeue_fini logs "Requeuing", job_mgr.c) before the Slurm
    # node's name answered again from the spare ("now responding", node_mgr.c): nothing of it was left to deliver.
    log = w.slurm.ctld_log.read_text()
    since = log.index(f"update_node: node {POOL}-0 reason set to: gpufleet")
    requeued, back = log.index(f"Requeuing JobId={jid}", since), log.find(f"Node {POOL}-0 now responding", since)
    assert back == -1 or requeued < back, log[since:]
    # The repair loop takes the dead node once Slurm agrees nothing of the pool runs there (the operator's comment
    # on dm-0 names the spare): nothing there can carry out a reboot, so it is retired at once.
    w.until("the dead node's repair over", lambda: (x := w.record(dead)).repair is not None and x.repair.phase.terminal,
            timeout=60)
    rep = w.record(dead).repair
    assert rep.phase is RepairPhase.RETIRED, rep
    assert f"{dead} does not answer" in rep.reason and "provider kubernetes-spares has no power control" in rep.reason
    assert w.role(dead) == labels.ROLE_RETIRED
    assert labels.REPAIR_REQUEST not in (w.core.read_node(dead).metadata.annotations or {})  # nothing asked of it
    show = w.slurm.run(["scontrol", "show", "job", str(jid)]).stdout
    assert "JobState=RUNNING" in show and "Restarts=1" in show, show  # still its one new run, all through the repair
    w.slurm.run(["scancel", str(jid)], timeout=15)
