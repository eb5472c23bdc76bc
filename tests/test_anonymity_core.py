"""Pure anonymisation core on textbook tables, hand-computed metrics and the contracts.

Tables:
- Machanavajjhala et al., "l-Diversity: Privacy Beyond k-Anonymity" (ICDE 2006 / TKDD
  2007), Figures 1-3: the inpatient microdata (zip, age, nationality, condition), its
  4-anonymous and its 3-diverse publication.
- Li, Li & Venkatasubramanian, "t-Closeness: Privacy Beyond k-Anonymity and l-Diversity"
  (ICDE 2007): the 3-anonymous patient table (Bob: zip 47678, age 27; Tables 1-2) and
  the salary/disease table (Tables 3-5) with its published EMD values.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import Hierarchy, build_grouping
from privpipe.anonymity.lattice import Lattice
from privpipe.anonymity.metrics import (
    all_metrics,
    average_class_size,
    discernibility,
    get_metric,
    input_metrics,
    kl_divergence,
    loss,
    non_uniform_entropy,
    precision,
)
from privpipe.anonymity.models import (
    DistinctLDiversity,
    EntropyLDiversity,
    KAnonymity,
    RecursiveCLDiversity,
    TCloseness,
    _recursive_by_sorting,
    assess,
    class_distinct,
    class_entropy,
    max_suppressed,
    recursive_cl_holds,
    t_distance,
)
from privpipe.anonymity.risk import journalist, marketer, prosecutor, risk_profile
from privpipe.anonymity.search import heuristic, optimal, search
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import Evaluator
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal

# --------------------------------------------------------------------------- helpers


def flat(attribute: str, values: Sequence[str]) -> Hierarchy:
    """A two-level hierarchy: each value, then ``*``."""
    return build_grouping(attribute, [dict.fromkeys(values, "*")])


def published(
    rows: Sequence[Sequence[str]], qis: Sequence[str], sa: str, **sa_kwargs: object
) -> tuple[Evaluator, pd.DataFrame]:
    """Evaluator at level 0 of an already generalised (published) table."""
    df = pd.DataFrame(rows, columns=[*qis, sa])
    hierarchies = {q: flat(q, list(dict.fromkeys(df[q]))) for q in qis}
    summary = Summary.from_frame(df, qis, sa, hierarchies, **sa_kwargs)  # type: ignore[arg-type]
    return Evaluator(summary, hierarchies), df


def by_class(ev: Evaluator, values: np.ndarray) -> dict[tuple[str, ...], object]:
    """Per-class statistic keyed by the class's generalised QI values."""
    classes = ev.classes((0,) * len(ev.qi_names))
    frame = classes.label_frame()
    keys = [tuple(row) for row in frame[list(ev.qi_names)].itertuples(index=False)]
    return dict(zip(keys, values.tolist(), strict=True))


# --------------------------------------------------------------------------- l-diversity paper

QIS_L = ["zip", "age", "nationality"]
# Figure 2: 4-anonymous inpatient microdata
FIG2 = [
    ("130**", "<30", "*", "Heart Disease"),
    ("130**", "<30", "*", "Heart Disease"),
    ("130**", "<30", "*", "Viral Infection"),
    ("130**", "<30", "*", "Viral Infection"),
    ("1485*", ">=40", "*", "Cancer"),
    ("1485*", ">=40", "*", "Heart Disease"),
    ("1485*", ">=40", "*", "Viral Infection"),
    ("1485*", ">=40", "*", "Viral Infection"),
    ("130**", "3*", "*", "Cancer"),
    ("130**", "3*", "*", "Cancer"),
    ("130**", "3*", "*", "Cancer"),
    ("130**", "3*", "*", "Cancer"),
]
# Figure 3: 3-diverse inpatient microdata
FIG3 = [
    ("1305*", "<=40", "*", "Heart Disease"),
    ("1305*", "<=40", "*", "Viral Infection"),
    ("1305*", "<=40", "*", "Cancer"),
    ("1305*", "<=40", "*", "Cancer"),
    ("1485*", ">40", "*", "Cancer"),
    ("1485*", ">40", "*", "Heart Disease"),
    ("1485*", ">40", "*", "Viral Infection"),
    ("1485*", ">40", "*", "Viral Infection"),
    ("1306*", "<=40", "*", "Heart Disease"),
    ("1306*", "<=40", "*", "Viral Infection"),
    ("1306*", "<=40", "*", "Cancer"),
    ("1306*", "<=40", "*", "Cancer"),
]


def test_l_diversity_paper_4_anonymous_table_is_not_2_diverse() -> None:
    ev, _ = published(FIG2, QIS_L, "condition")
    classes = ev.classes((0, 0, 0))
    assert sorted(classes.sizes.tolist()) == [4, 4, 4]
    distinct = by_class(ev, class_distinct(classes))
    assert distinct == {
        ("130**", "<30", "*"): 2,
        ("1485*", ">=40", "*"): 3,
        ("130**", "3*", "*"): 1,
    }
    assert assess(classes, KAnonymity(4)).satisfied
    result = assess(classes, [KAnonymity(4), DistinctLDiversity(2)])
    assert not result.satisfied
    assert result.suppressed_records == 4  # the all-cancer class: homogeneity attack
    assert result.violations == {"k=4": 0, "l=2 (distinct)": 4}


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from("ab"), st.sampled_from("xyz"), st.sampled_from("pqrstu")),
        min_size=1,
        max_size=60,
    ),
    c=st.sampled_from([0.5, 1.0, 2.0, 3.5]),
    l=st.integers(1, 5),
)
def test_recursive_cl_diversity_is_each_class_s_sorted_counts(
    rows: list[tuple[str, str, str]],
    c: float,
    l: int,  # noqa: E741
) -> None:
    """r1 < c (r_l + ... + r_m) per class, from each class's SA counts sorted by hand; the
    same from the counts sorted per class (``_recursive_by_sorting``), ties and classes
    with fewer than l values included."""
    ev, df = published(rows, ["q0", "q1"], "s")
    classes = ev.classes((0, 0))
    got = recursive_cl_holds(classes, c=c, l=l)
    np.testing.assert_array_equal(got, _recursive_by_sorting(classes, c=c, l=l))
    want = []
    for cls in range(classes.n_classes):
        counts = sorted(classes.cell_count[classes.cell_class == cls].tolist(), reverse=True)
        want.append(counts[0] < c * sum(counts[l - 1 :]))
    assert got.tolist() == want
    assert int(classes.cell_count.sum()) == len(df)


def test_l_diversity_paper_3_diverse_table_entropy_and_recursive() -> None:
    ev, _ = published(FIG3, QIS_L, "condition")
    classes = ev.classes((0, 0, 0))
    assert classes.sizes.tolist() == [4, 4, 4]
    assert class_distinct(classes).tolist() == [3, 3, 3]
    # each class has counts (2, 1, 1): entropy = -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1.5 ln 2
    np.testing.assert_allclose(class_entropy(classes), [1.5 * math.log(2)] * 3, rtol=1e-12)
    # entropy l-diversity holds up to l = 2^1.5 = 2.83
    assert assess(classes, EntropyLDiversity(2**1.5)).satisfied  # equality is allowed
    assert assess(classes, EntropyLDiversity(2.8)).satisfied
    assert not assess(classes, EntropyLDiversity(2.9)).satisfied
    assert not assess(classes, EntropyLDiversity(3)).satisfied
    # recursive (c, l): r = (2, 1, 1)
    assert recursive_cl_holds(classes, c=2, l=2).all()  # 2 < 2 * (1 + 1)
    assert not recursive_cl_holds(classes, c=1, l=2).any()  # 2 < 1 * 2 is false
    assert recursive_cl_holds(classes, c=3, l=3).all()  # 2 < 3 * 1
    assert not recursive_cl_holds(classes, c=2, l=3).any()  # 2 < 2 * 1 is false
    assert not recursive_cl_holds(classes, c=100, l=4).any()  # only 3 distinct values
    assert assess(classes, [KAnonymity(4), DistinctLDiversity(3), RecursiveCLDiversity(3, 3)])
    assert assess(classes, RecursiveCLDiversity(3, 3)).satisfied
    assert not assess(classes, RecursiveCLDiversity(2, 3)).satisfied


# --------------------------------------------------------------------------- t-closeness paper

QIS_T = ["zip", "age"]
# Table 2: a 3-anonymous version of the patient table (Bob: 47678, 27 -> first class)
TABLE2 = [
    ("476**", "2*", "Heart Disease"),
    ("476**", "2*", "Heart Disease"),
    ("476**", "2*", "Heart Disease"),
    ("4790*", ">=40", "Flu"),
    ("4790*", ">=40", "Heart Disease"),
    ("4790*", ">=40", "Cancer"),
    ("476**", "3*", "Heart Disease"),
    ("476**", "3*", "Cancer"),
    ("476**", "3*", "Cancer"),
]
SALARIES = [f"{k}K" for k in range(3, 12)]
# Table 4: the 3-diverse salary/disease table; Table 5: its 0.167-close version
TABLE4 = [
    ("476**", "2*", "3K", "gastric ulcer"),
    ("476**", "2*", "4K", "gastritis"),
    ("476**", "2*", "5K", "stomach cancer"),
    ("4790*", ">=40", "6K", "gastritis"),
    ("4790*", ">=40", "11K", "flu"),
    ("4790*", ">=40", "8K", "bronchitis"),
    ("476**", "3*", "7K", "bronchitis"),
    ("476**", "3*", "9K", "pneumonia"),
    ("476**", "3*", "10K", "stomach cancer"),
]
TABLE5 = [
    ("4767*", "<=40", "3K", "gastric ulcer"),
    ("4767*", "<=40", "5K", "stomach cancer"),
    ("4767*", "<=40", "9K", "pneumonia"),
    ("4790*", ">=40", "6K", "gastritis"),
    ("4790*", ">=40", "11K", "flu"),
    ("4790*", ">=40", "8K", "bronchitis"),
    ("4760*", "<=40", "4K", "gastritis"),
    ("4760*", "<=40", "7K", "bronchitis"),
    ("4760*", "<=40", "10K", "stomach cancer"),
]


def disease_hierarchy() -> Hierarchy:
    """Figure 1 of the t-closeness paper (height 3)."""
    leaves = {
        "flu": "respiratory infection",
        "pneumonia": "respiratory infection",
        "bronchitis": "respiratory infection",
        "pulmonary edema": "vascular lung diseases",
        "pulmonary embolism": "vascular lung diseases",
        "gastric ulcer": "stomach diseases",
        "gastritis": "stomach diseases",
        "stomach cancer": "stomach diseases",
        "colitis": "colon diseases",
        "colon cancer": "colon diseases",
    }
    systems = {
        "respiratory infection": "respiratory system diseases",
        "vascular lung diseases": "respiratory system diseases",
        "stomach diseases": "digestive system diseases",
        "colon diseases": "digestive system diseases",
    }
    top = {"respiratory system diseases": "*", "digestive system diseases": "*"}
    return build_grouping("disease", [leaves, systems, top])


def test_t_closeness_paper_3_anonymous_patient_table() -> None:
    ev, _ = published(TABLE2, QIS_T, "disease")
    classes = ev.classes((0, 0))
    assert sorted(classes.sizes.tolist()) == [3, 3, 3]
    distinct = by_class(ev, class_distinct(classes))
    assert distinct == {("476**", "2*"): 1, ("4790*", ">=40"): 3, ("476**", "3*"): 2}
    # Bob's class is homogeneous: 3-anonymous, not 2-diverse
    assert assess(classes, KAnonymity(3)).satisfied
    assert assess(classes, [KAnonymity(3), DistinctLDiversity(2)]).suppressed_records == 3
    # equal-distance closeness of Bob's class: p(heart) = 5/9, q = 1 -> 1/2 (4/9 + 2/9 + 2/9)
    distances = by_class(ev, t_distance(classes, "equal"))
    assert distances[("476**", "2*")] == pytest.approx(4 / 9, rel=1e-12)


def salary_evaluator(rows: Sequence[Sequence[str]]) -> Evaluator:
    ev, _ = published([(z, a, s) for z, a, s, _ in rows], QIS_T, "salary", sa_order=SALARIES)
    return ev


def test_t_closeness_paper_ordered_distances_match_the_published_values() -> None:
    ev = salary_evaluator(TABLE4)
    distances = by_class(ev, t_distance(ev.classes((0, 0)), "ordered"))
    # published: 0.375 for {3K, 4K, 5K} and 0.167 for {6K, 8K, 11K}
    assert distances[("476**", "2*")] == pytest.approx(0.375, abs=5e-4)
    assert distances[("4790*", ">=40")] == pytest.approx(0.167, abs=5e-4)
    assert distances[("476**", "2*")] == pytest.approx(27 / 72, rel=1e-12)
    assert distances[("4790*", ">=40")] == pytest.approx(12 / 72, rel=1e-12)
    assert distances[("476**", "3*")] == pytest.approx(17 / 72, rel=1e-12)
    # Table 5 is 0.167-close on salary (its worst class is {6K, 8K, 11K})
    ev5 = salary_evaluator(TABLE5)
    worst = t_distance(ev5.classes((0, 0)), "ordered").max()
    assert worst == pytest.approx(1 / 6, rel=1e-12)
    assert assess(ev5.classes((0, 0)), TCloseness(1 / 6, "ordered")).satisfied
    assert not assess(ev.classes((0, 0)), TCloseness(1 / 6, "ordered")).satisfied


def reference_hierarchical_emd(
    q: Mapping[str, float], p: Mapping[str, float], h: Hierarchy
) -> float:
    """REFERENCE.md's formula, node by node: extra(leaf) = q - p propagated up the
    hierarchy; cost(N) = height(N)/H * min(pos_extra(N), neg_extra(N)); summed."""
    table = h.table.tolist()
    extra = {row[0]: q.get(row[0], 0.0) - p.get(row[0], 0.0) for row in table}
    total = 0.0
    for level in range(1, h.levels):
        children: dict[str, dict[str, float]] = {}
        for row in table:
            children.setdefault(row[level], {})[row[level - 1]] = extra[row[level - 1]]
        extra = {}
        for parent, kids in children.items():
            pos = sum(e for e in kids.values() if e > 0)
            neg = -sum(e for e in kids.values() if e < 0)
            total += level / h.height * min(pos, neg)
            extra[parent] = sum(kids.values())
    return total


def tree_emd(q: Mapping[str, float], p: Mapping[str, float], h: Hierarchy) -> float:
    """EMD on the tree metric height(LCA)/H: every edge (1/(2H)) carries |mass imbalance|."""
    total = 0.0
    for level in range(h.height):
        mass: dict[str, float] = {}
        for row in h.table:
            v = row[0]
            mass[row[level]] = mass.get(row[level], 0.0) + q.get(v, 0.0) - p.get(v, 0.0)
        total += sum(abs(m) for m in mass.values()) / (2 * h.height)
    return total


def test_t_closeness_paper_hierarchical_distances() -> None:
    hierarchy = disease_hierarchy()
    rows = [(z, a, d) for z, a, _, d in TABLE4]
    ev, df = published(rows, QIS_T, "disease", sa_hierarchy=hierarchy)
    classes = ev.classes((0, 0))
    distances = by_class(ev, t_distance(classes, "hierarchical", hierarchy))
    p = (df["disease"].value_counts() / len(df)).to_dict()
    for key, (_, group) in zip(
        [("476**", "2*"), ("4790*", ">=40"), ("476**", "3*")],
        df.groupby(["zip", "age"], sort=False),
        strict=True,
    ):
        q = (group["disease"].value_counts() / len(group)).to_dict()
        assert distances[key] == pytest.approx(reference_hierarchical_emd(q, p, hierarchy))
        assert distances[key] == pytest.approx(tree_emd(q, p, hierarchy))
    # The paper prints 0.5 for {gastric ulcer, gastritis, stomach cancer}; the exact EMD is
    # 4/9 = 0.444: 4/9 of the mass must move from stomach to respiratory diseases at
    # distance 1, and nothing cheaper exists. (Every EMD on this 9-record table is a
    # multiple of 1/27, which 0.5 is not.) Likewise 0.278 printed for {gastric ulcer,
    # stomach cancer, pneumonia} (Table 5) is exactly 7/27 = 0.259.
    assert distances[("476**", "2*")] == pytest.approx(4 / 9, rel=1e-12)
    ev5, _ = published(
        [(z, a, d) for z, a, _, d in TABLE5], QIS_T, "disease", sa_hierarchy=hierarchy
    )
    d5 = by_class(ev5, t_distance(ev5.classes((0, 0)), "hierarchical", hierarchy))
    assert d5[("4767*", "<=40")] == pytest.approx(7 / 27, rel=1e-12)
    # a flat hierarchy (height 1) gives the equal distance
    flat_disease = flat("disease", list(hierarchy.values))
    ev_flat, _ = published(rows, QIS_T, "disease", sa_hierarchy=flat_disease)
    np.testing.assert_allclose(
        t_distance(ev_flat.classes((0, 0)), "hierarchical", flat_disease),
        t_distance(ev_flat.classes((0, 0)), "equal"),
        rtol=1e-12,
    )


def test_hierarchical_t_closeness_needs_the_matching_hierarchy() -> None:
    hierarchy = disease_hierarchy()
    ev, _ = published(
        [(z, a, d) for z, a, _, d in TABLE4], QIS_T, "disease", sa_hierarchy=hierarchy
    )
    other = flat("disease", list(hierarchy.values)[::-1])  # same values, other codes
    with pytest.raises(ConfigError, match="does not match"):
        TCloseness(0.3, "hierarchical", other).validate(ev)
    with pytest.raises(ConfigError, match="needs the hierarchy"):
        TCloseness(0.3, "hierarchical")


# --------------------------------------------------------------------------- tiny table metrics


def tiny() -> tuple[Summary, dict[str, Hierarchy]]:
    """A: a1,a2 -> a12; a3,a4 -> a34; -> * (4 raw values). B: b1, b2 -> * (2 raw values)."""
    a = build_grouping("A", [{"a1": "a12", "a2": "a12", "a3": "a34", "a4": "a34"}])
    b = flat("B", ["b1", "b2"])
    df = pd.DataFrame(
        {
            "A": ["a1", "a1", "a2", "a3", "a3", "a4"],
            "B": ["b1", "b1", "b2", "b1", "b1", "b2"],
            "S": ["x", "y", "x", "x", "y", "y"],
        }
    )
    hierarchies = {"A": a, "B": b}
    return Summary.from_frame(df, ["A", "B"], "S", hierarchies), hierarchies


def test_metrics_of_a_tiny_table_by_hand() -> None:
    summary, hierarchies = tiny()
    ev = Evaluator(summary, hierarchies)
    classes = ev.classes((1, 0))
    assert sorted(classes.sizes.tolist()) == [1, 1, 2, 2]
    # no suppression
    result = loss(classes)
    assert result.per_attribute == pytest.approx({"A": 1 / 3, "B": 0.0})
    assert result.value == pytest.approx(math.sqrt(4 / 3) - 1)
    assert result.arithmetic == pytest.approx(1 / 6)
    assert discernibility(classes) == 10
    assert average_class_size(classes) == 1.5
    assert precision(classes) == pytest.approx(0.25)
    entropy = 4 * math.log2(3 / 2) + 2 * math.log2(3)
    assert non_uniform_entropy(classes) == pytest.approx(entropy)
    assert kl_divergence(classes) == pytest.approx(1.0)
    # k=2 suppresses the two singletons (a12, b2) and (a34, b2)
    outcome = assess(classes, KAnonymity(2), suppression_limit=2 / 6 + 0.01)
    assert outcome.satisfied and outcome.suppressed_records == 2
    mask = outcome.suppressed
    result = loss(classes, mask)
    assert result.per_attribute == pytest.approx({"A": 5 / 9, "B": 1 / 3})
    assert result.value == pytest.approx(math.sqrt(56 / 27) - 1)
    assert result.arithmetic == pytest.approx(4 / 9)
    assert discernibility(classes, mask) == 4 + 4 + 6 * 2
    assert average_class_size(classes, mask) == 2.0
    assert precision(classes, mask) == pytest.approx(0.5)
    assert non_uniform_entropy(classes, mask) == pytest.approx(entropy + 2.0)
    assert kl_divergence(classes, mask) == pytest.approx(4 / 3)
    metrics = all_metrics(classes, mask).as_dict()
    assert metrics["suppressed_records"] == 2
    assert metrics["discernibility"] == 20
    # the input table: every loss is 0 (discernibility and AECS of the raw classes)
    raw = input_metrics(ev)
    assert raw.loss.value == 0 and raw.precision == 0
    assert raw.non_uniform_entropy == 0 and raw.kl_divergence == pytest.approx(0, abs=1e-12)
    assert raw.discernibility == 4 + 1 + 4 + 1 and raw.average_class_size == 1.5
    # the most general node: Loss 1, precision 1
    top = ev.classes((2, 1))
    assert loss(top).value == pytest.approx(1.0) and precision(top) == 1.0
    assert get_metric("Loss").name == "loss"
    with pytest.raises(ConfigError, match="unknown metric"):
        get_metric("utility")


def test_risk_of_a_tiny_table() -> None:
    summary, hierarchies = tiny()
    ev = Evaluator(summary, hierarchies)
    classes = ev.classes((1, 0))
    risk = risk_profile(classes)
    assert risk.prosecutor.average == pytest.approx(4 / 6)  # #classes / |D|
    assert risk.prosecutor.highest == 1.0
    assert risk.prosecutor.records_at_risk == 1.0
    assert risk.prosecutor.uniques == pytest.approx(2 / 6)
    # without a population, journalist risk is prosecutor risk
    same = {**risk.prosecutor.as_dict(), "model": "journalist"}
    assert risk.journalist.as_dict() == same
    assert prosecutor(classes.sizes) == risk.prosecutor
    assert risk.marketer == pytest.approx(4 / 6)
    mask = assess(classes, KAnonymity(2), 0.5).suppressed
    kept = risk_profile(classes, mask)
    assert kept.prosecutor.average == 0.5 and kept.prosecutor.highest == 0.5
    assert kept.prosecutor.uniques == 0 and kept.suppressed_records == 2
    both = risk_profile(classes, mask, include_suppressed=True)
    assert both.prosecutor.classes == 3 and both.prosecutor.average == pytest.approx(3 / 6)
    # a population twice the table: journalist risk halves
    population = Summary.merge([summary, summary])
    pop = risk_profile(classes, population=population)
    assert pop.journalist.highest == 0.5 and pop.journalist.uniques == 0
    # record risks 1/4 (4 records in pairs) and 1/2 (2 singletons): (4/4 + 2/2) / 6
    assert pop.journalist.average == pytest.approx(1 / 3)
    assert pop.marketer == pytest.approx(1 / 3)
    assert journalist([2, 1], [4, 2]).average == pytest.approx(1 / 3)
    assert marketer([2, 1]) == pytest.approx(2 / 3)
    with pytest.raises(InputDataError, match="population"):
        journalist([2, 3], [2, 2])


# --------------------------------------------------------------------------- suppression


def test_suppression_limit_is_floor_of_limit_times_records() -> None:
    assert max_suppressed(0.05, 30162) == 1508
    assert max_suppressed(0.1, 30) == 3
    assert max_suppressed(0.07, 100) == 7
    assert max_suppressed(0.0, 100) == 0 and max_suppressed(1.0, 9) == 9
    with pytest.raises(ConfigError):
        max_suppressed(1.5, 10)
    summary, hierarchies = tiny()
    classes = Evaluator(summary, hierarchies).classes((1, 0))
    # k=2 needs the 2 singleton records: floor(limit * 6) must reach 2
    assert not assess(classes, KAnonymity(2), 1 / 6).satisfied
    assert not assess(classes, KAnonymity(2), 0.33).satisfied  # floor(1.98) = 1
    outcome = assess(classes, KAnonymity(2), 0.34)  # floor(2.04) = 2
    assert outcome.satisfied and outcome.max_suppressed == 2
    assert outcome.suppressed_share == pytest.approx(1 / 3)
    # the remaining classes satisfy the model
    assert (classes.sizes[outcome.kept] >= 2).all()


def test_search_uses_suppression_when_it_pays() -> None:
    summary, hierarchies = tiny()
    ev = Evaluator(summary, hierarchies)
    strict = optimal(ev, KAnonymity(2))
    assert strict.suppressed_records == 0
    loose = optimal(ev, KAnonymity(2), suppression_limit=0.5)
    assert loose.value <= strict.value
    assert loose.assessment.satisfied


def test_refusal_states_the_suppression_needed() -> None:
    summary, hierarchies = tiny()
    ev = Evaluator(summary, hierarchies)
    with pytest.raises(PrivacyRefusal) as error:
        optimal(ev, KAnonymity(50), suppression_limit=0.05)
    assert error.value.exit_code == 4
    text = str(error.value)
    assert (
        "k=50 needs 100% suppression (6 of 6 records) at the most general node [A=2, B=1]" in text
    )
    assert "the suppression limit is 5% (0 records)" in text
    # a restricted lattice whose most general node still needs some suppression
    lattice = Lattice((0, 0), (1, 0), ("A", "B"))
    with pytest.raises(PrivacyRefusal) as error:
        optimal(ev, KAnonymity(2), suppression_limit=0.05, lattice=lattice)
    text = str(error.value)
    assert (
        "k=2 needs 33.3% suppression (2 of 6 records) at the most general node [A=1, B=0]" in text
    )
    assert "the suppression limit is 5%" in text
    with pytest.raises(PrivacyRefusal, match="l=3 \\(distinct\\) needs 100% suppression"):
        optimal(ev, [KAnonymity(1), DistinctLDiversity(3)])
    with pytest.raises(PrivacyRefusal, match="most general node"):
        heuristic(ev, KAnonymity(50), time_limit=1.0)


def test_optimal_refuses_lattices_above_a_million_nodes() -> None:
    levels = 11
    chain = np.array([["v"] + [f"v{i}" for i in range(1, levels - 1)] + ["*"]], dtype=object)
    hierarchies = {f"q{j}": Hierarchy(f"q{j}", chain) for j in range(6)}
    summary = Summary.from_codes(list(hierarchies), np.zeros((3, 6), dtype=np.int64))
    ev = Evaluator(summary, hierarchies)
    lattice = ev.lattice()
    assert lattice.size == 11**6 and lattice.too_large()
    with pytest.raises(ConfigError, match="algorithm: heuristic") as error:
        optimal(ev, KAnonymity(2))
    assert error.value.exit_code == 2
    result = search(ev, KAnonymity(2), algorithm="heuristic", time_limit=5.0)
    assert result.transformation == (0,) * 6  # 3 identical records are 2-anonymous
    # Loss 0 at the bottom: the best-first phase proves it optimal without the lattice
    assert result.proven_optimal and result.nodes_checked < 100
    assert result.algorithm == "heuristic"
    with pytest.raises(ConfigError, match="unknown algorithm"):
        search(ev, KAnonymity(2), algorithm="flash")


# --------------------------------------------------------------------------- monotonicity


def five_values(values: Sequence[str], sa: Sequence[str]) -> Evaluator:
    """QI A: a1, a2 -> g12; a3, a4, a5 -> g345; -> *."""
    groups = {"a1": "g12", "a2": "g12", "a3": "g345", "a4": "g345", "a5": "g345"}
    hierarchy = build_grouping("A", [groups])
    df = pd.DataFrame({"A": list(values), "S": list(sa)})
    return Evaluator(Summary.from_frame(df, ["A"], "S", {"A": hierarchy}), {"A": hierarchy})


def test_entropy_l_diversity_is_not_monotone_with_suppression() -> None:
    # a1: xxx, a4: yyy, a5: zzz violate (entropy 0), their block xxxyyyzzz does not;
    # a2, a3: xyz (entropy ln 3); g12 = x4 y z and g345 = x y4 z4 violate; * is x5 y5 z5
    ev = five_values(
        ["a1"] * 3 + ["a2"] * 3 + ["a3"] * 3 + ["a4"] * 3 + ["a5"] * 3,
        list("xxx" + "xyz" + "xyz" + "yyy" + "zzz"),
    )
    model = EntropyLDiversity(3)
    limit = 0.6  # 9 of 15 records
    assert assess(ev.classes((0,)), model, limit).satisfied  # suppress a1, a4, a5
    assert not assess(ev.classes((1,)), model, limit).satisfied  # all 15 would go
    assert assess(ev.classes((2,)), model, limit).satisfied
    assert not EntropyLDiversity.monotone and not RecursiveCLDiversity.monotone
    result = optimal(ev, model, suppression_limit=limit)
    assert result.transformation == (0,)


def test_t_closeness_is_not_monotone_with_suppression() -> None:
    # p(x) = 0.5; a1: xx (0.5), a2: xy (0), a3: xxxyyy (0), a4: yy (0.5); block xxyy (0);
    # g12 = x3 y (0.25), g345 = x3 y5 (0.125)
    ev = five_values(["a1"] * 2 + ["a2"] * 2 + ["a3"] * 6 + ["a4"] * 2, list("xxxyxxxyyyyy"))
    model = TCloseness(0.12)
    np.testing.assert_allclose(t_distance(ev.classes((0,)), "equal"), [0.5, 0, 0, 0.5])
    np.testing.assert_allclose(t_distance(ev.classes((1,)), "equal"), [0.25, 0.125])
    assert assess(ev.classes((0,)), model, 0.34).satisfied
    assert not assess(ev.classes((1,)), model, 0.34).satisfied
    assert assess(ev.classes((2,)), model, 0.34).satisfied
    assert not TCloseness.monotone
    assert KAnonymity.monotone and DistinctLDiversity.monotone
    assert optimal(ev, model, suppression_limit=0.34).transformation == (0,)


# --------------------------------------------------------------------------- summary, lattice


def test_summary_from_frame_and_merge_of_batches() -> None:
    summary, hierarchies = tiny()
    assert summary.n_records == 6 and summary.n_distinct == 6
    assert summary.sa_values is not None and list(summary.sa_values) == ["x", "y"]
    df = summary.to_frame(hierarchies)
    assert df["count"].sum() == 6
    rows = pd.DataFrame(
        {
            "A": ["a1", "a1", "a2", "a3", "a3", "a4", "a1"],
            "B": ["b1", "b1", "b2", "b1", "b1", "b2", "b1"],
            "S": ["z", "y", "x", "x", "y", "y", "z"],
        }
    )
    whole = Summary.from_frame(rows, ["A", "B"], "S", hierarchies)
    parts = [
        Summary.from_frame(rows.iloc[i : i + 3], ["A", "B"], "S", hierarchies) for i in (0, 3, 6)
    ]
    merged = Summary.merge(parts)
    assert merged.sa_values is not None and whole.sa_values is not None
    assert list(merged.sa_values) == list(whole.sa_values) == ["x", "y", "z"]
    np.testing.assert_array_equal(merged.qi_codes, whole.qi_codes)
    np.testing.assert_array_equal(merged.sa_codes, whole.sa_codes)  # type: ignore[arg-type]
    np.testing.assert_array_equal(merged.counts, whole.counts)
    assert whole.without_sa().n_distinct == 4
    assert whole.sa_counts().tolist() == [2, 3, 2]


def test_summary_errors_name_the_column_and_rows() -> None:
    _, hierarchies = tiny()
    rows = pd.DataFrame({"A": ["a1", "a9", "a9"], "B": ["b1", "b1", "b2"], "S": ["x", "y", "x"]})
    with pytest.raises(InputDataError, match=r"column 'A'.*2 rows.*'a9'") as error:
        Summary.from_frame(rows, ["A", "B"], "S", hierarchies)
    assert error.value.exit_code == 3
    missing = pd.DataFrame({"A": ["a1", "a2"], "B": ["b1", "b1"], "S": ["x", None]})
    with pytest.raises(InputDataError, match="column 'S': 1 rows with a missing sensitive"):
        Summary.from_frame(missing, ["A", "B"], "S", hierarchies)
    with pytest.raises(InputDataError, match="not in the data"):
        Summary.from_frame(rows, ["A", "C"], "S", hierarchies)
    with pytest.raises(ConfigError, match="no hierarchy"):
        Summary.from_frame(rows, ["A", "B"], "S", {"A": hierarchies["A"]})
    with pytest.raises(ConfigError, match="both a quasi-identifier"):
        Summary.from_frame(rows, ["A", "B"], "B", hierarchies)


def test_sensitive_values_sort_numerically_or_follow_a_given_order() -> None:
    _, hierarchies = tiny()
    rows = pd.DataFrame({"A": ["a1"] * 3, "B": ["b1"] * 3, "S": [10, 9, 100]})
    summary = Summary.from_frame(rows, ["A", "B"], "S", hierarchies)
    assert summary.sa_values is not None and list(summary.sa_values) == ["9", "10", "100"]
    ordered = Summary.from_frame(rows, ["A", "B"], "S", hierarchies, sa_order=[100, 10, 9, 1])
    assert ordered.sa_domain == 4 and ordered.sa_codes is not None
    assert sorted(ordered.sa_codes.tolist()) == [0, 1, 2]
    with pytest.raises(InputDataError, match="not in its given order"):
        Summary.from_frame(rows, ["A", "B"], "S", hierarchies, sa_order=[9, 10])


def test_lattice_order_and_neighbours() -> None:
    lattice = Lattice((0, 0, 1), (2, 1, 2), ("a", "b", "c"))
    assert lattice.size == 12 and lattice.height == 4
    nodes = [tuple(row) for row in lattice.nodes().tolist()]
    assert nodes[0] == (0, 0, 1) and nodes[-1] == (2, 1, 2)
    assert nodes == sorted(nodes, key=lambda n: (sum(n), n))
    assert lattice.successors((0, 0, 1)) == [(1, 0, 1), (0, 1, 1), (0, 0, 2)]
    assert lattice.predecessors((2, 1, 2)) == [(1, 1, 2), (2, 0, 2), (2, 1, 1)]
    assert lattice.predecessors((0, 0, 1)) == []
    assert Lattice.generalizes((1, 1, 2), (0, 1, 1)) and not Lattice.generalizes(
        (0, 1, 1), (1, 0, 1)
    )
    assert lattice.index((0, 0, 1)) == 0 and lattice.index((2, 1, 2)) == 11
    assert not lattice.too_large() and Lattice((0,) * 7, (7,) * 7).too_large()
    with pytest.raises(ValueError, match="not a node"):
        lattice.successors((3, 0, 1))
    with pytest.raises(ConfigError):
        Lattice((2,), (1,))


def test_rollup_equals_direct_evaluation_and_unpacked_mode() -> None:
    summary, hierarchies = tiny()
    packed = Evaluator(summary, hierarchies)
    plain = Evaluator(summary, hierarchies, packed=False)
    assert packed.packed and not plain.packed
    for node in packed.lattice():
        direct = packed.classes(node)
        other = plain.classes(node)
        np.testing.assert_array_equal(direct.sizes, other.sizes)
        np.testing.assert_array_equal(direct.labels, other.labels)
        np.testing.assert_array_equal(direct.cell_count, other.cell_count)
        np.testing.assert_array_equal(direct.row_classes(), other.row_classes())
        some = np.arange(summary.n_distinct)[::-2]  # rows in any order, some of them
        for classes in (direct, other):
            np.testing.assert_array_equal(classes.row_classes(some), classes.row_classes()[some])
            np.testing.assert_array_equal(
                classes.row_classes(some), classes.classify(summary.qi_codes[some])
            )
        if direct._class_keys is not None and direct.n_classes > 1:  # a key in no class
            dropped = copy.copy(direct)
            dropped._class_keys = direct._class_keys[1:]
            assert (dropped.row_classes(np.arange(summary.n_distinct)) == -1).any()
        np.testing.assert_array_equal(direct.lookup(direct.labels), np.arange(direct.n_classes))
        np.testing.assert_array_equal(other.lookup(other.labels), np.arange(other.n_classes))
        for j in range(len(node)):
            if node[j] < packed.heights[j]:
                rolled = packed.rollup(direct, j)
                again = packed.classes(rolled.levels)
                np.testing.assert_array_equal(rolled.sizes, again.sizes)
                np.testing.assert_array_equal(rolled.cell_sa, again.cell_sa)  # type: ignore[arg-type]
                np.testing.assert_array_equal(rolled.labels, again.labels)
    frame = packed.classes((1, 0)).label_frame()
    assert set(frame["A"]) == {"a12", "a34"} and frame["size"].sum() == 6


def test_classify_raw_rows_for_recoding() -> None:
    summary, hierarchies = tiny()
    ev = Evaluator(summary, hierarchies)
    result = optimal(ev, KAnonymity(2), suppression_limit=0.34)
    # Loss 1/3 at the bottom with the two singletons suppressed beats 0.44 at (1, 0)
    assert result.transformation == (0, 0) and result.value == pytest.approx(1 / 3)
    classes = result.classes
    batch = pd.DataFrame({"A": ["a2", "a1", "a4", "a3"], "B": ["b2", "b1", "b2", "b2"]})
    codes = np.stack([hierarchies[q].encode(batch[q]) for q in ("A", "B")], axis=1)
    index = classes.classify(codes)
    assert index[-1] == -1  # (a3, b2) is not an equivalence class of the data
    known = index[:3]
    assert (known >= 0).all()
    frame = classes.label_frame().iloc[known]
    assert frame[["A", "B"]].to_numpy().tolist() == [["a2", "b2"], ["a1", "b1"], ["a4", "b2"]]
    # the singletons (a2, b2) and (a4, b2) are suppressed, (a1, b1) is kept
    assert result.assessment.suppressed[known].tolist() == [True, False, True]


def test_evaluator_refuses_a_summary_of_other_hierarchies() -> None:
    summary, hierarchies = tiny()
    other = {"A": flat("A", ["a1", "a2", "a3"]), "B": hierarchies["B"]}
    with pytest.raises(ConfigError, match="another hierarchy"):
        Evaluator(summary, other)
    with pytest.raises(InputDataError, match="no records"):
        Evaluator(Summary.from_codes(["A", "B"], np.zeros((0, 2), np.int64)), hierarchies)
