"""Issue 12 (pure cores): exact fixed-point sums, overflow-free accounting and intervals for
any finite ε, honest insecure-seed documents, and a verifier independent of the planner."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe import dp
from privpipe.dp import exact
from privpipe.dp.accounting import (
    Accountant,
    ApproxDP,
    DiscreteLaplace,
    advanced_composition,
    group_privacy,
)
from privpipe.dp.aggregate import noisy_sums, sum_cells
from privpipe.dp.bounding import sensitivities
from privpipe.dp.cells import bound_and_aggregate, concat, contributions, merge_partials
from privpipe.dp.noise import (
    INSECURE_GUARANTEE,
    SeededTestSampler,
    discrete_laplace_variance,
    laplace_ci_halfwidth,
    laplace_tail,
)
from privpipe.dp.release import dp_release
from privpipe.dp.spec import Query, from_config_values, guarantee, plan_queries, rho_for
from privpipe.errors import ConfigError, PrivacyRefusal

BIG = 10**15
ROWS = 10_000


def big_sum_spec(**kw: Any) -> dp.spec.DPReleaseSpec:
    base: dict[str, Any] = dict(
        name="total", kind="dp_sum", epsilon=1.0, delta=0.0, queries=[Query("total")],
        domains={}, value="v", bounds=(0.0, float(BIG)), resolution=1.0,
    )  # fmt: skip
    base.update(kw)
    return from_config_values(**base)


# --------------------------------------------------------------------------- exact sums


def test_group_sum_is_exact_beyond_int64() -> None:
    values = np.full(ROWS, BIG, dtype=np.int64)
    keys = np.zeros(ROWS, dtype=np.int64)
    assert int(np.sum(values)) != ROWS * BIG  # what int64 gives: wrapped
    got = exact.group_sum(keys, values)
    assert got.dtype == object and int(got.iloc[0]) == ROWS * BIG
    small = exact.group_sum(keys, np.full(ROWS, 7, dtype=np.int64))
    assert small.dtype == np.int64 and int(small.iloc[0]) == 7 * ROWS  # fast path kept
    mixed = np.array([-(2**52), 2**52 - 1, -5, 2**52] * 2500, dtype=np.int64)
    assert exact.total(mixed) == sum(int(v) for v in mixed.tolist())
    parts = [exact.group_sum(keys[:10], values[:10]), exact.group_sum(keys, values)]
    assert int(exact.combine(parts).iloc[0]) == (ROWS + 10) * BIG


def test_dp_sum_of_1e15_times_10000_rows_is_exact_and_covered() -> None:
    df = pd.DataFrame({"v": np.full(ROWS, float(BIG))})
    spec = big_sum_spec()
    plans = plan_queries(spec)
    (c,) = contributions(df, spec, plans)
    partial = bound_and_aggregate(concat([c]), spec)
    assert int(partial.cells["sum_units"].iloc[0]) == ROWS * BIG  # exact pre-noise value
    merged = merge_partials([partial, partial])  # shards add up exactly too
    assert int(merged.cells["sum_units"].iloc[0]) == 2 * ROWS * BIG
    table, doc = dp_release(df, spec, SeededTestSampler(1))
    total = float(table["sum"].iloc[0])
    assert total > 0 and abs(total - ROWS * BIG) <= 5 * BIG  # noise scale 1e15, not a wrap
    assert table["ci_low"].iloc[0] <= ROWS * BIG <= table["ci_high"].iloc[0]
    assert doc["verified"] is True


def test_pure_sum_cells_and_noisy_sums_are_exact() -> None:
    df = pd.DataFrame({"g": ["a", "b"] * (ROWS // 2), "v": np.full(ROWS, float(BIG))})
    cells = sum_cells(df, ["g"], "v", 0.0, float(BIG))
    assert cells["g"].tolist() == ["a", "b"]
    assert [int(x) for x in cells["sum_units"]] == [ROWS // 2 * BIG] * 2
    out = noisy_sums(
        cells, "discrete_laplace", epsilon=1.0, l1=float(BIG), sampler=SeededTestSampler(2)
    )
    assert all(abs(s - ROWS // 2 * BIG) < 40 * BIG for s in out["sum"])


def test_one_rows_bound_beyond_2_53_steps_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"total.bounds: .* raise total.resolution \(e.g. 1000"):
        plan_queries(big_sum_spec(bounds=(0.0, 1e18)))
    plan_queries(big_sum_spec(bounds=(0.0, 1e18), resolution=1000.0))  # the suggested fix


# --------------------------------------------------------------------------- intervals


def test_interval_at_scale_1e18_and_beyond() -> None:
    hw = laplace_ci_halfwidth(1e18, 0.05)
    assert laplace_tail(1e18, hw) <= 0.05  # a valid bound ...
    assert hw == pytest.approx(1e18 * math.log(1 / 0.05), rel=1e-6)  # ≈ b ln(1/β)
    for b in (1e16, 1e300, 1e-300, 0.5, 3.0):
        laplace_ci_halfwidth(b, 0.05)
        assert discrete_laplace_variance(b) >= 0  # 2b² (inf beyond 1e154), never a crash
    assert laplace_ci_halfwidth(3.0, 0.05) == 9  # exact: 2p^10/(1+p) ≤ 0.05 < 2p^9/(1+p)


@given(st.floats(min_value=1e-300, max_value=1e300), st.floats(min_value=1e-12, max_value=0.5))
@settings(max_examples=100, deadline=None)
def test_laplace_halfwidth_never_fails(scale: float, beta: float) -> None:
    t = laplace_ci_halfwidth(scale, beta)
    assert t >= 0 and laplace_tail(scale, t) <= beta * (1 + 1e-9)


# --------------------------------------------------------------------------- accounting


@given(
    st.floats(min_value=1e-300, max_value=1e6),
    st.floats(min_value=1e-300, max_value=0.5),
    st.integers(min_value=1, max_value=50),
)
@settings(max_examples=100, deadline=None)
def test_group_privacy_and_composition_never_overflow(eps: float, delta: float, g: int) -> None:
    e, d = group_privacy(eps, delta, g)
    assert e == g * eps and 0 <= d <= 1
    if g > 1 and g * eps < 50:
        assert d >= delta  # never below the single-person delta
    a, _ = advanced_composition(eps, 0.0, g, 0.5)
    assert a >= 0  # math.inf when unbounded, never an exception


@given(st.floats(min_value=1e-300, max_value=1e6), st.sampled_from([0.0, 1e-9, 1e-6]))
@settings(max_examples=40, deadline=None)
def test_accountant_reports_for_any_epsilon(eps: float, delta: float) -> None:
    steps = [DiscreteLaplace.of(1 / eps, 1), ApproxDP.of(eps, delta / 2)]
    report = Accountant(steps, delta=delta).report()
    chosen = report["chosen"]
    assert chosen["epsilon"] is not None and math.isfinite(chosen["epsilon"])
    for m in report["methods"].values():
        assert m["epsilon"] is None or math.isfinite(m["epsilon"])


@given(st.floats(min_value=1e-300, max_value=1e6))
@settings(max_examples=4, deadline=None)
def test_planning_any_epsilon_is_a_plan_or_a_config_error(eps: float) -> None:
    for kw in (
        dict(kind="dp_count", queries=[Query("n")]),
        dict(kind="dp_count", queries=[Query("n", ("dx",))], delta=1e-9, partitions="private",
             max_units=10**7),
        dict(kind="dp_sum", queries=[Query("s")], value="v", bounds=(0.0, 1e6)),
        dict(kind="dp_mean", queries=[Query("m")], value="v", bounds=(0.0, 1e6), delta=1e-9,
             mechanism="discrete_gaussian", max_units=10**7),
    ):  # fmt: skip
        spec = from_config_values(name="r", epsilon=eps, domains={}, **{"delta": 0.0, **kw})
        try:
            plans = plan_queries(spec)
        except ConfigError as e:
            assert "r.epsilon" in str(e) and "raise epsilon" in str(e)
            continue
        g = guarantee(spec, plans)["accounting"]["group_privacy"]
        assert all(0 <= v["delta"] <= 1 and math.isfinite(v["epsilon"]) for v in g.values())


def test_planning_a_huge_epsilon_gaussian_mean_is_a_plan() -> None:
    """epsilon=1000 for a discrete Gaussian mean of bounds (0, 1e6): sigma is tiny against
    the sensitivity; dp_accounting's PLD raised (hypothesis found it); now PLD is marked
    not applicable and the other methods give the guarantee."""
    spec = from_config_values(
        name="r", epsilon=1000.0, domains={}, kind="dp_mean", queries=[Query("m")], value="v",
        bounds=(0.0, 1e6), delta=1e-9, mechanism="discrete_gaussian", max_units=10**7,
    )  # fmt: skip
    report = guarantee(spec, plan_queries(spec))["accounting"]
    assert report["methods"]["pld"]["epsilon"] is None
    assert "sensitivity / 23.2" in report["methods"]["pld"]["note"]
    assert math.isfinite(report["chosen"]["epsilon"])


@pytest.mark.parametrize("eps", [300.0, 700.0, 1000.0, 1e4, 1e6])
def test_planning_huge_epsilons_of_every_kind_is_a_plan(eps: float) -> None:
    """dp_accounting's PLD raised IndexError at epsilon 700 (an emptied pmf in compose) and
    ValueError at 1000 (hypothesis found both in CI): every method's failure is a
    'not applicable', and a finite guarantee is chosen."""
    for kw in (
        dict(kind="dp_count", queries=[Query("n", ("dx",))], delta=1e-9, partitions="private",
             max_units=10**7),
        dict(kind="dp_mean", queries=[Query("m")], value="v", bounds=(0.0, 1e6), delta=1e-9,
             mechanism="discrete_gaussian", max_units=10**7),
    ):  # fmt: skip
        spec = from_config_values(name="r", epsilon=eps, domains={}, **{"delta": 0.0, **kw})
        report = guarantee(spec, plan_queries(spec))["accounting"]
        assert math.isfinite(report["chosen"]["epsilon"])


def test_rho_for_tiny_epsilon_is_positive() -> None:
    assert rho_for(1e-12, 1e-6) > 0  # was 0 by cancellation (√(L+ε) − √L)
    assert rho_for(1.0, 1e-6) + 2 * math.sqrt(rho_for(1.0, 1e-6) * math.log(1e6)) <= 1.0


def test_epsilon_75_publishes_and_1e_300_is_refused_at_planning() -> None:
    df = pd.DataFrame({"pid": [f"P{i}" for i in range(300)], "dx": ["Flu", "Cold", "X"] * 100})
    spec = from_config_values(
        name="h", kind="dp_histogram", epsilon=75.0, delta=1e-8, queries=[Query("h", ("dx",))],
        domains={}, partitions="private", unit="pid", max_units=10**7,
    )  # fmt: skip
    table, doc = dp_release(df, spec, SeededTestSampler(3), insecure_seed=None)
    assert doc["verified"] is True and len(table) == 3
    groups = doc["guarantee"]["accounting"]["group_privacy"]
    assert groups["10"]["delta"] == 1.0 and groups["10"]["epsilon"] == 750.0  # vacuous, finite
    with pytest.raises(ConfigError, match=r"h.epsilon: 1e-300 needs a noise scale above"):
        plan_queries(spec.__class__(**{**spec.__dict__, "epsilon": spec.epsilon * 0 + 10**-300}))


# --------------------------------------------------------------------------- seeds, verifier


def test_insecure_seed_document_claims_no_guarantee() -> None:
    df = pd.DataFrame({"v": np.arange(100, dtype=float)})
    spec = big_sum_spec(bounds=(0.0, 100.0))
    _, doc = dp_release(df, spec, SeededTestSampler(4), insecure_seed=4)
    assert doc["guarantee"] == INSECURE_GUARANTEE and doc["verified"] is False
    assert doc["planned_guarantee"]["epsilon"] == 1.0 and doc["insecure_seed"] == 4
    _, secure = dp_release(df, spec, SeededTestSampler(4))
    assert secure["verified"] is True and secure["guarantee"]["epsilon"] == 1.0


def test_verifier_catches_a_planner_sensitivity_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the shared sensitivity function (here: half the truth) fools the planner;
    the verifier derives its own sensitivity and refuses."""

    def buggy(l0: int, linf: int, clamp: tuple[float, float] | None = None) -> Any:
        l1, l2 = sensitivities(l0, linf, clamp=clamp)
        return l1 / 2, l2 / 2

    monkeypatch.setattr(dp.spec, "sensitivities", buggy)
    monkeypatch.setattr(dp.release, "sensitivities", buggy, raising=False)  # old verifier
    df = pd.DataFrame({"v": np.arange(100, dtype=float)})
    for spec in (big_sum_spec(bounds=(0.0, 100.0)), big_sum_spec(kind="dp_count", value=None,
                                                                   bounds=None)):  # fmt: skip
        with pytest.raises(PrivacyRefusal, match="calibrated to sensitivity"):
            dp_release(df, spec, SeededTestSampler(5))


def test_large_epsilon_guard_leaves_ordinary_steps_to_pld() -> None:
    """Only a step beyond e^700 skips PLD/RDP; an (ε, δ) step (rho = inf) does not."""
    steps = [DiscreteLaplace.of(2, 1), ApproxDP.of(0.5, 1e-9)]
    assert Accountant(steps, delta=1e-6).pld().epsilon is not None
    huge = Accountant([DiscreteLaplace.of(1, 800), ApproxDP.of(0.5, 1e-9)], delta=1e-6)
    assert huge.pld().epsilon is None and huge.chosen().epsilon == pytest.approx(800.5)
