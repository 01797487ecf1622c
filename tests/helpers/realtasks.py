"""Task functions for tests on real worker processes (importable there: the
harness puts tests/helpers/ on the workers' ``PYTHONPATH``)."""

from __future__ import annotations

import os
import time

#: Worker names that run every task this many times slower (set per test through
#: the ``DASKJOBS_TEST_SLOW`` environment variable: ``"w0=4,w2=2"``).
_SLOW: dict[str, float] | None = None


def slowdown() -> float:
    global _SLOW
    if _SLOW is None:
        _SLOW = {}
        for part in os.environ.get("DASKJOBS_TEST_SLOW", "").split(","):
            if "=" in part:
                name, factor = part.split("=", 1)
                _SLOW[name.strip()] = float(factor)
    try:
        from distributed import get_worker

        return _SLOW.get(str(get_worker().name), 1.0)
    except ValueError:
        return 1.0


def nap(i, seconds, *deps):
    """Sleep ``seconds`` (times this worker's slowdown) and return ``i``."""
    time.sleep(seconds * slowdown())
    return i


def work(n, unit=0.01):
    """``n`` units of work (a sleep of ``n * unit`` seconds, times this worker's slowdown);
    when it started, on the worker's clock, and ``n``: a plain task whose cost follows its
    size-like argument."""
    start = time.time()
    time.sleep(n * unit * slowdown())
    return start, n


def where(i, seconds, *deps):
    """Like :func:`nap`, and say which worker ran it."""
    from distributed import get_worker

    time.sleep(seconds * slowdown())
    return (i, get_worker().name)


def payload(i, nbytes=200_000):
    """Some bytes, so that the result is a real replica the memory manager can move."""
    return bytes([i % 251]) * nbytes


def total(*parts):
    return sum(len(p) if isinstance(p, bytes) else p for p in parts)


# -- a sweep's stages (features read by many backtests), for tests/real/ ----------


def features(slice):
    """A feature table: ~200 kB, so the memory manager sees real replicas."""
    time.sleep(0.02 * slowdown())
    return bytes([slice % 251]) * 200_000


def backtest(features, fast, seconds):
    """Read the features and take ``seconds`` (times the worker's slowdown)."""
    time.sleep(seconds * slowdown())
    return {"sharpe": (len(features) % 997) / 1000 + fast, "first": features[0]}


def train(i, steps, step_s):
    """A best-effort task that checkpoints every step and yields when preempted."""
    import daskjobs

    state = daskjobs.restore(default={"step": 0, "acc": 0, "runs": 0})
    state["runs"] += 1
    while state["step"] < steps:
        time.sleep(step_s * slowdown())
        state["acc"] += i * state["step"]
        state["step"] += 1
        daskjobs.checkpoint(state)
        if daskjobs.preempted():
            raise daskjobs.Preempted()
    return state


def started_at(i):
    """An interactive task: when did it start?"""
    return time.time()


def nap_graph(n, *, seed, mu, sigma, cap, prefix, fn=None):
    """``n`` independent calls of ``fn`` (default :func:`nap`) as ``dask.delayed``, of
    log-normal duration (``exp(mu + sigma z)`` seconds, at most ``cap``), each annotated
    with its duration as its estimate; keys ``{prefix}-{i}``, results ``0 .. n - 1``."""
    import random

    import dask

    rng = random.Random(seed)
    graph = []
    for i in range(n):
        d = min(cap, rng.lognormvariate(mu, sigma))
        with dask.annotate(estimate=d):
            graph.append(dask.delayed(fn or nap)(i, d, dask_key_name=f"{prefix}-{i}"))
    return graph


def timed(i, seconds):
    """Sleep ``seconds`` (times this worker's slow-down); ``(i * i + 7, start, end)``."""
    t0 = time.time()
    time.sleep(seconds * slowdown())
    return i * i + 7, t0, time.time()


def backup_events(dask_scheduler):
    """The plugin's ``backup-*`` audit events (run on the scheduler)."""
    plugin = dask_scheduler.plugins.get("daskjobs")
    if plugin is None:
        return []
    return [dict(e) for e in plugin.events if str(e.get("action", "")).startswith("backup-")]


# -- a re-ranked stage on a worker (tests/plugin/test_rerank_on_workers.py) -----------------------

GATE = "daskjobs-test-reranked"


def started_nap(i, seconds, *deps):
    """Sleep ``seconds``; return (start time, ``i``)."""
    t = time.time()
    time.sleep(seconds)
    return (t, i)


def gated_nap(i, seconds, *deps):
    """Start, then hold the thread until the test sets the event :data:`GATE`."""
    from distributed import Event

    t = time.time()
    assert Event(GATE).wait(timeout=60)
    return (t, i)


def mark(path, *deps):
    """Leave file ``path`` (a test sees the task ran, even in another process); return it."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    return path


def submits(n, key):
    """Submit ``work(n)`` under ``key`` from this task (``worker_client``); its result."""
    from distributed import worker_client

    with worker_client() as client:
        return client.submit(work, n, 0.0, key=key).result()


def held(i, event="daskjobs-test-release"):
    """Wait until the ``distributed.Event`` named ``event`` is set, then return ``i``."""
    from distributed import Event

    Event(event).wait()
    return i
