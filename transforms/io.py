"""Reading microdata (CSV, Parquet, JSON Lines) as batches of pandas DataFrames.

Two entry points:

* :func:`inspect_input` runs on the driver before the pipeline starts. It reads only the
  header line (CSV), the first JSON object (JSONL) or the footer (Parquet) of every file,
  and fails with :class:`InputDataError` on anything that makes the whole input unusable
  (missing/unreadable/empty file, header only, declared column absent, headers that differ
  between files, a header that is not valid in ``input.encoding``).
* :class:`ReadMicrodata` is the Beam read. Its outputs are ``batches`` (DataFrames of at
  most ``batch_rows`` rows, header column order) and ``rejected`` (DataFrames with columns
  ``file``, ``line``, ``reason``, ``text``). Every data line ends up in exactly one of the
  two; only blank lines are dropped.

How the parallel text read works (CSV and JSONL):

1. The driver looks at file sizes only and cuts every file into byte ranges of about
   ``split_bytes`` (one range per file with ``multiline_records``). The descriptors are a
   ``beam.Create`` followed by ``beam.Reshuffle`` so a runner spreads them over workers.
2. A first, cheap parallel step counts the ``\\n`` bytes of every range (``bytes.count``).
3. The parse step receives those counts as a ``beam.pvalue.AsDict`` side input keyed by
   ``(path, split index)``: the physical line number of a range's first line is one plus
   the newlines of all earlier ranges of the file (plus one if the range does not start
   exactly at a line start). A range ``[s, e)`` owns the lines that *start* in it: it skips
   to the first line start at or after ``s`` and reads through the end of the line that
   contains byte ``e - 1``.
4. Inside a range the physical lines ("units"; with ``multiline_records`` the units are
   whole records, found by quote parity) are parsed by ``pyarrow.csv`` in one call, every
   column as a string. Row ``k`` of the parser output is mapped to the ``k``-th non-blank
   unit; the invalid-row handler reports rows with a wrong field count by record number.
   The mapping is verified (record count and line breaks inside values must match the
   units); where it does not hold, the range is bisected and re-parsed, so one malformed
   line (an unbalanced quote) is rejected on its own instead of swallowing its neighbours.
   A range is first cut at line ends into pieces of about ``batch_rows`` lines (the chunks
   of a ``multiline_records`` file are its pieces), parsed by a pool of ``parse_threads``
   threads (pyarrow releases the GIL) while the step's own thread hands the finished pieces
   downstream in order: one split keeps several cores busy on any runner, and each piece
   carries its own first line number and byte offset, so rows and rejections are the same
   as a serial parse's.
5. Typed columns are converted vectorised with ``pyarrow.compute``; failures and empty
   values in ``nonempty_columns`` are rejected. Only rejected rows get per-row Python.

Decisions:

* Non-UTF-8 bytes (``encoding: utf-8``): the affected row is rejected with reason
  ``invalid UTF-8 at byte offset N (…)`` (``N`` is the 0-based offset in the file, the line
  number is that of the row); the rest of the file is read normally. A header that is not
  UTF-8 fails :func:`inspect_input`. Other encodings must be ASCII-compatible (latin-1,
  cp1252, …): each range is decoded and re-encoded to UTF-8 before parsing; bytes invalid in
  that encoding are rejected the same way.
* dtypes: string columns are ``pd.StringDtype("pyarrow")`` (missing = ``pd.NA``), integer
  columns ``Int64``, float columns ``float64`` (missing = NaN). Only an empty field (``,,``
  or ``""``) is missing; the texts ``NA``/``null`` are values. Numbers may carry surrounding
  whitespace and a sign; integers must be plain digits (``3.0`` is not an integer); floats
  must be finite decimal numbers (``nan``/``inf`` are rejected).
* A lone carriage return inside a line (not followed by ``\\n``) is rejected: pyarrow would
  treat it as a line break and the physical line numbers would be wrong.
* JSONL: the columns of a file are the keys of its first object; missing keys are missing
  values, keys that the first object does not have are ignored. Scalars are converted to
  their JSON text (``37`` → ``"37"``, ``true`` → ``"true"``) and then typed like CSV text;
  objects/arrays as values and ``NaN``/``Infinity`` are rejected. JSON decoding uses
  ``json.loads`` (C) on a whole range at once; normalising non-string scalars is per value.
* Parquet: one split per row group (the row-group sizes come from the footer, which
  :func:`inspect_input` reads anyway). ``line`` of a rejected Parquet row is its 1-based
  row number in the file, ``text`` its values joined by ``,``.
"""

from __future__ import annotations

import codecs
import difflib
import json
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, BinaryIO, Literal

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import AsDict, PBegin, PCollection, TaggedOutput

from privpipe.errors import ConfigError, InputDataError
from privpipe.transforms.timing import TimedDoFn

__all__ = ["REJECTED_COLUMNS", "InputSpec", "ReadMicrodata", "inspect_input"]

ColumnType = Literal["string", "integer", "float"]
REJECTED_COLUMNS = ("file", "line", "reason", "text")

_BOM = b"\xef\xbb\xbf"
_TEXT_LIMIT = 200  # characters of the raw line kept in `rejected.text`
_VALUE_LIMIT = 40  # characters of a bad value quoted in a reason
_HEAD_CHUNK = 1 << 16
_SAMPLE_BYTES = 1 << 20  # a split's average line length is taken over this much of it
_MAX_HEADER_BYTES = 16 << 20
_COUNT_CHUNK = 8 << 20
_COMMON_DELIMITERS = (",", ";", "\t", "|")
_COLUMN_TYPES = ("string", "integer", "float")
_INT_RE = r"^[+-]?[0-9]+$"
_FLOAT_RE = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_NONFINITE_RE = r"^[+-]?(inf|infinity|nan)$"
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_BATCHES = "batches"
_REJECTED = "rejected"


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class InputSpec:
    """What to read and how; validated on construction (ConfigError on bad parameters)."""

    paths: tuple[str, ...]  # one or more files (globs already expanded by the caller)
    format: Literal["csv", "parquet", "jsonl"] = "csv"
    delimiter: str = ","  # CSV only
    quotechar: str = '"'  # CSV only; a quote inside a quoted field is doubled ("")
    encoding: str = "utf-8"  # others (ASCII-compatible) are transcoded to UTF-8 per split
    header: bool = True  # CSV: if False, column_names is required
    column_names: tuple[str, ...] | None = None
    batch_rows: int = 65_536  # max rows per emitted DataFrame
    split_bytes: int = 8 * 2**20  # target byte-range size for parallel CSV/JSONL reads
    required_columns: tuple[str, ...] = ()  # must exist in every file
    column_types: Mapping[str, ColumnType] = field(default_factory=dict)  # default string
    nonempty_columns: tuple[str, ...] = ()  # an empty value rejects the row
    multiline_records: bool = False  # CSV: quoted values may hold line breaks; 1 split/file
    # Inside one split, pieces of about ``batch_rows`` lines (at most ``piece_bytes``; cut
    # at line ends) are parsed by a pool of ``parse_threads`` threads (0: one per core, at
    # most 4; 1: serial) while the step's thread hands the finished pieces downstream in
    # order: pyarrow's parser and compute kernels release the GIL, so the read uses several
    # cores on any runner, and the batches keep the size they have in a serial read.
    parse_threads: int = 0
    piece_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        # Normalise sequences to tuples and the mapping to a plain (picklable) dict.
        for name in ("paths", "required_columns", "nonempty_columns"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(
                    f"input.{name} must be a list of strings, not the string {value!r}"
                )
            object.__setattr__(self, name, tuple(value))
        if self.column_names is not None:
            if isinstance(self.column_names, str):
                raise ConfigError("input.column_names must be a list of strings")
            object.__setattr__(self, "column_names", tuple(self.column_names))
        object.__setattr__(self, "column_types", dict(self.column_types))
        self._validate()

    def _validate(self) -> None:
        if not self.paths or not all(isinstance(p, str) and p for p in self.paths):
            raise ConfigError("input.path: at least one input file is required")
        if self.format not in ("csv", "parquet", "jsonl"):
            raise ConfigError(
                f"input.format: {self.format!r} is not supported; use csv, parquet or jsonl"
            )
        for key, char in (("delimiter", self.delimiter), ("quotechar", self.quotechar)):
            if not isinstance(char, str) or len(char) != 1 or ord(char) > 127:
                raise ConfigError(
                    f"input.{key}: {char!r} must be a single ASCII character, e.g. ',' or ';'"
                )
            if char in "\r\n":
                raise ConfigError(f"input.{key} cannot be a line break")
        if self.delimiter == self.quotechar:
            raise ConfigError("input.delimiter and input.quotechar must differ")
        try:
            codec = codecs.lookup(self.encoding)
        except LookupError:
            raise ConfigError(
                f"input.encoding: unknown encoding {self.encoding!r}; use e.g. utf-8 or latin-1"
            ) from None
        probe = "a,;|\t\"'\r\n"
        try:
            ascii_compatible = codec.name == "utf-8-sig" or (
                codec.encode(probe)[0] == probe.encode("ascii")
            )
        except UnicodeError:
            ascii_compatible = False
        if not ascii_compatible:
            raise ConfigError(
                f"input.encoding: {self.encoding!r} is not ASCII-compatible and cannot be read "
                "in parallel; convert the file to UTF-8 first (e.g. iconv -t UTF-8)"
            )
        for key in ("batch_rows", "split_bytes", "piece_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"input.{key} must be a positive integer, got {value!r}")
        threads = self.parse_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ConfigError(f"input.parse_threads must be 0 (auto) or more, got {threads!r}")
        if self.multiline_records and self.format != "csv":
            raise ConfigError("input.multiline_records only applies to CSV input")
        if self.format == "csv" and not self.header and not self.column_names:
            raise ConfigError("input.column_names is required when input.header is false")
        if self.column_names is not None:
            if self.format != "csv" or self.header:
                raise ConfigError(
                    "input.column_names only applies to CSV files without a header "
                    "(set input.header: false, or remove input.column_names)"
                )
            if len(set(self.column_names)) != len(self.column_names) or not all(self.column_names):
                raise ConfigError("input.column_names must be distinct, non-empty names")
        for name, kind in self.column_types.items():
            if kind not in _COLUMN_TYPES:
                raise ConfigError(
                    f"input.column_types.{name}: {kind!r} is not a type; "
                    "use string, integer or float"
                )

    @property
    def declared_columns(self) -> tuple[str, ...]:
        """Every column the spec names: required, typed and non-empty columns."""
        names = (*self.required_columns, *self.column_types, *self.nonempty_columns)
        return tuple(dict.fromkeys(names))

    @property
    def threads(self) -> int:
        """Threads parsing the pieces of one split (``parse_threads``, or one per core)."""
        return self.parse_threads or max(1, min(os.cpu_count() or 1, 4))

    @property
    def _utf8(self) -> bool:
        return codecs.lookup(self.encoding).name in ("utf-8", "utf-8-sig")


# --------------------------------------------------------------------------- files


def _open(path: str) -> BinaryIO:
    """Open a file for seekable binary reading through Beam's FileSystems (local, gs://…)."""
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _file_size(path: str) -> int:
    """Size in bytes; InputDataError when the file does not exist."""
    try:
        exists = FileSystems.exists(path)  # type: ignore[no-untyped-call]
        matches = (
            FileSystems.match([path])[0].metadata_list  # type: ignore[no-untyped-call]
            if exists
            else []
        )
    except Exception as exc:
        raise InputDataError(
            f"{path}: cannot access the file ({exc}); check the path and permissions"
        ) from exc
    if not exists or not matches:
        raise InputDataError(
            f"{path}: input file not found; check input.path "
            "(relative paths resolve against the config file's folder)"
        )
    return int(matches[0].size_in_bytes)


def _read_exact(f: BinaryIO, n: int) -> bytes:
    """Read n bytes, or fewer only at end of file (some file objects return short reads)."""
    parts: list[bytes] = []
    while n > 0:
        chunk = f.read(n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _read_through_newline(f: BinaryIO, data: bytes, limit: int | None = None) -> bytes:
    """Extend `data` (already read from f) with further reads until it contains a newline."""
    parts = [data]
    total = len(data)
    found = b"\n" in data
    while not found:
        chunk = f.read(_HEAD_CHUNK)
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
        found = b"\n" in chunk
        if limit is not None and total > limit and not found:
            break
    return b"".join(parts)


def _line_end(f: BinaryIO, at: int, before: int | None = None) -> int:
    """File offset just past the first \n at or after ``at`` and before ``before`` (None:
    the end of the file); where there is none, the offset the search stopped at
    (``before``, or the end of the file). Only offsets: no bytes are kept."""
    f.seek(at)
    while before is None or at < before:
        chunk = f.read(_HEAD_CHUNK if before is None else min(_HEAD_CHUNK, before - at))
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if nl >= 0:
            return at + nl + 1
        at += len(chunk)
    return at


@dataclass(frozen=True)
class _FileInfo:
    path: str
    size: int
    columns: tuple[str, ...]
    has_data: bool
    row_groups: tuple[int, ...] = ()  # Parquet: rows of each row group


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show_delim(d: str) -> str:
    return "\\t" if d == "\t" else d


def _delimiter_hint(spec: InputSpec, columns: tuple[str, ...]) -> str:
    """When the header is one column containing another delimiter, name the likely one."""
    if len(columns) != 1:
        return ""
    counts = {d: columns[0].count(d) for d in _COMMON_DELIMITERS if d != spec.delimiter}
    best = max(counts, key=lambda d: counts[d])
    if counts[best] == 0:
        return ""
    return (
        f" — the file looks '{_show_delim(best)}'-delimited but input.delimiter is "
        f"'{_show_delim(spec.delimiter)}'"
    )


def _describe_header(columns: tuple[str, ...]) -> str:
    if len(columns) == 1:
        return f"the header has 1 column {_short(columns[0], 30)!r}"
    shown = ", ".join(repr(c) for c in columns[:12])
    more = ", …" if len(columns) > 12 else ""
    return f"the header has {len(columns)} columns: {shown}{more}"


_NEAR_COLUMNS = 1000  # columns a missing name is fuzzily compared with


def _check_declared(spec: InputSpec, info: _FileInfo) -> None:
    missing = [c for c in spec.declared_columns if c not in info.columns]
    if not missing:
        return
    what = (
        f"column {missing[0]!r} not found"
        if len(missing) == 1
        else "columns " + ", ".join(repr(c) for c in missing) + " not found"
    )
    hint = _delimiter_hint(spec, info.columns)
    if not hint:
        folded = {c.strip().casefold(): c for c in info.columns}
        near = info.columns[:_NEAR_COLUMNS]  # fuzzy matching costs columns x missing
        close = [
            folded.get(m.strip().casefold())
            or next(iter(difflib.get_close_matches(m, near, n=1)), None)
            for m in missing
        ]
        pairs = [f"{c!r} for {m!r}" for m, c in zip(missing, close, strict=True) if c]
        if pairs:
            hint = " — did you mean " + ", ".join(pairs) + "?"
        else:
            hint = " — fix the column name in the config or in the file"
    if spec.format == "jsonl":
        source = "the first JSON object has keys " + ", ".join(repr(c) for c in info.columns[:12])
    elif spec.format == "parquet":
        source = "the Parquet schema has columns " + ", ".join(repr(c) for c in info.columns[:12])
    elif not spec.header:
        source = "input.column_names lists " + ", ".join(repr(c) for c in info.columns[:12])
    else:
        source = _describe_header(info.columns)
    raise InputDataError(f"{info.path}: {what}; {source}{hint}")


def _sniff(path: str, head: bytes, spec: InputSpec) -> None:
    """Catch files of the wrong kind early (compressed, Parquet read as text)."""
    if head.startswith(b"\x1f\x8b"):
        raise InputDataError(f"{path}: the file is gzip-compressed; decompress it first")
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputDataError(
            f"{path}: the file is UTF-16 encoded; convert it to UTF-8 "
            "(e.g. iconv -f UTF-16 -t UTF-8)"
        )
    if head.startswith(b"PAR1"):
        raise InputDataError(
            f"{path}: the file looks like Parquet but input.format is {spec.format}; "
            "set input.format: parquet"
        )


def _decode_line1(path: str, raw: bytes, offset: int, spec: InputSpec) -> str:
    try:
        return raw.decode(spec.encoding)
    except UnicodeDecodeError as exc:
        enc = "UTF-8" if spec._utf8 else spec.encoding
        fix = "set input.encoding, e.g. latin-1" if spec._utf8 else "check input.encoding"
        raise InputDataError(
            f"{path}: line 1 is not valid {enc} (byte offset {offset + exc.start}); {fix}"
        ) from None


def _parse_csv_line(path: str, line: str, spec: InputSpec) -> tuple[str, ...]:
    """Split one line into fields with the same parser (pyarrow) the read uses."""
    if line.count(spec.quotechar) % 2:
        raise InputDataError(
            f"{path}: line 1 has an unbalanced quote character {spec.quotechar!r}; "
            "fix the header or set input.quotechar"
        )
    try:
        table = pacsv.read_csv(
            pa.BufferReader(line.encode("utf-8") + b"\n"),
            read_options=pacsv.ReadOptions(use_threads=False, autogenerate_column_names=False),
            parse_options=pacsv.ParseOptions(
                delimiter=spec.delimiter, quote_char=spec.quotechar, escape_char=False
            ),
        )
    except pa.ArrowInvalid as exc:
        raise InputDataError(f"{path}: line 1 cannot be parsed as CSV ({exc})") from None
    return tuple(table.column_names)


def _inspect_text_file(path: str, spec: InputSpec) -> _FileInfo:
    size = _file_size(path)
    if size == 0:
        raise InputDataError(f"{path}: the file is empty (0 bytes)")
    try:
        with _open(path) as f:
            data = _read_through_newline(f, _read_exact(f, _HEAD_CHUNK), _MAX_HEADER_BYTES)
            _sniff(path, data, spec)
            start = 3 if data.startswith(_BOM) else 0
            nl = data.find(b"\n", start)
            if nl < 0 and len(data) < size:
                raise InputDataError(
                    f"{path}: line 1 is longer than {_MAX_HEADER_BYTES >> 20} MiB; "
                    f"is this really a {spec.format.upper()} file? check input.format"
                )
            line_end = nl if nl >= 0 else len(data)
            raw = data[start:line_end]
            rest = data[line_end + 1 :] if nl >= 0 else b""
            if not raw.strip() and not rest.strip():
                rest = _skip_whitespace(f, rest)
                if not rest:
                    raise InputDataError(f"{path}: the file is empty (only whitespace)")
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if b"\r" in raw:
                raise InputDataError(
                    f"{path}: line 1 contains a carriage return (\\r) that is not followed by "
                    "\\n (old Mac line endings?); convert the file to \\n or \\r\\n line endings"
                )
            has_data = bool(rest.strip()) or bool(_skip_whitespace(f, rest))
    except InputDataError:
        raise
    except Exception as exc:  # OSError, BeamIOError, IsADirectoryError, …
        raise InputDataError(
            f"{path}: cannot read the file ({exc}); check the path and permissions"
        ) from exc
    if not raw.strip():
        what = "the header" if spec.format == "csv" and spec.header else "the first line"
        raise InputDataError(f"{path}: line 1 ({what}) is empty; remove leading blank lines")
    line = _decode_line1(path, raw, start, spec).lstrip("\ufeff")
    if spec.format == "jsonl":
        return _FileInfo(path, size, _json_keys(path, line), True)
    if not spec.header:
        assert spec.column_names is not None
        try:
            fields = _parse_csv_line(path, line, spec)
        except InputDataError:  # a malformed first data row is rejected by the read itself
            return _FileInfo(path, size, spec.column_names, True)
        hint = _delimiter_hint(spec, fields)
        if hint and len(spec.column_names) > 1:
            raise InputDataError(
                f"{path}: line 1 has 1 field {_short(fields[0], 30)!r} but input.column_names "
                f"lists {len(spec.column_names)} names{hint}"
            )
        return _FileInfo(path, size, spec.column_names, True)
    fields = _parse_csv_line(path, line, spec)
    empty = [i + 1 for i, c in enumerate(fields) if not c.strip()]
    if empty:
        raise InputDataError(
            f"{path}: line 1 (the header): column {empty[0]} has an empty name; "
            "name every column (a trailing delimiter in the header?)"
        )
    dupes = sorted(c for c, n in Counter(fields).items() if n > 1)  # linear: 10k columns
    if dupes:
        raise InputDataError(
            f"{path}: line 1 (the header): duplicate column name(s) "
            + ", ".join(repr(c) for c in dupes)
            + "; column names must be unique"
        )
    return _FileInfo(path, size, fields, has_data)


def _skip_whitespace(f: BinaryIO, rest: bytes) -> bytes:
    """Read on while everything seen is whitespace; return the first non-blank bytes or b''."""
    while not rest.strip():
        rest = f.read(_HEAD_CHUNK)
        if not rest:
            return b""
    return rest


def _json_keys(path: str, line: str) -> tuple[str, ...]:
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InputDataError(
            f"{path}: line 1 is not valid JSON ({exc}); JSON Lines needs one object per line"
        ) from None
    if not isinstance(obj, dict) or not obj:
        raise InputDataError(
            f"{path}: line 1 is not a non-empty JSON object; the keys of the first object "
            "are the columns of a JSON Lines file"
        )
    return tuple(obj)


def _inspect_parquet_file(path: str) -> _FileInfo:
    size = _file_size(path)
    if size == 0:
        raise InputDataError(f"{path}: the file is empty (0 bytes)")
    try:
        with _open(path) as f:
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
            groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    except Exception as exc:
        raise InputDataError(
            f"{path}: cannot read the file as Parquet ({exc}); check input.format"
        ) from exc
    nested = [f.name for f in schema if pa.types.is_nested(f.type)]
    if nested:
        raise InputDataError(
            f"{path}: column(s) {', '.join(map(repr, nested))} are nested (list/struct/map); "
            "flatten them or drop them from the file"
        )
    return _FileInfo(path, size, tuple(schema.names), sum(groups) > 0, groups)


def parquet_splits(infos: list[_FileInfo]) -> list[ParquetSplit]:
    """One split per non-empty row group: (file, group, rows of the file before it)."""
    groups: list[ParquetSplit] = []
    for info in infos:
        before = 0
        for g, rows in enumerate(info.row_groups):
            if rows:
                groups.append((info.path, g, before))
            before += rows
    return groups


def _inspect(spec: InputSpec) -> tuple[tuple[str, ...], list[_FileInfo]]:
    """Inspect every file (driver side, cheap) and return the columns and per-file facts."""
    if spec.format == "parquet":
        infos = [_inspect_parquet_file(p) for p in spec.paths]
    else:
        infos = [_inspect_text_file(p, spec) for p in spec.paths]
    first = infos[0]
    for info in infos:
        _check_declared(spec, info)
    for info in infos[1:]:
        same = (
            set(info.columns) == set(first.columns)
            if spec.format != "csv"
            else info.columns == first.columns
        )
        if not same:
            gone = [c for c in first.columns if c not in info.columns]
            extra = [c for c in info.columns if c not in first.columns]
            diff = "; ".join(
                part
                for part in (
                    "missing " + ", ".join(map(repr, gone)) if gone else "",
                    "extra " + ", ".join(map(repr, extra)) if extra else "",
                )
                if part
            )
            raise InputDataError(
                f"{info.path}: the columns differ from {first.path} "
                f"({diff or 'same columns in a different order'}); "
                "all input files must have the same header"
            )
    if not any(i.has_data for i in infos):
        if len(infos) == 1:
            what = "a header but no data rows" if spec.format == "csv" else "no data rows"
            raise InputDataError(f"{first.path}: the file has {what}")
        raise InputDataError(
            "no data rows in any input file ("
            + ", ".join(i.path for i in infos)
            + "); every file has only a header"
        )
    return first.columns, infos


def inspect_input(spec: InputSpec) -> tuple[str, ...]:
    """Driver-side, cheap (reads only the header / Parquet schema / first JSON line).

    Returns the column names in file order; raises InputDataError naming the file, the line
    and the fix for inputs that cannot be read at all.
    """
    return _inspect(spec)[0]


# --------------------------------------------------------------------------- units


@dataclass
class _Units:
    """Records of a text buffer: byte spans, starting physical line, blank flag."""

    starts: np.ndarray
    ends: np.ndarray  # exclusive; includes the terminating \n
    lines: np.ndarray
    newlines: np.ndarray  # \n bytes inside the unit (1 for a single physical line)
    blank: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def text(self, buf: bytes, i: int, encoding: str = "utf-8") -> str:
        raw = buf[int(self.starts[i]) : int(self.ends[i])]
        return _clip(raw.decode(encoding, errors="backslashreplace").rstrip("\r\n"))

    def subset(self, keep: np.ndarray) -> _Units:
        return _Units(
            self.starts[keep],
            self.ends[keep],
            self.lines[keep],
            self.newlines[keep],
            self.blank[keep],
        )


def _clip(text: str) -> str:
    return text[:_TEXT_LIMIT]


def _newline_positions(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    a = np.frombuffer(buf, dtype=np.uint8)
    return a, np.flatnonzero(a == 10)


def _record_ends(a: np.ndarray, nl: np.ndarray, quote: int) -> np.ndarray:
    """Indices into `nl` of the newlines that end a record (an even number of quotes before)."""
    quotes = np.flatnonzero(a == quote)
    even = np.searchsorted(quotes, nl) % 2 == 0
    return np.flatnonzero(even)


def _build_units(buf: bytes, ln0: int, multiline: bool, quote: str, json_blank: bool) -> _Units:
    """Split a buffer that ends with \\n into units (lines, or quote-balanced records)."""
    a, nl = _newline_positions(buf)
    if len(nl) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _Units(empty, empty, empty, empty, np.zeros(0, dtype=bool))
    if multiline:
        idx = _record_ends(a, nl, ord(quote))
        if len(idx) == 0 or idx[-1] != len(nl) - 1:
            idx = np.append(idx, len(nl) - 1)  # an unbalanced quote runs to the end
    else:
        idx = np.arange(len(nl))
    ends = nl[idx] + 1
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    first_nl = np.concatenate(([0], idx[:-1] + 1))
    lines = ln0 + first_nl
    newlines = idx - first_nl + 1
    if json_blank:
        ws = np.isin(a, np.frombuffer(b" \t\r\n", dtype=np.uint8))
        nonws = np.concatenate(([0], np.cumsum(~ws)))
        blank = (nonws[ends] - nonws[starts]) == 0
    else:
        last = ends - 1  # the \n
        has_cr = np.zeros(len(ends), dtype=bool)
        inner = last > starts
        has_cr[inner] = a[last[inner] - 1] == 13
        blank = (newlines == 1) & ((last - starts - has_cr) == 0)
    return _Units(starts, ends.astype(np.int64), lines.astype(np.int64), newlines, blank)


def _bare_cr_units(buf: bytes, units: _Units, multiline: bool, quote: str) -> np.ndarray:
    """Units that contain a \\r not followed by \\n (outside quotes when multiline)."""
    mask = np.zeros(len(units), dtype=bool)
    if b"\r" not in buf:
        return mask
    a = np.frombuffer(buf, dtype=np.uint8)
    cr = np.flatnonzero(a[:-1] == 13)
    cr = cr[a[cr + 1] != 10]
    if len(cr) and multiline:
        quotes = np.flatnonzero(a == ord(quote))
        cr = cr[np.searchsorted(quotes, cr) % 2 == 0]
    if len(cr):
        mask[np.searchsorted(units.ends, cr, side="right")] = True
    return mask


def _undecodable_units(buf: bytes, units: _Units, encoding: str) -> dict[int, int]:
    """Map unit index -> buffer offset of the first byte that is invalid in `encoding`."""
    if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig", "ascii") and buf.isascii():
        return {}
    if codecs.lookup(encoding).name == "utf-8-sig":
        encoding = "utf-8"
    bad: dict[int, int] = {}
    view = memoryview(buf)
    pos = 0
    while pos < len(buf):
        try:
            codecs.decode(view[pos:], encoding)
            break
        except UnicodeDecodeError as exc:
            at = pos + exc.start
            unit = int(np.searchsorted(units.ends, at, side="right"))
            bad[unit] = at
            pos = int(units.ends[unit])
    return bad


def _take_units(buf: bytes, units: _Units, keep: np.ndarray) -> tuple[bytes, _Units]:
    """Drop units from the buffer (vectorised byte mask) and re-base the kept spans."""
    a = np.frombuffer(buf, dtype=np.uint8)
    lengths = units.ends - units.starts
    new_buf = a[np.repeat(keep, lengths)].tobytes()
    kept = units.subset(keep)
    ends = np.cumsum(lengths[keep]).astype(np.int64)
    kept.starts = ends - lengths[keep]
    kept.ends = ends
    return new_buf, kept


# --------------------------------------------------------------------------- parsing


@dataclass
class _Parsed:
    """Raw (string or native) columns of the accepted rows plus what was rejected so far."""

    table: pa.Table
    lines: np.ndarray
    row_text: Callable[[int], str]
    rejected: list[tuple[int, str, str]]
    extra_bad: list[tuple[np.ndarray, Callable[[int], str]]] = field(default_factory=list)


def _string_schema(columns: Iterable[str]) -> pa.Schema:
    return pa.schema([(c, pa.string()) for c in columns])


def _arrow_csv(
    data: memoryview, columns: tuple[str, ...], spec: InputSpec
) -> tuple[pa.Table, list[tuple[int, int, str]]]:
    """One serial pyarrow parse; returns the table and (record number, fields, text) of bad rows."""
    invalid: list[tuple[int, int, str]] = []

    def handler(row: Any) -> str:
        if row.number is None:  # only the serial reader numbers rows
            raise RuntimeError("pyarrow did not report the row number of an invalid row")
        invalid.append((int(row.number), int(row.actual_columns), str(row.text)))
        return "skip"

    table = pacsv.read_csv(
        pa.BufferReader(pa.py_buffer(data)),
        read_options=pacsv.ReadOptions(
            column_names=list(columns),
            use_threads=False,
            block_size=min(max(len(data) + 1, 1 << 20), 1 << 30),
        ),
        parse_options=pacsv.ParseOptions(
            delimiter=spec.delimiter,
            quote_char=spec.quotechar,
            double_quote=True,
            escape_char=False,
            newlines_in_values=spec.multiline_records,
            ignore_empty_lines=True,
            invalid_row_handler=handler,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in columns},
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        ),
    )
    return table, invalid


def _embedded_newlines(table: pa.Table) -> np.ndarray:
    """Line breaks inside the values of each row (one cheap byte count first)."""
    total = np.zeros(table.num_rows, dtype=np.int64)
    for col in table.columns:
        for chunk in col.chunks:
            _, offsets, data = chunk.buffers()
            if data is None:
                continue
            bounds = np.frombuffer(offsets, dtype=np.int32)[chunk.offset :][: len(chunk) + 1]
            raw = np.frombuffer(data, dtype=np.uint8)[bounds[0] : bounds[-1]]
            if np.count_nonzero(raw == 10):
                break
        else:
            continue
        total += pc.fill_null(pc.count_substring(col, "\n"), 0).to_numpy()
    return total


def _parse_csv_units(
    buf: bytes, units: _Units, columns: tuple[str, ...], spec: InputSpec
) -> tuple[list[pa.Table], list[np.ndarray], list[tuple[int, str]]]:
    """Parse units [0, n) with bisection on any doubt; map rows back to units exactly."""
    tables: list[pa.Table] = []
    row_units: list[np.ndarray] = []
    bad: list[tuple[int, str]] = []
    view = memoryview(buf)
    quote = spec.quotechar.encode("ascii")
    nonblank = np.flatnonzero(~units.blank)

    def leaf_reason(u: int, exc: Exception | None) -> str:
        if exc is not None:
            return f"cannot parse the record: {str(exc).splitlines()[0]}"
        if spec.multiline_records:
            last = int(units.lines[u] + units.newlines[u] - 1)
            return (
                f"cannot split lines {int(units.lines[u])}–{last} into records: a quote "
                f"character {spec.quotechar!r} inside an unquoted field?"
            )
        return (
            f"unbalanced quote character {spec.quotechar!r}: a quoted field runs past the end "
            "of the line (set input.multiline_records: true if values contain line breaks)"
        )

    def parse(members: np.ndarray) -> None:
        lo, hi = int(units.starts[members[0]]), int(units.ends[members[-1]])
        exc: Exception | None = None
        ok = False
        try:
            table, invalid = _arrow_csv(view[lo:hi], columns, spec)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            exc = e
        else:
            n = len(members)
            if table.num_rows + len(invalid) == n:
                valid = np.ones(n, dtype=bool)
                numbers = np.array([r[0] for r in invalid], dtype=np.int64) - 1
                valid[numbers] = False
                # Without a quote character no value can hold a line break: rows == lines.
                ok = buf.find(quote, lo, hi) < 0
                if not ok:
                    expected = units.newlines[members] - 1
                    ok = bool(np.all(_embedded_newlines(table) == expected[valid])) and all(
                        text.count("\n") == expected[k]
                        for k, (_, _, text) in zip(numbers, invalid, strict=True)
                    )
        if ok:
            tables.append(table)
            row_units.append(members[valid])
            for k, fields, _ in invalid:
                u = int(members[k - 1])
                reason = f"expected {len(columns)} fields, saw {fields}"
                if view[int(units.starts[u]) : int(units.ends[u])].tobytes().count(quote) % 2:
                    reason += f" (unbalanced quote character {spec.quotechar!r})"
                bad.append((u, reason))
        elif len(members) == 1:
            bad.append((int(members[0]), leaf_reason(int(members[0]), exc)))
        else:
            mid = len(members) // 2
            parse(members[:mid])
            parse(members[mid:])

    if len(nonblank):
        # Contiguous runs only: blank units between members are skipped by pyarrow too.
        parse(nonblank)
    return tables, row_units, bad


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_loads(data: bytes) -> Any:
    return json.loads(data, parse_constant=_reject_constant)


def _parse_json_units(
    buf: bytes, units: _Units
) -> tuple[list[Any], np.ndarray, list[tuple[int, str]]]:
    """Decode all lines with one json.loads per range (bisecting around bad lines)."""
    objects: list[Any] = []
    owners: list[np.ndarray] = []
    bad: list[tuple[int, str]] = []
    a = np.frombuffer(buf, dtype=np.uint8)

    def parse(members: np.ndarray) -> None:
        lo, hi = int(units.starts[members[0]]), int(units.ends[members[-1]])
        chunk = a[lo:hi].copy()
        seps = units.ends[members[:-1]] - 1 - lo  # the \n ending each member but the last
        chunk[seps] = ord(",")
        try:
            values: list[Any] | None = _json_loads(b"[" + chunk.tobytes() + b"]")
        except (ValueError, RecursionError):
            values = None
        if values is not None and len(values) == len(members):
            objects.extend(values)
            owners.append(members)
        elif len(members) > 1:
            mid = len(members) // 2
            parse(members[:mid])
            parse(members[mid:])
        elif values is not None:
            bad.append((int(members[0]), "expected one JSON object per line, found several"))
        else:
            try:
                _json_loads(buf[lo:hi])
                reason = "invalid JSON"
            except (ValueError, RecursionError) as exc:
                reason = f"invalid JSON: {exc}"
            bad.append((int(members[0]), reason))

    nonblank = np.flatnonzero(~units.blank)
    if len(nonblank):
        parse(nonblank)
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    return objects, owner, bad


def _json_column(values: list[Any]) -> tuple[pa.Array, np.ndarray]:
    """JSON scalars -> their text as a string array; also flags nested values."""
    nested = np.zeros(len(values), dtype=bool)
    try:
        return pa.array(values, type=pa.string()), nested
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    out: list[str | None] = []
    for i, v in enumerate(values):
        if v is None or isinstance(v, str):
            out.append(v)
        elif isinstance(v, bool):
            out.append("true" if v else "false")
        elif isinstance(v, int | float):
            out.append(repr(v))
        else:
            nested[i] = True
            out.append(None)
    return pa.array(out, type=pa.string()), nested


# --------------------------------------------------------------------------- typing


def _empty_to_null(arr: pa.Array) -> pa.Array:
    """Empty strings become missing (CSV already parses them so; Parquet/JSON may not)."""
    empty = pc.equal(arr, "")
    if not pc.any(empty).as_py():
        return arr
    return pc.if_else(empty, pa.scalar(None, arr.type), arr)


def _as_string(arr: pa.Array, column: str, path: str) -> pa.Array:
    """Any column as strings with empty text as null (already done for string input)."""
    if arr.type == pa.string():
        return arr
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.type != pa.string():
        try:
            arr = pc.cast(arr, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputDataError(
                f"{path}: column {column!r} of type {arr.type} cannot be read as text ({exc})"
            ) from None
    return _empty_to_null(arr)


def _mask(arr: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _parse_int_text(s: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """String -> int64; returns values, not-an-integer mask, out-of-range mask.

    Fast path: pyarrow's cast accepts the whole column (it also takes hex like 0x1F, which
    is excluded here). Otherwise every value is checked against a strict pattern, so the
    outcome for a value never depends on its neighbours.
    """
    none = np.zeros(len(s), dtype=bool)
    try:
        values = pc.cast(s, pa.int64())
    except pa.ArrowInvalid:
        pass
    else:
        if not pc.any(pc.match_substring(s, "x", ignore_case=True)).as_py():
            return values, none, none
    t = pc.utf8_trim_whitespace(s)
    ok = _mask(pc.match_substring_regex(t, _INT_RE))
    oor = none.copy()
    for i in np.flatnonzero(ok & _mask(pc.greater(pc.utf8_length(t), 18))):
        oor[i] = not _INT64_MIN <= int(t[i].as_py()) <= _INT64_MAX
    good = ok & ~oor
    if pc.any(pc.starts_with(t, "+")).as_py():
        t = pc.utf8_ltrim(t, characters="+")
    values = pc.cast(pc.if_else(pa.array(good), t, pa.scalar(None, pa.string())), pa.int64())
    valid = _mask(pc.is_valid(s))
    return values, valid & ~ok, oor


def _parse_float_text(s: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """String -> float64; returns values, not-a-number mask, non-finite mask."""
    valid = _mask(pc.is_valid(s))
    try:
        values = pc.cast(s, pa.float64())
    except pa.ArrowInvalid:
        pass
    else:  # pyarrow accepts a subset of _FLOAT_RE plus nan/inf words
        finite = _mask(pc.is_finite(values))
        nonfinite = valid & ~finite
        if nonfinite.any():
            values = pc.if_else(pa.array(finite), values, pa.scalar(None, pa.float64()))
        return values, np.zeros(len(s), dtype=bool), nonfinite
    t = pc.utf8_trim_whitespace(s)
    ok = _mask(pc.match_substring_regex(t, _FLOAT_RE))
    values = pc.cast(pc.if_else(pa.array(ok), t, pa.scalar(None, pa.string())), pa.float64())
    finite = _mask(pc.is_finite(values))
    words = _mask(pc.match_substring_regex(t, _NONFINITE_RE, ignore_case=True))
    nonfinite = (ok & ~finite) | words
    ok |= words
    values = pc.if_else(pa.array(finite), values, pa.scalar(None, pa.float64()))
    return values, valid & ~ok, nonfinite


def _convert_column(
    arr: pa.Array, kind: str, column: str, path: str
) -> tuple[pa.Array, np.ndarray, list[tuple[np.ndarray, str]]]:
    """Convert one column to its declared type.

    Returns the converted array, the empty-value mask, and (mask, message template) pairs for
    values that do not convert; the template's ``{v}`` is replaced by the offending value.
    """
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = _empty_to_null(pc.cast(arr, pa.string()))
    empty = ~_mask(pc.is_valid(arr))
    prefix = f"column {column!r}: "
    if kind == "integer":
        if pa.types.is_integer(arr.type):
            try:
                return pc.cast(arr, pa.int64()), empty, []
            except pa.ArrowInvalid:
                arr = pc.cast(arr, pa.string())
        elif pa.types.is_floating(arr.type):
            x = pc.cast(arr, pa.float64())
            ok = _mask(
                pc.and_(
                    pc.and_(pc.is_finite(x), pc.equal(pc.floor(x), x)),
                    pc.less(pc.abs(x), 2.0**63),
                )
            )
            values = pc.cast(pc.if_else(pa.array(ok), x, pa.scalar(None, pa.float64())), pa.int64())
            return values, empty, [(~empty & ~ok, prefix + "{v} is not an integer")]
        text = _as_string(arr, column, path)
        values, not_int, oor = _parse_int_text(text)
        return (
            values,
            empty,
            [
                (not_int, prefix + "{v} is not an integer"),
                (oor, prefix + "{v} is out of the 64-bit integer range"),
            ],
        )
    if kind == "float":
        if (
            pa.types.is_integer(arr.type)
            or pa.types.is_floating(arr.type)
            or (pa.types.is_decimal(arr.type))
        ):
            x = pc.cast(arr, pa.float64())
            finite = _mask(pc.is_finite(x))
            values = pc.if_else(pa.array(finite), x, pa.scalar(None, pa.float64()))
            return values, empty, [(~empty & ~finite, prefix + "{v} is not a finite number")]
        text = _as_string(arr, column, path)
        values, not_num, nonfinite = _parse_float_text(text)
        return (
            values,
            empty,
            [
                (not_num, prefix + "{v} is not a number"),
                (nonfinite, prefix + "{v} is not a finite number"),
            ],
        )
    return _as_string(arr, column, path), empty, []


def _show_value(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return repr(_short(text, _VALUE_LIMIT))


def _value_reason(template: str, values: pa.Array, i: int) -> str:
    return template.format(v=_show_value(values[i].as_py()))


def _fixed_reason(message: str, i: int) -> str:
    return message


_TYPES_MAPPER = {
    pa.string(): pd.StringDtype("pyarrow"),
    pa.large_string(): pd.StringDtype("pyarrow"),
    pa.int64(): pd.Int64Dtype(),
}


def read_dtype(kind: ColumnType) -> Any:
    """The pandas dtype of a column of declared type ``kind`` in the batches the read
    emits: what ``_TYPES_MAPPER`` makes of the typed Arrow column (float64, which it does
    not map, becomes numpy's)."""
    if kind == "float":
        return np.dtype(np.float64)
    return _TYPES_MAPPER[pa.int64() if kind == "integer" else pa.string()]


def _finish(
    parsed: _Parsed, columns: tuple[str, ...], spec: InputSpec, path: str
) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    """Type the columns, reject bad/empty values; returns the accepted table and rejections."""
    table = parsed.table
    n = table.num_rows
    converted: list[pa.Array] = []
    problems: list[tuple[np.ndarray, Callable[[int], str]]] = list(parsed.extra_bad)
    nonempty = set(spec.nonempty_columns)
    for name in columns:
        raw = table.column(name).combine_chunks()
        kind = spec.column_types.get(name, "string")
        values, empty, bad = _convert_column(raw, kind, name, path)
        converted.append(values)
        for mask, template in bad:
            problems.append((mask, partial(_value_reason, template, raw)))
        if name in nonempty:
            message = f"column {name!r}: empty value (the column is declared non-empty)"
            problems.append((empty, partial(_fixed_reason, message)))
    rejected = list(parsed.rejected)
    any_bad = np.zeros(n, dtype=bool)
    for mask, _ in problems:
        any_bad |= mask
    for i in np.flatnonzero(any_bad):
        reason = "; ".join(describe(int(i)) for mask, describe in problems if mask[i])
        rejected.append((int(parsed.lines[i]), reason, parsed.row_text(int(i))))
    typed = pa.Table.from_arrays(converted, names=list(columns))
    if any_bad.any():
        typed = typed.filter(pa.array(~any_bad))
    return typed, rejected


def _rejected_frame(path: str, rows: list[tuple[int, str, str]]) -> pd.DataFrame:
    rows = sorted(rows)
    string = pd.StringDtype("pyarrow")
    return pd.DataFrame(
        {
            "file": pd.array([path] * len(rows), dtype=string),
            "line": np.array([r[0] for r in rows], dtype=np.int64),
            "reason": pd.array([r[1] for r in rows], dtype=string),
            "text": pd.array([_clip(r[2]) for r in rows], dtype=string),
        }
    )


def _emit(
    typed: pa.Table, rejected: list[tuple[int, str, str]], path: str, batch_rows: int
) -> Iterator[Any]:
    for offset in range(0, typed.num_rows, batch_rows):
        chunk = typed.slice(offset, batch_rows)
        yield chunk.to_pandas(types_mapper=_TYPES_MAPPER.get).reset_index(drop=True)
    if rejected:
        yield TaggedOutput(_REJECTED, _rejected_frame(path, rejected))


# --------------------------------------------------------------------------- DoFns


# Text split descriptor: (path, index, start, end, number of splits of the file).
TextSplit = tuple[str, int, int, int, int]
# Parquet split descriptor: (path, row group, rows before this row group).
ParquetSplit = tuple[str, int, int]


def _text_splits(path: str, size: int, spec: InputSpec) -> list[TextSplit]:
    if spec.multiline_records or size <= spec.split_bytes:
        return [(path, 0, 0, size, 1)]
    n = -(-size // spec.split_bytes)
    bounds = [size * i // n for i in range(n + 1)]
    return [(path, i, bounds[i], bounds[i + 1], n) for i in range(n)]


def _pieces(
    buf: bytes, offset: int, line: int, size: int
) -> list[tuple[bytes | memoryview, int, int]]:
    """A buffer of whole lines cut at line ends into pieces of about ``size`` bytes, each
    with its file offset and physical line number (pieces parse independently: a line, its
    bytes and its rejection never span two). Pieces are views of the buffer, not copies
    made on the reading thread."""
    out: list[tuple[bytes | memoryview, int, int]] = []
    view = memoryview(buf)
    lo = 0
    while len(buf) - lo > size:
        nl = buf.find(b"\n", lo + size)
        if nl < 0 or nl + 1 >= len(buf):
            break
        out.append((view[lo : nl + 1], offset + lo, line))
        line += buf.count(b"\n", lo, nl + 1)
        lo = nl + 1
    out.append((view[lo:] if lo else buf, offset + lo, line))
    return out


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """One parse pool per worker process and size (shared by the splits it runs)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = ThreadPoolExecutor(threads, thread_name_prefix="privpipe-parse")
            _POOLS[threads] = pool
        return pool


class _CountNewlinesFn(beam.DoFn):
    """Count the \\n bytes of a byte range (skipped for a file's last range: never needed)."""

    def process(self, split: TextSplit) -> Iterator[tuple[tuple[str, int], int]]:
        path, index, start, end, count = split
        if index == count - 1:
            return
        total = 0
        with _open(path) as f:
            f.seek(start)
            remaining = end - start
            while remaining > 0:
                chunk = f.read(min(remaining, _COUNT_CHUNK))
                if not chunk:
                    break
                total += chunk.count(b"\n")
                remaining -= len(chunk)
        yield (path, index), total


class _ReadTextSplitFn(beam.DoFn):
    """Parse the lines owned by one byte range of a CSV/JSONL file into batches + rejections."""

    def __init__(self, spec: InputSpec, columns: tuple[str, ...]):
        self.spec = spec
        self.columns = columns

    def process(self, split: TextSplit) -> Iterator[Any]:
        """Batches, and rejected rows tagged with their split: their line numbers count from
        the split's first line and are made file-global by `_GlobalLinesFn`. Keeping the
        newline counts (a side input) off this step lets runners fuse it with whatever
        consumes the batches, so batches are never encoded between stages."""
        path, index, start, end, _ = split
        with _open(path) as f:
            if self.spec.multiline_records:
                segments: Iterable[tuple[bytes | memoryview, int, int]] = self._sequential(f)
            else:
                one = self._aligned(f, start, end, 0)
                segments = _pieces(*one, self._piece_size(one[0])) if one is not None else []
            for outputs in self._parsed(segments, path):
                for out in outputs:
                    if isinstance(out, TaggedOutput):
                        yield TaggedOutput(out.tag, (path, index, out.value))
                    else:
                        yield out

    def _parsed(
        self, segments: Iterable[tuple[bytes | memoryview, int, int]], path: str
    ) -> Iterator[list[Any]]:
        """The outputs of each segment, in order; with several threads the next segments are
        parsed in the pool while the caller hands this one downstream."""
        work = ((buf, offset, line) for buf, offset, line in segments if buf)
        threads = self.spec.threads
        if threads == 1:
            for buf, offset, line in work:
                yield self._segment_list(buf, offset, line, path)
            return
        pool = _pool(threads)
        pending: deque[Future[list[Any]]] = deque()
        try:
            for buf, offset, line in work:
                pending.append(pool.submit(self._segment_list, buf, offset, line, path))
                while len(pending) > threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()

    def _piece_size(self, buf: bytes) -> int:
        """Bytes of about ``batch_rows`` average lines of the buffer (at most piece_bytes),
        the average taken over its first ``_SAMPLE_BYTES``."""
        sample = min(len(buf), _SAMPLE_BYTES)
        lines = max(buf.count(b"\n", 0, sample), 1)
        return max(1, min(self.spec.piece_bytes, sample * self.spec.batch_rows // lines))

    def _segment_list(
        self, buf: bytes | memoryview, offset: int, line: int, path: str
    ) -> list[Any]:
        return list(self._segment(bytes(buf), offset, line, path))

    def _skip_preamble(self, data: bytes, at_file_start: bool) -> int:
        """Bytes to skip at the start of a file: BOM, and the header line of a CSV."""
        if not at_file_start:
            return 0
        skip = 3 if data.startswith(_BOM) else 0
        if self.spec.format == "csv" and self.spec.header:
            nl = data.find(b"\n", skip)
            skip = len(data) if nl < 0 else nl + 1
        return skip

    def _aligned(
        self, f: BinaryIO, start: int, end: int, newlines_before: int
    ) -> tuple[bytes, int, int] | None:
        """The bytes of the lines that start in [start, end), their offset and first line.
        The range's ends are found first and its bytes read once (no copy of a split cut
        or grown afterwards)."""
        first, line = 0, 1
        if start > 0:
            first = _line_end(f, start - 1, end)  # after the line that holds byte start - 1
            if first >= end:
                return None  # no line starts in this range
            line = 1 + newlines_before + (1 if first > start else 0)
        # through the end of the line that holds byte end - 1 (it may run past `end`)
        stop = _line_end(f, end - 1) if end > first else end
        f.seek(first)
        data = _read_exact(f, stop - first)
        skip = self._skip_preamble(data, start == 0)
        if skip:
            line += data.count(b"\n", 0, skip)
            data, first = data[skip:], first + skip
        return data, first, line

    def _sequential(self, f: BinaryIO) -> Iterator[tuple[bytes, int, int]]:
        """Whole file in chunks of ~split_bytes cut at record ends (multiline records)."""
        head = _read_through_newline(f, _read_exact(f, 4))
        skip = self._skip_preamble(head, True)
        offset = skip
        line = 1 + head.count(b"\n", 0, skip)
        f.seek(skip)
        carry = b""
        quote = ord(self.spec.quotechar)
        while True:
            chunk = _read_exact(f, self.spec.split_bytes)
            buf = carry + chunk
            if len(chunk) < self.spec.split_bytes:
                yield buf, offset, line
                return
            a, nl = _newline_positions(buf)
            idx = _record_ends(a, nl, quote)
            if len(idx) == 0:
                carry = buf
                continue
            cut = int(nl[idx[-1]]) + 1
            yield buf[:cut], offset, line
            offset += cut
            line += int(idx[-1]) + 1
            carry = buf[cut:]

    def _segment(self, buf: bytes, offset: int, line: int, path: str) -> Iterator[Any]:
        spec = self.spec
        if not buf.endswith(b"\n"):
            buf += b"\n"
        is_json = spec.format == "jsonl"
        multiline = spec.multiline_records
        units = _build_units(buf, line, multiline, spec.quotechar, is_json)
        rejected: list[tuple[int, str, str]] = []
        drop = np.zeros(len(units), dtype=bool)
        enc_name = "UTF-8" if spec._utf8 else spec.encoding
        text_enc = "utf-8" if spec._utf8 else spec.encoding
        for u, at in _undecodable_units(buf, units, spec.encoding).items():
            drop[u] = True
            fix = "set input.encoding, e.g. latin-1" if spec._utf8 else "check input.encoding"
            rejected.append(
                (
                    int(units.lines[u]),
                    f"invalid {enc_name} at byte offset {offset + at} ({fix})",
                    units.text(buf, u, text_enc),
                )
            )
        if not is_json:
            bare_cr = _bare_cr_units(buf, units, multiline, spec.quotechar) & ~drop
            for cr_unit in np.flatnonzero(bare_cr):
                rejected.append(
                    (
                        int(units.lines[cr_unit]),
                        "carriage return (\\r) inside the line without \\n; convert the "
                        "file to \\n or \\r\\n line endings",
                        units.text(buf, int(cr_unit), text_enc),
                    )
                )
            drop |= bare_cr
        if drop.any():
            buf, units = _take_units(buf, units, ~drop)
        if not spec._utf8:
            buf = buf.decode(spec.encoding).encode("utf-8")
            rebuilt = _build_units(buf, line, multiline, spec.quotechar, is_json)
            if len(rebuilt) != len(units):
                raise RuntimeError(f"{path}: transcoding changed the record structure")
            rebuilt.lines = units.lines
            units = rebuilt
        parsed = self._json(buf, units, path) if is_json else self._csv(buf, units)
        parsed.rejected = rejected + parsed.rejected
        typed, all_rejected = _finish(parsed, self.columns, spec, path)
        yield from _emit(typed, all_rejected, path, spec.batch_rows)

    def _csv(self, buf: bytes, units: _Units) -> _Parsed:
        tables, row_units, bad = _parse_csv_units(buf, units, self.columns, self.spec)
        schema = _string_schema(self.columns)
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        owner = np.concatenate(row_units) if row_units else np.zeros(0, dtype=np.int64)
        return _Parsed(
            table=table,
            lines=units.lines[owner],
            row_text=lambda i: units.text(buf, int(owner[i])),
            rejected=[(int(units.lines[u]), reason, units.text(buf, u)) for u, reason in bad],
        )

    def _json(self, buf: bytes, units: _Units, path: str) -> _Parsed:
        objects, owner, bad = _parse_json_units(buf, units)
        rejected = [(int(units.lines[u]), reason, units.text(buf, u)) for u, reason in bad]
        is_obj = np.fromiter((isinstance(o, dict) for o in objects), dtype=bool, count=len(objects))
        for k in np.flatnonzero(~is_obj):
            u = int(owner[k])
            kind = type(objects[k]).__name__
            rejected.append(
                (int(units.lines[u]), f"not a JSON object (a {kind})", units.text(buf, u))
            )
        if not is_obj.all():
            objects = [o for o in objects if isinstance(o, dict)]
            owner = owner[is_obj]
        arrays = []
        extra: list[tuple[np.ndarray, Callable[[int], str]]] = []
        for name in self.columns:
            arr, nested = _json_column([o.get(name) for o in objects])
            arrays.append(arr)
            if nested.any():
                message = f"column {name!r}: nested JSON value (object or array)"
                extra.append((nested, partial(_fixed_reason, message)))
        table = pa.Table.from_arrays(arrays, schema=_string_schema(self.columns))
        return _Parsed(
            table=table,
            lines=units.lines[owner],
            row_text=lambda i: units.text(buf, int(owner[i])),
            rejected=rejected,
            extra_bad=extra,
        )


class _ReadParquetSplitFn(beam.DoFn):
    """Read one Parquet row group into batches + rejections."""

    def __init__(self, spec: InputSpec, columns: tuple[str, ...]):
        self.spec = spec
        self.columns = columns

    def process(self, split: ParquetSplit) -> Iterator[Any]:
        path, group, rows_before = split
        with _open(path) as f:
            table = pq.ParquetFile(f).read_row_group(group, columns=list(self.columns))
        table = table.select(list(self.columns))
        lines = rows_before + 1 + np.arange(table.num_rows, dtype=np.int64)

        def row_text(i: int) -> str:
            values = table.slice(i, 1).to_pylist()[0]
            return ",".join("" if values[c] is None else str(values[c]) for c in self.columns)

        parsed = _Parsed(table=table, lines=lines, row_text=row_text, rejected=[])
        typed, rejected = _finish(parsed, self.columns, self.spec, path)
        yield from _emit(typed, rejected, path, self.spec.batch_rows)


# --------------------------------------------------------------------------- transform


class _GlobalLinesFn(beam.DoFn):
    """Rejected rows of one split with file-global line numbers (adds the newlines of the
    file's earlier splits); only rejected rows pass here, never batches."""

    def process(
        self,
        tagged: tuple[str, int, pd.DataFrame],
        newline_counts: Mapping[tuple[str, int], int],
    ) -> Iterator[pd.DataFrame]:
        path, index, frame = tagged
        try:
            before = sum(newline_counts[(path, j)] for j in range(index))
        except KeyError as exc:
            raise RuntimeError(f"{path}: newline count of split {exc} is missing") from None
        if before:
            frame = frame.copy()
            frame["line"] = frame["line"] + before
        yield frame


class ReadMicrodata(beam.PTransform[PBegin, dict[str, PCollection[Any]]]):
    """Read the input files as {"batches": DataFrames, "rejected": DataFrames}.

    The driver inspects the files (:func:`inspect_input`) and cuts them into splits; see the
    module docstring for how splits are parsed in parallel and how line numbers are kept.
    """

    def __init__(self, spec: InputSpec):
        super().__init__()
        self.spec = spec

    def expand(self, pbegin: PBegin) -> dict[str, PCollection[Any]]:
        spec = self.spec
        columns, infos = _inspect(spec)
        if spec.format == "parquet":
            groups = parquet_splits(infos)
            parse_fn: beam.DoFn = TimedDoFn("read", _ReadParquetSplitFn(spec, columns))
            parsed = _distributed(pbegin, groups) | "Parse" >> beam.ParDo(parse_fn).with_outputs(  # type: ignore[no-untyped-call]
                _REJECTED, main=_BATCHES
            )
        else:
            splits = [s for info in infos for s in _text_splits(info.path, info.size, spec)]
            parse_fn = TimedDoFn("read", _ReadTextSplitFn(spec, columns))
            distributed = _distributed(pbegin, splits)
            parsed = distributed | "Parse" >> beam.ParDo(  # type: ignore[no-untyped-call]
                parse_fn
            ).with_outputs(_REJECTED, main=_BATCHES)
            if all(split[4] == 1 for split in splits):  # one split per file: lines are global
                rejected = parsed[_REJECTED] | "GlobalLines" >> beam.Map(_untag)
            else:
                count_fn: beam.DoFn = _CountNewlinesFn()  # type: ignore[no-untyped-call]
                counts = distributed | "CountNewlines" >> beam.ParDo(  # type: ignore[no-untyped-call]
                    count_fn
                )
                rejected = parsed[_REJECTED] | "GlobalLines" >> beam.ParDo(  # type: ignore[no-untyped-call]
                    _GlobalLinesFn(), newline_counts=AsDict(counts)
                )
            return {"batches": parsed[_BATCHES], "rejected": rejected}
        return {"batches": parsed[_BATCHES], "rejected": parsed[_REJECTED]}


def _distributed(pbegin: PBegin, splits: Sequence[Any]) -> PCollection[Any]:
    """The splits as a PCollection, redistributed across workers when there are several.
    One split (a small input) skips the Reshuffle: its shuffle stage and five transforms are
    a fixed cost of every run (about a tenth of a small run's Beam overhead) that buys
    nothing with a single element."""
    created = pbegin | "Splits" >> beam.Create(list(splits))  # type: ignore[no-untyped-call]
    if len(splits) <= 1:
        return created
    return created | "Distribute" >> beam.Reshuffle()  # type: ignore[no-untyped-call]


def _untag(tagged: tuple[str, int, pd.DataFrame]) -> pd.DataFrame:
    """The rejected rows of the only split of a file: their line numbers are already the
    file's (no earlier split to add)."""
    return tagged[2]
