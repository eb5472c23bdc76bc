"""The input read on the driver, without a Beam pipeline: the same parsing and typing as
:class:`transforms.io.ReadMicrodata` (its split DoFns are called in this process, one split
after another), for operator tools such as ``privpipe tune`` that look at the data once.

Batches come one at a time (at most ``batch_rows`` rows each); rejected rows are kept
(``file, line, reason, text``) for the caller's check. One process, one core: fine for an
operator's look at the data, not for a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
from apache_beam.pvalue import TaggedOutput

from privpipe.transforms.io import (
    REJECTED_COLUMNS,
    InputSpec,
    TextSplit,
    _CountNewlinesFn,
    _inspect,
    _ReadParquetSplitFn,
    _ReadTextSplitFn,
    _text_splits,
    parquet_splits,
)


@dataclass
class DriverRead:
    """Batches of the input as :class:`ReadMicrodata` would type them; ``rejected`` counts
    the rows the reader refused so far, :meth:`rejected_rows` lists them."""

    spec: InputSpec
    rejected: int = 0
    rows: int = 0
    _rejected: list[pd.DataFrame] = field(default_factory=list)
    _splits: list[TextSplit] = field(default_factory=list)

    def rejected_rows(self) -> pd.DataFrame:
        """The rejected rows so far (columns of ``transforms.io.REJECTED_COLUMNS``), with
        file-global line numbers (the newlines of a file's earlier splits added, as the
        run's ``_GlobalLinesFn`` does)."""
        if not self._rejected:
            return pd.DataFrame(columns=list(REJECTED_COLUMNS))
        return pd.concat(self._rejected, ignore_index=True)

    def _global(self, path: str, index: int, frame: pd.DataFrame) -> pd.DataFrame:
        if index == 0:
            return frame
        counter = _CountNewlinesFn()  # type: ignore[no-untyped-call]
        before = sum(
            n
            for split in self._splits
            if split[0] == path and split[1] < index
            for _, n in counter.process(split)
        )
        return frame.assign(line=frame["line"] + before)

    def batches(self) -> Iterator[pd.DataFrame]:
        columns, infos = _inspect(self.spec)
        if self.spec.format == "parquet":
            pq_fn = _ReadParquetSplitFn(self.spec, columns)
            groups = parquet_splits(infos)
            outputs = (out for split in groups for out in pq_fn.process(split))
        else:
            text_fn = _ReadTextSplitFn(self.spec, columns)
            self._splits = [s for i in infos for s in _text_splits(i.path, i.size, self.spec)]
            outputs = (out for split in self._splits for out in text_fn.process(split))
        for out in outputs:
            if isinstance(out, TaggedOutput):
                value = out.value
                frame = self._global(*value) if isinstance(value, tuple) else value
                self.rejected += len(frame)
                self._rejected.append(frame)
                continue
            self.rows += len(out)
            yield out
