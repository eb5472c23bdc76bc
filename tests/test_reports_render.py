"""The audit and its reports, read as a person (and a parser) would read them.

A small run directory is written by hand (manifest + an anonymised and a DP release),
loaded back with ``load_run``, attacked with the real attacks, audited and rendered.
The raw data holds one planted unique record with a distinctive sensitive value, which
must appear in none of the report files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest

from privpipe.anonymity.api import anonymize
from privpipe.anonymity.hierarchy import Hierarchy, build_intervals, build_mask
from privpipe.anonymity.spec import AnonymizationSpec
from privpipe.attacks import (
    AttackerKnowledge,
    NoNoise,
    attack_table,
    baseline_table,
    histogram_attribute_inference,
)
from privpipe.dp.release import dp_release
from privpipe.dp.spec import Query, from_config_values
from privpipe.reports import (
    audit_run,
    compare_runs,
    dumps_audit,
    load_run,
    render_html,
    render_markdown,
    write_reports,
)
from privpipe.reports.audit import comparison_findings
from privpipe.reports.decide import recommend
from privpipe.reports.render import (
    MAX_TABLE_COLUMNS,
    SECTIONS,
    fmt_one_in,
    fmt_rate,
    text_box,
    tradeoff_figure,
)
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


def _rows(text: str, cls: str) -> dict[str, list[tuple[dict[str, str | None], str]]]:
    """Cells per release of every table whose class starts with ``cls`` (split parts
    joined; each row's first cell, the repeated release name, left out)."""
    out: dict[str, list[tuple[dict[str, str | None], str]]] = {}
    for chunk in text.split(f'<table class="{cls}')[1:]:
        page = _parse("<table>" + chunk.split("</table>", 1)[0].split(">", 1)[1] + "</table>")
        seen: set[str] = set()
        for release, attrs, cell in page.cells:
            if release is None:
                continue
            if release not in seen:
                seen.add(release)
                continue
            out.setdefault(release, []).append((attrs, cell))
    return out


def _headers(text: str, cls: str) -> list[str]:
    """Header cells of every table whose class starts with ``cls``, first column left out."""
    heads: list[str] = []
    for chunk in text.split(f'<table class="{cls}')[1:]:
        head = chunk.split("</thead>", 1)[0]
        heads += [h.split("</th>", 1)[0] for h in head.split("<th>")[2:]]
    return heads


def test_numbers_in_html_equal_audit_json(report: dict[str, Any]) -> None:
    audit = json.loads(report["texts"]["audit.json"])
    assert audit == report["audit"]
    full = _with_common(audit)
    html = render_html(full)
    common = _rows(html, 'summary"')
    assert set(common) == {"raw data (no protection)", "k5", "dp1"}
    entries = {"raw data (no protection)": full["baseline"], **full["releases"]}
    checked = 0
    attack_heads = _headers(html, "summary-attacks")
    attack_cells = _rows(html, "summary-attacks")
    for name, entry in entries.items():
        cells = [(a, t) for a, t in common[name] if a.get("data-value") is not None]
        values = [json.loads(str(a["data-value"])) for a, _ in cells]
        s = entry["summary"]
        assert values == [
            s["error"],
            s["attribute_accuracy"],
            entry["common"]["attribute_inference"]["prior_accuracy"],
            s["attribute_advantage"],
            s["attribute_risk"],
            s["membership_advantage"],
        ]
        assert cells[0][1] == fmt_rate(s["error"])
        assert cells[3][1].startswith(fmt_rate(s["attribute_advantage"]) + " (")
        for (attrs, text), attack in zip(attack_cells[name], attack_heads, strict=True):
            rate = (entry["attacks"].get(attack.removesuffix(" rate")) or {}).get("rate")
            assert json.loads(str(attrs["data-value"])) == rate
            assert text == fmt_rate(rate)
            checked += 1
    assert checked >= 5
    # the planted sensitive value does not change that the raw table answers exactly
    assert audit["baseline"]["utility"]["mean_absolute_error"] == 0.0
    assert audit["releases"]["k5"]["utility"]["mean_relative_error"] > 0


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
    assert set(combined["generalisation"]) == {"monday/k5", "tuesday/k10"}
    page = _parse(render_html(combined))
    assert page.errors == [] and page.tags.count("svg") >= 2
    with pytest.raises(ValueError, match="distinct"):
        compare_runs([first, other], labels=["a", "a"])


# ------------------------------------------------------------- issue 13: a report that decides


def _with_common(audit: dict[str, Any]) -> dict[str, Any]:
    """The audit with the common attacker's keys (contract §2) written by hand."""
    full = json.loads(json.dumps(audit))
    accuracy = {"baseline": 0.9, "k5": 0.5, "dp1": 0.25}
    prior = 0.2
    for name, entry in [("baseline", full["baseline"]), *full["releases"].items()]:
        acc = accuracy.get(name, 0.3)
        adv = (acc - prior) / (1 - prior)
        entry["common"] = {
            "attribute_inference": {
                "accuracy": acc,
                "interval": [acc - 0.03, acc + 0.03],
                "targets": 800,
                "prior_accuracy": prior,
                "advantage_prior": adv,
                "control_accuracy": prior + 0.01,
                "risk": adv * 0.9,
                "bound": 0.7311 if name == "dp1" else None,
                "method": "test",
                "note": None,
            },
            "membership": {"advantage": acc / 10, "interval": [0.0, acc / 5]},
        }
        entry["summary"].update(
            attribute_accuracy=acc,
            attribute_advantage=adv,
            attribute_risk=adv * 0.9,
            membership_advantage=acc / 10,
        )
    return full


def test_sections_in_order_recommendation_first(report: dict[str, Any]) -> None:
    full = _with_common(report["audit"])
    text = render_html(full)
    page = _parse(text)
    top = [i for i in page.section_ids if not i.startswith("release-")]
    assert page.errors == [] and top == [sid for sid, _ in SECTIONS]
    assert page.section_ids[0] == "recommendation"
    rec = recommend(full)
    assert rec["choice"] in rec["front"]
    first = text.split('<section id="recommendation">', 1)[1].split("</section>", 1)[0]
    assert f"Publish {rec['choice']}" in first and "Pareto front" in first
    md = render_markdown(full)
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings == [f"## {h}" for _, h in SECTIONS]
    assert f"**Publish {rec['choice']}" in md.split("## Findings", 1)[0]


def test_no_table_has_hidden_columns(report: dict[str, Any]) -> None:
    full = _with_common(report["audit"])
    names = [f"attack_{i:02d}" for i in range(13)]
    for a in names:  # many kind-specific attacks: more columns than fit
        full["releases"]["k5"]["attacks"][a] = {"rate": 0.1, "targets": 10}
    text = render_html(full)
    css = text.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "overflow-x" not in css and "overflow:hidden" not in css and "@media print" in css
    assert 'class="scroll"' not in text
    for chunk in text.split("<table")[1:]:
        head = chunk.split("</table>", 1)[0]
        first_row = head.split("</tr>", 1)[0]
        assert len(re.findall(r"<t[hd][ >]", first_row)) <= MAX_TABLE_COLUMNS
    # split, not dropped: every attack still has its column
    heads = _headers(text, "summary-attacks")
    assert all(f"{a} rate" in heads for a in names)
    assert text.count('<table class="summary-attacks part-') >= 3


def _crowded() -> dict[str, Any]:
    releases = {}
    for i in range(12):
        e = {"kind": "dp_histogram" if i % 2 else "k_anonymity", "summary": {}}
        e["summary"] = {"error": 0.2 + 0.001 * i, "attribute_advantage": 0.3 + 0.001 * i}
        releases[f"release_number_{i}"] = e
    releases["far"] = {"kind": "local_dp", "summary": {"error": 0.9, "attribute_advantage": 0.05}}
    return {"releases": releases, "generalisation": {}}


def test_tradeoff_labels_do_not_overlap() -> None:
    made = tradeoff_figure(_crowded())
    assert made is not None
    fig, texts = made
    renderer = fig.canvas.get_renderer()
    boxes = [text_box(t, renderer) for t in texts]
    assert len(boxes) == 13
    ax = fig.axes[0]
    p0 = ax.transData.transform((0.2, 0.3))
    p1 = ax.transData.transform((0.201, 0.301))
    # the points are closer than a label is tall: labels at one fixed offset would overlap
    assert abs(p1[1] - p0[1]) < boxes[0].height
    for i, a in enumerate(boxes):
        for b in boxes[:i]:
            assert not a.overlaps(b), (texts[i].get_text(), a, b)


def test_tradeoff_plots_the_common_measures(report: dict[str, Any]) -> None:
    full = _with_common(report["audit"])
    full["generalisation"] = {"k5": {"zip": {"text": "local recoding (mondrian)"}}}
    made = tradeoff_figure(full)
    assert made is not None
    fig, texts = made
    ax = fig.axes[0]
    drawn = sorted(
        (round(float(x), 9), round(float(y), 9)) for c in ax.collections for x, y in c.get_offsets()
    )
    for name, e in [("raw data (no protection)", full["baseline"]), *full["releases"].items()]:
        s = e["summary"]
        assert (round(s["error"], 9), round(s["attribute_advantage"], 9)) in drawn, name
    assert "advantage over the prior" in ax.get_ylabel()
    assert "common workload" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"raw", "Mondrian", "central DP"} <= set(legend)
    assert any("Pareto front" in t for t in legend) and any("chance" in t for t in legend)
    assert any("bound" in t for t in legend)  # dp1's bound drawn
    assert {t.get_text() for t in texts} == {"raw data (no protection)", "k5", "dp1"}
    assert tradeoff_figure(report["audit"]) is None  # no common measures: no fake plot


def test_findings_compare_on_common_measures(report: dict[str, Any]) -> None:
    assert not any("headline" in f for f in report["audit"]["findings"])
    assert any("not compared on attack success" in f for f in report["audit"]["findings"])
    full = _with_common(report["audit"])
    text = " ".join(comparison_findings(full["releases"]))
    assert "gains least over the public prior on dp1 (advantage 6.2%)" in text
    assert "most on k5 (37.5%)" in text
    assert "Highest membership advantage" in text and "k5 (5.0%)" in text


def test_publication_attacks_rendered_generically(report: dict[str, Any]) -> None:
    full = _with_common(report["audit"])
    full["publication_attacks"] = {
        "composition": [
            {
                "releases": ["k5", "dp1"],
                "odd_key": 0.25,
                "breach": True,
                "finding": "Intersecting k5 and dp1 narrows the disease of 1 in 4 targets.",
            }
        ],
        "row_linking": [{"releases": ["k5"], "breach": False, "finding": "No order survives."}],
    }
    text = render_html(full)
    section = text.split('<section id="publication-attacks">', 1)[1].split("</section>", 1)[0]
    assert "odd_key" in _headers(section, "publication-attack")
    assert 'data-value="0.25"' in section and '<td class="warn">yes</td>' in section
    assert "narrows the disease of 1 in 4 targets" in section and "No order survives." in section
    assert "BREACH: Intersecting k5" in render_markdown(full)


def test_budget_section_and_ratios(report: dict[str, Any]) -> None:
    full = _with_common(report["audit"])
    full["budget"] = {
        "releases": {
            "dp1": {"epsilon": 1.0, "delta": 0.0, "unit": "person", "published": True,
                    "ledger": "dataset ledger"},
        },
        "remaining": {"epsilon": 2.5, "delta": 1e-6},
        "spent": {"epsilon": 7.5, "delta": 0.0},
        "lifetime": {"epsilon": 10.0, "delta": 1e-6},
    }  # fmt: skip
    section = render_html(full).split('<section id="budget">', 1)[1].split("</section>", 1)[0]
    assert "e^ε = 2.72" in section and 'data-value="2.5"' in section
    assert "lifetime ε = 10" in section
    k5 = render_html(full).split('id="release-k5"', 1)[1].split("</section>", 1)[0]
    assert "20.0% (1 in 5)" in k5  # linkage bound 1/k shown as a ratio
    assert fmt_one_in(0.2) == "1 in 5" and fmt_one_in(0.001) == "1 in 1,000"
    assert fmt_one_in(0.3) == "1 in 3.3" and fmt_one_in(0) == "0"


def test_generalisation_levels_and_distributions(report: dict[str, Any]) -> None:
    audit = report["audit"]
    levels = audit["generalisation"]["k5"]
    assert set(levels) == set(QIS) and all(v["text"].startswith("level ") for v in levels.values())
    assert "dp1" not in audit["generalisation"]
    cols = audit["distributions"]["columns"]
    assert set(cols) == {*QIS, SA}
    disease = cols[SA]
    assert PLANTED not in disease["values"]  # one record: below min_count, pooled
    assert sum(disease["raw"]) == pytest.approx(1.0)
    raw_share = report["raw"][SA].value_counts(normalize=True)
    for v, share in zip(disease["values"][:-1], disease["raw"], strict=False):
        assert share == pytest.approx(raw_share[v])
    for name in ("k5", "dp1"):
        shares = disease["releases"][name]
        assert shares is not None and sum(shares) == pytest.approx(1.0)
        assert max(abs(a - b) for a, b in zip(shares, disease["raw"], strict=True)) < 0.05
    assert cols["zip"]["releases"]["dp1"] is None  # dp1 does not answer zip
    text = report["texts"]["report.html"]
    assert text.count('<figure class="dist"') == len(cols)


def test_plain_labels_per_category_equal_the_per_row_strings() -> None:
    """A staged (categorical) table's labels, turned to strings per category, are the
    strings each row would give; missing is "" either way."""
    import numpy as np
    import pandas as pd

    from privpipe.reports.run import _plain

    def per_row(column: pd.Series) -> list[str]:
        return column.astype(object).where(column.notna(), "").astype(str).tolist()

    for values in (
        ["02108", None, "*", "02108", "[30-40["],
        [39.0, 40.5, None, 39.0, 7.0],
        [1, 2, 2, 3, 1],
    ):
        columns = [pd.Series(values, dtype="category"), pd.Series(values, dtype=object)]
        if all(v is None or isinstance(v, str) for v in values):
            columns.append(pd.Series(values, dtype="str"))
        for column in columns:
            labels = _plain(column)
            assert labels.dtype == object
            assert labels.tolist() == per_row(column), (values, column.dtype)
    assert _plain(pd.Series(pd.Categorical([None, None], categories=["a"]))).tolist() == ["", ""]
    assert np.asarray(_plain(pd.Series([], dtype="category"))).size == 0


def test_reading_releases_does_not_load_the_renderer() -> None:
    """``privpipe.reports`` imports the renderer (and matplotlib) only when its functions
    are asked for: the publication attacks' worker reads releases without them."""
    code = (
        "import sys, privpipe.reports as r, privpipe.pipelines.pubattacks\n"
        "assert 'matplotlib' not in sys.modules and 'privpipe.reports.render' not in sys.modules\n"
        "from privpipe.reports import render_html, render_markdown\n"
        "from privpipe.reports import render\n"
        "assert (render_html, render_markdown) == (render.render_html, render.render_markdown)\n"
        "assert 'matplotlib' in sys.modules\n"
        "try:\n"
        "    r.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\n"
        "else:\n"
        "    raise SystemExit('an unknown name resolved')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_plots_drawn_before_the_late_keys_are_the_plots_drawn_after(
    report: dict[str, Any],
) -> None:
    """``render_figures`` reads no ``LATE_KEYS``: plots drawn while the publication attacks
    are still coming are the report's plots, and ``render_html`` uses the figures it is
    given instead of drawing them again."""
    from privpipe.reports.render import LATE_KEYS, Figures, render_figures

    audit = report["audit"]
    html = render_html(audit)
    assert html == report["texts"]["report.html"]
    early = {k: v for k, v in audit.items() if k not in LATE_KEYS}
    figures = render_figures(early)
    assert figures.attacks and all(svg for _, svg in figures.attacks)
    assert render_html(audit, figures) == html
    changed = {**audit, "findings": ["another finding"], "publication_attacks": {"x": []}}
    assert render_figures(changed) == figures
    given = Figures("<svg>given trade-off</svg>", (("homogeneity", "<svg>given bars</svg>"),))
    drawn = render_html(audit, given)
    assert "<svg>given trade-off</svg>" in drawn and "<svg>given bars</svg>" in drawn
    assert all(svg not in drawn for _, svg in figures.attacks if svg)
