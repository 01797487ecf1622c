"""Cache controls: a forced recompute (``refresh``), parameters left out of the key
(``ignore``), an expiry (``max_age``) honoured at lookup and by ``cache gc``, and ``cache ls``
showing and filtering entries by their parameters."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from distributed import Client, LocalCluster

from daskjobs import Sweep, grid, run
from daskjobs.cache.store import EntryInfo, ResultStore
from daskjobs.cli import main


class Calls:
    """Counts stage calls (an object, so the stages' code hash does not depend on its state)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def hit(self, name: str) -> None:
        with self.lock:
            self.counts[name] += 1

    def snapshot(self) -> Counter[str]:
        with self.lock:
            return Counter(self.counts)


CALLS = Calls()


def prices(slice: int) -> list[float]:
    CALLS.hit("prices")
    return [float(slice + i) for i in range(10)]


def features(prices: list[float], window: int = 3, verbose: bool = False, log: Any = None) -> float:
    CALLS.hit("features")
    return sum(prices[:window]) / window


def backtest(features: float, fast: int) -> float:
    CALLS.hit("backtest")
    return features * fast


def fit(seed: int, threads: int) -> int:
    CALLS.hit("fit")
    return seed * 10


def build(
    *,
    verbose: bool = False,
    ignore: tuple[str, ...] = (),
    prices_max_age: Any = None,
    features_max_age: Any = None,
    features_refresh: bool = False,
) -> Sweep:
    """prices (2 slices) -> features (one per slice) -> backtest (2 per slice): 2 + 2 + 4."""
    sweep = Sweep("controls")
    p = sweep.stage(prices, over=grid(slice=[0, 1]), max_age=prices_max_age)
    f = sweep.stage(
        features,
        inputs={"prices": p},
        params={"window": 3, "verbose": verbose},
        ignore=ignore,
        max_age=features_max_age,
        refresh=features_refresh,
    )
    sweep.stage(backtest, inputs={"features": f}, over=grid(fast=[2, 5]))
    return sweep


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(autouse=True)
def _idle_scheduler(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests share a cluster and content keys: a key still in the cluster's memory would be
    reused by dask as it is, so each test waits for the previous one's to go."""
    yield
    if "client" in request.fixturenames:
        _wait_idle(request.getfixturevalue("client"))


def _wait_idle(client: Client) -> None:
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
        assert time.monotonic() < deadline, "the scheduler kept tasks after the run"
        time.sleep(0.02)


def runs(client: Client, sweep: Sweep, store: ResultStore, **kwargs: Any) -> Any:
    """Run ``sweep`` once the previous run's keys are gone from the cluster; its result and the
    stage calls it made."""
    _wait_idle(client)
    before = CALLS.snapshot()
    result = sweep.run(client, store=store, progress=False, **kwargs)
    assert result.ok, result.summary()
    return result, CALLS.snapshot() - before


def age(store: ResultStore, key: str, seconds: float) -> None:
    """Make ``key``'s entry look written ``seconds`` ago (its manifest's recorded time)."""
    path = Path(store.root) / "entries" / f"{key}.json"
    data = json.loads(path.read_text())
    data["created"] = time.time() - seconds
    path.write_text(json.dumps(data))


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


# -- refresh: a forced recompute ----------------------------------------------------------------


def test_refresh_one_stage_recomputes_it_and_what_reads_it(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    first, calls = runs(client, build(), store)
    assert calls == {"prices": 2, "features": 2, "backtest": 4} and first.replaced == {}
    sweep = build()
    before = {e.key: e for e in store.ls()}

    second, calls = runs(client, sweep, store, refresh="features")
    # the refreshed stage again, and the backtests built from it (same keys: their entries
    # would otherwise hide the new features); prices are loaded as the features' input
    assert calls == {"features": 2, "backtest": 4}
    assert second.computed == 6 and second.hits == 2
    assert second.replaced == {"features": {"refresh": 2}, "backtest": {"input": 4}}
    assert "features: computed 2, loaded 0; recomputed 2 (refresh)" in second.summary()
    assert "recomputed 4 (an input was recomputed)" in second.summary()
    after = {e.key: e for e in store.ls()}
    assert after.keys() == before.keys()  # overwritten in place: same keys, one entry each
    for key in sweep.stages["features"].keys + sweep.stages["backtest"].keys:
        assert (
            after[key].payload != before[key].payload and after[key].created > before[key].created
        )
    for key in sweep.stages["prices"].keys:
        assert after[key] == before[key]

    third, calls = runs(client, build(), store)
    assert calls == {} and third.hits == 4 and third.replaced == {}


def test_refresh_right_after_a_run_recomputes(client: Client, tmp_path: Path) -> None:
    """The previous run's results are released on the client's loop after it returned;
    a refresh submitted at once still recomputes (dask would hand back what it holds)."""
    store = ResultStore(tmp_path / "store")
    _wait_idle(client)
    before = CALLS.snapshot()
    build().run(client, store=store, progress=False)
    again = build().run(client, store=store, progress=False, refresh="backtest")
    assert CALLS.snapshot() - before == {"prices": 2, "features": 2, "backtest": 8}
    assert again.replaced == {"backtest": {"refresh": 4}}


def test_refresh_of_results_the_caller_holds_is_refused(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    runs(client, build(), store)
    _wait_idle(client)
    plan = build().to_dask(store=store)
    held = client.get(plan.graph, plan.keys, sync=False)  # the backtests, in memory
    client.gather(held)
    with pytest.raises(ValueError, match=r"4 of the results this run would recompute .* held"):
        build().run(client, store=store, progress=False, refresh="backtest")
    del held


def test_refresh_true_and_stage_objects(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    runs(client, build(), store)
    everything, calls = runs(client, build(), store, refresh=True)
    assert calls == {"prices": 2, "features": 2, "backtest": 4}
    assert everything.replaced == {
        "prices": {"refresh": 2},
        "features": {"refresh": 2},
        "backtest": {"refresh": 4},
    }
    sweep = build()
    _, calls = runs(client, sweep, store, refresh=[sweep.stages["backtest"]])
    assert calls == {"backtest": 4}


def test_refresh_on_a_first_run_is_no_recompute(client: Client, tmp_path: Path) -> None:
    result, calls = runs(client, build(), ResultStore(tmp_path / "store"), refresh=True)
    assert calls == {"prices": 2, "features": 2, "backtest": 4} and result.replaced == {}
    assert "recomputed" not in result.summary()


def test_a_stage_declared_refresh_recomputes_every_run(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    runs(client, build(features_refresh=True), store)
    again, calls = runs(client, build(features_refresh=True), store)
    assert calls == {"features": 2, "backtest": 4}
    assert again.replaced == {"features": {"refresh": 2}, "backtest": {"input": 4}}


def test_refresh_is_planned_without_a_cluster(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    sweep = build()
    for key in sweep.stages["features"].keys:
        store.put(key, 1.0, stage="features")
    plan = sweep.to_dask(store=store)
    assert set(plan.loaded) == set(sweep.stages["features"].keys) and plan.replace == {}
    plan = sweep.to_dask(store=store, refresh=["features"])
    assert plan.replace == dict.fromkeys(sweep.stages["features"].keys, "refresh")
    assert not plan.loaded and len(plan.computed) == 8  # prices are not stored here


def test_an_unknown_stage_to_refresh_is_refused_before_anything_runs(
    client: Client, tmp_path: Path
) -> None:
    store = ResultStore(tmp_path / "store")
    before = CALLS.snapshot()
    with pytest.raises(ValueError, match=r"refresh names stage 'featurs'.*did you mean 'features'"):
        build().run(client, store=store, progress=False, refresh="featurs")
    other = Sweep("other")
    stranger = other.stage(prices, over=grid(slice=[7]))
    with pytest.raises(ValueError, match=r"not a stage of sweep 'controls'"):
        build().to_dask(store=store, refresh=[stranger])
    with pytest.raises(TypeError, match=r"refresh= takes True, a stage name"):
        build().to_dask(store=store, refresh=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pass refresh= to .*to_dask"):
        run(build().to_dask(store=store), client, progress=False, refresh=True)
    assert CALLS.snapshot() == before and store.keys() == []


# -- the overwrite is atomic --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "memory"])
def test_replace_overwrites_atomically(tmp_path: Path, where: str) -> None:
    url = str(tmp_path / "store") if where == "local" else f"memory://replace-{tmp_path.name}"
    store = ResultStore(url)
    assert store.put("k-1", [0] * 1000, stage="s")
    assert not store.put("k-1", [9] * 1000, stage="s")  # the first writer wins...
    problems: list[str] = []
    stop = threading.Event()

    def read() -> None:
        reader = ResultStore(url)
        while not stop.is_set():
            try:
                value = reader.get("k-1")
            except Exception as err:  # a reader must never see a missing or partial entry
                problems.append(repr(err))
                return
            if len(set(value)) != 1 or len(value) != 1000:
                problems.append(f"a mixed value: {sorted(set(value))}")
                return

    # memory:// hands every reader of a file the same file object, one cursor for all: one
    # reader there (the writer never touches a payload a manifest names)
    readers = [threading.Thread(target=read) for _ in range(3 if where == "local" else 1)]
    for t in readers:
        t.start()
    try:
        for i in range(1, 40):  # ...unless it replaces, and then the last one is visible
            assert store.put("k-1", [i] * 1000, stage="s", replace=True)
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not problems, problems
    assert store.get("k-1") == [39] * 1000 and store.keys() == ["k-1"]
    # the replaced payloads stay for readers that hold the old manifest, until gc's grace
    assert store.gc().orphans == 0 and store.get("k-1") == [39] * 1000
    report = store.gc(now=time.time() + 2 * 3600)
    assert report.orphans >= 1 and report.removed == () and store.get("k-1") == [39] * 1000


# -- ignore: parameters left out of the key -----------------------------------------------------


def test_an_ignored_parameter_does_not_change_the_key(client: Client, tmp_path: Path) -> None:
    quiet, loud = build(ignore=("verbose",)), build(verbose=True, ignore=("verbose",))
    assert quiet.stages["features"].keys == loud.stages["features"].keys
    assert quiet.stages["backtest"].keys == loud.stages["backtest"].keys
    # not ignored, it is a parameter like any other
    assert set(build().stages["features"].keys).isdisjoint(
        build(verbose=True).stages["features"].keys
    )

    store = ResultStore(tmp_path / "store")
    runs(client, quiet, store)
    second, calls = runs(client, loud, store)
    assert calls == {} and second.hits == 4 and second.computed == 0
    # the entry records what it was computed with, and which parameters the key left out
    entry = store.info(quiet.stages["features"].keys[0])
    assert entry.params["verbose"] is False and entry.params["window"] == 3
    assert entry.ignored == ("verbose",)


def test_an_ignored_parameter_needs_no_token(tmp_path: Path) -> None:
    lock = threading.Lock()  # no deterministic token: an error unless it is ignored
    sweep = Sweep("logs")
    sweep.stage(features, params={"prices": [1.0, 2.0, 3.0], "log": lock}, ignore=["log"])
    with pytest.raises(TypeError, match="parameter 'log' of stage 'features'"):
        Sweep("logs").stage(features, params={"prices": [1.0, 2.0, 3.0], "log": lock})


def test_an_ignored_swept_parameter_is_a_label_unless_asked(client: Client, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"differ only in the ignored parameter 'threads'"):
        Sweep("fit").stage(fit, over=grid(seed=[1, 2], threads=[1, 8]), ignore=("threads",))
    sweep = Sweep("fit")
    stage = sweep.stage(
        fit, over=grid(seed=[1, 2], threads=[1, 8]), ignore=("threads",), ignore_labels=True
    )
    assert [dict(n.labels) for n in stage.nodes] == [{"seed": 1}, {"seed": 2}]
    assert [n.params["threads"] for n in stage.nodes] == [1, 1]  # the first point's value runs
    # a swept ignored parameter with one value per key stays a label
    kept = Sweep("fit").stage(fit, over=grid(seed=[1, 2], threads=[4]), ignore=("threads",))
    assert [dict(n.labels) for n in kept.nodes] == [
        {"seed": 1, "threads": 4},
        {"seed": 2, "threads": 4},
    ]
    # the entry of a stage with ignore_labels records neither the value nor the label
    result, calls = runs(client, sweep, ResultStore(tmp_path / "store"))
    assert calls == {"fit": 2} and [r["seed"] for r in result.records] == [1, 2]
    assert all("threads" not in r for r in result.records)
    entries = ResultStore(tmp_path / "store").ls()
    assert [e.params for e in entries if e.stage == "fit"] and all(
        "threads" not in e.params and e.ignored == ("threads",) for e in entries
    )


def test_bad_ignore_is_refused_at_declaration() -> None:
    sweep = Sweep("bad")
    p = sweep.stage(prices, over=grid(slice=[0]))
    with pytest.raises(
        ValueError,
        match=r"names 'verbos', which features\(\) does not take.*did you mean 'verbose'",
    ):
        sweep.stage(features, inputs={"prices": p}, ignore=("verbos",))
    with pytest.raises(ValueError, match=r"'prices' is an input"):
        sweep.stage(features, inputs={"prices": p}, ignore=("prices",))
    with pytest.raises(TypeError, match=r"ignore= takes parameter names"):
        sweep.stage(features, inputs={"prices": p}, ignore="verbose")  # type: ignore[arg-type]

    def anything(**kwargs: Any) -> int:
        return 1

    with pytest.raises(ValueError, match=r"ignore= names 'debug', which is not a parameter"):
        sweep.stage(anything, params={"a": 1}, ignore=("debug",))
    sweep.stage(anything, params={"a": 1, "debug": True}, ignore=("debug",))
    assert "features" not in sweep.stages  # nothing half-declared


# -- max_age: an expiry ---------------------------------------------------------------------------


def test_an_expired_entry_is_recomputed_then_collected(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    sweep = build(features_max_age="1h")
    runs(client, sweep, store)
    fkeys = sweep.stages["features"].keys
    assert all(store.info(k).max_age == 3600 for k in fkeys)
    assert store.info(sweep.stages["prices"].keys[0]).max_age is None

    young, calls = runs(client, build(features_max_age="1h"), store)
    assert calls == {} and young.replaced == {}

    age(store, fkeys[0], 2 * 3600)  # one of the two features is now too old
    old, calls = runs(client, build(features_max_age="1h"), store)
    # the stale feature again, with its prices as input and the two backtests it feeds
    assert calls == {"features": 1, "backtest": 2}
    assert old.replaced == {"features": {"expired": 1}, "backtest": {"input": 2}}
    assert "recomputed 1 (expired)" in old.summary()
    assert time.time() - store.info(fkeys[0]).created < 3600  # overwritten: fresh again

    # cache gc collects what expired, by the max_age the entry recorded, and says so
    age(store, fkeys[1], 2 * 3600)
    code, out = invoke("cache", "gc", "--store", store.url, "--dry-run", "--verbose")
    assert code == 0 and f"would remove {fkeys[1]}: expired (max_age 1h)" in out
    assert store.contains(fkeys[1])
    code, out = invoke("cache", "gc", "--store", store.url, "--json")
    report = json.loads(out)
    assert code == 0 and report["removed"] == [fkeys[1]]
    assert report["reasons"] == {fkeys[1]: "expired (max_age 1h)"}
    assert not store.contains(fkeys[1]) and store.contains(fkeys[0]) and len(store.keys()) == 7
    code, out = invoke("cache", "gc", "--store", store.url)
    assert code == 0 and "removed 0 entries" in out


def test_expiry_of_an_upstream_stage_reaches_its_readers(client: Client, tmp_path: Path) -> None:
    """The outputs are stored, so the expired prices would never be looked at were expiry
    not followed downstream."""
    store = ResultStore(tmp_path / "store")
    sweep = build(prices_max_age=600)
    runs(client, sweep, store)
    for key in sweep.stages["prices"].keys:
        age(store, key, 700)
    result, calls = runs(client, build(prices_max_age=600), store)
    assert calls == {"prices": 2, "features": 2, "backtest": 4}
    assert result.replaced == {
        "prices": {"expired": 2},
        "features": {"input": 2},
        "backtest": {"input": 4},
    }


def test_a_shorter_max_age_applies_at_once(client: Client, tmp_path: Path) -> None:
    """Lookups use the stage's max_age as declared now, not the one the entry recorded."""
    store = ResultStore(tmp_path / "store")
    runs(client, build(), store)  # written without an expiry
    for key in build().stages["features"].keys:
        age(store, key, 120)
    result, calls = runs(client, build(features_max_age="1 minute"), store)
    assert calls == {"features": 2, "backtest": 4} and result.replaced["features"] == {"expired": 2}


@pytest.mark.parametrize(
    ("value", "problem"),
    [(-5, "-5"), ("soon", "'soon'"), (0, "0"), (True, "True"), ("-1h", "'-1h'")],
)
def test_a_bad_max_age_is_refused_at_declaration(value: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=rf"max_age of stage 'prices' must be .*got {problem}"):
        Sweep("bad").stage(prices, over=grid(slice=[0]), max_age=value)


# -- the store's metadata -----------------------------------------------------------------------


def test_store_records_expiry_and_old_manifests_stay_readable(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    store.put("a-1", 1, stage="a", params={"x": 1}, max_age=60, ignored=("v",))
    info = store.info("a-1")
    assert info.max_age == 60 and info.ignored == ("v",) and info.expires == info.created + 60
    assert not info.expired(info.created + 59) and info.expired(info.created + 61)
    # a manifest written before these fields existed
    store.put("b-1", 2, stage="b", params={"x": 2})
    path = Path(store.root) / "entries" / "b-1.json"
    data = json.loads(path.read_text())
    for name in ("ignored", "max_age"):
        data.pop(name, None)
    path.write_text(json.dumps(data))
    old = store.info("b-1")
    assert old.ignored == () and old.max_age is None and old.expires is None
    assert not old.expired(time.time() + 10**9) and store.get("b-1") == 2
    assert EntryInfo.from_json(old.to_json()) == old
    with pytest.raises(ValueError, match="max_age"):
        store.put("c-1", 3, max_age=-1)
    # gc: only what expired, by the recorded max_age
    report = store.gc(now=time.time() + 120, dry_run=True)
    assert report.removed == ("a-1",) and report.reasons == {"a-1": "expired (max_age 1m)"}


# -- cache ls: each entry's parameters ----------------------------------------------------------


@pytest.fixture
def listed(tmp_path: Path) -> ResultStore:
    s = ResultStore(tmp_path / "store")
    s.put("features-1", 1, stage="features", params={"slice": 0, "window": 20})
    s.put("features-2", 2, stage="features", params={"slice": 1, "window": 20})
    s.put("backtest-1", 3, stage="backtest", params={"slice": 0, "fast": 5, "name": "ma"})
    s.put("backtest-2", 4, stage="backtest", params={"slice": 1, "fast": 5, "on": True})
    s.put("backtest-3", 5, stage="backtest", params={"windows": [5, 10], "x": 1.5})
    return s


def test_ls_shows_each_entrys_parameters(listed: ResultStore) -> None:
    code, out = invoke("cache", "ls", "--store", listed.url)
    assert code == 0 and "params" in out.splitlines()[0]
    line = next(row for row in out.splitlines() if row.startswith("backtest-1"))
    assert "fast=5 name=ma slice=0" in line  # in name order, as the manifest keeps them
    assert "windows=[5, 10] x=1.5" in out


def test_ls_filters_by_stage_and_parameter(listed: ResultStore) -> None:
    def keys(*args: str) -> list[str]:
        code, out = invoke("cache", "ls", "--store", listed.url, "--json", *args)
        assert code == 0
        return sorted(e["key"] for e in json.loads(out)["entries"])

    assert keys("--param", "slice=0") == ["backtest-1", "features-1"]
    assert keys("--param", "slice=0", "--stage", "features") == ["features-1"]
    assert keys("--param", "slice=1", "--param", "fast=5") == ["backtest-2"]
    assert keys("--param", "name=ma") == ["backtest-1"]
    assert keys("--param", "on=true") == keys("--param", "on=True") == ["backtest-2"]
    assert keys("--param", "windows=[5, 10]") == ["backtest-3"]
    assert keys("--param", "x=1.5") == ["backtest-3"]
    assert keys("--param", "slice=7") == [] and keys("--param", "nope=1") == []
    _, out = invoke("cache", "ls", "--store", listed.url, "--param", "slice=0")
    assert "2 entries" in out
    result = CliRunner().invoke(main, ["cache", "ls", "--store", listed.url, "--param", "slice"])
    assert result.exit_code == 2 and "NAME=VALUE" in result.output
