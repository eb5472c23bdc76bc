"""The demo config fitted to `privpipe demo --rows N` (pure: from N, never from the data)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.cli import DEMO_CONFIG
from pipelines.config import validate_config
from pipelines.demo_config import BASE_MAX_UNITS, adapt, demo_config_for, demo_size
from pipelines.plan import load_plan
from privpipe.errors import ConfigError

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
    with pytest.raises(ConfigError, match="not below 1/schema.max_units"):
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
