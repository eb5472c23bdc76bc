"""``privpipe tune``: expected error of each DP release over a grid of contribution bounds,
from the data, before any budget is spent (the computation is :mod:`dp.tuning`).

Reads the input once on the driver with the run's own reader and typing
(:class:`transforms.driver_read.DriverRead`: one process, batch by batch; an operator tool,
not a nightly job), labels and hashes each batch as the run does
(:func:`dp.cells.contributions`), then evaluates every candidate. It opens no ledger,
draws no noise and writes nothing but ``tune.json`` and ``tune.csv`` in the operator's
folder (default ``<output.dir>/tune/``, mode 0700: beside ``internal/``, which every run
replaces as a whole; never ``public/``). Its output is NOT private.

With ``attacks.control.holdout`` a run publishes from the members only; tune looks at all
rows (the split is drawn afresh by each run), which differs by the held-out share.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from privpipe.dp.cells import contributions, hash_keys, key_frame
from privpipe.dp.release import public_domain
from privpipe.dp.spec import TOP_KINDS
from privpipe.dp.tuning import (
    KIND_ERRORS,
    MEASURES,
    NOT_PRIVATE,
    QueryData,
    TuneResult,
    tune_release,
)
from privpipe.errors import ConfigError, InputDataError
from privpipe.pipelines.control import holdout_share
from privpipe.pipelines.dp_release import DPJob, dp_jobs
from privpipe.pipelines.hierarchies import HierarchyLabeler, check_static
from privpipe.pipelines.plan import Plan
from privpipe.pipelines.run import check_rejected
from privpipe.transforms.driver_read import DriverRead

TUNE_FOLDER = "tune"
SHOWN = 8  # candidates printed per release (all are in tune.json / tune.csv)


@dataclass
class _Parts:
    """One query's arrays, batch by batch."""

    cell: list[np.ndarray] = field(default_factory=list)
    unit: list[np.ndarray] = field(default_factory=list)
    group: list[np.ndarray] = field(default_factory=list)
    value: list[np.ndarray] = field(default_factory=list)
    top_group: list[np.ndarray] = field(default_factory=list)
    eligible: list[np.ndarray] = field(default_factory=list)

    def joined(self, name: str) -> np.ndarray | None:
        arrays: list[np.ndarray] = getattr(self, name)
        return np.concatenate(arrays) if arrays else None


def select_jobs(plan: Plan, release: str | None) -> list[DPJob]:
    """The DP releases to tune: all of the kinds :data:`dp.tuning.KIND_ERRORS` covers, or
    the one named (ConfigError naming the choices)."""
    jobs = dp_jobs(plan)
    name = plan.config_path.name
    if not jobs:
        raise ConfigError(
            f"{name}: no central DP release to tune (kinds {', '.join(KIND_ERRORS)}); add one "
            "to releases"
        )
    if release is None:
        covered = [j for j in jobs if j.spec.kind in KIND_ERRORS]
        if not covered:
            raise ConfigError(
                f"{name}: tune does not cover the kinds of its DP releases "
                f"({', '.join(sorted({j.spec.kind for j in jobs}))}) yet"
            )
        return covered
    chosen = [j for j in jobs if j.name == release]
    if not chosen:
        raise ConfigError(
            f"--release {release}: {name} has no DP release of that name; choose one of "
            f"{', '.join(j.name for j in jobs)}"
        )
    if chosen[0].spec.kind not in KIND_ERRORS:
        raise ConfigError(
            f"--release {release}: tune does not cover kind {chosen[0].spec.kind} yet; it "
            f"covers {', '.join(KIND_ERRORS)}"
        )
    return chosen


def tune_folder(plan: Plan, output: str | None) -> Path:
    """Where tune writes: ``--output`` or ``<output.dir>/tune``; never inside public/."""
    folder = Path(output).resolve() if output else (plan.output_dir / TUNE_FOLDER).resolve()
    public = (plan.output_dir / "public").resolve()
    if folder == public or public in folder.parents:
        raise ConfigError(
            f"--output {folder}: inside {public}, which is what may be handed out; tune's "
            "output is not private: choose a folder outside public/"
        )
    return folder


def _collect(plan: Plan, jobs: Sequence[DPJob], reader: DriverRead) -> list[list[_Parts]]:
    labeler = HierarchyLabeler(plan.config.hierarchies, plan.hierarchies)
    parts = [[_Parts() for _ in j.plans] for j in jobs]
    tops: dict[tuple[int, int], tuple[np.ndarray, list[str]]] = {}
    for batch in reader.batches():
        for j, job in enumerate(jobs):
            spec = job.spec
            for c in contributions(batch, spec, list(job.plans), labeler):
                p = parts[j][c.query]
                p.cell.append(c.cell)
                if c.unit is not None:
                    p.unit.append(c.unit)
                if c.group is not None:
                    p.group.append(c.group)
                if spec.value is not None and spec.kind not in TOP_KINDS:  # numeric values
                    raw = pd.to_numeric(batch[spec.value], errors="coerce")
                    p.value.append(raw.to_numpy(dtype=np.float64))
                if spec.kind in TOP_KINDS and spec.value is not None:
                    plan_q = job.plans[c.query]
                    keys = key_frame(batch, spec, plan_q.query, labeler)
                    groups = list(spec.key_columns(plan_q.query))[:-1]
                    if (j, c.query) not in tops:
                        domain = hash_keys(public_domain(spec, plan_q, groups)) if groups else None
                        values = public_domain(spec, plan_q, [spec.value])[spec.value].tolist()
                        tops[(j, c.query)] = (
                            np.zeros(1, dtype=np.uint64) if domain is None else domain,
                            values,
                        )
                    domain_g, values = tops[(j, c.query)]
                    group_hash = hash_keys(keys[groups])
                    p.top_group.append(group_hash)
                    p.eligible.append(
                        np.isin(group_hash, domain_g) & keys[spec.value].isin(values).to_numpy()
                    )
    return parts


def _query_data(job: DPJob, q: int, p: _Parts) -> QueryData:
    spec, plan_q = job.spec, job.plans[q]
    cell = p.joined("cell")
    assert cell is not None
    domain = None
    candidates = 0
    if spec.kind in TOP_KINDS:
        assert spec.value is not None
        candidates = len(public_domain(spec, plan_q, [spec.value]))
    elif spec.partitions == "public":
        cols = list(spec.key_columns(plan_q.query))
        domain = hash_keys(public_domain(spec, plan_q, cols)) if cols else np.zeros(1, np.uint64)
    return QueryData(
        cell=cell,
        unit=p.joined("unit"),
        group=p.joined("group"),
        value=p.joined("value"),
        domain=domain,
        top_group=p.joined("top_group"),
        eligible=p.joined("eligible"),
        candidates=candidates,
    )


@dataclass(frozen=True)
class TuneOutput:
    folder: Path
    results: tuple[TuneResult, ...]
    rows: int
    rejected: int


def tune(
    plan: Plan, release: str | None = None, output: str | None = None,
    log: Callable[[str], None] = print,
) -> TuneOutput:  # fmt: skip
    """Evaluate every DP release (or ``release``) of ``plan`` and write tune.json/.csv."""
    check_static(plan.config, plan.hierarchies, plan.config_path.name)  # as validate does
    jobs = select_jobs(plan, release)
    skipped = [j.name for j in dp_jobs(plan) if j.spec.kind not in KIND_ERRORS]
    folder = tune_folder(plan, output)
    reader = DriverRead(plan.input_spec())
    parts = _collect(plan, jobs, reader)
    check_rejected(plan, reader.rows, reader.rejected_rows())  # as a run would refuse
    if reader.rows == 0:
        raise InputDataError(
            f"{', '.join(plan.input_paths)}: no row was accepted ({reader.rejected} rejected); "
            "nothing to tune on: fix the input (privpipe run lists the rejected rows)"
        )
    results = tuple(
        tune_release(job.spec, [_query_data(job, q, p) for q, p in enumerate(parts[j])])
        for j, job in enumerate(jobs)
    )
    doc = {
        "not_private": NOT_PRIVATE,
        "config": str(plan.config_path),
        "config_sha256": plan.config_sha256,
        "input": list(plan.input_paths),
        "rows_read": reader.rows,
        "rows_rejected": reader.rejected,
        "measures": MEASURES,
        "holdout": None
        if holdout_share(plan) is None
        else "attacks.control.holdout is not applied: tune looks at all rows, a run publishes "
        "from its members only",
        "releases": {r.release: r.as_dict() for r in results},
        "not_covered": skipped,
    }
    _write(folder, doc, _table(results))
    for line in _lines(results, reader, folder):
        log(line)
    if skipped:
        log(
            f"privpipe tune: not covered yet (kind without a tuning function): {', '.join(skipped)}"
        )
    if doc["holdout"]:
        log(f"privpipe tune: {doc['holdout']}")
    return TuneOutput(folder, results, reader.rows, reader.rejected)


def _table(results: Sequence[TuneResult]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for r in results:
        for c in r.results:
            d = c.as_dict()
            bounds = d.pop("bounds")
            d.pop("queries")
            rows.append(
                {
                    "release": r.release,
                    "kind": r.kind,
                    "measure": r.measure,
                    **{k: d[k] for k in ("max_partitions", "max_contributions_per_partition")},
                    "lower": None if bounds is None else bounds[0],
                    "upper": None if bounds is None else bounds[1],
                    **{k: v for k, v in d.items() if k not in ("max_partitions",
                                                               "max_contributions_per_partition")},
                    "recommended": r.best is not None and c is r.best,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def _write(folder: Path, doc: dict[str, Any], table: pd.DataFrame) -> None:
    """tune.csv then tune.json, each written to a temporary file and renamed into place."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, text in (
            ("tune.csv", table.to_csv(index=False)),
            ("tune.json", json.dumps(doc, indent=2, allow_nan=False) + "\n"),
        ):
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, folder / name)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except OSError as e:
        raise ConfigError(
            f"{folder}: cannot write tune's output ({e.strerror}); choose another folder "
            "with --output"
        ) from None


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}g}"


def _lines(results: Sequence[TuneResult], reader: DriverRead, folder: Path) -> list[str]:
    out = [
        f"privpipe tune: {NOT_PRIVATE}",
        f"privpipe tune: {reader.rows:,} rows read, {reader.rejected:,} rejected; nothing "
        "charged, nothing published",
    ]
    for r in results:
        out.append(f"release {r.release} ({r.kind}): error = {MEASURES[r.measure]}")
        out.append(
            f"   {'L0':>4} {'Linf':>5} {'bounds':>21} {'error':>10} {'bias':>10} "
            f"{'sampling':>10} {'noise':>10} {'rows kept':>9} {'persons kept':>12}"
        )
        ranked = sorted(
            (c for c in r.results if c.refused is None),
            key=lambda c: (c.error, c.candidate.width()),
        )
        shown = ranked[:SHOWN] + [c for c in ranked[SHOWN:] if c.current]
        for c in shown:
            mark = ("*" if c is r.best else " ") + ("=" if c.current else " ")
            b = c.candidate.bounds
            bounds = "-" if b is None else f"[{b[0]:g}, {b[1]:g}]"
            out.append(
                f"{mark} {c.candidate.max_partitions:>4} {c.candidate.max_contributions:>5} "
                f"{bounds:>21} {_fmt(c.error):>10} {_fmt(c.bias):>10} {_fmt(c.sampling):>10} "
                f"{_fmt(c.noise):>10} {c.rows_kept:>9.1%} {c.persons_kept:>12.1%}"
            )
        refused = sum(c.refused is not None for c in r.results)
        if refused:
            out.append(f"   ({refused} candidate(s) refused by the planner, see tune.json)")
        if r.best is not None:
            best = r.best.candidate
            clamp = best.bounds
            extra = "" if clamp is None else f", bounds: [{clamp[0]:g}, {clamp[1]:g}]"
            out.append(
                f"   suggested: max_partitions: {best.max_partitions}, "
                f"max_contributions_per_partition: {best.max_contributions}{extra}"
                + ("  (as configured)" if r.best.current else "")
            )
    out.append(
        f"privpipe tune: * suggested, = configured; all candidates in {folder}/tune.json, .csv"
    )
    return out
