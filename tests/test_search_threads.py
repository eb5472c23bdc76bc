"""The optimal search on worker threads (``search._Lookahead``) and the evaluator shared
by them: the same answer, nodes checked and suppression as in one thread; bases built
once and counted once when many threads count at once; errors reach the caller and no
thread outlives the search."""

from __future__ import annotations

import pickle
import random
import threading
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import privpipe.anonymity.transformation as transformation
from privpipe.anonymity import search as search_module
from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.anonymity.models import (
    DistinctLDiversity,
    KAnonymity,
    PrivacyModel,
    RecursiveCLDiversity,
    TCloseness,
)
from privpipe.anonymity.search import SearchResult, optimal
from privpipe.anonymity.summary import Summary
from privpipe.anonymity.transformation import Evaluator
from privpipe.errors import PrivacyRefusal
from tests.test_anonymity_bases import _five_qis, _nodes, _repeat_visits, _same
from tests.test_anonymity_properties import cases, model_lists, restricted
from tests.test_units import person_tables


def _search_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("privpipe-search")]


def _same_result(a: SearchResult, b: SearchResult) -> None:
    assert a.transformation == b.transformation
    assert a.value == b.value
    assert a.nodes_checked == b.nodes_checked
    assert a.suppressed_records == b.suppressed_records
    np.testing.assert_array_equal(a.assessment.suppressed, b.assessment.suppressed)
    _same(a.classes, b.classes)


def _both(ev: Evaluator, models: Sequence[PrivacyModel], threads: int, **kw: object) -> None:
    """One thread and ``threads`` threads: the same result, or the same refusal."""
    try:
        alone = optimal(ev, models, threads=1, **kw)  # type: ignore[arg-type]
    except PrivacyRefusal as refusal:
        with pytest.raises(PrivacyRefusal) as again:
            optimal(ev, models, threads=threads, **kw)  # type: ignore[arg-type]
        assert str(again.value) == str(refusal)
    else:
        _same_result(optimal(ev, models, threads=threads, **kw), alone)  # type: ignore[arg-type]
    assert not _search_threads()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_threads_give_the_records_search_of_one_thread(data: st.DataObject) -> None:
    case = data.draw(cases())
    models = data.draw(model_lists(case.sa_hierarchy))
    limit = data.draw(st.sampled_from([0.0, 0.1, 0.2, 0.5]))
    metric = data.draw(st.sampled_from(["loss", "discernibility", "precision", "entropy"]))
    lattice = data.draw(restricted(case))
    ev = case.evaluator(packed=data.draw(st.booleans()))
    _both(
        ev,
        models,
        data.draw(st.integers(2, 4)),
        suppression_limit=limit,
        metric=metric,
        lattice=lattice,
        probe=data.draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    person_tables(max_rows=40, n_qis=(2, 3), max_size=6),
    st.sampled_from([0.0, 0.1, 0.3]),
    st.integers(0, 3),
)
def test_threads_give_the_persons_search_of_one_thread(
    table: tuple[pd.DataFrame, dict[str, Hierarchy]], limit: float, which: int
) -> None:
    df, hier = table
    qis = [c for c in df.columns if c.startswith("q")]
    summary = Summary.from_frame(df, qis, "S", hier, unit="P")
    models: list[list[PrivacyModel]] = [
        [KAnonymity(2)],
        [KAnonymity(2), TCloseness(0.3, "equal")],
        [DistinctLDiversity(2)],
        [KAnonymity(2), RecursiveCLDiversity(2.0, 2)],
    ]
    _both(Evaluator(summary, hier), models[which], 3, suppression_limit=limit)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_threads_give_the_same_search_on_repeat_visits(seed: int) -> None:
    """The demo's shape (persons with several rows and diagnoses, some moving), bases
    kept at every level: the answer and every figure as in one thread."""
    df, hier = _repeat_visits(seed)
    summary = Summary.from_frame(df, ["zip", "age", "sex"], "S", hier, unit="P")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)
        for models in ([KAnonymity(3), TCloseness(0.2, "equal")], [KAnonymity(4)]):
            _both(Evaluator(summary, hier), models, 2, suppression_limit=0.1)


def test_many_threads_counting_at_once_build_each_base_once() -> None:
    """Eight threads count every node at once, each in its own order: every class
    equals the one a fresh evaluator counts alone, each base is built once and the
    bytes kept are counted once (a race would count an array twice)."""
    summary, hier = _five_qis(11)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformation, "BASE_GAIN", 1.0)
        shared = Evaluator(summary, hier)
        alone = Evaluator(summary, hier)
        nodes = _nodes(shared)
        built: list[tuple[int, ...]] = []
        regroup = transformation.regroup

        def counting(base: object, levels: tuple[int, ...], *args: object) -> object:
            built.append(levels)
            return regroup(base, levels, *args)  # type: ignore[arg-type]

        patch.setattr(transformation, "regroup", counting)
        start = threading.Barrier(8)
        found: dict[tuple[int, ...], list[transformation.EquivalenceClasses]] = {}
        errors: list[BaseException] = []

        def count(seed: int) -> None:
            order = list(nodes)
            random.Random(seed).shuffle(order)
            start.wait()
            try:
                for node in order:
                    found.setdefault(node, []).append(shared.classes(node))
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=count, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        shared_builds = [levels for levels in built if any(levels)]
        for node in nodes:
            reference = alone.classes(node)
            assert len(found[node]) == 8
            for classes in found[node]:
                _same(classes, reference)
                _same(shared.in_units(classes), alone.in_units(reference))
    assert shared._bases and shared_builds
    assert len(shared_builds) == len(set(shared_builds))  # each base regrouped once
    kept = sum(base.nbytes for base in shared._bases.values())
    assert shared._base_bytes == kept


def test_an_error_in_a_worker_reaches_the_caller_and_no_thread_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    df, hier = _repeat_visits(5)
    summary = Summary.from_frame(df, ["zip", "age", "sex"], "S", hier, unit="P")
    classes_of = search_module._OptimalState.classes_of
    where: list[str] = []

    def failing(state: search_module._OptimalState, rank: int) -> object:
        if tuple(state.nodes[rank]) == (0, 0, 0):
            where.append(threading.current_thread().name)
            raise MemoryError("no room for node (0, 0, 0)")
        return classes_of(state, rank)

    monkeypatch.setattr(search_module._OptimalState, "classes_of", failing)
    with pytest.raises(MemoryError, match=r"\(0, 0, 0\)"):
        optimal(Evaluator(summary, hier), [KAnonymity(2)], threads=2, probe=False)
    assert where and all(name.startswith("privpipe-search") for name in where)
    assert not _search_threads()


def test_threads_default_to_the_cores_on_large_summaries_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    df, hier = _repeat_visits(6)
    summary = Summary.from_frame(df, ["zip", "age", "sex"], "S", hier, unit="P")
    started: list[int] = []
    lookahead = search_module._Lookahead

    def recording(state: object, threads: int) -> object:
        started.append(threads)
        return lookahead(state, threads)  # type: ignore[arg-type]

    monkeypatch.setattr(search_module, "_Lookahead", recording)
    monkeypatch.setattr(search_module, "usable_cores", lambda: 2)
    alone = optimal(Evaluator(summary, hier), [KAnonymity(3)], suppression_limit=0.1)
    assert started == []  # a small summary: no threads
    monkeypatch.setattr(search_module, "THREADED_ROWS", summary.n_distinct)
    threaded = optimal(Evaluator(summary, hier), [KAnonymity(3)], suppression_limit=0.1)
    assert started == [2]
    _same_result(threaded, alone)


def test_an_evaluator_pickles_without_its_lock_and_counts_after() -> None:
    summary, hier = _five_qis(12)
    ev = Evaluator(summary, hier)
    node = (1, 1, 0, 0, 0)
    before = ev.classes(node)
    copy = pickle.loads(pickle.dumps(ev))
    assert copy._lock is not ev._lock
    _same(copy.classes(node), before)
    _same(copy.classes((2, 0, 1, 1, 1)), ev.classes((2, 0, 1, 1, 1)))
