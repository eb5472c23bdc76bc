"""Workload utility: workload sizes, uniform spreading by hand, DP histograms, Adult."""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from privpipe.anonymity.api import anonymize
from privpipe.anonymity.hierarchy import Hierarchy, load_arx_csv
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.attacks import NoNoise
from privpipe.dp.release import dp_release
from privpipe.dp.spec import Query, from_config_values
from privpipe.reports.run import Release
from privpipe.reports.utility import (
    Source,
    UtilityOptions,
    _Answerer,
    cover_table,
    raw_release,
    relative_floor,
    release_estimates,
    release_utility,
    score,
)
from privpipe.reports.workload import build_workload, parse_queries, true_answers
from tests.conftest import ADULT_QIS, ADULT_SA, ARX

# --------------------------------------------------------------------------- workload


def test_workload_counts_all_one_and_two_way_marginals() -> None:
    w = build_workload([*ADULT_QIS, ADULT_SA])
    assert w.ways() == {1: 9, 2: 36}
    assert len(w.marginals) == 45
    assert ("sex", "age") in w.marginals and ("age", "sex") not in w.marginals
    assert build_workload(["a", "b", "c"], ways=(1, 2, 3)).ways() == {1: 3, 2: 3, 3: 1}
    assert build_workload(["a", "a", "b"]).columns == ("a", "b")
    with pytest.raises(ValueError, match="at least one column"):
        build_workload([])


def test_custom_queries_parse_and_count() -> None:
    df = pd.DataFrame({"age": [30, 30.0, 41, 52], "sex": ["F", "M", "F", "F"]})
    w = build_workload(
        ["age", "sex"], queries=[{"name": "f30s", "where": {"age": [30, 41], "sex": "F"}}]
    )
    truth = true_answers(df, w)
    assert truth.queries == {"f30s": 2}
    assert truth.cells(("age",)) == 3  # 30 and 30.0 are one canonical value
    assert truth.cells(("age", "sex")) == 4
    with pytest.raises(ValueError, match="used twice"):
        parse_queries([{"name": "a", "where": {"x": 1}}, {"name": "a", "where": {"x": 2}}])
    with pytest.raises(ValueError, match="where"):
        parse_queries([{"name": "a", "where": {}}])


# --------------------------------------------------------------------------- spreading by hand

AGE = Hierarchy(
    "age",
    np.array(
        [
            ["20", "[20-30)", "*"],
            ["25", "[20-30)", "*"],
            ["30", "[30-40)", "*"],
            ["35", "[30-40)", "*"],
        ],
        dtype=object,
    ),
)
SEX = Hierarchy("sex", np.array([["M", "*"], ["F", "*"]], dtype=object))
RAW = pd.DataFrame(
    {"age": [20, 25, 30, 35], "sex": ["M", "M", "F", "F"], "dx": ["flu", "flu", "cold", "flu"]}
)


def _table(rows: list[tuple[str, str, str]], **doc: object) -> Release:
    data = pd.DataFrame(rows, columns=["age", "sex", "dx"])
    return Release("t", "k_anonymity", data, {"parameters": {"sensitive": "dx"}, **doc})


def test_uniform_spreading_hand_checked() -> None:
    truth = true_answers(RAW, build_workload(["age", "sex", "dx"]))
    release = _table(
        [
            ("[20-30)", "M", "flu"),
            ("[20-30)", "M", "flu"),
            ("*", "*", "cold"),
            ("[30-40)", "F", "flu"),
        ]
    )
    est = release_estimates(release, truth, {"age": AGE, "sex": SEX})
    age = est[("age",)]
    assert age is not None
    assert age.to_dict() == {"20": 1.25, "25": 1.25, "30": 0.75, "35": 0.75}
    sex = est[("sex",)]
    assert sex is not None and sex.to_dict() == {"M": 2.5, "F": 1.5}
    age_dx = est[("age", "dx")]
    assert age_dx is not None
    assert age_dx[("30", "cold")] == pytest.approx(0.25)  # the suppressed row, 1/4 per age
    assert age_dx[("35", "flu")] == pytest.approx(0.5)
    assert age_dx[("20", "flu")] == pytest.approx(1.0)
    u = release_utility(release, truth, {"age": AGE, "sex": SEX}, UtilityOptions(min_queries=1))
    # 1-way age: |1.25-1| x2 + |0.75-1| x2 -> mean 0.25
    assert u["by_way"]["1"]["queries"] == 4 + 2 + 2
    assert u["per_marginal"][0] == {
        "columns": ["age"],
        "queries": 4,
        "mean_absolute_error": 0.25,
        "mean_relative_error": pytest.approx(0.25 / 10),  # floor max(10, 0.1% of 4 rows)
        "max_absolute_error": 0.25,
        "within_10pct": 1.0,
    }
    assert u["marginals_not_answerable"] == 0 and u["unresolved_labels"] == 0
    # by default a marginal of fewer than 10 cells keeps its metrics to itself
    default = release_utility(release, truth, {"age": AGE, "sex": SEX})
    first = default["per_marginal"][0]
    assert first["withheld"] is True and first["queries"] == 4
    assert first["mean_absolute_error"] is None and first["max_absolute_error"] is None
    assert default["by_way"]["1"]["withheld"] is True  # 8 cells
    assert default["queries"] == 19 and default["mean_absolute_error"] is not None


def test_ranges_levels_and_unresolved_labels() -> None:
    domain = np.array(["20", "25", "30", "35"], dtype=object)
    # Mondrian ranges (closed) and a half-open one, without a hierarchy
    cover, unresolved = cover_table(["[20, 25]", "[30, 40)", "35", "???"], domain, numeric=True)
    got = cover.groupby("label")["value"].apply(lambda v: sorted(v)).to_dict()
    assert got["[20, 25]"] == ["20", "25"]
    assert got["[30, 40)"] == ["30", "35"]
    assert got["35"] == ["35"]
    assert got["???"] == ["20", "25", "30", "35"] and unresolved == 1
    assert cover.groupby("label")["weight"].sum().round(12).eq(1.0).all()
    # a label present at two levels: the transformation's level wins, else the lowest
    h = Hierarchy("x", np.array([["a", "a", "*"], ["b", "a", "*"]], dtype=object))
    low, _ = cover_table(["a"], [], h)
    assert low["value"].tolist() == ["a"]
    high, _ = cover_table(["a"], [], h, level=1)
    assert sorted(high["value"]) == ["a", "b"]


def test_raw_table_has_zero_error_and_all_star_is_worse() -> None:
    truth = true_answers(RAW, build_workload(["age", "sex", "dx"]))
    u = release_utility(raw_release(RAW, ["age", "sex", "dx"]), truth)
    assert u["mean_absolute_error"] == 0 and u["max_absolute_error"] == 0
    assert u["within_10pct"] == 1.0
    assert (
        u["queries"]
        == sum(truth.cells(m) for m in truth.workload.marginals)
        == 4 + 2 + 2 + 4 + 4 + 3
    )
    star = _table([("*", "*", d) for d in RAW["dx"]])
    assert release_utility(star, truth, {"age": AGE})["mean_absolute_error"] > 0


def test_score_floor_and_within() -> None:
    s = score([0, 100, 1000], [5, 109, 1200], floor=10)
    assert s["mean_absolute_error"] == pytest.approx((5 + 9 + 200) / 3)
    assert s["mean_relative_error"] == pytest.approx((0.5 + 0.09 + 0.2) / 3)
    assert s["within_10pct"] == pytest.approx(1 / 3)
    assert score([], [], 10)["mean_absolute_error"] is None
    assert score([1, 2], [1, 2], 10, min_queries=3) == {
        "queries": 2,
        "withheld": True,
        **{
            k: None
            for k in (
                "mean_absolute_error",
                "mean_relative_error",
                "max_absolute_error",
                "within_10pct",
            )
        },
    }
    assert relative_floor(30162) == pytest.approx(30.162)
    assert relative_floor(500) == 10.0
    assert relative_floor(500, UtilityOptions(floor_min=0.1)) == 0.5


# --------------------------------------------------------------------------- DP


def _people(n: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], n),
            "dx": rng.choice(["flu", "cold", "gout", "acne"], n),
            "age": rng.choice(["20", "25", "30", "35"], n),
        }
    )


def test_dp_histogram_without_noise_answers_exactly() -> None:
    df = _people()
    spec = from_config_values(
        name="h",
        kind="dp_histogram",
        epsilon=1.0,
        delta=0.0,
        queries=[Query("h", ("dx",))],
        partition_by=("sex",),
        max_partitions=1,
        domains={("dx", 0): ["acne", "cold", "flu", "gout"], ("sex", 0): ["F", "M"]},
    )
    table, doc = dp_release(df, spec, NoNoise(), rng=0)
    release = Release("h", doc["kind"], table.astype(str), doc)
    truth = true_answers(df, build_workload(["sex", "dx", "age"]))
    u = release_utility(release, truth)
    assert u["marginals_answered"] == 3  # sex, dx, sex x dx
    assert u["marginals_not_answerable"] == 3 and sorted(u["not_answerable"]) == [
        ["age"],
        ["dx", "age"],
        ["sex", "age"],
    ]
    assert u["queries_not_answerable"] == 4 + 8 + 16
    assert u["mean_absolute_error"] == 0.0 and u["queries"] == 2 + 4 + 8
    # with noise the same release has error
    noisy = table.assign(count=table["count"] + np.where(np.arange(len(table)) % 2, 3, -3))
    u2 = release_utility(Release("h", doc["kind"], noisy, doc), truth)
    assert u2["mean_absolute_error"] > 0


def test_dp_levels_long_form_and_local_dp() -> None:
    df = _people()
    truth = true_answers(df, build_workload(["sex", "age"]))
    # age published at level 1 of AGE, in long form next to a sex-only query
    by_level = df.assign(age=AGE.generalize(AGE.encode(df["age"]), 1))
    h1 = by_level.groupby(["age"]).size().rename("count").reset_index()
    h2 = df.groupby(["sex"]).size().rename("count").reset_index()
    data = pd.concat([h1.assign(query="a"), h2.assign(query="s")], ignore_index=True).fillna("")
    doc = {
        "parameters": {
            "partition_by": [],
            "queries": {
                "a": {"group_by": ["age"], "levels": {"age": 1}},
                "s": {"group_by": ["sex"]},
            },
        }
    }
    est = release_estimates(Release("d", "dp_count", data.astype(str), doc), truth, {"age": AGE})
    age, sex = est[("age",)], est[("sex",)]
    assert age is not None and sex is not None and est[("sex", "age")] is None
    young = int(df["age"].isin(["20", "25"]).sum())
    assert age["20"] == pytest.approx(young / 2) and age["25"] == pytest.approx(young / 2)
    assert sex.to_dict() == df["sex"].value_counts().astype(float).to_dict()
    ldp = pd.DataFrame({"value": ["F", "M"], "estimate": [310.5, -4.0]})
    rel = Release("l", "local_dp", ldp, {"parameters": {"attribute": "sex"}})
    est = release_estimates(rel, truth)
    assert est[("sex",)] is not None and est[("sex",)].to_dict() == {"F": 310.5, "M": 0.0}
    assert release_utility(Release("t", "dp_top_k", ldp, {}), truth)["queries"] == 0


# --------------------------------------------------------------------------- Adult


@pytest.fixture(scope="module")
def adult() -> tuple[pd.DataFrame, dict[str, Hierarchy]]:
    if not (ARX / "adult.csv").exists():
        pytest.skip(f"Adult data not found in {ARX}")
    df = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str, keep_default_na=False)
    names = [*ADULT_QIS, ADULT_SA]
    return df, {n: load_arx_csv(ARX / f"adult_hierarchy_{n}.csv", n) for n in names}


def test_adult_k_anonymous_release_costs_utility(
    adult: tuple[pd.DataFrame, dict[str, Hierarchy]],
) -> None:
    df, hierarchies = adult
    spec = AnonymizationSpec(
        kind="k_anonymity", qis=ADULT_QIS, sensitive=ADULT_SA, k=5, suppression_limit=0.05
    )
    release = anonymize(df, spec, hierarchies)
    workload = build_workload([*ADULT_QIS, ADULT_SA])
    truth = true_answers(df, workload)
    assert sum(truth.cells(m) for m in workload.marginals[:9]) == sum(
        df[c].nunique() for c in [*ADULT_QIS, ADULT_SA]
    )
    timings = {}
    results = {}
    star = release.table.copy()
    star[list(ADULT_QIS)] = "*"
    candidates = {
        "raw": raw_release(df, workload.columns),
        "k5": Release("k5", "k_anonymity", release.table, release.document),
        "star": Release("star", "k_anonymity", star, {}),
    }
    for name, rel in candidates.items():
        t0 = time.perf_counter()
        results[name] = release_utility(rel, truth, hierarchies)
        timings[name] = time.perf_counter() - t0
    print(f"\nAdult utility timings (s): {timings}")
    raw, k5, st = results["raw"], results["k5"], results["star"]
    assert raw["mean_absolute_error"] == 0 and raw["queries"] == k5["queries"] == st["queries"]
    assert raw["marginals_answered"] == 45
    assert 0 < k5["mean_relative_error"] < st["mean_relative_error"]
    assert k5["within_10pct"] > st["within_10pct"]
    assert k5["unresolved_labels"] == 0
    # occupation (SA) is published as is: its 1-way marginal is exact except for mass
    # dropped with suppressed rows (none here: suppressed rows keep their SA)
    occupation = next(m for m in k5["per_marginal"] if m["columns"] == [ADULT_SA])
    assert occupation["mean_absolute_error"] == 0
    assert max(timings.values()) < 10.0


def test_dp_fraction_epsilon_is_plain_json() -> None:
    # guarantees may carry Fractions in pure-core documents; the audit stores floats
    from privpipe.reports.audit import guarantee_text

    assert guarantee_text("dp_count", {"epsilon": Fraction(1, 2), "delta": 0}) == "ε=0.5"
    assert guarantee_text("l_diversity", {"k": 5, "l": 3, "variant": "recursive", "c": 4.0}) == (
        "k=5, l=3 (recursive, c=4)"
    )
    assert guarantee_text("raw", {}) == "no protection"


# --------------------------------------------------------------------------- issue 13 fixes


def test_bound_warning_only_when_the_interval_excludes_the_bound() -> None:
    """A point estimate just above the bound whose Wilson interval holds it is what an
    attack at the bound measures half the time: no WARNING; an interval above: WARNING."""
    from privpipe.reports.audit import findings

    def audit(rate: float, interval: list[float], bound_rate: str = "rate") -> dict:
        attack = {"rate": rate, "targets": 10_000, "interval": interval, "bound": 0.6225,
                  "bound_rate": bound_rate}  # fmt: skip
        if bound_rate != "rate":
            attack[bound_rate] = rate
            attack["rate"] = 0.1
        entry = {"kind": "dp_count", "guarantee_text": "ε=0.5", "attacks": {"membership": attack}}
        return {"releases": {"dp_zip": entry}}

    inside = " ".join(findings(audit(0.6260, [0.6165, 0.6354])))
    assert "measured 62.6% (membership)" in inside and "WARNING" not in inside
    above = " ".join(findings(audit(0.6500, [0.6406, 0.6592])))
    assert "WARNING: membership exceeds its theoretical bound" in above
    # a bounded rate other than the headline: its own interval on the same targets
    assert "WARNING" not in " ".join(findings(audit(0.6260, [0.09, 0.11], "map_accuracy")))
    assert "WARNING" in " ".join(findings(audit(0.6500, [0.09, 0.11], "map_accuracy")))


def test_labels_spread_over_the_public_domain_not_the_observed_values() -> None:
    """'X' covers leaves A, B, C, D; only A and B occur. The analyst does not know that:
    each 'X' row spreads a quarter to each leaf, so A gets 1 of its true 2 (old rule:
    spread over the observed A and B only, exact)."""
    h = Hierarchy("q", np.array([["A", "X"], ["B", "X"], ["C", "X"], ["D", "X"]], dtype=object))
    raw = pd.DataFrame({"q": ["A", "A", "B", "B"]})
    truth = true_answers(raw, build_workload(["q"]))
    table = Release("t", "k_anonymity", pd.DataFrame({"q": ["X"] * 4}), {})
    est = release_estimates(table, truth, {"q": h})[("q",)]
    assert est.loc["A"] == pytest.approx(1.0) and est.loc["B"] == pytest.approx(1.0)
    u = release_utility(table, truth, {"q": h}, UtilityOptions(min_queries=1))
    assert u["mean_absolute_error"] == pytest.approx(1.0)
    assert "public" in UtilityOptions().describe(4)["spread_over"]
    # the data-observed rule stays available for comparison only
    data = release_estimates(table, truth, {"q": h}, UtilityOptions(domain="data"))[("q",)]
    assert data.loc["A"] == pytest.approx(2.0)


def test_every_release_is_scored_on_one_common_workload() -> None:
    """A DP histogram answering only sex x dx and a table answering everything are scored
    on the same cells; the histogram's unanswerable cells are full misses (answered 0,
    relative error 1 when true >= floor). The raw table scores 0."""
    df = _people()
    truth = true_answers(df, build_workload(["sex", "dx", "age"]))
    spec = from_config_values(
        name="h", kind="dp_histogram", epsilon=1.0, delta=0.0,
        queries=[Query("h", ("dx",))], partition_by=("sex",), max_partitions=1,
        domains={("dx", 0): ["acne", "cold", "flu", "gout"], ("sex", 0): ["F", "M"]},
    )  # fmt: skip
    table, doc = dp_release(df, spec, NoNoise(), rng=0)
    hist = release_utility(Release("h", doc["kind"], table.astype(str), doc), truth)
    cells = 2 + 4 + 4 + 8 + 8 + 16  # every cell of the 1- and 2-way marginals
    common = hist["common"]
    assert common["queries"] == cells and common["answered"] == 2 + 4 + 8
    # exact on its 3 marginals (sex, dx, sex x dx), a full miss (every true count >= the
    # floor of 10) on the 3 others: the mean over the 6 marginals, each weighing the same
    assert common["error"] == pytest.approx(3 / 6) and common["items"] == 6
    assert "full miss" in common["rule"]
    base = release_utility(raw_release(df, ["sex", "dx", "age"]), truth)
    assert base["common"]["error"] == 0.0 and base["common"]["queries"] == cells
    # declared queries replace the default workload, for every release alike
    declared = true_answers(
        df,
        build_workload(
            ["sex", "dx", "age"],
            queries=[{"name": "f", "where": {"sex": "F"}}, {"name": "a", "where": {"age": "20"}}],
        ),
    )
    c = release_utility(Release("h", doc["kind"], table.astype(str), doc), declared)["common"]
    assert c["queries"] == 2 and c["answered"] == 1
    assert c["error"] == pytest.approx(0.5)  # sex=F exact, age=20 a full miss
    assert "report.queries" in c["workload"]
    # declared marginals (report.marginals) replace the default ones: the histogram answers
    # (dx) and (sex, dx) exactly and misses (age) entirely
    marg = true_answers(df, build_workload([], marginals=[["dx"], ["sex", "dx"], ["age"]]))
    assert marg.workload.declared and marg.workload.marginals == (("dx",), ("sex", "dx"), ("age",))
    m = release_utility(Release("h", doc["kind"], table.astype(str), doc), marg)["common"]
    assert m["queries"] == 4 + 8 + 4 and m["answered"] == 12
    assert m["error"] == pytest.approx(1 / 3) and "report.marginals" in m["workload"]


def test_dp_mean_is_scored_against_true_means_and_counts_split_bias_from_noise() -> None:
    """A dp_mean is scored on its means (not its counts); a person-bounded count's error
    against the raw rows is split into bounding bias and noise, from the bounded cells."""
    raw = pd.DataFrame({"dx": ["a"] * 40 + ["b"] * 60, "salary": [100.0] * 40 + [200.0] * 60})
    truth = true_answers(raw, build_workload(["dx"]))
    params = {"queries": {"m": {"group_by": ["dx"]}}, "value": "salary", "bounds": [0, 400]}
    means = pd.DataFrame({"dx": ["a", "b"], "mean": [110.0, 190.0], "count": [20, 30]})
    u = release_utility(
        Release("m", "dp_mean", means, {"kind": "dp_mean", "parameters": params}),
        truth, raw=raw,
    )  # fmt: skip
    assert u["own"]["truth"] == "raw" and "means" in u["own"]["estimand"]
    assert u["own"]["mean_relative_error"] == pytest.approx((0.1 + 0.05) / 2)
    assert u["own"]["queries"] == 2  # means are not withheld: they reveal no count
    # without the raw values: against the run's exact bounded means, noise only
    bounded = {"m": pd.DataFrame({"dx": ["a", "b"], "count": [20.0, 30.0],
                                  "mean": [100.0, 200.0]})}  # fmt: skip
    v = release_utility(
        Release("m", "dp_mean", means, {"kind": "dp_mean", "parameters": params}),
        truth, raw=raw[["dx"]], bounded=bounded,
    )  # fmt: skip
    assert v["own"]["truth"].startswith("bounded")
    assert v["own"]["mean_relative_error"] == pytest.approx(0.075)
    assert v["bias"] is None and v["noise"]["mean_relative_error"] == pytest.approx(0.075)
    # a bounded histogram: 40/60 rows, 20/30 persons after bounding, noisy 22/27
    doc = {"kind": "dp_count", "parameters": {"queries": {"c": {"group_by": ["dx"]}}}}
    counts = Release("c", "dp_count", pd.DataFrame({"dx": ["a", "b"], "count": [22, 27]}), doc)
    split = release_utility(
        counts, truth, raw=raw, bounded={"c": bounded["m"][["dx", "count"]]},
        options=UtilityOptions(min_queries=1),
    )  # fmt: skip
    assert split["bias"]["mean_relative_error"] == pytest.approx((20 / 40 + 30 / 60) / 2)
    assert split["noise"]["mean_relative_error"] == pytest.approx((2 / 20 + 3 / 30) / 2)
    assert split["own"]["mean_relative_error"] == pytest.approx((18 / 40 + 33 / 60) / 2)
    assert "bounding, not noise" in split["split"]
    nobounds = release_utility(counts, truth, raw=raw, options=UtilityOptions(min_queries=1))
    assert nobounds["bias"] is None and nobounds["noise"] is None


def test_true_answers_on_distinct_rows_equal_the_row_counts() -> None:
    """The truth is counted on distinct rows with their multiplicities: the same cells,
    counts, query answers and domains (first-appearance order) as counting every row."""
    from privpipe.reports.workload import canonical_frame

    rng = np.random.default_rng(7)
    n = 3000
    raw = pd.DataFrame(
        {
            "age": pd.array(rng.choice([20, 30, 40, None], n), dtype="Int64"),
            "sex": rng.choice(["M", "F", "X"], n),
            "dx": rng.choice(["flu", "cold", "", "covid"], n),
        }
    )
    raw.loc[rng.random(n) < 0.1, "age"] = pd.NA
    workload = build_workload(
        ["age", "sex", "dx"],
        queries=parse_queries([{"name": "q", "where": {"sex": "M", "dx": ["flu", "cold"]}}]),
    )
    truth = true_answers(raw, workload)
    rows = canonical_frame(raw, ["age", "sex", "dx"])
    assert truth.rows == n
    for m in workload.marginals:
        expected = rows.groupby(list(m), sort=True).size()
        pd.testing.assert_series_equal(truth.marginals[m], expected, check_dtype=False)
    mask = rows["sex"].eq("M") & rows["dx"].isin(["flu", "cold"])
    assert truth.queries["q"] == int(mask.sum())
    for c in ("age", "sex", "dx"):
        assert truth.domains[c].tolist() == pd.unique(rows[c].to_numpy(dtype=object)).tolist()


# --------------------------------------------------------------------------- coded answers

_LABELS = ["20", "25", "30", "35", "[20-30)", "[30-40)", "*", "[20, 30]", "[25, 40)", "??", "99"]


@settings(max_examples=60, deadline=None)
@example(  # the data has no F, a hierarchy's * covers it: a value no true cell holds
    [("20", "M", "flu"), ("30", "M", "cold")],
    [("[20-30)", "*", "flu", 2), ("30", "*", "*", 1)],
    None,
    False,
    False,
)
@given(
    st.lists(st.tuples(*(st.sampled_from(v) for v in (["20", "25", "30", "35"], ["M", "F"],
                                                          ["flu", "cold", "gout"]))),
             min_size=1, max_size=30),
    st.lists(st.tuples(st.sampled_from(_LABELS), st.sampled_from(["M", "F", "*", "X"]),
                       st.sampled_from(["flu", "cold", "gout", "acne", "*"]),
                       st.integers(-3, 5)), min_size=0, max_size=25),
    st.sampled_from([None, 1]),
    st.booleans(),
    st.booleans(),
)  # fmt: skip
def test_coded_estimates_equal_the_spread_frames_reindexed(
    raw_rows: list[tuple[str, str, str]],
    published: list[tuple[str, str, str, int]],
    level: int | None,
    numeric: bool,
    present_only: bool,
) -> None:
    """``_Answerer.estimate`` (integer codes) gives what ``answer_marginal``'s frames give,
    reindexed to the true cells: hierarchy labels at either level, ranges, ``*``, labels
    that resolve to nothing, values the data lacks, negative (noisy) counts, no rows."""
    raw = pd.DataFrame(raw_rows, columns=["age", "sex", "dx"])
    truth = true_answers(raw, build_workload(["age", "sex", "dx"], ways=(1, 2, 3)))
    labels = pd.DataFrame([p[:3] for p in published], columns=["age", "sex", "dx"], dtype=object)
    source = Source(
        "s", labels, np.array([p[3] for p in published], dtype=np.float64),
        levels={} if level is None else {"age": level},
        numeric=frozenset({"age"}) if numeric else frozenset(),
    )  # fmt: skip
    answerer = _Answerer([source], truth, {"age": AGE, "sex": SEX}, present_only)
    for m, true in truth.marginals.items():
        got = answerer.estimate(m, true.index)
        want = answerer.marginal(m)
        assert got is not None and want is not None
        np.testing.assert_allclose(
            got, want.reindex(true.index, fill_value=0.0).to_numpy(dtype=np.float64),
            rtol=1e-12, atol=1e-12,
        )  # fmt: skip


def test_a_marginal_too_wide_for_int64_keys_is_answered_by_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from privpipe.reports import utility

    truth = true_answers(RAW, build_workload(["age", "sex", "dx"]))
    release = _table([("[20-30)", "M", "flu"), ("*", "*", "cold"), ("[30-40)", "F", "flu")])
    coded = release_utility(release, truth, {"age": AGE, "sex": SEX})
    calls: list[object] = []
    frames = utility.answer_marginal
    monkeypatch.setattr(utility, "KEY_LIMIT", 1)
    monkeypatch.setattr(utility, "answer_marginal", lambda *a: calls.append(a) or frames(*a))
    assert release_utility(release, truth, {"age": AGE, "sex": SEX}) == coded
    assert len(calls) == len(truth.workload.marginals)
