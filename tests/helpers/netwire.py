"""The wire between the test hosts of ``tests/helpers/netns.py``: a switch with faulty links.

Run by the harness as ``python tests/helpers/netwire.py SEED``; it reads one JSON command a line
on stdin and answers each with one JSON line on stdout, and exits when stdin closes
(so it never outlives the test run that started it).

Each host's network interface is a TUN device this process opened (``IFF_TUN``: IP
packets, no Ethernet) and the harness moved into the host's namespace. The wire reads
every packet a host sends, looks up the host that owns the destination address and
writes the packet into that host's device, after the sending host's link has had its
say: dropped while either end's link is cut, dropped with the sender's loss
probability, delayed by the sender's delay plus a uniform jitter (packets of one
sender keep their order, as on a real link). The properties are those of ``tc
netem`` on the host's interface (a packet leaving a host of delay ``d`` waits ``d``:
two hosts of ``d`` each have a round trip of ``2d``), done here because kernels
without ``sch_netem`` (a Firecracker VM's, for one) still have TUN devices and
network namespaces, and one mechanism behaves the same everywhere.

The root namespace's own device is a host too (the test process: clients, and the
forwarder that lets hosts reach a database on the machine's loopback).

Commands (``op`` and its fields)::

    {"op": "host", "name": "w0", "ifname": "djn1f2e-w0", "ip": "10.213.40.10"}
    {"op": "link", "name": "w0", "delay": 0.025, "jitter": 0.005, "loss": 0.01}
    {"op": "cut", "name": "w0"}      {"op": "restore", "name": "w0"}
    {"op": "forward", "listen": ["10.213.40.254", 5432], "to": ["127.0.0.1", 5432]}
    {"op": "stats"}                   {"op": "quit"}
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


@dataclass
class Link:
    """One host's link to the switch and what it has done."""

    name: str
    fd: int
    ip: bytes
    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0
    cut: bool = False
    last: float = 0.0  # when this link's last delayed packet is delivered
    counts: dict[str, int] = field(
        default_factory=lambda: {"sent": 0, "delivered": 0, "lost": 0, "cut": 0, "unroutable": 0}
    )


class Wire:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.links: dict[str, Link] = {}
        self.by_ip: dict[bytes, Link] = {}
        self.loop = asyncio.get_running_loop()
        self.servers: list[asyncio.AbstractServer] = []

    def add_host(self, name: str, ifname: str, ip: str) -> None:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
        link = Link(name, fd, bytes(int(x) for x in ip.split(".")))
        self.links[name] = link
        self.by_ip[link.ip] = link
        self.loop.add_reader(fd, self._readable, link)

    def _readable(self, src: Link) -> None:
        # one read a packet, until the device is empty (hot path: locals)
        now = self.loop.time()
        by_ip, rng = self.by_ip, self.rng
        while True:
            try:
                pkt = os.read(src.fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the host's namespace is gone
                self.loop.remove_reader(src.fd)
                return
            if len(pkt) < 20 or pkt[0] >> 4 != 4:
                continue  # IPv4 only (the hosts have no IPv6 address)
            src.counts["sent"] += 1
            dst = by_ip.get(pkt[16:20])
            if dst is None:
                src.counts["unroutable"] += 1
                continue
            if src.cut or dst.cut:
                src.counts["cut"] += 1
                continue
            if src.loss and rng.random() < src.loss:
                src.counts["lost"] += 1
                continue
            if src.delay or src.jitter:
                wait = src.delay + (rng.uniform(-src.jitter, src.jitter) if src.jitter else 0.0)
                at = max(now + max(wait, 0.0), src.last)
                src.last = at
                self.loop.call_at(at, self._deliver, src, dst, pkt)
            else:
                self._deliver(src, dst, pkt)

    def _deliver(self, src: Link, dst: Link, pkt: bytes) -> None:
        if src.cut or dst.cut:  # cut while the packet was on its way
            src.counts["cut"] += 1
            return
        try:
            os.write(dst.fd, pkt)
            src.counts["delivered"] += 1
        except OSError:  # a full queue or a host gone: the packet is lost
            src.counts["lost"] += 1

    async def forward(self, listen: list[Any], to: list[Any]) -> None:
        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                r2, w2 = await asyncio.open_connection(to[0], int(to[1]))
            except OSError:
                w.close()
                return
            await asyncio.gather(pipe(r, w2), pipe(r2, w))

        server = await asyncio.start_server(handle, listen[0], int(listen[1]))
        self.servers.append(server)

    async def command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "host":
            self.add_host(cmd["name"], cmd["ifname"], cmd["ip"])
        elif op == "link":
            link = self.links[cmd["name"]]
            link.delay = float(cmd.get("delay", 0.0))
            link.jitter = float(cmd.get("jitter", 0.0))
            link.loss = float(cmd.get("loss", 0.0))
        elif op == "cut":
            self.links[cmd["name"]].cut = True
        elif op == "restore":
            self.links[cmd["name"]].cut = False
        elif op == "forward":
            await self.forward(cmd["listen"], cmd["to"])
        elif op == "stats":
            return {"ok": True, "stats": {n: dict(link.counts) for n, link in self.links.items()}}
        elif op != "quit":
            raise ValueError(f"unknown op {op!r}")
        return {"ok": True}


async def main(seed: int) -> None:
    wire = Wire(seed)
    reader = asyncio.StreamReader()
    await wire.loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        cmd: dict[str, Any] = {}
        try:
            cmd = json.loads(line)
            reply = await wire.command(cmd)
        except Exception as e:
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if cmd.get("op") == "quit":
            break


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
