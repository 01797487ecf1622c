"""The public surface, fuzzed against a real ``dask scheduler --preload daskjobs.preload``
(jobs service on an SQLite ledger, small admission limits): ``jobs.submit``, ``Sweep.stage``
and ``Sweep.run``, the plugin's annotations, driven by generated inputs (hypothesis), each
valid field or junk of another type. Every input gives a named refusal or a sane run, never
a hang, a crash or a stuck job; after each one another client's task still runs; at the end
no job of the ledger is left queued or running, the scheduler is up and its log holds no
traceback. The configuration (what the preload checks before a scheduler starts) is fuzzed
in-process: a value is accepted or refused with an error naming its key."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import pytest
import realtasks_sweep
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from realcluster import PROBLEMS, RealCluster, in_thread

import daskjobs.jobs as jobs
from daskjobs import JobsPlugin, SubmissionRefused, Sweep
from daskjobs.config import jobs_settings
from daskjobs.config import settings as read_settings
from daskjobs.jobs import Ledger

#: Long enough for anything here on a loaded 2-core machine; only a hang exceeds it.
HANG = 60.0
#: Examples per part of the surface: tens of seconds in all (more: DASKJOBS_FUZZ_EXAMPLES).
EXAMPLES = int(os.environ.get("DASKJOBS_FUZZ_EXAMPLES", "25"))

LIMITS = {
    "graph-tasks": 200,
    "graph-bytes": "256KiB",
    "client-tasks": 400,
    "job-parts": 20,
    "job-bytes": "64KiB",
}

#: Values of the wrong type or out of range, for any field.
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value most of the time, junk otherwise."""
    return st.one_of(valid, valid, JUNK)


#: A job that runs, field by field ...
JOB: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.just("inference"),
    "team": st.sampled_from(["default", "quant"]),
    "parts": st.integers(min_value=1, max_value=3),
    "target": st.just("jobtasks:score"),
    "params": st.fixed_dictionaries({"seconds": st.sampled_from([0, 0.01])}),
    "priority": st.integers(min_value=-(2**31), max_value=2**31 - 1),
    "deadline": st.none() | st.floats(min_value=1, max_value=4e9),
    "retries": st.integers(min_value=0, max_value=2),
    "checkpoint_every": st.none() | st.floats(min_value=0.1, max_value=10),
    "job_class": st.sampled_from(["be", "te"]),
}
#: ... and what replaces up to two of its fields (or adds one it does not set): junk, or a
#: value of the right type the scheduler or the cluster refuses.
SPOILERS = st.just({}) | st.dictionaries(
    st.sampled_from([*JOB, "resources", "accelerator", "gpu_memory", "constraint", "prio"]),
    st.one_of(
        JUNK,
        st.sampled_from(["jobtasks:nosuch", "nosuch:f", "training", 10**9, {"GPU": 1}, "A100"]),
    ),
    max_size=2,
)
#: Job names: mostly good ones.
NAMES = st.one_of(st.sampled_from(["fuzz", "fuzz-b"]), st.text(min_size=1, max_size=12), JUNK)


ANNOTATIONS: dict[str, st.SearchStrategy[Any]] = {
    "estimate": _either(st.floats(min_value=0, max_value=100) | st.sampled_from(["2s", "10ms"])),
    "team": _either(st.sampled_from(["default", "quant"])),
    "job_class": _either(st.sampled_from(["be", "te"])),
    "speculate": _either(st.booleans()),
    "params": _either(st.fixed_dictionaries({"x": st.integers()})),
    "stage": _either(st.sampled_from(["square", "other"])),
    "gang": _either(st.text(min_size=1, max_size=5)),
    "gang_size": _either(st.integers(min_value=1, max_value=3)),
    "accelerator": _either(st.sampled_from(["A100"])),
    "gpu_memory": _either(st.sampled_from(["1GB"])),
    "constraint": _either(st.sampled_from(["gpus >= 0"])),
    "note": JUNK | st.text(max_size=3).map(lambda t: t + "\ud800"),  # one daskjobs never reads
}


def _some(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


def _bounded(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``fn()`` in a thread: its result or error; a hang fails the test."""
    thread, box = in_thread(fn)
    thread.join(HANG)
    assert not thread.is_alive(), "hangs"
    return box.get("result"), box.get("error")


def _named(err: BaseException) -> None:
    """A refusal the user can read: a type of ours or a ValueError/TypeError with a message
    that is not a bare repr of something deep inside (``'int' object has no attribute``)."""
    assert isinstance(err, (SubmissionRefused, ValueError, TypeError)), repr(err)
    text = str(err)
    assert text and not re.search(
        r"object has no attribute|unsupported operand|not subscriptable", text
    ), text
    assert not re.search(r"DataError|IntegrityError|OperationalError|\[SQL", text), text


class Surface:
    """The real scheduler the fuzz tests share, two clients of it, and what they saw."""

    def __init__(self, rc: RealCluster, tmp: Path) -> None:
        self.rc = rc
        self.store = tmp / "store"
        self.ledger = f"sqlite:///{tmp / 'ledger.sqlite'}"
        self.c = rc.client()
        self.other = rc.client()
        self.outcomes: dict[str, int] = {}
        self._served = iter(range(10**9))

    def count(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def key(self) -> int:
        return next(self._served)

    def still_serves(self) -> None:
        """Another client's task runs."""
        i = self.key()
        assert self.other.submit(realtasks_sweep.square, i, pure=False).result(HANG) == i * i


@pytest.fixture(scope="module")
def surface(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("fuzz")
    rc = RealCluster(
        tmp / "cluster",
        n_workers=1,
        nthreads=2,
        preload="daskjobs.preload",
        preload_args=["--daskjobs-ledger", f"sqlite:///{tmp / 'ledger.sqlite'}"],
        config={
            "daskjobs": {
                "store": str(tmp / "store"),
                "admission": LIMITS,
                "jobs": {"interval": "100ms", "lease": "5s", "launch-timeout": "5s"},
            }
        },
    )
    rc.start()
    s = Surface(rc, tmp)
    try:
        yield s
    finally:
        s.c.close()
        s.other.close()
        rc.close()
    print(sorted(s.outcomes.items()))
    # the scheduler served to the end, and said nothing of a broken invariant
    problems = [ln for ln in rc.log("scheduler").splitlines() if PROBLEMS.search(ln)]
    assert problems == [], problems


COMMON = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.realcluster
def test_jobs_submit_refuses_by_name_or_runs_to_an_end(surface: Surface) -> None:
    c = surface.c

    @COMMON
    @given(name=NAMES, fields=st.fixed_dictionaries(JOB), spoilers=SPOILERS)
    def submit(name: Any, fields: dict[str, Any], spoilers: dict[str, Any]) -> None:
        fields.update(spoilers)
        job, err = _bounded(lambda: jobs.submit(c, name, **fields))
        if err is not None:
            _named(err)
            surface.count(f"job refused: {type(err).__name__}")
        else:
            status, err = _bounded(lambda: job.wait(timeout=HANG - 5))
            assert err is None, repr(err)
            assert status["state"] in ("succeeded", "failed"), status
            surface.count(f"job {status['state']}")
        surface.still_serves()

    submit()
    # no job is left in a state nothing will move
    led = Ledger(surface.ledger)
    try:
        assert [j for j in led.jobs() if j.state in ("queued", "running")] == []
    finally:
        led.close()
    assert surface.outcomes.get("job succeeded") and any("refused" in k for k in surface.outcomes)


@pytest.mark.realcluster
def test_sweep_stages_refuse_by_name_or_run(surface: Surface) -> None:
    c = surface.c

    @COMMON
    @given(
        xs=st.lists(_either(st.integers(-5, 5)), min_size=1, max_size=5, unique_by=repr),
        kw=_some(
            {
                "estimate": ANNOTATIONS["estimate"],
                "team": ANNOTATIONS["team"],
                "retries": _either(st.integers(0, 2)),
                "job_class": ANNOTATIONS["job_class"],
                # a non-empty mapping names resources no worker here offers: such a sweep
                # waits for a worker that has them, as dask does, after a warning (tested in
                # tests/sweep/test_sweep.py), rather than being refused: not a hang to find here
                "resources": _either(st.just({})).filter(lambda r: not (isinstance(r, dict) and r)),
                "speculate": ANNOTATIONS["speculate"],
                "version": _either(st.text(min_size=1, max_size=5)),
            }
        ),
    )
    def sweep(xs: list[Any], kw: dict[str, Any]) -> None:
        s = Sweep("fuzz")
        try:
            s.stage(realtasks_sweep.square, over={"x": xs}, **kw)
        except Exception as e:  # refused where it is declared
            _named(e)
            surface.count(f"stage refused: {type(e).__name__}")
            return
        result, err = _bounded(lambda: s.run(c, store=surface.store, progress=False))
        if err is not None:
            _named(err)
            surface.count(f"sweep refused: {type(err).__name__}")
        else:
            assert len(result.records) == len(xs)
            surface.count("sweep ran" + (" (stages failed)" if result.failures else ""))
        surface.still_serves()

    sweep()


@pytest.mark.realcluster
def test_annotations_refuse_by_name_or_run(surface: Surface) -> None:
    c = surface.c

    @COMMON
    @given(ann=_some(ANNOTATIONS))
    def annotated(ann: dict[str, Any]) -> None:
        def compute() -> Any:
            with dask.annotate(**ann):
                task = dask.delayed(realtasks_sweep.square)(3, dask_key_name=f"sq-{surface.key()}")
            return c.compute(task).result(HANG - 5)

        value, err = _bounded(compute)
        if err is not None:
            _named(err)
            surface.count(f"annotations refused: {type(err).__name__}")
        else:
            assert value == 9
            surface.count("annotated task ran")
        surface.still_serves()

    annotated()


#: Keys of the configuration and the values they are fuzzed with.
CONFIG_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "policy": _either(st.sampled_from(["lpt", "fifo", "fair-share", "critical-path"])),
    "default-estimate": _either(st.sampled_from(["1s", "200ms", 3])),
    "audit-events": _either(st.integers(0, 10**5)),
    "teams": _either(st.fixed_dictionaries({"targets": st.just({"a": 1})})),
    "speculation": _either(st.fixed_dictionaries({"late-factor": _either(st.just(2.0))})),
    "admission": _either(
        st.fixed_dictionaries(
            {},
            optional={
                "graph-tasks": _either(st.integers(1, 10**7) | st.none()),
                "graph-bytes": _either(st.sampled_from(["1MiB", "2 GB", 4096, None])),
                "job-parts": _either(st.integers(1, 10**6)),
            },
        )
    ),
    "jobs": _either(st.fixed_dictionaries({}, optional={"interval": _either(st.just("1s"))})),
    "preemption": _either(st.fixed_dictionaries({}, optional={"grace": _either(st.just("30s"))})),
}


@settings(max_examples=300, deadline=None, database=None)
@given(overrides=_some(CONFIG_KEYS))
def test_the_configuration_is_read_or_refused_naming_the_key(overrides: dict[str, Any]) -> None:
    """What the preload reads before a scheduler starts (``settings`` and ``jobs_settings``
    with the same overrides, as ``dask scheduler --preload daskjobs.preload`` does): a value
    is accepted, or refused with one ValueError naming a ``daskjobs.`` key; never another
    error. An accepted configuration makes a plugin."""
    try:
        s = read_settings(**overrides)
        jobs_settings(**overrides)
    except ValueError as e:
        text = str(e)
        assert "\n" not in text and re.search(r"daskjobs\.[a-z-]+|unknown key", text), text
        return
    assert s.admission.graph_tasks is None or s.admission.graph_tasks >= 1
    assert math.isfinite(s.default_estimate)
    JobsPlugin(**overrides)
