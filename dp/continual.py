"""Continual observation: the binary tree mechanism for running counts over T periods.

A stream has T periods (rounded up to a power of two) and L = log2(T) + 1 tree levels. The
level-j node covers periods ((k−1)·2^j, k·2^j] and closes at period k·2^j.

Privacy unit (``sensitivity`` below is the L1 bound the tree is calibrated to):

- event level: one person's rows of ONE period change one leaf x_t by at most
  c = L0·Linf (per-cell L1); ``sensitivity = c``. A person present in k periods is
  protected at k·ε only, so the ledger records the stream as an event-level entry.
- person level (:func:`person_l1_bound`): a person present in at most m periods changes
  at most m leaves by ≤ c each; ``sensitivity = m·c`` and the whole stream is ε-DP for
  that person.

Standard mode: node v is released as sum(v) + η_v with η_v ~ DLap(b), b = L·sensitivity/ε,
drawn when v closes; the count up to t is the sum of the released nodes at the set bits of
t (Dwork et al. 2010; Chan et al. 2011). The state holds the raw partial sums of open nodes:
it is as sensitive as the data (keep it with the data).

Pan-private mode (PPCum; Dwork et al. 2010): the state after period t holds exactly
X_t = N + x_1 + … + x_t (N ~ DLap(b), drawn at the start, never stored on its own) and
the noise η_j of the open node of every level j ≥ 1 (the node containing t+1), per cell;
nothing else — no raw count, no past state, no digest. Period t adds x_t to X and
releases o_t = X_t + η_0(t) + Σ_{j≥1} η_j(t): the noise of every node containing t,
where the leaf noise η_0(t) is drawn fresh at release and never stored; noise of nodes
closing at t is then erased and replaced by fresh noise for the next node of that level.
See :func:`pan_private_shift` for the proof that the releases together with ONE reading
of the state (an unannounced intrusion) are ε-DP. Error: L + 1 DLap(b) terms per release
(N and one node per level), so O(log^1.5 T/ε) like the standard tree. Two readings of
the state at t1 < t2 reveal X_t2 − X_t1 = x_t1+1 + … + x_t2 exactly: pan-privacy holds
against one intrusion, not continual surveillance of the file (the textbook limit).

:class:`TreeCounter` is the in-memory counter; :mod:`dp.state_store` persists a
:class:`TreeState` between scheduled runs, authenticated and rollback-checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from privpipe.dp.noise import NoiseSampler, discrete_laplace_variance, laplace_ci_halfwidth
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


def person_l1_bound(horizon: int, max_periods: int, per_period: int) -> int:
    """L1 bound of the vector of ALL node values for one person: m·c·L.

    Proof. A person present in at most m = ``max_periods`` periods changes at most m leaves
    x_t, each by at most c = ``per_period`` in L1 (over cells). Every leaf lies in exactly
    one node per level, and a node's value is the sum of its leaves, so by the triangle
    inequality the L1 change of level j's nodes is at most Σ_t |Δx_t|_1 ≤ m·c — at most m
    nodes of the level change. Summing over the L levels: ‖Δ(node values)‖_1 ≤ m·c·L.
    Calibrating every node to DLap(b) with b = m·c·L/ε (``node_scale(T, ε, m·c)``) makes the
    vector of noisy nodes — hence every release derived from it — ε-DP for that person.
    With m = 1 it is the event-level bound c·L.
    """
    levels = tree_levels(horizon)
    for name, v in (("max_periods", max_periods), ("per_period", per_period)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if max_periods > round_horizon(horizon):
        raise ConfigError(
            f"max_periods {max_periods} exceeds the horizon {horizon}: a person can appear "
            "in at most T periods"
        )
    return max_periods * per_period * levels


def stream_sensitivity(per_period: int, unit: str, max_periods: int = 1) -> int:
    """The per-leaf L1 the tree is calibrated to: c (event) or m·c (person, m periods)."""
    if unit == "event":
        return per_period
    if unit == "person":
        return per_period * max_periods
    raise ConfigError(f"unit must be 'event' or 'person', got {unit!r}")


def nodes_used(period: int) -> list[int]:
    """Standard mode: the levels whose released nodes sum to the count up to ``period``."""
    return [j for j in range(period.bit_length()) if period >> j & 1]


def noise_terms(period: int, horizon: int, pan_private: bool) -> int:
    """How many independent DLap(b) terms the release at ``period`` carries.

    Standard: one per set bit of t. Pan-private: N plus one node per level (L + 1).
    """
    return tree_levels(horizon) + 1 if pan_private else period.bit_count()


def release_variance(
    period: int, horizon: int, epsilon: float, sensitivity: int = 1, pan_private: bool = False
) -> float:
    """Per-cell error variance of the release at ``period``: terms · Var(DLap(b))."""
    b = node_scale(horizon, epsilon, sensitivity)
    return noise_terms(period, horizon, pan_private) * discrete_laplace_variance(b)


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
    k = noise_terms(period, horizon, pan_private)
    return k * laplace_ci_halfwidth(b, beta / k) if k else 0


def pan_private_shift(horizon: int, event: int, seen: int) -> tuple[int, list[tuple[int, int]]]:
    """The noise shift that hides a change Δ of x_``event`` from an intruder who read the
    pan-private state after period ``seen`` (1..T) and holds every release.

    Returns (sign of N's shift, nodes as (level, last period)): with N → N + sign·Δ and every
    listed node's noise η → η − Δ (suffix case) or η + Δ (prefix case, sign = −1), the
    intruder's whole view is identical for x and x + Δ·e_event. Proof (per cell): the view
    is X_seen = N + S_seen, the stored noises η_j of the nodes containing seen + 1 (j ≥ 1),
    and o_s = N + S_s + Σ_j η_j(s) for every s (η_j(s): the level-j node containing s).

    - event ≤ seen: N → N − Δ keeps X_seen; every o_s then moves by −Δ for s < event only,
      which the nodes of the dyadic cover of [1, event−1] undo (+Δ each). Those nodes end
      before ``seen`` + 1, so none of their noise is in the state. ≤ L − 1 nodes.
    - event > seen: N is kept; o_s moves by +Δ for s ≥ event, undone (−Δ each) by the
      dyadic cover of [event, T] — unless event = seen + 1 and a cover node of level ≥ 1
      starts there (its noise is stored): then the leaf [event] (never stored) and the
      cover of [event + 1, T] are used instead. ≤ L nodes.

    Each shifted DLap(b) term costs |Δ|/b of privacy loss, so the whole view costs at most
    L·|Δ|/b = ε with b = L·sensitivity/ε (N counted in the prefix case).
    """
    t = round_horizon(horizon)
    if not 1 <= event <= t or not 1 <= seen <= t:
        raise ConfigError("event and seen must be periods in 1..T")

    def cover(lo: int, hi: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        while lo <= hi:
            j = 0
            while (lo - 1) % (1 << (j + 1)) == 0 and lo - 1 + (1 << (j + 1)) <= hi:
                j += 1
            out.append((j, lo - 1 + (1 << j)))
            lo += 1 << j
        return out

    if event <= seen:
        return -1, cover(1, event - 1)
    nodes = cover(event, t)
    if any(j >= 1 and end - (1 << j) < seen + 1 <= end for j, end in nodes):
        nodes = [(0, event), *cover(event + 1, t)]
    return 0, nodes


# --------------------------------------------------------------------------- state


@dataclass
class TreeState:
    """Everything needed to continue a stream; ``open_nodes``/``released`` map level → cells.

    Standard mode: open nodes hold raw partial sums, ``released`` the noisy nodes still
    needed. Pan-private mode: ``running`` is X = N + Σx, ``open_nodes`` holds the noise of
    the open node of each level ≥ 1 (data-independent), ``released`` is empty.
    """

    horizon: int
    epsilon: float
    cells: int
    sensitivity: int = 1
    pan_private: bool = False
    period: int = 0
    open_nodes: dict[int, IntArray] = field(default_factory=dict)
    released: dict[int, IntArray] = field(default_factory=dict)
    running: IntArray | None = None

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
    """A fresh stream: T rounded up; open nodes empty (standard) or X = N and node noise."""
    t = round_horizon(horizon)
    if isinstance(cells, bool) or not isinstance(cells, int) or cells < 1:
        raise ConfigError(f"cells must be an integer >= 1, got {cells!r}")
    state = TreeState(t, float(epsilon), cells, sensitivity, pan_private)
    b = state.scale  # validates epsilon and sensitivity
    if pan_private:
        drawn = _noise(state.levels, cells, b, sampler)  # N and levels 1..L-1
        state.running = drawn[0]
        state.open_nodes = {j: drawn[j] for j in range(1, state.levels)}
    else:
        state.open_nodes = {j: np.zeros(cells, dtype=np.int64) for j in range(state.levels)}
    return state


def _noise(rows: int, cells: int, scale: float, sampler: NoiseSampler) -> list[IntArray]:
    """``rows`` independent DLap(scale) vectors of ``cells`` values (one secure draw)."""
    if rows == 0:
        return []
    block = sampler.discrete_laplace(np.zeros(rows * cells, dtype=np.int64), scale)
    return [r.copy() for r in block.reshape(rows, cells)]


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
            f"{state.period}); re-running a period would spend the budget twice and is refused; "
            f"the next period is {state.period + 1} (`privpipe run CONFIG --period "
            f"{state.period + 1}`, or period: in the config)"
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
    closed = [j for j in range(state.levels) if t % (1 << j) == 0]  # levels closing at t
    if state.pan_private:
        assert state.running is not None, "a pan-private state holds X = N + sum"
        running = state.running + x  # x_t is not kept
        leaf = _noise(1, state.cells, b, sampler)[0]  # η_0(t): drawn now, never stored
        total = running + leaf
        for j in range(1, state.levels):
            total = total + state.open_nodes[j]
        fresh_levels = [j for j in closed if j >= 1] if t < state.horizon else []
        open_nodes = {j: v for j, v in state.open_nodes.items() if j not in closed}
        drawn = _noise(len(fresh_levels), state.cells, b, sampler)
        open_nodes.update(zip(fresh_levels, drawn, strict=True))
        released: dict[int, IntArray] = {}
        used = tuple(range(state.levels))
    else:
        running = None
        open_nodes = {j: v + x for j, v in state.open_nodes.items()}
        low = closed[-1]  # the one level released now (lowest set bit of t)
        released = {j: v for j, v in state.released.items() if t >> j & 1}
        released[low] = sampler.discrete_laplace(open_nodes[low], b)
        for j in closed:
            del open_nodes[j]
        if t < state.horizon:
            open_nodes.update({j: np.zeros(state.cells, dtype=np.int64) for j in closed})
        used = tuple(nodes_used(t))
        total = np.zeros(state.cells, dtype=np.int64)
        for j in used:
            total = total + released[j]
    new = TreeState(
        state.horizon,
        state.epsilon,
        state.cells,
        state.sensitivity,
        state.pan_private,
        t,
        open_nodes,
        released,
        running,
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
