"""Pipeline-side stage timings: wall milliseconds per stage as Beam counters.

``with stage_ms("search:k5"): ...`` inside a DoFn or CombineFn adds the block's elapsed
wall ms to ``Metrics.counter("privpipe.stage", "search:k5")``; every runner that reports
metrics sums them over workers, and the driver reads them back with
``stage_counters(result)`` into ``manifest["timings"]["stages"]``. Summed over workers
and bundles, a stage's figure is busy time, which can exceed wall time on several cores.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.utils.windowed_value import WindowedValue

from privpipe import progress
from privpipe.timing import NAMESPACE


@contextmanager
def stage_ms(stage: str) -> Iterator[None]:
    """Add the block's elapsed wall milliseconds to the counter ``privpipe.stage/<stage>``."""
    t0 = time.perf_counter()
    try:
        with progress.working(stage):
            yield
    finally:
        Metrics.counter(NAMESPACE, stage).inc(round((time.perf_counter() - t0) * 1000))


def stage_counters(result: Any) -> dict[str, int]:
    """``{stage: ms}`` of a finished pipeline's ``privpipe.stage`` counters (committed
    values, else attempted where a runner reports only those); {} without metrics."""
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except (AttributeError, NotImplementedError, KeyError):
        return {}
    totals: dict[str, int] = {}
    for c in counters:
        value = c.committed if c.committed is not None else c.attempted
        if value is None:
            continue
        name = c.key.metric.name
        totals[name] = totals.get(name, 0) + int(value)
    return totals


class TimedDoFn(beam.DoFn):  # type: ignore[misc]
    """``fn`` with the time spent in its ``process`` (not downstream of what it yields)
    added to stage ``stage``: a one-line hook around an existing DoFn in a graph."""

    def __init__(self, stage: str, fn: beam.DoFn) -> None:
        super().__init__()
        self.stage = stage
        self.fn = fn

    def setup(self) -> None:
        self.fn.setup()

    def start_bundle(self) -> None:
        self.fn.start_bundle()

    def finish_bundle(self) -> Any:
        result = self.fn.finish_bundle()  # called now, as Beam would: its work runs here
        return None if result is None else self._timed(lambda: result)

    def teardown(self) -> None:
        self.fn.teardown()

    def default_type_hints(self) -> Any:  # the wrapped DoFn's, not those of ``*args``
        return self.fn.get_type_hints()

    def process(self, element: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._timed(lambda: self.fn.process(element, *args, **kwargs))

    def _timed(self, run: Callable[[], Iterable[Any] | None]) -> Iterator[Any]:
        """What ``run()`` gives, its time in the stage: the time spent making the items,
        not in what is done with them; their rows counted (a ``finish_bundle``'s windowed
        values by the value they carry)."""
        spent = 0.0
        t0 = time.perf_counter()
        try:
            result = run()
            for item in result if result is not None else ():
                spent += time.perf_counter() - t0
                value = item.value if isinstance(item, WindowedValue) else item
                progress.add_rows(self.stage, progress.rows_of(value))
                yield item
                t0 = time.perf_counter()
            spent += time.perf_counter() - t0
        finally:
            Metrics.counter(NAMESPACE, self.stage).inc(round(spent * 1000))


def timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (for ``beam.Map``/``FlatMap`` of a function returning a value) timed as
    ``stage``; it keeps ``fn``'s signature, so Beam sees the same type hints."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with stage_ms(stage):
            return fn(*args, **kwargs)

    return call


class TimedCombineFn(beam.CombineFn):  # type: ignore[misc]
    """``fn`` with the time of its add/merge/extract calls added to stage ``stage``."""

    def __init__(self, stage: str, fn: beam.CombineFn) -> None:
        super().__init__()
        self.stage = stage
        self.fn = fn

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self.fn.setup(*args, **kwargs)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self.fn.teardown(*args, **kwargs)

    def create_accumulator(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn.create_accumulator(*args, **kwargs)

    def add_input(self, mutable_accumulator: Any, element: Any, *args: Any, **kwargs: Any) -> Any:
        progress.add_rows(self.stage, progress.rows_of(element))
        with stage_ms(self.stage):
            return self.fn.add_input(mutable_accumulator, element, *args, **kwargs)

    def add_inputs(self, mutable_accumulator: Any, elements: Any, *args: Any, **kwargs: Any) -> Any:
        with stage_ms(self.stage):
            return self.fn.add_inputs(mutable_accumulator, elements, *args, **kwargs)

    def merge_accumulators(self, accumulators: Any, *args: Any, **kwargs: Any) -> Any:
        with stage_ms(self.stage):
            return self.fn.merge_accumulators(accumulators, *args, **kwargs)

    def compact(self, accumulator: Any, *args: Any, **kwargs: Any) -> Any:
        with stage_ms(self.stage):
            return self.fn.compact(accumulator, *args, **kwargs)

    def extract_output(self, accumulator: Any, *args: Any, **kwargs: Any) -> Any:
        with stage_ms(self.stage):
            return self.fn.extract_output(accumulator, *args, **kwargs)

    def get_accumulator_coder(self) -> Any:
        return self.fn.get_accumulator_coder()

    def default_type_hints(self) -> Any:
        return self.fn.get_type_hints()
