"""Central-DP releases through `privpipe run` on the DirectRunner: ledger, outputs, refusals."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from privpipe import pipelines
from privpipe.dp.noise import SeededTestSampler
from privpipe.dp.release import dp_release
from privpipe.pipelines.cli import main
from privpipe.pipelines.dp_release import dp_jobs
from privpipe.pipelines.plan import load_plan
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger
from tests.test_cli import assert_nothing_published, snapshot

DX = ["Flu", "Cancer", "Asthma", "Gastritis"]


class DPProject:
    """Persons with several visits; a DP histogram config with a ledger."""

    def __init__(self, root: Path, persons: int = 300, visits: int = 3, seed: int = 0) -> None:
        self.root, self.config, self.out = root, root / "config.yaml", root / "out"
        self.ledger = root / "ledger.sqlite"
        rng = np.random.default_rng(seed)
        pid = np.repeat(np.arange(persons), visits)
        sex = np.array(["Female", "Male"])[rng.integers(0, 2, persons)][pid]
        self.frame = pd.DataFrame(
            {
                "id": [f"P{i:04d}" for i in pid],
                "sex": sex,
                "zip": np.array(["47677", "47602", "47905", "47909"])[rng.integers(0, 4, pid.size)],
                "disease": rng.choice(DX, pid.size),
                "salary": rng.integers(0, 100_000, pid.size),
            }
        )
        self.data = root / "data.csv"
        self.frame.to_csv(self.data, index=False)
        (root / "h").mkdir()
        (root / "h" / "sex.csv").write_text("Male;*\nFemale;*\n")
        (root / "h" / "disease.csv").write_text(
            "Flu;respiratory;*\nAsthma;respiratory;*\nCancer;other;*\nGastritis;other;*\n"
        )
        self.cfg: dict[str, Any] = {
            "name": "visits",
            "input": {"path": "data.csv"},
            "schema": {"privacy_unit": "id", "max_units": 10_000},
            "hierarchies": {"sex": {"file": "h/sex.csv"}, "disease": {"file": "h/disease.csv"}},
            "releases": [
                {
                    "name": "hist",
                    "kind": "dp_histogram",
                    "epsilon": 1.0,
                    "group_by": ["disease"],
                    "partition_by": "sex",
                    "max_partitions": 4,
                    "max_contributions_per_partition": 3,
                }
            ],
            "budget": {"ledger": "ledger.sqlite", "lifetime_epsilon": 3, "lifetime_delta": 1e-5},
            "output": {"dir": "out"},
        }
        self.save()

    def save(self) -> Path:
        self.config.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        return self.config

    def entries(self) -> list[tuple[Any, ...]]:
        if not self.ledger.exists():
            return []
        with sqlite3.connect(self.ledger) as conn:
            return conn.execute(
                "SELECT release, epsilon, delta, status, reason FROM entries ORDER BY id"
            ).fetchall()


@pytest.fixture
def dpp(tmp_path: Path) -> DPProject:
    return DPProject(tmp_path)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    if args[0] == "run":  # the operator created the ledger (`privpipe budget init`)
        provision_ledger(Path(args[1]))
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_histogram_with_partition_by_charges_max_not_sum(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["run", str(dpp.config)], capsys)
    assert code == 0, err
    table = pd.read_csv(release_dir(dpp.out, "hist") / "data.csv")
    assert table.columns.tolist() == ["sex", "disease", "count", "ci_low", "ci_high"]
    assert len(table) == 8  # 2 sexes x 4 diseases, public from the hierarchies
    doc = json.loads((release_dir(dpp.out, "hist") / "release.json").read_text())
    assert doc["verified"] is True
    assert doc["guarantee"]["composition"] == "parallel"
    assert doc["guarantee"]["unit"] == "id"
    # two disjoint groups at epsilon 1 each: the ledger records 1, not 2
    assert dpp.entries() == [("hist", "1", "0", "committed", None)]
    m = json.loads((internal_file(dpp.out, "manifest.json")).read_text())
    assert m["budget"]["spent"]["epsilon"] == 1.0 and m["budget"]["remaining"]["epsilon"] == 2.0
    assert m["insecure_seed"] is None
    assert m["dp_contribution_bounding"]["hist"]["hist"]["rows"] == len(dpp.frame)
    assert "charged epsilon 1 to the ledger" in out
    # the noisy counts are near the bounded truth (each person <= 3 rows per disease)
    truth = dpp.frame.groupby(["sex", "disease"]).size()
    got = table.set_index(["sex", "disease"])["count"]
    assert (got - truth.reindex(got.index)).abs().max() <= 3 * doc["parameters"]["queries"]["hist"][
        "count_noise"
    ]["ci_halfwidth"]


def test_sequential_queries_add_up_and_runs_accumulate_until_refused(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    dpp.cfg["releases"] = [
        {
            "name": "two",
            "kind": "dp_count",
            "epsilon": 1.5,
            "queries": [
                {"name": "total", "weight": 1},
                {"name": "by_zip", "group_by": ["zip"], "weight": 2},
            ],
            "domain": {"zip": ["47677", "47602", "47905", "47909"]},
            "max_partitions": 3,
        }
    ]
    dpp.cfg["hierarchies"] = {}
    dpp.save()
    assert run(["run", str(dpp.config)], capsys)[0] == 0
    doc = json.loads((release_dir(dpp.out, "two") / "release.json").read_text())
    q = doc["parameters"]["queries"]
    assert (q["total"]["epsilon"], q["by_zip"]["epsilon"]) == (0.5, 1.0)
    table = pd.read_csv(release_dir(dpp.out, "two") / "data.csv", dtype={"zip": str})
    assert table.groupby("query").size().to_dict() == {"by_zip": 4, "total": 1}
    assert run(["run", str(dpp.config)], capsys)[0] == 0
    before = snapshot(dpp.out)
    # 1.5 + 1.5 = 3 = lifetime: the third run is refused before any data is read
    dpp.data.unlink()
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 4, err
    assert "exhausted" in err and "epsilon 0 of 3 left" in err
    assert [e[1] for e in dpp.entries()] == ["3/2", "3/2"]
    assert_nothing_published(dpp.out, before)
    code, out, _ = run(["budget", "show", str(dpp.ledger)], capsys)
    assert code == 0
    assert "spent    epsilon 3, delta 0" in out and out.count("committed") == 2


def test_private_partitions_sum_mean_and_top_k_run(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    dpp.cfg["releases"] = [
        {"name": "zips", "kind": "dp_count", "epsilon": 0.5, "delta": 1e-6,
         "group_by": ["zip"], "max_contributions_per_partition": 3},
        {"name": "pay", "kind": "dp_sum", "epsilon": 0.5, "value": "salary",
         "bounds": [0, 100000], "resolution": 1000, "group_by": ["sex"]},
        {"name": "avg", "kind": "dp_mean", "epsilon": 0.5, "value": "salary",
         "bounds": [0, 100000], "group_by": ["disease"], "levels": {"disease": 1}},
        {"name": "top", "kind": "dp_top_k", "epsilon": 0.5, "value": "disease", "k": 2,
         "partition_by": "sex"},
    ]  # fmt: skip
    dpp.cfg["publish"] = ["zips", "pay", "avg", "top"]  # published: charged to the ledger
    dpp.save()
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 0, err
    rel = dpp.out / "public"
    assert sorted(p.name for p in rel.iterdir()) == ["avg", "pay", "top", "zips"]
    zips = json.loads((rel / "zips" / "release.json").read_text())
    assert zips["parameters"]["partitions"] == "private"
    assert zips["parameters"]["selection"] == "truncated_geometric"
    assert set(pd.read_csv(rel / "avg" / "data.csv")["disease"]) == {"respiratory", "other"}
    assert len(pd.read_csv(rel / "top" / "data.csv")) == 4
    assert (pd.read_csv(rel / "pay" / "data.csv")["sum"] % 1000 == 0).all()
    assert sum(float(e[1].split("/")[0]) / float(e[1].split("/")[1] if "/" in e[1] else 1)
               for e in dpp.entries()) == 2.0  # fmt: skip


def test_insecure_seed_is_reproducible_recorded_and_matches_the_pure_api(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    # bounds that never bind, so the Beam path and the pure path see the same cells
    dpp.cfg["releases"][0].update(max_partitions=4, max_contributions_per_partition=3)
    dpp.cfg["budget"]["lifetime_epsilon"] = 10
    dpp.save()
    code, _, err = run(["run", str(dpp.config), "--insecure-seed", "7"], capsys)
    assert code == 0 and "NOT private" in err
    first = (release_dir(dpp.out, "hist") / "data.csv").read_bytes()
    m = json.loads((internal_file(dpp.out, "manifest.json")).read_text())
    assert m["insecure_seed"] == 7
    doc = json.loads((release_dir(dpp.out, "hist") / "release.json").read_text())
    assert doc["insecure_seed"] == 7
    assert run(["run", str(dpp.config), "--insecure-seed", "7"], capsys)[0] == 0
    assert (release_dir(dpp.out, "hist") / "data.csv").read_bytes() == first
    # the pure API with the same sampler seed publishes the same table
    job = dp_jobs(load_plan(dpp.config))[0]
    table, _ = dp_release(dpp.frame.astype({"salary": str}), job.spec, SeededTestSampler(7))
    beam = pd.read_csv(release_dir(dpp.out, "hist") / "data.csv")
    pd.testing.assert_frame_equal(
        beam, table.astype({"sex": str, "disease": str}), check_dtype=False
    )


def test_person_in_two_groups_is_exit_3_and_nothing_is_spent(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = dpp.frame.copy()
    frame.loc[frame["id"] == "P0000", "sex"] = ["Female", "Male", "Male"]
    frame.to_csv(dpp.data, index=False)
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 3, err
    assert "a person (id) appears in more than one partition_by group (sex)" in err
    assert "1 person" not in err and "bound_to_one_group: true" in err  # no count
    assert dpp.entries() == []
    assert_nothing_published(dpp.out)
    dpp.cfg["releases"][0]["bound_to_one_group"] = True
    dpp.save()
    assert run(["run", str(dpp.config)], capsys)[0] == 0


def test_missing_person_id_is_exit_3(dpp: DPProject, capsys: pytest.CaptureFixture[str]) -> None:
    frame = dpp.frame.astype({"id": object})
    frame.loc[5, "id"] = None
    frame.to_csv(dpp.data, index=False)
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 3 and "privacy_unit" in err
    assert dpp.entries() == []


def test_non_numeric_value_is_exit_3(dpp: DPProject, capsys: pytest.CaptureFixture[str]) -> None:
    dpp.cfg["releases"] = [{"name": "pay", "kind": "dp_sum", "epsilon": 1.0, "value": "salary",
                            "bounds": [0, 100000]}]  # fmt: skip
    dpp.cfg["hierarchies"] = {}
    dpp.save()
    frame = dpp.frame.astype({"salary": object})
    frame.loc[7, "salary"] = "unknown"
    frame.to_csv(dpp.data, index=False)
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 3, err
    assert "salary" in err and "line 9" not in err and "unknown" not in err  # no figures
    assert "withheld: this config has DP releases" in err
    assert dpp.entries() == []


def test_delta_not_below_one_over_max_units_is_refused_at_validate(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    dpp.cfg["releases"][0].update(delta=0.001, partitions="private")
    dpp.cfg["budget"]["lifetime_delta"] = 0.5
    dpp.save()
    for command in ("validate", "run"):  # the public bound, not the data: validate knows
        code, _, err = run([command, str(dpp.config)], capsys)
        assert code == 2, err
        assert "releases[0].delta: 0.001 is not below 1/schema.max_units = 0.0001" in err
    assert dpp.entries() == []
    assert_nothing_published(dpp.out)


def test_delta_without_max_units_is_exit_2_at_validate(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    dpp.cfg["releases"][0].update(delta=1e-6, partitions="private")
    del dpp.cfg["schema"]["max_units"]
    dpp.save()
    code, _, err = run(["validate", str(dpp.config)], capsys)
    assert code == 2, err
    assert "releases[0].delta: delta > 0 needs schema.max_units" in err
    dpp.cfg["releases"][0]["delta"] = 0.0  # pure ε needs no bound
    dpp.cfg["releases"][0]["partitions"] = "public"
    dpp.save()
    assert run(["validate", str(dpp.config)], capsys)[0] == 0


def test_more_persons_than_max_units_is_refused_without_figures(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    dpp.cfg["schema"]["max_units"] = 299  # the data holds 300 persons
    dpp.save()
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 3, err
    assert "more persons than schema.max_units declares; raise schema.max_units" in err
    assert "300" not in err and "299" not in err and "900" not in err
    assert dpp.entries() == []  # refused before the charge
    assert_nothing_published(dpp.out)
    dpp.cfg["schema"]["max_units"] = 300  # exactly the declared bound is fine
    dpp.save()
    assert run(["run", str(dpp.config)], capsys)[0] == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epsilon": 0}, "releases[0].epsilon: must be a number > 0"),
        ({"epsilon": float("nan")}, "releases[0].epsilon: must be a finite number"),
        ({"epsilon": float("inf")}, "releases[0].epsilon: must be a finite number"),
        ({"delta": -0.1}, "releases[0].delta: must be a number >= 0"),
        ({"delta": 1.0}, "releases[0].delta: must be a number < 1"),
        ({"kind": "dp_sum", "value": "salary"}, "releases[0].bounds: required key is missing"),
        (
            {"kind": "dp_mean", "value": "salary", "bounds": [10, 1]},
            "bounds: lower 10 is above upper 1",
        ),
        ({"partitions": "private"}, "private partition selection, which needs delta > 0"),
        ({"mechanism": "discrete_gaussian"}, "discrete_gaussian needs delta > 0"),
        ({"group_by": ["sex"]}, "'sex' is also in partition_by"),
        ({"max_partitions": 0}, "releases[0].max_partitions: must be an integer >= 1"),
    ],
)
def test_bad_dp_config_is_exit_2_before_anything(
    dpp: DPProject, capsys: pytest.CaptureFixture[str], change: dict[str, Any], message: str
) -> None:
    dpp.cfg["releases"][0].update(change)
    dpp.save()
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 2, err
    assert message in err
    assert dpp.entries() == []


def test_config_without_budget_is_refused(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    del dpp.cfg["budget"]
    dpp.save()
    code, _, err = run(["validate", str(dpp.config)], capsys)
    assert code == 2 and "budget: missing" in err


@pytest.mark.parametrize("problem", ["corrupt", "other_dataset", "tampered"])
def test_bad_ledger_is_refused_and_nothing_is_read(
    dpp: DPProject, capsys: pytest.CaptureFixture[str], problem: str
) -> None:
    if problem == "corrupt":
        dpp.ledger.write_bytes(b"not a database at all" * 100)
    else:
        assert run(["run", str(dpp.config)], capsys)[0] == 0
        if problem == "other_dataset":
            dpp.cfg["name"] = "another"
            dpp.save()
        else:
            with sqlite3.connect(dpp.ledger) as conn:
                conn.execute("UPDATE entries SET epsilon = '1/10'")
    before = snapshot(dpp.out) if dpp.out.exists() else None
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 3, err
    assert str(dpp.ledger) in err
    assert_nothing_published(dpp.out, before)


def test_failure_after_the_charge_is_recorded_in_the_ledger(
    dpp: DPProject, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(pipelines.dp_release, "release_query", broken)
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 1 and "disk on fire" in err
    assert dpp.entries() == [("hist", "1", "0", "failed", "RuntimeError: disk on fire")]
    assert_nothing_published(dpp.out)
    code, out, _ = run(["budget", "show", str(dpp.ledger)], capsys)
    assert "failed (RuntimeError: disk on fire)" in out


def test_budget_show_of_a_missing_file_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["budget", "show", str(tmp_path / "nope.sqlite")], capsys)
    assert code == 2 and "no such ledger file" in err


def test_consistent_histogram_levels_add_up(
    dpp: DPProject, capsys: pytest.CaptureFixture[str]
) -> None:
    dpp.cfg["releases"][0].pop("group_by")
    dpp.cfg["releases"][0].update(
        queries=[
            {"name": "disease", "group_by": ["disease"]},
            {"name": "category", "group_by": ["disease"], "levels": {"disease": 1}},
        ],
        consistent=True,
    )
    dpp.save()
    code, _, err = run(["run", str(dpp.config)], capsys)
    assert code == 0, err
    table = pd.read_csv(release_dir(dpp.out, "hist") / "data.csv")
    category = {
        "Flu": "respiratory",
        "Asthma": "respiratory",
        "Cancer": "other",
        "Gastritis": "other",
    }
    fine = table[table["query"] == "disease"]
    sums = fine.groupby([fine["sex"], fine["disease"].map(category)])["count"].sum()
    coarse = table[table["query"] == "category"].set_index(["sex", "disease"])["count"]
    assert sums.sort_index().to_dict() == coarse.sort_index().to_dict()
    doc = json.loads((release_dir(dpp.out, "hist") / "release.json").read_text())
    assert doc["parameters"]["consistent"] == {"disease": "category", "category": "disease"}
    # without a coarser query there is nothing to be consistent with
    dpp.cfg["releases"][0]["queries"] = [{"name": "disease", "group_by": ["disease"]}]
    dpp.save()
    code, _, err = run(["validate", str(dpp.config)], capsys)
    assert code == 2 and "hist.consistent: needs counts with a query that is a coarser" in err
