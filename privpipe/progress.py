"""Progress of a long run: rows per pipeline stage and the driver's current step, reported
while the run goes on (no Beam).

The pipeline's timed steps (``transforms/timing.py``) add the rows they handle to a
process-local tally (:func:`add_rows`); the driver's stages (``privpipe.timing.stage``)
say when they start (:func:`enter`). A :class:`Reporter` thread reads both: on a terminal
it rewrites one status line on stderr about once a second; otherwise (a scheduler's log) it
writes a plain line every ``every`` seconds through the run's log. Row counts exist only
where the steps run in this process (the DirectRunner's in-memory mode); on other runners
the lines show the elapsed time and the step, and say that counts are on the workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

_LOCK = threading.Lock()


@dataclass
class _State:
    rows: dict[str, int] = field(default_factory=dict)  # pipeline stage -> rows so far
    units: dict[str, str] = field(default_factory=dict)  # stage -> what it counts (rows)
    busy: dict[str, list[float]] = field(default_factory=dict)  # stage -> open block starts
    driver: list[tuple[str, float]] = field(default_factory=list)  # open driver stages


_STATE = _State()


def add_rows(stage: str, rows: int, unit: str = "rows") -> None:
    """``rows`` more handled by pipeline stage ``stage`` (called from DoFns; thread-safe);
    ``unit`` says what is counted (the search counts "nodes checked")."""
    if rows > 0:
        with _LOCK:
            _STATE.rows[stage] = _STATE.rows.get(stage, 0) + rows
            _STATE.units.setdefault(stage, unit)


def snapshot() -> dict[str, tuple[int, str]]:
    """Every stage's count so far and its unit (a planning worker reports these)."""
    with _LOCK:
        return {k: (n, _STATE.units.get(k, "rows")) for k, n in _STATE.rows.items()}


@contextmanager
def working(stage: str) -> Iterator[None]:
    """Pipeline stage ``stage`` is busy while the block runs (a search, a verification)."""
    with _LOCK:
        _STATE.busy.setdefault(stage, []).append(time.perf_counter())
    try:
        yield
    finally:
        with _LOCK:
            starts = _STATE.busy.get(stage) or [0.0]
            starts.pop()
            if not starts:
                _STATE.busy.pop(stage, None)


def enter(stage: str) -> None:
    """The driver entered stage ``stage``."""
    with _LOCK:
        _STATE.driver.append((stage, time.perf_counter()))


def leave(stage: str) -> None:
    """The driver left stage ``stage``."""
    with _LOCK:
        for i in range(len(_STATE.driver) - 1, -1, -1):
            if _STATE.driver[i][0] == stage:
                del _STATE.driver[i]
                break


def reset() -> None:
    """Forget every tally (a new run in this process)."""
    with _LOCK:
        _STATE.rows.clear()
        _STATE.units.clear()
        _STATE.busy.clear()
        _STATE.driver.clear()


def rows_of(item: Any) -> int:
    """Rows of a batch a step yields: a DataFrame/Arrow table/array, or the last member of
    a tagged tuple; 0 for anything else (a single record is not counted)."""
    if isinstance(item, tuple) and item:
        item = item[-1]
    shape = getattr(item, "shape", None)
    if isinstance(shape, tuple) and shape:
        return int(shape[0])
    return 0


def status(
    now: float, t0: float, before: Mapping[str, int], seconds: float
) -> tuple[str, dict[str, int]]:
    """One line: elapsed time, the driver's current step, then each pipeline stage that moved
    since ``before`` (rows so far and rows/s over the last ``seconds``) or is busy; and the
    rows per stage now (the next call's ``before``)."""
    with _LOCK:
        rows = dict(_STATE.rows)
        units = dict(_STATE.units)
        busy = {k: min(v) for k, v in _STATE.busy.items() if v}
        driver = list(_STATE.driver)
    head = f"{now - t0:.0f}s"
    if driver:
        name, since = driver[-1]
        head += f" {name} ({now - since:.0f}s)"
    shown = []
    for name, n in rows.items():
        if n == before.get(name, 0):
            continue
        rate = (n - before.get(name, 0)) / max(seconds, 1e-9)
        line = f"{name} {n:,} {units.get(name, 'rows')} ({rate:,.0f}/s)"
        if name in busy:
            line += f", busy {now - busy.pop(name):.0f}s"
        shown.append(line)
    shown += [f"{name} busy {now - since:.0f}s" for name, since in busy.items()]
    return head + (": " + "; ".join(shown) if shown else ""), rows


class Reporter:
    """Reports :func:`status` while a run goes on (a daemon thread; stop with :meth:`stop`).

    ``tty``: a stream that is a terminal gets one rewritten line about every second;
    otherwise ``log`` gets a plain line every ``every`` seconds (0: never)."""

    def __init__(
        self,
        log: Callable[[str], None],
        tty: TextIO | None = None,
        every: float = 30.0,
    ) -> None:
        self.log, self.tty, self.every = log, tty, every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = time.perf_counter()
        self.lines = 0

    def start(self) -> Reporter:
        if self.tty is None and self.every <= 0:
            return self
        self._thread = threading.Thread(target=self._loop, name="privpipe-progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        interval = 1.0 if self.tty is not None else self.every
        before: dict[str, int] = {}
        last = self.t0
        while not self._stop.wait(interval):
            now = time.perf_counter()
            text, before = status(now, self.t0, before, now - last)
            last = now
            line = "privpipe: " + text
            self.lines += 1
            if self.tty is not None:
                width = 119
                self.tty.write("\r" + line[:width].ljust(width))
                self.tty.flush()
            else:
                self.log(line)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.tty is not None and self.lines:
            self.tty.write("\r" + " " * 119 + "\r")
            self.tty.flush()
