# The two commands of the README's Quickstart, and their building blocks.
.PHONY: demo demo-lending test bootstrap unit clean-local lock

demo: bootstrap
	.venv/bin/gpufleet demo

demo-lending: bootstrap
	.venv/bin/gpufleet demo --lending

test: bootstrap
	.venv/bin/python -m pytest -q

bootstrap:
	scripts/bootstrap.sh

unit:
	.venv/bin/python -m pytest -q tests/unit

clean-local:
	-.venv/bin/gpufleet local down
	rm -rf .local

# After changing a dependency in pyproject.toml: the lock files (versions and hashes), then commit them.
lock:
	scripts/lock.sh
