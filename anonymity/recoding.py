"""A recoding: what every raw QI tuple of the data is published as.

Both algorithms end here: full-domain generalisation (one level per QI for the
whole table) and Mondrian local recoding (a label per partition) produce a
`Recoding` keyed by the distinct raw QI tuples of the summary. Recoding a batch is
then one vectorised lookup, so rows are touched only to summarise and to recode
(DESIGN.md "Work on summaries"). Its size is bounded by the distinct QI tuples,
which is what travels to the workers as a side input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import SUPPRESSED, Hierarchy
from privpipe.errors import InputDataError

IntArray = npt.NDArray[np.int64]
ObjArray = npt.NDArray[np.object_]
BoolArray = npt.NDArray[np.bool_]


_KEY_LIMIT = 1 << 62


@dataclass(frozen=True, eq=False)
class _TupleIndex:
    """Row of each distinct tuple of non-negative int codes: one packed int64 key per tuple
    (mixed radix, ``radices`` bound each column) searched in sorted order; a MultiIndex
    when the packed keys would overflow."""

    radices: IntArray
    keys: IntArray  # sorted packed keys
    rows: IntArray  # row of each sorted key
    multi: pd.MultiIndex | None
    unique: bool

    @classmethod
    def build(cls, codes: IntArray) -> _TupleIndex:
        radices = (codes.max(axis=0) + 1) if codes.shape[0] else np.ones(codes.shape[1], np.int64)
        span = 1
        for r in radices.tolist():
            span *= max(int(r), 1)
        if span >= _KEY_LIMIT:
            multi = pd.MultiIndex.from_arrays([codes[:, j] for j in range(codes.shape[1])])
            empty = np.zeros(0, dtype=np.int64)
            return cls(radices, empty, empty, multi, bool(multi.is_unique))
        keys = _pack([codes[:, j] for j in range(codes.shape[1])], radices, codes.shape[0])
        rows = np.argsort(keys, kind="stable")
        keys = keys[rows]
        unique = bool((keys[1:] != keys[:-1]).all())
        return cls(radices, keys, rows.astype(np.int64), None, unique)

    def locate(self, array: IntArray) -> IntArray:
        """Row of each tuple of ``array`` (n, n_columns); -1 where absent."""
        columns = [array[:, j] for j in range(array.shape[1])]
        return self.locate_columns(columns, int(array.shape[0]))

    def locate_columns(self, columns: Sequence[npt.NDArray[np.integer[Any]]], n: int) -> IntArray:
        """``locate`` of ``n`` tuples given column by column (one array per column, the
        way a batch's codes come: no (n, n_columns) copy, and contiguous columns)."""
        if self.multi is not None:
            target = pd.MultiIndex.from_arrays(list(columns))
            return np.asarray(self.multi.get_indexer(target), dtype=np.int64)
        if self.keys.shape[0] == 0 or n == 0:
            return np.full(n, -1, dtype=np.int64)
        inside: BoolArray | None = None  # None: every tuple within the radices
        checked = list(columns)
        for j, (column, radix) in enumerate(zip(columns, self.radices.tolist(), strict=True)):
            if int(column.min()) < 0 or int(column.max()) >= radix:
                within = (column >= 0) & (column < radix)
                inside = within if inside is None else inside & within
                checked[j] = np.where(within, column, 0)
        # each distinct key once, in sorted order: the searches in the (large) sorted keys
        # then stay local instead of one cache miss per level and row
        distinct, inverse = np.unique(_pack(checked, self.radices, n), return_inverse=True)
        at = np.minimum(np.searchsorted(self.keys, distinct), self.keys.shape[0] - 1)
        rows = np.where(self.keys[at] == distinct, self.rows[at], -1)[inverse]
        if inside is not None:
            rows[~inside] = -1
        return rows.astype(np.int64)


def _pack(columns: Sequence[npt.NDArray[np.integer[Any]]], radices: IntArray, n: int) -> IntArray:
    """One mixed-radix int64 key per tuple of ``n`` given column by column (in place)."""
    key = np.zeros(n, dtype=np.int64)
    for column, radix in zip(columns, radices.tolist(), strict=True):
        key *= int(radix)
        key += column
    return key


LabelFactor = tuple[npt.NDArray[np.unsignedinteger[Any]], ObjArray]
"""One QI's labels of a recoding: each tuple's label id (smallest unsigned dtype) and the
distinct labels in order of first appearance (what ``pd.factorize`` gives)."""


class Recoding:
    """Published labels per distinct raw QI tuple; suppressed tuples are all `*`.

    ``codes[i]`` is a distinct tuple of raw codes (one per QI, codes of the QI's
    hierarchy), ``labels[i]`` the labels it is published with, ``suppressed[i]`` whether
    its records are suppressed. ``description`` says how the labels were chosen
    (e.g. the transformation), for release.json. Immutable.

    Made from the labels themselves, or (``from_label_ids``) from per-QI label ids into
    distinct labels, as a full-domain transformation gives them (the hierarchy's label ids
    at a level): the per-tuple label objects are then only built if ``labels`` is read,
    and ``label_factors`` needs no factorising of objects (at 3M demo rows ~1.5 s per
    recoding, 0.6 s of it pandas' string checks).
    """

    qi_names: tuple[str, ...]
    codes: IntArray
    suppressed: BoolArray
    description: Mapping[str, Any]

    def __init__(
        self,
        qi_names: Sequence[str],
        codes: npt.ArrayLike,
        labels: npt.ArrayLike,
        suppressed: npt.ArrayLike,
        description: Mapping[str, Any],
    ) -> None:
        checked = _checked(qi_names, codes, suppressed)
        array = np.asarray(labels, dtype=object)
        if array.shape != checked[1].shape:
            raise ValueError("codes and labels must both have shape (n_tuples, n_qi)")
        array = array.copy()
        array[checked[2]] = SUPPRESSED
        self._set(*checked, description)
        object.__setattr__(self, "_labels", array)

    @classmethod
    def from_label_ids(
        cls,
        qi_names: Sequence[str],
        codes: npt.ArrayLike,
        label_ids: Sequence[npt.ArrayLike],
        label_names: Sequence[npt.ArrayLike],
        suppressed: npt.ArrayLike,
        description: Mapping[str, Any],
    ) -> Recoding:
        """The recoding whose tuple ``i`` is published with ``label_names[j][label_ids[j][i]]``
        on QI ``j`` (``*`` where suppressed): the same recoding as from those labels."""
        names, array, mask = _checked(qi_names, codes, suppressed)
        if len(label_ids) != len(names) or len(label_names) != len(names):
            raise ValueError("label_ids and label_names need one entry per quasi-identifier")
        factors = tuple(
            _factor(np.asarray(ids), np.asarray(distinct, dtype=object), mask)
            for ids, distinct in zip(label_ids, label_names, strict=True)
        )
        recoding = cls.__new__(cls)
        recoding._set(names, array, mask, description)
        object.__setattr__(recoding, "_factors", factors)
        return recoding

    def _set(
        self,
        names: tuple[str, ...],
        codes: IntArray,
        suppressed: BoolArray,
        description: Mapping[str, Any],
    ) -> None:
        index = _TupleIndex.build(codes) if names else None
        if index is not None and not index.unique:
            raise ValueError("raw QI tuples of a recoding must be distinct")
        object.__setattr__(self, "qi_names", names)
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "suppressed", suppressed)
        object.__setattr__(self, "description", dict(description))
        object.__setattr__(self, "_index", index)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Recoding is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Recoding is immutable (cannot delete {name!r})")

    def __repr__(self) -> str:
        return (
            f"Recoding(qi_names={self.qi_names!r}, tuples={self.n_tuples}, "
            f"suppressed={int(self.suppressed.sum())}, description={self.description!r})"
        )

    @property
    def labels(self) -> ObjArray:
        """The published labels, (n_tuples, n_qi) objects (built once when made from ids)."""
        labels: ObjArray | None = self.__dict__.get("_labels")
        if labels is None:
            labels = np.empty(self.codes.shape, dtype=object)
            for j, (ids, distinct) in enumerate(self.label_factors()):
                labels[:, j] = distinct[ids]
            object.__setattr__(self, "_labels", labels)
        return labels

    @property
    def n_tuples(self) -> int:
        return int(self.codes.shape[0])

    def locate(self, raw_codes: npt.ArrayLike) -> IntArray:
        """Row of the recoding for each tuple of raw codes (n, n_qi); -1 where absent."""
        array = np.asarray(raw_codes, dtype=np.int64).reshape(-1, len(self.qi_names))
        index: _TupleIndex | None = object.__getattribute__(self, "_index")
        if index is None:
            return np.full(array.shape[0], -1 if self.n_tuples == 0 else 0, dtype=np.int64)
        return index.locate(array)

    def encode(self, frame: pd.DataFrame, hierarchies: Mapping[str, Hierarchy]) -> IntArray:
        """Raw codes (n, n_qi) of a batch's QI columns; unknown values are a data error."""
        return _encode(self.qi_names, frame, hierarchies)

    def apply(
        self, frame: pd.DataFrame, hierarchies: Mapping[str, Hierarchy]
    ) -> tuple[pd.DataFrame, BoolArray]:
        """The batch with each QI replaced by its published label, and which rows are
        suppressed. A tuple absent from the recoding means the batch was not part of the
        summary the recoding was made from: refused, never guessed."""
        recoder: BatchRecoder | None = self.__dict__.get("_recoder")
        if recoder is None:
            recoder = self.recoder()
            object.__setattr__(self, "_recoder", recoder)
        return recoder.apply(frame, hierarchies)

    def label_factors(self) -> tuple[LabelFactor, ...]:
        """Per QI: each tuple's label id (smallest unsigned dtype) and the distinct labels
        in order of first appearance, factorised once per recoding (cached; given by
        ``from_label_ids``): the recode step's side input, the output's metrics and its
        person counts all group tuples by their labels, and factorising the object labels
        again for each took ~0.3 s of a 1M-row release's planning."""
        factors: tuple[LabelFactor, ...] | None = self.__dict__.get("_factors")
        if factors is None:
            made = []
            for j in range(len(self.qi_names)):
                codes, uniques = pd.factorize(self.labels[:, j], use_na_sentinel=False)
                dtype = np.min_scalar_type(max(len(uniques) - 1, 0))
                made.append((codes.astype(dtype), np.asarray(uniques, dtype=object)))
            factors = tuple(made)
            object.__setattr__(self, "_factors", factors)
        return factors

    def recoder(self) -> BatchRecoder:
        """What recoding batches needs, compactly (the recode step's side input)."""
        factors = self.label_factors()
        index: _TupleIndex | None = object.__getattribute__(self, "_index")
        return BatchRecoder(
            self.qi_names,
            index,
            tuple(ids for ids, _ in factors),
            tuple(names for _, names in factors),
            self.suppressed,
            self.n_tuples,
        )


def _checked(
    qi_names: Sequence[str], codes: npt.ArrayLike, suppressed: npt.ArrayLike
) -> tuple[tuple[str, ...], IntArray, BoolArray]:
    names = tuple(qi_names)
    array = np.asarray(codes, dtype=np.int64)
    mask = np.asarray(suppressed, dtype=bool).ravel()
    if array.ndim != 2 or array.shape[1] != len(names):
        raise ValueError("codes must have shape (n_tuples, n_qi)")
    if mask.shape[0] != array.shape[0]:
        raise ValueError("suppressed must have one entry per tuple")
    return names, array, mask


def _factor(ids: npt.NDArray[Any], distinct: ObjArray, suppressed: BoolArray) -> LabelFactor:
    """One QI's ``label_factors`` from label ids into ``distinct``: what factorising the
    labels (``*`` where suppressed) gives. Equal labels (as pandas compares them, ``*``
    included) get one id, the first of them in ``distinct`` kept; ids are then numbered in
    order of first appearance. Works on the few distinct labels and integer ids only."""
    raw = np.asarray(ids).ravel()
    if raw.shape[0] != suppressed.shape[0]:
        raise ValueError("label_ids need one entry per tuple")
    if raw.size and (int(raw.min()) < 0 or int(raw.max()) >= distinct.shape[0]):
        raise ValueError("label ids must index the distinct labels")
    merged, uniques = pd.factorize(
        np.append(distinct.astype(object), np.array([SUPPRESSED], dtype=object)),
        use_na_sentinel=False,
    )
    merged = np.asarray(merged, dtype=np.int64)
    taken = merged[:-1][raw.astype(np.intp, copy=False)]
    taken[suppressed] = merged[-1]
    appearing = np.asarray(pd.unique(taken), dtype=np.int64)  # in order of appearance
    renumber = np.zeros(len(uniques), dtype=np.int64)
    renumber[appearing] = np.arange(appearing.shape[0])
    dtype = np.min_scalar_type(max(appearing.shape[0] - 1, 0))
    names = np.asarray(uniques, dtype=object)[appearing]
    return renumber[taken].astype(dtype), names


def _encode(
    qi_names: Sequence[str], frame: pd.DataFrame, hierarchies: Mapping[str, Hierarchy]
) -> IntArray:
    columns = _encode_columns(qi_names, frame, hierarchies)
    return np.stack(columns, axis=1) if columns else np.empty((len(frame), 0), np.int64)


def _encode_columns(
    qi_names: Sequence[str], frame: pd.DataFrame, hierarchies: Mapping[str, Hierarchy]
) -> list[IntArray]:
    """Each QI's raw codes in ``frame`` (InputDataError naming a value its hierarchy lacks)."""
    columns = []
    for name in qi_names:
        codes = hierarchies[name].encode(frame[name])
        if (codes < 0).any():
            bad = frame[name][codes < 0]
            raise InputDataError(
                f"column {name!r}: {len(bad)} row(s) with values missing from its "
                f"hierarchy, e.g. {bad.iloc[0]!r}; add them to the hierarchy or map them"
            )
        columns.append(codes)
    return columns


@dataclass(frozen=True, eq=False)
class BatchRecoder:
    """A recoding reduced to what recoding batches needs: the index of the raw QI tuples,
    per QI the label id of every tuple (smallest unsigned dtype) and the distinct labels,
    and which tuples are suppressed. No raw codes and no per-tuple label objects, so it
    is a small side input; ``apply`` is ``Recoding.apply``."""

    qi_names: tuple[str, ...]
    index: _TupleIndex | None
    label_ids: tuple[npt.NDArray[np.unsignedinteger[Any]], ...]
    label_names: tuple[ObjArray, ...]
    suppressed: BoolArray
    n_tuples: int

    def apply(
        self, frame: pd.DataFrame, hierarchies: Mapping[str, Hierarchy]
    ) -> tuple[pd.DataFrame, BoolArray]:
        """As ``Recoding.apply``: labels per QI and the suppressed rows of a batch."""
        columns = _encode_columns(self.qi_names, frame, hierarchies)
        if self.index is None:
            rows = np.full(len(frame), -1 if self.n_tuples == 0 else 0, dtype=np.int64)
        else:
            rows = self.index.locate_columns(columns, len(frame))
        if (rows < 0).any():
            raise InputDataError(
                f"{int((rows < 0).sum())} row(s) have QI combinations that were not in the "
                "summary the anonymisation was computed on; the input changed during the run"
            )
        out = frame.copy()
        for name, ids, labels in zip(self.qi_names, self.label_ids, self._labels(), strict=True):
            if isinstance(labels, pd.CategoricalDtype):
                out[name] = pd.Categorical.from_codes(ids[rows].astype(np.int32), dtype=labels)
            else:
                out[name] = labels.take(ids[rows])
        return out, self.suppressed[rows]

    def _labels(self) -> list[Any]:
        """Per QI the categorical dtype over its distinct labels (``str``), built on first
        use, i.e. on the worker. A batch's labels are then its label ids, not strings: the
        writer's shuffle, the verifier's counts and the CSV writer work on the ids and on
        each distinct label once (Arrow dictionary columns), not on a string per cell.
        Labels that are not distinct as strings (or missing) stay a ``str`` array, taken."""
        cached: list[Any] | None = self.__dict__.get("_label_dtypes")
        if cached is None:
            cached = []
            for names in self.label_names:
                labels = pd.Index(names, dtype="str")
                distinct = labels.is_unique and not labels.hasnans
                cached.append(pd.CategoricalDtype(labels) if distinct else labels.array)
            object.__setattr__(self, "_label_dtypes", cached)
        return cached


def full_domain_labels(
    qi_names: Sequence[str],
    hierarchies: Mapping[str, Hierarchy],
    codes: IntArray,
    levels: Sequence[int],
) -> ObjArray:
    """Labels of raw-code tuples under a full-domain transformation (one level per QI)."""
    labels = np.empty(codes.shape, dtype=object)
    for j, (name, level) in enumerate(zip(qi_names, levels, strict=True)):
        labels[:, j] = hierarchies[name].generalize(codes[:, j], int(level))
    return labels
