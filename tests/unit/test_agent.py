"""The node agent with a fake API server (outages, a missing node, a refusal) and a kernel log
file the test writes: outages are outlived, nothing is lost or reported twice, restarts replay
nothing that was reported or repaired."""
from __future__ import annotations

import copy
import threading
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from gpufleet.fleetspec import labels
from gpufleet.reconciler.agent.daemon import Agent, AgentFailed, KernelLog
from gpufleet.reconciler.errors import NotFound, PermanentError, TemporaryError
from gpufleet.reconciler.agent.sightings import Cursor
from tests.fixtures.kmsg import XID48, XID79, Kmsg

NODE = "gpu-0"
XID13 = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception"


class FakeKube:
    """The three calls the agent makes, on one node; `down`, `missing` and `refuse` make them fail
    as gpufleet.reconciler.adapters.kube.Kube does (TemporaryError, NotFound, PermanentError)."""

    def __init__(self, node: str = NODE):
        self.nodes = {node: {"metadata": {"name": node, "annotations": {}}, "status": {"conditions": []}}}
        self.down = False
        self.missing = False
        self.refuse: str | None = None
        self.calls: list[str] = []
        self.writes: list[tuple[str, str, str]] = []  # (status, reason, message) per condition write
        self.events: list[tuple[str, str]] = []  # (reason, message) per Event on the node

    def _check(self, what: str, name: str) -> dict:
        self.calls.append(what)
        if self.down:
            raise TemporaryError(f"{what} {name}: connection refused")
        if self.refuse:
            raise PermanentError(f"{what} {name}: 403 Forbidden {self.refuse}")
        if self.missing or name not in self.nodes:
            raise NotFound(f"{what} {name}: 404 Not Found")
        return self.nodes[name]

    def get_node(self, name: str) -> dict:
        return copy.deepcopy(self._check("get node", name))

    def patch_node(self, name: str, body: dict) -> dict:
        node = self._check("patch node", name)
        node["metadata"]["annotations"].update(body["metadata"]["annotations"])
        return copy.deepcopy(node)

    def set_condition(self, name, ctype, status, reason, message) -> None:
        node = self._check("set condition", name)
        node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] != ctype] + [
            {"type": ctype, "status": status, "reason": reason, "message": message}]
        self.writes.append((status, reason, message))

    def node_event(self, name, reason, message) -> None:
        self._check("create event", name)
        self.events.append((reason, message))

    def condition(self, name: str = NODE) -> dict | None:
        return next(iter(self.nodes[name]["status"]["conditions"]), None)

    def cursor(self, name: str = NODE) -> Cursor | None:
        return Cursor.parse(self.nodes[name]["metadata"]["annotations"].get(labels.KMSG_REPORTED))


class FakeSleep:
    """Records the waits between retries; `then` runs at each (e.g. the API server comes back)."""

    def __init__(self, then=None):
        self.waits: list[float] = []
        self.then = then

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.then:
            self.then(len(self.waits))


def start(kube, kmsg: Kmsg, sleep=None, clock=None, **kw) -> Agent:
    """An agent over the whole file (as over /dev/kmsg), with the backlog read."""
    ag = Agent(kube, NODE, KernelLog(kmsg.path, from_start=True), sleep=sleep or FakeSleep(),
               clock=clock or (lambda: datetime.now(timezone.utc)), **kw)
    ag.read_backlog()
    return ag


@pytest.fixture
def kmsg(tmp_path):
    return Kmsg(tmp_path / "kmsg")


def test_a_critical_xid_written_during_an_outage_is_reported_once_when_the_api_is_back(kmsg):
    kube = FakeKube()
    ag = start(kube, kmsg)
    ag.connect()
    kube.down = True
    kmsg.write("usb 1-1: new device", XID79)
    ag.read()

    def outage(n):  # the line keeps repeating while the API server is away; back after 6 waits
        kmsg.write(XID79)
        ag.read()
        kube.down = n < 6

    ag._retrying.sleep = sleep = FakeSleep(outage)
    assert ag.report_pending() == 1
    assert kube.writes == [("False", "Xid79", kube.writes[0][2])]
    assert "fallen off the bus" in kube.writes[0][2] and "seen 7 times" in kube.writes[0][2]
    assert len(sleep.waits) == 6 and sleep.waits[-1] > sleep.waits[0]  # backed off
    assert kube.cursor() == Cursor(ag.kernel_log.boot, kmsg.seq)  # every repeat is behind the cursor
    assert len(ag.pending) == 0


def test_backoff_is_capped(kmsg):
    kube = FakeKube()
    ag = start(kube, kmsg, max_backoff=4)
    ag.connect()
    kube.down = True
    kmsg.write(XID79)
    ag.read()
    ag._retrying.sleep = sleep = FakeSleep(lambda n: setattr(kube, "down", n < 20))
    ag.report_pending()
    assert max(sleep.waits) <= 4 + 0.5 and sleep.waits[-1] >= 4  # max_backoff plus at most the jitter


def test_a_missing_node_is_waited_for_with_a_clear_message(kmsg, caplog):
    kube = FakeKube()
    kube.missing = True
    kmsg.write(XID79)
    ag = start(kube, kmsg, sleep=FakeSleep(lambda n: setattr(kube, "missing", n < 3)))
    ag.connect()
    assert ag.report_pending() == 1
    assert kube.condition()["reason"] == "Xid79"
    assert "node gpu-0 not found (is --node right?" in caplog.text


def test_what_retrying_cannot_fix_stops_the_agent_with_the_api_error(kmsg):
    kube = FakeKube()
    kube.refuse = 'nodes "gpu-0" is forbidden: User "system:serviceaccount:x:agent" cannot patch'
    ag = start(kube, kmsg, stop=threading.Event())
    with pytest.raises(AgentFailed, match="node gpu-0: get node gpu-0: 403 Forbidden"):
        ag.run(poll=0.01)


def test_many_gpus_faulting_during_an_outage_fill_a_bounded_queue(kmsg, caplog):
    kube = FakeKube()
    ag = start(kube, kmsg, pending_limit=3)
    ag.connect()
    kmsg.write(*[f"NVRM: Xid (PCI:0000:{i:02x}:00): 79, GPU has fallen off the bus." for i in range(5)])
    ag.read()
    assert (len(ag.pending), ag.pending.refused) == (3, 2)
    assert "not queued" in caplog.text


def test_an_application_xid_is_an_event_and_a_malformed_one_is_counted_never_the_condition(kmsg):
    kube = FakeKube()
    kmsg.write(XID13, "NVRM: Xid (PCI:0000:3b:00): seventy-nine")
    ag = start(kube, kmsg)
    ag.connect()
    assert ag.report_pending() == 0 and kube.writes == []  # the node stays in service
    assert [r for r, _ in kube.events] == ["Xid13"] and "[action=restart-app pci=0000:3b:00]" in kube.events[0][1]
    assert (ag.counts["notices"], ag.counts["unreadable"], ag.counts["faults"]) == (1, 1, 0)


def repair(kube):
    kube.set_condition(NODE, labels.GPU_CONDITION, "True", "HealthCheckPassed", "GPU health check passed")


def test_a_restart_reports_nothing_twice_and_nothing_from_before_the_repair(kmsg):
    kube = FakeKube()
    kmsg.write("usb 1-1: new device", XID79)
    first = start(kube, kmsg)
    first.connect()
    assert first.report_pending() == 1
    repair(kube)
    writes = len(kube.writes)

    again = start(kube, kmsg)  # a restarted agent reads the whole log again
    assert again.connect() == Cursor(again.kernel_log.boot, kmsg.seq)
    assert again.report_pending() == 0 and len(kube.writes) == writes
    assert kube.condition()["status"] == "True"

    kmsg.write(XID48)  # a new fault after the repair is reported
    again.read()
    assert again.report_pending() == 1 and kube.condition()["reason"] == "Xid48"


def test_what_the_kernel_logged_while_the_agent_was_down_is_reported_at_start(kmsg):
    kube = FakeKube()
    first = start(kube, kmsg)
    first.connect()  # a healthy node: the cursor is written at start
    assert kube.cursor() == Cursor(first.kernel_log.boot, -1)
    kmsg.write("usb 1-1: new device")
    first.read()
    # the agent is down now; the kernel logs a fault
    kmsg.write(XID79)
    again = start(kube, kmsg)
    again.connect()
    assert again.report_pending() == 1 and kube.condition()["reason"] == "Xid79"


def test_a_node_reported_on_before_the_cursor_existed_starts_at_the_end_of_the_log(kmsg):
    kube = FakeKube()
    repair(kube)  # an earlier agent (no cursor) reported, and the node was repaired
    kmsg.write(XID79)
    ag = start(kube, kmsg)
    assert ag.connect() == Cursor(ag.kernel_log.boot, kmsg.seq)
    assert ag.report_pending() == 0 and kube.condition()["status"] == "True"


def test_after_a_reboot_the_new_log_is_all_news(kmsg, tmp_path):
    kube = FakeKube()
    kmsg.write(XID79)
    first = start(kube, kmsg)
    first.connect()
    first.report_pending()
    repair(kube)
    rebooted = Kmsg(tmp_path / "kmsg-after-reboot")  # another boot: numbers start again
    rebooted.seq = 0
    rebooted.write(XID48)
    ag = start(kube, rebooted)
    assert ag.connect() == Cursor(ag.kernel_log.boot, -1) != Cursor(first.kernel_log.boot, -1)
    assert ag.report_pending() == 1 and kube.condition()["reason"] == "Xid48"


def test_a_late_report_says_when_the_fault_was_seen(kmsg):
    now = [datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)]
    kube = FakeKube()
    ag = start(kube, kmsg, clock=lambda: now[0])
    ag.connect()
    kube.down = True
    kmsg.write(XID79)
    ag.read()

    def outage(n):
        now[0] += timedelta(seconds=30)
        kube.down = n < 4

    ag._retrying.sleep = FakeSleep(outage)
    ag.report_pending()
    assert "seen at 2026-12-01T09:00:00Z, reported late" in kube.condition()["message"]


def test_run_outlives_an_outage_with_real_threads(kmsg):
    kube = FakeKube()
    kube.down = True
    stop = threading.Event()
    ag = Agent(kube, NODE, KernelLog(kmsg.path), stop=stop, max_backoff=0.05)
    t = threading.Thread(target=ag.run, kwargs={"poll": 0.01})
    t.start()
    try:
        kmsg.write(XID79)
        deadline = datetime.now() + timedelta(seconds=5)
        while ag.counts["faults"] == 0 and datetime.now() < deadline:
            stop.wait(0.01)
        assert ag.counts["faults"] == 1 and kube.writes == []
        kube.down = False
        while not kube.writes and datetime.now() < deadline:
            stop.wait(0.01)
        assert [w[:2] for w in kube.writes] == [("False", "Xid79")]
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_the_command_exits_clearly_for_an_unreadable_log_and_a_refusal(tmp_path, monkeypatch):
    from gpufleet import commands
    from gpufleet.cli import app

    monkeypatch.setattr("gpufleet.reconciler.logs.setup", lambda **_: None)  # keep pytest's log handlers
    runner = CliRunner()
    r = runner.invoke(app, ["agent", "--node", NODE, "--kmsg", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "cannot read the kernel log" in r.output and "No such file" in r.output

    log = Kmsg(tmp_path / "kmsg")
    kube = FakeKube()
    kube.refuse = "cannot patch resource nodes"
    monkeypatch.setattr(commands, "_api", lambda *_: None)
    managers = []
    monkeypatch.setattr("gpufleet.reconciler.adapters.kube.Kube", lambda _api, manager=None: managers.append(manager) or kube)
    r = runner.invoke(app, ["agent", "--node", NODE, "--kmsg", str(log.path)])
    assert r.exit_code == 1 and "403 Forbidden cannot patch resource nodes" in r.output
    assert "Traceback" not in r.output
    assert managers == [labels.MANAGER_AGENT]  # its conditions name it as their reporter (managedFields)


# --- the agent's decisions on the corpus of real-format lines (tests/fixtures/kernel_lines.yaml) ----------

from gpufleet.fleetspec.faults.condition import parse_condition  # noqa: E402
from tests.fixtures.kmsg import corpus_in_forms  # noqa: E402

CORPUS = corpus_in_forms()


def _reason(e: dict) -> str:
    return {"xid": f"Xid{e['code']}", "sxid": f"SXid{e['code']}", "gpu-lost": "GpuLost"}[e["kind"]]


@pytest.mark.parametrize("case,lines,expect", CORPUS, ids=[c[0] for c in CORPUS])
def test_the_agent_reports_each_corpus_event_as_it_needs(case, lines, expect, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("\n".join(lines) + "\n")
    kube = FakeKube()
    ag = Agent(kube, NODE, KernelLog(log, from_start=True), sleep=FakeSleep())
    ag.read_backlog()
    ag.connect()
    ag.report_pending()
    faults = [e for e in expect if e["action"] not in ("none", "restart-app", "diagnose")]
    notices = [e for e in expect if e["action"] in ("restart-app", "diagnose")]
    # the condition: faults that take the node out, and diagnostics asked (the reconciler checks the node in service)
    conds = [e for e in expect if e["action"] not in ("none", "restart-app")]
    written = [(r, parse_condition(r, m)) for _, r, m in kube.writes]
    # every write is one of the expected conditions, with its action and GPU; the first is always written
    assert all((r, s.action.value, s.pci) in {(_reason(e), e["action"], e["pci"]) for e in conds}
               for r, s in written), written
    assert [r for r, _ in written[:1]] == [_reason(e) for e in conds[:1]]
    # a repeat of a reason set already is not rewritten; a diagnose one never over a fault that takes the node out
    assert {_reason(e) for e in faults} <= {r for r, _ in written} <= {_reason(e) for e in conds}
    out = next((i for i, (_, s) in enumerate(written) if s.action.remediates), len(written))
    assert all(s.action.value != "diagnose" for _, s in written[out:])
    # the job's problems are Events on the node, never the condition (a diagnose one only where it is outranked)
    events = {(r, parse_condition(r, m).pci) for r, m in kube.events}
    apps = {(_reason(e), e["pci"]) for e in notices if e["action"] == "restart-app"}
    assert apps <= events <= {(_reason(e), e["pci"]) for e in notices}
    assert ag.counts["faults"] == len(faults) and ag.counts["notices"] == len(notices)


def test_hostile_lines_in_a_file_never_crash_the_agent_and_never_fault_the_node(tmp_path):
    from tests.unit.test_kmsg import HOSTILE

    log = tmp_path / "kern.log"
    with open(log, "w") as f:
        for why, line in sorted(HOSTILE.items()):
            if why != "a 1 MB line":  # a kernel line, cut to its head: it is the kernel's 79 (test_kmsg)
                f.write(line + "\n")
        f.write("x" * (3 * 1024 * 1024) + "NVRM: Xid (PCI:0000:3b:00): 79, hidden far out\n")  # 3 MB, no prefix
        f.write("\udcff\n".encode("utf-8", "surrogateescape").decode("latin-1"))
    with open(log, "ab") as f:
        f.write(b"\xff\xfe\x00 binary \x80\x81\n")
    kube = FakeKube()
    ag = Agent(kube, NODE, KernelLog(log, from_start=True), sleep=FakeSleep())
    ag.read_backlog()
    ag.connect()
    assert ag.report_pending() == 0 and kube.writes == [] and kube.events == []
    assert ag.counts["unreadable"] >= 6 and ag.counts["untrusted"] >= 4 and ag.counts["faults"] == 0
    assert ag.kernel_log.overlong == 1


def test_a_spec_override_changes_what_the_agent_reports(kmsg):
    from gpufleet.fleetspec.faults import FaultAction
    from gpufleet.fleetspec.faults.policy import FaultPolicy

    line = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
    kmsg.write(line)
    plain, strict = FakeKube(), FakeKube()
    for kube, policy in ((plain, None), (strict, FaultPolicy(xid={94: FaultAction.RESET_GPU}))):
        ag = start(kube, kmsg, policy=policy)
        ag.connect()
        ag.report_pending()
    assert plain.writes == [] and [r for r, _ in plain.events] == ["Xid94"]
    (status, reason, message), = strict.writes
    sig = parse_condition(reason, message)
    assert (status, sig.action, sig.pci, sig.gpu_instance) == ("False", FaultAction.RESET_GPU, "0000:01:00", 5)
    assert strict.events == []


def test_three_xid_13_bursts_on_one_gpu_leave_the_node_in_service_and_ask_for_diagnostics(tmp_path):
    """A crashing training script: the same Xid 13 exception (github.com/leptonai/gpud/pull/46's three lines) three
    times on one GPU within the hour. Once is the job's; repeated on the same GPC and TPC, NVIDIA's RUN_DCGMEUD:
    diagnostics are asked: the GPU condition says `action=diagnose` (the reconciler checks the node while it stays
    in service: nothing is cordoned for the fault, retired or terminated), once; the first burst is an Event."""
    burst = ["NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
             "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
             "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on "
             "(GPC 7, TPC 7, SM 0): Multiple Warp Errors",
             "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR "
             "0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174"]
    lines, seq = [], 100
    for minute in (0, 20, 40):
        for i, text in enumerate(burst):
            seq += 1
            lines.append(f"3,{seq},{(minute * 60 + i) * 1_000_000},-;{text}")
    log = tmp_path / "kern.log"
    log.write_text("\n".join(lines) + "\n")
    kube = FakeKube()
    ag = Agent(kube, NODE, KernelLog(log, from_start=True), sleep=FakeSleep())
    ag.read_backlog()
    ag.connect()
    ag.report_pending()
    (_, reason, message), = kube.writes  # one condition: the diagnosis asked, not rewritten by the third burst
    assert reason == "Xid13" and parse_condition(reason, message).action.value == "diagnose"
    actions = [parse_condition(r, m).action.value for r, m in kube.events]
    assert actions == ["restart-app"] and {r for r, _ in kube.events} == {"Xid13"}
    assert ag.counts["faults"] == 0 and ag.counts["notices"] == 9


def test_diagnostics_asked_never_overwrite_a_fault_that_takes_the_node_out(tmp_path):
    """A repeated Xid 13 on a node whose condition already says a reboot is needed: the diagnose one is an Event;
    the condition keeps the fault that takes the node out (written over, the reconciler would see a mild fault)."""
    line = ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
            "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    log = tmp_path / "kern.log"
    log.write_text("".join(f"3,{seq},{minute * 60_000_000},-;{line}\n" for seq, minute in ((101, 0), (102, 20))))
    kube = FakeKube()
    ag = Agent(kube, NODE, KernelLog(log, from_start=True), sleep=FakeSleep())
    ag.read_backlog()
    ag.connect()
    kube.nodes[NODE]["status"]["conditions"] = [{"type": "GpuHealthy", "status": "False", "reason": "Xid79",
                                                 "message": "[action=reboot pci=0000:3b:00] XID 79: off the bus"}]
    ag.report_pending()
    assert kube.writes == []
    assert [parse_condition(r, m).action.value for r, m in kube.events] == ["restart-app", "diagnose"]
