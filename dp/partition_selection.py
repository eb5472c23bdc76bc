"""Private partition selection: release a key seen in the data only if enough units back it.

When the key domain is not public, publishing the set of keys present is itself a release:
a key contributed by one unit reveals that unit. Each key's count of DISTINCT privacy units
(every unit contributes to at most ``L0 = max_partitions`` keys) decides whether the key is
kept, so that a key from a single unit is kept with probability ≤ δ/L0 and the keys of one
unit are all dropped with probability ≥ 1 − δ (union bound). Keys with n ≤ 0 are never kept.

Two methods (both (ε, δ)-DP for the released set of keys):

``"laplace"``
    Laplace thresholding: keep iff n + X ≥ τ, X discrete Laplace of scale b = L0/ε (the
    unit-count vector has L1 sensitivity L0). τ is the smallest integer with
    P[1 + X ≥ τ] ≤ δ/L0, from the exact discrete Laplace tail P[X ≥ k] = p^k/(1+p) for
    k ≥ 1 and 1 − p^{1−k}/(1+p) for k ≤ 0 (p = e^{−1/b}). Keys present on both sides are
    ε-DP by the Laplace mechanism; the ≤ L0 keys that only one unit backs cost δ/L0 each.
``"truncated_geometric"``
    The optimal mechanism of Desfontaines, Voss, Gipson, Mandayam (2022, PETS),
    "Differentially private partition selection", Thm. 1: keep with probability π(n),
    computed with ε' = ε/L0 and δ' = δ/L0 (basic composition over a unit's L0 keys)::

        n* = 1 + ⌊ln(1 + tanh(ε'/2)(1/δ' − 1)) / ε'⌋
        m* = ⌊ln(1 + (e^{ε'} − 1)(1 − π(n*))/δ') / ε'⌋
        π(n) = 0                                                   n ≤ 0
        π(n) = δ'(e^{nε'} − 1)/(e^{ε'} − 1)                        1 ≤ n ≤ n*
        π(n) = π(n*) + (1 − π(n*) + δ'/(e^{ε'} − 1))(1 − e^{−(n−n*)ε'})   n* < n ≤ n* + m*
        π(n) = 1                                                   n > n* + m*

    It is the pointwise-largest π with π(n) ≤ e^{ε'}π(n−1) + δ' and
    1 − π(n−1) ≤ e^{ε'}(1 − π(n)) + δ' (the same as Google's
    NearTruncatedGeometricPartitionSelection, which uses 1 − (1−δ)^{1/L0} ≥ δ/L0).

δ composition over L0 keys: this module uses δ/L0 per key (and ε/L0 for the truncated
geometric), the simple union-bound / basic-composition analysis, not the tighter
per-unit analysis of Desfontaines et al. §5.

Randomness: the Laplace method draws from ``sampler.discrete_laplace`` (OpenDP's exact
sampler in production). The truncated geometric samples Bernoulli(π(n)) exactly for the
double π(n): it compares fair bits, lazily, to the finite binary expansion of π(n) (expected
two bits per key); each fair bit is the sign of a nonzero draw of ``sampler.discrete_laplace``
(exactly fair by symmetry of the exact sampler). No float uniform, no ``numpy.random``.
The π and τ arithmetic is double precision (relative error ~1e−15 on probabilities).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from privpipe.dp.accounting import expm1_ratio, log_expm1
from privpipe.dp.noise import NoiseSampler, _as_int64, _check_positive, _check_probability
from privpipe.errors import ConfigError

Method = Literal["laplace", "truncated_geometric"]
METHODS: tuple[str, ...] = ("laplace", "truncated_geometric")

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

# Fair bits are signs of nonzero discrete Laplace draws at this scale: P[X ≠ 0] ≈ 0.98.
_COIN_SCALE = 64.0
_P_NONZERO = 0.98


# --------------------------------------------------------------------------- validation


def _check_params(epsilon: float, delta: float, max_partitions: int) -> tuple[float, float, int]:
    """Validated (ε, δ, L0): ε finite > 0, 0 < δ < 1, L0 a positive integer (ConfigError)."""
    eps = _check_positive("epsilon", epsilon)
    dlt = _check_probability("delta", delta)
    if isinstance(max_partitions, bool) or not isinstance(max_partitions, int | np.integer):
        raise ConfigError(f"max_partitions must be a positive integer, got {max_partitions!r}")
    if max_partitions < 1:
        raise ConfigError(f"max_partitions must be a positive integer, got {max_partitions!r}")
    return eps, dlt, int(max_partitions)


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"partition selection method must be one of {METHODS}, got {method!r}")
    return method


# --------------------------------------------------------------------------- Laplace thresholding


def _dlap_log_tail_ge(scale: float, k: int) -> float:
    """ln P[X ≥ k] for the discrete Laplace with scale b (exact formula, double arithmetic)."""
    p = math.exp(-1.0 / scale)
    if k >= 1:
        return -k / scale - math.log1p(p)
    return math.log1p(-math.exp((k - 1) / scale) / (1.0 + p))


def laplace_threshold(epsilon: float, delta: float, max_partitions: int) -> int:
    """Smallest integer τ with P[1 + X ≥ τ] ≤ δ/L0, X ~ discrete Laplace(L0/ε)."""
    eps, dlt, l0 = _check_params(epsilon, delta, max_partitions)
    scale = l0 / eps
    log_target = math.log(dlt / l0)
    p = math.exp(-1.0 / scale)
    # p^k/(1+p) ≤ δ'  ⇔  k ≥ (ln δ' + ln(1+p)) · b ; then fix rounding with exact tail checks.
    k = max(1, math.ceil((log_target + math.log1p(p)) * scale))
    while _dlap_log_tail_ge(scale, k - 1) <= log_target:
        k -= 1
    while _dlap_log_tail_ge(scale, k) > log_target:
        k += 1
    return k + 1  # τ − 1 = k


# --------------------------------------------------------------------------- truncated geometric


def _truncated_geometric_pi(n: npt.NDArray[np.int64], eps: float, dlt: float) -> FloatArray:
    """π(n) of Desfontaines et al. (2022) Thm. 1 for (ε, δ) per key, vectorised."""
    # log space where e^{nε} would overflow (large ε): any finite ε works
    log_em1 = log_expm1(eps)
    em1 = math.expm1(eps) if eps <= 700.0 else math.inf
    n_star = 1 + math.floor(math.log1p(math.tanh(eps / 2.0) * (1.0 / dlt - 1.0)) / eps)
    pi_star = min(1.0, dlt * expm1_ratio(n_star * eps, eps))
    if pi_star >= 1.0:
        m_star = 0
    else:
        x = log_em1 + math.log1p(-pi_star) - math.log(dlt)  # ln(em1 (1 − π*) / δ)
        m_star = math.floor((math.log1p(math.exp(x)) if x <= 700.0 else x) / eps)
    nf = n.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = np.maximum(np.minimum(nf, n_star), 1.0) * eps
        log_num = np.where(a > 700.0, a + np.log1p(-np.exp(-a)), np.log(np.expm1(a)))
        low = np.exp(np.minimum(math.log(dlt) + log_num - log_em1, 0.0))
        m = np.maximum(nf - n_star, 0.0)
        mid = pi_star - (1.0 - pi_star + dlt / em1) * np.expm1(-m * eps)
    pi = np.where(nf <= n_star, low, np.where(nf <= n_star + m_star, mid, 1.0))
    pi = np.where(nf <= 0, 0.0, pi)
    return np.clip(pi, 0.0, 1.0).astype(np.float64)


def _fair_bits(sampler: NoiseSampler, count: int) -> npt.NDArray[np.int64]:
    """``count`` exactly fair bits: signs of nonzero discrete Laplace draws from ``sampler``."""
    bits: list[npt.NDArray[np.int64]] = []
    have = 0
    while have < count:
        need = count - have
        draws = sampler.discrete_laplace(
            np.zeros(math.ceil(need / _P_NONZERO) + 8, dtype=np.int64), _COIN_SCALE
        )
        signs = (draws[draws != 0] > 0).astype(np.int64)
        bits.append(signs)
        have += signs.size
    return np.concatenate(bits)[:count]


def bernoulli(probabilities: npt.ArrayLike, sampler: NoiseSampler) -> BoolArray:
    """Exact Bernoulli(π) per entry for double π ∈ [0, 1], from fair bits of ``sampler``.

    Draws U = 0.u₁u₂… lazily and keeps iff U < π: at the first bit where uⱼ differs from
    πⱼ (π's finite binary expansion), keep iff uⱼ = 0, πⱼ = 1; past π's last bit, U ≥ π.
    """
    pi = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if np.any(~np.isfinite(pi)) or np.any(pi < 0.0) or np.any(pi > 1.0):
        raise ValueError("probabilities must lie in [0, 1]")
    out = pi >= 1.0
    todo = np.flatnonzero((pi > 0.0) & (pi < 1.0))
    if todo.size == 0:
        return out
    # π = mant / 2^expo exactly, mant < 2^53; bit j (1-based) of π is (mant >> (expo − j)) & 1.
    mant_exp = [pi[i].item().as_integer_ratio() for i in todo]
    mant = np.array([m for m, _ in mant_exp], dtype=np.int64)
    expo = np.array([d.bit_length() - 1 for _, d in mant_exp], dtype=np.int64)
    j = 0
    while todo.size:
        j += 1
        shift = expo - j
        pi_bit = np.where(
            (shift >= 0) & (shift < 63), (mant >> np.clip(shift, 0, 62)) & 1, 0
        ).astype(np.int64)
        past_end = shift < 0  # all remaining bits of π are 0, so U ≥ π: drop
        u = _fair_bits(sampler, int(todo.size))
        keep = ~past_end & (u < pi_bit)
        decided = past_end | (u != pi_bit)
        out[todo[keep]] = True
        undecided = ~decided
        todo, mant, expo = todo[undecided], mant[undecided], expo[undecided]
    return out


# --------------------------------------------------------------------------- public API


def keep_probability(
    n_units: npt.ArrayLike,
    epsilon: float,
    delta: float,
    max_partitions: int = 1,
    method: Method = "truncated_geometric",
) -> FloatArray:
    """Exact probability (in doubles) that a key with ``n_units`` distinct units is kept."""
    eps, dlt, l0 = _check_params(epsilon, delta, max_partitions)
    n = _as_int64(n_units)
    if _check_method(method) == "truncated_geometric":
        return _truncated_geometric_pi(n, eps / l0, dlt / l0)
    tau = laplace_threshold(eps, dlt, l0)
    scale = l0 / eps
    probs = [0.0 if k <= 0 else math.exp(_dlap_log_tail_ge(scale, tau - k)) for k in n.tolist()]
    return np.asarray(probs, dtype=np.float64)


def select_partitions(
    unit_counts: npt.ArrayLike,
    epsilon: float,
    delta: float,
    max_partitions: int,
    method: Method,
    sampler: NoiseSampler,
) -> BoolArray:
    """Keep mask over keys from their distinct-unit counts; (ε, δ)-DP for the kept key set.

    ``unit_counts[i]`` is the number of distinct units contributing to key i, each unit
    bounded to ≤ ``max_partitions`` keys upstream. Keys with a count ≤ 0 are never kept.
    """
    eps, dlt, l0 = _check_params(epsilon, delta, max_partitions)
    n = _as_int64(unit_counts)
    if _check_method(method) == "truncated_geometric":
        return bernoulli(_truncated_geometric_pi(n, eps / l0, dlt / l0), sampler)
    tau = laplace_threshold(eps, dlt, l0)
    if n.size == 0:
        return np.zeros(0, dtype=np.bool_)
    noisy = sampler.discrete_laplace(n, l0 / eps)
    return np.asarray((noisy >= tau) & (n > 0), dtype=np.bool_)
