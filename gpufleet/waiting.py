"""Wait for a condition with a deadline: the one polling loop the demo, the benches and the tests share."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25,
             explain: Callable[[], str] | None = None) -> Any:
    """Call `fn` until it returns something truthy and return that; TimeoutError after `timeout` s, its
    message ending with what `explain` says of the state it timed out in (so a failure says why)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    why = ""
    if explain is not None:
        try:
            why = "\n" + explain()
        except Exception as e:  # the explanation must not hide the timeout
            why = f"\n(no explanation: {type(e).__name__}: {e})"
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){why}")
