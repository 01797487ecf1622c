"""Malformed traces (issue 10, item 6): 300 seeded mutations of the shipped trace.

Each mutation is one of: a truncation, a deleted, duplicated or moved line, a field
of another type, a huge, negative or shifted number, binary garbage. Every mutated
trace goes through ``daskjobs replay`` (the command a user runs) and must either be
refused with a one-line ``TraceError`` message naming the file and line (exit status 2,
no traceback), or replay with figures bounded by the run that was recorded: a time out
of order or beyond the run, a negative duration or an absurd magnitude is never
replayed as if it were true.

The mutator is seeded: the same 300 traces at every run, a few seconds in all.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from repo import ROOT

from daskjobs.cli import main
from daskjobs.replay import ReplayError, load, replay
from daskjobs.trace import CLOCK_TOLERANCE, TraceError, read_trace

SHIPPED = ROOT / "examples" / "data" / "replay_small.jsonl"
MUTATIONS = 300
SEED = 20261130

# -- the mutator ---------------------------------------------------------------------------------

KINDS = ("truncate", "delete", "duplicate", "move", "retype", "number", "garbage")

HUGE = [9.9e18, 1e308, 10**400, -(10**30), 2**63, 1e7 + 1.0, 5e9]
NEGATIVE = [-1, -1.0, -0.001, -1e9, -1795941675.0]
# fields whose huge or negative value cannot be true: refused, or at least noted
MEASURED = {
    *("time", "submit", "started", "finished", "worker_time", "compute_start"),
    *("compute_stop", "duration", "transfer", "estimate", "nthreads", "run_id"),
    *("nbytes", "memory_limit", "records", "dropped", "errors", "version"),
}
OTHER_TYPES: list[Any] = ["x", "1.5", "", [], [1, 2], {}, {"a": 1}, True, False, None, 0, 1.5]


def _numbers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every number (not bool) inside a JSON value."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numbers(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _numbers(v, (*path, i))]
    return []


def _set(rec: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        rec = rec[step]
    rec[path[-1]] = value


def _get(rec: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        rec = rec[step]
    return rec


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes, bool]:
    """One random mutation of the trace ``data``: a description, the mutated bytes, and
    whether the mutation must be refused or noted (a line lost, added or garbled, a
    huge or negative measurement), not replayed silently."""
    lines = data.split(b"\n")[:-1]  # the file ends with a newline
    kind = rng.choice(KINDS)
    i = rng.randrange(len(lines))
    if kind == "truncate":
        cut = rng.randrange(len(data))
        return f"truncate at byte {cut}", data[:cut], True
    if kind == "delete":
        del lines[i]
        return f"delete line {i + 1}", b"".join(ln + b"\n" for ln in lines), True
    if kind == "duplicate":
        j = rng.randrange(len(lines) + 1)
        lines.insert(j, lines[i])
        what = f"line {i + 1} copied before line {j + 1}"
        return what, b"".join(ln + b"\n" for ln in lines), True
    if kind == "move":  # flagged only when the times say so (moved among equal times: fine)
        j = rng.randrange(len(lines))
        lines.insert(j, lines.pop(i))
        return f"line {i + 1} moved to {j + 1}", b"".join(ln + b"\n" for ln in lines), False
    if kind == "garbage":
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 24)))
        if rng.random() < 0.5:  # into a line: flagged unless it is printable text (then it
            # may only rename a field, or change a string the replay takes as a label)
            at = rng.randrange(len(data))
            try:
                binary = not junk.decode("utf-8").isprintable()
            except UnicodeDecodeError:
                binary = True
            return f"{len(junk)} random bytes at byte {at}", data[:at] + junk + data[at:], binary
        lines[i] = junk
        what = f"line {i + 1} replaced by random bytes"
        return what, b"".join(ln + b"\n" for ln in lines), True
    rec = json.loads(lines[i])
    flagged = False
    if kind == "retype":  # flagged nowhere: many fields may be null, some are not used
        field = rng.choice(sorted(rec))
        value = rng.choice(OTHER_TYPES)
        rec[field] = value
        what = f"line {i + 1}: {field!r} := {value!r}"
    else:  # "number"
        paths = _numbers(rec)
        if not paths:
            return mutate(data, rng)
        path = rng.choice(paths)
        old = _get(rec, path)
        choice = rng.random()
        if choice < 0.4:
            value = rng.choice(HUGE)
        elif choice < 0.7:
            value = rng.choice(NEGATIVE)
        else:  # a plausible-looking shift: off by minutes, hours or years
            value = old + rng.choice([-1, 1]) * rng.choice([30.0, 3600.0, 3e7])
        # (annotations are the user's, recorded as given; the replay reads the fields)
        flagged = choice < 0.7 and path[-1] in MEASURED and path[0] != "annotations"
        _set(rec, path, value)
        what = f"line {i + 1}: {'.'.join(map(str, path))} := {value!r}"
    lines[i] = json.dumps(rec).encode()
    return what, b"".join(ln + b"\n" for ln in lines), flagged


# -- the oracle ----------------------------------------------------------------------------------


def _window(data: bytes) -> float:
    """Seconds between the header's ``started`` and the footer's ``finished``."""
    lines = data.decode().splitlines()
    return json.loads(lines[-1])["finished"] - json.loads(lines[0])["started"]


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    data = SHIPPED.read_bytes()
    loaded = load(SHIPPED)
    return {
        "data": data,
        "window": _window(data),
        "makespan": replay(loaded).makespan,
        "tasks": len(loaded.tasks),
    }


# a refusal names the file and the line: "t.jsonl:17: ..." (or, for a trace with
# nothing left to replay, says so)
REFUSAL = re.compile(r"^Error: cannot replay: \S*m\.jsonl(:\d+: .+| ?: .*nothing to replay.*)$")


def test_the_shipped_trace_is_clean(shipped):
    trace = read_trace(SHIPPED)
    assert trace.complete and not trace.notes
    assert not load(SHIPPED).notes


@pytest.mark.slow
def test_three_hundred_mutations_are_refused_by_name_or_replayed_within_the_run(shipped, tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "m.jsonl"
    bound = shipped["window"] + 2 * CLOCK_TOLERANCE
    outcomes: dict[str, int] = {}
    for n in range(MUTATIONS):
        what, data, flagged = mutate(shipped["data"], rng)
        path.write_bytes(data)
        result = CliRunner().invoke(main, ["replay", str(path), "--json"])
        case = f"mutation {n} ({what})"
        if result.exit_code != 0:
            # refused: a one-line usage error naming the file and line, never a traceback
            assert isinstance(result.exception, SystemExit), (case, result.exc_info)
            assert result.exit_code == 2, (case, result.output)
            (message,) = result.output.strip().splitlines()
            assert REFUSAL.match(message), (case, result.output)
            outcomes["refused"] = outcomes.get("refused", 0) + 1
            continue
        # replayed: every figure within the run that was recorded
        report = json.loads(result.output)
        recorded, replayed = report["recorded"], report["replayed"]
        assert 0 < recorded["makespan_s"] <= bound, (case, recorded)
        assert 0 < replayed["makespan_s"] <= shipped["makespan"] + bound, (case, replayed)
        for row in report["what_if"]:
            assert math.isfinite(row["makespan_s"]) and row["makespan_s"] <= 100 * bound, case
        # a lost, added or garbled line or an impossible number is never replayed silently
        assert report["notes"] or not flagged, (case, "replayed without a note")
        outcomes["noted" if report["notes"] else "clean"] = (
            outcomes.get("noted" if report["notes"] else "clean", 0) + 1
        )
    # the mix is what the seeded mutator produces; most mutations must be caught
    assert outcomes["refused"] > MUTATIONS // 3, outcomes


@pytest.mark.slow
def test_the_reader_alone_raises_only_trace_errors(shipped, tmp_path):
    """``read_trace`` and ``load`` (the Python API) refuse with TraceError naming the line."""
    rng = random.Random(SEED + 1)
    path = tmp_path / "m.jsonl"
    for n in range(MUTATIONS):
        what, data, _ = mutate(shipped["data"], rng)
        path.write_bytes(data)
        try:
            load(path)
        except ReplayError as exc:
            assert "nothing to replay" in str(exc), (n, what, exc)
        except TraceError as exc:
            assert re.match(r"^\S*m\.jsonl:\d+: ", str(exc)), (n, what, exc)
            assert "\n" not in str(exc), (n, what, exc)


# -- each class of fault, named ------------------------------------------------------------------


def _records() -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in SHIPPED.read_text().splitlines()]


def _first(recs: list[dict[str, Any]], kind: str, n: int = 0) -> int:
    """Index of the ``n``-th record of type ``kind``."""
    return [i for i, r in enumerate(recs) if r["type"] == kind][n]


def _write(path: Path, recs: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def _edit(kind: str, n: int = 0, **fields: Any):
    def change(recs: list[Any]) -> int:
        i = _first(recs, kind, n)
        recs[i] = {**recs[i], **fields}
        return i

    return change


def _move_time(kind: str, n: int, by: float):
    def change(recs: list[Any]) -> int:
        i = _first(recs, kind, n)
        recs[i] = {**recs[i], "time": recs[i]["time"] + by}
        return i

    return change


def _duplicate(kind: str):
    def change(recs: list[Any]) -> int:
        i = _first(recs, kind, 3)
        recs.insert(i + 1, recs[i])
        return i + 1

    return change


def _raw(kind: str, text: str):
    def change(recs: list[Any]) -> int:
        i = _first(recs, kind, 2)
        recs[i] = text
        return i

    return change


def _last_after_the_run(recs: list[Any]) -> int:
    recs[-2] = {**recs[-2], "time": recs[-1]["finished"] + 30}  # the record before the footer
    return len(recs) - 1  # the footer, which says the run ended 30 s before


def _cycle(recs: list[Any]) -> int:
    graph = [i for i, r in enumerate(recs) if r["type"] == "graph"]
    a, b = graph[0], graph[1]
    recs[a] = {**recs[a], "deps": [recs[b]["key"]]}
    recs[b] = {**recs[b], "deps": [recs[a]["key"]]}
    return b


def _submit_before_recording(recs: list[Any]) -> int:
    i = _first(recs, "graph", 4)
    recs[i] = {**recs[i], "submit": recs[0]["started"] - 3600}
    return i


def _computed_longer_than_it_ran(recs: list[Any]) -> int:
    i = _first(recs, "finished", 5)
    recs[i] = {**recs[i], "duration": 30.0, "compute_start": None, "compute_stop": None}
    return i


FAULTS = {
    "huge integer": (_edit("graph", 3, user_priority=10**400), "'user_priority' expected a finite"),
    "time of 9.9e18": (_edit("finished", 2, time=9.9e18), "'time' expected a time in seconds"),
    "negative submit": (_edit("graph", 2, submit=-1.0), "'submit' expected a time in seconds"),
    "submit before recording": (_submit_before_recording, "'submit' .* before the recording"),
    "negative estimate": (_edit("graph", 1, estimate=-2.0), "'estimate' expected a finite"),
    "negative duration": (_edit("finished", 1, duration=-0.5), "'duration' expected seconds"),
    "duration beyond compute": (_edit("finished", 4, duration=9.0), "'duration' 9.0 is longer"),
    "computed longer than it ran": (_computed_longer_than_it_ran, "'duration' 30.0 s of comp"),
    "huge nthreads": (_edit("worker-added", 0, nthreads=10**6), "'nthreads' expected an integer"),
    "time out of order": (_move_time("finished", 10, -30.0), "'time' .* 30 s before line"),
    "time after the run": (_last_after_the_run, "'finished' .* before line"),
    "duplicated end": (_duplicate("finished"), "'run_id' .* a second end of this run"),
    "dict in deps": (_edit("graph", 0, deps=[{"a": 1}]), "'deps' expected a JSON array of"),
    "dependency cycle": (_cycle, "'deps' closes a dependency cycle"),
    "NaN": (_raw("finished", '{"type": "finished", "time": NaN}'), "not valid JSON .*NaN"),
    "second header": (_raw("assigned", json.dumps({"type": "header", "version": 1})), "second"),
    "bad default estimate": (
        _edit("header", 0, settings={"default_estimate": -1}),
        "'settings.default_estimate' expected",
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_refused_naming_line_and_field(tmp_path, fault):
    change, match = FAULTS[fault]
    recs: list[Any] = _records()
    line = change(recs) + 1
    path = _write(tmp_path / "t.jsonl", recs)
    with pytest.raises(TraceError, match=rf"t\.jsonl:{line}: .*{match}"):
        load(path)
    result = CliRunner().invoke(main, ["replay", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    (message,) = result.output.splitlines()  # one line, no usage text, no traceback
    assert re.match(rf"Error: cannot replay: \S*t\.jsonl:{line}: .*{match}", message), message


def test_binary_garbage_and_a_cut_character(tmp_path):
    data = SHIPPED.read_bytes().split(b"\n")
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b"\n".join([*data[:40], b'{"type": "ev\xff\xfe\x00', *data[41:]]))
    with pytest.raises(TraceError, match=r"bin\.jsonl:41: not UTF-8 text \(byte 0xff at column 13"):
        read_trace(bad)
    result = CliRunner().invoke(main, ["replay", str(bad)])
    assert result.exit_code == 2 and "bin.jsonl:41: not UTF-8 text" in result.output
    # a crashed run whose last write stopped inside a character: a truncation, not an error
    cut = tmp_path / "cut.jsonl"
    last = '{"type": "event", "time": 1795941676.31, "event": {"action": "caf\u00e9"}}'
    cut.write_bytes(b"\n".join(data[:-2]) + b"\n" + last.encode()[:-4])
    trace = read_trace(cut)
    assert trace.truncated and not trace.complete
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match=r"empty\.jsonl:1: empty file"):
        read_trace(empty)


def test_a_trace_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    import daskjobs.trace as trace_module

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(trace_module, "open", denied, raising=False)
    path = tmp_path / "locked.jsonl"
    path.write_bytes(SHIPPED.read_bytes())
    result = CliRunner().invoke(main, ["replay", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.output == f"Error: cannot replay: cannot read {path}: Permission denied\n"


def test_suspicious_but_possible_values_are_noted(tmp_path):
    recs: list[Any] = _records()
    i = _first(recs, "assigned", 7)
    recs[i] = {**recs[i], "time": recs[i - 1]["time"] - 0.4}  # the clock stepped back 0.4 s
    j = _first(recs, "started", 3)
    recs[j] = {**recs[j], "worker_time": recs[j]["worker_time"] + 3600}  # a worker clock off
    k = _first(recs, "graph", 5)
    recs[k] = {**recs[k], "estimate": 3e7}  # an estimate of a year
    del recs[_first(recs, "worker-removed")]  # two lines lost after the run
    del recs[_first(recs, "worker-removed")]
    recs.insert(5, {"type": "from-the-future", "time": recs[4]["time"]})
    loaded = load(_write(tmp_path / "t.jsonl", recs))
    notes = "\n".join(loaded.notes)
    assert f"clock went back 1 time(s), by up to 0.4 s (line {i + 2})" in notes
    assert "worker's clock is 3.6e+03 s off the scheduler's" in notes
    assert "1 estimate(s) above 1e+07 s" in notes
    assert "the footer counts 252 records but 251 were read" in notes
    assert "'from-the-future' x1" in notes
    assert replay(loaded).makespan < 1.0
