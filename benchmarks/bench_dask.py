"""Scaling on Dask (issue 15): one k=5 release and one DP histogram, DirectRunner vs Dask.

Workloads (the existing benchmarks' configs, reused as they are):
- ``anonymity``: bench_anonymity's one-release config on the demo rows: k=5, 5% suppression
  (read, summary, search on the summary, recode, verify, shuffled write);
- ``dp``: bench_dp's histogram with private partition selection on its Zipf rows.

Each runs as ``privpipe run`` in a fresh process on the DirectRunner (FnApiRunner in
process), then with ``--runner dask`` on a local cluster of 1 and of 2 single-threaded
worker processes (``--dask_local_workers``), started and closed by the run, so the workers'
start-up counts as it would for a nightly job that brings its own cluster. Measured: wall
seconds; user+sys CPU seconds of the whole process tree (getrusage of the finished child:
the Dask workers are its children, reaped when the cluster closes); peak summed RSS of the
tree (driver + worker processes + search workers, sampled every 50 ms); and the stage
timings of the manifest (the workers' Beam counters on Dask too). One JSON line per run.

    python benchmarks/bench_dask.py [--rows 1000000] [--workload anonymity dp] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._measure import machine  # noqa: E402
from benchmarks.bench_anonymity import _one_release_config  # noqa: E402
from benchmarks.bench_dp import config as dp_config  # noqa: E402
from benchmarks.bench_dp import measured  # noqa: E402

K5 = {"name": "k5", "kind": "k_anonymity", "k": 5, "suppression_limit": 0.05}


def run(config: Path, out: Path, flags: list[str]) -> dict[str, Any]:
    """One `privpipe run` in a fresh process: wall, CPU and peak RSS of its process tree."""
    cmd = [sys.executable, "-m", "privpipe.pipelines.cli", "run", str(config), "--output", str(out)]
    res = measured([*cmd, *flags])
    manifest = json.loads((out / "internal" / "manifest.json").read_text(encoding="utf-8"))
    timings = manifest.get("timings") or {}
    stages = timings.get("stages") or {}
    return {
        "wall_s": res["wall_s"],
        "cpu_s": res["cpu_s"],
        "peak_rss_mb": res["peak_rss_mb"],
        "run_s": manifest.get("seconds"),
        "pipeline_s": timings.get("pipeline_s"),
        "stages": {k: v for k, v in sorted(stages.items()) if v >= 0.05},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workload", nargs="+", default=["anonymity", "dp"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    info = {"machine": machine(), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory(prefix="privpipe-bench-dask-") as d:
        tmp = Path(d)
        for workload in args.workload:
            if workload == "anonymity":
                cfg = _one_release_config(tmp, args.rows, K5, f"anon-{args.rows}")
            elif workload == "dp":
                cfg = dp_config(tmp, args.rows)
            else:
                ap.error(f"--workload: anonymity or dp, got {workload!r}")
            runners: list[tuple[str, list[str]]] = [("DirectRunner", [])]
            runners += [
                (f"dask x{n}", ["--runner", "dask", f"--dask_local_workers={n}"])
                for n in args.workers
            ]
            for i, (name, flags) in enumerate(runners):
                out = tmp / f"out-{workload}-{i}"
                res = run(cfg, out, flags)
                line = {"bench": "dask", "workload": workload, "rows": args.rows}
                print(json.dumps({**line, "runner": name, **res, **info}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
