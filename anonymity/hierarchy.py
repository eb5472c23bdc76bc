"""Generalisation hierarchies: materialised tables of raw value -> label per level.

A hierarchy has one row per raw value (level 0) and one column per level; the last
level is the single full-suppression value ``*``. A transformation picks one level per
quasi-identifier. Everything a search or a recoding step needs (label per raw code, dense
label ids for grouping, leaf counts for the Loss metric, parent links between levels)
is precomputed once at construction, so the per-batch operations are array lookups.

Raw values are strings. Data values are matched to them by ``Hierarchy.encode``: strings
exactly as they are (no stripping, no case folding), numbers by a canonical string
(``39`` and ``39.0`` -> ``"39"``, ``39.5`` -> ``"39.5"``, ``True`` -> ``"True"``),
and missing cells (``None``/``NaN``/``""``) as ``""``, which is never a raw value but may
be mapped with an alias. Builders read the distinct raw values of the data the same
way, so their first column matches what ``encode`` looks up.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from itertools import islice, pairwise
from pathlib import Path
from typing import Any, Final, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.errors import ConfigError, InputDataError, OutputError

__all__ = [
    "SUPPRESSED",
    "Hierarchy",
    "build_dates",
    "build_grouping",
    "build_intervals",
    "build_mask",
    "canonical_column",
    "canonical_factorize",
    "canonical_scalar",
    "hierarchy_to_arx_csv",
    "load_arx_csv",
]

SUPPRESSED: Final = "*"
"""The conventional label of the top level (full suppression)."""

ObjArray: TypeAlias = npt.NDArray[np.object_]
IntArray: TypeAlias = npt.NDArray[np.int64]

_EXAMPLES: Final = 5
RESTORED_KEPT: Final = 64
"""Unpickled hierarchy definitions kept per process (a run has one per QI and sensitive
attribute; beyond this many, the least recently unpickled go first)."""
_DATE_LEVELS: Final = {"week": 0, "month": 1, "year": 2, "decade": 3}


# --------------------------------------------------------------------------- helpers


def _show(value: object, limit: int = 40) -> str:
    """Quote a value for an error message (missing cells shown as <empty>)."""
    if value is None or (isinstance(value, str) and value == ""):
        return "<empty>"
    if not isinstance(value, str) and pd.api.types.is_scalar(value) and pd.isna(value):
        return "<empty>"
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return repr(text)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _examples(values: Sequence[object], notes: Sequence[str] | None = None) -> str:
    """Up to five quoted examples, with an optional note each, and how many more."""
    shown = []
    for i, value in enumerate(islice(values, _EXAMPLES)):
        note = f" ({notes[i]})" if notes is not None else ""
        shown.append(f"{_show(value)}{note}")
    more = f" and {len(values) - _EXAMPLES} more" if len(values) > _EXAMPLES else ""
    return ", ".join(shown) + more


def _canonical_scalar(value: object) -> str:
    """Canonical string of one value: numbers without a spurious ``.0``."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        number = float(value)
        if math.isnan(number):
            return ""
        if math.isfinite(number) and number.is_integer():
            return str(int(number))
        return repr(number)
    return str(value)


def _float_strings(numbers: npt.NDArray[np.float64]) -> ObjArray:
    """Vectorised canonical strings of floats: integral values print as integers."""
    out = np.empty(numbers.shape[0], dtype=object)
    integral = np.isfinite(numbers) & (np.floor(numbers) == numbers) & (np.abs(numbers) < 2.0**63)
    out[integral] = numbers[integral].astype(np.int64).astype(str)
    rest = ~integral
    out[rest] = numbers[rest].astype(str)  # shortest round-trip repr, like Python's repr
    out[np.isnan(numbers)] = ""
    return out


def _canonical_array(array: npt.NDArray[Any]) -> ObjArray:
    """Canonical strings of a 1-D array (usually the distinct values of a column).

    Strings and numeric dtypes are handled in C; only object arrays mixing types fall
    back to a Python loop, which runs over distinct values, never over rows.
    """
    kind = array.dtype.kind
    if kind in "iu":
        return cast(ObjArray, array.astype(str).astype(object))
    if kind == "b":
        return cast(ObjArray, np.where(array, "True", "False").astype(object))
    if kind == "f":
        return _float_strings(array.astype(np.float64))
    if kind == "U":
        return cast(ObjArray, array.astype(object))
    if kind == "O":
        inferred = pd.api.types.infer_dtype(array, skipna=False)
        if inferred in ("string", "empty"):
            return cast(ObjArray, array)
        if inferred == "integer":
            try:
                return cast(ObjArray, array.astype(np.int64).astype(str).astype(object))
            except OverflowError:
                pass
        if inferred in ("floating", "mixed-integer-float"):
            return _float_strings(array.astype(np.float64))
    out = np.empty(array.shape[0], dtype=object)
    out[:] = [_canonical_scalar(v) for v in array.tolist()]
    return out


def _factorize(values: Any) -> tuple[IntArray, ObjArray]:
    """Codes per element and canonical strings of the distinct values (missing -> -1)."""
    if isinstance(values, str | bytes):
        raise TypeError("expected a column of values, got a single string")
    if not isinstance(values, pd.Series | pd.Index | np.ndarray | pd.api.extensions.ExtensionArray):
        if not isinstance(values, Sequence):
            values = list(cast(Iterable[Any], values))
        array = np.empty(len(values), dtype=object)
        array[:] = values
        values = array
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise ValueError(f"expected a 1-D column of values, got an array of shape {values.shape}")
    codes, uniques = pd.factorize(values)
    return (
        np.asarray(codes, dtype=np.int64),
        _canonical_array(np.asarray(uniques)),
    )


def canonical_scalar(value: object) -> str:
    """One value as the canonical string hierarchies match (``39.0`` -> ``"39"``)."""
    return _canonical_scalar(value)


def canonical_factorize(values: Any) -> tuple[IntArray, ObjArray]:
    """Codes per element and the canonical strings of the distinct values (missing -> -1).

    The same canonical form ``Hierarchy.encode`` matches (``39.0`` -> ``"39"``), so other
    modules can key data by value without a hierarchy.
    """
    return _factorize(values)


def canonical_column(values: Any) -> ObjArray:
    """Canonical strings of a column, one per row (missing -> ``""``)."""
    codes, uniques = _factorize(values)
    table = np.append(uniques, "").astype(object)
    out: ObjArray = table[codes]
    return out


def _distinct_strings(values: Any) -> ObjArray:
    """Distinct canonical strings of a column in order of first appearance, without
    missing or blank cells (those are left for ``check_covers`` to report or the map)."""
    _, uniques = _factorize(values)
    distinct = pd.unique(uniques)
    filled = pd.Series(distinct, dtype="str").str.strip().ne("").to_numpy(dtype=bool)
    return cast(ObjArray, np.asarray(distinct[filled], dtype=object))


def _readonly(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.setflags(write=False)
    return array


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _format_bound(value: float) -> str:
    """Interval bound for a label: integers without ``.0``, others to 15 digits."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".15g")


# --------------------------------------------------------------------------- Hierarchy


@dataclass(frozen=True, slots=True)
class _Cache:
    """Per-level arrays precomputed at construction (all read-only)."""

    labels: tuple[ObjArray, ...]  # label per raw code, per level
    ids: IntArray  # (levels, n): dense label id per raw code
    names: tuple[ObjArray, ...]  # distinct labels per level, indexed by label id
    leaves: IntArray  # (levels, n): raw values sharing the raw code's label
    parents: tuple[IntArray, ...]  # per level < top: label id at level+1 per label id
    lookup: Any  # pd.Index of raw values then alias keys
    lookup_codes: IntArray  # raw code per lookup entry
    missing_code: int  # raw code of a missing cell ("" alias) or -1


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """A generalisation hierarchy for one attribute, validated at construction.

    ``table[i, l]`` is the label of raw value ``table[i, 0]`` at level ``l``; raw codes
    are row indices. ``aliases`` map values found in the data to raw values (the config's
    ``hierarchies.<attr>.map``; a ``None`` or ``""`` key maps missing cells).
    ``line_numbers`` (init only) are the file lines of the rows, for error messages.
    Invalid tables raise ``InputDataError``; invalid aliases raise ``ConfigError``.
    """

    attribute: str
    table: ObjArray
    source: str = ""
    aliases: Mapping[str, str] = field(default_factory=dict)
    line_numbers: InitVar[Sequence[int] | None] = None
    _cache: _Cache = field(init=False, repr=False, compare=False)

    def __post_init__(self, line_numbers: Sequence[int] | None) -> None:
        table = _as_table(self.table, self.attribute)
        object.__setattr__(self, "table", table)
        if line_numbers is not None and len(line_numbers) != table.shape[0]:
            raise ValueError(
                f"line_numbers has {len(line_numbers)} entries for {table.shape[0]} rows"
            )
        labels, ids, names, parents = _analyse(
            table, self.source or f"hierarchy of {self.attribute!r}", line_numbers
        )
        leaves = np.empty_like(ids)
        for level in range(ids.shape[0]):
            counts = np.bincount(ids[level], minlength=names[level].shape[0])
            leaves[level] = counts[ids[level]]
        aliases = _check_aliases(self.aliases, labels[0], self.attribute, self.source)
        object.__setattr__(self, "aliases", aliases)
        raw_index = pd.Index(labels[0], dtype=object)
        keys = np.array(list(aliases), dtype=object)
        targets = raw_index.get_indexer(np.array(list(aliases.values()), dtype=object))
        lookup_codes = np.concatenate([np.arange(table.shape[0], dtype=np.int64), targets])
        missing_code = int(targets[list(aliases).index("")]) if "" in aliases else -1
        cache = _Cache(
            labels=labels,
            ids=_readonly(ids),
            names=names,
            leaves=_readonly(leaves),
            parents=parents,
            lookup=pd.Index(np.concatenate([labels[0], keys]), dtype=object),
            lookup_codes=_readonly(lookup_codes.astype(np.int64)),
            missing_code=missing_code,
        )
        object.__setattr__(self, "_cache", cache)

    def __repr__(self) -> str:
        return (
            f"Hierarchy(attribute={self.attribute!r}, values={self.domain_size}, "
            f"levels={self.levels}, source={self.source!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle only the definition (smaller side inputs); caches are rebuilt, once per
        definition and process (:func:`_restored`)."""
        cells = tuple(self.table.ravel().tolist())
        definition = (self.attribute, self.source, self.table.shape, cells)
        return (_restored, (*definition, tuple(self.aliases.items())))

    # ----------------------------------------------------------------- shape

    @property
    def levels(self) -> int:
        """Number of levels, raw values included."""
        return int(self.table.shape[1])

    @property
    def height(self) -> int:
        """Index of the top level (``levels - 1``)."""
        return self.levels - 1

    @property
    def domain_size(self) -> int:
        """Number of raw values (``|dom|`` of the Loss metric)."""
        return int(self.table.shape[0])

    @property
    def values(self) -> ObjArray:
        """The raw values (level 0), indexed by raw code."""
        return self._cache.labels[0]

    # ----------------------------------------------------------------- lookups

    def encode(self, values: Any) -> IntArray:
        """Raw code (row index) per input value, after aliases; -1 if not in the hierarchy.

        Accepts a Series, Index, array or sequence of strings or numbers (see the module
        docstring for how numbers and missing cells are matched). Work is done per
        distinct value, then broadcast with the factorize codes; a categorical column
        (the rows ``ExpandTable`` makes) is its codes into its categories, so nothing is
        factorised and the categories are looked up once per dtype, not once per batch.
        """
        if isinstance(values, pd.Series | pd.CategoricalIndex) and isinstance(
            values.dtype, pd.CategoricalDtype
        ):
            out: IntArray = self._per_category(values.dtype)[np.asarray(values.array.codes)]
            return out
        if isinstance(values, pd.Categorical):
            taken: IntArray = self._per_category(values.dtype)[np.asarray(values.codes)]
            return taken
        codes, uniques = _factorize(values)
        return self._per_value(uniques)[codes]

    def _per_value(self, uniques: ObjArray) -> IntArray:
        """Raw code per canonical string of ``uniques``, then the missing cell's code
        (codes of -1, missing cells, pick that last element)."""
        cache = self._cache
        positions = cache.lookup.get_indexer(uniques)
        mapped = np.where(positions >= 0, cache.lookup_codes[positions], -1)
        return np.append(mapped, cache.missing_code).astype(np.int64)

    def _per_category(self, dtype: pd.CategoricalDtype) -> IntArray:
        """``_per_value`` of a categorical dtype's categories, kept for the last dtype seen
        (every batch one expansion makes shares its column's dtype object)."""
        last: tuple[pd.CategoricalDtype, IntArray] | None = self.__dict__.get("_last_categories")
        if last is not None and last[0] is dtype:
            return last[1]
        table = self._per_value(_factorize(dtype.categories)[1])
        object.__setattr__(self, "_last_categories", (dtype, table))
        return table

    def labels(self, level: int) -> ObjArray:
        """Label per raw code at ``level`` (read-only object array, length domain_size)."""
        return self._cache.labels[self._level(level)]

    def generalize(self, codes: npt.ArrayLike, level: int) -> ObjArray:
        """Labels at ``level`` for an array of raw codes (any shape; -1 is refused)."""
        return self._cache.labels[self._level(level)][self._codes(codes)]

    def label_ids(self, level: int) -> IntArray:
        """Dense id (0..n_labels-1, first-appearance order) of each raw code's label."""
        return cast(IntArray, self._cache.ids[self._level(level)])

    def label_names(self, level: int) -> ObjArray:
        """Distinct labels at ``level``, indexed by the ids of ``label_ids``."""
        return self._cache.names[self._level(level)]

    def parent_ids(self, level: int) -> IntArray:
        """Label id at ``level + 1`` of each label id at ``level`` (for roll-ups)."""
        level = self._level(level)
        if level == self.height:
            raise ValueError(f"hierarchy of {self.attribute!r}: the top level has no parent")
        return self._cache.parents[level]

    def leaves_under(self, level: int) -> IntArray:
        """Per raw code: how many raw values share its label at ``level`` (Loss numerator)."""
        return cast(IntArray, self._cache.leaves[self._level(level)])

    def lowest_common_ancestor(self, codes: npt.ArrayLike) -> tuple[int, str]:
        """Lowest level at which all given raw codes share one label, and that label."""
        array = self._codes(codes).ravel()
        if array.size == 0:
            raise ValueError("lowest_common_ancestor needs at least one raw code")
        ids = self._cache.ids[:, array]
        same = ids.min(axis=1) == ids.max(axis=1)  # the top level is always True
        level = int(np.argmax(same))
        return level, str(self._cache.labels[level][array[0]])

    # ----------------------------------------------------------------- coverage

    def missing(self, values: Any, *, counts: bool | None = None) -> pd.Series:
        """Value counts of input values the hierarchy does not cover (after aliases).

        ``values`` is either one raw value per row or a value -> row count Series
        (index = distinct values). ``counts=None`` treats the Series as counts iff it is
        named ``"count"``, as ``Series.value_counts()`` names it; pass ``counts``
        explicitly otherwise. The result is sorted by count, largest first.
        """
        series = values if isinstance(values, pd.Series) else pd.Series(values, dtype=object)
        if counts is None:
            counts = series.name == "count"
        tally = series if counts else series.value_counts(dropna=False)
        uncovered = tally[(self.encode(tally.index) < 0) & (tally.to_numpy() > 0)]
        return uncovered.sort_values(ascending=False, kind="stable").rename("count")

    def check_covers(self, value_counts: pd.Series) -> None:
        """Raise InputDataError if some data values (index; values = row counts) are missing."""
        uncovered = self.missing(value_counts, counts=True)
        if uncovered.empty:
            return
        where = self.source or f"the hierarchy of {self.attribute!r}"
        row_counts = [round(float(c)) for c in uncovered.to_numpy()[:_EXAMPLES]]
        notes = [_plural(c, "row") for c in row_counts]
        total = round(float(uncovered.sum()))
        raise InputDataError(
            f"column {self.attribute!r}: {_plural(len(uncovered), 'distinct value')} in "
            f"{_plural(total, 'row')} not in the hierarchy ({where}): "
            f"{_examples(list(uncovered.index), notes)}; add them to {where} or map them "
            f"with hierarchies.{self.attribute}.map"
        )

    # ----------------------------------------------------------------- internals

    def _level(self, level: int) -> int:
        if isinstance(level, bool) or not isinstance(level, int | np.integer):
            raise TypeError(f"level must be an int, got {type(level).__name__}")
        if not 0 <= level < self.levels:
            raise ValueError(
                f"hierarchy of {self.attribute!r}: level {level} is out of range 0..{self.height}"
            )
        return int(level)

    def _codes(self, codes: npt.ArrayLike) -> IntArray:
        array = np.asarray(codes)
        if array.size == 0:
            return array.astype(np.int64)
        if array.dtype.kind not in "iu":
            raise TypeError(f"raw codes must be integers, got dtype {array.dtype}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= self.domain_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"hierarchy of {self.attribute!r}: raw code {bad} is out of range "
                f"0..{self.domain_size - 1} (-1 means a value not in the hierarchy: "
                "check coverage with check_covers first)"
            )
        return cast(IntArray, array.astype(np.int64, copy=False))


def _as_table(table: Any, attribute: str) -> ObjArray:
    """A read-only 2-D object array copy of ``table``; every cell must be a str."""
    array = np.array(table, dtype=object)
    if array.ndim != 2:
        raise TypeError(
            f"hierarchy of {attribute!r}: table must be 2-D (values x levels), "
            f"got shape {array.shape}"
        )
    if array.size and pd.api.types.infer_dtype(array.ravel(), skipna=False) != "string":
        flat = array.ravel()
        for i, cell in enumerate(flat.tolist()):  # error path only
            if not isinstance(cell, str):
                row, level = divmod(i, array.shape[1])
                raise TypeError(
                    f"hierarchy of {attribute!r}: cell at row {row + 1}, level {level} is "
                    f"{type(cell).__name__} {cell!r}; every cell must be a str"
                )
    return cast(ObjArray, _readonly(array))


@functools.lru_cache(maxsize=RESTORED_KEPT)
def _restored(
    attribute: str,
    source: str,
    shape: tuple[int, int],
    cells: tuple[str, ...],
    aliases: tuple[tuple[str, str], ...],
) -> Hierarchy:
    """A pickled hierarchy, analysed and validated once per definition in this process.

    Every stage of a pipeline unpickles its hierarchies again (side inputs, DoFns): 157
    times for the demo's 50 rows, ~4.5 ms each. A hierarchy is immutable (its arrays are
    read-only), so one unpickled definition serves them all; the key is the whole
    definition, compared exactly."""
    table = np.array(cells, dtype=object).reshape(shape)
    return Hierarchy(attribute, table, source, dict(aliases))


def _analyse(
    table: ObjArray, where: str, line_numbers: Sequence[int] | None
) -> tuple[tuple[ObjArray, ...], IntArray, tuple[ObjArray, ...], tuple[IntArray, ...]]:
    """Validate a table and return labels, label ids, label names and parent links."""
    n, n_levels = table.shape
    fix = "fix the file" if line_numbers is not None else "fix the table"

    def at(row: int) -> str:
        return f"line {line_numbers[row]}" if line_numbers is not None else f"row {row + 1}"

    if n == 0:
        raise InputDataError(
            f"{where}: no values; a hierarchy needs one row per raw value: raw;level1;…;*"
        )
    if n_levels < 2:
        raise InputDataError(
            f"{where}: only one column (the raw values); a hierarchy needs at least the raw "
            f"value and the top level '*' per row (raw;…;*): check the delimiter or {fix}"
        )
    labels = tuple(
        cast(ObjArray, _readonly(np.ascontiguousarray(table[:, lv]))) for lv in range(n_levels)
    )
    ids = np.empty((n_levels, n), dtype=np.int64)
    names: list[ObjArray] = []
    for level in range(n_levels):
        codes, uniques = pd.factorize(labels[level])
        ids[level] = codes
        names.append(cast(ObjArray, _readonly(np.asarray(uniques, dtype=object))))
        # blank check on distinct labels only (Arrow-backed strip, no Python loop)
        blank = pd.Series(names[level], dtype="str").str.strip().eq("").to_numpy(dtype=bool)
        if blank.any():
            row = int(np.argmax(codes == int(np.argmax(blank))))
            what = "raw value" if level == 0 else f"label at level {level}"
            raise InputDataError(
                f"{where}: {at(row)}: empty {what}; every cell needs a value; {fix}"
            )

    raw = labels[0]
    if names[0].shape[0] != n:
        duplicated = pd.Index(raw, dtype=object).duplicated()
        second = int(np.argmax(duplicated))
        first = int(np.argmax(raw == raw[second]))
        raise InputDataError(
            f"{where}: {at(second)}: raw value {raw[second]!r} also appears on {at(first)}; "
            f"raw values must be unique: remove or merge one of them"
        )

    if names[-1].shape[0] != 1:
        firsts = [int(np.argmax(ids[-1] == i)) for i in range(min(names[-1].shape[0], 5))]
        notes = [at(r) for r in firsts]
        raise InputDataError(
            f"{where}: the last level (level {n_levels - 1}) must be one value ('*'), found "
            f"{names[-1].shape[0]}: {_examples(list(names[-1]), notes)}; end every row "
            f"with '*' or {fix}"
        )

    parents: list[IntArray] = []
    for level in range(n_levels - 1):
        here, above = ids[level], ids[level + 1]
        parent = np.empty(names[level].shape[0], dtype=np.int64)
        parent[here] = above
        conflict = parent[here] != above
        if conflict.any():
            group = np.flatnonzero(here == here[int(np.argmax(conflict))])
            first = int(group[0])
            second = int(group[np.argmax(above[group] != above[first])])
            lab, up = labels[level], labels[level + 1]
            raise InputDataError(
                f"{where}: {at(second)}: value {raw[second]!r} maps to {lab[second]!r} at "
                f"level {level} but {up[second]!r} at level {level + 1}, while "
                f"{raw[first]!r} ({at(first)}) maps to {lab[first]!r} then {up[first]!r}: "
                f"each level must be a function of the previous one (one label at level "
                f"{level} needs one label at level {level + 1}); {fix}"
            )
        parents.append(cast(IntArray, _readonly(parent)))
    return labels, ids, tuple(names), tuple(parents)


def _check_aliases(
    aliases: Mapping[Any, Any] | None, raw: ObjArray, attribute: str, source: str
) -> dict[str, str]:
    """Canonicalise the config map; each target must be a raw value (ConfigError)."""
    key = f"hierarchies.{attribute}.map"
    where = source or f"the hierarchy of {attribute!r}"
    if aliases is None:
        return {}
    if not isinstance(aliases, Mapping):
        raise ConfigError(f"{key}: expected a mapping of data value -> raw value")
    raw_index = pd.Index(raw, dtype=object)
    out: dict[str, str] = {}
    for given, target in aliases.items():
        name, goal = _canonical_scalar(given), _canonical_scalar(target)
        if raw_index.get_indexer([goal])[0] < 0:
            raise ConfigError(
                f"{key}: {_show(given)} -> {_show(target)}: the target is not a raw value of "
                f"{where}; map it to a value in the first column"
            )
        if raw_index.get_indexer([name])[0] >= 0:
            if name == goal:
                continue
            raise ConfigError(
                f"{key}: {_show(given)} is already a raw value of {where}; remove it from the map"
            )
        if name in out and out[name] != goal:
            raise ConfigError(
                f"{key}: {_show(given)} is mapped twice ({_show(out[name])} and {_show(goal)}); "
                "keep one"
            )
        out[name] = goal
    return out


# --------------------------------------------------------------------------- ARX files


def load_arx_csv(
    path: str | os.PathLike[str],
    attribute: str,
    delimiter: str = ";",
    encoding: str = "utf-8",
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Load an ARX hierarchy file: ``raw;level1;…;*`` per line, no header, no quoting.

    LF or CRLF line ends, blank lines skipped, a UTF-8 byte-order mark tolerated; cells
    are taken verbatim (no whitespace stripping). Errors name the file and line.
    """
    source = os.fspath(path)
    if not isinstance(delimiter, str) or not delimiter or delimiter in "\r\n":
        raise ConfigError(f"hierarchies.{attribute}: invalid delimiter {delimiter!r}")
    try:
        data = Path(source).read_bytes()
    except FileNotFoundError:
        raise InputDataError(
            f"{source}: hierarchy file for {attribute!r} not found; fix the path in "
            f"hierarchies.{attribute}.file (relative paths resolve against the config's folder)"
        ) from None
    except IsADirectoryError:
        raise InputDataError(
            f"{source}: is a directory, not a hierarchy file; fix hierarchies.{attribute}.file"
        ) from None
    except OSError as exc:
        raise InputDataError(
            f"{source}: cannot read the hierarchy file for {attribute!r} ({exc.strerror}); "
            "check that it exists and is readable"
        ) from None
    try:
        text = data.decode(encoding)
    except LookupError:
        raise ConfigError(f"hierarchies.{attribute}: unknown encoding {encoding!r}") from None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputDataError(
            f"{source}: line {line}: not valid {encoding} (byte 0x{data[exc.start]:02x}); "
            f"re-save the file as {encoding}"
        ) from None
    text = text.removeprefix("\ufeff")

    physical = text.replace("\r\n", "\n").split("\n")
    lines = [number for number, line in enumerate(physical, start=1) if line.strip()]
    if not lines:
        raise InputDataError(
            f"{source}: the hierarchy file for {attribute!r} is empty; it needs one line "
            f"per raw value: raw{delimiter}level1{delimiter}…{delimiter}*"
        )
    kept = [physical[number - 1] for number in lines]
    widths = np.fromiter((line.count(delimiter) + 1 for line in kept), np.int64, len(kept))
    if (widths != widths[0]).any():
        common = int(np.bincount(widths).argmax())
        bad = int(np.argmax(widths != common))
        good = int(np.argmax(widths == common))
        raise InputDataError(
            f"{source}: line {lines[bad]} has {_plural(int(widths[bad]), 'column')} but line "
            f"{lines[good]} (like most lines) has {common}; every line needs the same levels "
            f"(raw{delimiter}level1{delimiter}…{delimiter}*): fix the file"
        )
    # one C-level split of the whole text instead of one split per line
    cells = delimiter.join(kept).split(delimiter)
    table = np.empty(len(cells), dtype=object)
    table[:] = cells
    return Hierarchy(
        attribute,
        table.reshape(len(kept), int(widths[0])),
        source=source,
        aliases=aliases or {},
        line_numbers=lines,
    )


def hierarchy_to_arx_csv(
    hierarchy: Hierarchy, path: str | os.PathLike[str], delimiter: str = ";"
) -> Path:
    """Write a hierarchy as an ARX CSV file (LF, UTF-8, no header); returns the path."""
    target = Path(path)
    if not isinstance(delimiter, str) or not delimiter or delimiter in "\r\n":
        raise ConfigError(f"invalid delimiter {delimiter!r} for an ARX CSV file")
    text = "".join(delimiter.join(row) + "\n" for row in hierarchy.table.tolist())
    n, n_levels = hierarchy.table.shape
    if text.count(delimiter) != n * (n_levels - 1) or text.count("\n") != n or "\r" in text:
        cells = pd.Series(hierarchy.table.ravel(), dtype="str")
        for char in (delimiter, "\n", "\r"):
            hit = cells.str.contains(char, regex=False).to_numpy(dtype=bool)
            if hit.any():
                row, level = divmod(int(np.argmax(hit)), n_levels)
                raise InputDataError(
                    f"hierarchy of {hierarchy.attribute!r}: row {row + 1}, level {level}: "
                    f"{_show(hierarchy.table[row, level])} contains {char!r}, which ARX CSV "
                    "cannot hold (no quoting); choose another delimiter or rename the value"
                )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
    except OSError as exc:
        raise OutputError(f"{target}: cannot write the hierarchy ({exc.strerror})") from None
    return target


# --------------------------------------------------------------------------- builders


def _need_values(raw: ObjArray, attribute: str, key: str) -> None:
    if raw.shape[0] == 0:
        raise InputDataError(
            f"column {attribute!r}: no values to build the hierarchy from ({key}); "
            "check that the column is present and not empty"
        )


def _number(value: object, key: str) -> float:
    if not _is_number(value) or not math.isfinite(float(cast(float, value))):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return float(cast(float, value))


def _stack(columns: Sequence[ObjArray], n: int) -> ObjArray:
    table = np.empty((n, len(columns)), dtype=object)
    for level, column in enumerate(columns):
        table[:, level] = column
    return table


def build_intervals(
    attribute: str,
    values: Any,
    widths: Sequence[float],
    start: float = 0.0,
    lower: float | None = None,
    upper: float | None = None,
    *,
    key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Numeric intervals: level i is the half-open ``[lo, hi)`` of width ``widths[i-1]``.

    Bucket boundaries are ``start + j * width``; each width must be a multiple of the
    previous one so intervals nest. ``values`` are the distinct raw values of the data
    (strings keep their form, numbers become canonical strings). ``lower``/``upper``
    bound the accepted values (inclusive). ``key`` is the config path for messages.
    """
    key = key or f"hierarchies.{attribute}.intervals"
    if isinstance(widths, str | bytes) or not isinstance(widths, Sequence):
        raise ConfigError(f"{key}.widths: expected a list of numbers, e.g. [5, 10, 20]")
    steps = [_number(w, f"{key}.widths") for w in widths]
    for i, width in enumerate(steps):
        if width <= 0:
            raise ConfigError(f"{key}.widths: width {widths[i]!r} must be positive")
        if i:
            ratio = width / steps[i - 1]
            if ratio <= 1 or abs(ratio - round(ratio)) > 1e-9 * ratio:
                raise ConfigError(
                    f"{key}.widths: {widths[i]!r} is not a larger multiple of {widths[i - 1]!r}; "
                    "widths must increase, each a multiple of the previous (e.g. 5, 10, 20)"
                )
    origin = _number(start, f"{key}.start")
    low = None if lower is None else _number(lower, f"{key}.lower")
    high = None if upper is None else _number(upper, f"{key}.upper")
    if low is not None and high is not None and low > high:
        raise ConfigError(f"{key}: lower {lower!r} is above upper {upper!r}; swap them")

    raw = _distinct_strings(values)
    _need_values(raw, attribute, key)
    numbers = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(
        dtype=np.float64
    )
    bad = ~np.isfinite(numbers)
    if bad.any():
        raise InputDataError(
            f"column {attribute!r}: {_plural(int(bad.sum()), 'value')} not numeric: "
            f"{_examples(list(raw[bad]))}; {key} needs numbers: fix the data or use "
            "another hierarchy (file, mask or grouping)"
        )
    outside = np.zeros(raw.shape[0], dtype=bool)
    if low is not None:
        outside |= numbers < low
    if high is not None:
        outside |= numbers > high
    if outside.any():
        span = f"[{_format_bound(low) if low is not None else '-inf'}, "
        span += f"{_format_bound(high) if high is not None else 'inf'}]"
        raise InputDataError(
            f"column {attribute!r}: {_plural(int(outside.sum()), 'value')} outside {span} "
            f"({key}.lower/upper): {_examples(list(raw[outside]))}; fix the data or widen "
            "lower/upper"
        )

    order = np.argsort(numbers, kind="stable")
    raw, numbers = raw[order], numbers[order]
    columns: list[ObjArray] = [raw]
    if steps:
        quotient = (numbers - origin) / steps[0]
        bucket = np.floor(quotient)
        bucket = np.where(np.abs(quotient - (bucket + 1)) < 1e-9, bucket + 1, bucket)
        finest = bucket.astype(np.int64)  # coarser levels derive from it, so they nest
        for width in steps:
            ratio = round(width / steps[0])
            index = np.floor_divide(finest, ratio)
            distinct, inverse = np.unique(index, return_inverse=True)
            names = np.array(
                [
                    f"[{_format_bound(origin + j * width)}, "
                    f"{_format_bound(origin + (j + 1) * width)})"
                    for j in distinct.tolist()  # one per bucket, not per value
                ],
                dtype=object,
            )
            columns.append(cast(ObjArray, names[inverse.ravel()]))
    columns.append(np.full(raw.shape[0], SUPPRESSED, dtype=object))
    return Hierarchy(attribute, _stack(columns, raw.shape[0]), source=key, aliases=aliases or {})


def _code_positions(raw: ObjArray) -> tuple[list[list[int]], IntArray]:
    """Per code, the positions of its letters and digits (separators such as ``-``, ``/``,
    ``.`` or spaces are not code characters), and how many each code has."""
    positions = [[i for i, ch in enumerate(str(code)) if ch.isalnum()] for code in raw]
    return positions, np.array([len(p) for p in positions], dtype=np.int64)


def build_mask(
    attribute: str,
    values: Any,
    digits: int | None = None,
    char: str = "*",
    *,
    key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Mask codes from the right: 47677 -> 4767* -> 476** -> … -> 4**** -> ``*``.

    Only letters and digits are masked and counted; separators stay where they are
    (``01-01301`` -> ``01-0130*`` -> … -> ``01-*****`` -> ``0*-*****``), so a code's dash
    never counts as a digit. All values must have ``digits`` code characters (or, if None,
    one common number); codes read as numbers lose leading zeros, which this check reports.
    """
    key = key or f"hierarchies.{attribute}.mask"
    if digits is not None and (
        isinstance(digits, bool) or not isinstance(digits, int | np.integer) or digits < 1
    ):
        raise ConfigError(f"{key}.digits: expected a positive integer, got {digits!r}")
    if not isinstance(char, str) or len(char) != 1:
        raise ConfigError(f"{key}.char: expected one character, got {char!r}")
    raw = _distinct_strings(values)
    _need_values(raw, attribute, key)
    positions, lengths = _code_positions(raw)
    if digits is not None:
        bad = lengths != digits
        if bad.any():
            notes = [_plural(int(n), "character") for n in lengths[bad][:_EXAMPLES]]
            raise InputDataError(
                f"column {attribute!r}: {_plural(int(bad.sum()), 'value')} without exactly "
                f"{digits} letters/digits ({key}.digits; separators do not count): "
                f"{_examples(list(raw[bad]), notes)}; fix the data (leading zeros lost when "
                f"read as numbers?) or {key}.digits"
            )
    elif (lengths != lengths[0]).any():
        common = int(np.bincount(lengths).argmax())
        bad = lengths != common
        notes = [_plural(int(n), "character") for n in lengths[bad][:_EXAMPLES]]
        raise InputDataError(
            f"column {attribute!r}: values differ in length (most have {common} letters/"
            f"digits; separators do not count): {_examples(list(raw[bad]), notes)}; masking "
            f"needs codes of one length: fix the data or set {key}.digits"
        )
    width = int(lengths[0])
    order = np.argsort(raw, kind="stable")
    raw = raw[order]
    positions = [positions[i] for i in order]
    columns: list[ObjArray] = [raw]
    if all(len(p) == len(str(c)) for p, c in zip(positions, raw, strict=True)):
        # no separators: Arrow-backed string kernels
        series = pd.Series(raw, dtype="str")
        for masked in range(1, width):
            column = series.str.slice(0, width - masked) + char * masked
            columns.append(cast(ObjArray, column.to_numpy(dtype=object)))
    else:
        for masked in range(1, width):
            level = np.empty(raw.shape[0], dtype=object)
            for j, (code, where) in enumerate(zip(raw, positions, strict=True)):
                chars = list(str(code))
                for i in where[width - masked :]:
                    chars[i] = char
                level[j] = "".join(chars)
            columns.append(level)
    columns.append(np.full(raw.shape[0], SUPPRESSED, dtype=object))
    return Hierarchy(attribute, _stack(columns, raw.shape[0]), source=key, aliases=aliases or {})


def build_prefix(
    attribute: str,
    values: Any,
    lengths: Sequence[int],
    *,
    key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Code prefixes: level i keeps the first ``lengths[i]`` letters/digits of a code (the
    separators between them kept, those after dropped), then ``*``. E.g. PUMA codes
    ``01-01301`` with ``lengths: [2]`` -> state ``01`` -> ``*``.

    ``lengths`` must decrease strictly and stay below every code's own number of
    letters/digits (a prefix as long as the code would not generalise it)."""
    key = key or f"hierarchies.{attribute}.prefix"
    if (
        isinstance(lengths, str)
        or not lengths
        or any(isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1 for n in lengths)
    ):
        raise ConfigError(f"{key}.lengths: expected a list of positive integers, got {lengths!r}")
    if any(b >= a for a, b in pairwise(lengths)):
        raise ConfigError(
            f"{key}.lengths: each level must keep fewer characters than the one before "
            f"(strictly decreasing, e.g. [5, 2]), got {list(lengths)}"
        )
    raw = _distinct_strings(values)
    _need_values(raw, attribute, key)
    raw = cast(ObjArray, np.sort(raw))
    positions, counts = _code_positions(raw)
    short = counts <= lengths[0]
    if short.any():
        notes = [_plural(int(n), "letter/digit") for n in counts[short][:_EXAMPLES]]
        raise InputDataError(
            f"column {attribute!r}: {_plural(int(short.sum()), 'value')} no longer than the "
            f"first prefix ({lengths[0]} letters/digits, {key}.lengths): "
            f"{_examples(list(raw[short]), notes)}; fix the data (leading zeros lost when read "
            f"as numbers?) or use shorter prefixes"
        )
    columns: list[ObjArray] = [raw]
    for n in lengths:
        level = np.empty(raw.shape[0], dtype=object)
        for j, (code, where) in enumerate(zip(raw, positions, strict=True)):
            level[j] = str(code)[: where[n - 1] + 1]
        columns.append(level)
    columns.append(np.full(raw.shape[0], SUPPRESSED, dtype=object))
    return Hierarchy(attribute, _stack(columns, raw.shape[0]), source=key, aliases=aliases or {})


def load_code_lists(
    attribute: str,
    paths: Sequence[str | Path],
    delimiter: str = ",",
    *,
    key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Code lists: each CSV file maps a code to its parent (two columns with a header, e.g.
    ``puma,state``); the first file maps the raw values, each next one the parents of the
    one before (state -> region). A ``*`` level is appended unless the last file maps
    everything to one parent. Codes are read as text (leading zeros kept)."""
    key = key or f"hierarchies.{attribute}.codes"
    if isinstance(paths, str) or not paths:
        raise ConfigError(f"{key}.files: expected a non-empty list of CSV files")
    levels: list[dict[str, str]] = []
    for i, path in enumerate(paths):
        where = f"{key}.files[{i}] ({path})"
        try:
            table = pd.read_csv(
                path, sep=delimiter, dtype=str, keep_default_na=False, encoding="utf-8"
            )
        except FileNotFoundError:
            raise ConfigError(
                f"{where}: file not found; paths resolve against the config file's folder"
            ) from None
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            raise ConfigError(f"{where}: not a readable CSV ({e}); save it as UTF-8 CSV") from None
        if table.shape[1] != 2:
            raise ConfigError(
                f"{where}: expected 2 columns (code, parent) with a header, got "
                f"{table.shape[1]} ({', '.join(map(str, table.columns[:5]))}); check "
                f"{key}.delimiter ({delimiter!r})"
            )
        child, parent = table.columns
        codes = table[child].str.strip()
        dup = codes[codes.duplicated()].unique().tolist()
        if dup:
            raise ConfigError(
                f"{where}: {_plural(len(dup), 'code')} with more than one parent: "
                f"{_examples(dup)}; keep one line per code"
            )
        levels.append(dict(zip(codes, table[parent].str.strip(), strict=True)))
    return build_grouping(attribute, levels, key=f"{key}.files", aliases=aliases)


def build_dates(
    attribute: str,
    values: Any,
    levels: Sequence[str] = ("month", "year"),
    format: str = "%Y-%m-%d",
    *,
    key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Dates: raw -> ``2024-03`` (month) -> ``2024`` (year) -> ``*``.

    ``levels`` lists coarser and coarser units among week (ISO ``2024-W09``), month,
    year and decade (``2020s``). A week can span two months, so month cannot follow
    week; above a week level, year and decade are ISO week-based years, so that each
    level stays a function of the previous one. ``format`` is a strptime format.
    """
    key = key or f"hierarchies.{attribute}.dates"
    if isinstance(levels, str) or not isinstance(levels, Sequence):
        raise ConfigError(f"{key}.levels: expected a list such as [month, year]")
    for i, unit in enumerate(levels):
        if unit not in _DATE_LEVELS:
            raise ConfigError(
                f"{key}.levels[{i}]: unknown unit {unit!r}; use week, month, year or decade"
            )
        if i and _DATE_LEVELS[unit] <= _DATE_LEVELS[levels[i - 1]]:
            raise ConfigError(
                f"{key}.levels: {unit!r} after {levels[i - 1]!r}; list units from fine to "
                "coarse (week, month, year, decade), each at most once"
            )
        if i and unit == "month" and levels[i - 1] == "week":
            raise ConfigError(
                f"{key}.levels: 'month' cannot follow 'week' (a week can span two months); "
                "drop one of them"
            )
    if not isinstance(format, str) or not format:
        raise ConfigError(f"{key}.format: expected a date format such as '%Y-%m-%d'")
    raw = _distinct_strings(values)
    _need_values(raw, attribute, key)
    try:
        dates = pd.to_datetime(pd.Series(raw, dtype=object), format=format, errors="coerce")
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{key}.format: {format!r} is not a usable date format ({exc})") from None
    bad = dates.isna().to_numpy(dtype=bool)
    if bad.any():
        raise InputDataError(
            f"column {attribute!r}: {_plural(int(bad.sum()), 'value')} not dates in the "
            f"format {format!r}: {_examples(list(raw[bad]))}; fix the data or {key}.format"
        )
    order = np.argsort(dates.to_numpy(), kind="stable")
    raw = raw[order]
    dates = dates.iloc[order].reset_index(drop=True)
    iso = dates.dt.isocalendar() if "week" in levels else None
    year = dates.dt.year.astype(np.int64)
    columns: list[ObjArray] = [raw]
    for unit in levels:
        if unit == "week":
            assert iso is not None
            year = iso["year"].astype(np.int64)  # ISO year from here up
            label = year.astype(str) + "-W" + iso["week"].astype(str).str.zfill(2)
        elif unit == "month":
            label = year.astype(str) + "-" + dates.dt.month.astype(str).str.zfill(2)
        elif unit == "year":
            label = year.astype(str)
        else:
            label = (year // 10 * 10).astype(str) + "s"
        columns.append(cast(ObjArray, label.to_numpy(dtype=object)))
    columns.append(np.full(raw.shape[0], SUPPRESSED, dtype=object))
    return Hierarchy(attribute, _stack(columns, raw.shape[0]), source=key, aliases=aliases or {})


def build_grouping(
    attribute: str,
    levels: Sequence[Mapping[str, str]],
    *,
    key: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Hierarchy:
    """Explicit groupings: ``levels[0]`` maps raw values to groups, ``levels[i]`` maps
    the groups of ``levels[i-1]`` to coarser ones. A ``*`` level is appended unless the
    last mapping has a single target. Every group must be mapped at the next level, and
    nothing else (a key that is not a group is most likely a typo).
    """
    key = key or f"hierarchies.{attribute}.grouping"
    if isinstance(levels, str | Mapping) or not isinstance(levels, Sequence) or not levels:
        raise ConfigError(
            f"{key}.levels: expected a non-empty list of mappings (raw value -> group, "
            "then group -> coarser group …)"
        )
    mappings: list[dict[str, str]] = []
    for i, mapping in enumerate(levels):
        path = f"{key}.levels[{i}]"
        if not isinstance(mapping, Mapping) or not mapping:
            raise ConfigError(f"{path}: expected a non-empty mapping of value -> group")
        canonical: dict[str, str] = {}
        for given, group in mapping.items():
            name, target = _canonical_scalar(given), _canonical_scalar(group)
            if not name.strip() or not target.strip():
                raise ConfigError(f"{path}: {_show(given)} -> {_show(group)}: empty value or group")
            if name in canonical:
                raise ConfigError(f"{path}: {_show(given)} appears twice; keep one")
            canonical[name] = target
        if mappings:
            groups = list(dict.fromkeys(mappings[-1].values()))
            unmapped = [g for g in groups if g not in canonical]
            if unmapped:
                raise ConfigError(
                    f"{path}: {_plural(len(unmapped), 'group')} of levels[{i - 1}] not mapped: "
                    f"{_examples(unmapped)}; add '<group>: <coarser group>' for each to {path}"
                )
            known = set(groups)
            extra = [k for k in canonical if k not in known]
            if extra:
                raise ConfigError(
                    f"{path}: {_examples(extra)} not a group of levels[{i - 1}]; remove or fix "
                    "the spelling"
                )
        mappings.append(canonical)

    raw = np.array(list(mappings[0]), dtype=object)
    columns: list[ObjArray] = [raw]
    current = raw
    for mapping in mappings:
        current = cast(ObjArray, pd.Series(current, dtype=object).map(mapping).to_numpy(object))
        columns.append(current)
    if len(set(mappings[-1].values())) > 1:
        columns.append(np.full(raw.shape[0], SUPPRESSED, dtype=object))
    return Hierarchy(attribute, _stack(columns, raw.shape[0]), source=key, aliases=aliases or {})
