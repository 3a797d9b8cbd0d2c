"""The agent's share of the repair loop (reconciler/agent/repairs.py), with a fake API server and fake host
commands: a reset or a reboot asked on the node is carried out once per request id, answered on the node,
and never repeated by a restarted agent; a failed command is answered as failed; nothing is asked, nothing
is run."""
from __future__ import annotations

import copy
import threading
from datetime import datetime, timezone

import pytest

from fleetspec import labels
from fleetspec.node_repair import REBOOT, RESET_GPU, RepairRequest, parse_result
from reconciler.agent.repairs import HOST, Repairs
from reconciler.errors import TemporaryError

NODE = "gpu-0"
NOW = datetime(2026, 12, 2, 3, 0, tzinfo=timezone.utc)


class Node:
    """One node's annotations behind get_node/patch_node, as reconciler.adapters.kube.Kube answers them."""

    def __init__(self):
        self.node = {"metadata": {"name": NODE, "annotations": {}}}
        self.down = False
        self.patches: list[dict] = []

    def get_node(self, name):
        assert name == NODE
        if self.down:
            raise TemporaryError("get node: connection refused")
        return copy.deepcopy(self.node)

    def patch_node(self, name, body):
        assert name == NODE
        if self.down:
            raise TemporaryError("patch node: connection refused")
        self.patches.append(body)
        self.node["metadata"]["annotations"].update(body["metadata"]["annotations"])
        return copy.deepcopy(self.node)

    def ask(self, request: RepairRequest) -> None:
        self.node["metadata"]["annotations"][labels.REPAIR_REQUEST] = request.dumps()

    @property
    def result(self):
        return parse_result(self.node["metadata"]["annotations"].get(labels.REPAIR_RESULT))


class Host:
    """The host's commands: what was run, and what each answers (`answers`: argv[len(HOST)] -> (code, out))."""

    def __init__(self, **answers):
        self.ran: list[list[str]] = []
        self.answers = {"nvidia-smi": (0, "GPU 00000000:3B:00.0 was successfully reset."),
                        "systemctl": (0, "")} | answers
        self.boot = "boot-a"

    def __call__(self, argv):
        assert argv[:len(HOST)] == HOST, "a host tool runs in the host's namespaces"
        self.ran.append(argv[len(HOST):])
        return self.answers[argv[len(HOST)]]


def repairs(node: Node, host: Host) -> Repairs:
    return Repairs(node, NODE, run=host, boot=lambda: host.boot, clock=lambda: NOW)


def test_nothing_asked_nothing_run():
    node, host = Node(), Host()
    assert repairs(node, host).once() is None
    assert host.ran == [] and node.patches == []


def test_a_reset_of_the_named_gpus_is_done_once_and_answered():
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0", "00000000:5E:00.0")))
    agent = repairs(node, host)
    result = agent.once()
    assert host.ran == [["nvidia-smi", "-r", "-i", "00000000:3B:00.0"], ["nvidia-smi", "-r", "-i", "00000000:5E:00.0"]]
    assert result.ok and node.result == result and node.result.id == "r1/1-reset-gpu" and node.result.boot == "boot-a"
    assert "successfully reset" in node.result.message
    # asked again (the reconciler wrote the same request after a crash), and by a restarted agent: nothing runs
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0", "00000000:5E:00.0")))
    assert agent.once() is None and repairs(node, host).once() is None
    assert len(host.ran) == 2 and len(node.patches) == 1


def test_a_reset_with_no_gpu_named_resets_every_gpu_and_a_new_id_is_acted_on():
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW))
    repairs(node, host).once()
    node.ask(RepairRequest("r1/2-reset-gpu", RESET_GPU, NOW))
    repairs(node, host).once()
    assert host.ran == [["nvidia-smi", "-r"], ["nvidia-smi", "-r"]]
    assert node.result.id == "r1/2-reset-gpu"


def test_a_reset_that_fails_is_answered_failed_and_stops_at_the_first_gpu():
    node, host = Node(), Host(**{"nvidia-smi": (3, "Unable to reset GPU 00000000:3B:00.0: in use by another client")})
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0", "00000000:5E:00.0")))
    repairs(node, host).once()
    assert len(host.ran) == 1
    assert not node.result.ok and "exited 3" in node.result.message and "in use" in node.result.message


@pytest.mark.parametrize("gpu", ["-r", "0 --loop=1", "all", "00000000:3B:00.0;reboot", "../../x", "", "3B:00.0"])
def test_a_reset_naming_a_gpu_by_anything_but_its_pci_bus_id_runs_nothing(gpu):
    """The GPU ids of a request reach `nvidia-smi -i` as root on the host: anything but a PCI bus id is refused,
    answered failed (the ladder goes on), and nothing runs, the well-formed ids beside it included."""
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("0000:3b:00", gpu)))
    repairs(node, host).once()
    assert host.ran == []
    assert not node.result.ok and "refused" in node.result.message and repr(gpu) in node.result.message


def test_a_reboot_is_answered_before_it_is_done_and_never_again_after_the_reboot():
    node, host = Node(), Host()
    order: list[str] = []
    host_call = host.__call__
    node_patch = node.patch_node
    node.patch_node = lambda n, b: (order.append("answer"), node_patch(n, b))[1]
    agent = Repairs(node, NODE, run=lambda argv: (order.append("reboot"), host_call(argv))[1],
                    boot=lambda: host.boot, clock=lambda: NOW)
    node.ask(RepairRequest("r1/1-reboot", REBOOT, NOW))
    agent.once()
    assert order == ["answer", "reboot"], "nothing is written after a reboot: the answer comes first"
    assert host.ran == [["systemctl", "reboot"]] and node.result.ok and node.result.boot == "boot-a"
    host.boot = "boot-b"  # the machine came back: the agent starts again and finds its answer on the node
    assert repairs(node, host).once() is None and host.ran == [["systemctl", "reboot"]]


def test_a_reboot_refused_by_the_host_is_answered_failed():
    node, host = Node(), Host(systemctl=(1, "Failed to reboot: Access denied"))
    node.ask(RepairRequest("r1/1-reboot", REBOOT, NOW))
    repairs(node, host).once()
    assert not node.result.ok and "Access denied" in node.result.message


def test_no_reboot_without_the_answer_written_first():
    """The API server away: the answer cannot be written, so the reboot is not done (it would be done again)."""
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reboot", REBOOT, NOW))
    node.down = True
    with pytest.raises(TemporaryError):
        repairs(node, host).once()
    assert host.ran == []


@pytest.mark.parametrize("text", ["{", '{"id": "x", "action": "format-disk", "at": "2026-12-02T03:00:00+00:00"}', "[]"])
def test_a_request_that_does_not_read_runs_nothing(text):
    node, host = Node(), Host()
    node.node["metadata"]["annotations"][labels.REPAIR_REQUEST] = text
    assert repairs(node, host).once() is None and host.ran == []


def test_the_loop_outlives_the_api_server_and_acts_when_it_is_back():
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW))
    node.down = True
    stop = threading.Event()
    waits: list[float] = []

    class Stop:  # the loop's waits: the API server comes back after the first, the test stops it after the second
        def is_set(self):
            return stop.is_set()

        def wait(self, seconds):
            waits.append(seconds)
            node.down = False
            if len(waits) == 2:
                stop.set()

    repairs(node, host).loop(Stop(), every=1.0)
    assert host.ran == [["nvidia-smi", "-r"]] and node.result.ok and waits == [1.0, 1.0]
