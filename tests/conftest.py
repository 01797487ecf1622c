"""Fixtures shared by the test files.

* :func:`plugin_cluster` - an in-process ``LocalCluster`` whose scheduler runs a
  given :class:`~daskjobs.plugin.JobsPlugin` (or plain dask with ``None``).
* ``dashboard_cluster`` - plain dask in this process over TCP (what is sent to it is
  pickled, as to a remote cluster), its dashboard served; one per test module.
* ``real_cluster`` - a factory of real ``dask scheduler`` / ``dask worker``
  processes (:class:`realcluster.RealCluster`); tests that use it are marked
  ``realcluster`` and their process logs are printed when they fail.
* ``net_hosts`` - test hosts in network namespaces (:class:`netns.Hosts`): pass it as
  ``real_cluster(hosts=net_hosts)`` to run each process on a host of its own, then cut
  links and add latency; tests that use it are marked ``netns`` and skip, with the
  reason, where namespaces cannot be made (not root, no iproute2, no TUN device).
* ``ledger_url`` - a fresh, empty jobs ledger, once as an SQLite file and once as a
  PostgreSQL database (``DASKJOBS_TEST_POSTGRES``, default the development and CI
  server ``postgresql+psycopg://postgres@127.0.0.1:5432``): the same tests run on both
  backends. Without a server the PostgreSQL half is skipped, unless
  ``DASKJOBS_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) makes that a failure.
  ``postgres_url`` is the PostgreSQL half alone (for races only its concurrent writers have).
* Tests marked ``slurm`` submit real Slurm jobs (tests/real/test_slurm.py): they run where
  ``sinfo`` answers with a node up (``.ci/slurm-up`` starts a one-node Slurm) and skip,
  with the reason, elsewhere, unless ``DASKJOBS_REQUIRE_SLURM=1`` (set by ``.ci/run``)
  makes that a failure.

Tests marked ``realcluster``, ``netns`` or ``slurm`` are marked ``slow`` too: the fast tier a
developer runs after each edit, ``python -m pytest -m "not slow"``, leaves them out (the README's
command runs everything; docs/how-to/develop.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The modules the tests share (tests/helpers/) and the test modules import by name, here and in
# the processes the tests start: tests/helpers/repo.py says why, and which folders.
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))
from repo import FOLDERS

# Measured durations in memory only (daskjobs.history.path: null), in this process and in every
# scheduler, worker and docs page it starts: the default, the user's cache directory, would let
# one test's measurements reorder another's. Tests of the history file name their own.
os.environ["DASK_DASKJOBS__HISTORY__PATH"] = "None"

from realcluster import RealCluster

sys.path[:0] = [f for f in map(str, FOLDERS) if f not in sys.path]

VALIDATE = {"distributed.scheduler.validate": True, "distributed.worker.validate": True}


def plugin_cluster(plugin: Any = None, **kwargs: Any) -> Any:
    """A ``LocalCluster`` in this process whose scheduler runs ``plugin``.

    Defaults: one worker with one thread, no dashboard port clash; any
    ``LocalCluster`` keyword overrides them.
    """
    from distributed import LocalCluster

    kwargs.setdefault("n_workers", 1)
    kwargs.setdefault("threads_per_worker", 1)
    kwargs.setdefault("processes", False)
    kwargs.setdefault("dashboard_address", ":0")
    plugins = [plugin] if plugin is not None else []
    return LocalCluster(scheduler_kwargs={"plugins": plugins}, **kwargs)


@pytest.fixture(scope="module")
def dashboard_cluster() -> Any:
    with plugin_cluster(None, protocol="tcp://") as cluster:
        yield cluster


@pytest.fixture(autouse=True, scope="session")
def _history_in_memory() -> Iterator[None]:
    """dask read its config before this file set the environment: the same, in its config."""
    import dask

    with dask.config.set({"daskjobs.history.path": None}):
        yield


@pytest.fixture(autouse=True, scope="session")
def _record_into_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Clients' recordings are confined to ``daskjobs.record-dir`` (the trust model):
    in-process schedulers of this suite record into pytest's temporary directory."""
    import dask

    with dask.config.set({"daskjobs.record-dir": str(tmp_path_factory.getbasetemp())}):
        yield


@pytest.fixture
def real_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., RealCluster]]:
    """``real_cluster(n_workers=3, preload=..., preload_args=[...], config={...})``
    starts a cluster of real processes and returns it; all are stopped at teardown."""
    started: list[RealCluster] = []

    def make(**kwargs: Any) -> RealCluster:
        rc = RealCluster(tmp_path / f"cluster{len(started)}", **kwargs)
        started.append(rc)
        return rc.start()

    yield make
    for rc in started:
        rc.close()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for rc in started:
            for name, text in rc.logs().items():
                print(f"----- {name} ({rc.workdir}) -----")
                print(text[-6000:])


@pytest.fixture
def net_hosts() -> Iterator[Any]:
    """The test hosts of one test (``tests/helpers/netns.py``), deleted at teardown. Put it
    before ``real_cluster`` in a signature: the cluster stops before its hosts go."""
    import netns

    why = _netns_unavailable()
    if why is not None:
        pytest.skip(f"test hosts in network namespaces: {why}")
    with netns.Hosts() as hosts:
        yield hosts


_NETNS: list[str | None] = []


def _netns_unavailable() -> str | None:
    if not _NETNS:
        import netns

        _NETNS.append(netns.unavailable())
    return _NETNS[0]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under pytest-xdist, a test marked ``alone`` runs with no other test beside it (its
    setup and teardown too, so a module-scoped recording it makes as well); see
    :func:`_turn`. Without xdist every test runs alone anyway."""
    with _turn(item):
        return (yield)


@contextlib.contextmanager
def _turn(item: pytest.Item) -> Iterator[None]:
    """A readers-writer lock over the xdist workers of one run: every test holds the
    shared lock, one marked ``alone`` the exclusive one. The turnstile keeps it fair: a
    waiting ``alone`` test holds it, so no new test starts until the running ones end
    (flock alone would let shared holders starve it). The lock files are in the run's
    temporary directory, which the workers share; the kernel drops a dead worker's locks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    basetemp = item.config.option.basetemp
    if worker is None or not basetemp:
        yield
        return
    run_dir = Path(basetemp).parent
    alone = item.get_closest_marker("alone") is not None
    with (
        open(run_dir / "daskjobs-turnstile.lock", "a") as turnstile,
        open(run_dir / "daskjobs-alone.lock", "a") as rw,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(rw, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(rw, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


# tryfirst: before pytest-xdist's own hook reads the xdist_group marks added here
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "real_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.realcluster)
        if "net_hosts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.netns)
        # real processes take seconds to start and stop: never in the fast tier
        # (`python -m pytest -m "not slow"`, docs/how-to/develop.md)
        if any(item.get_closest_marker(m) for m in ("realcluster", "netns", "slurm")):
            item.add_marker(pytest.mark.slow)
        # a module-scoped fixture (a recorded trace, a cluster) is made once per worker
        # that runs a test using it: its tests go to one worker (`--dist loadgroup`)
        if _module_fixtures(item) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(f"module-{item.module.__name__}"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_first(items)


def _module_fixtures(item: pytest.Item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "package", "class")
    ]


#: Under pytest-xdist, the order the workers are sent the tests in (lower first): the
#: longest kinds first, so that none of them starts last and leaves the other workers idle;
#: the ``alone`` tests last, when the other workers have little left to wait for.
_RANKS = (("docs-pages", 0), ("netns", 1), ("realcluster", 2), ("slurm", 2), ("slow", 3))
_LAST = len(_RANKS) + 1


def _rank(item: pytest.Item) -> int:
    if item.get_closest_marker("alone"):
        return _LAST
    for name, rank in _RANKS:
        group = item.get_closest_marker("xdist_group")
        if item.get_closest_marker(name) or (group is not None and name in group.args):
            return rank
    return len(_RANKS)


def _longest_first(items: list[pytest.Item]) -> None:
    """Sort the tests longest kind first (a stable sort: in file order within a kind); a
    group's tests keep together at the rank of its longest. Every worker sorts the same
    collection the same way (pytest-xdist checks that the workers' orders agree)."""
    group_rank: dict[str, int] = {}
    for item in items:
        group = item.get_closest_marker("xdist_group")
        if group is not None:
            name = str(group.args[0])
            group_rank[name] = min(group_rank.get(name, _LAST), _rank(item))

    def key(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group")
        return _rank(item) if group is None else group_rank[str(group.args[0])]

    items.sort(key=key)


_SLURM: list[str | None] = []


def _slurm_unavailable() -> str | None:
    """Why no Slurm job can run here (None: ``sinfo`` shows a node that takes jobs)."""
    if shutil.which("sinfo") is None:
        return "no Slurm here (no sinfo on PATH)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 20 s"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip() or out.returncode}"
    states = out.stdout.split()
    if not {"idle", "mix", "alloc"} & set(states):
        return f"no Slurm node takes jobs (sinfo: {' '.join(states) or 'no nodes'})"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``slurm`` skips without a Slurm (fails under ``DASKJOBS_REQUIRE_SLURM=1``)."""
    if item.get_closest_marker("slurm") is None:
        return
    if not _SLURM:
        _SLURM.append(_slurm_unavailable())
    why = _SLURM[0]
    if why is None:
        return
    if os.environ.get("DASKJOBS_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm is required (DASKJOBS_REQUIRE_SLURM=1): {why}", pytrace=False)
    pytest.skip(f"{why}; .ci/slurm-up starts one (root, Debian)")


POSTGRES = os.environ.get("DASKJOBS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")


def _postgres_database() -> tuple[str, Callable[[], None]]:
    """A new, empty database on the test server: its URL and a function dropping it."""
    import sqlalchemy as sa

    name = "daskjobs_test_" + uuid.uuid4().hex[:12]
    admin = sa.create_engine(POSTGRES + "/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except Exception as e:
        admin.dispose()
        if os.environ.get("DASKJOBS_REQUIRE_POSTGRES") == "1":
            raise RuntimeError(f"the PostgreSQL test server {POSTGRES} is required: {e}") from e
        pytest.skip(f"no PostgreSQL server at {POSTGRES} ({type(e).__name__})")

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return f"{POSTGRES}/{name}", drop


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, empty ledger database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite'}"
        return
    url, drop = _postgres_database()
    try:
        yield url
    finally:
        drop()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (for what only PostgreSQL's concurrent writers
    can do); skipped without a server, like ``ledger_url``'s PostgreSQL half."""
    url, drop = _postgres_database()
    try:
        yield url
    finally:
        drop()


#: A race the replay decided by less than this may go either way live (seconds).
CLOSE_RACE = 0.05


def assert_same_copies(result: Any) -> None:
    """A replay (``placement="recorded"``) of a run with backup copies copies the same
    tasks as the recording, within one, and the races both ran have the same winner,
    but for at most one and those the replay decided by less than ``CLOSE_RACE``: a
    race is decided by when a slot comes free on the copy's worker, which on a loaded
    machine can move by tens of milliseconds (the figures over many recordings:
    ``bench_replay.py --copies``, docs/benchmarks.md)."""
    rows = result.copies()
    recorded = {str(c.tid) for c in rows if c.recorded is not None}
    replayed = {str(c.tid) for c in rows if c.replayed is not None}
    assert recorded, "the recording has no backup copies to compare"
    assert len(recorded ^ replayed) <= 1, rows
    both = [c for c in rows if c.recorded in ("won", "lost") and c.replayed is not None]
    flipped = [c for c in both if not c.same]
    assert both and sum(abs(c.margin) >= CLOSE_RACE for c in flipped) <= 1, rows
