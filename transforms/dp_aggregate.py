"""Beam: batches → bounded per-cell aggregates of one central-DP release (no noise here).

    batches ─► Contributions (hashed arrays per query, per batch)
            ─► [privacy unit] shard by person hash ─► GroupByKey ─► bound each shard
            ─► [no unit]      aggregate each batch (one row = one person: nothing to bound)
            ─► CombineGlobally: partials and cell dictionaries summed per query
            ─► one pickle in the run's internal folder

Everything is batch-wise (numpy arrays, never a DoFn per row). Noise is not drawn in the
pipeline: the driver charges the ledger once the data has been checked and only then
releases the cells (pipelines/dp_release.py), so a run refused for its input spends nothing.
"""

from __future__ import annotations

import pickle
import secrets
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd

from dp.cells import (
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
from dp.spec import DPReleaseSpec, QueryPlan
from transforms.timing import TimedCombineFn, TimedDoFn

SHARDS = 16
_COMPACT_AT = 32


class ContributionsFn(beam.DoFn):  # type: ignore[misc]
    """Per batch: hashed contributions per query; shards by person or aggregates directly."""

    DICT = "dictionary"
    PARTIAL = "partial"

    def __init__(
        self, spec: DPReleaseSpec, plans: Sequence[QueryPlan], labeler: Labeler, shards: int
    ) -> None:
        self.spec, self.plans, self.labeler, self.shards = spec, list(plans), labeler, shards

    def process(self, batch: pd.DataFrame) -> Iterator[Any]:
        for c in contributions(batch, self.spec, self.plans, self.labeler):
            yield beam.pvalue.TaggedOutput(self.DICT, (c.query, c.dictionary))
            c.dictionary = pd.DataFrame()
            if c.unit is None:  # one row, one person: already bounded
                yield beam.pvalue.TaggedOutput(self.PARTIAL, bound_and_aggregate(c, self.spec))
                continue
            for s, rows in split_by_shard(c.unit, self.shards):
                yield (c.query, s), c.take(rows)


class BoundShardFn(beam.DoFn):  # type: ignore[misc]
    """All rows of the persons of one shard: bound them and aggregate per cell."""

    def __init__(self, spec: DPReleaseSpec, seed: int | None) -> None:
        self.spec, self.seed = spec, seed

    def process(self, element: tuple[tuple[int, int], Iterable[Contributions]]) -> Iterator[Any]:
        (query, shard), parts = element
        merged = concat(list(parts))
        if self.seed is None:  # unpredictable choice of kept rows
            rng = np.random.default_rng(secrets.randbits(128))
        else:  # reproducible (insecure, recorded) runs
            rng = np.random.default_rng(
                [self.seed, zlib.crc32(self.spec.name.encode()), query, shard]
            )
        yield bound_and_aggregate(merged, self.spec, rng)


@dataclass
class _Acc:
    partials: dict[int, list[CellPartial]] = field(default_factory=dict)
    dictionaries: dict[int, list[pd.DataFrame]] = field(default_factory=dict)


class CellsCombineFn(beam.CombineFn):  # type: ignore[misc]
    """Partials and dictionaries per query, summed (compacted as they grow)."""

    def __init__(self, queries: int) -> None:
        self.queries = queries

    def create_accumulator(self) -> _Acc:
        return _Acc()

    def add_input(self, acc: _Acc, element: Any) -> _Acc:
        if isinstance(element, CellPartial):
            self._add_partial(acc, element)
        else:
            query, frame = element
            lst = acc.dictionaries.setdefault(query, [])
            lst.append(frame)
            if len(lst) >= _COMPACT_AT:
                acc.dictionaries[query] = [merge_dictionaries(lst)]
        return acc

    def _add_partial(self, acc: _Acc, p: CellPartial) -> None:
        lst = acc.partials.setdefault(p.query, [])
        lst.append(p)
        if len(lst) >= _COMPACT_AT:
            acc.partials[p.query] = [merge_partials(lst)]

    def merge_accumulators(self, accs: Iterable[_Acc]) -> _Acc:
        out = _Acc()
        for a in accs:
            for ps in a.partials.values():
                for p in ps:
                    self._add_partial(out, p)
            for q, frames in a.dictionaries.items():
                for f in frames:
                    self.add_input(out, (q, f))
        return out

    def extract_output(self, acc: _Acc) -> dict[str, Any]:
        return {
            "partials": [
                merge_partials(acc.partials[q]) if acc.partials.get(q) else empty_partial(q)
                for q in range(self.queries)
            ],
            "dictionaries": [
                merge_dictionaries(acc.dictionaries.get(q, [])) for q in range(self.queries)
            ],
        }


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


class AggregateDPCells(beam.PTransform):  # type: ignore[misc]
    """Bounded, merged per-cell aggregates of one DP release, written to ``path``."""

    def __init__(
        self,
        spec: DPReleaseSpec,
        plans: Sequence[QueryPlan],
        labeler: Labeler,
        path: str,
        seed: int | None = None,
        shards: int = SHARDS,
        stage: str = "dp",  # the timing stage: dp:<name> (continual:<name> for a stream)
    ) -> None:
        super().__init__()
        self.spec, self.plans, self.labeler = spec, list(plans), labeler
        self.path, self.seed, self.shards, self.stage = path, seed, shards, stage

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        stage = f"{self.stage}:{self.spec.name}"
        fn = TimedDoFn(stage, ContributionsFn(self.spec, self.plans, self.labeler, self.shards))
        parts = batches | "Contributions" >> beam.ParDo(fn).with_outputs(
            ContributionsFn.DICT, ContributionsFn.PARTIAL, main="sharded"
        )
        bounded = (
            parts.sharded
            | "ShuffleByPerson" >> beam.GroupByKey()
            | "BoundShard" >> beam.ParDo(TimedDoFn(stage, BoundShardFn(self.spec, self.seed)))
        )
        return (
            (bounded, parts[ContributionsFn.PARTIAL], parts[ContributionsFn.DICT])
            | "Gather" >> beam.Flatten()
            | "Combine"
            >> beam.CombineGlobally(TimedCombineFn(stage, CellsCombineFn(len(self.plans))))
            | "Write" >> beam.Map(lambda cells, path: write_pickle(path, cells), self.path)
        )
