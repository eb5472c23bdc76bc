"""Mondrian local recoding: properties on random tables, hand-made cases, Adult.

The property test checks every output with plain pandas/Counter code written here from
REFERENCE.md (not the models of ``anonymity``): the published classes (records grouped by
their labels) satisfy k, the l variants and t-closeness; every raw tuple is covered;
numeric ranges are the smallest run of level-1 intervals of the hierarchy (the public grid)
holding their class's values, never the class's own min and max, and the verifier accepts
them; categorical labels are the lowest common ancestor of their class's raw values, read
off the hierarchy table.
Run with ``-s`` to see the Adult numbers.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import Hierarchy, build_intervals, load_arx_csv
from privpipe.anonymity.models import (
    DistinctLDiversity,
    EntropyLDiversity,
    KAnonymity,
    PrivacyModel,
    RecursiveCLDiversity,
    TCloseness,
)
from privpipe.anonymity.mondrian import MondrianResult, mondrian, parse_range, range_label
from privpipe.anonymity.quality import class_sizes, recoding_metrics
from privpipe.anonymity.recoding import Recoding, full_domain_labels
from privpipe.anonymity.search import optimal
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import Evaluator
from privpipe.anonymity.verify import verify_grid_labels
from privpipe.errors import ConfigError, PrivacyRefusal
from tests.conftest import ADULT_QIS, ADULT_SA, ARX
from tests.oracles import naive_violates_k_or_l, tree_hierarchy
from tests.test_units import person_tables, qi_names

SLACK = 1e-12
RANGE = re.compile(r"^\[(-?\d+), (-?\d+)\)$")  # a half-open interval [lo, hi)

# --------------------------------------------------------------------------- strategies


@st.composite
def categorical(draw: st.DrawFn, attribute: str) -> Hierarchy:
    """A random tree over 1-6 raw values; singleton groups may repeat their child's label."""
    return draw(tree_hierarchy(attribute, draw(st.booleans())))


@st.composite
def numeric(draw: st.DrawFn, attribute: str) -> Hierarchy:
    """Integer values low..high (the domain, larger than the data) in nested intervals."""
    low = draw(st.integers(-5, 5))
    high = low + draw(st.integers(0, 15))
    width = draw(st.sampled_from([2, 3, 5]))
    values = [str(v) for v in range(low, high + 1)]
    return build_intervals(attribute, values, [width, 2 * width], start=-10)


@dataclass(frozen=True)
class Case:
    df: pd.DataFrame
    qis: list[str]
    numeric: list[str]
    hierarchies: dict[str, Hierarchy]
    sa_values: list[str]

    def summary(self) -> Summary:
        return Summary.from_frame(self.df, self.qis, "S", self.hierarchies, sa_order=self.sa_values)


@st.composite
def cases(draw: st.DrawFn, max_rows: int = 40) -> Case:
    n_qi = draw(st.integers(1, 3))
    qis = [f"q{j}" for j in range(n_qi)]
    kinds = [draw(st.booleans()) for _ in qis]
    hierarchies = {
        q: draw(numeric(q) if is_numeric else categorical(q))
        for q, is_numeric in zip(qis, kinds, strict=True)
    }
    n = draw(st.integers(1, max_rows))
    data: dict[str, list[str]] = {}
    for q in qis:
        raw = list(hierarchies[q].values)
        data[q] = [raw[draw(st.integers(0, len(raw) - 1))] for _ in range(n)]
    m = draw(st.integers(1, 4))
    sa_values = [f"s{i}" for i in range(m)]
    data["S"] = [sa_values[draw(st.integers(0, m - 1))] for _ in range(n)]
    numerics = [q for q, is_numeric in zip(qis, kinds, strict=True) if is_numeric]
    return Case(pd.DataFrame(data), qis, numerics, hierarchies, sa_values)


MODELS = st.lists(
    st.one_of(
        st.builds(KAnonymity, st.integers(1, 4)),
        st.builds(DistinctLDiversity, st.integers(1, 3)),
        st.builds(EntropyLDiversity, st.sampled_from([1.0, 1.5, 2.0])),
        st.builds(RecursiveCLDiversity, st.sampled_from([1.5, 2.0, 3.0]), st.integers(1, 3)),
        st.builds(
            TCloseness, st.sampled_from([0.2, 0.35, 0.6]), st.sampled_from(["equal", "ordered"])
        ),
    ),
    min_size=1,
    max_size=3,
)

# --------------------------------------------------------------------------- naive checks


def naive_violates(
    model: PrivacyModel, values: list[str], everything: list[str], domain: list[str]
) -> bool:
    """REFERENCE.md, "Privacy models", for one class (its SA values; SA ``domain`` in order)."""
    basic = naive_violates_k_or_l(model, values)
    if basic is not None:
        return basic
    assert isinstance(model, TCloseness)
    counts = Counter(values)
    n = len(values)
    whole = Counter(everything)
    diff = [counts[s] / n - whole[s] / len(everything) for s in domain]
    if model.distance == "equal":
        distance = 0.5 * sum(abs(d) for d in diff)
    else:
        m = len(diff)
        distance = sum(abs(sum(diff[: i + 1])) for i in range(m - 1)) / (m - 1) if m > 1 else 0
    return distance > model.t + SLACK


def published_rows(case: Case, recoding: Recoding) -> pd.DataFrame:
    """Each row's published labels, from a dict of raw value tuples (no Recoding.apply)."""
    lookup: dict[tuple[str, ...], tuple[object, ...]] = {}
    raw = [case.hierarchies[q].values for q in case.qis]
    for codes, labels in zip(recoding.codes.tolist(), recoding.labels.tolist(), strict=True):
        lookup[tuple(str(raw[j][c]) for j, c in enumerate(codes))] = tuple(labels)
    keys = list(zip(*(case.df[q].tolist() for q in case.qis), strict=True))
    missing = [k for k in keys if k not in lookup]
    assert not missing, f"raw tuples not covered by the recoding: {missing[:3]}"
    labels = pd.DataFrame([lookup[k] for k in keys], columns=[f"g_{q}" for q in case.qis])
    return pd.concat([case.df.reset_index(drop=True), labels], axis=1)


def naive_lca(hierarchy: Hierarchy, values: Sequence[str]) -> str:
    """Label at the lowest level where all values agree, from the table itself."""
    table = hierarchy.table
    rows = [list(table[:, 0]).index(v) for v in set(values)]
    for level in range(table.shape[1]):
        labels = {table[r, level] for r in rows}
        if len(labels) == 1:
            return str(labels.pop())
    raise AssertionError("the top level is common")


def check_output(case: Case, models: Sequence[PrivacyModel], result: MondrianResult) -> None:
    recoding = result.recoding
    frame = published_rows(case, recoding)
    everything = case.df["S"].tolist()
    if result.suppressed_records:
        assert result.suppressed_records == len(case.df)
        assert (recoding.labels == "*").all() and recoding.suppressed.all()
        return
    assert not recoding.suppressed.any()
    group_columns = [f"g_{q}" for q in case.qis]
    sizes = []
    for _, rows in frame.groupby(group_columns, sort=False):
        sa = rows["S"].tolist()
        sizes.append(len(sa))
        for model in models:
            assert not naive_violates(model, sa, everything, case.sa_values), (model, rows)
        for q in case.qis:
            label = str(rows[f"g_{q}"].iloc[0])
            values = rows[q].tolist()
            if q in case.numeric:
                # the level-1 intervals (the public grid) of the smallest and largest value
                table = case.hierarchies[q].table
                cell = {str(row[0]): str(row[1]) for row in table}
                numbers = sorted(int(v) for v in values)
                first = RANGE.match(cell[str(numbers[0])])
                last = RANGE.match(cell[str(numbers[-1])])
                assert first and last
                assert label == f"[{first.group(1)}, {last.group(2)})", (label, numbers)
                match = RANGE.match(label)
                assert match and int(match.group(1)) <= numbers[0] < numbers[-1] + 1
                assert int(match.group(2)) > numbers[-1]
            else:
                assert label == naive_lca(case.hierarchies[q], values), (label, values)
    assert sorted(sizes) == sorted(class_sizes(recoding, case.summary()).tolist())
    assert len(sizes) <= result.partitions == recoding.description["partitions"]


# --------------------------------------------------------------------------- properties


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), models=MODELS)
def test_mondrian_output_satisfies_models(case: Case, models: list[PrivacyModel]) -> None:
    summary = case.summary()
    try:
        result = mondrian(summary, case.hierarchies, models, numeric=case.numeric)
    except PrivacyRefusal:
        event("refused")
        everything = case.df["S"].tolist()
        assert any(naive_violates(m, everything, everything, case.sa_values) for m in models)
        return
    event("split" if result.partitions > 1 else "one partition")
    check_output(case, models, result)
    # the verifier agrees that every numeric label is on the grid
    spec = AnonymizationSpec(
        kind="k_anonymity",
        qis=tuple(case.qis),
        k=1,
        algorithm="mondrian",
        numeric=tuple(case.numeric),
    )
    published = pd.DataFrame(result.recoding.labels, columns=case.qis)
    assert verify_grid_labels(published, spec, case.hierarchies) == []
    # the result is measurable, and the numbers are sane
    metrics = recoding_metrics(result.recoding, summary, case.hierarchies, numeric=case.numeric)
    assert 0.0 <= metrics["loss"] <= 1.0 + 1e-12
    assert metrics["classes"] == len(class_sizes(result.recoding, summary))


@settings(max_examples=60, deadline=None)
@given(case=cases(max_rows=25), k=st.integers(1, 30))
def test_whole_table_violating_is_refused(case: Case, k: int) -> None:
    summary = case.summary()
    n = len(case.df)
    if k <= n:
        result = mondrian(summary, case.hierarchies, [KAnonymity(k)], numeric=case.numeric)
        check_output(case, [KAnonymity(k)], result)
        return
    # suppressing everything would leave the whole table as the suppressed block, a
    # class for an attacker that violates k just the same: refused at any limit
    for limit in (0.5, 1.0):
        with pytest.raises(PrivacyRefusal, match=rf"whole table \({n} records\).*block"):
            mondrian(summary, case.hierarchies, [KAnonymity(k)], suppression_limit=limit)


# --------------------------------------------------------------------------- hand-made cases


def _grouping(attribute: str, rows: list[list[str]]) -> Hierarchy:
    return Hierarchy(attribute, np.array(rows, dtype=object))


def test_numeric_median_splits_and_labels() -> None:
    ages = [str(a) for a in range(20, 28)]
    h = build_intervals("age", [str(a) for a in range(0, 100)], [2, 20])
    df = pd.DataFrame({"age": ages, "S": ["a", "b"] * 4})
    summary = Summary.from_frame(df, ["age"], "S", {"age": h})
    result = mondrian(summary, {"age": h}, [KAnonymity(2)], numeric=["age"])
    labels = dict(
        zip(h.values[result.recoding.codes[:, 0]], result.recoding.labels[:, 0], strict=True)
    )
    # ranges are grid cells [20, 22), ..., not the members' own [20, 21], ...
    assert labels == {
        "20": "[20, 22)",
        "21": "[20, 22)",
        "22": "[22, 24)",
        "23": "[22, 24)",
        "24": "[24, 26)",
        "25": "[24, 26)",
        "26": "[26, 28)",
        "27": "[26, 28)",
    }
    assert result.partitions == 4 and result.suppressed_records == 0
    # distinct 2-diversity: a, b alternate, so pairs work; 3 would not
    assert mondrian(summary, [h], [DistinctLDiversity(2)], numeric=["age"]).partitions == 4
    with pytest.raises(PrivacyRefusal):
        mondrian(summary, [h], [DistinctLDiversity(3)], numeric=["age"])


def test_single_values_widen_to_their_cell_and_ties_stay_together() -> None:
    h = build_intervals("age", [str(a) for a in range(0, 10)], [1, 5])
    df = pd.DataFrame({"age": ["3"] * 5 + ["4"] + ["7"] * 4, "S": ["x"] * 10})
    summary = Summary.from_frame(df, ["age"], "S", {"age": h})
    result = mondrian(summary, {"age": h}, [KAnonymity(2)], numeric=["age"])
    labels = dict(
        zip(h.values[result.recoding.codes[:, 0]], result.recoding.labels[:, 0], strict=True)
    )
    # the weighted median of 3,3,3,3,3,4,7,7,7,7 puts 3 alone (5 | 5) then 4 joins 7;
    # a class of one value shows its grid cell, a range ends where the grid's cells end
    assert labels == {"3": "[3, 4)", "4": "[4, 8)", "7": "[4, 8)"}
    # on a coarser grid, cuts fall between cells only: 3 and 4 share [0, 5)
    coarse = build_intervals("age", [str(a) for a in range(0, 10)], [5])
    summary = Summary.from_frame(df, ["age"], "S", {"age": coarse})
    result = mondrian(summary, {"age": coarse}, [KAnonymity(2)], numeric=["age"])
    labels = dict(
        zip(coarse.values[result.recoding.codes[:, 0]], result.recoding.labels[:, 0], strict=True)
    )
    assert labels == {"3": "[0, 5)", "4": "[0, 5)", "7": "[5, 10)"}


def test_arx_intervals_and_no_grid() -> None:
    # ARX's closed "lo-hi" intervals give closed ranges; a hierarchy without intervals gives
    # the lowest common ancestor, as for categorical attributes
    arx = _grouping("age", [[str(a), f"{a // 2 * 2}-{a // 2 * 2 + 1}", "*"] for a in range(8)])
    df = pd.DataFrame({"age": [str(a) for a in range(8)], "S": ["x"] * 8})
    summary = Summary.from_frame(df, ["age"], "S", {"age": arx})
    result = mondrian(summary, {"age": arx}, [KAnonymity(2)], numeric=["age"])
    assert sorted(set(result.recoding.labels[:, 0])) == ["[0, 1]", "[2, 3]", "[4, 5]", "[6, 7]"]
    named = _grouping("age", [[str(a), "low" if a < 4 else "high", "*"] for a in range(8)])
    summary = Summary.from_frame(df, ["age"], "S", {"age": named})
    result = mondrian(summary, {"age": named}, [KAnonymity(3)], numeric=["age"])
    assert sorted(set(result.recoding.labels[:, 0])) == ["high", "low"]


def test_verifier_refuses_off_grid_labels() -> None:
    h = build_intervals("age", [str(a) for a in range(0, 100)], [5, 10])
    spec = AnonymizationSpec(
        kind="k_anonymity", qis=("age",), k=2, algorithm="mondrian", numeric=("age",)
    )
    good = pd.DataFrame({"age": ["[20, 30)", "[20, 30)", "[30, 35)", "*"]})
    assert verify_grid_labels(good, spec, {"age": h}) == []
    # the members' own min and max, a shifted range, a closed end and a raw value: all refused
    for label in ["[21, 27]", "[21, 30)", "[20, 30]", "27", "[20, 31)"]:
        bad = pd.DataFrame({"age": ["[20, 30)", label]})
        failures = verify_grid_labels(bad, spec, {"age": h})
        assert len(failures) == 1 and repr(label) in failures[0], label
    # without an interval grid only the hierarchy's own labels pass
    named = _grouping("age", [[str(a), "low" if a < 4 else "high", "*"] for a in range(8)])
    assert verify_grid_labels(pd.DataFrame({"age": ["low", "3"]}), spec, {"age": named}) == []
    assert verify_grid_labels(pd.DataFrame({"age": ["[0, 3]"]}), spec, {"age": named})


def test_categorical_splits_follow_the_hierarchy() -> None:
    h = _grouping(
        "c",
        [
            ["a", "AB", "*"],
            ["b", "AB", "*"],
            ["c", "CD", "*"],
            ["d", "CD", "*"],
            ["e", "CD", "*"],
        ],
    )
    df = pd.DataFrame({"c": list("aabbccddee"), "S": list("xyxyxyxyxy")})
    summary = Summary.from_frame(df, ["c"], "S", {"c": h})
    result = mondrian(summary, {"c": h}, [KAnonymity(3)])
    labels = dict(
        zip(h.values[result.recoding.codes[:, 0]], result.recoding.labels[:, 0], strict=True)
    )
    # CD has 6 records: c | d e would leave 2 < 3, so AB (4) and CD (6) stay whole
    assert labels == {"a": "AB", "b": "AB", "c": "CD", "d": "CD", "e": "CD"}
    result = mondrian(summary, {"c": h}, [KAnonymity(2)])
    labels = dict(
        zip(h.values[result.recoding.codes[:, 0]], result.recoding.labels[:, 0], strict=True)
    )
    assert labels == {v: v for v in "abcde"}


def test_widest_attribute_is_split_first() -> None:
    age = build_intervals("age", [str(a) for a in range(0, 100)], [50])
    sex = _grouping("sex", [["M", "*"], ["F", "*"]])
    # age lies in one grid cell (cannot be cut); sex spans its whole domain: split on sex
    df = pd.DataFrame({"age": ["30", "31"] * 4, "sex": ["M"] * 4 + ["F"] * 4, "S": ["x"] * 8})
    summary = Summary.from_frame(df, ["age", "sex"], "S", {"age": age, "sex": sex})
    result = mondrian(summary, [age, sex], [KAnonymity(4)], numeric=["age"])
    assert set(map(tuple, result.recoding.labels.tolist())) == {
        ("[0, 50)", "M"),
        ("[0, 50)", "F"),
    }


def test_t_closeness_compares_with_the_whole_table() -> None:
    h = build_intervals("age", [str(a) for a in range(0, 100)], [1, 10])
    df = pd.DataFrame({"age": [str(a) for a in range(20, 30)], "S": ["a"] * 5 + ["b"] * 5})
    summary = Summary.from_frame(df, ["age"], "S", {"age": h})
    # halves by age are all-a and all-b: distance 0.5 from p = (1/2, 1/2)
    assert mondrian(summary, [h], [TCloseness(0.4)], numeric=["age"]).partitions == 1
    assert mondrian(summary, [h], [TCloseness(0.5)], numeric=["age"]).partitions > 1


def test_argument_errors() -> None:
    h = _grouping("c", [["a", "*"], ["b", "*"]])
    df = pd.DataFrame({"c": ["a", "b"], "S": ["x", "y"]})
    summary = Summary.from_frame(df, ["c"], "S", {"c": h})
    with pytest.raises(ConfigError, match=r"'zip'.*not quasi-identifiers"):
        mondrian(summary, [h], [KAnonymity(1)], numeric=["zip"])
    with pytest.raises(ConfigError, match="not numbers: 'a', 'b'"):
        mondrian(summary, [h], [KAnonymity(1)], numeric=["c"])
    with pytest.raises(ConfigError, match="sensitive attribute"):
        mondrian(summary.without_sa(), [h], [DistinctLDiversity(2)])
    with pytest.raises(ConfigError, match="no privacy model"):
        mondrian(summary, [h], [])
    with pytest.raises(ConfigError, match="suppression_limit"):
        mondrian(summary, [h], [KAnonymity(1)], suppression_limit=1.5)


def test_without_sensitive_attribute_and_range_labels() -> None:
    h = _grouping("c", [["a", "*"], ["b", "*"]])
    df = pd.DataFrame({"c": ["a", "b", "a", "b"]})
    summary = Summary.from_frame(df, ["c"], None, {"c": h})
    assert mondrian(summary, [h], [KAnonymity(2)]).partitions == 2
    assert range_label(1.0, 2.5) == "[1, 2.5]" and range_label(-3, -3) == "[-3, -3]"
    assert parse_range("[1, 2.5]") == (1.0, 2.5) and parse_range("7") == (7.0, 7.0)
    lo, hi = parse_range("[20, 30)") or (0.0, 0.0)
    assert lo == 20.0 and 29.999 < hi < 30.0 and parse_range("[3, 3)") is None
    assert parse_range("[3, 1]") is None and parse_range("abc") is None


# --------------------------------------------------------------------------- Adult


@pytest.fixture(scope="module")
def adult() -> tuple[Summary, dict[str, Hierarchy]]:
    if not (ARX / "adult.csv").exists():
        pytest.skip(f"Adult data not found in {ARX}")
    df = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str, keep_default_na=False)
    hierarchies = {
        name: load_arx_csv(ARX / f"adult_hierarchy_{name}.csv", name)
        for name in [*ADULT_QIS, ADULT_SA]
    }
    return Summary.from_frame(df, ADULT_QIS, ADULT_SA, hierarchies, hierarchies[ADULT_SA]), (
        hierarchies
    )


def _full_domain(summary: Summary, hierarchies: dict[str, Hierarchy], limit: float) -> float:
    evaluator = Evaluator(summary, hierarchies)
    result = optimal(evaluator, [KAnonymity(5)], suppression_limit=limit)
    _, first = evaluator.qi_tuples()
    codes = summary.qi_codes[first]
    labels = full_domain_labels(ADULT_QIS, hierarchies, codes, result.transformation)
    suppressed = result.assessment.suppressed[result.classes.classify(codes)]
    recoding = Recoding(tuple(ADULT_QIS), codes, labels, suppressed, {"levels": result.levels})
    print(f"  full-domain optimum, limit {limit}: {result.describe()}")
    return float(recoding_metrics(recoding, summary, hierarchies)["loss"])


def test_adult_k5_against_full_domain(adult: tuple[Summary, dict[str, Hierarchy]]) -> None:
    summary, hierarchies = adult
    started = time.perf_counter()
    result = mondrian(summary, hierarchies, [KAnonymity(5)], numeric=["age"])
    elapsed = time.perf_counter() - started
    sizes = class_sizes(result.recoding, summary)
    assert sizes.min() >= 5 and sizes.sum() == summary.n_records
    metrics = recoding_metrics(result.recoding, summary, hierarchies, numeric=["age"])
    full_0 = _full_domain(summary, hierarchies, 0.0)
    full_5 = _full_domain(summary, hierarchies, 0.05)
    print(
        f"\n  Mondrian k=5: loss {metrics['loss']:.4f}, {result.partitions} partitions, "
        f"{metrics['classes']} classes, {elapsed:.3f}s; full-domain optimum loss "
        f"{full_0:.4f} (no suppression), {full_5:.4f} (5% suppression)"
    )
    assert metrics["loss"] <= full_0 and metrics["loss"] <= full_5
    assert elapsed < 5.0


def test_adult_l_and_t(adult: tuple[Summary, dict[str, Hierarchy]]) -> None:
    summary, hierarchies = adult
    for models in (
        [KAnonymity(5), DistinctLDiversity(3)],
        [KAnonymity(5), EntropyLDiversity(2.0)],
        [KAnonymity(5), TCloseness(0.2, "hierarchical", hierarchies[ADULT_SA])],
    ):
        result = mondrian(summary, hierarchies, models, numeric=["age"])
        metrics = recoding_metrics(result.recoding, summary, hierarchies, numeric=["age"])
        print(
            f"\n  Mondrian {', '.join(m.describe() for m in models)}: loss "
            f"{metrics['loss']:.4f}, {metrics['classes']} classes, {result.seconds:.3f}s"
        )
        assert class_sizes(result.recoding, summary).min() >= 5
        assert result.seconds < 5.0


# --------------------------------------------------------------------------- persons


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=person_tables(max_rows=40), pin=st.booleans(), k=st.integers(2, 4))
def test_persons_by_tuple_sums_equal_persons_counted_pairwise(
    table: tuple[pd.DataFrame, dict[str, Hierarchy]], pin: bool, k: int
) -> None:
    """Mondrian's checks count persons per class from persons per tuple when each person's
    rows share one tuple (``Evaluator.persons_per_tuple``): the same partitions and labels
    as counting distinct (class, person) pairs at every check. ``pin``: each person keeps
    the tuple of their first row (else their rows may have several)."""
    from unittest import mock

    df, hierarchies = table
    qis = qi_names(df)
    if pin:
        df[qis] = df.groupby("P")[qis].transform("first")
    summary = Summary.from_frame(df, qis, "S", hierarchies, unit="P")
    per_tuple = Evaluator(summary, hierarchies, use_sa=False).persons_per_tuple()
    several = bool((df.groupby("P")[qis].nunique() > 1).any(axis=None))
    one_row_each = df["P"].nunique() == len(df)  # records are persons: nothing to count
    event(f"persons with several tuples: {several}, one row each: {one_row_each}")
    assert (per_tuple is None) == (several or one_row_each)

    def run() -> tuple[int, list[list[str]]] | str:
        try:
            out = mondrian(summary, hierarchies, [KAnonymity(k)])
        except PrivacyRefusal as e:
            return str(e)
        return out.partitions, out.recoding.labels.tolist()

    fast = run()
    with mock.patch.object(Evaluator, "persons_per_tuple", return_value=None):
        assert run() == fast


def test_persons_per_tuple_counts_distinct_persons() -> None:
    df = pd.DataFrame(
        {
            "pid": ["a", "a", "b", "c", "c", "c"],
            "age": ["1", "1", "1", "2", "2", "2"],
            "d": ["u", "v", "u", "u", "v", "w"],
        }
    )
    h = {"age": build_intervals("age", [str(a) for a in range(5)], [5])}
    summary = Summary.from_frame(df, ["age"], "d", h, unit="pid")
    assert Evaluator(summary, h).persons_per_tuple().tolist() == [2, 1]  # age 1: a, b; 2: c
    moved = df.assign(age=["1", "2", "1", "2", "2", "2"])  # a has two tuples
    summary = Summary.from_frame(moved, ["age"], "d", h, unit="pid")
    assert Evaluator(summary, h).persons_per_tuple() is None
