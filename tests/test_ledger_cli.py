"""Ledgers through the CLI (issue 12): created on purpose with `budget init`, never by a run;
a renamed, moved, deleted, truncated, edited or rolled-back ledger stops a run (exit 3)
before any data is read; `budget init/show/verify` round trip."""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest

from privpipe.pipelines.cli import main
from tests.layout import internal_file
from tests.ledgers import provision_ledger
from tests.test_cli import assert_nothing_published, snapshot
from tests.test_dp_pipeline import DPProject


@pytest.fixture
def dpp(tmp_path: Path) -> DPProject:
    return DPProject(tmp_path, persons=60)


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_a_run_never_creates_a_ledger_and_says_how(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(["run", str(dpp.config)], capsys)
    assert code == 2, err
    assert not dpp.ledger.exists()
    assert_nothing_published(dpp.out)
    command = err.split("on purpose: ")[1].strip()
    assert command == (
        f"privpipe budget init {dpp.ledger.resolve()} --dataset visits --epsilon 3 --delta 1/100000"
    )
    # the printed command works as printed, and then the run does
    assert cli(shlex.split(command)[1:], capsys)[0] == 0
    assert stat.S_IMODE(dpp.ledger.stat().st_mode) == 0o600
    code, _, err = cli(["run", str(dpp.config)], capsys)
    assert code == 0, err
    head = json.loads(internal_file(dpp.out, "manifest.json").read_text())["budget"]["ledger_head"]
    assert head["entries"] == 1 and head["dataset"] == "visits" and len(head["mac"]) == 64


def _after_one_run(dpp: DPProject, capsys: pytest.CaptureFixture[str]) -> dict[str, bytes]:
    provision_ledger(dpp.config)
    code, _, err = cli(["run", str(dpp.config)], capsys)
    assert code == 0, err
    return snapshot(dpp.out)


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        ("renamed", "belongs to dataset 'visits', not 'renamed'"),
        ("moved", "cannot be moved"),
        ("deleted", "was deleted or truncated"),
        ("truncated", "was deleted or truncated"),
        ("edited", "failed authentication at entry 1"),
        ("rolled_back", "is an older copy"),
    ],
)
def test_a_broken_ledger_stops_the_run_with_exit_3(
    dpp: DPProject, capsys: pytest.CaptureFixture[str], problem: str, message: str
) -> None:
    backup = dpp.root / "backup.sqlite"
    if problem == "rolled_back":
        provision_ledger(dpp.config)
        shutil.copy(dpp.ledger, backup)
    before = _after_one_run(dpp, capsys)
    if problem == "renamed":
        dpp.cfg["name"] = "renamed"
        dpp.save()
    elif problem == "moved":
        dpp.ledger.rename(dpp.root / "moved.sqlite")
        dpp.cfg["budget"]["ledger"] = "moved.sqlite"
        dpp.save()
    elif problem == "deleted":
        dpp.ledger.unlink()
    elif problem == "truncated":
        dpp.ledger.write_bytes(b"")
    elif problem == "edited":
        with sqlite3.connect(dpp.ledger) as conn:
            conn.execute("UPDATE entries SET epsilon = '0'")
        conn.close()
    else:
        shutil.copy(backup, dpp.ledger)
    dpp.data.unlink()  # nothing is read: the ledger is checked first
    code, _, err = cli(["run", str(dpp.config)], capsys)
    assert code == 3, err
    assert message in err and "restore" not in err
    assert_nothing_published(dpp.out, before)
    if problem in ("deleted", "truncated"):
        assert not dpp.ledger.exists() or dpp.ledger.stat().st_size == 0  # not recreated


def test_a_config_lifetime_other_than_the_ledgers_is_exit_2(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    provision_ledger(dpp.config)
    dpp.cfg["budget"]["lifetime_epsilon"] = 30
    dpp.save()
    code, _, err = cli(["run", str(dpp.config)], capsys)
    assert code == 2 and "lifetime budget cannot change" in err, err
    del dpp.cfg["budget"]["lifetime_epsilon"], dpp.cfg["budget"]["lifetime_delta"]
    dpp.save()  # the lifetime is optional in the config: the ledger holds it
    code, _, err = cli(["run", str(dpp.config)], capsys)
    assert code == 0, err


def test_budget_init_show_verify_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, key = tmp_path / "l.sqlite", tmp_path / "secret" / "ledger.key"
    args = ["--key-file", str(key)]
    code, out, err = cli(
        [
            "budget",
            "init",
            str(ledger),
            "--dataset",
            "census",
            "--epsilon",
            "2.5",
            "--delta",
            "1e-6",
            *args,
        ],
        capsys,
    )
    assert code == 0, err
    assert "created the ledger key file" in out
    for f in (ledger, key, Path(f"{key}.heads")):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    code, out, err = cli(
        ["budget", "init", str(ledger), "--dataset", "census", "--epsilon", "1", *args], capsys
    )
    assert code == 2 and "never overwritten" in err
    code, out, err = cli(["budget", "show", str(ledger), *args], capsys)
    assert code == 0, err
    assert "dataset 'census'" in out and "lifetime epsilon 2.5, delta 1e-06" in out
    assert "0 entries" in out
    code, out, err = cli(["budget", "verify", str(ledger), *args], capsys)
    assert code == 0, err
    assert "OK" in out and "head 0 entries, chain MAC " in out
    # the env key (PRIVPIPE_LEDGER_KEY of the session) is another key: refused
    code, _, err = cli(["budget", "verify", str(ledger), "--heads", f"{key}.heads"], capsys)
    assert code == 3 and "ledger key from environment variable" in err, err
    key.chmod(0o640)
    code, _, err = cli(["budget", "show", str(ledger), *args], capsys)
    assert code == 2 and "chmod 600" in err
    code, _, err = cli(["budget", "show", str(tmp_path / "nope.sqlite"), *args], capsys)
    assert code == 2 and "no such ledger file" in err
