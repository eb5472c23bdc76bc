"""The demo's public/ folder attacked as the threat model's attacker would, over two runs.

The attacker holds every file of ``public/`` of two nightly runs of the demo config (the
second one a week later, `--period 2`), knows the targets' quasi-identifiers, and knows
how privpipe works. Each block below is one attack; each must find nothing. The operator
side (internal/manifest.json, the input) is read only to know what must not leak.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from privpipe.attacks.publication import row_order_alignment
from privpipe.pipelines.audit import audit_columns, read_columns
from privpipe.pipelines.cli import main
from privpipe.pipelines.hierarchies import HierarchyResolver
from privpipe.pipelines.plan import load_plan
from privpipe.pipelines.pubattacks import publication_attacks
from privpipe.reports import load_release
from tests.layout import internal_file
from tests.ledgers import open_config_ledger, provision_ledger
from tests.test_reports_pipeline import demo_project

pytestmark = pytest.mark.slow

# what may be handed out: the artefacts and their public documents, nothing else
PUBLIC_FILES = {"data.csv", "release.json", "multiparty.csv", "party.json"}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("attacker")
    config = demo_project(tmp, rows=3000)
    provision_ledger(config)
    out = tmp / "out"
    runs = []
    for i, extra in enumerate(([], ["--period", "2"])):
        assert main(["run", str(config), *extra]) == 0
        if i == 0:  # the first night's folder, as the attacker kept it
            shutil.copytree(out, tmp / "night1")
        runs.append(
            {
                "public": {p.relative_to(out / "public"): p.read_bytes() for p in _files(out)},
                "manifest": json.loads(internal_file(out, "manifest.json").read_text()),
                "k5": pd.read_csv(out / "public" / "k5" / "data.csv", dtype=str),
            }
        )
        with open_config_ledger(config) as ledger:
            runs[i]["spent"] = float(ledger.spent().epsilon)
    return {"config": config, "out": out, "tmp": tmp, "runs": runs}


def _files(out: Path) -> list[Path]:
    return sorted(p for p in (out / "public").rglob("*") if p.is_file())


def test_public_holds_only_artefacts_and_no_operator_file(two_runs: dict[str, Any]) -> None:
    out = two_runs["out"]
    for path in _files(out):
        assert path.name in PUBLIC_FILES, path
    # the ledger, its key and heads, the continual state, scratch and staging: never in DIR's
    # public/ or internal/, and nothing row-level is left anywhere under DIR
    everything = [p.name for p in out.rglob("*")]
    assert not [n for n in everything if n.endswith((".sqlite", ".key", ".heads", ".parquet"))]
    assert not [n for n in everything if n.endswith(".pickle") or n.startswith(".privpipe")]


def test_no_exact_figure_of_the_data_is_published(two_runs: dict[str, Any]) -> None:
    """Persons, unique persons, rows kept by DP bounding: none in any public file of either
    run (rows themselves are the k5 table's length, which the table shows anyway)."""
    for run in two_runs["runs"]:
        m = run["manifest"]
        combos = m["profile"]["qi_combinations"]
        figures = {combos["persons"], combos["unique_persons"], combos["distinct"]}
        figures.add(m["profile"]["columns"]["person_id"]["distinct"])
        for doc in m.get("release_details", {}).values():
            figures |= _numbers_named(doc, ("rows_kept", "rows_in", "reports", "persons"))
        figures = {f for f in figures if isinstance(f, int) and f >= 100}
        assert len(figures) >= 3, figures  # the attack has something to look for
        for name, blob in run["public"].items():
            found = {f for f in figures if re.search(rf"(?<![\w.]){f}(?![\w.])", blob.decode())}
            assert not found, f"{name} holds exact figures {found}"


def _numbers_named(doc: Any, keys: tuple[str, ...]) -> set[int]:
    out: set[int] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in keys and isinstance(v, int):
                out.add(v)
            out |= _numbers_named(v, keys)
    elif isinstance(doc, list):
        for v in doc:
            out |= _numbers_named(v, keys)
    return out


def test_the_two_nights_tables_do_not_join_row_by_row(two_runs: dict[str, Any]) -> None:
    first, second = (r["k5"] for r in two_runs["runs"])
    assert sorted(map(tuple, first.to_numpy())) == sorted(map(tuple, second.to_numpy()))
    aligned = row_order_alignment(first, second, {}, names=("night 1", "night 2"))
    assert not aligned.aligned, aligned.message()
    # nor does the input's order: the demo input is sorted by person, so in a kept order
    # a person's visits (same quasi-identifiers) would sit next to each other far more often
    # than two random rows share their quasi-identifiers
    for table in (first, second):
        qis = table.drop(columns="diagnosis").astype(str).agg("|".join, axis=1)
        n = len(qis)
        adjacent = float((qis.to_numpy()[1:] == qis.to_numpy()[:-1]).mean())
        counts = qis.value_counts().to_numpy()
        chance = float((counts * (counts - 1)).sum() / (n * (n - 1)))
        assert adjacent <= chance + 5 * math.sqrt(chance * (1 - chance) / (n - 1)) + 0.01


def test_the_table_gives_no_dp_cell_exactly(two_runs: dict[str, Any]) -> None:
    """dp_zip publishes noisy visit counts per zip: the k5 table must not show 5-digit
    zips (grouping it by zip would give those counts exactly)."""
    run = two_runs["runs"][0]
    table = run["k5"]
    zips = pd.read_csv(two_runs["out"] / "public" / "dp_zip" / "data.csv", dtype=str)["zip"]
    assert not set(table["zip"]) & set(zips)


def test_each_night_is_charged_and_the_stream_advances(two_runs: dict[str, Any]) -> None:
    first, second = two_runs["runs"]
    assert second["spent"] == pytest.approx(2 * first["spent"])  # nothing published unpaid
    assert [r["manifest"]["continual"]["weekly_visits"]["period"] for r in (first, second)] == [
        1,
        2,
    ]


def test_the_local_dp_intervals_do_not_state_the_number_of_persons(
    two_runs: dict[str, Any],
) -> None:
    """The attacker solves the oracle's variance formula for n from each published
    interval: with an interval computed from the number of reports, every value of the
    table gives the exact number of persons (a membership oracle for whoever knows everyone
    else). The published interval must be computed from the estimates alone."""
    from statistics import NormalDist

    for run in two_runs["runs"]:
        doc = json.loads(run["public"][Path("ldp_diagnosis/release.json")])
        table = pd.read_csv(pd.io.common.BytesIO(run["public"][Path("ldp_diagnosis/data.csv")]))
        par, conf = doc["parameters"]["oracle"], doc["parameters"]["confidence"]
        p, q = par["p_star"], par["q_star"]
        z = NormalDist().inv_cdf(0.5 + conf / 2)
        half = (table["ci_high"] - table["estimate"]).to_numpy()
        count = table["estimate"].clip(lower=0).to_numpy()
        solved = ((half / z) ** 2 - count * (1 - p - q) / (p - q)) * (p - q) ** 2 / (q * (1 - q))
        persons = run["manifest"]["release_details"]["ldp_diagnosis"]["metrics"]["reports"]
        assert persons >= 100
        assert not (abs(solved - persons) < 0.5).any(), (persons, solved[:3])
        assert doc["guarantee"]["participation"].startswith("not protected")


def _public_releases(out: Path) -> dict[str, Any]:
    """What the attacker holds: every release under public/ (data and public release.json)."""
    return {p.name: load_release(p) for p in sorted((out / "public").iterdir()) if p.is_dir()}


def _scoring(two_runs: dict[str, Any]) -> tuple[Any, pd.DataFrame, dict[str, Any]]:
    """The plan, the input's audit columns (only to score) and the hierarchies."""
    plan = load_plan(two_runs["config"], output_dir=two_runs["out"])
    cols = audit_columns(plan)
    raw = read_columns(plan, cols)
    hierarchies = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)(
        {c: raw[c].value_counts() for c in cols}
    )
    return plan, raw, hierarchies


def test_the_publication_attacks_on_public_find_no_breach(two_runs: dict[str, Any]) -> None:
    """Composition, differencing, exact totals and reconstruction on public/ alone: the
    attacks run (each has entries) and none finds a breach; the audit agrees."""
    plan, raw, hierarchies = _scoring(two_runs)
    public = _public_releases(two_runs["out"])
    assert set(public) == {"k5", "dp_zip", "ldp_diagnosis", "weekly_visits"}
    found = publication_attacks(plan, public, raw, hierarchies)
    assert found["differencing"] and found["reconstruction"]
    for attack, entries in found.items():
        for e in entries:
            assert not e["hypothetical"] and not e["breach"], (attack, e)
    # the table's length is the exact number of visits: a finding, not a breach, beside
    # counts of several cells
    totals = [e for e in found["differencing"] if e["attack"] == "exact total"]
    assert totals and all(e["structural"] and e["cells"] > 1 for e in totals)
    (rec,) = found["reconstruction"]
    assert rec["matched"] < 0.9 and rec["cells"] > 1
    audit = json.loads(internal_file(two_runs["out"], "audit.json").read_text())
    published = [
        e for entries in audit["publication_attacks"].values() for e in entries
        if not e["hypothetical"]
    ]  # fmt: skip
    assert published and not [e for e in published if e["breach"]]


def test_across_the_two_nights(two_runs: dict[str, Any], tmp_path: Path) -> None:
    """`privpipe report NIGHT1 NIGHT2`: the two nights' k5 tables neither join row by row
    nor narrow a target's diagnoses; dp_zip's cells published twice are charged twice."""
    cmp = tmp_path / "cmp"
    assert main(["report", str(two_runs["tmp"] / "night1"), str(two_runs["out"]),
                 "--output", str(cmp)]) == 0  # fmt: skip
    entries = json.loads((cmp / "audit.json").read_text())["publication_attacks"]["across_runs"]
    by = {(e["releases"][0], e["attack"]): e for e in entries}
    assert not by[("k5", "row linking")]["breach"]
    comp = by[("k5", "composition")]
    assert comp["disclosed"] <= comp["disclosed_alone"] + 0.01 and not comp["breach"]
    twice = by[("dp_zip", "averaging")]
    assert twice["charged_both"] and not twice["breach"]
    assert twice["epsilon_together"] == pytest.approx(1.0)
    assert by[("weekly_visits", "averaging")]["charged_both"]


@pytest.mark.parametrize("kind", ["object", "str", "category"])
def test_per_distinct_maps_each_value_once_and_keeps_the_mapped_dtype(kind: str) -> None:
    """``per_distinct`` applies the mapping to the distinct values only and spreads the
    result back in the mapping's dtype: an object mapping stays object (not pandas'
    strings, made per row), a string mapping stays strings; same values as per row."""
    from privpipe.attacks.publication import per_distinct

    values = pd.Series(["a", "b", "a", None, "b", "a"], dtype=kind, name="c")
    seen: list[int] = []

    def upper(v: pd.Series) -> pd.Series:
        seen.append(len(v))
        mapped = [x.upper() if isinstance(x, str) else x for x in v.tolist()]
        return pd.Series(np.array(mapped, dtype=object), dtype=object)

    got = per_distinct(values, upper)
    assert seen == [3] and got.dtype == object and got.index.equals(values.index)
    assert got.tolist()[:3] == ["A", "B", "A"] and pd.isna(got.iloc[3])
    as_str = per_distinct(values, lambda v: v.astype(str))
    assert isinstance(as_str.dtype, pd.StringDtype)
    assert as_str.tolist()[:3] == ["a", "b", "a"]
