"""dp.aggregate: true cells, integer noise with CIs, public domains, post-processing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from privpipe.dp.aggregate import (
    clamp_nonnegative,
    complete_domain,
    count_cells,
    make_consistent,
    noise_spec,
    noisy_counts,
    noisy_means,
    noisy_sums,
    round_cells,
    sum_cells,
)
from privpipe.dp.bounding import bound_contributions, sensitivities
from privpipe.dp.noise import SeededTestSampler, laplace_tail
from privpipe.errors import ConfigError, InputDataError


def _cells(n: int = 50) -> pd.DataFrame:
    return pd.DataFrame({"k": np.arange(n), "count": np.arange(n, dtype=np.int64) * 3})


@pytest.mark.parametrize(
    ("mechanism", "kw"),
    [
        ("discrete_laplace", {"epsilon": 0.5, "l1": 2.0}),
        ("discrete_gaussian", {"rho": 0.1, "l2": 2.0}),
    ],
)
def test_noisy_counts_reproducible_with_seeded_sampler(
    mechanism: str, kw: dict[str, float]
) -> None:
    cells = _cells()
    a = noisy_counts(cells, mechanism, sampler=SeededTestSampler(3), **kw)
    b = noisy_counts(cells, mechanism, sampler=SeededTestSampler(3), **kw)
    pd.testing.assert_frame_equal(a, b)
    assert a["count"].dtype == np.int64 and (a["k"] == cells["k"]).all()
    assert not (a["count"] == cells["count"]).all()
    width = noise_spec(mechanism, **kw).halfwidth
    assert ((a["ci_high"] - a["count"]) == width).all() and (
        (a["count"] - a["ci_low"]) == width
    ).all()
    assert (cells["count"] == np.arange(50) * 3).all()  # input untouched


def test_one_sampler_call_per_batch() -> None:
    calls: list[int] = []

    class Counting(SeededTestSampler):
        def discrete_laplace(self, values: np.ndarray, scale: float) -> np.ndarray:
            calls.append(len(values))
            return super().discrete_laplace(values, scale)

    noisy_counts(_cells(1000), "discrete_laplace", epsilon=1.0, l1=1.0, sampler=Counting(0))
    assert calls == [1000]


def test_ci_coverage_is_95_percent() -> None:
    # Discrete Laplace b = 4: coverage is exactly 1 − P(|X| > t) ≥ 0.95 (discreteness).
    spec = noise_spec("discrete_laplace", epsilon=0.5, l1=2.0)
    exact = 1.0 - laplace_tail(spec.scale, spec.halfwidth)
    assert 0.95 <= exact < 0.96
    cells = _cells(1000)
    hits = [0, 0]
    for seed in range(30):
        for i, (mech, kw) in enumerate(
            [
                ("discrete_laplace", {"epsilon": 0.5, "l1": 2.0}),
                ("discrete_gaussian", {"rho": 0.02, "l2": 2.0}),
            ]
        ):
            out = noisy_counts(cells, mech, sampler=SeededTestSampler(seed), **kw)
            truth = cells["count"]
            hits[i] += int(((out["ci_low"] <= truth) & (truth <= out["ci_high"])).sum())
    n = 30 * 1000
    sd = math.sqrt(0.95 * 0.05 / n)
    assert abs(hits[0] / n - exact) < 5 * sd
    assert 0.95 - 5 * sd < hits[1] / n < 0.96 + 5 * sd


def test_noise_refuses_floats_and_bad_parameters() -> None:
    cells = _cells().assign(count=lambda d: d["count"] + 0.5)
    with pytest.raises(ConfigError, match="integers"):
        noisy_counts(cells, "discrete_laplace", epsilon=1.0, l1=1.0, sampler=SeededTestSampler(0))
    with pytest.raises(ConfigError):
        noisy_counts(_cells(), "laplace", epsilon=1.0, l1=1.0, sampler=SeededTestSampler(0))
    with pytest.raises(ConfigError):
        noisy_counts(
            _cells(), "discrete_gaussian", epsilon=1.0, l1=1.0, sampler=SeededTestSampler(0)
        )


def test_accounting_mechanism_matches_budget() -> None:
    lap = noise_spec("discrete_laplace", epsilon=0.3, l1=6.0).accounting()
    assert float(lap.epsilon) == pytest.approx(0.3, rel=1e-12)
    gau = noise_spec("discrete_gaussian", rho=0.2, l2=3.0).accounting()
    assert gau.rho == pytest.approx(0.2, rel=1e-12)


def test_complete_domain_releases_every_public_cell() -> None:
    cells = pd.DataFrame({"a": ["x", "y", "zz"], "b": [1, 1, 9], "count": [5, 2, 7]})
    domain = pd.DataFrame({"a": ["x", "x", "y", "y"], "b": [1, 2, 1, 2]})
    full = complete_domain(cells, domain)
    assert full.to_dict("list") == {
        "a": ["x", "x", "y", "y"],
        "b": [1, 2, 1, 2],
        "count": [5, 0, 2, 0],
    }
    assert full["count"].dtype == np.int64  # "zz" (outside the domain) is never released
    out = noisy_counts(full, "discrete_laplace", epsilon=1.0, l1=1.0, sampler=SeededTestSampler(1))
    assert len(out) == 4


def test_counts_from_bounded_rows_respect_sensitivity() -> None:
    gen = np.random.default_rng(0)
    light = pd.DataFrame(
        {"pid": np.arange(300), "c": gen.integers(0, 5, 300), "v": gen.normal(size=300)}
    )
    heavy = pd.DataFrame({"pid": -1, "c": gen.integers(0, 5, 1000), "v": 1e6})
    domain = pd.DataFrame({"c": range(5)})
    l0, linf, lo, hi = 2, 3, -1.0, 10.0
    both = bound_contributions(pd.concat([light, heavy]), "pid", ["c"], l0, linf, rng=1)
    only = bound_contributions(light, "pid", ["c"], l0, linf, rng=1)
    dc = (
        complete_domain(count_cells(both, ["c"]), domain)["count"]
        - complete_domain(count_cells(only, ["c"]), domain)["count"]
    )
    assert dc.abs().sum() <= sensitivities(l0, linf)[0]
    ds = complete_domain(sum_cells(both, ["c"], "v", lo, hi), domain, ["sum_units"])["sum_units"]
    ds = (
        ds
        - complete_domain(sum_cells(only, ["c"], "v", lo, hi), domain, ["sum_units"])["sum_units"]
    )
    assert ds.abs().sum() <= sensitivities(l0, linf, clamp=(lo, hi))[0]
    assert ds.abs().sum() == l0 * linf * hi  # the heavy unit's 1e6 values are clamped to hi


def test_sums_clamp_and_fixed_point() -> None:
    rows = pd.DataFrame({"g": ["a", "a", "a", "b"], "v": [0.123, 99.0, -7.0, 1.26]})
    cells = sum_cells(rows, ["g"], "v", lo=0.0, hi=2.5, resolution=0.1)
    # a: 0.1 + 2.5 (clamped) + 0 (clamped) = 2.6 → 26 units; b: 1.3 → 13 units.
    assert cells.to_dict("list") == {"g": ["a", "b"], "sum_units": [26, 13]}
    l1, l2 = sensitivities(1, 1, clamp=(0.0, 2.5))
    out = noisy_sums(
        cells, "discrete_laplace", epsilon=1e6, l1=l1, resolution=0.1, sampler=SeededTestSampler(0)
    )
    assert out["sum"].tolist() == pytest.approx([2.6, 1.3])
    assert (out["ci_low"] <= out["sum"]).all() and (out["sum"] <= out["ci_high"]).all()
    noisy = noisy_sums(
        cells, "discrete_gaussian", rho=0.5, l2=l2, resolution=0.1, sampler=SeededTestSampler(0)
    )
    assert noisy["sum_units"].dtype == np.int64
    assert noisy["sum"].tolist() == pytest.approx((noisy["sum_units"] * 0.1).tolist())
    with pytest.raises(InputDataError):
        sum_cells(rows.assign(v=[1.0, None, 2.0, 3.0]), ["g"], "v", 0.0, 1.0)
    with pytest.raises(ConfigError):
        sum_cells(rows, ["g"], "v", 0.0, 1.0, resolution=0.0)


def test_noisy_means() -> None:
    gen = np.random.default_rng(2)
    rows = pd.DataFrame({"g": gen.integers(0, 3, 30_000), "v": gen.uniform(0, 100, 30_000)})
    truth = rows.groupby("g")["v"].mean().to_numpy()
    out = noisy_means(
        rows, ["g"], "v", 0.0, 100.0, l0=1, linf=1, mechanism="discrete_laplace",
        epsilon=1.0, sampler=SeededTestSampler(4), resolution=0.01,
    )  # fmt: skip
    assert out["mean"].to_numpy() == pytest.approx(truth, abs=0.5)
    assert ((out["mean"] >= 0) & (out["mean"] <= 100)).all()
    domain = pd.DataFrame({"g": [0, 1, 2, 3]})
    out = noisy_means(
        rows, ["g"], "v", 0.0, 100.0, l0=1, linf=1, mechanism="discrete_gaussian",
        rho=0.5, sampler=SeededTestSampler(4), domain=domain,
    )  # fmt: skip
    assert out["g"].tolist() == [0, 1, 2, 3] and 0.0 <= out["mean"].iloc[3] <= 100.0
    with pytest.raises(ConfigError):
        noisy_means(
            rows, ["g"], "v", 0.0, 1.0, l0=1, linf=1, mechanism="discrete_laplace",
            epsilon=1.0, sampler=SeededTestSampler(4), count_share=1.0,
        )  # fmt: skip


def test_clamp_and_round() -> None:
    frame = pd.DataFrame({"count": [-3, 4], "ci_low": [-9, 1], "ci_high": [3, 7], "x": [1.6, -0.4]})
    out = clamp_nonnegative(frame)
    assert out["count"].tolist() == [0, 4] and out["ci_low"].tolist() == [0, 1]
    assert frame["count"].tolist() == [-3, 4]
    rounded = round_cells(frame, ["count", "x"])
    assert rounded["x"].tolist() == [2, 0] and rounded["count"].tolist() == [-3, 4]
    assert rounded["count"].dtype == frame["count"].dtype


def test_make_consistent_keeps_totals() -> None:
    gen = np.random.default_rng(8)
    fine = pd.DataFrame({"city": [f"c{i}" for i in range(12)], "count": gen.integers(-5, 50, 12)})
    fine["ci_low"] = fine["count"] - 3
    to_region = {f"c{i}": f"r{i % 3}" for i in range(12)}
    coarse = pd.Series({"r0": 100, "r1": 37, "r2": 5})
    out = make_consistent(fine, to_region, coarse, key="city")
    totals = out.groupby(out["city"].map(to_region))["count"].sum()
    assert totals.to_dict() == {"r0": 100, "r1": 37, "r2": 5}
    assert out["count"].dtype == np.int64 and "ci_low" not in out
    # Least squares: the group's shortfall is spread evenly (up to integer rounding).
    shift = (out["count"] - fine["count"]).groupby(fine["city"].map(to_region))
    assert (shift.max() - shift.min()).max() <= 1
    # Inverse-variance combination: the total lands between the fine sum and the coarse value.
    float_out = make_consistent(
        fine, to_region, coarse, key="city", fine_variance=1.0, coarse_variance=4.0, integer=False
    )
    combined = float_out.groupby(fine["city"].map(to_region))["count"].sum()
    fine_sum = fine.groupby(fine["city"].map(to_region))["count"].sum()
    for r in coarse.index:
        lo, hi = sorted([fine_sum[r], coarse[r]])
        assert lo <= combined[r] <= hi
    assert combined["r0"] == pytest.approx(
        (fine_sum["r0"] / 4 + coarse["r0"] / 4) / (1 / 4 + 1 / 4)
    )
