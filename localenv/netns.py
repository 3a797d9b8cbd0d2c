"""A network namespace per local kubelet node: the node's own loopback, like a machine of its own.

Pods on a node share the node's network (hostNetwork), and the reconciler's replicas each bind the
metrics port, so two nodes on one host cannot share the host's network. Each node gets a namespace
with loopback only (plus, on it, the address its kubelet reports; nothing is sent to it), and
:mod:`localenv.loopback_bridge` makes the control plane's loopback ports (the API server)
answer on the node's loopback, as they would on a control-plane node.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
T = TypeVar("T")


class NetnsError(RuntimeError):
    pass


def name_for(root: Path, node: str) -> str:
    """Namespaces are host-wide: the environment's folder keeps two environments apart."""
    return f"gf-{hashlib.sha1(str(Path(root).resolve()).encode()).hexdigest()[:6]}-{node}"


def path(name: str) -> Path:
    return NETNS_DIR / name


def _ip(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def ensure(name: str, address: str) -> None:
    """Create the namespace (idempotent): loopback up, with ``address``/32 on it as well (a kubelet
    refuses a loopback node IP; this kernel has no dummy interfaces)."""
    if not path(name).exists():
        _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")
    if f" {address}/32 " not in _ip("-n", name, "-o", "addr", "show", "dev", "lo").stdout:
        _ip("-n", name, "addr", "add", f"{address}/32", "dev", "lo")


def delete(name: str) -> None:
    if path(name).exists():
        _ip("netns", "delete", name)


def prefix(name: str) -> list[str]:
    """argv prefix that runs a command in the namespace (network only: mounts, /sys, cgroups stay the host's)."""
    return ["nsenter", f"--net={path(name)}", "--"]


def run_in(name: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a thread that joined the namespace (a thread's namespace is its own)."""
    out: dict = {}

    def target() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path(name), os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                out["error"] = NetnsError(f"setns {name}: {os.strerror(ctypes.get_errno())}")
                return
        finally:
            os.close(fd)
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=target, name=f"netns-{name}", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
