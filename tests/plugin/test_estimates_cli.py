"""``daskjobs estimates`` (the duration models per stage, read only) and the claims
``daskjobs cache ls`` shows."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from daskjobs.cache.claims import Claims
from daskjobs.cache.store import ResultStore
from daskjobs.cli import main


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def history(tmp_path: Path) -> Path:
    rows = [[{"n": n}, 0.1 * n] for n in (1, 2, 4, 8, 1, 2, 4, 8, 16)]
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"version": 2, "stages": {"job": rows, "plain": [[{}, 1.0]]}}))
    return path


def test_per_stage_observations_within_2x_and_predictions(history: Path) -> None:
    before = history.read_bytes()
    code, out = invoke("estimates", str(history), "--json")
    assert code == 0
    report = json.loads(out)
    job = report["stages"]["job"]
    assert job["observations"] == 9 and job["parameters"] == ["n"]
    assert job["scored"] == 8  # each observation after the first, predicted from those before
    assert 0.5 <= job["within_2x"] <= 1.0
    preds = job["predictions"]
    assert [p["measured"] for p in preds] == pytest.approx([0.1, 0.4, 1.6])
    for p in preds:  # a power law in n: every prediction within 2x here
        assert 0.5 <= p["predicted"] / p["measured"] <= 2.0
        assert p["band"][0] <= p["predicted"] <= p["band"][1]
        assert p["source"] == "model"
    assert report["stages"]["plain"]["predictions"][0]["source"] == "history"
    code, text = invoke("estimates", str(history))
    assert code == 0 and "job" in text and "within 2x" in text and "predicted" in text
    assert history.read_bytes() == before  # read only


def test_a_version_one_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"version": 1, "stages": {"s": [1.0, 2.0, 3.0]}}))
    code, out = invoke("estimates", str(path), "--json")
    assert code == 0 and json.loads(out)["stages"]["s"]["median"] == pytest.approx(2.0)


def test_a_missing_or_bad_path_is_one_line_naming_it_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "h.json"
    code, out = invoke("estimates", str(missing))
    assert code == 1 and str(missing) in out and len(out.strip().splitlines()) == 1
    assert not missing.parent.exists()
    code, out = invoke("estimates", str(tmp_path))
    assert code == 1 and "is a directory" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    code, out = invoke("estimates", str(bad))
    assert code == 1 and str(bad) in out and len(out.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == ["bad.json"]


def test_without_a_source_it_reads_the_configured_history(
    history: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dask

    with dask.config.set({"daskjobs.history.path": str(history)}):
        code, out = invoke("estimates", "--json")
    assert code == 0 and json.loads(out)["history"] == str(history)
    with dask.config.set({"daskjobs.history.path": None}):
        code, out = invoke("estimates")
    assert code == 1 and "daskjobs.history.path" in out


def test_cache_ls_shows_claims_with_owner_state_and_expiry(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    store.put("done-1", 1, stage="done")
    held = Claims(store, lease=600).try_claim("features-1")
    assert held is not None
    gone = Claims(store, lease=0.01).try_claim("features-2")
    assert gone is not None
    time.sleep(0.05)
    code, out = invoke("cache", "ls", "--store", str(tmp_path / "store"), "--json")
    assert code == 0
    claims = {c["key"]: c for c in json.loads(out)["claims"]}
    assert claims["features-1"]["state"] == "live" and claims["features-1"]["token"] == 1
    assert claims["features-2"]["state"] == "expired"
    assert claims["features-1"]["owner"] == held.info.owner
    assert claims["features-1"]["expires"] > time.time() + 500
    code, text = invoke("cache", "ls", "--store", str(tmp_path / "store"))
    assert code == 0 and "1 live" in text and "features-1" in text and "expired" in text
    held.release(committed=False)
    code, out = invoke("cache", "ls", "--store", str(tmp_path / "store"), "--json")
    states = {c["key"]: c["state"] for c in json.loads(out)["claims"]}
    assert states.get("features-1", "released") == "released"
