"""Anonymised releases through `privpipe run` (Beam, DirectRunner): the same table as the
pure API, verified, and every refusal with its exit code and nothing published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from privpipe.anonymity.api import anonymize
from privpipe.anonymity.hierarchy import load_arx_csv
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.pipelines.cli import main
from tests.conftest import ADULT_QIS, ARX, Project
from tests.layout import internal_file, release_dir

pytestmark = pytest.mark.skipif(not (ARX / "adult.csv").exists(), reason="needs ../shared/data/arx")

QIS = list(ADULT_QIS)


def adult_config(tmp_path: Path, releases: list[dict[str, Any]], **extra: Any) -> Path:
    cfg = {
        "name": "adult",
        "input": {"path": str(ARX / "adult.csv"), "delimiter": ";"},
        "schema": {"quasi_identifiers": QIS, "sensitive": "occupation"},
        "hierarchies": {
            c: {"file": str(ARX / f"adult_hierarchy_{c}.csv")} for c in [*QIS, "occupation"]
        },
        "releases": releases,
        "output": {"dir": str(tmp_path / "out")},
        **extra,
    }
    path = tmp_path / "adult.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", str(config)])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def adult() -> pd.DataFrame:
    return pd.read_csv(ARX / "adult.csv", sep=";", dtype=str)


@pytest.fixture(scope="module")
def hierarchies() -> dict[str, Any]:
    return {c: load_arx_csv(ARX / f"adult_hierarchy_{c}.csv", c) for c in [*QIS, "occupation"]}


def sorted_rows(df: pd.DataFrame) -> list[tuple[str, ...]]:
    return sorted(map(tuple, df.astype(str).to_numpy().tolist()))


RELEASES = [
    {"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05},
    {"name": "l3", "kind": "l_diversity", "k": 5, "l": 3, "variant": "recursive", "c": 4},
    {
        "name": "t02",
        "kind": "t_closeness",
        "k": 5,
        "t": 0.2,
        "distance": "hierarchical",
        "suppressed": "drop",
    },
    {"name": "mondrian5", "kind": "k_anonymity", "k": 5, "algorithm": "mondrian"},
]


@pytest.fixture(scope="module")
def adult_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("adult")
    assert main(["run", str(adult_config(tmp, RELEASES))]) == 0
    return tmp / "out"


@pytest.mark.parametrize("release", RELEASES, ids=[r["name"] for r in RELEASES])
def test_beam_release_equals_pure_api(
    adult_run: Path, adult: pd.DataFrame, hierarchies: dict[str, Any], release: dict[str, Any]
) -> None:
    folder = release_dir(adult_run, release["name"])
    doc = json.loads((folder / "release.json").read_text())
    assert doc["verified"] is True and doc["verification"]["ok"] is True
    published = pd.read_csv(folder / "data.csv", dtype=str, keep_default_na=False)
    params = {k: v for k, v in release.items() if k not in ("name",)}
    spec = AnonymizationSpec(qis=tuple(QIS), sensitive="occupation", name=release["name"], **params)
    pure = anonymize(
        adult, spec, {q: hierarchies[q] for q in QIS}, sa_hierarchy=hierarchies["occupation"]
    )
    assert list(published.columns) == [*QIS, "occupation"]
    assert sorted_rows(published) == sorted_rows(pure.table)
    assert doc["guarantee"] == spec.guarantee()
    if release["kind"] == "k_anonymity" and release.get("algorithm") != "mondrian":
        assert doc["transformation"]["levels"] == pure.document["transformation"]["levels"]


def test_manifest_lists_verified_releases(adult_run: Path) -> None:
    m = json.loads((internal_file(adult_run, "manifest.json")).read_text())
    assert m["releases"] == [r["name"] for r in RELEASES]
    assert all(s["verified"] for s in m["release_summaries"].values())
    assert m["release_summaries"]["k5"]["guarantee"] == {
        "k": 5,
        "suppression_limit": 0.05,
        "unit": "rows",
    }


def test_published_table_satisfies_claims_on_its_own(adult_run: Path) -> None:
    """Recount from the published CSV alone: what a reader can check."""
    k5 = pd.read_csv(release_dir(adult_run, "k5") / "data.csv", dtype=str, keep_default_na=False)
    kept = k5[~(k5[QIS] == "*").all(axis=1)]
    assert kept.groupby(QIS).size().min() >= 5
    assert len(k5) - len(kept) <= int(0.05 * 30162)
    l3 = pd.read_csv(release_dir(adult_run, "l3") / "data.csv", dtype=str, keep_default_na=False)
    kept = l3[~(l3[QIS] == "*").all(axis=1)]
    for _, cls in kept.groupby(QIS):
        r = cls["occupation"].value_counts().to_numpy()
        assert r[0] < 4 * r[2:].sum()  # recursive (c=4, l=3)
    t02 = pd.read_csv(release_dir(adult_run, "t02") / "data.csv", dtype=str, keep_default_na=False)
    assert len(t02) <= 30162 and not (t02[QIS] == "*").all(axis=1).any()


def test_unreachable_guarantee_is_refused_with_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With generalisation capped by max_levels, k=50 needs more suppression than allowed."""
    cfg = adult_config(
        tmp_path,
        [
            {
                "name": "k",
                "kind": "k_anonymity",
                "k": 50,
                "suppression_limit": 0.05,
                "max_levels": {q: 1 for q in QIS},
            }
        ],
    )
    code, err = run(cfg, capsys)
    assert code == 4, err
    assert "k=50 needs" in err and "% suppression" in err and "limit is 5%" in err
    assert not (internal_file(tmp_path / "out", "manifest.json")).exists()


def test_k_larger_than_table_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg["releases"] = [{"name": "k50", "kind": "k_anonymity", "k": 50}]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 4 and "k=50" in err and "9 records" in err
    assert not internal_file(project.out, "manifest.json").exists()


def test_l_larger_than_sensitive_values_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg["releases"] = [{"name": "l5", "kind": "l_diversity", "l": 5}]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 4 and "l=5" in err and "3 distinct" in err


@pytest.mark.parametrize(
    ("release", "fragment"),
    [
        ({"name": "t", "kind": "t_closeness", "t": 0}, "releases[0].t: must be a number > 0.0"),
        ({"name": "t", "kind": "t_closeness", "t": 1.2}, "releases[0].t: must be a number <= 1.0"),
        ({"name": "k", "kind": "k_anonymity", "k": 0}, "releases[0].k: must be an integer >= 2"),
        ({"name": "k", "kind": "k_anonymity", "k": 2.5}, "releases[0].k: must be an integer"),
    ],
)
def test_bad_parameters_exit_2(
    project: Project, capsys: pytest.CaptureFixture[str], release: dict[str, Any], fragment: str
) -> None:
    project.cfg["releases"] = [release]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 2 and fragment in err


def test_qi_without_hierarchy_exit_2(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.cfg["hierarchies"].pop("age")
    project.cfg["releases"] = [{"name": "k2", "kind": "k_anonymity", "k": 2}]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 2 and "hierarchies.age: missing" in err


def test_sensitive_also_qi_exit_2(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.cfg["schema"]["sensitive"] = "zip"
    project.cfg["releases"] = [{"name": "k2", "kind": "k_anonymity", "k": 2}]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 2 and "also a quasi-identifier" in err


def test_tiny_table_k2_published_and_verified(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    project.cfg["releases"] = [{"name": "k3", "kind": "k_anonymity", "k": 3}]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 0, err
    table = pd.read_csv(release_dir(project.out, "k3") / "data.csv", dtype=str)
    assert list(table.columns) == ["zip", "age", "sex", "disease"]  # no person id
    assert table.groupby(["zip", "age", "sex"]).size().min() >= 3


def test_suppression_the_recoding_did_not_plan_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verifier counts what the recoding suppressed, not what the plan claims."""
    from privpipe.anonymity.recoding import BatchRecoder

    original = BatchRecoder.apply

    def star_one_more(self: BatchRecoder, frame: pd.DataFrame, hierarchies: Any) -> Any:
        out, suppressed = original(self, frame, hierarchies)
        extra = suppressed.copy()
        extra[0] = True  # a row the plan kept is starred anyway
        out.loc[extra, list(self.qi_names)] = "*"
        return out, extra

    monkeypatch.setattr(BatchRecoder, "apply", star_one_more)
    project.cfg["releases"] = [
        {"name": "k2", "kind": "k_anonymity", "k": 2, "suppression_limit": 0.5}
    ]
    project.save()
    code, err = run(project.config, capsys)
    assert code == 4, err
    assert "recoding the rows suppressed" in err and "the plan" in err
    assert not internal_file(project.out, "manifest.json").exists()
