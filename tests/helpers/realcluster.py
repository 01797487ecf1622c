"""A dask cluster of real processes for tests: ``dask scheduler`` and ``dask worker``.

A ``LocalCluster`` in one process hides what a real deployment shows: pickling
between processes, the active memory manager acting on real replicas, workers
that die without saying goodbye, a scheduler restarted under the same address.
:class:`RealCluster` starts the same commands an operator runs, on loopback,
with dask's default configuration plus the state validation dask's own test
suite uses (``distributed.scheduler.validate`` / ``distributed.worker.validate``),
writes each process's output to a log file, and kills processes on cue
(``SIGKILL``: no clean shutdown, as when a node is lost).

Tests use it through the ``real_cluster`` fixture (``tests/conftest.py``) and are
marked ``realcluster``: ``pytest -m "not realcluster"`` skips them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from repo import FOLDERS, ROOT

BIN = Path(sys.executable).parent

#: Lines in a process log that mean dask's own invariants broke or a worker was lost.
PROBLEMS = re.compile(
    r"Traceback|RuntimeError|AssertionError|InvalidTransition|transition-failed|"
    r"Cannot remove replica|This should be impossible|KeyError|"
    r"daskjobs: .* failed|Worker .* failed to heartbeat|Restarting worker"
)


#: A process log's record line (the traceback lines that follow one are not).
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
#: dask's record of a send to a worker whose connection is gone.
_LOST_SEND = re.compile(r"distributed\.batched - INFO - Batched Comm Closed .*connection to worker")

#: dask config for a scheduler that runs the full plugin with quick backup copies.
SPECULATION_CONFIG: dict[str, Any] = {
    "daskjobs": {
        "policy": "node-aware",
        "speculation": {
            "enabled": True,
            "late-factor": 2,
            "min-runtime": "50ms",
            "interval": "50ms",
        },
    }
}


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a daemon thread; the returned box gets ``result`` or ``error``
    (a client call can then block while the test kills things)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _dask(bin_dir: Path = BIN) -> list[str]:
    exe = bin_dir / "dask"
    if exe.exists():
        return [str(exe)]
    python = bin_dir / "python" if bin_dir != BIN else Path(sys.executable)
    return [str(python), "-m", "distributed.cli.dask_scheduler"]


def _write_yaml(path: Path, config: Mapping[str, Any]) -> None:
    # JSON is YAML: no dependency needed to write dask's config file
    path.write_text(json.dumps(config, indent=1))


class Placement(Protocol):
    """Where each process runs (``tests/helpers/netns.py``'s ``Hosts``): the command prefix that
    starts a process on host ``name`` and the address it listens on."""

    def command(self, name: str) -> list[str]: ...

    def address(self, name: str) -> str: ...


class RealCluster:
    """One ``dask scheduler`` and ``n_workers`` ``dask worker`` processes on loopback.

    ``preload`` is what ``dask scheduler --preload`` gets (``None`` for plain dask),
    ``preload_args`` the options after it (``["--daskjobs-policy", "lpt"]``);
    ``config`` is written to a dask YAML file the processes read (``DASK_CONFIG``);
    ``env`` adds environment variables (``DASK_DASKJOBS__...``). Workers are named
    ``w0``, ``w1``, ...; ``nanny=False`` (the default) makes a kill final.
    ``bin_dir`` is the directory of the ``dask`` executable to run (default: this
    interpreter's); ``source_on_path=False`` leaves this checkout off the processes'
    ``PYTHONPATH`` and working directory, so they import daskjobs as installed in that
    environment (the tests' folders stay on the path for their own task modules).
    ``hosts`` places each process on a host of its own (``tests/helpers/netns.py``): the
    scheduler on host ``scheduler``, worker ``w0`` on host ``w0``; each listens on
    its host's address and is started through ``hosts.command(name)``.
    ``security`` (a ``distributed.Security``) is what this process's clients connect with
    (a TLS cluster: its processes read their certificates from ``config``).
    """

    def __init__(
        self,
        workdir: Path,
        n_workers: int = 3,
        nthreads: int = 2,
        preload: str | None = "plugins/daskjobs_scheduler.py",
        preload_args: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        validate: bool = True,
        nanny: bool = False,
        worker_resources: str | None = None,
        bin_dir: Path | None = None,
        source_on_path: bool = True,
        hosts: Placement | None = None,
        security: Any = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.n_workers = n_workers
        self.nthreads = nthreads
        self.preload = preload
        self.preload_args = list(preload_args)
        self.nanny = nanny
        self.worker_resources = worker_resources
        self.bin_dir = Path(bin_dir) if bin_dir is not None else BIN
        self.hosts = hosts
        self.security = security
        self.cwd = ROOT if source_on_path else self.workdir
        self.scheduler_file = self.workdir / "scheduler.json"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logfiles: dict[str, Path] = {}
        self._port: int | None = None
        self._restarts = 0
        self.lingered: list[str] = []  # processes that ignored SIGTERM at close
        self.killed_workers: set[str] = set()  # workers SIGKILLed by the test
        self._closed_at: dict[str, int] = {}  # log length per process when close() began
        confdir = self.workdir / "dask-config"
        confdir.mkdir(exist_ok=True)
        base: dict[str, Any] = {}
        if validate:
            base["distributed"] = {
                "scheduler": {"validate": True},
                "worker": {"validate": True},
            }
        _write_yaml(confdir / "validate.yaml", base)
        # measured durations in memory unless the test names a history file (read first:
        # dask merges a folder's files in name order, the later winning)
        _write_yaml(confdir / "00-history.yaml", {"daskjobs": {"history": {"path": None}}})
        if config:
            _write_yaml(confdir / "test.yaml", config)
        self.env = dict(os.environ)
        # (tests/conftest.py's variable would win over the test's own config file)
        self.env.pop("DASK_DASKJOBS__HISTORY__PATH", None)
        self.env["DASK_CONFIG"] = str(confdir)
        # tasks defined in tests/ (e.g. tests/helpers/realtasks.py, a test module's own) import
        # on the workers by name (tests/helpers/repo.py)
        path = [*map(str, FOLDERS), str(ROOT)] if source_on_path else [*map(str, FOLDERS)]
        if self.env.get("PYTHONPATH"):
            path.append(self.env["PYTHONPATH"])
        self.env["PYTHONPATH"] = os.pathsep.join(path)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.update(env or {})

    # -- processes ---------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        if name in self.logfiles:  # a restart appends to the same log
            log = self.logfiles[name]
        self.logfiles[name] = log
        fh = open(log, "ab")  # noqa: SIM115 - closed when the process is reaped
        if self.hosts is not None:
            args = [*self.hosts.command(name), *args]
        proc = subprocess.Popen(
            args, cwd=self.cwd, env=self.env, stdout=fh, stderr=subprocess.STDOUT, close_fds=True
        )
        fh.close()
        self.procs[name] = proc
        return proc

    def _host(self, name: str) -> str:
        return self.hosts.address(name) if self.hosts is not None else "127.0.0.1"

    def start_scheduler(self, timeout: float = 60.0) -> str:
        self._spawn_scheduler()
        return self._await_scheduler(timeout)

    def _spawn_scheduler(self) -> None:
        if self.scheduler_file.exists():
            self.scheduler_file.unlink()
        port = self._port or 0
        args = [
            *_dask(self.bin_dir),
            "scheduler",
            "--host",
            self._host("scheduler"),
            "--port",
            str(port),
            "--dashboard-address",
            "127.0.0.1:0",
            "--scheduler-file",
            str(self.scheduler_file),
        ]
        if self.preload:
            args += ["--preload", self.preload, *self.preload_args]
        self._spawn("scheduler", args)

    def _await_scheduler(self, timeout: float) -> str:
        """The address from the scheduler file, once the scheduler has written it."""
        proc = self.procs["scheduler"]
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"dask scheduler exited with {proc.returncode}:\n{self.log('scheduler')}"
                )
            if self.scheduler_file.exists():
                try:
                    info = json.loads(self.scheduler_file.read_text())
                except ValueError:
                    info = None
                if info and info.get("address"):
                    self.address = str(info["address"])
                    self._port = int(self.address.rsplit(":", 1)[1])
                    return self.address
            time.sleep(0.05)
        raise TimeoutError(f"dask scheduler did not start:\n{self.log('scheduler')}")

    def start_worker(self, name: str, nthreads: int | None = None) -> None:
        args = [
            *_dask(self.bin_dir),
            "worker",
            "--scheduler-file",
            str(self.scheduler_file),
            "--host",
            self._host(name),
            "--nthreads",
            str(nthreads or self.nthreads),
            "--name",
            name,
            "--no-dashboard",
            "--death-timeout",
            "60",
            "--nanny" if self.nanny else "--no-nanny",
        ]
        if self.worker_resources:
            args += ["--resources", self.worker_resources]
        self._spawn(name, args)

    def start(self, timeout: float = 90.0) -> RealCluster:
        # the workers start with the scheduler, not after it: a worker waits for the
        # scheduler file (``dask worker --scheduler-file``), so the processes' imports
        # and start-up overlap (half a second of a 3-worker start on the quiet machine)
        self._spawn_scheduler()
        for i in range(self.n_workers):
            self.start_worker(f"w{i}")
        self._await_scheduler(60.0)
        self.wait_for_workers(self.n_workers, timeout)
        return self

    def wait_for_workers(self, n: int, timeout: float = 90.0) -> None:
        from distributed import Client

        with Client(self.address, timeout=timeout, security=self.security) as c:
            c.wait_for_workers(n, timeout=timeout)

    def client(self, **kwargs: Any) -> Any:
        from distributed import Client

        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("security", self.security)
        return Client(self.address, **kwargs)

    def worker_address(self, client: Any, name: str) -> str:
        for addr, w in client.scheduler_info(n_workers=-1)["workers"].items():
            if w["name"] == name:
                return str(addr)
        raise KeyError(f"no worker named {name!r}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill process ``name`` (``scheduler``, ``w0``, ...) and reap it."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)

    def pause(self, name: str) -> None:
        """SIGSTOP process ``name``: it stops without knowing (a hung or swapped node)."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT process ``name`` after :meth:`pause`."""
        self.procs[name].send_signal(signal.SIGCONT)

    def kill_worker(self, name: str) -> None:
        self.killed_workers.add(name)
        self.kill(name)

    def kill_scheduler(self) -> None:
        self.kill("scheduler")

    def restart_scheduler(self, timeout: float = 60.0) -> str:
        """Kill the scheduler and start it again on the same port (workers reconnect)."""
        self.kill("scheduler")
        self._restarts += 1
        return self.start_scheduler(timeout)

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    # -- logs ----------------------------------------------------------------------------
    def log(self, name: str) -> str:
        path = self.logfiles.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def logs(self) -> dict[str, str]:
        return {name: self.log(name) for name in self.logfiles}

    def problems(self, ignore: Iterable[str] = (), shutdown: bool = False) -> list[str]:
        """Log lines that mean something broke (see :data:`PROBLEMS`), minus ``ignore``
        patterns (regular expressions). Lines written after :meth:`close` began (a
        worker stopped mid-connection says so) count only with ``shutdown=True``."""
        skip = [re.compile(p) for p in ignore]
        out = []
        for name, text in self.logs().items():
            if not shutdown and name in self._closed_at:
                text = text[: self._closed_at[name]]
            in_lost_send = False
            for line in text.splitlines():
                if _RECORD.match(line):
                    # a worker SIGKILLed mid-send: dask (2025.4 at least) logs the failed
                    # send to it with its traceback; that is the kill, not a broken invariant
                    in_lost_send = bool(self.killed_workers) and bool(_LOST_SEND.search(line))
                elif in_lost_send and line.startswith("Traceback"):
                    continue
                if PROBLEMS.search(line) and not any(p.search(line) for p in skip):
                    out.append(f"{name}: {line}")
        return out

    def close(self) -> None:
        """Stop the workers, then the scheduler (SIGTERM, as a batch system would); a process
        that has not exited within 5 s (a worker waits for its running threads) is killed.

        The scheduler gets its signal once the workers are gone: signalled together, a
        worker whose goodbye found the scheduler closing waited out the 5 s and was killed
        (3 closes in 10 of a 2-worker cluster, against none in 24 in this order)."""
        workers = [n for n in self.procs if n != "scheduler"]
        self._closed_at = {name: len(self.log(name)) for name in self.logfiles}
        self._terminate(workers)
        self._terminate(["scheduler"])

    def _terminate(self, names: list[str]) -> None:
        """SIGTERM ``names`` at once, then wait up to 5 s for them all; kill the rest."""
        for name in names:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        for name in names:
            proc = self.procs.get(name)
            if proc is None:
                continue
            try:
                proc.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                self.lingered.append(name)
                proc.kill()
                proc.wait(10)

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
