"""Planning the longest searches ahead (``planning.plan_with_ahead`` / ``collect_ahead``,
``AwaitPlan``): on a runner that runs one stage at a time, the other releases' steps run
while the longest search is still going in its worker process.

The plans are those planned in sequence; a ticket collected where its workers are
unknown is planned there; errors keep the config order; no worker outlives a run, also
a failed one; in a run, the plan is collected only after the other releases of its
summary are written, and the run publishes what the sequential run publishes.
"""

from __future__ import annotations

import json
import pickle
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from privpipe import workers as workers_module
from privpipe.errors import ConfigError, PrivacyRefusal
from privpipe.pipelines import publish_ahead
from privpipe.pipelines.cli import main
from privpipe.pipelines.runner import plans_ahead
from privpipe.transforms import anonymize, planning
from privpipe.transforms.context import ReleaseContext
from privpipe.transforms.planning import (
    abandon_ahead,
    ahead_releases,
    collect_ahead,
    plan_releases,
    plan_with_ahead,
    start_ahead,
)
from tests.conftest import ADULT_QIS, ADULT_SA, ARX, Project
from tests.layout import internal_file
from tests.test_planning import (
    QIS,
    SPECS,
    Loaded,
    adult_freq,
    figures,
    slow_search,
    spec,
    workers,
)
from tests.test_search_workers import RELEASES, published

pytestmark = pytest.mark.skipif(not (ARX / "adult.csv").exists(), reason="needs ../shared/data/arx")


@pytest.fixture(scope="module")
def freq() -> pd.DataFrame:
    return adult_freq()


def full(ctx: Any) -> ReleaseContext:
    figures_only: ReleaseContext = ctx.without_tuples()
    return figures_only


def test_the_longest_searches_are_planned_ahead() -> None:
    t = spec("t", kind="t_closeness", t=0.3, distance="hierarchical")
    assert ahead_releases([*SPECS, t], cores=2) == ["t"]
    assert ahead_releases([*SPECS, t], cores=3) == ["t", "l3"]
    assert ahead_releases(SPECS, cores=8) == ["l3", "mondrian5"]  # one stays in the step
    assert ahead_releases(SPECS, cores=1) == []
    assert ahead_releases(SPECS[:1], cores=4) == []


def test_only_a_runner_of_one_stage_at_a_time_in_this_process_plans_ahead() -> None:
    assert plans_ahead(PipelineOptions([]))
    assert plans_ahead(PipelineOptions(["--runner", "DirectRunner"]))
    assert plans_ahead(PipelineOptions(["--direct_running_mode", "multi_threading"]))
    assert not plans_ahead(PipelineOptions(["--direct_running_mode", "multi_processing"]))
    assert not plans_ahead(PipelineOptions(["--runner", "dask"]))
    assert not plans_ahead(PipelineOptions(["--runner", "DataflowRunner"]))


@pytest.mark.slow  # worker processes start (a few seconds)
def test_plans_made_ahead_equal_plans_in_sequence(freq: pd.DataFrame) -> None:
    want = plan_releases(freq, SPECS, Loaded(), cores=1)
    here, tickets = plan_with_ahead(freq, SPECS, Loaded(), ["l3"])
    assert set(here) == {"k5", "mondrian5"} and [t.spec.name for t in tickets] == ["l3"]
    assert len(planning._AHEAD) == 1
    got = {**here, "l3": collect_ahead(tickets[0])}
    assert planning._AHEAD == {}  # the last ticket collected: the pool is closed
    for name, p in got.items():
        assert figures(full(p.context)) == figures(want[name].context.without_tuples())
    assert workers() == []


@pytest.mark.slow
def test_a_ticket_collected_in_another_process_is_planned_there(freq: pd.DataFrame) -> None:
    """The ticket travels (pickled) to a process that does not know its workers: it carries
    the summary and the hierarchies, so the plan is made there, the same plan."""
    want = plan_releases(freq, SPECS[1:2], Loaded(), cores=1)["l3"]
    (ticket,) = start_ahead(freq, SPECS[1:2], planning.Resolved(Loaded()({})))
    elsewhere = pickle.loads(pickle.dumps(ticket))
    abandon_ahead()  # as if in another process: no workers known here
    assert workers() == [] and planning._AHEAD == {}
    got = collect_ahead(elsewhere)
    assert figures(full(got.context)) == figures(want.context.without_tuples())


@pytest.mark.slow
def test_an_earlier_release_planned_ahead_raises_first(freq: pd.DataFrame) -> None:
    """Two refusals, the first in config order planned ahead: its error is raised, as in
    sequence, though the step's own release failed first in time."""
    refused = [spec("l30", kind="l_diversity", l=30), spec("k_huge", k=10**6)]
    with pytest.raises(PrivacyRefusal) as sequence:
        plan_releases(freq, refused, Loaded(), cores=1)
    with pytest.raises(PrivacyRefusal) as ahead:
        plan_with_ahead(freq, refused, Loaded(), ["l30"])
    assert str(ahead.value) == str(sequence.value)
    assert str(ahead.value).startswith("release 'l30': l=30")
    assert planning._AHEAD == {} and workers() == []
    # the step's release listed first: its error, and the worker is stopped, not awaited
    with pytest.raises(PrivacyRefusal, match=r"^release 'k_huge'"):
        plan_with_ahead(freq, refused[::-1], Loaded(), ["l30"])
    assert planning._AHEAD == {} and workers() == []


@pytest.mark.slow
def test_abandoning_stops_a_running_search_at_once() -> None:
    """A failed pipeline abandons the searches still planned ahead: the worker's search
    (t=0.1 on all 8 QIs, ~10 s) is killed, not awaited."""
    wide, slow = slow_search()
    (ticket,) = start_ahead(wide, [slow], planning.Resolved(Loaded(ADULT_QIS)({})))
    ahead = planning._AHEAD[ticket.token]
    deadline = time.monotonic() + 20
    while ahead.workers.shared is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    # the worker has read its input: this process no longer holds the summary for it
    assert ahead.workers.shared is None
    assert len(workers()) == 1 and not ahead.futures[str(slow.name)].done()
    assert planning.searching_ahead() == 1  # its core: the writers leave it alone
    t0 = time.perf_counter()
    abandon_ahead()
    assert time.perf_counter() - t0 < 5
    assert workers() == [] and planning._AHEAD == {}
    assert planning.searching_ahead() == 0


def run(project: Project, out: Path, cores: int, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(planning, "available_cores", lambda: cores)
    return main(["run", str(project.config), "--output", str(out)])


@pytest.mark.slow
def test_a_run_collects_the_plan_after_the_other_releases_are_written(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release planned ahead (l2, the longer search) is collected only once k2's
    release.json is written; its worker, which searched it, publishes it too (the rows
    come from the table it searched), and the run publishes what the sequential run
    does, with l2's stage timings from that worker."""
    project.cfg["releases"] = RELEASES
    project.save()
    assert run(project, tmp_path / "one", 1, monkeypatch) == 0
    written_before: list[list[str]] = []
    collected: list[planning.Planned] = []
    collect = planning.collect_ahead

    def watched(ticket: planning.Ticket) -> planning.Planned:
        out = tmp_path / "two"
        written_before.append(sorted(p.parent.name for p in out.rglob("release.json")))
        collected.append(collect(ticket))
        return collected[-1]

    monkeypatch.setattr(anonymize, "collect_ahead", watched)
    assert run(project, tmp_path / "two", 2, monkeypatch) == 0
    assert len(written_before) == 1 and "k2" in written_before[0]  # l2's, after k2's
    (l2,) = collected  # published where it was searched: its stages came back with it
    assert isinstance(l2, planning.Published)
    assert {"recode:l2", "verify:l2", "write:l2"} <= set(l2.stages)
    for r in RELEASES:
        one, two = published(tmp_path / "one", r["name"]), published(tmp_path / "two", r["name"])
        assert two == one and two[1]["verified"] is True
    manifest = json.loads(internal_file(tmp_path / "two", "manifest.json").read_text())
    stages = set(manifest["timings"]["stages"])
    assert {"search", "search:k2", "search:l2", "verify:l2", "write:l2"} <= stages
    assert workers() == [] and planning._AHEAD == {}


@pytest.mark.slow
def test_a_run_plans_ahead_in_the_worker_it_started_after_building_its_graph(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """l2's worker is started once the graph is built (its imports overlap the read; the
    graph's building starts none) and is the one that plans l2; a run that fails after
    starting it leaves none running."""
    from privpipe.pipelines import run as run_module

    project.cfg["releases"] = RELEASES
    project.save()
    started: list[workers_module.Worker] = []
    taken: list[workers_module.Worker] = []
    built: list[tuple[int, int]] = []  # (releases planned ahead, workers alive) per graph
    prestart, take, build = workers_module.prestart, planning.take, run_module.build_graph

    def recorded_build(*args: Any, **kwargs: Any) -> int:
        ahead: int = build(*args, **kwargs)
        built.append((ahead, len(workers())))
        return ahead

    def recorded_prestart(warm: Any, count: int = 1) -> None:
        prestart(warm, count)
        started.extend(workers_module._prestarted)

    def recorded_take(*args: Any) -> workers_module.Worker:
        taken.append(take(*args))
        return taken[-1]

    monkeypatch.setattr(planning, "prestart", recorded_prestart)
    monkeypatch.setattr(planning, "take", recorded_take)
    monkeypatch.setattr(run_module, "build_graph", recorded_build)
    assert run(project, tmp_path / "out", 2, monkeypatch) == 0
    assert built == [(1, 0)]  # l2 planned ahead; no worker started by building the graph
    assert len(started) == 1 and taken == started  # l2's, started ahead, then taken
    assert started[0].warm == planning.PLANNING_WARM
    assert workers() == [] and workers_module._prestarted == []

    def failing(count: int) -> None:
        planning.prestart_ahead(count)
        raise ConfigError("the run failed after its search workers started (test)")

    monkeypatch.setattr(run_module, "prestart_ahead", failing)
    assert run(project, tmp_path / "failed", 2, monkeypatch) == 2
    assert len(started) == 2 and len(taken) == 1  # started, never taken
    assert workers() == [] and workers_module._prestarted == []


@pytest.mark.slow
def test_a_run_that_fails_while_a_search_runs_ahead_leaves_no_worker(
    project: Project,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """k2's verification fails (a refusal) while l2 is planned ahead: exit 4 with k2's
    message, nothing published, and the worker planning l2 is gone."""
    project.cfg["releases"] = RELEASES
    project.save()
    abandoned: list[int] = []

    def failing(*args: Any) -> Any:
        raise PrivacyRefusal("release 'k2': the independent check failed (test)")

    def counted() -> None:
        abandoned.append(len(planning._AHEAD))
        abandon()

    abandon = planning.abandon_ahead
    monkeypatch.setattr(anonymize, "verify_and_document", failing)
    from privpipe.pipelines import run as run_module

    monkeypatch.setattr(run_module, "abandon_ahead", counted)
    code = run(project, tmp_path / "out", 2, monkeypatch)
    err = capsys.readouterr().err
    assert code == 4, err
    assert "release 'k2': the independent check failed (test)" in err
    assert abandoned == [1]  # l2's worker pool was still registered when the step failed
    assert planning._AHEAD == {} and workers() == []
    assert not internal_file(tmp_path / "out", "manifest.json").exists()


def job_for(out: Path, name: str) -> publish_ahead.PublishAhead:
    """Publication of release ``name`` of Adult's table into ``out / name`` (CSV)."""
    return publish_ahead.PublishAhead(
        (*QIS, ADULT_SA), {}, 5_000, str(out / name), "csv", str(out / "work")
    )


def table(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out / name / "data.csv", dtype=str, keep_default_na=False)


def test_a_release_published_from_its_table_is_the_plans_verified_release(
    freq: pd.DataFrame, tmp_path: Path
) -> None:
    """``PublishAhead``, called where the plan is made, publishes the plan's release from
    the summary's rows: verified, every input row written once (the suppressed ones starred)
    and recoded to the plan's labels, and the audit's counts of it; its stages timed."""
    k5 = SPECS[0]
    got = job_for(tmp_path, "k5")(freq, k5, Loaded())
    assert isinstance(got, planning.Published)
    want = plan_releases(freq, [k5], Loaded(), cores=1)["k5"].context
    assert figures(full(got.context)) == figures(want.without_tuples())
    doc = json.loads((tmp_path / "k5" / "release.json").read_text())
    assert doc["verified"] is True and doc["name"] == "k5"
    rows = table(tmp_path, "k5")
    assert len(rows) == int(freq["count"].sum())  # suppressed rows are starred, not dropped
    starred = (rows[list(QIS)] == "*").all(axis=1)
    assert int(starred.sum()) == want.plan.suppressed_records > 0
    labels = set(map(tuple, want.plan.recoding.labels.tolist()))
    assert set(map(tuple, rows.loc[~starred, list(QIS)].to_numpy().tolist())) <= labels
    # the attacker reading the rows in order: shuffled, as the driver's tables are, not in
    # the order of the table they were expanded from (equal rows next to each other)
    keys = list(map(tuple, rows.to_numpy().tolist()))
    together = sum(a == b for a, b in pairwise(keys))
    sizes = rows.value_counts().to_numpy()
    shuffled = float((sizes * (sizes - 1)).sum()) / len(keys)  # expected under a shuffle
    assert together < 1.5 * shuffled < len(keys) - len(sizes)  # ~92 ± 10 against 16,488
    assert list((tmp_path / "work").iterdir())  # the published counts for the audit
    assert {"expand", "recode:k5", "verify:k5", "write:k5"} <= set(got.stages)
    assert all(ms >= 0 for ms in got.stages.values())


def test_a_refusal_while_publishing_from_the_table_is_raised_as_itself(
    freq: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal in the worker's pipeline comes out with its own type (so its exit code,
    4), also once pickled back from the worker; no release.json is written."""

    def failing(*args: Any) -> Any:
        raise PrivacyRefusal("release 'k5': the independent check failed (test)")

    monkeypatch.setattr(anonymize, "verify_and_document", failing)
    with pytest.raises(PrivacyRefusal, match="the independent check failed") as caught:
        job_for(tmp_path, "k5")(freq, SPECS[0], Loaded())
    assert type(pickle.loads(pickle.dumps(caught.value))) is PrivacyRefusal
    assert not (tmp_path / "k5" / "release.json").exists()
    assert publish_ahead._HELD == {}  # the table and plan it held for its pipeline: let go


@pytest.mark.slow
def test_a_ticket_to_publish_collected_in_another_process_publishes_there(
    freq: pd.DataFrame, tmp_path: Path
) -> None:
    """A ticket whose worker would also publish, collected where its workers are unknown:
    its call runs there, so the release is still published (never only planned)."""
    l3 = SPECS[1]
    calls = {"l3": job_for(tmp_path, "l3")}
    (ticket,) = start_ahead(freq, [l3], planning.Resolved(Loaded()({})), calls)
    elsewhere = pickle.loads(pickle.dumps(ticket))
    abandon_ahead()
    assert workers() == [] and not (tmp_path / "l3").exists()
    got = collect_ahead(elsewhere)
    assert isinstance(got, planning.Published) and "verify:l3" in got.stages
    assert json.loads((tmp_path / "l3" / "release.json").read_text())["verified"] is True
