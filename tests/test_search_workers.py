"""A run whose anonymised releases share one summary plans them in worker processes
(``SearchReleases`` → ``planning.plan_releases``) and publishes exactly what it publishes
planning them one after the other in-process; a refusal in a worker exits 4 with its
message; no worker is left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.pipelines.cli import main
from privpipe.transforms import planning
from tests.conftest import Project
from tests.layout import internal_file, release_dir
from tests.test_planning import workers

RELEASES = [
    {"name": "k2", "kind": "k_anonymity", "k": 2},
    {"name": "l2", "kind": "l_diversity", "k": 2, "l": 2},
]


def run(project: Project, out: Path, cores: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``privpipe run`` in this process on ``cores`` cores; the releases planned in workers."""
    in_workers: list[str] = []
    plan = planning._Workers.plan

    def counted(self: Any, spec: AnonymizationSpec, call: Any = None) -> planning.Planned:
        in_workers.append(str(spec.name))
        return plan(self, spec, call)

    monkeypatch.setattr(planning, "available_cores", lambda: cores)
    monkeypatch.setattr(planning._Workers, "plan", counted)
    code = main(["run", str(project.config), "--output", str(out)])
    assert code == 0
    assert workers() == []
    return in_workers


def published(out: Path, name: str) -> tuple[list[tuple[str, ...]], dict[str, Any]]:
    """The table's rows (sorted: the order is a fresh random shuffle) and release.json
    without the seconds the search took."""
    data = pd.read_csv(release_dir(out, name) / "data.csv", dtype=str, keep_default_na=False)
    doc = json.loads((release_dir(out, name) / "release.json").read_text())
    doc["search"] = {k: v for k, v in doc.get("search", {}).items() if "seconds" not in k}
    return sorted(map(tuple, data.to_numpy().tolist())), doc


@pytest.mark.slow
def test_worker_plans_publish_what_in_process_plans_publish(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.cfg["releases"] = RELEASES
    project.save()
    assert run(project, tmp_path / "one", 1, monkeypatch) == []
    assert run(project, tmp_path / "two", 2, monkeypatch) == ["l2"]  # the longer search
    for r in RELEASES:
        one, two = published(tmp_path / "one", r["name"]), published(tmp_path / "two", r["name"])
        assert two == one and two[1]["verified"] is True
    timings = json.loads(internal_file(tmp_path / "two", "manifest.json").read_text())["timings"]
    assert {"search", "search:k2", "search:l2"} <= set(timings["stages"])


@pytest.mark.slow
@pytest.mark.parametrize("first", [True, False], ids=["refused-first", "refused-second"])
def test_a_refusal_in_a_worker_exits_4_with_its_message(
    project: Project,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    first: bool,
) -> None:
    l5 = {"name": "l5", "kind": "l_diversity", "l": 5}  # 3 diseases: refused, in the worker
    project.cfg["releases"] = [l5, RELEASES[0]] if first else [RELEASES[0], l5]
    project.save()
    monkeypatch.setattr(planning, "available_cores", lambda: 2)
    code = main(["run", str(project.config), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "release 'l5': l=5 but disease has only 3 distinct values" in err
    assert not internal_file(tmp_path / "out", "manifest.json").exists()
    assert workers() == []


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_inside_a_step_stays_an_interrupt(signal_name: str) -> None:
    """Beam wraps a step's KeyboardInterrupt (Ctrl-C) or ``Terminated`` (SIGTERM, raised in
    the main thread, which may be inside a step such as the search) in a RuntimeError; the
    run unwraps it, so the CLI exits 130 or 143 as anywhere else, not 1 ("unexpected")."""
    from privpipe.pipelines.cli import Terminated
    from privpipe.pipelines.run import unwrap_pipeline_error

    interrupt: BaseException = KeyboardInterrupt() if signal_name == "SIGINT" else Terminated()
    try:
        try:
            raise interrupt
        except BaseException as e:
            raise RuntimeError(f"{type(e).__name__} [while running 'Search[k2]/Search']") from e
    except RuntimeError as wrapped:
        assert unwrap_pipeline_error(wrapped) is interrupt
    assert isinstance(unwrap_pipeline_error(RuntimeError("x")), RuntimeError)
