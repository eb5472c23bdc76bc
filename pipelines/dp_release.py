"""Central-DP releases of a run: specs from the config, the ledger, and publishing.

Order of a run with DP releases (DESIGN.md "Fail closed", issue: ledger contract):

1. before any data is read: open the dataset's ledger and refuse (exit 4) if the DP
   releases of this config do not fit the remaining lifetime budget;
2. the pipeline reads the data and writes bounded per-cell aggregates (no noise);
3. the driver checks what needs the data (δ < 1/rows), then charges the ledger for all
   DP releases in one transaction — before any noisy value exists;
4. noise, post-processing, independent verification, data.csv and release.json. If
   anything fails after the charge, the entries are marked failed with the reason (the
   spend stays: noise may have been drawn).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privpipe.anonymity.hierarchy import SUPPRESSED, canonical_column
from privpipe.dp.budget import ApproxBudget, to_fraction
from privpipe.dp.ledger import Ledger
from privpipe.dp.ledger_auth import LedgerKey, load_key
from privpipe.dp.noise import NoiseSampler, SecureSampler, SeededTestSampler
from privpipe.dp.release import (
    Coarsen,
    QueryRelease,
    _with_labels,
    bounding_summary,
    cell_histograms,
    post_process,
    published_table,
    release_document,
    release_query,
    verify_release,
)
from privpipe.dp.spec import (
    DISTINCT_KINDS,
    MOMENT_KINDS,
    QUANTILE_KINDS,
    DPReleaseSpec,
    Query,
    QueryPlan,
    charge,
    plan_queries,
)
from privpipe.errors import ConfigError
from privpipe.pipelines.config import (
    DPMeanRelease,
    DPQuantileRelease,
    DPRelease,
    DPTopKRelease,
    _DPRelease,
    _DPValueRelease,
    public_domain_source,
    resolved_partitions,
)
from privpipe.pipelines.hierarchies import HierarchyLabeler
from privpipe.pipelines.plan import Plan
from privpipe.transforms.dp_aggregate import load_cells
from privpipe.transforms.sink import write_json, write_table


@dataclass(frozen=True)
class DPJob:
    """One DP release of the run: its config, spec and data-independent plan."""

    config: DPRelease
    spec: DPReleaseSpec
    plans: tuple[QueryPlan, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def budget(self) -> ApproxBudget:
        eps, dlt = charge(self.spec, self.plans)
        return ApproxBudget(eps, dlt)


def _domains(plan: Plan, r: _DPRelease) -> dict[tuple[str, int], list[str]]:
    """Public labels per (key column, level): the config's domain, or a static hierarchy."""
    out: dict[tuple[str, int], list[str]] = {}
    cols = r.key_columns() + ([r.value] if isinstance(r, DPTopKRelease) else [])
    levels = {(c, q.levels.get(c, 0)) for q in r.query_list() for c in cols}
    levels |= {(c, 0) for c in cols}
    for col, level in sorted(levels):
        source = public_domain_source(plan.config, r, col)
        if source == "domain":
            out[(col, level)] = [str(v) for v in r.domain[col]]
        elif source == "hierarchy":
            h = plan.hierarchies[col]
            if level <= h.height:
                labels = list(dict.fromkeys(h.labels(level).tolist()))
                out[(col, level)] = [str(x) for x in labels if level == h.height or x != SUPPRESSED]
    return out


def dp_spec(plan: Plan, r: DPRelease) -> DPReleaseSpec:
    """The pure core's spec of one DP release of the config."""
    queries = tuple(
        Query(
            name=q.name,
            group_by=tuple(q.group_by),
            levels=tuple(sorted(q.levels.items())),
            weight=to_fraction(q.weight, "weight"),
        )
        for q in r.query_list()
    )
    extra: dict[str, Any] = {}
    if isinstance(r, _DPValueRelease):
        extra.update(
            value=r.value, bounds=tuple(r.bounds), resolution=r.resolution, decimals=r.round
        )
    if isinstance(r, DPMeanRelease):
        extra["count_share"] = to_fraction(r.count_share, "count_share")
    if isinstance(r, DPQuantileRelease):
        extra["quantiles"] = tuple(to_fraction(q, "quantiles") for q in r.quantile_list())
    if isinstance(r, DPTopKRelease):
        extra.update(value=r.value, top_k=r.k)
    if getattr(r, "consistent", False):
        extra["consistent"] = True
    return DPReleaseSpec(
        name=r.name,
        kind=r.kind,
        epsilon=to_fraction(r.epsilon, "epsilon"),
        delta=to_fraction(r.delta, "delta"),
        mechanism=r.mechanism,
        unit=plan.config.schema_.privacy_unit,
        queries=queries,
        partition_by=tuple(r.partition_by),
        bound_to_one_group=r.bound_to_one_group,
        max_partitions=r.max_partitions,
        max_contributions=r.max_contributions_per_partition,
        partitions=resolved_partitions(plan.config, r)
        if not isinstance(r, DPTopKRelease)
        else "public",
        domains=tuple((k, tuple(v)) for k, v in sorted(_domains(plan, r).items())),
        selection=r.selection,
        selection_share=to_fraction(r.selection_share, "selection_share"),
        clamp=r.clamp,
        confidence=r.confidence,
        max_units=plan.config.schema_.max_units,
        **extra,
    )


def dp_jobs(plan: Plan) -> list[DPJob]:
    """Every DP release of the plan with its noise plan (no data needed)."""
    jobs = []
    for r in plan.config.releases:
        if isinstance(r, _DPRelease):
            spec = dp_spec(plan, r)  # type: ignore[arg-type]
            jobs.append(DPJob(r, spec, tuple(plan_queries(spec))))  # type: ignore[arg-type]
    return jobs


def open_ledger(plan: Plan, sweep: bool = False) -> Ledger:
    """The dataset's ledger from ``budget:`` (path relative to the config's folder), or
    with ``sweep`` its separate audit ledger for DP candidates, never published (dataset id
    ``<name>.audit``).
    Both must exist (``privpipe budget init``); the lifetime comes from the ledger."""
    b = plan.config.budget
    path = plan.ledger_path
    assert b is not None and path is not None, "validated: DP releases need budget:"
    dataset = plan.name
    if sweep:
        assert b.audit_ledger is not None
        path, dataset = plan.resolve(b.audit_ledger), f"{plan.name}.audit"
    eps, dlt = b.lifetime_epsilon, b.lifetime_delta
    return Ledger.open(
        path,
        dataset,
        ledger_key(plan, dataset),
        None if eps is None else to_fraction(eps, "budget.lifetime_epsilon"),
        None if dlt is None else to_fraction(dlt, "budget.lifetime_delta"),
    )


def ledger_key(plan: Plan, dataset: str) -> LedgerKey:
    """The ledger key and heads file that ``budget:`` names (key_file, key_env, heads_file)."""
    b = plan.config.budget
    assert b is not None
    key_file = plan.key_file_override or (None if b.key_file is None else plan.resolve(b.key_file))
    heads = None if b.heads_file is None else plan.resolve(b.heads_file)
    return load_key(dataset, key_file, None if key_file else b.key_env, heads)


def coarsen_for(plan: Plan, labeler: HierarchyLabeler) -> Coarsen:
    """Labels of a column at one level → a coarser level, for ``consistent`` releases."""

    def coarsen(col: str, lo: int, hi: int, labels: np.ndarray) -> np.ndarray:
        if lo == 0:  # raw values: label them like the batches were
            return labeler(col, hi, pd.Series(labels, dtype=object))
        h = plan.hierarchies.get(col)
        if h is None:
            raise ConfigError(
                f"consistent: {col!r} at level {lo} can be coarsened only with a file or "
                f"groups hierarchy; use level 0 for the finer query or such a hierarchy"
            )
        up = pd.Series(h.labels(hi), index=h.labels(lo))
        up = up[~up.index.duplicated()]
        return pd.Series(labels, dtype=object).map(up).to_numpy(dtype=object)

    return coarsen


def sampler(seed: int | None) -> NoiseSampler:
    """OpenDP's secure sampler, or the seeded test sampler of an accepted insecure run."""
    return SecureSampler() if seed is None else SeededTestSampler(seed)


def publish(
    jobs: Sequence[DPJob],
    ledger: Ledger,
    run_id: str,
    rows: int,
    work: Path,
    staging: Path,
    fmt: str,
    seed: int | None,
    log: Callable[[str], None],
    coarsen: Coarsen | None = None,
    units: int | None = None,
) -> dict[str, Any]:
    """Steps 3 and 4 of the module docstring, for every DP release of the run.

    ``units``: the privacy units read, re-checked against ``schema.max_units`` by each
    release's verifier. Returns the exact bounding figures per release, for the operator's
    manifest only.
    """
    # δ was checked at validate against schema.max_units, the data against it after reading
    entries = ledger.charge_many(run_id, [(j.name, j.budget()) for j in jobs])
    spent = sum((e.epsilon for e in entries), Fraction(0))
    log(f"privpipe: charged epsilon {float(spent):g} to {ledger.label}")
    # (a failure from here on keeps the charge: run() marks the entries failed with why)
    bounding: dict[str, Any] = {}
    for i, (job, entry) in enumerate(zip(jobs, entries, strict=True)):
        t0 = time.perf_counter()
        charged = (entry.epsilon, entry.delta)
        cells = load_cells(work / f"dp-{job.name}.pickle")
        noise = sampler(None if seed is None else seed + i)
        releases: list[QueryRelease] = [
            release_query(cells["partials"][q], cells["dictionaries"][q], job.spec, p, noise)
            for q, p in enumerate(job.plans)
        ]
        releases = post_process(job.spec, job.plans, releases, coarsen)
        check = verify_release(job.spec, job.plans, releases, rows, charged, privacy_units=units)
        folder = staging / "releases" / job.name
        folder.mkdir(parents=True, exist_ok=True)
        write_table(published_table(job.spec, releases), str(folder / f"data.{fmt}"), fmt)
        doc = release_document(
            job.spec, job.plans, releases, check,
            seconds=time.perf_counter() - t0, charged=charged, insecure_seed=seed,
        )  # fmt: skip
        write_json(str(folder / "release.json"), doc)
        bounding[job.name] = bounding_summary(releases)
    return bounding


def bounded_truth(work: Path, name: str, document: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """The exact bounded cells of DP release ``name`` before noise, per query, for the
    audit's utility only (never published): the DP job's cells as
    ``transforms.dp_aggregate`` wrote them to the run's private ``work`` folder
    (``dp-<name>.pickle``, what :func:`publish` reads), with their key labels, ``count``
    (after contribution bounding) and, for dp_sum/dp_mean, the clamped ``sum`` and
    ``mean``. Empty when the work folder no longer holds the job (a rebuilt report)."""
    path = work / f"dp-{name}.pickle"
    if not path.is_file():
        return {}
    cells = load_cells(path)
    params = document.get("parameters") or {}
    queries: dict[str, Any] = params.get("queries") or {}
    partition_by = [str(c) for c in params.get("partition_by") or []]
    value = params.get("value")
    bounds = params.get("bounds")
    out: dict[str, pd.DataFrame] = {}
    for q, (qname, query) in enumerate(queries.items()):
        if q >= len(cells["partials"]):
            break
        keys = list(dict.fromkeys([*partition_by, *[str(c) for c in query.get("group_by") or []]]))
        frame = _with_labels(cells["partials"][q], cells["dictionaries"][q], keys)
        truth = pd.DataFrame({k: canonical_column(frame[k]) for k in keys})
        truth["count"] = frame["count"].to_numpy(dtype=np.float64)
        kind = str(document.get("kind"))
        if kind in DISTINCT_KINDS:  # the estimand: distinct persons per cell
            truth["count"] = frame["units"].to_numpy(dtype=np.float64)
        if value and bounds and kind in MOMENT_KINDS:
            truth[kind.removeprefix("dp_")] = _bounded_moment(frame, params, kind)
        if value and bounds and kind in QUANTILE_KINDS:
            truth = truth.assign(**_bounded_quantiles(cells["partials"][q], frame, params, kind))
        if value and bounds and document.get("kind") in ("dp_sum", "dp_mean"):
            lo, hi = (float(b) for b in bounds)
            centre = (lo + hi) / 2 if document.get("kind") == "dp_mean" else 0.0
            step = float(params.get("resolution") or 1.0)
            units = np.array([float(u) for u in frame["sum_units"].tolist()], dtype=np.float64)
            counts = truth["count"].to_numpy()
            truth["sum"] = units * step + centre * counts
            truth["mean"] = centre + units * step / np.maximum(counts, 1.0)
        out[str(qname)] = truth
    return out


def _bounded_moment(frame: pd.DataFrame, params: Mapping[str, Any], kind: str) -> np.ndarray:
    """The exact variance (or standard deviation) of each cell's bounded, clamped values."""
    step = float(params.get("resolution") or 1.0)
    n = np.maximum(frame["count"].to_numpy(dtype=np.float64), 1.0)
    total = np.array([float(v) for v in frame["sum_units"].tolist()], dtype=np.float64)
    column = frame["sumsq_units"] if "sumsq_units" in frame else pd.Series(0, index=frame.index)
    squares = np.array([float(v) for v in column.tolist()], dtype=np.float64)
    var = np.maximum(squares / n - (total / n) ** 2, 0.0) * step * step
    return np.sqrt(var) if kind == "dp_stddev" else var


def _bounded_quantiles(
    partial: Any, frame: pd.DataFrame, params: Mapping[str, Any], kind: str
) -> dict[str, np.ndarray]:
    """The exact quantiles of each cell's bounded values on the grid: the smallest grid
    point with at least α·n of the cell's rows at or below it (NaN for an empty cell)."""
    lo = float((params.get("bounds") or [0.0])[0])
    step = float(params.get("resolution") or 1.0)
    quantiles = [float(q) for q in params.get("quantiles") or [0.5]]
    size = math.floor((float(params["bounds"][1]) - lo) / step + 1e-9) + 1  # dp.spec._grid_size
    hists = cell_histograms(partial, frame["_cell"], size)
    cum = np.cumsum(hists, axis=1)
    n = cum[:, -1] if size else np.zeros(len(frame))
    names = ["median"] if kind == "dp_median" else [f"q{q:g}" for q in quantiles]
    out: dict[str, np.ndarray] = {}
    for name, q in zip(names, quantiles, strict=True):
        index = (cum < (q * n)[:, None]).sum(axis=1)
        out[name] = np.where(n > 0, lo + index * step, np.nan)
    return out
