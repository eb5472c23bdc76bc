"""Attacks through `privpipe run`: every release and the raw baseline in audit.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from privpipe.pipelines.cli import main
from tests.conftest import ADULT_QIS, ADULT_SA, ARX
from tests.layout import internal_file
from tests.ledgers import provision_ledger

QIS = list(ADULT_QIS)


def adult_config(tmp: Path, attacks: Any, releases: list[dict[str, Any]] | None = None) -> Path:
    cfg = {
        "name": "adult",
        "input": {"path": str(ARX / "adult.csv"), "delimiter": ";"},
        "schema": {"quasi_identifiers": QIS, "sensitive": ADULT_SA},
        "hierarchies": {
            c: {"file": str(ARX / f"adult_hierarchy_{c}.csv")} for c in [*QIS, ADULT_SA]
        },
        "releases": releases
        or [
            {"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05},
            {"name": "l2", "kind": "l_diversity", "k": 2, "l": 2, "suppression_limit": 0.05},
            {"name": "dp", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["sex", ADULT_SA]},
        ],
        "attacks": attacks,
        "budget": {
            "ledger": str(tmp / "ledger.sqlite"),
            "lifetime_epsilon": 100,
            "heads_file": str(tmp / "heads.json"),
        },
        "output": {"dir": str(tmp / "out")},
    }
    path = tmp / "adult.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    provision_ledger(path)
    return path


@pytest.fixture(scope="module")
def adult_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("adult-attacks")
    attacks = {
        "targets": 4000,
        "seed": 3,
        "run": ["homogeneity", {"background_knowledge": {"eliminate": 1}}, "skewness",
                "similarity", "linkage", "attribute_inference", "membership", "differencing"],
    }  # fmt: skip
    assert main(["run", str(adult_config(tmp, attacks))]) == 0
    audit = json.loads((internal_file(tmp / "out", "audit.json")).read_text())
    return tmp / "out", audit


def test_every_release_and_the_baseline_are_attacked(adult_run: tuple[Path, Any]) -> None:
    out, audit = adult_run
    assert set(audit["releases"]) == {"k5", "l2", "dp"}
    assert audit["baseline"]["kind"] == "raw"
    assert audit["attacker"]["targets"] == 4000 and audit["attacker"]["records"] == 30162
    table = {"homogeneity", "background_knowledge", "skewness", "similarity", "linkage"}
    assert set(audit["baseline"]["attacks"]) == table
    for name in ("k5", "l2"):
        assert set(audit["releases"][name]["attacks"]) == table
    assert set(audit["releases"]["dp"]["attacks"]) == {
        "attribute_inference", "membership", "differencing"
    }  # fmt: skip
    manifest = json.loads((internal_file(out, "manifest.json")).read_text())
    assert (
        manifest["attacks"]["k5"]["homogeneity"]
        == audit["releases"]["k5"]["attacks"]["homogeneity"]["rate"]
    )


def test_protection_shows_in_the_numbers(adult_run: tuple[Path, Any]) -> None:
    _, audit = adult_run
    rel = {**audit["releases"], "raw": audit["baseline"]}
    rate = {n: {a: r["rate"] for a, r in rel[n]["attacks"].items()} for n in rel}
    assert rate["raw"]["homogeneity"] > 0.3  # Adult's occupations: many unique QI combinations
    assert rate["k5"]["homogeneity"] < rate["raw"]["homogeneity"]
    assert rate["k5"]["linkage"] < rate["raw"]["linkage"]
    # distinct l >= 2: no class has a single sensitive value, so homogeneity is 0
    assert rate["l2"]["homogeneity"] == 0.0
    # k = 5: no target is re-identified with probability above 1/5
    link = rel["k5"]["attacks"]["linkage"]
    assert link["bound"] == pytest.approx(0.2) and link["highest"] <= 0.2 + 1e-12


def test_dp_attacks_stay_within_their_bounds(adult_run: tuple[Path, Any]) -> None:
    _, audit = adult_run
    for name in ("membership", "differencing"):
        r = audit["releases"]["dp"]["attacks"][name]
        assert r["bound"] == pytest.approx(0.7310585786300049)  # e/(1+e) at epsilon 1
        assert r["interval"][0] <= r["bound"]
        assert r["rate"] > 0.5  # the attack does learn something: it is not a coin flip


def test_the_audit_names_sensitive_values_only_in_the_distributions(
    adult_run: tuple[Path, Any],
) -> None:
    """Attack details never carry a record's value; the only place the audit names values is
    the published-vs-raw distributions per attribute, and only labels of the attribute's
    public hierarchy held by at least 10 records (a rare value is pooled)."""
    _, audit = adult_run
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")
        elif node in ("Tech-support", "Craft-repair", "Armed-Forces", "Priv-house-serv"):
            found.append(path)

    walk(audit, "")
    assert found and all(p.startswith("/distributions/columns/occupation/") for p in found)
    assert not [p for p in found if "Armed-Forces" in p]  # 9 records in Adult: pooled
    public = set(pd.read_csv(ARX / "adult_hierarchy_occupation.csv", sep=";", header=None)[0])
    named = audit["distributions"]["columns"]["occupation"]["values"]
    assert set(named) - public <= {"(other values)"}, named


def test_short_list_form_from_design(tmp_path: Path) -> None:
    releases = [{"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05}]
    attacks = ["homogeneity", {"background_knowledge": {"eliminate": 2}}, "skewness", "similarity"]
    assert main(["run", str(adult_config(tmp_path, attacks, releases))]) == 0
    audit = json.loads((internal_file(tmp_path / "out", "audit.json")).read_text())
    assert list(audit["releases"]["k5"]["attacks"]) == [
        "homogeneity", "background_knowledge", "skewness", "similarity"
    ]  # fmt: skip
    assert audit["attacker"]["background_knowledge"] == 2


@pytest.mark.parametrize(
    ("attacks", "message"),
    [
        (
            ["homogenity"],
            "attacks.run: run[0]: unknown attack 'homogenity'; did you mean 'homogeneity'?",
        ),
        (
            [{"skewness": {"treshold": 2}}],
            "run[0].skewness.treshold: unknown parameter; allowed: threshold",
        ),
        ([{"similarity": {"level": "one"}}], "run[0].similarity.level: must be an integer"),
        ({"targets": 0}, "attacks.targets"),
        ({"known": ["zip"]}, "attacks.known: 'zip' is not a quasi-identifier"),
        ({"tau": 1.5}, "attacks.tau: must be a number <= 1"),
    ],
)
def test_bad_attack_config_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attacks: Any, message: str
) -> None:
    code = main(["validate", str(adult_config(tmp_path, attacks))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err


def test_similarity_needs_the_sensitive_hierarchy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = adult_config(tmp_path, ["similarity"])
    cfg = yaml.safe_load(path.read_text())
    del cfg["hierarchies"][ADULT_SA]
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    assert "similarity needs a hierarchy of 'occupation'" in capsys.readouterr().err
