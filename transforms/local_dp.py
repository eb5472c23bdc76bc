"""Beam: batches → perturbed local-DP reports → summed support counts (one release).

    batches ─► codes of the public domain (per batch, numpy)
            ─► [no unit]  perturb the batch (one row = one person)
            ─► [unit]     shard by person hash ─► GroupByKey ─► one row per person, at random
                          ─► perturb the shard
            ─► CombineGlobally: n and support counts (int64 arrays) summed; with parties,
               the exact per-party histograms summed too ─► one pickle in the run's work folder
            ─► [write_reports] the reports themselves ─► WriteTable releases/<name>/reports
               (in a uniformly random order, like every table privpipe writes)

Unlike central DP, the noise (each person's randomisation) is drawn HERE, in the pipeline,
so the driver charges the ledger for local releases before the pipeline starts (see
pipelines/local_release.py). Randomness: :func:`dp.secure_random.random_source_for` — the OS
CSPRNG, or with ``--insecure-seed`` a seeded source per batch (keyed by the batch's content)
or per shard (keyed by the shard), so a seeded run is reproducible whatever the bundling.
Reports never carry the person id or the true value.

A ``dp_party_histogram`` release (spec without an oracle) runs the same graph but draws
nothing: its "support counts" are the exact histogram of the party's persons, to which the
driver adds the party's own noise (pipelines/multiparty.py).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.dp.cells import canonical_labels, hash_units, split_by_shard
from privpipe.dp.local import FrequencyOracle, reports_to_frame, support_counts
from privpipe.dp.local_release import encode_values, one_per_person
from privpipe.dp.secure_random import RandomSource, random_source_for
from privpipe.transforms.dp_aggregate import Spilled, spill_together, unspill, write_pickle
from privpipe.transforms.order import after
from privpipe.transforms.sink import WriteTable
from privpipe.transforms.timing import TimedCombineFn, TimedDoFn

SHARDS = 16
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LocalDPSpec:
    """What the transform needs of one local DP release (picklable)."""

    name: str
    oracle: FrequencyOracle | None  # None: a party's exact histogram (dp_party_histogram)
    attribute: str
    domain: tuple[str, ...]  # the public values (without ``other``)
    other: str | None
    unit: str | None
    party_column: str | None = None
    party_count: int | None = None
    write_reports: bool = False

    @property
    def d(self) -> int:
        return len(self.domain) + (self.other is not None)

    def report_columns(self) -> tuple[str, ...]:
        assert self.oracle is not None, "a party histogram has no reports"
        if self.oracle.protocol in ("sue", "oue"):
            return ("bits",)
        if self.oracle.protocol in ("blh", "olh"):
            return ("key", "report")
        return ("report",)


@dataclass
class LocalPartial:
    """Summed support counts of some persons' reports (adds up across batches).

    Without an oracle (a party's share), ``support`` is the exact histogram of the persons'
    values: the party adds its noise in the driver, after the ledger charge.
    """

    n: int
    support: IntArray
    rows_in: int = 0
    parties: dict[str, IntArray] = field(default_factory=dict)  # party → exact histogram


def _source(seed: int | None, *key: int) -> RandomSource:
    if seed is None:
        return random_source_for(None, allow_insecure=False)
    state = np.random.SeedSequence([seed, *key]).generate_state(2, np.uint64)
    return random_source_for(int(state[0]) << 64 | int(state[1]), allow_insecure=True)


def _perturb(
    spec: LocalDPSpec, codes: IntArray, parties: npt.NDArray[Any] | None, source: RandomSource
) -> Iterator[Any]:
    d = spec.d
    if spec.oracle is None:  # a party's exact histogram: no randomisation here
        yield LocalPartial(codes.size, np.bincount(codes, minlength=d).astype(np.int64), codes.size)
        return
    reports = spec.oracle.perturb(codes, source)
    partial = LocalPartial(reports.n, support_counts(reports), rows_in=codes.size)
    if spec.party_count is not None:
        labels = source.integers(spec.party_count, codes.size)  # an even split, at random
        hist = np.bincount(labels * d + codes, minlength=spec.party_count * d)
        partial.parties = {str(j): hist[j * d : (j + 1) * d] for j in range(spec.party_count)}
    elif parties is not None:
        pcodes, names = pd.factorize(pd.Series(parties, dtype=object))
        hist = np.bincount(pcodes * d + codes, minlength=len(names) * d).astype(np.int64)
        partial.parties = {str(p): hist[j * d : (j + 1) * d] for j, p in enumerate(names)}
    yield partial
    if spec.write_reports:
        yield beam.pvalue.TaggedOutput(PerturbFn.REPORTS, reports_to_frame(reports))


def _batch_key(batch: pd.DataFrame, columns: list[str]) -> list[int]:
    """A key from the batch's content: the same batch gets the same seeded randomness."""
    h = pd.util.hash_pandas_object(batch[columns], index=False).to_numpy()
    digest = hashlib.sha256(np.ascontiguousarray(h).tobytes()).digest()
    return [len(batch), int.from_bytes(digest[:8], "little")]


class PerturbFn(beam.DoFn):  # type: ignore[misc]
    """Per batch: codes; perturb (no unit) or shard the rows by person (unit)."""

    REPORTS = "reports"

    def __init__(
        self, spec: LocalDPSpec, seed: int | None, shards: int, spill: str | None = None
    ) -> None:
        self.spec, self.seed, self.shards, self.spill = spec, seed, shards, spill

    def setup(self) -> None:
        if self.spill is not None:
            os.makedirs(self.spill, mode=0o700, exist_ok=True)

    def process(self, batch: pd.DataFrame) -> Iterator[Any]:
        s = self.spec
        codes = encode_values(batch[s.attribute], s.domain, s.other, f"{s.name}.attribute")
        parties = None
        if s.party_column is not None:
            parties = canonical_labels(s.party_column, 0, batch[s.party_column])
        if s.unit is None:
            cols = [s.attribute] + ([s.party_column] if s.party_column else [])
            key = [zlib.crc32(s.name.encode()), *_batch_key(batch, cols)]
            yield from _perturb(s, codes, parties, _source(self.seed, *key))
            return
        unit = hash_units(batch[s.unit])
        columns = {"unit": unit, "code": np.asarray(codes)}
        if parties is not None:
            columns["party"] = np.asarray(parties, dtype=object)
        # each shard's frame made from its rows of the arrays (not a frame's iloc per shard:
        # ~1 ms each, 16 shards a batch, ~3 s of the 10M demo's read)
        parts = [
            (sh, pd.DataFrame({name: values[rows] for name, values in columns.items()}))
            for sh, rows in split_by_shard(unit, self.shards)
        ]
        if self.spill is None:
            yield from parts
            return
        places = spill_together(self.spill, [part for _, part in parts])  # one file
        for (sh, _), place in zip(parts, places, strict=True):
            yield sh, place


class PerturbShardFn(beam.DoFn):  # type: ignore[misc]
    """All rows of the persons of one shard: one row per person, at random; perturb."""

    def __init__(self, spec: LocalDPSpec, seed: int | None) -> None:
        self.spec, self.seed = spec, seed

    def process(self, element: tuple[int, Iterable[pd.DataFrame | Spilled]]) -> Iterator[Any]:
        shard, parts = element
        frames = [unspill(p) for p in parts]
        frame = pd.concat(frames, ignore_index=True)
        if self.seed is not None:  # a canonical order: a seeded run does not depend on the
            # shuffle's order (unseeded, each person's row is drawn from the OS CSPRNG and
            # the order cannot matter; the sort cost ~0.15 s a 574k-row shard)
            frame = frame.sort_values(list(frame.columns), kind="stable", ignore_index=True)
        source = _source(self.seed, zlib.crc32(self.spec.name.encode()), shard)
        keep = one_per_person(frame["unit"].to_numpy(dtype=np.uint64), source)
        kept = frame.iloc[keep]
        parties = kept["party"].to_numpy(dtype=object) if "party" in kept else None
        codes = kept["code"].to_numpy(dtype=np.int64)
        for out in _perturb(self.spec, codes, parties, source):
            if isinstance(out, LocalPartial):
                out.rows_in = len(frame)
            yield out


class SumSupportFn(beam.CombineFn):  # type: ignore[misc]
    """n, support counts and party histograms summed."""

    def __init__(self, d: int) -> None:
        self.d = d

    def create_accumulator(self) -> LocalPartial:
        return LocalPartial(0, np.zeros(self.d, dtype=np.int64))

    def add_input(self, acc: LocalPartial, p: LocalPartial) -> LocalPartial:
        acc.n += p.n
        acc.rows_in += p.rows_in
        acc.support = acc.support + p.support
        for name, hist in p.parties.items():
            acc.parties[name] = acc.parties.get(name, np.zeros(self.d, dtype=np.int64)) + hist
        return acc

    def merge_accumulators(self, accs: Iterable[LocalPartial]) -> LocalPartial:
        out = self.create_accumulator()
        for a in accs:
            self.add_input(out, a)
        return out

    def extract_output(self, acc: LocalPartial) -> LocalPartial:
        return acc


class PerturbLocalDP(beam.PTransform):  # type: ignore[misc]
    """Perturb every person's value; write summed support counts to ``path`` (+ reports)."""

    def __init__(
        self,
        spec: LocalDPSpec,
        path: str,
        reports_dir: str,
        fmt: str = "csv",
        seed: int | None = None,
        shards: int = SHARDS,
        spill: str | None = None,  # a private folder every worker sees: shards go as files
        after: Sequence[beam.PCollection] = (),  # one report per person only once complete
    ) -> None:
        super().__init__()
        self.spec, self.path, self.reports_dir, self.fmt = spec, path, reports_dir, fmt
        self.seed, self.shards, self.spill = seed, shards, spill
        self.after = list(after)  # an ordering hint (transforms.order)

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        stage = f"local_dp:{self.spec.name}"
        parts = batches | "Perturb" >> beam.ParDo(
            TimedDoFn(stage, PerturbFn(self.spec, self.seed, self.shards, self.spill))
        ).with_outputs(PerturbFn.REPORTS, main="main")
        partials = parts.main
        reports = parts[PerturbFn.REPORTS]
        if self.spec.unit is not None:
            shuffled = parts.main | "ShuffleByPerson" >> beam.GroupByKey()
            shard_out = after(shuffled, self.after, "AfterSearch") | "OnePerPerson" >> beam.ParDo(
                TimedDoFn(stage, PerturbShardFn(self.spec, self.seed))
            ).with_outputs(PerturbFn.REPORTS, main="main")
            partials = shard_out.main
            reports = shard_out[PerturbFn.REPORTS]
        if self.spec.write_reports:
            # in a uniformly random order (CSPRNG scatter shuffle): the order of the shards
            # or of the input would otherwise link each report to its row and person
            count = (
                reports
                | "ReportRows" >> beam.Map(len)
                | "CountReports" >> beam.CombineGlobally(sum)
            )
            _ = reports | "WriteReports" >> WriteTable(
                self.reports_dir,
                "reports",
                self.spec.report_columns(),
                self.fmt,  # type: ignore[arg-type]
                shuffle_rows=count,
            )
        return (
            partials
            | "Sum" >> beam.CombineGlobally(TimedCombineFn(stage, SumSupportFn(self.spec.d)))
            | "Write" >> beam.Map(lambda acc, path: write_pickle(path, acc), self.path)
        )
