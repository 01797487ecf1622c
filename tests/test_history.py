"""The history file (daskjobs/history.py): where it is by default, merged by schedulers that
share it, bounded, and never a crash or a hang whatever is found there."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import time

import pytest

from daskjobs import history
from daskjobs.plugin.estimates import make_estimator
from daskjobs.policies.durations import Estimator


def read_json(path):
    with open(path) as f:
        return json.load(f)


def test_the_default_is_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("DASKJOBS_HISTORY", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if sys.platform.startswith("linux"):
        assert history.default_path() == str(tmp_path / "cache" / "daskjobs" / "history.json")
        monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
        assert history.default_path() == os.path.expanduser("~/.cache/daskjobs/history.json")
    monkeypatch.setenv("DASKJOBS_HISTORY", str(tmp_path / "mine.json"))
    assert history.resolve("auto") == str(tmp_path / "mine.json")
    assert history.resolve(None) is None
    assert history.resolve("~/h.json") == os.path.expanduser("~/h.json")


def test_the_default_setting_is_auto_and_null_keeps_memory_only():
    import dask

    from daskjobs.config import Settings, settings

    assert Settings().history_path == "auto"
    with dask.config.set({"daskjobs.history.path": None}):
        assert settings().history_path is None
    est = make_estimator(1.0, 8, None, True)
    assert est.path is None and est.pending() is None


def test_two_schedulers_sharing_a_file_keep_both_ones_observations(tmp_path):
    path = str(tmp_path / "h.json")
    a = Estimator(1.0, 8, path)
    b = Estimator(1.0, 8, path)  # both started before either saved
    for n in range(3):
        a.observe("f", {"n": n}, 1.0 + n)
        b.observe("f", {"n": 10 + n}, 2.0 + n)
    b.observe("g", None, 5.0)
    assert a.save() and b.save()
    a.observe("f", {"n": 99}, 9.0)
    assert a.save()
    data = read_json(path)
    ns = sorted(row[0]["n"] for row in data["stages"]["f"])
    assert ns == [0, 1, 2, 10, 11, 12, 99]  # each observation once
    assert len(data["stages"]["g"]) == 1 and set(data["touched"]) == {"f", "g"}
    # the window bounds a stage: the latest observations are kept
    for n in range(20):
        a.observe("f", {"n": 100 + n}, 1.0)
    assert a.save()
    rows = read_json(path)["stages"]["f"]
    assert [r[0]["n"] for r in rows] == list(range(112, 120))


def _observe_and_save(path: str, who: int, rounds: int) -> None:
    est = Estimator(1.0, 10_000, path)
    for r in range(rounds):
        est.observe("f", {"who": who, "r": r}, 1.0)
        while not est.save():  # the other held the lock too long: next time
            pass


def test_processes_saving_at_once_lose_nothing_and_leave_a_whole_file(tmp_path):
    path = str(tmp_path / "h.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_observe_and_save, args=(path, who, 25)) for who in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    rows = read_json(path)["stages"]["f"]
    assert sorted((r[0]["who"], r[0]["r"]) for r in rows) == [
        (who, r) for who in range(3) for r in range(25)
    ]


def test_stages_in_the_file_are_bounded_by_max_stages(tmp_path):
    path = str(tmp_path / "h.json")
    est = Estimator(1.0, 8, path, max_stages=3)
    for i, stage in enumerate("abcde"):
        est.observe(stage, None, 1.0)
        assert history.write(path, {stage: [[{}, 1.0]]}, {stage: 1}, 8, 3, now=float(i))
    assert set(read_json(path)["stages"]) == {"c", "d", "e"}
    assert est.models.stages() == ["c", "d", "e"]  # in memory too


def test_a_lock_held_too_long_skips_the_save_and_loses_nothing(tmp_path, monkeypatch):
    import fcntl

    path = str(tmp_path / "h.json")
    monkeypatch.setattr(history, "LOCK_WAIT", 0.05)
    est = Estimator(1.0, 8, path)
    est.observe("f", None, 1.0)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        t0 = time.monotonic()
        assert est.save() is False
        assert time.monotonic() - t0 < 5  # never a hang
        assert est.dirty and not os.path.exists(path)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert est.save() and len(read_json(path)["stages"]["f"]) == 1


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "history file"),
        ('{"some": "other program"}', "no 'stages' object"),
        ("[1, 2]", "not a JSON object"),
        ('{"version": 2, "stages": {"f": [["x", 1]]}}', "bad row"),
    ],
)
def test_a_corrupt_or_foreign_file_is_moved_aside_with_a_warning(tmp_path, caplog, content, why):
    path = tmp_path / "h.json"
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="daskjobs.plugin"):
        est = make_estimator(1.0, 8, str(path), True)
    assert why in caplog.text and "starting with no history" in caplog.text
    assert (tmp_path / "h.json.corrupt").read_text() == content
    est.observe("f", None, 1.0)
    assert est.save() and "f" in json.loads(path.read_text())["stages"]


def test_a_newer_versions_file_is_left_alone_and_memory_is_used(tmp_path, caplog):
    path = tmp_path / "h.json"
    newer = json.dumps({"version": history.VERSION + 1, "stages": {"f": "whatever"}})
    path.write_text(newer)
    with caplog.at_level(logging.WARNING, logger="daskjobs.plugin"):
        est = make_estimator(1.0, 8, str(path), True)
    assert "newer daskjobs" in caplog.text and "memory only" in caplog.text
    assert est.path is None
    est.observe("f", None, 1.0)
    assert est.save() is True  # nothing to save to
    assert path.read_text() == newer and not (tmp_path / "h.json.corrupt").exists()
    # a newer daskjobs that writes the file while this one runs: its save refuses
    older = Estimator(1.0, 8, str(tmp_path / "h2.json"))
    older.observe("f", None, 1.0)
    (tmp_path / "h2.json").write_text(newer)
    with pytest.raises(history.NewerHistory):
        older.save()
    assert (tmp_path / "h2.json").read_text() == newer


def test_a_file_too_big_to_be_a_history_is_not_read(tmp_path, monkeypatch):
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"version": 2, "stages": {"f": [[{}, 1.0]] * 100}}))
    monkeypatch.setattr(history, "MAX_BYTES", 100)
    with pytest.raises(ValueError, match="more than a history holds"):
        history.read(str(path))


def test_a_file_that_cannot_be_written_raises_os_error_and_keeps_the_observations(tmp_path):
    """(Root writes read-only files, so the folder here is a plain file: an OSError as a
    read-only file system gives.)"""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    est = Estimator(1.0, 8, str(blocker / "h.json"))
    est.observe("f", None, 1.0)
    with pytest.raises(OSError):
        est.save()
    assert est.dirty and est.models.model("f") is not None
