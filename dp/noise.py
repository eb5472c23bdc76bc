"""Released noise for integer queries, and the scale / confidence-interval arithmetic around it.

Every released noise value comes from OpenDP's vetted samplers over integers
(:class:`SecureSampler`): exact discrete Laplace and discrete Gaussian (Canonne, Kamath,
Steinke 2020), so there is no floating-point leak (Mironov 2012). ``numpy.random`` is used
only by :class:`SeededTestSampler`, which is for tests and reproducible insecure runs and is
reachable from the pipeline solely through :func:`sampler_for` with ``allow_insecure=True``.

Conventions: the discrete Laplace with scale ``b`` has P[X = k] ∝ exp(−|k|/b) (two-sided
geometric with p = e^{−1/b}); the discrete Gaussian with ``sigma`` has P[X = k] ∝
exp(−k²/(2σ²)). Scale ``b = L1/ε`` gives ε-DP; ``sigma`` gives ρ = L2²/(2σ²) zCDP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from privpipe.errors import ConfigError

IntArray = npt.NDArray[np.int64]

INSECURE_SEED_MESSAGE = (
    "seeds are for tests only; pass --insecure-seed to accept an insecure run, "
    "which the manifest records"
)

INSECURE_GUARANTEE = "none (insecure seed)"


def honest_document(doc: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """release.json of a run with ``--insecure-seed``: no guarantee, not verified.

    The noise of a seeded run is predictable, so nothing is claimed: ``guarantee`` says
    so, the parameters as planned move to ``planned_guarantee`` and ``verified`` is false
    (the run publishes anyway, for tests: the manifest records the seed)."""
    if seed is None:
        return doc
    out = dict(doc)
    out["planned_guarantee"] = doc.get("guarantee")
    out["guarantee"] = INSECURE_GUARANTEE
    out["verified"] = False
    out["insecure_seed"] = seed
    return out


def planned_guarantee(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The guarantee a release was planned with (also for an insecure-seed run's document)."""
    g = doc.get("planned_guarantee", doc.get("guarantee"))
    return dict(g) if isinstance(g, Mapping) else {}


# Above this sigma the discrete Gaussian's tail is computed from the continuous normal; the
# two differ by O(exp(-2π²σ²)), far below any β a release would use.
_EXACT_GAUSSIAN_TAIL_MAX_SIGMA = 10_000.0


# --------------------------------------------------------------------------- validation


def _check_positive(name: str, value: float) -> float:
    """Return ``value`` as a float if finite and > 0, else raise ConfigError naming it."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(x) or x <= 0.0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return x


def _check_probability(name: str, value: float) -> float:
    """Return ``value`` as a float if it lies strictly inside (0, 1), else raise ConfigError."""
    x = _check_positive(name, value)
    if x >= 1.0:
        raise ConfigError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return x


def _as_int64(values: npt.ArrayLike) -> IntArray:
    """The input cells as a 1-D int64 array; integer queries only (no float leak)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"noise is added to integer cells only, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)


# --------------------------------------------------------------------------- parameters


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Discrete Laplace scale b = L1/ε, which makes an integer query ε-DP."""
    return _check_positive("l1_sensitivity", l1_sensitivity) / _check_positive("epsilon", epsilon)


def gaussian_sigma_for_rho(l2_sensitivity: float, rho: float) -> float:
    """Discrete Gaussian σ = L2/√(2ρ), which makes an integer query ρ-zCDP."""
    l2 = _check_positive("l2_sensitivity", l2_sensitivity)
    return l2 / math.sqrt(2.0 * _check_positive("rho", rho))


def rho_to_epsilon(rho: float, delta: float) -> float:
    """(ε, δ)-DP implied by ρ-zCDP: ε = ρ + 2√(ρ ln(1/δ)) (Bun–Steinke 2016)."""
    r = _check_positive("rho", rho)
    d = _check_probability("delta", delta)
    return r + 2.0 * math.sqrt(r * math.log(1.0 / d))


def discrete_laplace_p(scale: float) -> float:
    """The geometric ratio p = e^{−1/b} of the discrete Laplace with scale b."""
    return math.exp(-1.0 / _check_positive("scale", scale))


def discrete_laplace_variance(scale: float) -> float:
    """Exact variance 2p/(1−p)² of the discrete Laplace with scale b (p = e^{−1/b})."""
    p = discrete_laplace_p(scale)
    q = -math.expm1(-1.0 / scale)  # 1 − p
    return 2.0 * p / (q * q) if q > 1e-150 else 2.0 * scale * scale  # (q² would underflow)


def laplace_tail(scale: float, t: int) -> float:
    """Exact P(|X| > t) for the discrete Laplace with scale b: 2p^{t+1}/(1+p), t ≥ 0.

    p^{t+1} is computed as e^{−(t+1)/b}: p itself rounds to 1.0 for b ≳ 1e16."""
    if t < 0:
        return 1.0
    p = discrete_laplace_p(scale)
    return 2.0 * math.exp(-(t + 1) / scale) / (1.0 + p)


# above this, t and t ± 1 are no longer distinct floats: no exact fix-up, a safety margin
_EXACT_HALFWIDTH_MAX = 2**50


def laplace_ci_halfwidth(scale: float, beta: float = 0.05) -> int:
    """Smallest integer t with P(|X| > t) ≤ β for discrete Laplace noise X (exact).

    A released cell ± t then covers the true value with probability ≥ 1−β. For huge scales
    (t beyond 2^50) the closed form is rounded up by a relative 1e-9, still a valid bound.
    """
    b = _check_positive("scale", scale)
    be = _check_probability("beta", beta)
    p = discrete_laplace_p(b)
    if laplace_tail(b, 0) <= be:  # also covers p underflowing to 0 for tiny scales
        return 0
    # 2p^{t+1}/(1+p) ≤ β  ⇔  t+1 ≥ −b·ln(β(1+p)/2)  (ln p = −1/b exactly, never divided by)
    need = -b * math.log(be * (1.0 + p) / 2.0)
    if need > _EXACT_HALFWIDTH_MAX:
        return math.ceil(need * (1.0 + 1e-9))
    t = max(0, math.ceil(need) - 1)
    while t > 0 and laplace_tail(b, t - 1) <= be:
        t -= 1
    while laplace_tail(b, t) > be:
        t += 1
    return t


def gaussian_ci_halfwidth(sigma: float, beta: float = 0.05) -> int:
    """Smallest integer t with P(|X| > t) ≤ β for discrete Gaussian noise X.

    Exact (normalised pmf summed over |k| ≤ 40σ) for σ ≤ 10⁴; above that the continuous
    normal quantile, rounded up, which differs by a negligible O(e^{−2π²σ²}).
    """
    s = _check_positive("sigma", sigma)
    be = _check_probability("beta", beta)
    if s > _EXACT_GAUSSIAN_TAIL_MAX_SIGMA:
        return math.ceil(NormalDist().inv_cdf(1.0 - be / 2.0) * s)
    k = np.arange(0, math.ceil(40.0 * s) + 2, dtype=np.float64)
    w = np.exp(-(k**2) / (2.0 * s * s))
    total = w[0] + 2.0 * w[1:].sum()
    # tail[t] = P(|X| > t) = 2 Σ_{k > t} w_k / total
    upper = np.cumsum(w[::-1])[::-1]  # upper[t] = Σ_{k ≥ t} w_k
    tail = 2.0 * np.append(upper[1:], 0.0) / total
    return int(np.argmax(tail <= be))


# --------------------------------------------------------------------------- samplers


class NoiseSampler(Protocol):
    """Adds integer noise to each integer cell; one vectorised call per batch of cells."""

    def discrete_laplace(self, values: IntArray, scale: float) -> IntArray:
        """values + discrete Laplace(scale) noise, independently per cell."""
        ...

    def discrete_gaussian(self, values: IntArray, sigma: float) -> IntArray:
        """values + discrete Gaussian(sigma) noise, independently per cell."""
        ...


@lru_cache(maxsize=256)
def _opendp_vector_measurement(kind: str, scale: float) -> Any:
    """An OpenDP measurement adding noise to a Vec<i64> (built once per kind and scale)."""
    # OpenDP's core modules only: opendp.prelude also imports its extras (sklearn, polars,
    # numpy helpers), 60 ms of a short run, none of which a sampler needs
    from opendp.domains import atom_domain, vector_domain
    from opendp.measurements import make_gaussian, make_laplace
    from opendp.metrics import l1_distance, l2_distance
    from opendp.mod import enable_features

    enable_features("contrib")
    domain = vector_domain(atom_domain(T="i64"))
    if kind == "laplace":
        return make_laplace(domain, l1_distance(T="i64"), scale=scale)
    return make_gaussian(domain, l2_distance(T="i64"), scale=scale)


class SecureSampler:
    """The production sampler: OpenDP's exact integer samplers (CSPRNG-backed, vetted).

    Holds no state, so it pickles to Beam workers; measurements are rebuilt per process.
    Results saturate at the int64 bounds (OpenDP's arithmetic), far beyond any count.
    """

    def _release(self, kind: str, values: IntArray, scale: float) -> IntArray:
        cells = _as_int64(values)
        if cells.size == 0:
            return cells.copy()
        measurement = _opendp_vector_measurement(kind, scale)
        return np.asarray(measurement(cells.tolist()), dtype=np.int64)

    def discrete_laplace(self, values: IntArray, scale: float) -> IntArray:
        """values + discrete Laplace(scale) from OpenDP ``make_laplace`` over Vec<i64>."""
        return self._release("laplace", values, _check_positive("scale", scale))

    def discrete_gaussian(self, values: IntArray, sigma: float) -> IntArray:
        """values + discrete Gaussian(sigma) from OpenDP ``make_gaussian`` over Vec<i64>."""
        return self._release("gaussian", values, _check_positive("sigma", sigma))

    def __repr__(self) -> str:
        return "SecureSampler()"


class SeededTestSampler:
    """Reproducible sampler on a seeded numpy Generator. NOT for release: tests only.

    Same distributions as :class:`SecureSampler`: discrete Laplace as the difference of two
    i.i.d. geometrics, discrete Gaussian by the rejection sampler of Canonne–Kamath–Steinke
    (2020, Alg. 3) with float acceptance probabilities. numpy's PRNG is predictable and its
    float arithmetic is not exact, so outputs carry no DP guarantee.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def _laplace_noise(self, n: int, scale: float) -> IntArray:
        # X − Y with X, Y ~ Geometric(1−p) i.i.d. has P[k] ∝ p^{|k|}, p = e^{−1/b}.
        q = -math.expm1(-1.0 / scale)  # 1 − p, accurate for large scales
        g1 = self._rng.geometric(q, size=n)
        g2 = self._rng.geometric(q, size=n)
        return (g1 - g2).astype(np.int64)

    def _gaussian_noise(self, n: int, sigma: float) -> IntArray:
        # CKS20: Y ~ DLap(t), t = ⌊σ⌋+1; accept w.p. exp(−(|Y| − σ²/t)² / (2σ²)).
        t = math.floor(sigma) + 1
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while todo.size:
            y = self._laplace_noise(todo.size, float(t))
            accept_p = np.exp(-((np.abs(y) - sigma * sigma / t) ** 2) / (2.0 * sigma * sigma))
            ok = self._rng.random(todo.size) < accept_p
            out[todo[ok]] = y[ok]
            todo = todo[~ok]
        return out

    def discrete_laplace(self, values: IntArray, scale: float) -> IntArray:
        """values + discrete Laplace(scale) noise (insecure, reproducible)."""
        cells = _as_int64(values)
        return cells + self._laplace_noise(cells.size, _check_positive("scale", scale))

    def discrete_gaussian(self, values: IntArray, sigma: float) -> IntArray:
        """values + discrete Gaussian(sigma) noise (insecure, reproducible)."""
        cells = _as_int64(values)
        return cells + self._gaussian_noise(cells.size, _check_positive("sigma", sigma))

    def __repr__(self) -> str:
        return f"SeededTestSampler(seed={self.seed!r})"


def sampler_for(seed: int | None, allow_insecure: bool) -> NoiseSampler:
    """The one seam choosing the noise source: OpenDP unless a seed is explicitly accepted.

    ``seed=None`` gives the :class:`SecureSampler`. A seed gives a reproducible but
    insecure :class:`SeededTestSampler`, and only with ``allow_insecure=True`` (the CLI's
    ``--insecure-seed``; the manifest records it); otherwise ConfigError.
    """
    if seed is None:
        return SecureSampler()
    if not allow_insecure:
        raise ConfigError(INSECURE_SEED_MESSAGE)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    return SeededTestSampler(int(seed))
