"""Attacks on local-DP reports: what a target's own randomised report reveals.

With generalised randomised response (GRR) over a domain of d values at ε, a user reports
the true value with probability p = e^ε/(e^ε+d-1) and each other value with q =
1/(e^ε+d-1). The attacker who sees the report may guess the reported value (the MAP guess
from a uniform prior; it succeeds with probability p in expectation). Whatever the prior,
the posterior odds of any value are at most e^ε times its prior odds (REFERENCE.md), so
with the attribute's real distribution π no guess succeeds more often than
max_v e^ε·π_v / (e^ε·π_v + 1 - π_v) — with a skewed π that is well above the uniform
prior's p, and always guessing the most common value already reaches max π. So the
attack also reports the MAP guess under the real prior (prior × e^ε for every value the
report supports: the likelihood ratio of GRR, unary encodings and local hashing alike) and
the always-most-common baseline. The protocols live in ``dp.local``.

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from privpipe.attacks.matching import canonical_strings
from privpipe.attacks.result import AttackResult
from privpipe.attacks.stats import wilson_interval

__all__ = ["grr_posterior", "grr_success_bound", "map_guess", "report_attack"]


def grr_success_bound(
    epsilon: float, domain_size: int, prior: npt.ArrayLike | None = None
) -> float:
    """The best possible success of any guess of the true value from an ε-LDP report.

    Posterior odds <= e^ε × prior odds, so P[v | report] <= e^ε·π_v/(e^ε·π_v + 1 - π_v)
    for every v; the bound is its maximum over v. ``prior`` is the attribute's real
    distribution π over the d values (uniform by default: then it is p = e^ε/(e^ε+d-1),
    the success of guessing the report)."""
    if epsilon < 0 or domain_size < 1:
        raise ValueError(
            f"need epsilon >= 0 and domain_size >= 1, got {epsilon!r}, {domain_size!r}"
        )
    if prior is None:
        return 1.0 / (1.0 + (domain_size - 1) * math.exp(-epsilon))
    pi = _prior(prior, domain_size)
    top = float(pi.max())
    if top >= 1.0:
        return 1.0
    return 1.0 / (1.0 + (1.0 - top) / top * math.exp(-epsilon)) if top > 0 else 0.0


def _prior(prior: npt.ArrayLike, domain_size: int) -> npt.NDArray[np.float64]:
    pi = np.asarray(prior, dtype=np.float64).reshape(-1)
    if pi.shape != (domain_size,) or (pi < 0).any() or pi.sum() <= 0:
        raise ValueError(f"prior needs {domain_size} non-negative entries with a positive sum")
    out: npt.NDArray[np.float64] = pi / pi.sum()
    return out


def map_guess(
    support: npt.ArrayLike, prior: npt.ArrayLike, epsilon: float
) -> npt.NDArray[np.int64]:
    """The MAP guess of each user's value: argmax_v π_v·e^(ε·[report supports v]).

    ``support`` is an (n x d) boolean matrix (GRR: the reported value; unary encodings:
    the set bits; local hashing: the values hashing to the reported bucket); for each of
    these protocols a supported value is e^ε times likelier to have produced the report.
    """
    s = np.asarray(support, dtype=bool)
    if s.ndim != 2:
        raise ValueError(f"support must be an (n x d) matrix, got shape {s.shape}")
    pi = _prior(prior, s.shape[1])
    with np.errstate(divide="ignore"):
        score = np.log(pi)[None, :] + epsilon * s
    return np.asarray(np.argmax(score, axis=1), dtype=np.int64)


def grr_posterior(
    epsilon: float, domain_size: int, prior: npt.ArrayLike | None = None
) -> npt.NDArray[np.float64]:
    """Posterior P[true = v | report = r] as a d x d matrix (row r), from ``prior``
    (uniform by default): prior_v·p for v = r, prior_v·q otherwise, normalised."""
    d = int(domain_size)
    pi = np.full(d, 1.0 / d) if prior is None else np.asarray(prior, dtype=np.float64)
    if pi.shape != (d,):
        raise ValueError(f"prior needs {d} entries, got shape {pi.shape}")
    like = np.full((d, d), 1.0)
    np.fill_diagonal(like, math.exp(epsilon))  # p/q = e^ε
    joint = like * pi[None, :]
    out: npt.NDArray[np.float64] = joint / joint.sum(axis=1, keepdims=True)
    return out


def report_attack(
    true_values: npt.ArrayLike,
    reported: npt.ArrayLike,
    *,
    epsilon: float,
    domain_size: int,
    prior: npt.ArrayLike | None = None,
    map_guesses: npt.ArrayLike | None = None,
) -> AttackResult:
    """Guess each user's true value as its reported value; compare with the bound.

    ``rate`` = share of users whose report equals their true value; the interval is
    Wilson's. Without ``prior`` the bound is the uniform prior's e^ε/(e^ε+d-1) (the
    expected success of this guess). With ``prior`` (the attribute's real distribution
    over the domain, index = code) the bound is :func:`grr_success_bound` under it, and
    ``most_common_accuracy`` (always guessing the most common value) is reported; with
    ``map_guesses`` (codes, e.g. :func:`map_guess`) ``map_accuracy`` too, the bounded
    rate (the best attack). ``true_values`` and ``reported`` are codes when a prior is
    given."""
    truth = np.asarray(true_values, dtype=object).reshape(-1)
    seen = np.asarray(reported, dtype=object).reshape(-1)
    if truth.shape != seen.shape:
        raise ValueError(
            f"need one report per user: {truth.shape[0]} true values, {seen.shape[0]} reports"
        )
    codes, _ = canonical_strings(np.concatenate([truth, seen]))
    n = truth.shape[0]
    hits = codes[:n] == codes[n:]
    successes = int(hits.sum())
    uniform = grr_success_bound(epsilon, domain_size)
    bound = grr_success_bound(epsilon, domain_size, prior)
    rates: dict[str, float] = {
        "rate": successes / n if n else 0.0,
        "max_posterior": bound,
        "prior_success": 1.0 / domain_size,
    }
    details: dict[str, Any] = {
        "epsilon": epsilon,
        "domain_size": domain_size,
        "odds_bound": math.exp(epsilon),
        "uniform_prior_bound": uniform,
        "prior": "uniform" if prior is None else "real",
    }
    bound_rate = "rate"
    if prior is not None:
        pi = _prior(prior, domain_size)
        codes_true = np.asarray(true_values, dtype=np.int64).reshape(-1)
        rates["most_common_accuracy"] = (
            float((codes_true == int(np.argmax(pi))).mean()) if n else 0.0
        )
        if map_guesses is not None:
            guesses = np.asarray(map_guesses, dtype=np.int64).reshape(-1)
            if guesses.shape != codes_true.shape:
                raise ValueError("need one MAP guess per user")
            rates["map_accuracy"] = float((guesses == codes_true).mean()) if n else 0.0
            bound_rate = "map_accuracy"
    return AttackResult(
        name="ldp_report",
        rates=rates,
        targets=n,
        interval=wilson_interval(successes, n),
        bound=bound,
        bound_rate=bound_rate,
        details=details,
    )
