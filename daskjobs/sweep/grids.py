"""Grids: the points a stage is swept over.

:func:`grid` is a cartesian product of axes, :func:`cases` an explicit list of points; ``*``
multiplies two :class:`Grid` objects and ``+`` joins them (see :mod:`daskjobs.sweep`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Grid:
    """A list of parameter points (dicts). ``a * b`` is the product, ``a + b`` the union."""

    points: tuple[Mapping[str, Any], ...]

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)

    def __mul__(self, other: Grid) -> Grid:
        if not isinstance(other, Grid):
            return NotImplemented
        points = []
        for a, b in itertools.product(self.points, other.points):
            clash = set(a) & set(b)
            if clash:
                raise ValueError(f"cannot multiply grids that share parameters {sorted(clash)}")
            points.append({**a, **b})
        return Grid(tuple(points))

    def __add__(self, other: Grid) -> Grid:
        if not isinstance(other, Grid):
            return NotImplemented
        return Grid(self.points + other.points)

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in order of first appearance."""
        return tuple(dict.fromkeys(name for p in self.points for name in p))


def grid(**axes: Iterable[Any]) -> Grid:
    """The cartesian product of the given axes: ``grid(fast=[5, 10], slow=[50, 100])``."""
    names = list(axes)
    values = []
    for name in names:
        axis = axes[name]
        if isinstance(axis, (str, bytes)) or not isinstance(axis, Iterable):
            raise TypeError(
                f"grid axis {name!r} must be a list of values, got {type(axis).__name__}; "
                f"for a fixed value use params={{{name!r}: ...}} or grid({name}=[value])"
            )
        values.append(list(axis))
    return Grid(tuple(dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)))


def cases(*points: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> Grid:
    """An explicit list of points: ``cases({"fast": 5, "slow": 50}, {"fast": 10, "slow": 200})``
    (or one list of dicts)."""
    if len(points) == 1 and not isinstance(points[0], Mapping):
        points = tuple(points[0])
    out = []
    for p in points:
        if not isinstance(p, Mapping):
            raise TypeError(f"cases() takes dicts of parameters, got {type(p).__name__}")
        out.append(dict(p))
    return Grid(tuple(out))


def as_grid(over: Grid | Mapping[str, Iterable[Any]] | Iterable[Mapping[str, Any]] | None) -> Grid:
    if over is None:
        return Grid(({},))
    if isinstance(over, Grid):
        return over
    if isinstance(over, Mapping):
        return grid(**over)
    return cases(list(over))
