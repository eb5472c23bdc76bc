"""The searches of the anonymised releases that share one summary, on the machine's cores.

Releases counting the same columns start from one frequency table (``Summarise``); each
one's plan (``make_context``: hierarchies, summary, search, metrics; pure core) depends
on nothing else, so with several releases and several cores they run side by side:
up to ``min(cores, releases) - 1`` worker processes plus the calling thread, the longest
expected search first (t-closeness, then l-diversity, Mondrian, k-anonymity; config
order among equals). With one core or one release everything runs in the calling
thread, in config order, as before. The hierarchies are resolved once (the same for
every release of one summary) before the planning.

A worker is a fresh ``python`` (``privpipe.workers``: no fork of the threaded Beam
worker, no re-import of the caller's ``__main__``), started with this module's imports
(``PLANNING_WARM``: Beam, through ``privpipe.transforms``, pandas and the pure cores,
~1.2 s); a run whose graph plans ahead starts their workers once the graph is built
(``prestart_ahead``), so those imports overlap the read. It reads the pickled
call (``plan_one`` with the summary, hierarchies and spec) from its stdin (a pipe: the
summary never touches the disk) and writes the pickled plan, or the exception, to its
stdout. The summary is pickled straight into each worker's pipe as the worker reads it:
the caller never holds a pickled copy (15 MB at 1M demo rows, ~150 MB at 10M; a held
copy, and a second one joined with the spec, used to stay in the caller for the whole
search). With ``slim`` a plan is reduced to what the Beam steps after the search use
(``SlimContext``) where it is made, before it is pickled or kept. Workers ignore
Ctrl-C; the caller kills them on any error or interrupt, and they exit by themselves if
the caller dies: no worker outlives the call.

Errors are those of the sequential order: the first release in config order whose plan
fails raises its own exception (type and message unchanged, so a refusal still exits 4);
plans after it in config order are abandoned, plans before it are still awaited.

Planning ahead (``start_ahead`` / ``collect_ahead``). A runner that runs one stage at a
time in this process (Beam's FnApiRunner, privpipe's DirectRunner) would otherwise wait
in the search step for the longest search while one core idles and every later stage
waits. The releases that would go to worker processes (``ahead_releases``) are instead
started there and left running: the search step returns with the other releases' plans
and a ticket per release planned ahead, the other releases' recode, verify and write
steps run meanwhile, and a later step collects the plan (``collect_ahead``). The ticket
carries the summary, so a step that runs where the ticket's workers are unknown (another
process) plans the release itself: the same plan, later. ``abandon_ahead`` kills every
worker still running (a failed or interrupted pipeline). A release planned ahead can
have its worker run another call in place of ``plan_one`` (``PlanCall``; the ticket
carries it too): ``pipelines.publish_ahead.PublishAhead`` plans the release and then publishes it in
that worker, returning the plan with its publication's stage timings (``Published``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial

import pandas as pd

from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.transforms.context import (
    ReleaseContext,
    Resolved,
    Resolver,
    SharedPlanning,
    SlimContext,
    column_counts,
    make_context,
)
from privpipe.workers import Worker, WorkerFailed, available_cores, prestart, take

PLANNING_WARM = (__name__,)  # what a search's worker imports before its call arrives

# expected search effort by kind (measured on the demo at 1M: t=0.3 115 s, recursive l
# 18 s, Mondrian 10 s, k=5 8 s); only the order matters
_EFFORT = {"t_closeness": 3, "l_diversity": 2}


@dataclass(frozen=True)
class Planned:
    """One release's plan and the seconds its planning took (where it ran)."""

    context: ReleaseContext | SlimContext
    seconds: float


@dataclass(frozen=True)
class Published(Planned):
    """A release planned and then published where it was planned (``PlanCall``): its plan,
    and the stage timings (``{stage: ms}``) of its publication there."""

    stages: dict[str, int]


# what a worker runs for a release planned ahead instead of ``plan_one`` (summary, spec,
# resolved hierarchies → its plan): e.g. plan it and then publish it there
PlanCall = Callable[[pd.DataFrame, AnonymizationSpec, Resolver], Planned]


def expected_effort(spec: AnonymizationSpec) -> int:
    """A rank of how long a release's search takes, longest highest (scheduling only)."""
    if spec.algorithm == "mondrian":
        return 1
    return _EFFORT.get(spec.kind, 0)


def plan_one(
    freq: pd.DataFrame,
    spec: AnonymizationSpec,
    resolver: Resolver,
    slim: bool = False,
    shared: SharedPlanning | None = None,
) -> Planned:
    """``make_context`` and its wall seconds; with ``slim`` its ``SlimContext``, made
    right away so the full context is never kept (or pickled, in a worker). ``shared``:
    the summary and input scores of the releases planned before it in this thread."""
    t0 = time.perf_counter()
    context: ReleaseContext | SlimContext = make_context(freq, spec, resolver, shared)
    if slim:
        context = context.slim()
    return Planned(context, time.perf_counter() - t0)


def plan_releases(
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    cores: int | None = None,
    slim: bool = False,
) -> dict[str, Planned]:
    """Every release's plan from the shared frequency table, by release name.

    ``cores``: how many to use (default: ``available_cores()``); 1 plans in this thread.
    ``slim``: each plan as its ``SlimContext`` (all the Beam steps after the search use).
    """
    processes, order = _longest_first(specs, cores)
    if len(specs) > 1:
        resolver = _resolved_once(freq, specs, resolver)
    if processes <= 0:
        shared = SharedPlanning()
        return {str(s.name): plan_one(freq, s, resolver, slim, shared) for s in specs}
    workers = _Workers((freq, resolver), slim)
    pool = ThreadPoolExecutor(processes, thread_name_prefix="privpipe-plan")
    try:
        results = _schedule(pool, workers, processes, order, freq, specs, resolver, slim)
        return {str(s.name): results[i] for i, s in enumerate(specs)}
    finally:
        workers.kill()  # none left on success; on an error or interrupt, the unneeded ones
        pool.shutdown(wait=True, cancel_futures=True)


def _longest_first(
    specs: Sequence[AnonymizationSpec], cores: int | None = None
) -> tuple[int, list[int]]:
    """How many worker processes plan beside the calling thread (``min(cores, releases)
    - 1``; default cores: ``available_cores()``) and the releases' indices, the longest
    expected search first (config order among equals)."""
    cores = available_cores() if cores is None else max(1, cores)
    order = sorted(range(len(specs)), key=lambda i: (-expected_effort(specs[i]), i))
    return min(cores, len(specs)) - 1, order


def _resolved_once(
    freq: pd.DataFrame, specs: Sequence[AnonymizationSpec], resolver: Resolver
) -> Resolved:
    """The same hierarchies for every release of one summary: resolved once, shipped as
    data (to worker processes, in tickets)."""
    return Resolved(resolver(column_counts(freq, skip=specs[0].unit_by)))


def _schedule(
    pool: ThreadPoolExecutor,
    workers: _Workers,
    processes: int,
    order: Sequence[int],
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    slim: bool = False,
) -> dict[int, Planned]:
    """Fill the workers (longest first), plan the next release here meanwhile, collect."""
    results: dict[int, Planned] = {}
    errors: dict[int, Exception] = {}

    def needed(i: int) -> bool:  # not after a release (in config order) that failed
        return not errors or i < min(errors)

    pending = deque(order)
    running: dict[Future[Planned], int] = {}
    shared = SharedPlanning()  # for the releases planned in this thread
    while True:
        pending = deque(i for i in pending if needed(i))
        while pending and len(running) < processes:
            i = pending.popleft()
            running[pool.submit(workers.plan, specs[i])] = i
        waiting = [f for f, i in running.items() if needed(i)]
        if pending:  # this thread is a worker too
            i = pending.popleft()
            try:
                results[i] = plan_one(freq, specs[i], resolver, slim, shared)
            except Exception as e:  # raised below, in config order
                errors[i] = e
            done = {f for f in running if f.done()}
        elif waiting:
            done, _ = wait(waiting, return_when=FIRST_COMPLETED)
        else:
            break
        for f in done:
            i = running.pop(f)
            try:
                results[i] = f.result()
            except Exception as e:
                errors[i] = e
    if errors:
        raise errors[min(errors)]
    return results


def prestart_ahead(count: int) -> None:
    """Start the worker processes of ``count`` releases to be planned ahead now (a run,
    once its graph is built, before the read): their interpreters and imports are ready by
    the time the summary is (``privpipe.workers.prestart``; ``discard_prestarted`` ends
    those never taken)."""
    if count > 0:
        prestart(PLANNING_WARM, count)


def ahead_releases(specs: Sequence[AnonymizationSpec], cores: int | None = None) -> list[str]:
    """The releases ``plan_releases`` would give its worker processes first (the longest
    expected searches, ``min(cores, releases) - 1`` of them): the ones to plan ahead."""
    processes, order = _longest_first(specs, cores)
    return [str(specs[i].name) for i in order[: max(processes, 0)]]


@dataclass(frozen=True, eq=False)
class Ticket:
    """A release planned ahead: where to collect its plan in this process (``token``),
    and what to plan it from anywhere else (the summary and the resolved hierarchies)."""

    token: str
    spec: AnonymizationSpec
    freq: pd.DataFrame
    resolver: Resolver
    call: PlanCall | None = None  # run instead of ``plan_one`` (wherever it runs)


class _Ahead:
    """The releases of one search step being planned in worker processes."""

    def __init__(
        self,
        freq: pd.DataFrame,
        specs: Sequence[AnonymizationSpec],
        resolver: Resolver,
        calls: Mapping[str, PlanCall],
    ) -> None:
        # the summary is dropped once every worker has read it: this process keeps
        # running the pipeline while the searches go on (the tickets carry their own copy)
        self.workers = _Workers((freq, resolver), slim=True, feeds=len(specs))
        self.pool = ThreadPoolExecutor(len(specs), thread_name_prefix="privpipe-plan-ahead")
        self.futures = {
            str(s.name): self.pool.submit(self.workers.plan, s, calls.get(str(s.name)))
            for s in specs
        }

    def close(self) -> None:
        self.workers.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)


_AHEAD: dict[str, _Ahead] = {}
_AHEAD_LOCK = threading.Lock()


def start_ahead(
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    calls: Mapping[str, PlanCall] | None = None,
) -> list[Ticket]:
    """Start planning ``specs`` (slim plans), one worker process each; a ticket each.
    ``calls``: by release name, what its worker runs instead of ``plan_one``."""
    if not specs:
        return []
    calls = dict(calls or {})
    token = uuid.uuid4().hex
    ahead = _Ahead(freq, specs, resolver, calls)
    with _AHEAD_LOCK:
        _AHEAD[token] = ahead
    return [Ticket(token, s, freq, resolver, calls.get(str(s.name))) for s in specs]


def plan_with_ahead(
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    ahead: Sequence[str],
    calls: Mapping[str, PlanCall] | None = None,
) -> tuple[dict[str, Planned], list[Ticket]]:
    """The releases named in ``ahead`` started in worker processes (tickets; ``calls``:
    what their workers run instead of ``plan_one``, by name), the others planned in this
    thread meanwhile, in config order (slim plans). Errors as ``plan_releases``: when a
    release planned here fails, a release planned ahead that comes before it in config
    order and fails too raises instead."""
    resolver = _resolved_once(freq, specs, resolver)
    tickets = start_ahead(freq, [s for s in specs if s.name in ahead], resolver, calls)
    here: dict[str, Planned] = {}
    shared = SharedPlanning()
    earlier: list[Ticket] = []  # planned ahead, before the next release in config order
    try:
        for spec in specs:
            if spec.name in ahead:
                earlier += [t for t in tickets if t.spec.name == spec.name]
                continue
            try:
                here[str(spec.name)] = plan_one(freq, spec, resolver, True, shared)
            except Exception:
                for ticket in earlier:  # an earlier release's error wins, as in sequence
                    collect_ahead(ticket)
                raise
    except BaseException:
        abandon_ahead(tickets)
        raise
    return here, tickets


def collect_ahead(ticket: Ticket) -> Planned:
    """The plan of a release planned ahead: its worker's answer (waited for), or, when the
    ticket's workers are not in this process, planned here (by the ticket's ``call``, if
    it has one). Its error, as in-process."""
    with _AHEAD_LOCK:
        ahead = _AHEAD.get(ticket.token)
        future = None if ahead is None else ahead.futures.pop(str(ticket.spec.name), None)
    if future is None:
        call = ticket.call or partial(plan_one, slim=True)
        return call(ticket.freq, ticket.spec, ticket.resolver)
    try:
        return future.result()
    finally:
        if ahead is not None and not ahead.futures:
            _drop(ticket.token)


def searching_ahead() -> int:
    """How many releases this process's workers are still planning ahead (each busy on a
    core of its own): steps that could use more threads leave those cores to them."""
    with _AHEAD_LOCK:
        return sum(not f.done() for a in _AHEAD.values() for f in a.futures.values())


def abandon_ahead(tickets: Sequence[Ticket] | None = None) -> None:
    """Stop planning ahead: the workers of ``tickets`` (default: every one of this
    process), killed and reaped."""
    tokens = None if tickets is None else {t.token for t in tickets}
    with _AHEAD_LOCK:
        chosen = [t for t in _AHEAD if tokens is None or t in tokens]
    for token in chosen:
        _drop(token)


def _drop(token: str) -> None:
    with _AHEAD_LOCK:
        ahead = _AHEAD.pop(token, None)
    if ahead is not None:
        ahead.close()


class _Workers:
    """Worker processes (``privpipe.workers``), one per release planned away from the
    calling thread."""

    def __init__(
        self, shared: tuple[pd.DataFrame, Resolver], slim: bool = False, feeds: int | None = None
    ) -> None:
        self.shared: tuple[pd.DataFrame, Resolver] | None = shared  # summary and hierarchies,
        # pickled into each worker's pipe; dropped after ``feeds`` workers got it (if given)
        self.slim = slim
        self.feeds = feeds
        self.lock = threading.Lock()
        self.started: list[Worker] = []
        self.killed = False

    def plan(self, spec: AnonymizationSpec, call: PlanCall | None = None) -> Planned:
        """Plan ``spec`` in a new worker process (called from a pool thread); with ``call``,
        run that there instead of ``plan_one``."""
        with self.lock:
            if self.killed or self.shared is None:
                raise WorkerFailed(f"release {spec.name!r}: planning abandoned")
            freq, resolver = self.shared
            worker = take(f"release {spec.name!r}", PLANNING_WARM, "run with fewer releases")
            self.started.append(worker)
        try:
            worker.send(call or partial(plan_one, slim=self.slim), freq, spec, resolver)
        finally:
            del freq, resolver
            self._fed()
        planned: Planned = worker.result()
        return planned

    def _fed(self) -> None:
        """One more worker has its input: after the last of ``feeds``, drop the summary."""
        with self.lock:
            if self.feeds is not None:
                self.feeds -= 1
                if self.feeds <= 0:
                    self.shared = None

    def kill(self) -> None:
        """Kill every worker still running and reap it."""
        with self.lock:
            self.killed = True
            started = list(self.started)
        for worker in started:
            worker.kill()
