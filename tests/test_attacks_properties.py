"""Properties of the table attacks on real releases of Adult, and against oracles.

- distinct l >= 2 => homogeneity rate 0; recursive (c, l) => no posterior >= c/(c+1) after
  ruling out any b <= l-2 values (brute force over elimination sets);
- t-closeness with equal distance => |q(s) - p(s)| <= t (the skewness numbers);
- the raw table (baseline) is attacked more successfully than the k=5 release;
- the rates equal REFERENCE.md's formulas recomputed with pandas on the published table;
- matching equals a brute-force per-row, per-label oracle on random small tables;
- the worst-case elimination equals a brute force over elimination sets.
Run with ``-s`` to see the timings and rates.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.anonymity.api import AnonymizedRelease, anonymize
from privpipe.anonymity.hierarchy import Hierarchy, load_arx_csv
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.attacks import (
    AttackerKnowledge,
    attack_table,
    background_knowledge,
    baseline_table,
    homogeneity,
    linkage,
    match_targets,
    skewness,
)
from privpipe.attacks.matching import WEIGHT, frequency_table
from privpipe.attacks.table import posterior_after_elimination, worst_elimination
from tests.conftest import ADULT_QIS, ADULT_SA, ARX

QIS = list(ADULT_QIS)
SA = ADULT_SA
ALL = ("homogeneity", "background_knowledge", "skewness", "similarity", "linkage")

adult_only = pytest.mark.skipif(
    not (ARX / "adult.csv").exists(), reason=f"Adult data not found in {ARX}"
)


@dataclass(frozen=True)
class Adult:
    df: pd.DataFrame
    hierarchies: dict[str, Hierarchy]


@cache
def adult() -> Adult:
    df = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str, keep_default_na=False)
    hierarchies = {
        name: load_arx_csv(ARX / f"adult_hierarchy_{name}.csv", name) for name in [*QIS, SA]
    }
    return Adult(df, hierarchies)


SPECS = {
    "k5": AnonymizationSpec("k_anonymity", ADULT_QIS, SA, k=5, suppression_limit=0.05),
    "l2": AnonymizationSpec("l_diversity", ADULT_QIS, SA, k=5, l=2, suppression_limit=0.05),
    "rec": AnonymizationSpec(
        "l_diversity", ADULT_QIS, SA, k=5, l=3, variant="recursive", c=2, suppression_limit=0.05
    ),
    "rec_mondrian": AnonymizationSpec(
        "l_diversity",
        ADULT_QIS,
        SA,
        k=5,
        l=3,
        variant="recursive",
        c=2,
        algorithm="mondrian",
        numeric=("age",),
    ),
    "l2_mondrian": AnonymizationSpec(
        "l_diversity", ADULT_QIS, SA, k=5, l=2, algorithm="mondrian", numeric=("age",)
    ),
    "k5_mondrian": AnonymizationSpec(
        "k_anonymity", ADULT_QIS, SA, k=5, algorithm="mondrian", numeric=("age",)
    ),
    "t02": AnonymizationSpec(
        "t_closeness", ADULT_QIS, SA, k=5, t=0.2, distance="equal", suppression_limit=0.05
    ),
}


@cache
def release(name: str) -> AnonymizedRelease:
    data = adult()
    return anonymize(data.df, SPECS[name], data.hierarchies, sa_hierarchy=data.hierarchies[SA])


def view_of(name: str):  # type: ignore[no-untyped-def]
    data = adult()
    return match_targets(release(name).table, data.df, QIS, SA, data.hierarchies)


# --------------------------------------------------------------------------- guarantees


@adult_only
@pytest.mark.parametrize("name", ["l2", "l2_mondrian", "rec", "rec_mondrian"])
def test_l_diversity_leaves_no_homogeneous_target(name: str) -> None:
    view = view_of(name)
    result = homogeneity(view, guarantee=SPECS[name].guarantee())
    assert result.bound == 0.0
    assert result.rate == 0.0 and result.within_bound is True
    assert result.rates["matched"] > 0.9


@adult_only
@pytest.mark.parametrize("name", ["rec", "rec_mondrian"])
def test_recursive_bound_over_every_elimination_set(name: str) -> None:
    spec = SPECS[name]
    assert spec.c is not None and isinstance(spec.l, int)
    bound = spec.c / (spec.c + 1.0)
    view = view_of(name)
    counts = np.unique(view.counts[view.sizes > 0], axis=0)  # distinct candidate vectors
    m = counts.shape[1]
    worst = 0.0
    for b in range(spec.l - 1):  # b <= l - 2
        for eliminated in itertools.combinations(range(m), b):
            mask = np.zeros(counts.shape, dtype=bool)
            mask[:, list(eliminated)] = True
            _, conf = posterior_after_elimination(counts, mask)
            worst = max(worst, float(np.nanmax(conf)))
    print(f"\n{name}: worst posterior over all sets of b <= l-2 = {worst:.4f} < {bound:.4f}")
    assert worst < bound
    for b in range(spec.l - 1):
        for mode in ("worst", "random"):
            know = AttackerKnowledge(background=b, background_mode=mode)  # type: ignore[arg-type]
            result = background_knowledge(view, know, spec.guarantee())
            assert result.bound == pytest.approx(bound)
            assert result.within_bound is True
            assert result.rates["max_posterior"] < bound
    beyond = background_knowledge(view, AttackerKnowledge(background=spec.l - 1), spec.guarantee())
    assert beyond.bound is None  # b = l-1: the guarantee says nothing


@adult_only
def test_t_closeness_bounds_the_skewness() -> None:
    spec = SPECS["t02"]
    rel = release("t02")
    assert rel.plan.input_sa_distribution is not None
    result = skewness(view_of("t02"), spec.guarantee(), reference=rel.plan.input_sa_distribution)
    assert result.bound == pytest.approx(0.2)
    assert result.within_bound is True
    assert result.rates["max_abs_difference"] <= 0.2 + 1e-12
    # the same number recomputed per class with pandas
    table = rel.table  # the '*' rows form one class: the suppressed block
    q = pd.crosstab([table[c] for c in QIS], table[SA], normalize="index")
    p = pd.Series(rel.plan.input_sa_distribution).reindex(q.columns, fill_value=0.0)
    per_class = (q - p).abs()
    assert result.rates["max_abs_difference"] == pytest.approx(float(per_class.max().max()))
    assert result.rates["max_equal_distance"] == pytest.approx(
        float(0.5 * per_class.sum(axis=1).max())
    )


@adult_only
def test_rates_follow_the_reference_formulas() -> None:
    rel = release("k5")
    data = adult()
    knowledge = AttackerKnowledge(tau=0.6)
    view = match_targets(rel.table, data.df, QIS, SA, data.hierarchies)
    result = homogeneity(view, knowledge)
    link = linkage(view, SPECS["k5"].guarantee())
    table = rel.table  # the '*' rows form one class: the suppressed block
    groups = table.groupby(QIS)[SA]
    size = groups.transform("size")
    distinct = groups.transform("nunique")
    conf = table.groupby([*QIS, SA])[SA].transform("size") / size
    conf_max = conf.groupby([table[c] for c in QIS]).transform("max")
    n = len(data.df)
    assert result.rate == pytest.approx(float((distinct == 1).sum()) / n)
    assert result.rates["tau_disclosure"] == pytest.approx(float((conf_max >= 0.6).sum()) / n)
    assert link.rate == pytest.approx(float((1.0 / size).sum()) / n)
    assert link.rates["highest"] <= 1 / 5 and link.within_bound is True
    assert result.targets == n


@adult_only
@pytest.mark.parametrize("name", ["k5", "k5_mondrian"])
def test_the_raw_table_is_easier_to_attack(name: str) -> None:
    data = adult()
    know = AttackerKnowledge(background=1)
    kwargs = {"attacks": ALL, "sa_hierarchy": data.hierarchies[SA]}
    raw = attack_table(
        baseline_table(data.df, QIS, SA), data.df, QIS, SA, data.hierarchies, know, **kwargs
    )
    anon = attack_table(
        release(name).table,
        data.df,
        QIS,
        SA,
        data.hierarchies,
        know,
        guarantee=SPECS[name].guarantee(),
        **kwargs,
    )
    print(f"\n{name}: raw vs release", {a: (raw[a].rate, anon[a].rate) for a in ALL})
    for attack in ("homogeneity", "background_knowledge", "similarity", "linkage"):
        assert raw[attack].rate > anon[attack].rate
        assert raw[attack].interval[0] > anon[attack].interval[1]  # clearly apart
    assert raw["homogeneity"].rates["correct"] == raw["homogeneity"].rate  # raw is the truth
    assert raw["linkage"].rates["uniques"] > 0.1 and anon["linkage"].rates["uniques"] == 0.0


@adult_only
def test_sampled_targets_estimate_the_full_rate() -> None:
    data = adult()
    full = attack_table(release("k5").table, data.df, QIS, SA, data.hierarchies)
    sample = attack_table(
        release("k5").table, data.df, QIS, SA, data.hierarchies, AttackerKnowledge(targets=3000)
    )
    for name, result in sample.items():
        assert result.targets == 3000
        lo, hi = result.interval
        slack = 0.02 if name == "linkage" else 0.0  # its interval is approximate
        assert lo - slack <= full[name].rate <= hi + slack


@adult_only
def test_all_attacks_on_all_targets_run_in_seconds() -> None:
    data = adult()
    timings = {}
    for name in ("k5", "k5_mondrian"):
        rel = release(name)
        for mode in ("worst", "random"):
            start = time.perf_counter()
            results = attack_table(
                rel.table,
                data.df,
                QIS,
                SA,
                data.hierarchies,
                AttackerKnowledge(background=2, background_mode=mode),  # type: ignore[arg-type]
                attacks=ALL,
                guarantee=SPECS[name].guarantee(),
                sa_hierarchy=data.hierarchies[SA],
            )
            timings[f"{name}/{mode}"] = round(time.perf_counter() - start, 3)
            assert all(r.targets == len(data.df) == 30162 for r in results.values())
    print(f"\nall attacks, 30,162 targets (s): {timings}")
    assert max(timings.values()) < 60  # loose: a sanity check, not a benchmark


# --------------------------------------------------------------------------- oracles


@given(
    counts=st.lists(st.lists(st.integers(0, 6), min_size=5, max_size=5), min_size=1, max_size=12),
    truth_seed=st.integers(0, 2**31),
    b=st.integers(0, 4),
)
@settings(max_examples=150, deadline=None)
def test_worst_elimination_is_the_best_set_for_the_attacker(
    counts: list[list[int]], truth_seed: int, b: int
) -> None:
    matrix = np.array(counts, dtype=np.int64)
    truth = np.random.default_rng(truth_seed).integers(0, 5, size=matrix.shape[0])
    mask = worst_elimination(matrix, truth, b)
    assert (mask.sum(axis=1) <= b).all() and not mask[np.arange(len(truth)), truth].any()
    remaining = np.where(mask, 0, matrix)
    for row, t, rest in zip(matrix, truth, remaining, strict=True):
        wrong = [s for s in range(5) if s != t]
        best = 0.0
        for chosen in itertools.combinations(wrong, min(b, len(wrong))):
            total = row.sum() - row[list(chosen)].sum()
            best = max(best, row[t] / total if total else 0.0)
        got = rest[t] / rest.sum() if rest.sum() else 0.0
        assert got == pytest.approx(best)


AGES = [str(a) for a in range(20, 30)]
AGE_H = Hierarchy(
    "age",
    np.array([[a, "20-24" if int(a) < 25 else "25-29", "*"] for a in AGES], dtype=object),
)
COLORS = ["red", "pink", "blue", "navy"]
COLOR_H = Hierarchy(
    "color",
    np.array([[c, "warm" if c in ("red", "pink") else "cold", "*"] for c in COLORS], dtype=object),
)


def covers(label: str, value: str, hierarchy: Hierarchy) -> bool:
    """The matching rule, one label and one value at a time (the oracle)."""
    if label in ("*", value):
        return True
    if label.startswith("["):
        lo, hi = (float(x) for x in label[1:-1].split(","))
        return lo <= float(value) <= hi
    row = list(hierarchy.values).index(value) if value in hierarchy.values else None
    return row is not None and label in list(hierarchy.table[row])


@given(seed=st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_matching_equals_a_brute_force_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_rows, n_targets = int(rng.integers(1, 25)), int(rng.integers(1, 15))
    ages = rng.choice(AGES, size=n_rows)
    colors = rng.choice(COLORS, size=n_rows)

    def age_label(a: str) -> str:
        kind = rng.integers(0, 4)
        if kind == 0:
            return a
        if kind == 1:
            return str(AGE_H.generalize(AGE_H.encode([a]), 1)[0])
        if kind == 2:
            lo = int(a) - int(rng.integers(0, 3))
            return f"[{lo}, {int(a) + int(rng.integers(0, 3))}]"
        return "*"

    def color_label(c: str) -> str:
        level = int(rng.integers(0, 3))
        return str(COLOR_H.generalize(COLOR_H.encode([c]), level)[0])

    published = pd.DataFrame(
        {
            "age": [age_label(a) for a in ages],
            "color": [color_label(c) for c in colors],
            "sa": rng.choice(["x", "y", "z"], size=n_rows),
        }
    )
    published.loc[rng.random(n_rows) < 0.15, ["age", "color"]] = "*"  # suppressed rows
    tg = pd.DataFrame(
        {
            "age": rng.choice(AGES, size=n_targets).astype(int),  # numbers, not strings
            "color": rng.choice(COLORS, size=n_targets),
        }
    )
    hierarchies = {"age": AGE_H, "color": COLOR_H}
    view = match_targets(published, tg, ["age", "color"], "sa", hierarchies)
    hidden = (published[["age", "color"]] == "*").all(axis=1).to_numpy().copy()
    if hidden.all():
        hidden[:] = False  # only "*" rows: one class of everyone
    for i, target in enumerate(tg.itertuples(index=False)):
        expected = {v: 0 for v in view.sa_values.tolist()}
        for row, gone in zip(published.itertuples(index=False), hidden, strict=True):
            if (
                not gone
                and covers(row.age, str(target.age), AGE_H)
                and covers(row.color, target.color, COLOR_H)
            ):
                expected[row.sa] += 1
        if not any(expected.values()):  # no kept class: the target is in the '*' block
            for row, gone in zip(published.itertuples(index=False), hidden, strict=True):
                expected[row.sa] += int(gone)
        got = dict(
            zip(view.sa_values.tolist(), view.counts[view.target_tuple[i]].tolist(), strict=True)
        )
        assert got == expected
    # the table's distinct rows with their multiplicities give the same view as its rows
    summary = frequency_table(published, ["age", "color", "sa"])
    assert summary[WEIGHT].sum() == n_rows and len(summary) <= n_rows
    same = match_targets(summary.sample(frac=1.0, random_state=seed % 97), tg, ["age", "color"],
                         "sa", hierarchies)  # fmt: skip
    assert same.sa_values.tolist() == view.sa_values.tolist()
    assert np.array_equal(same.counts[same.target_tuple], view.counts[view.target_tuple])
    assert np.array_equal(same.classes[same.target_tuple], view.classes[view.target_tuple])
    assert np.array_equal(np.sort(same.class_counts, axis=0), np.sort(view.class_counts, axis=0))
    assert (same.published_rows, same.suppressed_rows, same.block_targets) == (
        view.published_rows, view.suppressed_rows, view.block_targets,
    )  # fmt: skip
    assert np.allclose(same.overall, view.overall)
