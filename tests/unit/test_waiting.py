"""The shared polling loop: a timeout says what it waited for, the last value, and why (when asked)."""
import pytest

from gpufleet.waiting import wait_for


def test_returns_the_first_truthy_value():
    seen = iter([None, 0, "", "ready"])
    assert wait_for("it", lambda: next(seen), timeout=5, interval=0) == "ready"


def test_timeout_names_the_wait_the_last_value_and_the_explanation():
    with pytest.raises(TimeoutError) as e:
        wait_for("the job to run", lambda: None, timeout=0.05, interval=0.01, explain=lambda: "squeue: PENDING Priority")
    msg = str(e.value)
    assert "the job to run" in msg and "last: None" in msg and msg.endswith("\nsqueue: PENDING Priority")


def test_a_failing_explanation_does_not_hide_the_timeout():
    def broken() -> str:
        raise ConnectionError("slurmctld gone")

    with pytest.raises(TimeoutError, match=r"(?s)waiting for it .*no explanation: ConnectionError: slurmctld gone"):
        wait_for("it", lambda: None, timeout=0.02, interval=0.01, explain=broken)
