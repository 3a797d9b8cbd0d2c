"""Where the project's built tools are: the pulumi CLI and its plugins (`scripts/build-tools.sh`)."""
from __future__ import annotations

from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
TOOLS_BIN = PROJECT_DIR / ".tools" / "bin"
