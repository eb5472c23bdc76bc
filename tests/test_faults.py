"""The fault corpus (issue 17 item 7): every bad input or fault the sweep found, each with
the exit code, a message naming the file/key/line and the fix, earlier output untouched
and the ledger consistent.

Most cases run in-process (``privpipe validate``, the loaders, RunOutput); the few that
need another process (kill -9 during a commit, two runs racing) start a small child
(tests/faults/commit_child.py), never a Beam pipeline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines.output import KILL_ENV, RunOutput
from privpipe.errors import OutputBusy

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "faults" / "commit_child.py"
FILES = ("manifest.json", "report.md", "audit.json")


# ------------------------------------------------------------------ publishing (commit)


def _child(out: Path, run_id: str, *extra: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(out), run_id, *extra],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _publish(
    out: Path, run_id: str, kill_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = _child(out, run_id, env={KILL_ENV: kill_at} if kill_at else None)
    stdout, stderr = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _which_run(out: Path) -> str:
    """The one run DIR's public/ and internal/ come from; fails on a mix or a gap."""
    public = sorted(os.listdir(out / "public"))
    seen = {(out / "internal" / f).read_text() for f in FILES}
    assert len(public) == 1 and seen == {public[0]}, f"a mix: public {public}, internal {seen}"
    assert (out / "public" / public[0] / "data.csv").read_text() == public[0]
    return public[0]


POINTS = [  # (where the commit is killed, which run DIR shows after the next run's recovery)
    ("commit:start", "old"),
    ("commit:ready", "new"),
    ("commit:public-aside", "new"),
    ("commit:public-in", "new"),
    ("commit:internal-aside", "new"),
    ("commit:internal-in", "new"),
    ("commit:swapped", "new"),
]


@pytest.mark.parametrize(("point", "after"), POINTS)
def test_commit_killed_at_each_step_recovers_whole(tmp_path: Path, point: str, after: str) -> None:
    """kill -9 anywhere in the commit: the next run finds DIR as one run left it (the old
    one before the commit was marked ready, the new one after), says what it did, and no
    ``.privpipe-*`` folder outlives it."""
    out = tmp_path / "out"
    assert _publish(out, "old").returncode == 0
    killed = _publish(out, "new", kill_at=point)
    assert killed.returncode == -signal.SIGKILL
    nxt = RunOutput(out, "next")
    assert nxt.notes, "recovery must say what it did"
    joined = "\n".join(nxt.notes)
    assert str(out) in joined
    if after == "new":
        assert "finished the publication of run new" in joined or "removed" in joined
    nxt.abort()
    assert sorted(os.listdir(out)) == ["internal", "public"]
    assert _which_run(out) == after


def test_two_runs_into_one_output_folder_one_fails_cleanly(tmp_path: Path) -> None:
    """Two processes: the second fails at once (exit 1, names the folder, what to do) and
    the first publishes all its files."""
    out = tmp_path / "out"
    assert _publish(out, "old").returncode == 0
    first = _child(out, "first", "wait")
    assert first.stdout is not None and first.stdout.readline().strip() == "staged"
    second = _publish(out, "second")
    assert second.returncode == OutputBusy.exit_code == 1
    assert str(out) in second.stderr and "another privpipe run is writing" in second.stderr
    assert "choose another folder with --output" in second.stderr
    assert _which_run(out) == "old"  # the loser touched nothing
    _, stderr = first.communicate("go\n", timeout=30)
    assert first.returncode == 0, stderr
    assert sorted(os.listdir(out)) == ["internal", "public"]
    assert _which_run(out) == "first"
    assert _publish(out, "third").returncode == 0  # the lock went with the first run


def test_empty_publication_replaces_the_old_one_whole(tmp_path: Path) -> None:
    """``releases: []``: no old release, audit or report stays beside the new manifest."""
    out = tmp_path / "out"
    assert _publish(out, "old").returncode == 0
    run = RunOutput(out, "empty")
    (run.internal / "manifest.json").write_text('{"releases": []}')
    run.commit()
    assert os.listdir(out / "public") == []
    assert os.listdir(out / "internal") == ["manifest.json"]
