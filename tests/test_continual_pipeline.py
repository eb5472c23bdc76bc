"""Continual counts (`kind: dp_continual_count`) through `privpipe run --period N`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from privpipe.dp.continual import node_scale
from privpipe.dp.ledger import Ledger
from privpipe.dp.noise import planned_guarantee
from privpipe.pipelines.cli import main
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger
from tests.test_cli import assert_nothing_published, snapshot

DX = ["Flu", "Cancer", "Asthma", "Gastritis"]
PERIODS = 3


class StreamProject:
    """One input file per period: persons with 1-3 visits, a diagnosis per visit."""

    def __init__(self, root: Path, pan_private: bool, epsilon: float = 0.1) -> None:
        self.root, self.config, self.out = root, root / "config.yaml", root / "out"
        self.ledger = root / "ledger.sqlite"
        self.state = root / "visits.weekly.continual.sqlite"
        rng = np.random.default_rng(3)
        for t in range(1, PERIODS + 1):
            persons = 150 + 40 * t
            pid = np.repeat(np.arange(persons), rng.integers(1, 4, persons))
            frame = pd.DataFrame({"id": [f"P{i:04d}" for i in pid], "dx": rng.choice(DX, pid.size)})
            frame.to_csv(root / f"week{t}.csv", index=False)
        # bounded to one cell and one row per person and period, the exact total of a
        # period is its number of persons (which cell each person counts in is random)
        self.persons = [150 + 40 * t for t in range(1, PERIODS + 1)]
        self.cfg: dict[str, Any] = {
            "name": "visits",
            "input": {"path": "week1.csv"},
            "schema": {"privacy_unit": "id"},
            "releases": [
                {
                    "name": "weekly",
                    "kind": "dp_continual_count",
                    "epsilon": epsilon,
                    "horizon": 8,
                    "group_by": ["dx"],
                    "domain": {"dx": DX},
                    "pan_private": pan_private,
                }
            ],
            "budget": {"ledger": "ledger.sqlite", "lifetime_epsilon": 5},
            "output": {"dir": "out"},
        }
        self.save()

    def save(self) -> Path:
        self.config.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        provision_ledger(self.config)
        return self.config

    def run(self, period: int, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
        week = self.root / f"week{min(period, PERIODS)}.csv"
        args = ["run", str(self.config), "--period", str(period), "--input", str(week)]
        provision_ledger(self.config)
        code = main([*args, "--insecure-seed", str(100 + period), *extra])
        return code, capsys.readouterr().err

    def entries(self) -> list[tuple[Any, ...]]:
        """(release, epsilon, status, unit) of every ledger entry."""
        with Ledger.inspect(self.ledger) as ledger:
            return [
                (e.release, float(e.epsilon), e.status, e.unit)
                for e in ledger.history()
                if getattr(e, "kind", "charge") == "charge"  # not the stream-period records
            ]

    def release_json(self) -> dict[str, Any]:
        path = release_dir(self.out, "weekly") / "release.json"
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    def nodes(self) -> dict[tuple[str, int], np.ndarray]:
        """The state as an intruder reads it, at the SQL level."""
        with sqlite3.connect(self.state) as conn:
            rows = conn.execute("SELECT kind, level, value FROM nodes").fetchall()
        return {(k, lvl): np.frombuffer(v, "<i8").astype(np.int64) for k, lvl, v in rows}


def test_periods_release_cumulative_counts_and_charge_the_stream_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = StreamProject(tmp_path, pan_private=False, epsilon=1.0)
    totals = []
    for t in range(1, PERIODS + 1):
        code, err = p.run(t, capsys)
        assert code == 0, err
        table = pd.read_csv(release_dir(p.out, "weekly") / "data.csv")
        assert table.columns.tolist() == ["period", "dx", "count", "ci_low", "ci_high"]
        assert table["period"].tolist() == [t] * 4 and sorted(table["dx"]) == sorted(DX)
        doc = p.release_json()
        assert doc["verified"] is False and doc["guarantee"] == "none (insecure seed)"
        planned = doc["planned_guarantee"]  # a seeded run claims nothing (issue 12)
        assert planned["epsilon"] == 1.0 and planned["model"] == "continual"
        assert planned["unit"] == "event"  # the default: one period of a person
        assert planned["protects"] == "one id's rows in one period"
        assert doc["parameters"]["stream"]["last_period"] == t
        assert doc["parameters"]["node_noise"]["scale"] == node_scale(8, 1.0)
        totals.append(int(table["count"].sum()))
        # the cumulative number of persons (one row each after bounding) is within the CI
        persons = sum(p.persons[:t])
        assert abs(totals[-1] - persons) <= 4 * int(doc["metrics"]["ci_halfwidth"])
        # the ledger holds ONE event-level entry for the whole stream, not person-level spend
        assert p.entries() == [("weekly", 1.0, "committed", "event")]
        with Ledger.inspect(p.ledger) as ledger:
            assert ledger.spent().epsilon == 0 and ledger.stream_period("visits/weekly") == t
    assert totals[0] < totals[1] < totals[2]  # cumulative
    m = json.loads(internal_file(p.out, "manifest.json").read_text())
    assert m["continual"]["weekly"] == {"period": PERIODS, "state": str(p.state), "unit": "event"}
    assert m["budget"]["charged_this_run"] == {}  # later periods charge nothing

    before = snapshot(p.out)
    refusals = [
        (2, "was already released"),  # re-run of an earlier period
        (3, "was already released"),  # re-run of the last period
        (5, "cannot be released before period 4"),  # a skipped period
        (9, "exceeds its horizon T = 8"),
    ]
    for period, message in refusals:
        code, err = p.run(period, capsys)
        assert code == 4, err
        assert message in err, err
        assert_nothing_published(p.out, before)
    # a changed epsilon or horizon of the running stream
    for key, value, message in (("epsilon", 2.0, "epsilon=1 (asked 2)"), ("horizon", 16, "T=8")):
        p.cfg["releases"][0][key] = value
        p.save()
        code, err = p.run(4, capsys)
        assert code == 4, err
        assert "was started with" in err and message in err, err
        p.cfg["releases"][0][key] = {"epsilon": 1.0, "horizon": 8}[key]
        p.save()
    assert_nothing_published(p.out, before)
    assert p.entries() == [("weekly", 1.0, "committed", "event")]
    # a tampered state is refused (MAC), nothing read, nothing published
    good = p.state.read_bytes()
    with sqlite3.connect(p.state) as conn:
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'period'")
    code, err = p.run(3, capsys)
    assert code == 3, err
    assert "failed its authentication" in err
    assert_nothing_published(p.out, before)
    p.state.write_bytes(good)
    assert main(["budget", "show", str(p.ledger)]) == 0
    shown = capsys.readouterr().out
    event_line = [ln for ln in shown.splitlines() if ln.startswith("event-level")]
    assert "spent    epsilon 0," in shown and len(event_line) == 1 and "epsilon 1" in event_line[0]


def test_a_rolled_back_state_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = StreamProject(tmp_path, pan_private=True, epsilon=1.0)
    assert p.run(1, capsys)[0] == 0
    copy = p.state.read_bytes()  # copy, advance, copy back
    assert p.run(2, capsys)[0] == 0
    before = snapshot(p.out)
    p.state.write_bytes(copy)
    code, err = p.run(2, capsys)  # would re-release period 2 with fresh noise
    assert code == 3, err
    assert "is at period 1 but the ledger records period 2" in err and "rollback" in err
    code, err = p.run(3, capsys)
    assert code == 3, err
    assert_nothing_published(p.out, before)
    assert p.state.stat().st_mode & 0o777 == 0o600


def test_person_unit_is_calibrated_to_the_horizon_and_charged_person_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = StreamProject(tmp_path, pan_private=True, epsilon=1.0)
    p.cfg["releases"][0]["unit"] = "person"
    p.save()
    for t in (1, 2):
        code, err = p.run(t, capsys)
        assert code == 0, err
    doc = p.release_json()
    g = planned_guarantee(doc)  # the runs are seeded: the plan, not a claim
    assert (g["epsilon"], g["unit"]) == (1.0, "person")
    assert "every period of the horizon" in g["protects"]
    # m = horizon = 8 periods, c = 1, L = 4 levels: b = m·c·L/ε = 32 (event level: 4)
    assert doc["parameters"]["max_periods_per_person"] == 8
    assert doc["parameters"]["node_noise"]["scale"] == 32.0 == node_scale(8, 1.0, 8)
    assert doc["verification"]["l1_bound"] == 32
    assert p.entries() == [("weekly", 1.0, "committed", "person")]
    with Ledger.inspect(p.ledger) as ledger:
        assert ledger.spent().epsilon == 1


def test_a_new_stream_must_start_at_period_1_and_missing_period_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = StreamProject(tmp_path, pan_private=False)
    code, err = p.run(2, capsys)
    assert code == 4 and "cannot be released before period 1" in err, err
    assert not p.ledger.exists() or p.entries() == []
    assert not p.state.exists()
    code = main(["run", str(p.config)])
    err = capsys.readouterr().err
    assert code == 2 and "releases[0].period: missing" in err, err
    assert_nothing_published(p.out)


def test_state_file_that_is_not_a_state_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = StreamProject(tmp_path, pan_private=True)
    p.state.write_bytes(b"not a database at all" * 200)
    code, err = p.run(1, capsys)
    assert code == 3 and "unreadable" in err, err
    assert_nothing_published(p.out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"horizon": 0}, "releases[0].horizon: must be an integer >= 1, got 0"),
        ({"period": 9}, "releases[0].period: 9 is beyond the horizon 8"),
        ({"epsilon": 0}, "releases[0].epsilon: must be a number > 0.0, got 0"),
        ({"group_by": ["dx", "dx"]}, "releases[0].group_by: 'dx' is listed twice"),
        ({"domain": {}}, "releases[0].domain.dx: a continual count publishes every cell"),
        ({"max_contributions_per_partition": 0}, "max_contributions_per_partition: must be"),
        ({"pan_privat": True}, "releases[0].pan_privat: unknown key; did you mean 'pan_private'"),
        ({"unit": "row"}, "releases[0].unit"),
        ({"max_periods_per_person": 8}, "max_periods_per_person: only for unit: person"),
        (
            {"unit": "person", "max_periods_per_person": 3},
            "max_periods_per_person: 3 < horizon 8 cannot be enforced",
        ),
    ],
)
def test_bad_continual_config_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], message: str
) -> None:
    p = StreamProject(tmp_path, pan_private=False)
    p.cfg["releases"][0].update(change)
    p.save()
    code = main(["validate", str(p.config)])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


@pytest.mark.parametrize("pan_private", [True, False])
def test_pan_private_state_holds_no_raw_partial_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pan_private: bool
) -> None:
    p = StreamProject(tmp_path, pan_private=pan_private, epsilon=0.1)
    equal = compared = 0
    for t in range(1, PERIODS + 1):
        code, err = p.run(t, capsys)
        assert code == 0, err
        nodes = p.nodes()
        opened = {lvl: v for (k, lvl), v in nodes.items() if k == "open"}
        if pan_private:  # X = N + Σx per cell and the noise of the open nodes of levels 1..3
            assert sorted(nodes) == [("open", 1), ("open", 2), ("open", 3), ("running", 0)]
            with sqlite3.connect(p.state) as conn:  # no history table, no digest, no copies
                tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                assert sorted(r[0] for r in tables) == ["meta", "nodes"]
            assert sorted(f.name for f in p.state.parent.glob(p.state.name + "*")) == [
                p.state.name,
                p.state.name + ".lock",
            ]  # no journal or temporary copy beside it
            # X_t − X_(t−1) would be x_t: only the current X is in the file, and its total
            # differs from the exact cumulative number of persons by the noise N
            compared += 1
            equal += int(nodes["running", 0].sum()) == sum(p.persons[:t])
        else:
            assert sorted(opened) == list(range(4))
            for lvl, value in opened.items():
                start = (t // 2**lvl) * 2**lvl  # the open node holds periods start+1..t
                compared += 1
                equal += int(value.sum()) == sum(p.persons[start:t])
        doc = p.release_json()  # nothing exact of the period in release.json
        text = json.dumps(doc)
        assert "rows_in" not in text and "rows_kept" not in text
    if pan_private:
        assert node_scale(8, 0.1) == 40.0
        assert equal <= 1, (equal, compared)  # N (4 cells of DLap(40)) sums to 0 by chance only
    else:
        assert equal == compared == PERIODS * 4  # the standard state holds the raw partial sums


def test_a_stream_continued_against_another_ledger_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """release.json claims the stream was charged once: the ledger must hold that charge."""
    p = StreamProject(tmp_path, pan_private=False, epsilon=1.0)
    assert p.run(1, capsys)[0] == 0
    # a whole second ledger set-up (its own heads file: the first one would refuse the move)
    p.cfg["budget"]["ledger"] = "fresh-ledger.sqlite"  # same folder, so the same state
    p.cfg["budget"]["heads_file"] = "fresh-heads.json"
    p.save()
    code, err = p.run(2, capsys)
    assert code == 3, err  # the state is authenticated and period-checked against ITS ledger
    assert "failed its authentication" in err or "does not belong to this ledger" in err, err
    assert "Start a new stream" in err


def test_a_period_beyond_the_declared_horizon_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """T = 6 rounds to 8 inside, but a person-level stream assumes at most 6 periods."""
    p = StreamProject(tmp_path, pan_private=True)
    p.cfg["releases"][0].update({"horizon": 6, "unit": "person"})
    p.save()
    code, err = p.run(7, capsys)
    assert code == 4 and "exceeds its horizon T = 6" in err, err
    assert not p.state.exists()
    assert_nothing_published(p.out)


def test_counts_that_are_not_the_states_noisy_nodes_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Standard mode: the verifier recomputes the written counts from the state's noisy
    nodes; a release that adds anything else (here one extra count per cell) is exit 4."""
    import dataclasses

    from privpipe.dp.state_store import ContinualStore

    p = StreamProject(tmp_path, pan_private=False, epsilon=1.0)
    assert p.run(1, capsys)[0] == 0
    honest = ContinualStore.release

    def tampered(self: ContinualStore, *args: Any, **kwargs: Any) -> Any:
        out = honest(self, *args, **kwargs)
        return dataclasses.replace(out, counts=out.counts + 1)

    monkeypatch.setattr(ContinualStore, "release", tampered)
    code, err = p.run(2, capsys)
    assert code == 4, err
    assert "not the sum of the state's noisy nodes" in err
