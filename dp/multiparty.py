"""Distributed DP histograms: m parties each noise their own partial histogram, then sum.

The middle ground between central DP (one trusted curator, m = 1) and local DP (every person
is a party): persons are split over m parties (given labels, or evenly); each party counts its
own persons' codes and releases its histogram with discrete Laplace noise, so it need trust
no one else. The aggregator sums the m noisy histograms: unbiased, with variance
Σ_j Var(DLap(L1/ε_j)) = m·Var(DLap(L1/ε)) for equal ε, versus Θ(n/ε²) in the local model.

Neighbour relation and calibration (issue 12, item 8). The guarantee is stated for
**substitution** of one person (one person's value replaced by another, n fixed), the
relation of local DP, where each person's report is ε-DP whatever the two values are. Each
person contributes one row (one value) to one party's histogram, so substituting it moves
one cell of that party's histogram by −1 and another by +1: L1 = 2 × contribution
(:func:`l1_sensitivity`); under add/remove it would be 1 × contribution. Each party draws
discrete Laplace noise of scale b = L1/ε_j on every cell of its own histogram, so

* each party's share ALONE is ε_j-DP against an adversary who knows everything else (every
  other party's rows and shares, the public domain): the share is the party's exact counts
  plus noise of its own; for neighbouring histograms h, h' with ‖h − h'‖₁ ≤ L1 the ratio of
  output probabilities is Π_v e^{|h_v − h'_v|/b} ≤ e^{L1/b} = e^{ε_j}. No party relies on
  another's noise (the sum of noises is NOT what is calibrated), so a party that colludes
  with the aggregator, or publishes its share, costs nobody else anything;
* the persons of different parties are disjoint, so the m shares together are
  max_j ε_j-DP (parallel composition); a substitution that also moves a person to another
  party changes two shares by L1 = 1 each, each then ε_j/2-DP, together still ≤ max_j ε_j;
* the sum is post-processing of the shares.

With the old add/remove calibration (b = 1/ε) a substitution gets e^{2/b} = e^{2ε}: the
calibration audit in tests/test_multiparty.py says no to it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.dp.local import choose_protocol
from privpipe.dp.local import variance as local_protocol_variance
from privpipe.dp.noise import (
    NoiseSampler,
    discrete_laplace_variance,
    laplace_ci_halfwidth,
    laplace_scale,
)
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

NEIGHBOURS = ("substitution", "add_remove")
PARTY_FORMAT = "privpipe-party-histogram/1"
TRUST_SEPARATE = (
    "each party sees only its own rows and publishes only its noisy share; the aggregator "
    "sees only the shares"
)
TRUST_SIMULATION = (
    "simulation: one process sees every party's rows; for the trust property run each "
    "party separately (dp_party_histogram, then privpipe multiparty aggregate)"
)


def l1_sensitivity(neighbours: str = "substitution", contribution: int = 1) -> int:
    """L1 change of one party's histogram between neighbours: 2·c (substitution) or c."""
    if neighbours not in NEIGHBOURS:
        raise ConfigError(f"neighbours must be one of {', '.join(NEIGHBOURS)}, got {neighbours!r}")
    if contribution < 1:
        raise ConfigError(f"contribution must be >= 1, got {contribution}")
    return (2 if neighbours == "substitution" else 1) * contribution


SUBSTITUTION_L1 = l1_sensitivity("substitution")


def party_seed(seed: int | None, release_id: str, index: int) -> int | None:
    """Party ``index``'s noise seed of an --insecure-seed run (None: OpenDP, no seed).

    Derived from (seed, release id, party index) only, so a party run on its own draws
    exactly the noise the one-process simulation draws for that party.
    """
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}|{release_id}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(frozen=True, eq=False)
class MultipartyEstimates:
    """The summed noisy histogram, each party's published noisy histogram, and the error.

    ``halfwidth``: a (1−β) interval half-width per cell, exact for m = 1 (discrete Laplace
    tail) and by the normal approximation of the sum of m noises for m > 1.
    """

    counts: IntArray
    party_counts: IntArray
    epsilons: FloatArray
    sensitivity: int
    variance: float
    halfwidth: float
    beta: float

    @property
    def m(self) -> int:
        return int(self.party_counts.shape[0])

    @property
    def epsilon(self) -> float:
        """The release's guarantee: parallel composition over disjoint parties."""
        return float(self.epsilons.max())

    def to_frame(self) -> pd.DataFrame:
        """One row per value code: estimate, variance, CI."""
        d = self.counts.size
        return pd.DataFrame(
            {
                "value": np.arange(d, dtype=np.int64),
                "estimate": self.counts,
                "variance": np.full(d, self.variance),
                "ci_low": self.counts - self.halfwidth,
                "ci_high": self.counts + self.halfwidth,
            }
        )


def split_evenly(n: int, m: int) -> IntArray:
    """Party labels 0..m−1 for n persons in m contiguous, near-equal blocks."""
    if m < 1 or n < 0:
        raise ConfigError(f"need m >= 1 parties and n >= 0 persons, got m={m}, n={n}")
    return ((np.arange(n, dtype=np.int64) * m) // max(n, 1)).astype(np.int64)


def party_histograms(codes: npt.ArrayLike, d: int, labels: npt.ArrayLike, m: int) -> IntArray:
    """The exact m × d partial histograms (party j's row counts only its persons)."""
    raw = np.asarray(codes)
    if raw.dtype.kind not in "iub":
        raise InputDataError(f"value codes must be integers in [0, {d}), got {raw.dtype}")
    c = raw.astype(np.int64).reshape(-1)
    lab = np.asarray(labels, dtype=np.int64).reshape(-1)
    if c.shape != lab.shape:
        raise InputDataError(f"{c.size} codes but {lab.size} party labels")
    if c.size and (c.min() < 0 or c.max() >= d):
        raise InputDataError(f"value codes must lie in [0, {d})")
    if lab.size and (lab.min() < 0 or lab.max() >= m):
        raise InputDataError(f"party labels must lie in [0, {m})")
    return np.bincount(lab * d + c, minlength=m * d).astype(np.int64).reshape(m, d)


def _epsilons(epsilon: float | npt.ArrayLike, m: int) -> FloatArray:
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (m,)).astype(np.float64)
    if not np.all(np.isfinite(eps) & (eps > 0)):
        raise ConfigError(f"every party's epsilon must be a finite number > 0, got {epsilon!r}")
    return eps


def multiparty_variance(
    epsilon: float | npt.ArrayLike, m: int = 1, sensitivity: int = SUBSTITUTION_L1
) -> float:
    """Per-cell variance of the summed histogram: Σ_j Var(DLap(L1/ε_j)); m = 1 is central."""
    eps = _epsilons(epsilon, m)
    return float(sum(discrete_laplace_variance(laplace_scale(sensitivity, e)) for e in eps))


def central_variance(epsilon: float, sensitivity: int = SUBSTITUTION_L1) -> float:
    """Per-cell variance of a central discrete-Laplace histogram (m = 1)."""
    return multiparty_variance(epsilon, 1, sensitivity)


def local_variance(n: int, epsilon: float, d: int, protocol: str = "auto") -> float:
    """Per-value variance of a local DP frequency oracle over n persons (REFERENCE table)."""
    name = choose_protocol(epsilon, d) if protocol == "auto" else protocol
    return local_protocol_variance(name, n, epsilon, d)


def multiparty_histogram(
    codes: npt.ArrayLike,
    d: int,
    epsilon: float | npt.ArrayLike,
    sampler: NoiseSampler,
    parties: npt.ArrayLike | None = None,
    m: int | None = None,
    sensitivity: int = SUBSTITUTION_L1,
    beta: float = 0.05,
) -> MultipartyEstimates:
    """Each party noises its partial histogram with its own ε; the aggregator sums.

    ``parties``: a label per person (any integers; relabelled 0..m−1), or None to split
    evenly into ``m`` parties. ``epsilon``: one value or one per party. ``sensitivity``: the
    L1 change of one party's histogram between neighbours (:func:`l1_sensitivity`; 2 for
    counts under substitution, the default).
    """
    c = np.asarray(codes).reshape(-1)
    if parties is None:
        if m is None:
            raise ConfigError("give party labels or a number of parties m")
        labels = split_evenly(c.size, m)
    else:
        uniq, labels = np.unique(np.asarray(parties).reshape(-1), return_inverse=True)
        if m is not None and m != uniq.size:
            raise ConfigError(f"m={m} but the labels name {uniq.size} parties")
        m = int(uniq.size) if uniq.size else 1
        labels = labels.astype(np.int64)
    if not 0.0 < beta < 1.0:
        raise ConfigError(f"beta must lie strictly between 0 and 1, got {beta!r}")
    return noisy_party_sum(party_histograms(c, d, labels, m), epsilon, sampler, sensitivity, beta)


def party_share(
    exact: npt.ArrayLike, epsilon: float, sampler: NoiseSampler, sensitivity: int = SUBSTITUTION_L1
) -> IntArray:
    """One party's published share: its exact counts + discrete Laplace(sensitivity/ε) each.

    ε-DP on its own for neighbours whose histograms differ by at most ``sensitivity`` in L1
    (module docstring), whatever the adversary knows about the other parties.
    """
    eps = float(_epsilons(epsilon, 1)[0])
    if sensitivity < 1:
        raise ConfigError(f"sensitivity must be >= 1, got {sensitivity}")
    return sampler.discrete_laplace(
        np.asarray(exact, dtype=np.int64), laplace_scale(sensitivity, eps)
    )


def sum_shares(
    shares: npt.ArrayLike,
    epsilon: float | npt.ArrayLike,
    sensitivity: int = SUBSTITUTION_L1,
    beta: float = 0.05,
) -> MultipartyEstimates:
    """The aggregator's step: sum m published shares (m × d); variance and interval."""
    noisy = np.asarray(shares, dtype=np.int64)
    m = _parties(noisy, beta)
    eps = _epsilons(epsilon, m)
    var = multiparty_variance(eps, m, sensitivity)
    if m == 1:
        half = float(laplace_ci_halfwidth(laplace_scale(sensitivity, float(eps[0])), beta))
    else:
        half = NormalDist().inv_cdf(1.0 - beta / 2.0) * math.sqrt(var)
    return MultipartyEstimates(noisy.sum(axis=0), noisy, eps, sensitivity, var, half, beta)


def _parties(histograms: IntArray, beta: float) -> int:
    """The number of parties m of an m × d array of party histograms (ConfigError if the
    shape or the interval's ``beta`` is wrong)."""
    if histograms.ndim != 2 or histograms.shape[0] < 1:
        raise ConfigError(f"party histograms must be an m x d array, got shape {histograms.shape}")
    if not 0.0 < beta < 1.0:
        raise ConfigError(f"beta must lie strictly between 0 and 1, got {beta!r}")
    return int(histograms.shape[0])


def noisy_party_sum(
    exact: npt.ArrayLike,
    epsilon: float | npt.ArrayLike,
    sampler: NoiseSampler | Sequence[NoiseSampler],
    sensitivity: int = SUBSTITUTION_L1,
    beta: float = 0.05,
) -> MultipartyEstimates:
    """Each party's exact m × d partial histogram noised with its own ε, then summed.

    The one-process simulation of m parties (:func:`party_share` per party, then
    :func:`sum_shares`), for partial histograms computed elsewhere (e.g. summed across the
    batches of a pipeline). ``sampler``: one for all parties, or one per party (party j's
    own, as a party run on its own would draw it).
    """
    exact = np.asarray(exact, dtype=np.int64)
    m = _parties(exact, beta)
    eps = _epsilons(epsilon, m)
    samplers = [sampler] * m if not isinstance(sampler, Sequence) else list(sampler)
    if len(samplers) != m:
        raise ConfigError(f"{len(samplers)} noise samplers for {m} parties")
    noisy = np.empty_like(exact)
    for j in range(m):  # one vectorised noise call per party (loop over parties, not persons)
        noisy[j] = party_share(exact[j], float(eps[j]), samplers[j], sensitivity)
    return sum_shares(noisy, eps, sensitivity, beta)


def calibration_problems(
    epsilon: float, sensitivity: int, scale: float, neighbours: str, contribution: int = 1
) -> list[str]:
    """Why a share's recorded noise is not ε-DP for its neighbour relation (empty: it is)."""
    out: list[str] = []
    if neighbours not in NEIGHBOURS:
        return [f"unknown neighbour relation {neighbours!r}; expected one of {NEIGHBOURS}"]
    need = l1_sensitivity(neighbours, contribution)
    if sensitivity < need:
        out.append(
            f"sensitivity {sensitivity} is below the L1 change {need} of one histogram under "
            f"{neighbours} of one person"
        )
    if not (math.isfinite(epsilon) and epsilon > 0):
        out.append(f"epsilon {epsilon!r} is not a finite number > 0")
    elif not math.isclose(scale, laplace_scale(sensitivity, epsilon), rel_tol=1e-12):
        out.append(f"noise scale {scale} is not sensitivity/epsilon = {sensitivity}/{epsilon}")
    return out


SHARED_KEYS = (
    "format", "release_id", "attribute", "domain", "epsilon", "neighbours", "unit",
    "mechanism", "sensitivity", "scale", "parties",
)  # fmt: skip


def combine_shares(
    docs: Sequence[tuple[str, Mapping[str, Any]]], beta: float = 0.05
) -> tuple[MultipartyEstimates, dict[str, Any]]:
    """Check m party files (``(name, document)`` pairs) agree, then sum their shares.

    Every file must carry the same release id, domain, ε, neighbour relation, unit, noise
    and number of parties m, a calibration that is ε-DP for that relation, and each party
    index 0..m−1 exactly once: a duplicate would count a party's persons twice with its
    noise once relative to them (refused, exit 4); a missing party or a mismatch is exit 3.
    Returns the estimates and the common header.
    """
    if not docs:
        raise InputDataError("no party files given; pass every party's party.json")
    first_name, first = docs[0]
    for name, doc in docs:
        if doc.get("format") != PARTY_FORMAT:
            raise InputDataError(
                f"{name}: not a privpipe party file (format {doc.get('format')!r}, expected "
                f"{PARTY_FORMAT!r}); pass the party.json a dp_party_histogram release wrote"
            )
        for key in SHARED_KEYS:
            if doc.get(key) != first.get(key):
                raise InputDataError(
                    f"{name}: {key} is {doc.get(key)!r} but {first_name} has "
                    f"{first.get(key)!r}; every party must run the same release (same "
                    "release_id, domain, epsilon, parties and neighbour relation)"
                )
        try:
            eps, sens, scale = float(doc["epsilon"]), int(doc["sensitivity"]), float(doc["scale"])
        except (KeyError, TypeError, ValueError):
            raise InputDataError(
                f"{name}: epsilon, sensitivity and scale must be numbers; the file is damaged"
            ) from None
        problems = calibration_problems(eps, sens, scale, str(doc.get("neighbours")))
        if problems:
            raise PrivacyRefusal(f"{name}: {'; '.join(problems)}; nothing was aggregated")
    m = int(first.get("parties", 0))
    if m < 1:
        raise InputDataError(f"{first_name}: parties must be >= 1, got {first.get('parties')!r}")
    seen: dict[int, str] = {}
    for name, doc in docs:
        j = doc.get("party")
        if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < m:
            raise InputDataError(f"{name}: party index {j!r} is not in 0..{m - 1}")
        if j in seen:
            raise PrivacyRefusal(
                f"{name}: party {j} was already given ({seen[j]}); a party counted twice "
                "doubles its persons' weight against its noise. Pass each party's file once"
            )
        seen[j] = name
    missing = sorted(set(range(m)) - set(seen))
    if missing:
        raise InputDataError(
            f"party file(s) of party {', '.join(map(str, missing))} missing ({len(seen)} of "
            f"{m} given); the aggregate needs every party's share"
        )
    d = len(first.get("domain") or [])
    order = sorted(range(len(docs)), key=lambda i: int(docs[i][1]["party"]))
    rows = []
    for i in order:
        name, doc = docs[i]
        counts = doc.get("counts")
        if (
            not isinstance(counts, list)
            or len(counts) != d
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in counts)
        ):
            raise InputDataError(f"{name}: counts must be {d} integers, one per domain value")
        rows.append(counts)
    est = sum_shares(np.array(rows, dtype=np.int64), float(first["epsilon"]),
                     int(first["sensitivity"]), beta)  # fmt: skip
    return est, {k: first.get(k) for k in SHARED_KEYS}


def compare_models(
    n: int,
    epsilon: float,
    d: int,
    parties: tuple[int, ...] = (1, 10, 100, 1000),
    protocol: str = "auto",
) -> pd.DataFrame:
    """Per-cell standard error: central (m = 1), m parties, and local DP, at the same ε.

    All three at the same neighbour relation, substitution of one person (that of local DP):
    the central and multiparty rows use L1 = 2.
    """
    rows = [
        {
            "model": "central" if m == 1 else "multiparty",
            "parties": m,
            "variance": multiparty_variance(epsilon, m),
        }
        for m in parties
    ]
    name = choose_protocol(epsilon, d) if protocol == "auto" else protocol
    rows.append(
        {"model": f"local ({name})", "parties": n, "variance": local_variance(n, epsilon, d, name)}
    )
    frame = pd.DataFrame(rows)
    frame["std_error"] = np.sqrt(frame["variance"])
    return frame
