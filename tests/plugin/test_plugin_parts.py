"""JobsPlugin is a loop over parts behind one protocol, composed from the settings and
from what the policy declares (its capabilities), never from its class."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import daskjobs
from daskjobs.plugin import JobsPlugin, parts
from daskjobs.plugin.views import LiveAttempt, LiveTask
from daskjobs.policies import (
    LPT,
    FairShare,
    HeapPolicy,
    NodeAware,
    NodeView,
    Policy,
    TaskView,
    registry,
)
from daskjobs.policies.base import OPTIONAL_FIELDS, Capabilities, field

PLUGIN = Path(daskjobs.__file__).resolve().parent / "plugin"


# -- the shape -------------------------------------------------------------------------------


def test_jobsplugin_is_under_250_lines() -> None:
    tree = ast.parse((PLUGIN / "plugin.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JobsPlugin"]
    assert cls.end_lineno is not None and cls.end_lineno - cls.lineno + 1 < 250
    assert len((PLUGIN / "plugin.py").read_text(encoding="utf-8").splitlines()) < 250


def test_jobsplugin_has_no_forwarding_properties() -> None:
    assert not [name for name, v in vars(JobsPlugin).items() if isinstance(v, property)]


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_explain_reads_a_view_and_does_not_import_the_plugin() -> None:
    assert "daskjobs.plugin.plugin" not in _imports(PLUGIN / "observe" / "explain.py")
    assert "daskjobs.plugin.plugin" not in _imports(PLUGIN / "parts.py")


def test_the_parts_follow_the_settings() -> None:
    names = lambda p: [type(x).__name__ for x in p.parts]  # noqa: E731
    first = ["AdmissionPart", "RecordingPart", "IdentityPart"]  # limits and teams first
    last = "ForecastPart"  # the scheduler's forecast (daskjobs.forecast.interval)
    assert names(JobsPlugin(policy="lpt")) == [*first, "LearningPart", "RankingPart", last]
    assert names(JobsPlugin(policy="node-aware", speculation={"enabled": True})) == [
        "AdmissionPart",
        "RecordingPart",
        "IdentityPart",
        "SpeculationPart",
        "LearningPart",
        "GatePart",
        "RankingPart",
        last,
    ]
    p = JobsPlugin(policy="lpt", preemption={"enabled": True}, resources={"enabled": True})
    assert names(p) == [*first, "ResourcesPart", "LearningPart", "RankingPart", last]
    off = JobsPlugin(policy="lpt", forecast={"interval": None})
    assert names(off) == [*first, "LearningPart", "RankingPart"]
    assert off.view.forecast() is None
    assert p.placer is not None and p.preemptor is None  # the placer enacts preemption


def test_each_part_counts_its_errors_under_a_name_of_its_own() -> None:
    """An error count says which part failed: no two parts of any composition share a name
    (the release gate and the ranking views were both "transition")."""
    compositions = [
        JobsPlugin(policy="lpt"),
        JobsPlugin(policy="node-aware", speculation={"enabled": True}),
        JobsPlugin(policy="fair-share", teams={"targets": {"a": 1}}),
        JobsPlugin(policy="lpt", preemption={"enabled": True}),
        JobsPlugin(policy="lpt", preemption={"enabled": True}, resources={"enabled": True}),
    ]
    for plugin in compositions:
        names = [p.name for p in plugin.parts]
        assert len(names) == len(set(names)), names
        assert "part" not in names  # every part names itself
        assert "transition" not in names  # a hook's name, not a part's


def test_a_failing_part_is_counted_under_its_name_and_the_others_still_run() -> None:
    plugin = JobsPlugin(policy="lpt")
    recording = plugin.parts[1]
    assert isinstance(recording, parts.RecordingPart)

    def boom(step: parts.Step) -> None:
        raise RuntimeError("injected")

    recording.transition = boom  # type: ignore[method-assign]
    v = LiveTask("k", 2.0, 1, "a", 0.0, (), "annotation", "stage-x")
    plugin.tasks["k"] = v
    plugin.ranker.policy.add_graph([v])
    startstops = [{"action": "compute", "start": 1.0, "stop": 4.0}]
    plugin.transition("k", "processing", "memory", startstops=startstops, worker="tcp://w:1")
    assert plugin.errors["record"] == 1
    assert plugin.ranker.estimator.stages()["stage-x"]["median"] == 3.0  # the learner ran
    plugin.transition("k", "memory", "forgotten")
    assert "k" not in plugin.tasks  # and ranking forgot it


def _inc(x: int) -> int:
    return x + 1


def test_parts_that_raise_on_a_live_scheduler_are_counted_and_logged_each_under_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The release gate and the ranking views, whose failures were once counted together
    (both "transition"), raise in their hooks on a running scheduler: each exception is
    counted under its part's name and logged at WARNING with its key and traceback, and
    the scheduler keeps running (every result comes back, a later graph runs too)."""
    import logging
    import time

    from conftest import plugin_cluster
    from distributed import Client

    from daskjobs.plugin.client import status

    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"a": 1}})
    by_name = {p.name: p for p in plugin.parts}

    def boom(step: parts.Step) -> None:
        raise RuntimeError(f"injected into {step.key!r}")

    by_name["release"].transition = boom  # type: ignore[method-assign]
    by_name["ranking"].transition = boom  # type: ignore[method-assign]
    with (
        caplog.at_level(logging.WARNING, logger="daskjobs.plugin"),
        plugin_cluster(plugin) as cl,
        Client(cl) as c,
    ):
        futures = c.map(_inc, range(5), key=[f"inc-{i}" for i in range(5)])
        assert c.gather(futures) == [1, 2, 3, 4, 5]
        del futures  # forgotten: the ranking views' transitions
        deadline = time.monotonic() + 30
        while plugin.errors.get("ranking", 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.submit(_inc, 10, key="later").result() == 11  # the scheduler carries on
        errors = status(c)["errors"]
    assert set(errors) == {"release", "ranking"}, errors  # as status() reports them
    assert errors["ranking"] >= 5 and errors["release"] >= 5, errors
    final = dict(plugin.errors)  # with the transitions of the client's leaving
    assert set(final) == {"release", "ranking"}, final
    logged: dict[str, list[logging.LogRecord]] = {name: [] for name in final}
    for r in caplog.records:
        for name in final:
            if r.getMessage().startswith(f"daskjobs: {name} failed for "):
                logged[name].append(r)
    for name, records in logged.items():
        assert len(records) == final[name], (name, len(records), final)
        assert all(r.levelno == logging.WARNING for r in records)
        assert all(r.exc_info and isinstance(r.exc_info[1], RuntimeError) for r in records)
    assert any("'inc-3'" in r.getMessage() for r in logged["ranking"])


class _Seen(parts.Part):
    """A part that wants only ends, and notes every transition it is given."""

    name = "seen"

    def __init__(self) -> None:
        self.steps: list[tuple[str, str]] = []
        self.asked: list[tuple[str, str]] = []

    def wants(self, start: str, finish: str) -> bool:
        self.asked.append((start, finish))
        return start == "processing"

    def transition(self, step: parts.Step) -> None:
        self.steps.append((step.start, step.finish))


def test_a_part_is_given_only_the_transitions_it_wants_asked_once_per_pair() -> None:
    audit = JobsPlugin().audit
    seen, every = _Seen(), _Seen()
    every.wants = lambda start, finish: True  # type: ignore[method-assign]
    run = parts.Transitions([seen, every], audit)
    pairs = [("released", "waiting"), ("waiting", "processing"), ("processing", "memory")]
    for key in ("a", "b", "c"):
        for start, finish in pairs:
            run.hook(key, start, finish)
    assert seen.steps == [("processing", "memory")] * 3
    assert every.steps == pairs * 3
    assert seen.asked == pairs  # once per pair, not once per transition


def test_a_part_whose_wants_fails_is_counted_and_given_every_transition() -> None:
    audit = JobsPlugin().audit
    seen = _Seen()

    def broken(start: str, finish: str) -> bool:
        raise RuntimeError("injected")

    seen.wants = broken  # type: ignore[method-assign]
    run = parts.Transitions([seen], audit)
    run.hook("a", "released", "waiting")
    run.hook("b", "released", "waiting")
    assert seen.steps == [("released", "waiting")] * 2
    assert audit.errors["seen"] == 1  # asked once for the pair


def test_the_builtin_parts_want_what_they_act_on() -> None:
    plugin = JobsPlugin(policy="fifo")
    by_name = {type(p).__name__: p for p in plugin.parts}
    learning, ranking = by_name["LearningPart"], by_name["RankingPart"]
    assert learning.wants("processing", "memory")
    assert not learning.wants("processing", "erred") and not learning.wants("waiting", "queued")
    # a task enters the waiting set on leaving "released", leaves it on finishing, and is
    # forgotten; between waiting states it stays where it is
    assert ranking.wants("released", "waiting") and ranking.wants("processing", "memory")
    assert ranking.wants("memory", "forgotten") and ranking.wants("memory", "released")
    assert not ranking.wants("waiting", "queued") and not ranking.wants("queued", "processing")
    gate = {type(p).__name__: p for p in JobsPlugin(policy="node-aware").parts}["GatePart"]
    assert not gate.wants("released", "waiting") and not gate.wants("waiting", "waiting")
    assert gate.wants("waiting", "queued") and gate.wants("waiting", "processing")
    assert gate.wants("waiting", "released") and gate.wants("processing", "memory")
    assert not gate.wants("memory", "forgotten") and not gate.wants("memory", "released")
    with_copies = JobsPlugin(policy="fifo", speculation={"enabled": True})
    spec = {type(p).__name__: p for p in with_copies.parts}
    assert not spec["SpeculationPart"].wants("waiting", "waiting")
    assert spec["SpeculationPart"].wants("released", "waiting")


def test_the_start_reporter_is_asked_of_the_parts() -> None:
    assert parts.Reporters(JobsPlugin(policy="lpt").parts, None).wanted() is None  # type: ignore[arg-type]
    sp = JobsPlugin(policy="lpt", speculation={"enabled": True, "min-runtime": "4s"})
    assert parts.Reporters(sp.parts, sp.audit).wanted() == min(
        2.0, sp.settings.speculation.interval
    )
    pe = JobsPlugin(policy="lpt", speculation={"enabled": True}, preemption={"enabled": True})
    assert parts.Reporters(pe.parts, pe.audit).wanted() == 0.0


# -- capabilities ----------------------------------------------------------------------------


def test_the_builtin_policies_declare_what_they_do() -> None:
    assert LPT.capabilities == Capabilities(pops=False)
    assert FairShare.capabilities.team_accounts and FairShare.capabilities.reconciles
    na = NodeAware.capabilities
    assert na.pops and na.learns_speeds and na.speculates
    assert na.reads == {"task.estimated", "node.waiting", "attempt.policy_state"}
    assert Policy.capabilities == Capabilities()  # a plain policy pops, and nothing more


def test_capabilities_name_only_declared_view_fields() -> None:
    with pytest.raises(ValueError, match=r"no optional view field: task\.colour"):
        Capabilities(reads=frozenset({"task.colour"}))
    assert field(LiveTask("k", 1.0, 1, "a", 0.0, (), "default", "s"), "task.estimated") is False
    assert field(object(), "node.waiting") == OPTIONAL_FIELDS["node.waiting"] == 0.0


class SlowAware(Policy):
    """A user's popper that learns speeds (it keeps NodeAware's records by delegation)."""

    name = "slow-aware"
    capabilities = Capabilities(pops=True, learns_speeds=True)

    def __init__(self) -> None:
        self.inner = NodeAware()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def push(self, task: TaskView) -> None:
        self.inner.push(task)

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        return self.inner.pop(node, now)

    def started(self, attempt: Any, now: float) -> None:
        self.inner.started(attempt, now)

    def ended(self, attempt: Any, now: float) -> bool:
        return self.inner.ended(attempt, now)

    def speed(self, node: int) -> float:
        return self.inner.speed(node)

    def __len__(self) -> int:
        return len(self.inner)


class Eager(LPT):
    """A user's ranking policy that asks for a backup of any attempt past its estimate."""

    name = "eager"
    capabilities = Capabilities(pops=False, speculates=True)

    def urgent(self, attempt: Any, now: float) -> bool:
        return now - attempt.start > attempt.task.estimate


class KeyLess(Policy):
    name = "key-less"
    capabilities = Capabilities(pops=False)


@pytest.fixture
def user_policies() -> Any:
    registry.register("slow-aware", SlowAware)
    registry.register("key-less", KeyLess)
    registry.register("eager", Eager)
    try:
        yield
    finally:
        registry.unregister("slow-aware")
        registry.unregister("key-less")
        registry.unregister("eager")


def test_a_user_policy_that_declares_learning_is_the_plugins_learner(user_policies: None) -> None:
    plugin = JobsPlugin(policy="slow-aware")
    assert plugin.speeds.learner is plugin.ranker.popper
    assert plugin.gate is not None and plugin.gate.learns and plugin.gate.by_worker
    assert plugin.view.fair is None
    # a built-in learner is wired the same way
    na = JobsPlugin(policy="node-aware")
    assert na.speeds.learner is na.ranker.popper and na.gate is not None and na.gate.learns
    # and a popper that declares nothing is not
    fair = JobsPlugin(policy="fair-share", teams={"targets": {"a": 1}})
    assert fair.gate is not None and not fair.gate.learns and fair.gate.reconciles
    assert fair.speeds.learner is not fair.ranker.popper and fair.view.fair is fair.ranker.popper


def test_a_user_policy_that_declares_speculation_is_asked_live(user_policies: None) -> None:
    plugin = JobsPlugin(policy="eager", speculation={"enabled": True})
    learner = plugin.speeds.learner  # what the speculation driver asks
    v = LiveTask("k", 2.0, 1, "a", 0.0, (), "annotation", "s")
    assert learner.urgent(LiveAttempt(v, 0, 10.0), 13.0)  # type: ignore[attr-defined]
    assert not learner.urgent(LiveAttempt(v, 0, 10.0), 11.0)  # type: ignore[attr-defined]
    assert learner.speed(0) == 1.0  # beliefs: a learner's (the policy learns none)
    # undeclared, it is not asked (the learner's own rule: nominal nodes are never urgent)
    assert not JobsPlugin(policy="lpt").speeds.learner.urgent(LiveAttempt(v, 0, 10.0), 13.0)  # type: ignore[attr-defined]


def test_a_policy_that_does_not_pop_needs_a_key(user_policies: None) -> None:
    with pytest.raises(TypeError, match=r"'key-less' declares that it does not pop"):
        JobsPlugin(policy="key-less")


# -- NodeAware reads the declared policy_state field, never the attempt's class ----------------


@dataclass(frozen=True)
class FrozenAttempt:
    """An attempt view without the optional ``policy_state`` field (it cannot take one)."""

    task: LiveTask
    node: int
    start: float
    end: float = float("nan")
    outcome: str | None = "done"
    backup: bool = False


def _learn(attempts: Sequence[Any], policy: NodeAware) -> list[float]:
    for a in attempts:
        policy.started(a, a.start)
    return [
        (policy.ended(a, a.start + 3.0 * a.task.estimate) and policy.speed(a.node)) or 0.0
        for a in attempts
    ]


def test_node_aware_keeps_its_records_on_the_field_or_in_a_dict_alike() -> None:
    tasks = [LiveTask(f"t{i}", 1.0 + i, 1, "a", 0.0, (), "annotation", "s") for i in range(4)]
    with_field, without = NodeAware(min_samples=1), NodeAware(min_samples=1)
    for p in (with_field, without):
        p.add_node(0, 4)
    live = [LiveAttempt(t, 0, 10.0 * i, outcome="done") for i, t in enumerate(tasks)]
    frozen = [FrozenAttempt(t, 0, 10.0 * i) for i, t in enumerate(tasks)]
    assert _learn(live, with_field) == _learn(frozen, without)
    assert with_field.speed(0) == without.speed(0) > 1.0
    assert all(a.policy_state is None for a in live)  # closed on the attempt, once
    assert not without._run and not with_field._run  # no dict entry left behind


def test_the_simulators_attempt_is_not_looked_at_by_class() -> None:
    source = (Path(daskjobs.__file__).resolve().parent / "policies" / "nodeaware.py").read_text()
    assert "MemberDescriptorType" not in source and "_carries" not in source


# -- the TE-before-BE order is the policy layer's ----------------------------------------------


def test_interactive_work_first_is_a_rule_of_the_policy_layer() -> None:
    from daskjobs.policies.order import user_order

    assert user_order(-1.0, "te", te_first=True) == -1.5
    assert user_order(-1.0, "be", te_first=True) == -1.0
    assert user_order(-1.0, "te", te_first=False) == -1.0
    # never past a higher user priority (whole numbers)
    assert user_order(-1.0, "te", True) > user_order(-2.0, "be", True)
    source = (PLUGIN / "ranking.py").read_text(encoding="utf-8")
    assert "- 0.5" not in source
    assert HeapPolicy.capabilities.pops is False


# -- every optional view field a policy reads is declared -------------------------------------

_VIEW_NAMES = {"node": "node", "task": "task", "t": "task", "attempt": "attempt", "a": "attempt"}


def _optional_reads(source: str) -> list[tuple[str, object]]:
    """``(view.field, default)`` of every ``getattr(<view>, "field", default)`` in
    ``source`` whose first argument is a view by its house name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) == 3
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in _VIEW_NAMES
            and isinstance(node.args[1], ast.Constant)
        ):
            try:
                default: object = ast.literal_eval(node.args[2])
            except ValueError:
                default = ast.unparse(node.args[2])  # a sentinel: a name
            out.append((f"{_VIEW_NAMES[node.args[0].id]}.{node.args[1].value}", default))
    return out


def test_policies_read_only_declared_view_fields_with_their_defaults() -> None:
    folder = Path(daskjobs.__file__).resolve().parent / "policies"
    reads = {p.name: _optional_reads(p.read_text(encoding="utf-8")) for p in folder.glob("*.py")}
    assert ("node.waiting", 0.0) in reads["nodeaware.py"]  # the scan sees them
    for module, found in reads.items():
        for name, default in found:
            assert name in OPTIONAL_FIELDS, f"policies/{module} reads undeclared {name}"
            if name != "attempt.policy_state":  # read with a sentinel: missing vs unset
                assert default == OPTIONAL_FIELDS[name], f"policies/{module}: {name}"


def test_a_reestimated_view_is_replace_of_its_estimate_fields_and_keeps_every_other():
    """``LiveTask.reestimated`` writes the constructor out for speed: it must equal
    ``dataclasses.replace`` of the four estimate fields, whatever fields the view has
    (every field set to a value other than its default, so a field it forgot shows)."""
    import dataclasses

    v = LiveTask(
        "k",
        2.0,
        3,
        "a",
        5.0,
        ("d",),
        "default",
        "stage-x",
        speculate=False,
        job_class="te",
        teams=("a", "b"),
        band=(1.0, 4.0),
        samples=7,
        params={"x": 1},
    )
    fields = dataclasses.fields(LiveTask)
    defaults = {f.name for f in fields if f.default is not dataclasses.MISSING}
    assert defaults == {"speculate", "job_class", "teams", "band", "samples", "params"}
    new = v.reestimated(9.5, "history", (8.0, 12.0), 11)
    want = dataclasses.replace(v, estimate=9.5, source="history", band=(8.0, 12.0), samples=11)
    for f in dataclasses.fields(LiveTask):
        assert getattr(new, f.name) == getattr(want, f.name), f.name
    assert new.params is v.params


def test_a_new_estimate_keeps_the_priority_where_the_policys_key_does_not_move() -> None:
    """fifo's key is the submission time: a task given a new estimate keeps its dask
    priority (the same tuple, nothing for dask's queue to move); lpt's key is the
    estimate: its priority moves with it, aged as it was."""
    from types import SimpleNamespace

    from daskjobs.plugin.estimates import Estimate

    for policy, moves in (("fifo", False), ("lpt", True)):
        ranker = JobsPlugin(policy=policy).ranker
        v = LiveTask("k", 2.0, 1, "a", 5.0, (), "default", "stage-x")
        ranker.tasks["k"] = v
        rank = float(ranker.policy.key(v))
        prio = (0, rank + 1.5, 7, 0)  # an old generation: aged by 1.5
        ts = SimpleNamespace(key="k", priority=prio)
        new = ranker._reranked(ts, v, Estimate(4.0, 3.0, 5.0, "history", 9), None)
        assert new is not None and ranker.tasks["k"] is new and new.estimate == 4.0
        assert new.band == (3.0, 5.0) and new.samples == 9
        if moves:
            assert ts.priority == (0, float(ranker.policy.key(new)) + 1.5, 7, 0)
        else:
            assert ts.priority is prio
        # the same estimate again: nothing to give
        assert ranker._reranked(ts, new, Estimate(4.0, 3.0, 5.0, "history", 9), None) is None
