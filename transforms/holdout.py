"""Split input batches into members and held-out control records (``attacks.control``).

Right after the read: the members feed everything (profile, search, recode, DP, local DP,
continual, the audit's truth); the controls only reach the attacks, through the run's
private work folder. The rule is :func:`attacks.control.holdout_mask` (keyed per run), one
vectorised call per batch, so the two reads of the input split identically.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pandas as pd
from apache_beam.pvalue import PCollection, TaggedOutput

from privpipe.attacks.control import holdout_mask
from privpipe.transforms.timing import TimedDoFn

MEMBERS = "members"
CONTROLS = "controls"


class _SplitFn(beam.DoFn):  # type: ignore[misc]
    def __init__(self, share: float, key: str, unit: str | None):
        super().__init__()
        self.share, self.key, self.unit = share, key, unit

    def process(self, batch: pd.DataFrame) -> Iterator[Any]:
        mask = holdout_mask(batch, self.share, self.key, self.unit)
        if not mask.any():
            yield batch
            return
        members = batch[~mask].reset_index(drop=True)
        if len(members):
            yield members
        yield TaggedOutput(CONTROLS, batch[mask].reset_index(drop=True))


class HoldOut(beam.PTransform[PCollection[pd.DataFrame], dict[str, PCollection[pd.DataFrame]]]):
    """Batches -> {"members": DataFrames, "controls": DataFrames} by the keyed holdout rule."""

    def __init__(self, share: float, key: str, unit: str | None = None):
        super().__init__()
        self.share, self.key, self.unit = share, key, unit

    def expand(self, batches: PCollection[pd.DataFrame]) -> dict[str, PCollection[pd.DataFrame]]:
        fn = TimedDoFn("holdout", _SplitFn(self.share, self.key, self.unit))
        parts = batches | "Split" >> beam.ParDo(fn).with_outputs(  # type: ignore[no-untyped-call]
            CONTROLS, main=MEMBERS
        )
        return {MEMBERS: parts[MEMBERS], CONTROLS: parts[CONTROLS]}
