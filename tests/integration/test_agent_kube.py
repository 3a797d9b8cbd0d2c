"""The node agent (`gpufleet agent`, a real process) against a real API server with kwok nodes:
kernel-log lines become the condition, an API server outage is outlived and the XID written
during it reported once it is back, a missing node is waited for, and a restarted agent
reports nothing twice and nothing from before the repair (issue 14 point 5, issue 9)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetspec import labels
from gpufleet.waiting import wait_for
from reconciler.adapters.kube import Kube
from reconciler.agent.sightings import Cursor
from tests.fixtures.kmsg import XID48, XID79, Kmsg

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


class AgentProcess:
    """`python -m gpufleet agent` over a whole file (as over /dev/kmsg), logging to a file."""

    def __init__(self, kube_cluster, node: str, kmsg: Kmsg, log: Path):
        self.log = log
        argv = [sys.executable, "-m", "gpufleet", "agent", "--node", node, "--kmsg", str(kmsg.path), "--from-start",
                "--kubeconfig", str(kube_cluster.kubeconfig_path), "--max-backoff", "1"]
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


def start_agent(agents, kube_cluster, node, kmsg, tmp_path) -> AgentProcess:
    a = AgentProcess(kube_cluster, node, kmsg, tmp_path / f"agent-{len(agents)}.log")
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
               "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",  # the job's bug: ignored
               "NVRM: Xid (PCI:0000:3b:00): seventy-nine",                     # malformed: logged, ignored
               XID79)
    a = start_agent(agents, kube_cluster, "agt-lines", kmsg, tmp_path)
    cond = wait_for("the condition", faulted(kube, "agt-lines", "Xid79"), timeout=30)
    assert "fallen off the bus" in cond["message"] and "PCI:0000:3b:00" in cond["message"]
    assert a.logged("not critical") and a.logged("unparsable Xid line ignored")
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
        wait_for("the agent to see the XID", lambda: a.logged("critical XID 79"), timeout=10)
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
             lambda: again.logged("reporting critical XIDs") or condition(kube, "agt-restart") != repaired, timeout=30)
    time.sleep(1.5)
    assert condition(kube, "agt-restart") == repaired  # not faulted again, not even rewritten
    assert not again.logged("GpuHealthy=False")

    kmsg.write(XID48)  # a new fault after the repair is reported
    wait_for("the new fault", faulted(kube, "agt-restart", "Xid48"), timeout=30)
    assert again.stop() == 0
