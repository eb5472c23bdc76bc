"""Worker processes: one picklable call each, in a fresh ``python``, beside the caller.

A worker is a fresh interpreter running ``serve()``: no fork of a threaded Beam process,
no re-import of the caller's ``__main__``. It first imports the ``warm`` modules it is
started with (so those imports overlap whatever the caller does until it sends the
call), then reads one pickled call (function, arguments) from its stdin, a pipe: the
arguments are pickled straight into it, never held pickled by the caller nor written to
disk. It writes the pickled result, or the exception, to its stdout behind its length,
and its progress lines (``privpipe.progress``) to a descriptor the caller relays into its
own tally.

Both pipes are written with :func:`write_all`: a write to a pipe that a signal interrupts
returns short (a profiler such as py-spy attaching, a handler the call installed), and
Python's buffered files passed that on silently, so the other end once read a truncated
pickle. The length lets the caller say so if an answer still arrives incomplete.

Workers ignore Ctrl-C: the caller kills them on any error or interrupt (``kill``), and a
worker exits by itself once its caller is gone, so none outlives the call. Used by the
searches planned beside each other (``transforms.planning``) and by the audit's
publication attacks (``pipelines.run``).

Started ahead (``prestart`` / ``take`` / ``discard_prestarted``): a worker's interpreter
start and its warm imports take ~1.2 s (the searches' ``privpipe.transforms.planning``
imports Beam, pandas and the pure cores), a delay on the critical path of a search that
starts the moment its summary is ready. A caller that knows a worker will be wanted
starts it early; ``take`` hands out such a worker (its imports done while the caller
worked) or a new one; ``discard_prestarted`` kills those never taken.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from privpipe import progress

__all__ = [
    "Worker",
    "WorkerFailed",
    "available_cores",
    "discard_prestarted",
    "prestart",
    "serve",
    "take",
]

WATCH_S = 1.0  # how often a worker checks that its caller is alive
PROGRESS_S = 1.0  # how often a worker reports its progress counts
LENGTH = struct.Struct("<Q")  # the answer's length, ahead of it


def write_all(fd: int, data: bytes | bytearray | memoryview | pickle.PickleBuffer) -> int:
    """Write every byte of ``data`` to ``fd``: a pipe write that a signal interrupts
    returns short, and is resumed here where a buffered file would have dropped the rest.
    ``data`` is any contiguous buffer (``pickle.dump`` hands over large ones as they are,
    C- or Fortran-ordered), written in its memory order."""
    view = pickle.PickleBuffer(data).raw()
    total = len(view)
    while view:
        view = view[os.write(fd, view) :]
    return total


class _PipeWriter:
    """The ``write`` that ``pickle.dump`` needs, writing all of each piece."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes | bytearray | memoryview | pickle.PickleBuffer) -> int:
        return write_all(self.fd, data)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class WorkerFailed(RuntimeError):
    """A worker process died without an answer (killed, out of memory)."""


class Worker:
    """One worker process for one call: ``send`` it, then ``result``; ``kill`` on any
    error. ``what`` names the work in errors ("release 'k5'"); ``hint`` ends the message
    of a worker that died."""

    def __init__(self, what: str, warm: Sequence[str] = (), hint: str = "") -> None:
        self.what = what
        self.hint = hint
        self.warm = tuple(warm)
        code = f"import sys; sys.path[:] = {sys.path!r}; import {__name__} as m; m.serve()"
        report, tell = os.pipe()  # the worker's progress, line by line
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(os.getpid()), str(tell), *warm],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(tell,),
            )
        except BaseException:
            os.close(report)
            raise
        finally:
            os.close(tell)
        self.relay = threading.Thread(target=_relay, args=(report,), daemon=True)
        self.relay.start()

    def send(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Pickle the call into the worker's stdin (streamed: large arrays go to the pipe
        without a pickled copy here). A worker that dies meanwhile is reported by
        ``result``."""
        assert self.proc.stdin is not None
        try:
            with self.proc.stdin as task:
                call = (fn, args, kwargs)
                pickle.dump(call, _PipeWriter(task.fileno()), protocol=pickle.HIGHEST_PROTOCOL)
        except (BrokenPipeError, ValueError):  # it died while reading (or was killed)
            pass

    def result(self) -> Any:
        """The call's result; its exception raised here as it was raised there."""
        assert self.proc.stdout is not None
        out = b""
        if not self.proc.stdout.closed:  # closed: killed
            with self.proc.stdout as answer:  # the worker writes once the call returned
                out = answer.read()
        self.proc.wait()
        self.relay.join(timeout=5)  # its last progress line is counted before we return
        if self.proc.returncode != 0 or not out:
            raise WorkerFailed(
                f"{self.what}: the worker process exited with code {self.proc.returncode} "
                f"(killed or out of memory?){'; ' + self.hint if self.hint else ''}"
            )
        size = LENGTH.size + (LENGTH.unpack_from(out)[0] if len(out) >= LENGTH.size else 0)
        if len(out) != size:
            raise WorkerFailed(
                f"{self.what}: the worker's answer arrived incomplete ({len(out):,} of "
                f"{size:,} bytes); run it again"
            )
        ok, value = pickle.loads(memoryview(out)[LENGTH.size :])
        if not ok:
            raise value
        return value

    def kill(self) -> None:
        """Kill the worker if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


_prestarted: list[Worker] = []  # started ahead (``prestart``), not yet taken
_prestart_lock = threading.Lock()


def prestart(warm: Sequence[str], count: int = 1) -> None:
    """Start ``count`` workers now, importing ``warm`` while this process goes on, for
    ``take`` to hand out later. No process to be had (limits): nothing is started, and
    ``take`` starts its worker then, as without this."""
    for _ in range(count):
        try:
            worker = Worker("a worker started ahead", warm)
        except OSError:
            return
        with _prestart_lock:
            _prestarted.append(worker)


def take(what: str, warm: Sequence[str] = (), hint: str = "") -> Worker:
    """A worker for one call: one started ahead with the same ``warm`` modules and still
    alive, named ``what``, or else a new one."""
    with _prestart_lock:
        worker = next((w for w in _prestarted if w.warm == tuple(warm)), None)
        if worker is not None:
            _prestarted.remove(worker)
    if worker is not None:
        if worker.proc.poll() is None:
            worker.what, worker.hint = what, hint
            return worker
        worker.kill()  # died meanwhile (killed from outside): reaped, and a new one
    return Worker(what, warm, hint)


def discard_prestarted() -> int:
    """Kill the workers started ahead that were never taken; how many there were."""
    with _prestart_lock:
        left = list(_prestarted)
        _prestarted.clear()
    for worker in left:
        worker.kill()
    return len(left)


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
        """Write what was gained since the last line; nothing once closed (the loop may
        wake just as :meth:`close` runs)."""
        with self.lock:
            if self.out.closed:
                return
            with contextlib.suppress(OSError):  # the caller stopped listening: progress only
                self._write()

    def _write(self) -> None:
        for stage, (n, unit) in progress.snapshot().items():
            gained = n - self.sent.get(stage, 0)
            if gained > 0:
                self.out.write(f"{stage}\t{unit}\t{gained}\n")
                self.sent[stage] = n
        self.out.flush()

    def close(self) -> None:
        """Send the last line and close, under the lock the loop's sends take."""
        self.done.set()
        with self.lock:
            if self.out.closed:
                return
            try:
                self._write()
                self.out.close()
            except OSError:  # the caller stopped listening: progress only
                pass


def serve() -> None:
    """A worker's main: argv is the caller's pid, the progress descriptor and the modules
    to import at once; the call from stdin, (ok, result | error) to stdout behind its
    length."""
    caller = int(sys.argv[1])
    reporter = _Reporter(int(sys.argv[2]))
    reply = os.dup(sys.stdout.fileno())  # the answer's own descriptor: whatever the call
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints goes to stderr instead
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the caller stops us (no traceback)
    threading.Thread(target=_exit_with, args=(caller,), daemon=True).start()
    for module in sys.argv[3:]:
        importlib.import_module(module)
    fn, args, kwargs = pickle.load(sys.stdin.buffer)
    answer: tuple[bool, object]
    try:
        answer = (True, fn(*args, **kwargs))
    except Exception as e:  # the caller raises it as its own
        answer = (False, e)
    del fn, args, kwargs
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle: its type and message
        data = pickle.dumps((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
    reporter.close()
    write_all(reply, LENGTH.pack(len(data)))
    write_all(reply, data)


def _exit_with(caller: int) -> None:
    """Exit as soon as the caller is gone (killed with no chance to stop its workers)."""
    while os.getppid() == caller:
        time.sleep(WATCH_S)
    os._exit(1)
