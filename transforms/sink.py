"""Writing tables (CSV/Parquet) from a PCollection of DataFrames, and small JSON documents.

:class:`WriteTable` writes in two steps so that no worker ever holds the whole table:

1. every batch is written by whichever worker holds it, as a shard with a unique name under
   ``<directory>/.shards-<name>/`` (CSV shards have no header);
2. one merge step receives the list of shard paths (a list side input of one impulse: the
   merge runs once, after every shard, also when there is none), writes
   ``<directory>/.<name>.<ext>.tmp-<uuid>`` (the header, then every shard in turn) and renames
   it to ``<directory>/<name>.<ext>``, then removes the shards folder.

Only shards whose paths reached the merge are used: a shard left behind by a retried bundle
is never concatenated (it is deleted with the folder), so a retry cannot duplicate rows.
Files go through Beam's ``FileSystems`` (local paths, gs://, …).

With ``shuffle_rows`` (a singleton PCollection: about how many rows will come) the table is
written in a uniformly random order — a scatter shuffle, batches not rows, memory bounded by
one bucket (``BUCKET_ROWS``):

1. every batch gives each of its rows an independent uniform bucket in ``0..B-1`` (OS
   CSPRNG, ``dp.secure_random.SecureRandom``) and writes its rows, in bucket order, as one
   file under the shards folder, one record batch per bucket (the piece), emitting
   ``(bucket, piece)`` for each bucket it has rows of;
2. the pieces are grouped by bucket (only paths travel); each bucket's rows are read,
   put in a uniformly random order (``SecureRandom.permutation``) and written as the shard
   ``<bucket:06d>-<uuid>``;
3. the merge concatenates the shards in bucket order (their names sort so).

Categorical columns (a recoding's labels) travel as Arrow dictionary columns, ids and not
a string per cell, up to the shard's writer, which writes their values; a dictionary larger
than a piece's rows is decoded in the scatter (reading a piece reads its file's dictionaries).

Independent uniform buckets, then a uniform order within each bucket, is a uniform
permutation of all rows whatever the input order or batching; a fresh one per table.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePath
from typing import Any, Literal

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import AsList, AsSingleton, PCollection
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from privpipe.anonymity.arrays import small_key_order
from privpipe.dp.secure_random import SecureRandom
from privpipe.errors import ConfigError
from privpipe.formulas import escape, escape_table
from privpipe.transforms.planning import searching_ahead
from privpipe.transforms.timing import TimedDoFn
from privpipe.workers import available_cores

__all__ = ["WriteTable", "load_json", "write_json", "write_json_step", "write_table"]

_COPY_CHUNK = 8 << 20
BUCKET_ROWS = 1 << 18  # rows per shuffle bucket on average: the memory one bucket needs
MAX_WRITE_THREADS = 4  # buckets permuted and written at once, at most (one per core)
_DICTIONARY_MIN = 64  # the scatter keeps dictionaries of up to a piece's rows, or this many


def _create(path: str) -> Any:
    return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _open(path: str) -> Any:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _csv_text(frame: pd.DataFrame, delimiter: str, header: bool) -> bytes:
    """CSV (RFC 4180, \\n line ends, empty field for missing) of one batch.

    Rows go through pyarrow's writer, about 16x faster than pandas' on a 64k-row batch
    (it quotes every string value, which any CSV reader accepts); the header line is
    written with minimal quoting, as people expect to read it. pandas is the fallback
    for columns Arrow cannot type (mixed Python objects). Text cells that a spreadsheet
    would run as a formula are escaped (:mod:`privpipe.formulas`)."""
    try:
        table = _decoded(escape_table(pa.Table.from_pandas(frame, preserve_index=False)))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        safe = frame.rename(columns=lambda c: escape(str(c)))
        for col in [c for c in safe.columns if safe[c].dtype.kind == "O"]:
            safe[col] = safe[col].map(escape)
        text: str = safe.to_csv(
            index=False, header=header, sep=delimiter, lineterminator="\n", na_rep=""
        )
        return text.encode("utf-8")
    sink = io.BytesIO()
    if header:
        sink.write(_header_line(frame.columns, delimiter))
    if len(frame):
        options = pa_csv.WriteOptions(
            include_header=False, delimiter=delimiter, quoting_style="needed"
        )
        pa_csv.write_csv(table, sink, options)
    return sink.getvalue()


def _decoded(table: pa.Table, keep_up_to: int = -1) -> pa.Table:
    """The table with its dictionary columns (pandas Categoricals) as their plain values,
    but those whose dictionaries have at most ``keep_up_to`` values. What is written is
    the values, in the type a column of them has (CSV: Arrow's writer is faster on plain
    columns; Parquet: the schema a reader gets is the values' type); the scatter keeps the
    dictionaries small beside a piece (reading a piece reads its file's dictionaries)."""
    for i, field in enumerate(table.schema):
        column = table.column(i)
        if pa.types.is_dictionary(field.type) and (
            keep_up_to < 0 or any(len(chunk.dictionary) > keep_up_to for chunk in column.chunks)
        ):
            table = table.set_column(i, field.name, column.cast(field.type.value_type))
    return table


def _header_line(columns: Iterable[Any], delimiter: str) -> bytes:
    """The header row, minimally quoted, column names escaped as text cells are."""
    line = io.StringIO()
    csv.writer(line, delimiter=delimiter, lineterminator="\n").writerow(
        [escape(str(c)) for c in columns]
    )
    return line.getvalue().encode("utf-8")


def _check_columns(frame: pd.DataFrame, columns: tuple[str, ...], name: str) -> None:
    """A batch must have exactly the declared columns (a mismatch is a bug upstream)."""
    have = list(frame.columns)
    if len(have) == len(columns) and set(have) == set(columns):
        return
    missing = [c for c in columns if c not in have]
    extra = [c for c in have if c not in columns]
    dupes = sorted({str(c) for c in have if have.count(c) > 1})
    raise ValueError(
        f"WriteTable({name!r}): batch columns do not match the declared columns "
        f"(missing {missing}, extra {extra}, duplicated {dupes})"
    )


def _remove_folder(path: str) -> None:
    """Delete a folder and everything in it (object stores: every object under the prefix)."""
    if "://" in path:
        pattern = FileSystems.join(path, "*")
        found = FileSystems.match([pattern])[0].metadata_list  # type: ignore[no-untyped-call]
        if found:
            FileSystems.delete([m.path for m in found])  # type: ignore[no-untyped-call]
    elif FileSystems.exists(path):  # type: ignore[no-untyped-call]
        FileSystems.delete([path])  # type: ignore[no-untyped-call]


class _WriteShardFn(beam.DoFn):
    """Write one batch as a uniquely named shard; emit the shard path."""

    def __init__(
        self, shard_dir: str, name: str, columns: tuple[str, ...], fmt: str, delimiter: str
    ):
        self.shard_dir = shard_dir
        self.name = name
        self.columns = columns
        self.fmt = fmt
        self.delimiter = delimiter

    def process(self, frame: pd.DataFrame) -> Iterator[str]:
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"WriteTable({self.name!r}) expects DataFrames, got {type(frame)}")
        _check_columns(frame, self.columns, self.name)
        if frame.empty:
            return
        path = FileSystems.join(self.shard_dir, f"{uuid.uuid4().hex}.{self.fmt}")
        _write_shard(path, frame[list(self.columns)], self.fmt, self.delimiter)
        yield path


def _write_shard(path: str, frame: pd.DataFrame | pa.Table, fmt: str, delimiter: str) -> None:
    """One shard (a DataFrame or an Arrow table): CSV rows without header, or Parquet."""
    with _create(path) as out:
        if isinstance(frame, pa.Table):
            if fmt != "csv":
                pq.write_table(_decoded(frame), out)
            elif frame.num_rows:
                sink = io.BytesIO()
                options = pa_csv.WriteOptions(
                    include_header=False, delimiter=delimiter, quoting_style="needed"
                )
                # as _csv_text does: escaped per distinct value, then written as values
                pa_csv.write_csv(_decoded(escape_table(frame)), sink, options)
                out.write(sink.getvalue())
        elif fmt == "csv":
            out.write(_csv_text(frame, delimiter, header=False))
        else:
            pq.write_table(_decoded(pa.Table.from_pandas(frame, preserve_index=False)), out)


def _arrow(frame: pd.DataFrame) -> pa.Table | None:
    """The batch as an Arrow table, or None where Arrow cannot type it (mixed objects)."""
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def shuffle_buckets(rows: int) -> int:
    """Buckets of the scatter shuffle for about ``rows`` rows: ``BUCKET_ROWS`` each on average."""
    return max(1, -(-int(rows) // BUCKET_ROWS))


class _OnThreads(beam.DoFn):
    """A DoFn whose elements' heavy work runs on a few threads while the stage's thread
    goes on: Arrow's take, IPC and CSV writers and its concatenation run without the GIL,
    so a runner that runs a stage on one thread can still use every core.

    As many elements are worked on at once as there are cores not taken by a search
    planned ahead in a worker process of this one (``planning.searching_ahead``; at most
    ``MAX_WRITE_THREADS``): beside such a search, a second thread only slowed it
    (RESULTS.md, seventeenth round), so with one core left each element is worked on
    inline, as a plain DoFn would. What an element gives is emitted once its work is done
    (in ``process`` while others wait, the rest at the bundle's end: the order of these
    outputs means nothing); an error raised on a thread is raised here."""

    def setup(self) -> None:
        self._pool = ThreadPoolExecutor(MAX_WRITE_THREADS, thread_name_prefix="privpipe-write")

    def start_bundle(self) -> None:
        self._pending: collections.deque[Future[list[Any]]] = collections.deque()

    def _submit(self, work: Callable[..., list[Any]], *args: Any) -> Iterator[Any]:
        """Run ``work(*args)`` (on a thread when cores are free); emit the outputs of the
        works done."""
        threads = write_threads()
        if threads <= 1:
            while self._pending:
                yield from self._pending.popleft().result()
            yield from work(*args)
            return
        self._pending.append(self._pool.submit(work, *args))
        while len(self._pending) > threads:
            yield from self._pending.popleft().result()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        while self._pending:
            for output in self._pending.popleft().result():
                yield WindowedValue(output, MIN_TIMESTAMP, (GlobalWindow(),))

    def teardown(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class _ScatterFn(_OnThreads):
    """Give each row of a batch a uniform bucket (CSPRNG) and write the batch once, its rows
    gathered in bucket order: an Arrow IPC file with one record batch per bucket (compact
    strings, no Python objects); emit ``(bucket, "<file>#<record batch>")`` per bucket
    present. Where Arrow cannot type the batch, one pickled DataFrame per bucket (its path).
    One file per batch, not per batch and bucket: the pieces' count grows with the
    batches times the buckets, both linear in the rows."""

    def __init__(self, shard_dir: str, name: str, columns: tuple[str, ...]):
        self.shard_dir = shard_dir
        self.name = name
        self.columns = columns

    def process(self, frame: pd.DataFrame, rows: int) -> Iterator[tuple[int, str]]:
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"WriteTable({self.name!r}) expects DataFrames, got {type(frame)}")
        _check_columns(frame, self.columns, self.name)
        if frame.empty:
            return
        yield from self._submit(self._scatter, frame[list(self.columns)], rows)

    def _scatter(self, frame: pd.DataFrame, rows: int) -> list[tuple[int, str]]:
        pieces: list[tuple[int, str]] = []
        buckets = shuffle_buckets(rows)
        table = _arrow(frame)
        bucket = SecureRandom().integers(buckets, len(frame))
        order = small_key_order(bucket, buckets)
        ranked = bucket[order]
        edges = np.flatnonzero(np.diff(ranked)) + 1
        starts = np.concatenate([[0], edges]).tolist()
        ends = np.concatenate([edges, [len(frame)]]).tolist()
        if table is None:
            for start, end in zip(starts, ends, strict=True):
                b = int(ranked[start])
                path = FileSystems.join(self.shard_dir, f"piece-{b:06d}-{uuid.uuid4().hex}.pickle")
                with _create(path) as out:
                    part = frame.iloc[order[start:end]]
                    out.write(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
                pieces.append((b, path))
            return pieces
        limit = max(_DICTIONARY_MIN, len(frame) // buckets)
        gathered = _decoded(table, keep_up_to=limit).take(pa.array(order))
        whole = pa.concat_batches(gathered.to_batches())  # one record batch, sliced per bucket
        buffer = pa.BufferOutputStream()
        with pa.ipc.new_file(buffer, whole.schema) as writer:
            for start, end in zip(starts, ends, strict=True):
                writer.write_batch(whole.slice(start, end - start))
        path = FileSystems.join(self.shard_dir, f"scatter-{uuid.uuid4().hex}.arrow")
        with _create(path) as out:
            out.write(buffer.getvalue())
        return [(int(ranked[start]), f"{path}#{index}") for index, start in enumerate(starts)]


def _read_piece(piece: str) -> pa.Table | pd.DataFrame:
    """One bucket's rows of one batch: record batch ``i`` of ``<file>#<i>`` (only that
    batch and the file's dictionaries are read), or a pickled DataFrame's path."""
    if piece.endswith(".pickle"):  # a path; its folder may hold a "#"
        with _open(piece) as src:
            frame: pd.DataFrame = pickle.loads(src.read())  # our own temporary files only
        return frame
    path, _, index = piece.rpartition("#")
    with _open(path) as src:
        batch = pa.ipc.open_file(src).get_batch(int(index))
    return pa.Table.from_batches([batch])


class _PermuteBucketFn(_OnThreads):
    """Read one bucket's pieces, order its rows uniformly at random (CSPRNG), write the
    bucket's shard (named by the bucket, so the merge puts shards in bucket order).
    Buckets are permuted and written on threads (``_OnThreads``: 9M rows of 8 columns in
    6.3 s on one thread, 3.5 s on two)."""

    def __init__(self, shard_dir: str, fmt: str, delimiter: str):
        self.shard_dir = shard_dir
        self.fmt = fmt
        self.delimiter = delimiter

    def process(self, element: tuple[int, Iterable[str]]) -> Iterator[str]:
        bucket, pieces = element
        yield from self._submit(self._write_bucket, int(bucket), list(pieces))

    def _write_bucket(self, bucket: int, pieces: list[str]) -> list[str]:
        tables: list[pa.Table] = []
        frames: list[pd.DataFrame] = []
        for piece in sorted(pieces):
            read = _read_piece(piece)
            if isinstance(read, pa.Table):
                tables.append(read)
            else:
                frames.append(read)
        table: pd.DataFrame | pa.Table
        if len({t.schema for t in tables}) > 1:  # a column encoded in some pieces only:
            tables = [_decoded(t) for t in tables]  # all as values (still mixed: pandas)
        if frames or len({t.schema for t in tables}) > 1:
            frames += [t.to_pandas() for t in tables]
            table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            del frames, tables
            table = table.iloc[SecureRandom().permutation(len(table))]
        else:
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            del tables
            table = table.take(pa.array(SecureRandom().permutation(table.num_rows)))
        path = FileSystems.join(self.shard_dir, f"{bucket:06d}-{uuid.uuid4().hex}.{self.fmt}")
        _write_shard(path, table, self.fmt, self.delimiter)
        return [path]


def write_threads() -> int:
    """Elements an ``_OnThreads`` step works on at once now: the cores this process may
    use less those busy planning ahead, at least one, at most ``MAX_WRITE_THREADS``."""
    free = available_cores() - searching_ahead()
    return max(1, min(MAX_WRITE_THREADS, free))


def concat_local(path: str, head: bytes, parts: Sequence[str]) -> None:
    """Write ``head`` then every local file of ``parts`` in turn to the new local file
    ``path``. The bytes are copied by the kernel (``os.copy_file_range``), not read into
    this process and written back: the 10M demo's 748 MB k5 table from 35 shards in
    0.36–0.38 s against 0.64–1.32 s through Beam's file objects. Where the kernel cannot
    (another OS, a file system without it), the rest is copied as before. The folder is
    made if missing, as Beam's local ``create`` does."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as out:
        out.write(head)
        out.flush()
        for part in parts:
            with open(part, "rb") as src:
                _copy_rest(src, out)


def _copy_rest(src: Any, out: Any) -> None:
    """The rest of ``src`` appended to ``out`` (both open binary files). ``out``'s buffer
    is empty on entry and on return: the kernel writes behind it, at the file's offset."""
    copy_range = getattr(os, "copy_file_range", None)
    while copy_range is not None:
        try:
            copied = copy_range(src.fileno(), out.fileno(), _COPY_CHUNK)
        except OSError:  # not supported here: copy what is left below
            break
        if copied == 0:  # the end of ``src``
            return
    out.seek(0, os.SEEK_END)
    shutil.copyfileobj(src, out, _COPY_CHUNK)
    out.flush()  # before the next part's kernel copy writes at the offset


class _MergeShardsFn(beam.DoFn):
    """Concatenate all shards into the final file (temp name, then rename); drop the shards."""

    def __init__(
        self,
        directory: str,
        shard_dir: str,
        name: str,
        columns: tuple[str, ...],
        fmt: str,
        delimiter: str,
    ):
        self.directory = directory
        self.shard_dir = shard_dir
        self.name = name
        self.columns = columns
        self.fmt = fmt
        self.delimiter = delimiter

    def process(self, start: bytes, shard_paths: Sequence[str]) -> Iterator[str]:
        """``start``: the impulse that runs the merge once; ``shard_paths``: every shard."""
        final = FileSystems.join(self.directory, f"{self.name}.{self.fmt}")
        temp = FileSystems.join(
            self.directory, f".{self.name}.{self.fmt}.tmp-{uuid.uuid4().hex[:12]}"
        )
        shards = sorted(shard_paths)
        if self.fmt == "csv":
            self._merge_csv(temp, shards)
        else:
            self._merge_parquet(temp, shards)
        FileSystems.rename([temp], [final])  # type: ignore[no-untyped-call]
        _remove_folder(self.shard_dir)
        yield final

    def _merge_csv(self, temp: str, shards: list[str]) -> None:
        header = _csv_text(pd.DataFrame(columns=list(self.columns)), self.delimiter, header=True)
        if FileSystems.get_scheme(self.directory) is None:  # local: temp and shards in it
            concat_local(temp, header, shards)
            return
        with _create(temp) as out:
            out.write(header)
            for shard in shards:
                with _open(shard) as src:
                    shutil.copyfileobj(src, out, _COPY_CHUNK)

    def _merge_parquet(self, temp: str, shards: list[str]) -> None:
        schemas = []
        for shard in shards:
            with _open(shard) as src:
                schemas.append(pq.read_schema(src))
        if schemas:
            schema = pa.unify_schemas(schemas, promote_options="permissive")
        else:
            schema = pa.schema([(c, pa.string()) for c in self.columns])
        if schema.names != list(self.columns):
            raise ValueError(
                f"WriteTable({self.name!r}): shard columns {schema.names} differ from "
                f"{list(self.columns)}"
            )
        with _create(temp) as out, pq.ParquetWriter(out, schema) as writer:
            for shard in shards:
                with _open(shard) as src:
                    parquet = pq.ParquetFile(src)
                    for group in range(parquet.num_row_groups):
                        table = parquet.read_row_group(group)
                        writer.write_table(table.cast(schema))


class WriteTable(beam.PTransform[PCollection[pd.DataFrame], PCollection[str]]):
    """PCollection[pd.DataFrame] -> one file <directory>/<name>.csv|.parquet with a header.

    Returns a PCollection with the single final path. Columns are written in the order of
    `columns`; a batch with missing or extra columns raises (a bug upstream). An empty input
    still produces a file: the header only (Parquet: the schema, every column a string).
    With `shuffle_rows` (a singleton PCollection of about how many rows will come; it sets
    the number of buckets) the rows are written in a uniformly random order drawn from the
    OS CSPRNG (module docstring); there is no seed.
    """

    def __init__(
        self,
        directory: str,
        name: str,
        columns: Sequence[str],
        format: Literal["csv", "parquet"] = "csv",
        delimiter: str = ",",
        shuffle_rows: PCollection[int] | None = None,
    ):
        super().__init__()
        if format not in ("csv", "parquet"):
            raise ConfigError(f"output.format: {format!r} is not supported; use csv or parquet")
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"':
            raise ConfigError(f"output delimiter {delimiter!r} must be one character, e.g. ','")
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"WriteTable: invalid table name {name!r}")
        cols = tuple(columns)
        if not cols or len(set(cols)) != len(cols):
            raise ValueError(f"WriteTable({name!r}): columns must be distinct and non-empty")
        self.directory = directory
        self.name = name
        self.columns = cols
        self.format = format
        self.delimiter = delimiter
        self.shuffle_rows = shuffle_rows

    def expand(self, batches: PCollection[pd.DataFrame]) -> PCollection[str]:
        shard_dir = FileSystems.join(self.directory, f".shards-{self.name}")
        args = (self.name, self.columns, self.format, self.delimiter)
        stage = f"write:{PurePath(self.directory).name if self.name == 'data' else self.name}"
        merge: beam.DoFn = TimedDoFn(stage, _MergeShardsFn(self.directory, shard_dir, *args))
        shards: PCollection[str]
        if self.shuffle_rows is None:
            write: beam.DoFn = TimedDoFn(stage, _WriteShardFn(shard_dir, *args))
            shards = batches | "WriteShards" >> beam.ParDo(write)  # type: ignore[no-untyped-call]
        else:
            scatter: beam.DoFn = TimedDoFn(stage, _ScatterFn(shard_dir, self.name, self.columns))
            permute: beam.DoFn = TimedDoFn(
                stage, _PermuteBucketFn(shard_dir, self.format, self.delimiter)
            )
            shards = (
                batches
                | "Scatter" >> beam.ParDo(scatter, AsSingleton(self.shuffle_rows))  # type: ignore[no-untyped-call]
                | "GroupBuckets" >> beam.GroupByKey()  # type: ignore[no-untyped-call]
                | "PermuteBuckets" >> beam.ParDo(permute)  # type: ignore[no-untyped-call]
            )
        # one impulse with the shard paths as a list side input: the merge runs once, after
        # every shard (two transforms; CombineGlobally(ToList) expanded to eight, a fixed
        # cost of every table of every run)
        paths: PCollection[str] = (
            batches.pipeline
            | "StartMerge" >> beam.Impulse()  # type: ignore[no-untyped-call]
            | "Merge" >> beam.ParDo(merge, AsList(shards))  # type: ignore[no-untyped-call]
        )
        return paths


def _json_default(value: Any) -> Any:
    """numpy scalars/arrays and paths -> plain JSON values; anything else is an error."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"write_json: {type(value).__name__} is not JSON serializable")


def write_json(path: str, obj: Any) -> None:
    """Write obj as indented JSON via a temp file + os.replace (readers never see half a file).

    Keys keep their insertion order; NaN/Infinity raise ValueError (not valid JSON).
    """
    text = json.dumps(
        obj, indent=2, sort_keys=False, allow_nan=False, ensure_ascii=False, default=_json_default
    )
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.chmod(temp, 0o644)  # mkstemp creates 0600; the documents are meant to be read
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def write_table(frame: pd.DataFrame, path: str, fmt: str, delimiter: str = ",") -> None:
    """One small in-memory table (e.g. a DP release's cells) as CSV or Parquet, atomically."""
    temp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    with _create(temp) as out:
        if fmt == "csv":
            out.write(_csv_text(frame, delimiter, header=True))
        elif fmt == "parquet":
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), out)
        else:
            raise ConfigError(f"output.format must be csv or parquet, got {fmt!r}")
    FileSystems.rename([temp], [path])  # type: ignore[no-untyped-call]


def write_json_step(obj: Any, path: str) -> str:
    """``write_json`` in the argument order of a ``beam.Map`` over the object; returns path."""
    write_json(path, obj)
    return path


def load_json(path: str | Path) -> Any:
    """A JSON file written by :func:`write_json`."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)
