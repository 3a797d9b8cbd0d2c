"""Unit tests load no fixture plugin: a test of the pure core or of the runtime with fakes imports
neither the local environment nor anything that starts a process (tests/unit/fakes.py holds the fakes)."""
