"""Pre-aggregated bases: the summary rows regrouped once at coarser levels of a few QIs.

Counting a node's equivalence classes "from the summary" is one pass over the summary
rows (distinct (QI values, SA, person) tuples). Most of those rows are distinct only
through the one or two QIs with the most values (zip codes, ages): generalised to
coarser levels of those QIs, they collapse to far fewer rows. A ``Base`` is the summary
regrouped at such levels (every other QI at level 0) with the weights that counting
needs, summed per row; a node whose levels are at or above the base's is counted from
the base's rows instead of the summary's, with the same classes. With privacy units the
root base (every QI at level 0) is itself such a regrouping: the summary's (QI, SA,
person) rows with the simple persons merged per (QI tuple, SA) (6.8M rows become 4.0M
at 10M demo rows).

What a base's rows carry:

- rows of persons whose rows all share one QI tuple ("simple" persons, or every row
  without privacy units) are merged per (QI labels, SA) cell: record counts, single
  rows (``singles``: each such row is one distinct (cell, person) pair at any node) and
  first rows (``first``: one per person) are summed, which is what every node sums;
- rows of the other persons are kept as distinct (cell, person) pairs (``multi``,
  ``units``) with their record counts summed, so persons are still de-duplicated per
  node.

Pure core: numpy, and pandas' hash table for grouping sparse codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.arrays import unique_first_inverse

__all__ = [
    "Base",
    "cell_sums",
    "decode",
    "dense_sums",
    "group_codes",
    "regroup",
    "weight_dtype",
    "weight_sums",
]

DIRECT_FACTOR: Final = 4
"""Weights are summed per cell by one ``np.bincount`` over the key space (``dense_sums``)
when that space is at most this many times the rows: no index per row is built. Most of
the t=0.3 search's counts have fewer keys than rows."""

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
WeightArray: TypeAlias = npt.NDArray[np.floating[Any]]
CodeArray: TypeAlias = npt.NDArray[np.integer[Any]]


@dataclass(frozen=True, eq=False)
class Base:
    """Rows to count classes from, at ``levels`` (module docstring).

    ``labels[j]``: per row, the evaluator-local label id of QI ``j`` at ``levels[j]``;
    ``sa``: SA code per row (None without SA). Weights per row: ``counts`` records,
    ``singles`` and ``first`` (privacy units only) rows and persons of simple persons.
    ``multi``: the rows that are (cell, person) pairs of the other persons, ``units``
    their person ids.
    """

    levels: tuple[int, ...]
    labels: tuple[CodeArray, ...]
    sa: CodeArray | None
    counts: WeightArray
    singles: WeightArray | None
    first: WeightArray | None
    multi: IntArray
    units: IntArray
    lifted: dict[tuple[int, int], CodeArray] = field(default_factory=dict)
    """Labels of the rows at higher levels, (QI, level) -> ids, cached by the evaluator."""
    joint: list[CodeArray] = field(default_factory=list)
    """The rows' joint ids of the QIs and SA coded together (at most one array), cached
    by the evaluator (``Evaluator._joint_ids``)."""
    packed: list[FloatArray] = field(default_factory=list)
    """The rows' ``counts`` and ``singles`` packed in one weight (at most one array),
    cached by the evaluator (``Evaluator._packed_weights``)."""
    blocks: dict[int, IntArray | None] = field(default_factory=dict)
    """Row ranges of the blocks of the first QI at a level (level -> cut positions, None
    when the rows are not in that QI's order), cached by the evaluator
    (``Evaluator.classes_by_block``)."""

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return int(self.counts.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (for the memory bound)."""
        arrays: list[npt.NDArray[Any] | None] = [
            *self.labels,
            self.sa,
            self.counts,
            self.singles,
            self.first,
            self.multi,
            self.units,
            *self.lifted.values(),
            *self.joint,
            *self.packed,
        ]
        return sum(array.nbytes for array in arrays if array is not None)


def code_dtype(n: int) -> np.dtype[Any]:
    """The smallest unsigned dtype holding 0..n-1."""
    return np.min_scalar_type(max(n - 1, 0))


def group_codes(codes: IntArray, space: int, dense_limit: int) -> tuple[IntArray, npt.NDArray[Any]]:
    """Sorted distinct values of ``codes`` (all in 0..space-1) and the index of each
    element's value among them. A dense flag array when ``space <= dense_limit`` (no
    sort), else a hash table (pandas' factorize: 2.3x faster than an argsort of 100k-400k
    codes), then a sort of the distinct values only."""
    if space <= dense_limit:
        seen = np.zeros(space, dtype=bool)
        seen[codes] = True
        present = np.flatnonzero(seen)
        del seen
        index_of = np.empty(space, dtype=np.int32 if present.shape[0] < 1 << 31 else np.int64)
        index_of[present] = np.arange(present.shape[0], dtype=index_of.dtype)
        return present.astype(np.int64, copy=False), index_of[codes]
    inverse, distinct = pd.factorize(codes, sort=False)
    order = np.argsort(distinct)
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0], dtype=np.int64)
    return np.asarray(distinct[order], dtype=np.int64), rank[inverse]


def decode(
    codes: IntArray, radices: tuple[int, ...], sa_radix: int
) -> tuple[list[IntArray], IntArray]:
    """The digits of mixed-radix codes (first QI most significant, SA the lowest digit):
    per QI label ids, and SA codes."""
    sa = codes % sa_radix
    rest = codes // sa_radix
    digits: list[IntArray] = [rest] * len(radices)
    for j in range(len(radices) - 1, -1, -1):
        digits[j] = rest % radices[j]
        rest = rest // radices[j]
    return digits, sa


def weight_sums(inverse: npt.NDArray[Any], weights: WeightArray, n: int) -> FloatArray:
    """Sum of ``weights`` per group (exact: the sums are integers below 2^53)."""
    return np.asarray(np.bincount(inverse, weights=weights, minlength=n), dtype=np.float64)


def dense_sums(
    codes: IntArray, space: int, weights: Sequence[WeightArray]
) -> tuple[IntArray, list[FloatArray]]:
    """Sorted distinct values of ``codes`` (all in 0..space-1) and, per array of
    ``weights``, its sums per distinct value: one ``np.bincount`` over the key space each,
    no index per element built (``group_codes`` scatters flags, then gathers an index per
    element, before its sums). For key spaces up to a few times the elements. Every
    element's first weight must be positive (a record count): a value is present exactly
    when its first sum is."""
    head = weight_sums(codes, weights[0], space)
    present = np.flatnonzero(head != 0)  # on a mask: ~7x faster than on the floats
    sums = [head[present]]
    sums += [weight_sums(codes, w, space)[present] for w in weights[1:]]
    return present.astype(np.int64, copy=False), sums


def cell_sums(
    codes: IntArray,
    space: int,
    weights: Sequence[WeightArray],
    dense_limit: int,
    index: bool = False,
) -> tuple[IntArray, list[FloatArray], npt.NDArray[Any] | None]:
    """Sorted distinct values of ``codes`` (all in 0..space-1), per array of ``weights``
    its sums per value, and each element's index among the values, or None: the sums
    are taken over the key space itself (``dense_sums``, no index per element built)
    when it is at most ``DIRECT_FACTOR`` times the elements and no ``index`` is asked
    for, else through ``group_codes``' index."""
    if not index and space <= DIRECT_FACTOR * codes.shape[0]:
        present, sums = dense_sums(codes, space, weights)
        return present, sums, None
    present, inverse = group_codes(codes, space, dense_limit)
    return present, [weight_sums(inverse, w, present.shape[0]) for w in weights], inverse


def weight_dtype(n_records: int) -> np.dtype[Any]:
    """float32 for the weights of base rows when every sum is exact in it (below 2^24
    records), else float64: the summed weights are integers."""
    return np.dtype(np.float32 if n_records < 1 << 24 else np.float64)


def regroup(
    base: Base,
    levels: tuple[int, ...],
    codes: IntArray,
    space: int,
    radices: tuple[int, ...],
    sa_radix: int,
    n_units: int,
    dense_limit: int,
) -> Base:
    """``base`` regrouped at ``levels`` (a generalisation of ``base.levels``), given the
    dense ``codes`` of its rows there (in 0..space-1; ``radices``: the number of labels of
    each QI there)."""
    extra = [w for w in (base.singles, base.first) if w is not None]
    present, sums, inverse = cell_sums(
        codes, space, [base.counts, *extra], dense_limit, index=bool(base.multi.shape[0])
    )
    counts, rest = sums[0], iter(sums[1:])
    singles = None if base.singles is None else next(rest)
    first = None if base.first is None else next(rest)
    n_cells = int(present.shape[0])
    cell_codes = present
    multi = np.zeros(0, dtype=np.int64)
    units = np.zeros(0, dtype=np.int64)
    if base.multi.shape[0]:
        # the multi-row persons' rows: out of the merged cells, into distinct pairs; a
        # cell keeps a merged row only if it has rows of simple persons
        assert inverse is not None  # asked for when persons have several tuples
        multi_of = inverse[base.multi]
        counts -= weight_sums(multi_of, base.counts[base.multi], n_cells)
        simple = np.bincount(inverse, minlength=n_cells) > np.bincount(multi_of, minlength=n_cells)
        pair_keys = multi_of.astype(np.int64) * n_units + base.units
        pairs, _, pair_of_row = unique_first_inverse(pair_keys)
        pair_counts = weight_sums(pair_of_row, base.counts[base.multi], int(pairs.shape[0]))
        pair_cells = pairs // n_units
        units = pairs - pair_cells * n_units
        kept = int(simple.sum())
        multi = np.arange(kept, kept + pairs.shape[0], dtype=np.int64)
        cell_codes = np.concatenate([present[simple], present[pair_cells]])
        counts = np.concatenate([counts[simple], pair_counts])
        zeros = np.zeros(pairs.shape[0], dtype=np.float64)
        singles = None if singles is None else np.concatenate([singles[simple], zeros])
        first = None if first is None else np.concatenate([first[simple], zeros])
    digits, sa = decode(cell_codes, radices, sa_radix)
    dtype = base.counts.dtype
    return Base(
        levels,
        tuple(d.astype(code_dtype(r)) for d, r in zip(digits, radices, strict=True)),
        None if base.sa is None else sa.astype(code_dtype(sa_radix)),
        counts.astype(dtype),
        None if singles is None else singles.astype(dtype),
        None if first is None else first.astype(dtype),
        multi,
        units,
    )
