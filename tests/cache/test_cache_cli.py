"""``daskjobs cache ls|info|gc|verify`` on a store in tmp_path.

The command line's tables (daskjobs/_text.py) too: ``cache ls``'s columns line up, and a
table of no rows is its header.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from filetree import read_only, snapshot

from daskjobs._text import table
from daskjobs.cache.store import ResultStore
from daskjobs.cli import main


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    s = ResultStore(tmp_path / "store")
    s.put("features-1", np.zeros(5000), stage="features", params={"window": 20})
    s.put("backtest-1", {"sharpe": 1.2}, stage="backtest", params={"fast": 5})
    s.put("backtest-2", {"sharpe": 0.7}, stage="backtest", params={"fast": 10})
    return s


def invoke(*args: str) -> tuple[int, str]:
    """Exit code and stdout (warnings logged to stderr stay out of the JSON)."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def test_ls_lists_entries_and_filters_by_stage(store: ResultStore) -> None:
    code, out = invoke("cache", "ls", "--store", store.url)
    assert code == 0
    assert "features-1" in out and "backtest-2" in out and "3 entries" in out
    code, out = invoke("cache", "ls", "--store", store.url, "--stage", "backtest", "--json")
    data = json.loads(out)
    assert code == 0 and sorted(e["key"] for e in data["entries"]) == ["backtest-1", "backtest-2"]
    assert data["entries"][0]["params"]["fast"] in (5, 10)


def test_ls_uses_the_environment_store(store: ResultStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASKJOBS_STORE", store.url)
    code, out = invoke("cache", "ls", "--json")
    assert code == 0 and len(json.loads(out)["entries"]) == 3


def test_a_table_of_zero_rows_is_its_header():
    assert table(["a", "bb"], []).splitlines() == ["a  bb", "-  --"]


def test_cache_ls_columns_line_up(tmp_path):
    from daskjobs.cache.store import ResultStore

    store = ResultStore(str(tmp_path / "store"))
    store.put("k-short", 1, stage="s")
    store.put("k-" + "x" * 70, list(range(1000)), stage="a-rather-long-stage-name-indeed")
    result = CliRunner().invoke(main, ["cache", "ls", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = lines[0]
    rows = [ln for ln in lines if ln.startswith("k-")]
    assert header.startswith("key") and len(rows) == 2
    for word in ("stage", "writer"):  # left-aligned: every row's cell starts there
        col = header.index(f" {word}") + 1
        assert all(r[col - 1] == " " and r[col] != " " for r in rows), (word, lines)
    for word in ("size", "age", "compute"):  # right-aligned: every row's cell ends there
        end = header.index(f" {word}") + len(word)
        assert all(r[end] != " " and r[end + 1] == " " for r in rows), (word, lines)


def test_info_prints_the_manifest(store: ResultStore) -> None:
    code, out = invoke("cache", "info", "features-1", "--store", store.url)
    manifest = json.loads(out)
    assert code == 0 and manifest["stage"] == "features" and manifest["params"] == {"window": 20}
    code, out = (
        CliRunner().invoke(main, ["cache", "info", "nope", "--store", store.url]).exit_code,
        "",
    )
    assert code == 1


def test_verify_reports_and_removes_corrupt_entries(store: ResultStore) -> None:
    path = Path(store.root) / store.info("backtest-1").payload
    path.write_bytes(path.read_bytes()[:-5])
    code, out = invoke("cache", "verify", "--store", store.url, "--keep")
    assert code == 1 and "corrupt: backtest-1 (kept)" in out and store.contains("backtest-1")
    code, out = invoke("cache", "verify", "--store", store.url, "--json")
    report = json.loads(out)
    assert code == 1 and report["corrupt"] == ["backtest-1"] and report["ok"] == 2
    assert report["checked"] == 3 and "ok_keys" not in report
    assert not store.contains("backtest-1")
    code, out = invoke("cache", "verify", "--store", store.url)
    assert code == 0 and "2 entries ok, 0 corrupt" in out


def test_gc_by_size_and_age(store: ResultStore) -> None:
    sizes = {e.key: e.nbytes for e in store.ls()}
    limit = str(sizes["backtest-1"] + sizes["backtest-2"])
    code, out = invoke(
        "cache", "gc", "--store", store.url, "--max-size", limit, "--dry-run", "--verbose"
    )
    assert code == 0 and f"would remove features-1: oldest, to bring the store under {limit}" in out
    assert "would remove 1 entry " in out and len(store.keys()) == 3
    # Make features-1 old, then collect by age.
    manifest = Path(store.root) / "entries" / "features-1.json"
    data = json.loads(manifest.read_text())
    data["created"] = time.time() - 3 * 86400
    manifest.write_text(json.dumps(data))
    code, out = invoke("cache", "gc", "--store", store.url, "--older-than", "2d", "--json")
    report = json.loads(out)
    assert code == 0 and report["removed"] == ["features-1"] and report["kept"] == 2
    assert store.keys() == ["backtest-1", "backtest-2"]


def test_gc_rejects_bad_values(store: ResultStore) -> None:
    result = CliRunner().invoke(main, ["cache", "gc", "--store", store.url, "--older-than", "soon"])
    assert result.exit_code == 2 and "not a duration" in result.output
    result = CliRunner().invoke(main, ["cache", "gc", "--store", store.url, "--max-size", "big"])
    assert result.exit_code == 2 and "not a size" in result.output


def test_cache_help_does_not_import_dask(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from daskjobs.cache.cli import cache; "
        "print(any(m == 'dask' or m.startswith('dask.') for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == "False"


# -- faults: looks that must not touch, bad paths, read-only stores ---------------------------


def _corrupt(store: ResultStore) -> None:
    """An unreadable manifest (features-1) and a truncated payload (backtest-1)."""
    (Path(store.root) / "entries" / "features-1.json").write_text('{"key": "features-1", "nb')
    path = Path(store.root) / store.info("backtest-1").payload
    path.write_bytes(path.read_bytes()[:-5])


def test_ls_and_gc_dry_run_never_change_the_store(store: ResultStore, tmp_path: Path) -> None:
    _corrupt(store)
    before = snapshot(tmp_path)
    code, out = invoke("cache", "ls", "--store", store.url)
    assert code == 0 and "backtest-2" in out
    assert "2 entries look corrupt" in out and "daskjobs cache verify" in out
    code, out = invoke("cache", "ls", "--store", store.url, "--json")
    assert code == 0 and json.loads(out)["corrupt"] == ["backtest-1", "features-1"]
    assert [e["key"] for e in json.loads(out)["entries"]] == ["backtest-2"]
    code, out = invoke(
        "cache", "gc", "--store", store.url, "--older-than", "0", "--dry-run", "--json"
    )
    assert code == 0 and json.loads(out)["removed"] == ["backtest-2"]
    code, out = invoke("cache", "verify", "--store", store.url, "--keep")
    assert code == 1 and "corrupt: features-1 (kept)" in out
    assert snapshot(tmp_path) == before


def run_cli(*args: str) -> tuple[int, str]:
    """Exit code and all output; an uncaught exception (a traceback) fails the test."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [["ls"], ["info", "k-1"], ["gc"], ["verify"]])
def test_a_store_path_that_is_a_file_or_missing_is_a_clear_error(
    tmp_path: Path, command: list[str]
) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("not a store")
    code, out = run_cli("cache", *command, "--store", str(afile))
    assert code == 1 and f"{afile} is a file, not a store directory" in out
    missing = tmp_path / "no-such-store"
    code, out = run_cli("cache", *command, "--store", str(missing))
    assert code == 1 and f"no store at {missing}: the directory does not exist" in out
    assert not missing.exists()


def test_a_read_only_store_is_listed_and_refuses_removal_clearly(
    store: ResultStore, tmp_path: Path
) -> None:
    path = Path(store.root) / store.info("backtest-1").payload
    path.write_bytes(path.read_bytes()[:-5])
    before = snapshot(tmp_path)
    with read_only(tmp_path / "store"):
        code, out = run_cli("cache", "ls", "--store", store.url)
        assert code == 0 and "2 entries" in out and "1 entry looks corrupt" in out
        code, out = run_cli("cache", "verify", "--store", store.url)
        assert code == 1 and "corrupt: backtest-1 (could not remove:" in out
        code, out = run_cli("cache", "gc", "--store", store.url, "--older-than", "0")
        assert code == 1 and "cannot remove entries from" in out and "read-only" in out
        code, out = run_cli("cache", "gc", "--store", store.url, "--older-than", "0", "--dry-run")
        assert code == 0 and "would remove 2 entries" in out and "  2 older than 0" in out
    assert snapshot(tmp_path) == before


# -- many entries: counts, not one line each ---------------------------------------------------


@pytest.fixture
def big_store(tmp_path: Path) -> ResultStore:
    s = ResultStore(tmp_path / "big")
    for i in range(300):
        s.put(f"backtest-{i:04d}", {"sharpe": i}, stage="backtest", params={"i": i})
    manifest = Path(s.root) / "entries"
    for i in range(200):  # two thirds are old
        path = manifest / f"backtest-{i:04d}.json"
        data = json.loads(path.read_text())
        data["created"] = time.time() - 40 * 86400
        path.write_text(json.dumps(data))
    return s


def test_gc_summarises_what_it_removes_and_lists_it_on_request(big_store: ResultStore) -> None:
    url = big_store.url
    size = sum(e.nbytes for e in big_store.ls()[250:])  # keeps the newest 50
    args = ["cache", "gc", "--store", url, "--older-than", "30d", "--max-size", str(size)]
    code, out = invoke(*args, "--dry-run")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4, out  # was one line per entry: 250 and the total
    assert lines[0].startswith("would remove 250 entries (") and "kept 50 entries" in lines[0]
    assert lines[1] == "  200 older than 30d"
    assert lines[2] == f"   50 oldest, to bring the store under {size}"
    assert lines[3] == "  (--verbose lists each entry)"
    code, out = invoke(*args, "--dry-run", "--verbose")
    listed = [line for line in out.splitlines() if line.startswith("would remove backtest-")]
    assert code == 0 and len(listed) == 250
    assert "would remove backtest-0000: older than 30d" in listed
    code, out = invoke(*args)
    assert code == 0 and len(out.splitlines()) == 4 and out.startswith("removed 250 entries (")
    assert len(big_store.keys()) == 50


def test_verify_lists_the_corrupt_and_counts_the_sound(big_store: ResultStore) -> None:
    path = Path(big_store.root) / big_store.info("backtest-0007").payload
    path.write_bytes(path.read_bytes()[:-5])
    code, out = invoke("cache", "verify", "--store", big_store.url, "--keep", "--json")
    report = json.loads(out)
    assert code == 1 and report["corrupt"] == ["backtest-0007"] and report["ok"] == 299
    assert report["checked"] == 300 and "ok_keys" not in report and len(out) < 300
    assert report["removed"] is False and report["not_removed"] == {}
    code, out = invoke("cache", "verify", "--store", big_store.url, "--keep", "--json", "-v")
    assert len(json.loads(out)["ok_keys"]) == 299
    code, out = invoke("cache", "verify", "--store", big_store.url, "--keep")
    assert code == 1 and out.splitlines() == [
        "corrupt: backtest-0007 (kept)",
        f"299 entries ok, 1 corrupt in {big_store.url}",
    ]
    code, out = invoke("cache", "verify", "--store", big_store.url, "--keep", "--verbose")
    assert len(out.splitlines()) == 301
