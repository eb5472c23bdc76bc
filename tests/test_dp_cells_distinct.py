"""A DP release's cells labelled once per distinct combination of its key columns
(``dp.cells._cells``): every row's cell hash and the batch's cell dictionary are those of
labelling and hashing every row (``key_frame``, ``hash_keys``), whatever the columns'
types, missing values, generalising labeler or order of the rows."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest
from hypothesis import given, settings

from privpipe.dp.cells import _cells, canonical_labels, contributions, hash_keys, key_frame
from privpipe.dp.spec import DPReleaseSpec, Query, from_config_values, plan_queries


def per_row(
    batch: pd.DataFrame, spec: DPReleaseSpec, query: Query, labeler: Any
) -> tuple[npt.NDArray[np.uint64], pd.DataFrame]:
    """The reference: every row labelled and hashed, the dictionary at each cell's first row."""
    keys = key_frame(batch, spec, query, labeler)
    cell = hash_keys(keys)
    first = ~pd.Series(cell).duplicated().to_numpy()
    return cell, keys.loc[first].assign(_cell=cell[first]).reset_index(drop=True)


def spec_over(group_by: tuple[str, ...], levels: tuple[tuple[str, int], ...] = ()) -> DPReleaseSpec:
    return from_config_values(
        name="r", kind="dp_count", epsilon=1.0, delta=0.0,
        queries=[Query("r", group_by, levels)], domains={},
    )  # fmt: skip


def banded(col: str, level: int, values: pd.Series) -> npt.NDArray[np.object_]:
    """A generalising labeler: level 1 maps several values to one label (as a hierarchy
    does), missing values to ``""``, level 0 is the canonical value."""
    if level == 0:
        return canonical_labels(col, 0, values)
    text = canonical_labels(col, 0, values)
    out: npt.NDArray[np.object_] = np.array([s[:1] + "*" if s else "" for s in text], dtype=object)
    return out


CELLS = st.sampled_from(["a1", "a2", "b1", "", None, "b2", "c"])


@st.composite
def batches(draw: st.DrawFn) -> pd.DataFrame:
    n = draw(st.integers(0, 60))
    text = draw(st.lists(CELLS, min_size=n, max_size=n))
    numbers = draw(st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=n, max_size=n))
    flags = draw(st.lists(st.sampled_from(["x", "y"]), min_size=n, max_size=n))
    frame = pd.DataFrame(
        {
            "t": pd.Series(text, dtype=draw(st.sampled_from(["str", "object", "category"]))),
            "n": pd.Series(numbers, dtype="Int64"),
            "f": pd.Series(flags, dtype="category"),
        }
    )
    start = draw(st.integers(0, 5))  # a batch's index need not start at 0
    frame.index = pd.RangeIndex(start, start + n)
    return frame


@settings(max_examples=150, deadline=None)
@given(
    batch=batches(),
    group_by=st.sampled_from([(), ("t",), ("n",), ("t", "n"), ("f", "t", "n")]),
    level=st.integers(0, 1),
)
def test_cells_labelled_per_combination_equal_cells_labelled_per_row(
    batch: pd.DataFrame, group_by: tuple[str, ...], level: int
) -> None:
    levels = tuple((c, level) for c in group_by if c == "t")
    spec = spec_over(group_by, levels)
    query = spec.queries[0]
    cell, dictionary = _cells(batch, spec, query, banded)
    want_cell, want_dictionary = per_row(batch, spec, query, banded)
    np.testing.assert_array_equal(cell, want_cell)
    pd.testing.assert_frame_equal(dictionary, want_dictionary)


def test_contributions_carry_the_cells_of_every_row() -> None:
    batch = pd.DataFrame({"t": ["a1", "b1", "a1", None, "b1", "a2"] * 3})
    spec = spec_over(("t",))
    (c,) = contributions(batch, spec, plan_queries(spec))
    want_cell, want_dictionary = per_row(batch, spec, spec.queries[0], canonical_labels)
    np.testing.assert_array_equal(c.cell, want_cell)
    pd.testing.assert_frame_equal(c.dictionary, want_dictionary)
    assert len(c.dictionary) == 4  # a1, b1, missing, a2


@pytest.mark.parametrize("group_by", [("t",), ("t", "n")])
def test_a_labeler_error_is_raised_as_before(group_by: tuple[str, ...]) -> None:
    batch = pd.DataFrame({"t": ["a", "b"], "n": [1, 2]})
    spec = spec_over(group_by, (("t", 1),))
    with pytest.raises(Exception, match="level 1 needs a hierarchy"):
        _cells(batch, spec, spec.queries[0], canonical_labels)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), by=st.sampled_from([("f",), ("t", "n"), ("n",)]))
def test_partition_groups_hashed_per_distinct_group_equal_per_row(
    batch: pd.DataFrame, by: tuple[str, ...]
) -> None:
    batch = batch.assign(pid=[f"p{i % 7}" for i in range(len(batch))])
    spec = from_config_values(
        name="r", kind="dp_count", epsilon=1.0, delta=0.0, queries=[Query("r")], domains={},
        unit="pid", partition_by=by,
    )  # fmt: skip
    (c,) = contributions(batch, spec, plan_queries(spec))
    assert c.group is not None
    np.testing.assert_array_equal(c.group, hash_keys(batch[list(by)].astype(object)))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), max_size=300),
    st.sampled_from([1, 2, 3, 16, 255, 70_000]),
)
def test_split_by_shard_keeps_each_shard_in_input_order(units: list[int], shards: int) -> None:
    """Every row once, in the shard of its person, each shard's rows in input order."""
    from privpipe.dp.cells import shard_of, split_by_shard

    unit = np.array(units, dtype=np.uint64)
    parts = split_by_shard(unit, shards)
    want = shard_of(unit, shards)
    assert [s for s, _ in parts] == sorted(set(want.tolist()))
    for s, rows in parts:
        assert rows.tolist() == np.flatnonzero(want == s).tolist()
    assert sum(len(rows) for _, rows in parts) == len(units)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), level=st.integers(0, 1))
def test_combinations_shared_by_a_batchs_releases_give_their_own_cells(
    batch: pd.DataFrame, level: int
) -> None:
    """The key columns' combinations kept for the batch's other queries and releases
    (``contributions(..., combinations=)``) give each release the cells it gets alone."""
    specs = [spec_over(("t",), (("t", level),)), spec_over(("t", "n")), spec_over(("t",))]
    shared: dict = {}
    for spec in specs:
        together = contributions(batch, spec, plan_queries(spec), banded, None, shared)
        alone = contributions(batch, spec, plan_queries(spec), banded)
        for a, b in zip(together, alone, strict=True):
            np.testing.assert_array_equal(a.cell, b.cell)
            pd.testing.assert_frame_equal(a.dictionary, b.dictionary)
    # each key tuple's combinations, and each column's own (several columns are grouped
    # from those: a column is factorised once per batch)
    assert set(shared) == {("t",), ("t", "n"), ("n",)}


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", None]),
            st.sampled_from(["x", "y", None]),
            st.sampled_from([1, 2, 3]),
        ),
        max_size=40,
    ),
    orders=st.permutations([("s",), ("t",), ("s", "t"), ("t", "s", "n"), ("n", "s")]),
)
def test_combinations_are_numbered_by_first_row_however_they_are_shared(
    rows: list[tuple[Any, Any, int]], orders: list[tuple[str, ...]]
) -> None:
    """Each row's combination of the key columns (missing a value of its own), numbered
    in order of first row, and each one's first row: as pandas' grouping gives them, for
    one column or several, alone or built from the columns' own combinations kept for the
    batch's other queries (in any order of asking)."""
    from privpipe.dp.cells import _combinations, _combinations_of

    batch = pd.DataFrame(
        {
            "s": pd.Series([r[0] for r in rows], dtype="str"),
            "t": pd.Series([r[1] for r in rows], dtype=object),
            "n": pd.array([r[2] for r in rows], dtype="Int64"),
        }
    )
    known: dict[Any, Any] = {}
    for cols in orders:
        ids = batch.groupby(list(cols), sort=False, dropna=False).ngroup().to_numpy()
        first = pd.Series(np.arange(len(batch))).groupby(ids).first().to_numpy()
        for got in (_combinations(batch, cols), _combinations_of(batch, cols, known)):
            np.testing.assert_array_equal(got[0], ids)
            np.testing.assert_array_equal(got[1], first.astype(np.int64))
