"""The test-host harness itself (``tests/helpers/netns.py``): hosts reach each other and only
each other, a cut link drops everything until restored, latency and loss are what was
asked, and nothing is left behind."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from netns import Hosts, namespaces, sweep_leftovers
from realcluster import RealCluster


def _in(hosts: Hosts, name: str, code: str, timeout: float = 30) -> str:
    out = subprocess.run(
        [*hosts.command(name), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


ECHO = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 7000)); s.listen()
while True:
    c, _ = s.accept()
    c.sendall(c.recv(64)); c.close()
"""


def _rtt(addr: str, n: int = 5) -> float:
    """Median seconds of a TCP connect and one echoed message to ``addr``."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with socket.create_connection((addr, 7000), timeout=10) as s:
            s.sendall(b"ping")
            assert s.recv(64) == b"ping"
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2]


def test_hosts_reach_each_other_and_a_cut_drops_everything(net_hosts: Hosts) -> None:
    a = net_hosts.add("a")
    b = net_hosts.add("b")
    echo = subprocess.Popen([*net_hosts.command("b"), sys.executable, "-c", ECHO, b])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _rtt(b, 1)
                break
            except OSError:
                assert time.monotonic() < deadline, "the echo server never answered"
                time.sleep(0.1)
        # a to b, host to host
        code = (
            f"import socket; s = socket.create_connection(({b!r}, 7000), timeout=5); "
            "s.sendall(b'hi'); print(s.recv(9).decode())"
        )
        assert _in(net_hosts, "a", code) == "hi"
        # nothing outside the test hosts: the machine's own addresses are not routed
        out = _in(
            net_hosts,
            "a",
            "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
            "    print('reached')\nexcept OSError as e:\n    print(type(e).__name__)",
        )
        assert out != "reached"
        # the link: latency both ways (delay on both ends), then loss-free again
        base = _rtt(b)
        net_hosts.link("b", delay=0.05)
        net_hosts.link("local", delay=0.05)
        slow = _rtt(b)
        # a connect and an echo: two round trips of at least 0.1 s each
        assert slow >= 0.2 > base, (base, slow)
        net_hosts.link("b")
        net_hosts.link("local")
        # a cut: the connection attempt times out (silence, not a refusal)
        with net_hosts.partitioned("b"):
            with pytest.raises(TimeoutError):
                socket.create_connection((b, 7000), timeout=1.5)
            dropped = net_hosts.stats()["local"]["cut"]
            assert dropped >= 1
        assert _rtt(b, 1) < 1.0  # back
        assert a != b and a.startswith(net_hosts.local.rsplit(".", 1)[0])
    finally:
        echo.kill()
        echo.wait(10)


def test_loss_drops_about_what_was_asked(net_hosts: Hosts) -> None:
    b = net_hosts.add("b")
    echo = subprocess.Popen(
        [
            *net_hosts.command("b"),
            sys.executable,
            "-c",
            "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "s.bind((sys.argv[1],7001))\nwhile True:\n    d,a=s.recvfrom(64); s.sendto(d,a)",
            b,
        ]
    )
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(0.2)
        for _ in range(100):  # wait for the server
            s.sendto(b"x", (b, 7001))
            try:
                s.recv(64)
                break
            except TimeoutError:
                continue
        net_hosts.link("b", loss=0.3)
        before = net_hosts.stats()["b"]
        s.settimeout(0.05)
        for i in range(400):
            s.sendto(b"%d" % i, (b, 7001))
            with contextlib.suppress(TimeoutError):
                s.recv(64)
        after = net_hosts.stats()["b"]
        sent = after["sent"] - before["sent"]
        lost = after["lost"] - before["lost"]
        assert sent == 400
        assert 0.2 < lost / sent < 0.4, (lost, sent)  # binomial(400, 0.3): 5 sigma
    finally:
        echo.kill()
        echo.wait(10)


def test_leftovers_of_a_dead_run_are_swept() -> None:
    from netns import _ip, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(f"test hosts in network namespaces: {why}")
    # a run that died: its process id no longer exists (a pid beyond pid_max)
    dead = "djn7fffffffx0-w0"
    _ip("netns", "add", dead)
    gone = sweep_leftovers()
    assert dead in gone and dead not in namespaces()


def test_a_cluster_runs_on_the_test_hosts(
    net_hosts: Hosts, real_cluster: Callable[..., RealCluster]
) -> None:
    rc = real_cluster(n_workers=2, nthreads=1, hosts=net_hosts)
    with rc.client() as c:
        addrs = {w["name"]: a for a, w in c.scheduler_info(n_workers=-1)["workers"].items()}
        assert addrs["w0"].startswith(f"tcp://{net_hosts.ips['w0']}:")
        assert addrs["w1"].startswith(f"tcp://{net_hosts.ips['w1']}:")
        assert rc.address.startswith(f"tcp://{net_hosts.ips['scheduler']}:")
        assert c.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    prefix = net_hosts.prefix
    assert {f"{prefix}-scheduler", f"{prefix}-w0", f"{prefix}-w1"} <= set(namespaces())
    assert rc.problems() == []


def test_a_closed_harness_leaves_nothing(net_hosts: Any) -> None:
    h = Hosts()
    h.add("x")
    prefix = h.prefix
    h.close()
    assert not [n for n in namespaces() if n.startswith(prefix)]
    out = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert prefix not in out
