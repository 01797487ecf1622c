"""Recording a live run (docs/reference/trace-format.md): the trace, its reader, and the ways to
turn it on."""

from __future__ import annotations

import json
import threading
import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

import daskjobs
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status
from daskjobs.plugin.observe.recorder import TraceRecorder
from daskjobs.plugin.workers.worker import REPORTER_NAME
from daskjobs.trace import TraceError, read_trace


def cluster(plugin=None, **kwargs):
    kwargs.setdefault("n_workers", 2)
    kwargs.setdefault("threads_per_worker", 2)
    return plugin_cluster(plugin, **kwargs)


def step(x, *deps):
    time.sleep(0.005)
    return x


def sweep(tag="s"):
    """30 tasks: 12 preparations, 12 fits (each reads one), 5 scores of pairs of fits 0-9,
    a summary of the scores and fits 10 and 11."""
    preps, fits = [], []
    for i in range(12):
        with dask.annotate(estimate=0.5, team="quant"):
            preps.append(dask.delayed(step)(i, dask_key_name=(f"{tag}-prep", i)))
    for i in range(12):
        with dask.annotate(estimate=2.0 + i, team="ml"):
            fits.append(dask.delayed(step)(i, preps[i], dask_key_name=f"{tag}-fit-{i}"))
    scores = [
        dask.delayed(step)(i, fits[2 * i], fits[2 * i + 1], dask_key_name=f"{tag}-score-{i}")
        for i in range(5)
    ]
    return dask.delayed(step)("done", *scores, *fits[10:], dask_key_name=f"{tag}-summary")


def workers_plugins(client):
    return client.run(lambda dask_worker: sorted(dask_worker.plugins))


# -- a whole run --------------------------------------------------------------------------------


def test_a_recorded_run_round_trips(tmp_path):
    path = tmp_path / "run.jsonl"
    plugin = JobsPlugin(policy="lpt", record=str(path))
    with dask.config.set(VALIDATE), cluster(plugin) as cl, Client(cl) as c:
        assert c.compute(sweep(), sync=True) == "done"
        addresses = set(cl.scheduler.workers)
    trace = read_trace(path)
    assert trace.complete and trace.dropped == 0 and not trace.truncated
    assert trace.footer["records"] == trace.records and trace.footer["errors"] == 0
    assert trace.header["version"] == 1 and trace.header["policy"] == "lpt"
    assert trace.header["distributed"] and trace.header["settings"]["record"] == str(path)
    # the graph: 30 tasks, keys as given (tuple keys come back as tuples), deps, estimates, teams
    assert len(trace.tasks) == 30
    prep0, fit3 = trace.tasks[("s-prep", 0)], trace.tasks["s-fit-3"]
    assert fit3.deps == (("s-prep", 3),) and fit3.estimate == 5.0 and fit3.team == "ml"
    assert fit3.estimate_source == "annotation" and fit3.annotations["team"] == "ml"
    assert prep0.estimate == 0.5 and prep0.team == "quant" and prep0.stage == "test_record.step"
    summary = {f"s-score-{i}" for i in range(5)} | {"s-fit-10", "s-fit-11"}
    assert set(trace.tasks["s-summary"].deps) == summary
    # every task: one attempt, assigned, truly started on a worker (same run), finished
    for task in trace.tasks.values():
        assert task.in_graph and len(task.attempts) == 1, task.key
        a = task.attempts[0]
        assert a.outcome == "memory" and a.worker in addresses
        assert a.assigned is not None and a.started is not None and a.finished is not None
        assert a.started_run_id is not None and a.started_run_id == a.run_id
        assert a.assigned <= a.started <= a.finished
        assert a.duration is not None and a.duration >= 0.004
        assert a.compute_start <= a.compute_stop and a.worker_start is not None
        assert task.submit <= a.assigned
    # the workers: both arrived and left, with their threads
    assert {w.address for w in trace.workers} == addresses
    assert all(w.nthreads == 2 and w.added and w.removed for w in trace.workers)
    assert [e["action"] for e in trace.events][:1] == ["recording"]
    assert any(e["action"] == "ranked-graph" for e in trace.events)


def flaky(x):
    raise ValueError(f"flaky {x}")


def test_failed_attempts_are_recorded_each(tmp_path):
    path = tmp_path / "fail.jsonl"
    with cluster(JobsPlugin(record=str(path)), n_workers=1) as cl, Client(cl) as c:
        fut = c.submit(flaky, 1, key="flaky-1", retries=1)
        with pytest.raises(ValueError, match="flaky 1"):
            fut.result()
    task = read_trace(path).tasks["flaky-1"]
    assert [a.outcome for a in task.attempts] == ["erred", "erred"]
    assert [a.state for a in task.attempts] == ["released", "erred"]  # retried, then failed
    assert "flaky 1" in task.attempts[-1].error
    assert all(a.started_run_id == a.run_id for a in task.attempts)


# -- turning it on ------------------------------------------------------------------------------


def test_record_context_manager_on_a_running_cluster(tmp_path):
    with cluster(JobsPlugin(), n_workers=1) as cl, Client(cl) as c:
        before = c.compute(dask.delayed(step)(1, dask_key_name="before"))
        before.result()
        assert all(REPORTER_NAME not in p for p in workers_plugins(c).values())  # not yet
        with daskjobs.record(c, tmp_path / "cm.jsonl") as path:
            assert status(c)["recording"]["path"] == path
            assert all(REPORTER_NAME in p for p in workers_plugins(c).values())
            with (
                pytest.raises(RuntimeError, match="already recording to"),
                daskjobs.record(c, tmp_path / "other.jsonl"),
            ):
                pass
            assert c.compute(sweep("cm"), sync=True) == "done"
        assert all(REPORTER_NAME not in p for p in workers_plugins(c).values())  # removed again
        c.compute(dask.delayed(step)(2, dask_key_name="after"), sync=True)
        assert status(c)["recording"] is None
    trace = read_trace(path)
    assert trace.complete and trace.dropped == 0
    assert "after" not in trace.tasks
    # what was on the scheduler already is in the graph, marked
    assert trace.tasks["before"].existing and not trace.tasks["before"].attempts
    assert [w.existing for w in trace.workers] == [True]
    ran = [t for t in trace.tasks.values() if str(t.key).startswith("cm") or t.key[0] == "cm-prep"]
    assert len(ran) == 30
    assert all(t.attempts[0].started_run_id == t.attempts[0].run_id for t in ran)


def test_record_without_the_plugin_says_how_to_load_it(tmp_path):
    with (
        cluster(n_workers=1) as cl,
        Client(cl) as c,
        pytest.raises(RuntimeError, match="not loaded"),
        daskjobs.record(c, tmp_path / "x.jsonl"),
    ):
        pass


def test_record_to_an_unwritable_path_names_it(tmp_path):
    with cluster(JobsPlugin(), n_workers=1) as cl, Client(cl) as c:
        with (
            pytest.raises(OSError, match=r"cannot write the daskjobs trace to .*no-such-dir"),
            daskjobs.record(c, tmp_path / "no-such-dir" / "x.jsonl"),
        ):
            pass
        assert status(c)["recording"] is None  # and nothing half-started


def test_record_from_dask_config_and_its_validation(tmp_path):
    path = tmp_path / "cfg.jsonl"
    with dask.config.set({"daskjobs.record": str(path)}):
        plugin = JobsPlugin()
    assert plugin.settings.record == str(path)
    with cluster(plugin, n_workers=1) as cl, Client(cl) as c:
        c.compute(dask.delayed(step)(1, dask_key_name="one"), sync=True)
    assert read_trace(path).tasks["one"].attempts[0].outcome == "memory"
    with pytest.raises(ValueError, match=r"daskjobs.record: expected the path of a trace file"):
        JobsPlugin(record=3)


def test_a_worker_that_joins_later_gets_the_start_reporter(tmp_path):
    path = tmp_path / "late.jsonl"
    with cluster(JobsPlugin(record=str(path)), n_workers=1) as cl, Client(cl) as c:
        first = set(cl.scheduler.workers)
        cl.scale(2)
        c.wait_for_workers(2, timeout=20)
        (late,) = set(cl.scheduler.workers) - first
        assert all(REPORTER_NAME in p for p in workers_plugins(c).values())
        futs = [c.submit(step, i, key=f"late-{i}", workers=[late]) for i in range(3)]
        c.gather(futs)
    trace = read_trace(path)
    for i in range(3):
        (a,) = trace.tasks[f"late-{i}"].attempts
        assert a.worker == late and a.started is not None and a.started_run_id == a.run_id
    assert late in {w.address for w in trace.workers if not w.existing}


def test_a_broken_recorder_never_breaks_the_run(tmp_path):
    with cluster(JobsPlugin(record=str(tmp_path / "b.jsonl")), n_workers=1) as cl, Client(cl) as c:

        def boom(record):
            raise RuntimeError("injected")

        cl.scheduler.plugins["daskjobs"].recording.recorder.emit = boom
        assert c.compute(sweep("b"), sync=True) == "done"
        assert status(c)["errors"]["record"] >= 30


# -- the recorder -------------------------------------------------------------------------------


class _StuckFile:
    """A trace file whose writes block until ``release`` is set (a stalled disk)."""

    def __init__(self, real):
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()

    def writelines(self, lines):
        self.entered.set()
        assert self.release.wait(60), "the test never released the stuck disk"
        self.real.writelines(lines)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "daskjobs.plugin.recorder"]


def test_the_recorder_never_blocks_and_counts_what_it_drops(tmp_path, caplog):
    """With the writer stuck inside a write, emit still returns at once: 50,000 emits
    finish while the disk is stalled (a blocking emit could only finish after the
    release), at most ``max_queue`` wait, the rest are counted and logged once."""
    path = tmp_path / "q.jsonl"
    rec = TraceRecorder(path, max_queue=10, flush_interval=0.01)
    stuck = rec._file = _StuckFile(rec._file)
    now = time.time()
    assert rec.emit({"type": "event", "time": now, "event": {"i": -1}})
    assert stuck.entered.wait(30)  # the writer took that record and is stuck writing it
    accepted: list[bool] = []
    emitter = threading.Thread(
        target=lambda: accepted.extend(
            rec.emit({"type": "event", "time": now, "event": {"i": i}}) for i in range(50_000)
        )
    )
    emitter.start()
    emitter.join(30)
    done_while_stuck = not emitter.is_alive()
    stuck.release.set()
    emitter.join()
    assert done_while_stuck, "emit waited for the writer"
    assert sum(accepted) == 10 and rec.dropped == 49_990
    assert rec.stats()["dropped"] == 49_990
    rec.close()
    assert rec.emit({"type": "event", "time": now, "event": {}}) is False  # after close: dropped
    trace = read_trace(path)
    assert trace.complete and trace.dropped == 49_990 and trace.records == 11
    # the loss is logged once, at WARNING, with the count
    (warning,) = _warnings(caplog)
    assert warning.levelname == "WARNING" and "49990 record(s) dropped" in warning.getMessage()


@pytest.mark.slow
def test_a_graph_of_100001_tasks_is_never_dropped(tmp_path, caplog):
    """The plugin emits a graph's records inside one update_graph call, before the
    writer can drain any: more than the queue's bound. All of them are written;
    transition records beyond the bound are what a slow disk costs."""
    path = tmp_path / "big.jsonl"
    rec = TraceRecorder(path, flush_interval=3600)  # the writer drains only at close
    assert rec.max_queue == 65_536
    now = time.time()
    n = 100_001
    for i in range(n):
        rec.emit({"type": "graph", "time": now, "key": f"t-{i}", "deps": [], "submit": now})
    assert rec.dropped == 0 and rec.pending == n
    queued = rec.emit_many(
        {"type": "assigned", "time": now, "key": f"t-{i}", "worker": "tcp://w:1"}
        for i in range(70_000)
    )
    assert queued == 65_536 and rec.dropped == 70_000 - 65_536
    assert not _warnings(caplog)  # emit logs nothing: the writer does, once
    rec.close()
    trace = read_trace(path)
    assert trace.complete and trace.dropped == 4_464
    assert len(trace.tasks) == n and all(t.in_graph for t in trace.tasks.values())
    assert sum(len(t.attempts) for t in trace.tasks.values()) == 65_536
    assert list(trace.tasks)[:2] == ["t-0", "t-1"]  # written in the order emitted
    (warning,) = _warnings(caplog)
    assert "4464 record(s) dropped" in warning.getMessage()


def _inc(x):
    return x + 1


@pytest.mark.slow
def test_graph_records_through_the_plugin_survive_a_stalled_writer(tmp_path, monkeypatch, caplog):
    """The same through a LocalCluster: the queue bound lowered to 1,000 and the writer
    stalled until recording stops, a graph of 3,000 tasks that cannot run (no worker
    has a GPU) and 600 that run. Every graph record is in the trace; the transitions
    beyond the bound are dropped, counted in status() and the footer, logged once."""
    from daskjobs.plugin.observe import recorder

    init = recorder.TraceRecorder.__init__

    def stalled(self, path, **kwargs):
        init(self, path, **{**kwargs, "max_queue": 1_000, "flush_interval": 3600})

    monkeypatch.setattr(recorder.TraceRecorder, "__init__", stalled)
    path = tmp_path / "plugin.jsonl"
    with cluster(JobsPlugin(), n_workers=1) as cl, Client(cl) as c:
        with daskjobs.record(c, path):
            stuck = {f"gpu-{i}": (_inc, i) for i in range(3_000)}
            held = c.get(stuck, list(stuck), sync=False, resources={"GPU": 1})
            runs = {f"cpu-{i}": (_inc, i) for i in range(600)}
            assert len(c.get(runs, list(runs))) == 600
            seen = status(c)["recording"]
            assert seen["dropped"] > 0
        del held
    trace = read_trace(path)
    graph = {k for k, t in trace.tasks.items() if t.in_graph}
    assert {f"gpu-{i}" for i in range(3_000)} | {f"cpu-{i}" for i in range(600)} <= graph
    assert trace.dropped >= seen["dropped"] > 0
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "record(s) dropped" in warnings[0].getMessage()


def test_values_json_cannot_hold_are_written_anyway(tmp_path):
    path = tmp_path / "v.jsonl"
    with TraceRecorder(path, flush_interval=0.01) as rec:
        rec.emit(
            {
                "type": "graph",
                "time": time.time(),
                "key": ("x", 1, ("y", 2)),
                "deps": [b"raw"],
                "annotations": {"when": object, "nan": float("nan"), (1, 2): {3}},
            }
        )
    task = read_trace(path).tasks[("x", 1, ("y", 2))]
    assert task.deps == ("raw",)
    assert task.annotations == {"when": "<class 'object'>", "nan": None, "(1, 2)": [3]}


# -- reading bad traces -------------------------------------------------------------------------

HEADER = '{"type": "header", "version": 1, "started": 1.0}'
GRAPH = '{"type": "graph", "time": 1.0, "key": "a", "deps": []}'
FOOTER = '{"type": "footer", "records": 1, "dropped": 0}'


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([HEADER, "{not json", GRAPH], r"t.jsonl:2: not valid JSON"),
        ([HEADER, GRAPH, '{"type": "assigned", "time": 2}'], r":3: 'assigned' record: field 'key'"),
        ([HEADER, '{"type": "graph", "time": "noon", "key": "a", "deps": []}'], r":2: .*'time'"),
        ([HEADER, '{"type": "graph", "time": 1, "key": "a", "deps": "b"}'], r":2: .*'deps'"),
        ([HEADER, '{"type": "worker-added", "time": 1, "worker": "w"}'], r":2: .*'nthreads'"),
        ([HEADER, "[1, 2]"], r":2: expected a JSON object"),
        ([HEADER, '{"time": 1}'], r":2: field 'type' is missing"),
        (['{"type": "header", "version": 2}'], r":1: trace version 2 is not supported"),
        ([GRAPH], r":1: expected the trace header first"),
        ([HEADER, FOOTER, GRAPH], r":3: a 'graph' record after the footer"),
        ([], r"empty file"),
    ],
)
def test_bad_traces_are_rejected_naming_line_and_field(tmp_path, lines, match):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(TraceError, match=match):
        read_trace(path)


def test_a_crashed_run_reads_as_incomplete(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(f'{HEADER}\n{GRAPH}\n{{"type": "future-kind", "time": 1}}\n{{"type": "assi')
    trace = read_trace(path)
    assert not trace.complete and trace.truncated and trace.dropped is None
    assert list(trace.tasks) == ["a"] and trace.skipped == {"future-kind": 1}
    # a broken line in the middle is an error, not a truncation
    path.write_text(f"{HEADER}\n{{broken\n{GRAPH}")
    with pytest.raises(TraceError, match=":2: not valid JSON"):
        read_trace(path)
    assert json.loads(HEADER)["version"] == 1
