"""The first hour's error messages (issue 12): one clear line, soon, naming the fix.

``daskjobs status`` given something that is not a scheduler address (a bare word, a pasted
dashboard URL, the dashboard's port), a sweep stage that cannot be named or pickled, a failed
stage reported once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner
from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs import Sweep, grid, run
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# -- sweeps: a stage without a name, a stage that cannot be pickled, a failure logged once ------


def _ident(x: int) -> int:
    return x


class Scorer:
    def __call__(self, x: int) -> int:
        return x


@pytest.mark.parametrize(
    ("func", "called"),
    [
        (lambda x: x, "a lambda"),
        (functools.partial(_ident), "a functools.partial object"),
        (Scorer(), f"a {__name__}.Scorer object"),
    ],
)
def test_a_stage_without_a_usable_name_asks_for_name(func: Any, called: str) -> None:
    sweep = Sweep("s")
    with pytest.raises(ValueError, match="pass name=") as info:
        sweep.stage(func, over=grid(x=[1]))
    assert f"this stage's function is {called}, which does not name a stage" in str(info.value)
    assert sweep.stage(func, over=grid(x=[1]), name="plus").name == "plus"


def test_a_stage_that_is_not_callable_says_so() -> None:
    with pytest.raises(TypeError, match=r"sweep 's': 3 is not callable"):
        Sweep("s").stage(3)  # type: ignore[arg-type]


def _main_function(source: str, name: str) -> Any:
    """A function defined as if in a script's ``__main__`` (pickled by value)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def client(dashboard_cluster: Any) -> Any:
    from distributed import Client

    with Client(dashboard_cluster) as c:
        yield c


def _submitted(client: Any) -> int:
    return int(client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)))


def test_a_stage_closing_over_a_lock_is_named_before_anything_is_submitted(client: Any) -> None:
    lock = threading.Lock()

    def guarded(x: int) -> int:
        with lock:
            return x

    sweep = Sweep("s")
    sweep.stage(guarded, over=grid(x=[1, 2]))
    with pytest.raises(TypeError) as info:
        sweep.run(client, store=False, progress=False)
    message = str(info.value)
    assert message.startswith("stage 'guarded' cannot be sent to the workers: its function ")
    assert "refers to the variable 'lock' it closes over (a _thread.lock)" in message
    assert "cannot pickle '_thread.lock' object" in message
    assert "distributed.Lock('name')" in message and "inside the function" in message
    assert "HLGExpr" not in message
    assert _submitted(client) == 0


def test_a_script_stage_using_a_global_lock_names_the_global_and_why_it_travels() -> None:
    guarded = _main_function(
        "import threading\nlock = threading.Lock()\n"
        "def guarded(x):\n    with lock:\n        return x\n",
        "guarded",
    )
    sweep = Sweep("s")
    sweep.stage(guarded, over=grid(x=[1]))
    start = time.perf_counter()
    with pytest.raises(TypeError) as info:
        run(sweep, store=False, progress=False)  # no client: raised before a cluster starts
    assert time.perf_counter() - start < 2
    message = str(info.value)
    assert "its function guarded refers to the global 'lock' (a _thread.lock)" in message
    assert "pickled by value" in message and "__main__" in message


def test_a_helper_holding_a_lock_is_followed_to_the_lock() -> None:
    stage = _main_function(
        "import threading\nlock = threading.Lock()\n"
        "def helper(x):\n    with lock:\n        return x\n"
        "def stage(x):\n    return helper(x)\n",
        "stage",
    )
    sweep = Sweep("s")
    sweep.stage(stage, over=grid(x=[1]))
    with pytest.raises(TypeError) as info:
        run(sweep, store=False, progress=False)
    assert (
        "refers to the global 'helper' (a function), which refers to the global 'lock' "
        "(a _thread.lock)" in str(info.value)
    )


class Handle:
    """Tokenizes (so the stage can be keyed) but cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __dask_tokenize__(self) -> str:
        return "handle"


def test_a_parameter_that_cannot_be_pickled_is_named(client: Any) -> None:
    sweep = Sweep("s")
    sweep.stage(_ident, over=grid(x=[1]), params={"conn": Handle()}, name="with_conn")
    with pytest.raises(TypeError) as info:
        sweep.run(client, store=False, progress=False)
    message = str(info.value)
    assert "stage 'with_conn' cannot be sent to the workers: its parameter 'conn' " in message
    assert f"(a {__name__}.Handle) cannot be pickled" in message
    assert _submitted(client) == 0


def _fails_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two is not allowed")
    return x


def test_a_failed_stage_is_logged_once_and_listed_once(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sweep = Sweep("s")
    sweep.stage(_fails_on_two, over=grid(x=[1, 2, 3]))
    with caplog.at_level(logging.INFO):
        result = sweep.run(client, store=False, progress=False)
    told = [r for r in caplog.records if "two is not allowed" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in told]  # was 2: the worker's, then run()'s
    # the one record (dask's worker log) shows where the stage function raised
    assert 'in _fails_on_two\\n    raise ValueError("two is not allowed")' in told[0].getMessage()
    summary = result.summary()
    assert summary.count("two is not allowed") == 1
    assert "FAILED _fails_on_two(x=2): ValueError: two is not allowed" in summary
    assert "raise ValueError" in result.failures[0].traceback


# -- closing a cluster: no heartbeat traceback --------------------------------------------------


class SlowHeartbeats(SchedulerPlugin):
    """A scheduler that takes a second to answer a worker's heartbeat (a loaded machine)."""

    name = "slow-heartbeats"

    async def start(self, scheduler: Any) -> None:
        answer = scheduler.handlers["heartbeat_worker"]

        async def slowly(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(1.0)
            return answer(*args, **kwargs)

        scheduler.handlers["heartbeat_worker"] = slowly


_BEATING: list[Any] = []


async def _beat(dask_worker: Any) -> None:
    _BEATING.append(asyncio.ensure_future(dask_worker.heartbeat()))  # in flight for a second


def _close_with_a_heartbeat_in_flight(quiet: bool, caplog: pytest.LogCaptureFixture) -> list[str]:
    from distributed import Client, LocalCluster

    from daskjobs.sweep import quiet_workers

    with (
        caplog.at_level(logging.ERROR, logger="distributed.worker"),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            protocol="tcp://",
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [SlowHeartbeats()]},
        ) as cluster,
        Client(cluster) as c,
    ):
        c.run(_beat)
        if quiet:
            quiet_workers(c)
    return [r.getMessage() for r in caplog.records if "during heartbeat" in r.getMessage()]


def test_a_worker_closing_under_its_own_heartbeat_logs_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cause, shown: distributed's Worker.close aborts its own heartbeat in flight."""
    said = _close_with_a_heartbeat_in_flight(False, caplog)
    assert said and all("Failed to communicate with scheduler during heartbeat" in m for m in said)


def test_quiet_workers_closes_a_cluster_without_the_heartbeat_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _close_with_a_heartbeat_in_flight(True, caplog) == []


def test_run_quiets_the_workers_of_the_cluster_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import daskjobs.sweep.running

    quieted: list[Any] = []
    monkeypatch.setattr(daskjobs.sweep.running, "quiet_workers", quieted.append)
    sweep = Sweep("s")
    sweep.stage(_ident, over=grid(x=[1]))
    result = run(sweep, store=False, progress=False, cluster_kwargs={"processes": False})
    assert result.ok and len(quieted) == 1
