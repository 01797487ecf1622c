"""Plain-text tables for the command line (shared by the simulate and replay reports)."""

from __future__ import annotations

__all__ = ["table"]


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Rows aligned under headers: first column left, the others right."""
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if k == 0 else c.rjust(w)
            for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
