"""The common query workload every release is scored on, and its true answers.

The workload is the set of all 1-way and 2-way marginal count queries over the chosen
columns (by default the quasi-identifiers and the sensitive attribute), plus optional
user count queries ``{name, where: {column: value or [values]}}`` (a conjunction of
"column in values"). A marginal is stored compactly as the tuple of its columns; its
*cells* — one count query each — are the value combinations present in the true data
(cells absent from the raw data are not queried, so a release is never scored on
combinations that do not exist).

Values are compared as canonical strings (``39`` and ``39.0`` -> ``"39"``, missing ->
``""``), the form hierarchies and published tables use.

Pure core: numpy, pandas and the standard library only (no Beam).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.anonymity.hierarchy import canonical_column, canonical_factorize
from privpipe.attacks.matching import WEIGHT, frequency_table

__all__ = [
    "CountQuery",
    "Truth",
    "Workload",
    "build_workload",
    "canonical_column",
    "canonical_frame",
    "parse_queries",
    "true_answers",
]

ObjArray: TypeAlias = npt.NDArray[np.object_]
Marginal: TypeAlias = tuple[str, ...]


@dataclass(frozen=True)
class CountQuery:
    """A user count query: rows whose value of every ``where`` column is in its set."""

    name: str
    where: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(col for col, _ in self.where)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the values are the user's own, from the config, not from data)."""
        return {"name": self.name, "where": {col: list(vals) for col, vals in self.where}}


@dataclass(frozen=True)
class Workload:
    """Marginals (tuples of columns) and user count queries over ``columns``."""

    columns: tuple[str, ...]
    marginals: tuple[Marginal, ...]
    queries: tuple[CountQuery, ...] = ()
    declared: bool = False  # the marginals are the config's report.marginals

    def ways(self) -> dict[int, int]:
        """Number of marginals per arity (``{1: 9, 2: 36}``)."""
        out: dict[int, int] = {}
        for m in self.marginals:
            out[len(m)] = out.get(len(m), 0) + 1
        return dict(sorted(out.items()))

    def describe(self) -> dict[str, Any]:
        """JSON summary for the audit's methodology section."""
        return {
            "columns": list(self.columns),
            "marginals": {str(k): v for k, v in self.ways().items()},
            "declared_marginals": [list(m) for m in self.marginals] if self.declared else None,
            "custom_queries": [q.as_dict() for q in self.queries],
        }


def parse_queries(specs: Iterable[Mapping[str, Any]]) -> tuple[CountQuery, ...]:
    """User count queries from config-like dicts ``{name, where: {col: v or [v...]}}``."""
    out: list[CountQuery] = []
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        name = spec.get("name")
        where = spec.get("where")
        if not isinstance(name, str) or not name:
            raise ValueError(f"queries[{i}].name: a non-empty string is required")
        if name in seen:
            raise ValueError(f"queries[{i}].name: {name!r} is used twice")
        if not isinstance(where, Mapping) or not where:
            raise ValueError(f"queries[{i}].where: a non-empty mapping column -> value(s)")
        items: list[tuple[str, tuple[str, ...]]] = []
        for col, val in where.items():
            values = val if isinstance(val, list | tuple) else [val]
            if not values:
                raise ValueError(f"queries[{i}].where.{col}: at least one value is required")
            _, canon = canonical_factorize(pd.Series(list(values), dtype=object))
            items.append((str(col), tuple(str(v) for v in canon)))
        seen.add(name)
        out.append(CountQuery(name, tuple(items)))
    return tuple(out)


def build_workload(
    columns: Sequence[str],
    *,
    ways: Sequence[int] = (1, 2),
    queries: Iterable[Mapping[str, Any] | CountQuery] = (),
    marginals: Sequence[Sequence[str]] | None = None,
) -> Workload:
    """All ``ways``-way marginals over ``columns`` (in column order), plus user queries;
    with ``marginals`` (declared by the config), exactly those over their own columns."""
    parsed = [q for q in queries if isinstance(q, CountQuery)]
    parsed += parse_queries(q for q in queries if not isinstance(q, CountQuery))
    if marginals:
        declared = tuple(dict.fromkeys(tuple(str(c) for c in m) for m in marginals))
        if any(not m for m in declared):
            raise ValueError("a declared marginal needs at least one column")
        cols = tuple(dict.fromkeys(c for m in declared for c in m))
        return Workload(cols, declared, tuple(parsed), declared=True)
    cols = tuple(dict.fromkeys(str(c) for c in columns))
    if not cols:
        raise ValueError("the workload needs at least one column")
    if any(w < 1 for w in ways):
        raise ValueError(f"ways must be >= 1, got {list(ways)}")
    combos = tuple(m for w in sorted(set(ways)) for m in combinations(cols, w))
    return Workload(cols, combos, tuple(parsed))


def canonical_frame(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``df[columns]`` as canonical strings (missing columns raise KeyError)."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the data (have {list(df.columns)})")
    # object columns: pandas would convert each to Arrow strings (seconds at 10M rows), and
    # every reader turns them back into Python strings
    return pd.DataFrame(
        {c: pd.Series(canonical_column(df[c]), dtype=object) for c in columns}, index=None
    )


@dataclass(frozen=True)
class Truth:
    """True answers of a workload on the raw data (kept in memory, never published)."""

    workload: Workload
    rows: int
    marginals: Mapping[Marginal, pd.Series]  # cell counts, index = value combinations
    queries: Mapping[str, int]
    domains: Mapping[str, ObjArray] = field(default_factory=dict)  # distinct values

    def cells(self, marginal: Marginal) -> int:
        return int(self.marginals[marginal].shape[0])


def true_answers(raw: pd.DataFrame, workload: Workload) -> Truth:
    """Count every marginal cell and user query on the raw rows (vectorised groupby)."""
    needed = list(
        dict.fromkeys([*workload.columns, *(c for q in workload.queries for c in q.columns)])
    )
    # counted on the distinct rows with their multiplicities (first-appearance order kept,
    # so the domains' order is the rows'): the size of the combinations, not of the rows
    distinct = frequency_table(raw, needed)
    frame = canonical_frame(distinct, needed)
    weight = distinct[WEIGHT].to_numpy(dtype=np.int64)
    counted = frame.assign(**{WEIGHT: weight})
    marginals = {
        m: counted.groupby(list(m), sort=True)[WEIGHT].sum().rename(None)
        for m in workload.marginals
    }
    answers: dict[str, int] = {}
    for q in workload.queries:
        mask = np.ones(len(frame), dtype=bool)
        for col, vals in q.where:
            mask &= frame[col].isin(list(vals)).to_numpy(dtype=bool)
        answers[q.name] = int(weight[mask].sum())
    domains = {
        c: np.asarray(pd.unique(frame[c].to_numpy(dtype=object)), dtype=object) for c in needed
    }
    return Truth(workload, int(weight.sum()), marginals, answers, domains)
