"""Test hosts: the scheduler and each worker in a network namespace of its own.

Every real-process test of ``tests/helpers/realcluster.py`` runs on one loopback interface,
where a worker is either alive or killed. On a cluster a worker is also slow to
answer, partitioned but alive (its lease expires while it keeps computing, then it
reports), or behind a lossy link, and the scheduler's host can drop off the network.
:class:`Hosts` makes those faults:

* each host is a network namespace (``ip netns``) named ``<run prefix>-<host>``,
  whose one interface ``eth0`` (address ``10.213.N.x/24``) is a TUN device held by
  the wire process (``tests/helpers/netwire.py``): a switch that forwards packets between
  the namespaces this run made and nowhere else (the test process's own namespace is
  one more host, ``.254``: clients connect from it, and a forwarder there lets hosts
  reach a database on the machine's loopback, see :meth:`Hosts.forward`);
* :meth:`Hosts.link` gives a host's link a delay, jitter and loss (``tc netem``'s
  parameters, applied by the wire: the kernel of the development VM has no
  ``sch_netem``), :meth:`Hosts.cut` / :meth:`Hosts.restore` / :meth:`Hosts.cut_for`
  partition a host (every packet to and from it is dropped, silently, as when a switch
  port dies; its processes keep running), and ``RealCluster.pause``/``resume``
  SIGSTOP and SIGCONT a process;
* :class:`RealCluster` starts ``dask scheduler`` and ``dask worker`` inside the
  namespaces (``RealCluster(..., hosts=hosts)``: ``ip netns exec``, which execs, so
  the process it returns is dask's own and signals reach it).

Clean-up: names carry a per-run prefix (``djn``, the test process's id in hex, ``x``
and a count);
:meth:`Hosts.close` deletes the namespaces and stops the wire (the TUN devices go
with it), and every new run first deletes the namespaces of runs whose process is
gone (a run killed before its clean-up). :func:`unavailable` says why namespaces
cannot be made here (not root, no ``ip``, no TUN device, ``ip netns add`` refused):
the ``net_hosts`` fixture skips with that reason. Tests that use it are marked
``netns`` (``pytest -m netns`` selects them; CI runs them as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
IP = shutil.which("ip") or "/usr/sbin/ip"

#: A namespace this harness made: ``djn<pid in hex>x<count>-<host>``.
_OURS = re.compile(r"^djn([0-9a-f]+)x\d+-")
_made = iter(range(10**6))


class NetnsError(RuntimeError):
    """A namespace command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def sweep_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; return their names."""
    gone = []
    for ns in namespaces():
        m = _OURS.match(ns)
        if m and not _alive(int(m.group(1), 16)):
            _ip("netns", "delete", ns, check=False)
            gone.append(ns)
    return gone


def unavailable() -> str | None:
    """Why test hosts cannot be made on this machine, or None if they can."""
    if sys.platform != "linux":
        return f"network namespaces are Linux's ({sys.platform} here)"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CI runs these tests as root)"
    if not Path(IP).exists():
        return "no `ip` command (iproute2 is not installed)"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "no TUN device (/dev/net/tun): the test hosts' links need one"
    probe = f"djn{os.getpid():x}-probe"
    try:
        _ip("netns", "add", probe)
    except (NetnsError, OSError, subprocess.SubprocessError) as e:
        return f"`ip netns add` is refused here: {e}"
    _ip("netns", "delete", probe, check=False)
    return None


def _free_subnet() -> int:
    """A third octet N with 10.213.N.0/24 in no route of this machine."""
    used = _ip("-4", "route", "show", check=False).stdout + _ip("-4", "addr").stdout
    start = os.getpid() % 200
    for i in range(200):
        n = 20 + (start + i) % 200
        if f"10.213.{n}." not in used:
            return n
    raise NetnsError("no free 10.213.N.0/24 subnet for the test hosts")


class Hosts:
    """The test hosts of one test: namespaces, their links, and the wire between them.

    ``hosts.add("scheduler")`` makes a host; :meth:`command` and :meth:`address` are
    what :class:`realcluster.RealCluster` asks to start a process on it.
    """

    def __init__(self, seed: int = 0) -> None:
        sweep_leftovers()
        # one run may make several Hosts (one per test): a count tells them apart
        self.prefix = f"djn{os.getpid():x}x{next(_made)}"
        self.net = _free_subnet()
        self.ips: dict[str, str] = {}
        self.cuts: list[tuple[str, float, float | None]] = []  # (host, cut at, restored at)
        self._lock = threading.Lock()
        self.wire = subprocess.Popen(
            [sys.executable, str(HERE / "netwire.py"), str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._closed = False
        try:
            # the test process's namespace: clients, and the database forwarder
            self.local = self._ip_of(254)
            self._send(
                {"op": "host", "name": "local", "ifname": f"{self.prefix}l", "ip": self.local}
            )
            dev = f"{self.prefix}l"
            _ip("addr", "add", f"{self.local}/24", "dev", dev)
            _ip("link", "set", dev, "up")
            self.ips["local"] = self.local
        except BaseException:
            self.close()
            raise

    def _ip_of(self, n: int) -> str:
        return f"10.213.{self.net}.{n}"

    def _send(self, cmd: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self.wire.stdin is not None and self.wire.stdout is not None
            self.wire.stdin.write(json.dumps(cmd) + "\n")
            self.wire.stdin.flush()
            line = self.wire.stdout.readline()
        if not line:
            raise NetnsError(f"the wire process exited ({self.wire.poll()})")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise NetnsError(f"wire {cmd['op']}: {reply.get('error')}")
        return reply

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def add(self, name: str) -> str:
        """Make host ``name`` (its namespace and link); return its address. ``local``
        is the test process's own host, made at start."""
        if name in self.ips:
            return self.ips[name]
        ip = self._ip_of(len(self.ips) + 1)
        ns, dev = self.ns(name), f"{self.prefix}{len(self.ips)}"
        _ip("netns", "add", ns)
        self._send({"op": "host", "name": name, "ifname": dev, "ip": ip})
        _ip("link", "set", dev, "netns", ns)
        _ip("-n", ns, "link", "set", dev, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.ips[name] = ip
        return ip

    # -- what RealCluster asks ------------------------------------------------------
    def command(self, name: str) -> list[str]:
        """The prefix that runs a command on host ``name`` (made if new)."""
        self.add(name)
        return [IP, "netns", "exec", self.ns(name)]

    def address(self, name: str) -> str:
        return self.add(name)

    # -- faults ---------------------------------------------------------------------
    def link(self, name: str, delay: float = 0.0, jitter: float = 0.0, loss: float = 0.0) -> None:
        """Packets leaving host ``name`` wait ``delay`` +- ``jitter`` seconds and are lost
        with probability ``loss`` (two hosts of delay d: a round trip of 2d)."""
        self._send({"op": "link", "name": name, "delay": delay, "jitter": jitter, "loss": loss})

    def cut(self, name: str) -> None:
        """Partition host ``name``: every packet to or from it is dropped from now on."""
        self._send({"op": "cut", "name": name})
        self.cuts.append((name, time.monotonic(), None))

    def restore(self, name: str) -> None:
        """Reconnect host ``name`` after :meth:`cut`."""
        self._send({"op": "restore", "name": name})
        for i, (host, at, back) in enumerate(self.cuts):
            if host == name and back is None:
                self.cuts[i] = (host, at, time.monotonic())

    @contextlib.contextmanager
    def partitioned(self, name: str) -> Iterator[None]:
        """Host ``name`` is cut inside the block and reconnected after it."""
        self.cut(name)
        try:
            yield
        finally:
            self.restore(name)

    def cut_for(self, name: str, seconds: float) -> threading.Timer:
        """Cut host ``name`` now and reconnect it ``seconds`` later (in the background)."""
        self.cut(name)
        timer = threading.Timer(seconds, self.restore, (name,))
        timer.daemon = True
        timer.start()
        return timer

    def forward(self, port: int, to: tuple[str, int] | None = None) -> str:
        """Let the hosts reach ``to`` (default: this machine's loopback, ``port``)
        at ``<local address>:port``; return that address."""
        to = to or ("127.0.0.1", port)
        self._send({"op": "forward", "listen": [self.local, port], "to": list(to)})
        return f"{self.local}:{port}"

    def stats(self) -> dict[str, dict[str, int]]:
        """Packets per host: sent, delivered, lost, cut, unroutable."""
        out: dict[str, dict[str, int]] = self._send({"op": "stats"})["stats"]
        return out

    # -- clean-up -------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ns in namespaces():
            if ns.startswith(self.prefix + "-"):
                _ip("netns", "delete", ns, check=False)
        if self.wire.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.wire.stdin is not None
                self.wire.stdin.close()  # the wire exits at the end of its input
            try:
                self.wire.wait(10)
            except subprocess.TimeoutExpired:
                self.wire.kill()
                self.wire.wait(10)
        if self.wire.stdout is not None:
            self.wire.stdout.close()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
