"""A release's plan (``make_context``): hierarchies, summary, search, metrics. No Beam.

Kept apart from the Beam composites in ``transforms/anonymize.py`` so that a worker
process planning a release (``transforms/planning.py``) imports only the pure core,
pandas and numpy, not Beam.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from privpipe.anonymity.api import InputBaseline, RecodingPlan, plan_recoding
from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.recoding import BatchRecoder, Recoding
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.anonymity.summary import Summary
from privpipe.transforms.memory import release_free_memory

COUNT = "count"
Resolver = Callable[[Mapping[str, pd.Series]], dict[str, Hierarchy]]


@dataclass(frozen=True)
class ReleaseContext:
    """What the recoding and verifying workers need: travels as one side input."""

    spec: AnonymizationSpec
    plan: RecodingPlan
    hierarchies: Mapping[str, Hierarchy]
    sa_hierarchy: Hierarchy | None
    input_records: int

    def for_recoding(self) -> RecodeContext:
        """What the recoding workers need: the spec, hierarchies and a compact recoder."""
        return RecodeContext(self.spec, self.plan.recoding.recoder(), self.hierarchies)

    def without_tuples(self) -> ReleaseContext:
        """The context without the recoding's per-tuple arrays: all that verifying and
        documenting the release need (a much smaller side input)."""
        recoding = self.plan.recoding
        q = len(recoding.qi_names)
        empty = Recoding(
            recoding.qi_names,
            np.zeros((0, q), dtype=np.int64),
            np.empty((0, q), dtype=object),
            np.zeros(0, dtype=bool),
            recoding.description,
        )
        return replace(self, plan=replace(self.plan, recoding=empty))

    def slim(self) -> SlimContext:
        """Only what the release's steps downstream of the search use (``SlimContext``)."""
        return SlimContext(self.for_recoding(), self.without_tuples())


@dataclass(frozen=True)
class SlimContext:
    """A release's plan as its recode, verify and write steps use it: the compact recoder
    and the context without per-tuple arrays, nothing else. A full ``ReleaseContext``
    holds the recoding's raw codes, label objects and tuple index per distinct QI tuple
    (about 140 bytes each: ~60 MB per release at 1M demo rows, ~0.5 GB at 10M); the
    search step keeps one per release until every release is planned, and a worker's
    plan is pickled whole through its pipe. Same methods as ``ReleaseContext``."""

    recode: RecodeContext
    figures: ReleaseContext

    @property
    def input_records(self) -> int:
        return self.figures.input_records

    def for_recoding(self) -> RecodeContext:
        return self.recode

    def without_tuples(self) -> ReleaseContext:
        return self.figures

    def slim(self) -> SlimContext:
        return self


@dataclass(frozen=True)
class RecodeContext:
    """The recode step's side input: no raw codes or per-tuple label objects."""

    spec: AnonymizationSpec
    recoder: BatchRecoder
    hierarchies: Mapping[str, Hierarchy]


def make_context(
    freq: pd.DataFrame,
    spec: AnonymizationSpec,
    resolver: Resolver,
    shared: SharedPlanning | None = None,
) -> ReleaseContext:
    """On one worker: complete the hierarchies, build the summary, search the recoding.
    ``shared``: what the releases planned before this one in this process already built
    (their summary and the input's scores on it), reused where this release's are equal."""
    release_free_memory()  # the search peaks on top of whatever the reads left behind
    unit = spec.unit_by
    value_counts = column_counts(freq, skip=unit)  # no hierarchy is built for person ids
    hierarchies = resolver(value_counts)
    sa = spec.sensitive
    sa_hierarchy = hierarchies.get(sa) if sa and spec.distance == "hierarchical" else None
    records = int(freq[COUNT].sum())
    qi_h = {q: hierarchies[q] for q in spec.qis}
    shared = SharedPlanning() if shared is None else shared  # alone: shares nothing
    summary = shared.summary(freq, spec, qi_h, sa_hierarchy)
    # refuses k > persons etc. first
    plan = plan_recoding(summary, spec, qi_h, sa_hierarchy, shared.baselines)
    return ReleaseContext(spec, plan, qi_h, sa_hierarchy, records)


class SharedPlanning:
    """The summary and the input's own scores on it (``InputBaseline``), built once for
    the releases planned one after another in one process (the search step's thread).

    Releases counting the same columns of the same frequency table with the same
    hierarchy objects get the same summary and the same input metrics and risk, so
    sharing them changes no plan (a test compares); it saves their building for every
    release after the first (at 1M demo rows 0.4 s and 0.75 s each). Entries hold their
    frequency table and hierarchies, so an identity compared here is never reused."""

    def __init__(self) -> None:
        # (column names, then the table and hierarchies compared by identity, summary)
        self._entries: list[tuple[tuple[object, ...], tuple[object, ...], Summary]] = []
        self.baselines: dict[Summary, InputBaseline] = {}  # filled by ``plan_recoding``

    def summary(
        self,
        freq: pd.DataFrame,
        spec: AnonymizationSpec,
        qi_h: Mapping[str, Hierarchy],
        sa_hierarchy: Hierarchy | None,
    ) -> Summary:
        """The summary of ``spec``'s columns of ``freq``, built once."""
        names = (tuple(spec.qis), spec.sensitive, spec.unit_by)
        objects = (freq, *(qi_h[q] for q in spec.qis), sa_hierarchy)
        for seen_names, seen_objects, summary in self._entries:
            if seen_names == names and all(
                a is b for a, b in zip(seen_objects, objects, strict=True)
            ):
                return summary
        summary = Summary.from_frame(
            freq, spec.qis, spec.sensitive, qi_h, sa_hierarchy, weights=COUNT, unit=spec.unit_by
        )
        self._entries.append((names, objects, summary))
        return summary


def column_counts(freq: pd.DataFrame, skip: str | None = None) -> dict[str, pd.Series]:
    """Records per value of every column of the frequency table but ``skip`` (what
    resolvers take)."""
    return {c: _value_counts(freq[c], freq[COUNT]) for c in freq.columns if c not in (COUNT, skip)}


@dataclass(frozen=True)
class Resolved:
    """A resolver whose answer is known: the hierarchies resolved once for the value counts
    of the one frequency table several releases share (plain data, picklable for workers)."""

    hierarchies: Mapping[str, Hierarchy]

    def __call__(self, value_counts: Mapping[str, pd.Series]) -> dict[str, Hierarchy]:
        return dict(self.hierarchies)


def _value_counts(column: pd.Series, counts: pd.Series) -> pd.Series:
    """Records per value of one column of the frequency table, exactly as
    ``groupby(column, dropna=False)[count].sum()`` of a ``str`` column gives (values sorted,
    missing last). A categorical column (``FrequencyTable(categorical=True)``) is summed
    per code first, so only its distinct values are grouped as strings."""
    name = str(column.name)
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        categories = column.cat.categories.to_numpy(dtype=object)
        sums = np.bincount(codes + 1, weights=counts.to_numpy(), minlength=len(categories) + 1)
        seen = np.flatnonzero(sums > 0)  # position 0: the missing value
        values = np.concatenate([np.array([np.nan], dtype=object), categories])[seen]
        column = pd.Series(pd.array(values, dtype="str"), name=name)
        counts = pd.Series(np.rint(sums[seen]).astype(np.int64), name=COUNT)
    frame = pd.DataFrame({name: column.to_numpy(), COUNT: counts.to_numpy()})
    frame[name] = frame[name].astype(column.dtype)
    return frame.groupby(name, dropna=False)[COUNT].sum()
