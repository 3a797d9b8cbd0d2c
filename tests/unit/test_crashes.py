"""A reconciler killed at every point of a remediation, restarted, and run to the end: what each
once-only action guarantees, checked at every crash point.

The guarantees are data (`GUARANTEES`): a page is at most once, sent exactly once unless the crash fell
between the write that noted its intent and its send (then never: the restarted reconciler sees the
intent); the SIGTERM is at least once (issue 23), sent exactly once unless the crash fell between its send
and the write that marks it delivered (then twice: the restarted reconciler sees the intent without the mark
and sends again). A crash between the intent and the send costs it nothing: it is sent after the restart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import pytest

from gpufleet.reconciler.adapters.slurm import SlurmJob
from gpufleet.reconciler.core.phases import Phase
from gpufleet.reconciler.core.repair_phases import RepairPhase
from tests.unit.fakes import FakeNodes, World, fleet


class Guarantee(Enum):
    AT_MOST_ONCE = "at most once"  # exactly once, or never when the crash fell between the intent and the send
    AT_LEAST_ONCE = "at least once"  # exactly once, or twice when the crash fell between the send and its mark
    # exactly once: acted on once per request id, and a request lost between intent and send is asked again
    # (a new id) once nothing shows it went out (issue 25: a reset, a reboot)
    EXACTLY_ONCE = "exactly once"

    def counts(self, point: "CrashPoint", key: str) -> set[int]:
        if self is Guarantee.EXACTLY_ONCE:
            return {1}
        if self is Guarantee.AT_MOST_ONCE:
            return {0} if point.noted_not_sent(key) else {1}
        return {1, 2} if point.sent_not_marked(key) else {1}


GUARANTEES: dict[str, Guarantee] = {
    "signal:TERM": Guarantee.AT_LEAST_ONCE,
    "notify:detected": Guarantee.AT_MOST_ONCE,
    "repair:reboot": Guarantee.EXACTLY_ONCE,  # also repair:reset-gpu: the same request path
    "notify:retired": Guarantee.AT_MOST_ONCE,
}


class Crash(BaseException):
    """The reconciler dies here (not an error it could handle)."""


@dataclass
class CrashPoint:
    at: int  # the call that was not made
    call: str = ""  # which one it was ("" when the run ended before it)
    made: int = 0  # calls made (or refused by the crash)
    intents: tuple[str, ...] = ()  # noted on the remediation when it died
    delivered: tuple[str, ...] = ()  # of those, marked delivered (at-least-once actions)
    sent: dict[str, int] = field(default_factory=dict)  # once-only actions made before it died

    def noted_not_sent(self, key: str) -> bool:
        """Whether the crash fell after the write that noted `key` and before its send."""
        return key in self.intents and not self.sent.get(key)

    def sent_not_marked(self, key: str) -> bool:
        """Whether the crash fell after `key`'s send and before the write that marks it delivered."""
        return bool(self.sent.get(key)) and key not in self.delivered


def crash_after(w: World, n: int, calls, seconds: float, sent: Callable[[], dict[str, int]]) -> CrashPoint:
    """Run the world until the n-th of these calls (object, method), which kills the reconciler before it
    is made; then restart it: fresh caches, queue and timers, the same API objects."""
    made = {"n": 0}
    point = CrashPoint(n)
    originals = {}

    def counting(name, fn):
        def wrapped(*a, **kw):
            made["n"] += 1
            if made["n"] == n:
                point.call = name
                raise Crash()
            return fn(*a, **kw)
        return wrapped

    for obj, name in calls:
        originals[(obj, name)] = getattr(obj, name)
        setattr(obj, name, counting(name, getattr(obj, name)))
    try:
        w.run(seconds=seconds)
    except Crash:
        pass
    for (obj, name), fn in originals.items():
        setattr(obj, name, fn)
    point.made = made["n"]
    point.intents = tuple(i for r in w.store.list() for i in r.intents)
    point.delivered = tuple(i for r in w.store.list() for i in r.delivered)
    point.sent = sent()
    w.restart()
    return point


def assert_guarantees(point: CrashPoint, sent: dict[str, int], keys) -> None:
    for key in keys:
        want = GUARANTEES[key].counts(point, key)
        assert sent[key] in want, (f"{key} sent {sent[key]} times; {GUARANTEES[key].value} with a crash at call "
                                   f"{point.at} ({point.call or 'none'}) allows {sorted(want)}")


SIGTERM_PATH = 8  # crash points of the first test: every call until the SIGTERM is marked delivered
CARRIED_PATH = 12  # of the second: every call until the promotion


def sigterm_path(w: World) -> list:
    return [(w.store, "write_status"), (w.store, "create"), (w.kube, "cordon"), (w.slurm, "drain"),
            (w.slurm, "signal_jobs"), (w.slurm, "requeue"), (w.notifier, "send")]


def carried_path(w: World) -> list:
    return [(w.store, "write_status"), (w.store, "create"), (w.kube, "cordon"), (w.slurm, "drain"),
            (w.kube, "evict"), (w.provider, "promote"), (w.provider, "quarantine"), (w.notifier, "send")]


@pytest.mark.parametrize("crash_at", range(1, SIGTERM_PATH + 1))
def test_one_sigterm_and_one_page_across_a_crash_at_every_point(crash_at):
    """Kill the reconciler at its n-th write (any write: a remediation, a cordon, a Slurm call, a page),
    restart it, and finish."""
    w = World(fleet(grace_period_seconds=60))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")

    def sent():
        return {"signal:TERM": sum(1 for c in w.slurm.calls if c[0] == "signal"),
                "notify:detected": w.notifier.sent.count("detected")}

    point = crash_after(w, crash_at, sigterm_path(w), 2, sent)
    w.run(seconds=70)  # the job ignores the SIGTERM: the grace runs out and the requeue ends it
    assert_guarantees(point, sent(), ("signal:TERM", "notify:detected"))
    assert ("requeue", (7,)) in w.slurm.calls
    assert w.remediation("h100-0").phase in (Phase.RESUMING, Phase.SUCCEEDED)


@pytest.mark.parametrize("crash_at", range(1, CARRIED_PATH + 1))
def test_a_crash_amid_carried_steps_repeats_no_page_and_promotes_one_spare(crash_at):
    """Kill the reconciler at its n-th call (writes, cordon, drain, eviction, promotion, quarantine,
    page) on the path where most steps carry, restart it, and finish."""
    w = World(fleet(grace_period_seconds=0))
    w.fault("h100-0")

    def sent():
        return {"notify:detected": w.notifier.sent.count("detected")}

    point = crash_after(w, crash_at, carried_path(w), 4, sent)
    w.run(seconds=6)
    r = w.remediation("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"
    assert {c[1] for c in w.provider.calls if c[0] == "promote"} == {"h100-spare-0"}
    assert_guarantees(point, sent(), ("notify:detected",))
    assert ("cordon", "h100-0") in w.kube.calls


@pytest.mark.parametrize("grace, job, path, seconds, points", [(60, True, sigterm_path, 2, SIGTERM_PATH),
                                                               (0, False, carried_path, 4, CARRIED_PATH)])
def test_the_crash_points_cover_every_call_of_the_path(grace, job, path, seconds, points):
    """The ranges above crash at every call a run makes in its window, or a point would be missing."""
    w = World(fleet(grace_period_seconds=grace))
    if job:
        w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")
    point = crash_after(w, 10_000, path(w), seconds, lambda: {})
    assert point.call == "" and point.made == points


def counted_writes(w) -> list[tuple[str, str]]:
    """The remediation writes the runtime makes, as (create | status, phase written)."""
    made: list[tuple[str, str]] = []
    for name in ("create", "write_status"):
        fn = getattr(w.store, name)

        def wrapped(r, _fn=fn, _name=name):
            made.append((_name, r.phase.value))
            return _fn(r)
        setattr(w.store, name, wrapped)
    return made


def test_steps_that_carry_are_written_with_the_next_and_every_phase_stays_on_the_remediation():
    """No job on the node, grace 0. The first reconcile cordons, creates the remediation and writes its
    status (before any Slurm call, so its page goes out first), drains in Slurm and writes the end of
    containment. Admission, eviction's end and the spare's choice are one more write; the promotion one
    more (it waits for the Slurm node on the replacement). Not one write per phase."""
    w = World(fleet(grace_period_seconds=0))
    writes = counted_writes(w)
    at_create = []
    create = w.store.create

    def creating(r):
        at_create.append((list(w.notifier.sent), list(w.slurm.calls), list(w.kube.calls)))
        return create(r)
    w.store.create = creating
    w.fault("h100-0")
    w.sync()
    node = w.manager.queue.get(timeout=0)
    assert node == "h100-0"  # a new fault is first in line
    w.manager.process(node)  # one reconcile
    assert writes == [("create", "SlurmDraining"), ("write_status", "SlurmDraining"), ("write_status", "Requeued")]
    assert at_create == [([], [], [("cordon", "h100-0")])]  # cordoned, nothing sent or asked of Slurm yet
    assert w.notifier.sent == ["detected"] and ("drain", "h100-w0") in w.slurm.calls
    w.run(seconds=3)
    r = w.remediation("h100-0")
    assert r.phase is Phase.RESUMING and r.replacement == "h100-spare-0"
    assert [p for p, _ in r.phase_times] == ["Detected", "SlurmDraining", "Checkpointing", "Requeued", "Evicting",
                                             "Replacing", "Resuming"]
    # the NodeSet pod's eviction is waited for (written), then the choice, then the promotion
    assert [p for n, p in writes if n == "write_status"] == ["SlurmDraining", "Requeued", "Evicting", "Replacing",
                                                              "Resuming"]
    assert w.notifier.sent.count("detected") == 1
    assert [c for c in w.kube.calls if c[0] == "evict"] == [("evict", "slurm-worker-h100-w0")]  # asked once


# --- the repair loop (issue 25): a reconciler killed in each repair phase ----------------------------------



def repair_path(w: World) -> list:
    """Every call a repair makes after the heal: its writes, the request to the node, the health-check Job,
    the check noted on the node, the fault condition cleared, the return to the spares."""
    return [(w.store, "write_status"), (w.provider, "request_repair"), (w.checks, "start"), (w.kube, "patch_node"),
            (w.kube, "set_condition"), (w.provider, "return_to_spares")]


def faulted_world(state: str) -> World:
    """A node whose GPUs a reboot fixes (or nothing does), faulted: its heal, then its repair, follow."""
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0), operator=True)
    w.hardware.state["h100-0"] = getattr(FakeNodes, state)
    w.fault("h100-0")
    return w


REPAIR_CALLS = 14  # of repair_path's calls from the fault to the node back among the spares


def test_the_repair_crash_points_cover_every_call():
    """The test below crashes at each call a run makes, or a point would be missing."""
    w = faulted_world("REBOOT_FIXES")
    point = crash_after(w, 10_000, repair_path(w), 300, lambda: {})
    assert point.call == "" and point.made == REPAIR_CALLS
    assert w.remediation("h100-0").repair.phase is RepairPhase.RETURNED


@pytest.mark.parametrize("crash_at", range(1, REPAIR_CALLS + 1))
def test_a_reconciler_killed_in_each_repair_phase_resumes_without_repeating_a_reboot(crash_at):
    """Killed at its n-th call from the fault on (the heal's writes, then the repair's in each phase: asking
    for the reboot, waiting for it, starting the health check, reading it, returning the node), restarted,
    and run to the end: one reboot, one health check however often its create was asked, the node back
    among the spares."""
    w = faulted_world("REBOOT_FIXES")
    point = crash_after(w, crash_at, repair_path(w), 300, lambda: {})
    w.run(seconds=900, step=5)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETURNED, (point, r.repair)
    assert len(w.hardware.reboots) in GUARANTEES["repair:reboot"].counts(point, "repair:reboot"), \
        (point.call, w.hardware.reboots)
    assert w.hardware.resets == []
    assert len(set(w.checks.jobs)) == 1  # one health check, however often its create was asked for


@pytest.mark.parametrize("crash_at", range(1, 8))
def test_a_reconciler_killed_while_retiring_pages_at_most_once_and_retires(crash_at):
    w = faulted_world("BROKEN")
    calls = repair_path(w) + [(w.provider, "retire"), (w.notifier, "send")]
    point = crash_after(w, crash_at, calls, 300, lambda: {"notify:retired": w.notifier.sent.count("retired")})
    w.run(seconds=900, step=5)
    r = w.remediation("h100-0")
    assert r.repair.phase is RepairPhase.RETIRED and len(w.hardware.reboots) == 1
    assert w.notifier.sent.count("retired") in GUARANTEES["notify:retired"].counts(point, "notify:retired")


def test_a_sigterm_noted_but_never_sent_is_sent_after_the_restart_and_marked_delivered():
    """The drill's lost SIGTERM: the Lease holder killed right after the record noted the intent, before the
    signal went out. The restarted reconciler sends it (the job checkpoints within the grace), and marks it."""
    w = World(fleet(grace_period_seconds=120))
    w.slurm.jobs[7] = SlurmJob(7, "train", "RUNNING", nodes=("h100-w0",))
    w.fault("h100-0")
    point = crash_after(w, 1, [(w.slurm, "signal_jobs")], 2, lambda: {})  # killed as it would send
    assert point.call == "signal_jobs" and "signal:TERM" in point.intents
    w.run(seconds=3)
    assert [c for c in w.slurm.calls if c[0] == "signal"] == [("signal", (7,))]
    assert "signal:TERM" not in point.delivered  # the record told the intent from a delivery
    r = w.remediation("h100-0")
    assert r.phase is Phase.CHECKPOINTING and r.delivered == ("signal:TERM",) and r.signalled == (7,)
    w.slurm.jobs[7] = SlurmJob(7, "train", "COMPLETED", nodes=("h100-w0",))  # it checkpointed and ended
    w.run(seconds=5)
    assert [c for c in w.slurm.calls if c[0] == "signal"] == [("signal", (7,))]
    assert w.remediation("h100-0").phase is not Phase.CHECKPOINTING


GUARANTEES["notify:diagnosis-passed"] = Guarantee.AT_MOST_ONCE
DIAGNOSIS_PATH = 17  # every call of a diagnosis that passes, from the record's create to its page


def diagnosis_path(w: World) -> list:
    return [(w.store, "write_status"), (w.store, "create"), (w.slurm, "drain"), (w.kube, "cordon"), (w.kube, "evict"),
            (w.checks, "start"), (w.kube, "patch_node"), (w.kube, "set_condition"), (w.provider, "back_in_service"),
            (w.slurm, "resume"), (w.notifier, "send")]


def diagnosing_world() -> World:
    from tests.unit.test_diagnosis import diagnose_fault
    w = World(fleet(nodes=4, spares=2, grace_period_seconds=0), operator=True)
    diagnose_fault(w, "h100-0")
    return w


@pytest.mark.parametrize("crash_at", range(1, DIAGNOSIS_PATH + 1))
def test_a_diagnosis_killed_at_every_point_resumes_and_never_repeats(crash_at):
    """Diagnostics asked on an idle node: drained, cleared, checked, passed. Kill the reconciler at each call,
    restart it: one health-check Job, the node back in service and its Slurm node resumed, the page at most once,
    and the record ends Passed (never taken for a condition cleared by someone else)."""
    from gpufleet.reconciler.core.diagnosis_stages import Stage
    w = diagnosing_world()

    def sent():
        return {"notify:diagnosis-passed": w.notifier.sent.count("diagnosis-passed")}

    point = crash_after(w, crash_at, diagnosis_path(w), 60, sent)
    w.run(seconds=120)
    r = w.remediation("h100-0")
    assert r.phase is Phase.SUCCEEDED and r.diagnosis.stage is Stage.PASSED, (point, r.diagnosis)
    assert len(set(w.checks.started)) == 1
    assert w.slurm.table["h100-w0"].reason == "" and not w.kube.nodes["h100-0"]["spec"].get("unschedulable")
    assert not any(c[0] in ("promote", "quarantine", "retire") for c in w.provider.calls)
    assert_guarantees(point, sent(), ("notify:diagnosis-passed",))


def test_the_crash_points_cover_every_call_of_a_diagnosis():
    w = diagnosing_world()
    point = crash_after(w, 10_000, diagnosis_path(w), 60, lambda: {})
    assert point.call == "" and point.made == DIAGNOSIS_PATH
