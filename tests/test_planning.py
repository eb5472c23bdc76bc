"""The releases' searches side by side in worker processes (``transforms.planning``).

On Adult: the plans made in a worker are those made in-process; a refusal surfaces as
the sequential run raises it (type, message, config order); no worker outlives a call,
also when the caller is interrupted.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
import psutil
import pytest

from privpipe.anonymity.hierarchy import Hierarchy, load_arx_csv
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.errors import InputDataError, PrivacyRefusal
from privpipe.transforms import planning
from privpipe.transforms.anonymize import FrequencyTable
from privpipe.transforms.context import ReleaseContext, SharedPlanning, SlimContext, make_context
from privpipe.transforms.planning import Planned, expected_effort, plan_releases
from tests.conftest import ADULT_QIS, ADULT_SA, ARX

pytestmark = pytest.mark.skipif(not (ARX / "adult.csv").exists(), reason="needs ../shared/data/arx")

QIS = ADULT_QIS[:5]


def adult_freq(qis: tuple[str, ...] = QIS) -> pd.DataFrame:
    """Adult's frequency table over ``qis`` and its sensitive attribute."""
    adult = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str)
    fn = FrequencyTable([*qis, ADULT_SA], categorical=True)
    return fn.extract_output(fn.add_input(fn.create_accumulator(), adult))


@pytest.fixture(scope="module")
def freq() -> pd.DataFrame:
    return adult_freq()


class Loaded:
    """A resolver over Adult's ARX hierarchies (a module-level class: picklable)."""

    def __init__(self, qis: tuple[str, ...] = QIS) -> None:
        self.h = {c: load_arx_csv(ARX / f"adult_hierarchy_{c}.csv", c) for c in [*qis, ADULT_SA]}

    def __call__(self, value_counts: Any) -> dict[str, Hierarchy]:
        return dict(self.h)


def slow_search() -> tuple[pd.DataFrame, AnonymizationSpec]:
    """A search that runs for a while: t=0.1 on all 8 of Adult's QIs (~10 s), and its
    frequency table."""
    slow = spec(
        "t", qis=ADULT_QIS, kind="t_closeness", t=0.1, distance="hierarchical",
        suppression_limit=0.05,
    )  # fmt: skip
    return adult_freq(ADULT_QIS), slow


def spec(name: str, **kwargs: Any) -> AnonymizationSpec:
    base: dict[str, Any] = {"kind": "k_anonymity", "qis": QIS, "sensitive": ADULT_SA, "k": 5}
    return AnonymizationSpec(name=name, **{**base, **kwargs})  # type: ignore[arg-type]


SPECS = [
    spec("k5", suppression_limit=0.05),
    spec("l3", kind="l_diversity", l=3, variant="recursive", c=4, suppression_limit=0.05),
    spec("mondrian5", algorithm="mondrian"),
]


def figures(ctx: ReleaseContext) -> dict[str, Any]:
    """Everything a plan decides (not how long it took)."""
    plan = ctx.plan
    search = {k: v for k, v in plan.search.items() if "seconds" not in k}
    return {
        "search": search,
        "metrics": (plan.metrics_input, plan.metrics_output),
        "risk": (plan.risk_input, plan.risk_output),
        "records": (plan.input_records, ctx.input_records, plan.suppressed_records),
        "sa": plan.input_sa_distribution,
        "labels": plan.recoding.labels.tolist(),
        "suppressed": plan.recoding.suppressed.tolist(),
    }


def workers() -> list[psutil.Process]:
    """This process's worker processes still alive (other tests in this process may leave
    children of their own, e.g. Beam's job service of a PortableRunner test)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "privpipe.workers" in " ".join(child.cmdline()):
                alive.append(child)
        except psutil.Error:  # exited meanwhile
            continue
    return alive


def test_longest_search_goes_first() -> None:
    ranks = [expected_effort(s) for s in SPECS]
    t = expected_effort(spec("t", kind="t_closeness", t=0.3, distance="hierarchical"))
    assert t > ranks[1] > ranks[0] and ranks[2] > ranks[0]


@pytest.mark.slow  # worker processes start (a few seconds)
def test_plans_in_workers_equal_plans_in_process(freq: pd.DataFrame) -> None:
    here = plan_releases(freq, SPECS, Loaded(), cores=1)
    assert workers() == []
    pooled = plan_releases(freq, SPECS, Loaded(), cores=3)  # two workers and this thread
    assert list(pooled) == list(here) == [s.name for s in SPECS]
    for name in here:
        assert isinstance(pooled[name], Planned) and pooled[name].seconds > 0
        assert figures(pooled[name].context) == figures(here[name].context)
        assert np.array_equal(
            pooled[name].context.plan.recoding.codes, here[name].context.plan.recoding.codes
        )
    assert workers() == []


@pytest.mark.slow  # worker processes start (a few seconds)
def test_slim_plans_are_the_full_plans_without_their_tuples(freq: pd.DataFrame) -> None:
    """``slim=True`` (the Beam search step): in a worker and in this thread, each plan is
    the recoder and the tuple-free figures of the full plan, and holds no per-tuple arrays."""
    full = plan_releases(freq, SPECS, Loaded(), cores=1)
    for cores in (1, 3):
        slim = plan_releases(freq, SPECS, Loaded(), cores=cores, slim=True)
        assert workers() == []
        for name, planned in slim.items():
            ctx, want = planned.context, full[name].context
            assert isinstance(ctx, SlimContext) and isinstance(want, ReleaseContext)
            assert len(ctx.without_tuples().plan.recoding.codes) == 0
            assert len(want.plan.recoding.codes) > 0
            assert figures(ctx.without_tuples()) == figures(want.without_tuples())
            assert ctx.input_records == want.input_records
            got, expect = ctx.for_recoding().recoder, want.for_recoding().recoder
            assert got.n_tuples == expect.n_tuples
            assert np.array_equal(got.suppressed, expect.suppressed)
            for a, b, la, lb in zip(
                got.label_ids, expect.label_ids, got.label_names, expect.label_names, strict=True
            ):
                assert np.array_equal(la[a], lb[b])  # every tuple's label, whatever the ids


@pytest.mark.slow
def test_worker_refusal_surfaces_as_in_process(freq: pd.DataFrame) -> None:
    """l=30 is refused in the worker (it takes the longest-ranked l-diversity release):
    same type and message as in-process; the earlier release in config order still ran."""
    refused = [SPECS[0], spec("l30", kind="l_diversity", l=30)]
    with pytest.raises(PrivacyRefusal) as here:
        plan_releases(freq, refused, Loaded(), cores=1)
    with pytest.raises(PrivacyRefusal) as pooled:
        plan_releases(freq, refused, Loaded(), cores=2)
    assert str(pooled.value) == str(here.value)
    assert str(pooled.value).startswith("release 'l30': l=30 but occupation has only")
    assert pooled.value.exit_code == 4
    assert workers() == []


@pytest.mark.slow
def test_first_refusal_in_config_order_wins(freq: pd.DataFrame) -> None:
    """Two refusals: the one of the release listed first is raised, as sequentially."""
    refused = [spec("k_huge", k=10**6), spec("l30", kind="l_diversity", l=30)]
    with pytest.raises(PrivacyRefusal, match=r"^release 'k_huge': k=1000000"):
        plan_releases(freq, refused, Loaded(), cores=2)
    assert workers() == []


@pytest.mark.slow
def test_an_interrupt_stops_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while this thread plans: the worker's search (t=0.1 on all 8 QIs, ~10 s) is
    abandoned, not awaited, and its process is gone."""
    wide, slow = slow_search()

    def interrupted(*args: Any) -> Planned:
        time.sleep(1.0)  # the worker has started its search
        raise KeyboardInterrupt

    monkeypatch.setattr(planning, "plan_one", interrupted)  # this process only
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        plan_releases(wide, [slow, spec("k5", qis=ADULT_QIS)], Loaded(ADULT_QIS), cores=2)
    assert time.perf_counter() - t0 < 8
    assert workers() == []


@pytest.mark.slow  # a worker process starts (a few seconds)
def test_nodes_checked_reach_the_progress_from_workers(freq: pd.DataFrame) -> None:
    """The search's nodes checked are counted for the progress lines, also those of a
    release planned in a worker process (relayed through its progress pipe)."""
    from privpipe import progress

    progress.reset()
    pooled = plan_releases(freq, SPECS[:2], Loaded(), cores=2)  # a worker and this thread
    checked = sum(int(p.context.plan.search["nodes_checked"]) for p in pooled.values())
    assert checked > 0
    assert progress.snapshot()["search"] == (checked, "nodes checked")
    assert workers() == []


def test_releases_planned_in_one_thread_share_a_summary_and_plan_the_same(
    freq: pd.DataFrame,
) -> None:
    """``SharedPlanning``: releases of the same columns and hierarchies reuse one summary
    and the input's scores on it, and plan exactly as alone; a release of other columns,
    or with other hierarchy objects, gets its own."""
    resolver = Loaded()
    fewer = spec("k5_fewer", qis=QIS[:4], suppression_limit=0.05)
    shared = SharedPlanning()
    for s in [*SPECS, fewer]:
        alone = make_context(freq, s, resolver)
        assert figures(make_context(freq, s, resolver, shared)) == figures(alone)
    assert len(shared.baselines) == 2  # SPECS' summary and fewer's
    qi_h = {q: resolver.h[q] for q in QIS}
    first = shared.summary(freq, SPECS[0], qi_h, None)
    assert shared.summary(freq, SPECS[1], qi_h, None) is first and first in shared.baselines
    assert shared.summary(freq, fewer, {q: resolver.h[q] for q in QIS[:4]}, None) is not first
    other = Loaded()  # equal hierarchies, other objects: not assumed the same
    assert shared.summary(freq, SPECS[0], {q: other.h[q] for q in QIS}, None) is not first


def test_shared_planning_refuses_as_planning_alone(freq: pd.DataFrame) -> None:
    """The input's scores are measured after the release's own checks, as without
    sharing: an empty input is still the input error (exit 3), and k above the persons
    still the refusal (exit 4), not a failure to measure."""
    for table, s, error in [
        (freq.iloc[:0], SPECS[0], InputDataError),
        (freq, spec("k_huge", k=10**9), PrivacyRefusal),
    ]:
        with pytest.raises(error) as alone:
            make_context(table, s, Loaded())
        with pytest.raises(error) as shared:
            make_context(table, s, Loaded(), SharedPlanning())
        assert str(shared.value) == str(alone.value)
