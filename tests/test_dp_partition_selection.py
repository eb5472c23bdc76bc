"""Private partition selection: the single-unit key is kept w.p. ≤ δ, big keys are kept."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta

from privpipe.dp.noise import SecureSampler, SeededTestSampler
from privpipe.dp.partition_selection import (
    Method,
    bernoulli,
    keep_probability,
    laplace_threshold,
    select_partitions,
)
from privpipe.errors import ConfigError

ALPHA = 1e-3


def _clopper_pearson(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(beta.ppf(ALPHA / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - ALPHA / 2, k + 1, n - k))
    return lo, hi


def _recursion_pi(n_max: int, eps: float, delta: float) -> list[float]:
    """The largest π allowed by the two (ε, δ)-DP constraints between n−1 and n units."""
    pi = [0.0]
    for _ in range(n_max):
        prev = pi[-1]
        pi.append(min(math.exp(eps) * prev + delta, 1 - math.exp(-eps) * (1 - prev - delta), 1.0))
    return pi


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-5), (0.1, 1e-2), (3.0, 1e-9), (0.5, 0.3)])
def test_truncated_geometric_closed_form_is_the_optimal_recursion(eps: float, delta: float) -> None:
    closed = keep_probability(np.arange(0, 1500), eps, delta, 1, "truncated_geometric")
    np.testing.assert_allclose(closed, _recursion_pi(1499, eps, delta), atol=1e-12)


@pytest.mark.parametrize("l0", [1, 3])
def test_truncated_geometric_uses_eps_and_delta_over_l0(l0: int) -> None:
    pi = keep_probability(np.arange(0, 400), 2.0, 1e-4, l0, "truncated_geometric")
    np.testing.assert_allclose(pi, _recursion_pi(399, 2.0 / l0, 1e-4 / l0), atol=1e-12)
    assert pi[1] == pytest.approx(1e-4 / l0)


@pytest.mark.parametrize(("eps", "delta", "l0"), [(1.0, 1e-2, 1), (0.5, 1e-6, 4), (2.0, 0.4, 2)])
def test_laplace_threshold_is_the_smallest_with_tail_at_most_delta(
    eps: float, delta: float, l0: int
) -> None:
    tau = laplace_threshold(eps, delta, l0)
    scale = l0 / eps
    p = math.exp(-1 / scale)

    def tail_ge(k: int) -> float:  # P[X ≥ k], brute-force sum of the pmf
        js = np.arange(k, k + 4000 * math.ceil(scale))
        return float(((1 - p) / (1 + p) * p ** np.abs(js)).sum())

    assert tail_ge(tau - 1) <= delta / l0
    assert tail_ge(tau - 2) > delta / l0
    assert keep_probability([1], eps, delta, l0, "laplace")[0] == pytest.approx(tail_ge(tau - 1))


@pytest.mark.parametrize("method", ["laplace", "truncated_geometric"])
def test_keep_probability_is_monotone_and_reaches_one(method: Method) -> None:
    pi = keep_probability(np.arange(0, 300), 1.0, 1e-6, 2, method)
    assert pi[0] == 0.0
    assert np.all(np.diff(pi) >= 0)
    assert pi[1] <= 1e-6 / 2 * (1 + 1e-12)
    assert pi[-1] > 1 - 1e-9


@pytest.mark.parametrize(
    ("method", "n_draws"), [("laplace", 100_000), ("truncated_geometric", 50_000)]
)
def test_single_unit_key_is_released_with_probability_at_most_delta(
    method: Method, n_draws: int
) -> None:
    delta = 1e-2
    kept = select_partitions(
        np.ones(n_draws, dtype=np.int64),
        1.0,
        delta,
        1,
        method,
        SecureSampler(),
    )
    lo, hi = _clopper_pearson(int(kept.sum()), n_draws)
    assert lo <= delta
    expected = float(keep_probability([1], 1.0, delta, 1, method)[0])
    assert lo <= expected <= hi


@pytest.mark.parametrize("method", ["laplace", "truncated_geometric"])
def test_keys_with_many_units_are_kept_and_empty_keys_never(method: Method) -> None:
    counts = np.array([0] * 500 + [200] * 2000, dtype=np.int64)
    kept = select_partitions(counts, 1.0, 1e-6, 1, method, SecureSampler())
    assert not kept[:500].any()
    assert kept[500:].all()


def test_seeded_sampler_is_reproducible_and_empty_input_ok() -> None:
    counts = np.arange(0, 40, dtype=np.int64)
    a = select_partitions(counts, 1.0, 1e-3, 1, "truncated_geometric", SeededTestSampler(7))
    b = select_partitions(counts, 1.0, 1e-3, 1, "truncated_geometric", SeededTestSampler(7))
    np.testing.assert_array_equal(a, b)
    methods: tuple[Method, ...] = ("laplace", "truncated_geometric")
    for method in methods:
        empty = select_partitions(
            np.zeros(0, dtype=np.int64), 1.0, 1e-3, 1, method, SecureSampler()
        )
        assert empty.shape == (0,) and empty.dtype == np.bool_


def test_bernoulli_is_exact_on_dyadic_probabilities() -> None:
    n = 40_000
    out = bernoulli(np.full(n, 0.3125), SeededTestSampler(3))  # 0.0101 in binary
    lo, hi = _clopper_pearson(int(out.sum()), n)
    assert lo <= 0.3125 <= hi
    np.testing.assert_array_equal(bernoulli([0.0, 1.0], SecureSampler()), [False, True])
    with pytest.raises(ValueError):
        bernoulli([1.5], SecureSampler())


@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_epsilon_is_a_config_error(eps: float) -> None:
    with pytest.raises(ConfigError):
        select_partitions(np.ones(3, dtype=np.int64), eps, 1e-5, 1, "laplace", SecureSampler())


@pytest.mark.parametrize("delta", [0.0, -1e-5, 1.0, 2.0, float("nan")])
def test_bad_delta_is_a_config_error(delta: float) -> None:
    with pytest.raises(ConfigError):
        keep_probability([1], 1.0, delta, 1, "truncated_geometric")


def test_bad_l0_and_method_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        keep_probability([1], 1.0, 1e-5, 0, "laplace")
    with pytest.raises(ConfigError):
        keep_probability([1], 1.0, 1e-5, 1, "gaussian")  # type: ignore[arg-type]
