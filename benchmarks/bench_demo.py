"""The whole demo config (`privpipe demo`) at scale: wall, CPU, memory, cores, stage timings.

Workload (issue 14): configs/demo.yaml (four anonymised tables, three central DP releases,
local DP, a continual count, every attack, the common attacker, the audit and report) on
the demo generator's rows, 1M by default (``--rows``; 10M only with ``--large`` or
``BENCH_LARGE=1``), DirectRunner. The rows are generated once per (rows, seed) and cached
outside the repository ($TMPDIR/privpipe-bench/); the run itself is `privpipe demo --data`
on that file in a fresh process, so interpreter start, imports and Beam start-up count.

Measured: wall seconds; user+sys CPU seconds of the whole process tree (less disturbed by
other work on a shared machine than wall); peak summed RSS of the tree; the CPU cores the
tree used while the Beam pipeline ran (its CPU times sampled every 0.5 s); and the run's
own stage timings (``manifest["timings"]``). Prints one JSON line; compare it with the
recorded figures with ``benchmarks/regress.py`` (``make bench`` does both). ``--timeline
FILE`` also writes the run's progress lines (every 10 s) and the tree's RSS and CPU
samples, each with its elapsed seconds: which stage holds the memory at the peak.

    python benchmarks/bench_demo.py [--rows 1000000] [--large] [--seed S] [--keep]
        [--timeline FILE] [-- beam options]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks._measure import machine  # noqa: E402
from privpipe.pipelines.demo_data import DEFAULT_SEED, write_csv  # noqa: E402

DEFAULT_ROWS = 1_000_000
LARGE_ROWS = 10_000_000
SAMPLE_S = 0.5
PIPELINE_STARTS = "file(s) on "  # run.py logs "reading N file(s) on <runner>" just before


def cache_dir() -> Path:
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "privpipe-bench"


def demo_file(rows: int, seed: int) -> Path:
    """The demo rows for (rows, seed), generated on first use and kept (outside the repo)."""
    path = cache_dir() / f"demo-{rows}-{seed}.csv"
    if not path.exists():
        t0 = time.perf_counter()
        write_csv(path, rows, seed=seed)  # written beside, renamed into place
        print(f"# generated {path} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return path


def _tree_cpu(root: psutil.Process) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (children included)."""
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _at(samples: list[tuple[float, float]], when: float) -> float:
    """The tree's CPU seconds at ``when``, interpolated between the nearest samples."""
    before = [s for s in samples if s[0] <= when]
    after = [s for s in samples if s[0] >= when]
    if not before:
        return after[0][1]
    if not after:
        return before[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)


def cores_between(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Mean CPU cores used from ``start`` to ``end`` (seconds on the samples' clock)."""
    if not samples or end <= start:
        return None
    return round((_at(samples, end) - _at(samples, start)) / (end - start), 2)


def run_demo(
    rows: int,
    seed: int,
    data: Path,
    out: Path,
    beam_args: list[str],
    timeline: Path | None = None,
) -> dict[str, Any]:
    """`privpipe demo --data` in a fresh process; its wall, CPU, peak RSS and cores."""
    privpipe = Path(sys.executable).parent / "privpipe"
    cmd = [str(privpipe), "demo", "--rows", str(rows), "--seed", str(seed)]
    cmd += ["--output", str(out), "--data", str(data)]
    cmd += [*(["--progress", "10"] if timeline else []), *beam_args]
    log = timeline.open("w", encoding="utf-8") if timeline else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    started: list[float] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if log is not None:
                log.write(f"{time.perf_counter() - t0:9.1f} {line}")
                log.flush()
            if not started and PIPELINE_STARTS in line:
                started.append(time.perf_counter() - t0)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    root = psutil.Process(proc.pid)
    samples: list[tuple[float, float]] = []
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            rss = 0
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    rss += p.memory_info().rss
            peak = max(peak, rss)
            samples.append((time.perf_counter() - t0, _tree_cpu(root)))
            if log is not None and len(samples) % 10 == 0:
                elapsed, cpu_now = samples[-1]
                log.write(f"{elapsed:9.1f} # rss_mb={rss >> 20} cpu_s={cpu_now:.1f}\n")
        time.sleep(SAMPLE_S)
    wall = time.perf_counter() - t0
    thread.join()
    if log is not None:
        log.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.stderr.write("".join(lines)[-4000:])
        raise RuntimeError(f"the demo run failed ({proc.returncode}): {' '.join(cmd)}")
    manifest = json.loads((out / "internal" / "manifest.json").read_text(encoding="utf-8"))
    timings = manifest.get("timings") or {}
    cores = None
    if started and timings.get("pipeline_s"):
        cores = cores_between(samples, started[0], started[0] + float(timings["pipeline_s"]))
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "peak_rss_mb": round(peak / 2**20, 1),
        "pipeline_cores": cores,
        "run_s": manifest.get("seconds"),
        "timings": timings,
    }


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help=f"rows (default {DEFAULT_ROWS:,})")
    ap.add_argument("--large", action="store_true", help=f"{LARGE_ROWS:,} rows (slow)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help="generator seed")
    ap.add_argument("--keep", action="store_true", help="keep the run's output folder")
    ap.add_argument("--timeline", type=Path, help="write progress lines and RSS samples here")
    argv = list(sys.argv[1:] if argv is None else argv)
    beam_args = argv[argv.index("--") + 1 :] if "--" in argv else []  # after --: to Beam
    args, _ = ap.parse_known_args(argv[: argv.index("--")] if "--" in argv else argv)
    large = args.large or os.environ.get("BENCH_LARGE") == "1"
    rows = args.rows or (LARGE_ROWS if large else DEFAULT_ROWS)
    if rows >= LARGE_ROWS and not large:
        ap.error(f"--rows {rows:,}: runs of {LARGE_ROWS:,} rows or more need --large")
    commit = git_commit()  # the code measured: taken before the run, not after it
    data = demo_file(rows, args.seed)
    out = Path(tempfile.mkdtemp(prefix=f"demo-{rows}-", dir=cache_dir()))
    try:
        figures = run_demo(rows, args.seed, data, out, beam_args, args.timeline)
    finally:
        if args.keep:
            print(f"# output kept in {out}", file=sys.stderr)
        else:
            shutil.rmtree(out, ignore_errors=True)
    line = {
        "benchmark": "demo",
        "rows": rows,
        "seed": args.seed,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": machine(),
        **figures,
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
