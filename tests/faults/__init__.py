"""Helpers of the fault corpus (tests/test_faults.py): runs killed or raced on purpose."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from privpipe.errors import PrivpipeError
from privpipe.pipelines.output import KILL_ENV, RunOutput

FILES = ("manifest.json", "report.md", "audit.json")


def _nothing() -> None:
    pass


def stage_and_commit(
    out_dir: Path, run_id: str, before_commit: Callable[[], None] = _nothing
) -> int:
    """Publish one run into ``out_dir``: internal/{manifest.json,report.md,audit.json} and
    public/<run_id>/data.csv, each holding ``run_id``. Returns 0, or the PrivpipeError's
    exit code (its message on stderr)."""
    try:
        out = RunOutput(out_dir, run_id)
    except PrivpipeError as e:
        os.write(2, f"privpipe: error: {e}\n".encode())
        return e.exit_code
    for name in FILES:
        (out.internal / name).write_text(run_id)
    (out.releases / run_id).mkdir()
    (out.releases / run_id / "data.csv").write_text(run_id)
    out.arrange([run_id])
    before_commit()
    out.commit()
    return 0


def forked(fn: Callable[[], int], kill_at: str | None = None) -> int:
    """Run ``fn`` in a forked child (``PRIVPIPE_TEST_KILL_AT=kill_at`` there only) and
    return its wait status: the exit code, or minus the signal that ended it."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            if kill_at:
                os.environ[KILL_ENV] = kill_at
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
