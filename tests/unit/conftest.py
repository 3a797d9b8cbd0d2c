"""Unit tests load no fixture plugin: a test of the pure core or of the runtime with fakes imports
neither the local environment nor anything that starts a process (tests/unit/fakes.py holds the fakes)."""

import logging

import pytest


@pytest.fixture
def root_logging():
    """For a test that sets the reconciler's logging up (`reconcile`, logs.setup) on a stream the test owns:
    the session's root logger back afterwards, so no later thread logs into a stream closed by then."""
    from reconciler import logs

    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    if logs._listener is not None:
        logs._listener.stop()
        logs._listener = None
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
