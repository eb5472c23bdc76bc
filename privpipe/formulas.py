"""Spreadsheet formula injection (CSV injection): which published CSV cells are escaped.

A spreadsheet opening a CSV runs a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or
a carriage return as a formula (``=HYPERLINK(...)``, ``@SUM(...)``, DDE). Every CSV
privpipe writes (published ``data.csv``, ``internal/`` tables) follows the OWASP rule:
such a **text** cell gets a leading ``'``, which spreadsheets show as text and hide.

Exactly which cells (README, "Outputs"):

- cells of numeric columns (integers, floats, booleans) are never touched;
- a text cell is escaped when, after its leading ``'`` characters, it starts with one of
  ``= + - @ \\t \\r`` and is not a plain decimal number (``-3``, ``+1.5``, ``-2e-3`` stay as
  they are: a spreadsheet reads them as numbers, not formulas);
- escaping adds one ``'`` in front; header cells (column names) follow the same rule.

The escape is reversible: :func:`unescape` removes one leading ``'`` exactly where
:func:`escape` added one (a cell already starting with ``'`` before a trigger gets a second),
so a reader (``reports.load_release``: the audit and the attacks) sees the values that
were computed, and ``unescape(escape(v)) == v`` for every ``v``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TRIGGERS", "escape", "escape_table", "needs_escape", "unescape", "unescape_column"]

TRIGGERS = "=+-@\t\r"
_NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_TRIGGERED = "^'*[=+\\-@\\t\\r]"  # after any leading quotes, a trigger character
_QUOTED_NUMBER = f"^'*{_NUMBER}$"
_TRIGGERED_RE = re.compile(_TRIGGERED)
_QUOTED_NUMBER_RE = re.compile(f"'*{_NUMBER}")  # fullmatch: as RE2's ^...$ (no newline)


def needs_escape(value: str) -> bool:
    """Whether a text cell gets a leading ``'`` (see the module docstring)."""
    return bool(_TRIGGERED_RE.match(value)) and not _QUOTED_NUMBER_RE.fullmatch(value)


def escape(value: Any) -> Any:
    """One cell as written (non-strings unchanged)."""
    return "'" + value if isinstance(value, str) and needs_escape(value) else value


def unescape(value: Any) -> Any:
    """One cell as read back: the value :func:`escape` was given."""
    if isinstance(value, str) and value.startswith("'") and needs_escape(value):
        return value[1:]
    return value


_FIRST = np.zeros(256, dtype=bool)  # first bytes that may need an escape: lookup table
_FIRST[np.frombuffer((TRIGGERS + "'").encode(), dtype=np.uint8)] = True


def _parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets of the array's values, rebased to 0; their bytes) from Arrow's buffers."""
    wide = pa.types.is_large_string(arr.type)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(
        offsets_buf, dtype=np.int64 if wide else np.int32, count=len(arr) + 1,
        offset=arr.offset * (8 if wide else 4),
    )  # fmt: skip
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0)
    return offsets - offsets[0], data[offsets[0] : offsets[-1]]


def _first_bytes(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """The byte at the start of every value: its first byte, or for an empty value the
    next value's (a harmless false candidate: the regexes then leave it alone)."""
    if data.size == 0:
        return np.zeros(len(offsets) - 1, dtype=np.uint8)
    first: np.ndarray = data[np.minimum(offsets[:-1], data.size - 1)]
    return first


def _prefixed(arr: pa.Array, offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> Any:
    """``arr`` with a ``'`` put in front of the values at ``rows`` (sorted), built on the
    buffers: one copy of the bytes, whatever the number of rows."""
    if arr.null_count and arr.offset:  # a sliced validity bitmap: let Arrow do it
        mask = np.zeros(len(arr), dtype=bool)
        mask[rows] = True
        quote, empty = pa.scalar("'", type=arr.type), pa.scalar("", type=arr.type)
        return pc.if_else(pa.array(mask), pc.binary_join_element_wise(quote, arr, empty), arr)
    new_data = np.insert(data, offsets[rows], ord("'"))
    added = np.zeros(len(offsets), dtype=offsets.dtype)
    added[rows + 1] = 1
    new_offsets = offsets + np.cumsum(added, dtype=offsets.dtype)
    validity = arr.buffers()[0] if arr.null_count else None
    return pa.Array.from_buffers(
        arr.type, len(arr), [validity, pa.py_buffer(new_offsets), pa.py_buffer(new_data)],
        null_count=arr.null_count,
    )  # fmt: skip


def _escape_strings(arr: pa.Array) -> pa.Array:
    """Text values escaped. The first byte of every value is checked in numpy (no value
    starts with a trigger or a quote: nothing else runs); the regexes run only on the
    distinct values among the few that do."""
    offsets, data = _parts(arr)
    rows = np.flatnonzero(_FIRST[_first_bytes(offsets, data)])
    if rows.size == 0:
        return arr
    encoded = pc.dictionary_encode(arr.take(pa.array(rows)))
    values = encoded.dictionary
    wanted = pc.and_not(
        pc.match_substring_regex(values, _TRIGGERED),
        pc.match_substring_regex(values, _QUOTED_NUMBER),
    )
    chosen = rows[pc.take(wanted, encoded.indices).fill_null(False).to_numpy(zero_copy_only=False)]
    if chosen.size == 0:
        return arr
    return _prefixed(arr, offsets, data, chosen)


def _escape_chunk(chunk: Any) -> Any:
    """One chunk of a text or dictionary-of-text column escaped (itself if unchanged)."""
    if pa.types.is_dictionary(chunk.type):
        fixed = _escape_strings(chunk.dictionary)
        if fixed is chunk.dictionary:
            return chunk
        return pa.DictionaryArray.from_arrays(chunk.indices, fixed)
    return _escape_strings(chunk)


def _is_text(typ: pa.DataType) -> bool:
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ))


def _escape_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if not _is_text(arr.type):
        return arr
    if isinstance(arr, pa.ChunkedArray):
        chunks = [_escape_chunk(c) for c in arr.chunks]
        if all(a is b for a, b in zip(chunks, arr.chunks, strict=True)):
            return arr
        return pa.chunked_array(chunks, type=arr.type)
    return _escape_chunk(arr)


def escape_table(table: pa.Table) -> pa.Table:
    """Every text cell of an Arrow table escaped (numeric columns untouched)."""
    for i, column in enumerate(table.columns):
        fixed = _escape_array(column)
        if fixed is not column:
            table = table.set_column(i, table.field(i).name, fixed)
    return table


def unescape_column(values: Any) -> Any:
    """A pandas Series of text read back (``dtype=str``) with the escapes removed."""
    starts = values.str.startswith("'", na=False)
    if not starts.any():
        return values
    out = values.copy()
    out[starts] = values[starts].map(unescape)
    return out
