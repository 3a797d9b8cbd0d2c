"""Stands in for a cluster's log shipper, so that a pod's container logs outlive the pod.

On a real cluster a log shipper (Fluent Bit, Vector, a cloud's logging agent: a DaemonSet) tails each
node's pod log folder and sends the lines off the node; that is where a deleted pod's lines are read,
because the kubelet removes a deleted pod's log folder (pkg/kubelet/kuberuntime/kuberuntime_gc.go,
evictPodLogsDirectories, v1.34.4) and `kubectl logs` then has nothing to read. (`kubectl logs --previous`
covers a restarted container: the kubelet keeps its previous log while the pod exists.)

Here one runs per kubelet node and copies each container log, ``<ns>_<pod>_<uid>/<container>/<n>.log``
under the kubelet's ``podLogsDir``, as it grows, to the same path under ``--dest`` (the environment's
``logs/pods/``), in the runtime's format (CRI: ``<time> <stream> <P|F> <line>``). Like Fluent Bit's tail
input it remembers how far it read each file (an offsets file in ``--dest``), and it holds each file open,
so the last lines of a file that is rotated or deleted between two looks are copied too.

    python -m localenv.log_shipper --source PODLOGSDIR --dest ARCHIVE [--interval 0.5]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpufleet.stop_signal import set_on_signals

OFFSETS = ".offsets.json"
PATTERN = "*/*/*.log"  # <ns>_<pod>_<uid>/<container>/<restart>.log; rotated files (<n>.log.<time>) are not
CHUNK = 1 << 20


@dataclass
class _Tail:
    file: BinaryIO
    inode: int
    dest: Path


class Shipper:
    """Copies what was appended to the container logs under ``source`` since the last :meth:`poll`."""

    def __init__(self, source: Path, dest: Path) -> None:
        self.source, self.dest = Path(source), Path(dest)
        self._tails: dict[str, _Tail] = {}
        self._offsets: dict[str, tuple[int, int]] = {}  # relative path -> (inode, offset), persisted
        try:
            doc = json.loads((self.dest / OFFSETS).read_text())
            self._offsets = {k: (int(v[0]), int(v[1])) for k, v in doc.items()}
        except (OSError, ValueError, TypeError, IndexError):
            pass

    def poll(self) -> int:
        """One look: returns the number of bytes copied."""
        copied = 0
        seen = set()
        for src in sorted(self.source.glob(PATTERN)):
            rel = str(src.relative_to(self.source))
            seen.add(rel)
            try:
                inode = src.stat().st_ino
            except FileNotFoundError:
                continue
            tail = self._tails.get(rel)
            if tail is not None and tail.inode != inode:  # rotated: finish the old file, go on with the new
                copied += self._drain(rel, tail)
                self._close(rel)
                tail = None
            if tail is None:
                tail = self._open(rel, src)
                if tail is None:
                    continue
            copied += self._drain(rel, tail)
        for rel in [r for r in self._tails if r not in seen]:  # deleted: what is left in it, then let go
            copied += self._drain(rel, self._tails[rel])
            self._close(rel)
            self._offsets.pop(rel, None)
        if copied:
            self._save()
        return copied

    def close(self) -> None:
        for rel in list(self._tails):
            self._close(rel)

    def _open(self, rel: str, src: Path) -> _Tail | None:
        try:
            f = open(src, "rb")  # noqa: SIM115 - held open across polls
        except FileNotFoundError:
            return None
        inode = os.fstat(f.fileno()).st_ino
        known = self._offsets.get(rel)
        if known is not None and known[0] == inode:
            f.seek(known[1])
        tail = self._tails[rel] = _Tail(f, inode, self.dest / rel)
        tail.dest.parent.mkdir(parents=True, exist_ok=True)
        return tail

    def _drain(self, rel: str, tail: _Tail) -> int:
        n = 0
        with open(tail.dest, "ab") as out:
            while chunk := tail.file.read(CHUNK):
                out.write(chunk)
                n += len(chunk)
        self._offsets[rel] = (tail.inode, tail.file.tell())
        return n

    def _close(self, rel: str) -> None:
        tail = self._tails.pop(rel, None)
        if tail is not None:
            tail.file.close()

    def _save(self) -> None:
        self.dest.mkdir(parents=True, exist_ok=True)
        tmp = self.dest / (OFFSETS + ".tmp")
        tmp.write_text(json.dumps({k: list(v) for k, v in self._offsets.items()}))
        os.replace(tmp, self.dest / OFFSETS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.log_shipper", description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="the kubelet's podLogsDir")
    ap.add_argument("--dest", type=Path, required=True, help="where the copies go")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between two looks")
    args = ap.parse_args(argv)
    stop = threading.Event()
    set_on_signals(stop, (signal.SIGTERM, signal.SIGINT))  # never from inside the handler: gpufleet/stop_signal.py
    shipper = Shipper(args.source, args.dest)
    print(f"copying container logs from {args.source} to {args.dest} every {args.interval}s", flush=True)
    while not stop.is_set():
        shipper.poll()
        stop.wait(args.interval)
    shipper.poll()  # what was written since the last look
    shipper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
