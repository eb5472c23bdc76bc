"""dp.tuning: exact bounding bias and variance, noise from the plan, recommendations on
planted data (the pure core; `privpipe tune` end to end is in test_tune_cli.py)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from privpipe.dp.bounding import bound_units
from privpipe.dp.noise import discrete_laplace_variance
from privpipe.dp.spec import DPReleaseSpec, Query, plan_queries
from privpipe.dp.tuning import (
    Candidate,
    QueryData,
    bounded_cells,
    pair_values,
    pairs_of,
    tune_release,
)
from privpipe.errors import InputDataError


def spec(kind: str = "dp_histogram", **kw: Any) -> DPReleaseSpec:
    base: dict[str, Any] = {
        "name": "r", "kind": kind, "epsilon": Fraction(1), "unit": "id",
        "queries": (Query("q", ("d",)),), "max_partitions": 1, "max_contributions": 1,
    }  # fmt: skip
    if kind in ("dp_sum", "dp_mean", "dp_top_k", "dp_mode"):
        base["value"] = "v"
    if kind in ("dp_sum", "dp_mean"):
        base["bounds"] = (0.0, 50.0)
    base.update(kw)
    return DPReleaseSpec(**base)


# A: cell 1 with values 10, 20, 30 and cell 2 with 5; B: cell 1 with 100.
TINY_UNIT = np.array([0, 0, 0, 0, 1], dtype=np.uint64)
TINY_CELL = np.array([1, 1, 1, 2, 1], dtype=np.uint64)
TINY_VALUE = np.array([10.0, 20.0, 30.0, 5.0, 100.0])


def tiny() -> tuple[DPReleaseSpec, QueryData]:
    s = spec("dp_sum", bounds=(0.0, 50.0))
    return s, QueryData(cell=TINY_CELL, unit=TINY_UNIT, value=TINY_VALUE)


def test_bias_and_variance_exact_on_a_tiny_case_by_hand() -> None:
    """L0 = 1, Linf = 2, clamp [0, 50]. A keeps each of its 2 cells with π = 1/2 and, in
    cell 1, 2 of its 3 rows; B keeps everything, its 100 clamped to 50.
    cell 1: count E = ½·2 + 1 = 2 (truth 4), Var = ¼·2² = 1;
            sum   E[Y_A] = 2·60/3 = 40, Var[Y_A] = 2·1/2·σ², σ² = 200/3 (population),
                  E = ½·40 + 50 = 70 (truth 160), Var = ½·200/3 + ¼·40² = 1300/3;
    cell 2: count E = ½ (truth 1), Var = ¼; sum E = 2.5 (truth 5), Var = ¼·25."""
    s, d = tiny()
    p = pairs_of(d, s)
    b = bounded_cells(p, 1, 2, pair_values(p, TINY_VALUE, 0.0, 1.0, (0, 50)))
    order = np.argsort(p.cell_ids)  # cells 1, 2
    assert b.sum is not None and b.sum_var is not None and b.true_sum is not None
    np.testing.assert_allclose(b.true_count[order], [4, 1])
    np.testing.assert_allclose(b.count[order] - b.true_count[order], [-2, -0.5])
    np.testing.assert_allclose(b.count_var[order], [1, 0.25])
    np.testing.assert_allclose(b.true_sum[order], [160, 5])
    np.testing.assert_allclose(b.sum[order] - b.true_sum[order], [-90, -2.5])
    np.testing.assert_allclose(b.sum_var[order], [1300 / 3, 6.25])
    np.testing.assert_allclose(b.units[order], [1.5, 0.5])
    assert b.rows_kept == pytest.approx((0.5 * 2 + 0.5 * 1 + 1) / 5)


def test_expectations_match_the_bounding_code() -> None:
    """The closed forms against dp.bounding.bound_units itself, averaged over many draws."""
    rng = np.random.default_rng(7)
    unit = rng.integers(0, 40, 600).astype(np.uint64)
    cell = rng.integers(0, 6, 600).astype(np.uint64)
    value = rng.exponential(30.0, 600)
    s = spec("dp_sum", bounds=(0.0, 60.0))
    p = pairs_of(QueryData(cell=cell, unit=unit, value=value), s)
    clamped = np.clip(np.rint(value), 0, 60)
    b = bounded_cells(p, 2, 3, pair_values(p, value, 0.0, 1.0, (0, 60)))
    draws = []
    gen = np.random.default_rng(11)
    for _ in range(1500):
        keep = bound_units(unit, cell, 2, 3, gen)
        draws.append(np.bincount(p.cell[p.row_pair], weights=clamped * keep, minlength=6))
    sums = np.array(draws)
    assert b.sum is not None and b.sum_var is not None
    se = np.sqrt(b.sum_var / len(draws))
    assert np.all(np.abs(sums.mean(axis=0) - b.sum) < 5 * se + 1e-9)
    np.testing.assert_allclose(sums.var(axis=0), b.sum_var, rtol=0.15)


def test_noise_part_is_the_planned_mechanism_variance() -> None:
    """Bounds that drop nothing: no bias, no sampling; noise = the planned scale's variance.
    One cell: A has 4 rows there, B 1."""
    s = spec("dp_count", queries=(Query("q"),), max_partitions=1, max_contributions=4)
    d = QueryData(cell=np.zeros(5, np.uint64), unit=TINY_UNIT, domain=np.zeros(1, np.uint64))
    r = tune_release(s, [d], grid=[Candidate(1, 3)])
    assert r.current is not None and r.current.bias == 0 and r.current.sampling == 0
    plan = plan_queries(s)[0]
    assert plan.count_noise is not None and plan.count_noise.scale == 4.0
    assert r.current.noise == pytest.approx(math.sqrt(discrete_laplace_variance(4.0)))
    worse = next(c for c in r.results if not c.current)  # Linf = 3: A loses one row
    assert worse.bias == pytest.approx(1.0) and worse.sampling == 0
    assert worse.noise == pytest.approx(math.sqrt(discrete_laplace_variance(3.0)))
    assert worse.error == pytest.approx(math.sqrt(1 + discrete_laplace_variance(3.0)))


def planted() -> tuple[np.ndarray, np.ndarray]:
    """2000 persons with exactly 3 rows in one of 20 cells, 2 persons with 50 rows (cells 0
    and 1). At epsilon 1, RMSE² = Σ_heavy (50 − Linf)²/20 + Var(DLap(Linf)): 3 is the least
    (below 3 every person loses rows; Linf = 5 already costs more noise than it saves)."""
    rows = np.r_[np.full(2000, 3), [50, 50]]
    unit = np.repeat(np.arange(rows.size), rows)
    cell = np.r_[np.arange(2000) % 20, [0, 1]][unit]
    return unit.astype(np.uint64), cell.astype(np.uint64)


def test_recommends_the_planted_contribution_bound() -> None:
    unit, cell = planted()
    data = QueryData(cell=cell, unit=unit, domain=np.arange(20, dtype=np.uint64))
    r = tune_release(spec(max_contributions=50), [data])
    assert r.best is not None
    assert (r.best.candidate.max_partitions, r.best.candidate.max_contributions) == (1, 3)
    tried = {c.candidate.max_contributions for c in r.results}
    assert {1, 2, 3, 5, 10, 20, 50} <= tried
    by = {c.candidate.max_contributions: c for c in r.results}
    assert by[50].bias == 0 and by[50].noise > by[3].error  # the configured 50: all noise
    assert by[2].bias > by[3].bias  # below 3 every person loses rows
    assert by[3].bias == pytest.approx(math.sqrt(2 * 47**2 / 20))
    assert by[3].persons_kept == pytest.approx(2000 / 2002)
    assert by[3].rows_kept == pytest.approx(6006 / 6100)


def test_recommends_the_planted_number_of_partitions() -> None:
    """Persons in exactly 2 of 20 cells (1 row each); a few in all 20: L0 = 2 is best."""
    rng = np.random.default_rng(5)
    cells = [rng.choice(20, 2, replace=False) for _ in range(3000)] + [np.arange(20)] * 3
    unit = np.repeat(np.arange(len(cells)), [len(c) for c in cells]).astype(np.uint64)
    data = QueryData(cell=np.concatenate(cells).astype(np.uint64), unit=unit,
                     domain=np.arange(20, dtype=np.uint64))  # fmt: skip
    r = tune_release(spec(max_partitions=20), [data])
    assert r.best is not None and r.best.candidate.max_partitions == 2
    assert r.best.candidate.max_contributions == 1


def test_empty_domain_cells_count_noise_only() -> None:
    s = spec("dp_count", queries=(Query("q", ("d",)),))
    d = QueryData(cell=TINY_CELL, unit=TINY_UNIT, domain=np.array([1, 2, 3, 4], np.uint64))
    r = tune_release(s, [d], grid=[Candidate(2, 3)])
    (q,) = r.results[0].queries.values()
    assert q.cells == 4
    assert q.noise == pytest.approx(math.sqrt(discrete_laplace_variance(6.0)))


def test_private_partitions_count_dropped_cells() -> None:
    """A cell of one person is almost surely dropped by partition selection: its truth is
    the error; the crowded cell is kept."""
    unit = np.r_[np.arange(500), [900]].astype(np.uint64)
    cell = np.r_[np.zeros(500), [1]].astype(np.uint64)
    s = spec("dp_count", partitions="private", delta=Fraction(1, 10**6))
    r = tune_release(s, [QueryData(cell=cell, unit=unit)], grid=[Candidate(1, 1)])
    (q,) = r.results[0].queries.values()
    assert q.cells == 2 and 0.4 < q.cells_dropped <= 0.5
    assert q.bias == pytest.approx(math.sqrt(0.5), rel=0.01)  # (0² + 1²)/2 from the drop


def test_sum_bounds_from_quantiles_cut_the_outliers() -> None:
    """One person of 5000 has 10^6 (the others up to 100), sums over 20 cells: clamping at
    the data's 99th percentile loses 10^6 in one cell, keeping it costs noise of scale 10^6
    in all 20: the tuned upper bound is a quantile, far below the maximum."""
    rng = np.random.default_rng(9)
    value = np.r_[rng.uniform(0, 100, 5000), [1e6]]
    unit = np.arange(value.size).astype(np.uint64)
    cell = (np.arange(value.size) % 20).astype(np.uint64)
    data = QueryData(cell=cell, unit=unit, value=value, domain=np.arange(20, dtype=np.uint64))
    s = spec("dp_sum", bounds=(0.0, 1e6))
    r = tune_release(s, [data])
    assert r.best is not None and r.best.candidate.bounds is not None
    lo, hi = r.best.candidate.bounds
    assert lo == 0 and 90 <= hi <= 1000
    assert r.current is not None and r.current.error > 5 * r.best.error
    assert r.best.values_unclamped is not None and r.best.values_unclamped > 0.9


def test_mean_error_is_bias_for_a_one_sided_clamp() -> None:
    """Every value 80, clamp [0, 50]: the mean is off by exactly 30 (one row per person)."""
    n = 2000
    data = QueryData(cell=np.zeros(n, np.uint64), unit=np.arange(n).astype(np.uint64),
                     value=np.full(n, 80.0), domain=np.zeros(1, np.uint64))  # fmt: skip
    s = spec("dp_mean", queries=(Query("q"),), bounds=(0.0, 50.0))
    r = tune_release(s, [data], grid=[Candidate(1, 1, (0.0, 50.0)), Candidate(1, 1, (0.0, 80.0))])
    by = {c.candidate.bounds: c for c in r.results}
    assert by[(0.0, 50.0)].bias == pytest.approx(30.0)
    assert by[(0.0, 80.0)].bias == pytest.approx(0.0, abs=1e-9)
    assert r.best is not None and r.best.candidate.bounds == (0.0, 80.0)


def test_top_k_bias_is_the_noiseless_pick_shortfall() -> None:
    """Value A: 10 persons × 10 rows (100); B: 60 persons × 1 row. Linf = 1 counts A as
    10 and picks B: a shortfall of exactly 40 rows before any noise."""
    unit = np.r_[np.repeat(np.arange(10), 10), np.arange(10, 70)].astype(np.uint64)
    value = np.r_[np.zeros(100), np.ones(60)].astype(np.uint64)  # the cell is the value
    s = spec("dp_mode", queries=(Query("q"),), epsilon=Fraction(5))
    d = QueryData(cell=value, unit=unit, top_group=np.zeros(160, np.uint64), candidates=2)
    r = tune_release(s, [d], grid=[Candidate(1, 1), Candidate(1, 10)])
    by = {c.candidate.max_contributions: c for c in r.results}
    assert by[1].bias == pytest.approx(40.0)
    assert by[10].bias == pytest.approx(0.0)
    assert r.best is not None and r.best.candidate.max_contributions == 10


def test_person_in_two_groups_is_refused_unless_bound_to_one_group() -> None:
    unit = np.array([0, 0, 1], np.uint64)
    cell = np.array([1, 2, 3], np.uint64)
    group = np.array([7, 8, 8], np.uint64)  # person 0 in groups 7 and 8
    s = spec(partition_by=("g",))
    with pytest.raises(InputDataError, match="more than one partition_by group"):
        pairs_of(QueryData(cell=cell, unit=unit, group=group), s)
    p = pairs_of(QueryData(cell=cell, unit=unit, group=group),
                 spec(partition_by=("g",), bound_to_one_group=True))  # fmt: skip
    np.testing.assert_allclose(p.keep_probability(1), [0.5, 0.5, 1.0])


def test_a_candidate_the_planner_refuses_is_reported_not_chosen() -> None:
    s = spec("dp_sum", queries=(Query("q"),), bounds=(0.0, 1.0), resolution=1e-20)
    d = QueryData(cell=np.zeros(3, np.uint64), unit=np.arange(3).astype(np.uint64),
                  value=np.ones(3), domain=np.zeros(1, np.uint64))  # fmt: skip
    r = tune_release(s, [d], grid=[Candidate(1, 1, (0.0, 1.0))])
    assert r.best is None and r.results[0].refused and "2^53" in r.results[0].refused


# --------------------------------------------------------------------------- new kinds


def test_count_distinct_is_exact_by_hand_and_counts_a_person_once() -> None:
    """TINY: A has 3 rows in cell 1 and 1 in cell 2, B 1 row in cell 1. Persons: cell 1
    has 2 (not 4 rows), cell 2 has 1. L0 = 1: A keeps each cell with π = ½, so cell 1
    expects 1.5 persons (bias −½, variance ¼) and cell 2 ½ (bias −½, variance ¼), whatever
    Linf; L0 = 2 keeps every person: no bias, noise of the doubled sensitivity only."""
    s = spec("dp_count_distinct", max_partitions=2, max_contributions=1)
    d = QueryData(cell=TINY_CELL, unit=TINY_UNIT, domain=np.array([1, 2], np.uint64))
    r = tune_release(s, [d], grid=[Candidate(1, 1), Candidate(2, 1), Candidate(1, 3)])
    by = {(c.candidate.max_partitions, c.candidate.max_contributions): c for c in r.results}
    assert by[(1, 1)].bias == pytest.approx(0.5) and by[(1, 1)].sampling == pytest.approx(0.5)
    assert by[(1, 1)].noise == pytest.approx(math.sqrt(discrete_laplace_variance(1.0)))
    assert by[(1, 3)].error == pytest.approx(by[(1, 1)].error)  # Linf: persons count once
    assert by[(2, 1)].bias == 0 and by[(2, 1)].sampling == 0
    assert by[(2, 1)].noise == pytest.approx(math.sqrt(discrete_laplace_variance(2.0)))


def test_count_distinct_recommends_the_planted_number_of_partitions() -> None:
    """3000 persons with 5 rows in one of 20 cells, 3 persons in all 20: L0 = 1 loses
    under 3 persons per cell, L0 = 20 (configured) pays noise of scale 20 in every cell.
    Linf is not varied (rows do not change a distinct count)."""
    cells = [np.full(5, i % 20) for i in range(3000)] + [np.arange(20)] * 3
    unit = np.repeat(np.arange(len(cells)), [len(c) for c in cells]).astype(np.uint64)
    data = QueryData(cell=np.concatenate(cells).astype(np.uint64), unit=unit,
                     domain=np.arange(20, dtype=np.uint64))  # fmt: skip
    r = tune_release(spec("dp_count_distinct", max_partitions=20), [data])
    assert r.best is not None and r.best.candidate.max_partitions == 1
    assert {c.candidate.max_contributions for c in r.results} == {1}
    assert r.current is not None and r.current.bias == 0
    assert r.current.error > 5 * r.best.error
    assert r.best.bias == pytest.approx(3 * 19 / 20)  # each cell loses 3·(1 − 1/20)


def test_variance_bias_is_the_clamp_exactly() -> None:
    """One cell, 2000 persons, half at 0 and half at 100 (variance 2500, sd 50); clamp
    [25, 75] makes them 25 and 75 (variance 625): bias −1875 (sd: −25), none with [0, 100]."""
    n = 2000
    value = np.r_[np.zeros(n // 2), np.full(n // 2, 100.0)]
    d = QueryData(cell=np.zeros(n, np.uint64), unit=np.arange(n).astype(np.uint64),
                  value=value, domain=np.zeros(1, np.uint64))  # fmt: skip
    grid = [Candidate(1, 1, (25.0, 75.0)), Candidate(1, 1, (0.0, 100.0))]
    for kind, lost in (("dp_variance", 1875.0), ("dp_stddev", 25.0)):
        s = spec(kind, queries=(Query("q"),), value="v", bounds=(0.0, 100.0))
        by = {c.candidate.bounds: c for c in tune_release(s, [d], grid=grid).results}
        assert by[(25.0, 75.0)].bias == pytest.approx(lost)
        assert by[(0.0, 100.0)].bias == pytest.approx(0.0, abs=1e-6)
        assert by[(0.0, 100.0)].sampling == 0


def test_variance_noise_is_the_delta_method_of_the_planned_noises() -> None:
    """One cell, values symmetric about the centre (S = 0): the first-order noise variance
    is (Q/N²)²·Var N + Var Q/N² with the plan's three noises (Var S drops out)."""
    n = 400
    value = np.r_[np.full(n // 2, 40.0), np.full(n // 2, 60.0)]
    d = QueryData(cell=np.zeros(n, np.uint64), unit=np.arange(n).astype(np.uint64),
                  value=value, domain=np.zeros(1, np.uint64))  # fmt: skip
    s = spec("dp_variance", queries=(Query("q"),), value="v", bounds=(0.0, 100.0))
    plan = plan_queries(s)[0]
    assert plan.count_noise and plan.sumsq_noise and plan.centre == 50.0
    q = n * 100.0  # Σ (v − 50)²
    want = (q / n**2) ** 2 * discrete_laplace_variance(plan.count_noise.scale)
    want += discrete_laplace_variance(plan.sumsq_noise.scale) / n**2
    r = tune_release(s, [d], grid=[Candidate(1, 1, (0.0, 100.0))])
    assert r.results[0].noise == pytest.approx(math.sqrt(want))


def test_sum_of_squares_moments_match_the_bounding_code() -> None:
    """E[Q], Var Q, Cov(N, Q), Cov(S, Q) of the variance's bounded parts against
    dp.bounding.bound_units itself over many draws."""
    rng = np.random.default_rng(3)
    unit = rng.integers(0, 40, 600).astype(np.uint64)
    cell = rng.integers(0, 3, 600).astype(np.uint64)
    value = rng.exponential(20.0, 600) - 15.0  # skewed: Cov(x, x²) ≠ 0
    s = spec("dp_variance", value="v", bounds=(-30.0, 30.0))
    p = pairs_of(QueryData(cell=cell, unit=unit, value=value), s)
    b = bounded_cells(p, 1, 2, pair_values(p, value, 0.0, 1.0, (-30, 30), moments=True))
    assert b.moments is not None and b.sum is not None
    clamped = np.clip(np.rint(value), -30, 30)
    gen = np.random.default_rng(13)
    draws = []
    for _ in range(2000):
        keep = bound_units(unit, cell, 1, 2, gen).astype(np.float64)
        c = p.cell[p.row_pair]
        draws.append([np.bincount(c, weights=w, minlength=3)
                      for w in (keep, clamped * keep, clamped**2 * keep)])  # fmt: skip
    arr = np.array(draws)  # (draws, N/S/Q, cells)
    nn, ss, qq = arr[:, 0], arr[:, 1], arr[:, 2]
    m = b.moments
    se = np.sqrt(m.sumsq_var / len(draws))
    assert np.all(np.abs(qq.mean(axis=0) - m.sumsq) < 5 * se + 1e-9)
    np.testing.assert_allclose(qq.var(axis=0), m.sumsq_var, rtol=0.15)

    def cov(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return ((x - x.mean(axis=0)) * (y - y.mean(axis=0))).mean(axis=0)

    for x, want in ((nn, m.cov_count), (ss, m.cov_sum)):  # within 5 standard errors
        se_cov = np.sqrt(x.var(axis=0) * qq.var(axis=0) / len(draws))
        assert np.all(np.abs(cov(x, qq) - want) < 5 * se_cov)
    assert np.abs(m.cov_sum).max() > 0 and np.abs(m.cov_count).max() > 0


def test_variance_bounds_from_quantiles_cut_a_planted_outlier() -> None:
    """5000 persons around 50 in 20 cells and one at 10^4: clamping at [0, 10^4] costs a
    sum-of-squares noise of scale ~2.5·10^7 in every cell; the tuned bounds are quantiles."""
    rng = np.random.default_rng(21)
    value = np.r_[rng.normal(50.0, 10.0, 5000), [1e4]]
    unit = np.arange(value.size).astype(np.uint64)
    cell = (np.arange(value.size) % 20).astype(np.uint64)
    data = QueryData(cell=cell, unit=unit, value=value, domain=np.arange(20, dtype=np.uint64))
    for kind in ("dp_variance", "dp_stddev"):
        r = tune_release(spec(kind, value="v", bounds=(0.0, 1e4)), [data])
        assert r.best is not None and r.best.candidate.bounds is not None
        assert r.best.candidate.bounds[1] <= 200
        assert r.current is not None and r.current.error > 5 * r.best.error


def test_quantile_error_is_the_exponential_mechanism_law_on_a_tiny_cell() -> None:
    """Values 0..4 (one row each), grid [0, 4], median at ε = 1: the error² is
    Σ P(c)·(c − 2)² with P the exact law of dp.exponential on dp.release's utilities."""
    from privpipe.dp.exponential import selection_probabilities
    from privpipe.dp.release import quantile_utilities

    d = QueryData(cell=np.zeros(5, np.uint64), unit=np.arange(5).astype(np.uint64),
                  value=np.arange(5.0), domain=np.zeros(1, np.uint64))  # fmt: skip
    s = spec("dp_median", queries=(Query("q"),), value="v", bounds=(0.0, 4.0))
    r = tune_release(s, [d], grid=[Candidate(1, 1, (0.0, 4.0))])
    u = quantile_utilities(np.ones(5, np.int64), Fraction(1, 2))
    prob = selection_probabilities(u, 1.0, 1.0)
    want = float((prob * (np.arange(5.0) - 2.0) ** 2).sum())
    res = r.results[0]
    assert res.bias == 0 and res.sampling == 0
    assert res.error == pytest.approx(math.sqrt(want))
    (q,) = res.queries.values()
    assert q.cells == 1 and q.cells_evaluated == 1


def test_quantile_bounds_cut_a_planted_outlier_and_sample_cells() -> None:
    """20 cells of 15 persons with values in [0, 100], two persons at 10^5. The configured
    grid [0, 10^5] (100,001 points) gives every far grid point weight e^{-ε·15/2}: the
    mechanism mostly picks far from the median. The tuned bounds are quantiles; the wide
    grid is evaluated on a sample of the cells (memory cap)."""
    rng = np.random.default_rng(4)
    value = np.r_[rng.uniform(0, 100, 300), [1e5, 1e5]]
    unit = np.arange(value.size).astype(np.uint64)
    cell = (np.arange(value.size) % 20).astype(np.uint64)
    data = QueryData(cell=cell, unit=unit, value=value, domain=np.arange(20, dtype=np.uint64))
    s = spec("dp_quantile", value="v", bounds=(0.0, 1e5), quantiles=(Fraction(1, 2),))
    r = tune_release(s, [data])
    assert r.best is not None and r.best.candidate.bounds is not None
    assert r.best.candidate.bounds[1] <= 1000
    assert r.current is not None and r.current.error > 5 * r.best.error
    (wide,) = r.current.queries.values()
    assert wide.cells == 20 and wide.cells_evaluated == 20


def test_quantile_runs_of_empty_grid_points_match_the_dense_law() -> None:
    """Values 3, 3, 10, 40 on the grid 0..50 (runs of empty points between them), the
    quantiles 0.5 and 0.9: the error² of each is Σ P(c)·(c − q)² over every grid point, P the
    exact law of dp.exponential on dp.release's utilities, q the raw quantile."""
    from privpipe.dp.exponential import selection_probabilities
    from privpipe.dp.release import quantile_utilities

    value = np.array([3.0, 3.0, 10.0, 40.0])
    d = QueryData(cell=np.zeros(4, np.uint64), unit=np.arange(4).astype(np.uint64),
                  value=value, domain=np.zeros(1, np.uint64))  # fmt: skip
    quantiles = (Fraction(1, 2), Fraction(9, 10))
    s = spec("dp_quantile", queries=(Query("q"),), value="v", bounds=(0.0, 50.0),
             quantiles=quantiles, epsilon=Fraction(2))  # fmt: skip
    r = tune_release(s, [d], grid=[Candidate(1, 1, (0.0, 50.0))]).results[0]
    hist = np.bincount(value.astype(int), minlength=51)
    grid = np.arange(51.0)
    want_err = want_bias = 0.0
    for q in quantiles:
        u = quantile_utilities(hist, q)
        prob = selection_probabilities(u, 1.0, float(max(q.numerator, q.denominator - q.numerator)))
        t = float(np.quantile(value, float(q)))
        want_err += float((prob * (grid - t) ** 2).sum()) / 2
        want_bias += (float(grid[u == u.max()].mean()) - t) ** 2 / 2
    assert r.error == pytest.approx(math.sqrt(want_err))
    assert r.bias == pytest.approx(math.sqrt(want_bias))


def test_quantile_cells_are_sampled_beyond_the_cap() -> None:
    """100 cells: the error is evaluated on an even sample of MAX_QUANTILE_CELLS of them."""
    from privpipe.dp.tuning import MAX_QUANTILE_CELLS

    value = np.tile(np.arange(10.0), 100)
    cell = np.repeat(np.arange(100), 10).astype(np.uint64)
    d = QueryData(cell=cell, unit=np.arange(1000).astype(np.uint64), value=value,
                  domain=np.arange(100, dtype=np.uint64))  # fmt: skip
    s = spec("dp_median", value="v", bounds=(0.0, 10.0))
    (q,) = tune_release(s, [d], grid=[Candidate(1, 1, (0.0, 10.0))]).results[0].queries.values()
    assert q.cells == 100 and q.cells_evaluated == MAX_QUANTILE_CELLS < 100


def test_variance_spread_is_capped_by_the_release_clip() -> None:
    """Three rows at ε = 0.1: the first-order noise of Q/N − (S/N)² would be ~10^5, but the
    release clips the variance to [0, m²] = [0, 2500] (the deviation to [0, 50])."""
    d = QueryData(cell=np.zeros(3, np.uint64), unit=np.arange(3).astype(np.uint64),
                  value=np.array([10.0, 50.0, 90.0]), domain=np.zeros(1, np.uint64))  # fmt: skip
    for kind, top in (("dp_variance", 2500.0), ("dp_stddev", 50.0)):
        s = spec(kind, queries=(Query("q"),), value="v", bounds=(0.0, 100.0),
                 epsilon=Fraction(1, 10))  # fmt: skip
        r = tune_release(s, [d], grid=[Candidate(1, 1, (0.0, 100.0))]).results[0]
        assert r.noise == pytest.approx(top)
