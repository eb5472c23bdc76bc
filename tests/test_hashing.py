"""privpipe.hashing: byte-wise string hashes, the same whatever the column's storage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from privpipe.hashing import MISSING_HASH, string_hashes, string_hashes_by_value

MASK = (1 << 64) - 1


def reference(value: str | None) -> int:
    """FNV-1a over the UTF-8 bytes, the length, SplitMix64's finaliser: one value at a
    time in Python ints (the definition the vectorised code must match)."""
    if value is None:
        return int(MISSING_HASH)
    data = value.encode("utf-8")
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    h ^= (len(data) * 0x9E3779B97F4A7C15) & MASK
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & MASK
    h ^= h >> 31
    return h


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), min_size=1, max_size=60))
def test_each_hash_is_the_reference_whatever_the_lengths(values: list[str | None]) -> None:
    # lengths all equal, within the masked span, or spread wider: every path of the code
    expected = [reference(v) for v in values]
    assert string_hashes(pd.Series(values, dtype="str")).tolist() == expected
    assert string_hashes(pa.array(values, type=pa.large_string())).tolist() == expected


def test_the_storage_does_not_change_a_hash() -> None:
    values = ["p1", "p22", "", "p1", "é", "x" * 300, None, "p22"]
    expected = [reference(v) for v in values]
    objects = np.array(values, dtype=object)
    chunked = pa.chunked_array([values[:3], values[3:]], type=pa.string())
    sliced = pa.array(["pad", *values], type=pa.string()).slice(1)  # a non-zero offset
    for column in (
        pd.Series(values, dtype="str"),
        pd.Series(values, dtype=pd.StringDtype("python")),
        objects,
        chunked,
        sliced,
        pa.array(values).dictionary_encode(),
    ):
        assert string_hashes(column).tolist() == expected


def test_missing_empty_and_padded_strings_are_apart() -> None:
    values = [None, "", "\x00", "a", "a\x00", "\x00a", "ab", "ba"]
    hashes = string_hashes(pd.Series(values, dtype="str"))
    assert len(set(hashes.tolist())) == len(values)
    assert hashes[0] == MISSING_HASH


def test_no_collision_among_many_ids_and_bits_are_balanced() -> None:
    rng = np.random.default_rng(0)
    n = 300_000
    ids = np.char.add("u", np.arange(n).astype(str)).astype(object)
    rng.shuffle(ids)
    hashes = string_hashes(ids)
    assert len(np.unique(hashes)) == n
    bits = np.unpackbits(hashes.view(np.uint8)).reshape(n, 64).mean(axis=0)
    assert np.abs(bits - 0.5).max() < 0.01  # every output bit used (the finaliser mixes)


def test_refuses_what_is_not_strings() -> None:
    import pytest

    with pytest.raises(TypeError, match="needs strings"):
        string_hashes(pd.Series([1, 2, 3]))


def test_columns_of_nothing_but_missing_values_or_no_rows() -> None:
    import pytest

    from privpipe.anonymity.summary import unit_hashes
    from privpipe.errors import InputDataError

    assert string_hashes(pd.Series([None, None], dtype=object)).tolist() == [MISSING_HASH] * 2
    assert string_hashes(np.array([], dtype=object)).size == 0
    assert unit_hashes(pd.Series([], dtype=object), "pid").size == 0
    for column in (
        pd.Series([None, None], dtype=object),
        pd.Series(["p1", None], dtype="str"),
        pd.Series(["p1", ""], dtype=object),
        pd.Series([7, None], dtype="Int64"),
        pd.Series([7.0, np.nan]),
    ):
        with pytest.raises(InputDataError, match=r"'pid' \(schema.privacy_unit\): [12] rows"):
            unit_hashes(column, "pid")


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["", "a", "é"])), max_size=60
    ),
    st.sampled_from(["str", "object", "large"]),
    st.integers(0, 5),
)
def test_hashes_by_value_are_the_hashes_of_every_string(
    values: list[str | None], storage: str, offset: int
) -> None:
    """Each distinct string hashed once (dictionary-encoded) gives every row the hash of
    its own bytes, missing values included, whatever the column's storage or offset."""
    if storage == "large":
        column: object = pa.array(values, type=pa.large_string()).slice(min(offset, len(values)))
    else:
        series = pd.Series(values, dtype="str" if storage == "str" else object)
        column = series.iloc[min(offset, len(values)) :]
    assert string_hashes_by_value(column).tolist() == string_hashes(column).tolist()


def test_the_profile_hashes_few_distinct_values_once_each() -> None:
    """The profile's column hash is the same whichever way it is computed."""
    from privpipe.transforms.profile import _hash

    few = pd.Series(["a", "b", None] * 3000, dtype="str")  # repeats: by value
    ids = pd.Series([f"P{i}" for i in range(9000)], dtype="str")  # distinct: byte by byte
    for column in (few, ids, few.astype(object)):
        assert _hash(column).tolist() == string_hashes(column).tolist()
