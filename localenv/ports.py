"""Free TCP ports on this machine: the one helper the local environment, its tests and the benches use."""
from __future__ import annotations

import random
import socket


class NoFreePorts(RuntimeError):
    pass


def free_ports(n: int = 1, *, consecutive: bool = False) -> list[int]:
    """`n` distinct TCP ports nobody listens on right now (on any address). Without `consecutive` the
    kernel picks them, held open together while picking; with it, a block `p, p+1, ...` (for components
    that take a base port and count up from it)."""
    if not consecutive:
        socks = []
        try:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("0.0.0.0", 0))
                socks.append(s)
            return [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
    rnd = random.Random()
    for _ in range(200):
        start = rnd.randrange(20000, 32000 - n)  # below the kernel's ephemeral range
        if all(port_free(p) for p in range(start, start + n)):
            return list(range(start, start + n))
    raise NoFreePorts(f"no block of {n} free ports found")


def free_port() -> int:
    return free_ports(1)[0]


def port_free(port: int) -> bool:
    """Whether nothing listens on (or holds) `port` on any address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False
