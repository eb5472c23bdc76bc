"""The exponential mechanism over integer utilities, for ``dp_top_k`` and ``dp_mode``.

Selects index o with P[o] ∝ exp(ε·u(o)/(2Δu)) (McSherry–Talwar 2007), which is ε-DP when
every utility changes by at most Δu between neighbouring datasets. Sampling is OpenDP's
``make_noisy_max`` under ``zero_concentrated_divergence``: report-noisy-max with Gumbel
noise of scale β = 2Δu/ε, whose argmax has exactly the softmax law P[o] ∝ exp(u(o)/β)
(the Gumbel-max trick). OpenDP draws the Gumbel noise and compares noisy scores with exact
arbitrary-precision arithmetic from its CSPRNG, so no float leak; only β is a double.
(Under ``max_divergence`` OpenDP adds exponential noise instead, i.e. permute-and-flip,
a different distribution, so it is not used here.)

``top_k`` peels: k sequential selections with ε/k each, removing the winner each time;
ε-DP in total by basic composition.

With a :class:`~dp.noise.SeededTestSampler` the Gumbel noise comes from its seeded numpy
generator instead: reproducible, for tests and explicitly accepted insecure runs only.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from privpipe.dp.noise import NoiseSampler, SeededTestSampler, _as_int64, _check_positive
from privpipe.errors import ConfigError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@lru_cache(maxsize=256)
def _opendp_gumbel_max(scale: float) -> Any:
    """OpenDP's report-noisy-max with Gumbel noise of ``scale`` over Vec<i64>."""
    from opendp.domains import atom_domain, vector_domain  # core modules, no extras
    from opendp.measurements import make_noisy_max
    from opendp.measures import zero_concentrated_divergence
    from opendp.metrics import linf_distance
    from opendp.mod import enable_features

    enable_features("contrib")
    space = vector_domain(atom_domain(T="i64")), linf_distance(T="i64")
    return make_noisy_max(*space, zero_concentrated_divergence(), scale=scale)


def _utilities(utilities: npt.ArrayLike) -> IntArray:
    if np.size(utilities) == 0:
        raise ValueError("the exponential mechanism needs at least one candidate")
    return _as_int64(utilities)


def gumbel_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """β = 2Δu/ε: Gumbel-max with this scale samples P[o] ∝ exp(ε·u(o)/(2Δu))."""
    return 2.0 * _check_positive("sensitivity", sensitivity) / _check_positive("epsilon", epsilon)


def selection_probabilities(
    utilities: npt.ArrayLike, epsilon: float, sensitivity: float = 1.0
) -> FloatArray:
    """The exact selection law exp(ε·u/(2Δu)) normalised (doubles), for tests and reports."""
    u = _utilities(utilities).astype(np.float64)
    logits = (u - u.max()) / gumbel_scale(epsilon, sensitivity)
    w = np.exp(logits)
    return np.asarray(w / w.sum(), dtype=np.float64)


def exponential_mechanism(
    utilities: npt.ArrayLike,
    epsilon: float,
    sensitivity: float = 1.0,
    sampler: NoiseSampler | None = None,
) -> int:
    """One ε-DP selection: an index drawn with P[o] ∝ exp(ε·u(o)/(2Δu)) (e.g. ``dp_mode``)."""
    u = _utilities(utilities)
    scale = gumbel_scale(epsilon, sensitivity)
    if u.size == 1:
        return 0
    if isinstance(sampler, SeededTestSampler):
        # Insecure, reproducible path: numpy Gumbel-max on the seeded generator.
        noisy = u.astype(np.float64) + sampler._rng.gumbel(0.0, scale, size=u.size)
        return int(np.argmax(noisy))
    return int(_opendp_gumbel_max(scale)(u.tolist()))


def top_k(
    utilities: npt.ArrayLike,
    k: int,
    epsilon: float,
    sensitivity: float = 1.0,
    sampler: NoiseSampler | None = None,
) -> IntArray:
    """k distinct indices in selection order, by peeling k exponential mechanisms at ε/k.

    ε-DP in total (basic composition); ``k`` must lie in [1, number of candidates].
    """
    u = _utilities(utilities)
    eps = _check_positive("epsilon", epsilon)
    _check_positive("sensitivity", sensitivity)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= u.size:
        raise ConfigError(f"k must be an integer in [1, {u.size}], got {k!r}")
    remaining = np.arange(u.size, dtype=np.int64)
    chosen: list[int] = []
    for _ in range(int(k)):
        pick = exponential_mechanism(u[remaining], eps / int(k), sensitivity, sampler)
        chosen.append(int(remaining[pick]))
        remaining = np.delete(remaining, pick)
    return np.asarray(chosen, dtype=np.int64)
