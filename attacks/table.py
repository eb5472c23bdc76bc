"""Attacks on anonymised tables (and on the raw table, the no-protection baseline).

Every attack reads a ``TargetView`` (``attacks.matching``): per target, the SA counts
pooled over the published classes that may hold it. Notation of REFERENCE.md: q the
pooled SA distribution, p the published table's SA distribution, conf = max_s q(s).
The attacker guesses the most frequent candidate value (ties: the first in the sorted SA
domain). A guess is *correct* only if it equals the target's true value in the raw data,
so a homogeneous class does not count as a correct disclosure for a target whose record
was suppressed, left out, or differs.

All rates are shares of the targets (targets without any candidate row count as
failures), each with a Wilson 95% interval on the headline ``rate``, and the bound the
release's guarantee (release.json's ``guarantee``) implies, when there is one:
- l-diversity with l >= 2 (any variant): homogeneity rate 0;
- recursive (c, l)-diversity: every posterior < c/(c+1) after ruling out b <= l-2 values
  (Machanavajjhala et al. 2006); pooling classes keeps the property;
- t-closeness, equal distance: ½Σ|q - p| <= t (with p the distribution t was checked
  against; pass it as ``reference``), hence |q(s) - p(s)| <= t per value;
- k-anonymity: prosecutor risk <= 1/k for every target.

Vectorised per distinct target tuple (and per (tuple, true value) pair); no Python loop
per target. Pure core: numpy, pandas, scipy and the standard library only (no Beam).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.knowledge import AttackerKnowledge
from privpipe.attacks.matching import TargetView, match_targets
from privpipe.attacks.result import AttackResult
from privpipe.attacks.stats import wilson_interval

__all__ = [
    "TABLE_ATTACKS",
    "attack_table",
    "background_knowledge",
    "baseline_table",
    "candidate_ranges",
    "homogeneity",
    "linkage",
    "posterior_after_elimination",
    "proximity",
    "random_elimination",
    "similarity",
    "skewness",
    "worst_elimination",
]

IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

TABLE_ATTACKS: Final = (
    "homogeneity",
    "background_knowledge",
    "skewness",
    "similarity",
    "linkage",
    "proximity",
)
_CHUNK_CELLS: Final = 1 << 22  # targets x SA values per block of the random-b attack


# --------------------------------------------------------------------------- helpers


def _share(mask: BoolArray, n: int) -> float:
    return float(mask.sum()) / n if n else 0.0


def _result(
    name: str,
    hits: BoolArray,
    rates: Mapping[str, float],
    bound: float | None = None,
    bound_rate: str = "rate",
    details: Mapping[str, Any] | None = None,
) -> AttackResult:
    n = int(hits.shape[0])
    successes = int(hits.sum())
    all_rates = {"rate": successes / n if n else 0.0, **rates}
    return AttackResult(
        name=name,
        rates=all_rates,
        targets=n,
        interval=wilson_interval(successes, n),
        bound=bound,
        bound_rate=bound_rate,
        details=dict(details or {}),
    )


def _l(guarantee: Mapping[str, Any] | None) -> float:
    """l of an l-diversity guarantee, 0 when there is none."""
    if not guarantee or guarantee.get("l") is None:
        return 0.0
    return float(guarantee["l"])


def _recursive_c(guarantee: Mapping[str, Any] | None) -> float | None:
    if not guarantee or guarantee.get("variant") != "recursive" or guarantee.get("c") is None:
        return None
    return float(guarantee["c"])


def _guess(counts: IntArray) -> tuple[IntArray, FloatArray, IntArray]:
    """Per row of counts: guessed column (argmax), its posterior (NaN if no rows), size."""
    sizes = counts.sum(axis=1)
    guess = (
        np.argmax(counts, axis=1).astype(np.int64)
        if counts.shape[1]
        else np.zeros(counts.shape[0], dtype=np.int64)
    )
    top = counts.max(axis=1) if counts.shape[1] else np.zeros(counts.shape[0], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(sizes > 0, top / np.maximum(sizes, 1), np.nan)
    return guess, conf.astype(np.float64), sizes.astype(np.int64)


def _disclosure(
    name: str,
    view: TargetView,
    counts: IntArray,
    truth: IntArray,
    tau: float,
    bound: float | None,
    details: Mapping[str, Any],
) -> AttackResult:
    """Homogeneity-style rates from per-tuple counts and per-target true columns."""
    guess_u, conf_u, size_u = _guess(counts)
    distinct_u = (counts > 0).sum(axis=1)
    guess, conf, size = (view.per_target(a) for a in (guess_u, conf_u, size_u))
    homogeneous = view.per_target(distinct_u) == 1
    right = (guess == truth) & (size > 0) & (truth >= 0)
    confident = np.nan_to_num(conf, nan=0.0) >= tau
    n = view.n_targets
    rates = {
        "tau_disclosure": _share(confident, n),
        "correct": _share(homogeneous & right, n),
        "correct_tau_disclosure": _share(confident & right, n),
        "accuracy": _share(right, n),
        "matched": _share(size > 0, n),
    }
    return _result(name, homogeneous, rates, bound, "rate", {"tau": tau, **details})


def _view_details(view: TargetView) -> dict[str, Any]:
    sizes = view.per_target(view.sizes)
    classes = view.per_target(view.classes)
    return {
        "published_rows": view.published_rows,
        "suppressed_rows": view.suppressed_rows,
        "block_targets": view.block_targets,
        "known_qis": list(view.qis),
        "targets_without_candidates": int((sizes == 0).sum()),
        "mean_candidate_rows": float(sizes.mean()) if sizes.size else 0.0,
        "mean_candidate_classes": float(classes.mean()) if classes.size else 0.0,
    }


# --------------------------------------------------------------------------- attacks


def homogeneity(
    view: TargetView,
    knowledge: AttackerKnowledge | None = None,
    guarantee: Mapping[str, Any] | None = None,
) -> AttackResult:
    """Homogeneity attack (Machanavajjhala et al. 2006): the candidates share one SA value.

    ``rate`` = share of targets whose candidate rows have one distinct SA value;
    ``tau_disclosure`` = share with max posterior >= tau; ``correct*`` count only guesses
    equal to the target's true value; ``accuracy`` = argmax guess right, any confidence.
    Bound 0 for l-diversity with l >= 2.
    """
    knowledge = knowledge or AttackerKnowledge()
    bound = 0.0 if _l(guarantee) >= 2 else None
    return _disclosure(
        "homogeneity",
        view,
        view.counts,
        view.true_codes,
        knowledge.tau,
        bound,
        _view_details(view),
    )


def posterior_after_elimination(
    counts: IntArray, eliminated: BoolArray
) -> tuple[IntArray, FloatArray]:
    """Guess (argmax) and its posterior after zeroing the ruled-out columns (NaN if none left)."""
    remaining = np.where(eliminated, 0, counts)
    guess, conf, _ = _guess(remaining)
    return guess, conf


def worst_elimination(counts: IntArray | FloatArray, truth: IntArray, b: int) -> BoolArray:
    """Mask of the b most frequent values other than the truth (column ``truth``, -1 when
    unknown), per row of counts: the elimination that maximises the posterior of the true
    value, the defender's worst case."""
    eliminated = np.zeros(counts.shape, dtype=bool)
    if b == 0 or counts.shape[1] == 0:
        return eliminated
    wrong = counts.astype(np.float64)
    rows = np.flatnonzero(truth >= 0)
    wrong[rows, truth[rows]] = -np.inf  # never rule out the true value
    order = np.argsort(-wrong, axis=1, kind="stable")[:, :b]
    np.put_along_axis(eliminated, order, True, axis=1)
    eliminated[rows, truth[rows]] = False  # when b >= the number of wrong values
    return eliminated


def random_elimination(
    m: int, truth: IntArray, b: int, rng: np.random.Generator, start: int, stop: int
) -> BoolArray:
    """b true negatives per target drawn uniformly from the SA domain (seeded)."""
    keys = rng.random((stop - start, m))
    part = truth[start:stop]
    rows = np.flatnonzero(part >= 0)
    keys[rows, part[rows]] = np.inf
    eliminated = np.zeros((stop - start, m), dtype=bool)
    if b:
        order = np.argpartition(keys, min(b, m) - 1, axis=1)[:, : min(b, m)]
        np.put_along_axis(eliminated, order, True, axis=1)
        eliminated[rows, part[rows]] = False
    return eliminated


def _distinct_pairs(view: TargetView) -> tuple[IntArray, IntArray, IntArray]:
    """The distinct (tuple, true value) pairs of the targets, on one int64 key: their
    tuples, their true values (-1: unknown) and each target's pair."""
    width = np.int64(view.counts.shape[1] + 1)
    key = view.target_tuple.astype(np.int64) * width + (view.true_codes.astype(np.int64) + 1)
    distinct, pair_of_target = np.unique(key, return_inverse=True)
    index = np.asarray(pair_of_target, dtype=np.int64).reshape(-1)
    return distinct // width, distinct % width - 1, index


def _worst_posteriors(
    view: TargetView, b: int, pairs: tuple[IntArray, IntArray, IntArray]
) -> tuple[IntArray, FloatArray]:
    """Guess and posterior per target after the worst-case elimination of b values,
    computed once per distinct (tuple, true value) pair (``_distinct_pairs``)."""
    tuples, truth, index = pairs
    counts = view.counts[tuples]
    guess, conf = posterior_after_elimination(counts, worst_elimination(counts, truth, b))
    return guess[index], conf[index]


def _random_posteriors(
    view: TargetView, b: int, rng: np.random.Generator
) -> tuple[IntArray, FloatArray]:
    """Guess and posterior per target after ruling out b random true negatives.

    The same seeded keys serve every b, so the sets are nested (b=1 inside b=2); targets
    are processed in blocks that bound the memory (targets x SA values per block).
    """
    n, m = view.n_targets, view.counts.shape[1]
    guess = np.zeros(n, dtype=np.int64)
    conf = np.full(n, np.nan)
    step = max(1, _CHUNK_CELLS // max(m, 1))
    for start in range(0, n, step):
        stop = min(n, start + step)
        counts = view.counts[view.target_tuple[start:stop]]
        eliminated = random_elimination(m, view.true_codes, b, rng, start, stop)
        guess[start:stop], conf[start:stop] = posterior_after_elimination(counts, eliminated)
    return guess, conf


def background_knowledge(
    view: TargetView,
    knowledge: AttackerKnowledge | None = None,
    guarantee: Mapping[str, Any] | None = None,
    max_b: int = 3,
) -> AttackResult:
    """Background-knowledge attack: rule out b SA values, then guess the most likely.

    Measured for every b in 0..max(max_b, knowledge.background): ``rate_b<b>`` (posterior
    >= tau), ``correct_b<b>`` (and right), ``max_posterior_b<b>``; the headline ``rate``,
    ``correct`` and ``max_posterior`` are at the knowledge's b. Mode ``worst`` rules out
    the b most frequent wrong candidates (per (tuple, true value) pair); ``random`` draws
    b true negatives from the SA domain per target. Bound: c/(c+1) on ``max_posterior``
    for recursive (c, l)-diversity when b <= l - 2 (strict: the posterior stays below it).
    """
    knowledge = knowledge or AttackerKnowledge()
    tau, chosen = knowledge.tau, knowledge.background
    n = view.n_targets
    truth = view.true_codes
    rates: dict[str, float] = {}
    hits_at: BoolArray = np.zeros(n, dtype=bool)
    pairs = _distinct_pairs(view) if knowledge.background_mode == "worst" else None
    for b in range(max(max_b, chosen) + 1):
        if pairs is not None:
            guess, conf = _worst_posteriors(view, b, pairs)
        else:
            guess, conf = _random_posteriors(view, b, knowledge.rng(1))
        confident = np.nan_to_num(conf, nan=0.0) >= tau
        right = (guess == truth) & ~np.isnan(conf) & (truth >= 0)
        rates[f"rate_b{b}"] = _share(confident, n)
        rates[f"correct_b{b}"] = _share(confident & right, n)
        worst = float(np.nanmax(conf)) if n and not np.isnan(conf).all() else 0.0
        rates[f"max_posterior_b{b}"] = worst
        if b == chosen:
            hits_at = confident
            rates["correct"] = rates[f"correct_b{b}"]
            rates["max_posterior"] = worst
    c = _recursive_c(guarantee)
    bound = c / (c + 1.0) if c is not None and chosen <= _l(guarantee) - 2 else None
    details = {
        "b": chosen,
        "mode": knowledge.background_mode,
        "tau": tau,
        "seed": knowledge.seed,
        **_view_details(view),
    }
    return _result("background_knowledge", hits_at, rates, bound, "max_posterior", details)


def _reference(view: TargetView, reference: Mapping[str, float] | None) -> FloatArray:
    if reference is None:
        return view.overall
    p = np.array([float(reference.get(str(v), 0.0)) for v in view.sa_values.tolist()])
    return p.astype(np.float64)


def skewness(
    view: TargetView,
    guarantee: Mapping[str, Any] | None = None,
    ratio_threshold: float = 2.0,
    reference: Mapping[str, float] | None = None,
) -> AttackResult:
    """Skewness attack (Li et al. 2007): how far a target's q departs from p.

    Per target: max_s q(s)/p(s), max |ln(q(s)/p(s))| over values with q(s) > 0, max
    |q(s) - p(s)| and the equal distance ½Σ|q - p|. ``rate`` = share of targets whose
    max ratio is >= ``ratio_threshold``. p is the published table's SA distribution, or
    ``reference`` (SA value -> share, e.g. the input distribution t-closeness used).
    Bound t on ``max_equal_distance`` for t-closeness with equal distance.
    """
    p = _reference(view, reference)
    sizes = view.sizes
    with np.errstate(invalid="ignore", divide="ignore"):
        q = view.counts / np.maximum(sizes, 1)[:, None]
        ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.where(q > 0, np.inf, 0.0))
        logs = np.where(q > 0, np.abs(np.log(np.where(q > 0, q, 1.0) / np.where(p > 0, p, 1.0))), 0)
    has = sizes > 0
    max_ratio_u = np.where(has, ratio.max(axis=1, initial=0.0), 0.0)
    max_log_u = np.where(has, logs.max(axis=1, initial=0.0), 0.0)
    diff_u = np.where(has, np.abs(q - p).max(axis=1, initial=0.0), 0.0)
    emd_u = np.where(has, 0.5 * np.abs(q - p).sum(axis=1), 0.0)
    max_ratio, max_log, diff, emd = (
        view.per_target(a) for a in (max_ratio_u, max_log_u, diff_u, emd_u)
    )
    matched = view.per_target(has)
    n = view.n_targets
    hits = matched & (max_ratio >= ratio_threshold)

    def top(a: FloatArray) -> float:
        return float(a[matched].max()) if matched.any() else 0.0

    rates = {
        "max_ratio": top(max_ratio),
        "mean_max_ratio": float(max_ratio[matched].mean()) if matched.any() else 0.0,
        "max_abs_log_ratio": top(max_log),
        "max_abs_difference": top(diff),
        "max_equal_distance": top(emd),
        "matched": _share(matched, n),
    }
    bound = None
    if guarantee and guarantee.get("t") is not None and guarantee.get("distance") == "equal":
        bound = float(guarantee["t"])
    details = {
        "ratio_threshold": ratio_threshold,
        "reference": "given" if reference is not None else "published",
        "p": {str(v): float(x) for v, x in zip(view.sa_values.tolist(), p.tolist(), strict=True)},
        **_view_details(view),
    }
    return _result("skewness", hits, rates, bound, "max_equal_distance", details)


def similarity(
    view: TargetView,
    sa_hierarchy: Hierarchy,
    knowledge: AttackerKnowledge | None = None,
    level: int = 1,
) -> AttackResult:
    """Similarity attack (Li et al. 2007): homogeneity of SA *categories*.

    SA values are mapped to their label at ``level`` of ``sa_hierarchy`` (values not in
    it stay themselves); then the homogeneity rates are measured on categories, and a
    guess is correct when the target's true value lies in the guessed category.
    """
    knowledge = knowledge or AttackerKnowledge()
    values = view.sa_values
    codes = sa_hierarchy.encode(values)
    labels = values.copy()
    inside = codes >= 0
    labels[inside] = sa_hierarchy.generalize(codes[inside], level)
    category, names = pd.factorize(pd.Series(labels, dtype=object), sort=True)
    onehot = np.zeros((values.shape[0], len(names)), dtype=np.int64)
    onehot[np.arange(values.shape[0]), category] = 1
    counts = view.counts @ onehot
    truth = np.where(view.true_codes >= 0, category[np.maximum(view.true_codes, 0)], -1)
    details = {"level": level, "categories": [str(x) for x in names], **_view_details(view)}
    return _disclosure(
        "similarity",
        view,
        counts.astype(np.int64),
        truth.astype(np.int64),
        knowledge.tau,
        None,
        details,
    )


def linkage(
    view: TargetView,
    guarantee: Mapping[str, Any] | None = None,
    risk_threshold: float = 0.2,
) -> AttackResult:
    """Re-identification in the prosecutor model: the attacker picks one candidate row.

    Risk of a target = 1/|candidate rows| (0 without candidates). ``rate`` = average risk
    (expected share of targets re-identified), ``uniques`` = share matching one row,
    ``above_threshold`` = share with risk > ``risk_threshold``, ``highest`` = max risk.
    The interval treats the expected count Σ risk as binomial successes (approximate).
    Bound 1/k on ``highest`` for k-anonymity.
    """
    sizes = view.per_target(view.sizes)
    risk = np.where(sizes > 0, 1.0 / np.maximum(sizes, 1), 0.0)
    n = view.n_targets
    expected = float(risk.sum())
    rates = {
        "rate": expected / n if n else 0.0,
        "highest": float(risk.max()) if n else 0.0,
        "uniques": _share(sizes == 1, n),
        "above_threshold": _share(risk > risk_threshold, n),
        "matched": _share(sizes > 0, n),
    }
    k = guarantee.get("k") if guarantee else None
    return AttackResult(
        name="linkage",
        rates=rates,
        targets=n,
        interval=wilson_interval(min(expected, float(n)), n),
        bound=1.0 / float(k) if k else None,
        bound_rate="highest",
        details={"risk_threshold": risk_threshold, **_view_details(view)},
    )


def candidate_ranges(view: TargetView) -> tuple[FloatArray, FloatArray]:
    """Per target: smallest and largest numeric SA value among its candidates (NaN if none)."""
    numbers = pd.to_numeric(pd.Series(view.sa_values, dtype=object), errors="coerce").to_numpy(
        dtype=np.float64
    )
    present = (view.counts > 0) & ~np.isnan(numbers)[None, :]
    lo = np.where(present, numbers[None, :], np.inf).min(axis=1, initial=np.inf)
    hi = np.where(present, numbers[None, :], -np.inf).max(axis=1, initial=-np.inf)
    none = ~present.any(axis=1)
    lo[none] = np.nan
    hi[none] = np.nan
    return view.per_target(lo), view.per_target(hi)


def proximity(view: TargetView, width_threshold: float = 0.25) -> AttackResult:
    """Proximity attack on a numeric SA (Li et al. 2007: "Bob's salary is in [3K, 5K]").

    The attacker learns the range [min, max] of the candidates' values. ``rate`` = share
    of targets whose range is at most ``width_threshold`` of the published value range;
    ``correct`` = that and the true value inside the range.
    """
    lo, hi = candidate_ranges(view)
    numbers = pd.to_numeric(pd.Series(view.sa_values, dtype=object), errors="coerce").to_numpy(
        dtype=np.float64
    )
    present = view.overall > 0
    spread = (
        float(np.nanmax(numbers[present]) - np.nanmin(numbers[present]))
        if (present & ~np.isnan(numbers)).any()
        else 0.0
    )
    width = hi - lo
    relative = width / spread if spread > 0 else np.where(np.isnan(width), np.nan, 0.0)
    narrow = np.nan_to_num(relative, nan=np.inf) <= width_threshold
    truth = np.where(view.true_codes >= 0, numbers[np.maximum(view.true_codes, 0)], np.nan)
    inside = (truth >= lo) & (truth <= hi)
    n = view.n_targets
    rates = {
        "correct": _share(narrow & inside, n),
        "mean_relative_width": float(np.nanmean(relative)) if (~np.isnan(relative)).any() else 0.0,
    }
    details = {"width_threshold": width_threshold, "value_range": spread, **_view_details(view)}
    return _result("proximity", narrow, rates, None, "rate", details)


# --------------------------------------------------------------------------- all at once


def baseline_table(raw: pd.DataFrame, qis: Sequence[str], sa: str) -> pd.DataFrame:
    """The raw table as a "release" (QI + SA columns): the no-protection baseline."""
    return raw.loc[:, [*qis, sa]]


def attack_table(
    published: pd.DataFrame,
    raw: pd.DataFrame,
    qis: Sequence[str],
    sa: str,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    knowledge: AttackerKnowledge | None = None,
    *,
    attacks: Sequence[str] = ("homogeneity", "background_knowledge", "skewness", "linkage"),
    guarantee: Mapping[str, Any] | None = None,
    sa_hierarchy: Hierarchy | None = None,
    similarity_level: int = 1,
    reference: Mapping[str, float] | None = None,
) -> dict[str, AttackResult]:
    """Select the targets from ``raw``, match them once, run the named ``attacks``.

    ``attacks`` are names of ``TABLE_ATTACKS``; ``similarity`` needs ``sa_hierarchy``.
    Returns ``{name: AttackResult}`` in the order asked.
    """
    knowledge = knowledge or AttackerKnowledge()
    unknown = [a for a in attacks if a not in TABLE_ATTACKS]
    if unknown:
        raise ValueError(f"unknown table attacks {unknown}; known: {list(TABLE_ATTACKS)}")
    if "similarity" in attacks and sa_hierarchy is None:
        raise ValueError(f"the similarity attack needs the hierarchy of {sa!r}")
    rows = knowledge.target_rows(len(raw))
    view = match_targets(
        published,
        raw.iloc[rows],
        qis,
        sa,
        hierarchies,
        known=knowledge.known_qis(qis),
        target_rows=rows,
    )
    out: dict[str, AttackResult] = {}
    for name in attacks:
        if name == "homogeneity":
            out[name] = homogeneity(view, knowledge, guarantee)
        elif name == "background_knowledge":
            out[name] = background_knowledge(view, knowledge, guarantee)
        elif name == "skewness":
            out[name] = skewness(view, guarantee, reference=reference)
        elif name == "similarity":
            assert sa_hierarchy is not None
            out[name] = similarity(view, sa_hierarchy, knowledge, similarity_level)
        elif name == "linkage":
            out[name] = linkage(view, guarantee)
        else:
            out[name] = proximity(view)
    return out
