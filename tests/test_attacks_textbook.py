"""Attacks on the textbook tables, matching rules, and the result type.

Tables (reconstructed from the papers):
- Li, Li & Venkatasubramanian 2007 (t-closeness), Table 1/2: 9 patients, 3-anonymous
  (476** 2* / 4790* >=40 / 476** 3*). Bob (47678, 27) is disclosed Heart Disease by
  homogeneity; Carl (47673, 36) is disclosed Cancer once Heart Disease is ruled out.
- Machanavajjhala et al. 2006 (l-diversity), Figures 1/2: 12 patients, 4-anonymous
  (130** <30 / 1485* >=40 / 130** 3*, nationality *). Bob (13053, 31) has Cancer by
  homogeneity; Umeko (13068, 21, Japanese) has Viral Infection once Heart Disease is
  ruled out.
- Li et al. 2007, Tables 3/4 (3-diverse, salary + disease): Bob's salary lies in [3K, 5K]
  and his disease is a stomach disease (similarity attack); Table 5 (0.167/0.278-close)
  defeats the similarity attack.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks import (
    AttackerKnowledge,
    AttackResult,
    attack_table,
    audit_attacks,
    background_knowledge,
    baseline_table,
    candidate_ranges,
    homogeneity,
    linkage,
    match_targets,
    proximity,
    similarity,
    wilson_interval,
)
from privpipe.attacks.matching import coverage

HD, VI, CA, FLU = "Heart Disease", "Viral Infection", "Cancer", "Flu"
CERTAIN = AttackerKnowledge(tau=1.0)  # a disclosure only when the attacker is certain


def zip_hierarchy(zips: list[str]) -> Hierarchy:
    rows = [[z, z[:4] + "*", z[:3] + "**", z[:2] + "***", "*"] for z in sorted(set(zips))]
    return Hierarchy("zip", np.array(rows, dtype=object))


def age_hierarchy() -> Hierarchy:
    def band(a: int) -> str:
        return "<30" if a < 30 else ("30-39" if a < 40 else "≥40")

    rows = [[str(a), f"{a // 10}*", band(a), "*"] for a in range(18, 80)]
    return Hierarchy("age", np.array(rows, dtype=object))


# --------------------------------------------------------------------------- Li 2007, Table 2

LI_RAW = pd.DataFrame(
    {
        "zip": ["47677", "47602", "47678", "47905", "47909", "47906", "47605", "47673", "47607"],
        "age": [29, 22, 27, 43, 52, 47, 30, 36, 32],
        "disease": [HD, HD, HD, FLU, HD, CA, HD, CA, CA],
    }
)
LI_PUBLISHED = pd.DataFrame(
    {
        "zip": ["476**"] * 3 + ["4790*"] * 3 + ["476**"] * 3,
        "age": ["2*"] * 3 + ["≥40"] * 3 + ["3*"] * 3,
        "disease": LI_RAW["disease"],
    }
)
# the hierarchy covers the zip domain, not only the table (47601: a person not in it)
LI_H = {"zip": zip_hierarchy([*LI_RAW["zip"], "47601"]), "age": age_hierarchy()}


def targets(rows: list[tuple[object, ...]], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns)


def test_bob_homogeneity_li() -> None:
    bob = targets([("47678", 27, HD)], ["zip", "age", "disease"])
    view = match_targets(LI_PUBLISHED, bob, ["zip", "age"], "disease", LI_H)
    result = homogeneity(view, CERTAIN)
    assert result.rate == 1.0
    assert result.rates["correct"] == 1.0
    assert view.sa_values[np.argmax(view.counts[0])] == HD


def test_carl_background_knowledge_li() -> None:
    carl = targets([("47673", 36, CA)], ["zip", "age", "disease"])
    view = match_targets(LI_PUBLISHED, carl, ["zip", "age"], "disease", LI_H)
    assert homogeneity(view, CERTAIN).rate == 0.0  # {HD, CA, CA}: not homogeneous
    result = background_knowledge(view, AttackerKnowledge(background=1, tau=1.0))
    assert result.rates["rate_b0"] == 0.0
    assert result.rates["rate_b1"] == 1.0  # heart disease ruled out: Cancer for sure
    assert result.rates["correct_b1"] == 1.0
    assert result.rate == 1.0
    assert result.rates["max_posterior_b0"] == pytest.approx(2 / 3)


def test_carl_random_background_rules_out_a_true_negative() -> None:
    # the domain is {Cancer, Flu, HD}: random b=1 rules out Flu or HD; b=2 rules out both
    carl = targets([("47673", 36, CA)] * 200, ["zip", "age", "disease"])
    view = match_targets(LI_PUBLISHED, carl, ["zip", "age"], "disease", LI_H)
    know = AttackerKnowledge(background=1, background_mode="random", tau=1.0, seed=3)
    result = background_knowledge(view, know)
    assert 0.3 < result.rates["rate_b1"] < 0.7  # HD drawn about half the time
    assert result.rates["rate_b2"] == 1.0
    again = background_knowledge(view, know)
    assert again.rates == result.rates  # seeded


# --------------------------------------------------------------------------- Machanavajjhala 2006

MA_RAW = pd.DataFrame(
    {
        "zip": [
            "13053",
            "13068",
            "13068",
            "13053",
            "14853",
            "14853",
            "14850",
            "14850",
            "13053",
            "13053",
            "13068",
            "13068",
        ],
        "age": [28, 29, 21, 23, 50, 55, 47, 49, 31, 37, 36, 35],
        "nationality": [
            "Russian",
            "American",
            "Japanese",
            "American",
            "Indian",
            "Russian",
            "American",
            "American",
            "American",
            "Indian",
            "Japanese",
            "American",
        ],
        "condition": [HD, HD, VI, VI, CA, HD, VI, VI, CA, CA, CA, CA],
    }
)
MA_PUBLISHED = pd.DataFrame(
    {
        "zip": ["130**"] * 4 + ["1485*"] * 4 + ["130**"] * 4,
        "age": ["<30"] * 4 + ["≥40"] * 4 + ["3*"] * 4,
        "nationality": ["*"] * 12,
        "condition": MA_RAW["condition"],
    }
)
MA_H = {
    "zip": zip_hierarchy(list(MA_RAW["zip"])),
    "age": age_hierarchy(),
    "nationality": Hierarchy(
        "nationality",
        np.array([[n, "*"] for n in ["American", "Indian", "Japanese", "Russian"]], dtype=object),
    ),
}
MA_QIS = ["zip", "age", "nationality"]


def test_bob_and_umeko_machanavajjhala() -> None:
    people = targets(
        [("13053", 31, "American", CA), ("13068", 21, "Japanese", VI)],
        [*MA_QIS, "condition"],
    )
    view = match_targets(MA_PUBLISHED, people, MA_QIS, "condition", MA_H)
    assert view.counts.sum(axis=1).tolist() == [4, 4]
    hom = homogeneity(view, CERTAIN)
    assert hom.rate == 0.5 and hom.rates["correct"] == 0.5  # Bob only
    bk = background_knowledge(view, AttackerKnowledge(background=1, tau=1.0))
    assert bk.rates["rate_b1"] == 1.0  # Umeko: heart disease ruled out -> viral infection
    assert bk.rates["correct_b1"] == 1.0


def test_all_records_of_the_4_anonymous_table() -> None:
    results = attack_table(
        MA_PUBLISHED,
        MA_RAW,
        MA_QIS,
        "condition",
        MA_H,
        CERTAIN,
        attacks=("homogeneity", "linkage"),
        guarantee={"k": 4},
    )
    assert results["homogeneity"].rate == pytest.approx(4 / 12)  # REFERENCE: Σ|E|/|D|
    assert results["linkage"].rates["highest"] == pytest.approx(1 / 4)
    assert results["linkage"].within_bound is True
    baseline = attack_table(
        baseline_table(MA_RAW, MA_QIS, "condition"), MA_RAW, MA_QIS, "condition", MA_H, CERTAIN
    )
    assert baseline["homogeneity"].rate == 1.0  # every raw record is unique
    assert baseline["linkage"].rate == 1.0 and baseline["linkage"].rates["uniques"] == 1.0


# --------------------------------------------------------------------------- Li 2007, Tables 3-5

SALARY_RAW = pd.DataFrame(
    {
        "zip": LI_RAW["zip"],
        "age": LI_RAW["age"],
        "salary": [3000, 4000, 5000, 6000, 11000, 8000, 7000, 9000, 10000],
        "disease": [
            "gastric ulcer",
            "gastritis",
            "stomach cancer",
            "gastritis",
            "flu",
            "bronchitis",
            "bronchitis",
            "pneumonia",
            "stomach cancer",
        ],
    }
)
TABLE4 = pd.DataFrame(
    {
        "zip": ["476**"] * 3 + ["4790*"] * 3 + ["476**"] * 3,
        "age": ["2*"] * 3 + ["≥40"] * 3 + ["3*"] * 3,
        "salary": SALARY_RAW["salary"].astype(str),
        "disease": SALARY_RAW["disease"],
    }
)
ORDER5 = [0, 2, 7, 3, 4, 5, 1, 6, 8]  # Table 5: records 1,3,8 / 4,5,6 / 2,7,9
TABLE5 = pd.DataFrame(
    {
        "zip": ["4767*"] * 3 + ["4790*"] * 3 + ["4760*"] * 3,
        "age": ["<40"] * 3 + ["≥40"] * 3 + ["<40"] * 3,
        "salary": SALARY_RAW["salary"].astype(str).to_numpy()[ORDER5],
        "disease": SALARY_RAW["disease"].to_numpy()[ORDER5],
    }
)
DISEASES = Hierarchy(
    "disease",
    np.array(
        [
            ["gastric ulcer", "stomach diseases", "digestive system diseases", "*"],
            ["gastritis", "stomach diseases", "digestive system diseases", "*"],
            ["stomach cancer", "stomach diseases", "digestive system diseases", "*"],
            ["colitis", "colon diseases", "digestive system diseases", "*"],
            ["flu", "respiratory infection", "respiratory system diseases", "*"],
            ["pneumonia", "respiratory infection", "respiratory system diseases", "*"],
            ["bronchitis", "respiratory infection", "respiratory system diseases", "*"],
        ],
        dtype=object,
    ),
)
AGE_LT40 = Hierarchy(
    "age",
    np.array(
        [[str(a), f"{a // 10}*", "<40" if a < 40 else "≥40", "*"] for a in range(18, 80)],
        dtype=object,
    ),
)


def test_bob_salary_range_and_similarity_table4() -> None:
    bob = targets([("47678", 27, 5000, "stomach cancer")], ["zip", "age", "salary", "disease"])
    salary = match_targets(TABLE4, bob, ["zip", "age"], "salary", LI_H)
    lo, hi = candidate_ranges(salary)
    assert (lo[0], hi[0]) == (3000, 5000)
    assert proximity(salary, width_threshold=0.25).rates["correct"] == 1.0
    disease = match_targets(TABLE4, bob, ["zip", "age"], "disease", LI_H)
    assert homogeneity(disease, CERTAIN).rate == 0.0  # 3 distinct diseases: 3-diverse
    result = similarity(disease, DISEASES, CERTAIN, level=1)
    assert result.rate == 1.0 and result.rates["correct"] == 1.0  # all stomach diseases
    assert similarity(disease, DISEASES, CERTAIN, level=2).rate == 1.0


def test_table5_resists_similarity() -> None:
    h = {"zip": LI_H["zip"], "age": AGE_LT40}
    bob = targets([("47678", 27, 5000, "stomach cancer")], ["zip", "age", "salary", "disease"])
    disease = match_targets(TABLE5, bob, ["zip", "age"], "disease", h)
    assert similarity(disease, DISEASES, CERTAIN, level=1).rate == 0.0
    salary = match_targets(TABLE5, bob, ["zip", "age"], "salary", h)
    lo, hi = candidate_ranges(salary)
    assert (lo[0], hi[0]) == (3000, 9000)
    # every record of Table 5: no class is homogeneous at the category level either
    everyone = match_targets(TABLE5, SALARY_RAW, ["zip", "age"], "disease", h)
    assert similarity(everyone, DISEASES, CERTAIN, level=1).rate == 0.0
    assert similarity(
        match_targets(TABLE4, SALARY_RAW, ["zip", "age"], "disease", LI_H), DISEASES, CERTAIN
    ).rate == pytest.approx(3 / 9)


# --------------------------------------------------------------------------- correctness of guesses


def test_a_homogeneous_class_is_no_correct_disclosure_for_a_non_member() -> None:
    # Dave (47601, 25) has the flu and is not in the table; his class says Heart Disease
    dave = targets([("47601", 25, FLU)], ["zip", "age", "disease"])
    view = match_targets(LI_PUBLISHED, dave, ["zip", "age"], "disease", LI_H)
    result = homogeneity(view, CERTAIN)
    assert result.rate == 1.0
    assert result.rates["correct"] == 0.0
    assert result.rates["correct_tau_disclosure"] == 0.0
    assert result.rates["accuracy"] == 0.0


def test_suppressed_targets_are_matched_to_the_suppressed_block() -> None:
    published = LI_PUBLISHED.copy()
    published.loc[6:8, ["zip", "age"]] = "*"  # the 3* class suppressed
    carl = targets([("47673", 36, CA)], ["zip", "age", "disease"])
    view = match_targets(published, carl, ["zip", "age"], "disease", LI_H)
    assert view.suppressed_rows == 3 and view.published_rows == 6
    # no kept class covers Carl, so he is one of the three '*' rows
    block = published.loc[6:8, "disease"].value_counts()
    got = dict(zip(view.sa_values.tolist(), view.counts[0].tolist(), strict=True))
    assert {k: v for k, v in got.items() if v} == block.to_dict()
    assert view.block_targets == 1
    assert linkage(view).rate == pytest.approx(1 / 3)
    # a homogeneous block discloses the target's value with certainty
    homogeneous = published.copy()
    homogeneous.loc[6:8, "disease"] = CA
    view = match_targets(homogeneous, carl, ["zip", "age"], "disease", LI_H)
    assert homogeneity(view, CERTAIN).rate == 1.0
    # dropped rows publish no SA values: nothing to pool
    dropped = LI_PUBLISHED.iloc[:6]
    view = match_targets(dropped, carl, ["zip", "age"], "disease", LI_H)
    assert view.counts.sum() == 0


def test_row_order_is_not_used() -> None:
    shuffled = LI_PUBLISHED.sample(frac=1.0, random_state=7).reset_index(drop=True)
    a = attack_table(LI_PUBLISHED, LI_RAW, ["zip", "age"], "disease", LI_H)
    b = attack_table(shuffled, LI_RAW, ["zip", "age"], "disease", LI_H)
    assert {k: v.as_dict() for k, v in a.items()} == {k: v.as_dict() for k, v in b.items()}


# --------------------------------------------------------------------------- matching rules


def test_coverage_rules() -> None:
    raw = np.array(["27", "36", "47", "x"], dtype=object)
    labels = np.array(["27", "2*", "*", "[30, 40]", "≥40", "[36, 36]", "nope"], dtype=object)
    rows, cols = coverage(raw, labels, age_hierarchy())
    got = {(raw[r], labels[c]) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)}
    assert got == {
        ("27", "27"), ("27", "2*"), ("27", "*"),
        ("36", "*"), ("36", "[30, 40]"), ("36", "[36, 36]"),
        ("47", "*"), ("47", "≥40"),
        ("x", "*"),
    }  # fmt: skip
    # Mondrian's grid ranges are half-open: [30, 36) holds 30..35, not 36; [36, 40) holds 36
    half = np.array(["[30, 36)", "[36, 40)"], dtype=object)
    rows, cols = coverage(raw, half)
    got = {(raw[r], half[c]) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)}
    assert got == {("36", "[36, 40)")}


def test_mondrian_style_overlapping_classes_are_pooled() -> None:
    published = pd.DataFrame(
        {
            "zip": ["476**", "476**", "4767*", "4767*", "*"],
            "age": ["[20, 35]", "[20, 35]", "[27, 29]", "[27, 29]", "*"],
            "disease": [HD, CA, FLU, FLU, CA],
        }
    )
    who = targets([("47678", 27, FLU), ("47602", 30, CA)], ["zip", "age", "disease"])
    view = match_targets(published, who, ["zip", "age"], "disease", LI_H)
    assert view.classes.tolist() == [2, 1]  # the suppressed row is not a class
    by_value = dict(zip(view.sa_values.tolist(), view.counts[0].tolist(), strict=True))
    assert by_value == {CA: 1, FLU: 2, HD: 1}
    assert linkage(view).rates["highest"] == pytest.approx(1 / 2)


def test_known_attributes_restrict_matching() -> None:
    bob = targets([("47678", 27, HD)], ["zip", "age", "disease"])
    know = AttackerKnowledge(known=("zip",), tau=1.0)
    view = match_targets(LI_PUBLISHED, bob, ["zip", "age"], "disease", LI_H, known=know.known)
    assert view.counts.sum() == 6  # both 476** classes
    assert homogeneity(view, know).rate == 0.0


def test_target_sampling_is_seeded() -> None:
    a = AttackerKnowledge(targets=5, seed=1).target_rows(100)
    b = AttackerKnowledge(targets=5, seed=1).target_rows(100)
    c = AttackerKnowledge(targets=5, seed=2).target_rows(100)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert len(set(a.tolist())) == 5
    assert AttackerKnowledge(targets=500).target_rows(10).tolist() == list(range(10))
    with pytest.raises(ValueError):
        AttackerKnowledge(tau=0.0)
    with pytest.raises(ValueError):
        AttackerKnowledge(background=-1)


# --------------------------------------------------------------------------- stats and results


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(
        0.2775, abs=1e-4
    )
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(5, 100, 0.99)[1] > wilson_interval(5, 100)[1]
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_results_are_json_ready() -> None:
    results = attack_table(
        LI_PUBLISHED,
        LI_RAW,
        ["zip", "age"],
        "disease",
        LI_H,
        attacks=("homogeneity", "background_knowledge", "skewness", "linkage"),
        guarantee={"k": 3, "suppression_limit": 0.0},
    )
    audit = audit_attacks(results.values())
    text = json.dumps(audit, allow_nan=False)
    back = json.loads(text)
    assert set(back) == {"homogeneity", "background_knowledge", "skewness", "linkage"}
    assert back["homogeneity"]["rate"] == pytest.approx(3 / 9)
    assert back["linkage"]["bound"] == pytest.approx(1 / 3)
    for entry in back.values():
        assert {"rate", "targets", "interval", "bound", "details"} <= set(entry)
        assert all(type(v) in (float, int) for k, v in entry.items() if k.startswith("rate"))
    with pytest.raises(ValueError):
        audit_attacks([results["linkage"], results["linkage"]])
    assert isinstance(results["linkage"], AttackResult)


# --------------------------------------------------------------------------- issue 13 fixes


def test_matching_reads_labels_at_the_published_level_only() -> None:
    """A leaf called like another level's group ('X' is a value under 'Y' and the level-1
    group of A and B): at published level 1, a target whose value is 'X' is in class 'Y'
    only, not also in the class labelled 'X' (which is {A, B})."""
    from privpipe.attacks import match_targets

    h = Hierarchy(
        "q",
        np.array(
            [["A", "X", "*"], ["B", "X", "*"], ["X", "Y", "*"], ["C", "Y", "*"]], dtype=object
        ),
    )
    published = pd.DataFrame(
        {"q": ["X", "X", "X", "Y", "Y", "Y"], "sa": ["s1", "s1", "s2", "s3", "s3", "s3"]}
    )
    targets = pd.DataFrame({"q": ["X", "A"], "sa": ["s3", "s1"]})
    view = match_targets(published, targets, ["q"], "sa", {"q": h}, levels={"q": 1})
    assert view.per_target(view.classes).tolist() == [1, 1]
    sizes = view.per_target(view.sizes).tolist()
    assert sizes == [3, 3]
    sa = list(view.sa_values)
    x_counts = view.per_target(view.counts)[0]
    assert x_counts[sa.index("s3")] == 3 and x_counts[sa.index("s1")] == 0
    # without levels (a local recoding) each label is read at its lowest level: 'X' is
    # then the leaf, which is wrong for this full-domain table, hence the levels
    local = match_targets(published, targets, ["q"], "sa", {"q": h})
    assert local.per_target(local.classes).tolist() == [2, 0]
    # coverage itself, by codes at one level
    raw_ids, lab_ids = coverage(
        np.array(["X", "A"], dtype=object), np.array(["X", "Y"], dtype=object), h, 1
    )
    assert sorted(zip(raw_ids.tolist(), lab_ids.tolist(), strict=True)) == [(0, 1), (1, 0)]


def test_reproduced_cells_read_a_full_domain_table_at_its_level() -> None:
    """The same collision in the publication attack's to_level: a table published at
    level 1 whose 'X' means {A, B} is mapped to level 1 as 'X', never as the leaf's 'Y'."""
    from privpipe.attacks.publication import to_level

    h = Hierarchy(
        "q",
        np.array(
            [["A", "X", "*"], ["B", "X", "*"], ["X", "Y", "*"], ["C", "Y", "*"]], dtype=object
        ),
    )
    published = pd.Series(["X", "Y", "*"])
    assert to_level(published, h, 1, source_level=1).tolist()[:2] == ["X", "Y"]
    assert to_level(published, h, 2, source_level=1).tolist()[:2] == ["*", "*"]
    assert pd.isna(to_level(published, h, 0, source_level=1)).all()
    # without the level the leaf wins: the old reading, wrong for this table
    assert to_level(published, h, 1).tolist()[0] == "Y"
