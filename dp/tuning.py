"""Bound tuning without spending budget: the expected error of a DP release per choice of
``max_partitions`` (L0), ``max_contributions_per_partition`` (Linf) and, for sums and means,
clamp ``bounds`` — computed from the data, never by drawing noise.

NOT private: every figure here is computed from the raw data. It is for the operator's
eyes only (PipelineDP's utility analysis says the same of its own output), and choosing
bounds from the data is itself a data-dependent choice the guarantee does not cover.

Error of one cell, for a choice of bounds (exact expectations over the random choice of
kept rows that :mod:`dp.bounding` makes, and the noise variance of the planned mechanism):

- person u with P_u cells keeps each with probability π_u = min(1, L0/P_u) (with
  ``bound_to_one_group``: (1/G_u)·min(1, L0/P_{u,g}), G_u its partition_by groups), and in a
  kept cell with n rows keeps k = min(n, Linf) of them uniformly without replacement;
- a kept cell of u adds Y (its k rows' count or clamped fixed-point sum): E[Y] = k·S/n,
  Var[Y] = k(n−k)/(n−1)·σ² (σ² the population variance of its n clamped values);
- the cell's estimate has mean E = Σ_u π_u·E[Y] and bounding variance
  Σ_u π_u·Var[Y] + π_u(1−π_u)·E[Y]², so **bias** = E − truth (truth over all rows, values
  unclamped) and expected squared error = bias² + bounding variance + noise variance;
- noise variance from the release's own plan (:func:`dp.spec.plan_queries` at the
  candidate bounds, :func:`dp.release.noise_variance`): no noise is sampled.

Error measure: RMSE over the query's cells (public partitions: every domain cell, empty ones
included; private: every observed cell, a cell the selection drops counting its truth as
error, with the keep probability of :func:`dp.partition_selection.keep_probability` at the
cell's expected bounded number of persons). A release's error is the root of the mean of its
queries' squared RMSEs, and RMSE² = bias² + sampling² + noise² (each part the root of its
mean over cells). ``dp_mean``: first order (delta method) in the noisy count and sum, over
cells with data. ``dp_top_k``/``dp_mode``: the expected shortfall, in true rows, of the first
pick against the true mode of each group (exact exponential-mechanism law at the first pick's
ε, on the expected bounded counts); bias = the shortfall of the noiseless pick.
``dp_count_distinct``: persons per cell, exact (:func:`distinct_error`).
``dp_variance``/``dp_stddev``: exact bias, APPROXIMATE (first order) sampling and noise in
the noisy count, sum and sum of squares (:func:`moment_error`). ``dp_quantile``/
``dp_median``: the exponential mechanism's exact law on the expected bounded grid
histogram (runs of empty grid points in closed form), in value units, on at most
:data:`MAX_QUANTILE_CELLS` cells (:func:`quantile_error`).

A kind plugs in by one function in :data:`KIND_ERRORS`: (bounded cells, plan, spec,
query data) → :class:`QueryError`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.dp.exponential import gumbel_scale
from privpipe.dp.partition_selection import keep_probability
from privpipe.dp.release import noise_variance, quantile_sensitivity
from privpipe.dp.spec import (
    DISTINCT_KINDS,
    MOMENT_KINDS,
    QUANTILE_KINDS,
    TOP_KINDS,
    DPReleaseSpec,
    QueryPlan,
    plan_queries,
)
from privpipe.errors import ConfigError, InputDataError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NOT_PRIVATE = (
    "NOT PRIVATE: computed from the raw data for the operator only; never publish it. "
    "Choosing bounds from it is a data-dependent choice the DP guarantee does not cover."
)
QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)  # of per-person counts and of values
LADDER = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)  # L0 / Linf tried up to the data's max
BOUND_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)  # mass a clamp candidate keeps (sums: 0.5 too)


@dataclass(frozen=True)
class QueryData:
    """One query's rows as arrays (aligned): cell id, person id, partition_by group id,
    raw value; plus what the release publishes over.

    ``domain``: the public domain's cell ids (None with private partitions). Top kinds:
    ``top_group`` is the id of each row's group (its key without the value), ``eligible``
    whether the row's group and value are in the public domains (the release picks only
    among those) and ``candidates`` the number of public candidate values."""

    cell: npt.NDArray[Any]
    unit: npt.NDArray[Any] | None = None
    group: npt.NDArray[Any] | None = None
    value: FloatArray | None = None
    domain: npt.NDArray[Any] | None = None
    top_group: npt.NDArray[Any] | None = None
    eligible: npt.NDArray[np.bool_] | None = None
    candidates: int = 0

    def __len__(self) -> int:
        return int(self.cell.size)


@dataclass(frozen=True)
class Pairs:
    """Each distinct (person, cell) of a query: its rows and what bounding keeps of it.

    Pairs alike in (cell, rows, cells and groups of the person) are bounded alike, so the
    expectations are computed per such *class* (weighted by its size): a few thousand
    classes stand for a million pairs."""

    person: IntArray  # per pair
    cell: IntArray  # per pair: index into ``cell_ids``
    rows: IntArray  # n: the person's rows in the cell
    row_pair: IntArray  # per input row: its pair
    cell_ids: npt.NDArray[Any]  # the distinct cell ids
    cells_per_person: IntArray  # per pair: P_u (P_{u,g} with bound_to_one_group)
    groups_per_person: IntArray  # per pair: G_u
    persons: int
    klass: IntArray  # per pair: its class
    class_cell: IntArray  # per class
    class_rows: IntArray
    class_cells_per_person: IntArray
    class_groups_per_person: IntArray
    class_size: FloatArray  # pairs in the class
    person_cells: IntArray  # per person: most cells it may keep from (P_u or max P_{u,g})
    person_rows: IntArray  # per person: most rows in one cell
    person_groups: IntArray  # per person: G_u

    def keep_probability(self, l0: int) -> FloatArray:
        """π of each pair: the chance its cell survives the cell (and group) choice."""
        return _keep(self.cells_per_person, self.groups_per_person, l0)

    def class_keep_probability(self, l0: int) -> FloatArray:
        """π of each class."""
        return _keep(self.class_cells_per_person, self.class_groups_per_person, l0)


def _keep(cells: IntArray, groups: IntArray, l0: int) -> FloatArray:
    p = np.minimum(1.0, l0 / cells.astype(np.float64))
    out: FloatArray = p / groups.astype(np.float64)
    return out


def pairs_of(data: QueryData, spec: DPReleaseSpec) -> Pairs:
    """The (person, cell) pairs of ``data``; each row is its own person without a unit.

    A person in several partition_by groups is refused as the run refuses it, unless
    ``bound_to_one_group`` (then one group is kept at random, which π accounts for)."""
    n = len(data)
    cells, cell_ids = pd.factorize(data.cell)
    cell = cells.astype(np.int64)
    if spec.unit is None or data.unit is None:
        person = np.arange(n, dtype=np.int64)
    else:
        person = pd.factorize(data.unit)[0].astype(np.int64)
    n_cells = max(int(cell.max()) + 1 if n else 1, 1)
    keys, row_pair = np.unique(person * n_cells + cell, return_inverse=True)
    pair_person, pair_cell = keys // n_cells, keys % n_cells
    rows = np.bincount(row_pair, minlength=keys.size).astype(np.int64)
    persons = int(person.max()) + 1 if n else 0
    per_person = np.bincount(pair_person, minlength=persons)
    groups = np.ones(keys.size, dtype=np.int64)
    cells_per = per_person[pair_person].astype(np.int64)
    if data.group is not None and spec.unit is not None and n:
        g_row = pd.factorize(data.group)[0].astype(np.int64)
        g_cell = np.zeros(n_cells, dtype=np.int64)
        g_cell[cell] = g_row  # partition_by is part of the cell key: one group per cell
        pair_group = g_cell[pair_cell]
        n_groups = int(g_row.max()) + 1
        pg, pg_of_pair = np.unique(pair_person * n_groups + pair_group, return_inverse=True)
        groups_of = np.bincount(pg // n_groups, minlength=persons)
        groups = groups_of[pair_person].astype(np.int64)
        if (groups > 1).any():
            if not spec.bound_to_one_group:
                raise InputDataError(
                    f"{spec.name}: a person ({spec.unit}) appears in more than one "
                    f"partition_by group ({', '.join(spec.partition_by)}); parallel composition "
                    "needs each person in one group. Set bound_to_one_group: true to keep one "
                    "group per person, or fix the data"
                )
            cells_per = np.bincount(pg_of_pair, minlength=pg.size)[pg_of_pair].astype(np.int64)
    alike = pd.DataFrame({"c": pair_cell, "n": rows, "p": cells_per, "g": groups})
    klass = alike.groupby(["c", "n", "p", "g"], sort=False).ngroup().to_numpy(dtype=np.int64)
    first = np.zeros(int(klass.max()) + 1 if klass.size else 0, dtype=np.int64)
    first[klass[::-1]] = np.arange(klass.size - 1, -1, -1)  # the first pair of each class

    def most(x: IntArray) -> IntArray:
        out = np.zeros(persons, dtype=np.int64)
        np.maximum.at(out, pair_person, x)
        return out

    return Pairs(
        person=pair_person.astype(np.int64),
        cell=pair_cell.astype(np.int64),
        rows=rows,
        row_pair=row_pair.astype(np.int64),
        cell_ids=np.asarray(cell_ids),
        cells_per_person=cells_per,
        groups_per_person=groups,
        persons=persons,
        klass=klass,
        class_cell=pair_cell[first].astype(np.int64),
        class_rows=rows[first],
        class_cells_per_person=cells_per[first],
        class_groups_per_person=groups[first],
        class_size=np.bincount(klass, minlength=first.size).astype(np.float64),
        person_cells=most(cells_per),
        person_rows=most(rows),
        person_groups=most(groups),
    )


@dataclass(frozen=True)
class Bounded:
    """Per cell (aligned with ``pairs.cell_ids``): truth and the bounded estimate's
    expectation and bounding variance, for one choice of L0, Linf and clamp."""

    pairs: Pairs
    l0: int
    linf: int
    true_count: FloatArray
    count: FloatArray  # E[bounded count]
    count_var: FloatArray
    units: FloatArray  # E[persons kept in the cell]
    true_sum: FloatArray | None = None  # Σ raw values
    sum: FloatArray | None = None  # E[bounded clamped sum] (centred for means)
    sum_var: FloatArray | None = None
    cov: FloatArray | None = None  # Cov(bounded count, bounded sum)
    rows_kept: float = 0.0  # E[rows kept] / rows
    values_unclamped: float | None = None  # share of rows the clamp leaves unchanged
    moments: Moments | None = None  # variances: the sum of squares and its covariances
    quantile_rows: QuantileRows | None = None  # quantiles: the evaluated cells' rows


@dataclass(frozen=True)
class Moments:
    """Per cell, for variances (values centred and clamped as the run does): the bounded
    sum of squares Q's expectation, variance and covariances with the count N and sum S,
    and the raw (unclamped) values' centred sum and sum of squares."""

    sumsq: FloatArray
    sumsq_var: FloatArray
    cov_count: FloatArray  # Cov(N, Q)
    cov_sum: FloatArray  # Cov(S, Q)
    true_sum: FloatArray  # Σ (raw − centre)
    true_sumsq: FloatArray  # Σ (raw − centre)²


@dataclass(frozen=True)
class PairValues:
    """Per class of pairs (:class:`Pairs`), for one clamp: sums over its pairs of s (the sum
    of a pair's clamped values), s² and q (the sum of their squares), and of the raw values.
    Depends on the bounds only, not on L0 or Linf."""

    sum: FloatArray
    sum_sq: FloatArray
    squares: FloatArray
    raw: FloatArray
    unclamped: float  # share of rows the clamp leaves unchanged
    higher: HigherSums | None = None  # variances only


@dataclass(frozen=True)
class HigherSums:
    """Per class, for variances: sums over its pairs of q² and s·q (q: a pair's sum of
    squared clamped values), of the clamped values' cubes and fourth powers, and of the raw
    values centred and squared."""

    q_sq: FloatArray
    s_q: FloatArray
    cubes: FloatArray
    quarts: FloatArray
    raw_centred: FloatArray
    raw_squares: FloatArray


def pair_values(
    pairs: Pairs, raw: FloatArray, centre: float, resolution: float, units: tuple[int, int],
    moments: bool = False,
) -> PairValues:  # fmt: skip
    """Each row clamped as the run does (:func:`dp.cells.fixed_point_values`: round
    (v − centre)/resolution, clip to ``units``, back to value units), summed per pair, then
    per class; with ``moments`` also the :class:`HigherSums` a variance needs."""
    steps = np.rint((raw - centre) / resolution)
    inside = np.clip(steps, units[0], units[1])
    clamped = inside * resolution
    npairs, nclass = pairs.rows.size, pairs.class_size.size

    def total(index: IntArray, x: npt.NDArray[Any], n: int) -> FloatArray:
        out: FloatArray = np.bincount(index, weights=x, minlength=n).astype(np.float64)
        return out

    def per_class(x: npt.NDArray[Any]) -> FloatArray:
        return total(pairs.klass, total(pairs.row_pair, x, npairs), nclass)

    s = total(pairs.row_pair, clamped, npairs)
    sq = clamped * clamped
    higher = None
    if moments:
        q = total(pairs.row_pair, sq, npairs)
        centred = raw - centre
        higher = HigherSums(
            q_sq=total(pairs.klass, q * q, nclass),
            s_q=total(pairs.klass, s * q, nclass),
            cubes=per_class(sq * clamped),
            quarts=per_class(sq * sq),
            raw_centred=per_class(centred),
            raw_squares=per_class(centred * centred),
        )
    return PairValues(
        sum=total(pairs.klass, s, nclass),
        sum_sq=total(pairs.klass, s * s, nclass),
        squares=per_class(sq),
        raw=per_class(raw),
        unclamped=float((steps == inside).mean()) if steps.size else 1.0,
        higher=higher,
    )


def bounded_cells(pairs: Pairs, l0: int, linf: int, values: PairValues | None = None) -> Bounded:
    """Exact expectations and bounding variances per cell (module docstring); ``values``
    for sums and means (centred for means). Computed per class of alike pairs: every
    term is linear in the pairs' s, s² and q."""
    pi = pairs.class_keep_probability(l0)
    n = pairs.class_rows.astype(np.float64)
    k = np.minimum(n, float(linf))
    size = pairs.class_size
    cells = pairs.cell_ids.size

    def per_cell(x: npt.NDArray[Any]) -> FloatArray:
        out: FloatArray = np.bincount(pairs.class_cell, weights=x, minlength=cells).astype(
            np.float64
        )
        return out

    total_rows = float((size * n).sum())
    out = Bounded(
        pairs=pairs,
        l0=l0,
        linf=linf,
        true_count=per_cell(size * n),
        count=per_cell(size * pi * k),
        count_var=per_cell(size * pi * (1.0 - pi) * k * k),
        units=per_cell(size * pi),
        rows_kept=float((size * pi * k).sum()) / total_rows if total_rows else 1.0,
    )
    if values is None:
        return out
    # per pair: E[Y] = (k/n)·s, Var[Y] = k(n−k)/(n−1)·(q/n − s²/n²), summed over the class
    share = k / n
    spread = np.where(n > 1, k * (n - k) / np.maximum(n - 1.0, 1.0), 0.0)
    var_y = np.maximum(spread * (values.squares / n - values.sum_sq / (n * n)), 0.0)
    moments = None
    h = values.higher
    if h is not None:  # Q: the sum of squares; within a pair k of n rows without replacement
        mix = pi * (1.0 - pi) * share * share
        var_q = np.maximum(spread * (h.quarts / n - h.q_sq / (n * n)), 0.0)
        cov_sq = spread * (h.cubes / n - h.s_q / (n * n))
        moments = Moments(
            sumsq=per_cell(pi * share * values.squares),
            sumsq_var=per_cell(pi * var_q + mix * h.q_sq),
            cov_count=per_cell(k * pi * (1.0 - pi) * share * values.squares),
            cov_sum=per_cell(pi * cov_sq + mix * h.s_q),
            true_sum=per_cell(h.raw_centred),
            true_sumsq=per_cell(h.raw_squares),
        )
    return dataclasses.replace(
        out,
        true_sum=per_cell(values.raw),
        sum=per_cell(pi * share * values.sum),
        sum_var=per_cell(pi * var_y + pi * (1.0 - pi) * share * share * values.sum_sq),
        cov=per_cell(k * pi * (1.0 - pi) * share * values.sum),
        values_unclamped=values.unclamped,
        moments=moments,
    )


@dataclass(frozen=True)
class QueryError:
    """A query's expected error and its parts (squared parts are means over cells, except
    top kinds, whose parts are shortfalls that add up)."""

    error: float
    bias: float
    sampling: float
    noise: float
    cells: int
    cells_dropped: float = 0.0  # expected share of cells partition selection drops
    measure: str = "rmse"
    cells_evaluated: int | None = None  # quantiles: the cells evaluated (a sample if fewer)

    def as_dict(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in dataclasses.asdict(self).items()}


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


KindError = Callable[[Bounded, QueryPlan, DPReleaseSpec, QueryData], QueryError]


def _rmse_parts(
    bias2: FloatArray, sampling: FloatArray, noise: FloatArray, extra_cells: int = 0,
    extra_noise: float = 0.0, dropped: float = 0.0,
) -> QueryError:  # fmt: skip
    """Means over cells (``extra_cells`` empty domain cells with noise only) as an RMSE split."""
    cells = bias2.size + extra_cells
    if cells == 0:
        return QueryError(0.0, 0.0, 0.0, 0.0, 0)
    b = float(bias2.sum()) / cells
    s = float(sampling.sum()) / cells
    v = (float(noise.sum()) + extra_cells * extra_noise) / cells
    return QueryError(
        math.sqrt(b + s + v), math.sqrt(b), math.sqrt(s), math.sqrt(v), cells, dropped
    )


def _published(bounded: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> tuple[
    npt.NDArray[np.bool_], FloatArray, int
]:  # fmt: skip
    """(observed cells the release covers, their keep probability, empty domain cells)."""
    ids = bounded.pairs.cell_ids
    if data.domain is not None:
        inside = np.isin(ids, data.domain)
        return inside, np.ones(int(inside.sum())), int(np.unique(data.domain).size - inside.sum())
    assert plan.selection_epsilon is not None and plan.selection_delta is not None
    units = np.rint(bounded.units).astype(np.int64)
    keep = keep_probability(
        units, float(plan.selection_epsilon), float(plan.selection_delta), spec.l0,
        spec.selection,  # type: ignore[arg-type]
    )  # fmt: skip
    return np.ones(ids.size, dtype=bool), np.asarray(keep, dtype=np.float64), 0


def count_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_count / dp_histogram: RMSE of the noisy bounded counts against the true counts."""
    assert plan.count_noise is not None
    return _linear_error(b.count, b.count_var, b.true_count, noise_variance(plan.count_noise), b,
                         plan, spec, data)  # fmt: skip


def sum_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_sum: RMSE of the noisy clamped sums against the true (unclamped) sums."""
    assert plan.sum_noise is not None and b.sum is not None and b.sum_var is not None
    assert b.true_sum is not None
    noise = noise_variance(plan.sum_noise) * spec.resolution**2
    return _linear_error(b.sum, b.sum_var, b.true_sum, noise, b, plan, spec, data)


def _linear_error(
    est: FloatArray, var: FloatArray, truth: FloatArray, noise: float, b: Bounded,
    plan: QueryPlan, spec: DPReleaseSpec, data: QueryData,
) -> QueryError:  # fmt: skip
    inside, keep, empty = _published(b, plan, spec, data)
    bias = est[inside] - truth[inside]
    t = truth[inside]
    dropped = float((1.0 - keep).sum()) / max(keep.size, 1) if data.domain is None else 0.0
    return _rmse_parts(
        keep * bias * bias + (1.0 - keep) * t * t, keep * var[inside],
        keep * noise, empty, noise, dropped,
    )  # fmt: skip


def mean_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_mean: first-order error of centre + noisy centred sum / noisy count, over cells
    with data (weighted by their keep probability with private partitions)."""
    assert plan.count_noise is not None and plan.sum_noise is not None
    assert b.sum is not None and b.sum_var is not None and b.cov is not None
    assert b.true_sum is not None
    inside, keep, _ = _published(b, plan, spec, data)
    n = np.maximum(b.count[inside], 1e-12)
    m = b.sum[inside] / n  # centred mean of the bounded rows
    truth = b.true_sum[inside] / np.maximum(b.true_count[inside], 1.0)
    bias = plan.centre + m - truth
    sampling = (b.sum_var[inside] + m * m * b.count_var[inside] - 2 * m * b.cov[inside]) / (n * n)
    noise = (noise_variance(plan.sum_noise) * spec.resolution**2
             + m * m * noise_variance(plan.count_noise)) / (n * n)  # fmt: skip
    w = keep / max(float(keep.sum()), 1e-300) * keep.size  # mean over expected published cells
    dropped = float((1.0 - keep).sum()) / max(keep.size, 1) if data.domain is None else 0.0
    return _rmse_parts(w * bias * bias, w * np.maximum(sampling, 0.0), w * noise, 0, 0.0, dropped)


def moment_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_variance / dp_stddev, over cells with data (weighted by their keep probability
    with private partitions). The released variance is f(N, S, Q) = Q/N − (S/N)² of the
    noisy count N, centred sum S and sum of squares Q (value units).

    bias: f at the bounded parts' exact expectations minus the variance of all the cell's
    raw values (clamping and bounding; exact when bounding keeps every row, a plug-in of
    the expectations otherwise); sampling and noise: APPROXIMATE, first order (delta
    method) in N, S, Q — sampling from their exact bounding covariances, noise from the three
    noise variances the plan calibrates (ε/3 each); the clip to [0, m²] only caps each
    part's spread at m². For ``dp_stddev`` the same through √: bias √f − √truth, spread
    min(σ/(2√f), √σ), capped at m."""
    assert plan.count_noise is not None and plan.sum_noise is not None
    assert plan.sumsq_noise is not None and b.sum is not None and b.sum_var is not None
    assert b.cov is not None and b.moments is not None
    mo = b.moments
    inside, keep, _ = _published(b, plan, spec, data)
    n = np.maximum(b.count[inside], 1e-12)
    s, q = b.sum[inside], mo.sumsq[inside]
    est = q / n - (s / n) ** 2
    t_n = np.maximum(b.true_count[inside], 1.0)
    truth = np.maximum(mo.true_sumsq[inside] / t_n - (mo.true_sum[inside] / t_n) ** 2, 0.0)
    g_n, g_s, g_q = -q / n**2 + 2 * s * s / n**3, -2 * s / n**2, 1.0 / n
    sampling = (
        g_n**2 * b.count_var[inside]
        + g_s**2 * b.sum_var[inside]
        + g_q**2 * mo.sumsq_var[inside]
        + 2 * g_n * g_s * b.cov[inside]
        + 2 * g_n * g_q * mo.cov_count[inside]
        + 2 * g_s * g_q * mo.cov_sum[inside]
    )
    r2 = spec.resolution**2
    noise = (g_n**2 * noise_variance(plan.count_noise)
             + g_s**2 * noise_variance(plan.sum_noise) * r2
             + g_q**2 * noise_variance(plan.sumsq_noise) * r2 * r2)  # fmt: skip
    sampling = np.maximum(sampling, 0.0)
    bias = est - truth
    if spec.kind == "dp_stddev":
        root = np.sqrt(np.maximum(est, 0.0))
        bias = root - np.sqrt(truth)

        def through_root(v: FloatArray) -> FloatArray:  # |√a − √b| ≤ √|a − b| caps it
            sd = np.minimum(np.sqrt(v) / np.maximum(2 * root, 1e-300), np.sqrt(np.sqrt(v)))
            out: FloatArray = sd * sd
            return out

        sampling, noise = through_root(sampling), through_root(noise)
    # the release clips to [0, m²] (√ for the deviation): no part's spread exceeds that range
    top = plan.sumsq_bound * r2 if spec.kind == "dp_variance" else math.sqrt(plan.sumsq_bound * r2)
    sampling, noise = np.minimum(sampling, top * top), np.minimum(noise, top * top)
    w = keep / max(float(keep.sum()), 1e-300) * keep.size
    dropped = float((1.0 - keep).sum()) / max(keep.size, 1) if data.domain is None else 0.0
    return _rmse_parts(w * bias * bias, w * sampling, w * noise, 0, 0.0, dropped)


def top_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_top_k / dp_mode: mean over groups with data of the first pick's expected shortfall
    in true rows against the true mode (exact exponential-mechanism law at the first pick's
    ε = ε_group/k, sensitivity Linf, on the expected bounded counts; candidates the group
    never shows count 0)."""
    assert plan.top_epsilon is not None and data.top_group is not None
    ids = b.pairs.cell_ids
    row_of_cell = np.zeros(ids.size, dtype=np.int64)  # any row of each cell
    row_of_cell[b.pairs.cell[b.pairs.row_pair]] = np.arange(len(data))
    ok = np.ones(ids.size, dtype=bool) if data.eligible is None else data.eligible[row_of_cell]
    cells_ok = np.flatnonzero(ok)
    group = pd.factorize(np.asarray(data.top_group)[row_of_cell[cells_ok]])[0].astype(np.int64)
    groups = int(group.max()) + 1 if cells_ok.size else 0
    if groups == 0:
        return QueryError(0.0, 0.0, 0.0, 0.0, 0, measure="shortfall")
    scale = gumbel_scale(float(plan.top_epsilon) / spec.top_k, float(spec.linf))
    order = np.argsort(group, kind="stable")
    edges = np.searchsorted(group[order], np.arange(groups + 1))
    total = bias = 0.0
    for g in range(groups):  # one selection per group, as the release makes
        cells = cells_ok[order[edges[g] : edges[g + 1]]]
        truth, est = b.true_count[cells], b.count[cells]
        zeros = max(data.candidates - cells.size, 0)
        top = max(float(est.max()), 0.0)
        w = np.exp((est - top) / scale)
        w0 = zeros * math.exp(-top / scale)  # the candidates with no row
        best = float(truth.max())
        total += (float((w * (best - truth)).sum()) + w0 * best) / (float(w.sum()) + w0)
        bias += best - float(truth[est == est.max()].mean())
    total, bias = total / groups, bias / groups
    return QueryError(total, bias, 0.0, total - bias, groups, measure="shortfall")


def distinct_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_count_distinct: RMSE of the noisy number of persons kept per cell against the
    persons in the cell. A person's cell survives L0 bounding with probability π (and then
    counts once, whatever Linf keeps of its rows), so E = Σ π and Var = Σ π(1−π), exact;
    noise at the plan's L0 (a person moves L0 cells by one each)."""
    assert plan.count_noise is not None
    p = b.pairs
    pi = p.class_keep_probability(b.l0)
    cells = p.cell_ids.size
    truth = np.bincount(p.class_cell, weights=p.class_size, minlength=cells).astype(np.float64)
    var = np.bincount(p.class_cell, weights=p.class_size * pi * (1.0 - pi), minlength=cells)
    noise = noise_variance(plan.count_noise)
    return _linear_error(b.units, var.astype(np.float64), truth, noise, b, plan, spec, data)


MAX_QUANTILE_CELLS = 64  # cells a quantile's error is evaluated on (an even sample beyond)


@dataclass(frozen=True)
class QuantileRows:
    """A quantile query's evaluated cells (all with data, or an even sample over their sizes
    beyond :data:`MAX_QUANTILE_CELLS`) as a sparse grid histogram: each (class of pair,
    occupied grid point) → rows, and the grid as *segments* per cell — each occupied point,
    the run of empty points before it and the run after the cell's last one — whose
    candidates share one utility (rank counts change only at occupied points), so a cell
    costs its occupied points, not the grid's size. Independent of L0/Linf."""

    cells: IntArray  # indices into the pairs' cell_ids
    cells_with_data: int  # the release's cells with data (evaluated or not)
    klass: IntArray  # per entry
    occupied_of: IntArray  # per entry: its occupied point
    rows: FloatArray  # per entry
    occ_local: IntArray  # per occupied point (sorted by cell, grid index): its cell 0..C−1
    occ_start: IntArray  # per cell: its first occupied point
    seg_kind: IntArray  # per segment (sorted by cell): 0 a point, 1 the run before, 2 after
    seg_ref: IntArray  # per segment: its occupied point (kinds 0, 1) or its cell (kind 2)
    seg_cell: IntArray
    seg_start: IntArray  # per cell: its first segment
    seg_size: FloatArray  # candidates in the segment (0: an empty run, ignored)
    seg_mid: FloatArray  # the segment's middle grid index
    truth: FloatArray  # (cells, quantiles): the raw α-quantile of each evaluated cell
    lower: float
    unclamped: float  # share of the evaluated rows the clamp leaves unchanged


def quantile_rows(
    pairs: Pairs, data: QueryData, spec: DPReleaseSpec, plan: QueryPlan
) -> QuantileRows:
    """Prepare :func:`quantile_error` for one query and one grid (bounds)."""
    assert data.value is not None
    size = plan.grid
    ids = pairs.cell_ids
    inside = np.ones(ids.size, bool) if data.domain is None else np.isin(ids, data.domain)
    row_cell = pairs.cell[pairs.row_pair]
    rows_per_cell = np.bincount(row_cell, minlength=ids.size)
    with_data = np.flatnonzero(inside & (rows_per_cell > 0))
    chosen = with_data
    if with_data.size > MAX_QUANTILE_CELLS:  # an even sample over the cells ordered by size
        by_size = with_data[np.argsort(rows_per_cell[with_data], kind="stable")]
        pick = np.rint(np.linspace(0, by_size.size - 1, MAX_QUANTILE_CELLS)).astype(np.int64)
        chosen = np.unique(by_size[pick])
    n_cells = chosen.size
    local_of = np.full(ids.size, -1, dtype=np.int64)
    local_of[chosen] = np.arange(n_cells)
    row_local = local_of[row_cell]
    mine = row_local >= 0
    raw = data.value[mine]
    steps = np.rint((raw - plan.centre) / spec.resolution)
    index = np.clip(steps, 0, size - 1).astype(np.int64)
    local = row_local[mine]
    point = local * size + index  # sorted order = (cell, grid index)
    occupied, occupied_of = np.unique(point, return_inverse=True)
    entry, rows = np.unique(pairs.klass[pairs.row_pair[mine]] * occupied.size + occupied_of,
                            return_counts=True)  # fmt: skip
    occ_local, occ_bin = occupied // size, occupied % size
    occ_start = np.searchsorted(occ_local, np.arange(n_cells))
    first = np.zeros(occupied.size, dtype=bool)
    first[occ_start[occ_start < occupied.size]] = True
    prev = np.where(first, -1, np.r_[-1, occ_bin[:-1]])
    last = np.r_[occ_bin[occ_start[1:] - 1], occ_bin[-1:]] if occupied.size else occ_bin
    m = occupied.size
    kind = np.r_[np.zeros(m), np.ones(m), np.full(n_cells, 2)].astype(np.int64)
    ref = np.r_[np.arange(m), np.arange(m), np.arange(n_cells)].astype(np.int64)
    cell = np.r_[occ_local, occ_local, np.arange(n_cells)].astype(np.int64)
    lo = np.r_[occ_bin, prev + 1, last + 1].astype(np.float64)
    hi = np.r_[occ_bin, occ_bin - 1, np.full(n_cells, size - 1)].astype(np.float64)
    order = np.argsort(cell, kind="stable")
    qs = [float(q) for q in spec.quantiles]
    truth = np.zeros((n_cells, len(qs)))
    if raw.size:
        frame = pd.DataFrame({"c": local, "v": raw})
        quant = frame.groupby("c")["v"].quantile(qs).unstack()
        truth[quant.index.to_numpy(dtype=np.int64)] = quant.to_numpy(dtype=np.float64)
    return QuantileRows(
        cells=chosen.astype(np.int64),
        cells_with_data=int(with_data.size),
        klass=(entry // max(m, 1)).astype(np.int64),
        occupied_of=(entry % max(m, 1)).astype(np.int64),
        rows=rows.astype(np.float64),
        occ_local=occ_local.astype(np.int64),
        occ_start=occ_start.astype(np.int64),
        seg_kind=kind[order],
        seg_ref=ref[order],
        seg_cell=cell[order],
        seg_start=np.searchsorted(cell[order], np.arange(n_cells)).astype(np.int64),
        seg_size=np.maximum(hi - lo + 1, 0.0)[order],
        seg_mid=((lo + hi) / 2)[order],
        truth=truth,
        lower=float(plan.centre),
        unclamped=float((steps == index).mean()) if steps.size else 1.0,
    )


def quantile_error(b: Bounded, plan: QueryPlan, spec: DPReleaseSpec, data: QueryData) -> QueryError:
    """dp_quantile / dp_median: RMSE in value units of the released grid point against the
    raw α-quantile of all the cell's rows, mean over the evaluated cells (weighted by their
    keep probability with private partitions) and the quantiles.

    The exponential mechanism's exact selection law (:func:`dp.exponential.
    selection_probabilities`' exp(ε·u/(2Δu)), ε per cell and quantile from the plan) on the
    rank utilities (:func:`dp.release.quantile_utilities`) of the cell's expected bounded
    histogram on the grid (bounding's randomness enters through that expectation only:
    sampling is 0), summed in closed form over runs of empty grid points. bias: the
    noiseless pick (the middle of the best-utility grid points) minus the raw quantile —
    clamping, bounding and the grid's rounding; noise: the rest, E[(pick − raw)²] − bias².
    Many cells are evaluated on a sample (:class:`QuantileRows`; ``cells_evaluated``)."""
    assert plan.quantile_epsilon is not None and b.quantile_rows is not None
    qr = b.quantile_rows
    n_cells = qr.cells.size
    if n_cells == 0:
        return QueryError(0.0, 0.0, 0.0, 0.0, 0, cells_evaluated=0)
    p = b.pairs
    pi = p.class_keep_probability(b.l0)
    n = p.class_rows.astype(np.float64)
    share = np.minimum(n, float(b.linf)) / n
    h = np.bincount(qr.occupied_of, weights=qr.rows * pi[qr.klass] * share[qr.klass],
                    minlength=qr.occ_local.size)  # fmt: skip
    excl = np.cumsum(h) - h
    below_occ = excl - excl[qr.occ_start][qr.occ_local]  # rows below, within the cell
    total = np.bincount(qr.occ_local, weights=h, minlength=n_cells)
    point, after = qr.seg_kind == 0, qr.seg_kind == 2
    ref = qr.seg_ref
    below = np.where(after, total[np.minimum(ref, n_cells - 1)], below_occ[np.where(after, 0, ref)])
    mass = np.where(point, h[np.where(after, 0, ref)], 0.0)
    above = total[qr.seg_cell] - below - mass
    r = spec.resolution
    size = qr.seg_size
    value = qr.lower + qr.seg_mid * r
    bias2 = np.zeros(n_cells)
    noise2 = np.zeros(n_cells)
    for j, quant in enumerate(spec.quantiles):
        a, d = quant.numerator, quant.denominator
        u = np.where(size > 0, -np.abs((d - a) * below - a * above), -np.inf)
        top = np.maximum.reduceat(u, qr.seg_start)
        beta = gumbel_scale(float(plan.quantile_epsilon), float(quantile_sensitivity(spec, quant)))
        w = np.exp((u - top[qr.seg_cell]) / beta)
        t = qr.truth[qr.seg_cell, j]
        # Σ over the segment's points of (v − t)²: centred on its middle, the cross term is 0
        squares = size * (value - t) ** 2 + r * r * size * (size * size - 1) / 12
        err2 = np.add.reduceat(w * squares, qr.seg_start) / np.add.reduceat(w * size, qr.seg_start)
        best = (u >= top[qr.seg_cell] - 1e-9 * np.maximum(np.abs(top[qr.seg_cell]), 1.0)) * size
        pick = np.add.reduceat(best * value, qr.seg_start) / np.add.reduceat(best, qr.seg_start)
        bias = pick - qr.truth[:, j]
        bias2 += bias * bias
        noise2 += np.maximum(err2 - bias * bias, 0.0)
    k = len(spec.quantiles)
    keep = np.ones(n_cells)
    if data.domain is None:
        assert plan.selection_epsilon is not None and plan.selection_delta is not None
        keep = np.asarray(keep_probability(
            np.rint(b.units[qr.cells]).astype(np.int64), float(plan.selection_epsilon),
            float(plan.selection_delta), spec.l0, spec.selection,  # type: ignore[arg-type]
        ), dtype=np.float64)  # fmt: skip
    w_cell = keep / max(float(keep.sum()), 1e-300) * n_cells
    out = _rmse_parts(w_cell * bias2 / k, np.zeros(n_cells), w_cell * noise2 / k)
    dropped = float((1.0 - keep).mean()) if data.domain is None else 0.0
    return dataclasses.replace(
        out, cells=qr.cells_with_data, cells_dropped=dropped, cells_evaluated=n_cells
    )


KIND_ERRORS: dict[str, KindError] = {
    "dp_count": count_error,
    "dp_histogram": count_error,
    "dp_count_distinct": distinct_error,
    "dp_variance": moment_error,
    "dp_stddev": moment_error,
    "dp_quantile": quantile_error,
    "dp_median": quantile_error,
    "dp_sum": sum_error,
    "dp_mean": mean_error,
    "dp_top_k": top_error,
    "dp_mode": top_error,
}


# --------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Candidate:
    """One choice of bounds: L0, Linf and (sums, means) the clamp bounds."""

    max_partitions: int
    max_contributions: int
    bounds: tuple[float, float] | None = None

    def width(self) -> float:
        return 0.0 if self.bounds is None else self.bounds[1] - self.bounds[0]


def _from_quantiles(counts: Iterable[IntArray], fixed: Iterable[int]) -> list[int]:
    """The configured value, quantiles of the counts and the ladder up to their maximum."""
    values = set(fixed)
    top = 1
    for c in counts:
        if c.size:
            values |= {math.ceil(float(np.quantile(c, q))) for q in QUANTILES}
            top = max(top, int(c.max()))
    values |= {v for v in LADDER if v <= top}
    return sorted(v for v in values if v >= 1)


def _round_out(lo: float, hi: float, resolution: float) -> tuple[float, float]:
    """Bounds on the resolution grid, widened to hold [lo, hi] (never both 0)."""
    lo_r = math.floor(lo / resolution + 1e-9) * resolution
    hi_r = math.ceil(hi / resolution - 1e-9) * resolution
    if lo_r == hi_r:
        hi_r = lo_r + resolution
    return float(lo_r), float(hi_r)


def bound_candidates(spec: DPReleaseSpec, values: FloatArray) -> list[tuple[float, float]]:
    """The configured bounds and clamps keeping the values' central mass: [q(1−p), q(p)]
    for means (p ≥ 0.75), and for sums [min(0, q(1−p)), max(0, q(p))] (a sum's sensitivity is
    max(|lo|, |hi|), so a lower bound above 0 buys nothing for non-negative data)."""
    assert spec.bounds is not None
    out = {(float(spec.bounds[0]), float(spec.bounds[1]))}
    if values.size:
        for p in BOUND_QUANTILES if spec.kind == "dp_sum" else BOUND_QUANTILES[1:]:
            lo, hi = float(np.quantile(values, 1 - p)), float(np.quantile(values, p))
            if spec.kind == "dp_sum":
                lo, hi = min(0.0, lo), max(0.0, hi)
            out.add(_round_out(lo, hi, spec.resolution))
    return sorted(out)


def default_grid(
    spec: DPReleaseSpec, pairs: Sequence[Pairs], data: Sequence[QueryData]
) -> list[Candidate]:
    """L0 × Linf from quantiles of the persons' cells and rows per cell (and the configured
    values and 1), × clamp bounds for sums and means. Without a privacy unit only bounds vary."""
    if spec.unit is None:
        l0s, linfs = [spec.max_partitions], [spec.max_contributions]
    else:
        l0s = _from_quantiles((p.person_cells for p in pairs), (1, spec.max_partitions))
        linfs = _from_quantiles((p.rows for p in pairs), (1, spec.max_contributions))
    if spec.kind in DISTINCT_KINDS:  # a person counts once per cell: Linf changes nothing
        linfs = [spec.max_contributions]
    bounds: list[tuple[float, float] | None] = [None]
    if spec.bounds is not None:  # a kind that clamps values (sums, means, ...)
        values = [d.value for d in data if d.value is not None]
        all_values = np.concatenate(values) if values else np.zeros(0)
        bounds = list(bound_candidates(spec, all_values))
    return [Candidate(a, b, c) for a in l0s for b in linfs for c in bounds]


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class CandidateResult:
    """A candidate's expected error for the whole release and per query."""

    candidate: Candidate
    error: float
    bias: float
    sampling: float
    noise: float
    rows_kept: float
    persons_kept: float
    values_unclamped: float | None
    queries: Mapping[str, QueryError]
    current: bool = False
    refused: str | None = None  # the planner refuses this choice (e.g. noise too large)

    def as_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "max_partitions": c.max_partitions,
            "max_contributions_per_partition": c.max_contributions,
            "bounds": list(c.bounds) if c.bounds is not None else None,
            "error": _finite(self.error),
            "bias": _finite(self.bias),
            "sampling": _finite(self.sampling),
            "noise": _finite(self.noise),
            "rows_kept": _finite(self.rows_kept),
            "persons_kept": _finite(self.persons_kept),
            "values_unclamped": _finite(self.values_unclamped),
            "current": self.current,
            "refused": self.refused,
            "queries": {n: q.as_dict() for n, q in self.queries.items()},
        }


@dataclass(frozen=True)
class TuneResult:
    """Every candidate of one release, the configured one and the recommendation."""

    release: str
    kind: str
    measure: str
    results: tuple[CandidateResult, ...]
    best: CandidateResult | None
    current: CandidateResult | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "kind": self.kind,
            "measure": self.measure,
            "not_private": NOT_PRIVATE,
            "recommended": None if self.best is None else self.best.as_dict(),
            "current": None if self.current is None else self.current.as_dict(),
            "candidates": [r.as_dict() for r in self.results],
        }


MEASURES = {
    "rmse": "RMSE over cells (bias^2 + sampling^2 + noise^2 = RMSE^2), root mean square over "
    "queries",
    "shortfall": "expected shortfall in true rows of the first pick against the true mode, "
    "mean over groups and queries",
}


def _variant(spec: DPReleaseSpec, c: Candidate) -> DPReleaseSpec:
    extra: dict[str, Any] = {} if c.bounds is None else {"bounds": c.bounds}
    return dataclasses.replace(
        spec, max_partitions=c.max_partitions, max_contributions=c.max_contributions, **extra
    )


def _persons_kept(pairs: Sequence[Pairs], l0: int, linf: int) -> float:
    """Share of persons bounding leaves whole (every row kept, in every query)."""
    whole: npt.NDArray[np.bool_] | None = None
    for p in pairs:
        kept = (p.person_cells <= l0) & (p.person_groups == 1) & (p.person_rows <= linf)
        whole = kept if whole is None else whole & kept
    return float(whole.mean()) if whole is not None and whole.size else 1.0


def tune_release(
    spec: DPReleaseSpec,
    data: Sequence[QueryData],
    grid: Sequence[Candidate] | None = None,
    kind_errors: Mapping[str, KindError] = KIND_ERRORS,
) -> TuneResult:
    """The expected error of every candidate (``grid``, default :func:`default_grid`) for the
    release ``spec`` on ``data`` (one :class:`QueryData` per query, in the spec's order),
    and the candidate with the least error (ties: the smaller bounds). Draws no noise and
    charges nothing."""
    if spec.kind not in kind_errors:
        raise ConfigError(f"{spec.name}: tune does not cover kind {spec.kind!r} yet")
    if len(data) != len(spec.queries):
        raise ValueError(f"{spec.name}: {len(spec.queries)} queries but {len(data)} data sets")
    error_of = kind_errors[spec.kind]
    pairs = [pairs_of(d, spec) for d in data]
    candidates = list(grid) if grid is not None else default_grid(spec, pairs, data)
    configured = Candidate(spec.max_partitions, spec.max_contributions, spec.bounds)
    if configured not in candidates:
        candidates.append(configured)
    results: list[CandidateResult] = []
    measure = "shortfall" if spec.kind in TOP_KINDS else "rmse"
    clamps: dict[tuple[int, tuple[int, int], float], PairValues] = {}
    grids: dict[tuple[int, tuple[int, int], float], QuantileRows] = {}
    for c in candidates:
        variant = _variant(spec, c)
        try:
            plans = plan_queries(variant)
        except ConfigError as e:
            results.append(_refused(c, str(e), c == configured))
            continue
        per_query: dict[str, QueryError] = {}
        kept: list[float] = []
        unclamped: list[float] = []
        for i, (d, p, plan) in enumerate(zip(data, pairs, plans, strict=True)):
            values = None
            rows = None
            if d.value is not None and spec.kind in QUANTILE_KINDS:  # grid indices per cell
                key = (i, plan.sum_units or (0, 0), plan.centre)
                if key not in grids:
                    grids[key] = quantile_rows(p, d, variant, plan)
                rows = grids[key]
                unclamped.append(rows.unclamped)
            elif d.value is not None and plan.sum_units is not None:  # clamped fixed point
                key = (i, plan.sum_units, plan.centre)
                if key not in clamps:
                    clamps[key] = pair_values(
                        p, d.value, plan.centre, variant.resolution, plan.sum_units,
                        moments=spec.kind in MOMENT_KINDS,
                    )  # fmt: skip
                values = clamps[key]
                unclamped.append(values.unclamped)
            b = bounded_cells(p, variant.l0, variant.linf, values)
            if rows is not None:
                b = dataclasses.replace(b, quantile_rows=rows)
            kept.append(b.rows_kept)
            per_query[plan.query.name] = error_of(b, plan, variant, d)
        errs = list(per_query.values())
        fields = ("error", "bias", "sampling", "noise")
        if measure == "rmse":
            parts = [math.sqrt(sum(getattr(e, f) ** 2 for e in errs) / len(errs)) for f in fields]
        else:
            parts = [sum(getattr(e, f) for e in errs) / len(errs) for f in fields]
        error, bias, sampling, noise = parts
        results.append(
            CandidateResult(
                c,
                error,
                bias,
                sampling,
                noise,
                rows_kept=float(np.mean(kept)),
                persons_kept=_persons_kept(pairs, variant.l0, variant.linf),
                values_unclamped=float(np.mean(unclamped)) if unclamped else None,
                queries=per_query,
                current=c == configured,
            )
        )
    ok = [r for r in results if r.refused is None]
    best = min(
        ok,
        key=lambda r: (round(r.error, 9), r.candidate.max_partitions,
                       r.candidate.max_contributions, r.candidate.width()),
    ) if ok else None  # fmt: skip
    current = next((r for r in results if r.current), None)
    return TuneResult(spec.name, spec.kind, measure, tuple(results), best, current)


def _refused(c: Candidate, reason: str, current: bool) -> CandidateResult:
    nan = float("nan")
    return CandidateResult(c, nan, nan, nan, nan, nan, nan, None, {}, current, reason)
