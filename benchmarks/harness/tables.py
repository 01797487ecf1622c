"""Markdown tables, as the benchmarks page shows figures."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table. ``align`` has one letter per column, ``l`` or ``r``
    (default: the first column left, the others right, as figures read best)."""
    header = list(header)
    if not align:
        align = "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(header)} columns")
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise ValueError(f"row {cells} has {len(cells)} cells for {len(header)} columns")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
