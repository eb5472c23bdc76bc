"""Match targets to the published equivalence classes that may hold them.

The attacker knows a target's raw QI values, not its row. A published label *covers* a
raw value when it is the value's ancestor in the QI's hierarchy at the level the release
published that column at (full-domain releases name it in release.json; a local recoding
such as Mondrian publishes each label at the lowest level holding it), is ``*``, or is a
Mondrian range ``[lo, hi]`` holding the numeric value; values outside the hierarchy (or
a QI without one) are covered by an equal label. Labels are compared as hierarchy codes
at one level, so a string that names different groups at different levels (a leaf
called like another level's group) never matches at the wrong level. A class
(distinct tuple of published labels over the QIs the attacker knows) covers a target
when every label covers the target's value. Full-domain releases give one class per
target; local recodings (Mondrian) may give several, which the attacker pools. The
attacker's view of a target is the SA distribution pooled over the rows of every
covering class. Suppressed rows (all QIs ``*``) are not matched by their labels, but
they are a class of their own: an attacker who knows the target is in the table and
finds no kept class covering it knows it is among the suppressed rows, so such a target
is matched to the suppressed block (``block_targets`` counts them).

How it is fast: everything runs on distinct values, never per target. Per QI a sparse
coverage relation (distinct raw values x distinct labels) is built; distinct target
tuples are then joined to distinct class tuples one QI at a time, keeping only pairs
whose label prefix exists among the classes (a trie walk with sorted integer keys), so
intermediate sizes stay near the number of matching (tuple, class) pairs. Pooled counts
are one sparse matrix product.

Pure core: numpy, pandas (and its pyarrow, to read a staged Parquet table), scipy and the
standard library only (no Beam).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy, canonical_factorize
from privpipe.anonymity.summary import group_rows
from privpipe.attacks.frames import FrameMemo

__all__ = [
    "SUPPRESSED",
    "WEIGHT",
    "TargetView",
    "canonical_strings",
    "coverage",
    "frequency_table",
    "mark_distinct",
    "match_targets",
    "suppressed_rows",
    "unique_rows",
]

SUPPRESSED: Final = "*"
WEIGHT: Final = "__rows__"  # a frequency table's column: how many rows each distinct row stands for

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
ObjArray: TypeAlias = npt.NDArray[np.object_]

_RANGE: Final = r"^\[\s*([^,\]]+?)\s*,\s*([^,\])]+?)\s*([\])])$"


# --------------------------------------------------------------------------- strings


def canonical_strings(values: Any) -> tuple[IntArray, ObjArray]:
    """Codes per element and the distinct canonical strings (missing cells -> ``""``).

    The hierarchy's vectorised canonical form; two raw values with one canonical string
    (39 and 39.0) share a code.
    """
    codes, uniques = canonical_factorize(values)
    texts = uniques.astype(object)
    if (codes < 0).any():
        texts = np.append(texts, "").astype(object)
        codes = np.where(codes < 0, len(texts) - 1, codes)
    merged, names = pd.factorize(pd.Series(texts, dtype=object))
    out = np.empty(len(names), dtype=object)
    out[:] = [str(v) for v in names]
    return np.asarray(merged, dtype=np.int64)[codes], out


def unique_rows(matrix: npt.NDArray[np.integer[Any]]) -> tuple[IntArray, IntArray]:
    """``np.unique(matrix, axis=0, return_inverse=True)`` for a matrix of non-negative
    integer codes (same rows, same lexicographic order), by one packed int64 key per row
    (``anonymity.summary.group_rows``) instead of a sort of rows: far faster."""
    codes = np.asarray(matrix, dtype=np.int64)
    n, q = codes.shape
    if n == 0 or q == 0:
        return np.unique(codes, axis=0, return_inverse=True)
    columns = [codes[:, j] for j in range(q)]
    inverse, first = group_rows(columns, [int(c.max()) + 1 for c in columns])
    return codes[first], inverse


def suppressed_rows(published: pd.DataFrame, qis: Sequence[str]) -> BoolArray:
    """Rows published as suppressed: every QI is ``*``."""
    if not qis:
        return np.zeros(len(published), dtype=bool)
    mask = np.ones(len(published), dtype=bool)
    for qi in qis:
        column = published[qi]
        if isinstance(column.dtype, pd.CategoricalDtype):  # a loaded table: by its codes
            star = column.cat.categories.get_indexer([SUPPRESSED])[0]
            mask &= column.cat.codes.to_numpy() == star if star >= 0 else False
        elif pd.api.types.is_string_dtype(column.dtype) and not pd.api.types.is_object_dtype(
            column.dtype
        ):  # pandas' string arrays compare without a Python string per row
            mask &= (column == SUPPRESSED).to_numpy(dtype=bool, na_value=False)
        else:
            mask &= column.astype(object).to_numpy() == SUPPRESSED
    return mask


def read_coded(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A staged frequency table (Parquet: string label columns and ``WEIGHT``) with its
    labels read as categoricals, their codes straight from the file's dictionary pages:
    the steps after it work per distinct label, not per row (missing cells stay missing)."""
    import pyarrow.parquet as pq

    labels = [c for c in pq.read_schema(path).names if c != WEIGHT]
    return pq.read_table(path, read_dictionary=labels).to_pandas()


_DISTINCT: FrameMemo[bool] = FrameMemo()


def mark_distinct(table: pd.DataFrame) -> pd.DataFrame:
    """Record that ``table``, a frequency table (``WEIGHT``), holds each distinct row of its
    other columns once, as its maker guarantees (``reports.run.load_release``): a
    ``frequency_table`` of it over all those columns is then the table itself, not a
    regrouping (a second of the 1M demo's audit went to regrouping such tables). Only
    this object is marked, with its columns and length: a frame derived from it is not."""
    if WEIGHT not in table.columns:
        raise ValueError(f"mark_distinct needs a frequency table (a {WEIGHT!r} column)")
    _DISTINCT.put(table, True)
    return table


def _marked(frame: pd.DataFrame, cols: Sequence[str]) -> bool:
    """``frame`` is a table ``mark_distinct`` recorded, unchanged in shape, and ``cols``
    are all its columns but ``WEIGHT``."""
    labels = [str(c) for c in frame.columns if c != WEIGHT]
    return bool(_DISTINCT.get(frame)) and len(cols) == len(labels) and set(cols) == set(labels)


def frequency_table(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The distinct rows of ``frame[columns]`` with their multiplicity in column ``WEIGHT``.

    Its size is bounded by the combinations of values, not by the rows: matching a
    frequency table (``match_targets(..., weight=WEIGHT)``) gives the same view as
    matching the rows. Values are kept as they are (no canonicalisation: two spellings of
    one value stay two rows, which matching merges as it does for rows); missing cells
    form their own group. A table marked distinct (``mark_distinct``) asked for all its
    columns is returned as it is, in its order (which is what grouping it would give).
    """
    cols = list(columns)
    if WEIGHT in frame.columns and _marked(frame, cols):
        return frame if list(frame.columns) == [*cols, WEIGHT] else frame[[*cols, WEIGHT]]
    if WEIGHT in frame.columns:  # already one: merge equal rows, adding their weights
        grouped = frame.groupby(cols, sort=False, dropna=False, observed=True)[WEIGHT].sum()
        return grouped.reset_index()
    if not cols:
        return pd.DataFrame({WEIGHT: np.asarray([len(frame)] if len(frame) else [], np.int64)})
    sizes = frame.groupby(cols, sort=False, dropna=False, observed=True).size()
    return sizes.rename(WEIGHT).reset_index()


def records_of(frame: pd.DataFrame) -> int:
    """How many records ``frame`` holds: its rows, or a frequency table's summed ``WEIGHT``."""
    if WEIGHT in frame.columns:
        return int(frame[WEIGHT].sum())
    return len(frame)


def expand_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """A frequency table's rows, each repeated ``WEIGHT`` times (the column dropped); a
    frame without ``WEIGHT`` as it is."""
    if WEIGHT not in frame.columns:
        return frame
    times = frame[WEIGHT].to_numpy(dtype=np.int64)
    rows = frame.drop(columns=[WEIGHT])
    return rows.iloc[np.repeat(np.arange(len(rows)), times)].reset_index(drop=True)


# --------------------------------------------------------------------------- coverage


def _lowest_levels(labels: ObjArray, hierarchy: Hierarchy) -> IntArray:
    """Per label: the lowest hierarchy level holding it (-1: none)."""
    index = pd.Index(labels, dtype=object)
    out = np.full(labels.shape[0], -1, dtype=np.int64)
    for level in range(hierarchy.levels - 1, -1, -1):  # lower levels last: they win
        found = np.asarray(index.get_indexer(hierarchy.label_names(level)), dtype=np.int64)
        out[found[found >= 0]] = level
    return out


def coverage(
    raw: ObjArray,
    labels: ObjArray,
    hierarchy: Hierarchy | None = None,
    level: int | None = None,
) -> tuple[IntArray, IntArray]:
    """Pairs (raw index, label index) where the label covers the raw value, sorted by raw.

    With a ``hierarchy``, a raw value of it is covered by its ancestor at ``level`` (the
    release's published level of the column), or, when ``level`` is None (a local
    recoding), by each label that is its ancestor at the label's lowest level; other raw
    values (and every value without a hierarchy) by an equal label. ``*`` covers
    everything; numeric ranges ``[lo, hi]`` (inclusive) and ``[lo, hi)`` (Mondrian's grid
    ranges, hi excluded) cover the numbers inside.
    """
    n_raw, n_lab = raw.shape[0], labels.shape[0]
    index = pd.Index(labels, dtype=object)
    rows: list[IntArray] = []
    cols: list[IntArray] = []

    def add(raw_ids: IntArray, found: IntArray) -> None:
        keep = found >= 0
        rows.append(raw_ids[keep])
        cols.append(found[keep])

    every = np.arange(n_raw, dtype=np.int64)
    equal = np.asarray(index.get_indexer(raw), dtype=np.int64)
    star = np.flatnonzero(labels == SUPPRESSED)
    for position in star.tolist():
        add(every, np.full(n_raw, position, dtype=np.int64))
    if hierarchy is None:
        add(every, equal)
    else:
        codes = hierarchy.encode(raw)
        known = np.flatnonzero(codes >= 0).astype(np.int64)
        add(np.flatnonzero(codes < 0).astype(np.int64), equal[codes < 0])
        if level is not None:
            if not 0 <= level < hierarchy.levels:
                raise ValueError(
                    f"level {level} of {hierarchy.attribute!r}: the hierarchy has levels "
                    f"0..{hierarchy.levels - 1}"
                )
            ancestors = hierarchy.generalize(codes[known], level)
            add(known, np.asarray(index.get_indexer(ancestors), dtype=np.int64))
        else:
            lowest = _lowest_levels(labels, hierarchy)
            for j in range(hierarchy.levels):
                found = np.asarray(
                    index.get_indexer(hierarchy.generalize(codes[known], j)), dtype=np.int64
                )
                at_j = found >= 0
                at_j[at_j] = lowest[found[at_j]] == j
                add(known, np.where(at_j, found, -1))
    bounds = pd.Series(labels, dtype=object).astype(str).str.extract(_RANGE)
    lo = pd.to_numeric(bounds[0], errors="coerce").to_numpy(dtype=np.float64)
    hi = pd.to_numeric(bounds[1], errors="coerce").to_numpy(dtype=np.float64)
    ranged = np.flatnonzero(~np.isnan(lo) & ~np.isnan(hi))
    if ranged.size:
        numbers = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(
            dtype=np.float64
        )
        numeric = np.flatnonzero(~np.isnan(numbers)).astype(np.int64)
        order = numeric[np.argsort(numbers[numeric], kind="stable")]
        values = numbers[order]
        left = np.searchsorted(values, lo[ranged], side="left")
        half_open = (bounds[2] == ")").to_numpy(dtype=bool)[ranged]
        right = np.where(
            half_open,
            np.searchsorted(values, hi[ranged], side="left"),
            np.searchsorted(values, hi[ranged], side="right"),
        )
        width = np.maximum(right - left, 0)
        label_ids = np.repeat(ranged.astype(np.int64), width)
        starts = np.repeat(left, width)
        offsets = np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width)
        add(order[starts + offsets], label_ids)
    keys = np.unique(np.concatenate(rows) * max(n_lab, 1) + np.concatenate(cols))
    return (keys // max(n_lab, 1)).astype(np.int64), (keys % max(n_lab, 1)).astype(np.int64)


def _join(
    tuples: IntArray,
    classes: IntArray,
    relations: Sequence[tuple[IntArray, IntArray, int, int]],
) -> tuple[IntArray, IntArray]:
    """All (tuple, class) pairs whose every label covers the tuple's raw value.

    ``tuples`` (n_t x q) raw ids, ``classes`` (n_c x q) label ids, distinct rows;
    ``relations[j]`` = (raw ids, label ids, n_raw, n_labels) of QI j, sorted by raw id.
    """
    n_t, q = tuples.shape
    n_c = classes.shape[0]
    if q == 0:
        return np.repeat(np.arange(n_t), n_c), np.tile(np.arange(n_c), n_t)
    # most distinct labels first: the most selective QIs prune the walk early
    order = sorted(range(q), key=lambda j: -relations[j][3])
    state_t = np.arange(n_t, dtype=np.int64)
    state_p = np.zeros(n_t, dtype=np.int64)
    class_p = np.zeros(n_c, dtype=np.int64)
    for j in order:
        raw_ids, lab_ids, n_raw, n_lab = relations[j]
        indptr = np.searchsorted(raw_ids, np.arange(n_raw + 1))
        class_keys = class_p * n_lab + classes[:, j]
        unique_keys, class_p = np.unique(class_keys, return_inverse=True)
        class_p = class_p.astype(np.int64)
        r = tuples[state_t, j]
        start = indptr[r]
        count = indptr[r + 1] - start
        total = int(count.sum())
        offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        labels = lab_ids[np.repeat(start, count) + offsets]
        keys = np.repeat(state_p, count) * n_lab + labels
        position = np.searchsorted(unique_keys, keys)
        clipped = np.minimum(position, unique_keys.shape[0] - 1)
        found = (position < unique_keys.shape[0]) & (unique_keys[clipped] == keys)
        state_t = np.repeat(state_t, count)[found]
        state_p = position[found].astype(np.int64)
    class_of_prefix = np.empty(n_c, dtype=np.int64)
    class_of_prefix[class_p] = np.arange(n_c, dtype=np.int64)
    return state_t, class_of_prefix[state_p]


# --------------------------------------------------------------------------- the view


@dataclass(frozen=True, eq=False)
class TargetView:
    """What the attacker sees for each target, computed once and shared by the attacks.

    ``counts[u, s]`` is the number of published (unsuppressed) rows with SA value
    ``sa_values[s]`` in the classes covering distinct target tuple ``u``; ``classes[u]``
    how many classes cover it. ``target_tuple[i]`` is target i's tuple, ``true_codes[i]``
    its true SA value's column (-1 when unknown), ``target_rows[i]`` its row in the raw
    table. ``overall`` is the SA distribution p of the published unsuppressed rows;
    ``class_counts`` the SA counts per published class (over the known QIs).
    """

    qis: tuple[str, ...]
    sa: str
    sa_values: ObjArray
    counts: IntArray
    classes: IntArray
    target_tuple: IntArray
    true_codes: IntArray
    target_rows: IntArray
    overall: FloatArray
    published_rows: int
    suppressed_rows: int
    class_counts: IntArray
    block_targets: int = 0

    @property
    def n_targets(self) -> int:
        """Number of targets."""
        return int(self.target_tuple.shape[0])

    @property
    def sizes(self) -> IntArray:
        """Candidate rows per distinct target tuple."""
        return cast(IntArray, self.counts.sum(axis=1))

    def per_target(self, per_tuple: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Broadcast a per-tuple array to the targets."""
        return per_tuple[self.target_tuple]


def match_targets(
    published: pd.DataFrame,
    targets: pd.DataFrame,
    qis: Sequence[str],
    sa: str,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    *,
    known: Sequence[str] | None = None,
    suppressed: BoolArray | None = None,
    target_rows: IntArray | None = None,
    levels: Mapping[str, int] | None = None,
    weight: str | None = None,
) -> TargetView:
    """Map each target (raw QI values, and its true SA if ``targets`` has the column) to
    the published classes covering it, and pool their SA counts.

    ``published`` has the QI and SA columns of the release (an anonymised table, or the
    raw table itself as the no-protection baseline); ``known`` restricts matching to the
    QIs the attacker knows (default all); ``suppressed`` overrides the all-``*`` rule
    (which does not apply when every row is all ``*``: that is one generalised class);
    ``levels`` are the hierarchy levels the release published each QI at (full-domain
    releases; None or a missing QI: each label at its lowest level, see ``coverage``).
    ``weight`` names a column of ``published`` holding how many rows each of its rows
    stands for (a :func:`frequency_table`; default: ``WEIGHT`` when ``published`` has
    it); the view is the one the rows would give.
    """
    if weight is None and WEIGHT in published.columns:
        weight = WEIGHT
    qis = tuple(qis)
    known_qis = tuple(q for q in qis if known is None or q in known)
    hierarchies = hierarchies or {}
    missing = [c for c in (*known_qis, sa) if c not in published.columns]
    missing += [c for c in known_qis if c not in targets.columns]
    if missing:
        raise ValueError(f"columns missing from the published table or the targets: {missing}")
    if suppressed is None:
        hidden = suppressed_rows(published, qis)
        if hidden.all():
            # a suppression limit < 100% keeps some records: a table of only "*" rows is
            # the top of every hierarchy (one class of everyone), not a suppressed table
            hidden = np.zeros(len(published), dtype=bool)
    else:
        hidden = np.asarray(suppressed, dtype=bool)
    kept = published.loc[~hidden]
    if weight is None:
        w_kept = np.ones(len(kept), dtype=np.int64)
        w_hidden = np.ones(int(hidden.sum()), dtype=np.int64)
    else:
        w_all = published[weight].to_numpy(dtype=np.int64)
        w_kept, w_hidden = w_all[~hidden], w_all[hidden]

    # SA domain: published values (kept and suppressed rows), then true values of
    # targets absent from the release
    sa_codes, sa_names = canonical_strings(kept[sa])
    b_codes, b_names = canonical_strings(published.loc[hidden, sa])
    seen = np.union1d(sa_names.astype(str), b_names.astype(str))
    truth: IntArray | None = None
    if sa in targets.columns:
        t_codes, t_names = canonical_strings(targets[sa])
        extra = np.setdiff1d(t_names.astype(str), seen)
        domain = np.sort(np.concatenate([seen, extra])).astype(object)
        index = pd.Index(domain, dtype=object)
        truth = np.asarray(index.get_indexer(t_names), dtype=np.int64)[t_codes]
    else:
        domain = np.sort(seen).astype(object)
        index = pd.Index(domain, dtype=object)
    sa_codes = np.asarray(index.get_indexer(sa_names), dtype=np.int64)[sa_codes]
    b_codes = np.asarray(index.get_indexer(b_names), dtype=np.int64)[b_codes]
    m = domain.shape[0]

    # distinct classes over the known QIs, and distinct target tuples
    n_rows, n_t = len(kept), len(targets)
    label_cols: list[IntArray] = []
    raw_cols: list[IntArray] = []
    relations: list[tuple[IntArray, IntArray, int, int]] = []
    for qi in known_qis:
        lab_codes, lab_names = canonical_strings(kept[qi])
        raw_codes, raw_names = canonical_strings(targets[qi])
        raw_ids, lab_ids = coverage(
            raw_names, lab_names, hierarchies.get(qi), (levels or {}).get(qi)
        )
        relations.append((raw_ids, lab_ids, raw_names.shape[0], lab_names.shape[0]))
        label_cols.append(lab_codes)
        raw_cols.append(raw_codes)
    if known_qis:
        class_tuples, class_of_row = unique_rows(np.stack(label_cols, axis=1))
        tuples, tuple_of_target = unique_rows(np.stack(raw_cols, axis=1))
    else:
        class_tuples = np.zeros((1 if n_rows else 0, 0), dtype=np.int64)
        class_of_row = np.zeros(n_rows, dtype=np.int64)
        tuples = np.zeros((1 if n_t else 0, 0), dtype=np.int64)
        tuple_of_target = np.zeros(n_t, dtype=np.int64)
    class_of_row = np.asarray(class_of_row, dtype=np.int64).reshape(-1)
    n_c, n_u = class_tuples.shape[0], tuples.shape[0]
    class_counts = (
        np.bincount(class_of_row * m + sa_codes, weights=w_kept, minlength=n_c * m)
        .reshape(n_c, m)
        .astype(np.int64)
    )
    pair_t, pair_c = _join(
        np.asarray(tuples, dtype=np.int64), np.asarray(class_tuples, dtype=np.int64), relations
    )
    from scipy import sparse  # here: a run without attacks does not import scipy

    link = sparse.csr_matrix(
        (np.ones(pair_t.shape[0], dtype=np.int64), (pair_t, pair_c)), shape=(n_u, n_c)
    )
    counts = np.asarray(link @ class_counts, dtype=np.int64).reshape(n_u, m)
    n_classes = np.bincount(pair_t, minlength=n_u).astype(np.int64)
    orphans = np.zeros(n_u, dtype=bool)
    if b_codes.size:  # no kept class covers it: the target is in the suppressed block
        orphans = n_classes == 0
        counts[orphans] = np.bincount(b_codes, weights=w_hidden, minlength=m).astype(np.int64)
        n_classes[orphans] = 1
    totals = np.bincount(sa_codes, weights=w_kept, minlength=m).astype(np.float64)
    overall = totals / totals.sum() if n_rows else np.zeros(m, dtype=np.float64)
    rows = np.arange(n_t, dtype=np.int64) if target_rows is None else np.asarray(target_rows)
    return TargetView(
        qis=known_qis,
        sa=sa,
        sa_values=domain,
        counts=counts,
        classes=n_classes,
        target_tuple=np.asarray(tuple_of_target, dtype=np.int64).reshape(-1),
        true_codes=truth if truth is not None else np.full(n_t, -1, dtype=np.int64),
        target_rows=rows.astype(np.int64),
        overall=overall,
        published_rows=int(w_kept.sum()),
        suppressed_rows=int(w_hidden.sum()),
        class_counts=class_counts,
        block_targets=int(orphans[np.asarray(tuple_of_target, dtype=np.int64)].sum()),
    )
