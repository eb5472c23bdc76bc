"""dp.local, dp.secure_random, dp.multiparty: unbiasedness and variance of every frequency
oracle over seeded repetitions, an empirical privacy audit of the per-person randomisers
(REFERENCE.md recipe, Clopper–Pearson), the secure source, serialisation, multiparty DP.

Seeded checks are deterministic; the secure-source checks use tiny false-alarm rates
(z = 5, α = 10⁻⁴) so flakes are practically impossible.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import beta as beta_dist
from scipy.stats import chi2, chisquare

from privpipe.dp.local import (
    PROTOCOLS,
    FrequencyOracle,
    Reports,
    aggregate,
    choose_protocol,
    estimate,
    keyed_hash,
    olh_g,
    parameters,
    perturb,
    reports_from_frame,
    reports_to_frame,
    support_counts,
    variance,
)
from privpipe.dp.multiparty import (
    central_variance,
    compare_models,
    local_variance,
    multiparty_histogram,
    multiparty_variance,
    party_histograms,
    split_evenly,
)
from privpipe.dp.noise import INSECURE_SEED_MESSAGE, SeededTestSampler, discrete_laplace_variance
from privpipe.dp.secure_random import (
    SecureRandom,
    SeededRandom,
    bernoulli_threshold,
    random_source_for,
)
from privpipe.errors import ConfigError, InputDataError

Z = 5.0


# ----------------------------------------------------------------------------- helpers


def _epsilon_lb(k1: int, k0: int, n: int, alpha: float) -> float:
    """REFERENCE.md audit: ε_LB = ln(p1_lo / p0_hi), Clopper–Pearson at level α (δ = 0)."""
    p1_lo = float(beta_dist.ppf(alpha / 2, k1, n - k1 + 1)) if k1 > 0 else 0.0
    p0_hi = float(beta_dist.ppf(1 - alpha / 2, k0 + 1, n - k0)) if k0 < n else 1.0
    if p1_lo <= 0.0:
        return -math.inf
    return math.log(p1_lo / p0_hi)


def _audit(in_event_0: np.ndarray, in_event_1: np.ndarray, alpha: float) -> float:
    """Max ε_LB over both directions for one event (Bonferroni over the two)."""
    n = in_event_0.size
    k0, k1 = int(in_event_0.sum()), int(in_event_1.sum())
    return max(_epsilon_lb(k0, k1, n, alpha / 2), _epsilon_lb(k1, k0, n, alpha / 2))


def _population(n: int, d: int) -> np.ndarray:
    """A fixed skewed population of n codes over [0, d), with one value absent."""
    weights = np.arange(d, 0, -1, dtype=np.float64)
    weights[d - 1] = 0.0
    counts = np.floor(weights / weights.sum() * n).astype(np.int64)
    counts[0] += n - counts.sum()
    return np.repeat(np.arange(d, dtype=np.int64), counts)


def _event(reports: Reports, protocol: str) -> np.ndarray:
    """The audit event S (fixed in advance), per report: tight for inputs 0 vs 1."""
    if protocol in ("rr", "grr"):
        assert reports.values is not None
        return reports.values == 0
    if protocol in ("sue", "oue"):
        bits = reports.unpacked_bits()
        return (bits[:, 0] == 1) & (bits[:, 1] == 0)
    assert reports.keys is not None and reports.values is not None and reports.g is not None
    h0 = keyed_hash(reports.keys, 0, reports.g)
    h1 = keyed_hash(reports.keys, 1, reports.g)
    return (h0 != h1) & (reports.values == h0)


# ----------------------------------------------------------------------------- parameters


def test_variance_table_matches_reference() -> None:
    n, eps, d = 1000, 1.3, 10
    e = math.exp(eps)
    h = math.exp(eps / 2)
    g = olh_g(eps)
    assert g == round(e) + 1
    expected = {
        "grr": n * (e + d - 2) / (e - 1) ** 2,
        "sue": n * h / (h - 1) ** 2,
        "oue": 4 * n * e / (e - 1) ** 2,
        "blh": n * (e + 1) ** 2 / (e - 1) ** 2,
        "olh": n * (e - 1 + g) ** 2 / ((e - 1) ** 2 * (g - 1)),
    }
    for name, value in expected.items():
        assert variance(name, n, eps, d) == pytest.approx(value, rel=1e-12), name
    assert variance("rr", n, eps, 2) == pytest.approx(variance("grr", n, eps, 2))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("eps", [0.3, 1.0, 3.0])
def test_parameters_imply_epsilon(protocol: str, eps: float) -> None:
    d = 2 if protocol == "rr" else 12
    par = parameters(protocol, eps, d)
    assert par.implied_epsilon == pytest.approx(eps, rel=1e-9)
    assert 0 < par.q_star < par.p_star < 1
    assert par.as_dict()["p"] == par.p_keep


def test_choose_protocol_is_lowest_variance() -> None:
    assert choose_protocol(1.0, 2) == "rr"
    assert choose_protocol(4.0, 4) == "grr"  # small domain, large ε: direct encoding
    assert choose_protocol(1.0, 64) in ("oue", "olh")
    for eps in (0.2, 0.7, 1.5, 3.0, 6.0):
        for d in (3, 8, 30, 200, 1024):
            name = choose_protocol(eps, d)
            best = min(variance(p, 1, eps, d) for p in ("grr", "sue", "oue", "blh", "olh"))
            assert variance(name, 1, eps, d) <= best * (1 + 1e-9)
    assert FrequencyOracle.create("auto", 1.0, 64).protocol == choose_protocol(1.0, 64)


def test_invalid_inputs_are_refused() -> None:
    src = SeededRandom(1)
    with pytest.raises(ConfigError, match="d = 2"):
        parameters("rr", 1.0, 3)
    with pytest.raises(ConfigError, match="unknown local DP protocol"):
        parameters("rappor", 1.0, 3)
    with pytest.raises(ConfigError, match="epsilon"):
        parameters("grr", 0.0, 3)
    with pytest.raises(ConfigError, match="domain size"):
        parameters("grr", 1.0, 1)
    with pytest.raises(InputDataError, match="outside the domain"):
        perturb("grr", np.array([0, 3]), 1.0, 3, src)
    with pytest.raises(InputDataError, match="integer"):
        perturb("grr", np.array([0.5]), 1.0, 3, src)
    oracle = FrequencyOracle.create("oue", 1.0, 8)
    with pytest.raises(InputDataError, match="were made with"):
        oracle.aggregate(perturb("oue", np.array([1]), 2.0, 8, src))


# ----------------------------------------------------------------------------- estimation


REPS = 300
N_PERSONS = 3000
D = 8


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_oracle_unbiased_and_variance_matches_formula(protocol: str) -> None:
    d = 2 if protocol == "rr" else D
    eps = 1.5
    codes = _population(N_PERSONS, d) if d > 2 else (np.arange(N_PERSONS) % 5 == 0).astype(int)
    truth = np.bincount(codes, minlength=d)
    src = SeededRandom(20260 + PROTOCOLS.index(protocol))
    est = np.empty((REPS, d))
    for r in range(REPS):  # repetitions, each vectorised over persons
        est[r] = aggregate(perturb(protocol, codes, eps, d, src)).counts
    exact = np.array([variance(protocol, N_PERSONS, eps, d, count=c) for c in truth])
    z = (est.mean(axis=0) - truth) / np.sqrt(exact / REPS)
    assert np.all(np.abs(z) < 4.5), (protocol, z)
    stat = (REPS - 1) * est.var(axis=0, ddof=1) / exact
    alpha = 1e-3
    lo, hi = chi2.ppf(alpha / 2, REPS - 1), chi2.ppf(1 - alpha / 2, REPS - 1)
    assert np.all((stat > lo) & (stat < hi)), (protocol, stat / (REPS - 1))
    # an absent value's exact variance is the table's
    if d > 2:
        assert exact[-1] == pytest.approx(variance(protocol, N_PERSONS, eps, d))


def test_estimates_frame_and_ci_cover() -> None:
    d, eps = 16, 1.0
    codes = _population(50_000, d)
    truth = np.bincount(codes, minlength=d)
    oracle = FrequencyOracle.create("auto", eps, d)
    est = oracle.aggregate(oracle.perturb(codes, SeededRandom(7)))
    frame = est.to_frame()
    assert list(frame.columns) == ["value", "estimate", "variance", "ci_low", "ci_high"]
    covered = (frame["ci_low"] <= truth) & (truth <= frame["ci_high"])
    assert covered.sum() >= 12  # 95% intervals, 16 values
    assert est.table_variance == pytest.approx(oracle.variance(50_000))


def test_support_counts_combine_across_batches() -> None:
    d, eps = 10, 1.0
    codes = _population(9000, d)
    for protocol in ("grr", "oue", "olh"):
        src = SeededRandom(3)
        a = perturb(protocol, codes[:4000], eps, d, src)
        b = perturb(protocol, codes[4000:], eps, d, src)
        combined = estimate(protocol, eps, d, 9000, support_counts(a) + support_counts(b))
        assert combined.n == 9000
        assert np.all(
            np.abs(combined.counts - np.bincount(codes, minlength=d))
            < 6 * np.sqrt(combined.variance)
        )


# ----------------------------------------------------------------------------- audits

AUDIT_ALPHA = 1e-4


def test_privacy_audit_grr_is_tight_with_the_secure_source() -> None:
    n, eps, d = 1_000_000, 2.0, 8
    src = SecureRandom()
    out0 = perturb("grr", np.zeros(n, dtype=np.int64), eps, d, src)
    out1 = perturb("grr", np.ones(n, dtype=np.int64), eps, d, src)
    assert out0.values is not None and out1.values is not None
    lbs = [
        _audit(out0.values == v, out1.values == v, AUDIT_ALPHA / 2)
        for v in (0, 1)  # Bonferroni over the two events
    ]
    assert max(lbs) <= eps, lbs
    assert max(lbs) >= 1.8, lbs


def test_privacy_audit_says_no_to_a_broken_randomiser() -> None:
    n, eps, d = 1_000_000, 2.0, 8
    src = SecureRandom()
    # A bug: the randomiser keeps the truth more often (p as at ε = 2.4) but claims ε = 2.
    broken0 = perturb("grr", np.zeros(n, dtype=np.int64), 2.4, d, src)
    broken1 = perturb("grr", np.ones(n, dtype=np.int64), 2.4, d, src)
    assert broken0.values is not None and broken1.values is not None
    lb = _audit(broken0.values == 0, broken1.values == 0, AUDIT_ALPHA)
    assert lb > eps, lb


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_privacy_audit_every_protocol(protocol: str) -> None:
    n, eps = 200_000, 2.0
    d = 2 if protocol == "rr" else 8
    src = SecureRandom()
    r0 = perturb(protocol, np.zeros(n, dtype=np.int64), eps, d, src)
    r1 = perturb(protocol, np.ones(n, dtype=np.int64), eps, d, src)
    lb = _audit(_event(r0, protocol), _event(r1, protocol), AUDIT_ALPHA)
    assert lb <= eps, (protocol, lb)
    assert lb >= 0.85 * eps, (protocol, lb)  # the event is tight: the bound is near ε


# ----------------------------------------------------------------------------- the source


def test_random_source_seam_refuses_seeds_without_allow_insecure() -> None:
    with pytest.raises(ConfigError, match="--insecure-seed") as info:
        random_source_for(42, allow_insecure=False)
    assert str(info.value) == INSECURE_SEED_MESSAGE
    assert isinstance(random_source_for(None, allow_insecure=False), SecureRandom)
    assert isinstance(random_source_for(None, allow_insecure=True), SecureRandom)
    assert isinstance(random_source_for(42, allow_insecure=True), SeededRandom)
    with pytest.raises(ConfigError, match="seed"):
        random_source_for(True, allow_insecure=True)


def test_bernoulli_threshold_is_conservative() -> None:
    assert bernoulli_threshold(0.5) == 2**63 - 2**13
    assert bernoulli_threshold(0.0) == 0
    assert bernoulli_threshold(1e-20) == 0
    for p in (1e-9, 0.1, 1 / 3, 0.7310585786300049, 1 - 1e-12):
        tau = bernoulli_threshold(p)
        assert p - 2**-50 <= tau / 2**64 <= p
    with pytest.raises(ConfigError):
        bernoulli_threshold(1.5)


@pytest.mark.parametrize("p", [0.01, 0.3, 0.5, 0.99])
def test_secure_bernoulli_frequency(p: float) -> None:
    n = 1_000_000
    freq = SecureRandom().bernoulli(p, n).mean()
    assert abs(freq - p) <= Z * math.sqrt(p * (1 - p) / n)


def test_bernoulli_lazy_comparison_equals_full_64_bit_comparison() -> None:
    # Reproduce the seeded byte stream and compare every draw with U64 < τ computed in full.
    n, p = 200_000, 0.5 + 1 / 512 + 1e-9  # top byte 128: ties happen at rate 1/256
    got = SeededRandom(99).bernoulli(p, n)
    rng = np.random.default_rng(99)
    top = np.frombuffer(rng.bytes(n), dtype=np.uint8).astype(np.uint64)
    tau = bernoulli_threshold(p)
    tie = np.flatnonzero(top == tau >> 56)
    assert 500 < tie.size < 1100
    low = np.frombuffer(rng.bytes(8 * tie.size), dtype="<u8") >> np.uint64(8)
    full = [int(t) << 56 for t in top]
    for i, w in zip(tie, low, strict=True):
        full[i] += int(w)
    assert got.tolist() == [u < tau for u in full]


def test_bernoulli_vector_p_and_extremes() -> None:
    src = SecureRandom()
    n = 400_000
    p = np.where(np.arange(n) % 2 == 0, 0.2, 0.9)
    out = src.bernoulli(p, n)
    for value, part in ((0.2, out[0::2]), (0.9, out[1::2])):
        assert abs(part.mean() - value) <= Z * math.sqrt(value * (1 - value) / part.size)
    assert not src.bernoulli(0.0, 1000).any()
    assert src.bernoulli(1.0, 1000).all()
    with pytest.raises(ValueError):
        src.bernoulli(np.array([0.5, 0.5]), 3)


@pytest.mark.parametrize("source", [SecureRandom(), SeededRandom(5)])
def test_integers_unbiased(source: SecureRandom | SeededRandom) -> None:
    n = 210_000
    for high in (1, 2, 7, 63):
        out = source.integers(high, n)
        assert out.dtype == np.int64 and out.min() >= 0 and out.max() < high
        if high > 1:
            assert chisquare(np.bincount(out, minlength=high)).pvalue > 1e-4
    # rejection matters: 3·2^30 leaves a quarter of the 32-bit words to reject
    top = source.integers(3 << 30, n) >> 30
    assert chisquare(np.bincount(top, minlength=3)).pvalue > 1e-4
    wide = source.integers(5 << 40, n) >> 40  # the 64-bit path
    assert chisquare(np.bincount(wide, minlength=5)).pvalue > 1e-4
    bits = source.bits(n)
    assert abs(bits.mean() - 0.5) <= Z * math.sqrt(0.25 / n)
    words = source.words(4)
    assert words.dtype == np.uint64 and words.shape == (4,)
    with pytest.raises(ConfigError):
        source.integers(0, 3)


def test_seeded_source_is_reproducible() -> None:
    a = perturb("olh", np.arange(100) % 10, 1.0, 10, SeededRandom(11))
    b = perturb("olh", np.arange(100) % 10, 1.0, 10, SeededRandom(11))
    assert a.keys is not None and b.keys is not None
    assert np.array_equal(a.keys, b.keys) and np.array_equal(a.values, b.values)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- tables


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reports_round_trip_through_a_table_and_csv(protocol: str, tmp_path: Path) -> None:
    d = 2 if protocol == "rr" else 13  # 13: packed bits with padding
    codes = np.arange(500) % d
    reports = perturb(protocol, codes, 1.0, d, SeededRandom(8))
    frame = reports_to_frame(reports)
    back = reports_from_frame(frame)
    assert np.array_equal(support_counts(back), support_counts(reports))
    path = tmp_path / "reports.csv"
    frame.to_csv(path, index=False)
    read = pd.read_csv(path, dtype={"bits": str})
    with pytest.raises(ConfigError, match="needs protocol"):
        reports_from_frame(read)
    again = reports_from_frame(read, protocol=protocol, epsilon=1.0, d=d)
    assert np.array_equal(support_counts(again), support_counts(reports))
    with pytest.raises(InputDataError, match="were made with"):
        reports_from_frame(frame, epsilon=2.0)


def test_reports_from_frame_rejects_bad_rows() -> None:
    grr = reports_to_frame(perturb("grr", np.arange(10) % 4, 1.0, 4, SeededRandom(1)))
    grr.loc[3, "report"] = 4
    with pytest.raises(InputDataError, match="row 3"):
        reports_from_frame(grr)
    oue = reports_to_frame(perturb("oue", np.arange(10) % 4, 1.0, 4, SeededRandom(1)))
    bad = oue.copy()
    bad.loc[2, "bits"] = "zz"
    with pytest.raises(InputDataError, match="row 2"):
        reports_from_frame(bad)
    bad = oue.copy()
    bad.loc[1, "bits"] = "ff"  # bits beyond d = 4 set
    with pytest.raises(InputDataError, match="beyond the domain"):
        reports_from_frame(bad)
    with pytest.raises(InputDataError, match="column"):
        reports_from_frame(oue.drop(columns="bits"))


# ----------------------------------------------------------------------------- multiparty


def test_multiparty_unbiased_with_variance_m_times_laplace() -> None:
    d, eps, m, reps = 6, 0.8, 4, 400
    codes = _population(5000, d)
    truth = np.bincount(codes, minlength=d)
    sampler = SeededTestSampler(77)
    est = np.array([multiparty_histogram(codes, d, eps, sampler, m=m).counts for _ in range(reps)])
    var = m * discrete_laplace_variance(2 / eps)  # substitution of one person: L1 = 2
    assert multiparty_variance(eps, m) == pytest.approx(var)
    z = (est.mean(axis=0) - truth) / math.sqrt(var / reps)
    assert np.all(np.abs(z) < 4.5), z
    stat = (reps - 1) * est.var(axis=0, ddof=1) / var
    assert np.all((stat > chi2.ppf(5e-4, reps - 1)) & (stat < chi2.ppf(1 - 5e-4, reps - 1)))


def test_multiparty_labels_and_helpers() -> None:
    codes = np.array([0, 1, 1, 2, 2, 2])
    labels = np.array([10, 10, 20, 20, 30, 30])
    hist = party_histograms(codes, 3, np.unique(labels, return_inverse=True)[1], 3)
    assert hist.tolist() == [[1, 1, 0], [0, 1, 1], [0, 0, 2]]
    out = multiparty_histogram(codes, 3, [1.0, 2.0, 0.5], SeededTestSampler(1), parties=labels)
    assert out.m == 3 and out.epsilon == 2.0 and out.party_counts.shape == (3, 3)
    assert np.array_equal(out.counts, out.party_counts.sum(axis=0))
    assert out.variance == pytest.approx(
        sum(discrete_laplace_variance(2 / e) for e in (1.0, 2.0, 0.5))
    )
    assert split_evenly(10, 3).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    central = multiparty_histogram(codes, 3, 1.0, SeededTestSampler(1), m=1)
    assert central.halfwidth > 0 and list(central.to_frame().columns)[:2] == ["value", "estimate"]
    assert central_variance(1.0) == pytest.approx(discrete_laplace_variance(2.0))
    assert central_variance(1.0, sensitivity=1) == pytest.approx(discrete_laplace_variance(1.0))
    assert local_variance(10_000, 1.0, 64) == variance(choose_protocol(1.0, 64), 10_000, 1.0, 64)
    table = compare_models(1_000_000, 1.0, 64)
    errors = table["std_error"].tolist()
    assert errors == sorted(errors)  # central < multiparty (growing m) < local
    with pytest.raises(ConfigError):
        multiparty_histogram(codes, 3, 1.0, SeededTestSampler(1))


def test_encode_values_is_the_lookup_of_each_rows_canonical_string() -> None:
    """Codes of a batch (looked up once per distinct value) are those of each row's
    canonical string (missing: "") in the domain; outside it: ``other`` or a refusal."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from privpipe.anonymity.hierarchy import canonical_column
    from privpipe.dp.local_release import encode_values, full_domain
    from privpipe.errors import InputDataError

    domain = ["a", "1", "0", "2.5", ""]

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.one_of(st.none(), st.sampled_from(["a", "b", 1, 0.0, -0.0, 2.5, 7])), max_size=30
        ),
        st.sampled_from(["str", "object", "float"]),
        st.booleans(),
    )
    def check(values: list, kind: str, with_other: bool) -> None:
        if kind == "float":
            column = pd.Series(
                [v if isinstance(v, int | float) else np.nan for v in values], dtype=float
            )
        elif kind == "str":
            column = pd.Series([None if v is None else str(v) for v in values], dtype="str")
        else:
            column = pd.Series(values, dtype=object)
        column.name = "x"
        other = "__other__" if with_other else None
        full = full_domain(domain, other)
        index = pd.Index(full[: len(full) - (1 if other else 0)], dtype=object)
        want = np.asarray(index.get_indexer(canonical_column(column)), dtype=np.int64)
        if (want < 0).any() and other is None:
            with pytest.raises(InputDataError, match="outside the public domain"):
                encode_values(column, domain, other, "w")
            return
        want[want < 0] = len(full) - 1
        assert encode_values(column, domain, other, "w").tolist() == want.tolist()

    check()


def test_one_per_person_keeps_one_row_each_uniformly_at_random() -> None:
    """Each person keeps exactly one of their rows, in the rows' order; the choice is
    uniform (chi-square over 4,000 draws of a person with 4 rows), the same for a seeded
    source, and the row of the lowest priority word (the definition it implements)."""
    from scipy.stats import chisquare

    from privpipe.dp.local_release import one_per_person
    from privpipe.dp.secure_random import random_source_for

    unit = np.array([9, 2**63 + 5, 9, 7, 9, 2**63 + 5, 9], dtype=np.uint64)
    hits = np.zeros(4, dtype=np.int64)
    for seed in range(4000):
        kept = one_per_person(unit, random_source_for(seed, allow_insecure=True))
        assert sorted(unit[kept].tolist()) == sorted(set(unit.tolist()))
        assert (np.diff(kept) > 0).all()
        hits[[0, 2, 4, 6].index(int(kept[unit[kept] == 9][0]))] += 1
        again = one_per_person(unit, random_source_for(seed, allow_insecure=True))
        assert again.tolist() == kept.tolist()
    assert chisquare(hits).pvalue > 1e-4
    words = random_source_for(11, allow_insecure=True).words(unit.size)
    kept = one_per_person(unit, random_source_for(11, allow_insecure=True))
    lowest = {int(u): min(np.flatnonzero(unit == u), key=lambda i: words[i]) for u in set(unit)}
    assert sorted(kept.tolist()) == sorted(int(i) for i in lowest.values())
