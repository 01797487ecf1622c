"""Plain text for people: tables for the command line (shared by the simulate, replay and
cache reports), and values shown in error messages."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

__all__ = ["ahead", "duration", "shown", "table"]

_REPRS: dict[int, reprlib.Repr] = {}


def shown(value: Any, longest: int = 80) -> str:
    """``repr(value)`` shortened to about ``longest`` characters (a bad value in a config or
    a job's spec can be huge); ``<type>`` for a value whose repr fails (an int past Python's
    digit limit, a broken object)."""
    r = _REPRS.get(longest)
    if r is None:
        r = _REPRS[longest] = reprlib.Repr()
        r.maxstring = r.maxother = longest
        r.maxlong = longest // 2
    try:
        return r.repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """Rows aligned under headers, columns two spaces apart, each as wide as its widest
    cell. ``align``: one letter a column, ``l`` (left) or ``r`` (right); by default the
    first column left, the others right. No rows: the header and its rule."""
    if align is None:
        align = "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(headers)} columns")
    widths = [max([len(h), *(len(r[k]) for r in rows)]) for k, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def duration(seconds: float) -> str:
    """A span of time as people read it: ``2.3 s``, ``42 s``, ``4 min 05 s``, ``1 h 02 min``."""
    if not math.isfinite(seconds):
        return str(seconds)
    s = max(0.0, seconds)
    if s < 9.95:
        return f"{s:.1f} s"
    whole = round(s)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def ahead(q: Mapping[str, float] | None, none: str = "-") -> str:
    """An expected end, ``{"p10", "p50", "p90"}`` seconds from now, as ``in 42 s (30 s to
    1 min 05 s)``; ``done`` when all three are 0 (nothing of it is unfinished); ``none``
    without a forecast."""
    if q is None:
        return none
    if q["p90"] <= 0:
        return "done"
    return f"in {duration(q['p50'])} ({duration(q['p10'])} to {duration(q['p90'])})"
