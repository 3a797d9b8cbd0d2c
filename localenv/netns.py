"""A network namespace per local kubelet node: the node's own network, like a machine of its own.

Pods on a node share the node's network (hostNetwork), and the reconciler's replicas each bind the
metrics port, so two nodes on one host cannot share the host's network. Each node gets a namespace with
its loopback and one link to the host (:class:`Link`: a veth pair, the node's end named ``eth0``), which
is what the API server dials to reach the node's kubelet (logs, exec, port-forward) and nothing else
uses. :mod:`localenv.loopback_bridge` makes the control plane's loopback ports (the API server)
answer on the node's loopback, as they would on a control-plane node.

The links' addresses come from 198.18.0.0/15 (RFC 2544, reserved for benchmarking: never routed on
the Internet), one /24 per environment (from its folder, so two environments do not collide) and one
/31 per node (RFC 3021 point-to-point). The host forwards nothing (ip_forward stays as it is; nothing
routes between links), and while the nodes are up the environment's /24 is ``unreachable`` on the host
except through its links, so a packet for a stopped node's address fails here instead of leaving the
machine: the traffic stays on this machine.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import ipaddress
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
RANGE = ipaddress.ip_network("198.18.0.0/15")
NODE_IF = "eth0"  # the node's end of its link, inside its namespace
T = TypeVar("T")


class NetnsError(RuntimeError):
    pass


def _env_hash(root: Path) -> str:
    return hashlib.sha1(str(Path(root).resolve()).encode()).hexdigest()[:6]


def name_for(root: Path, node: str) -> str:
    """Namespaces are host-wide: the environment's folder keeps two environments apart."""
    return f"gf-{_env_hash(root)}-{node}"


@dataclass(frozen=True)
class Link:
    """A node's link to the host: ``host_if`` in the host's namespace with ``host_address``, its peer
    ``eth0`` in the node's with ``node_address`` (the address its kubelet reports and listens on)."""

    host_if: str
    host_address: str
    node_address: str
    block: str  # the environment's /24

    @property
    def prefix(self) -> str:
        return f"{self.host_address}/31"


def env_block(root: Path) -> ipaddress.IPv4Network:
    """The environment's /24 of 198.18.0.0/15, from its folder."""
    index = int(_env_hash(root), 16) % 2 ** (24 - RANGE.prefixlen)
    return ipaddress.ip_network(f"{RANGE.network_address + index * 256}/24")


def link_for(root: Path, index: int) -> Link:
    """Node ``index``'s link (0..127): the /31 at ``2*index`` of the environment's block."""
    if not 0 <= index < 128:
        raise NetnsError(f"node index {index} out of range (0..127)")
    block = env_block(root)
    host = block.network_address + 2 * index
    # An interface name has at most 15 characters.
    return Link(f"gf{_env_hash(root)}-{index}", str(host), str(host + 1), str(block))


def path(name: str) -> Path:
    return NETNS_DIR / name


def _ip(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def ensure(name: str, link: Link) -> None:
    """Create the namespace and its link to the host (idempotent): loopback up, the veth pair up with
    an address at each end. Refuses an address that another interface of the host already has."""
    if not path(name).exists():
        _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")
    if not _has_link(link.host_if):
        owner = _ip("-o", "addr", "show", "to", link.prefix).stdout.split()
        if owner:
            raise NetnsError(f"{link.prefix} is already on the host's interface {owner[1]} (another local "
                             f"environment?): node link {link.host_if} not created")
        _ip("link", "add", link.host_if, "type", "veth", "peer", "name", NODE_IF, "netns", name)
    _ensure_address([], link.host_if, link.prefix)
    _ip("link", "set", link.host_if, "up")
    _ensure_address(["-n", name], NODE_IF, f"{link.node_address}/31")
    _ip("-n", name, "link", "set", NODE_IF, "up")
    _ip("route", "replace", "unreachable", link.block)


def delete(name: str, link: Link | None = None) -> None:
    """Delete the namespace (its end of the link goes with it, and so the host's end)."""
    if path(name).exists():
        _ip("netns", "delete", name)
    if link is not None and _has_link(link.host_if):
        # The kernel destroys the pair with the namespace, asynchronously: the host's end may go between
        # the look and the delete, which is the outcome wanted.
        r = subprocess.run(["ip", "link", "delete", link.host_if], capture_output=True, text=True, timeout=30)
        if r.returncode != 0 and _has_link(link.host_if):
            raise NetnsError(f"ip link delete {link.host_if}: {r.stderr.strip()}")


def release_block(block: str) -> None:
    """Drop the environment's ``unreachable`` route (after its last node is deleted)."""
    subprocess.run(["ip", "route", "delete", "unreachable", block], capture_output=True, timeout=30)


def _has_link(ifname: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", ifname], capture_output=True, timeout=30).returncode == 0


def _ensure_address(where: list[str], ifname: str, cidr: str) -> None:
    """``where``: [] for the host, ["-n", NAME] for a namespace."""
    if f" {cidr} " not in _ip(*where, "-o", "addr", "show", "dev", ifname).stdout:
        _ip(*where, "addr", "add", cidr, "dev", ifname)


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
