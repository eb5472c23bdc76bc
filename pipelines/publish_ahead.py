"""A release planned ahead, published by the worker process that searched it.

On a runner that runs one stage at a time in this process, the longest search runs in a
worker process (``transforms.planning``) while the driver goes on with the other releases.
Where the rows to recode come from the frequency table that search started from
(``run.build_graph``'s ``recode_from_tables``), that worker holds the table already: it
plans the release and then publishes it itself, by the very composite the run's graph
would use (``ExpandTable`` ─► ``AnonymizeRelease``: recode, shuffled write, class counts,
the independent verification, release.json, the audit's published counts), in a pipeline
of its own on the same in-process runner. The driver's ``AwaitPlan`` step waits for it,
adds its stage timings to the run's and raises its refusal as its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pandas as pd
from apache_beam.options.pipeline_options import PipelineOptions

from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.pipelines.runner import new_pipeline
from privpipe.transforms.anonymize import AnonymizeRelease
from privpipe.transforms.coders import handing_over
from privpipe.transforms.context import ReleaseContext, Resolver, SlimContext
from privpipe.transforms.expand import ExpandTable
from privpipe.transforms.io import ColumnType
from privpipe.transforms.planning import Published, plan_one
from privpipe.transforms.timing import stage_counters


@dataclass(frozen=True)
class PublishAhead:
    """A ``planning.PlanCall``: what ``ExpandTable`` and ``AnonymizeRelease`` are given
    for this release in the run's graph, to plan it and then publish it where it is
    called (``publish_from_table``)."""

    columns: tuple[str, ...]  # the table's counted columns, expanded into rows
    column_types: Mapping[str, ColumnType]
    batch_rows: int
    directory: str  # releases/<name> in the run's staging folder
    output_format: str
    counts_dir: str | None  # the audit's counts of the published rows (private work folder)

    def __call__(
        self, freq: pd.DataFrame, spec: AnonymizationSpec, resolver: Resolver
    ) -> Published:
        planned = plan_one(freq, spec, resolver, slim=True)
        stages = publish_from_table(freq, spec, planned.context, self)
        return Published(planned.context, planned.seconds, stages)


_HELD: dict[str, Any] = {}  # what a pipeline of this process reads (publish_from_table)


def _held(_: Any, key: str) -> Any:
    return _HELD[key]


def publish_from_table(
    freq: pd.DataFrame,
    spec: AnonymizationSpec,
    context: ReleaseContext | SlimContext,
    job: PublishAhead,
) -> dict[str, int]:
    """``spec``'s release recoded with ``context`` from the rows of ``freq`` (its summary),
    verified and written as ``job`` says, on the in-process runner; its stage timings
    (``{stage: ms}``). A step's error is raised as the runner raises it (a privpipe error
    keeps its type, so its exit code)."""
    table_key, context_key = uuid.uuid4().hex, uuid.uuid4().hex
    _HELD[table_key], _HELD[context_key] = freq, context  # read in this process, not pickled
    try:
        with new_pipeline(PipelineOptions([])) as p:
            with handing_over(True):  # every stage runs here
                start = p | "Start" >> beam.Impulse()
                table = start | "Table" >> beam.Map(_held, table_key)
                plan = start | "Plan" >> beam.Map(_held, context_key)
                rows = table | "Rows" >> ExpandTable(job.columns, job.column_types, job.batch_rows)
                _ = rows | f"Release[{spec.name}]" >> AnonymizeRelease(
                    spec, plan, job.directory, job.output_format, job.counts_dir
                )
            result = p.run()
            result.wait_until_finish()
        return stage_counters(result)
    finally:
        _HELD.pop(table_key, None)
        _HELD.pop(context_key, None)
