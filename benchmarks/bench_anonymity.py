"""Anonymisation: search time on Adult, whole-run time, and scaling with rows.

1. Adult (30,162 rows, 8 QIs, ARX hierarchies), k=5 at 0% and 5% suppression and
   k=5 + distinct l=3, metric loss: the optimal search alone (pure core, median of
   5 runs), nodes checked and the optimum; Mondrian k=5 for comparison.
2. The whole `privpipe run` (fresh process, wall clock) of Adult with one k=5 release.
3. Demo microdata, 1M and 10M rows, one k=5 (5%) release: end-to-end wall time and
   peak RSS, and the search time from release.json (it depends on the distinct
   combinations, not on rows).

    python benchmarks/bench_anonymity.py [--rows 1000000 10000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks._measure import machine, measure  # noqa: E402
from benchmarks.bench_io import data_file  # noqa: E402
from tests.conftest import ADULT_QIS  # noqa: E402

ARX = ROOT.parent / "shared" / "data" / "arx"
QIS = list(ADULT_QIS)


def adult_search() -> list[dict]:
    import pandas as pd

    from anonymity.hierarchy import load_arx_csv
    from anonymity.models import DistinctLDiversity, KAnonymity
    from anonymity.mondrian import mondrian
    from anonymity.search import optimal
    from anonymity.summary import Summary
    from anonymity.transformation import Evaluator

    df = pd.read_csv(ARX / "adult.csv", sep=";", dtype=str)
    h = {c: load_arx_csv(ARX / f"adult_hierarchy_{c}.csv", c) for c in [*QIS, "occupation"]}
    qh = {q: h[q] for q in QIS}
    t0 = time.perf_counter()
    summary = Summary.from_frame(df, QIS, "occupation", qh)
    summary_s = time.perf_counter() - t0
    out = []
    cases = [
        ("k=5, 0%", [KAnonymity(5)], 0.0),
        ("k=5, 5%", [KAnonymity(5)], 0.05),
        ("k=5 + distinct l=3, 5%", [KAnonymity(5), DistinctLDiversity(3)], 0.05),
    ]
    for label, models, limit in cases:
        times, result = [], None
        for _ in range(5):
            ev = Evaluator(summary, qh)
            t = time.perf_counter()
            result = optimal(ev, models, suppression_limit=limit, metric="loss")
            times.append(time.perf_counter() - t)
        assert result is not None
        out.append(
            {
                "case": label,
                "search_s": round(statistics.median(times), 4),
                "nodes_checked": result.nodes_checked,
                "lattice": result.lattice_size,
                "optimum": dict(result.levels),
                "loss": round(result.value, 6),
                "suppressed_records": result.suppressed_records,
                "summary_s": round(summary_s, 4),
                "distinct_tuples": summary.n_distinct,
            }
        )
    t = time.perf_counter()
    m = mondrian(summary, qh, [KAnonymity(5)], numeric=("age",))
    out.append(
        {
            "case": "mondrian k=5",
            "search_s": round(time.perf_counter() - t, 4),
            "partitions": m.partitions,
        }
    )
    return out


def run_config(config: Path) -> dict:
    return measure([sys.executable, "-m", "pipelines.cli", "run", str(config)])


def adult_run(tmp: Path) -> dict:
    cfg = {
        "name": "adult",
        "input": {"path": str(ARX / "adult.csv"), "delimiter": ";"},
        "schema": {"quasi_identifiers": QIS, "sensitive": "occupation"},
        "hierarchies": {c: {"file": str(ARX / f"adult_hierarchy_{c}.csv")} for c in QIS},
        "releases": [{"name": "k5", "kind": "k_anonymity", "k": 5}],
        "report": {"enabled": False},  # the anonymisation run alone (audit: see below)
        "output": {"dir": str(tmp / "adult-out")},
    }
    path = tmp / "adult.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = run_config(path)
    manifest = json.loads((tmp / "adult-out" / "internal" / "manifest.json").read_text())
    doc = manifest["release_details"]["k5"]  # the search figures stay out of public/
    return {
        "wall_s": res["wall_s"],
        "peak_rss_mb": res["peak_rss_mb"],
        "search_s": round(doc["search"]["seconds"], 4),
    }


def demo_run(tmp: Path, rows: int) -> dict:
    from pipelines.cli import DEMO_CONFIG

    text = DEMO_CONFIG.read_text()
    cfg = yaml.safe_load(text)
    cfg["input"]["path"] = str(data_file(rows))
    cfg["hierarchies"] = {
        c: ({"file": str(DEMO_CONFIG.parent / h["file"])} if "file" in h else h)
        for c, h in cfg["hierarchies"].items()
    }
    cfg["releases"] = [{"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05}]
    # the anonymisation pipeline alone: no attacks, DP budget or audit report (measured
    # separately); the demo's other releases are dropped above
    for key in ("attacks", "budget", "sweep", "publish"):
        cfg.pop(key, None)
    cfg["report"] = {"enabled": False}
    cfg["output"] = {"dir": str(tmp / f"demo-{rows}")}
    path = tmp / f"demo-{rows}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = run_config(path)
    out = tmp / f"demo-{rows}"
    manifest = json.loads((out / "internal" / "manifest.json").read_text())
    doc = manifest["release_details"]["k5"]  # the search figures stay out of public/
    return {
        "rows": rows,
        "wall_s": res["wall_s"],
        "peak_rss_mb": res["peak_rss_mb"],
        "search_s": round(doc["search"]["seconds"], 4),
        "plan_s": round(doc["search"].get("total_seconds", 0.0), 4),
        "distinct_qi_sa": manifest["profile"]["qi_combinations"]["distinct"],
        "nodes_checked": doc["search"].get("nodes_checked"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    args, _ = ap.parse_known_args()
    result: dict = {
        "benchmark": "anonymity",
        "date": datetime.now(UTC).date().isoformat(),
        "machine": machine(),
    }
    if (ARX / "adult.csv").exists():
        result["adult_search"] = adult_search()
        with tempfile.TemporaryDirectory() as tmp:
            result["adult_privpipe_run"] = adult_run(Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        result["demo_end_to_end"] = [demo_run(Path(tmp), n) for n in args.rows]
    adult = result.get("adult_search", [])
    result["targets"] = {
        "adult_search_le_0.3s": all(c["search_s"] <= 0.3 for c in adult[:2]) if adult else None,
        "adult_run_le_5s": result.get("adult_privpipe_run", {}).get("wall_s", 99) <= 5,
        "10m_le_90s": all(
            d["wall_s"] <= 90 for d in result["demo_end_to_end"] if d["rows"] >= 10_000_000
        ),
        "10m_rss_lt_2gb": all(
            d["peak_rss_mb"] < 2048 for d in result["demo_end_to_end"] if d["rows"] >= 10_000_000
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
