"""Progress of long runs (privpipe/progress.py): rows and rates per pipeline stage, busy
stages, the driver's step; plain lines for logs, one rewritten line on a terminal."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pandas as pd
import pytest

from privpipe import progress
from privpipe.pipelines.cli import main
from privpipe.timing import StageClock
from tests.conftest import Project


@pytest.fixture(autouse=True)
def _fresh() -> None:
    progress.reset()


def test_rows_of_batches() -> None:
    frame = pd.DataFrame({"a": range(7)})
    assert progress.rows_of(frame) == 7
    assert progress.rows_of(("path", 3, frame)) == 7  # a tagged batch
    assert progress.rows_of(("k", 1)) == 0 and progress.rows_of("record") == 0


def test_status_shows_moving_and_busy_stages_and_the_driver_step() -> None:
    progress.add_rows("read", 1000)
    progress.add_rows("summary", 10)
    text, rows = progress.status(time.perf_counter(), time.perf_counter() - 5, {"read": 0}, 2.0)
    assert "read 1,000 rows (500/s)" in text and "summary 10 rows (5/s)" in text
    text, rows = progress.status(time.perf_counter(), time.perf_counter(), rows, 2.0)
    assert "read" not in text  # nothing moved since the last line
    clock = StageClock()
    with clock.stage("attacks"), progress.working("search"):
        text, _ = progress.status(time.perf_counter(), time.perf_counter(), rows, 1.0)
    assert " attacks (0s)" in text and "search busy 0s" in text
    text, _ = progress.status(time.perf_counter(), time.perf_counter(), rows, 1.0)
    assert "attacks" not in text and "busy" not in text


def test_reporter_plain_lines_for_logs() -> None:
    lines: list[str] = []
    reporter = progress.Reporter(lines.append, None, every=0.05).start()
    progress.add_rows("read", 5)
    time.sleep(0.3)
    reporter.stop()
    assert len(lines) >= 2 and all(line.startswith("privpipe: ") for line in lines)
    assert any("read 5 rows" in line for line in lines)
    n = len(lines)
    time.sleep(0.15)
    assert len(lines) == n  # stopped


def test_reporter_off_and_terminal_line() -> None:
    lines: list[str] = []
    progress.Reporter(lines.append, None, every=0).start().stop()
    assert lines == []
    tty = io.StringIO()
    reporter = progress.Reporter(lines.append, tty, every=30).start()
    time.sleep(1.3)
    reporter.stop()
    out = tty.getvalue()
    assert lines == [] and out.startswith("\rprivpipe: ") and out.endswith("\r")
    assert out.rstrip("\r").endswith(" " * 50)  # the status line is cleared at the end


def test_run_reports_progress_lines(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(project.config), "--progress", "0.01"])  # a tick even in a 0.2 s run
    out = capsys.readouterr().out
    assert code == 0
    ticks = [ln for ln in out.splitlines() if re.match(r"privpipe: \d+s( |:|$)", ln)]
    assert ticks, out
    assert main(["run", str(project.config), "--progress", "0.2", "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["run", str(project.config), "--progress", "-1"]) == 2


def test_status_counts_nodes_and_joins_a_busy_stage() -> None:
    progress.add_rows("search", 40, "nodes checked")
    with progress.working("search"):
        text, _ = progress.status(time.perf_counter(), time.perf_counter(), {}, 2.0)
    assert "search 40 nodes checked (20/s), busy 0s" in text
    assert text.count("search") == 1


def test_a_timed_step_counts_the_rows_its_bundle_end_emits() -> None:
    """A DoFn that emits batches at its bundle's end (windowed values, as ``_OnThreads``
    does) has them counted as rows of its stage, as if ``process`` had yielded them."""
    import apache_beam as beam
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    from privpipe.transforms.timing import TimedDoFn

    class Late(beam.DoFn):  # type: ignore[misc]
        def process(self, element: int) -> Any:
            yield pd.DataFrame({"a": range(element)})

        def finish_bundle(self) -> Any:
            yield WindowedValue(pd.DataFrame({"a": range(5)}), MIN_TIMESTAMP, (GlobalWindow(),))

    fn = TimedDoFn("late", Late())
    fn.start_bundle()
    out = list(fn.process(3)) + [w.value for w in fn.finish_bundle()]
    assert [len(f) for f in out] == [3, 5]
    assert progress.snapshot()["late"][0] == 8
