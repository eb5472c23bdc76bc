"""The searches of the anonymised releases that share one summary, on the machine's cores.

Releases counting the same columns start from one frequency table (``Summarise``); each
one's plan (``make_context``: hierarchies, summary, search, metrics; pure core) depends
on nothing else, so with several releases and several cores they run side by side:
``min(cores, releases) - 1`` worker processes plus the calling thread, the longest
expected search first (t-closeness, then l-diversity, Mondrian, k-anonymity; config
order among equals). With one core or one release everything runs in the calling
thread, in config order, as before. The hierarchies are resolved once (the same for
every release of one summary) before the planning; only the summary and hierarchies
(once per worker, at its start) and each release's spec travel to the workers; each
plan comes back pickled.

Workers are started with ``spawn`` (the Beam worker calling this has threads, so no
plain fork). They ignore SIGINT (the caller handles Ctrl-C and SIGTERM and stops them)
and exit if the caller dies. The pool is shut down before returning, and terminated on
any error or interrupt: no worker outlives the call.

Errors are those of the sequential order: the first release in config order whose plan
fails raises its own exception (type and message unchanged, so a refusal still exits 4);
plans after it in config order are abandoned, plans before it are still awaited.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

import pandas as pd

from anonymity.spec import AnonymizationSpec
from transforms.context import ReleaseContext, Resolved, Resolver, column_counts, make_context

# expected search effort by kind (measured on the demo at 1M: t=0.3 115 s, recursive l
# 18 s, Mondrian 10 s, k=5 8 s); only the order matters
_EFFORT = {"t_closeness": 3, "l_diversity": 2}
WATCH_S = 1.0  # how often a worker checks that its caller is alive


@dataclass(frozen=True)
class Planned:
    """One release's plan and the seconds its planning took (where it ran)."""

    context: ReleaseContext
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


def plan_one(freq: pd.DataFrame, spec: AnonymizationSpec, resolver: Resolver) -> Planned:
    """``make_context`` and its wall seconds."""
    t0 = time.perf_counter()
    context = make_context(freq, spec, resolver)
    return Planned(context, time.perf_counter() - t0)


def plan_releases(
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
    cores: int | None = None,
) -> dict[str, Planned]:
    """Every release's plan from the shared frequency table, by release name.

    ``cores``: how many to use (default: ``available_cores()``); 1 plans in this thread.
    """
    cores = available_cores() if cores is None else max(1, cores)
    processes = min(cores, len(specs)) - 1
    if len(specs) > 1:  # the same answer for every release: resolved once, shipped as data
        resolver = Resolved(resolver(column_counts(freq)))
    if processes <= 0:
        return {s.name: plan_one(freq, s, resolver) for s in specs}
    order = sorted(range(len(specs)), key=lambda i: (-expected_effort(specs[i]), i))
    pool = ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(freq, resolver, os.getpid()),
    )
    finished = False
    try:
        results = _schedule(pool, processes, order, freq, specs, resolver)
        finished = True
        return {s.name: results[i] for i, s in enumerate(specs)}
    finally:
        if not finished:  # an error or an interrupt: the running searches are not needed
            _terminate(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _schedule(
    pool: ProcessPoolExecutor,
    processes: int,
    order: Sequence[int],
    freq: pd.DataFrame,
    specs: Sequence[AnonymizationSpec],
    resolver: Resolver,
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
            running[pool.submit(_plan_in_worker, specs[i])] = i
        waiting = [f for f, i in running.items() if needed(i)]
        if pending:  # this thread is a worker too
            i = pending.popleft()
            try:
                results[i] = plan_one(freq, specs[i], resolver)
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


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now (Python 3.14 has ``terminate_workers``)."""
    stop = getattr(pool, "terminate_workers", None)
    if stop is not None:
        stop()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


# in a worker process: the shared summary and resolver, set once at its start
_FREQ: pd.DataFrame | None = None
_RESOLVER: Resolver | None = None


def _start_worker(freq: pd.DataFrame, resolver: Resolver, caller: int) -> None:
    global _FREQ, _RESOLVER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C and stops us
    _FREQ, _RESOLVER = freq, resolver
    threading.Thread(target=_exit_with, args=(caller,), daemon=True).start()


def _exit_with(caller: int) -> None:
    """Exit as soon as the caller is gone (killed with no chance to stop the pool)."""
    while os.getppid() == caller:
        time.sleep(WATCH_S)
    os._exit(1)


def _plan_in_worker(spec: AnonymizationSpec) -> Planned:
    assert _FREQ is not None and _RESOLVER is not None
    return plan_one(_FREQ, spec, _RESOLVER)
