"""Published-vs-raw 1-way distributions and per-attribute generalisation levels.

For each workload column, the share of every common value in the raw data beside the share
each release's 1-way estimate gives it (answered exactly as the utility scores answer it:
``reports.utility``'s sources and covers). Aggregates only: the shown values are the most
frequent ones whose raw count reaches ``min_count``; every other value is pooled into
"other", so no rare value (or its count) reaches the report.

Pure core: pandas, numpy and the standard library only (no Beam).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pandas as pd

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.reports.run import ANONYMISED_KINDS, Release
from privpipe.reports.utility import UtilityOptions, _Answerer, answerer_of
from privpipe.reports.workload import Truth

__all__ = ["OTHER", "distributions", "generalisation_levels"]

OTHER: Final = "(other values)"


def _shares(series: pd.Series, shown: list[str]) -> list[float] | None:
    """Shares of ``shown`` values and of everything else (None when the total is 0)."""
    values = series.clip(lower=0.0)
    total = float(values.sum())
    if total <= 0:
        return None
    picked = [float(values.get(v, 0.0)) / total for v in shown]
    return [*picked, max(0.0, 1.0 - sum(picked))]


def distributions(
    releases: Mapping[str, Release],
    truth: Truth,
    hierarchies: Mapping[str, Hierarchy] | None = None,
    options: UtilityOptions | None = None,
    top: int = 8,
    min_count: int = 10,
    answerers: Mapping[str, _Answerer] | None = None,
) -> dict[str, Any]:
    """``audit["distributions"]``: per 1-way workload column, the shown values, their raw
    shares and each release's estimated shares (None: the release does not answer it).
    ``answerers``: the utility's, per release name (their covers reused)."""
    given = answerers or {}
    answering = {
        name: given.get(name) or answerer_of(r, truth, hierarchies, options)
        for name, r in releases.items()
    }
    columns: dict[str, Any] = {}
    for marginal, true in truth.marginals.items():
        if len(marginal) != 1:
            continue
        col = marginal[0]
        raw = pd.Series(true.to_numpy(dtype=np.float64), index=[str(v) for v in true.index])
        ranked = raw[raw >= min_count].sort_values(ascending=False, kind="stable")
        shown = [str(v) for v in ranked.index[:top]]
        per_release: dict[str, list[float] | None] = {}
        for name, answerer in answering.items():
            est = answerer.marginal(marginal)
            if est is None:
                per_release[name] = None
                continue
            flat = est.groupby(level=0).sum()
            flat.index = [str(v) for v in flat.index]
            per_release[name] = _shares(flat, shown)
        columns[col] = {
            "values": [*shown, OTHER],
            "raw": _shares(raw, shown),
            "releases": per_release,
        }
    return {
        "columns": columns,
        "rule": f"the {top} most frequent values with at least {min_count} raw records; "
        "every other value is pooled into one bar; release shares from the same 1-way "
        "estimates the utility scores use (negative noisy counts clamped at 0)",
    }


def generalisation_levels(
    releases: Mapping[str, Release], hierarchies: Mapping[str, Hierarchy] | None = None
) -> dict[str, Any]:
    """``audit["generalisation"]``: per anonymised release, each QI's hierarchy level
    (with the hierarchy's number of levels) or "local recoding" (Mondrian)."""
    h = hierarchies or {}
    out: dict[str, Any] = {}
    for name, r in releases.items():
        if r.kind not in ANONYMISED_KINDS:
            continue
        t = dict(r.document.get("transformation") or {})
        qis = [str(q) for q in r.parameters.get("quasi_identifiers") or []]
        levels = {str(k): int(v) for k, v in (t.get("levels") or {}).items()}
        if t.get("type") == "local_recoding" or not levels:
            how = f"local recoding ({t.get('algorithm') or 'per class'})"
            out[name] = {q: {"level": None, "of": None, "text": how} for q in qis or levels}
            continue
        out[name] = {
            q: {
                "level": lv,
                "of": None if q not in h else int(h[q].levels) - 1,
                "text": f"level {lv}" + (f" of {int(h[q].levels) - 1}" if q in h else ""),
            }
            for q, lv in levels.items()
        }
    return out
