"""Continual counts (``kind: dp_continual_count``): one period of a stream per run.

A stream publishes, at every scheduled run, the noisy cumulative count (total or per public
cell) up to this run's period, with the binary tree mechanism (dp/continual.py); its state
lives in an SQLite file beside the ledger (dp/state_store.py).

Order of a run with a continual count:

1. before any data is read: the state is inspected. A period already released, a skipped
   period, a period beyond the horizon, changed ε/T/cells/mode, or a state failing its
   checksum are refused (exit 4) here, so nothing is read or spent. A stream without state
   is new: its ε must fit the ledger (checked with the run's other DP releases);
2. the pipeline bounds each person's rows of this period (≤ ``max_partitions`` cells and
   ≤ ``max_contributions_per_partition`` rows per cell, at random) and counts per cell —
   the central-DP aggregation (transforms/dp_aggregate.py), no noise;
3. after every other release of the run is written, a NEW stream is charged ε in the ledger
   (the whole stream costs ε once; later periods charge nothing), then the state store
   adds the period's counts and releases the cumulative noisy counts in one transaction;
   the release is re-checked and written. Because the state advances durably in step 3, a
   run failing after it cannot re-run the period (refused as a re-run); the released counts
   stay in the state's history.

Privacy unit: the guarantee is ε-DP for one person's rows *within one period* (event-level
per period, as the tree mechanism bounds each period's L1 contribution by
L0·Linf). A person present in k periods is protected at k·ε over the whole stream.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from anonymity.hierarchy import SUPPRESSED
from dp.budget import ApproxBudget, to_fraction
from dp.cells import hash_keys
from dp.continual import TreeState, check_period, node_scale, round_horizon
from dp.ledger import Ledger
from dp.noise import honest_document
from dp.release import public_domain
from dp.spec import DPReleaseSpec, Query, QueryPlan, plan_queries
from dp.state_store import ContinualStore, describe, state_path
from pipelines.config import ContinualCountRelease, continual_domain_source
from pipelines.dp_release import sampler
from pipelines.plan import Plan
from privpipe.errors import ConfigError, PrivacyRefusal
from transforms.dp_aggregate import load_cells
from transforms.sink import write_json, write_table


@dataclass(frozen=True)
class ContinualJob:
    """One continual count of the run: its stream, period and the bounding spec."""

    index: int
    config: ContinualCountRelease
    spec: DPReleaseSpec  # a public dp_count used for bounding and counting only (no noise)
    plans: tuple[QueryPlan, ...]
    stream_id: str
    state: Path
    period: int
    cells: int

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def sensitivity(self) -> int:
        return self.spec.l0 * self.spec.linf

    def budget(self) -> ApproxBudget:
        return ApproxBudget(to_fraction(self.config.epsilon, "epsilon"), 0)


def _domains(plan: Plan, r: ContinualCountRelease) -> dict[tuple[str, int], tuple[str, ...]]:
    out: dict[tuple[str, int], tuple[str, ...]] = {}
    for col in r.group_by:
        if continual_domain_source(plan.config, r, col) == "domain":
            out[(col, 0)] = tuple(dict.fromkeys(str(v) for v in r.domain[col]))
        else:
            h = plan.hierarchies[col]
            labels = dict.fromkeys(str(x) for x in h.labels(0).tolist())
            out[(col, 0)] = tuple(x for x in labels if h.height == 0 or x != SUPPRESSED)
    return out


def continual_jobs(plan: Plan) -> list[ContinualJob]:
    """Every continual count of the plan (no data read)."""
    jobs = []
    where = plan.config_path.name
    for i, r in enumerate(plan.config.releases):
        if not isinstance(r, ContinualCountRelease):
            continue
        period = plan.period_override if plan.period_override is not None else r.period
        if period is None:
            raise ConfigError(
                f"{where}: releases[{i}].period: missing; give the period this run publishes "
                "(period: N in the config, or privpipe run CONFIG --period N)"
            )
        if period < 1:
            raise ConfigError(f"--period: periods are numbered from 1, got {period}")
        domains = _domains(plan, r)
        spec = DPReleaseSpec(
            name=r.name,
            kind="dp_count",
            epsilon=to_fraction(r.epsilon, "epsilon"),
            unit=plan.config.schema_.privacy_unit,
            queries=(Query(r.name, tuple(r.group_by)),),
            max_partitions=r.max_partitions,
            max_contributions=r.max_contributions_per_partition,
            partitions="public",
            domains=tuple(sorted(domains.items())),
            confidence=r.confidence,
        )
        cells = math.prod(len(v) for v in domains.values()) if domains else 1
        if cells < 1:
            raise ConfigError(f"{where}: releases[{i}].domain: a group_by domain is empty")
        ledger = plan.ledger_path
        assert ledger is not None, "validated: continual counts need budget:"
        folder = ledger.parent if not ledger.is_dir() else ledger
        state = plan.resolve(r.state) if r.state else state_path(folder, f"{plan.name}.{r.name}")
        stream_id = f"{plan.name}/{r.name}"
        jobs.append(
            ContinualJob(i, r, spec, tuple(plan_queries(spec)), stream_id, state, period, cells)
        )
    return jobs


def _stream_exists(path: Path, stream_id: str) -> bool:
    """Whether the state file already holds the stream (read-only peek; creates nothing)."""
    if not path.exists():
        return False
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if not tables:
                return False
            if "streams" not in tables:
                raise PrivacyRefusal(
                    f"{path} is an SQLite file but not a continual state (tables: "
                    f"{sorted(tables)}); restore it from a backup or point state: elsewhere"
                )
            row = conn.execute("SELECT 1 FROM streams WHERE stream_id = ?", (stream_id,))
            return row.fetchone() is not None
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise PrivacyRefusal(
            f"the continual state {path} is unreadable ({exc}); restore it from a backup; "
            "never edit it by hand"
        ) from exc


def precheck(jobs: Sequence[ContinualJob], seed: int | None) -> list[ContinualJob]:
    """Step 1: refuse bad periods and states before reading; returns the NEW streams."""
    new: list[ContinualJob] = []
    for job in jobs:
        r = job.config
        label = f"stream {job.stream_id!r} ({job.state})"
        if _stream_exists(job.state, job.stream_id):
            with ContinualStore.open(
                job.state, job.stream_id, r.horizon, to_fraction(r.epsilon, "epsilon"),
                sampler(seed), job.cells, job.sensitivity, r.pan_private,
            ) as store:  # fmt: skip
                check_period(store.state(), job.period, label)
        else:
            fresh = TreeState(
                round_horizon(r.horizon), r.epsilon, job.cells, job.sensitivity, r.pan_private
            )
            check_period(fresh, job.period, label)
            new.append(job)
    return new


def _exact_counts(job: ContinualJob, cells: dict[str, Any]) -> tuple[pd.DataFrame, np.ndarray]:
    """The public cells (sorted) and this period's bounded exact count of each."""
    plan = job.plans[0]
    cols = list(job.config.group_by)
    partial = cells["partials"][0]  # cells keyed by the hash of their labels
    observed = partial.cells.rename_axis("_cell").reset_index()
    domain = public_domain(job.spec, plan, cols)
    if cols:
        domain = domain.sort_values(cols, kind="stable", ignore_index=True)
        domain["_cell"] = hash_keys(domain[cols])
    else:
        domain["_cell"] = np.uint64(0)
        observed["_cell"] = np.uint64(0)
    merged = domain.merge(observed[["_cell", "count"]], on="_cell", how="left")
    counts = merged["count"].fillna(0).to_numpy(dtype=np.int64)
    return domain[cols], counts


def publish_continual(
    jobs: Sequence[ContinualJob],
    new: Sequence[ContinualJob],
    ledger: Ledger,
    run_id: str,
    plan: Plan,
    work: Path,
    staging: Path,
    seed: int | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Step 3 for every continual count; returns operator figures for the manifest."""
    fmt = plan.config.output.format
    to_charge = [j for j in new if not _stream_exists(j.state, j.stream_id)]
    if to_charge:
        entries = ledger.charge_many(run_id, [(j.name, j.budget()) for j in to_charge])
        spent = sum((e.epsilon for e in entries), Fraction(0))
        log(
            f"privpipe: charged epsilon {float(spent):g} to the ledger {ledger.path} for "
            f"{len(to_charge)} new continual stream(s) (once per stream)"
        )
    # the release claims "charged once per stream": the ledger must hold that charge
    paid: dict[str, Fraction] = {}
    for e in ledger.history():
        paid[e.release] = max(paid.get(e.release, Fraction(0)), e.epsilon)
    summary: dict[str, Any] = {}
    for job in jobs:
        t0 = time.perf_counter()
        r = job.config
        cells = load_cells(work / f"dp-{job.name}.pickle")
        keys, counts = _exact_counts(job, cells)
        partial = cells["partials"][0]
        base = None if seed is None else seed + 104729 * (job.index + 1) + job.period
        job.state.parent.mkdir(parents=True, exist_ok=True)
        eps = to_fraction(r.epsilon, "epsilon")
        if paid.get(job.name, Fraction(0)) < eps:  # checked before the state advances
            raise PrivacyRefusal(
                f"release {job.name!r}: the ledger {ledger.path} holds no charge of epsilon "
                f"{float(eps):g} for this continual stream (was it started against another "
                "ledger?); nothing was published"
            )
        with ContinualStore.open(
            job.state, job.stream_id, r.horizon, eps, sampler(base), job.cells,
            job.sensitivity, r.pan_private,
        ) as store:  # fmt: skip
            noise = sampler(None if base is None else base + 1)
            out = store.release(job.period, counts, noise, beta=1.0 - r.confidence)
            info = store.info()
            history = store.history()  # walks the whole checksum chain
        table = keys.reset_index(drop=True).copy()
        table.insert(0, "period", job.period)
        table["count"] = out.counts
        table["ci_low"] = out.counts - out.halfwidth
        table["ci_high"] = out.counts + out.halfwidth
        problems = []
        if (info.horizon, info.epsilon, info.cells) != (round_horizon(r.horizon), eps, job.cells):
            problems.append("the stream's stored parameters differ from the config")
        if info.sensitivity != job.sensitivity or info.pan_private != r.pan_private:
            problems.append("the stream's stored sensitivity or mode differs from the config")
        if info.period != job.period or not history or history[-1][0] != job.period:
            problems.append(f"the state did not record period {job.period}")
        elif not np.array_equal(history[-1][1], out.counts):
            problems.append("the published counts differ from the state's recorded release")
        if len(table) != job.cells:
            problems.append(f"{len(table)} rows published for {job.cells} cells")
        linf = job.spec.linf
        if partial.max_rows_per_cell > linf or partial.max_cells_per_unit > job.spec.l0:
            problems.append("a person kept more rows or cells than the bounds allow")
        scale = node_scale(info.horizon, float(info.epsilon), info.sensitivity)
        check = {"ok": not problems, "problems": problems, "node_scale": scale}
        if problems:
            raise PrivacyRefusal(
                f"release {job.name!r} failed its verification: {'; '.join(problems)}; "
                "nothing was published"
            )
        folder = staging / "releases" / job.name
        folder.mkdir(parents=True, exist_ok=True)
        write_table(table, str(folder / f"data.{fmt}"), fmt)
        doc = {
            "name": job.name,
            "kind": "dp_continual_count",
            "parameters": {
                "period": job.period,
                "horizon": r.horizon,
                "horizon_rounded": info.horizon,
                "group_by": list(r.group_by),
                "cells": job.cells,
                "pan_private": r.pan_private,
                "max_partitions": job.spec.l0,
                "max_contributions_per_partition": linf,
                "sensitivity": job.sensitivity,
                "node_noise": {"mechanism": "discrete_laplace", "scale": scale},
                "levels_used": list(out.levels_used),
                "confidence": r.confidence,
                "stream": describe(info),
            },
            "guarantee": {
                "epsilon": r.epsilon,
                "delta": 0.0,
                "model": "continual",
                "horizon": r.horizon,
                "unit": f"{plan.config.schema_.privacy_unit or 'row'} per period",
                "charged": "once per stream",
            },
            "metrics": {"variance_per_cell": out.variance, "ci_halfwidth": out.halfwidth},
            "verification": check,
            "verified": True,
            "insecure_seed": seed,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_json(str(folder / "release.json"), honest_document(doc, seed))
        summary[job.name] = {
            "period": job.period,
            "state": str(job.state),
            "rows_in": partial.rows_in,
            "rows_kept": partial.rows_kept,
        }
        log(f"privpipe: continual count {job.name}: period {job.period} of {r.horizon}")
    return summary
