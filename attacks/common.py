"""The common attacker: one attack, applied the same way to every release and the raw table.

Kind-specific attacks (homogeneity, noisy-cell inference, report guessing) measure
different things, so their rates cannot be compared across methods. This attacker is the
same everywhere; only the *posterior model* (how a published artefact turns into a
distribution over the sensitive attribute) depends on the kind of release:

- knowledge: the target's known quasi-identifiers (``AttackerKnowledge.known_qis``) and
  b wrong sensitive values ruled out (``background``/``background_mode``; "worst": the
  b wrong values most likely under the attacker's posterior, "random": b true negatives);
- guess: the MAP value of the posterior over the sensitive domain, after elimination;
  a target whose artefact says nothing (no matching cell/class/report) gets the prior;
- scoring: correct only when the guess equals the true value.

Baselines: the *public prior* (the sensitive attribute's distribution over the input,
the best population-level knowledge) with the same MAP rule, and, when control records
are given (same population, not in the input), the same attack on them (anonymeter,
Giomi et al. 2023): risk = (acc − ctrl)/(1 − ctrl). Bound for (ε, δ)-DP artefacts: the
likelihood ratio of any output between two values of one record is at most e^ε', so
posterior odds ≤ e^ε' · prior odds and the MAP accuracy is at most
E[e^ε'π*/(e^ε'π* + 1 − π*)] + δ', π* the largest prior share among the values left.

Membership, common form: each record (members: the targets; controls: the control
records) gets a score, the published evidence that a record with its known QIs and
sensitive value is in the data (matching published rows, the noisy count of its cell,
the estimate of its value); the attacker says "member" when the score reaches a
threshold chosen on one half of the records and is measured on the other half
(TPR − FPR, Newcombe's interval). DP bound: (e^ε − 1 + 2δ)/(e^ε + 1).

Posterior models work on batches (one matrix of targets × sensitive values), never per
target. Simulated local-DP reports use a seeded source: a simulation of the attacker's
view, not a release. Pure core: numpy, pandas, scipy and the standard library (no Beam).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy, canonical_column, canonical_factorize
from privpipe.attacks.frames import FrameMemo
from privpipe.attacks.knowledge import AttackerKnowledge
from privpipe.attacks.matching import WEIGHT, TargetView, match_targets, unique_rows
from privpipe.attacks.stats import wilson_interval
from privpipe.attacks.table import random_elimination, worst_elimination

__all__ = [
    "NO_CONTROL",
    "CellModel",
    "LocalReportModel",
    "PosteriorModel",
    "PriorModel",
    "RawRowsModel",
    "TableModel",
    "accuracy_bound",
    "advantage_over",
    "attribute_inference",
    "common_attack",
    "eliminate",
    "forget_views",
    "map_guess",
    "matched_view",
    "membership",
    "membership_bound",
    "public_prior",
    "risk_interval",
]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
ObjArray: TypeAlias = npt.NDArray[np.object_]

NO_CONTROL: Final = "no control set (attacks.control)"
PRIOR_ONLY: Final = "public prior only (no sensitive cells)"


# --------------------------------------------------------------------------- models


class PosteriorModel(Protocol):
    """How one published artefact turns into evidence about a batch of records."""

    @property
    def method(self) -> str:
        """How the posterior is formed (audit.json ``method``)."""
        ...

    @property
    def membership_method(self) -> str:
        """What the membership score reads."""
        ...

    def weights(
        self, records: pd.DataFrame, domain: ObjArray, prior: FloatArray, *, members: bool
    ) -> tuple[FloatArray, ObjArray]:
        """(records × labels) non-negative posterior weights and the labels (canonical
        sensitive values) of its columns; a row of zeros means the artefact says nothing
        about that record (the attacker falls back on the prior). ``domain``/``prior``:
        the public sensitive domain and prior, for models that need them."""
        ...

    def scores(self, records: pd.DataFrame, *, members: bool) -> FloatArray:
        """Membership evidence per record (higher: more likely in the data)."""
        ...


def _tuple_ids(
    left: pd.DataFrame, right: pd.DataFrame, columns: Sequence[str]
) -> tuple[IntArray, IntArray, int]:
    """Dense ids of value tuples (canonical strings) over the rows of two frames."""
    n_left, n_right = len(left), len(right)
    if not columns:
        return np.zeros(n_left, np.int64), np.zeros(n_right, np.int64), 1
    cols = []
    for c in columns:
        values = np.concatenate(
            [canonical_column(left[c]),
             canonical_column(right[c])]
        )  # fmt: skip
        cols.append(pd.factorize(pd.Series(values, dtype=object))[0].astype(np.int64))
    uniq, ids = unique_rows(np.stack(cols, axis=1))
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return ids[:n_left], ids[n_left:], int(uniq.shape[0])


def _sorted_distinct(strings: ObjArray) -> ObjArray:
    """``np.unique`` of an array of strings: distinct by hashing, then only the distinct
    values sorted (``np.unique`` sorts every element with Python comparisons: ~3 s for the
    sensitive column of a 10M run's table)."""
    distinct = np.asarray(pd.unique(np.asarray(strings, dtype=object)), dtype=object)
    return np.sort(distinct).astype(object)


def _codes(values: ObjArray, labels: ObjArray) -> IntArray:
    """Position of each canonical value among ``labels`` (-1 when absent)."""
    return np.asarray(pd.Index(labels, dtype=object).get_indexer(values), dtype=np.int64)


@dataclass(frozen=True)
class PriorModel:
    """An artefact without sensitive-value cells: the posterior is the public prior."""

    method: str = PRIOR_ONLY
    membership_method: str = "no per-record evidence (constant score)"

    def weights(
        self, records: pd.DataFrame, domain: ObjArray, prior: FloatArray, *, members: bool
    ) -> tuple[FloatArray, ObjArray]:
        return np.zeros((len(records), domain.shape[0]), dtype=np.float64), domain

    def scores(self, records: pd.DataFrame, *, members: bool) -> FloatArray:
        return np.zeros(len(records), dtype=np.float64)


def _canonical_codes(values: Any) -> tuple[IntArray, ObjArray]:
    """Codes of a column's canonical strings into their distinct values (missing is ``""``,
    as ``canonical_column`` makes it, one value with a real ``""``)."""
    codes, uniques = canonical_factorize(values)
    table = np.append(uniques, "").astype(object)
    merged, distinct = pd.factorize(table)  # a real "" and missing: one value
    return np.asarray(merged, np.int64)[codes], np.asarray(distinct, dtype=object)


@dataclass(frozen=True)
class _RawSide:
    """The raw table as codes: each row's tuple of known QIs (``row_tuple``, dense ids in
    the tuples' lexicographic code order, ``tuples`` their code rows) and sensitive value
    (``sa``, the position among ``labels``, its sorted canonical strings)."""

    known: tuple[str, ...]
    values: tuple[pd.Index, ...]  # per known QI, its distinct canonical strings by code
    tuples: IntArray
    row_tuple: IntArray
    sa: IntArray
    labels: ObjArray
    weights: FloatArray | None

    @property
    def n_tuples(self) -> int:
        return int(self.tuples.shape[0])

    @staticmethod
    def of(raw: pd.DataFrame, known: Sequence[str], sa: str) -> _RawSide:
        n = len(raw)
        coded = [_canonical_codes(raw[c]) for c in known]
        if coded:
            matrix = np.stack([codes for codes, _ in coded], axis=1)
            tuples, row_tuple = unique_rows(matrix)
            row_tuple = np.asarray(row_tuple, dtype=np.int64).reshape(-1)
        else:  # nothing known: one tuple, every row
            tuples, row_tuple = np.zeros((1 if n else 0, 0), np.int64), np.zeros(n, np.int64)
        sa_codes, sa_values = _canonical_codes(raw[sa])
        present = np.zeros(sa_values.shape[0], dtype=bool)
        present[sa_codes] = True
        labels = _sorted_distinct(sa_values[present])
        position = _codes(sa_values, labels)
        weights = raw[WEIGHT].to_numpy(dtype=np.float64) if WEIGHT in raw.columns else None
        return _RawSide(
            tuple(known),
            tuple(pd.Index(v, dtype=object) for _, v in coded),
            np.asarray(tuples, dtype=np.int64),
            row_tuple,
            position[sa_codes],
            labels,
            weights,
        )

    def tuple_ids(self, records: pd.DataFrame) -> IntArray:
        """Each record's raw tuple (of its known QIs' canonical strings), -1 when no raw
        row has it."""
        n = len(records)
        if not self.values:
            return np.zeros(n, np.int64) if self.n_tuples else np.full(n, -1, np.int64)
        codes = np.stack(
            [v.get_indexer(canonical_column(records[c]))
             for v, c in zip(self.values, self.known, strict=True)],
            axis=1,
        )  # fmt: skip
        found = np.full(n, -1, dtype=np.int64)
        whole = (codes >= 0).all(axis=1)
        if self.n_tuples and whole.any():
            both = np.concatenate([self.tuples, codes[whole]])
            _, ids = unique_rows(both)
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            # the raw tuples are distinct and sorted: their ids are 0..n_tuples-1 in order
            # unless a record's tuple falls between them, so look the ids up, not assume
            first = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
            first[ids[: self.n_tuples]] = np.arange(self.n_tuples)
            found[whole] = first[ids[self.n_tuples :]]
        return found


@dataclass(frozen=True)
class RawRowsModel:
    """The raw table (no protection): the rows with the record's exact known QIs.

    ``raw`` may be a frequency table (column ``attacks.matching.WEIGHT``: how many rows
    each distinct row stands for); the counts are those of the rows."""

    raw: pd.DataFrame
    known: tuple[str, ...]
    sa: str
    method: str = "exact rows"
    membership_method: str = "rows with the record's exact known QIs and sensitive value"
    # per batch of records (kept with it): its counts, read by weights and by scores
    _seen: dict[int, tuple[pd.DataFrame, tuple[FloatArray, ObjArray]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def _counts(self, records: pd.DataFrame) -> tuple[FloatArray, ObjArray]:
        hit = self._seen.get(id(records))
        if hit is None or hit[0] is not records:
            hit = (records, self._count(records))
            self._seen[id(records)] = hit
        table, labels = hit[1]
        return table.copy(), labels  # a copy: a caller may rule values out in place

    def _count(self, records: pd.DataFrame) -> tuple[FloatArray, ObjArray]:
        side = self._raw_side
        t_ids = side.tuple_ids(records)  # -1: a tuple no raw row has
        targets, local = np.unique(t_ids, return_inverse=True)
        # the last slot stands for -1 (a tuple no raw row has): no row counts into it
        slot = np.full(side.n_tuples + 1, -1, dtype=np.int64)
        slot[targets] = np.arange(targets.shape[0])
        row_slot = slot[side.row_tuple]
        keep = row_slot >= 0
        m = side.labels.shape[0]
        flat = np.bincount(
            row_slot[keep] * m + side.sa[keep],
            weights=None if side.weights is None else side.weights[keep],
            minlength=targets.shape[0] * m,
        ).astype(np.float64)
        table = flat.reshape(targets.shape[0], m)
        return table[np.asarray(local, np.int64).reshape(-1)], side.labels.astype(object)

    @functools.cached_property
    def _raw_side(self) -> _RawSide:
        """The raw table coded once (its tuples of known QIs, its sensitive values), for
        every batch of records matched against it (members, controls)."""
        return _RawSide.of(self.raw, self.known, self.sa)

    def weights(
        self, records: pd.DataFrame, domain: ObjArray, prior: FloatArray, *, members: bool
    ) -> tuple[FloatArray, ObjArray]:
        return self._counts(records)

    def scores(self, records: pd.DataFrame, *, members: bool) -> FloatArray:
        w, labels = self._counts(records)
        return _at_truth(w, labels, records[self.sa])


def _at_truth(w: FloatArray, labels: ObjArray, truth: Any) -> FloatArray:
    """w[i, the record's own value] (0 when the value is not a column)."""
    codes = _codes(canonical_column(np.asarray(truth, dtype=object)), labels)
    out = np.zeros(w.shape[0], dtype=np.float64)
    ok = codes >= 0
    out[ok] = w[np.flatnonzero(ok), codes[ok]]
    return out


_VIEWS: dict[bytes, TargetView] = {}
_VIEWS_KEPT: Final = 16


_PRINTS: FrameMemo[bytes] = FrameMemo()


def _fingerprint(frame: pd.DataFrame) -> bytes:
    """A content hash of a frame (values and column names, not its index), hashed once per
    frame object (``attacks.frames.FrameMemo``): the attacks match the same published
    table many times (every target set, members and controls), and hashing a 10M run's
    tables took ~4.6 s of its audit."""
    kept = _PRINTS.get(frame)
    if kept is not None:
        return kept
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr(list(frame.columns)).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    _PRINTS.put(frame, digest.digest())
    return digest.digest()


def _hierarchy_key(name: str, hierarchy: Hierarchy) -> bytes:
    table = np.asarray(hierarchy.table, dtype=object).ravel().astype(str)
    aliases = repr(sorted(hierarchy.aliases.items())).encode()
    hashed = np.asarray(pd.util.hash_array(table), dtype=np.uint64)
    return name.encode() + hashed.tobytes() + aliases


def forget_views() -> None:
    """Drop the remembered matches (end of a run's attacks)."""
    _VIEWS.clear()


def matched_view(
    published: pd.DataFrame,
    targets: pd.DataFrame,
    qis: Sequence[str],
    sa: str,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    *,
    known: Sequence[str] | None = None,
    target_rows: IntArray | None = None,
    levels: Mapping[str, int] | None = None,
) -> TargetView:
    """``attacks.matching.match_targets``, remembered for the last few calls (keyed by
    content): the kind-specific table attacks and the common attacker match the same
    targets to the same table once per run."""
    h = hierarchies or {}
    key = hashlib.blake2b(
        b"".join([
            _fingerprint(published), _fingerprint(targets),
            repr((
                tuple(qis), sa, None if known is None else tuple(known),
                None if levels is None else sorted(levels.items()),
            )).encode(),
            *(_hierarchy_key(q, x) for q, x in sorted(h.items())),
            b"" if target_rows is None else np.asarray(target_rows, np.int64).tobytes(),
        ]),
        digest_size=16,
    ).digest()  # fmt: skip
    view = _VIEWS.get(key)
    if view is None:
        view = match_targets(
            published, targets, qis, sa, h, known=known, target_rows=target_rows, levels=levels
        )
        if len(_VIEWS) >= _VIEWS_KEPT:
            _VIEWS.pop(next(iter(_VIEWS)))
        _VIEWS[key] = view
    return view


@dataclass(frozen=True)
class TableModel:
    """An anonymised table: the sensitive counts of the classes covering the record's known
    QIs (``attacks.matching.match_targets``); records of the suppressed block get the
    block's counts."""

    published: pd.DataFrame
    qis: tuple[str, ...]
    sa: str
    hierarchies: Mapping[str, Hierarchy]
    known: tuple[str, ...]
    levels: Mapping[str, int] | None = None  # a full-domain table's published levels
    method: str = "class posterior"
    membership_method: str = "published rows with the record's sensitive value in its classes"

    def weights(
        self, records: pd.DataFrame, domain: ObjArray, prior: FloatArray, *, members: bool
    ) -> tuple[FloatArray, ObjArray]:
        view = matched_view(
            self.published, records, self.qis, self.sa, self.hierarchies, known=self.known,
            target_rows=records.index.to_numpy(dtype=np.int64), levels=self.levels,
        )  # fmt: skip
        w = view.counts[view.target_tuple].astype(np.float64)
        return w, view.sa_values

    def scores(self, records: pd.DataFrame, *, members: bool) -> FloatArray:
        w, labels = self.weights(records, np.empty(0, object), np.empty(0), members=members)
        return _at_truth(w, labels, records[self.sa])


def _at_level(values: Any, hierarchy: Hierarchy | None, level: int) -> ObjArray:
    """Canonical values mapped to their label at ``level`` (values outside the hierarchy
    keep an impossible label, so they match no cell)."""
    raw = canonical_column(np.asarray(values, dtype=object))
    if not level or hierarchy is None:
        return raw
    codes = hierarchy.encode(raw)
    out = np.full(raw.shape[0], "\x00unknown", dtype=object)
    ok = codes >= 0
    out[ok] = hierarchy.generalize(codes[ok], level)
    return out


@dataclass(frozen=True)
class CellModel:
    """Noisy counts (DP histograms/counts, continual counts) keyed by ``keys``.

    Key columns the attacker knows (its known QIs, mapped to the key's level with the
    hierarchy) select the record's cell; other key columns are summed out. With the
    sensitive attribute among the keys, the posterior is ∝ the clamped noisy cells over
    its values (at a coarser level: each category's mass shared by the prior within it);
    without it, the artefact has no sensitive cells and the posterior is the prior.
    Membership score: the noisy count of the record's cell.
    """

    cells: pd.DataFrame
    keys: tuple[str, ...]
    levels: Mapping[str, int]
    known: tuple[str, ...]
    sa: str
    hierarchies: Mapping[str, Hierarchy]
    count: str = "count"
    membership_method: str = "noisy count of the record's cell"

    @property
    def method(self) -> str:
        return "noisy cells" if self.sa in self.keys else PRIOR_ONLY

    def _selectors(self) -> list[str]:
        return [k for k in self.keys if k in self.known and k != self.sa]

    def _table(self, records: pd.DataFrame) -> tuple[FloatArray, ObjArray, IntArray]:
        """(record × SA-label) clamped noisy counts, the SA labels (one ``""`` column
        when the sensitive attribute is not a key)."""
        sel = self._selectors()
        mapped = pd.DataFrame(
            {k: _at_level(records[k], self.hierarchies.get(k), int(self.levels.get(k, 0)))
             for k in sel},
            index=range(len(records)),
        )  # fmt: skip
        cells = self.cells
        c_ids, t_ids, n = _tuple_ids(cells, mapped, sel)
        noisy = np.clip(pd.to_numeric(cells[self.count]).to_numpy(dtype=np.float64), 0.0, None)
        if self.sa in self.keys:
            sa_vals = canonical_column(cells[self.sa])
            labels = np.unique(sa_vals).astype(object)
            sa = _codes(sa_vals, labels)
        else:
            labels = np.array([""], dtype=object)
            sa = np.zeros(len(cells), dtype=np.int64)
        m = labels.shape[0]
        table = np.bincount(c_ids * m + sa, weights=noisy, minlength=n * m).reshape(n, m)
        return np.asarray(table[t_ids], dtype=np.float64), labels, t_ids

    def weights(
        self, records: pd.DataFrame, domain: ObjArray, prior: FloatArray, *, members: bool
    ) -> tuple[FloatArray, ObjArray]:
        if self.sa not in self.keys:
            return np.zeros((len(records), domain.shape[0])), domain
        table, labels, _ = self._table(records)
        level = int(self.levels.get(self.sa, 0))
        if not level:
            return table, labels
        # a category's noisy mass spread over its values by the prior within it
        category = _at_level(domain, self.hierarchies.get(self.sa), level)
        col = _codes(category, labels)
        ok = col >= 0
        mass = np.zeros(labels.shape[0])
        np.add.at(mass, col[ok], prior[ok])
        share = np.zeros(domain.shape[0])
        share[ok] = np.divide(prior[ok], mass[col[ok]], out=np.zeros(int(ok.sum())),
                              where=mass[col[ok]] > 0)  # fmt: skip
        w = np.zeros((len(records), domain.shape[0]))
        w[:, ok] = table[:, col[ok]] * share[ok][None, :]
        return w, domain

    def scores(self, records: pd.DataFrame, *, members: bool) -> FloatArray:
        table, labels, _ = self._table(records)
        if self.sa not in self.keys:
            return table[:, 0]
        level = int(self.levels.get(self.sa, 0))
        own = _at_level(records[self.sa], self.hierarchies.get(self.sa), level)
        return _at_truth(table, labels, own)


def _report_likelihood(reports: Any, oracle: Mapping[str, Any], d: int) -> FloatArray:
    """P(report | value) up to a per-report factor, (reports × d), per protocol."""
    from privpipe.dp.local import keyed_hash

    p, q = float(oracle["p"]), float(oracle["q"])
    n = int(reports.n)
    if reports.protocol in ("rr", "grr"):
        like = np.full((n, d), q)
        like[np.arange(n), np.asarray(reports.values, np.int64)] = p
        return like
    if reports.bits is not None:  # unary: each value's own bit, p vs q
        bits = reports.unpacked_bits().astype(bool)
        return np.where(bits, p / q, (1.0 - p) / (1.0 - q))
    values = np.arange(d, dtype=np.int64)  # local hashing: the bucket of each value
    hit = np.stack([keyed_hash(reports.keys, int(v), reports.g) == reports.values
                    for v in values], axis=1)  # fmt: skip
    return np.where(hit, p, q)


@dataclass(frozen=True)
class LocalReportModel:
    """Local DP: the target's own report, simulated with the release's protocol and ε
    (seeded: the attacker's view, not a release); posterior ∝ P(report | s)·prior(s).
    Control records sent no report (prior); values outside the public domain are reported
    as ``other`` when the release has one, else not at all (prior). Membership score: the
    published estimate of the record's value."""

    domain: tuple[str, ...]
    oracle: Mapping[str, Any]
    sa: str
    estimates: pd.DataFrame | None = None
    seed: int = 0
    other: str | None = None
    method: str = "own report"
    membership_method: str = "published estimate of the record's value"

    def weights(
        self, records: pd.DataFrame, domain: ObjArray, prior: FloatArray, *, members: bool
    ) -> tuple[FloatArray, ObjArray]:
        from privpipe.dp.local import perturb
        from privpipe.dp.secure_random import SeededRandom

        labels = np.asarray(self.domain, dtype=object)
        d = labels.shape[0]
        w = np.zeros((len(records), d))
        if not members:
            return w, labels
        codes = _codes(canonical_column(records[self.sa]), labels)
        if self.other is not None and self.other in self.domain:  # reported as ``other``
            codes[codes < 0] = self.domain.index(self.other)
        reported = np.flatnonzero(codes >= 0)  # values outside the public domain: no report
        if reported.size:
            source = SeededRandom(self.seed)
            eps = float(self.oracle["epsilon"])
            reports = perturb(str(self.oracle["protocol"]), codes[reported], eps, d, source)
            pri = prior[_codes(labels, domain)] if domain.size else np.ones(d)
            pri = np.where(_codes(labels, domain) >= 0, pri, 0.0)
            w[reported] = _report_likelihood(reports, self.oracle, d) * pri[None, :]
        return w, labels

    def scores(self, records: pd.DataFrame, *, members: bool) -> FloatArray:
        if self.estimates is None:
            return np.zeros(len(records))
        est = self.estimates
        labels = canonical_column(est["value"])
        values = pd.to_numeric(est["estimate"]).to_numpy(dtype=np.float64)
        codes = _codes(canonical_column(records[self.sa]), labels)
        return np.where(codes >= 0, values[np.maximum(codes, 0)], 0.0)


# --------------------------------------------------------------------------- the guess


def eliminate(
    posterior: FloatArray, truth: IntArray, knowledge: AttackerKnowledge, stream: int = 11
) -> BoolArray:
    """The b sensitive values each target rules out (never its true value): the b wrong
    values most likely under ``posterior`` ("worst") or b random true negatives."""
    b = knowledge.background
    n, m = posterior.shape
    if b == 0 or m == 0:
        return np.zeros((n, m), dtype=bool)
    if knowledge.background_mode == "worst":
        return worst_elimination(posterior, truth, b)
    return random_elimination(m, truth, b, knowledge.rng(stream), 0, n)


def map_guess(
    weights: FloatArray, prior: FloatArray, truth: IntArray, knowledge: AttackerKnowledge
) -> tuple[IntArray, BoolArray]:
    """MAP column per row after elimination (rows of zero weight use the prior), and the
    eliminated mask."""
    w = np.array(weights, dtype=np.float64, copy=True)
    empty = w.sum(axis=1) <= 0
    w[empty] = prior[None, :]
    total = w.sum(axis=1, keepdims=True)
    post = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    gone = eliminate(post, truth, knowledge)
    guess = np.argmax(np.where(gone, -1.0, post), axis=1).astype(np.int64)
    return guess, gone


def accuracy_bound(
    prior: FloatArray,
    eliminated: BoolArray,
    epsilon: float,
    delta: float = 0.0,
    knowledge: AttackerKnowledge | None = None,
) -> float:
    """Upper bound on the expected MAP accuracy when every output's likelihood ratio
    between two values of the target is at most e^ε (plus δ): f(π) = e^ε π/(e^ε π + 1 − π)
    bounds the posterior of any set of prior mass π.

    "worst" elimination (the b wrong values most likely under the posterior) is right
    exactly when the truth is among the posterior's top b+1 values, a set fixed by the
    output: f(mass of the b+1 largest prior shares). "random" elimination is independent
    of the output and uniform over the truth's complements, so it restricts the prior:
    per target f(π*), π* the largest prior share among the values left (``eliminated``).
    """
    if epsilon > 700:
        return 1.0
    e = math.exp(epsilon)
    b = knowledge.background if knowledge is not None else 0
    if knowledge is None or knowledge.background_mode == "worst" or b == 0:
        top = float(np.sort(prior)[::-1][: b + 1].sum())
        return float(min(1.0, e * top / (e * top + 1.0 - top) + delta))
    if eliminated.shape[0] == 0:
        return min(1.0, delta)
    left = np.where(eliminated, 0.0, prior[None, :])
    mass = left.sum(axis=1)
    share = np.divide(left.max(axis=1), mass, out=np.ones_like(mass), where=mass > 0)
    per = e * share / (e * share + 1.0 - share)
    return float(min(1.0, per.mean() + delta))


def membership_bound(epsilon: float, delta: float = 0.0) -> float:
    """Largest TPR − FPR of any membership test against (ε, δ)-DP: (e^ε − 1 + 2δ)/(e^ε + 1)."""
    if epsilon > 700:
        return 1.0
    e = math.exp(epsilon)
    return float(min(1.0, (e - 1.0 + 2.0 * delta) / (e + 1.0)))


def advantage_over(accuracy: float, baseline: float) -> float | None:
    """(accuracy − baseline)/(1 − baseline): the share of what the baseline gets wrong
    that the attack gets right (None when the baseline is always right)."""
    if baseline >= 1.0:
        return None
    return (accuracy - baseline) / (1.0 - baseline)


def risk_interval(
    hits: int, n: int, control_hits: int, n_control: int
) -> tuple[float, float] | None:
    """Interval of (a − c)/(1 − c) from the Wilson intervals of a and c, combined like
    Newcombe's (MOVER): each side's distance propagated with the partial derivatives."""
    if n == 0 or n_control == 0:
        return None
    a, c = hits / n, control_hits / n_control
    if c >= 1.0:
        return None
    a_lo, a_hi = wilson_interval(hits, n)
    c_lo, c_hi = wilson_interval(control_hits, n_control)
    risk = (a - c) / (1.0 - c)
    d_a = 1.0 / (1.0 - c)
    d_c = (1.0 - a) / (1.0 - c) ** 2  # the risk falls as the control rate rises
    low = risk - math.hypot((a - a_lo) * d_a, (c_hi - c) * d_c)
    high = risk + math.hypot((a_hi - a) * d_a, (c - c_lo) * d_c)
    return low, min(1.0, high)


@dataclass(frozen=True)
class _Scored:
    hits: int
    n: int
    prior_hits: int
    eliminated: BoolArray


def _attack(
    model: PosteriorModel,
    records: pd.DataFrame,
    sa: str,
    domain: ObjArray,
    prior: FloatArray,
    knowledge: AttackerKnowledge,
    members: bool,
) -> _Scored:
    n = len(records)
    truth_base = _codes(canonical_column(records[sa]), domain)
    w, labels = model.weights(records, domain, prior, members=members)
    extra = np.setdiff1d(labels.astype(str), domain.astype(str)).astype(object)
    full = np.concatenate([domain, extra]).astype(object)
    wide = np.zeros((n, full.shape[0]))
    col = _codes(labels, full)
    wide[:, col] = w
    prior_full = np.concatenate([prior, np.zeros(extra.shape[0])])
    guess, gone = map_guess(wide, prior_full, truth_base, knowledge)
    pri = np.zeros((n, domain.shape[0]))
    prior_guess, _ = map_guess(pri, prior, truth_base, knowledge)
    hits = int(((guess == truth_base) & (truth_base >= 0)).sum())
    prior_hits = int(((prior_guess == truth_base) & (truth_base >= 0)).sum())
    return _Scored(hits, n, prior_hits, gone[:, : domain.shape[0]])


def public_prior(raw_sa: Any, *others: Any, weights: Any = None) -> tuple[ObjArray, FloatArray]:
    """The sensitive domain (canonical values of the input and of ``others``, sorted) and
    the public prior over it: the value shares of the input ``raw_sa`` (``weights``: how
    many records each value stands for, a frequency table's; default one each)."""
    base = canonical_column(np.asarray(raw_sa, dtype=object))
    parts = [
        base,
        *(canonical_column(np.asarray(o, dtype=object)) for o in others if o is not None),
    ]
    domain = _sorted_distinct(np.concatenate(parts))
    if weights is None:
        counts = pd.Series(base).value_counts()
    else:
        counts = pd.Series(np.asarray(weights, dtype=np.float64)).groupby(base).sum()
    prior = counts.reindex(domain, fill_value=0).to_numpy(dtype=np.float64)
    prior = prior / prior.sum() if prior.sum() > 0 else prior
    return domain, prior


def attribute_inference(
    model: PosteriorModel,
    members: pd.DataFrame,
    raw_sa: Any,
    sa: str,
    knowledge: AttackerKnowledge,
    *,
    control: pd.DataFrame | None = None,
    epsilon: float | None = None,
    delta: float = 0.0,
    note: str | None = None,
    population: tuple[ObjArray, FloatArray] | None = None,
) -> dict[str, Any]:
    """The common attribute-inference attack on one artefact, as audit.json's
    ``common.attribute_inference`` (contract §2). ``members``: the targets (records of
    the input); ``raw_sa``: the input's sensitive column (the public prior); ``control``:
    records of the same population not in the input; ``epsilon``/``delta``: the
    likelihood-ratio guarantee of one record's sensitive value, if the artefact has one."""
    domain, prior = population or public_prior(
        raw_sa, members[sa], None if control is None else control[sa]
    )
    res = _attack(model, members, sa, domain, prior, knowledge, True)
    acc = res.hits / res.n if res.n else 0.0
    prior_acc = res.prior_hits / res.n if res.n else 0.0
    out: dict[str, Any] = {
        "accuracy": acc,
        "interval": list(wilson_interval(res.hits, res.n)),
        "targets": res.n,
        "prior_accuracy": prior_acc,
        "advantage_prior": advantage_over(acc, prior_acc),
        "control_accuracy": None,
        "control_interval": None,
        "control_targets": 0,
        "risk": None,
        "risk_interval": None,
        "bound": None
        if epsilon is None
        else accuracy_bound(prior, res.eliminated, epsilon, delta, knowledge),
        "method": model.method,
        "note": note,
    }
    if control is None:
        out["note"] = "; ".join(x for x in (note, NO_CONTROL) if x)
        return out
    ctl = _attack(model, control, sa, domain, prior, knowledge, False)
    c_acc = ctl.hits / ctl.n if ctl.n else None
    out["control_targets"] = ctl.n
    if c_acc is not None:
        out["control_accuracy"] = c_acc
        out["control_interval"] = list(wilson_interval(ctl.hits, ctl.n))
        out["risk"] = advantage_over(acc, c_acc)
        interval = risk_interval(res.hits, res.n, ctl.hits, ctl.n)
        out["risk_interval"] = list(interval) if interval else None
    return out


def _newcombe(tp: int, n1: int, fp: int, n0: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval for TPR − FPR from two Wilson intervals."""
    p1, p0 = tp / n1, fp / n0
    l1, u1 = wilson_interval(tp, n1)
    l0, u0 = wilson_interval(fp, n0)
    d = p1 - p0
    return d - math.hypot(p1 - l1, u0 - p0), d + math.hypot(u1 - p1, p0 - l0)


def _rates_at(scores: FloatArray, thresholds: FloatArray) -> FloatArray:
    """Share of ``scores`` >= each threshold (vectorised)."""
    ordered = np.sort(scores)
    below = np.searchsorted(ordered, thresholds, side="left")
    return cast(FloatArray, (scores.shape[0] - below) / max(scores.shape[0], 1))


def membership(
    model: PosteriorModel,
    members: pd.DataFrame,
    knowledge: AttackerKnowledge,
    *,
    control: pd.DataFrame | None = None,
    epsilon: float | None = None,
    delta: float = 0.0,
) -> dict[str, Any]:
    """The common membership test as audit.json's ``common.membership``: "member" when
    the record's score reaches a threshold chosen (max TPR − FPR) on one random half of
    members and controls, measured on the other half."""
    bound = None if epsilon is None else membership_bound(epsilon, delta)
    out: dict[str, Any] = {
        "advantage": None, "interval": None, "tpr": None, "fpr": None,
        "members": len(members), "controls": 0 if control is None else len(control),
        "bound": bound, "method": model.membership_method, "note": None,
    }  # fmt: skip
    if control is None or len(control) < 2 or len(members) < 2:
        out["note"] = NO_CONTROL if control is None else "too few control records (need 2)"
        return out
    s_in = np.asarray(model.scores(members, members=True), dtype=np.float64)
    s_out = np.asarray(model.scores(control, members=False), dtype=np.float64)
    rng = knowledge.rng(13)  # the attacker's split of its own experiment
    half_in = rng.permutation(s_in.shape[0]) < s_in.shape[0] // 2
    half_out = rng.permutation(s_out.shape[0]) < s_out.shape[0] // 2
    fit_in, fit_out = s_in[half_in], s_out[half_out]
    candidates = np.unique(np.concatenate([fit_in, fit_out, [np.inf]]))
    gain = _rates_at(fit_in, candidates) - _rates_at(fit_out, candidates)
    threshold = float(candidates[int(np.argmax(gain))])
    test_in, test_out = s_in[~half_in], s_out[~half_out]
    tp, fp = int((test_in >= threshold).sum()), int((test_out >= threshold).sum())
    n1, n0 = test_in.shape[0], test_out.shape[0]
    out.update(
        advantage=tp / n1 - fp / n0,
        interval=list(_newcombe(tp, n1, fp, n0)),
        tpr=tp / n1,
        fpr=fp / n0,
        note=f"threshold chosen on {fit_in.shape[0]} members and {fit_out.shape[0]} controls, "
        f"measured on the other {n1} and {n0}",
    )
    return out


def common_attack(
    model: PosteriorModel,
    members: pd.DataFrame,
    raw_sa: Any,
    sa: str,
    knowledge: AttackerKnowledge,
    *,
    control: pd.DataFrame | None = None,
    attribute_epsilon: float | None = None,
    attribute_delta: float = 0.0,
    epsilon: float | None = None,
    delta: float = 0.0,
    note: str | None = None,
    population: tuple[ObjArray, FloatArray] | None = None,
) -> dict[str, Any]:
    """Both common measures of one artefact: ``{"attribute_inference", "membership"}``.
    ``attribute_epsilon``: the log-likelihood-ratio bound between two values of one
    record (for the accuracy bound); ``epsilon``: the add/remove guarantee (membership)."""
    return {
        "attribute_inference": attribute_inference(
            model, members, raw_sa, sa, knowledge, control=control,
            epsilon=attribute_epsilon, delta=attribute_delta, note=note, population=population,
        ),
        "membership": membership(
            model, members, knowledge, control=control, epsilon=epsilon, delta=delta
        ),
    }  # fmt: skip
