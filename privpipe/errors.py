"""The error taxonomy: each kind of failure maps to one process exit code.

Exit codes (DESIGN.md): 0 ok; 2 invalid config or arguments; 3 invalid input
data; 4 privacy refusal (guarantee not reachable, verification failed, budget
exhausted); 1 anything else. Messages name the file, the key path or the
row/column, and the fix.
"""


class PrivpipeError(Exception):
    """Base class of every error privpipe raises on purpose."""

    exit_code: int = 1


class ConfigError(PrivpipeError):
    """The config file or the command-line arguments are invalid (exit 2)."""

    exit_code = 2


class InputDataError(PrivpipeError):
    """The input data (or a hierarchy file) is invalid (exit 3)."""

    exit_code = 3


class PrivacyRefusal(PrivpipeError):
    """A guarantee cannot be reached or verified, or the budget is exhausted (exit 4)."""

    exit_code = 4


class OutputError(PrivpipeError):
    """The output folder cannot be written (exit 2: fix --output or output.dir)."""

    exit_code = 2


class OutputBusy(PrivpipeError):
    """Another live run holds the output folder (exit 1: wait for it, or use another
    folder). Transient, so not exit 2: a scheduler may retry."""

    exit_code = 1


class IOFailure(PrivpipeError):
    """The operating system failed a read or write (disk full, I/O error, a database that
    cannot be written): exit 1, naming the path."""

    exit_code = 1


def io_failure(exc: BaseException) -> IOFailure | None:
    """The I/O failure behind an unexpected exception (its causes included) as one message
    naming the path and the fix; None when it was not one."""
    import sqlite3

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and not isinstance(cur, FileNotFoundError):
            path = cur.filename if cur.filename is not None else "a file"
            why = cur.strerror or str(cur)
            return IOFailure(
                f"{path}: I/O error: {why}; free disk space or fix the permissions there and "
                "run again (nothing was published)"
            )
        if isinstance(cur, sqlite3.OperationalError):
            return IOFailure(
                f"the privacy ledger (budget.ledger) could not be written: {cur}; free disk "
                "space or fix the permissions of its folder and run again (nothing was "
                "published; a failed run's charges are marked failed)"
            )
        cur = cur.__cause__ or cur.__context__
    return None
