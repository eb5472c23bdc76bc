"""The publication boundary through `privpipe run` (issue 11, issue 12's sweep bypass)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from privpipe.pipelines.cli import main
from privpipe.pipelines.output import WORK_PREFIX
from tests.conftest import ROWS, Project
from tests.layout import candidate_dir, internal_file, public_dir
from tests.ledgers import provision_ledger

pytestmark = pytest.mark.slow

BUDGET = {"ledger": "ledger.sqlite", "lifetime_epsilon": 10}
K2_SEX = {"name": "k2", "kind": "k_anonymity", "k": 2, "max_levels": {"sex": 0}}
DP_SEX = {"name": "by_sex", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["sex"]}


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _run(p: Project, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    p.save()
    provision_ledger(p.config)
    return run_cli(["run", str(p.config), *extra], capsys)


def _manifest(out: Path) -> dict[str, Any]:
    return dict(json.loads(internal_file(out, "manifest.json").read_text()))


def test_exact_figures_stay_out_of_public(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plant distinctive figures (rows, persons, distinct values, rows kept by bounding,
    local DP reports) and find none of them in any file under public/."""
    rng = np.random.default_rng(17)  # test data only
    persons, rows = 2011, 5003
    pid = np.concatenate([np.arange(persons), rng.integers(0, persons, rows - persons)])
    codes = [f"z{i:04d}" for i in range(1201)]
    frame = pd.DataFrame(
        {
            "id": [f"p{i}" for i in pid],
            "sex": rng.choice(["F", "M"], rows),
            "code": np.concatenate([codes, rng.choice(codes, rows - len(codes))]),
        }
    )
    frame.to_csv(tmp_path / "data.csv", index=False)
    (tmp_path / "sex.csv").write_text("F;*\nM;*\n")
    cfg = {
        "name": "planted",
        "input": {"path": "data.csv"},
        "schema": {"quasi_identifiers": ["code"], "privacy_unit": "id"},
        "hierarchies": {"sex": {"file": "sex.csv"}},
        "releases": [
            {**DP_SEX, "max_contributions_per_partition": 2},
            {"name": "ldp", "kind": "local_dp", "epsilon": 1.0, "attribute": "sex"},
        ],
        "publish": ["by_sex", "ldp"],
        "report": {"enabled": False},
        "budget": BUDGET,
        "output": {"dir": "out"},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    provision_ledger(tmp_path / "c.yaml")
    code, _, err = run_cli(["run", str(tmp_path / "c.yaml")], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    m = _manifest(out)
    assert m["rows_accepted"] == rows and m["profile"]["columns"]["code"]["distinct"] == 1201
    kept = [q["rows_kept"] for q in m["dp_contribution_bounding"]["by_sex"].values()]
    assert kept and kept[0] < rows  # bounding dropped rows: a distinct figure
    planted = {rows, persons, 1201, *kept, m["local_dp"]["ldp"]["reports"]}
    files = [f for f in (out / "public").rglob("*") if f.is_file()]
    assert {f.name for f in files} >= {"data.csv", "release.json"}
    for f in files:
        numbers = {int(x) for x in re.findall(r"(?<![\d.])\d+(?![\d.])", f.read_text())}
        assert not numbers & planted, (f, numbers & planted)
    assert m["release_details"]["ldp"]["metrics"]["reports"] == persons


def test_linked_table_and_histogram_refused_unless_accepted(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg.update(releases=[K2_SEX, DP_SEX], publish=["k2", "by_sex"], budget=BUDGET)
    code, _, err = _run(project, capsys)
    assert code == 4, err
    assert "'k2'" in err and "'by_sex'" in err and "exact count" in err
    assert not project.out.exists() or not (project.out / "public").exists()
    project.cfg["accept_linked_releases"] = True
    code, _, err = _run(project, capsys)
    assert code == 0, err
    assert sorted(os.listdir(project.out / "public")) == ["by_sex", "k2"]
    audit = json.loads(internal_file(project.out, "audit.json").read_text())
    assert any("LINKED RELEASES PUBLISHED" in f for f in audit["findings"])
    for name, other in (("k2", "by_sex"), ("by_sex", "k2")):  # said where it is handed out
        doc = json.loads((public_dir(project.out, name) / "release.json").read_text())
        assert doc["linked_with"] == [other]
    # the same pair with the table coarser than the histogram is not linked
    coarse = {**K2_SEX, "name": "k2", "min_levels": {"sex": 1}, "max_levels": {}}
    project.cfg.update(releases=[coarse, DP_SEX], accept_linked_releases=False)
    code, _, err = _run(project, capsys)
    assert code == 0, err


def test_several_releases_without_publish_publish_nothing(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg["releases"] = [K2_SEX, {**K2_SEX, "name": "k3", "k": 3}]
    code, out, err = _run(project, capsys)
    assert code == 0, err
    assert "nothing published: 2 candidates compared" in out
    assert os.listdir(project.out / "public") == []
    assert candidate_dir(project.out, "k3").is_dir() and candidate_dir(project.out, "k2").is_dir()
    m = _manifest(project.out)
    assert m["published"] == [] and m["candidates"] == ["k2", "k3"]
    project.cfg["publish"] = ["k3"]
    code, out, err = _run(project, capsys)
    assert code == 0 and "published: k3" in out, err
    assert os.listdir(project.out / "public") == ["k3"]


def test_sweep_points_cannot_bypass_the_lifetime_budget(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 12: a published sweep point spends from the dataset's ledger, not from the audit
    ledger the run names; the third run at eps 5 against a lifetime of 10 is refused. (A
    fresh audit ledger per run is no longer possible at all: its heads record refuses it.)"""
    project.cfg.update(
        releases=[{**DP_SEX, "epsilon": 1.0}],
        sweep=[{"release": "by_sex", "epsilon": [5.0]}],
        publish=["by_sex-epsilon5.0"],
    )
    for i in range(3):
        project.cfg["budget"] = {**BUDGET, "audit_ledger": "audit.sqlite"}
        code, _, err = _run(project, capsys)
        assert code == (0 if i < 2 else 4), err
    assert "budget" in err.lower() or "epsilon" in err
    m = _manifest(project.out)  # the second run's output stands
    assert m["budget"]["spent"]["epsilon"] == 10.0
    # candidates (not published) never reach public/ and spend from the audit ledger only
    project.cfg.update(publish=[], budget={**BUDGET, "audit_ledger": "audit.sqlite"})
    code, _, err = _run(project, capsys)
    assert code == 0, err
    assert os.listdir(project.out / "public") == []
    m = _manifest(project.out)
    charged = m["candidate_budget"]["charged_this_run"]
    assert m["budget"] is None and sum(c["epsilon"] for c in charged.values()) == 5.0
    project.cfg["budget"] = {**BUDGET, "sweep_ledger": "old.sqlite"}
    code, _, err = _run(project, capsys)
    assert code == 2 and "audit_ledger" in err


def test_ledger_inside_output_survives_and_inside_public_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg.update(releases=[DP_SEX], budget={**BUDGET, "ledger": "out/ledger.sqlite"})
    for _ in range(2):
        code, _, err = _run(project, capsys)
        assert code == 0, err
    assert (project.out / "ledger.sqlite").is_file()
    assert _manifest(project.out)["budget"]["spent"]["epsilon"] == 2.0
    project.cfg["budget"] = {**BUDGET, "ledger": "out/public/ledger.sqlite"}
    code, _, err = _run(project, capsys)
    assert code == 2 and "budget.ledger" in err and "public/" in err


def test_empty_releases_leave_no_stale_release(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg["releases"] = [K2_SEX]
    assert _run(project, capsys)[0] == 0
    assert public_dir(project.out, "k2").is_dir()
    project.cfg["releases"] = []
    assert _run(project, capsys)[0] == 0
    assert os.listdir(project.out / "public") == []
    assert not (internal_file(project.out, "audit.json")).exists()
    assert _manifest(project.out)["releases"] == []


def _no_row_level_files(out: Path, work: Path) -> None:
    assert not [p for p in work.iterdir() if p.name.startswith(WORK_PREFIX)]
    if out.exists():
        assert not [n for n in os.listdir(out) if n.startswith(".privpipe")]
        assert not list(out.rglob("*.parquet")) and not list(out.rglob("*.pickle"))


def test_scratch_folder_is_gone_after_a_failing_run(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    work = project.root / "work"
    project.cfg["output"]["work_dir"] = str(work)
    project.cfg["releases"] = [K2_SEX]
    project.cfg["attacks"] = ["homogeneity"]
    project.cfg["input"]["max_rejected_fraction"] = 0.0
    project.write_rows([*ROWS, "10;47602;notanumber;Female;Flu"])  # one rejected row
    code, _, err = _run(project, capsys)
    assert code == 3, err
    _no_row_level_files(project.out, work)


def test_scratch_folder_is_gone_after_sigterm(project: Project) -> None:
    work = project.root / "work"
    project.cfg["output"]["work_dir"] = str(work)
    project.cfg["releases"] = [K2_SEX]
    project.cfg["attacks"] = ["homogeneity"]
    project.save()
    script = Path(sys.executable).with_name("privpipe")
    proc = subprocess.Popen(
        [str(script), "run", str(project.config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the run has its scratch folder
        if work.exists() and any(p.name.startswith(WORK_PREFIX) for p in work.iterdir()):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the run never created its scratch folder")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert proc.returncode == 143, err
    assert "terminated" in err
    _no_row_level_files(project.out, work)
    assert not (project.out / "public").exists()


def test_a_failed_run_removes_its_throw_away_candidates_ledger(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The private ledger of DP candidates (no audit ledger) goes when the run closes it,
    not whenever it is collected: here the failure's traceback keeps it alive, and a
    terminated run whose library thread is stranded ends by os._exit, which runs no
    finalizer (as one SIGTERM in a few did, leaving the folder in /tmp)."""
    import tempfile

    from privpipe.pipelines import run as run_module
    from privpipe.pipelines.plan import load_plan

    scratch = tmp_path / "tempdir"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    project.cfg.update(releases=[K2_SEX, DP_SEX], publish=["k2"], budget=BUDGET)
    project.save()
    provision_ledger(project.config)

    def failing(*args: Any) -> Any:
        assert [p.name for p in scratch.glob("privpipe-candidates-*")], "no candidates ledger"
        raise RuntimeError("the run failed here")

    monkeypatch.setattr(run_module, "_run", failing)
    with pytest.raises(RuntimeError, match="failed here") as failure:
        run_module.run(load_plan(project.config), log=lambda _: None)
    assert failure.value.__traceback__ is not None  # still holds the run's frames
    assert list(scratch.glob("privpipe-candidates-*")) == []


def test_duplicate_input_paths_are_read_once(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    (project.root / "same.csv").symlink_to(project.data)
    project.cfg["input"]["path"] = ["data.csv", "./data.csv", "*.csv"]
    project.cfg["releases"] = [{"name": "k3", "kind": "k_anonymity", "k": 3}]
    code, _, err = _run(project, capsys)
    assert code == 0, err
    m = _manifest(project.out)
    assert m["rows_accepted"] == 9
    assert len(m["input"]) == 1 and len(m["input_duplicates_skipped"]) == 3
    assert m["release_summaries"]["k3"]["verified"] is True
    table = pd.read_csv(public_dir(project.out, "k3") / "data.csv", dtype=str)
    assert len(table) == 9
