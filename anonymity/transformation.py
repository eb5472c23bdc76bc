"""Evaluating a transformation (lattice node) on a summary: its equivalence classes.

For a level vector, every summary tuple is generalised (each QI to its label at that
QI's level); tuples with equal generalised QIs form an equivalence class. The result,
``EquivalenceClasses``, holds the class sizes and the class x SA counts in sparse form
("cells": one per distinct (class, SA code) pair), which is all the privacy models,
metrics and risk measures need.

How it is fast: per QI, the values present in the summary get *local* label ids per
level, numbered in tree (depth-first) order so that the id of a label's parent is a
non-decreasing function of the label id. A class is one int64 key packing the local ids
(first QI most significant) with the SA code as the lowest digit. Generalising one QI by
one level from a node already evaluated (``Evaluator.rollup``) then rewrites one digit of
the sorted cell keys; the result consists of sorted runs that a stable (run-aware) sort
merges in near-linear time. Work is proportional to the number of cells of the
predecessor, which shrinks quickly towards the top of the lattice. A node evaluated
without a cached specialisation is counted from the rows of a base (``anonymity.bases``:
the summary regrouped once at the levels of the two QIs with the most values, so a node
at zip level 3 is counted from the rows at zip level 3, far fewer than the summary's;
with privacy units every base, the root one included, merges the rows of the persons of
one QI tuple per (QI tuple, SA), so (QI, SA, person) rows never reach a node's count),
with a dense ``bincount`` when its key space is small (most nodes above the bottom),
else sorted. When the packed key space would not fit in
63 bits (many QIs with large domains), classes are grouped from the summary rows column
by column instead (slower, same result; ``Evaluator(packed=False)`` forces it).

Recoding a batch of rows (next step of the pipeline): encode each QI with its hierarchy,
``EquivalenceClasses.classify`` the raw codes, and suppress the records whose class is
marked in ``Assessment.suppressed``; generalise the others with
``Hierarchy.generalize(codes, level)``.

Privacy units: when the summary carries unit codes (``Summary.unit_codes``), a class's
size for the models is its number of distinct persons, and a cell's count the number of
distinct persons of the class with that SA value (a person with several SA values in a
class counts once for each of them). ``Evaluator.in_units`` gives that view of any
classes. Person counts are never summed from a finer node (one person's rows can merge
into one class); instead each node carries, per cell, the rows of persons with a single
summary row (summed: they cannot repeat) and the distinct (cell, person) pairs of
persons with several rows (``multi_pairs``), which a roll-up maps to the coarser cells
and de-duplicates again; the view counts persons from those.

``Evaluator.rollup_to`` rolls classes up to any generalisation of their node (several
QIs, several levels) by rewriting digits of the cell keys and regrouping them: the
optimal search uses it from the cached node with the fewest cells below the node.

Rows stay the unit of the suppression limit and of the utility metrics.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.arrays import one_value_each, sorted_unique
from privpipe.anonymity.bases import (
    Base,
    cell_sums,
    code_dtype,
    decode,
    regroup,
)
from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.lattice import Lattice, Node
from privpipe.anonymity.summary import Hierarchies, Summary, group_rows, resolve_hierarchies
from privpipe.errors import ConfigError, InputDataError

__all__ = ["EquivalenceClasses", "Evaluator", "QIArrays", "count_units", "describe_node"]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
CodeArray: TypeAlias = npt.NDArray[np.unsignedinteger[Any]]
"""Per-summary-row ids in the smallest unsigned dtype that holds them (one array per QI and
level is cached; int64 would take 8 bytes per distinct tuple each). Promote to int64
(``np.multiply(..., dtype=np.int64)``) before any arithmetic."""

_KEY_LIMIT: Final = 1 << 62
DENSE_FACTOR: Final = 8
"""A node is counted from the summary rows (or a base's rows) without hashing when its key
space is at most this many times the number of rows (a flag array of that many bytes and
an int32 index per key), or ``WIDE_FACTOR`` times while that stays within ``DENSE_KEYS``."""
WIDE_FACTOR: Final = 32
DENSE_KEYS: Final = 1 << 24
"""Measured on 100k-400k codes (numpy 2.4): the flag array takes 1.2-12 ms at 32 keys per
row against 2.4-14 ms hashing; above 64 keys per row hashing wins."""
BASE_QIS: Final = 2
"""Bases (``anonymity.bases``) are keyed by the levels of this many QIs: those with the
most values present in the summary (they make summary rows distinct)."""
BASE_BYTES: Final = 128 << 20
"""Bytes of bases kept per evaluator (the summary's own rows and the root not counted),
or ``BASE_SHARE`` times the root's bytes when that is more: once full, no more bases are
built (none is evicted, it would be rebuilt)."""
BASE_SHARE: Final = 4
"""The bases' budget in root bases (``BASE_BYTES``), so it grows with the data. Measured
on the 10M demo's t=0.3 search (root 4.0M rows, 122 MB): a budget of 128 MB took 156.5 s,
256 MB 148 s, 384 MB 130 s, 512 MB 122.5 s, 1 GB 122.7 s, at a peak RSS of that process
of 2.19, 2.32, 2.44, 2.57 and 2.88 GB: with 128 MB most blocks were counted from the root,
as no base of zip or age at level 0 fitted. At 1M (root 17 MB) the budget stays 128 MB."""
JOINT_SPACE: Final = 1 << 16
"""The SA and the QIs outside the bases (at level 0 in every base) with the fewest values
are coded jointly, one id per row, while their combinations number at most this: a row's
code at a node is then one lookup in a table over the combinations (built per node, a few
hundred KB at most) instead of one multiply-add per QI."""
BLOCKS: Final = 128
"""The most blocks a node's rows are cut into when it may fail before all are counted
(``Evaluator.classes_by_block``, ``BLOCK_ROWS``)."""
BLOCK_ROWS: Final = 2_048
"""A base of n rows is cut into ``isqrt(n // BLOCK_ROWS)`` blocks (at most ``BLOCKS``; not
at all below two): each block costs a fixed ~0.3-0.5 ms, and a refused node counts on
average half a block past the rows that refuse it, so the cheapest count grows with the
square root of the rows. Measured on the demo's t=0.3 search (saved plans, the two
variants run side by side, benchmarks/RESULTS.md, twenty-fifth round): at 1M a fixed 16
blocks took 22.3-23.4 s against 23.7-27.3 s for 4; at 10M (root 4.0M rows) 32 and 64
blocks 96.0 and 93.1 s against 125.8 s for 4 and 100.9 s for 16; the square root matched
the best fixed count at both (1M 21.1 and 23.6 s against 22.8 and 23.1 s for 16; 10M
100.5 s against 99.2 s for 64). Before, a base was cut only from 4 * 16,384 rows, into 4
blocks: more blocks then left the mid-sized bases uncut and were slower."""
NODE_TABLES: Final = 2
"""Nodes whose joint-coding and key-packing tables are kept (the blocks of one node, and
the node its search checks next, share them): a joint table has ``JOINT_SPACE`` entries
at most, a packing two of about the square root of the node's key space."""
BASE_GAIN: Final = 0.9
"""A base is kept only when it has at most this share of the rows of the base it was
regrouped from (else that base serves its nodes)."""


@dataclass(frozen=True, eq=False)
class QIArrays:
    """Per-QI arrays over the raw values present in the summary (see module docstring).

    Local label ids number, per level, the labels of the present values in tree order;
    ``to_global`` maps them to the hierarchy's label ids (``Hierarchy.label_ids``).
    """

    hierarchy: Hierarchy
    present: IntArray  # raw codes present in the summary, sorted
    row_index: CodeArray  # per summary row: index into ``present``
    local: tuple[IntArray, ...]  # per level: local label id per present value
    to_global: tuple[IntArray, ...]  # per level: hierarchy label id per local label id
    up: tuple[IntArray, ...]  # per level < top: local id at level+1 per local id at level
    identity: tuple[bool, ...]  # per level < top: level+1 groups exactly like level
    leaves: tuple[IntArray, ...]  # per level: raw values of the hierarchy under each label
    label_counts: tuple[IntArray, ...]  # per level: records per local label
    value_counts: IntArray  # records per present value

    @property
    def radix(self) -> int:
        return int(self.present.shape[0])

    def n_labels(self, level: int) -> int:
        return int(self.to_global[level].shape[0])


def _build_qi(hierarchy: Hierarchy, codes: IntArray, counts: IntArray) -> QIArrays:
    # raw codes are small (0 <= code < domain, checked by the caller): the present ones
    # and each row's index among them by counting, not by sorting the rows
    seen = np.bincount(codes, minlength=hierarchy.domain_size)
    present = np.flatnonzero(seen).astype(np.int64)
    position = np.zeros(seen.shape[0], dtype=code_dtype(present.shape[0]))
    position[present] = np.arange(present.shape[0])
    row_index = position[codes]
    ids = [hierarchy.label_ids(level)[present] for level in range(hierarchy.levels)]
    order = np.lexsort(tuple(ids))  # last key (the top level) is the primary one
    value_counts = np.bincount(row_index, weights=counts, minlength=present.shape[0])
    value_counts = np.rint(value_counts).astype(np.int64)
    local, to_global, leaves, label_counts = [], [], [], []
    for level in range(hierarchy.levels):
        sequence = ids[level][order]
        change = np.empty(sequence.shape[0], dtype=bool)
        change[:1] = True
        np.not_equal(sequence[1:], sequence[:-1], out=change[1:])
        local_sorted = np.cumsum(change) - 1
        ids_local = np.empty_like(local_sorted)
        ids_local[order] = local_sorted
        globals_ = sequence[change]
        local.append(ids_local.astype(np.int64))
        to_global.append(globals_.astype(np.int64))
        all_leaves = np.bincount(hierarchy.label_ids(level))
        leaves.append(all_leaves[globals_].astype(np.int64))
        per_label = np.bincount(ids_local, weights=value_counts, minlength=globals_.shape[0])
        label_counts.append(np.rint(per_label).astype(np.int64))
    up, identity = [], []
    for level in range(hierarchy.levels - 1):
        mapping = np.empty(to_global[level].shape[0], dtype=np.int64)
        mapping[local[level]] = local[level + 1]
        up.append(mapping)
        identity.append(bool(np.array_equal(mapping, np.arange(mapping.shape[0]))))
    return QIArrays(
        hierarchy,
        present,
        row_index,
        tuple(local),
        tuple(to_global),
        tuple(up),
        tuple(identity),
        tuple(leaves),
        tuple(label_counts),
        value_counts,
    )


class EquivalenceClasses:
    """The equivalence classes of one transformation of a summary.

    ``sizes[c]`` is the number of records of class ``c``. The class x SA counts are sparse
    "cells": ``cell_class`` (non-decreasing), ``cell_sa`` (increasing within a class; None
    without SA) and ``cell_count``. ``labels`` gives each class's hierarchy label id per QI
    (``hierarchy.label_names(level)[labels[:, j]]`` are the generalised values). Classes
    are ordered deterministically (by their local label ids), whatever path built them.
    """

    __slots__ = (
        "_cell_keys",
        "_class_keys",
        "_local",
        "_sa_p",
        "_units",
        "cell_class",
        "cell_count",
        "cell_first",
        "cell_sa",
        "cell_single",
        "evaluator",
        "in_units",
        "levels",
        "multi_pairs",
        "sizes",
    )

    def __init__(
        self,
        evaluator: Evaluator,
        levels: Node,
        sizes: IntArray,
        cell_class: IntArray,
        cell_sa: IntArray | None,
        cell_count: IntArray,
        *,
        cell_keys: IntArray | None = None,
        class_keys: IntArray | None = None,
        local_labels: IntArray | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.levels: Node = tuple(int(x) for x in levels)
        self.sizes = sizes
        self.cell_class = cell_class
        self.cell_sa = cell_sa
        self.cell_count = cell_count
        self._cell_keys = cell_keys
        self._class_keys = class_keys
        self._local = local_labels
        self._sa_p: FloatArray | None = None
        self._units: EquivalenceClasses | None = None
        # per cell: summary rows of persons with a single summary row (privacy units only;
        # carried through roll-ups so persons are recounted only from the other rows)
        self.cell_single: IntArray | None = None
        # per cell: persons of one QI tuple whose first summary row is in the cell (their
        # rows never split between classes, so a class's sum counts each of them once)
        self.cell_first: IntArray | None = None
        # sorted distinct (cell index * n_units + unit) of the summary rows of persons with
        # several rows (privacy units only): rolled up with the cells, so a node's persons
        # are counted from these pairs, never from all summary rows again
        self.multi_pairs: IntArray | None = None
        self.in_units = False  # True for the person-counted view (``Evaluator.in_units``)

    def __repr__(self) -> str:
        return (
            f"EquivalenceClasses(levels={self.levels}, classes={self.n_classes}, "
            f"cells={self.n_cells}, records={self.n_records})"
        )

    @property
    def n_classes(self) -> int:
        """Number of equivalence classes."""
        return int(self.sizes.shape[0])

    @property
    def n_cells(self) -> int:
        """Number of distinct (class, SA code) pairs (classes when there is no SA)."""
        return int(self.cell_count.shape[0])

    @property
    def n_records(self) -> int:
        """Number of records (all classes)."""
        return self.evaluator.n_records

    @property
    def sa_distribution(self) -> FloatArray | None:
        """p, the SA distribution of the whole table in this view's unit (t-closeness)."""
        return self._sa_p if self._sa_p is not None else self.evaluator.sa_distribution

    def sa_totals(self) -> IntArray:
        """Per class: the sum of its cell counts (the denominator of q_E). Equals
        ``sizes`` for records; for persons, a person with m SA values counts m times."""
        if not self.in_units:
            return self.sizes
        totals = np.bincount(self.cell_class, weights=self.cell_count, minlength=self.n_classes)
        return np.rint(totals).astype(np.int64)

    def local_labels(self, qi: int) -> IntArray:
        """Per class: the evaluator-local label id of QI ``qi`` (see ``Evaluator``)."""
        if self._local is not None:
            return self._local[:, qi]
        assert self._class_keys is not None
        ev = self.evaluator
        stride = ev.strides[qi] // ev.sa_radix
        return (self._class_keys // stride) % ev.radices[qi]

    @property
    def labels(self) -> IntArray:
        """(n_classes, n_qi) hierarchy label ids of each class at this node's levels."""
        ev = self.evaluator
        columns = [
            ev.qi_info(j).to_global[level][self.local_labels(j)]
            for j, level in enumerate(self.levels)
        ]
        return np.stack(columns, axis=1) if columns else np.zeros((self.n_classes, 0), np.int64)

    def label_frame(self) -> pd.DataFrame:
        """The generalised QI values of each class (one row per class) and its size."""
        ev = self.evaluator
        labels = self.labels
        data = {
            name: ev.hierarchies[j].label_names(level)[labels[:, j]]
            for j, (name, level) in enumerate(zip(ev.qi_names, self.levels, strict=True))
        }
        frame = pd.DataFrame(data)
        frame["size"] = self.sizes
        return frame

    def sa_matrix(self) -> IntArray:
        """Dense (n_classes, sa_domain) counts of SA codes per class (small data only)."""
        if self.cell_sa is None:
            raise ValueError("these classes were built without a sensitive attribute")
        out = np.zeros((self.n_classes, self.evaluator.sa_radix), dtype=np.int64)
        out[self.cell_class, self.cell_sa] = self.cell_count
        return out

    def class_starts(self) -> IntArray:
        """Index of each class's first cell."""
        return np.searchsorted(self.cell_class, np.arange(self.n_classes)).astype(np.int64)

    def row_classes(self, rows: IntArray | None = None) -> IntArray:
        """Class index of every summary row (rows of ``evaluator.summary``), or of ``rows``
        (positions among them) only; for ``rows``, -1 where a row's key is in no class (a
        node's classes hold every row: a -1 is an inconsistency for the caller to raise)."""
        ev = self.evaluator
        if self._class_keys is not None:
            keys = ev.row_class_keys(self.levels, rows)
            at = np.searchsorted(self._class_keys, keys).astype(np.int64)
            if rows is None:
                return at
            if self.n_classes == 0:
                return np.full(keys.shape[0], -1, dtype=np.int64)
            hit = self._class_keys[np.minimum(at, self.n_classes - 1)] == keys
            return np.where(hit, at, -1)
        _, every = ev.classes_with_rows(self.levels)
        return every if rows is None else every[rows]

    def classify(self, raw_codes: npt.ArrayLike) -> IntArray:
        """Class index of records given by raw QI codes (n, n_qi); -1 if in no class.

        For recoding a batch: ``Hierarchy.encode`` each QI column, stack, classify, then
        ``assessment.suppressed[index]`` says which records to suppress.
        """
        array = np.asarray(raw_codes, dtype=np.int64).reshape(-1, len(self.levels))
        columns = []
        for j, level in enumerate(self.levels):
            hierarchy = self.evaluator.hierarchies[j]
            ids = hierarchy.label_ids(level)
            column = array[:, j]
            valid = (column >= 0) & (column < hierarchy.domain_size)
            columns.append(np.where(valid, ids[np.where(valid, column, 0)], -1))
        return self.lookup(np.stack(columns, axis=1))

    def lookup(self, labels: npt.ArrayLike) -> IntArray:
        """Class index of each row of hierarchy label ids (n, n_qi) at this node; -1 if none."""
        ev = self.evaluator
        array = np.asarray(labels, dtype=np.int64).reshape(-1, len(self.levels))
        found = np.ones(array.shape[0], dtype=bool)
        local_columns = []
        for j, level in enumerate(self.levels):
            info = ev.qi_info(j)
            n_global = info.hierarchy.label_names(level).shape[0]
            to_local = np.full(n_global + 1, -1, dtype=np.int64)
            to_local[info.to_global[level]] = np.arange(info.n_labels(level))
            column = array[:, j]
            valid = (column >= 0) & (column < n_global)
            local = np.where(valid, to_local[np.where(valid, column, n_global)], -1)
            found &= local >= 0
            local_columns.append(np.where(local >= 0, local, 0))
        if self._class_keys is not None:
            if self.n_classes == 0:
                return np.full(array.shape[0], -1, dtype=np.int64)
            key = np.zeros(array.shape[0], dtype=np.int64)
            for j, column in enumerate(local_columns):
                key += column * (ev.strides[j] // ev.sa_radix)
            position = np.minimum(np.searchsorted(self._class_keys, key), self.n_classes - 1)
            hit = found & (self._class_keys[position] == key)
            return np.where(hit, position, -1).astype(np.int64)
        assert self._local is not None
        index = pd.MultiIndex.from_arrays([self._local[:, j] for j in range(len(self.levels))])
        query = pd.MultiIndex.from_arrays(local_columns)
        position = index.get_indexer(query)
        return np.where(found, position, -1).astype(np.int64)


class Evaluator:
    """Evaluates transformations of one summary (see the module docstring).

    ``hierarchies`` are those of the summary's QIs (by name or aligned). With
    ``use_sa=False`` (or a summary without SA) classes carry no SA cells, which is faster
    for models that only need class sizes. ``sa_distribution`` is the SA distribution
    of the whole table D (the global distribution p of t-closeness).
    """

    _UNIT_ARRAYS = (
        "n_units",
        "units",
        "_single",
        "_first",
        "_multi",
        "_single_rows",
        "_first_rows",
    )
    """What ``without_sa`` shares: the person arrays depend on the rows, not on the SA."""

    def __init__(
        self,
        summary: Summary,
        hierarchies: Hierarchies,
        *,
        use_sa: bool = True,
        packed: bool = True,
        _shared: tuple[QIArrays, ...] | None = None,
        _units_of: Evaluator | None = None,
    ) -> None:
        self.summary = summary
        self.hierarchies = resolve_hierarchies(summary.qi_names, hierarchies)
        if summary.n_records == 0:
            raise InputDataError("no records to anonymise: the input has no rows")
        for name, hierarchy, j in zip(
            summary.qi_names, self.hierarchies, range(summary.n_qi), strict=True
        ):
            top = int(summary.qi_codes[:, j].max())
            if top >= hierarchy.domain_size or (
                summary.qi_domains and summary.qi_domains[j] != hierarchy.domain_size
            ):
                raise ConfigError(
                    f"the summary of {name!r} was encoded with another hierarchy than the "
                    f"one given ({hierarchy.domain_size} raw values)"
                )
        self.use_sa = bool(use_sa and summary.sa_codes is not None)
        self._qi = _shared or tuple(
            _build_qi(h, summary.qi_codes[:, j], summary.counts)
            for j, h in enumerate(self.hierarchies)
        )
        self.sa_radix = summary.sa_domain if self.use_sa else 1
        self.sa_radix = max(self.sa_radix, 1)
        self.radices = tuple(max(info.radix, 1) for info in self._qi)
        strides = [0] * len(self.radices)
        stride = self.sa_radix
        for j in range(len(self.radices) - 1, -1, -1):
            strides[j] = stride
            stride *= self.radices[j]
        self.strides = tuple(strides)
        self.packed = bool(packed and stride < _KEY_LIMIT)
        self._row_sa = (
            summary.sa_codes
            if self.use_sa and summary.sa_codes is not None
            else np.zeros(summary.n_distinct, dtype=np.int64)
        )
        self._row_labels: dict[tuple[int, int], CodeArray] = {}
        self._tuple_index: tuple[IntArray, IntArray] | None = None
        # bases (``anonymity.bases``): keyed by the levels of the base QIs
        ranked = sorted(
            (j for j, h in enumerate(self.hierarchies) if h.height > 0),
            key=lambda j: (-self.radices[j], j),
        )
        self._base_qis = tuple(sorted(ranked[:BASE_QIS]))
        self._bases: dict[tuple[int, ...], Base] = {}  # never evicted: see BASE_BYTES
        self._no_gain: set[tuple[int, ...]] = set()
        self._base_bytes = 0
        self._base_budget = BASE_BYTES  # raised with the root (``BASE_SHARE``)
        self._summary_base: Base | None = None
        self._root_base: Base | None = None
        self._joint_sa, self._joint_qis, self._joint_space = self._joint_members()
        self._joint_digits: tuple[IntArray, list[IntArray]] | None = None
        # counts and singles packed in one weight (``_packed_weights``): the singles'
        # sums (at most one per summary row) above the record counts' bits, exact in
        # float64 while every packed sum is below 2^53; 0: not packed
        self._pack_shift = max(summary.n_records, 1).bit_length()
        if (summary.n_distinct + 1) << self._pack_shift >= 1 << 53:
            self._pack_shift = 0
        self._lift: dict[tuple[int, int, int, int], IntArray] = {}
        # the last nodes' tables, shared by the blocks of a node (``_joint_table``,
        # ``_packing``): at the 3M demo's t=0.3 search 45% of the key packings and 40%
        # of the joint tables are the previous block's node's (~1.4 s of ~50 s)
        self._joint_tables: OrderedDict[Node, IntArray] = OrderedDict()
        self._packings: OrderedDict[tuple[int, ...], tuple[int, IntArray, IntArray]] = OrderedDict()
        self._sizes_view: Evaluator | None = None  # ``class_sizes`` with SA cells
        self.sa_distribution: FloatArray | None = None
        if self.use_sa:
            self.sa_distribution = summary.sa_counts().astype(np.float64) / summary.n_records
        self.units: IntArray | None = None  # dense unit id per summary row
        # 1 for rows of persons whose rows all share one QI tuple ("simple" persons: at
        # every node all their rows are in one class, and each row is a distinct (cell,
        # person) pair, their SA values differing); _first: 1 for one row of each of them
        self._single: IntArray | None = None
        self._first: IntArray | None = None
        self._multi: IntArray = np.zeros(0, dtype=np.int64)  # the other rows
        self._single_rows: IntArray = np.zeros(0, dtype=np.int64)  # where _single is 1
        self._first_rows: IntArray = np.zeros(0, dtype=np.int64)  # where _first is 1
        self.n_units = summary.n_records
        self.unit_sa_distribution: FloatArray | None = None
        if _units_of is not None:  # the same summary's person arrays (``without_sa``)
            for name in self._UNIT_ARRAYS:
                setattr(self, name, getattr(_units_of, name))
        elif summary.unit_codes is not None:
            dense = summary.dense_units()
            self.n_units = max(dense.n_units, 1)
            # one record per person (persons == records): every count is already in
            # persons, so the classes are their own person view (no recount per node)
            if self.n_units < summary.n_records:
                self.units = dense.ids
                tuple_of_row, _ = self.qi_tuples()
                single = one_value_each(self.units, tuple_of_row, self.n_units)[self.units]
                first = np.zeros(summary.n_distinct, dtype=np.int64)
                first[dense.first_rows] = 1
                self._single = single.astype(np.int64)
                self._first = first * self._single
                self._multi = np.flatnonzero(~single).astype(np.int64)
                self._single_rows = np.flatnonzero(self._single).astype(np.int64)
                self._first_rows = np.flatnonzero(self._first).astype(np.int64)
            if self.units is not None and self.use_sa:
                persons = summary.sa_unit_counts()
                self.unit_sa_distribution = persons.astype(np.float64) / persons.sum()

    def __repr__(self) -> str:
        return (
            f"Evaluator(qis={self.qi_names}, sa={self.use_sa}, rows={self.summary.n_distinct}, "
            f"records={self.n_records}, packed={self.packed})"
        )

    # ----------------------------------------------------------------- facts

    @property
    def qi_names(self) -> tuple[str, ...]:
        """The QI names, in summary order."""
        return self.summary.qi_names

    @property
    def n_records(self) -> int:
        """|D|, the number of records."""
        return self.summary.n_records

    @property
    def heights(self) -> tuple[int, ...]:
        """Top level of each QI's hierarchy."""
        return tuple(h.height for h in self.hierarchies)

    @property
    def sa_domain(self) -> int:
        """Number of SA codes (1 without SA)."""
        return self.sa_radix

    def qi_info(self, qi: int) -> QIArrays:
        """Per-QI local arrays (internal to the package: metrics use them)."""
        return self._qi[qi]

    def lattice(
        self, min_levels: Sequence[int] | None = None, max_levels: Sequence[int] | None = None
    ) -> Lattice:
        """The lattice of this evaluator's hierarchies (optionally restricted)."""
        return Lattice.from_hierarchies(self.hierarchies, min_levels, max_levels, self.qi_names)

    def persons_per_tuple(self) -> IntArray | None:
        """Distinct persons of each QI tuple (``qi_tuples`` order) when every person's
        rows share one tuple, so that a class of tuples has their sum in persons; None
        when some person's rows have several tuples, or without units to count."""
        if self.units is None or self._first is None or self._multi.shape[0]:
            return None
        tuple_of_row, first = self.qi_tuples()
        n_tuples = first.shape[0]
        return np.bincount(tuple_of_row, weights=self._first, minlength=n_tuples).astype(np.int64)

    def without_sa(self) -> Evaluator:
        """The same evaluator without SA cells (shares the per-QI precomputation)."""
        if not self.use_sa:
            return self
        return Evaluator(
            self.summary,
            self.hierarchies,
            use_sa=False,
            packed=self.packed,
            _shared=self._qi,
            _units_of=self,
        )

    # ----------------------------------------------------------------- privacy units

    def _block_from_singles(
        self, classes: EquivalenceClasses, suppressed: BoolArray
    ) -> EquivalenceClasses:
        """``block`` from the carried single-row counts and the multi-row persons."""
        assert self.units is not None and classes.cell_single is not None
        cells = suppressed[classes.cell_class]
        pairs = classes.multi_pairs
        if pairs is not None:
            pair_cell = pairs // self.n_units
            kept = cells[pair_cell]
            units = (pairs - pair_cell * self.n_units)[kept]
            pair_sa = None if classes.cell_sa is None else classes.cell_sa[pair_cell[kept]]
        else:
            rows = self._multi[suppressed[self._multi_row_classes(classes)]]
            units = self.units[rows]
            pair_sa = self._row_sa[rows]
        assert classes.cell_first is not None
        n_persons = int(classes.cell_first[cells].sum()) + int(np.unique(units).shape[0])
        size = np.array([n_persons], dtype=np.int64)
        if classes.cell_sa is None:
            block = EquivalenceClasses(
                self, classes.levels, size, np.zeros(1, np.int64), None, size
            )
        else:
            radix = self.n_units
            per_sa = np.bincount(
                classes.cell_sa[cells], weights=classes.cell_single[cells], minlength=self.sa_radix
            )
            per_sa = np.rint(per_sa).astype(np.int64)
            assert pair_sa is not None
            per_sa += _distinct_per_group(pair_sa, units, radix, self.sa_radix)
            present = np.flatnonzero(per_sa)
            zeros = np.zeros(present.shape[0], dtype=np.int64)
            block = EquivalenceClasses(
                self, classes.levels, size, zeros, present.astype(np.int64), per_sa[present]
            )
        block.in_units = True
        block._sa_p = self.unit_sa_distribution
        return block

    def in_units(self, classes: EquivalenceClasses) -> EquivalenceClasses:
        """``classes`` counted in persons (module docstring); the classes themselves when
        the summary has no privacy unit. Cached on ``classes``."""
        if self.units is None or classes.in_units:
            return classes
        if classes._units is None:
            if (
                classes.cell_single is not None
                and classes.cell_first is not None
                and classes._class_keys is not None
            ):
                view = self._units_from_singles(classes)
            else:
                view = count_units(
                    classes, classes.row_classes(), self._row_sa, self.units, self.n_units
                )
            view._sa_p = self.unit_sa_distribution
            classes._units = view
        return classes._units

    def _multi_row_classes(self, classes: EquivalenceClasses) -> IntArray:
        """Class index of the summary rows of persons with several rows (packed mode)."""
        assert classes._class_keys is not None
        return classes.row_classes(self._multi)

    def _units_from_pairs(self, classes: EquivalenceClasses, pairs: IntArray) -> EquivalenceClasses:
        """The person view from the carried single-row counts and the carried distinct
        (cell, person) pairs of persons with several rows."""
        assert classes.cell_single is not None and classes.cell_first is not None
        radix = self.n_units
        cell = pairs // radix
        if classes.cell_sa is None:  # the cells are the classes
            cell_count = classes.cell_first + np.bincount(cell, minlength=classes.n_cells)
            persons = cell_count
        else:
            cell_count = classes.cell_single + np.bincount(cell, minlength=classes.n_cells)
            persons = np.bincount(
                classes.cell_class, weights=classes.cell_first, minlength=classes.n_classes
            )
            persons = np.rint(persons).astype(np.int64)
            persons += _distinct_per_group(
                classes.cell_class[cell], pairs - cell * radix, radix, classes.n_classes
            )
        view = EquivalenceClasses(
            self,
            classes.levels,
            persons.astype(np.int64, copy=False),
            classes.cell_class,
            classes.cell_sa,
            cell_count.astype(np.int64, copy=False),
            cell_keys=classes._cell_keys,
            class_keys=classes._class_keys,
            local_labels=classes._local,
        )
        view.in_units = True
        return view

    def _units_from_singles(self, classes: EquivalenceClasses) -> EquivalenceClasses:
        """The person view from the carried single-row counts plus distinct persons among
        the rows of persons with several rows (the only ones that can repeat a person)."""
        assert self.units is not None and classes.cell_single is not None
        radix = self.n_units
        if classes.multi_pairs is not None:
            return self._units_from_pairs(classes, classes.multi_pairs)
        rows = self._multi
        row_class = self._multi_row_classes(classes)
        units = self.units[rows]
        singles = classes.cell_single
        assert classes.cell_first is not None
        persons = np.bincount(
            classes.cell_class, weights=classes.cell_first, minlength=classes.n_classes
        )
        persons = np.rint(persons).astype(np.int64)
        persons += _distinct_per_group(row_class, units, radix, classes.n_classes)
        if classes.cell_sa is None:
            cell_count = persons
        else:
            sa_radix = self.sa_radix
            cell_key = classes.cell_class * sa_radix + classes.cell_sa
            index = np.searchsorted(cell_key, row_class * sa_radix + self._row_sa[rows])
            cell_count = singles + _distinct_per_group(index, units, radix, classes.n_cells)
        view = EquivalenceClasses(
            self,
            classes.levels,
            persons,
            classes.cell_class,
            classes.cell_sa,
            cell_count.astype(np.int64),
            cell_keys=classes._cell_keys,
            class_keys=classes._class_keys,
            local_labels=classes._local,
        )
        view.in_units = True
        return view

    def block(self, classes: EquivalenceClasses, suppressed: BoolArray) -> EquivalenceClasses:
        """The suppressed records as one class (an attacker who finds no kept class for a
        target knows it is among them), counted in this evaluator's unit."""
        node = classes.levels
        if self.units is None:
            mask = suppressed[classes.cell_class]
            if classes.cell_sa is None:
                total = np.array([int(classes.sizes[suppressed].sum())], dtype=np.int64)
                return EquivalenceClasses(self, node, total, np.zeros(1, np.int64), None, total)
            tally = np.bincount(
                classes.cell_sa[mask], weights=classes.cell_count[mask], minlength=self.sa_radix
            )
            present = np.flatnonzero(tally)
            counts = np.rint(tally[present]).astype(np.int64)
            size = np.array([int(counts.sum())], dtype=np.int64)
            zeros = np.zeros(present.shape[0], dtype=np.int64)
            return EquivalenceClasses(self, node, size, zeros, present.astype(np.int64), counts)
        if (
            classes.cell_single is not None
            and classes.cell_first is not None
            and classes._class_keys is not None
        ):
            return self._block_from_singles(classes, suppressed)
        rows = suppressed[classes.row_classes()]
        one = np.zeros(int(rows.sum()), dtype=np.int64)
        whole = EquivalenceClasses(
            self,
            node,
            np.array([0], dtype=np.int64),
            np.zeros(0, np.int64),
            None if not self.use_sa else np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )
        sa = self._row_sa[rows]
        if self.use_sa:
            present = np.unique(sa)
            whole.cell_class = np.zeros(present.shape[0], dtype=np.int64)
            whole.cell_sa = present.astype(np.int64)
            whole.cell_count = np.zeros(present.shape[0], dtype=np.int64)  # counted below
        else:
            whole.cell_class = np.zeros(1, dtype=np.int64)
            whole.cell_count = np.zeros(1, dtype=np.int64)
        view = count_units(whole, one, sa, self.units[rows], self.n_units)
        view._sa_p = self.unit_sa_distribution
        return view

    # ----------------------------------------------------------------- evaluation

    def classes(self, levels: Sequence[int]) -> EquivalenceClasses:
        """Equivalence classes of the transformation ``levels``, counted from the rows of
        the smallest base below it (``anonymity.bases``; the summary rows at worst)."""
        node = self._check(levels)
        if not self.packed:
            classes, _ = self.classes_with_rows(node)
            return classes
        return self._count(self._base_for(node), node)

    def classes_by_block(
        self, levels: Sequence[int]
    ) -> Iterator[tuple[int, EquivalenceClasses]] | None:
        """The classes of ``levels`` block by block (block index, its classes), the
        largest block first (``joined`` makes the node's classes of them): the rows of
        the base it is counted from (``classes``) cut into up to ``BLOCKS`` ranges of the
        first QI's labels at its level (``_block_cuts``). A class never spans two labels
        of a QI, so each block's classes are whole classes of the node, and what a model
        finds in them (records in violating classes) adds up over the blocks to what it
        finds in the node: a node needing more suppression than allowed can be refused
        before all its rows are counted. None when the node cannot be cut so: the first
        QI has one label there (its top), some person has rows in several QI tuples
        (``base.multi``), the rows are not in the first QI's order, or there are fewer
        than 4 * ``BLOCK_ROWS`` rows."""
        node = self._check(levels)
        if not self.packed or not node:
            return None
        base = self._base_for(node)
        cuts = self._block_cuts(base, node[0])
        if cuts is None:
            return None
        sizes = np.diff(cuts)
        order = np.argsort(-sizes, kind="stable").tolist()
        return ((b, self._count(base, node, slice(int(cuts[b]), int(cuts[b + 1])))) for b in order)

    def joined(self, parts: Sequence[EquivalenceClasses]) -> EquivalenceClasses:
        """The classes of a node from the classes of all its blocks in block order
        (``classes_by_block``): the same as ``classes`` gives, as the blocks hold
        increasing ranges of the first QI, the most significant digit of the cell keys."""
        node = parts[0].levels
        keys = [part._cell_keys for part in parts]
        if any(key is None for key in keys):
            raise ValueError("joined needs packed classes (from classes_by_block)")
        counts = np.concatenate([part.cell_count for part in parts])

        def carried(name: str) -> IntArray | None:
            arrays = [getattr(part, name) for part in parts]
            return None if arrays[0] is None else np.concatenate(arrays)

        pairs = None if parts[0].multi_pairs is None else np.zeros(0, dtype=np.int64)
        return self._from_cells(
            node,
            np.concatenate(keys),  # type: ignore[arg-type]
            counts,
            carried("cell_single"),
            pairs,  # blocks are only cut without persons of several rows: no pairs
            carried("cell_first"),
        )

    def class_sizes(self, levels: Sequence[int]) -> tuple[IntArray, IntArray] | None:
        """Per class of ``levels``, in no particular order: its records and its persons
        (its records without a privacy unit), without cells or person view: what
        k-anonymity needs, several times cheaper. With SA cells they are counted by this
        evaluator's view without them (``without_sa``, kept): its bases merge the rows
        that differ only in the SA (at the 1M demo's t=0.3 search 4 times fewer rows, 3
        times faster). None when some person has several QI tuples (``base.multi``):
        persons are summed from the rows' first-row weights."""
        node = self._check(levels)
        if not self.packed or not node:
            return None
        if self.use_sa:
            if self._sizes_view is None:
                self._sizes_view = self.without_sa()
            return self._sizes_view.class_sizes(node)
        base = self._base_for(node)
        if base.multi.shape[0]:
            return None
        codes, _, stride = self._codes(base, node)
        weights = [base.counts] if base.first is None else [base.counts, base.first]
        sums = cell_sums(codes, max(stride, 1), weights, _dense_limit(base.n_rows))[1]
        del codes
        records = np.rint(sums[0]).astype(np.int64)
        if base.first is None:
            return records, records
        return records, np.rint(sums[1]).astype(np.int64)

    def n_blocks(self, levels: Sequence[int]) -> int:
        """Blocks ``classes_by_block`` cuts the node into (0: it is not cut)."""
        node = self._check(levels)
        if not self.packed or not node:
            return 0
        cuts = self._block_cuts(self._base_for(node), node[0])
        return 0 if cuts is None else int(cuts.shape[0]) - 1

    def _block_cuts(self, base: Base, level: int) -> IntArray | None:
        """Row positions cutting ``base`` into about equal ranges at changes of the first
        QI's label at ``level``, as many as ``BLOCK_ROWS`` gives (cached with the base);
        None when it cannot be cut (``classes_by_block``)."""
        if level in base.blocks:
            return base.blocks[level]
        cuts: IntArray | None = None
        n_labels = self._qi[0].n_labels(level)
        n_rows = base.n_rows
        n_blocks = min(BLOCKS, math.isqrt(n_rows // BLOCK_ROWS))
        if n_labels >= 2 and not base.multi.shape[0] and n_blocks >= 2:
            labels = self._base_labels(base, 0, level)
            if bool(np.all(labels[1:] >= labels[:-1])):
                bounds = np.searchsorted(labels, np.arange(n_labels + 1))
                targets = np.linspace(0, n_rows, n_blocks + 1)[1:-1]
                inner = bounds[np.minimum(np.searchsorted(bounds, targets), n_labels)]
                found = sorted_unique(np.concatenate([[0], inner, [n_rows]]).astype(np.int64))
                cuts = found if found.shape[0] > 2 else None  # one block gains nothing
        base.blocks[level] = cuts
        return cuts

    def _count(self, base: Base, node: Node, rows: slice | None = None) -> EquivalenceClasses:
        """Classes of ``node`` from the rows of ``base`` (a specialisation of ``node``):
        the rows' dense codes at ``node``, their weights summed per cell
        (``bases.cell_sums``: over the key space when it is small, else through each
        row's cell index). ``rows``: a block of ``base`` in the first QI's order
        (``classes_by_block``), base.multi empty."""
        part = slice(None) if rows is None else rows
        codes, radices, stride = self._codes(base, node, rows)
        n_rows = int(codes.shape[0])
        offset, space = 0, stride
        if rows is not None and n_rows:
            # the block's rows hold a range of the first QI's labels, the codes' most
            # significant digit: group within that range only
            digit = stride // radices[0]
            offset = int(codes[0]) // digit * digit
            space = (int(codes[-1]) // digit + 1) * digit - offset
            codes -= offset
        packed = self._packed_weights(base, rows)
        weights = [base.counts[part] if packed is None else packed]
        if packed is None and base.singles is not None:
            weights.append(base.singles[part])
        if base.first is not None:
            weights.append(base.first[part])
        # every base row holds a record or more: a cell is present exactly when its count is
        present, sums, inverse = cell_sums(codes, space, weights, _dense_limit(n_rows))
        if inverse is None:  # summed over the key space: the cells of the rows needed
            multi_cells = np.searchsorted(present, codes[base.multi])
        else:
            multi_cells = inverse[base.multi]
        if offset:
            present += offset
        del codes
        keys = self._packed(present, radices)
        n_cells = keys.shape[0]
        summed = [np.rint(s).astype(np.int64) for s in sums]
        singles = first = pairs = None
        if packed is not None:  # one pass for counts and singles
            singles = summed[0] >> self._pack_shift
            counts = summed[0] & ((1 << self._pack_shift) - 1)
        else:
            counts = summed[0]
            if base.singles is not None:
                singles = summed[1]
        if base.first is not None:
            first = summed[-1]
        if self._single is not None:
            pairs = self._pairs_from(multi_cells, base.units, n_cells)
        return self._from_cells(node, keys, counts, singles, pairs, first)

    def _codes(
        self, base: Base, node: Node, rows: slice | None = None
    ) -> tuple[IntArray, tuple[int, ...], int]:
        """Dense code of every row of ``base`` (or of ``rows`` of it) at ``node`` (first
        QI most significant, SA the lowest digit), the number of labels of each QI there,
        and the key space. The jointly coded QIs and SA (``JOINT_SPACE``) add one lookup
        per row."""
        part = slice(None) if rows is None else rows
        n_rows = len(range(*part.indices(base.n_rows)))
        radices = tuple(self._qi[j].n_labels(level) for j, level in enumerate(node))
        strides = [0] * len(node)
        stride = self.sa_radix
        for j in range(len(node) - 1, -1, -1):
            strides[j] = stride
            stride *= radices[j]
        joint = self._joint_table(node, strides)
        if joint is not None:
            codes = joint[self._joint_ids(base, rows)]
        else:
            codes = np.zeros(n_rows, dtype=np.int64)
        if base.sa is not None and not (joint is not None and self._joint_sa):
            codes += base.sa[part]
        scaled = np.empty(n_rows, dtype=np.int64)
        for j in range(len(node) - 1, -1, -1):
            if radices[j] == 1 or (joint is not None and j in self._joint_qis):
                continue  # one label (the top, "*"): its digit is 0 in every row
            labels = self._base_labels(base, j, node[j], rows)
            np.multiply(labels, strides[j], out=scaled, dtype=np.int64)
            codes += scaled
        return codes, radices, stride

    def _packed_weights(self, base: Base, rows: slice | None = None) -> FloatArray | None:
        """Per row of ``base`` (or of ``rows`` of it): its ``counts`` plus its ``singles``
        shifted above every record count (``_pack_shift``), so one sum per cell gives
        both, exactly (None without singles or when the packed sums could reach 2^53).
        Cached with the base, for all its rows, while the bases' bytes stay within
        ``BASE_BYTES``."""
        if base.singles is None or self._pack_shift == 0:
            return None
        if base.packed:
            return base.packed[0] if rows is None else base.packed[0][rows]
        part = slice(None) if rows is None else rows
        shift = float(1 << self._pack_shift)
        packed = np.multiply(base.singles[part], shift, dtype=np.float64)
        packed += base.counts[part]
        if rows is not None:  # a block: not cached
            return packed
        if self._keep(base, packed.nbytes):
            base.packed.append(packed)
        return packed

    def _keep(self, base: Base, nbytes: int) -> bool:
        """Whether an array of ``nbytes`` derived from ``base`` is cached with it: always
        with the summary's own rows, with a kept base while ``BASE_BYTES`` allow (counted
        there)."""
        if base is self._summary_base or base is self._root_base:
            return True
        kept = self._bases.get(tuple(base.levels[j] for j in self._base_qis)) is base
        if kept and self._base_bytes + nbytes <= self._base_budget:
            self._base_bytes += nbytes
            return True
        return False

    def _joint_members(self) -> tuple[bool, tuple[int, ...], int]:
        """Whether the SA is coded jointly, the QIs coded jointly (``JOINT_SPACE``) and
        the number of their combinations; no QI when fewer than two digits would be."""
        space = self.sa_radix if self.use_sa else 1
        others = sorted(
            (j for j in range(len(self._qi)) if j not in self._base_qis),
            key=lambda j: (self._qi[j].n_labels(0), j),
        )
        members: list[int] = []
        for j in others:
            if space * self._qi[j].n_labels(0) > JOINT_SPACE:
                break
            space *= self._qi[j].n_labels(0)
            members.append(j)
        if len(members) + self.use_sa < 2 or not members:
            return False, (), 1
        return self.use_sa, tuple(sorted(members)), space

    def _joint_ids(self, base: Base, rows: slice | None = None) -> npt.NDArray[np.integer[Any]]:
        """Per row of ``base`` (or of ``rows`` of it): the joint id of its labels of the
        jointly coded QIs (at level 0 in every base) and SA, the last QI then the SA least
        significant (cached with the base, for all its rows, while the bases' bytes stay
        within ``BASE_BYTES``)."""
        if base.joint:
            return base.joint[0] if rows is None else base.joint[0][rows]
        part = slice(None) if rows is None else rows
        ids = np.zeros(len(range(*part.indices(base.n_rows))), dtype=np.int64)
        stride = 1
        if self._joint_sa and base.sa is not None:
            ids += base.sa[part]
            stride = self.sa_radix
        for j in reversed(self._joint_qis):
            if base.levels[j] != 0:
                raise ValueError(f"jointly coded QI {j} is at level {base.levels[j]} in a base")
            ids += np.multiply(base.labels[j][part], stride, dtype=np.int64)
            stride *= self._qi[j].n_labels(0)
        compact = ids.astype(code_dtype(self._joint_space))
        if rows is not None:  # a block: not cached
            return compact
        if self._keep(base, compact.nbytes):
            base.joint.append(compact)
        return compact

    def _joint_table(self, node: Node, strides: Sequence[int]) -> IntArray | None:
        """Per joint id (``_joint_ids``): the sum of its QIs' label ids at ``node`` times
        their ``strides`` (plus its SA code); None without joint coding. The last
        ``NODE_TABLES`` nodes' tables are kept (``strides`` follow from ``node``)."""
        if not self._joint_qis:
            return None
        return _kept(self._joint_tables, node, lambda: self._build_joint_table(node, strides))

    def _build_joint_table(self, node: Node, strides: Sequence[int]) -> IntArray:
        """``_joint_table`` built anew."""
        if self._joint_digits is None:
            radices = tuple(self._qi[j].n_labels(0) for j in self._joint_qis)
            ids = np.arange(self._joint_space, dtype=np.int64)
            digits, sa = decode(ids, radices, self.sa_radix if self._joint_sa else 1)
            self._joint_digits = (sa, digits)
        sa, digits = self._joint_digits
        table = sa.copy() if self._joint_sa else np.zeros(self._joint_space, dtype=np.int64)
        for j, digit in zip(self._joint_qis, digits, strict=True):
            table += self._lift_table(j, 0, node[j], strides[j])[digit]
        return table

    def _base_labels(
        self, base: Base, qi: int, level: int, rows: slice | None = None
    ) -> npt.NDArray[np.integer[Any]]:
        """Per row of ``base`` (or of ``rows`` of it): the local label id of QI ``qi`` at
        ``level`` (compact; cached with the base, for all its rows, while the bases' bytes
        stay within ``BASE_BYTES``)."""
        part = slice(None) if rows is None else rows
        if base is self._summary_base:
            return self._labels_of_rows(qi, level)[part]
        start = base.levels[qi]
        if level == start:
            return base.labels[qi][part]
        cached = base.lifted.get((qi, level))
        if cached is not None:
            return cached[part]
        info = self._qi[qi]
        table = self._lift_table(qi, start, level, 1).astype(code_dtype(info.n_labels(level)))
        if rows is not None:  # a block: lifted for its rows only, not cached
            return table[base.labels[qi][rows]]
        lifted = table[base.labels[qi]]
        if self._keep(base, lifted.nbytes):
            base.lifted[(qi, level)] = lifted
        return lifted

    def _packed(self, codes: IntArray, radices: tuple[int, ...]) -> IntArray:
        """Packed cell keys (``strides``) of dense codes at a node with ``radices``: the
        codes split at a QI into a high and a low part, each decoded once into a table
        (``_packing``, about the square root of the key space each, kept for the last
        ``NODE_TABLES`` nodes) instead of every code digit by digit."""
        low_space, high, low = _kept(self._packings, radices, lambda: self._packing(radices))
        if high.shape[0] == 1:
            return low[codes]
        quotient, remainder = np.divmod(codes, low_space)
        return high[quotient] + low[remainder]

    def _packing(self, radices: tuple[int, ...]) -> tuple[int, IntArray, IntArray]:
        """The tables of ``_packed`` at a node with ``radices``: the low part's size and
        the packed keys of every high and every low part."""
        n_qi = len(radices)
        low_space = self.sa_radix
        split = n_qi
        total = self.sa_radix * math.prod(radices)
        while split > 0 and low_space * low_space < total:
            split -= 1
            low_space *= radices[split]
        digits, sa = decode(np.arange(low_space, dtype=np.int64), radices[split:], self.sa_radix)
        low = sa
        for j, digit in zip(range(split, n_qi), digits, strict=True):
            low += digit * self.strides[j]
        high_space = total // low_space
        high = np.zeros(high_space, dtype=np.int64)
        if split:
            digits, _ = decode(np.arange(high_space, dtype=np.int64), radices[:split], 1)
            for j, digit in enumerate(digits):
                high += digit * self.strides[j]
        return low_space, high, low

    def _lift_table(self, qi: int, start: int, level: int, stride: int) -> IntArray:
        """Per local label id of QI ``qi`` at ``start``: its local id at ``level`` times
        ``stride`` (cached: a few hundred entries)."""
        key = (qi, start, level, stride)
        table = self._lift.get(key)
        if table is None:
            info = self._qi[qi]
            mapping = np.arange(info.n_labels(start), dtype=np.int64)
            for step in range(start, level):
                mapping = info.up[step][mapping]
            table = mapping * stride
            self._lift[key] = table
        return table

    def _pairs_from(
        self, multi_cells: npt.NDArray[Any], units: IntArray, n_cells: int
    ) -> IntArray | None:
        """Distinct (cell index, person) of the rows of persons with several rows, packed
        (None when the packed pairs could overflow int64: persons are then recounted)."""
        if n_cells * self.n_units >= _KEY_LIMIT:
            return None
        return sorted_unique(multi_cells.astype(np.int64) * self.n_units + units)

    def _base_of_summary(self) -> Base:
        """The summary rows as a base (every QI at level 0)."""
        if self._summary_base is None:
            n_qi = len(self._qi)
            dtype = np.dtype(np.float64)  # no conversion per count
            singles = None if self._single is None else self._single.astype(dtype)
            first = None if self._first is None else self._first.astype(dtype)
            units = self._multi if self.units is None else self.units[self._multi]
            self._summary_base = Base(
                (0,) * n_qi,
                tuple(self._labels_of_rows(j, 0) for j in range(n_qi)),
                self._row_sa if self.use_sa else None,
                self.summary.counts.astype(dtype),
                singles,
                first,
                self._multi,
                units.astype(np.int64, copy=False),
            )
        return self._summary_base

    def _regrouped(self, base: Base, levels: Node) -> Base | None:
        """``base`` regrouped at ``levels`` (``bases.regroup``); None when its (cell,
        person) pairs could not be packed in int64."""
        if base.multi.shape[0] and base.n_rows * self.n_units >= _KEY_LIMIT:
            return None
        codes, radices, space = self._codes(base, levels)
        dense_limit = _dense_limit(base.n_rows)
        return regroup(
            base, levels, codes, space, radices, self.sa_radix, self.n_units, dense_limit
        )

    def _root(self) -> Base:
        """The base every node can be counted from: with privacy units, the summary rows
        merged per (QI tuple, SA) for the simple persons (``anonymity.bases``; at 10M demo
        rows 6.8M (QI, SA, person) rows become 4.0M), when that saves at least
        ``1 - BASE_GAIN`` of them; else the summary rows themselves. Always kept."""
        if self._root_base is None:
            rows = self._base_of_summary()
            self._root_base = rows
            if self.summary.has_units:
                merged = self._regrouped(rows, (0,) * len(self._qi))
                if merged is not None and merged.n_rows <= BASE_GAIN * rows.n_rows:
                    self._root_base = merged
                    self._summary_base = None  # its weights are not needed again
            self._base_budget = max(BASE_BYTES, BASE_SHARE * self._root_base.nbytes)
        return self._root_base

    def _base_for(self, node: Node) -> Base:
        """The base with the fewest rows below ``node``. The base of ``node``'s levels of
        the base QIs is regrouped (once) from the best one there is, and kept when it
        has at most ``BASE_GAIN`` of its rows, within ``BASE_BYTES``."""
        root = self._root()
        if not self._base_qis:
            return root
        key = tuple(node[j] for j in self._base_qis)
        found = self._bases.get(key)
        if found is not None:
            return found
        best = root
        for levels, base in self._bases.items():
            if base.n_rows < best.n_rows and all(a <= b for a, b in zip(levels, key, strict=True)):
                best = base
        if key in self._no_gain or not any(key):
            return best
        target = [0] * len(node)
        for j, level in zip(self._base_qis, key, strict=True):
            target[j] = level
        built = self._regrouped(best, tuple(target))
        if built is None:
            return best  # its (cell, person) pairs could not be packed
        # kept only when it pays and fits (no eviction: a base evicted would be rebuilt)
        over = self._base_bytes + built.nbytes > self._base_budget
        if built.n_rows > BASE_GAIN * best.n_rows or over:
            self._no_gain.add(key)
            return best
        self._bases[key] = built
        self._base_bytes += built.nbytes
        return built

    def classes_with_rows(self, levels: Sequence[int]) -> tuple[EquivalenceClasses, IntArray]:
        """Classes of ``levels`` and the class index of every summary row."""
        node = self._check(levels)
        if self.packed:
            classes = self.classes(node)
            return classes, classes.row_classes()
        columns = [self._labels_of_rows(j, level) for j, level in enumerate(node)]
        radices = [self._qi[j].n_labels(level) for j, level in enumerate(node)]
        row_class, first = group_rows(columns, radices)
        n_classes = first.shape[0]
        local = np.stack([column[first] for column in columns], axis=1).astype(np.int64)
        sizes = np.rint(np.bincount(row_class, weights=self.summary.counts, minlength=n_classes))
        if self.use_sa:
            cell_of_row, cell_first = group_rows(
                [row_class, self._row_sa], [n_classes, self.sa_radix]
            )
            cell_class = row_class[cell_first]
            cell_sa: IntArray | None = self._row_sa[cell_first]
            counts = np.bincount(cell_of_row, weights=self.summary.counts)
            cell_count = np.rint(counts).astype(np.int64)
        else:
            cell_class = np.arange(n_classes, dtype=np.int64)
            cell_sa = None
            cell_count = sizes.astype(np.int64)
        classes = EquivalenceClasses(
            self,
            node,
            sizes.astype(np.int64),
            cell_class,
            cell_sa,
            cell_count,
            local_labels=local,
        )
        return classes, row_class

    def _relabelled(self, classes: EquivalenceClasses, node: Node) -> EquivalenceClasses:
        """``classes`` under ``node``'s levels where every step is an identity: same cells."""
        same = EquivalenceClasses(
            self,
            node,
            classes.sizes,
            classes.cell_class,
            classes.cell_sa,
            classes.cell_count,
            cell_keys=classes._cell_keys,
            class_keys=classes._class_keys,
        )
        same.cell_single = classes.cell_single
        same.cell_first = classes.cell_first
        same.multi_pairs = classes.multi_pairs
        return same

    def rollup(self, classes: EquivalenceClasses, qi: int) -> EquivalenceClasses:
        """Classes of the successor that raises QI ``qi`` by one level, from ``classes``."""
        if classes.evaluator is not self:
            raise ValueError("rollup needs classes built by this evaluator")
        level = classes.levels[qi]
        if level >= self.hierarchies[qi].height:
            raise ValueError(f"QI {self.qi_names[qi]!r} is already at its top level")
        node = (*classes.levels[:qi], level + 1, *classes.levels[qi + 1 :])
        if not self.packed or classes._cell_keys is None:
            return self.classes(node)
        info = self._qi[qi]
        if info.identity[level]:
            return self._relabelled(classes, node)
        keys = classes._cell_keys
        stride = self.strides[qi]
        digit = (keys // stride) % self.radices[qi]
        keys = keys + (info.up[level][digit] - digit) * stride
        order = np.argsort(keys, kind="stable")  # sorted runs: near-linear merge
        return self._merge_cells(node, classes, keys[order], order)

    def rollup_to(self, classes: EquivalenceClasses, levels: Sequence[int]) -> EquivalenceClasses:
        """Classes of ``levels``, a generalisation of ``classes.levels`` (every QI at the
        same or a higher level), rolled up from ``classes``: each changed QI's digit of the
        cell keys is rewritten to its ancestor's local id, then equal keys are merged (their
        record counts and single-person row counts summed). Work is proportional to the
        cells of ``classes``, not to the summary rows; same result as ``classes(levels)``."""
        if classes.evaluator is not self:
            raise ValueError("rollup_to needs classes built by this evaluator")
        node = self._check(levels)
        changed = [j for j, (a, b) in enumerate(zip(classes.levels, node, strict=True)) if a != b]
        if any(node[j] < classes.levels[j] for j in changed):
            raise ValueError(f"{node} is not a generalisation of {classes.levels}")
        if not changed:
            return classes
        if len(changed) == 1 and node[changed[0]] == classes.levels[changed[0]] + 1:
            return self.rollup(classes, changed[0])
        if not self.packed or classes._cell_keys is None:
            return self.classes(node)
        keys = classes._cell_keys.copy()
        moved = False
        for j in changed:
            info = self._qi[j]
            mapping: IntArray | None = None
            for level in range(classes.levels[j], node[j]):
                if info.identity[level]:
                    continue
                up = info.up[level]
                mapping = up if mapping is None else up[mapping]
            if mapping is None:
                continue
            stride = self.strides[j]
            digit = (keys // stride) % self.radices[j]
            keys += (mapping[digit] - digit) * stride
            moved = True
        if not moved:  # every step was an identity: same cells under the new levels
            return self._relabelled(classes, node)
        order = np.argsort(keys)
        return self._merge_cells(node, classes, keys[order], order)

    def row_class_keys(self, levels: Sequence[int], rows: IntArray | None = None) -> IntArray:
        """Packed class key of every summary row at ``levels``, or of ``rows`` (positions
        among them) only (packed mode only)."""
        node = self._check(levels)
        keys = np.zeros(self.summary.n_distinct if rows is None else rows.shape[0], np.int64)
        for j, level in enumerate(node):
            labels = self._labels_of_rows(j, level)
            stride = self.strides[j] // self.sa_radix
            keys += np.multiply(labels if rows is None else labels[rows], stride, dtype=np.int64)
        return keys

    def qi_tuples(self) -> tuple[IntArray, IntArray]:
        """Distinct raw QI tuples: (tuple index per summary row, first row per tuple)."""
        if self._tuple_index is None:
            columns = [self._qi[j].row_index for j in range(len(self._qi))]
            self._tuple_index = group_rows(columns, self.radices)
        return self._tuple_index

    # ----------------------------------------------------------------- internals

    def _check(self, levels: Sequence[int]) -> Node:
        node = tuple(int(x) for x in levels)
        if len(node) != len(self._qi):
            raise ValueError(f"a transformation needs {len(self._qi)} levels, got {len(node)}")
        for name, level, hierarchy in zip(self.qi_names, node, self.hierarchies, strict=True):
            if not 0 <= level <= hierarchy.height:
                raise ValueError(f"level {level} of {name!r} is out of 0..{hierarchy.height}")
        return node

    def _labels_of_rows(self, qi: int, level: int) -> CodeArray:
        """Local label id of every summary row for one QI and level (cached, compact)."""
        key = (qi, level)
        cached = self._row_labels.get(key)
        if cached is None:
            info = self._qi[qi]
            table = info.local[level].astype(code_dtype(info.n_labels(level)))
            cached = table[info.row_index]
            self._row_labels[key] = cached
        return cached

    def _merge_cells(
        self, node: Node, classes: EquivalenceClasses, keys: IntArray, order: IntArray
    ) -> EquivalenceClasses:
        """Cells of ``node`` from the cells of ``classes`` whose rewritten keys, sorted, are
        ``keys`` (``order`` the old cell of each): counts, single-person rows and the
        (cell, person) pairs of persons with several rows are merged."""
        if not keys.shape[0]:
            return self.classes(node)
        starts = _starts(keys)
        counts = np.add.reduceat(classes.cell_count[order], starts)
        singles = None
        first = None
        if classes.cell_single is not None:
            singles = np.add.reduceat(classes.cell_single[order], starts)
        if classes.cell_first is not None:
            first = np.add.reduceat(classes.cell_first[order], starts)
        pairs = None
        if classes.multi_pairs is not None:
            flags = np.zeros(keys.shape[0], dtype=np.int64)
            flags[starts] = 1
            new_of_old = np.empty(keys.shape[0], dtype=np.int64)
            new_of_old[order] = np.cumsum(flags) - 1
            radix = self.n_units
            old = classes.multi_pairs // radix
            unit = classes.multi_pairs - old * radix
            pairs = sorted_unique(new_of_old[old] * radix + unit)
        return self._from_cells(node, keys[starts], counts, singles, pairs, first)

    def _from_cells(
        self,
        node: Node,
        cell_keys: IntArray,
        counts: IntArray,
        singles: IntArray | None = None,
        pairs: IntArray | None = None,
        first: IntArray | None = None,
    ) -> EquivalenceClasses:
        classes = self._cells_to_classes(node, cell_keys, counts)
        classes.cell_single = singles
        classes.cell_first = first
        classes.multi_pairs = pairs
        return classes

    def _cells_to_classes(
        self, node: Node, cell_keys: IntArray, counts: IntArray
    ) -> EquivalenceClasses:
        if not self.use_sa:  # cells are the classes
            return EquivalenceClasses(
                self,
                node,
                counts,
                np.arange(counts.shape[0], dtype=np.int64),
                None,
                counts,
                cell_keys=cell_keys,
                class_keys=cell_keys,
            )
        radix = self.sa_radix
        class_of_cell = cell_keys // radix
        starts = _starts(class_of_cell)
        flags = np.zeros(cell_keys.shape[0], dtype=np.int64)
        flags[starts] = 1
        cell_class = np.cumsum(flags) - 1
        sizes = np.add.reduceat(counts, starts) if counts.size else counts
        return EquivalenceClasses(
            self,
            node,
            sizes.astype(np.int64, copy=False),
            cell_class,
            cell_keys % radix,
            counts.astype(np.int64, copy=False),
            cell_keys=cell_keys,
            class_keys=class_of_cell[starts],
        )


def count_units(
    classes: EquivalenceClasses,
    row_class: IntArray,
    row_sa: IntArray,
    row_unit: IntArray,
    n_units: int,
) -> EquivalenceClasses:
    """The person-counted view of ``classes`` from (class, SA, unit) of its summary rows:
    class size = distinct units, cell count = distinct units of the class with that SA
    value. Cells (and keys, labels) are those of ``classes``: every cell has a person."""
    n_classes = classes.n_classes
    radix = max(int(n_units), 1)
    row_class = np.asarray(row_class, np.int64)
    persons = _distinct_per_group(row_class, row_unit, radix, n_classes)
    if classes.cell_sa is None:
        cell_count = persons
    else:
        # distinct (class, SA, unit) triples, sorted: their runs of equal (class, SA) are
        # the cells in order (cells are sorted by class then SA, and each has a row)
        sa_radix = classes.evaluator.sa_radix
        row_cell = row_class * sa_radix + row_sa
        if n_classes * sa_radix * radix < _KEY_LIMIT:
            triples = np.sort(row_cell * radix + row_unit)
            first = np.ones(triples.shape[0], dtype=bool)
            np.not_equal(triples[1:], triples[:-1], out=first[1:])
            cells = triples[first] // radix
            cell_count = np.diff(np.append(_starts(cells), cells.shape[0])).astype(np.int64)
        else:  # pragma: no cover - astronomically many classes x persons
            cell_key = classes.cell_class * sa_radix + classes.cell_sa
            index = np.searchsorted(cell_key, row_cell)
            cell_count = _distinct_per_group(index, row_unit, radix, classes.n_cells)
        if cell_count.shape[0] != classes.n_cells:
            raise RuntimeError("person counts do not match the cells of the classes")
    return in_persons(classes, persons, cell_count)


def in_persons(
    classes: EquivalenceClasses, persons: IntArray, cell_count: IntArray | None = None
) -> EquivalenceClasses:
    """The person-counted view of ``classes`` given its persons per class (and per cell;
    without SA cells, the persons per class)."""
    view = EquivalenceClasses(
        classes.evaluator,
        classes.levels,
        persons,
        classes.cell_class,
        classes.cell_sa,
        persons if cell_count is None else cell_count,
        cell_keys=classes._cell_keys,
        class_keys=classes._class_keys,
        local_labels=classes._local,
    )
    view.in_units = True
    return view


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


def _kept(tables: OrderedDict[_K, _V], key: _K, build: Callable[[], _V]) -> _V:
    """The table kept under ``key`` (now the most recent), else ``build()`` kept there,
    the oldest dropped beyond ``NODE_TABLES``."""
    table = tables.get(key)
    if table is not None:
        tables.move_to_end(key)
        return table
    table = tables[key] = build()
    while len(tables) > NODE_TABLES:
        tables.popitem(last=False)
    return table


def _dense_limit(n_rows: int) -> int:
    """The largest key space grouped with a flag array (``DENSE_FACTOR``, ``WIDE_FACTOR``,
    ``DENSE_KEYS``)."""
    return max(DENSE_FACTOR * n_rows, min(WIDE_FACTOR * n_rows, DENSE_KEYS), 1 << 16)


def _distinct_per_group(group: IntArray, unit: IntArray, radix: int, n_groups: int) -> IntArray:
    """Per group: the number of distinct units among its rows (a sort of packed pairs)."""
    pairs = np.sort(group * radix + unit)
    first = np.ones(pairs.shape[0], dtype=bool)
    np.not_equal(pairs[1:], pairs[:-1], out=first[1:])
    return np.bincount(pairs[first] // radix, minlength=n_groups).astype(np.int64)


def _starts(sorted_keys: IntArray) -> IntArray:
    """Indices where a run of equal values starts in a sorted array."""
    if sorted_keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.empty(sorted_keys.shape[0], dtype=bool)
    change[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=change[1:])
    return np.flatnonzero(change)


def describe_node(names: Sequence[str], node: Sequence[int]) -> str:
    """A node for messages: ``[age=2, sex=0]``."""
    return "[" + ", ".join(f"{n}={int(v)}" for n, v in zip(names, node, strict=True)) + "]"
