"""Profile of the microdata, computed batch-wise: rows, distinct values, QI combinations.

Distinct counts use 64-bit hashes of the values (strings: ``privpipe.hashing``, by their
bytes; other types: pandas' hash_pandas_object), so
memory grows with the number of distinct values at 8 bytes each, never with rows
or with the length of the values; with 10^7 distinct values the chance that two
collide is below 3·10^-6. The frequency table of the QI combinations is kept the
same way (hash → count), so the share of unique combinations is exact up to that
collision bound. With a privacy unit, a person with several rows is one person:
the profile also counts persons whose QI combination no other person shares.
Value counts of the QIs and the sensitive attribute are kept exactly: they are
bounded by the attributes' domains and are needed to check the hierarchies. They
are internal (never published): they can hold small counts. Those columns' distinct
counts are the number of values their counts hold (no hashes of them are kept).

Exact distinct counts are kept only for the columns that matter (``exact``: the QIs,
the sensitive attribute, the privacy unit, the DP releases' columns); every other
column gets a HyperLogLog estimate (2^14 one-byte registers of the same 64-bit hashes,
relative standard error about 0.8%, exact-enough below ~40k values by linear counting)
and ``"exact": false`` in its entry: a column of a million distinct floats that no
release uses costs 16 KiB and no sort instead of millions of hashes.

When an anonymised release's frequency table holds the QIs, the sensitive attribute
and the person id (``FrequencyTable``: the distinct tuples and their rows), the figures
of those columns come from it (``table_figures``) instead of from every batch: their
value counts, distinct counts, the QI combinations and the persons per combination are
the same numbers, from a table bounded by the distinct tuples, and the summary built
it anyway. The batches then give only the rows, the missing cells and the other
columns' distinct counts (``ProfileFn(from_table=True)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
from apache_beam.pvalue import AsSingleton

from privpipe.anonymity.arrays import (
    one_value_each,
    sorted_unique,
    sum_by_key,
    unique_counts,
    unique_first,
    unique_first_inverse,
)
from privpipe.anonymity.summary import packed_key, unit_hashes
from privpipe.hashing import (
    combine_hashes,
    is_text,
    string_hashes,
    string_hashes_and_codes,
    string_hashes_by_value,
)
from privpipe.transforms.context import COUNT, column_counts
from privpipe.transforms.memory import release_free_memory
from privpipe.transforms.overlap import OverlappedCombineFn
from privpipe.transforms.sink import write_json_step
from privpipe.transforms.timing import timed

_FOLD_COUNTS = 32  # batches' value counts summed at once
_SAMPLE = 4096  # rows whose distinct count picks how a string column is hashed


def _hash_and_count(values: pd.Series) -> tuple[np.ndarray, pd.Series]:
    """A text column's ``_hash`` and its value counts (missing dropped) from one dictionary
    encoding (``string_hashes_and_codes``) instead of two hash passes: a 64k-row batch's
    14-value column 2.0 against 3.6 ms, a 4,000-value one 2.7 against 5.0 ms."""
    hashes, codes, dictionary = string_hashes_and_codes(values)
    counts = np.bincount(codes, minlength=len(dictionary) + 1)[:-1].astype(np.int64)
    labels = pd.Index(dictionary.to_pandas(), dtype="str", name=values.name)
    return hashes, pd.Series(counts, index=labels, name="count")[counts > 0]


def _hash(values: pd.Series) -> np.ndarray:
    """64-bit hashes of a column: strings by their bytes (``string_hashes``, no Python
    object per value; once per distinct value when the batch's first rows repeat values,
    ``string_hashes_by_value``: the same hashes), other types by pandas'
    ``hash_pandas_object``."""
    if is_text(values):
        head = values.iloc[:_SAMPLE]
        if 4 * head.nunique(dropna=False) <= len(head):
            return string_hashes_by_value(values)
        return string_hashes(values)
    return pd.util.hash_pandas_object(values, index=False).to_numpy(dtype=np.uint64)


HLL_BITS = 14  # 2^14 registers: relative standard error 1.04 / 2^7 ≈ 0.8%
_HLL_M = 1 << HLL_BITS


def hll_update(registers: np.ndarray, hashes: np.ndarray) -> None:
    """Add 64-bit hashes to HyperLogLog registers (in place, vectorised)."""
    if not len(hashes):
        return
    index = (hashes >> np.uint64(64 - HLL_BITS)).astype(np.intp)
    rest = (hashes << np.uint64(HLL_BITS)) | np.uint64(1 << (HLL_BITS - 1))  # rank ≤ 51
    # leading zeros + 1 of the remaining bits: 64 - bit length (frexp's exponent)
    _, exponent = np.frexp(rest.astype(np.float64))
    rank = (65 - exponent).clip(1, 64 - HLL_BITS + 1).astype(np.uint8)
    np.maximum.at(registers, index, rank)


def hll_estimate(registers: np.ndarray) -> int:
    """Distinct values added to the registers (linear counting while many are empty)."""
    m = float(len(registers))
    alpha = 0.7213 / (1 + 1.079 / m)
    raw = alpha * m * m / float(np.sum(np.ldexp(1.0, -registers.astype(np.int64))))
    zeros = int(np.count_nonzero(registers == 0))
    if raw <= 2.5 * m and zeros:
        return round(float(m * np.log(m / zeros)))
    return round(raw)


def _compact_unique(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [sorted_unique(np.concatenate(parts))] if len(parts) > 1 else parts


def _compact_counts(
    parts: list[tuple[np.ndarray, np.ndarray]],
) -> list[tuple[np.ndarray, np.ndarray]]:
    if len(parts) <= 1:
        return parts
    keys = np.concatenate([k for k, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    return [sum_by_key(keys, counts)]


def _compact_pairs(
    parts: list[tuple[np.ndarray, np.ndarray]],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Distinct (person hash, QI hash) pairs; the pair key is recomputed, never stored."""
    if len(parts) <= 1:
        return parts
    persons = np.concatenate([p for p, _ in parts])
    qis = np.concatenate([q for _, q in parts])
    _, first = unique_first(combine_hashes([qis, persons]))
    return [(persons[first], qis[first])]


def _size(parts: Sequence[Any]) -> int:
    return sum(len(p[0]) if isinstance(p, tuple) else len(p) for p in parts)


@dataclass
class ProfileAccumulator:
    """Partial profile of some batches; merged across batches and workers."""

    rows: int = 0
    missing: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, list[np.ndarray]] = field(default_factory=dict)
    compacted: dict[str, int] = field(default_factory=dict)
    combos: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    combos_compacted: int = 0
    # distinct (person hash, QI-combination hash) pairs when a unit is given; the unit
    # column's distinct count comes from them (no second set of millions of person hashes)
    pairs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    pairs_compacted: int = 0
    value_counts: dict[str, pd.Series] = field(default_factory=dict)
    # batches' value counts not yet added to ``value_counts`` (summed _FOLD_COUNTS at once)
    pending_counts: dict[str, list[pd.Series]] = field(default_factory=dict)
    # HyperLogLog registers of the columns whose distinct count is estimated
    sketches: dict[str, np.ndarray] = field(default_factory=dict)

    def add_counts(self, col: str, counts: pd.Series) -> None:
        """Add value counts: kept aside, then summed by value _FOLD_COUNTS at a time (one
        concatenation and group sum instead of an index alignment per batch: 0.06 against
        0.21 s for a 4,000-value column over 46 batches)."""
        pending = self.pending_counts.setdefault(col, [])
        pending.append(counts)
        if len(pending) >= _FOLD_COUNTS:
            self.fold_counts(col)

    def fold_counts(self, col: str | None = None) -> None:
        """Sum the pending value counts of ``col`` (None: every column) into
        ``value_counts``."""
        for name in [col] if col is not None else list(self.pending_counts):
            parts = self.pending_counts.pop(name, [])
            prev = self.value_counts.get(name)
            if prev is not None:
                parts.insert(0, prev)
            if len(parts) > 1:
                parts = [pd.concat(parts).groupby(level=0, sort=False).sum()]
            if parts:
                self.value_counts[name] = parts[0].astype("int64")

    def maybe_compact(self, force: bool = False) -> None:
        """Deduplicate once the pending parts double the last compacted size (amortised),
        or now with ``force``."""
        if force:
            self.fold_counts()
        for col, parts in self.hashes.items():
            if force or _size(parts) > 2 * max(self.compacted.get(col, 0), 65_536):
                self.hashes[col] = _compact_unique(parts)
                self.compacted[col] = _size(self.hashes[col])
        if force or _size(self.combos) > 2 * max(self.combos_compacted, 65_536):
            self.combos = _compact_counts(self.combos)
            self.combos_compacted = _size(self.combos)
        if force or _size(self.pairs) > 2 * max(self.pairs_compacted, 65_536):
            self.pairs = _compact_pairs(self.pairs)
            self.pairs_compacted = _size(self.pairs)


class ProfileFn(beam.CombineFn):  # type: ignore[misc]
    """CombineFn over DataFrame batches producing the profile dict."""

    def __init__(
        self,
        columns: Sequence[str],
        quasi_identifiers: Sequence[str],
        counted: Sequence[str],
        privacy_unit: str | None = None,
        exact: Sequence[str] | None = None,
        from_table: bool = False,
    ) -> None:
        self.columns = list(columns)
        self.qis = list(quasi_identifiers)
        self.counted = list(counted)  # columns whose exact value counts are kept
        self.unit = privacy_unit
        # columns whose distinct count is exact (None: all); the others are estimated.
        # Counted columns are exact whatever ``exact`` says: their value counts are kept
        self.exact = None if exact is None else sorted({*exact, *self.qis, *self.counted})
        # the QIs, the counted columns and the unit figured from a frequency table
        # (``table_figures``): of those, the batches give only the missing cells
        self.from_table = from_table
        self.tabled = frozenset(
            [*self.qis, *self.counted, *([privacy_unit] if privacy_unit else [])]
        )

    def create_accumulator(self) -> ProfileAccumulator:
        return ProfileAccumulator()

    def add_input(self, acc: ProfileAccumulator, batch: pd.DataFrame) -> ProfileAccumulator:
        """A batch's rows, missing cells and distinct values; the counted columns' value
        counts and the QI combinations, unless a frequency table gives those
        (``from_table``: of its columns, only the missing cells are counted here)."""
        acc.rows += len(batch)
        hashes: dict[str, np.ndarray] = {}
        for col in [] if self.from_table else self.counted:  # hashes and counts, one encoding
            series = batch[col]
            if is_text(series):
                hashes[col], counts = _hash_and_count(series)
            else:
                counts = series.value_counts(dropna=True)
            acc.add_counts(col, counts)

        def hashed(col: str) -> np.ndarray:
            if col not in hashes:
                hashes[col] = _hash(batch[col])
            return hashes[col]

        for col in self.columns:
            series = batch[col]
            missing = series.isna()
            acc.missing[col] = acc.missing.get(col, 0) + int(missing.sum())
            if self.from_table and col in self.tabled:
                continue  # its figures: ``table_figures``
            if self.exact is not None and col not in self.exact and col != self.unit:
                registers = acc.sketches.setdefault(col, np.zeros(_HLL_M, dtype=np.uint8))
                hll_update(registers, _hash(series[~missing]) if missing.any() else hashed(col))
            elif col in self.counted and col != self.unit:
                continue  # its distinct values: the keys of its exact value counts
            elif col != self.unit or not self.qis:
                acc.hashes.setdefault(col, []).append(sorted_unique(hashed(col)))
        if self.qis and not self.from_table:
            qi_hash = combine_hashes([hashed(q) for q in self.qis])
            keys, counts = unique_counts(qi_hash)
            acc.combos.append((keys, counts.astype(np.int64)))
            if self.unit is not None:
                person = hashed(self.unit)
                _, first = unique_first(combine_hashes([qi_hash, person]))
                acc.pairs.append((person[first], qi_hash[first]))
        acc.maybe_compact()
        return acc

    def compact(self, acc: ProfileAccumulator) -> ProfileAccumulator:
        """Before a partial profile is encoded and shipped: merge its pending parts."""
        acc.maybe_compact(force=True)
        return acc

    def merge_accumulators(self, accs: Iterable[ProfileAccumulator]) -> ProfileAccumulator:
        release_free_memory()  # after the read: the merge peaks on top of what it left
        out = ProfileAccumulator()
        for a in accs:
            out.rows += a.rows
            for col, n in a.missing.items():
                out.missing[col] = out.missing.get(col, 0) + n
            for col, parts in a.hashes.items():
                out.hashes.setdefault(col, []).extend(parts)
            out.combos.extend(a.combos)
            out.pairs.extend(a.pairs)
            a.fold_counts()
            for col, vc in a.value_counts.items():
                out.add_counts(col, vc)
            for col, registers in a.sketches.items():
                mine = out.sketches.setdefault(col, np.zeros(_HLL_M, dtype=np.uint8))
                np.maximum(mine, registers, out=mine)
        out.maybe_compact()
        return out

    def extract_output(self, acc: ProfileAccumulator) -> Any:
        if self.from_table:  # completed by ``with_table`` once the table's figures are in
            acc.maybe_compact(force=True)
            return acc
        return profile_from(acc, self.columns, self.qis, self.unit, self.counted)

    def with_table(self, acc: ProfileAccumulator, table: TableFigures) -> dict[str, Any]:
        """The profile of ``from_table`` batches completed by the frequency table's figures."""
        return profile_from(acc, self.columns, self.qis, self.unit, self.counted, table)


@dataclass(frozen=True)
class TableFigures:
    """The profile's figures of the columns a frequency table holds (``table_figures``)."""

    value_counts: dict[str, pd.Series]  # rows per value of each counted column, no missing
    combinations: int  # distinct QI combinations
    unique_combinations: int  # combinations of one row
    persons: int | None  # distinct persons (None without a unit)
    unique_persons: int | None  # combinations of one person


def table_figures(
    freq: pd.DataFrame, qis: Sequence[str], counted: Sequence[str], unit: str | None
) -> TableFigures:
    """What the profile counts of the QIs, the counted columns and the person id, from a
    ``FrequencyTable`` of (at least) those columns: distinct tuples with their rows in
    ``count``, values as strings and the unit as 64-bit hashes. The same numbers as
    counting every batch: values are told apart as the table tells them (by their
    strings; missing is no value), combinations by their values (missing one more), and
    the value counts are the ones the search's hierarchies are resolved from
    (``column_counts``)."""
    every = column_counts(freq, skip=unit)
    value_counts = {c: every[c][every[c].index.notna()] for c in counted}
    codes = [_codes(freq[q]) + 1 for q in qis]  # 0: missing
    # each row's combination (only their number and sizes count): a summary's table without
    # a missing QI is in the combinations' order, which unique_first_inverse takes unsorted
    distinct, _, combo = unique_first_inverse(
        packed_key(codes, [int(c.max(initial=0)) + 1 for c in codes])
    )
    n_combos = int(distinct.shape[0])
    weights = freq[COUNT].to_numpy(dtype=np.float64)
    per_combo = np.rint(np.bincount(combo, weights=weights, minlength=n_combos))
    persons = unique_persons = None
    if unit is not None:
        ids = unit_hashes(freq[unit], unit)
        persons = len(pd.unique(ids))
        alone = one_value_each(np.asarray(combo, dtype=np.int64), ids, n_combos)
        unique_persons = int(np.count_nonzero(alone))
    return TableFigures(
        value_counts, n_combos, int(np.count_nonzero(per_combo == 1)), persons, unique_persons
    )


def _codes(column: pd.Series) -> np.ndarray:
    """A table column's value codes, -1 where missing: a Categorical's own, else factorised."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return np.asarray(column.cat.codes, dtype=np.int64)
    return np.asarray(pd.factorize(column)[0], dtype=np.int64)


def profile_from(
    acc: ProfileAccumulator,
    columns: Sequence[str],
    qis: Sequence[str],
    unit: str | None = None,
    counted: Sequence[str] = (),
    table: TableFigures | None = None,
) -> dict[str, Any]:
    """The published profile (counts only, no values) plus internal value counts.
    ``counted``: the columns whose exact value counts were kept; their distinct count is
    how many values those counts hold (no hashes of them were kept). ``table``: those
    counts, the QI combinations and the persons from a frequency table instead."""
    acc.fold_counts()
    value_counts = acc.value_counts if table is None else table.value_counts
    cols: dict[str, dict[str, Any]] = {}
    for col in columns:
        missing = int(acc.missing.get(col, 0))
        if col in acc.sketches:  # an estimate: the column matters to no release
            distinct = hll_estimate(acc.sketches[col])
        elif col in counted and col != unit:  # the values its exact counts hold
            counts = value_counts.get(col)
            distinct = 0 if counts is None else int((counts > 0).sum())
        elif table is not None and col == unit:
            distinct = table.persons or 0
        else:
            parts = _compact_unique(acc.hashes.get(col, []))
            # missing is not a value
            distinct = max((len(parts[0]) if parts else 0) - (1 if missing else 0), 0)
        cols[col] = {
            "distinct": int(distinct),
            "missing": missing,
            "exact": col not in acc.sketches,
        }
    if table is None:
        combos = _compact_counts(acc.combos)
        n_combos = len(combos[0][0]) if combos else 0
        uniques = int((combos[0][1] == 1).sum()) if combos else 0
    else:
        n_combos, uniques = table.combinations, table.unique_combinations
    rows = acc.rows
    combos_out: dict[str, Any] = {
        "distinct": n_combos,
        "unique": uniques,
        "unique_share_of_rows": (uniques / rows) if rows else 0.0,
        "unique_share_of_combinations": (uniques / n_combos) if n_combos else 0.0,
    }
    pairs = _compact_pairs(acc.pairs) if unit is not None and table is None else []
    if table is not None and unit is not None:  # the unit's entry: from the table above
        persons = table.persons or 0
        if persons and table.unique_persons is not None:
            combos_out["persons"] = persons
            combos_out["unique_persons"] = table.unique_persons
            combos_out["unique_share_of_persons"] = table.unique_persons / persons
    if unit is not None and unit in columns and pairs and unit not in acc.hashes:
        distinct = len(sorted_unique(pairs[0][0])) - (1 if acc.missing.get(unit, 0) else 0)
        cols[unit] = {
            "distinct": int(max(distinct, 0)),
            "missing": int(acc.missing.get(unit, 0)),
            "exact": True,
        }
    if unit is not None:
        persons = cols[unit]["distinct"] if unit in cols else 0
        if pairs and persons:
            # persons per QI combination; a person alone in their combination is unique
            _, per_combo = unique_counts(pairs[0][1])
            unique_persons = int((per_combo == 1).sum())
            combos_out["persons"] = persons
            combos_out["unique_persons"] = unique_persons
            combos_out["unique_share_of_persons"] = unique_persons / persons
    return {
        "rows": rows,
        "columns": cols,
        "quasi_identifiers": list(qis),
        "qi_combinations": combos_out,
        "_value_counts": {
            col: [[_plain(v), int(n)] for v, n in vc.items()] for col, vc in value_counts.items()
        },
    }


def _plain(value: Any) -> Any:
    """A JSON-able scalar (numpy/pandas scalars to Python)."""
    return value.item() if hasattr(value, "item") else value


def split_internal(profile: dict[str, Any]) -> tuple[dict[str, Any], dict[str, pd.Series]]:
    """Separate the publishable profile from the internal value counts (value -> rows)."""
    public = {k: v for k, v in profile.items() if not k.startswith("_")}
    counts = {
        col: pd.Series([n for _, n in pairs], index=[v for v, _ in pairs], dtype="int64")
        for col, pairs in profile.get("_value_counts", {}).items()
    }
    return public, counts


class ProfileMicrodata(beam.PTransform):  # type: ignore[misc]
    """PCollection[pd.DataFrame] -> writes the profile as JSON to `path` (one element: path).

    ``table``: a one-element PCollection of a ``FrequencyTable`` of (at least) the QIs,
    the counted columns and the unit; their figures then come from it (``table_figures``)
    and the batches give the rest."""

    def __init__(
        self,
        path: str,
        columns: Sequence[str],
        quasi_identifiers: Sequence[str],
        counted: Sequence[str],
        privacy_unit: str | None = None,
        exact: Sequence[str] | None = None,
        table: beam.PCollection | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.table = table
        self.fn = ProfileFn(
            columns, quasi_identifiers, counted, privacy_unit, exact, from_table=table is not None
        )

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        fn = self.fn
        profile = batches | "Profile" >> beam.CombineGlobally(OverlappedCombineFn("profile", fn))
        if self.table is not None:
            figures = self.table | "TableFigures" >> beam.Map(
                timed("profile", table_figures), fn.qis, fn.counted, fn.unit
            )
            profile = profile | "WithTable" >> beam.Map(fn.with_table, AsSingleton(figures))
        return profile | "WriteProfile" >> beam.Map(write_json_step, self.path)
