"""From rows to bounded per-cell aggregates, batch by batch, with hashed keys.

The DP pipeline never moves raw rows between steps: each batch becomes compact numpy
arrays per query — a 64-bit hash of the person (``unit``), of the released cell
(``cell``), of the partition_by group (``group``) and the fixed-point value — plus a small
dictionary from cell hash to the cell's labels. All rows of a person are brought together
(a shuffle keyed by the person hash), bounded there (:func:`bound_and_aggregate`), and
reduced to per-cell counts, distinct persons and sums (:class:`CellPartial`), which add up
across shards (:func:`merge_partials`).

Hashes: of canonical strings (persons: ``anonymity.summary.unit_hashes``, FNV-1a over the
bytes; cells: pandas' ``hash_pandas_object``, SipHash with a fixed key), so every worker
computes the same value. Two persons colliding in 64 bits would be bounded as
one person (only stricter); two cells colliding would merge their counts, so merging the
dictionaries refuses a hash that names two different cells.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.arrays import small_key_order, sorted_unique, unique_counts
from privpipe.anonymity.hierarchy import canonical_column
from privpipe.anonymity.summary import group_rows, unit_hashes
from privpipe.dp import exact
from privpipe.dp.bounding import RngLike, bound_ids, bounding_rng, dense_ids, one_group_per_unit
from privpipe.dp.spec import MOMENT_KINDS, QUANTILE_KINDS, DPReleaseSpec, Query, QueryPlan
from privpipe.errors import InputDataError

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
ObjArray = npt.NDArray[np.object_]

# (column, level, values) -> labels at that level; level 0 returns canonical raw strings
Labeler = Callable[[str, int, pd.Series], ObjArray]


def canonical_labels(col: str, level: int, values: pd.Series) -> ObjArray:
    """The default labeler: raw canonical strings; refuses a level without hierarchies."""
    if level != 0:
        raise InputDataError(f"column {col!r}: level {level} needs a hierarchy")
    return canonical_column(values)


def hash_keys(keys: pd.DataFrame) -> U64:
    """One 64-bit hash per row of the label columns (all zero when there are none)."""
    if keys.shape[1] == 0:
        return np.zeros(len(keys), dtype=np.uint64)
    h = pd.util.hash_pandas_object(keys, index=False, categorize=True)
    out: U64 = np.asarray(h.to_numpy(), dtype=np.uint64)
    return out


def hash_units(values: pd.Series) -> U64:
    """64-bit person hashes (``anonymity.summary.unit_hashes``: the same hash the summary
    and the verifiers count persons by); a missing or empty person id is refused (it
    cannot be bounded)."""
    out: U64 = unit_hashes(values, str(values.name)).view(np.uint64)
    return out


@dataclass
class Contributions:
    """One batch of one query as arrays (rows aligned), plus its cell dictionary."""

    query: int
    cell: U64
    unit: U64 | None = None
    group: U64 | None = None
    value: I64 | None = None
    dictionary: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __len__(self) -> int:
        return int(self.cell.size)

    def take(self, mask: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> Contributions:
        """The rows selected by a boolean mask or an index array (dictionary kept whole)."""
        return Contributions(
            self.query,
            self.cell[mask],
            None if self.unit is None else self.unit[mask],
            None if self.group is None else self.group[mask],
            None if self.value is None else self.value[mask],
            self.dictionary,
        )


def key_frame(
    batch: pd.DataFrame, spec: DPReleaseSpec, query: Query, labeler: Labeler
) -> pd.DataFrame:
    """The released cell's labels of every row (object strings, one column per key)."""
    cols = spec.key_columns(query)
    data = {c: labeler(c, query.level(c), batch[c]) for c in cols}
    return pd.DataFrame(data, index=pd.RangeIndex(len(batch)), columns=list(cols), dtype=object)


def fixed_point_values(batch: pd.DataFrame, spec: DPReleaseSpec, plan: QueryPlan) -> I64:
    """Each row's value clamped and rounded to integer ``resolution`` steps (centred for
    means and variances; for quantiles the index of the nearest grid point from ``lower``)."""
    assert spec.value is not None and plan.sum_units is not None
    raw = pd.to_numeric(batch[spec.value], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(raw)
    if bad.any():
        example = batch[spec.value].iloc[int(np.flatnonzero(bad)[0])]
        raise InputDataError(
            f"column {spec.value!r} ({spec.name}.value): {int(bad.sum())} row(s) are missing "
            f"or not numeric (e.g. {example!r}); {spec.kind} needs a number in every row — "
            f"declare schema.types.{spec.value}: float to reject such rows at reading"
        )
    lo, hi = plan.sum_units
    units = np.rint((raw - plan.centre) / spec.resolution)
    out: I64 = np.clip(units, lo, hi).astype(np.int64)
    return out


def _combinations(
    batch: pd.DataFrame, cols: Sequence[str], known: Combinations | None = None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each row's distinct combination of ``cols`` (ids in order of first row; missing is
    a value of its own) and each combination's first row. Without columns, one
    combination (every row the same). Several columns are grouped from each column's own
    combinations (``_combinations_of``: a column is factorised once per batch, whatever
    the queries it is a key of)."""
    if not cols:
        n = len(batch)
        return np.zeros(n, dtype=np.int64), np.zeros(min(n, 1), dtype=np.int64)
    if len(cols) == 1:  # factorize's codes are already numbered by first row
        codes, _ = pd.factorize(batch[cols[0]], use_na_sentinel=False)
        ids = np.asarray(codes, dtype=np.int64)
        if not ids.shape[0]:
            return ids, np.zeros(0, dtype=np.int64)
        # a code's first row is where the running maximum of the codes grows (a new value
        # is always the largest code so far plus one)
        grows = np.ones(ids.shape[0], dtype=bool)
        top = np.maximum.accumulate(ids)
        grows[1:] = top[1:] > top[:-1]
        return ids, np.flatnonzero(grows).astype(np.int64)
    parts = [_combinations_of(batch, [col], known) for col in cols]
    ids, first = group_rows([p[0] for p in parts], [p[1].shape[0] for p in parts])
    order = np.argsort(first, kind="stable")  # ids in the columns' order: renumbered by row
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0], dtype=order.dtype)
    return rank[ids].astype(np.int64, copy=False), first[order]


Combinations = dict[tuple[str, ...], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]


def _combinations_of(
    batch: pd.DataFrame, cols: Sequence[str], known: Combinations | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``_combinations``, kept in ``known`` for the batch's other queries and releases
    over the same columns (and for the combinations of several columns that hold them)."""
    if known is None:
        return _combinations(batch, cols)
    key = tuple(cols)
    found = known.get(key)
    if found is None:
        found = known[key] = _combinations(batch, cols, known)
    return found


def _cells(
    batch: pd.DataFrame,
    spec: DPReleaseSpec,
    query: Query,
    labeler: Labeler,
    known: Combinations | None = None,
) -> tuple[U64, pd.DataFrame]:
    """Each row's cell hash (``hash_keys`` of its ``key_frame`` labels) and the batch's
    cell dictionary (each cell's labels and ``_cell`` hash, in order of first row),
    labelled and hashed once per distinct combination of the key columns' values: a
    labeler maps each value on its own (``Labeler``), so the rows of one combination
    share their labels. A 64k-row batch's cells over a few columns have a few thousand
    combinations: one string per combination and column, not per row."""
    cols = list(spec.key_columns(query))
    combination, first = _combinations_of(batch, cols, known)
    at = [batch.columns.get_loc(c) for c in cols]  # the first rows' cells only, not a copy
    keys = key_frame(batch.iloc[first, at].reset_index(drop=True), spec, query, labeler)
    hashes = hash_keys(keys)
    new = ~pd.Series(hashes).duplicated().to_numpy()  # combinations in first-row order
    dictionary = keys.loc[new].assign(_cell=hashes[new]).reset_index(drop=True)
    cell: U64 = hashes[combination]
    return cell, dictionary


def contributions(
    batch: pd.DataFrame,
    spec: DPReleaseSpec,
    plans: Sequence[QueryPlan],
    labeler: Labeler = canonical_labels,
    units: dict[str, U64] | None = None,
    combinations: Combinations | None = None,
) -> list[Contributions]:
    """Every query's contributions of one batch (vectorised; no loop over rows).
    ``units`` keeps the batch's person hashes per column for the next release,
    ``combinations`` the distinct combinations of its key columns per column tuple."""
    unit = None
    if spec.unit is not None:
        known = {} if units is None else units
        if spec.unit not in known:
            known[spec.unit] = hash_units(batch[spec.unit])
        unit = known[spec.unit]
    group = None
    if spec.unit is not None and spec.partition_by:  # hashed once per distinct group
        groups, first = _combinations_of(batch, spec.partition_by, combinations)
        distinct = batch[list(spec.partition_by)].iloc[first].astype(object)
        group = hash_keys(distinct.reset_index(drop=True))[groups]
    out: list[Contributions] = []
    for i, plan in enumerate(plans):
        cell, dictionary = _cells(batch, spec, plan.query, labeler, combinations)
        value = fixed_point_values(batch, spec, plan) if plan.sum_units is not None else None
        out.append(Contributions(i, cell, unit, group, value, dictionary))
    return out


def shard_of(unit: U64, shards: int) -> I64:
    """The shard of each person (all rows of a person land in one shard)."""
    out: I64 = (unit % np.uint64(shards)).astype(np.int64)
    return out


def split_by_shard(unit: U64, shards: int) -> list[tuple[int, npt.NDArray[np.intp]]]:
    """(shard, row positions in input order) of every non-empty shard: one sort, not one
    mask per shard."""
    shard = shard_of(unit, shards)
    order = small_key_order(shard, shards)
    bounds = np.searchsorted(shard[order], np.arange(shards + 1))
    return [
        (s, order[bounds[s] : bounds[s + 1]]) for s in range(shards) if bounds[s + 1] > bounds[s]
    ]


def concat(parts: Sequence[Contributions]) -> Contributions:
    """Many batches of the same query as one (for a shard)."""
    first = parts[0]

    def cat(name: str) -> npt.NDArray[np.generic] | None:
        arrays = [getattr(p, name) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays)

    return Contributions(
        first.query,
        np.concatenate([p.cell for p in parts]),
        cat("unit"),  # type: ignore[arg-type]
        cat("group"),  # type: ignore[arg-type]
        cat("value"),  # type: ignore[arg-type]
        pd.DataFrame(),
    )


@dataclass
class CellPartial:
    """Bounded per-cell aggregates of some persons; partials of disjoint persons add up."""

    query: int
    # index: cell hash (uint64); count, units (int64); sum_units exact (int64 or Python ints);
    # sumsq_units (variances: Σ squared fixed-point values, exact) only when moments are kept
    cells: pd.DataFrame
    rows_in: int = 0
    rows_kept: int = 0
    max_rows_per_cell: int = 0  # observed after bounding: ≤ Linf
    max_cells_per_unit: int = 0  # observed after bounding: ≤ L0
    max_groups_per_unit: int = 0  # observed after bounding: ≤ 1 with partition_by
    persons_in_several_groups: int = 0  # before bounding
    # quantiles: bounded rows per (cell hash, grid index), the cell's histogram on the grid
    bins: pd.Series | None = None


def _histogram(c: Contributions) -> pd.Series:
    """Rows per (cell, grid index) of bounded contributions (int64, MultiIndex)."""
    assert c.value is not None
    frame = pd.DataFrame({"cell": c.cell, "bin": c.value})
    return frame.groupby(["cell", "bin"], sort=False).size().astype(np.int64)


def _merge_bins(parts: Sequence[pd.Series | None]) -> pd.Series | None:
    frames = [p for p in parts if p is not None]
    if not frames:
        return None
    return pd.concat(frames).groupby(level=[0, 1], sort=False).sum().astype(np.int64)


@dataclass(frozen=True)
class _Recount:
    """What a release counts and re-checks on its kept rows, from one factorisation of
    their cells and persons and one sort of their (person, cell) pairs: rows and distinct
    persons per cell (``cells``: the cells' hashes, in the order of ``rows`` and ``units``),
    and the bounds as kept: the most rows of one person in one cell, the most cells and
    partition groups of one person. Counted apart from ``bounding.bound_ids``, which
    chose the rows (only the persons' ids are shared: numbered once), so the verification
    can say no."""

    cells: U64
    rows: I64
    units: I64
    max_rows_per_cell: int
    max_cells_per_unit: int
    max_groups_per_unit: int

    @classmethod
    def of(cls, c: Contributions, person: I64 | None = None) -> _Recount:
        """``person``: the kept rows' person ids when the caller numbered them already
        (``bounding.dense_ids``: one id per person, below the rows' number); else the
        persons are factorised here."""
        codes, cells = pd.factorize(c.cell)
        cell = codes.astype(np.int64)
        rows = np.bincount(cell, minlength=len(cells)).astype(np.int64)
        if c.unit is None:  # one row, one person
            one = 1 if len(c) else 0
            return cls(cells, rows, rows, one, one, one)
        unit = pd.factorize(c.unit)[0].astype(np.int64) if person is None else person
        width = np.int64(max(len(cells), 1))
        pairs, per_pair = unique_counts(unit * width + cell)  # (person, cell), person first
        units = np.bincount(pairs % width, minlength=len(cells)).astype(np.int64)
        group = np.zeros(len(c), dtype=np.int64) if c.group is None else c.group
        group_codes, groups = pd.factorize(group)
        span = np.int64(max(len(groups), 1))
        unit_groups = sorted_unique(unit * span + group_codes.astype(np.int64))
        return cls(
            cells,
            rows,
            units,
            int(per_pair.max()) if per_pair.size else 0,
            int(np.bincount(pairs // width).max()) if pairs.size else 0,
            int(np.bincount(unit_groups // span).max()) if unit_groups.size else 0,
        )


def _aggregate(c: Contributions, recount: _Recount, moments: bool = False) -> pd.DataFrame:
    """count, distinct units and value sum per cell of (already bounded) contributions;
    with ``moments`` also the exact sum of squared values (``sumsq_units``)."""
    cells = pd.DataFrame(
        {"count": recount.rows, "units": recount.units},
        index=pd.Index(recount.cells, name="cell"),
    )
    if c.value is None:
        cells["sum_units"] = np.int64(0)
    else:  # exact: int64 only when rows × max |value| provably fits, else Python ints
        cells["sum_units"] = exact.group_sum(c.cell, c.value).reindex(cells.index)
    cols = ["count", "units", "sum_units"]
    if moments:  # |value| ≤ 2^26.5 (the planner's check), so each square is exact in int64
        assert c.value is not None
        cells["sumsq_units"] = exact.group_sum(c.cell, c.value * c.value).reindex(cells.index)
        cols.append("sumsq_units")
    return _typed(cells[cols])


def _typed(cells: pd.DataFrame) -> pd.DataFrame:
    """count and units as int64; sums int64, or Python ints when they cannot fit."""
    out = cells.astype({"count": np.int64, "units": np.int64})
    for col in ("sum_units", "sumsq_units"):
        if col in out:
            out[col] = exact.as_exact(out[col].to_numpy())
    return out


def bound_and_aggregate(c: Contributions, spec: DPReleaseSpec, rng: RngLike = None) -> CellPartial:
    """Bound the persons of ``c`` (who must have all their rows here) and aggregate per cell.

    With partition_by, a person in several groups is refused (InputDataError, exit 3)
    unless ``bound_to_one_group`` keeps one group per person, chosen at random. Then each
    person keeps ≤ L0 cells and ≤ Linf rows per cell, uniformly at random. The bounds are
    re-counted on the kept rows (a separate code path) for the release's verification.
    """
    n_in = len(c)
    several = 0
    person: I64 | None = None
    if c.unit is None:
        kept = c
    else:
        gen = bounding_rng(rng)
        person, n_persons = dense_ids(c.unit)  # numbered once: grouped, bounded, recounted
        if c.group is not None:
            several = _units_in_several_groups(person, n_persons, c.group)
            if several and not spec.bound_to_one_group:
                raise InputDataError(  # no count: a DP release's input, nothing exact
                    f"{spec.name}: a person ({spec.unit}) appears in more than one "
                    f"partition_by group ({', '.join(spec.partition_by)}); parallel composition "
                    "needs each person in one group. Set bound_to_one_group: true to keep one "
                    "group per person, or fix the data"
                )
            if several:
                one = one_group_per_unit(c.unit, c.group, gen)
                c, person = c.take(one), person[one]
        mask = bound_ids(person, n_persons, c.cell, spec.l0, spec.linf, gen)
        kept, person = c.take(mask), person[mask]
    recount = _Recount.of(kept, person)
    partial = CellPartial(
        query=c.query,
        cells=_aggregate(kept, recount, moments=spec.kind in MOMENT_KINDS),
        bins=_histogram(kept) if spec.kind in QUANTILE_KINDS else None,
        rows_in=n_in,
        rows_kept=len(kept),
        persons_in_several_groups=several,
    )
    partial.max_rows_per_cell = recount.max_rows_per_cell
    partial.max_cells_per_unit = recount.max_cells_per_unit
    partial.max_groups_per_unit = recount.max_groups_per_unit
    return partial


def _units_in_several_groups(person: I64, n_persons: int, group: U64) -> int:
    """Persons (ids ``0..n_persons-1``) with rows in more than one group."""
    codes, groups = pd.factorize(group)
    span = np.int64(max(len(groups), 1))
    pairs = sorted_unique(person * span + codes.astype(np.int64))
    return int(np.count_nonzero(np.bincount(pairs // span, minlength=n_persons) > 1))


def merge_partials(parts: Sequence[CellPartial]) -> CellPartial:
    """Partials of disjoint persons (shards, or batches without a privacy unit) summed."""
    if not parts:
        raise ValueError("merge_partials needs at least one partial")
    frames = [p.cells for p in parts if len(p.cells)]
    if frames:
        counts = pd.concat([f[["count", "units"]] for f in frames])
        cells = counts.groupby(level=0, sort=False).sum()
        for col in ("sum_units", "sumsq_units"):
            if col in frames[0]:
                cells[col] = exact.combine([f[col] for f in frames]).reindex(cells.index)
        cells = _typed(cells)
    else:
        cells = parts[0].cells
    return CellPartial(
        query=parts[0].query,
        cells=cells,
        rows_in=sum(p.rows_in for p in parts),
        rows_kept=sum(p.rows_kept for p in parts),
        max_rows_per_cell=max(p.max_rows_per_cell for p in parts),
        max_cells_per_unit=max(p.max_cells_per_unit for p in parts),
        max_groups_per_unit=max(p.max_groups_per_unit for p in parts),
        persons_in_several_groups=sum(p.persons_in_several_groups for p in parts),
        bins=_merge_bins([p.bins for p in parts]),
    )


def empty_partial(query: int) -> CellPartial:
    cells = pd.DataFrame(
        {"count": [], "units": [], "sum_units": []}, index=pd.Index([], dtype=np.uint64)
    ).astype(np.int64)
    return CellPartial(query, cells)


def merge_dictionaries(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Cell hash → labels over many batches; refuses a hash naming two different cells."""
    frames = [p for p in parts if len(p)]
    if not frames:
        return pd.DataFrame({"_cell": np.array([], dtype=np.uint64)})
    merged = pd.concat(frames, ignore_index=True).drop_duplicates(ignore_index=True)
    if merged["_cell"].duplicated().any():
        raise InputDataError(
            "two different cells share a 64-bit key hash; rename a value in one of them "
            "(this is astronomically rare)"
        )
    return merged
