"""The publication attacks in a worker process (``pipelines.audit.PublicationAttacks``,
used from ``AUDIT_WORKER_ROWS`` accepted rows on two cores or more): the same entries as
the in-line call on the same staged run, and no worker left by a run that fails after
the worker was sent its work."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from privpipe.errors import PrivacyRefusal
from privpipe.pipelines import audit
from privpipe.pipelines import run as run_module
from privpipe.pipelines.cli import main
from privpipe.pipelines.pubattacks import publication_attacks
from tests.layout import internal_file
from tests.test_planning import workers


@pytest.fixture
def in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "AUDIT_WORKER_ROWS", 0)
    monkeypatch.setattr(audit, "available_cores", lambda: 2)


@pytest.mark.slow
@pytest.mark.usefixtures("in_a_worker")
def test_the_worker_finds_what_the_call_in_line_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[Any, Any]] = []
    write_audit = run_module.write_audit

    def both(*args: Any, publication: Any = None, **kwargs: Any) -> Any:
        plan, staging, raw, hierarchies, _, manifest, loaded = args
        assert isinstance(publication, audit.PublicationAttacks)
        releases = audit.audited_releases(plan, staging, loaded, kwargs["work"])
        in_line = publication_attacks(
            plan, releases, raw, hierarchies, manifest["publication"], kwargs["targets"]
        )
        compared.append((publication.result(), in_line))
        return write_audit(*args, publication=None, **kwargs)

    monkeypatch.setattr(run_module, "write_audit", both)
    assert main(["demo", "--rows", "400", "--output", str(tmp_path / "d")]) == 0
    ((from_worker, in_line),) = compared
    assert from_worker == in_line
    manifest = json.loads(internal_file(tmp_path / "d", "manifest.json").read_text())
    assert manifest["timings"]["stages"][audit.WORKER_STAGE] > 0
    assert sum(len(entries) for entries in from_worker.values()) >= 3
    assert workers() == []


@pytest.mark.slow
@pytest.mark.usefixtures("in_a_worker")
def test_the_plots_are_drawn_while_the_worker_attacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's plots are drawn once, before the driver waits for the worker's
    entries, and they are the report's plots."""
    from privpipe.reports import render

    events: list[str] = []
    drawn: list[render.Figures] = []
    draw, result = render.render_figures, audit.PublicationAttacks.result

    def drawing(view: Any) -> render.Figures:
        events.append("drawn")
        drawn.append(draw(view))
        return drawn[-1]

    def awaited(self: audit.PublicationAttacks) -> Any:
        events.append("awaited")
        return result(self)

    monkeypatch.setattr(render, "render_figures", drawing)
    monkeypatch.setattr(audit.PublicationAttacks, "result", awaited)
    assert main(["demo", "--rows", "400", "--output", str(tmp_path / "d")]) == 0
    assert events == ["drawn", "awaited"]
    html = internal_file(tmp_path / "d", "report.html").read_text(encoding="utf-8")
    plots = [drawn[0].tradeoff, *(svg for _, svg in drawn[0].attacks)]
    assert len([p for p in plots if p]) >= 2 and all(p in html for p in plots if p)
    assert workers() == []


@pytest.mark.slow
@pytest.mark.usefixtures("in_a_worker")
def test_a_run_failing_after_the_work_was_sent_leaves_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent: list[bool] = []

    def counted(self: audit.PublicationAttacks, *args: Any) -> None:
        sent.append(self.worker.proc.poll() is None)
        self.worker.send(time.sleep, 120)  # work still running when the run fails

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise PrivacyRefusal("the common attacker failed (test)")

    monkeypatch.setattr(audit.PublicationAttacks, "send", counted)
    monkeypatch.setattr(run_module, "run_common", failing)
    out = tmp_path / "d"
    assert main(["demo", "--rows", "400", "--output", str(out)]) == 4
    assert "the common attacker failed (test)" in capsys.readouterr().err
    assert sent == [True]  # the worker was running and got (slow) work
    assert workers() == []
    assert not internal_file(out, "manifest.json").exists()


def test_without_a_process_to_be_had_the_attacks_run_in_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(audit, "wants_audit", lambda plan: True)
    monkeypatch.setattr(audit, "available_cores", lambda: 2)
    started = audit.audit_worker(None, 10**6)  # type: ignore[arg-type]
    assert isinstance(started, audit.PublicationAttacks)
    started.kill()
    monkeypatch.setattr(subprocess, "Popen", refused)
    assert audit.audit_worker(None, 10**6) is None  # type: ignore[arg-type]
