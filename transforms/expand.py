"""A frequency table back into rows: the recoding's input without reading the file again.

    frequency table (one DataFrame) ─► ExpandTable ─► batches of its rows, each distinct
                                                     row ``count`` times, categoricals
                                                     over values typed as read

The frequency table a release's search starts from (``anonymize.Summarise``) holds the
distinct (QI, SA, person id) combinations of the accepted member rows and how often each
occurs: as a multiset it *is* those rows' counted columns, which are all that recoding,
verifying and writing a release use. Expanding it gives the same rows in another order;
the writer puts them in a uniformly random order anyway (``WriteTable``'s shuffle), so the
published table has the same distribution either way, and the verifier still counts the
rows written. The file is not read (and parsed, held out and hashed) a second and third
time, and the recoding cannot meet rows the search never saw.

Columns come back as categoricals over values in the dtypes the read gives them
(``io.read_dtype``): the table holds each value's string (``astype("str")``), and the
strings of ``Int64`` and ``float64`` values parse back to the same numbers (floats print
the shortest round-tripping repr). Categoricals, because every step after this one works
per distinct value (the hierarchies' encoding, the verifier's counts, the writer's
dictionary columns): a batch is its codes, not a string per cell. The person id stays the
64-bit hash the table carries (a ``uint64`` column, which every
``FrequencyTable(hashed=...)`` takes as is).

Only for runners that run in this process (``pipelines.runner.plans_ahead``): there the
table is already held here for the search. A distributed runner reads again instead, in
parallel on its workers, rather than expand the table on one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from privpipe.transforms.context import COUNT
from privpipe.transforms.io import ColumnType, read_dtype
from privpipe.transforms.timing import TimedDoFn


class _Column:
    """One column of the table as codes into its distinct values, typed as read."""

    __slots__ = ("codes", "values")

    def __init__(self, column: pd.Series, kind: ColumnType) -> None:
        if column.dtype == np.uint64:  # the person id's hashes: kept as they are
            self.codes = None
            self.values: Any = column.to_numpy()
            return
        if not isinstance(column.dtype, pd.CategoricalDtype):  # as Summarise makes it
            raise TypeError(f"column {column.name!r}: expected a categorical, not {column.dtype}")
        self.codes = column.cat.codes.to_numpy()  # int8/16/32 as kept: no copy
        self.values = pd.CategoricalDtype(
            pd.Index(_typed(column.cat.categories.to_numpy(dtype=object), kind))
        )

    def take(self, rows: npt.NDArray[np.int64]) -> Any:
        if self.codes is None:
            return self.values[rows]
        return pd.Categorical.from_codes(self.codes[rows], dtype=self.values)


def _typed(strings: npt.NDArray[np.object_], kind: ColumnType) -> Any:
    """The table's value strings as the read types them (``io.read_dtype``)."""
    text = pa.array(strings, type=pa.string())
    if kind == "integer":
        return pd.array(pc.cast(text, pa.int64()), dtype=read_dtype(kind))
    if kind == "float":
        return pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
    return pd.array(text, dtype=read_dtype(kind))


class _ExpandFn(beam.DoFn):  # type: ignore[misc]
    def __init__(
        self, columns: Sequence[str], types: Mapping[str, ColumnType], batch_rows: int
    ) -> None:
        self.columns = list(columns)
        self.types = dict(types)
        self.batch_rows = batch_rows

    def process(self, table: pd.DataFrame) -> Iterator[pd.DataFrame]:
        counts = table[COUNT].to_numpy(dtype=np.int64)
        columns = {c: _Column(table[c], self.types.get(c, "string")) for c in self.columns}
        ends = np.cumsum(counts)  # expanded rows [ends[i] - counts[i], ends[i]) are row i's
        starts = ends - counts
        total = int(ends[-1]) if len(ends) else 0
        for lo in range(0, total, self.batch_rows):
            hi = min(lo + self.batch_rows, total)
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(ends, hi - 1, side="right"))
            repeats = np.minimum(ends[first : last + 1], hi) - np.maximum(
                starts[first : last + 1], lo
            )
            rows = np.repeat(np.arange(first, last + 1, dtype=np.int64), repeats)
            yield pd.DataFrame({c: col.take(rows) for c, col in columns.items()})


class ExpandTable(beam.PTransform):  # type: ignore[misc]
    """frequency table → batches of about ``batch_rows`` rows of ``columns``: each distinct
    row as many times as it was counted, as categoricals over values typed as the read
    types them (``types``)."""

    def __init__(
        self,
        columns: Sequence[str],
        types: Mapping[str, ColumnType],
        batch_rows: int,
    ) -> None:
        super().__init__()
        self.columns = list(columns)
        self.types = dict(types)
        self.batch_rows = batch_rows

    def expand(self, table: beam.PCollection) -> beam.PCollection:
        fn = _ExpandFn(self.columns, self.types, self.batch_rows)
        return table | "Rows" >> beam.ParDo(TimedDoFn("expand", fn))
