"""Driver-side stage timings (no Beam): where a run's wall time goes, per named stage.

``StageClock.stage(name)`` accumulates the wall seconds spent inside it (a stage entered
twice adds up); ``as_dict()`` gives ``{name: seconds}`` for ``manifest["timings"]``.
Pipeline-side stages are Beam counters (``transforms/timing.py``), merged in by the driver.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from privpipe import progress

NAMESPACE = "privpipe.stage"  # the Beam counters' namespace (milliseconds)


class StageClock:
    """Accumulated wall seconds per driver stage, in the order stages were first entered.

    Stages nest exclusively: time spent in an inner stage is not counted again in the one
    around it, so the stages add up to at most the wall time of the driver."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._inner: list[float] = []  # per open stage: seconds spent in its inner stages
        self.t0 = time.perf_counter()
        self.cpu0 = cpu_seconds()
        self.pipeline_ms: dict[str, int] = {}  # the pipeline's counters, once it finished

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the wall time spent inside the block (less its inner stages) to ``name``."""
        t0 = time.perf_counter()
        self._inner.append(0.0)
        progress.enter(name)
        try:
            yield
        finally:
            progress.leave(name)
            total = time.perf_counter() - t0
            inner = self._inner.pop()
            self.add(name, total - inner)
            if self._inner:
                self._inner[-1] += total

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + max(0.0, seconds)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self._seconds.items()}

    def timings(self) -> dict[str, Any]:
        """``manifest["timings"]``: wall, pipeline and CPU seconds since the clock started
        and every stage (the driver's, then the pipeline's counters)."""
        return {
            "wall_s": round(time.perf_counter() - self.t0, 3),
            "pipeline_s": round(self._seconds.get("pipeline", 0.0), 3),
            "cpu_s": round(cpu_seconds() - self.cpu0, 3),
            "stages": merge_stages(self.as_dict(), self.pipeline_ms),
        }


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


_ACTIVE: list[StageClock] = []


@contextmanager
def active(clock: StageClock) -> Iterator[StageClock]:
    """Make ``clock`` the one :func:`stage` adds to while the block runs (a run's driver)."""
    _ACTIVE.append(clock)
    try:
        yield clock
    finally:
        _ACTIVE.remove(clock)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block into the active clock's stage ``name``; nothing without one. Lets a
    step deep in the driver (e.g. the audit's utility) be timed with a one-line hook."""
    if not _ACTIVE:
        yield
        return
    with _ACTIVE[-1].stage(name):
        yield


def current() -> StageClock | None:
    """The active clock (None outside a run)."""
    return _ACTIVE[-1] if _ACTIVE else None


def merge_stages(driver: Mapping[str, float], pipeline_ms: Mapping[str, int]) -> dict[str, float]:
    """One ``{stage: seconds}``: the driver's stages, then the pipeline's counters (ms → s).

    A name in both (none expected) adds up."""
    merged = dict(driver)
    for name, ms in sorted(pipeline_ms.items()):
        merged[name] = round(merged.get(name, 0.0) + ms / 1000.0, 3)
    return merged


def slowest(stages: Mapping[str, float], n: int = 5) -> str:
    """The ``n`` slowest stages as one line: ``search:k5 41.2s, attacks 30.1s, ...``."""
    top = sorted(stages.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.1f}s" for k, v in top)
