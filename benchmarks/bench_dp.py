"""Central DP: a histogram with private partition selection through `privpipe run`.

Workload (issue 4): 1,000 Zipf-distributed keys (s = 1.1), 100,000 persons, 1M and 10M
rows; one dp_histogram over the key with private partition selection (ε = 1, δ = 1e-8,
below 1/rows; each person bounded to 4 keys and 2 rows per key), DirectRunner in process.
Reports the process wall time (interpreter start, imports and Beam start-up included), the run's own
time from the manifest, rows/s for both, and the peak RSS of the process tree.

If a separate venv with pipeline-dp exists (``--pipeline-dp PYTHON``), the same workload
runs through pipeline_dp's Beam API (DirectRunner, same bounds and budget) for the ratio.

``--workload wide`` (issue 14): rows of (user, key, float value), the same persons and Zipf
keys; one dp_sum of the value per key (clamped to [0, 100], each person bounded to 4 keys
and 2 rows per key) with private partition selection; pipeline_dp runs the same Sum.

    python benchmarks/bench_dp.py [--rows 1000000 10000000] [--workload count|wide]
        [--pipeline-dp /path/python]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks._measure import machine, measure  # noqa: E402

CACHE = HERE / ".cache"
PERSONS = 100_000
KEYS = 1_000
ZIPF_S = 1.1
CHUNK = 1_000_000


def data_file(rows: int, wide: bool = False) -> Path:
    """person_id,key[,value] rows (cached): persons uniform, keys Zipf over 1,000 values,
    values uniform floats in [0, 100) (nearly all distinct)."""
    path = CACHE / f"dp-zipf{'-wide' if wide else ''}-{rows}.csv"
    if path.exists():
        return path
    CACHE.mkdir(exist_ok=True)
    rng = np.random.default_rng(20261122)
    weights = 1.0 / np.arange(1, KEYS + 1) ** ZIPF_S
    weights /= weights.sum()
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write("person_id,key,value\n" if wide else "person_id,key\n")
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            frame = pd.DataFrame(
                {
                    "person_id": np.char.add("u", rng.integers(0, PERSONS, n).astype(str)),
                    "key": np.char.add("k", rng.choice(KEYS, n, p=weights).astype(str)),
                }
            )
            if wide:
                frame["value"] = np.round(rng.random(n) * 100, 6)
            frame.to_csv(f, header=False, index=False)
    tmp.replace(path)
    return path


def release(wide: bool) -> dict[str, object]:
    """The benchmarked release: a histogram of the key, or the sum of the value per key."""
    common = {"epsilon": 1.0, "delta": 1e-8, "group_by": ["key"], "max_partitions": 4}
    if wide:
        return {"name": "hist", "kind": "dp_sum", "value": "value", "bounds": [0.0, 100.0],
                "max_contributions_per_partition": 2, **common}  # fmt: skip
    return {"name": "hist", "kind": "dp_histogram", "max_contributions_per_partition": 2, **common}


def config(tmp: Path, rows: int, wide: bool = False) -> Path:
    cfg = {
        "name": f"dp-bench-{rows}",
        "input": {"path": str(data_file(rows, wide))},
        "schema": {
            "privacy_unit": "person_id",
            "max_units": 10_000_000,
            **({"types": {"value": "float"}} if wide else {}),
        },
        "releases": [release(wide)],
        "budget": {
            "ledger": str(tmp / f"ledger-{rows}.sqlite"),
            "key_file": str(tmp / "ledger.key"),
            "heads_file": str(tmp / "ledger.heads"),
        },
        "output": {"dir": str(tmp / f"out-{rows}")},
    }
    path = tmp / f"dp-{rows}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # a run never creates its ledger: create it on purpose, as an operator would (untimed)
    init = ["budget", "init", cfg["budget"]["ledger"], "--dataset", cfg["name"]]
    init += ["--epsilon", "100", "--delta", "1e-3", "--key-file", cfg["budget"]["key_file"]]
    init += ["--heads", cfg["budget"]["heads_file"]]
    subprocess.run([sys.executable, "-m", "privpipe.pipelines.cli", *init], check=True)
    return path


def measured(cmd: list[str], timeout: float = 1800) -> dict[str, object]:
    """``measure`` plus the user+sys CPU seconds of the command (a finished child's, from
    getrusage: on a shared machine CPU time is disturbed less than wall time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = measure(cmd, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {**res, "cpu_s": round(cpu, 3)}


def privpipe_run(tmp: Path, rows: int, wide: bool = False) -> dict[str, object]:
    cfg = str(config(tmp, rows, wide))
    res = measured([sys.executable, "-m", "privpipe.pipelines.cli", "run", cfg])
    out = tmp / f"out-{rows}"
    manifest = json.loads((out / "internal" / "manifest.json").read_text())
    cells = len(pd.read_csv(out / "public" / "hist" / "data.csv"))
    run_s = float(manifest["seconds"])
    return {
        "tool": "privpipe",
        "workload": "wide" if wide else "count",
        "rows": rows,
        "wall_s": res["wall_s"],
        "cpu_s": res["cpu_s"],
        "run_s": run_s,
        "rows_per_s_wall": round(rows / res["wall_s"]),
        "rows_per_s_run": round(rows / run_s),
        "peak_rss_mb": res["peak_rss_mb"],
        "cells_released": cells,
    }


PIPELINE_DP_SCRIPT = """
import json, sys, time
import apache_beam as beam
import pipeline_dp
from pipeline_dp.private_beam import MakePrivate, Count, Sum
from pipeline_dp.aggregate_params import CountParams, SumParams
path, wide = sys.argv[1], sys.argv[2] == "wide"
bounds = dict(noise_kind=pipeline_dp.NoiseKind.LAPLACE, max_partitions_contributed=4,
              max_contributions_per_partition=2, partition_extractor=lambda r: r[1])
t0 = time.perf_counter()
with beam.Pipeline(runner="DirectRunner") as p:
    rows = p | beam.io.ReadFromText(path, skip_header_lines=1) | beam.Map(lambda l: l.split(","))
    budget = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-8)
    private = rows | MakePrivate(budget_accountant=budget, privacy_id_extractor=lambda r: r[0])
    if wide:
        cells = private | Sum(SumParams(**bounds, min_value=0.0, max_value=100.0,
                                        value_extractor=lambda r: float(r[2])))
    else:
        cells = private | Count(CountParams(**bounds))
    budget.compute_budgets()
    _ = cells | beam.combiners.Count.Globally() | beam.Map(lambda n: print("cells", n))
print(json.dumps({"run_s": round(time.perf_counter() - t0, 3)}))
"""


def pipeline_dp_run(python: str, tmp: Path, rows: int, wide: bool = False) -> dict[str, object]:
    script = tmp / "pdp.py"
    script.write_text(PIPELINE_DP_SCRIPT)
    workload = "wide" if wide else "count"
    res = measured([python, str(script), str(data_file(rows, wide)), workload], timeout=3600)
    return {
        "tool": "pipeline_dp",
        "workload": "wide" if wide else "count",
        "rows": rows,
        "wall_s": res["wall_s"],
        "cpu_s": res["cpu_s"],
        "rows_per_s_wall": round(rows / res["wall_s"]),
        "peak_rss_mb": res["peak_rss_mb"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--workload", choices=["count", "wide"], default="count")
    ap.add_argument("--pipeline-dp", help="python of a venv with pipeline-dp installed")
    args, _ = ap.parse_known_args()
    wide = args.workload == "wide"
    print(json.dumps({"benchmark": "dp", "date": datetime.now(UTC).isoformat(timespec="seconds"),
                      "machine": machine()}), flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for rows in args.rows:
            print(json.dumps(privpipe_run(tmp, rows, wide)), flush=True)
            if args.pipeline_dp:
                print(json.dumps(pipeline_dp_run(args.pipeline_dp, tmp, rows, wide)), flush=True)


if __name__ == "__main__":
    main()
