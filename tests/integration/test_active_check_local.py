"""Active checks on the local world: a real API server, scheduler, Job controller and kwok nodes (the GPU
hardware stand-in answering the health-check Jobs as tests/integration/test_repair_local.py has it), a real
Slurm 26.05 whose nodes run as NodeSet pods on those nodes, and the reconciler as built for a cluster. An idle
node whose periodic check fails enters the repair loop; a node that runs a job is never checked; no check
reservation is left in Slurm afterwards."""
from __future__ import annotations

import pytest
from kubernetes import client

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.active_checks import ActiveChecks
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core import active_checks
from localenv.gpu_hardware_standin import BROKEN
from tests.fixtures.reconciler_kube import Recorder, fleet, make_nodes, reconciler, records_for, run_until, step
from gpufleet.waiting import wait_for
from localenv.slinky_standin import NodeSetDef, declare_nodesets, nodeset_owner
from tests.integration.test_reconciler_slurm import SLURM_NS, job_on
from tests.integration.test_repair_local import check_pods, simulate

pytestmark = pytest.mark.integration
POOL = "acheck"


def place(api, slurm_name: str, node: str) -> None:
    """The pool's NodeSet pod named as its Slurm node, on `node` (the reconciler counts a pod as a Slurm node's only
    when one of the spec's NodeSets controls it: this pool's)."""
    core = client.CoreV1Api(api)
    (nodeset,) = declare_nodesets(api, SLURM_NS, [NodeSetDef(POOL, 0, {})])
    try:
        core.delete_namespaced_pod(slurm_name, SLURM_NS, grace_period_seconds=0)
    except client.exceptions.ApiException as e:
        assert e.status == 404
    wait_for(f"{slurm_name} to be gone", lambda: slurm_name not in {
        p.metadata.name for p in core.list_namespaced_pod(SLURM_NS).items}, timeout=10)
    core.create_namespaced_pod(SLURM_NS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": slurm_name, "namespace": SLURM_NS, "ownerReferences": [nodeset_owner(nodeset)],
                     "labels": {labels.SLINKY_POD_HOSTNAME: slurm_name, "app.kubernetes.io/name": "slurmd"}},
        "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "slurmd", "image": "ghcr.io/slinkyproject/slurmd:26.05"}]}})


def ours(slurm_cli) -> list[str]:
    return [r.name for r in slurm_cli.reservations() if active_checks.is_ours(r.name)]


def test_an_idle_node_failing_its_periodic_check_enters_the_repair_loop_and_a_busy_one_is_never_checked(
        kube_cluster, api, slurm_fresh, slurm_cli, tmp_path):
    spec = fleet(POOL, nodes=2, spares=1, grace_period_seconds=5)
    pool = spec.pools[0].model_copy(update={"active_checks": ActiveChecks(period_seconds=3600, max_at_once=1)})
    spec = spec.model_copy(update={"pools": [pool],
                                   "slurm": spec.slurm.model_copy(update={"namespace": SLURM_NS})})
    core = client.CoreV1Api(api)
    make_nodes(kube_cluster, spec)
    for n in (f"{POOL}-0", f"{POOL}-1"):
        Kube(api).set_condition(n, "GpuHealthy", "True", "Healthy", "ok")
    # the Slurm nodes run as NodeSet pods: gpu-a-0 on acheck-0 (idle), gpu-a-1 on acheck-1 (a job runs there)
    for slurm_name, node in (("gpu-a-0", f"{POOL}-0"), ("gpu-a-1", f"{POOL}-1")):
        place(api, slurm_name, node)
    jid = job_on(slurm_fresh, "gpu-a-1", tmp_path)
    simulate(core, f"{POOL}-0", BROKEN)  # what the check will find on the idle node
    rec = reconciler(api, spec, Recorder(), slurm_cli)
    try:
        (r,) = run_until(rec, lambda: records_for(rec, f"{POOL}-0"), timeout=120)
        assert "failed its active health check" in r.reason, r.reason
        # the check was a Job on that node, made under a Slurm reservation of its Slurm node
        assert any(p.spec.node_name == f"{POOL}-0" for p in check_pods(core, f"{POOL}-0"))
        # the busy node was never checked: no check Job, no reservation, its job runs on
        assert check_pods(core, f"{POOL}-1") == []
        assert slurm_cli.job(jid).state == "RUNNING"
        # given back once its remediation holds it: no reservation left, no check taint
        run_until(rec, lambda: not ours(slurm_cli) and labels.CHECK_TAINT not in
                  [t.key for t in core.read_node(f"{POOL}-0").spec.taints or []], timeout=60)
        for _ in range(3):
            step(rec)
        assert ours(slurm_cli) == [] and check_pods(core, f"{POOL}-1") == []
    finally:
        for name in ours(slurm_cli):
            slurm_cli.delete_reservation(name)
        for n in (f"{POOL}-0", f"{POOL}-1", f"{POOL}-spare-0"):  # no node of this pool left to the session's others
            core.delete_node(n)
        for slurm_name in ("gpu-a-0", "gpu-a-1"):  # nor a NodeSet pod on a node that is gone
            try:
                core.delete_namespaced_pod(slurm_name, SLURM_NS, grace_period_seconds=0)
            except client.exceptions.ApiException as e:
                assert e.status == 404
