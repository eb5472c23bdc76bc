"""The composition attack (Ganta, Kasiviswanathan, Smith, KDD 2008).

Two (or more) anonymised tables of the same records, generalised differently, each
hide a target's sensitive value among the values of the class(es) covering it. The
attacker who holds both intersects them: the target's candidate values are those found
in its covering classes of *every* table. Neither table alone may disclose; together
they can. An l-diverse table promises at least l distinct values per class; when the
intersection leaves a target fewer than l candidates, the promise no longer holds for
the publication as a whole.

Matching reuses :func:`attacks.matching.match_targets` (coverage by hierarchy
ancestors, ranges, ``*``; the suppressed block as a class). A table in which no class
(nor the suppressed block) covers a target tells the attacker nothing about it: every
value stays a candidate.

Everything runs on distinct (tuple of table 1, tuple of table 2, ...) combinations, never
per target. Pure core: numpy and pandas only (no Beam).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.matching import WEIGHT, TargetView, match_targets, unique_rows

__all__ = ["Composition", "claimed_values", "compose", "compose_tables"]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def claimed_values(guarantee: Mapping[str, Any] | None) -> int | None:
    """Distinct sensitive values per class a table's guarantee promises, or None.

    Every l-diversity variant (distinct, entropy with entropy >= log l, recursive
    (c,l)) implies at least ceil(l) distinct values per class. k-anonymity and
    t-closeness promise no number of values.
    """
    if not guarantee or guarantee.get("l") is None:
        return None
    return math.ceil(float(guarantee["l"]) - 1e-9)


@dataclass(frozen=True)
class Composition:
    """What intersecting the tables gives the attacker, against each table alone."""

    releases: tuple[str, ...]
    targets: int
    disclosed: float  # share of targets with one candidate left, and it is the true value
    disclosed_alone: tuple[float, ...]  # the same share from each table alone
    candidates: float  # mean candidates per target, combined
    candidates_alone: tuple[float, ...]
    claim: int | None  # fewest distinct values per class the tables all promise (None: none)
    below_claim: int  # targets left with fewer candidates than the claim, each table alone not

    @property
    def breach(self) -> bool:
        """Every table claims l values per class and the combination leaves fewer."""
        return self.claim is not None and self.below_claim > 0

    @property
    def gain(self) -> float:
        """Disclosure the combination adds over the best single table."""
        return self.disclosed - max(self.disclosed_alone, default=0.0)

    def message(self) -> str:
        names = " and ".join(repr(n) for n in self.releases)
        alone = ", ".join(f"{d:.1%}" for d in self.disclosed_alone)
        text = (
            f"intersecting the classes of {names} leaves {self.candidates:.2f} candidate "
            f"sensitive values per target on average and discloses {self.disclosed:.1%} of "
            f"{self.targets} targets (each table alone: {alone})"
        )
        if self.breach:
            text += (
                f"; {self.below_claim} target(s) keep fewer than the {self.claim} values "
                "every table claims per class"
            )
        elif self.claim is None and self.gain > 0:
            text += " (the tables claim no number of values per class: a finding, not a breach)"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "releases": list(self.releases),
            "targets": self.targets,
            "disclosed": self.disclosed,
            "disclosed_alone": max(self.disclosed_alone, default=0.0),
            "candidates": self.candidates,
            "candidates_alone": min(self.candidates_alone, default=0.0),
            "claim": self.claim,
            "below_claim": self.below_claim,
            "breach": self.breach,
            "finding": self.message(),
        }


def _candidates(view: TargetView, domain: pd.Index) -> tuple[BoolArray, IntArray]:
    """(per distinct tuple: which values of ``domain`` are candidates; per target: its
    tuple). A tuple no class covers keeps every value."""
    cols = np.asarray(domain.get_indexer(view.sa_values.astype(str)), dtype=np.int64)
    present = view.counts > 0
    out = np.zeros((present.shape[0], len(domain)), dtype=bool)
    out[:, cols] = present
    out[~present.any(axis=1)] = True
    return out, view.target_tuple


def compose(
    views: Sequence[TargetView],
    names: Sequence[str],
    claims: Sequence[int | None] = (),
    weights: npt.ArrayLike | None = None,
) -> Composition:
    """Intersect the candidate values of the same targets over ``views`` (one per table,
    targets in the same order). ``claims``: values per class each table promises.
    ``weights``: how many records each target stands for (a frequency table's distinct
    rows: the same figures as its rows, each counted that many times); default 1."""
    if len(views) < 2 or len(views) != len(names):
        raise ValueError("compose needs two or more views and one name per view")
    n = views[0].n_targets
    if any(v.n_targets != n for v in views):
        raise ValueError("the views must hold the same targets")
    domain = pd.Index(sorted({str(s) for v in views for s in v.sa_values}), dtype=object)
    per_view = [_candidates(v, domain) for v in views]
    truth = np.full(n, -1, dtype=np.int64)
    for v in views:  # the true value, in the common domain (any view that knows it)
        codes = np.asarray(domain.get_indexer(v.sa_values.astype(str)), dtype=np.int64)
        known = v.true_codes >= 0
        truth[known] = codes[v.true_codes[known]]
    # distinct combinations of the views' tuples: one intersection each
    combo, target_combo = unique_rows(np.stack([t for _, t in per_view], axis=1))
    target_combo = np.asarray(target_combo, dtype=np.int64).reshape(-1)
    both = np.ones((combo.shape[0], len(domain)), dtype=bool)
    alone_sizes: list[IntArray] = []
    alone_disclosed: list[float] = []
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    total = float(w.sum())

    def share(values: npt.NDArray[Any]) -> float:  # the (weighted) mean over targets
        if not n:
            return 0.0
        if weights is None:  # as the rows' mean, to the last bit
            return float(values.mean())
        return float(np.dot(values.astype(np.float64), w) / total) if total else 0.0

    for j, (cands, _) in enumerate(per_view):
        mine = cands[combo[:, j]]
        both &= mine
        size = mine.sum(axis=1).astype(np.int64)
        alone_sizes.append(size)
        per_target = size[target_combo]
        hit = (per_target == 1) & (truth >= 0) & mine[target_combo, np.maximum(truth, 0)]
        alone_disclosed.append(share(hit))
    size = both.sum(axis=1).astype(np.int64)
    per_target = size[target_combo]
    hit = (per_target == 1) & (truth >= 0) & both[target_combo, np.maximum(truth, 0)]
    claim_list = list(claims) or [None] * len(views)
    claim = None if any(c is None for c in claim_list) else min(c for c in claim_list if c)
    below = 0
    if claim is not None:
        alone_ok = np.all(np.stack(alone_sizes, axis=1) >= claim, axis=1)
        below = round(float(np.dot(((size < claim) & alone_ok)[target_combo], w)))
    return Composition(
        releases=tuple(names),
        targets=round(total),
        disclosed=share(hit),
        disclosed_alone=tuple(alone_disclosed),
        candidates=share(per_target),
        candidates_alone=tuple(share(s[target_combo]) for s in alone_sizes),
        claim=claim,
        below_claim=below,
    )


def compose_tables(
    tables: Mapping[str, pd.DataFrame],
    targets: pd.DataFrame,
    qis: Sequence[str],
    sa: str,
    hierarchies: Mapping[str, Hierarchy],
    *,
    guarantees: Mapping[str, Mapping[str, Any] | None] | None = None,
    known: Sequence[str] | None = None,
    views: dict[str, TargetView] | None = None,
) -> Composition:
    """Match ``targets`` (raw QIs, and their true SA to score) in each published table and
    intersect. ``guarantees``: each table's release.json guarantee (its claim). Targets
    may be a frequency table (column ``WEIGHT``): each distinct row counts its weight.
    ``views``: the matches of tables already made, by name, for these same targets,
    QIs, hierarchies and ``known`` (a caller composing one table with several others
    matches it once); the matches made here are added to it."""
    matched: dict[str, TargetView] = {} if views is None else views
    for name, table in tables.items():
        if name in matched:
            continue
        present = [q for q in qis if q in table.columns]
        matched[name] = match_targets(
            table, targets, present, sa,
            {q: hierarchies[q] for q in present if q in hierarchies}, known=known,
        )  # fmt: skip
    g = guarantees or {}
    weights = targets[WEIGHT].to_numpy() if WEIGHT in targets.columns else None
    return compose(
        [matched[n] for n in tables],
        list(tables),
        [claimed_values(g.get(n)) for n in tables],
        weights=weights,
    )
