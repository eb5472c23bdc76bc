"""Utility metrics of any ``Recoding`` over its summary (REFERENCE.md, ARX definitions).

``anonymity.metrics`` measures full-domain transformations from their equivalence classes;
this module measures a published recoding itself, so that full-domain and local recodings
(Mondrian) are measured alike. A published class is a set of records with identical
labels on every QI; suppressed records (all ``*``) form no class. All metrics are losses
(lower is better), with the same definitions, names and values as ``metrics.all_metrics``
for full-domain recodings (the tests check it).

Reading a label. What a published label covers is read per (raw value, label):
- a label of the QI's hierarchy that generalises the raw value: the lowest level at
  which the raw value's label is that label (level hint: see below); it covers the raw
  values under it (``leaves_under``) and its precision level is that level;
- for a numeric QI, otherwise, a range ``[lo, hi]`` (or a bare number): it covers the raw
  values of the hierarchy whose number lies in ``[lo, hi]``, and its precision level is
  the lowest level at which all of those share one label (their LCA);
- ``*`` of a suppressed record covers the whole domain at full height.
Anything else (a label that does not contain its raw value) is a ValueError.

Level hint. Hierarchies may repeat a label at two levels with different meanings (and so
coverage) for one raw value, which a label alone cannot tell apart. A full-domain
recoding knows its levels: pass ``levels`` (QI -> level, or a sequence) or put them in
``recoding.description["levels"]``; labels are then read at those levels, exactly as
``metrics`` does. Without a hint the lowest level is taken, which is the same whenever
labels are not repeated across levels (as in ARX's Adult hierarchies).

Definitions (n = |D|, S = suppressed records, per QI j with |dom_j| raw values):
- Loss: a record's share is cover / |dom_j| (1 if suppressed); IL_j = (sum share - n /
  |dom_j|) / (n - n / |dom_j|); ``loss`` is (prod_j (1 + IL_j))^(1/q) - 1, also the
  arithmetic mean and each IL_j.
- Discernibility: sum over classes |E|^2 + n S. AECS: n / (classes + 1 if S > 0).
- Precision: mean over QIs and records of level / height (1 if suppressed).
- Non-uniform entropy (ARX's non-monotonic variant, as in ``metrics``): each record has a
  label g before suppression (its published label; for a suppressed record its label at
  the hinted level, else its raw value); per QI the sum over records of
  log2(count(g) / count(v, g)), plus for suppressed records log2(S / count_S(g)). For
  full-domain count(v, g) = count(v), ARX's formula; for local recoding it is the
  conditional entropy of the raw value given the published one.
- KL divergence: sum over distinct raw QI tuples t of P(t) log2(P(t) / Q(t)), Q(t) the
  share of t's own class spread uniformly over the raw tuples its labels cover (product
  of the covers); for suppressed records, S / n over every raw tuple. As in ``metrics``,
  Q(t) reads t's own class only (boxes of other classes that also cover t are ignored).

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.mondrian import numeric_values, parse_range
from privpipe.anonymity.recoding import Recoding
from privpipe.anonymity.summary import Summary, group_rows, resolve_hierarchies

__all__ = ["class_sizes", "measure_recoding", "recoding_metrics"]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
ObjArray: TypeAlias = npt.NDArray[np.object_]

_DENSE_FACTOR = 4
_DENSE_MIN = 1 << 16
"""The entropy counts (raw value, label) pairs in an array indexed by the pair while it has
at most ``_DENSE_FACTOR`` slots per tuple (or ``_DENSE_MIN`` in all), and by grouping
otherwise: the same sums, in the same order."""


@dataclass(frozen=True, eq=False)
class _Published:
    """The summary's distinct raw QI tuples as the recoding publishes them."""

    codes: IntArray  # (T, q) raw codes
    weights: IntArray  # (T,) records per tuple
    rows: IntArray  # (T,) the recoding's row of each tuple (its labels: ``label_factors``)
    suppressed: BoolArray  # (T,)
    tuple_class: IntArray  # (T,) published class, -1 if suppressed
    sizes: IntArray  # records per published class

    @property
    def n_records(self) -> int:
        return int(self.weights.sum())

    @property
    def suppressed_records(self) -> int:
        return int(self.weights[self.suppressed].sum())


def _publish(recoding: Recoding, summary: Summary) -> _Published:
    if tuple(summary.qi_names) != tuple(recoding.qi_names):
        raise ValueError(
            f"the recoding is of {recoding.qi_names}, the summary of {summary.qi_names}"
        )
    q = summary.n_qi
    if q == 0 or summary.n_distinct == 0:
        raise ValueError("nothing to measure: the summary has no quasi-identifier or no rows")
    tuple_of_row, first = summary.qi_groups()
    weights = np.rint(np.bincount(tuple_of_row, weights=summary.counts)).astype(np.int64)
    codes = np.ascontiguousarray(summary.qi_codes[first])
    rows = _rows_of_tuples(recoding, codes)
    if (rows < 0).any():
        raise ValueError(
            f"{int((rows < 0).sum())} distinct QI tuple(s) of the summary are not in the "
            "recoding; it was made from another summary"
        )
    suppressed = recoding.suppressed[rows]
    kept = np.flatnonzero(~suppressed)
    tuple_class = np.full(codes.shape[0], -1, dtype=np.int64)
    sizes = np.zeros(0, dtype=np.int64)
    if kept.shape[0]:
        # the recoding's label ids (``label_factors``), numbered again in order of first
        # appearance among the kept tuples: the ids factorising their labels gives
        rows_kept = rows[kept]
        ids = [pd.factorize(f[rows_kept])[0].astype(np.int32) for f, _ in recoding.label_factors()]
        class_of_kept, _ = group_rows(ids, [int(i.max()) + 1 for i in ids])
        tuple_class[kept] = class_of_kept
        sizes = np.rint(np.bincount(class_of_kept, weights=weights[kept])).astype(np.int64)
    return _Published(codes, weights, rows, suppressed, tuple_class, sizes)


def _rows_of_tuples(recoding: Recoding, codes: IntArray) -> IntArray:
    """The recoding's row of each of the summary's distinct tuples ``codes``: themselves
    in order when the recoding was made of them (``api``'s recodings are), else looked up."""
    if recoding.codes.shape == codes.shape and np.array_equal(recoding.codes, codes):
        return np.arange(codes.shape[0], dtype=np.int64)
    return recoding.locate(codes)


def summary_rows(recoding: Recoding, summary: Summary) -> IntArray:
    """The recoding's row of each row of ``summary`` (-1 where its QI tuple is absent)."""
    if summary.n_distinct == 0:
        return np.zeros(0, dtype=np.int64)
    tuple_of_row, first = summary.qi_groups()
    return _rows_of_tuples(recoding, np.ascontiguousarray(summary.qi_codes[first]))[tuple_of_row]


def class_sizes(recoding: Recoding, summary: Summary) -> IntArray:
    """Records per published class (equal labels on every QI); suppressed excluded."""
    return _publish(recoding, summary).sizes


# --------------------------------------------------------------------------- reading labels


@dataclass(frozen=True, eq=False)
class _Reading:
    """Per tuple, for one QI: raw values covered, precision level, and an id of its label
    before suppression (equal labels, equal ids; for the entropy)."""

    cover: IntArray
    level: IntArray
    node: IntArray


def _lca_levels(
    hierarchy: Hierarchy, numbers: FloatArray, lo: FloatArray, hi: FloatArray
) -> tuple[IntArray, IntArray]:
    """Per range: raw values whose number is in [lo, hi], and the level of their LCA."""
    finite = np.flatnonzero(~np.isnan(numbers))
    order = finite[np.argsort(numbers[finite], kind="stable")]
    ordered = numbers[order]
    start = np.searchsorted(ordered, lo, side="left").astype(np.int64)
    stop = np.searchsorted(ordered, hi, side="right").astype(np.int64)
    cover = stop - start
    ids = np.stack([hierarchy.label_ids(lv) for lv in range(hierarchy.levels)])[:, order]
    ids = np.concatenate([ids, np.zeros((ids.shape[0], 1), dtype=np.int64)], axis=1)
    bounds = np.stack([start, np.maximum(stop, start + 1)], axis=1).ravel()
    low = np.minimum.reduceat(ids, bounds, axis=1)[:, 0::2]
    high = np.maximum.reduceat(ids, bounds, axis=1)[:, 0::2]
    return cover, np.argmax(low == high, axis=0).astype(np.int64)


def _positions(labels: Sequence[object], among: Sequence[object]) -> IntArray:
    """Index of each of ``labels`` among the distinct ``among``, -1 where absent (a dict:
    the equality an object comparison uses)."""
    position = {label: i for i, label in enumerate(among)}
    return np.array([position.get(label, -1) for label in labels], dtype=np.int64)


def _before_ids(
    hierarchy: Hierarchy,
    codes: IntArray,
    factor: tuple[npt.NDArray[np.integer[Any]], ObjArray],
    suppressed: BoolArray,
    hint: int | None,
) -> IntArray:
    """An id per tuple of its label before suppression (equal labels, equal ids): a kept
    tuple's published label; a suppressed tuple's label at ``hint``, or its raw value
    without a hint. The recoding's label ids, the hierarchy's labels mapped into them."""
    ids, names = factor
    key = np.asarray(ids, dtype=np.int64).copy()
    if suppressed.any():
        if hint is None:
            among, of_code = hierarchy.values, np.arange(hierarchy.domain_size)
        else:
            among, of_code = hierarchy.label_names(hint), hierarchy.label_ids(hint)
        index = _positions(among.tolist(), names.tolist())
        index = np.where(index >= 0, index, names.shape[0] + np.arange(index.shape[0]))
        key[suppressed] = index[of_code[codes[suppressed]]]
    return np.asarray(pd.factorize(key)[0], dtype=np.int64)


def _read(
    name: str,
    hierarchy: Hierarchy,
    codes: IntArray,
    suppressed: BoolArray,
    numeric: bool,
    hint: int | None,
    factor: tuple[npt.NDArray[np.integer[Any]], ObjArray],
) -> _Reading:
    """How each tuple's label reads (module docstring). ``factor``: the tuples' label ids
    and the distinct labels (``Recoding.label_factors``): each distinct label is looked up
    once per level among the hierarchy's labels there, and the tuples are read by
    comparing ids, not one label object per tuple and level."""
    n = codes.shape[0]
    cover = np.full(n, hierarchy.domain_size, dtype=np.int64)
    level = np.full(n, hierarchy.height, dtype=np.int64)
    ids, names = factor
    unread = ~suppressed
    for lv in range(hierarchy.levels) if hint is None else [hint]:
        if not unread.any():
            break
        found = _positions(names.tolist(), hierarchy.label_names(lv).tolist())
        hit = np.flatnonzero(unread & (found[ids] == hierarchy.label_ids(lv)[codes]))
        cover[hit] = hierarchy.leaves_under(lv)[codes[hit]]
        level[hit] = lv
        unread[hit] = False
    node = _before_ids(hierarchy, codes, factor, suppressed, hint)
    at = np.flatnonzero(unread)
    if at.shape[0] == 0:
        return _Reading(cover, level, node)
    labels = names[ids[at]]  # the unread tuples' labels
    where = f"at level {hint}" if hint is not None else "in its hierarchy"
    problem = (
        f"quasi-identifier {name!r}: label {labels[0]!r} is not a generalisation of the raw "
        f"value {hierarchy.values[codes[at[0]]]!r} {where}"
    )
    if not numeric:
        if parse_range(labels[0]) is not None:
            problem += "; list it in numeric to read [lo, hi] ranges"
        raise ValueError(problem)
    range_of, distinct = pd.factorize(labels)
    parsed = [parse_range(label) for label in distinct.tolist()]
    bad = [str(label) for label, p in zip(distinct.tolist(), parsed, strict=True) if p is None]
    if bad:
        raise ValueError(f"{problem}, nor a range [lo, hi] (e.g. {bad[0]!r})")
    lo = np.array([p[0] for p in parsed if p is not None], dtype=np.float64)
    hi = np.array([p[1] for p in parsed if p is not None], dtype=np.float64)
    numbers = numeric_values(hierarchy)
    value = numbers[codes[at]]
    outside = ~((lo[range_of] <= value) & (value <= hi[range_of]))
    if outside.any():
        i = int(np.argmax(outside))
        raise ValueError(
            f"quasi-identifier {name!r}: range {labels[i]!r} does not contain the raw "
            f"value {hierarchy.values[codes[at[i]]]!r}"
        )
    covers, lcas = _lca_levels(hierarchy, numbers, lo, hi)
    cover[at] = covers[range_of]
    level[at] = lcas[range_of]
    return _Reading(cover, level, node)


def _hints(
    recoding: Recoding, levels: Mapping[str, int] | Sequence[int] | None
) -> list[int | None]:
    names = recoding.qi_names
    given: object = levels if levels is not None else recoding.description.get("levels")
    if given is None:
        return [None] * len(names)
    if isinstance(given, Mapping):
        missing = [name for name in names if name not in given]
        if missing:
            raise ValueError(f"levels: no level for {', '.join(map(repr, missing))}")
        return [int(given[name]) for name in names]
    if isinstance(given, Sequence) and not isinstance(given, str) and len(given) == len(names):
        return [int(v) for v in given]
    raise ValueError(f"levels: expected one level per quasi-identifier, got {given!r}")


# --------------------------------------------------------------------------- metrics


def _il(numerator: int, n: int, domain: int) -> float:
    """IL_j = (sum share - n/dom) / (n - n/dom) = (numerator - n) / (n dom - n)."""
    if domain <= 1 or n == 0:
        return 0.0
    return max((numerator - n) / (n * domain - n), 0.0)


def _entropy(reading: _Reading, published: _Published, codes: IntArray) -> float:
    """Non-uniform entropy of one QI (module docstring), in bits."""
    w = published.weights.astype(np.float64)
    node = reading.node
    count = np.bincount(node, weights=w)
    nodes = int(node.max()) + 1
    span = (int(codes.max()) + 1) * nodes
    if span <= max(_DENSE_FACTOR * node.shape[0], _DENSE_MIN):  # (value, label): a count array
        key = codes.astype(np.int64) * nodes + node
        with_value = np.bincount(key, weights=w, minlength=span)[key]
    else:
        joint, _ = group_rows([codes, node], [int(codes.max()) + 1, nodes])
        with_value = np.bincount(joint, weights=w)[joint]
    total = float(np.dot(w, np.log2(count[node] / with_value)))
    supp = published.suppressed
    s = float(w[supp].sum())
    if s > 0:
        count_s = np.bincount(node[supp], weights=w[supp], minlength=count.shape[0])
        total += float(np.dot(w[supp], np.log2(s / count_s[node[supp]])))
    return total


def recoding_metrics(
    recoding: Recoding,
    summary: Summary,
    hierarchies: Mapping[str, Hierarchy] | Sequence[Hierarchy],
    *,
    numeric: Collection[str] = (),
    levels: Mapping[str, int] | Sequence[int] | None = None,
) -> dict[str, Any]:
    """Every metric of a recoding of ``summary`` (module docstring); lower is better.

    Keys as ``metrics.Metrics.as_dict()`` (loss, loss_arithmetic, loss_per_attribute,
    discernibility, average_class_size, precision, non_uniform_entropy, kl_divergence,
    suppressed_records) plus ``classes`` (published classes). ``numeric`` names the QIs
    whose labels may be ranges; ``levels`` is the level hint of a full-domain recoding.
    """
    metrics, _ = measure_recoding(recoding, summary, hierarchies, numeric=numeric, levels=levels)
    return metrics


def measure_recoding(
    recoding: Recoding,
    summary: Summary,
    hierarchies: Mapping[str, Hierarchy] | Sequence[Hierarchy],
    *,
    numeric: Collection[str] = (),
    levels: Mapping[str, int] | Sequence[int] | None = None,
) -> tuple[dict[str, Any], IntArray]:
    """``recoding_metrics`` and ``class_sizes`` together, publishing the summary once."""
    names = recoding.qi_names
    resolved = resolve_hierarchies(names, hierarchies)
    numbers = {numeric} if isinstance(numeric, str) else set(numeric)
    hints = _hints(recoding, levels)
    published = _publish(recoding, summary)
    n = published.n_records
    supp = published.suppressed_records
    w = published.weights
    per: dict[str, float] = {}
    precision_parts: list[float] = []
    entropy = 0.0
    log_area = np.zeros(w.shape[0], dtype=np.float64)
    log_all = 0.0
    factors = recoding.label_factors()
    for j, (name, hierarchy) in enumerate(zip(names, resolved, strict=True)):
        codes = published.codes[:, j]
        ids, distinct = factors[j]
        reading = _read(
            name,
            hierarchy,
            codes,
            published.suppressed,
            name in numbers,
            hints[j],
            (ids[published.rows], distinct),
        )
        domain = hierarchy.domain_size
        per[name] = _il(int(np.dot(w, reading.cover)), n, domain)
        height = hierarchy.height
        kept = ~published.suppressed
        share = float(np.dot(w[kept], reading.level[kept])) / height if height else 0.0
        precision_parts.append((share + supp) / n)
        entropy += _entropy(reading, published, codes)
        log_area += np.log2(reading.cover.astype(np.float64))
        log_all += math.log2(domain)
    values = list(per.values())
    geometric = math.prod(1.0 + v for v in values) ** (1.0 / len(values)) - 1.0
    sizes = published.sizes
    kept = ~published.suppressed
    p = w / n
    log_q = np.full(w.shape[0], math.log2(supp / n) - log_all if supp else 0.0)
    log_q[kept] = np.log2(sizes[published.tuple_class[kept]] / n) - log_area[kept]
    kl = float(np.dot(p, np.log2(p) - log_q))
    metrics = {
        "loss": float(geometric),
        "loss_arithmetic": sum(values) / len(values),
        "loss_per_attribute": per,
        "discernibility": float(int(np.dot(sizes, sizes)) + n * supp),
        "average_class_size": n / max(int(sizes.shape[0]) + (1 if supp else 0), 1),
        "precision": sum(precision_parts) / len(precision_parts),
        "non_uniform_entropy": max(entropy, 0.0),
        "kl_divergence": max(kl, 0.0),
        "suppressed_records": supp,
        "classes": int(sizes.shape[0]),
    }
    return metrics, sizes
