"""The work queue: de-duplicated, one worker per key, delays, per-key backoff, the front of the line."""
from __future__ import annotations

from gpufleet.reconciler.runtime.workqueue import WorkQueue


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_key_is_queued_once_and_processed_by_one_worker_at_a_time():
    q = WorkQueue()
    for _ in range(3):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(timeout=0) == "a"
    q.add("a")  # an event while "a" is being processed: queued again only after done
    assert q.get(timeout=0) == "b" and q.get(timeout=0) is None
    q.done("a")
    assert q.get(timeout=0) == "a"


def test_delays_take_the_earliest_and_come_due_on_the_clock():
    c = Clock()
    q = WorkQueue(clock=c)
    q.add_after("a", 10)
    q.add_after("a", 5)
    q.add_after("a", 20)
    c.t = 4.9
    assert q.get(timeout=0) is None
    c.t = 5
    assert q.get(timeout=0) == "a" and q.get(timeout=0) is None  # once, at the earliest time


def test_backoff_is_per_key_and_forgotten_on_success():
    c = Clock()
    q = WorkQueue(clock=c, base_delay=1, max_delay=8)
    assert [q.add_failed("a") for _ in range(5)] == [1, 2, 4, 8, 8]
    assert q.add_failed("b") == 1  # another key is not slowed
    q.forget("a")
    assert q.add_failed("a") == 1


def test_a_new_fault_goes_to_the_front_and_a_burst_keeps_its_order():
    """First in, first contained: under a burst, newest-first would leave the earliest fault waiting longest."""
    q = WorkQueue()
    for k in ("a", "b", "c"):
        q.add(k)
    q.add("c", front=True)
    q.add("d", front=True)
    q.add("c", front=True)  # already at the front: keeps its place
    assert [q.get(timeout=0) for _ in range(4)] == ["c", "d", "a", "b"]


def test_a_containment_step_comes_after_new_faults_and_before_the_rest():
    q = WorkQueue()
    for k in ("a", "b"):
        q.add(k)
    q.add("s1", soon=True)
    q.add("f", front=True)
    q.add("s2", soon=True)
    q.add("b", soon=True)  # already waiting: moved up to the containment line
    q.add("s1")  # a later plain add does not move it back
    assert [q.get(timeout=0) for _ in range(5)] == ["f", "s1", "s2", "b", "a"]


def test_a_key_added_soon_while_processing_comes_back_soon():
    q = WorkQueue()
    q.add("x")
    assert q.get(timeout=0) == "x"
    q.add("x", soon=True)  # asked for while its reconcile runs
    q.add("x")  # the reconcile's own requeue (delay 0)
    q.add("y")
    q.done("x")
    assert [q.get(timeout=0) for _ in range(2)] == ["x", "y"]
