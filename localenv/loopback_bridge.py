"""Stands in for the network between a local kubelet node and the control plane.

On a cluster, a node reaches the API server over the network. A local node lives in a network
namespace of its own (:mod:`localenv.netns`), and the API server listens on the host's
loopback only, so this process listens on the node's 127.0.0.1:PORT and relays each connection to the
host's 127.0.0.1:PORT. No address outside loopback is used.

    python -m localenv.loopback_bridge --netns NAME --port 26443 [--port ...]
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import socket
import sys

from localenv.netns import CLONE_NEWNET, path


def listen_in_netns(name: str, port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port inside the namespace (a socket keeps the namespace it was
    made in; this thread returns to the host's afterwards)."""
    libc = ctypes.CDLL(None, use_errno=True)
    host = os.open("/proc/self/ns/net", os.O_RDONLY)
    node = os.open(path(name), os.O_RDONLY)
    try:
        if libc.setns(node, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        s.setblocking(False)
    finally:
        if libc.setns(host, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the host's namespace")
        os.close(host)
        os.close(node)
    return s


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


def _relay(port: int):
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
    return handle


async def serve(name: str, ports: list[int]) -> None:
    servers = [await asyncio.start_server(_relay(p), sock=listen_in_netns(name, p)) for p in ports]
    print(f"relaying 127.0.0.1:{ports} of netns {name} to the host's loopback", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.loopback_bridge", description=__doc__.split("\n")[0])
    ap.add_argument("--netns", required=True)
    ap.add_argument("--port", type=int, action="append", required=True)
    args = ap.parse_args(argv)
    asyncio.run(serve(args.netns, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
