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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
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


class FrequencyTable(beam.CombineFn):  # type: ignore[misc]
    """Batches → one DataFrame of the distinct value combinations of `columns` and their
    counts. Its size is bounded by the distinct combinations, not by rows."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)

    def create_accumulator(self) -> list[pd.DataFrame]:
        return []

    def add_input(self, acc: list[pd.DataFrame], batch: pd.DataFrame) -> list[pd.DataFrame]:
        if len(batch):
            acc.append(_counts(batch[self.columns].astype("str"), self.columns))
        return _compact(acc, self.columns) if len(acc) >= 16 else acc

    def merge_accumulators(self, accs: Iterable[list[pd.DataFrame]]) -> list[pd.DataFrame]:
        merged = [part for acc in accs for part in acc]
        return _compact(merged, self.columns)

    def extract_output(self, acc: list[pd.DataFrame]) -> pd.DataFrame:
        out = _compact(acc, self.columns)
        if out:
            return out[0]
        return pd.DataFrame(
            {**{c: pd.Series(dtype="str") for c in self.columns}, COUNT: pd.Series(dtype="int64")}
        )


def _counts(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return frame.value_counts(subset=columns, dropna=False).rename(COUNT).reset_index()


def _compact(parts: list[pd.DataFrame], columns: list[str]) -> list[pd.DataFrame]:
    if len(parts) <= 1:
        return parts
    both = pd.concat(parts, ignore_index=True)
    return [both.groupby(columns, dropna=False, sort=False)[COUNT].sum().reset_index()]


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
