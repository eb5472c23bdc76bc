"""Combiners whose additions overlap the rest of their stage: the second core on the
row-heavy steps of a runner that runs a stage on one thread.

A runner that fuses steps into one stage (Beam's FnApiRunner, the DirectRunner) calls
them one after the other on each batch, on one thread: the parse, the holdout, the
profile, the summary, the DP contributions. Much of a combiner's work on a batch
(pandas' factorize and hash tables, numpy's sorts, bincounts and gathers) runs without
the GIL: the summary's ``FrequencyTable`` adds eight 64k-row batches in 0.52 s on one
thread and 0.33 s on two. ``OverlappedCombineFn`` runs a CombineFn's ``add_input``
calls on a thread of the accumulator's own, in the order they came, while the stage's
thread goes on to the next step and the next batch; at most ``DEPTH`` batches wait per
accumulator, so memory stays bounded. Every other call (merge, compact, extract) first
waits for the additions still running, and an accumulator pickles as the one it wraps:
the encoded accumulators, the results, and what any other runner sees are those of the
wrapped CombineFn. An error raised by an addition is raised again, unchanged, by the next
call on its accumulator.

Used by the profile, the summary and the verifiers, the heaviest combiners per row. Each
one more thread also waits for the GIL: overlapping the audit's lighter combiners too
(its staged truth and target sample) took more CPU and no less time (RESULTS.md,
"fourteenth round"). Meant for ``CombineGlobally`` (one accumulator per bundle and step):
per key it would start a thread per key.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Final

from apache_beam.metrics import Metrics

from privpipe import progress
from privpipe.timing import NAMESPACE
from privpipe.transforms.timing import TimedCombineFn

__all__ = ["DEPTH", "OverlappedCombineFn"]

DEPTH: Final = 2
"""Batches that may wait for one accumulator's thread before the stage's thread waits."""

_STOP: Final = object()


def _plain(accumulator: Any) -> Any:
    """What an overlapped accumulator unpickles to: the accumulator it wrapped."""
    return accumulator


class _Accumulating:
    """An accumulator and the additions still to run on its thread (started at the first)."""

    __slots__ = ("_error", "_queue", "_thread", "accumulator", "seconds")

    def __init__(self, accumulator: Any) -> None:
        self.accumulator = accumulator
        self.seconds = 0.0  # CPU time of the additions run so far (reported once settled)
        self._error: BaseException | None = None
        self._queue: queue.Queue[Any] | None = None
        self._thread: threading.Thread | None = None

    def add(self, add_input: Any, element: Any) -> None:
        """Queue ``add_input(accumulator, element)`` (waits while ``DEPTH`` are queued);
        once an earlier addition failed, its error instead (the thread stopped first)."""
        if self._error is not None:
            self.settle()  # raises it
        if self._queue is None:
            self._queue = queue.Queue(maxsize=DEPTH)
            # a daemon: a run interrupted before its accumulators settle still exits
            self._thread = threading.Thread(target=self._run, name="privpipe-combine", daemon=True)
            self._thread.start()
        self._queue.put((add_input, element))

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # drain what was queued after a failure; it is raised on settle
            add_input, element = item
            t0 = time.thread_time()  # this thread's CPU: not the waits for the GIL
            try:
                self.accumulator = add_input(self.accumulator, element)
            except BaseException as exc:  # raised again in the caller's thread
                self._error = exc
            finally:
                self.seconds += time.thread_time() - t0

    def settle(self) -> Any:
        """The accumulator once every queued addition ran (their error raised, if any)."""
        if self._thread is not None and self._queue is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = self._queue = None
        if self._error is not None:
            raise self._error
        return self.accumulator

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _plain, (self.settle(),)


class OverlappedCombineFn(TimedCombineFn):
    """``fn`` timed as stage ``stage`` (``TimedCombineFn``), its additions run on a thread
    of each accumulator's own (module docstring)."""

    def create_accumulator(self, *args: Any, **kwargs: Any) -> Any:
        return _Accumulating(self.fn.create_accumulator(*args, **kwargs))

    def add_input(self, mutable_accumulator: Any, element: Any, *args: Any, **kwargs: Any) -> Any:
        progress.add_rows(self.stage, progress.rows_of(element))
        accumulating = (
            mutable_accumulator
            if isinstance(mutable_accumulator, _Accumulating)
            else _Accumulating(mutable_accumulator)
        )
        fn, stage = self.fn, self.stage

        def add(accumulator: Any, batch: Any) -> Any:
            with progress.working(stage):
                return fn.add_input(accumulator, batch, *args, **kwargs)

        accumulating.add(add, element)
        return accumulating

    def add_inputs(self, mutable_accumulator: Any, elements: Any, *args: Any, **kwargs: Any) -> Any:
        for element in elements:
            mutable_accumulator = self.add_input(mutable_accumulator, element, *args, **kwargs)
        return mutable_accumulator

    def merge_accumulators(self, accumulators: Any, *args: Any, **kwargs: Any) -> Any:
        settled = [self._settled(accumulator) for accumulator in accumulators]
        return super().merge_accumulators(settled, *args, **kwargs)

    def compact(self, accumulator: Any, *args: Any, **kwargs: Any) -> Any:
        return super().compact(self._settled(accumulator), *args, **kwargs)

    def extract_output(self, accumulator: Any, *args: Any, **kwargs: Any) -> Any:
        return super().extract_output(self._settled(accumulator), *args, **kwargs)

    def _settled(self, accumulator: Any) -> Any:
        """The wrapped accumulator, its additions done; their time is added to the stage
        here, on the stage's thread (Beam's counters belong to it). It is the additions'
        CPU time, which on one thread was their wall time: with several threads wall time
        would also count the waits for the GIL."""
        if not isinstance(accumulator, _Accumulating):
            return accumulator
        settled = accumulator.settle()
        spent, accumulator.seconds = accumulator.seconds, 0.0
        Metrics.counter(NAMESPACE, self.stage).inc(round(spent * 1000))
        return settled
