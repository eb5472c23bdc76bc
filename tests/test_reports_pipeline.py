"""The comparative audit through `privpipe run` / `privpipe report`: files, sweeps, privacy."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from privpipe.pipelines.cli import main
from privpipe.pipelines.demo_data import write_csv
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger

UNIQUE = "Zebrafish poisoning"


class _Svg(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)


def demo_project(tmp: Path, rows: int = 3000) -> Path:
    """The demo config on a small demo input with one planted unique diagnosis."""
    data = write_csv(tmp / "input" / "demo.csv", rows, seed=7)
    lines = data.read_text().splitlines()
    head = lines[0].split(",")
    fields = lines[1].split(",")
    fields[head.index("diagnosis")] = UNIQUE
    lines[1] = ",".join(fields)
    data.write_text("\n".join(lines) + "\n")
    cfg = yaml.safe_load((Path(__file__).parent.parent / "configs" / "demo.yaml").read_text())
    demo = Path(__file__).parent.parent / "configs" / "demo"
    cfg["input"]["path"] = str(data)
    for h in cfg["hierarchies"].values():
        if "file" in h:
            h["file"] = str(demo.parent / h["file"])
    # the planted diagnosis needs a place in the diagnosis hierarchy
    dx = tmp / "diagnosis.csv"
    dx.write_text((demo / "hierarchies" / "diagnosis.csv").read_text() + f"{UNIQUE};other;*\n")
    cfg["hierarchies"]["diagnosis"]["file"] = str(dx)
    cfg["budget"]["ledger"] = str(tmp / "ledger.sqlite")
    cfg["budget"]["key_file"] = str(tmp / "ledger.key")  # heads beside it, in tmp
    cfg["output"]["dir"] = str(tmp / "out")
    cfg["attacks"]["targets"] = 1000
    # the planted record and the two-night comparisons need every person in the input: no
    # control holdout here (tests/test_control_holdout.py covers it)
    cfg["attacks"].pop("control", None)
    path = tmp / "demo.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("report")
    config = demo_project(tmp)
    provision_ledger(config)
    assert main(["run", str(config)]) == 0
    return config, tmp / "out"


def test_report_files_and_structure(demo_run: tuple[Path, Path]) -> None:
    _, out = demo_run
    audit = json.loads((internal_file(out, "audit.json")).read_text())
    html = (internal_file(out, "report.html")).read_text()
    parser = _Svg()
    parser.feed(html)
    assert parser.tags.count("svg") >= 2 and "script" not in parser.tags
    assert "http://" not in html.replace('xmlns="http://www.w3.org', "") or 'src="http' not in html
    for name in ("k5", "dp_diagnosis"):
        assert name in audit["releases"] and name in html
    k5 = audit["releases"]["k5"]
    assert (
        k5["attacks"]["homogeneity"]["rate"] < audit["baseline"]["attacks"]["homogeneity"]["rate"]
    )
    assert k5["utility"]["mean_relative_error"] > 0
    assert audit["attacker"]["targets"] == 1000
    # local DP beside central and multiparty noise on the same histogram (the sqrt(n) gap)
    models = audit["releases"]["ldp_diagnosis"]["error_by_model"]
    errors = [m["std_error"] for m in models]
    assert [m["parties"] for m in models][:2] == [1, 10] and errors == sorted(errors)
    assert errors[-1] > 10 * errors[0]
    assert "Central, multiparty and local error" in html
    ldp = audit["releases"]["ldp_diagnosis"]["attacks"]["ldp_report"]
    assert ldp["interval"][0] <= ldp["bound"] and ldp["rate"] > ldp["prior_success"]


def test_the_report_never_shows_a_planted_unique_value(demo_run: tuple[Path, Path]) -> None:
    _, out = demo_run
    published = (release_dir(out, "k5") / "data.csv").read_text()
    assert UNIQUE in published  # the k-anonymous table does publish sensitive values...
    for name in ("audit.json", "report.md", "report.html", "manifest.json"):
        assert UNIQUE not in internal_file(out, name).read_text(), name  # ...the audit never


def test_report_command_rebuilds_the_same_report(demo_run: tuple[Path, Path]) -> None:
    _, out = demo_run
    before = (internal_file(out, "report.html")).read_bytes()
    audit_before = json.loads((internal_file(out, "audit.json")).read_text())
    assert main(["report", str(out)]) == 0
    audit_after = json.loads((internal_file(out, "audit.json")).read_text())
    for name, entry in audit_before["releases"].items():
        assert audit_after["releases"][name]["utility"] == entry["utility"], name
    assert (internal_file(out, "report.html")).read_bytes() == before


def test_report_command_compares_runs_and_needs_an_output(
    demo_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = demo_run
    second = tmp_path / "second"
    # the next week's run: the continual count moves on to period 2
    assert main(["run", str(config), "--output", str(second), "--period", "2"]) == 0
    capsys.readouterr()
    assert main(["report", str(out), str(second)]) == 2
    assert "give --output DIR" in capsys.readouterr().err
    assert main(["report", str(out), str(second), "--output", str(tmp_path / "cmp")]) == 0
    audit = json.loads((tmp_path / "cmp" / "audit.json").read_text())
    assert len(audit["releases"]) > len(
        json.loads((internal_file(out, "audit.json")).read_text())["releases"]
    )
    assert (tmp_path / "cmp" / "report.html").is_file()


def test_sweep_expands_a_release_into_a_curve(tmp_path: Path) -> None:
    config = demo_project(tmp_path, rows=2000)
    cfg: dict[str, Any] = yaml.safe_load(config.read_text())
    cfg["releases"] = [
        {"name": "k", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05},
        {"name": "dp", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["diagnosis"],
         "partition_by": "sex", "max_partitions": 2},
    ]  # fmt: skip
    cfg["sweep"] = [{"release": "k", "k": [2, 10]}, {"release": "dp", "epsilon": [0.5, 2]}]
    cfg["attacks"] = {"targets": 500, "run": ["homogeneity", "membership"]}
    cfg["publish"] = ["dp-epsilon0.5", "dp-epsilon2"]  # published: charged to the ledger
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    provision_ledger(config)
    assert main(["run", str(config)]) == 0
    out = tmp_path / "out"
    manifest = json.loads((internal_file(out, "manifest.json")).read_text())
    assert manifest["releases"] == ["k-k2", "k-k10", "dp-epsilon0.5", "dp-epsilon2"]
    audit = json.loads((internal_file(out, "audit.json")).read_text())
    assert audit["sweeps"] == {
        "k: k": ["k-k2", "k-k10"],
        "dp: epsilon": ["dp-epsilon0.5", "dp-epsilon2"],
    }
    ledger = json.loads((internal_file(out, "manifest.json")).read_text())["budget"]
    assert ledger["spent"]["epsilon"] == 2.5  # published sweep points are charged
    # a larger k loses more: every 10-anonymous table is 2-anonymous, so the optimal search's
    # loss at k=2 is at most its loss at k=10 (a workload error under uniform spreading over
    # the public domain need not be monotone)
    k2, k10 = (audit["releases"][n]["information_loss"]["loss"] for n in ("k-k2", "k-k10"))
    assert k2 <= k10


def test_bad_sweep_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = demo_project(tmp_path, rows=200)
    cfg = yaml.safe_load(config.read_text())
    cfg["sweep"] = [{"release": "nope", "k": [2]}]
    config.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(config)]) == 2
    assert "sweep[0].release: no release named 'nope'" in capsys.readouterr().err
    cfg["sweep"] = [{"release": "k5", "k": [1]}]
    config.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(config)]) == 2
    assert "releases[0].k: must be an integer >= 2, got 1" in capsys.readouterr().err


def test_candidates_can_spend_from_a_separate_audit_ledger(tmp_path: Path) -> None:
    config = demo_project(tmp_path, rows=1000)
    cfg: dict[str, Any] = yaml.safe_load(config.read_text())
    cfg["releases"] = [
        {"name": "dp", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["diagnosis"],
         "partition_by": "sex", "max_partitions": 2},
        {"name": "dp_main", "kind": "dp_count", "epsilon": 0.5, "group_by": ["sex"]},
    ]  # fmt: skip
    cfg["sweep"] = [{"release": "dp", "epsilon": [0.5, 2]}]
    cfg["publish"] = ["dp_main"]
    cfg["budget"]["audit_ledger"] = str(tmp_path / "audit-ledger.sqlite")
    cfg["attacks"] = {"targets": 200, "run": ["membership"]}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    provision_ledger(config)
    assert main(["run", str(config)]) == 0
    manifest = json.loads((internal_file(tmp_path / "out", "manifest.json")).read_text())
    assert manifest["budget"]["spent"]["epsilon"] == 0.5  # only the published release
    assert manifest["candidate_budget"]["spent"]["epsilon"] == 2.5  # the sweep's points
    audit = json.loads((internal_file(tmp_path / "out", "audit.json")).read_text())
    assert audit["budget"]["audit_ledger"].endswith("audit-ledger.sqlite")
    assert "separate audit ledger" in (internal_file(tmp_path / "out", "report.html")).read_text()


def test_utility_truths_and_the_common_workload_on_the_demo(demo_run: tuple[Path, Path]) -> None:
    """Issue 13: dp_salary's own error is its means' error (small), not its counts'
    against visit rows; a person-bounded histogram's error is split into bounding bias
    (from the run's bounded cells) and noise; every release (and the raw table, at 0) is
    scored on the same common workload, which is summary.error."""
    _, out = demo_run
    audit = json.loads((internal_file(out, "audit.json")).read_text())
    releases = audit["releases"]
    salary = releases["dp_salary"]
    assert "means" in salary["utility"]["own"]["estimand"]
    assert salary["summary"]["own_error"] == salary["utility"]["own"]["mean_relative_error"]
    # scored on the published means themselves, one query per published category with a
    # bounded truth (not the planted person's category when the bounding kept another of
    # their visits: its true mean is then undefined)
    published = pd.read_csv(release_dir(out, "dp_salary") / "data.csv")
    assert len(published) - 1 <= salary["utility"]["own"]["queries"] <= len(published)
    assert len(published) >= 5
    own, counts = salary["summary"]["own_error"], salary["utility"]["mean_relative_error"]
    # noise-dependent, so a wide margin: over 11 runs the means' error was 0.09-0.39 and the
    # counts' 0.74-0.80 (an earlier `own < counts / 2` failed once in CI at 0.387 > 0.386);
    # exceeding the counts' error takes noise six times its typical size on most categories
    assert own < counts
    hist = releases["dp_diagnosis"]["utility"]
    assert hist["bias"]["mean_relative_error"] > hist["noise"]["mean_relative_error"] > 0
    assert "bounding, not noise" in hist["split"]
    sizes = {e["utility"]["common"]["queries"] for e in releases.values()}
    assert sizes == {audit["baseline"]["utility"]["common"]["queries"]}
    assert audit["baseline"]["summary"]["error"] == 0.0
    for e in releases.values():
        assert e["summary"]["error"] == e["utility"]["common"]["error"]
    assert releases["dp_diagnosis"]["utility"]["common"]["answered"] < sizes.pop()
    assert "full miss" in audit["methodology"]["utility"]["common"]


@pytest.mark.slow
def test_demo_dp_mean_own_error_is_small(tmp_path: Path) -> None:
    """The demo's dp_salary on `privpipe demo`'s default 20,000 visits (the one release:
    `run --only dp_salary`): its own error, its means against the true means, is small
    (< 20%), where scoring its counts against visit rows gave ~80%."""
    from privpipe.pipelines.run import run
    from tests.test_runners import demo_plan

    data = write_csv(tmp_path / "demo.csv", 20_000)
    run(demo_plan(tmp_path / "d", data, ("dp_salary",)), log=lambda _m: None)
    audit = json.loads(internal_file(tmp_path / "d", "audit.json").read_text())
    salary = audit["releases"]["dp_salary"]
    assert salary["summary"]["own_error"] < 0.20 < salary["utility"]["mean_relative_error"]
