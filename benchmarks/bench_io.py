"""Read + profile generated demo microdata: privpipe's Beam path against plain pandas.

Both sides do the same work on the same CSV: parse, type-check the integer columns,
reject bad rows, and profile (rows, distinct values per column, distinct QI
combinations and uniques) — the Beam side through `privpipe run`, the pandas side
in one process with `pandas.read_csv(chunksize=...)` feeding the same profile code.
Each side runs in a fresh process; peak RSS is summed over its process tree.

    python benchmarks/bench_io.py [--rows 1000000 10000000] [--workers 2]

Prints one JSON object per size, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks._measure import machine, measure  # noqa: E402

CACHE = HERE / ".cache"


def data_file(rows: int) -> Path:
    """The generated CSV, written once and cached between benchmark runs."""
    from privpipe.pipelines.demo_data import write_csv

    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"demo-{rows}.csv"
    if not path.exists():
        t0 = time.perf_counter()
        write_csv(path.with_suffix(".tmp"), rows)
        path.with_suffix(".tmp").rename(path)
        print(f"# generated {rows:,} rows in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return path


def pandas_side(path: str, batch_rows: int) -> None:
    """Plain pandas in one process: chunked read, the same checks and profile."""
    import pandas as pd

    from privpipe.pipelines.demo_data import DEMO_QUASI_IDENTIFIERS, DEMO_SENSITIVE
    from privpipe.transforms.profile import ProfileFn, split_internal

    t0 = time.perf_counter()
    cols = None
    fn = None
    acc = None
    rejected = 0
    for chunk in pd.read_csv(path, dtype=str, keep_default_na=False, chunksize=batch_rows):
        if fn is None:
            cols = list(chunk.columns)
            qis = list(DEMO_QUASI_IDENTIFIERS)
            fn = ProfileFn(cols, qis, [*qis, DEMO_SENSITIVE])
            acc = fn.create_accumulator()
        chunk = chunk.replace("", None)
        bad = chunk[list(DEMO_QUASI_IDENTIFIERS)].isna().any(axis=1)
        for col in ("age", "salary"):
            num = pd.to_numeric(chunk[col], errors="coerce")
            bad |= num.isna() & chunk[col].notna()
            chunk[col] = num.astype("Int64")
        rejected += int(bad.sum())
        acc = fn.add_input(acc, chunk[~bad].reset_index(drop=True))
    public, _ = split_internal(fn.extract_output(acc))
    print(
        json.dumps(
            {
                "rows": public["rows"],
                "rejected": rejected,
                "inner_s": round(time.perf_counter() - t0, 3),
            }
        )
    )


def beam_side(path: str, out: str, extra: list[str]) -> None:
    """The privpipe run on the demo config (read, validate, profile, manifest)."""
    from privpipe.pipelines.cli import DEMO_CONFIG
    from privpipe.pipelines.plan import load_plan
    from privpipe.pipelines.run import run

    t0 = time.perf_counter()
    plan = load_plan(DEMO_CONFIG, output_dir=out, input_override=path)
    result = run(plan, beam_args=extra, log=lambda _m: None)
    print(
        json.dumps(
            {
                "rows": result.manifest["rows_accepted"],
                "rejected": result.manifest["rows_rejected"],
                "inner_s": round(time.perf_counter() - t0, 3),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--side", choices=["pandas", "beam"])
    ap.add_argument("--path")
    ap.add_argument("--out")
    args, extra = ap.parse_known_args()
    if args.side == "pandas":
        return pandas_side(args.path, 65_536)
    if args.side == "beam":
        return beam_side(args.path, args.out, extra)
    py = sys.executable
    results = []
    for rows in args.rows:
        path = data_file(rows)
        pandas = measure([py, __file__, "--side", "pandas", "--path", str(path)])
        modes = {
            "in_process": [],
            "multi_processing_2": [
                "--direct_num_workers",
                str(args.workers),
                "--direct_running_mode",
                "multi_processing",
            ],
        }
        beam: dict[str, dict] = {}
        for mode, beam_args in modes.items():
            with tempfile.TemporaryDirectory() as out:
                cmd = [py, __file__, "--side", "beam", "--path", str(path), "--out", out]
                beam[mode] = measure([*cmd, *beam_args])
            assert beam[mode]["rows"] == pandas["rows"], (beam, pandas)
            beam[mode]["rows_per_s"] = round(rows / beam[mode]["wall_s"])
            beam[mode]["vs_pandas_throughput"] = round(pandas["wall_s"] / beam[mode]["wall_s"], 3)
        best = max(beam.values(), key=lambda b: b["rows_per_s"])
        res = {
            "benchmark": "io_read_profile",
            "date": datetime.now(UTC).date().isoformat(),
            "machine": machine(),
            "rows": rows,
            "file_mb": round(path.stat().st_size / 2**20, 1),
            "pandas": {**pandas, "rows_per_s": round(rows / pandas["wall_s"])},
            "beam": beam,
        }
        res["targets"] = {
            "beam_at_least_half_pandas": best["vs_pandas_throughput"] >= 0.5,
            "peak_rss_under_2gb_at_10m": (
                all(b["peak_rss_mb"] < 2048 for b in beam.values()) if rows >= 10_000_000 else None
            ),
        }
        print(json.dumps(res))
        results.append(res)


if __name__ == "__main__":
    main()
