"""Continual counts (``kind: dp_continual_count``): one period of a stream per run.

A stream publishes, at every scheduled run, the noisy cumulative count (total or per public
cell) up to this run's period, with the binary tree mechanism (dp/continual.py); its state
lives in an SQLite file beside the ledger (dp/state_store.py).

Order of a run with a continual count:

1. before any data is read: the state is inspected. A period already released, a skipped
   period, a period beyond the horizon, changed ε/T/cells/mode/unit (exit 4), a state
   failing its MAC or whose period differs from the ledger's (rollback, deletion: exit 3)
   are refused here, so nothing is read or spent. A stream without state is new: a
   person-level stream's ε must fit the ledger (checked with the run's other DP releases);
2. the pipeline bounds each person's rows of this period (≤ ``max_partitions`` cells and
   ≤ ``max_contributions_per_partition`` rows per cell, at random) and counts per cell —
   the central-DP aggregation (transforms/dp_aggregate.py), no noise;
3. after every other release of the run is written, a NEW stream is charged ε in the ledger
   (the whole stream costs ε once; later periods charge nothing), then the state store
   adds the period's counts, records the period in the ledger and replaces the state; the
   release is re-checked and written. Because the state advances durably in step 3, a
   run failing after it cannot re-run the period (refused as a re-run).

Privacy unit (``unit:``, dp/continual.py):
- ``event`` (default): ε-DP for one person's rows *within one period* (each period's L1
  contribution bounded by c = L0·Linf). A person present in k periods is protected at k·ε
  only, so the charge is an event-level ledger entry, kept out of person-level accounting.
- ``person``: every node calibrated to m·c (m = the horizon: a person may appear in every
  period), so the whole stream is ε-DP per person; a person-level ledger entry.

Nothing exact about a period is published or put in the manifest: release.json holds
declared parameters and figures derived from them; data holds noisy counts only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privpipe.anonymity.hierarchy import SUPPRESSED
from privpipe.dp.budget import ApproxBudget, to_fraction
from privpipe.dp.cells import hash_keys
from privpipe.dp.continual import (
    TreeState,
    check_period,
    node_scale,
    nodes_used,
    person_l1_bound,
    round_horizon,
    stream_sensitivity,
)
from privpipe.dp.ledger import Ledger
from privpipe.dp.noise import honest_document
from privpipe.dp.release import public_domain
from privpipe.dp.spec import DPReleaseSpec, Query, QueryPlan, plan_queries
from privpipe.dp.state_store import ContinualStore, describe, load, state_path
from privpipe.errors import ConfigError, PrivacyRefusal
from privpipe.pipelines.config import ContinualCountRelease, continual_domain_source
from privpipe.pipelines.dp_release import sampler
from privpipe.pipelines.plan import Plan
from privpipe.transforms.dp_aggregate import load_cells
from privpipe.transforms.sink import write_json, write_table


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
    def unit(self) -> str:
        return self.config.unit

    @property
    def max_periods(self) -> int:
        """m: periods a person may appear in (1 for event level; the horizon for person)."""
        if self.unit == "event":
            return 1
        return self.config.max_periods_per_person or self.config.horizon

    @property
    def sensitivity(self) -> int:
        """The per-leaf L1 the tree is calibrated to: c = L0·Linf, or m·c (person)."""
        return stream_sensitivity(self.spec.l0 * self.spec.linf, self.unit, self.max_periods)

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
        if period > r.horizon:  # the declared T, not the rounded one: m·c assumes ≤ T leaves
            raise PrivacyRefusal(
                f"period {period} of stream '{plan.name}/{r.name}' exceeds its horizon T = "
                f"{r.horizon}: the budget covers T periods only; start a new stream (new "
                "release name) for later periods"
            )
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


def _is_new(job: ContinualJob, ledger: Ledger) -> bool:
    """A stream with neither a state file nor a published period in the ledger."""
    return not job.state.exists() and ledger.stream_period(job.stream_id) == 0


def _open(job: ContinualJob, ledger: Ledger, seed: int | None) -> ContinualStore:
    r = job.config
    return ContinualStore.open(
        job.state, job.stream_id, ledger, r.horizon, to_fraction(r.epsilon, "epsilon"),
        sampler(seed), job.cells, job.sensitivity, r.pan_private, job.unit,
    )  # fmt: skip


def precheck(jobs: Sequence[ContinualJob], ledger: Ledger, seed: int | None) -> list[ContinualJob]:
    """Step 1: refuse bad periods and states before reading; returns the NEW streams."""
    new: list[ContinualJob] = []
    for job in jobs:
        r = job.config
        label = f"stream {job.stream_id!r} ({job.state})"
        if _is_new(job, ledger):
            fresh = TreeState(
                round_horizon(r.horizon), r.epsilon, job.cells, job.sensitivity, r.pan_private
            )
            check_period(fresh, job.period, label)
            new.append(job)
        else:
            with _open(job, ledger, seed) as store:  # verifies MAC, ledger period, parameters
                check_period(store.state(), job.period, label)
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
    to_charge = [j for j in new if _is_new(j, ledger)]
    for unit in ("person", "event"):
        mine = [j for j in to_charge if j.unit == unit]
        if mine:
            entries = ledger.charge_many(run_id, [(j.name, j.budget()) for j in mine], unit=unit)
            spent = sum((e.epsilon for e in entries), Fraction(0))
            log(
                f"privpipe: charged epsilon {float(spent):g} ({unit}-level) to the ledger "
                f"{ledger.path} for {len(mine)} new continual stream(s) (once per stream)"
            )
    # the release claims "charged once per stream": the ledger must hold that charge
    paid: dict[tuple[str, str], Fraction] = {}
    for e in ledger.history():
        k = (e.release, e.unit)
        paid[k] = max(paid.get(k, Fraction(0)), e.epsilon)
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
        if paid.get((job.name, job.unit), Fraction(0)) < eps:  # before the state advances
            raise PrivacyRefusal(
                f"release {job.name!r}: the ledger {ledger.path} holds no {job.unit}-level "
                f"charge of epsilon {float(eps):g} for this continual stream (was it started "
                "against another ledger?); nothing was published"
            )
        with _open(job, ledger, base) as store:
            noise = sampler(None if base is None else base + 1)
            out = store.release(job.period, counts, noise, run_id, beta=1.0 - r.confidence)
        info, stored = load(job.state, job.stream_id, ledger)  # MAC and ledger period again
        table = keys.reset_index(drop=True).copy()
        table.insert(0, "period", job.period)
        table["count"] = out.counts
        table["ci_low"] = out.counts - out.halfwidth
        table["ci_high"] = out.counts + out.halfwidth
        problems = []
        if (info.horizon, info.epsilon, info.cells) != (round_horizon(r.horizon), eps, job.cells):
            problems.append("the stream's stored parameters differ from the config")
        if (info.sensitivity, info.pan_private, info.unit) != (
            job.sensitivity,
            r.pan_private,
            job.unit,
        ):
            problems.append("the stream's stored sensitivity, mode or unit differs from the config")
        if info.period != job.period or stored.period != job.period:
            problems.append(f"the state did not record period {job.period}")
        if out.period != job.period or out.counts.shape != (job.cells,):
            problems.append(f"the release is not period {job.period}'s {job.cells} cell(s)")
        elif not stored.pan_private:
            # standard mode keeps the noisy nodes of this period's cover: the written counts
            # must be their sum (pan-private mode never stores the leaf noise, by design)
            cover = [stored.released.get(j) for j in nodes_used(job.period)]
            if any(c is None for c in cover) or not np.array_equal(
                np.sum([c for c in cover if c is not None], axis=0), out.counts
            ):
                problems.append("the counts written are not the sum of the state's noisy nodes")
        if len(table) != job.cells:
            problems.append(f"{len(table)} rows published for {job.cells} cells")
        linf = job.spec.linf
        if partial.max_rows_per_cell > linf or partial.max_cells_per_unit > job.spec.l0:
            problems.append("a person kept more rows or cells than the bounds allow")
        scale = node_scale(info.horizon, float(info.epsilon), info.sensitivity)
        l1 = person_l1_bound(info.horizon, job.max_periods, job.spec.l0 * linf)
        if not math.isclose(scale, l1 / float(info.epsilon)):
            problems.append(f"the node scale {scale:g} is not L1 {l1} / epsilon")
        check = {"ok": not problems, "problems": problems, "node_scale": scale, "l1_bound": l1}
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
                "unit": job.unit,
                "max_periods_per_person": job.max_periods,
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
                "unit": job.unit,
                "protects": (
                    f"one {plan.config.schema_.privacy_unit or 'row'}'s rows in one period"
                    if job.unit == "event"
                    else f"one {plan.config.schema_.privacy_unit or 'row'}'s rows in every "
                    f"period of the horizon ({job.max_periods})"
                ),
                "pan_private": r.pan_private,
                "charged": f"once per stream, {job.unit}-level ledger entry",
            },
            "metrics": {"variance_per_cell": out.variance, "ci_halfwidth": out.halfwidth},
            "verification": check,
            "verified": True,
            "insecure_seed": seed,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_json(str(folder / "release.json"), honest_document(doc, seed))
        # no exact per-period figure (rows in/kept would be x_t itself without group_by)
        summary[job.name] = {"period": job.period, "state": str(job.state), "unit": job.unit}
        log(f"privpipe: continual count {job.name}: period {job.period} of {r.horizon}")
    return summary
