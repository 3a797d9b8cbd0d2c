"""Fixtures live with the tests that use them: tests/integration/conftest.py and tests/e2e/conftest.py
load the ones with real parts (a control plane, Slurm, the Pulumi engine, images); tests/unit loads none."""
