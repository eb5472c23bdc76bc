"""Recoding a batch (``Recoding.apply``): each QI becomes a Categorical over the release's
labels (ids per row, each label once), with the same cells as the labels looked up; and
the index that finds each row's raw QI tuple (``_TupleIndex``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.anonymity.hierarchy import SUPPRESSED, Hierarchy
from privpipe.anonymity.recoding import Recoding, _TupleIndex

VALUES = ["a", "b", "c", "d"]


def _hierarchy() -> Hierarchy:
    rows = [[v, "ab" if v in "ab" else "cd", "*"] for v in VALUES]
    return Hierarchy("x", np.array(rows, dtype=object))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.sampled_from(VALUES), min_size=0, max_size=30),
    labels=st.lists(st.sampled_from(["ab", "cd", "1", "=x", ""]), min_size=4, max_size=4),
    suppressed=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_apply_gives_the_labels_as_categoricals(
    rows: list[str], labels: list[str], suppressed: list[bool]
) -> None:
    hierarchy = _hierarchy()
    codes = hierarchy.encode(VALUES).reshape(-1, 1)
    recoding = Recoding(
        ("x",), codes, np.array(labels, dtype=object).reshape(-1, 1), suppressed, {}
    )
    frame = pd.DataFrame({"x": pd.array(rows, dtype="str"), "y": np.arange(len(rows))})
    out, masked = recoding.apply(frame, {"x": hierarchy})
    assert isinstance(out["x"].dtype, pd.CategoricalDtype)
    assert out["x"].cat.categories.is_unique
    expected = [
        SUPPRESSED if suppressed[VALUES.index(v)] else labels[VALUES.index(v)] for v in rows
    ]
    assert out["x"].astype(str).tolist() == expected
    assert masked.tolist() == [suppressed[VALUES.index(v)] for v in rows]
    assert out["y"].tolist() == list(range(len(rows)))  # other columns as they were
    # a categorical input (the rows expanded from a frequency table) recodes the same
    again, _ = recoding.apply(frame.astype({"x": "category"}), {"x": hierarchy})
    assert again["x"].astype(str).tolist() == expected


def test_labels_not_distinct_as_strings_stay_strings() -> None:
    """Two label objects with one string (1 and "1") cannot be two categories: that QI is
    recoded to plain strings instead, with the same cells."""
    hierarchy = _hierarchy()
    codes = hierarchy.encode(VALUES).reshape(-1, 1)
    labels = np.array([1, "1", "cd", "cd"], dtype=object).reshape(-1, 1)
    recoding = Recoding(("x",), codes, labels, [False] * 4, {})
    out, _ = recoding.apply(pd.DataFrame({"x": pd.array(VALUES, dtype="str")}), {"x": hierarchy})
    assert not isinstance(out["x"].dtype, pd.CategoricalDtype)
    assert out["x"].tolist() == ["1", "1", "cd", "cd"]


@settings(max_examples=80, deadline=None)
@given(
    tuples=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=25),
    queries=st.lists(st.tuples(st.integers(-2, 7), st.integers(-1, 5)), max_size=40),
    repeated=st.booleans(),
)
def test_tuple_index_locates_like_a_dictionary(
    tuples: list[tuple[int, int]], queries: list[tuple[int, int]], repeated: bool
) -> None:
    """The row of each queried tuple, -1 for an absent one, whatever the order, repeats
    and codes outside the indexed ranges (negative, or above a column's largest code);
    indexed tuples that repeat give the first row of each; the same after pickling."""
    import pickle

    indexed = tuples if repeated else list(dict.fromkeys(tuples))
    index = _TupleIndex.build(np.array(indexed, dtype=np.int64))
    assert index.unique == (len(set(indexed)) == len(indexed))
    expected = [indexed.index(q) if q in indexed else -1 for q in queries]
    array = np.array(queries, dtype=np.int64).reshape(-1, 2)
    assert index.locate(array).tolist() == expected
    columns = [np.ascontiguousarray(array[:, j]) for j in range(2)]  # a batch's codes
    assert index.locate_columns(columns, len(queries)).tolist() == expected
    shipped = pickle.loads(pickle.dumps(index))  # as a side input
    assert shipped.locate_columns(columns, len(queries)).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(
        st.tuples(st.sampled_from(["ab", "cd", "1", ""]), st.sampled_from(["p", "q", "*"])),
        min_size=4,
        max_size=4,
    ),
    suppressed=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_label_factors_give_back_every_tuples_labels(
    labels: list[tuple[str, str]], suppressed: list[bool]
) -> None:
    """``label_factors``: per QI, ids and distinct labels (first appearance, suppressed
    tuples' ``*`` included) that give back each tuple's published label; factorised once
    (the same object every call), and the recode step's side input uses the same ids."""
    hierarchy = _hierarchy()
    codes = np.stack([hierarchy.encode(VALUES), hierarchy.encode(VALUES[::-1])], axis=1)
    recoding = Recoding(("x", "y"), codes, np.array(labels, dtype=object), suppressed, {})
    factors = recoding.label_factors()
    assert recoding.label_factors() is factors
    for j, (ids, names) in enumerate(factors):
        assert names[ids].tolist() == recoding.labels[:, j].tolist()
        assert len(set(names.tolist())) == len(names)
        assert names.tolist() == list(dict.fromkeys(recoding.labels[:, j].tolist()))
    recoder = recoding.recoder()
    for (ids, names), rec_ids, rec_names in zip(
        factors, recoder.label_ids, recoder.label_names, strict=True
    ):
        assert np.array_equal(ids, rec_ids) and names.tolist() == rec_names.tolist()


@settings(max_examples=60, deadline=None)
@given(
    n_tuples=st.integers(0, 12),
    distinct=st.lists(
        st.sampled_from(["ab", "cd", "*", "1", 1, 1.0, "", "x"]), min_size=1, max_size=5
    ),
    data=st.data(),
)
def test_from_label_ids_is_the_recoding_of_those_labels(
    n_tuples: int, distinct: list[object], data: st.DataObject
) -> None:
    """``Recoding.from_label_ids`` (a full-domain transformation's label ids at its
    levels) equals the recoding made from the labels it names: the same labels, ``*``
    where suppressed, and the same ``label_factors`` (ids and distinct labels in order of
    first appearance, equal labels one id: what factorising the labels gives), also with
    repeated or equal-comparing labels among the distinct ones and unused ones."""
    names = np.array(distinct, dtype=object)
    ids = np.array(
        data.draw(
            st.lists(st.integers(0, len(distinct) - 1), min_size=n_tuples, max_size=n_tuples)
        ),
        dtype=np.int64,
    )
    suppressed = data.draw(st.lists(st.booleans(), min_size=n_tuples, max_size=n_tuples))
    codes = np.stack([np.arange(n_tuples), np.zeros(n_tuples, dtype=np.int64)], axis=1)
    other = np.zeros(n_tuples, dtype=np.int64)
    y_names = np.array(["*"], dtype=object)
    made = Recoding.from_label_ids(
        ("x", "y"), codes, [ids, other], [names, y_names], suppressed, {}
    )
    labels = (
        np.stack([names[ids], y_names[other]], axis=1) if n_tuples else np.empty((0, 2), object)
    )
    plain = Recoding(("x", "y"), codes, labels, suppressed, {})
    assert made.labels.tolist() == plain.labels.tolist()
    for (ids_a, names_a), (ids_b, names_b) in zip(
        made.label_factors(), plain.label_factors(), strict=True
    ):
        assert ids_a.dtype == ids_b.dtype and np.array_equal(ids_a, ids_b)
        # equal labels of different types (1 and 1.0) merge into whichever comes first
        assert [str(v) for v in names_a] == [str(v) for v in names_b] or (
            pd.Index(names_a).equals(pd.Index(names_b))
        )
    assert np.array_equal(made.suppressed, plain.suppressed)
    assert made.locate(codes).tolist() == list(range(n_tuples))


def test_from_label_ids_refuses_bad_ids_and_is_immutable() -> None:
    codes = np.array([[0], [1]])
    names = np.array(["a", "b"], dtype=object)
    with pytest.raises(ValueError, match="index the distinct labels"):
        Recoding.from_label_ids(("x",), codes, [np.array([0, 2])], [names], [False, False], {})
    with pytest.raises(ValueError, match="one entry per tuple"):
        Recoding.from_label_ids(("x",), codes, [np.array([0])], [names], [False, False], {})
    recoding = Recoding.from_label_ids(
        ("x",), codes, [np.array([1, 0])], [names], [False, True], {}
    )
    assert recoding.labels.tolist() == [["b"], ["*"]]
    with pytest.raises(AttributeError, match="immutable"):
        recoding.codes = codes  # type: ignore[misc]
