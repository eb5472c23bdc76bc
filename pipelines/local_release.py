"""Local DP releases (``kind: local_dp``) of a run: jobs from the config, ledger, publishing.

Order of a run with local DP releases — it differs from central DP (pipelines/dp_release.py):

1. before any data is read: the ledger refuses (exit 4) a run that does not fit, then
   CHARGES the local releases at once. In the local model the noise is each person's own
   randomisation, and it is drawn inside the pipeline, batch by batch, while the data is
   read; so the spend is recorded before the pipeline starts, not after it. A run that
   fails afterwards (even on bad input data) keeps the charge, marked failed with the reason;
2. the pipeline encodes each value in the public domain (a value outside it: exit 3, or the
   ``other`` value), keeps one row per person (privacy unit), perturbs with the release's
   frequency oracle (OS CSPRNG; seeded only with --insecure-seed), and sums support counts;
   with ``write_reports`` the reports themselves go to the operator's
   ``internal/local_reports/<name>/reports.csv`` (what a collector receives; never public:
   their number is the exact number of persons);
3. the driver de-biases the support counts into estimates with 95% intervals, adds the
   multiparty histogram when ``parties`` is set, re-checks everything
   (:func:`dp.local_release.verify_local_release`) and writes data.csv and release.json.

The ledger charge of a local release is ε, or 2ε with ``parties`` (the multiparty histogram
is a second ε-DP output about the same persons). The ``parties`` histogram is a SIMULATION
of m parties in one process (it sees every party's rows); party j's noise is drawn from
:func:`dp.multiparty.party_seed` (seed, release name, j), so it equals what m separate
``dp_party_histogram`` runs (release_id = this release's name) and ``privpipe multiparty
aggregate`` give (pipelines/multiparty.py), the path that has the trust property.

``dp_party_histogram`` releases run through the same jobs (no oracle: the pipeline only
counts the party's persons' values) and are published by :func:`pipelines.multiparty.
publish_party`; charged ε, also before reading.
"""

from __future__ import annotations

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
from privpipe.dp.ledger import Ledger
from privpipe.dp.local import FrequencyOracle, public_halfwidth
from privpipe.dp.local_release import PARTICIPATION, full_domain, verify_local_release
from privpipe.dp.multiparty import (
    SUBSTITUTION_L1,
    TRUST_SIMULATION,
    compare_models,
    noisy_party_sum,
    party_seed,
)
from privpipe.dp.noise import honest_document, laplace_scale
from privpipe.errors import ConfigError, PrivacyRefusal
from privpipe.pipelines.config import (
    LocalDPRelease,
    PartyHistogramRelease,
    public_local_domain_source,
)
from privpipe.pipelines.dp_release import sampler
from privpipe.pipelines.plan import Plan
from privpipe.transforms.dp_aggregate import load_cells
from privpipe.transforms.local_dp import LocalDPSpec
from privpipe.transforms.sink import write_json, write_table


@dataclass(frozen=True)
class LocalJob:
    """One local DP release of the run."""

    index: int
    config: LocalDPRelease | PartyHistogramRelease
    spec: LocalDPSpec
    values: tuple[str, ...]  # the released values: the domain, then ``other``
    protocol_requested: str

    @property
    def name(self) -> str:
        return self.config.name

    def budget(self) -> ApproxBudget:
        eps = to_fraction(self.config.epsilon, "epsilon")
        simulated = isinstance(self.config, LocalDPRelease) and self.config.parties is not None
        return ApproxBudget(eps * (2 if simulated else 1), 0)


def _domain(plan: Plan, r: LocalDPRelease | PartyHistogramRelease) -> list[str]:
    source = public_local_domain_source(plan.config, r)
    if source == "domain":
        assert r.domain is not None
        return [str(v) for v in r.domain]
    h = plan.hierarchies[r.attribute]
    labels = list(dict.fromkeys(str(x) for x in h.labels(0).tolist()))
    return [x for x in labels if h.height == 0 or x != SUPPRESSED]


def local_jobs(plan: Plan) -> list[LocalJob]:
    """Every local DP release of the plan, its domain and oracle fixed (no data read)."""
    jobs = []
    where = plan.config_path.name
    for i, r in enumerate(plan.config.releases):
        if not isinstance(r, LocalDPRelease | PartyHistogramRelease):
            continue
        domain = _domain(plan, r)
        values = full_domain(domain, r.other)
        if r.other is not None and r.other in domain:
            raise ConfigError(f"{where}: releases[{i}].other: {r.other!r} is already in the domain")
        if isinstance(r, PartyHistogramRelease):  # counts only; the party's noise: driver
            unit = plan.config.schema_.privacy_unit
            party = LocalDPSpec(r.name, None, r.attribute, tuple(domain), r.other, unit)
            jobs.append(LocalJob(i, r, party, values, "none"))
            continue
        try:
            oracle = FrequencyOracle.create(r.protocol, r.epsilon, len(values))
        except ConfigError as e:
            key = "protocol" if r.protocol == "rr" else "domain"
            raise ConfigError(f"{where}: releases[{i}].{key}: {e}") from None
        parties = r.parties
        spec = LocalDPSpec(
            name=r.name,
            oracle=oracle,
            attribute=r.attribute,
            domain=tuple(domain),
            other=r.other,
            unit=plan.config.schema_.privacy_unit,
            party_column=parties.column if parties else None,
            party_count=parties.count if parties else None,
            write_reports=r.write_reports,
        )
        jobs.append(LocalJob(i, r, spec, values, r.protocol))
    return jobs


def charge_local(
    ledger: Ledger, run_id: str, jobs: Sequence[LocalJob], log: Callable[[str], None]
) -> None:
    """Step 1: record the local releases' spend before their noise is drawn."""
    if not jobs:
        return
    entries = ledger.charge_many(run_id, [(j.name, j.budget()) for j in jobs])
    spent = sum((e.epsilon for e in entries), Fraction(0))
    log(
        f"privpipe: charged epsilon {float(spent):g} to {ledger.label} for local DP "
        "(before reading: each person's randomisation is drawn while reading)"
    )


def _table(values: Sequence[str], est: np.ndarray, half: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "value": list(values),
            "estimate": est.astype(np.float64),
            "ci_low": (est - half).astype(np.float64),
            "ci_high": (est + half).astype(np.float64),
        }
    )


def publish_local(
    jobs: Sequence[LocalJob],
    plan: Plan,
    work: Path,
    staging: Path,
    seed: int | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Step 3 for every local DP release; returns operator figures for the manifest."""
    fmt = plan.config.output.format
    from privpipe.pipelines.multiparty import publish_party

    summary: dict[str, Any] = {}
    for job in jobs:
        t0 = time.perf_counter()
        r, oracle = job.config, job.spec.oracle
        partial = load_cells(work / f"ldp-{job.name}.pickle")
        if isinstance(r, PartyHistogramRelease):
            summary[job.name] = publish_party(
                job.name, r, job.values, partial, plan, staging, seed, log
            )
            continue
        assert oracle is not None
        beta = 1.0 - r.confidence
        est = oracle.estimate(partial.n, partial.support, beta=beta)
        # the published interval is computed from the estimates alone: the exact variance
        # needs n, the number of persons, which the interval would otherwise state
        table = _table(
            job.values, est.counts, public_halfwidth(oracle.parameters, est.counts, beta)
        )
        par = oracle.parameters.as_dict()
        d = oracle.d
        metrics: dict[str, Any] = {
            "reports": partial.n,
            "std_error_per_value": float(np.sqrt(est.table_variance)),
            "ci_halfwidth_mean": float(np.mean(est.halfwidth)),
        }
        multiparty_doc: dict[str, Any] | None = None
        mp_table: pd.DataFrame | None = None
        folder = staging / "releases" / job.name
        folder.mkdir(parents=True, exist_ok=True)
        if r.parties is not None:
            names = sorted(partial.parties)
            exact = (
                np.stack([partial.parties[k] for k in names])
                if names
                else np.zeros((r.parties.count or 1, d), dtype=np.int64)
            )
            # party j's own noise, as its separate run would draw it (pipelines/multiparty.py)
            noise = [sampler(party_seed(seed, job.name, j)) for j in range(exact.shape[0])]
            mp = noisy_party_sum(exact, r.epsilon, noise, SUBSTITUTION_L1, beta=beta)
            half = np.full(d, mp.halfwidth)
            mp_table = _table(job.values, mp.counts.astype(np.float64), half)
            # what the noise was actually drawn with (per party), for the re-check below
            eps_used = float(np.max(mp.epsilons))
            multiparty_doc = {
                "epsilon": eps_used,
                "parties": mp.m,
                "split": f"column {r.parties.column}" if r.parties.column else "even, at random",
                "mechanism": "discrete_laplace",
                "neighbours": "substitution",
                "sensitivity": mp.sensitivity,
                "scale": laplace_scale(mp.sensitivity, float(np.min(mp.epsilons))),
                "variance_per_value": mp.variance,
                "ci_halfwidth": mp.halfwidth,
                "simulation": True,
            }
        # the same histogram's error per trust model (formulas at this n, ε, d): central
        # (m = 1), multiparty (m parties, with `parties`) and this local protocol
        m = multiparty_doc["parties"] if multiparty_doc is not None else None
        models = compare_models(
            max(partial.n, 1), r.epsilon, d, (1,) if m is None else (1, m), oracle.protocol
        )
        metrics["error_by_model"] = [
            {
                "model": str(row.model),
                "parties": int(row.parties),
                "std_error": float(row.std_error),
            }
            for row in models.itertuples()
        ]
        check = verify_local_release(
            par,
            r.epsilon,
            job.values,
            partial.n,
            partial.support,
            table,
            multiparty_doc,
            confidence=r.confidence,
        )
        if not check["ok"]:
            raise PrivacyRefusal(
                f"release {job.name!r} failed its verification: {'; '.join(check['problems'])}; "
                "nothing was published"
            )
        write_table(table, str(folder / f"data.{fmt}"), fmt)
        if mp_table is not None:  # published only once the check passed
            write_table(mp_table, str(folder / f"multiparty.{fmt}"), fmt)
        guarantee: dict[str, Any] = {
            "epsilon": r.epsilon,
            "delta": 0.0,
            "model": "local",
            "unit": plan.config.schema_.privacy_unit or "row",
            "neighbours": "substitution",
            "participation": PARTICIPATION,
        }
        if multiparty_doc is not None:
            guarantee["multiparty"] = {
                "epsilon": r.epsilon,
                "delta": 0.0,
                "model": "multiparty",
                "parties": multiparty_doc["parties"],
                "neighbours": "substitution",
                "unit": guarantee["unit"],
                "trust": TRUST_SIMULATION,
            }
            guarantee["ledger_epsilon"] = 2 * r.epsilon
        doc = {
            "name": job.name,
            "kind": "local_dp",
            "parameters": {
                "attribute": r.attribute,
                "domain": list(job.values),
                "other": r.other,
                "protocol": oracle.protocol,
                "protocol_requested": job.protocol_requested,
                "oracle": par,
                "confidence": r.confidence,
                "write_reports": r.write_reports,
                "one_report_per": plan.config.schema_.privacy_unit or "row",
                "multiparty": multiparty_doc,
            },
            "guarantee": guarantee,
            "metrics": metrics,
            "verification": check,
            "verified": bool(check["ok"]),
            "insecure_seed": seed,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_json(str(folder / "release.json"), honest_document(doc, seed))
        summary[job.name] = {"rows_in": partial.rows_in, "reports": partial.n}
        log(f"privpipe: local DP {job.name}: {partial.n:,} reports ({oracle.protocol})")
    return summary
