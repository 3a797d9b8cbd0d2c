"""gpufleet's stack program: load the environment's spec, build the fleet, export what an operator needs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's packages, without an install

from infra.program import build  # noqa: E402

build()
