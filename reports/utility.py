"""Workload utility: answer the common workload from each release, compare with the truth.

How each kind of release answers a marginal count (its cells are the value combinations
present in the raw data; a cell the release gives no mass to is answered 0):

- **Anonymised tables** (k-anonymity, l-diversity, t-closeness; also the raw table):
  every published row spreads one record *uniformly* over the raw values its label
  covers, independently per column. A label found in the column's hierarchy covers the
  raw values under it at its level (the level of the transformation when release.json
  names one, else the lowest level holding the label); ``*`` covers the whole domain; a
  ``[lo, hi]`` (or ``[lo, hi)``) range — Mondrian's numeric QIs — covers the domain's
  numeric values inside it; a raw value covers itself. The domain is the hierarchy's
  raw values (public), else the distinct raw values of the column. **Suppressed rows**
  (all QIs ``*``) are kept and spread over the whole domain of every QI (their
  sensitive value is published, so they still answer the sensitive attribute's
  marginal); releases that drop suppressed rows simply publish fewer rows.
  By default (``UtilityOptions.domain="data"``) a label covers only the raw values under it
  that occur in the data (else a generous hierarchy file, e.g. ages 0-120 for data aged
  17-90, would leak mass into cells that do not exist and penalise releases arbitrarily);
  ``domain="hierarchy"`` spreads over every raw value of the hierarchy (what an outsider
  knowing only the public hierarchy would do). A label that
  resolves to no domain value is spread over the whole domain and counted in
  ``unresolved_labels``.
- **Central-DP histograms** (dp_count, dp_histogram; the ``count`` column of dp_sum /
  dp_mean): a marginal is answerable by a query whose key columns (``partition_by`` +
  ``group_by``) contain the marginal's columns; its noisy cells are summed over the other
  key columns; key columns published at a coarser level (``levels``) spread uniformly
  like anonymised labels. When several queries can answer, the one with the fewest key
  columns is used (fewest noisy cells summed). Marginals no query covers are *not
  answerable*: excluded from the scores and counted. dp_top_k publishes a ranking, not
  counts, and answers nothing.
- **Local-DP estimates** (a frame ``value, estimate`` for one attribute, release.json
  ``parameters.attribute``): the 1-way marginal of that attribute.

**The common workload** (``utility.common``, the release's ``summary.error``): the same
queries for every release — the config's declared ``report.queries`` when given, else
every cell of the default marginals — with ONE rule for a query a release cannot answer:
it is a full miss, answered 0 (relative error = true / max(true, floor), at most 1). A
release that publishes nothing about a query gives the analyst nothing for it; crediting
it with, e.g., a uniform share of its total would reward releases for data they do not
publish, and the rule is the same for every kind. The raw table scores 0.

**Each release's own estimand** (``utility.own``, ``summary.own_error``): for a DP count
or histogram, its published cells against the raw counts, split into bounding bias
(``utility.bias``: the exact person-bounded counts of the run, before noise, against the
raw counts) and noise (``utility.noise``: the noisy against the bounded counts); for a
``dp_mean``/``dp_sum``, its published means/sums against the true ones (raw when the
value column is in the truth frame, else the exact bounded values of the run); for
anonymised tables and local DP, the workload error above.

Metrics over the answered cells (each cell is one count query): mean absolute error;
mean relative error |est - true| / max(true, floor) with ``floor = max(10, 0.1% of the
rows)`` (the usual sanity bound, so tiny cells do not dominate); max absolute error;
share of queries within 10% (relative error, same floor, <= 0.10). Only aggregates are
returned — never a cell, a value or a count of the raw data — and metrics over fewer than
``min_queries`` (10) queries are withheld: with the published answers beside them, the
errors of one or two cells would give their true counts back.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import SUPPRESSED, Hierarchy
from privpipe.attacks.matching import WEIGHT, frequency_table
from privpipe.reports.run import ANONYMISED_KINDS, LOCAL_DP_KINDS, Release
from privpipe.reports.workload import CountQuery, Marginal, Truth, canonical_column, canonical_frame

__all__ = [
    "COMMON_RULE",
    "Source",
    "UtilityOptions",
    "answer_marginal",
    "answerer_of",
    "cover_table",
    "own_utility",
    "raw_release",
    "relative_floor",
    "release_estimates",
    "release_sources",
    "release_utility",
    "score",
]

ObjArray: TypeAlias = npt.NDArray[np.object_]
FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]

_RANGE: Final = re.compile(r"^\s*\[\s*([^,\[\]()]+?)\s*,\s*([^,\[\]()]+?)\s*([\])])\s*$")
_VALUE_COLUMNS: Final = frozenset(
    {"query", "count", "ci_low", "ci_high", "sum", "mean", "rank", "estimate", "variance"}
    | {"stddev", "median"}
)
_N: Final = "__n"
KEY_LIMIT: Final = 2**62
"""Cells times label combinations of a marginal up to which its estimate is computed on
one int64 key per combination (beyond, by frames: the same answers, slower)."""
COMMON_RULE: Final = (
    "a query the release cannot answer is a full miss: answered 0, relative error "
    "true / max(true, floor) (at most 1); the same rule for every release. The error is the "
    "mean over the workload's items (each marginal, each declared query) of their mean "
    "relative error, so a marginal with many cells does not outweigh the others"
)


@dataclass(frozen=True)
class UtilityOptions:
    """Scoring settings (recorded in the audit's methodology)."""

    floor_share: float = 0.001  # relative-error floor as a share of the rows ...
    floor_min: float = 10.0  # ... but never below this many records
    within: float = 0.10  # "within 10%" threshold on the floored relative error
    min_queries: int = 10  # metrics over fewer queries are withheld (see ``score``)
    domain: str = "hierarchy"  # a label covers its hierarchy leaves (public), or "data"

    def describe(self, rows: int) -> dict[str, Any]:
        return {
            "relative_error": "|estimate - true| / max(true, floor)",
            "floor": relative_floor(rows, self),
            "floor_rule": f"max({self.floor_min:g}, {self.floor_share:.1%} of rows)",
            "within_threshold": self.within,
            "spread_over": "the values under a label that occur in the data (not public: "
            "for comparison only)"
            if self.domain == "data"
            else "the public domain: every leaf under a label in the column's hierarchy "
            "(the analyst does not know which values occur); a column without a "
            "hierarchy spreads over its raw values",
            "min_queries": self.min_queries,
            "withheld": f"metrics over fewer than {self.min_queries} queries (a small "
            "marginal, a few custom queries) are withheld: next to the published answers "
            "they would reveal true counts",
            "caveat": "utility metrics are computed from the true data: they are not "
            "differentially private and reveal aggregate error sizes only",
        }


def relative_floor(rows: int, options: UtilityOptions | None = None) -> float:
    """The floor of the relative error's denominator for a table of ``rows`` records."""
    o = options or UtilityOptions()
    return float(max(o.floor_min, o.floor_share * rows))


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """Published counts over label columns: one anonymised table or one DP query.

    ``labels`` holds one row per published row/cell (canonical strings); ``counts`` its
    weight (1 per published record, or the noisy count). ``levels`` are the known
    hierarchy levels of columns; ``numeric`` the columns published as ``[lo, hi]`` ranges.
    """

    name: str
    labels: pd.DataFrame
    counts: FloatArray
    levels: Mapping[str, int] = field(default_factory=dict)
    numeric: frozenset[str] = frozenset()

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(str(c) for c in self.labels.columns)


def _numbers(values: pd.Series) -> FloatArray:
    return np.asarray(pd.to_numeric(values, errors="coerce").fillna(0.0), dtype=np.float64)


def raw_release(raw: pd.DataFrame, columns: Sequence[str], name: str = "raw") -> Release:
    """The raw table as a release (the no-protection baseline; answers with 0 error);
    ``raw`` may be a frequency table (its ``WEIGHT`` column is kept)."""
    cols = [*columns, *([WEIGHT] if WEIGHT in raw.columns else [])]
    return Release(name=name, kind="raw", data=raw.loc[:, cols], document={})


def _table_source(release: Release) -> Source:
    params = release.parameters
    transformation = dict(release.document.get("transformation") or {})
    levels = {str(k): int(v) for k, v in (transformation.get("levels") or {}).items()}
    numeric = frozenset(
        str(c) for c in (params.get("numeric") or transformation.get("numeric") or [])
    )
    data = release.data
    # one source row per distinct published row, its count the rows it stands for: the
    # same answers as one row per record, at the size of the classes, not of the rows
    # (a frequency table, the raw baseline's, is merged adding its weights)
    columns = [str(c) for c in data.columns if c != WEIGHT]
    distinct = frequency_table(data, columns)
    labels = canonical_frame(distinct, columns)
    return Source(
        release.name, labels, distinct[WEIGHT].to_numpy(dtype=np.float64), levels, numeric
    )


def _dp_parts(release: Release) -> list[tuple[str, pd.DataFrame, list[str], dict[str, int]]]:
    """Per query of a DP release: (name, its published rows, key columns, key levels)."""
    data = release.data
    params = release.parameters
    queries: Mapping[str, Any] = params.get("queries") or {}
    partition_by = [str(c) for c in params.get("partition_by") or []]
    parts: list[tuple[str, pd.DataFrame]]
    if "query" in data.columns:
        parts = [(str(q), g) for q, g in data.groupby("query", sort=True)]
    else:
        parts = [(next(iter(queries), release.name), data)]
    out = []
    for qname, part in parts:
        q = queries.get(qname) or {}
        keys = [*partition_by, *[str(c) for c in q.get("group_by") or []]]
        keys = [c for c in dict.fromkeys(keys) if c in part.columns]
        if not keys:
            keys = [c for c in part.columns if c not in _VALUE_COLUMNS]
        # a long-form table has empty cells in other queries' key columns: drop those
        levels = {str(k): int(v) for k, v in (q.get("levels") or {}).items()}
        out.append((qname, part, keys, levels))
    return out


def _dp_sources(release: Release) -> list[Source]:
    if "count" not in release.data.columns:
        return []
    return [
        Source(
            f"{release.name}:{qname}",
            canonical_frame(part, keys),
            np.clip(_numbers(part["count"]), 0.0, None),
            levels,
        )
        for qname, part, keys, levels in _dp_parts(release)
    ]


def _ldp_sources(release: Release) -> list[Source]:
    data = release.data
    attribute = release.parameters.get("attribute")
    if attribute is None or "value" not in data.columns or "estimate" not in data.columns:
        return []
    labels = pd.DataFrame({str(attribute): canonical_column(data["value"])})
    return [Source(release.name, labels, np.clip(_numbers(data["estimate"]), 0.0, None))]


_SOURCES: dict[int, tuple[Release, tuple[list[Source], str]]] = {}
_SOURCES_KEPT: Final = 32


def release_sources(release: Release) -> tuple[list[Source], str]:
    """The sources a release answers from, and the method's name for the audit; built
    once per release object (the utility and the distributions both read them)."""
    hit = _SOURCES.get(id(release))
    if hit is not None and hit[0] is release:  # the release itself is kept: its id is unique
        return list(hit[1][0]), hit[1][1]
    found = _release_sources(release)
    if len(_SOURCES) >= _SOURCES_KEPT:
        _SOURCES.pop(next(iter(_SOURCES)))
    _SOURCES[id(release)] = (release, found)
    return list(found[0]), found[1]


def _release_sources(release: Release) -> tuple[list[Source], str]:
    if release.kind == "raw":
        return [_table_source(release)], "exact"
    if release.kind in ANONYMISED_KINDS:
        return [_table_source(release)], "uniform spreading of generalised labels"
    if release.kind == "dp_top_k":
        return [], "a ranking: answers no count query"
    if release.kind == "dp_count_distinct" and release.parameters.get("privacy_unit"):
        return [], "distinct persons: answers no row-count query"
    if release.kind.startswith("dp_"):
        return _dp_sources(release), "noisy cells (coarser levels spread uniformly)"
    if release.kind in LOCAL_DP_KINDS:
        return _ldp_sources(release), "local-DP frequency estimates"
    return [], f"unknown kind {release.kind!r}: answers nothing"


# --------------------------------------------------------------------------- covers


def _range_mask(
    labels: ObjArray, domain: ObjArray
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """(labels x domain) membership of ``[lo, hi]``/``[lo, hi)`` labels; rows parsed."""
    numbers = np.asarray(
        pd.to_numeric(pd.Series(domain, dtype=object), errors="coerce"), dtype=np.float64
    )
    lo = np.full(len(labels), np.nan)
    hi = np.full(len(labels), np.nan)
    closed = np.ones(len(labels), dtype=bool)
    for i, label in enumerate(labels.tolist()):  # per distinct label, not per row
        text = str(label)
        match = _RANGE.match(text)
        a, b, end = match.groups() if match else (text, text, "]")
        try:
            x, y = float(a), float(b)
        except ValueError:
            continue
        if math.isfinite(x) and math.isfinite(y) and x <= y:
            lo[i], hi[i], closed[i] = x, y, end == "]"
    parsed = ~np.isnan(lo)
    upper = np.where(
        closed[:, None], numbers[None, :] <= hi[:, None], numbers[None, :] < hi[:, None]
    )
    mask = (numbers[None, :] >= lo[:, None]) & upper & parsed[:, None]
    return mask, parsed


def cover_table(
    labels: Sequence[str] | ObjArray,
    domain: Sequence[str] | ObjArray,
    hierarchy: Hierarchy | None = None,
    *,
    level: int | None = None,
    numeric: bool = False,
    present: Sequence[str] | ObjArray | None = None,
) -> tuple[pd.DataFrame, int]:
    """What each label covers: a frame ``label, value, weight`` (weight = 1/|cover|).

    Rules in the module docstring. With ``present`` (the values that occur in the data),
    a label covers only its present values (all of them if none is present). Returns the
    frame and the number of labels that resolved to nothing (spread over the whole domain).
    """
    labs = np.asarray(pd.unique(np.asarray(labels, dtype=object)), dtype=object)
    dom = np.asarray(hierarchy.values if hierarchy is not None else domain, dtype=object)
    todo = np.ones(len(labs), dtype=bool)
    pairs: list[pd.DataFrame] = []

    def take(which: npt.NDArray[np.bool_], mask: npt.NDArray[np.bool_] | None) -> None:
        chosen = labs[which]
        if mask is None:  # the whole domain
            pairs.append(
                pd.DataFrame(
                    {"label": np.repeat(chosen, len(dom)), "value": np.tile(dom, len(chosen))}
                )
            )
        else:
            rows, cols = np.nonzero(mask[which])
            pairs.append(pd.DataFrame({"label": chosen[rows], "value": dom[cols]}))
        todo[which] = False

    take(labs == SUPPRESSED, None)

    def ranges() -> None:
        if not todo.any():
            return
        mask, parsed = _range_mask(labs, dom)
        ok = todo & parsed & mask.any(axis=1)
        take(ok, mask)

    if numeric:
        ranges()
    if hierarchy is not None and todo.any():
        pending = set(labs[todo].tolist())
        n_dom = hierarchy.domain_size
        long = pd.DataFrame(
            {
                "level": np.repeat(np.arange(hierarchy.levels), n_dom),
                "label": np.concatenate([hierarchy.labels(lv) for lv in range(hierarchy.levels)]),
                "value": np.tile(hierarchy.values, hierarchy.levels),
            }
        )
        long = long[long["label"].isin(pending)]
        if len(long):
            rank = long["level"].where(long["level"] != (-1 if level is None else level), -1)
            best = rank.groupby(long["label"]).transform("min")
            long = long[rank == best]
            pairs.append(long[["label", "value"]])
            todo[np.isin(labs, long["label"].unique())] = False
    if todo.any():
        identity = todo & np.isin(labs, dom)
        pairs.append(pd.DataFrame({"label": labs[identity], "value": labs[identity]}))
        todo[identity] = False
    if not numeric:
        ranges()
    unresolved = int(todo.sum())
    if unresolved:
        take(todo.copy(), None)
    frame = (
        pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame({"label": [], "value": []})
    )
    frame = frame.astype({"label": object, "value": object})
    if present is not None and len(frame):
        keep = frame["value"].isin(list(present))
        any_kept = keep.groupby(frame["label"], sort=False).transform("any")
        frame = frame[keep | ~any_kept].reset_index(drop=True)
    sizes = frame.groupby("label", sort=False)["value"].transform("size")
    frame["weight"] = 1.0 / sizes.to_numpy(dtype=np.float64)
    return frame, unresolved


def _is_identity(cover: pd.DataFrame) -> bool:
    return bool(
        (cover["weight"].to_numpy() == 1.0).all() and (cover["label"] == cover["value"]).all()
    )


class _Answerer:
    """Answers marginals from the sources of one release, caching covers per column."""

    def __init__(
        self,
        sources: Sequence[Source],
        truth: Truth,
        hierarchies: Mapping[str, Hierarchy],
        present_only: bool = True,
        method: str = "",
    ) -> None:
        self.present_only = present_only
        self.method = method  # how the release answers (release_sources)
        self.sources = list(sources)
        self.truth = truth
        self.hierarchies = hierarchies
        self._covers: dict[tuple[int, str], tuple[pd.DataFrame | None, int]] = {}
        self._coded: dict[tuple[int, str], tuple[IntArray, pd.Index]] = {}
        self._cover_coded: dict[
            tuple[int, str], tuple[IntArray, IntArray, FloatArray, pd.Index]
        ] = {}

    def cover(self, i: int, col: str) -> pd.DataFrame | None:
        """Cover of source i's labels of ``col``; None when it is the identity."""
        key = (i, col)
        if key not in self._covers:
            s = self.sources[i]
            domain = self.truth.domains.get(col)
            if domain is None:
                domain = np.asarray(pd.unique(s.labels[col].to_numpy(dtype=object)), dtype=object)
            frame, unresolved = cover_table(
                s.labels[col].to_numpy(dtype=object),
                domain,
                self.hierarchies.get(col),
                level=s.levels.get(col),
                numeric=col in s.numeric,
                present=self.truth.domains.get(col) if self.present_only else None,
            )
            self._covers[key] = (None if _is_identity(frame) else frame, unresolved)
        return self._covers[key][0]

    @property
    def unresolved(self) -> int:
        return sum(u for _, u in self._covers.values())

    def pick(self, columns: Sequence[str]) -> int | None:
        """The source answering these columns with the fewest key columns (None: none)."""
        best: tuple[int, int, int] | None = None
        for i, s in enumerate(self.sources):
            if set(columns) <= set(s.columns):
                rank = (len(s.columns), sum(s.levels.values()), i)
                best = rank if best is None or rank < best else best
        return None if best is None else best[2]

    def marginal(self, columns: Marginal) -> pd.Series | None:
        i = self.pick(columns)
        return None if i is None else self._frames(i, columns)

    def _frames(self, i: int, columns: Marginal) -> pd.Series:
        """Source i's answer to the marginal, by frames (its covers kept)."""
        return answer_marginal(self.sources[i], columns, {c: self.cover(i, c) for c in columns})

    def estimate(self, columns: Marginal, cells: pd.Index) -> FloatArray | None:
        """The marginal's estimate at each of ``cells`` (value combinations; 0 where the
        release gives a cell nothing): ``marginal(columns).reindex(cells)``, computed on
        integer codes (None: not answerable)."""
        i = self.pick(columns)
        if i is None:
            return None
        s = self.sources[i]
        cols = list(columns)
        if isinstance(cells, pd.MultiIndex):
            values = [cells.levels[j] for j in range(len(cols))]
            codes = [np.asarray(cells.codes[j], dtype=np.int64) for j in range(len(cols))]
        else:
            values, codes = [cells], [np.arange(len(cells), dtype=np.int64)]
        spread = [self._spread(i, c, v) for c, v in zip(cols, values, strict=True)]
        sizes = [len(v) for v in values]
        coded = [self._labels(i, c) for c in cols]
        labels, widths = [lab for lab, _ in coded], [len(u) for _, u in coded]
        if math.prod(sizes) * math.prod(widths) >= KEY_LIMIT:  # keys would not fit: by frames
            found = self._frames(i, columns)
            return found.reindex(cells, fill_value=0.0).to_numpy(dtype=np.float64)
        # the published counts per label combination, then each column spread in turn
        key = np.zeros(len(s.counts), dtype=np.int64)
        for lab, width in zip(labels, widths, strict=True):
            key = key * width + lab
        weight = np.asarray(s.counts, dtype=np.float64)
        for j, (starts, degree, value, share) in enumerate(spread):
            key, weight = _regroup(key, weight)
            below = math.prod(widths[j + 1 :])  # the labels not spread yet, under the key
            done, label, rest = key // (widths[j] * below), (key // below) % widths[j], key % below
            take = degree[label]
            row = np.repeat(np.arange(len(key), dtype=np.int64), take)
            entry = starts[label][row] + (
                np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(take) - take, take)
            )
            key = (done[row] * sizes[j] + value[entry]) * below + rest[row]
            weight = weight[row] * share[entry]
        key, weight = _regroup(key, weight)
        wanted = np.zeros(len(cells), dtype=np.int64)
        for size, code in zip(sizes, codes, strict=True):
            wanted = wanted * size + code
        out = np.zeros(len(cells), dtype=np.float64)
        at = np.searchsorted(key, wanted)
        hit = (at < len(key)) & np.logical_and.reduce([c >= 0 for c in codes])
        hit[hit] = key[at[hit]] == wanted[hit]
        out[hit] = weight[at[hit]]
        return out

    def _labels(self, i: int, col: str) -> tuple[IntArray, pd.Index]:
        """Source i's label code per row of ``col`` and its distinct labels."""
        key = (i, col)
        if key not in self._coded:
            codes, uniques = pd.factorize(self.sources[i].labels[col].to_numpy(dtype=object))
            self._coded[key] = (np.asarray(codes, dtype=np.int64), pd.Index(uniques, dtype=object))
        return self._coded[key]

    def _cover_codes(self, i: int, col: str) -> tuple[IntArray, IntArray, FloatArray, pd.Index]:
        """Source i's cover of ``col`` coded once: entries in label-code order with their
        label code, value code and weight, and the values those codes index."""
        key = (i, col)
        if key not in self._cover_coded:
            uniques = self._labels(i, col)[1]
            cover = self.cover(i, col)
            if cover is None:  # each label is its own value
                label = np.arange(len(uniques), dtype=np.int64)
                value, values = label.copy(), uniques
                share = np.ones(len(uniques), dtype=np.float64)
            else:
                label = np.asarray(uniques.get_indexer(cover["label"].to_numpy(dtype=object)))
                codes, found = pd.factorize(cover["value"].to_numpy(dtype=object))
                value, values = np.asarray(codes, dtype=np.int64), pd.Index(found, dtype=object)
                share = cover["weight"].to_numpy(dtype=np.float64)
            order = np.argsort(label, kind="stable")
            self._cover_coded[key] = (label[order], value[order], share[order], values)
        return self._cover_coded[key]

    def _spread(
        self, i: int, col: str, values: pd.Index
    ) -> tuple[IntArray, IntArray, IntArray, FloatArray]:
        """The cover of source i's labels of ``col`` onto ``values`` as sparse rows per label
        code: (first entry, entries, value code per entry, weight per entry); values not in
        ``values`` are left out (no cell of the answer has them)."""
        label, value, share, covered = self._cover_codes(i, col)
        value = np.asarray(values.get_indexer(covered), dtype=np.int64)[value]
        keep = (value >= 0) & (label >= 0)
        label, value, share = label[keep], value[keep], share[keep]
        degree = np.bincount(label, minlength=len(self._labels(i, col)[1])).astype(np.int64)
        starts = np.cumsum(degree) - degree
        return starts, degree, value, share

    def query(self, q: CountQuery) -> float | None:
        i = self.pick(q.columns)
        if i is None:
            return None
        s = self.sources[i]
        factor = np.ones(len(s.labels), dtype=np.float64)
        for col, values in q.where:
            cover = self.cover(i, col)
            labels = s.labels[col]
            if cover is None:
                factor *= labels.isin(list(values)).to_numpy(dtype=np.float64)
                continue
            hit = cover["weight"].where(cover["value"].isin(list(values)), 0.0)
            share = hit.groupby(cover["label"], sort=False).sum()
            factor *= labels.map(share).fillna(0.0).to_numpy(dtype=np.float64)
        return float((factor * s.counts).sum())


def _regroup(key: IntArray, weight: FloatArray) -> tuple[IntArray, FloatArray]:
    """The distinct keys (sorted) with their weights summed."""
    distinct, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse.ravel(), weights=weight, minlength=len(distinct))
    return distinct, np.asarray(summed, dtype=np.float64)


def answer_marginal(
    source: Source, columns: Marginal, covers: Mapping[str, pd.DataFrame | None]
) -> pd.Series:
    """Estimated counts per value combination of ``columns`` (index: the columns).

    Groups the published counts by the label combination, then spreads each column in
    turn through its cover (a sparse product, done as merge + groupby).
    """
    cols = list(columns)
    frame = source.labels[cols].assign(**{_N: source.counts})
    g = frame.groupby(cols, sort=False)[_N].sum().reset_index()
    for col in cols:
        cover = covers.get(col)
        if cover is None:
            continue
        g = g.merge(cover.rename(columns={"label": col}), on=col, how="inner")
        g[_N] = g[_N].to_numpy() * g["weight"].to_numpy()
        g = g.drop(columns=[col, "weight"]).rename(columns={"value": col})
        g = g.groupby(cols, sort=False)[_N].sum().reset_index()
    return g.set_index(cols)[_N]


# --------------------------------------------------------------------------- scores


def score(
    true: npt.ArrayLike,
    estimate: npt.ArrayLike,
    floor: float,
    within: float = 0.10,
    min_queries: int = 1,
) -> dict[str, Any]:
    """Error metrics of estimated against true counts (aggregates only).

    Over fewer than ``min_queries`` queries the metrics are withheld (None, with
    ``"withheld": true``): next to the published answers they would reveal true counts.
    """
    t = np.asarray(true, dtype=np.float64)
    e = np.asarray(estimate, dtype=np.float64)
    n = int(t.shape[0])
    if n == 0 or n < min_queries:
        return {
            "queries": n,
            **({"withheld": True} if n else {}),
            "mean_absolute_error": None,
            "mean_relative_error": None,
            "max_absolute_error": None,
            "within_10pct": None,
        }
    err = np.abs(e - t)
    rel = err / np.maximum(t, floor)
    return {
        "queries": n,
        "mean_absolute_error": float(err.mean()),
        "mean_relative_error": float(rel.mean()),
        "max_absolute_error": float(err.max()),
        "within_10pct": float((rel <= within + 1e-12).mean()),
    }


def answerer_of(
    release: Release,
    truth: Truth,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    options: UtilityOptions | None = None,
) -> _Answerer:
    """What answers the workload's marginals from ``release`` (its covers kept)."""
    o = options or UtilityOptions()
    if o.domain not in ("data", "hierarchy"):
        raise ValueError(f"domain must be 'data' or 'hierarchy', got {o.domain!r}")
    sources, method = release_sources(release)
    return _Answerer(sources, truth, hierarchies or {}, o.domain == "data", method)


def release_estimates(
    release: Release,
    truth: Truth,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    options: UtilityOptions | None = None,
) -> dict[Marginal, pd.Series | None]:
    """Per marginal of the workload: the release's estimated counts (None: not answerable).

    For tests and notebooks only: estimates are indexed by raw value combinations, so they
    must never go into a report.
    """
    answerer = answerer_of(release, truth, hierarchies, options)
    return {m: answerer.marginal(m) for m in truth.workload.marginals}


def release_utility(
    release: Release,
    truth: Truth,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    options: UtilityOptions | None = None,
    *,
    raw: pd.DataFrame | None = None,
    bounded: Mapping[str, pd.DataFrame] | None = None,
    answerer: _Answerer | None = None,
) -> dict[str, Any]:
    """The utility entry of one release in audit.json (see the module docstring).

    ``raw`` (the true rows) and ``bounded`` (the DP job's exact bounded cells per query,
    :func:`pipelines.dp_release.bounded_truth`) score a DP release on its own estimand;
    without ``raw`` there is no ``own`` entry, without ``bounded`` no bias/noise split.
    ``answerer``: :func:`answerer_of` this release, truth and options, when the caller
    keeps it for more answers (its covers are then worked out once)."""
    o = options or UtilityOptions()
    floor = relative_floor(truth.rows, o)
    if answerer is None:
        answerer = answerer_of(release, truth, hierarchies, o)
    method = answerer.method
    trues: list[FloatArray] = []
    ests: list[FloatArray] = []
    ways: dict[int, tuple[list[FloatArray], list[FloatArray]]] = {}
    per_marginal: list[dict[str, Any]] = []
    not_answerable: list[list[str]] = []
    skipped_cells = 0
    missed: list[FloatArray] = []
    items: list[float] = []  # the common error of each marginal (full misses included)

    def item_error(tv: FloatArray, ev: FloatArray) -> None:
        if tv.shape[0]:
            items.append(float((np.abs(ev - tv) / np.maximum(tv, floor)).mean()))

    for m in truth.workload.marginals:
        true = truth.marginals[m]
        ev = answerer.estimate(m, true.index)
        if ev is None:
            not_answerable.append(list(m))
            skipped_cells += int(true.shape[0])
            missed.append(true.to_numpy(dtype=np.float64))
            item_error(missed[-1], np.zeros_like(missed[-1]))
            continue
        tv = true.to_numpy(dtype=np.float64)
        item_error(tv, ev)
        trues.append(tv)
        ests.append(ev)
        bucket = ways.setdefault(len(m), ([], []))
        bucket[0].append(tv)
        bucket[1].append(ev)
        s = score(tv, ev, floor, o.within, o.min_queries)
        per_marginal.append({"columns": list(m), **s})
    out: dict[str, Any] = {"method": method}
    out.update(score(_cat(trues), _cat(ests), floor, o.within, o.min_queries))
    out["marginals_answered"] = len(per_marginal)
    out["marginals_not_answerable"] = len(not_answerable)
    out["queries_not_answerable"] = skipped_cells
    out["not_answerable"] = not_answerable
    out["by_way"] = {
        str(w): score(_cat(a), _cat(b), floor, o.within, o.min_queries)
        for w, (a, b) in sorted(ways.items())
    }
    out["per_marginal"] = per_marginal
    if truth.workload.queries:
        qt: list[float] = []
        qe: list[float] = []
        missing = 0
        unanswered: list[float] = []
        for q in truth.workload.queries:
            e = answerer.query(q)
            if e is None:
                missing += 1
                unanswered.append(float(truth.queries[q.name]))
                continue
            qt.append(float(truth.queries[q.name]))
            qe.append(e)
        # aggregated: one query's error next to its public estimate would reveal its truth
        out["custom"] = {
            **score(qt, qe, floor, o.within, o.min_queries),
            "not_answerable": missing,
        }
        queries = len(truth.workload.queries)
        common_true = np.concatenate([np.asarray(qt, dtype=np.float64), unanswered])
        common_est = np.concatenate([np.asarray(qe, dtype=np.float64), np.zeros(missing)])
        items = []
        for t, e in zip(common_true, common_est, strict=True):  # each query is one item
            item_error(np.array([t]), np.array([e]))
        workload = f"the config's report.queries ({queries} declared count queries)"
        answered = queries - missing
    else:
        common_true = _cat([*trues, *missed])
        common_est = _cat([*ests, *[np.zeros_like(t) for t in missed]])
        arity = "/".join(str(w) for w in truth.workload.ways())
        cells = int(common_true.shape[0])
        workload = (
            "the declared workload (report.marginals): every cell of "
            + ", ".join(f"({' × '.join(m)})" for m in truth.workload.marginals)
            + f" ({cells} count queries)"
            if truth.workload.declared
            else f"the default workload: every cell of the {arity}-way marginals over "
            f"{', '.join(truth.workload.columns)} ({cells} count queries)"
        )
        answered = int(common_true.shape[0]) - skipped_cells
    out["common"] = {
        "error": float(np.mean(items)) if items else None,
        "items": len(items),
        "queries": int(common_true.shape[0]),
        "answered": answered,
        "workload": workload,
        "rule": COMMON_RULE,
    }
    own = own_utility(release, raw, hierarchies or {}, bounded, floor, o) if raw is not None else {}
    if "own" not in own:
        own["own"] = {
            "estimand": "the workload's count queries",
            "truth": "raw",
            **{k: out.get(k) for k in ("queries", "mean_relative_error", "within_10pct")},
        }
    out.update(own)
    out["unresolved_labels"] = answerer.unresolved
    out["relative_floor"] = floor
    return out


_ESTIMAND: Final = {
    "dp_mean": "mean",
    "dp_sum": "sum",
    "dp_variance": "variance",
    "dp_stddev": "stddev",
    "dp_median": "median",
}


def _estimands(release: Release) -> list[tuple[str, Callable[[Any], Any]]]:
    """The published columns a DP release estimates and how each is computed from the raw
    values of a cell (a pandas GroupBy): population variance/stddev, the lower quantile."""
    if release.kind == "dp_quantile":
        qs = [float(q) for q in release.parameters.get("quantiles") or []]
        return [(f"q{q:g}", _lower_quantile(q)) for q in qs]
    column = _ESTIMAND.get(release.kind, "count")
    how: dict[str, Callable[[Any], Any]] = {
        "mean": lambda g: g.mean(),
        "sum": lambda g: g.sum(),
        "variance": lambda g: g.var(ddof=0),
        "stddev": lambda g: g.std(ddof=0),
        "median": _lower_quantile(0.5),
        "count": lambda g: g.size(),
    }
    return [(column, how[column])]


def _lower_quantile(q: float) -> Callable[[Any], Any]:
    """The value at position ⌊q·(n − 1)⌋ of the cell's sorted values (pandas' ``lower``);
    the bounded truth takes the grid point at position ⌈q·n⌉ − 1, at most one apart."""
    return lambda g: g.quantile(q, interpolation="lower")


def _at_level(values: Any, hierarchy: Hierarchy | None, level: int) -> ObjArray:
    """Raw values as labels at ``level`` of their hierarchy (None where unknown)."""
    canon = canonical_column(values)
    if not level or hierarchy is None:
        return canon
    codes = hierarchy.encode(canon)
    out = np.full(len(canon), None, dtype=object)
    ok = codes >= 0
    out[ok] = hierarchy.generalize(codes[ok], level)
    return out


def _relative(
    true: FloatArray, estimate: FloatArray, within: float, width: float | None = None
) -> dict[str, Any]:
    """Error metrics of estimated against true means/sums: relative to |true|, or to
    ``width`` (quantiles: the bounds' width, as a quantile of 0 is common)."""
    keep = ~np.isnan(true) & ~np.isnan(estimate)
    t, e = true[keep], estimate[keep]
    if not t.size:
        return score([], [], 1.0)
    err = np.abs(e - t)
    rel = err / (np.maximum(np.abs(t), 1e-12) if width is None else max(width, 1e-12))
    return {
        "queries": int(t.size),
        "mean_absolute_error": float(err.mean()),
        "mean_relative_error": float(rel.mean()),
        "max_absolute_error": float(err.max()),
        "within_10pct": float((rel <= within + 1e-12).mean()),
    }


def own_utility(
    release: Release,
    raw: pd.DataFrame,
    hierarchies: Mapping[str, Hierarchy],
    bounded: Mapping[str, pd.DataFrame] | None,
    floor: float,
    options: UtilityOptions | None = None,
) -> dict[str, Any]:
    """A DP release scored on its own estimand (module docstring): ``own``, ``bias``
    (bounded truth against raw truth) and ``noise`` (published against bounded truth);
    ``{}`` for other kinds (their own estimand is the workload)."""
    if not release.kind.startswith("dp_") or release.kind == "dp_top_k":
        return {}
    o = options or UtilityOptions()
    estimands = _estimands(release)
    column = estimands[0][0]
    value = release.parameters.get("value")
    counts = column == "count"
    distinct = release.kind == "dp_count_distinct"
    unit = release.parameters.get("privacy_unit")
    bounds = release.parameters.get("bounds") or [0.0, 0.0]
    quantiles = release.kind in ("dp_quantile", "dp_median")
    width = float(bounds[1]) - float(bounds[0]) if quantiles else None
    has_raw = (counts and (not distinct or not unit or str(unit) in raw.columns)) or (
        value is not None and str(value) in raw.columns
    )
    est_parts: list[FloatArray] = []
    raw_parts: list[FloatArray] = []
    bnd_parts: list[FloatArray] = []
    complete = bool(bounded)
    for (qname, part, keys, levels), (column, how) in itertools.product(
        _dp_parts(release), estimands
    ):
        if column not in part.columns or any(k not in raw.columns for k in keys):
            continue
        key = keys or ["__all"]
        labels = canonical_frame(part, keys) if keys else pd.DataFrame({"__all": [""] * len(part)})
        index = pd.MultiIndex.from_frame(labels)
        est_parts.append(_numbers(part[column]))
        mapped = pd.DataFrame(  # object labels, not converted to Arrow strings per row
            {
                k: pd.Series(_at_level(raw[k], hierarchies.get(k), levels.get(k, 0)), dtype=object)
                for k in keys
            }
            if keys
            else {"__all": [""] * len(raw)}
        )
        weights = raw[WEIGHT].to_numpy(dtype=np.float64) if WEIGHT in raw.columns else None
        if counts and distinct and unit and weights is None:  # distinct persons per cell
            persons = pd.Series(raw[str(unit)].to_numpy())
            true = persons.groupby([mapped[k] for k in key], sort=False).nunique()
            true = true.astype(np.float64)
        elif counts and weights is not None:  # a frequency table: its weights are the counts
            true = pd.Series(weights).groupby([mapped[k] for k in key], sort=False).sum()
        elif counts:
            true = mapped.groupby(key, sort=False).size().astype(np.float64)
        elif has_raw:
            numbers = pd.to_numeric(raw[str(value)], errors="coerce")
            by = [mapped[k] for k in key]
            if weights is None:
                true = how(numbers.groupby(by, sort=False))
            elif column in ("mean", "sum"):  # each distinct row counts its weight
                w = pd.Series(np.where(numbers.notna().to_numpy(), weights, 0.0))
                summed = (pd.Series(numbers.fillna(0.0).to_numpy()) * w).groupby(by).sum()
                true = summed / w.groupby(by).sum() if column == "mean" else summed
            else:  # a frequency table: the rows repeated by their weights
                repeat = np.round(weights).astype(np.int64)
                rows = numbers.repeat(repeat).reset_index(drop=True)
                true = how(rows.groupby([np.repeat(b.to_numpy(), repeat) for b in by]))
        else:
            true = pd.Series(dtype=np.float64)
        true.index = pd.MultiIndex.from_frame(true.index.to_frame(index=False))
        fill = 0.0 if counts else np.nan
        raw_parts.append(true.reindex(index, fill_value=fill).to_numpy(dtype=np.float64))
        frame = (bounded or {}).get(qname)
        if frame is None or column not in frame.columns:
            complete = False
            continue
        b = frame.assign(__all="").set_index(key)[column].astype(np.float64)
        b.index = pd.MultiIndex.from_frame(b.index.to_frame(index=False))
        bnd_parts.append(b.reindex(index, fill_value=fill).to_numpy(dtype=np.float64))
    if not est_parts:
        return {}
    est, rawt = _cat(est_parts), _cat(raw_parts)
    bnd = _cat(bnd_parts) if complete else None

    def scored(true: FloatArray, estimate: FloatArray) -> dict[str, Any]:
        if counts:
            return score(true, estimate, floor, o.within, o.min_queries)
        return _relative(true, estimate, o.within, width)

    what = {"count": "counts", "mean": "means", "sum": "sums"}.get(column, "statistics")
    if distinct:
        what = "distinct persons"
    if quantiles:
        what = "quantiles (error relative to the bounds' width)"
    truth_name = "raw" if has_raw else "bounded (the raw values are not in the audit's rows)"
    if not has_raw and bnd is None:
        own: dict[str, Any] = {"estimand": f"its published {what}", "truth": None,
                               **scored(np.zeros(0), np.zeros(0))}  # fmt: skip
    else:
        own = {
            "estimand": f"its published {what}",
            "truth": truth_name,
            **scored(rawt if has_raw else bnd, est),  # type: ignore[arg-type]
        }
    note = None if bnd is not None else "no bounded truth (the run's work folder is gone)"
    return {
        "own": own,
        "bias": scored(rawt, bnd) if bnd is not None and has_raw else None,
        "noise": scored(bnd, est) if bnd is not None else None,
        "split": "bias = the exact person-bounded values of the run (contribution bounding "
        "and clamping, before noise) against the raw truth: it is bounding, not noise; "
        "noise = the published values against the bounded ones"
        if note is None
        else note,
    }


def _cat(parts: Sequence[FloatArray]) -> FloatArray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)
