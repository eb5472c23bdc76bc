"""The exponential mechanism: frequencies follow exp(ε·u/2Δu); top-k peels distinct indices."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

from privpipe.dp.exponential import exponential_mechanism, selection_probabilities, top_k
from privpipe.dp.noise import SecureSampler, SeededTestSampler
from privpipe.errors import ConfigError


def test_selection_probabilities_are_the_normalised_exponential_weights() -> None:
    u = np.array([0, 1, 3], dtype=np.int64)
    w = np.exp(0.5 * u / 2.0)
    np.testing.assert_allclose(selection_probabilities(u, 0.5), w / w.sum())
    w2 = np.exp(2.0 * u / (2.0 * 3.0))
    np.testing.assert_allclose(selection_probabilities(u, 2.0, 3.0), w2 / w2.sum())


@pytest.mark.parametrize(("eps", "sens"), [(1.0, 1.0), (2.0, 2.0)])
def test_secure_frequencies_match_the_exponential_law(eps: float, sens: float) -> None:
    u = np.array([5, 3, 4, 0, 5], dtype=np.int64)
    n = 8_000
    counts = Counter(exponential_mechanism(u, eps, sens) for _ in range(n))
    observed = np.array([counts.get(i, 0) for i in range(u.size)])
    expected = selection_probabilities(u, eps, sens) * n
    assert chisquare(observed, expected).pvalue > 1e-3


def test_seeded_path_matches_the_law_and_is_reproducible() -> None:
    u = np.array([2, 0, 1], dtype=np.int64)
    s = SeededTestSampler(11)
    draws = [exponential_mechanism(u, 1.0, sampler=s) for _ in range(6_000)]
    observed = np.bincount(draws, minlength=3)
    assert chisquare(observed, selection_probabilities(u, 1.0) * 6_000).pvalue > 1e-3
    a = top_k(u, 2, 1.0, sampler=SeededTestSampler(5))
    b = top_k(u, 2, 1.0, sampler=SeededTestSampler(5))
    np.testing.assert_array_equal(a, b)


def test_top_k_returns_k_distinct_indices() -> None:
    u = np.array([10, 0, 7, 3, 9, 1], dtype=np.int64)
    for k in (1, 3, 6):
        idx = top_k(u, k, 1.0)
        assert idx.shape == (k,)
        assert len(set(idx.tolist())) == k
        assert set(idx.tolist()) <= set(range(u.size))


def test_top_k_with_large_epsilon_finds_the_true_top() -> None:
    u = np.array([100, 0, 700, 300, 900, 10], dtype=np.int64)
    assert top_k(u, 3, 50.0).tolist() == [4, 2, 3]


def test_single_candidate() -> None:
    assert exponential_mechanism([42], 1.0) == 0
    assert top_k([42], 1, 1.0).tolist() == [0]


@pytest.mark.parametrize("eps", [0.0, -0.5, float("nan"), float("inf")])
def test_bad_epsilon_is_a_config_error(eps: float) -> None:
    with pytest.raises(ConfigError):
        exponential_mechanism([1, 2], eps)
    with pytest.raises(ConfigError):
        top_k([1, 2], 1, eps)


def test_bad_k_sensitivity_and_inputs() -> None:
    for k in (0, 3, True):
        with pytest.raises(ConfigError):
            top_k([1, 2], k, 1.0)
    with pytest.raises(ConfigError):
        exponential_mechanism([1, 2], 1.0, 0.0)
    with pytest.raises(ValueError):
        exponential_mechanism([], 1.0)
    with pytest.raises(TypeError):
        exponential_mechanism([1.5, 2.0], 1.0, sampler=SecureSampler())
