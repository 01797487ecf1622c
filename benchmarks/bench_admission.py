"""How fast a shared scheduler refuses a submission over its admission limits, and what
the refusal costs its memory.

A real ``dask scheduler --preload daskjobs.preload`` (jobs service on an SQLite ledger,
the default limits of ``daskjobs.admission`` unless said otherwise, one worker), a client
in this process. Each case measures the time from the submission to its refusal and the
scheduler's resident memory (``VmRSS`` of ``/proc``) before, at its peak during the
refusal (``VmHWM`` after resetting it through ``/proc/PID/clear_refs``) and once the
refusal is done:

- ``jobs.submit(..., parts=10**9)``: refused by ``job-parts`` (the time is the whole call,
  from the client);
- a graph asking for 10^7 keys (``--keys``), the message ``client.map(f, range(10**7))``
  sends but built directly, since the client itself cannot hold ten million futures on a
  small machine: the keys and a small graph. Refused by ``graph-tasks`` before dask reads
  it (the time runs from the send to the plugin's ``refused-graph`` event);
- a real ``client.map(inc, range(N))`` (``--map``, 10^5) on a scheduler whose
  ``graph-tasks`` is 1,000: from the call to the scheduler's refusal (the client's own
  times, building the graph and hearing of the refusal, are named beside it).

- a sweep of N tasks (``--sweep``, 10^6: bench_million's ``sweep`` shape, a gate, N/1000
  shared features, the backtests, sent as ``Sweep.run`` sends it) that asks for no more
  keys than ``graph-tasks`` (set to the keys it asks for) but brings more tasks: dask reads
  and orders it, and the plugin refuses it before dask makes any of its tasks; beside it,
  the same graph accepted on a scheduler without limits (the time to the end of dask's
  ``update_graph``, its event). Both rows list the event-loop blocks dask warned of in the
  scheduler's log (``Event loop was unresponsive``: dask warns past 3 s), in order.

The time to refuse the 10^7 keys is almost all dask's reading of the message, before any
plugin code runs: the client packs the keys (msgpack) and the scheduler's connection
unpacks them all before it calls the ``update-graph`` handler, which the plugin weighs in
O(1).

After the refusals the scheduler runs a small graph for another client (checked).

    python benchmarks/bench_admission.py            # 10^7 keys, a 10^5-task map, a 10^6 sweep
    python benchmarks/bench_admission.py --quick    # 2x10^6 keys, a 10^4-task map, 10^5 sweep
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import harness
from harness.processes import realcluster, worker_path

GIB = 2**30
MIB = 2**20


def inc(x: int) -> int:
    return x + 1


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process ``pid``, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size (Linux 4.0+)


def _settled(pid: int, seconds: float = 5.0) -> int:
    """The resident size once it stopped falling (freed memory given back), at most
    ``seconds`` later."""
    last = _status(pid)["VmRSS"]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _status(pid)["VmRSS"]
        if now >= last:
            return now
        last = now
    return last


def _measure(pid: int, submit: Any) -> dict[str, Any]:
    before = _settled(pid)
    _reset_peak(pid)
    seconds, what = submit()
    peak = _status(pid)["VmHWM"]
    after = _settled(pid)
    return {"seconds": seconds, "what": what, "before": before, "peak": peak, "after": after}


def _job_parts(c: Any) -> tuple[float, str]:
    import daskjobs.jobs as jobs
    from daskjobs import AdmissionRefused

    t0 = time.perf_counter()
    try:
        jobs.submit(c, "huge", kind="inference", parts=10**9, target="jobtasks:score")
    except AdmissionRefused as e:
        return time.perf_counter() - t0, e.key
    raise AssertionError("a 10**9-part job was accepted")


def _refusal_event(c: Any, size: int, since: float, timeout: float = 600.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t, msg in c.get_events("daskjobs"):
            if msg.get("action") == "refused-graph" and msg.get("size") == size and t >= since:
                return float(t)
        time.sleep(0.01)
    seen = [m for _, m in c.get_events("daskjobs") if m.get("action") == "refused-graph"]
    raise AssertionError(f"no refusal of the graph of {size} keys (refusals: {seen[-3:]})")


def _keys_message(c: Any, n: int) -> tuple[float, str]:
    """The update-graph message of a graph asking for ``n`` keys (as ``client.map``'s)."""
    import dask
    from dask.base import collections_to_expr
    from distributed.protocol.serialize import Serialized, serialize, to_serialize

    expr = collections_to_expr([dask.delayed(inc)(1)])  # small: dask never reads it
    prefix = f"inc-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}{i:024x}" for i in range(n)]
    msg = {
        "op": "update-graph",
        "expr_ser": Serialized(*serialize(to_serialize(expr), on_error="raise")),
        "keys": keys,
        "internal_priority": None,
        "submitting_task": None,
        "fifo_timeout": 0.0,
        "actors": None,
        "code": (),
        "annotations": {},
        "span_metadata": {},
    }
    sent = time.time()
    c._send_to_scheduler(msg)
    del msg, keys
    refused = _refusal_event(c, n, sent - 1)
    return refused - sent, "daskjobs.admission.graph-tasks"


def _client_map(c: Any, n: int) -> tuple[float, str]:
    """A real ``client.map``: the time from the call to the scheduler's refusal (its
    event); the client's own times (building the graph, hearing of the refusal) named."""
    from distributed import wait

    t0 = time.time()
    futures = c.map(inc, range(n), pure=False)
    built = time.time() - t0
    with contextlib.suppress(CancelledError):  # wait raises for a cancelled future
        wait(futures[:1], timeout=600)
    seen = time.time() - t0
    status = futures[0].status
    del futures
    if status != "cancelled":
        raise AssertionError(f"the map's futures are {status}, not refused")
    refused = _refusal_event(c, n, t0 - 1) - t0
    return refused, (
        f"daskjobs.admission.graph-tasks (client.map returned after {built:.1f} s, its "
        f"futures cancelled after {seen:.1f} s)"
    )


def _update_graph_event(c: Any, since: float, timeout: float = 900.0) -> float:
    """When dask's ``update_graph`` of the graph sent at ``since`` ended (its event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t, msg in c.get_events("scheduler"):
            if isinstance(msg, dict) and msg.get("action") == "update-graph" and t >= since:
                return float(t)
        time.sleep(0.05)
    raise AssertionError("dask's update_graph of the sweep did not end")


def _sweep(c: Any, n: int, refused: bool, flag: str, log: Any) -> tuple[float, str]:
    """bench_million's sweep of ``n`` tasks through ``client.get``: the time from the call to
    the refusal (``refused``), or to the end of dask's ``update_graph`` (accepted; its
    futures are then cancelled), and the longest event-loop block in the scheduler's
    ``log()`` until then."""
    import bench_million

    graph = bench_million.build_sweep(n, flag)
    tasks, keys = len(graph), len(graph.keys)
    t0 = time.time()
    futures = c.get(graph.graph, graph.keys, sync=False)
    del graph
    if refused:
        seconds = _refusal_event(c, tasks, t0 - 1) - t0
        while any(f.status == "pending" for f in futures):  # until the client heard of all
            time.sleep(0.05)
        told = time.time() - t0
        what = (
            f"graph-tasks ({keys:,} keys, {tasks:,} tasks; every future {futures[0].status} "
            f"{told:.1f} s after the call)"
        )
    else:
        seconds = _update_graph_event(c, t0 - 1) - t0
        what = f"none: accepted ({keys:,} keys, {tasks:,} tasks; the time is update_graph's)"
    time.sleep(1)  # dask logs a block as the loop resumes
    what += f"; {_longest_block(log())}"
    if not refused:
        c.cancel(futures)
        Path(flag).touch()  # the gate's thread ends
    del futures
    return seconds, what


def _longest_block(log: str) -> str:
    """The event-loop blocks dask's tick monitor warned of in ``log`` (past 3 s), in order:
    the first are dask reading the message, the last the decision (refusal or tasks made)."""
    import re

    blocks = re.findall(r"unresponsive in Scheduler for ([0-9.]+)s", log)
    return f"blocks {', '.join(f'{float(b):.1f}' for b in blocks)} s" if blocks else "none over 3 s"


def _still_serves(rc: Any) -> None:
    with rc.client() as other:
        assert other.gather(other.map(inc, range(100), pure=False)) == list(range(1, 101))


def _mb(n: int) -> str:
    return f"{n / MIB:,.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--keys", type=int, default=None, help="keys of the big graph (10**7)")
    ap.add_argument("--map", type=int, default=None, help="tasks of the real client.map (10**5)")
    ap.add_argument("--sweep", type=int, default=None, help="tasks of the sweep (10**6)")
    ap.add_argument("--cases", default="job,keys,map,sweep", help="which cases (all)")
    args = ap.parse_args(argv)
    keys = args.keys or (2 * 10**6 if args.quick else 10**7)
    tasks = args.map or (10**4 if args.quick else 10**5)
    sweep = args.sweep or (10**5 if args.quick else 10**6)
    chosen = set(args.cases.split(","))
    features = max(1, sweep // 1000)  # the keys the sweep asks for: its backtests
    asked = features * max(1, (sweep - 1 - features) // features)  # (bench_million.build_sweep)
    rcmod = realcluster()
    rows, charts = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as tmp:
        base = {"daskjobs": {"store": os.path.join(tmp, "store")}}
        ledger = f"sqlite:///{Path(tmp) / 'ledger.sqlite'}"
        for name, admission, cases in (
            ("default limits", {}, ("job", "keys")),
            ("graph-tasks: 1000", {"graph-tasks": 1000}, ("map",)),
            (f"graph-tasks: {asked:,}", {"graph-tasks": asked}, ("refused",)),
            ("no limits", {"graph-tasks": None, "client-tasks": None}, ("accepted",)),
        ):
            cases = tuple(
                k
                for k in cases
                if k in chosen or (k in ("refused", "accepted") and "sweep" in chosen)
            )
            if not cases:
                continue
            config = {"daskjobs": {**base["daskjobs"], "admission": admission}}
            rc = rcmod.RealCluster(
                Path(tmp) / name.replace(" ", "-").replace(":", ""),
                n_workers=1,
                nthreads=1,
                preload="daskjobs.preload",
                preload_args=["--daskjobs-ledger", ledger],
                config=config,
                env=worker_path(),  # the scheduler unpickles the sweep's tasks
                validate=False,
            )
            with rc:
                pid = rc.procs["scheduler"].pid
                with rc.client() as c:
                    import daskjobs.jobs as jobs

                    jobs.submit(c, "warm", kind="inference", target="jobtasks:score").result(60)
                    for case in cases:
                        if case == "job":
                            label, run = "jobs.submit(parts=10**9)", lambda: _job_parts(c)
                        elif case == "keys":
                            label = f"a graph asking for {keys:,} keys"
                            run = lambda: _keys_message(c, keys)  # noqa: E731
                        elif case == "map":
                            label = f"client.map(inc, range({tasks:,}))"
                            run = lambda: _client_map(c, tasks)  # noqa: E731
                        else:
                            label = f"a sweep of {sweep:,} tasks, {case}"
                            flag = str(Path(tmp) / f"gate-{case}")
                            log = functools.partial(rc.log, "scheduler")
                            run = functools.partial(_sweep, c, sweep, case == "refused", flag, log)
                        m = _measure(pid, run)
                        print(f"{label}: {m}", file=sys.stderr, flush=True)
                        rows.append(
                            [
                                label,
                                name,
                                f"{m['seconds'] * 1000:,.0f}",
                                m["what"],
                                _mb(m["before"]),
                                _mb(m["peak"]),
                                _mb(m["after"]),
                                f"{(m['after'] - m['before']) / MIB:+,.0f}",
                            ]
                        )
                        charts[label] = [m["before"] / MIB, m["peak"] / MIB, m["after"] / MIB]
                _still_serves(rc)
                problems = rc.problems()
                if problems:
                    raise AssertionError("\n".join(problems))
    report = harness.Report("Admission limits: refusals and the scheduler's memory", __file__, argv)
    report.note("one `dask scheduler --preload daskjobs.preload` a row group, one worker")
    report.section(
        None,
        harness.table(
            [
                "submission",
                "scheduler",
                "refused in (ms)",
                "limit named",
                "RSS before (MiB)",
                "peak (MiB)",
                "after (MiB)",
                "change (MiB)",
            ],
            rows,
            align="llrlrrrr",
        ),
    )
    labels = list(charts)
    report.chart(
        harness.Chart(
            "Scheduler memory around a refusal",
            "resident MiB",
            labels,
            {
                "before": [charts[k][0] for k in labels],
                "peak": [charts[k][1] for k in labels],
                "after": [charts[k][2] for k in labels],
            },
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
