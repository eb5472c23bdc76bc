"""Public grids for numeric labels: where a published range may start and end.

Mondrian publishes a numeric quasi-identifier as a range per class. Taking the class
members' minimum and maximum would publish two records' exact values, so ranges are built
from cells of a *public grid* instead: the intervals of the column's hierarchy at the
finest level (>= 1) whose labels are all intervals containing their raw values and not
overlapping. Interval labels are read in the forms the hierarchies use:

- ``[lo, hi)`` or ``[lo, hi[`` (half-open, the ``intervals`` builder's form);
- ``[lo, hi]`` or ``lo-hi`` (closed, e.g. ARX's ``0-4``).

A range over cells ``i..j`` is published as ``[lo_i, hi_j)`` (or ``[lo_i, hi_j]`` when
cell ``j`` is closed). A label is *on the grid* iff it reads as such a range. The grid
depends only on the hierarchy (public), never on the class members.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy

__all__ = ["Grid", "format_number", "interval_grid", "parse_interval"]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
ObjArray: TypeAlias = npt.NDArray[np.object_]

_NUM: Final = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_BRACKETED: Final = re.compile(rf"^\s*\[\s*({_NUM})\s*[,;]\s*({_NUM})\s*([\]\)\[])\s*$")
_DASHED: Final = re.compile(rf"^\s*({_NUM})\s*-\s*({_NUM})\s*$")


def format_number(value: float) -> str:
    """A bound as published: integers without ``.0``, others in their shortest form."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def parse_interval(label: object) -> tuple[float, float, bool] | None:
    """``(lo, hi, closed)`` of an interval label (module doc), else None."""
    text = str(label)
    match = _BRACKETED.match(text)
    if match:
        lo, hi, closed = float(match.group(1)), float(match.group(2)), match.group(3) == "]"
    else:
        match = _DASHED.match(text)
        if not match:
            return None
        lo, hi, closed = float(match.group(1)), float(match.group(2)), True
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi or (lo == hi and not closed):
        return None
    return lo, hi, closed


@dataclass(frozen=True, eq=False)
class Grid:
    """The cells of one hierarchy level, sorted and disjoint; ``cell`` per raw code."""

    attribute: str
    level: int
    lo: FloatArray
    hi: FloatArray
    closed: BoolArray
    cell: IntArray

    @property
    def span(self) -> float:
        """Width of the whole grid (normalises Mondrian's widths)."""
        return float(self.hi.max() - self.lo.min())

    def label(self, first: IntArray, last: IntArray) -> ObjArray:
        """The range label over cells ``first[i]..last[i]`` (one label per pair)."""
        lo = np.array([format_number(v) for v in self.lo.tolist()], dtype=object)
        hi = np.array([format_number(v) for v in self.hi.tolist()], dtype=object)
        end = np.where(self.closed, "]", ")").astype(object)
        return np.asarray("[" + lo[first] + ", " + hi[last] + end[last], dtype=object)

    def on_grid(self, labels: Sequence[object]) -> BoolArray:
        """Per label: whether it is a range over whole cells of the grid."""
        out = np.zeros(len(labels), dtype=bool)
        starts = {float(v) for v in self.lo.tolist()}
        pairs = zip(self.hi.tolist(), self.closed.tolist(), strict=True)
        ends = {(float(h), bool(c)) for h, c in pairs}
        for i, label in enumerate(labels):
            parsed = parse_interval(label)
            if parsed is not None and str(label).lstrip().startswith("["):
                lo, hi, closed = parsed
                out[i] = lo in starts and (hi, closed) in ends
        return out


def _numbers(hierarchy: Hierarchy) -> FloatArray:
    parsed = pd.to_numeric(pd.Series(hierarchy.values, dtype=object), errors="coerce")
    return np.asarray(parsed.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)


def interval_grid(hierarchy: Hierarchy) -> Grid | None:
    """The public grid of a numeric hierarchy (module doc), or None if no level defines one."""
    numbers = _numbers(hierarchy)
    known = np.isfinite(numbers)
    for level in range(1, hierarchy.levels):
        names = hierarchy.label_names(level)
        parsed = [parse_interval(name) for name in names.tolist()]
        if not parsed or any(p is None for p in parsed):
            continue
        lo = np.array([p[0] for p in parsed if p is not None], dtype=np.float64)
        hi = np.array([p[1] for p in parsed if p is not None], dtype=np.float64)
        closed = np.array([p[2] for p in parsed if p is not None], dtype=bool)
        ids = hierarchy.label_ids(level)
        value = numbers[known]
        own = ids[known]
        inside = (lo[own] <= value) & np.where(closed[own], value <= hi[own], value < hi[own])
        if not inside.all():
            continue
        order = np.argsort(lo, kind="stable")
        lo, hi, closed = lo[order], hi[order], closed[order]
        apart = np.where(closed[:-1], hi[:-1] < lo[1:], hi[:-1] <= lo[1:])
        if not apart.all():
            continue
        rank = np.empty(order.shape[0], dtype=np.int64)
        rank[order] = np.arange(order.shape[0], dtype=np.int64)
        return Grid(hierarchy.attribute, level, lo, hi, closed, rank[ids])
    return None
