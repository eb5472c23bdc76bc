"""Mondrian multidimensional partitioning (LeFevre, DeWitt & Ramakrishnan, ICDE 2006).

Local recoding: the table is split recursively into partitions, and each partition is
published with its own labels, so unlike full-domain generalisation a value may be
generalised differently in different parts of the table. The result is a ``Recoding``
(every distinct raw QI tuple -> its published labels), the same output as full-domain.

Strict Mondrian on the summary (DESIGN.md "Work on summaries"): the unit is a distinct
raw QI tuple weighted by its records, never a row, and a split is a threshold in the
order of one QI, so records with the same raw QI tuple always stay together.

Choosing a split. Each QI orders its values: a numeric QI (named in ``numeric``, raw
values that parse as numbers) by value; a categorical QI by the depth-first leaf order of
its hierarchy, in which every subtree is a contiguous run, so the lowest common ancestor
(LCA) of a partition's values is the LCA of its first and last value. The partition is
split on the QI with the widest normalised range (numeric: (max - min) / the range of
the hierarchy's values; categorical: (leaves under the LCA - 1) / (|dom| - 1); ties go to
the earlier QI), at the boundary between distinct values (numeric) or between children of
the LCA (categorical) that leaves the two halves' record counts closest to equal (the
weighted median). The split is kept only if both halves satisfy every model, checked by
the models' own ``violating`` on the candidate halves as equivalence classes (t-closeness
against p of the whole table, as everywhere). Otherwise the next widest QI is tried; a
partition where no QI can be split is final.

Labels never reveal a value the hierarchy would not. A numeric QI is published as a range
on the public grid of its hierarchy (``anonymity.grid``: the cells of the finest level that
defines intervals): the smallest run of whole cells holding the partition's values, e.g.
``[20, 30)`` for ages 21..27 on a grid of width 5 — not the members' minimum and maximum.
Splits are cut only between grid cells (values in one cell are never separated), so the
published ranges of different partitions never overlap. A numeric QI whose hierarchy defines
no interval grid is handled like a categorical one. A categorical QI is published as the
label of the LCA in its hierarchy. Two partitions may end up with equal labels;
published, they form one class, which still satisfies the models (k, the l variants and
t-closeness are all preserved by merging classes that satisfy them).

Suppression: every kept split leaves both halves valid, so only the whole table can
violate the models; then ``PrivacyRefusal``: suppressing it all would not help, since the
suppressed block is itself a class for an attacker (``models``), the whole table.

Privacy units: with a summary carrying person ids, halves are checked counted in persons
(``Evaluator.in_units``' definitions: k distinct persons, SA counts in distinct persons).
Split points still balance records.

How it is fast: partitions advance together in rounds (breadth-first). In a round, every
open partition picks its QI and split point with segment reductions over the tuples
(numpy, no per-partition Python), and all candidate halves are checked at once as one
``EquivalenceClasses``. The outcome equals the recursive algorithm's, since each
partition's choices depend on itself only.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.grid import Grid, format_number, interval_grid
from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.models import (
    PrivacyModel,
    certain_values,
    check_models,
    describe_models,
    max_suppressed,
)
from privpipe.anonymity.recoding import Recoding
from privpipe.anonymity.summary import Summary, resolve_hierarchies
from privpipe.anonymity.transformation import (
    EquivalenceClasses,
    Evaluator,
    count_units,
    in_persons,
)
from privpipe.errors import ConfigError, PrivacyRefusal

__all__ = ["MondrianResult", "mondrian", "numeric_values", "parse_range", "range_label"]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
ObjArray: TypeAlias = npt.NDArray[np.object_]

_RANGE: Final = re.compile(r"^\[\s*([^,\s\[\]]+)\s*,\s*([^,\s\[\]\)]+)\s*([\]\)])$")


# --------------------------------------------------------------------------- range labels


def numeric_values(hierarchy: Hierarchy) -> FloatArray:
    """The number of each raw value of a hierarchy (NaN where it is not a finite number)."""
    parsed = pd.to_numeric(pd.Series(hierarchy.values, dtype=object), errors="coerce")
    values = np.array(parsed.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)
    values[~np.isfinite(values)] = np.nan
    return values


def range_label(lo: float, hi: float) -> str:
    """The published label of a numeric range: ``[lo, hi]`` (integers without ``.0``)."""
    return f"[{format_number(float(lo))}, {format_number(float(hi))}]"


def parse_range(label: object) -> tuple[float, float] | None:
    """``(lo, hi)`` (both inclusive) of a ``[lo, hi]`` label, ``(x, x)`` of a bare number,
    else None. A half-open ``[lo, hi)`` gives hi as the largest float below hi, so that
    ``lo <= x <= hi`` tests membership exactly either way."""
    text = str(label).strip()
    match = _RANGE.match(text)
    parts = match.groups() if match else (text, text, "]")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        return None
    if parts[2] == ")":
        if lo == hi:
            return None
        hi = math.nextafter(hi, -math.inf)
    return lo, hi


# --------------------------------------------------------------------------- dimensions


def _numbers_of(hierarchy: Hierarchy, codes: IntArray) -> FloatArray:
    """The numbers of raw codes of a QI listed as numeric; ConfigError if one is not."""
    present = numeric_values(hierarchy)[codes]
    if np.isnan(present).any():
        bad = pd.unique(hierarchy.values[codes[np.isnan(present)]])
        shown = ", ".join(repr(str(v)) for v in bad[:5])
        raise ConfigError(
            f"quasi-identifier {hierarchy.attribute!r} is listed as numeric but has "
            f"values that are not numbers: {shown}; remove it from the numeric "
            "quasi-identifiers or fix the values"
        )
    return present


class _Dimension:
    """One QI as Mondrian orders it: a sort key per distinct tuple and what keys mean.

    Numeric: the key is the dense rank of the value among the present values; ``cell`` is
    the grid cell of each key (splits only between cells, labels over whole cells). A
    numeric QI whose hierarchy has no interval grid is ordered and labelled as a
    categorical one. Categorical: the key is the raw code's position in the hierarchy's
    depth-first leaf order.
    """

    def __init__(self, hierarchy: Hierarchy, codes: IntArray, numeric: bool) -> None:
        self.hierarchy = hierarchy
        present = _numbers_of(hierarchy, codes) if numeric else np.zeros(0, dtype=np.float64)
        self.grid: Grid | None = interval_grid(hierarchy) if numeric else None
        numeric = self.grid is not None
        self.numeric = numeric
        self.cell: IntArray = np.zeros(0, dtype=np.int64)  # numeric: grid cell per key
        self.domain = hierarchy.domain_size
        self.span = 0.0  # numeric: range of the hierarchy's numbers
        self.values: FloatArray = np.zeros(0, dtype=np.float64)  # numeric: number per key
        self.ids: IntArray = np.zeros((0, 0), dtype=np.int64)  # (levels, dom) label ids
        self.leaves: IntArray = np.zeros((0, 0), dtype=np.int64)  # (levels, dom) leaves under
        self.labels: ObjArray = np.zeros((0, 0), dtype=object)  # (levels, dom) labels
        if numeric:
            distinct, key = np.unique(present, return_inverse=True)
            self.key: IntArray = key.astype(np.int64).ravel()
            self.values = distinct.astype(np.float64)
            self.code_of_key: IntArray = np.zeros(distinct.shape[0], dtype=np.int64)
            self.code_of_key[self.key] = codes
            assert self.grid is not None
            self.cell = self.grid.cell[self.code_of_key]
            self.span = self.grid.span
        else:
            levels = range(hierarchy.levels)
            self.ids = np.stack([hierarchy.label_ids(lv) for lv in levels]).astype(np.int64)
            self.leaves = np.stack([hierarchy.leaves_under(lv) for lv in levels]).astype(np.int64)
            self.labels = np.stack([hierarchy.labels(lv) for lv in levels]).astype(object)
            order = np.lexsort(self.ids)  # the last row (top level) is the primary key
            rank = np.empty(order.shape[0], dtype=np.int64)
            rank[order] = np.arange(order.shape[0], dtype=np.int64)
            self.key = rank[codes]
            self.code_of_key = order.astype(np.int64)

    def lca(self, low: IntArray, high: IntArray) -> IntArray:
        """Categorical: level of the LCA of the leaves between keys ``low`` and ``high``."""
        ids = self.ids
        same = ids[:, self.code_of_key[low]] == ids[:, self.code_of_key[high]]
        level: IntArray = np.argmax(same, axis=0).astype(np.int64)  # the top always agrees
        return level

    def width(self, low: IntArray, high: IntArray) -> tuple[FloatArray, IntArray]:
        """Normalised width per partition (key range ``low..high``), -1 if not splittable;
        and (categorical) the LCA level."""
        splittable = high > low
        if self.numeric:
            assert self.grid is not None
            first, last = self.cell[low], self.cell[high]
            span = self.span if self.span > 0 else 1.0
            width = (self.grid.hi[last] - self.grid.lo[first]) / span
            return np.where(last > first, width, -1.0), np.zeros(low.shape[0], dtype=np.int64)
        level = self.lca(low, high)
        leaves = self.leaves[level, self.code_of_key[low]]
        width = (leaves - 1) / max(self.domain - 1, 1)
        return np.where(splittable, width, -1.0), level

    def groups(self, keys: IntArray, level: IntArray) -> IntArray:
        """Per tuple: what a split must not separate (numeric: the grid cell of the value;
        categorical: the child of the partition's LCA at ``level`` that holds the value)."""
        if self.numeric:
            return self.cell[keys]
        return self.ids[level - 1, self.code_of_key[keys]]

    def publish(self, low: IntArray, high: IntArray) -> ObjArray:
        """The label of each partition with key range ``low..high``."""
        if not self.numeric:
            return self.labels[self.lca(low, high), self.code_of_key[low]]
        assert self.grid is not None
        return self.grid.label(self.cell[low], self.cell[high])


# --------------------------------------------------------------------------- checking


class _Checker:
    """Checks candidate partitions with the models, as equivalence classes of tuples.

    Only the summary rows of the tuples being checked are visited: ``rows`` lists the
    summary rows grouped by tuple, ``row_start`` where each tuple's rows begin.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        models: Sequence[PrivacyModel],
        tuple_of_row: IntArray,
        weights: IntArray,
    ) -> None:
        self.evaluator = evaluator
        self.models = tuple(models)
        self.weights = weights
        self.levels = (0,) * len(evaluator.qi_names)  # unused by the models
        self.rows = np.argsort(tuple_of_row, kind="stable").astype(np.int64)
        per_tuple = np.bincount(tuple_of_row, minlength=weights.shape[0])
        self.n_rows = per_tuple.astype(np.int64)
        self.row_start = (np.cumsum(per_tuple) - per_tuple).astype(np.int64)
        # without SA cells, when each person's rows share one tuple: persons per class are
        # sums of persons per tuple (no sort of (class, person) pairs at every check)
        self.persons = None if evaluator.use_sa else evaluator.persons_per_tuple()

    def classes(self, tuples: IntArray, of_tuple: IntArray, n_classes: int) -> EquivalenceClasses:
        """The classes ``0..n_classes-1`` given by the class ``of_tuple`` of each of ``tuples``
        (counted in persons when the summary has a privacy unit)."""
        classes = self._record_classes(tuples, of_tuple, n_classes)
        ev = self.evaluator
        if ev.units is None:
            return classes
        if self.persons is not None:
            tally = np.bincount(of_tuple, weights=self.persons[tuples], minlength=n_classes)
            view = in_persons(classes, np.rint(tally).astype(np.int64))
            view._sa_p = ev.unit_sa_distribution
            return view
        lengths = self.n_rows[tuples]
        offsets = np.cumsum(lengths) - lengths
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
        rows = self.rows[np.repeat(self.row_start[tuples], lengths) + within]
        sa = ev.summary.sa_codes
        row_sa = sa[rows] if ev.use_sa and sa is not None else np.zeros(rows.shape[0], np.int64)
        row_class = np.repeat(of_tuple, lengths)
        view = count_units(classes, row_class, row_sa, ev.units[rows], ev.n_units)
        view._sa_p = ev.unit_sa_distribution
        return view

    def _record_classes(
        self, tuples: IntArray, of_tuple: IntArray, n_classes: int
    ) -> EquivalenceClasses:
        ev = self.evaluator
        if not ev.use_sa:
            tally = np.bincount(of_tuple, weights=self.weights[tuples], minlength=n_classes)
            sizes = np.rint(tally).astype(np.int64)
            cells = np.arange(n_classes, dtype=np.int64)
            return EquivalenceClasses(ev, self.levels, sizes, cells, None, sizes)
        lengths = self.n_rows[tuples]
        offsets = np.cumsum(lengths) - lengths
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
        rows = self.rows[np.repeat(self.row_start[tuples], lengths) + within]
        sa_codes = ev.summary.sa_codes
        assert sa_codes is not None
        radix = ev.sa_radix
        key = np.repeat(of_tuple, lengths) * radix + sa_codes[rows]
        counts = ev.summary.counts[rows]
        if n_classes * radix <= 4 * key.shape[0] + 4096:  # small key space: no sort
            tally = np.bincount(key, weights=counts, minlength=n_classes * radix)
            keys = np.flatnonzero(tally)
            cell_count = np.rint(tally[keys]).astype(np.int64)
        else:
            keys, inverse = np.unique(key, return_inverse=True)
            tally = np.bincount(inverse.ravel(), weights=counts, minlength=keys.shape[0])
            cell_count = np.rint(tally).astype(np.int64)
        cell_class = (keys // radix).astype(np.int64)
        sizes = np.rint(np.bincount(cell_class, weights=cell_count, minlength=n_classes))
        return EquivalenceClasses(
            ev,
            self.levels,
            sizes.astype(np.int64),
            cell_class,
            (keys % radix).astype(np.int64),
            cell_count,
        )

    def violating(self, tuples: IntArray, of_tuple: IntArray, n_classes: int) -> BoolArray:
        """Per class: whether it violates at least one model."""
        classes = self.classes(tuples, of_tuple, n_classes)
        bad = np.zeros(n_classes, dtype=bool)
        for model in self.models:
            bad |= model.violating(classes)
        certain = certain_values(classes, self.models)
        return bad if certain is None else bad | certain


# --------------------------------------------------------------------------- Mondrian


@dataclass(frozen=True, eq=False)
class MondrianResult:
    """Mondrian's recoding, its number of partitions (0 if all is suppressed), the time
    taken and the number of suppressed records."""

    recoding: Recoding
    partitions: int
    seconds: float
    suppressed_records: int


def _starts(sorted_keys: IntArray) -> IntArray:
    """Indices where a run of equal values starts in a sorted array."""
    change = np.ones(sorted_keys.shape[0], dtype=bool)
    change[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return np.flatnonzero(change)


def _numeric_names(names: Sequence[str], numeric: Collection[str]) -> frozenset[str]:
    if isinstance(numeric, str):
        numeric = (numeric,)
    unknown = [name for name in numeric if name not in names]
    if unknown:
        raise ConfigError(
            f"numeric quasi-identifier(s) {', '.join(map(repr, unknown))} are not "
            f"quasi-identifiers ({', '.join(names)}); fix the names"
        )
    return frozenset(numeric)


def _ranges(
    columns: Sequence[IntArray], sel: IntArray, starts: IntArray
) -> tuple[IntArray, IntArray]:
    """Per partition (runs of ``sel`` from ``starts``) the smallest and largest key of
    each QI: column by column, each gathered once (one reduceat over a 2-D gather of all
    QIs was 3-5x slower on 1.2M tuples of 7 QIs)."""
    low = np.empty((starts.shape[0], len(columns)), dtype=np.int64)
    high = np.empty_like(low)
    for j, column in enumerate(columns):
        values = column[sel]
        low[:, j] = np.minimum.reduceat(values, starts)
        high[:, j] = np.maximum.reduceat(values, starts)
    return low, high


def _run(
    dims: Sequence[_Dimension],
    keys: IntArray,
    weights: IntArray,
    checker: _Checker,
) -> IntArray:
    """The final partition id of every tuple (ids dense, 0..n_partitions-1).

    ``sel`` holds the tuples of the open partitions, each partition a contiguous run (a
    split cuts a run sorted by the split QI into two runs, so this is kept for free).
    """
    n_tuples, n_qi = keys.shape
    radix = int(keys.max()) + 1 if keys.size else 1
    part = np.zeros(n_tuples, dtype=np.int64)
    n_parts = 1
    tried = np.zeros((1, n_qi), dtype=bool)
    sel = np.arange(n_tuples, dtype=np.int64)
    columns = [np.ascontiguousarray(keys[:, j]) for j in range(n_qi)]
    while sel.shape[0]:
        pid = part[sel]
        starts = _starts(pid)
        ids = pid[starts]
        flags = np.zeros(sel.shape[0], dtype=np.int64)
        flags[starts] = 1
        dense = np.cumsum(flags) - 1
        # the QI to split each partition on: the widest not yet tried
        low, high = _ranges(columns, sel, starts)
        width = np.empty(low.shape, dtype=np.float64)
        lca = np.zeros(low.shape, dtype=np.int64)
        for j, dim in enumerate(dims):
            width[:, j], lca[:, j] = dim.width(low[:, j], high[:, j])
        width[tried[ids]] = -1.0
        chosen = np.argmax(width, axis=1)
        can = width[np.arange(ids.shape[0]), chosen] > 0
        keep = can[dense]  # the others are final
        sel = sel[keep]
        if sel.shape[0] == 0:
            break
        dense = (np.cumsum(can) - 1)[dense[keep]]
        ids, chosen, lca = ids[can], chosen[can], lca[can]
        # sort each partition by its split QI
        dim_of = chosen[dense]
        sort_key = keys[sel, dim_of]
        if ids.shape[0] * radix < 1 << 62:
            order = np.argsort(dense * radix + sort_key)
        else:  # pragma: no cover - only for astronomically many keys
            order = np.lexsort((sort_key, dense))
        sel, dense, sort_key, dim_of = sel[order], dense[order], sort_key[order], dim_of[order]
        group = sort_key.copy()
        for j, dim in enumerate(dims):
            mask = dim_of == j
            if mask.any():
                group[mask] = dim.groups(sort_key[mask], lca[dense[mask], j])
        # the weighted median among the allowed boundaries (after position i)
        w = weights[sel]
        running = np.cumsum(w)
        starts = _starts(dense)
        left = running - (running - w)[starts][dense]
        total = np.add.reduceat(w, starts)
        allowed = np.zeros(sel.shape[0], dtype=bool)
        allowed[:-1] = (dense[1:] == dense[:-1]) & (group[1:] != group[:-1])
        score = np.where(allowed, np.abs(2 * left - total[dense]), np.iinfo(np.int64).max)
        best = np.minimum.reduceat(score, starts)
        hits = np.flatnonzero(allowed & (score == best[dense]))
        cut = hits[_starts(dense[hits])]  # the first best boundary of each partition
        assert cut.shape[0] == ids.shape[0], "every splittable partition has a boundary"
        right = np.arange(sel.shape[0]) > cut[dense]
        bad = checker.violating(sel, 2 * dense + right, 2 * ids.shape[0])
        ok = ~(bad[0::2] | bad[1::2])
        tried[ids[~ok], chosen[~ok]] = True
        accepted = np.flatnonzero(ok)
        if accepted.shape[0] == 0:
            continue
        new_id = np.full(ids.shape[0], -1, dtype=np.int64)
        new_id[accepted] = n_parts + np.arange(accepted.shape[0], dtype=np.int64)
        move = right & ok[dense]
        part[sel[move]] = new_id[dense[move]]
        n_parts += accepted.shape[0]
        tried[ids[accepted]] = False
        tried = np.concatenate([tried, np.zeros((accepted.shape[0], n_qi), dtype=bool)])
    return part


def mondrian(
    summary: Summary,
    hierarchies: Mapping[str, Hierarchy] | Sequence[Hierarchy],
    models: Sequence[PrivacyModel],
    *,
    numeric: Collection[str] = (),
    suppression_limit: float = 0.0,
) -> MondrianResult:
    """Strict Mondrian local recoding of ``summary`` satisfying ``models`` (module doc).

    ``numeric`` names the QIs published as ranges on their hierarchy's grid (their raw
    values must be numbers; ConfigError otherwise; without an interval grid, LCA labels);
    the others get the LCA label of their hierarchy.
    Raises PrivacyRefusal when the whole table violates the models (suppressing it all
    would leave a violating suppressed block).
    """
    started = time.perf_counter()
    names = summary.qi_names
    resolved = resolve_hierarchies(names, hierarchies)
    evaluator = Evaluator(summary, resolved)
    items = check_models(models, evaluator)
    if not any(model.needs_sa for model in items):
        evaluator = evaluator.without_sa()
    max_suppressed(suppression_limit, summary.n_records)  # ConfigError for a bad limit
    numbers = _numeric_names(names, numeric)
    tuple_of_row, first = evaluator.qi_tuples()
    codes = np.ascontiguousarray(summary.qi_codes[first])
    weights = np.rint(np.bincount(tuple_of_row, weights=summary.counts)).astype(np.int64)
    dims = [_Dimension(h, codes[:, j], names[j] in numbers) for j, h in enumerate(resolved)]
    checker = _Checker(evaluator, items, tuple_of_row, weights)
    description: dict[str, object] = {
        "algorithm": "mondrian",
        "variant": "strict",
        "numeric": [name for name in names if name in numbers],
        "models": describe_models(items),
        "suppression_limit": float(suppression_limit),
    }
    n = summary.n_records
    everything = np.arange(codes.shape[0], dtype=np.int64)
    root = np.zeros(codes.shape[0], dtype=np.int64)
    if checker.violating(everything, root, 1)[0]:
        classes = checker.classes(everything, root, 1)
        failing = [m.describe() for m in items if bool(m.violating(classes)[0])]
        certain = certain_values(classes, items)
        failing += (
            ["no SA value held by every person"] if certain is not None and certain[0] else []
        )
        # suppressing everything would not help: the suppressed block is a class too
        # (an attacker knows the target is among the '*' rows), here the whole table
        raise PrivacyRefusal(
            f"{', '.join(failing)}: the whole table ({n} records) violates it, and "
            "Mondrian cannot split a table that does; suppressing all records would not "
            "help either, since the suppressed block (the whole table) is itself a class "
            "that violates it. Relax the model(s) (e.g. a smaller k or l) or add records"
        )

    keys = np.ascontiguousarray(np.stack([dim.key for dim in dims], axis=1))
    part = _run(dims, keys, weights, checker)
    order = np.argsort(part, kind="stable")
    starts = _starts(part[order])
    low = np.minimum.reduceat(keys[order], starts, axis=0)
    high = np.maximum.reduceat(keys[order], starts, axis=0)
    n_parts = int(starts.shape[0])
    # per QI each partition's label, and the tuple's partition as its label id
    per_part = [dim.publish(low[:, j], high[:, j]) for j, dim in enumerate(dims)]
    description.update(partitions=n_parts, suppressed_records=0)
    nothing = np.zeros(codes.shape[0], dtype=bool)
    ids = [part] * len(dims)
    recoding = Recoding.from_label_ids(names, codes, ids, per_part, nothing, description)
    return MondrianResult(recoding, n_parts, time.perf_counter() - started, 0)
