"""Plain-text tables for the command line (shared by the simulate, replay and cache
reports)."""

from __future__ import annotations

__all__ = ["table"]


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
