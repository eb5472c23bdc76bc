"""Shared fixtures: a small valid project (CSV, hierarchies, config) in a temp folder."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ledgers import TEST_KEY

# the ledger key of every test ledger, for the whole session (CLI subprocesses inherit it),
# and default heads files never in the real home (each test gets its own, see below)
os.environ["PRIVPIPE_LEDGER_KEY"] = TEST_KEY
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="privpipe-test-state-")
# removed when this test process ends (each xdist worker imports this module: one each)
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True)

ROOT = Path(__file__).resolve().parent.parent
ARX = ROOT.parent / "shared" / "data" / "arx"
# UCI Adult as ARX benchmarks it: 8 quasi-identifiers, occupation sensitive
ADULT_QIS: tuple[str, ...] = (
    "sex",
    "age",
    "race",
    "marital-status",
    "education",
    "native-country",
    "workclass",
    "salary-class",
)
ADULT_SA = "occupation"

HEADER = "id;zip;age;sex;disease"
ROWS = [
    "1;47677;29;Female;Heart Disease",
    "2;47602;22;Female;Heart Disease",
    "3;47678;27;Male;Heart Disease",
    "4;47905;43;Male;Flu",
    "5;47909;52;Female;Heart Disease",
    "6;47906;47;Male;Cancer",
    "7;47605;30;Male;Heart Disease",
    "8;47673;36;Male;Cancer",
    "9;47607;32;Male;Cancer",
]


class Project:
    """A config folder the tests can break in one place at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data.csv"
        self.config = root / "config.yaml"
        self.out = root / "out"
        (root / "h").mkdir()
        (root / "h" / "sex.csv").write_text("Male;*\nFemale;*\n")
        self.write_rows(ROWS)
        self.cfg: dict[str, Any] = {
            "name": "tiny",
            "input": {"path": "data.csv", "delimiter": ";"},
            "schema": {
                "quasi_identifiers": ["zip", "age", "sex"],
                "sensitive": "disease",
                "privacy_unit": "id",
                "types": {"age": "integer"},
            },
            "hierarchies": {
                "zip": {"mask": {"digits": 5}},
                "age": {"intervals": {"widths": [10, 20], "lower": 0, "upper": 120}},
                "sex": {"file": "h/sex.csv"},
            },
            "releases": [],
            "output": {"dir": "out"},
        }
        self.save()

    def write_rows(self, rows: list[str], header: str = HEADER, newline: str = "\n") -> None:
        self.data.write_text(newline.join([header, *rows]) + newline)

    def save(self) -> Path:
        self.config.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        return self.config


@pytest.fixture(autouse=True)
def _heads_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ledger heads files (default $XDG_STATE_HOME/privpipe/heads) in the test's tmp folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    yield


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with slow (whole-run) tests first, each file's tests in their order:
    ``make test`` hands whole files to its workers in collection order (``--dist
    loadfile``), so the long files start early and the short ones fill the end instead of
    one worker finishing a long file alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
