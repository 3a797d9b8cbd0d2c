"""The agent's share of the repair loop (reconciler/agent/repairs.py), with a fake API server and fake host
commands: a reset or a reboot asked on the node is carried out once per request id, answered on the node,
and never repeated by a restarted agent; a failed command is answered as failed; nothing is asked, nothing
is run."""
from __future__ import annotations

import copy
import threading
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.node_repair import REBOOT, RESET_GPU, RepairRequest, parse_result
from gpufleet.reconciler.agent.gpu_clients import OPERATOR_LABELS, GpuClients
from gpufleet.reconciler.agent.repairs import HOST, Repairs
from gpufleet.reconciler.errors import TemporaryError

NODE = "gpu-0"
NOW = datetime(2026, 12, 2, 3, 0, tzinfo=timezone.utc)


class Node:
    """One node's annotations behind get_node/patch_node, as gpufleet.reconciler.adapters.kube.Kube answers them."""

    def __init__(self):
        self.node = {"metadata": {"name": NODE, "annotations": {}, "labels": {}}}
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
        for key in ("annotations", "labels"):  # a JSON merge patch: null removes the key
            for k, v in (body["metadata"].get(key) or {}).items():
                if v is None:
                    self.node["metadata"].setdefault(key, {}).pop(k, None)
                else:
                    self.node["metadata"].setdefault(key, {})[k] = v
        return copy.deepcopy(self.node)

    def ask(self, request: RepairRequest) -> None:
        self.node["metadata"]["annotations"][labels.REPAIR_REQUEST] = request.dumps()

    @property
    def result(self):
        return parse_result(self.node["metadata"]["annotations"].get(labels.REPAIR_RESULT))


class Host:
    """The host's commands, as a GPU node answers them: what was run, and what each answers. By default no host
    daemon is active, persistence mode is off, nothing has an NVIDIA device file open, and a reset and a reboot
    succeed. `reset`/`reboot`: (exit, output) of `nvidia-smi -r` and `systemctl reboot`; `active`: the systemd
    units running; `persistent`: the GPUs with persistence mode on; `holders`: fuser's output on each look,
    in turn (the last one stays)."""

    def __init__(self, reset=(0, "GPU 00000000:3B:00.0 was successfully reset."), reboot=(0, ""), active=(),
                 persistent=(), holders=("",), gpus=("00000000:3B:00.0", "00000000:5E:00.0"), start=(0, "")):
        self.ran: list[list[str]] = []
        self.reset, self.reboot, self.start = reset, reboot, start
        self.active, self.persistent, self.holders, self.gpus = set(active), set(persistent), list(holders), gpus
        self.boot = "boot-a"

    def __call__(self, argv):
        assert argv[:len(HOST)] == HOST, "a host tool runs in the host's namespaces"
        cmd = argv[len(HOST):]
        self.ran.append(cmd)
        match cmd:
            case ["nvidia-smi", "-r", *_]:
                return self.reset
            case ["systemctl", "reboot"]:
                return self.reboot
            case ["systemctl", "is-active", "--quiet", unit]:
                return (0, "") if unit in self.active else (3, "")
            case ["systemctl", "stop", unit]:
                self.active.discard(unit)
                return 0, ""
            case ["systemctl", "start", unit]:
                if self.start[0] == 0:
                    self.active.add(unit)
                return self.start
            case ["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader", "-i", gpu]:
                return 0, "Enabled" if gpu in self.persistent else "Disabled"
            case ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"]:
                return 0, "\n".join(self.gpus)
            case ["nvidia-smi", "-pm", mode, "-i", gpu]:
                (self.persistent.add if mode == "1" else self.persistent.discard)(gpu)
                return 0, f"Persistence mode set for GPU {gpu}."
            case ["sh", "-c", script] if script.startswith("fuser "):
                out = self.holders.pop(0) if len(self.holders) > 1 else self.holders[0]
                return (0, out) if out else (1, "")
        raise AssertionError(f"unexpected host command {cmd}")

    @property
    def resets(self) -> list[list[str]]:
        return [c for c in self.ran if c[:2] == ["nvidia-smi", "-r"]]

    @property
    def reboots(self) -> list[list[str]]:
        return [c for c in self.ran if c == ["systemctl", "reboot"]]


def repairs(node: Node, host: Host) -> Repairs:
    return Repairs(node, NODE, run=host, boot=lambda: host.boot, clock=lambda: NOW,
                   clients=GpuClients(node, NODE, host, sleep=lambda s: None))


def test_nothing_asked_nothing_run():
    node, host = Node(), Host()
    assert repairs(node, host).once() is None
    assert host.ran == [] and node.patches == []


def test_a_reset_of_the_named_gpus_is_done_once_and_answered():
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0", "00000000:5E:00.0")))
    agent = repairs(node, host)
    result = agent.once()
    assert host.resets == [["nvidia-smi", "-r", "-i", "00000000:3B:00.0"], ["nvidia-smi", "-r", "-i", "00000000:5E:00.0"]]
    assert result.ok and node.result == result and node.result.id == "r1/1-reset-gpu" and node.result.boot == "boot-a"
    assert "successfully reset" in node.result.message
    # asked again (the reconciler wrote the same request after a crash), and by a restarted agent: nothing runs
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0", "00000000:5E:00.0")))
    ran, patches = len(host.ran), len(node.patches)
    assert agent.once() is None and repairs(node, host).once() is None
    assert len(host.ran) == ran and len(node.patches) == patches and len(host.resets) == 2


def test_a_reset_with_no_gpu_named_resets_every_gpu_and_a_new_id_is_acted_on():
    node, host = Node(), Host()
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW))
    repairs(node, host).once()
    node.ask(RepairRequest("r1/2-reset-gpu", RESET_GPU, NOW))
    repairs(node, host).once()
    assert host.resets == [["nvidia-smi", "-r"], ["nvidia-smi", "-r"]]
    assert node.result.id == "r1/2-reset-gpu"


def test_a_reset_that_fails_is_answered_failed_and_stops_at_the_first_gpu():
    node, host = Node(), Host(reset=(3, "Unable to reset GPU 00000000:3B:00.0: in use by another client"))
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0", "00000000:5E:00.0")))
    repairs(node, host).once()
    assert len(host.resets) == 1
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
                    boot=lambda: host.boot, clock=lambda: NOW, clients=GpuClients(node, NODE, host))
    node.ask(RepairRequest("r1/1-reboot", REBOOT, NOW))
    agent.once()
    assert order == ["answer", "reboot"], "nothing is written after a reboot: the answer comes first"
    assert host.ran == [["systemctl", "reboot"]] and node.result.ok and node.result.boot == "boot-a"
    host.boot = "boot-b"  # the machine came back: the agent starts again and finds its answer on the node
    assert repairs(node, host).once() is None and host.ran == [["systemctl", "reboot"]]


def test_a_reboot_refused_by_the_host_is_answered_failed():
    node, host = Node(), Host(reboot=(1, "Failed to reboot: Access denied"))
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
    assert host.resets == [["nvidia-smi", "-r"]] and node.result.ok and waits == [1.0, 1.0]


# --- the GPUs' clients: stopped before a reset, restored after (NVSentinel's janitor and gpu_reset.sh) ----------

def operator_node() -> Node:
    """A GPU Operator node: its operands deployed by their node labels (one is off, as a person may set)."""
    node = Node()
    node.node["metadata"]["labels"] = {k: "true" for k in OPERATOR_LABELS} | {
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "false", "kubernetes.io/hostname": NODE}
    return node


def test_a_reset_stops_the_gpus_clients_first_and_restores_them_after():
    node = operator_node()
    host = Host(active={"nvidia-persistenced", "nvidia-dcgm"}, persistent={"00000000:3B:00.0"},
                holders=("/dev/nvidiactl: 4242 4243", "/dev/nvidia0: 4242", ""))  # the operands leave, then none
    seen: dict[str, object] = {}
    run = host.__call__

    def at_reset(argv):  # how the node stands when nvidia-smi -r runs
        if argv[len(HOST):][:2] == ["nvidia-smi", "-r"]:
            seen.update(labels=dict(node.node["metadata"]["labels"]), active=set(host.active),
                        persistent=set(host.persistent),
                        noted=node.node["metadata"]["annotations"].get(labels.GPU_CLIENTS_STOPPED))
        return run(argv)

    slept: list[float] = []
    agent = Repairs(node, NODE, run=at_reset, boot=lambda: host.boot, clock=lambda: NOW,
                    clients=GpuClients(node, NODE, at_reset, sleep=slept.append))
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW, ("00000000:3B:00.0",)))
    result = agent.once()
    assert result.ok and host.resets == [["nvidia-smi", "-r", "-i", "00000000:3B:00.0"]]
    # at the reset: the operands' labels off, the daemons stopped, persistence mode off, all noted on the node
    assert {k: seen["labels"][k] for k in OPERATOR_LABELS} == {k: "false" for k in OPERATOR_LABELS}
    assert seen["active"] == set() and seen["persistent"] == set()
    assert '"request": "r1/1-reset-gpu"' in seen["noted"] and "nvidia.com/gpu.deploy.gpu-feature-discovery" \
        not in seen["noted"]  # what was off stays off: it is not in the note, so not turned on after
    assert slept == [5.0, 5.0]  # it waited until nothing held the device files
    # after: as before
    after = node.node["metadata"]["labels"]
    assert {k: after[k] for k in OPERATOR_LABELS} == {k: "true" for k in OPERATOR_LABELS} | {
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "false"}
    assert host.active == {"nvidia-persistenced", "nvidia-dcgm"} and host.persistent == {"00000000:3B:00.0"}
    assert labels.GPU_CLIENTS_STOPPED not in node.node["metadata"]["annotations"]
    order = [c[:3] for c in host.ran if c[:2] in (["systemctl", "stop"], ["systemctl", "start"], ["nvidia-smi", "-r"],
                                                  ["nvidia-smi", "-pm"])]
    assert order == [["systemctl", "stop", "nvidia-persistenced"], ["systemctl", "stop", "nvidia-dcgm"],
                     ["nvidia-smi", "-pm", "0"], ["nvidia-smi", "-r", "-i"], ["nvidia-smi", "-pm", "1"],
                     ["systemctl", "start", "nvidia-persistenced"], ["systemctl", "start", "nvidia-dcgm"]]


def test_clients_that_cannot_be_stopped_mean_no_reset_everything_restored_and_an_answer_that_asks_a_reboot():
    node = operator_node()
    host = Host(active={"nvidia-dcgm"}, holders=("/dev/nvidia0: 777",))  # something the agent cannot stop holds it
    clients = GpuClients(node, NODE, host, sleep=lambda s: None, teardown=300)
    agent = Repairs(node, NODE, run=host, boot=lambda: host.boot, clock=lambda: NOW, clients=clients)
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW))
    result = agent.once()
    assert host.resets == []  # nvidia-smi -r would be refused: not tried
    assert not result.ok and "could not be stopped within 300s" in result.message and "777" in result.message
    assert "reboot" in result.message
    assert host.active == {"nvidia-dcgm"} and node.node["metadata"]["labels"]["nvidia.com/gpu.deploy.dcgm"] == "true"
    assert labels.GPU_CLIENTS_STOPPED not in node.node["metadata"]["annotations"]


def test_an_agent_that_died_during_a_reset_restores_what_it_stopped_when_it_starts_again():
    node = operator_node()
    host = Host(active={"nvidia-persistenced"}, persistent={"00000000:3B:00.0"})
    clients = GpuClients(node, NODE, host, sleep=lambda s: None)
    clients.stop("r1/1-reset-gpu", ("00000000:3B:00.0",))  # ... and the agent died here
    assert node.node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "false" and not host.active
    node.node["metadata"]["annotations"][labels.REPAIR_RESULT] = \
        '{"id": "r1/1-reset-gpu", "ok": false, "message": "m", "at": "2026-12-02T03:00:00+00:00"}'
    assert repairs(node, host).once() is None  # nothing asked: still, what was stopped comes back
    assert node.node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert host.active == {"nvidia-persistenced"} and host.persistent == {"00000000:3B:00.0"}
    assert labels.GPU_CLIENTS_STOPPED not in node.node["metadata"]["annotations"] and host.resets == []


def test_a_client_that_does_not_come_back_fails_the_reset_so_the_repair_reboots():
    node = operator_node()
    host = Host(active={"nvidia-persistenced"}, start=(1, "Job for nvidia-persistenced.service failed"))
    node.ask(RepairRequest("r1/1-reset-gpu", RESET_GPU, NOW))
    result = repairs(node, host).once()
    assert host.resets == [["nvidia-smi", "-r"]] and not result.ok
    assert "not restored after the reset: nvidia-persistenced" in result.message


def test_the_core_reboots_a_node_whose_reset_was_answered_failed():
    """The agent's failed answer (its GPUs' clients would not stop) sends the repair up the ladder to a reboot."""
    from gpufleet.fleetspec.faults import FaultAction
    from gpufleet.fleetspec.node_repair import RepairResult
    from gpufleet.reconciler.core.model import Remediation
    from gpufleet.reconciler.core.observe import node_view
    from gpufleet.reconciler.core.phases import Phase
    from gpufleet.reconciler.core.repair import RepairFacts, plan_repair
    from tests.unit.fakes import T0, fleet, pool_node

    spec = fleet(nodes=4, spares=2)
    n = pool_node(spec.pool("h100"), "h100-0", labels.ROLE_QUARANTINED)
    r = Remediation(name="r", node="h100-0", pool="h100", xid=48, message="m", phase=Phase.SUCCEEDED, created=T0,
                    action=FaultAction.RESET_GPU)
    asked = plan_repair(r, RepairFacts(node=node_view(n, ["GpuHealthy"]), history=(r,)), spec, T0).remediation
    assert asked.repair.step == "reset-gpu"
    n["metadata"]["annotations"][labels.REPAIR_RESULT] = RepairResult(
        asked.repair.request, False, "the GPUs' clients could not be stopped within 300s (/dev/nvidia0: 777)", T0).dumps()
    step = plan_repair(asked, RepairFacts(node=node_view(n, ["GpuHealthy"]), history=(asked,)), spec,
                       T0 + timedelta(seconds=30))
    assert step.remediation.repair.step == "reboot" and step.remediation.repair.rungs == ("reset-gpu", "reboot")
