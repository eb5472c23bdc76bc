"""The input read on the driver, without a Beam pipeline: the same parsing and typing as
:class:`transforms.io.ReadMicrodata` (its split DoFns are called in this process, one split
after another), for operator tools such as ``privpipe tune`` that look at the data once.

Batches come one at a time (at most ``batch_rows`` rows each); rejected rows are counted,
not kept. One process, one core: fine for an operator's look at the data, not for a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd
from apache_beam.pvalue import TaggedOutput

from transforms.io import (
    InputSpec,
    ParquetSplit,
    _inspect,
    _ReadParquetSplitFn,
    _ReadTextSplitFn,
    _text_splits,
)


@dataclass
class DriverRead:
    """Batches of the input as :class:`ReadMicrodata` would type them; ``rejected`` counts
    the rows the reader refused so far."""

    spec: InputSpec
    rejected: int = 0
    rows: int = 0

    def batches(self) -> Iterator[pd.DataFrame]:
        columns, infos = _inspect(self.spec)
        if self.spec.format == "parquet":
            pq_fn = _ReadParquetSplitFn(self.spec, columns)
            groups: list[ParquetSplit] = []
            for info in infos:
                before = 0
                for g, n in enumerate(info.row_groups):
                    if n:
                        groups.append((info.path, g, before))
                    before += n
            outputs = (out for split in groups for out in pq_fn.process(split))
        else:
            text_fn = _ReadTextSplitFn(self.spec, columns)
            splits = [s for info in infos for s in _text_splits(info.path, info.size, self.spec)]
            outputs = (out for split in splits for out in text_fn.process(split))
        for out in outputs:
            if isinstance(out, TaggedOutput):
                value = out.value
                frame = value[2] if isinstance(value, tuple) else value
                self.rejected += len(frame)
                continue
            self.rows += len(out)
            yield out
