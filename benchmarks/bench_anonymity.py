"""Anonymisation: search time on Adult, whole-run time, and scaling with rows.

1. Adult (30,162 rows, 8 QIs, ARX hierarchies), k=5 at 0% and 5% suppression and
   k=5 + distinct l=3, metric loss: the optimal search alone (pure core, median of
   5 runs), nodes checked and the optimum; Mondrian k=5 for comparison.
2. The whole `privpipe run` (fresh process, wall clock) of Adult with one k=5 release.
3. Demo microdata, 1M and 10M rows, one k=5 (5%) release: end-to-end wall time and
   peak RSS, and the search time from release.json (it depends on the distinct
   combinations, not on rows).

    python benchmarks/bench_anonymity.py [--rows 1000000 10000000]

4. ``--searches N [--no-runs]``: only the demo's optimal searches (issue 14) on N demo
   rows: k5 at 0% and 5% suppression, l3 (recursive (4,3)) and t03 (hierarchical
   t=0.3), all ``unit: person``. The frequency table once, then per release the
   summary, search and metrics in-process (``search_s`` wall, ``context_cpu_s``,
   ``nodes``, the optimum), and unless ``--no-runs`` the whole ``privpipe run`` of a
   config with that release alone (``run_wall_s``, ``run_cpu_s``).

    python benchmarks/bench_anonymity.py --searches 1000000
"""

from __future__ import annotations

import argparse
import json
import resource
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

    from privpipe.anonymity.hierarchy import load_arx_csv
    from privpipe.anonymity.models import DistinctLDiversity, KAnonymity
    from privpipe.anonymity.mondrian import mondrian
    from privpipe.anonymity.search import optimal
    from privpipe.anonymity.summary import Summary
    from privpipe.anonymity.transformation import Evaluator

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
    return measure([sys.executable, "-m", "privpipe.pipelines.cli", "run", str(config)])


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
    k5 = {"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05}
    path = _one_release_config(tmp, rows, k5, f"demo-{rows}")
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


DEMO_SEARCHES = ("k5_0", "k5", "l3", "t03")
"""The demo's three optimal-search releases, and k5 without suppression."""


def _one_release_config(tmp: Path, rows: int, release: dict, stem: str) -> Path:
    """A copy of the demo config on the cached demo data with ``release`` as its only
    release: the anonymisation pipeline alone, no attacks, DP budget or audit report
    (measured separately); output in ``tmp/stem``."""
    from privpipe.pipelines.cli import DEMO_CONFIG

    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg["input"]["path"] = str(data_file(rows))
    cfg["hierarchies"] = {
        c: ({"file": str(DEMO_CONFIG.parent / h["file"])} if "file" in h else h)
        for c, h in cfg["hierarchies"].items()
    }
    cfg["releases"] = [release]
    for key in ("attacks", "budget", "sweep", "publish"):
        cfg.pop(key, None)
    cfg["report"] = {"enabled": False}
    cfg["output"] = {"dir": str(tmp / stem)}
    path = tmp / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _demo_config(tmp: Path, rows: int, release: str) -> Path:
    """The demo config with one of its anonymised releases (``k5_0``: k5 at 0%
    suppression) and nothing else."""
    from privpipe.pipelines.cli import DEMO_CONFIG

    by_name = {r["name"]: r for r in yaml.safe_load(DEMO_CONFIG.read_text())["releases"]}
    chosen = dict(by_name["k5" if release == "k5_0" else release])
    if release == "k5_0":
        chosen.update(name="k5_0", suppression_limit=0.0)
    return _one_release_config(tmp, rows, chosen, f"demo-{rows}-{release}")


def demo_searches(rows: int, runs: bool = True) -> list[dict]:
    """The demo's optimal searches on ``rows`` demo rows (person-level, as configured):
    the frequency table once (as the pipeline's ``FrequencyTable``), then per release
    ``make_context`` (summary, search, metrics) in-process: search seconds and nodes;
    with ``runs`` also the whole ``privpipe run`` of a single-release config (wall, CPU)."""
    import pandas as pd

    from privpipe.pipelines.hierarchies import HierarchyResolver
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.run import anonymization_spec
    from privpipe.transforms.anonymize import FrequencyTable, counted_columns, make_context

    out = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        freq = None
        for release in DEMO_SEARCHES:
            config = _demo_config(tmp, rows, release)
            plan = load_plan(config)
            spec = anonymization_spec(plan.config.releases[0], plan)
            if freq is None:
                t = time.perf_counter()
                fn = FrequencyTable(
                    counted_columns(spec), True, [spec.unit_by] if spec.unit_by else []
                )
                acc = fn.create_accumulator()
                for chunk in pd.read_csv(
                    plan.input_paths[0], dtype=str, chunksize=200_000, keep_default_na=False
                ):
                    acc = fn.add_input(acc, chunk)
                freq = fn.extract_output(fn.merge_accumulators([acc]))
                table_s = time.perf_counter() - t
            resolver = HierarchyResolver(plan.config.hierarchies, plan.hierarchies)
            t, cpu0 = time.perf_counter(), time.process_time()
            ctx = make_context(freq, spec, resolver)
            context_s = time.perf_counter() - t
            context_cpu_s = time.process_time() - cpu0  # less disturbed by other load
            search = ctx.plan.search
            row = {
                "release": release,
                "rows": rows,
                "frequency_table_s": round(table_s, 3),
                "distinct_rows": len(freq),
                "search_s": round(search["seconds"], 3),
                "plan_s": round(search["total_seconds"], 3),
                "context_s": round(context_s, 3),
                "context_cpu_s": round(context_cpu_s, 3),
                "nodes": search["nodes_checked"],
                "lattice": search["lattice_size"],
                "optimum": search["transformation"],
                "suppressed_records": search["suppressed_records"],
            }
            if runs:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                res = run_config(config)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                row["run_wall_s"] = res["wall_s"]
                row["run_cpu_s"] = round(cpu, 2)
                row["run_peak_rss_mb"] = res["peak_rss_mb"]
            out.append(row)
            print(json.dumps(row), file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    ap.add_argument(
        "--searches",
        type=int,
        default=None,
        metavar="ROWS",
        help="only the demo's optimal searches (k5 0%%/5%%, l3, t03) on ROWS demo rows",
    )
    ap.add_argument("--no-runs", action="store_true", help="with --searches: no privpipe run")
    args, _ = ap.parse_known_args()
    if args.searches:
        searches = demo_searches(args.searches, runs=not args.no_runs)
        print(
            json.dumps(
                {"benchmark": "anonymity_searches", "machine": machine(), "searches": searches}
            )
        )
        return
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
