"""The independent verifier says no: every model, the suppression limit and lost records.

Tables are written by hand; expected distances are worked out from REFERENCE.md's
formulas in the comments (and Li et al. 2007's ordered-distance example).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import Hierarchy, load_arx_csv
from privpipe.anonymity.models import TCloseness, assess
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import Evaluator
from privpipe.anonymity.verify import MAX_FAILURES, verify_counts, verify_table

QIS = ("zip", "age")


def table(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["zip", "age", "disease"])


def k_spec(k: int = 3, limit: float = 0.0, suppressed: str = "star") -> AnonymizationSpec:
    return AnonymizationSpec(
        "k_anonymity",
        QIS,
        "disease",
        k=k,
        suppression_limit=limit,
        suppressed=suppressed,  # type: ignore[arg-type]
    )


def share(frame: pd.DataFrame) -> dict[str, float]:
    counts = frame["disease"].value_counts()
    return {str(k): float(v) / len(frame) for k, v in counts.sort_index().items()}


GOOD = table(
    [
        ("476**", "2*", "Flu"),
        ("476**", "2*", "Cancer"),
        ("476**", "2*", "Heart"),
        ("4790*", ">=40", "Flu"),
        ("4790*", ">=40", "Cancer"),
        ("4790*", ">=40", "Cancer"),
    ]
)


def test_a_good_table_passes_and_reports_what_it_checked() -> None:
    result = verify_table(GOOD, k_spec(3), input_records=6, suppressed_records=0)
    assert result.ok, result.failures
    assert (result.classes, result.smallest_class, result.records) == (2, 3, 6)
    assert any(line.startswith("k=3 on 2 classes") for line in result.checked)
    json.dumps(result.as_dict())


def test_a_class_of_k_minus_one_fails_naming_the_class() -> None:
    bad = GOOD.iloc[:5]  # the second class keeps 2 records
    result = verify_table(bad, k_spec(3), input_records=5, suppressed_records=0)
    assert not result.ok
    assert result.failures == ["class [zip=4790*, age=>=40] has 2 records, fewer than k=3"]
    assert result.smallest_class == 2


def test_suppressed_star_rows_are_a_class_and_count_against_the_limit() -> None:
    stars = table([("*", "*", "Flu"), ("*", "*", "Cancer"), ("*", "*", "Flu")])
    starred = pd.concat([GOOD, stars], ignore_index=True)
    ok = verify_table(starred, k_spec(3, limit=0.4), input_records=9, suppressed_records=3)
    assert ok.ok, ok.failures
    assert ok.suppressed_records == 3 and ok.classes == 3
    too_many = verify_table(starred, k_spec(3, limit=0.3), input_records=9, suppressed_records=3)
    assert not too_many.ok
    assert too_many.failures == ["3 records suppressed, more than the limit floor(0.3 x 9) = 2"]


def test_a_suppressed_block_smaller_than_k_fails() -> None:
    # an attacker who finds no kept class for the target knows it is the one '*' row
    starred = pd.concat([GOOD, table([("*", "*", "Flu")])], ignore_index=True)
    bad = verify_table(starred, k_spec(3, limit=0.2), input_records=7, suppressed_records=1)
    assert not bad.ok
    assert bad.failures == ["class [zip=*, age=*] has 1 records, fewer than k=3"]


def test_star_rows_not_matching_the_suppressed_count_fail() -> None:
    result = verify_table(GOOD, k_spec(3, limit=0.5), input_records=8, suppressed_records=2)
    assert not result.ok
    assert any("2 records were suppressed but the table has only 0" in f for f in result.failures)
    assert any("(2 record(s) lost)" in f for f in result.failures)


def test_dropped_records_count_towards_the_input() -> None:
    spec = k_spec(3, limit=0.4, suppressed="drop")
    dropped = pd.DataFrame({"disease": ["Flu", "Cancer", "Flu"]})
    ok = verify_table(GOOD, spec, input_records=9, suppressed_records=3, dropped=dropped)
    assert ok.ok, ok.failures
    assert any("6 published + 3 dropped = 9 input" in line for line in ok.checked)
    # the dropped block is a class too: two dropped records are fewer than k=3
    two = verify_table(GOOD, spec, input_records=8, suppressed_records=2, dropped=dropped.iloc[:2])
    assert not two.ok and two.failures == ["class [zip=*, age=*] has 2 records, fewer than k=3"]
    # a suppressed figure that the dropped block does not bear out is caught (it used to
    # balance: the claimed figure was both added to and taken off the total)
    wrong = verify_table(GOOD, spec, input_records=10, suppressed_records=4, dropped=dropped)
    assert not wrong.ok
    assert "the dropped block holds 3 records, but 4 are claimed suppressed" in wrong.failures
    # without the dropped records' counts the block cannot be checked: fail closed
    blind = verify_table(GOOD, spec, input_records=9, suppressed_records=3)
    assert not blind.ok and "cannot be checked" in blind.failures[0]


def test_a_lost_record_fails() -> None:
    result = verify_table(GOOD, k_spec(3), input_records=7, suppressed_records=0)
    assert not result.ok
    assert result.failures == [
        "the table has 6 records + 0 dropped = 6, but the input had 7 (1 record(s) lost)"
    ]


def test_an_invented_record_fails() -> None:
    result = verify_table(GOOD, k_spec(3), input_records=5, suppressed_records=0)
    assert not result.ok and "1 record(s) more than the input" in result.failures[0]


def test_columns_beyond_the_qis_and_sa_are_never_published() -> None:
    with_id = GOOD.assign(id=range(6))
    result = verify_table(with_id, k_spec(3), input_records=6, suppressed_records=0)
    assert not result.ok
    assert "column(s) ['id'] would be published" in result.failures[0]


def test_failures_are_capped_and_counted() -> None:
    rows = [(f"{i:05d}", "1", "Flu") for i in range(MAX_FAILURES + 4)]
    result = verify_table(table(rows), k_spec(2), input_records=len(rows), suppressed_records=0)
    assert len(result.failures) == MAX_FAILURES + 1
    assert result.failures[-1] == "... and 4 more classes violate k=2"


# --------------------------------------------------------------------------- l-diversity


def l_spec(variant: str, l: float, c: float | None = None) -> AnonymizationSpec:  # noqa: E741
    return AnonymizationSpec(
        "l_diversity",
        QIS,
        "disease",
        l=l,
        variant=variant,  # type: ignore[arg-type]
        c=c,
    )


HOMOGENEOUS = table(
    [
        ("476**", "2*", "Flu"),
        ("476**", "2*", "Cancer"),
        ("4790*", ">=40", "Cancer"),
        ("4790*", ">=40", "Cancer"),
    ]
)


def test_a_homogeneous_class_fails_distinct_l2() -> None:
    result = verify_table(HOMOGENEOUS, l_spec("distinct", 2), input_records=4, suppressed_records=0)
    assert not result.ok
    assert result.failures == [
        "class [zip=4790*, age=>=40] has 1 distinct disease value(s) ('Cancer'), fewer than l=2"
    ]
    assert verify_table(GOOD, l_spec("distinct", 2), input_records=6, suppressed_records=0).ok


def test_entropy_l_diversity() -> None:
    # class 2 of GOOD: Flu 1, Cancer 2 -> entropy = ln 3 - (2/3) ln 2 = 0.6365 < ln 2 = 0.6931
    result = verify_table(GOOD, l_spec("entropy", 2), input_records=6, suppressed_records=0)
    assert not result.ok
    assert result.failures == [
        "class [zip=4790*, age=>=40]: entropy of disease 0.636514 < log(l=2) = 0.693147"
    ]
    even = table([("1", "1", "a"), ("1", "1", "b"), ("1", "1", "c")])
    assert verify_table(even, l_spec("entropy", 3), input_records=3, suppressed_records=0).ok


def test_recursive_cl_diversity() -> None:
    # counts 5, 2, 1: l=2 -> r1=5 < c (2 + 1) needs c > 5/3
    rows = [("1", "1", "a")] * 5 + [("1", "1", "b")] * 2 + [("1", "1", "c")]
    frame = table(rows)
    ok = verify_table(frame, l_spec("recursive", 2, c=2), input_records=8, suppressed_records=0)
    assert ok.ok, ok.failures
    bad = verify_table(frame, l_spec("recursive", 2, c=1.5), input_records=8, suppressed_records=0)
    assert bad.failures == [
        "class [zip=1, age=1]: most frequent disease count r1=5 is not below "
        "c x (r2 + ... + rm) = 1.5 x 3 = 4.5"
    ]
    # l=3: tail is r3 = 1 -> 5 < 4 x 1 fails
    assert not verify_table(
        frame, l_spec("recursive", 3, c=4), input_records=8, suppressed_records=0
    ).ok


# --------------------------------------------------------------------------- t-closeness


def t_spec(t: float, distance: str = "equal") -> AnonymizationSpec:
    return AnonymizationSpec(
        "t_closeness",
        QIS,
        "disease",
        t=t,
        distance=distance,  # type: ignore[arg-type]
    )


def test_equal_distance_above_t_fails() -> None:
    # p: Cancer 1/2, Flu 1/3, Heart 1/6; class 2: Cancer 2/3, Flu 1/3 -> 1/2 (1/6 + 0 + 1/6)
    p = share(GOOD)
    ok = verify_table(
        GOOD, t_spec(0.2), input_records=6, suppressed_records=0, input_sa_distribution=p
    )
    assert ok.ok, ok.failures
    assert ok.distances["largest"] == pytest.approx(1 / 6)
    bad = verify_table(
        GOOD, t_spec(0.15), input_records=6, suppressed_records=0, input_sa_distribution=p
    )
    assert bad.failures == [
        "class [zip=476**, age=2*] (3 records): equal distance of its disease distribution "
        "to the table's is 0.166667 > t=0.15",
        "class [zip=4790*, age=>=40] (3 records): equal distance of its disease distribution "
        "to the table's is 0.166667 > t=0.15",
    ]


def test_t_closeness_without_the_input_distribution_fails_closed() -> None:
    result = verify_table(GOOD, t_spec(0.5), input_records=6, suppressed_records=0)
    assert not result.ok and "without the input SA distribution" in result.failures[0]


def test_a_published_value_absent_from_the_input_fails() -> None:
    p = {"Cancer": 0.5, "Flu": 0.5}
    result = verify_table(
        GOOD, t_spec(1.0), input_records=6, suppressed_records=0, input_sa_distribution=p
    )
    assert not result.ok and "['Heart'] are published but not in the input" in result.failures[0]


def test_ordered_distance_li_et_al_example() -> None:
    # salaries 3k..11k, one record each; class {3k, 4k, 5k}: distance 0.375 (Li et al.)
    salaries = [str(s) for s in range(3, 12)]
    p = {s: 1 / 9 for s in reversed(salaries)}  # key order must not matter: numeric
    rows = [("low", "*", s) for s in salaries[:3]] + [("high", "*", s) for s in salaries[3:]]
    frame = table(rows)
    ok = verify_table(
        frame,
        t_spec(0.375, "ordered"),
        input_records=9,
        suppressed_records=0,
        input_sa_distribution=p,
    )
    assert ok.ok, ok.failures
    assert ok.distances["largest"] == pytest.approx(0.375)
    bad = verify_table(
        frame,
        t_spec(0.37, "ordered"),
        input_records=9,
        suppressed_records=0,
        input_sa_distribution=p,
    )
    assert len(bad.failures) == 1 and "zip=low" in bad.failures[0] and "0.375" in bad.failures[0]


SA_HIERARCHY = Hierarchy(
    "disease",
    np.array(
        [["a", "X", "*"], ["b", "X", "*"], ["c", "Y", "*"], ["d", "Y", "*"]],
        dtype=object,
    ),
)


def test_hierarchical_distance_by_hand() -> None:
    # p uniform over a, b, c, d; class {a, a}: extra a +3/4, b, c, d -1/4.
    # X: min(3/4, 1/4) x 1/2 = 1/8; Y: 0; root: min(1/2, 1/2) x 1 = 1/2 -> 5/8.
    # Equal distance 3/4, ordered (a<b<c<d) (3/4 + 1/2 + 1/4) / 3 = 1/2.
    frame = table([("1", "1", "a"), ("1", "1", "a"), ("2", "2", "b"), ("2", "2", "c")])
    frame = pd.concat([frame, table([("2", "2", "d"), ("2", "2", "b")])], ignore_index=True)
    p = {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}
    expected = {"hierarchical": 5 / 8, "equal": 3 / 4, "ordered": 1 / 2}
    for distance, value in expected.items():
        common = {
            "input_records": 6,
            "suppressed_records": 0,
            "input_sa_distribution": p,
            "sa_hierarchy": SA_HIERARCHY,
        }
        bad = verify_table(frame, t_spec(value - 0.01, distance), **common)  # type: ignore[arg-type]
        ok = verify_table(frame, t_spec(value, distance), **common)  # type: ignore[arg-type]
        assert ok.ok, (distance, ok.failures)
        assert not bad.ok and "[zip=1, age=1] (2 records)" in bad.failures[0], distance
        assert ok.distances["largest"] == pytest.approx(value), distance


def test_hierarchical_without_the_sa_hierarchy_fails_closed() -> None:
    p = {"Cancer": 0.5, "Flu": 1 / 3, "Heart": 1 / 6}
    result = verify_table(
        GOOD,
        t_spec(0.5, "hierarchical"),
        input_records=6,
        suppressed_records=0,
        input_sa_distribution=p,
    )
    assert not result.ok and "without the SA hierarchy" in result.failures[0]


# --------------------------------------------------------------------------- counts


def test_verify_counts_takes_class_counts_directly() -> None:
    counts = pd.DataFrame(
        {
            "zip": ["476**", "476**", "*"],
            "age": ["2*", "2*", "*"],
            "disease": ["Flu", "Cancer", "Flu"],
            "count": [3, 2, 1],
        }
    )
    result = verify_counts(counts, l_spec("distinct", 2), input_records=6, suppressed_records=1)
    # a suppression limit of 0 is exceeded by the one suppressed record, which is also
    # a class of its own (the suppressed block) with one disease
    assert not result.ok and result.failures == [
        "1 records suppressed, more than the limit floor(0 x 6) = 0",
        "class [zip=*, age=*] has 1 distinct disease value(s) ('Flu'), fewer than l=2",
    ]
    assert (result.classes, result.smallest_class) == (2, 1)


def test_bad_counts_fail_closed() -> None:
    counts = pd.DataFrame({"zip": ["1"], "age": ["1"], "count": [-1]})
    result = verify_counts(counts, k_spec(1), input_records=1, suppressed_records=0)
    assert not result.ok and "non-negative integers" in result.failures[0]


# --------------------------------------------------------------------------- vs the models

ARX = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "arx"
ADULT_QIS = ("sex", "age", "race", "marital-status", "education", "native-country", "workclass")
ADULT_SA = "occupation"


@pytest.mark.skipif(not (ARX / "adult.csv").exists(), reason=f"Adult data not found in {ARX}")
def test_verifier_agrees_with_the_models_on_adult() -> None:
    """Two code paths, one answer: on random transformations of Adult, the verifier passes
    a table exactly when the models find no violating class, and its largest t-closeness
    distance equals the models' (equal, ordered and hierarchical)."""
    df = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str, keep_default_na=False)
    names = [*ADULT_QIS, ADULT_SA]
    hierarchies = {n: load_arx_csv(ARX / f"adult_hierarchy_{n}.csv", n) for n in names}
    sa_hierarchy = hierarchies[ADULT_SA]
    summary = Summary.from_frame(df, ADULT_QIS, ADULT_SA, hierarchies, sa_hierarchy)
    evaluator = Evaluator(summary, hierarchies)
    frame = summary.to_frame(hierarchies)
    assert summary.sa_values is not None and evaluator.sa_distribution is not None
    shares = zip(summary.sa_values, evaluator.sa_distribution, strict=True)
    p = {str(v): float(s) for v, s in shares}
    specs = [
        AnonymizationSpec("k_anonymity", ADULT_QIS, ADULT_SA, k=5),
        AnonymizationSpec("l_diversity", ADULT_QIS, ADULT_SA, l=3),
        AnonymizationSpec("l_diversity", ADULT_QIS, ADULT_SA, l=3, variant="entropy"),
        AnonymizationSpec("l_diversity", ADULT_QIS, ADULT_SA, l=3, variant="recursive", c=4),
        *(
            AnonymizationSpec("t_closeness", ADULT_QIS, ADULT_SA, t=0.2, distance=d)
            for d in ("equal", "ordered", "hierarchical")
        ),
    ]
    rng = np.random.default_rng(7)
    heights = [hierarchies[q].height for q in ADULT_QIS]
    nodes = [tuple(int(rng.integers(0, h + 1)) for h in heights) for _ in range(5)]
    nodes += [(0, 4, 1, 1, 3, 2, 2), (1, 4, 1, 2, 3, 2, 2)]
    outcomes = set()
    for node in nodes:
        counts = frame.copy()
        for q, level in zip(ADULT_QIS, node, strict=True):
            counts[q] = hierarchies[q].generalize(hierarchies[q].encode(frame[q]), level)
        classes = evaluator.classes(node)
        for s in specs:
            common = {"input_records": summary.n_records, "suppressed_records": 0}
            result = verify_counts(
                counts, s, input_sa_distribution=p, sa_hierarchy=sa_hierarchy, **common
            )
            models = s.models(sa_hierarchy)
            expected = not assess(classes, models, 0.0).suppressed.any()
            assert result.ok == expected, (node, s.describe(), result.failures[:2])
            outcomes.add(expected)
            if s.kind == "t_closeness":
                closeness = models[-1]
                assert isinstance(closeness, TCloseness)
                largest = float(closeness.distances(classes).max())
                assert result.distances["largest"] == pytest.approx(largest, abs=1e-12)
    assert outcomes == {True, False}  # both answers were exercised


def test_the_verifier_does_not_use_the_search_code() -> None:
    """Independence is structural: verify.py imports none of the modules it checks."""
    import ast

    from privpipe import anonymity

    tree = ast.parse(Path(anonymity.verify.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    forbidden = {f"anonymity.{m}" for m in ("models", "metrics", "transformation", "search")}
    forbidden |= {"anonymity.mondrian", "anonymity.quality", "anonymity.lattice"}
    assert not imported & forbidden


# --------------------------------------------------------------------------- vs a groupby


def _reference(counts: pd.DataFrame, qis: list[str], unit: str | None) -> pd.DataFrame:
    """Per class (equal QI strings): records or distinct persons, distinct SA values and
    (persons) whether one value is held by all, counted with a plain pandas groupby on the
    strings (the verifier codes them)."""
    frame = counts.astype({q: str for q in qis})
    by = frame.groupby(qis)
    size = by["count"].sum() if unit is None else by[unit].nunique()
    out = pd.DataFrame({"size": size, "distinct": by["disease"].nunique()})
    if unit is not None:  # a value held by every person of the class: certain disclosure
        top = frame.groupby([*qis, "disease"])[unit].nunique().groupby(level=qis).max()
        out["certain"] = top >= size
    return out


@settings(max_examples=60, deadline=None)
@given(
    n_qis=st.integers(1, 4),
    rows=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "b", "*", "1", "1.0", ""]), min_size=4, max_size=4),
            st.sampled_from(["Flu", "Cancer", "Heart"]),
            st.integers(0, 3),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=40,
    ),
    with_units=st.booleans(),
)
def test_classes_and_their_sizes_match_a_plain_groupby(
    n_qis: int, rows: list[tuple[list[str], str, int, int]], with_units: bool
) -> None:
    qis = [f"q{j}" for j in range(n_qis)]
    counts = pd.DataFrame(
        {
            **{q: [labels[j] for labels, *_ in rows] for j, q in enumerate(qis)},
            "disease": [sa for _, sa, _, _ in rows],
            "person": [f"p{p}" for _, _, p, _ in rows],
            "count": [n for *_, n in rows],
        }
    )
    unit = "person" if with_units else None
    if unit is None:
        counts = counts.drop(columns="person")
    expected = _reference(counts, qis, unit)
    smallest, fewest = int(expected["size"].min()), max(int(expected["distinct"].min()), 2)
    for k, l_value in [(smallest, fewest), (smallest + 1, fewest), (smallest, fewest + 1)]:
        spec = AnonymizationSpec(
            "l_diversity", tuple(qis), "disease", k=k, l=l_value, variant="distinct",
            unit="person" if unit else "rows", unit_column=unit,
        )  # fmt: skip
        result = verify_counts(
            counts, spec, input_records=int(counts["count"].sum()), suppressed_records=0
        )
        assert (result.classes, result.smallest_class) == (len(expected), smallest)
        # as the pipeline passes them: categorical columns (an unused category too)
        labels = {c: counts[c].astype("category") for c in (*qis, "disease")}
        categorical = counts.assign(
            **{c: v.cat.add_categories(["unused"]) for c, v in labels.items()}
        )
        assert result == verify_counts(
            categorical, spec, input_records=int(counts["count"].sum()), suppressed_records=0
        )
        if unit is not None:  # persons as the verifier's frequency table gives them: codes
            ids, distinct = pd.factorize(counts[unit])
            coded = categorical.assign(
                **{unit: pd.Categorical.from_codes(ids, categories=pd.RangeIndex(len(distinct)))}
            )
            assert result == verify_counts(
                coded, spec, input_records=int(counts["count"].sum()), suppressed_records=0
            )
        too_small = int((expected["size"] < k).sum())
        too_few = int((expected["distinct"] < l_value).sum())
        certain = int(expected["certain"].sum()) if unit is not None else 0
        assert result.ok == (too_small == 0 and too_few == 0 and certain == 0)
        for model, failing in (("k", too_small), ("l", too_few)):
            listed = [f for f in result.failures if f" {model}=" in f and "fewer than" in f]
            more = [f for f in result.failures if f"more classes violate {model}=" in f]
            assert len(listed) == min(failing, MAX_FAILURES)
            assert len(more) == (failing > MAX_FAILURES)
        if unit is not None:
            listed = [f for f in result.failures if "(certain disclosure)" in f]
            more = [f for f in result.failures if "violate person-level" in f]
            assert (len(listed), len(more)) == (min(certain, MAX_FAILURES), certain > MAX_FAILURES)


def test_classes_of_many_wide_columns_are_told_apart() -> None:
    """Five QIs of 2^16 - 1 labels each (2^16 codes with the one kept for a missing
    cell): a mixed-radix key of all five would need 2^80, and in 64 bits the first QI's
    digit would vanish, so the key is re-densified on the way; two rows differing in the
    first QI alone must stay two classes."""
    n = (1 << 16) - 1
    i = np.arange(n)
    codes = np.stack([(i * a) % n for a in (1, 2, 4, 7, 8)], axis=1)  # each a permutation
    codes = np.vstack([codes, np.r_[codes[1, :1], codes[0, 1:]]])  # row 0 but q0 of row 1
    qis = tuple(f"q{j}" for j in range(5))
    counts = pd.DataFrame({q: codes[:, j].astype(str) for j, q in enumerate(qis)})
    counts["count"] = 2
    spec = AnonymizationSpec("k_anonymity", qis, None, k=2)
    result = verify_counts(counts, spec, input_records=2 * (n + 1), suppressed_records=0)
    assert result.ok and (result.classes, result.smallest_class) == (n + 1, 2)


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9)), max_size=60),
    huge=st.booleans(),
)
def test_persons_per_group_counts_each_person_once(
    pairs: list[tuple[int, int]], huge: bool
) -> None:
    """Distinct persons per group, by sorted pair keys or (when groups x persons would pass
    2^62) by the hashed duplicates: both equal a plain groupby's nunique."""
    from privpipe.anonymity.verify import persons_per_group

    group = np.array([g for g, _ in pairs], dtype=np.int64)
    person = np.array([p for _, p in pairs], dtype=np.int64)
    n_persons = 1 << 60 if huge else 10  # 7 x 2^60 passes 2^62: the hashed path
    got = persons_per_group(group, 7, person, n_persons)
    want = pd.Series(person).groupby(group).nunique().reindex(range(7), fill_value=0)
    assert got.tolist() == want.tolist()


def test_a_verifiers_table_of_person_codes_verifies_as_the_hashes_do() -> None:
    """The pipeline's verifier counts classes with ``FrequencyTable(hashed_as_codes=True)``:
    persons come as the table's codes, not their hashes. Three rows of one person in a
    class are one person: k=2 fails there exactly as with the hashes."""
    from privpipe.anonymity.summary import unit_hashes
    from privpipe.transforms.anonymize import FrequencyTable

    rows = pd.DataFrame(
        {
            "zip": ["1*", "1*", "1*", "2*", "2*", "2*", "2*"],
            "disease": ["flu", "flu", "cold", "flu", "cold", "cold", "flu"],
            "person": ["a", "a", "a", "b", "c", "d", "b"],
        }
    )
    rows["person"] = unit_hashes(rows["person"], "person").view(np.uint64)
    spec = AnonymizationSpec(
        "k_anonymity", ("zip",), "disease", k=2, unit="person", unit_column="person"
    )
    tables = []
    for as_codes in (False, True):
        fn = FrequencyTable(
            ["zip", "disease", "person"], True, ["person"], hashed_as_codes=as_codes
        )
        acc = fn.add_input(fn.create_accumulator(), rows.iloc[:4])
        other = fn.add_input(fn.create_accumulator(), rows.iloc[4:])
        table = fn.extract_output(fn.merge_accumulators([acc, other]))
        assert isinstance(table["person"].dtype, pd.CategoricalDtype) == as_codes
        tables.append(table)
    results = [
        verify_counts(t, spec, input_records=len(rows), suppressed_records=0) for t in tables
    ]
    assert results[0] == results[1]
    assert not results[1].ok and results[1].smallest_class == 1
    assert results[1].failures == ["class [zip=1*] has 1 persons, fewer than k=2"]


def test_categories_with_one_canonical_string_are_one_label() -> None:
    """A categorical whose categories differ as values but print alike (the number 1 and
    the string "1") gives one label: its rows are one class, as the published text shows."""
    zips = pd.Categorical(["1", 1, "2", "2"], categories=pd.Index(["1", 1, "2"], dtype=object))
    table = pd.DataFrame(
        {"zip": zips, "disease": pd.Categorical(["flu", "cold", "flu", "cold"]), "count": 1}
    )
    spec = AnonymizationSpec("k_anonymity", ("zip",), "disease", k=2)
    result = verify_counts(table, spec, input_records=4, suppressed_records=0)
    assert result.ok, result.failures
    assert (result.classes, result.smallest_class) == (2, 2)
