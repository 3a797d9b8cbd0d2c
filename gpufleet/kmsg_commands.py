"""`gpufleet classify-kmsg`: explain a kernel log the way the node agent reads it, for on-call.

The same parser (reconciler/agent/kmsg.py, fleetspec/faults/driver.py) and the same classifier and catalogue
(fleetspec/faults/classify.py, fleetspec/faults) as the agent, so what it prints is what the agent
would have reported.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import typer

from gpufleet.console import EXIT_INVALID, _err, app, load_spec

CHUNK = 64 * 1024


def bounded_lines(stream: BinaryIO, most: int) -> Iterator[str]:
    """The stream's lines, each cut to its first `most` bytes: a line of any length costs bounded memory."""
    head, skipping = b"", False
    while chunk := stream.read(CHUNK):
        *complete, rest = chunk.split(b"\n")
        for part in complete:
            if not skipping:  # else: the end of a line whose head was given already
                yield (head + part)[:most].decode(errors="replace")
            head, skipping = b"", False
        if not skipping:
            head += rest
            if len(head) > most:
                yield head[:most].decode(errors="replace")
                head, skipping = b"", True
    if head and not skipping:
        yield head[:most].decode(errors="replace")


def kmsg_records(path: Path) -> Iterator[str]:
    """/dev/kmsg as it is now, oldest record first, then stop (a blocking read would wait forever):
    the agent's own reader, one record per read."""
    from gpufleet.reconciler.agent.daemon import KernelLog

    log = KernelLog(path, from_start=True)
    try:
        while lines := log.lines():
            yield from lines
    finally:
        log.close()


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(21, "is a directory", path)
    return open(p, "rb")


@app.command("classify-kmsg")
def classify_kmsg(
    file: str = typer.Argument(..., metavar="FILE", help="A kernel log: /dev/kmsg records, dmesg, dmesg -T, "
                               "journalctl -k or syslog; '-' for standard input."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per event, one per line."),
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="Apply the overrides of Pulumi.<STACK>.yaml."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Apply the overrides of a policy file (fleet.json)."),
) -> None:
    """Explain each GPU and NVSwitch event of a kernel log: where, what NVIDIA says, what gpufleet does.

    For each event: the input line, the kind (xid, sxid, gpu-lost), the code, the PCI address and GPU
    instance, NVIDIA's meaning, the action (none, restart-app, diagnose, reset-gpu, reboot, contact-support,
    replace) and whether
    the node would be remediated (taken out of service). Only the kernel is believed: lines user space
    wrote, or the driver's words inside another message, are counted on standard error, not explained.
    Exit 0: read; 2: the input (or the policy) cannot be read.
    """
    from gpufleet.fleetspec import SpecError
    from gpufleet.fleetspec.faults import Kind
    from gpufleet.fleetspec.faults.catalogue import XIDS
    from gpufleet.fleetspec.faults.policy import FaultPolicy
    from gpufleet.fleetspec.faults.classify import Classifier
    from gpufleet.fleetspec.faults.driver import GpuEvent, Unreadable, Untrusted
    from gpufleet.reconciler.agent.kmsg import MAX_LINE, KernelLogParser
    from gpufleet.reconciler.app import load_policy

    faults = FaultPolicy()
    if policy is not None:
        try:
            faults = FaultPolicy.from_spec(load_policy(policy).healing)
        except (OSError, ValueError, SpecError) as e:
            _err(f"cannot read the policy {policy}: {e}")
            raise typer.Exit(EXIT_INVALID)
    elif stack is not None:
        faults = FaultPolicy.from_spec(load_spec(stack, None).healing)

    parser, classifier = KernelLogParser(), Classifier(faults)
    counts = {"events": 0, "remediate": 0, "untrusted": 0, "unreadable": 0}
    rows: list[list[str]] = []
    started = 0  # the line a three-line GPU loss began on
    try:
        device = file != "-" and stat.S_ISCHR(os.stat(file).st_mode)  # /dev/kmsg itself
        stream = None if device else _open(file)
        lines = kmsg_records(Path(file)) if device else bounded_lines(stream, MAX_LINE)
    except OSError as e:
        _err(f"cannot read {file}: {e.strerror or e}")
        raise typer.Exit(EXIT_INVALID)
    try:
        for n, line in enumerate(lines, start=1):
            before = parser.pending
            items = parser.feed(line)
            if parser.pending is not None and parser.pending is not before:
                started = n
            for item in items:
                if isinstance(item, Untrusted):
                    counts["untrusted"] += 1
                    continue
                if isinstance(item, Unreadable):
                    counts["unreadable"] += 1
                    _err(f"line {n}: unreadable ({item.why}): {item.line[:120]}")
                    continue
                assert isinstance(item, GpuEvent)
                c = classifier.classify(item)
                at = started if item.kind is Kind.GPU_LOST and started and started != n else n
                entry = XIDS.get(item.code) if item.kind is Kind.XID else None
                meaning = (entry.description if entry else "not in NVIDIA's catalogue") if item.kind is Kind.XID \
                    else ("NVSwitch error" if item.kind is Kind.SXID else "GPU fallen off the bus at probe time")
                counts["events"] += 1
                counts["remediate"] += c.remediates
                event = {"line": at, "kind": item.kind.value, "code": item.code, "pci": item.pci,
                         "gpu_instance": item.gpu_instance, "compute_instance": item.compute_instance,
                         "meaning": meaning, "nvidia": c.nvidia, "action": c.action.value, "why": c.why,
                         "remediate": c.remediates, "text": item.text}
                if as_json:
                    typer.echo(json.dumps(event))
                else:
                    gpu = item.pci + (f" GPU-I:{item.gpu_instance}" if item.gpu_instance is not None else "")
                    rows.append([str(at), item.kind.value, str(item.code), gpu, c.action.value,
                                 "yes" if c.remediates else "no", f"{meaning} [NVIDIA: {c.nvidia}]"])
    except OSError as e:
        _err(f"cannot read {file}: {e.strerror or e}")
        raise typer.Exit(EXIT_INVALID)
    finally:
        if stream is not None and stream is not sys.stdin.buffer:
            stream.close()
    if not as_json:
        head = ["LINE", "KIND", "CODE", "GPU", "ACTION", "REMEDIATE", "MEANING"]
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head) - 1)]
        for r in [head] + rows:
            typer.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    _err_plain(f"{counts['events']} GPU/NVSwitch events, {counts['remediate']} would remediate the node; "
               f"{counts['untrusted']} not believed (not the kernel's), {counts['unreadable']} unreadable")


def _err_plain(msg: str) -> None:
    typer.echo(msg, err=True)
