"""A DoFn whose elements' heavy work runs on a few threads of its own.

On a runner that runs a stage on one thread (the DirectRunner), a step whose work is
mostly outside the GIL (Arrow's writers, numpy's sorts and bincounts) can still use every
core this way, without leaving Beam: the runner sees one ordinary DoFn. Used by the
table writer's shuffle (``transforms.sink``) and by the bounding of DP contributions
(``transforms.dp_aggregate``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from privpipe.transforms.planning import searching_ahead
from privpipe.workers import available_cores

MAX_THREADS = 4  # elements worked on at once, at most (one per core)


def free_threads() -> int:
    """Elements an ``OnThreads`` step works on at once now: the cores this process may
    use less those busy planning ahead, at least one, at most ``MAX_THREADS``."""
    free = available_cores() - searching_ahead()
    return max(1, min(MAX_THREADS, free))


class OnThreads(beam.DoFn):  # type: ignore[misc]
    """A DoFn whose elements' work (``_submit``) runs on threads while the stage's thread
    goes on.

    As many elements are worked on at once as there are cores not taken by a search
    planned ahead in a worker process of this one (``planning.searching_ahead``; at most
    ``MAX_THREADS``): beside such a search, a second thread only slowed it (RESULTS.md,
    seventeenth round), so with one core left each element is worked on inline, as a
    plain DoFn would. What an element gives is emitted once its work is done (in
    ``process`` while others wait, the rest at the bundle's end): the order of these
    outputs means nothing, so a step downstream must not depend on it. An error raised on
    a thread is raised here."""

    thread_prefix = "privpipe-work"

    def setup(self) -> None:
        self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix=self.thread_prefix)

    def start_bundle(self) -> None:
        self._pending: collections.deque[Future[list[Any]]] = collections.deque()

    def _submit(self, work: Callable[..., list[Any]], *args: Any) -> Iterator[Any]:
        """Run ``work(*args)`` (on a thread when cores are free); emit the outputs of the
        works done."""
        threads = free_threads()
        if threads <= 1:
            while self._pending:
                yield from self._pending.popleft().result()
            yield from work(*args)
            return
        self._pending.append(self._pool.submit(work, *args))
        while len(self._pending) > threads:
            yield from self._pending.popleft().result()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        while self._pending:
            for output in self._pending.popleft().result():
                yield WindowedValue(output, MIN_TIMESTAMP, (GlobalWindow(),))

    def teardown(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
