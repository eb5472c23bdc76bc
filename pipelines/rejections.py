"""Every input row rejected: say so, with the count and the first reasons.

A run whose every row is rejected fails inside the pipeline, where the first step that
needs data (a hierarchy built from the data's values, a search) has none; its message
("no values to build the hierarchy from") hid the cause. The resolver marks that case
(:data:`NO_ROWS`); the driver then re-reads the input on its own (this failure path only,
one pass, no Beam) to count the rejected rows and quote the first reasons, as
``internal/rejected.csv`` would have listed them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from apache_beam.pvalue import TaggedOutput

from privpipe.errors import InputDataError
from privpipe.transforms.io import (
    InputSpec,
    _inspect,
    _ReadParquetSplitFn,
    _ReadTextSplitFn,
    _text_splits,
)

NO_ROWS = "no input row was accepted"


def _rejected(spec: InputSpec) -> tuple[int, int, pd.DataFrame]:
    """(accepted rows, rejected rows, the first file's first rejections with global lines)."""
    columns, infos = _inspect(spec)
    accepted = rejected = 0
    first: list[pd.DataFrame] = []
    for info in infos:
        splits: list[Any] = []
        if spec.format == "parquet":
            fn: Any = _ReadParquetSplitFn(spec, columns)
            before = 0
            for g, rows in enumerate(info.row_groups):
                splits.append((info.path, g, before))
                before += rows
        else:
            fn = _ReadTextSplitFn(spec, columns)
            splits += _text_splits(info.path, info.size, spec)
        for i, split in enumerate(splits):
            for out in fn.process(split):
                if isinstance(out, TaggedOutput):
                    frame = out.value[2] if isinstance(out.value, tuple) else out.value
                    rejected += len(frame)
                    if i == 0 and not first:  # the file's first split: lines are global
                        first.append(frame)
                else:
                    accepted += len(out)
    return accepted, rejected, pd.concat(first) if first else pd.DataFrame()


def all_rejected(spec: InputSpec, exact: bool) -> InputDataError:
    """The error for a run whose every input row was rejected (figures and reasons
    withheld when ``exact`` is false: the config has DP releases)."""
    files = ", ".join(Path(p).name for p in spec.paths[:3])
    if not exact:
        return InputDataError(
            f"{files}: {NO_ROWS}: every row was rejected, nothing was published (counts and "
            "reasons withheld: this config has DP releases; run a config without them on "
            "this input to list the reasons). Fix the input or the schema's types"
        )
    accepted, rejected, first = _rejected(spec)
    head = first.head(5)
    shown = "; ".join(
        f"{Path(str(f)).name} line {ln}: {r}"
        for f, ln, r in head[["file", "line", "reason"]].itertuples(index=False)
    )
    return InputDataError(
        f"{files}: all {rejected:,} rows were rejected ({accepted} accepted); nothing was "
        f"published. First reasons: {shown or 'none recorded'} (a run that accepts rows lists "
        "every rejected row in internal/rejected.csv). Fix those rows or the schema's types"
    )
