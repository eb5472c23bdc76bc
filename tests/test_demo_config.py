"""The demo config fitted to `privpipe demo --rows N` (pure: from N, never from the data)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from privpipe.errors import ConfigError
from privpipe.pipelines.cli import DEMO_CONFIG
from privpipe.pipelines.config import validate_config
from privpipe.pipelines.demo_config import BASE_MAX_UNITS, adapt, demo_config_for, demo_size
from privpipe.pipelines.plan import load_plan

DEMO = yaml.safe_load(DEMO_CONFIG.read_text(encoding="utf-8"))


def test_demo_size_grows_in_powers_of_ten_from_the_config_bound() -> None:
    assert demo_size(50).max_units == BASE_MAX_UNITS == 10_000_000
    assert demo_size(10_000_000).max_units == 10_000_000
    big = demo_size(18_000_001)
    assert big.max_units == 100_000_000 and big.max_delta == pytest.approx(1e-9)
    assert demo_size(50).max_targets == 50
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match="positive integer"):
            demo_size(bad)


@pytest.mark.parametrize("rows", [5_000, 20_000, 1_000_000, 10_000_000])
def test_the_config_as_written_where_it_fits(rows: int) -> None:
    adapted, changes = adapt(DEMO, rows)
    assert changes == [] and adapted == DEMO


def test_small_n_samples_no_more_targets_than_persons() -> None:
    adapted, changes = adapt(DEMO, 50)
    assert adapted["attacks"]["targets"] == 50
    assert changes == ["attacks.targets: 5000 -> 50"]
    assert DEMO["attacks"]["targets"] == 5000  # the input is not changed
    validate_config(adapted, "demo.yaml")


def test_large_n_raises_max_units_and_lowers_delta_below_it() -> None:
    adapted, changes = adapt(DEMO, 20_000_000)
    assert adapted["schema"]["max_units"] == 100_000_000
    zip_release = next(r for r in adapted["releases"] if r["name"] == "dp_zip")
    assert zip_release["delta"] == pytest.approx(1e-9)
    assert "schema.max_units: 10000000 -> 100000000" in changes
    validate_config(adapted, "demo.yaml")
    # max_units raised alone would be refused: delta 1e-8 is not below 1/1e8
    raised_only = yaml.safe_load(DEMO_CONFIG.read_text(encoding="utf-8"))
    raised_only["schema"]["max_units"] = 100_000_000
    with pytest.raises(ConfigError, match=r"not below 1/schema\.max_units"):
        validate_config(raised_only, "demo.yaml")


def test_the_adapted_copy_loads_with_the_demo_hierarchies(tmp_path: Path) -> None:
    same, changes = demo_config_for(DEMO_CONFIG, tmp_path / "demo.yaml", 20_000)
    assert same == DEMO_CONFIG and changes == [] and not (tmp_path / "demo.yaml").exists()
    path, changes = demo_config_for(DEMO_CONFIG, tmp_path / "input" / "demo.yaml", 50)
    assert path == tmp_path / "input" / "demo.yaml" and changes
    plan = load_plan(path, output_dir=tmp_path / "out", input_override=DEMO_CONFIG)
    assert plan.config.attacks is not None and plan.config.attacks.targets == 50
    hierarchy = plan.config.hierarchies["sex"]
    assert Path(str(hierarchy.file)).is_absolute() and Path(str(hierarchy.file)).exists()


def test_demo_refuses_fewer_rows_than_k_before_any_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from privpipe.pipelines.cli import main

    assert main(["demo", "--rows", "3", "--output", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "--rows 3: the demo's k-anonymous tables need at least 5 persons" in err
    assert "use --rows 50 or more" in err and "Traceback" not in err
    assert not (tmp_path / "d" / "input").exists()  # nothing generated


# every stage configs/demo.yaml implies (contract.md); a shared search may be "search"
DRIVER = {"graph", "pipeline", "dp_noise", "local_publish", "attacks", "common", "utility",
          "publication_attacks", "audit", "report", "commit", "continual_publish"}  # fmt: skip
TABLES = ("k5", "l3", "t03", "mondrian5")
# the DP and continual releases share one timed step ("dp")
PIPELINE = {"read", "holdout", "profile", "dp", "local_dp:ldp_diagnosis"}


@pytest.mark.slow
def test_demo_of_50_rows_finishes_with_every_stage_timed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import os

    from privpipe.pipelines.cli import main
    from tests.layout import internal_file

    out = tmp_path / "d"
    t0 = time.perf_counter()
    assert main(["demo", "--rows", "50", "--output", str(out)]) == 0
    wall = time.perf_counter() - t0
    printed = capsys.readouterr().out
    assert (
        "the demo config fitted to 50 rows" in printed and "attacks.targets: 5000 -> 50" in printed
    )
    assert "privpipe: slowest stages: " in printed
    m = json.loads(internal_file(out, "manifest.json").read_text())
    t = m["timings"]
    stages = t["stages"]
    assert set(stages) >= DRIVER | PIPELINE
    for step in ("recode", "verify", "write"):
        assert {f"{step}:{r}" for r in TABLES} <= set(stages)
    assert "summary" in stages  # one frequency table shared by the anonymised releases
    assert {f"search:{r}" for r in TABLES} <= set(stages) or "search" in stages
    assert all(v >= 0 for v in stages.values())
    assert 0 < t["pipeline_s"] <= t["wall_s"] <= wall + 1
    driver = sum(v for k, v in stages.items() if k in DRIVER)
    in_pipeline = sum(v for k, v in stages.items() if k not in DRIVER)
    assert driver <= t["wall_s"] + 0.5  # driver stages nest exclusively
    assert in_pipeline <= t["pipeline_s"] * (os.cpu_count() or 1) + 1.0
    assert driver + in_pipeline <= t["wall_s"] * ((os.cpu_count() or 1) + 1) + 1.5
    assert "timings" not in json.dumps(
        [json.loads(p.read_text()) for p in (out / "public").glob("*/release.json")]
    )  # internal only
