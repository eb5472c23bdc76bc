"""Before a run: every check that needs no data, the run's jobs, and the budget plan.

``run_jobs`` is the first step of every run: the static checks (hierarchies, domains,
levels, private paths, the control file) and the split of the config's releases into
the jobs that spend from the dataset's ledger and the candidates that never leave the
operator. ``budget_plan`` (``privpipe plan``) goes one step further without spending:
it reads the inputs' headers, opens the ledgers, checks that the run would be affordable
and says what each release would cost and what would be left. It charges nothing,
publishes nothing, and reads no row of data.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from privpipe.dp.ledger import Ledger
from privpipe.errors import PrivacyRefusal
from privpipe.pipelines.continual_release import ContinualJob, continual_jobs, precheck
from privpipe.pipelines.control import control_spec
from privpipe.pipelines.dp_release import DPJob, dp_jobs, open_ledger
from privpipe.pipelines.hierarchies import check_static
from privpipe.pipelines.local_release import LocalJob, local_jobs
from privpipe.pipelines.plan import Plan
from privpipe.pipelines.publication import check_private_paths


@dataclass(frozen=True)
class RunJobs:
    """A run's DP work: what spends from the dataset's ledger, and the candidates."""

    dp: list[DPJob]  # published central DP releases (sweep points included)
    dp_candidates: list[DPJob]  # never published: the audit ledger, or none
    local: list[LocalJob]
    local_candidates: list[LocalJob]
    continual: list[ContinualJob]  # always the dataset's ledger (the stream advances)


def run_jobs(plan: Plan) -> RunJobs:
    """The checks every run makes before any ledger is opened or data read, and its jobs."""
    from privpipe.transforms.io import inspect_input

    check_static(plan.config, plan.hierarchies, plan.config_path.name)
    cspec = control_spec(plan)  # a missing control file: exit 2 before any ledger
    if cspec is not None:
        inspect_input(cspec)
    published = set(plan.config.published())
    every_dp, every_local = dp_jobs(plan), local_jobs(plan)
    cjobs = continual_jobs(plan)
    check_private_paths(plan, [(f"releases.{j.name}.state", j.state) for j in cjobs])
    return RunJobs(
        dp=[j for j in every_dp if j.name in published],
        dp_candidates=[j for j in every_dp if j.name not in published],
        local=[j for j in every_local if j.name in published],
        local_candidates=[j for j in every_local if j.name not in published],
        continual=cjobs,
    )


@dataclass(frozen=True)
class Cost:
    release: str
    kind: str
    ledger: str  # "dataset", "audit", "none (candidate)" or "-" (no DP)
    epsilon: Fraction
    delta: Fraction
    note: str = ""


def budget_plan(plan: Plan, run_id: str = "plan") -> dict[str, Any]:
    """What a run of ``plan`` would cost, checked against the ledgers without charging.

    Raises what the run would raise before reading data (ConfigError, InputDataError,
    PrivacyRefusal: exit 2/3/4), except that an unaffordable run is reported in the result
    (``affordable: False`` with the reason) so the caller can print the plan first."""
    from privpipe.transforms.io import inspect_input

    jobs = run_jobs(plan)
    inspect_input(plan.input_spec())  # every input's header has the declared columns
    kinds = {r.name: r.kind for r in plan.config.releases}
    costs: list[Cost] = []
    audit_ledger = plan.config.budget is not None and plan.config.budget.audit_ledger
    spending: list[DPJob | LocalJob] = [*jobs.dp, *jobs.local]
    for j in spending:
        b = j.budget()
        costs.append(Cost(j.name, kinds[j.name], "dataset", b.epsilon, b.delta))
    candidates: list[DPJob | LocalJob] = [*jobs.dp_candidates, *jobs.local_candidates]
    for j in candidates:
        b = j.budget()
        where = "audit" if audit_ledger else "none (candidate)"
        costs.append(Cost(j.name, kinds[j.name], where, b.epsilon, b.delta))
    result: dict[str, Any] = {"affordable": True, "refusal": None, "ledgers": {}}
    refusals: list[str] = []
    if jobs.dp or jobs.local or jobs.continual:
        with open_ledger(plan) as ledger:
            try:
                new = precheck(jobs.continual, ledger, None)
            except PrivacyRefusal as e:  # reported with the plan, not instead of it
                refusals.append(str(e))
                new = []
            for cj in jobs.continual:
                b = cj.budget()
                kind = kinds[cj.name]
                if refusals:
                    note = "refused: see below"
                    costs.append(Cost(cj.name, kind, "dataset", Fraction(0), Fraction(0), note))
                elif cj not in new:
                    note = "stream already charged (once per stream)"
                    costs.append(Cost(cj.name, kind, "dataset", Fraction(0), Fraction(0), note))
                elif cj.unit == "event":
                    note = "event-level: recorded, not counted in the lifetime"
                    costs.append(Cost(cj.name, kind, "dataset", b.epsilon, b.delta, note))
                else:
                    costs.append(Cost(cj.name, kind, "dataset", b.epsilon, b.delta))
            items: list[tuple[str, Any]] = [(d.name, d.budget()) for d in jobs.dp]
            items += [(loc.name, loc.budget()) for loc in jobs.local]
            items += [(s.name, s.budget()) for s in new if s.unit == "person"]
            result["ledgers"]["dataset"] = _state(ledger, items)
            refusals += _affordable(ledger, run_id, items)
    if audit_ledger and (jobs.dp_candidates or jobs.local_candidates):
        with open_ledger(plan, sweep=True) as ledger:
            cands: list[tuple[str, Any]] = [(d.name, d.budget()) for d in jobs.dp_candidates]
            cands += [(loc.name, loc.budget()) for loc in jobs.local_candidates]
            result["ledgers"]["audit"] = _state(ledger, cands)
            refusals += _affordable(ledger, run_id, cands)
    dp_names = {c.release for c in costs}
    for r in plan.config.releases:
        if r.name not in dp_names:
            costs.append(Cost(r.name, r.kind, "-", Fraction(0), Fraction(0)))
    order = {r.name: i for i, r in enumerate(plan.config.releases)}
    result["costs"] = sorted(costs, key=lambda c: order.get(c.release, len(order)))
    if refusals:
        result["affordable"], result["refusal"] = False, "; ".join(refusals)
    return result


def _state(ledger: Ledger, items: list[tuple[str, Any]]) -> dict[str, Any]:
    eps = sum((Fraction(b.epsilon) for _, b in items), Fraction(0))
    dlt = sum((Fraction(b.delta) for _, b in items), Fraction(0))
    spent, left = ledger.spent(), ledger.remaining()
    return {
        "path": str(ledger.path),
        "lifetime": (Fraction(ledger.lifetime.epsilon), Fraction(ledger.lifetime.delta)),
        "spent": (Fraction(spent.epsilon), Fraction(spent.delta)),
        "this_run": (eps, dlt),
        "left_after": (Fraction(left.epsilon) - eps, Fraction(left.delta) - dlt),
    }


def _affordable(ledger: Ledger, run_id: str, items: list[tuple[str, Any]]) -> list[str]:
    if not items:
        return []
    try:
        ledger.check_affordable(run_id, items)
    except PrivacyRefusal as e:
        return [str(e)]
    return []
