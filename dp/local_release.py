"""A local DP release from microdata: values to codes, one report per person, the check.

The pieces the pipeline needs around :mod:`dp.local` (pure numpy/pandas, no Beam):

- :func:`encode_values`: a column's values as codes of the *public* domain. A value outside
  the domain is refused (InputDataError, exit 3), or reported as the ``other`` value when
  the release has one (the last code of the domain).
- :func:`one_per_person`: with a privacy unit, each person reports once: one of their rows,
  chosen uniformly at random (random priorities from the :class:`RandomSource`), so one
  person's whole data changes exactly one report and the release is ε-LDP per person.
- :func:`estimates_from_support`: the release table from summed support counts.
- :func:`verify_local_release`: an independent re-check of what is about to be published:
  the privacy loss implied by the recorded randomiser probabilities against the configured
  ε (recomputed here, not taken from :class:`dp.local.OracleParameters`), the estimator
  recomputed from the recorded support counts, one estimate per domain value, and the
  multiparty noise scales. It can say no, and then nothing is published.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import canonical_factorize
from privpipe.dp.bounding import dense_ids
from privpipe.dp.multiparty import calibration_problems
from privpipe.dp.secure_random import RandomSource
from privpipe.errors import InputDataError

IntArray = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

UNARY = ("sue", "oue")
HASHING = ("blh", "olh")
KNOWN = ("rr", "grr", "sue", "oue", "blh", "olh")
TOLERANCE = 1e-9


def full_domain(domain: Sequence[str], other: str | None) -> tuple[str, ...]:
    """The released values: the public domain, then the ``other`` value if any."""
    values = tuple(dict.fromkeys(str(v) for v in domain))
    return (*values, other) if other is not None and other not in values else values


def encode_values(
    values: pd.Series, domain: Sequence[str], other: str | None, where: str
) -> IntArray:
    """Codes in [0, len(full_domain)) of every value (canonical strings, as central DP;
    a missing value is ``""``), looked up once per distinct value."""
    raw, uniques = canonical_factorize(values)  # a missing value: -1, the "" appended last
    full = full_domain(domain, other)
    index = pd.Index(full[: len(full) - (1 if other is not None else 0)], dtype=object)
    per_value = np.asarray(index.get_indexer(np.append(uniques, "").astype(object)), np.int64)
    codes: IntArray = per_value[raw]
    outside = codes < 0
    if outside.any():
        if other is not None:
            codes[outside] = len(full) - 1
        else:
            # no value and no count: this refusal depends on the data, and it is not part of
            # what the local release's charge covers
            raise InputDataError(
                f"column {values.name!r} ({where}): some rows hold values outside the public "
                "domain (values and counts withheld: they are not covered by the release's "
                "epsilon); add them to the domain, or set other: '__other__' to report them "
                "as one extra value"
            )
    return codes


def one_per_person(unit: U64, source: RandomSource) -> npt.NDArray[np.intp]:
    """Indices of one row per person, each chosen uniformly at random among its rows.

    Rows must be in a deterministic order for a seeded source to be reproducible.
    """
    n = unit.size
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    priority = source.words(n)  # each person keeps its row of the lowest priority
    by_priority = np.argsort(priority)
    rank = np.empty(n, dtype=np.int64)
    rank[by_priority] = np.arange(n, dtype=np.int64)
    person, persons = dense_ids(unit)
    lowest = np.full(persons, n, dtype=np.int64)
    np.minimum.at(lowest, person, rank)  # one pass, no sort of (unit, priority) pairs
    return np.sort(by_priority[lowest]).astype(np.intp)


def unbiased(support: npt.ArrayLike, n: int, p_star: float, q_star: float) -> npt.NDArray[Any]:
    """ĉ(v) = (I_v − n·q*)/(p* − q*), written out again for the verifier."""
    sup = np.asarray(support, dtype=np.float64)
    return np.asarray((sup - n * q_star) / (p_star - q_star), dtype=np.float64)


PARTICIPATION = (
    "not protected: the local model protects each person's value (neighbours differ in one "
    "person's report), not whether a person reported; the collector sees every report, and "
    "rr/grr estimates sum to the number of reports"
)


def interval_halfwidth(
    estimates: npt.ArrayLike, p_star: float, q_star: float, confidence: float
) -> npt.NDArray[Any]:
    """The published interval's half-width, written out again for the verifier: from the
    estimates alone, n replaced by n̂ = max(Σ ĉ, 0) (never the number of reports)."""
    est = np.asarray(estimates, dtype=np.float64)
    n_hat = max(float(est.sum()), 0.0)
    var = n_hat * q_star * (1.0 - q_star) / (p_star - q_star) ** 2 + np.clip(est, 0.0, n_hat) * (
        1.0 - p_star - q_star
    ) / (p_star - q_star)
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    return np.asarray(z * np.sqrt(np.maximum(var, 0.0)), dtype=np.float64)


def implied_epsilon(protocol: str, p: float, q: float) -> float:
    """The largest log-ratio of the randomiser's output probabilities, from p and q alone."""
    if not (0.0 < q < 1.0 and 0.0 < p < 1.0):
        return math.inf
    if protocol in UNARY:
        return math.log(p * (1.0 - q) / ((1.0 - p) * q))
    return math.log(p / q)


def verify_local_release(
    parameters: Mapping[str, Any],
    epsilon: float,
    domain: Sequence[str],
    n: int,
    support: npt.ArrayLike,
    table: pd.DataFrame,
    multiparty: Mapping[str, Any] | None = None,
    confidence: float | None = None,
) -> dict[str, Any]:
    """Re-check a local DP release before publishing; ``ok`` is False with the reasons.

    With ``confidence``, the published interval must be the one computed from the
    estimates alone (``interval_halfwidth``): an interval from the number of reports would
    publish the exact number of persons."""
    problems: list[str] = []
    protocol = str(parameters.get("protocol"))
    if protocol not in KNOWN:
        problems.append(f"unknown protocol {protocol!r}")
    d = len(domain)
    if parameters.get("d") != d:
        problems.append(f"the randomiser ran over d={parameters.get('d')} values, domain has {d}")
    if protocol == "rr" and d != 2:
        problems.append(f"randomised response needs 2 values, the domain has {d}")
    p, q = float(parameters.get("p", math.nan)), float(parameters.get("q", math.nan))
    implied = implied_epsilon(protocol, p, q)
    if not implied <= epsilon * (1.0 + TOLERANCE) + TOLERANCE:
        problems.append(
            f"the randomiser's probabilities p={p!r}, q={q!r} imply epsilon {implied:.6g}, "
            f"above the configured {epsilon:g}"
        )
    elif implied < epsilon * (1.0 - 1e-6) - TOLERANCE:
        problems.append(
            f"the randomiser's probabilities imply epsilon {implied:.6g}, not the configured "
            f"{epsilon:g} (the recorded parameters do not describe this protocol)"
        )
    if protocol in HASHING:
        g = parameters.get("g")
        if not isinstance(g, int) or g < 2:
            problems.append(f"{protocol} needs a hash range g >= 2, got {g!r}")
        elif not math.isclose(float(parameters.get("q_star", math.nan)), 1.0 / g):
            problems.append("q* of a hashing protocol must be 1/g")
    elif parameters.get("p_star") != p or parameters.get("q_star") != q:
        problems.append("p*/q* must equal the randomiser's p/q for this protocol")
    sup = np.asarray(support, dtype=np.int64)
    if sup.shape != (d,):
        problems.append(f"{sup.size} support counts for {d} values")
    elif n < 0 or (sup < 0).any() or (sup > n).any():
        problems.append("support counts outside [0, n]")
    elif protocol in ("rr", "grr") and int(sup.sum()) != n:
        problems.append(f"{protocol}: support counts sum to {int(sup.sum())}, not n = {n}")
    if len(table) != d or list(table["value"].astype(str)) != [str(v) for v in domain]:
        problems.append(f"the table has {len(table)} rows, not one per domain value ({d})")
    elif sup.shape == (d,):
        ps, qs = float(parameters.get("p_star", math.nan)), float(parameters.get("q_star", 0))
        again = unbiased(sup, n, ps, qs)
        if not np.allclose(again, table["estimate"].to_numpy(dtype=np.float64), rtol=1e-9):
            problems.append("the estimates do not follow from the support counts")
        low, high = table["ci_low"].to_numpy(), table["ci_high"].to_numpy()
        est = table["estimate"].to_numpy()
        if not (np.all(low <= est) and np.all(est <= high)):
            problems.append("an interval does not contain its estimate")
        elif confidence is not None:
            half = interval_halfwidth(est, ps, qs, confidence)
            if not (
                np.allclose(est - low, half, rtol=1e-9) and np.allclose(high - est, half, rtol=1e-9)
            ):
                problems.append(
                    "the intervals are not computed from the published estimates alone "
                    "(an interval from the number of reports states the number of persons)"
                )
    if multiparty is not None:
        scale = float(multiparty.get("scale", math.nan))
        eps_party = float(multiparty.get("epsilon", math.nan))
        problems += [
            f"multiparty: {why}"
            for why in calibration_problems(
                eps_party,
                int(multiparty.get("sensitivity", 0)),
                scale,
                str(multiparty.get("neighbours", "substitution")),
            )
        ]
        if not eps_party <= epsilon * (1.0 + TOLERANCE):
            problems.append(f"multiparty epsilon {eps_party} exceeds the configured {epsilon}")
        if int(multiparty.get("parties", 0)) < 1:
            problems.append("multiparty needs at least one party")
    return {"ok": not problems, "implied_epsilon": implied, "problems": problems}
