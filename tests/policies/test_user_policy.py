"""A user's own policy, registered from outside the package, runs unchanged in the
simulator, in a replay what-if and live in the plugin, and decides the same there.

Two example policies live in this module (as they would in a user's package): a
:class:`~daskjobs.policies.HeapPolicy` (shortest estimate first, which the plugin
turns into dask priorities) and a plain :class:`~daskjobs.policies.Policy`
(teams take turns, which the plugin runs as a "popper": it holds dask's queued
root tasks and releases the one ``pop`` chooses, slot by slot). docs/how-to/write-a-policy.md
shows the same two.

The workload: twelve independent tasks of three teams with distinct estimates, on
one thread (``worker-saturation: 1.0``: dask runs one task at a time). A first
"blocker" task holds the thread until all twelve wait, so every one of the twelve
is a decision of the policy in every driver. The registry tests (names, errors,
entry points) are at the end.
"""

from __future__ import annotations

import heapq
import importlib.metadata
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

import dask
import pytest
from click.testing import CliRunner
from conftest import VALIDATE, plugin_cluster
from repo import ROOT

import daskjobs.policies
from daskjobs.policies import HeapPolicy, NodeView, Policy, TaskView, registry

# -- the example policies (a user's code) -------------------------------------------------------


class ShortestFirst(HeapPolicy):
    """Shortest estimated task first."""

    name = "shortest-first"

    def key(self, task: TaskView) -> float:
        return task.estimate


class TeamRoundRobin(Policy):
    """Teams take turns; within a team, the shortest estimate first.

    ``order`` names the teams that come first in the rotation; others follow by
    name. Ties on the estimate go by task key, so the choice never depends on the
    order in which a driver pushed the tasks. O(T + log n) per pop for T teams.
    """

    name = "team-round-robin"

    def __init__(self, *, order: Sequence[str] = ()) -> None:
        self.order = list(order)
        self._queues: dict[str, list[tuple[float, str, TaskView]]] = {}
        self._rotation: list[str] = []
        self._last: str | None = None  # the team served last
        self._gone: set[Hashable] = set()  # discarded, dropped when they surface
        self._n = 0

    def _place(self, team: str) -> tuple[int, str]:
        return (self.order.index(team), "") if team in self.order else (len(self.order), team)

    def push(self, task: TaskView) -> None:
        q = self._queues.get(task.team)
        if q is None:
            q = self._queues[task.team] = []
            self._rotation = sorted(self._queues, key=self._place)
        heapq.heappush(q, (task.estimate, str(task.tid), task))
        self._n += 1

    def discard(self, task: TaskView) -> None:
        if task.tid not in self._gone:
            self._gone.add(task.tid)
            self._n -= 1

    def _head(self, team: str) -> TaskView | None:
        q = self._queues[team]
        while q and q[0][2].tid in self._gone:
            self._gone.discard(heapq.heappop(q)[2].tid)
        return q[0][2] if q else None

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self._n:
            return None
        teams = self._rotation
        start = teams.index(self._last) + 1 if self._last in teams else 0
        for i in range(len(teams)):
            team = teams[(start + i) % len(teams)]
            head = self._head(team)
            if head is not None and head.cores <= node.free:
                heapq.heappop(self._queues[team])
                self._last = team
                self._n -= 1
                return head
        return None

    def __len__(self) -> int:
        return self._n


# -- the workload and the expected decisions ------------------------------------------------------

KEYS = [f"t-{i}" for i in range(12)]
ESTIMATES = {k: float((5 * i) % 12 + 1) for i, k in enumerate(KEYS)}  # 1, 6, 11, 4, 9, 2, ...
TEAMS = {k: "abc"[i % 3] for i, k in enumerate(KEYS)}
ORDER_OPTION = {"order": ["c", "a"]}  # rotation c, a, then b (by name)

EXPECTED = {
    "shortest-first": sorted(KEYS, key=ESTIMATES.__getitem__),
    # c: t-5 (2), t-8 (5), t-11 (8), t-2 (11); a: t-0 (1), t-3, t-6, t-9; b: t-10 (3), t-1, t-4, t-7
    "team-round-robin": [
        *("t-5", "t-0", "t-10"),
        *("t-8", "t-3", "t-1"),
        *("t-11", "t-6", "t-4"),
        *("t-2", "t-9", "t-7"),
    ],
}
OPTIONS: dict[str, dict[str, Any]] = {"shortest-first": {}, "team-round-robin": ORDER_OPTION}


@pytest.fixture
def user_policies() -> Iterator[None]:
    """Both example policies registered, as a user's package would; removed afterwards."""
    registry.register("shortest-first", ShortestFirst)
    daskjobs.policies.register("team-round-robin", TeamRoundRobin, description="teams in turn")
    try:
        yield
    finally:
        registry.unregister("shortest-first")
        registry.unregister("team-round-robin")


def started_order(schedule: Any) -> list[Hashable]:
    firsts = sorted(schedule.attempts, key=lambda a: (a.start, str(a.task.tid)))
    return [a.task.tid for a in firsts if a.task.tid != "blocker"]


def simulated(name: str, **options: Any) -> list[Hashable]:
    from daskjobs.sim import Cluster, Task, simulate

    tasks = [Task("blocker", 1.0)]
    tasks += [Task(k, 0.01, estimate=ESTIMATES[k], team=TEAMS[k], submit=0.5) for k in KEYS]
    return started_order(
        simulate(tasks, Cluster(1, 1), daskjobs.policies.make_policy(name, **options))
    )


GATE = threading.Event()
STARTED: list[str] = []


def blocker() -> str:
    STARTED.append("blocker")
    assert GATE.wait(60), "the blocker was never released"
    time.sleep(0.05)  # the twelve were submitted well before it ends, in replay too
    return "blocker"


def work(key: str) -> str:
    STARTED.append(key)
    time.sleep(0.005)
    return key


def _wait(predicate: Any, what: str) -> None:
    deadline = time.time() + 30
    while not predicate():
        assert time.time() < deadline, what
        time.sleep(0.005)


def live(policy: str, record: Path, **overrides: Any) -> list[str]:
    """Run the workload on one thread under ``JobsPlugin(policy=...)``; the start order."""
    from distributed import Client

    from daskjobs.plugin import JobsPlugin
    from daskjobs.plugin.client import status

    GATE.clear()
    STARTED.clear()
    plugin = JobsPlugin(policy=policy, record=str(record), **overrides)
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(config), plugin_cluster(plugin) as cl, Client(cl) as c:
        first = c.submit(blocker, key="blocker", pure=False)
        _wait(lambda: STARTED == ["blocker"], "the blocker did not start")
        parts = []
        for k in KEYS:
            with dask.annotate(estimate=ESTIMATES[k], team=TEAMS[k]):
                parts.append(dask.delayed(work)(k, dask_key_name=k))
        futures = c.compute(parts)
        queued = lambda: c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.queued))  # noqa: E731
        _wait(lambda: queued() == len(KEYS), "the twelve were not all queued")
        GATE.set()
        assert c.gather(futures) == KEYS and first.result() == "blocker"
        assert status(c)["errors"] == {}
    assert STARTED[0] == "blocker"
    return STARTED[1:]


@pytest.fixture(scope="module")
def fifo_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workload recorded live under plain fifo: the what-ifs below replay it."""
    path = tmp_path_factory.mktemp("user-policy") / "fifo.jsonl"
    assert sorted(live("fifo", path)) == sorted(KEYS)
    return path


# -- one policy, three drivers, the same decisions ------------------------------------------------


@pytest.mark.parametrize("name", ["shortest-first", "team-round-robin"])
def test_a_user_policy_decides_the_same_in_simulate_replay_and_live(
    name: str, user_policies: None, fifo_trace: Path, tmp_path: Path
) -> None:
    from daskjobs.replay import load, replay

    options = OPTIONS[name]
    expected = EXPECTED[name]
    # (a) the simulator
    assert simulated(name, **options) == expected
    # (b) a what-if of a run recorded under fifo
    what_if = replay(load(fifo_trace), name, options=options)
    assert what_if.policy == name
    assert started_order(what_if.schedule) == expected
    # (c) live, with the options from the plugin's settings
    trace = tmp_path / "live.jsonl"
    assert live(name, trace, policy_options=options) == expected
    # and the run it recorded replays under the recorded policy and options by default
    loaded = load(trace)
    assert loaded.policy == name
    assert started_order(replay(loaded).schedule) == expected


def test_a_popper_chooses_the_first_task_of_a_graph_on_an_idle_cluster(
    user_policies: None,
) -> None:
    from distributed import Client

    from daskjobs.plugin import JobsPlugin

    STARTED.clear()
    plugin = JobsPlugin(policy="team-round-robin", policy_options=ORDER_OPTION)
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(config), plugin_cluster(plugin) as cl, Client(cl) as c:
        parts = []
        for k in KEYS:
            with dask.annotate(estimate=ESTIMATES[k], team=TEAMS[k]):
                parts.append(dask.delayed(work)(k, dask_key_name=k))
        c.compute(parts, sync=True)
    assert list(STARTED) == EXPECTED["team-round-robin"]


def test_a_user_policy_set_in_dask_config_runs_live(user_policies: None, tmp_path: Path) -> None:
    config = {"daskjobs.policy": "team-round-robin", "daskjobs.policy-options": ORDER_OPTION}
    with dask.config.set(config):
        assert live("team-round-robin", tmp_path / "run.jsonl") == EXPECTED["team-round-robin"]


def test_the_clis_take_a_registered_policy(user_policies: None, fifo_trace: Path) -> None:
    import json

    from daskjobs.cli import main

    runner = CliRunner()
    res = runner.invoke(
        main, ["simulate", "chapter", "--tasks", "300", "--policy", "shortest-first", "--json"]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["policy"], r["backups"]) for r in rows] == [
        ("shortest-first", False),
        ("shortest-first", True),
    ]
    res = runner.invoke(
        main, ["replay", str(fifo_trace), "--policy", "shortest-first", "--policy", "lpt", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert [r["policy"] for r in json.loads(res.stdout)["what_if"]] == ["shortest-first", "lpt"]
    res = runner.invoke(main, ["replay", str(fifo_trace), "--policy", "nope"])
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.output
    assert "shortest-first" in res.output and "team-round-robin" in res.output


def test_an_unregistered_policy_is_refused_naming_the_known_ones() -> None:
    from daskjobs.plugin import JobsPlugin

    with pytest.raises(ValueError, match=r"daskjobs.policy: unknown policy 'shortest-first'"):
        JobsPlugin(policy="shortest-first")


def test_work_stealing_runs_in_the_simulator_only() -> None:
    from daskjobs.plugin import JobsPlugin

    assert registry.get("work-stealing").live is False
    assert "work-stealing" in registry.names() and "work-stealing" not in registry.names(live=True)
    with pytest.raises(ValueError, match=r"'work-stealing' runs in the simulator only"):
        JobsPlugin(policy="work-stealing")


def test_the_example_of_the_docs_is_this_one() -> None:
    """docs/how-to/write-a-policy.md's walk-through registers the same two policies, which decide
    alike."""
    import re

    doc = (ROOT / "docs" / "how-to" / "write-a-policy.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc.split("## A walk-through")[1], re.S)[0]
    namespace: dict[str, Any] = {"__name__": "mypolicies"}
    exec(compile(code, "docs/how-to/write-a-policy.md", "exec"), namespace)
    try:
        assert registry.get("team-round-robin").settings == {"order": ()}
        assert registry.get("team-round-robin").description == "teams take turns"
        for name in EXPECTED:
            assert registry.get(name).factory is namespace[_CLASSES[name]]
            assert simulated(name, **OPTIONS[name]) == EXPECTED[name]
    finally:
        registry.unregister("shortest-first")
        registry.unregister("team-round-robin")


_CLASSES = {"shortest-first": "ShortestFirst", "team-round-robin": "TeamRoundRobin"}


# -- the registry ---------------------------------------------------------------------------------

BUILTINS = ("fifo", "lpt", "critical-path", "fair-share", "node-aware", "work-stealing")


def test_the_built_in_policies_are_registered_in_order() -> None:
    assert registry.names()[: len(BUILTINS)] == BUILTINS
    assert registry.names(live=True)[:5] == BUILTINS[:5]
    spec = registry.get("node-aware")
    assert spec.settings["slow_threshold"] == 1.5 and spec.live
    assert spec.description.startswith("LPT that learns node speeds")
    assert registry.get("fair-share").settings["targets"] is registry.REQUIRED
    assert registry.get("lpt").settings == {}


def test_make_builds_a_fresh_policy_with_its_settings(user_policies: None) -> None:
    a = registry.make("team-round-robin", order=["b"])
    b = daskjobs.policies.make_policy("team-round-robin")
    assert isinstance(a, TeamRoundRobin) and a is not b
    assert a.order == ["b"] and b.order == []
    assert registry.get("team-round-robin").description == "teams in turn"
    assert registry.get("shortest-first").description == "Shortest estimated task first."
    assert registry.names()[-2:] == ("shortest-first", "team-round-robin")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: registry.make("nope"), ValueError, r"unknown policy 'nope'; choose one of: "),
        (lambda: registry.make("lpt", depth=3), ValueError, r"policy 'lpt' has no setting 'depth'"),
        (lambda: registry.make("lpt", depth=3), TypeError, r"\(it takes none\)"),
        (
            lambda: registry.make("node-aware", slow_treshold=2),
            ValueError,
            r"no setting 'slow_treshold' \(it takes: slow_threshold, min_samples, ",
        ),
        (
            lambda: registry.make("fair-share"),
            ValueError,
            r"policy 'fair-share' needs the setting 'targets'",
        ),
        (
            lambda: registry.make("fair-share", targets={}),
            ValueError,
            r"policy 'fair-share': FairShare needs at least one team",
        ),
    ],
)
def test_make_names_the_unknown_policy_or_setting(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match) as err:
        call()
    if "unknown policy" in match:
        known = ", ".join(sorted(registry.names()))
        assert str(err.value).endswith(known)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("", ShortestFirst), {}, r"policy name must be"),
        (("Shortest First", ShortestFirst), {}, r"policy name must be .* got 'Shortest First'"),
        (("a:b", ShortestFirst), {}, r"got 'a:b'"),
        ((3, ShortestFirst), {}, r"got 3"),
        (("shortest", ShortestFirst()), {}, r"factory of policy 'shortest' must be callable"),
        (("shortest", "ShortestFirst"), {}, r"must be callable .* got 'ShortestFirst'"),
        (("lpt", ShortestFirst), {}, r"policy 'lpt' is already registered .* replace=True"),
    ],
)
def test_register_refuses_bad_input(args: tuple[Any, ...], kwargs: Any, match: str) -> None:
    before = registry.names()
    with pytest.raises((ValueError, TypeError), match=match):
        registry.register(*args, **kwargs)
    assert registry.names() == before


def test_register_replace_and_unregister() -> None:
    def shortest(**settings: Any) -> Policy:
        return ShortestFirst()

    registry.register("shortest", shortest)
    try:
        with pytest.raises(ValueError, match="already registered"):
            registry.register("shortest", ShortestFirst)
        registry.register("shortest", ShortestFirst, replace=True, description="mine")
        assert registry.get("shortest").factory is ShortestFirst
        assert registry.get("shortest").description == "mine"
    finally:
        registry.unregister("shortest")
    assert "shortest" not in registry.names()
    with pytest.raises(ValueError, match=r"unknown policy 'shortest'"):
        registry.unregister("shortest")


def test_a_factory_must_make_a_policy() -> None:
    registry.register("not-a-policy", lambda: 42)
    try:
        with pytest.raises(TypeError, match=r"policy 'not-a-policy': the factory made int"):
            registry.make("not-a-policy")
    finally:
        registry.unregister("not-a-policy")


# -- entry points ---------------------------------------------------------------------------------


def _ep(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=registry.ENTRY_POINT_GROUP)


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``use([EntryPoint, ...])``: the installed entry points the registry sees next."""
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))  # restored afterwards
    calls: list[str] = []

    def use(eps: list[importlib.metadata.EntryPoint]) -> list[str]:
        def fake(*, group: str) -> list[importlib.metadata.EntryPoint]:
            calls.append(group)
            return [ep for ep in eps if ep.group == group]

        monkeypatch.setattr(registry, "entry_points", fake)
        monkeypatch.setattr(registry, "_pending", None)
        return calls

    return use


def test_entry_points_are_found_lazily_and_a_broken_one_breaks_nothing_else(
    entry_points: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls = entry_points(
        [
            _ep("ep-shortest", "test_user_policy:ShortestFirst"),
            _ep("ep-missing-module", "no_such_module_for_daskjobs:Policy"),
            _ep("ep-missing-attr", "test_user_policy:NoSuchPolicy"),
            _ep("lpt", "test_user_policy:ShortestFirst"),  # a built-in's name: ignored
        ]
    )
    assert calls == []  # nothing is read before the first lookup
    names = registry.names()
    assert calls == ["daskjobs.policies"]
    assert names[-3:] == ("ep-shortest", "ep-missing-module", "ep-missing-attr")
    assert registry.get("lpt").factory is daskjobs.policies.LPT
    assert any("'lpt'" in r.getMessage() and "already" in r.getMessage() for r in caplog.records)
    # loaded when asked for, by name, once
    spec = registry.get("ep-shortest")
    assert spec.factory is ShortestFirst and "test_user_policy:ShortestFirst" in spec.origin
    assert isinstance(registry.make("ep-shortest"), ShortestFirst)
    for name, cause in [
        ("ep-missing-module", "No module named 'no_such_module_for_daskjobs'"),
        ("ep-missing-attr", "NoSuchPolicy"),
    ]:
        with pytest.raises(ValueError, match=r"entry point") as err:
            registry.make(name)
        message = str(err.value)
        assert f"'{name}'" in message and "daskjobs.policies" in message and cause in message
    assert calls == ["daskjobs.policies"]
    # the others still work, and a name in config validates once found
    assert isinstance(registry.make("fifo"), daskjobs.policies.FIFO)
    from daskjobs.config import settings

    assert settings(policy="ep-shortest").policy == "ep-shortest"


def test_registering_the_name_of_an_entry_point_takes_the_code_registration(
    entry_points: Any,
) -> None:
    entry_points([_ep("ep-shortest", "test_user_policy:ShortestFirst")])
    # the module an entry point names may register itself when imported: the same factory
    registry.register("ep-shortest", ShortestFirst)
    assert registry.get("ep-shortest").factory is ShortestFirst
    with pytest.raises(ValueError, match=r"'ep-shortest' is already registered"):
        registry.register("ep-shortest", TeamRoundRobin)


def test_entry_points_that_cannot_be_listed_are_a_warning(
    entry_points: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    entry_points([])

    def broken(*, group: str) -> list[Any]:
        raise RuntimeError("bad metadata")

    monkeypatch.setattr(registry, "entry_points", broken)
    assert registry.names()[: len(BUILTINS)] == BUILTINS
    assert any("bad metadata" in r.getMessage() for r in caplog.records)
