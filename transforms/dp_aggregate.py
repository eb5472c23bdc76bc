"""Beam: batches → bounded per-cell aggregates of the central-DP releases (no noise here).

    batches ─► Contributions (hashed arrays per release and query, per batch)
            ─► [privacy unit] shard by person hash ─► GroupByKey ─► bound each shard
               (with ``spill``: once a worker has handed on ``spill_after`` bytes, a
               batch's pieces of the shards go to one file in the run's private work
               folder and only each piece's place in it is grouped, ``Spilled``)
            ─► [no unit]      aggregate each batch (one row = one person: nothing to bound)
            ─► CombineGlobally: partials and cell dictionaries summed per release and query
            ─► one pickle per release in the run's internal folder

All DP (and continual) releases of a run share these steps: a handful of ParDos whatever
the number of releases.

Everything is batch-wise (numpy arrays, never a DoFn per row). Grouping the contributions
themselves makes the runner hold every row's contributions at once (the FnApiRunner keeps
a GroupByKey's whole input in memory: ~1 GB more at 3M demo rows, the run's peak before
the search); spilled, one shard of one query is in memory at a time. Noise is not drawn in the
pipeline: the driver charges the ledger once the data has been checked and only then
releases the cells (pipelines/dp_release.py), so a run refused for its input spends nothing.
"""

from __future__ import annotations

import math
import os
import pickle
import secrets
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd

from privpipe.dp.cells import (
    CellPartial,
    Contributions,
    Labeler,
    bound_and_aggregate,
    concat,
    contributions,
    empty_partial,
    merge_dictionaries,
    merge_partials,
    split_by_shard,
)
from privpipe.dp.spec import DPReleaseSpec, QueryPlan
from privpipe.transforms.order import after
from privpipe.transforms.timing import TimedCombineFn, TimedDoFn

SHARDS = 16  # the most shards per query (large inputs)
MIN_SHARDS = 4
SHARD_INPUT_BYTES = 8 << 20  # input bytes per shard below SHARDS shards


def shards_for(input_bytes: int | None) -> int:
    """Shards per query for an input of ``input_bytes`` (None: unknown, e.g. remote):
    one per 8 MB, 4 to 16. Bounding a shard pays a fixed cost per call (factorising,
    frames) and a sort that grows faster than its rows: 4 shards bound a 1M-row query
    in 0.31 s and a 200k-row one in 0.11 s, against 0.32 and 0.19 s with 16 (one: 0.59
    and 0.14 s). Large inputs keep 16 (one shard's rows are in memory at once)."""
    if input_bytes is None:
        return SHARDS
    return max(MIN_SHARDS, min(SHARDS, math.ceil(input_bytes / SHARD_INPUT_BYTES)))


# contributions a worker hands to the shuffle in memory before it spills the rest: a
# million rows of one query (~24–32 MB) need no file per piece; the demo's 10M rows
# (~330 bytes a row over its queries) stay ~64 MB above the spilled run
SPILL_AFTER = 64 << 20
_COMPACT_AT = 32


@dataclass(frozen=True)
class DPCellsJob:
    """One release aggregated by :class:`AggregateDPCells`: its spec, query plans, pickle."""

    spec: DPReleaseSpec
    plans: tuple[QueryPlan, ...]
    path: str


class ContributionsFn(beam.DoFn):  # type: ignore[misc]
    """Per batch, for every release: hashed contributions per query; shards them by person
    or aggregates them directly. Outputs are keyed by (release index, query)."""

    DICT = "dictionary"
    PARTIAL = "partial"

    def __init__(
        self,
        jobs: Sequence[DPCellsJob],
        labeler: Labeler,
        shards: int,
        spill: str | None = None,
        spill_after: int = SPILL_AFTER,
    ) -> None:
        self.jobs, self.labeler, self.shards = list(jobs), labeler, shards
        self.spill, self.spill_after = spill, spill_after
        self._held = 0  # bytes of contributions this instance handed to the shuffle as is

    def setup(self) -> None:
        self._held = 0
        if self.spill is not None:
            os.makedirs(self.spill, mode=0o700, exist_ok=True)

    def _in_memory(self, part: Contributions) -> bool:
        """Whether the piece travels itself: while this worker has handed on less than
        ``spill_after`` bytes (small inputs: no file at all), else it is spilled."""
        size = sum(
            a.nbytes for a in (part.cell, part.unit, part.group, part.value) if a is not None
        )
        if self.spill is None or self._held + size <= self.spill_after:
            self._held += size
            return True
        return False

    def process(self, batch: pd.DataFrame) -> Iterator[Any]:
        units: dict[str, Any] = {}  # person hashes of this batch, shared by the releases
        combinations: dict[Any, Any] = {}  # its key columns' combinations, shared likewise
        spilling: list[tuple[tuple[int, int, int], Contributions]] = []
        for j, job in enumerate(self.jobs):
            for c in contributions(
                batch, job.spec, list(job.plans), self.labeler, units, combinations
            ):
                yield beam.pvalue.TaggedOutput(self.DICT, ((j, c.query), c.dictionary))
                c.dictionary = pd.DataFrame()
                if c.unit is None:  # one row, one person: already bounded
                    partial = bound_and_aggregate(c, job.spec)
                    yield beam.pvalue.TaggedOutput(self.PARTIAL, (j, partial))
                    continue
                for s, rows in split_by_shard(c.unit, self.shards):
                    part = c.take(rows)
                    if self._in_memory(part):
                        yield (j, c.query, s), part
                    else:
                        spilling.append(((j, c.query, s), part))
        if spilling:  # one file for the batch's spilled pieces, not one per piece
            assert self.spill is not None
            places = spill_together(self.spill, [part for _, part in spilling])
            for (key, _), place in zip(spilling, places, strict=True):
                yield key, place


class BoundShardFn(beam.DoFn):  # type: ignore[misc]
    """All rows of the persons of one shard of one release: bound them, aggregate per cell."""

    def __init__(self, specs: Sequence[DPReleaseSpec], seed: int | None) -> None:
        self.specs, self.seed = list(specs), seed

    def process(
        self, element: tuple[tuple[int, int, int], Iterable[Contributions]]
    ) -> Iterator[Any]:
        (j, query, shard), parts = element
        spec = self.specs[j]
        merged = concat([unspill(p) for p in parts])
        if self.seed is None:  # unpredictable choice of kept rows
            rng = np.random.default_rng(secrets.randbits(128))
        else:  # reproducible (insecure, recorded) runs
            rng = np.random.default_rng([self.seed, zlib.crc32(spec.name.encode()), query, shard])
        yield j, bound_and_aggregate(merged, spec, rng)


@dataclass(frozen=True)
class Spilled:
    """Where :func:`spill_together` put one piece: its file, offset and length."""

    path: str
    offset: int
    length: int

    def load(self) -> Any:
        """The piece (our own files in the run's work folder only)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return pickle.loads(f.read(self.length))


def spill_together(folder: str, parts: Sequence[Any]) -> list[Spilled]:
    """Pieces (one batch's) pickled one after another into one new file in ``folder``
    (the run's private work folder); where each one is. One file per batch, not per
    piece: creating a file costs more than writing a piece (a file per piece spent
    ~1.6 s of the 3M demo's read in ``open``). The files go with the work folder when the
    run ends (kept until then: a retried bundle reads them again)."""
    path = os.path.join(folder, f"{uuid.uuid4().hex}.pickle")
    places: list[Spilled] = []
    with open(path, "wb") as f:
        for part in parts:
            data = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
            places.append(Spilled(path, f.tell(), len(data)))
            f.write(data)
    return places


def unspill(piece: Any) -> Any:
    """A grouped piece itself: loaded if it was spilled (a ``Spilled``), else as it is."""
    return piece.load() if isinstance(piece, Spilled) else piece


@dataclass
class _Acc:
    partials: dict[tuple[int, int], list[CellPartial]] = field(default_factory=dict)
    dictionaries: dict[tuple[int, int], list[pd.DataFrame]] = field(default_factory=dict)


class CellsCombineFn(beam.CombineFn):  # type: ignore[misc]
    """Partials and dictionaries per (release, query), summed (compacted as they grow)."""

    def __init__(self, queries: Sequence[int]) -> None:
        self.queries = list(queries)  # number of queries of each release

    def create_accumulator(self) -> _Acc:
        return _Acc()

    def add_input(self, acc: _Acc, element: Any) -> _Acc:
        key, value = element
        if isinstance(value, CellPartial):
            self._add_partial(acc, key, value)
        else:
            lst = acc.dictionaries.setdefault(key, [])
            lst.append(value)
            if len(lst) >= _COMPACT_AT:
                acc.dictionaries[key] = [merge_dictionaries(lst)]
        return acc

    def _add_partial(self, acc: _Acc, j: int, p: CellPartial) -> None:
        lst = acc.partials.setdefault((j, p.query), [])
        lst.append(p)
        if len(lst) >= _COMPACT_AT:
            acc.partials[(j, p.query)] = [merge_partials(lst)]

    def merge_accumulators(self, accs: Iterable[_Acc]) -> _Acc:
        out = _Acc()
        for a in accs:
            for (j, _), ps in a.partials.items():
                for p in ps:
                    self._add_partial(out, j, p)
            for key, frames in a.dictionaries.items():
                for f in frames:
                    self.add_input(out, (key, f))
        return out

    def extract_output(self, acc: _Acc) -> list[dict[str, Any]]:
        """The cells of each release: partials and dictionaries, one per query."""
        return [
            {
                "partials": [
                    merge_partials(acc.partials[(j, q)])
                    if acc.partials.get((j, q))
                    else empty_partial(q)
                    for q in range(n)
                ],
                "dictionaries": [
                    merge_dictionaries(acc.dictionaries.get((j, q), [])) for q in range(n)
                ],
            }
            for j, n in enumerate(self.queries)
        ]


def write_pickle(path: str, value: Any) -> str:
    """An internal file of the run (never published)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(p)
    return path


def load_cells(path: str | Path) -> Any:
    """What :func:`write_pickle` wrote (the DP cells per query, or a local-DP partial)."""
    return pickle.loads(Path(path).read_bytes())


def write_cells(cells: Sequence[Any], paths: Sequence[str]) -> Iterator[str]:
    """Each release's cells to its own pickle."""
    for value, path in zip(cells, paths, strict=True):
        yield write_pickle(path, value)


class AggregateDPCells(beam.PTransform):  # type: ignore[misc]
    """Bounded, merged per-cell aggregates of several DP releases, each written to its path.

    One step for all releases (not one per release): Beam's graph construction and
    submission cost grows with the number of ParDos (it inspects every DoFn's methods), and
    the batches are read by one DoFn instead of one per release."""

    def __init__(
        self,
        jobs: Sequence[DPCellsJob],
        labeler: Labeler,
        seed: int | None = None,
        shards: int = SHARDS,
        stage: str = "dp",  # the timing stage of the shared step (all its releases)
        spill: str | None = None,  # a private folder every worker sees (module docstring)
        spill_after: int = SPILL_AFTER,
        after: Sequence[beam.PCollection] = (),  # bound only once these are complete
    ) -> None:
        super().__init__()
        self.jobs, self.labeler = list(jobs), labeler
        self.seed, self.shards, self.stage = seed, shards, stage
        self.spill, self.spill_after = spill, spill_after
        self.after = list(after)  # an ordering hint (transforms.order)

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        contributions = ContributionsFn(
            self.jobs, self.labeler, self.shards, self.spill, self.spill_after
        )
        fn = TimedDoFn(self.stage, contributions)
        parts = batches | "Contributions" >> beam.ParDo(fn).with_outputs(
            ContributionsFn.DICT, ContributionsFn.PARTIAL, main="sharded"
        )
        specs = [job.spec for job in self.jobs]
        bounded = parts.sharded | "ShuffleByPerson" >> beam.GroupByKey()
        bounded = after(bounded, self.after, "AfterSearch") | "BoundShard" >> beam.ParDo(
            TimedDoFn(self.stage, BoundShardFn(specs, self.seed))
        )
        queries = [len(job.plans) for job in self.jobs]
        return (
            (bounded, parts[ContributionsFn.PARTIAL], parts[ContributionsFn.DICT])
            | "Gather" >> beam.Flatten()
            | "Combine" >> beam.CombineGlobally(TimedCombineFn(self.stage, CellsCombineFn(queries)))
            | "Write" >> beam.FlatMap(write_cells, [job.path for job in self.jobs])
        )
