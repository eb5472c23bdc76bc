"""Sort-based distinct values equal np.unique's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from anonymity.arrays import sorted_unique, unique_first_inverse


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(-(2**62), 2**62), max_size=300), small=st.booleans())
def test_matches_numpy_unique(values: list[int], small: bool) -> None:
    array = np.array([v % 7 for v in values] if small else values, dtype=np.int64)
    uniq, first, inverse = unique_first_inverse(array)
    want = np.unique(array, return_index=True, return_inverse=True)
    for got, expected in zip((uniq, first, inverse), want, strict=True):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert np.array_equal(sorted_unique(array), np.unique(array))
    hashes = array.astype(np.uint64)
    assert np.array_equal(sorted_unique(hashes), np.unique(hashes))
