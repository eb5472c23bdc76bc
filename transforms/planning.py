"""The searches of the anonymised releases that share one summary, on the machine's cores.

Releases counting the same columns start from one frequency table (``Summarise``); each
one's plan (``make_context``: hierarchies, summary, search, metrics; pure core) depends
on nothing else, so with several releases and several cores they run side by side:
up to ``min(cores, releases) - 1`` worker processes plus the calling thread, the longest
expected search first (t-closeness, then l-diversity, Mondrian, k-anonymity; config
order among equals). With one core or one release everything runs in the calling
thread, in config order, as before. The hierarchies are resolved once (the same for
every release of one summary) before the planning.

A worker is a fresh ``python`` running ``serve()`` (no fork of the threaded Beam worker,
no re-import of the caller's ``__main__``, no Beam import): it reads the pickled summary,
hierarchies and spec from its stdin (a pipe: the summary never touches the disk) and
writes the pickled plan, or the exception, to its stdout. The summary is pickled straight
into each worker's pipe as the worker reads it: the caller never holds a pickled copy
(15 MB at 1M demo rows, ~150 MB at 10M; a held copy, and a second one joined with the
spec, used to stay in the caller for the whole search). With ``slim`` a plan is reduced
to what the Beam steps after the search use (``SlimContext``) where it is made, before
it is pickled or kept. Workers ignore Ctrl-C; the caller kills them on any error or
interrupt, and they exit by themselves if the caller dies: no worker outlives the call.

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
worker still running (a failed or interrupted pipeline).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import pandas as pd

from privpipe import progress
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.transforms.context import (
    ReleaseContext,
    Resolved,
    Resolver,
    SlimContext,
    column_counts,
    make_context,
)

# expected search effort by kind (measured on the demo at 1M: t=0.3 115 s, recursive l
# 18 s, Mondrian 10 s, k=5 8 s); only the order matters
_EFFORT = {"t_closeness": 3, "l_diversity": 2}
WATCH_S = 1.0  # how often a worker checks that its caller is alive
PROGRESS_S = 1.0  # how often a worker reports its nodes checked


@dataclass(frozen=True)
class Planned:
    """One release's plan and the seconds its planning took (where it ran)."""

    context: ReleaseContext | SlimContext
    seconds: float


def available_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def expected_effort(spec: AnonymizationSpec) -> int:
    """A rank of how long a release's search takes, longest highest (scheduling only)."""
    if spec.algorithm == "mondrian":
        return 1
    return _EFFORT.get(spec.kind, 0)


def plan_one(
    freq: pd.DataFrame, spec: AnonymizationSpec, resolver: Resolver, slim: bool = False
) -> Planned:
    """``make_context`` and its wall seconds; with ``slim`` its ``SlimContext``, made
    right away so the full context is never kept (or pickled, in a worker)."""
    t0 = time.perf_counter()
    context: ReleaseContext | SlimContext = make_context(freq, spec, resolver)
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
        return {str(s.name): plan_one(freq, s, resolver, slim) for s in specs}
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
    while True:
        pending = deque(i for i in pending if needed(i))
        while pending and len(running) < processes:
            i = pending.popleft()
            running[pool.submit(workers.plan, specs[i])] = i
        waiting = [f for f, i in running.items() if needed(i)]
        if pending:  # this thread is a worker too
            i = pending.popleft()
            try:
                results[i] = plan_one(freq, specs[i], resolver, slim)
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


class _Ahead:
    """The releases of one search step being planned in worker processes."""

    def __init__(
        self, freq: pd.DataFrame, specs: Sequence[AnonymizationSpec], resolver: Resolver
    ) -> None:
        # the summary is dropped once every worker has read it: this process keeps
        # running the pipeline while the searches go on (the tickets carry their own copy)
        self.workers = _Workers((freq, resolver), slim=True, feeds=len(specs))
        self.pool = ThreadPoolExecutor(len(specs), thread_name_prefix="privpipe-plan-ahead")
        self.futures = {str(s.name): self.pool.submit(self.workers.plan, s) for s in specs}

    def close(self) -> None:
        self.workers.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)


_AHEAD: dict[str, _Ahead] = {}
_AHEAD_LOCK = threading.Lock()


def start_ahead(
    freq: pd.DataFrame, specs: Sequence[AnonymizationSpec], resolver: Resolver
) -> list[Ticket]:
    """Start planning ``specs`` (slim plans), one worker process each; a ticket each."""
    if not specs:
        return []
    token = uuid.uuid4().hex
    ahead = _Ahead(freq, specs, resolver)
    with _AHEAD_LOCK:
        _AHEAD[token] = ahead
    return [Ticket(token, s, freq, resolver) for s in specs]


def plan_with_ahead(
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    ahead: Sequence[str],
) -> tuple[dict[str, Planned], list[Ticket]]:
    """The releases named in ``ahead`` started in worker processes (tickets), the others
    planned in this thread meanwhile, in config order (slim plans). Errors as
    ``plan_releases``: when a release planned here fails, a release planned ahead that
    comes before it in config order and fails too raises instead."""
    resolver = _resolved_once(freq, specs, resolver)
    tickets = start_ahead(freq, [s for s in specs if s.name in ahead], resolver)
    here: dict[str, Planned] = {}
    earlier: list[Ticket] = []  # planned ahead, before the next release in config order
    try:
        for spec in specs:
            if spec.name in ahead:
                earlier += [t for t in tickets if t.spec.name == spec.name]
                continue
            try:
                here[str(spec.name)] = plan_one(freq, spec, resolver, slim=True)
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
    ticket's workers are not in this process, planned here. Its error, as in-process."""
    with _AHEAD_LOCK:
        ahead = _AHEAD.get(ticket.token)
        future = None if ahead is None else ahead.futures.pop(str(ticket.spec.name), None)
    if future is None:
        return plan_one(ticket.freq, ticket.spec, ticket.resolver, slim=True)
    try:
        return future.result()
    finally:
        if ahead is not None and not ahead.futures:
            _drop(ticket.token)


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


class WorkerFailed(RuntimeError):
    """A worker process died without an answer (killed, out of memory)."""


class _Workers:
    """Worker processes, one per release planned away from the calling thread."""

    def __init__(
        self, shared: tuple[pd.DataFrame, Resolver], slim: bool = False, feeds: int | None = None
    ) -> None:
        self.shared: tuple[pd.DataFrame, Resolver] | None = shared  # summary and hierarchies,
        # pickled into each worker's pipe; dropped after ``feeds`` workers got it (if given)
        self.slim = slim
        self.feeds = feeds
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed = False

    def plan(self, spec: AnonymizationSpec) -> Planned:
        """Plan ``spec`` in a new worker process (called from a pool thread)."""
        code = f"import sys; sys.path[:] = {sys.path!r}; import {__name__} as m; m.serve()"
        with self.lock:
            if self.killed or self.shared is None:
                raise WorkerFailed(f"release {spec.name!r}: planning abandoned")
            shared = self.shared
            report, tell = os.pipe()  # the worker's progress (nodes checked), line by line
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-c", code, str(os.getpid()), str(tell)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    pass_fds=(tell,),
                )
            finally:
                os.close(tell)
            self.procs.append(proc)
        relay = threading.Thread(target=_relay, args=(report,), daemon=True)
        relay.start()
        assert proc.stdin is not None and proc.stdout is not None
        try:  # streamed: pickle writes large arrays to the pipe without a copy of them
            with proc.stdin as task:
                pickle.dump(shared, task, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.dump((spec, self.slim), task, protocol=pickle.HIGHEST_PROTOCOL)
        except (BrokenPipeError, ValueError):  # it died while reading (or was killed)
            pass
        finally:
            del shared
            self._fed()
        with proc.stdout as answer:  # the worker writes once it has read everything
            out = answer.read()
        proc.wait()
        relay.join(timeout=5)  # its last progress line is counted before the plan returns
        if proc.returncode != 0 or not out:
            raise WorkerFailed(
                f"release {spec.name!r}: the worker planning it exited with code "
                f"{proc.returncode} (killed or out of memory?); run with fewer releases"
            )
        ok, value = pickle.loads(out)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

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
            procs = list(self.procs)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _relay(fd: int) -> None:
    """Add a worker's progress lines (``stage<TAB>unit<TAB>count``, counts since its last
    line) to this process's tally (privpipe/progress.py) until the worker closes its end."""
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            stage, unit, n = [*line.rstrip("\n").split("\t"), "", "", ""][:3]
            if n.isdigit():
                progress.add_rows(stage, int(n), unit)


class _Reporter:
    """A worker's side of :func:`_relay`: every ``PROGRESS_S`` and once at the end, what its
    tally gained since the last line."""

    def __init__(self, fd: int) -> None:
        self.out = os.fdopen(fd, "w", encoding="utf-8")
        self.sent: dict[str, int] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.done.wait(PROGRESS_S):
            self.send()

    def send(self) -> None:
        with self.lock:
            for stage, (n, unit) in progress.snapshot().items():
                gained = n - self.sent.get(stage, 0)
                if gained > 0:
                    self.out.write(f"{stage}\t{unit}\t{gained}\n")
                    self.sent[stage] = n
            self.out.flush()

    def close(self) -> None:
        self.done.set()
        try:
            self.send()
            self.out.close()
        except OSError:  # the caller stopped listening: progress only
            pass


def serve() -> None:
    """A worker's main: summary, hierarchies, spec and slim from stdin; (ok, plan | error)
    out; its progress on the descriptor named in argv."""
    caller = int(sys.argv[1])
    reporter = _Reporter(int(sys.argv[2])) if len(sys.argv) > 2 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the caller stops us (no traceback)
    threading.Thread(target=_exit_with, args=(caller,), daemon=True).start()
    stdin = sys.stdin.buffer
    freq, resolver = pickle.load(stdin)
    spec, slim = pickle.load(stdin)
    answer: tuple[bool, object]
    try:
        answer = (True, plan_one(freq, spec, resolver, slim))
    except Exception as e:  # the caller raises it as its own
        answer = (False, e)
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle: its type and message
        data = pickle.dumps((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
    if reporter is not None:
        reporter.close()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _exit_with(caller: int) -> None:
    """Exit as soon as the caller is gone (killed with no chance to stop its workers)."""
    while os.getppid() == caller:
        time.sleep(WATCH_S)
    os._exit(1)
