"""Sort-based distinct values equal np.unique's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.anonymity.arrays import (
    sorted_unique,
    sum_by_key,
    unique_counts,
    unique_first,
    unique_first_inverse,
)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(-(2**62), 2**62), max_size=300), small=st.booleans())
def test_matches_numpy_unique(values: list[int], small: bool) -> None:
    array = np.array([v % 7 for v in values] if small else values, dtype=np.int64)
    uniq, first, inverse = unique_first_inverse(array)
    want = np.unique(array, return_index=True, return_inverse=True)
    for got, expected in zip((uniq, first, inverse), want, strict=True):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    ordered = np.sort(array)  # in order already: no sort, the same answer
    in_order = np.unique(ordered, return_index=True, return_inverse=True)
    for got, expected in zip(unique_first_inverse(ordered), in_order, strict=True):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert np.array_equal(sorted_unique(array), np.unique(array))
    hashes = array.astype(np.uint64)
    assert np.array_equal(sorted_unique(hashes), np.unique(hashes))
    uniq, first = unique_first(array)
    assert np.array_equal(uniq, want[0]) and np.array_equal(first, want[1])
    uniq, counts = unique_counts(array)
    expected_uniq, expected_counts = np.unique(array, return_counts=True)
    assert np.array_equal(uniq, expected_uniq) and np.array_equal(counts, expected_counts)
    weights = np.arange(array.shape[0], dtype=np.int64)
    keys, sums = sum_by_key(array, weights)
    inverse = np.unique(array, return_inverse=True)[1]
    assert np.array_equal(keys, expected_uniq)
    assert np.array_equal(sums, np.bincount(inverse, weights=weights).astype(np.int64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 70_000), max_size=200), st.sampled_from([16, 1 << 16, 70_001]))
def test_small_key_order_is_the_stable_argsort(values: list[int], bound: int) -> None:
    """Keys below ``bound`` sorted as 16-bit keys when they fit: numpy's stable order."""
    from privpipe.anonymity.arrays import small_key_order

    keys = np.array([v % bound for v in values], dtype=np.int64)
    want = np.argsort(keys, kind="stable")
    assert small_key_order(keys, bound).tolist() == want.tolist()


@settings(max_examples=60, deadline=None)
@given(
    radices=st.lists(st.integers(1, 5_000), min_size=1, max_size=4),  # <= 52 bits
    n=st.integers(0, 200_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_packed_rows_unpack_to_themselves_and_sort_like_the_rows(
    radices: list[int], n: int, seed: int
) -> None:
    """Codes packed bit by bit (first column most significant) come back unchanged, and
    the keys' order is the rows' lexicographic order (across the packing's chunks)."""
    from privpipe.anonymity.arrays import KEY_BITS, bit_widths, pack_rows, unpack_rows

    rng = np.random.default_rng(seed)
    n = n % 3 if n < 100_000 else n  # mostly tiny, sometimes more than one chunk
    codes = np.stack([rng.integers(0, r, n) for r in radices], axis=1).astype(np.int32)
    widths = bit_widths(radices)
    assert sum(widths) <= KEY_BITS
    keys = pack_rows(codes, widths)
    np.testing.assert_array_equal(unpack_rows(keys, widths), codes)
    by_key = codes[np.argsort(keys, kind="stable")]
    by_rows = codes[np.lexsort(codes.T[::-1])] if n else codes
    np.testing.assert_array_equal(by_key, by_rows)


def test_rows_of_no_columns_pack_to_one_key() -> None:
    from privpipe.anonymity.arrays import pack_rows, unpack_rows

    keys = pack_rows(np.zeros((4, 0), dtype=np.int32), [])
    assert keys.tolist() == [0, 0, 0, 0] and unpack_rows(keys, []).shape == (4, 0)


def test_rows_too_wide_for_a_key_are_refused() -> None:
    from privpipe.anonymity.arrays import pack_rows

    codes = np.zeros((3, 7), dtype=np.int32)
    try:
        pack_rows(codes, [9] * 7)
    except ValueError as e:
        assert "63 bits" in str(e)
    else:
        raise AssertionError("63 bits were packed into a 62-bit key")


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 2), st.integers(-9, 9)),
        min_size=1,
        max_size=120,
    )
)
def test_a_summary_of_persons_knows_its_dense_units_as_if_counted_again(
    rows: list[tuple[int, int, int, int]],
) -> None:
    """``from_codes`` hands its summary the persons' dense ids it grouped by: the ids and
    first rows a fresh count of the summary's unit hashes gives."""
    from privpipe.anonymity.summary import Summary

    table = np.array(rows, dtype=np.int64)
    summary = Summary.from_codes(
        ("a", "b"), table[:, :2], table[:, 2], sa_domain=3, unit_codes=table[:, 3] * 7919
    )
    given_units = summary.dense_units()
    fresh = Summary(
        summary.qi_names, summary.qi_codes, summary.sa_codes, summary.counts, 3,
        unit_codes=summary.unit_codes,
    )  # fmt: skip
    counted = fresh.dense_units()
    assert given_units.n_units == counted.n_units == len(set(table[:, 3].tolist()))
    assert np.array_equal(given_units.ids, counted.ids)
    assert np.array_equal(given_units.first_rows, counted.first_rows)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(-9, 9), st.integers(1, 3)),
        min_size=1,
        max_size=120,
    ),
)
def test_persons_per_sensitive_value_are_the_distinct_persons_with_it(
    rows: list[tuple[int, int, int, int]],
) -> None:
    """``sa_unit_counts``: per SA code, the distinct persons with a row of it."""
    from privpipe.anonymity.summary import Summary

    table = np.array(rows, dtype=np.int64)
    summary = Summary.from_codes(
        ("a",), table[:, :1], table[:, 1], table[:, 3], sa_domain=6, unit_codes=table[:, 2] * 7919
    )
    want = [len({p for _, s, p, _ in rows if s == code}) for code in range(6)]
    got = summary.sa_unit_counts()
    assert got.dtype == np.int64 and got.tolist() == want


@settings(max_examples=50, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 6), st.integers(-(2**62), 2**62)), max_size=80),
    spare=st.integers(0, 3),
)
def test_one_value_each_is_a_group_of_one_distinct_value(
    pairs: list[tuple[int, int]], spare: int
) -> None:
    """A group holds one value only where its distinct values number one (a group of no
    rows: none)."""
    from privpipe.anonymity.arrays import one_value_each

    n = 7 + spare
    groups = np.array([g for g, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=np.int64)
    got = one_value_each(groups, values, n)
    want = [len({v for g, v in pairs if g == k}) == 1 for k in range(n)]
    assert got.tolist() == want
