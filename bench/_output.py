"""What a benchmark prints: progress on stderr, result tables on stdout (Markdown, or one JSON document
with `--json`), and the percentiles in them."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

import psutil


def exit_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) ends the script through its `finally` blocks, so whatever it
    started (control plane, Slurm, reconciler) is torn down."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def say(msg: str) -> None:
    """A progress line, on stderr: stdout carries only the result (tables, or JSON with --json)."""
    print(f"{datetime.now().strftime('%H:%M:%S')} [load {load():.2f}] {msg}", file=sys.stderr, flush=True)


def load() -> float:
    return os.getloadavg()[0]


def machine() -> str:
    mem = psutil.virtual_memory().total // (1024 ** 3)
    return f"{os.cpu_count()} cores, {mem} GiB, Python {platform.python_version()}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (pastes into bench/README.md as is)."""
    rows = [[_cell(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(list(headers)), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


@dataclass
class Table:
    """One result table: printed as Markdown, or one entry of the --json document (rows keyed by
    column). `notes` are the lines printed under it."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    notes: Sequence[str] = field(default_factory=list)

    def markdown(self) -> str:
        out = [self.title, "", table(self.columns, self.rows)]
        return "\n".join(out + ([""] + list(self.notes) if self.notes else []))

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns),
                "rows": [dict(zip(self.columns, r)) for r in self.rows], "notes": list(self.notes)}


def add_json_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="machine output: one JSON document (each table's rows keyed by column, and every "
                         "measurement under 'raw') on stdout instead of the tables; with FILE, written there "
                         "and the tables printed as usual")


def parse_bench_args(ap: argparse.ArgumentParser, argv: Sequence[str] | None, bench: str) -> tuple[argparse.Namespace, "Output"]:
    """The options every script that starts an environment shares (`--root`, `--keep`, `--json`), then
    parse; returns the arguments and where the result goes. A SIGTERM from here on tears down too."""
    ap.add_argument("--root", type=Path, help="work folder (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="leave the work folder (logs) in place")
    add_json_option(ap)
    a = ap.parse_args(argv)
    out = Output(bench, a.json)
    exit_on_sigterm()
    return a, out


class Output:
    """Where a script's result goes (stdout: tables, or JSON with `--json`). Made at the start: with
    JSON on stdout, anything else printed meanwhile is sent to stderr, so stdout parses."""

    def __init__(self, bench: str, json_arg: str | None):
        self.bench, self.json_arg = bench, json_arg
        self.stdout = sys.stdout
        if json_arg == "-":
            sys.stdout = sys.stderr

    def emit(self, tables: Sequence[Table], raw: Any = None, **meta: Any) -> None:
        doc = {"bench": self.bench, "argv": sys.argv[1:], "machine": machine(),
               "date": datetime.now().isoformat(timespec="seconds"), **meta, "tables": [t.as_dict() for t in tables], "raw": raw}
        text = json.dumps(doc, indent=2, default=str)
        if self.json_arg == "-":
            sys.stdout = self.stdout
            print(text, flush=True)
            return
        if self.json_arg:
            Path(self.json_arg).write_text(text + "\n")
        for t in tables:
            print(file=self.stdout)
            print(t.markdown(), file=self.stdout, flush=True)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def pct(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100), linear interpolation between closest ranks."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
