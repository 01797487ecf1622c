"""The first hour's error messages (issue 12): one clear line, soon, naming the fix.

``daskjobs status`` given something that is not a scheduler address (a bare word, a pasted
dashboard URL, the dashboard's port), a sweep stage that cannot be named or pickled, a failed
stage reported once.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner

from daskjobs.cli import main


def status(*args: str) -> tuple[int, str, float]:
    """Exit code, stderr and seconds taken by ``daskjobs status ARGS``; an uncaught exception
    (a traceback) fails the test."""
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["status", *args], catch_exceptions=False)
    return result.exit_code, result.stderr, time.perf_counter() - start


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("notanaddress", "no port; give HOST:PORT, e.g. tcp://notanaddress:8786"),
        ("foo://h:1", "unknown scheme 'foo://'"),
        ("tcp://h:8786/status", "it has a path"),
        ("", "no address given"),
    ],
)
def test_status_of_something_not_an_address_is_one_line_at_once(address: str, says: str) -> None:
    code, err, seconds = status(address)
    assert code == 2 and says in one_line(err)
    assert seconds < 5  # was a traceback, then a 20 s hang closing the half-made client


def test_status_of_a_web_url_where_nothing_listens_says_it_is_the_dashboard_url() -> None:
    port = free_port()
    for url in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/status", "https://h/"):
        code, err, seconds = status(url, "--timeout", "3s")
        line = one_line(err)
        assert code == 2 and "looks like the dashboard URL" in line, line
        assert "give the scheduler's tcp:// address" in line and "8786" in line
        assert seconds < 5


def test_status_of_a_refused_port_is_one_line_without_waiting_for_the_timeout() -> None:
    port = free_port()
    code, err, seconds = status(f"tcp://127.0.0.1:{port}", "--timeout", "30s")
    line = one_line(err)
    assert code == 1 and "cannot reach a dask scheduler" in line and "refused" in line, line
    assert seconds < 10  # dask's connect retries a refused connection for the whole timeout


@pytest.fixture(scope="module")
def dashboard_cluster() -> Any:
    from conftest import plugin_cluster

    with plugin_cluster(None, protocol="tcp://") as cluster:
        yield cluster


def test_status_of_the_dashboard_names_the_scheduler_behind_it(dashboard_cluster: Any) -> None:
    scheduler = dashboard_cluster.scheduler.address
    port = dashboard_cluster.scheduler.http_server.port
    for given in (
        f"http://127.0.0.1:{port}/status",
        f"tcp://127.0.0.1:{port}",
        f"127.0.0.1:{port}",
    ):
        code, err, seconds = status(given, "--timeout", "20s")
        line = one_line(err)
        assert code == 2 and f"{given!r} looks like the dashboard URL" in line, line
        assert f"this dashboard's scheduler is {scheduler}" in line
        assert seconds < 10  # dask's connect waits for a handshake the dashboard never sends


def test_status_of_the_scheduler_written_as_a_url_reaches_it(dashboard_cluster: Any) -> None:
    host_port = dashboard_cluster.scheduler.address.removeprefix("tcp://")
    for given in (f"http://{host_port}", f"{host_port}/", f" tcp://{host_port} "):
        code, err, _ = status(given)
        line = one_line(err)  # plain dask: it is reached, and has no plugin
        assert code == 1 and f"scheduler tcp://{host_port}: " in line and "not loaded" in line


def test_a_silent_server_is_not_waited_for_beyond_the_timeout() -> None:
    """A TCP server that accepts and never speaks (neither dask nor HTTP)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        held: list[socket.socket] = []

        def accept() -> None:
            try:
                while True:
                    held.append(server.accept()[0])
            except OSError:
                return

        threading.Thread(target=accept, daemon=True).start()
        code, err, seconds = status(f"tcp://127.0.0.1:{port}", "--timeout", "3s")
        for conn in held:
            conn.close()
    line = one_line(err)
    assert code == 1 and "sent no dask handshake within 3 s" in line, line
    assert seconds < 8
