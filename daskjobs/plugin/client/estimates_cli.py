"""``daskjobs estimates``: what the duration models know, per stage (read only).

From a history file (``history.path``; the default is the configured one): per stage, the
observations kept, their median, the parameters the model reads, its share of predictions
within 2x of what was then measured (each observation predicted from those before it, in
the order they were kept: 3Sigma's measure, as the scheduler scores it live) and a few
predictions (the stage's shortest, middle and longest observed tasks: predicted with the
10-90% band, against what was measured). From a scheduler address: the plugin's own
figures for each stage (observations, median, within 2x so far).

Read only: it never writes or creates a file. A missing or unreadable file is a one-line
error naming it (exit status 1).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import click

from daskjobs._options import json_option, timeout_option
from daskjobs._text import table

__all__ = ["estimates_command", "stage_report"]

#: Most observations per stage replayed to score the model (the most recent ones).
SCORED = 256


def _s(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g} s"


def _params_text(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(p.items())) or "(no parameters)"


def stage_report(rows: list[tuple[dict[str, Any], float]], samples: int) -> dict[str, Any]:
    """The figures of one stage from its observations (``(params, seconds)`` in the order
    kept): observations, median, parameters, within-2x share (each predicted from those
    before it), and predictions for its shortest, middle and longest observed tasks."""
    from daskjobs.policies.durations import Estimator

    replay = Estimator(0.0, samples)
    for params, seconds in rows[-SCORED:]:
        replay.observe("s", params, seconds)
    fig = replay.stages().get("s", {})
    model = replay.models.model("s")
    ordered = sorted(rows, key=lambda r: r[1])
    picks = [ordered[0], ordered[len(ordered) // 2], ordered[-1]] if ordered else []
    seen: set[str] = set()
    predictions = []
    for params, seconds in picks:
        text = _params_text(params)
        if text in seen:
            continue
        seen.add(text)
        p = model.predict(params) if model is not None else None
        predictions.append(
            {
                "params": params,
                "measured": seconds,
                "predicted": p.seconds if p else None,
                "band": [p.low, p.high] if p else None,
                "source": ("model" if p.source == "model" else "history") if p else None,
            }
        )
    names = sorted({str(k) for params, _ in rows for k in params})
    return {
        "observations": len(rows),
        "median": fig.get("median"),
        "parameters": names,
        "within_2x": fig.get("within_2x"),
        "scored": fig.get("scored", 0),
        "predictions": predictions,
    }


def _from_file(path: str) -> dict[str, Any]:
    from daskjobs.policies.durations import Estimator

    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise click.ClickException(f"history file {path} {what}")
    big = 1 << 30
    try:
        est = Estimator(0.0, big, path)  # load() only reads
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    stages = {}
    for stage in est.models.stages():
        m = est.models.model(stage)
        assert m is not None
        stages[stage] = stage_report(m.observations(), min(len(m), 4096) or 1)
    return {"history": path, "stages": stages}


def _render(report: dict[str, Any]) -> str:
    stages = report["stages"]
    lines = [f"history {report['history']}: {len(stages)} stage(s)"]
    if not stages:
        return "\n".join(lines)
    rows = []
    for name, st in stages.items():
        share = st["within_2x"]
        rows.append(
            [
                name,
                str(st["observations"]),
                _s(st["median"]),
                "-" if share is None else f"{share:.0%} of {st['scored']}",
                ", ".join(st["parameters"]) or "-",
            ]
        )
    lines.append(
        table(["stage", "observations", "median", "within 2x", "parameters"], rows, "lrrrl")
    )
    for name, st in stages.items():
        for p in st["predictions"]:
            band = p["band"]
            band_text = f" (10-90%: {_s(band[0])} to {_s(band[1])})" if band else ""
            lines.append(
                f"  {name}: {_params_text(p['params'])}: predicted {_s(p['predicted'])}"
                f"{band_text}, measured {_s(p['measured'])}"
            )
    return "\n".join(lines)


def _render_live(st: dict[str, Any], address: str) -> str:
    stages = st.get("stages") or {}
    lines = [f"scheduler {address}: {len(stages)} stage(s) measured"]
    rows = []
    for name, fig in sorted(stages.items()):
        share = fig.get("within_2x")
        rows.append(
            [
                name,
                str(fig.get("samples", 0)),
                _s(fig.get("median")),
                "-" if share is None else f"{share:.0%} of {fig.get('scored', 0)}",
            ]
        )
    if rows:
        lines.append(table(["stage", "observations", "median", "within 2x"], rows, "lrrr"))
    return "\n".join(lines)


@click.command("estimates", short_help="What the duration models know, per stage (read only).")
@click.argument("source", required=False, metavar="[HISTORY_FILE | SCHEDULER_ADDRESS]")
@timeout_option
@json_option
def estimates_command(source: str | None, timeout: str, as_json: bool) -> None:
    """Per stage: the duration model's observations, its median, the parameters it reads,
    its share of predictions within 2x of the measured duration so far, and a few
    predictions with their 10-90% band.

    SOURCE is a history file (default: the configured daskjobs.history.path) or the address
    of a scheduler running the plugin (tcp://host:8786). Never writes anything.
    """
    if source is None:
        from daskjobs.config import settings

        try:
            source = settings().history_path
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        if not source:
            raise click.ClickException(
                "no history file given and daskjobs.history.path is not set: "
                "name a file or a scheduler address"
            )
    if "://" in source and not source.startswith("file://"):
        from daskjobs.plugin.client.cli import fetch_status

        st = fetch_status(source, timeout)
        if as_json:
            click.echo(json.dumps({"scheduler": source, "stages": st.get("stages", {})}))
        else:
            click.echo(_render_live(st, source))
        return
    path = source.removeprefix("file://")
    report = _from_file(path)
    if as_json:
        click.echo(json.dumps(report, default=str))
    else:
        click.echo(_render(report))
