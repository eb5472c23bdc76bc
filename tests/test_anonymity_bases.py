"""Bases (``anonymity.bases``): classes counted from a base's rows equal those counted
from the summary rows, whatever base, with persons spanning several rows; and the check
says no when a base is wrong."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import privpipe.anonymity.bases as bases
import privpipe.anonymity.transformation as transformation
from privpipe.anonymity.hierarchy import Hierarchy, build_grouping
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import EquivalenceClasses, Evaluator
from tests.test_anonymity_rollup import same_classes
from tests.test_units import person_tables


def _same(a: EquivalenceClasses, b: EquivalenceClasses) -> None:
    same_classes(a, b, ("cell_sa", "cell_single", "cell_first", "multi_pairs"))


def _from_summary(ev: Evaluator, node: tuple[int, ...]) -> EquivalenceClasses:
    """The reference: counted from the summary rows themselves (no base)."""
    return ev._count(ev._base_of_summary(), node)


def _nodes(ev: Evaluator) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in node) for node in ev.lattice().nodes().tolist()]


def visit_tables() -> st.SearchStrategy[tuple[pd.DataFrame, dict[str, Hierarchy]]]:
    """Random visits: 3 QIs with 2-3 level hierarchies, persons with one to several
    rows whose QIs may differ (so some persons span several tuples and cells)."""
    return person_tables(max_rows=40, n_qis=(3, 3), max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(visit_tables(), st.booleans(), st.booleans(), st.randoms(use_true_random=False))
def test_classes_from_any_base_equal_classes_from_the_summary(
    table: tuple[pd.DataFrame, dict[str, Hierarchy]],
    use_sa: bool,
    with_units: bool,
    rng: object,
) -> None:
    df, hier = table
    qis = ["q0", "q1", "q2"]
    summary = Summary.from_frame(df, qis, "S", hier, unit="P" if with_units else None)
    nodes = _nodes(Evaluator(summary, hier))
    order = list(nodes)
    rng.shuffle(order)  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)  # keep every base, even small ones
        ev = Evaluator(summary, hier, use_sa=use_sa)
        reference = {node: _from_summary(ev, node) for node in nodes}
        root = ev._root()  # with persons: simple persons merged per (QI tuple, SA)
        assert (root is not ev._base_of_summary()) == with_units
        for node in nodes:
            _same(ev._count(root, node), reference[node])
            _same(ev.in_units(ev._count(root, node)), ev.in_units(reference[node]))
        for node in order:  # bases built in a random order, each from the best one below
            _same(ev.classes(node), reference[node])
        built = dict(ev._bases)
        assert (
            built
            or len(ev._base_qis) == 0
            or all(not any(node[j] for j in ev._base_qis) for node in nodes)
        )
        for key, base in built.items():  # and every node above each base, from it
            for node in nodes:
                if all(node[j] >= level for j, level in zip(ev._base_qis, key, strict=True)):
                    counted = ev._count(base, node)
                    _same(counted, reference[node])
                    _same(ev.in_units(counted), ev.in_units(reference[node]))
        if with_units and ev.units is not None:  # persons by brute force
            units = summary.unit_codes
            assert units is not None
            for node in nodes:
                direct = ev.classes(node)
                row_class = direct.row_classes()
                view = ev.in_units(direct)
                for c in range(direct.n_classes):
                    assert view.sizes[c] == np.unique(units[row_class == c]).shape[0]


def _spanning() -> tuple[Summary, dict[str, Hierarchy]]:
    """Person p0 visits with zips z0 and z1 (one group at level 1) and the same SA; p1,
    p2 once each."""
    zips = build_grouping("zip", [{"z0": "g0", "z1": "g0", "z2": "g1"}, {"g0": "*", "g1": "*"}])
    age = build_grouping("age", [{"a0": "b0", "a1": "b0"}, {"b0": "*"}])
    sex = build_grouping("sex", [{"f": "*", "m": "*"}])
    hier = {"zip": zips, "age": age, "sex": sex}
    df = pd.DataFrame(
        {
            "zip": ["z0", "z1", "z0", "z2"],
            "age": ["a0", "a0", "a1", "a1"],
            "sex": ["f", "f", "m", "m"],
            "S": ["x", "x", "y", "x"],
            "P": ["p0", "p0", "p1", "p2"],
        }
    )
    return Summary.from_frame(df, ["zip", "age", "sex"], "S", hier, unit="P"), hier


def test_a_person_spanning_two_rows_is_counted_once_from_a_base() -> None:
    summary, hier = _spanning()
    ev = Evaluator(summary, hier)
    assert ev._base_qis == (0, 1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)
        classes = ev.classes((2, 1, 1))  # regroups the base at zip 2, age 1
    assert (2, 1) in ev._bases
    view = ev.in_units(classes)
    # one class of persons {p0, p1, p2}: p0 once although two of its rows merged
    assert view.sizes.tolist() == [3]
    assert dict(zip(view.cell_sa.tolist(), view.cell_count.tolist(), strict=True)) == {0: 2, 1: 1}


def test_the_check_says_no_when_a_base_treats_every_person_as_simple() -> None:
    """A base that merges the rows of persons with several tuples as if they were simple
    (summing their rows as distinct pairs) counts p0 twice: the comparison catches it."""
    summary, hier = _spanning()
    real_regroup = bases.regroup

    def wrong(base: bases.Base, *args: object, **kwargs: object) -> bases.Base:
        n = base.n_rows
        simple = bases.Base(
            base.levels,
            base.labels,
            base.sa,
            base.counts,
            np.ones(n) if base.singles is not None else None,
            np.ones(n) if base.first is not None else None,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
        )
        return real_regroup(simple, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)
        patch.setattr(transformation, "regroup", wrong)
        ev = Evaluator(summary, hier)
        bad = ev.classes((2, 1, 1))
    good = _from_summary(ev, (2, 1, 1))
    with pytest.raises(AssertionError):
        _same(ev.in_units(bad), ev.in_units(good))
    assert ev.in_units(bad).sizes.tolist() == [4]


def test_bases_are_bounded_and_unhelpful_ones_are_not_kept() -> None:
    summary, hier = _spanning()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)
        patch.setattr(transformation, "BASE_BYTES", 1)
        patch.setattr(transformation, "BASE_SHARE", 0)  # nothing fits
        ev = Evaluator(summary, hier)
        for node in itertools.product((0, 1, 2), (0, 1, 2), (0, 1)):
            _same(ev.classes(node), _from_summary(ev, node))
        assert not ev._bases and ev._base_bytes == 0
        patch.setattr(transformation, "BASE_SHARE", 4)  # the budget grows with the root
        ev = Evaluator(summary, hier)
        for node in itertools.product((0, 1, 2), (0, 1, 2), (0, 1)):
            _same(ev.classes(node), _from_summary(ev, node))
        assert ev._bases and 0 < ev._base_bytes <= 4 * ev._root().nbytes
    ev = Evaluator(summary, hier)  # default gain: four rows do not shrink at age 1
    ev.classes((0, 1, 0))
    assert not ev._bases and (0, 1) in ev._no_gain
    ev.classes((1, 0, 0))  # three rows at zip 1 (p0's two merge): kept
    assert list(ev._bases) == [(1, 0)] and ev._bases[(1, 0)].n_rows == 3


def _five_qis(seed: int) -> tuple[Summary, dict[str, Hierarchy]]:
    """Visits with two QIs of many values (the base QIs) and three of few (coded jointly
    with the SA), persons with one to three rows."""
    rng = np.random.default_rng(seed)
    sizes = {"zip": 12, "age": 9, "sex": 2, "race": 2, "edu": 3}
    hier = {}
    for q, size in sizes.items():
        first = {f"{q}{i}": f"{q}g{i // 3}" for i in range(size)}
        hier[q] = build_grouping(q, [first, dict.fromkeys(set(first.values()), "*")])
    n = 600
    data = {q: [f"{q}{v}" for v in rng.integers(0, size, n)] for q, size in sizes.items()}
    data["S"] = [f"s{v}" for v in rng.integers(0, 2, n)]
    data["P"] = [f"p{v}" for v in rng.integers(0, 300, n)]
    return Summary.from_frame(pd.DataFrame(data), list(sizes), "S", hier, unit="P"), hier


@pytest.mark.parametrize("use_sa", [True, False])
def test_jointly_coded_rows_have_the_codes_of_the_per_qi_sum(use_sa: bool) -> None:
    """Codes of the rows of every base at every node above it, with the small QIs (and
    the SA) coded jointly, equal the per-QI sum of label ids times strides (the summary
    rows' labels directly; other bases through an evaluator without joint coding); the
    classes (records and persons), counted with records and single rows summed in one
    packed weight, equal those of an evaluator that codes and sums them apart."""
    summary, hier = _five_qis(7)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)
        ev = Evaluator(summary, hier, use_sa=use_sa)
        patch.setattr(transformation, "JOINT_SPACE", 0)
        plain = Evaluator(summary, hier, use_sa=use_sa)
        plain._pack_shift = 0  # counts and singles summed apart
        assert ev._base_qis == (0, 1) and ev._joint_qis == (2, 3, 4)
        assert ev._joint_sa == use_sa and plain._joint_qis == ()
        assert ev._pack_shift == summary.n_records.bit_length()
        nodes = _nodes(ev)
        for node in nodes:
            _same(ev.classes(node), plain.classes(node))
            _same(ev.in_units(ev.classes(node)), plain.in_units(plain.classes(node)))
    kept = [ev._root(), *ev._bases.values()]
    assert ev._bases and all(base.joint and base.packed for base in kept)
    summary_base = ev._base_of_summary()
    for node in nodes:
        codes, radices, space = ev._codes(summary_base, node)
        stride, expected = ev.sa_radix, ev._row_sa.astype(np.int64).copy()
        for j in range(len(node) - 1, -1, -1):
            expected += ev._labels_of_rows(j, node[j]).astype(np.int64) * stride
            stride *= radices[j]
        assert space == stride
        np.testing.assert_array_equal(codes, expected)
    for key, base in ev._bases.items():
        for node in nodes:
            if all(node[j] >= level for j, level in zip(ev._base_qis, key, strict=True)):
                codes, radices, space = ev._codes(base, node)
                want, want_radices, want_space = plain._codes(base, node)
                np.testing.assert_array_equal(codes, want)
                assert (radices, space) == (want_radices, want_space)


def _repeat_visits(seed: int) -> tuple[pd.DataFrame, dict[str, Hierarchy]]:
    """The demo's shape: most persons visit several times with the same QIs and several
    diagnoses (simple persons with several SA values), a few move (spanning persons)."""
    rng = np.random.default_rng(seed)
    sizes = {"zip": 6, "age": 5, "sex": 2}
    hier = {}
    for q, size in sizes.items():
        first = {f"{q}{i}": f"{q}g{i // 2}" for i in range(size)}
        hier[q] = build_grouping(q, [first, dict.fromkeys(set(first.values()), "*")])
    rows: list[dict[str, str]] = []
    for p in range(150):
        qis = {q: f"{q}{rng.integers(0, size)}" for q, size in sizes.items()}
        for _ in range(int(rng.integers(1, 5))):
            if p % 10 == 0:  # every tenth person moves between visits
                qis = {**qis, "zip": f"zip{rng.integers(0, sizes['zip'])}"}
            rows.append({**qis, "S": f"s{rng.integers(0, 3)}", "P": f"p{p}"})
    return pd.DataFrame(rows), hier


@pytest.mark.parametrize("use_sa", [True, False])
def test_the_root_merges_simple_persons_and_counts_as_the_summary_rows(use_sa: bool) -> None:
    """With repeat visits the root base has fewer rows than the summary (simple persons
    merged per (QI tuple, SA)); every node counted from it equals the count from the
    summary rows, records and persons, and persons equal a brute-force count."""
    df, hier = _repeat_visits(3)
    qis = ["zip", "age", "sex"]
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    ev = Evaluator(summary, hier, use_sa=use_sa)
    root, rows = ev._root(), ev._base_of_summary()
    assert root is not rows and root.n_rows <= transformation.BASE_GAIN * rows.n_rows
    assert root.multi.shape[0] > 0  # the persons who moved stay (cell, person) pairs
    units = summary.unit_codes
    assert units is not None
    for node in _nodes(ev):
        counted = ev._count(root, node)
        _same(counted, _from_summary(ev, node))
        view = ev.in_units(counted)
        _same(view, ev.in_units(_from_summary(ev, node)))
        row_class = ev.classes(node).row_classes()
        for c in range(view.n_classes):
            assert view.sizes[c] == np.unique(units[row_class == c]).shape[0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, (1 << 40) - 1), max_size=300),
    st.sampled_from([0, 1 << 41]),
)
def test_grouped_codes_are_numpys_unique_whether_flagged_or_hashed(
    values: list[int], dense_limit: int
) -> None:
    """Both ways of grouping (a flag array over the key space, or a hash table) give the
    sorted distinct codes and each code's index among them."""
    codes = np.array(values, dtype=np.int64)
    space = 1 << 40
    if dense_limit:  # a flag array needs a small space: use the codes' own range
        codes = codes % 4096
        space = 4096
    present, inverse = bases.group_codes(codes, space, dense_limit)
    expected, expected_inverse = np.unique(codes, return_inverse=True)
    np.testing.assert_array_equal(present, expected)
    np.testing.assert_array_equal(inverse, expected_inverse)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 600), st.integers(1, 5), st.integers(0, 3)), max_size=300),
    st.integers(601, 2000),
)
def test_dense_sums_are_the_distinct_codes_and_their_weights_summed(
    rows: list[tuple[int, int, int]], space: int
) -> None:
    """One bincount over the key space per weight gives numpy's distinct codes and each
    one's sums (the first weight positive: a record count; the others may be zero)."""
    codes = np.array([r[0] for r in rows], dtype=np.int64)
    counts = np.array([r[1] for r in rows], dtype=np.float64)
    other = np.array([r[2] for r in rows], dtype=np.float32)
    present, sums = bases.dense_sums(codes, space, [counts, other])
    expected, inverse = np.unique(codes, return_inverse=True)
    np.testing.assert_array_equal(present, expected)
    np.testing.assert_array_equal(sums[0], np.bincount(inverse, counts, len(expected)))
    np.testing.assert_array_equal(sums[1], np.bincount(inverse, other, len(expected)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(visit_tables(), st.booleans(), st.booleans())
def test_classes_summed_over_the_key_space_equal_those_summed_by_index(
    table: tuple[pd.DataFrame, dict[str, Hierarchy]], use_sa: bool, with_units: bool
) -> None:
    """A node's cells summed by one bincount over its key space (``DIRECT_FACTOR``) are
    those summed through each row's cell index (``group_codes``): records, single rows,
    first rows and the (cell, person) pairs of persons with several rows, from the summary,
    from the root and from the bases regrouped by either way; and so are the class sizes
    of the search's k check."""
    df, hier = table
    qis = ["q0", "q1", "q2"]
    summary = Summary.from_frame(df, qis, "S", hier, unit="P" if with_units else None)
    counted: dict[int, list[object]] = {}
    for factor in (0, 1 << 30):  # never, always over the key space
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bases, "DIRECT_FACTOR", factor)  # counts and regrouping alike
            patch.setattr(transformation, "BASE_GAIN", 1.0)  # every base kept
            ev = Evaluator(summary, hier, use_sa=use_sa)
            got: list[object] = []
            for node in _nodes(ev):
                for base in (ev._base_of_summary(), ev._root()):
                    got.append(ev._count(base, node))
                got.append(ev.class_sizes(node))
                got.append(ev.classes(node))  # from a base regrouped for it
            counted[factor] = got
    for plain, direct in zip(counted[0], counted[1 << 30], strict=True):
        if isinstance(plain, EquivalenceClasses):
            assert isinstance(direct, EquivalenceClasses)
            _same(direct, plain)
        elif plain is None:
            assert direct is None
        else:
            assert isinstance(plain, tuple) and isinstance(direct, tuple)
            for a, b in zip(plain, direct, strict=True):
                np.testing.assert_array_equal(a, b)


def test_class_sizes_summed_over_the_key_space_keep_records_and_persons_apart() -> None:
    """Persons with several rows of one QI tuple: a class's records and persons differ,
    and both ways of summing give each its own."""
    zips = build_grouping("zip", [{"z0": "g0", "z1": "g0", "z2": "g1"}, {"g0": "*", "g1": "*"}])
    age = build_grouping("age", [{"a0": "b0", "a1": "b0"}, {"b0": "*"}])
    hier = {"zip": zips, "age": age}
    df = pd.DataFrame(
        {
            "zip": ["z0", "z0", "z0", "z1", "z2", "z2"],
            "age": ["a0", "a0", "a0", "a1", "a1", "a1"],
            "S": ["x", "y", "x", "x", "y", "y"],
            "P": ["p0", "p0", "p0", "p1", "p2", "p3"],
        }
    )
    summary = Summary.from_frame(df, ["zip", "age"], "S", hier, unit="P")
    sizes = {}
    for factor in (0, 1 << 30):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bases, "DIRECT_FACTOR", factor)
            ev = Evaluator(summary, hier)
            sizes[factor] = [ev.class_sizes(node) for node in _nodes(ev) if any(node)]
    assert all(s is not None for s in sizes[0])
    for plain, direct in zip(sizes[0], sizes[1 << 30], strict=True):
        assert plain is not None and direct is not None
        assert sorted(zip(*plain, strict=True)) == sorted(zip(*direct, strict=True))
    records, persons = sizes[0][-1]  # every QI at its top: one class
    assert (int(records.sum()), int(persons.sum())) == (6, 4)
