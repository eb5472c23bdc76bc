"""Attacks on a publication as a whole: what releases handed out together reveal.

Each release passes its own check; these ask what their *combination* gives away
(DESIGN.md principle 7, "the publication is the unit of privacy"):

- :func:`reproduced_cells` — does an anonymised table reproduce a DP count exactly?
  When every (non-suppressed) row of the table carries each of the DP release's key
  columns at the DP level or finer, grouping the table gives the *exact* count of every
  DP cell, and the noise bought with ε protects nothing. Structural (levels per row, so
  per class for Mondrian) and numerical (the table's counts against the true counts).
- :func:`row_order_alignment` — can two tables of the same records be joined row by
  row? If row i of both tables is the same record, their generalised values agree at
  row i far more often than between unrelated rows (chance).

Pure core: numpy/pandas and ``anonymity.hierarchy`` only, no Beam.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from privpipe.anonymity.hierarchy import SUPPRESSED, Hierarchy
from privpipe.attacks.matching import WEIGHT, canonical_strings, records_of

ROW_ORDER_ROWS = 200_000  # rows of each table the row-order attack compares (the head)

__all__ = [
    "ROW_ORDER_ROWS",
    "Alignment",
    "Reproduction",
    "Truth",
    "common_level",
    "encode_rows",
    "per_distinct",
    "published_levels",
    "reproduced_cells",
    "row_order_alignment",
    "to_level",
    "true_counts",
]


def _ancestors(h: Hierarchy, level: int) -> dict[str, str]:
    """Label (of any level <= ``level``) → its ancestor at ``level`` (lowest level wins)."""
    top = [str(x) for x in h.labels(level)]
    out: dict[str, str] = {}
    for j in range(level, -1, -1):  # lower levels last: they win for a label on several
        for lab, anc in zip(h.labels(j), top, strict=True):
            out[str(lab)] = anc
    return out


def _level_of(h: Hierarchy) -> dict[str, int]:
    """Label → the lowest level it appears at."""
    out: dict[str, int] = {}
    for j in range(h.height, -1, -1):
        for lab in h.labels(j):
            out[str(lab)] = j
    return out


def published_levels(document: Mapping[str, Any]) -> dict[str, int] | None:
    """The hierarchy level of each QI a full-domain release published (release.json
    ``transformation.levels``); None for local recodings (each label at its own level)."""
    transformation = document.get("transformation") or {}
    if transformation.get("type") != "full_domain" or not transformation.get("levels"):
        return None
    return {str(k): int(v) for k, v in transformation["levels"].items()}


def per_distinct(values: pd.Series, fn: Callable[[pd.Series], pd.Series]) -> pd.Series:
    """``fn(values)`` for an element-wise ``fn``, applied to the distinct values only and
    spread back (same values, same index): the mappings below cost the number of labels,
    not of rows."""
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    if len(uniques) == len(values):
        return fn(values)
    mapped = fn(pd.Series(uniques))
    # a take on the array keeps its dtype without a round trip through Python strings
    # (object too: a Series of an object array would infer pandas' strings, per row)
    return pd.Series(
        mapped.array.take(codes), index=values.index, name=mapped.name, dtype=mapped.dtype
    )


def to_level(
    values: pd.Series,
    hierarchy: Hierarchy | None,
    level: int,
    source_level: int | None = None,
) -> pd.Series:
    """Each published value mapped to its label at ``level`` (see ``_to_level``),
    computed once per distinct value."""
    return per_distinct(values, lambda v: _to_level(v, hierarchy, level, source_level))


def _to_level(
    values: pd.Series,
    hierarchy: Hierarchy | None,
    level: int,
    source_level: int | None = None,
) -> pd.Series:
    """Each published value mapped to its label at ``level``; NaN where the value is
    coarser than ``level`` (or unknown, e.g. a Mondrian range): it cannot be counted in
    one cell. Without a hierarchy the values are raw (level 0). ``source_level``: the
    level the values were published at (a full-domain release's level of the column);
    then a value is read at that level only (by the hierarchy's codes there), so a
    string naming different groups at different levels is never read at the wrong one;
    None: each value at the lowest level holding it."""
    strings = values.astype(str)
    if hierarchy is None:
        return strings.where(strings != SUPPRESSED) if level == 0 else strings.where(False)
    top = min(level, hierarchy.height)
    if source_level is None:
        return strings.map(_ancestors(hierarchy, top))
    if source_level > top:  # coarser than the level asked for: no cell holds it
        return pd.Series(np.nan, index=values.index, dtype=object)
    ids = hierarchy.label_ids(source_level)  # per raw value: its label id at source_level
    first = pd.Series(np.arange(len(ids))).groupby(ids).first()  # one raw value per id
    names = pd.Index(hierarchy.label_names(source_level), dtype=object)
    found = names.get_indexer(strings.to_numpy(dtype=object))
    up = np.asarray(hierarchy.labels(top), dtype=object)
    out = np.full(len(strings), np.nan, dtype=object)
    hit = found >= 0
    out[hit] = up[first.reindex(found[hit]).to_numpy()]
    return pd.Series(out, index=values.index, dtype=object)


@dataclass(frozen=True)
class Reproduction:
    """How far table ``table`` reproduces the cells of DP release ``release``."""

    table: str
    release: str
    query: str
    keys: tuple[str, ...]
    rows: int  # rows of the table
    suppressed: int  # rows suppressed in the table (not counted anywhere)
    coarse: int  # other rows whose keys are coarser than the DP level
    cells: int  # DP cells published
    exact_cells: int  # of them, cells whose count the table gives exactly
    missing_columns: tuple[str, ...] = ()

    @property
    def structural(self) -> bool:
        """Every key column is in the table, every non-suppressed row at the DP level or
        finer (so each row counts in exactly one cell)."""
        return not self.missing_columns and self.coarse == 0 and self.rows > self.suppressed

    @property
    def linked(self) -> bool:
        """Structurally, or numerically: some non-empty cell's exact count can be read off
        the table (a row can only count in its own cell, so the table's count equals the
        truth only when every row of that cell is there at the DP level or finer)."""
        return self.structural or self.exact_cells > 0

    def message(self) -> str:
        by = ", ".join(self.keys)
        if not self.linked:
            return f"{self.table} does not reproduce {self.release} ({self.query})"
        text = (
            f"grouping table {self.table!r} by ({by}) gives the exact count of "
            f"{self.exact_cells} of the {self.cells} cells DP release {self.release!r} "
            f"publishes with noise ({self.query})"
        )
        if not self.structural:
            text += (
                "; the table is coarser than the DP release for some rows, but not for every "
                "row of those cells"
            )
        elif self.suppressed:
            text += (
                f"; {self.suppressed} suppressed row(s) make the other cells inexact only "
                "by the suppressed rows"
            )
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "table": self.table,
            "release": self.release,
            "query": self.query,
            "keys": list(self.keys),
            "linked": self.linked,
            "structural": self.structural,
            "rows": self.rows,
            "suppressed": self.suppressed,
            "coarse_rows": self.coarse,
            "cells": self.cells,
            "exact_cells": self.exact_cells,
            "missing_columns": list(self.missing_columns),
        }


def reproduced_cells(
    table: pd.DataFrame,
    cells: pd.DataFrame,
    truth: pd.DataFrame,
    keys: Sequence[str],
    levels: Mapping[str, int],
    hierarchies: Mapping[str, Hierarchy],
    suppressed: np.ndarray,
    *,
    names: tuple[str, str, str] = ("table", "release", "query"),
    table_levels: Mapping[str, int] | None = None,
    true: pd.Series | None = None,
) -> Reproduction:
    """Whether grouping ``table`` by ``keys`` reproduces the DP ``cells`` exactly.

    ``cells``: the DP release's published cells (their ``keys`` columns, labels at
    ``levels``); ``truth``: the accepted input rows (raw values of ``keys``), the count
    each cell estimates; ``suppressed``: per table row, True if the row was suppressed;
    ``table_levels``: the levels a full-domain table published its columns at (labels
    read at those levels only; None: each label at its lowest level); ``true``: the
    truth's ``true_counts`` for these keys and levels when the caller already has them
    (they do not depend on the table).
    """
    keys = list(keys)
    missing = tuple(k for k in keys if k not in table.columns)
    # a frequency table of the published rows (``WEIGHT``) counts each row its weight
    weights = (
        table[WEIGHT].to_numpy(dtype=np.int64)
        if WEIGHT in table.columns
        else np.ones(len(table), dtype=np.int64)
    )
    hidden = np.asarray(suppressed, dtype=bool)
    n = int(weights.sum())
    n_sup = int(weights[hidden].sum())
    if missing:
        return Reproduction(*names, tuple(keys), n, n_sup, n - n_sup, len(cells), 0, missing)
    mapped = pd.DataFrame(
        {
            k: to_level(table[k], hierarchies.get(k), levels.get(k, 0), (table_levels or {}).get(k))
            for k in keys
        },
        index=table.index,
    )
    keep = ~hidden
    rough = mapped[keep].isna().any(axis=1).to_numpy()
    coarse = int(weights[keep][rough].sum())
    if not keys:  # a total: the table's row count is the count
        exact = int(n - n_sup == records_of(truth))
        return Reproduction(*names, (), n, n_sup, 0, max(len(cells), 1), exact)
    fine = mapped[keep][~rough]
    summed = (
        fine.assign(**{WEIGHT: weights[keep][~rough]})
        .groupby(keys, sort=False, observed=True)[WEIGHT]
        .sum()
    )
    from_table = pd.Series(
        summed.to_numpy(), index=pd.MultiIndex.from_frame(summed.index.to_frame(index=False))
    )
    if true is None:
        true = true_counts(truth, keys, levels, hierarchies)
    published = cells[keys].astype(str)
    index = pd.MultiIndex.from_frame(published)  # value_counts of a frame: a MultiIndex
    got = from_table.reindex(index, fill_value=0).to_numpy()
    want = true.reindex(index, fill_value=0).to_numpy()
    exact = int(np.count_nonzero((got == want) & (want > 0)))
    return Reproduction(*names, tuple(keys), n, n_sup, coarse, len(cells), exact)


def true_counts(
    truth: pd.DataFrame,
    keys: Sequence[str],
    levels: Mapping[str, int],
    hierarchies: Mapping[str, Hierarchy],
) -> pd.Series:
    """The count each cell of ``keys`` (labels at ``levels``) estimates: the truth's rows,
    or with a ``WEIGHT`` column (a frequency table) its summed weights, per cell."""
    keys = list(keys)
    true_keys = pd.DataFrame(
        {k: to_level(truth[k], hierarchies.get(k), levels.get(k, 0), 0) for k in keys}
    )
    if WEIGHT not in truth.columns:
        return true_keys.value_counts()
    summed = (
        true_keys.assign(**{WEIGHT: truth[WEIGHT].to_numpy()})
        .groupby(keys, observed=True, sort=False)[WEIGHT]
        .sum()
    )
    return pd.Series(
        summed.to_numpy(), index=pd.MultiIndex.from_frame(summed.index.to_frame(index=False))
    )


class Truth:
    """The accepted records for the checks on DP cells, each piece computed once however
    many tables and DP queries ask: per key columns the canonical truth frame
    (``reproduced_cells``'s ``truth``; with the ``WEIGHT`` of a frequency table), per
    (keys, levels) its cell counts (``true_counts``)."""

    def __init__(self, raw: pd.DataFrame, hierarchies: Mapping[str, Hierarchy]) -> None:
        self.raw, self.hierarchies = raw, hierarchies
        self._columns: dict[str, Any] = {}
        self._frames: dict[tuple[str, ...], pd.DataFrame] = {}
        self._counts: dict[tuple[Any, ...], pd.Series] = {}

    def holds(self, keys: Sequence[str]) -> bool:
        """Whether every key is a column of the truth (a QI or the SA)."""
        return all(k in self.raw.columns for k in keys)

    def frame(self, keys: Sequence[str]) -> pd.DataFrame:
        """The canonical ``keys`` columns, indexed like the records (a total, no keys,
        still counts them)."""
        frame = self._frames.get(tuple(keys))
        if frame is None:
            for k in keys:
                if k not in self._columns:  # categoricals: counted per distinct value
                    codes, names = canonical_strings(self.raw[k])
                    categories = pd.Index(names, dtype=object)
                    self._columns[k] = pd.Categorical.from_codes(codes, categories=categories)
            frame = pd.DataFrame({k: self._columns[k] for k in keys}, index=self.raw.index)
            if WEIGHT in self.raw.columns:  # a frequency table: its weights are the counts
                frame[WEIGHT] = self.raw[WEIGHT].to_numpy()
            self._frames[tuple(keys)] = frame
        return frame

    def counts(self, keys: Sequence[str], levels: Mapping[str, int]) -> pd.Series | None:
        """``true_counts`` of ``keys`` at ``levels`` (None for a total: no cells)."""
        if not keys:
            return None
        at = (tuple(keys), tuple(sorted(levels.items())))
        if at not in self._counts:
            self._counts[at] = true_counts(self.frame(keys), keys, levels, self.hierarchies)
        return self._counts[at]


def common_level(
    a: pd.Series, b: pd.Series, hierarchy: Hierarchy | None
) -> tuple[pd.Series, pd.Series]:
    """Both columns mapped to the coarsest level either uses (so the labels of one record
    agree); ``*``/unknown labels become NaN (agree with anything)."""
    sa, sb = a.astype(str).reset_index(drop=True), b.astype(str).reset_index(drop=True)
    if hierarchy is None:
        return sa.where(sa != SUPPRESSED), sb.where(sb != SUPPRESSED)
    level = _level_of(hierarchy)
    used = [level[v] for v in pd.unique(pd.concat([sa, sb])) if v in level and v != SUPPRESSED]
    top = max(used, default=0)
    up = _ancestors(hierarchy, top)
    ma, mb = per_distinct(sa, lambda v: v.map(up)), per_distinct(sb, lambda v: v.map(up))
    return ma.where(ma != SUPPRESSED), mb.where(mb != SUPPRESSED)


@dataclass(frozen=True)
class Alignment:
    """Row-by-row agreement of two tables against chance."""

    first: str
    second: str
    rows: int
    columns: tuple[str, ...]
    agreement: float  # share of row indices i whose values agree in both tables
    chance: float  # the same share between row i and an unrelated row
    threshold: float

    @property
    def aligned(self) -> bool:
        return self.rows > 0 and bool(self.columns) and self.agreement > self.threshold

    def message(self) -> str:
        return (
            f"tables {self.first!r} and {self.second!r} are in the same row order: row i of "
            f"both agrees on ({', '.join(self.columns)}) for {self.agreement:.1%} of rows "
            f"against {self.chance:.1%} by chance, so they join row by row"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "tables": [self.first, self.second],
            "aligned": self.aligned,
            "rows": self.rows,
            "columns": list(self.columns),
            "agreement": self.agreement,
            "chance": self.chance,
            "threshold": self.threshold,
        }


def _codes(a: pd.Series, b: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Both columns as codes of one shared factorisation (-1 where a value is missing)."""
    codes, _ = pd.factorize(pd.concat([a, b], ignore_index=True), use_na_sentinel=True)
    return codes[: len(a)], codes[len(a) :]


def _agree(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> np.ndarray:
    """Row-wise: every column equal, or missing on either side (a wildcard)."""
    ok = np.ones(len(a[0]), dtype=bool)
    for x, y in zip(a, b, strict=True):
        ok &= (x < 0) | (y < 0) | (x == y)
    return ok


Coded = dict[str, tuple[np.ndarray, np.ndarray]]  # column -> (codes per row, labels)


def encode_rows(table: pd.DataFrame) -> Coded:
    """Each column of ``table`` as (an int64 code per row, the distinct labels as strings):
    encoded once per table, so every pair it is aligned with maps labels, not rows."""
    out: Coded = {}
    for c in table.columns:
        codes, uniques = pd.factorize(table[c].astype(str), use_na_sentinel=False)
        out[str(c)] = (np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object))
    return out


def _common_codes(
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    n: int,
    hierarchy: Hierarchy | None,
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``common_level`` on codes: both columns' first ``n`` rows as codes of one shared
    factorisation of their labels at the coarsest level either uses (-1: ``*``/unknown,
    a wildcard), and how many distinct labels the two have together (None: no label)."""
    ca, cb = a[0][:n], b[0][:n]
    present_a = np.bincount(ca, minlength=len(a[1])) > 0  # the labels of these n rows
    present_b = np.bincount(cb, minlength=len(b[1])) > 0
    la, lb = a[1], b[1]
    if hierarchy is None:
        ma, mb = la.copy(), lb.copy()
        ma[ma == SUPPRESSED], mb[mb == SUPPRESSED] = None, None
    else:
        level = _level_of(hierarchy)
        seen = pd.unique(np.concatenate([la[present_a], lb[present_b]]))
        used = [level[v] for v in seen if v in level and v != SUPPRESSED]
        up = _ancestors(hierarchy, max(used, default=0))
        ma = np.asarray([up.get(v) for v in la], dtype=object)
        mb = np.asarray([up.get(v) for v in lb], dtype=object)
        ma[ma == SUPPRESSED], mb[mb == SUPPRESSED] = None, None
    ma[~present_a], mb[~present_b] = None, None  # labels of other rows count nowhere
    both, _ = pd.factorize(pd.Series(np.concatenate([ma, mb]), dtype=object))
    lut_a, lut_b = both[: len(ma)], both[len(ma) :]
    if (lut_a < 0).all() or (lut_b < 0).all():
        return None
    distinct = len(np.unique(lut_a[lut_a >= 0])) + len(np.unique(lut_b[lut_b >= 0]))
    return lut_a[ca], lut_b[cb], distinct


def row_order_alignment(
    first: pd.DataFrame | Coded,
    second: pd.DataFrame | Coded,
    hierarchies: Mapping[str, Hierarchy],
    *,
    names: tuple[str, str] = ("first", "second"),
    max_rows: int = ROW_ORDER_ROWS,
    shifts: int = 8,
) -> Alignment:
    """Whether row i of ``first`` and of ``second`` are the same record more often than
    chance. Chance is measured on the same tables with ``second`` cyclically shifted by
    ``shifts`` offsets spread over the rows (unrelated rows, same value frequencies); the
    agreement is "aligned" when it exceeds chance by 5 standard errors plus 1 point.
    Either table may be given encoded (``encode_rows``), which a table compared with
    several others is once."""
    fa_cols = first if isinstance(first, dict) else encode_rows(first.iloc[:max_rows])
    fb_cols = second if isinstance(second, dict) else encode_rows(second.iloc[:max_rows])
    length = [len(next(iter(t.values()))[0]) if t else 0 for t in (fa_cols, fb_cols)]
    if isinstance(first, pd.DataFrame):
        length[0] = len(first)
    if isinstance(second, pd.DataFrame):
        length[1] = len(second)
    n = min(*length, max_rows)
    fa: list[np.ndarray] = []
    fb: list[np.ndarray] = []
    used_cols: list[str] = []
    for c in [c for c in fa_cols if c in fb_cols]:
        found = _common_codes(fa_cols[c], fb_cols[c], n, hierarchies.get(c))
        if found is not None and found[2] > 2:  # a column that is one label says nothing
            fa.append(found[0])
            fb.append(found[1])
            used_cols.append(c)
    used = tuple(used_cols)
    if n < 2 or not used:
        return Alignment(*names, n, used, 0.0, 0.0, 1.0)
    agreement = float(_agree(fa, fb).mean())
    offsets = sorted({max(1, (n * (j + 1)) // (shifts + 1)) % n or 1 for j in range(shifts)})
    rates = []
    for s in offsets:  # row i against row i - s: unrelated records
        rates.append(float(_agree(fa, [np.roll(y, s) for y in fb]).mean()))
    chance = float(np.mean(rates))
    se = math.sqrt(max(chance * (1 - chance), 1e-12) / n)
    return Alignment(*names, n, used, agreement, chance, min(1.0, chance + 5 * se + 0.01))
