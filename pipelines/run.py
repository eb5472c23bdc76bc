"""One privpipe run: plan → Beam pipeline → checks → manifest → atomic publish.

The driver only orchestrates: it inspects the input's header, builds the graph,
runs it, and reads back the small files the pipeline wrote into the staging
folder (profile, rejected rows) to decide whether the run may be published.
All row-level work happens in the pipeline, so the same graph runs on any runner.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apache_beam as beam
import pandas as pd
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

import privpipe
from privpipe import errors, timing
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.attacks.control import new_holdout_key
from privpipe.dp.ledger import Ledger
from privpipe.dp.noise import INSECURE_GUARANTEE
from privpipe.errors import InputDataError, PrivacyRefusal, PrivpipeError
from privpipe.pipelines.audit import (
    ATTACKED_KINDS,
    RAW_TABLE,
    PublicationAttacks,
    audit_columns,
    audit_worker,
    common_releases,
    forget_summaries,
    headline,
    load_releases,
    load_truth,
    run_attacks,
    run_common,
    staged_targets,
    wants_audit,
    write_audit,
)
from privpipe.pipelines.config import ANONYMITY_KINDS
from privpipe.pipelines.continual_release import (
    ContinualJob,
    precheck,
    publish_continual,
)
from privpipe.pipelines.control import (
    CONTROL_REJECTED,
    CONTROL_TABLE,
    control_config,
    control_records,
    control_spec,
    control_summary,
    holdout_share,
    load_controls,
    write_key,
)
from privpipe.pipelines.dp_release import DPJob, coarsen_for, open_ledger, publish
from privpipe.pipelines.hierarchies import HierarchyLabeler, HierarchyResolver
from privpipe.pipelines.local_release import LocalJob, charge_local, publish_local
from privpipe.pipelines.output import INTERNAL, RunOutput, new_run_id
from privpipe.pipelines.plan import Plan, check_unchanged, input_size, input_stamps
from privpipe.pipelines.preflight import run_jobs
from privpipe.pipelines.publication import (
    check_combination,
    dp_count_keys,
    split_document,
    uncharged_ledger,
)
from privpipe.pipelines.publish_ahead import PublishAhead
from privpipe.pipelines.rejections import NO_ROWS, all_rejected
from privpipe.pipelines.runner import check_runner, new_pipeline, plans_ahead
from privpipe.timing import stage
from privpipe.transforms.anonymize import (
    AnonymizeRelease,
    AwaitPlan,
    SearchReleases,
    Summarise,
    counted_columns,
    hash_units,
)
from privpipe.transforms.audit_truth import StageAuditTruth
from privpipe.transforms.coders import drop_handed_over, handing_over
from privpipe.transforms.dp_aggregate import AggregateDPCells, DPCellsJob, shards_for
from privpipe.transforms.expand import ExpandTable
from privpipe.transforms.holdout import CONTROLS, MEMBERS, HoldOut
from privpipe.transforms.io import InputSpec, ReadMicrodata, inspect_input
from privpipe.transforms.local_dp import PerturbLocalDP
from privpipe.transforms.order import after
from privpipe.transforms.planning import abandon_ahead, ahead_releases, prestart_ahead
from privpipe.transforms.profile import ProfileMicrodata, split_internal
from privpipe.transforms.sink import WriteTable, load_json, write_json
from privpipe.transforms.timing import stage_counters
from privpipe.workers import discard_prestarted

REJECTED_COLUMNS = ("file", "line", "reason")
LOCAL_REPORTS = "local_reports"  # internal/local_reports/<name>/reports.csv
NUMERIC = ("integer", "float")


@dataclass(frozen=True)
class RunResult:
    run_id: str
    output_dir: Path
    manifest: dict[str, Any]


class _Options(PipelineOptions):  # type: ignore[misc]
    """PipelineOptions that make each view once per class. Beam asks for a view on every
    transform it applies (about twice per apply), and every new view re-parses the flags
    with a freshly built argparse parser: on the demo config that was ~2,000 parsers, a
    large share of graph construction. Views only read and write the shared option values
    (``_all_options``), so one view per class behaves like a new one each time."""

    def view_as(self, cls: type[Any]) -> Any:
        views = self.__dict__.setdefault("_privpipe_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view


def pipeline_options(beam_args: Sequence[str], runner: str | None) -> PipelineOptions:
    """Beam options from pass-through flags; DirectRunner unless told otherwise."""
    options = _Options(list(beam_args))
    std = options.view_as(StandardOptions)
    check_runner(runner or std.runner, "--runner")  # exit 2 naming the runners (faults)
    if runner:
        std.runner = runner
    if not std.runner:
        std.runner = "DirectRunner"
    return options


def anonymization_spec(release: Any, plan: Plan) -> AnonymizationSpec:
    """The pure core's spec of one anonymised release of the config."""
    s = plan.config.schema_
    numeric = tuple(q for q in s.quasi_identifiers if plan.column_types().get(q) in NUMERIC)
    return AnonymizationSpec(
        kind=release.kind,
        qis=tuple(s.quasi_identifiers),
        sensitive=s.sensitive,
        k=release.k,
        l=getattr(release, "l", None),
        variant=getattr(release, "variant", "distinct"),
        c=getattr(release, "c", None),
        t=getattr(release, "t", None),
        distance=getattr(release, "distance", "equal"),
        suppression_limit=release.suppression_limit,
        algorithm=release.algorithm,
        metric=release.metric,
        min_levels=dict(release.min_levels),
        max_levels=dict(release.max_levels),
        time_limit_s=release.time_limit_s,
        suppressed=release.suppressed,
        numeric=numeric if release.algorithm == "mondrian" else (),
        name=release.name,
        unit=release.counts_in(s.privacy_unit),
        unit_column=s.privacy_unit,
    )


def build_graph(
    p: beam.Pipeline,
    spec: InputSpec,
    columns: Sequence[str],
    plan: Plan,
    out: RunOutput,
    jobs: Sequence[DPJob] = (),
    seed: int | None = None,
    ljobs: Sequence[LocalJob] = (),
    cjobs: Sequence[ContinualJob] = (),
    holdout_key: str | None = None,
    input_bytes: int | None = None,  # the inputs' size, None when unknown (remote)
    plan_ahead: bool = False,  # the runner runs one stage at a time in this process
    recode_from_tables: bool | None = None,  # None: as ``plan_ahead``
) -> int:
    """Read batches once; profile, anonymise, aggregate DP cells, perturb local DP reports.
    Returns how many releases the graph plans ahead in worker processes (their workers
    are the run's to start, ``planning.prestart_ahead``: building a graph starts nothing).

    With ``attacks.control.holdout`` the batches are split right after each read by the
    run's ``holdout_key``: members feed everything, the controls only the attacks.

    The anonymised releases recode the rows of their frequency table (``ExpandTable``)
    when ``recode_from_tables`` (a runner in this process, which holds the table for the
    search anyway); otherwise they read the file again, in parallel on a runner's workers.
    From the tables, a release planned ahead is published by the worker that searched it
    (``PublishAhead``), beside the steps this process runs meanwhile."""
    s = plan.config.schema_
    counted = list(s.quasi_identifiers) + ([s.sensitive] if s.sensitive else [])
    read = p | "Read" >> ReadMicrodata(spec)
    batches, controls = control_split(p, read, plan, out, holdout_key)
    read_batches = batches  # the profile describes the ids as read
    if s.privacy_unit:
        # every step after the profile (the summaries, DP contributions, local DP shards,
        # the audit's sample) counts persons by the 64-bit hash of the id: computed once
        # here instead of once per step (the profile describes the ids as read)
        batches = batches | "HashMemberUnits" >> beam.Map(hash_units, s.privacy_unit)
    resolver = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)
    # recoding needs the search's result first: the rows come again from the frequency
    # table the search started from (in this process), or are read a second time, once for
    # all anonymised releases together (a third time for the releases planned ahead)
    from_tables = plan_ahead if recode_from_tables is None else recode_from_tables
    anonymised = [r for r in plan.config.releases if r.kind in ANONYMITY_KINDS]
    # one summary per counted columns; the searches of the releases sharing one run side
    # by side on the cores (SearchReleases), each release recodes with its own plan
    sharing: dict[tuple[str, ...], list[AnonymizationSpec]] = {}
    for r in anonymised:
        aspec = anonymization_spec(r, plan)
        sharing.setdefault(tuple(counted_columns(aspec)), []).append(aspec)
    hashed = bool(s.privacy_unit) and any(a.unit_by for g in sharing.values() for a in g)

    def read_again(suffix: str = "") -> beam.PCollection:
        again = (p | f"ReadAgain{suffix}" >> ReadMicrodata(spec))["batches"]
        share = holdout_share(plan)
        if share is not None and holdout_key is not None:  # the same split
            split = again | f"HoldOutAgain{suffix}" >> HoldOut(share, holdout_key, s.privacy_unit)
            again = split[MEMBERS]
        if hashed:  # every verifier counts persons by the same 64-bit hash of the id
            again = again | f"HashUnits{suffix}" >> beam.Map(hash_units, s.privacy_unit)
        return again

    reads: dict[str, beam.PCollection] = {}  # the file read again, shared by every group

    def rows_again(
        summary: beam.PCollection,
        group: AnonymizationSpec,
        plans: list[beam.PCollection],
        suffix: str = "",
    ) -> Any:
        """The rows that the releases of the contexts ``plans`` recode: ``summary``'s rows
        (``ExpandTable``), or the file read again (once; the releases planned ahead once
        more, ``suffix`` "Ahead", so that the others need not wait for their plans)."""
        if not from_tables:
            if suffix not in reads:
                reads[suffix] = read_again(suffix)
            return reads[suffix]
        # expanded once the plans are there, in the step that recodes them (without the
        # gate a runner of one stage at a time would expand the table beside the summary
        # and hold every expanded batch until the search ends)
        label = f"Rows{suffix}[{group.name}]"
        table = after(summary, plans, f"{label}/AfterPlans")
        return table | label >> ExpandTable(
            counted_columns(group), spec.column_types, spec.batch_rows
        )

    several = len(plan.config.published()) > 1
    audited = (plan.config.attacks is not None or wants_audit(plan) or several) and bool(
        audit_columns(plan)
    )  # the audit's truth and each table's published counts go to the private work folder

    def anonymize(
        aspec: AnonymizationSpec, rows: beam.PCollection, context: beam.PCollection
    ) -> beam.PCollection:
        name = str(aspec.name)
        return rows | f"Release[{name}]" >> AnonymizeRelease(
            aspec, context, str(out.releases / name), plan.config.output.format,
            str(out.work) if audited else None,
        )  # fmt: skip

    def publish_ahead(group: list[AnonymizationSpec], name: str) -> PublishAhead:
        """What the worker searching release ``name`` ahead needs to publish it as
        ``anonymize`` would, from the rows of the table it searched (``rows_again``)."""
        return PublishAhead(
            tuple(counted_columns(group[0])), dict(spec.column_types), spec.batch_rows,
            str(out.releases / name), plan.config.output.format,
            str(out.work) if audited else None,
        )  # fmt: skip

    searched: list[beam.PCollection] = []  # the search steps that plan ahead
    planned_ahead = 0  # releases planned ahead, in worker processes
    summaries: dict[tuple[str, ...], beam.PCollection] = {}  # by counted columns
    for shared_columns, group in sharing.items():
        summary = batches | f"Summarise[{group[0].name}]" >> Summarise(group[0])
        summaries[shared_columns] = summary
        ahead = ahead_releases(group) if plan_ahead and len(group) > 1 else []
        planned_ahead += len(ahead)
        # rows from the table: the worker searching a release ahead publishes it there too
        publish = {name: publish_ahead(group, name) for name in ahead} if from_tables else {}
        contexts = summary | f"Search[{group[0].name}]" >> SearchReleases(
            group, resolver, ahead, publish
        )
        now = [a for a in group if a.name not in ahead]  # config order
        if ahead:  # DP and local DP bound once this step has started the long searches
            searched.append(contexts[str(now[0].name)])
        rows = rows_again(summary, group[0], [contexts[str(now[0].name)]])
        done = [anonymize(a, rows, contexts[str(a.name)]) for a in now]
        # the releases planned ahead: their plans collected once the others are written
        # (those published by their worker: collected, and so awaited, there)
        later = [a for a in group if a.name in ahead]
        plans = [contexts[str(a.name)] | f"AwaitPlan[{a.name}]" >> AwaitPlan(done) for a in later]
        recoded = [(a, c) for a, c in zip(later, plans, strict=True) if a.name not in publish]
        if recoded:
            rows = rows_again(summary, group[0], [c for _, c in recoded], "Ahead")
        for aspec, context in recoded:
            anonymize(aspec, rows, context)
    # the profile: the QIs', the sensitive attribute's and the persons' figures from a
    # frequency table that holds them all (built for the search anyway: 0.17 s for 682k
    # tuples against 0.9 s of hashing and sorting every batch); the rest from the batches.
    # Gated after the search it was slower (a stage more), RESULTS.md, thirty-eighth round
    whole = (*counted, *([s.privacy_unit] if s.privacy_unit else []))
    table = next((t for cols, t in summaries.items() if set(whole) <= set(cols)), None)
    _ = read_batches | "Profile" >> ProfileMicrodata(
        str(out.work / "profile.json"), columns, s.quasi_identifiers, counted, s.privacy_unit,
        exact_columns(plan), table,
    )  # fmt: skip
    if audited:
        # the truth for the audit, the attacker's targets and the publication check: the
        # accepted rows' frequency table (QIs + SA) and a keyed sample of target records
        # (in the private scratch folder, outside DIR), never every row
        cols, n, key = audit_columns(plan), staged_targets(plan), new_holdout_key()
        # a summary of exactly these columns (and the person id) is the table already; it
        # is summed over persons once the long searches have started (as DP bounds)
        same = summaries.get((*cols, s.privacy_unit)) if s.privacy_unit else None
        same = same if same is not None else summaries.get(tuple(cols))
        truth = None if same is None else after(same, searched, "AuditTruthAfterSearch")
        _ = batches | "AuditColumns" >> StageAuditTruth(
            str(out.work), RAW_TABLE, cols, n, key, s.privacy_unit, truth
        )
        if controls is not None:  # the control rows: the attacks' baseline, never published
            _ = controls | "ControlColumns" >> StageAuditTruth(
                str(out.work), CONTROL_TABLE, cols, n, key, s.privacy_unit
            )
    labeler = HierarchyLabeler(plan.config.hierarchies, plan.hierarchies)
    # every DP and continual release in one step (continual: bounded per-cell counts of
    # this period; noise comes in the driver)
    cells = [
        DPCellsJob(j.spec, tuple(j.plans), str(out.work / f"dp-{j.name}.pickle")) for j in jobs
    ] + [DPCellsJob(c.spec, tuple(c.plans), str(out.work / f"dp-{c.name}.pickle")) for c in cjobs]
    if cells:
        _ = batches | "DP" >> AggregateDPCells(
            cells, labeler, seed, shards=shards_for(input_bytes), spill=str(out.work / "dp"),
            after=searched,
        )  # fmt: skip
    for ljob in ljobs:  # each person's randomisation is drawn here (ledger charged before)
        _ = batches | f"LocalDP[{ljob.name}]" >> PerturbLocalDP(
            ljob.spec,
            str(out.work / f"ldp-{ljob.name}.pickle"),
            # the reports are what a collector receives, not a public artefact: their number
            # is the exact number of persons (membership for a know-everyone-else attacker)
            str(out.internal / LOCAL_REPORTS / ljob.name),
            plan.config.output.format,
            None if seed is None else seed + 31 * (ljob.index + 1),
            spill=str(out.work / f"ldp-{ljob.name}"),
            after=searched,
        )
    _ = (
        read["rejected"]
        | "RejectedColumns" >> beam.Map(lambda df: df[list(REJECTED_COLUMNS)])
        | "WriteRejected" >> WriteTable(str(out.internal), "rejected", REJECTED_COLUMNS)
    )
    return planned_ahead


def exact_columns(plan: Plan) -> list[str]:
    """Columns whose distinct count the profile keeps exactly: the QIs, the sensitive
    attribute, the privacy unit and every DP release's key columns. The others, a DP
    release's value column among them (often a distinct number per row, and nothing
    reads its distinct count), are estimated."""
    s = plan.config.schema_
    cols = [*s.quasi_identifiers, s.sensitive, s.privacy_unit]
    for r in plan.config.releases:
        key_columns = getattr(r, "key_columns", None)  # DP releases
        cols += list(key_columns()) if key_columns is not None else []
    return list(dict.fromkeys(c for c in cols if c))


def control_split(
    p: beam.Pipeline,
    read: dict[str, Any],
    plan: Plan,
    out: RunOutput,
    holdout_key: str | None,
) -> tuple[Any, Any]:
    """(members, controls) of the read: the holdout split, or the input and the rows of
    ``attacks.control.file`` (read and validated like the input), or the input and None."""
    share = holdout_share(plan)
    if share is not None:
        if holdout_key is None:
            raise ValueError("attacks.control.holdout needs the run's holdout key")
        unit = plan.config.schema_.privacy_unit
        split = read["batches"] | "HoldOut" >> HoldOut(share, holdout_key, unit)
        return split[MEMBERS], split[CONTROLS]
    cspec = control_spec(plan)
    if cspec is None:
        return read["batches"], None
    cread = p | "ReadControl" >> ReadMicrodata(cspec)
    _ = (
        cread["rejected"]
        | "ControlRejectedColumns" >> beam.Map(lambda df: df[list(REJECTED_COLUMNS)])
        | "WriteControlRejected" >> WriteTable(str(out.work), CONTROL_REJECTED, REJECTED_COLUMNS)
    )
    return read["batches"], cread["batches"]


def run(
    plan: Plan,
    beam_args: Sequence[str] = (),
    runner: str | None = None,
    log: Callable[[str], None] = print,
    insecure_seed: int | None = None,
) -> RunResult:
    """Run a plan end to end; on any failure nothing is published (DESIGN.md, fail closed).

    ``insecure_seed`` makes noise and bounding reproducible and NOT private (tests; the
    CLI's --insecure-seed); the manifest and every DP release.json record it.
    """
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    spec = plan.input_spec()
    # every check that needs no data, before any ledger (pipelines/preflight.py); published
    # DP releases (sweep points included) spend from the dataset's ledger; DP candidates
    # from the audit ledger, or nothing (they never leave the operator); a stream advances
    # durably: always the dataset's ledger
    planned = run_jobs(plan)
    jobs, sweep_jobs = planned.dp, planned.dp_candidates
    ljobs, lcands, cjobs = planned.local, planned.local_candidates, planned.continual
    run_id = new_run_id()
    ledger: Ledger | None = None
    sweep_ledger: Ledger | None = None
    new_streams: list[ContinualJob] = []
    if sweep_jobs or lcands:
        b = plan.config.budget
        if b is not None and b.audit_ledger:
            sweep_ledger = open_ledger(plan, sweep=True)
        else:
            sweep_ledger = uncharged_ledger(plan, [*sweep_jobs, *lcands])
        cands: list[DPJob | LocalJob] = [*sweep_jobs, *lcands]
        try:
            sweep_ledger.check_affordable(run_id, [(j.name, j.budget()) for j in cands])
        except BaseException:
            sweep_ledger.close()
            raise
    if jobs or ljobs or cjobs:  # refuse an unaffordable run before any data is read
        ledger = open_ledger(plan)
        try:
            new_streams = precheck(cjobs, ledger, insecure_seed)
            ledger.check_affordable(  # event-level streams are not person-level spend
                run_id,
                [(j.name, j.budget()) for j in jobs]
                + [(j.name, j.budget()) for j in ljobs]
                + [(j.name, j.budget()) for j in new_streams if j.unit == "person"],
            )
        except BaseException:
            ledger.close()
            if sweep_ledger is not None:
                sweep_ledger.close()
            raise
    try:
        with timing.active(timing.StageClock()):  # manifest["timings"]
            return _run(
                plan, beam_args, runner, log, insecure_seed, spec, jobs, run_id, ledger, started,
                t0, ljobs, cjobs, new_streams, sweep_jobs, sweep_ledger, lcands,
            )  # fmt: skip
    except BaseException as exc:
        for book in (ledger, sweep_ledger):
            if book is not None:
                mark_failed(book, run_id, exc)
        raise
    finally:
        for book in (ledger, sweep_ledger):
            if book is not None:
                book.close()


def mark_failed(ledger: Ledger, run_id: str, exc: BaseException) -> None:
    """Keep a failed run's charges, marked failed with the reason (no-op without charges)."""
    mine = [
        e
        for e in ledger.history()
        if e.run_id == run_id and e.status != "failed" and e.unit == "person"
    ]
    if mine:
        ledger.mark_failed(run_id, f"{type(exc).__name__}: {exc}"[:500])


def _run(
    plan: Plan,
    beam_args: Sequence[str],
    runner: str | None,
    log: Callable[[str], None],
    insecure_seed: int | None,
    spec: InputSpec,
    jobs: Sequence[DPJob],
    run_id: str,
    ledger: Ledger | None,
    started: datetime,
    t0: float,
    ljobs: Sequence[LocalJob] = (),
    cjobs: Sequence[ContinualJob] = (),
    new_streams: Sequence[ContinualJob] = (),
    sweep_jobs: Sequence[DPJob] = (),
    sweep_ledger: Ledger | None = None,
    lcands: Sequence[LocalJob] = (),
) -> RunResult:
    clock = timing.current() or timing.StageClock()
    stamps = input_stamps(plan.input_paths)  # a file changing between reads (faults)
    columns = inspect_input(spec)
    published = set(plan.config.published())
    lpub = list(ljobs)  # charged to the dataset's ledger; candidates to the audit one
    ljobs = sorted([*ljobs, *lcands], key=lambda j: j.index)
    options = pipeline_options(beam_args, runner)
    runner_name = str(options.view_as(StandardOptions).runner)
    work_dir = plan.config.output.work_dir
    out = RunOutput(
        plan.output_dir,
        run_id,
        work_dir=plan.resolve(work_dir) if work_dir else None,
        world_readable=plan.config.output.world_readable,
    )
    for note in out.notes:  # what recovery after a killed run did (faults)
        log(note)
    side: PublicationAttacks | None = None  # the publication attacks' worker process
    try:
        holdout_key = None
        if holdout_share(plan) is not None:  # fresh per run, never a seed; 0600 in internal/
            holdout_key = new_holdout_key()
            write_key(out.internal, holdout_key)
        try:
            with new_pipeline(options) as p:
                # the whole graph first: every check made while building it (specs, hierarchies,
                # levels) runs before the local DP charge below
                with stage("graph"), handing_over(plans_ahead(options)):
                    ahead = build_graph(
                        p, spec, columns, plan, out, [*jobs, *sweep_jobs], insecure_seed, ljobs,
                        cjobs, holdout_key, input_size(stamps, plan.input_paths),
                        plans_ahead(options),
                    )  # fmt: skip
                prestart_ahead(ahead)  # those searches' workers: their imports overlap the read
                if lpub and ledger is not None:  # local noise is drawn while reading: charge now
                    charge_local(ledger, run_id, lpub, log)
                if lcands and sweep_ledger is not None:
                    charge_local(sweep_ledger, run_id, lcands, log)
                files = len(plan.input_paths)
                log(f"privpipe: run {run_id}: reading {files} file(s) on {runner_name}")
                with stage("pipeline"):
                    try:
                        result = p.run()
                        result.wait_until_finish()
                    finally:  # a failed step leaves searches planned ahead running
                        abandon_ahead()
                        discard_prestarted()  # and workers started for them, unused
                        drop_handed_over()  # and accumulators between two stages
                clock.pipeline_ms = stage_counters(result)  # the pipeline's stages (Beam counters)
        except PrivpipeError as e:
            raise strip_step(e) from None
        except Exception as e:  # a DoFn's PrivpipeError arrives wrapped by the runner
            raise unwrap_pipeline_error(e) from e
        profile, value_counts = split_internal(load_json(str(out.work / "profile.json")))
        rejected = pd.read_csv(out.internal / "rejected.csv", dtype={"file": str, "reason": str})
        control = load_controls(plan, out.work)
        held_out = control_records(control) if control is not None and holdout_share(plan) else 0
        exact = not (jobs or sweep_jobs or ljobs or cjobs)  # else: no figures in refusals
        check_rejected(plan, profile["rows"] + held_out, rejected, exact)
        check_max_units(plan, profile)
        try:
            resolver = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)
            hierarchies = resolver(value_counts)
        except InputDataError as e:
            raise e if exact else withheld(e) from None
        side = audit_worker(plan, int(profile["rows"]))  # its imports overlap what follows
        dp_bounding: dict[str, Any] = {}
        if jobs and ledger is not None:
            with stage("dp_noise"):
                dp_bounding = publish(
                    jobs, ledger, run_id, int(profile["rows"]), out.work, out.staging,
                    plan.config.output.format, insecure_seed, log,
                    coarsen_for(plan, HierarchyLabeler(plan.config.hierarchies, plan.hierarchies)),
                    units=unit_count(plan, profile),
                )  # fmt: skip
        if sweep_jobs and sweep_ledger is not None:
            with stage("dp_noise"):
                dp_bounding |= publish(
                    sweep_jobs, sweep_ledger, run_id, int(profile["rows"]), out.work,
                    out.staging, plan.config.output.format, insecure_seed, log,
                    coarsen_for(plan, HierarchyLabeler(plan.config.hierarchies, plan.hierarchies)),
                    units=unit_count(plan, profile),
                )  # fmt: skip
        local_summary: dict[str, Any] = {}
        if ljobs:
            with stage("local_publish"):
                local_summary = publish_local(
                    ljobs, plan, out.work, out.staging, insecure_seed, log
                )
        raw = targets = attack_results = attack_rates = None
        loaded = {}
        if (out.work / f"{RAW_TABLE}_counts.parquet").exists():  # frequency table, targets
            raw, targets = load_truth(plan, out.work)
        if plan.config.attacks is not None:  # read once for the check and the attacks
            with stage("attacks"):
                loaded = load_releases(plan, out.staging, ATTACKED_KINDS, work=out.work)
        names = [r.name for r in plan.config.releases]
        chosen = [n for n in names if n in published]
        publication: dict[str, Any] = {
            "published": chosen,
            "candidates": [n for n in names if n not in chosen],
        }
        if len(chosen) > 1:  # the combination, before a stream advances or anything commits
            with stage("publication_attacks"):
                publication |= check_combination(
                    plan, out.releases, loaded, chosen, raw, hierarchies,
                    dp_count_keys([*jobs, *cjobs]), log, out.work,
                )  # fmt: skip
        continual_summary: dict[str, Any] = {}
        if cjobs and ledger is not None:  # the stream advances durably: only the audit follows
            with stage("continual_publish"):
                continual_summary = publish_continual(
                    cjobs, new_streams, ledger, run_id, plan, out.work, out.staging,
                    insecure_seed, log,
                )  # fmt: skip
        if side is not None:  # every release is staged: its attacks run beside what follows
            side.send(plan, out.staging, out.work, hierarchies, publication)
        if plan.config.attacks is not None:
            log("privpipe: attacking every release (and the raw table as the baseline)")
            with stage("attacks"):
                attack_results = run_attacks(
                    plan, loaded, raw, hierarchies, control=control, targets=targets
                )
            attack_rates = headline(attack_results)
        summaries = release_summaries(plan, out, insecure_seed)
        finished = datetime.now(UTC)
        manifest = {
            "run_id": run_id,
            "privpipe_version": privpipe.__version__,
            "name": plan.name,
            "config": str(plan.config_path),
            "config_sha256": plan.config_sha256,
            "input": list(plan.input_paths),
            "input_duplicates_skipped": list(plan.input_duplicates),
            "input_format": plan.input_format,
            "rows_read": int(profile["rows"]) + held_out + len(rejected),
            "rows_accepted": int(profile["rows"]) + held_out,
            "rows_held_out": held_out,  # input-derived: internal only (attacks.control)
            "control": control_summary(plan, control) if control_config(plan) else None,
            "rows_rejected": len(rejected),
            "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t0, 3),
            "runner": runner_name,
            "releases": names,
            "published": chosen,
            "candidates": publication["candidates"],
            "publication": publication,
            "release_summaries": summaries,
            "attacks": attack_rates,
            "hierarchies": {
                c: {"levels": h.levels, "domain_size": h.domain_size, "source": h.source}
                for c, h in hierarchies.items()
            },
            "profile": profile,
            "insecure_seed": insecure_seed,
            "only": list(plan.only) if plan.only is not None else None,  # run --only
            "dp_contribution_bounding": dp_bounding or None,
            "local_dp": local_summary or None,
            "continual": continual_summary or None,
            "budget": budget_summary(ledger, run_id),
            "candidate_budget": candidate_budget(plan, sweep_ledger, run_id),
            "status": "succeeded",
        }
        if wants_audit(plan):
            assert raw is not None
            common = None
            if plan.config.attacks is not None:  # every release staged (continual too)
                with stage("common"):
                    every = common_releases(plan, out.staging, loaded, out.work)
                    common = run_common(
                        plan, every, raw, hierarchies, control=control, targets=targets
                    )
                loaded = {**loaded, **every}  # write_audit reads none of them again
            with stage("audit"):  # utility, publication_attacks and report timed inside
                write_audit(
                    plan, out.staging, raw, hierarchies, attack_results, manifest, loaded,
                    into=out.internal, common=common, work=out.work, control=control,
                    targets=targets, publication=side,
                )  # fmt: skip
            manifest["report"] = f"{INTERNAL}/report.html"
        details: dict[str, Any] = {}
        for name in chosen:  # public release.json: nothing exact about the data
            path = out.releases / name / "release.json"
            public_doc, details[name] = split_document(load_json(path))
            linked = publication.get("linked_with", {}).get(name)
            if linked:  # accepted linked releases say so where they are handed out
                public_doc["linked_with"] = linked
            write_json(str(path), public_doc)
        manifest["release_details"] = details
        with stage("commit"):
            out.arrange(chosen)
        manifest["timings"] = clock.timings()  # internal only (contract.md)
        # the whole run, audit and report included (``finished`` stays the time the report
        # shows: a rebuilt report must be the same)
        manifest["seconds"] = round(time.perf_counter() - t0, 3)
        write_json(str(out.internal / "manifest.json"), manifest)
        check_unchanged(stamps)  # what is published was read from one version of the input
        out.commit()
    except BaseException as exc:
        out.abort()
        if isinstance(exc, Exception):  # the real cause when an input changed mid-run
            check_unchanged(stamps)
        if isinstance(exc, InputDataError) and NO_ROWS in str(exc):  # count, first reasons
            raise all_rejected(spec, not (jobs or sweep_jobs or ljobs or cjobs)) from None
        raise
    finally:  # the audit's frequency tables hold the run's tables: not past the run
        forget_summaries()
        discard_prestarted()  # search workers started before a failure ahead of the pipeline
        if side is not None:  # done, or not needed after an error
            side.kill()
    return RunResult(run_id=run_id, output_dir=plan.output_dir, manifest=manifest)


def _is_charge(entry: Any) -> bool:
    return getattr(entry, "kind", "charge") == "charge"


def budget_summary(ledger: Ledger | None, run_id: str) -> dict[str, Any] | None:
    """The ledger's state after this run's charges (None without DP releases)."""
    if ledger is None:
        return None
    spent, left = ledger.spent(), ledger.remaining()
    # charges only (the ledger also records the periods continual streams published)
    mine = [e for e in ledger.history() if e.run_id == run_id and _is_charge(e)]
    return {
        "ledger": str(ledger.path),
        "charged_this_run": {
            e.release: {"epsilon": float(e.epsilon), "delta": float(e.delta)}
            | ({"unit": "event"} if e.unit == "event" else {})  # not in the lifetime
            for e in mine
        },
        "spent": {"epsilon": float(spent.epsilon), "delta": float(spent.delta)},
        "remaining": {"epsilon": float(left.epsilon), "delta": float(left.delta)},
        "lifetime": {
            "epsilon": float(ledger.lifetime.epsilon),
            "delta": float(ledger.lifetime.delta),
        },
        "ledger_head": ledger.head(),  # a later copy with fewer entries is a rollback
    }


def candidate_budget(plan: Plan, book: Ledger | None, run_id: str) -> dict[str, Any] | None:
    """What the DP candidates (computed, not published) cost: the audit ledger's state,
    or a note that they were not charged (they never leave the operator)."""
    if book is None:
        return None
    b = plan.config.budget
    if b is not None and b.audit_ledger:
        return budget_summary(book, run_id)
    mine = [e.release for e in book.history() if e.run_id == run_id]
    return {
        "ledger": None,
        "not_charged": mine,
        "note": "DP candidates are not charged to any ledger: they are never published "
        "and never leave the operator (set budget.audit_ledger to account for them)",
    }


def release_summaries(
    plan: Plan, out: RunOutput, insecure_seed: int | None = None
) -> dict[str, Any]:
    """Kind, guarantee and verification of each release, read back from release.json.

    An unverified release stops the run, except the releases of an accepted insecure-seed
    run, which say so themselves (guarantee "none (insecure seed)", the seed recorded)."""
    summaries: dict[str, Any] = {}
    for r in plan.config.releases:
        doc = load_json(out.releases / r.name / "release.json")
        seeded = (
            insecure_seed is not None
            and doc.get("insecure_seed") == insecure_seed
            and doc.get("guarantee") == INSECURE_GUARANTEE
        )
        if doc.get("verified") is not True and not seeded:
            raise PrivacyRefusal(f"release {r.name!r} was not verified; nothing was published")
        summaries[r.name] = {k: doc.get(k) for k in ("kind", "guarantee", "verified")}
    return summaries


def withheld(exc: InputDataError) -> InputDataError:
    """A data refusal of a run with DP releases, without its figures or values (they depend
    on the data and no epsilon covers them): the column it is about and the fix only."""
    col = re.search(r"column '([^']*)'", str(exc))
    name = col.group(1) if col else None
    where = f"column {name!r}" if name else "the input"
    return InputDataError(
        f"{where}: some values do not fit hierarchies.{name or '<column>'} (values and counts "
        "withheld: this config has DP releases); fix the data or the hierarchy (or its "
        "map:), or run a config without DP releases on this input to list them"
    )


def unit_count(plan: Plan, profile: dict[str, Any]) -> int:
    """The number of privacy units read (persons with schema.privacy_unit, else rows)."""
    unit = plan.config.schema_.privacy_unit
    if unit is not None:
        return int(profile["columns"].get(unit, {}).get("distinct", 0))
    return int(profile["rows"])


def check_max_units(plan: Plan, profile: dict[str, Any]) -> None:
    """Refuse data with more privacy units than schema.max_units declares (exit 3).

    δ was checked against the declared bound; the message holds no figure about the data."""
    s = plan.config.schema_
    if s.max_units is None:
        return
    units = unit_count(plan, profile)
    if units > s.max_units:
        what = "persons" if s.privacy_unit else "rows"
        raise InputDataError(
            f"{', '.join(Path(q).name for q in plan.input_paths[:3])}: more {what} than "
            "schema.max_units declares; raise schema.max_units (and keep every delta below "
            "1/max_units)"
        )


def check_rejected(plan: Plan, accepted: int, rejected: pd.DataFrame, exact: bool = True) -> None:
    """Fail the run (exit 3) when more rows were rejected than input.max_rejected_fraction
    (with ``exact`` false, a run with DP releases, the message holds no figures)."""
    total = accepted + len(rejected)
    if total == 0:
        raise InputDataError(
            f"{', '.join(Path(q).name for q in plan.input_paths)}: no data rows; "
            "the input has a header but nothing below it"
        )
    limit = plan.config.input.max_rejected_fraction
    share = len(rejected) / total
    if len(rejected) and share > limit and not exact:
        named = sorted(
            set(rejected["reason"].astype(str).str.extract(r"^column '([^']*)'")[0].dropna())
        )
        about = f" (columns: {', '.join(named)})" if named else ""
        raise InputDataError(
            f"{', '.join(Path(q).name for q in plan.input_paths[:3])}: more rows were rejected "
            f"than input.max_rejected_fraction ({limit:g}) allows{about}; counts, lines and "
            "values withheld: this config has DP releases. Fix the input or raise the "
            "fraction, or run a config without DP releases on this input to list the problems"
        )
    if len(rejected) and share > limit:
        first = rejected.sort_values(["file", "line"]).head(5)
        examples = "; ".join(
            f"{Path(f).name} line {ln}: {r}"
            for f, ln, r in zip(first["file"], first["line"], first["reason"], strict=True)
        )
        raise InputDataError(
            f"{len(rejected):,} of {total:,} rows rejected ({share:.2%}) but "
            f"input.max_rejected_fraction is {limit:g}. First problems: {examples}. "
            "Fix those rows, or raise input.max_rejected_fraction to accept dropping them"
        )


_STEP_SUFFIX = re.compile(r"\s*\[while running '[^']*'\]\s*$")
_WRAPPED = re.compile(
    r"(ConfigError|InputDataError|PrivacyRefusal|OutputError|PrivpipeError): (.+?)(?:\n|$)"
)


def unwrap_pipeline_error(exc: BaseException) -> BaseException:
    """Recover a privpipe error (and so its exit code) from a runner's wrapped exception."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, PrivpipeError):
            return strip_step(cur)
        if not isinstance(cur, Exception):  # Ctrl-C (130) or SIGTERM (143) inside a step
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    match = _WRAPPED.search(str(exc))
    if match:
        cls = getattr(errors, match.group(1))
        return cls(_STEP_SUFFIX.sub("", match.group(2).strip()))  # type: ignore[no-any-return]
    return exc


def strip_step(exc: PrivpipeError) -> PrivpipeError:
    """Drop the runner's "[while running 'step']" suffix from a privpipe error message."""
    text = _STEP_SUFFIX.sub("", str(exc))
    return type(exc)(text) if text != str(exc) else exc
