"""Metrics of recodings: equal to ``metrics.all_metrics`` on full-domain recodings.

The cross-check builds the full-domain ``Recoding`` of an optimal search result (random
tables, and Adult) and compares every metric of ``quality.recoding_metrics`` with the
search's own ``all_metrics``. Hand-made local recodings with ``[lo, hi]`` ranges are
checked against numbers worked out by hand from REFERENCE.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import Hierarchy, build_intervals, load_arx_csv
from privpipe.anonymity.models import DistinctLDiversity, KAnonymity, PrivacyModel, TCloseness
from privpipe.anonymity.mondrian import mondrian
from privpipe.anonymity.quality import class_sizes, recoding_metrics
from privpipe.anonymity.recoding import Recoding, full_domain_labels
from privpipe.anonymity.search import SearchResult, optimal
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import Evaluator
from privpipe.errors import PrivacyRefusal
from tests.conftest import ADULT_QIS, ADULT_SA, ARX
from tests.oracles import tree_hierarchy

KEYS = [
    "loss",
    "loss_arithmetic",
    "discernibility",
    "average_class_size",
    "precision",
    "non_uniform_entropy",
    "kl_divergence",
    "suppressed_records",
]


def full_domain(result: SearchResult, summary: Summary, hint: bool = True) -> Recoding:
    """The recoding of a full-domain search result (suppressed classes all ``*``)."""
    evaluator = result.classes.evaluator
    _, first = evaluator.qi_tuples()
    codes = summary.qi_codes[first]
    names = summary.qi_names
    hierarchies = dict(zip(names, evaluator.hierarchies, strict=True))
    labels = full_domain_labels(names, hierarchies, codes, result.transformation)
    suppressed = result.assessment.suppressed[result.classes.classify(codes)]
    description = {"levels": result.levels} if hint else {}
    return Recoding(names, codes, labels, suppressed, description)


def assert_same(ours: dict[str, Any], theirs: dict[str, Any], keys: list[str]) -> None:
    for key in keys:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-9), key
    if "loss" in keys:
        for name, value in theirs["loss_per_attribute"].items():
            assert ours["loss_per_attribute"][name] == pytest.approx(value, rel=1e-9, abs=1e-12)


# --------------------------------------------------------------------------- random tables


@st.composite
def hierarchy(draw: st.DrawFn, attribute: str, repeat: bool) -> Hierarchy:
    """A random tree over 1-6 raw values; with ``repeat``, singleton groups keep their
    child's label (a label repeated across levels), as real hierarchies often do."""
    if draw(st.booleans()):
        low = draw(st.integers(0, 5))
        values = [str(v) for v in range(low, low + draw(st.integers(1, 12)))]
        return build_intervals(attribute, values, [draw(st.sampled_from([2, 3])), 6])
    return draw(tree_hierarchy(attribute, repeat))


@st.composite
def searched(draw: st.DrawFn) -> tuple[Summary, SearchResult, bool] | None:
    """A random table, its optimal full-domain result (None if refused), and whether its
    hierarchies repeat labels across levels."""
    repeat = draw(st.booleans())
    qis = [f"q{j}" for j in range(draw(st.integers(1, 3)))]
    hierarchies = {q: draw(hierarchy(q, repeat)) for q in qis}
    n = draw(st.integers(1, 40))
    data = {
        q: [str(h.values[draw(st.integers(0, h.domain_size - 1))]) for _ in range(n)]
        for q, h in hierarchies.items()
    }
    data["S"] = [f"s{draw(st.integers(0, 3))}" for _ in range(n)]
    summary = Summary.from_frame(pd.DataFrame(data), qis, "S", hierarchies)
    models: list[PrivacyModel] = [KAnonymity(draw(st.integers(1, 8)))]
    if draw(st.booleans()):
        models.append(DistinctLDiversity(draw(st.integers(1, 3))))
    if draw(st.booleans()):
        models.append(TCloseness(draw(st.sampled_from([0.2, 0.4]))))
    limit = draw(st.sampled_from([0.0, 0.2, 0.5]))
    try:
        result = optimal(Evaluator(summary, hierarchies), models, suppression_limit=limit)
    except PrivacyRefusal:
        return None
    return summary, result, repeat


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=searched())
def test_full_domain_metrics_equal_all_metrics(
    case: tuple[Summary, SearchResult, bool] | None,
) -> None:
    if case is None:
        event("refused")
        return
    summary, result, repeat = case
    event(f"suppressed={result.suppressed}, repeated labels={repeat}")
    hierarchies = result.classes.evaluator.hierarchies
    theirs = result.metrics().as_dict()
    ours = recoding_metrics(full_domain(result, summary), summary, hierarchies)
    assert_same(ours, theirs, KEYS)
    assert ours["classes"] == int(result.assessment.kept.sum())
    kept_sizes = result.classes.sizes[result.assessment.kept]
    assert sorted(class_sizes(full_domain(result, summary), summary)) == sorted(kept_sizes)
    if not repeat:
        # without the level hint labels are read at their lowest level: the same here,
        # except non-uniform entropy of suppressed records (raw value before suppression)
        plain = recoding_metrics(full_domain(result, summary, hint=False), summary, hierarchies)
        same = [k for k in KEYS if k != "non_uniform_entropy" or not result.suppressed]
        assert_same(plain, theirs, same)


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
    summary = Summary.from_frame(df, ADULT_QIS, ADULT_SA, hierarchies, hierarchies[ADULT_SA])
    return summary, hierarchies


@pytest.mark.parametrize(
    ("models", "limit"),
    [
        ([KAnonymity(5)], 0.0),
        ([KAnonymity(5)], 0.05),
        ([KAnonymity(5), DistinctLDiversity(3)], 0.05),
    ],
)
def test_adult_full_domain_metrics(
    adult: tuple[Summary, dict[str, Hierarchy]], models: list[PrivacyModel], limit: float
) -> None:
    summary, hierarchies = adult
    result = optimal(Evaluator(summary, hierarchies), models, suppression_limit=limit)
    theirs = result.metrics().as_dict()
    ours = recoding_metrics(full_domain(result, summary), summary, hierarchies)
    assert_same(ours, theirs, KEYS)
    # Adult's labels are unique across levels: without the hint only the entropy of
    # suppressed records may differ
    plain = recoding_metrics(full_domain(result, summary, hint=False), summary, hierarchies)
    assert_same(plain, theirs, [k for k in KEYS if k != "non_uniform_entropy"])
    if not result.suppressed:
        assert_same(plain, theirs, KEYS)


# --------------------------------------------------------------------------- hand-made


@pytest.fixture
def ages() -> tuple[Summary, Hierarchy]:
    h = build_intervals("age", [str(a) for a in range(10)], [5])  # [0, 5), [5, 10), *
    df = pd.DataFrame({"age": ["0", "2", "3", "5", "7", "9"], "S": list("xyxyxy")})
    return Summary.from_frame(df, ["age"], "S", {"age": h}), h


def _recoding(h: Hierarchy, labels: dict[str, str], suppressed: Collection[str] = ()) -> Recoding:
    raw = list(labels)
    codes = h.encode(raw).reshape(-1, 1)
    published = np.array([[labels[v]] for v in raw], dtype=object)
    mask = np.array([v in suppressed for v in raw])
    return Recoding(("age",), codes, published, mask, {})


def test_ranges_by_hand(ages: tuple[Summary, Hierarchy]) -> None:
    summary, h = ages
    labels = {"0": "[0, 9]", "2": "[2, 3]", "3": "[2, 3]", "5": "[5, 9]", "7": "7", "9": "[5, 9]"}
    m = recoding_metrics(_recoding(h, labels), summary, [h], numeric=["age"])
    # covers 10, 2, 2, 5, 1, 5 of 10 raw values; n = 6
    assert m["loss"] == pytest.approx((25 - 6) / (60 - 6))
    assert m["loss_arithmetic"] == pytest.approx(m["loss"])
    # levels (height 2): [0, 9] -> * (2); [2, 3] and [5, 9] -> their interval (1); 7 -> 0
    assert m["precision"] == pytest.approx((2 + 1 + 1 + 1 + 0 + 1) / 2 / 6)
    assert m["classes"] == 4 and m["discernibility"] == 1 + 4 + 4 + 1
    assert m["average_class_size"] == pytest.approx(6 / 4)
    assert m["non_uniform_entropy"] == pytest.approx(4.0)  # log2 2 for the 4 paired records
    assert m["kl_divergence"] == pytest.approx((math.log2(10) + 2 * math.log2(2.5)) / 6)
    assert sorted(class_sizes(_recoding(h, labels), summary).tolist()) == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="list it in numeric"):
        recoding_metrics(_recoding(h, labels), summary, [h])  # age not declared numeric


def test_suppressed_records_without_hint(ages: tuple[Summary, Hierarchy]) -> None:
    summary, h = ages
    labels = {"0": "*", "2": "[0, 5)", "3": "[0, 5)", "5": "[5, 10)", "7": "*", "9": "[5, 10)"}
    m = recoding_metrics(_recoding(h, labels, {"0", "7"}), summary, [h], numeric=["age"])
    # shares: 1, 0.5, 0.5, 0.5, 1, 0.5 -> sum 4; IL = (4 - 0.6) / (6 - 0.6)
    assert m["loss"] == pytest.approx((4 - 0.6) / (6 - 0.6))
    assert m["suppressed_records"] == 2 and m["classes"] == 2
    assert m["discernibility"] == 4 + 4 + 6 * 2
    assert m["average_class_size"] == pytest.approx(6 / 3)
    assert m["precision"] == pytest.approx((4 * 0.5 + 2) / 6)
    # kept: log2(2 / 1) each; suppressed: raw value before suppression (0), then S = 2
    # records over two distinct values: log2(2 / 1) each
    assert m["non_uniform_entropy"] == pytest.approx(4 + 2)


def test_errors(ages: tuple[Summary, Hierarchy]) -> None:
    summary, h = ages
    labels = {"0": "[0, 5)", "2": "[0, 5)", "3": "[0, 5)", "5": "[5, 10)", "7": "7"}
    with pytest.raises(ValueError, match="1 distinct QI tuple"):
        recoding_metrics(_recoding(h, labels), summary, [h])
    labels = {**labels, "9": "[0, 5)"}
    with pytest.raises(ValueError, match="not a generalisation of the raw value '9'"):
        recoding_metrics(_recoding(h, labels), summary, [h])
    labels["9"] = "[0, 8]"
    with pytest.raises(ValueError, match="does not contain the raw value '9'"):
        recoding_metrics(_recoding(h, labels), summary, [h], numeric=["age"])
    labels["9"] = "[5, 10)"
    with pytest.raises(ValueError, match="at level 1"):
        recoding_metrics(_recoding(h, labels), summary, [h], levels={"age": 1})
    # a label of the hinted level, but another raw value's: read on ids, refused the same
    wrong = {**labels, "7": "[5, 10)", "9": "[0, 5)"}
    with pytest.raises(ValueError, match="not a generalisation of the raw value '9' at level 1"):
        recoding_metrics(_recoding(h, wrong), summary, [h], levels={"age": 1})
    assert recoding_metrics(_recoding(h, labels), summary, [h], levels=None)["classes"] == 3
    other = Summary.from_frame(pd.DataFrame({"x": ["0"]}), ["x"], None, {"x": h})
    with pytest.raises(ValueError, match="the recoding is of"):
        recoding_metrics(_recoding(h, labels), other, [h])


def test_entropy_by_count_array_equals_entropy_by_grouping(
    adult: tuple[Summary, dict[str, Hierarchy]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The non-uniform entropy counts (raw value, label) pairs in an array indexed by the
    pair when that is small, else by grouping: the same sums in the same order, so the
    same figure to the last bit, with suppression and without."""
    from privpipe.anonymity import quality

    summary, hierarchies = adult
    recodings = [
        full_domain(
            optimal(Evaluator(summary, hierarchies), [KAnonymity(5)], suppression_limit=s), summary
        )
        for s in (0.0, 0.05)
    ]  # a label is a function of the raw value
    recodings.append(mondrian(summary, hierarchies, [KAnonymity(5)]).recoding)  # and is not
    for recoding in recodings:
        dense = recoding_metrics(recoding, summary, hierarchies)
        monkeypatch.setattr(quality, "_DENSE_FACTOR", 0)
        monkeypatch.setattr(quality, "_DENSE_MIN", 0)
        grouped = recoding_metrics(recoding, summary, hierarchies)
        monkeypatch.undo()
        assert dense["non_uniform_entropy"] > 0
        assert dense == grouped
