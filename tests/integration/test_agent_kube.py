"""The node agent (`gpufleet agent`, a real process) against a real API server with kwok nodes:
kernel-log lines become the condition, an API server outage is outlived and the XID written
during it reported once it is back, a missing node is waited for, and a restarted agent
reports nothing twice and nothing from before the repair (issue 14 point 5, issue 9). With the
reconciler: each fault does what it needs (issue 21): an Xid 94 on a busy node leaves node and job
alone, an Xid 154 "to 0x0 (None)" does nothing, an Xid 46 is contained, and the policy's override
changes what the agent reports."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.fleetspec import labels
from gpufleet.waiting import wait_for
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.agent.sightings import Cursor
from tests.fixtures.kmsg import XID48, XID79, Kmsg

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


class AgentProcess:
    """`python -m gpufleet agent` over a whole file (as over /dev/kmsg), logging to a file."""

    def __init__(self, kube_cluster, node: str, kmsg: Kmsg, log: Path, policy: Path | None = None):
        self.log = log
        argv = [sys.executable, "-m", "gpufleet", "agent", "--node", node, "--kmsg", str(kmsg.path), "--from-start",
                "--kubeconfig", str(kube_cluster.kubeconfig_path), "--max-backoff", "1"]
        argv += ["--policy", str(policy)] if policy else []
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=self._out, cwd=REPO, start_new_session=True)

    def lines(self) -> list[dict]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"message": line})
        return out

    def logged(self, text: str) -> list[str]:
        assert self.proc.poll() is None, f"the agent exited ({self.proc.returncode}):\n{self.log.read_text()}"
        return [d["message"] for d in self.lines() if text in d.get("message", "")]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._out.close()
        return code


@pytest.fixture
def agents():
    started: list[AgentProcess] = []
    yield started
    for a in started:
        if a.proc.poll() is None:
            a.stop()


def start_agent(agents, kube_cluster, node, kmsg, tmp_path, policy: Path | None = None) -> AgentProcess:
    a = AgentProcess(kube_cluster, node, kmsg, tmp_path / f"agent-{len(agents)}.log", policy)
    agents.append(a)
    return a


def condition(kube: Kube, node: str) -> dict | None:
    conds = kube.get_node(node)["status"].get("conditions") or []
    return next((c for c in conds if c["type"] == labels.GPU_CONDITION), None)


def faulted(kube, node, reason):
    return lambda: (c := condition(kube, node)) and c["status"] == "False" and c["reason"] == reason and c


def test_kernel_log_lines_become_the_condition(kube_cluster, agents, tmp_path):
    kube_cluster.create_fake_node("agt-lines")
    kube = Kube(kube_cluster.api_client())
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write("usb 1-1: new device",
               "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",  # the job's bug: an Event only
               "NVRM: Xid (PCI:0000:3b:00): seventy-nine",                     # malformed: logged, ignored
               XID79)
    a = start_agent(agents, kube_cluster, "agt-lines", kmsg, tmp_path)
    cond = wait_for("the condition", faulted(kube, "agt-lines", "Xid79"), timeout=30)
    assert "fallen off the bus" in cond["message"] and "PCI:0000:3b:00" in cond["message"]
    assert cond["message"].startswith("[action=reboot pci=0000:3b:00] XID 79")
    assert a.logged("needs restart-app") and a.logged("unreadable GPU line ignored")
    assert a.stop() == 0


def restart_apiserver(kube_cluster, while_down) -> None:
    kube_cluster.stop_component("kube-apiserver")
    try:
        while_down()
    finally:
        kube_cluster.start_component("kube-apiserver")


def test_an_api_server_outage_is_outlived_and_the_xid_written_during_it_reported_once(kube_cluster, agents, tmp_path):
    kube_cluster.create_fake_node("agt-outage")
    kube = Kube(kube_cluster.api_client())
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write(XID48)
    a = start_agent(agents, kube_cluster, "agt-outage", kmsg, tmp_path)
    wait_for("a first report, before the outage", faulted(kube, "agt-outage", "Xid48"), timeout=30)

    def outage():
        kmsg.write(XID79)
        wait_for("the agent to see the XID", lambda: a.logged("XID 79 (GPU has fallen off the bus) needs reboot"),
                 timeout=10)
        wait_for("the agent to retry", lambda: len(a.logged("API server not answering")) >= 2, timeout=20)
        kmsg.write(XID79, XID79)  # the driver repeats itself

    restart_apiserver(kube_cluster, outage)
    cond = wait_for("the condition after the outage", faulted(kube, "agt-outage", "Xid79"), timeout=60)
    assert "fallen off the bus" in cond["message"]
    time.sleep(2)  # let the repeats be handled
    assert len(a.logged("GpuHealthy=False reason Xid79")) == 1  # once, for three lines
    assert condition(kube, "agt-outage")["lastTransitionTime"] == cond["lastTransitionTime"]
    node = kube.get_node("agt-outage")
    assert Cursor.parse(node["metadata"]["annotations"][labels.KMSG_REPORTED]).seq == kmsg.seq
    assert a.stop() == 0


def test_a_missing_node_is_waited_for_not_a_crash(kube_cluster, agents, tmp_path):
    kube = Kube(kube_cluster.api_client())
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write(XID79)
    a = start_agent(agents, kube_cluster, "agt-late", kmsg, tmp_path)
    wait_for("the agent to say the node is missing", lambda: a.logged("node agt-late not found (is --node right?"),
             timeout=30)
    kube_cluster.create_fake_node("agt-late")
    wait_for("the condition once the node exists", faulted(kube, "agt-late", "Xid79"), timeout=30)
    assert a.stop() == 0


def test_a_restarted_agent_reports_nothing_twice_and_nothing_from_before_the_repair(kube_cluster, agents, tmp_path):
    kube_cluster.create_fake_node("agt-restart")
    kube = Kube(kube_cluster.api_client())
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write("usb 1-1: new device", XID79)
    first = start_agent(agents, kube_cluster, "agt-restart", kmsg, tmp_path)
    wait_for("the first report", faulted(kube, "agt-restart", "Xid79"), timeout=30)
    assert first.stop() == 0
    kube.set_condition("agt-restart", labels.GPU_CONDITION, "True", "HealthCheckPassed", "dcgmi diag -r 3 passed")
    repaired = condition(kube, "agt-restart")

    again = start_agent(agents, kube_cluster, "agt-restart", kmsg, tmp_path)  # reads the whole log again
    wait_for("the restarted agent to connect (or to fault the node again)",
             lambda: again.logged("reporting GPU faults") or condition(kube, "agt-restart") != repaired, timeout=30)
    time.sleep(1.5)
    assert condition(kube, "agt-restart") == repaired  # not faulted again, not even rewritten
    assert not again.logged("GpuHealthy=False")

    kmsg.write(XID48)  # a new fault after the repair is reported
    wait_for("the new fault", faulted(kube, "agt-restart", "Xid48"), timeout=30)
    assert again.stop() == 0


# --- issue 21: each fault does what it needs, agent and reconciler together ---------------------------

from kubernetes import client  # noqa: E402

from gpufleet.fleetspec import parse_fleet, remediation_crd  # noqa: E402
from gpufleet.fleetspec.faults.condition import parse_condition  # noqa: E402
from tests.fixtures.reconciler_kube import make_nodes, pod, reconciler, step  # noqa: E402

XID94_MIG = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
XID154_NONE = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
XID46 = "NVRM: Xid (PCI:0000:3b:00): 46, pid=1797828, name=pt_main_thread, Ch 00000008, GPU stopped processing"


def fleet(pool: str, **faults):
    return parse_fleet({
        "environment": "itest", "cluster": {"kind": "local"},
        "pools": [{"name": pool, "node_type": "kwok", "gpu_model": "H100", "gpus_per_node": 8, "cpus_per_node": 4,
                   "memory_per_node": "16Gi", "nodes": 1, "spares": 1, "provider": "kubernetes-spares"}],
        "slurm": {"partitions": [{"name": "p", "pools": [pool]}]},
        "healing": {"grace_period_seconds": 0, "drain_timeout_seconds": 10, "max_unhealthy_fraction": 0.9,
                    "reconciler": {"namespace": "default"}, **({"faults": faults} if faults else {})},
    })


def pool_with_a_job(kube_cluster, api, spec):
    """The pool's node and spare as the local environment makes them, and a running job's pod on the node."""
    make_nodes(kube_cluster, spec)
    node = spec.pools[0].node_names()[0]
    client.CoreV1Api(api).create_namespaced_pod("default", pod(f"{node}-job", node))
    return node, reconciler(api, spec)


def node_events(api, node: str) -> list:
    """The agent's Events on the node (not the control plane's, nor the reconciler's)."""
    items = client.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    return [e for e in items if e.source and e.source.component == "gpufleet-agent"]


def left_alone(api, rec, node: str) -> None:
    step(rec)
    n = client.CoreV1Api(api).read_node(node)
    job = client.CoreV1Api(api).read_namespaced_pod(f"{node}-job", "default")
    assert not n.spec.unschedulable and job.metadata.deletion_timestamp is None
    assert [r for r in rec.store.list() if r.node == node] == []
    assert not [c for c in n.status.conditions or [] if c.type == labels.GPU_CONDITION]


def test_an_xid_94_on_a_busy_node_leaves_the_node_and_its_job_alone(kube_cluster, api, agents, tmp_path):
    spec = fleet("xa")
    node, rec = pool_with_a_job(kube_cluster, api, spec)
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write(XID94_MIG)
    start_agent(agents, kube_cluster, node, kmsg, tmp_path)
    (ev,) = wait_for("the Event on the node", lambda: [e for e in node_events(api, node) if e.reason == "Xid94"],
                     timeout=30)
    sig = parse_condition(ev.reason, ev.message)
    assert (sig.action.value, sig.pci, sig.gpu_instance, ev.type) == ("restart-app", "0000:01:00", 5, "Warning")
    left_alone(api, rec, node)


def test_an_xid_154_to_none_does_nothing(kube_cluster, api, agents, tmp_path):
    spec = fleet("xb")
    node, rec = pool_with_a_job(kube_cluster, api, spec)
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write(XID154_NONE, XID94_MIG)  # the 94 after it shows the agent got past the 154 (oldest first)
    a = start_agent(agents, kube_cluster, node, kmsg, tmp_path)
    wait_for("the 94's Event", lambda: [e for e in node_events(api, node) if e.reason == "Xid94"], timeout=30)
    assert [e.reason for e in node_events(api, node)] == ["Xid94"]
    assert a.logged("XID 154 (GPU Recovery Action Changed) needs none [NVIDIA: XID_154 -> 0x0 (None)")
    left_alone(api, rec, node)


def test_an_xid_46_is_contained_and_its_remediation_says_it_needs_a_gpu_reset(kube_cluster, api, agents, tmp_path):
    spec = fleet("xc")
    node, rec = pool_with_a_job(kube_cluster, api, spec)
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write(XID46)
    start_agent(agents, kube_cluster, node, kmsg, tmp_path)
    cond = wait_for("the condition", faulted(Kube(api), node, "Xid46"), timeout=30)
    assert cond["message"].startswith("[action=reset-gpu pci=0000:3b:00] XID 46 (GPU stopped processing): ")

    def contained():
        step(rec)
        mine = [r for r in rec.store.list() if r.node == node]
        return mine if mine and client.CoreV1Api(api).read_node(node).spec.unschedulable else None

    (r,) = wait_for("the cordon and the remediation", contained, timeout=60)
    assert (r.xid, r.kind.value, r.action.value, r.pci, r.source) == (46, "xid", "reset-gpu", "0000:3b:00", "GpuHealthy")
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpufleet.io", remediation_crd.VERSION,
                                                                 "remediations", r.name)
    # reportedBy: the condition's field manager on the node, the agent's (issue 24: who reported the fault)
    assert obj["spec"]["fault"] == {"kind": "xid", "code": 46, "action": "reset-gpu", "pci": "0000:3b:00",
                                    "source": "GpuHealthy", "reportedBy": "gpufleet-agent"}


def test_the_policys_override_changes_what_the_agent_reports(kube_cluster, api, agents, tmp_path):
    spec = fleet("xd", actions={"xid": {94: "reset-gpu"}})
    policy = tmp_path / "fleet.json"
    policy.write_text(spec.model_dump_json())  # as the stack renders it into the gpufleet-policy ConfigMap
    node, rec = pool_with_a_job(kube_cluster, api, spec)
    kmsg = Kmsg(tmp_path / "kmsg")
    kmsg.write(XID94_MIG)
    start_agent(agents, kube_cluster, node, kmsg, tmp_path, policy=policy)
    cond = wait_for("the condition", faulted(Kube(api), node, "Xid94"), timeout=30)
    sig = parse_condition(cond["reason"], cond["message"])
    assert (sig.action.value, sig.pci, sig.gpu_instance) == ("reset-gpu", "0000:01:00", 5)
    assert [e for e in node_events(api, node) if e.reason == "Xid94"] == []
    wait_for("the remediation", lambda: (step(rec), [r for r in rec.store.list() if r.node == node])[1],
             timeout=60)
