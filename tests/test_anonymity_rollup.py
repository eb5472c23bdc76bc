"""Roll-ups from any evaluated specialisation equal recomputation from the summary rows.

``Evaluator.rollup_to`` (used by the optimal search to roll a node up from the cached
node with the fewest cells below it) must give exactly the classes, cells, single-person
row counts and person-counted view that ``Evaluator.classes`` gives; and the search must
find the same optimum with it as by brute force (tests/test_units.py checks the optimum).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privpipe.anonymity.api import identity_recoding, person_class_sizes, recoding_from_search
from privpipe.anonymity.models import KAnonymity
from privpipe.anonymity.recoding import Recoding
from privpipe.anonymity.search import optimal
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator
from privpipe.errors import PrivacyRefusal
from tests.test_anonymity_core import tiny
from tests.test_units import person_tables, qi_names


def same_classes(
    a: EquivalenceClasses,
    b: EquivalenceClasses,
    optional: tuple[str, ...] = ("cell_sa", "cell_single"),
) -> None:
    """Equal classes: levels, sizes, cells, labels and each of the ``optional`` arrays
    (absent in both, or equal)."""
    assert a.levels == b.levels
    np.testing.assert_array_equal(a.sizes, b.sizes)
    np.testing.assert_array_equal(a.cell_class, b.cell_class)
    np.testing.assert_array_equal(a.cell_count, b.cell_count)
    np.testing.assert_array_equal(a.labels, b.labels)
    for name in optional:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


def _pairs(ev: Evaluator) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    nodes = [tuple(int(x) for x in node) for node in ev.lattice().nodes().tolist()]
    return [
        (low, high)
        for low, high in itertools.product(nodes, nodes)
        if all(a <= b for a, b in zip(low, high, strict=True))
    ]


def test_rollup_to_equals_classes_on_every_pair_of_nodes() -> None:
    summary, hierarchies = tiny()
    for use_sa in (True, False):
        ev = Evaluator(summary, hierarchies, use_sa=use_sa)
        for low, high in _pairs(ev):
            same_classes(ev.rollup_to(ev.classes(low), high), ev.classes(high))


def test_rollup_to_refuses_a_node_that_does_not_generalise() -> None:
    summary, hierarchies = tiny()
    ev = Evaluator(summary, hierarchies)
    with pytest.raises(ValueError, match="not a generalisation"):
        ev.rollup_to(ev.classes((1, 0)), (0, 1))
    other = Evaluator(summary, hierarchies)
    with pytest.raises(ValueError, match="this evaluator"):
        ev.rollup_to(other.classes((0, 0)), (1, 1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rolled_up_person_counts_equal_recounted_ones(data: st.DataObject) -> None:
    """Random summaries with persons of several rows: every (specialisation, node) pair
    gives the same classes and the same person-counted view as a count from the rows."""
    df, hier = data.draw(person_tables(max_rows=16))
    qis = qi_names(df)
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    ev = Evaluator(summary, hier, use_sa=data.draw(st.booleans()))
    for low, high in _pairs(ev):
        rolled = ev.rollup_to(ev.classes(low), high)
        direct = ev.classes(high)
        same_classes(rolled, direct)
        same_classes(ev.in_units(rolled), ev.in_units(direct))
        # and the persons by brute force: distinct person ids per class
        classes = direct.row_classes()
        units = summary.unit_codes
        assert units is not None
        for c in range(direct.n_classes):
            assert ev.in_units(rolled).sizes[c] == np.unique(units[classes == c]).shape[0]


def _person_class_sizes_by_pandas(recoding: Recoding, summary: Summary) -> np.ndarray:
    """The definition, written with pandas (labels as strings, drop_duplicates)."""
    assert summary.unit_codes is not None
    index = pd.MultiIndex.from_arrays([recoding.codes[:, j] for j in range(summary.n_qi)])
    rows = pd.MultiIndex.from_arrays([summary.qi_codes[:, j] for j in range(summary.n_qi)])
    row = np.asarray(index.get_indexer(rows))
    labels = pd.MultiIndex.from_arrays(
        [recoding.labels[:, j].astype(str) for j in range(recoding.labels.shape[1])]
    )
    cls = np.asarray(labels.factorize()[0])[row]
    kept = ~np.asarray(recoding.suppressed, dtype=bool)[row]
    pairs = pd.DataFrame({"cls": cls[kept], "unit": summary.unit_codes[kept]}).drop_duplicates()
    return pairs.groupby("cls").size().to_numpy(np.int64)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_person_class_sizes_equal_the_pandas_definition(data: st.DataObject) -> None:
    df, hier = data.draw(person_tables(max_rows=20))
    qis = qi_names(df)
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    ev = Evaluator(summary, hier)
    limit = data.draw(st.sampled_from([0.0, 0.5]))
    try:
        result = optimal(ev, KAnonymity(2), suppression_limit=limit)
    except PrivacyRefusal:
        result = None
    for recoding in (
        identity_recoding(summary, hier),
        *([] if result is None else [recoding_from_search(result, summary, hier)]),
    ):
        np.testing.assert_array_equal(
            person_class_sizes(recoding, summary),
            _person_class_sizes_by_pandas(recoding, summary),
        )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_person_class_sizes_of_persons_with_one_tuple_each(data: st.DataObject) -> None:
    """When every person's rows share one QI tuple the persons of a class are summed per
    tuple (no pairs are sorted): still the pandas definition, with suppressed tuples left
    out and with the recoding's tuples in any order."""
    df, hier = data.draw(person_tables(max_rows=20))
    qis = qi_names(df)
    df[qis] = df.groupby("P")[qis].transform("first")  # each person keeps one tuple
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    ev = Evaluator(summary, hier)
    try:
        base = recoding_from_search(
            optimal(ev, KAnonymity(2), suppression_limit=0.5), summary, hier
        )
    except PrivacyRefusal:
        base = identity_recoding(summary, hier)
    n = base.codes.shape[0]
    suppressed = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    order = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)
    for recoding in (
        base,
        Recoding(base.qi_names, base.codes, base.labels, suppressed, {}),
        Recoding(base.qi_names, base.codes[order], base.labels[order], suppressed[order], {}),
    ):
        np.testing.assert_array_equal(
            person_class_sizes(recoding, summary),
            _person_class_sizes_by_pandas(recoding, summary),
        )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_search_results_recoding_is_the_same_for_an_equal_summary(data: st.DataObject) -> None:
    """``recoding_from_search`` classes the tuples of the evaluator's own summary by their
    rows' keys, and those of any other summary by relabelling their raw codes: for an equal
    summary (not the same object) both give the same recoding."""
    df, hier = data.draw(person_tables(max_rows=20))
    qis = qi_names(df)
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    limit = data.draw(st.sampled_from([0.0, 0.5]))
    try:
        result = optimal(Evaluator(summary, hier), KAnonymity(2), suppression_limit=limit)
    except PrivacyRefusal:
        return
    # any classes suppressed (the search's own choice rarely suppresses a few of them)
    n_classes = result.classes.n_classes
    flags = data.draw(st.lists(st.booleans(), min_size=n_classes, max_size=n_classes))
    assessment = dataclasses.replace(result.assessment, suppressed=np.array(flags, dtype=bool))
    result = dataclasses.replace(result, assessment=assessment)
    equal = Summary.from_frame(df, qis, "S", hier, unit="P")
    assert equal is not result.classes.evaluator.summary
    own, other = (recoding_from_search(result, s, hier) for s in (summary, equal))
    np.testing.assert_array_equal(own.codes, other.codes)
    np.testing.assert_array_equal(own.labels, other.labels)
    np.testing.assert_array_equal(own.suppressed, other.suppressed)
