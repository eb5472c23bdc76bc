"""Attacks on DP counts and histograms, and on local-DP reports, against their bounds.

The membership test between counts c and c+1 is the optimal one, and for a discrete
Laplace with b = 1/ε its success is exactly e^ε/(1+e^ε), the DP bound: measured over many
seeded runs it must sit at the bound, never clearly above it. A mechanism with half the
scale must be caught above the bound (the test can fail). Without noise, differencing is
exact.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from privpipe.attacks import (
    AttackerKnowledge,
    NoNoise,
    difference_histograms,
    differencing_attack,
    dp_success_bound,
    grr_posterior,
    grr_success_bound,
    histogram_attribute_inference,
    membership_inference,
    optimal_success,
    report_attack,
)
from privpipe.dp.aggregate import count_cells, noisy_counts
from privpipe.dp.noise import SeededTestSampler, discrete_laplace_p, rho_to_epsilon
from tests.conftest import ARX


def test_bounds() -> None:
    assert dp_success_bound(0.0) == 0.5
    assert dp_success_bound(1.0) == pytest.approx(math.e / (1 + math.e))
    assert dp_success_bound(1.0, 1e-3) == pytest.approx((math.e + 1e-3) / (1 + math.e))
    assert dp_success_bound(1000.0) == 1.0
    # the optimal test against discrete Laplace with b = 1/ε meets the bound exactly
    for eps in (0.1, 0.5, 1.0, 3.0):
        assert optimal_success("discrete_laplace", 1.0 / eps) == pytest.approx(
            dp_success_bound(eps)
        )
    assert optimal_success("discrete_laplace", 2.0) == pytest.approx(
        1.0 / (1.0 + discrete_laplace_p(2.0))
    )


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 2.0])
def test_membership_stays_at_the_bound_over_seeded_runs(epsilon: float) -> None:
    above = 0
    rates = []
    for seed in range(30):
        result = membership_inference(
            40,
            scale=1.0 / epsilon,
            sampler=SeededTestSampler(seed),
            trials=4000,
            seed=1000 + seed,
        )
        assert result.bound == pytest.approx(dp_success_bound(epsilon))
        assert result.details["expected_success"] == pytest.approx(result.bound)
        rates.append(result.rate)
        above += result.interval[0] > result.bound  # clearly above the bound
    # a 95% interval misses on the high side ~2.5% of the time: 30 runs, at most 3
    assert above <= 3
    assert abs(np.mean(rates) - dp_success_bound(epsilon)) < 0.01


def test_membership_catches_a_mechanism_with_half_the_noise() -> None:
    result = membership_inference(
        40, scale=0.5, sampler=SeededTestSampler(1), trials=20_000, epsilon=1.0
    )
    assert result.bound == pytest.approx(dp_success_bound(1.0))
    assert result.interval[0] > result.bound  # the claimed ε=1 is violated
    assert result.within_bound is False


def test_membership_gaussian_with_delta() -> None:
    sigma, delta = 2.0, 1e-5
    result = membership_inference(
        100,
        scale=sigma,
        mechanism="discrete_gaussian",
        sampler=SeededTestSampler(5),
        trials=20_000,
        delta=delta,
    )
    eps = rho_to_epsilon(1.0 / (2 * sigma * sigma), delta)
    assert result.bound == pytest.approx(dp_success_bound(eps, delta))
    lo, hi = result.interval
    assert lo <= result.details["expected_success"] <= hi
    assert lo <= result.bound
    no_delta = membership_inference(
        100, scale=sigma, mechanism="discrete_gaussian", sampler=NoNoise(), trials=10
    )
    assert no_delta.bound is None  # a Gaussian has no pure-ε bound


def test_differencing_is_exact_without_noise_and_bounded_with_it() -> None:
    exact = differencing_attack(123, scale=1.0, sampler=NoNoise(), trials=5000)
    assert exact.rate == 1.0 and exact.rates["advantage"] == 1.0
    assert exact.within_bound is False  # no noise: the "ε" the scale claims is not provided
    noisy = differencing_attack(123, scale=1.0, sampler=SeededTestSampler(3), trials=20_000)
    assert noisy.bound == pytest.approx(dp_success_bound(1.0))
    assert noisy.interval[0] <= noisy.bound
    assert 0.5 < noisy.rate < 0.75


@pytest.fixture(scope="module")
def adult() -> pd.DataFrame:
    if not (ARX / "adult.csv").exists():
        pytest.skip(f"Adult data not found in {ARX}")
    return pd.read_csv(ARX / "adult.csv", sep=";", dtype=str, keep_default_na=False)


def test_histogram_differencing_finds_the_removed_person(adult: pd.DataFrame) -> None:
    keys = ["age", "sex", "occupation"]
    target = 1234
    with_t = count_cells(adult, keys)
    without_t = count_cells(adult.drop(index=target), keys)
    diff = difference_histograms(with_t, without_t, keys)
    top = diff.iloc[0]
    assert [top[k] for k in keys] == [adult.loc[target, k] for k in keys]
    assert top["difference"] == 1 and (diff["difference"].iloc[1:] == 0).all()
    noisy = [
        noisy_counts(c, "discrete_laplace", epsilon=1.0, l1=1, sampler=SeededTestSampler(s))
        for s, c in ((1, with_t), (2, without_t))
    ]
    noisy_diff = difference_histograms(noisy[0], noisy[1], keys)
    assert (noisy_diff["difference"] != 0).sum() > 100  # the difference drowns in noise


def test_histogram_attribute_inference(adult: pd.DataFrame) -> None:
    qis, sa = ["age", "sex", "education"], "occupation"
    exact = count_cells(adult, [*qis, sa])
    know = AttackerKnowledge(tau=0.5)
    clear = histogram_attribute_inference(
        exact, adult, qis, sa, epsilon=1.0, knowledge=know, true_histogram=exact
    )
    assert clear.rates["per_person_success"] == 1.0  # no noise: every membership is exposed
    assert clear.within_bound is False
    noisy_cells = noisy_counts(
        exact, "discrete_laplace", epsilon=1.0, l1=1, sampler=SeededTestSampler(11)
    )
    noisy = histogram_attribute_inference(
        noisy_cells, adult, qis, sa, epsilon=1.0, knowledge=know, true_histogram=exact
    )
    n = noisy.targets
    assert n == len(adult)
    bound = dp_success_bound(1.0)
    assert noisy.bound == pytest.approx(bound)
    # per-target scores are ½ or 1, so the Wilson-style slack is at most 3·½/√n
    assert noisy.rates["per_person_success"] <= bound + 1.5 / math.sqrt(n)
    assert abs(noisy.rates["per_person_success"] - bound) < 0.02
    # noise lowers the accuracy (clamping noisy sparse cells may still fake confidence:
    # disclosure rates need not drop, which is why per-person success is the DP measure)
    assert noisy.rates["accuracy"] < clear.rates["accuracy"]
    assert clear.rates["accuracy"] > clear.rates["prior_accuracy"]
    json.dumps(noisy.as_dict(), allow_nan=False)


def test_histogram_inference_counts_only_correct_guesses() -> None:
    histogram = pd.DataFrame(
        {"zip": ["47677", "47677", "47905"], "disease": ["HD", "Flu", "Flu"], "count": [5, 0, 3]}
    )
    people = pd.DataFrame({"zip": ["47677", "47677", "99999"], "disease": ["HD", "Flu", "Flu"]})
    result = histogram_attribute_inference(histogram, people, ["zip"], "disease", epsilon=1.0)
    assert result.rate == pytest.approx(2 / 3)  # both 47677 targets are "disclosed" HD
    assert result.rates["correct_disclosure"] == pytest.approx(1 / 3)  # only one has HD
    assert result.rates["accuracy"] == pytest.approx(1 / 3)  # 99999: no cell, no guess
    assert result.within_bound is None  # per-person success needs the true histogram


def grr(values: np.ndarray, epsilon: float, d: int, rng: np.random.Generator) -> np.ndarray:
    """Generalised randomised response (test helper until dp/local.py exists)."""
    keep = rng.random(values.shape[0]) < grr_success_bound(epsilon, d)
    other = (values + rng.integers(1, d, size=values.shape[0])) % d  # uniform other value
    return np.where(keep, values, other)


@pytest.mark.parametrize(("epsilon", "d"), [(0.5, 2), (1.0, 14), (3.0, 5)])
def test_ldp_report_attack(epsilon: float, d: int) -> None:
    rng = np.random.default_rng(7)
    truth = rng.integers(0, d, size=30_000)
    result = report_attack(truth, grr(truth, epsilon, d, rng), epsilon=epsilon, domain_size=d)
    p = math.exp(epsilon) / (math.exp(epsilon) + d - 1)
    assert result.bound == pytest.approx(p)
    lo, hi = result.interval
    assert lo <= p <= hi
    post = grr_posterior(epsilon, d)
    assert np.allclose(post.sum(axis=1), 1.0) and np.allclose(np.diag(post), p)
    if d > 1:
        assert post[0, 0] / post[0, 1] == pytest.approx(math.exp(epsilon))  # odds e^ε


def test_ldp_report_attack_catches_a_leaky_protocol() -> None:
    rng = np.random.default_rng(8)
    truth = rng.integers(0, 10, size=10_000)
    leaky = grr(truth, 3.0, 10, rng)  # claims ε = 1
    result = report_attack(truth, leaky, epsilon=1.0, domain_size=10)
    assert result.interval[0] > result.bound


# --------------------------------------------------------------------------- issue 13 fixes


def test_membership_and_differencing_shift_by_the_persons_full_contribution() -> None:
    """A person who adds 3 to a count (dp_zip: 1 partition x 3 visits) is simulated as 3,
    not 1: the measured success is the shift-3 test's, clearly above the shift-1 one."""
    from privpipe.attacks import person_contribution

    scale = 3.0  # b = sensitivity / ε with sensitivity 3, ε = 1
    one, three = (
        optimal_success("discrete_laplace", scale),
        optimal_success("discrete_laplace", scale, 3),
    )
    assert three > one + 0.1
    assert three <= dp_success_bound(1.0) + 1e-12  # still under the release's bound
    result = membership_inference(
        0, scale=scale, sampler=SeededTestSampler(5), trials=20_000, epsilon=1.0,
        sensitivity=3.0, shift=3,
    )  # fmt: skip
    assert result.details["shift"] == 3
    assert result.details["expected_success"] == pytest.approx(three)
    lo, hi = result.interval
    assert lo <= three <= hi and lo > one
    assert result.bound == pytest.approx(dp_success_bound(1.0))
    exact = differencing_attack(7, scale=1.0, sampler=NoNoise(), trials=2000, shift=3)
    assert exact.rate == 1.0 and exact.details["shift"] == 3
    noisy = differencing_attack(
        7, scale=scale, sampler=SeededTestSampler(6), trials=20_000, shift=3, epsilon=1.0
    )
    shift_one = differencing_attack(
        7, scale=scale, sampler=SeededTestSampler(6), trials=20_000, epsilon=1.0
    )
    assert noisy.rate > shift_one.rate + 0.05
    # the contribution is read from release.json's noise figures
    laplace = {"mechanism": "discrete_laplace", "scale": 12.0, "sensitivity": 3.0}
    assert person_contribution({"max_partitions": 1}, laplace) == 3
    gauss = {"mechanism": "discrete_gaussian", "scale": 4.0, "sensitivity": 2.0}
    params = {"max_partitions": 2, "max_contributions_per_partition": 2}
    assert person_contribution(params, gauss) == 4  # L1, not the Gaussian's L2
    with pytest.raises(ValueError, match="shift"):
        membership_inference(0, scale=1.0, sampler=NoNoise(), shift=0)


def test_ldp_bound_uses_the_real_prior_and_reports_map_and_most_common() -> None:
    """With a skewed attribute, always guessing the most common value beats the uniform
    prior's 'bound' e^ε/(e^ε+d-1); the real-prior bound (posterior odds <= e^ε × prior
    odds) holds for it and for the MAP guess, which beats the always-most-common guess."""
    from privpipe.attacks.ldp import map_guess

    d, eps, n = 10, 0.5, 40_000
    prior = np.array([0.5, 0.2, *([0.3 / 8] * 8)])
    rng = np.random.default_rng(3)  # the experiment's draws, not released noise
    truth = rng.choice(d, size=n, p=prior)
    keep = rng.random(n) < math.exp(eps) / (math.exp(eps) + d - 1)
    other = (truth + rng.integers(1, d, size=n)) % d
    reported = np.where(keep, truth, other)
    support = np.zeros((n, d), dtype=bool)
    support[np.arange(n), reported] = True
    guesses = map_guess(support, prior, eps)
    result = report_attack(
        truth, reported, epsilon=eps, domain_size=d, prior=prior, map_guesses=guesses
    )
    uniform = grr_success_bound(eps, d)
    assert result.rates["most_common_accuracy"] > uniform + 0.2  # the old bound is broken
    assert result.bound == pytest.approx(grr_success_bound(eps, d, prior))
    assert result.bound == pytest.approx(math.exp(eps) * 0.5 / (math.exp(eps) * 0.5 + 0.5))
    assert result.rates["map_accuracy"] >= result.rates["most_common_accuracy"]
    assert result.rates["map_accuracy"] <= result.bound
    assert result.bound_rate == "map_accuracy"
    assert result.details["uniform_prior_bound"] == pytest.approx(uniform)
    # an attack above the real-prior bound is caught: a leaky "report" (the truth itself)
    leak = report_attack(truth, truth, epsilon=eps, domain_size=d, prior=prior,
                         map_guesses=truth)  # fmt: skip
    assert leak.within_bound is False
