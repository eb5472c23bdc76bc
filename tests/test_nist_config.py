"""configs/nist.yaml on the NIST ACS excerpt (../shared/data/nist): code-list and
numeric-key hierarchies users have, end to end, as the README shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from privpipe.pipelines.cli import main
from tests.conftest import ROOT
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger

NIST = ROOT.parent / "shared" / "data" / "nist" / "nist_national2019.csv"
CONFIG = ROOT / "configs" / "nist.yaml"


def nist_config(tmp_path: Path) -> Path:
    """configs/nist.yaml as shipped, with its output and ledger in ``tmp_path``."""
    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    cfg["input"]["path"] = str(NIST)
    for h in cfg["hierarchies"].values():
        if "codes" in h:
            h["codes"]["files"] = [str(CONFIG.parent / f) for f in h["codes"]["files"]]
    cfg["output"]["dir"] = str(tmp_path / "out")
    cfg["budget"] = {"ledger": str(tmp_path / "ledger.sqlite"), "lifetime_epsilon": 10}
    path = tmp_path / "nist.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_shipped_config_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(CONFIG)]) == 0, capsys.readouterr().err
    assert "5 quasi-identifiers, 6 hierarchies, 4 release(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_nist_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = nist_config(tmp_path)
    provision_ledger(config)
    assert main(["run", str(config)]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    m = json.loads(internal_file(out, "manifest.json").read_text())
    assert m["rows_accepted"] == 27_253 and m["published"] == ["k5", "dp_state"]
    assert m["hierarchies"]["PUMA"]["levels"] == 4  # PUMA, state, region, *
    assert all(s["verified"] for s in m["release_summaries"].values())
    hist = pd.read_csv(release_dir(out, "dp_state") / "data.csv", dtype=str)
    states = {p[:2] for p in pd.read_csv(NIST, dtype=str, usecols=["PUMA"])["PUMA"]}
    assert set(hist["PUMA"]) == states  # level 1 of the code lists, leading zeros kept
    table = pd.read_csv(release_dir(out, "k5") / "data.csv", dtype=str)
    assert set(table["SEX"]) <= {"1", "2", "*"}  # numeric YAML keys matched the data
