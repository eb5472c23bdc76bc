"""Distributed DP histograms: m parties each noise their own partial histogram, then sum.

The middle ground between central DP (one trusted curator, m = 1) and local DP (every person
is a party): persons are split over m parties (given labels, or evenly); each party counts its
own persons' codes and releases its histogram with discrete Laplace noise of scale L1/ε_j, so
it need trust no one else. A person belongs to one party, so the releases are on disjoint
persons (parallel composition): the whole is max_j ε_j-DP and each person gets ε of their
own party. The aggregator sums the m noisy histograms: unbiased, with variance
Σ_j Var(DLap(L1/ε_j)) = m·Var(DLap(L1/ε)) for equal ε, versus Θ(n/ε²) in the local model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import pandas as pd

from dp.local import choose_protocol
from dp.local import variance as local_protocol_variance
from dp.noise import NoiseSampler, discrete_laplace_variance, laplace_ci_halfwidth, laplace_scale
from privpipe.errors import ConfigError, InputDataError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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


def multiparty_variance(epsilon: float | npt.ArrayLike, m: int = 1, sensitivity: int = 1) -> float:
    """Per-cell variance of the summed histogram: Σ_j Var(DLap(L1/ε_j)); m = 1 is central."""
    eps = _epsilons(epsilon, m)
    return float(sum(discrete_laplace_variance(laplace_scale(sensitivity, e)) for e in eps))


def central_variance(epsilon: float, sensitivity: int = 1) -> float:
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
    sensitivity: int = 1,
    beta: float = 0.05,
) -> MultipartyEstimates:
    """Each party noises its partial histogram with its own ε; the aggregator sums.

    ``parties``: a label per person (any integers; relabelled 0..m−1), or None to split
    evenly into ``m`` parties. ``epsilon``: one value or one per party. ``sensitivity``: the
    L1 change of one party's histogram when a person is added or removed (1 for counts).
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


def noisy_party_sum(
    exact: npt.ArrayLike,
    epsilon: float | npt.ArrayLike,
    sampler: NoiseSampler,
    sensitivity: int = 1,
    beta: float = 0.05,
) -> MultipartyEstimates:
    """Each party's exact m × d partial histogram noised with its own ε, then summed.

    The step of :func:`multiparty_histogram` after counting, for partial histograms
    computed elsewhere (e.g. summed across the batches of a pipeline).
    """
    exact = np.asarray(exact, dtype=np.int64)
    if exact.ndim != 2 or exact.shape[0] < 1:
        raise ConfigError(f"party histograms must be an m x d array, got shape {exact.shape}")
    m = int(exact.shape[0])
    if not 0.0 < beta < 1.0:
        raise ConfigError(f"beta must lie strictly between 0 and 1, got {beta!r}")
    eps = _epsilons(epsilon, m)
    noisy = np.empty_like(exact)
    for j in range(m):  # one vectorised noise call per party (loop over parties, not persons)
        noisy[j] = sampler.discrete_laplace(exact[j], laplace_scale(sensitivity, float(eps[j])))
    var = multiparty_variance(eps, m, sensitivity)
    if m == 1:
        half = float(laplace_ci_halfwidth(laplace_scale(sensitivity, float(eps[0])), beta))
    else:
        half = NormalDist().inv_cdf(1.0 - beta / 2.0) * math.sqrt(var)
    return MultipartyEstimates(noisy.sum(axis=0), noisy, eps, sensitivity, var, half, beta)


def compare_models(
    n: int,
    epsilon: float,
    d: int,
    parties: tuple[int, ...] = (1, 10, 100, 1000),
    protocol: str = "auto",
) -> pd.DataFrame:
    """Per-cell standard error: central (m = 1), m parties, and local DP, at the same ε."""
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
