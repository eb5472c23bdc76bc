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


def _escape_strings(arr: pa.Array) -> pa.Array:
    mask = pc.and_not(
        pc.match_substring_regex(arr, _TRIGGERED),
        pc.match_substring_regex(arr, _QUOTED_NUMBER),
    )
    if not pc.any(mask).as_py():
        return arr
    quote, empty = pa.scalar("'", type=arr.type), pa.scalar("", type=arr.type)
    return pc.if_else(mask, pc.binary_join_element_wise(quote, arr, empty), arr)


def _escape_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    typ = arr.type
    if pa.types.is_dictionary(typ) and (
        pa.types.is_string(typ.value_type) or pa.types.is_large_string(typ.value_type)
    ):
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        fixed = [
            pa.DictionaryArray.from_arrays(c.indices, _escape_strings(c.dictionary)) for c in chunks
        ]
        return pa.chunked_array(fixed, type=typ) if isinstance(arr, pa.ChunkedArray) else fixed[0]
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return _escape_strings(arr)
    return arr


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
