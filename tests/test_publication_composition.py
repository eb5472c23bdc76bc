"""The composition attack (attacks/composition.py) on hand-made 2-diverse tables, and the
publication check that refuses a disclosing pair."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from privpipe.anonymity.hierarchy import Hierarchy
from privpipe.attacks.composition import claimed_values, compose_tables
from privpipe.pipelines.cli import main
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger

QIS = ["age", "sex"]
RAW = pd.DataFrame(
    {
        "age": ["20", "21", "20", "21"] * 3,
        "sex": ["F", "F", "M", "M"] * 3,
        "dx": ["flu", "cold", "gout", "acne"] * 3,
    }
)
# A: ages in pairs, sex kept: (20-21, F) = {flu, cold}, (20-21, M) = {gout, acne}
A = RAW.assign(age="20-21")
# B: age kept, sex suppressed: (20, *) = {flu, gout}, (21, *) = {cold, acne}
B = RAW.assign(sex="*")
# C: age suppressed, sex kept: (*, F) = {flu, cold}, (*, M) = {gout, acne}
C = RAW.assign(age="*")
HIER = {
    "age": Hierarchy("age", np.array([["20", "20-21", "*"], ["21", "20-21", "*"]])),
    "sex": Hierarchy("sex", np.array([["F", "*"], ["M", "*"]], dtype=object)),
}
L2 = {"k": 3, "l": 2, "variant": "distinct"}


def _distinct_per_class(table: pd.DataFrame) -> int:
    return int(table.groupby(QIS)["dx"].nunique().min())


def test_each_table_is_2_diverse() -> None:
    for t in (A, B, C):
        assert _distinct_per_class(t) == 2


def test_intersecting_two_2_diverse_tables_discloses_every_target() -> None:
    found = compose_tables({"a": A, "b": B}, RAW, QIS, "dx", HIER, guarantees={"a": L2, "b": L2})
    assert found.disclosed_alone == (0.0, 0.0)  # neither table alone discloses
    assert found.disclosed == 1.0 and found.candidates == 1.0
    assert found.claim == 2 and found.below_claim == len(RAW)
    assert found.breach
    entry = found.as_dict()
    assert entry["releases"] == ["a", "b"] and entry["breach"] is True
    assert "fewer than the 2 values" in str(entry["finding"])


def test_a_pair_whose_classes_nest_does_not_disclose() -> None:
    found = compose_tables({"a": A, "c": C}, RAW, QIS, "dx", HIER, guarantees={"a": L2, "c": L2})
    assert found.disclosed == 0.0 and found.candidates == 2.0
    assert not found.breach


def test_k_anonymity_tables_claim_nothing_a_finding_not_a_breach() -> None:
    k3 = {"k": 3}
    found = compose_tables({"a": A, "b": B}, RAW, QIS, "dx", HIER, guarantees={"a": k3, "b": k3})
    assert found.disclosed == 1.0  # the attack works the same
    assert found.claim is None and not found.breach
    assert "not a breach" in found.message()


def test_claims() -> None:
    assert claimed_values({"k": 5}) is None
    assert claimed_values({"k": 5, "l": 3, "variant": "recursive", "c": 4}) == 3
    assert claimed_values({"k": 5, "l": 2.5, "variant": "entropy"}) == 3
    assert claimed_values(None) is None


# --------------------------------------------------------------------------- through `privpipe run`


def _composition_project(root: Path, accept: bool) -> Path:
    rows = RAW.assign(id=[f"p{i}" for i in range(len(RAW))])
    rows[["id", "age", "sex", "dx"]].to_csv(root / "data.csv", index=False)
    (root / "age.csv").write_text("20;20-21;*\n21;20-21;*\n")
    (root / "sex.csv").write_text("F;*\nM;*\n")
    diverse = {"kind": "l_diversity", "k": 3, "l": 2, "variant": "distinct", "suppression_limit": 0}
    cfg = {
        "name": "composed",
        "input": {"path": "data.csv"},
        "schema": {"quasi_identifiers": ["age", "sex"], "sensitive": "dx", "privacy_unit": "id"},
        "hierarchies": {"age": {"file": "age.csv"}, "sex": {"file": "sex.csv"}},
        "releases": [  # A: ages in pairs, sex kept; B: age kept, sex suppressed
            {"name": "a", **diverse, "min_levels": {"age": 1}, "max_levels": {"age": 1, "sex": 0}},
            {"name": "b", **diverse, "min_levels": {"sex": 1}, "max_levels": {"age": 0, "sex": 1}},
        ],
        "publish": ["a", "b"],
        "accept_linked_releases": accept,
        "output": {"dir": "out"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow
def test_the_publication_check_refuses_the_disclosing_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _composition_project(tmp_path, accept=False)
    assert main(["run", str(config)]) == 4
    err = capsys.readouterr().err
    assert "linked" in err and "'a' and 'b'" in err and "fewer than the 2 values" in err
    assert "accept_linked_releases" in err and "publish only one of them" in err
    assert not (tmp_path / "out" / "public").exists()  # nothing published

    config = _composition_project(tmp_path, accept=True)
    assert main(["run", str(config)]) == 0
    out = tmp_path / "out"
    manifest = json.loads(internal_file(out, "manifest.json").read_text())
    found = manifest["publication"]["composition"]
    assert len(found) == 1 and found[0]["breach"] and found[0]["disclosed"] == 1.0
    assert manifest["publication"]["linked_with"] == {"a": ["b"], "b": ["a"]}
    for name in ("a", "b"):  # each table on its own is 2-diverse
        table = pd.read_csv(release_dir(out, name) / "data.csv", dtype=str)
        assert _distinct_per_class(table) == 2
    audit = json.loads(internal_file(out, "audit.json").read_text())
    entries = audit["publication_attacks"]["composition"]
    assert [e["releases"] for e in entries] == [["a", "b"]]
    assert entries[0]["breach"] and not entries[0]["hypothetical"]
    assert any(f.startswith("PUBLICATION ATTACK (composition)") for f in audit["findings"])
    assert any(f.startswith("LINKED RELEASES PUBLISHED") for f in audit["findings"])


# --------------------------------------------------------------------------- across runs


def _nightly_project(root: Path) -> Path:
    rng = np.random.default_rng(5)  # test data only
    pid = np.repeat(np.arange(150), 2)
    pd.DataFrame(
        {
            "id": [f"p{i}" for i in pid],
            "age": rng.integers(20, 60, pid.size),
            "sex": rng.choice(["F", "M"], pid.size),
            "dx": rng.choice(["flu", "cold", "gout", "acne"], pid.size),
        }
    ).to_csv(root / "data.csv", index=False)
    (root / "sex.csv").write_text("F;*\nM;*\n")
    cfg = {
        "name": "nightly",
        "input": {"path": "data.csv"},
        "schema": {
            "quasi_identifiers": ["age", "sex"],
            "sensitive": "dx",
            "privacy_unit": "id",
            "types": {"age": "integer"},
        },
        "hierarchies": {
            "age": {"intervals": {"widths": [10, 20], "lower": 0, "upper": 120}},
            "sex": {"file": "sex.csv"},
        },
        "releases": [  # the table hides sex, so neither count per sex is reproduced
            {"name": "k3", "kind": "k_anonymity", "k": 3, "min_levels": {"sex": 1}},
            {"name": "by_sex", "kind": "dp_histogram", "epsilon": 1.0, "group_by": ["sex"]},
            {
                "name": "weekly",
                "kind": "dp_continual_count",
                "epsilon": 1.0,
                "horizon": 4,
                "group_by": ["sex"],
                "domain": {"sex": ["F", "M"]},
            },
        ],
        "publish": ["k3", "by_sex", "weekly"],
        "budget": {"ledger": "ledger.sqlite", "lifetime_epsilon": 10},
        "output": {"dir": "out"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow
def test_across_runs_two_nights_of_a_scheduled_config(tmp_path: Path) -> None:
    config = _nightly_project(tmp_path)
    provision_ledger(config)
    out, first = tmp_path / "out", tmp_path / "night1"
    assert main(["run", str(config), "--period", "1"]) == 0
    shutil.copytree(out, first)
    assert main(["run", str(config), "--period", "2"]) == 0

    def across() -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
        cmp = tmp_path / "cmp"
        assert main(["report", str(first), str(out), "--output", str(cmp)]) == 0
        audit = json.loads((cmp / "audit.json").read_text())
        entries = audit["publication_attacks"]["across_runs"]
        return {(e["releases"][0], e["attack"]): e for e in entries}, audit["findings"]

    found, findings = across()
    assert set(found) == {
        ("k3", "row linking"), ("k3", "composition"),
        ("by_sex", "averaging"), ("weekly", "averaging"),
    }  # fmt: skip
    assert not found[("k3", "row linking")]["breach"]  # each night shuffled anew
    comp = found[("k3", "composition")]  # the same generalisation twice: nothing gained
    assert comp["disclosed"] == comp["disclosed_alone"] and not comp["breach"]
    twice = found[("by_sex", "averaging")]
    assert twice["cells"] == 2 and twice["charged_both"] and not twice["breach"]
    assert twice["epsilon_together"] == 2.0
    assert twice["averaged_sd"] < twice["noise_sd"]
    stream = found[("weekly", "averaging")]  # one stream: the tree accounts for both periods
    assert stream["charged_both"] and stream["epsilon_together"] == 1.0
    assert not [f for f in findings if f.startswith("PUBLICATION ATTACK")]

    # a second night the ledger did not charge: the attack says so
    manifest_path = internal_file(out, "manifest.json")
    manifest = json.loads(manifest_path.read_text())
    del manifest["budget"]["charged_this_run"]["by_sex"]
    manifest_path.write_text(json.dumps(manifest))
    found, findings = across()
    assert found[("by_sex", "averaging")]["breach"]
    assert not found[("by_sex", "averaging")]["charged_both"]
    assert any("did NOT charge both" in f for f in findings)


def test_breach_findings_keep_published_breaches_apart_from_hypothetical_ones() -> None:
    """A published breach is a finding of its own; breaches that need a candidate published
    are grouped in one line per attack (their sentences stay in publication_attacks)."""
    from privpipe.pipelines.pubattacks import breach_findings

    entries = {
        "differencing": [
            {"releases": ["m5", "dp"], "finding": "m5 gives dp exactly", "breach": True,
             "hypothetical": True},
            {"releases": ["k5", "dp"], "finding": "k5 gives dp exactly", "breach": True,
             "hypothetical": True},
            {"releases": ["k5", "zip"], "finding": "nothing", "breach": False,
             "hypothetical": False},
        ],
        "composition": [
            {"releases": ["a", "b"], "finding": "a and b disclose", "breach": True,
             "hypothetical": False},
        ],
    }  # fmt: skip
    lines = breach_findings(entries)
    assert lines[0] == "PUBLICATION ATTACK (composition): a and b disclose"
    assert len(lines) == 2 and "2 combination(s)" in lines[1] and "m5 + dp, k5 + dp" in lines[1]


def test_pairs_sharing_matches_give_the_same_figures_and_match_each_table_once() -> None:
    """pipelines.pubattacks composes every pair of tables: each table is matched to the
    targets once (``views``), with the figures of matching it per pair."""
    tables = {"a": A, "b": B, "c": C}
    guarantees = {n: L2 for n in tables}
    views: dict[str, Any] = {}
    for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
        pair = {x: tables[x], y: tables[y]}
        shared = compose_tables(pair, RAW, QIS, "dx", HIER, guarantees=guarantees, views=views)
        alone = compose_tables(pair, RAW, QIS, "dx", HIER, guarantees=guarantees)
        assert shared.as_dict() == alone.as_dict()
    assert sorted(views) == ["a", "b", "c"]
    # the leak is still found with shared matches, and the shared matches are the ones used
    found = compose_tables({"a": A, "b": B}, RAW, QIS, "dx", HIER, guarantees=guarantees,
                           views=views)  # fmt: skip
    assert found.breach and found.disclosed == 1.0
    wrong = {"b": views["c"]}  # C's classes nest in A's: under b's name, no leak
    nested = compose_tables({"a": A, "b": B}, RAW, QIS, "dx", HIER, guarantees=guarantees,
                            views=wrong)  # fmt: skip
    assert not nested.breach and nested.disclosed == 0.0
