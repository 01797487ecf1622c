"""The result store: round trips, atomic commits, concurrent writers, corruption, gc."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from filetree import read_only, snapshot

from daskjobs.cache.store import (
    CorruptEntryError,
    ResultStore,
    StoreAccessError,
    default_store_url,
    serialize,
)


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ResultStore]:
    if request.param == "local":
        yield ResultStore(tmp_path / "store")
        return
    s = ResultStore(f"memory://{tmp_path.name}-{uuid.uuid4().hex}")
    yield s
    if s.fs.exists(s.url.removeprefix("memory://")):
        s.fs.rm(s.url.removeprefix("memory://"), recursive=True)


def payload_files(store: ResultStore, key: str) -> list[str]:
    try:
        return list(store.fs.find(f"{store.root}/data/{key}"))
    except FileNotFoundError:
        return []


def test_round_trip_with_metadata(store: ResultStore) -> None:
    arr = np.arange(100_000, dtype=np.float64).reshape(1000, 100)
    value = {"prices": arr, "name": "slice-3", "n": 7}
    assert store.put(
        "feat-1", value, stage="feat", params={"window": np.int64(20)}, compute_seconds=1.5
    )
    assert store.contains("feat-1") and "feat-1" in store
    out = store.get("feat-1")
    assert out["name"] == "slice-3" and out["n"] == 7
    np.testing.assert_array_equal(out["prices"], arr)
    out["prices"][0, 0] = -1.0  # loaded arrays are ordinary writable arrays
    info = store.info("feat-1")
    assert info.stage == "feat" and info.params == {"window": 20}
    assert info.compute_seconds == 1.5
    assert arr.nbytes < info.nbytes < arr.nbytes + 4096
    assert info.checksum.startswith("blake2b:") and info.writer
    assert [e.key for e in store.ls()] == ["feat-1"] == store.keys()


def test_numpy_buffers_bypass_the_pickle_stream() -> None:
    arr = np.arange(50_000, dtype=np.int64)
    chunks = serialize({"a": arr})
    raw = [c for c in chunks if isinstance(c, memoryview) and c.nbytes == arr.nbytes]
    assert len(raw) == 1
    assert np.shares_memory(np.frombuffer(raw[0], dtype=np.int64), arr)  # no copy made


def test_missing_key(store: ResultStore) -> None:
    assert not store.contains("nope-1")
    with pytest.raises(KeyError):
        store.get("nope-1")
    assert store.delete("nope-1") is False


def test_second_writer_of_a_key_loses_and_leaves_the_first(store: ResultStore) -> None:
    assert store.put("k-1", "first") is True
    assert store.put("k-1", "second") is False
    assert store.get("k-1") == "first"
    assert len(payload_files(store, "k-1")) == 1


def test_concurrent_writers_leave_exactly_one_entry(store: ResultStore) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[bool] = [False] * n

    def write(i: int) -> None:
        barrier.wait()
        results[i] = store.put("race-1", np.full(10_000, i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.keys() == ["race-1"]
    value = store.get("race-1")
    assert len(set(value.tolist())) == 1  # one writer's complete value, never a mix
    winner = int(value[0])
    assert results[winner] is True
    assert store.verify().corrupt == ()
    if store._local:  # exclusive create: exactly one winner, losers clean up
        assert sum(results) == 1
        assert len(payload_files(store, "race-1")) == 1


def _put_in_process(url: str, i: int) -> bool:
    return ResultStore(url).put("proc-1", f"writer {i}")


@pytest.mark.slow
def test_two_processes_write_one_key(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    # spawn: forking a test process that may hold threads (dask, hypothesis) can deadlock.
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        won = list(pool.map(_put_in_process, [url] * 6, range(6)))
    assert sum(won) == 1
    store = ResultStore(url)
    assert store.get("proc-1") == f"writer {won.index(True)}"
    assert len(payload_files(store, "proc-1")) == 1


CRASH = """
import os, signal, sys
from daskjobs.cache.store import ResultStore
store = ResultStore(sys.argv[1])
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)   # killed between payload write and commit
store._commit = die
store.put("crash-1", list(range(1000)))
"""


def test_writer_killed_before_commit_leaves_no_entry(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    proc = subprocess.run([sys.executable, "-c", CRASH, url], timeout=60)
    assert proc.returncode == -9
    store = ResultStore(url)
    assert len(payload_files(store, "crash-1")) == 1  # the payload was written...
    assert not store.contains("crash-1")  # ...but never committed
    with pytest.raises(KeyError):
        store.get("crash-1")
    assert store.put("crash-1", "recomputed") is True
    assert store.get("crash-1") == "recomputed"
    report = store.gc(now=time.time() + 2 * 3600)  # the orphan is past its grace period
    assert report.orphans == 1 and report.removed == ()
    assert len(payload_files(store, "crash-1")) == 1
    assert store.get("crash-1") == "recomputed"


def test_half_written_manifest_is_not_visible(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    store.put("other-1", 1)
    (Path(store.root) / "tmp" / "dead.json").write_text('{"key": "half-1", "payl')
    assert not store.contains("half-1")
    assert store.keys() == ["other-1"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "remove"])
def test_corrupt_payload_is_detected_reported_and_removed(
    store: ResultStore, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store.put("bad-1", np.arange(1000))
    path = f"{store.root}/{store.info('bad-1').payload}"
    data = bytearray(store.fs.cat_file(path))
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "extend":
        data += b"\0"
    if damage == "remove":
        store.fs.rm_file(path)
    else:
        store.fs.pipe_file(path, bytes(data))
    with (
        caplog.at_level(logging.WARNING, logger="daskjobs.cache"),
        pytest.raises(CorruptEntryError),
    ):
        store.get("bad-1")
    assert "corrupt entry bad-1" in caplog.text
    assert not store.contains("bad-1")
    assert store.put("bad-1", np.arange(1000)) is True  # and it can be written again


def test_unreadable_manifest_is_corrupt(store: ResultStore) -> None:
    store.put("man-1", 1)
    store.fs.pipe_file(f"{store.root}/entries/man-1.json", b'{"key": "man-1", "nb')
    with pytest.raises(CorruptEntryError):
        store.get("man-1")
    assert not store.contains("man-1")


def test_verify_finds_and_removes_corrupt_entries(store: ResultStore) -> None:
    for i in range(3):
        store.put(f"v-{i}", list(range(100 + i)))
    path = f"{store.root}/{store.info('v-1').payload}"
    data = bytearray(store.fs.cat_file(path))
    data[-1] ^= 1
    store.fs.pipe_file(path, bytes(data))
    report = store.verify(remove=False)
    assert report.corrupt == ("v-1",) and report.ok == ("v-0", "v-2")
    assert store.contains("v-1")
    report = store.verify()
    assert report.corrupt == ("v-1",) and report.not_removed == {}
    assert store.keys() == ["v-0", "v-2"]
    assert payload_files(store, "v-1") == []  # the corrupt payload went with its manifest


def test_gc_by_age_and_by_size(store: ResultStore) -> None:
    for i in range(4):
        store.put(f"g-{i}", np.zeros(1000 * (i + 1), dtype=np.uint8))
    entries = store.ls()
    created = {e.key: e.created for e in entries}
    sizes = {e.key: e.nbytes for e in entries}
    now = max(created.values())

    dry = store.gc(max_bytes=sizes["g-3"] + sizes["g-2"], dry_run=True, now=now)
    assert dry.removed == ("g-0", "g-1") and dry.dry_run and len(store.keys()) == 4

    report = store.gc(older_than=3600, now=now + 1800)
    assert report.removed == ()
    report = store.gc(max_bytes=sizes["g-3"] + sizes["g-2"], now=now)
    assert report.removed == ("g-0", "g-1")
    assert report.freed_bytes == sizes["g-0"] + sizes["g-1"]
    assert store.keys() == ["g-2", "g-3"]
    report = store.gc(older_than=3600, now=now + 7200)
    assert set(report.removed) == {"g-2", "g-3"} and store.keys() == []
    assert payload_files(store, "g-3") == []


def test_store_pickles_as_its_url(store: ResultStore) -> None:
    store.put("p-1", 42)
    copy = pickle.loads(pickle.dumps(store))
    assert copy == store and copy.get("p-1") == 42
    assert len(pickle.dumps(store)) < 500


def test_default_store_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dask

    monkeypatch.delenv("DASKJOBS_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_store_url() == os.path.join(str(tmp_path), ".daskjobs-cache")
    with dask.config.set({"daskjobs.store": "memory://configured"}):
        assert default_store_url() == "memory://configured"
        monkeypatch.setenv("DASKJOBS_STORE", str(tmp_path / "env"))
        assert ResultStore().url == str(tmp_path / "env")


def test_invalid_keys_are_rejected(store: ResultStore) -> None:
    for bad in ["", "../x", "a/b", ".hidden"]:
        with pytest.raises(ValueError, match="not a valid store key"):
            store.put(bad, 1)


def test_manifest_is_json_with_the_documented_fields(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.put("m-1", [1, 2], stage="m", params={"a": (1, 2)}, code_hash="abc")
    manifest = json.loads((Path(store.root) / "entries" / "m-1.json").read_text())
    assert {
        "key",
        "stage",
        "params",
        "code_hash",
        "compute_seconds",
        "nbytes",
        "created",
        "writer",
        "checksum",
        "payload",
    } <= set(manifest)
    assert manifest["params"] == {"a": [1, 2]}


# -- faults: huge sizes, looks that must not touch, read-only stores --------------------------


def _edit_manifest(store: ResultStore, key: str, **fields: object) -> None:
    path = f"{store.root}/entries/{key}.json"
    data = json.loads(store.fs.cat_file(path))
    data.update(fields)
    store.fs.pipe_file(path, json.dumps(data).encode())


@pytest.mark.parametrize("nbytes", [10**15, 2**62, -5])
def test_absurd_size_in_a_manifest_is_corruption_not_an_allocation(
    store: ResultStore, nbytes: int
) -> None:
    store.put("huge-1", list(range(100)))
    store.put("fine-1", "fine")
    _edit_manifest(store, "huge-1", nbytes=nbytes)
    report = store.verify(remove=False)  # MemoryError before the fix
    assert report.corrupt == ("huge-1",) and report.ok == ("fine-1",)
    with pytest.raises(CorruptEntryError):
        store.get("huge-1")
    assert store.get("fine-1") == "fine"


def test_a_payload_path_outside_the_entry_is_corrupt_and_never_read(
    tmp_path: Path,
) -> None:
    store = ResultStore(tmp_path / "store")
    store.put("esc-1", 1)
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"not yours")
    _edit_manifest(store, "esc-1", payload="../../outside.bin", nbytes=9)
    with pytest.raises(CorruptEntryError):
        store.get("esc-1")
    assert secret.read_bytes() == b"not yours"  # removing the entry left it alone


def test_looking_never_changes_the_store(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    for i in range(3):
        store.put(f"l-{i}", list(range(10 + i)))
    store.fs.pipe_file(f"{store.root}/entries/l-0.json", b'{"key": "l-0", "nb')  # unreadable
    payload = Path(store.root) / store.info("l-1").payload
    payload.write_bytes(payload.read_bytes()[:-3])  # truncated
    _edit_manifest(store, "l-2", nbytes=10**15)  # absurd
    before = snapshot(tmp_path)

    store.put("l-3", "sound")
    before = snapshot(tmp_path)

    # l-0: unreadable manifest; l-1 and l-2: payload not the size recorded
    assert store.scan() == (store.ls(), ["l-0", "l-1", "l-2"])
    assert [e.key for e in store.ls()] == ["l-3"]
    with pytest.raises(CorruptEntryError):
        store.info("l-0")
    dry = store.gc(older_than=0, max_bytes=0, dry_run=True, now=time.time() + 10 * 3600)
    assert dry.removed == ("l-3",) and dry.dry_run
    assert set(store.verify(remove=False).corrupt) == {"l-0", "l-1", "l-2"}
    assert snapshot(tmp_path) == before


def test_gc_by_size_is_not_fooled_by_a_manifest_claiming_a_huge_size(store: ResultStore) -> None:
    for i in range(4):
        store.put(f"s-{i}", np.zeros(1000, dtype=np.uint8))
        time.sleep(0.01)  # distinct creation times: s-0 is the oldest
    budget = 3 * store.info("s-0").nbytes  # room for the three sound entries
    _edit_manifest(store, "s-3", nbytes=10**15)  # the newest claims a petabyte
    report = store.gc(max_bytes=budget, dry_run=True)
    assert report.removed == () and report.kept == 3  # nothing sound is pushed out
    assert [e.key for e in store.ls()] == ["s-0", "s-1", "s-2"]


def test_a_corrupt_entry_in_a_read_only_store_is_a_miss_left_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ResultStore(tmp_path / "store")
    store.put("ro-1", np.arange(1000))
    store.put("ro-2", "sound")
    payload = Path(store.root) / store.info("ro-1").payload
    data = bytearray(payload.read_bytes())
    data[-1] ^= 0xFF
    payload.write_bytes(bytes(data))
    before = snapshot(tmp_path)
    with read_only(tmp_path / "store"), caplog.at_level(logging.WARNING, "daskjobs.cache"):
        with pytest.raises(CorruptEntryError):  # a miss, not a PermissionError
            store.get("ro-1")
        assert store.get("ro-2") == "sound"
        assert "could not remove corrupt entry ro-1" in caplog.text
        report = store.verify()
        assert report.corrupt == ("ro-1",) and set(report.not_removed) == {"ro-1"}
        with pytest.raises(StoreAccessError, match=r"cannot remove entries from .*store"):
            store.gc(older_than=0)
        with pytest.raises(StoreAccessError, match=r"cannot write to .*store"):
            store.put("ro-3", 3)
    assert snapshot(tmp_path) == before


def test_removing_an_entry_spares_a_new_payload_of_the_same_key(tmp_path: Path) -> None:
    """gc removing an entry while a writer recomputes the same key must not delete the
    writer's fresh payload (the new entry would point at nothing)."""
    store = ResultStore(tmp_path / "store")
    store.put("re-1", "old")
    fresh = Path(store.root) / "data" / "re-1" / "fresh-writer.bin"
    fresh.write_bytes(b"being written")  # a concurrent writer's payload, not committed yet
    assert store.delete("re-1") is True
    assert fresh.read_bytes() == b"being written"
    assert not store.contains("re-1")


def test_a_local_store_creates_its_files_for_the_writer_and_its_group(tmp_path):
    """Store files are 0640 (umask permitting): a team shares a store, others do not read it."""
    store = ResultStore(str(tmp_path / "store"))
    store.put("k-0640", {"x": 1}, stage="s")
    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o007 == 0 for p in files), [
        (str(p), oct(p.stat().st_mode)) for p in files
    ]
