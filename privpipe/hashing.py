"""64-bit hashes of strings computed on their UTF-8 bytes in numpy.

pandas hashes a string column through one Python object per distinct value (SipHash on
each), about 0.25 s per million person ids; every batch sees most persons again, so the
summary, the profile, the verifiers and the DP steps each paid it. :func:`string_hashes`
reads the Arrow buffers of the column instead (offsets and bytes, no object per value)
and runs FNV-1a over the bytes, all strings at once, one byte position per step, then
the length and a SplitMix64 finaliser for avalanche: 0.06–0.09 s per million short ids
against pandas' 0.25–0.42 s (measured on the 2-vCPU development VM).

The hashes are used only inside one run (distinct counts, person identities for
bounding and counting in persons, shards): every worker computes the same value, nothing
keyed by them is kept between runs. Two different strings collide with probability about
2^-64 per pair (below 3·10^-6 for 10^7 distinct ids); a collision can only merge two
persons or two values, which makes bounding stricter and a distinct count one lower.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "MISSING_HASH",
    "arrow_strings",
    "combine_hashes",
    "is_text",
    "string_hashes",
    "string_hashes_and_codes",
    "string_hashes_by_value",
    "value_hashes",
]

U64 = npt.NDArray[np.uint64]

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_LENGTH_MIX = np.uint64(0x9E3779B97F4A7C15)
MISSING_HASH = np.uint64(0x6A09E667F3BCC909)  # a missing value (null), never a string's
_MASKED_SPAN = 16  # lengths differing by more: longest-first prefixes instead of masks


def _mix(h: U64) -> U64:
    """SplitMix64's finaliser (in place): every input bit reaches every output bit."""
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def arrow_strings(values: Any) -> pa.Array:
    """The column as one Arrow (large_)string array (zero-copy for Arrow-backed columns; a
    column of nothing but missing values is a string array of nulls); TypeError when the
    values are not strings."""
    if isinstance(values, pd.Series | pd.Index):
        values = values.array
    array = pa.array(values, from_pandas=True)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_null(array.type):  # nothing but missing values (or none at all)
        array = array.cast(pa.string())
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise TypeError(f"string_hashes needs strings, got {array.type}")
    return array


def _fnv_1a(
    h: U64,
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
) -> None:
    """FNV-1a over each string's bytes, all strings at once (``h`` in place). Positions
    every string has are one gather each; the rest go over the strings still going: a
    mask while lengths differ little (ids), longest first when they differ a lot."""
    shortest, longest = int(lengths.min()), int(lengths.max())
    for i in range(shortest):
        h ^= data[starts + i]
        h *= _FNV_PRIME
    if longest == shortest:
        return
    if longest - shortest <= _MASKED_SPAN:
        last = max(len(data) - 1, 0)
        for i in range(shortest, longest):
            going = lengths > i
            step = (h ^ data[np.minimum(starts + i, last)]) * _FNV_PRIME
            np.copyto(h, step, where=going)
        return
    order = np.argsort(-lengths, kind="stable")  # longest first: the strings going at
    first = starts[order]  # position i are a prefix
    going_at = np.bincount(lengths, minlength=longest + 1)[::-1].cumsum()[::-1]
    hs = h[order]
    for i in range(shortest, longest):
        m = int(going_at[i + 1])  # strings longer than i
        part = hs[:m]
        part ^= data[first[:m] + i]
        part *= _FNV_PRIME
    h[order] = hs


def string_hashes(values: Any) -> U64:
    """A 64-bit hash of each string of a column (str / Arrow string Series, or an object
    array of str); a missing value gets :data:`MISSING_HASH`. Equal strings, equal hashes,
    whatever the column's storage or batch."""
    array = arrow_strings(values)
    n = len(array)
    _, offsets_buf, data_buf = array.buffers()
    width = np.int64 if pa.types.is_large_string(array.type) else np.int32
    raw = np.frombuffer(offsets_buf, dtype=width)[array.offset : array.offset + n + 1]
    offsets: npt.NDArray[np.int64] = raw.astype(np.int64)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    lengths = np.diff(offsets)
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    if n:
        _fnv_1a(h, data, offsets[:-1], lengths)
    h ^= lengths.astype(np.uint64) * _LENGTH_MIX
    out = _mix(h)
    if array.null_count:
        out[np.asarray(array.is_null())] = MISSING_HASH
    return out


def string_hashes_by_value(values: Any) -> U64:
    """:func:`string_hashes`, each distinct string hashed once (Arrow's dictionary
    encoding, then a gather): the same hashes, several times faster on a column of few
    distinct values (a 200k-row batch's ``race`` or ``occupation``: ~40 ms byte by byte,
    ~5 ms so), a little slower on one of distinct values (ids)."""
    return string_hashes_and_codes(values)[0]


def string_hashes_and_codes(values: Any) -> tuple[U64, npt.NDArray[np.int64], pa.Array]:
    """:func:`string_hashes_by_value` with the encoding it is made from: each row's code
    into the column's distinct strings (a missing value: their number) and those strings,
    for a caller that also counts the values."""
    encoded = pc.dictionary_encode(arrow_strings(values))
    table = np.append(string_hashes(encoded.dictionary), MISSING_HASH)
    indices = encoded.indices
    if indices.null_count:  # a missing value's index is null: the table's last entry
        indices = pc.fill_null(indices, len(table) - 1)
    codes = np.asarray(indices.to_numpy(), dtype=np.int64)
    return table[codes], codes, encoded.dictionary


def value_hashes(values: pd.Series) -> U64:
    """A 64-bit hash of each value of a column, the same for equal values in every batch:
    strings by their bytes (:func:`string_hashes`; str, Arrow or object columns of str), a
    ``uint64`` column (hashes already, e.g. the summary's person hashes) as it is, any
    other type by pandas' ``hash_pandas_object``; a missing value is :data:`MISSING_HASH`
    whatever the column's type."""
    if values.dtype == np.uint64:
        return np.asarray(values.to_numpy(), dtype=np.uint64)
    if is_text(values):
        return string_hashes(values)
    out = np.asarray(
        pd.util.hash_pandas_object(values, index=False, categorize=False), dtype=np.uint64
    ).copy()
    missing = np.asarray(values.isna(), dtype=bool)
    if missing.any():
        out[missing] = MISSING_HASH
    return out


def is_text(values: pd.Series) -> bool:
    """Whether a column is text: a string dtype (NumPy-, Python- or Arrow-backed, large or
    not) or objects that are all str (or missing)."""
    dtype = values.dtype
    if isinstance(dtype, pd.StringDtype):
        return True
    if isinstance(dtype, pd.ArrowDtype):
        return bool(
            pa.types.is_string(dtype.pyarrow_dtype) or pa.types.is_large_string(dtype.pyarrow_dtype)
        )
    return dtype.kind == "O" and pd.api.types.infer_dtype(values, skipna=True) in (
        "string",
        "empty",
    )


def combine_hashes(hashes: Sequence[npt.NDArray[np.uint64]]) -> U64:
    """Row hashes of a frame from its columns' hashes (the combination pandas'
    ``hash_pandas_object`` applies to a DataFrame's column hashes), so each column is
    hashed once per batch however many combinations it is part of."""
    out = np.zeros_like(hashes[0]) + np.uint64(0x345678)
    mult = np.uint64(1000003)
    for i, h in enumerate(hashes):
        inverse_i = len(hashes) - i
        out ^= h
        out *= mult
        mult += np.uint64(82520 + inverse_i + inverse_i)
    out += np.uint64(97531)
    return out
