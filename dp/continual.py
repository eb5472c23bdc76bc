"""Continual observation: the binary tree mechanism for running counts over T periods.

A stream has T periods (rounded up to a power of two) and L = log2(T) + 1 tree levels. The
level-j node covering periods ((k−1)·2^j, k·2^j] is closed at period k·2^j; it is *released*
(noised once, then reused) only when k is odd, because the cumulative count up to t is the
sum of the released nodes at the set bits of t (≤ L nodes; popcount(t) of them). A
period's count x_t (an integer, or a vector of per-cell counts) lies in one node per level,
so with per-period L1 contribution ``sensitivity`` each node gets discrete Laplace noise of
scale b = L·sensitivity/ε and the whole stream of T releases is ε-DP (Dwork et al. 2010;
Chan et al. 2011). Error variance at t: popcount(t)·Var(DLap(b)).

State (:class:`TreeState`): one *open* node per level (the node containing the next period)
and the released nodes still needed (the set bits of t). Raw period counts are never kept.

- Standard mode: open nodes hold raw partial sums; noise is drawn when a node is released.
  The state is then as sensitive as the data (keep it with the data).
- Pan-private mode (Dwork et al. 2010): a node is created holding X = N + Σx with fresh
  noise N ~ DLap(b) drawn at creation; x_t is folded into every open X and then discarded,
  and N is never stored on its own (it exists only inside X). On release the node gets a
  second, fresh DLap(b), so an intruder who reads the state once (seeing N + a) and all
  releases (N + a + b_rest + N') learns each contribution only through one DLap(b): the
  state and the releases together stay ε-DP. Cost: twice the release variance.

:class:`TreeCounter` is the in-memory counter; :mod:`dp.state_store` persists a
:class:`TreeState` in SQLite between scheduled runs, with the refusals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dp.noise import NoiseSampler, discrete_laplace_variance, laplace_ci_halfwidth
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

IntArray = npt.NDArray[np.int64]

MAX_HORIZON = 1 << 40


# --------------------------------------------------------------------------- arithmetic


def round_horizon(horizon: int) -> int:
    """T rounded up to a power of two (≥ 1)."""
    if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
        raise ConfigError(f"the number of periods T must be an integer >= 1, got {horizon!r}")
    if horizon > MAX_HORIZON:
        raise ConfigError(f"the number of periods T must be <= 2^40, got {horizon}")
    return 1 << (int(horizon) - 1).bit_length()


def tree_levels(horizon: int) -> int:
    """L = log2(T) + 1 levels, leaves (level 0) to the root (level log2 T)."""
    return round_horizon(horizon).bit_length()


def node_scale(horizon: int, epsilon: float, sensitivity: int = 1) -> float:
    """Per-node discrete Laplace scale b = L·sensitivity/ε (each count lies in L nodes)."""
    eps = float(epsilon)
    if not math.isfinite(eps) or eps <= 0:
        raise ConfigError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, int) or sensitivity < 1:
        raise ConfigError(f"sensitivity must be an integer >= 1, got {sensitivity!r}")
    return tree_levels(horizon) * sensitivity / eps


def nodes_used(period: int) -> list[int]:
    """The levels whose released nodes sum to the count up to ``period`` (its set bits)."""
    return [j for j in range(period.bit_length()) if period >> j & 1]


def noise_terms(period: int, pan_private: bool) -> int:
    """How many independent DLap(b) terms the release at ``period`` carries."""
    return period.bit_count() * (2 if pan_private else 1)


def release_variance(
    period: int, horizon: int, epsilon: float, sensitivity: int = 1, pan_private: bool = False
) -> float:
    """Per-cell error variance of the release at ``period``: terms · Var(DLap(b))."""
    b = node_scale(horizon, epsilon, sensitivity)
    return noise_terms(period, pan_private) * discrete_laplace_variance(b)


def release_halfwidth(
    period: int,
    horizon: int,
    epsilon: float,
    sensitivity: int = 1,
    pan_private: bool = False,
    beta: float = 0.05,
) -> int:
    """A (1−β) error bound per cell: k terms each within their β/k tail (union bound, exact)."""
    b = node_scale(horizon, epsilon, sensitivity)
    k = noise_terms(period, pan_private)
    return k * laplace_ci_halfwidth(b, beta / k) if k else 0


# --------------------------------------------------------------------------- state


@dataclass
class TreeState:
    """Everything needed to continue a stream; ``open_nodes``/``released`` map level → cells.

    In pan-private mode every value held is noisy (X = N + Σx, or a released node).
    """

    horizon: int
    epsilon: float
    cells: int
    sensitivity: int = 1
    pan_private: bool = False
    period: int = 0
    open_nodes: dict[int, IntArray] = field(default_factory=dict)
    released: dict[int, IntArray] = field(default_factory=dict)

    @property
    def levels(self) -> int:
        return tree_levels(self.horizon)

    @property
    def scale(self) -> float:
        return node_scale(self.horizon, self.epsilon, self.sensitivity)

    @property
    def finished(self) -> bool:
        return self.period >= self.horizon


@dataclass(frozen=True, eq=False)
class ContinualRelease:
    """The noisy cumulative count(s) up to ``period`` and their error."""

    period: int
    counts: IntArray
    variance: float
    halfwidth: int
    levels_used: tuple[int, ...]


def start(
    horizon: int,
    epsilon: float,
    sampler: NoiseSampler,
    cells: int = 1,
    sensitivity: int = 1,
    pan_private: bool = False,
) -> TreeState:
    """A fresh stream: T rounded up; open nodes empty (standard) or pure noise (pan-private)."""
    t = round_horizon(horizon)
    if isinstance(cells, bool) or not isinstance(cells, int) or cells < 1:
        raise ConfigError(f"cells must be an integer >= 1, got {cells!r}")
    state = TreeState(t, float(epsilon), cells, sensitivity, pan_private)
    b = state.scale  # validates epsilon and sensitivity
    levels = list(range(state.levels))
    state.open_nodes = _fresh(levels, cells, b, sampler, pan_private)
    return state


def _fresh(
    levels: list[int], cells: int, scale: float, sampler: NoiseSampler, pan_private: bool
) -> dict[int, IntArray]:
    """New open nodes: zeros, or (pan-private) X = N with N drawn now and never kept alone."""
    zeros = np.zeros(len(levels) * cells, dtype=np.int64)
    values = sampler.discrete_laplace(zeros, scale) if pan_private and levels else zeros
    block = values.reshape(len(levels), cells)
    return {j: block[i].copy() for i, j in enumerate(levels)}


def _period_counts(count: int | npt.ArrayLike, cells: int) -> IntArray:
    arr = np.asarray(count)
    if arr.dtype.kind not in "iub":
        raise InputDataError(f"a period's counts must be integers, got dtype {arr.dtype}")
    flat = np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)
    if flat.size != cells:
        raise InputDataError(f"the stream has {cells} cell(s) per period, got {flat.size} counts")
    return flat


def check_period(state: TreeState, period: int, stream: str = "the stream") -> None:
    """Refuse (PrivacyRefusal) anything but the next period, within T."""
    if isinstance(period, bool) or not isinstance(period, int | np.integer):
        raise ConfigError(f"a period must be an integer, got {period!r}")
    period = int(period)
    if period < 1:
        raise ConfigError(f"periods are numbered from 1, got {period}")
    if period > state.horizon:
        raise PrivacyRefusal(
            f"period {period} of {stream} exceeds its horizon T = {state.horizon}: the budget "
            "covers T periods only; start a new stream (new id) for later periods"
        )
    if period <= state.period:
        raise PrivacyRefusal(
            f"period {period} of {stream} was already released (last released period: "
            f"{state.period}); re-running a period would spend the budget twice and is refused"
        )
    if period > state.period + 1:
        raise PrivacyRefusal(
            f"period {period} of {stream} cannot be released before period "
            f"{state.period + 1}: periods must be released in order, none skipped (release "
            "a zero count for a period without data)"
        )


def advance(
    state: TreeState,
    period: int,
    count: int | npt.ArrayLike,
    sampler: NoiseSampler,
    beta: float = 0.05,
    stream: str = "the stream",
) -> tuple[TreeState, ContinualRelease]:
    """Add period ``period``'s count(s) and release the noisy cumulative count(s) up to it.

    Returns the new state (the input state is not modified) and the release.
    """
    check_period(state, period, stream)
    t = int(period)
    x = _period_counts(count, state.cells)
    b = state.scale
    open_nodes = {j: v + x for j, v in state.open_nodes.items()}  # x_t is not kept
    low = (t & -t).bit_length() - 1  # the one level released now (lowest set bit of t)
    node = open_nodes[low]
    released = {j: v for j, v in state.released.items() if t >> j & 1}
    # Standard: the node's only noise. Pan-private: a fresh second noise on top of X.
    released[low] = sampler.discrete_laplace(node, b)
    closed = list(range(low + 1))  # every level ≤ low closes at t
    for j in closed:
        del open_nodes[j]
    if t < state.horizon:
        open_nodes.update(_fresh(closed, state.cells, b, sampler, state.pan_private))
    used = tuple(nodes_used(t))
    total = np.zeros(state.cells, dtype=np.int64)
    for j in used:
        total += released[j]
    new = TreeState(
        state.horizon,
        state.epsilon,
        state.cells,
        state.sensitivity,
        state.pan_private,
        t,
        open_nodes,
        released,
    )
    var = release_variance(t, state.horizon, state.epsilon, state.sensitivity, state.pan_private)
    half = release_halfwidth(
        t, state.horizon, state.epsilon, state.sensitivity, state.pan_private, beta
    )
    return new, ContinualRelease(t, total, var, half, used)


class TreeCounter:
    """An in-memory binary-tree counter: ``release(period, count)`` for periods 1..T in order."""

    def __init__(
        self,
        horizon: int,
        epsilon: float,
        sampler: NoiseSampler,
        cells: int = 1,
        sensitivity: int = 1,
        pan_private: bool = False,
        beta: float = 0.05,
    ) -> None:
        self._sampler = sampler
        self.beta = beta
        self.state = start(horizon, epsilon, sampler, cells, sensitivity, pan_private)

    @property
    def period(self) -> int:
        """The last released period (0 before the first)."""
        return self.state.period

    @property
    def horizon(self) -> int:
        return self.state.horizon

    def release(self, period: int, count: int | npt.ArrayLike) -> ContinualRelease:
        """Add the period's count(s); return the noisy cumulative count(s) up to it."""
        self.state, out = advance(self.state, period, count, self._sampler, self.beta)
        return out

    def update(self, count: int | npt.ArrayLike) -> ContinualRelease:
        """Release the next period."""
        return self.release(self.state.period + 1, count)

    def variance(self, period: int) -> float:
        s = self.state
        return release_variance(period, s.horizon, s.epsilon, s.sensitivity, s.pan_private)
