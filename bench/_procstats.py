"""CPU time and memory of the processes a benchmark measures (psutil)."""
from __future__ import annotations

import threading

import psutil


def rss_kib(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except psutil.Error:
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of the process (all its threads), in seconds."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


class TreeSampler:
    """Samples the summed RSS of a process tree every `every` seconds (peak kept, and the largest single
    process's)."""

    def __init__(self, pid: int, every: float = 0.1):
        self.pid, self.every = pid, every
        self.peak_kib = 0
        self.peak_single_kib = 0
        self.peak_single_name = ""
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeSampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in tree(self.pid):
                try:
                    rss, name = p.memory_info().rss // 1024, p.name()
                except psutil.Error:
                    continue
                total += rss
                if rss > self.peak_single_kib:
                    self.peak_single_kib, self.peak_single_name = rss, name
            self.peak_kib = max(self.peak_kib, total)
            self._stop.wait(self.every)
