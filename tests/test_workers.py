"""Worker processes (privpipe/workers.py): one call each, answered or raised as it was
raised, progress relayed, the modules it is warmed with imported before the call, and
nothing left running after ``kill``."""

from __future__ import annotations

import math
import os
import time

import pytest

from privpipe import progress
from privpipe.workers import Worker, WorkerFailed, _Reporter
from tests.test_planning import workers


def test_a_call_is_answered() -> None:
    worker = Worker("a factorial")
    worker.send(math.factorial, 25)
    assert worker.result() == math.factorial(25)
    assert workers() == []


def test_its_exception_is_raised_here_unchanged() -> None:
    worker = Worker("a parse")
    worker.send(int, "not a number")
    with pytest.raises(ValueError, match=r"invalid literal for int\(\) with base 10"):
        worker.result()
    assert workers() == []


def test_a_killed_worker_fails_naming_the_work_and_the_hint() -> None:
    worker = Worker("release 'x'", hint="run with fewer releases")
    worker.send(time.sleep, 30)
    worker.kill()
    with pytest.raises(WorkerFailed, match=r"^release 'x': the worker process exited with code"):
        worker.result()
    assert workers() == []


def test_warm_modules_are_imported_before_the_call() -> None:
    asked = "'fractions' in __import__('sys').modules"
    cold, warm = Worker("cold"), Worker("warm", warm=("fractions",))
    cold.send(eval, asked)
    warm.send(eval, asked)
    assert (cold.result(), warm.result()) == (False, True)


def test_progress_counted_there_is_counted_here() -> None:
    before = progress.snapshot().get("worker test", (0, ""))[0]
    worker = Worker("progress")
    worker.send(eval, "__import__('privpipe.progress').progress.add_rows('worker test', 7)")
    worker.result()
    assert progress.snapshot()["worker test"][0] == before + 7


def test_a_reporter_woken_after_closing_writes_nothing_and_raises_nothing() -> None:
    """The worker's progress loop can wake just as the call ends: a send after close is a
    no-op (once printed 'Exception in thread ... _loop' into a demo run's output)."""
    read, write = os.pipe()
    progress.add_rows("reporter test", 3)
    reporter = _Reporter(write)
    reporter.close()
    reporter.send()  # what the loop does when it wakes late
    reporter.close()
    with os.fdopen(read, encoding="utf-8") as lines:
        sent = [line for line in lines if line.startswith("reporter test\t")]
    assert len(sent) == 1
