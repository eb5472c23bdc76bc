"""The recommendation: Pareto front, dominance and the publishing rule (reports/decide.py).

Audits are written by hand with exactly the keys of the issue-13 contract (§2 summary
``error``/``attribute_advantage``/``membership_advantage``, ``common.attribute_inference``
with its interval and prior), so these tests do not wait for the branches producing them.
The demo test runs the whole pipeline and checks the recommendation and budget it writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privpipe.pipelines.config import ReportConfig
from privpipe.reports.decide import (
    DEFAULT_MAX_ADVANTAGE,
    Point,
    advantage_interval,
    dominates,
    pareto_front,
    points,
    recommend,
)
from tests.layout import internal_file, release_dir


def _entry(
    error: float | None,
    adv: float | None,
    mem: float | None = None,
    half: float = 0.02,
    prior: float = 0.2,
    kind: str = "k_anonymity",
) -> dict[str, Any]:
    """A release entry with the contract's keys; the accuracy interval is ±half around the
    accuracy the advantage implies."""
    summary: dict[str, Any] = {"error": error, "attribute_advantage": adv}
    if mem is not None:
        summary["membership_advantage"] = mem
    entry: dict[str, Any] = {"kind": kind, "summary": summary}
    if adv is not None:
        acc = prior + adv * (1 - prior)
        entry["common"] = {
            "attribute_inference": {
                "accuracy": acc,
                "interval": [acc - half, acc + half],
                "prior_accuracy": prior,
                "advantage_prior": adv,
            }
        }
    return entry


def _audit(releases: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"releases": releases, **extra}


def _p(name: str, e: float | None, a: float | None, m: float | None = None) -> Point:
    return Point(name, "k_anonymity", e, a, None, m)


def test_dominance_is_strict_and_needs_both_measures() -> None:
    a, b = _p("a", 0.1, 0.2), _p("b", 0.2, 0.3)
    assert dominates(a, b) and not dominates(b, a)
    assert not dominates(a, _p("a2", 0.1, 0.2))  # a tie dominates nothing
    assert not dominates(a, _p("c", 0.05, 0.5))  # trade-off: neither dominates
    assert not dominates(a, _p("none", None, 0.9)) and not dominates(_p("x", None, 0.0), b)


def test_membership_is_a_criterion_only_where_both_have_it() -> None:
    leaky, tight = _p("leaky", 0.2, 0.2, 0.5), _p("tight", 0.2, 0.2, 0.1)
    assert dominates(tight, leaky) and not dominates(leaky, tight)
    unknown = _p("unknown", 0.2, 0.2)
    assert not dominates(tight, unknown) and not dominates(unknown, leaky)
    # a worse membership advantage breaks dominance on the other two
    assert not dominates(_p("m", 0.1, 0.1, 0.9), _p("n", 0.2, 0.2, 0.1))


def test_front_on_a_hand_made_set() -> None:
    audit = _audit(
        {
            "useful": _entry(0.10, 0.50),
            "balanced": _entry(0.20, 0.20),
            "twin": _entry(0.20, 0.20),  # tie with balanced: both stay on the front
            "worse": _entry(0.30, 0.30),  # dominated by balanced and twin
            "safe": _entry(0.60, 0.01),
            "unmeasured": _entry(0.15, None),
        },
        baseline=_entry(0.0, 0.9, kind="raw"),  # never a candidate
    )
    front = [p.name for p in pareto_front(points(audit))]
    assert front == ["useful", "balanced", "twin", "safe"]
    rec = recommend(audit, max_advantage=0.25)
    assert rec["front"] == front
    assert rec["dominated"] == {"worse": ["balanced", "twin"]}
    assert rec["not_compared"] == {"unmeasured": "no common attribute advantage"}
    # lowest error on the front with the advantage interval's upper end <= 0.25
    assert rec["choice"] == "balanced" and rec["within_threshold"]
    assert rec["sentences"][0] == "Publish balanced."
    text = " ".join(rec["sentences"])
    assert "worse is dominated by balanced, twin" in text
    assert "unmeasured is not compared" in text
    assert "raw" not in rec["points"]


def test_the_interval_not_the_point_must_stay_under_the_threshold() -> None:
    audit = _audit(
        {
            "wide": _entry(0.10, 0.08, half=0.10),  # point 8%, upper end ~20.5%
            "narrow": _entry(0.30, 0.07, half=0.005),
        }
    )
    assert advantage_interval(audit["releases"]["wide"])[1] == pytest.approx(0.205)
    assert recommend(audit, max_advantage=0.1)["choice"] == "narrow"
    assert recommend(audit, max_advantage=0.25)["choice"] == "wide"


def test_nothing_under_the_threshold_falls_back_to_the_least_leaking() -> None:
    audit = _audit({"a": _entry(0.1, 0.6), "b": _entry(0.3, 0.4), "c": _entry(0.2, 0.7)})
    rec = recommend(audit, max_advantage=0.05)
    assert rec["choice"] == "b" and not rec["within_threshold"]
    assert rec["reason"].startswith("No release on the front keeps")
    assert "c is dominated by a" in " ".join(rec["sentences"])


def test_no_measures_no_choice() -> None:
    rec = recommend(_audit({"a": _entry(None, None), "b": _entry(0.2, None)}))
    assert rec["choice"] is None and rec["front"] == []
    assert "none can be recommended" in rec["sentences"][0]


def test_published_set_against_the_recommendation() -> None:
    audit = _audit(
        {"a": _entry(0.1, 0.05), "b": _entry(0.3, 0.3)}, publication={"published": ["b"]}
    )
    rec = recommend(audit)
    assert rec["choice"] == "a" and rec["differs_from_published"]
    assert "This run published b, not a." in rec["sentences"]
    same = recommend(audit, published=["a"])
    assert not same["differs_from_published"]
    assert not any("This run published" in x for x in same["sentences"])


def test_a_dominated_release_is_never_recommended() -> None:
    rng = np.random.default_rng(13)  # test data only (no release is drawn here)
    for _ in range(300):
        n = int(rng.integers(1, 8))
        releases = {
            f"r{i}": _entry(
                float(rng.choice([0.1, 0.2, 0.3, rng.random()])),
                float(rng.choice([0.05, 0.2, rng.random()])),
                None if rng.random() < 0.5 else float(rng.random()),
            )
            for i in range(n)
        }
        audit = _audit(releases)
        rec = recommend(audit, max_advantage=float(rng.random() * 0.3))
        pts = {p.name: p for p in points(audit)}
        assert rec["choice"] in rec["front"]
        assert not any(dominates(q, pts[rec["choice"]]) for q in pts.values())
        assert rec["choice"] not in rec["dominated"]


def test_config_default_threshold_is_the_rule_default() -> None:
    assert ReportConfig().max_advantage == DEFAULT_MAX_ADVANTAGE
    with pytest.raises(ValueError, match="max_advantage"):
        ReportConfig(max_advantage=1.5)


@pytest.mark.slow
def test_demo_recommendation_and_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from privpipe.pipelines.cli import main

    out = tmp_path / "d"
    assert main(["demo", "--output", str(out), "--rows", "3000"]) == 0, capsys.readouterr().err
    audit = json.loads(internal_file(out, "audit.json").read_text())
    manifest = json.loads(internal_file(out, "manifest.json").read_text())
    rec = audit["recommendation"]
    assert rec == recommend(audit, DEFAULT_MAX_ADVANTAGE, manifest["published"])
    # every release carries the common measures; the choice is on the front, undominated,
    # and the report opens with it
    assert all(
        (e.get("summary") or {}).get("attribute_advantage") is not None
        for e in audit["releases"].values()
    )
    assert rec["choice"] in rec["front"]
    assert rec["choice"] not in rec["dominated"]
    html = internal_file(out, "report.html").read_text()
    assert html.index(f"Publish {rec['choice']}") < html.index("Findings")
    assert rec["published"] == manifest["published"]
    # budget: each DP release's charge is its release.json's, the remainder the ledger's
    budget = audit["budget"]
    assert set(budget["releases"]) == {
        "dp_diagnosis",
        "dp_zip",
        "dp_salary",
        "dp_salary_quartiles",
        "ldp_diagnosis",
        "weekly_visits",
    }
    for name, charge in budget["releases"].items():
        doc = json.loads((release_dir(out, name) / "release.json").read_text())
        g = doc["guarantee"]
        if "charged" in doc:
            expected = doc["charged"]["epsilon"], doc["charged"]["delta"]
        elif "ledger_epsilon" in g:
            expected = g["ledger_epsilon"], g["delta"]
        else:
            expected = g["epsilon"], g["delta"]
        assert (charge["epsilon"], charge["delta"]) == expected, name
        assert charge["published"] == (name in manifest["published"])
    assert budget["releases"]["dp_zip"]["epsilon"] == 0.5
    assert budget["releases"]["ldp_diagnosis"]["epsilon"] == 2.0
    assert budget["releases"]["weekly_visits"]["unit"] == "event"
    assert budget["remaining"] == manifest["budget"]["remaining"]
    assert budget["spent"]["epsilon"] == 2.5
    html = internal_file(out, "report.html").read_text()
    assert html.index('id="recommendation"') < html.index('id="findings"')
    assert 'id="budget"' in html and "e^ε = 1.65" in html  # dp_zip's ε = 0.5
