"""Worker processes (privpipe/workers.py): one call each, answered or raised as it was
raised, progress relayed, the modules it is warmed with imported before the call, and
nothing left running after ``kill``; workers started ahead are handed out once, with
their imports done, and those never taken are killed."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from privpipe import progress
from privpipe import workers as workers_module
from privpipe.workers import (
    Worker,
    WorkerFailed,
    _Reporter,
    discard_prestarted,
    prestart,
    take,
    write_all,
)
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


def test_a_worker_started_ahead_is_taken_once_with_its_imports_done() -> None:
    prestart(("fractions",))
    [ahead] = workers()
    worker = take("release 'x'", ("fractions",), hint="the hint")
    assert [p.pid for p in workers()] == [ahead.pid] == [worker.proc.pid]
    assert workers_module._prestarted == []  # handed out once
    worker.send(time.sleep, 30)
    worker.kill()  # it carries the name it was taken under
    with pytest.raises(
        WorkerFailed, match=r"^release 'x': .*\(killed or out of memory\?\); the hint"
    ):
        worker.result()
    prestart(("fractions",))
    worker = take("import check", ("fractions",))
    worker.send(eval, "'fractions' in __import__('sys').modules")
    assert worker.result() is True
    assert workers() == [] and discard_prestarted() == 0


def test_a_worker_is_started_when_none_ahead_has_its_imports_or_lives() -> None:
    prestart(("fractions",))
    [ahead] = workers()
    other = take("other imports", ("decimal",))
    assert other.proc.pid != ahead.pid
    other.send(eval, "'fractions' in __import__('sys').modules")
    assert other.result() is False
    ahead.kill()  # dies before it is taken: a new one answers instead
    ahead.wait(timeout=10)
    worker = take("after a death", ("fractions",))
    assert worker.proc.pid != ahead.pid
    worker.send(math.factorial, 10)
    assert worker.result() == math.factorial(10)
    assert workers() == [] and workers_module._prestarted == []


def test_workers_started_ahead_and_never_taken_are_killed() -> None:
    prestart(("fractions",), count=2)
    assert len(workers()) == 2
    assert discard_prestarted() == 2
    assert workers() == [] and discard_prestarted() == 0


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


BIG = 48_000_000  # far beyond a pipe's buffer: the write blocks, and signals land mid-write


def _interrupted(n: int) -> bytes:
    """A call that catches SIGWINCH (a handler interrupts a blocked pipe write, which then
    returns short) and answers with ``n`` bytes."""
    signal.signal(signal.SIGWINCH, lambda *_: None)
    return b"x" * n


def _pester(pid: int | None, stop: threading.Event, thread: int | None = None) -> None:
    while not stop.is_set():
        with contextlib.suppress(ProcessLookupError):
            if thread is None:
                assert pid is not None
                os.kill(pid, signal.SIGWINCH)
            else:
                signal.pthread_kill(thread, signal.SIGWINCH)
        time.sleep(0.0002)


def _catches_sigwinch(pid: int) -> bool:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGWINCH - 1) & 1)
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_an_answer_interrupted_by_signals_arrives_whole() -> None:
    """A worker's answer written while signals interrupt it (a profiler attaching, a
    handler the call installed) once arrived truncated: 'pickle data was truncated'."""
    worker = Worker("signals")
    worker.send(_interrupted, BIG)
    deadline = time.monotonic() + 60
    while not _catches_sigwinch(worker.proc.pid):  # its handler is installed: pester it
        assert worker.proc.poll() is None and time.monotonic() < deadline, "worker gone"
        time.sleep(0.005)
    stop = threading.Event()
    pester = threading.Thread(target=_pester, args=(worker.proc.pid, stop))
    pester.start()
    try:
        answer = worker.result()
    finally:
        stop.set()
        pester.join()
    assert len(answer) == BIG


def test_a_call_sent_while_signals_interrupt_the_caller_arrives_whole() -> None:
    """The arguments too, pickled into the pipe while this process is interrupted: each
    write returns short here, and is resumed."""
    before = signal.signal(signal.SIGWINCH, lambda *_: None)
    stop = threading.Event()
    pester = threading.Thread(target=_pester, args=(None, stop, threading.get_ident()))
    try:
        worker = Worker("signals")
        pester.start()
        worker.send(len, b"y" * BIG)
        stop.set()
        assert worker.result() == BIG
    finally:
        stop.set()
        if pester.is_alive():
            pester.join()
        signal.signal(signal.SIGWINCH, before)


def test_what_the_call_prints_does_not_break_its_answer() -> None:
    worker = Worker("a print")
    worker.send(eval, "print('printed by the call') or 42")
    assert worker.result() == 42


def test_an_incomplete_answer_fails_naming_the_work() -> None:
    """The length ahead of the answer: one that stops short is a WorkerFailed, not an
    unpickling error from deep inside."""
    worker = Worker.__new__(Worker)
    worker.what, worker.hint = "release 'x'", ""
    short = "import sys, struct; sys.stdout.buffer.write(struct.pack('<Q', 100) + b'abc')"
    worker.proc = subprocess.Popen([sys.executable, "-c", short], stdout=subprocess.PIPE)
    worker.relay = threading.Thread(target=lambda: None)
    worker.relay.start()
    with pytest.raises(WorkerFailed, match=r"^release 'x': the worker's answer arrived incomplete"):
        worker.result()


def test_write_all_writes_any_contiguous_buffer_in_its_memory_order() -> None:
    """``pickle.dump`` hands large buffers over as they are: a Fortran-ordered one too."""
    import numpy as np

    fortran = np.asfortranarray(np.arange(12, dtype=np.int8).reshape(3, 4))
    read, write = os.pipe()
    assert write_all(write, memoryview(fortran)) == 12
    os.close(write)
    with os.fdopen(read, "rb") as got:
        assert got.read() == fortran.tobytes(order="A")
