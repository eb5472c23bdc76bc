"""Central DP statistics (issue 16): dp_quantile and dp_variance through `privpipe run`,
next to PipelineDP's PERCENTILE and VARIANCE on the same data.

Workload: bench_dp.py's wide rows (person_id, key, value): 100,000 persons, 1,000
Zipf-distributed keys, values uniform in [0, 100); per key, with private partition
selection (ε = 1, δ = 1e-8), each person bounded to 4 keys and 2 rows per key, values
clamped to [0, 100]:

- quantile: privpipe dp_quantile [0.25, 0.5, 0.75] on the grid of step 0.01 (10,001
  candidates); PipelineDP PERCENTILE(25), (50), (75) (its quantile tree);
- variance: privpipe dp_variance at resolution 0.01; PipelineDP VARIANCE.

DirectRunner in process for both. Reports wall, user+sys CPU of the process, rows/s and
peak RSS, as JSON lines.

    python benchmarks/bench_dp_stats.py [--rows 1000000] [--stat quantile variance]
        [--pipeline-dp /tmp/eng/pdpvenv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._measure import machine  # noqa: E402
from benchmarks.bench_dp import data_file, measured  # noqa: E402

BOUNDS = dict(epsilon=1.0, delta=1e-8, max_partitions=4, max_contributions_per_partition=2)


def release(stat: str) -> dict[str, object]:
    """The benchmarked release over the wide workload's value per key."""
    common = {"name": "stat", "value": "value", "bounds": [0.0, 100.0], "resolution": 0.01,
              "group_by": ["key"], **BOUNDS}  # fmt: skip
    if stat == "quantile":
        return {"kind": "dp_quantile", "quantiles": [0.25, 0.5, 0.75], **common}
    return {"kind": "dp_variance", **common}


def config(tmp: Path, rows: int, stat: str) -> Path:
    name = f"dp-stats-{stat}-{rows}"
    budget = {
        "ledger": str(tmp / f"{name}.sqlite"),
        "key_file": str(tmp / "ledger.key"),
        "heads_file": str(tmp / f"{name}.heads"),
    }
    cfg = {
        "name": name,
        "input": {"path": str(data_file(rows, wide=True))},
        "schema": {
            "privacy_unit": "person_id",
            "max_units": 10_000_000,
            "types": {"value": "float"},
        },
        "releases": [release(stat)],
        "budget": budget,
        "output": {"dir": str(tmp / f"out-{name}")},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # a run never creates its ledger: create it on purpose, as an operator would (untimed)
    init = ["budget", "init", budget["ledger"], "--dataset", name, "--epsilon", "100"]
    init += ["--delta", "1e-3", "--key-file", budget["key_file"], "--heads", budget["heads_file"]]
    subprocess.run([sys.executable, "-m", "privpipe.pipelines.cli", *init], check=True)
    return path


def privpipe_run(tmp: Path, rows: int, stat: str) -> dict[str, object]:
    cfg = config(tmp, rows, stat)
    res = measured([sys.executable, "-m", "privpipe.pipelines.cli", "run", str(cfg)])
    out = tmp / f"out-dp-stats-{stat}-{rows}"
    manifest = json.loads((out / "internal" / "manifest.json").read_text())
    stages = (manifest.get("timings") or {}).get("stages") or {}
    return {
        "tool": "privpipe",
        "stat": stat,
        "rows": rows,
        "wall_s": res["wall_s"],
        "cpu_s": res["cpu_s"],
        "run_s": float(manifest["seconds"]),
        "rows_per_s_wall": round(rows / float(res["wall_s"])),
        "peak_rss_mb": res["peak_rss_mb"],
        "cells_released": len(pd.read_csv(out / "public" / "stat" / "data.csv")),
        "stages": {k: round(float(v), 2) for k, v in stages.items()},
    }


PIPELINE_DP_SCRIPT = """
import json, sys, time
import apache_beam as beam
import pipeline_dp
path, stat = sys.argv[1], sys.argv[2]
metrics = ([pipeline_dp.Metrics.PERCENTILE(25), pipeline_dp.Metrics.PERCENTILE(50),
            pipeline_dp.Metrics.PERCENTILE(75)] if stat == "quantile"
           else [pipeline_dp.Metrics.VARIANCE])
params = pipeline_dp.AggregateParams(
    metrics=metrics, noise_kind=pipeline_dp.NoiseKind.LAPLACE, max_partitions_contributed=4,
    max_contributions_per_partition=2, min_value=0.0, max_value=100.0)
extract = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                     partition_extractor=lambda r: r[1],
                                     value_extractor=lambda r: float(r[2]))
t0 = time.perf_counter()
with beam.Pipeline(runner="DirectRunner") as p:
    rows = p | beam.io.ReadFromText(path, skip_header_lines=1) | beam.Map(lambda l: l.split(","))
    budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-8)
    engine = pipeline_dp.DPEngine(budget, pipeline_dp.BeamBackend())
    cells = engine.aggregate(rows, params, extract)
    budget.compute_budgets()
    _ = cells | beam.combiners.Count.Globally() | beam.Map(lambda n: print("cells", n))
print(json.dumps({"run_s": round(time.perf_counter() - t0, 3)}))
"""


def pipeline_dp_run(python: str, tmp: Path, rows: int, stat: str) -> dict[str, object]:
    script = tmp / "pdp_stats.py"
    script.write_text(PIPELINE_DP_SCRIPT)
    res = measured([python, str(script), str(data_file(rows, wide=True)), stat], timeout=3600)
    return {
        "tool": "pipeline_dp",
        "stat": stat,
        "rows": rows,
        "wall_s": res["wall_s"],
        "cpu_s": res["cpu_s"],
        "rows_per_s_wall": round(rows / float(res["wall_s"])),
        "peak_rss_mb": res["peak_rss_mb"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--stat", nargs="+", choices=["quantile", "variance"],
                    default=["quantile", "variance"])  # fmt: skip
    ap.add_argument("--pipeline-dp", help="python of a venv with pipeline-dp installed")
    args, _ = ap.parse_known_args()
    date = datetime.now(UTC).isoformat(timespec="seconds")
    print(json.dumps({"benchmark": "dp_stats", "machine": machine(), "date": date}), flush=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for rows in args.rows:
            for stat in args.stat:
                print(json.dumps(privpipe_run(tmp, rows, stat)), flush=True)
                if args.pipeline_dp:
                    print(
                        json.dumps(pipeline_dp_run(args.pipeline_dp, tmp, rows, stat)), flush=True
                    )


if __name__ == "__main__":
    main()
