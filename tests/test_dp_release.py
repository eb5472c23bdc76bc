"""The central-DP release core: bounding, partitions, budget split, verification, pure API."""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.dp.accounting import Accountant, ApproxDP, DiscreteLaplace, Parallel
from privpipe.dp.cells import bound_and_aggregate, concat, contributions
from privpipe.dp.noise import SeededTestSampler, discrete_laplace_variance
from privpipe.dp.release import check_delta, dp_release, release_query, verify_release
from privpipe.dp.spec import DPReleaseSpec, Query, charge, from_config_values, plan_queries
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

DX = ["a", "b", "c", "d", "e"]
SEXES = ["F", "M"]


def people(n_persons: int = 400, visits: int = 3, seed: int = 0) -> pd.DataFrame:
    """Persons with a fixed sex and several visits, each with a diagnosis and a salary."""
    rng = np.random.default_rng(seed)
    pid = np.repeat(np.arange(n_persons), visits)
    sex = np.array(SEXES)[rng.integers(0, 2, n_persons)][pid]
    return pd.DataFrame(
        {
            "pid": [f"P{i:05d}" for i in pid],
            "sex": sex,
            "dx": rng.choice(DX, pid.size),
            "salary": rng.integers(0, 90_000, pid.size),
        }
    )


def spec_of(kind: str = "dp_histogram", **kw: Any) -> DPReleaseSpec:
    base: dict[str, Any] = dict(
        name="r",
        kind=kind,
        epsilon=1.0,
        delta=0.0,
        queries=[Query("r", ("dx",) if kind == "dp_histogram" else ())],
        domains={("dx", 0): DX, ("sex", 0): SEXES},
        unit="pid",
    )
    base.update(kw)
    return from_config_values(**base)


def pre_noise(df: pd.DataFrame, spec: DPReleaseSpec, seed: int = 0) -> pd.DataFrame:
    """Bounded true counts/sums per cell of the first query, keyed by the cell labels."""
    plans = plan_queries(spec)
    c = contributions(df, spec, plans)[0]
    partial = bound_and_aggregate(concat([c]), spec, seed)
    labelled = partial.cells.join(c.dictionary.set_index("_cell"))
    cols = list(spec.key_columns(plans[0].query))
    return labelled.set_index(cols)[["count", "units", "sum_units"]] if cols else labelled


# --------------------------------------------------------------------------- bounding


@pytest.mark.parametrize(("l0", "linf"), [(1, 1), (2, 3), (5, 2)])
def test_a_person_with_1000_rows_moves_cells_by_at_most_the_bound(l0: int, linf: int) -> None:
    df = people(300, 1)
    heavy = pd.DataFrame({"pid": "HEAVY", "sex": "F", "dx": np.resize(DX, 1000), "salary": 10**9})
    spec = spec_of(max_partitions=l0, max_contributions=linf, bounds=None)
    before = pre_noise(df, spec)
    after = pre_noise(pd.concat([df, heavy], ignore_index=True), spec, seed=1)
    diff = after["count"].sub(before["count"], fill_value=0)
    assert diff.min() >= 0
    assert diff.max() <= linf
    assert (diff > 0).sum() <= l0
    assert diff.sum() <= l0 * linf
    # the heavy person is not cut to nothing: they keep exactly min(L0, 5) cells at Linf rows
    assert diff.sum() == min(l0, len(DX)) * linf


def test_sum_bounding_clamps_values_and_rows() -> None:
    df = people(200, 1)
    heavy = pd.DataFrame({"pid": "HEAVY", "sex": "F", "dx": "a", "salary": [10**9] * 1000})
    spec = spec_of("dp_sum", value="salary", bounds=(0.0, 100_000.0), max_contributions=2)
    before = pre_noise(df, spec)
    after = pre_noise(pd.concat([df, heavy], ignore_index=True), spec)
    assert int((after["sum_units"] - before["sum_units"]).iloc[0]) == 2 * 100_000


def test_person_in_two_partition_groups_is_refused_or_bounded_to_one() -> None:
    df = people(50, 2)
    df.loc[0, "sex"], df.loc[1, "sex"] = "F", "M"  # person P00000 in both groups
    spec = spec_of(partition_by=("sex",), max_partitions=5, max_contributions=2)
    with pytest.raises(InputDataError, match=r"a person \(pid\) appears in more than one") as e:
        pre_noise(df, spec)
    assert not re.search(r"\d", str(e.value)), "a data refusal of a DP release holds no figure"
    bounded = dataclasses.replace(spec, bound_to_one_group=True)
    plans = plan_queries(bounded)
    partial = bound_and_aggregate(concat(contributions(df, bounded, plans)), bounded, 3)
    assert partial.persons_in_several_groups == 1
    assert partial.max_groups_per_unit == 1
    assert partial.rows_kept == len(df) - 1


@pytest.mark.parametrize("bad", [None, ""])
def test_missing_person_id_is_refused(bad: object) -> None:
    df = people(20, 2).astype({"pid": object})
    df.loc[3, "pid"] = bad
    with pytest.raises(InputDataError, match="privacy_unit"):
        pre_noise(df, spec_of())


# --------------------------------------------------------------------------- partitions


def test_public_partitions_release_every_cell_including_empty_ones() -> None:
    df = people(300, 2)
    df = df[df["dx"] != "e"]  # "e" never occurs
    table, doc = dp_release(df, spec_of(max_partitions=2), SeededTestSampler(1), rng=1)
    assert table["dx"].tolist() == DX
    assert doc["verified"] and doc["parameters"]["partitions"] == "public"
    # out-of-domain values are never released
    df2 = people(300, 2)
    df2.loc[0, "dx"] = "zzz"
    table2, _ = dp_release(df2, spec_of(max_partitions=2), SeededTestSampler(1), rng=1)
    assert "zzz" not in set(table2["dx"])


def test_private_partitions_drop_keys_of_one_person() -> None:
    df = people(400, 1)
    rare = pd.DataFrame({"pid": ["LONE"], "sex": ["F"], "dx": ["rare-key"], "salary": [1]})
    spec = spec_of(delta=1e-6, partitions="private", domains={})
    kept = 0
    for seed in range(200):
        table, _ = dp_release(
            pd.concat([df, rare], ignore_index=True), spec, SeededTestSampler(seed), rng=seed
        )
        kept += "rare-key" in set(table["dx"])
        assert set(table["dx"]) - {"rare-key"} <= set(DX)
    assert kept == 0  # P[kept] <= 1e-6 per run
    table, _ = dp_release(df, spec, SeededTestSampler(0), rng=0)
    assert set(table["dx"]) == set(DX)  # ~80 persons each: always kept


def test_top_k_picks_the_clearly_most_frequent_values_per_group() -> None:
    rng = np.random.default_rng(2)
    n = 3000
    dx = rng.choice(DX, n, p=[0.5, 0.3, 0.1, 0.05, 0.05])
    df = pd.DataFrame({"pid": np.arange(n).astype(str), "sex": rng.choice(SEXES, n), "dx": dx})
    spec = spec_of("dp_top_k", value="dx", top_k=2, queries=[Query("r")], partition_by=("sex",))
    table, doc = dp_release(df, spec, SeededTestSampler(5), rng=5)
    assert table.columns.tolist() == ["sex", "rank", "dx"]
    assert table.groupby("sex")["dx"].apply(list).to_dict() == {"F": ["a", "b"], "M": ["a", "b"]}
    assert doc["guarantee"]["mechanism"] == "exponential"


# --------------------------------------------------------------------------- budget


def test_parallel_groups_cost_the_max_and_sequential_queries_add_up() -> None:
    spec = spec_of(partition_by=("sex",))
    plans = plan_queries(spec)
    assert all(isinstance(s, Parallel) for p in plans for s in p.steps)
    assert charge(spec, plans) == (Fraction(1), Fraction(0))
    two = spec_of(
        queries=[Query("a", ("dx",), weight=Fraction(1)), Query("b", (), weight=Fraction(3))]
    )
    plans2 = plan_queries(two)
    assert [p.epsilon for p in plans2] == [Fraction(1, 4), Fraction(3, 4)]
    assert [p.count_noise.scale for p in plans2 if p.count_noise] == [4.0, 4 / 3]
    assert charge(two, plans2) == (Fraction(1), Fraction(0))


def test_private_selection_and_gaussian_split_delta_and_meet_the_configured_budget() -> None:
    spec = spec_of(
        mechanism="discrete_gaussian", delta=1e-6, partitions="private", domains={},
        queries=[Query("a", ("dx",)), Query("b", ("sex", "dx"), weight=Fraction(2))],
    )  # fmt: skip
    plans = plan_queries(spec)
    sel = [p.selection_delta for p in plans]
    assert sum(sel, Fraction(0)) == Fraction(1, 2) * spec.delta
    chosen = Accountant([s for p in plans for s in p.steps], delta=1e-6).chosen()
    assert chosen.epsilon is not None and chosen.epsilon <= 1.0 + 1e-9
    assert chosen.delta is not None and chosen.delta <= 1e-6


def test_approx_dp_steps_in_the_accountant() -> None:
    pure = Accountant([ApproxDP.of("0.5"), DiscreteLaplace.of(2, 1)], delta=0)
    assert pure.chosen().epsilon == 1.0 and pure.chosen().delta == 0.0
    approx = Accountant([ApproxDP.of("0.5", "1e-7"), DiscreteLaplace.of(2, 1)], delta="1e-6")
    basic = approx.basic()
    assert basic.epsilon == 1.0 and basic.delta == pytest.approx(1e-7)
    assert approx.rdp().epsilon is None  # (epsilon, delta) steps have no Renyi bound
    with pytest.raises(ConfigError):
        ApproxDP.of(1, 1)


def test_delta_check_refuses_at_the_boundary() -> None:
    spec = spec_of(delta=0.01, partitions="private", domains={})
    with pytest.raises(ConfigError, match=r"0.01 is not below 1/rows = 0.01 \(100 rows\)"):
        check_delta(spec, 100)
    with pytest.raises(ConfigError):
        check_delta(spec, 5000)
    check_delta(spec, 99)  # 0.01 < 1/99


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"epsilon": 0.0}, "epsilon must be > 0"),
        ({"partitions": "private", "domains": {}}, "needs delta > 0"),
        ({"mechanism": "discrete_gaussian"}, "needs delta > 0"),
    ],
)
def test_spec_refuses_bad_parameters(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        spec_of(**kw)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_non_finite_epsilon_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError):
        spec_of(epsilon=bad)


def test_sum_and_mean_need_bounds() -> None:
    with pytest.raises(ConfigError, match="bounds"):
        spec_of("dp_sum", value="salary")
    with pytest.raises(ConfigError, match="lower <= upper"):
        spec_of("dp_mean", value="salary", bounds=(10.0, 1.0))


def test_non_numeric_value_is_refused() -> None:
    df = people(10, 1).astype({"salary": object})
    df.loc[2, "salary"] = "n/a"
    spec = spec_of("dp_sum", value="salary", bounds=(0.0, 1e5))
    with pytest.raises(InputDataError, match=r"'salary'.*not numeric"):
        dp_release(df, spec, SeededTestSampler(0))


# --------------------------------------------------------------------------- noise, outputs


def test_released_counts_have_the_planned_noise_variance() -> None:
    df = people(200, 1)
    spec = spec_of()
    truth = pre_noise(df, spec)["count"].reindex(DX, fill_value=0).to_numpy()
    errors = []
    for seed in range(400):
        table, _ = dp_release(df, dataclasses.replace(spec, clamp=False), SeededTestSampler(seed))
        errors.append(table["count"].to_numpy() - truth)
    err = np.concatenate(errors)
    expected = discrete_laplace_variance(plan_queries(spec)[0].count_noise.scale)  # type: ignore[union-attr]
    # 2000 draws: the sample variance is within ~10% of the truth with overwhelming odds
    assert abs(err.var() / expected - 1) < 0.15
    assert abs(err.mean()) < 0.2


def test_sum_and_mean_outputs() -> None:
    df = people(400, 1)
    s, _ = dp_release(df, spec_of("dp_sum", value="salary", bounds=(0.0, 1e5), resolution=100.0),
                      SeededTestSampler(0))  # fmt: skip
    assert s.columns.tolist() == ["sum", "ci_low", "ci_high"]
    assert (s["sum"] % 100 == 0).all()
    true_sum = (np.rint(df["salary"] / 100) * 100).sum()
    assert abs(s["sum"].iloc[0] - true_sum) <= s["ci_high"].iloc[0] - s["sum"].iloc[0] + 1e-9
    mean_spec = spec_of(
        "dp_mean", value="salary", bounds=(0.0, 1e5), queries=[Query("r", ("sex",))]
    )
    m, _ = dp_release(df, mean_spec, SeededTestSampler(0))
    assert m.columns.tolist() == ["sex", "mean", "count"]
    assert ((m["mean"] >= 0) & (m["mean"] <= 1e5)).all()
    assert abs(m["mean"].mean() - df["salary"].mean()) < 5_000


def test_multiple_queries_are_published_in_long_form() -> None:
    spec = spec_of(queries=[Query("by_dx", ("dx",)), Query("by_sex", ("sex",))])
    table, doc = dp_release(people(), spec, SeededTestSampler(0))
    assert table.columns.tolist()[0] == "query"
    assert table.groupby("query").size().to_dict() == {"by_dx": 5, "by_sex": 2}
    assert set(doc["parameters"]["queries"]) == {"by_dx", "by_sex"}


def test_release_json_holds_no_exact_counts() -> None:
    _, doc = dp_release(people(), spec_of(), SeededTestSampler(0))
    text = repr(doc)
    assert "rows" not in doc["metrics"] and "rows_kept" not in text
    assert doc["charged"] == {"epsilon": 1.0, "delta": 0.0}


# --------------------------------------------------------------------------- verification


def _released(spec: DPReleaseSpec, df: pd.DataFrame) -> tuple[Any, Any]:
    plans = plan_queries(spec)
    c = contributions(df, spec, plans)[0]
    partial = bound_and_aggregate(concat([c]), spec, 0)
    rel = release_query(partial, c.dictionary, spec, plans[0], SeededTestSampler(0))
    return plans, rel


def test_verification_passes_a_correct_release_and_says_no_to_broken_ones() -> None:
    df = people()
    spec = spec_of(max_partitions=2)
    plans, rel = _released(spec, df)
    assert verify_release(spec, plans, [rel], len(df))["epsilon"] == 1.0
    # noise at half the scale: epsilon 2 > 1
    half = dataclasses.replace(plans[0].count_noise, scale=plans[0].count_noise.scale / 2)  # type: ignore[type-var]
    with pytest.raises(PrivacyRefusal, match="epsilon 2"):
        verify_release(spec, [dataclasses.replace(plans[0], count_noise=half)], [rel], len(df))
    # a person kept beyond the bounds
    loose = dataclasses.replace(rel, partial=dataclasses.replace(rel.partial, max_cells_per_unit=3))
    with pytest.raises(PrivacyRefusal, match="keeps 3 cells"):
        verify_release(spec, plans, [loose], len(df))
    # a public release missing a domain cell
    short = dataclasses.replace(rel, table=rel.table.iloc[:-1])
    with pytest.raises(PrivacyRefusal, match="cells published, domain has 5"):
        verify_release(spec, plans, [short], len(df))
    # more persons than the declared max_units: the δ claim no longer holds
    declared = dataclasses.replace(spec, max_units=10_000)
    verify_release(declared, plans, [rel], len(df), privacy_units=10_000)
    with pytest.raises(PrivacyRefusal, match="more privacy units than max_units 10000"):
        verify_release(declared, plans, [rel], len(df), privacy_units=10_001)


def test_queries_keep_their_own_budget_in_the_document() -> None:
    spec = spec_of(
        queries=[Query("a", ("dx",), weight=Fraction(1)), Query("b", ("sex",), weight=Fraction(1))]
    )
    _, doc = dp_release(people(), spec, SeededTestSampler(0))
    q = doc["parameters"]["queries"]
    assert q["a"]["epsilon"] == q["b"]["epsilon"] == 0.5
    assert q["a"]["count_noise"]["scale"] == 2.0


def test_consistent_adjusts_fine_cells_to_their_coarser_query() -> None:
    groups = {"a": "ab", "b": "ab", "c": "cde", "d": "cde", "e": "cde"}

    def coarsen(col: str, lo: int, hi: int, labels: np.ndarray) -> np.ndarray:
        assert (col, lo, hi) == ("dx", 0, 1)
        return np.array([groups[x] for x in labels], dtype=object)

    spec = spec_of(
        queries=[Query("fine", ("dx",)), Query("coarse", ("dx",), levels=(("dx", 1),))],
        domains={("dx", 0): DX, ("dx", 1): ["ab", "cde"]},
        consistent=True,
    )

    def labeler(col: str, level: int, values: pd.Series) -> np.ndarray:
        raw = values.to_numpy(dtype=object)
        return raw if level == 0 else coarsen(col, 0, level, raw)

    table, doc = dp_release(
        people(), spec, SeededTestSampler(4), rng=4, labeler=labeler, coarsen=coarsen
    )
    fine = table[table["query"] == "fine"]
    coarse = table[table["query"] == "coarse"].set_index("dx")["count"]
    sums = fine.groupby(fine["dx"].map(groups))["count"].sum()
    assert sums.to_dict() == coarse.to_dict()
    assert "ci_low" not in table.columns  # intervals of adjusted cells are dropped
    assert doc["parameters"]["consistent"] == {"fine": "coarse", "coarse": "fine"}
    # the combined totals lie between the coarse noisy count and the fine sum
    spec_raw = dataclasses.replace(spec, consistent=False)
    raw, _ = dp_release(people(), spec_raw, SeededTestSampler(4), rng=4, labeler=labeler)
    raw_fine = raw[raw["query"] == "fine"]
    s = raw_fine.groupby(raw_fine["dx"].map(groups))["count"].sum()
    c = raw[raw["query"] == "coarse"].set_index("dx")["count"]
    for g in ("ab", "cde"):
        assert min(s[g], c[g]) - 1 <= coarse[g] <= max(s[g], c[g]) + 1
    with pytest.raises(ConfigError, match="consistent: needs counts"):
        spec_of(consistent=True)


def test_round_post_processing_of_means() -> None:
    spec = spec_of("dp_mean", value="salary", bounds=(0.0, 1e5), decimals=0)
    table, doc = dp_release(people(), spec, SeededTestSampler(0))
    assert (table["mean"] == table["mean"].round(0)).all()
    assert doc["parameters"]["round"] == 0


def test_group_privacy_is_reported() -> None:
    _, doc = dp_release(people(), spec_of(), SeededTestSampler(0))
    groups = doc["guarantee"]["accounting"]["group_privacy"]
    assert groups["2"] == {"epsilon": 2.0, "delta": 0.0}
    assert groups["10"]["epsilon"] == 10.0


@pytest.mark.parametrize("seed", range(40))
def test_consistency_survives_clamping(seed: int) -> None:
    """Small cells go negative before clamping; the levels must still add up afterwards."""
    groups = {"a": "ab", "b": "ab", "c": "cde", "d": "cde", "e": "cde"}

    def coarsen(col: str, lo: int, hi: int, labels: np.ndarray) -> np.ndarray:
        return np.array([groups[x] for x in labels], dtype=object)

    def labeler(col: str, level: int, values: pd.Series) -> np.ndarray:
        raw = values.to_numpy(dtype=object)
        return raw if level == 0 else coarsen(col, 0, level, raw)

    spec = spec_of(
        epsilon=0.2,  # noise large next to ~8 rows per cell: many negative cells
        queries=[Query("fine", ("dx",)), Query("coarse", ("dx",), levels=(("dx", 1),))],
        domains={("dx", 0): DX, ("dx", 1): ["ab", "cde"], ("sex", 0): SEXES},
        partition_by=("sex",),
        consistent=True,
    )
    table, _ = dp_release(
        people(40, 1, seed), spec, SeededTestSampler(seed), rng=seed, labeler=labeler,
        coarsen=coarsen,
    )  # fmt: skip
    fine = table[table["query"] == "fine"]
    sums = fine.groupby([fine["sex"], fine["dx"].map(groups)])["count"].sum()
    coarse = table[table["query"] == "coarse"].set_index(["sex", "dx"])["count"]
    assert (fine["count"] >= 0).all() and (coarse >= 0).all()
    assert sums.sort_index().to_dict() == coarse.sort_index().to_dict()


def test_verification_checks_published_keys_and_the_ledger_charge() -> None:
    df = people()
    spec = spec_of(max_partitions=2)
    plans, rel = _released(spec, df)
    # a cell outside the public domain in place of a domain cell: same count, wrong keys
    wrong = rel.table.copy()
    wrong.loc[0, "dx"] = "zzz"
    with pytest.raises(PrivacyRefusal, match="must be exactly the domain's"):
        verify_release(spec, plans, [dataclasses.replace(rel, table=wrong)], len(df))
    # the ledger recorded less than the noise really costs
    with pytest.raises(PrivacyRefusal, match="more than the ledger was charged"):
        verify_release(spec, plans, [rel], len(df), (Fraction(1, 2), Fraction(0)))
    # noise calibrated to a smaller sensitivity than the bounds give
    low = dataclasses.replace(plans[0].count_noise, sensitivity=1.0)  # type: ignore[type-var]
    with pytest.raises(PrivacyRefusal, match=r"but the bounds give 2\.0"):
        verify_release(spec, [dataclasses.replace(plans[0], count_noise=low)], [rel], len(df))
    # private partitions: a published key never seen in the data
    priv = spec_of(delta=1e-6, partitions="private", domains={})
    pplans, prel = _released(priv, df)
    ghost = pd.concat([prel.table, prel.table.iloc[:1].assign(dx="ghost")], ignore_index=True)
    with pytest.raises(PrivacyRefusal, match="was not selected from the data"):
        verify_release(priv, pplans, [dataclasses.replace(prel, table=ghost)], len(df))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 5), st.integers(0, 3)), min_size=0, max_size=80
    )
)
def test_the_bound_recounts_equal_a_brute_force_count(rows: list[tuple[int, int, int]]) -> None:
    """The re-check of the bounds (rows per (person, cell), cells and groups per person)
    and the persons per cell count what a dictionary counts: the verification can say no."""
    from collections import Counter

    from privpipe.dp.cells import Contributions, _aggregate, _Recount

    unit = np.array([r[0] for r in rows], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    cell = np.array([r[1] for r in rows], dtype=np.uint64) + np.uint64(2**63)
    group = np.array([r[2] for r in rows], dtype=np.uint64)
    recount = _Recount.of(Contributions(0, cell, unit, group, None))
    pairs = Counter(zip(unit.tolist(), cell.tolist(), strict=True))
    assert recount.max_rows_per_cell == max(pairs.values(), default=0)
    for item, got in ((cell, recount.max_cells_per_unit), (group, recount.max_groups_per_unit)):
        distinct: dict[int, set[int]] = {}
        for u, i in zip(unit.tolist(), item.tolist(), strict=True):
            distinct.setdefault(u, set()).add(i)
        assert got == max(map(len, distinct.values()), default=0)
    # without a privacy unit: each row its own person
    rowwise = _Recount.of(Contributions(0, cell, None, None, None))
    assert rowwise.max_rows_per_cell == rowwise.max_cells_per_unit == (1 if rows else 0)
    assert rowwise.units.tolist() == rowwise.rows.tolist()
    # without partition groups: one group, so at most one per person
    alone = _Recount.of(Contributions(0, cell, unit, None, None))
    assert alone.max_groups_per_unit == (1 if rows else 0)
    if rows:
        c = Contributions(0, cell, unit, None, None)
        cells = _aggregate(c, _Recount.of(c))
        persons: dict[int, set[int]] = {}
        for u, c_ in zip(unit.tolist(), cell.tolist(), strict=True):
            persons.setdefault(c_, set()).add(u)
        assert cells["units"].to_dict() == {k: len(p) for k, p in persons.items()}
        assert cells["count"].to_dict() == dict(Counter(cell.tolist()))
