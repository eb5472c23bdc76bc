"""What the audit needs from the accepted rows, without staging every row.

Two combines over the batches, each bounded by something other than the number of rows:

- the frequency table of the audit columns (QIs and the sensitive attribute) with each
  distinct row's multiplicity (``transforms.anonymize.FrequencyTable``; column
  ``attacks.matching.WEIGHT``): the truth the audit scores and counts against. When an
  anonymised release's summary counts exactly these columns (and the person id) of the
  same batches, it is that summary with the persons summed out (``published_table``), not
  a second table counted on the driver's thread (~10 s of the 10M demo's read);
- the attacker's targets: a fixed number of rows, those of the persons with the smallest
  keyed hash (``attacks.control.keyed_hashes`` of the privacy unit as the batches carry
  it, then of the row), so the sample is reproducible within a run (both reads, every
  batch split) and, the key being fresh per run from the OS CSPRNG, unpredictable across
  runs. The members' batches carry the unit as its 64-bit hash (``pipelines.run`` hashes
  it once after the profile), which the keyed hash takes as a number: no string per row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
from apache_beam.pvalue import PCollection

from privpipe.attacks.control import keyed_hashes
from privpipe.attacks.matching import WEIGHT
from privpipe.transforms.anonymize import COUNT, FrequencyTable
from privpipe.transforms.sink import WriteTable

RECORDS = "__records__"  # the sample's column: how many rows the whole input had
_FIRST, _SECOND = "__h1__", "__h2__"


@dataclass
class _Sample:
    rows: pd.DataFrame | None  # at most n rows with their two hash columns
    seen: int


class SmallestHashRows(beam.CombineFn):  # type: ignore[misc]
    """Batches -> the ``n`` rows of ``columns`` with the smallest (hash of the unit, hash of
    the row) under ``key``: whole persons first, a fixed-size sample. The output has a
    column ``RECORDS``: how many rows came in (every row of the frame holds it)."""

    def __init__(self, columns: Sequence[str], n: int, key: str, unit: str | None) -> None:
        self.columns, self.n, self.key, self.unit = list(columns), int(n), key, unit

    def create_accumulator(self) -> _Sample:
        return _Sample(None, 0)

    def _keep(self, parts: Iterable[pd.DataFrame]) -> pd.DataFrame | None:
        frames = [f for f in parts if f is not None and len(f)]
        if not frames:
            return None
        both = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        if len(both) <= self.n and len(frames) == 1:
            return both
        order = np.lexsort((both[_SECOND].to_numpy(), both[_FIRST].to_numpy()))[: self.n]
        return both.iloc[order].reset_index(drop=True)

    def add_input(self, acc: _Sample, batch: pd.DataFrame) -> _Sample:
        if not len(batch):
            return acc
        seen = acc.seen + len(batch)
        if self.unit:  # persons first; the row's hash orders the rows of one person
            first = keyed_hashes(batch[self.unit], self.key)
            if acc.rows is not None and len(acc.rows) >= self.n:  # only rows that can enter
                fits = first <= acc.rows[_FIRST].to_numpy().max()
                if not fits.any():  # the usual case once the sample is full: no row copied
                    return _Sample(acc.rows, seen)
                at = np.flatnonzero(fits)  # a few rows: positions, then only those rows copied
                rows, first = batch[self.columns].take(at).reset_index(drop=True), first[at]
            else:
                rows = batch[self.columns].reset_index(drop=True)
            second = keyed_hashes(rows, self.key)
        else:
            rows = batch[self.columns].reset_index(drop=True)
            first = second = keyed_hashes(rows, self.key)
        mine = rows.assign(**{_FIRST: first, _SECOND: second})
        if len(mine) > self.n:  # the batch's own n smallest first
            order = np.lexsort((second, first))[: self.n]
            mine = mine.iloc[order].reset_index(drop=True)
        return _Sample(self._keep([acc.rows, mine]) if acc.rows is not None else mine, seen)

    def merge_accumulators(self, accs: Iterable[_Sample]) -> _Sample:
        accs = list(accs)
        return _Sample(self._keep([a.rows for a in accs]), sum(a.seen for a in accs))

    def extract_output(self, acc: _Sample) -> pd.DataFrame:
        if acc.rows is None:
            out = pd.DataFrame({c: pd.Series([], dtype=object) for c in self.columns})
        else:
            order = np.lexsort((acc.rows[_SECOND].to_numpy(), acc.rows[_FIRST].to_numpy()))
            out = acc.rows.iloc[order][self.columns].reset_index(drop=True)
        return out.assign(**{RECORDS: np.full(len(out), acc.seen, dtype=np.int64)})


class StageAuditTruth(beam.PTransform):  # type: ignore[misc]
    """Batches -> ``<directory>/<name>_counts.parquet`` (the frequency table of
    ``columns``, weights in ``WEIGHT``) and, with ``targets``, ``<directory>/<name>.parquet``
    (the ``targets`` sampled rows, column ``RECORDS`` the number of rows)."""

    def __init__(
        self,
        directory: str,
        name: str,
        columns: Sequence[str],
        targets: int | None,
        key: str,
        unit: str | None,
        summary: PCollection | None = None,
    ) -> None:
        super().__init__()
        self.directory, self.name, self.columns = directory, name, list(columns)
        self.targets, self.key, self.unit = targets, key, unit
        # a frequency table of the same batches over ``columns`` (and the person id's hash):
        # an anonymised release's summary, summed over persons instead of counted again
        self.summary = summary

    def expand(self, batches: PCollection) -> PCollection:
        cols = self.columns
        if self.summary is not None:  # the summary's rows with the persons summed out
            table = self.summary | "FromSummary" >> beam.Map(published_table, cols)
        else:
            table = (
                batches
                | "Counts" >> beam.CombineGlobally(FrequencyTable(cols))
                | "Weights" >> beam.Map(lambda t: t.rename(columns={COUNT: WEIGHT}))
            )
        written = table | "WriteCounts" >> WriteTable(
            self.directory, f"{self.name}_counts", [*cols, WEIGHT], "parquet"
        )
        if self.targets is None:
            return written
        unit = self.unit if self.unit else None
        sample = batches | "Targets" >> beam.CombineGlobally(
            SmallestHashRows(cols, self.targets, self.key, unit)
        )
        return sample | "WriteTargets" >> WriteTable(
            self.directory, self.name, [*cols, RECORDS], "parquet"
        )


def published_counts_name(release: str) -> str:
    """The staged table's name (``<name>.parquet`` in the work folder) for ``release``."""
    return f"published_{release}_counts"


def published_counts_path(work: str | Path, release: str) -> Path:
    """Where the pipeline stages the frequency table of ``release``'s published rows."""
    return Path(work) / f"{published_counts_name(release)}.parquet"


def published_table(classes: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A verifier's class counts (``FrequencyTable`` of the published columns, the person
    id's hash too when persons are counted; column ``COUNT``) -> the distinct published
    rows of ``columns`` with their number of rows in ``WEIGHT``, in order of first
    appearance."""
    cols = list(columns)
    if [c for c in classes.columns if c != COUNT] != cols:  # persons counted: sum them out
        classes = _summed_out(classes, cols)
    out = {c: _strings(classes[c]) for c in cols}  # strings as published, missing kept
    return pd.DataFrame({**out, WEIGHT: classes[COUNT].to_numpy(dtype=np.int64)})


def _summed_out(classes: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """``classes`` grouped by ``cols`` (missing values a group of their own, groups in
    order of first appearance) with ``COUNT`` summed. Categoricals (as every verifier's
    and summary's counts come) are grouped by their codes packed into one int64 key
    (``pd.factorize``: dense ids in order of first appearance): ``published_table`` on 9M
    rows (6 categoricals and the person's hash, as a 10M table's classes come) 0.85-0.89 s
    against 1.45-2.15 s with a pandas groupby."""
    categorical = all(isinstance(classes[c].dtype, pd.CategoricalDtype) for c in cols)
    radices = [len(classes[c].cat.categories) + 1 for c in cols] if categorical else []
    if not radices or math.prod(radices) >= 1 << 62:
        summed = classes.groupby(cols, sort=False, dropna=False, observed=True)[COUNT].sum()
        return summed.reset_index()
    n = len(classes)
    key = np.zeros(n, dtype=np.int64)
    for c, radix in zip(cols, radices, strict=True):
        key *= radix
        key += classes[c].cat.codes.to_numpy()  # a missing value's code -1 ...
        key += 1  # ... is 0
    ids, distinct = pd.factorize(key)
    rows = np.empty(len(distinct), dtype=np.int64)  # a row of each group: its labels
    rows[ids] = np.arange(n, dtype=np.int64)
    summed = np.bincount(ids, weights=classes[COUNT].to_numpy(), minlength=len(distinct))
    kept = classes.iloc[rows][cols].reset_index(drop=True)
    return kept.assign(**{COUNT: np.rint(summed).astype(np.int64)})


def _strings(column: pd.Series) -> pd.Series:
    """``column.astype("str")``; a categorical's categories are made strings once and taken
    by code (``astype`` on a categorical made a string per row: ~0.5 s a column at 2.5M)."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype("str")
    labels = pd.array(column.cat.categories.astype("str"), dtype="str")
    taken = labels.take(column.cat.codes.to_numpy(), allow_fill=True)  # code -1: missing
    return pd.Series(taken, index=column.index, name=column.name)


class StagePublishedCounts(beam.PTransform):  # type: ignore[misc]
    """A release's class counts (one DataFrame: its verifier's ``FrequencyTable`` of the
    rows written) -> ``<directory>/published_<release>_counts.parquet``: the published
    rows' frequency table (``columns`` and ``WEIGHT``), bounded by distinct published rows."""

    def __init__(self, directory: str, release: str, columns: Sequence[str]) -> None:
        super().__init__()
        self.directory, self.release, self.columns = directory, release, list(columns)

    def expand(self, classes: PCollection) -> PCollection:
        cols = self.columns
        return (
            classes
            | "Published" >> beam.Map(published_table, cols)
            | "WriteCounts"
            >> WriteTable(
                self.directory, published_counts_name(self.release), [*cols, WEIGHT], "parquet"
            )
        )
