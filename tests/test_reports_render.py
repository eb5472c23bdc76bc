"""The audit and its reports, read as a person (and a parser) would read them.

A small run directory is written by hand (manifest + an anonymised and a DP release),
loaded back with ``load_run``, attacked with the real attacks, audited and rendered.
The raw data holds one planted unique record with a distinctive sensitive value, which
must appear in none of the report files.
"""

from __future__ import annotations

import json
import os
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest

from anonymity.api import anonymize
from anonymity.hierarchy import Hierarchy, build_intervals, build_mask
from anonymity.spec import AnonymizationSpec
from attacks import (
    AttackerKnowledge,
    NoNoise,
    attack_table,
    baseline_table,
    histogram_attribute_inference,
)
from dp.release import dp_release
from dp.spec import Query, from_config_values
from reports import (
    audit_run,
    compare_runs,
    dumps_audit,
    load_run,
    render_html,
    render_markdown,
    write_reports,
)
from reports.render import fmt_count, fmt_rate
from tests.layout import candidate_dir, internal_file, public_dir, release_dir

PLANTED = "Zebrafish poisoning"
QIS = ["zip", "age", "sex"]
SA = "disease"
DISEASES = ["flu", "cold", "gout", "acne", "asthma", "migraine"]


def _raw(n: int = 3000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "zip": rng.choice([f"{z}" for z in range(47600, 47640)], n),
            "age": rng.integers(18, 90, n).astype(str),
            "sex": rng.choice(["F", "M"], n),
            SA: rng.choice(DISEASES, n),
        }
    )
    planted = pd.DataFrame({"zip": ["47639"], "age": ["89"], "sex": ["F"], SA: [PLANTED]})
    return pd.concat([df, planted], ignore_index=True)


def _hierarchies(df: pd.DataFrame) -> dict[str, Hierarchy]:
    return {
        "zip": build_mask("zip", df["zip"]),
        "age": build_intervals("age", df["age"], [10, 20, 40], lower=0, upper=120),
        "sex": Hierarchy("sex", np.array([["F", "*"], ["M", "*"]], dtype=object)),
    }


def _write_release(folder: Path, table: pd.DataFrame, doc: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    table.to_csv(folder / "data.csv", index=False)
    (folder / "release.json").write_text(json.dumps(doc, default=float))


def _make_run(root: Path, raw: pd.DataFrame, hierarchies: dict[str, Hierarchy], k: int) -> Path:
    spec = AnonymizationSpec(
        kind="k_anonymity", qis=tuple(QIS), sensitive=SA, k=k, suppression_limit=0.05, name=f"k{k}"
    )
    anon = anonymize(raw, spec, hierarchies)
    _write_release(public_dir(root, f"k{k}"), anon.table, anon.document)
    dp_spec = from_config_values(
        name="dp1",
        kind="dp_histogram",
        epsilon=1.0,
        delta=0.0,
        queries=[Query("dp1", (SA,))],
        partition_by=("sex",),
        max_partitions=1,
        domains={(SA, 0): DISEASES, ("sex", 0): ["F", "M"]},
    )
    table, doc = dp_release(raw, dp_spec, NoNoise(), rng=0)
    table = table.assign(count=table["count"] + np.resize([2, -1, 0, 1], len(table)))
    _write_release(candidate_dir(root, "dp1"), table, doc)
    combos = raw.groupby(QIS).size()
    manifest = {
        "run_id": f"test-run-k{k}",
        "name": "tiny",
        "finished": "2026-01-01T00:00:00+00:00",
        "rows_accepted": len(raw),
        "releases": [f"k{k}", "dp1"],
        "profile": {
            "rows": len(raw),
            "columns": {c: {"distinct": int(raw[c].nunique()), "missing": 0} for c in raw},
            "quasi_identifiers": QIS,
            "qi_combinations": {
                "distinct": len(combos),
                "unique": int((combos == 1).sum()),
                "unique_share_of_rows": float((combos == 1).sum() / len(raw)),
            },
        },
    }
    internal_file(root, "manifest.json").parent.mkdir(parents=True, exist_ok=True)
    internal_file(root, "manifest.json").write_text(json.dumps(manifest))
    return root


def _audit(run_dir: Path, raw: pd.DataFrame, hierarchies: dict[str, Hierarchy]) -> dict[str, Any]:
    run = load_run(run_dir)
    knowledge = AttackerKnowledge(targets=800, seed=3)
    attacks: dict[str, Any] = {}
    for name, rel in run.releases.items():
        if rel.kind == "k_anonymity":
            attacks[name] = attack_table(
                rel.data, raw, QIS, SA, hierarchies, knowledge, guarantee=rel.guarantee
            )
        else:
            hist = rel.data.assign(count=pd.to_numeric(rel.data["count"]))
            exact = raw.groupby(["sex", SA]).size().rename("count").reset_index()
            exact = hist[["sex", SA]].merge(exact, how="left").fillna({"count": 0})
            attacks[name] = [
                histogram_attribute_inference(
                    hist,
                    knowledge.select_targets(raw),
                    ["sex"],
                    SA,
                    epsilon=1.0,
                    true_histogram=exact,
                )
            ]
    base = attack_table(baseline_table(raw, QIS, SA), raw, QIS, SA, hierarchies, knowledge)
    return audit_run(
        run,
        raw,
        hierarchies=hierarchies,
        attacks=attacks,
        baseline_attacks=base,
        queries=[
            {"name": "old women", "where": {"sex": "F", "age": [str(a) for a in range(70, 90)]}}
        ],
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    raw = _raw()
    hierarchies = _hierarchies(raw)
    run_dir = _make_run(tmp_path_factory.mktemp("run"), raw, hierarchies, k=5)
    audit = _audit(run_dir, raw, hierarchies)
    paths = write_reports(run_dir, audit)
    return {
        "raw": raw,
        "hierarchies": hierarchies,
        "run_dir": run_dir,
        "audit": audit,
        "paths": paths,
        "texts": {n: p.read_text(encoding="utf-8") for n, p in paths.items()},
    }


# --------------------------------------------------------------------------- HTML parsing


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.cells: list[
            tuple[str | None, dict[str, str | None], str]
        ] = []  # (release, td attrs, text)
        self._row: str | None = None
        self._td: dict[str, str | None] | None = None
        self._text: list[str] = []
        self.section_ids: list[str] = []
        self.errors: list[str] = []

    VOID: ClassVar[frozenset[str]] = frozenset({"meta", "br", "img", "link", "input", "hr"})

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        self.attrs.append((tag, a))
        if tag == "section" and a.get("id"):
            self.section_ids.append(str(a["id"]))
        if tag == "tr":
            self._row = a.get("data-release")
        if tag == "td":
            self._td, self._text = a, []
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._td is not None:
            self.cells.append((self._row, self._td, "".join(self._text)))
            self._td = None
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self._td is not None:
            self._text.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def test_html_is_one_self_contained_well_formed_page(report: dict[str, Any]) -> None:
    page = _parse(report["texts"]["report.html"])
    assert page.errors == [] and page.stack == []
    assert page.tags[0] == "html" and "head" in page.tags and "body" in page.tags
    assert page.tags.count("svg") >= 3  # trade-off + one chart per attack
    assert "script" not in page.tags and "iframe" not in page.tags and "img" not in page.tags
    assert "link" not in page.tags  # no external stylesheet
    for _tag, attrs in page.attrs:
        for key in ("src", "href", "xlink:href"):
            value = attrs.get(key)
            assert value is None or "http" not in value, (key, value)
            assert value is None or value.startswith("#"), (key, value)
        assert not any(k.startswith("on") for k in attrs)  # no inline event handlers
    assert "<style>" in report["texts"]["report.html"]
    for section in (
        "findings",
        "dataset",
        "summary",
        "tradeoff",
        "attacks",
        "releases",
        "methodology",
    ):
        assert section in page.section_ids


def test_numbers_in_html_equal_audit_json(report: dict[str, Any]) -> None:
    audit = json.loads(report["texts"]["audit.json"])
    assert audit == report["audit"]
    page = _parse(report["texts"]["report.html"])
    summary = [c for c in page.cells if c[0] is not None]
    releases = {r for r, _, _ in summary}
    assert releases == {"raw data (no protection)", "k5", "dp1"}
    entries = {"raw data (no protection)": audit["baseline"], **audit["releases"]}
    checked = 0
    for name, entry in entries.items():
        cells = [(a, t) for r, a, t in summary if r == name and a.get("data-value") is not None]
        values = [json.loads(str(a["data-value"])) for a, _ in cells]
        u = entry["utility"]
        expected = [
            u["queries"],
            u["mean_relative_error"],
            u["within_10pct"],
            u["mean_absolute_error"],
        ]
        assert values[:4] == expected
        assert cells[0][1] == fmt_count(u["queries"])
        assert cells[1][1] == fmt_rate(u["mean_relative_error"])
        attack_names = [h for h in _summary_headers(report["texts"]["report.html"])[7:]]
        for (attrs, text), attack in zip(cells[4:], attack_names, strict=True):
            rate = (entry["attacks"].get(attack.removesuffix(" rate")) or {}).get("rate")
            assert json.loads(str(attrs["data-value"])) == rate
            assert text == fmt_rate(rate)
            checked += 1
    assert checked >= 5
    # the planted sensitive value does not change that the raw table answers exactly
    assert audit["baseline"]["utility"]["mean_absolute_error"] == 0.0
    assert audit["releases"]["k5"]["utility"]["mean_relative_error"] > 0


def _summary_headers(text: str) -> list[str]:
    table = text.split('id="summary-table"', 1)[1].split("</thead>", 1)[0]
    return [h.split("</th>", 1)[0] for h in table.split("<th>")[1:]]


def test_audit_shape_and_findings(report: dict[str, Any]) -> None:
    audit = report["audit"]
    assert audit["format"] == "privpipe-audit/1"
    assert list(audit["releases"]) == ["k5", "dp1"]
    k5, dp1 = audit["releases"]["k5"], audit["releases"]["dp1"]
    assert k5["kind"] == "k_anonymity" and k5["guarantee"]["k"] == 5
    assert k5["information_loss"]["loss"] > 0 and k5["verified"] is True
    assert set(k5["attacks"]) == {"homogeneity", "background_knowledge", "skewness", "linkage"}
    assert k5["attacks"]["linkage"]["bound"] == pytest.approx(0.2)
    assert dp1["guarantee_text"] == "ε=1"
    assert dp1["utility"]["marginals_not_answerable"] > 0
    assert dp1["summary"]["attack"] == "dp_attribute_inference"
    assert k5["summary"]["attack"] == "homogeneity"
    assert audit["dataset"]["rows"] == len(report["raw"])
    assert audit["methodology"]["utility"]["floor"] == 10.0
    assert audit["methodology"]["workload"]["marginals"] == {"1": 4, "2": 6}
    text = "\n".join(audit["findings"])
    assert "k5 (k=5, " in text and "disclose their disease by homogeneity" in text
    assert "dp1 (ε=1): at most 73.1% attack success by the guarantee, measured " in text
    per_person = dp1["attacks"]["dp_attribute_inference"]["per_person_success"]
    assert 0.5 <= per_person <= 0.7311
    assert "raw data (no protection):" in text
    for f in audit["findings"]:
        assert f in report["texts"]["report.md"]


def test_planted_unique_value_appears_nowhere(report: dict[str, Any]) -> None:
    raw = report["raw"]
    assert (raw[SA] == PLANTED).sum() == 1  # the planted record is unique
    # it was really published (the k5 table keeps SA values), so the test can fail
    published = (release_dir(report["run_dir"], "k5") / "data.csv").read_text()
    assert PLANTED in published
    for name, text in report["texts"].items():
        for needle in (PLANTED, "Zebrafish", "zebrafish"):
            assert needle not in text, f"{needle!r} leaked into {name}"


def test_reports_are_deterministic(report: dict[str, Any], tmp_path: Path) -> None:
    raw, hierarchies = report["raw"], report["hierarchies"]
    again = _audit(report["run_dir"], raw, hierarchies)
    assert dumps_audit(again) == report["texts"]["audit.json"]
    paths = write_reports(tmp_path, again)
    assert paths["report.html"].read_bytes() == report["paths"]["report.html"].read_bytes()
    assert paths["report.md"].read_bytes() == report["paths"]["report.md"].read_bytes()
    assert render_html(again) == render_html(report["audit"])


def test_write_reports_is_atomic_and_readable(report: dict[str, Any]) -> None:
    run_dir: Path = report["run_dir"]
    leftovers = [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    for p in report["paths"].values():
        assert p.parent == run_dir and oct(os.stat(p).st_mode & 0o777) == "0o644"


def test_escaping_and_mathtext_in_names(report: dict[str, Any]) -> None:
    audit = json.loads(report["texts"]["audit.json"])
    evil = '<script>alert("x")</script> $k$'
    audit["releases"] = {evil: audit["releases"]["k5"]}
    audit["sweeps"] = {"s&w": [evil]}
    text = render_html(audit)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "script" not in _parse(text).tags
    assert "<script>" in render_markdown(audit)  # Markdown is text; HTML renderers escape it


def test_compare_runs_makes_series(report: dict[str, Any], tmp_path: Path) -> None:
    raw, hierarchies = report["raw"], report["hierarchies"]
    other = _audit(_make_run(tmp_path / "k10", raw, hierarchies, k=10), raw, hierarchies)
    first = report["audit"]
    combined = compare_runs([first, other], labels=["monday", "tuesday"])
    assert list(combined["releases"]) == ["monday/k5", "monday/dp1", "tuesday/k10", "tuesday/dp1"]
    assert combined["sweeps"] == {"dp1": ["monday/dp1", "tuesday/dp1"]}
    assert [r["run_id"] for r in combined["runs"]] == ["test-run-k5", "test-run-k10"]
    page = _parse(render_html(combined))
    assert page.errors == [] and page.tags.count("svg") >= 2
    with pytest.raises(ValueError, match="distinct"):
        compare_runs([first, other], labels=["a", "a"])
