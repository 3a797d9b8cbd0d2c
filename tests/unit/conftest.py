"""Unit tests load no fixture plugin: a test of the pure core or of the runtime with fakes imports
neither the local environment nor anything that starts a process (tests/unit/fakes.py holds the fakes)."""

import logging

import pytest


@pytest.fixture(autouse=True)
def root_logging():
    """Every test: the session's root logger back afterwards. A test that sets the reconciler's logging up
    (`reconcile` through the CLI runner, logs.setup) leaves it writing to a stream the test owned, and a later
    test's log line would then fail in the writer thread ("Logging error")."""
    from gpufleet.reconciler import logs

    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    if logs._listener is not None:
        logs._listener.stop()
        logs._listener = None
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
