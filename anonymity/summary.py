"""The summary: a frequency table of distinct (QI raw codes, SA code) tuples.

The anonymisation search never touches rows (DESIGN.md, "Work on summaries"): each batch
of rows is encoded with the quasi-identifiers' hierarchies and collapsed to the counts of
its distinct (QI codes, SA code) tuples; partial summaries of batches are combined with
``Summary.merge``. Its size is bounded by the number of distinct combinations, never by
the number of rows, and everything else in ``anonymity`` works on it.

Codes: a QI's code is the raw code of its hierarchy (``Hierarchy.encode``, the row index
of the raw value). The SA code is the raw code of the SA hierarchy when one is given,
else the index of the value in an explicit order (``sa_order``), else the index in the
sorted distinct values of the data (numerically when every value is a number, else by
string). ``sa_values`` holds the value of each SA code, so merged batches agree on codes.

Privacy units (``schema.privacy_unit``): a summary built with ``unit=<column>`` counts the
distinct (QI codes, SA code, unit) tuples instead, and ``unit_codes[i]`` is the unit of
row ``i`` as a 64-bit hash of its value (the same in every batch, so partial summaries
merge without a dictionary). A hash collision can only make two persons look like one,
which undercounts persons: the models are then checked more strictly, never less. The
size grows from distinct (QI, SA) tuples to distinct (person, QI, SA) tuples; what person
counting needs at a generalised node (distinct persons per class and per (class, SA))
is recomputed from these (person, tuple) rows rolled up to the node
(``transformation.Evaluator.in_units``), never summed, since one person's rows can merge
into one class at a coarser node.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any, Final, NamedTuple, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from privpipe.anonymity.arrays import sorted_unique, unique_first_inverse
from privpipe.anonymity.hierarchy import Hierarchy, canonical_scalar
from privpipe.errors import ConfigError, InputDataError
from privpipe.hashing import arrow_strings, string_hashes

__all__ = ["Hierarchies", "Summary", "group_rows", "resolve_hierarchies", "unit_hashes"]

IntArray: TypeAlias = npt.NDArray[np.int64]
ObjArray: TypeAlias = npt.NDArray[np.object_]
Hierarchies: TypeAlias = Mapping[str, Hierarchy] | Sequence[Hierarchy]
"""Hierarchies by QI name, or a sequence aligned with the QI names."""


class DenseUnits(NamedTuple):
    """The privacy units of a summary, counted once (``Summary.dense_units``)."""

    n_units: int
    """Distinct units (persons)."""
    ids: IntArray
    """Each summary row's unit as a dense id 0..n_units-1 (the rank of its hash)."""
    first_rows: IntArray
    """The first summary row of each unit, by dense id."""


_KEY_LIMIT: Final = 1 << 62  # packed keys stay below this (int64 with room to spare)
_EXAMPLES: Final = 5


def packed_key(columns: Sequence[npt.NDArray[np.integer[Any]]], radices: Sequence[int]) -> IntArray:
    """One int64 key per row of non-negative integer columns: equal where the rows are
    equal, ordered as they are lexicographically (first column most significant).
    ``radices[i]`` bounds column ``i``; when the key space would overflow, the partial key
    is re-densified first (its ranks), so any number of columns works."""
    if not columns:
        raise ValueError("packed_key needs at least one column")
    key = np.asarray(columns[0], dtype=np.int64)
    span = max(int(radices[0]), 1)
    for column, radix in zip(columns[1:], radices[1:], strict=True):
        radix = max(int(radix), 1)
        if span * radix >= _KEY_LIMIT:
            distinct, _, key = unique_first_inverse(key)
            key = key.astype(np.int64, copy=False)
            span = max(int(distinct.shape[0]), 1)
        key = key * radix + np.asarray(column, dtype=np.int64)
        span *= radix
    return key


def group_rows(
    columns: Sequence[npt.NDArray[np.integer[Any]]], radices: Sequence[int]
) -> tuple[IntArray, IntArray]:
    """Group rows of non-negative integer columns: (group id per row, first row per group).

    Group ids are dense (0..n_groups-1) and follow the lexicographic order of the columns
    (first column most significant): the sorted distinct ``packed_key``s.
    """
    if not columns:
        raise ValueError("group_rows needs at least one column")
    _, first, inverse = unique_first_inverse(packed_key(columns, radices))
    return inverse.astype(np.int64, copy=False).ravel(), first.astype(np.int64, copy=False)


def resolve_hierarchies(names: Sequence[str], hierarchies: Hierarchies) -> tuple[Hierarchy, ...]:
    """The hierarchy of each QI, in the order of ``names`` (ConfigError if one is missing)."""
    if isinstance(hierarchies, Mapping):
        missing = [name for name in names if name not in hierarchies]
        if missing:
            raise ConfigError(
                f"no hierarchy for quasi-identifier(s) {', '.join(map(repr, missing))}; "
                "every quasi-identifier needs one under hierarchies.<name>"
            )
        return tuple(hierarchies[name] for name in names)
    resolved = tuple(hierarchies)
    if len(resolved) != len(names):
        raise ConfigError(
            f"{len(resolved)} hierarchies given for {len(names)} quasi-identifiers; "
            "give one per quasi-identifier"
        )
    return resolved


def _readonly(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.setflags(write=False)
    return array


def _is_missing(value: object) -> bool:
    if value is None or (isinstance(value, str) and value == ""):
        return True
    return not isinstance(value, str) and bool(pd.api.types.is_scalar(value) and pd.isna(value))


def _sorted_values(values: Iterable[str]) -> ObjArray:
    """Distinct strings sorted numerically when all are numbers, else as strings."""
    distinct = sorted(set(values))
    try:
        numbers = [float(v) for v in distinct]
    except ValueError:
        return np.array(distinct, dtype=object)
    if all(math.isfinite(x) for x in numbers):
        order = sorted(range(len(distinct)), key=lambda i: (numbers[i], distinct[i]))
        return np.array([distinct[i] for i in order], dtype=object)
    return np.array(distinct, dtype=object)


def _examples(values: Sequence[object], counts: Sequence[int]) -> str:
    shown = [f"{canonical_scalar(v)!r} ({c} rows)" for v, c in zip(values, counts, strict=False)]
    more = f" and {len(values) - _EXAMPLES} more" if len(values) > _EXAMPLES else ""
    return ", ".join(shown[:_EXAMPLES]) + more


@dataclass(frozen=True, eq=False)
class Summary:
    """Counts of the distinct (QI raw codes, SA code) tuples of a table.

    ``qi_codes[i, j]`` is the raw code of QI ``qi_names[j]`` in tuple ``i``, ``sa_codes[i]``
    its SA code (None when no SA is summarised) and ``counts[i]`` its number of records.
    Rows are distinct and sorted lexicographically by (QI codes, SA code). ``sa_domain`` is
    the number of SA codes (``len(sa_values)``). ``qi_domains`` (optional) are the
    hierarchies' domain sizes, checked when the summary is evaluated. ``sa_fixed`` marks
    an SA domain given by a hierarchy or an explicit order (merge keeps it as is).
    """

    qi_names: tuple[str, ...]
    qi_codes: IntArray
    sa_codes: IntArray | None
    counts: IntArray
    sa_domain: int
    sa_name: str | None = None
    sa_values: ObjArray | None = None
    sa_fixed: bool = False
    qi_domains: tuple[int, ...] = ()
    unit_codes: IntArray | None = None
    owned: InitVar[bool] = False
    """The arrays are fresh, the summary's own (``from_codes``): kept, not copied."""
    n_records: int = field(init=False)
    _dense_units: DenseUnits | None = field(init=False, default=None, repr=False, compare=False)
    _sa_units: IntArray | None = field(init=False, default=None, repr=False, compare=False)
    _qi_groups: tuple[IntArray, IntArray] | None = field(
        init=False, default=None, repr=False, compare=False
    )

    def __post_init__(self, owned: bool) -> None:
        names = tuple(self.qi_names)
        copy = None if owned else True  # a caller's arrays are copied: it may change them
        codes = np.array(self.qi_codes, dtype=np.int64, copy=copy)
        counts = np.array(self.counts, dtype=np.int64, copy=copy).ravel()
        if codes.ndim != 2 or codes.shape[1] != len(names):
            raise ValueError(
                f"qi_codes must have shape (n_distinct, {len(names)}), got {codes.shape}"
            )
        if counts.shape[0] != codes.shape[0]:
            raise ValueError("counts must have one entry per distinct tuple")
        if counts.size and int(counts.min()) < 1:
            raise ValueError("counts must be positive")
        if codes.size and int(codes.min()) < 0:
            raise ValueError("qi_codes must be raw codes >= 0 (encode unknown values first)")
        sa = None
        if self.sa_codes is not None:
            sa = np.array(self.sa_codes, dtype=np.int64, copy=copy).ravel()
            if sa.shape[0] != codes.shape[0]:
                raise ValueError("sa_codes must have one entry per distinct tuple")
            if sa.size and (int(sa.min()) < 0 or int(sa.max()) >= self.sa_domain):
                raise ValueError(f"sa_codes must lie in 0..{self.sa_domain - 1}")
        values = self.sa_values
        if values is not None:
            values = np.array(values, dtype=object, copy=True).ravel()
            if values.shape[0] != self.sa_domain:
                raise ValueError("sa_values must have sa_domain entries")
            values = _readonly(values)
        if self.qi_domains and len(self.qi_domains) != len(names):
            raise ValueError("qi_domains must have one entry per quasi-identifier")
        if self.qi_domains and codes.size:
            high = codes.max(axis=0)
            for j, domain in enumerate(self.qi_domains):
                if int(high[j]) >= domain:
                    raise ValueError(f"qi_codes of {names[j]!r} exceed its domain of {domain}")
        object.__setattr__(self, "qi_names", names)
        object.__setattr__(self, "qi_codes", _readonly(codes))
        object.__setattr__(self, "counts", _readonly(counts))
        object.__setattr__(self, "sa_codes", None if sa is None else _readonly(sa))
        object.__setattr__(self, "sa_values", values)
        object.__setattr__(self, "qi_domains", tuple(int(d) for d in self.qi_domains))
        if self.unit_codes is not None:
            units = np.array(self.unit_codes, dtype=np.int64, copy=copy).ravel()
            if units.shape[0] != codes.shape[0]:
                raise ValueError("unit_codes must have one entry per distinct tuple")
            object.__setattr__(self, "unit_codes", _readonly(units))
        object.__setattr__(self, "n_records", int(counts.sum()))

    def __repr__(self) -> str:
        return (
            f"Summary(qi_names={self.qi_names!r}, sa_name={self.sa_name!r}, "
            f"distinct={self.n_distinct}, records={self.n_records})"
        )

    # ----------------------------------------------------------------- shape

    @property
    def n_distinct(self) -> int:
        """Number of distinct tuples (rows of the summary)."""
        return int(self.counts.shape[0])

    @property
    def n_qi(self) -> int:
        """Number of quasi-identifiers."""
        return len(self.qi_names)

    @property
    def has_sa(self) -> bool:
        """Whether an SA is summarised."""
        return self.sa_codes is not None

    @property
    def has_units(self) -> bool:
        """Whether rows are (QI, SA, privacy unit) tuples: classes count persons."""
        return self.unit_codes is not None

    @property
    def n_units(self) -> int:
        """Distinct privacy units (persons); the number of records without units."""
        if self.unit_codes is None:
            return self.n_records
        return self.dense_units().n_units

    def qi_groups(self) -> tuple[IntArray, IntArray]:
        """The distinct QI tuples, computed once (``group_rows`` of the QI codes): each
        row's tuple id (tuples in lexicographic order) and each tuple's first row. The
        recoding, the input's and the output's metrics and the person counts of a release
        all start from it."""
        if self._qi_groups is None:
            if self.n_distinct == 0 or self.n_qi == 0:
                empty = np.zeros(0, dtype=np.int64)
                groups = (_readonly(np.zeros(self.n_distinct, dtype=np.int64)), _readonly(empty))
            else:
                columns = [self.qi_codes[:, j] for j in range(self.n_qi)]
                row_tuple, first = group_rows(columns, [int(c.max()) + 1 for c in columns])
                groups = (_readonly(row_tuple), _readonly(first))
            object.__setattr__(self, "_qi_groups", groups)
        assert self._qi_groups is not None
        return self._qi_groups

    def dense_units(self) -> DenseUnits:
        """The units as dense ids, computed once (one sort of the unit hashes): every
        person count of the planning starts from it."""
        if self.unit_codes is None:
            raise ValueError("this summary has no privacy unit")
        if self._dense_units is None:
            distinct, first, dense = unique_first_inverse(self.unit_codes)
            units = DenseUnits(
                int(distinct.shape[0]),
                _readonly(dense.ravel().astype(np.int64, copy=False)),
                _readonly(first.astype(np.int64, copy=False)),
            )
            object.__setattr__(self, "_dense_units", units)
        assert self._dense_units is not None
        return self._dense_units

    def sa_unit_counts(self) -> IntArray:
        """Distinct units per SA code (length ``sa_domain``), computed once: the person
        view of ``sa_counts`` (the p of person-level t-closeness)."""
        if self.sa_codes is None or self.unit_codes is None:
            raise ValueError("this summary has no sensitive attribute or no privacy unit")
        if self._sa_units is None:
            units = self.dense_units()
            n = max(units.n_units, 1)
            pairs = sorted_unique(self.sa_codes * n + units.ids)  # distinct (SA, unit)
            counts = np.bincount(pairs // n, minlength=self.sa_domain).astype(np.int64)
            object.__setattr__(self, "_sa_units", _readonly(counts))
        assert self._sa_units is not None
        return self._sa_units

    def sa_counts(self) -> IntArray:
        """Records per SA code over the whole table (length ``sa_domain``)."""
        if self.sa_codes is None:
            raise ValueError("this summary has no sensitive attribute")
        counts = np.bincount(self.sa_codes, weights=self.counts, minlength=self.sa_domain)
        return cast(IntArray, np.rint(counts).astype(np.int64))

    def qi_counts(self, qi: int | str) -> IntArray:
        """Records per raw code of one QI (length: its domain, or max code + 1)."""
        j = self.qi_names.index(qi) if isinstance(qi, str) else int(qi)
        size = self.qi_domains[j] if self.qi_domains else 0
        counts = np.bincount(self.qi_codes[:, j], weights=self.counts, minlength=size)
        return cast(IntArray, np.rint(counts).astype(np.int64))

    def without_sa(self) -> Summary:
        """The QI-only summary (SA dropped, equal QI tuples summed)."""
        if self.sa_codes is None:
            return self
        return Summary.from_codes(
            self.qi_names,
            self.qi_codes,
            None,
            self.counts,
            qi_domains=self.qi_domains,
            unit_codes=self.unit_codes,
        )

    def to_frame(self, hierarchies: Hierarchies | None = None) -> pd.DataFrame:
        """The summary as a DataFrame (raw values if hierarchies are given, else codes)."""
        data: dict[str, Any] = {}
        resolved = resolve_hierarchies(self.qi_names, hierarchies) if hierarchies else None
        for j, name in enumerate(self.qi_names):
            column = self.qi_codes[:, j]
            data[name] = resolved[j].values[column] if resolved else column
        if self.sa_codes is not None:
            name = self.sa_name or "sa"
            values = self.sa_values
            data[name] = values[self.sa_codes] if values is not None else self.sa_codes
        data["count"] = self.counts
        return pd.DataFrame(data)

    # ----------------------------------------------------------------- building

    @classmethod
    def from_codes(
        cls,
        qi_names: Sequence[str],
        qi_codes: npt.ArrayLike,
        sa_codes: npt.ArrayLike | None = None,
        counts: npt.ArrayLike | None = None,
        *,
        sa_domain: int | None = None,
        sa_name: str | None = None,
        sa_values: npt.ArrayLike | None = None,
        sa_fixed: bool = False,
        qi_domains: Sequence[int] = (),
        unit_codes: npt.ArrayLike | None = None,
    ) -> Summary:
        """Group code tuples (one per record, or weighted by ``counts``) into a summary;
        with ``unit_codes`` (one unit hash per tuple) distinct (QI, SA, unit) tuples."""
        names = tuple(qi_names)
        codes = np.asarray(qi_codes, dtype=np.int64).reshape(-1, len(names))
        n = codes.shape[0]
        weights = np.ones(n, dtype=np.int64) if counts is None else np.asarray(counts, np.int64)
        if weights.shape != (n,):
            raise ValueError("counts must have one entry per tuple")
        sa = None if sa_codes is None else np.asarray(sa_codes, dtype=np.int64).ravel()
        values = None if sa_values is None else np.asarray(sa_values, dtype=object).ravel()
        domain = 0
        if sa is not None:
            if sa_domain is not None:
                domain = int(sa_domain)
            elif values is not None:
                domain = int(values.shape[0])
            else:
                domain = int(sa.max()) + 1 if sa.size else 0
        units = None if unit_codes is None else np.asarray(unit_codes, dtype=np.int64).ravel()
        if units is not None and units.shape != (n,):
            raise ValueError("unit_codes must have one entry per tuple")
        keep = weights > 0
        if not keep.all():
            codes, weights = codes[keep], weights[keep]
            sa = None if sa is None else sa[keep]
            units = None if units is None else units[keep]
        if codes.shape[0] == 0:
            return cls(
                names,
                np.zeros((0, len(names)), dtype=np.int64),
                None if sa is None else np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=np.int64),
                domain,
                sa_name,
                values,
                sa_fixed,
                tuple(qi_domains),
                None if units is None else np.zeros(0, dtype=np.int64),
            )
        columns = [codes[:, j] for j in range(len(names))]
        radices = [int(c.max()) + 1 for c in columns]
        if sa is not None:
            columns.append(sa)
            radices.append(max(domain, 1))
        dense = None
        if units is not None:  # hashes: densify to non-negative codes for the packed key
            distinct, _, dense = unique_first_inverse(units)
            columns.append(dense)
            radices.append(max(int(distinct.shape[0]), 1))
        group, first = group_rows(columns, radices)
        n_groups = first.shape[0]
        summed = np.rint(np.bincount(group, weights=weights, minlength=n_groups))
        summary = cls(
            names,
            codes[first],
            None if sa is None else sa[first],
            summed.astype(np.int64),
            domain,
            sa_name,
            values,
            sa_fixed,
            tuple(qi_domains),
            None if units is None else units[first],
            owned=True,
        )
        if dense is not None:  # the units' dense ids are known: no second sort of them
            ids = dense[first]
            first_rows = np.full(int(distinct.shape[0]), n_groups, dtype=np.int64)
            np.minimum.at(first_rows, ids, np.arange(n_groups, dtype=np.int64))
            dense_units = DenseUnits(int(distinct.shape[0]), _readonly(ids), _readonly(first_rows))
            object.__setattr__(summary, "_dense_units", dense_units)
        return summary

    @classmethod
    def from_frame(
        cls,
        df: pd.DataFrame,
        qis: Sequence[str],
        sensitive: str | None,
        hierarchies: Hierarchies,
        sa_hierarchy: Hierarchy | None = None,
        *,
        sa_order: Sequence[object] | None = None,
        weights: str | None = None,
        unit: str | None = None,
    ) -> Summary:
        """Summarise a DataFrame: encode each QI with its hierarchy, count distinct tuples.

        ``weights`` names a column of record counts, for a frame that is itself a
        frequency table (e.g. partial summaries combined across batches).

        A QI value not in its hierarchy raises InputDataError naming the column and the
        number of rows. The SA is encoded by ``sa_hierarchy`` if given, else by
        ``sa_order`` (the SA domain in order, e.g. for ordered t-closeness), else by its
        sorted distinct values; a missing SA value is an InputDataError.

        ``unit`` names the privacy-unit column (person id): the summary then holds
        distinct (QI, SA, unit) tuples (module docstring); a missing id is an
        InputDataError.
        """
        names = tuple(qis)
        if not names:
            raise ConfigError("at least one quasi-identifier is needed")
        if len(set(names)) != len(names):
            raise ConfigError(f"quasi-identifiers listed twice: {list(names)}")
        if sensitive is not None and sensitive in names:
            raise ConfigError(f"{sensitive!r} is both a quasi-identifier and the sensitive one")
        if unit is not None and (unit in names or unit == sensitive):
            raise ConfigError(f"the privacy unit {unit!r} is also a QI or the sensitive attribute")
        wanted = [*names, *([sensitive] if sensitive is not None else [])]
        wanted += [unit] if unit is not None else []
        absent = [c for c in wanted if c not in df.columns]
        if absent:
            raise InputDataError(
                f"column(s) {', '.join(map(repr, absent))} not in the data (columns: "
                f"{', '.join(map(str, df.columns[:20]))}); fix the schema or the input"
            )
        resolved = resolve_hierarchies(names, hierarchies)
        w = None if weights is None else np.asarray(df[weights], dtype=np.int64)
        codes = np.empty((len(df), len(names)), dtype=np.int64)
        for j, (name, hierarchy) in enumerate(zip(names, resolved, strict=True)):
            encoded = hierarchy.encode(df[name])
            if (encoded < 0).any():
                if w is None:
                    tally = df[name].value_counts(dropna=False)
                else:
                    tally = pd.Series(w, index=df[name].to_numpy()).groupby(level=0).sum()
                hierarchy.check_covers(tally)  # raises a precise InputDataError
                raise InputDataError(
                    f"column {name!r}: {int((encoded < 0).sum())} rows with values not in "
                    f"the hierarchy of {name!r}; add them or map them"
                )
            codes[:, j] = encoded
        domains = tuple(h.domain_size for h in resolved)
        units = None if unit is None else unit_hashes(df[unit], unit)
        if sensitive is None:
            return cls.from_codes(names, codes, counts=w, qi_domains=domains, unit_codes=units)
        sa_codes, sa_values, fixed = _encode_sa(df[sensitive], sensitive, sa_hierarchy, sa_order)
        return cls.from_codes(
            names,
            codes,
            sa_codes,
            w,
            sa_domain=len(sa_values),
            sa_name=sensitive,
            sa_values=sa_values,
            sa_fixed=fixed,
            qi_domains=domains,
            unit_codes=units,
        )

    @classmethod
    def merge(cls, summaries: Iterable[Summary]) -> Summary:
        """Combine partial summaries (e.g. of batches): concatenate, then sum equal tuples.

        All parts must have the same QIs (and domains) and the same SA. SA codes are mapped
        onto the union of the parts' SA values (sorted by the same rule as ``from_frame``);
        a fixed SA domain (hierarchy or explicit order) must be identical in every part.
        """
        parts = list(summaries)
        if not parts:
            raise ValueError("merge needs at least one summary")
        first = parts[0]
        for part in parts[1:]:
            if part.qi_names != first.qi_names:
                raise ValueError(f"cannot merge summaries of {part.qi_names} and {first.qi_names}")
            if part.has_sa != first.has_sa or part.sa_name != first.sa_name:
                raise ValueError("cannot merge summaries of different sensitive attributes")
            if part.qi_domains and first.qi_domains and part.qi_domains != first.qi_domains:
                raise ValueError("cannot merge summaries encoded with different hierarchies")
            if part.has_units != first.has_units:
                raise ValueError("cannot merge summaries with and without privacy units")
        domains = next((p.qi_domains for p in parts if p.qi_domains), ())
        codes = np.concatenate([p.qi_codes for p in parts], axis=0)
        counts = np.concatenate([p.counts for p in parts])
        units = (
            np.concatenate([p.unit_codes for p in parts if p.unit_codes is not None])
            if first.has_units
            else None
        )
        if not first.has_sa:
            return cls.from_codes(
                first.qi_names, codes, None, counts, qi_domains=domains, unit_codes=units
            )
        values, fixed = _merged_sa_values(parts)
        index = pd.Index(values, dtype=object)
        remapped = []
        for part in parts:
            assert part.sa_codes is not None
            if part.sa_values is None:
                if not fixed and len(parts) > 1:
                    raise ValueError("cannot merge summaries without sa_values")
                remapped.append(part.sa_codes)
                continue
            mapping = index.get_indexer(part.sa_values)
            if (mapping < 0).any():
                raise ValueError("a part has SA values outside the fixed SA domain")
            remapped.append(mapping.astype(np.int64)[part.sa_codes])
        return cls.from_codes(
            first.qi_names,
            codes,
            np.concatenate(remapped),
            counts,
            sa_domain=len(values),
            sa_name=first.sa_name,
            sa_values=values,
            sa_fixed=fixed,
            qi_domains=domains,
            unit_codes=units,
        )


def unit_hashes(column: pd.Series, name: str) -> IntArray:
    """A 64-bit hash of each privacy-unit id as its canonical string (``39.0`` is
    ``"39"``; ``privpipe.hashing.string_hashes``), the same in every batch and step; a
    missing or empty id is an InputDataError (every record needs its person). A ``uint64``
    column holds such hashes already (``FrequencyTable(hashed=...)``) and is taken as is."""
    if column.dtype == np.uint64:
        return np.ascontiguousarray(column.to_numpy()).view(np.int64)
    inferred = pd.api.types.infer_dtype(column, skipna=True)
    codes: IntArray | None = None
    if inferred in ("string", "empty"):  # the strings themselves, from their Arrow buffers
        strings = arrow_strings(column)
    elif inferred == "integer" and column.dtype.kind in "iu":  # decimal, as str(int)
        strings = arrow_strings(pa.array(column.array, from_pandas=True).cast(pa.string()))
    else:  # floats, mixed: Python's canonical string of each distinct id (as always)
        factorized, uniques = pd.factorize(column, use_na_sentinel=True)
        codes = np.asarray(factorized, dtype=np.int64)
        table = [canonical_scalar(v) for v in np.asarray(uniques, dtype=object)]
        strings = arrow_strings(pa.array(table, type=pa.string()))
    empty = pc.equal(pc.binary_length(strings), 0).to_numpy(zero_copy_only=False)
    if codes is None:
        n_missing = strings.null_count + int(np.count_nonzero(empty))
    else:
        n_missing = int((codes < 0).sum()) + int(np.isin(codes, np.flatnonzero(empty)).sum())
    if n_missing:
        raise InputDataError(
            f"column {name!r} (schema.privacy_unit): {n_missing} rows without a person id; "
            "every row needs one (fill or drop them)"
        )
    hashes = string_hashes(strings).view(np.int64)
    return hashes if codes is None else hashes[codes]


def _merged_sa_values(parts: Sequence[Summary]) -> tuple[ObjArray, bool]:
    fixed = [p for p in parts if p.sa_fixed]
    if fixed:
        reference = fixed[0].sa_values
        for part in fixed[1:]:
            same = part.sa_domain == fixed[0].sa_domain and (
                reference is None
                or (part.sa_values is not None and list(part.sa_values) == list(reference))
            )
            if not same:
                raise ValueError("cannot merge summaries with different fixed SA domains")
        if reference is None:
            return np.arange(fixed[0].sa_domain).astype(object), True
        return reference, True
    if any(p.sa_values is None for p in parts):
        domain = max(p.sa_domain for p in parts)
        return np.arange(domain).astype(object), False
    union: set[str] = set()
    for part in parts:
        assert part.sa_values is not None
        union.update(str(v) for v in part.sa_values)
    return _sorted_values(union), False


def _encode_sa(
    column: pd.Series,
    name: str,
    hierarchy: Hierarchy | None,
    order: Sequence[object] | None,
) -> tuple[IntArray, ObjArray, bool]:
    """SA codes per row, the value of each code, and whether the domain is fixed."""
    if hierarchy is not None:
        codes = hierarchy.encode(column)
        if (codes < 0).any():
            hierarchy.check_covers(column.value_counts(dropna=False))
            raise InputDataError(f"column {name!r}: values not in its hierarchy")
        return codes, hierarchy.values, True
    factor, uniques = pd.factorize(column, use_na_sentinel=True)
    factor = np.asarray(factor, dtype=np.int64)
    distinct = list(np.asarray(uniques, dtype=object))
    strings = [canonical_scalar(v) for v in distinct]
    missing = [i for i, v in enumerate(distinct) if _is_missing(v)]
    n_missing = int((factor < 0).sum()) + sum(int((factor == i).sum()) for i in missing)
    if n_missing:
        raise InputDataError(
            f"column {name!r}: {n_missing} rows with a missing sensitive value; fill or drop "
            "them (the privacy models need a value for every record)"
        )
    if order is not None:
        values = np.array([canonical_scalar(v) for v in order], dtype=object)
        if len(set(values.tolist())) != values.shape[0]:
            raise ConfigError(f"the order of {name!r} lists a value twice")
        positions = pd.Index(values, dtype=object).get_indexer(np.array(strings, dtype=object))
        if (positions < 0).any():
            bad = [i for i, p in enumerate(positions) if p < 0]
            tally = np.bincount(factor, minlength=len(distinct))
            raise InputDataError(
                f"column {name!r}: {len(bad)} distinct value(s) not in its given order: "
                f"{_examples([strings[i] for i in bad], [int(tally[i]) for i in bad])}; "
                "add them to the order"
            )
        return positions.astype(np.int64)[factor], values, True
    values = _sorted_values(strings)
    positions = pd.Index(values, dtype=object).get_indexer(np.array(strings, dtype=object))
    return positions.astype(np.int64)[factor], values, False
