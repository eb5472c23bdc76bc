"""dp_count_distinct, dp_variance/dp_stddev and dp_quantile/dp_median (issue 16): the pure
core's statistics, their guarantees and empirical privacy audits that can say no."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import beta as beta_dist
from scipy.stats import chisquare

from privpipe.dp.cells import CellPartial, bound_and_aggregate, concat, contributions
from privpipe.dp.exponential import exponential_mechanism
from privpipe.dp.noise import NoiseSampler, SecureSampler, SeededTestSampler
from privpipe.dp.release import (
    cell_histograms,
    dp_release,
    moment_estimate,
    quantile_sensitivity,
    quantile_utilities,
    release_query,
    verify_release,
)
from privpipe.dp.spec import DPReleaseSpec, Query, QueryPlan, from_config_values, plan_queries
from privpipe.errors import ConfigError, PrivacyRefusal

HALF = Fraction(1, 2)


def spec_of(kind: str, **kw: Any) -> DPReleaseSpec:
    base: dict[str, Any] = dict(
        name="r", kind=kind, epsilon=1.0, delta=0.0, queries=[Query("r")], domains={}
    )
    base.update(kw)
    return from_config_values(**base)


def partial_of(df: pd.DataFrame, spec: DPReleaseSpec, seed: int = 0) -> CellPartial:
    """The bounded cells of the first query (contribution bounding as the release does)."""
    plans = plan_queries(spec)
    return bound_and_aggregate(concat(contributions(df, spec, plans)[:1]), spec, seed)


def release(df: pd.DataFrame, spec: DPReleaseSpec, sampler: NoiseSampler) -> pd.DataFrame:
    partial = partial_of(df, spec)
    dictionary = contributions(df, spec, plan_queries(spec))[0].dictionary
    plan = plan_queries(spec)[0]
    return release_query(partial, dictionary, spec, plan, sampler).table


def _epsilon_lb(k1: int, k0: int, n: int, alpha: float) -> float:
    """ε_LB = ln(p1_lo / p0_hi), Clopper–Pearson at level α (REFERENCE.md's audit)."""
    p1_lo = float(beta_dist.ppf(alpha / 2, k1, n - k1 + 1)) if k1 > 0 else 0.0
    p0_hi = float(beta_dist.ppf(1 - alpha / 2, k0 + 1, n - k0)) if k0 < n else 1.0
    return -math.inf if p1_lo <= 0 else math.log(p1_lo / p0_hi)


def audit(out_d: np.ndarray, out_dp: np.ndarray, thresholds: list[float], alpha: float) -> float:
    """The largest ε_LB over events {output ≥ t} and {output < t}, both directions
    (Bonferroni over the events tried)."""
    n = len(out_d)
    a = alpha / (4 * len(thresholds))
    best = -math.inf
    for t in thresholds:
        for d, dp_ in ((out_d, out_dp), (out_dp, out_d)):
            k1, k0 = int((d >= t).sum()), int((dp_ >= t).sum())
            best = max(best, _epsilon_lb(k1, k0, n, a), _epsilon_lb(n - k1, n - k0, n, a))
    return best


# --------------------------------------------------------------------------- count distinct


def test_count_distinct_counts_a_many_row_person_once() -> None:
    rows = [("P0", "a")] * 40 + [(f"P{i}", "a") for i in range(1, 6)] + [("P9", "b")] * 3
    df = pd.DataFrame(rows, columns=["pid", "cell"])
    kw: dict[str, Any] = dict(
        unit="pid", queries=[Query("r", ("cell",))], domains={("cell", 0): ["a", "b"]},
        max_contributions=50, epsilon=1e4,
    )  # fmt: skip
    distinct = spec_of("dp_count_distinct", **kw)
    out = release(df, distinct, SeededTestSampler(0)).set_index("cell")["count"]
    assert out.to_dict() == {"a": 6, "b": 1}  # P0's 40 rows are one person
    rows_count = release(df, spec_of("dp_count", **kw), SeededTestSampler(0))
    assert rows_count.set_index("cell")["count"].to_dict() == {"a": 45, "b": 3}
    # the noise is calibrated to one person per cell whatever Linf: L1 = L0
    plan = plan_queries(spec_of("dp_count_distinct", **{**kw, "max_partitions": 2}))[0]
    assert plan.count_noise is not None and plan.count_noise.sensitivity == 2.0


# --------------------------------------------------------------------------- quantiles


def test_quantile_utilities_and_selection_law_on_a_tiny_grid() -> None:
    # grid 0..3 (bounds [0, 3], resolution 1); rows 0, 1, 1, 3 -> histogram [1, 2, 0, 1]
    df = pd.DataFrame({"v": [0.0, 1.0, 1.2, 3.0]})
    spec = spec_of("dp_median", value="v", bounds=(0.0, 3.0), quantiles=(HALF,))
    plan = plan_queries(spec)[0]
    partial = partial_of(df, spec)
    hist = cell_histograms(partial, pd.Series(partial.cells.index), plan.grid)[0]
    assert hist.tolist() == [1, 2, 0, 1]
    u = quantile_utilities(hist, HALF)
    assert u.tolist() == [-3, 0, -2, -3]  # −|#below − #above|
    assert quantile_utilities(hist, Fraction(3, 4)).tolist() == [
        -9,
        -2,
        0,
        -3,
    ]  # −|1·#below − 3·#above|
    sens = quantile_sensitivity(spec, HALF)
    assert sens == 1
    eps = float(plan.quantile_epsilon or 0)
    exact = np.exp(eps * u / (2 * sens))  # P[o] ∝ exp(ε·u/(2Δu)), exactly
    exact /= exact.sum()
    for sampler, n in ((SecureSampler(), 2_000), (SeededTestSampler(3), 20_000)):
        picks = [exponential_mechanism(u, eps, float(sens), sampler) for _ in range(n)]
        counts = np.bincount(picks, minlength=4)
        assert chisquare(counts, exact * n).pvalue > 1e-4, (counts, exact * n)
    # a law at ε/Δu instead of ε/(2Δu) is rejected by the same test
    wrong = np.exp(eps * u / sens)
    wrong /= wrong.sum()
    assert chisquare(counts, wrong * 20_000).pvalue < 1e-6


def test_several_quantiles_split_epsilon_and_persons_in_l0_cells() -> None:
    spec = spec_of(
        "dp_quantile", value="v", bounds=(0.0, 10.0), unit="pid", max_partitions=2,
        max_contributions=3, queries=[Query("r", ("g",))], domains={("g", 0): ["x", "y"]},
        quantiles=(Fraction(1, 4), HALF, Fraction(9, 10)),
    )  # fmt: skip
    plan = plan_queries(spec)[0]
    assert plan.quantile_epsilon == Fraction(1, 2 * 3)  # ε / (L0 · quantiles)
    assert quantile_sensitivity(spec, Fraction(9, 10)) == 3 * 9  # Linf · max(a, d − a)
    assert plan.grid == 11


def test_released_quantiles_are_monotone() -> None:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"g": rng.choice(list("abcdefghij"), 300), "v": rng.uniform(0, 100, 300)})
    spec = spec_of(
        "dp_quantile", value="v", bounds=(0.0, 100.0), epsilon=0.05,
        queries=[Query("r", ("g",))], domains={("g", 0): list("abcdefghij")},
        quantiles=(Fraction(1, 10), HALF, Fraction(9, 10)),
    )  # fmt: skip
    for seed in range(5):
        table = release(df, spec, SeededTestSampler(seed))
        values = table[["q0.1", "q0.5", "q0.9"]].to_numpy()
        assert (np.diff(values, axis=1) >= 0).all(), table


def test_released_median_is_within_its_rank_error_bound() -> None:
    """McSherry–Talwar: P[u(out) ≤ OPT − 2Δu(ln|C| + t)/ε] ≤ e^−t; here e^−t = 5 %."""
    n, grid = 1001, 1000
    df = pd.DataFrame({"v": np.random.default_rng(1).integers(0, grid, n).astype(float)})
    spec = spec_of("dp_median", value="v", bounds=(0.0, grid - 1.0), quantiles=(HALF,), epsilon=0.2)
    plan = plan_queries(spec)[0]
    partial = partial_of(df, spec)
    hist = cell_histograms(partial, pd.Series(partial.cells.index), plan.grid)[0]
    u = quantile_utilities(hist, HALF)
    eps, sens = float(plan.quantile_epsilon or 0), quantile_sensitivity(spec, HALF)
    t = math.log(20)
    allowed = int(u.max()) - 2 * sens * (math.log(grid) + t) / eps
    runs = 400
    picks = [exponential_mechanism(u, eps, sens, SeededTestSampler(s)) for s in range(runs)]
    misses = sum(int(u[p] <= allowed) for p in picks)
    dictionary = contributions(df, spec, [plan])[0].dictionary
    for seed in range(3):  # the release draws exactly these medians
        rel = release_query(partial, dictionary, spec, plan, SeededTestSampler(seed))
        assert rel.table["median"].iloc[0] == picks[seed]
    # the miss rate is not significantly above 5 % (one-sided Clopper–Pearson at 1e-3)
    low = float(beta_dist.ppf(1e-3, misses, runs - misses + 1)) if misses else 0.0
    assert low <= math.exp(-t), misses
    # the bound is informative: the true median is in the middle, the grid is wide
    assert abs(np.median(df["v"]) - grid / 2) < 100 and allowed > -grid


def test_quantile_audit_passes_and_fails_for_a_broken_sensitivity() -> None:
    """One person with Linf = 4 rows below the median moves every utility by up to 4;
    a mechanism calibrated to Δu = 1 (Linf forgotten) is caught."""
    eps = 2.0
    spec = spec_of(
        "dp_median", value="v", bounds=(0.0, 1.0), unit="pid", max_contributions=4,
        quantiles=(HALF,), epsilon=eps,
    )  # fmt: skip
    plan = plan_queries(spec)[0]
    d = pd.DataFrame({"pid": ["A"], "v": [1.0]})
    dp_ = pd.concat([d, pd.DataFrame({"pid": ["B"] * 4, "v": [0.0] * 4})], ignore_index=True)
    hists = []
    for frame in (d, dp_):
        partial = partial_of(frame, spec)
        hists.append(cell_histograms(partial, pd.Series(partial.cells.index), plan.grid)[0])
    utilities = [quantile_utilities(h, HALF) for h in hists]
    n, sampler = 20_000, SeededTestSampler(5)

    def draws(sens: float) -> list[np.ndarray]:
        return [
            np.array([exponential_mechanism(u, eps, sens, sampler) for _ in range(n)])
            for u in utilities
        ]

    right = draws(float(quantile_sensitivity(spec, HALF)))
    assert float(plan.quantile_epsilon or 0) == eps
    assert audit(right[0], right[1], [1.0], 1e-3) <= eps
    broken = draws(1.0)
    assert audit(broken[0], broken[1], [1.0], 1e-3) > eps


# --------------------------------------------------------------------------- variance


def _moment_runs(
    spec: DPReleaseSpec, plan: QueryPlan, cells: pd.DataFrame, n: int, sampler: NoiseSampler
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n independent releases of one cell's (N, S, Q), vectorised: one sampler call each."""
    assert plan.count_noise and plan.sum_noise and plan.sumsq_noise
    parts = []
    for col, noise in (
        ("count", plan.count_noise),
        ("sum_units", plan.sum_noise),
        ("sumsq_units", plan.sumsq_noise),
    ):
        values = np.repeat(np.int64(int(cells[col].iloc[0])), n)
        parts.append(noise.add_noise(values, sampler).astype(np.float64))
    return moment_estimate(spec, plan, *parts)


def test_variance_is_unbiased_and_its_interval_covers() -> None:
    rng = np.random.default_rng(2)
    df = pd.DataFrame({"v": np.round(rng.beta(2, 5, 4000) * 100)})
    spec = spec_of("dp_variance", value="v", bounds=(0.0, 100.0), epsilon=1.0)
    plan = plan_queries(spec)[0]
    partial = partial_of(df, spec)
    truth = float(df["v"].var(ddof=0))  # clamping and rounding do not bind here
    runs = 2_000
    var, low, high = _moment_runs(spec, plan, partial.cells, runs, SeededTestSampler(8))
    se = float(var.std()) / math.sqrt(runs)
    assert abs(float(var.mean()) - truth) < 4 * se, (var.mean(), truth, se)
    coverage = float(((low <= truth) & (truth <= high)).mean())
    assert coverage >= spec.confidence, coverage
    # the pure release publishes the same statistic (one seeded run)
    table = release(df, spec, SeededTestSampler(1))
    assert abs(table["variance"].iloc[0] - truth) < 0.2 * truth
    assert table["ci_low"].iloc[0] <= table["variance"].iloc[0] <= table["ci_high"].iloc[0]


def test_stddev_is_the_root_and_intervals_account_for_three_noises() -> None:
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"v": rng.uniform(-50, 50, 300)})
    var_spec = spec_of("dp_variance", value="v", bounds=(-50.0, 50.0), epsilon=0.5)
    sd_spec = spec_of("dp_stddev", value="v", bounds=(-50.0, 50.0), epsilon=0.5)
    var_plan, sd_plan = plan_queries(var_spec)[0], plan_queries(sd_spec)[0]
    assert sd_plan.count_noise and sd_plan.sum_noise and sd_plan.sumsq_noise
    # three noises at ε/3 each, each interval at β/3 (union bound)
    assert [n.beta for n in (sd_plan.count_noise, sd_plan.sum_noise, sd_plan.sumsq_noise)] == [
        pytest.approx(0.05 / 3)
    ] * 3
    assert sd_plan.sum_noise.sensitivity == 50 and sd_plan.sumsq_noise.sensitivity == 2500
    partial = partial_of(df, sd_spec)
    v = _moment_runs(var_spec, var_plan, partial.cells, 500, SeededTestSampler(4))
    s = _moment_runs(sd_spec, sd_plan, partial.cells, 500, SeededTestSampler(4))
    for a, b in zip(v, s, strict=True):
        np.testing.assert_allclose(np.sqrt(a), b)
    truth = float(np.sqrt(df["v"].var(ddof=0)))
    assert float(((s[1] <= truth) & (truth <= s[2])).mean()) >= 0.95


def test_variance_audit_passes_and_fails_for_a_broken_squares_sensitivity() -> None:
    """One person at the bound moves N by 1, S by m and Q by m²; Q noise calibrated to m
    instead of m² is caught."""
    eps = 1.0
    spec = spec_of("dp_variance", value="v", bounds=(-10.0, 10.0), epsilon=eps)
    plan = plan_queries(spec)[0]
    d = pd.DataFrame({"v": [0.0] * 20})
    dp_ = pd.DataFrame({"v": [0.0] * 20 + [10.0]})
    cells = [partial_of(f, spec).cells for f in (d, dp_)]
    n, sampler = 100_000, SeededTestSampler(6)  # OpenDP's own samplers: test_dp_noise
    thresholds = [1.0, 2.0, 4.0, 8.0]
    right = [_moment_runs(spec, plan, c, n, sampler)[0] for c in cells]
    assert audit(right[0], right[1], thresholds, 1e-3) <= eps
    assert plan.sumsq_noise is not None
    wrong_noise = type(plan.sumsq_noise)(
        plan.sumsq_noise.mechanism,
        plan.sumsq_noise.scale / 10,  # calibrated to m = 10, not m² = 100
        10.0,
        plan.sumsq_noise.halfwidth,
        plan.sumsq_noise.beta,
    )
    broken_plan = QueryPlan(**{**plan.__dict__, "sumsq_noise": wrong_noise})
    wrong = [_moment_runs(spec, broken_plan, c, n, sampler)[0] for c in cells]
    assert audit(wrong[0], wrong[1], thresholds, 1e-3) > eps
    # and the verifier refuses that plan: its recorded noise is not the bounds' sensitivity
    table = release(d, spec, SeededTestSampler(0))
    rel = release_query(partial_of(d, spec), pd.DataFrame(), spec, plan, SeededTestSampler(0))
    assert len(table) == 1
    with pytest.raises(PrivacyRefusal, match="sensitivity"):
        verify_release(spec, [broken_plan], [rel], 21)


def test_count_distinct_audit_passes_and_fails_when_rows_are_counted() -> None:
    eps = 1.0
    spec = spec_of(
        "dp_count_distinct", unit="pid", max_contributions=5, epsilon=eps,
        queries=[Query("r")],
    )  # fmt: skip
    plan = plan_queries(spec)[0]
    assert plan.count_noise is not None
    d = pd.DataFrame({"pid": ["A", "B"]})
    dp_ = pd.DataFrame({"pid": ["A", "B"] + ["C"] * 5})
    n, sampler = 100_000, SeededTestSampler(7)

    def runs(col: str) -> list[np.ndarray]:
        out = []
        for frame in (d, dp_):
            value = int(partial_of(frame, spec).cells[col].iloc[0])
            noisy = plan.count_noise.add_noise(np.repeat(np.int64(value), n), sampler)  # type: ignore[union-attr]
            out.append(noisy.astype(np.float64))
        return out

    right = runs("units")
    assert audit(right[0], right[1], [3.0], 1e-3) <= eps
    broken = runs("count")  # rows, not persons: C's 5 rows move the cell by 5
    assert audit(broken[0], broken[1], [3.0, 5.0], 1e-3) > eps


# --------------------------------------------------------------------------- config checks


def test_bad_quantile_and_moment_configs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="quantiles"):
        spec_of("dp_quantile", value="v", bounds=(0.0, 1.0), quantiles=(Fraction(3, 2),))
    with pytest.raises(ConfigError, match="quantiles"):
        spec_of("dp_quantile", value="v", bounds=(0.0, 1.0))
    with pytest.raises(ConfigError, match="quantiles"):
        spec_of("dp_median", value="v", bounds=(0.0, 1.0), quantiles=(Fraction(9, 10),))
    assert spec_of("dp_median", value="v", bounds=(0.0, 1.0)).quantiles == (HALF,)
    with pytest.raises(ConfigError, match="candidates"):
        plan_queries(spec_of("dp_median", value="v", bounds=(0.0, 1e9), quantiles=(HALF,)))
    with pytest.raises(ConfigError, match="squared"):
        plan_queries(spec_of("dp_variance", value="v", bounds=(0.0, 1e9), resolution=1e-3))


def test_pure_api_releases_every_new_kind_with_a_verified_document() -> None:
    rng = np.random.default_rng(4)
    df = pd.DataFrame(
        {"pid": rng.integers(0, 200, 600).astype(str), "g": rng.choice(["x", "y"], 600),
         "v": rng.uniform(0, 100, 600)}
    )  # fmt: skip
    common: dict[str, Any] = dict(
        unit="pid", queries=[Query("r", ("g",))], domains={("g", 0): ["x", "y"]},
        max_partitions=2, max_contributions=2,
    )  # fmt: skip
    value: dict[str, Any] = dict(value="v", bounds=(0.0, 100.0))
    for kind, extra, column in (
        ("dp_count_distinct", {}, "count"),
        ("dp_variance", value, "variance"),
        ("dp_stddev", value, "stddev"),
        ("dp_median", {**value, "quantiles": (HALF,)}, "median"),
        ("dp_quantile", {**value, "quantiles": (HALF, Fraction(9, 10))}, "q0.9"),
    ):
        spec = spec_of(kind, **common, **extra)
        table, doc = dp_release(df, spec, SeededTestSampler(0), rng=0)
        assert list(table["g"]) == ["x", "y"] and column in table
        assert doc["guarantee"]["accounting"]["chosen"]["epsilon"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- Beam end to end


@pytest.mark.slow
def test_new_kinds_run_from_yaml_match_the_pure_api_and_are_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from privpipe.dp.noise import SeededTestSampler as Seeded
    from privpipe.pipelines.cli import main
    from privpipe.pipelines.dp_release import dp_jobs
    from privpipe.pipelines.plan import load_plan
    from tests.layout import internal_file, release_dir
    from tests.ledgers import provision_ledger
    from tests.test_dp_pipeline import DPProject

    dpp = DPProject(tmp_path)
    value = {"value": "salary", "bounds": [0, 100000], "resolution": 1000}
    # bounds that never bind (3 visits per person), so Beam and the pure API see the same
    # cells; group_by disease, partition_by sex
    common = {"group_by": ["disease"], "partition_by": "sex", "max_partitions": 3,
              "max_contributions_per_partition": 3, "epsilon": 1.0}  # fmt: skip
    dpp.cfg["releases"] = [
        {"name": "persons", "kind": "dp_count_distinct", **common},
        {"name": "var", "kind": "dp_variance", **common, **value},
        {"name": "sd", "kind": "dp_stddev", **common, **value, "round": 2},
        {"name": "med", "kind": "dp_median", **common, **value},
        {"name": "qs", "kind": "dp_quantile", **common, **value, "quantiles": [0.9, 0.1]},
        # private partitions: zips are not public
        {"name": "zips", "kind": "dp_median", "group_by": ["zip"], "epsilon": 1.0,
         "delta": 1e-6, **value},
    ]  # fmt: skip
    dpp.cfg["schema"].update(quasi_identifiers=["sex", "zip"], sensitive="disease")
    dpp.cfg["attacks"] = ["membership", "differencing"]
    dpp.cfg["budget"]["lifetime_epsilon"] = 20
    dpp.cfg["publish"] = [r["name"] for r in dpp.cfg["releases"]]
    dpp.save()
    provision_ledger(dpp.config)
    code = main(["run", str(dpp.config), "--insecure-seed", "5"])
    err = capsys.readouterr().err
    assert code == 0, err
    jobs = {j.name: j for j in dp_jobs(load_plan(dpp.config))}
    frame = dpp.frame.astype({"salary": str})
    for i, name in enumerate(r["name"] for r in dpp.cfg["releases"]):
        beam = pd.read_csv(release_dir(dpp.out, name) / "data.csv")
        doc = json.loads((release_dir(dpp.out, name) / "release.json").read_text())
        assert doc["planned_guarantee"]["epsilon"] == 1.0
        if name == "zips":
            assert doc["parameters"]["partitions"] == "private"
            assert set(beam["zip"].astype(str)) <= set(dpp.frame["zip"].astype(str))
            continue
        table, _ = dp_release(frame, jobs[name].spec, Seeded(5 + i))  # the run's seed + i
        pd.testing.assert_frame_equal(
            beam, table.astype({"sex": str, "disease": str}), check_dtype=False
        )
    qs = pd.read_csv(release_dir(dpp.out, "qs") / "data.csv")
    assert (qs["q0.1"] <= qs["q0.9"]).all()
    audit = json.loads(internal_file(dpp.out, "audit.json").read_text())["releases"]
    assert set(audit) >= {"persons", "var", "sd", "med", "qs", "zips"}
    assert "membership" in audit["persons"]["attacks"]
    for name, cells in (("persons", 8), ("var", 8), ("sd", 8), ("med", 8), ("qs", 16)):
        own = audit[name]["utility"]["own"]
        noise = audit[name]["utility"]["noise"]  # published against the bounded truth
        assert own["queries"] == cells and noise["queries"] == cells, (name, own)
        if name != "persons":  # (a count's metrics over 8 cells are withheld)
            assert 0 <= noise["mean_relative_error"] < 2.0, (name, noise)


def test_yaml_keys_of_the_new_kinds_are_checked() -> None:
    from privpipe.pipelines.config import validate_config
    from tests.test_config import base, error_of

    def with_release(**release: Any) -> dict[str, Any]:
        data = base()
        data["releases"] = [{"name": "r", "epsilon": 1.0, "domain": {"sex": ["F", "M"]},
                             "group_by": ["sex"], **release}]  # fmt: skip
        data["budget"] = {"ledger": "l.sqlite"}
        return data

    value = {"value": "age", "bounds": [0, 100]}
    ok = validate_config(with_release(kind="dp_median", **value), "x.yaml")
    assert ok.releases[0].quantile_list() == [0.5]  # type: ignore[union-attr]
    ok = validate_config(with_release(kind="dp_quantile", quantiles=[0.9, 0.1], **value), "x")
    assert ok.releases[0].quantile_list() == [0.1, 0.9]  # type: ignore[union-attr]
    assert "use kind dp_quantile" in error_of(
        with_release(kind="dp_median", quantiles=[0.9], **value)
    )
    assert "needs quantiles" in error_of(with_release(kind="dp_quantile", **value))
    assert "listed twice" in error_of(
        with_release(kind="dp_quantile", quantiles=[0.5, 0.5], **value)
    )
    assert "quantiles" in error_of(with_release(kind="dp_quantile", quantiles=[1.5], **value))
    assert "bounds" in error_of(with_release(kind="dp_variance", value="age"))
    assert "value" in error_of(with_release(kind="dp_stddev", bounds=[0, 1]))
    validate_config(with_release(kind="dp_count_distinct"), "x.yaml")
    assert "Extra inputs" in error_of(with_release(kind="dp_count_distinct", **value)) or (
        "value" in error_of(with_release(kind="dp_count_distinct", **value))
    )


def test_verifier_refuses_quantiles_off_the_grid_and_variances_outside_their_interval() -> None:
    df = pd.DataFrame({"v": np.arange(50, dtype=float)})
    for kind, extra, column, bad in (
        ("dp_quantile", {"quantiles": (Fraction(1, 4), HALF)}, "q0.5", 0.5),  # off the grid
        ("dp_quantile", {"quantiles": (Fraction(1, 4), HALF)}, "q0.5", -1.0),  # not monotone
        ("dp_stddev", {}, "stddev", 1e6),
    ):
        spec = spec_of(kind, value="v", bounds=(0.0, 49.0), **extra)
        plan = plan_queries(spec)[0]
        rel = release_query(partial_of(df, spec), pd.DataFrame(), spec, plan, SeededTestSampler(0))
        verify_release(spec, [plan], [rel], len(df))  # as released: fine
        if column == "q0.5" and bad < 0:
            rel.table["q0.5"] = rel.table["q0.25"] - 1.0
        else:
            rel.table[column] = bad
        with pytest.raises(PrivacyRefusal, match=r"grid|monotone|outside"):
            verify_release(spec, [plan], [rel], len(df))


def test_bounded_truth_of_the_audit_is_the_statistic_of_the_kept_rows(tmp_path: Path) -> None:
    from privpipe.pipelines.dp_release import bounded_truth
    from privpipe.transforms.dp_aggregate import write_pickle

    rng = np.random.default_rng(9)
    df = pd.DataFrame(
        {"pid": np.repeat(np.arange(60), 2).astype(str), "g": np.tile(["x", "y"], 60),
         "v": rng.integers(0, 50, 120).astype(float)}
    )  # fmt: skip
    common: dict[str, Any] = dict(
        unit="pid", queries=[Query("r", ("g",))], domains={("g", 0): ["x", "y"]},
        max_partitions=2, value="v", bounds=(0.0, 49.0),
    )  # fmt: skip
    by = df.groupby("g")["v"]
    for kind, column, expected in (
        ("dp_median", "median", by.quantile(0.5, interpolation="lower")),
        ("dp_variance", "variance", by.var(ddof=0)),
        ("dp_stddev", "stddev", by.std(ddof=0)),
        ("dp_count_distinct", "count", df.groupby("g")["pid"].nunique().astype(float)),
    ):
        extra = {} if kind != "dp_count_distinct" else {"value": None, "bounds": None}
        spec = spec_of(kind, **{**common, **extra})
        plans = plan_queries(spec)
        c = contributions(df, spec, plans)[0]
        cells = {"partials": [bound_and_aggregate(concat([c]), spec, 0)],
                 "dictionaries": [c.dictionary]}  # fmt: skip
        write_pickle(str(tmp_path / f"dp-{kind}.pickle"), cells)
        _, doc = dp_release(df, spec, SeededTestSampler(0), rng=0)
        truth = bounded_truth(tmp_path, kind, doc)["r"].set_index("g")[column]
        pd.testing.assert_series_equal(
            truth.sort_index(), expected.sort_index(), check_names=False, rtol=1e-9
        )
