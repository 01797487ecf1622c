"""JobsPlugin is a loop over parts behind one protocol, composed from the settings and
from what the policy declares (its capabilities), never from its class."""

from __future__ import annotations

import ast
from pathlib import Path

import daskjobs
from daskjobs.plugin import JobsPlugin, parts
from daskjobs.plugin.views import LiveTask

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
    assert "daskjobs.plugin.plugin" not in _imports(PLUGIN / "explain.py")
    assert "daskjobs.plugin.plugin" not in _imports(PLUGIN / "parts.py")


def test_the_parts_follow_the_settings() -> None:
    names = lambda p: [type(x).__name__ for x in p.parts]  # noqa: E731
    assert names(JobsPlugin(policy="lpt")) == ["RecordingPart", "LearningPart", "RankingPart"]
    assert names(JobsPlugin(policy="node-aware", speculation={"enabled": True})) == [
        "RecordingPart",
        "SpeculationPart",
        "LearningPart",
        "GatePart",
        "RankingPart",
    ]
    p = JobsPlugin(policy="lpt", preemption={"enabled": True}, resources={"enabled": True})
    assert names(p) == ["RecordingPart", "ResourcesPart", "LearningPart", "RankingPart"]
    assert p.placer is not None and p.preemptor is None  # the placer enacts preemption


def test_a_failing_part_is_counted_under_its_name_and_the_others_still_run() -> None:
    plugin = JobsPlugin(policy="lpt")
    recording = plugin.parts[0]
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
    assert plugin.ranker.estimator.median("stage-x") == 3.0  # the learner ran after it
    plugin.transition("k", "memory", "forgotten")
    assert "k" not in plugin.tasks  # and ranking forgot it


def test_the_start_reporter_is_asked_of_the_parts() -> None:
    assert parts.Reporters(JobsPlugin(policy="lpt").parts, None).wanted() is None  # type: ignore[arg-type]
    sp = JobsPlugin(policy="lpt", speculation={"enabled": True, "min-runtime": "4s"})
    assert parts.Reporters(sp.parts, sp.audit).wanted() == min(
        2.0, sp.settings.speculation.interval
    )
    pe = JobsPlugin(policy="lpt", speculation={"enabled": True}, preemption={"enabled": True})
    assert parts.Reporters(pe.parts, pe.audit).wanted() == 0.0
