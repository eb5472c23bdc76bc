"""Attacks on local-DP reports: what a target's own randomised report reveals.

With generalised randomised response (GRR) over a domain of d values at ε, a user reports
the true value with probability p = e^ε/(e^ε+d-1) and each other value with q =
1/(e^ε+d-1). The attacker who sees the report guesses the reported value (the MAP guess
from a uniform prior); it succeeds with probability p in expectation, and the posterior
odds of any value are at most e^ε times its prior odds (REFERENCE.md). The protocols live
in ``dp.local``; this module only takes (true value, reported value) pairs, so it applies
to any protocol whose report is a single value of the domain.

Pure core: numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from attacks.matching import canonical_strings
from attacks.result import AttackResult
from attacks.stats import wilson_interval

__all__ = ["grr_posterior", "grr_success_bound", "report_attack"]


def grr_success_bound(epsilon: float, domain_size: int) -> float:
    """p = e^ε/(e^ε+d-1): the success of guessing the report, and the best possible
    success of any guess of the true value from a uniform prior over d values."""
    if epsilon < 0 or domain_size < 1:
        raise ValueError(
            f"need epsilon >= 0 and domain_size >= 1, got {epsilon!r}, {domain_size!r}"
        )
    return 1.0 / (1.0 + (domain_size - 1) * math.exp(-epsilon))


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
) -> AttackResult:
    """Guess each user's true value as its reported value; compare with e^ε/(e^ε+d-1).

    ``rate`` = share of users whose report equals their true value; the interval is
    Wilson's; ``bound`` is the expected success p (exact in expectation, so the measured
    rate lies around it, not only below). ``max_posterior`` is the uniform-prior posterior
    of the guessed value, p itself.
    """
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
    bound = grr_success_bound(epsilon, domain_size)
    rates: dict[str, float] = {
        "rate": successes / n if n else 0.0,
        "max_posterior": bound,
        "prior_success": 1.0 / domain_size,
    }
    details: dict[str, Any] = {
        "epsilon": epsilon,
        "domain_size": domain_size,
        "odds_bound": math.exp(epsilon),
    }
    return AttackResult(
        name="ldp_report",
        rates=rates,
        targets=n,
        interval=wilson_interval(successes, n),
        bound=bound,
        details=details,
    )
