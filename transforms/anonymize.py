"""One anonymised release as a Beam composite: summarise → search → recode → verify → write.

    batches ─► FrequencyTable ─► Plan (one worker: hierarchies, summary, search)
                                   │ side input
    input ─► ReadMicrodata (again) ─► Recode ─► WriteTable(data.csv|parquet)
                                        └────► FrequencyTable ─► Verify ─► release.json

The search sees only the frequency table of distinct (QI, SA) values, never rows.
Rows are read a second time for recoding (instead of reusing the first read) so
that no runner has to hold every batch while the search runs. The published table
is verified by `anonymity.verify` — code separate from the search's — on exactly
the rows that are written; a failed check raises PrivacyRefusal and nothing is
published (the run's staging folder is discarded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import numpy.typing as npt
import pandas as pd
from apache_beam.pvalue import AsSingleton

from anonymity.api import RecodingPlan, plan_recoding, release_document
from anonymity.hierarchy import Hierarchy
from anonymity.spec import AnonymizationSpec
from anonymity.summary import Summary
from anonymity.verify import verify_counts
from privpipe.errors import PrivacyRefusal
from transforms.io import InputSpec, ReadMicrodata
from transforms.sink import WriteTable, write_json

COUNT = "count"
Resolver = Callable[[Mapping[str, pd.Series]], dict[str, Hierarchy]]


@dataclass
class _Partial:
    """A partial frequency table: per distinct row key (a 64-bit hash of the row's value
    hashes) its count and the per-column value hashes of one row with that key, plus per
    column the values behind the hashes (bounded by the column's distinct values)."""

    keys: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    counts: list[npt.NDArray[np.int64]] = field(default_factory=list)
    rows: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    values: dict[str, pd.Series] = field(default_factory=dict)
    compacted: int = 0

    def size(self) -> int:
        return sum(len(k) for k in self.keys)

    def compact(self) -> None:
        """Merge the parts into one (keys sorted and distinct, counts summed)."""
        if len(self.keys) > 1:
            keys = np.concatenate(self.keys)
            uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            counts = np.bincount(inverse, weights=np.concatenate(self.counts), minlength=len(uniq))
            self.keys = [uniq]
            self.counts = [counts.astype(np.int64)]
            self.rows = [np.concatenate(self.rows)[first]]
        self.compacted = self.size()

    def maybe_compact(self) -> None:
        """Amortised: merge once the parts hold twice what the last merge left."""
        if self.size() > 2 * max(self.compacted, 65_536):
            self.compact()


class FrequencyTable(beam.CombineFn):  # type: ignore[misc]
    """Batches → one DataFrame of the distinct value combinations of `columns` (as strings)
    and their counts, bounded by the distinct combinations, not by rows.

    While partial tables are combined, a value is its 64-bit hash and a row is one 64-bit
    hash of its value hashes (np.unique on one array, amortised merging), about 80 bytes
    per distinct combination; values are mapped back at the end. With n distinct rows
    two collide with probability about n²/2^65 (< 3·10^-7 at 3·10^6).
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)

    def create_accumulator(self) -> _Partial:
        return _Partial()

    def add_input(self, acc: _Partial, batch: pd.DataFrame) -> _Partial:
        if not len(batch):
            return acc
        hashed = np.empty((len(batch), len(self.columns)), dtype=np.uint64)
        for j, col in enumerate(self.columns):
            series = batch[col].astype("str")
            h = pd.util.hash_pandas_object(series, index=False).to_numpy(dtype=np.uint64)
            uniq, first = np.unique(h, return_index=True)
            known = acc.values.get(col)
            if known is not None:  # only hashes not seen before (vectorised)
                fresh = ~np.isin(uniq, known.index.to_numpy())
                uniq, first = uniq[fresh], first[fresh]
            if len(uniq):
                seen = pd.Series(series.to_numpy()[first], index=uniq)
                acc.values[col] = seen if known is None else pd.concat([known, seen])
            hashed[:, j] = h
        row_keys = pd.util.hash_pandas_object(pd.DataFrame(hashed), index=False).to_numpy(
            dtype=np.uint64
        )
        uniq, first, counts = np.unique(row_keys, return_index=True, return_counts=True)
        acc.keys.append(uniq)
        acc.counts.append(counts.astype(np.int64))
        acc.rows.append(hashed[first])
        acc.maybe_compact()
        return acc

    def merge_accumulators(self, accs: Iterable[_Partial]) -> _Partial:
        """Merge as the partials stream in (amortised), never holding all at once."""
        out = _Partial()
        for acc in accs:
            out.keys.extend(acc.keys)
            out.counts.extend(acc.counts)
            out.rows.extend(acc.rows)
            for col, known in acc.values.items():
                both = known if col not in out.values else pd.concat([out.values[col], known])
                out.values[col] = both[~both.index.duplicated()]
            out.maybe_compact()
        out.compact()
        return out

    def extract_output(self, acc: _Partial) -> pd.DataFrame:
        acc.compact()
        if not acc.keys:
            return pd.DataFrame(
                {
                    **{c: pd.Series(dtype="str") for c in self.columns},
                    COUNT: pd.Series(dtype="int64"),
                }
            )
        rows = acc.rows[0]
        out = {
            c: pd.array(pd.Series(rows[:, j]).map(acc.values[c]).to_numpy(), dtype="str")
            for j, c in enumerate(self.columns)
        }
        return pd.DataFrame({**out, COUNT: acc.counts[0]})


@dataclass(frozen=True)
class ReleaseContext:
    """What the recoding and verifying workers need: travels as one side input."""

    spec: AnonymizationSpec
    plan: RecodingPlan
    hierarchies: Mapping[str, Hierarchy]
    sa_hierarchy: Hierarchy | None
    input_records: int


def make_context(freq: pd.DataFrame, spec: AnonymizationSpec, resolver: Resolver) -> ReleaseContext:
    """On one worker: complete the hierarchies, build the summary, search the recoding."""
    value_counts = {
        c: freq.groupby(c, dropna=False)[COUNT].sum() for c in freq.columns if c != COUNT
    }
    hierarchies = resolver(value_counts)
    sa = spec.sensitive
    sa_hierarchy = hierarchies.get(sa) if sa and spec.distance == "hierarchical" else None
    records = int(freq[COUNT].sum())
    sa_counts = value_counts[sa] if sa else None
    spec.check_feasible(records, None if sa_counts is None else int((sa_counts > 0).sum()))
    qi_h = {q: hierarchies[q] for q in spec.qis}
    summary = Summary.from_frame(freq, spec.qis, sa, qi_h, sa_hierarchy, weights=COUNT)
    plan = plan_recoding(summary, spec, qi_h, sa_hierarchy)
    return ReleaseContext(spec, plan, qi_h, sa_hierarchy, records)


class RecodeFn(beam.DoFn):  # type: ignore[misc]
    """A batch with its QIs replaced by their published labels; only QIs and the sensitive
    attribute are published (person ids and other columns never are)."""

    def process(self, batch: pd.DataFrame, ctx: ReleaseContext) -> Iterable[pd.DataFrame]:
        cols = published_columns(ctx.spec)
        out, suppressed = ctx.plan.recoding.apply(batch[cols], ctx.hierarchies)
        if ctx.spec.suppressed == "drop":
            out = out[~suppressed]
        if len(out):
            yield out.reset_index(drop=True)


def published_columns(spec: AnonymizationSpec) -> list[str]:
    return [*spec.qis, *([spec.sensitive] if spec.sensitive else [])]


def verify_and_document(class_counts: pd.DataFrame, ctx: ReleaseContext) -> dict[str, Any]:
    """Verify the table to be published and return release.json; refuse if it fails.

    The verifier recounts classes from the rows being written and checks the claimed
    number of suppressed records against the `*` rows it finds (and the record total).
    """
    spec = ctx.spec
    verification = verify_counts(
        class_counts,
        spec,
        input_records=ctx.input_records,
        suppressed_records=ctx.plan.suppressed_records,
        input_sa_distribution=ctx.plan.input_sa_distribution,
        sa_hierarchy=ctx.sa_hierarchy,
    )
    if not verification.ok:
        raise PrivacyRefusal(
            f"release {spec.name!r}: the independent check of the published table failed: "
            f"{verification.message()}; nothing was published"
        )
    return release_document(spec, ctx.plan, verification)


class AnonymizeRelease(beam.PTransform):  # type: ignore[misc]
    """batches (for the summary) → releases/<name>/{data.<fmt>, release.json} in `directory`."""

    def __init__(
        self,
        spec: AnonymizationSpec,
        input_spec: InputSpec,
        resolver: Resolver,
        directory: str,
        output_format: str = "csv",
    ) -> None:
        super().__init__()
        self.spec = spec
        self.input_spec = input_spec
        self.resolver = resolver
        self.directory = directory
        self.output_format = output_format

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        spec, cols = self.spec, published_columns(self.spec)
        ctx = (
            batches
            | "Summarise" >> beam.CombineGlobally(FrequencyTable(cols))
            | "Search" >> beam.Map(make_context, spec, self.resolver)
        )
        recoded = (batches.pipeline | "ReadAgain" >> ReadMicrodata(self.input_spec))[
            "batches"
        ] | "Recode" >> beam.ParDo(RecodeFn(), AsSingleton(ctx))
        _ = recoded | "Write" >> WriteTable(self.directory, "data", cols, format=self.output_format)  # type: ignore[arg-type]
        path = str(Path(self.directory) / "release.json")
        return (
            recoded
            | "CountClasses" >> beam.CombineGlobally(FrequencyTable(cols))
            | "Verify" >> beam.Map(verify_and_document, AsSingleton(ctx))
            | "WriteRelease" >> beam.Map(_write_document, path)
        )


def _write_document(doc: dict[str, Any], path: str) -> str:
    write_json(path, doc)
    return path


def load_document(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc
